/* A stand-in for the other GPUs of a split DiT on a machine with one (bench_dit_cuda and bench_dit_stream --split):
 * a rank's own block moves as in the real group (tensor/comm.h), and each other rank's block is filled with a copy of
 * it (as many bytes as both have), their bytes counted in bytes_in. A rank's share of h3_dit_forward_sp then runs
 * every kernel at its real shapes on values like the real ones (left unfilled, its slots held whatever fresh
 * memory held, zeros presumably, and the share ran faster: bench_dit_stream's W124 share of two 1.012 s against
 * 1.146 s filled; less power drawn on zeros is the likely cause, not measured).
 * What it lacks is the exchange's time, which bytes_in and a link rate estimate; it spends the fills' device copies
 * instead (at W124 on two GPUs about 14 GB a step, some 5 ms at the device's copy rate: estimated, not timed on their
 * own). The velocities it gives are not the model's. */
#ifndef H3_BENCH_LOOPBACK_COMM_H
#define H3_BENCH_LOOPBACK_COMM_H

#include <string.h>

#include "tensor/comm.h"
#include "tensor/tensor.h"

static h3_status loopback_alltoallv(h3_comm *c, h3_exec *e, const void *send, const int64_t *sc, const int64_t *sd,
                                    void *recv, const int64_t *rc, const int64_t *rd) {
    const int me = c->rank;
    if (sc[me] != rc[me])
        return H3_ERR(H3_ERR_INVALID, "rank %d sends itself %lld, expects %lld", me, (long long)sc[me],
                      (long long)rc[me]);
    for (int j = 0; j < c->size; j++)
        if (j != me) c->bytes_in += rc[j];
    const char *src = (const char *)send + sd[me];
    for (int j = 0; j < c->size; j++) {
        char *dst = (char *)recv + rd[j];
        const int64_t n = rc[j] < sc[me] ? rc[j] : sc[me];
        if (n <= 0 || src == dst) continue;
        h3_tensor a, b;
        H3_TRY(h3_tensor_wrap(&a, (void *)src, H3_PLACE_DEVICE, H3_I8, 1, (int64_t[1]){n}));
        H3_TRY(h3_tensor_wrap(&b, dst, H3_PLACE_DEVICE, H3_I8, 1, (int64_t[1]){n}));
        H3_TRY(h3_copy(e, &b, &a));
    }
    return H3_OK;
}

/* Rank `rank` of `size` of the stand-in group. */
static inline void loopback_comm(h3_comm *c, int rank, int size) {
    memset(c, 0, sizeof *c);
    c->rank = rank;
    c->size = size;
    c->alltoallv = loopback_alltoallv;
}

#endif

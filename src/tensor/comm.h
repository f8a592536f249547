/* Collectives between the ranks of one sequence-parallel group (docs/ARCHITECTURE.md "Several GPUs"): the DiT's
 * split forward (h3_dit_forward_sp) moves q, k, v, the attention output and the residual stream between ranks
 * through them. Every rank of a group calls each collective, in the same order, with its own exec; buffers live
 * where that exec's activations do.
 *
 * h3_comm_local is the in-process group: n ranks as threads of one process on host memory, what the CPU tests of
 * the split forward run. A GPU group (one rank per device, NCCL's grouped send and receive) implements the same
 * function; it does not exist yet: the CUDA backend drives one device per process. */
#ifndef H3_TENSOR_COMM_H
#define H3_TENSOR_COMM_H

#include <stdint.h>

#include "tensor/ops.h"

#define H3_COMM_MAX_RANKS 64

typedef struct h3_comm h3_comm;
struct h3_comm {
    int rank, size;
    /* All to all with per-rank sizes, in bytes: rank r's block for rank j is send + sdispl[j], scount[j] bytes,
     * and lands at rank j's recv + rdispl[r] (rank j's rcount[r] must equal it, else H3_ERR_INVALID on the rank
     * that sees it). A block whose source and destination are the same bytes is left in place, so an all-gather
     * can run in place: every rank sends its own slice of a buffer to all and receives the others' slices into
     * the same buffer. Returns when this rank's receives are complete and its send buffer may be reused. */
    h3_status (*alltoallv)(h3_comm *c, h3_exec *ex, const void *send, const int64_t *scount, const int64_t *sdispl,
                           void *recv, const int64_t *rcount, const int64_t *rdispl);
    /* Marks the group failed, from any rank (its collective calls stop being matched): every rank's waiting and
     * later collectives return H3_ERR_INTERRUPTED naming it instead of waiting for ever. h3_dit_forward_sp calls
     * it when it fails between collectives. */
    void (*abort)(h3_comm *c);
    void *impl;
    int64_t bytes_in; /* bytes this rank received from other ranks so far (its own blocks not counted) */
};

/* n ranks (1..H3_COMM_MAX_RANKS) of one in-process group into ranks[0..n-1]; each rank's collectives must be
 * called from its own thread. */
h3_status h3_comm_local_create(int n, h3_comm *ranks);
/* Frees the group (every rank's handle at once, after the threads are done). */
void h3_comm_local_destroy(h3_comm *ranks, int n);

#endif

/* A sequence-parallel group over NCCL (tensor/comm.h): one rank per process, each process driving one GPU through
 * the CUDA backend, the ranks joined by an NCCL unique id that rank 0 makes and the others receive out of band
 * (a file, a pipe). alltoallv is one NCCL group of sends and receives on the exec's compute stream, so it orders
 * with the kernels around it and needs no synchronization; a rank's own block is a device copy on that stream.
 *
 * libnccl.so.2 is opened at run time (dlopen) with the few entry points declared here, as NCCL's ABI has kept
 * them since 2.7: the build needs no NCCL headers, and a machine without NCCL fails only when a group is asked
 * for, with a message naming the library. */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_internal.cuh"
#include "tensor/comm.h"

typedef struct {
    char internal[128];
} nccl_unique_id;
typedef void *nccl_comm_t;
typedef int nccl_result;
enum { NCCL_INT8 = 0 };

static struct {
    int tried, ok;
    nccl_result (*get_unique_id)(nccl_unique_id *);
    nccl_result (*comm_init_rank)(nccl_comm_t *, int, nccl_unique_id, int);
    nccl_result (*comm_destroy)(nccl_comm_t);
    nccl_result (*comm_abort)(nccl_comm_t);
    nccl_result (*send)(const void *, size_t, int, int, nccl_comm_t, cudaStream_t);
    nccl_result (*recv)(void *, size_t, int, int, nccl_comm_t, cudaStream_t);
    nccl_result (*group_start)(void);
    nccl_result (*group_end)(void);
    const char *(*error_string)(nccl_result);
} g_nccl;

static h3_status nccl_load(void) {
    if (!g_nccl.tried) {
        g_nccl.tried = 1;
        void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
        if (h) {
#define SYM(field, name) *(void **)&g_nccl.field = dlsym(h, name)
            SYM(get_unique_id, "ncclGetUniqueId");
            SYM(comm_init_rank, "ncclCommInitRank");
            SYM(comm_destroy, "ncclCommDestroy");
            SYM(comm_abort, "ncclCommAbort");
            SYM(send, "ncclSend");
            SYM(recv, "ncclRecv");
            SYM(group_start, "ncclGroupStart");
            SYM(group_end, "ncclGroupEnd");
            SYM(error_string, "ncclGetErrorString");
#undef SYM
            g_nccl.ok = g_nccl.get_unique_id && g_nccl.comm_init_rank && g_nccl.comm_destroy && g_nccl.comm_abort && g_nccl.send &&
                        g_nccl.recv && g_nccl.group_start && g_nccl.group_end && g_nccl.error_string;
        }
    }
    if (!g_nccl.ok)
        return H3_ERR(H3_ERR_UNSUPPORTED,
                      "several GPUs need NCCL 2.7 or later (libnccl.so.2, with ncclSend and ncclRecv): install it "
                      "(Debian: libnccl2) or put its folder on LD_LIBRARY_PATH");
    return H3_OK;
}

#define NCCL_TRY(call, what)                                                                                      \
    do {                                                                                                          \
        nccl_result r_ = (call);                                                                                  \
        if (r_ != 0) return H3_ERR(H3_ERR_DEVICE, "NCCL %s failed: %s", what, g_nccl.error_string(r_));         \
    } while (0)

/* A rank's group: the communicator, and the lock that keeps an abort from another thread (a watchdog: pipeline/
 * dit_group.c) out of a collective being enqueued. */
typedef struct {
    nccl_comm_t nc;
    pthread_mutex_t mu;
    int aborted;
} nccl_group;

/* ncclCommAbort: this rank's pending operations (kernels waiting for a peer) end, and the communicator is gone;
 * collectives on the group answer with an error afterwards. May be called from another thread than the one that
 * runs the collectives (it waits up to 10 s for an enqueue in progress; past that, a hung enqueue is aborted
 * anyway). */
static void nccl_abort(h3_comm *c) {
    nccl_group *g = (nccl_group *)c->impl;
    if (!g) return;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    const int locked = pthread_mutex_timedlock(&g->mu, &until) == 0;
    if (!g->aborted) {
        g->aborted = 1;
        g_nccl.comm_abort(g->nc);
    }
    if (locked) pthread_mutex_unlock(&g->mu);
}

static h3_status enqueue(h3_comm *c, nccl_comm_t nc, cudaStream_t st, const void *send, const int64_t *scount,
                         const int64_t *sdispl, void *recv, const int64_t *rcount, const int64_t *rdispl);

static h3_status nccl_alltoallv(h3_comm *c, h3_exec *ex, const void *send, const int64_t *scount,
                                const int64_t *sdispl, void *recv, const int64_t *rcount, const int64_t *rdispl) {
    nccl_group *g = (nccl_group *)c->impl;
    if (!g) return H3_ERR(H3_ERR_INTERRUPTED, "collective on rank %d: the group was stopped", c->rank);
    pthread_mutex_lock(&g->mu);
    const h3_status s = g->aborted ? H3_ERR(H3_ERR_INTERRUPTED, "collective on rank %d: the group was stopped", c->rank)
                                   : enqueue(c, g->nc, cuda_stream(ex), send, scount, sdispl, recv, rcount, rdispl);
    pthread_mutex_unlock(&g->mu);
    return s;
}

static h3_status enqueue(h3_comm *c, nccl_comm_t nc, cudaStream_t st, const void *send, const int64_t *scount,
                         const int64_t *sdispl, void *recv, const int64_t *rcount, const int64_t *rdispl) {
    const int me = c->rank;
    const char *own = (const char *)send + sdispl[me];
    char *own_dst = (char *)recv + rdispl[me];
    if (scount[me] != rcount[me])
        return H3_ERR(H3_ERR_INVALID, "collective: rank %d sends itself %lld bytes and expects %lld", me,
                      (long long)scount[me], (long long)rcount[me]);
    if (own != own_dst && rcount[me] > 0)
        CU_TRY(cudaMemcpyAsync(own_dst, own, (size_t)rcount[me], cudaMemcpyDeviceToDevice, st));
    NCCL_TRY(g_nccl.group_start(), "group start");
    for (int j = 0; j < c->size; j++) {
        if (j == me) continue;
        if (scount[j] > 0) NCCL_TRY(g_nccl.send((const char *)send + sdispl[j], (size_t)scount[j], NCCL_INT8, j, nc, st), "send");
        if (rcount[j] > 0) NCCL_TRY(g_nccl.recv((char *)recv + rdispl[j], (size_t)rcount[j], NCCL_INT8, j, nc, st), "receive");
        c->bytes_in += rcount[j];
    }
    NCCL_TRY(g_nccl.group_end(), "group end");
    return H3_OK;
}

extern "C" h3_status h3_cuda_comm_unique_id(unsigned char id[128]) {
    H3_TRY(nccl_load());
    nccl_unique_id u;
    NCCL_TRY(g_nccl.get_unique_id(&u), "unique id");
    memcpy(id, u.internal, 128);
    return H3_OK;
}

extern "C" h3_status h3_cuda_comm_create(h3_exec *ex, int rank, int size, const unsigned char id[128], h3_comm *out) {
    memset(out, 0, sizeof *out);
    if (size < 1 || size > H3_COMM_MAX_RANKS || rank < 0 || rank >= size)
        return H3_ERR(H3_ERR_INVALID, "a sequence-parallel group has 1 to %d ranks; rank %d of %d is not one",
                      H3_COMM_MAX_RANKS, rank, size);
    if (!cuda_state(ex)) return H3_ERR(H3_ERR_INVALID, "an NCCL group needs an exec with the CUDA backend");
    H3_TRY(nccl_load());
    nccl_unique_id u;
    memcpy(u.internal, id, 128);
    nccl_comm_t nc = NULL;
    NCCL_TRY(g_nccl.comm_init_rank(&nc, size, u, rank), "communicator setup");
    nccl_group *g = (nccl_group *)h3_calloc(1, sizeof *g, H3_MEM_OTHER);
    if (!g) {
        g_nccl.comm_destroy(nc);
        return H3_ERR_NOMEM;
    }
    g->nc = nc;
    pthread_mutex_init(&g->mu, NULL);
    out->rank = rank;
    out->size = size;
    out->alltoallv = nccl_alltoallv;
    out->abort = nccl_abort;
    out->impl = g;
    return H3_OK;
}

extern "C" void h3_cuda_comm_destroy(h3_comm *c) {
    nccl_group *g = c ? (nccl_group *)c->impl : NULL;
    if (g) {
        if (!g->aborted && g_nccl.ok) g_nccl.comm_destroy(g->nc);
        pthread_mutex_destroy(&g->mu);
        h3_free(g);
    }
    if (c) c->impl = NULL;
}

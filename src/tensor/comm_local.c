/* The in-process sequence-parallel group (tensor/comm.h): each rank posts its send buffer and sizes, a barrier
 * lets every rank copy its blocks out of the others' buffers, a second barrier keeps the buffers alive until all
 * copies are done. */
#include <pthread.h>
#include <string.h>

#include "base/alloc.h"
#include "tensor/comm.h"

typedef struct {
    int n;
    pthread_barrier_t bar;
    const char *send[H3_COMM_MAX_RANKS];
    const int64_t *scount[H3_COMM_MAX_RANKS], *sdispl[H3_COMM_MAX_RANKS];
} local_group;

static h3_status local_alltoallv(h3_comm *c, h3_exec *ex, const void *send, const int64_t *scount,
                                 const int64_t *sdispl, void *recv, const int64_t *rcount, const int64_t *rdispl) {
    local_group *g = c->impl;
    const int me = c->rank;
    h3_status st = h3_exec_sync(ex); /* the blocks are complete before anyone reads them */
    g->send[me] = send;
    g->scount[me] = scount;
    g->sdispl[me] = sdispl;
    pthread_barrier_wait(&g->bar);
    for (int i = 0; i < g->n && st == H3_OK; i++) {
        if (g->scount[i][me] != rcount[i]) {
            st = H3_ERR(H3_ERR_INVALID, "collective: rank %d sends %lld bytes to rank %d, which expects %lld", i,
                        (long long)g->scount[i][me], me, (long long)rcount[i]);
            break;
        }
        const char *src = g->send[i] + g->sdispl[i][me];
        char *dst = (char *)recv + rdispl[i];
        if (src != dst && rcount[i] > 0) memcpy(dst, src, (size_t)rcount[i]);
        if (i != me) c->bytes_in += rcount[i];
    }
    pthread_barrier_wait(&g->bar); /* never skipped: the others wait for this rank whatever happened */
    return st;
}

h3_status h3_comm_local_create(int n, h3_comm *ranks) {
    if (n < 1 || n > H3_COMM_MAX_RANKS)
        return H3_ERR(H3_ERR_INVALID, "a sequence-parallel group has 1 to %d ranks, not %d", H3_COMM_MAX_RANKS, n);
    local_group *g = h3_malloc(sizeof *g, H3_MEM_OTHER);
    if (!g) return H3_ERR_NOMEM;
    memset(g, 0, sizeof *g);
    g->n = n;
    if (pthread_barrier_init(&g->bar, NULL, (unsigned)n) != 0) {
        h3_free(g);
        return H3_ERR(H3_ERR_INTERNAL, "collective: no barrier for %d threads", n);
    }
    for (int r = 0; r < n; r++) {
        ranks[r].rank = r;
        ranks[r].size = n;
        ranks[r].alltoallv = local_alltoallv;
        ranks[r].impl = g;
        ranks[r].bytes_in = 0;
    }
    return H3_OK;
}

void h3_comm_local_destroy(h3_comm *ranks, int n) {
    if (!ranks || n < 1 || !ranks[0].impl) return;
    local_group *g = ranks[0].impl;
    pthread_barrier_destroy(&g->bar);
    h3_free(g);
    for (int r = 0; r < n; r++) ranks[r].impl = NULL;
}

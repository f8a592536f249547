/* The in-process sequence-parallel group (tensor/comm.h): each rank posts its send buffer and sizes, a barrier
 * lets every rank copy its blocks out of the others' buffers, a second barrier keeps the buffers alive until all
 * copies are done. The barrier is a counter under a mutex, so a failed rank can release the others (abort). */
#include <pthread.h>
#include <string.h>

#include "base/alloc.h"
#include "tensor/comm.h"

typedef struct {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int count, gen, aborted, who;
    const char *send[H3_COMM_MAX_RANKS];
    const int64_t *scount[H3_COMM_MAX_RANKS], *sdispl[H3_COMM_MAX_RANKS];
} local_group;

/* 0 once all n ranks arrived; -1 when the group was aborted before or while waiting. */
static int group_wait(local_group *g) {
    pthread_mutex_lock(&g->mu);
    int r = -1;
    if (!g->aborted) {
        const int gen = g->gen;
        if (++g->count == g->n) {
            g->count = 0;
            g->gen++;
            pthread_cond_broadcast(&g->cv);
        } else
            while (g->gen == gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
        r = g->gen != gen ? 0 : -1;
    }
    pthread_mutex_unlock(&g->mu);
    return r;
}

static void local_abort(h3_comm *c) {
    local_group *g = c->impl;
    pthread_mutex_lock(&g->mu);
    if (!g->aborted) g->who = c->rank;
    g->aborted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static h3_status aborted_error(const h3_comm *c) {
    const local_group *g = c->impl;
    return H3_ERR(H3_ERR_INTERRUPTED, "collective on rank %d: rank %d of the group failed and stopped it", c->rank,
                  g->who);
}

static h3_status local_alltoallv(h3_comm *c, h3_exec *ex, const void *send, const int64_t *scount,
                                 const int64_t *sdispl, void *recv, const int64_t *rcount, const int64_t *rdispl) {
    local_group *g = c->impl;
    const int me = c->rank;
    h3_status st = h3_exec_sync(ex); /* the blocks are complete before anyone reads them */
    g->send[me] = send;
    g->scount[me] = scount;
    g->sdispl[me] = sdispl;
    if (group_wait(g) != 0) return aborted_error(c);
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
    if (group_wait(g) != 0) return aborted_error(c); /* never skipped: the others wait for this rank */
    return st;
}

h3_status h3_comm_local_create(int n, h3_comm *ranks) {
    if (n < 1 || n > H3_COMM_MAX_RANKS)
        return H3_ERR(H3_ERR_INVALID, "a sequence-parallel group has 1 to %d ranks, not %d", H3_COMM_MAX_RANKS, n);
    local_group *g = h3_malloc(sizeof *g, H3_MEM_OTHER);
    if (!g) return H3_ERR_NOMEM;
    memset(g, 0, sizeof *g);
    g->n = n;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    for (int r = 0; r < n; r++) {
        ranks[r].rank = r;
        ranks[r].size = n;
        ranks[r].alltoallv = local_alltoallv;
        ranks[r].abort = local_abort;
        ranks[r].impl = g;
        ranks[r].bytes_in = 0;
    }
    return H3_OK;
}

void h3_comm_local_destroy(h3_comm *ranks, int n) {
    if (!ranks || n < 1 || !ranks[0].impl) return;
    local_group *g = ranks[0].impl;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    h3_free(g);
    for (int r = 0; r < n; r++) ranks[r].impl = NULL;
}

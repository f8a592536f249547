#include "base/threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "base/alloc.h"

typedef struct {
    struct h3_pool *p;
    int tid;
} worker_arg;

struct h3_pool {
    int nthreads; /* including the caller */
    pthread_t *threads;
    worker_arg *args; /* one per worker, owned by the pool (so counters don't move when workers start) */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    uint64_t generation; /* bumped per job */
    int stop;
    /* the current job */
    h3_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    _Atomic int64_t next;
    int active; /* workers still inside the current job */
};

static void run_chunks(h3_pool *p, int tid) {
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->n) break;
        int64_t e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->ctx, b, e, tid);
    }
}

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    h3_pool *p = wa.p;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, wa.tid);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int h3_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

h3_status h3_threads_resolve(int n, int *out) {
    if (n > H3_MAX_THREADS)
        return H3_ERR(H3_ERR_INVALID, "threads must be 1 to %d (0: one per CPU, %d here); got %d",
                      H3_MAX_THREADS, h3_cpu_count(), n);
    if (n <= 0) n = h3_cpu_count() < H3_MAX_THREADS ? h3_cpu_count() : H3_MAX_THREADS;
    *out = n;
    return H3_OK;
}

h3_status h3_pool_create(int nthreads, h3_pool **out) {
    *out = NULL;
    H3_TRY(h3_threads_resolve(nthreads, &nthreads));
    h3_pool *p = h3_calloc(1, sizeof *p, H3_MEM_OTHER);
    if (!p) return H3_ERR_NOMEM;
    p->nthreads = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (nthreads > 1) {
        p->threads = h3_calloc((size_t)nthreads - 1, sizeof(pthread_t), H3_MEM_OTHER);
        p->args = h3_calloc((size_t)nthreads - 1, sizeof(worker_arg), H3_MEM_OTHER);
        if (!p->threads || !p->args) {
            p->nthreads = 1; /* no workers to stop */
            h3_pool_free(p);
            return H3_ERR_NOMEM;
        }
        for (int i = 1; i < nthreads; i++) {
            worker_arg *wa = &p->args[i - 1];
            wa->p = p;
            wa->tid = i;
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
                p->nthreads = i;
                h3_pool_free(p);
                return H3_ERR(H3_ERR_INTERNAL, "could not start worker thread %d of %d", i, nthreads);
            }
        }
    }
    *out = p;
    return H3_OK;
}

void h3_pool_free(h3_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nthreads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    h3_free(p->threads);
    h3_free(p->args);
    h3_free(p);
}

int h3_pool_threads(const h3_pool *p) {
    return p ? p->nthreads : 1;
}

void h3_parallel_for(h3_pool *p, int64_t n, int64_t grain, h3_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->nthreads == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* Aim for ~4 chunks per thread for balance, never below the grain. */
    int64_t chunk = (n + (int64_t)p->nthreads * 4 - 1) / ((int64_t)p->nthreads * 4);
    if (chunk < grain) chunk = grain;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->active = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* A small persistent thread pool: parallel_for over an index range, the caller participating.
 *
 * Contract: fn is called with disjoint [begin, end) ranges covering [0, n) exactly once; tid in [0, threads)
 * identifies the executing thread so kernels can use per-thread scratch. h3_parallel_for returns when every
 * range is done. Calls must not be nested on the same pool (a kernel never calls parallel_for itself).
 */
#ifndef H3_BASE_THREADS_H
#define H3_BASE_THREADS_H

#include <stdint.h>

#include "base/status.h"

typedef struct h3_pool h3_pool;
typedef void (*h3_range_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* The most threads a pool runs, the caller included: above the cores of the machines h3run is meant for, and
 * low enough that a mistyped count (--threads 2147483647) is refused instead of starting threads and
 * per-thread tables until memory runs out. */
#define H3_MAX_THREADS 1024

/* nthreads <= 0: one per online CPU (at most H3_MAX_THREADS). More than H3_MAX_THREADS is H3_ERR_INVALID,
 * before anything is allocated. */
h3_status h3_pool_create(int nthreads, h3_pool **out);
void h3_pool_free(h3_pool *p);
int h3_pool_threads(const h3_pool *p);
/* Runs fn over [0, n) in chunks of at least `grain` indices. p may be NULL (runs inline, tid 0). */
void h3_parallel_for(h3_pool *p, int64_t n, int64_t grain, h3_range_fn fn, void *ctx);

/* Online CPUs (at least 1). */
int h3_cpu_count(void);
/* What a thread count asks for: n itself when 1 <= n <= H3_MAX_THREADS, one per CPU (at most H3_MAX_THREADS)
 * when n <= 0; H3_ERR_INVALID naming the limit when n is larger. */
h3_status h3_threads_resolve(int n, int *out);

#endif

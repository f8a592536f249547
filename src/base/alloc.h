/* Counted host allocation.
 *
 * Every host buffer the library owns comes from here, so the memory report can say what each category holds
 * and tests can make the n-th allocation fail (h3_mem_fail_at) to prove that every failure path returns
 * cleanly without leaking. Blocks are 64-byte aligned. A failed allocation records an H3_ERR_NOMEM error
 * naming the size and category, so callers may simply `return H3_ERR_NOMEM`-propagate via h3_alloc_status.
 */
#ifndef H3_BASE_ALLOC_H
#define H3_BASE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define H3_ALIGN 64

void *h3_malloc(size_t size, h3_mem_category cat);
void *h3_calloc(size_t n, size_t size, h3_mem_category cat);
/* Counted like h3_malloc but never failed by the injector: for third-party code that mishandles allocation
 * failure (jansson's lexer reads past its buffer when a growth fails), so tests exercise our paths only. */
void *h3_malloc_uninjected(size_t size, h3_mem_category cat);
/* Grows or shrinks a block from h3_malloc; on failure the old block is untouched and NULL returned. */
void *h3_realloc(void *p, size_t size, h3_mem_category cat);
void h3_free(void *p);
char *h3_strdup(const char *s);
char *h3_strndup(const char *s, size_t n);
/* Size recorded for a block from h3_malloc. */
size_t h3_alloc_size(const void *p);

/* Account bytes held outside h3_malloc (pinned host memory, mmap copies) under a category. */
void h3_mem_account(h3_mem_category cat, int64_t delta);
/* Consume one tick of the failure injector without allocating (for allocators outside this file,
 * e.g. pinned or device memory). Returns nonzero when this call must fail. */
int h3_mem_should_fail(void);
/* Number of allocations that have failed so far in this process (injected or real). Libraries that report an
 * allocation failure as something else (jansson says "invalid token") are told apart with it. */
int64_t h3_mem_failed_count(void);

/* Overflow-checked size arithmetic: return 0 and leave *out untouched when the result does not fit. */
static inline int h3_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}
static inline int h3_add_size(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return 0;
    *out = a + b;
    return 1;
}
static inline int h3_mul_i64(int64_t a, int64_t b, int64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

#endif

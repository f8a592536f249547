#include "base/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define H3_ALLOC_MAGIC 0x48334d454d424c4bULL /* "H3MEMBLK" */

typedef struct {
    uint64_t magic;
    uint64_t size;
    int32_t cat;
    uint8_t pad[H3_ALIGN - 20];
} h3_block_hdr;

_Static_assert(sizeof(h3_block_hdr) == H3_ALIGN, "header keeps payload aligned");

static _Atomic int64_t g_cur[H3_MEM_CATEGORY_COUNT];
static _Atomic int64_t g_peak[H3_MEM_CATEGORY_COUNT];
static _Atomic int64_t g_total_cur, g_total_peak;
static _Atomic int64_t g_nalloc, g_nfree;
static _Atomic int64_t g_fail_countdown; /* 0 = off; k > 0: the k-th tick from now fails */
static _Atomic int g_fail_sticky;
static _Atomic int g_fail_tripped;
static _Atomic int64_t g_ticks;
static _Atomic int64_t g_failed;

int64_t h3_mem_failed_count(void) {
    return atomic_load(&g_failed);
}

static const char *const g_cat_names[H3_MEM_CATEGORY_COUNT] = {"weights", "activations", "workspace", "io",
                                                                "other"};

const char *h3_mem_category_name(int c) {
    return (c >= 0 && c < H3_MEM_CATEGORY_COUNT) ? g_cat_names[c] : "?";
}

static void update_peak(_Atomic int64_t *peak, int64_t v) {
    int64_t p = atomic_load(peak);
    while (v > p && !atomic_compare_exchange_weak(peak, &p, v)) {
    }
}

void h3_mem_account(h3_mem_category cat, int64_t delta) {
    if ((int)cat < 0 || cat >= H3_MEM_CATEGORY_COUNT) cat = H3_MEM_OTHER;
    int64_t v = atomic_fetch_add(&g_cur[cat], delta) + delta;
    int64_t t = atomic_fetch_add(&g_total_cur, delta) + delta;
    if (delta > 0) {
        update_peak(&g_peak[cat], v);
        update_peak(&g_total_peak, t);
    }
}

int h3_mem_should_fail(void) {
    atomic_fetch_add(&g_ticks, 1);
    if (atomic_load(&g_fail_tripped) && atomic_load(&g_fail_sticky)) {
        atomic_fetch_add(&g_failed, 1);
        return 1;
    }
    int64_t c = atomic_load(&g_fail_countdown);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&g_fail_countdown, &c, c - 1)) {
            if (c == 1) {
                atomic_store(&g_fail_tripped, 1);
                atomic_fetch_add(&g_failed, 1);
                return 1;
            }
            return 0;
        }
    }
    return 0;
}

int64_t h3_mem_fail_at(int64_t n, int sticky) {
    int64_t ticks = atomic_exchange(&g_ticks, 0);
    atomic_store(&g_fail_countdown, n > 0 ? n : 0);
    atomic_store(&g_fail_sticky, sticky);
    atomic_store(&g_fail_tripped, 0);
    return ticks;
}

static void *malloc_impl(size_t size, h3_mem_category cat, int injectable) {
    if ((int)cat < 0 || cat >= H3_MEM_CATEGORY_COUNT) cat = H3_MEM_OTHER;
    size_t total;
    if (!h3_add_size(size, sizeof(h3_block_hdr), &total) || (injectable && h3_mem_should_fail())) {
        H3_ERR(H3_ERR_NOMEM, "out of host memory: could not allocate %zu bytes for %s", size, g_cat_names[cat]);
        return NULL;
    }
    h3_block_hdr *h = NULL;
    if (posix_memalign((void **)&h, H3_ALIGN, total) != 0 || !h) {
        atomic_fetch_add(&g_failed, 1);
        H3_ERR(H3_ERR_NOMEM, "out of host memory: could not allocate %zu bytes for %s", size, g_cat_names[cat]);
        return NULL;
    }
    h->magic = H3_ALLOC_MAGIC;
    h->size = size;
    h->cat = (int32_t)cat;
    atomic_fetch_add(&g_nalloc, 1);
    h3_mem_account(cat, (int64_t)size);
    return h + 1;
}

void *h3_malloc(size_t size, h3_mem_category cat) {
    return malloc_impl(size, cat, 1);
}

void *h3_malloc_uninjected(size_t size, h3_mem_category cat) {
    return malloc_impl(size, cat, 0);
}

void *h3_calloc(size_t n, size_t size, h3_mem_category cat) {
    size_t total;
    if (!h3_mul_size(n, size, &total)) {
        H3_ERR(H3_ERR_NOMEM, "allocation of %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    void *p = h3_malloc(total, cat);
    if (p) memset(p, 0, total);
    return p;
}

static h3_block_hdr *hdr_of(const void *p) {
    h3_block_hdr *h = (h3_block_hdr *)p - 1;
    if (h->magic != H3_ALLOC_MAGIC) abort(); /* freeing a pointer not from h3_malloc: memory corruption */
    return h;
}

size_t h3_alloc_size(const void *p) {
    return p ? (size_t)hdr_of(p)->size : 0;
}

void h3_free(void *p) {
    if (!p) return;
    h3_block_hdr *h = hdr_of(p);
    h3_mem_account((h3_mem_category)h->cat, -(int64_t)h->size);
    atomic_fetch_add(&g_nfree, 1);
    h->magic = 0;
    free(h);
}

void *h3_realloc(void *p, size_t size, h3_mem_category cat) {
    if (!p) return h3_malloc(size, cat);
    size_t old = h3_alloc_size(p);
    void *q = h3_malloc(size, cat);
    if (!q) return NULL;
    memcpy(q, p, old < size ? old : size);
    h3_free(p);
    return q;
}

char *h3_strndup(const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *d = h3_malloc(len + 1, H3_MEM_OTHER);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = 0;
    return d;
}

char *h3_strdup(const char *s) {
    return h3_strndup(s, strlen(s));
}

void h3_mem_get_stats(h3_mem_stats *out) {
    for (int i = 0; i < H3_MEM_CATEGORY_COUNT; i++) {
        out->current[i] = atomic_load(&g_cur[i]);
        out->peak[i] = atomic_load(&g_peak[i]);
    }
    out->total_current = atomic_load(&g_total_cur);
    out->total_peak = atomic_load(&g_total_peak);
    out->n_allocs = atomic_load(&g_nalloc);
    out->n_frees = atomic_load(&g_nfree);
}

void h3_mem_reset_peaks(void) {
    for (int i = 0; i < H3_MEM_CATEGORY_COUNT; i++) atomic_store(&g_peak[i], atomic_load(&g_cur[i]));
    atomic_store(&g_total_peak, atomic_load(&g_total_cur));
}

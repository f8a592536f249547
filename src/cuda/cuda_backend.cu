/* CUDA backend: device selection, streams, the device arena, copies, and the backend table. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "cuda/cuda_internal.cuh"

/* ---- the arena ------------------------------------------------------------------------------------------ */

#define ARENA_ALIGN H3_CUDA_ARENA_ALIGN

static h3_cuda_alloc_observer g_observer; /* see h3_cuda_set_alloc_observer */
static void *g_observer_user;

extern "C" void h3_cuda_set_alloc_observer(h3_cuda_alloc_observer fn, void *user) {
    g_observer = fn;
    g_observer_user = user;
}

extern "C" void *cuda_arena_alloc(h3_cuda_state *s, size_t bytes) {
    size_t need = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (need == 0) need = ARENA_ALIGN;
    pthread_mutex_lock((pthread_mutex_t *)s->mu);
    h3_arena_block *b = s->blocks;
    for (; b; b = b->next)
        if (!b->used && b->size >= need) break;
    void *p = NULL;
    if (b) {
        if (b->size > need) {
            h3_arena_block *rest = (h3_arena_block *)h3_malloc(sizeof *rest, H3_MEM_OTHER);
            if (!rest) {
                pthread_mutex_unlock((pthread_mutex_t *)s->mu);
                return NULL;
            }
            rest->off = b->off + need;
            rest->size = b->size - need;
            rest->used = 0;
            rest->next = b->next;
            b->next = rest;
            b->size = need;
        }
        b->used = 1;
        s->used += b->size;
        if (s->used > s->peak) s->peak = s->used;
        p = s->base + b->off;
    }
    size_t used = s->used, cap = s->capacity;
    int64_t got = p ? (int64_t)b->size : 0;
    pthread_mutex_unlock((pthread_mutex_t *)s->mu);
    if (p && g_observer) g_observer(g_observer_user, p, got, (int64_t)used);
    if (!p) {
        H3_ERR(H3_ERR_NOMEM,
               "out of device memory: %.3f GiB requested with %.3f of the %.3f GiB device budget in use; "
               "raise the device budget or lower the request",
               bytes / 1073741824.0, used / 1073741824.0, cap / 1073741824.0);
    }
    return p;
}

extern "C" void cuda_arena_free(h3_cuda_state *s, void *p) {
    if (!p) return;
    pthread_mutex_lock((pthread_mutex_t *)s->mu);
    size_t off = (size_t)((uint8_t *)p - s->base);
    h3_arena_block *prev = NULL, *b = s->blocks;
    while (b && b->off != off) {
        prev = b;
        b = b->next;
    }
    int64_t freed = 0;
    if (b && b->used) {
        b->used = 0;
        s->used -= b->size;
        freed = (int64_t)b->size;
        /* merge with the next, then with the previous free block */
        if (b->next && !b->next->used) {
            h3_arena_block *n = b->next;
            b->size += n->size;
            b->next = n->next;
            h3_free(n);
        }
        if (prev && !prev->used) {
            prev->size += b->size;
            prev->next = b->next;
            h3_free(b);
        }
    }
    int64_t used_now = (int64_t)s->used;
    pthread_mutex_unlock((pthread_mutex_t *)s->mu);
    if (freed && g_observer) g_observer(g_observer_user, p, -freed, used_now);
}

static h3_cuda_state *g_state; /* the allocator hooks have no exec; one device per process */
static int64_t g_arena_bytes;   /* the arena's size while a backend is up (read from any thread) */

static void *dev_alloc(size_t bytes, void *user) {
    (void)user;
    return g_state ? cuda_arena_alloc(g_state, bytes) : NULL;
}

static void dev_free(void *p, void *user) {
    (void)user;
    if (g_state) cuda_arena_free(g_state, p);
}

/* Pinned host memory. cudaHostAlloc pins at about 2 GB/s on the H200 machine (7.6 s for the 15.8 GiB of pinned
 * copies an 8 GiB budget needs at W124: dev/cuda/pinned_alloc.cu). An anonymous mapping with transparent huge
 * pages, its pages faulted in by several threads, then registered with the driver, is ready at about 16 GB/s
 * (1.07 s for the same 15.8 GiB with the fill) and copies to the device at the same 55 GB/s. Large buffers take
 * that way; small ones, or when it fails, cudaHostAlloc. The registered ones are remembered (address, length)
 * so that pinned_free can unregister and unmap them. */
#define PIN_MAP_MIN ((size_t)64 << 20)
#define PIN_TOUCH_THREADS 8

typedef struct pin_map {
    void *p;
    size_t bytes;
} pin_map;
static pin_map *g_pin_maps;
static int g_pin_n, g_pin_cap;
static pthread_mutex_t g_pin_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
    char *p;
    size_t from, to, page;
} touch_job;

static void *touch_range(void *arg) {
    touch_job *j = (touch_job *)arg;
    for (size_t o = j->from; o < j->to; o += j->page) ((volatile char *)j->p)[o] = 0;
    return NULL;
}

static void *pinned_map(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    (void)madvise(p, bytes, MADV_DONTFORK); /* as the driver's own pinned memory: a child never shares it */
    /* fault the pages in from several threads (the kernel zeroes them), a share each */
    const size_t page = 4096, share = (bytes / PIN_TOUCH_THREADS + page - 1) / page * page;
    pthread_t th[PIN_TOUCH_THREADS];
    touch_job jobs[PIN_TOUCH_THREADS];
    int started = 0;
    for (int i = 0; i < PIN_TOUCH_THREADS; i++) {
        size_t a = (size_t)i * share, b = a + share < bytes ? a + share : bytes;
        jobs[i] = (touch_job){(char *)p, a < bytes ? a : bytes, b, page};
        if (jobs[i].from >= jobs[i].to) continue;
        if (pthread_create(&th[started], NULL, touch_range, &jobs[i]) == 0)
            started++;
        else
            touch_range(&jobs[i]);
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_lock(&g_pin_mu);
    int ok = g_pin_n < g_pin_cap;
    if (!ok) {
        int cap = g_pin_cap ? 2 * g_pin_cap : 64;
        pin_map *m = (pin_map *)realloc(g_pin_maps, (size_t)cap * sizeof *m);
        if (m) {
            g_pin_maps = m;
            g_pin_cap = cap;
            ok = 1;
        }
    }
    if (ok && cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess)
        g_pin_maps[g_pin_n++] = (pin_map){p, bytes};
    else
        ok = 0;
    pthread_mutex_unlock(&g_pin_mu);
    if (!ok) {
        (void)cudaGetLastError();
        munmap(p, bytes);
        return NULL;
    }
    return p;
}

static void *pinned_alloc(size_t bytes, void *user) {
    (void)user;
    void *p = NULL;
    if (bytes >= PIN_MAP_MIN && (p = pinned_map(bytes)) != NULL) return p;
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        H3_ERR(H3_ERR_NOMEM, "out of pinned host memory: cudaHostAlloc of %zu bytes failed (%s)", bytes,
               cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void pinned_free(void *p, void *user) {
    (void)user;
    if (!p) return;
    pthread_mutex_lock(&g_pin_mu);
    for (int i = 0; i < g_pin_n; i++)
        if (g_pin_maps[i].p == p) {
            const size_t bytes = g_pin_maps[i].bytes;
            g_pin_maps[i] = g_pin_maps[--g_pin_n];
            pthread_mutex_unlock(&g_pin_mu);
            cudaHostUnregister(p);
            munmap(p, bytes);
            return;
        }
    pthread_mutex_unlock(&g_pin_mu);
    cudaFreeHost(p);
}

/* ---- copies ---------------------------------------------------------------------------------------------- */

static h3_status cuda_copy(h3_exec *ex, h3_tensor *dst, const h3_tensor *src) {
    int64_t lds = h3_tensor_cols(src), ldd = h3_tensor_cols(dst);
    h3_tensor_is_rowwise(src, &lds);
    h3_tensor_is_rowwise(dst, &ldd);
    size_t es = h3_dtype_size(src->dtype);
    size_t width = (size_t)h3_tensor_cols(src) * es;
    size_t rows = (size_t)h3_tensor_rows(src);
    if (width == 0 || rows == 0) return H3_OK;
    cudaMemcpyKind kind = src->place == H3_PLACE_DEVICE
                              ? (dst->place == H3_PLACE_DEVICE ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                              : cudaMemcpyHostToDevice;
    CU_TRY(cudaMemcpy2DAsync(dst->data, (size_t)ldd * es, src->data, (size_t)lds * es, width, rows, kind,
                             cuda_stream(ex)));
    /* Pageable host memory: the copy may read it after return; make the call synchronous for safety. */
    if (kind != cudaMemcpyDeviceToDevice &&
        ((kind == cudaMemcpyHostToDevice && src->place == H3_PLACE_HOST) ||
         (kind == cudaMemcpyDeviceToHost && dst->place == H3_PLACE_HOST)))
        CU_TRY(cudaStreamSynchronize(cuda_stream(ex)));
    return H3_OK;
}

static h3_status cuda_sync(h3_exec *ex) {
    CU_TRY(cudaStreamSynchronize(cuda_state(ex)->compute));
    CU_TRY(cudaStreamSynchronize(cuda_state(ex)->copy));
    return H3_OK;
}

/* ---- public entry points ------------------------------------------------------------------------------- */

extern "C" const h3_backend *h3_cuda_backend_table(void);

extern "C" int h3_cuda_compiled(void) {
    return 1;
}

extern "C" int h3_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" h3_status h3_cuda_device_info(int device, char *name, size_t name_len, int64_t *total_bytes,
                                         int64_t *free_bytes) {
    int n = h3_cuda_device_count();
    if (device < 0 || device >= n)
        return H3_ERR(H3_ERR_UNSUPPORTED, "no CUDA device %d (this machine has %d)", device, n);
    cudaDeviceProp prop;
    CU_TRY(cudaGetDeviceProperties(&prop, device));
    if (name) snprintf(name, name_len, "%s", prop.name);
    if (total_bytes) *total_bytes = (int64_t)prop.totalGlobalMem;
    if (free_bytes) {
        size_t fr = 0, tot = 0;
        int prev = 0;
        cudaGetDevice(&prev);
        cudaSetDevice(device);
        cudaError_t e = cudaMemGetInfo(&fr, &tot);
        cudaSetDevice(prev);
        if (e != cudaSuccess) return H3_ERR(H3_ERR_DEVICE, "cudaMemGetInfo failed: %s", cudaGetErrorString(e));
        *free_bytes = (int64_t)fr;
    }
    return H3_OK;
}

extern "C" unsigned h3_cuda_lowbit_attention(int device) {
    cudaDeviceProp prop;
    if (device < 0 || device >= h3_cuda_device_count() || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    const int cc = prop.major * 10 + prop.minor;
    unsigned k = 0;
    if (cc >= 75) k |= H3_CUDA_ATTN_INT8;
    if (cc >= 89) k |= H3_CUDA_ATTN_FP8;
#ifdef H3_HAVE_SM90A
    if (prop.major == 9 && prop.minor == 0) k |= H3_CUDA_ATTN_FP8_HOPPER | H3_CUDA_ATTN_SPARSE;
#endif
    return k;
}

extern "C" h3_status h3_cuda_init(h3_exec *ex, int device, int64_t budget) {
    int n = h3_cuda_device_count();
    if (n == 0) return H3_ERR(H3_ERR_UNSUPPORTED, "no CUDA device is available (driver missing or no GPU)");
    if (device < 0 || device >= n) return H3_ERR(H3_ERR_INVALID, "no CUDA device %d (this machine has %d)", device, n);
    if (g_state) return H3_ERR(H3_ERR_INVALID, "the CUDA backend is already initialized in this process");
    CU_TRY(cudaSetDevice(device));
    h3_cuda_state *s = (h3_cuda_state *)h3_calloc(1, sizeof *s, H3_MEM_OTHER);
    pthread_mutex_t *mu = (pthread_mutex_t *)h3_malloc(sizeof *mu, H3_MEM_OTHER);
    h3_arena_block *b0 = (h3_arena_block *)h3_malloc(sizeof *b0, H3_MEM_OTHER);
    h3_status st = H3_OK;
    if (!s || !mu || !b0) {
        h3_free(s);
        h3_free(mu);
        h3_free(b0);
        return H3_ERR_NOMEM;
    }
    pthread_mutex_init(mu, NULL);
    s->mu = mu;
    cudaError_t e = cudaGetDeviceProperties(&s->prop, device);
    size_t fr = 0, tot = 0;
    if (e == cudaSuccess) e = cudaMemGetInfo(&fr, &tot);
    if (e != cudaSuccess) {
        st = H3_ERR(H3_ERR_DEVICE, "querying device %d failed: %s", device, cudaGetErrorString(e));
        goto fail;
    }
    {
        const size_t margin = (size_t)512 << 20;
        size_t cap = budget > 0 ? (size_t)budget : (fr > 2 * margin ? fr - margin : fr / 2);
        if (cap > fr) {
            st = H3_ERR(H3_ERR_BUDGET, "a device budget of %lld bytes exceeds the %zu bytes free on %s",
                        (long long)budget, fr, s->prop.name);
            goto fail;
        }
        if (h3_mem_should_fail() || (e = cudaMalloc((void **)&s->base, cap)) != cudaSuccess) {
            st = H3_ERR(H3_ERR_NOMEM, "reserving the device budget of %zu bytes on %s failed", cap, s->prop.name);
            goto fail;
        }
        s->capacity = cap;
        b0->off = 0;
        b0->size = cap;
        b0->used = 0;
        b0->next = NULL;
        s->blocks = b0;
        b0 = NULL;
    }
    if ((e = cudaStreamCreateWithFlags(&s->compute, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&s->copy, cudaStreamNonBlocking)) != cudaSuccess) {
        st = H3_ERR(H3_ERR_DEVICE, "cudaStreamCreate failed: %s", cudaGetErrorString(e));
        goto fail;
    }
    s->attn_smem_limit = (int)s->prop.sharedMemPerBlockOptin;
    g_state = s;
    __atomic_store_n(&g_arena_bytes, (int64_t)s->capacity, __ATOMIC_RELAXED);
    st = cuda_gemm_init(s);
    if (st != H3_OK) {
        g_state = NULL;
        __atomic_store_n(&g_arena_bytes, (int64_t)0, __ATOMIC_RELAXED);
        goto fail;
    }
    ex->cuda = s;
    {
        h3_place_allocator da = {dev_alloc, dev_free, NULL}, pa = {pinned_alloc, pinned_free, NULL};
        h3_place_set_allocator(H3_PLACE_DEVICE, &da);
        h3_place_set_allocator(H3_PLACE_PINNED, &pa);
        h3_backend_set_device(h3_cuda_backend_table());
    }
    H3_INFO("cuda: %s (sm_%d%d, %d SMs, %.1f GiB), device budget %.2f GiB", s->prop.name, s->prop.major,
            s->prop.minor, s->prop.multiProcessorCount, s->prop.totalGlobalMem / 1073741824.0,
            s->capacity / 1073741824.0);
    return H3_OK;
fail:
    if (s->compute) cudaStreamDestroy(s->compute);
    if (s->copy) cudaStreamDestroy(s->copy);
    if (s->base) cudaFree(s->base);
    for (h3_arena_block *b = s->blocks; b;) {
        h3_arena_block *nx = b->next;
        h3_free(b);
        b = nx;
    }
    h3_free(b0);
    pthread_mutex_destroy(mu);
    h3_free(mu);
    h3_free(s);
    return st;
}

extern "C" void h3_cuda_shutdown(h3_exec *ex) {
    h3_cuda_state *s = cuda_state(ex);
    if (!s) return;
    cudaStreamSynchronize(s->compute);
    cudaStreamSynchronize(s->copy);
    cuda_qgemm_shutdown(s);
    cuda_conv_shutdown();
    cuda_gemm_shutdown(s);
    cudaStreamDestroy(s->compute);
    cudaStreamDestroy(s->copy);
    cudaFree(s->base);
    for (h3_arena_block *b = s->blocks; b;) {
        h3_arena_block *nx = b->next;
        h3_free(b);
        b = nx;
    }
    h3_place_set_allocator(H3_PLACE_DEVICE, NULL);
    h3_place_set_allocator(H3_PLACE_PINNED, NULL);
    h3_backend_set_device(NULL);
    pthread_mutex_destroy((pthread_mutex_t *)s->mu);
    h3_free(s->mu);
    h3_free(s);
    g_state = NULL;
    __atomic_store_n(&g_arena_bytes, (int64_t)0, __ATOMIC_RELAXED);
    ex->cuda = NULL;
}

extern "C" int64_t h3_cuda_arena_bytes(void) {
    return __atomic_load_n(&g_arena_bytes, __ATOMIC_RELAXED);
}

extern "C" void h3_cuda_mem_stats(h3_exec *ex, int64_t *used, int64_t *peak, int64_t *capacity) {
    h3_cuda_state *s = cuda_state(ex);
    if (used) *used = s ? (int64_t)s->used : 0;
    if (peak) *peak = s ? (int64_t)s->peak : 0;
    if (capacity) *capacity = s ? (int64_t)s->capacity : 0;
}

extern "C" void h3_cuda_reset_peak(h3_exec *ex) {
    h3_cuda_state *s = cuda_state(ex);
    if (s) s->peak = s->used;
}

h3_status cuda_copy_entry(h3_exec *ex, h3_tensor *dst, const h3_tensor *src) {
    return cuda_copy(ex, dst, src);
}
h3_status cuda_sync_entry(h3_exec *ex) {
    return cuda_sync(ex);
}

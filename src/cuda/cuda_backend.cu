/* CUDA backend: device selection, streams, allocators. Kernels register in the backend table as they land. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "base/alloc.h"
#include "base/log.h"
#include "cuda/cuda.h"
}

#define H3_CUDA_ERR(call, what)                                                                                  \
    H3_ERR(H3_ERR_DEVICE, "%s failed: %s (%s)", what, cudaGetErrorString(call), cudaGetErrorName(call))

typedef struct h3_cuda_state {
    int device;
    cudaStream_t compute, copy;
} h3_cuda_state;

static void *dev_alloc(size_t bytes, void *user) {
    (void)user;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        H3_ERR(H3_ERR_NOMEM, "out of device memory: cudaMalloc of %zu bytes failed (%s)", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void dev_free(void *p, void *user) {
    (void)user;
    cudaFree(p);
}

static void *pinned_alloc(size_t bytes, void *user) {
    (void)user;
    void *p = NULL;
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
    cudaFreeHost(p);
}

static const h3_backend g_cuda_backend = {"cuda"};

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
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) return H3_CUDA_ERR(e, "cudaGetDeviceProperties");
    if (name) snprintf(name, name_len, "%s", prop.name);
    if (total_bytes) *total_bytes = (int64_t)prop.totalGlobalMem;
    if (free_bytes) {
        size_t fr = 0, tot = 0;
        int prev = 0;
        cudaGetDevice(&prev);
        cudaSetDevice(device);
        e = cudaMemGetInfo(&fr, &tot);
        cudaSetDevice(prev);
        if (e != cudaSuccess) return H3_CUDA_ERR(e, "cudaMemGetInfo");
        *free_bytes = (int64_t)fr;
    }
    return H3_OK;
}

extern "C" h3_status h3_cuda_init(h3_exec *ex, int device) {
    int n = h3_cuda_device_count();
    if (n == 0) return H3_ERR(H3_ERR_UNSUPPORTED, "no CUDA device is available (driver missing or no GPU)");
    if (device < 0 || device >= n) return H3_ERR(H3_ERR_INVALID, "no CUDA device %d (this machine has %d)", device, n);
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return H3_CUDA_ERR(e, "cudaSetDevice");
    h3_cuda_state *s = (h3_cuda_state *)h3_calloc(1, sizeof *s, H3_MEM_OTHER);
    if (!s) return H3_ERR_NOMEM;
    s->device = device;
    if ((e = cudaStreamCreateWithFlags(&s->compute, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&s->copy, cudaStreamNonBlocking)) != cudaSuccess) {
        h3_free(s);
        return H3_CUDA_ERR(e, "cudaStreamCreate");
    }
    ex->cuda = s;
    h3_place_allocator da = {dev_alloc, dev_free, NULL}, pa = {pinned_alloc, pinned_free, NULL};
    h3_place_set_allocator(H3_PLACE_DEVICE, &da);
    h3_place_set_allocator(H3_PLACE_PINNED, &pa);
    h3_backend_set_device(&g_cuda_backend);
    return H3_OK;
}

extern "C" void h3_cuda_shutdown(h3_exec *ex) {
    h3_cuda_state *s = (h3_cuda_state *)ex->cuda;
    if (!s) return;
    cudaStreamSynchronize(s->compute);
    cudaStreamSynchronize(s->copy);
    cudaStreamDestroy(s->compute);
    cudaStreamDestroy(s->copy);
    h3_place_set_allocator(H3_PLACE_DEVICE, NULL);
    h3_place_set_allocator(H3_PLACE_PINNED, NULL);
    h3_backend_set_device(NULL);
    h3_free(s);
    ex->cuda = NULL;
}

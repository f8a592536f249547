/* Shared pieces of the CUDA backend (.cu files only). */
#ifndef H3_CUDA_INTERNAL_CUH
#define H3_CUDA_INTERNAL_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "base/alloc.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "tensor/ops.h"
}

#define CUDA_NAME "cuda"

/* Returns an H3_ERR_DEVICE status naming the call when a CUDA runtime call fails. */
#define CU_TRY(call)                                                                                             \
    do {                                                                                                         \
        cudaError_t e__ = (call);                                                                                \
        if (e__ != cudaSuccess)                                                                                  \
            return H3_ERR(H3_ERR_DEVICE, "%s failed: %s (%s)", #call, cudaGetErrorString(e__),                   \
                          cudaGetErrorName(e__));                                                                \
    } while (0)

/* After a kernel launch: report a launch failure with the kernel's name. */
#define CU_LAUNCHED(name)                                                                                        \
    do {                                                                                                         \
        cudaError_t e__ = cudaGetLastError();                                                                    \
        if (e__ != cudaSuccess)                                                                                  \
            return H3_ERR(H3_ERR_DEVICE, "kernel %s failed to launch: %s", name, cudaGetErrorString(e__));      \
    } while (0)

/* The device arena: one region reserved at start-up, carved first-fit with coalescing, so no cudaMalloc happens
 * after start-up and every device byte the engine holds is counted. */
typedef struct h3_arena_block {
    size_t off, size;
    int used;
    struct h3_arena_block *next;
} h3_arena_block;

typedef struct h3_cuda_state {
    cudaDeviceProp prop;
    cudaStream_t compute, copy;
    cublasLtHandle_t lt;
    /* arena */
    uint8_t *base;
    size_t capacity, used, peak;
    h3_arena_block *blocks;
    void *mu; /* pthread_mutex_t* */
    /* cuBLASLt workspace (from the arena) */
    void *workspace;
    size_t workspace_size;
    /* scratch of the quantized GEMMs (cuda_qgemm.cu), reserved on first use or by h3_cuda_qgemm_reserve */
    void *qscratch;
    size_t qscratch_size;
    int qgemm_mode; /* h3_cuda_qgemm_set_mode's: bits 0-1 the path (0 fastest available, 1 dequantized tiles
                     * only, 2 fp8 with one activation scale a chunk), H3_QGEMM_FP8_EXACT */
    /* attention tile configuration chosen at start-up from the shared-memory limit */
    int attn_smem_limit;
} h3_cuda_state;

static inline h3_cuda_state *cuda_state(h3_exec *ex) {
    return (h3_cuda_state *)ex->cuda;
}
static inline cudaStream_t cuda_stream(h3_exec *ex) {
    return cuda_state(ex)->compute;
}

/* A row-wise 2-D view: rows × cols with a row stride, of a float dtype. */
typedef struct {
    void *p;
    int64_t rows, cols, ld;
    int dt; /* 0 f32, 1 bf16, 2 f16 */
} rw_view;

static inline int cuda_dt(h3_dtype t) {
    return t == H3_F32 ? 0 : t == H3_BF16 ? 1 : t == H3_F16 ? 2 : -1;
}

static inline rw_view rw_of(const h3_tensor *t) {
    rw_view v;
    v.p = t->data;
    v.rows = h3_tensor_rows(t);
    v.cols = h3_tensor_cols(t);
    v.ld = v.cols;
    h3_tensor_is_rowwise(t, &v.ld);
    v.dt = cuda_dt(t->dtype);
    return v;
}

/* The sample index along an axis of n inputs for index i, outside [0, n) after padding of mode H3_PAD_*
 * (reflect, replicate), or -1 where the padding is zeros: the convolutions' kernels (int or int64_t). */
template <typename I> __device__ __forceinline__ I cuda_pad_index(I i, I n, int mode) {
    if (i >= 0 && i < n) return i;
    if (mode == H3_PAD_REFLECT) {
        if (n == 1) return 0;
        while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
        return i;
    }
    if (mode == H3_PAD_REPLICATE) return i < 0 ? 0 : n - 1;
    return -1;
}

__device__ __forceinline__ float ld_f(const void *p, int dt, int64_t i) {
    if (dt == 1) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == 2) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ void st_f(void *p, int dt, int64_t i, float v) {
    if (dt == 1) ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
    else if (dt == 2) ((__half *)p)[i] = __float2half(v);
    else ((float *)p)[i] = v;
}

/* Four consecutive values at element i of a float array of dtype dt (0 f32, 1 bf16, 2 f16), i a multiple of 4 and
 * the array aligned to 4 elements (rw_vec4): one 16- or 8-byte access instead of four. */
__device__ __forceinline__ float4 ld_f4(const void *p, int dt, int64_t i) {
    if (dt == 0) return *(const float4 *)((const float *)p + i);
    const uint2 u = *(const uint2 *)((const uint16_t *)p + i);
    float2 a, b;
    if (dt == 1) {
        a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x);
        b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    } else {
        a = __half22float2(*(const __half2 *)&u.x);
        b = __half22float2(*(const __half2 *)&u.y);
    }
    return make_float4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ void st_f4(void *p, int dt, int64_t i, float4 v) {
    if (dt == 0) {
        *(float4 *)((float *)p + i) = v;
        return;
    }
    uint2 u;
    if (dt == 1) {
        __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        u.x = *(const uint32_t *)&a;
        u.y = *(const uint32_t *)&b;
    } else {
        __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
        u.x = *(const uint32_t *)&a;
        u.y = *(const uint32_t *)&b;
    }
    *(uint2 *)((uint16_t *)p + i) = u;
}

/* Whether ld_f4 / st_f4 may address v's rows: columns and row stride multiples of 4, the start aligned to 4
 * elements. */
static inline int rw_vec4(const rw_view &v) {
    const int es = v.dt == 0 ? 4 : 2;
    return v.cols % 4 == 0 && v.ld % 4 == 0 && ((uintptr_t)v.p % (uintptr_t)(4 * es)) == 0;
}

/* Float dtypes the elementwise kernels take. */
h3_status cuda_need_float(h3_op_id op, const char *what, const h3_tensor *t);
h3_status cuda_need_index(h3_op_id op, const h3_tensor *idx);

extern "C" {
h3_status cuda_gemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *bias,
                    unsigned flags);
h3_status cuda_attention(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k, const h3_tensor *v,
                         float scale, unsigned flags);
h3_status cuda_attention_sparse(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                                const h3_tensor *v, float scale, const h3_sparse_attn *p);
/* cuBLASLt y[M,N] = alpha·x[M,K]·w[N,K]ᵀ (+ bias) + beta·y, row-major with leading dims in elements. kind:
 * CUDA_LT_FLOAT (x, w, y of dtype dt: 0 f32, 1 bf16, 2 f16; float scalars), CUDA_LT_INT8 (int8 x and w, int32
 * y, int32 scalars), CUDA_LT_FP8 (e4m3 x and w, y of dtype dt, float scalars; _ROWS: scale vectors). Plans are
 * cached per shape. */
enum { CUDA_LT_FLOAT = 0, CUDA_LT_INT8 = 1, CUDA_LT_FP8 = 2, CUDA_LT_FP8_ROWS = 3 };
/* CUDA_LT_FLOAT's dt for f32 x, w and y multiplied on the TF32 tensor cores (10-bit mantissas, f32 accumulation) */
enum { CUDA_LT_TF32 = 3 };
h3_status cuda_lt_matmul(h3_exec *ex, int kind, int dt, int64_t M, int64_t N, int64_t K, const void *w,
                         int64_t ldw, const void *x, int64_t ldx, void *y, int64_t ldy, const void *bias,
                         int bias_dt, const void *alpha, const void *beta);
/* CUDA_LT_FP8 with device scales (cuBLASLt's scale pointers, set before its heuristic as its fp8 GEMMs want them;
 * each on a 16-byte boundary): y = (w·scales[32])·(x·scales[0])ᵀ (+ beta·y). */
h3_status cuda_lt_matmul_fp8(h3_exec *ex, int dt, int64_t M, int64_t N, int64_t K, const void *w, int64_t ldw,
                             const void *x, int64_t ldx, const float *scales, void *y, int64_t ldy,
                             const void *beta);
/* The same with a scale per weight row and per row of x (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F):
 * y[m, n] = sw[n]·sx[m]·(w·xᵀ)[n, m] (+ beta·y); sw (N floats) and sx (M floats) on 16-byte boundaries. */
h3_status cuda_lt_matmul_fp8_rows(h3_exec *ex, int dt, int64_t M, int64_t N, int64_t K, const void *w,
                                  int64_t ldw, const void *x, int64_t ldx, const float *sw, const float *sx,
                                  void *y, int64_t ldy, const void *beta);
/* GEMM with quantized weights (cuda_qgemm.cu); cuda_gemm hands them over. */
h3_status cuda_qgemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *bias,
                     unsigned flags);
void cuda_qgemm_shutdown(h3_cuda_state *s);
/* y[m, n] += bias[n] over rows × N (dtype codes as cuda_dt). */
h3_status cuda_add_bias(h3_exec *ex, void *y, int ydt, int64_t ldy, int64_t rows, int64_t N, const void *bias,
                        int bdt);
h3_status cuda_gemm_init(h3_cuda_state *s);
void cuda_gemm_shutdown(h3_cuda_state *s);
void *cuda_arena_alloc(h3_cuda_state *s, size_t bytes);
void cuda_arena_free(h3_cuda_state *s, void *p);
/* cuda_conv.cu: its entries of the backend table, and the release of its GEMM plans at shutdown. */
void cuda_conv_table(h3_backend *t);
void cuda_conv_shutdown(void);
}

/* conv3d on TF32 tensor cores as an implicit GEMM (cuda_conv3d.cu): f32 contiguous x, y, w (and b); *done 0
 * where this GPU or these shapes do not take it (the caller runs another path), 1 when queued. */
h3_status cuda_conv3d_igemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                            const h3_tensor *b, const int stride[3], const int pad0[3], const int mode[3],
                            int *done);

#endif

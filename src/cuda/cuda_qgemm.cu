/* GEMM with quantized weights on the GPU: y[M,N] = x[M,K] · W[N,K]ᵀ (+ bias) (+ y), W stored as int8 (per-row
 * or tensor scale, optionally ConvRot-rotated), fp8 (e4m3/e5m2, tensor or per-row scale) or nvfp4.
 *
 * Three ways, the fastest the weight and the GPU allow (docs/QUANT.md "The GPU half"):
 *   int8 → W8A8: each activation row is rotated per group where the weights were (the same radix-4
 * butterflies as the CPU's h3_convrot_apply, in shared memory) and quantized per token (s = max|x|/127, round
 * to nearest even), cuBLASLt multiplies int8 by int8 into int32, and one pass writes y = acc·s_x[m]·s_w[n] (+
 * bias) (+ y) in the output dtype. The weights stay rotated: x·Wᵀ = (x·H)·W_rᵀ.
 *   fp8 e4m3, sm_90+ → cuBLASLt fp8 with scale vectors (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F): each
 * activation row in e4m3 with its own scale s = max|x[r]| / 448 (one kernel: the row's maximum, then its cast),
 * the weight's tensor or per-row scales as the other vector, cuBLASLt's fast accumulation (partial sums in the
 * tensor cores' accumulator; H3_QGEMM_FP8_EXACT promotes them to fp32). One scale a token costs one
 * pass over x where one scale a tensor costs two (its maximum, then the cast), and a token with large values
 * no longer coarsens every other token's steps.
 *   fp8 e4m3 with a tensor scale, sm_89 (and Hopper when no vector algorithm exists) → cuBLASLt fp8 with scalar
 * scales: one scale per call (per chunk of rows that fits the scratch): s = max|x| / 448, x8 = e4m3(x / s)
 * (k_amax, then the cast), s times the weight's scale as cuBLASLt's B scale (a device pointer written by the
 * cast: no host round trip). (ComfyUI casts with scale 1 when a file has no input_scale, which clips activations
 * past ±448 and leaves those under 2^-6 in e4m3's subnormals.)
 *   otherwise (fp8 before sm_89 or e5m2, per-row fp8 before sm_90, nvfp4, GGUF blocks) → dequantized tiles: a
 * tile of weight rows decoded into the activations' dtype in scratch and multiplied by the ordinary GEMM; never a
 * whole-matrix copy. All scratch comes from one region of the arena (H3_CUDA_QGEMM_SCRATCH_BYTES), reserved once;
 * rows are processed in chunks that fit it. */
#include <cuda_fp8.h>
#include <string.h>

#include "cuda/cuda_internal.cuh"

extern "C" {
#include "tensor/gguf_blocks.h"
#include "tensor/qformat.h"
}

enum { QG_ROW_SMEM = 200 * 1024 }; /* shared memory of k_rot_rows at most: a row of K f32 */

static int64_t round_up(int64_t v, int64_t a) {
    return (v + a - 1) / a * a;
}

/* ---- kernels ------------------------------------------------------------------------------------------ */

/* One block per row: x row (any float dtype) → shared f32 → ConvRot per group g (0: none) → either int8 per
 * token (q, sx) or the rotated values in dtype odt (out). */
__global__ void k_rot_rows(const void *x, int xdt, int64_t ldx, int K, int g, int8_t *q, float *sx,
                           int64_t ldq, void *out, int odt, int64_t ldo) {
    extern __shared__ float sm[];
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    for (int c = threadIdx.x; c < K; c += blockDim.x) sm[c] = ld_f(x, xdt, r * ldx + c);
    __syncthreads();
    if (g > 0) {
        const int qg = g / 4, nq = K / 4;
        for (int st = 1; st < g; st *= 4) {
            for (int j = threadIdx.x; j < nq; j += blockDim.x) {
                const int grp = j / qg, jj = j % qg, o = jj % st, b0 = (jj / st) * 4 * st;
                float *p = sm + grp * g + b0 + o;
                float x0 = p[0], x1 = p[st], x2 = p[2 * st], x3 = p[3 * st];
                p[0] = 0.5f * ((x0 + x1) + (x2 - x3));
                p[st] = 0.5f * ((x0 + x1) - (x2 - x3));
                p[2 * st] = 0.5f * ((x0 - x1) + (x2 + x3));
                p[3 * st] = 0.5f * ((x2 + x3) - (x0 - x1));
            }
            __syncthreads();
        }
    }
    if (!q) {
        for (int c = threadIdx.x; c < K; c += blockDim.x) st_f(out, odt, r * ldo + c, sm[c]);
        return;
    }
    float m = 0.0f;
    for (int c = threadIdx.x; c < K; c += blockDim.x) m = fmaxf(m, fabsf(sm[c]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (threadIdx.x == 0) red[0] = m;
    }
    __syncthreads();
    float s = red[0] / 127.0f;
    if (!(s >= 1e-30f)) s = 1e-30f;
    for (int c = threadIdx.x; c < K; c += blockDim.x) {
        float v = rintf(sm[c] / s);
        q[r * ldq + c] = (int8_t)(v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v);
    }
    if (threadIdx.x == 0) sx[r] = s;
}

/* y[m, n] = acc[m, n]·sx[m]·(sw ? sw[n] : sw1) (+ bias[n]) (+ y[m, n]). Memory-bound (6 bytes per output): a
 * 2-D grid (columns in x, rows striding in y, no divisions), four columns per thread, int4 loads of the
 * products. */
__global__ void k_i8_epilogue(const int32_t *acc, int64_t lda, const float *sx, const float *sw, float sw1,
                              const void *bias, int bdt, void *y, int ydt, int64_t ldy, int64_t rows,
                              int64_t N, int accumulate) {
    const int64_t n0 = 4 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (n0 >= N) return;
    float ws[4], bs[4] = {0, 0, 0, 0};
    const int nv = N - n0 < 4 ? (int)(N - n0) : 4;
    for (int j = 0; j < nv; j++) {
        ws[j] = sw ? sw[n0 + j] : sw1;
        if (bias) bs[j] = ld_f(bias, bdt, n0 + j);
    }
    for (int64_t m = blockIdx.y; m < rows; m += gridDim.y) {
        const int32_t *a = acc + m * lda + n0;
        int32_t v[4];
        if (nv == 4) { /* lda is a multiple of 4 and n0 too: 16-byte aligned */
            int4 q = *(const int4 *)a;
            v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
        } else {
            for (int j = 0; j < nv; j++) v[j] = a[j];
        }
        const float s = sx[m];
        __nv_bfloat16 *yb = (__nv_bfloat16 *)y + m * ldy + n0;
        if (ydt == 1 && nv == 4 && !accumulate && ((uintptr_t)yb & 7) == 0) { /* one 8-byte store */
            __nv_bfloat162 lo =
                __floats2bfloat162_rn((float)v[0] * (s * ws[0]) + bs[0], (float)v[1] * (s * ws[1]) + bs[1]);
            __nv_bfloat162 hi =
                __floats2bfloat162_rn((float)v[2] * (s * ws[2]) + bs[2], (float)v[3] * (s * ws[3]) + bs[3]);
            uint2 u;
            u.x = *(uint32_t *)&lo;
            u.y = *(uint32_t *)&hi;
            *(uint2 *)yb = u;
            continue;
        }
        for (int j = 0; j < nv; j++) {
            float o = (float)v[j] * (s * ws[j]) + bs[j];
            if (accumulate) o += ld_f(y, ydt, m * ldy + n0 + j);
            st_f(y, ydt, m * ldy + n0 + j, o);
        }
    }
}

static dim3 grid2(int64_t N, int64_t rows, int per_thread) {
    int64_t gx = (N + 256 * per_thread - 1) / (256 * per_thread);
    int64_t gy = rows < 65535 ? rows : 65535;
    return dim3((unsigned)(gx < 1 ? 1 : gx), (unsigned)(gy < 1 ? 1 : gy));
}

/* y[m, n] += bias[n] (cuBLASLt's fp8 GEMMs take a bias epilogue only in some dtype pairs: added here). */
__global__ void k_add_bias(void *y, int ydt, int64_t ldy, int64_t rows, int64_t N, const void *bias,
                           int bdt) {
    const int64_t total = rows * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / N, n = i % N;
        st_f(y, ydt, m * ldy + n, ld_f(y, ydt, m * ldy + n) + ld_f(bias, bdt, n));
    }
}

/* The largest finite |value| among 8 bf16 values and m (NaN and infinities skipped, as the host's amax_of
 * does). */
__device__ __forceinline__ float amax_bf16x8(uint4 v, float m) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __bfloat1622float2(h[i]);
        const float a = fabsf(f.x), b = fabsf(f.y);
        if (a < INFINITY) m = fmaxf(m, a); /* false for NaN too */
        if (b < INFINITY) m = fmaxf(m, b);
    }
    return m;
}

/* 8 bf16 values times inv to e4m3 (saturated at ±448), packed in 8 bytes. */
__device__ __forceinline__ uint2 cvt_fp8_bf16x8(uint4 v, float inv) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
    uint2 out;
    uint16_t *ob = (uint16_t *)&out;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __bfloat1622float2(h[i]);
        ob[i] = __nv_cvt_float2_to_fp8x2(make_float2(f.x * inv, f.y * inv), __NV_SATFINITE, __NV_E4M3);
    }
    return out;
}

/* max|x| over the finite values of rows × K into *amax (f32 bits: non-negative floats order as unsigned integers;
 * zeroed first), one atomic a block; vec: bf16 rows of K, ldx multiples of 8 on 16 bytes (8 values a thread). A 2-D
 * grid whose y strides over the rows. NaN and infinities are skipped, as the host's amax_of does. */
__global__ void k_amax(const void *x, int xdt, int64_t ldx, int64_t rows, int K, int vec, unsigned *amax) {
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * (vec ? 8 : 1);
    float m = 0.0f;
    if (c < K)
        for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
            if (vec) {
                m = amax_bf16x8(*(const uint4 *)((const __nv_bfloat16 *)x + r * ldx + c), m);
            } else {
                const float a = fabsf(ld_f(x, xdt, r * ldx + c));
                if (a < INFINITY) m = fmaxf(m, a);
            }
        }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __shared__ float red[32];
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, red[w]);
        atomicMax(amax, __float_as_uint(m));
    }
}

/* *amax cleared, then k_amax over rows × K of x (bf16 or f32, row stride ldx) on stream st. */
static h3_status amax_launch(cudaStream_t st, const void *x, int xdt, int64_t ldx, int64_t rows, int64_t K,
                             unsigned *amax) {
    const int vec = xdt == 1 && K % 8 == 0 && ldx % 8 == 0 && ((uintptr_t)x & 15) == 0;
    if (cudaMemsetAsync(amax, 0, sizeof *amax, st) != cudaSuccess)
        return H3_ERR(H3_ERR_DEVICE, "fp8: clearing the maximum failed");
    dim3 ga = grid2(K, rows, vec ? 8 : 1);
    if (ga.y > 1024) ga.y = 1024; /* a few thousand atomics on one address, not one a row */
    k_amax<<<ga, 256, 0, st>>>(x, xdt, ldx, rows, (int)K, vec, amax);
    CU_LAUNCHED("amax");
    return H3_OK;
}

/* The cast's factor from k_amax's maximum: 448 / max (1 when 0 or not finite); the block (0, 0)'s thread 0 writes
 * the GEMM's scales: scale[0] = max / 448 (1 when 0) times the weight's scale ws (x's, cuBLASLt's B scale),
 * scale[FP8_SCALE_A] = 1 (the weight's, A). */
#define FP8_SCALE_A 32 /* floats: cuBLASLt rejects scale pointers off 16-byte (here 128-byte) boundaries */
__device__ __forceinline__ float fp8_inv_scale(const unsigned *amax, float *scale, float ws) {
    const float m = __uint_as_float(*amax);
    const bool ok = m > 0.0f && m <= 3.0e38f;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
        scale[0] = (ok ? m / 448.0f : 1.0f) * ws;
        scale[FP8_SCALE_A] = 1.0f;
    }
    return ok ? 448.0f / m : 1.0f;
}

/* x rows / s → e4m3 (s = k_amax's max / 448), saturated at ±448 (NaN stays NaN); 2-D grid as the epilogue's. */
__global__ void k_cast_fp8(const void *x, int xdt, int64_t ldx, int64_t rows, int K, __nv_fp8_storage_t *o,
                           int64_t ldo, const unsigned *amax, float *scale, float ws) {
    const float inv = fp8_inv_scale(amax, scale, ws);
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= K) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        o[r * ldo + c] = __nv_cvt_float_to_fp8(ld_f(x, xdt, r * ldx + c) * inv, __NV_SATFINITE, __NV_E4M3);
}

/* k_cast_fp8 for bf16 rows whose K, ldx and ldo are multiples of 8 (16-byte aligned): 8 values a thread, one
 * 16-byte load and one 8-byte store (the DiT's activations; the scalar kernel's 2-byte loads and 1-byte stores
 * are the general case). */
__global__ void k_cast_fp8_bf16x8(const __nv_bfloat16 *x, int64_t ldx, int64_t rows, int K,
                                  __nv_fp8_storage_t *o, int64_t ldo, const unsigned *amax, float *scale,
                                  float ws) {
    const float inv = fp8_inv_scale(amax, scale, ws);
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (c >= K) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        *(uint2 *)(o + r * ldo + c) = cvt_fp8_bf16x8(*(const uint4 *)(x + r * ldx + c), inv);
}

/* One scale a row (a token): for each row r, s = max|x[r]| / 448 (1 when 0 or not finite; NaN and infinities
 * skipped as k_amax does), e4m3(x[r] / s) into o and s into srow[r]: cuBLASLt's B scale vector
 * (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F). One block a row; the row is read twice, the second time from the
 * caches (a row of 14,336 bf16 values is 28 KB). vec: bf16 rows with K, ldx, ldo multiples of 8 on 16 bytes. */
template <int VEC>
__global__ void k_cast_fp8_rows(const void *x, int xdt, int64_t ldx, int64_t rows, int K, __nv_fp8_storage_t *o,
                                int64_t ldo, float *srow) {
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float m = 0.0f;
        if (VEC) {
            const __nv_bfloat16 *xr = (const __nv_bfloat16 *)x + r * ldx;
            for (int c = threadIdx.x * 8; c < K; c += blockDim.x * 8)
                m = amax_bf16x8(*(const uint4 *)(xr + c), m);
        } else {
            for (int c = threadIdx.x; c < K; c += blockDim.x) {
                const float a = fabsf(ld_f(x, xdt, r * ldx + c));
                if (a < INFINITY) m = fmaxf(m, a);
            }
        }
        for (int sh = 16; sh > 0; sh >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, sh));
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
        __syncthreads();
        m = red[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, red[w]);
        __syncthreads(); /* red is reused by the next row */
        const bool ok = m > 0.0f && m <= 3.0e38f;
        const float inv = ok ? 448.0f / m : 1.0f;
        if (threadIdx.x == 0) srow[r] = ok ? m / 448.0f : 1.0f;
        if (VEC) {
            const __nv_bfloat16 *xr = (const __nv_bfloat16 *)x + r * ldx;
            for (int c = threadIdx.x * 8; c < K; c += blockDim.x * 8)
                *(uint2 *)(o + r * ldo + c) = cvt_fp8_bf16x8(*(const uint4 *)(xr + c), inv);
        } else {
            for (int c = threadIdx.x; c < K; c += blockDim.x)
                o[r * ldo + c] =
                    __nv_cvt_float_to_fp8(ld_f(x, xdt, r * ldx + c) * inv, __NV_SATFINITE, __NV_E4M3);
        }
    }
}

/* cuBLASLt's A scale vector: the weight's per-row scales, or its one scale in every row. */
__global__ void k_fill_wscale(float *sa, int64_t N, const float *rs, float ts) {
    const int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (n < N) sa[n] = rs ? rs[n] : ts;
}

enum { DQ_I8 = 0, DQ_E4M3, DQ_E5M2, DQ_NVFP4, DQ_GGUF };

__device__ __forceinline__ float e2m1(int c) {
    const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (c & 8) ? -v[c & 7] : v[c & 7];
}

__device__ __forceinline__ float fp8_to_f(uint8_t b, __nv_fp8_interpretation_t kind) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, kind)));
}

/* Weight rows [r0, r0 + rows) decoded into out [rows, K] (dtype odt): int8/fp8 value × (per-row or tensor)
 * scale; nvfp4 as the CPU decodes it (E2M1 × (e4m3 block scale × scale_2), high nibble first), then ×
 * col_scale[k]. */
__global__ void k_dequant_rows(const uint8_t *w, int64_t ldw_bytes, int kind, int64_t r0, int64_t rows, int K,
                               const float *row_scale, float scale, const uint8_t *fmt_scales,
                               int64_t fmt_row0, const uint8_t *col_scale, void *out, int odt) {
    const int64_t total = rows * K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / K, c = i % K, gr = r0 + r;
        const uint8_t *row = w + gr * ldw_bytes;
        float v;
        if (kind == DQ_NVFP4) {
            const int64_t C = K / 16, R = fmt_row0 + gr, cb = c / 16;
            const int64_t si =
                ((R / 128) * ((C + 3) / 4) + cb / 4) * 512 + (R % 32) * 16 + ((R % 128) / 32) * 4 + cb % 4;
            const float ts = fp8_to_f(fmt_scales[si], __NV_E4M3) * scale;
            const uint8_t b = row[c / 2];
            v = e2m1((c & 1) ? (b & 15) : (b >> 4)) * ts;
        } else {
            const float s = row_scale ? row_scale[gr] : scale;
            const uint8_t b = row[c];
            v = (kind == DQ_I8 ? (float)(int8_t)b : fp8_to_f(b, kind == DQ_E4M3 ? __NV_E4M3 : __NV_E5M2)) * s;
        }
        if (col_scale) {
            const uint16_t h = (uint16_t)(col_scale[2 * c] | (col_scale[2 * c + 1] << 8));
            v *= __uint_as_float((uint32_t)h << 16);
        }
        st_f(out, odt, r * K + c, v);
    }
}

/* GGUF weight rows [r0, r0 + rows) into out [rows, K]: one thread per block of be values (32 or 256), decoded
 * by the same code as the CPU's (tensor/gguf_blocks.h). */
__global__ void k_dequant_gguf(const uint8_t *w, int64_t ldw_bytes, int fmt, int be, int bb, int64_t r0,
                               int64_t rows, int K, void *out, int odt) {
    const int64_t nb = K / be, total = rows * nb;
    float y[256];
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / nb, b = i % nb;
        h3_gguf_block_decode(fmt, w + (r0 + r) * ldw_bytes + b * bb, y);
        for (int j = 0; j < be; j++) st_f(out, odt, r * K + b * be + j, y[j]);
    }
}

static unsigned grid_for(int64_t n) {
    int64_t g = (n + 255) / 256;
    return (unsigned)(g < 1 ? 1 : g > 65535 * 8 ? 65535 * 8 : g);
}

extern "C" h3_status cuda_add_bias(h3_exec *ex, void *y, int ydt, int64_t ldy, int64_t rows, int64_t N,
                                   const void *bias, int bdt) {
    if (rows <= 0 || N <= 0) return H3_OK;
    k_add_bias<<<grid_for(rows * N), 256, 0, cuda_stream(ex)>>>(y, ydt, ldy, rows, N, bias, bdt);
    CU_LAUNCHED("add_bias");
    return H3_OK;
}

/* ---- scratch ----------------------------------------------------------------------------------------- */

static h3_status reserve(h3_cuda_state *s) {
    if (s->qscratch) return H3_OK;
    s->qscratch = cuda_arena_alloc(s, (size_t)H3_CUDA_QGEMM_SCRATCH_BYTES);
    if (!s->qscratch)
        return H3_ERR(H3_ERR_NOMEM,
                      "the device budget has no room for the %lld MiB scratch of quantized GEMMs",
                      (long long)(H3_CUDA_QGEMM_SCRATCH_BYTES >> 20));
    s->qscratch_size = (size_t)H3_CUDA_QGEMM_SCRATCH_BYTES;
    /* once: the activation kernel keeps a whole row in shared memory */
    cudaFuncSetAttribute(k_rot_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, QG_ROW_SMEM);
    return H3_OK;
}

extern "C" h3_status h3_cuda_qgemm_reserve(h3_exec *ex) {
    if (!ex || !ex->cuda) return H3_ERR(H3_ERR_INVALID, "h3_cuda_qgemm_reserve: no CUDA backend");
    return reserve(cuda_state(ex));
}

/* w's values · inv → e4m3 as h3_quantize_fp8 (saturated at ±448, not finite → 0x7f). */
__global__ void k_quantize_fp8(const void *w, int wdt, int64_t n, const unsigned *amax, uint8_t *q) {
    float s = __uint_as_float(*amax) / 448.0f;
    s = s > 0.0f ? s : 1.0f;
    const float inv = 1.0f / s;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float x = ld_f(w, wdt, i);
        q[i] = isfinite(x) ? (uint8_t)__nv_cvt_float_to_fp8(x * inv, __NV_SATFINITE, __NV_E4M3) : 0x7f;
    }
}

extern "C" h3_status h3_cuda_quantize_fp8(h3_exec *ex, const h3_tensor *w, void *q, float *scale) {
    if (!ex || !ex->cuda) return H3_ERR(H3_ERR_INVALID, "h3_cuda_quantize_fp8: no CUDA backend");
    const int dt = cuda_dt(w->dtype);
    if (w->place != H3_PLACE_DEVICE || (dt != 0 && dt != 1) || w->ndim != 2 || !h3_tensor_is_contiguous(w))
        return H3_ERR(H3_ERR_INVALID, "h3_cuda_quantize_fp8: a contiguous 2-D bf16 or f32 device matrix");
    h3_cuda_state *s = cuda_state(ex);
    H3_TRY(reserve(s));
    unsigned *amax = (unsigned *)s->qscratch;
    const int64_t N = w->shape[0], K = w->shape[1];
    cudaStream_t st = cuda_stream(ex);
    H3_TRY(amax_launch(st, w->data, dt, K, N, K, amax));
    k_quantize_fp8<<<grid_for(N * K), 256, 0, st>>>(w->data, dt, N * K, amax, (uint8_t *)q);
    CU_LAUNCHED("quantize_fp8");
    unsigned m = 0;
    if (cudaMemcpyAsync(&m, amax, sizeof m, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
        cudaStreamSynchronize(st) != cudaSuccess)
        return H3_ERR(H3_ERR_DEVICE, "fp8 quantization: reading its maximum failed: %s",
                      cudaGetErrorString(cudaGetLastError()));
    float sc;
    memcpy(&sc, &m, sizeof sc);
    sc /= 448.0f;
    *scale = sc > 0.0f ? sc : 1.0f;
    return H3_OK;
}

extern "C" void h3_cuda_qgemm_release(h3_exec *ex) {
    if (!ex || !ex->cuda) return;
    h3_cuda_state *s = cuda_state(ex);
    if (!s->qscratch) return;
    cudaStreamSynchronize(s->compute); /* queued GEMMs may still read it */
    cuda_arena_free(s, s->qscratch);
    s->qscratch = NULL;
    s->qscratch_size = 0;
}

extern "C" void h3_cuda_qgemm_set_mode(h3_exec *ex, int mode) {
    const int path = mode & 3;
    if (ex && ex->cuda) cuda_state(ex)->qgemm_mode = (path == 3 ? 0 : path) | (mode & H3_QGEMM_FP8_EXACT);
}

extern "C" int h3_cuda_fp8_act_rows(h3_exec *ex) {
    if (!ex || !ex->cuda) return 0;
    const h3_cuda_state *s = cuda_state(ex);
    return s->prop.major >= 9 && (s->qgemm_mode & 3) == 0;
}

extern "C" void cuda_qgemm_shutdown(h3_cuda_state *s) {
    if (s->qscratch) cuda_arena_free(s, s->qscratch);
    s->qscratch = NULL;
    s->qscratch_size = 0;
}

/* ---- the three paths ------------------------------------------------------------------------------------
 */

typedef struct {
    int64_t M, N, K;
    rw_view X, Y;
    const uint8_t *w;
    int64_t ldw; /* bytes */
    int ydt, bdt, accumulate;
    const void *bias;
} qg_args;

static h3_status rot_rows(h3_exec *ex, const rw_view *X, int64_t r0, int64_t rows, int64_t K, int g,
                          int8_t *q, float *sx, void *out, int odt) {
    const size_t smem = (size_t)K * sizeof(float);
    if (smem > QG_ROW_SMEM)
        return H3_ERR(H3_ERR_UNSUPPORTED,
                      "quantized GEMM: K = %lld is too wide for the activation kernel (at most %lld)",
                      (long long)K, (long long)(QG_ROW_SMEM / 4));
    k_rot_rows<<<(unsigned)rows, 256, smem, cuda_stream(ex)>>>(
        (const uint8_t *)X->p + r0 * X->ld * (X->dt == 0 ? 4 : 2), X->dt, X->ld, (int)K, g, q, sx, K, out,
        odt, K);
    CU_LAUNCHED("rot_rows");
    return H3_OK;
}

static h3_status run_w8a8(h3_exec *ex, const qg_args *a, const h3_tensor *w) {
    h3_cuda_state *s = cuda_state(ex);
    const int64_t Kp = round_up(a->K, 16), Np = round_up(a->N, 4);
    const int64_t per_row = Kp + Np * 4 + 4;
    int64_t mc = ((int64_t)s->qscratch_size - 4096) / per_row;
    if (mc > a->M) mc = a->M;
    if (mc < 1)
        return H3_ERR(H3_ERR_UNSUPPORTED, "int8 GEMM: N = %lld is too wide for the scratch", (long long)a->N);
    int8_t *xq = (int8_t *)s->qscratch;
    int32_t *acc = (int32_t *)((uint8_t *)s->qscratch + round_up(mc * Kp, 256));
    float *sx = (float *)((uint8_t *)acc + round_up(mc * Np * 4, 256));
    const float *sw = w->q.mode == H3_SCALE_ROW ? w->q.scales : NULL;
    const float sw1 = w->q.mode == H3_SCALE_TENSOR ? w->q.scale : 1.0f;
    const int32_t one = 1, zero = 0;
    const size_t yes = a->ydt == 0 ? 4 : 2;
    for (int64_t m0 = 0; m0 < a->M; m0 += mc) {
        const int64_t m = a->M - m0 < mc ? a->M - m0 : mc;
        H3_TRY(rot_rows(ex, &a->X, m0, m, a->K, w->q.rot_group, xq, sx, NULL, 0));
        h3_status st = cuda_lt_matmul(ex, CUDA_LT_INT8, 0, m, a->N, a->K, a->w, a->ldw, xq, Kp, acc, Np, NULL,
                                      -1, &one, &zero);
        if (st != H3_OK)
            return m0 ? h3_error_wrap(H3_ERR_DEVICE, "int8 GEMM, rows from %lld", (long long)m0) : st;
        k_i8_epilogue<<<grid2(a->N, m, 4), 256, 0, cuda_stream(ex)>>>(
            acc, Np, sx, sw, sw1, a->bias, a->bdt, (uint8_t *)a->Y.p + m0 * a->Y.ld * yes, a->ydt, a->Y.ld, m,
            a->N, a->accumulate);
        CU_LAUNCHED("i8_epilogue");
    }
    return H3_OK;
}

/* e4m3 weights through cuBLASLt's fp8 GEMM; the activations cast to e4m3 in the scratch, chunk of rows by chunk.
 * rows = 1: one scale a row of x and the weight's scale (or per-row scales) as vectors (Hopper on); rows = 0: one
 * scale a chunk (max|x| / 448) and the weight's tensor scale, as scalars (Ada; Hopper when asked,
 * h3_cuda_qgemm_set_mode). H3_ERR_UNSUPPORTED when cuBLASLt has no algorithm (the caller falls back). */
static h3_status run_fp8(h3_exec *ex, const qg_args *a, const h3_tensor *w, int rows) {
    h3_cuda_state *s = cuda_state(ex);
    const int64_t Kp = round_up(a->K, 16);
    /* the scratch: the maximum, x's scale (times the weight's) and the weight's 1, 128 bytes apart (512 in all);
     * with rows, the weight's scale vector (N floats) and x's (one a row), each from a 128-byte boundary; then
     * the e4m3 rows */
    const int64_t sa_bytes = rows ? round_up(a->N * 4, 128) : 0;
    int64_t mc = ((int64_t)s->qscratch_size - 512 - sa_bytes - 128) / (Kp + (rows ? 4 : 0));
    if (mc < 1)
        return H3_ERR(H3_ERR_UNSUPPORTED, "fp8 GEMM: N = %lld is too wide for the scratch", (long long)a->N);
    if (mc > a->M) mc = a->M; /* (chunks of equal size measured no faster: bench/NOTES.md) */
    unsigned *amax = (unsigned *)s->qscratch;
    float *scales = (float *)((uint8_t *)s->qscratch + 128);
    float *sa = (float *)((uint8_t *)s->qscratch + 512), *sb = (float *)((uint8_t *)sa + sa_bytes);
    __nv_fp8_storage_t *xf =
        (__nv_fp8_storage_t *)((uint8_t *)s->qscratch + 512 + (rows ? sa_bytes + round_up(mc * 4, 128) : 0));
    const float ts = w->q.mode == H3_SCALE_TENSOR ? w->q.scale : 1.0f, beta = a->accumulate ? 1.0f : 0.0f;
    const size_t yes = a->ydt == 0 ? 4 : 2;
    const size_t xes = a->X.dt == 0 ? 4 : 2;
    if (rows) {
        k_fill_wscale<<<(unsigned)((a->N + 255) / 256), 256, 0, cuda_stream(ex)>>>(
            sa, a->N, w->q.mode == H3_SCALE_ROW ? w->q.scales : NULL, ts);
        CU_LAUNCHED("fill_wscale");
    }
    for (int64_t m0 = 0; m0 < a->M; m0 += mc) {
        const int64_t m = a->M - m0 < mc ? a->M - m0 : mc;
        const uint8_t *xp = (const uint8_t *)a->X.p + m0 * a->X.ld * xes;
        const int vec = a->X.dt == 1 && a->K % 8 == 0 && a->X.ld % 8 == 0 && ((uintptr_t)xp & 15) == 0;
        if (rows) {
            const unsigned g = (unsigned)(m < 65535 ? m : 65535);
            if (vec)
                k_cast_fp8_rows<1>
                    <<<g, 256, 0, cuda_stream(ex)>>>(xp, a->X.dt, a->X.ld, m, (int)a->K, xf, Kp, sb);
            else
                k_cast_fp8_rows<0>
                    <<<g, 256, 0, cuda_stream(ex)>>>(xp, a->X.dt, a->X.ld, m, (int)a->K, xf, Kp, sb);
        } else {
            H3_TRY(amax_launch(cuda_stream(ex), xp, a->X.dt, a->X.ld, m, a->K, amax));
            if (vec)
                k_cast_fp8_bf16x8<<<grid2(a->K, m, 8), 256, 0, cuda_stream(ex)>>>(
                    (const __nv_bfloat16 *)xp, a->X.ld, m, (int)a->K, xf, Kp, amax, scales, ts);
            else
                k_cast_fp8<<<grid2(a->K, m, 1), 256, 0, cuda_stream(ex)>>>(xp, a->X.dt, a->X.ld, m, (int)a->K,
                                                                              xf, Kp, amax, scales, ts);
        }
        CU_LAUNCHED("cast_fp8");
        void *yp = (uint8_t *)a->Y.p + m0 * a->Y.ld * yes;
        h3_status st = rows ? cuda_lt_matmul_fp8_rows(ex, a->ydt, m, a->N, a->K, a->w, a->ldw, xf, Kp, sa, sb, yp,
                                                      a->Y.ld, &beta)
                            : cuda_lt_matmul_fp8(ex, a->ydt, m, a->N, a->K, a->w, a->ldw, xf, Kp, scales, yp,
                                                 a->Y.ld, &beta);
        if (st != H3_OK)
            return m0 ? h3_error_wrap(H3_ERR_DEVICE, "fp8 GEMM, rows from %lld", (long long)m0) : st;
        if (a->bias) H3_TRY(cuda_add_bias(ex, yp, a->ydt, a->Y.ld, m, a->N, a->bias, a->bdt));
    }
    return H3_OK;
}

static h3_status run_dequant(h3_exec *ex, const qg_args *a, const h3_tensor *w, int kind) {
    h3_cuda_state *s = cuda_state(ex);
    const int cdt =
        a->ydt; /* compute in the output's dtype: x staged (and rotated) into it, weights decoded */
    const size_t es = cdt == 0 ? 4 : 2;
    const int64_t row_b = round_up(a->K * (int64_t)es, 256);
    const int64_t half = (int64_t)s->qscratch_size / 2;
    int64_t mc = half / row_b, nc = half / row_b;
    if (mc > a->M) mc = a->M;
    if (nc > a->N) nc = a->N;
    if (mc < 1)
        return H3_ERR(H3_ERR_UNSUPPORTED, "quantized GEMM: K = %lld is too wide for the scratch",
                      (long long)a->K);
    uint8_t *xs = (uint8_t *)s->qscratch, *wd = xs + half;
    const float one = 1.0f, beta = a->accumulate ? 1.0f : 0.0f;
    const float *rs = w->q.mode == H3_SCALE_ROW ? w->q.scales : NULL;
    const float sc = (w->q.mode == H3_SCALE_TENSOR || kind == DQ_NVFP4) ? w->q.scale : 1.0f;
    const size_t bes = a->bdt == 0 ? 4 : 2;
    for (int64_t m0 = 0; m0 < a->M; m0 += mc) {
        const int64_t m = a->M - m0 < mc ? a->M - m0 : mc;
        H3_TRY(rot_rows(ex, &a->X, m0, m, a->K, kind == DQ_I8 ? w->q.rot_group : 0, NULL, NULL, xs, cdt));
        for (int64_t n0 = 0; n0 < a->N; n0 += nc) {
            const int64_t n = a->N - n0 < nc ? a->N - n0 : nc;
            if (kind == DQ_GGUF) {
                int64_t be = 0, bb = 0;
                h3_qformat_block((h3_qformat)w->q.format, &be, &bb);
                k_dequant_gguf<<<grid_for(n * (a->K / be)), 128, 0, cuda_stream(ex)>>>(
                    a->w, a->ldw, w->q.format, (int)be, (int)bb, n0, n, (int)a->K, wd, cdt);
            } else {
                k_dequant_rows<<<grid_for(n * a->K), 256, 0, cuda_stream(ex)>>>(
                    a->w, a->ldw, kind, n0, n, (int)a->K, rs, sc, w->q.fmt_scales, w->q.fmt_row0,
                    w->q.col_scale, wd, cdt);
            }
            CU_LAUNCHED("dequant_rows");
            const void *b = a->bias ? (const uint8_t *)a->bias + n0 * bes : NULL;
            H3_TRY(cuda_lt_matmul(ex, CUDA_LT_FLOAT, cdt, m, n, a->K, wd, a->K, xs, a->K,
                                  (uint8_t *)a->Y.p + (m0 * a->Y.ld + n0) * es, a->Y.ld, b, a->bdt, &one,
                                  &beta));
        }
    }
    return H3_OK;
}

extern "C" h3_status cuda_qgemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                                const h3_tensor *bias, unsigned flags) {
    h3_cuda_state *s = cuda_state(ex);
    if (cuda_dt(x->dtype) < 0 || x->q.mode != H3_SCALE_NONE)
        return h3_missing_kernel(H3_OP_GEMM, CUDA_NAME, "activations", x->dtype);
    if (cuda_dt(y->dtype) < 0) return h3_missing_kernel(H3_OP_GEMM, CUDA_NAME, "output", y->dtype);
    if (bias && cuda_dt(bias->dtype) < 0)
        return h3_missing_kernel(H3_OP_GEMM, CUDA_NAME, "bias", bias->dtype);
    const char *why = NULL;
    if (!h3_quant_gpu_supported(w, &why))
        return H3_ERR(H3_ERR_UNSUPPORTED,
                      "op 'gemm' on the cuda backend: %s weights (%s) run on the CPU only for now",
                      h3_dtype_name(w->dtype), why);
    const h3_scale_mode md = w->q.mode;
    const int kind = md == H3_SCALE_FORMAT    ? (w->q.format == H3_QF_NVFP4 ? DQ_NVFP4 : DQ_GGUF)
                     : w->dtype == H3_I8      ? DQ_I8
                     : w->dtype == H3_F8_E4M3 ? DQ_E4M3
                                              : DQ_E5M2;
    if (kind == DQ_NVFP4 && !w->q.fmt_scales)
        return H3_ERR(H3_ERR_INVALID, "op 'gemm': an nvfp4 weight without its block scales");
    qg_args a;
    memset(&a, 0, sizeof a);
    a.X = rw_of(x);
    a.Y = rw_of(y);
    a.M = a.X.rows;
    a.K = a.X.cols;
    a.N = w->shape[0];
    a.ydt = a.Y.dt;
    a.bias = bias ? bias->data : NULL;
    a.bdt = bias ? cuda_dt(bias->dtype) : -1;
    a.accumulate = (flags & H3_GEMM_ACCUMULATE) != 0;
    a.w = (const uint8_t *)w->data;
    if (kind == DQ_NVFP4) {
        a.ldw = w->stride[0];
    } else {
        int64_t ld = a.K;
        h3_tensor_is_rowwise(w, &ld);
        a.ldw = ld;
    }
    if (a.M == 0 || a.N == 0) return H3_OK;
    if (w->q.rot_group && (a.K % w->q.rot_group))
        return H3_ERR(H3_ERR_INVALID, "op 'gemm': ConvRot group %d does not divide K = %lld", w->q.rot_group,
                      (long long)a.K);
    H3_TRY(reserve(s));
    const int sm = s->prop.major * 10 + s->prop.minor;
    const int path = s->qgemm_mode & 3;
    if (path != 1 && kind == DQ_I8 && a.K % 4 == 0 && a.ldw % 4 == 0) {
        h3_status st = run_w8a8(ex, &a, w);
        if (st != H3_ERR_UNSUPPORTED) return st;
        h3_clear_error(); /* no int8 algorithm for this shape: the dequantized path below */
    }
    if (path != 1 && kind == DQ_E4M3 && sm >= 89 && a.K % 16 == 0 && a.N % 16 == 0 && a.ldw % 16 == 0) {
        /* Hopper on: one scale a token (and the weight's per-row scales when it has them); Ada, or when asked:
         * one scale a chunk, tensor-scaled weights only */
        if (sm >= 90 && path == 0) {
            h3_status st = run_fp8(ex, &a, w, 1);
            if (st != H3_ERR_UNSUPPORTED) return st;
            h3_clear_error();
        }
        if (md != H3_SCALE_ROW) {
            h3_status st = run_fp8(ex, &a, w, 0);
            if (st != H3_ERR_UNSUPPORTED) return st;
            h3_clear_error();
        }
    }
    return run_dequant(ex, &a, w, kind);
}

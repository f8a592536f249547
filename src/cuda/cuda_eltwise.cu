/* Row-wise and elementwise CUDA kernels, the direct conv3d, and the backend table (the 1-D convolutions and the
 * anti-aliased Snake are in cuda_conv.cu). Activations may be f32, bf16 or f16; math is f32; statistics reduce in
 * f32 within a row.
 *
 * Indices on the device are not validated element by element (that would need a copy back): the layer that
 * builds them (the packed layout) validates them on the host; kernels skip out-of-range rows rather than
 * write out of bounds. */
#include <math.h>
#include <stdlib.h>

#include "cuda/cuda_internal.cuh"

#define NT 256

h3_status cuda_need_float(h3_op_id op, const char *what, const h3_tensor *t) {
    if (t && (cuda_dt(t->dtype) < 0 || t->q.mode != H3_SCALE_NONE))
        return h3_missing_kernel(op, CUDA_NAME, what, t->dtype);
    return H3_OK;
}

h3_status cuda_need_index(h3_op_id op, const h3_tensor *idx) {
    if (idx && idx->dtype != H3_I32 && idx->dtype != H3_I64) return h3_missing_kernel(op, CUDA_NAME, "index", idx->dtype);
    return H3_OK;
}

__device__ __forceinline__ int64_t ld_idx(const void *p, int is64, int64_t i) {
    return is64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* Sum over the block; every thread gets the result. */
__device__ float block_sum(float v) {
    __shared__ float sh[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    v = l < nw ? sh[l] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float block_max(float v) {
    __shared__ float sh[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    v = l < nw ? sh[l] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static int threads_for(int64_t cols) {
    int t = 32;
    while (t < NT && t < cols) t *= 2;
    return t;
}

/* ---- norms ------------------------------------------------------------------------------------------------ */

__global__ void k_rms(rw_view y, rw_view x, const void *w, int wdt, float eps) {
    int64_t r = blockIdx.x;
    const void *xr = (const char *)x.p;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float v = ld_f(xr, x.dt, r * x.ld + i);
        ss += v * v;
    }
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)x.cols + eps);
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float v = ld_f(xr, x.dt, r * x.ld + i) * inv;
        if (w) v *= ld_f(w, wdt, i);
        st_f(y.p, y.dt, r * y.ld + i, v);
    }
}

static h3_status cuda_rms_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, float eps) {
    H3_TRY(cuda_need_float(H3_OP_RMS_NORM, "x", x));
    H3_TRY(cuda_need_float(H3_OP_RMS_NORM, "y", y));
    H3_TRY(cuda_need_float(H3_OP_RMS_NORM, "weight", w));
    rw_view X = rw_of(x), Y = rw_of(y);
    if (X.rows == 0) return H3_OK;
    k_rms<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(Y, X, w ? w->data : NULL,
                                                                        w ? cuda_dt(w->dtype) : 0, eps);
    CU_LAUNCHED("rms_norm");
    return H3_OK;
}

__global__ void k_ln(rw_view y, rw_view x, const void *w, int wdt, const void *b, int bdt, float eps) {
    int64_t r = blockIdx.x;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) s += ld_f(x.p, x.dt, r * x.ld + i);
    float mean = block_sum(s) / (float)x.cols;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float d = ld_f(x.p, x.dt, r * x.ld + i) - mean;
        ss += d * d;
    }
    float inv = rsqrtf(block_sum(ss) / (float)x.cols + eps);
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float v = (ld_f(x.p, x.dt, r * x.ld + i) - mean) * inv;
        if (w) v *= ld_f(w, wdt, i);
        if (b) v += ld_f(b, bdt, i);
        st_f(y.p, y.dt, r * y.ld + i, v);
    }
}

static h3_status cuda_layer_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                                 const h3_tensor *b, float eps) {
    H3_TRY(cuda_need_float(H3_OP_LAYER_NORM, "x", x));
    H3_TRY(cuda_need_float(H3_OP_LAYER_NORM, "y", y));
    H3_TRY(cuda_need_float(H3_OP_LAYER_NORM, "weight", w));
    H3_TRY(cuda_need_float(H3_OP_LAYER_NORM, "bias", b));
    rw_view X = rw_of(x), Y = rw_of(y);
    if (X.rows == 0) return H3_OK;
    k_ln<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(
        Y, X, w ? w->data : NULL, w ? cuda_dt(w->dtype) : 0, b ? b->data : NULL, b ? cuda_dt(b->dtype) : 0, eps);
    CU_LAUNCHED("layer_norm");
    return H3_OK;
}

/* One block per (item, group): its cpg channel rows of S (each row contiguous, rows and items strided), read
 * three times (sum, then the squared deviations, then the output): the group's rows stay in L2 between the
 * passes. Rows whose starts, strides and length allow it go four values at a time. */
__global__ void k_gn(void *y, int ydt, const void *x, int xdt, int64_t C, int64_t S, int G, int64_t xb,
                     int64_t xc, int64_t yb, int64_t yc, const void *w, int wdt, const void *b, int bdt,
                     float eps, int vec) {
    const int64_t bi = blockIdx.x / G, g = blockIdx.x % G, cpg = C / G, n = cpg * S;
    const int64_t xo = bi * xb + g * cpg * xc, yo = bi * yb + g * cpg * yc;
    float s = 0.0f;
    for (int64_t ch = 0; ch < cpg; ch++) {
        if (vec)
            for (int64_t i = 4 * threadIdx.x; i < S; i += 4 * blockDim.x) {
                const float4 v = ld_f4(x, xdt, xo + ch * xc + i);
                s += (v.x + v.y) + (v.z + v.w);
            }
        else
            for (int64_t i = threadIdx.x; i < S; i += blockDim.x) s += ld_f(x, xdt, xo + ch * xc + i);
    }
    const float mean = block_sum(s) / (float)n;
    float ss = 0.0f;
    for (int64_t ch = 0; ch < cpg; ch++) {
        if (vec)
            for (int64_t i = 4 * threadIdx.x; i < S; i += 4 * blockDim.x) {
                const float4 v = ld_f4(x, xdt, xo + ch * xc + i);
                const float a = v.x - mean, b2 = v.y - mean, c = v.z - mean, d = v.w - mean;
                ss += (a * a + b2 * b2) + (c * c + d * d);
            }
        else
            for (int64_t i = threadIdx.x; i < S; i += blockDim.x) {
                const float d = ld_f(x, xdt, xo + ch * xc + i) - mean;
                ss += d * d;
            }
    }
    const float inv = rsqrtf(block_sum(ss) / (float)n + eps);
    for (int64_t ch = 0; ch < cpg; ch++) {
        const int64_t c = g * cpg + ch;
        const float sc = inv * (w ? ld_f(w, wdt, c) : 1.0f), sh = (b ? ld_f(b, bdt, c) : 0.0f) - mean * sc;
        if (vec)
            for (int64_t i = 4 * threadIdx.x; i < S; i += 4 * blockDim.x) {
                float4 v = ld_f4(x, xdt, xo + ch * xc + i);
                v.x = v.x * sc + sh, v.y = v.y * sc + sh, v.z = v.z * sc + sh, v.w = v.w * sc + sh;
                st_f4(y, ydt, yo + ch * yc + i, v);
            }
        else
            for (int64_t i = threadIdx.x; i < S; i += blockDim.x)
                st_f(y, ydt, yo + ch * yc + i, ld_f(x, xdt, xo + ch * xc + i) * sc + sh);
    }
}

static h3_status cuda_group_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, int groups, const h3_tensor *w,
                                 const h3_tensor *b, float eps) {
    H3_TRY(cuda_need_float(H3_OP_GROUP_NORM, "x", x));
    H3_TRY(cuda_need_float(H3_OP_GROUP_NORM, "y", y));
    H3_TRY(cuda_need_float(H3_OP_GROUP_NORM, "weight", w));
    H3_TRY(cuda_need_float(H3_OP_GROUP_NORM, "bias", b));
    int64_t B = x->shape[0];
    if (B * groups == 0) return H3_OK;
    /* four at a time: every row start a multiple of 4 elements from 16-byte aligned (8 for 16-bit) bases */
    const int64_t al = x->dtype == H3_F32 ? 16 : 8;
    const int vec = x->shape[2] % 4 == 0 && x->stride[0] % 4 == 0 && x->stride[1] % 4 == 0 &&
                    y->stride[0] % 4 == 0 && y->stride[1] % 4 == 0 && (uintptr_t)x->data % al == 0 &&
                    y->dtype == x->dtype && (uintptr_t)y->data % al == 0;
    k_gn<<<(unsigned)(B * groups), NT, 0, cuda_stream(ex)>>>(
        y->data, cuda_dt(y->dtype), x->data, cuda_dt(x->dtype), x->shape[1], x->shape[2], groups,
        x->stride[0], x->stride[1], y->stride[0], y->stride[1], w ? w->data : NULL, w ? cuda_dt(w->dtype) : 0,
        b ? b->data : NULL, b ? cuda_dt(b->dtype) : 0, eps, vec);
    CU_LAUNCHED("group_norm");
    return H3_OK;
}

/* ---- activations ------------------------------------------------------------------------------------------ */

__global__ void k_unary(rw_view y, rw_view x, int kind) {
    int64_t r = blockIdx.x;
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float v = ld_f(x.p, x.dt, r * x.ld + i), o;
        switch (kind) {
            case H3_UNARY_SILU: o = v / (1.0f + expf(-v)); break;
            case H3_UNARY_GELU: o = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;
            case H3_UNARY_GELU_TANH: o = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v))); break;
            case H3_UNARY_TANH: o = tanhf(v); break;
            case H3_UNARY_SIGMOID: o = 1.0f / (1.0f + expf(-v)); break;
            default: o = expf(v); break;
        }
        st_f(y.p, y.dt, r * y.ld + i, o);
    }
}

static h3_status cuda_unary(h3_exec *ex, h3_tensor *y, const h3_tensor *x, h3_unary kind) {
    H3_TRY(cuda_need_float(H3_OP_UNARY, "x", x));
    H3_TRY(cuda_need_float(H3_OP_UNARY, "y", y));
    rw_view X = rw_of(x), Y = rw_of(y);
    if (X.rows == 0) return H3_OK;
    k_unary<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(Y, X, (int)kind);
    CU_LAUNCHED("unary");
    return H3_OK;
}

__global__ void k_snake(rw_view y, rw_view x, const void *a, int adt, const void *b, int bdt, int logscale) {
    int64_t r = blockIdx.x;
    float al = ld_f(a, adt, r), be = b ? ld_f(b, bdt, r) : al;
    if (logscale) {
        al = expf(al);
        be = expf(be);
    }
    float inv = 1.0f / (be + 1e-9f);
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float v = ld_f(x.p, x.dt, r * x.ld + i), s = sinf(al * v);
        st_f(y.p, y.dt, r * y.ld + i, v + inv * s * s);
    }
}

static h3_status cuda_snake(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *alpha,
                            const h3_tensor *beta, unsigned flags) {
    H3_TRY(cuda_need_float(H3_OP_SNAKE, "x", x));
    H3_TRY(cuda_need_float(H3_OP_SNAKE, "y", y));
    H3_TRY(cuda_need_float(H3_OP_SNAKE, "alpha", alpha));
    H3_TRY(cuda_need_float(H3_OP_SNAKE, "beta", beta));
    rw_view X = rw_of(x), Y = rw_of(y);
    if (X.rows == 0) return H3_OK;
    k_snake<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(
        Y, X, alpha->data, cuda_dt(alpha->dtype), beta ? beta->data : NULL, beta ? cuda_dt(beta->dtype) : 0,
        (flags & H3_SNAKE_LOGSCALE) ? 1 : 0);
    CU_LAUNCHED("snake");
    return H3_OK;
}

__global__ void k_softmax(rw_view y, rw_view x) {
    int64_t r = blockIdx.x;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) m = fmaxf(m, ld_f(x.p, x.dt, r * x.ld + i));
    m = block_max(m);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) s += expf(ld_f(x.p, x.dt, r * x.ld + i) - m);
    float inv = 1.0f / block_sum(s);
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x)
        st_f(y.p, y.dt, r * y.ld + i, expf(ld_f(x.p, x.dt, r * x.ld + i) - m) * inv);
}

static h3_status cuda_softmax(h3_exec *ex, h3_tensor *y, const h3_tensor *x) {
    H3_TRY(cuda_need_float(H3_OP_SOFTMAX, "x", x));
    H3_TRY(cuda_need_float(H3_OP_SOFTMAX, "y", y));
    rw_view X = rw_of(x), Y = rw_of(y);
    if (X.rows == 0) return H3_OK;
    k_softmax<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(Y, X);
    CU_LAUNCHED("softmax");
    return H3_OK;
}

/* y = alpha·x + beta, clamped to [lo, hi] (clamp uses alpha 1, beta 0). */
__global__ void k_affine(rw_view y, rw_view x, float alpha, float beta, float lo, float hi) {
    int64_t r = blockIdx.x;
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float v = alpha * ld_f(x.p, x.dt, r * x.ld + i) + beta;
        st_f(y.p, y.dt, r * y.ld + i, fminf(fmaxf(v, lo), hi));
    }
}

static h3_status cuda_clamp(h3_exec *ex, h3_tensor *y, const h3_tensor *x, float lo, float hi) {
    H3_TRY(cuda_need_float(H3_OP_CLAMP, "x", x));
    H3_TRY(cuda_need_float(H3_OP_CLAMP, "y", y));
    rw_view X = rw_of(x), Y = rw_of(y);
    if (X.rows == 0) return H3_OK;
    k_affine<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(Y, X, 1.0f, 0.0f, lo, hi);
    CU_LAUNCHED("clamp");
    return H3_OK;
}

static h3_status cuda_scale(h3_exec *ex, h3_tensor *y, const h3_tensor *x, float alpha, float beta) {
    H3_TRY(cuda_need_float(H3_OP_SCALE, "x", x));
    H3_TRY(cuda_need_float(H3_OP_SCALE, "y", y));
    rw_view X = rw_of(x), Y = rw_of(y);
    if (X.rows == 0) return H3_OK;
    k_affine<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(Y, X, alpha, beta, -INFINITY, INFINITY);
    CU_LAUNCHED("scale");
    return H3_OK;
}

__global__ void k_fill(rw_view y, float v) {
    int64_t r = blockIdx.x;
    for (int64_t i = threadIdx.x; i < y.cols; i += blockDim.x) st_f(y.p, y.dt, r * y.ld + i, v);
}

static h3_status cuda_fill(h3_exec *ex, h3_tensor *y, float value) {
    H3_TRY(cuda_need_float(H3_OP_FILL, "y", y));
    rw_view Y = rw_of(y);
    if (Y.rows == 0) return H3_OK;
    k_fill<<<(unsigned)Y.rows, threads_for(Y.cols), 0, cuda_stream(ex)>>>(Y, value);
    CU_LAUNCHED("fill");
    return H3_OK;
}

static h3_status cuda_convert(h3_exec *ex, h3_tensor *y, const h3_tensor *x) {
    if (x->dtype == y->dtype) return h3_copy(ex, y, x);
    H3_TRY(cuda_need_float(H3_OP_CONVERT, "x", x));
    H3_TRY(cuda_need_float(H3_OP_CONVERT, "y", y));
    rw_view X = rw_of(x), Y = rw_of(y);
    if (X.rows == 0) return H3_OK;
    k_affine<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(Y, X, 1.0f, 0.0f, -INFINITY, INFINITY);
    CU_LAUNCHED("convert");
    return H3_OK;
}

__global__ void k_binary(rw_view y, rw_view a, rw_view b, int bmode, int kind) {
    int64_t r = blockIdx.x;
    for (int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) {
        float av = ld_f(a.p, a.dt, r * a.ld + i);
        float bv = bmode == 0 ? ld_f(b.p, b.dt, r * b.ld + i) : bmode == 1 ? ld_f(b.p, b.dt, i) : ld_f(b.p, b.dt, 0);
        float o = kind == H3_BINARY_ADD ? av + bv : kind == H3_BINARY_SUB ? av - bv : av * bv;
        st_f(y.p, y.dt, r * y.ld + i, o);
    }
}

static h3_status cuda_binary(h3_exec *ex, h3_tensor *y, const h3_tensor *a, const h3_tensor *b, h3_binary kind) {
    H3_TRY(cuda_need_float(H3_OP_BINARY, "a", a));
    H3_TRY(cuda_need_float(H3_OP_BINARY, "b", b));
    H3_TRY(cuda_need_float(H3_OP_BINARY, "y", y));
    rw_view A = rw_of(a), B = rw_of(b), Y = rw_of(y);
    int64_t nb = h3_tensor_numel(b);
    int bmode = (nb == h3_tensor_numel(a) && B.rows == A.rows) ? 0 : (nb == 1 ? 2 : 1);
    if (A.rows == 0) return H3_OK;
    k_binary<<<(unsigned)A.rows, threads_for(A.cols), 0, cuda_stream(ex)>>>(Y, A, B, bmode, (int)kind);
    CU_LAUNCHED("binary");
    return H3_OK;
}

__global__ void k_swiglu(rw_view y, rw_view x, int gate_first) {
    int64_t r = blockIdx.x, F = y.cols;
    for (int64_t i = threadIdx.x; i < F; i += blockDim.x) {
        float g = ld_f(x.p, x.dt, r * x.ld + (gate_first ? i : F + i));
        float v = ld_f(x.p, x.dt, r * x.ld + (gate_first ? F + i : i));
        st_f(y.p, y.dt, r * y.ld + i, g / (1.0f + expf(-g)) * v);
    }
}

/* k_swiglu four values a thread (rw_vec4 views): the DiT's FFN, where the scalar form moved 2 TB/s */
__global__ void k_swiglu4(rw_view y, rw_view x, int gate_first) {
    int64_t r = blockIdx.x, F = y.cols;
    for (int64_t i = threadIdx.x * 4; i < F; i += blockDim.x * 4) {
        const float4 g = ld_f4(x.p, x.dt, r * x.ld + (gate_first ? i : F + i));
        const float4 v = ld_f4(x.p, x.dt, r * x.ld + (gate_first ? F + i : i));
        st_f4(y.p, y.dt, r * y.ld + i,
              make_float4(g.x / (1.0f + expf(-g.x)) * v.x, g.y / (1.0f + expf(-g.y)) * v.y,
                          g.z / (1.0f + expf(-g.z)) * v.z, g.w / (1.0f + expf(-g.w)) * v.w));
    }
}

static h3_status cuda_swiglu(h3_exec *ex, h3_tensor *y, const h3_tensor *x, int gate_first) {
    H3_TRY(cuda_need_float(H3_OP_SWIGLU, "x", x));
    H3_TRY(cuda_need_float(H3_OP_SWIGLU, "y", y));
    rw_view X = rw_of(x), Y = rw_of(y);
    if (X.rows == 0) return H3_OK;
    if (rw_vec4(X) && rw_vec4(Y))
        k_swiglu4<<<(unsigned)X.rows, threads_for(Y.cols / 4), 0, cuda_stream(ex)>>>(Y, X, gate_first);
    else
        k_swiglu<<<(unsigned)X.rows, threads_for(Y.cols), 0, cuda_stream(ex)>>>(Y, X, gate_first);
    CU_LAUNCHED("swiglu");
    return H3_OK;
}

__global__ void k_modulate(rw_view y, rw_view x, rw_view sh, rw_view sc, const void *idx, int is64, int64_t T) {
    int64_t r = blockIdx.x;
    int64_t t = idx ? ld_idx(idx, is64, r) : 0;
    if (t < 0 || t >= T) return;
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float v = ld_f(x.p, x.dt, r * x.ld + i);
        v = v * (1.0f + ld_f(sc.p, sc.dt, t * sc.ld + i)) + ld_f(sh.p, sh.dt, t * sh.ld + i);
        st_f(y.p, y.dt, r * y.ld + i, v);
    }
}

static h3_status cuda_modulate(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *shift,
                               const h3_tensor *scale, const h3_tensor *idx) {
    H3_TRY(cuda_need_float(H3_OP_MODULATE, "x", x));
    H3_TRY(cuda_need_float(H3_OP_MODULATE, "y", y));
    H3_TRY(cuda_need_float(H3_OP_MODULATE, "shift", shift));
    H3_TRY(cuda_need_float(H3_OP_MODULATE, "scale", scale));
    H3_TRY(cuda_need_index(H3_OP_MODULATE, idx));
    rw_view X = rw_of(x), Y = rw_of(y), S0 = rw_of(shift), S1 = rw_of(scale);
    if (X.rows == 0) return H3_OK;
    k_modulate<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(
        Y, X, S0, S1, idx ? idx->data : NULL, idx ? idx->dtype == H3_I64 : 0, S0.rows);
    CU_LAUNCHED("modulate");
    return H3_OK;
}

__global__ void k_gated_add(rw_view x, rw_view h, rw_view g, const void *idx, int is64, int64_t T) {
    int64_t r = blockIdx.x;
    int64_t t = idx ? ld_idx(idx, is64, r) : 0;
    if (t < 0 || t >= T) return;
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float v = ld_f(x.p, x.dt, r * x.ld + i) + ld_f(g.p, g.dt, t * g.ld + i) * ld_f(h.p, h.dt, r * h.ld + i);
        st_f(x.p, x.dt, r * x.ld + i, v);
    }
}

/* k_gated_add four values a thread (rw_vec4 views) */
__global__ void k_gated_add4(rw_view x, rw_view h, rw_view g, const void *idx, int is64, int64_t T) {
    int64_t r = blockIdx.x;
    int64_t t = idx ? ld_idx(idx, is64, r) : 0;
    if (t < 0 || t >= T) return;
    for (int64_t i = threadIdx.x * 4; i < x.cols; i += blockDim.x * 4) {
        const float4 a = ld_f4(x.p, x.dt, r * x.ld + i), b = ld_f4(g.p, g.dt, t * g.ld + i),
                     c = ld_f4(h.p, h.dt, r * h.ld + i);
        st_f4(x.p, x.dt, r * x.ld + i,
              make_float4(a.x + b.x * c.x, a.y + b.y * c.y, a.z + b.z * c.z, a.w + b.w * c.w));
    }
}

static h3_status cuda_gated_add(h3_exec *ex, h3_tensor *x, const h3_tensor *h, const h3_tensor *gate,
                                const h3_tensor *idx) {
    H3_TRY(cuda_need_float(H3_OP_GATED_ADD, "x", x));
    H3_TRY(cuda_need_float(H3_OP_GATED_ADD, "h", h));
    H3_TRY(cuda_need_float(H3_OP_GATED_ADD, "gate", gate));
    H3_TRY(cuda_need_index(H3_OP_GATED_ADD, idx));
    rw_view X = rw_of(x), Hh = rw_of(h), G = rw_of(gate);
    if (X.rows == 0) return H3_OK;
    if (rw_vec4(X) && rw_vec4(Hh) && rw_vec4(G))
        k_gated_add4<<<(unsigned)X.rows, threads_for(X.cols / 4), 0, cuda_stream(ex)>>>(
            X, Hh, G, idx ? idx->data : NULL, idx ? idx->dtype == H3_I64 : 0, G.rows);
    else
        k_gated_add<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(
            X, Hh, G, idx ? idx->data : NULL, idx ? idx->dtype == H3_I64 : 0, G.rows);
    CU_LAUNCHED("gated_add");
    return H3_OK;
}

/* ---- rotary ------------------------------------------------------------------------------------------------ */

/* One thread per (head, rotated pair): reads both halves of its pair before writing them, so in place is safe. */
__global__ void k_rope(void *y, int ydt, int64_t ldy, const void *x, int xdt, int64_t ldx, const float *cs,
                       int64_t ldc, const float *sn, int64_t lds, int H, int D, int R, int copy_rest) {
    int64_t s = blockIdx.x;
    int half = R / 2;
    const float *c = cs + s * ldc, *n = sn + s * lds;
    for (int j = threadIdx.x; j < H * half; j += blockDim.x) {
        int h = j / half, i = j % half;
        int64_t xo = s * ldx + (int64_t)h * D, yo = s * ldy + (int64_t)h * D;
        float a = ld_f(x, xdt, xo + i), b = ld_f(x, xdt, xo + i + half);
        st_f(y, ydt, yo + i, a * c[i] - b * n[i]);
        st_f(y, ydt, yo + i + half, b * c[i + half] + a * n[i + half]);
    }
    if (copy_rest) {
        int rest = D - R;
        for (int j = threadIdx.x; j < H * rest; j += blockDim.x) {
            int h = j / rest, i = R + j % rest;
            st_f(y, ydt, s * ldy + (int64_t)h * D + i, ld_f(x, xdt, s * ldx + (int64_t)h * D + i));
        }
    }
}

static h3_status cuda_rope(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *cos,
                           const h3_tensor *sin) {
    H3_TRY(cuda_need_float(H3_OP_ROPE, "x", x));
    H3_TRY(cuda_need_float(H3_OP_ROPE, "y", y));
    int inplace = x->data == y->data;
    if (inplace && (x->stride[0] != y->stride[0] || x->dtype != y->dtype))
        return H3_ERR(H3_ERR_INVALID, "op 'rope' in place needs equal strides and dtypes");
    int64_t S = x->shape[0];
    int H = (int)x->shape[1], D = (int)x->shape[2], R = (int)cos->shape[1];
    if (S == 0) return H3_OK;
    int64_t ldc = cos->shape[1], lds = sin->shape[1];
    h3_tensor_is_rowwise(cos, &ldc);
    h3_tensor_is_rowwise(sin, &lds);
    k_rope<<<(unsigned)S, NT, 0, cuda_stream(ex)>>>(y->data, cuda_dt(y->dtype), y->stride[0], x->data,
                                                    cuda_dt(x->dtype), x->stride[0], (const float *)cos->data, ldc,
                                                    (const float *)sin->data, lds, H, D, R, !inplace && R < D);
    CU_LAUNCHED("rope");
    return H3_OK;
}

/* ---- rows ---------------------------------------------------------------------------------------------------- */

__global__ void k_move_rows(uint8_t *y, int64_t ldy_b, const uint8_t *x, int64_t ldx_b, int64_t row_b,
                            const void *idx, int is64, int64_t limit, int scatter, int wide) {
    int64_t i = blockIdx.x;
    int64_t j = ld_idx(idx, is64, i);
    if (j < 0 || j >= limit) return;
    int64_t src = scatter ? i : j, dst = scatter ? j : i;
    const uint8_t *s = x + src * ldx_b;
    uint8_t *d = y + dst * ldy_b;
    if (wide) {
        for (int64_t k = threadIdx.x; k < row_b / 16; k += blockDim.x) ((uint4 *)d)[k] = ((const uint4 *)s)[k];
    } else {
        for (int64_t k = threadIdx.x; k < row_b; k += blockDim.x) d[k] = s[k];
    }
}

static h3_status cuda_move_rows(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *idx, int scatter) {
    h3_op_id op = scatter ? H3_OP_SCATTER_ROWS : H3_OP_GATHER_ROWS;
    H3_TRY(cuda_need_index(op, idx));
    size_t es = h3_dtype_size(x->dtype);
    int64_t ldx = h3_tensor_cols(x), ldy = h3_tensor_cols(y);
    h3_tensor_is_rowwise(x, &ldx);
    h3_tensor_is_rowwise(y, &ldy);
    int64_t row_b = h3_tensor_cols(x) * (int64_t)es, n = h3_tensor_numel(idx);
    if (n == 0 || row_b == 0) return H3_OK;
    int wide = (row_b % 16 == 0) && ((ldx * (int64_t)es) % 16 == 0) && ((ldy * (int64_t)es) % 16 == 0) &&
               ((uintptr_t)x->data % 16 == 0) && ((uintptr_t)y->data % 16 == 0);
    k_move_rows<<<(unsigned)n, 128, 0, cuda_stream(ex)>>>((uint8_t *)y->data, ldy * (int64_t)es,
                                                         (const uint8_t *)x->data, ldx * (int64_t)es, row_b, idx->data,
                                                         idx->dtype == H3_I64, scatter ? h3_tensor_rows(y) : h3_tensor_rows(x),
                                                         scatter, wide);
    CU_LAUNCHED(scatter ? "scatter_rows" : "gather_rows");
    return H3_OK;
}

static h3_status cuda_gather_rows(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *idx) {
    return cuda_move_rows(ex, y, x, idx, 0);
}
static h3_status cuda_scatter_rows(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *idx) {
    return cuda_move_rows(ex, y, x, idx, 1);
}

/* ---- conv3d (direct) ------------------------------------------------------------------------------------------ */

typedef struct {
    int stride[3], pad0[3], mode[3];
} c3p;

__global__ void k_conv3d(void *y, int ydt, const void *x, int xdt, const void *w, int wdt, const void *b, int bdt,
                         int64_t cin, int64_t T, int64_t H, int64_t W, int64_t kt, int64_t kh, int64_t kw, int64_t To,
                         int64_t Ho, int64_t Wo, c3p p) {
    int64_t co = blockIdx.y;
    int64_t pos = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (pos >= To * Ho * Wo) return;
    int64_t wo = pos % Wo, ho = (pos / Wo) % Ho, to = pos / (Wo * Ho);
    float acc = b ? ld_f(b, bdt, co) : 0.0f;
    for (int64_t ci = 0; ci < cin; ci++)
        for (int64_t a = 0; a < kt; a++) {
            int64_t ti = cuda_pad_index(to * p.stride[0] + a - p.pad0[0], T, p.mode[0]);
            if (ti < 0) continue;
            for (int64_t c = 0; c < kh; c++) {
                int64_t hi = cuda_pad_index(ho * p.stride[1] + c - p.pad0[1], H, p.mode[1]);
                if (hi < 0) continue;
                for (int64_t d = 0; d < kw; d++) {
                    int64_t wi = cuda_pad_index(wo * p.stride[2] + d - p.pad0[2], W, p.mode[2]);
                    if (wi < 0) continue;
                    acc += ld_f(w, wdt, (((co * cin + ci) * kt + a) * kh + c) * kw + d) *
                           ld_f(x, xdt, ((ci * T + ti) * H + hi) * W + wi);
                }
            }
        }
    st_f(y, ydt, co * To * Ho * Wo + pos, acc);
}

/* im2col for the GEMM conv3d: col[p, k] (p < n positions from pos0, k < K = cin·kt·kh·kw in the weight's order)
 * = x at the position's tap, 0 where the padding gives no sample. One thread per (position, input channel) writes
 * that channel's kt·kh·kw taps: its output place found once (32-bit: a chunk's positions and a tile's samples are far
 * below 2³¹), the taps walked without a division, a warp's reads along consecutive positions. (One thread per value
 * with 64-bit index arithmetic spent most of the encoder's time dividing.) */
__global__ void k_im2col3d(float *col, const float *x, int pos0, int n, int K, int T, int H, int W, int kt, int kh,
                           int kw, int Ho, int Wo, c3p p) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, ci = blockIdx.y;
    if (i >= n) return;
    const int pos = pos0 + i, wo = pos % Wo, ho = (pos / Wo) % Ho, to = pos / (Wo * Ho);
    const float *xc = x + (int64_t)ci * T * H * W;
    float *dst = col + (int64_t)i * K + (int64_t)ci * kt * kh * kw;
    for (int a = 0; a < kt; a++) {
        const int ti = (int)cuda_pad_index(to * p.stride[0] + a - p.pad0[0], T, p.mode[0]);
        for (int c = 0; c < kh; c++) {
            const int hi = ti < 0 ? -1 : (int)cuda_pad_index(ho * p.stride[1] + c - p.pad0[1], H, p.mode[1]);
            for (int d = 0; d < kw; d++) {
                const int wi =
                    hi < 0 ? -1 : (int)cuda_pad_index(wo * p.stride[2] + d - p.pad0[2], W, p.mode[2]);
                *dst++ = wi < 0 ? 0.0f : xc[((int64_t)ti * H + hi) * W + wi];
            }
        }
    }
}

/* y[co, pos] += b[co] */
__global__ void k_row_bias(float *y, const float *b, int64_t npos) {
    const int64_t co = blockIdx.y, pos = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (pos < npos) y[co * npos + pos] += b[co];
}


/* f32 convolutions with a kernel of more than one tap (the video VAE encoder's): im2col into the quantized GEMMs'
 * scratch (H3_CUDA_QGEMM_SCRATCH_BYTES, which the planner counts for the encoder) in chunks of output positions,
 * each chunk one cuBLASLt GEMM y[:, chunk] = w[Cout, K] · col[chunk, K]ᵀ (on TF32 tensor cores, or exact f32:
 * h3_cuda_conv_math(H3_CONV_3D)); then the bias. */
static h3_status conv3d_gemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                             const c3p *q) {
    H3_TRY(h3_cuda_qgemm_reserve(ex));
    h3_cuda_state *s = cuda_state(ex);
    const int64_t cout = w->shape[0], kt = w->shape[2], kh = w->shape[3], kw = w->shape[4];
    const int64_t K = w->shape[1] * kt * kh * kw, npos = y->shape[1] * y->shape[2] * y->shape[3];
    int64_t chunk = (int64_t)s->qscratch_size / (K * (int64_t)sizeof(float));
    chunk = chunk / 64 * 64;
    if (chunk < 64) return H3_ERR(H3_ERR_UNSUPPORTED, "conv3d: %lld taps per output do not fit the scratch", (long long)K);
    /* the im2col kernel's 32-bit positions and samples, and a grid row per input channel */
    if (npos >= INT32_MAX || h3_tensor_numel(x) / w->shape[1] >= INT32_MAX || w->shape[1] > 65535)
        return H3_ERR(H3_ERR_UNSUPPORTED, "conv3d: %lld output positions or %lld input channels are too many for one call",
                      (long long)npos, (long long)w->shape[1]);
    float *col = (float *)s->qscratch;
    const float alpha = 1.0f, beta = 0.0f;
    for (int64_t p0 = 0; p0 < npos; p0 += chunk) {
        const int64_t n = npos - p0 < chunk ? npos - p0 : chunk;
        k_im2col3d<<<dim3((unsigned)((n + 127) / 128), (unsigned)w->shape[1]), 128, 0, cuda_stream(ex)>>>(
            col, (const float *)x->data, (int)p0, (int)n, (int)K, (int)x->shape[1], (int)x->shape[2],
            (int)x->shape[3], (int)kt, (int)kh, (int)kw, (int)y->shape[2], (int)y->shape[3], *q);
        CU_LAUNCHED("conv3d im2col");
        H3_TRY(cuda_lt_matmul(ex, CUDA_LT_FLOAT, h3_cuda_conv_math(H3_CONV_3D) == H3_CONV_TF32 ? CUDA_LT_TF32 : 0, cout, n, K, col, K, w->data, K,
                              (float *)y->data + p0, npos,
                              NULL, -1, &alpha, &beta));
    }
    if (b) {
        dim3 grid((unsigned)((npos + 255) / 256), (unsigned)cout);
        k_row_bias<<<grid, 256, 0, cuda_stream(ex)>>>((float *)y->data, (const float *)b->data, npos);
        CU_LAUNCHED("conv3d bias");
    }
    return H3_OK;
}

static h3_status cuda_conv3d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                             const h3_conv3d_params *p) {
    H3_TRY(cuda_need_float(H3_OP_CONV3D, "x", x));
    H3_TRY(cuda_need_float(H3_OP_CONV3D, "y", y));
    H3_TRY(cuda_need_float(H3_OP_CONV3D, "weight", w));
    H3_TRY(cuda_need_float(H3_OP_CONV3D, "bias", b));
    c3p q;
    for (int a = 0; a < 3; a++) {
        q.stride[a] = p->stride[a];
        q.pad0[a] = p->pad[a][0];
        q.mode[a] = (int)p->pad_mode[a];
    }
    int64_t npos = y->shape[1] * y->shape[2] * y->shape[3];
    if (npos == 0) return H3_OK;
    const int all_f32 = x->dtype == H3_F32 && y->dtype == H3_F32 && w->dtype == H3_F32 && (!b || b->dtype == H3_F32);
    const int gemm = all_f32 && h3_tensor_is_contiguous(x) && h3_tensor_is_contiguous(y) &&
                     h3_tensor_is_contiguous(w) && getenv("H3_CONV3D_DIRECT") == NULL;
    /* on TF32: the implicit GEMM (cuda_conv3d.cu) where the GPU and the shapes allow it */
    if (gemm && h3_cuda_conv_math(H3_CONV_3D) == H3_CONV_TF32) {
        int done = 0;
        H3_TRY(cuda_conv3d_igemm(ex, y, x, w, b, q.stride, q.pad0, q.mode, &done));
        if (done) return H3_OK;
    }
    if (gemm && w->shape[2] * w->shape[3] * w->shape[4] > 1) return conv3d_gemm(ex, y, x, w, b, &q);
    dim3 grid((unsigned)((npos + 127) / 128), (unsigned)y->shape[0]);
    k_conv3d<<<grid, 128, 0, cuda_stream(ex)>>>(y->data, cuda_dt(y->dtype), x->data, cuda_dt(x->dtype), w->data,
                                                cuda_dt(w->dtype), b ? b->data : NULL, b ? cuda_dt(b->dtype) : 0,
                                                x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[2],
                                                w->shape[3], w->shape[4], y->shape[1], y->shape[2], y->shape[3], q);
    CU_LAUNCHED("conv3d");
    return H3_OK;
}

__global__ void k_random(rw_view y, uint64_t seed, float lo, float hi) {
    int64_t r = blockIdx.x;
    for (int64_t i = threadIdx.x; i < y.cols; i += blockDim.x) {
        float u = h3_random_unit(seed, (uint64_t)(r * y.cols + i));
        st_f(y.p, y.dt, r * y.ld + i, __fadd_rn(lo, __fmul_rn(hi - lo, u)));
    }
}

static h3_status cuda_random_uniform(h3_exec *ex, h3_tensor *y, uint64_t seed, float lo, float hi) {
    H3_TRY(cuda_need_float(H3_OP_RANDOM, "y", y));
    rw_view Y = rw_of(y);
    for (int64_t r0 = 0; r0 < Y.rows; r0 += 1 << 30) { /* grid.x is 2^31 - 1 at most */
        rw_view part = Y;
        part.rows = Y.rows - r0 < (1 << 30) ? Y.rows - r0 : (1 << 30);
        part.p = (char *)Y.p + (size_t)(r0 * Y.ld) * h3_dtype_size(y->dtype);
        if (part.rows == 0) break;
        k_random<<<(unsigned)part.rows, threads_for(Y.cols), 0, cuda_stream(ex)>>>(part, seed + (uint64_t)(r0 * Y.cols) * 0x9e3779b97f4a7c15ULL, lo, hi);
        CU_LAUNCHED("random_uniform");
    }
    return H3_OK;
}

/* Fused AdaLN pre-norm: one block per row, the row read twice (statistics, then the output). */
__global__ void k_rms_mod(rw_view y, rw_view x, const void *w, int wdt, float eps, rw_view sh, rw_view sc,
                          const void *idx, int is64, int64_t T) {
    int64_t r = blockIdx.x;
    int64_t t = idx ? ld_idx(idx, is64, r) : 0;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float v = ld_f(x.p, x.dt, r * x.ld + i);
        ss += v * v;
    }
    ss = block_sum(ss);
    if (t < 0 || t >= T) return;
    float inv = rsqrtf(ss / (float)x.cols + eps);
    for (int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
        float v = ld_f(x.p, x.dt, r * x.ld + i) * inv;
        if (w) v *= ld_f(w, wdt, i);
        v = v * (1.0f + ld_f(sc.p, sc.dt, t * sc.ld + i)) + ld_f(sh.p, sh.dt, t * sh.ld + i);
        st_f(y.p, y.dt, r * y.ld + i, v);
    }
}

/* k_rms_mod four values a thread (rw_vec4 views, w aligned to 4 elements) */
__global__ void k_rms_mod4(rw_view y, rw_view x, const void *w, int wdt, float eps, rw_view sh, rw_view sc,
                           const void *idx, int is64, int64_t T) {
    int64_t r = blockIdx.x;
    int64_t t = idx ? ld_idx(idx, is64, r) : 0;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x * 4; i < x.cols; i += blockDim.x * 4) {
        const float4 v = ld_f4(x.p, x.dt, r * x.ld + i);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = block_sum(ss);
    if (t < 0 || t >= T) return;
    float inv = rsqrtf(ss / (float)x.cols + eps);
    for (int64_t i = threadIdx.x * 4; i < x.cols; i += blockDim.x * 4) {
        float4 v = ld_f4(x.p, x.dt, r * x.ld + i);
        const float4 wv = w ? ld_f4(w, wdt, i) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        const float4 a = ld_f4(sc.p, sc.dt, t * sc.ld + i), b = ld_f4(sh.p, sh.dt, t * sh.ld + i);
        v.x = v.x * inv * wv.x * (1.0f + a.x) + b.x;
        v.y = v.y * inv * wv.y * (1.0f + a.y) + b.y;
        v.z = v.z * inv * wv.z * (1.0f + a.z) + b.z;
        v.w = v.w * inv * wv.w * (1.0f + a.w) + b.w;
        st_f4(y.p, y.dt, r * y.ld + i, v);
    }
}

static h3_status cuda_rms_norm_modulate(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                                        float eps, const h3_tensor *shift, const h3_tensor *scale,
                                        const h3_tensor *idx) {
    H3_TRY(cuda_need_float(H3_OP_RMS_NORM_MODULATE, "x", x));
    H3_TRY(cuda_need_float(H3_OP_RMS_NORM_MODULATE, "y", y));
    H3_TRY(cuda_need_float(H3_OP_RMS_NORM_MODULATE, "weight", w));
    H3_TRY(cuda_need_float(H3_OP_RMS_NORM_MODULATE, "shift", shift));
    H3_TRY(cuda_need_float(H3_OP_RMS_NORM_MODULATE, "scale", scale));
    H3_TRY(cuda_need_index(H3_OP_RMS_NORM_MODULATE, idx));
    rw_view X = rw_of(x), Y = rw_of(y), S0 = rw_of(shift), S1 = rw_of(scale);
    if (X.rows == 0) return H3_OK;
    const int wes = w && cuda_dt(w->dtype) == 0 ? 4 : 2;
    if (rw_vec4(X) && rw_vec4(Y) && rw_vec4(S0) && rw_vec4(S1) && (!w || (uintptr_t)w->data % (4 * wes) == 0))
        k_rms_mod4<<<(unsigned)X.rows, threads_for(X.cols / 4), 0, cuda_stream(ex)>>>(
            Y, X, w ? w->data : NULL, w ? cuda_dt(w->dtype) : 0, eps, S0, S1, idx ? idx->data : NULL,
            idx ? idx->dtype == H3_I64 : 0, S0.rows);
    else
        k_rms_mod<<<(unsigned)X.rows, threads_for(X.cols), 0, cuda_stream(ex)>>>(
            Y, X, w ? w->data : NULL, w ? cuda_dt(w->dtype) : 0, eps, S0, S1, idx ? idx->data : NULL,
            idx ? idx->dtype == H3_I64 : 0, S0.rows);
    CU_LAUNCHED("rms_norm_modulate");
    return H3_OK;
}

/* QK-norm + RoPE: one warp per (row, head); the head's normalized values go through shared memory so each lane
 * can read its rotation partner. D <= 256. */
__global__ void k_qk_norm_rope(void *x, int xdt, int64_t ldx, int H, int D, const void *w, int wdt, float eps,
                               const float *cs, int64_t ldc, const float *sn, int64_t lds, int R, int64_t n) {
    __shared__ float buf[4][256];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t j = (int64_t)blockIdx.x * 4 + warp;
    if (j >= n) return;
    int64_t s = j / H, h = j % H;
    int64_t base = s * ldx + h * D;
    float ss = 0.0f;
    for (int i = lane; i < D; i += 32) {
        float v = ld_f(x, xdt, base + i);
        buf[warp][i] = v;
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float inv = rsqrtf(ss / (float)D + eps);
    for (int i = lane; i < D; i += 32) buf[warp][i] *= inv * ld_f(w, wdt, i);
    __syncwarp();
    int half = R / 2;
    const float *c = cs + s * ldc, *sv = sn + s * lds;
    for (int i = lane; i < D; i += 32) {
        float v = buf[warp][i], o;
        if (i < half) o = v * c[i] - buf[warp][i + half] * sv[i];
        else if (i < R) o = v * c[i] + buf[warp][i - half] * sv[i];
        else o = v;
        st_f(x, xdt, base + i, o);
    }
}

/* k_qk_norm_rope four values a lane (D and the row stride multiples of 4, R of 8, every array aligned to 4
 * elements): at 128-wide heads one pass of 16- or 8-byte accesses instead of four of scalar ones. HPW heads a
 * warp: 2 for heads of 64 or fewer (the video VAE decoder's), so that every lane has four values (16 lanes a
 * head). */
template <int HPW>
__global__ void k_qk_norm_rope4(void *x, int xdt, int64_t ldx, int H, int D, const void *w, int wdt,
                                float eps, const float *cs, int64_t ldc, const float *sn, int64_t lds, int R,
                                int64_t n) {
    constexpr int G = 32 / HPW; /* lanes a head */
    __shared__ __align__(16) float buf[4][256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gl = lane % G, grp = lane / G;
    const int64_t j = ((int64_t)blockIdx.x * 4 + warp) * HPW + grp;
    const bool ok = j < n; /* a head past the last still takes part in its warp's shuffles */
    if (HPW == 1 && !ok) return;
    const int64_t s = ok ? j / H : 0, h = ok ? j % H : 0;
    const int64_t base = s * ldx + h * D;
    float *b = buf[warp] + grp * (256 / HPW);
    float ss = 0.0f;
    for (int i = gl * 4; ok && i < D; i += 4 * G) {
        const float4 v = ld_f4(x, xdt, base + i);
        *(float4 *)(b + i) = v;
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (int o = G / 2; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o); /* within the head's lanes */
    const float inv = rsqrtf(ss / (float)D + eps);
    for (int i = gl * 4; ok && i < D; i += 4 * G) {
        const float4 g = ld_f4(w, wdt, i);
        float4 v = *(float4 *)(b + i);
        v.x *= inv * g.x;
        v.y *= inv * g.y;
        v.z *= inv * g.z;
        v.w *= inv * g.w;
        *(float4 *)(b + i) = v;
    }
    __syncwarp();
    if (!ok) return;
    const int half = R / 2;
    const float *c = cs + s * ldc, *sv = sn + s * lds;
    for (int i = gl * 4; i < D; i += 4 * G) {
        const float4 v = *(const float4 *)(b + i);
        float4 o = v;
        if (i < R) { /* half is a multiple of 4: the group lies wholly in one half */
            const float4 p = *(const float4 *)(b + (i < half ? i + half : i - half));
            const float4 cc = *(const float4 *)(c + i), sc = *(const float4 *)(sv + i);
            const float sg = i < half ? -1.0f : 1.0f;
            o = make_float4(v.x * cc.x + sg * p.x * sc.x, v.y * cc.y + sg * p.y * sc.y,
                            v.z * cc.z + sg * p.z * sc.z, v.w * cc.w + sg * p.w * sc.w);
        }
        st_f4(x, xdt, base + i, o);
    }
}

static h3_status cuda_qk_norm_rope(h3_exec *ex, h3_tensor *x, const h3_tensor *w, float eps, const h3_tensor *cos,
                                   const h3_tensor *sin) {
    H3_TRY(cuda_need_float(H3_OP_QK_NORM_ROPE, "x", x));
    H3_TRY(cuda_need_float(H3_OP_QK_NORM_ROPE, "weight", w));
    int64_t S = x->shape[0], H = x->shape[1], D = x->shape[2];
    if (D > 256) return H3_ERR(H3_ERR_UNSUPPORTED, "op 'qk_norm_rope' on the device supports head sizes up to 256");
    int64_t n = S * H;
    if (n == 0) return H3_OK;
    int64_t ldc = cos->shape[1], lds = sin->shape[1];
    h3_tensor_is_rowwise(cos, &ldc);
    h3_tensor_is_rowwise(sin, &lds);
    const int R = (int)cos->shape[1], xes = cuda_dt(x->dtype) == 0 ? 4 : 2, wes = cuda_dt(w->dtype) == 0 ? 4 : 2;
    const int vec = D % 4 == 0 && R % 8 == 0 && x->stride[0] % 4 == 0 && ldc % 4 == 0 && lds % 4 == 0 &&
                    (uintptr_t)x->data % (uintptr_t)(4 * xes) == 0 &&
                    (uintptr_t)w->data % (uintptr_t)(4 * wes) == 0 && (uintptr_t)cos->data % 16 == 0 &&
                    (uintptr_t)sin->data % 16 == 0;
    if (vec && D <= 64)
        k_qk_norm_rope4<2><<<(unsigned)((n + 7) / 8), 128, 0, cuda_stream(ex)>>>(
            x->data, cuda_dt(x->dtype), x->stride[0], (int)H, (int)D, w->data, cuda_dt(w->dtype), eps,
            (const float *)cos->data, ldc, (const float *)sin->data, lds, R, n);
    else if (vec)
        k_qk_norm_rope4<1><<<(unsigned)((n + 3) / 4), 128, 0, cuda_stream(ex)>>>(
            x->data, cuda_dt(x->dtype), x->stride[0], (int)H, (int)D, w->data, cuda_dt(w->dtype), eps,
            (const float *)cos->data, ldc, (const float *)sin->data, lds, R, n);
    else
        k_qk_norm_rope<<<(unsigned)((n + 3) / 4), 128, 0, cuda_stream(ex)>>>(
            x->data, cuda_dt(x->dtype), x->stride[0], (int)H, (int)D, w->data, cuda_dt(w->dtype), eps,
            (const float *)cos->data, ldc, (const float *)sin->data, lds, R, n);
    CU_LAUNCHED("qk_norm_rope");
    return H3_OK;
}

/* ---- the table ------------------------------------------------------------------------------------------------ */

h3_status cuda_copy_entry(h3_exec *ex, h3_tensor *dst, const h3_tensor *src);
h3_status cuda_sync_entry(h3_exec *ex);

static h3_backend g_table;

extern "C" const h3_backend *h3_cuda_backend_table(void) {
    h3_backend *t = &g_table;
    t->name = CUDA_NAME;
    t->gemm = cuda_gemm;
    t->rms_norm = cuda_rms_norm;
    t->layer_norm = cuda_layer_norm;
    t->group_norm = cuda_group_norm;
    t->unary = cuda_unary;
    t->snake = cuda_snake;
    t->softmax = cuda_softmax;
    t->clamp = cuda_clamp;
    t->rope = cuda_rope;
    t->attention = cuda_attention;
    t->attention_sparse = cuda_attention_sparse;
    t->conv3d = cuda_conv3d;
    t->gather_rows = cuda_gather_rows;
    t->scatter_rows = cuda_scatter_rows;
    t->binary = cuda_binary;
    t->scale = cuda_scale;
    t->swiglu = cuda_swiglu;
    t->modulate = cuda_modulate;
    t->gated_add = cuda_gated_add;
    t->convert = cuda_convert;
    t->fill = cuda_fill;
    t->random_uniform = cuda_random_uniform;
    t->rms_norm_modulate = cuda_rms_norm_modulate;
    t->qk_norm_rope = cuda_qk_norm_rope;
    cuda_conv_table(t); /* conv1d, conv_transpose1d, snake_aa: cuda_conv.cu */
    t->copy = cuda_copy_entry;
    t->sync = cuda_sync_entry;
    return t;
}

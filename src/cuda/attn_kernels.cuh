/* Attention kernels (included by src/cuda/cuda_attn.cu and by the scratch benchmark dev/cuda/attention_forward.cu).
 *
 * attn_fa2<D, STAGES, WARPS>: flash-attention forward in bf16 with fp32 accumulation, sm_80+.
 *   One block = WARPS warps = 16·WARPS query rows of one head; each warp owns 16 rows. Key/value tiles of 64 rows stream
 *   through shared memory (cp.async, STAGES = 2 double-buffers them); S = Q·Kᵀ and O += P·V run on mma.sync
 *   m16n8k16 with operands loaded by ldmatrix from XOR-swizzled shared memory (16-byte chunk c of row r lives at
 *   c ^ (r % 8), so the 8 rows an ldmatrix reads hit 8 different bank groups). Softmax is online in registers, in
 *   base 2 with the scale folded in. Memory is O(tile), whatever the sequence length.
 * attn_naive: f32 (or any float dtype) reference-grade kernel for activations other than bf16 and for GPUs
 *   without bf16 tensor cores: one block per (query row, head), scores in shared memory chunk by chunk.
 */
#ifndef H3_ATTN_KERNELS_CUH
#define H3_ATTN_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "tensor/ops.h" /* H3_ATTN_FP8_CODE_SHIFT */
}

typedef struct {
    const void *q, *k, *v;
    void *o;
    int64_t ldq, ldk, ldv, ldo; /* row strides in elements */
    int Sq, Sk, Hq, Hk;
    float scale_log2; /* scale · log2(e) */
    int causal;
    int dt; /* naive kernel: 0 f32, 1 bf16, 2 f16 */
    /* fp8 (H3_ATTN_FP8): q, k int8 [S, H·128] (ldq, ldk in bytes; k less its mean), v transposed e4m3 [Hk·128,
     * ldv] (its keys in the order of attn_fp8_key), with the dequantization scales qs [Hq][⌈Sq/128⌉],
     * ks [Hk][⌈Sk/128⌉], vs [Hk·128] */
    const float *qs, *ks, *vs;
} attn_args;

#define FA_BK 64

/* fp8 attention: the key stored at column c of a 32-key slice of the transposed V (attn_fp8.cuh says why; the
 * same order in each half of 16). */
__host__ __device__ static inline int attn_fp8_key(int c) {
    const int h = c & 16, i = c & 15;
    return h + 8 * ((i & 3) >> 1) + 2 * (i >> 2) + (i & 1);
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                                  const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma_bf16(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* The e4m3 code of fp8 attention's probability p = 2^x (tensor/ops.h "H3_ATTN_FP8"), x ≤ 8, given as
 * x = 32·(v·a + k) − 7 − H3_ATTN_FP8_CODE_SHIFT / 8, in the low byte of the result: round(8x + 56 +
 * H3_ATTN_FP8_CODE_SHIFT), 0 below. Two FFMAs on the FMA pipe: the first saturates t = code / 256 into [0, 1]
 * (the clamp; a masked key's −∞ lands on 0), the second rounds 256·t to an integer in the low bits (256·t +
 * 1.5·2²³). In place of an ex2 and half an e4m3 conversion on the special-function unit, with which Hopper's
 * kernel ran 12-15% slower (bench/NOTES.md). */
__device__ __forceinline__ uint32_t fp8_p_code(float v, float a, float k) {
    float t;
    asm("fma.rn.sat.f32 %0, %1, %2, %3;\n" : "=f"(t) : "f"(v), "f"(a), "f"(k));
    return __float_as_uint(fmaf(t, 256.0f, 12582912.0f));
}

/* The low bytes of four fp8_p_code results in one word, a's in the low byte. */
__device__ __forceinline__ uint32_t pack_codes4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

/* Max and sum over the 4 threads that hold one row of an m16n8 accumulator (lanes 4g..4g+3). */
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* Address of the 16-byte chunk `c` of row `r` in a swizzled [rows][D] bf16 tile. */
template <int D> __device__ __forceinline__ __nv_bfloat16 *swz(__nv_bfloat16 *tile, int r, int c) {
    return tile + r * D + ((c ^ (r & 7)) << 3);
}

/* Loads rows [row0, row0+nrows) of a [S, ld] bf16 matrix (columns col0..col0+D) into a swizzled tile; rows past
 * `limit` are zero-filled. */
template <int D, int ROWS>
__device__ __forceinline__ void load_tile(__nv_bfloat16 *tile, const __nv_bfloat16 *g, int64_t ld, int row0, int limit,
                                          int nthreads, int tid) {
    constexpr int CH = D / 8; /* 16-byte chunks per row */
    for (int i = tid; i < ROWS * CH; i += nthreads) {
        int r = i / CH, c = i % CH;
        int row = row0 + r;
        int ok = row < limit;
        const __nv_bfloat16 *src = g + (int64_t)(ok ? row : 0) * ld + c * 8;
        cp_async16(swz<D>(tile, r, c), src, ok ? 16 : 0);
    }
}

template <int D, int STAGES, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) attn_fa2(attn_args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap(); /* bf16 tensor cores need sm_80+: the launcher never picks this kernel on older GPUs */
#else
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)smem_raw;
    constexpr int BQ = WARPS * 16, NT = WARPS * 32;
    __nv_bfloat16 *sK = sQ + BQ * D;
    __nv_bfloat16 *sV = sK + STAGES * FA_BK * D;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.y, hk = h / (a.Hq / a.Hk);
    const int q0 = blockIdx.x * BQ;
    const __nv_bfloat16 *Q = (const __nv_bfloat16 *)a.q + (int64_t)h * D;
    const __nv_bfloat16 *K = (const __nv_bfloat16 *)a.k + (int64_t)hk * D;
    const __nv_bfloat16 *V = (const __nv_bfloat16 *)a.v + (int64_t)hk * D;
    const int shift = a.Sk - a.Sq;
    int kend = a.Sk;
    if (a.causal) {
        kend = q0 + BQ + shift;
        if (kend > a.Sk) kend = a.Sk;
        if (kend < 0) kend = 0;
    }
    const int nkb = (kend + FA_BK - 1) / FA_BK;

    load_tile<D, BQ>(sQ, Q + (int64_t)q0 * a.ldq, a.ldq, 0, a.Sq - q0, NT, tid);
    if (nkb > 0) {
        load_tile<D, FA_BK>(sK, K, a.ldk, 0, a.Sk, NT, tid);
        load_tile<D, FA_BK>(sV, V, a.ldv, 0, a.Sk, NT, tid);
    }
    cp_async_commit();

    /* per thread: rows g and g+8 of the warp's 16 rows */
    const int g = lane >> 2, t4 = lane & 3;
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    uint32_t qf[D / 16][4];

    for (int kb = 0; kb < nkb; kb++) {
        const int buf = STAGES == 2 ? (kb & 1) : 0;
        if (STAGES == 2) {
            if (kb + 1 < nkb) {
                load_tile<D, FA_BK>(sK + (buf ^ 1) * FA_BK * D, K, a.ldk, (kb + 1) * FA_BK, a.Sk, NT, tid);
                load_tile<D, FA_BK>(sV + (buf ^ 1) * FA_BK * D, V, a.ldv, (kb + 1) * FA_BK, a.Sk, NT, tid);
            }
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            if (kb > 0) { /* the previous iteration's closing barrier freed the single buffer */
                load_tile<D, FA_BK>(sK, K, a.ldk, kb * FA_BK, a.Sk, NT, tid);
                load_tile<D, FA_BK>(sV, V, a.ldv, kb * FA_BK, a.Sk, NT, tid);
                cp_async_commit();
            }
            cp_async_wait<0>();
        }
        __syncthreads();
        if (kb == 0) {
            /* Q fragments for this warp's 16 rows, all of D */
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                int r = warp * 16 + (lane & 15), c = kk * 2 + (lane >> 4);
                ldmatrix_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], swz<D>(sQ, r, c));
            }
        }
        __nv_bfloat16 *tK = sK + buf * FA_BK * D, *tV = sV + buf * FA_BK * D;
        /* S = Q Kᵀ: 16 x 64 per warp, 8 n-tiles of 8 keys */
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int jj = 0; jj < 4; jj++) { /* two n-tiles (16 keys) per ldmatrix.x4 */
                uint32_t b0, b1, b2, b3;
                int r = jj * 16 + (lane & 7) + ((lane >> 4) << 3), c = kk * 2 + ((lane >> 3) & 1);
                ldmatrix_x4(b0, b1, b2, b3, swz<D>(tK, r, c));
                mma_bf16(s[2 * jj], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b0, b1);
                mma_bf16(s[2 * jj + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b2, b3);
            }
        }
        /* mask keys past the end (and the causal future), scale, online softmax */
        const int kbase = kb * FA_BK;
        const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int key = kbase + j * 8 + t4 * 2 + e;
                bool bad0 = key >= a.Sk || (a.causal && key > row0 + shift);
                bool bad1 = key >= a.Sk || (a.causal && key > row1 + shift);
                s[j][e] = bad0 ? -INFINITY : s[j][e] * a.scale_log2;
                s[j][2 + e] = bad1 ? -INFINITY : s[j][2 + e] * a.scale_log2;
                mx0 = fmaxf(mx0, s[j][e]);
                mx1 = fmaxf(mx1, s[j][2 + e]);
            }
        }
        mx0 = quad_max(mx0);
        mx1 = quad_max(mx1);
        float c0 = mx0 == -INFINITY ? 1.0f : exp2f(m0 - mx0), c1 = mx1 == -INFINITY ? 1.0f : exp2f(m1 - mx1);
        float base0 = mx0 == -INFINITY ? 0.0f : mx0, base1 = mx1 == -INFINITY ? 0.0f : mx1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[j][0] = exp2f(s[j][0] - base0);
            s[j][1] = exp2f(s[j][1] - base0);
            s[j][2] = exp2f(s[j][2] - base1);
            s[j][3] = exp2f(s[j][3] - base1);
            sum0 += s[j][0] + s[j][1];
            sum1 += s[j][2] + s[j][3];
        }
        l0 = l0 * c0 + sum0; /* per-thread partial row sums; reduced across the 4 threads at the end */
        l1 = l1 * c1 + sum1;
        m0 = mx0;
        m1 = mx1;
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            o[i][0] *= c0;
            o[i][1] *= c0;
            o[i][2] *= c1;
            o[i][3] *= c1;
        }
        /* O += P V: P from the S accumulators (two n-tiles form one k16 A fragment) */
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
            uint32_t a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
            uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            uint32_t a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dd = 0; dd < D / 16; dd++) { /* two d-tiles per ldmatrix.x4.trans */
                uint32_t b0, b1, b2, b3;
                int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), c = dd * 2 + (lane >> 4);
                ldmatrix_x4_trans(b0, b1, b2, b3, swz<D>(tV, r, c));
                mma_bf16(o[2 * dd], a0, a1, a2, a3, b0, b1);
                mma_bf16(o[2 * dd + 1], a0, a1, a2, a3, b2, b3);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;
    __nv_bfloat16 *O = (__nv_bfloat16 *)a.o + (int64_t)h * D;
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
        int col = i * 8 + t4 * 2;
        if (row0 < a.Sq)
            *(__nv_bfloat162 *)(O + (int64_t)row0 * a.ldo + col) = __floats2bfloat162_rn(o[i][0] * inv0, o[i][1] * inv0);
        if (row1 < a.Sq)
            *(__nv_bfloat162 *)(O + (int64_t)row1 * a.ldo + col) = __floats2bfloat162_rn(o[i][2] * inv1, o[i][3] * inv1);
    }
#endif
}

/* ---- the plain kernel ------------------------------------------------------------------------------------- */

__device__ __forceinline__ float attn_ld(const void *p, int dt, int64_t i) {
    if (dt == 1) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == 2) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}
__device__ __forceinline__ void attn_st(void *p, int dt, int64_t i, float v) {
    if (dt == 1) ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
    else if (dt == 2) ((__half *)p)[i] = __float2half(v);
    else ((float *)p)[i] = v;
}

/* One block (128 threads) per (query row, head). D <= 256. Scores for 128 keys at a time in shared memory. */
static __global__ void attn_naive(attn_args a, int D) {
    __shared__ float sq[256], sp[128], red[32];
    __shared__ float acc[256];
    const int qi = blockIdx.x, h = blockIdx.y, hk = h / (a.Hq / a.Hk), tid = threadIdx.x;
    const int64_t qo = (int64_t)qi * a.ldq + (int64_t)h * D;
    for (int d = tid; d < D; d += blockDim.x) {
        sq[d] = attn_ld(a.q, a.dt, qo + d);
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int kend = a.causal ? qi + (a.Sk - a.Sq) + 1 : a.Sk;
    if (kend > a.Sk) kend = a.Sk;
    __syncthreads();
    for (int k0 = 0; k0 < kend; k0 += 128) {
        int key = k0 + tid;
        float sc = -INFINITY;
        if (key < kend) {
            float dot = 0.0f;
            const int64_t ko = (int64_t)key * a.ldk + (int64_t)hk * D;
            for (int d = 0; d < D; d++) dot += sq[d] * attn_ld(a.k, a.dt, ko + d);
            sc = dot * a.scale_log2;
        }
        /* block max */
        float v = sc;
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if ((tid & 31) == 0) red[tid >> 5] = v;
        __syncthreads();
        float bm = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
        __syncthreads();
        float mn = fmaxf(m, bm);
        float p = sc == -INFINITY ? 0.0f : exp2f(sc - mn);
        sp[tid] = p;
        float ps = p;
        for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        if ((tid & 31) == 0) red[tid >> 5] = ps;
        __syncthreads();
        float corr = m == -INFINITY ? 0.0f : exp2f(m - mn);
        l = l * corr + red[0] + red[1] + red[2] + red[3];
        m = mn;
        int nk = kend - k0 < 128 ? kend - k0 : 128;
        for (int d = tid; d < D; d += blockDim.x) {
            float s = acc[d] * corr;
            for (int j = 0; j < nk; j++) s += sp[j] * attn_ld(a.v, a.dt, (int64_t)(k0 + j) * a.ldv + (int64_t)hk * D + d);
            acc[d] = s;
        }
        __syncthreads();
    }
    const int64_t oo = (int64_t)qi * a.ldo + (int64_t)h * D;
    for (int d = tid; d < D; d += blockDim.x) attn_st(a.o, a.dt, oo + d, l > 0.0f ? acc[d] / l : 0.0f);
}

#endif

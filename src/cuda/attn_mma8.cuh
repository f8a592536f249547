/* Low-bit attention on mma.sync (included by src/cuda/cuda_attn.cu): the kernels for GPUs without Hopper's wgmma.
 *
 * attn_mma8<MODE, STAGES>: flash attention, head size 128, 4 warps = 64 query rows of one head a block, each warp
 * 16 rows; the bf16 flash kernel's shape (attn_kernels.cuh: cp.async tiles, XOR-swizzled shared memory, ldmatrix,
 * the online softmax in registers) with S = Q·Kᵀ in int8 on m16n8k32 (exact integer sums) in both modes: q and k
 * int8 with one scale per head and block of rows, k less its mean over the keys first (SageAttention's smoothing:
 * q·mean is the same for every key of a row, so the softmax does not see it, and k's outlier channels no longer
 * eat the int8 range). Then P·V:
 *   MMA8_FP8 (H3_ATTN_FP8, sm_89+: Ada, Blackwell, and Hopper when its wgmma kernel is absent; SageAttention 2's
 *     recipe): q, k and v as the fp8 passes in cuda_attn.cu quantize them for Hopper's kernel (q, k per 128 rows,
 *     v e4m3 transposed per head and channel, each 32-key slice in attn_fp8_key's order), K/V tiles of 128 keys
 *     (the scales' block, and the CPU reference's softmax block). P·V in e4m3: p = exp2(s − max + 8) as its
 *     e4m3 code (fp8_p_code) straight from the S accumulators, which already hold the keys in the order
 *     attn_fp8_key stored V's (m16n8k32's A fragment takes keys t4·4 + e of a 32-key slice: those are
 *     8·(e/2) + 2·t4 + e%2 of the accumulators, the same map as wgmma's).
 *   MMA8_INT8 (H3_ATTN_INT8, sm_75+: Turing, Ampere, Ada; SageAttention's first recipe): q and k per 64 rows; v in
 *     f16 scaled per head and channel, P in f16, P·V on m16n8k16 f16 with f32 accumulation. K/V tiles of 64 keys.
 * Turing (sm_75) has neither cp.async nor the k32 integer and k16 half MMA shapes: tiles are copied synchronously
 * there and each MMA is issued as the sm_75 shapes it is made of (m8n8k16 s8, m16n8k8 f16). The fp8 mode traps on
 * GPUs before sm_89; the chooser (h3_cuda_attn_choose) never sends it there.
 * The operands' layout and scales arrive in attn_args (attn_kernels.cuh): q, k 8-bit [S, H·128] (ldq, ldk in bytes);
 * v e4m3 [Hk·128, ldv] (fp8) or f16 [Sk, ldv] (int8, ldv in elements); qs [Hq][⌈Sq/QB⌉], ks [Hk][⌈Sk/BK⌉], vs
 * [Hk·128], multiplied into o at the end. */
#ifndef H3_ATTN_MMA8_CUH
#define H3_ATTN_MMA8_CUH

#include <cuda_fp16.h>

#include "cuda/attn_kernels.cuh"

enum { MMA8_FP8 = 0, MMA8_INT8 = 1 };
#define MMA8_WARPS 4
#define MMA8_BQ (MMA8_WARPS * 16)

/* Rows of the K/V tiles and of the query block a q scale covers, per mode. */
template <int MODE> struct mma8_cfg {
    static constexpr int BK = MODE == MMA8_FP8 ? 128 : 64;
    static constexpr int QB = MODE == MMA8_FP8 ? 128 : 64;
    static constexpr int V_BYTES = MODE == MMA8_FP8 ? 128 * 128 : 64 * 128 * 2; /* one stage's V tile */
    static constexpr int K_BYTES = BK * 128;
};

/* Shared memory of one block: the Q tile and STAGES K and V tiles (h3_cuda_mma8_smem restates it for the chooser). */
template <int MODE> __host__ __device__ constexpr int mma8_smem(int stages) {
    return MMA8_BQ * 128 + stages * (mma8_cfg<MODE>::K_BYTES + mma8_cfg<MODE>::V_BYTES);
}

/* A 16-byte copy global -> shared, zero-filled when bytes is 0: cp.async on sm_80+, a plain copy on Turing. */
__device__ __forceinline__ void mma8_cp16(void *smem, const void *gmem, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    *(uint4 *)smem = bytes ? *(const uint4 *)gmem : make_uint4(0, 0, 0, 0);
#else
    cp_async16(smem, gmem, bytes);
#endif
}
__device__ __forceinline__ void mma8_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    cp_async_commit();
#endif
}
template <int N> __device__ __forceinline__ void mma8_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    cp_async_wait<N>();
#endif
}

/* Byte tile [rows][CH·16] with 16-byte chunk c of row r at c ^ (r % 8) (CH >= 8). */
template <int CH> __device__ __forceinline__ unsigned char *mma8_swz(unsigned char *tile, int r, int c) {
    return tile + r * (CH * 16) + ((c ^ (r & 7)) << 4);
}

/* Rows [row0, row0 + ROWS) of a matrix of ld bytes a row, CH chunks of 16 bytes from g, into a swizzled tile;
 * rows at or past limit zero. */
template <int ROWS, int CH>
__device__ __forceinline__ void mma8_load(unsigned char *tile, const unsigned char *g, int64_t ld, int row0,
                                          int limit, int tid) {
    for (int i = tid; i < ROWS * CH; i += MMA8_WARPS * 32) {
        const int r = i / CH, c = i % CH, row = row0 + r, ok = row < limit;
        mma8_cp16(mma8_swz<CH>(tile, r, c), g + (int64_t)(ok ? row : 0) * ld + c * 16, ok ? 16 : 0);
    }
}

/* c[2] (s32) += A[8x16] · B[16x8] in int8: Turing's integer MMA. */
__device__ __forceinline__ void mma8_s8_m8n8k16(int *c, uint32_t a, uint32_t b) {
    asm volatile("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+r"(c[0]), "+r"(c[1])
                 : "r"(a), "r"(b));
}

/* c[4] (s32) += A[16x32] · B[32x8] in int8 (m16n8k32's fragments). */
__device__ __forceinline__ void mma8_s8(int *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    /* rows 0-7 (c0, c1) and 8-15 (c2, c3) by k halves: a0/a1 take k 0-15 (b0), a2/a3 k 16-31 (b1) */
    mma8_s8_m8n8k16(c, a[0], b0);
    mma8_s8_m8n8k16(c, a[2], b1);
    mma8_s8_m8n8k16(c + 2, a[1], b0);
    mma8_s8_m8n8k16(c + 2, a[3], b1);
#else
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* c[4] (f32) += A[16x32] · B[32x8] in e4m3 (sm_89+). */
__device__ __forceinline__ void mma8_e4m3(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)c, (void)a, (void)b0, (void)b1;
#endif
}

/* c[4] (f32) += A[16x16] · B[16x8] in f16 (m16n8k16's fragments; two m16n8k8 on Turing). */
__device__ __forceinline__ void mma8_f16(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a2), "r"(a3), "r"(b1));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

template <int MODE, int STAGES> __global__ void __launch_bounds__(MMA8_WARPS * 32) attn_mma8(attn_args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
    if (MODE == MMA8_FP8) {
        __trap(); /* e4m3 MMA needs sm_89+: the chooser never picks this kernel on older GPUs */
        return;
    }
#endif
    typedef mma8_cfg<MODE> C;
    constexpr int BK = C::BK, NT = BK / 8; /* n-tiles of 8 keys in S */
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char *sQ = smem_raw, *sK = sQ + MMA8_BQ * 128, *sV = sK + STAGES * C::K_BYTES;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int h = blockIdx.y, hk = h / (a.Hq / a.Hk), q0 = blockIdx.x * MMA8_BQ;
    const unsigned char *Q = (const unsigned char *)a.q + (int64_t)h * 128;
    const unsigned char *K = (const unsigned char *)a.k + (int64_t)hk * 128;
    /* fp8: rows hk·128 .. of the transposed V, BK bytes (keys) a tile; int8: f16 rows of keys, 256 bytes a row */
    const unsigned char *V = MODE == MMA8_FP8 ? (const unsigned char *)a.v + (int64_t)hk * 128 * a.ldv
                                              : (const unsigned char *)a.v + (int64_t)hk * 128 * 2;
    const int64_t ldv_bytes = MODE == MMA8_FP8 ? a.ldv : a.ldv * 2;
    const int shift = a.Sk - a.Sq;
    int kend = a.Sk;
    if (a.causal) {
        kend = q0 + MMA8_BQ + shift;
        if (kend > a.Sk) kend = a.Sk;
        if (kend < 0) kend = 0;
    }
    const int nkb = (kend + BK - 1) / BK, nkb_all = (a.Sk + BK - 1) / BK;
    auto load_kv = [&](int stage, int kb) {
        mma8_load<BK, 8>(sK + stage * C::K_BYTES, K, a.ldk, kb * BK, a.Sk, tid);
        if (MODE == MMA8_FP8) /* 128 channel rows, the tile's BK = 128 key bytes each (zero past Sk already) */
            mma8_load<128, 8>(sV + stage * C::V_BYTES, V + (int64_t)kb * BK, ldv_bytes, 0, 128, tid);
        else
            mma8_load<BK, 16>(sV + stage * C::V_BYTES, V, ldv_bytes, kb * BK, a.Sk, tid);
    };

    mma8_load<MMA8_BQ, 8>(sQ, Q + (int64_t)q0 * a.ldq, a.ldq, 0, a.Sq - q0, tid);
    if (nkb > 0) load_kv(0, 0);
    mma8_commit();

    const int g = lane >> 2, t4 = lane & 3;
    const float qscale = a.qs[(int64_t)h * ((a.Sq + C::QB - 1) / C::QB) + q0 / C::QB] * a.scale_log2;
    float o[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    uint32_t qf[4][4];

    for (int kb = 0; kb < nkb; kb++) {
        const int buf = STAGES == 2 ? (kb & 1) : 0;
        if (STAGES == 2) {
            if (kb + 1 < nkb) load_kv(buf ^ 1, kb + 1);
            mma8_commit();
            mma8_wait<1>();
        } else {
            if (kb > 0) { /* the previous iteration's closing barrier freed the single buffer */
                load_kv(0, kb);
                mma8_commit();
            }
            mma8_wait<0>();
        }
        __syncthreads();
        if (kb == 0) {
#pragma unroll
            for (int kk = 0; kk < 4; kk++) { /* 32 bytes of k a step: the bf16 kernel's k16 addressing */
                const int r = warp * 16 + (lane & 15), c = kk * 2 + (lane >> 4);
                ldmatrix_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], mma8_swz<8>(sQ, r, c));
            }
        }
        unsigned char *tK = sK + buf * C::K_BYTES, *tV = sV + buf * C::V_BYTES;
        /* S = Q Kᵀ: 16 x BK per warp */
        float s[NT][4];
        {
            int acc[NT][4];
#pragma unroll
            for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0;
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
#pragma unroll
                for (int jj = 0; jj < NT / 2; jj++) {
                    uint32_t b0, b1, b2, b3;
                    const int r = jj * 16 + (lane & 7) + ((lane >> 4) << 3), c = kk * 2 + ((lane >> 3) & 1);
                    ldmatrix_x4(b0, b1, b2, b3, mma8_swz<8>(tK, r, c));
                    mma8_s8(acc[2 * jj], qf[kk], b0, b1);
                    mma8_s8(acc[2 * jj + 1], qf[kk], b2, b3);
                }
            }
            const float f = qscale * a.ks[(int64_t)hk * nkb_all + kb];
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] = (float)acc[j][e] * f;
        }
        /* mask keys past the end (and the causal future), online softmax */
        const int kbase = kb * BK;
        const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = kbase + j * 8 + t4 * 2 + e;
                const bool bad0 = key >= a.Sk || (a.causal && key > row0 + shift);
                const bool bad1 = key >= a.Sk || (a.causal && key > row1 + shift);
                if (bad0) s[j][e] = -INFINITY;
                if (bad1) s[j][2 + e] = -INFINITY;
                mx0 = fmaxf(mx0, s[j][e]);
                mx1 = fmaxf(mx1, s[j][2 + e]);
            }
        }
        mx0 = quad_max(mx0);
        mx1 = quad_max(mx1);
        const float c0 = mx0 == -INFINITY ? 1.0f : exp2f(m0 - mx0), c1 = mx1 == -INFINITY ? 1.0f : exp2f(m1 - mx1);
        /* fp8: p = exp2(s − max + 8), at most 256 (e4m3 reaches 448), as its e4m3 code; int8: p = exp2(s − max) */
        const float off = MODE == MMA8_FP8 ? 8.0f : 0.0f;
        const float base0 = mx0 == -INFINITY ? 0.0f : mx0 - off, base1 = mx1 == -INFINITY ? 0.0f : mx1 - off;
        float sum0 = 0.0f, sum1 = 0.0f;
        /* fp8: the probabilities' e4m3 codes (fp8_p_code of x = s − base, in s's bits); l from the tensor cores,
         * below. int8: the f32 probabilities and their sum. */
        constexpr float kc = (7.0f + H3_ATTN_FP8_CODE_SHIFT / 8.0f) / 32.0f;
        const float k0 = fmaf(-base0, 1.0f / 32.0f, kc), k1 = fmaf(-base1, 1.0f / 32.0f, kc);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            if constexpr (MODE == MMA8_FP8) {
                s[j][0] = __uint_as_float(fp8_p_code(s[j][0], 1.0f / 32.0f, k0));
                s[j][1] = __uint_as_float(fp8_p_code(s[j][1], 1.0f / 32.0f, k0));
                s[j][2] = __uint_as_float(fp8_p_code(s[j][2], 1.0f / 32.0f, k1));
                s[j][3] = __uint_as_float(fp8_p_code(s[j][3], 1.0f / 32.0f, k1));
            } else {
                s[j][0] = exp2f(s[j][0] - base0);
                s[j][1] = exp2f(s[j][1] - base0);
                s[j][2] = exp2f(s[j][2] - base1);
                s[j][3] = exp2f(s[j][3] - base1);
                sum0 += s[j][0] + s[j][1];
                sum1 += s[j][2] + s[j][3];
            }
        }
        l0 = l0 * c0 + sum0;
        l1 = l1 * c1 + sum1;
        m0 = mx0;
        m1 = mx1;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            o[i][0] *= c0;
            o[i][1] *= c0;
            o[i][2] *= c1;
            o[i][3] *= c1;
        }
        if constexpr (MODE == MMA8_FP8) {
            /* O += P V over 32-key slices: P's e4m3 codes from the accumulators, V's rows (channels) by
             * ldmatrix; and the tile's Σp as P times e4m3 ones (0x38) into a fresh accumulator (every
             * column is the row's sum: ps[0] row g, ps[2] row g+8), the sum of the rounded probabilities O
             * took, as Hopper's kernel does */
            float ps[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            /* the tile's P·V in a fresh accumulator, added to o in f32 below: SageAttention 2 reports Ada's and
             * Hopper's e4m3 MMA keeping 13 mantissa bits of its f32 accumulator (the rest truncated), which over a
             * long row loses most of each new tile; Hopper's wgmma does (attn_fp8.cuh), while this kernel on the
             * H200 passed test_cuda_ops' flat 19,412-key case with and without it. Untimed on Ada. */
            float ot[16][4];
#pragma unroll
            for (int i = 0; i < 16; i++) ot[i][0] = ot[i][1] = ot[i][2] = ot[i][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BK / 32; kk++) {
                uint32_t pa[4];
                const auto pc = [&](int j, int e) { return __float_as_uint(s[4 * kk + j][e]); };
                pa[0] = pack_codes4(pc(0, 0), pc(0, 1), pc(1, 0), pc(1, 1));
                pa[1] = pack_codes4(pc(0, 2), pc(0, 3), pc(1, 2), pc(1, 3));
                pa[2] = pack_codes4(pc(2, 0), pc(2, 1), pc(3, 0), pc(3, 1));
                pa[3] = pack_codes4(pc(2, 2), pc(2, 3), pc(3, 2), pc(3, 3));
                mma8_e4m3(ps, pa, 0x38383838u, 0x38383838u);
#pragma unroll
                for (int dd = 0; dd < 8; dd++) { /* 16 channels a step */
                    uint32_t b0, b1, b2, b3;
                    const int r = dd * 16 + (lane & 7) + ((lane >> 4) << 3), c = kk * 2 + ((lane >> 3) & 1);
                    ldmatrix_x4(b0, b1, b2, b3, mma8_swz<8>(tV, r, c));
                    mma8_e4m3(ot[2 * dd], pa, b0, b1);
                    mma8_e4m3(ot[2 * dd + 1], pa, b2, b3);
                }
            }
#pragma unroll
            for (int i = 0; i < 16; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[i][e] += ot[i][e];
            l0 += ps[0];
            l1 += ps[2];
        } else {
            /* O += P V in f16: the bf16 kernel's fragments, V [keys][128] f16 through ldmatrix.trans */
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                const uint32_t a0 = pack_f16(s[2 * kk][0], s[2 * kk][1]), a1 = pack_f16(s[2 * kk][2], s[2 * kk][3]);
                const uint32_t a2 = pack_f16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               a3 = pack_f16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int dd = 0; dd < 8; dd++) {
                    uint32_t b0, b1, b2, b3;
                    const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), c = dd * 2 + (lane >> 4);
                    ldmatrix_x4_trans(b0, b1, b2, b3, mma8_swz<16>(tV, r, c));
                    mma8_f16(o[2 * dd], a0, a1, a2, a3, b0, b1);
                    mma8_f16(o[2 * dd + 1], a0, a1, a2, a3, b2, b3);
                }
            }
        }
        __syncthreads();
    }
    mma8_wait<0>();
    if constexpr (MODE == MMA8_INT8) { /* per-thread partial sums; fp8's are whole rows already */
        l0 = quad_sum(l0);
        l1 = quad_sum(l1);
    }
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;
    __nv_bfloat16 *O = (__nv_bfloat16 *)a.o + (int64_t)h * 128;
    const float *vs = a.vs + (int64_t)hk * 128;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int col = i * 8 + t4 * 2;
        const float v0 = vs[col], v1 = vs[col + 1];
        if (row0 < a.Sq)
            *(__nv_bfloat162 *)(O + (int64_t)row0 * a.ldo + col) =
                __floats2bfloat162_rn(o[i][0] * inv0 * v0, o[i][1] * inv0 * v1);
        if (row1 < a.Sq)
            *(__nv_bfloat162 *)(O + (int64_t)row1 * a.ldo + col) =
                __floats2bfloat162_rn(o[i][2] * inv1 * v0, o[i][3] * inv1 * v1);
    }
}

#endif

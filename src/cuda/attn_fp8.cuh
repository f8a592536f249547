/* fp8 attention on Hopper (H3_ATTN_FP8, sm_90a): attn_wgmma8 with 8-bit operands, SageAttention 2's recipe.
 *
 * The quantization (docs/CUDA.md "fp8 attention"; the CPU computes the same, cpu_attn.c): k less its mean over the
 * keys (the softmax does not see it), q and k in int8 with one scale per head and block of rows (max|x| / 127; q
 * 128 rows, k FP8_BK, the key tile), v in e4m3 with one scale per head and channel over all keys; S = Q·Kᵀ on
 * m64nFP8_BKk32 s8 wgmma into exact int32 sums (both operands K-major in shared memory, one 128-byte swizzled panel
 * per row: the e4m3 layout, int8 runs at e4m3's rate and its 127 steps are finer than e4m3's 3 mantissa bits, which
 * sharp attention amplifies into the exponentials); the online softmax in fp32, its probabilities exp2(s − max + 8)
 * (at most 256, FA3's offset) made e4m3 codes straight from the exponent, without an exponential (fp8_p_code);
 * O += P·V with P in registers and V transposed in shared memory (panels of [128 channels][64 keys], K-major:
 * Hopper's fp8 wgmma reads no MN-major operand), O's sums moved into f32 in shared memory every FP8_FLUSH tiles
 * (the fp8 wgmma keeps 13 mantissa bits of the accumulator it adds into). The register layout of an fp8 A operand
 * (row g: columns 4·t4..4·t4+3 and 16 + the same of each 32-key slice) differs from the layout the S accumulators
 * come in (row g: columns 8j + 2·t4, +1); instead of moving bytes between threads, the transposed V stores its keys
 * in the order the registers already hold (attn_fp8_key), which leaves P·V's sum unchanged. */
#ifndef H3_ATTN_FP8_CUH
#define H3_ATTN_FP8_CUH

#include "cuda/attn_wgmma.cuh"

#define FP8_P_OFFSET 8.0f /* p = exp2(s − max + 8): at most 256 (e4m3 reaches 448), small ones stay normal */

/* Keys a tile (and k's scale block): 192, as FlashAttention 3's fp8 kernel takes more keys a tile than its bf16 one
 * (224 against 176 at head size 128): the softmax's per-tile work (the row maxima's shuffles, O's rescale, the
 * waits on the tensor cores) is spread over more keys. 2-3% faster than 128 at W362 (bench/NOTES.md). Another size
 * needs its own S wrapper (wgmma_ss_s8_bk, the m64nFP8_BKk32 instruction with FP8_BK / 2 registers) and a multiple
 * of 64 (V's panels). */
#define FP8_BK 192
#define FP8_NJ (FP8_BK / 8)   /* a thread's S columns: 2 per group of 8 keys, for rows g and g+8 */
#define FP8_NK (FP8_BK / 32)  /* k-steps of P·V (32 keys each) */
#define FP8_VPANEL (128 * 64) /* V's tiles: panels of 64 keys by 128 channels, 64-byte swizzle */

/* 8 rows of 128 e4m3 ones after the K and V stages: P times them is each row's Σp of a key tile (issue_pv). */
#define FP8_ONES_BYTES 1024
/* O's sums leave the tensor cores' accumulator for f32 in shared memory every FP8_FLUSH key tiles (the kernel's
 * comment): 64 KB, 64 floats a consumer thread. The flush costs shared memory's bandwidth (128 KB a block, read and
 * written) between a tile's P·V and the next: every 4 tiles the kernel runs 12.3 ms at W124 against 11.9 without
 * flushes (wrong on long flat rows), 12.9 every 2 tiles and 13.9 (another call) every tile; the error it leaves
 * grows with the period (test_cuda_ops' flat rows 8.2e-3 off exact attention, against 3.9e-3 and 2.3e-3;
 * bench/NOTES.md). Other periods build with -DFP8_FLUSH=N (tests/gpu/bundle.sh H3_BUNDLE_VARIANTS). */
#ifndef FP8_FLUSH
#define FP8_FLUSH 4
#endif
static_assert(FP8_FLUSH >= 1, "FP8_FLUSH: key tiles between O's flushes");
#define FP8_OH_BYTES (256 * 64 * 4)
static inline size_t wg8_fp8_smem_bytes(void) {
    return (size_t)(WG_BQ + 2 * WG8_STAGES * FP8_BK) * 128 + FP8_ONES_BYTES + 1024 + 256 + FP8_OH_BYTES;
}

/* Tensor maps of the fp8 operands: q [Sq, Hq·128] and k [Sk, Hk·128] bytes, boxes of 128 (q) or FP8_BK (k) rows
 * by 128 bytes (one 128-byte swizzled panel); vt [Hk·128, ldv] bytes, boxes of 128 channels by 64 keys (64-byte
 * swizzle: a tile of FP8_BK keys is FP8_BK / 64 such panels). Returns a CUresult (0 on success). */
static inline int attn_fp8_make_tmaps(attn_tmaps *m, const attn_args *a) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (!encode) {
        cudaDriverEntryPointQueryResult qr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000,
                                             cudaEnableDefault, &qr) != cudaSuccess ||
            qr != cudaDriverEntryPointSuccess || !encode)
            return -1;
    }
    struct {
        CUtensorMap *map;
        const void *ptr;
        int64_t cols, rows, ld;
        cuuint32_t bx, by;
        CUtensorMapSwizzle sw;
    } t[3] = {{&m->q, a->q, (int64_t)a->Hq * 128, a->Sq, a->ldq, 128, 128, CU_TENSOR_MAP_SWIZZLE_128B},
              {&m->k, a->k, (int64_t)a->Hk * 128, a->Sk, a->ldk, 128, FP8_BK, CU_TENSOR_MAP_SWIZZLE_128B},
              {&m->v, a->v, a->ldv, (int64_t)a->Hk * 128, a->ldv, 64, 128, CU_TENSOR_MAP_SWIZZLE_64B}};
    for (int i = 0; i < 3; i++) {
        cuuint64_t dims[2] = {(cuuint64_t)t[i].cols, (cuuint64_t)t[i].rows};
        cuuint64_t strides[1] = {(cuuint64_t)t[i].ld};
        cuuint32_t box[2] = {t[i].bx, t[i].by}, es[2] = {1, 1};
        CUresult r = encode(t[i].map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)t[i].ptr, dims, strides, box,
                            es, CU_TENSOR_MAP_INTERLEAVE_NONE, t[i].sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS) return (int)r;
    }
    return 0;
}

#ifdef H3_WGMMA_COMPILED
/* D (64xFP8_BK s32, m64n192k32) (+)= A·B, int8, both in shared memory (K-major). */
__device__ __forceinline__ void wgmma_ss_s8_bk(uint32_t *d, uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
        "}, %96, %97, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
          "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
          "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
          "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]),
          "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),
          "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]),
          "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]),
          "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95])
        : "l"(da), "l"(db), "r"(accumulate));
}
/* D (+)= A·B (accumulate: 0 starts D afresh), e4m3, A (64x32) in registers, B in shared memory (K-major). */
__device__ __forceinline__ void wgmma_rs_m64n128_e4m3(float *d, uint32_t a0, uint32_t a1, uint32_t a2,
                                                      uint32_t a3, uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
                 "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
                 "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
                 "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
                 "%63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
                   "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
                   "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
                   "+f"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(accumulate));
}
/* D (64x8 f32) (+)= A·B, e4m3, A (64x32) in registers, B (8 rows) in shared memory (K-major). */
__device__ __forceinline__ void wgmma_rs_m64n8_e4m3(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, "
                 "1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(accumulate));
}
#endif

#ifdef H3_WGMMA_COMPILED
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
#endif

/* The int32 sums of S as floats offset by FP8_S_BIAS: one integer add each (0x4B400000 is the bits of 1.5·2²³, and
 * |s| <= 127² · 128 < 2²² keeps s + 1.5·2²³ in [2²³, 2²⁴), where a float's integers are exact), not a conversion on
 * the special-function units the exponentials already load. The order of the scores is kept. */
#define FP8_S_BIAS 12582912.0f

/* fa_softmax for the fp8 kernel, with few instructions per score (the softmax, not the tensor cores, bounds this
 * kernel): the max is taken over the biased raw scores (sc > 0); each probability is two FFMAs and no exponential,
 * its e4m3 code (fp8_p_code) of x = (s + bias)·sc − (max + bias·sc) + FP8_P_OFFSET, the FFMA cancelling the bias
 * exactly (the roundings of max + bias·sc and of the code's constant move a row's codes of one key tile together
 * by at most 12·sc of a code: under 0.03 while sc < 2e-3, i.e. scores under 4,000 at the largest int8 sums); l,
 * their sum, comes from the tensor cores (issue_pv). The code's linear mantissa (2^f taken as 1 + f) leaves p
 * 3.1% (rms) off exp2, against 2.6% for e4m3's rounding of an exact exp2, which is what it replaces: an ex2 and
 * half an e4m3 conversion per score on the special-function unit, the kernel's longest chain (bench/NOTES.md: 12%
 * faster at W124, 15% at W362; off exact attention on random data 4.2-4.3e-2 against 3.8-3.9e-2). (Exponents in
 * half precision, two per ex2.approx.f16x2, measured slower on the H200: 19.2 against 13.9 ms at W124.) */
__device__ __forceinline__ void fa_softmax_fp8(uint32_t (&s)[FP8_BK / 2], fa_rows &r, const attn_args &a, float sc,
                                               int kbase, bool full, int row0, int row1, int shift, int t4,
                                               float &c0, float &c1) {
#ifdef H3_WGMMA_COMPILED
    /* s holds the int32 sums on entry and the probabilities' e4m3 codes (low bytes) on return */
#pragma unroll
    for (int i = 0; i < FP8_BK / 2; i++) s[i] += 0x4B400000u;
    float mx0 = -INFINITY, mx1 = -INFINITY;
    if (full) {
#pragma unroll
        for (int j = 0; j < FP8_NJ; j++) {
            mx0 = fmaxf(mx0, fmaxf(__uint_as_float(s[4 * j]), __uint_as_float(s[4 * j + 1])));
            mx1 = fmaxf(mx1, fmaxf(__uint_as_float(s[4 * j + 2]), __uint_as_float(s[4 * j + 3])));
        }
    } else { /* a tile past the keys' end or the causal diagonal: from lim0 (row g), lim1 (row g+8) masked */
        const int col = kbase + t4 * 2, end0 = a.causal && row0 + shift + 1 < a.Sk ? row0 + shift + 1 : a.Sk,
                  end1 = a.causal && row1 + shift + 1 < a.Sk ? row1 + shift + 1 : a.Sk;
        const int lim0 = end0 - col, lim1 = end1 - col; /* thread's column j·8 + e is key col + j·8 + e */
#pragma unroll
        for (int j = 0; j < FP8_NJ; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                if (j * 8 + e >= lim0) s[4 * j + e] = __float_as_uint(-INFINITY);
                if (j * 8 + e >= lim1) s[4 * j + 2 + e] = __float_as_uint(-INFINITY);
                mx0 = fmaxf(mx0, __uint_as_float(s[4 * j + e]));
                mx1 = fmaxf(mx1, __uint_as_float(s[4 * j + 2 + e]));
            }
        }
    }
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    mx0 = fmaxf(r.m0, (mx0 - FP8_S_BIAS) * sc); /* exact before the product: both in [2²³, 2²⁴) */
    mx1 = fmaxf(r.m1, (mx1 - FP8_S_BIAS) * sc);
    c0 = mx0 == -INFINITY ? 1.0f : ex2_approx(r.m0 - mx0);
    c1 = mx1 == -INFINITY ? 1.0f : ex2_approx(r.m1 - mx1);
    const float b0 = mx0 == -INFINITY ? 0.0f : mx0 - FP8_P_OFFSET, b1 = mx1 == -INFINITY ? 0.0f : mx1 - FP8_P_OFFSET;
    /* x = (s + bias)·sc + n = s·sc − max + 8; the code's FFMA takes x / 32 + (56 + shift) / 256 */
    const float n0 = fmaf(-FP8_S_BIAS, sc, -b0), n1 = fmaf(-FP8_S_BIAS, sc, -b1);
    constexpr float kc = 7.0f + H3_ATTN_FP8_CODE_SHIFT / 8.0f;
    const float a32 = sc * (1.0f / 32.0f), k0 = (n0 + kc) * (1.0f / 32.0f), k1 = (n1 + kc) * (1.0f / 32.0f);
#pragma unroll
    for (int j = 0; j < FP8_NJ; j++) {
        s[4 * j] = fp8_p_code(__uint_as_float(s[4 * j]), a32, k0);
        s[4 * j + 1] = fp8_p_code(__uint_as_float(s[4 * j + 1]), a32, k0);
        s[4 * j + 2] = fp8_p_code(__uint_as_float(s[4 * j + 2]), a32, k1);
        s[4 * j + 3] = fp8_p_code(__uint_as_float(s[4 * j + 3]), a32, k1);
    }
    r.m0 = mx0;
    r.m1 = mx1;
#endif
}

/* O and l *= c per row (skipped where the row's max did not move), and the probabilities' codes in su into the A
 * fragments of the next P·V (four registers per 32 keys: row g's keys 0,1,8,9 of each 16 (in attn_fp8_key's
 * order), row g+8's, then the same of the second 16). */
__device__ __forceinline__ void fa_rescale_pack_fp8(float (&o)[64], fa_rows &r, uint32_t (&p)[FP8_BK / 8],
                                                    const uint32_t (&su)[FP8_BK / 2], float c0, float c1) {
#ifdef H3_WGMMA_COMPILED
    if (c0 != 1.0f) {
        r.l0 *= c0;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            o[4 * j] *= c0;
            o[4 * j + 1] *= c0;
        }
    }
    if (c1 != 1.0f) {
        r.l1 *= c1;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            o[4 * j + 2] *= c1;
            o[4 * j + 3] *= c1;
        }
    }
#define S_(i) su[i]
#pragma unroll
    for (int kk = 0; kk < FP8_NK; kk++) {
        const int b = 16 * kk;
        p[4 * kk] = pack_codes4(S_(b), S_(b + 1), S_(b + 4), S_(b + 5));
        p[4 * kk + 1] = pack_codes4(S_(b + 2), S_(b + 3), S_(b + 6), S_(b + 7));
        p[4 * kk + 2] = pack_codes4(S_(b + 8), S_(b + 9), S_(b + 12), S_(b + 13));
        p[4 * kk + 3] = pack_codes4(S_(b + 10), S_(b + 11), S_(b + 14), S_(b + 15));
    }
#undef S_
#endif
}

/* O · vs[channel] / l into the output rows (bf16), rows past Sq skipped. l = Σ P of each row, P the probabilities'
 * e4m3 values (every thread of the row's quad holds all of it: issue_pv), the very probabilities O took, so O / l
 * is exact for a row one key dominates. */
__device__ __forceinline__ void fa_store_fp8(const float (&o)[64], fa_rows r, const attn_args &a, int h, int hk,
                                             int row0, int row1, int t4) {
    const float l0 = r.l0, l1 = r.l1;
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    __nv_bfloat16 *O = (__nv_bfloat16 *)a.o + (int64_t)h * 128;
    const float *vs = a.vs + (int64_t)hk * 128;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int col = j * 8 + t4 * 2;
        const float v0 = vs[col], v1 = vs[col + 1];
        if (row0 < a.Sq)
            *(__nv_bfloat162 *)(O + (int64_t)row0 * a.ldo + col) =
                __floats2bfloat162_rn(o[4 * j] * inv0 * v0, o[4 * j + 1] * inv0 * v1);
        if (row1 < a.Sq)
            *(__nv_bfloat162 *)(O + (int64_t)row1 * a.ldo + col) =
                __floats2bfloat162_rn(o[4 * j + 2] * inv1 * v0, o[4 * j + 3] * inv1 * v1);
    }
}

/* attn_wgmma8's schedule (TMA producer, two consumer warpgroups, softmax of block j beside P·V of block j-1) on
 * 8-bit tiles of FP8_BK keys, without attn_wgmma8's ping-pong: here the softmax takes longer than a warpgroup's GEMMs
 * (the exponentials alone run at the tensor cores' rate), so making the warpgroups issue in turn only delays them
 * (measured 2% slower at W124, bench/NOTES.md); each issues its GEMMs when its softmax is done. */
__global__ void __launch_bounds__(384, 1) attn_wgmma8_fp8(const __grid_constant__ attn_tmaps maps, attn_args a) {
#ifndef H3_WGMMA_COMPILED
    __trap();
#else
    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
    unsigned char *base = (unsigned char *)(((uintptr_t)wg_smem_raw + 1023) & ~(uintptr_t)1023);
    constexpr int QB = WG_BQ * 128, KB = FP8_BK * 128; /* a K tile; a V tile is the same bytes in FP8_BK / 64 panels */
    unsigned char *sQ = base, *sK = base + QB, *sV = base + QB + WG8_STAGES * KB;
    unsigned char *sOnes = base + QB + 2 * WG8_STAGES * KB;
    uint64_t *bars = (uint64_t *)(sOnes + FP8_ONES_BYTES);
    uint64_t *q_full = bars, *k_full = bars + 1, *v_full = bars + 1 + WG8_STAGES,
             *k_empty = bars + 1 + 2 * WG8_STAGES, *v_empty = bars + 1 + 3 * WG8_STAGES;
    const int tid = threadIdx.x, wg = tid >> 7;
    const int h = blockIdx.y, hk = h / (a.Hq / a.Hk);
    const int q0 = blockIdx.x * WG_BQ;
    const int shift = a.Sk - a.Sq;
    int kend = a.Sk;
    if (a.causal) {
        kend = q0 + WG_BQ + shift;
        if (kend > a.Sk) kend = a.Sk;
        if (kend < 0) kend = 0;
    }
    const int nkb = (kend + FP8_BK - 1) / FP8_BK;
    if (tid == 0) {
        mbar_init(q_full, 1);
        for (int s = 0; s < WG8_STAGES; s++) {
            mbar_init(&k_full[s], 1);
            mbar_init(&v_full[s], 1);
            mbar_init(&k_empty[s], 256);
            mbar_init(&v_empty[s], 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    /* the rows of ones (e4m3 1.0 = 0x38 in every byte: the swizzle moves nothing), made visible to the tensor
     * cores' reads */
    for (int i = tid; i < FP8_ONES_BYTES / 16; i += 384)
        *(uint4 *)(sOnes + i * 16) = make_uint4(0x38383838u, 0x38383838u, 0x38383838u, 0x38383838u);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    if (wg == 0) { /* producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (tid == 0) {
            mbar_expect_tx(q_full, QB);
            tma_load_2d(sQ, &maps.q, h * 128, q0, q_full);
            for (int kb = 0; kb < nkb; kb++) {
                const int s = kb % WG8_STAGES, n = kb / WG8_STAGES;
                if (n > 0) mbar_wait(&k_empty[s], (n - 1) & 1);
                mbar_expect_tx(&k_full[s], KB);
                tma_load_2d(sK + s * KB, &maps.k, hk * 128, kb * FP8_BK, &k_full[s]);
                if (n > 0) mbar_wait(&v_empty[s], (n - 1) & 1);
                mbar_expect_tx(&v_full[s], KB);
#pragma unroll 1
                for (int pn = 0; pn < FP8_BK / 64; pn++)
                    tma_load_2d(sV + s * KB + pn * FP8_VPANEL, &maps.v, kb * FP8_BK + pn * 64, hk * 128, &v_full[s]);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int cw = wg - 1, ctid = tid - 128, warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    float o[64], psum[4]; /* psum: one key tile's Σp (issue_pv) */
    uint32_t s[FP8_BK / 2]; /* S's int32 sums, then the tile's probabilities as f32 bits */
    uint32_t p[FP8_BK / 8];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < FP8_BK / 8; i++) p[i] = 0;
    fa_rows rs = {-INFINITY, -INFINITY, 0.0f, 0.0f};
    const int row0 = q0 + cw * 64 + warp * 16 + g, row1 = row0 + 8;
    const int rowmin = q0 + cw * 64;
    const int nkb_all = (a.Sk + FP8_BK - 1) / FP8_BK;
    const float qscale = a.scale_log2 * a.qs[(int64_t)h * gridDim.x + blockIdx.x];
    const float *kscale = a.ks + (int64_t)hk * nkb_all;
    auto softmax = [&](int kb, float &c0, float &c1) {
        const int kbase = kb * FP8_BK;
        const bool full = kbase + FP8_BK <= a.Sk && (!a.causal || kbase + FP8_BK - 1 <= rowmin + shift);
        fa_softmax_fp8(s, rs, a, qscale * kscale[kb], kbase, full, row0, row1, shift, t4, c0, c1);
    };
    auto rescale_pack = [&](float c0, float c1) { fa_rescale_pack_fp8(o, rs, p, s, c0, c1); };
    /* the shared-memory descriptors once: their low 14 bits are the address / 16, so a 32-byte k step
     * adds 2, a V panel FP8_VPANEL / 16 and a stage KB / 16 (shared memory stays under 256 KB: nothing carries out
     * of the field); V's panels are 64-byte swizzled (layout 2 in bits 62-63, 8 rows of 64 bytes = SBO 512) */
    const uint64_t dQ = wg_desc(sQ + cw * 64 * 128, 16, 1024), dK = wg_desc(sK, 16, 1024),
                   dV = (wg_desc(sV, 16, 512) & ~(3ull << 62)) | (2ull << 62), dOnes = wg_desc(sOnes, 16, 1024);
    /* o's sums in f32 in shared memory, every FP8_FLUSH tiles: Hopper's fp8 wgmma adds into its accumulator with
     * about 13 bits kept, so a long row's o, left to grow over all its tiles, lost most of each new tile (24.6% off
     * the CPU at 19,412 keys of flat scores, bench/NOTES.md); the next tile's P·V then starts the accumulator
     * afresh */
    float4 *oh = (float4 *)(sOnes + FP8_ONES_BYTES + 256) + ctid; /* chunk j at oh[256 * j] */
    float mf0 = -INFINITY, mf1 = -INFINITY; /* the row maxima oh's sums are at */
    bool fresh = true;                      /* o holds nothing since the last flush */
#pragma unroll
    for (int j = 0; j < 16; j++) oh[256 * j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    auto flush = [&]() {
        const float f0 = mf0 == -INFINITY ? 0.0f : ex2_approx(mf0 - rs.m0),
                    f1 = mf1 == -INFINITY ? 0.0f : ex2_approx(mf1 - rs.m1);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            float4 v = oh[256 * j];
            v.x = fmaf(v.x, f0, o[4 * j]);
            v.y = fmaf(v.y, f0, o[4 * j + 1]);
            v.z = fmaf(v.z, f1, o[4 * j + 2]);
            v.w = fmaf(v.w, f1, o[4 * j + 3]);
            oh[256 * j] = v;
        }
        mf0 = rs.m0;
        mf1 = rs.m1;
        fresh = true;
    };
    auto issue_s = [&](int kb) {
        const uint64_t dk = dK + (uint64_t)((kb % WG8_STAGES) * (KB >> 4));
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_ss_s8_bk(s, dQ + 2 * kk, dk + 2 * kk, kk > 0);
        wgmma_commit();
    };
    auto issue_pv = [&](int kb) {
        const uint64_t dv = dV + (uint64_t)((kb % WG8_STAGES) * (KB >> 4));
#pragma unroll
        for (int kk = 0; kk < FP8_NK; kk++)
            wgmma_rs_m64n128_e4m3(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                                  dv + (kk / 2) * (FP8_VPANEL >> 4) + 2 * (kk % 2), kk > 0 || !fresh);
        /* The tile's Σp on the tensor cores, from the e4m3 P that O took, into a fresh accumulator (every column
         * of P·ones is the row's sum: psum[0] row g, psum[2] row g+8), which add_tile_sum adds to l in f32: no
         * additions in the softmax. Not as 8 more columns of O: Hopper's fp8 accumulation keeps about 13 bits
         * aligned to the accumulator, which lost most of a long row's small probabilities into a growing l
         * (measured 6e-2 off the CPU's sum at 4,096 keys). */
#pragma unroll
        for (int kk = 0; kk < FP8_NK; kk++) /* every 32 bytes of a row of ones are ones: any k step will do */
            wgmma_rs_m64n8_e4m3(psum, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], dOnes + 2 * (kk % 4),
                                kk > 0);
        wgmma_commit();
    };
    auto add_tile_sum = [&]() {
        rs.l0 += psum[0];
        rs.l1 += psum[2];
    };

    if (nkb > 0) {
        float c0, c1;
        mbar_wait(q_full, 0);
        mbar_wait(&k_full[0], 0);
        wgmma_fence();
        issue_s(0);
        wgmma_wait0();
        mbar_arrive(&k_empty[0]);
        softmax(0, c0, c1);
        rescale_pack(c0, c1);
        for (int kb = 1; kb < nkb; kb++) {
            const int st = kb % WG8_STAGES, ps = (kb - 1) % WG8_STAGES;
            mbar_wait(&k_full[st], (kb / WG8_STAGES) & 1);
            mbar_wait(&v_full[ps], ((kb - 1) / WG8_STAGES) & 1);
            wgmma_fence();
            issue_s(kb);
            issue_pv(kb - 1);
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            mbar_arrive(&k_empty[st]);
            softmax(kb, c0, c1);
            wgmma_wait0();
            mbar_arrive(&v_empty[ps]);
            add_tile_sum(); /* tile kb-1's, at its max; then both to tile kb's */
            rescale_pack(c0, c1);
            fresh = false;
            if (kb % FP8_FLUSH == 0) flush();
        }
        mbar_wait(&v_full[(nkb - 1) % WG8_STAGES], ((nkb - 1) / WG8_STAGES) & 1);
        wgmma_fence();
        issue_pv(nkb - 1);
        wgmma_wait0();
        add_tile_sum();
        fresh = false;
        flush();
    }
#pragma unroll
    for (int j = 0; j < 16; j++) { /* oh is at rs's maxima after the last flush (zero where no tile ran) */
        const float4 v = oh[256 * j];
        o[4 * j] = v.x, o[4 * j + 1] = v.y, o[4 * j + 2] = v.z, o[4 * j + 3] = v.w;
    }
    fa_store_fp8(o, rs, a, h, hk, row0, row1, t4);
#endif
}

#endif

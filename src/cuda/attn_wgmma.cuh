/* Flash-attention forward on Hopper's warpgroup MMA (wgmma), bf16 in, fp32 accumulate (sm_90a).
 *
 * One block = 2 warpgroups = 128 query rows of one head; each warpgroup owns 64 rows. Key/value tiles of 128 rows
 * are double-buffered in shared memory by cp.async. S = Q·Kᵀ runs as wgmma m64n128k16 with both operands in
 * shared memory (K-major, 128-byte swizzle); O += P·V as wgmma with P in registers (the S accumulators, rounded to
 * bf16, already sit in the A-fragment layout) and V in shared memory read transposed (MN-major).
 *
 * Shared-memory tiles follow the wgmma canonical layout: a tile is cut along its contiguous dimension into 128-byte
 * panels (64 bf16); a panel holds one 128-byte line per row, and the 16-byte chunk c of line r sits at c ^ (r % 8).
 * Descriptors: K-major operands use SBO = 1024 (8 lines), LBO unused; the MN-major V uses LBO = the panel stride
 * and SBO = 1024. Tiles start 1024-byte aligned because the swizzle is applied to address bits. */
#ifndef H3_ATTN_WGMMA_CUH
#define H3_ATTN_WGMMA_CUH

#include "cuda/attn_kernels.cuh"

#define WG_BQ 128
#define WG_BK 128

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define H3_WGMMA_COMPILED 1

#endif

__device__ __forceinline__ uint64_t wg_desc(const void *smem, uint32_t lbo, uint32_t sbo) {
    uint32_t addr = smem_u32(smem);
    uint64_t d = (uint64_t)((addr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
    d |= (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
    d |= (uint64_t)1 << 62; /* 128-byte swizzle */
    return d;
}

#ifdef H3_WGMMA_COMPILED
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* D (64x128 f32, this thread's 64 values) (+)= A·B with A and B in shared memory (both K-major). */
__device__ __forceinline__ void wgmma_ss_m64n128(float *d, uint64_t da, uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* D += A·B with A (64x16 bf16) in registers and B in shared memory, MN-major (transposed). */
__device__ __forceinline__ void wgmma_rs_m64n128_tb(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}

/* D (64x64 f32, this thread's 32 values) += A·B, A in registers (bf16 fragments), B in shared memory MN-major
 * (transposed): P·V at head size 64. */
__device__ __forceinline__ void wgmma_rs_m64n64_tb(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                   uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}


#endif

/* ---- the online softmax shared by the wgmma kernels ----------------------------------------------------------
 * A thread holds, of its warp's 16 query rows, rows g and g+8 (row0, row1), and of a 128-key block the columns
 * 8j + 2·t4 + {0, 1}: s[4j], s[4j+1] for row0 and s[4j+2], s[4j+3] for row1 (the wgmma accumulator layout). */
typedef struct {
    float m0, m1, l0, l1; /* running max (base 2, scaled) and per-thread partial sums of rows row0, row1 */
} fa_rows;

/* Scales (by sc: the softmax scale in base 2, times the blocks' dequantization scales for fp8) and masks the
 * block's scores, updates the running max and sums, leaves exp2(s − max) in s, and returns the factors c0, c1
 * by which the accumulated outputs must shrink. `full`: no key of the block is masked for any row of the
 * warpgroup (skips the per-element mask). */
__device__ __forceinline__ void fa_softmax(float (&s)[64], fa_rows &r, const attn_args &a, float sc,
                                           int kbase, bool full, int row0, int row1, int shift, int t4,
                                           float &c0, float &c1) {
    float mx0 = r.m0, mx1 = r.m1;
    if (full) {
#pragma unroll
        for (int j = 0; j < 16; j++) {
            s[4 * j] *= sc;
            s[4 * j + 1] *= sc;
            s[4 * j + 2] *= sc;
            s[4 * j + 3] *= sc;
            mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
            mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
        }
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int key = kbase + j * 8 + t4 * 2 + e;
                bool bad0 = key >= a.Sk || (a.causal && key > row0 + shift);
                bool bad1 = key >= a.Sk || (a.causal && key > row1 + shift);
                s[4 * j + e] = bad0 ? -INFINITY : s[4 * j + e] * sc;
                s[4 * j + 2 + e] = bad1 ? -INFINITY : s[4 * j + 2 + e] * sc;
                mx0 = fmaxf(mx0, s[4 * j + e]);
                mx1 = fmaxf(mx1, s[4 * j + 2 + e]);
            }
        }
    }
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    c0 = mx0 == -INFINITY ? 1.0f : exp2f(r.m0 - mx0);
    c1 = mx1 == -INFINITY ? 1.0f : exp2f(r.m1 - mx1);
    float b0 = mx0 == -INFINITY ? 0.0f : mx0, b1 = mx1 == -INFINITY ? 0.0f : mx1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        s[4 * j] = exp2f(s[4 * j] - b0);
        s[4 * j + 1] = exp2f(s[4 * j + 1] - b0);
        s[4 * j + 2] = exp2f(s[4 * j + 2] - b1);
        s[4 * j + 3] = exp2f(s[4 * j + 3] - b1);
        sum0 += s[4 * j] + s[4 * j + 1];
        sum1 += s[4 * j + 2] + s[4 * j + 3];
    }
    r.l0 = r.l0 * c0 + sum0;
    r.l1 = r.l1 * c1 + sum1;
    r.m0 = mx0;
    r.m1 = mx1;
}

/* O (head size D: D/2 values a thread) *= c per row, and the probabilities in s rounded into the bf16 A fragment of
 * the next P·V. */
template <int D>
__device__ __forceinline__ void fa_rescale_pack(float (&o)[D / 2], uint32_t (&p)[32], const float (&s)[64], float c0,
                                                float c1) {
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        o[4 * j] *= c0;
        o[4 * j + 1] *= c0;
        o[4 * j + 2] *= c1;
        o[4 * j + 3] *= c1;
    }
#pragma unroll
    for (int j = 0; j < 16; j++) {
        p[2 * j] = pack_bf16(s[4 * j], s[4 * j + 1]);
        p[2 * j + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
    }
}

/* O / l into the output rows (bf16, head size D), rows past Sq skipped. */
template <int D>
__device__ __forceinline__ void fa_store(const float (&o)[D / 2], fa_rows r, const attn_args &a, int h, int row0,
                                         int row1, int t4) {
    r.l0 = quad_sum(r.l0);
    r.l1 = quad_sum(r.l1);
    float inv0 = r.l0 > 0.0f ? 1.0f / r.l0 : 0.0f, inv1 = r.l1 > 0.0f ? 1.0f / r.l1 : 0.0f;
    __nv_bfloat16 *O = (__nv_bfloat16 *)a.o + (int64_t)h * D;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        int col = j * 8 + t4 * 2;
        if (row0 < a.Sq)
            *(__nv_bfloat162 *)(O + (int64_t)row0 * a.ldo + col) =
                __floats2bfloat162_rn(o[4 * j] * inv0, o[4 * j + 1] * inv0);
        if (row1 < a.Sq)
            *(__nv_bfloat162 *)(O + (int64_t)row1 * a.ldo + col) =
                __floats2bfloat162_rn(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
    }
}

/* Whether the running GPU executes the sm_90a image (the only one with wgmma in it). */
static __global__ void attn_wgmma_probe(int *out) {
#ifdef H3_WGMMA_COMPILED
    *out = 1;
#else
    *out = 0;
#endif
}


/* v8: FA3-style. Warpgroup 0 produces: one thread loads Q once and the K/V tiles through the tensor-memory
 * accelerator (TMA, 128-byte swizzle straight into the wgmma layout), each stage guarded by a "full" mbarrier
 * (transaction bytes) and an "empty" one the consumers release. Warpgroups 1 and 2 consume 64 query rows each and
 * take turns on the tensor cores (two named barriers): while one issues its S and P·V GEMMs, the other runs its
 * softmax. Within a warpgroup the softmax of block j still overlaps the P·V of block j-1 (as v7). setmaxnreg moves
 * registers from the producer (24) to the consumers (240). Requires tensor maps built on the host. */
#include <cuda.h>

#define WG8_STAGES 2

typedef struct {
    CUtensorMap q, k, v;
} attn_tmaps;

/* Block-sparse attention (h3_op_attention_sparse; attn_sparse.cuh makes these): the maps of Q, K, V and of the
 * key tiles' centroids kc, vc ([ntpad rows, H·128] bf16, rows past nt zero), and the selection of each (head, query
 * tile): its exact key tiles in ascending order, how many (x) and how many centroid tiles follow them (y: 0 when
 * every tile is exact), and a bit per key tile, set where the tile is exact or past the last (its centroid then
 * takes no part). */
typedef struct {
    CUtensorMap q, k, v, kc, vc;
    const uint16_t *list; /* [H][nt][nt] */
    const int2 *count;    /* [H][nt] */
    const uint32_t *bits; /* [H][nt][ntw] */
    int nt, ntw;
} attn_tmaps_sparse;

#include <cudaTypedefs.h>

/* Tensor maps for Q, K and V as 2-D row-major matrices [rows, heads·D] (D 64 or 128) with their row strides; boxes
 * of 128 rows by 64 columns (one 128-byte swizzled panel). Returns a CUresult (0 on success). */
static inline int attn_make_tmap(CUtensorMap *map, const void *ptr, int64_t ld, int rows, int heads, int D = 128) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (!encode) {
        cudaDriverEntryPointQueryResult qr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault,
                                             &qr) != cudaSuccess ||
            qr != cudaDriverEntryPointSuccess || !encode)
            return -1;
    }
    cuuint64_t dims[2] = {(cuuint64_t)heads * D, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)ld * 2};
    cuuint32_t box[2] = {64, 128}, es[2] = {1, 1};
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)ptr, dims, strides, box, es,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : (int)r;
}

static inline int attn_make_tmaps(attn_tmaps *m, const attn_args *a, int D = 128) {
    struct {
        CUtensorMap *map;
        const void *ptr;
        int64_t ld;
        int rows, heads;
    } t[3] = {{&m->q, a->q, a->ldq, a->Sq, a->Hq}, {&m->k, a->k, a->ldk, a->Sk, a->Hk}, {&m->v, a->v, a->ldv, a->Sk, a->Hk}};
    for (int i = 0; i < 3; i++) {
        int r = attn_make_tmap(t[i].map, t[i].ptr, t[i].ld, t[i].rows, t[i].heads, D);
        if (r) return r;
    }
    return 0;
}

/* Head size D: the Q tile and the stages' K and V tiles, 1 KiB of alignment, the barriers. */
static inline size_t wg8_smem_bytes(int D = 128) {
    return (size_t)(WG_BQ + 2 * WG8_STAGES * WG_BK) * D * 2 + 1024 + 256;
}

#ifdef H3_WGMMA_COMPILED
__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    asm volatile("{\n.reg .pred P1;\nLAB_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(smem_u32(b)),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void named_sync(int id) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}
#endif

/* SPARSE (MAPS = attn_tmaps_sparse): the query tile's exact key tiles from maps.list, then its centroid tiles, each
 * centroid scored with log2 of its tile's rows added, or −∞ where its tile is exact (maps.bits). D: the head size,
 * 128 (two 64-column panels a tile) or 64 (one; P·V as m64n64, S = Q·Kᵀ in 4 steps of 16). */
template <typename MAPS, bool SPARSE, int D = 128>
__global__ void __launch_bounds__(384, 1) attn_wgmma8_k(const __grid_constant__ MAPS maps, attn_args a) {
#ifndef H3_WGMMA_COMPILED
    __trap();
#else
    static_assert(D == 128 || (D == 64 && !SPARSE), "head sizes 128 and 64 (dense)");
    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
    unsigned char *base = (unsigned char *)(((uintptr_t)wg_smem_raw + 1023) & ~(uintptr_t)1023);
    constexpr int QB = WG_BQ * D * 2, KB = WG_BK * D * 2, PANEL_Q = WG_BQ * 128, PANEL_K = WG_BK * 128;
    unsigned char *sQ = base, *sK = base + QB, *sV = base + QB + WG8_STAGES * KB;
    uint64_t *bars = (uint64_t *)(base + QB + 2 * WG8_STAGES * KB);
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
    int nkb = (kend + WG_BK - 1) / WG_BK, ne = nkb;
    const uint16_t *list = NULL;
    if constexpr (SPARSE) {
        const int64_t sel = (int64_t)h * maps.nt + blockIdx.x;
        const int2 cnt = maps.count[sel];
        ne = cnt.x;
        nkb = cnt.x + cnt.y;
        list = maps.list + sel * maps.nt;
    }
    (void)ne;
    (void)list;
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
    __syncthreads();

    if (wg == 0) { /* producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (tid == 0) {
            mbar_expect_tx(q_full, QB);
            tma_load_2d(sQ, &maps.q, h * D, q0, q_full);
            if constexpr (D == 128) tma_load_2d(sQ + PANEL_Q, &maps.q, h * D + 64, q0, q_full);
            for (int kb = 0; kb < nkb; kb++) {
                const int s = kb % WG8_STAGES, n = kb / WG8_STAGES;
                if (n > 0) mbar_wait(&k_empty[s], (n - 1) & 1);
                int row = kb * WG_BK;
                const CUtensorMap *mk = &maps.k, *mv = &maps.v;
                if constexpr (SPARSE) {
                    row = kb < ne ? (int)list[kb] * WG_BK : (kb - ne) * WG_BK;
                    if (kb >= ne) {
                        mk = &maps.kc;
                        mv = &maps.vc;
                    }
                }
                mbar_expect_tx(&k_full[s], KB);
                tma_load_2d(sK + s * KB, mk, hk * D, row, &k_full[s]);
                if constexpr (D == 128) tma_load_2d(sK + s * KB + PANEL_K, mk, hk * D + 64, row, &k_full[s]);
                if (n > 0) mbar_wait(&v_empty[s], (n - 1) & 1);
                mbar_expect_tx(&v_full[s], KB);
                tma_load_2d(sV + s * KB, mv, hk * D, row, &v_full[s]);
                if constexpr (D == 128) tma_load_2d(sV + s * KB + PANEL_K, mv, hk * D + 64, row, &v_full[s]);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int cw = wg - 1, ctid = tid - 128, warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int my_bar = 1 + cw, other_bar = 2 - cw;
    float o[D / 2], s[64];
    uint32_t p[32];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) p[i] = 0;
    fa_rows rs = {-INFINITY, -INFINITY, 0.0f, 0.0f};
    const int row0 = q0 + cw * 64 + warp * 16 + g, row1 = row0 + 8;
    const int rowmin = q0 + cw * 64;
    auto softmax = [&](int kb, float &c0, float &c1) {
        if constexpr (SPARSE) {
            if (kb >= ne) { /* centroids ct·128..: + log2(rows of their tile), −∞ where the tile is exact */
                const int ct = kb - ne;
                const uint32_t *w = maps.bits + ((int64_t)h * maps.nt + blockIdx.x) * maps.ntw + ct * 4;
                const float inv = 1.0f / a.scale_log2;
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const uint32_t word = w[j >> 2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int c = j * 8 + t4 * 2 + e, tile = ct * 128 + c, len = a.Sk - tile * WG_BK;
                        const float b = (word >> (c & 31)) & 1u ? -INFINITY
                                        : len >= WG_BK          ? 7.0f * inv
                                                                : log2f((float)len) * inv;
                        s[4 * j + e] += b;
                        s[4 * j + 2 + e] += b;
                    }
                }
                fa_softmax(s, rs, a, a.scale_log2, 0, true, row0, row1, shift, t4, c0, c1);
                return;
            }
            kb = list[kb];
        }
        const int kbase = kb * WG_BK;
        const bool full = kbase + WG_BK <= a.Sk && (!a.causal || kbase + WG_BK - 1 <= rowmin + shift);
        fa_softmax(s, rs, a, a.scale_log2, kbase, full, row0, row1, shift, t4, c0, c1);
    };
    auto rescale_pack = [&](float c0, float c1) { fa_rescale_pack<D>(o, p, s, c0, c1); };
    /* the shared-memory descriptors once: their low 14 bits are the address / 16, so b bytes further
     * add b / 16 */
    const uint64_t dQ = wg_desc(sQ + cw * 64 * 128, 16, 1024), dK = wg_desc(sK, 16, 1024),
                   dV = wg_desc(sV, PANEL_K, 1024);
    auto issue_s = [&](int kb) {
        const uint64_t dk = dK + (uint64_t)((kb % WG8_STAGES) * (KB >> 4));
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_ss_m64n128(s, dQ + (uint64_t)(((kk >> 2) * PANEL_Q + (kk & 3) * 32) >> 4),
                             dk + (uint64_t)(((kk >> 2) * PANEL_K + (kk & 3) * 32) >> 4), kk > 0);
        wgmma_commit();
    };
    auto issue_pv = [&](int kb) {
        const uint64_t dv = dV + (uint64_t)((kb % WG8_STAGES) * (KB >> 4));
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++) {
            if constexpr (D == 128)
                wgmma_rs_m64n128_tb(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                                    dv + (uint64_t)(kk * 128));
            else
                wgmma_rs_m64n64_tb(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                                   dv + (uint64_t)(kk * 128));
        }
        wgmma_commit();
    };

    if (nkb > 0) {
        float c0, c1;
        mbar_wait(q_full, 0);
        if (cw == 1) named_arrive(other_bar); /* consumer 0 issues first */
        mbar_wait(&k_full[0], 0);
        named_sync(my_bar);
        wgmma_fence();
        issue_s(0);
        if (!(cw == 1 && nkb == 1)) named_arrive(other_bar);
        wgmma_wait0();
        mbar_arrive(&k_empty[0]);
        softmax(0, c0, c1);
        rescale_pack(c0, c1);
        for (int kb = 1; kb < nkb; kb++) {
            const int st = kb % WG8_STAGES, ps = (kb - 1) % WG8_STAGES;
            mbar_wait(&k_full[st], (kb / WG8_STAGES) & 1);
            mbar_wait(&v_full[ps], ((kb - 1) / WG8_STAGES) & 1);
            named_sync(my_bar);
            wgmma_fence();
            issue_s(kb);
            issue_pv(kb - 1);
            if (!(cw == 1 && kb == nkb - 1)) named_arrive(other_bar);
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            mbar_arrive(&k_empty[st]);
            softmax(kb, c0, c1);
            wgmma_wait0();
            mbar_arrive(&v_empty[ps]);
            rescale_pack(c0, c1);
        }
        mbar_wait(&v_full[(nkb - 1) % WG8_STAGES], ((nkb - 1) / WG8_STAGES) & 1);
        wgmma_fence();
        issue_pv(nkb - 1);
        wgmma_wait0();
    }
    fa_store<D>(o, rs, a, h, row0, row1, t4);
#endif
}
#define attn_wgmma8 attn_wgmma8_k<attn_tmaps, false>
#define attn_wgmma8_d64 attn_wgmma8_k<attn_tmaps, false, 64>

#endif

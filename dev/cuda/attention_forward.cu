/* Scratch bench for the attention forward kernel: numbered versions, a float64 validator, a timing table.
 *
 *   nvcc -O3 -arch=sm_90 -DH3_HAVE_WGMMA_ATTN -gencode arch=compute_90a,code=sm_90a -I../../include -I../../src \
 *       -o attention_forward attention_forward.cu && ./attention_forward [S H D]
 *
 * Versions:
 *   1  attn_naive: one block per (row, head), f32 math, scores through shared memory (the portable fallback)
 *   2  attn_fa2<D, 2, 4>: flash forward, mma.sync m16n8k16 bf16, ldmatrix + swizzled smem, cp.async double
 *      buffer, 64 query rows per block. H200: 193 TFLOP/s at S 19412 H 56 D 128 (SDPA 570): L2-bound, each block
 *      re-reads all of K and V for only 64 rows (64 FLOP per byte of K/V).
 *   3  attn_fa2<D, 1, 4>: single-buffered (what a 64 KB-shared-memory GPU gets)
 *   4  attn_fa2<D, 2, 8>: 128 query rows per block, half the K/V traffic
 *   5  attn_fa2<D, 1, 8>
 *   6  attn_wgmma<128> (sm_90a, build with -DH3_HAVE_WGMMA_ATTN -gencode arch=compute_90a,code=sm_90a): wgmma
 *      m64n128k16, 2 warpgroups x 64 rows, K/V tiles of 128 double-buffered by cp.async. H200: 316 TFLOP/s.
 *   7  attn_wgmma7<128>: softmax of block j overlaps P·V of block j-1, K/V triple-buffered, no mask work on
 *      full tiles. H200: 349 TFLOP/s.
 *   8  attn_wgmma8: FA3-style: a TMA producer warp and mbarrier stages, two consumer warpgroups taking turns on the
 *      tensor cores (ping-pong), setmaxnreg 24/240
 * The winner lives in src/cuda/attn_kernels.cuh; this file includes it and keeps the harness. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "cuda/attn_kernels.cuh"
#ifdef H3_HAVE_WGMMA_ATTN
#include "cuda/attn_wgmma.cuh"

/* ---- v6 and v7: the wgmma kernels before the FA3-style one (history; the engine runs v8) ---------------------- */

#ifdef H3_WGMMA_COMPILED
/* Loads rows [row0, row0 + ROWS) of a [S, ld] bf16 matrix (D columns) into the panel layout; rows past `limit` are
 * zero-filled. */
template <int D, int ROWS>
__device__ __forceinline__ void wg_load_tile(unsigned char *tile, const __nv_bfloat16 *g, int64_t ld, int row0,
                                             int limit, int tid, int nthreads) {
    constexpr int CH = D / 8;
    for (int i = tid; i < ROWS * CH; i += nthreads) {
        int r = i / CH, c = i % CH;
        int row = row0 + r;
        int ok = row < limit;
        const __nv_bfloat16 *src = g + (int64_t)(ok ? row : 0) * ld + c * 8;
        int panel = c >> 3, chunk = c & 7;
        cp_async16(tile + panel * ROWS * 128 + r * 128 + ((chunk ^ (r & 7)) << 4), src, ok ? 16 : 0);
    }
}

template <int D> __global__ void __launch_bounds__(256, 1) attn_wgmma(attn_args a) {
#ifndef H3_WGMMA_COMPILED
    __trap();
#else
    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
    unsigned char *base = (unsigned char *)(((uintptr_t)wg_smem_raw + 1023) & ~(uintptr_t)1023);
    constexpr int QB = WG_BQ * D * 2, KB = WG_BK * D * 2;
    unsigned char *sQ = base, *sK = base + QB, *sV = base + QB + 2 * KB;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, hk = h / (a.Hq / a.Hk);
    const int q0 = blockIdx.x * WG_BQ;
    const __nv_bfloat16 *Q = (const __nv_bfloat16 *)a.q + (int64_t)h * D;
    const __nv_bfloat16 *K = (const __nv_bfloat16 *)a.k + (int64_t)hk * D;
    const __nv_bfloat16 *V = (const __nv_bfloat16 *)a.v + (int64_t)hk * D;
    const int shift = a.Sk - a.Sq;
    int kend = a.Sk;
    if (a.causal) {
        kend = q0 + WG_BQ + shift;
        if (kend > a.Sk) kend = a.Sk;
        if (kend < 0) kend = 0;
    }
    const int nkb = (kend + WG_BK - 1) / WG_BK;
    wg_load_tile<D, WG_BQ>(sQ, Q + (int64_t)q0 * a.ldq, a.ldq, 0, a.Sq - q0, tid, 256);
    if (nkb > 0) {
        wg_load_tile<D, WG_BK>(sK, K, a.ldk, 0, a.Sk, tid, 256);
        wg_load_tile<D, WG_BK>(sV, V, a.ldv, 0, a.Sk, tid, 256);
    }
    cp_async_commit();

    float o[64], s[64];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = 0.0f;
    fa_rows rs = {-INFINITY, -INFINITY, 0.0f, 0.0f};
    const int row0 = q0 + wg * 64 + warp * 16 + g, row1 = row0 + 8;

    for (int kb = 0; kb < nkb; kb++) {
        const int buf = kb & 1;
        if (kb + 1 < nkb) {
            wg_load_tile<D, WG_BK>(sK + (buf ^ 1) * KB, K, a.ldk, (kb + 1) * WG_BK, a.Sk, tid, 256);
            wg_load_tile<D, WG_BK>(sV + (buf ^ 1) * KB, V, a.ldv, (kb + 1) * WG_BK, a.Sk, tid, 256);
        }
        cp_async_commit();
        cp_async_wait<1>();
        fence_proxy_async();
        __syncthreads();
        const unsigned char *tK = sK + buf * KB, *tV = sV + buf * KB;
        /* S = Q Kᵀ over D in k16 steps: panel kk/4, 32 bytes per step inside a panel */
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint64_t da = wg_desc(sQ + (kk >> 2) * WG_BQ * 128 + wg * 64 * 128 + (kk & 3) * 32, 16, 1024);
            uint64_t db = wg_desc(tK + (kk >> 2) * WG_BK * 128 + (kk & 3) * 32, 16, 1024);
            wgmma_ss_m64n128(s, da, db, kk > 0);
        }
        wgmma_commit();
        wgmma_wait0();
        float c0, c1;
        const int kbase = kb * WG_BK;
        fa_softmax(s, rs, a, a.scale_log2, kbase, false, row0, row1, shift, t4, c0, c1);
        uint32_t p[32];
        fa_rescale_pack<D>(o, p, s, c0, c1);
        /* O += P V over the 128 keys in k16 steps: A regs from S blocks 2kk, 2kk+1; V step = 16 lines */
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++) {
            uint64_t db = wg_desc(tV + kk * 16 * 128, WG_BK * 128, 1024);
            wgmma_rs_m64n128_tb(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], db);
        }
        wgmma_commit();
        wgmma_wait0();
        __syncthreads();
    }
    cp_async_wait<0>();
    fa_store<D>(o, rs, a, h, row0, row1, t4);
#endif
}

static inline size_t wg_smem_bytes(int D) {
    return (size_t)(WG_BQ + 4 * WG_BK) * D * 2 + 1024;
}


/* v7: the same tiles, with the softmax of block j overlapping the P·V GEMM of block j-1 inside each warpgroup
 * (S_j and PV_{j-1} are issued together; the softmax runs once S_j is done while PV_{j-1} still computes), K/V
 * triple-buffered (block j+1 loads while K_j and V_{j-1} are read), and no masking work on tiles every row sees
 * whole. Exp values stay in the S registers and are packed into the bf16 A fragment after PV_{j-1} has finished
 * reading the previous one. */
#define WG7_STAGES 3

static inline size_t wg7_smem_bytes(int D) {
    return (size_t)(WG_BQ + 2 * WG7_STAGES * WG_BK) * D * 2 + 1024;
}

template <int D> __global__ void __launch_bounds__(256, 1) attn_wgmma7(attn_args a) {
#ifndef H3_WGMMA_COMPILED
    __trap();
#else
    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
    unsigned char *base = (unsigned char *)(((uintptr_t)wg_smem_raw + 1023) & ~(uintptr_t)1023);
    constexpr int QB = WG_BQ * D * 2, KB = WG_BK * D * 2;
    unsigned char *sQ = base, *sK = base + QB, *sV = base + QB + WG7_STAGES * KB;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, hk = h / (a.Hq / a.Hk);
    const int q0 = blockIdx.x * WG_BQ;
    const __nv_bfloat16 *Q = (const __nv_bfloat16 *)a.q + (int64_t)h * D;
    const __nv_bfloat16 *K = (const __nv_bfloat16 *)a.k + (int64_t)hk * D;
    const __nv_bfloat16 *V = (const __nv_bfloat16 *)a.v + (int64_t)hk * D;
    const int shift = a.Sk - a.Sq;
    int kend = a.Sk;
    if (a.causal) {
        kend = q0 + WG_BQ + shift;
        if (kend > a.Sk) kend = a.Sk;
        if (kend < 0) kend = 0;
    }
    const int nkb = (kend + WG_BK - 1) / WG_BK;
    wg_load_tile<D, WG_BQ>(sQ, Q + (int64_t)q0 * a.ldq, a.ldq, 0, a.Sq - q0, tid, 256);
    if (nkb > 0) {
        wg_load_tile<D, WG_BK>(sK, K, a.ldk, 0, a.Sk, tid, 256);
        wg_load_tile<D, WG_BK>(sV, V, a.ldv, 0, a.Sk, tid, 256);
    }
    cp_async_commit();

    float o[64], s[64];
    uint32_t p[32];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) p[i] = 0;
    fa_rows rs = {-INFINITY, -INFINITY, 0.0f, 0.0f};
    const int row0 = q0 + wg * 64 + warp * 16 + g, row1 = row0 + 8;
    const int rowmin = q0; /* the smallest row of the block: sees the fewest keys */
    auto softmax = [&](int kb, float &c0, float &c1) {
        const int kbase = kb * WG_BK;
        const bool full = kbase + WG_BK <= a.Sk && (!a.causal || kbase + WG_BK - 1 <= rowmin + shift);
        fa_softmax(s, rs, a, a.scale_log2, kbase, full, row0, row1, shift, t4, c0, c1);
    };
    auto rescale_pack = [&](float c0, float c1) { fa_rescale_pack<D>(o, p, s, c0, c1); };
    auto issue_s = [&](int kb) {
        const unsigned char *tK = sK + (kb % WG7_STAGES) * KB;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint64_t da = wg_desc(sQ + (kk >> 2) * WG_BQ * 128 + wg * 64 * 128 + (kk & 3) * 32, 16, 1024);
            uint64_t db = wg_desc(tK + (kk >> 2) * WG_BK * 128 + (kk & 3) * 32, 16, 1024);
            wgmma_ss_m64n128(s, da, db, kk > 0);
        }
        wgmma_commit();
    };
    auto issue_pv = [&](int kb) {
        const unsigned char *tV = sV + (kb % WG7_STAGES) * KB;
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++) {
            uint64_t db = wg_desc(tV + kk * 16 * 128, WG_BK * 128, 1024);
            wgmma_rs_m64n128_tb(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], db);
        }
        wgmma_commit();
    };
    auto next_loads = [&](int kb) { /* group kb+1, then wait for group kb and make it visible to wgmma */
        if (kb + 1 < nkb) {
            const int nb = (kb + 1) % WG7_STAGES;
            wg_load_tile<D, WG_BK>(sK + nb * KB, K, a.ldk, (kb + 1) * WG_BK, a.Sk, tid, 256);
            wg_load_tile<D, WG_BK>(sV + nb * KB, V, a.ldv, (kb + 1) * WG_BK, a.Sk, tid, 256);
        }
        cp_async_commit();
        cp_async_wait<1>();
        fence_proxy_async();
        __syncthreads();
    };

    if (nkb > 0) {
        float c0, c1;
        next_loads(0);
        wgmma_fence();
        issue_s(0);
        wgmma_wait0();
        softmax(0, c0, c1);
        rescale_pack(c0, c1);
        for (int kb = 1; kb < nkb; kb++) {
            next_loads(kb);
            wgmma_fence();
            issue_s(kb);
            issue_pv(kb - 1);
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            softmax(kb, c0, c1);
            wgmma_wait0(); /* PV_{kb-1} done: O may be rescaled and the A fragment rewritten */
            rescale_pack(c0, c1);
            __syncthreads(); /* every warpgroup is done with V_{kb-1}: its buffer may be refilled */
        }
        wgmma_fence();
        issue_pv(nkb - 1);
        wgmma_wait0();
    }
    cp_async_wait<0>();
    fa_store<D>(o, rs, a, h, row0, row1, t4);
#endif
}

#else
template <int D> __global__ void attn_wgmma(attn_args) {}
template <int D> __global__ void attn_wgmma7(attn_args) {}
static inline size_t wg_smem_bytes(int D) { return (size_t)(WG_BQ + 4 * WG_BK) * D * 2 + 1024; }
static inline size_t wg7_smem_bytes(int D) { return (size_t)(WG_BQ + 2 * 3 * WG_BK) * D * 2 + 1024; }
#endif
template <int D> static void launch_wgmma(const attn_args &a) {
    size_t smem = wg_smem_bytes(D);
    cudaFuncSetAttribute(attn_wgmma<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    attn_wgmma<D><<<dim3((a.Sq + WG_BQ - 1) / WG_BQ, a.Hq), 256, smem>>>(a);
}
static void launch_wgmma8(const attn_args &a) {
    attn_tmaps maps;
    int r = attn_make_tmaps(&maps, &a);
    if (r) {
        fprintf(stderr, "tensor maps failed: %d\n", r);
        exit(1);
    }
    size_t smem = wg8_smem_bytes();
    cudaFuncSetAttribute(attn_wgmma8, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    attn_wgmma8<<<dim3((a.Sq + WG_BQ - 1) / WG_BQ, a.Hq), 384, smem>>>(maps, a);
}
template <int D> static void launch_wgmma7(const attn_args &a) {
    size_t smem = wg7_smem_bytes(D);
    cudaFuncSetAttribute(attn_wgmma7<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    attn_wgmma7<D><<<dim3((a.Sq + WG_BQ - 1) / WG_BQ, a.Hq), 256, smem>>>(a);
}
#endif

#define CK(x)                                                                                                    \
    do {                                                                                                         \
        cudaError_t e = (x);                                                                                     \
        if (e != cudaSuccess) {                                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));                  \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

static unsigned long long g_rng = 88172645463325252ull;
static float frand() {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

template <int D, int ST, int W> static void launch_fa(const attn_args &a) {
    size_t smem = (size_t)(W * 16 + 2 * FA_BK * ST) * D * 2;
    cudaFuncSetAttribute(attn_fa2<D, ST, W>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    attn_fa2<D, ST, W><<<dim3((a.Sq + W * 16 - 1) / (W * 16), a.Hq), W * 32, smem>>>(a);
}

template <int D> static void launch_d(int version, const attn_args &a) {
    switch (version) {
        case 2: launch_fa<D, 2, 4>(a); break;
        case 3: launch_fa<D, 1, 4>(a); break;
        case 4: launch_fa<D, 2, 8>(a); break;
        case 5: launch_fa<D, 1, 8>(a); break;
#ifdef H3_HAVE_WGMMA_ATTN
        case 6:
            if (D == 128) launch_wgmma<128>(a);
            break;
        case 7:
            if (D == 128) launch_wgmma7<128>(a);
            break;
        case 8:
            if (D == 128) launch_wgmma8(a);
            break;
#endif
        default: break;
    }
}

static void launch(int version, int D, const attn_args &a) {
    if (version == 1) attn_naive<<<dim3(a.Sq, a.Hq), 128>>>(a, D);
    else if (D == 128) launch_d<128>(version, a);
    else launch_d<64>(version, a);
    CK(cudaGetLastError());
}

/* float64 reference for head h, rows [0, nrows) */
static double validate(int version, int S, int H, int D, int causal) {
    size_t n = (size_t)S * H * D;
    std::vector<__nv_bfloat16> hq(n), hk(n), hv(n), ho(n);
    for (size_t i = 0; i < n; i++) {
        hq[i] = __float2bfloat16(frand());
        hk[i] = __float2bfloat16(frand());
        hv[i] = __float2bfloat16(frand());
    }
    __nv_bfloat16 *q, *k, *v, *o;
    CK(cudaMalloc(&q, n * 2));
    CK(cudaMalloc(&k, n * 2));
    CK(cudaMalloc(&v, n * 2));
    CK(cudaMalloc(&o, n * 2));
    CK(cudaMemcpy(q, hq.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, hk.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, hv.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(o, 0xff, n * 2)); /* poison: NaN bf16 */
    attn_args a = {q, k, v, o, (int64_t)H * D, (int64_t)H * D, (int64_t)H * D, (int64_t)H * D, S, S, H, H,
                   (float)(1.4426950408889634 / sqrt((double)D)), causal, 1};
    launch(version, D, a);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(ho.data(), o, n * 2, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    std::vector<double> p(S);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < S; i++) {
            int lim = causal ? i + 1 : S;
            double m = -1e300, sum = 0;
            for (int j = 0; j < lim; j++) {
                double d = 0;
                for (int c = 0; c < D; c++)
                    d += (double)__bfloat162float(hq[((size_t)i * H + h) * D + c]) *
                         __bfloat162float(hk[((size_t)j * H + h) * D + c]);
                p[j] = d / sqrt((double)D);
                m = fmax(m, p[j]);
            }
            for (int j = 0; j < lim; j++) sum += (p[j] = exp(p[j] - m));
            for (int c = 0; c < D; c++) {
                double acc = 0;
                for (int j = 0; j < lim; j++) acc += p[j] * __bfloat162float(hv[((size_t)j * H + h) * D + c]);
                double ref = acc / sum, got = __bfloat162float(ho[((size_t)i * H + h) * D + c]);
                if (isnan(got)) return INFINITY;
                num += (got - ref) * (got - ref);
                den += ref * ref;
            }
        }
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(o);
    return sqrt(num / den);
}

static double bench(int version, int S, int H, int D, int causal, int reps) {
    size_t n = (size_t)S * H * D;
    __nv_bfloat16 *q, *k, *v, *o;
    CK(cudaMalloc(&q, n * 2));
    CK(cudaMalloc(&k, n * 2));
    CK(cudaMalloc(&v, n * 2));
    CK(cudaMalloc(&o, n * 2));
    std::vector<__nv_bfloat16> h(n);
    for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(frand());
    CK(cudaMemcpy(q, h.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, h.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, h.data(), n * 2, cudaMemcpyHostToDevice));
    attn_args a = {q, k, v, o, (int64_t)H * D, (int64_t)H * D, (int64_t)H * D, (int64_t)H * D, S, S, H, H,
                   (float)(1.4426950408889634 / sqrt((double)D)), causal, 1};
    launch(version, D, a); /* warm-up */
    CK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> t(reps);
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(e0);
        launch(version, D, a);
        cudaEventRecord(e1);
        CK(cudaEventSynchronize(e1));
        cudaEventElapsedTime(&t[r], e0, e1);
    }
    std::sort(t.begin(), t.end());
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(o);
    return t[reps / 2];
}


int main(int argc, char **argv) {
    int S = argc > 1 ? atoi(argv[1]) : 19412, H = argc > 2 ? atoi(argv[2]) : 56, D = argc > 3 ? atoi(argv[3]) : 128;
    printf("validation (bf16 inputs, float64 reference, relative L2 error):\n");
    int vs[] = {1, 2, 3, 4, 5
#ifdef H3_HAVE_WGMMA_ATTN
                , 6, 7, 8
#endif
    };
    const int nv = (int)(sizeof vs / sizeof vs[0]);
    int bad = 0;
    for (int vi = 0; vi < nv; vi++)
        for (int d = (vs[vi] >= 6 ? 128 : 64); d <= 128; d += 64)
            for (int c = 0; c < 2; c++) {
                double e = validate(vs[vi], 333, 3, d, c);
                printf("  v%d D%d causal%d: %.2e %s\n", vs[vi], d, c, e, e < 1e-2 ? "ok" : "FAIL");
                bad += !(e < 1e-2);
            }
    printf("\nbenchmark S %d H %d D %d (median of 5, TFLOP/s = 4*S^2*H*D / t):\n", S, H, D);
    printf("%-8s %-7s %10s %10s\n", "version", "causal", "ms", "TFLOP/s");
    for (int vi = 1; vi < nv; vi++)
        for (int c = 0; c < 2; c++) {
            double ms = bench(vs[vi], S, H, D, c, 5);
            double fl = 4.0 * S * (double)S * H * D / (c ? 2 : 1);
            printf("v%-7d %-7d %10.3f %10.1f\n", vs[vi], c, ms, fl / (ms * 1e-3) * 1e-12);
        }
    return bad ? 1 : 0;
}

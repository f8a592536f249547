/* Attention on the GPU: on Hopper with the sm_90a build the wgmma kernel (attn_sm90a.cu) for bf16 at head_dim 128 and
 * 64; the flash kernel for bf16 (head_dim 64 and 128) on sm_80+; other bf16 head sizes up to 128
 * (Qwen3-VL's vision tower: 72) zero-padded to 64 or 128 in arena scratch (h3_cuda_attention_scratch_bytes) and run
 * there; the plain kernel otherwise. Low-bit attention (H3_ATTN_FP8, H3_ATTN_INT8) quantizes q, k, v into arena
 * scratch first, then runs Hopper's fp8 kernel (attn_sm90a.cu) or attn_mma8 (attn_mma8.cuh) on them.
 * The number of shared-memory stages is chosen from the device's per-block shared-memory limit at first use,
 * so a GPU with less shared memory gets single-buffered tiles instead of failing. */
#include <math.h>
#include <string.h>

#include "cuda/attn_kernels.cuh"
#include "cuda/attn_mma8.cuh"
#include "cuda/cuda_internal.cuh"

#ifdef H3_HAVE_SM90A
extern "C" int cuda_wgmma_probe(h3_cuda_state *s, cudaStream_t st);
extern "C" h3_status cuda_attention_wgmma(const attn_args *a, int D, cudaStream_t st);
extern "C" h3_status cuda_attention_wgmma_fp8(const attn_args *a, cudaStream_t st);
extern "C" h3_status cuda_attention_sparse_sm90a(h3_cuda_state *s, const attn_args *a, const uint8_t *exact_tiles,
                                                 double tau, int64_t *n_exact, cudaStream_t st);
#endif

/* 1 when the Hopper kernel runs on this GPU; -1 before the first attention call probes it. */
static int g_wgmma = -1;

static int wgmma_available(h3_cuda_state *s, cudaStream_t st) {
    if (g_wgmma < 0) {
#ifdef H3_HAVE_SM90A
        g_wgmma = cuda_wgmma_probe(s, st);
#else
        g_wgmma = 0;
#endif
        H3_DEBUG("cuda: attention runs %s", g_wgmma ? "the wgmma kernel (sm_90a)" : "the mma.sync flash kernel");
    }
    return g_wgmma;
}

#define FA_WARPS 8 /* 128 query rows per block: half the K/V traffic of 64 */

static size_t fa_smem(int D, int stages) { /* h3_cuda_flash_smem: the chooser's arithmetic */
    static_assert(FA_WARPS * 16 == 128 && FA_BK == 64, "h3_cuda_flash_smem assumes 128 query rows, 64-row K/V tiles");
    return (size_t)h3_cuda_flash_smem(D, stages);
}

template <int D, int STAGES> static h3_status launch_stages(const attn_args &a, cudaStream_t st) {
    static int configured = 0;
    size_t smem = fa_smem(D, STAGES);
    if (!configured) {
        CU_TRY(cudaFuncSetAttribute(attn_fa2<D, STAGES, FA_WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
        configured = 1;
    }
    dim3 grid((unsigned)((a.Sq + FA_WARPS * 16 - 1) / (FA_WARPS * 16)), (unsigned)a.Hq);
    attn_fa2<D, STAGES, FA_WARPS><<<grid, FA_WARPS * 32, smem, st>>>(a);
    CU_LAUNCHED("attention (flash)");
    return H3_OK;
}

/* The chosen kernel (h3_cuda_attn_choose) on arguments of head size 64 or 128 (padded where needed). */
static h3_status run_chosen(const h3_attn_choice &ch, const attn_args &a, int D, cudaStream_t st) {
#ifdef H3_HAVE_SM90A
    if (ch.kernel == H3_ATTN_K_WGMMA) return cuda_attention_wgmma(&a, D, st);
#endif
    if (ch.kernel == H3_ATTN_K_FLASH) {
        if (D == 128) return ch.stages == 2 ? launch_stages<128, 2>(a, st) : launch_stages<128, 1>(a, st);
        return ch.stages == 2 ? launch_stages<64, 2>(a, st) : launch_stages<64, 1>(a, st);
    }
    return H3_ERR(H3_ERR_INTERNAL, "attention: kernel %d was chosen but is not in this build", (int)ch.kernel);
}

/* Rows [rows, H, D] of ld elements a row (bf16 bits) into [rows, H, P] contiguous, the head's last P − D values 0. */
__global__ void k_attn_pad(uint16_t *dst, const uint16_t *src, int64_t rows, int H, int D, int P, int64_t ld) {
    const int64_t n = rows * H * P;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % P);
        const int64_t rh = i / P, r = rh / H, h = rh % H;
        dst[i] = d < D ? src[r * ld + h * D + d] : (uint16_t)0;
    }
}
/* The reverse: [rows, H, P] -> rows [rows, H, D] of ld elements. */
__global__ void k_attn_unpad(uint16_t *dst, const uint16_t *src, int64_t rows, int H, int D, int P, int64_t ld) {
    const int64_t n = rows * H * D;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(i % D);
        const int64_t rh = i / D, r = rh / H, h = rh % H;
        dst[r * ld + h * D + d] = src[rh * P + d];
    }
}

/* ---- fp8 attention's v (docs/CUDA.md "fp8 attention")
 * ------------------------------------------------------- */

__device__ __forceinline__ float bf16_bits(uint32_t w, int hi) {
    return __uint_as_float(hi ? (w & 0xffff0000u) : (w << 16));
}

/* The maximum of m over the 256 threads of a block, in every thread. */
__device__ __forceinline__ float block256_max(float m) {
    __shared__ float red[8];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int w = 1; w < 8; w++) m = fmaxf(m, red[w]);
    return m;
}

/* v [Sk, Hk, 128] (bf16) into vt [Hk·128, ldt] e4m3, transposed, each 32-key slice in attn_fp8_key's order,
 * keys past Sk zero; vs [Hk·128] the channels' scales. Grid (ldt/64, Hk), 256 threads. */
__global__ void k_attn_fp8_vt(uint8_t *vt, int64_t ldt, float *vs, const unsigned *amax, const uint16_t *v,
                              int Sk, int64_t ld) {
    const int h = blockIdx.y, k0 = blockIdx.x * 64, tid = threadIdx.x;
    __shared__ uint8_t tile[128][64 + 4];
    __shared__ float inv[128];
    if (tid < 128) {
        const float m = __uint_as_float(amax[h * 128 + tid]);
        inv[tid] = m > 0.0f ? 448.0f / m : 1.0f;
        if (blockIdx.x == 0) vs[h * 128 + tid] = m > 0.0f ? m / 448.0f : 1.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int i = tid + 256 * k, r = i / 16, c = (i % 16) * 8;
        uint4 x =
            k0 + r < Sk ? *(const uint4 *)(v + (int64_t)(k0 + r) * ld + h * 128 + c) : make_uint4(0, 0, 0, 0);
        const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float f = bf16_bits(w[e / 2], e & 1) * inv[c + e];
            tile[c + e][r] = (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
        }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int w = tid + 256 * k, d = w / 16, c = (w % 16) * 4;
        uint32_t out = 0;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = c + e, key = (col & 32) + attn_fp8_key(col & 31);
            out |= (uint32_t)tile[d][key] << (8 * e);
        }
        *(uint32_t *)(vt + (int64_t)(h * 128 + d) * ldt + k0 + c) = out;
    }
}

static unsigned pad_grid(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b > 65535 * 8 ? 65535 * 8 : b < 1 ? 1 : b);
}

/* ---- q and k in int8 (both low-bit modes: docs/CUDA.md "fp8 attention", "int8 attention")
 * ------------------------------ */

/* One read of k and v for both low-bit modes: Σ k per (head, channel) over all keys into sum, and max|v| per (head,
 * channel) as f32 bits into amax (non-negative floats order as unsigned integers); both zeroed first. Grid
 * (⌈Sk/256⌉, Hk), 256 threads: 16 a row (8 channels each, 16-byte loads), 16 rows at a time, then the 16 row groups
 * reduced in shared memory and one atomic per channel and block. */
__global__ void k_attn_kv_stats(float *sum, unsigned *amax, const uint16_t *k, const uint16_t *v, int Sk,
                                int64_t ldk, int64_t ldv) {
    const int h = blockIdx.y, tid = threadIdx.x, c = (tid % 16) * 8, r0 = blockIdx.x * 256;
    const int r1 = r0 + 256 < Sk ? r0 + 256 : Sk;
    float t[8] = {0, 0, 0, 0, 0, 0, 0, 0}, m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int r = r0 + tid / 16; r < r1; r += 16) {
        const uint4 kx = *(const uint4 *)(k + (int64_t)r * ldk + h * 128 + c);
        const uint4 vx = *(const uint4 *)(v + (int64_t)r * ldv + h * 128 + c);
        const uint32_t kw[4] = {kx.x, kx.y, kx.z, kx.w}, vw[4] = {vx.x, vx.y, vx.z, vx.w};
#pragma unroll
        for (int e = 0; e < 8; e++) {
            t[e] += bf16_bits(kw[e / 2], e & 1);
            m[e] = fmaxf(m[e], fabsf(bf16_bits(vw[e / 2], e & 1)));
        }
    }
    __shared__ float st[16][128], sm[16][128];
#pragma unroll
    for (int e = 0; e < 8; e++) {
        st[tid / 16][c + e] = t[e];
        sm[tid / 16][c + e] = m[e];
    }
    __syncthreads();
    if (tid < 128) {
        float a = 0.0f, b = 0.0f;
        for (int g = 0; g < 16; g++) {
            a += st[g][tid];
            b = fmaxf(b, sm[g][tid]);
        }
        atomicAdd(&sum[h * 128 + tid], a);
        atomicMax(&amax[h * 128 + tid], __float_as_uint(b));
    }
}

/* Rows [S, H, 128] (bf16, ld elements a row), less mean = sum / S per channel when sum is given, into int8 [S, H·128]
 * with one scale per (head, R rows): scale = max|x| / 127 (1 when 0), x8 = rn(x · (127 / max|x|)). R is 128 (fp8)
 * or 64 (int8). Grid (⌈S/R⌉, H), 256 threads. */
template <int R>
__global__ void k_attn_int8_rows(int8_t *dst, float *scales, const uint16_t *src, int S, int64_t ld,
                                 const float *sum) {
    const int b = blockIdx.x, h = blockIdx.y, H = gridDim.y, tid = threadIdx.x;
    const int c = (tid % 16) * 8; /* each thread: 8 channels of R/16 rows */
    float mean[8], x[R / 16][8];
#pragma unroll
    for (int e = 0; e < 8; e++) mean[e] = sum ? sum[h * 128 + c + e] / (float)S : 0.0f;
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < R / 16; k++) {
        const int r = b * R + tid / 16 + 16 * k;
        const uint4 v = r < S ? *(const uint4 *)(src + (int64_t)r * ld + h * 128 + c) : make_uint4(0, 0, 0, 0);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 8; e++) {
            x[k][e] = r < S ? bf16_bits(w[e / 2], e & 1) - mean[e] : 0.0f;
            m = fmaxf(m, fabsf(x[k][e]));
        }
    }
    m = block256_max(m);
    const float inv = m > 0.0f ? 127.0f / m : 1.0f;
    if (tid == 0) scales[(int64_t)h * gridDim.x + b] = m > 0.0f ? m / 127.0f : 1.0f;
#pragma unroll
    for (int k = 0; k < R / 16; k++) {
        const int r = b * R + tid / 16 + 16 * k;
        if (r >= S) continue;
        uint32_t out[2] = {0, 0};
#pragma unroll
        for (int e = 0; e < 8; e++) {
            int q = __float2int_rn(x[k][e] * inv);
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            out[e / 4] |= (uint32_t)(q & 0xff) << (8 * (e % 4));
        }
        *(uint2 *)(dst + (int64_t)r * H * 128 + h * 128 + c) = make_uint2(out[0], out[1]);
    }
}

/* v [Sk, Hk, 128] (bf16) into f16 [Sk, Hk·128] as v · (256 / max|v|) per (head, channel); vs [Hk·128] = max|v| / 256
 * (1 when 0). amax as k_attn_kv_stats leaves it. Grid-stride over groups of 8 channels. */
__global__ void k_attn_int8_v(__half *dst, float *vs, const unsigned *amax, const uint16_t *v, int Sk, int Hk,
                              int64_t ld) {
    const int64_t n = (int64_t)Sk * Hk * 16;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / (Hk * 16);
        const int hc = (int)(i % (Hk * 16)) * 8; /* h·128 + c */
        const uint4 x = *(const uint4 *)(v + r * ld + hc);
        const uint32_t w[4] = {x.x, x.y, x.z, x.w};
        uint32_t out[4];
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
            const float m0 = __uint_as_float(amax[hc + e]), m1 = __uint_as_float(amax[hc + e + 1]);
            const float a = bf16_bits(w[e / 2], 0) * (m0 > 0.0f ? 256.0f / m0 : 1.0f);
            const float b = bf16_bits(w[e / 2], 1) * (m1 > 0.0f ? 256.0f / m1 : 1.0f);
            __half2 hh = __floats2half2_rn(a, b);
            out[e / 2] = *(uint32_t *)&hh;
        }
        *(uint4 *)(dst + r * Hk * 128 + hc) = make_uint4(out[0], out[1], out[2], out[3]);
        if (r == 0)
            for (int e = 0; e < 8; e++) {
                const float m = __uint_as_float(amax[hc + e]);
                vs[hc + e] = m > 0.0f ? m / 256.0f : 1.0f;
            }
    }
}

static int g_prefer_mma8 = 0;
extern "C" void h3_cuda_attention_prefer_mma8(int on) {
    g_prefer_mma8 = on != 0;
}

extern "C" unsigned h3_cuda_attention_ref_flags(h3_exec *ex, unsigned flags) {
    h3_cuda_state *s = cuda_state(ex);
    flags &= ~H3_ATTN_FP8_K192;
    if (!(flags & H3_ATTN_FP8)) return flags;
    const int sm90a = g_prefer_mma8 ? 0 : wgmma_available(s, cuda_stream(ex));
    const h3_attn_choice ch =
        h3_cuda_attn_choose(s->prop.major, s->prop.minor, s->attn_smem_limit, sm90a, H3_BF16, 128, 1, flags);
    return ch.kblock == 192 ? flags | H3_ATTN_FP8_K192 : flags;
}

template <int MODE, int STAGES> static h3_status launch_mma8(const attn_args &a, cudaStream_t st) {
    static int configured = 0;
    const int smem = mma8_smem<MODE>(STAGES);
    if (!configured) {
        CU_TRY(cudaFuncSetAttribute(attn_mma8<MODE, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        configured = 1;
    }
    attn_mma8<MODE, STAGES><<<dim3((unsigned)((a.Sq + MMA8_BQ - 1) / MMA8_BQ), (unsigned)a.Hq), MMA8_WARPS * 32, smem,
                              st>>>(a);
    CU_LAUNCHED(MODE == MMA8_FP8 ? "attention (fp8 mma.sync)" : "attention (int8 mma.sync)");
    return H3_OK;
}

/* H3_ATTN_FP8 and H3_ATTN_INT8 (where a kernel was chosen): q, k, v quantized into arena scratch
 * (h3_cuda_attention_lowbit_scratch_bytes), then the chosen kernel. */
static h3_status attention_lowbit(h3_cuda_state *s, h3_exec *ex, const attn_args *a, const h3_tensor *q, int D,
                                  const h3_attn_choice &ch, unsigned flags) {
    static_assert(mma8_smem<MMA8_FP8>(2) == 64 * 128 + 2 * (128 * 128 + 128 * 128) &&
                      mma8_smem<MMA8_INT8>(2) == 64 * 128 + 2 * (64 * 128 + 64 * 128 * 2),
                  "h3_cuda_mma8_smem restates mma8_smem");
    const int fp8 = (flags & H3_ATTN_FP8) != 0;
    if (ch.kernel != H3_ATTN_K_WGMMA_FP8 && ch.kernel != H3_ATTN_K_MMA_FP8 && ch.kernel != H3_ATTN_K_MMA_INT8)
        return H3_ERR(H3_ERR_UNSUPPORTED,
                      "%s attention needs %s and bf16 q, k, v of head size 128 (got %s, head size %d, compute "
                      "capability %d.%d): use --attention bf16",
                      fp8 ? "fp8" : "int8",
                      fp8 ? "a GPU of compute capability 8.9 or later (Ada, Hopper, Blackwell)"
                          : "a GPU of compute capability 7.5 or later (Turing onwards)",
                      h3_dtype_name(q->dtype), D, s->prop.major, s->prop.minor);
    cudaStream_t st = cuda_stream(ex);
    const int blk = fp8 ? 128 : 64, kblk = ch.kblock; /* query rows and keys a scale block */
    const int64_t nqb = (a->Sq + blk - 1) / blk, nkb = (a->Sk + kblk - 1) / kblk, ldt = nkb * kblk;
    const size_t bytes = (size_t)h3_cuda_attention_lowbit_scratch_bytes(flags, a->Sq, a->Sk, a->Hq, a->Hk);
    char *buf = (char *)cuda_arena_alloc(s, bytes);
    if (!buf)
        return h3_error_wrap(H3_ERR_NOMEM, "op 'attention' on the device (%s): %.1f MiB of quantized q, k, v",
                             fp8 ? "fp8" : "int8", bytes / 1048576.0);
    size_t off = 0;
    auto take = [&](size_t n) {
        char *p = buf + off;
        off += (n + 255) / 256 * 256;
        return p;
    };
    uint8_t *q8 = (uint8_t *)take((size_t)a->Sq * a->Hq * 128), *k8 = (uint8_t *)take((size_t)a->Sk * a->Hk * 128);
    void *vq = take(fp8 ? (size_t)a->Hk * 128 * ldt : (size_t)a->Sk * a->Hk * 128 * 2);
    float *qs = (float *)take((size_t)a->Hq * nqb * 4), *ks = (float *)take((size_t)a->Hk * nkb * 4);
    float *vs = (float *)take((size_t)a->Hk * 128 * 4);
    unsigned *vamax = (unsigned *)take((size_t)a->Hk * 128 * 4);
    float *ksum = (float *)take((size_t)a->Hk * 128 * 4);
    h3_status r = H3_OK;
    if (cudaMemsetAsync(vamax, 0, (size_t)a->Hk * 128 * 4, st) != cudaSuccess ||
        cudaMemsetAsync(ksum, 0, (size_t)a->Hk * 128 * 4, st) != cudaSuccess)
        r = H3_ERR(H3_ERR_DEVICE, "attention (%s): clearing its scales failed", fp8 ? "fp8" : "int8");
    if (r == H3_OK) {
        const uint16_t *qv = (const uint16_t *)a->q, *kv = (const uint16_t *)a->k, *vv = (const uint16_t *)a->v;
        const dim3 sk_grid((unsigned)((a->Sk + 255) / 256), (unsigned)a->Hk);
        k_attn_kv_stats<<<sk_grid, 256, 0, st>>>(ksum, vamax, kv, vv, a->Sk, a->ldk, a->ldv);
        const dim3 qg((unsigned)nqb, (unsigned)a->Hq), kg((unsigned)nkb, (unsigned)a->Hk);
        if (fp8) {
            k_attn_int8_rows<128><<<qg, 256, 0, st>>>((int8_t *)q8, qs, qv, a->Sq, a->ldq, NULL);
            if (kblk == 192)
                k_attn_int8_rows<192><<<kg, 256, 0, st>>>((int8_t *)k8, ks, kv, a->Sk, a->ldk, ksum);
            else
                k_attn_int8_rows<128><<<kg, 256, 0, st>>>((int8_t *)k8, ks, kv, a->Sk, a->ldk, ksum);
            k_attn_fp8_vt<<<dim3((unsigned)(ldt / 64), (unsigned)a->Hk), 256, 0, st>>>((uint8_t *)vq, ldt, vs, vamax,
                                                                                      vv, a->Sk, a->ldv);
        } else {
            k_attn_int8_rows<64><<<qg, 256, 0, st>>>((int8_t *)q8, qs, qv, a->Sq, a->ldq, NULL);
            k_attn_int8_rows<64><<<kg, 256, 0, st>>>((int8_t *)k8, ks, kv, a->Sk, a->ldk, ksum);
            k_attn_int8_v<<<pad_grid((int64_t)a->Sk * a->Hk * 16), 256, 0, st>>>((__half *)vq, vs, vamax, vv, a->Sk,
                                                                                a->Hk, a->ldv);
        }
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            r = H3_ERR(H3_ERR_DEVICE, "attention (%s): quantizing q, k, v failed to launch: %s", fp8 ? "fp8" : "int8",
                       cudaGetErrorString(e));
    }
    if (r == H3_OK) {
        attn_args b = *a;
        b.q = q8;
        b.k = k8;
        b.v = vq;
        b.ldq = (int64_t)a->Hq * 128;
        b.ldk = (int64_t)a->Hk * 128;
        b.ldv = fp8 ? ldt : (int64_t)a->Hk * 128;
        b.qs = qs;
        b.ks = ks;
        b.vs = vs;
        if (ch.kernel == H3_ATTN_K_WGMMA_FP8) {
#ifdef H3_HAVE_SM90A
            r = cuda_attention_wgmma_fp8(&b, st);
#else
            r = H3_ERR(H3_ERR_INTERNAL, "attention: the Hopper fp8 kernel was chosen but is not in this build");
#endif
        } else if (ch.kernel == H3_ATTN_K_MMA_FP8)
            r = ch.stages == 2 ? launch_mma8<MMA8_FP8, 2>(b, st) : launch_mma8<MMA8_FP8, 1>(b, st);
        else
            r = ch.stages == 2 ? launch_mma8<MMA8_INT8, 2>(b, st) : launch_mma8<MMA8_INT8, 1>(b, st);
    }
    cuda_arena_free(s, buf);
    return r;
}

/* The kernels' arguments for [S, H, D] tensors of rows with strides (both attention ops). */
static attn_args attn_args_of(h3_tensor *o, const h3_tensor *q, const h3_tensor *k, const h3_tensor *v, float scale,
                              unsigned flags) {
    attn_args a;
    memset(&a, 0, sizeof a);
    a.q = q->data;
    a.k = k->data;
    a.v = v->data;
    a.o = o->data;
    a.ldq = q->stride[0];
    a.ldk = k->stride[0];
    a.ldv = v->stride[0];
    a.ldo = o->stride[0];
    a.Sq = (int)q->shape[0];
    a.Sk = (int)k->shape[0];
    a.Hq = (int)q->shape[1];
    a.Hk = (int)k->shape[1];
    a.scale_log2 = scale * 1.4426950408889634f;
    a.causal = (flags & H3_ATTN_CAUSAL) != 0;
    a.dt = cuda_dt(q->dtype);
    return a;
}

/* Whether q, k, v and o (16-bit elements) start and stride on 16 bytes, as the tiled kernels load them. */
static int attn_aligned(const h3_tensor *o, const h3_tensor *q, const h3_tensor *k, const h3_tensor *v) {
    int aligned = 1;
    const h3_tensor *ts[4] = {q, k, v, o};
    for (int i = 0; i < 4; i++)
        aligned &= ((uintptr_t)ts[i]->data % 16 == 0) && ((ts[i]->stride[0] * 2) % 16 == 0);
    return aligned;
}

extern "C" h3_status cuda_attention(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                                    const h3_tensor *v, float scale, unsigned flags) {
    h3_cuda_state *s = cuda_state(ex);
    H3_TRY(cuda_need_float(H3_OP_ATTENTION, "q", q));
    if (k->dtype != q->dtype || v->dtype != q->dtype || o->dtype != q->dtype)
        return H3_ERR(H3_ERR_INVALID, "op 'attention' on the device needs q, k, v and o of one dtype");
    attn_args a = attn_args_of(o, q, k, v, scale, flags);
    int D = (int)q->shape[2];
    if (a.Sq == 0) return H3_OK;
    const int aligned = attn_aligned(o, q, k, v);
    cudaStream_t st = cuda_stream(ex);
    int sm90a = 0; /* the Hopper kernels' image runs here (the probe also checks sm_90 and the shared memory) */
#ifdef H3_HAVE_SM90A
    sm90a = wgmma_available(s, st);
#else
    (void)wgmma_available;
#endif
    /* no keys: every output row is 0, which the bf16 kernels write without quantizing anything */
    const unsigned lowbit = a.Sk > 0 ? flags & (H3_ATTN_FP8 | H3_ATTN_INT8) : 0u;
    if (!lowbit) flags &= ~(H3_ATTN_FP8 | H3_ATTN_INT8);
    const h3_attn_choice ch = h3_cuda_attn_choose(s->prop.major, s->prop.minor, s->attn_smem_limit,
                                                  lowbit && g_prefer_mma8 ? 0 : sm90a, q->dtype, D, aligned, flags);
    if (lowbit) return attention_lowbit(s, ex, &a, q, D, ch, flags);
    if (ch.kernel == H3_ATTN_K_NONE)
        return H3_ERR(H3_ERR_UNSUPPORTED,
                      "op 'attention' on the device: no kernel for %s at head size %d here (%lld bytes of shared "
                      "memory a block needed for one stage, the device allows %d)",
                      h3_dtype_name(q->dtype), D, (long long)h3_cuda_flash_smem(D <= 64 ? 64 : 128, 1),
                      s->attn_smem_limit);
    if ((ch.kernel == H3_ATTN_K_WGMMA || ch.kernel == H3_ATTN_K_FLASH) && !ch.pad) return run_chosen(ch, a, D, st);
    const int P = ch.pad;
    if (P) { /* another head size: zero-padded to P through arena scratch, then the chosen kernel */
        const size_t bq = (size_t)a.Sq * a.Hq * P * 2, bk = (size_t)a.Sk * a.Hk * P * 2;
        char *buf = (char *)cuda_arena_alloc(s, 2 * bq + 2 * bk);
        if (!buf) h3_clear_error(); /* without room: the plain kernel below */
        if (buf) {
            uint16_t *qp = (uint16_t *)buf, *kp = (uint16_t *)(buf + bq), *vp = (uint16_t *)(buf + bq + bk),
                     *op = (uint16_t *)(buf + bq + 2 * bk);
            k_attn_pad<<<pad_grid((int64_t)a.Sq * a.Hq * P), 256, 0, st>>>(qp, (const uint16_t *)q->data, a.Sq, a.Hq,
                                                                         D, P, a.ldq);
            k_attn_pad<<<pad_grid((int64_t)a.Sk * a.Hk * P), 256, 0, st>>>(kp, (const uint16_t *)k->data, a.Sk, a.Hk,
                                                                         D, P, a.ldk);
            k_attn_pad<<<pad_grid((int64_t)a.Sk * a.Hk * P), 256, 0, st>>>(vp, (const uint16_t *)v->data, a.Sk, a.Hk,
                                                                         D, P, a.ldv);
            h3_status r = H3_OK;
            cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess) r = H3_ERR(H3_ERR_DEVICE, "kernel attention pad failed to launch: %s", cudaGetErrorString(e));
            attn_args b = a; /* the scale stays 1/sqrt(D)·log2(e): the zeros add nothing to q·k */
            b.q = qp;
            b.k = kp;
            b.v = vp;
            b.o = op;
            b.ldq = b.ldo = (int64_t)a.Hq * P;
            b.ldk = b.ldv = (int64_t)a.Hk * P;
            if (r == H3_OK) r = run_chosen(ch, b, P, st);
            if (r == H3_OK) {
                k_attn_unpad<<<pad_grid((int64_t)a.Sq * a.Hq * D), 256, 0, st>>>((uint16_t *)o->data, op, a.Sq, a.Hq,
                                                                                D, P, a.ldo);
                e = cudaGetLastError();
                if (e != cudaSuccess)
                    r = H3_ERR(H3_ERR_DEVICE, "kernel attention unpad failed to launch: %s", cudaGetErrorString(e));
            }
            cuda_arena_free(s, buf);
            return r;
        }
    }
    if (D > 256) return H3_ERR(H3_ERR_UNSUPPORTED, "op 'attention' on the device supports head sizes up to 256");
    dim3 grid((unsigned)a.Sq, (unsigned)a.Hq);
    attn_naive<<<grid, 128, 0, cuda_stream(ex)>>>(a, D);
    CU_LAUNCHED("attention (plain)");
    return H3_OK;
}

/* Block-sparse attention (tensor/ops.h): Hopper's wgmma kernel over bf16 q, k, v of head size 128, 16-byte aligned;
 * H3_ERR_UNSUPPORTED elsewhere. */
extern "C" h3_status cuda_attention_sparse(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                                           const h3_tensor *v, float scale, const h3_sparse_attn *p) {
    h3_cuda_state *s = cuda_state(ex);
    if (q->shape[2] != 128 || q->dtype != H3_BF16 || k->dtype != H3_BF16 || v->dtype != H3_BF16 ||
        o->dtype != H3_BF16 || !attn_aligned(o, q, k, v))
        return H3_ERR(H3_ERR_UNSUPPORTED, "op 'attention_sparse' on the device takes bf16 q, k, v, o of head size 128, "
                                          "16-byte aligned");
    if (q->shape[0] == 0) return H3_OK;
    cudaStream_t st = cuda_stream(ex);
#ifdef H3_HAVE_SM90A
    if (wgmma_available(s, st)) {
        const attn_args a = attn_args_of(o, q, k, v, scale, 0);
        return cuda_attention_sparse_sm90a(s, &a, p->exact_tiles, (double)p->tau, p->n_exact, st);
    }
#else
    (void)s;
    (void)scale;
    (void)p;
    (void)st;
#endif
    return H3_ERR(H3_ERR_UNSUPPORTED, "sparse attention runs on Hopper GPUs (compute capability 9.0) with the sm_90a "
                                      "kernels in the build; this device has none");
}

/* The f32 3-D convolutions as an implicit GEMM on TF32 tensor cores (sm_80 and later): the video VAE
 * encoder's 3x3x3, strided and 1x1x1 convolutions without the im2col columns.
 *
 * y[co, p] = b[co] + Σ_tap Σ_ci W[co, ci, tap] · x[ci, in(p, tap)], p an output position (t, h, w), in(p,
 * tap) its input sample for that tap after the padding (zeros, reflect, replicate), or none. A block computes
 * 128 output channels x 128 positions; its K loop walks the live taps (a tap that only ever reads zero
 * padding, as the two causal taps of a one-frame input, is skipped), and for each tap the input channels 32
 * at a time. Each step stages a 128x32 slice of the weights (transposed once per call to [tap][Cout][Cin],
 * rounded to TF32, in the backend's GEMM scratch) and a 32x128 slice of x gathered by position: a thread owns
 * one position of the block, works out its input sample for the step's tap, and copies that sample from 16
 * input channels (consecutive threads read consecutive positions, so the reads coalesce along rows). Stages
 * are filled with cp.async, three deep where shared memory allows (two otherwise); 8 warps (2 x 4) each
 * multiply 64 channels x 32 positions with mma.sync m16n8k8 TF32 (inputs rounded to nearest, f32 sums). The
 * bias is added as the sums are stored.
 *
 * im2col + cuBLASLt (cuda_eltwise.cu) wrote K = Cin·27 floats for every output position and read them back:
 * 15 GB per convolution of the encoder's first level on a 17-frame 256x256 tile. */
#include <string.h>

#include "cuda/cuda_internal.cuh"

#define IG_BM      128 /* output channels a block */
#define IG_BN      128 /* output positions a block */
#define IG_BK      32  /* input channels a step */
#define IG_NT      256
#define IG_AS      (IG_BK + 4) /* row strides in floats: conflict-free fragment reads */
#define IG_BS      (IG_BN + 8)
#define IG_STAGE   (IG_BM * IG_AS + IG_BK * IG_BS) /* floats */
#define IG_MAXTAPS 27

typedef struct {
    int cin, cout, T, H, W, Ho, Wo, npos;
    int stride[3], pad0[3], mode[3];
    int ntaps;           /* live taps */
    int tap[IG_MAXTAPS]; /* a | c << 8 | d << 16 | (index of the tap in the weight) << 24 */
} ig_geo;

static int g_prefer_im2col; /* h3_cuda_conv3d_prefer_im2col */

extern "C" void h3_cuda_conv3d_prefer_im2col(int on) {
    g_prefer_im2col = on;
}

__device__ __forceinline__ uint32_t ig_smem(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ig_cp16(float *s, const float *g, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(ig_smem(s)), "l"(g), "r"(bytes));
}
__device__ __forceinline__ void ig_cp4(float *s, const float *g, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(ig_smem(s)), "l"(g), "r"(bytes));
}
__device__ __forceinline__ uint32_t ig_tf32(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(f));
    return r;
#else
    return __float_as_uint(f); /* not reached: the host takes this path on sm_80 and later only */
#endif
}

/* wt[tap][co][ci] = tf32(w[co][ci][tap]) */
__global__ void k_conv3d_wt(float *wt, const float *w, int cout, int cin, int taps) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = (int64_t)cout * cin * taps;
    if (i >= n) return;
    const int ci = (int)(i % cin);
    const int64_t r = i / cin;
    const int co = (int)(r % cout), tap = (int)(r / cout);
    wt[i] = __uint_as_float(ig_tf32(w[((int64_t)co * cin + ci) * taps + tap]));
}

template <int STAGES>
__global__ void __launch_bounds__(IG_NT)
    k_conv3d_igemm(float *__restrict__ y, const float *__restrict__ x, const float *__restrict__ wt,
                   const float *__restrict__ bias, ig_geo g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) float sm[];
    __shared__ int taps[IG_MAXTAPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int co0 = blockIdx.y * IG_BM, p0 = blockIdx.x * IG_BN;
    if (tid < g.ntaps) taps[tid] = g.tap[tid];
    /* the position this thread gathers, and the first of its 16 rows (input channels r0, r0 + 2, ...) */
    const int j = tid & (IG_BN - 1), r0 = tid >> 7, pos = p0 + j;
    int to = -1, ho = 0, wo = 0;
    if (pos < g.npos) {
        wo = pos % g.Wo;
        ho = (pos / g.Wo) % g.Ho;
        to = pos / (g.Wo * g.Ho);
    }
    const int64_t sc = (int64_t)g.T * g.H * g.W; /* x's channel stride */
    const int per_tap = g.cin / IG_BK, nk = g.ntaps * per_tap;
    __syncthreads();

    auto load = [&](int k, int stage) {
        const int t = k / per_tap, ci0 = (k - t * per_tap) * IG_BK, tp = taps[t];
        float *As = sm + stage * IG_STAGE, *Bs = As + IG_BM * IG_AS;
        const float *wk = wt + (int64_t)(tp >> 24) * g.cout * g.cin + ci0;
#pragma unroll
        for (int i = 0; i < IG_BM * IG_BK / 4 / IG_NT; i++) {
            const int idx = tid + i * IG_NT, row = idx >> 3, c4 = (idx & 7) * 4, co = co0 + row;
            ig_cp16(As + row * IG_AS + c4, co < g.cout ? wk + (int64_t)co * g.cin + c4 : wt,
                    co < g.cout ? 16 : 0);
        }
        int off = -1;
        if (to >= 0) {
            const int ti = cuda_pad_index(to * g.stride[0] + (tp & 255) - g.pad0[0], g.T, g.mode[0]);
            const int hi =
                ti < 0 ? -1
                       : cuda_pad_index(ho * g.stride[1] + ((tp >> 8) & 255) - g.pad0[1], g.H, g.mode[1]);
            const int wi =
                hi < 0 ? -1
                       : cuda_pad_index(wo * g.stride[2] + ((tp >> 16) & 255) - g.pad0[2], g.W, g.mode[2]);
            if (wi >= 0) off = (ti * g.H + hi) * g.W + wi;
        }
        const float *xs = x + (int64_t)(ci0 + r0) * sc + (off < 0 ? 0 : off);
#pragma unroll
        for (int i = 0; i < IG_BK / 2; i++)
            ig_cp4(Bs + (r0 + 2 * i) * IG_BS + j, off < 0 ? x : xs + 2 * i * sc, off < 0 ? 0 : 4);
    };

    float acc[4][4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[a][b][c] = 0.0f;
    const int wm = warp >> 2, wn = warp & 3, gq = lane >> 2, tq = lane & 3;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load(s, s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int k = 0; k < nk; k++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads();
        const int kn = k + STAGES - 1;
        if (kn < nk) load(kn, kn % STAGES);
        asm volatile("cp.async.commit_group;\n" ::);
        const float *As = sm + (k % STAGES) * IG_STAGE, *Bs = As + IG_BM * IG_AS;
#pragma unroll
        for (int kk = 0; kk < IG_BK; kk += 8) {
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                const float *ap = As + (wm * 64 + mi * 16 + gq) * IG_AS + kk + tq;
                a[mi][0] = __float_as_uint(ap[0]); /* the weights are TF32 already */
                a[mi][1] = __float_as_uint(ap[8 * IG_AS]);
                a[mi][2] = __float_as_uint(ap[4]);
                a[mi][3] = __float_as_uint(ap[8 * IG_AS + 4]);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const float *bp = Bs + (kk + tq) * IG_BS + wn * 32 + ni * 8 + gq;
                b[ni][0] = ig_tf32(bp[0]);
                b[ni][1] = ig_tf32(bp[4 * IG_BS]);
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    float *c = acc[mi][ni];
                    asm volatile(
                        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                        "{%8,%9}, {%0,%1,%2,%3};\n"
                        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                        : "r"(a[mi][0]), "r"(a[mi][1]), "r"(a[mi][2]), "r"(a[mi][3]), "r"(b[ni][0]),
                          "r"(b[ni][1]));
                }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int co = co0 + wm * 64 + mi * 16 + gq + 8 * h;
            if (co >= g.cout) continue;
            const float bv = bias ? bias[co] : 0.0f;
            float *yr = y + (int64_t)co * g.npos;
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int p = p0 + wn * 32 + ni * 8 + 2 * tq;
                if (p < g.npos) yr[p] = acc[mi][ni][2 * h] + bv;
                if (p + 1 < g.npos) yr[p + 1] = acc[mi][ni][2 * h + 1] + bv;
            }
        }
#endif
}

/* Is tap i of k along an axis of n inputs (stride s, padding p before, mode) ever a sample for one of the no
 * outputs? Only zero padding can make it never one. */
static int ig_axis_live(int i, int n, int no, int s, int p, int mode) {
    if (mode != H3_PAD_ZEROS) return 1;
    for (int o = 0; o < no; o++) {
        const int at = o * s + i - p;
        if (at >= 0 && at < n) return 1;
    }
    return 0;
}

h3_status cuda_conv3d_igemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                            const h3_tensor *b, const int stride[3], const int pad0[3], const int mode[3],
                            int *done) {
    *done = 0;
    h3_cuda_state *s = cuda_state(ex);
    const int64_t cout = w->shape[0], cin = w->shape[1], kt = w->shape[2], kh = w->shape[3], kw = w->shape[4];
    const int64_t taps = kt * kh * kw, npos = y->shape[1] * y->shape[2] * y->shape[3];
    const size_t st3 = 3 * (size_t)IG_STAGE * sizeof(float), st2 = 2 * (size_t)IG_STAGE * sizeof(float);
    const size_t optin = (size_t)s->prop.sharedMemPerBlockOptin;
    if (g_prefer_im2col || s->prop.major < 8 || cin % IG_BK || taps > IG_MAXTAPS || kt > 255 || kh > 255 ||
        kw > 255 || npos >= INT32_MAX || h3_tensor_numel(x) / cin >= INT32_MAX || cout > 65535 * IG_BM ||
        optin < st2)
        return H3_OK;
    H3_TRY(h3_cuda_qgemm_reserve(ex));
    if ((size_t)(cout * cin * taps) * sizeof(float) > s->qscratch_size) return H3_OK;
    ig_geo g;
    memset(&g, 0, sizeof g);
    g.cin = (int)cin, g.cout = (int)cout, g.T = (int)x->shape[1], g.H = (int)x->shape[2],
    g.W = (int)x->shape[3];
    g.Ho = (int)y->shape[2], g.Wo = (int)y->shape[3], g.npos = (int)npos;
    for (int a = 0; a < 3; a++) g.stride[a] = stride[a], g.pad0[a] = pad0[a], g.mode[a] = mode[a];
    const int To = (int)y->shape[1];
    for (int a = 0; a < kt; a++)
        for (int c = 0; c < kh; c++)
            for (int d = 0; d < kw; d++)
                if (ig_axis_live(a, g.T, To, stride[0], pad0[0], mode[0]) &&
                    ig_axis_live(c, g.H, g.Ho, stride[1], pad0[1], mode[1]) &&
                    ig_axis_live(d, g.W, g.Wo, stride[2], pad0[2], mode[2]))
                    g.tap[g.ntaps++] = a | c << 8 | d << 16 | (int)((a * kh + c) * kw + d) << 24;
    float *wt = (float *)s->qscratch;
    const int64_t nw = cout * cin * taps;
    k_conv3d_wt<<<(unsigned)((nw + 255) / 256), 256, 0, cuda_stream(ex)>>>(wt, (const float *)w->data,
                                                                           (int)cout, (int)cin, (int)taps);
    CU_LAUNCHED("conv3d weight transpose");
    const dim3 grid((unsigned)((npos + IG_BN - 1) / IG_BN), (unsigned)((cout + IG_BM - 1) / IG_BM));
    const float *bias = b ? (const float *)b->data : NULL;
    if (optin >= st3) {
        CU_TRY(
            cudaFuncSetAttribute(k_conv3d_igemm<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)st3));
        k_conv3d_igemm<3>
            <<<grid, IG_NT, st3, cuda_stream(ex)>>>((float *)y->data, (const float *)x->data, wt, bias, g);
    } else {
        CU_TRY(
            cudaFuncSetAttribute(k_conv3d_igemm<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)st2));
        k_conv3d_igemm<2>
            <<<grid, IG_NT, st2, cuda_stream(ex)>>>((float *)y->data, (const float *)x->data, wt, bias, g);
    }
    CU_LAUNCHED("conv3d implicit GEMM");
    *done = 1;
    return H3_OK;
}

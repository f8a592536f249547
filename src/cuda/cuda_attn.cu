/* Attention on the GPU: the flash kernel for bf16 (head_dim 64 and 128) on sm_80+; other bf16 head sizes up to 128
 * (Qwen3-VL's vision tower: 72) zero-padded to 64 or 128 in arena scratch (h3_cuda_attention_scratch_bytes) and run
 * there; the plain kernel otherwise.
 * The number of shared-memory stages is chosen from the device's per-block shared-memory limit at first use,
 * so a GPU with less shared memory gets single-buffered tiles instead of failing. */
#include <math.h>

#include "cuda/attn_kernels.cuh"
#include "cuda/cuda_internal.cuh"

#ifdef H3_HAVE_SM90A
extern "C" int cuda_wgmma_probe(h3_cuda_state *s, cudaStream_t st);
extern "C" h3_status cuda_attention_wgmma(const attn_args *a, cudaStream_t st);
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

static size_t fa_smem(int D, int stages) {
    return (size_t)(FA_WARPS * 16 + 2 * FA_BK * stages) * D * 2;
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

/* Two shared-memory stages when the device's per-block limit allows, else one (a 64 KB Turing-class limit). */
template <int D> static h3_status launch_fa(h3_cuda_state *s, const attn_args &a, cudaStream_t st) {
    if (fa_smem(D, 2) <= (size_t)s->attn_smem_limit) return launch_stages<D, 2>(a, st);
    if (fa_smem(D, 1) <= (size_t)s->attn_smem_limit) return launch_stages<D, 1>(a, st);
    return H3_ERR(H3_ERR_UNSUPPORTED, "attention: %zu bytes of shared memory per block needed, the device allows %d",
                  fa_smem(D, 1), s->attn_smem_limit);
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

static unsigned pad_grid(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b > 65535 * 8 ? 65535 * 8 : b < 1 ? 1 : b);
}

extern "C" h3_status cuda_attention(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                                    const h3_tensor *v, float scale, unsigned flags) {
    h3_cuda_state *s = cuda_state(ex);
    H3_TRY(cuda_need_float(H3_OP_ATTENTION, "q", q));
    if (k->dtype != q->dtype || v->dtype != q->dtype || o->dtype != q->dtype)
        return H3_ERR(H3_ERR_INVALID, "op 'attention' on the device needs q, k, v and o of one dtype");
    attn_args a;
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
    int D = (int)q->shape[2];
    if (a.Sq == 0) return H3_OK;
    int aligned = 1;
    const h3_tensor *ts[4] = {q, k, v, o};
    for (int i = 0; i < 4; i++)
        aligned &= ((uintptr_t)ts[i]->data % 16 == 0) && ((ts[i]->stride[0] * 2) % 16 == 0);
#ifdef H3_HAVE_SM90A
    if (q->dtype == H3_BF16 && D == 128 && aligned && wgmma_available(s, cuda_stream(ex)))
        return cuda_attention_wgmma(&a, cuda_stream(ex));
#else
    (void)wgmma_available;
#endif
    if (q->dtype == H3_BF16 && (D == 64 || D == 128) && s->prop.major >= 8 && aligned) {
        return D == 128 ? launch_fa<128>(s, a, cuda_stream(ex)) : launch_fa<64>(s, a, cuda_stream(ex));
    }
    const int P = h3_cuda_attention_pad_dim(q->dtype, D);
    if (P && s->prop.major >= 8) { /* another head size: zero-padded to P through arena scratch, the flash kernel */
        const size_t bq = (size_t)a.Sq * a.Hq * P * 2, bk = (size_t)a.Sk * a.Hk * P * 2;
        char *buf = (char *)cuda_arena_alloc(s, 2 * bq + 2 * bk);
        if (buf) { /* (without room: the plain kernel below) */
            cudaStream_t st = cuda_stream(ex);
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
            if (r == H3_OK) {
#ifdef H3_HAVE_SM90A
                if (P == 128 && wgmma_available(s, st))
                    r = cuda_attention_wgmma(&b, st);
                else
#endif
                    r = P == 128 ? launch_fa<128>(s, b, st) : launch_fa<64>(s, b, st);
            }
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

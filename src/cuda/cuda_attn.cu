/* Attention on the GPU: the flash kernel for bf16 (head_dim 64 and 128) on sm_80+, the plain kernel otherwise.
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
    if (D > 256) return H3_ERR(H3_ERR_UNSUPPORTED, "op 'attention' on the device supports head sizes up to 256");
    dim3 grid((unsigned)a.Sq, (unsigned)a.Hq);
    attn_naive<<<grid, 128, 0, cuda_stream(ex)>>>(a, D);
    CU_LAUNCHED("attention (plain)");
    return H3_OK;
}

/* The Hopper attention kernel's launcher and probe, compiled for sm_90a only (see CMakeLists.txt). */
#include "cuda/attn_fp8.cuh"
#include "cuda/cuda_internal.cuh"

static_assert((WG_BQ + 2 * WG8_STAGES * WG_BK) * 128 * 2 + 1024 + 256 == H3_CUDA_WGMMA_SMEM,
              "h3_cuda_attn_choose's figure for the wgmma kernel's shared memory");
static_assert((WG_BQ + 2 * WG8_STAGES * WG_BK) * 128 + 1024 + 256 == H3_CUDA_WGMMA_FP8_SMEM,
              "h3_cuda_attn_choose's figure for the fp8 kernel's shared memory");

/* 1 when this GPU runs the sm_90a image; 0 when it has no image for this GPU or the probe fails. Never fails. */
extern "C" int cuda_wgmma_probe(h3_cuda_state *s, cudaStream_t st) {
    if (s->prop.major != 9 || s->prop.minor != 0 || wg8_smem_bytes() > (size_t)s->attn_smem_limit) return 0;
    int *d = (int *)cuda_arena_alloc(s, sizeof(int)), h = 0;
    if (!d) {
        h3_clear_error();
        return 0;
    }
    attn_wgmma_probe<<<1, 1, 0, st>>>(d);
    int ok = cudaGetLastError() == cudaSuccess &&
             cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, st) == cudaSuccess &&
             cudaStreamSynchronize(st) == cudaSuccess;
    cudaGetLastError();
    cuda_arena_free(s, d);
    return ok && h == 1;
}

/* The FA3-style kernel (attn_wgmma8): tensor maps for Q, K and V are encoded per call (microseconds). */
extern "C" h3_status cuda_attention_wgmma(const attn_args *a, cudaStream_t st) {
    static int configured = 0;
    size_t smem = wg8_smem_bytes();
    if (!configured) {
        CU_TRY(cudaFuncSetAttribute(attn_wgmma8, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = 1;
    }
    attn_tmaps maps;
    int r = attn_make_tmaps(&maps, a);
    if (r) return H3_ERR(H3_ERR_DEVICE, "attention: encoding the TMA tensor maps failed (CUresult %d)", r);
    attn_wgmma8<<<dim3((unsigned)((a->Sq + WG_BQ - 1) / WG_BQ), (unsigned)a->Hq), 384, smem, st>>>(maps, *a);
    CU_LAUNCHED("attention (wgmma)");
    return H3_OK;
}

/* The fp8 kernel (attn_wgmma8_fp8) on operands cuda_attention quantized: q, k [S, H·128] and v transposed. Two
 * K/V stages: three and four measured the same at W124 (13.9-14.2 ms), the kernel being bound by its softmax. */
extern "C" h3_status cuda_attention_wgmma_fp8(const attn_args *a, cudaStream_t st) {
    static int configured = 0;
    const size_t smem = wg8_fp8_smem_bytes();
    if (!configured) {
        CU_TRY(cudaFuncSetAttribute(attn_wgmma8_fp8, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = 1;
    }
    attn_tmaps maps;
    int r = attn_fp8_make_tmaps(&maps, a);
    if (r) return H3_ERR(H3_ERR_DEVICE, "attention (fp8): encoding the TMA tensor maps failed (CUresult %d)", r);
    attn_wgmma8_fp8<<<dim3((unsigned)((a->Sq + WG_BQ - 1) / WG_BQ), (unsigned)a->Hq), 384, smem, st>>>(maps, *a);
    CU_LAUNCHED("attention (fp8 wgmma)");
    return H3_OK;
}

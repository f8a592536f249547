/* The Hopper attention kernel's launcher and probe, compiled for sm_90a only (see CMakeLists.txt). */
#include "cuda/attn_fp8.cuh"
#include "cuda/attn_sparse.cuh"
#include "cuda/cuda_internal.cuh"

static_assert((WG_BQ + 2 * WG8_STAGES * WG_BK) * 128 * 2 + 1024 + 256 == H3_CUDA_WGMMA_SMEM,
              "h3_cuda_attn_choose's figure for the wgmma kernel's shared memory");
static_assert((WG_BQ + 2 * WG8_STAGES * WG_BK) * 64 * 2 + 1024 + 256 == H3_CUDA_WGMMA64_SMEM,
              "h3_cuda_attn_choose's figure for the head-64 wgmma kernel's shared memory");
static_assert((WG_BQ + 2 * WG8_STAGES * FP8_BK) * 128 + FP8_ONES_BYTES + 1024 + 256 + FP8_OH_BYTES ==
                  H3_CUDA_WGMMA_FP8_SMEM,
              "h3_cuda_attn_choose's figure for the fp8 kernel's shared memory");
static_assert(FP8_BK == H3_CUDA_WGMMA_FP8_BK && FP8_BK % 64 == 0,
              "cuda.h's key block for Hopper's fp8 kernel (the quantization's k blocks) is the kernel's tile");

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

/* The FA3-style kernel (attn_wgmma8) at head size D (128, or 64: the video VAE decoder's): tensor maps for Q, K and V
 * are encoded per call (microseconds). */
extern "C" h3_status cuda_attention_wgmma(const attn_args *a, int D, cudaStream_t st) {
    static int configured[2];
    const size_t smem = wg8_smem_bytes(D);
    const int i = D == 64;
    if (D != 64 && D != 128) return H3_ERR(H3_ERR_INTERNAL, "attention (wgmma): head size %d", D);
    if (!configured[i]) {
        CU_TRY(cudaFuncSetAttribute(i ? attn_wgmma8_d64 : attn_wgmma8, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
        configured[i] = 1;
    }
    attn_tmaps maps;
    int r = attn_make_tmaps(&maps, a, D);
    if (r) return H3_ERR(H3_ERR_DEVICE, "attention: encoding the TMA tensor maps failed (CUresult %d)", r);
    const dim3 grid((unsigned)((a->Sq + WG_BQ - 1) / WG_BQ), (unsigned)a->Hq);
    if (i)
        attn_wgmma8_d64<<<grid, 384, smem, st>>>(maps, *a);
    else
        attn_wgmma8<<<grid, 384, smem, st>>>(maps, *a);
    CU_LAUNCHED("attention (wgmma)");
    return H3_OK;
}

/* The fp8 kernel (attn_wgmma8_fp8) on operands cuda_attention quantized: q, k [S, H·128] and v transposed. Two
 * K/V stages: with tiles of 128 keys three and four measured the same at W124 (13.9-14.2 ms), the kernel being bound
 * by its softmax. */
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

/* Block-sparse attention (attn_sparse.cuh) on bf16 q, k, v, o [S, H·128] of a: the selection into arena scratch
 * (h3_cuda_attention_sparse_scratch_bytes), then the sparse instance of the wgmma kernel. exact_tiles: host [nt]
 * bytes or NULL. */
extern "C" h3_status cuda_attention_sparse_sm90a(h3_cuda_state *s, const attn_args *a, const uint8_t *exact_tiles,
                                                 double tau, int64_t *n_exact, cudaStream_t st) {
    static int configured = 0;
    const size_t smem = wg8_smem_bytes();
    if (!configured) {
        CU_TRY(cudaFuncSetAttribute(attn_wgmma8_k<attn_tmaps_sparse, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = 1;
    }
    const int S = a->Sq, H = a->Hq, nt = (S + 127) / 128, ntpad = (nt + 127) / 128 * 128, ntw = ntpad / 32;
    const size_t route_smem = (size_t)(nt + 128) * 8 + (size_t)(ntw + 1) * 4;
    if (nt > 65535 || route_smem > 48 * 1024)
        return H3_ERR(H3_ERR_UNSUPPORTED, "sparse attention: %d rows is more than its selection handles (%d)", S,
                      (48 * 1024 - 128 * 8 - 4) / 9 * 128);
    const size_t bytes = (size_t)h3_cuda_attention_sparse_scratch_bytes(S, H);
    char *buf = (char *)cuda_arena_alloc(s, bytes);
    if (!buf)
        return h3_error_wrap(H3_ERR_NOMEM, "sparse attention on the device: %.1f MiB of tile centroids and lists",
                             bytes / 1048576.0);
    size_t off = 0;
    auto take = [&](size_t n) {
        char *p = buf + off;
        off += (n + 255) / 256 * 256;
        return (void *)p;
    };
    double *qc = (double *)take((size_t)H * nt * 128 * 8), *kc = (double *)take((size_t)H * nt * 128 * 8);
    __nv_bfloat16 *kcb = (__nv_bfloat16 *)take((size_t)ntpad * H * 128 * 2),
                  *vcb = (__nv_bfloat16 *)take((size_t)ntpad * H * 128 * 2);
    uint16_t *list = (uint16_t *)take((size_t)H * nt * nt * 2);
    int2 *count = (int2 *)take((size_t)H * nt * 8);
    uint32_t *bits = (uint32_t *)take((size_t)H * nt * ntw * 4);
    uint8_t *ex = (uint8_t *)take((size_t)nt);
    h3_status r = H3_OK;
    if (exact_tiles && cudaMemcpyAsync(ex, exact_tiles, (size_t)nt, cudaMemcpyHostToDevice, st) != cudaSuccess)
        r = H3_ERR(H3_ERR_DEVICE, "sparse attention: copying the exact tiles failed: %s",
                   cudaGetErrorString(cudaGetLastError()));
    if (r == H3_OK) {
        k_sparse_centroids<<<dim3((unsigned)ntpad, (unsigned)H), 128, 0, st>>>(
            qc, kc, kcb, vcb, (const __nv_bfloat16 *)a->q, (const __nv_bfloat16 *)a->k, (const __nv_bfloat16 *)a->v,
            a->ldq, a->ldk, a->ldv, S, nt);
        k_sparse_route<<<dim3((unsigned)nt, (unsigned)H), 256, route_smem, st>>>(
            list, count, bits, qc, kc, exact_tiles ? ex : NULL, nt, ntw, (double)a->scale_log2, tau);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            r = H3_ERR(H3_ERR_DEVICE, "sparse attention: the selection failed to launch: %s", cudaGetErrorString(e));
        if (r == H3_OK && n_exact) { /* the count, for tests and benchmarks: waits for the selection */
            int2 *hc = (int2 *)h3_malloc((size_t)H * nt * sizeof(int2), H3_MEM_OTHER);
            if (!hc) r = H3_ERR_NOMEM;
            else if (cudaMemcpyAsync(hc, count, (size_t)H * nt * sizeof(int2), cudaMemcpyDeviceToHost, st) !=
                         cudaSuccess ||
                     cudaStreamSynchronize(st) != cudaSuccess)
                r = H3_ERR(H3_ERR_DEVICE, "sparse attention: reading the selection back failed: %s",
                           cudaGetErrorString(cudaGetLastError()));
            else {
                *n_exact = 0;
                for (int64_t t = 0; t < (int64_t)H * nt; t++) *n_exact += hc[t].x;
            }
            h3_free(hc);
        }
    }
    if (r == H3_OK) {
        attn_tmaps_sparse maps;
        attn_tmaps dense;
        int c = attn_make_tmaps(&dense, a);
        if (!c) c = attn_make_tmap(&maps.kc, kcb, (int64_t)H * 128, ntpad, H);
        if (!c) c = attn_make_tmap(&maps.vc, vcb, (int64_t)H * 128, ntpad, H);
        if (c) r = H3_ERR(H3_ERR_DEVICE, "sparse attention: encoding the TMA tensor maps failed (CUresult %d)", c);
        if (r == H3_OK) {
            maps.q = dense.q;
            maps.k = dense.k;
            maps.v = dense.v;
            maps.list = list;
            maps.count = count;
            maps.bits = bits;
            maps.nt = nt;
            maps.ntw = ntw;
            attn_wgmma8_k<attn_tmaps_sparse, true><<<dim3((unsigned)nt, (unsigned)H), 384, smem, st>>>(maps, *a);
            cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess)
                r = H3_ERR(H3_ERR_DEVICE, "kernel attention (sparse wgmma) failed to launch: %s",
                           cudaGetErrorString(e));
        }
    }
    cuda_arena_free(s, buf);
    return r;
}

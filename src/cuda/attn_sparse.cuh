/* Block-sparse attention on Hopper (h3_op_attention_sparse, tensor/ops.h; docs/CUDA.md "sparse attention"): the
 * selection on the GPU, then attn_wgmma8_k<attn_tmaps_sparse, true> (attn_wgmma.cuh) over each query tile's exact
 * key tiles and the other tiles' centroids. The selection runs in double precision with the shared arithmetic of
 * tensor/ops.h (h3_sparse_score, h3_sparse_threshold, h3_sparse_exact), so it picks the host's tiles bit for bit.
 * Included by attn_sm90a.cu only. */
#ifndef H3_ATTN_SPARSE_CUH
#define H3_ATTN_SPARSE_CUH

#include "cuda/attn_wgmma.cuh"
#include "cuda/cuda_internal.cuh" /* tensor/ops.h inside its extern "C" */

/* Per (key tile j, head h), 128 threads (one per channel): the mean of the tile's rows of q, k and v in double,
 * summed in row order (the host's order): qc, kc [H][nt][128]; kc and vc rounded to bf16 into row j of the centroid
 * matrices kcb, vcb [ntpad, H·128]. Tiles j >= nt (the padding up to ntpad) write zero rows. Grid (ntpad, H). */
__global__ void k_sparse_centroids(double *qc, double *kc, __nv_bfloat16 *kcb, __nv_bfloat16 *vcb,
                                   const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                   int64_t ldq, int64_t ldk, int64_t ldv, int S, int nt) {
    const int j = blockIdx.x, h = blockIdx.y, H = gridDim.y, d = threadIdx.x;
    const int64_t out = (int64_t)j * H * 128 + h * 128 + d;
    if (j >= nt) {
        kcb[out] = __float2bfloat16_rn(0.0f);
        vcb[out] = __float2bfloat16_rn(0.0f);
        return;
    }
    const int r0 = j * H3_SPARSE_TILE, n = S - r0 < H3_SPARSE_TILE ? S - r0 : H3_SPARSE_TILE;
    double sq = 0.0, sk = 0.0, sv = 0.0;
    for (int r = r0; r < r0 + n; r++) {
        sq += (double)__bfloat162float(q[(int64_t)r * ldq + h * 128 + d]);
        sk += (double)__bfloat162float(k[(int64_t)r * ldk + h * 128 + d]);
        sv += (double)__bfloat162float(v[(int64_t)r * ldv + h * 128 + d]);
    }
    const int64_t c = ((int64_t)h * nt + j) * 128 + d;
    qc[c] = sq / (double)n;
    kc[c] = sk / (double)n;
    kcb[out] = __float2bfloat16_rn((float)kc[c]);
    vcb[out] = __float2bfloat16_rn((float)(sv / (double)n));
}

/* Per (query tile i, head h), 256 threads: the scores r_i· against every key tile in shared memory, the threshold,
 * then the selection: bits [H][nt][ntw] (bit j set where tile j is exact, and for j >= nt), the exact tiles in
 * ascending order into list [H][nt][nt], and count (exact tiles, centroid tiles). exact_tiles: [nt] bytes or NULL.
 * Dynamic shared memory: nt + 128 doubles and ntw + 1 ints. */
__global__ void k_sparse_route(uint16_t *list, int2 *count, uint32_t *bits, const double *qc, const double *kc,
                               const uint8_t *exact_tiles, int nt, int ntw, double scale_log2, double tau) {
    extern __shared__ double sp_smem[];
    double *r = sp_smem, *c = sp_smem + nt;
    int *pre = (int *)(c + 128);
    __shared__ double thr;
    const int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int64_t sel = (int64_t)h * nt + i;
    if (tid < 128) c[tid] = qc[sel * 128 + tid];
    __syncthreads();
    for (int j = tid; j < nt; j += blockDim.x) r[j] = h3_sparse_score(c, kc + ((int64_t)h * nt + j) * 128, 128, scale_log2);
    __syncthreads();
    if (tid == 0) thr = h3_sparse_threshold(r, nt, tau);
    __syncthreads();
    const int q_exact = exact_tiles && exact_tiles[i];
    for (int w = tid; w < ntw; w += blockDim.x) {
        uint32_t word = 0;
        for (int b = 0; b < 32; b++) {
            const int j = w * 32 + b;
            if (j >= nt || h3_sparse_exact(i, j, r[j], thr, q_exact, exact_tiles && exact_tiles[j])) word |= 1u << b;
        }
        bits[sel * ntw + w] = word;
        const int live = nt - w * 32 >= 32 ? 32 : nt - w * 32 > 0 ? nt - w * 32 : 0;
        pre[w + 1] = __popc(live == 32 ? word : word & ((1u << live) - 1u));
    }
    __syncthreads();
    if (tid == 0) {
        pre[0] = 0;
        for (int w = 0; w < ntw; w++) pre[w + 1] += pre[w];
        count[sel] = make_int2(pre[ntw], pre[ntw] < nt ? ntw / 4 : 0);
    }
    __syncthreads();
    uint16_t *out = list + sel * nt;
    for (int w = tid; w < ntw; w += blockDim.x) {
        uint32_t word = bits[sel * ntw + w];
        int at = pre[w];
        for (int b = 0; b < 32; b++) {
            const int j = w * 32 + b;
            if (j < nt && ((word >> b) & 1u)) out[at++] = (uint16_t)j;
        }
    }
}

#endif

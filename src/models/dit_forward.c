/* The MiniMax-H3 DiT forward and its AdaLN modulation, written once against the op API (H3-FACTS §1.2-1.3).
 *
 *   text  [L, text_dim] -> condition_proj -> refiner blocks (no RoPE, no AdaLN) -> RMSNorm --scatter--+
 *   video [Nv, 96]      -> video_patch_proj ------------------------------------------------scatter--+-> x
 * [S, H] audio [Na, 32]      -> audio_patch_proj ------------------------------------------------scatter--+
 *   x -> 50 × block(x; modulation row timestep_index·3 + tag, 3-axis RoPE) -> RMSNorm, per-timestep
 * shift/scale
 *     -> gather video rows -> video_out [Nv, 96];  gather audio rows -> audio_out [Na, 32]
 *
 * block: h = RMSNorm(x)·(1 + scale_msa) + shift_msa;  x += gate_msa · out_proj(attn(QK-RMSNorm, RoPE(h)))
 *        h = RMSNorm(x)·(1 + scale_mlp) + shift_mlp;  x += gate_mlp · fc2(silu(gate) · value)
 */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "models/dit_internal.h"
#include "models/lora.h"

h3_status h3_dit_upload(h3_exec *ex, h3_tensor *dst, const void *host) {
    h3_tensor src;
    H3_TRY(h3_tensor_wrap(&src, (void *)host, H3_PLACE_HOST, dst->dtype, dst->ndim, dst->shape));
    return h3_copy(ex, dst, &src);
}

static h3_status alloc_dt(const h3_dit *d, h3_tensor *t, h3_dtype dt, int64_t rows, int64_t cols) {
    /* Zero-row tensors still get one row of storage, so every buffer has an address. */
    H3_TRY(h3_tensor_alloc2(t, d->act_place, dt, rows > 0 ? rows : 1, cols, H3_MEM_ACTIVATIONS));
    t->shape[0] = rows;
    return H3_OK;
}

static h3_status act_alloc(const h3_dit *d, h3_tensor *t, int64_t rows, int64_t cols) {
    return alloc_dt(d, t, d->act_dtype, rows, cols);
}

/* y = x·wᵀ + b where the dtypes of x, y and w may differ (the release's f32 islands among bf16 activations on the
 * device). The CPU GEMM takes any weight dtype with f32 activations; the device GEMM wants one dtype, so there x
 * is converted to w's dtype and the result back to y's, chunk_rows rows at a time (bounded scratch). */
static h3_status gemm_mixed1(h3_dit *d, h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                             const h3_tensor *b) {
    const h3_dtype wd = w->dtype;
    /* quantized weights: the GEMM takes any float activations and output (the CPU's and the GPU's) */
    if (x->place != H3_PLACE_DEVICE || (x->dtype == wd && y->dtype == wd) || w->q.mode != H3_SCALE_NONE ||
        (wd != H3_F32 && wd != H3_BF16 && wd != H3_F16))
        return h3_op_gemm(ex, y, x, w, b, 0);
    const int64_t M = h3_tensor_rows(x), K = h3_tensor_cols(x), N = w->shape[0];
    const int64_t ch = M < d->chunk_rows ? M : d->chunk_rows;
    h3_tensor tx = {0}, ty = {0};
    h3_status st = H3_OK;
    if (x->dtype != wd) H3_CHECK(alloc_dt(d, &tx, wd, ch, K));
    if (y->dtype != wd) H3_CHECK(alloc_dt(d, &ty, wd, ch, N));
    for (int64_t r0 = 0; r0 < M; r0 += ch) {
        int64_t m = M - r0 < ch ? M - r0 : ch;
        h3_tensor xc, yc, xs, ys;
        H3_CHECK(h3_tensor_narrow(x, 0, r0, m, &xc));
        H3_CHECK(h3_tensor_narrow(y, 0, r0, m, &yc));
        if (tx.data) {
            H3_CHECK(h3_tensor_narrow(&tx, 0, 0, m, &xs));
            H3_CHECK(h3_op_convert(ex, &xs, &xc));
        } else {
            xs = xc;
        }
        if (ty.data) H3_CHECK(h3_tensor_narrow(&ty, 0, 0, m, &ys));
        else ys = yc;
        H3_CHECK(h3_op_gemm(ex, &ys, &xs, w, b, 0));
        if (ty.data) H3_CHECK(h3_op_convert(ex, &yc, &ys));
    }
done:
    h3_tensor_free(&tx);
    h3_tensor_free(&ty);
    return st;
}

/* gemm_mixed, then the LoRA side path of slot (-1: none) when one is attached (models/lora.h). */
static h3_status gemm_mixed(h3_dit *d, h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                            const h3_tensor *b, int slot) {
    H3_TRY(gemm_mixed1(d, ex, y, x, w, b));
    return slot >= 0 ? h3_lora_side(d, ex, slot, y, x) : H3_OK;
}

/* A block's GEMM y = x·wᵀ, then the LoRA side path of the unit's slot role. */
static h3_status gemm_lora(h3_dit *d, h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                           int unit, int role) {
    H3_TRY(h3_op_gemm(ex, y, x, w, NULL, 0));
    return h3_lora_side(d, ex, h3_lora_slot_unit(&d->cfg, unit, role), y, x);
}

static h3_status idx_alloc(const h3_dit *d, h3_tensor *t, int64_t n) {
    int64_t s[1] = {n > 0 ? n : 1};
    H3_TRY(h3_tensor_alloc(t, d->act_place, H3_I32, 1, s, H3_MEM_ACTIVATIONS));
    t->shape[0] = n;
    return H3_OK;
}

static int64_t rows_bytes(int64_t rows, int64_t cols, size_t es) {
    return (rows > 0 ? rows : 1) * cols * (int64_t)es;
}

/* ---- AdaLN modulation ------------------------------------------------------------------------------------
 */

int64_t h3_dit_modulation_bytes(const h3_dit_config *c, int n) {
    return ((int64_t)n * 3 * 6 * c->hidden * c->n_layers + (int64_t)n * 2 * c->hidden) *
           (int64_t)sizeof(float); /* f32 tables on the host; bf16 tables on the device take half */
}

const h3_tensor *h3_dit_modulation(const h3_dit *d, int b, const float **timesteps, int *n) {
    if (!d->mod || b < 0 || b > d->cfg.n_layers) return NULL;
    if (timesteps) *timesteps = d->mod_t;
    if (n) *n = d->mod_n;
    return &d->mod[b];
}

/* The AdaLN input for each timestep, [n, time_embed_dim] at the activation place: silu(time MLP(sinusoid))
 * for the full form; the lerp of curve-table rows for the pruned form (its rows are already post-SiLU). */
static h3_status adaln_input(h3_dit *d, h3_exec *ex, const float *t, int n, h3_tensor *a) {
    const h3_dit_config *c = &d->cfg;
    h3_status st = H3_OK;
    float *host = NULL, *row0 = NULL, *row1 = NULL;
    h3_tensor e = {0}, m = {0};
    /* f32 throughout: the time MLP is one of the release's f32 islands, and every AdaLN projection reads it */
    H3_TRY(alloc_dt(d, a, H3_F32, n, c->time_embed_dim));
    if (c->adaln_pruned) {
        const int64_t G = c->curve_grid, r = c->time_embed_dim;
        host = h3_malloc((size_t)(n * r) * sizeof(float), H3_MEM_WORKSPACE);
        row0 = h3_malloc((size_t)r * sizeof(float), H3_MEM_WORKSPACE);
        row1 = h3_malloc((size_t)r * sizeof(float), H3_MEM_WORKSPACE);
        if (!host || !row0 || !row1) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n; i++) {
            /* t in [0, 1] -> fractional row t·(G−1); the last interval serves t = 1 (as ComfyUI's curve
             * form). */
            float pos = fminf(fmaxf(t[i], 0.0f), 1.0f) * (float)(G - 1);
            int64_t i0 = (int64_t)floorf(pos);
            if (i0 > G - 2) i0 = G - 2;
            float w = pos - (float)i0;
            H3_CHECK(h3_tensor_rows_to_f32(&d->g.curve, i0, 1, row0));
            H3_CHECK(h3_tensor_rows_to_f32(&d->g.curve, i0 + 1, 1, row1));
            for (int64_t j = 0; j < r; j++) /* torch.lerp's two-sided form */
                host[i * r + j] =
                    w < 0.5f ? row0[j] + w * (row1[j] - row0[j]) : row1[j] - (row1[j] - row0[j]) * (1.0f - w);
        }
        H3_CHECK(h3_dit_upload(ex, a, host));
    } else {
        /* Sinusoid of t in [0, 1] unscaled, cos first, frequencies exp(−ln(10000)·j/half), in f32 as the
         * release. */
        const int64_t half = c->freq_dim / 2;
        host = h3_malloc((size_t)(n * c->freq_dim) * sizeof(float), H3_MEM_WORKSPACE);
        if (!host) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        const float ln = (float)(-log(10000.0));
        for (int i = 0; i < n; i++)
            for (int64_t j = 0; j < half; j++) {
                float f = expf(ln * (float)j / (float)half);
                float arg = t[i] * f;
                host[i * c->freq_dim + j] = (float)cos((double)arg);
                host[i * c->freq_dim + half + j] = (float)sin((double)arg);
            }
        H3_CHECK(alloc_dt(d, &e, H3_F32, n, c->freq_dim));
        H3_CHECK(h3_dit_upload(ex, &e, host));
        H3_CHECK(alloc_dt(d, &m, H3_F32, n, c->time_hidden));
        H3_CHECK(h3_op_gemm(ex, &m, &e, &d->g.time_in_w, &d->g.time_in_b, 0));
        H3_CHECK(h3_lora_side(d, ex, h3_lora_slot_global(c, H3_LS_TIME_IN), &m, &e));
        H3_CHECK(h3_op_unary(ex, &m, &m, H3_UNARY_SILU));
        H3_CHECK(h3_op_gemm(ex, a, &m, &d->g.time_out_w, &d->g.time_out_b, 0));
        H3_CHECK(h3_lora_side(d, ex, h3_lora_slot_global(c, H3_LS_TIME_OUT), a, &m));
        H3_CHECK(h3_op_unary(ex, a, a, H3_UNARY_SILU)); /* every AdaLN projection reads silu(temb) */
    }
done:
    h3_free(host);
    h3_free(row0);
    h3_free(row1);
    h3_tensor_free(&e);
    h3_tensor_free(&m);
    if (st != H3_OK) h3_tensor_free(a);
    return st;
}

/* Frees modulation tables mod [L + 1] (NULL allowed) and their timesteps t. */
static void free_mod_tables(h3_tensor *mod, float *t, int64_t L) {
    if (mod) {
        for (int64_t b = 0; b <= L; b++) h3_tensor_free(&mod[b]);
        h3_free(mod);
    }
    h3_free(t);
}

h3_status h3_dit_precompute_modulation(h3_dit *d, h3_exec *ex, const float *ts, int n) {
    const h3_dit_config *c = &d->cfg;
    if (n < 1) return H3_ERR(H3_ERR_INVALID, "DiT modulation: at least one timestep is needed");
    for (int i = 0; i < n; i++)
        if (!isfinite(ts[i])) return H3_ERR(H3_ERR_INVALID, "DiT modulation: timestep %d is not finite", i);
    h3_status st = H3_OK;
    const int64_t L = c->n_layers, H = c->hidden;
    float *uniq = h3_malloc((size_t)n * sizeof(float), H3_MEM_OTHER);
    h3_tensor *mod = h3_calloc((size_t)(L + 1), sizeof *mod, H3_MEM_OTHER);
    h3_tensor a = {0};
    int m = 0;
    if (!uniq || !mod) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < m && !seen; j++) seen = uniq[j] == ts[i];
        if (!seen) uniq[m++] = ts[i];
    }
    H3_CHECK(adaln_input(d, ex, uniq, m, &a));
    for (int64_t b = 0; b < L; b++) {
        /* [m, 18H] = a · Wᵀ + bias, kept as [m·3, 6H]: row t·3 + modality, six chunks of H per row. */
        h3_tensor v;
        const h3_tensor *aw, *ab;
        int64_t s[2] = {m, 18 * H};
        H3_CHECK(act_alloc(d, &mod[b], (int64_t)m * 3, 6 * H));
        H3_CHECK(h3_tensor_reshape(&mod[b], 2, s, &v));
        H3_CHECK_CTX(h3_dit_adaln_acquire(d, ex, (int)b, &aw, &ab), "AdaLN of block %lld", (long long)b);
        st = gemm_mixed(d, ex, &v, &a, aw, ab, h3_lora_slot_adaln(c, (int)b));
        h3_dit_adaln_release(d, ex, (int)b);
        if (st != H3_OK) {
            st = h3_error_wrap(st, "AdaLN of block %lld", (long long)b);
            goto done;
        }
    }
    H3_CHECK(act_alloc(d, &mod[L], m, 2 * H));
    H3_CHECK_CTX(gemm_mixed(d, ex, &mod[L], &a, &d->g.final_adaln_w, &d->g.final_adaln_b,
                            h3_lora_slot_global(c, H3_LS_FINAL_ADALN)),
                 "final-layer AdaLN");
    h3_dit_release_modulation(d); /* replace what was kept */
    d->mod = mod;
    d->mod_t = uniq;
    d->mod_n = m;
    d->stats.adaln_passes++;
    mod = NULL;
    uniq = NULL;
done:
    h3_tensor_free(&a);
    free_mod_tables(mod, uniq, L);
    return st;
}

void h3_dit_release_modulation(h3_dit *d) {
    free_mod_tables(d->mod, d->mod_t, d->cfg.n_layers);
    d->mod = NULL;
    d->mod_t = NULL;
    d->mod_n = 0;
}

/* map[i] = kept row of timesteps[i]; 0 when one is not kept. */
static int lookup_modulation(const h3_dit *d, const float *ts, int n, int32_t *map) {
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < d->mod_n && d->mod_t[j] != ts[i]) j++;
        if (j == d->mod_n) return 0;
        map[i] = j;
    }
    return 1;
}

/* Makes every timestep of the forward kept (computing the kept ones again with the new: the cost is reading
 * the AdaLN weights once, whatever the count). */
static h3_status ensure_modulation(h3_dit *d, h3_exec *ex, const float *ts, int n, int32_t *map) {
    if (d->mod && lookup_modulation(d, ts, n, map)) return H3_OK;
    float *all = h3_malloc((size_t)(d->mod_n + n) * sizeof(float), H3_MEM_OTHER);
    if (!all) return H3_ERR_NOMEM;
    if (d->mod_n) memcpy(all, d->mod_t, (size_t)d->mod_n * sizeof(float));
    memcpy(all + d->mod_n, ts, (size_t)n * sizeof(float));
    h3_log(H3_LOG_DEBUG, "DiT: computing the AdaLN modulation for %d timesteps inside a forward",
           d->mod_n + n);
    h3_status st = h3_dit_precompute_modulation(d, ex, all, d->mod_n + n);
    h3_free(all);
    H3_TRY(st);
    if (!lookup_modulation(d, ts, n, map))
        return H3_ERR(H3_ERR_INTERNAL, "DiT: a computed timestep is not kept");
    return H3_OK;
}

/* ---- workspace
 * ---------------------------------------------------------------------------------------------- */

/* The most rows a unit of a forward runs on: all S, or in rank `rank` of a split over `ranks` its own rows of the
 * DiT blocks and the L text rows of the refiner, which runs whole on every rank (h3_dit_forward_sp). */
static int64_t unit_rows(int64_t S, int64_t L, int ranks, int rank) {
    if (ranks <= 1) return S;
    const int64_t n = S * (rank + 1) / ranks - S * rank / ranks;
    return n > L ? n : L;
}

/* The buffers ensure_workspace allocates, for a chunk and QKV order that may differ from the DiT's (the planner),
 * the blocks' q, k, v and o for B rows (unit_rows). */
static int64_t workspace_bytes(const h3_dit *d, int64_t chunk_rows, int qkv_interleaved, int64_t S, int64_t L,
                               int64_t Nv, int64_t Na, int64_t B) {
    const h3_dit_config *c = &d->cfg;
    const size_t es = h3_dtype_size(d->act_dtype);
    const int64_t H = c->hidden, inner = h3_dit_inner(c), R = 6 * c->rope_freq_dim;
    const int64_t ch = B < chunk_rows ? B : chunk_rows;
    int64_t b = 2 * rows_bytes(S, H, es) + rows_bytes(L, H, es) + 4 * rows_bytes(B, inner, es); /* qkv + o */
    if (qkv_interleaved) b += rows_bytes(ch, 3 * inner, es);
    b += rows_bytes(ch, 2 * c->ffn, es) + rows_bytes(ch, c->ffn, es);
    b += 2 * rows_bytes(S, R, sizeof(float));
    b += 2 * rows_bytes(S, 1, 4) + rows_bytes(Nv, 1, 4) + rows_bytes(Na, 1, 4) + rows_bytes(L, 1, 4);
    return b;
}

/* The split forward's exchange buffers (forward(): sp_send, sp_recv), held while the blocks run. */
static int64_t exchange_bytes(const h3_dit *d, int64_t S, int ranks) {
    if (ranks <= 1) return 0;
    const size_t es = h3_dtype_size(d->act_dtype);
    const int64_t share = (S + ranks - 1) / ranks, inner = h3_dit_inner(&d->cfg) / ranks;
    return rows_bytes(3 * ranks * share, inner, es) + rows_bytes(4 * S, inner, es);
}

int64_t h3_dit_workspace_bytes(const h3_dit *d, int64_t S, int64_t L, int64_t Nv, int64_t Na) {
    return workspace_bytes(d, d->chunk_rows, d->qkv_interleaved, S, L, Nv, Na, S);
}

/* The scratch gemm_mixed allocates for x [M, K] · w [N, K]ᵀ -> y [M, N] with chunks of `chunk` rows. */
static int64_t gemm_mixed_scratch(const h3_dit *d, int64_t chunk, h3_dtype xd, const h3_tensor *w, h3_dtype yd,
                                  int64_t M) {
    if (d->act_place != H3_PLACE_DEVICE || !w->data || M == 0) return 0;
    const h3_dtype wd = w->dtype;
    if ((xd == wd && yd == wd) || w->q.mode != H3_SCALE_NONE ||
        (wd != H3_F32 && wd != H3_BF16 && wd != H3_F16))
        return 0;
    const int64_t ch = M < chunk ? M : chunk, K = w->shape[1], N = w->shape[0];
    const size_t es = h3_dtype_size(wd);
    return (xd != wd ? rows_bytes(ch, K, es) : 0) + (yd != wd ? rows_bytes(ch, N, es) : 0);
}

static int64_t max64(int64_t a, int64_t b) {
    return a > b ? a : b;
}

void h3_dit_forward_mem_of(const h3_dit *d, int64_t chunk_rows, int qkv_interleaved, int64_t S, int64_t L,
                           int64_t Nv, int64_t Na, int n, h3_dit_forward_mem *out) {
    h3_dit_forward_mem_sp(d, chunk_rows, qkv_interleaved, S, L, Nv, Na, n, 1, 0, out);
}

void h3_dit_forward_mem_sp(const h3_dit *d, int64_t chunk_rows, int qkv_interleaved, int64_t S, int64_t L,
                           int64_t Nv, int64_t Na, int n, int ranks, int rank, h3_dit_forward_mem *out) {
    const h3_dit_config *c = &d->cfg;
    const h3_dit_globals *g = &d->g;
    const h3_dtype ad = d->act_dtype;
    const int64_t ch = chunk_rows > 0 ? chunk_rows : d->chunk_rows, H = c->hidden;
    const int il = qkv_interleaved < 0 ? d->qkv_interleaved : qkv_interleaved;
    memset(out, 0, sizeof *out);
    if (ranks < 1) ranks = 1;
    out->workspace = workspace_bytes(d, ch, il, S, L, Nv, Na, unit_rows(S, L, ranks, rank));
    out->exchange = exchange_bytes(d, S, ranks);
    if (ranks > 1) {
        const int64_t own = S * (rank + 1) / ranks - S * rank / ranks,
                      blk = c->heads / ranks * c->head_dim * (int64_t)h3_dtype_size(ad);
        out->received_block = (3 * (S - own) + (int64_t)(ranks - 1) * own) * blk;
        out->received_end = (S - own) * H * (int64_t)h3_dtype_size(ad);
    }
    /* h3_dit_forward: the input projections (f32 rows in), then the output heads (f32 velocities out); one at a
     * time, each freeing its scratch before the next. */
    int64_t x = 0;
    if (Nv) x = max64(x, gemm_mixed_scratch(d, ch, H3_F32, &g->video_in_w, ad, Nv));
    if (Na) x = max64(x, gemm_mixed_scratch(d, ch, H3_F32, &g->audio_in_w, ad, Na));
    if (L) x = max64(x, gemm_mixed_scratch(d, ch, H3_F32, &g->text_in_w, ad, L));
    if (Nv) x = max64(x, gemm_mixed_scratch(d, ch, ad, &g->video_out_w, H3_F32, Nv));
    if (Na) x = max64(x, gemm_mixed_scratch(d, ch, ad, &g->audio_out_w, H3_F32, Na));
    /* low-bit attention: the blocks' quantized q, k, v, held during each attention (device only) */
    if (d->attn_flags && d->act_place == H3_PLACE_DEVICE && S > 0)
        x = max64(x, h3_cuda_granule(h3_cuda_attention_lowbit_scratch_bytes(d->attn_flags, S, S, c->heads / ranks,
                                                                            c->heads / ranks)));
    /* sparse attention: the tiles' centroids and lists, held during each attention (device only; never split) */
    if ((d->attn_flags & H3_ATTN_SPARSE) && d->act_place == H3_PLACE_DEVICE && S >= d->sparse_min_rows && S > 0 &&
        ranks == 1)
        x = max64(x, h3_cuda_granule(h3_cuda_attention_sparse_scratch_bytes(S, c->heads)));
    out->scratch = x;
    out->inputs = (Nv ? rows_bytes(Nv, h3_dit_video_dim(c), 4) : 0) + (Na ? rows_bytes(Na, c->audio_dim, 4) : 0) +
                  (L ? rows_bytes(L, c->text_dim, 4) : 0);
    out->outputs = (Nv ? rows_bytes(Nv, h3_dit_video_dim(c), 4) : 0) + (Na ? rows_bytes(Na, c->audio_dim, 4) : 0);
    if (n < 1) return;
    /* h3_dit_precompute_modulation: act_alloc per block table and the final table; adaln_input's f32 buffers; one
     * block's gemm_mixed scratch at a time. */
    const size_t es = h3_dtype_size(ad);
    const int64_t tb = rows_bytes((int64_t)n * 3, 6 * H, es), tf = rows_bytes(n, 2 * H, es);
    out->mod_tables = c->n_layers * tb + tf;
    const int64_t a = rows_bytes(n, c->time_embed_dim, 4);
    int64_t during_input = a; /* adaln_input: a, and the full form's sinusoid and time-MLP buffers */
    if (!c->adaln_pruned) during_input += rows_bytes(n, c->freq_dim, 4) + rows_bytes(n, c->time_hidden, 4);
    /* the block loop: the tables so far, a, and one block's GEMM scratch; then the final table's */
    int64_t last_block = 0;
    if (c->n_layers > 0)
        last_block = c->n_layers * tb + a + gemm_mixed_scratch(d, ch, H3_F32, &d->adaln_w[0], ad, n);
    const int64_t final = out->mod_tables + a + gemm_mixed_scratch(d, ch, H3_F32, &g->final_adaln_w, ad, n);
    out->mod_peak = max64(during_input, max64(last_block, final));
}

void h3_dit_release_workspace(h3_dit *d) {
    h3_dit_ws *w = &d->ws;
    h3_tensor *all[] = {&w->x,   &w->h,   &w->xt,      &w->qkv,     &w->o,    &w->fused, &w->u,   &w->g,
                        &w->cos, &w->sin, &w->mod_idx, &w->fin_idx, &w->vidx, &w->aidx,  &w->tidx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) h3_tensor_free(all[i]);
    h3_free(w->rope_pos);
    memset(w, 0, sizeof *w);
}

/* B: the most rows a unit runs on (unit_rows): the blocks' q, k, v and o and the FFN chunks are for that many. */
static h3_status ensure_workspace(h3_dit *d, int64_t S, int64_t L, int64_t Nv, int64_t Na, int64_t B) {
    h3_dit_ws *w = &d->ws;
    if (w->S == S && w->L == L && w->Nv == Nv && w->Na == Na && w->B == B) return H3_OK;
    h3_dit_release_workspace(d);
    const h3_dit_config *c = &d->cfg;
    const int64_t H = c->hidden, inner = h3_dit_inner(c), ch = B < d->chunk_rows ? B : d->chunk_rows;
    h3_status st = H3_OK;
    H3_CHECK(act_alloc(d, &w->x, S, H));
    H3_CHECK(act_alloc(d, &w->h, S, H));
    H3_CHECK(act_alloc(d, &w->xt, L, H));
    H3_CHECK(act_alloc(d, &w->qkv, B, 3 * inner));
    H3_CHECK(h3_tensor_narrow(&w->qkv, 1, 0, inner, &w->q));
    H3_CHECK(h3_tensor_narrow(&w->qkv, 1, inner, inner, &w->k));
    H3_CHECK(h3_tensor_narrow(&w->qkv, 1, 2 * inner, inner, &w->v));
    H3_CHECK(act_alloc(d, &w->o, B, inner));
    if (d->qkv_interleaved) H3_CHECK(act_alloc(d, &w->fused, ch, 3 * inner));
    H3_CHECK(act_alloc(d, &w->u, ch, 2 * c->ffn));
    H3_CHECK(act_alloc(d, &w->g, ch, c->ffn));
    {
        int64_t s[2] = {S > 0 ? S : 1, 6 * c->rope_freq_dim};
        H3_CHECK(h3_tensor_alloc(&w->cos, d->act_place, H3_F32, 2, s, H3_MEM_ACTIVATIONS));
        H3_CHECK(h3_tensor_alloc(&w->sin, d->act_place, H3_F32, 2, s, H3_MEM_ACTIVATIONS));
    }
    H3_CHECK(idx_alloc(d, &w->mod_idx, S));
    H3_CHECK(idx_alloc(d, &w->fin_idx, S));
    H3_CHECK(idx_alloc(d, &w->vidx, Nv));
    H3_CHECK(idx_alloc(d, &w->aidx, Na));
    H3_CHECK(idx_alloc(d, &w->tidx, L));
    w->S = S;
    w->L = L;
    w->Nv = Nv;
    w->Na = Na;
    w->B = B;
    return H3_OK;
done:
    h3_dit_release_workspace(d);
    return st;
}

/* ---- inputs
 * -------------------------------------------------------------------------------------------------- */

static h3_status check_rows(const h3_dit *d, const char *name, const h3_tensor *t, int64_t cols, int64_t *n) {
    *n = 0;
    if (!t) return H3_OK;
    char s[96];
    if (t->ndim != 2 || t->shape[1] != cols || t->dtype != H3_F32 || t->place != d->act_place ||
        !h3_tensor_is_rowwise(t, NULL))
        return H3_ERR(H3_ERR_INVALID,
                      "DiT input '%s' must be %s [rows, %lld] at the %s place, got %s %s at %s", name,
                      h3_dtype_name(H3_F32), (long long)cols, h3_place_name(d->act_place),
                      h3_dtype_name(t->dtype), h3_tensor_shape_str(t, s, sizeof s), h3_place_name(t->place));
    *n = t->shape[0];
    return H3_OK;
}

static h3_status check_out(const h3_dit *d, const char *name, const h3_tensor *t, int64_t rows,
                           int64_t cols) {
    if (rows == 0) return H3_OK;
    char s[96];
    if (!t || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols || t->dtype != H3_F32 ||
        t->place != d->act_place || !h3_tensor_is_rowwise(t, NULL))
        return H3_ERR(H3_ERR_INVALID, "DiT output '%s' must be %s [%lld, %lld] at the %s place, got %s", name,
                      h3_dtype_name(H3_F32), (long long)rows, (long long)cols,
                      h3_place_name(d->act_place), t ? h3_tensor_shape_str(t, s, sizeof s) : "none");
    return H3_OK;
}

/* Every row is named by exactly one of the three index lists. */
static h3_status check_partition(const h3_dit_inputs *in, int64_t Nv, int64_t Na, int64_t L, uint8_t *seen) {
    const int64_t S = in->seq_len;
    struct {
        const char *name;
        const int32_t *v;
        int64_t n;
    } lists[3] = {{"video_indices", in->video_indices, Nv},
                  {"audio_indices", in->audio_indices, Na},
                  {"text_indices", in->text_indices, L}};
    memset(seen, 0, (size_t)S);
    for (int l = 0; l < 3; l++) {
        if (lists[l].n && !lists[l].v)
            return H3_ERR(H3_ERR_INVALID, "DiT input '%s' is missing", lists[l].name);
        for (int64_t i = 0; i < lists[l].n; i++) {
            int64_t r = lists[l].v[i];
            if (r < 0 || r >= S)
                return H3_ERR(H3_ERR_INVALID,
                              "DiT input '%s': value %lld at %lld is outside the sequence [0, %lld)",
                              lists[l].name, (long long)r, (long long)i, (long long)S);
            if (seen[r])
                return H3_ERR(H3_ERR_INVALID, "DiT input '%s': row %lld (at %lld) is already named by %s",
                              lists[l].name, (long long)r, (long long)i, lists[seen[r] - 1].name);
            seen[r] = (uint8_t)(l + 1);
        }
    }
    return H3_OK;
}

static h3_status check_inputs(h3_dit *d, const h3_dit_inputs *in, const h3_tensor *vout,
                              const h3_tensor *aout, int64_t *pNv, int64_t *pNa, int64_t *pL) {
    const h3_dit_config *c = &d->cfg;
    int64_t Nv = 0, Na = 0, L = 0;
    H3_TRY(check_rows(d, "video", in->video, h3_dit_video_dim(c), &Nv));
    H3_TRY(check_rows(d, "audio", in->audio, c->audio_dim, &Na));
    H3_TRY(check_rows(d, "text", in->text, c->text_dim, &L));
    const int64_t S = in->seq_len;
    if (S < 1 || S != Nv + Na + L)
        return H3_ERR(H3_ERR_INVALID,
                      "DiT input: the sequence has %lld rows but video %lld + audio %lld + text %lld "
                      "rows = %lld",
                      (long long)S, (long long)Nv, (long long)Na, (long long)L, (long long)(Nv + Na + L));
    if (!in->timestep_indices || !in->token_tags || !in->position_ids || !in->timesteps)
        return H3_ERR(H3_ERR_INVALID,
                      "DiT input: timesteps, timestep_indices, token_tags and position_ids are all "
                      "required");
    if (in->n_timesteps < 1 || in->n_timesteps > (1 << 20))
        return H3_ERR(H3_ERR_INVALID, "DiT input 'timesteps': %d values; 1 to 2^20 are accepted",
                      in->n_timesteps);
    for (int i = 0; i < in->n_timesteps; i++)
        if (!isfinite(in->timesteps[i]))
            return H3_ERR(H3_ERR_INVALID, "DiT input 'timesteps': value %d is not finite", i);
    for (int64_t r = 0; r < S; r++) {
        if (in->token_tags[r] < 0 || in->token_tags[r] > 2)
            return H3_ERR(H3_ERR_INVALID,
                          "DiT input 'token_tags': %d at row %lld; tags are 0 (video), 1 (text), 2 "
                          "(audio)",
                          in->token_tags[r], (long long)r);
        if (in->timestep_indices[r] < 0 || in->timestep_indices[r] >= in->n_timesteps)
            return H3_ERR(H3_ERR_INVALID, "DiT input 'timestep_indices': %d at row %lld is outside [0, %d)",
                          in->timestep_indices[r], (long long)r, in->n_timesteps);
        for (int a = 0; a < 3; a++)
            if (!isfinite(in->position_ids[r * 3 + a]))
                return H3_ERR(H3_ERR_INVALID, "DiT input 'position_ids': row %lld axis %d is not finite",
                              (long long)r, a);
    }
    H3_TRY(check_out(d, "video velocity", vout, Nv, h3_dit_video_dim(c)));
    H3_TRY(check_out(d, "audio velocity", aout, Na, c->audio_dim));
    uint8_t *seen = h3_malloc((size_t)S, H3_MEM_WORKSPACE);
    if (!seen) return H3_ERR_NOMEM;
    h3_status st = check_partition(in, Nv, Na, L, seen);
    h3_free(seen);
    H3_TRY(st);
    *pNv = Nv;
    *pNa = Na;
    *pL = L;
    return H3_OK;
}

/* ---- blocks
 * ---------------------------------------------------------------------------------------------------- */

static h3_status rows_view(const h3_tensor *t, int64_t r0, int64_t n, h3_tensor *out) {
    return h3_tensor_narrow(t, 0, r0, n, out);
}

/* [n, inner] (any row stride) -> [n, heads, head_dim] over the same memory. */
static h3_status heads_view(const h3_dit *d, const h3_tensor *t, h3_tensor *out) {
    int64_t s[3] = {t->shape[0], d->cfg.heads, d->cfg.head_dim}, ld;
    if (!h3_tensor_is_rowwise(t, &ld)) return H3_ERR(H3_ERR_INTERNAL, "DiT: a head view needs a row-wise tensor");
    H3_TRY(h3_tensor_wrap(out, t->data, t->place, t->dtype, 3, s));
    out->stride[0] = ld;
    return H3_OK;
}

/* Per-head QK-RMSNorm without RoPE (token refiner): the fused kernel with no rotated channels. */
static h3_status qk_norm(h3_dit *d, h3_exec *ex, h3_tensor *x3, const h3_tensor *w, float eps) {
    h3_tensor cr, sr, c0, s0;
    H3_TRY(h3_tensor_narrow(&d->ws.cos, 0, 0, x3->shape[0], &cr));
    H3_TRY(h3_tensor_narrow(&d->ws.sin, 0, 0, x3->shape[0], &sr));
    H3_TRY(h3_tensor_narrow(&cr, 1, 0, 0, &c0));
    H3_TRY(h3_tensor_narrow(&sr, 1, 0, 0, &s0));
    return h3_op_qk_norm_rope(ex, x3, w, eps, &c0, &s0);
}

/* dst = src for [m, heads, head_dim] views with arbitrary row and head strides, one head at a time. */
static h3_status copy_heads(h3_exec *ex, const h3_tensor *dst, const h3_tensor *src) {
    for (int64_t h = 0; h < src->shape[1]; h++) {
        h3_tensor a, b;
        H3_TRY(h3_tensor_narrow(dst, 1, h, 1, &a));
        H3_TRY(h3_tensor_narrow(src, 1, h, 1, &b));
        H3_TRY(h3_op_convert(ex, &a, &b));
    }
    return H3_OK;
}

/* ---- sequence parallel (h3_dit_forward_sp) ------------------------------------------------------------------ */

/* Rank i's rows of the packed sequence: [sp_off(i), sp_off(i + 1)). */
static int64_t sp_off(const h3_dit *d, int i) {
    return d->sp_S * i / d->sp->size;
}

/* Heads h0..h0+nh of a [n, heads, hd] view (row stride ld, heads contiguous) as rows [n, nh·hd] of stride ld: the
 * 2-D form the copy op takes (a 3-D narrow has no constant row stride once nh > 1). */
static h3_status heads_rows(const h3_tensor *x3, int64_t h0, int64_t nh, h3_tensor *out) {
    H3_TRY(h3_tensor_wrap(out, (char *)x3->data + h0 * x3->stride[1] * (int64_t)h3_dtype_size(x3->dtype), x3->place,
                          x3->dtype, 2, (int64_t[2]){x3->shape[0], nh * x3->shape[2]}));
    out->stride[0] = x3->stride[0];
    return H3_OK;
}

/* Ulysses around one block's attention. q3, k3, v3, o3 [n, heads, hd]: this rank's rows, all heads (any row
 * stride). Each rank sends rank j the heads j·Hn.. of its rows, packed [n, Hn, hd]; what arrives, rank by rank,
 * is all S rows of this rank's Hn heads in sequence order ([S, Hn, hd], rank i's block at row sp_off(i)). After
 * attention on those, the output's row blocks go back to their ranks, which unpack each sender's heads into o3. */
static h3_status attention_sp(h3_dit *d, h3_exec *ex, const h3_tensor *q3, const h3_tensor *k3, const h3_tensor *v3,
                              const h3_tensor *o3, float scale, unsigned flags) {
    h3_comm *cm = d->sp;
    const int N = cm->size;
    const int64_t S = d->sp_S, Hn = d->cfg.heads / N, hd = d->cfg.head_dim, n = q3->shape[0];
    const int64_t share = (S + N - 1) / N, es = (int64_t)h3_dtype_size(d->act_dtype), blk = Hn * hd * es;
    int64_t scount[H3_COMM_MAX_RANKS], sdispl[H3_COMM_MAX_RANKS], rcount[H3_COMM_MAX_RANKS], rdispl[H3_COMM_MAX_RANKS];
    const h3_tensor *in3[3] = {q3, k3, v3};
    h3_tensor all[4]; /* q, k, v, o of all rows, this rank's heads: [S, Hn, hd] */
    for (int t = 0; t < 4; t++) {
        int64_t sh[3] = {S, Hn, hd};
        H3_TRY(h3_tensor_wrap(&all[t], (char *)d->sp_recv.data + t * S * blk, d->act_place, d->act_dtype, 3, sh));
    }
    for (int t = 0; t < 3; t++) {
        char *send = (char *)d->sp_send.data + (int64_t)t * N * share * blk;
        for (int j = 0; j < N; j++) { /* pack heads j·Hn.. of this rank's rows */
            h3_tensor src, dst;
            H3_TRY(heads_rows(in3[t], j * Hn, Hn, &src));
            H3_TRY(h3_tensor_wrap(&dst, send + j * share * blk, d->act_place, d->act_dtype, 2, (int64_t[2]){n, Hn * hd}));
            H3_TRY(h3_op_convert(ex, &dst, &src));
            scount[j] = n * blk;
            sdispl[j] = j * share * blk;
        }
        for (int i = 0; i < N; i++) {
            rcount[i] = (sp_off(d, i + 1) - sp_off(d, i)) * blk;
            rdispl[i] = sp_off(d, i) * blk;
        }
        H3_TRY(cm->alltoallv(cm, ex, send, scount, sdispl, all[t].data, rcount, rdispl));
    }
    H3_TRY(h3_op_attention(ex, &all[3], &all[0], &all[1], &all[2], scale, flags));
    /* back: rows of rank i to rank i; from each rank j, this rank's rows of heads j·Hn.. */
    for (int i = 0; i < N; i++) {
        scount[i] = (sp_off(d, i + 1) - sp_off(d, i)) * blk;
        sdispl[i] = sp_off(d, i) * blk;
        rcount[i] = n * blk;
        rdispl[i] = i * share * blk;
    }
    H3_TRY(cm->alltoallv(cm, ex, all[3].data, scount, sdispl, d->sp_send.data, rcount, rdispl));
    for (int j = 0; j < N; j++) {
        h3_tensor src, dst;
        H3_TRY(h3_tensor_wrap(&src, (char *)d->sp_send.data + j * share * blk, d->act_place, d->act_dtype, 2,
                              (int64_t[2]){n, Hn * hd}));
        H3_TRY(heads_rows(o3, j * Hn, Hn, &dst));
        H3_TRY(h3_op_convert(ex, &dst, &src));
    }
    return H3_OK;
}

/* h [n, H] -> attention -> out_proj -> h. With RoPE (cos/sin [n, 6F]) in DiT blocks; without in the refiner.
 * q, k, v are column blocks of one [n, 3·inner] buffer: a fused contiguous weight fills it with one GEMM, split
 * weights with three, and the official per-head interleaved weight through a chunked fused scratch. */
static h3_status attention(h3_dit *d, h3_exec *ex, int unit, const h3_dit_block_weights *w, h3_tensor *h,
                           int64_t n, const h3_tensor *cos, const h3_tensor *sin) {
    const h3_dit_config *c = &d->cfg;
    h3_dit_ws *ws = &d->ws;
    const float eps = (float)c->qk_norm_eps;
    const int64_t hd = c->head_dim;
    h3_tensor q, k, v, o, t1, t2, t3;
    H3_TRY(rows_view(&ws->q, 0, n, &q));
    H3_TRY(rows_view(&ws->k, 0, n, &k));
    H3_TRY(rows_view(&ws->v, 0, n, &v));
    H3_TRY(rows_view(&ws->o, 0, n, &o));
    if (w->qkv_interleaved) {
        /* Fused rows per head [q k v]: project a chunk of rows, then copy q, k and v out of the interleaved
         * columns (each read with a row stride of 3·head_dim). */
        for (int64_t r0 = 0; r0 < n; r0 += d->chunk_rows) {
            int64_t m = n - r0 < d->chunk_rows ? n - r0 : d->chunk_rows;
            h3_tensor hc, fused, per_head, src, dst;
            int64_t s[2] = {m * c->heads, 3 * hd};
            H3_TRY(rows_view(h, r0, m, &hc));
            H3_TRY(rows_view(&ws->fused, 0, m, &fused));
            H3_TRY(gemm_lora(d, ex, &fused, &hc, &w->qkv, unit, H3_LS_QKV));
            H3_TRY(h3_tensor_reshape(&fused, 2, s, &per_head));
            h3_tensor *outs[3] = {&q, &k, &v};
            for (int j = 0; j < 3; j++) {
                int64_t s3[3] = {m, c->heads, hd};
                H3_TRY(h3_tensor_narrow(&per_head, 1, j * hd, hd, &src));
                H3_TRY(rows_view(outs[j], r0, m, &t1));
                H3_TRY(h3_tensor_wrap(&dst, t1.data, t1.place, t1.dtype, 3, s3));
                dst.stride[0] = t1.stride[0];
                h3_tensor src3;
                H3_TRY(h3_tensor_wrap(&src3, src.data, src.place, src.dtype, 3, s3));
                src3.stride[0] = 3 * hd * c->heads;
                src3.stride[1] = 3 * hd;
                H3_TRY(copy_heads(ex, &dst, &src3));
            }
        }
    } else if (w->qkv.data) {
        h3_tensor all;
        H3_TRY(rows_view(&ws->qkv, 0, n, &all));
        H3_TRY(gemm_lora(d, ex, &all, h, &w->qkv, unit, H3_LS_QKV));
    } else {
        H3_TRY(gemm_lora(d, ex, &q, h, &w->q, unit, H3_LS_Q));
        H3_TRY(gemm_lora(d, ex, &k, h, &w->k, unit, H3_LS_K));
        H3_TRY(gemm_lora(d, ex, &v, h, &w->v, unit, H3_LS_V));
    }
    H3_TRY(heads_view(d, &q, &t1));
    H3_TRY(heads_view(d, &k, &t2));
    if (cos) { /* per-head QK-RMSNorm then RoPE, fused */
        H3_TRY(h3_op_qk_norm_rope(ex, &t1, &w->q_norm, eps, cos, sin));
        H3_TRY(h3_op_qk_norm_rope(ex, &t2, &w->k_norm, eps, cos, sin));
    } else {
        H3_TRY(qk_norm(d, ex, &t1, &w->q_norm, eps));
        H3_TRY(qk_norm(d, ex, &t2, &w->k_norm, eps));
    }
    H3_TRY(heads_view(d, &v, &t3));
    h3_tensor o3;
    H3_TRY(heads_view(d, &o, &o3));
    const float scale = (float)(1.0 / sqrt((double)hd));
    const unsigned lowbit = cos ? d->attn_flags & (H3_ATTN_FP8 | H3_ATTN_INT8 | H3_ATTN_FP8_K192) : 0u;
    if (cos && d->sp && d->sp->size > 1) /* a DiT block of the split forward: the text refiner runs whole */
        H3_TRY(attention_sp(d, ex, &t1, &t2, &t3, &o3, scale, lowbit));
    else if (cos && d->sparse_now) {
        h3_sparse_attn sp = {d->sparse_tau, d->sparse_tiles, NULL};
        H3_TRY(h3_op_attention_sparse(ex, &o3, &t1, &t2, &t3, scale, &sp));
    } else
        H3_TRY(h3_op_attention(ex, &o3, &t1, &t2, &t3, scale, lowbit));
    return gemm_lora(d, ex, h, &o, &w->out, unit, H3_LS_OUT);
}

/* One block over the first n rows of x. mod: the block's modulation table [T·3, 6H] with idx [n] selecting
 * each row's; NULL in the token refiner (plain pre-norm residuals). */
static h3_status run_block(h3_dit *d, h3_exec *ex, int unit, const h3_dit_block_weights *w, h3_tensor *x,
                           int64_t n, const h3_tensor *cos, const h3_tensor *sin, const h3_tensor *mod,
                           const h3_tensor *idx) {
    const h3_dit_config *c = &d->cfg;
    h3_dit_ws *ws = &d->ws;
    const int64_t H = c->hidden;
    const float eps = (float)c->norm_eps;
    h3_tensor h, ch[6];
    H3_TRY(rows_view(&ws->h, 0, n, &h));
    if (mod) /* shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp */
        for (int j = 0; j < 6; j++) H3_TRY(h3_tensor_narrow(mod, 1, j * H, H, &ch[j]));

    if (mod) H3_TRY(h3_op_rms_norm_modulate(ex, &h, x, &w->norm1, eps, &ch[0], &ch[1], idx));
    else H3_TRY(h3_op_rms_norm(ex, &h, x, &w->norm1, eps));
    H3_TRY(attention(d, ex, unit, w, &h, n, cos, sin));
    if (mod)
        H3_TRY(h3_op_gated_add(ex, x, &h, &ch[2], idx));
    else
        H3_TRY(h3_op_binary(ex, x, x, &h, H3_BINARY_ADD));

    if (mod) H3_TRY(h3_op_rms_norm_modulate(ex, &h, x, &w->norm2, eps, &ch[3], &ch[4], idx));
    else H3_TRY(h3_op_rms_norm(ex, &h, x, &w->norm2, eps));
    /* SwiGLU FFN in row chunks; each chunk's output overwrites its own rows of h, then joins the residual. */
    for (int64_t r0 = 0; r0 < n; r0 += d->chunk_rows) {
        int64_t m = n - r0 < d->chunk_rows ? n - r0 : d->chunk_rows;
        h3_tensor hc, xc, u, g, ic;
        H3_TRY(rows_view(&h, r0, m, &hc));
        H3_TRY(rows_view(x, r0, m, &xc));
        H3_TRY(rows_view(&ws->u, 0, m, &u));
        H3_TRY(rows_view(&ws->g, 0, m, &g));
        H3_TRY(gemm_lora(d, ex, &u, &hc, &w->fc1, unit, H3_LS_FC1));
        H3_TRY(h3_op_swiglu(ex, &g, &u, w->gate_first));
        H3_TRY(gemm_lora(d, ex, &hc, &g, &w->fc2, unit, H3_LS_FC2));
        if (mod) {
            H3_TRY(rows_view(idx, r0, m, &ic));
            H3_TRY(h3_op_gated_add(ex, &xc, &hc, &ch[5], &ic));
        } else {
            H3_TRY(h3_op_binary(ex, &xc, &xc, &hc, H3_BINARY_ADD));
        }
    }
    return H3_OK;
}

static h3_status run_unit(h3_dit *d, h3_exec *ex, int unit, h3_tensor *x, int64_t n, const h3_tensor *cos,
                          const h3_tensor *sin, const h3_tensor *mod, const h3_tensor *idx) {
    const h3_dit_block_weights *w;
    H3_TRY(h3_dit_block_acquire(d, ex, unit, &w));
    h3_status st = run_block(d, ex, unit, w, x, n, cos, sin, mod, idx);
    h3_dit_block_release(d, ex, unit);
    if (st != H3_OK) {
        int R = (int)d->cfg.n_refiner_layers;
        return h3_error_wrap(st, unit < R ? "token-refiner block %d" : "DiT block %d",
                             unit < R ? unit : unit - R);
    }
    return H3_OK;
}

/* ---- forward
 * ------------------------------------------------------------------------------------------------------ */

/* Host-built per-forward tables (RoPE angles, modulation rows, index lists) uploaded to the activation place.
 */
static h3_status stage_layout(h3_dit *d, h3_exec *ex, const h3_dit_inputs *in, const int32_t *tmap,
                              int64_t Nv, int64_t Na, int64_t L) {
    const h3_dit_config *c = &d->cfg;
    h3_dit_ws *ws = &d->ws;
    const int64_t S = in->seq_len, F = c->rope_freq_dim, R = 6 * F;
    h3_status st = H3_OK;
    /* The angles depend on the positions only, which every step of a run repeats: recompute them on change. */
    const size_t pos_bytes = (size_t)S * 3 * sizeof(double);
    const int same_pos = ws->rope_pos && memcmp(ws->rope_pos, in->position_ids, pos_bytes) == 0;
    float *cs = same_pos ? NULL : h3_malloc((size_t)(S * R) * sizeof(float), H3_MEM_WORKSPACE);
    float *sn = same_pos ? NULL : h3_malloc((size_t)(S * R) * sizeof(float), H3_MEM_WORKSPACE);
    int32_t *mi = h3_malloc((size_t)S * 2 * sizeof(int32_t), H3_MEM_WORKSPACE);
    if ((!same_pos && (!cs || !sn)) || !mi) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int64_t r = 0; r < S && !same_pos; r++) {
        /* Angles [t(F) | h(F) | w(F)], written twice: f32 position × f32 frequency, as the release computes.
         */
        for (int a = 0; a < 3; a++) {
            float p = (float)in->position_ids[r * 3 + a];
            for (int64_t j = 0; j < F; j++) {
                float ang = p * d->inv_freq[j];
                float cv = (float)cos((double)ang), sv = (float)sin((double)ang);
                cs[r * R + a * F + j] = cs[r * R + 3 * F + a * F + j] = cv;
                sn[r * R + a * F + j] = sn[r * R + 3 * F + a * F + j] = sv;
            }
        }
    }
    for (int64_t r = 0; r < S; r++) {
        int32_t t = tmap[in->timestep_indices[r]];
        mi[r] = t * 3 + in->token_tags[r]; /* the block tables' row: (timestep, modality) */
        mi[S + r] = t;                     /* the final layer's row: timestep only */
    }
    if (!same_pos) {
        H3_CHECK(h3_dit_upload(ex, &ws->cos, cs));
        H3_CHECK(h3_dit_upload(ex, &ws->sin, sn));
        if (!ws->rope_pos) ws->rope_pos = h3_malloc(pos_bytes ? pos_bytes : 1, H3_MEM_WORKSPACE);
        if (!ws->rope_pos) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        memcpy(ws->rope_pos, in->position_ids, pos_bytes);
    }
    H3_CHECK(h3_dit_upload(ex, &ws->mod_idx, mi));
    H3_CHECK(h3_dit_upload(ex, &ws->fin_idx, mi + S));
    if (Nv) H3_CHECK(h3_dit_upload(ex, &ws->vidx, in->video_indices));
    if (Na) H3_CHECK(h3_dit_upload(ex, &ws->aidx, in->audio_indices));
    if (L) H3_CHECK(h3_dit_upload(ex, &ws->tidx, in->text_indices));
done:
    h3_free(cs);
    h3_free(sn);
    h3_free(mi);
    return st;
}

/* h3_dit_forward, or one rank's share of it (h3_dit_forward_sp) when cm has more than one rank. */
static h3_status forward(h3_dit *d, h3_exec *ex, h3_comm *cm, const h3_dit_inputs *in, h3_tensor *vout,
                         h3_tensor *aout) {
    const h3_dit_config *c = &d->cfg;
    int64_t Nv = 0, Na = 0, L = 0;
    H3_TRY(check_inputs(d, in, vout, aout, &Nv, &Na, &L));
    const int split = cm && cm->size > 1;
    if (split && in->seq_len < cm->size)
        return H3_ERR(H3_ERR_INVALID, "DiT: %lld rows do not split over %d ranks", (long long)in->seq_len, cm->size);
    if (split && (c->heads % cm->size || cm->rank < 0 || cm->rank >= cm->size))
        return H3_ERR(H3_ERR_INVALID, "DiT: %lld heads do not split over %d ranks (rank %d): give a divisor of %lld",
                      (long long)c->heads, cm->size, cm->rank, (long long)c->heads);
    const int64_t S = in->seq_len, R = c->n_refiner_layers;
    const float final_eps = (float)c->final_norm_eps;
    h3_status st = H3_OK;
    int32_t *tmap = h3_malloc((size_t)in->n_timesteps * sizeof(int32_t), H3_MEM_WORKSPACE);
    if (!tmap) return H3_ERR_NOMEM;
    H3_CHECK(ensure_modulation(d, ex, in->timesteps, in->n_timesteps, tmap));
    H3_CHECK(ensure_workspace(d, S, L, Nv, Na, split ? unit_rows(S, L, cm->size, cm->rank) : S));
    H3_CHECK(stage_layout(d, ex, in, tmap, Nv, Na, L));
    d->sparse_now = 0;
    if ((d->attn_flags & H3_ATTN_SPARSE) && !split && Nv > 0 && S >= d->sparse_min_rows) {
        /* the step's t: the noisiest video rows' (keyframes and references are clean, t = 1) */
        int32_t ti = in->timestep_indices[in->video_indices[0]];
        for (int64_t i = 1; i < Nv; i++) {
            const int32_t k = in->timestep_indices[in->video_indices[i]];
            if (in->timesteps[k] < in->timesteps[ti]) ti = k;
        }
        /* a call on the window's edge counts as inside: the float32 timesteps put the h3 schedule's calls at 0.2 and
         * 0.9 of 10 steps 1e-7 off them (0.1999999, 0.9000000x) */
        const double p = h3_dit_sparse_progress(d->sparse_shift, in->timesteps[ti]), eps = 1e-5;
        if (p >= d->sparse_t0 - eps && p <= d->sparse_t1 + eps) { /* tiles with a text, audio or conditioning row stay exact */
            const int64_t nt = (S + H3_SPARSE_TILE - 1) / H3_SPARSE_TILE;
            h3_free(d->sparse_tiles);
            d->sparse_tiles = h3_calloc((size_t)nt, 1, H3_MEM_WORKSPACE);
            if (!d->sparse_tiles) H3_FAIL(H3_ERR_NOMEM, "out of memory");
            for (int64_t r = 0; r < S; r++)
                if (in->token_tags[r] != 0 || in->timestep_indices[r] != ti) d->sparse_tiles[r / H3_SPARSE_TILE] = 1;
            d->sparse_now = 1;
        }
    }
    h3_dit_ws *ws = &d->ws;
    const h3_dit_globals *g = &d->g;
    h3_tensor t1, cos, sin;
    H3_CHECK(rows_view(&ws->cos, 0, S, &cos));
    H3_CHECK(rows_view(&ws->sin, 0, S, &sin));

    /* Inputs into the packed stream x [S, H]. */
    if (Nv) {
        H3_CHECK(rows_view(&ws->h, 0, Nv, &t1));
        H3_CHECK(gemm_mixed(d, ex, &t1, in->video, &g->video_in_w, &g->video_in_b,
                            h3_lora_slot_global(c, H3_LS_VIDEO_IN)));
        H3_CHECK(h3_op_scatter_rows(ex, &ws->x, &t1, &ws->vidx));
    }
    if (Na) {
        H3_CHECK(rows_view(&ws->h, 0, Na, &t1));
        H3_CHECK(gemm_mixed(d, ex, &t1, in->audio, &g->audio_in_w, &g->audio_in_b,
                            h3_lora_slot_global(c, H3_LS_AUDIO_IN)));
        H3_CHECK(h3_op_scatter_rows(ex, &ws->x, &t1, &ws->aidx));
    }
    if (L) {
        H3_CHECK(gemm_mixed(d, ex, &ws->xt, in->text, &g->text_in_w, &g->text_in_b,
                            h3_lora_slot_global(c, H3_LS_TEXT_IN)));
        for (int u = 0; u < R; u++) H3_CHECK(run_unit(d, ex, u, &ws->xt, L, NULL, NULL, NULL, NULL));
        H3_CHECK(h3_op_rms_norm(ex, &ws->xt, &ws->xt, &g->refiner_norm, final_eps));
        H3_CHECK(h3_op_scatter_rows(ex, &ws->x, &ws->xt, &ws->tidx));
    }

    if (!split) {
        for (int64_t b = 0; b < c->n_layers; b++)
            H3_CHECK(run_unit(d, ex, (int)(R + b), &ws->x, S, &cos, &sin, &d->mod[b], &ws->mod_idx));
    } else { /* this rank's rows through the blocks, then every rank's rows gathered back into x */
        const int N = cm->size;
        const int64_t share = (S + N - 1) / N, inner = c->heads * c->head_dim / N;
        d->sp = cm;
        d->sp_S = S;
        const int64_t o0 = sp_off(d, cm->rank), n = sp_off(d, cm->rank + 1) - o0;
        h3_tensor xr, cr, sr, ir;
        H3_CHECK(act_alloc(d, &d->sp_send, 3 * N * share, inner));
        H3_CHECK(act_alloc(d, &d->sp_recv, 4 * S, inner));
        H3_CHECK(rows_view(&ws->x, o0, n, &xr));
        H3_CHECK(rows_view(&cos, o0, n, &cr));
        H3_CHECK(rows_view(&sin, o0, n, &sr));
        H3_CHECK(rows_view(&ws->mod_idx, o0, n, &ir));
        for (int64_t b = 0; b < c->n_layers; b++)
            H3_CHECK(run_unit(d, ex, (int)(R + b), &xr, n, &cr, &sr, &d->mod[b], &ir));
        int64_t ld, sc[H3_COMM_MAX_RANKS], sd[H3_COMM_MAX_RANKS], rc[H3_COMM_MAX_RANKS], rd[H3_COMM_MAX_RANKS];
        if (!h3_tensor_is_rowwise(&ws->x, &ld)) H3_FAIL(H3_ERR_INTERNAL, "DiT: the residual stream is not row-wise");
        const int64_t row = ld * (int64_t)h3_dtype_size(ws->x.dtype);
        for (int i = 0; i < N; i++) {
            sc[i] = n * row;
            sd[i] = o0 * row;
            rc[i] = (sp_off(d, i + 1) - sp_off(d, i)) * row;
            rd[i] = sp_off(d, i) * row;
        }
        H3_CHECK(cm->alltoallv(cm, ex, ws->x.data, sc, sd, ws->x.data, rc, rd));
    }

    /* Final RMSNorm with per-timestep shift (first half) and scale, then the two heads on their rows. */
    {
        h3_tensor shift, scale;
        const h3_tensor *fm = &d->mod[c->n_layers];
        H3_CHECK(h3_tensor_narrow(fm, 1, 0, c->hidden, &shift));
        H3_CHECK(h3_tensor_narrow(fm, 1, c->hidden, c->hidden, &scale));
        H3_CHECK(h3_op_rms_norm_modulate(ex, &ws->h, &ws->x, &g->final_norm, final_eps, &shift, &scale,
                                          &ws->fin_idx));
    }
    if (Nv) {
        H3_CHECK(rows_view(&ws->x, 0, Nv, &t1));
        H3_CHECK(h3_op_gather_rows(ex, &t1, &ws->h, &ws->vidx));
        H3_CHECK(gemm_mixed(d, ex, vout, &t1, &g->video_out_w, &g->video_out_b,
                            h3_lora_slot_global(c, H3_LS_VIDEO_OUT)));
    }
    if (Na) {
        H3_CHECK(rows_view(&ws->x, 0, Na, &t1));
        H3_CHECK(h3_op_gather_rows(ex, &t1, &ws->h, &ws->aidx));
        H3_CHECK(gemm_mixed(d, ex, aout, &t1, &g->audio_out_w, &g->audio_out_b,
                            h3_lora_slot_global(c, H3_LS_AUDIO_OUT)));
    }
done:
    h3_free(tmap);
    d->sparse_now = 0;
    if (split) {
        if (st != H3_OK && cm->abort) cm->abort(cm); /* the other ranks would wait for this one for ever */
        h3_tensor_free(&d->sp_send);
        h3_tensor_free(&d->sp_recv);
        d->sp = NULL;
    }
    return st;
}

h3_status h3_dit_forward(h3_dit *d, h3_exec *ex, const h3_dit_inputs *in, h3_tensor *vout, h3_tensor *aout) {
    return forward(d, ex, NULL, in, vout, aout);
}

h3_status h3_dit_forward_sp(h3_dit *d, h3_exec *ex, h3_comm *comm, const h3_dit_inputs *in, h3_tensor *vout,
                            h3_tensor *aout) {
    if (!comm) return H3_ERR(H3_ERR_INVALID, "h3_dit_forward_sp: no group given");
    return forward(d, ex, comm, in, vout, aout);
}

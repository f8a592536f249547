/* The MiniMax-H3 DiT: config in either naming, weights in the official, diffusers and ComfyUI layouts, block
 * acquire/release. The forward and the AdaLN modulation are in dit_forward.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "models/dit_internal.h"
#include "models/lora.h"
#include "io/wbind.h"
#include "quant/qload.h"
#include "quant/qwrite.h"

/* ---- config
 * ------------------------------------------------------------------------------------------------ */

void h3_dit_config_default(h3_dit_config *c) {
    memset(c, 0, sizeof *c);
    c->hidden = 5376;
    c->n_layers = 50;
    c->n_refiner_layers = 2;
    c->heads = 56;
    c->head_dim = 128;
    c->ffn = 14336;
    c->in_channels = 24;
    c->patch[0] = 1;
    c->patch[1] = 2;
    c->patch[2] = 2;
    c->audio_dim = 32;
    c->text_dim = 5120;
    c->freq_dim = 256;
    c->time_hidden = 5376;
    c->time_embed_dim = 2688;
    c->rope_freq_dim = 16;
    c->rope_theta = 10000.0;
    c->norm_eps = c->qk_norm_eps = c->final_norm_eps = 1e-5;
    c->curve_grid = 1025;
}

/* An integer under any of the names (NULL-terminated); 0 when none is present. */
static h3_status json_int_any(const json_t *j, const char *what, const char *const *keys, int64_t *out,
                              int *found) {
    *found = 0;
    for (int i = 0; keys[i]; i++) {
        json_t *v = json_object_get(j, keys[i]);
        if (!v) continue;
        if (json_is_integer(v)) {
            *out = (int64_t)json_integer_value(v);
        } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
                   fabs(json_real_value(v)) < 9e15) {
            *out = (int64_t)json_real_value(v);
        } else {
            return H3_ERR(H3_ERR_FORMAT, "%s: '%s' must be an integer", what, keys[i]);
        }
        *found = 1;
        return H3_OK;
    }
    return H3_OK;
}

static h3_status json_num(const json_t *j, const char *what, const char *key, double *out) {
    json_t *v = json_object_get(j, key);
    if (!v) return H3_OK;
    if (!json_is_number(v)) return H3_ERR(H3_ERR_FORMAT, "%s: '%s' must be a number", what, key);
    *out = json_number_value(v);
    return H3_OK;
}

h3_status h3_dit_config_from_json(const json_t *j, const char *what, h3_dit_config *c) {
    if (!json_is_object(j)) return H3_ERR(H3_ERR_FORMAT, "%s: a DiT config must be a JSON object", what);
    h3_dit_config_default(c);
    struct {
        const char *names[3];
        int64_t *dst;
    } ints[] = {
        {{"hidden_size", NULL}, &c->hidden},
        {{"num_layers", NULL}, &c->n_layers},
        {{"token_refiner_num_layers", "num_refiner_layers", NULL}, &c->n_refiner_layers},
        {{"num_attention_heads", NULL}, &c->heads},
        {{"attention_head_dim", NULL}, &c->head_dim},
        {{"ffn_hidden_size", "ffn_dim", NULL}, &c->ffn},
        {{"latents_dim", "in_channels", NULL}, &c->in_channels},
        {{"audio_latents_dim", "audio_in_channels", NULL}, &c->audio_dim},
        {{"text_dim", NULL}, &c->text_dim},
        {{"timestep_input_dim", "freq_dim", NULL}, &c->freq_dim},
        {{"time_embed_hidden_size", "time_embed_hidden_dim", NULL}, &c->time_hidden},
        {{"time_embed_dim", NULL}, &c->time_embed_dim},
        {{"rope_inv_freq_len", "rope_freq_dim", NULL}, &c->rope_freq_dim},
    };
    int found;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        H3_TRY(json_int_any(j, what, ints[i].names, ints[i].dst, &found));
    json_t *p = json_object_get(j, "patch_size");
    if (p) {
        if (!json_is_array(p) || json_array_size(p) != 3)
            return H3_ERR(H3_ERR_FORMAT, "%s: 'patch_size' must be a list of 3 integers (t, h, w)", what);
        for (int i = 0; i < 3; i++) {
            json_t *e = json_array_get(p, (size_t)i);
            if (!json_is_integer(e))
                return H3_ERR(H3_ERR_FORMAT, "%s: 'patch_size' must hold integers", what);
            c->patch[i] = (int64_t)json_integer_value(e);
        }
    }
    H3_TRY(json_num(j, what, "rope_theta", &c->rope_theta));
    H3_TRY(json_num(j, what, "norm_eps", &c->norm_eps));
    H3_TRY(json_num(j, what, "qk_norm_eps", &c->qk_norm_eps));
    H3_TRY(json_num(j, what, "final_norm_eps", &c->final_norm_eps));
    /* Derived figures the official config also states: they must agree. */
    int64_t v;
    const char *k1[] = {"adaln_out_features", NULL}, *k2[] = {"final_adaln_out_features", NULL};
    H3_TRY(json_int_any(j, what, k1, &v, &found));
    if (found && v != 18 * c->hidden)
        return H3_ERR(H3_ERR_FORMAT, "%s: adaln_out_features %lld should be 6·3·hidden_size = %lld", what,
                      (long long)v, (long long)(18 * c->hidden));
    H3_TRY(json_int_any(j, what, k2, &v, &found));
    if (found && v != 2 * c->hidden)
        return H3_ERR(H3_ERR_FORMAT, "%s: final_adaln_out_features %lld should be 2·hidden_size = %lld", what,
                      (long long)v, (long long)(2 * c->hidden));
    H3_TRY_CTX(h3_dit_config_check(c), "%s", what);
    return H3_OK;
}

h3_status h3_dit_config_check(const h3_dit_config *c) {
    const int64_t big = (int64_t)1 << 24;
    struct {
        const char *name;
        int64_t v, lo;
    } f[] = {
        {"hidden size", c->hidden, 1},
        {"number of layers", c->n_layers, 0},
        {"refiner layers", c->n_refiner_layers, 0},
        {"attention heads", c->heads, 1},
        {"head dim", c->head_dim, 2},
        {"FFN width", c->ffn, 1},
        {"latent channels", c->in_channels, 1},
        {"audio channels", c->audio_dim, 1},
        {"text dim", c->text_dim, 1},
        {"time embedding width", c->time_embed_dim, 1},
        {"RoPE frequencies", c->rope_freq_dim, 1},
        {"patch t", c->patch[0], 1},
        {"patch h", c->patch[1], 1},
        {"patch w", c->patch[2], 1},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < f[i].lo || f[i].v > big)
            return H3_ERR(H3_ERR_INVALID, "DiT config: %s %lld is outside [%lld, %lld]", f[i].name,
                          (long long)f[i].v, (long long)f[i].lo, (long long)big);
    if (!c->adaln_pruned && (c->freq_dim < 2 || c->freq_dim % 2 || c->freq_dim > big || c->time_hidden < 1 ||
                             c->time_hidden > big))
        return H3_ERR(H3_ERR_INVALID,
                      "DiT config: timestep sinusoid width %lld must be even and >= 2, time MLP width "
                      "%lld positive",
                      (long long)c->freq_dim, (long long)c->time_hidden);
    if (c->adaln_pruned && (c->curve_grid < 2 || c->curve_grid > big))
        return H3_ERR(H3_ERR_INVALID, "DiT config: the AdaLN curve table needs at least 2 rows, has %lld",
                      (long long)c->curve_grid);
    if (6 * c->rope_freq_dim > c->head_dim)
        return H3_ERR(H3_ERR_INVALID,
                      "DiT config: RoPE rotates 6·%lld = %lld channels, more than head_dim %lld",
                      (long long)c->rope_freq_dim, (long long)(6 * c->rope_freq_dim), (long long)c->head_dim);
    if (c->heads * c->head_dim > big || c->in_channels * c->patch[0] * c->patch[1] * c->patch[2] > big)
        return H3_ERR(H3_ERR_INVALID, "DiT config: widths too large");
    if (!(c->rope_theta > 0) || !(c->norm_eps > 0) || !(c->qk_norm_eps > 0) || !(c->final_norm_eps > 0) ||
        !isfinite(c->rope_theta))
        return H3_ERR(H3_ERR_INVALID, "DiT config: rope_theta and the norm epsilons must be positive");
    return H3_OK;
}

/* ---- the weight table: every tensor of the layout, as binder rows (io/wbind.h)
 * ---------------------------- */

/* A row's tag: part of the AdaLN branch (time embedder, curve table, adaln_proj). */
#define DIT_ADALN 1

typedef h3_status (*wdesc_fn)(h3_dit *d, const h3_wb_row *w, void *user);

static int is_diffusers(const h3_dit *d) {
    return d->layout == H3_LAYOUT_DIFFUSERS;
}

/* Calls fn for every weight of the layout in a fixed order; stops at the first failure. Matrices may be
 * stored quantized (the file's format decides; the binder checks their logical shape); vectors are plain
 * floats. */
static h3_status each_weight(h3_dit *d, wdesc_fn fn, void *user) {
    const h3_dit_config *c = &d->cfg;
    const int df = is_diffusers(d);
    const int64_t H = c->hidden, inner = h3_dit_inner(c), vd = h3_dit_video_dim(c), ted = c->time_embed_dim;
    h3_dit_globals *g = &d->g;
    h3_wb_unit unit = {NULL, 0, -1};
    char nm[256];
#define W(name_, t_, d0_, d1_, shape_, opt_, adaln_)                                                         \
    do {                                                                                                     \
        h3_wb_row w_ =                                                                                       \
            h3_wb_row_make((name_), (t_), (d1_) < 0 ? 1 : 2, (d0_), (d1_), 0, 0, H3_WB_FLOATS,               \
                           ((opt_) ? H3_WB_OPTIONAL : 0u) | ((d1_) < 0 ? 0u : H3_WB_QUANT), (shape_), unit); \
        w_.tag = (adaln_);                                                                                   \
        H3_TRY(fn(d, &w_, user));                                                                            \
    } while (0)
    W(df ? "proj_in.weight" : "video_patch_proj.weight", &g->video_in_w, H, vd, "[hidden, video row width]",
      0, 0);
    W(df ? "proj_in.bias" : "video_patch_proj.bias", &g->video_in_b, H, -1, "[hidden]", 0, 0);
    W(df ? "audio_proj_in.weight" : "audio_patch_proj.weight", &g->audio_in_w, H, c->audio_dim,
      "[hidden, audio channels]", 0, 0);
    W(df ? "audio_proj_in.bias" : "audio_patch_proj.bias", &g->audio_in_b, H, -1, "[hidden]", 0, 0);
    W(df ? "context_embedder.weight" : "condition_proj.weight", &g->text_in_w, H, c->text_dim,
      "[hidden, text dim]", 0, 0);
    W(df ? "context_embedder.bias" : "condition_proj.bias", &g->text_in_b, H, -1, "[hidden]", 0, 0);
    if (c->adaln_pruned) {
        W("adaln_t_table", &g->curve, c->curve_grid, ted, "[grid, rank]", 0, 1);
    } else {
        W(df ? "time_embedder.linear_1.weight" : "time_embedder.proj_in.weight", &g->time_in_w,
          c->time_hidden, c->freq_dim, "[time MLP width, sinusoid width]", 0, 1);
        W(df ? "time_embedder.linear_1.bias" : "time_embedder.proj_in.bias", &g->time_in_b, c->time_hidden,
          -1, "[time MLP width]", 0, 1);
        W(df ? "time_embedder.linear_2.weight" : "time_embedder.proj_out.weight", &g->time_out_w, ted,
          c->time_hidden, "[time embedding width, time MLP width]", 0, 1);
        W(df ? "time_embedder.linear_2.bias" : "time_embedder.proj_out.bias", &g->time_out_b, ted, -1,
          "[time embedding width]", 0, 1);
    }
    if (!df) W("rope.inv_freq", &g->inv_freq, c->rope_freq_dim, -1, "[RoPE frequencies]", 1, 0);
    for (int u = 0; u < h3_dit_n_units(c); u++) {
        int ref = u < c->n_refiner_layers;
        int i = ref ? u : u - (int)c->n_refiner_layers;
        h3_dit_block_weights *b = &d->units[u];
        unit = (h3_wb_unit){ref ? "token-refiner block" : "DiT block", i, u};
        char p[96];
        if (df)
            snprintf(p, sizeof p, ref ? "token_refiner.refiner_blocks.%d." : "transformer_blocks.%d.", i);
        else
            snprintf(p, sizeof p, ref ? "token_refiner.blocks.%d." : "blocks.%d.", i);
#define BW(suffix_, t_, d0_, d1_, shape_, adaln_)                                                            \
    do {                                                                                                     \
        snprintf(nm, sizeof nm, "%s%s", p, (suffix_));                                                       \
        W(nm, (t_), (d0_), (d1_), (shape_), 0, (adaln_));                                                    \
    } while (0)
        BW("norm1.weight", &b->norm1, H, -1, "[hidden]", 0);
        BW("norm2.weight", &b->norm2, H, -1, "[hidden]", 0);
        if (df) {
            BW("attn.to_q.weight", &b->q, inner, H, "[heads·head_dim, hidden]", 0);
            BW("attn.to_k.weight", &b->k, inner, H, "[heads·head_dim, hidden]", 0);
            BW("attn.to_v.weight", &b->v, inner, H, "[heads·head_dim, hidden]", 0);
            BW("attn.norm_q.weight", &b->q_norm, c->head_dim, -1, "[head_dim]", 0);
            BW("attn.norm_k.weight", &b->k_norm, c->head_dim, -1, "[head_dim]", 0);
            BW("attn.to_out.0.weight", &b->out, H, inner, "[hidden, heads·head_dim]", 0);
            BW("ff.net.0.proj.weight", &b->fc1, 2 * c->ffn, H, "[2·FFN, hidden]", 0);
            BW("ff.net.2.weight", &b->fc2, H, c->ffn, "[hidden, FFN]", 0);
        } else {
            BW("attn.qkv_proj.weight", &b->qkv, 3 * inner, H, "[3·heads·head_dim, hidden]", 0);
            BW("attn.q_norm.weight", &b->q_norm, c->head_dim, -1, "[head_dim]", 0);
            BW("attn.k_norm.weight", &b->k_norm, c->head_dim, -1, "[head_dim]", 0);
            BW("attn.out_proj.weight", &b->out, H, inner, "[hidden, heads·head_dim]", 0);
            BW("mlp.fc1.weight", &b->fc1, 2 * c->ffn, H, "[2·FFN, hidden]", 0);
            BW("mlp.fc2.weight", &b->fc2, H, c->ffn, "[hidden, FFN]", 0);
        }
        if (!ref) {
            BW("adaln_proj.linear.weight", &d->adaln_w[i], 18 * H, ted, "[6·3·hidden, time embedding width]",
               1);
            BW("adaln_proj.linear.bias", &d->adaln_b[i], 18 * H, -1, "[6·3·hidden]", 1);
        }
#undef BW
    }
    unit = (h3_wb_unit){NULL, 0, -1};
    W("token_refiner.final_norm.weight", &g->refiner_norm, H, -1, "[hidden]", 0, 0);
    W(df ? "norm_out.norm.weight" : "final_layer.norm.weight", &g->final_norm, H, -1, "[hidden]", 0, 0);
    W(df ? "norm_out.linear.weight" : "final_layer.adaln_proj.linear.weight", &g->final_adaln_w, 2 * H, ted,
      "[2·hidden, time embedding width]", 0, 1);
    W(df ? "norm_out.linear.bias" : "final_layer.adaln_proj.linear.bias", &g->final_adaln_b, 2 * H, -1,
      "[2·hidden]", 0, 1);
    W(df ? "proj_out.weight" : "final_layer.video_out.weight", &g->video_out_w, vd, H,
      "[video row width, hidden]", 0, 0);
    W(df ? "proj_out.bias" : "final_layer.video_out.bias", &g->video_out_b, vd, -1, "[video row width]", 0,
      0);
    W(df ? "audio_proj_out.weight" : "final_layer.audio_out.weight", &g->audio_out_w, c->audio_dim, H,
      "[audio channels, hidden]", 0, 0);
    W(df ? "audio_proj_out.bias" : "final_layer.audio_out.bias", &g->audio_out_b, c->audio_dim, -1,
      "[audio channels]", 0, 0);
#undef W
    return H3_OK;
}

static h3_status bind_one(h3_dit *d, const h3_wb_row *w, void *user) {
    h3_wb_row r = *w;
    if (d->gguf) r.flags |= H3_WB_QUANT; /* GGUF stores vectors in block formats too */
    return h3_wb_bind(user, &r);
}

static h3_status alloc_one(h3_dit *d, const h3_wb_row *w, void *user) {
    h3_dtype core = *(const h3_dtype *)user;
    if (w->flags & H3_WB_OPTIONAL) return H3_OK; /* rope.inv_freq: computed from the config */
    /* The release's fp32 islands: patch projections, time embedder, output heads; the rest is bf16. */
    const h3_dit_globals *g = &d->g;
    const h3_tensor *t = w->dst;
    int island = t == &g->video_in_w || t == &g->video_in_b || t == &g->audio_in_w || t == &g->audio_in_b ||
                 t == &g->time_in_w || t == &g->time_in_b || t == &g->time_out_w || t == &g->time_out_b ||
                 t == &g->video_out_w || t == &g->video_out_b || t == &g->audio_out_w ||
                 t == &g->audio_out_b || t == &g->inv_freq || t == &g->curve;
    /* the curve table is read by the host (as h3_dit_upload_weights leaves it) */
    h3_place place = t == &g->curve && d->weight_place == H3_PLACE_DEVICE ? H3_PLACE_HOST : d->weight_place;
    return h3_tensor_alloc(w->dst, place, island ? H3_F32 : core, w->ndim, w->shape, H3_MEM_WEIGHTS);
}

/* q, k, v: the row blocks of a contiguous fused QKV weight [3·inner, H]. */
static h3_status qkv_views(h3_dit_block_weights *b, int64_t inner) {
    H3_TRY(h3_tensor_narrow(&b->qkv, 0, 0, inner, &b->q));
    H3_TRY(h3_tensor_narrow(&b->qkv, 0, inner, inner, &b->k));
    return h3_tensor_narrow(&b->qkv, 0, 2 * inner, inner, &b->v);
}

/* After binding: q/k/v views of a contiguous fused QKV, flags, and the host RoPE frequencies. */
static h3_status finish_weights(h3_dit *d) {
    const h3_dit_config *c = &d->cfg;
    int64_t inner = h3_dit_inner(c);
    for (int u = 0; u < h3_dit_n_units(c); u++) {
        h3_dit_block_weights *b = &d->units[u];
        b->gate_first = d->gate_first;
        b->qkv_interleaved = b->qkv.data && d->qkv_interleaved;
        if (b->qkv.data && !d->qkv_interleaved) H3_TRY(qkv_views(b, inner));
    }
    d->inv_freq = h3_malloc((size_t)c->rope_freq_dim * sizeof(float), H3_MEM_WEIGHTS);
    if (!d->inv_freq) return H3_ERR_NOMEM;
    if (d->g.inv_freq.data) {
        if (!h3_convert_to_f32(d->g.inv_freq.dtype, d->g.inv_freq.data, d->inv_freq,
                               (size_t)c->rope_freq_dim))
            return H3_ERR(H3_ERR_FORMAT, "%s: rope.inv_freq is not a float tensor", d->source);
    } else {
        /* 1 / theta^(2j / 2F) in f32, as the release computes it (bitwise equal to the shipped buffer). */
        for (int64_t j = 0; j < c->rope_freq_dim; j++) {
            float e = (float)(2 * j) / (float)(2 * c->rope_freq_dim);
            d->inv_freq[j] = 1.0f / powf((float)c->rope_theta, e);
        }
    }
    for (int64_t j = 0; j < c->rope_freq_dim; j++)
        if (!isfinite(d->inv_freq[j]))
            return H3_ERR(H3_ERR_FORMAT, "%s: rope.inv_freq[%lld] is not finite", d->source, (long long)j);
    return H3_OK;
}

static void set_describe(h3_dit *d, const char *config_src) {
    const h3_dit_config *c = &d->cfg;
    snprintf(d->describe, sizeof d->describe,
             "%s layout, %s QKV, fc1 %s, %s AdaLN; %lld blocks + %lld refiner blocks, hidden %lld, %lld "
             "heads x %lld, "
             "FFN %lld; config from %s",
             d->layout == H3_LAYOUT_UNKNOWN ? "in-memory" : h3_layout_name(d->layout),
             is_diffusers(d) ? "split" : (d->qkv_interleaved ? "per-head interleaved" : "contiguous"),
             d->gate_first ? "[gate; value]" : "[value; gate]",
             c->adaln_pruned ? "pruned (curve table)" : "full", (long long)c->n_layers,
             (long long)c->n_refiner_layers, (long long)c->hidden, (long long)c->heads,
             (long long)c->head_dim, (long long)c->ffn, config_src);
}

static h3_status alloc_units(h3_dit *d) {
    const h3_dit_config *c = &d->cfg;
    int n = h3_dit_n_units(c);
    d->units = h3_calloc((size_t)(n ? n : 1), sizeof *d->units, H3_MEM_OTHER);
    d->adaln_w = h3_calloc((size_t)(c->n_layers ? c->n_layers : 1), sizeof *d->adaln_w, H3_MEM_OTHER);
    d->adaln_b = h3_calloc((size_t)(c->n_layers ? c->n_layers : 1), sizeof *d->adaln_b, H3_MEM_OTHER);
    if (!d->units || !d->adaln_w || !d->adaln_b) return H3_ERR_NOMEM;
    return H3_OK;
}

static void apply_opts(h3_dit *d, const h3_dit_open_opts *o) {
    d->act_place = o ? o->act_place : H3_PLACE_HOST;
    d->weight_place = o ? o->weight_place : H3_PLACE_HOST;
    d->act_dtype = (o && o->act_dtype != H3_F32) ? o->act_dtype
                                                : (d->act_place == H3_PLACE_DEVICE ? H3_BF16 : H3_F32);
    /* Row chunks bound the FFN scratch; on the device a chunk costs GEMM efficiency, so the default there is the
     * whole sequence (the memory planner picks smaller chunks when a budget needs them). */
    d->chunk_rows = (o && o->chunk_rows > 0) ? o->chunk_rows : (d->act_place == H3_PLACE_DEVICE ? (1 << 30) : 2048);
    d->sparse_tau = H3_DIT_SPARSE_TAU;
    d->sparse_t0 = H3_DIT_SPARSE_T0;
    d->sparse_t1 = H3_DIT_SPARSE_T1;
    d->sparse_min_rows = H3_DIT_SPARSE_MIN_ROWS;
    d->sparse_shift = 1.0;
    d->stream_weights = o ? o->stream_weights : 0;
}

/* The activation dtype must suit the place: the CPU kernels compute in f32. */
static h3_status check_places(const h3_dit *d) {
    if (d->act_place != H3_PLACE_DEVICE && d->act_dtype != H3_F32)
        return H3_ERR(H3_ERR_INVALID, "DiT: activations on the host are f32, not %s", h3_dtype_name(d->act_dtype));
    if (d->act_dtype != H3_F32 && d->act_dtype != H3_BF16 && d->act_dtype != H3_F16)
        return H3_ERR(H3_ERR_INVALID, "DiT: activations can be f32, bf16 or f16, not %s",
                      h3_dtype_name(d->act_dtype));
    if (d->stream_weights) { /* to the device; to the host only in tests of the streamer's host emulation */
        if (d->weight_place == H3_PLACE_DEVICE)
            return H3_ERR(H3_ERR_INVALID, "DiT: streamed weights live on the host (or pinned), not on the %s",
                          h3_place_name(d->weight_place));
        return H3_OK;
    }
    if ((d->weight_place == H3_PLACE_DEVICE) != (d->act_place == H3_PLACE_DEVICE))
        return H3_ERR(H3_ERR_INVALID, "DiT: weights on the %s and activations on the %s cannot compute together "
                      "(streaming between them is the streamer's job)",
                      h3_place_name(d->weight_place), h3_place_name(d->act_place));
    return H3_OK;
}

typedef struct {
    h3_status st;
} check_ctx;

static int check_one(const char *name, h3_tensor *t, void *user) {
    check_ctx *c = user;
    const char *why;
    if (!strcmp(name, "adaln_t_table") || !strcmp(name, "rope.inv_freq")) return 0; /* the host reads them */
    if (h3_quant_gpu_supported(t, &why)) return 0;
    c->st = H3_ERR(H3_ERR_UNSUPPORTED,
                   "DiT weight '%s' is %s with %s, which runs on the CPU only for now: use --device cpu", name,
                   h3_dtype_name(t->dtype), why);
    return 1;
}

h3_status h3_dit_device_check(const h3_dit *d) {
    check_ctx c = {H3_OK};
    h3_dit_visit_weights((h3_dit *)d, check_one, &c);
    if (c.st != H3_OK) return c.st;
    /* the blocks' GEMMs on the device take bf16 (or quantized) weights beside bf16 activations: a file whose
     * blocks were upcast to float32 is refused here, with the fix, rather than by the first GEMM (a DiT that
     * streams on the host computes in f32 and takes them) */
    for (int u = 0; d->act_place == H3_PLACE_DEVICE && u < h3_dit_n_units(&d->cfg); u++) {
        const h3_dit_block_weights *b = &d->units[u];
        const h3_tensor *lin[6] = {&b->qkv, &b->q, &b->out, &b->fc1, &b->fc2, &b->k};
        for (int i = 0; i < 6; i++)
            if (lin[i]->data && lin[i]->q.mode == H3_SCALE_NONE && lin[i]->dtype == H3_F32) {
                const int ref = u < d->cfg.n_refiner_layers;
                return H3_ERR(H3_ERR_UNSUPPORTED,
                              "%s %d's linear weights are float32: on the GPU the blocks run in bf16 from bf16 "
                              "or quantized weights (the release stores them in bf16); use --device cpu for "
                              "this file, or a bf16 or quantized one (h3run quantize)",
                              ref ? "token-refiner block" : "DiT block",
                              ref ? u : u - (int)d->cfg.n_refiner_layers);
            }
    }
    for (int u = 0; u < h3_dit_n_units(&d->cfg); u++)
        if (d->units[u].qkv_interleaved && d->units[u].qkv.q.mode != H3_SCALE_NONE)
            return H3_ERR(H3_ERR_UNSUPPORTED,
                          "DiT block %d: quantized QKV rows in the official per-head order are not read on the device "
                          "(h3run quantize writes them in ComfyUI's [Q; K; V] order)",
                          u);
    return H3_OK;
}

/* A quantized weight to the weight place in its stored form (values and scales), where the GPU's quantized
 * GEMM reads it. */
static h3_status upload_quantized(h3_dit *d, const h3_wb_row *w, h3_exec *ex) {
    h3_tensor dev;
    H3_TRY_CTX(h3_quant_copy_to(ex, w->dst, d->weight_place, H3_MEM_WEIGHTS, &dev),
               "uploading DiT weight '%s'", w->name);
    h3_tensor_free(w->dst);
    *w->dst = dev;
    return H3_OK;
}

/* Replaces a weight held on the host by an owned copy at the weight place (the device). */
static h3_status upload_one(h3_dit *d, const h3_wb_row *w, void *user) {
    h3_exec *ex = user;
    h3_tensor *t = w->dst;
    if (!t->data || t->place == d->weight_place) return H3_OK;
    if (t == &d->g.curve || t == &d->g.inv_freq) return H3_OK; /* small tables the host reads */
    if (t->q.mode != H3_SCALE_NONE || t->dtype == H3_I8 || t->dtype == H3_F8_E4M3 || t->dtype == H3_F8_E5M2)
        return upload_quantized(d, w, ex);
    h3_tensor dev;
    H3_TRY(h3_tensor_alloc(&dev, d->weight_place, t->dtype, t->ndim, t->shape, H3_MEM_WEIGHTS));
    h3_status st = h3_copy(ex, &dev, t);
    if (st != H3_OK) {
        h3_tensor_free(&dev);
        return h3_error_wrap(st, "uploading DiT weight '%s'", w->name);
    }
    h3_tensor_free(t);
    *t = dev;
    return H3_OK;
}

/* The official files' fused QKV rows are per-head interleaved ([h0: q k v, h1: q k v, ...]); on the device they are
 * reordered once to contiguous [Q; K; V] (one gather), so every step runs one fused GEMM with q, k and v as column
 * blocks instead of per-head copies. Costs a transient second copy of one block's QKV. */
static h3_status deinterleave_qkv(h3_dit *d, h3_exec *ex) {
    const h3_dit_config *c = &d->cfg;
    const int64_t inner = h3_dit_inner(c), hd = c->head_dim, H = c->heads;
    h3_status st = H3_OK;
    int32_t *perm = h3_malloc((size_t)(3 * inner) * sizeof(int32_t), H3_MEM_WORKSPACE);
    h3_tensor idx = {0};
    if (!perm) return H3_ERR_NOMEM;
    for (int64_t j = 0; j < 3; j++) /* new row j·inner + h·hd + e reads old row h·3·hd + j·hd + e */
        for (int64_t h = 0; h < H; h++)
            for (int64_t e = 0; e < hd; e++) perm[j * inner + h * hd + e] = (int32_t)(h * 3 * hd + j * hd + e);
    int64_t n = 3 * inner;
    H3_CHECK(h3_tensor_alloc(&idx, d->weight_place, H3_I32, 1, &n, H3_MEM_WORKSPACE));
    {
        h3_tensor host;
        H3_CHECK(h3_tensor_wrap(&host, perm, H3_PLACE_HOST, H3_I32, 1, &n));
        H3_CHECK(h3_copy(ex, &idx, &host));
    }
    for (int u = 0; u < h3_dit_n_units(c); u++) {
        h3_dit_block_weights *b = &d->units[u];
        if (!b->qkv.data || !b->qkv_interleaved) continue;
        h3_tensor out;
        H3_CHECK(h3_tensor_alloc(&out, d->weight_place, b->qkv.dtype, 2, b->qkv.shape, H3_MEM_WEIGHTS));
        st = h3_op_gather_rows(ex, &out, &b->qkv, &idx);
        if (st != H3_OK) {
            h3_tensor_free(&out);
            goto done;
        }
        H3_CHECK(h3_exec_sync(ex));
        h3_tensor_free(&b->qkv);
        b->qkv = out;
        b->qkv_interleaved = 0;
    }
    d->qkv_interleaved = 0;
done:
    h3_tensor_free(&idx);
    h3_free(perm);
    return st;
}

h3_status h3_dit_upload_weights(h3_dit *d, h3_exec *ex) {
    if (d->weight_place != H3_PLACE_DEVICE) return H3_OK;
    H3_TRY(h3_dit_device_check(d));
    H3_TRY(each_weight(d, upload_one, ex));
    H3_TRY(h3_exec_sync(ex));
    for (int u = 0; u < h3_dit_n_units(&d->cfg); u++) /* the quantized GEMMs' scratch, up front */
        if (d->units[u].fc1.q.mode != H3_SCALE_NONE || d->units[u].qkv.q.mode != H3_SCALE_NONE) {
            H3_TRY(h3_cuda_qgemm_reserve(ex));
            break;
        }
    if (d->qkv_interleaved) H3_TRY(deinterleave_qkv(d, ex));
    /* q/k/v views of a contiguous fused QKV must follow the uploaded tensor */
    const h3_dit_config *c = &d->cfg;
    int64_t inner = h3_dit_inner(c);
    for (int u = 0; u < h3_dit_n_units(c); u++) {
        h3_dit_block_weights *b = &d->units[u];
        if (b->qkv.data && !d->qkv_interleaved) H3_TRY(qkv_views(b, inner));
    }
    return H3_OK;
}

/* One weight replaced by its quantization in format target, at its place. */
static h3_status quantize_one(h3_exec *ex, h3_tensor *t, int target, h3_pool *pool, const char *what) {
    const int64_t N = t->shape[0], K = t->shape[1];
    h3_status st = H3_OK;
    h3_tensor hf = {0}, tmp = {0}, q = {0}, q2 = {0};
    if (target == H3_QT_FP8 && t->place == H3_PLACE_DEVICE && (t->dtype == H3_BF16 || t->dtype == H3_F32) &&
        h3_tensor_is_contiguous(t)) { /* the same rule on the device: no round trip through the host */
        float sc = 1.0f;
        H3_CHECK(h3_tensor_alloc2(&q, H3_PLACE_DEVICE, H3_F8_E4M3, N, K, H3_MEM_WEIGHTS));
        H3_CHECK_CTX(h3_cuda_quantize_fp8(ex, t, q.data, &sc), "quantizing %s", what);
        q.q.mode = H3_SCALE_TENSOR;
        q.q.scale = sc;
        h3_tensor_free(t);
        *t = q;
        return H3_OK;
    }
    H3_CHECK(h3_tensor_alloc2(&hf, H3_PLACE_HOST, H3_F32, N, K, H3_MEM_WORKSPACE));
    if (t->place == H3_PLACE_DEVICE) {
        H3_CHECK(h3_tensor_alloc2(&tmp, H3_PLACE_HOST, t->dtype, N, K, H3_MEM_WORKSPACE));
        H3_CHECK(h3_copy(ex, &tmp, t));
        H3_CHECK(h3_exec_sync(ex));
        H3_CHECK(h3_op_convert(ex, &hf, &tmp));
    } else {
        H3_CHECK(h3_op_convert(ex, &hf, t));
    }
    h3_tensor_free(&tmp);
    H3_CHECK_CTX(h3_quantize_tensor(hf.data, N, K, (h3_qtarget)target, pool, &q), "quantizing %s", what);
    h3_tensor_free(&hf);
    if (t->place != H3_PLACE_HOST) {
        H3_CHECK(h3_quant_copy_to(ex, &q, t->place, H3_MEM_WEIGHTS, &q2));
        h3_tensor_free(&q);
        q = q2;
    }
    h3_tensor_free(t);
    *t = q;
    return H3_OK;
done:
    h3_tensor_free(&hf);
    h3_tensor_free(&tmp);
    h3_tensor_free(&q);
    return st;
}

/* One weight replaced by random stored values of format target at its place: 64 MiB of random bytes from a
 * fixed generator repeated over the values, scales constant. */
static h3_status random_one(h3_exec *ex, h3_tensor *t, int target) {
    enum { POOL = 64 << 20 };
    static uint8_t *pools[2]; /* int8, fp8: kept for the process (benchmarks) */
    const int fp8 = target == H3_QT_FP8;
    uint8_t *pool = pools[fp8];
    if (!pool) {
        pool = pools[fp8] = h3_malloc(POOL, H3_MEM_WORKSPACE);
        if (!pool) return H3_ERR(H3_ERR_NOMEM, "out of memory");
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < POOL; i += 8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            uint64_t v = x;
            if (fp8) /* e4m3 codes with the exponent field <= 7: |x| < 2, never NaN */
                v &= 0xBFBFBFBFBFBFBFBFull;
            memcpy(pool + i, &v, 8);
        }
    }
    const int64_t N = t->shape[0], K = t->shape[1];
    if (!fp8 && target != H3_QT_INT8 && target != H3_QT_INT8_CONVROT)
        return H3_ERR(H3_ERR_UNSUPPORTED, "random quantized blocks: int8, int8_convrot or fp8, not %s",
                      h3_qtarget_name((h3_qtarget)target));
    h3_tensor q = {0}, src;
    h3_status st = H3_OK;
    H3_CHECK(h3_tensor_alloc2(&q, t->place, fp8 ? H3_F8_E4M3 : H3_I8, N, K, H3_MEM_WEIGHTS));
    for (int64_t off = 0, n = N * K; off < n; off += POOL) {
        int64_t c = n - off < POOL ? n - off : POOL;
        h3_tensor dst;
        H3_CHECK(h3_tensor_wrap(&dst, (uint8_t *)q.data + off, q.place, H3_U8, 1, &c));
        H3_CHECK(h3_tensor_wrap(&src, pool, H3_PLACE_HOST, H3_U8, 1, &c));
        H3_CHECK(h3_copy(ex, &dst, &src));
    }
    if (fp8) {
        q.q.mode = H3_SCALE_TENSOR;
        q.q.scale = 0.03f;
    } else {
        float *sc = h3_malloc((size_t)N * 4, H3_MEM_WORKSPACE);
        if (!sc) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; i < N; i++) sc[i] = 1e-3f * (1.0f + (float)(i % 7) / 7.0f);
        q.q.scales_owner = h3_place_alloc(q.place, (size_t)N * 4, H3_MEM_WEIGHTS);
        if (q.q.scales_owner) {
            int64_t nb = N * 4;
            h3_tensor d2;
            q.q.scales_bytes = (size_t)N * 4;
            st = h3_tensor_wrap(&d2, q.q.scales_owner, q.place, H3_U8, 1, &nb);
            if (st == H3_OK) st = h3_tensor_wrap(&src, sc, H3_PLACE_HOST, H3_U8, 1, &nb);
            if (st == H3_OK) st = h3_copy(ex, &d2, &src);
            if (st == H3_OK) st = h3_exec_sync(ex);
        } else {
            st = H3_ERR(H3_ERR_NOMEM, "out of %s memory for scales", h3_place_name(q.place));
        }
        h3_free(sc);
        H3_CHECK(st);
        q.q.mode = H3_SCALE_ROW;
        q.q.scales = q.q.scales_owner;
        if (target == H3_QT_INT8_CONVROT) q.q.rot_group = h3_qtarget_group(K);
    }
    H3_CHECK(h3_exec_sync(ex));
    h3_tensor_free(t);
    *t = q;
    return H3_OK;
done:
    h3_tensor_free(&q);
    return st;
}

static h3_status requantize_blocks(h3_dit *d, h3_exec *ex, int target, h3_pool *pool, int random, int first,
                                   int count) {
    const h3_dit_config *c = &d->cfg;
    const int64_t inner = h3_dit_inner(c);
    const int u0 = (int)c->n_refiner_layers + first, u1 = u0 + count;
    if (first < 0 || count < 0 || u1 > h3_dit_n_units(c))
        return H3_ERR(H3_ERR_INVALID, "quantizing DiT blocks %d..%d of %d", first, first + count - 1,
                      h3_dit_n_units(c) - (int)c->n_refiner_layers);
    for (int u = u0; u < u1; u++) {
        h3_dit_block_weights *b = &d->units[u];
        char what[64];
        snprintf(what, sizeof what, "DiT block %d", u - (int)c->n_refiner_layers);
        if (b->qkv.data && b->qkv_interleaved)
            return H3_ERR(H3_ERR_UNSUPPORTED,
                          "%s: QKV rows in the official per-head order are not quantized here", what);
        h3_tensor *ts[6] = {&b->qkv, &b->out, &b->fc1, &b->fc2, NULL, NULL};
        if (!b->qkv.data) {
            ts[0] = &b->q;
            ts[4] = &b->k;
            ts[5] = &b->v;
        }
        for (int i = 0; i < 6; i++)
            if (ts[i] && ts[i]->data)
                H3_TRY(random ? random_one(ex, ts[i], target) : quantize_one(ex, ts[i], target, pool, what));
        if (b->qkv.data) H3_TRY(qkv_views(b, inner));
    }
    return H3_OK;
}

h3_status h3_dit_quantize_blocks(h3_dit *d, h3_exec *ex, int target, h3_pool *pool) {
    return requantize_blocks(d, ex, target, pool, 0, 0, (int)d->cfg.n_layers);
}

h3_status h3_dit_quantize_block_range(h3_dit *d, h3_exec *ex, int target, h3_pool *pool, int first, int count) {
    return requantize_blocks(d, ex, target, pool, 0, first, count);
}

h3_status h3_dit_randomize_blocks_quantized(h3_dit *d, h3_exec *ex, int target) {
    return requantize_blocks(d, ex, target, NULL, 1, 0, (int)d->cfg.n_layers);
}

/* ---- opening
 * ------------------------------------------------------------------------------------------------ */

/* An anchor of a config inferred from the shapes: a weight of rank nd whose dims are at least `least` each;
 * its logical shape (quantized formats store other shapes: nvfp4 [N, K/2], GGUF blocks) into out. */
static h3_status anchor(const h3_wbind *b, const char *name, int nd, int64_t least, const char *words,
                        const h3_wb_unit *u, int64_t *out) {
    h3_wb_row r =
        h3_wb_row_make(name, NULL, nd, H3_WB_ANY, H3_WB_ANY, 0, 0, H3_WB_FLOATS, H3_WB_QUANT, words, *u);
    h3_wb_info in;
    H3_TRY(h3_wb_check(b, &r, NULL, &in));
    for (int i = 0; i < nd; i++)
        if (in.shape[i] < least)
            return h3_wb_shape_error(b, name, in.ndim, in.shape, u, "%s with every size at least %lld", words,
                                     (long long)least);
    memcpy(out, in.shape, (size_t)nd * sizeof *out);
    return H3_OK;
}

/* Widths from tensor shapes, for files without a config (ComfyUI single files). Eps, theta: the release's.
 * Every width is checked here (at least 1, whole heads, 4·channels video rows) in the binder's message form;
 * the rows then check every tensor against the widths. */
static h3_status infer_config(h3_dit *d, const h3_wbind *b, h3_dit_config *c) {
    const int df = is_diffusers(d);
    char lp[256];
    snprintf(lp, sizeof lp, "%s%s", b->prefix,
             df ? "token_refiner.refiner_blocks." : "token_refiner.blocks.");
    const int n_refiner = h3_count_layers(&d->set, lp);
    const h3_wb_unit model = {NULL, 0, -1}, blk0 = {"DiT block", 0, n_refiner};
    int64_t s[2];
    int pruned = c->adaln_pruned;
    h3_dit_config_default(c);
    c->adaln_pruned = pruned;
    const char *vp = df ? "proj_in.weight" : "video_patch_proj.weight";
    H3_TRY(anchor(b, vp, 2, 1, "[hidden, video row width]", &model, s));
    c->hidden = s[0];
    if (s[1] % 4)
        return h3_wb_shape_error(
            b, vp, 2, s, &model,
            "[hidden, 4·channels] for the (1, 2, 2) patch (give a config.json for another)");
    c->in_channels = s[1] / 4;
    H3_TRY(anchor(b, df ? "audio_proj_in.weight" : "audio_patch_proj.weight", 2, 1,
                  "[hidden, audio channels]", &model, s));
    c->audio_dim = s[1];
    H3_TRY(anchor(b, df ? "context_embedder.weight" : "condition_proj.weight", 2, 1, "[hidden, text dim]",
                  &model, s));
    c->text_dim = s[1];
    const char *blk = df ? "transformer_blocks.0." : "blocks.0.";
    char nm[128];
    snprintf(nm, sizeof nm, "%s%s", blk, df ? "attn.norm_q.weight" : "attn.q_norm.weight");
    H3_TRY(anchor(b, nm, 1, 1, "[head_dim]", &blk0, s));
    c->head_dim = s[0];
    snprintf(nm, sizeof nm, "%s%s", blk, df ? "attn.to_q.weight" : "attn.qkv_proj.weight");
    H3_TRY(anchor(b, nm, 2, 1, df ? "[heads·head_dim, hidden]" : "[3·heads·head_dim, hidden]", &blk0, s));
    const int64_t per = (df ? 1 : 3) * c->head_dim;
    if (s[0] % per)
        return h3_wb_shape_error(b, nm, 2, s, &blk0,
                                 "%s rows in whole heads of head_dim %lld (from its q_norm)",
                                 df ? "heads·head_dim" : "3·heads·head_dim", (long long)c->head_dim);
    c->heads = s[0] / per;
    snprintf(nm, sizeof nm, "%s%s", blk, df ? "ff.net.2.weight" : "mlp.fc2.weight");
    H3_TRY(anchor(b, nm, 2, 1, "[hidden, FFN]", &blk0, s));
    c->ffn = s[1];
    if (!c->adaln_pruned) {
        const char *ti = df ? "time_embedder.linear_1.weight" : "time_embedder.proj_in.weight";
        H3_TRY(anchor(b, ti, 2, 1, "[time MLP width, sinusoid width]", &model, s));
        if (s[1] % 2) return h3_wb_shape_error(b, ti, 2, s, &model, "[time MLP width, even sinusoid width]");
        c->time_hidden = s[0];
        c->freq_dim = s[1];
        H3_TRY(anchor(b, df ? "time_embedder.linear_2.weight" : "time_embedder.proj_out.weight", 2, 1,
                      "[time embedding width, time MLP width]", &model, s));
        c->time_embed_dim = s[0];
    }
    /* RoPE's frequencies: as many as the stored buffer holds, when it has one. */
    const h3_st_entry *e;
    h3_wb_info in;
    h3_wb_row rf = h3_wb_row_make("rope.inv_freq", NULL, 1, H3_WB_ANY, 0, 0, 0, H3_WB_FLOATS, H3_WB_OPTIONAL,
                                  "[RoPE frequencies]", model);
    H3_TRY(h3_wb_check(b, &rf, &e, &in));
    if (e) {
        if (in.shape[0] < 1)
            return h3_wb_shape_error(b, "rope.inv_freq", 1, in.shape, &model,
                                     "[RoPE frequencies] with at least one");
        c->rope_freq_dim = in.shape[0];
    }
    snprintf(lp, sizeof lp, "%s%s", b->prefix, df ? "transformer_blocks." : "blocks.");
    c->n_layers = h3_count_layers(&d->set, lp);
    c->n_refiner_layers = n_refiner;
    return H3_OK;
}

/* config.json beside the weights (or given), else the file's "config" metadata; *found = 0 when neither. */
static h3_status read_config(const char *path, const h3_dit_open_opts *o, h3_dit *d, h3_dit_config *c,
                             int *found, char *src, size_t srcn) {
    *found = 0;
    json_t *j = NULL;
    char *cand = NULL;
    h3_status st = H3_OK;
    if (o && o->config_path) {
        H3_CHECK_CTX(h3_json_load_file(o->config_path, 1u << 20, &j), "reading the DiT config");
        H3_CHECK(h3_dit_config_from_json(j, o->config_path, c));
        snprintf(src, srcn, "%s", o->config_path);
        *found = 1;
        goto done;
    }
    if (h3_path_is_dir(path)) {
        cand = h3_path_join(path, "config.json");
    } else {
        char *dir = h3_path_dir(path);
        if (!dir) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        cand = h3_path_join(dir, "config.json");
        h3_free(dir);
    }
    if (!cand) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    if (h3_path_is_file(cand)) {
        H3_CHECK_CTX(h3_json_load_file(cand, 1u << 20, &j), "reading the config beside the DiT weights");
        /* A config.json of something else (a folder of several components) is not ours: use it only when it
         * describes a DiT. */
        if (json_object_get(j, "hidden_size") && json_object_get(j, "num_layers")) {
            H3_CHECK(h3_dit_config_from_json(j, cand, c));
            snprintf(src, srcn, "%s", cand);
            *found = 1;
            goto done;
        }
        json_decref(j);
        j = NULL;
    }
    const char *meta = h3_st_metadata(&d->set, "config");
    if (meta) {
        h3_status ps = h3_json_parse(meta, strlen(meta), "the weights' \"config\" metadata", &j);
        if (ps == H3_ERR_NOMEM) {
            st = ps;
            goto done;
        }
        if (ps != H3_OK) {
            h3_clear_error(); /* not JSON: not a config we can use */
            j = NULL;
        } else if (json_object_get(j, "hidden_size") && json_object_get(j, "num_layers")) {
            H3_CHECK(h3_dit_config_from_json(j, "the weights' \"config\" metadata", c));
            snprintf(src, srcn, "the file's metadata");
            *found = 1;
        }
    }
done:
    json_decref(j);
    h3_free(cand);
    return st;
}

static h3_status count_check(h3_dit *d, const char *prefix, const char *stack, int64_t want,
                             const char *what) {
    char lp[256];
    snprintf(lp, sizeof lp, "%s%s", prefix, stack);
    int n = h3_count_layers(&d->set, lp);
    if (n != want)
        return H3_ERR(H3_ERR_FORMAT, "%s: the config has %lld %s; the weights have %d ('%s0.' ... )",
                      d->source, (long long)want, what, n, lp);
    return H3_OK;
}

/* *found = whether dir holds .safetensors files itself. */
static h3_status dir_has_weights(const char *dir, int *found) {
    char **names = NULL;
    int n = 0;
    *found = 0;
    H3_TRY(h3_list_dir(dir, &names, &n));
    for (int i = 0; i < n && !*found; i++) *found = h3_str_ends_with(names[i], ".safetensors");
    h3_strlist_free(names, n);
    return H3_OK;
}

h3_status h3_dit_open(const char *path, const h3_dit_open_opts *opts, h3_dit **out) {
    *out = NULL;
    h3_status st = H3_OK;
    h3_dit *d = h3_calloc(1, sizeof *d, H3_MEM_OTHER);
    if (!d) return H3_ERR_NOMEM;
    apply_opts(d, opts);
    H3_CHECK(check_places(d));
    /* A model folder (FL2VA/, a diffusers root) without weights of its own holds the DiT in transformer/. */
    int own_weights = 1;
    if (h3_path_is_dir(path)) H3_CHECK_CTX(dir_has_weights(path, &own_weights), "opening the DiT");
    if (!own_weights) {
        char *sub = h3_path_join(path, "transformer");
        if (!sub) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        if (h3_path_is_dir(sub)) {
            d->source = sub;
        } else {
            h3_free(sub);
        }
    }
    if (!d->source) d->source = h3_strdup(path);
    if (!d->source) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    path = d->source;
    H3_CHECK_CTX(h3_weights_open(path, &d->set, &d->gguf), "opening the DiT");
    d->have_set = 1;
    h3_detect_info info;
    H3_CHECK(h3_detect(&d->set, &info));
    if (info.comp != H3_COMP_DIT)
        H3_FAIL(H3_ERR_FORMAT, "%s holds %s, not a MiniMax-H3 DiT", path,
                info.comp == H3_COMP_UNKNOWN ? "no H3 component h3run recognizes"
                                             : h3_component_name(info.comp));
    d->layout = info.layout;
    d->gate_first = info.layout != H3_LAYOUT_DIFFUSERS;
    h3_dit_qkv_order qo = opts ? opts->qkv_order : H3_DIT_QKV_AUTO;
    d->qkv_interleaved =
        qo == H3_DIT_QKV_AUTO ? info.layout == H3_LAYOUT_OFFICIAL : qo == H3_DIT_QKV_INTERLEAVED;
    if (info.layout == H3_LAYOUT_DIFFUSERS)
        d->qkv_interleaved = 0; /* split q/k/v: no fused order to choose */

    h3_dit_config *c = &d->cfg;
    int found = 0;
    char src[300] = "the tensor shapes";
    H3_CHECK(read_config(path, opts, d, c, &found, src, sizeof src));
    c->adaln_pruned = info.adaln_pruned;
    {
        h3_qweight_reader rd;
        h3_qweight_reader_init(&rd, &d->set, d->gguf);
        const h3_wbind b = {&d->set,
                            info.prefix,
                            path,
                            "DiT",
                            found ? NULL : "(widths inferred from the shapes: the file has no config)",
                            &rd.base};
        if (!found) H3_CHECK(infer_config(d, &b, c));
        if (c->adaln_pruned) {
            /* The curve table sets the grid and the rank the projections take, whatever a config says. */
            const h3_wb_unit model = {NULL, 0, -1};
            int64_t gs[2];
            H3_CHECK(anchor(&b, "adaln_t_table", 2, 1, "[grid, rank]", &model, gs));
            if (gs[0] < 2)
                H3_CHECK(h3_wb_shape_error(&b, "adaln_t_table", 2, gs, &model,
                                           "[grid, rank] with a grid of at least 2"));
            c->curve_grid = gs[0];
            c->time_embed_dim = gs[1];
        }
    }
    H3_CHECK_CTX(h3_dit_config_check(c), "%s", path);
    set_describe(d, src);
    H3_CHECK(count_check(d, info.prefix, is_diffusers(d) ? "transformer_blocks." : "blocks.", c->n_layers,
                         "blocks"));
    H3_CHECK(count_check(d, info.prefix,
                         is_diffusers(d) ? "token_refiner.refiner_blocks." : "token_refiner.blocks.",
                         c->n_refiner_layers, "refiner blocks"));
    H3_CHECK(alloc_units(d));
    {
        char ctx[600];
        snprintf(ctx, sizeof ctx, "(%s)", d->describe);
        h3_qweight_reader rd;
        h3_qweight_reader_init(&rd, &d->set, d->gguf);
        h3_wbind b = {&d->set, info.prefix, path, "DiT", ctx, &rd.base};
        H3_CHECK(each_weight(d, bind_one, &b));
    }
    H3_CHECK(finish_weights(d));
    h3_log(H3_LOG_DEBUG, "DiT %s: %s", path, d->describe);
    *out = d;
    return H3_OK;
done:
    h3_dit_close(d);
    return st;
}

h3_status h3_dit_create(const h3_dit_config *cfg, h3_dtype core_dtype, const h3_dit_open_opts *opts,
                        h3_dit **out) {
    *out = NULL;
    if (core_dtype != H3_F32 && core_dtype != H3_BF16 && core_dtype != H3_F16)
        return H3_ERR(H3_ERR_INVALID, "DiT weights can be f32, bf16 or f16, not %s",
                      h3_dtype_name(core_dtype));
    H3_TRY(h3_dit_config_check(cfg));
    h3_status st = H3_OK;
    h3_dit *d = h3_calloc(1, sizeof *d, H3_MEM_OTHER);
    if (!d) return H3_ERR_NOMEM;
    apply_opts(d, opts);
    H3_CHECK(check_places(d));
    d->cfg = *cfg;
    d->layout = H3_LAYOUT_UNKNOWN;
    d->gate_first = 1;
    d->qkv_interleaved = 0;
    d->source = h3_strdup("in-memory DiT");
    if (!d->source) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    set_describe(d, "the caller");
    H3_CHECK(alloc_units(d));
    H3_CHECK(each_weight(d, alloc_one, &core_dtype));
    H3_CHECK(finish_weights(d));
    *out = d;
    return H3_OK;
done:
    h3_dit_close(d);
    return st;
}

static h3_status free_one(h3_dit *d, const h3_wb_row *w, void *user) {
    (void)d;
    (void)user;
    h3_tensor_free(w->dst);
    return H3_OK;
}

void h3_dit_close(h3_dit *d) {
    if (!d) return;
    h3_lora_detach(d);
    h3_dit_release_workspace(d);
    h3_dit_release_modulation(d);
    if (d->units && d->adaln_w && d->adaln_b) each_weight(d, free_one, NULL);
    h3_free(d->units);
    h3_free(d->adaln_w);
    h3_free(d->adaln_b);
    h3_free(d->inv_freq);
    h3_free(d->sparse_tiles);
    if (d->have_set) h3_st_close(&d->set);
    h3_gguf_free(d->gguf);
    h3_free(d->source);
    h3_free(d);
}

const h3_dit_config *h3_dit_get_config(const h3_dit *d) {
    return &d->cfg;
}
const char *h3_dit_describe(const h3_dit *d) {
    return d->describe;
}
h3_layout h3_dit_layout(const h3_dit *d) {
    return d->layout;
}
int h3_dit_qkv_interleaved(const h3_dit *d) {
    return d->qkv_interleaved;
}

typedef struct {
    h3_dit_weight_fn fn;
    void *user;
    int stopped;
} visit_ctx;

static h3_status visit_one(h3_dit *d, const h3_wb_row *w, void *user) {
    (void)d;
    visit_ctx *v = user;
    if (!w->dst->data) return H3_OK; /* absent (an optional tensor) or empty */
    if (v->fn(w->name, w->dst, v->user)) {
        v->stopped = 1;
        return H3_ERR_INTERRUPTED; /* ends the walk; not an error for the caller */
    }
    return H3_OK;
}

int h3_dit_visit_weights(h3_dit *d, h3_dit_weight_fn fn, void *user) {
    visit_ctx v = {fn, user, 0};
    each_weight(d, visit_one, &v);
    return v.stopped;
}

static h3_status bytes_one(h3_dit *d, const h3_wb_row *w, void *user) {
    (void)d;
    h3_dit_weight_bytes *b = user;
    if (!w->dst->data) return H3_OK;
    int64_t n = (int64_t)h3_tensor_nbytes(w->dst);
    b->total += n;
    if (w->tag == DIT_ADALN) b->adaln += n;
    if (w->dst->owner)
        b->owned += n;
    else
        b->mapped += n;
    return H3_OK;
}

void h3_dit_weight_bytes_of(const h3_dit *d, h3_dit_weight_bytes *out) {
    memset(out, 0, sizeof *out);
    each_weight((h3_dit *)d, bytes_one, out);
}

/* ---- blocks
 * ------------------------------------------------------------------------------------------------- */

h3_status h3_dit_block_acquire(h3_dit *d, h3_exec *ex, int unit, const h3_dit_block_weights **w) {
    if (unit < 0 || unit >= h3_dit_n_units(&d->cfg))
        return H3_ERR(H3_ERR_INVALID, "DiT block %d does not exist (the model has %d)", unit,
                      h3_dit_n_units(&d->cfg));
    if (d->wsrc) {
        H3_TRY(d->wsrc->acquire(d->wsrc->user, ex, unit, w));
    } else if (d->stream_weights) {
        return H3_ERR(H3_ERR_INVALID, "DiT: the weights are to be streamed, but no streamer is attached");
    } else {
        *w = &d->units[unit];
    }
    d->stats.acquires++;
    d->acquired++;
    return H3_OK;
}

void h3_dit_block_release(h3_dit *d, h3_exec *ex, int unit) {
    if (d->wsrc) d->wsrc->release(d->wsrc->user, ex, unit);
    d->stats.releases++;
    d->acquired--;
}

h3_status h3_dit_adaln_acquire(h3_dit *d, h3_exec *ex, int block, const h3_tensor **w, const h3_tensor **b) {
    if (block < 0 || block >= d->cfg.n_layers)
        return H3_ERR(H3_ERR_INVALID, "DiT block %d does not exist (the model has %lld)", block,
                      (long long)d->cfg.n_layers);
    if (d->wsrc && d->wsrc->adaln_acquire) return d->wsrc->adaln_acquire(d->wsrc->user, ex, block, w, b);
    if (d->stream_weights)
        return H3_ERR(H3_ERR_INVALID, "DiT: the weights are to be streamed, but no streamer is attached");
    *w = &d->adaln_w[block];
    *b = &d->adaln_b[block];
    return H3_OK;
}

void h3_dit_adaln_release(h3_dit *d, h3_exec *ex, int block) {
    if (d->wsrc && d->wsrc->adaln_release) d->wsrc->adaln_release(d->wsrc->user, ex, block);
}

h3_status h3_dit_set_weight_source(h3_dit *d, const h3_dit_weight_source *src) {
    if (d->acquired)
        return H3_ERR(H3_ERR_INVALID, "DiT: a weight source cannot change while %d blocks are acquired", d->acquired);
    if (src && (!src->acquire || !src->release))
        return H3_ERR(H3_ERR_INVALID, "DiT: a weight source needs acquire and release");
    if (!d->wsrc) d->file_qkv_interleaved = d->qkv_interleaved;
    d->wsrc = src;
    /* The forward's fused-QKV scratch follows the order of what it is given. */
    int want = src && src->qkv_contiguous ? 0 : d->file_qkv_interleaved;
    if (want != d->qkv_interleaved) {
        h3_dit_release_workspace(d);
        d->qkv_interleaved = want;
    }
    return H3_OK;
}

const h3_dit_block_weights *h3_dit_unit_weights(const h3_dit *d, int unit) {
    if (unit < 0 || unit >= h3_dit_n_units(&d->cfg)) return NULL;
    return &d->units[unit];
}

h3_status h3_dit_adaln_weights(const h3_dit *d, int block, const h3_tensor **w, const h3_tensor **b) {
    if (block < 0 || block >= d->cfg.n_layers)
        return H3_ERR(H3_ERR_INVALID, "DiT block %d does not exist (the model has %lld)", block,
                      (long long)d->cfg.n_layers);
    *w = &d->adaln_w[block];
    *b = &d->adaln_b[block];
    return H3_OK;
}

const h3_st_set *h3_dit_files(const h3_dit *d) {
    return d->have_set ? &d->set : NULL;
}

_Static_assert((H3_ATTN_SPARSE & (H3_ATTN_CAUSAL | H3_ATTN_FP8 | H3_ATTN_INT8 | H3_ATTN_FP8_K192)) == 0,
               "the DiT's sparse bit shares the attention op's flag word");

void h3_dit_set_attention(h3_dit *d, unsigned flags) {
    d->attn_flags = flags & (H3_ATTN_FP8 | H3_ATTN_INT8 | H3_ATTN_SPARSE | H3_ATTN_FP8_K192);
    if (!(d->attn_flags & H3_ATTN_FP8)) d->attn_flags &= ~H3_ATTN_FP8_K192;
    if (d->attn_flags & H3_ATTN_SPARSE) d->attn_flags = H3_ATTN_SPARSE;
}

h3_status h3_dit_set_sparse(h3_dit *d, float tau, float t_start, float t_end, int64_t min_rows) {
    if (!isfinite(tau) || !(t_start >= 0.0f && t_start <= t_end && t_end <= 1.0f) || min_rows < 0)
        return H3_ERR(H3_ERR_INVALID,
                      "sparse attention: tau must be finite and the window 0 <= start <= end <= 1 (got tau %g, %g..%g)",
                      (double)tau, (double)t_start, (double)t_end);
    d->sparse_tau = tau;
    d->sparse_t0 = t_start;
    d->sparse_t1 = t_end;
    d->sparse_min_rows = min_rows;
    return H3_OK;
}

h3_status h3_dit_set_sparse_shift(h3_dit *d, double shift) {
    if (!(shift > 0.0) || !isfinite(shift))
        return H3_ERR(H3_ERR_INVALID, "sparse attention: the schedule's shift must be positive, not %g", shift);
    d->sparse_shift = shift;
    return H3_OK;
}

double h3_dit_sparse_progress(double shift, double t) {
    const double sigma = 1.0 - t;
    return 1.0 - sigma / (shift - (shift - 1.0) * sigma);
}

int h3_dit_blocks_fp8(const h3_dit *d) {
    const h3_dit_block_weights *w = h3_dit_unit_weights(d, (int)d->cfg.n_refiner_layers);
    return w && w->fc1.dtype == H3_F8_E4M3 && w->fc2.dtype == H3_F8_E4M3;
}

unsigned h3_dit_attention(const h3_dit *d) {
    return d->attn_flags;
}

h3_status h3_dit_set_chunk_rows(h3_dit *d, int64_t rows) {
    if (rows < 1) return H3_ERR(H3_ERR_INVALID, "DiT: row chunks must hold at least one row, not %lld", (long long)rows);
    if (rows != d->chunk_rows) {
        h3_dit_release_workspace(d);
        d->chunk_rows = rows;
    }
    return H3_OK;
}

int64_t h3_dit_chunk_rows(const h3_dit *d) {
    return d->chunk_rows;
}
h3_place h3_dit_act_place(const h3_dit *d) {
    return d->act_place;
}
h3_dtype h3_dit_act_dtype(const h3_dit *d) {
    return d->act_dtype;
}

void h3_dit_get_stats(const h3_dit *d, h3_dit_stats *out) {
    *out = d->stats;
}

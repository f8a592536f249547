/* The MiniMax-H3 video VAE decoder: configuration and weights of the three layouts, the chunk and tile plan, the
 * ViT decoder on one tile, and the stitching that turns tiles into frames. See video_vae.h. */
#include "models/video_vae.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "base/log.h"
#include "io/safetensors.h"
#include "io/wbind.h"
#include "models/model_cfg.h"

/* video_vae/config.json of the release, as ComfyUI builds it in for its single-file repack. */
static const float k_latents_mean[24] = {
    0.858090341091156f,    -0.9606591463088989f, 1.0661640167236328f,  -0.5090325474739075f, -0.2727581858634949f,
    -1.3675414323806763f,  -0.2553254961967468f, -0.26907554268836975f, -0.5376840829849243f, -0.0464097298681736f,
    0.6657370328903198f,   0.19690127670764923f, -0.5460608005523682f, -0.4035342037677765f, -0.23683024942874908f,
    0.25928452610969543f,  -0.30133944749832153f, 0.211341992020607f,   -1.1206848621368408f, 0.3581933379173279f,
    -0.04225143790245056f, 0.2604829967021942f,  0.22864092886447906f,  0.7056031823158264f,
};
static const float k_latents_std[24] = {
    1.2223774194717407f,  1.2767263650894165f, 1.68317747116088865f, 1.7549455165863037f,  1.5636216402053833f,
    2.194143533706665f,   0.96531379222869875f, 1.05698859691619875f, 0.841948926448822f,  0.7729952931404114f,
    1.8955937623977661f,  0.946841835975647f,  0.7996809482574463f,  0.44988900423049925f, 0.7197399735450745f,
    0.69362932443618775f, 2.961095094680786f,  2.7694199085235595f,  3.0496184825897215f,  2.1088054180145265f,
    3.276226282119751f,   3.1627357006073f,    2.28168129920959475f, 2.6127843856811525f,
};
const float h3_imagenet_mean[3] = {0.485f, 0.456f, 0.406f};
const float h3_imagenet_std[3] = {0.229f, 0.224f, 0.225f};

void h3_video_vae_default_config(h3_video_vae_config *c) {
    memset(c, 0, sizeof *c);
    c->latent_channels = 24;
    c->out_channels = 3;
    c->patch_size = 16;
    c->patch_size_t = 4;
    c->num_layers = 36;
    c->heads = 32;
    c->head_dim = 64;
    c->num_register_tokens = 4;
    c->ffn_inner = 8192;
    c->rope_dim = 48;
    c->rope_theta = 100.0f;
    c->norm_eps = 1e-5f;
    c->clip_length = 17;
    c->token_drop = 3;
    c->tile_size = 256;
    c->tile_overlap_min = 64;
    memcpy(c->latents_mean, k_latents_mean, sizeof k_latents_mean);
    memcpy(c->latents_std, k_latents_std, sizeof k_latents_std);
    c->weight_dtype = H3_F32;
    c->fused_qkv = 1;
}

/* ---- weights: names per layout, one acquire/release path ----------------------------------------------------- */

enum {
    /* the input and output layers (part VV_IO) */
    W_PQ_W, W_PQ_B, W_IN_W, W_IN_B, W_REG, W_LN_W, W_LN_B, W_OUT_W, W_OUT_B,
    /* one transformer block (parts 0 .. num_layers-1) */
    W_N1, W_N2, W_S1, W_S2, W_QKV_W, W_QKV_B, W_Q_W, W_Q_B, W_K_W, W_K_B, W_V_W, W_V_B, W_O_W, W_O_B,
    W_W1, W_B1, W_W2, W_B2,
    W_COUNT
};
#define VV_IO (-1)

/* Name of weight `id` of part `part` in a layout; NULL when the layout has no such tensor. */
static const char *vv_name(h3_layout lay, int part, int id, char *buf, size_t n) {
    int dif = lay == H3_LAYOUT_DIFFUSERS;
    const char *s = NULL;
    switch (id) {
        case W_PQ_W: s = "post_quant_conv.weight"; break;
        case W_PQ_B: s = "post_quant_conv.bias"; break;
        case W_IN_W: s = dif ? "decoder.proj_in.weight" : "decoder.x_embedder.weight"; break;
        case W_IN_B: s = dif ? "decoder.proj_in.bias" : "decoder.x_embedder.bias"; break;
        case W_REG: s = "decoder.register_tokens"; break;
        case W_LN_W: s = "decoder.norm_out.weight"; break;
        case W_LN_B: s = "decoder.norm_out.bias"; break;
        case W_OUT_W: s = "decoder.proj_out.weight"; break;
        case W_OUT_B: s = "decoder.proj_out.bias"; break;
        case W_N1: s = "norm1.weight"; break;
        case W_N2: s = "norm2.weight"; break;
        case W_S1: s = "scale1"; break;
        case W_S2: s = "scale2"; break;
        case W_QKV_W: s = dif ? NULL : "attn.to_qkv.weight"; break;
        case W_QKV_B: s = dif ? NULL : "attn.to_qkv.bias"; break;
        case W_Q_W: s = dif ? "attn.to_q.weight" : NULL; break;
        case W_Q_B: s = dif ? "attn.to_q.bias" : NULL; break;
        case W_K_W: s = dif ? "attn.to_k.weight" : NULL; break;
        case W_K_B: s = dif ? "attn.to_k.bias" : NULL; break;
        case W_V_W: s = dif ? "attn.to_v.weight" : NULL; break;
        case W_V_B: s = dif ? "attn.to_v.bias" : NULL; break;
        case W_O_W: s = dif ? "attn.to_out.0.weight" : "attn.to_out.weight"; break;
        case W_O_B: s = dif ? "attn.to_out.0.bias" : "attn.to_out.bias"; break;
        case W_W1: s = dif ? "ff.net.0.proj.weight" : "ff.w1.weight"; break;
        case W_B1: s = dif ? "ff.net.0.proj.bias" : "ff.w1.bias"; break;
        case W_W2: s = dif ? "ff.net.2.weight" : "ff.w2.weight"; break;
        case W_B2: s = dif ? "ff.net.2.bias" : "ff.w2.bias"; break;
        default: break;
    }
    if (!s) return NULL;
    if (part == VV_IO) snprintf(buf, n, "%s", s);
    else snprintf(buf, n, "decoder.transformer_blocks.%d.%s", part, s);
    return buf;
}

/* Expected shape of weight `id` under config c (dims into s, returns ndim). */
static int vv_shape(const h3_video_vae_config *c, int id, int64_t *s) {
    int64_t C = c->latent_channels, dim = (int64_t)c->heads * c->head_dim, HD = dim, I = c->ffn_inner;
    int64_t P = (int64_t)c->out_channels * c->patch_size_t * c->patch_size * c->patch_size;
    switch (id) {
        case W_PQ_W: s[0] = C, s[1] = C, s[2] = s[3] = s[4] = 1; return 5;
        case W_PQ_B: s[0] = C; return 1;
        case W_IN_W: s[0] = dim, s[1] = C; return 2;
        case W_REG: s[0] = 1, s[1] = c->num_register_tokens, s[2] = dim; return 3;
        case W_OUT_W: s[0] = P, s[1] = dim; return 2;
        case W_OUT_B: s[0] = P; return 1;
        case W_QKV_W: s[0] = 3 * HD, s[1] = dim; return 2;
        case W_QKV_B: s[0] = 3 * HD; return 1;
        case W_Q_W: case W_K_W: case W_V_W: s[0] = HD, s[1] = dim; return 2;
        case W_O_W: s[0] = dim, s[1] = HD; return 2;
        case W_W1: s[0] = 2 * I, s[1] = dim; return 2;
        case W_B1: s[0] = 2 * I; return 1;
        case W_W2: s[0] = dim, s[1] = I; return 2;
        default: s[0] = dim; return 1; /* biases and vectors of width hidden */
    }
}

/* The shape of weight `id` in words, for messages. */
static const char *vv_words(int id) {
    switch (id) {
        case W_PQ_W:
            return "[latent channels, latent channels, 1, 1, 1]";
        case W_PQ_B:
            return "[latent channels]";
        case W_IN_W:
            return "[hidden, latent channels]";
        case W_REG:
            return "[1, registers, hidden]";
        case W_OUT_W:
            return "[channels·frames·patch², hidden]";
        case W_OUT_B:
            return "[channels·frames·patch²]";
        case W_QKV_W:
            return "[3·heads·head_dim, hidden]";
        case W_QKV_B:
            return "[3·heads·head_dim]";
        case W_Q_W:
        case W_K_W:
        case W_V_W:
            return "[heads·head_dim, hidden]";
        case W_Q_B:
        case W_K_B:
        case W_V_B:
            return "[heads·head_dim]";
        case W_O_W:
            return "[hidden, heads·head_dim]";
        case W_W1:
            return "[2·FFN, hidden]";
        case W_B1:
            return "[2·FFN]";
        case W_W2:
            return "[hidden, FFN]";
        default:
            return "[hidden]";
    }
}

struct h3_video_vae {
    h3_video_vae_config cfg;
    h3_layout layout;
    h3_st_set st;
    char *source;
    h3_wbind wb; /* the binder over st (io/wbind.h): every weight is reached through it */
    int rows_per_step;
};

/* The table row of weight `id` of part `part` (name into buf), bound into dst; 0 when the layout has no such
 * tensor. Part VV_IO belongs to the decoder as a whole, part i to ViT block i. */
static int vv_row(const h3_video_vae *v, int part, int id, char *buf, size_t n, h3_tensor *dst,
                  h3_wb_row *r) {
    if (!vv_name(v->layout, part, id, buf, n)) return 0;
    memset(r, 0, sizeof *r);
    r->name = buf;
    r->dst = dst;
    r->ndim = vv_shape(&v->cfg, id, r->shape);
    r->dtypes = H3_WB_FLOATS;
    r->words = vv_words(id);
    r->unit = part == VV_IO ? (h3_wb_unit){NULL, 0, -1} : (h3_wb_unit){"ViT block", part, part};
    return 1;
}

typedef struct {
    h3_tensor t[W_COUNT];
    unsigned char held[W_COUNT];
} vv_part;

static int vv_part_first(int part) {
    return part == VV_IO ? W_PQ_W : W_N1;
}
static int vv_part_end(int part) {
    return part == VV_IO ? W_N1 : W_COUNT;
}

static void vv_release(vv_part *w) {
    for (int i = 0; i < W_COUNT; i++)
        if (w->held[i]) h3_tensor_free(&w->t[i]);
    memset(w, 0, sizeof *w);
}

/* The one way decode code reaches weights: views of the mapped file (or aligned copies), shaped for the ops; the
 * residual scales converted to f32 when stored otherwise (the gated-add op takes f32 gates). Release with
 * vv_release. A weight streamer plugs in here. */
static h3_status vv_acquire(h3_video_vae *v, int part, vv_part *w) {
    memset(w, 0, sizeof *w);
    h3_status st = H3_OK;
    char name[160];
    for (int id = vv_part_first(part); id < vv_part_end(part); id++) {
        h3_wb_row row;
        h3_tensor t;
        if (!vv_row(v, part, id, name, sizeof name, &t, &row)) continue;
        H3_CHECK(h3_wb_bind(&v->wb, &row));
        w->t[id] = t;
        w->held[id] = 1;
        if ((id == W_S1 || id == W_S2) && t.dtype != H3_F32) {
            h3_tensor f;
            int64_t n = h3_tensor_numel(&t);
            H3_CHECK(h3_tensor_alloc(&f, H3_PLACE_HOST, H3_F32, 1, &n, H3_MEM_WEIGHTS));
            if (!h3_convert_to_f32(t.dtype, t.data, f.data, (size_t)n)) {
                h3_tensor_free(&f);
                H3_FAIL(H3_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which h3run cannot read as f32", v->source,
                        name, h3_dtype_name(t.dtype));
            }
            h3_tensor_free(&w->t[id]);
            w->t[id] = f;
        }
    }
    if (part == VV_IO) {
        int64_t s2[2] = {v->cfg.latent_channels, v->cfg.latent_channels};
        int64_t r2[2] = {v->cfg.num_register_tokens, (int64_t)v->cfg.heads * v->cfg.head_dim};
        h3_tensor a = w->t[W_PQ_W], b = w->t[W_REG];
        H3_CHECK(h3_tensor_reshape(&a, 2, s2, &w->t[W_PQ_W]));
        w->t[W_PQ_W].owner = a.owner; /* keep ownership of an aligned copy */
        w->t[W_PQ_W].owned_bytes = a.owned_bytes;
        w->t[W_PQ_W].cat = a.cat;
        H3_CHECK(h3_tensor_reshape(&b, 2, r2, &w->t[W_REG]));
        w->t[W_REG].owner = b.owner;
        w->t[W_REG].owned_bytes = b.owned_bytes;
        w->t[W_REG].cat = b.cat;
    }
done:
    if (st != H3_OK) vv_release(w);
    return st;
}

/* Every tensor of a part exists with the shape the config implies and a float dtype. Headers only. */
static h3_status vv_check_part(const h3_video_vae *v, int part) {
    char name[160];
    for (int id = vv_part_first(part); id < vv_part_end(part); id++) {
        h3_wb_row row;
        if (vv_row(v, part, id, name, sizeof name, NULL, &row)) H3_TRY(h3_wb_check(&v->wb, &row, NULL, NULL));
    }
    return H3_OK;
}

/* ---- configuration files ------------------------------------------------------------------------------------ */

static h3_status cfg_num(const json_t *o, const char *key, double lo, double hi, float *out, const char *what) {
    json_t *j = o ? json_object_get(o, key) : NULL;
    if (!j) return H3_OK;
    double d = json_is_number(j) ? json_number_value(j) : NAN;
    if (!(d >= lo && d <= hi)) return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be a number in [%g, %g]", what, key, lo, hi);
    *out = (float)d;
    return H3_OK;
}

/* The product of an integer list (space_down, spatial_downsample_factors...), if present. */
static h3_status cfg_prod(const json_t *o, const char *key, int *out, const char *what) {
    json_t *j = o ? json_object_get(o, key) : NULL;
    if (!j) return H3_OK;
    if (!json_is_array(j) || json_array_size(j) == 0 || json_array_size(j) > 16)
        return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be a list of factors", what, key);
    int64_t p = 1;
    for (size_t i = 0; i < json_array_size(j); i++) {
        json_t *e = json_array_get(j, i);
        double d = json_is_number(e) ? json_number_value(e) : NAN;
        if (!(d >= 1 && d <= 64) || d != floor(d))
            return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must hold integers in [1, 64]", what, key);
        p *= (int64_t)d;
        if (p > 1024) return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" multiplies to more than 1024", what, key);
    }
    *out = (int)p;
    return H3_OK;
}

/* Keys of video_vae/config.json (also the ComfyUI metadata blob). */
static h3_status cfg_wrapper(h3_video_vae_config *c, const json_t *j, int need_norm, const char *what) {
    H3_TRY(h3_cfg_int(j, "vae_clip_length", 1, 4096, &c->clip_length, what));
    H3_TRY(h3_cfg_int(j, "vae_token_drop", 0, 4096, &c->token_drop, what));
    H3_TRY(h3_cfg_int(j, "vae_tile_size", 0, 1 << 16, &c->tile_size, what));
    H3_TRY(h3_cfg_int(j, "vae_tile_overlap_min", 0, 1 << 16, &c->tile_overlap_min, what));
    H3_TRY(h3_cfg_floats(j, "latents_mean", c->latent_channels, need_norm, 0, c->latents_mean, what));
    H3_TRY(h3_cfg_floats(j, "latents_std", c->latent_channels, need_norm, 1, c->latents_std, what));
    return H3_OK;
}

/* Architecture keys of video_vae/source/config.json. */
static h3_status cfg_source(h3_video_vae_config *c, const json_t *j, float *ratio, const char *what) {
    H3_TRY(h3_cfg_int(j, "out_ch", 1, 16, &c->out_channels, what));
    H3_TRY(cfg_prod(j, "space_down", &c->patch_size, what));
    H3_TRY(cfg_prod(j, "time_down", &c->patch_size_t, what));
    H3_TRY(h3_cfg_int(j, "vae_ratio", 1, 1024, &c->patch_size, what));
    H3_TRY(h3_cfg_int(j, "vae_ratio_t", 1, 1024, &c->patch_size_t, what));
    json_t *vit = json_object_get(j, "vit_decoder_kwargs");
    if (!vit || !json_is_object(vit))
        return H3_ERR(H3_ERR_FORMAT, "%s: \"vit_decoder_kwargs\" is missing: not a ViT-decoder video VAE", what);
    H3_TRY(h3_cfg_int(vit, "num_layers", 1, 4096, &c->num_layers, what));
    H3_TRY(h3_cfg_int(vit, "heads", 1, 4096, &c->heads, what));
    H3_TRY(h3_cfg_int(vit, "dim_head", 1, 4096, &c->head_dim, what));
    H3_TRY(cfg_num(vit, "rope_theta", 1e-6, 1e12, &c->rope_theta, what));
    H3_TRY(cfg_num(vit, "rope_dim_ratio", 0.0, 1.0, ratio, what));
    return H3_OK;
}

/* diffusers' vae/config.json. */
static h3_status cfg_diffusers(h3_video_vae_config *c, const json_t *j, float *ratio, const char *what) {
    H3_TRY(h3_cfg_int(j, "out_channels", 1, 16, &c->out_channels, what));
    H3_TRY(cfg_prod(j, "spatial_downsample_factors", &c->patch_size, what));
    H3_TRY(cfg_prod(j, "temporal_downsample_factors", &c->patch_size_t, what));
    H3_TRY(h3_cfg_int(j, "decoder_num_layers", 1, 4096, &c->num_layers, what));
    H3_TRY(h3_cfg_int(j, "decoder_num_attention_heads", 1, 4096, &c->heads, what));
    H3_TRY(h3_cfg_int(j, "decoder_attention_head_dim", 1, 4096, &c->head_dim, what));
    H3_TRY(cfg_num(j, "decoder_rope_theta", 1e-6, 1e12, &c->rope_theta, what));
    H3_TRY(cfg_num(j, "decoder_rope_dim_ratio", 0.0, 1.0, ratio, what));
    H3_TRY(cfg_num(j, "decoder_norm_eps", 0.0, 1.0, &c->norm_eps, what));
    H3_TRY(h3_cfg_int(j, "clip_length", 1, 4096, &c->clip_length, what));
    H3_TRY(h3_cfg_int(j, "token_drop", 0, 4096, &c->token_drop, what));
    /* An absent key takes diffusers' default, as from_pretrained reads the file (AutoencoderKLMiniMaxH3: mean
     * 0 and std 1 for 24 channels, i.e. no normalization); a null, or a list of another length, is refused.
     */
    static const char *const keys[2] = {"latents_mean", "latents_std"};
    float *dst[2] = {c->latents_mean, c->latents_std};
    for (int k = 0; k < 2; k++) {
        if (json_object_get(j, keys[k])) continue;
        if (c->latent_channels != 24)
            return H3_ERR(H3_ERR_FORMAT,
                          "%s: \"%s\" is missing; diffusers' default holds 24 values, this VAE has %d "
                          "latent channels: give them",
                          what, keys[k], c->latent_channels);
        H3_WARN("%s has no \"%s\": using diffusers' default (%s for every channel), as diffusers does", what,
                keys[k], k ? "1" : "0");
        for (int i = 0; i < 24; i++) dst[k][i] = (float)k;
    }
    H3_TRY(h3_cfg_floats(j, "latents_mean", c->latent_channels, 0, 0, c->latents_mean, what));
    H3_TRY(h3_cfg_floats(j, "latents_std", c->latent_channels, 0, 1, c->latents_std, what));
    return H3_OK;
}

/* ---- opening ------------------------------------------------------------------------------------------------ */

/* The latent channels of a well-formed post_quant_conv ([C, C, 1, 1, 1]); a malformed one leaves the default,
 * and vv_finish_config names it. */
static void vv_channels_of(h3_video_vae *v) {
    const h3_st_entry *e = h3_st_find(&v->st, "post_quant_conv.weight");
    if (e && e->ndim == 5 && e->shape[0] == e->shape[1] && e->shape[2] == 1 && e->shape[3] == 1 &&
        e->shape[4] == 1 && e->shape[0] >= 1 && e->shape[0] <= H3_VVAE_MAX_CHANNELS)
        v->cfg.latent_channels = (int)e->shape[0];
}

/* Reads the configs of `path` and opens its weights; fills v->layout, v->cfg (config part), v->st. ratio receives
 * rope_dim_ratio. Recurses once into video_vae/ or vae/ of a model root. */
static h3_status vv_resolve(h3_video_vae *v, const char *path, float *ratio, int depth) {
    h3_status st = H3_OK;
    json_t *wrap = NULL, *src = NULL;
    char *dir = NULL, *wpath = NULL;
    if (!h3_path_exists(path)) return H3_ERR(H3_ERR_NOT_FOUND, "%s: no such file or folder", path);
    if (!h3_path_is_dir(path)) {
        /* A single file: ComfyUI's repack (official names), or a lone official/diffusers weight file. */
        H3_CHECK(h3_st_open(path, &v->st));
        v->layout = h3_st_find(&v->st, "decoder.proj_in.weight") ? H3_LAYOUT_DIFFUSERS : H3_LAYOUT_COMFY;
        const char *meta = h3_st_metadata(&v->st, "minimax_h3_video_vae");
        if (meta) {
            H3_CHECK_CTX(h3_json_parse(meta, strlen(meta), "metadata \"minimax_h3_video_vae\"", &wrap), "%s", path);
        }
        goto done;
    }
    int has_cfg = 0, has_src = 0;
    H3_CHECK(h3_cfg_file_in(path, "config.json", &has_cfg));
    if (has_cfg) {
        H3_CHECK(h3_cfg_load_json_in(path, "config.json", &wrap));
        const char *sp = h3_json_get_str(wrap, "source_path");
        const char *sf = h3_json_get_str(wrap, "source_safetensors_path");
        dir = h3_path_join(path, sp ? sp : "source");
        if (!dir) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        H3_CHECK(h3_cfg_file_in(dir, "config.json", &has_src));
        if (sp || has_src) {
            v->layout = H3_LAYOUT_OFFICIAL;
            char what[1024];
            snprintf(what, sizeof what, "%s/config.json", dir);
            H3_CHECK(h3_cfg_load_json_in(dir, "config.json", &src));
            wpath = h3_path_join(dir, sf ? sf : "model.safetensors");
            if (!wpath) H3_FAIL(H3_ERR_NOMEM, "out of memory");
            H3_CHECK(h3_st_open(wpath, &v->st));
            H3_CHECK(cfg_source(&v->cfg, src, ratio, what));
            goto done;
        }
        if (json_object_get(wrap, "decoder_num_layers") || json_object_get(wrap, "decoder_attention_head_dim")) {
            v->layout = H3_LAYOUT_DIFFUSERS;
            H3_CHECK(h3_st_open(path, &v->st));
            goto done;
        }
        json_decref(wrap);
        wrap = NULL;
    }
    if (depth == 0) {
        static const char *const subs[] = {"video_vae", "vae"};
        for (int i = 0; i < 2; i++) {
            char *sub = h3_path_join(path, subs[i]);
            if (!sub) H3_FAIL(H3_ERR_NOMEM, "out of memory");
            int isdir = h3_path_is_dir(sub);
            if (isdir) st = vv_resolve(v, sub, ratio, 1);
            h3_free(sub);
            if (isdir) goto out;
        }
    }
    H3_FAIL(H3_ERR_NOT_FOUND,
            "%s: no video VAE here (expected the official video_vae/ folder, a diffusers vae/ folder, a model folder "
            "holding one, or ComfyUI's video VAE file)",
            path);
done:
    if (st == H3_OK && v->layout == H3_LAYOUT_DIFFUSERS && wrap) {
        char what[1024];
        snprintf(what, sizeof what, "%s/config.json", path);
        /* latent channels come from the weights; read them first so the mean/std lengths can be checked */
        vv_channels_of(v);
        st = cfg_diffusers(&v->cfg, wrap, ratio, what);
    } else if (st == H3_OK && wrap) {
        char what[1024];
        snprintf(what, sizeof what, "%s%s", path, v->layout == H3_LAYOUT_OFFICIAL ? "/config.json" : " metadata");
        vv_channels_of(v);
        st = cfg_wrapper(&v->cfg, wrap, v->layout == H3_LAYOUT_OFFICIAL, what);
    }
out:
    json_decref(wrap);
    json_decref(src);
    h3_free(dir);
    h3_free(wpath);
    return st;
}

/* An anchor of the sizes the weights imply: a float tensor of rank nd (free sizes); its shape into out. */
static h3_status vv_anchor(const h3_video_vae *v, const char *name, int nd, const char *words, int64_t *out) {
    h3_wb_row r = h3_wb_row_make(name, NULL, nd, H3_WB_ANY, H3_WB_ANY, H3_WB_ANY, H3_WB_ANY, H3_WB_FLOATS, 0,
                                 words, (h3_wb_unit){NULL, 0, -1});
    for (int i = 4; i < nd; i++) r.shape[i] = H3_WB_ANY;
    h3_wb_info in;
    H3_TRY(h3_wb_check(&v->wb, &r, NULL, &in));
    memcpy(out, in.shape, (size_t)nd * sizeof *out);
    return H3_OK;
}

/* Sizes the weights imply, cross-checked with the config; then every tensor's shape. */
static h3_status vv_finish_config(h3_video_vae *v, const h3_video_vae_opts *o, float ratio) {
    h3_video_vae_config *c = &v->cfg;
    const h3_wb_unit model = {NULL, 0, -1};
    char name[160];
    int64_t pq[5], in[2], reg[3], out[2], w1[2];
    H3_TRY(vv_anchor(v, "post_quant_conv.weight", 5, vv_words(W_PQ_W), pq));
    const int64_t C = pq[0];
    if (C < 1 || C > H3_VVAE_MAX_CHANNELS || pq[1] != C || pq[2] != 1 || pq[3] != 1 || pq[4] != 1)
        return h3_wb_shape_error(&v->wb, "post_quant_conv.weight", 5, pq, &model,
                                 "%s with 1 to %d latent channels", vv_words(W_PQ_W), H3_VVAE_MAX_CHANNELS);
    if (C != c->latent_channels) /* only a file without a config gets here: the built-in mean/std are for 24 */
        return h3_wb_shape_error(
            &v->wb, "post_quant_conv.weight", 5, pq, &model,
            "%d latent channels: the built-in latents_mean/latents_std are the release's %d "
            "(a file with other channels needs them in its config)",
            c->latent_channels, c->latent_channels);
    const char *in_name = vv_name(v->layout, VV_IO, W_IN_W, name, sizeof name);
    H3_TRY(vv_anchor(v, in_name, 2, vv_words(W_IN_W), in));
    const int64_t dim = in[0];
    if (dim < 1 || dim > (1 << 16))
        return h3_wb_shape_error(&v->wb, in_name, 2, in, &model, "a hidden size of 1 to 65536");
    H3_TRY(vv_anchor(v, "decoder.register_tokens", 3, vv_words(W_REG), reg));
    const int64_t R = reg[1];
    if (R > 4096)
        return h3_wb_shape_error(&v->wb, "decoder.register_tokens", 3, reg, &model, "at most 4096 registers");
    H3_TRY(vv_anchor(v, "decoder.proj_out.weight", 2, vv_words(W_OUT_W), out));
    const int64_t P = out[0];
    const char *w1_name = vv_name(v->layout, 0, W_W1, name, sizeof name);
    H3_TRY(vv_anchor(v, w1_name, 2, vv_words(W_W1), w1));
    const int64_t I2 = w1[0];
    if (I2 < 2 || I2 % 2 || I2 > (1 << 20))
        return h3_wb_shape_error(&v->wb, w1_name, 2, w1, &(h3_wb_unit){"ViT block", 0, 0},
                                 "an even 2·FFN of 2 to 2^20 rows");
    int L = h3_count_layers(&v->st, "decoder.transformer_blocks.");
    if (L < 1)
        return h3_wb_missing_error(&v->wb, "decoder.transformer_blocks.0.norm1.weight", &model,
                                   "ViT block 0");
    if (c->num_layers && c->num_layers != L) /* 0: no config said */
        return H3_ERR(H3_ERR_FORMAT, "%s: the config says %d ViT blocks, the weights hold %d (an incomplete file?)",
                      v->source, c->num_layers, L);
    c->num_layers = L;
    c->num_register_tokens = (int)R;
    c->ffn_inner = (int)(I2 / 2);
    if (v->layout == H3_LAYOUT_COMFY) {
        c->heads = o->heads > 0 ? o->heads : (int)(dim / 64 > 0 ? dim / 64 : 1);
        if (dim % c->heads) { /* the file's or the request's fault: the message names both */
            char a[96];
            return H3_ERR(H3_ERR_INVALID,
                          "%s: tensor '%s' has shape %s; the video VAE needs a hidden size that is a "
                          "multiple of the %d heads (%s)",
                          v->source, in_name, h3_shape_str(2, in, a, sizeof a), c->heads,
                          o->heads > 0 ? "--heads" : "hidden / 64: give --heads");
        }
        c->head_dim = (int)(dim / c->heads);
        /* The file has no config: the patch size follows from the output projection. */
        int64_t pp = P / ((int64_t)c->out_channels * c->patch_size_t);
        int p = (int)llround(sqrt((double)pp));
        if (P < 1 || pp * c->out_channels * c->patch_size_t != P || (int64_t)p * p != pp)
            return h3_wb_shape_error(&v->wb, "decoder.proj_out.weight", 2, out, &model,
                                     "%d channels × %d frames × patch² outputs", c->out_channels,
                                     c->patch_size_t);
        c->patch_size = p;
    } else if (o->heads > 0 && o->heads != c->heads) {
        return H3_ERR(H3_ERR_INVALID, "the config of %s sets %d heads; --heads %d contradicts it", v->source, c->heads,
                      o->heads);
    }
    if ((int64_t)c->heads * c->head_dim != dim)
        return h3_wb_shape_error(&v->wb, in_name, 2, in, &model,
                                 "a hidden size of %d heads × %d channels = %lld", c->heads, c->head_dim,
                                 (long long)c->heads * c->head_dim);
    c->rope_dim = (int)floor((double)c->head_dim * (double)ratio + 1e-9);
    if ((c->rope_dim % 6 || c->rope_dim > c->head_dim) &&
        v->layout == H3_LAYOUT_COMFY) /* head_dim from the shape */
        return h3_wb_shape_error(
            &v->wb, in_name, 2, in, &model,
            "a head_dim (hidden / %d heads) whose %.0f%% are a multiple of 6 rotary channels (3 "
            "axes × cos/sin halves)",
            c->heads, 100.0 * ratio);
    if (c->rope_dim % 6 || c->rope_dim > c->head_dim)
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: %d rotary channels per head (of %d) are not a multiple of 6 (3 axes × "
                      "cos/sin halves)", v->source, c->rope_dim, c->head_dim);
    if (c->patch_size < 1 || c->patch_size_t < 1 || c->clip_length < 1)
        return H3_ERR(H3_ERR_FORMAT, "%s: patch sizes and the clip length must be positive", v->source);
    if (o->tile_size > 0) c->tile_size = o->tile_size;
    if (o->tile_overlap_min > 0) c->tile_overlap_min = o->tile_overlap_min;
    if (o->no_tiling) c->tile_size = 0;
    if (c->tile_size) {
        if (c->tile_size % c->patch_size || c->tile_overlap_min % c->patch_size || c->tile_overlap_min >= c->tile_size)
            return H3_ERR(H3_ERR_INVALID, "tiles of %d px with at least %d px of overlap: both must be multiples of the "
                          "%d px latent size, the overlap smaller than the tile", c->tile_size, c->tile_overlap_min,
                          c->patch_size);
    }
    /* The block matrices' dtype and QKV form, then every tensor. */
    c->fused_qkv = v->layout != H3_LAYOUT_DIFFUSERS;
    {
        h3_wb_row qr;
        const h3_st_entry *qe;
        vv_row(v, 0, c->fused_qkv ? W_QKV_W : W_Q_W, name, sizeof name, NULL, &qr);
        H3_TRY(h3_wb_check(&v->wb, &qr, &qe, NULL));
        c->weight_dtype = qe->dtype;
    }
    H3_TRY(vv_check_part(v, VV_IO));
    for (int i = 0; i < L; i++) H3_TRY(vv_check_part(v, i));
    return H3_OK;
}

h3_status h3_video_vae_open(const char *path, const h3_video_vae_opts *opts, h3_video_vae **out) {
    *out = NULL;
    h3_video_vae_opts o0 = {0};
    const h3_video_vae_opts *o = opts ? opts : &o0;
    if (o->tile_size < 0 || o->tile_overlap_min < 0 || o->heads < 0 || o->rows_per_step < 0)
        return H3_ERR(H3_ERR_INVALID, "video VAE options must not be negative");
    h3_video_vae *v = h3_calloc(1, sizeof *v, H3_MEM_OTHER);
    if (!v) return H3_ERR_NOMEM;
    h3_video_vae_default_config(&v->cfg);
    v->cfg.num_layers = 0; /* set by a config, else counted from the weights */
    v->rows_per_step = o->rows_per_step > 0 ? o->rows_per_step : 512;
    float ratio = 0.75f;
    h3_status st = vv_resolve(v, path, &ratio, 0);
    if (st == H3_OK) {
        v->source = h3_strdup(v->st.source ? v->st.source : path);
        if (!v->source) st = H3_ERR_NOMEM;
        v->wb = (h3_wbind){&v->st, "", v->source, "video VAE", NULL, NULL};
    }
    if (st == H3_OK) {
        for (int64_t i = 0; i < v->st.n_entries; i++) {
            const char *n = v->st.entries[i].name;
            if (h3_str_ends_with(n, ".comfy_quant")) {
                st = H3_ERR(H3_ERR_UNSUPPORTED, "%s: quantized video VAE weights ('%s') are not supported; use the "
                            "fp16 or fp32 file", v->source, n);
                break;
            }
        }
    }
    if (st == H3_OK) st = vv_finish_config(v, o, ratio);
    if (st != H3_OK) {
        st = h3_error_wrap(st, "opening the video VAE %s", path);
        h3_video_vae_close(v);
        return st;
    }
    *out = v;
    return H3_OK;
}

void h3_video_vae_close(h3_video_vae *v) {
    if (!v) return;
    if (v->st.files || v->st.entries) h3_st_close(&v->st);
    h3_free(v->source);
    h3_free(v);
}

const h3_video_vae_config *h3_video_vae_get_config(const h3_video_vae *v) {
    return &v->cfg;
}
h3_layout h3_video_vae_layout(const h3_video_vae *v) {
    return v->layout;
}
const char *h3_video_vae_source(const h3_video_vae *v) {
    return v->source;
}

/* ---- the chunk and tile plan -------------------------------------------------------------------------------- */

typedef struct {
    int64_t T, H, W, Hp, Wp;
    int single;                   /* one latent frame: decode it alone, keep its last pixel frame */
    int cs, pre, tov, fov, pad, chunks, clip_len;
    int main_frames, ovl_frames;  /* canvas frames kept from each chunk: delivered, and cross-faded into the next */
    int64_t frames;               /* output frames */
    int ny, nx;
    int64_t ys[H3_VVAE_MAX_TILES], yo[H3_VVAE_MAX_TILES], xs[H3_VVAE_MAX_TILES], xo[H3_VVAE_MAX_TILES];
    int64_t th, tw, thp, twp;     /* tile size in latents and pixels */
    int64_t max_sv, max_sh;       /* rows / columns of the raw strips kept for blending */
    int64_t N, S, rc;             /* tokens, with registers and the zero token, rows per FFN step */
    /* arena layout, in floats from the arena start */
    int64_t o_canvas, o_prev, o_tile, o_bstrip, o_rstrip, o_vb, o_t1, o_t2, o_wav, o_wbv, o_wah, o_wbh;
    int64_t o_ztok, o_pq, o_gidx, o_x, o_xn, o_a, o_q, o_k, o_v, o_cos, o_sin, o_ffh, o_ffg, total;
    int64_t chunk_floats, vit_floats;
} vv_plan;

/* Tiles of `tile` px over `len` px: the fewest whose overlaps are all >= min_ov, the slack then spread over the
 * overlaps round-robin in whole latents (diffusers' _split_tiles). */
static h3_status vv_split(int64_t len, int64_t tile, int64_t min_ov, int64_t ratio, int *n_out, int64_t *starts,
                          int64_t *ov, int64_t *tlen) {
    if (tile <= 0 || tile >= len) {
        *n_out = 1;
        starts[0] = 0;
        *tlen = len;
        return H3_OK;
    }
    int64_t n = (len + tile - 1) / tile;
    while (tile * n - min_ov * (n - 1) < len) n++;
    if (n > H3_VVAE_MAX_TILES)
        return H3_ERR(H3_ERR_INVALID, "%lld px need %lld tiles of %lld px; h3run allows %d per axis", (long long)len,
                      (long long)n, (long long)tile, H3_VVAE_MAX_TILES);
    int64_t slack = tile * n - min_ov * (n - 1) - len;
    for (int64_t i = 0; i < n - 1; i++) ov[i] = min_ov;
    for (int64_t i = 0; i < slack / ratio; i++) ov[i % (n - 1)] += ratio;
    starts[0] = 0;
    for (int64_t i = 0; i < n - 1; i++) starts[i + 1] = starts[i] + tile - ov[i];
    *n_out = (int)n;
    *tlen = tile;
    return H3_OK;
}

/* The temporal geometry alone (shared by the frame count). */
static void vv_temporal(const h3_video_vae_config *c, int64_t T, vv_plan *p) {
    int pt = c->patch_size_t;
    p->single = T == 1;
    p->cs = (c->clip_length + pt - 1) / pt;
    p->pre = ((-c->clip_length) % pt + pt) % pt;
    p->tov = ((-c->token_drop) % p->cs + p->cs) % p->cs;
    p->fov = p->tov * pt - p->pre > 0 ? p->tov * pt - p->pre : 0;
    if (p->single) {
        p->pad = 0;
        p->chunks = 1;
        p->clip_len = 1;
        p->main_frames = 1;
        p->ovl_frames = 0;
        p->frames = 1;
        return;
    }
    int64_t tok = T + c->token_drop;
    p->pad = (int)(((-tok) % p->cs + p->cs) % p->cs);
    p->chunks = (int)((tok + p->pad) / p->cs - (c->token_drop > 0 ? 1 : 0));
    if (p->chunks < 1) { /* too few latent frames for a chunk: pad one more (as ComfyUI does) */
        p->pad += p->cs;
        p->chunks += 1;
    }
    p->clip_len = p->cs + p->tov;
    int64_t clip_frames = (int64_t)p->clip_len * pt, seg = (int64_t)p->cs * pt;
    int64_t m = (clip_frames < seg ? clip_frames : seg) - p->pre;
    p->main_frames = (int)(m > 0 ? m : 0);
    int64_t ov = 0;
    if (c->token_drop > 0) {
        int64_t e = clip_frames < 2 * seg ? clip_frames : 2 * seg;
        ov = e - seg - p->pre;
    }
    p->ovl_frames = (int)(ov > 0 ? ov : 0);
    int64_t drop = 0, tail = c->clip_length % pt;
    for (int k = 0; k < p->pad; k++) drop += (tail && (T + k) % p->cs == 0) ? tail : pt;
    p->frames = (int64_t)p->chunks * p->main_frames + p->ovl_frames - drop;
}

int64_t h3_video_vae_num_frames(const h3_video_vae_config *c, int64_t T) {
    if (T < 1) return 0;
    vv_plan p;
    memset(&p, 0, sizeof p);
    vv_temporal(c, T, &p);
    return p.frames;
}

static int64_t al16(int64_t n) {
    return (n + 15) / 16 * 16;
}

static h3_status vv_make_plan(const h3_video_vae_config *c, int64_t T, int64_t H, int64_t W, int64_t rows_step,
                              vv_plan *p) {
    memset(p, 0, sizeof *p);
    int64_t ps = c->patch_size, pt = c->patch_size_t;
    p->T = T;
    p->H = H;
    p->W = W;
    p->Hp = H * ps;
    p->Wp = W * ps;
    if (c->tile_size && (c->tile_size % ps || c->tile_overlap_min % ps || c->tile_overlap_min >= c->tile_size ||
                         c->tile_overlap_min < 0))
        return H3_ERR(H3_ERR_INVALID, "tiles of %d px with %d px of overlap do not fit %lld px latents", c->tile_size,
                      c->tile_overlap_min, (long long)ps);
    if (ps < 1 || pt < 1 || c->clip_length < 1 || c->token_drop < 0 || c->latent_channels < 1 ||
        c->latent_channels > H3_VVAE_MAX_CHANNELS || c->rope_dim % 6 || c->heads < 1 || c->head_dim < 1)
        return H3_ERR(H3_ERR_INVALID, "video VAE config is inconsistent");
    vv_temporal(c, T, p);
    if (p->frames < 1) return H3_ERR(H3_ERR_INVALID, "%lld latent frames decode to no frames", (long long)T);
    int64_t tlen;
    H3_TRY(vv_split(p->Hp, c->tile_size, c->tile_overlap_min, ps, &p->ny, p->ys, p->yo, &tlen));
    p->thp = tlen;
    H3_TRY(vv_split(p->Wp, c->tile_size, c->tile_overlap_min, ps, &p->nx, p->xs, p->xo, &tlen));
    p->twp = tlen;
    p->th = p->thp / ps;
    p->tw = p->twp / ps;
    for (int i = 0; i + 1 < p->ny; i++) {
        int64_t e = p->yo[i] < p->thp ? p->yo[i] : p->thp;
        if (e > p->max_sv) p->max_sv = e;
    }
    for (int i = 0; i + 1 < p->nx; i++) {
        int64_t e = p->xo[i] < p->twp ? p->xo[i] : p->twp;
        if (e > p->max_sh) p->max_sh = e;
    }
    int64_t oc = c->out_channels, Fc = p->main_frames + p->ovl_frames, Tc = p->clip_len;
    int64_t C = c->latent_channels, dim = (int64_t)c->heads * c->head_dim, I = c->ffn_inner;
    int64_t P = oc * pt * ps * ps;
    p->N = Tc * p->th * p->tw;
    p->S = p->N + c->num_register_tokens + 1;
    p->rc = rows_step < p->S ? rows_step : p->S;
    int64_t band = p->max_sv * p->twp > p->thp * p->max_sh ? p->max_sv * p->twp : p->thp * p->max_sh;
    int64_t o = 0;
#define TAKE(field, n) (p->field = o, o += al16(n))
    TAKE(o_canvas, oc * Fc * p->Hp * p->Wp);
    TAKE(o_prev, oc * p->ovl_frames * p->Hp * p->Wp);
    TAKE(o_tile, oc * Tc * pt * p->thp * p->twp);
    TAKE(o_bstrip, (int64_t)p->nx * oc * Fc * p->max_sv * p->twp);
    TAKE(o_rstrip, oc * Fc * p->thp * p->max_sh);
    TAKE(o_vb, p->max_sv * p->twp);
    TAKE(o_t1, band);
    TAKE(o_t2, band);
    TAKE(o_wav, p->max_sv * p->twp);
    TAKE(o_wbv, p->max_sv * p->twp);
    TAKE(o_wah, p->max_sh);
    TAKE(o_wbh, p->max_sh);
    p->chunk_floats = o;
    TAKE(o_ztok, p->N * C);
    TAKE(o_pq, p->N * C);
    TAKE(o_gidx, p->N * C); /* i32 */
    TAKE(o_x, p->S * dim);
    TAKE(o_xn, p->S * dim);
    TAKE(o_a, p->S * dim * (c->fused_qkv ? 3 : 1));
    TAKE(o_q, p->S * dim);
    TAKE(o_k, p->S * dim);
    TAKE(o_v, p->S * dim);
    TAKE(o_cos, p->S * c->rope_dim);
    TAKE(o_sin, p->S * c->rope_dim);
    TAKE(o_ffh, p->rc * (2 * I > P ? 2 * I : P));
    TAKE(o_ffg, p->rc * (I > P / ps ? I : P / ps)); /* also the output scatter's i32 indices */
#undef TAKE
    p->vit_floats = o - p->chunk_floats;
    p->total = o;
    if (T * H * W * C > INT32_MAX || oc * Tc * pt * p->thp * p->tw > INT32_MAX)
        return H3_ERR(H3_ERR_INVALID, "latents [%lld, %lld, %lld, %lld] are too large for one decode", (long long)C,
                      (long long)T, (long long)H, (long long)W);
    return H3_OK;
}

/* The CPU GEMM's scratch for a weight [N, K] of this decoder's dtype (the kernel's own arithmetic). */
static int64_t gemm_scratch(int64_t N, int64_t K, h3_dtype dt) {
    return h3_cpu_gemm_scratch_bytes(N, K, dt, 0);
}

static int64_t vv_op_scratch(const h3_video_vae_config *c, int threads) {
    int64_t C = c->latent_channels, dim = (int64_t)c->heads * c->head_dim, I = c->ffn_inner, D = c->head_dim;
    int64_t P = (int64_t)c->out_channels * c->patch_size_t * c->patch_size * c->patch_size;
    h3_dtype dt = c->weight_dtype;
    int64_t m = h3_cpu_attention_scratch_bytes(threads, D);
    int64_t g[7] = {gemm_scratch(C, C, dt), gemm_scratch(dim, C, dt),
                    c->fused_qkv ? gemm_scratch(3 * dim, dim, dt) : gemm_scratch(dim, dim, dt),
                    gemm_scratch(dim, dim, dt), gemm_scratch(2 * I, dim, dt), gemm_scratch(dim, I, dt),
                    gemm_scratch(P, dim, dt)};
    for (int i = 0; i < 7; i++) m = g[i] > m ? g[i] : m;
    if (2 * dim * 4 > m) m = 2 * dim * 4; /* layer norm weight and bias */
    return m;
}

h3_status h3_video_vae_decode_peak(const h3_video_vae_config *c, int64_t T, int64_t H, int64_t W, int threads,
                                   int rows_per_step, h3_video_vae_mem *out) {
    memset(out, 0, sizeof *out);
    if (T < 1 || H < 1 || W < 1) return H3_ERR(H3_ERR_INVALID, "latent sizes must be positive");
    vv_plan p;
    H3_TRY(vv_make_plan(c, T, H, W, rows_per_step > 0 ? rows_per_step : 512, &p));
    out->chunk_buffers = p.chunk_floats * 4 + (int64_t)sizeof(vv_plan); /* the plan itself is heap memory too */
    out->vit = p.vit_floats * 4;
    out->op_scratch = vv_op_scratch(c, threads > 0 ? threads : 1);
    out->block_scratch = c->weight_dtype != H3_F32 ? 2 * (int64_t)c->heads * c->head_dim * 4 : 0;
    out->total = out->chunk_buffers + out->vit + out->op_scratch + out->block_scratch;
    out->chunks = p.chunks;
    out->tiles_y = p.ny;
    out->tiles_x = p.nx;
    out->frames = p.frames;
    out->tokens_per_tile = p.S;
    return H3_OK;
}

/* ---- checks --------------------------------------------------------------------------------------------------- */

h3_status h3_video_vae_check_latents(const h3_video_vae_config *c, const h3_tensor *z) {
    char s[96];
    int off = z->ndim == 5 ? 1 : 0;
    if ((z->ndim != 4 && z->ndim != 5) || (off && z->shape[0] != 1))
        return H3_ERR(H3_ERR_INVALID, "video latents must be [C, T, H, W] or [1, C, T, H, W] (one video); got %s",
                      h3_tensor_shape_str(z, s, sizeof s));
    if (h3_tensor_numel(z) == 0)
        return H3_ERR(H3_ERR_INVALID,
                      "video latents %s hold no values: every dimension must be at least 1 (e.g. [1, "
                      "%d, 31, 48, 84] for 124 frames at 1344 × 768)",
                      h3_tensor_shape_str(z, s, sizeof s), c->latent_channels);
    if (z->dtype != H3_F32 || !h3_tensor_is_contiguous(z) || z->place == H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID, "video latents must be contiguous f32 host memory, got %s",
                      h3_dtype_name(z->dtype));
    int64_t C = z->shape[off], T = z->shape[off + 1], H = z->shape[off + 2], W = z->shape[off + 3];
    if (C != c->latent_channels)
        return H3_ERR(H3_ERR_INVALID, "video latents %s have %lld channels; this video VAE takes %d",
                      h3_tensor_shape_str(z, s, sizeof s), (long long)C, c->latent_channels);
    if (T < 1 || H < 1 || W < 1)
        return H3_ERR(H3_ERR_INVALID, "video latents %s are empty", h3_tensor_shape_str(z, s, sizeof s));
    if (H % 2 || W % 2)
        return H3_ERR(H3_ERR_INVALID, "video latents %s are %lld × %lld: height and width must be even (H3 canvases "
                      "are multiples of 32 px, e.g. 48 × 84 latents for 768 × 1344)", h3_tensor_shape_str(z, s, sizeof s),
                      (long long)H, (long long)W);
    if (T > 100000 || H > 100000 || W > 100000)
        return H3_ERR(H3_ERR_INVALID, "video latents %s are implausibly large", h3_tensor_shape_str(z, s, sizeof s));
    return H3_OK;
}

/* ---- decoding ----------------------------------------------------------------------------------------------- */

typedef struct {
    h3_video_vae *v;
    h3_exec *ex;
    const h3_video_vae_config *c;
    vv_plan *p;
    float *ar; /* the arena */
    h3_tensor lat_rows; /* the latents as [numel, 1] */
    vv_part io;
    float cur_ev, cur_eh; /* blend extents the weight tables hold */
    int64_t delivered;
    const h3_video_decode_out *out;
} vv_run;

static h3_tensor vw(float *base, int64_t rows, int64_t cols, int64_t ld) {
    h3_tensor t;
    int64_t s[2] = {rows, cols};
    h3_tensor_wrap(&t, base, H3_PLACE_HOST, H3_F32, 2, s);
    t.stride[0] = ld;
    return t;
}
static h3_tensor vw_i32(void *base, int64_t n) {
    h3_tensor t;
    h3_tensor_wrap(&t, base, H3_PLACE_HOST, H3_I32, 1, &n);
    return t;
}
static h3_tensor vw3(float *base, int64_t a, int64_t b, int64_t c) {
    h3_tensor t;
    int64_t s[3] = {a, b, c};
    h3_tensor_wrap(&t, base, H3_PLACE_HOST, H3_F32, 3, s);
    return t;
}

/* Rotary tables [S, R]: per axis the coordinate (i + 0.5)/n mapped to [-1, 1), angles 2π·coord·θ^(-6k/R) for
 * k < R/6, laid out [t | h | w] twice. Register and zero tokens sit at the origin (cos 1, sin 0). They depend
 * on the tile's token grid (clip_len, th, tw) alone, the same for every tile and chunk of a decode: built
 * once per decode (nothing else writes o_cos / o_sin). */
static void vv_rope_tables(const vv_run *r) {
    const h3_video_vae_config *c = r->c;
    const vv_plan *p = r->p;
    int64_t R = c->rope_dim, nf = R / 6;
    float *cs = r->ar + p->o_cos, *sn = r->ar + p->o_sin;
    int64_t dims[3] = {p->clip_len, p->th, p->tw};
    for (int64_t n = 0; n < p->S; n++) {
        float *cr = cs + n * R, *sr = sn + n * R;
        if (n >= p->N) {
            for (int64_t i = 0; i < R; i++) cr[i] = 1.0f, sr[i] = 0.0f;
            continue;
        }
        int64_t idx[3] = {n / (p->th * p->tw), (n / p->tw) % p->th, n % p->tw};
        for (int a = 0; a < 3; a++) {
            double coord = 2.0 * ((double)idx[a] + 0.5) / (double)dims[a] - 1.0;
            for (int64_t k = 0; k < nf; k++) {
                double ang = 2.0 * M_PI * coord * pow((double)c->rope_theta, -(6.0 * (double)k) / (double)R);
                float cv = (float)cos(ang), sv = (float)sin(ang);
                cr[a * nf + k] = cr[3 * nf + a * nf + k] = cv;
                sr[a * nf + k] = sr[3 * nf + a * nf + k] = sv;
            }
        }
    }
}

/* One transformer block over x [S, hidden]. */
static h3_status vv_block(vv_run *r, const vv_part *w) {
    const h3_video_vae_config *c = r->c;
    const vv_plan *p = r->p;
    h3_exec *ex = r->ex;
    int64_t S = p->S, dim = (int64_t)c->heads * c->head_dim, H = c->heads, D = c->head_dim, I = c->ffn_inner;
    float *ar = r->ar;
    h3_tensor x = vw(ar + p->o_x, S, dim, dim), xn = vw(ar + p->o_xn, S, dim, dim);
    h3_tensor q2 = vw(ar + p->o_q, S * H, D, D), k2 = vw(ar + p->o_k, S * H, D, D), v2 = vw(ar + p->o_v, S * H, D, D);
    h3_tensor q3 = vw3(ar + p->o_q, S, H, D), k3 = vw3(ar + p->o_k, S, H, D), v3 = vw3(ar + p->o_v, S, H, D);
    h3_tensor o3 = vw3(ar + p->o_a, S, H, D), o2 = vw(ar + p->o_a, S, dim, dim);
    h3_tensor cs = vw(ar + p->o_cos, S, c->rope_dim, c->rope_dim), sn = vw(ar + p->o_sin, S, c->rope_dim, c->rope_dim);
    H3_TRY(h3_op_rms_norm(ex, &xn, &x, &w->t[W_N1], c->norm_eps));
    if (c->fused_qkv) {
        /* rows are per head [q | k | v] (the checkpoint's interleave): pick them out with strided views */
        h3_tensor qkv = vw(ar + p->o_a, S, 3 * dim, 3 * dim), per_head = vw(ar + p->o_a, S * H, 3 * D, 3 * D), sub;
        H3_TRY(h3_op_gemm(ex, &qkv, &xn, &w->t[W_QKV_W], &w->t[W_QKV_B], 0));
        H3_TRY(h3_tensor_narrow(&per_head, 1, 0, D, &sub));
        H3_TRY(h3_op_rms_norm(ex, &q2, &sub, NULL, c->norm_eps));
        H3_TRY(h3_tensor_narrow(&per_head, 1, D, D, &sub));
        H3_TRY(h3_op_rms_norm(ex, &k2, &sub, NULL, c->norm_eps));
        H3_TRY(h3_tensor_narrow(&per_head, 1, 2 * D, D, &sub));
        H3_TRY(h3_op_convert(ex, &v2, &sub));
    } else {
        h3_tensor qf = vw(ar + p->o_q, S, dim, dim), kf = vw(ar + p->o_k, S, dim, dim), vf = vw(ar + p->o_v, S, dim, dim);
        H3_TRY(h3_op_gemm(ex, &qf, &xn, &w->t[W_Q_W], &w->t[W_Q_B], 0));
        H3_TRY(h3_op_gemm(ex, &kf, &xn, &w->t[W_K_W], &w->t[W_K_B], 0));
        H3_TRY(h3_op_gemm(ex, &vf, &xn, &w->t[W_V_W], &w->t[W_V_B], 0));
        H3_TRY(h3_op_rms_norm(ex, &q2, &q2, NULL, c->norm_eps));
        H3_TRY(h3_op_rms_norm(ex, &k2, &k2, NULL, c->norm_eps));
    }
    H3_TRY(h3_op_rope(ex, &q3, &q3, &cs, &sn));
    H3_TRY(h3_op_rope(ex, &k3, &k3, &cs, &sn));
    H3_TRY(h3_op_attention(ex, &o3, &q3, &k3, &v3, 1.0f / sqrtf((float)D), 0));
    H3_TRY(h3_op_gemm(ex, &xn, &o2, &w->t[W_O_W], &w->t[W_O_B], 0));
    H3_TRY(h3_op_gated_add(ex, &x, &xn, &w->t[W_S1], NULL));
    H3_TRY(h3_op_rms_norm(ex, &xn, &x, &w->t[W_N2], c->norm_eps));
    for (int64_t r0 = 0; r0 < S; r0 += p->rc) {
        int64_t n = S - r0 < p->rc ? S - r0 : p->rc;
        h3_tensor xr = vw(ar + p->o_xn + r0 * dim, n, dim, dim);
        h3_tensor h1 = vw(ar + p->o_ffh, n, 2 * I, 2 * I), g = vw(ar + p->o_ffg, n, I, I);
        H3_TRY(h3_op_gemm(ex, &h1, &xr, &w->t[W_W1], &w->t[W_B1], 0));
        H3_TRY(h3_op_swiglu(ex, &g, &h1, r->v->layout != H3_LAYOUT_DIFFUSERS));
        H3_TRY(h3_op_gemm(ex, &xr, &g, &w->t[W_W2], &w->t[W_B2], 0));
    }
    H3_TRY(h3_op_gated_add(ex, &x, &xn, &w->t[W_S2], NULL));
    return H3_OK;
}

/* The ViT on one tile: latent frames t0.. (clip_len of them, the last repeated past T), rows y0.., columns x0..
 * (latents) -> the tile's pixels [oc, clip_len·pt, thp, twp] at o_tile. */
static h3_status vv_tile(vv_run *r, int64_t t0, int64_t y0, int64_t x0) {
    const h3_video_vae_config *c = r->c;
    const vv_plan *p = r->p;
    h3_exec *ex = r->ex;
    float *ar = r->ar;
    int64_t C = c->latent_channels, N = p->N, S = p->S, dim = (int64_t)c->heads * c->head_dim;
    int64_t th = p->th, tw = p->tw, HW = p->H * p->W, THW = p->T * HW;
    /* gather the tile's latents as tokens [N, C] */
    int32_t *gi = (int32_t *)(ar + p->o_gidx);
    for (int64_t n = 0; n < N; n++) {
        int64_t t = t0 + n / (th * tw), y = y0 + (n / tw) % th, x = x0 + n % tw;
        if (t > p->T - 1) t = p->T - 1;
        for (int64_t ch = 0; ch < C; ch++) gi[n * C + ch] = (int32_t)(ch * THW + t * HW + y * p->W + x);
    }
    h3_tensor zr = vw(ar + p->o_ztok, N * C, 1, 1), gidx = vw_i32(gi, N * C);
    H3_TRY(h3_op_gather_rows(ex, &zr, &r->lat_rows, &gidx));
    h3_tensor z = vw(ar + p->o_ztok, N, C, C), pq = vw(ar + p->o_pq, N, C, C), mean, std;
    int64_t cc = C;
    h3_tensor_wrap(&mean, (void *)c->latents_mean, H3_PLACE_HOST, H3_F32, 1, &cc);
    h3_tensor_wrap(&std, (void *)c->latents_std, H3_PLACE_HOST, H3_F32, 1, &cc);
    H3_TRY(h3_op_binary(ex, &z, &z, &std, H3_BINARY_MUL));
    H3_TRY(h3_op_binary(ex, &z, &z, &mean, H3_BINARY_ADD));
    H3_TRY(h3_op_gemm(ex, &pq, &z, &r->io.t[W_PQ_W], &r->io.t[W_PQ_B], 0));
    h3_tensor xt = vw(ar + p->o_x, N, dim, dim);
    H3_TRY(h3_op_gemm(ex, &xt, &pq, &r->io.t[W_IN_W], &r->io.t[W_IN_B], 0));
    if (c->num_register_tokens > 0) {
        h3_tensor xr = vw(ar + p->o_x + N * dim, c->num_register_tokens, dim, dim);
        H3_TRY(h3_op_convert(ex, &xr, &r->io.t[W_REG]));
    }
    h3_tensor x0r = vw(ar + p->o_x + (S - 1) * dim, 1, dim, dim);
    H3_TRY(h3_op_fill(ex, &x0r, 0.0f));
    for (int i = 0; i < c->num_layers; i++) {
        vv_part w;
        H3_TRY(vv_acquire(r->v, i, &w));
        h3_status st = vv_block(r, &w);
        vv_release(&w);
        if (st != H3_OK) return st;
    }
    h3_tensor xa = vw(ar + p->o_x, N, dim, dim), xn = vw(ar + p->o_xn, N, dim, dim);
    H3_TRY(h3_op_layer_norm(ex, &xn, &xa, &r->io.t[W_LN_W], &r->io.t[W_LN_B], c->norm_eps));
    /* the output projection in row steps, each token's [oc, pt, p, p] values scattered as rows of p pixels */
    int64_t ps = c->patch_size, pt = c->patch_size_t, oc = c->out_channels, P = oc * pt * ps * ps, PR = P / ps;
    int64_t Tc = p->clip_len, thp = p->thp;
    h3_tensor tile_rows = vw(ar + p->o_tile, oc * Tc * pt * thp * tw, ps, ps);
    int32_t *si = (int32_t *)(ar + p->o_ffg);
    for (int64_t r0 = 0; r0 < N; r0 += p->rc) {
        int64_t n = N - r0 < p->rc ? N - r0 : p->rc;
        h3_tensor xr = vw(ar + p->o_xn + r0 * dim, n, dim, dim), pj = vw(ar + p->o_ffh, n, P, P);
        H3_TRY(h3_op_gemm(ex, &pj, &xr, &r->io.t[W_OUT_W], &r->io.t[W_OUT_B], 0));
        for (int64_t i = 0; i < n; i++) {
            int64_t tok = r0 + i, t = tok / (th * tw), y = (tok / tw) % th, x = tok % tw;
            for (int64_t j = 0; j < PR; j++) {
                int64_t ch = j / (pt * ps), dt = (j / ps) % pt, dy = j % ps;
                si[i * PR + j] = (int32_t)(((ch * (Tc * pt) + t * pt + dt) * thp + y * ps + dy) * tw + x);
            }
        }
        h3_tensor src = vw(ar + p->o_ffh, n * PR, ps, ps), idx = vw_i32(si, n * PR);
        H3_TRY(h3_op_scatter_rows(ex, &tile_rows, &src, &idx));
    }
    return H3_OK;
}

/* Clip pixel frame of canvas frame f. */
static int64_t vv_clip_frame(const vv_run *r, int64_t f) {
    const vv_plan *p = r->p;
    int64_t pt = r->c->patch_size_t;
    if (p->single) return pt - 1;
    if (f < p->main_frames) return p->pre + f;
    return (int64_t)p->cs * pt + p->pre + (f - p->main_frames);
}

/* y = a·wa + b·wb through two temporaries (a, b, y [rows, cols] views; wa, wb full-shape or one-row tables). */
static h3_status vv_mix(vv_run *r, h3_tensor *y, const h3_tensor *a, const h3_tensor *wa, const h3_tensor *b,
                        const h3_tensor *wb) {
    const vv_plan *p = r->p;
    int64_t rows = a->shape[0], cols = a->shape[1];
    h3_tensor t1 = vw(r->ar + p->o_t1, rows, cols, cols), t2 = vw(r->ar + p->o_t2, rows, cols, cols);
    H3_TRY(h3_op_binary(r->ex, &t1, a, wa, H3_BINARY_MUL));
    H3_TRY(h3_op_binary(r->ex, &t2, b, wb, H3_BINARY_MUL));
    return h3_op_binary(r->ex, y, &t1, &t2, H3_BINARY_ADD);
}

/* Blend weights for an extent e: b's weight k/e, a's 1 − k/e (k along the blended axis), in f32 as the reference
 * computes them. The tables are small host arrays built here. */
static void vv_weights(float *wa, float *wb, int64_t e, int64_t rows_of, int64_t width) {
    for (int64_t k = 0; k < e; k++) {
        float b = (float)k / (float)e, a = 1.0f - b;
        if (rows_of) {
            for (int64_t i = 0; i < width; i++) wa[k * width + i] = a, wb[k * width + i] = b;
        } else {
            wa[k] = a;
            wb[k] = b;
        }
    }
}

/* Places tile (a, b) of the current chunk into the canvas: the top rows blended with the raw bottom of the tile
 * above, then the left columns with the raw right edge of the tile to the left, the bottom and right overlaps cut
 * (they belong to the next tiles). Then keeps this tile's raw bottom and right edges for those. */
static h3_status vv_stitch(vv_run *r, int a, int b) {
    const vv_plan *p = r->p;
    const h3_video_vae_config *c = r->c;
    float *ar = r->ar;
    int64_t thp = p->thp, twp = p->twp, Fc = p->main_frames + p->ovl_frames, Tcp = (int64_t)p->clip_len * c->patch_size_t;
    int64_t kh = thp - (a + 1 < p->ny ? p->yo[a] : 0), kw = twp - (b + 1 < p->nx ? p->xo[b] : 0);
    int64_t ev = a > 0 ? (p->yo[a - 1] < thp ? p->yo[a - 1] : thp) : 0;
    int64_t eh = b > 0 ? (p->xo[b - 1] < twp ? p->xo[b - 1] : twp) : 0;
    int64_t evk = ev < kh ? ev : kh;
    int64_t sv = a + 1 < p->ny ? (p->yo[a] < thp ? p->yo[a] : thp) : 0;
    int64_t sh = b + 1 < p->nx ? (p->xo[b] < twp ? p->xo[b] : twp) : 0;
    int64_t y0 = p->ys[a], x0 = p->xs[b], Hp = p->Hp, Wp = p->Wp;
    if (ev && r->cur_ev != (float)ev) {
        vv_weights(ar + p->o_wav, ar + p->o_wbv, ev, 1, twp);
        r->cur_ev = (float)ev;
    }
    if (eh && r->cur_eh != (float)eh) {
        vv_weights(ar + p->o_wah, ar + p->o_wbh, eh, 0, 0);
        r->cur_eh = (float)eh;
    }
    h3_tensor wav = vw(ar + p->o_wav, ev, twp, twp), wbv = vw(ar + p->o_wbv, ev, twp, twp);
    int64_t e2 = eh < kw ? eh : kw; /* blended columns that are kept */
    h3_tensor wah, wbh;
    h3_tensor_wrap(&wah, ar + p->o_wah, H3_PLACE_HOST, H3_F32, 1, &e2);
    h3_tensor_wrap(&wbh, ar + p->o_wbh, H3_PLACE_HOST, H3_F32, 1, &e2);
    for (int64_t ch = 0; ch < c->out_channels; ch++) {
        for (int64_t f = 0; f < Fc; f++) {
            float *P = ar + p->o_tile + (ch * Tcp + vv_clip_frame(r, f)) * thp * twp;
            float *dst = ar + p->o_canvas + ((ch * Fc + f) * Hp + y0) * Wp + x0;
            float *U = ar + p->o_bstrip + (((int64_t)b * c->out_channels + ch) * Fc + f) * p->max_sv * twp;
            float *L = ar + p->o_rstrip + (ch * Fc + f) * thp * p->max_sh;
            float *vb = ar + p->o_vb;
            if (ev) {
                h3_tensor u = vw(U, ev, twp, twp), pt = vw(P, ev, twp, twp), y = vw(vb, ev, twp, twp);
                H3_TRY(vv_mix(r, &y, &u, &wav, &pt, &wbv));
            }
            if (kw > eh) {
                if (evk) {
                    h3_tensor s = vw(vb + eh, evk, kw - eh, twp), d = vw(dst + eh, evk, kw - eh, Wp);
                    H3_TRY(h3_op_convert(r->ex, &d, &s));
                }
                if (kh > evk) {
                    h3_tensor s = vw(P + evk * twp + eh, kh - evk, kw - eh, twp);
                    h3_tensor d = vw(dst + evk * Wp + eh, kh - evk, kw - eh, Wp);
                    H3_TRY(h3_op_convert(r->ex, &d, &s));
                }
            }
            if (e2 > 0) {
                if (evk) {
                    h3_tensor l = vw(L, evk, e2, p->max_sh), s = vw(vb, evk, e2, twp), d = vw(dst, evk, e2, Wp);
                    H3_TRY(vv_mix(r, &d, &l, &wah, &s, &wbh));
                }
                if (kh > evk) {
                    h3_tensor l = vw(L + evk * p->max_sh, kh - evk, e2, p->max_sh);
                    h3_tensor s = vw(P + evk * twp, kh - evk, e2, twp), d = vw(dst + evk * Wp, kh - evk, e2, Wp);
                    H3_TRY(vv_mix(r, &d, &l, &wah, &s, &wbh));
                }
            }
            if (sv) {
                h3_tensor s = vw(P + (thp - sv) * twp, sv, twp, twp), d = vw(U, sv, twp, twp);
                H3_TRY(h3_op_convert(r->ex, &d, &s));
            }
            if (sh) {
                h3_tensor s = vw(P + twp - sh, thp, sh, twp), d = vw(L, thp, sh, p->max_sh);
                H3_TRY(h3_op_convert(r->ex, &d, &s));
            }
        }
    }
    return H3_OK;
}

/* Hands frames [0, n) of a buffer laid out [oc, nf, Hp, Wp] to the caller as output frames first.. (cut at the
 * video's length), in the range asked for. */
static h3_status vv_deliver(vv_run *r, float *buf, int64_t nf, int64_t n, int64_t first) {
    const vv_plan *p = r->p;
    const h3_video_vae_config *c = r->c;
    if (first + n > p->frames) n = p->frames - first;
    if (n <= 0) return H3_OK;
    int64_t plane = p->Hp * p->Wp, oc = c->out_channels;
    for (int64_t ch = 0; ch < oc; ch++) {
        h3_tensor s = vw(buf + ch * nf * plane, n * p->Hp, p->Wp, p->Wp);
        if (r->out->range == H3_PIXELS_UNIT) {
            float m = ch < 3 ? h3_imagenet_mean[ch] : 0.0f, sd = ch < 3 ? h3_imagenet_std[ch] : 1.0f;
            H3_TRY(h3_op_scale(r->ex, &s, &s, sd, m));
            H3_TRY(h3_op_clamp(r->ex, &s, &s, 0.0f, 1.0f));
        }
        if (r->out->frames) {
            h3_tensor *o = r->out->frames;
            float *od = (float *)o->data + (ch * p->frames + first) * plane;
            h3_tensor d = vw(od, n * p->Hp, p->Wp, p->Wp);
            H3_TRY(h3_op_convert(r->ex, &d, &s));
        }
    }
    if (r->out->on_frames) {
        h3_tensor f;
        int64_t shape[4] = {oc, n, p->Hp, p->Wp};
        h3_tensor_wrap(&f, buf, H3_PLACE_HOST, H3_F32, 4, shape);
        f.stride[0] = nf * plane;
        H3_TRY_CTX(r->out->on_frames(r->out->user, &f, first), "handing out frames %lld..%lld", (long long)first,
                   (long long)(first + n - 1));
    }
    r->delivered = first + n;
    return H3_OK;
}

/* Cross-fade: canvas frames [0, e) become prev·(1 − k/e) + canvas·(k/e), prev the last e frames of the previous
 * chunk's look-ahead. */
static h3_status vv_crossfade(vv_run *r) {
    const vv_plan *p = r->p;
    int64_t Fc = p->main_frames + p->ovl_frames, plane = p->Hp * p->Wp;
    int64_t e = p->ovl_frames < p->main_frames ? p->ovl_frames : p->main_frames;
    if (p->fov < e) e = p->fov;
    for (int64_t ch = 0; ch < r->c->out_channels; ch++)
        for (int64_t k = 0; k < e; k++) {
            float wb = (float)k / (float)e, wa = 1.0f - wb;
            float *cur = r->ar + p->o_canvas + (ch * Fc + k) * plane;
            float *prv = r->ar + p->o_prev + (ch * p->ovl_frames + p->ovl_frames - e + k) * plane;
            h3_tensor a = vw(prv, p->Hp, p->Wp, p->Wp), b = vw(cur, p->Hp, p->Wp, p->Wp);
            H3_TRY(h3_op_scale(r->ex, &a, &a, wa, 0.0f));
            H3_TRY(h3_op_scale(r->ex, &b, &b, wb, 0.0f));
            H3_TRY(h3_op_binary(r->ex, &b, &b, &a, H3_BINARY_ADD));
        }
    return H3_OK;
}

h3_status h3_video_vae_decode(h3_video_vae *v, h3_exec *ex, const h3_tensor *latents, const h3_video_decode_out *out) {
    const h3_video_vae_config *c = &v->cfg;
    H3_TRY(h3_video_vae_check_latents(c, latents));
    if (!out || (!out->on_frames && !out->frames))
        return H3_ERR(H3_ERR_INVALID, "video decode: give a frame callback or an output tensor");
    int off = latents->ndim == 5;
    int64_t T = latents->shape[off + 1], H = latents->shape[off + 2], W = latents->shape[off + 3];
    vv_plan *p = h3_malloc(sizeof *p, H3_MEM_OTHER);
    if (!p) return H3_ERR_NOMEM;
    h3_status st = H3_OK;
    vv_run r;
    memset(&r, 0, sizeof r);
    H3_CHECK(vv_make_plan(c, T, H, W, v->rows_per_step, p));
    if (out->frames) {
        h3_tensor *o = out->frames;
        int oo = o->ndim == 5;
        char s[96];
        if (!((o->ndim == 4 || (oo && o->shape[0] == 1)) && o->dtype == H3_F32 && h3_tensor_is_contiguous(o) &&
              o->shape[oo] == c->out_channels && o->shape[oo + 1] == p->frames && o->shape[oo + 2] == p->Hp &&
              o->shape[oo + 3] == p->Wp && o->place != H3_PLACE_DEVICE))
            H3_FAIL(H3_ERR_INVALID, "video decode: the output must be contiguous f32 [%d, %lld, %lld, %lld], got %s",
                    c->out_channels, (long long)p->frames, (long long)p->Hp, (long long)p->Wp,
                    h3_tensor_shape_str(o, s, sizeof s));
    }
    r.v = v;
    r.ex = ex;
    r.c = c;
    r.p = p;
    r.out = out;
    r.cur_ev = r.cur_eh = -1.0f;
    int64_t numel = h3_tensor_numel(latents);
    int64_t ls[2] = {numel, 1};
    h3_tensor_wrap(&r.lat_rows, latents->data, H3_PLACE_HOST, H3_F32, 2, ls);
    r.ar = h3_malloc((size_t)p->total * sizeof(float), H3_MEM_ACTIVATIONS);
    if (!r.ar) H3_FAIL(H3_ERR_NOMEM, "out of memory for the video decode's %lld MB of buffers",
                       (long long)(p->total * 4 >> 20));
    vv_rope_tables(&r);
    H3_CHECK(vv_acquire(v, VV_IO, &r.io));
    int64_t first = 0;
    for (int i = 0; i < p->chunks; i++) {
        for (int a = 0; a < p->ny; a++)
            for (int b = 0; b < p->nx; b++) {
                H3_CHECK_CTX(vv_tile(&r, (int64_t)i * p->cs, p->ys[a] / c->patch_size, p->xs[b] / c->patch_size),
                             "decoding chunk %d of %d, tile %d of %d", i + 1, p->chunks, a * p->nx + b + 1,
                             p->ny * p->nx);
                H3_CHECK(vv_stitch(&r, a, b));
            }
        if (i > 0 && p->ovl_frames) H3_CHECK(vv_crossfade(&r));
        int64_t Fc = p->main_frames + p->ovl_frames, plane = p->Hp * p->Wp;
        if (p->ovl_frames) /* keep the raw look-ahead before the delivered frames are converted */
            for (int64_t ch = 0; ch < c->out_channels; ch++) {
                h3_tensor s = vw(r.ar + p->o_canvas + (ch * Fc + p->main_frames) * plane, p->ovl_frames * p->Hp, p->Wp,
                                 p->Wp);
                h3_tensor d = vw(r.ar + p->o_prev + ch * p->ovl_frames * plane, p->ovl_frames * p->Hp, p->Wp, p->Wp);
                H3_CHECK(h3_op_convert(ex, &d, &s));
            }
        H3_CHECK(vv_deliver(&r, r.ar + p->o_canvas, Fc, p->main_frames, first));
        first += p->main_frames;
    }
    if (p->ovl_frames) H3_CHECK(vv_deliver(&r, r.ar + p->o_prev, p->ovl_frames, p->ovl_frames, first));
    if (r.delivered != p->frames)
        H3_FAIL(H3_ERR_INTERNAL, "video decode delivered %lld frames of %lld", (long long)r.delivered,
                (long long)p->frames);
done:
    vv_release(&r.io);
    h3_free(r.ar);
    h3_free(p);
    return st;
}

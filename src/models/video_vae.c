/* The MiniMax-H3 video VAE decoder: configuration and weights of the three layouts, the chunk and tile plan,
 * where the weights are placed (the host's file, or packed at a place: resident or streamed), the ViT decoder
 * over a pass of tiles, and the stitching that turns tiles into frames. See video_vae.h. */
#include "models/video_vae.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "io/wbind.h"
#include "mem/budget.h"
#include "mem/pack.h"
#include "mem/report.h"
#include "mem/streamer.h"
#include "mem/units.h"
#include "models/model_cfg.h"
#include "tensor/comm.h"

/* video_vae/config.json of the release, as ComfyUI builds it in for its single-file repack. */
static const float k_latents_mean[24] = {
    0.858090341091156f,    -0.9606591463088989f, 1.0661640167236328f,   -0.5090325474739075f,
    -0.2727581858634949f,  -1.3675414323806763f, -0.2553254961967468f,  -0.26907554268836975f,
    -0.5376840829849243f,  -0.0464097298681736f, 0.6657370328903198f,   0.19690127670764923f,
    -0.5460608005523682f,  -0.4035342037677765f, -0.23683024942874908f, 0.25928452610969543f,
    -0.30133944749832153f, 0.211341992020607f,   -1.1206848621368408f,  0.3581933379173279f,
    -0.04225143790245056f, 0.2604829967021942f,  0.22864092886447906f,  0.7056031823158264f,
};
static const float k_latents_std[24] = {
    1.2223774194717407f, 1.2767263650894165f,  1.68317747116088865f, 1.7549455165863037f,
    1.5636216402053833f, 2.194143533706665f,   0.96531379222869875f, 1.05698859691619875f,
    0.841948926448822f,  0.7729952931404114f,  1.8955937623977661f,  0.946841835975647f,
    0.7996809482574463f, 0.44988900423049925f, 0.7197399735450745f,  0.69362932443618775f,
    2.961095094680786f,  2.7694199085235595f,  3.0496184825897215f,  2.1088054180145265f,
    3.276226282119751f,  3.1627357006073f,     2.28168129920959475f, 2.6127843856811525f,
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
    static const int sd[6] = {2, 2, 2, 2, 1, 1}, td[6] = {1, 2, 2, 1, 1, 1};
    c->enc_levels = 6;
    memcpy(c->space_down, sd, sizeof sd);
    memcpy(c->time_down, td, sizeof td);
    c->enc_groups = 32;
    c->enc_eps = 1e-6f;
}

/* ---- weights: names per layout, one acquire/release path
 * ----------------------------------------------------- */

enum {
    /* the input and output layers (part VV_IO) */
    W_PQ_W,
    W_PQ_B,
    W_IN_W,
    W_IN_B,
    W_REG,
    W_LN_W,
    W_LN_B,
    W_OUT_W,
    W_OUT_B,
    /* one transformer block (parts 0 .. num_layers-1) */
    W_N1,
    W_N2,
    W_S1,
    W_S2,
    W_QKV_W,
    W_QKV_B,
    W_Q_W,
    W_K_W,
    W_V_W,
    W_Q_B,
    W_K_B,
    W_V_B,
    W_O_W,
    W_O_B,
    W_W1,
    W_B1,
    W_W2,
    W_B2,
    W_COUNT
};
#define VV_IO (-1)

/* Name of weight `id` of part `part` in a layout; NULL when the layout has no such tensor. */
static const char *vv_name(h3_layout lay, int part, int id, char *buf, size_t n) {
    int dif = lay == H3_LAYOUT_DIFFUSERS;
    const char *s = NULL;
    switch (id) {
        case W_PQ_W:
            s = "post_quant_conv.weight";
            break;
        case W_PQ_B:
            s = "post_quant_conv.bias";
            break;
        case W_IN_W:
            s = dif ? "decoder.proj_in.weight" : "decoder.x_embedder.weight";
            break;
        case W_IN_B:
            s = dif ? "decoder.proj_in.bias" : "decoder.x_embedder.bias";
            break;
        case W_REG:
            s = "decoder.register_tokens";
            break;
        case W_LN_W:
            s = "decoder.norm_out.weight";
            break;
        case W_LN_B:
            s = "decoder.norm_out.bias";
            break;
        case W_OUT_W:
            s = "decoder.proj_out.weight";
            break;
        case W_OUT_B:
            s = "decoder.proj_out.bias";
            break;
        case W_N1:
            s = "norm1.weight";
            break;
        case W_N2:
            s = "norm2.weight";
            break;
        case W_S1:
            s = "scale1";
            break;
        case W_S2:
            s = "scale2";
            break;
        case W_QKV_W:
            s = dif ? NULL : "attn.to_qkv.weight";
            break;
        case W_QKV_B:
            s = dif ? NULL : "attn.to_qkv.bias";
            break;
        case W_Q_W:
            s = dif ? "attn.to_q.weight" : NULL;
            break;
        case W_Q_B:
            s = dif ? "attn.to_q.bias" : NULL;
            break;
        case W_K_W:
            s = dif ? "attn.to_k.weight" : NULL;
            break;
        case W_K_B:
            s = dif ? "attn.to_k.bias" : NULL;
            break;
        case W_V_W:
            s = dif ? "attn.to_v.weight" : NULL;
            break;
        case W_V_B:
            s = dif ? "attn.to_v.bias" : NULL;
            break;
        case W_O_W:
            s = dif ? "attn.to_out.0.weight" : "attn.to_out.weight";
            break;
        case W_O_B:
            s = dif ? "attn.to_out.0.bias" : "attn.to_out.bias";
            break;
        case W_W1:
            s = dif ? "ff.net.0.proj.weight" : "ff.w1.weight";
            break;
        case W_B1:
            s = dif ? "ff.net.0.proj.bias" : "ff.w1.bias";
            break;
        case W_W2:
            s = dif ? "ff.net.2.weight" : "ff.w2.weight";
            break;
        case W_B2:
            s = dif ? "ff.net.2.bias" : "ff.w2.bias";
            break;
        default:
            break;
    }
    if (!s) return NULL;
    if (part == VV_IO)
        snprintf(buf, n, "%s", s);
    else
        snprintf(buf, n, "decoder.transformer_blocks.%d.%s", part, s);
    return buf;
}

/* Expected shape of weight `id` under config c (dims into s, returns ndim). */
static int vv_shape(const h3_video_vae_config *c, int id, int64_t *s) {
    int64_t C = c->latent_channels, dim = (int64_t)c->heads * c->head_dim, HD = dim, I = c->ffn_inner;
    int64_t P = (int64_t)c->out_channels * c->patch_size_t * c->patch_size * c->patch_size;
    switch (id) {
        case W_PQ_W:
            s[0] = C, s[1] = C, s[2] = s[3] = s[4] = 1;
            return 5;
        case W_PQ_B:
            s[0] = C;
            return 1;
        case W_IN_W:
            s[0] = dim, s[1] = C;
            return 2;
        case W_REG:
            s[0] = 1, s[1] = c->num_register_tokens, s[2] = dim;
            return 3;
        case W_OUT_W:
            s[0] = P, s[1] = dim;
            return 2;
        case W_OUT_B:
            s[0] = P;
            return 1;
        case W_QKV_W:
            s[0] = 3 * HD, s[1] = dim;
            return 2;
        case W_QKV_B:
            s[0] = 3 * HD;
            return 1;
        case W_Q_W:
        case W_K_W:
        case W_V_W:
            s[0] = HD, s[1] = dim;
            return 2;
        case W_O_W:
            s[0] = dim, s[1] = HD;
            return 2;
        case W_W1:
            s[0] = 2 * I, s[1] = dim;
            return 2;
        case W_B1:
            s[0] = 2 * I;
            return 1;
        case W_W2:
            s[0] = dim, s[1] = I;
            return 2;
        default:
            s[0] = dim;
            return 1; /* biases and vectors of width hidden */
    }
}

typedef struct vv_placed vv_placed;

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
    int created;      /* h3_video_vae_create: no files; weights only through a random placement */
    h3_tensor *bound; /* [(num_layers + 1) × W_COUNT]: the weights bound at open (views of the mapped file),
                       * shaped for the ops; part l at l × W_COUNT, the input and output layers last */
    h3_units *host;   /* the weights as opened, for decodes on the host from the file */
    vv_placed *pl;    /* h3_video_vae_place: where decodes run and how; NULL: the host, from the file */
    int ids[2][W_COUNT],
        n_ids[2]; /* the weights of the input and output layers, and of a block (pack order) */
};

/* How a part's QKV projection comes: one matrix with per-head [q k v] rows (official and ComfyUI files), one
 * matrix [Q; K; V] (placed weights), or three matrices (diffusers files, placed or not). */
enum { VV_QKV_INTERLEAVED = 0, VV_QKV_ORDERED, VV_QKV_SPLIT };

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

/* A part's weights as the decode uses them (views handed out by the units). */
typedef struct {
    h3_tensor t[W_COUNT];
    int qkv_form;
} vv_part;

static int vv_part_first(int part) {
    return part == VV_IO ? W_PQ_W : W_N1;
}
static int vv_part_end(int part) {
    return part == VV_IO ? W_N1 : W_COUNT;
}

/* The unit of a part: ViT block l is unit l, the input and output layers unit num_layers. */
static int vv_unit(const h3_video_vae *v, int part) {
    return part == VV_IO ? v->cfg.num_layers : part;
}

/* The weights a part has in this decoder's layout, in pack order (the units hand them out in this order). */
static int vv_part_ids(const h3_video_vae *v, int part, int *ids) {
    const int k = part == VV_IO ? 0 : 1;
    memcpy(ids, v->ids[k], (size_t)v->n_ids[k] * sizeof *ids);
    return v->n_ids[k];
}

/* Fills the cache vv_part_ids reads, once the layout is known. */
static void vv_find_ids(h3_video_vae *v) {
    char buf[160];
    for (int k = 0; k < 2; k++) {
        const int part = k == 0 ? VV_IO : 0;
        v->n_ids[k] = 0;
        for (int id = vv_part_first(part); id < vv_part_end(part); id++)
            if (vv_name(v->layout, part, id, buf, sizeof buf)) v->ids[k][v->n_ids[k]++] = id;
    }
}

/* The shape a weight takes in the decode: the table's, with the post-quant conv as a matrix [C, C] and the
 * register tokens as rows [registers, hidden]. */
static int vv_op_shape(const h3_video_vae_config *c, int id, int64_t *s) {
    const int nd = vv_shape(c, id, s);
    if (id == W_PQ_W) return s[1] = c->latent_channels, 2;
    if (id == W_REG) return s[0] = c->num_register_tokens, s[1] = (int64_t)c->heads * c->head_dim, 2;
    return nd;
}

/* The dtype a weight is placed in when the weights are packed (a device takes GEMM matrices and their biases
 * as wdt; the norm weights, residual scales, register tokens and the input projections stay f32, as the
 * reference's decode recipe keeps them), or (packed 0) on the host from the file: as stored, but the residual
 * scales in f32 (the gated-add op takes f32 gates). */
static h3_dtype vv_placed_dtype(int id, h3_dtype stored, int packed, h3_dtype wdt) {
    if (!packed) return id == W_S1 || id == W_S2 ? H3_F32 : stored;
    switch (id) {
        case W_OUT_W:
        case W_OUT_B:
        case W_QKV_W:
        case W_QKV_B:
        case W_Q_W:
        case W_Q_B:
        case W_K_W:
        case W_K_B:
        case W_V_W:
        case W_V_B:
        case W_O_W:
        case W_O_B:
        case W_W1:
        case W_B1:
        case W_W2:
        case W_B2:
            return wdt;
        default:
            return H3_F32;
    }
}

/* Part `part`'s pack over its tensors t[W_COUNT] (the file's, or descriptors), as the decode takes them:
 * packed (the official per-head QKV rows reordered to [Q; K; V] on the way when interleave) or as opened. */
static void vv_pack_part(const h3_video_vae *v, int part, const h3_tensor *t, int packed, h3_dtype wdt,
                         int interleave, h3_pack *p) {
    memset(p, 0, sizeof *p);
    int ids[W_COUNT];
    const int n = vv_part_ids(v, part, ids);
    for (int k = 0; k < n; k++) {
        const int id = ids[k];
        h3_pack_add_as(p, &t[id], interleave && (id == W_QKV_W || id == W_QKV_B),
                       vv_placed_dtype(id, t[id].dtype, packed, wdt));
        if (packed && (id == W_K_W || id == W_V_W || id == W_K_B || id == W_V_B))
            h3_pack_join(p); /* diffusers' projections placed as one [Q; K; V] */
    }
}

static h3_tensor *vv_bound(const h3_video_vae *v, int part) {
    return v->bound + (int64_t)vv_unit(v, part) * W_COUNT;
}

/* Binds every weight (views of the mapped file; nothing is read) and opens the units a host decode reaches
 * them through. */
static h3_status vv_bind(h3_video_vae *v) {
    const int L = v->cfg.num_layers;
    vv_find_ids(v);
    v->bound = h3_calloc((size_t)(L + 1) * W_COUNT, sizeof *v->bound, H3_MEM_OTHER);
    h3_pack *packs = h3_calloc((size_t)(L + 1), sizeof *packs, H3_MEM_OTHER);
    h3_status st = H3_OK;
    if (!v->bound || !packs) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int part = VV_IO; part < L; part++) {
        h3_tensor *t = vv_bound(v, part);
        char name[160];
        for (int id = vv_part_first(part); id < vv_part_end(part); id++) {
            h3_wb_row row;
            if (!vv_row(v, part, id, name, sizeof name, &t[id], &row)) continue;
            H3_CHECK(h3_wb_bind(&v->wb, &row));
            int64_t s[H3_MAX_DIMS];
            const int nd = vv_op_shape(&v->cfg, id, s);
            if (nd != t[id].ndim) { /* a view reshaped: the owner (an aligned copy) stays with it */
                h3_tensor a = t[id];
                H3_CHECK(h3_tensor_reshape(&a, nd, s, &t[id]));
                t[id].owner = a.owner;
                t[id].owned_bytes = a.owned_bytes;
                t[id].cat = a.cat;
            }
        }
        vv_pack_part(v, part, t, 0, H3_F32, 0, &packs[vv_unit(v, part)]);
    }
    {
        const h3_units_config uc = {H3_PLACE_HOST,
                                    NULL,
                                    0,
                                    0,
                                    &v->st,
                                    v->cfg.heads,
                                    v->cfg.head_dim,
                                    NULL,
                                    NULL,
                                    "the video VAE's weights",
                                    0, NULL};
        H3_CHECK(h3_units_open(NULL, &uc, packs, L + 1, &v->host));
    }
done:
    h3_free(packs);
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

/* ---- configuration files
 * ------------------------------------------------------------------------------------ */

static h3_status cfg_num(const json_t *o, const char *key, double lo, double hi, float *out,
                         const char *what) {
    json_t *j = o ? json_object_get(o, key) : NULL;
    if (!j) return H3_OK;
    double d = json_is_number(j) ? json_number_value(j) : NAN;
    if (!(d >= lo && d <= hi))
        return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be a number in [%g, %g]", what, key, lo, hi);
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

/* An integer list of down factors (the encoder's per-level space_down / time_down), if present: its entries
 * into out, their count into *n (both lists must agree on the count: vv_finish_config checks). */
static h3_status cfg_list(const json_t *o, const char *key, int *out, int *n, const char *what) {
    json_t *j = o ? json_object_get(o, key) : NULL;
    if (!j) return H3_OK;
    if (!json_is_array(j) || json_array_size(j) == 0 || json_array_size(j) > H3_VVAE_MAX_LEVELS)
        return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be a list of 1 to %d factors", what, key,
                      H3_VVAE_MAX_LEVELS);
    for (size_t i = 0; i < json_array_size(j); i++) {
        json_t *e = json_array_get(j, i);
        double d = json_is_number(e) ? json_number_value(e) : NAN;
        if (d != 1 && d != 2)
            return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must hold factors of 1 or 2 (entry %zu is not)", what,
                          key, i);
        out[i] = (int)d;
    }
    *n = (int)json_array_size(j);
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
    int ns = c->enc_levels, nt = c->enc_levels;
    H3_TRY(cfg_list(j, "space_down", c->space_down, &ns, what));
    H3_TRY(cfg_list(j, "time_down", c->time_down, &nt, what));
    if (ns != nt)
        return H3_ERR(H3_ERR_FORMAT, "%s: \"space_down\" has %d levels, \"time_down\" %d", what, ns, nt);
    c->enc_levels = ns;
    H3_TRY(h3_cfg_int(j, "vae_ratio", 1, 1024, &c->patch_size, what));
    H3_TRY(h3_cfg_int(j, "vae_ratio_t", 1, 1024, &c->patch_size_t, what));
    json_t *vit = json_object_get(j, "vit_decoder_kwargs");
    if (!vit || !json_is_object(vit))
        return H3_ERR(H3_ERR_FORMAT, "%s: \"vit_decoder_kwargs\" is missing: not a ViT-decoder video VAE",
                      what);
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
    int ns = c->enc_levels, nt = c->enc_levels;
    H3_TRY(cfg_list(j, "spatial_downsample_factors", c->space_down, &ns, what));
    H3_TRY(cfg_list(j, "temporal_downsample_factors", c->time_down, &nt, what));
    if (ns != nt)
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: \"spatial_downsample_factors\" has %d levels, \"temporal_downsample_factors\" %d",
                      what, ns, nt);
    c->enc_levels = ns;
    H3_TRY(h3_cfg_int(j, "norm_num_groups", 1, 4096, &c->enc_groups, what));
    H3_TRY(cfg_num(j, "norm_eps", 0.0, 1.0, &c->enc_eps, what));
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

/* ---- opening
 * ------------------------------------------------------------------------------------------------ */

/* The latent channels of a well-formed post_quant_conv ([C, C, 1, 1, 1]); a malformed one leaves the default,
 * and vv_finish_config names it. */
static void vv_channels_of(h3_video_vae *v) {
    const h3_st_entry *e = h3_st_find(&v->st, "post_quant_conv.weight");
    if (e && e->ndim == 5 && e->shape[0] == e->shape[1] && e->shape[2] == 1 && e->shape[3] == 1 &&
        e->shape[4] == 1 && e->shape[0] >= 1 && e->shape[0] <= H3_VVAE_MAX_CHANNELS)
        v->cfg.latent_channels = (int)e->shape[0];
}

/* Reads the configs of `path` and opens its weights; fills v->layout, v->cfg (config part), v->st. ratio
 * receives rope_dim_ratio. Recurses once into video_vae/ or vae/ of a model root. */
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
            H3_CHECK_CTX(h3_json_parse(meta, strlen(meta), "metadata \"minimax_h3_video_vae\"", &wrap), "%s",
                         path);
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
        if (json_object_get(wrap, "decoder_num_layers") ||
            json_object_get(wrap, "decoder_attention_head_dim")) {
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
            "%s: no video VAE here (expected the official video_vae/ folder, a diffusers vae/ folder, a "
            "model folder "
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
        snprintf(what, sizeof what, "%s%s", path,
                 v->layout == H3_LAYOUT_OFFICIAL ? "/config.json" : " metadata");
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
    if (C !=
        c->latent_channels) /* only a file without a config gets here: the built-in mean/std are for 24 */
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
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: the config says %d ViT blocks, the weights hold %d (an incomplete file?)",
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
        return H3_ERR(H3_ERR_INVALID, "the config of %s sets %d heads; --heads %d contradicts it", v->source,
                      c->heads, o->heads);
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
        return H3_ERR(H3_ERR_UNSUPPORTED,
                      "%s: %d rotary channels per head (of %d) are not a multiple of 6 (3 axes × "
                      "cos/sin halves)",
                      v->source, c->rope_dim, c->head_dim);
    if (c->patch_size < 1 || c->patch_size_t < 1 || c->clip_length < 1)
        return H3_ERR(H3_ERR_FORMAT, "%s: patch sizes and the clip length must be positive", v->source);
    if (o->tile_size > 0) c->tile_size = o->tile_size;
    if (o->tile_overlap_min > 0) c->tile_overlap_min = o->tile_overlap_min;
    if (o->no_tiling) c->tile_size = 0;
    if (c->tile_size) {
        if (c->tile_size % c->patch_size || c->tile_overlap_min % c->patch_size ||
            c->tile_overlap_min >= c->tile_size)
            return H3_ERR(H3_ERR_INVALID,
                          "tiles of %d px with at least %d px of overlap: both must be multiples of the "
                          "%d px latent size, the overlap smaller than the tile",
                          c->tile_size, c->tile_overlap_min, c->patch_size);
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
                st = H3_ERR(H3_ERR_UNSUPPORTED,
                            "%s: quantized video VAE weights ('%s') are not supported; use the "
                            "fp16 or fp32 file",
                            v->source, n);
                break;
            }
        }
    }
    if (st == H3_OK) st = vv_finish_config(v, o, ratio);
    if (st == H3_OK) st = vv_bind(v);
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
    h3_video_vae_unplace(v);
    h3_units_close(v->host);
    for (int64_t i = 0; v->bound && i < (int64_t)(v->cfg.num_layers + 1) * W_COUNT; i++)
        h3_tensor_free(&v->bound[i]);
    h3_free(v->bound);
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
const h3_wbind *h3_video_vae_binder(const h3_video_vae *v) {
    return v->created ? NULL : &v->wb;
}

/* ---- the chunk and tile plan --------------------------------------------------------------------------- */

#define VV_MAX_EXTENTS                                                                                       \
    8 /* distinct blend extents per axis (the round-robin overlaps take at most two values) */

typedef struct {
    int64_t T, H, W, Hp, Wp;
    int single; /* one latent frame: decode it alone, keep its last pixel frame */
    int cs, pre, tov, fov, pad, chunks, clip_len;
    int main_frames,
        ovl_frames; /* canvas frames kept from each chunk: delivered, and cross-faded into the next */
    int64_t frames; /* output frames */
    int ny, nx;
    int64_t ys[H3_VVAE_MAX_TILES], yo[H3_VVAE_MAX_TILES], xs[H3_VVAE_MAX_TILES], xo[H3_VVAE_MAX_TILES];
    int64_t th, tw, thp, twp; /* tile size in latents and pixels */
    int64_t max_sv, max_sh;   /* rows / columns of the raw strips kept for blending */
    int64_t N, S;             /* tokens of a tile; with the registers and the zero token */
    int nt, nb;               /* tiles of a chunk; tiles per pass */
    int64_t rows, rc;         /* rows of a full pass (nb·S); rows per FFN and output-projection step */
    int64_t Pl;               /* pixel planes of a chunk's canvas: out_channels × canvas frames */
    int64_t PR;               /* rows of patch_size pixels the output projection makes per token */
    int64_t trash;            /* those rows that fall on dropped clip frames (each gets a row of its own) */
    int n_ev, n_eh;
    int64_t ev[VV_MAX_EXTENTS], eh[VV_MAX_EXTENTS]; /* distinct vertical and horizontal blend extents */
    h3_dtype ad; /* GEMM operands: f32 on the host, bf16 at a device placement */
    int il;      /* per-head interleaved QKV weights: a scratch for that GEMM's output */
    /* arena layout: byte offsets from its start. The tables come first (one upload from the host). */
    int64_t o_mean, o_std, o_ones, o_cos, o_sin, o_xidx, o_pidx, o_cidx, o_vidx, o_vw, o_hw, tables_end;
    int64_t o_extra, o_z, o_pq, o_x, o_a, o_b, o_qkv, o_il, o_u, o_g;
    int64_t o_tile, o_ustrip, o_rstrip, o_vb, o_canvas, o_prev, total;
    int64_t chunk_bytes, vit_bytes;
} vv_plan;

/* Tiles of `tile` px over `len` px: the fewest whose overlaps are all >= min_ov, the slack then spread over
 * the overlaps round-robin in whole latents (diffusers' _split_tiles). */
h3_status h3_video_vae_split_tiles(int64_t len, int64_t tile, int64_t min_ov, int64_t ratio, int *n_out,
                                   int64_t *starts, int64_t *ov, int64_t *tlen) {
    if (tile <= 0 || tile >= len) {
        *n_out = 1;
        starts[0] = 0;
        *tlen = len;
        return H3_OK;
    }
    int64_t n = (len + tile - 1) / tile;
    while (tile * n - min_ov * (n - 1) < len) n++;
    if (n > H3_VVAE_MAX_TILES)
        return H3_ERR(H3_ERR_INVALID, "%lld px need %lld tiles of %lld px; h3run allows %d per axis",
                      (long long)len, (long long)n, (long long)tile, H3_VVAE_MAX_TILES);
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

/* Clip pixel frame of canvas frame f. */
static int64_t vv_clip_frame(const vv_plan *p, int64_t pt, int64_t f) {
    if (p->single) return pt - 1;
    if (f < p->main_frames) return p->pre + f;
    return (int64_t)p->cs * pt + p->pre + (f - p->main_frames);
}

/* Adds e to the distinct extents ext[0..*n) (at most VV_MAX_EXTENTS). */
static h3_status vv_extent(int64_t *ext, int *n, int64_t e) {
    for (int i = 0; i < *n; i++)
        if (ext[i] == e) return H3_OK;
    if (*n == VV_MAX_EXTENTS)
        return H3_ERR(H3_ERR_UNSUPPORTED, "more than %d distinct tile overlaps along an axis",
                      VV_MAX_EXTENTS);
    ext[(*n)++] = e;
    return H3_OK;
}

static int vv_extent_index(const int64_t *ext, int n, int64_t e) {
    for (int i = 0; i < n; i++)
        if (ext[i] == e) return i;
    return 0;
}

#define VV_MAX_CLIP_FRAMES 4096 /* pixel frames a chunk's clip decodes */
#define VV_ALIGN           256  /* arena offsets: the device's 16-byte loads and cuBLASLt's best alignment */
static int64_t vv_al(int64_t bytes) {
    return (bytes + VV_ALIGN - 1) / VV_ALIGN * VV_ALIGN;
}

/* Pinned host bytes a device decode hands its frames out through: a chunk's delivered frames [oc, n, Hp, Wp]
 * (the most a chunk delivers for any length: a 1-frame video delivers one). Held by the placement. */
static int64_t vv_frames_stage_bytes(const h3_video_vae_config *c, int64_t H, int64_t W) {
    vv_plan *t = h3_calloc(1, sizeof *t, H3_MEM_OTHER);
    if (!t) return 0;
    vv_temporal(c, 7, t);
    int64_t nf = t->main_frames > t->ovl_frames ? t->main_frames : t->ovl_frames;
    h3_free(t);
    return (int64_t)c->out_channels * (nf > 1 ? nf : 1) * H * c->patch_size * W * c->patch_size * 4;
}

/* The whole plan of a decode of latents [C, T, H, W]: chunks, tiles, nb tiles per pass, rc rows per FFN step,
 * GEMM operands of dtype ad, and the arena every buffer is carved from (the decoder allocates exactly `total`
 * bytes; nothing else during the decode but the host staging it names in the memory function). */
static h3_status vv_make_plan(const h3_video_vae_config *c, int64_t T, int64_t H, int64_t W, int nb,
                              int64_t rc, h3_dtype ad, int il, vv_plan *p) {
    memset(p, 0, sizeof *p);
    int64_t ps = c->patch_size, pt = c->patch_size_t;
    p->T = T;
    p->H = H;
    p->W = W;
    p->Hp = H * ps;
    p->Wp = W * ps;
    if (c->tile_size && (c->tile_size % ps || c->tile_overlap_min % ps ||
                         c->tile_overlap_min >= c->tile_size || c->tile_overlap_min < 0))
        return H3_ERR(H3_ERR_INVALID, "tiles of %d px with %d px of overlap do not fit %lld px latents",
                      c->tile_size, c->tile_overlap_min, (long long)ps);
    if (ps < 1 || pt < 1 || c->clip_length < 1 || c->token_drop < 0 || c->latent_channels < 1 ||
        c->latent_channels > H3_VVAE_MAX_CHANNELS || c->rope_dim % 6 || c->heads < 1 || c->head_dim < 1 ||
        c->out_channels < 1)
        return H3_ERR(H3_ERR_INVALID, "video VAE config is inconsistent");
    vv_temporal(c, T, p);
    if (p->frames < 1) return H3_ERR(H3_ERR_INVALID, "%lld latent frames decode to no frames", (long long)T);
    int64_t tlen;
    H3_TRY(
        h3_video_vae_split_tiles(p->Hp, c->tile_size, c->tile_overlap_min, ps, &p->ny, p->ys, p->yo, &tlen));
    p->thp = tlen;
    H3_TRY(
        h3_video_vae_split_tiles(p->Wp, c->tile_size, c->tile_overlap_min, ps, &p->nx, p->xs, p->xo, &tlen));
    p->twp = tlen;
    p->th = p->thp / ps;
    p->tw = p->twp / ps;
    for (int i = 0; i + 1 < p->ny; i++) {
        int64_t e = p->yo[i] < p->thp ? p->yo[i] : p->thp;
        if (e > p->max_sv) p->max_sv = e;
        H3_TRY(vv_extent(p->ev, &p->n_ev, e));
    }
    for (int i = 0; i + 1 < p->nx; i++) {
        int64_t e = p->xo[i] < p->twp ? p->xo[i] : p->twp;
        if (e > p->max_sh) p->max_sh = e;
        H3_TRY(vv_extent(p->eh, &p->n_eh, e));
    }
    int64_t oc = c->out_channels, Fc = p->main_frames + p->ovl_frames, Tc = p->clip_len, Tcp = Tc * pt;
    int64_t C = c->latent_channels, dim = (int64_t)c->heads * c->head_dim, I = c->ffn_inner, D = c->head_dim;
    int64_t R = c->rope_dim, Rg = c->num_register_tokens, P = oc * pt * ps * ps;
    p->N = Tc * p->th * p->tw;
    p->S = p->N + Rg + 1;
    p->nt = p->ny * p->nx;
    p->nb = nb < 1 ? 1 : nb > p->nt ? p->nt : nb;
    p->rows = p->nb * p->S;
    p->rc = rc < 1 ? 1 : rc > p->rows ? p->rows : rc;
    p->Pl = oc * Fc;
    p->PR = P / ps;
    p->trash = p->th * p->tw * ps * oc * (Tcp - Fc);
    if (Tcp > VV_MAX_CLIP_FRAMES)
        return H3_ERR(H3_ERR_UNSUPPORTED, "a clip of %lld pixel frames; h3run decodes at most %d per chunk",
                      (long long)Tcp, VV_MAX_CLIP_FRAMES);
    p->ad = ad;
    p->il = il;
    if (T * H * W * C > INT32_MAX || (p->thp * p->Pl * p->tw + p->trash) > INT32_MAX ||
        p->Pl * p->Hp > INT32_MAX || p->rows > INT32_MAX || p->N * p->PR > INT32_MAX)
        return H3_ERR(H3_ERR_INVALID, "latents [%lld, %lld, %lld, %lld] are too large for one decode",
                      (long long)C, (long long)T, (long long)H, (long long)W);
    const int64_t es = (int64_t)h3_dtype_size(ad), f4 = 4, rows = p->rows, rcs = p->rc;
    int64_t o = 0, vit = 0, chunk = 0;
#define TAKE(field, bytes, group) (p->field = o, o += vv_al(bytes), group += vv_al(bytes))
    TAKE(o_mean, C * f4, vit);
    TAKE(o_std, C * f4, vit);
    TAKE(o_ones, D * f4, vit);
    TAKE(o_cos, rows * R * f4, vit);
    TAKE(o_sin, rows * R * f4, vit);
    TAKE(o_xidx, (int64_t)p->nb * (Rg + 1) * 4, vit);
    TAKE(o_pidx, p->N * p->PR * 4, vit);
    TAKE(o_cidx, (int64_t)p->ny * p->thp * p->Pl * 4, chunk);
    TAKE(o_vidx, p->max_sv * p->Pl * 4, chunk);
    TAKE(o_vw, (int64_t)p->n_ev * 2 * p->max_sv * p->twp * f4, chunk);
    TAKE(o_hw, (int64_t)p->n_eh * 2 * p->max_sh * f4, chunk);
    p->tables_end = o;
    TAKE(o_extra, (int64_t)p->nb * (Rg + 1) * dim * f4, vit);
    TAKE(o_z, rows * C * f4, vit);
    TAKE(o_pq, rows * C * f4, vit);
    TAKE(o_x, rows * dim * f4, vit);
    TAKE(o_a, rows * dim * es, vit);
    TAKE(o_b, rows * dim * es, vit);
    TAKE(o_qkv, rows * 3 * dim * es, vit);
    TAKE(o_il, il ? rows * 3 * dim * es : 0, vit);
    TAKE(o_u, rcs * (2 * I > P ? 2 * I : P) * es, vit);
    {
        int64_t g = rcs * I * es, pj32 = ad != H3_F32 ? rcs * P * f4 : 0; /* also the f32 output projection */
        TAKE(o_g, g > pj32 ? g : pj32, vit);
    }
    TAKE(o_tile, (p->thp * p->Pl * p->tw + p->trash) * ps * f4, chunk);
    TAKE(o_ustrip, (int64_t)p->nx * p->max_sv * p->Pl * p->twp * f4, chunk);
    TAKE(o_rstrip, 2 * p->thp * p->Pl * p->max_sh * f4, chunk);
    TAKE(o_vb, p->max_sv * p->Pl * p->twp * f4, chunk);
    TAKE(o_canvas, oc * Fc * p->Hp * p->Wp * f4, chunk);
    TAKE(o_prev, oc * p->ovl_frames * p->Hp * p->Wp * f4, chunk);
#undef TAKE
    p->total = o;
    p->vit_bytes = vit;
    p->chunk_bytes = chunk;
    return H3_OK;
}

/* The index and weight tables of a plan, written at base (the arena on the host; a host mirror of the tables
 * region uploaded once on a device): the latents statistics, the rotary tables of a pass (each tile's
 * replicated), where the register and zero tokens go, where each output-projection row lands in the tile
 * (y-major: rows of a tile are (y, plane), plane = channel·Fc + canvas frame), where each tile row lands in
 * the canvas, and the blend weights. */
static void vv_tables(const h3_video_vae_config *c, const vv_plan *p, uint8_t *base) {
    float *mean = (float *)(base + p->o_mean), *sd = (float *)(base + p->o_std),
          *ones = (float *)(base + p->o_ones);
    for (int i = 0; i < c->latent_channels; i++) mean[i] = c->latents_mean[i], sd[i] = c->latents_std[i];
    for (int i = 0; i < c->head_dim; i++) ones[i] = 1.0f;
    /* rotary: per axis the coordinate (i + 0.5)/n mapped to [-1, 1), angles 2π·coord·θ^(-6k/R) for k < R/6,
     * laid out [t | h | w] twice; register and zero tokens at the origin (cos 1, sin 0) */
    const int64_t R = c->rope_dim, nf = R / 6;
    float *cs = (float *)(base + p->o_cos), *sn = (float *)(base + p->o_sin);
    const int64_t dims[3] = {p->clip_len, p->th, p->tw};
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
    for (int b = 1; b < p->nb; b++) {
        memcpy(cs + b * p->S * R, cs, (size_t)(p->S * R) * sizeof(float));
        memcpy(sn + b * p->S * R, sn, (size_t)(p->S * R) * sizeof(float));
    }
    const int64_t Rg1 = c->num_register_tokens + 1;
    int32_t *xi = (int32_t *)(base + p->o_xidx);
    for (int b = 0; b < p->nb; b++)
        for (int64_t j = 0; j < Rg1; j++) xi[b * Rg1 + j] = (int32_t)(b * p->S + p->N + j);
    /* output projection: token n's row j is (channel, frame in the patch, pixel row in the patch) */
    const int64_t ps = c->patch_size, pt = c->patch_size_t, Tcp = (int64_t)p->clip_len * pt;
    const int64_t Fc = p->main_frames + p->ovl_frames;
    int64_t canvas_of[VV_MAX_CLIP_FRAMES];
    for (int64_t f = 0; f < Tcp; f++) canvas_of[f] = -1;
    for (int64_t f = 0; f < Fc; f++) canvas_of[vv_clip_frame(p, pt, f)] = f;
    int32_t *pi = (int32_t *)(base + p->o_pidx);
    int64_t trash = p->thp * p->Pl * p->tw;
    for (int64_t n = 0; n < p->N; n++) {
        int64_t t = n / (p->th * p->tw), y = (n / p->tw) % p->th, x = n % p->tw;
        for (int64_t j = 0; j < p->PR; j++) {
            int64_t ch = j / (pt * ps), dt = (j / ps) % pt, dy = j % ps, f = canvas_of[t * pt + dt];
            pi[n * p->PR + j] =
                (int32_t)(f < 0 ? trash++ : ((y * ps + dy) * p->Pl + ch * Fc + f) * p->tw + x);
        }
    }
    /* tile row (y, plane) of tile row a -> canvas row plane·Hp + ys[a] + y */
    int32_t *ci = (int32_t *)(base + p->o_cidx);
    for (int a = 0; a < p->ny; a++)
        for (int64_t y = 0; y < p->thp; y++)
            for (int64_t pl = 0; pl < p->Pl; pl++)
                ci[((int64_t)a * p->thp + y) * p->Pl + pl] = (int32_t)(pl * p->Hp + p->ys[a] + y);
    int32_t *vi = (int32_t *)(base + p->o_vidx);
    for (int64_t r = 0; r < p->max_sv * p->Pl; r++) vi[r] = (int32_t)(r / p->Pl);
    /* blend weights for an extent e: the next tile's k/e, the previous one's 1 − k/e, in f32 as the reference
     * computes them; vertical ones per row (gates of rows y), horizontal ones per column */
    for (int k = 0; k < p->n_ev; k++) {
        float *wa = (float *)(base + p->o_vw) + (int64_t)(2 * k) * p->max_sv * p->twp;
        float *wb = wa + p->max_sv * p->twp;
        for (int64_t y = 0; y < p->ev[k]; y++) {
            float b = (float)y / (float)p->ev[k], a = 1.0f - b;
            for (int64_t i = 0; i < p->twp; i++) wa[y * p->twp + i] = a, wb[y * p->twp + i] = b;
        }
    }
    for (int k = 0; k < p->n_eh; k++) {
        float *wa = (float *)(base + p->o_hw) + (int64_t)(2 * k) * p->max_sh, *wb = wa + p->max_sh;
        for (int64_t x = 0; x < p->eh[k]; x++) {
            float b = (float)x / (float)p->eh[k], a = 1.0f - b;
            wa[x] = a;
            wb[x] = b;
        }
    }
}

/* ---- checks -------------------------------------------------------------------------------------------- */

h3_status h3_video_vae_check_latents(const h3_video_vae_config *c, const h3_tensor *z) {
    char s[96];
    int off = z->ndim == 5 ? 1 : 0;
    if ((z->ndim != 4 && z->ndim != 5) || (off && z->shape[0] != 1))
        return H3_ERR(H3_ERR_INVALID,
                      "video latents must be [C, T, H, W] or [1, C, T, H, W] (one video); got %s",
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
        return H3_ERR(H3_ERR_INVALID,
                      "video latents %s are %lld × %lld: height and width must be even (H3 canvases "
                      "are multiples of 32 px, e.g. 48 × 84 latents for 768 × 1344)",
                      h3_tensor_shape_str(z, s, sizeof s), (long long)H, (long long)W);
    if (T > 100000 || H > 100000 || W > 100000)
        return H3_ERR(H3_ERR_INVALID, "video latents %s are implausibly large",
                      h3_tensor_shape_str(z, s, sizeof s));
    return H3_OK;
}

/* ---- placement ----------------------------------------------------------------------------------------- */

/* Where the weights live and how each part reaches a decode: through units (mem/units.h), one per ViT block
 * and one for the input and output layers. Unplaced (and placed on the host without packing), the units hand
 * out the file's tensors as opened. Packed at a place, each part is laid out as the device takes it: matrices
 * and biases in the placement's dtype (bf16 on a device, f32 for packed host runs), the norm weights,
 * residual scales, register tokens and input projections in f32, the official QKV rows ordered [Q; K; V] on
 * the way. The file stores another dtype, so the units convert on arrival: resident parts once, when placed
 * (through a load buffer the size of the largest tensor); streamed blocks travel as stored through one slot
 * and are converted into the units' work block as they are acquired, which frees the slot for the next
 * block's copy while this one computes. Blocks stored as placed (random weights) stream through two slots,
 * unconverted. */

struct vv_placed {
    h3_video_vae_mem plan;
    h3_exec *ex;
    h3_place place;
    h3_units *u;    /* packed: the parts' units */
    h3_tensor *rnd; /* random placement: [2 × W_COUNT] the input and output layers' and a block's tensors in
                     * their pinned source (a block stored as placed) */
    void *rsrc[2];  /* their bytes: the input and output layers, a block */
    int64_t rsrc_bytes[2];
    float *fh; /* a device decode's frames on their way to the callback (pinned) */
    int64_t fh_bytes;
    struct h3_memrep *rep;
};

/* Whether block l of L is resident when R are: spread evenly, so a resident block gives the copy of the next
 * streamed one its compute time too. */
static int vv_is_resident(int l, int L, int R) {
    if (R >= L) return 1;
    return (int)(((int64_t)(l + 1) * R) / L) > (int)(((int64_t)l * R) / L);
}

/* The tiers of a packed plan's units: the input and output layers resident, blocks resident as spread by
 * vv_is_resident, the first n_pinned streamed ones copied from pinned memory, the rest read from the file. */
static void vv_tiers(int L, int R, int n_pinned, uint8_t *tier) {
    for (int l = 0, j = 0; l < L; l++)
        tier[l] = vv_is_resident(l, L, R) ? H3_TIER_RESIDENT : j++ < n_pinned ? H3_TIER_PINNED : H3_TIER_DISK;
    tier[L] = H3_TIER_RESIDENT;
}

/* Descriptors (no data) of part `part`'s tensors: stored (dtypes from the file's headers) or, random, as
 * placed in dtype wdt. */
static h3_status vv_describe(const h3_video_vae *v, int part, int random, h3_dtype wdt, h3_tensor *t) {
    int ids[W_COUNT];
    const int n = vv_part_ids(v, part, ids);
    memset(t, 0, W_COUNT * sizeof *t);
    for (int k = 0; k < n; k++) {
        const int id = ids[k];
        char name[160] = "";
        int64_t s[H3_MAX_DIMS];
        const int nd = vv_op_shape(&v->cfg, id, s);
        h3_dtype dt = vv_placed_dtype(id, H3_F32, 1, wdt);
        if (!random) {
            const h3_st_entry *e =
                vv_name(v->layout, part, id, name, sizeof name) ? h3_st_find(&v->st, name) : NULL;
            if (!e) return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s' is missing", v->source, name);
            dt = e->dtype;
        }
        t[id].dtype = dt;
        t[id].ndim = nd;
        memcpy(t[id].shape, s, (size_t)nd * sizeof *s);
        t[id].place = random ? H3_PLACE_PINNED : H3_PLACE_HOST;
    }
    return H3_OK;
}

/* Random values for a part's tensors (benchmarks): matrices uniform with the variance of 1/fan-in, biases and
 * shifts near 0, norm weights near 1, residual scales small. */
static h3_status vv_random(h3_exec *ex, const h3_video_vae *v, int part, const h3_tensor *t, uint64_t seed) {
    int ids[W_COUNT];
    const int n = vv_part_ids(v, part, ids);
    for (int k = 0; k < n; k++) {
        const int id = ids[k];
        h3_tensor w = t[k];
        float a = 0.01f, lo, hi;
        if (w.ndim == 2 && id != W_REG) a = sqrtf(3.0f / (float)w.shape[1]);
        if (id == W_REG) a = 1.0f;
        if (id == W_S1 || id == W_S2) a = 0.1f;
        lo = -a, hi = a;
        if (id == W_N1 || id == W_N2 || id == W_LN_W) lo = 0.9f, hi = 1.1f;
        H3_TRY(h3_op_random_uniform(ex, &w, seed * 131u + (uint64_t)id, lo, hi));
    }
    return H3_OK;
}

void h3_video_vae_unplace(h3_video_vae *v) {
    vv_placed *pl = v ? v->pl : NULL;
    if (!pl) return;
    v->pl = NULL;
    h3_units_close(pl->u);
    for (int k = 0; k < 2; k++)
        if (pl->rsrc[k])
            h3_place_free(H3_PLACE_PINNED, pl->rsrc[k], (size_t)pl->rsrc_bytes[k], H3_MEM_WEIGHTS);
    if (pl->fh) h3_place_free(H3_PLACE_PINNED, pl->fh, (size_t)pl->fh_bytes, H3_MEM_IO);
    h3_free(pl->rnd);
    h3_free(pl);
}

const h3_video_vae_mem *h3_video_vae_placement(const h3_video_vae *v) {
    return v && v->pl ? &v->pl->plan : NULL;
}

/* The pinned sources of a random placement: the input and output layers (seed) and one block (seed + 999),
 * laid out as placed, values made on the host. */
static h3_status vv_random_sources(h3_video_vae *v, vv_placed *pl, h3_exec *ex, h3_dtype wdt, uint64_t seed) {
    pl->rnd = h3_calloc(2 * W_COUNT, sizeof *pl->rnd, H3_MEM_OTHER);
    if (!pl->rnd) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    for (int k = 0; k < 2; k++) {
        const int part = k == 0 ? VV_IO : 0;
        h3_tensor *t = pl->rnd + k * W_COUNT;
        H3_TRY(vv_describe(v, part, 1, wdt, t));
        h3_pack p;
        vv_pack_part(v, part, t, 1, wdt, 0, &p);
        pl->rsrc_bytes[k] = p.bytes;
        pl->rsrc[k] = h3_place_alloc(H3_PLACE_PINNED, (size_t)p.bytes, H3_MEM_WEIGHTS);
        if (!pl->rsrc[k])
            return H3_ERR(H3_ERR_NOMEM, "video VAE: %lld bytes of pinned memory for random weights",
                          (long long)p.bytes);
        h3_tensor views[W_COUNT];
        for (int i = 0; i < p.n; i++) {
            h3_pack_view(&p, i, pl->rsrc[k], H3_PLACE_PINNED, &views[i]);
            ((h3_tensor *)p.src[i])->data = views[i].data;
        }
        H3_TRY(vv_random(ex, v, part, views, k == 0 ? seed : seed + 999u));
    }
    return H3_OK;
}

h3_status h3_video_vae_place(h3_video_vae *v, h3_exec *ex, const h3_video_vae_mem *plan,
                             struct h3_memrep *rep) {
    const h3_video_vae_config *c = &v->cfg;
    const int L = c->num_layers;
    if (plan->n_blocks != L || (plan->place != H3_PLACE_HOST && plan->place != H3_PLACE_DEVICE) ||
        plan->tile_batch < 1 || plan->rows_per_step < 1 || plan->n_resident < 0 || plan->n_resident > L ||
        (plan->packed && plan->n_resident < L && plan->n_slots < 1))
        return H3_ERR(H3_ERR_INVALID,
                      "video VAE: this plan is not one of h3_video_vae_plan's for this decoder");
    if (plan->place == H3_PLACE_DEVICE && !ex->cuda)
        return H3_ERR(H3_ERR_INVALID,
                      "video VAE: a device placement needs an exec with a device (h3_cuda_init)");
    const int random = plan->random_seed != 0;
    if (v->created && !random)
        return H3_ERR(H3_ERR_INVALID,
                      "this video VAE was created without weights: place it with a random seed");
    h3_video_vae_unplace(v);
    h3_status st = H3_OK;
    h3_pack *packs = NULL;
    uint8_t *tier = NULL;
    int *order = NULL;
    vv_placed *pl = h3_calloc(1, sizeof *pl, H3_MEM_OTHER);
    if (!pl) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    pl->plan = *plan;
    pl->ex = ex;
    pl->place = plan->place;
    pl->rep = rep;
    if (!plan->packed) goto out; /* the host, from the file: only the run's choices */
    const h3_dtype wdt = plan->place == H3_PLACE_DEVICE ? H3_BF16 : H3_F32;
    if (pl->place == H3_PLACE_DEVICE) {
        pl->fh_bytes = vv_frames_stage_bytes(c, plan->H, plan->W);
        pl->fh = h3_place_alloc(H3_PLACE_PINNED, (size_t)pl->fh_bytes, H3_MEM_IO);
        if (!pl->fh) H3_FAIL(H3_ERR_NOMEM, "out of pinned memory for the frames handed out");
    }
    packs = h3_calloc((size_t)L + 1, sizeof *packs, H3_MEM_OTHER);
    tier = h3_calloc((size_t)L + 1, 1, H3_MEM_OTHER);
    order = h3_calloc((size_t)(L ? L : 1), sizeof *order, H3_MEM_OTHER);
    if (!packs || !tier || !order) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    if (random) {
        H3_CHECK(vv_random_sources(v, pl, ex, wdt, plan->random_seed));
        for (int l = 0; l < L; l++) vv_pack_part(v, l, pl->rnd + W_COUNT, 1, wdt, 0, &packs[l]);
        vv_pack_part(v, VV_IO, pl->rnd, 1, wdt, 0, &packs[L]);
    } else {
        for (int l = 0; l < L; l++) vv_pack_part(v, l, vv_bound(v, l), 1, wdt, c->fused_qkv, &packs[l]);
        vv_pack_part(v, VV_IO, vv_bound(v, VV_IO), 1, wdt, c->fused_qkv, &packs[L]);
    }
    vv_tiers(L, plan->n_resident, random ? L : plan->n_pinned, tier);
    {
        const h3_units_config uc = {pl->place, tier,        plan->n_slots, 0,   v->created ? NULL : &v->st,
                                    c->heads,  c->head_dim, NULL,          rep, "the video VAE's weights",
                                    0, NULL};
        H3_CHECK(h3_units_open(ex, &uc, packs, L + 1, &pl->u));
    }
    if (random) /* each resident block its own values, as the input and output layers have */
        for (int l = 0; l < L; l++) {
            if (tier[l] != H3_TIER_RESIDENT) continue;
            const h3_tensor *t;
            H3_CHECK(h3_units_acquire(pl->u, l, &t));
            st = vv_random(ex, v, l, t, plan->random_seed + 1000u * (uint64_t)(l + 1));
            h3_units_release(pl->u, l);
            H3_CHECK(st);
        }
    for (int l = 0; l < L; l++) order[l] = l;
    H3_CHECK(h3_units_set_order(pl->u, order, L, 1));
    H3_CHECK(h3_exec_sync(ex));
out:
    h3_free(packs);
    h3_free(tier);
    h3_free(order);
    v->pl = pl;
    return H3_OK;
done:
    h3_free(packs);
    h3_free(tier);
    h3_free(order);
    v->pl = pl;
    h3_video_vae_unplace(v);
    return st;
}

/* The one way decode code reaches weights: part `part` from the units of the placement (packed) or the
 * file's (as opened). Release with vv_release. */
static h3_units *vv_units(const h3_video_vae *v) {
    return v->pl && v->pl->u ? v->pl->u : v->host;
}

static h3_status vv_acquire(h3_video_vae *v, int part, vv_part *w) {
    memset(w, 0, sizeof *w);
    h3_units *u = vv_units(v);
    if (!u)
        return H3_ERR(H3_ERR_INVALID,
                      "this video VAE was created without weights: place it with a random seed");
    const h3_tensor *t;
    H3_TRY_CTX(h3_units_acquire(u, vv_unit(v, part), &t), "video VAE %s%d",
               part == VV_IO ? "input and output layers" : "block ", part == VV_IO ? 0 : part);
    int ids[W_COUNT];
    const int n = vv_part_ids(v, part, ids);
    for (int k = 0; k < n; k++) w->t[ids[k]] = t[k];
    const int packed = u != v->host;
    w->qkv_form = packed ? VV_QKV_ORDERED : v->cfg.fused_qkv ? VV_QKV_INTERLEAVED : VV_QKV_SPLIT;
    if (packed && part != VV_IO && !v->cfg.fused_qkv) { /* joined as placed: one [Q; K; V] */
        const int64_t dim = (int64_t)v->cfg.heads * v->cfg.head_dim, sw[2] = {3 * dim, dim}, sb = 3 * dim;
        const h3_tensor *q = &w->t[W_Q_W], *b = &w->t[W_Q_B];
        H3_TRY(h3_tensor_wrap(&w->t[W_QKV_W], q->data, q->place, q->dtype, 2, sw));
        H3_TRY(h3_tensor_wrap(&w->t[W_QKV_B], b->data, b->place, b->dtype, 1, &sb));
    }
    return H3_OK;
}

static void vv_release(h3_video_vae *v, int part) {
    h3_units *u = vv_units(v);
    if (u) h3_units_release(u, vv_unit(v, part));
}

/* ---- the memory function ------------------------------------------------------------------------------- */

/* The CPU GEMM's scratch for a weight [N, K] of dtype dt (the kernel's own arithmetic). */
static int64_t gemm_scratch(int64_t N, int64_t K, h3_dtype dt) {
    return h3_cpu_gemm_scratch_bytes(N, K, dt, 0);
}

/* The largest scratch a host op of the decode takes (one op at a time), with matrices of dtype dt. */
static int64_t vv_op_scratch(const h3_video_vae_config *c, int threads, h3_dtype dt) {
    int64_t C = c->latent_channels, dim = (int64_t)c->heads * c->head_dim, I = c->ffn_inner, D = c->head_dim;
    int64_t P = (int64_t)c->out_channels * c->patch_size_t * c->patch_size * c->patch_size;
    int64_t m = h3_cpu_attention_scratch_bytes(threads, D);
    int64_t g[7] = {gemm_scratch(C, C, dt),
                    gemm_scratch(dim, C, dt),
                    c->fused_qkv ? gemm_scratch(3 * dim, dim, dt) : gemm_scratch(dim, dim, dt),
                    gemm_scratch(dim, dim, dt),
                    gemm_scratch(2 * I, dim, dt),
                    gemm_scratch(dim, I, dt),
                    gemm_scratch(P, dim, dt)};
    for (int i = 0; i < 7; i++) m = g[i] > m ? g[i] : m;
    if (2 * dim * 4 > m) m = 2 * dim * 4; /* layer norm weight and bias as f32 */
    return m;
}

/* One chunk's raw canvas [oc, main + look-ahead frames, Hp, Wp] f32: what a split decode moves a chunk. */
static int64_t vv_canvas_bytes(const h3_video_vae_config *c, const vv_plan *p) {
    return (int64_t)c->out_channels * (p->main_frames + p->ovl_frames) * p->Hp * p->Wp * 4;
}

static void vv_mem_geometry(const h3_video_vae_config *c, const vv_plan *p, h3_video_vae_mem *out) {
    out->chunks = p->chunks;
    out->tiles_y = p->ny;
    out->tiles_x = p->nx;
    out->frames = p->frames;
    out->tokens_per_tile = p->S;
    out->H = p->H;
    out->W = p->W;
    out->tile_batch = p->nb;
    out->passes = (p->nt + p->nb - 1) / p->nb;
    out->rows_per_step = p->rc;
    out->canvas_bytes = vv_canvas_bytes(c, p);
}

/* A host decode from the file: f32 activations, weights as stored. */
static h3_status vv_plan_host(const h3_video_vae_config *c, int64_t T, int64_t H, int64_t W, int threads,
                              int nb, int64_t rc, h3_video_vae_mem *out) {
    vv_plan p;
    H3_TRY(vv_make_plan(c, T, H, W, nb, rc, H3_F32, c->fused_qkv, &p));
    vv_mem_geometry(c, &p, out);
    out->place = H3_PLACE_HOST;
    out->n_blocks = out->n_resident = c->num_layers;
    out->chunk_buffers = p.chunk_bytes + (int64_t)sizeof(vv_plan); /* the plan itself is heap memory too */
    out->vit = p.vit_bytes;
    out->op_scratch = vv_op_scratch(c, threads > 0 ? threads : 1, c->weight_dtype);
    out->total = out->chunk_buffers + out->vit + out->op_scratch;
    return H3_OK;
}

h3_status h3_video_vae_decode_peak(const h3_video_vae_config *c, int64_t T, int64_t H, int64_t W, int threads,
                                   int rows_per_step, h3_video_vae_mem *out) {
    memset(out, 0, sizeof *out);
    if (T < 1 || H < 1 || W < 1) return H3_ERR(H3_ERR_INVALID, "latent sizes must be positive");
    return vv_plan_host(c, T, H, W, threads, 1, rows_per_step > 0 ? rows_per_step : 512, out);
}

/* Seconds of a packed plan on an H200-like device, for ranking the choices only: the GEMMs at ~700 TFLOP/s
 * (less for small row steps), attention at ~400, each streamed block's copy hidden behind its block's compute
 * when shorter (one slot: the next copy starts when a block is converted). */
static double vv_rank_time(const h3_video_vae_config *c, const vv_plan *p, int L, int R, int64_t stored,
                           int n_pinned) {
    const double dim = (double)c->heads * c->head_dim, I = c->ffn_inner, S = (double)p->S;
    const double gemm = 2.0 * S * dim * (3 * dim + dim + 2 * I) + 2.0 * S * I * dim, attn = 4.0 * S * S * dim;
    const double m = (double)(p->rc < p->rows ? p->rc : p->rows), eff = m / (m + 512.0);
    double t = 0;
    for (int t0 = 0; t0 < p->nt; t0 += p->nb) {
        const int n = p->nt - t0 < p->nb ? p->nt - t0 : p->nb;
        const double comp = n * (gemm / (700e12 * eff) + attn / 400e12);
        for (int l = 0, j = 0; l < L; l++) {
            if (vv_is_resident(l, L, R)) {
                t += comp;
                continue;
            }
            const double copy = (double)stored / (j++ < n_pinned ? 50e9 : 2e9);
            t += comp > copy ? comp : copy;
        }
    }
    return t * p->chunks;
}

h3_status h3_video_vae_plan(const h3_video_vae *v, int64_t T, int64_t H, int64_t W,
                            const h3_video_vae_run *run_in, h3_video_vae_mem *out) {
    memset(out, 0, sizeof *out);
    h3_video_vae_run run0;
    memset(&run0, 0, sizeof run0);
    const h3_video_vae_run *run = run_in ? run_in : &run0;
    const h3_video_vae_config *c = &v->cfg;
    if (T < 1 || H < 1 || W < 1) return H3_ERR(H3_ERR_INVALID, "latent sizes must be positive");
    if ((run->place != H3_PLACE_HOST && run->place != H3_PLACE_DEVICE) || run->tile_batch < 0 ||
        run->rows_per_step < 0 || run->vram_budget < 0 || run->ram_budget < 0 || run->stream_blocks < 0)
        return H3_ERR(H3_ERR_INVALID, "video VAE run: place host or device, no negative sizes");
    const int packed = run->place == H3_PLACE_DEVICE || run->packed, random = run->random_seed != 0;
    if (v->created && !random)
        return H3_ERR(H3_ERR_INVALID,
                      "this video VAE was created without weights: plan it with a random seed");
    if (!packed) {
        H3_TRY(vv_plan_host(c, T, H, W, run->threads, run->tile_batch > 0 ? run->tile_batch : 1,
                            run->rows_per_step > 0 ? run->rows_per_step : v->rows_per_step, out));
        return H3_OK;
    }
    const h3_dtype wdt = run->place == H3_PLACE_DEVICE ? H3_BF16 : H3_F32;
    const int L = c->num_layers;
    /* the units as placed, from the headers (every block has the same shapes and dtypes) */
    h3_tensor desc[2][W_COUNT];
    H3_TRY(vv_describe(v, VV_IO, random, wdt, desc[0]));
    H3_TRY(vv_describe(v, 0, random, wdt, desc[1]));
    h3_status st = H3_OK;
    vv_plan *p = h3_malloc(sizeof *p, H3_MEM_OTHER);
    h3_pack *packs = h3_calloc((size_t)L + 1, sizeof *packs, H3_MEM_OTHER);
    uint8_t *tier = h3_calloc((size_t)L + 1, 1, H3_MEM_OTHER);
    if (!p || !packs || !tier) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int l = 0; l < L; l++) vv_pack_part(v, l, desc[1], 1, wdt, !random && c->fused_qkv, &packs[l]);
    vv_pack_part(v, VV_IO, desc[0], 1, wdt, !random && c->fused_qkv, &packs[L]);
    /* a block that converts frees its slot once converted: one slot overlaps the next copy with this
     * block's compute; one stored as placed is used in its slot, so two */
    const int slots = packs[0].converts ? 1 : 2;
    const int64_t stored = packs[0].bytes;
    const int64_t backend = run->place == H3_PLACE_DEVICE ? H3_CUDA_BACKEND_BYTES : 0;
    const int64_t budget = run->vram_budget, slack = budget ? h3_budget_slack(budget) : 0;
    h3_units_config uc = {run->place, tier, 0, 0, NULL, c->heads, c->head_dim, NULL, NULL, NULL, 0, NULL};
    h3_units_mem um;
    H3_CHECK(vv_make_plan(c, T, H, W, 1, 1, wdt, 0, p));
    const int nt = p->nt;
    const int64_t S = p->S;
    static const int64_t steps[] = {16384, 8192, 4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1};
    double best_t = 0;
    int have = 0, best_nb = 0, best_R = 0, best_np = 0;
    int64_t best_rc = 0, least = -1;
    for (int q = 1; q <= nt; q++) {
        const int nb = (nt + q - 1) / q;
        if (q > 1 && nb == (nt + q - 2) / (q - 1)) continue; /* the same batch as q − 1 */
        if (run->tile_batch && nb != (run->tile_batch < nt ? run->tile_batch : nt)) continue;
        const int64_t rows = nb * S;
        for (int k = -1; k < (int)(sizeof steps / sizeof steps[0]); k++) {
            int64_t rc = k < 0 ? rows : steps[k];
            if (run->rows_per_step) { /* the one asked for */
                if (k >= 0) break;
                rc = run->rows_per_step < rows ? run->rows_per_step : rows;
            } else if (rc > rows || (k >= 0 && rc == rows)) {
                continue;
            }
            H3_CHECK(vv_make_plan(c, T, H, W, nb, rc, wdt, 0, p));
            const int64_t arena = h3_cuda_granule(p->total), Rmax = L - run->stream_blocks;
            for (int64_t R = Rmax < 0 ? 0 : Rmax; R >= 0; R--) {
                const int n_str = L - (int)R;
                int n_pinned = n_str;
                if (!random && run->ram_budget && n_str) {
                    int64_t fit = run->ram_budget / (stored > 0 ? stored : 1);
                    n_pinned = fit < n_str ? (int)fit : n_str;
                }
                vv_tiers(L, (int)R, n_pinned, tier);
                uc.n_slots = n_str ? slots : 0;
                h3_units_mem_of(&uc, packs, L + 1, &um);
                const int64_t dec = backend + um.resident + um.ring + um.work + arena;
                const int64_t load = backend + um.resident + um.load, peak = dec > load ? dec : load;
                if (least < 0 || peak < least) least = peak;
                if (budget && peak + slack > budget) continue;
                const double t = vv_rank_time(c, p, L, (int)R, stored, n_pinned);
                if (!have || t < best_t * 0.999) {
                    have = 1;
                    best_t = t;
                    best_nb = nb;
                    best_rc = rc;
                    best_R = (int)R;
                    best_np = n_pinned;
                }
                break; /* fewer resident blocks only cost more */
            }
        }
    }
    if (!have) {
        char a[32], b[32];
        H3_FAIL(
            H3_ERR_BUDGET,
            "the video VAE decode of %lld×%lld latents needs at least %s of the device (one tile per pass, "
            "every block streamed); the budget is %s",
            (long long)H, (long long)W, h3_budget_str(least + h3_budget_slack(least), a, sizeof a),
            h3_budget_str(budget, b, sizeof b));
    }
    H3_CHECK(vv_make_plan(c, T, H, W, best_nb, best_rc, wdt, 0, p));
    vv_tiers(L, best_R, best_np, tier);
    uc.n_slots = best_R < L ? slots : 0;
    h3_units_mem_of(&uc, packs, L + 1, &um);
    vv_mem_geometry(c, p, out);
    out->place = run->place;
    out->packed = 1;
    out->n_blocks = L;
    out->n_resident = best_R;
    out->n_slots = uc.n_slots;
    out->n_pinned = best_np;
    out->n_disk = L - best_R - best_np;
    out->block_bytes = packs[0].pbytes;
    out->stored_bytes = stored;
    out->chunk_buffers = p->chunk_bytes;
    out->vit = p->vit_bytes;
    out->dev_backend = backend;
    out->dev_weights = um.resident;
    out->dev_load = um.load;
    out->dev_slots = um.ring + um.work;
    out->dev_arena = h3_cuda_granule(p->total);
    {
        const int64_t dec = backend + out->dev_weights + out->dev_slots + out->dev_arena;
        const int64_t load = backend + out->dev_weights + out->dev_load;
        out->dev_peak = dec > load ? dec : load;
    }
    const int64_t frames_stage = vv_frames_stage_bytes(c, H, W);
    out->host_pinned = um.pinned + (random ? packs[0].bytes + packs[L].bytes : 0) +
                       (run->place == H3_PLACE_DEVICE ? frames_stage : 0);
    {
        int64_t during =
            p->rows * c->latent_channels * 4 + (run->place == H3_PLACE_DEVICE ? frames_stage : 0);
        out->total = (int64_t)sizeof(vv_plan) + (p->tables_end > during ? p->tables_end : during);
        if (run->place == H3_PLACE_HOST)
            out->total = (int64_t)sizeof(vv_plan) + p->total; /* the arena is host */
    }
    out->op_scratch =
        run->place == H3_PLACE_HOST ? vv_op_scratch(c, run->threads > 0 ? run->threads : 1, H3_F32) : 0;
    out->budget = budget;
    out->budget_slack = slack;
    out->random_seed = run->random_seed;
    out->ram_budget = run->ram_budget;
done:
    h3_free(p);
    h3_free(packs);
    h3_free(tier);
    return st;
}

void h3_video_vae_plan_predicted(const h3_video_vae_mem *m, int64_t pred[5], int64_t *peak) {
    pred[H3_DEVCAT_BACKEND] = m->dev_backend;
    pred[H3_DEVCAT_WEIGHTS] = m->dev_weights + m->dev_load; /* the load buffer counts with what it loads */
    pred[H3_DEVCAT_SLOTS] = m->dev_slots;
    pred[H3_DEVCAT_MODULATION] = 0;
    pred[H3_DEVCAT_ACTIVATIONS] = m->dev_arena;
    if (peak) *peak = m->dev_peak;
}

/* ---- decoding ------------------------------------------------------------------------------------------ */

typedef struct {
    h3_video_vae *v;
    h3_exec *ex;
    const h3_video_vae_config *c;
    const vv_plan *p;
    h3_place place;
    uint8_t *ar;      /* the arena, at the place */
    float *zh;        /* a pass's tokens [rows, C] on the host (the arena's own on the host) */
    const float *lat; /* the latents [C, T, H, W] */
    float *fh;        /* a device decode's frames on their way to the callback [oc, n, Hp, Wp] (pinned) */
    vv_part io;
    int gate_first;
    int64_t delivered;
    const h3_video_decode_out *out;
} vv_run;

/* A row-wise view [rows, cols] with row stride ld at byte offset off of the arena. */
static h3_tensor vv_v(const vv_run *r, int64_t off, h3_dtype dt, int64_t rows, int64_t cols, int64_t ld) {
    h3_tensor t;
    int64_t s[2] = {rows, cols};
    h3_tensor_wrap(&t, r->ar + off, r->place, dt, 2, s);
    t.stride[0] = ld;
    return t;
}
static h3_tensor vv_vec(const vv_run *r, int64_t off, h3_dtype dt, int64_t n) {
    h3_tensor t;
    h3_tensor_wrap(&t, r->ar + off, r->place, dt, 1, &n);
    return t;
}
/* Heads [rows, H, D] of a row-wise buffer (row stride ld) at byte offset off. */
static h3_tensor vv_heads(const vv_run *r, int64_t off, int64_t rows, int64_t ld) {
    h3_tensor t;
    int64_t s[3] = {rows, r->c->heads, r->c->head_dim};
    h3_tensor_wrap(&t, r->ar + off, r->place, r->p->ad, 3, s);
    t.stride[0] = ld;
    return t;
}

/* One transformer block over the rows of nbp tiles: x [rows, hidden] f32 (the residual stream), a and b
 * [rows, hidden] and qkv [rows, 3·hidden] in the GEMM dtype, attention per tile. */
static h3_status vv_block(vv_run *r, const vv_part *w, int nbp) {
    const h3_video_vae_config *c = r->c;
    const vv_plan *p = r->p;
    h3_exec *ex = r->ex;
    const h3_dtype ad = p->ad;
    const int64_t es = (int64_t)h3_dtype_size(ad), S = p->S, rows = nbp * S, D = c->head_dim,
                  I = c->ffn_inner;
    const int64_t dim = (int64_t)c->heads * D, R = c->rope_dim;
    h3_tensor x = vv_v(r, p->o_x, H3_F32, rows, dim, dim);
    h3_tensor a = vv_v(r, p->o_a, ad, rows, dim, dim), b = vv_v(r, p->o_b, ad, rows, dim, dim);
    H3_TRY(h3_op_rms_norm(ex, &a, &x, &w->t[W_N1], c->norm_eps));
    if (w->qkv_form == VV_QKV_ORDERED) {
        h3_tensor qkv = vv_v(r, p->o_qkv, ad, rows, 3 * dim, 3 * dim);
        H3_TRY(h3_op_gemm(ex, &qkv, &a, &w->t[W_QKV_W], &w->t[W_QKV_B], 0));
    } else if (w->qkv_form == VV_QKV_SPLIT) {
        for (int j = 0; j < 3; j++) {
            h3_tensor y = vv_v(r, p->o_qkv + j * dim * es, ad, rows, dim, 3 * dim);
            H3_TRY(h3_op_gemm(ex, &y, &a, &w->t[W_Q_W + j], &w->t[W_Q_B + j], 0));
        }
    } else { /* rows per head [q k v]: into the scratch, then each head's q, k and v where [Q | K | V] wants
                them */
        h3_tensor il = vv_v(r, p->o_il, ad, rows, 3 * dim, 3 * dim);
        H3_TRY(h3_op_gemm(ex, &il, &a, &w->t[W_QKV_W], &w->t[W_QKV_B], 0));
        for (int64_t h = 0; h < c->heads; h++)
            for (int64_t j = 0; j < 3; j++) {
                h3_tensor s = vv_v(r, p->o_il + (h * 3 + j) * D * es, ad, rows, D, 3 * dim);
                h3_tensor d = vv_v(r, p->o_qkv + (j * dim + h * D) * es, ad, rows, D, 3 * dim);
                H3_TRY(h3_op_convert(ex, &d, &s));
            }
    }
    /* per-head RMSNorm of q and k (non-affine: a weight of ones) and the rotary embedding, in place */
    h3_tensor cs = vv_v(r, p->o_cos, H3_F32, rows, R, R), sn = vv_v(r, p->o_sin, H3_F32, rows, R, R);
    h3_tensor ones = vv_vec(r, p->o_ones, H3_F32, D);
    for (int j = 0; j < 2; j++) {
        h3_tensor hq = vv_heads(r, p->o_qkv + j * dim * es, rows, 3 * dim);
        H3_TRY(h3_op_qk_norm_rope(ex, &hq, &ones, c->norm_eps, &cs, &sn));
    }
    for (int t = 0; t < nbp; t++) {
        const int64_t q0 = p->o_qkv + t * S * 3 * dim * es;
        h3_tensor q = vv_heads(r, q0, S, 3 * dim), k = vv_heads(r, q0 + dim * es, S, 3 * dim);
        h3_tensor v = vv_heads(r, q0 + 2 * dim * es, S, 3 * dim),
                  o = vv_heads(r, p->o_b + t * S * dim * es, S, dim);
        H3_TRY(h3_op_attention(ex, &o, &q, &k, &v, 1.0f / sqrtf((float)D), 0));
    }
    H3_TRY(h3_op_gemm(ex, &a, &b, &w->t[W_O_W], &w->t[W_O_B], 0));
    H3_TRY(h3_op_gated_add(ex, &x, &a, &w->t[W_S1], NULL));
    H3_TRY(h3_op_rms_norm(ex, &a, &x, &w->t[W_N2], c->norm_eps));
    for (int64_t r0 = 0; r0 < rows; r0 += p->rc) {
        const int64_t n = rows - r0 < p->rc ? rows - r0 : p->rc;
        h3_tensor ar = vv_v(r, p->o_a + r0 * dim * es, ad, n, dim, dim);
        h3_tensor br = vv_v(r, p->o_b + r0 * dim * es, ad, n, dim, dim);
        h3_tensor u = vv_v(r, p->o_u, ad, n, 2 * I, 2 * I), g = vv_v(r, p->o_g, ad, n, I, I);
        H3_TRY(h3_op_gemm(ex, &u, &ar, &w->t[W_W1], &w->t[W_B1], 0));
        H3_TRY(h3_op_swiglu(ex, &g, &u, r->gate_first));
        H3_TRY(h3_op_gemm(ex, &br, &g, &w->t[W_W2], &w->t[W_B2], 0));
    }
    return h3_op_gated_add(ex, &x, &b, &w->t[W_S2], NULL);
}

/* Tile b of the pass through the output projection (in row steps), each token's [oc, pt, p, p] values
 * scattered as rows of p pixels into the tile buffer: y-major rows (y, plane) of tile-width pixels, dropped
 * clip frames into rows of their own past the tile. */
static h3_status vv_tile_out(vv_run *r, int b) {
    const h3_video_vae_config *c = r->c;
    const vv_plan *p = r->p;
    const int64_t ps = c->patch_size, P = p->PR * ps, dim = (int64_t)c->heads * c->head_dim;
    const int64_t es = (int64_t)h3_dtype_size(p->ad);
    h3_tensor tile = vv_v(r, p->o_tile, H3_F32, p->thp * p->Pl * p->tw + p->trash, ps, ps);
    for (int64_t r0 = 0; r0 < p->N; r0 += p->rc) {
        const int64_t n = p->N - r0 < p->rc ? p->N - r0 : p->rc;
        h3_tensor xa = vv_v(r, p->o_a + ((int64_t)b * p->S + r0) * dim * es, p->ad, n, dim, dim);
        h3_tensor pj = vv_v(r, p->o_u, p->ad, n, P, P);
        H3_TRY(h3_op_gemm(r->ex, &pj, &xa, &r->io.t[W_OUT_W], &r->io.t[W_OUT_B], 0));
        int64_t src = p->o_u;
        if (p->ad != H3_F32) { /* the pixels are blended in f32 */
            h3_tensor pf = vv_v(r, p->o_g, H3_F32, n, P, P);
            H3_TRY(h3_op_convert(r->ex, &pf, &pj));
            src = p->o_g;
        }
        h3_tensor rows = vv_v(r, src, H3_F32, n * p->PR, ps, ps),
                  idx = vv_vec(r, p->o_pidx + r0 * p->PR * 4, H3_I32, n * p->PR);
        H3_TRY(h3_op_scatter_rows(r->ex, &tile, &rows, &idx));
    }
    return H3_OK;
}

/* Places tile (a, b) of the current chunk into the canvas, as diffusers' _stitch_tiles does: the top rows
 * blended with the raw bottom of the tile above, then the left columns with the raw right edge of the tile to
 * the left (weights k/e), the bottom and right overlaps cut (they belong to the next tiles); this tile's raw
 * bottom and right edges are kept for those first. Every op covers all channels and frames at once: the tile,
 * the strips and the blended band are y-major (rows (y, plane)), so any band of rows or columns is one
 * row-wise view. */
static h3_status vv_stitch(vv_run *r, int a, int b) {
    const vv_plan *p = r->p;
    h3_exec *ex = r->ex;
    const int64_t Pl = p->Pl, thp = p->thp, twp = p->twp, Hp = p->Hp, Wp = p->Wp, f4 = 4;
    const int64_t kh = thp - (a + 1 < p->ny ? p->yo[a] : 0), kw = twp - (b + 1 < p->nx ? p->xo[b] : 0);
    const int64_t ev = a > 0 ? (p->yo[a - 1] < thp ? p->yo[a - 1] : thp) : 0;
    const int64_t eh = b > 0 ? (p->xo[b - 1] < twp ? p->xo[b - 1] : twp) : 0;
    const int64_t sv = a + 1 < p->ny ? (p->yo[a] < thp ? p->yo[a] : thp) : 0;
    const int64_t sh = b + 1 < p->nx ? (p->xo[b] < twp ? p->xo[b] : twp) : 0;
    const int64_t e2 = eh < kw ? eh : kw; /* blended columns that are kept */
    const int64_t up = p->o_ustrip + (int64_t)b * p->max_sv * Pl * twp * f4,
                  rstride = thp * Pl * p->max_sh * f4;
    const int64_t rnew = p->o_rstrip + (int64_t)(b & 1) * rstride,
                  rold = p->o_rstrip + (int64_t)((b + 1) & 1) * rstride;
    if (ev) { /* vb = above·(1 − y/ev) + tile·(y/ev), rows y < ev */
        const int k = vv_extent_index(p->ev, p->n_ev, ev);
        const int64_t wo = p->o_vw + (int64_t)(2 * k) * p->max_sv * twp * f4;
        h3_tensor vb = vv_v(r, p->o_vb, H3_F32, ev * Pl, twp, twp),
                  u = vv_v(r, up, H3_F32, ev * Pl, twp, twp);
        h3_tensor t = vv_v(r, p->o_tile, H3_F32, ev * Pl, twp, twp),
                  idx = vv_vec(r, p->o_vidx, H3_I32, ev * Pl);
        h3_tensor wa = vv_v(r, wo, H3_F32, ev, twp, twp),
                  wb = vv_v(r, wo + p->max_sv * twp * f4, H3_F32, ev, twp, twp);
        H3_TRY(h3_op_fill(ex, &vb, 0.0f));
        H3_TRY(h3_op_gated_add(ex, &vb, &u, &wa, &idx));
        H3_TRY(h3_op_gated_add(ex, &vb, &t, &wb, &idx));
    }
    if (sv) { /* the raw bottom rows, for the tile below */
        h3_tensor s = vv_v(r, p->o_tile + (thp - sv) * Pl * twp * f4, H3_F32, sv * Pl, twp, twp);
        h3_tensor d = vv_v(r, up, H3_F32, sv * Pl, twp, twp);
        H3_TRY(h3_op_convert(ex, &d, &s));
    }
    if (sh) { /* the raw right columns, for the tile to the right */
        h3_tensor s = vv_v(r, p->o_tile + (twp - sh) * f4, H3_F32, thp * Pl, sh, twp);
        h3_tensor d = vv_v(r, rnew, H3_F32, thp * Pl, sh, p->max_sh);
        H3_TRY(h3_op_convert(ex, &d, &s));
    }
    if (ev) {
        h3_tensor s = vv_v(r, p->o_vb, H3_F32, ev * Pl, twp, twp),
                  d = vv_v(r, p->o_tile, H3_F32, ev * Pl, twp, twp);
        H3_TRY(h3_op_convert(ex, &d, &s));
    }
    if (e2 > 0) { /* tile·(x/eh) + left·(1 − x/eh), columns x < e2, the kept rows */
        const int k = vv_extent_index(p->eh, p->n_eh, eh);
        const int64_t wo = p->o_hw + (int64_t)(2 * k) * p->max_sh * f4;
        h3_tensor t = vv_v(r, p->o_tile, H3_F32, kh * Pl, e2, twp),
                  l = vv_v(r, rold, H3_F32, kh * Pl, e2, p->max_sh);
        h3_tensor wa = vv_vec(r, wo, H3_F32, e2), wb = vv_vec(r, wo + p->max_sh * f4, H3_F32, e2);
        H3_TRY(h3_op_binary(ex, &t, &t, &wb, H3_BINARY_MUL));
        H3_TRY(h3_op_gated_add(ex, &t, &l, &wa, NULL));
    }
    /* the kept rows and columns into the canvas [oc, Fc, Hp, Wp]: tile row (y, plane) is canvas row plane·Hp
     * + y0 + y */
    h3_tensor d = vv_v(r, p->o_canvas + p->xs[b] * f4, H3_F32, Pl * Hp, kw, Wp);
    h3_tensor s = vv_v(r, p->o_tile, H3_F32, kh * Pl, kw, twp);
    h3_tensor idx = vv_vec(r, p->o_cidx + (int64_t)a * thp * Pl * 4, H3_I32, kh * Pl);
    return h3_op_scatter_rows(ex, &d, &s, &idx);
}

/* One pass: tiles t0 .. t0+nbp-1 of chunk i (raster order) through the ViT, then each into the canvas. */
static h3_status vv_pass(vv_run *r, int i, int t0, int nbp) {
    const h3_video_vae_config *c = r->c;
    const vv_plan *p = r->p;
    h3_exec *ex = r->ex;
    const int64_t C = c->latent_channels, S = p->S, rows = nbp * S, dim = (int64_t)c->heads * c->head_dim;
    const int64_t ps = c->patch_size, HW = p->H * p->W, THW = p->T * HW, Rg1 = c->num_register_tokens + 1;
    /* the tiles' latents as tokens [rows, C]: tile b's tokens at rows b·S.., its register and zero rows
     * unused */
    for (int b = 0; b < nbp; b++) {
        const int k = t0 + b;
        const int64_t y0 = p->ys[k / p->nx] / ps, x0 = p->xs[k % p->nx] / ps, ts = (int64_t)i * p->cs;
        for (int64_t n = 0; n < p->N; n++) {
            int64_t t = ts + n / (p->th * p->tw);
            if (t > p->T - 1) t = p->T - 1;
            const float *src = r->lat + t * HW + (y0 + (n / p->tw) % p->th) * p->W + x0 + n % p->tw;
            float *z = r->zh + ((int64_t)b * S + n) * C;
            for (int64_t ch = 0; ch < C; ch++) z[ch] = src[ch * THW];
        }
    }
    h3_tensor z = vv_v(r, p->o_z, H3_F32, rows, C, C);
    if (r->place == H3_PLACE_DEVICE) {
        h3_tensor zh;
        int64_t s2[2] = {rows, C};
        h3_tensor_wrap(&zh, r->zh, H3_PLACE_HOST, H3_F32, 2, s2);
        H3_TRY(h3_copy(ex, &z, &zh));
    }
    h3_tensor mean = vv_vec(r, p->o_mean, H3_F32, C), sd = vv_vec(r, p->o_std, H3_F32, C);
    H3_TRY(h3_op_binary(ex, &z, &z, &sd, H3_BINARY_MUL));
    H3_TRY(h3_op_binary(ex, &z, &z, &mean, H3_BINARY_ADD));
    h3_tensor pq = vv_v(r, p->o_pq, H3_F32, rows, C, C), x = vv_v(r, p->o_x, H3_F32, rows, dim, dim);
    H3_TRY(h3_op_gemm(ex, &pq, &z, &r->io.t[W_PQ_W], &r->io.t[W_PQ_B], 0));
    H3_TRY(h3_op_gemm(ex, &x, &pq, &r->io.t[W_IN_W], &r->io.t[W_IN_B], 0));
    h3_tensor extra = vv_v(r, p->o_extra, H3_F32, nbp * Rg1, dim, dim),
              xi = vv_vec(r, p->o_xidx, H3_I32, nbp * Rg1);
    H3_TRY(h3_op_scatter_rows(ex, &x, &extra, &xi)); /* the register tokens and the zero token of each tile */
    for (int l = 0; l < c->num_layers; l++) {
        vv_part w;
        H3_TRY(vv_acquire(r->v, l, &w));
        h3_status st = vv_block(r, &w, nbp);
        vv_release(r->v, l);
        H3_TRY_CTX(st, "block %d", l);
    }
    h3_tensor an = vv_v(r, p->o_a, p->ad, rows, dim, dim);
    H3_TRY(h3_op_layer_norm(ex, &an, &x, &r->io.t[W_LN_W], &r->io.t[W_LN_B], c->norm_eps));
    for (int b = 0; b < nbp; b++) {
        H3_TRY(vv_tile_out(r, b));
        H3_TRY(vv_stitch(r, (t0 + b) / p->nx, (t0 + b) % p->nx));
    }
    return H3_OK;
}

/* Hands frames [0, n) of a canvas-layout buffer [oc, nf, Hp, Wp] at byte offset off to the caller as output
 * frames first.. (cut at the video's length), in the range asked for. */
static h3_status vv_deliver(vv_run *r, int64_t off, int64_t nf, int64_t n, int64_t first) {
    const vv_plan *p = r->p;
    const h3_video_vae_config *c = r->c;
    if (first + n > p->frames) n = p->frames - first;
    if (n <= 0) return H3_OK;
    const int64_t plane = p->Hp * p->Wp, oc = c->out_channels;
    const int dev = r->place == H3_PLACE_DEVICE;
    for (int64_t ch = 0; ch < oc; ch++) {
        h3_tensor s = vv_v(r, off + ch * nf * plane * 4, H3_F32, n * p->Hp, p->Wp, p->Wp);
        if (r->out->range == H3_PIXELS_UNIT) {
            float m = ch < 3 ? h3_imagenet_mean[ch] : 0.0f, sd = ch < 3 ? h3_imagenet_std[ch] : 1.0f;
            H3_TRY(h3_op_scale(r->ex, &s, &s, sd, m));
            H3_TRY(h3_op_clamp(r->ex, &s, &s, 0.0f, 1.0f));
        }
        if (r->out->frames) {
            h3_tensor d;
            int64_t s2[2] = {n * p->Hp, p->Wp};
            h3_tensor_wrap(&d, (float *)r->out->frames->data + (ch * p->frames + first) * plane,
                           H3_PLACE_HOST, H3_F32, 2, s2);
            H3_TRY(h3_copy(r->ex, &d, &s));
        }
        if (dev && r->out->on_frames) {
            h3_tensor d;
            int64_t s2[2] = {n * p->Hp, p->Wp};
            h3_tensor_wrap(&d, r->fh + ch * n * plane, H3_PLACE_PINNED, H3_F32, 2, s2);
            H3_TRY(h3_copy(r->ex, &d, &s));
        }
    }
    if (r->out->on_frames) {
        h3_tensor f;
        int64_t shape[4] = {oc, n, p->Hp, p->Wp};
        if (dev) H3_TRY(h3_exec_sync(r->ex));
        h3_tensor_wrap(&f, dev ? (void *)r->fh : (void *)(r->ar + off), H3_PLACE_HOST, H3_F32, 4, shape);
        f.stride[0] = (dev ? n : nf) * plane;
        H3_TRY_CTX(r->out->on_frames(r->out->user, &f, first), "handing out frames %lld..%lld",
                   (long long)first, (long long)(first + n - 1));
    }
    r->delivered = first + n;
    return H3_OK;
}

/* Cross-fade: canvas frames [0, e) become prev·(1 − k/e) + canvas·(k/e), prev the last e frames of the
 * previous chunk's look-ahead. */
static h3_status vv_crossfade(vv_run *r) {
    const vv_plan *p = r->p;
    int64_t Fc = p->main_frames + p->ovl_frames, plane = p->Hp * p->Wp;
    int64_t e = p->ovl_frames < p->main_frames ? p->ovl_frames : p->main_frames;
    if (p->fov < e) e = p->fov;
    for (int64_t ch = 0; ch < r->c->out_channels; ch++)
        for (int64_t k = 0; k < e; k++) {
            float wb = (float)k / (float)e, wa = 1.0f - wb;
            int64_t cur = p->o_canvas + (ch * Fc + k) * plane * 4;
            int64_t prv = p->o_prev + (ch * p->ovl_frames + p->ovl_frames - e + k) * plane * 4;
            h3_tensor a = vv_v(r, prv, H3_F32, p->Hp, p->Wp, p->Wp),
                      b = vv_v(r, cur, H3_F32, p->Hp, p->Wp, p->Wp);
            H3_TRY(h3_op_scale(r->ex, &a, &a, wa, 0.0f));
            H3_TRY(h3_op_scale(r->ex, &b, &b, wb, 0.0f));
            H3_TRY(h3_op_binary(r->ex, &b, &b, &a, H3_BINARY_ADD));
        }
    return H3_OK;
}

/* Chunk i's raw canvas from its rank (i mod n, not 0) to rank 0's canvas: one collective every rank calls. */
static h3_status vv_gather_chunk(vv_run *r, h3_comm *comm, int from) {
    int64_t sc[H3_COMM_MAX_RANKS], sd[H3_COMM_MAX_RANKS], rc[H3_COMM_MAX_RANKS], rd[H3_COMM_MAX_RANKS];
    const int64_t bytes = vv_canvas_bytes(r->c, r->p);
    for (int j = 0; j < comm->size; j++) sc[j] = sd[j] = rc[j] = rd[j] = 0;
    if (comm->rank == from) sc[0] = bytes;
    if (comm->rank == 0) rc[from] = bytes;
    void *canvas = r->ar + r->p->o_canvas;
    return comm->alltoallv(comm, r->ex, canvas, sc, sd, canvas, rc, rd);
}

static h3_status vv_decode(h3_video_vae *v, h3_exec *ex, const h3_tensor *latents,
                           const h3_video_decode_out *out, h3_comm *comm) {
    const h3_video_vae_config *c = &v->cfg;
    const int ranks = comm ? comm->size : 1, me = comm ? comm->rank : 0;
    H3_TRY(h3_video_vae_check_latents(c, latents));
    if (me == 0 && (!out || (!out->on_frames && !out->frames)))
        return H3_ERR(H3_ERR_INVALID, "video decode: give a frame callback or an output tensor");
    int off = latents->ndim == 5;
    int64_t T = latents->shape[off + 1], H = latents->shape[off + 2], W = latents->shape[off + 3];
    const h3_video_vae_mem *m = v->pl ? &v->pl->plan : NULL;
    const h3_place place = m ? m->place : H3_PLACE_HOST;
    if (m && (m->H != H || m->W != W))
        return H3_ERR(H3_ERR_INVALID,
                      "video decode: the decoder was placed for %lld × %lld latents, these are %lld × "
                      "%lld (place it again for them)",
                      (long long)m->H, (long long)m->W, (long long)H, (long long)W);
    if (place == H3_PLACE_DEVICE && !ex->cuda)
        return H3_ERR(H3_ERR_INVALID, "video decode: the decoder is placed on the device; the exec has none");
    if (v->created && !(m && m->packed))
        return H3_ERR(H3_ERR_INVALID,
                      "this video VAE was created without weights: place it with a random seed");
    vv_plan *p = h3_malloc(sizeof *p, H3_MEM_OTHER);
    if (!p) return H3_ERR_NOMEM;
    h3_status st = H3_OK;
    vv_run r;
    memset(&r, 0, sizeof r);
    uint8_t *mirror = NULL;
    int io_held = 0;
    const int packed = m && m->packed;
    H3_CHECK(vv_make_plan(c, T, H, W, m ? m->tile_batch : 1, m ? m->rows_per_step : v->rows_per_step,
                          place == H3_PLACE_DEVICE ? H3_BF16 : H3_F32, !packed && c->fused_qkv, p));
    if (out && out->frames) {
        h3_tensor *o = out->frames;
        int oo = o->ndim == 5;
        char s[96];
        if (!((o->ndim == 4 || (oo && o->shape[0] == 1)) && o->dtype == H3_F32 &&
              h3_tensor_is_contiguous(o) && o->shape[oo] == c->out_channels &&
              o->shape[oo + 1] == p->frames && o->shape[oo + 2] == p->Hp && o->shape[oo + 3] == p->Wp &&
              o->place != H3_PLACE_DEVICE))
            H3_FAIL(H3_ERR_INVALID,
                    "video decode: the output must be contiguous f32 [%d, %lld, %lld, %lld], got %s",
                    c->out_channels, (long long)p->frames, (long long)p->Hp, (long long)p->Wp,
                    h3_tensor_shape_str(o, s, sizeof s));
    }
    r.v = v;
    r.ex = ex;
    r.c = c;
    r.p = p;
    r.place = place;
    r.out = out;
    r.lat = latents->data;
    r.gate_first = v->layout != H3_LAYOUT_DIFFUSERS;
    /* the arena (one allocation), its tables, the host's staging */
    if (place == H3_PLACE_DEVICE) {
        struct h3_memrep *rep = v->pl->rep;
        h3_devcat prev = rep ? h3_memrep_set_category(rep, H3_DEVCAT_ACTIVATIONS) : H3_DEVCAT_ACTIVATIONS;
        r.ar = h3_place_alloc(H3_PLACE_DEVICE, (size_t)p->total, H3_MEM_ACTIVATIONS);
        if (rep) h3_memrep_set_category(rep, prev);
    } else {
        r.ar = h3_malloc((size_t)p->total, H3_MEM_ACTIVATIONS);
    }
    if (!r.ar)
        H3_FAIL(H3_ERR_NOMEM, "out of %s memory for the video decode's %lld MiB of buffers",
                place == H3_PLACE_DEVICE ? "device" : "host", (long long)(p->total >> 20));
    if (place == H3_PLACE_DEVICE) {
        mirror = h3_malloc((size_t)p->tables_end, H3_MEM_IO);
        if (!mirror) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        vv_tables(c, p, mirror);
        h3_tensor a = vv_vec(&r, 0, H3_U8, p->tables_end), hm;
        int64_t n = p->tables_end;
        h3_tensor_wrap(&hm, mirror, H3_PLACE_HOST, H3_U8, 1, &n);
        H3_CHECK(h3_copy(ex, &a, &hm));
        H3_CHECK(h3_exec_sync(ex));
        h3_free(mirror);
        mirror = NULL;
        r.zh = h3_calloc((size_t)(p->rows * c->latent_channels), sizeof(float), H3_MEM_IO);
        if (!r.zh) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        r.fh = v->pl->fh;
    } else {
        vv_tables(c, p, r.ar);
        r.zh = (float *)(r.ar + p->o_z);
        memset(r.zh, 0, (size_t)(p->rows * c->latent_channels) * sizeof(float));
    }
    H3_CHECK(vv_acquire(v, VV_IO, &r.io));
    io_held = 1;
    {
        const int64_t Rg = c->num_register_tokens, dim = (int64_t)c->heads * c->head_dim;
        h3_tensor e = vv_v(&r, p->o_extra, H3_F32, p->nb * (Rg + 1), dim, dim);
        H3_CHECK(h3_op_fill(ex, &e, 0.0f));
        for (int b = 0; b < p->nb && Rg > 0; b++) {
            h3_tensor d = vv_v(&r, p->o_extra + (int64_t)b * (Rg + 1) * dim * 4, H3_F32, Rg, dim, dim);
            H3_CHECK(h3_op_convert(ex, &d, &r.io.t[W_REG]));
        }
    }
    /* Chunks in rounds of `ranks`: each rank decodes its chunk of the round (k0 + rank) at once, then rank 0
     * finishes the round's chunks in order, taking each other rank's raw canvas into its own when its turn
     * comes. */
    int64_t first = 0;
    for (int k0 = 0; k0 < p->chunks; k0 += ranks) {
        const int i = k0 + me;
        for (int t0 = 0; i < p->chunks && t0 < p->nt; t0 += p->nb) {
            const int nbp = p->nt - t0 < p->nb ? p->nt - t0 : p->nb;
            H3_CHECK_CTX(vv_pass(&r, i, t0, nbp), "decoding chunk %d of %d, tiles %d to %d of %d", i + 1,
                         p->chunks, t0 + 1, t0 + nbp, p->nt);
        }
        for (int j = 0; j < ranks && k0 + j < p->chunks; j++) {
            if (j > 0)
                H3_CHECK_CTX(vv_gather_chunk(&r, comm, j), "chunk %d of %d from rank %d", k0 + j + 1,
                             p->chunks, j);
            if (me != 0) continue;
            if (k0 + j > 0 && p->ovl_frames) H3_CHECK(vv_crossfade(&r));
            int64_t Fc = p->main_frames + p->ovl_frames, plane = p->Hp * p->Wp;
            if (p->ovl_frames) /* keep the raw look-ahead before the delivered frames are converted */
                for (int64_t ch = 0; ch < c->out_channels; ch++) {
                    h3_tensor s = vv_v(&r, p->o_canvas + (ch * Fc + p->main_frames) * plane * 4, H3_F32,
                                       p->ovl_frames * p->Hp, p->Wp, p->Wp);
                    h3_tensor d = vv_v(&r, p->o_prev + ch * p->ovl_frames * plane * 4, H3_F32,
                                       p->ovl_frames * p->Hp, p->Wp, p->Wp);
                    H3_CHECK(h3_op_convert(ex, &d, &s));
                }
            H3_CHECK(vv_deliver(&r, p->o_canvas, Fc, p->main_frames, first));
            first += p->main_frames;
        }
    }
    if (me == 0 && p->ovl_frames) H3_CHECK(vv_deliver(&r, p->o_prev, p->ovl_frames, p->ovl_frames, first));
    if (v->pl && v->pl->u) H3_CHECK(h3_units_sync(v->pl->u));
    if (me == 0 && r.delivered != p->frames)
        H3_FAIL(H3_ERR_INTERNAL, "video decode delivered %lld frames of %lld", (long long)r.delivered,
                (long long)p->frames);
done:
    if (io_held) vv_release(v, VV_IO);
    if (place == H3_PLACE_DEVICE) {
        h3_status s2 = h3_exec_sync(ex); /* nothing queued may still use the arena */
        if (st == H3_OK) st = s2;
        if (r.ar) h3_place_free(H3_PLACE_DEVICE, r.ar, (size_t)p->total, H3_MEM_ACTIVATIONS);
        h3_free(r.zh);
    } else {
        h3_free(r.ar);
    }
    h3_free(mirror);
    h3_free(p);
    return st;
}

h3_status h3_video_vae_decode(h3_video_vae *v, h3_exec *ex, const h3_tensor *latents,
                              const h3_video_decode_out *out) {
    return vv_decode(v, ex, latents, out, NULL);
}

h3_status h3_video_vae_decode_split(h3_video_vae *v, h3_exec *ex, const h3_tensor *latents,
                                    const h3_video_decode_out *out, h3_comm *comm) {
    if (comm && comm->size < 2) comm = NULL;
    const h3_status st = vv_decode(v, ex, latents, out, comm);
    if (st != H3_OK && comm && comm->abort)
        comm->abort(comm); /* the others may wait for this rank's chunks */
    return st;
}

h3_status h3_video_vae_create(const h3_video_vae_config *c, h3_video_vae **out) {
    *out = NULL;
    if (c->num_layers < 1 || c->heads < 1 || c->head_dim < 1 || c->rope_dim % 6 ||
        c->rope_dim > c->head_dim || c->patch_size < 1 || c->patch_size_t < 1 || c->latent_channels < 1 ||
        c->latent_channels > H3_VVAE_MAX_CHANNELS || c->out_channels < 1 || c->ffn_inner < 1 ||
        c->num_register_tokens < 0 || c->clip_length < 1 || c->token_drop < 0)
        return H3_ERR(H3_ERR_INVALID, "video VAE config is inconsistent");
    h3_video_vae *v = h3_calloc(1, sizeof *v, H3_MEM_OTHER);
    if (!v) return H3_ERR_NOMEM;
    v->cfg = *c;
    v->cfg.weight_dtype = H3_BF16;
    v->cfg.fused_qkv = 1;
    v->layout = H3_LAYOUT_OFFICIAL;
    v->created = 1;
    vv_find_ids(v);
    v->rows_per_step = 512;
    v->source = h3_strdup("(created in memory)");
    if (!v->source) {
        h3_free(v);
        return H3_ERR_NOMEM;
    }
    *out = v;
    return H3_OK;
}

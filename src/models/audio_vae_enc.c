/* The audio VAE encoder (audio_vae_enc.h): its weights as f32 copies, the encode through the op API. */
#include "models/audio_vae_enc.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "cuda/cuda.h"
#include "io/wbind.h"

typedef struct {
    h3_tensor w, b; /* f32 [cout, cin, k], [cout] (b empty when the conv has none) */
} aenc_conv;

typedef struct {
    h3_tensor a0, a1;      /* the two Snakes' alpha [C] */
    aenc_conv c7, c1;      /* the dilated k7 conv and the k1 conv */
} aenc_res;

typedef struct {
    aenc_res res[3];
    h3_tensor alpha; /* [C] */
    aenc_conv down;  /* C -> 2C, kernel 2s, stride s */
} aenc_stage;

/* The convolution stack: what runs at the samples' rate (the encode's work), on the host or the device. */
typedef struct {
    aenc_conv conv0, conv_out;
    aenc_stage stage[H3_AENC_MAX_STAGES];
    h3_tensor alpha_out; /* [top] */
} aenc_stack;

struct h3_audio_enc {
    h3_audio_enc_config cfg;
    h3_audio_vae *vae;
    aenc_stack host, dev; /* dev: f32 device copies of host's tensors while placed on the device */
    h3_place place;
    /* pre_block */
    h3_tensor n1w, n1b, n3w, n3b, n2w, n2b, mnw, mnb;
    h3_tensor qkv_w, qkv_b;       /* [3L, L], [3L] = q_bias | 0 | v_bias */
    h3_tensor pool;               /* [C, L]: mean over heads, then adaptive average pooling of the head width */
    h3_tensor ap_w, ap_b;         /* attn.proj [C, C] */
    h3_tensor pr_w, pr_b;         /* proj [C, L] */
    h3_tensor w0, b0, w1, b1, w2, b2;
    h3_tensor mean_w, mean_b;     /* [C, C] (the 1×1 conv), [C] */
};

static const int g_dil[3] = {1, 3, 9};

/* ---- weights ------------------------------------------------------------------------------------------ */

typedef struct {
    h3_audio_enc *e;
    h3_st_set *set;
    h3_wbind wb;
    const char *src; /* names the weights in messages */
} loader;

static const h3_wb_unit g_unit = {"audio VAE encoder", 0, -1};

/* An f32 copy of `name` with ndim dims of the given shape (H3_WB_ANY: free); out-of-shape or missing names the
 * tensor. */
static h3_status load(loader *L, const char *name, int nd, const int64_t *shape, const char *words, h3_tensor *out) {
    h3_wb_row r = h3_wb_row_make(name, NULL, nd, nd > 0 ? shape[0] : 0, nd > 1 ? shape[1] : 0,
                                 nd > 2 ? shape[2] : 0, 0, H3_WB_FLOATS, 0, words, g_unit);
    const h3_st_entry *en = NULL;
    H3_TRY(h3_wb_check(&L->wb, &r, &en, NULL));
    h3_tensor t = {0};
    H3_TRY(h3_st_tensor(L->set, en, &t));
    h3_status st = h3_tensor_alloc(out, H3_PLACE_HOST, H3_F32, t.ndim, t.shape, H3_MEM_WEIGHTS);
    if (st == H3_OK && !h3_convert_to_f32(t.dtype, t.data, out->data, (size_t)h3_tensor_numel(&t)))
        st = H3_ERR(H3_ERR_UNSUPPORTED, "%s: tensor '%s' cannot be read as f32", L->src, name);
    h3_tensor_free(&t);
    if (st != H3_OK) h3_tensor_free(out);
    return st;
}

static h3_status load1(loader *L, const char *name, int64_t n, const char *words, h3_tensor *out) {
    const int64_t s[1] = {n};
    return load(L, name, 1, s, words, out);
}

/* Snake's alpha, stored [1, C, 1] (or [C]): an f32 [C]. */
static h3_status load_alpha(loader *L, const char *name, int64_t C, h3_tensor *out) {
    const h3_st_entry *en = h3_st_find(L->set, name);
    const int64_t s3[3] = {1, C, 1};
    H3_TRY(load(L, name, en && en->ndim == 1 ? 1 : 3, en && en->ndim == 1 ? &s3[1] : s3, "[1, channels, 1]", out));
    out->ndim = 1;
    out->shape[0] = C;
    out->stride[0] = 1;
    return H3_OK;
}

/* A conv of `base`: its weight plain (`.weight`) or weight-normalized (folded here), and its bias. */
static h3_status load_conv(loader *L, const char *base, int64_t cout, int64_t cin, int64_t k, int bias,
                           aenc_conv *c) {
    char name[192], gname[192], words[96];
    const int64_t s[3] = {cout, cin, k};
    snprintf(words, sizeof words, "[%lld, %lld, %lld] (out, in, kernel)", (long long)cout, (long long)cin,
             (long long)k);
    snprintf(name, sizeof name, "%s.weight", base);
    if (h3_st_find(L->set, name)) {
        H3_TRY(load(L, name, 3, s, words, &c->w));
    } else {
        if (!h3_weight_norm_names(L->set, base, gname, name, sizeof name)) {
            snprintf(name, sizeof name, "%s.weight", base);
            return h3_wb_missing_error(&L->wb, name, &g_unit, "a weight (or weight_g and weight_v)");
        }
        const int64_t gs[3] = {cout, 1, 1};
        h3_tensor g = {0}, v = {0};
        h3_status st = load(L, gname, 3, gs, "[out, 1, 1] (weight norm's magnitudes)", &g);
        if (st == H3_OK) st = load(L, name, 3, s, words, &v);
        char what[320];
        snprintf(what, sizeof what, "%s: '%s'", L->src, name);
        if (st == H3_OK) st = h3_weight_norm_fold(&g, &v, what, &c->w);
        h3_tensor_free(&g);
        h3_tensor_free(&v);
        H3_TRY(st);
    }
    if (bias) {
        snprintf(name, sizeof name, "%s.bias", base);
        H3_TRY(load1(L, name, cout, "[out]", &c->b));
    }
    return H3_OK;
}


/* The shape of `name` (or H3_ERR_FORMAT naming it when absent) */
static h3_status shape_of(loader *L, const char *name, const char *words, int64_t *s, int *nd) {
    const h3_st_entry *en = h3_st_find(L->set, name);
    if (!en) return h3_wb_missing_error(&L->wb, name, &g_unit, words);
    *nd = en->ndim;
    for (int i = 0; i < en->ndim; i++) s[i] = en->shape[i];
    return H3_OK;
}

/* The stages and widths from the tensors: the first conv's output channels, each stage's strided conv (kernel
 * 2s), the last conv's output (latent_dim), mean_proj's channels. */
static h3_status read_config(loader *L, h3_audio_enc_config *c) {
    char name[160];
    int64_t s[H3_MAX_DIMS];
    int nd = 0;
    memset(c, 0, sizeof *c);
    const char *first = h3_st_find(L->set, "encoder.block.0.weight") ? "encoder.block.0.weight"
                        : h3_st_find(L->set, "encoder.block.0.parametrizations.weight.original1")
                            ? "encoder.block.0.parametrizations.weight.original1"
                            : "encoder.block.0.weight_v";
    if (!h3_st_find(L->set, first))
        return H3_ERR(H3_ERR_FORMAT,
                      "%s has no audio VAE encoder (no tensor encoder.block.0.weight or .weight_v): this file "
                      "holds the decoder only; use the release's audio_vae/ (or its diffusers folder)",
                      L->src);
    H3_TRY(shape_of(L, first, "[encoder_dim, 1, 7]", s, &nd));
    if (nd != 3 || s[1] != 1 || s[2] != 7 || s[0] < 1 || s[0] > 65536)
        return h3_wb_shape_error(&L->wb, first, nd, s, &g_unit, "[encoder_dim, 1, 7]");
    c->encoder_dim = (int)s[0];
    c->hop = 1;
    for (int i = 0; i < H3_AENC_MAX_STAGES + 1; i++) {
        const char *forms[3] = {"weight", "weight_v", "parametrizations.weight.original1"};
        int found = 0;
        for (int f = 0; f < 3 && !found; f++) {
            snprintf(name, sizeof name, "encoder.block.%d.block.4.%s", i + 1, forms[f]);
            found = h3_st_find(L->set, name) != NULL;
        }
        if (!found) break;
        if (i == H3_AENC_MAX_STAGES)
            return H3_ERR(H3_ERR_FORMAT, "%s: more than %d audio encoder stages", L->src,
                          H3_AENC_MAX_STAGES);
        H3_TRY(shape_of(L, name, "[2C, C, 2·stride]", s, &nd));
        const int64_t cin = (int64_t)c->encoder_dim << i;
        if (nd != 3 || s[0] != 2 * cin || s[1] != cin || s[2] < 2 || s[2] % 2 || s[2] > 64)
            return h3_wb_shape_error(&L->wb, name, nd, s, &g_unit, "[%lld, %lld, 2·stride]", (long long)(2 * cin),
                                     (long long)cin);
        c->strides[c->n_stages++] = (int)(s[2] / 2);
        c->hop *= (int)(s[2] / 2);
    }
    if (!c->n_stages)
        return H3_ERR(H3_ERR_FORMAT, "%s: the audio VAE encoder has no stage (encoder.block.1.block.4)",
                      L->src);
    H3_TRY(shape_of(L, "mean_proj.weight", "[latent channels, latent channels, 1]", s, &nd));
    if (nd != 3 || s[0] != s[1] || s[2] != 1 || s[0] < 1 || s[0] > H3_AVAE_MAX_CHANNELS)
        return h3_wb_shape_error(&L->wb, "mean_proj.weight", nd, s, &g_unit, "[C, C, 1] with C <= %d",
                                 H3_AVAE_MAX_CHANNELS);
    c->latent_channels = (int)s[0];
    H3_TRY(shape_of(L, "pre_block.norm1.weight", "[latent_dim]", s, &nd));
    if (nd != 1 || s[0] < 8 || s[0] % 8)
        return h3_wb_shape_error(&L->wb, "pre_block.norm1.weight", nd, s, &g_unit, "[latent_dim], a multiple of 8");
    c->latent_dim = (int)s[0];
    c->heads = 8; /* the release's pre_block: not in any config */
    return H3_OK;
}

static h3_status load_all(loader *L) {
    h3_audio_enc *e = L->e;
    const h3_audio_enc_config *c = &e->cfg;
    char n[192];
    const int64_t Ld = c->latent_dim, C = c->latent_channels, top = (int64_t)c->encoder_dim << c->n_stages;
    H3_TRY(load_conv(L, "encoder.block.0", c->encoder_dim, 1, 7, 1, &e->host.conv0));
    for (int i = 0; i < c->n_stages; i++) {
        const int64_t h = (int64_t)c->encoder_dim << i;
        aenc_stage *sg = &e->host.stage[i];
        for (int r = 0; r < 3; r++) {
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.0.alpha", i + 1, r);
            H3_TRY(load_alpha(L, n, h, &sg->res[r].a0));
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.1", i + 1, r);
            H3_TRY(load_conv(L, n, h, h, 7, 1, &sg->res[r].c7));
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.2.alpha", i + 1, r);
            H3_TRY(load_alpha(L, n, h, &sg->res[r].a1));
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.3", i + 1, r);
            H3_TRY(load_conv(L, n, h, h, 1, 1, &sg->res[r].c1));
        }
        snprintf(n, sizeof n, "encoder.block.%d.block.3.alpha", i + 1);
        H3_TRY(load_alpha(L, n, h, &sg->alpha));
        snprintf(n, sizeof n, "encoder.block.%d.block.4", i + 1);
        H3_TRY(load_conv(L, n, 2 * h, h, 2 * c->strides[i], 1, &sg->down));
    }
    snprintf(n, sizeof n, "encoder.block.%d.alpha", c->n_stages + 1);
    H3_TRY(load_alpha(L, n, top, &e->host.alpha_out));
    snprintf(n, sizeof n, "encoder.block.%d", c->n_stages + 2);
    H3_TRY(load_conv(L, n, Ld, top, 3, 1, &e->host.conv_out));
    /* pre_block */
    H3_TRY(load1(L, "pre_block.norm1.weight", Ld, "[latent_dim]", &e->n1w));
    H3_TRY(load1(L, "pre_block.norm1.bias", Ld, "[latent_dim]", &e->n1b));
    H3_TRY(load1(L, "pre_block.norm3.weight", Ld, "[latent_dim]", &e->n3w));
    H3_TRY(load1(L, "pre_block.norm3.bias", Ld, "[latent_dim]", &e->n3b));
    H3_TRY(load1(L, "pre_block.norm2.weight", C, "[latent channels]", &e->n2w));
    H3_TRY(load1(L, "pre_block.norm2.bias", C, "[latent channels]", &e->n2b));
    H3_TRY(load1(L, "pre_block.mlp.norm.weight", C, "[latent channels]", &e->mnw));
    H3_TRY(load1(L, "pre_block.mlp.norm.bias", C, "[latent channels]", &e->mnb));
    const int64_t sq[2] = {3 * Ld, Ld}, sap[2] = {C, C}, spr[2] = {C, Ld}, sw01[2] = {2 * C, C},
                  sw2[2] = {C, 2 * C};
    H3_TRY(load(L, "pre_block.attn.qkv.weight", 2, sq, "[3·latent_dim, latent_dim]", &e->qkv_w));
    {
        h3_tensor qb = {0}, vb = {0};
        h3_status st = load1(L, "pre_block.attn.q_bias", Ld, "[latent_dim]", &qb);
        if (st == H3_OK) st = load1(L, "pre_block.attn.v_bias", Ld, "[latent_dim]", &vb);
        if (st == H3_OK) st = h3_tensor_alloc2(&e->qkv_b, H3_PLACE_HOST, H3_F32, 1, 3 * Ld, H3_MEM_WEIGHTS);
        if (st == H3_OK) {
            float *b = e->qkv_b.data;
            memcpy(b, qb.data, (size_t)Ld * sizeof(float));
            memset(b + Ld, 0, (size_t)Ld * sizeof(float)); /* the key's bias is zero (zero_k_bias) */
            memcpy(b + 2 * Ld, vb.data, (size_t)Ld * sizeof(float));
            e->qkv_b.ndim = 1;
            e->qkv_b.shape[0] = 3 * Ld;
            e->qkv_b.stride[0] = 1;
        }
        h3_tensor_free(&qb);
        h3_tensor_free(&vb);
        H3_TRY(st);
    }
    H3_TRY(load(L, "pre_block.attn.proj.weight", 2, sap, "[latent channels, latent channels]", &e->ap_w));
    H3_TRY(load1(L, "pre_block.attn.proj.bias", C, "[latent channels]", &e->ap_b));
    H3_TRY(load(L, "pre_block.proj.weight", 2, spr, "[latent channels, latent_dim]", &e->pr_w));
    H3_TRY(load1(L, "pre_block.proj.bias", C, "[latent channels]", &e->pr_b));
    H3_TRY(load(L, "pre_block.mlp.w0.weight", 2, sw01, "[2·latent channels, latent channels]", &e->w0));
    H3_TRY(load1(L, "pre_block.mlp.w0.bias", 2 * C, "[2·latent channels]", &e->b0));
    H3_TRY(load(L, "pre_block.mlp.w1.weight", 2, sw01, "[2·latent channels, latent channels]", &e->w1));
    H3_TRY(load1(L, "pre_block.mlp.w1.bias", 2 * C, "[2·latent channels]", &e->b1));
    H3_TRY(load(L, "pre_block.mlp.w2.weight", 2, sw2, "[latent channels, 2·latent channels]", &e->w2));
    H3_TRY(load1(L, "pre_block.mlp.w2.bias", C, "[latent channels]", &e->b2));
    {
        const int64_t s3[3] = {C, C, 1};
        H3_TRY(load(L, "mean_proj.weight", 3, s3, "[latent channels, latent channels, 1]", &e->mean_w));
        e->mean_w.ndim = 2;
        e->mean_w.stride[0] = C;
        e->mean_w.stride[1] = 1;
        H3_TRY(load1(L, "mean_proj.bias", C, "[latent channels]", &e->mean_b));
    }
    /* the pooling matrix: pooled[c] = (1/H) Σ_h mean_{d in bin c} o[h, d], bins of PyTorch's adaptive pooling */
    const int64_t H = c->heads, Dh = Ld / H;
    H3_TRY(h3_tensor_alloc2(&e->pool, H3_PLACE_HOST, H3_F32, C, Ld, H3_MEM_WEIGHTS));
    float *P = e->pool.data;
    memset(P, 0, (size_t)(C * Ld) * sizeof(float));
    for (int64_t i = 0; i < C; i++) {
        const int64_t a = (i * Dh) / C, b = ((i + 1) * Dh + C - 1) / C;
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = a; d < b; d++) P[i * Ld + h * Dh + d] = (float)(1.0 / ((double)H * (double)(b - a)));
    }
    return H3_OK;
}

h3_status h3_audio_enc_config_of(h3_audio_vae *v, h3_audio_enc_config *out) {
    h3_audio_enc e;
    memset(&e, 0, sizeof e);
    loader L = {&e, h3_audio_vae_weights(v), {0}, h3_audio_vae_source(v)};
    L.wb = (h3_wbind){L.set, "", NULL, "audio VAE", NULL, NULL};
    return read_config(&L, out);
}

h3_status h3_audio_enc_open(h3_audio_vae *v, h3_audio_enc **out) {
    *out = NULL;
    if (h3_audio_vae_headers_only(v))
        return H3_ERR(H3_ERR_INVALID, "the audio VAE was opened for planning (headers only): open it to encode");
    h3_audio_enc *e = h3_calloc(1, sizeof *e, H3_MEM_OTHER);
    if (!e) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    e->vae = v;
    loader L = {e, h3_audio_vae_weights(v), {0}, h3_audio_vae_source(v)};
    L.wb = (h3_wbind){L.set, "", NULL, "audio VAE", NULL, NULL};
    h3_status st = read_config(&L, &e->cfg);
    if (st == H3_OK) st = load_all(&L);
    if (st != H3_OK) {
        h3_audio_enc_close(e);
        return st;
    }
    *out = e;
    return H3_OK;
}

/* Every tensor of a stack, in one order (for freeing and copying). Returns how many (at most n). */
static int stack_tensors(aenc_stack *k, h3_tensor **out, int n) {
    int m = 0;
#define PUT(t)                                                                                                      \
    do {                                                                                                           \
        if (m < n) out[m] = (t);                                                                                   \
        m++;                                                                                                       \
    } while (0)
    PUT(&k->conv0.w);
    PUT(&k->conv0.b);
    PUT(&k->conv_out.w);
    PUT(&k->conv_out.b);
    PUT(&k->alpha_out);
    for (int i = 0; i < H3_AENC_MAX_STAGES; i++) {
        aenc_stage *sg = &k->stage[i];
        for (int r = 0; r < 3; r++) {
            PUT(&sg->res[r].a0);
            PUT(&sg->res[r].a1);
            PUT(&sg->res[r].c7.w);
            PUT(&sg->res[r].c7.b);
            PUT(&sg->res[r].c1.w);
            PUT(&sg->res[r].c1.b);
        }
        PUT(&sg->alpha);
        PUT(&sg->down.w);
        PUT(&sg->down.b);
    }
#undef PUT
    return m;
}
#define AENC_STACK_TENSORS (5 + H3_AENC_MAX_STAGES * 21)

static void stack_free(aenc_stack *k) {
    h3_tensor *ts[AENC_STACK_TENSORS];
    const int n = stack_tensors(k, ts, AENC_STACK_TENSORS);
    for (int i = 0; i < n; i++) h3_tensor_free(ts[i]);
}

void h3_audio_enc_close(h3_audio_enc *e) {
    if (!e) return;
    stack_free(&e->host);
    stack_free(&e->dev);
    h3_tensor *ts[] = {&e->n1w, &e->n1b, &e->n3w, &e->n3b, &e->n2w, &e->n2b, &e->mnw,
                       &e->mnb, &e->qkv_w, &e->qkv_b, &e->pool, &e->ap_w, &e->ap_b, &e->pr_w, &e->pr_b,
                       &e->w0,  &e->b0,  &e->w1,  &e->b1,  &e->w2,  &e->b2,  &e->mean_w, &e->mean_b};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) h3_tensor_free(ts[i]);
    h3_free(e);
}

h3_status h3_audio_enc_place(h3_audio_enc *e, h3_exec *ex, h3_place place) {
    if (place == H3_PLACE_HOST || place == H3_PLACE_PINNED) {
        stack_free(&e->dev);
        e->place = H3_PLACE_HOST;
        return H3_OK;
    }
    if (place != H3_PLACE_DEVICE) return H3_ERR(H3_ERR_INVALID, "audio VAE encoder: unknown placement %d", (int)place);
    if (!ex || !ex->cuda) return H3_ERR(H3_ERR_INVALID, "the audio VAE encoder's device placement needs a CUDA backend");
    if (e->place == H3_PLACE_DEVICE) return H3_OK;
    h3_tensor *src[AENC_STACK_TENSORS], *dst[AENC_STACK_TENSORS];
    const int n = stack_tensors(&e->host, src, AENC_STACK_TENSORS);
    stack_tensors(&e->dev, dst, AENC_STACK_TENSORS);
    h3_status st = H3_OK;
    for (int i = 0; i < n && st == H3_OK; i++) {
        if (!src[i]->data) continue; /* a stage or bias the model lacks */
        st = h3_tensor_alloc(dst[i], H3_PLACE_DEVICE, H3_F32, src[i]->ndim, src[i]->shape, H3_MEM_WEIGHTS);
        if (st == H3_OK) st = h3_copy(ex, dst[i], src[i]);
    }
    if (st == H3_OK) st = h3_exec_sync(ex);
    if (st != H3_OK) {
        stack_free(&e->dev);
        return h3_error_wrap(st, "placing the audio VAE encoder on the device");
    }
    e->place = H3_PLACE_DEVICE;
    return H3_OK;
}

const h3_audio_enc_config *h3_audio_enc_get_config(const h3_audio_enc *e) {
    return &e->cfg;
}

int64_t h3_audio_enc_frames(const h3_audio_enc_config *c, int64_t samples) {
    return samples > 0 ? (samples + c->hop - 1) / c->hop : 0;
}

h3_status h3_audio_enc_check_wave(const h3_tensor *w) {
    if (w->dtype != H3_F32 || w->place != H3_PLACE_HOST || !h3_tensor_is_contiguous(w))
        return H3_ERR(H3_ERR_INVALID, "the waveform must be contiguous f32 on the host; got %s",
                      h3_dtype_name(w->dtype));
    if (!(w->ndim == 2 || (w->ndim == 3 && w->shape[1] == 1)))
        return H3_ERR(H3_ERR_INVALID, "the waveform must be [channels, 1, samples] or [channels, samples]; got %d dims",
                      w->ndim);
    const int64_t ch = w->shape[0], n = w->shape[w->ndim - 1];
    if (ch < 1 || ch > H3_AVAE_MAX_CHANNELS)
        return H3_ERR(H3_ERR_INVALID, "the waveform has %lld channels; 1 to %d", (long long)ch, H3_AVAE_MAX_CHANNELS);
    if (n < 1) return H3_ERR(H3_ERR_INVALID, "the waveform holds no samples");
    const float *x = w->data;
    for (int64_t i = 0; i < ch * n; i++)
        if (!isfinite(x[i]))
            return H3_ERR(H3_ERR_INVALID, "the waveform's sample %lld of channel %lld is not finite",
                          (long long)(i % n), (long long)(i / n));
    return H3_OK;
}

/* ---- the encode ---------------------------------------------------------------------------------------- */

/* The stack's ops allocate their outputs where x is (the host, or the device when the stack is placed there). */
static h3_status conv(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const aenc_conv *c, int stride, int dil,
                      int pad) {
    const h3_conv1d_params p = {stride, dil, 1, pad, pad, H3_PAD_ZEROS};
    const int64_t tout = (x->shape[1] + 2 * pad - dil * (c->w.shape[2] - 1) - 1) / stride + 1;
    H3_TRY(h3_tensor_alloc2(y, x->place, H3_F32, c->w.shape[0], tout, H3_MEM_ACTIVATIONS));
    return h3_op_conv1d(ex, y, x, &c->w, c->b.data ? &c->b : NULL, &p);
}

static h3_status snake(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *alpha) {
    H3_TRY(h3_tensor_alloc2(y, x->place, H3_F32, x->shape[0], x->shape[1], H3_MEM_ACTIVATIONS));
    return h3_op_snake(ex, y, x, alpha, NULL, 0);
}

/* y [rows, n] = x [rows, k] · wᵀ + b */
static h3_status linear(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b) {
    H3_TRY(h3_tensor_alloc2(y, H3_PLACE_HOST, H3_F32, x->shape[0], w->shape[0], H3_MEM_ACTIVATIONS));
    return h3_op_gemm(ex, y, x, w, b, 0);
}

static h3_status norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b) {
    H3_TRY(h3_tensor_alloc2(y, H3_PLACE_HOST, H3_F32, x->shape[0], x->shape[1], H3_MEM_ACTIVATIONS));
    return h3_op_layer_norm(ex, y, x, w, b, 1e-5f);
}

/* [a, b] -> [b, a] on the host */
static h3_status transpose(const h3_tensor *x, h3_tensor *y) {
    const int64_t a = x->shape[0], b = x->shape[1];
    H3_TRY(h3_tensor_alloc2(y, H3_PLACE_HOST, H3_F32, b, a, H3_MEM_ACTIVATIONS));
    const float *s = x->data;
    float *d = y->data;
    for (int64_t i = 0; i < a; i++)
        for (int64_t j = 0; j < b; j++) d[j * a + i] = s[i * b + j];
    return H3_OK;
}

/* One channel: x [1, samples] (a multiple of the hop) -> out [latent channels, frames]. */
static h3_status encode_one(h3_audio_enc *e, h3_exec *ex, h3_tensor *x, float *out) {
    const h3_audio_enc_config *c = &e->cfg;
    h3_status st = H3_OK;
    h3_tensor a = {0}, t = {0}, u = {0}, h = {0}, n = {0}, qkv = {0}, q = {0}, k = {0}, v = {0}, o = {0},
              p = {0}, m = {0}, g0 = {0}, g1 = {0}, z = {0}, dx = {0}, ah = {0};
    const int dev = e->place == H3_PLACE_DEVICE;
    const aenc_stack *S = dev ? &e->dev : &e->host;
    if (dev) { /* the samples to the device; the stack runs there */
        H3_CHECK(h3_tensor_alloc2(&dx, H3_PLACE_DEVICE, H3_F32, 1, x->shape[1], H3_MEM_ACTIVATIONS));
        H3_CHECK(h3_copy(ex, &dx, x));
        x = &dx;
    }
    H3_CHECK(conv(ex, &a, x, &S->conv0, 1, 1, 3));
    h3_tensor_free(&dx);
    for (int i = 0; i < c->n_stages; i++) {
        const aenc_stage *sg = &S->stage[i];
        for (int r = 0; r < 3; r++) {
            const int d = g_dil[r];
            H3_CHECK(snake(ex, &t, &a, &sg->res[r].a0));
            H3_CHECK(conv(ex, &u, &t, &sg->res[r].c7, 1, d, 3 * d));
            h3_tensor_free(&t);
            H3_CHECK(snake(ex, &t, &u, &sg->res[r].a1));
            h3_tensor_free(&u);
            H3_CHECK(conv(ex, &u, &t, &sg->res[r].c1, 1, 1, 0));
            h3_tensor_free(&t);
            H3_CHECK(h3_op_binary(ex, &a, &a, &u, H3_BINARY_ADD));
            h3_tensor_free(&u);
        }
        H3_CHECK(snake(ex, &t, &a, &sg->alpha));
        h3_tensor_free(&a);
        H3_CHECK(conv(ex, &a, &t, &sg->down, c->strides[i], 1, (c->strides[i] + 1) / 2));
        h3_tensor_free(&t);
    }
    H3_CHECK(snake(ex, &t, &a, &S->alpha_out));
    h3_tensor_free(&a);
    H3_CHECK(conv(ex, &a, &t, &S->conv_out, 1, 1, 1)); /* [latent_dim, T] */
    h3_tensor_free(&t);
    if (dev) { /* the latent frames back to the host: the pre_block is a few hundred rows */
        H3_CHECK(h3_tensor_alloc2(&ah, H3_PLACE_HOST, H3_F32, a.shape[0], a.shape[1], H3_MEM_ACTIVATIONS));
        H3_CHECK(h3_copy(ex, &ah, &a));
        h3_tensor_free(&a);
        a = ah;
        memset(&ah, 0, sizeof ah);
    }
    H3_CHECK(h3_exec_sync(ex));
    H3_CHECK(transpose(&a, &h)); /* [T, latent_dim] */
    h3_tensor_free(&a);
    const int64_t T = h.shape[0], Ld = c->latent_dim, C = c->latent_channels, H = c->heads, Dh = Ld / H;
    /* attention over the latent frames, causal; its heads averaged and pooled to C by one GEMM */
    H3_CHECK(norm(ex, &n, &h, &e->n1w, &e->n1b));
    H3_CHECK(linear(ex, &qkv, &n, &e->qkv_w, &e->qkv_b));
    h3_tensor_free(&n);
    H3_CHECK(h3_exec_sync(ex));
    const int64_t s3[3] = {T, H, Dh};
    H3_CHECK(h3_tensor_alloc(&q, H3_PLACE_HOST, H3_F32, 3, s3, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_tensor_alloc(&k, H3_PLACE_HOST, H3_F32, 3, s3, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_tensor_alloc(&v, H3_PLACE_HOST, H3_F32, 3, s3, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_tensor_alloc(&o, H3_PLACE_HOST, H3_F32, 3, s3, H3_MEM_ACTIVATIONS));
    for (int64_t r = 0; r < T; r++) {
        const float *row = (const float *)qkv.data + r * 3 * Ld;
        memcpy((float *)q.data + r * Ld, row, (size_t)Ld * sizeof(float));
        memcpy((float *)k.data + r * Ld, row + Ld, (size_t)Ld * sizeof(float));
        memcpy((float *)v.data + r * Ld, row + 2 * Ld, (size_t)Ld * sizeof(float));
    }
    H3_CHECK(h3_op_attention(ex, &o, &q, &k, &v, (float)(1.0 / sqrt((double)Dh)), H3_ATTN_CAUSAL));
    o.ndim = 2;
    o.shape[1] = Ld;
    o.stride[0] = Ld;
    o.stride[1] = 1;
    H3_CHECK(linear(ex, &p, &o, &e->pool, NULL));    /* [T, C] */
    H3_CHECK(linear(ex, &t, &p, &e->ap_w, &e->ap_b)); /* attn.proj */
    H3_CHECK(norm(ex, &n, &h, &e->n3w, &e->n3b));
    H3_CHECK(linear(ex, &u, &n, &e->pr_w, &e->pr_b)); /* proj(norm3(x)) */
    H3_CHECK(h3_op_binary(ex, &u, &u, &t, H3_BINARY_ADD));
    h3_tensor_free(&n);
    h3_tensor_free(&t);
    /* the GeGLU MLP: u + w2(gelu_tanh(w0(m)) · w1(m)), m = mlp.norm(norm2(u)) */
    H3_CHECK(norm(ex, &n, &u, &e->n2w, &e->n2b));
    H3_CHECK(norm(ex, &m, &n, &e->mnw, &e->mnb));
    H3_CHECK(linear(ex, &g0, &m, &e->w0, &e->b0));
    H3_CHECK(linear(ex, &g1, &m, &e->w1, &e->b1));
    H3_CHECK(h3_op_unary(ex, &g0, &g0, H3_UNARY_GELU_TANH));
    H3_CHECK(h3_op_binary(ex, &g0, &g0, &g1, H3_BINARY_MUL));
    H3_CHECK(linear(ex, &t, &g0, &e->w2, &e->b2));
    H3_CHECK(h3_op_binary(ex, &u, &u, &t, H3_BINARY_ADD));
    H3_CHECK(linear(ex, &z, &u, &e->mean_w, &e->mean_b)); /* mean_proj: [T, C] */
    H3_CHECK(h3_exec_sync(ex));
    for (int64_t r = 0; r < T; r++)
        for (int64_t ch = 0; ch < C; ch++) out[ch * T + r] = ((const float *)z.data)[r * C + ch];
done: {
    h3_tensor *ts[] = {&a, &t, &u, &h, &n, &qkv, &q, &k, &v, &o, &p, &m, &g0, &g1, &z, &dx, &ah};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) h3_tensor_free(ts[i]);
}
    return st;
}

h3_status h3_audio_enc_encode(h3_audio_enc *e, h3_exec *ex, const h3_tensor *wave, h3_tensor *latents) {
    memset(latents, 0, sizeof *latents);
    H3_TRY(h3_audio_enc_check_wave(wave));
    const h3_audio_enc_config *c = &e->cfg;
    const int64_t ch = wave->shape[0], n = wave->shape[wave->ndim - 1], T = h3_audio_enc_frames(c, n);
    const int64_t s[3] = {ch, c->latent_channels, T};
    H3_TRY(h3_tensor_alloc(latents, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_ACTIVATIONS));
    h3_status st = H3_OK;
    h3_tensor x = {0};
    H3_CHECK(h3_tensor_alloc2(&x, H3_PLACE_HOST, H3_F32, 1, T * c->hop, H3_MEM_ACTIVATIONS));
    for (int64_t i = 0; i < ch; i++) { /* right-padded with zeros to a multiple of the hop */
        memset(x.data, 0, (size_t)(T * c->hop) * sizeof(float));
        memcpy(x.data, (const float *)wave->data + i * n, (size_t)n * sizeof(float));
        H3_CHECK_CTX(encode_one(e, ex, &x, (float *)latents->data + i * c->latent_channels * T),
                     "the audio VAE encoder, channel %lld", (long long)i);
    }
done:
    h3_tensor_free(&x);
    if (st != H3_OK) h3_tensor_free(latents);
    return st;
}

h3_status h3_audio_enc_mem_of(const h3_audio_enc_config *c, int64_t samples, h3_audio_enc_mem *out) {
    memset(out, 0, sizeof *out);
    if (samples < 1 || c->n_stages < 1 || c->n_stages > H3_AENC_MAX_STAGES || c->hop < 1)
        return H3_ERR(H3_ERR_INVALID, "audio VAE encoder plan: bad sizes");
    /* the stack's tensors, each on its granules: conv0, per stage three residual units (k7 and k1 convs with
     * biases, two alphas), an alpha and the strided conv to 2C; the last alpha and conv_out */
#define W(n) h3_cuda_granule((int64_t)(n)*4)
    int64_t w = W(c->encoder_dim * 7) + W(c->encoder_dim), C = c->encoder_dim;
    for (int i = 0; i < c->n_stages; i++) {
        w += 3 * (W(C * C * 7) + W(C) + W(C * C) + W(C) + 2 * W(C)) + W(C) + W(2 * C * C * 2 * c->strides[i]) + W(2 * C);
        C *= 2;
    }
    w += W(C) + W((int64_t)c->latent_dim * C * 3) + W(c->latent_dim);
#undef W
    out->dev_weights = w;
    /* activations: the stage's running sum a, the Snake t and the conv u at a time, each at most C·T of the
     * widest (the first) stage, and the input samples; im2col's columns of the largest conv */
    const int64_t n = h3_audio_enc_frames(c, samples) * c->hop;
    int64_t T = n, big, scr = 0;
    C = c->encoder_dim;
    big = C * T;
    const h3_conv1d_params k7 = {1, 1, 1, 3, 3, H3_PAD_ZEROS};
    scr = h3_cuda_granule(h3_cuda_conv1d_scratch_bytes(1, 1, 7, n, &k7, 4));
    for (int i = 0; i < c->n_stages; i++) {
        for (int r = 0; r < 3; r++) {
            const h3_conv1d_params pr = {1, g_dil[r], 1, 3 * g_dil[r], 3 * g_dil[r], H3_PAD_ZEROS};
            const int64_t s7 = h3_cuda_granule(h3_cuda_conv1d_scratch_bytes(1, C, 7, T, &pr, 4));
            if (s7 > scr) scr = s7;
        }
        const int s = c->strides[i];
        const h3_conv1d_params pd = {s, 1, 1, (s + 1) / 2, (s + 1) / 2, H3_PAD_ZEROS};
        const int64_t tout = (T + 2 * ((s + 1) / 2) - 2 * s) / s + 1;
        const int64_t sd = h3_cuda_granule(h3_cuda_conv1d_scratch_bytes(1, C, 2 * s, tout, &pd, 4));
        if (sd > scr) scr = sd;
        C *= 2;
        T = tout;
        if (C * T > big) big = C * T;
    }
    const h3_conv1d_params k3 = {1, 1, 1, 1, 1, H3_PAD_ZEROS};
    const int64_t so = h3_cuda_granule(h3_cuda_conv1d_scratch_bytes(1, C, 3, T, &k3, 4));
    if (so > scr) scr = so;
    out->dev_buffers = 3 * h3_cuda_granule(big * 4) + h3_cuda_granule(n * 4) + h3_cuda_granule((int64_t)c->latent_dim * T * 4);
    out->dev_op_scratch = scr;
    out->dev_total = out->dev_weights + out->dev_buffers + out->dev_op_scratch;
    return H3_OK;
}

void h3_audio_enc_normalize(const h3_audio_vae_config *c, h3_tensor *latents) {
    const int64_t ch = latents->shape[0], C = latents->shape[1], T = latents->shape[2];
    float *x = latents->data;
    for (int64_t i = 0; i < ch; i++)
        for (int64_t k = 0; k < C && k < H3_AVAE_MAX_CHANNELS; k++)
            for (int64_t t = 0; t < T; t++) {
                float *p = x + (i * C + k) * T + t;
                *p = (*p - c->latents_mean[k]) / c->latents_std[k];
            }
}

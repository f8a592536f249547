/* The video VAE encoder: see video_vae_enc.h. */
#include "models/video_vae_enc.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/cancel.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "io/wbind.h"
#include "mem/pack.h"
#include "mem/units.h"

/* ---- weights: one table, bound through the video VAE's binder -------------------------------------------
 */

/* The tensors of the input and output layers (unit 0). */
enum { IO_CIN_W, IO_CIN_B, IO_NO_W, IO_NO_B, IO_CO_W, IO_CO_B, IO_Q_W, IO_Q_B, IO_N };
/* The tensors of a ResNet block; a level holds layers × R_BLOCK, then its downsampler's weight and bias. */
enum { R_N1W, R_N1B, R_C1W, R_C1B, R_N2W, R_N2B, R_C2W, R_C2B, R_SCW, R_SCB, R_BLOCK };
#define VE_LEVEL_N (H3_VENC_MAX_LAYERS * R_BLOCK + 2)
#define VE_DOWN    (H3_VENC_MAX_LAYERS * R_BLOCK)

struct h3_video_enc {
    h3_video_enc_config cfg;
    h3_layout layout;
    const h3_wbind *wb;
    h3_tensor io[IO_N];
    h3_tensor lv[H3_VVAE_MAX_LEVELS][VE_LEVEL_N];
    /* units: 0 the input and output layers, 1 + l level l; each with the local indices of its tensors in
     * pack order */
    int n_idx[H3_VVAE_MAX_LEVELS + 1];
    int idx[H3_VVAE_MAX_LEVELS + 1][VE_LEVEL_N];
    h3_units *host, *dev;
    h3_place place;
};

/* A unit's tensors as the encode uses them (views handed out by the units), by local index. */
typedef struct {
    h3_tensor t[VE_LEVEL_N];
} ve_part;

static int ve_has_shortcut(const h3_video_enc_config *c, int l, int j) {
    const int cin = j > 0 ? c->ch[l] : l > 0 ? c->ch[l - 1] : c->ch[0];
    return cin != c->ch[l];
}
static int ve_has_down(const h3_video_enc_config *c, int l) {
    return c->space_down[l] * c->time_down[l] > 1;
}

/* Name of a block tensor (role r of block j of level l) or of a level's downsampler (j < 0) in a layout. */
static const char *ve_level_name(h3_layout lay, int l, int j, int r, char *buf, size_t n) {
    static const char *const parts[R_BLOCK] = {"norm1", "norm1", "conv1", "conv1", "norm2",
                                               "norm2", "conv2", "conv2", NULL,    NULL};
    const char *wb = r % 2 ? "bias" : "weight";
    const int dif = lay == H3_LAYOUT_DIFFUSERS;
    if (j < 0) {
        snprintf(buf, n,
                 dif ? "encoder.down_blocks.%d.downsamplers.0.conv.%s" : "encoder.down.%d.downsample.conv.%s",
                 l, wb);
        return buf;
    }
    const char *part = parts[r] ? parts[r] : dif ? "conv_shortcut" : "nin_shortcut";
    snprintf(buf, n, dif ? "encoder.down_blocks.%d.resnets.%d.%s.%s" : "encoder.down.%d.block.%d.%s.%s", l, j,
             part, wb);
    return buf;
}

static const char *const k_io_names[IO_N] = {
    "encoder.conv_in.weight",  "encoder.conv_in.bias",  "encoder.norm_out.weight", "encoder.norm_out.bias",
    "encoder.conv_out.weight", "encoder.conv_out.bias", "quant_conv.weight",       "quant_conv.bias",
};

static h3_wb_row ve_row(const char *name, h3_tensor *dst, int64_t cout, int64_t cin, int k, const char *words,
                        h3_wb_unit unit) {
    h3_wb_row r;
    if (cin > 0)
        r = h3_wb_row_make(name, dst, 5, cout, cin, k, k, H3_WB_FLOATS, 0, words, unit);
    else
        r = h3_wb_row_make(name, dst, 1, cout, 0, 0, 0, H3_WB_FLOATS, 0, words, unit);
    if (cin > 0) r.shape[4] = k;
    return r;
}

/* Every row of the table in unit order (unit 0, then the levels); returns the count. */
static int ve_rows(h3_video_enc *e, h3_wb_row *rows, char (*names)[128]) {
    const h3_video_enc_config *c = &e->cfg;
    const int C2 = 2 * c->latent_channels, L = c->levels, chL = c->ch[L - 1];
    const h3_wb_unit io = {"video VAE encoder", 0, 0};
    int n = 0;
    const int64_t io_shape[IO_N][3] = {{c->ch[0], c->in_channels, 3},
                                       {c->ch[0], 0, 0},
                                       {chL, 0, 0},
                                       {chL, 0, 0},
                                       {C2, chL, 3},
                                       {C2, 0, 0},
                                       {C2, C2, 1},
                                       {C2, 0, 0}};
    static const char *const io_words[IO_N] = {
        "[ch[0], 3, 3, 3, 3]",           "[ch[0]]",
        "[channels of the last level]",  "[channels of the last level]",
        "[2·latent, last, 3, 3, 3]",     "[2·latent]",
        "[2·latent, 2·latent, 1, 1, 1]", "[2·latent]"};
    e->n_idx[0] = 0;
    for (int i = 0; i < IO_N; i++) {
        snprintf(names[n], 128, "%s", k_io_names[i]);
        rows[n] =
            ve_row(names[n], &e->io[i], io_shape[i][0], io_shape[i][1], (int)io_shape[i][2], io_words[i], io);
        n++;
        e->idx[0][e->n_idx[0]++] = i;
    }
    for (int l = 0; l < L; l++) {
        const h3_wb_unit u = {"encoder level", l, 1 + l};
        e->n_idx[1 + l] = 0;
        for (int j = 0; j < c->layers; j++) {
            const int64_t cin = j > 0 ? c->ch[l] : l > 0 ? c->ch[l - 1] : c->ch[0], co = c->ch[l];
            for (int r = 0; r < R_BLOCK; r++) {
                if ((r == R_SCW || r == R_SCB) && !ve_has_shortcut(c, l, j)) continue;
                int64_t d0 = r <= R_N1B ? cin : co, d1 = 0;
                int k = 3;
                const char *words = r % 2 ? "[out channels]" : "[out, in, 3, 3, 3]";
                if (r == R_N1W || r == R_N1B) words = "[in channels]";
                if (r == R_N2W || r == R_N2B) words = "[out channels]";
                if (r == R_C1W) d1 = cin;
                if (r == R_C2W) d1 = co;
                if (r == R_SCW) d1 = cin, k = 1, words = "[out, in, 1, 1, 1]";
                ve_level_name(e->layout, l, j, r, names[n], 128);
                const int li = j * R_BLOCK + r;
                rows[n] = ve_row(names[n], &e->lv[l][li], d0, d1, k, words, u);
                n++;
                e->idx[1 + l][e->n_idx[1 + l]++] = li;
            }
        }
        if (ve_has_down(c, l))
            for (int r = 0; r < 2; r++) {
                ve_level_name(e->layout, l, -1, r, names[n], 128);
                rows[n] = ve_row(names[n], &e->lv[l][VE_DOWN + r], c->ch[l], r ? 0 : c->ch[l], 3,
                                 r ? "[channels]" : "[channels, channels, 3, 3, 3]", u);
                n++;
                e->idx[1 + l][e->n_idx[1 + l]++] = VE_DOWN + r;
            }
    }
    return n;
}

/* The shape of one tensor, read with free sizes (headers only): for the structure the tensors imply. */
static h3_status ve_shape(const h3_wbind *wb, const char *name, int nd, const char *words, int64_t *out) {
    h3_wb_row r = h3_wb_row_make(name, NULL, nd, H3_WB_ANY, H3_WB_ANY, H3_WB_ANY, H3_WB_ANY, H3_WB_FLOATS, 0,
                                 words, (h3_wb_unit){"video VAE encoder", 0, 0});
    for (int i = 4; i < nd; i++) r.shape[i] = H3_WB_ANY;
    h3_wb_info in;
    H3_TRY(h3_wb_check(wb, &r, NULL, &in));
    memcpy(out, in.shape, (size_t)nd * sizeof *out);
    return H3_OK;
}

/* Levels, blocks and channels from the tensors, checked against the config's geometry. */
static h3_status ve_structure(h3_video_enc *e, const h3_video_vae_config *vc) {
    h3_video_enc_config *c = &e->cfg;
    const h3_wbind *wb = e->wb;
    const int dif = e->layout == H3_LAYOUT_DIFFUSERS;
    char name[160];
    int64_t s[5];
    H3_TRY(ve_shape(wb, "encoder.conv_in.weight", 5, "[ch[0], 3, 3, 3, 3]", s));
    c->in_channels = (int)s[1];
    c->ch[0] = (int)s[0];
    if (s[1] != 3 || s[0] < 1 || s[0] > 65536)
        return h3_wb_shape_error(wb, "encoder.conv_in.weight", 5, s, NULL, "[channels, 3, 3, 3, 3]");
    H3_TRY(ve_shape(wb, "quant_conv.weight", 5, "[2·latent, 2·latent, 1, 1, 1]", s));
    if (s[0] != 2 * (int64_t)vc->latent_channels || s[1] != s[0])
        return h3_wb_shape_error(wb, "quant_conv.weight", 5, s, NULL,
                                 "[2·latent, 2·latent, 1, 1, 1] = [%d, %d, 1, 1, 1]", 2 * vc->latent_channels,
                                 2 * vc->latent_channels);
    c->latent_channels = vc->latent_channels;
    const int L = h3_count_layers(wb->set, dif ? "encoder.down_blocks." : "encoder.down.");
    if (L < 1)
        return h3_wb_missing_error(wb, ve_level_name(e->layout, 0, 0, R_C1W, name, sizeof name), NULL,
                                   "level 0");
    if (L != vc->enc_levels)
        return H3_ERR(H3_ERR_FORMAT, "%s: the encoder holds %d levels, the config's down factors name %d",
                      wb->source, L, vc->enc_levels);
    c->levels = L;
    snprintf(name, sizeof name, dif ? "encoder.down_blocks.0.resnets." : "encoder.down.0.block.");
    const int J = h3_count_layers(wb->set, name);
    if (J < 1 || J > H3_VENC_MAX_LAYERS)
        return H3_ERR(H3_ERR_FORMAT, "%s: the encoder's level 0 holds %d ResNet blocks; h3run takes 1 to %d",
                      wb->source, J, H3_VENC_MAX_LAYERS);
    c->layers = J;
    int sr = 1, tr = 1;
    for (int l = 0; l < L; l++) {
        ve_level_name(e->layout, l, 0, R_C1W, name, sizeof name);
        H3_TRY(ve_shape(wb, name, 5, "[out, in, 3, 3, 3]", s));
        if (s[0] < 1 || s[0] > 65536) return h3_wb_shape_error(wb, name, 5, s, NULL, "1 to 65536 channels");
        c->ch[l] = (int)s[0];
        c->space_down[l] = vc->space_down[l];
        c->time_down[l] = vc->time_down[l];
        sr *= c->space_down[l];
        tr *= c->time_down[l];
    }
    if (sr != vc->patch_size || tr != vc->patch_size_t)
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: the encoder's down factors multiply to %d × %d, the VAE's ratios are %d × %d",
                      wb->source, sr, tr, vc->patch_size, vc->patch_size_t);
    c->spatial_ratio = sr;
    c->temporal_ratio = tr;
    c->groups = vc->enc_groups;
    c->eps = vc->enc_eps;
    for (int l = 0; l < L; l++)
        if (c->ch[l] % c->groups)
            return H3_ERR(H3_ERR_FORMAT,
                          "%s: encoder level %d has %d channels, not a multiple of its %d GroupNorm groups",
                          wb->source, l, c->ch[l], c->groups);
    c->clip_length = vc->clip_length;
    c->token_drop = vc->token_drop;
    c->tile_size = vc->tile_size;
    c->tile_overlap_min = vc->tile_overlap_min;
    memcpy(c->latents_mean, vc->latents_mean, sizeof c->latents_mean);
    memcpy(c->latents_std, vc->latents_std, sizeof c->latents_std);
    return H3_OK;
}

/* The units over the bound tensors: as opened on the host, or resident as f32 at a device. */
static h3_status ve_open_units(h3_video_enc *e, h3_exec *ex, h3_place place, h3_units **out) {
    const int n = e->cfg.levels + 1;
    h3_pack *packs = h3_calloc((size_t)n, sizeof *packs, H3_MEM_OTHER);
    if (!packs) return H3_ERR_NOMEM;
    for (int u = 0; u < n; u++)
        for (int k = 0; k < e->n_idx[u]; k++) {
            const h3_tensor *t = u == 0 ? &e->io[e->idx[0][k]] : &e->lv[u - 1][e->idx[u][k]];
            h3_pack_add_as(&packs[u], t, 0, place == H3_PLACE_DEVICE ? H3_F32 : t->dtype);
        }
    const h3_units_config uc = {
        place, NULL, 0, 0, e->wb->set, 0, 0, NULL, NULL, "the video VAE encoder's weights", 0, NULL};
    h3_status st = h3_units_open(ex, &uc, packs, n, out);
    h3_free(packs);
    return st;
}

h3_status h3_video_enc_open_set(const h3_wbind *wb, h3_layout layout, const h3_video_vae_config *vc,
                                h3_video_enc **out) {
    *out = NULL;
    h3_video_enc *e = h3_calloc(1, sizeof *e, H3_MEM_OTHER);
    if (!e) return H3_ERR_NOMEM;
    e->wb = wb;
    e->layout = layout;
    e->place = H3_PLACE_HOST;
    enum { MAXROWS = IO_N + H3_VVAE_MAX_LEVELS * VE_LEVEL_N };
    h3_wb_row *rows = h3_calloc(MAXROWS, sizeof *rows, H3_MEM_OTHER);
    char(*names)[128] = h3_calloc(MAXROWS, 128, H3_MEM_OTHER);
    h3_status st = rows && names ? ve_structure(e, vc) : H3_ERR_NOMEM;
    if (st == H3_OK) {
        const int n = ve_rows(e, rows, names);
        st = h3_wb_bind_rows(wb, rows, n);
        if (st == H3_OK) e->cfg.weight_dtype = e->io[IO_CO_W].dtype;
    }
    if (st == H3_OK) st = ve_open_units(e, NULL, H3_PLACE_HOST, &e->host);
    h3_free(rows);
    h3_free(names);
    if (st != H3_OK) {
        h3_video_enc_close(e);
        return h3_error_wrap(st, "opening the video VAE encoder");
    }
    *out = e;
    return H3_OK;
}

h3_status h3_video_enc_open(const h3_video_vae *v, h3_video_enc **out) {
    *out = NULL;
    const h3_wbind *wb = h3_video_vae_binder(v);
    if (!wb) return H3_ERR(H3_ERR_INVALID, "this video VAE has no weight files to read an encoder from");
    return h3_video_enc_open_set(wb, h3_video_vae_layout(v), h3_video_vae_get_config(v), out);
}

void h3_video_enc_close(h3_video_enc *e) {
    if (!e) return;
    h3_units_close(e->dev);
    h3_units_close(e->host);
    for (int i = 0; i < IO_N; i++) h3_tensor_free(&e->io[i]);
    for (int l = 0; l < H3_VVAE_MAX_LEVELS; l++)
        for (int i = 0; i < VE_LEVEL_N; i++) h3_tensor_free(&e->lv[l][i]);
    h3_free(e);
}

const h3_video_enc_config *h3_video_enc_get_config(const h3_video_enc *e) {
    return &e->cfg;
}

h3_status h3_video_enc_place(h3_video_enc *e, h3_exec *ex, h3_place place) {
    if (place == H3_PLACE_HOST || place == H3_PLACE_PINNED) {
        h3_units_close(e->dev);
        e->dev = NULL;
        e->place = H3_PLACE_HOST;
        return H3_OK;
    }
    if (!ex || !ex->cuda)
        return H3_ERR(H3_ERR_INVALID, "the video VAE encoder's device placement needs a CUDA backend");
    if (!e->dev) H3_TRY(ve_open_units(e, ex, H3_PLACE_DEVICE, &e->dev));
    e->place = H3_PLACE_DEVICE;
    return H3_OK;
}

static h3_status ve_acquire(h3_video_enc *e, int u, ve_part *p) {
    const h3_tensor *t;
    memset(p, 0, sizeof *p); /* roles a unit lacks (shortcuts, downsamplers) stay empty */
    H3_TRY(h3_units_acquire(e->place == H3_PLACE_DEVICE ? e->dev : e->host, u, &t));
    for (int k = 0; k < e->n_idx[u]; k++) p->t[e->idx[u][k]] = t[k];
    return H3_OK;
}
static void ve_release(h3_video_enc *e, int u) {
    h3_units_release(e->place == H3_PLACE_DEVICE ? e->dev : e->host, u);
}

/* ---- geometry -------------------------------------------------------------------------------------------
 */

/* Frames out of a strided causal conv over T frames (2 zero frames before, kernel 3). */
static int64_t ve_down_t(int64_t T, int s) {
    return (T - 1) / s + 1;
}
/* Pixels out of a downsampler over n: stride 2 after one reflected pixel; stride 1 without padding. */
static int64_t ve_down_s(int64_t n, int s) {
    return s == 2 ? (n + 1 - 3) / 2 + 1 : n - 2;
}

int64_t h3_video_enc_latent_frames(const h3_video_enc_config *c, int64_t F) {
    if (F < 1) return 0;
    if (F == 1) return 1;
    int64_t lc = c->clip_length;
    for (int l = 0; l < c->levels; l++)
        if (ve_has_down(c, l)) lc = ve_down_t(lc, c->time_down[l]);
    const int64_t n = (F + c->clip_length - 1) / c->clip_length, T = n * lc - c->token_drop;
    return T > 0 ? T : 0;
}

int h3_video_enc_frames_ok(const h3_video_enc_config *c, int64_t F) {
    if (F == 1) return 1;
    const int64_t base = (int64_t)c->clip_length - (int64_t)c->token_drop * c->temporal_ratio;
    return base >= 1 && F >= base && (F - base) % c->clip_length == 0;
}

/* What one tile of T frames × h × w pixels takes: the largest activation, the largest conv3d column chunk on
 * the host (with the f32 weight copy of a non-f32 file), and the moments' size. */
typedef struct {
    int64_t act, scratch, T, h, w; /* T, h, w: the moments' */
} ve_geo;

static void ve_conv_need(ve_geo *g, const h3_video_enc_config *c, int64_t cin, int64_t cout, int k,
                         int64_t npos) {
    const int64_t rows = cin * k * k * k;
    int64_t s = h3_cpu_conv3d_scratch_bytes(rows, npos);
    if (c->weight_dtype != H3_F32) s += (cout * rows + cout) * (int64_t)sizeof(float);
    if (s > g->scratch) g->scratch = s;
}
static void ve_act(ve_geo *g, int64_t n) {
    if (n > g->act) g->act = n;
}

static void ve_walk(const h3_video_enc_config *c, int64_t T, int64_t h, int64_t w, ve_geo *g) {
    memset(g, 0, sizeof *g);
    int64_t C = c->ch[0];
    ve_act(g, c->in_channels * T * h * w);
    ve_act(g, C * T * h * w);
    ve_conv_need(g, c, c->in_channels, C, 3, T * h * w);
    for (int l = 0; l < c->levels; l++) {
        for (int j = 0; j < c->layers; j++) {
            const int64_t co = c->ch[l], npos = T * h * w;
            ve_act(g, C * npos);
            ve_act(g, co * npos);
            ve_conv_need(g, c, C, co, 3, npos);
            ve_conv_need(g, c, co, co, 3, npos);
            if (C != co) ve_conv_need(g, c, C, co, 1, npos);
            C = co;
        }
        if (ve_has_down(c, l)) {
            T = ve_down_t(T, c->time_down[l]);
            h = ve_down_s(h, c->space_down[l]);
            w = ve_down_s(w, c->space_down[l]);
            ve_act(g, C * T * h * w);
            ve_conv_need(g, c, C, C, 3, T * h * w);
        }
    }
    const int64_t C2 = 2 * (int64_t)c->latent_channels;
    ve_act(g, C2 * T * h * w);
    ve_conv_need(g, c, C, C2, 3, T * h * w);
    ve_conv_need(g, c, C2, C2, 1, T * h * w);
    g->T = T;
    g->h = h;
    g->w = w;
}

/* Tiles over the canvas, in pixels. */
typedef struct {
    int ny, nx;
    int64_t ys[H3_VVAE_MAX_TILES], yo[H3_VVAE_MAX_TILES], xs[H3_VVAE_MAX_TILES], xo[H3_VVAE_MAX_TILES];
    int64_t th, tw;
} ve_tiles;

static h3_status ve_split(const h3_video_enc_config *c, int64_t H, int64_t W, ve_tiles *t) {
    H3_TRY(h3_video_vae_split_tiles(H, c->tile_size, c->tile_overlap_min, c->spatial_ratio, &t->ny, t->ys,
                                    t->yo, &t->th));
    H3_TRY(h3_video_vae_split_tiles(W, c->tile_size, c->tile_overlap_min, c->spatial_ratio, &t->nx, t->xs,
                                    t->xo, &t->tw));
    return H3_OK;
}

h3_status h3_video_enc_check_pixels(const h3_video_enc_config *c, const h3_tensor *px) {
    char s[96];
    const int lead = px->ndim == 5;
    if (px->dtype != H3_U8)
        return H3_ERR(H3_ERR_INVALID, "pixels must be uint8 [1, 3, frames, H, W] (got %s)",
                      h3_dtype_name(px->dtype));
    if ((px->ndim != 4 && px->ndim != 5) || (lead && px->shape[0] != 1) ||
        px->shape[lead] != c->in_channels || !h3_tensor_is_contiguous(px))
        return H3_ERR(H3_ERR_INVALID, "pixels must be [1, %d, frames, H, W] (got %s)", c->in_channels,
                      h3_tensor_shape_str(px, s, sizeof s));
    const int64_t F = px->shape[lead + 1], H = px->shape[lead + 2], W = px->shape[lead + 3];
    const int64_t base = (int64_t)c->clip_length - (int64_t)c->token_drop * c->temporal_ratio;
    if (F < 1 || F > 65536 || !h3_video_enc_frames_ok(c, F))
        return H3_ERR(
            H3_ERR_INVALID,
            "pixels hold %lld frames; the encoder takes 1 (an image) or %dn+%lld (n >= 0) up to 65536, "
            "e.g. %lld or %lld",
            (long long)F, c->clip_length, (long long)base, (long long)base,
            (long long)(base + c->clip_length));
    const int64_t r = c->spatial_ratio;
    if (H % r || W % r || H < 2 * r || W < 2 * r || H > 16384 || W > 16384)
        return H3_ERR(H3_ERR_INVALID,
                      "pixels are %lldx%lld (W x H); the encoder takes sides that are multiples of %lld "
                      "from %lld to 16384",
                      (long long)W, (long long)H, (long long)r, (long long)(2 * r));
    return H3_OK;
}

/* The units resident as f32 at a device, by h3_units_mem_of over packs of descriptors (the same table the
 * encoder binds, in the stored dtype): *resident, and *load, the buffer a converting file's tensors pass
 * through while they are placed (freed before an encode). */
static h3_status ve_weights_mem(const h3_video_enc_config *c, int64_t *resident, int64_t *load) {
    enum { MAXROWS = IO_N + H3_VVAE_MAX_LEVELS * VE_LEVEL_N };
    h3_video_enc *e = h3_calloc(1, sizeof *e, H3_MEM_OTHER);
    h3_wb_row *rows = h3_calloc(MAXROWS, sizeof *rows, H3_MEM_OTHER);
    char(*names)[128] = h3_calloc(MAXROWS, 128, H3_MEM_OTHER);
    h3_pack *packs = h3_calloc(H3_VVAE_MAX_LEVELS + 1, sizeof *packs, H3_MEM_OTHER);
    h3_status st = H3_OK;
    if (!e || !rows || !names || !packs) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    e->cfg = *c;
    const int n = ve_rows(e, rows, names);
    for (int i = 0; i < n; i++) {
        h3_tensor *t = rows[i].dst;
        t->dtype = c->weight_dtype;
        t->place = H3_PLACE_HOST;
        t->ndim = rows[i].ndim;
        memcpy(t->shape, rows[i].shape, sizeof t->shape);
    }
    for (int u = 0; u <= c->levels; u++)
        for (int k = 0; k < e->n_idx[u]; k++)
            h3_pack_add_as(&packs[u], u == 0 ? &e->io[e->idx[0][k]] : &e->lv[u - 1][e->idx[u][k]], 0, H3_F32);
    {
        const h3_units_config uc = {H3_PLACE_DEVICE, NULL, 0, 0, NULL, 0, 0, NULL, NULL, "", 0, NULL};
        h3_units_mem um;
        h3_units_mem_of(&uc, packs, c->levels + 1, &um);
        *resident = um.resident;
        *load = um.load;
    }
done:
    h3_free(e);
    h3_free(rows);
    h3_free(names);
    h3_free(packs);
    return st;
}

h3_status h3_video_enc_mem_of(const h3_video_enc_config *c, int64_t F, int64_t H, int64_t W, h3_place place,
                              h3_video_enc_mem *out) {
    memset(out, 0, sizeof *out);
    if (F < 1 || H < 1 || W < 1)
        return H3_ERR(H3_ERR_INVALID, "an encode needs at least one frame and one pixel");
    ve_tiles t;
    H3_TRY(ve_split(c, H, W, &t));
    const int64_t cf = F == 1 ? 1 : c->clip_length;
    ve_geo g;
    ve_walk(c, cf, t.th, t.tw, &g);
    out->frames = F;
    out->latent_frames = h3_video_enc_latent_frames(c, F);
    out->H = H;
    out->W = W;
    out->chunks = F == 1 ? 1 : (int)((F + c->clip_length - 1) / c->clip_length);
    out->clip_frames = (int)cf;
    out->tiles_y = t.ny;
    out->tiles_x = t.nx;
    out->tile_h = t.th;
    out->tile_w = t.tw;
    out->place = place;
    const int64_t f4 = (int64_t)sizeof(float), C2 = 2 * (int64_t)c->latent_channels;
    const int64_t px = c->in_channels * cf * t.th * t.tw * f4, mom = C2 * g.T * g.h * g.w * f4;
    if (place == H3_PLACE_DEVICE) {
        out->act = 3 * h3_cuda_granule(g.act * f4);
        out->tile_io = h3_cuda_granule(px) + h3_cuda_granule(mom);
        int64_t load = 0;
        H3_TRY(ve_weights_mem(c, &out->weights, &load));
        /* the backend's workspace and the scratch its conv3d takes its im2col chunks from (cuda_conv3d) */
        out->dev_backend = H3_CUDA_BACKEND_BYTES + H3_CUDA_QGEMM_SCRATCH_BYTES;
        out->dev_peak = out->dev_backend + out->weights +
                        (load > out->act + out->tile_io ? load : out->act + out->tile_io);
        out->host_tiles = (int64_t)t.ny * t.nx * mom + px;
        out->host_total = out->host_tiles;
    } else {
        out->act = 3 * g.act * f4;
        out->tile_io = px + mom;
        out->op_scratch = g.scratch;
        out->host_tiles = (int64_t)t.ny * t.nx * mom;
        out->host_total =
            out->act + out->tile_io + out->host_tiles + out->op_scratch + (int64_t)sizeof(ve_part);
    }
    return H3_OK;
}

/* ---- the encode -----------------------------------------------------------------------------------------
 */

typedef struct {
    h3_video_enc *e;
    h3_exec *ex;
    h3_place place;
    h3_tensor buf[3], tpx, tmom;        /* at the place */
    float *hpx;                         /* host staging of a tile's pixels (device runs) */
} ve_run;

static h3_tensor ve_view(const h3_tensor *buf, int64_t C, int64_t T, int64_t H, int64_t W) {
    h3_tensor v;
    const int64_t s[4] = {C, T, H, W};
    h3_tensor_wrap(&v, buf->data, buf->place, H3_F32, 4, s);
    return v;
}

/* y = silu(GroupNorm(x)) with statistics per frame (x, y [C, T, H, W]; may alias): one GroupNorm over the
 * frames as items ([T, C, H·W] with strides H·W, T·H·W, 1), then SiLU over the whole. */
static h3_status ve_norm_silu(ve_run *r, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                              const h3_tensor *b) {
    const h3_video_enc_config *c = &r->e->cfg;
    const int64_t C = x->shape[0], T = x->shape[1], S = x->shape[2] * x->shape[3];
    const int64_t s3[3] = {T, C, S}, s2[2] = {C, T * S};
    h3_tensor xv, yv, y2;
    h3_tensor_wrap(&xv, x->data, x->place, H3_F32, 3, s3);
    h3_tensor_wrap(&yv, y->data, y->place, H3_F32, 3, s3);
    xv.stride[0] = yv.stride[0] = S;
    xv.stride[1] = yv.stride[1] = T * S;
    H3_TRY(h3_op_group_norm(r->ex, &yv, &xv, c->groups, w, b, c->eps));
    h3_tensor_wrap(&y2, y->data, y->place, H3_F32, 2, s2);
    return h3_op_unary(r->ex, &y2, &y2, H3_UNARY_SILU);
}

/* A causal conv: k = 3 (reflect-padded space 1, 2 zero frames before) or 1 (no padding); or a downsampler
 * (ts, ss > 1 or down set: one reflected pixel right and bottom when ss == 2). y is sized here. */
static h3_status ve_conv(ve_run *r, h3_tensor *ybuf, const h3_tensor *x, const h3_tensor *w,
                         const h3_tensor *b, int down, int ts, int ss, h3_tensor *y) {
    const int k = (int)w->shape[2];
    h3_conv3d_params p;
    memset(&p, 0, sizeof p);
    p.stride[0] = ts;
    p.stride[1] = p.stride[2] = ss;
    p.pad_mode[0] = H3_PAD_ZEROS;
    p.pad_mode[1] = p.pad_mode[2] = H3_PAD_REFLECT;
    if (k == 3) p.pad[0][0] = 2;
    if (k == 3 && !down) p.pad[1][0] = p.pad[1][1] = p.pad[2][0] = p.pad[2][1] = 1;
    if (down && ss == 2) p.pad[1][1] = p.pad[2][1] = 1;
    const int64_t T = x->shape[1], H = x->shape[2], W = x->shape[3];
    const int64_t To = (T + p.pad[0][0] - k) / ts + 1, Ho = (H + p.pad[1][0] + p.pad[1][1] - k) / ss + 1,
                  Wo = (W + p.pad[2][0] + p.pad[2][1] - k) / ss + 1;
    *y = ve_view(ybuf, w->shape[0], To, Ho, Wo);
    return h3_op_conv3d(r->ex, y, x, w, b, &p);
}

/* y += x (same shape, contiguous). */
static h3_status ve_add(ve_run *r, h3_tensor *y, const h3_tensor *x) {
    return h3_op_binary(r->ex, y, y, x, H3_BINARY_ADD);
}

/* One tile's pixels (r->tpx at the place, [3, T, h, w]) -> its moments in r->tmom ([2C, Tl, h/16, w/16]). */
static h3_status ve_tile(ve_run *r, h3_tensor *mom) {
    h3_video_enc *e = r->e;
    const h3_video_enc_config *c = &e->cfg;
    ve_part *p = h3_malloc(sizeof *p, H3_MEM_OTHER);
    if (!p) return H3_ERR_NOMEM;
    h3_status st = H3_OK;
    h3_tensor *B = r->buf; /* cur, free1, free2 rotate among the three */
    int cur = 0, f1 = 1, f2 = 2;
    h3_tensor x;
    H3_CHECK(ve_acquire(e, 0, p));
    st = ve_conv(r, &B[cur], &r->tpx, &p->t[IO_CIN_W], &p->t[IO_CIN_B], 0, 1, 1, &x);
    ve_release(e, 0);
    if (st != H3_OK) goto done;
    for (int l = 0; l < c->levels; l++) {
        H3_CHECK(ve_acquire(e, 1 + l, p));
        for (int j = 0; j < c->layers && st == H3_OK; j++) {
            const h3_tensor *t = &p->t[j * R_BLOCK];
            h3_tensor a = ve_view(&B[f1], x.shape[0], x.shape[1], x.shape[2], x.shape[3]), h, h2, sc;
            st = ve_norm_silu(r, &a, &x, &t[R_N1W], &t[R_N1B]);
            if (st == H3_OK) st = ve_conv(r, &B[f2], &a, &t[R_C1W], &t[R_C1B], 0, 1, 1, &h);
            if (st == H3_OK) {
                a = ve_view(&B[f1], h.shape[0], h.shape[1], h.shape[2], h.shape[3]);
                st = ve_norm_silu(r, &a, &h, &t[R_N2W], &t[R_N2B]);
            }
            if (st == H3_OK) st = ve_conv(r, &B[f2], &a, &t[R_C2W], &t[R_C2B], 0, 1, 1, &h2);
            if (st == H3_OK && t[R_SCW].data) {
                st = ve_conv(r, &B[f1], &x, &t[R_SCW], &t[R_SCB], 0, 1, 1, &sc);
                if (st == H3_OK) st = ve_add(r, &h2, &sc);
            } else if (st == H3_OK) {
                st = ve_add(r, &h2, &x);
            }
            x = h2;
            const int o = cur;
            cur = f2, f2 = o; /* f1 stays free */
        }
        if (st == H3_OK && ve_has_down(c, l)) {
            h3_tensor y;
            st = ve_conv(r, &B[f1], &x, &p->t[VE_DOWN], &p->t[VE_DOWN + 1], 1, c->time_down[l],
                         c->space_down[l], &y);
            x = y;
            const int o = cur;
            cur = f1, f1 = o;
        }
        ve_release(e, 1 + l);
        if (st != H3_OK) goto done;
        H3_CHECK(h3_cancel_check());
    }
    H3_CHECK(ve_acquire(e, 0, p));
    {
        h3_tensor a = ve_view(&B[f1], x.shape[0], x.shape[1], x.shape[2], x.shape[3]), y;
        st = ve_norm_silu(r, &a, &x, &p->t[IO_NO_W], &p->t[IO_NO_B]);
        if (st == H3_OK) st = ve_conv(r, &B[f2], &a, &p->t[IO_CO_W], &p->t[IO_CO_B], 0, 1, 1, &y);
        if (st == H3_OK) st = ve_conv(r, &r->tmom, &y, &p->t[IO_Q_W], &p->t[IO_Q_B], 0, 1, 1, mom);
    }
    ve_release(e, 0);
done:
    h3_free(p);
    return st;
}

/* diffusers' _blend weight of position k of e: b's weight k/e (f32), a's 1 − that. */
static inline float ve_blend(float a, float b, int64_t k, int64_t e) {
    const float wb = (float)k / (float)e, wa = 1.0f - wb;
    return a * wa + b * wb;
}

/* The chunk's raw tile moments raw[ny·nx][2C, Tl, th, tw] (latent units) stitched into out frames f0.. of
 * moments [2C, T, Hl, Wl] (frames past T are the dropped ones). */
static void ve_stitch(const ve_tiles *tl, int64_t ratio, const float *raw, int64_t C2, int64_t Tl, float *out,
                      int64_t T, int64_t Hl, int64_t Wl, int64_t f0) {
    const int64_t th = tl->th / ratio, tw = tl->tw / ratio, tsz = C2 * Tl * th * tw;
    for (int i = 0; i < tl->ny; i++)
        for (int j = 0; j < tl->nx; j++) {
            const float *R = raw + ((int64_t)i * tl->nx + j) * tsz;
            const float *U = i > 0 ? raw + ((int64_t)(i - 1) * tl->nx + j) * tsz : NULL;
            const float *Lf = j > 0 ? raw + ((int64_t)i * tl->nx + j - 1) * tsz : NULL;
            const int64_t ev = i > 0 ? tl->yo[i - 1] / ratio : 0, eh = j > 0 ? tl->xo[j - 1] / ratio : 0;
            const int64_t keep_y = th - (i < tl->ny - 1 ? tl->yo[i] / ratio : 0);
            const int64_t keep_x = tw - (j < tl->nx - 1 ? tl->xo[j] / ratio : 0);
            const int64_t y0 = tl->ys[i] / ratio, x0 = tl->xs[j] / ratio;
            for (int64_t ch = 0; ch < C2; ch++)
                for (int64_t f = 0; f < Tl && f0 + f < T; f++) {
                    const int64_t pl = (ch * Tl + f) * th * tw;
                    for (int64_t y = 0; y < keep_y; y++)
                        for (int64_t x = 0; x < keep_x; x++) {
                            float v = R[pl + y * tw + x];
                            if (U && y < ev) v = ve_blend(U[pl + (th - ev + y) * tw + x], v, y, ev);
                            if (Lf && x < eh) {
                                float a = Lf[pl + y * tw + (tw - eh + x)];
                                v = ve_blend(a, v, x, eh);
                            }
                            out[((ch * T + f0 + f) * Hl + y0 + y) * Wl + x0 + x] = v;
                        }
                }
        }
}

/* Tile (y0, x0) of chunk k's frames (the last frame repeated past the end), ImageNet-normalized, into dst
 * [3, cf, th, tw]. */
static void ve_pixels(const h3_video_enc_config *c, const uint8_t *px, int64_t F, int64_t H, int64_t W,
                      int64_t k, int64_t cf, int64_t y0, int64_t x0, int64_t th, int64_t tw, float *dst) {
    for (int64_t ch = 0; ch < c->in_channels; ch++) {
        const float m = ch < 3 ? h3_imagenet_mean[ch] : 0.0f, s = ch < 3 ? h3_imagenet_std[ch] : 1.0f;
        for (int64_t t = 0; t < cf; t++) {
            int64_t f = k * c->clip_length + t;
            if (f > F - 1) f = F - 1;
            const uint8_t *src = px + ((ch * F + f) * H + y0) * W + x0;
            float *d = dst + (ch * cf + t) * th * tw;
            for (int64_t y = 0; y < th; y++)
                for (int64_t x = 0; x < tw; x++) d[y * tw + x] = ((float)src[y * W + x] / 255.0f - m) / s;
        }
    }
}

h3_status h3_video_enc_encode(h3_video_enc *e, h3_exec *ex, const h3_tensor *pixels, h3_tensor *moments) {
    const h3_video_enc_config *c = &e->cfg;
    char s[96];
    const int lead = pixels->ndim == 5;
    if (pixels->dtype != H3_U8 || (pixels->ndim != 4 && pixels->ndim != 5) ||
        !h3_tensor_is_contiguous(pixels) || pixels->shape[lead] != c->in_channels ||
        (lead && pixels->shape[0] != 1) || pixels->place == H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID, "pixels must be host uint8 [1, %d, frames, H, W] (got %s)",
                      c->in_channels, h3_tensor_shape_str(pixels, s, sizeof s));
    const int64_t F = pixels->shape[lead + 1], H = pixels->shape[lead + 2], W = pixels->shape[lead + 3];
    const int64_t r = c->spatial_ratio;
    if (F < 1 || H % r || W % r || H < 2 * r || W < 2 * r)
        return H3_ERR(H3_ERR_INVALID,
                      "pixels [.., %lld, %lld, %lld]: need frames >= 1 and sides that are multiples of "
                      "%lld, at least %lld",
                      (long long)F, (long long)H, (long long)W, (long long)r, (long long)(2 * r));
    const int64_t T = h3_video_enc_latent_frames(c, F), C2 = 2 * (int64_t)c->latent_channels, Hl = H / r,
                  Wl = W / r;
    const int ml = moments->ndim == 5;
    if (T < 1)
        return H3_ERR(H3_ERR_INVALID, "%lld frames leave no latent frame after the drop of %d", (long long)F,
                      c->token_drop);
    if (moments->dtype != H3_F32 || (moments->ndim != 4 && !ml) || (ml && moments->shape[0] != 1) ||
        moments->shape[ml] != C2 || moments->shape[ml + 1] != T || moments->shape[ml + 2] != Hl ||
        moments->shape[ml + 3] != Wl || !h3_tensor_is_contiguous(moments) ||
        moments->place == H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID, "moments must be host f32 [%lld, %lld, %lld, %lld] (got %s)",
                      (long long)C2, (long long)T, (long long)Hl, (long long)Wl,
                      h3_tensor_shape_str(moments, s, sizeof s));
    ve_tiles tl;
    H3_TRY(ve_split(c, H, W, &tl));
    const int64_t cf = F == 1 ? 1 : c->clip_length,
                  chunks = F == 1 ? 1 : (F + c->clip_length - 1) / c->clip_length;
    ve_geo g;
    ve_walk(c, cf, tl.th, tl.tw, &g);
    const int64_t tsz = C2 * g.T * g.h * g.w, npx = c->in_channels * cf * tl.th * tl.tw;
    ve_run run;
    memset(&run, 0, sizeof run);
    run.e = e;
    run.ex = ex;
    run.place = e->place;
    h3_status st = H3_OK;
    float *raw = h3_malloc((size_t)(tl.ny * tl.nx * tsz) * sizeof(float), H3_MEM_ACTIVATIONS);
    if (!raw)
        H3_FAIL(H3_ERR_NOMEM, "out of memory for the encoder's tile moments (%lld floats)",
                (long long)(tl.ny * tl.nx * tsz));
    for (int i = 0; i < 3; i++)
        H3_CHECK(h3_tensor_alloc2(&run.buf[i], run.place, H3_F32, 1, g.act, H3_MEM_ACTIVATIONS));
    {
        const int64_t sp[4] = {c->in_channels, cf, tl.th, tl.tw}, sm[4] = {C2, g.T, g.h, g.w};
        H3_CHECK(h3_tensor_alloc(&run.tpx, run.place, H3_F32, 4, sp, H3_MEM_ACTIVATIONS));
        H3_CHECK(h3_tensor_alloc(&run.tmom, run.place, H3_F32, 4, sm, H3_MEM_ACTIVATIONS));
    }
    if (run.place == H3_PLACE_DEVICE) {
        run.hpx = h3_malloc((size_t)npx * sizeof(float), H3_MEM_ACTIVATIONS);
        if (!run.hpx) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    }
    for (int64_t k = 0; k < chunks && st == H3_OK; k++) {
        for (int i = 0; i < tl.ny && st == H3_OK; i++)
            for (int j = 0; j < tl.nx && st == H3_OK; j++) {
                float *dst = run.place == H3_PLACE_DEVICE ? run.hpx : run.tpx.data;
                ve_pixels(c, pixels->data, F, H, W, k, cf, tl.ys[i], tl.xs[j], tl.th, tl.tw, dst);
                if (run.place == H3_PLACE_DEVICE) {
                    h3_tensor hv;
                    h3_tensor_wrap(&hv, run.hpx, H3_PLACE_HOST, H3_F32, 4, run.tpx.shape);
                    H3_CHECK(h3_copy(ex, &run.tpx, &hv));
                }
                h3_tensor mom;
                H3_CHECK(ve_tile(&run, &mom));
                h3_tensor hm;
                h3_tensor_wrap(&hm, raw + ((int64_t)i * tl.nx + j) * tsz, H3_PLACE_HOST, H3_F32, 4,
                               mom.shape);
                H3_CHECK(h3_copy(ex, &hm, &mom));
                H3_CHECK(h3_exec_sync(ex));
            }
        ve_stitch(&tl, r, raw, C2, g.T, moments->data, T, Hl, Wl, k * g.T);
    }
done:
    for (int i = 0; i < 3; i++) h3_tensor_free(&run.buf[i]);
    h3_tensor_free(&run.tpx);
    h3_tensor_free(&run.tmom);
    h3_free(run.hpx);
    h3_free(raw);
    return st;
}

/* ---- the posterior --------------------------------------------------------------------------------------
 */

h3_status h3_video_enc_posterior(const h3_video_enc_config *c, const h3_tensor *m, const float *noise,
                                 h3_tensor *out) {
    const int ml = m->ndim == 5, ol = out->ndim == 5;
    const int64_t C = c->latent_channels;
    char s[96], s2[96];
    if (m->dtype != H3_F32 || out->dtype != H3_F32 || m->ndim != 4 + ml || out->ndim != 4 + ol ||
        m->shape[ml] != 2 * C || out->shape[ol] != C || !h3_tensor_is_contiguous(m) ||
        !h3_tensor_is_contiguous(out) || m->shape[ml + 1] != out->shape[ol + 1] ||
        m->shape[ml + 2] != out->shape[ol + 2] || m->shape[ml + 3] != out->shape[ol + 3])
        return H3_ERR(H3_ERR_INVALID,
                      "the posterior takes f32 moments [2C, T, h, w] to latents [C, T, h, w] (C = %lld); "
                      "got %s and %s",
                      (long long)C, h3_tensor_shape_str(m, s, sizeof s),
                      h3_tensor_shape_str(out, s2, sizeof s2));
    const int64_t n = C * m->shape[ml + 1] * m->shape[ml + 2] * m->shape[ml + 3], per = n / C;
    const float *mean = m->data, *logvar = (const float *)m->data + n;
    float *z = out->data;
    for (int64_t i = 0; i < n; i++) {
        if (!noise) {
            z[i] = mean[i];
            continue;
        }
        float lv = logvar[i] < -30.0f ? -30.0f : logvar[i] > 20.0f ? 20.0f : logvar[i];
        const float sd = expf(0.5f * lv);
        const float v = h3_f16_to_f32(h3_f32_to_f16(mean[i] + sd * noise[i]));
        const int64_t ch = i / per;
        z[i] = (v - c->latents_mean[ch]) / c->latents_std[ch];
    }
    return H3_OK;
}

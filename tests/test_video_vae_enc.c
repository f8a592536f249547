/* The video VAE encoder (models/video_vae_enc.h) against a float64 reference written here from diffusers'
 * AutoencoderKLMiniMaxH3 (its encoder, _encode, _encode_clip, _split_tiles, _blend, _stitch_tiles), on a
 * tiny random encoder; the small model's encode then decode; the posterior; the memory plan; bad pixels. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "io/safetensors.h"
#include "io/wbind.h"
#include "models/video_vae.h"
#include "models/video_vae_enc.h"
#include "synth/world.h"
#include "tensor/dtype.h"
#include "h3run.h"
#include "testutil.h"

static h3_exec g_ex;

/* ---- the tiny encoder: 2 levels (8 and 16 channels, 2 blocks each), 4 latent channels ------------------ */

enum { NL = 2, NJ = 2, LAT = 4, GROUPS = 4 };
static const int k_ch[NL] = {8, 16}, k_sd[NL] = {2, 2}, k_td[NL] = {1, 2};

typedef struct {
    char name[128];
    int nd;
    int64_t shape[5];
    float *v;
} wt;
typedef struct {
    wt w[128];
    int n;
} wset;

static float *wadd(wset *s, const char *name, int nd, int64_t d0, int64_t d1, int k, int role) {
    wt *t = &s->w[s->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = nd;
    t->shape[0] = d0;
    int64_t n = d0;
    if (nd == 5) {
        t->shape[1] = d1;
        t->shape[2] = t->shape[3] = t->shape[4] = k;
        n = d0 * d1 * k * k * k;
    }
    t->v = malloc((size_t)n * sizeof(float));
    const double fan = nd == 5 ? (double)(d1 * k * k * k) : 1.0;
    for (int64_t i = 0; i < n; i++)
        t->v[i] = role == 0   ? (float)t_uniform(-1.5, 1.5) / (float)sqrt(fan) /* conv weight */
                  : role == 1 ? (float)t_uniform(-0.1, 0.1)                    /* bias */
                              : (float)t_uniform(0.8, 1.2);                    /* norm weight */
    return t->v;
}
static const float *wget(const wset *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->w[i].name, name)) return s->w[i].v;
    return NULL;
}

/* Names in the official (dif 0) or diffusers layout. */
static const char *bname(int dif, int l, int j, const char *part, const char *wb, char *buf) {
    if (j < 0)
        sprintf(buf,
                dif ? "encoder.down_blocks.%d.downsamplers.0.conv.%s" : "encoder.down.%d.downsample.conv.%s",
                l, wb);
    else
        sprintf(buf, dif ? "encoder.down_blocks.%d.resnets.%d.%s.%s" : "encoder.down.%d.block.%d.%s.%s", l, j,
                part, wb);
    return buf;
}

static void make_weights(wset *s, int dif) {
    char b[128];
    memset(s, 0, sizeof *s);
    wadd(s, "encoder.conv_in.weight", 5, k_ch[0], 3, 3, 0);
    wadd(s, "encoder.conv_in.bias", 1, k_ch[0], 0, 0, 1);
    for (int l = 0; l < NL; l++) {
        for (int j = 0; j < NJ; j++) {
            const int cin = j ? k_ch[l] : l ? k_ch[l - 1] : k_ch[0], co = k_ch[l];
            wadd(s, bname(dif, l, j, "norm1", "weight", b), 1, cin, 0, 0, 2);
            wadd(s, bname(dif, l, j, "norm1", "bias", b), 1, cin, 0, 0, 1);
            wadd(s, bname(dif, l, j, "conv1", "weight", b), 5, co, cin, 3, 0);
            wadd(s, bname(dif, l, j, "conv1", "bias", b), 1, co, 0, 0, 1);
            wadd(s, bname(dif, l, j, "norm2", "weight", b), 1, co, 0, 0, 2);
            wadd(s, bname(dif, l, j, "norm2", "bias", b), 1, co, 0, 0, 1);
            wadd(s, bname(dif, l, j, "conv2", "weight", b), 5, co, co, 3, 0);
            wadd(s, bname(dif, l, j, "conv2", "bias", b), 1, co, 0, 0, 1);
            if (cin != co) {
                const char *sc = dif ? "conv_shortcut" : "nin_shortcut";
                wadd(s, bname(dif, l, j, sc, "weight", b), 5, co, cin, 1, 0);
                wadd(s, bname(dif, l, j, sc, "bias", b), 1, co, 0, 0, 1);
            }
        }
        wadd(s, bname(dif, l, -1, NULL, "weight", b), 5, k_ch[l], k_ch[l], 3, 0);
        wadd(s, bname(dif, l, -1, NULL, "bias", b), 1, k_ch[l], 0, 0, 1);
    }
    wadd(s, "encoder.norm_out.weight", 1, k_ch[NL - 1], 0, 0, 2);
    wadd(s, "encoder.norm_out.bias", 1, k_ch[NL - 1], 0, 0, 1);
    wadd(s, "encoder.conv_out.weight", 5, 2 * LAT, k_ch[NL - 1], 3, 0);
    wadd(s, "encoder.conv_out.bias", 1, 2 * LAT, 0, 0, 1);
    wadd(s, "quant_conv.weight", 5, 2 * LAT, 2 * LAT, 1, 0);
    wadd(s, "quant_conv.bias", 1, 2 * LAT, 0, 0, 1);
}

static void free_weights(wset *s) {
    for (int i = 0; i < s->n; i++) free(s->w[i].v);
}

static void write_weights(const wset *s, const char *path) {
    h3_st_writer *w = NULL;
    CHECK_OK(h3_st_writer_new(&w));
    for (int i = 0; i < s->n; i++)
        CHECK_OK(h3_st_writer_add(w, s->w[i].name, H3_F32, s->w[i].nd, s->w[i].shape, s->w[i].v));
    CHECK_OK(h3_st_writer_write(w, path, 0));
    h3_st_writer_free(w);
}

static void tiny_config(h3_video_vae_config *c, int tile, int overlap) {
    h3_video_vae_default_config(c);
    c->latent_channels = LAT;
    c->patch_size = 4;
    c->patch_size_t = 2;
    c->enc_levels = NL;
    for (int l = 0; l < NL; l++) c->space_down[l] = k_sd[l], c->time_down[l] = k_td[l];
    c->enc_groups = GROUPS;
    c->enc_eps = 1e-6f;
    c->tile_size = tile;
    c->tile_overlap_min = overlap;
    for (int i = 0; i < LAT; i++)
        c->latents_mean[i] = 0.1f * (float)i, c->latents_std[i] = 1.0f + 0.5f * (float)i;
}

/* ---- the float64 reference -------------------------------------------------------------------------------
 */

typedef struct {
    int C, T, H, W;
    double *d;
} rt;
static rt rt_new(int C, int T, int H, int W) {
    rt r = {C, T, H, W, calloc((size_t)C * T * H * W, sizeof(double))};
    return r;
}
#define AT(r, c, t, y, x) (r).d[(((size_t)(c) * (r).T + (t)) * (r).H + (y)) * (r).W + (x)]

/* torch's reflect: -1 -> 1, n -> n - 2. */
static int reflect(int i, int n) {
    if (i < 0) return -i;
    if (i >= n) return 2 * (n - 1) - i;
    return i;
}

/* F.pad(x, (left, right, top, bottom), reflect), then 2 zero frames before when k = 3, then conv3d with
 * stride. */
static rt ref_conv(rt x, const float *w, const float *b, int co, int k, int ts, int ss, int pt, int pb,
                   int pl, int pr) {
    const int tp = k == 3 ? 2 : 0, Tp = x.T + tp, Hp = x.H + pt + pb, Wp = x.W + pl + pr;
    rt p = rt_new(x.C, Tp, Hp, Wp);
    for (int c = 0; c < x.C; c++)
        for (int t = tp; t < Tp; t++)
            for (int y = 0; y < Hp; y++)
                for (int xx = 0; xx < Wp; xx++)
                    AT(p, c, t, y, xx) = AT(x, c, t - tp, reflect(y - pt, x.H), reflect(xx - pl, x.W));
    rt o = rt_new(co, (Tp - k) / ts + 1, (Hp - k) / ss + 1, (Wp - k) / ss + 1);
    for (int c = 0; c < co; c++)
        for (int t = 0; t < o.T; t++)
            for (int y = 0; y < o.H; y++)
                for (int xx = 0; xx < o.W; xx++) {
                    double acc = b[c];
                    for (int ci = 0; ci < x.C; ci++)
                        for (int a = 0; a < k; a++)
                            for (int e = 0; e < k; e++)
                                for (int f = 0; f < k; f++)
                                    acc += (double)w[(((c * x.C + ci) * k + a) * k + e) * k + f] *
                                           AT(p, ci, t * ts + a, y * ss + e, xx * ss + f);
                    AT(o, c, t, y, xx) = acc;
                }
    free(p.d);
    return o;
}

/* silu(GroupNorm(groups, eps)) of every frame on its own. */
static rt ref_gn_silu(rt x, const float *g, const float *b) {
    rt o = rt_new(x.C, x.T, x.H, x.W);
    const int cpg = x.C / GROUPS;
    for (int t = 0; t < x.T; t++)
        for (int gi = 0; gi < GROUPS; gi++) {
            double s = 0, ss = 0, n = (double)cpg * x.H * x.W;
            for (int c = gi * cpg; c < (gi + 1) * cpg; c++)
                for (int y = 0; y < x.H; y++)
                    for (int xx = 0; xx < x.W; xx++) s += AT(x, c, t, y, xx);
            const double m = s / n;
            for (int c = gi * cpg; c < (gi + 1) * cpg; c++)
                for (int y = 0; y < x.H; y++)
                    for (int xx = 0; xx < x.W; xx++)
                        ss += (AT(x, c, t, y, xx) - m) * (AT(x, c, t, y, xx) - m);
            const double inv = 1.0 / sqrt(ss / n + 1e-6);
            for (int c = gi * cpg; c < (gi + 1) * cpg; c++)
                for (int y = 0; y < x.H; y++)
                    for (int xx = 0; xx < x.W; xx++) {
                        const double v = (AT(x, c, t, y, xx) - m) * inv * g[c] + b[c];
                        AT(o, c, t, y, xx) = v / (1.0 + exp(-v));
                    }
        }
    return o;
}

static rt take(rt *old, rt nw) {
    free(old->d);
    return nw;
}

/* MiniMaxH3VideoEncoder3d + quant_conv on one tile. */
static rt ref_encoder(const wset *s, int dif, rt x) {
    char b1[128], b2[128];
    rt h = ref_conv(x, wget(s, "encoder.conv_in.weight"), wget(s, "encoder.conv_in.bias"), k_ch[0], 3, 1, 1,
                    1, 1, 1, 1);
    for (int l = 0; l < NL; l++) {
        for (int j = 0; j < NJ; j++) {
            const int co = k_ch[l];
            rt a = ref_gn_silu(h, wget(s, bname(dif, l, j, "norm1", "weight", b1)),
                               wget(s, bname(dif, l, j, "norm1", "bias", b2)));
            a = take(&a, ref_conv(a, wget(s, bname(dif, l, j, "conv1", "weight", b1)),
                                  wget(s, bname(dif, l, j, "conv1", "bias", b2)), co, 3, 1, 1, 1, 1, 1, 1));
            a = take(&a, ref_gn_silu(a, wget(s, bname(dif, l, j, "norm2", "weight", b1)),
                                     wget(s, bname(dif, l, j, "norm2", "bias", b2))));
            a = take(&a, ref_conv(a, wget(s, bname(dif, l, j, "conv2", "weight", b1)),
                                  wget(s, bname(dif, l, j, "conv2", "bias", b2)), co, 3, 1, 1, 1, 1, 1, 1));
            if (h.C != co) {
                const char *sc = dif ? "conv_shortcut" : "nin_shortcut";
                h = take(&h, ref_conv(h, wget(s, bname(dif, l, j, sc, "weight", b1)),
                                      wget(s, bname(dif, l, j, sc, "bias", b2)), co, 1, 1, 1, 0, 0, 0, 0));
            }
            for (size_t i = 0; i < (size_t)co * h.T * h.H * h.W; i++) h.d[i] += a.d[i];
            free(a.d);
        }
        h = take(&h, ref_conv(h, wget(s, bname(dif, l, -1, NULL, "weight", b1)),
                              wget(s, bname(dif, l, -1, NULL, "bias", b2)), k_ch[l], 3, k_td[l], k_sd[l], 0,
                              k_sd[l] == 2, 0, k_sd[l] == 2));
    }
    h = take(&h, ref_gn_silu(h, wget(s, "encoder.norm_out.weight"), wget(s, "encoder.norm_out.bias")));
    h = take(&h, ref_conv(h, wget(s, "encoder.conv_out.weight"), wget(s, "encoder.conv_out.bias"), 2 * LAT, 3,
                          1, 1, 1, 1, 1, 1));
    return take(&h, ref_conv(h, wget(s, "quant_conv.weight"), wget(s, "quant_conv.bias"), 2 * LAT, 1, 1, 1, 0,
                             0, 0, 0));
}

/* diffusers' _split_tiles, written out again. */
static int ref_split(int len, int tile, int min_ov, int ratio, int *start, int *ov, int *tlen) {
    if (tile >= len) {
        start[0] = 0;
        *tlen = len;
        return 1;
    }
    int n = (len + tile - 1) / tile;
    while (tile * n - min_ov * (n - 1) - len < 0) n++;
    for (int i = 0; i < n - 1; i++) ov[i] = min_ov;
    int rem = tile * n - min_ov * (n - 1) - len;
    for (int i = 0; i < rem / ratio; i++) ov[i % (n - 1)] += ratio;
    start[0] = 0;
    for (int i = 0; i < n - 1; i++) start[i + 1] = start[i] + tile - ov[i];
    *tlen = tile;
    return n;
}

/* _blend(a, b, e, dim) along height (dim 0) or width (dim 1), returning a new tensor like b. */
static rt ref_blend(rt a, rt b, int e, int dim) {
    const int na = dim ? a.W : a.H, nb = dim ? b.W : b.H;
    if (e > na) e = na;
    if (e > nb) e = nb;
    rt o = rt_new(b.C, b.T, b.H, b.W);
    memcpy(o.d, b.d, sizeof(double) * (size_t)b.C * b.T * b.H * b.W);
    for (int c = 0; c < b.C; c++)
        for (int t = 0; t < b.T; t++)
            for (int y = 0; y < b.H; y++)
                for (int x = 0; x < b.W; x++) {
                    const int k = dim ? x : y;
                    if (k >= e) continue;
                    const double wb = (double)k / e,
                                 va = dim ? AT(a, c, t, y, a.W - e + x) : AT(a, c, t, a.H - e + y, x);
                    AT(o, c, t, y, x) = va * (1 - wb) + AT(b, c, t, y, x) * wb;
                }
    return o;
}

/* _encode_clip with tiling on: tiles encoded, stitched in latent space. */
static rt ref_clip(const wset *s, int dif, rt x, int tile, int min_ov) {
    int ys[64], yo[64], xs[64], xo[64], th, tw;
    const int ny = ref_split(x.H, tile, min_ov, 4, ys, yo, &th),
              nx = ref_split(x.W, tile, min_ov, 4, xs, xo, &tw);
    rt tiles[64][64];
    for (int i = 0; i < ny; i++)
        for (int j = 0; j < nx; j++) {
            rt t = rt_new(x.C, x.T, th, tw);
            for (int c = 0; c < x.C; c++)
                for (int f = 0; f < x.T; f++)
                    for (int y = 0; y < th; y++)
                        for (int xx = 0; xx < tw; xx++)
                            AT(t, c, f, y, xx) = AT(x, c, f, ys[i] + y, xs[j] + xx);
            tiles[i][j] = ref_encoder(s, dif, t);
            free(t.d);
        }
    const rt t0 = tiles[0][0];
    rt out = rt_new(t0.C, t0.T, x.H / 4, x.W / 4);
    int oy = 0;
    for (int i = 0; i < ny; i++) {
        int ox = 0, kh = 0;
        for (int j = 0; j < nx; j++) {
            rt t = rt_new(t0.C, t0.T, t0.H, t0.W);
            memcpy(t.d, tiles[i][j].d, sizeof(double) * (size_t)t.C * t.T * t.H * t.W);
            if (i > 0) t = take(&t, ref_blend(tiles[i - 1][j], t, yo[i - 1] / 4, 0));
            if (j > 0) t = take(&t, ref_blend(tiles[i][j - 1], t, xo[j - 1] / 4, 1));
            const int kh_ = t.H - (i < ny - 1 ? yo[i] / 4 : 0), kw = t.W - (j < nx - 1 ? xo[j] / 4 : 0);
            for (int c = 0; c < t.C; c++)
                for (int f = 0; f < t.T; f++)
                    for (int y = 0; y < kh_; y++)
                        for (int xx = 0; xx < kw; xx++) AT(out, c, f, oy + y, ox + xx) = AT(t, c, f, y, xx);
            ox += kw;
            kh = kh_;
            free(t.d);
        }
        oy += kh;
    }
    for (int i = 0; i < ny; i++)
        for (int j = 0; j < nx; j++) free(tiles[i][j].d);
    return out;
}

/* _encode: one frame alone; else 17-frame clips (the last frame repeated), concatenated, 3 latents dropped.
 */
static rt ref_encode(const wset *s, int dif, const uint8_t *px, int F, int H, int W, int tile, int min_ov) {
    static const double mean[3] = {0.485, 0.456, 0.406}, sd[3] = {0.229, 0.224, 0.225};
    const int n = F == 1 ? 1 : (F + 16) / 17, cf = F == 1 ? 1 : 17;
    rt all = {0};
    for (int k = 0; k < n; k++) {
        rt x = rt_new(3, cf, H, W);
        for (int c = 0; c < 3; c++)
            for (int t = 0; t < cf; t++) {
                const int f = k * 17 + t < F ? k * 17 + t : F - 1;
                for (int y = 0; y < H; y++)
                    for (int xx = 0; xx < W; xx++)
                        AT(x, c, t, y, xx) =
                            (px[((size_t)(c * F + f) * H + y) * W + xx] / 255.0 - mean[c]) / sd[c];
            }
        rt m = ref_clip(s, dif, x, tile, min_ov);
        free(x.d);
        if (!all.d) all = rt_new(m.C, n * m.T, m.H, m.W);
        for (int c = 0; c < m.C; c++)
            for (int t = 0; t < m.T; t++)
                memcpy(&AT(all, c, k * m.T + t, 0, 0), &AT(m, c, t, 0, 0),
                       sizeof(double) * (size_t)m.H * m.W);
        free(m.d);
    }
    if (F == 1) return all;
    rt cut = rt_new(all.C, all.T - 3, all.H, all.W);
    for (int c = 0; c < all.C; c++)
        memcpy(&AT(cut, c, 0, 0, 0), &AT(all, c, 0, 0, 0), sizeof(double) * (size_t)cut.T * cut.H * cut.W);
    free(all.d);
    return cut;
}

/* ---- the tiny encoder against the reference --------------------------------------------------------------
 */

typedef struct {
    const char *what;
    int dif, F, H, W, tile, overlap;
} tiny_case;

static const tiny_case k_tiny[] = {
    {"image, 2x4 tiles", 0, 1, 24, 40, 16, 8},      /* overlaps of 8 px = 2 latents */
    {"22 frames, 1x2 tiles", 0, 22, 16, 24, 16, 8}, /* 2 chunks, 18 latent frames less 3 */
    {"22 frames, diffusers names, one tile", 1, 22, 16, 16, 256, 64},
    {"image, slack spread over overlaps", 1, 1, 16, 52, 24, 8}, /* overlaps 12 px → ratio steps */
};

static void test_reference(void) {
    char path[] = "/tmp/h3_venc_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    for (size_t ci = 0; ci < sizeof k_tiny / sizeof *k_tiny; ci++) {
        const tiny_case *tc = &k_tiny[ci];
        wset ws;
        make_weights(&ws, tc->dif);
        write_weights(&ws, path);
        h3_video_vae_config vc;
        tiny_config(&vc, tc->tile, tc->overlap);
        h3_st_set set;
        CHECK_OK(h3_st_open(path, &set));
        const h3_wbind wb = {&set, "", "tiny encoder", "video VAE", NULL, NULL};
        h3_video_enc *e = NULL;
        CHECK_OK(h3_video_enc_open_set(&wb, tc->dif ? H3_LAYOUT_DIFFUSERS : H3_LAYOUT_OFFICIAL, &vc, &e));
        if (!e) {
            h3_st_close(&set);
            free_weights(&ws);
            continue;
        }
        const h3_video_enc_config *c = h3_video_enc_get_config(e);
        CHECK(c->levels == NL && c->layers == NJ && c->ch[1] == 16 && c->spatial_ratio == 4 &&
              c->temporal_ratio == 2);
        const int64_t T = h3_video_enc_latent_frames(c, tc->F);
        const int64_t ps[5] = {1, 3, tc->F, tc->H, tc->W}, ms[5] = {1, 2 * LAT, T, tc->H / 4, tc->W / 4};
        h3_tensor px, m;
        CHECK_OK(h3_tensor_alloc(&px, H3_PLACE_HOST, H3_U8, 5, ps, H3_MEM_IO));
        CHECK_OK(h3_tensor_alloc(&m, H3_PLACE_HOST, H3_F32, 5, ms, H3_MEM_IO));
        for (int64_t i = 0; i < h3_tensor_numel(&px); i++)
            ((uint8_t *)px.data)[i] = (uint8_t)(t_rand_u64() & 255);
        CHECK_OK(h3_video_enc_encode(e, &g_ex, &px, &m));
        rt ref = ref_encode(&ws, tc->dif, px.data, tc->F, tc->H, tc->W, tc->tile, tc->overlap);
        CHECK(ref.T == T && ref.H == tc->H / 4 && ref.W == tc->W / 4, "%s: reference [%d, %d, %d]", tc->what,
              ref.T, ref.H, ref.W);
        if (ref.T == T) {
            const size_t n = (size_t)h3_tensor_numel(&m);
            double big = 0;
            for (size_t i = 0; i < n; i++) big = fmax(big, fabs(ref.d[i]));
            const double err = t_max_abs_err(m.data, ref.d, n) / fmax(1.0, big);
            t_note("%s: max |h3run - reference| / max(1, max |reference|) = %.2e (max |ref| %.2f)\n",
                   tc->what, err, big);
            CHECK(err <= 1e-5, "%s: %.3e", tc->what, err);
        }
        free(ref.d);
        h3_tensor_free(&px);
        h3_tensor_free(&m);
        h3_video_enc_close(e);
        h3_st_close(&set);
        free_weights(&ws);
    }
    unlink(path);
}

/* The posterior: the mean as it is; a sample = mean + exp(logvar/2)·noise, f16-rounded, normalized. */
static void test_posterior(void) {
    h3_video_vae_config vc;
    tiny_config(&vc, 256, 64);
    h3_video_enc_config c;
    memset(&c, 0, sizeof c);
    c.latent_channels = LAT;
    memcpy(c.latents_mean, vc.latents_mean, sizeof c.latents_mean);
    memcpy(c.latents_std, vc.latents_std, sizeof c.latents_std);
    const int64_t ms[4] = {2 * LAT, 2, 3, 3}, ls[4] = {LAT, 2, 3, 3};
    h3_tensor m, z;
    CHECK_OK(h3_tensor_alloc(&m, H3_PLACE_HOST, H3_F32, 4, ms, H3_MEM_IO));
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 4, ls, H3_MEM_IO));
    const int64_t n = h3_tensor_numel(&z);
    float *mv = m.data, noise[LAT * 18];
    for (int64_t i = 0; i < n; i++) mv[i] = (float)t_uniform(-3, 3);
    for (int64_t i = 0; i < n; i++) mv[n + i] = i == 0 ? -40.0f : i == 1 ? 30.0f : (float)t_uniform(-4, 2);
    t_fill_randn(noise, (size_t)n, 1.0);
    CHECK_OK(h3_video_enc_posterior(&c, &m, NULL, &z));
    CHECK(!memcmp(z.data, m.data, (size_t)n * sizeof(float)), "the mean is the first half as it is");
    CHECK_OK(h3_video_enc_posterior(&c, &m, noise, &z));
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double lv = fmin(20.0, fmax(-30.0, mv[n + i])), v = mv[i] + exp(0.5 * lv) * noise[i];
        const int ch = (int)(i / 18);
        /* f16 keeps 11 bits: |v − f16(v)| <= |v|·2⁻¹¹ */
        const double want = (v - c.latents_mean[ch]) / c.latents_std[ch],
                     tol = fabs(v) * 4.9e-4 / c.latents_std[ch] + 1e-6;
        worst = fmax(worst, fabs(((float *)z.data)[i] - want) / tol);
        CHECK(((float *)z.data)[i] * c.latents_std[ch] + c.latents_mean[ch] ==
                  ((float *)z.data)[i] * c.latents_std[ch] + c.latents_mean[ch],
              "finite");
    }
    CHECK(worst <= 1.0, "sample off by %.2f of the f16 rounding bound", worst);
    /* the value before normalization is an f16 value */
    const float v0 = ((float *)z.data)[5] * c.latents_std[0] + c.latents_mean[0];
    CHECK(fabsf(h3_f16_to_f32(h3_f32_to_f16(v0)) - v0) <= 1e-6f * fmaxf(1.0f, fabsf(v0)));
    const int64_t bad[4] = {LAT, 2, 3, 2};
    h3_tensor zb;
    CHECK_OK(h3_tensor_alloc(&zb, H3_PLACE_HOST, H3_F32, 4, bad, H3_MEM_IO));
    CHECK_ERR(h3_video_enc_posterior(&c, &m, NULL, &zb), H3_ERR_INVALID, "posterior");
    h3_tensor_free(&zb);
    h3_tensor_free(&m);
    h3_tensor_free(&z);
}

/* ---- the small model
 * --------------------------------------------------------------------------------------- */

static const char *small_model(char *buf, size_t n) {
    const char *src = getenv("H3_SOURCE_DIR");
    snprintf(buf, n, "%s/models/h3-small/video_vae", src ? src : ".");
    return buf;
}

/* A synthetic clip (docs/SYNTH.md) encoded and decoded by the small model: PSNR on [0, 1] pixels. */
static void test_small_roundtrip(void) {
    char mp[1024];
    h3_video_vae *v = NULL;
    h3_video_enc *e = NULL;
    CHECK_OK(h3_video_vae_open(small_model(mp, sizeof mp), NULL, &v));
    if (!v) return;
    CHECK_OK(h3_video_enc_open(v, &e));
    if (!e) {
        h3_video_vae_close(v);
        return;
    }
    const h3_video_enc_config *c = h3_video_enc_get_config(e);
    static const struct {
        int F;
        double min_psnr;
    } cases[] = {{1, 25.0}, {22, 23.0}}; /* measured 27.8 and 25.8 dB */
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int F = cases[ci].F, H = 128, W = 128;
        h3_synth_scene sc;
        h3_synth_scene_make(h3_synth_heldout_combo(3), 7, &sc);
        float *rgb = malloc(sizeof(float) * 3 * (size_t)F * H * W);
        h3_synth_render(&sc, W, H, F, rgb, NULL, NULL);
        const int64_t ps[5] = {1, 3, F, H, W};
        const int64_t T = h3_video_enc_latent_frames(c, F), ms[5] = {1, 48, T, H / 16, W / 16},
                      zs[5] = {1, 24, T, H / 16, W / 16};
        h3_tensor px, m, z, z2 = {0}, out;
        CHECK_OK(h3_tensor_alloc(&px, H3_PLACE_HOST, H3_U8, 5, ps, H3_MEM_IO));
        for (int t = 0; t < F; t++)
            for (int ch = 0; ch < 3; ch++)
                for (int i = 0; i < H * W; i++)
                    ((uint8_t *)px.data)[((size_t)ch * F + t) * H * W + i] = (uint8_t)lrintf(
                        fminf(fmaxf(rgb[((size_t)t * 3 + ch) * H * W + i], 0.0f), 1.0f) * 255.0f);
        CHECK_OK(h3_tensor_alloc(&m, H3_PLACE_HOST, H3_F32, 5, ms, H3_MEM_IO));
        CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 5, zs, H3_MEM_IO));
        CHECK_OK(h3_video_enc_encode(e, &g_ex, &px, &m));
        CHECK_OK(h3_video_enc_posterior(c, &m, NULL, &z));
        /* normalized as the DiT's latents are, which the decoder de-normalizes */
        const int64_t per = T * (H / 16) * (W / 16);
        for (int64_t i = 0; i < h3_tensor_numel(&z); i++)
            ((float *)z.data)[i] =
                (((float *)z.data)[i] - c->latents_mean[i / per]) / c->latents_std[i / per];
        const int64_t frames = h3_video_vae_num_frames(h3_video_vae_get_config(v), T);
        CHECK(frames == F, "%lld latent frames decode to %lld frames", (long long)T, (long long)frames);
        const int64_t os[4] = {3, frames, H, W};
        CHECK_OK(h3_tensor_alloc(&out, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_IO));
        h3_video_decode_out dst = {H3_PIXELS_UNIT, NULL, NULL, &out};
        CHECK_OK(h3_video_vae_decode(v, &g_ex, &z, &dst));
        double se = 0;
        const int64_t n = 3 * (int64_t)F * H * W;
        for (int64_t i = 0; i < n; i++) {
            const double d = ((float *)out.data)[i] - ((uint8_t *)px.data)[i] / 255.0;
            se += d * d;
        }
        const double psnr = 10 * log10(1.0 / (se / (double)n));
        t_note("small model, %d frames of 128x128: encode then decode PSNR %.2f dB\n", F, psnr);
        CHECK(psnr >= cases[ci].min_psnr, "%d frames: PSNR %.2f dB < %.1f", F, psnr, cases[ci].min_psnr);
        free(rgb);
        h3_tensor_free(&px);
        h3_tensor_free(&m);
        h3_tensor_free(&z);
        h3_tensor_free(&z2);
        h3_tensor_free(&out);
    }
    h3_video_enc_close(e);
    h3_video_vae_close(v);
}

/* The host encode's measured peak against h3_video_enc_mem_of, for an image and a clip of the small model;
 * a clip 3 chunks longer takes the same. */
static void test_memory(void) {
    char mp[1024];
    h3_video_vae *v = NULL;
    h3_video_enc *e = NULL;
    CHECK_OK(h3_video_vae_open(small_model(mp, sizeof mp), NULL, &v));
    if (v) CHECK_OK(h3_video_enc_open(v, &e));
    if (!e) {
        h3_video_vae_close(v);
        return;
    }
    const h3_video_enc_config *c = h3_video_enc_get_config(e);
    static const int k_f[3] = {1, 22, 39};
    int64_t peaks[3] = {0};
    for (int k = 0; k < 3; k++) {
        const int F = k_f[k], H = 32, W = 288; /* 2 tiles across */
        const int64_t T = h3_video_enc_latent_frames(c, F), ps[5] = {1, 3, F, H, W},
                      ms[5] = {1, 48, T, H / 16, W / 16};
        h3_tensor px, m;
        CHECK_OK(h3_tensor_alloc(&px, H3_PLACE_HOST, H3_U8, 5, ps, H3_MEM_IO));
        CHECK_OK(h3_tensor_alloc(&m, H3_PLACE_HOST, H3_F32, 5, ms, H3_MEM_IO));
        memset(px.data, 77, (size_t)h3_tensor_numel(&px));
        h3_video_enc_mem plan;
        CHECK_OK(h3_video_enc_mem_of(c, F, H, W, H3_PLACE_HOST, &plan));
        CHECK(plan.tiles_x == 2 && plan.tiles_y == 1 && plan.latent_frames == T);
        h3_mem_stats s0, s1;
        h3_mem_get_stats(&s0);
        h3_mem_reset_peaks();
        CHECK_OK(h3_video_enc_encode(e, &g_ex, &px, &m));
        h3_mem_get_stats(&s1);
        peaks[k] = s1.total_peak - s0.total_current;
        t_note("%d frames: measured peak %lld B, planned %lld B\n", F, (long long)peaks[k],
               (long long)plan.host_total);
        /* the plan counts every buffer and the largest conv scratch */
        CHECK(peaks[k] == plan.host_total, "%d frames: %lld vs %lld", F, (long long)peaks[k],
              (long long)plan.host_total);
        h3_tensor_free(&px);
        h3_tensor_free(&m);
    }
    CHECK(peaks[1] == peaks[2], "a longer clip takes the same memory: %lld vs %lld", (long long)peaks[1],
          (long long)peaks[2]);
    h3_video_enc_close(e);
    h3_video_vae_close(v);
}

/* Bad pixels: one table, one message each. */
static void test_bad_pixels(void) {
    char mp[1024];
    h3_video_vae *v = NULL;
    h3_video_enc *e = NULL;
    CHECK_OK(h3_video_vae_open(small_model(mp, sizeof mp), NULL, &v));
    if (v) CHECK_OK(h3_video_enc_open(v, &e));
    if (!e) {
        h3_video_vae_close(v);
        return;
    }
    static const struct {
        h3_dtype dt;
        int nd;
        int64_t s[5];
        const char *needle;
    } k_bad[] = {
        {H3_F32, 5, {1, 3, 1, 32, 32}, "uint8"},          {H3_U8, 5, {2, 3, 1, 32, 32}, "[1, 3, frames"},
        {H3_U8, 5, {1, 4, 1, 32, 32}, "[1, 3, frames"},   {H3_U8, 3, {3, 32, 32}, "[1, 3, frames"},
        {H3_U8, 5, {1, 3, 2, 32, 32}, "17n+5"},           {H3_U8, 5, {1, 3, 21, 32, 32}, "17n+5"},
        {H3_U8, 5, {1, 3, 1, 40, 32}, "multiples of 16"}, {H3_U8, 5, {1, 3, 1, 16, 32}, "multiples of 16"},
        {H3_U8, 5, {1, 3, 1, 32, 16400}, "16384"},
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof *k_bad; i++) {
        h3_tensor t;
        memset(&t, 0, sizeof t);
        t.dtype = k_bad[i].dt;
        t.ndim = k_bad[i].nd;
        memcpy(t.shape, k_bad[i].s, sizeof t.shape);
        int64_t st = 1;
        for (int d = t.ndim - 1; d >= 0; d--) t.stride[d] = st, st *= t.shape[d];
        CHECK_ERR(h3_video_enc_check_pixels(h3_video_enc_get_config(e), &t), H3_ERR_INVALID, k_bad[i].needle);
    }
    CHECK(h3_video_enc_frames_ok(h3_video_enc_get_config(e), 5) &&
          h3_video_enc_frames_ok(h3_video_enc_get_config(e), 124));
    h3_video_enc_close(e);
    h3_video_vae_close(v);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"reference", test_reference},
        {"posterior", test_posterior},
        {"small_roundtrip", test_small_roundtrip},
        {"memory", test_memory},
        {"bad_pixels", test_bad_pixels},
        {NULL, NULL},
    };
    if (h3_exec_init(&g_ex, 2) != H3_OK) return 1;
    int r = t_main("test_video_vae_enc", cases, argc, argv);
    h3_exec_free(&g_ex);
    return r;
}

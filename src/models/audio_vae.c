/* The MiniMax-H3 audio VAE decoder (BigVGAN): configuration and weights of the three layouts, weight norm folded at
 * open, and the decode. See audio_vae.h. */
#include "models/audio_vae.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "io/safetensors.h"
#include "io/wbind.h"
#include "models/model_cfg.h"

/* ---- the resampling filter ---------------------------------------------------------------------------------- */

/* Modified Bessel function of the first kind, order 0, by its power series (converges for every argument; the
 * Kaiser β here is below 10). */
static double bessel_i0(double x) {
    double sum = 1.0, term = 1.0, q = x * x / 4.0;
    for (int k = 1; k < 500; k++) {
        term *= q / ((double)k * (double)k);
        sum += term;
        if (term < sum * 1e-17) break;
    }
    return sum;
}

void h3_audio_kaiser_filter(float *out, int taps, double cutoff, double half_width) {
    int half = taps / 2;
    double att = 2.285 * (half - 1) * M_PI * (4.0 * half_width) + 7.95, beta;
    if (att > 50.0) beta = 0.1102 * (att - 8.7);
    else if (att >= 21.0) beta = 0.5842 * pow(att - 21.0, 0.4) + 0.07886 * (att - 21.0);
    else beta = 0.0;
    double f[256], sum = 0.0;
    for (int n = 0; n < taps && n < 256; n++) {
        double r = taps > 1 ? 2.0 * n / (taps - 1) - 1.0 : 0.0;
        double w = bessel_i0(beta * sqrt(fmax(0.0, 1.0 - r * r))) / bessel_i0(beta);
        double t = taps % 2 == 0 ? (n - half) + 0.5 : (double)(n - half);
        double a = 2.0 * cutoff * t, sinc = a == 0.0 ? 1.0 : sin(M_PI * a) / (M_PI * a);
        f[n] = 2.0 * cutoff * w * sinc;
        sum += f[n];
    }
    for (int n = 0; n < taps && n < 256; n++) out[n] = (float)(f[n] / sum);
}

/* ---- the model ---------------------------------------------------------------------------------------------- */

struct h3_audio_vae {
    h3_audio_vae_config cfg;
    h3_layout layout;
    h3_st_set st;
    char *source;
    h3_wbind wb; /* the binder over st (io/wbind.h): every weight is reached through it */
    int compute_filters;
    int n_conv;
    h3_tensor *folded; /* per conv: the weight-norm-folded f32 weight, or empty when the file stores it plain */
    h3_tensor ones;    /* [max channels, 1, 1] of 1: the replicate-padding copy is a 1-tap depthwise conv */
    float filter[64];  /* computed resampling filter (filter_taps values) */
};

/* Convolution ids: conv_pre, the upsamplers, the AMP convs (stage, block, dilation, first/second), conv_post. */
static int av_up(int i) {
    return 1 + i;
}
static int av_res(const h3_audio_vae_config *c, int i, int r, int d, int which) {
    return 1 + c->n_up + (((i * c->n_res + r) * c->n_dil + d) * 2 + which);
}
static int av_post(const h3_audio_vae_config *c) {
    return 1 + c->n_up + c->n_up * c->n_res * c->n_dil * 2;
}

static int64_t av_ch(const h3_audio_vae_config *c, int stage) { /* channels after upsampler `stage` */
    return (int64_t)c->decoder_dim >> (stage + 1);
}

/* Name (without ".weight") and expected weight shape of conv id; *bias whether it has one; the unit it
 * belongs to (BigVGAN stage i for upsampler i and its AMP blocks; the input and output convs belong to the
 * decoder) and its shape in words. */
static void av_conv_desc(const h3_audio_vae_config *c, int id, char *name, size_t n, int64_t *s, int *bias,
                         h3_wb_unit *unit, const char **words) {
    *bias = 1;
    if (id == 0) {
        snprintf(name, n, "decoder.conv_pre");
        s[0] = c->decoder_dim, s[1] = c->latent_dim, s[2] = 7;
        *unit = (h3_wb_unit){NULL, 0, -1};
        *words = "[decoder_dim, latent_dim, 7]";
    } else if (id <= c->n_up) {
        int i = id - 1;
        snprintf(name, n, "decoder.ups.%d.0", i);
        s[0] = (int64_t)c->decoder_dim >> i, s[1] = av_ch(c, i), s[2] = c->kernels[i];
        *unit = (h3_wb_unit){"BigVGAN stage", i, i};
        *words = "[channels in, channels in / 2, kernel]";
    } else if (id == av_post(c)) {
        snprintf(name, n, "decoder.conv_post");
        s[0] = 1, s[1] = av_ch(c, c->n_up - 1), s[2] = 7;
        *bias = 0;
        *unit = (h3_wb_unit){NULL, 0, c->n_up};
        *words = "[1, last stage's channels, 7]";
    } else {
        int k = id - 1 - c->n_up, which = k % 2, d = (k / 2) % c->n_dil, r = (k / 2 / c->n_dil) % c->n_res;
        int i = k / 2 / c->n_dil / c->n_res;
        snprintf(name, n, "decoder.resblocks.%d.convs%d.%d", i * c->n_res + r, which + 1, d);
        s[0] = s[1] = av_ch(c, i), s[2] = c->res_kernels[r];
        *unit = (h3_wb_unit){"BigVGAN stage", i, i};
        *words = "[channels, channels, AMP kernel]";
    }
}

/* A row of the audio VAE: f32, f16 or bf16 of exactly shape s (nd dims), bound into dst (NULL: checked only).
 */
static h3_wb_row av_row(const char *name, int nd, const int64_t *s, const char *words, h3_wb_unit unit,
                        h3_tensor *dst) {
    h3_wb_row r = h3_wb_row_make(name, dst, nd, 0, 0, 0, 0, H3_WB_FLOATS, 0, words, unit);
    memcpy(r.shape, s, (size_t)nd * sizeof *s);
    return r;
}

static h3_status av_need(const h3_audio_vae *v, const char *name, int nd, const int64_t *s, const char *words,
                         h3_wb_unit unit) {
    h3_wb_row r = av_row(name, nd, s, words, unit, NULL);
    return h3_wb_check(&v->wb, &r, NULL, NULL);
}

static h3_status av_bind(const h3_audio_vae *v, const char *name, int nd, const int64_t *s, const char *words,
                         h3_wb_unit unit, h3_tensor *dst) {
    h3_wb_row r = av_row(name, nd, s, words, unit, dst);
    return h3_wb_bind(&v->wb, &r);
}

/* Folds weight norm for conv id when the file stores it that way: w = v · g / ‖v‖, the norm over every dim but the
 * first (what torch's weight_norm(dim=0) computes, also for transposed convs). Checks the shapes either way. */
static h3_status av_prepare_conv(h3_audio_vae *v, int id) {
    char base[128], name[192];
    int64_t s[3];
    int bias;
    h3_wb_unit unit;
    const char *words;
    av_conv_desc(&v->cfg, id, base, sizeof base, s, &bias, &unit, &words);
    const int64_t *bs = &s[id >= 1 && id <= v->cfg.n_up ? 1 : 0];
    if (bias) {
        snprintf(name, sizeof name, "%s.bias", base);
        H3_TRY(av_need(v, name, 1, bs, id >= 1 && id <= v->cfg.n_up ? "[channels in / 2]" : "[channels out]",
                       unit));
    }
    snprintf(name, sizeof name, "%s.weight", base);
    if (h3_st_find(&v->st, name)) return av_need(v, name, 3, s, words, unit);
    static const char *const forms[2][2] = {{".weight_g", ".weight_v"},
                                            {".parametrizations.weight.original0", ".parametrizations.weight.original1"}};
    int f = -1;
    for (int k = 0; k < 2 && f < 0; k++) {
        snprintf(name, sizeof name, "%s%s", base, forms[k][1]);
        if (h3_st_find(&v->st, name)) f = k;
    }
    if (f < 0) {
        snprintf(name, sizeof name, "%s.weight", base);
        return h3_wb_missing_error(&v->wb, name, &unit, "a weight (or weight_g and weight_v)");
    }
    char gname[192], vname[192];
    snprintf(gname, sizeof gname, "%s%s", base, forms[f][0]);
    snprintf(vname, sizeof vname, "%s%s", base, forms[f][1]);
    H3_TRY(av_need(v, vname, 3, s, words, unit));
    const int64_t gs[3] = {s[0], 1, 1};
    h3_tensor g = {0}, vt = {0}, w = {0};
    float *gf = NULL;
    h3_status st = H3_OK;
    H3_CHECK(av_bind(v, gname, 3, gs, "[output rows, 1, 1] (weight norm's magnitudes)", unit, &g));
    H3_CHECK(av_bind(v, vname, 3, s, words, unit, &vt));
    H3_CHECK(h3_tensor_alloc(&w, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_WEIGHTS));
    gf = h3_malloc((size_t)s[0] * sizeof(float), H3_MEM_WORKSPACE);
    if (!gf) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    if (!h3_convert_to_f32(g.dtype, g.data, gf, (size_t)s[0]) ||
        !h3_convert_to_f32(vt.dtype, vt.data, w.data, (size_t)h3_tensor_numel(&w)))
        H3_FAIL(H3_ERR_UNSUPPORTED, "%s: cannot read %s as f32", v->source, vname);
    int64_t row = s[1] * s[2];
    for (int64_t o = 0; o < s[0]; o++) {
        float *r = (float *)w.data + o * row;
        double ss = 0.0;
        for (int64_t i = 0; i < row; i++) ss += (double)r[i] * r[i];
        float nrm = (float)sqrt(ss), k = gf[o] / nrm;
        if (!(nrm > 0.0f)) H3_FAIL(H3_ERR_FORMAT, "%s: '%s' has an all-zero row %lld", v->source, vname, (long long)o);
        for (int64_t i = 0; i < row; i++) r[i] *= k;
    }
    v->folded[id] = w;
    w.owner = NULL;
done:
    h3_free(gf);
    h3_tensor_free(&g);
    h3_tensor_free(&vt);
    h3_tensor_free(&w);
    return st;
}

static const char *av_act_name(const h3_audio_vae_config *c, int stage, int r, int a, char *buf, size_t n) {
    if (stage < 0) snprintf(buf, n, "decoder.activation_post");
    else snprintf(buf, n, "decoder.resblocks.%d.activations.%d", stage * c->n_res + r, a);
    return buf;
}

/* The unit of an activation: BigVGAN stage `stage`, or (stage < 0) activation_post, with the output conv. */
static h3_wb_unit av_act_unit(const h3_audio_vae_config *c, int stage) {
    return stage < 0 ? (h3_wb_unit){NULL, 0, c->n_up} : (h3_wb_unit){"BigVGAN stage", stage, stage};
}

/* alpha, beta [C] and, unless computed, the two stored filters [1, 1, taps]. */
static h3_status av_check_act(const h3_audio_vae *v, const char *base, int64_t C, h3_wb_unit unit) {
    char name[192];
    int64_t fs[3] = {1, 1, v->cfg.filter_taps};
    snprintf(name, sizeof name, "%s.act.alpha", base);
    H3_TRY(av_need(v, name, 1, &C, "[channels]", unit));
    snprintf(name, sizeof name, "%s.act.beta", base);
    H3_TRY(av_need(v, name, 1, &C, "[channels]", unit));
    static const char *const f[2] = {".upsample.filter", ".downsample.lowpass.filter"};
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "%s%s", base, f[k]);
        if (h3_st_find(&v->st, name)) H3_TRY(av_need(v, name, 3, fs, "[1, 1, filter taps]", unit));
    }
    return H3_OK;
}

/* ---- configuration files ------------------------------------------------------------------------------------ */

/* An integer list (the JSON array j, or nothing when NULL) of at most max values, each in [lo, hi]; *n receives
 * the count. */
static h3_status jints_of(const json_t *j, const char *key, int max, int lo, int hi, int *out, int *n,
                          const char *what) {
    if (!j) return H3_OK;
    if (!json_is_array(j) || json_array_size(j) < 1 || json_array_size(j) > (size_t)max)
        return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be a list of 1 to %d integers", what, key, max);
    for (size_t i = 0; i < json_array_size(j); i++) {
        json_t *e = json_array_get(j, i);
        double d = json_is_number(e) ? json_number_value(e) : NAN;
        if (!(d >= lo && d <= hi) || d != floor(d))
            return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must hold integers in [%d, %d]", what, key, lo, hi);
        out[i] = (int)d;
    }
    *n = (int)json_array_size(j);
    return H3_OK;
}

static h3_status jints(const json_t *o, const char *key, int max, int lo, int hi, int *out, int *n, const char *what) {
    return jints_of(o ? json_object_get(o, key) : NULL, key, max, lo, hi, out, n, what);
}

/* An anchor of the architecture the shapes define: a float tensor of rank 3 (free sizes) under the first of
 * the names that exists; its name into *found and its shape into out. */
static h3_status av_anchor(const h3_audio_vae *v, const char *const *names, int n_names, const char *words,
                           h3_wb_unit unit, const char **found, int64_t *out) {
    int k = 0;
    while (k < n_names - 1 && !h3_st_find(&v->st, names[k])) k++;
    h3_wb_row r =
        h3_wb_row_make(names[k], NULL, 3, H3_WB_ANY, H3_WB_ANY, H3_WB_ANY, 0, H3_WB_FLOATS, 0, words, unit);
    h3_wb_info in;
    if (!h3_st_find(&v->st, names[k])) k = 0, r.name = names[0]; /* none: name the plain form as missing */
    H3_TRY(h3_wb_check(&v->wb, &r, NULL, &in));
    *found = names[k];
    memcpy(out, in.shape, 3 * sizeof *out);
    return H3_OK;
}

/* Shapes first (they define the architecture), then what the configs add. Every size read from a shape is
 * checked here in the binder's message form; av_finish then checks every tensor against the architecture. */
static h3_status av_shapes(h3_audio_vae *v) {
    h3_audio_vae_config *c = &v->cfg;
    const h3_wb_unit model = {NULL, 0, -1};
    const char *nm;
    int64_t s[3];
    static const char *const in_names[1] = {"dec_in_proj.weight"};
    H3_TRY(av_anchor(v, in_names, 1, "[latent_dim, latent channels, 1]", model, &nm, s));
    if (s[2] != 1 || s[1] < 1 || s[1] > H3_AVAE_MAX_CHANNELS || s[0] < 1 || s[0] > (1 << 16))
        return h3_wb_shape_error(
            &v->wb, nm, 3, s, &model,
            "[latent_dim, latent channels, 1] with 1 to %d latent channels and a latent_dim of 1 "
            "to 65536",
            H3_AVAE_MAX_CHANNELS);
    c->latent_channels = (int)s[1];
    c->latent_dim = (int)s[0];
    static const char *const pre_names[3] = {"decoder.conv_pre.weight", "decoder.conv_pre.weight_v",
                                             "decoder.conv_pre.parametrizations.weight.original1"};
    H3_TRY(av_anchor(v, pre_names, 3, "[decoder_dim, latent_dim, 7]", model, &nm, s));
    int n_up = h3_count_layers(&v->st, "decoder.ups.");
    int n_rb = h3_count_layers(&v->st, "decoder.resblocks.");
    if (n_up < 1 || n_up > H3_AVAE_MAX_UPS || n_rb % n_up || n_rb / n_up < 1 || n_rb / n_up > H3_AVAE_MAX_RES)
        return H3_ERR(H3_ERR_FORMAT, "%s: %d upsamplers and %d AMP blocks do not make a BigVGAN decoder", v->source,
                      n_up, n_rb);
    if (s[0] < 2 || s[0] > (1 << 16) || ((s[0] >> n_up) << n_up) != s[0])
        return h3_wb_shape_error(
            &v->wb, nm, 3, s, &model,
            "[decoder_dim, latent_dim, 7] with decoder_dim a multiple of 2^%d (halved by each of "
            "the %d upsamplers)",
            n_up, n_up);
    c->decoder_dim = (int)s[0];
    c->n_up = n_up;
    c->n_res = n_rb / n_up;
    char n0[192], n1[192], n2[192];
    const char *names[3] = {n0, n1, n2};
    for (int i = 0; i < n_up; i++) {
        const h3_wb_unit st = {"BigVGAN stage", i, i};
        snprintf(n0, sizeof n0, "decoder.ups.%d.0.weight", i);
        snprintf(n1, sizeof n1, "decoder.ups.%d.0.weight_v", i);
        snprintf(n2, sizeof n2, "decoder.ups.%d.0.parametrizations.weight.original1", i);
        H3_TRY(av_anchor(v, names, 3, "[channels in, channels in / 2, kernel]", st, &nm, s));
        if (s[2] < 1 || s[2] > 64)
            return h3_wb_shape_error(&v->wb, nm, 3, s, &st,
                                     "[channels in, channels in / 2, kernel] with a kernel of 1 "
                                     "to 64");
        c->kernels[i] = (int)s[2];
        c->rates[i] = c->kernels[i] % 2 ? (c->kernels[i] + 1) / 2 : c->kernels[i] / 2; /* k = 2u − (u mod 2) */
    }
    int n_dil = 0;
    for (int r = 0; r < c->n_res; r++) {
        char pfx[96];
        snprintf(pfx, sizeof pfx, "decoder.resblocks.%d.convs1.", r);
        int nd = h3_count_layers(&v->st, pfx);
        if (r == 0) n_dil = nd;
        if (nd != n_dil || nd < 1 || nd > H3_AVAE_MAX_RES)
            return H3_ERR(H3_ERR_FORMAT, "%s: AMP block %d has %d dilated convs", v->source, r, nd);
        const h3_wb_unit st = {"BigVGAN stage", 0, 0};
        snprintf(n0, sizeof n0, "decoder.resblocks.%d.convs1.0.weight", r);
        snprintf(n1, sizeof n1, "decoder.resblocks.%d.convs1.0.weight_v", r);
        snprintf(n2, sizeof n2, "decoder.resblocks.%d.convs1.0.parametrizations.weight.original1", r);
        H3_TRY(av_anchor(v, names, 3, "[channels, channels, AMP kernel]", st, &nm, s));
        if (s[2] < 1 || s[2] > 63 || s[2] % 2 == 0)
            return h3_wb_shape_error(&v->wb, nm, 3, s, &st,
                                     "[channels, channels, AMP kernel] with an odd kernel of 1 "
                                     "to 63");
        c->res_kernels[r] = (int)s[2];
        for (int d = 0; d < nd; d++) c->dilations[r][d] = 2 * d + 1; /* 1, 3, 5: BigVGAN's, not in any config */
    }
    c->n_dil = n_dil;
    static const char *const f_name = "decoder.activation_post.upsample.filter";
    const h3_st_entry *f = h3_st_find(&v->st, f_name);
    c->filter_taps = f && f->ndim == 3 ? (int)f->shape[2] : 12;
    if (c->filter_taps < 2 || c->filter_taps > 64 || c->filter_taps % 2)
        return h3_wb_shape_error(&v->wb, f_name, f->ndim, f->shape, &(h3_wb_unit){NULL, 0, c->n_up},
                                 "[1, 1, taps] with an even count of 2 to 64 taps");
    return H3_OK;
}

static h3_status av_open_weights(h3_audio_vae *v, const char *path) {
    H3_TRY(h3_st_open(path, &v->st));
    v->wb = (h3_wbind){&v->st, "", NULL, "audio VAE", NULL, NULL};
    return H3_OK;
}

/* Reads `path` (folder or file): opens the weights and the configs. */
static h3_status av_resolve(h3_audio_vae *v, const char *path, int depth) {
    h3_status st = H3_OK;
    json_t *cfg = NULL, *meta = NULL, *blob = NULL;
    char *wpath = NULL;
    char what[1100];
    h3_audio_vae_config *c = &v->cfg;
    if (!h3_path_exists(path)) return H3_ERR(H3_ERR_NOT_FOUND, "%s: no such file or folder", path);
    if (!h3_path_is_dir(path)) {
        v->layout = H3_LAYOUT_COMFY;
        H3_CHECK(av_open_weights(v, path));
        H3_CHECK(av_shapes(v));
        const char *m = h3_st_metadata(&v->st, "minimax_h3_audio_vae");
        if (m) {
            H3_CHECK_CTX(h3_json_parse(m, strlen(m), "metadata \"minimax_h3_audio_vae\"", &blob), "%s", path);
            snprintf(what, sizeof what, "%s metadata", path);
            H3_CHECK(h3_cfg_int(blob, "sample_rate", 1, 1000000, &c->sample_rate, what));
        }
        int64_t C = c->latent_channels;
        if (h3_st_find(&v->st, "latents_mean") || !blob) {
            h3_tensor m1 = {0}, s1 = {0};
            const h3_wb_unit model = {NULL, 0, -1};
            st = av_need(v, "latents_mean", 1, &C, "[latent channels]", model);
            if (st == H3_OK) st = av_need(v, "latents_std", 1, &C, "[latent channels]", model);
            if (st == H3_OK) st = h3_st_load(&v->st, "latents_mean", H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &m1);
            if (st == H3_OK) st = h3_st_load(&v->st, "latents_std", H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &s1);
            if (st == H3_OK) {
                memcpy(c->latents_mean, m1.data, (size_t)C * 4);
                memcpy(c->latents_std, s1.data, (size_t)C * 4);
                for (int i = 0; i < C && st == H3_OK; i++)
                    if (!isfinite(c->latents_mean[i]) || !isfinite(c->latents_std[i]) || c->latents_std[i] == 0.0f)
                        st = H3_ERR(H3_ERR_FORMAT, "%s: latents_mean/latents_std[%d] are not finite (std nonzero)",
                                    path, i);
            }
            h3_tensor_free(&m1);
            h3_tensor_free(&s1);
            if (st != H3_OK) goto done;
        } else {
            H3_CHECK(h3_cfg_floats(blob, "latents_mean", c->latent_channels, 1, 0, c->latents_mean, what));
            H3_CHECK(h3_cfg_floats(blob, "latents_std", c->latent_channels, 1, 1, c->latents_std, what));
        }
        goto done;
    }
    int has_meta = 0, has_cfg = 0;
    H3_CHECK(h3_cfg_file_in(path, "metadata.json", &has_meta));
    H3_CHECK(h3_cfg_file_in(path, "config.json", &has_cfg));
    if (has_cfg) {
        H3_CHECK(h3_cfg_load_json_in(path, "config.json", &cfg));
        snprintf(what, sizeof what, "%s/config.json", path);
        if (has_meta) { /* official */
            v->layout = H3_LAYOUT_OFFICIAL;
            H3_CHECK(h3_cfg_load_json_in(path, "metadata.json", &meta));
            const char *sf = h3_json_get_str(cfg, "source_safetensors_path");
            wpath = h3_path_join(path, sf ? sf : "model.safetensors");
            if (!wpath) H3_FAIL(H3_ERR_NOMEM, "out of memory");
            H3_CHECK(av_open_weights(v, wpath));
            H3_CHECK(av_shapes(v));
            json_t *kw = json_object_get(json_object_get(meta, "metadata"), "kwargs");
            char mwhat[1100];
            snprintf(mwhat, sizeof mwhat, "%s/metadata.json", path);
            if (!kw || !json_is_object(kw)) H3_FAIL(H3_ERR_FORMAT, "%s: no \"metadata\".\"kwargs\" object", mwhat);
            const char *dt = h3_json_get_str(kw, "decoder_type");
            if (dt && strcmp(dt, "bigvgan") != 0)
                H3_FAIL(H3_ERR_UNSUPPORTED, "%s: decoder_type \"%s\"; h3run decodes \"bigvgan\"", mwhat, dt);
            int rates[H3_AVAE_MAX_UPS], nr = 0;
            H3_CHECK(jints(kw, "decoder_rates", H3_AVAE_MAX_UPS, 1, 64, rates, &nr, mwhat));
            if (nr && nr != c->n_up)
                H3_FAIL(H3_ERR_FORMAT, "%s: %d decoder_rates for %d upsamplers", mwhat, nr, c->n_up);
            for (int i = 0; i < nr; i++) c->rates[i] = rates[i];
            H3_CHECK(h3_cfg_int(kw, "sample_rate", 1, 1000000, &c->sample_rate, mwhat));
            H3_CHECK(h3_cfg_int(cfg, "sample_rate", 1, 1000000, &c->sample_rate, what));
        } else if (json_object_get(cfg, "decoder_rates") || json_object_get(cfg, "resblock_kernel_sizes")) {
            v->layout = H3_LAYOUT_DIFFUSERS;
            H3_CHECK(av_open_weights(v, path));
            H3_CHECK(av_shapes(v));
            int a[H3_AVAE_MAX_UPS], n = 0;
            H3_CHECK(jints(cfg, "decoder_rates", H3_AVAE_MAX_UPS, 1, 64, a, &n, what));
            if (n && n != c->n_up) H3_FAIL(H3_ERR_FORMAT, "%s: %d decoder_rates for %d upsamplers", what, n, c->n_up);
            for (int i = 0; i < n; i++) c->rates[i] = a[i];
            json_t *dl = json_object_get(cfg, "resblock_dilation_sizes");
            if (dl) {
                if (!json_is_array(dl) || json_array_size(dl) != (size_t)c->n_res)
                    H3_FAIL(H3_ERR_FORMAT, "%s: \"resblock_dilation_sizes\" must list %d blocks", what, c->n_res);
                for (int r = 0; r < c->n_res; r++) {
                    int nd = 0;
                    H3_CHECK(jints_of(json_array_get(dl, (size_t)r), "resblock_dilation_sizes", H3_AVAE_MAX_RES, 1, 64,
                                      c->dilations[r], &nd, what));
                    if (nd != c->n_dil)
                        H3_FAIL(H3_ERR_FORMAT, "%s: block %d lists %d dilations; the weights have %d", what, r, nd,
                                c->n_dil);
                }
            }
            H3_CHECK(h3_cfg_int(cfg, "sampling_rate", 1, 1000000, &c->sample_rate, what));
        } else {
            H3_FAIL(H3_ERR_NOT_FOUND, "%s: neither an official (metadata.json) nor a diffusers audio VAE config", what);
        }
        int lc = c->latent_channels;
        H3_CHECK(h3_cfg_int(cfg, "latent_channels", 1, H3_AVAE_MAX_CHANNELS, &lc, what));
        if (lc != c->latent_channels)
            H3_FAIL(H3_ERR_FORMAT, "%s: latent_channels %d; the weights take %d", what, lc, c->latent_channels);
        H3_CHECK(h3_cfg_floats(cfg, "latents_mean", c->latent_channels, 1, 0, c->latents_mean, what));
        H3_CHECK(h3_cfg_floats(cfg, "latents_std", c->latent_channels, 1, 1, c->latents_std, what));
        goto done;
    }
    if (depth == 0) {
        char *sub = h3_path_join(path, "audio_vae");
        if (!sub) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        int isdir = h3_path_is_dir(sub);
        if (isdir) st = av_resolve(v, sub, 1);
        h3_free(sub);
        if (isdir) goto done;
    }
    H3_FAIL(H3_ERR_NOT_FOUND,
            "%s: no audio VAE here (expected the official audio_vae/ folder, a diffusers audio_vae/ folder, a model "
            "folder holding one, or ComfyUI's audio VAE file)",
            path);
done:
    json_decref(cfg);
    json_decref(meta);
    json_decref(blob);
    h3_free(wpath);
    return st;
}

static h3_status av_finish(h3_audio_vae *v) {
    h3_audio_vae_config *c = &v->cfg;
    int64_t hop = 1;
    for (int i = 0; i < c->n_up; i++) {
        int u = c->rates[i], k = c->kernels[i];
        if (u < 1 || k < u || (k - u) % 2)
            return H3_ERR(H3_ERR_FORMAT, "%s: upsampler %d has kernel %d for rate %d; it must be at least the rate and "
                          "differ from it by an even number", v->source, i, k, u);
        hop *= u;
        if (hop > 1 << 20) return H3_ERR(H3_ERR_FORMAT, "%s: the rates multiply past 2^20", v->source);
    }
    c->hop = (int)hop;
    for (int r = 0; r < c->n_res; r++)
        for (int d = 0; d < c->n_dil; d++)
            if (c->dilations[r][d] < 1) return H3_ERR(H3_ERR_FORMAT, "%s: dilation < 1", v->source);
    int64_t L = c->latent_dim, C = c->latent_channels, s3[3] = {L, C, 1};
    const h3_wb_unit model = {NULL, 0, -1};
    H3_TRY(av_need(v, "dec_in_proj.weight", 3, s3, "[latent_dim, latent channels, 1]", model));
    H3_TRY(av_need(v, "dec_in_proj.bias", 1, &L, "[latent_dim]", model));
    v->n_conv = av_post(c) + 1;
    v->folded = h3_calloc((size_t)v->n_conv, sizeof *v->folded, H3_MEM_WEIGHTS);
    if (!v->folded) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    for (int id = 0; id < v->n_conv; id++) H3_TRY(av_prepare_conv(v, id));
    char name[128];
    for (int i = 0; i < c->n_up; i++)
        for (int r = 0; r < c->n_res; r++)
            for (int a = 0; a < 2 * c->n_dil; a++)
                H3_TRY(av_check_act(v, av_act_name(c, i, r, a, name, sizeof name), av_ch(c, i),
                                    av_act_unit(c, i)));
    H3_TRY(av_check_act(v, av_act_name(c, -1, 0, 0, name, sizeof name), av_ch(c, c->n_up - 1),
                        av_act_unit(c, -1)));
    int64_t maxc = (int64_t)c->decoder_dim / 2, os[3] = {maxc, 1, 1};
    H3_TRY(h3_tensor_alloc(&v->ones, H3_PLACE_HOST, H3_F32, 3, os, H3_MEM_WEIGHTS));
    for (int64_t i = 0; i < maxc; i++) ((float *)v->ones.data)[i] = 1.0f;
    h3_audio_kaiser_filter(v->filter, c->filter_taps, 0.5 / 2, 0.6 / 2);
    return H3_OK;
}

h3_status h3_audio_vae_open(const char *path, const h3_audio_vae_opts *opts, h3_audio_vae **out) {
    *out = NULL;
    h3_audio_vae *v = h3_calloc(1, sizeof *v, H3_MEM_OTHER);
    if (!v) return H3_ERR_NOMEM;
    h3_audio_vae_config *c = &v->cfg;
    c->sample_rate = 32000;
    c->filter_taps = 12;
    v->compute_filters = opts && opts->compute_filters;
    h3_status st = av_resolve(v, path, 0);
    if (st == H3_OK) {
        v->source = h3_strdup(v->st.source ? v->st.source : path);
        if (!v->source) st = H3_ERR_NOMEM;
    }
    if (st == H3_OK) st = av_finish(v);
    if (st != H3_OK) {
        st = h3_error_wrap(st, "opening the audio VAE %s", path);
        h3_audio_vae_close(v);
        return st;
    }
    *out = v;
    return H3_OK;
}

void h3_audio_vae_close(h3_audio_vae *v) {
    if (!v) return;
    if (v->folded)
        for (int i = 0; i < v->n_conv; i++) h3_tensor_free(&v->folded[i]);
    h3_free(v->folded);
    h3_tensor_free(&v->ones);
    if (v->st.files || v->st.entries) h3_st_close(&v->st);
    h3_free(v->source);
    h3_free(v);
}

const h3_audio_vae_config *h3_audio_vae_get_config(const h3_audio_vae *v) {
    return &v->cfg;
}
h3_layout h3_audio_vae_layout(const h3_audio_vae *v) {
    return v->layout;
}
const char *h3_audio_vae_source(const h3_audio_vae *v) {
    return v->source;
}

/* ---- weights for one part of the decode --------------------------------------------------------------------- */

typedef struct {
    h3_tensor w, b;
    int held_w, held_b;
} av_conv;

typedef struct {
    h3_tensor alpha, beta, up, down; /* up: 2·filter per channel [C, 1, taps]; down: filter per channel */
    int held;
} av_act;

/* Part -1: dec_in_proj and conv_pre; part i: upsampler i with its AMP blocks; part n_up: activation_post and
 * conv_post. */
typedef struct {
    av_conv in, pre, up, post;
    av_conv res[H3_AVAE_MAX_RES][H3_AVAE_MAX_RES][2];
    av_act act[H3_AVAE_MAX_RES][2 * H3_AVAE_MAX_RES];
    av_act post_act;
} av_part;

static void av_release_conv(av_conv *c) {
    if (c->held_w) h3_tensor_free(&c->w);
    if (c->held_b) h3_tensor_free(&c->b);
    memset(c, 0, sizeof *c);
}

static void av_release_act(av_act *a) {
    if (a->held) {
        h3_tensor_free(&a->alpha);
        h3_tensor_free(&a->beta);
        h3_tensor_free(&a->up);
        h3_tensor_free(&a->down);
    }
    memset(a, 0, sizeof *a);
}

static void av_release(av_part *p) {
    av_release_conv(&p->in);
    av_release_conv(&p->pre);
    av_release_conv(&p->up);
    av_release_conv(&p->post);
    for (int r = 0; r < H3_AVAE_MAX_RES; r++) {
        for (int d = 0; d < H3_AVAE_MAX_RES; d++) {
            av_release_conv(&p->res[r][d][0]);
            av_release_conv(&p->res[r][d][1]);
        }
        for (int a = 0; a < 2 * H3_AVAE_MAX_RES; a++) av_release_act(&p->act[r][a]);
    }
    av_release_act(&p->post_act);
}

static h3_status av_get_conv(h3_audio_vae *v, int id, av_conv *out) {
    char base[128], name[192];
    int64_t s[3];
    int bias;
    h3_wb_unit unit;
    const char *words;
    av_conv_desc(&v->cfg, id, base, sizeof base, s, &bias, &unit, &words);
    if (v->folded[id].data) {
        h3_tensor_wrap(&out->w, v->folded[id].data, H3_PLACE_HOST, H3_F32, 3, s);
    } else {
        snprintf(name, sizeof name, "%s.weight", base);
        H3_TRY(av_bind(v, name, 3, s, words, unit, &out->w));
        out->held_w = 1;
    }
    if (bias) {
        snprintf(name, sizeof name, "%s.bias", base);
        H3_TRY(av_bind(v, name, 1, &s[id >= 1 && id <= v->cfg.n_up ? 1 : 0], "[channels]", unit, &out->b));
        out->held_b = 1;
    }
    return H3_OK;
}

/* A resampling filter laid out per channel ([C, 1, taps], scaled by `gain`): the stored one, else the computed one. */
static h3_status av_filter(h3_audio_vae *v, const char *name, int64_t C, float gain, h3_wb_unit unit,
                           h3_tensor *out) {
    int K = v->cfg.filter_taps;
    int64_t s[3] = {C, 1, K}, fs[3] = {1, 1, K};
    float f[64];
    memcpy(f, v->filter, (size_t)K * sizeof(float));
    if (!v->compute_filters && h3_st_find(&v->st, name)) {
        h3_tensor t;
        H3_TRY(av_bind(v, name, 3, fs, "[1, 1, filter taps]", unit, &t));
        int ok = h3_convert_to_f32(t.dtype, t.data, f, (size_t)K);
        h3_tensor_free(&t);
        if (!ok) return H3_ERR(H3_ERR_UNSUPPORTED, "%s: cannot read %s", v->source, name);
    }
    H3_TRY(h3_tensor_alloc(out, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_WEIGHTS));
    float *d = out->data;
    for (int64_t c = 0; c < C; c++)
        for (int k = 0; k < K; k++) d[c * K + k] = gain * f[k]; /* gain 2 is exact in binary floating point */
    return H3_OK;
}

static h3_status av_get_act(h3_audio_vae *v, const char *base, int64_t C, h3_wb_unit unit, av_act *a) {
    char name[192];
    a->held = 1;
    snprintf(name, sizeof name, "%s.act.alpha", base);
    H3_TRY(av_bind(v, name, 1, &C, "[channels]", unit, &a->alpha));
    snprintf(name, sizeof name, "%s.act.beta", base);
    H3_TRY(av_bind(v, name, 1, &C, "[channels]", unit, &a->beta));
    snprintf(name, sizeof name, "%s.upsample.filter", base);
    H3_TRY(av_filter(v, name, C, 2.0f, unit, &a->up));
    snprintf(name, sizeof name, "%s.downsample.lowpass.filter", base);
    return av_filter(v, name, C, 1.0f, unit, &a->down);
}

/* The one way the decode reaches weights (folded views, file views, filters laid out per channel). */
static h3_status av_acquire(h3_audio_vae *v, int part, av_part *p) {
    memset(p, 0, sizeof *p);
    const h3_audio_vae_config *c = &v->cfg;
    h3_status st = H3_OK;
    char name[128];
    if (part < 0) {
        const h3_wb_unit model = {NULL, 0, -1};
        const int64_t L = c->latent_dim, s3[3] = {L, c->latent_channels, 1};
        H3_CHECK(
            av_bind(v, "dec_in_proj.weight", 3, s3, "[latent_dim, latent channels, 1]", model, &p->in.w));
        p->in.held_w = 1;
        H3_CHECK(av_bind(v, "dec_in_proj.bias", 1, &L, "[latent_dim]", model, &p->in.b));
        p->in.held_b = 1;
        H3_CHECK(av_get_conv(v, 0, &p->pre));
    } else if (part < c->n_up) {
        H3_CHECK(av_get_conv(v, av_up(part), &p->up));
        for (int r = 0; r < c->n_res; r++) {
            for (int d = 0; d < c->n_dil; d++) {
                H3_CHECK(av_get_conv(v, av_res(c, part, r, d, 0), &p->res[r][d][0]));
                H3_CHECK(av_get_conv(v, av_res(c, part, r, d, 1), &p->res[r][d][1]));
            }
            for (int a = 0; a < 2 * c->n_dil; a++)
                H3_CHECK(av_get_act(v, av_act_name(c, part, r, a, name, sizeof name), av_ch(c, part),
                                    av_act_unit(c, part), &p->act[r][a]));
        }
    } else {
        H3_CHECK(av_get_act(v, av_act_name(c, -1, 0, 0, name, sizeof name), av_ch(c, c->n_up - 1),
                            av_act_unit(c, -1), &p->post_act));
        H3_CHECK(av_get_conv(v, av_post(c), &p->post));
    }
done:
    if (st != H3_OK) av_release(p);
    return st;
}

/* ---- the decode --------------------------------------------------------------------------------------------- */

typedef struct {
    int64_t T; /* latents per channel */
    /* float offsets into the one buffer: the widest stage's tensors, the padded copy, the upsampled signal */
    int64_t o_z, o_a0, o_x, o_y, o_acc, o_h, o_t1, o_t2, o_xp, o_u, total;
} av_plan;

static int64_t al16(int64_t n) {
    return (n + 15) / 16 * 16;
}

static void av_make_plan(const h3_audio_vae_config *c, int64_t T, av_plan *p) {
    memset(p, 0, sizeof *p);
    p->T = T;
    int64_t G = (int64_t)c->decoder_dim * T, len = T, xp = 0, u = 0;
    for (int i = 0; i < c->n_up; i++) {
        len *= c->rates[i];
        int64_t ch = av_ch(c, i);
        if (ch * len > G) G = ch * len;
        if (ch * (len + c->filter_taps - 2) > xp) xp = ch * (len + c->filter_taps - 2);
        if (2 * ch * len > u) u = 2 * ch * len;
    }
    int64_t o = 0;
#define TAKE(f, n) (p->f = o, o += al16(n))
    TAKE(o_z, (int64_t)c->latent_channels * T);
    TAKE(o_a0, (int64_t)c->latent_dim * T);
    TAKE(o_x, G);
    TAKE(o_y, G);
    TAKE(o_acc, G);
    TAKE(o_h, G);
    TAKE(o_t1, G);
    TAKE(o_t2, G);
    TAKE(o_xp, xp);
    TAKE(o_u, u);
#undef TAKE
    p->total = o;
}

static h3_tensor aw(float *base, int64_t rows, int64_t cols) {
    h3_tensor t;
    int64_t s[2] = {rows, cols};
    h3_tensor_wrap(&t, base, H3_PLACE_HOST, H3_F32, 2, s);
    return t;
}

typedef struct {
    h3_audio_vae *v;
    h3_exec *ex;
    const av_plan *p;
    float *ar;
} av_run;

/* Anti-aliased SnakeBeta: in [C, len] -> out [C, len] (out may not alias in). */
static h3_status av_activation(av_run *r, const av_act *a, const h3_tensor *in, h3_tensor *out) {
    int64_t C = in->shape[0], len = in->shape[1];
    int K = r->v->cfg.filter_taps;
    h3_tensor xp = aw(r->ar + r->p->o_xp, C, len + K - 2), u = aw(r->ar + r->p->o_u, C, 2 * len), ones;
    int64_t os[3] = {C, 1, 1};
    h3_tensor_wrap(&ones, r->v->ones.data, H3_PLACE_HOST, H3_F32, 3, os);
    h3_conv1d_params pad = {1, 1, (int)C, K / 2 - 1, K / 2 - 1, H3_PAD_REPLICATE};
    H3_TRY(h3_op_conv1d(r->ex, &xp, in, &ones, NULL, &pad));
    h3_convt1d_params up = {2, (K / 2 - 1) * 2 + (K - 2) / 2, 0, (int)C, 1};
    H3_TRY(h3_op_conv_transpose1d(r->ex, &u, &xp, &a->up, NULL, &up));
    H3_TRY(h3_op_snake(r->ex, &u, &u, &a->alpha, &a->beta, H3_SNAKE_LOGSCALE));
    h3_conv1d_params down = {2, 1, (int)C, K / 2 - 1, K / 2, H3_PAD_REPLICATE};
    return h3_op_conv1d(r->ex, out, &u, &a->down, NULL, &down);
}

/* Upsampling stage i: x [2C, len/u] -> x [C, len]. */
static h3_status av_stage(av_run *r, int i, const av_part *w, int64_t len) {
    const h3_audio_vae_config *c = &r->v->cfg;
    float *ar = r->ar;
    const av_plan *p = r->p;
    int64_t C = av_ch(c, i), u = c->rates[i], k = c->kernels[i];
    h3_tensor x = aw(ar + p->o_x, 2 * C, len / u), y = aw(ar + p->o_y, C, len), acc = aw(ar + p->o_acc, C, len);
    h3_tensor h = aw(ar + p->o_h, C, len), t1 = aw(ar + p->o_t1, C, len), t2 = aw(ar + p->o_t2, C, len);
    h3_convt1d_params up = {(int)u, (int)((k - u) / 2), 0, 1, 1};
    H3_TRY(h3_op_conv_transpose1d(r->ex, &y, &x, &w->up.w, &w->up.b, &up));
    for (int rb = 0; rb < c->n_res; rb++) {
        h3_tensor *hb = rb == 0 ? &acc : &h;
        int rk = c->res_kernels[rb];
        H3_TRY(h3_op_convert(r->ex, hb, &y));
        for (int d = 0; d < c->n_dil; d++) {
            int dl = c->dilations[rb][d];
            h3_conv1d_params p1 = {1, dl, 1, (rk * dl - dl) / 2, (rk * dl - dl) / 2, H3_PAD_ZEROS};
            h3_conv1d_params p2 = {1, 1, 1, (rk - 1) / 2, (rk - 1) / 2, H3_PAD_ZEROS};
            H3_TRY(av_activation(r, &w->act[rb][2 * d], hb, &t1));
            H3_TRY(h3_op_conv1d(r->ex, &t2, &t1, &w->res[rb][d][0].w, &w->res[rb][d][0].b, &p1));
            H3_TRY(av_activation(r, &w->act[rb][2 * d + 1], &t2, &t1));
            H3_TRY(h3_op_conv1d(r->ex, &t2, &t1, &w->res[rb][d][1].w, &w->res[rb][d][1].b, &p2));
            H3_TRY(h3_op_binary(r->ex, hb, &t2, hb, H3_BINARY_ADD));
        }
        if (rb > 0) H3_TRY(h3_op_binary(r->ex, &acc, &acc, &h, H3_BINARY_ADD));
    }
    h3_tensor xo = aw(ar + p->o_x, C, len);
    return h3_op_scale(r->ex, &xo, &acc, 1.0f / (float)c->n_res, 0.0f);
}

static h3_status av_decode_one(av_run *r, const float *z_in, float *wave) {
    h3_audio_vae *v = r->v;
    const h3_audio_vae_config *c = &v->cfg;
    const av_plan *p = r->p;
    float *ar = r->ar;
    int64_t T = p->T, C = c->latent_channels;
    h3_exec *ex = r->ex;
    h3_status st = H3_OK;
    av_part *w = h3_malloc(sizeof *w, H3_MEM_OTHER);
    if (!w) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    memset(w, 0, sizeof *w);
    /* de-normalize: z[ch] = latents[ch] · std[ch] + mean[ch] */
    for (int64_t ch = 0; ch < C; ch++) {
        h3_tensor src = aw((float *)z_in + ch * T, 1, T), dst = aw(ar + p->o_z + ch * T, 1, T);
        H3_CHECK(h3_op_scale(ex, &dst, &src, c->latents_std[ch], c->latents_mean[ch]));
    }
    H3_CHECK(av_acquire(v, -1, w));
    {
        h3_tensor z = aw(ar + p->o_z, C, T), a0 = aw(ar + p->o_a0, c->latent_dim, T), x = aw(ar + p->o_x, c->decoder_dim, T);
        h3_conv1d_params k1 = {1, 1, 1, 0, 0, H3_PAD_ZEROS}, k7 = {1, 1, 1, 3, 3, H3_PAD_ZEROS};
        H3_CHECK(h3_op_conv1d(ex, &a0, &z, &w->in.w, &w->in.b, &k1));
        H3_CHECK(h3_op_conv1d(ex, &x, &a0, &w->pre.w, &w->pre.b, &k7));
    }
    av_release(w);
    int64_t len = T;
    for (int i = 0; i < c->n_up; i++) {
        len *= c->rates[i];
        H3_CHECK(av_acquire(v, i, w));
        H3_CHECK_CTX(av_stage(r, i, w, len), "upsampling stage %d", i);
        av_release(w);
    }
    H3_CHECK(av_acquire(v, c->n_up, w));
    {
        int64_t Cl = av_ch(c, c->n_up - 1);
        h3_tensor x = aw(ar + p->o_x, Cl, len), t1 = aw(ar + p->o_t1, Cl, len), out = aw(wave, 1, len);
        h3_conv1d_params k7 = {1, 1, 1, 3, 3, H3_PAD_ZEROS};
        H3_CHECK(av_activation(r, &w->post_act, &x, &t1));
        H3_CHECK(h3_op_conv1d(ex, &out, &t1, &w->post.w, NULL, &k7));
        H3_CHECK(h3_op_clamp(ex, &out, &out, -1.0f, 1.0f));
    }
done:
    av_release(w);
    h3_free(w);
    return st;
}

h3_status h3_audio_vae_check_latents(const h3_audio_vae_config *c, const h3_tensor *z) {
    char s[96];
    if (z->ndim != 2 && z->ndim != 3)
        return H3_ERR(H3_ERR_INVALID, "audio latents must be [channels, C, T] or [C, T]; got %s",
                      h3_tensor_shape_str(z, s, sizeof s));
    if (h3_tensor_numel(z) == 0)
        return H3_ERR(H3_ERR_INVALID,
                      "audio latents %s hold no values: every dimension must be at least 1 (e.g. [2, "
                      "%d, 200] for 5 s of stereo)",
                      h3_tensor_shape_str(z, s, sizeof s), c->latent_channels);
    if (z->dtype != H3_F32 || !h3_tensor_is_contiguous(z) || z->place == H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID, "audio latents must be contiguous f32 host memory, got %s", h3_dtype_name(z->dtype));
    int off = z->ndim == 3;
    int64_t ch = off ? z->shape[0] : 1, C = z->shape[off], T = z->shape[off + 1];
    if (C != c->latent_channels)
        return H3_ERR(H3_ERR_INVALID, "audio latents %s have %lld channels; this audio VAE takes %d",
                      h3_tensor_shape_str(z, s, sizeof s), (long long)C, c->latent_channels);
    if (ch < 1 || ch > 16 || T < 1 || T > 1000000)
        return H3_ERR(H3_ERR_INVALID, "audio latents %s: 1 to 16 channels (2 for stereo) and 1 to 10^6 latents per "
                      "channel", h3_tensor_shape_str(z, s, sizeof s));
    return H3_OK;
}

h3_status h3_audio_vae_decode(h3_audio_vae *v, h3_exec *ex, const h3_tensor *latents, h3_tensor *wave) {
    const h3_audio_vae_config *c = &v->cfg;
    H3_TRY(h3_audio_vae_check_latents(c, latents));
    int off = latents->ndim == 3;
    int64_t ch = off ? latents->shape[0] : 1, T = latents->shape[off + 1], S = T * c->hop;
    char s[96];
    if (!wave || wave->dtype != H3_F32 || !h3_tensor_is_contiguous(wave) || wave->place == H3_PLACE_DEVICE ||
        h3_tensor_numel(wave) != ch * S || h3_tensor_cols(wave) != S || wave->shape[0] != ch)
        return H3_ERR(H3_ERR_INVALID, "audio decode: the waveform must be contiguous f32 [%lld, %lld] or [%lld, 1, %lld], "
                      "got %s", (long long)ch, (long long)S, (long long)ch, (long long)S,
                      wave ? h3_tensor_shape_str(wave, s, sizeof s) : "none");
    av_plan p;
    av_make_plan(c, T, &p);
    av_run r = {v, ex, &p, NULL};
    r.ar = h3_malloc((size_t)p.total * sizeof(float), H3_MEM_ACTIVATIONS);
    if (!r.ar) return H3_ERR(H3_ERR_NOMEM, "out of memory for the audio decode's %lld MB of buffers",
                             (long long)(p.total * 4 >> 20));
    h3_status st = H3_OK;
    for (int64_t i = 0; i < ch && st == H3_OK; i++) {
        st = av_decode_one(&r, (const float *)latents->data + i * c->latent_channels * T, (float *)wave->data + i * S);
        if (st != H3_OK && ch > 1) st = h3_error_wrap(st, "audio channel %lld", (long long)i);
    }
    h3_free(r.ar);
    return st;
}

/* ---- planned memory ----------------------------------------------------------------------------------------- */

/* What the CPU convolutions allocate while they run (the weights are f32: no copies):
 * h3_cpu_conv1d_scratch_bytes and h3_cpu_convt1d_scratch_bytes, the kernels' own arithmetic. */
#define CONV(cin_g, K, tout)         h3_cpu_conv1d_scratch_bytes(cin_g, K, tout)
#define CONVT(cout_g, cin_g, K, tin) h3_cpu_convt1d_scratch_bytes(cout_g, cin_g, K, tin)

#define MAXI(a, b) ((a) > (b) ? (a) : (b))

h3_status h3_audio_vae_decode_peak(const h3_audio_vae_config *c, int64_t T, h3_audio_vae_mem *out) {
    memset(out, 0, sizeof *out);
    if (T < 1 || c->n_up < 1 || c->n_up > H3_AVAE_MAX_UPS || c->n_res < 1 || c->n_res > H3_AVAE_MAX_RES ||
        c->n_dil < 1 || c->n_dil > H3_AVAE_MAX_RES)
        return H3_ERR(H3_ERR_INVALID, "audio VAE plan: bad sizes");
    av_plan p;
    av_make_plan(c, T, &p);
    out->buffers = p.total * 4 + (int64_t)sizeof(av_part);
    /* Per part of the decode: the filters held while it runs plus the largest scratch one of its ops takes. */
    int64_t K = c->filter_taps, len = T, best = 0, best_stage = 0, best_op = 0;
    int64_t op = MAXI(CONV(c->latent_channels, 1, T), CONV(c->latent_dim, 7, T));
    best = best_op = op;
    for (int i = 0; i <= c->n_up; i++) {
        int last = i == c->n_up;
        int64_t C = av_ch(c, last ? c->n_up - 1 : i), tin = len, stage;
        if (!last) len *= c->rates[i];
        op = 0;
        if (!last) {
            op = CONVT(C, 2 * C, c->kernels[i], tin);
            for (int r = 0; r < c->n_res; r++) op = MAXI(op, CONV(C, c->res_kernels[r], len));
            stage = (int64_t)c->n_res * 2 * c->n_dil * 2 * C * K * 4;
        } else {
            op = CONV(C, 7, len);
            stage = 2 * C * K * 4;
        }
        op = MAXI(op, CONV(1, 1, len + K - 2)); /* replicate-pad copy */
        op = MAXI(op, CONVT(1, 1, K, len + K - 2));
        op = MAXI(op, 2 * C * 4); /* snake's alpha and beta */
        op = MAXI(op, CONV(1, K, 2 * len));
        if (stage + op > best) best = stage + op, best_stage = stage, best_op = op;
    }
    out->stage_scratch = best_stage;
    out->op_scratch = best_op;
    out->total = out->buffers + out->stage_scratch + out->op_scratch;
    return H3_OK;
}

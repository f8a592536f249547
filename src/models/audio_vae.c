/* The MiniMax-H3 audio VAE decoder (BigVGAN): configuration and weights of the three layouts, weight norm
 * folded at open, and the decode. See audio_vae.h. */
#include "models/audio_vae.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "io/wbind.h"
#include "mem/units.h"
#include "models/model_cfg.h"

/* ---- the resampling filter
 * ---------------------------------------------------------------------------------- */

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
    if (att > 50.0)
        beta = 0.1102 * (att - 8.7);
    else if (att >= 21.0)
        beta = 0.5842 * pow(att - 21.0, 0.4) + 0.07886 * (att - 21.0);
    else
        beta = 0.0;
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

/* ---- the model
 * ---------------------------------------------------------------------------------------------- */

struct h3_audio_vae {
    h3_audio_vae_config cfg;
    h3_layout layout;
    h3_st_set st;
    char *source;
    h3_wbind wb; /* the binder over st (io/wbind.h): every weight is reached through it */
    int compute_filters;
    int headers_only; /* opened for planning: nothing read, no decode */
    int n_conv;
    h3_tensor
        *folded; /* per conv: the weight-norm-folded f32 weight, or empty when the file stores it plain */
    float filter[64];   /* computed resampling filter (filter_taps values) */
    h3_place act_place; /* where a decode keeps its activations (and its weights): HOST or DEVICE */
    h3_tensor *bound;   /* every tensor the decode reads, bound at open (av_index): views of the file, the
                         * folded   weights, the computed filters */
    h3_units *host;     /* the weights as opened, for decodes on the host */
    h3_units *dev;      /* on the device: every unit resident as f32, from the first decode */
};

static h3_status av_bind_all(h3_audio_vae *v);

/* Convolution ids: conv_pre, the upsamplers, the AMP convs (stage, block, dilation, first/second), conv_post.
 */
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

/* Folds weight norm for conv id when the file stores it that way: w = v · g / ‖v‖, the norm over every dim
 * but the first (what torch's weight_norm(dim=0) computes, also for transposed convs). Checks the shapes
 * either way. */
static h3_status av_prepare_conv(h3_audio_vae *v, int id, int fold) {
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
    char gname[192], vname[192];
    if (!h3_weight_norm_names(&v->st, base, gname, vname, sizeof gname))
        return h3_wb_missing_error(&v->wb, name, &unit, "a weight (or weight_g and weight_v)");
    H3_TRY(av_need(v, vname, 3, s, words, unit));
    const int64_t gs[3] = {s[0], 1, 1};
    if (!fold) return av_need(v, gname, 3, gs, "[output rows, 1, 1] (weight norm's magnitudes)", unit);
    h3_tensor g = {0}, vt = {0}, w = {0};
    h3_status st = H3_OK;
    H3_CHECK(av_bind(v, gname, 3, gs, "[output rows, 1, 1] (weight norm's magnitudes)", unit, &g));
    H3_CHECK(av_bind(v, vname, 3, s, words, unit, &vt));
    snprintf(name, sizeof name, "%s: '%s'", v->source, vname);
    H3_CHECK(h3_weight_norm_fold(&g, &vt, name, &w));
    v->folded[id] = w;
    w.owner = NULL;
done:
    h3_tensor_free(&g);
    h3_tensor_free(&vt);
    h3_tensor_free(&w);
    return st;
}

int h3_weight_norm_names(const h3_st_set *set, const char *base, char *g, char *v, size_t n) {
    static const char *const forms[2][2] = {
        {".weight_g", ".weight_v"},
        {".parametrizations.weight.original0", ".parametrizations.weight.original1"}};
    for (int k = 0; k < 2; k++) {
        snprintf(v, n, "%s%s", base, forms[k][1]);
        if (h3_st_find(set, v)) {
            snprintf(g, n, "%s%s", base, forms[k][0]);
            return 1;
        }
    }
    return 0;
}

h3_status h3_weight_norm_fold(const h3_tensor *g, const h3_tensor *vt, const char *what, h3_tensor *w) {
    memset(w, 0, sizeof *w);
    const int64_t rows = vt->ndim ? vt->shape[0] : 0, n = h3_tensor_numel(vt);
    if (rows <= 0 || h3_tensor_numel(g) != rows)
        return H3_ERR(H3_ERR_FORMAT, "%s: weight norm's magnitudes hold %lld values for %lld rows", what,
                      (long long)h3_tensor_numel(g), (long long)rows);
    h3_status st = H3_OK;
    float *gf = h3_malloc((size_t)rows * sizeof(float), H3_MEM_WORKSPACE);
    if (!gf) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(h3_tensor_alloc(w, H3_PLACE_HOST, H3_F32, vt->ndim, vt->shape, H3_MEM_WEIGHTS));
    if (!h3_convert_to_f32(g->dtype, g->data, gf, (size_t)rows) ||
        !h3_convert_to_f32(vt->dtype, vt->data, w->data, (size_t)n))
        H3_FAIL(H3_ERR_UNSUPPORTED, "%s: cannot read it as f32", what);
    const int64_t row = n / rows;
    for (int64_t o = 0; o < rows; o++) {
        float *r = (float *)w->data + o * row;
        double ss = 0.0;
        for (int64_t i = 0; i < row; i++) ss += (double)r[i] * r[i];
        float nrm = (float)sqrt(ss), k = gf[o] / nrm;
        if (!(nrm > 0.0f)) H3_FAIL(H3_ERR_FORMAT, "%s has an all-zero row %lld", what, (long long)o);
        for (int64_t i = 0; i < row; i++) r[i] *= k;
    }
done:
    h3_free(gf);
    if (st != H3_OK) h3_tensor_free(w);
    return st;
}

h3_st_set *h3_audio_vae_weights(h3_audio_vae *v) {
    return &v->st;
}

int h3_audio_vae_headers_only(const h3_audio_vae *v) {
    return v->headers_only;
}

static const char *av_act_name(const h3_audio_vae_config *c, int stage, int r, int a, char *buf, size_t n) {
    if (stage < 0)
        snprintf(buf, n, "decoder.activation_post");
    else
        snprintf(buf, n, "decoder.resblocks.%d.activations.%d", stage * c->n_res + r, a);
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

/* ---- configuration files
 * ------------------------------------------------------------------------------------ */

/* An integer list (the JSON array j, or nothing when NULL) of at most max values, each in [lo, hi]; *n
 * receives the count. */
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

static h3_status jints(const json_t *o, const char *key, int max, int lo, int hi, int *out, int *n,
                       const char *what) {
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
        return H3_ERR(H3_ERR_FORMAT, "%s: %d upsamplers and %d AMP blocks do not make a BigVGAN decoder",
                      v->source, n_up, n_rb);
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
        c->rates[i] =
            c->kernels[i] % 2 ? (c->kernels[i] + 1) / 2 : c->kernels[i] / 2; /* k = 2u − (u mod 2) */
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
        for (int d = 0; d < nd; d++)
            c->dilations[r][d] = 2 * d + 1; /* 1, 3, 5: BigVGAN's, not in any config */
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
            if (st == H3_OK)
                st = h3_st_load(&v->st, "latents_mean", H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &m1);
            if (st == H3_OK) st = h3_st_load(&v->st, "latents_std", H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &s1);
            if (st == H3_OK) {
                memcpy(c->latents_mean, m1.data, (size_t)C * 4);
                memcpy(c->latents_std, s1.data, (size_t)C * 4);
                for (int i = 0; i < C && st == H3_OK; i++)
                    if (!isfinite(c->latents_mean[i]) || !isfinite(c->latents_std[i]) ||
                        c->latents_std[i] == 0.0f)
                        st = H3_ERR(H3_ERR_FORMAT,
                                    "%s: latents_mean/latents_std[%d] are not finite (std nonzero)", path, i);
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
            if (!kw || !json_is_object(kw))
                H3_FAIL(H3_ERR_FORMAT, "%s: no \"metadata\".\"kwargs\" object", mwhat);
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
            if (n && n != c->n_up)
                H3_FAIL(H3_ERR_FORMAT, "%s: %d decoder_rates for %d upsamplers", what, n, c->n_up);
            for (int i = 0; i < n; i++) c->rates[i] = a[i];
            json_t *dl = json_object_get(cfg, "resblock_dilation_sizes");
            if (dl) {
                if (!json_is_array(dl) || json_array_size(dl) != (size_t)c->n_res)
                    H3_FAIL(H3_ERR_FORMAT, "%s: \"resblock_dilation_sizes\" must list %d blocks", what,
                            c->n_res);
                for (int r = 0; r < c->n_res; r++) {
                    int nd = 0;
                    H3_CHECK(jints_of(json_array_get(dl, (size_t)r), "resblock_dilation_sizes",
                                      H3_AVAE_MAX_RES, 1, 64, c->dilations[r], &nd, what));
                    if (nd != c->n_dil)
                        H3_FAIL(H3_ERR_FORMAT, "%s: block %d lists %d dilations; the weights have %d", what,
                                r, nd, c->n_dil);
                }
            }
            H3_CHECK(h3_cfg_int(cfg, "sampling_rate", 1, 1000000, &c->sample_rate, what));
        } else {
            H3_FAIL(H3_ERR_NOT_FOUND,
                    "%s: neither an official (metadata.json) nor a diffusers audio VAE config", what);
        }
        int lc = c->latent_channels;
        H3_CHECK(h3_cfg_int(cfg, "latent_channels", 1, H3_AVAE_MAX_CHANNELS, &lc, what));
        if (lc != c->latent_channels)
            H3_FAIL(H3_ERR_FORMAT, "%s: latent_channels %d; the weights take %d", what, lc,
                    c->latent_channels);
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
            "%s: no audio VAE here (expected the official audio_vae/ folder, a diffusers audio_vae/ folder, "
            "a model "
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
            return H3_ERR(H3_ERR_FORMAT,
                          "%s: upsampler %d has kernel %d for rate %d; it must be at least the rate and "
                          "differ from it by an even number",
                          v->source, i, k, u);
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
    for (int id = 0; id < v->n_conv; id++) H3_TRY(av_prepare_conv(v, id, !v->headers_only));
    char name[128];
    for (int i = 0; i < c->n_up; i++)
        for (int r = 0; r < c->n_res; r++)
            for (int a = 0; a < 2 * c->n_dil; a++)
                H3_TRY(av_check_act(v, av_act_name(c, i, r, a, name, sizeof name), av_ch(c, i),
                                    av_act_unit(c, i)));
    H3_TRY(av_check_act(v, av_act_name(c, -1, 0, 0, name, sizeof name), av_ch(c, c->n_up - 1),
                        av_act_unit(c, -1)));
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
    v->headers_only = opts && opts->headers_only;
    h3_status st = h3_audio_vae_set_placement(v, opts ? opts->act_place : H3_PLACE_HOST);
    if (st == H3_OK) st = av_resolve(v, path, 0);
    if (st == H3_OK) {
        v->source = h3_strdup(v->st.source ? v->st.source : path);
        if (!v->source) st = H3_ERR_NOMEM;
    }
    if (st == H3_OK) st = av_finish(v);
    if (st == H3_OK && !v->headers_only) st = av_bind_all(v);
    if (st != H3_OK) {
        st = h3_error_wrap(st, "opening the audio VAE %s", path);
        h3_audio_vae_close(v);
        return st;
    }
    *out = v;
    return H3_OK;
}

static int64_t av_index_count(const h3_audio_vae_config *c);

void h3_audio_vae_close(h3_audio_vae *v) {
    if (!v) return;
    h3_units_close(v->dev);
    h3_units_close(v->host);
    if (v->bound)
        for (int64_t i = 0; i < av_index_count(&v->cfg); i++) h3_tensor_free(&v->bound[i]);
    h3_free(v->bound);
    if (v->folded)
        for (int i = 0; i < v->n_conv; i++) h3_tensor_free(&v->folded[i]);
    h3_free(v->folded);
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

/* ---- weights: bound at open, reached through units
 * ---------------------------------------------------------- The decode's weights are units (mem/units.h):
 * unit 0 holds dec_in_proj and conv_pre, unit 1 + i BigVGAN stage i (its transposed conv, its AMP blocks'
 * convs and activations), the last one activation_post and conv_post. av_walk names every tensor of every
 * unit in order; binding, the units' packs and the memory plan all follow it, so they agree by construction.
 * On the host the units hand out the tensors as opened (the resampling filters as f32); on the device every
 * unit is resident as f32 (files that store another dtype are converted on the host first: the device holds
 * exactly the f32 weights the plan counts from the config). */

typedef struct {
    h3_tensor w, b;
} av_conv;

typedef struct {
    h3_tensor alpha, beta; /* [C] */
    h3_tensor up, down;    /* the resampling filters [taps]; h3_op_snake_aa applies the upsampler's ×2 */
} av_act;

/* Part -1: dec_in_proj and conv_pre; part i: upsampler i with its AMP blocks; part n_up: activation_post and
 * conv_post. */
typedef struct {
    av_conv in, pre, up, post;
    av_conv res[H3_AVAE_MAX_RES][H3_AVAE_MAX_RES][2];
    av_act act[H3_AVAE_MAX_RES][2 * H3_AVAE_MAX_RES];
    av_act post_act;
} av_part;

/* Activation ids: per stage and AMP block 2·n_dil of them, then activation_post. */
static int av_n_act(const h3_audio_vae_config *c) {
    return c->n_up * c->n_res * 2 * c->n_dil + 1;
}
static int av_act_id(const h3_audio_vae_config *c, int stage, int r, int a) {
    return stage < 0 ? av_n_act(c) - 1 : (stage * c->n_res + r) * 2 * c->n_dil + a;
}
static int64_t av_act_ch(const h3_audio_vae_config *c, int id) {
    int stage = id / (c->n_res * 2 * c->n_dil);
    return av_ch(c, stage < c->n_up ? stage : c->n_up - 1);
}
static const char *av_act_name_of(const h3_audio_vae_config *c, int id, char *buf, size_t n) {
    int per = c->n_res * 2 * c->n_dil, stage = id / per, rem = id % per;
    return av_act_name(c, stage < c->n_up ? stage : -1, rem / (2 * c->n_dil), rem % (2 * c->n_dil), buf, n);
}

/* The conv parameters of the decode, for the ops and the memory plan alike. */
static h3_conv1d_params av_k(int K) { /* stride 1, "same" zero padding of an odd kernel */
    h3_conv1d_params p = {1, 1, 1, (K - 1) / 2, (K - 1) / 2, H3_PAD_ZEROS};
    return p;
}
static h3_conv1d_params av_res_params(const h3_audio_vae_config *c, int r, int d, int which) {
    int k = c->res_kernels[r], dl = which ? 1 : c->dilations[r][d];
    h3_conv1d_params p = {1, dl, 1, (k * dl - dl) / 2, (k * dl - dl) / 2, H3_PAD_ZEROS};
    return p;
}
static h3_convt1d_params av_up_params(const h3_audio_vae_config *c, int i) {
    h3_convt1d_params p = {c->rates[i], (c->kernels[i] - c->rates[i]) / 2, 0, 1, 1};
    return p;
}

/* The unit of activation id (av_act_id). */
static h3_wb_unit av_act_unit_of(const h3_audio_vae_config *c, int id) {
    const int stage = id / (c->n_res * 2 * c->n_dil);
    return av_act_unit(c, stage < c->n_up ? stage : -1);
}

enum { AV_IN, AV_CONV, AV_ACT };

/* Where tensor (kind, id, which) is kept in v->bound: dec_in_proj's weight and bias; each conv's weight and
 * bias; each activation's alpha, beta, up and down filter. */
static int64_t av_index(const h3_audio_vae_config *c, int kind, int id, int which) {
    const int64_t n_conv = av_post(c) + 1;
    return kind == AV_IN     ? which
           : kind == AV_CONV ? 2 + which * n_conv + id
                             : 2 + 2 * n_conv + 4 * (int64_t)id + which;
}
static int64_t av_index_count(const h3_audio_vae_config *c) {
    return 2 + 2 * (int64_t)(av_post(c) + 1) + 4 * (int64_t)av_n_act(c);
}

static int av_n_units(const h3_audio_vae_config *c) {
    return c->n_up + 2;
}

/* Calls fn for every tensor of the decode, unit by unit in pack order, with its element count. */
typedef h3_status (*av_item_fn)(void *user, int unit, int kind, int id, int which, int64_t n);

static h3_status av_walk(const h3_audio_vae_config *c, av_item_fn fn, void *user) {
    char name[128];
    int64_t s[3];
    int bias;
    h3_wb_unit unit;
    const char *words;
#define AV_CONV_ITEMS(u, id)                                                                                 \
    do {                                                                                                     \
        av_conv_desc(c, id, name, sizeof name, s, &bias, &unit, &words);                                     \
        H3_TRY(fn(user, u, AV_CONV, id, 0, s[0] * s[1] * s[2]));                                             \
        if (bias) H3_TRY(fn(user, u, AV_CONV, id, 1, (id) >= 1 && (id) <= c->n_up ? s[1] : s[0]));           \
    } while (0)
#define AV_ACT_ITEMS(u, a)                                                                                   \
    do {                                                                                                     \
        for (int w__ = 0; w__ < 4; w__++)                                                                    \
            H3_TRY(fn(user, u, AV_ACT, a, w__, w__ < 2 ? av_act_ch(c, a) : (int64_t)c->filter_taps));        \
    } while (0)
    H3_TRY(fn(user, 0, AV_IN, 0, 0, (int64_t)c->latent_dim * c->latent_channels));
    H3_TRY(fn(user, 0, AV_IN, 0, 1, (int64_t)c->latent_dim));
    AV_CONV_ITEMS(0, 0);
    for (int i = 0; i < c->n_up; i++) {
        AV_CONV_ITEMS(1 + i, av_up(i));
        for (int r = 0; r < c->n_res; r++)
            for (int d = 0; d < c->n_dil; d++) {
                AV_CONV_ITEMS(1 + i, av_res(c, i, r, d, 0));
                AV_CONV_ITEMS(1 + i, av_res(c, i, r, d, 1));
            }
        for (int r = 0; r < c->n_res; r++)
            for (int a = 0; a < 2 * c->n_dil; a++) AV_ACT_ITEMS(1 + i, av_act_id(c, i, r, a));
    }
    AV_ACT_ITEMS(c->n_up + 1, av_act_id(c, -1, 0, 0));
    AV_CONV_ITEMS(c->n_up + 1, av_post(c));
#undef AV_CONV_ITEMS
#undef AV_ACT_ITEMS
    return H3_OK;
}

/* The most tensors a unit has: a stage's transposed conv, 2·n_res·n_dil convs and 2·n_res·n_dil activations.
 */
_Static_assert(2 + 4 * H3_AVAE_MAX_RES * H3_AVAE_MAX_RES + 8 * H3_AVAE_MAX_RES * H3_AVAE_MAX_RES <=
                   H3_PACK_MAX,
               "a BigVGAN stage must fit one pack");

/* av_walk's callback of binding: the tensor into v->bound, shaped as the ops take it (filters as [taps]). */
static h3_status av_bind_one(void *user, int unit, int kind, int id, int which, int64_t n) {
    (void)unit;
    (void)n;
    h3_audio_vae *v = user;
    const h3_audio_vae_config *c = &v->cfg;
    h3_tensor *dst = &v->bound[av_index(c, kind, id, which)];
    char base[128], name[192];
    const h3_wb_unit model = {NULL, 0, -1};
    if (kind == AV_IN) {
        const int64_t L = c->latent_dim, s3[3] = {L, c->latent_channels, 1};
        return which
                   ? av_bind(v, "dec_in_proj.bias", 1, &L, "[latent_dim]", model, dst)
                   : av_bind(v, "dec_in_proj.weight", 3, s3, "[latent_dim, latent channels, 1]", model, dst);
    }
    if (kind == AV_CONV) {
        int64_t s[3];
        int bias;
        h3_wb_unit u;
        const char *words;
        av_conv_desc(c, id, base, sizeof base, s, &bias, &u, &words);
        if (which == 0 && v->folded[id].data) /* a view: the folded weight stays the decoder's */
            return h3_tensor_wrap(dst, v->folded[id].data, H3_PLACE_HOST, H3_F32, 3, s);
        snprintf(name, sizeof name, "%s.%s", base, which ? "bias" : "weight");
        return which ? av_bind(v, name, 1, &s[id >= 1 && id <= c->n_up ? 1 : 0], "[channels]", u, dst)
                     : av_bind(v, name, 3, s, words, u, dst);
    }
    const int64_t C = av_act_ch(c, id), K = c->filter_taps, fs[3] = {1, 1, K};
    const h3_wb_unit u = av_act_unit_of(c, id);
    av_act_name_of(c, id, base, sizeof base);
    if (which < 2) {
        snprintf(name, sizeof name, "%s.act.%s", base, which ? "beta" : "alpha");
        return av_bind(v, name, 1, &C, "[channels]", u, dst);
    }
    snprintf(name, sizeof name, "%s%s", base, which == 2 ? ".upsample.filter" : ".downsample.lowpass.filter");
    if (v->compute_filters || !h3_st_find(&v->st, name)) /* the computed one */
        return h3_tensor_wrap(dst, v->filter, H3_PLACE_HOST, H3_F32, 1, &K);
    h3_tensor t;
    H3_TRY(av_bind(v, name, 3, fs, "[1, 1, filter taps]", u, &t));
    h3_status st = h3_tensor_reshape(&t, 1, &K, dst);
    dst->owner = t.owner; /* an aligned copy stays owned */
    dst->owned_bytes = t.owned_bytes;
    dst->cat = t.cat;
    return st;
}

typedef struct {
    h3_audio_vae *v;
    h3_pack *packs;
    const h3_tensor *src; /* the tensors to pack (v->bound, or their f32 copies) */
    int f32;              /* placed: every tensor as f32 (else as opened, the filters as f32) */
} av_pack_ctx;

static h3_status av_pack_one(void *user, int unit, int kind, int id, int which, int64_t n) {
    (void)n;
    av_pack_ctx *x = user;
    const h3_tensor *t = &x->src[av_index(&x->v->cfg, kind, id, which)];
    h3_pack_add_as(&x->packs[unit], t, 0, x->f32 || (kind == AV_ACT && which >= 2) ? H3_F32 : t->dtype);
    return H3_OK;
}

/* The units over src: as opened on the host, or resident as f32 on the device. */
static h3_status av_open_units(h3_audio_vae *v, h3_exec *ex, const h3_tensor *src, h3_place place,
                               h3_units **out) {
    const int n = av_n_units(&v->cfg);
    h3_pack *packs = h3_calloc((size_t)n, sizeof *packs, H3_MEM_OTHER);
    if (!packs) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    av_pack_ctx x = {v, packs, src, place == H3_PLACE_DEVICE};
    h3_status st = av_walk(&v->cfg, av_pack_one, &x);
    const h3_units_config uc = {place, NULL, 0, 0, &v->st, 0, 0, NULL, NULL, "the audio VAE's weights", 0, NULL};
    if (st == H3_OK) st = h3_units_open(ex, &uc, packs, n, out);
    h3_free(packs);
    return st;
}

/* Binds every tensor the decode reads (views: nothing is read but stored filters of another dtype, converted
 * to f32) and opens the units a host decode reaches them through. */
static h3_status av_bind_all(h3_audio_vae *v) {
    v->bound = h3_calloc((size_t)av_index_count(&v->cfg), sizeof *v->bound, H3_MEM_OTHER);
    if (!v->bound) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    H3_TRY(av_walk(&v->cfg, av_bind_one, v));
    return av_open_units(v, NULL, v->bound, H3_PLACE_HOST, &v->host);
}

/* The device's units: every tensor resident as f32. Tensors stored in another dtype are converted on the host
 * first (copies freed once the units hold them). */
static h3_status av_open_device(h3_audio_vae *v, h3_exec *ex) {
    const int64_t n = av_index_count(&v->cfg);
    h3_tensor *f32 = h3_calloc((size_t)n, sizeof *f32, H3_MEM_OTHER);
    if (!f32) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_status st = H3_OK;
    for (int64_t i = 0; i < n && st == H3_OK; i++) {
        const h3_tensor *t = &v->bound[i];
        f32[i] = *t;
        f32[i].owner = NULL;
        if (!t->data || t->dtype == H3_F32) continue;
        st = h3_tensor_alloc(&f32[i], H3_PLACE_HOST, H3_F32, t->ndim, t->shape, H3_MEM_WEIGHTS);
        if (st == H3_OK && (!h3_tensor_is_contiguous(t) ||
                            !h3_convert_to_f32(t->dtype, t->data, f32[i].data, (size_t)h3_tensor_numel(t))))
            st = H3_ERR(H3_ERR_UNSUPPORTED, "%s: a weight of dtype %s cannot be read as f32", v->source,
                        h3_dtype_name(t->dtype));
    }
    if (st == H3_OK) st = av_open_units(v, ex, f32, H3_PLACE_DEVICE, &v->dev);
    for (int64_t i = 0; i < n; i++) h3_tensor_free(&f32[i]);
    h3_free(f32);
    if (st != H3_OK) {
        int64_t floats = 0;
        for (int64_t i = 0; i < n; i++) floats += h3_tensor_numel(&v->bound[i]);
        return h3_error_wrap(st, "uploading the audio VAE's %.1f MiB of weights to the device",
                             (double)floats / 262144.0);
    }
    return H3_OK;
}

h3_status h3_audio_vae_set_placement(h3_audio_vae *v, h3_place act_place) {
    if (act_place != H3_PLACE_HOST && act_place != H3_PLACE_PINNED && act_place != H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID, "audio VAE: unknown placement %d", (int)act_place);
    if (act_place != H3_PLACE_DEVICE) {
        h3_units_close(v->dev);
        v->dev = NULL;
    }
    v->act_place = act_place == H3_PLACE_DEVICE ? H3_PLACE_DEVICE : H3_PLACE_HOST;
    return H3_OK;
}

/* The one way the decode reaches weights: part `part`'s unit, at the decode's place (the device's units are
 * made by the first device decode). Release with av_release. */
typedef struct {
    const h3_audio_vae_config *c;
    av_part *p;
    const h3_tensor *t;
    int want, k;
} av_fill_ctx;

static h3_status av_fill_one(void *user, int unit, int kind, int id, int which, int64_t n) {
    (void)n;
    av_fill_ctx *x = user;
    if (unit != x->want) return H3_OK;
    const h3_audio_vae_config *c = x->c;
    const h3_tensor t = x->t[x->k++];
    av_part *p = x->p;
    if (kind == AV_IN) {
        *(which ? &p->in.b : &p->in.w) = t;
    } else if (kind == AV_CONV) {
        av_conv *cv = id == 0 ? &p->pre : id == av_post(c) ? &p->post : id <= c->n_up ? &p->up : NULL;
        if (!cv) {
            const int k = id - 1 - c->n_up, w = k % 2, d = (k / 2) % c->n_dil,
                      r = (k / 2 / c->n_dil) % c->n_res;
            cv = &p->res[r][d][w];
        }
        *(which ? &cv->b : &cv->w) = t;
    } else {
        const int per = c->n_res * 2 * c->n_dil;
        av_act *a =
            id == av_n_act(c) - 1 ? &p->post_act : &p->act[(id % per) / (2 * c->n_dil)][id % (2 * c->n_dil)];
        h3_tensor *f[4] = {&a->alpha, &a->beta, &a->up, &a->down};
        *f[which] = t;
    }
    return H3_OK;
}

static h3_units *av_units(const h3_audio_vae *v) {
    return v->act_place == H3_PLACE_DEVICE ? v->dev : v->host;
}

static h3_status av_acquire(h3_audio_vae *v, h3_exec *ex, int part, av_part *p) {
    memset(p, 0, sizeof *p);
    if (v->act_place == H3_PLACE_DEVICE && !v->dev) H3_TRY(av_open_device(v, ex));
    const int unit = part + 1;
    const h3_tensor *t;
    H3_TRY(h3_units_acquire(av_units(v), unit, &t));
    av_fill_ctx x = {&v->cfg, p, t, unit, 0};
    return av_walk(&v->cfg, av_fill_one, &x);
}

static void av_release(h3_audio_vae *v, int part) {
    h3_units_release(av_units(v), part + 1);
}

/* ---- the decode
 * --------------------------------------------------------------------------------------------- */

typedef struct {
    int64_t T, nb; /* latents per channel; channels decoded together (a batch) */
    /* float offsets into the one buffer of a pass, each region [nb, ·]: the latents, dec_in_proj's output and
     * the widest stage's tensors */
    int64_t o_z, o_a0, o_x, o_y, o_acc, o_h, o_t1, o_t2, total;
} av_plan;

static int64_t al64(int64_t n) { /* floats, rounded to the arena's granule */
    return (n + 63) / 64 * 64;
}

static void av_make_plan(const h3_audio_vae_config *c, int64_t T, int64_t nb, av_plan *p) {
    memset(p, 0, sizeof *p);
    p->T = T;
    p->nb = nb;
    int64_t G = (int64_t)c->decoder_dim * T, len = T;
    for (int i = 0; i < c->n_up; i++) {
        len *= c->rates[i];
        int64_t ch = av_ch(c, i);
        if (ch * len > G) G = ch * len;
    }
    int64_t o = 0;
#define TAKE(f, n) (p->f = o, o += al64(nb * (n)))
    TAKE(o_z, (int64_t)c->latent_channels * T);
    TAKE(o_a0, (int64_t)c->latent_dim * T);
    TAKE(o_x, G);
    TAKE(o_y, G);
    TAKE(o_acc, G);
    TAKE(o_h, G);
    TAKE(o_t1, G);
    TAKE(o_t2, G);
#undef TAKE
    p->total = o;
}

typedef struct {
    h3_audio_vae *v;
    h3_exec *ex;
    const av_plan *p;
    float *ar;      /* the pass's buffer (p->total floats) at `place` */
    h3_place place; /* HOST or DEVICE */
} av_run;

/* [nb, C, L] at float offset `off` of the pass's buffer. */
static h3_tensor av_t(const av_run *r, int64_t off, int64_t C, int64_t L) {
    h3_tensor t;
    int64_t s[3] = {r->p->nb, C, L};
    h3_tensor_wrap(&t, r->ar + off, r->place, H3_F32, 3, s);
    return t;
}

/* Upsampling stage i: x [nb, 2C, len/u] -> x [nb, C, len]. */
static h3_status av_stage(av_run *r, int i, const av_part *w, int64_t len) {
    const h3_audio_vae_config *c = &r->v->cfg;
    const av_plan *p = r->p;
    int64_t C = av_ch(c, i), u = c->rates[i];
    h3_tensor x = av_t(r, p->o_x, 2 * C, len / u), y = av_t(r, p->o_y, C, len),
              acc = av_t(r, p->o_acc, C, len);
    h3_tensor h = av_t(r, p->o_h, C, len), t1 = av_t(r, p->o_t1, C, len), t2 = av_t(r, p->o_t2, C, len);
    h3_convt1d_params up = av_up_params(c, i);
    H3_TRY(h3_op_conv_transpose1d(r->ex, &y, &x, &w->up.w, &w->up.b, &up));
    for (int rb = 0; rb < c->n_res; rb++) {
        h3_tensor *hb = rb == 0 ? &acc : &h;
        H3_TRY(h3_op_convert(r->ex, hb, &y));
        for (int d = 0; d < c->n_dil; d++) {
            const av_act *a1 = &w->act[rb][2 * d], *a2 = &w->act[rb][2 * d + 1];
            h3_conv1d_params p1 = av_res_params(c, rb, d, 0), p2 = av_res_params(c, rb, d, 1);
            H3_TRY(
                h3_op_snake_aa(r->ex, &t1, hb, &a1->alpha, &a1->beta, &a1->up, &a1->down, H3_SNAKE_LOGSCALE));
            H3_TRY(h3_op_conv1d(r->ex, &t2, &t1, &w->res[rb][d][0].w, &w->res[rb][d][0].b, &p1));
            H3_TRY(h3_op_snake_aa(r->ex, &t1, &t2, &a2->alpha, &a2->beta, &a2->up, &a2->down,
                                  H3_SNAKE_LOGSCALE));
            H3_TRY(h3_op_conv1d(r->ex, &t2, &t1, &w->res[rb][d][1].w, &w->res[rb][d][1].b, &p2));
            H3_TRY(h3_op_binary(r->ex, hb, &t2, hb, H3_BINARY_ADD));
        }
        if (rb > 0) H3_TRY(h3_op_binary(r->ex, &acc, &acc, &h, H3_BINARY_ADD));
    }
    h3_tensor xo = av_t(r, p->o_x, C, len);
    return h3_op_scale(r->ex, &xo, &acc, 1.0f / (float)c->n_res, 0.0f);
}

/* One pass: the nb channels of z_in (host, [nb, C, T]) to wave (host, [nb, T·hop]). */
static h3_status av_decode_pass(av_run *r, const float *z_in, float *wave) {
    h3_audio_vae *v = r->v;
    const h3_audio_vae_config *c = &v->cfg;
    const av_plan *p = r->p;
    const int64_t T = p->T, C = c->latent_channels, nb = p->nb, S = T * c->hop;
    h3_exec *ex = r->ex;
    h3_status st = H3_OK;
    int held = -2; /* the part held; -2: none */
    av_part *w = h3_malloc(sizeof *w, H3_MEM_OTHER);
    if (!w) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    memset(w, 0, sizeof *w);
    h3_tensor z = av_t(r, p->o_z, C, T), zin;
    int64_t sz[3] = {nb, C, T}, sw[3] = {nb, 1, S};
    H3_CHECK(h3_tensor_wrap(&zin, (void *)z_in, H3_PLACE_HOST, H3_F32, 3, sz));
    if (r->place == H3_PLACE_DEVICE) H3_CHECK(h3_copy(ex, &z, &zin));
    /* de-normalize: z[i, ch] = latents[i, ch] · std[ch] + mean[ch] (on the device in place, after the copy)
     */
    const h3_tensor *zsrc = r->place == H3_PLACE_DEVICE ? &z : &zin;
    for (int64_t row = 0; row < nb * C; row++) {
        const int64_t ch = row % C, s1[2] = {1, T};
        h3_tensor src, dst;
        H3_CHECK(h3_tensor_wrap(&src, (float *)zsrc->data + row * T, zsrc->place, H3_F32, 2, s1));
        H3_CHECK(h3_tensor_wrap(&dst, (float *)z.data + row * T, z.place, H3_F32, 2, s1));
        H3_CHECK(h3_op_scale(ex, &dst, &src, c->latents_std[ch], c->latents_mean[ch]));
    }
    H3_CHECK(av_acquire(v, ex, -1, w));
    held = -1;
    {
        h3_tensor a0 = av_t(r, p->o_a0, c->latent_dim, T), x = av_t(r, p->o_x, c->decoder_dim, T);
        h3_conv1d_params k1 = av_k(1), k7 = av_k(7);
        H3_CHECK(h3_op_conv1d(ex, &a0, &z, &w->in.w, &w->in.b, &k1));
        H3_CHECK(h3_op_conv1d(ex, &x, &a0, &w->pre.w, &w->pre.b, &k7));
    }
    av_release(v, held);
    held = -2;
    int64_t len = T;
    for (int i = 0; i < c->n_up; i++) {
        len *= c->rates[i];
        H3_CHECK(av_acquire(v, ex, i, w));
        held = i;
        H3_CHECK_CTX(av_stage(r, i, w, len), "upsampling stage %d", i);
        av_release(v, held);
        held = -2;
    }
    H3_CHECK(av_acquire(v, ex, c->n_up, w));
    held = c->n_up;
    {
        int64_t Cl = av_ch(c, c->n_up - 1);
        h3_tensor x = av_t(r, p->o_x, Cl, len), t1 = av_t(r, p->o_t1, Cl, len), host_out, out;
        H3_CHECK(h3_tensor_wrap(&host_out, wave, H3_PLACE_HOST, H3_F32, 3, sw));
        out = r->place == H3_PLACE_DEVICE ? av_t(r, p->o_t2, 1, S) : host_out;
        h3_conv1d_params k7 = av_k(7);
        const av_act *a = &w->post_act;
        H3_CHECK(h3_op_snake_aa(ex, &t1, &x, &a->alpha, &a->beta, &a->up, &a->down, H3_SNAKE_LOGSCALE));
        H3_CHECK(h3_op_conv1d(ex, &out, &t1, &w->post.w, NULL, &k7));
        H3_CHECK(h3_op_clamp(ex, &out, &out, -1.0f, 1.0f));
        if (r->place == H3_PLACE_DEVICE) H3_CHECK(h3_copy(ex, &host_out, &out)); /* waits for the device */
    }
done:
    if (held > -2) av_release(v, held);
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
        return H3_ERR(H3_ERR_INVALID, "audio latents must be contiguous f32 host memory, got %s",
                      h3_dtype_name(z->dtype));
    int off = z->ndim == 3;
    int64_t ch = off ? z->shape[0] : 1, C = z->shape[off], T = z->shape[off + 1];
    if (C != c->latent_channels)
        return H3_ERR(H3_ERR_INVALID, "audio latents %s have %lld channels; this audio VAE takes %d",
                      h3_tensor_shape_str(z, s, sizeof s), (long long)C, c->latent_channels);
    if (ch < 1 || ch > 16 || T < 1 || T > 1000000)
        return H3_ERR(H3_ERR_INVALID,
                      "audio latents %s: 1 to 16 channels (2 for stereo) and 1 to 10^6 latents per "
                      "channel",
                      h3_tensor_shape_str(z, s, sizeof s));
    return H3_OK;
}

h3_status h3_audio_vae_decode(h3_audio_vae *v, h3_exec *ex, const h3_tensor *latents, h3_tensor *wave) {
    const h3_audio_vae_config *c = &v->cfg;
    if (v->headers_only)
        return H3_ERR(H3_ERR_INVALID, "audio decode: %s was opened for its headers only", v->source);
    H3_TRY(h3_audio_vae_check_latents(c, latents));
    int off = latents->ndim == 3;
    int64_t ch = off ? latents->shape[0] : 1, T = latents->shape[off + 1], S = T * c->hop;
    char s[96];
    if (!wave || wave->dtype != H3_F32 || !h3_tensor_is_contiguous(wave) || wave->place == H3_PLACE_DEVICE ||
        h3_tensor_numel(wave) != ch * S || h3_tensor_cols(wave) != S || wave->shape[0] != ch)
        return H3_ERR(H3_ERR_INVALID,
                      "audio decode: the waveform must be contiguous f32 [%lld, %lld] or [%lld, 1, %lld], "
                      "got %s",
                      (long long)ch, (long long)S, (long long)ch, (long long)S,
                      wave ? h3_tensor_shape_str(wave, s, sizeof s) : "none");
    const int dev = v->act_place == H3_PLACE_DEVICE;
    if (dev && (!ex->cuda || !h3_backend_for_place(H3_PLACE_DEVICE)))
        return H3_ERR(H3_ERR_INVALID, "audio decode on the device: %s",
                      h3_cuda_compiled() ? "the CUDA backend is not initialized (h3_cuda_init)"
                                         : "this build has no CUDA backend (decode on the host)");
    av_plan p;
    av_make_plan(c, T, dev ? ch : 1,
                 &p); /* the device decodes every channel in one batch, the host one by one */
    av_run r = {v, ex, &p, NULL, dev ? H3_PLACE_DEVICE : H3_PLACE_HOST};
    h3_tensor dbuf = {0};
    if (dev) {
        h3_status st = h3_tensor_alloc(&dbuf, H3_PLACE_DEVICE, H3_F32, 1, &p.total, H3_MEM_ACTIVATIONS);
        if (st != H3_OK)
            return h3_error_wrap(st, "the audio decode's %.1f MiB of device buffers", p.total / 262144.0);
        r.ar = dbuf.data;
    } else {
        r.ar = h3_malloc((size_t)p.total * sizeof(float), H3_MEM_ACTIVATIONS);
        if (!r.ar)
            return H3_ERR(H3_ERR_NOMEM, "out of memory for the audio decode's %lld MB of buffers",
                          (long long)(p.total * 4 >> 20));
    }
    h3_status st = H3_OK;
    for (int64_t i = 0; i < ch && st == H3_OK; i += p.nb) {
        st = av_decode_pass(&r, (const float *)latents->data + i * c->latent_channels * T,
                            (float *)wave->data + i * S);
        if (st != H3_OK && ch > 1 && p.nb == 1) st = h3_error_wrap(st, "audio channel %lld", (long long)i);
    }
    if (dev)
        h3_tensor_free(&dbuf);
    else
        h3_free(r.ar);
    return st;
}

/* ---- planned memory
 * ----------------------------------------------------------------------------------------- */

/* What the convolutions take while they run (f32 weights: no copies), from the kernels' own arithmetic. */
#define CONV(cin_g, K, tout)         h3_cpu_conv1d_scratch_bytes(cin_g, K, tout)
#define CONVT(cout_g, cin_g, K, tin) h3_cpu_convt1d_scratch_bytes(cout_g, cin_g, K, tin)
#define DCONV(nb, cin, K, tout, p)   h3_cuda_granule(h3_cuda_conv1d_scratch_bytes(nb, cin, K, tout, p, 4))
#define DCONVT(nb, cin, cout, K, tin)                                                                        \
    h3_cuda_granule(h3_cuda_convt1d_scratch_bytes(nb, cin, cout, K, tin, 1, 4))

#define MAXI(a, b) ((a) > (b) ? (a) : (b))

static h3_status av_sum_one(void *user, int unit, int kind, int id, int which, int64_t n) {
    (void)unit, (void)kind, (void)id, (void)which;
    *(int64_t *)user += h3_cuda_granule(n * 4);
    return H3_OK;
}

h3_status h3_audio_vae_decode_peak(const h3_audio_vae_config *c, int64_t T, int64_t channels,
                                   h3_audio_vae_mem *out) {
    memset(out, 0, sizeof *out);
    if (T < 1 || channels < 1 || channels > 16 || c->n_up < 1 || c->n_up > H3_AVAE_MAX_UPS || c->n_res < 1 ||
        c->n_res > H3_AVAE_MAX_RES || c->n_dil < 1 || c->n_dil > H3_AVAE_MAX_RES)
        return H3_ERR(H3_ERR_INVALID, "audio VAE plan: bad sizes");
    const int64_t nb = channels;
    av_plan p;
    av_make_plan(c, T, 1, &p);
    out->buffers = p.total * 4 + (int64_t)sizeof(av_part);
    h3_conv1d_params k1 = av_k(1), k7 = av_k(7);
    int64_t len = T, op = MAXI(CONV(c->latent_channels, 1, T), CONV(c->latent_dim, 7, T));
    int64_t dop = MAXI(DCONV(nb, c->latent_channels, 1, T, &k1), DCONV(nb, c->latent_dim, 7, T, &k7));
    for (int i = 0; i < c->n_up; i++) {
        const int64_t C = av_ch(c, i), tin = len;
        len *= c->rates[i];
        op = MAXI(op, CONVT(C, 2 * C, c->kernels[i], tin));
        op = MAXI(op, h3_cpu_snake_aa_scratch_bytes(C));
        dop = MAXI(dop, DCONVT(nb, 2 * C, C, c->kernels[i], tin));
        for (int r = 0; r < c->n_res; r++) {
            op = MAXI(op, CONV(C, c->res_kernels[r], len));
            for (int d = 0; d < c->n_dil; d++)
                for (int which = 0; which < 2; which++) {
                    h3_conv1d_params pr = av_res_params(c, r, d, which);
                    dop = MAXI(dop, DCONV(nb, C, c->res_kernels[r], len, &pr));
                }
        }
    }
    const int64_t Cl = av_ch(c, c->n_up - 1);
    op = MAXI(op, CONV(Cl, 7, len));
    dop = MAXI(dop, DCONV(nb, Cl, 7, len, &k7));
    out->op_scratch = op;
    out->total = out->buffers + out->op_scratch;
    av_make_plan(c, T, nb, &p);
    H3_TRY(av_walk(c, av_sum_one, &out->dev_weights)); /* the units, as f32: each tensor on its granules */
    out->dev_buffers = h3_cuda_granule(p.total * 4);
    out->dev_op_scratch = dop;
    out->dev_total = out->dev_weights + out->dev_buffers + out->dev_op_scratch;
    return H3_OK;
}

/* Qwen3-VL's vision tower, image processor and vision rows in the text encoder, against computations written
 * here independently: smart_resize on sizes worked out from transformers' formula, get_rope_index's positions
 * for a two-image prompt written out, the ViT's rotary table from its definition, and a tiny random model
 * (official names, config.json) whose tower and text encoder run against a naive float64 implementation. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "io/safetensors.h"
#include "models/text_encoder.h"
#include "models/vision.h"
#include "pipeline/media.h"
#include "testutil.h"

/* ---- the processor ----------------------------------------------------------------------------------------
 */

static void test_smart_resize(void) {
    /* factor 32, min 65536, max 16777216 (Qwen3-VL): h, w -> h', w' (round half to even, then the bounds) */
    static const int64_t tab[][4] = {
        {480, 640, 480, 640},     {500, 700, 512, 704}, /* 15.625 -> 16, 21.875 -> 22 */
        {48, 80, 224, 352},       /* 1.5 -> 2, 2.5 -> 2 (half to even); below min: ceil(h·√(min/hw)/32) */
        {1008, 1040, 1024, 1024}, /* 31.5 -> 32, 32.5 -> 32 */
        {8000, 6000, 4704, 3520}, /* above max: floor(h/β/32) */
        {1, 200, 32, 3648},       {100, 1, 2560, 32},   {224, 224, 256, 256},
        {720, 1280, 704, 1280},   {3000, 40, 3008, 32},
    };
    h3_vis_config c;
    h3_vis_config_default(&c);
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        int64_t h, w;
        CHECK_OK(h3_vis_smart_resize(&c, tab[i][0], tab[i][1], &h, &w));
        CHECK(h == tab[i][2] && w == tab[i][3], "smart_resize(%lld, %lld) = (%lld, %lld), want (%lld, %lld)",
              (long long)tab[i][0], (long long)tab[i][1], (long long)h, (long long)w, (long long)tab[i][2],
              (long long)tab[i][3]);
    }
    int64_t h, w;
    CHECK_ERR(h3_vis_smart_resize(&c, 10, 2001, &h, &w), H3_ERR_INVALID, "aspect ratio");
    CHECK_ERR(h3_vis_smart_resize(&c, 0, 5, &h, &w), H3_ERR_INVALID, "no pixels");
}

static void test_preprocess(void) {
    /* 64x96 with min_pixels below it: no resize; every value is (v/255 − 0.5)/0.5 at its patch position */
    h3_vis_config c;
    h3_vis_config_default(&c);
    c.min_pixels = 1024;
    const int W = 96, H = 64;
    uint8_t *img = h3_malloc((size_t)W * H * 3, H3_MEM_IO);
    for (int i = 0; i < W * H * 3; i++) img[i] = (uint8_t)(t_rand_u64() & 255);
    h3_tensor px;
    int64_t g[3];
    CHECK_OK(h3_vis_preprocess(&c, img, W, H, &px, g));
    CHECK(g[0] == 1 && g[1] == 4 && g[2] == 6, "grid [%lld, %lld, %lld]", (long long)g[0], (long long)g[1],
          (long long)g[2]);
    CHECK(px.shape[0] == 24 && px.shape[1] == 1536, "pixel_values shape");
    int bad = 0;
    const float *pv = px.data;
    for (int64_t r = 0; r < 24 && !bad; r++) {
        /* row r = ((bh·3 + bw)·2 + mh)·2 + mw */
        const int64_t mw = r % 2, mh = (r / 2) % 2, bw = (r / 4) % 3, bh = r / 12;
        const int64_t py = (bh * 2 + mh) * 16, pxx = (bw * 2 + mw) * 16;
        for (int64_t k = 0; k < 1536; k++) {
            const int64_t ch = k / 512, x = k % 16, y = (k / 16) % 16; /* (c, tp, ph, pw); tp repeats */
            const float want = (float)(((double)img[((py + y) * W + pxx + x) * 3 + ch] / 255.0 - 0.5) / 0.5);
            if (fabsf(pv[r * 1536 + k] - want) > 1e-6f) bad = 1;
        }
    }
    CHECK(!bad, "patch layout or normalization differs from (c, tp, ph, pw) of patch (bh·2+mh, bw·2+mw)");
    h3_tensor_free(&px);
    /* a constant image stays constant through the bicubic resize (normalized 8-bit weights) */
    memset(img, 77, (size_t)W * H * 3);
    uint8_t out[40 * 30 * 3];
    CHECK_OK(h3_vis_resize_bicubic(img, W, H, out, 40, 30));
    int same = 1;
    for (size_t i = 0; i < sizeof out; i++) same &= out[i] == 77;
    CHECK(same, "a constant image changed through the resize");
    h3_free(img);
}

static void test_bad_images(void) {
    char p[512];
    uint8_t *rgb;
    int w, h;
    CHECK_ERR(h3_image_read(t_tmp_path("no_such_image.png", p, sizeof p), H3_IMAGE_MAX_PIXELS, &rgb, &w, &h),
              H3_ERR_IO, "no_such_image");
    FILE *f = fopen(t_tmp_path("garbage.png", p, sizeof p), "wb");
    fputs("\x89PNG\r\n\x1a\nnot really", f);
    fclose(f);
    h3_status st = h3_image_read(p, H3_IMAGE_MAX_PIXELS, &rgb, &w, &h);
    CHECK(st != H3_OK && rgb == NULL, "a broken PNG was read");
    h3_clear_error();
    f = fopen(t_tmp_path("empty.jpg", p, sizeof p), "wb");
    fclose(f);
    st = h3_image_read(p, H3_IMAGE_MAX_PIXELS, &rgb, &w, &h);
    CHECK(st != H3_OK && rgb == NULL, "an empty file was read");
    h3_clear_error();
}

/* ---- positions --------------------------------------------------------------------------------------------
 */

enum { IMG = 60, VS = 61, VE = 59 };
/* [1, 2, VS, IMG×6, VE, 3, VS, IMG, VE, 4] with grids [1, 4, 6] and [1, 2, 2] */
static const int32_t g_ids[15] = {1, 2, VS, IMG, IMG, IMG, IMG, IMG, IMG, VE, 3, VS, IMG, VE, 4};
static const int64_t g_grid[2][3] = {{1, 4, 6}, {1, 2, 2}};
static const int64_t g_pos[3][15] = {
    {0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 9, 10, 11},
    {0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8, 9, 10, 11},
    {0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9, 10, 11},
};

static void tiny_vis_config(h3_vis_config *c) {
    h3_vis_config_default(c);
    c->image_token_id = IMG;
    c->vision_start_token_id = VS;
    c->video_token_id = 62;
}

static void test_rope_index(void) {
    h3_vis_config c;
    tiny_vis_config(&c);
    int64_t pos[3 * 15], nv = 0;
    CHECK_OK(h3_vision_rope_index(&c, g_ids, 15, g_grid, 2, pos, &nv));
    CHECK(nv == 7, "image tokens %lld, want 7", (long long)nv);
    CHECK(!memcmp(pos, g_pos, sizeof pos), "positions differ from get_rope_index's written out");
    /* disagreements */
    CHECK_ERR(h3_vision_rope_index(&c, g_ids, 15, g_grid, 1, pos, &nv), H3_ERR_INVALID, "more image blocks");
    const int64_t big[2][3] = {{1, 4, 8}, {1, 2, 2}};
    CHECK_ERR(h3_vision_rope_index(&c, g_ids, 15, big, 2, pos, &nv), H3_ERR_INVALID, "needs 8 image tokens");
    const int64_t small[2][3] = {{1, 2, 6}, {1, 2, 2}};
    CHECK_ERR(h3_vision_rope_index(&c, g_ids, 15, small, 2, pos, &nv), H3_ERR_INVALID, "more image tokens");
    int32_t bad[15];
    memcpy(bad, g_ids, sizeof bad);
    bad[2] = 5;
    CHECK_ERR(h3_vision_rope_index(&c, bad, 15, g_grid, 2, pos, &nv), H3_ERR_INVALID, "vision-start");
    /* the text encoder's mRoPE tables with these positions: frequency j reads t, h or w as the sections say
     */
    h3_te_config tc;
    h3_te_config_default(&tc);
    tc.head_dim = 8;
    tc.mrope_section[0] = 2;
    tc.mrope_section[1] = 1;
    tc.mrope_section[2] = 1;
    float cs[15 * 8], sn[15 * 8];
    h3_te_mrope_tables(&tc, pos, 15, cs, sn);
    static const int axis[4] = {0, 1, 2, 0}; /* j=1 < 3·1 -> h, j=2 < 3·1 -> w, j=3 -> t */
    double err = 0;
    for (int r = 0; r < 15; r++)
        for (int j = 0; j < 4; j++) {
            const double a = (double)g_pos[axis[j]][r] * pow(tc.rope_theta, -2.0 * j / 8.0);
            err = fmax(err, fabs(cs[r * 8 + j] - cos(a)) + fabs(sn[r * 8 + j + 4] - sin(a)));
        }
    CHECK(err < 1e-5, "mRoPE tables off by %.3g", err);
}

static void test_vit_rope(void) {
    h3_vis_config c;
    tiny_vis_config(&c);
    c.hidden = 16;
    c.heads = 2; /* D = 8: 2 frequencies per axis */
    const int64_t gr[1][3] = {{1, 4, 6}};
    float cs[24 * 8], sn[24 * 8];
    h3_vision_rope_tables(&c, gr, 1, cs, sn);
    double err = 0;
    for (int r = 0; r < 24; r++) {
        const int mw = r % 2, mh = (r / 2) % 2, bw = (r / 4) % 3, bh = r / 12, y = bh * 2 + mh,
                  x = bw * 2 + mw;
        const double a[4] = {y * 1.0, y * pow(10000.0, -0.5), x * 1.0, x * pow(10000.0, -0.5)};
        for (int j = 0; j < 8; j++)
            err = fmax(err, fabs(cs[r * 8 + j] - cos(a[j % 4])) + fabs(sn[r * 8 + j] - sin(a[j % 4])));
    }
    CHECK(err < 1e-5, "ViT rotary table off by %.3g", err);
}

/* ---- a tiny model against float64 -------------------------------------------------------------------------
 */

enum { TC = 32, TL = 3, TH = 4, TKV = 2, TD = 8, TF = 48, TV = 64 };                      /* text */
enum { VH = 16, VHEADS = 2, VD = 8, VF = 24, VP = 2, VDEPTH = 3, VSIDE = 4, VCOLS = 24 }; /* vision */
static const int g_deep[2] = {0, 2};

typedef struct {
    const char *name;
    int nd;
    int64_t s[5];
    double scale, bias; /* values bias + scale·N(0,1) */
    float *v;
} tw;

static tw g_w[200];
static int g_nw;

static float *W(const char *fmt, ...) H3_PRINTF(1, 2);
static float *W(const char *fmt, ...) {
    char n[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(n, sizeof n, fmt, ap);
    va_end(ap);
    for (int i = 0; i < g_nw; i++)
        if (!strcmp(g_w[i].name, n)) return g_w[i].v;
    t_fail_at(__FILE__, __LINE__, "no weight %s", n);
    exit(1);
}

static void add(const char *name, int nd, int64_t a, int64_t b, double scale, double bias) {
    tw *t = &g_w[g_nw++];
    t->name = h3_strdup(name);
    t->nd = nd;
    t->s[0] = a;
    t->s[1] = b;
    t->scale = scale;
    t->bias = bias;
    int64_t n = nd == 1 ? a : a * b;
    t->v = h3_malloc((size_t)n * sizeof(float), H3_MEM_OTHER);
    for (int64_t i = 0; i < n; i++) t->v[i] = (float)(bias + scale * t_randn());
}

static void build_weights(void) {
    char n[160];
    g_nw = 0;
    add("model.language_model.embed_tokens.weight", 2, TV, TC, 1.0, 0);
    for (int l = 0; l < TL; l++) {
#define A(s, nd, a, b, sc, bi)                                                                               \
    (snprintf(n, sizeof n, "model.language_model.layers.%d.%s", l, s), add(n, nd, a, b, sc, bi))
        A("input_layernorm.weight", 1, TC, 0, 0.1, 1);
        A("post_attention_layernorm.weight", 1, TC, 0, 0.1, 1);
        A("self_attn.q_proj.weight", 2, TH * TD, TC, 1 / sqrt(TC), 0);
        A("self_attn.k_proj.weight", 2, TKV * TD, TC, 1 / sqrt(TC), 0);
        A("self_attn.v_proj.weight", 2, TKV * TD, TC, 1 / sqrt(TC), 0);
        A("self_attn.o_proj.weight", 2, TC, TH * TD, 0.5 / sqrt(TH * TD), 0);
        A("self_attn.q_norm.weight", 1, TD, 0, 0.1, 1);
        A("self_attn.k_norm.weight", 1, TD, 0, 0.1, 1);
        A("mlp.gate_proj.weight", 2, TF, TC, 1 / sqrt(TC), 0);
        A("mlp.up_proj.weight", 2, TF, TC, 1 / sqrt(TC), 0);
        A("mlp.down_proj.weight", 2, TC, TF, 0.5 / sqrt(TF), 0);
#undef A
    }
    add("model.language_model.norm.weight", 1, TC, 0, 0.1, 1);
    add("model.visual.patch_embed.proj.weight", 2, VH, VCOLS, 1 / sqrt(VCOLS), 0); /* stored 5-D below */
    add("model.visual.patch_embed.proj.bias", 1, VH, 0, 0.1, 0);
    add("model.visual.pos_embed.weight", 2, VSIDE * VSIDE, VH, 0.5, 0);
    for (int l = 0; l < VDEPTH; l++) {
#define B(s, nd, a, b, sc, bi)                                                                               \
    (snprintf(n, sizeof n, "model.visual.blocks.%d.%s", l, s), add(n, nd, a, b, sc, bi))
        B("norm1.weight", 1, VH, 0, 0.1, 1);
        B("norm1.bias", 1, VH, 0, 0.1, 0);
        B("norm2.weight", 1, VH, 0, 0.1, 1);
        B("norm2.bias", 1, VH, 0, 0.1, 0);
        B("attn.qkv.weight", 2, 3 * VH, VH, 1 / sqrt(VH), 0);
        B("attn.qkv.bias", 1, 3 * VH, 0, 0.1, 0);
        B("attn.proj.weight", 2, VH, VH, 0.5 / sqrt(VH), 0);
        B("attn.proj.bias", 1, VH, 0, 0.1, 0);
        B("mlp.linear_fc1.weight", 2, VF, VH, 1 / sqrt(VH), 0);
        B("mlp.linear_fc1.bias", 1, VF, 0, 0.1, 0);
        B("mlp.linear_fc2.weight", 2, VH, VF, 0.5 / sqrt(VF), 0);
        B("mlp.linear_fc2.bias", 1, VH, 0, 0.1, 0);
#undef B
    }
    for (int k = -1; k < 2; k++) {
        char p[96];
        if (k < 0)
            snprintf(p, sizeof p, "model.visual.merger.");
        else
            snprintf(p, sizeof p, "model.visual.deepstack_merger_list.%d.", k);
        const int nw = k < 0 ? VH : 4 * VH;
#define M(s, nd, a, b, sc, bi) (snprintf(n, sizeof n, "%s%s", p, s), add(n, nd, a, b, sc, bi))
        M("norm.weight", 1, nw, 0, 0.1, 1);
        M("norm.bias", 1, nw, 0, 0.1, 0);
        M("linear_fc1.weight", 2, 4 * VH, 4 * VH, 1 / sqrt(4 * VH), 0);
        M("linear_fc1.bias", 1, 4 * VH, 0, 0.1, 0);
        M("linear_fc2.weight", 2, TC, 4 * VH, 1 / sqrt(4 * VH), 0);
        M("linear_fc2.bias", 1, TC, 0, 0.1, 0);
#undef M
    }
}

static void write_model(const char *dir) {
    char p[600];
    mkdir(dir, 0755);
    h3_st_writer *w;
    CHECK_OK(h3_st_writer_new(&w));
    for (int i = 0; i < g_nw; i++) {
        const tw *t = &g_w[i];
        if (!strcmp(t->name, "model.visual.patch_embed.proj.weight")) {
            const int64_t s5[5] = {VH, 3, 2, VP, VP};
            CHECK_OK(h3_st_writer_add(w, t->name, H3_F32, 5, s5, t->v));
        } else {
            CHECK_OK(h3_st_writer_add(w, t->name, H3_F32, t->nd, t->s, t->v));
        }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(h3_st_writer_write(w, p, 0));
    h3_st_writer_free(w);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fprintf(
        f,
        "{\"architectures\": [\"Qwen3VLForConditionalGeneration\"], \"image_token_id\": %d, "
        "\"video_token_id\": 62,"
        " \"vision_start_token_id\": %d, \"text_config\": {\"hidden_size\": %d, \"num_hidden_layers\": %d,"
        " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"intermediate_size\": "
        "%d,"
        " \"vocab_size\": %d, \"rms_norm_eps\": 1e-6, \"rope_theta\": 5000000.0, \"rope_scaling\": "
        "{\"rope_type\":"
        " \"default\", \"mrope_section\": [2, 1, 1], \"mrope_interleaved\": true}}, \"vision_config\": "
        "{\"depth\": %d,"
        " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_heads\": %d, \"in_channels\": 3, "
        "\"patch_size\": %d,"
        " \"temporal_patch_size\": 2, \"spatial_merge_size\": 2, \"out_hidden_size\": %d, "
        "\"num_position_embeddings\":"
        " %d, \"deepstack_visual_indexes\": [%d, %d], \"hidden_act\": \"gelu_pytorch_tanh\"}}",
        IMG, VS, TC, TL, TH, TKV, TD, TF, TV, VDEPTH, VH, VF, VHEADS, VP, TC, VSIDE * VSIDE, g_deep[0],
        g_deep[1]);
    fclose(f);
}

/* ---- the float64 reference ---- */

static void lin64(const double *x, int64_t n, int64_t k, const float *w, const float *b, int64_t m,
                  double *y) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < m; o++) {
            double s = b ? b[o] : 0;
            for (int64_t j = 0; j < k; j++) s += x[i * k + j] * w[o * k + j];
            y[i * m + o] = s;
        }
}

static void ln64(double *x, int64_t n, int64_t c, const float *w, const float *b) {
    for (int64_t i = 0; i < n; i++) {
        double m = 0, v = 0;
        for (int64_t j = 0; j < c; j++) m += x[i * c + j];
        m /= c;
        for (int64_t j = 0; j < c; j++) v += (x[i * c + j] - m) * (x[i * c + j] - m);
        v /= c;
        for (int64_t j = 0; j < c; j++) x[i * c + j] = (x[i * c + j] - m) / sqrt(v + 1e-6) * w[j] + b[j];
    }
}

static void rms64(double *x, int64_t n, int64_t c, const float *w) {
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int64_t j = 0; j < c; j++) s += x[i * c + j] * x[i * c + j];
        const double r = 1 / sqrt(s / c + 1e-6);
        for (int64_t j = 0; j < c; j++) x[i * c + j] *= r * w[j];
    }
}

/* rotate-half with angles ang [D/2] on one head of D */
static void rope64(double *h, const double *ang, int D) {
    for (int j = 0; j < D / 2; j++) {
        const double a = h[j], b = h[j + D / 2], c = cos(ang[j]), s = sin(ang[j]);
        h[j] = a * c - b * s;
        h[j + D / 2] = b * c + a * s;
    }
}

/* softmax attention of query rows [q0, q1) over key rows [k0, k1) (causal: keys up to the query) */
static void attn64(const double *q, const double *k, const double *v, double *o, int64_t s0, int64_t s1,
                   int H, int Hk, int D, int causal, int64_t qld, int64_t kld) {
    double *p = malloc((size_t)(s1 - s0) * sizeof *p);
    for (int64_t i = s0; i < s1; i++)
        for (int h = 0; h < H; h++) {
            const int hk = h / (H / Hk);
            const int64_t e = causal ? i + 1 : s1;
            double mx = -1e300, sum = 0;
            for (int64_t j = s0; j < e; j++) {
                double d = 0;
                for (int c = 0; c < D; c++) d += q[i * qld + h * D + c] * k[j * kld + hk * D + c];
                p[j - s0] = d / sqrt(D);
                if (p[j - s0] > mx) mx = p[j - s0];
            }
            for (int64_t j = s0; j < e; j++) sum += (p[j - s0] = exp(p[j - s0] - mx));
            for (int c = 0; c < D; c++) {
                double a = 0;
                for (int64_t j = s0; j < e; j++) a += p[j - s0] * v[j * kld + hk * D + c];
                o[i * qld + h * D + c] = a / sum;
            }
        }
    free(p);
}

static double gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* merger k (-1: the final one) of x [N, VH] into out [N/4, TC] */
static void merger64(int k, const double *x, int64_t N, double *out) {
    char p[96];
    if (k < 0)
        snprintf(p, sizeof p, "model.visual.merger.");
    else
        snprintf(p, sizeof p, "model.visual.deepstack_merger_list.%d.", k);
    double *h = malloc((size_t)N * VH * sizeof *h), *f = malloc((size_t)N / 4 * 4 * VH * sizeof *f);
    memcpy(h, x, (size_t)N * VH * sizeof *h);
    if (k < 0)
        ln64(h, N, VH, W("%snorm.weight", p), W("%snorm.bias", p));
    else
        ln64(h, N / 4, 4 * VH, W("%snorm.weight", p), W("%snorm.bias", p));
    lin64(h, N / 4, 4 * VH, W("%slinear_fc1.weight", p), W("%slinear_fc1.bias", p), 4 * VH, f);
    for (int64_t i = 0; i < N / 4 * 4 * VH; i++) f[i] = 0.5 * f[i] * (1 + erf(f[i] / sqrt(2)));
    lin64(f, N / 4, 4 * VH, W("%slinear_fc2.weight", p), W("%slinear_fc2.bias", p), TC, out);
    free(h);
    free(f);
}

/* the tower: embeds [M, TC] and deep[2] [M, TC], M = N/4 */
static void vision64(const float *pix, const int64_t (*grid)[3], int n_img, int64_t N, double *emb,
                     double **deep) {
    double *x = calloc((size_t)N * VH, sizeof *x), *h = malloc((size_t)N * VH * sizeof *h),
           *qkv = malloc((size_t)N * 3 * VH * sizeof *qkv), *o = malloc((size_t)N * VH * sizeof *o),
           *f = malloc((size_t)N * VF * sizeof *f), *px = malloc((size_t)N * VCOLS * sizeof *px);
    double(*ang)[VD / 2] = malloc((size_t)N * sizeof *ang);
    for (int64_t i = 0; i < N * VCOLS; i++) px[i] = pix[i];
    lin64(px, N, VCOLS, W("model.visual.patch_embed.proj.weight"), W("model.visual.patch_embed.proj.bias"),
          VH, x);
    const float *tab = W("model.visual.pos_embed.weight");
    int64_t r = 0;
    for (int i = 0; i < n_img; i++) {
        const int64_t gh = grid[i][1], gw = grid[i][2];
        for (int64_t bh = 0; bh < gh / 2; bh++)
            for (int64_t bw = 0; bw < gw / 2; bw++)
                for (int mh = 0; mh < 2; mh++)
                    for (int mw = 0; mw < 2; mw++, r++) {
                        const int64_t y = bh * 2 + mh, xx = bw * 2 + mw;
                        const double fy = gh > 1 ? (double)y * (VSIDE - 1) / (double)(gh - 1) : 0,
                                     fx = gw > 1 ? (double)xx * (VSIDE - 1) / (double)(gw - 1) : 0;
                        const int y0 = (int)fy, x0 = (int)fx, y1 = y0 + 1 < VSIDE ? y0 + 1 : VSIDE - 1,
                                  x1 = x0 + 1 < VSIDE ? x0 + 1 : VSIDE - 1;
                        const double dy = fy - y0, dx = fx - x0;
                        for (int c = 0; c < VH; c++)
                            x[r * VH + c] += (1 - dy) * (1 - dx) * tab[(y0 * VSIDE + x0) * VH + c] +
                                             (1 - dy) * dx * tab[(y0 * VSIDE + x1) * VH + c] +
                                             dy * (1 - dx) * tab[(y1 * VSIDE + x0) * VH + c] +
                                             dy * dx * tab[(y1 * VSIDE + x1) * VH + c];
                        /* rotary: head_dim 8 -> 2 frequencies per axis of 10000^(−2j/4) */
                        for (int j = 0; j < 2; j++) {
                            ang[r][j] = (double)y * pow(10000.0, -2.0 * j / 4.0);
                            ang[r][2 + j] = (double)xx * pow(10000.0, -2.0 * j / 4.0);
                        }
                    }
    }
    int nd = 0;
    for (int l = 0; l < VDEPTH; l++) {
        char p[64];
        snprintf(p, sizeof p, "model.visual.blocks.%d.", l);
        memcpy(h, x, (size_t)N * VH * sizeof *h);
        ln64(h, N, VH, W("%snorm1.weight", p), W("%snorm1.bias", p));
        lin64(h, N, VH, W("%sattn.qkv.weight", p), W("%sattn.qkv.bias", p), 3 * VH, qkv);
        for (int64_t i = 0; i < N; i++)
            for (int hd = 0; hd < VHEADS; hd++) {
                rope64(&qkv[i * 3 * VH + hd * VD], ang[i], VD);
                rope64(&qkv[i * 3 * VH + VH + hd * VD], ang[i], VD);
            }
        /* per image; q, k, v are column blocks of qkv (row stride 3·VH) */
        int64_t s0 = 0;
        double *ob = calloc((size_t)N * 3 * VH, sizeof *ob);
        for (int i = 0; i < n_img; i++) {
            const int64_t len = grid[i][1] * grid[i][2];
            attn64(qkv, qkv + VH, qkv + 2 * VH, ob, s0, s0 + len, VHEADS, VHEADS, VD, 0, 3 * VH, 3 * VH);
            s0 += len;
        }
        for (int64_t i = 0; i < N; i++)
            for (int c = 0; c < VH; c++) o[i * VH + c] = ob[i * 3 * VH + c];
        free(ob);
        lin64(o, N, VH, W("%sattn.proj.weight", p), W("%sattn.proj.bias", p), VH, h);
        for (int64_t i = 0; i < N * VH; i++) x[i] += h[i];
        memcpy(h, x, (size_t)N * VH * sizeof *h);
        ln64(h, N, VH, W("%snorm2.weight", p), W("%snorm2.bias", p));
        lin64(h, N, VH, W("%smlp.linear_fc1.weight", p), W("%smlp.linear_fc1.bias", p), VF, f);
        for (int64_t i = 0; i < N * VF; i++) f[i] = gelu_tanh(f[i]);
        lin64(f, N, VF, W("%smlp.linear_fc2.weight", p), W("%smlp.linear_fc2.bias", p), VH, h);
        for (int64_t i = 0; i < N * VH; i++) x[i] += h[i];
        if (nd < 2 && g_deep[nd] == l) merger64(nd, x, N, deep[nd]), nd++;
    }
    merger64(-1, x, N, emb);
    free(x);
    free(h);
    free(qkv);
    free(o);
    free(f);
    free(px);
    free(ang);
}

/* hidden_states[0..TL] of the prompt with the vision rows, as transformers records them */
static void text64(const int32_t *ids, int64_t n, const int64_t (*pos)[15], const double *emb, double **deep,
                   double **hs) {
    const int QW = TH * TD, KW = TKV * TD;
    double *x = malloc((size_t)n * TC * sizeof *x), *h = malloc((size_t)n * TC * sizeof *h),
           *q = malloc((size_t)n * QW * sizeof *q), *k = malloc((size_t)n * KW * sizeof *k),
           *v = malloc((size_t)n * KW * sizeof *v), *o = malloc((size_t)n * QW * sizeof *o),
           *g = malloc((size_t)n * TF * sizeof *g), *u = malloc((size_t)n * TF * sizeof *u);
    const float *E = W("model.language_model.embed_tokens.weight");
    int64_t vr[16], nv = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] == IMG) {
            vr[nv] = i;
            for (int c = 0; c < TC; c++) x[i * TC + c] = emb[nv * TC + c];
            nv++;
        } else {
            for (int c = 0; c < TC; c++) x[i * TC + c] = E[ids[i] * TC + c];
        }
    }
    memcpy(hs[0], x, (size_t)n * TC * sizeof *x);
    for (int l = 0; l < TL; l++) {
        char p[64];
        snprintf(p, sizeof p, "model.language_model.layers.%d.", l);
        memcpy(h, x, (size_t)n * TC * sizeof *h);
        rms64(h, n, TC, W("%sinput_layernorm.weight", p));
        lin64(h, n, TC, W("%sself_attn.q_proj.weight", p), NULL, QW, q);
        lin64(h, n, TC, W("%sself_attn.k_proj.weight", p), NULL, KW, k);
        lin64(h, n, TC, W("%sself_attn.v_proj.weight", p), NULL, KW, v);
        rms64(q, n * TH, TD, W("%sself_attn.q_norm.weight", p));
        rms64(k, n * TKV, TD, W("%sself_attn.k_norm.weight", p));
        for (int64_t i = 0; i < n; i++) {
            double ang[TD / 2];
            for (int j = 0; j < TD / 2; j++) {
                /* sections [2, 1, 1]: j = 1 -> h, j = 2 -> w, j = 0, 3 -> t */
                const int ax = j == 1 ? 1 : j == 2 ? 2 : 0;
                ang[j] = (double)pos[ax][i] * pow(5e6, -2.0 * j / TD);
            }
            for (int hd = 0; hd < TH; hd++) rope64(&q[i * QW + hd * TD], ang, TD);
            for (int hd = 0; hd < TKV; hd++) rope64(&k[i * KW + hd * TD], ang, TD);
        }
        attn64(q, k, v, o, 0, n, TH, TKV, TD, 1, QW, KW);
        lin64(o, n, QW, W("%sself_attn.o_proj.weight", p), NULL, TC, h);
        for (int64_t i = 0; i < n * TC; i++) x[i] += h[i];
        memcpy(h, x, (size_t)n * TC * sizeof *h);
        rms64(h, n, TC, W("%spost_attention_layernorm.weight", p));
        lin64(h, n, TC, W("%smlp.gate_proj.weight", p), NULL, TF, g);
        lin64(h, n, TC, W("%smlp.up_proj.weight", p), NULL, TF, u);
        for (int64_t i = 0; i < n * TF; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        lin64(g, n, TF, W("%smlp.down_proj.weight", p), NULL, TC, h);
        for (int64_t i = 0; i < n * TC; i++) x[i] += h[i];
        memcpy(hs[l + 1], x, (size_t)n * TC * sizeof *x); /* recorded before the deepstack addition */
        if (l < 2)
            for (int64_t r = 0; r < nv; r++)
                for (int c = 0; c < TC; c++) x[vr[r] * TC + c] += deep[l][r * TC + c];
    }
    /* the last state is after the final norm (of the state with any addition) */
    memcpy(hs[TL], x, (size_t)n * TC * sizeof *x);
    rms64(hs[TL], n, TC, W("model.language_model.norm.weight"));
    free(x);
    free(h);
    free(q);
    free(k);
    free(v);
    free(o);
    free(g);
    free(u);
}

static void test_tiny_model(void) {
    char dir[512];
    t_tmp_path("vision_tiny", dir, sizeof dir);
    build_weights();
    write_model(dir);
    h3_exec ex;
    CHECK_OK(h3_exec_init(&ex, 2));
    h3_text_encoder *te = NULL;
    h3_vision *vis = NULL;
    CHECK_OK(h3_text_encoder_open(dir, NULL, &te));
    CHECK_OK(h3_vision_open(te, NULL, &vis));
    if (!vis) {
        h3_text_encoder_close(te);
        h3_exec_free(&ex);
        return;
    }
    const h3_vis_config *vc = h3_vision_config(vis);
    CHECK(vc->depth == VDEPTH && vc->hidden == VH && vc->n_deep == 2 && vc->deep_idx[1] == 2 &&
              vc->patch == VP,
          "vision config not read from config.json");
    const int64_t N = 24 + 4, M = N / 4;
    h3_tensor px, emb, deep[2];
    CHECK_OK(h3_tensor_alloc2(&px, H3_PLACE_HOST, H3_F32, N, VCOLS, H3_MEM_OTHER));
    t_fill_uniform(px.data, (size_t)(N * VCOLS), -1, 1);
    CHECK_OK(h3_tensor_alloc2(&emb, H3_PLACE_HOST, H3_F32, M, TC, H3_MEM_OTHER));
    for (int k = 0; k < 2; k++)
        CHECK_OK(h3_tensor_alloc2(&deep[k], H3_PLACE_HOST, H3_F32, M, TC, H3_MEM_OTHER));
    /* the tower alone, for one image and for both */
    double *re = malloc((size_t)M * TC * sizeof *re),
           *rd[2] = {malloc((size_t)M * TC * 8), malloc((size_t)M * TC * 8)};
    for (int n_img = 1; n_img <= 2; n_img++) {
        const int64_t Ni = n_img == 1 ? 24 : N, Mi = Ni / 4;
        h3_tensor pxi, ei, di[2];
        CHECK_OK(h3_tensor_narrow(&px, 0, 0, Ni, &pxi));
        CHECK_OK(h3_tensor_narrow(&emb, 0, 0, Mi, &ei));
        for (int k = 0; k < 2; k++) CHECK_OK(h3_tensor_narrow(&deep[k], 0, 0, Mi, &di[k]));
        CHECK_OK(h3_vision_forward(vis, &ex, H3_PLACE_HOST, &pxi, g_grid, n_img, &ei, di));
        vision64(px.data, g_grid, n_img, Ni, re, rd);
        EXPECT_CLOSE(n_img == 1 ? "tower, one image: merger" : "tower, two images: merger", ei.data, re,
                     (size_t)(Mi * TC), 1e-5);
        EXPECT_CLOSE("tower: deepstack 0", di[0].data, rd[0], (size_t)(Mi * TC), 1e-5);
        EXPECT_CLOSE("tower: deepstack 1", di[1].data, rd[1], (size_t)(Mi * TC), 1e-5);
    }
    /* the prompt through the text encoder: every hidden state against the reference */
    double *hs[TL + 1];
    for (int l = 0; l <= TL; l++) hs[l] = malloc((size_t)15 * TC * sizeof(double));
    text64(g_ids, 15, g_pos, re, rd, hs);
    h3_tensor out;
    CHECK_OK(h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, 15, TC, H3_MEM_OTHER));
    for (int l = 0; l <= TL; l++) {
        CHECK_OK(h3_vision_encode_prompt(vis, te, &ex, H3_PLACE_HOST, g_ids, 15, &px, g_grid, 2, l, &out));
        char what[64];
        snprintf(what, sizeof what, "hidden_states[%d] with two images", l);
        EXPECT_CLOSE(what, out.data, hs[l], (size_t)(15 * TC), 1e-4);
    }
    /* a mismatch of tokens and grids is refused before anything runs */
    CHECK_ERR(h3_vision_encode_prompt(vis, te, &ex, H3_PLACE_HOST, g_ids, 15, &px, g_grid, 1, 1, &out),
              H3_ERR_INVALID, "pixel_values must be");
    h3_tensor_free(&out);
    for (int l = 0; l <= TL; l++) free(hs[l]);
    free(re);
    free(rd[0]);
    free(rd[1]);
    h3_tensor_free(&px);
    h3_tensor_free(&emb);
    for (int k = 0; k < 2; k++) h3_tensor_free(&deep[k]);
    h3_vision_close(vis);
    h3_text_encoder_close(te);
    /* files without a config.json */
    char p[512];
    CHECK_OK(h3_text_encoder_open(t_src_path("tests/fixtures/text_encoder/comfy.safetensors", p, sizeof p),
                                  NULL, &te));
    if (te) { /* no config: the release's vision shapes are expected, and this tiny tower is refused in the
                 binder's form */
        CHECK_ERR(h3_vision_open(te, NULL, &vis), H3_ERR_FORMAT, "ViT stem 0 needs [hidden, channels");
        h3_text_encoder_close(te);
    }
    h3_exec_free(&ex);
    for (int i = 0; i < g_nw; i++) {
        h3_free((void *)g_w[i].name);
        h3_free(g_w[i].v);
    }
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"smart_resize", test_smart_resize},
        {"preprocess", test_preprocess},
        {"bad_images", test_bad_images},
        {"rope_index", test_rope_index},
        {"vit_rope", test_vit_rope},
        {"tiny_model", test_tiny_model},
        {NULL, NULL},
    };
    return t_main("vision", cases, argc, argv);
}

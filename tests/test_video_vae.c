/* The video VAE decoder against the fixtures of the PyTorch reference (tools/reference/video_vae.py,
 * float64), in the official, diffusers and ComfyUI layouts; decode memory that does not grow with the number
 * of frames, and the planner's prediction of it; malformed latents and files; allocation failures. (PNG
 * output is tested with the media writer, tests/test_media.c.) */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/json.h"
#include "io/safetensors.h"
#include "models/video_vae.h"
#include "tensor/comm.h"
#include "testutil.h"

static h3_exec g_ex;

static const char *fx(const char *rel, char *buf, size_t n) {
    char r[512];
    snprintf(r, sizeof r, "tests/fixtures/video_vae/%s", rel);
    return t_src_path(r, buf, n);
}

/* A fixture tensor as f32 (owned). */
static h3_status load_f32(const char *path, const char *name, h3_tensor *out) {
    h3_st_set s;
    H3_TRY(h3_st_open(path, &s));
    h3_status st = h3_st_load(&s, name, H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, out);
    h3_st_close(&s);
    return st;
}

static double *to_double(const h3_tensor *t) {
    size_t n = (size_t)h3_tensor_numel(t);
    double *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = ((const float *)t->data)[i];
    return d;
}

static const double k_mean[3] = {0.485, 0.456, 0.406}, k_std[3] = {0.229, 0.224, 0.225};

/* PSNR (dB) of two raw decodes compared as pixels in [0, 1]. */
static double psnr_unit(const float *a, const double *ref, int64_t per_channel, int channels) {
    double se = 0;
    for (int c = 0; c < channels; c++)
        for (int64_t i = 0; i < per_channel; i++) {
            double x = a[c * per_channel + i] * k_std[c] + k_mean[c],
                   y = ref[c * per_channel + i] * k_std[c] + k_mean[c];
            x = x < 0 ? 0 : x > 1 ? 1 : x;
            y = y < 0 ? 0 : y > 1 ? 1 : y;
            se += (x - y) * (x - y);
        }
    double mse = se / (double)(per_channel * channels);
    return mse == 0 ? INFINITY : 10.0 * log10(1.0 / mse);
}

typedef struct {
    const char *name, *model;
    int heads;
} vcase;

/* Every fixture case: decode into a whole-video tensor and compare with the reference (1e-4 relative L2: f32
 * arithmetic against float64 over 2 blocks and one softmax lands near 1e-6). */
static void test_fixtures(void) {
    char path[700], mpath[700];
    fx("cases.json", path, sizeof path);
    json_t *cases = NULL;
    CHECK_OK(h3_json_load_file(path, 1 << 20, &cases));
    if (!cases) return;
    CHECK(json_array_size(cases) >= 6, "cases.json lists %zu cases", json_array_size(cases));
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *name = h3_json_get_str(c, "name"), *model = h3_json_get_str(c, "model");
        int64_t heads = 0;
        h3_json_get_int(c, "heads", &heads);
        char file[256];
        snprintf(file, sizeof file, "case_%s.safetensors", name);
        fx(file, path, sizeof path);
        fx(model, mpath, sizeof mpath);
        h3_video_vae_opts o = {0};
        o.heads = (int)heads;
        h3_video_vae *v = NULL;
        CHECK_OK(h3_video_vae_open(mpath, &o, &v));
        h3_tensor lat = {0}, ref = {0}, out = {0};
        CHECK_OK(load_f32(path, "latents", &lat));
        CHECK_OK(load_f32(path, "frames", &ref));
        if (!v || !lat.data || !ref.data) goto next;
        const h3_video_vae_config *cfg = h3_video_vae_get_config(v);
        CHECK(h3_video_vae_num_frames(cfg, lat.shape[2]) == ref.shape[2],
              "%s: %lld frames predicted, %lld in the "
              "fixture",
              name, (long long)h3_video_vae_num_frames(cfg, lat.shape[2]), (long long)ref.shape[2]);
        CHECK_OK(h3_tensor_alloc(&out, H3_PLACE_HOST, H3_F32, ref.ndim, ref.shape, H3_MEM_OTHER));
        h3_video_decode_out dst = {H3_PIXELS_RAW, NULL, NULL, &out};
        CHECK_OK(h3_video_vae_decode(v, &g_ex, &lat, &dst));
        double *rd = to_double(&ref);
        char what[128];
        snprintf(what, sizeof what, "%s (%s layout) frames", name, h3_layout_name(h3_video_vae_layout(v)));
        double e = EXPECT_CLOSE(what, out.data, rd, (size_t)h3_tensor_numel(&ref), 1e-4);
        int64_t pc = h3_tensor_numel(&ref) / ref.shape[1];
        double ps = psnr_unit(out.data, rd, pc, (int)ref.shape[1]);
        t_note("  %-18s %-9s latents [%lld, %lld, %lld, %lld] -> %lld frames %lld×%lld: rel err %.2e, PSNR "
               "%.1f dB",
               name, h3_layout_name(h3_video_vae_layout(v)), (long long)lat.shape[1], (long long)lat.shape[2],
               (long long)lat.shape[3], (long long)lat.shape[4], (long long)ref.shape[2],
               (long long)ref.shape[3], (long long)ref.shape[4], e, ps);
        CHECK(ps > 80.0, "%s: PSNR %.1f dB", name, ps);
        free(rd);
    next:
        h3_tensor_free(&lat);
        h3_tensor_free(&ref);
        h3_tensor_free(&out);
        h3_video_vae_close(v);
    }
    json_decref(cases);
}

/* How a run places the decoder on the CPU: from the file (the default) or packed as a device gets it (its
 * blocks resident, or streamed through a slot and converted as acquired), in tiles per pass and FFN row
 * steps. */
typedef struct {
    const char *name;
    int packed, tile_batch, rows_per_step, stream_blocks;
} vrun;

static const vrun k_runs[] = {
    {"file, 1 tile per pass", 0, 1, 0, 0},
    {"file, 2 tiles per pass, 7-row steps", 0, 2, 7, 0},
    {"file, 3 tiles per pass", 0, 3, 0, 0},
    {"file, all tiles per pass", 0, 1000, 0, 0},
    {"packed, resident", 1, 0, 0, 0},
    {"packed, all streamed, 2 tiles per pass", 1, 2, 0, 1000},
    {"packed, 1 streamed, 5-row steps", 1, 0, 5, 1},
};

/* Every fixture case under every run of the table: the batched tiles, the row steps across tile boundaries,
 * the packed layouts (the QKV rows reordered per head, diffusers' three projections stacked, f16 converted)
 * and the streamed blocks' conversions give the reference's frames (1e-4), as the plain decode does. */
static void test_runs(void) {
    char path[700], mpath[700];
    fx("cases.json", path, sizeof path);
    json_t *cases = NULL;
    CHECK_OK(h3_json_load_file(path, 1 << 20, &cases));
    if (!cases) return;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *cj = json_array_get(cases, i);
        const char *name = h3_json_get_str(cj, "name"), *model = h3_json_get_str(cj, "model");
        int64_t heads = 0;
        h3_json_get_int(cj, "heads", &heads);
        char file[256];
        snprintf(file, sizeof file, "case_%s.safetensors", name);
        fx(file, path, sizeof path);
        fx(model, mpath, sizeof mpath);
        h3_video_vae_opts o = {0};
        o.heads = (int)heads;
        h3_video_vae *v = NULL;
        h3_tensor lat = {0}, ref = {0}, out = {0};
        CHECK_OK(h3_video_vae_open(mpath, &o, &v));
        CHECK_OK(load_f32(path, "latents", &lat));
        CHECK_OK(load_f32(path, "frames", &ref));
        if (!v || !lat.data || !ref.data) goto next;
        const int L = h3_video_vae_get_config(v)->num_layers;
        double *rd = to_double(&ref);
        CHECK_OK(h3_tensor_alloc(&out, H3_PLACE_HOST, H3_F32, ref.ndim, ref.shape, H3_MEM_OTHER));
        for (size_t k = 0; k < sizeof k_runs / sizeof k_runs[0]; k++) {
            const vrun *vr = &k_runs[k];
            h3_video_vae_run run;
            memset(&run, 0, sizeof run);
            run.place = H3_PLACE_HOST;
            run.packed = vr->packed;
            run.threads = 2;
            run.tile_batch = vr->tile_batch;
            run.rows_per_step = vr->rows_per_step;
            run.stream_blocks = vr->stream_blocks;
            h3_video_vae_mem m;
            CHECK_OK(h3_video_vae_plan(v, lat.shape[2], lat.shape[3], lat.shape[4], &run, &m));
            const int want_res = !vr->packed ? L : vr->stream_blocks >= L ? 0 : L - vr->stream_blocks;
            CHECK(m.n_resident == want_res && m.packed == vr->packed, "%s, %s: %d resident (want %d)", name,
                  vr->name, m.n_resident, want_res);
            CHECK_OK(h3_video_vae_place(v, &g_ex, &m, NULL));
            memset(out.data, 0, h3_tensor_nbytes(&out));
            h3_video_decode_out dst = {H3_PIXELS_RAW, NULL, NULL, &out};
            CHECK_OK(h3_video_vae_decode(v, &g_ex, &lat, &dst));
            char what[200];
            snprintf(what, sizeof what, "%s, %s (%d tiles per pass of %d, %lld-row steps)", name, vr->name,
                     m.tile_batch, m.tiles_x * m.tiles_y, (long long)m.rows_per_step);
            double e = EXPECT_CLOSE(what, out.data, rd, (size_t)h3_tensor_numel(&ref), 1e-4);
            t_note("  %-60s rel err %.2e", what, e);
        }
        free(rd);
    next:
        h3_tensor_free(&lat);
        h3_tensor_free(&ref);
        h3_tensor_free(&out);
        h3_video_vae_close(v);
    }
    json_decref(cases);
}

/* Placement errors: a plan for other latents, a device plan without a device, a decoder made without weights
 * decoding unplaced; and that decoder placed with random weights on the host decodes finite frames the same
 * way twice. */
static void test_place_errors(void) {
    char p[700];
    fx("official", p, sizeof p);
    h3_video_vae *v = NULL;
    CHECK_OK(h3_video_vae_open(p, NULL, &v));
    if (!v) return;
    h3_video_vae_run run;
    memset(&run, 0, sizeof run);
    run.place = H3_PLACE_HOST;
    run.packed = 1;
    h3_video_vae_mem m;
    CHECK_OK(h3_video_vae_plan(v, 7, 4, 6, &run, &m));
    CHECK_OK(h3_video_vae_place(v, &g_ex, &m, NULL));
    int64_t s[4] = {24, 7, 4, 8}, os[4] = {3, 22, 8, 16};
    h3_tensor z, y;
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 4, s, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&y, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
    h3_video_decode_out dst = {H3_PIXELS_RAW, NULL, NULL, &y};
    CHECK_ERR(h3_video_vae_decode(v, &g_ex, &z, &dst), H3_ERR_INVALID,
              "placed for 4 × 6 latents, these are 4 × 8");
    h3_video_vae_unplace(v);
    CHECK(h3_video_vae_placement(v) == NULL, "unplaced");
    CHECK_OK(h3_video_vae_decode(v, &g_ex, &z, &dst)); /* the host, from the file, again */
    run.place = H3_PLACE_DEVICE;
    CHECK_OK(h3_video_vae_plan(v, 7, 4, 8, &run, &m)); /* planning needs no device */
    CHECK(m.dev_backend > 0 && m.dev_peak > m.dev_arena, "a device plan counts the backend and the weights");
    CHECK_ERR(h3_video_vae_place(v, &g_ex, &m, NULL), H3_ERR_INVALID, "needs an exec with a device");
    h3_video_vae_config c = *h3_video_vae_get_config(v);
    h3_video_vae_close(v);
    h3_video_vae *g = NULL;
    CHECK_OK(h3_video_vae_create(&c, &g));
    if (g) {
        CHECK_ERR(h3_video_vae_decode(g, &g_ex, &z, &dst), H3_ERR_INVALID, "created without weights");
        run.place = H3_PLACE_HOST;
        CHECK_ERR(h3_video_vae_plan(g, 7, 4, 8, &run, &m), H3_ERR_INVALID, "random seed");
        run.random_seed = 7;
        run.stream_blocks = 1;
        CHECK_OK(h3_video_vae_plan(g, 7, 4, 8, &run, &m));
        CHECK(m.n_resident == c.num_layers - 1, "one block streamed: %d resident", m.n_resident);
        CHECK_OK(h3_video_vae_place(g, &g_ex, &m, NULL));
        h3_tensor y2;
        CHECK_OK(h3_tensor_alloc(&y2, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
        h3_video_decode_out d2 = {H3_PIXELS_RAW, NULL, NULL, &y2};
        CHECK_OK(h3_video_vae_decode(g, &g_ex, &z, &dst));
        CHECK_OK(h3_video_vae_decode(g, &g_ex, &z, &d2));
        int64_t bad = 0, n = h3_tensor_numel(&y);
        for (int64_t i = 0; i < n; i++) bad += !isfinite(((float *)y.data)[i]);
        CHECK(bad == 0, "%lld of %lld random-weight frame values are not finite", (long long)bad,
              (long long)n);
        CHECK(memcmp(y.data, y2.data, h3_tensor_nbytes(&y)) == 0, "two decodes with random weights differ");
        h3_tensor_free(&y2);
        h3_video_vae_close(g);
    }
    h3_tensor_free(&z);
    h3_tensor_free(&y);
}

/* A device placement with every block resident on a stand-in device (t_standin_begin: no CUDA queues needed):
 * the device bytes it takes while loading (the blocks as placed and the load buffer their tensors convert
 * through) and after (the blocks) equal the plan's, for every layout (official f32 with per-head QKV rows,
 * diffusers' three projections joined, ComfyUI f16) and for random weights; unplacing gives them back. */
static void test_standin_place(void) {
    if (!t_standin_begin(&g_ex)) {
        t_note("  skipped: a device backend is active");
        return;
    }
    static const char *const models[] = {"official", "diffusers", "comfy.safetensors", NULL};
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        char p[700];
        h3_video_vae *v = NULL;
        h3_video_vae_opts o = {0};
        o.heads = 2;
        h3_video_vae_run run;
        memset(&run, 0, sizeof run);
        run.place = H3_PLACE_DEVICE;
        if (models[k]) {
            CHECK_OK(h3_video_vae_open(fx(models[k], p, sizeof p), k == 2 ? &o : NULL, &v));
        } else {
            h3_video_vae_config c;
            h3_video_vae_default_config(&c);
            c.num_layers = 2, c.heads = 2, c.head_dim = 64, c.ffn_inner = 256;
            CHECK_OK(h3_video_vae_create(&c, &v));
            run.random_seed = 3;
        }
        if (!v) continue;
        h3_video_vae_mem m;
        CHECK_OK(h3_video_vae_plan(v, 7, 4, 6, &run, &m));
        CHECK(m.n_resident == m.n_blocks && m.dev_slots == 0, "%s: every block resident",
              models[k] ? models[k] : "random");
        t_sd_used = t_sd_peak = 0;
        CHECK_OK(h3_video_vae_place(v, &g_ex, &m, NULL));
        const int64_t want_peak = m.dev_weights + m.dev_load;
        t_note("  %-18s stand-in device: placing peaked at %lld bytes, holds %lld; plan: weights %lld + load "
               "buffer %lld",
               models[k] ? models[k] : "random weights", (long long)t_sd_peak, (long long)t_sd_used,
               (long long)m.dev_weights, (long long)m.dev_load);
        CHECK(t_sd_peak == want_peak && t_sd_used == m.dev_weights,
              "%s: placing peaked at %lld and holds %lld; the plan says %lld and %lld",
              models[k] ? models[k] : "random", (long long)t_sd_peak, (long long)t_sd_used,
              (long long)want_peak, (long long)m.dev_weights);
        CHECK(models[k] ? m.dev_load > 0 : m.dev_load == 0, "a load buffer exactly when the weights convert");
        h3_video_vae_unplace(v);
        CHECK(t_sd_used == 0, "%lld device bytes left after unplacing", (long long)t_sd_used);
        h3_video_vae_close(v);
    }
    t_standin_end(&g_ex);
}

typedef struct {
    int64_t next, calls, channels, H, W;
    float *all; /* optional copy of everything received, [oc, F, H, W] */
    int64_t F;
} recv_ctx;

static h3_status receive(void *user, const h3_tensor *f, int64_t first) {
    recv_ctx *r = user;
    CHECK(first == r->next, "frames arrive in order: got %lld, expected %lld", (long long)first,
          (long long)r->next);
    CHECK(f->ndim == 4 && f->shape[0] == r->channels && f->shape[2] == r->H && f->shape[3] == r->W,
          "frame shape");
    if (r->all)
        for (int64_t c = 0; c < f->shape[0]; c++)
            for (int64_t k = 0; k < f->shape[1]; k++)
                memcpy(r->all + ((c * r->F + first + k) * r->H) * r->W,
                       (const float *)f->data + c * f->stride[0] + k * f->stride[1],
                       (size_t)(r->H * r->W) * 4);
    r->next = first + f->shape[1];
    r->calls++;
    return H3_OK;
}

/* The callback path delivers the same frames as the whole-tensor path, in [0, 1] when asked; ImageNet
 * de-normalization and clamping checked against the test's own float64 conversion of the reference. */
static void test_callback_and_unit_range(void) {
    char path[700], mpath[700];
    fx("case_official_chunks.safetensors", path, sizeof path);
    fx("official", mpath, sizeof mpath);
    h3_video_vae *v = NULL;
    h3_tensor lat = {0}, ref = {0};
    CHECK_OK(h3_video_vae_open(mpath, NULL, &v));
    CHECK_OK(load_f32(path, "latents", &lat));
    CHECK_OK(load_f32(path, "frames", &ref));
    if (!v || !lat.data || !ref.data) goto done;
    int64_t F = ref.shape[2], H = ref.shape[3], W = ref.shape[4], n = h3_tensor_numel(&ref);
    recv_ctx rc = {0, 0, 3, H, W, malloc((size_t)n * 4), F};
    h3_video_decode_out dst = {H3_PIXELS_UNIT, receive, &rc, NULL};
    CHECK_OK(h3_video_vae_decode(v, &g_ex, &lat, &dst));
    CHECK(rc.next == F, "%lld frames received, %lld expected", (long long)rc.next, (long long)F);
    CHECK(rc.calls == 3, "2 chunks and the final look-ahead arrive in %lld calls, expected 3",
          (long long)rc.calls);
    double *u = malloc((size_t)n * sizeof *u);
    for (int64_t c = 0; c < 3; c++)
        for (int64_t i = 0; i < n / 3; i++) {
            double x = ((float *)ref.data)[c * (n / 3) + i] * k_std[c] + k_mean[c];
            u[c * (n / 3) + i] = x < 0 ? 0 : x > 1 ? 1 : x;
        }
    EXPECT_CLOSE("frames in [0, 1] through the callback", rc.all, u, (size_t)n, 1e-4);
    float lo = 1, hi = 0;
    for (int64_t i = 0; i < n; i++)
        lo = rc.all[i] < lo ? rc.all[i] : lo, hi = rc.all[i] > hi ? rc.all[i] : hi;
    CHECK(lo >= 0.0f && hi <= 1.0f && lo == 0.0f && hi == 1.0f,
          "unit range [%g, %g] (the fixture saturates both ends)", lo, hi);
    free(u);
    free(rc.all);
done:
    h3_tensor_free(&lat);
    h3_tensor_free(&ref);
    h3_video_vae_close(v);
}

/* The same weights in the official (fused, interleaved QKV) and diffusers (split QKV, swapped FFN halves)
 * layouts decode the same latents alike, and forcing the official file's tiles onto the diffusers one as
 * well. */
static void test_layouts_agree(void) {
    char p1[700], p2[700];
    fx("official", p1, sizeof p1);
    fx("diffusers", p2, sizeof p2);
    h3_video_vae_opts o2 = {0};
    o2.tile_size = 16;
    o2.tile_overlap_min = 4;
    h3_video_vae *a = NULL, *b = NULL;
    CHECK_OK(h3_video_vae_open(p1, NULL, &a));
    CHECK_OK(h3_video_vae_open(p2, &o2, &b));
    if (!a || !b) goto done;
    CHECK(h3_video_vae_layout(a) == H3_LAYOUT_OFFICIAL && h3_video_vae_layout(b) == H3_LAYOUT_DIFFUSERS,
          "layouts");
    CHECK(h3_video_vae_get_config(a)->fused_qkv && !h3_video_vae_get_config(b)->fused_qkv, "QKV forms");
    int64_t s[5] = {1, 24, 7, 6, 10};
    h3_tensor z, ya, yb;
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 5, s, H3_MEM_OTHER));
    t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
    int64_t F = h3_video_vae_num_frames(h3_video_vae_get_config(a), 7), os[4] = {3, F, 12, 20};
    CHECK_OK(h3_tensor_alloc(&ya, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&yb, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    h3_video_decode_out da = {H3_PIXELS_RAW, NULL, NULL, &ya}, db = {H3_PIXELS_RAW, NULL, NULL, &yb};
    CHECK_OK(h3_video_vae_decode(a, &g_ex, &z, &da));
    CHECK_OK(h3_video_vae_decode(b, &g_ex, &z, &db));
    double *r = to_double(&ya);
    EXPECT_CLOSE("diffusers layout vs official layout", yb.data, r, (size_t)h3_tensor_numel(&ya), 1e-5);
    for (size_t k = 0; k < sizeof k_runs / sizeof k_runs[0]; k++) { /* diffusers' three projections, placed */
        h3_video_vae_run run;
        memset(&run, 0, sizeof run);
        run.packed = k_runs[k].packed;
        run.tile_batch = k_runs[k].tile_batch;
        run.rows_per_step = k_runs[k].rows_per_step;
        run.stream_blocks = k_runs[k].stream_blocks;
        h3_video_vae_mem m;
        CHECK_OK(h3_video_vae_plan(b, 7, 6, 10, &run, &m));
        CHECK_OK(h3_video_vae_place(b, &g_ex, &m, NULL));
        CHECK_OK(h3_video_vae_decode(b, &g_ex, &z, &db));
        char what[160];
        snprintf(what, sizeof what, "diffusers layout, %s, vs official layout", k_runs[k].name);
        EXPECT_CLOSE(what, yb.data, r, (size_t)h3_tensor_numel(&ya), 1e-5);
    }
    free(r);
    h3_tensor_free(&z);
    h3_tensor_free(&ya);
    h3_tensor_free(&yb);
done:
    h3_video_vae_close(a);
    h3_video_vae_close(b);
}

/* 5n+2 latent frames -> 17n+5 frames; the short cases as ComfyUI decodes them; padded lengths. */
static void test_frame_counts(void) {
    h3_video_vae_config c;
    h3_video_vae_default_config(&c);
    for (int n = 0; n < 30; n++)
        CHECK(h3_video_vae_num_frames(&c, 5 * n + 2) == 17 * n + 5, "T = %d", 5 * n + 2);
    CHECK(h3_video_vae_num_frames(&c, 37) == 124 && h3_video_vae_num_frames(&c, 102) == 345,
          "124 and 345 frames");
    CHECK(h3_video_vae_num_frames(&c, 1) == 1, "an image");
    CHECK(h3_video_vae_num_frames(&c, 0) == 0, "nothing");
    /* padded: T = 9 decodes 12 latent frames (3 repeated) and cuts 4 + 1 + 4 frames */
    CHECK(h3_video_vae_num_frames(&c, 9) == 30, "T = 9 -> %lld", (long long)h3_video_vae_num_frames(&c, 9));
    int64_t prev = 0;
    for (int T = 2; T < 60; T++) {
        int64_t f = h3_video_vae_num_frames(&c, T);
        CHECK(f > prev, "frames grow with T (T = %d: %lld after %lld)", T, (long long)f, (long long)prev);
        prev = f;
    }
}

/* Measured peak of a decode (bytes beyond what was allocated before it). */
static int64_t measure(h3_video_vae *v, const h3_tensor *z, int64_t *frames) {
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    int off = z->ndim == 5;
    recv_ctx rc = {
        0, 0, c->out_channels, z->shape[off + 2] * c->patch_size, z->shape[off + 3] * c->patch_size, NULL, 0};
    h3_video_decode_out dst = {H3_PIXELS_UNIT, receive, &rc, NULL};
    h3_mem_stats a, b;
    h3_mem_get_stats(&a);
    h3_mem_reset_peaks();
    CHECK_OK(h3_video_vae_decode(v, &g_ex, z, &dst));
    h3_mem_get_stats(&b);
    CHECK(b.total_current == a.total_current, "the decode leaked %lld bytes",
          (long long)(b.total_current - a.total_current));
    *frames = rc.next;
    return b.total_peak - a.total_current;
}

/* The check: 22 and 107 latent frames (73 and 362 frames) decode with the same peak, and the planner
 * predicts it. Reduced decoder, 2 × 3 tiles per chunk. */
static void test_memory_bounded(void) {
    char p[700];
    fx("official", p, sizeof p);
    h3_video_vae *v = NULL;
    CHECK_OK(h3_video_vae_open(p, NULL, &v));
    if (!v) return;
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    int64_t Ts[2] = {22, 107}, peak[2] = {0, 0}, pred[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        int64_t s[4] = {24, Ts[i], 10, 16}, frames = 0;
        h3_tensor z;
        CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 4, s, H3_MEM_OTHER));
        t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
        peak[i] = measure(v, &z, &frames);
        h3_video_vae_mem m;
        CHECK_OK(h3_video_vae_decode_peak(c, Ts[i], 10, 16, h3_pool_threads(g_ex.pool), 0, &m));
        pred[i] = m.total;
        CHECK(frames == m.frames && frames == 17 * ((Ts[i] - 2) / 5) + 5, "%lld frames decoded, %lld planned",
              (long long)frames, (long long)m.frames);
        t_note("  %3lld latent frames -> %3lld frames in %d chunks of %d × %d tiles: peak %lld bytes "
               "measured, %lld "
               "predicted (chunk buffers %lld, ViT %lld, op scratch %lld)",
               (long long)Ts[i], (long long)frames, m.chunks, m.tiles_y, m.tiles_x, (long long)peak[i],
               (long long)pred[i], (long long)m.chunk_buffers, (long long)m.vit, (long long)m.op_scratch);
        CHECK(llabs(peak[i] - pred[i]) <= pred[i] / 50,
              "predicted %lld vs measured %lld differ by more than 2%%", (long long)pred[i],
              (long long)peak[i]);
        h3_tensor_free(&z);
    }
    CHECK(llabs(peak[1] - peak[0]) <= peak[0] / 50, "peak grew with frames: %lld -> %lld bytes",
          (long long)peak[0], (long long)peak[1]);
    CHECK(pred[0] == pred[1], "the plan's peak depends on frame count: %lld vs %lld", (long long)pred[0],
          (long long)pred[1]);
    h3_video_vae_close(v);

    /* The released decoder, planned (not run): the same for 5 s and 15 s, and its size at two canvases. */
    h3_video_vae_config r;
    h3_video_vae_default_config(&r);
    h3_video_vae_mem a, b, d;
    CHECK_OK(h3_video_vae_decode_peak(&r, 37, 48, 84, 16, 0, &a));
    CHECK_OK(h3_video_vae_decode_peak(&r, 102, 48, 84, 16, 0, &b));
    CHECK_OK(h3_video_vae_decode_peak(&r, 37, 34, 60, 16, 0, &d));
    CHECK(a.total == b.total, "released decoder: 124 and 345 frames plan %lld and %lld bytes",
          (long long)a.total, (long long)b.total);
    CHECK(a.tiles_y == 4 && a.tiles_x == 7 && a.chunks == 7 && b.chunks == 20,
          "1344×768: %d×%d tiles, %d chunks", a.tiles_y, a.tiles_x, a.chunks);
    t_note("  released decoder, 16 threads, f32 weights: 1344×768 %.1f MiB (%d×%d tiles of %lld tokens), "
           "960×544 %.1f "
           "MiB, for any frame count",
           a.total / 1048576.0, a.tiles_y, a.tiles_x, (long long)a.tokens_per_tile, d.total / 1048576.0);
}

/* ---- the decode split over ranks (threads and the in-process group)
 * ---------------------------------------- */

typedef struct {
    const char *model;
    const h3_tensor *lat; /* this rank's latents */
    h3_comm *comm;
    h3_video_decode_out *out; /* rank 0's; NULL for the others */
    h3_exec *ex;
    h3_status st;
    char msg[512];
} split_rank;

static void *split_rank_main(void *arg) {
    split_rank *a = arg;
    h3_video_vae *v = NULL;
    a->st = h3_video_vae_open(a->model, NULL, &v);
    if (a->st == H3_OK) a->st = h3_video_vae_decode_split(v, a->ex, a->lat, a->out, a->comm);
    if (a->st != H3_OK) snprintf(a->msg, sizeof a->msg, "%s", h3_last_error());
    h3_video_vae_close(v);
    return NULL;
}

/* Decodes lat over n ranks (threads, each its own decoder and exec); rank `bad` (>= 0) gets bad_lat instead.
 * The frames land in out (rank 0's); st[r] each rank's status. */
static void run_split(const char *model, int n, const h3_tensor *lat, int bad, const h3_tensor *bad_lat,
                      h3_tensor *out, h3_status *st, char (*msg)[512]) {
    h3_comm ranks[4];
    split_rank a[4];
    pthread_t th[4];
    h3_exec ex[4];
    h3_video_decode_out dst = {H3_PIXELS_UNIT, NULL, NULL, out};
    CHECK_OK(h3_comm_local_create(n, ranks));
    for (int r = 0; r < n; r++) /* before any rank runs: an exec sets the BLAS threads, a global */
        CHECK_OK(h3_exec_init(&ex[r], 1)); /* one thread: OpenBLAS sums alike whoever calls it */
    for (int r = 0; r < n; r++) {
        a[r] = (split_rank){model, r == bad ? bad_lat : lat, &ranks[r], r ? NULL : &dst, &ex[r], H3_OK, ""};
        CHECK(pthread_create(&th[r], NULL, split_rank_main, &a[r]) == 0, "rank %d's thread", r);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        st[r] = a[r].st;
        snprintf(msg[r], sizeof msg[r], "%s", a[r].msg);
        h3_exec_free(&ex[r]);
    }
    h3_comm_local_destroy(ranks, n);
}

/* The decode split over 2 and 3 ranks hands out exactly the unsplit decode's frames (5 chunks: rounds with a
 * rank idle, canvases that cross-fade across ranks); a rank whose latents are refused stops the others with
 * an error instead of leaving them waiting. */
static void test_split(void) {
    char mp[700];
    fx("official", mp, sizeof mp);
    h3_video_vae *v = NULL;
    CHECK_OK(h3_video_vae_open(mp, NULL, &v));
    if (!v) return;
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    const int64_t T = 27, s[4] = {24, T, 4, 16};
    h3_tensor z = {0}, ref = {0}, got = {0}, bad = {0};
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 4, s, H3_MEM_OTHER));
    const int64_t sb[4] = {24, T, 5, 16}; /* odd height: refused */
    CHECK_OK(h3_tensor_alloc(&bad, H3_PLACE_HOST, H3_F32, 4, sb, H3_MEM_OTHER));
    t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
    const int64_t F = h3_video_vae_num_frames(c, T),
                  os[4] = {c->out_channels, F, 4 * c->patch_size, 16 * c->patch_size};
    CHECK_OK(h3_tensor_alloc(&ref, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&got, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    h3_video_decode_out dst = {H3_PIXELS_UNIT, NULL, NULL, &ref};
    h3_exec one; /* the ranks' threads run one-threaded (OpenBLAS's threads would split sums as its callers
                    allow) */
    CHECK_OK(h3_exec_init(&one, 1));
    CHECK_OK(h3_video_vae_decode(v, &one, &z, &dst));
    h3_exec_free(&one);
    h3_video_vae_mem m;
    CHECK_OK(h3_video_vae_decode_peak(c, T, 4, 16, 1, 0, &m));
    CHECK(m.chunks == 5, "%d chunks", m.chunks);
    for (int n = 2; n <= 3; n++) {
        h3_status st[4];
        char msg[4][512];
        memset(got.data, 0xff, (size_t)h3_tensor_numel(&got) * 4); /* NaN: a frame not handed out shows */
        run_split(mp, n, &z, -1, NULL, &got, st, msg);
        for (int r = 0; r < n; r++) CHECK(st[r] == H3_OK, "%d ranks: rank %d: %s", n, r, msg[r]);
        const int same = !memcmp(got.data, ref.data, (size_t)h3_tensor_numel(&ref) * 4);
        int64_t first_diff = -1;
        for (int64_t i = 0; i < h3_tensor_numel(&ref) && first_diff < 0; i++)
            if (((float *)got.data)[i] != ((float *)ref.data)[i]) first_diff = i;
        CHECK(same, "%d ranks: the frames differ from the unsplit decode's (first at value %lld: %g, not %g)",
              n, (long long)first_diff, first_diff >= 0 ? ((float *)got.data)[first_diff] : 0.0,
              first_diff >= 0 ? ((float *)ref.data)[first_diff] : 0.0);
        if (same)
            t_note("  %d ranks: %lld frames of %d chunks equal the unsplit decode's", n, (long long)F,
                   m.chunks);
    }
    for (int who = 0; who < 2; who++) { /* rank 1, then rank 0, refuses its latents */
        h3_status st[4];
        char msg[4][512];
        run_split(mp, 2, &z, who ? 0 : 1, &bad, &got, st, msg);
        const int b = who ? 0 : 1, o = 1 - b;
        CHECK(st[b] == H3_ERR_INVALID && strstr(msg[b], "even"), "the refusing rank %d: %d %s", b, st[b],
              msg[b]);
        CHECK(st[o] == H3_ERR_INTERRUPTED, "rank %d after rank %d refused: %d %s", o, b, st[o], msg[o]);
    }
    h3_tensor_free(&z);
    h3_tensor_free(&bad);
    h3_tensor_free(&ref);
    h3_tensor_free(&got);
    h3_video_vae_close(v);
    h3_exec_free(&g_ex); /* the others' threads again (BLAS's count is global) */
    CHECK_OK(h3_exec_init(&g_ex, 2));
}

static void expect_latents_error(const h3_video_vae_config *c, int nd, const int64_t *s, h3_dtype dt,
                                 const char *needle) {
    h3_tensor z;
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, dt, nd, s, H3_MEM_OTHER));
    CHECK_ERR(h3_video_vae_check_latents(c, &z), H3_ERR_INVALID, needle);
    h3_tensor_free(&z);
}

static void test_malformed_latents(void) {
    char p[700];
    fx("official", p, sizeof p);
    h3_video_vae *v = NULL;
    CHECK_OK(h3_video_vae_open(p, NULL, &v));
    if (!v) return;
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    int64_t s1[5] = {1, 16, 7, 4, 4}, s2[5] = {1, 24, 7, 45, 84}, s3[4] = {24, 7, 4, 5}, s4[3] = {24, 7, 4},
            s5[5] = {2, 24, 7, 4, 4}, s6[4] = {24, 7, 4, 4};
    expect_latents_error(c, 5, s1, H3_F32, "have 16 channels; this video VAE takes 24");
    expect_latents_error(c, 5, s2, H3_F32, "45 × 84: height and width must be even");
    expect_latents_error(c, 4, s3, H3_F32, "must be even");
    expect_latents_error(c, 3, s4, H3_F32, "[C, T, H, W] or [1, C, T, H, W]");
    expect_latents_error(c, 5, s5, H3_F32, "(one video)");
    expect_latents_error(c, 4, s6, H3_F16, "f32");
    /* the decode itself refuses them too, and an output of the wrong shape */
    h3_tensor z, o;
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 5, s1, H3_MEM_OTHER));
    h3_video_decode_out dst = {H3_PIXELS_RAW, NULL, NULL, &z};
    CHECK_ERR(h3_video_vae_decode(v, &g_ex, &z, &dst), H3_ERR_INVALID, "16 channels");
    h3_tensor_free(&z);
    int64_t ok[4] = {24, 7, 4, 4}, bad[4] = {3, 21, 8, 8};
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 4, ok, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&o, H3_PLACE_HOST, H3_F32, 4, bad, H3_MEM_OTHER));
    memset(z.data, 0, (size_t)h3_tensor_nbytes(&z));
    h3_video_decode_out d2 = {H3_PIXELS_RAW, NULL, NULL, &o}, d3 = {H3_PIXELS_RAW, NULL, NULL, NULL};
    CHECK_ERR(h3_video_vae_decode(v, &g_ex, &z, &d2), H3_ERR_INVALID, "[3, 22, 8, 8]");
    CHECK_ERR(h3_video_vae_decode(v, &g_ex, &z, &d3), H3_ERR_INVALID, "callback");
    h3_tensor_free(&z);
    h3_tensor_free(&o);
    h3_video_vae_close(v);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Files that are not a usable video VAE: each a clear error, nothing leaked. */
static void test_bad_files(void) {
    char dir[600], p[800], src[700];
    t_tmp_path("vvae-bad", dir, sizeof dir);
    mkdir(dir, 0755);
    h3_video_vae *v = NULL;
    CHECK_ERR(h3_video_vae_open("/nonexistent/video_vae", NULL, &v), H3_ERR_NOT_FOUND, "no such file");
    CHECK_ERR(h3_video_vae_open(dir, NULL, &v), H3_ERR_NOT_FOUND, "no video VAE here");
    /* an official folder whose config lacks the latents statistics */
    snprintf(p, sizeof p, "%s/official", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/official/source", dir);
    mkdir(p, 0755);
    const char *copies[2] = {"official/config.json", "official/source/config.json"};
    for (int i = 0; i < 2; i++) {
        fx(copies[i], src, sizeof src);
        char *text = NULL;
        size_t len;
        CHECK_OK(h3_read_file(src, 1 << 20, &text, &len));
        snprintf(p, sizeof p, "%s/%s", dir, copies[i]);
        if (text) write_text(p, text);
        h3_free(text);
    }
    /* its weights: the fixture's, less one tensor, then with a wrong shape */
    h3_st_set s;
    fx("official/source/model.safetensors", src, sizeof src);
    CHECK_OK(h3_st_open(src, &s));
    for (int round = 0; round < 3 && s.entries; round++) {
        h3_st_writer *w = NULL;
        CHECK_OK(h3_st_writer_new(&w));
        h3_tensor keep[256];
        int nk = 0;
        for (int64_t i = 0; i < s.n_entries && nk < 256; i++) {
            const char *n = s.entries[i].name;
            if (round == 0 && strcmp(n, "decoder.transformer_blocks.1.ff.w2.bias") == 0) continue;
            CHECK_OK(h3_st_tensor(&s, &s.entries[i], &keep[nk]));
            if (round == 1 && strcmp(n, "decoder.transformer_blocks.0.attn.to_out.weight") ==
                                  0) { /* [32, 32] stored as [16, 64] */
                int64_t sh[2] = {16, 64};
                CHECK_OK(h3_st_writer_add(w, n, H3_F32, 2, sh, keep[nk].data));
            } else {
                CHECK_OK(h3_st_writer_add_tensor(w, n, &keep[nk]));
            }
            nk++;
        }
        snprintf(p, sizeof p, "%s/official/source/model.safetensors", dir);
        CHECK_OK(h3_st_writer_write(w, p, 0));
        h3_st_writer_free(w);
        for (int i = 0; i < nk; i++) h3_tensor_free(&keep[i]);
        if (round == 2) { /* the weights are fine again; the config lacks the latents statistics */
            snprintf(p, sizeof p, "%s/official/config.json", dir);
            write_text(p, "{\"source_path\": \"source\", \"source_safetensors_path\": \"model.safetensors\", "
                          "\"latents_mean\": [0, 1]}");
        }
        snprintf(p, sizeof p, "%s/official", dir);
        h3_mem_stats a, b;
        h3_mem_get_stats(&a);
        if (round == 0)
            CHECK_ERR(h3_video_vae_open(p, NULL, &v), H3_ERR_FORMAT,
                      "'decoder.transformer_blocks.1.ff.w2.bias' is missing");
        if (round == 1)
            CHECK_ERR(h3_video_vae_open(p, NULL, &v), H3_ERR_FORMAT,
                      "has shape [16, 64]; ViT block 0 needs [hidden, heads·head_dim] = [32, 32]");
        if (round == 2)
            CHECK_ERR(h3_video_vae_open(p, NULL, &v), H3_ERR_FORMAT,
                      "\"latents_mean\" must be a list of 24 numbers");
        CHECK(v == NULL, "no handle on failure");
        h3_mem_get_stats(&b);
        CHECK(a.total_current == b.total_current, "round %d leaked %lld bytes", round,
              (long long)(b.total_current - a.total_current));
    }
    h3_st_close(&s);
    /* a config that promises more blocks than the weights hold */
    for (int i = 0; i < 2; i++) {
        fx(copies[i], src, sizeof src);
        char *text = NULL;
        size_t len;
        CHECK_OK(h3_read_file(src, 1 << 20, &text, &len));
        char *at = text ? strstr(text, "\"num_layers\": 2") : NULL;
        if (at) at[strlen("\"num_layers\": ")] = '3';
        CHECK(i == 0 || at, "the fixture's source config names num_layers");
        snprintf(p, sizeof p, "%s/%s", dir, copies[i]);
        if (text) write_text(p, text);
        h3_free(text);
    }
    snprintf(p, sizeof p, "%s/official", dir);
    CHECK_ERR(h3_video_vae_open(p, NULL, &v), H3_ERR_FORMAT,
              "the config says 3 ViT blocks, the weights hold 2");
    /* bad tiling options */
    fx("official", p, sizeof p);
    h3_video_vae_opts o = {0};
    o.tile_size = 15;
    CHECK_ERR(h3_video_vae_open(p, &o, &v), H3_ERR_INVALID, "multiples of the 2 px latent size");
    o.tile_size = 16;
    o.tile_overlap_min = 16;
    CHECK_ERR(h3_video_vae_open(p, &o, &v), H3_ERR_INVALID, "overlap smaller than the tile");
    /* a ComfyUI-style file without a config, whose hidden size does not split into the asked heads */
    fx("comfy.safetensors", p, sizeof p);
    o = (h3_video_vae_opts){0};
    o.heads = 3;
    CHECK_ERR(h3_video_vae_open(p, &o, &v), H3_ERR_INVALID,
              "needs a hidden size that is a multiple of the 3 heads (--heads)");
    char cmd[1700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

/* Every allocation of open and decode may fail: an error comes back, nothing leaks; eventually it succeeds.
 */
static void test_alloc_failures(void) {
    const char *models[3] = {"official", "diffusers", "comfy.safetensors"};
    for (int k = 0; k < 3; k++) {
        char p[700];
        fx(models[k], p, sizeof p);
        h3_video_vae_opts o = {0};
        o.heads = k == 2 ? 2 : 0;
        h3_mem_stats base;
        h3_mem_get_stats(&base);
        int n, ok = 0;
        for (n = 1; n < 20000 && !ok; n++) {
            h3_video_vae *v = NULL;
            h3_mem_fail_at(n, 0);
            h3_clear_error();
            int64_t failed0 = h3_mem_failed_count();
            h3_status st = h3_video_vae_open(p, &o, &v);
            int64_t ticks = h3_mem_fail_at(0, 0);
            if (st == H3_OK) {
                ok = 1;
                CHECK(ticks < n, "%s: open succeeded although allocation %d failed", models[k], n);
                h3_video_vae_close(v);
            } else {
                CHECK(v == NULL, "no handle on failure");
                CHECK(st == H3_ERR_NOMEM || h3_mem_failed_count() > failed0, "%s, failing allocation %d: %s",
                      models[k], n, h3_last_error());
            }
            h3_mem_stats now;
            h3_mem_get_stats(&now);
            CHECK(now.total_current == base.total_current, "%s, failing allocation %d leaked %lld bytes",
                  models[k], n, (long long)(now.total_current - base.total_current));
        }
        CHECK(ok, "%s never opened", models[k]);
        t_note("  open %-18s: %d allocation failures handled", models[k], n - 2);
    }
    /* decode */
    char p[700];
    fx("official", p, sizeof p);
    h3_video_vae *v = NULL;
    CHECK_OK(h3_video_vae_open(p, NULL, &v));
    if (!v) return;
    int64_t s[4] = {24, 7, 10, 10}, os[4] = {3, 22, 20, 20};
    h3_tensor z, y;
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 4, s, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&y, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
    h3_video_decode_out dst = {H3_PIXELS_RAW, NULL, NULL, &y};
    h3_mem_stats base;
    h3_mem_get_stats(&base);
    int n, ok = 0;
    for (n = 1; n < 100000 && !ok; n++) {
        h3_mem_fail_at(n, 0);
        h3_clear_error();
        h3_status st = h3_video_vae_decode(v, &g_ex, &z, &dst);
        int64_t ticks = h3_mem_fail_at(0, 0);
        if (st == H3_OK) {
            ok = 1;
            CHECK(ticks < n, "decode succeeded although allocation %d failed", n);
        } else {
            CHECK(st == H3_ERR_NOMEM, "decode, failing allocation %d: %s", n, h3_last_error());
        }
        h3_mem_stats now;
        h3_mem_get_stats(&now);
        CHECK(now.total_current == base.total_current, "decode, failing allocation %d leaked %lld bytes", n,
              (long long)(now.total_current - base.total_current));
    }
    CHECK(ok, "decode never succeeded");
    t_note("  decode: %d allocation failures handled", n - 2);
    /* placing the weights packed (one block streamed: the streamer, its pinned copy, the slot) and decoding
     */
    h3_video_vae_run run;
    memset(&run, 0, sizeof run);
    run.place = H3_PLACE_HOST;
    run.packed = 1;
    run.stream_blocks = 1;
    h3_video_vae_mem m;
    CHECK_OK(h3_video_vae_plan(v, 7, 10, 10, &run, &m));
    h3_mem_get_stats(&base);
    ok = 0;
    for (n = 1; n < 100000 && !ok; n++) {
        h3_mem_fail_at(n, 0);
        h3_clear_error();
        h3_status st = h3_video_vae_place(v, &g_ex, &m, NULL);
        if (st == H3_OK) st = h3_video_vae_decode(v, &g_ex, &z, &dst);
        int64_t ticks = h3_mem_fail_at(0, 0);
        if (st == H3_OK) {
            ok = 1;
            CHECK(ticks < n, "place and decode succeeded although allocation %d failed", n);
        } else {
            CHECK(st == H3_ERR_NOMEM, "place and decode, failing allocation %d: %s", n, h3_last_error());
        }
        h3_video_vae_unplace(v);
        h3_mem_stats now;
        h3_mem_get_stats(&now);
        CHECK(now.total_current == base.total_current,
              "place and decode, failing allocation %d leaked %lld bytes", n,
              (long long)(now.total_current - base.total_current));
    }
    CHECK(ok, "place and decode never succeeded");
    t_note("  packed placement and decode: %d allocation failures handled", n - 2);
    h3_tensor_free(&z);
    h3_tensor_free(&y);
    h3_video_vae_close(v);
}

/* The released decoder's tensors as header-only files (the data area a sparse hole): each layout opens with
 * the released configuration, a ComfyUI file through the built-in defaults. */
static h3_status released_file(const char *path, h3_layout lay, h3_dtype dt) {
    h3_st_writer *w = NULL;
    H3_TRY(h3_st_writer_new(&w));
    h3_status st = H3_OK;
    int dif = lay == H3_LAYOUT_DIFFUSERS;
    char n[160];
#define ADD(name, nd, a, b, c)                                                                               \
    do {                                                                                                     \
        int64_t s_[5] = {a, b, c, 1, 1};                                                                     \
        if (st == H3_OK) st = h3_st_writer_add(w, name, dt, nd, s_, NULL);                                   \
    } while (0)
    ADD("post_quant_conv.weight", 5, 24, 24, 1);
    ADD("post_quant_conv.bias", 1, 24, 0, 0);
    ADD("encoder.conv_in.weight", 5, 128, 3, 3);
    ADD(dif ? "decoder.proj_in.weight" : "decoder.x_embedder.weight", 2, 2048, 24, 0);
    ADD(dif ? "decoder.proj_in.bias" : "decoder.x_embedder.bias", 1, 2048, 0, 0);
    ADD("decoder.register_tokens", 3, 1, 4, 2048);
    if (!dif) ADD("decoder.mask_token", 3, 1, 1, 2048);
    ADD("decoder.norm_out.weight", 1, 2048, 0, 0);
    ADD("decoder.norm_out.bias", 1, 2048, 0, 0);
    ADD("decoder.proj_out.weight", 2, 3072, 2048, 0);
    ADD("decoder.proj_out.bias", 1, 3072, 0, 0);
    for (int i = 0; i < 36; i++) {
#define B(suffix) (snprintf(n, sizeof n, "decoder.transformer_blocks.%d.%s", i, suffix), n)
        ADD(B("norm1.weight"), 1, 2048, 0, 0);
        ADD(B("norm2.weight"), 1, 2048, 0, 0);
        ADD(B("scale1"), 1, 2048, 0, 0);
        ADD(B("scale2"), 1, 2048, 0, 0);
        if (dif) {
            const char *q[3] = {"attn.to_q.", "attn.to_k.", "attn.to_v."};
            for (int k = 0; k < 3; k++) {
                char sfx[40];
                snprintf(sfx, sizeof sfx, "%sweight", q[k]);
                ADD(B(sfx), 2, 2048, 2048, 0);
                snprintf(sfx, sizeof sfx, "%sbias", q[k]);
                ADD(B(sfx), 1, 2048, 0, 0);
            }
        } else {
            ADD(B("attn.to_qkv.weight"), 2, 6144, 2048, 0);
            ADD(B("attn.to_qkv.bias"), 1, 6144, 0, 0);
        }
        ADD(B(dif ? "attn.to_out.0.weight" : "attn.to_out.weight"), 2, 2048, 2048, 0);
        ADD(B(dif ? "attn.to_out.0.bias" : "attn.to_out.bias"), 1, 2048, 0, 0);
        ADD(B(dif ? "ff.net.0.proj.weight" : "ff.w1.weight"), 2, 16384, 2048, 0);
        ADD(B(dif ? "ff.net.0.proj.bias" : "ff.w1.bias"), 1, 16384, 0, 0);
        ADD(B(dif ? "ff.net.2.weight" : "ff.w2.weight"), 2, 2048, 8192, 0);
        ADD(B(dif ? "ff.net.2.bias" : "ff.w2.bias"), 1, 2048, 0, 0);
#undef B
    }
#undef ADD
    if (st == H3_OK) st = h3_st_writer_write(w, path, 1);
    h3_st_writer_free(w);
    return st;
}

static void test_released_shapes(void) {
    char dir[600], p[800];
    t_tmp_path("vvae-released", dir, sizeof dir);
    snprintf(p, sizeof p, "mkdir -p '%s/video_vae/source' '%s/vae'", dir, dir);
    CHECK(system(p) == 0, "mkdir");
    /* the release's configs, statistics made up (checked to be read) */
    char mean[600] = "", std[600] = "";
    for (int i = 0; i < 24; i++) {
        size_t a = strlen(mean), b = strlen(std);
        snprintf(mean + a, sizeof mean - a, "%s%g", i ? ", " : "", 0.25 * i - 3);
        snprintf(std + b, sizeof std - b, "%s%g", i ? ", " : "", 1 + 0.125 * i);
    }
    char text[4000];
    snprintf(p, sizeof p, "%s/video_vae/config.json", dir);
    snprintf(
        text, sizeof text,
        "{\"source_path\": \"source\", \"source_safetensors_path\": \"model.safetensors\", "
        "\"latent_channels\": 24, \"latents_mean\": [%s], \"latents_std\": [%s], \"vae_clip_length\": 17, "
        "\"vae_token_drop\": 3, \"vae_tile_size\": 256, \"vae_tile_overlap_min\": 64}",
        mean, std);
    write_text(p, text);
    snprintf(p, sizeof p, "%s/video_vae/source/config.json", dir);
    write_text(p,
               "{\"_class_name\": \"AutoencoderKLLegacy\", \"ch\": 128, \"ch_mult\": [1, 2, 2, 4, 4, 8], "
               "\"embed_dim\": 24, \"in_channels\": 3, \"num_res_blocks\": 2, \"out_ch\": 3, "
               "\"space_down\": [2, 2, 2, 2, 1, 1], \"time_down\": [1, 2, 2, 1, 1, 1], \"vae_ratio\": 16, "
               "\"vae_ratio_t\": 4, \"use_vit_decoder\": true, \"z_channels\": 24, \"vit_decoder_kwargs\": "
               "{\"dim_head\": 64, \"heads\": 32, \"num_layers\": 36, \"rope_dim_ratio\": 0.75, "
               "\"rope_theta\": 100.0, \"qk_norm_type\": \"rms_norm\"}}");
    snprintf(p, sizeof p, "%s/vae/config.json", dir);
    snprintf(text, sizeof text,
             "{\"_class_name\": \"AutoencoderKLMiniMaxH3\", \"latent_channels\": 24, "
             "\"spatial_downsample_factors\": [2, 2, 2, 2, 1, 1], \"temporal_downsample_factors\": [1, 2, 2, "
             "1, 1, 1], "
             "\"decoder_num_layers\": 36, \"decoder_num_attention_heads\": 32, "
             "\"decoder_attention_head_dim\": 64, "
             "\"decoder_rope_theta\": 100.0, \"decoder_rope_dim_ratio\": 0.75, \"decoder_norm_eps\": 1e-05, "
             "\"clip_length\": 17, \"token_drop\": 3, \"latents_mean\": [%s], \"latents_std\": [%s]}",
             mean, std);
    write_text(p, text);
    char f1[800], f2[800], f3[800];
    snprintf(f1, sizeof f1, "%s/video_vae/source/model.safetensors", dir);
    snprintf(f2, sizeof f2, "%s/vae/diffusion_pytorch_model.safetensors", dir);
    snprintf(f3, sizeof f3, "%s/minimax_h3_video_vae_fp16.safetensors", dir);
    CHECK_OK(released_file(f1, H3_LAYOUT_OFFICIAL, H3_F32));
    CHECK_OK(released_file(f2, H3_LAYOUT_DIFFUSERS, H3_F32));
    CHECK_OK(released_file(f3, H3_LAYOUT_COMFY, H3_F16));
    const char *paths[3] = {dir, NULL, f3};
    char vaedir[700];
    snprintf(vaedir, sizeof vaedir, "%s/vae", dir);
    paths[1] = vaedir;
    h3_layout lays[3] = {H3_LAYOUT_OFFICIAL, H3_LAYOUT_DIFFUSERS, H3_LAYOUT_COMFY};
    for (int k = 0; k < 3; k++) {
        h3_video_vae *v = NULL;
        CHECK_OK(h3_video_vae_open(paths[k], NULL, &v));
        if (!v) continue;
        const h3_video_vae_config *c = h3_video_vae_get_config(v);
        CHECK(h3_video_vae_layout(v) == lays[k], "layout %d", k);
        CHECK(c->num_layers == 36 && c->heads == 32 && c->head_dim == 64 && c->rope_dim == 48 &&
                  c->ffn_inner == 8192 && c->patch_size == 16 && c->patch_size_t == 4 &&
                  c->num_register_tokens == 4 && c->clip_length == 17 && c->token_drop == 3 &&
                  c->tile_size == 256 && c->tile_overlap_min == 64 && c->latent_channels == 24,
              "%s: the released configuration", h3_layout_name(lays[k]));
        CHECK(c->weight_dtype == (k == 2 ? H3_F16 : H3_F32) && c->fused_qkv == (k != 1), "storage");
        if (k < 2)
            CHECK(c->latents_mean[5] == -1.75f && c->latents_std[23] == 3.875f,
                  "statistics from the config: %g %g", c->latents_mean[5], c->latents_std[23]);
        else
            CHECK(c->latents_mean[0] == 0.858090341091156f && c->latents_std[23] == 2.6127843856811525f,
                  "built-in statistics for the ComfyUI file");
        h3_video_vae_mem m;
        CHECK_OK(h3_video_vae_decode_peak(c, 37, 48, 84, 16, 0, &m));
        t_note("  %-9s released decoder opened from headers: 124 frames at 1344×768 plan %d chunks × %d×%d "
               "tiles, "
               "%.1f MiB",
               h3_layout_name(lays[k]), m.chunks, m.tiles_y, m.tiles_x, m.total / 1048576.0);
        /* on the GPU at W124 (latents 37 × 34 × 60): unlimited and 8 GiB keep every block resident and run a
         * chunk's 15 tiles per pass in the same steps (the same decode); smaller budgets stream blocks, then
         * shrink the pass; too small a budget says what it needs */
        const double budgets[] = {0, 8, 6, 4, 3, 2, 1, 0.25};
        h3_video_vae_mem d0;
        memset(&d0, 0, sizeof d0);
        for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
            h3_video_vae_run run;
            memset(&run, 0, sizeof run);
            run.place = H3_PLACE_DEVICE;
            run.vram_budget = (int64_t)(budgets[b] * 1073741824.0);
            h3_video_vae_mem d;
            h3_status st = h3_video_vae_plan(v, 37, 34, 60, &run, &d);
            if (budgets[b] == 0.25) {
                CHECK(st == H3_ERR_BUDGET, "0.25 GiB cannot hold a block and a tile");
                if (st != H3_OK)
                    t_note("  %-9s W124 at 0.25 GiB: %s", h3_layout_name(lays[k]), h3_last_error());
                continue;
            }
            CHECK_OK(st);
            if (st != H3_OK) continue;
            if (b == 0) d0 = d;
            CHECK(d.budget == 0 || d.dev_peak + d.budget_slack <= d.budget,
                  "%g GiB: the plan's peak %lld is over", budgets[b], (long long)d.dev_peak);
            if (budgets[b] == 0 || budgets[b] == 8)
                CHECK(d.n_resident == 36 && d.tile_batch == 15 && d.rows_per_step == d0.rows_per_step,
                      "%s W124 at %g GiB: %d resident, %d tiles per pass, %lld-row steps",
                      h3_layout_name(lays[k]), budgets[b], d.n_resident, d.tile_batch,
                      (long long)d.rows_per_step);
            t_note(
                "  %-9s W124 on the GPU at %5.2f GiB: %2d of 36 blocks resident, %2d of 15 tiles per pass, "
                "%5lld-row steps; peak %.3f GiB (weights %.3f, slot %.3f, arena %.3f, loading %.3f)",
                h3_layout_name(lays[k]), budgets[b], d.n_resident, d.tile_batch, (long long)d.rows_per_step,
                d.dev_peak / 1073741824.0, d.dev_weights / 1073741824.0, d.dev_slots / 1073741824.0,
                d.dev_arena / 1073741824.0, d.dev_load / 1073741824.0);
        }
        h3_video_vae_close(v);
    }
    snprintf(p, sizeof p, "rm -rf '%s'", dir);
    CHECK(system(p) == 0, "cleanup");
}

/* ---- helpers for tests/cli_decode.sh
 * ------------------------------------------------------------------------ */

/* --compare A B NAME TOL: tensor NAME of two files, relative L2 error <= TOL. */
static int cmd_compare(char **argv) {
    h3_tensor a = {0}, b = {0};
    if (load_f32(argv[2], argv[4], &a) != H3_OK || load_f32(argv[3], argv[4], &b) != H3_OK) {
        fprintf(stderr, "compare: %s\n", h3_last_error());
        return 1;
    }
    int r = 1;
    if (!h3_tensor_same_shape(&a, &b)) {
        char x[96], y[96];
        fprintf(stderr, "compare: shapes %s vs %s\n", h3_tensor_shape_str(&a, x, sizeof x),
                h3_tensor_shape_str(&b, y, sizeof y));
    } else {
        double *ref = to_double(&b), tol = atof(argv[5]);
        double e = t_rel_err(a.data, ref, (size_t)h3_tensor_numel(&b));
        printf("%s: relative L2 error %.3e (tolerance %g)\n", argv[4], e, tol);
        r = e <= tol ? 0 : 1;
        free(ref);
    }
    h3_tensor_free(&a);
    h3_tensor_free(&b);
    return r;
}

/* --compare-rgb RAW REF FRAME: an rgb24 dump of a PNG (ffmpeg) against the fixture's raw frame FRAME as 8-bit
 * levels round(clamp(x·std + mean)·255): at most 1 level off (float rounding at .5), 99% exact. */
static int cmd_compare_rgb(char **argv) {
    h3_tensor f = {0};
    char *raw = NULL;
    size_t len = 0;
    if (load_f32(argv[3], "frames", &f) != H3_OK || h3_read_file(argv[2], 1 << 28, &raw, &len) != H3_OK) {
        fprintf(stderr, "compare-rgb: %s\n", h3_last_error());
        return 1;
    }
    int64_t F = f.shape[2], H = f.shape[3], W = f.shape[4], k = atoll(argv[4]), exact = 0, worst = 0;
    int r = 1;
    if ((int64_t)len != H * W * 3 || k < 0 || k >= F) {
        fprintf(stderr, "compare-rgb: %zu bytes for %lld×%lld pixels\n", len, (long long)W, (long long)H);
    } else {
        for (int64_t i = 0; i < H * W; i++)
            for (int c = 0; c < 3; c++) {
                double x = ((float *)f.data)[((c * F + k) * H * W) + i] * k_std[c] + k_mean[c];
                x = x < 0 ? 0 : x > 1 ? 1 : x;
                long want = lrint(x * 255.0), got = (unsigned char)raw[i * 3 + c], d = labs(want - got);
                exact += d == 0;
                worst = d > worst ? d : worst;
            }
        printf("frame %lld: %lld of %lld levels exact, worst off by %lld\n", (long long)k, (long long)exact,
               (long long)(H * W * 3), (long long)worst);
        r = (worst <= 1 && exact * 100 >= H * W * 3 * 99) ? 0 : 1;
    }
    h3_free(raw);
    h3_tensor_free(&f);
    return r;
}

/* diffusers' AutoencoderKLMiniMaxH3 defaults latents_mean to 0 and latents_std to 1 for 24 channels: a config
 * without the keys is read with those (as from_pretrained does; a warning says so); a null is None to
 * diffusers, which its decode step cannot use (torch.tensor(None) raises): refused with a message that says
 * null. */
static void test_config_statistics(void) {
    char src[512], dir[512], p[700];
    t_tmp_path("vvae-stats", dir, sizeof dir);
    mkdir(dir, 0755);
    fx("diffusers/diffusion_pytorch_model.safetensors", src, sizeof src);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    char target[PATH_MAX]; /* a relative source path would resolve from the link's folder */
    CHECK(realpath(src, target) && symlink(target, p) == 0, "symlink %s -> %s", p, src);
    json_t *cfg = NULL;
    CHECK_OK(h3_json_load_file(fx("diffusers/config.json", src, sizeof src), 1 << 20, &cfg));
    if (!cfg) return;
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_object_del(cfg, "latents_mean");
    json_object_del(cfg, "latents_std");
    CHECK(json_dump_file(cfg, p, 0) == 0, "writing %s", p);
    h3_video_vae *v = NULL;
    CHECK_OK(h3_video_vae_open(dir, NULL, &v));
    if (v) {
        const h3_video_vae_config *c = h3_video_vae_get_config(v);
        int ok = c->latent_channels == 24;
        for (int i = 0; i < 24; i++) ok &= c->latents_mean[i] == 0.0f && c->latents_std[i] == 1.0f;
        CHECK(ok, "absent keys are diffusers' defaults: mean 0 and std 1 for 24 channels");
        h3_video_vae_close(v);
    }
    json_object_set_new(cfg, "latents_mean", json_null());
    CHECK(json_dump_file(cfg, p, 0) == 0, "writing %s", p);
    CHECK_ERR(h3_video_vae_open(dir, NULL, &v), H3_ERR_FORMAT, "\"latents_mean\" is null");
    json_decref(cfg);
    unlink(p);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

/* ---- the weight table's contract: every tensor, one at a time
 * ------------------------------------------------ */

static h3_status vv_load(const char *path, void *user) {
    h3_video_vae *v = NULL;
    h3_status st = h3_video_vae_open(path, user, &v);
    h3_video_vae_close(v);
    return st;
}

/* Never read: the official file's mask token (the encoder's). */
static int vv_accepts(const char *name, t_mutation m, void *user) {
    (void)m;
    (void)user;
    return !strcmp(name, "decoder.mask_token");
}

/* Every tensor of the three layouts' fixtures emptied, truncated, reshaped and retyped: refused in the
 * binder's one message form, never a crash. */
static void test_weight_sweep(void) {
    char p[512];
    h3_video_vae_opts none = {0}, comfy = {0};
    comfy.heads = 2;
    t_sweep("official", fx("official", p, sizeof p), vv_load, vv_accepts, &none, 0);
    t_sweep("diffusers", fx("diffusers", p, sizeof p), vv_load, vv_accepts, &none, 0);
    t_sweep("comfy.safetensors", fx("comfy.safetensors", p, sizeof p), vv_load, vv_accepts, &comfy, 0);
}

/* --write-latents PATH NAME d0 [d1 ...]: random f32 latents of that shape under that name. */
static int cmd_write_latents(int argc, char **argv) {
    int nd = argc - 4;
    int64_t s[H3_MAX_DIMS], n = 1;
    if (nd < 1 || nd > H3_MAX_DIMS) return 1;
    for (int i = 0; i < nd; i++) n *= (s[i] = atoll(argv[4 + i]));
    float *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    t_fill_randn(d, (size_t)n, 1.0);
    h3_st_writer *w = NULL;
    h3_status st = h3_st_writer_new(&w);
    if (st == H3_OK) st = h3_st_writer_add(w, argv[3], H3_F32, nd, s, d);
    if (st == H3_OK) st = h3_st_writer_write(w, argv[2], 0);
    if (st != H3_OK) fprintf(stderr, "write-latents: %s\n", h3_last_error());
    h3_st_writer_free(w);
    free(d);
    return st != H3_OK;
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "--compare")) return cmd_compare(argv);
    if (argc == 5 && !strcmp(argv[1], "--compare-rgb")) return cmd_compare_rgb(argv);
    if (argc >= 5 && !strcmp(argv[1], "--write-latents")) return cmd_write_latents(argc, argv);
    static const t_case cases[] = {
        {"fixtures", test_fixtures},
        {"callback_and_unit_range", test_callback_and_unit_range},
        {"layouts_agree", test_layouts_agree},
        {"frame_counts", test_frame_counts},
        {"runs", test_runs},
        {"place_errors", test_place_errors},
        {"standin_place", test_standin_place},
        {"memory_bounded", test_memory_bounded},
        {"split", test_split},
        {"malformed_latents", test_malformed_latents},
        {"bad_files", test_bad_files},
        {"weight_sweep", test_weight_sweep},
        {"config_statistics", test_config_statistics},
        {"alloc_failures", test_alloc_failures},
        {"released_shapes", test_released_shapes},
        {NULL, NULL},
    };
    if (h3_exec_init(&g_ex, 2) != H3_OK) return 1;
    int r = t_main("test_video_vae", cases, argc, argv);
    h3_exec_free(&g_ex);
    return r;
}

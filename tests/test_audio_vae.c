/* The audio VAE decoder (BigVGAN) against the fixtures of the PyTorch reference
 * (tools/reference/audio_vae.py, float64), in the official, diffusers and ComfyUI layouts; the resampling
 * filter; planned vs measured memory; malformed latents and files; allocation failures; the WAV writer.
 *
 * The fixture weights are not stored: tests/fixtures/audio_vae/manifest_*.json lists every tensor with the
 * seed of the splitmix64 generator that makes its values (the same generator as
 * tools/reference/make_vae_fixtures.py), and this program writes the model files from it:  test_audio_vae
 * --write-model official|diffusers|comfy PATH */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "models/audio_vae.h"
#include "models/audio_vae_enc.h"
#include "pipeline/media.h"
#include "testutil.h"

static h3_exec g_ex;

static const char *fx(const char *rel, char *buf, size_t n) {
    char r[512];
    snprintf(r, sizeof r, "tests/fixtures/audio_vae/%s", rel);
    return t_src_path(r, buf, n);
}

/* Value i of a generated tensor (see make_vae_fixtures.py generate). */
static float gen_value(uint64_t seed, uint64_t i, double scale, double offset) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    double u = (double)(z >> 40) / 16777216.0;
    return (float)(offset + scale * (2.0 * u - 1.0));
}

static void copy_file(const char *from, const char *to) {
    char *text = NULL;
    size_t len = 0;
    if (h3_read_file(from, 1 << 20, &text, &len) != H3_OK) return;
    FILE *f = fopen(to, "wb");
    if (f) {
        fwrite(text, 1, len, f);
        fclose(f);
    }
    h3_free(text);
}

/* Writes the weights of a manifest to `file`. */
static h3_status write_manifest(const char *manifest, const char *file) {
    json_t *m = NULL;
    H3_TRY(h3_json_load_file(manifest, 16u << 20, &m));
    json_t *tensors = json_object_get(m, "tensors"), *values = json_object_get(m, "values");
    size_t n = json_array_size(tensors);
    float **bufs = calloc(n ? n : 1, sizeof *bufs);
    h3_st_writer *w = NULL;
    h3_status st = h3_st_writer_new(&w);
    for (size_t i = 0; i < n && st == H3_OK; i++) {
        json_t *e = json_array_get(tensors, i), *sh = json_object_get(e, "shape"),
               *vals = json_object_get(e, "values");
        int nd = (int)json_array_size(sh);
        int64_t shape[H3_MAX_DIMS], numel = 1;
        for (int k = 0; k < nd && k < H3_MAX_DIMS; k++) {
            shape[k] = (int64_t)json_integer_value(json_array_get(sh, (size_t)k));
            numel *= shape[k];
        }
        bufs[i] = malloc((size_t)(numel ? numel : 1) * sizeof(float));
        if (vals && json_is_string(vals)) vals = json_object_get(values, json_string_value(vals));
        if (vals) {
            for (int64_t k = 0; k < numel; k++)
                bufs[i][k] = (float)json_number_value(json_array_get(vals, (size_t)k));
        } else {
            int64_t seed = 0;
            double scale = 0, offset = 0;
            h3_json_get_int(e, "seed", &seed);
            h3_json_get_num(e, "scale", &scale);
            h3_json_get_num(e, "offset", &offset);
            for (int64_t k = 0; k < numel; k++)
                bufs[i][k] = gen_value((uint64_t)seed, (uint64_t)k, scale, offset);
        }
        st = h3_st_writer_add(w, h3_json_get_str(e, "name"), H3_F32, nd, shape, bufs[i]);
    }
    if (st == H3_OK) st = h3_st_writer_write(w, file, 0);
    h3_st_writer_free(w);
    for (size_t i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    json_decref(m);
    return st;
}

/* official: PATH/{model.safetensors, config.json, metadata.json}; diffusers: PATH/{diffusion_pytorch_model
 * .safetensors, config.json}; comfy: the file PATH. */
static h3_status write_model(const char *kind, const char *path) {
    char man[700], a[700], b[1200];
    if (!strcmp(kind, "comfy")) return write_manifest(fx("manifest_comfy.json", man, sizeof man), path);
    int off = !strcmp(kind, "official");
    if (!off && strcmp(kind, "diffusers"))
        return H3_ERR(H3_ERR_INVALID, "kind must be official, diffusers or comfy");
    mkdir(path, 0755);
    snprintf(b, sizeof b, "%s/%s", path, off ? "model.safetensors" : "diffusion_pytorch_model.safetensors");
    H3_TRY(write_manifest(fx("manifest_official.json", man, sizeof man), b));
    const char *files[2] = {"config.json", "metadata.json"};
    for (int i = 0; i < (off ? 2 : 1); i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "%s/%s", off ? "official" : "diffusers", files[i]);
        snprintf(b, sizeof b, "%s/%s", path, files[i]);
        copy_file(fx(rel, a, sizeof a), b);
    }
    return H3_OK;
}

static char g_dir[600];

static const char *model_path(const char *kind, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s%s", g_dir, kind, strcmp(kind, "comfy") ? "" : ".safetensors");
    return buf;
}

static h3_status load_f32(const char *path, const char *name, h3_tensor *out) {
    h3_st_set s;
    H3_TRY(h3_st_open(path, &s));
    h3_status st = h3_st_load(&s, name, H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, out);
    h3_st_close(&s);
    return st;
}

/* Decodes a fixture case with a model, returns the relative L2 error (checked against tol). */
static double run_case(const char *kind, const h3_audio_vae_opts *o, const char *name, double tol) {
    char mp[700], cp[700], file[128], what[160];
    snprintf(file, sizeof file, "case_%s.safetensors", name);
    h3_audio_vae *v = NULL;
    h3_tensor lat = {0}, ref = {0}, out = {0};
    double e = -1;
    CHECK_OK(h3_audio_vae_open(model_path(kind, mp, sizeof mp), o, &v));
    CHECK_OK(load_f32(fx(file, cp, sizeof cp), "latents", &lat));
    CHECK_OK(load_f32(fx(file, cp, sizeof cp), "waveform", &ref));
    if (v && lat.data && ref.data) {
        CHECK(h3_audio_vae_layout(v) == (!strcmp(kind, "official")    ? H3_LAYOUT_OFFICIAL
                                         : !strcmp(kind, "diffusers") ? H3_LAYOUT_DIFFUSERS
                                                                      : H3_LAYOUT_COMFY),
              "layout of %s", kind);
        CHECK_OK(h3_tensor_alloc(&out, H3_PLACE_HOST, H3_F32, ref.ndim, ref.shape, H3_MEM_OTHER));
        CHECK_OK(h3_audio_vae_decode(v, &g_ex, &lat, &out));
        size_t n = (size_t)h3_tensor_numel(&ref);
        double *rd = malloc(n * sizeof *rd);
        for (size_t i = 0; i < n; i++) rd[i] = ((float *)ref.data)[i];
        snprintf(what, sizeof what, "%s with the %s file%s", name, kind,
                 o && o->compute_filters ? ", computed filters" : "");
        e = EXPECT_CLOSE(what, out.data, rd, n, tol);
        t_note("  %-14s %-9s latents [%lld, %lld, %lld] -> waveform [%lld, 1, %lld]: rel err %.2e, max abs "
               "%.2e%s",
               name, kind, (long long)lat.shape[0], (long long)lat.shape[1], (long long)lat.shape[2],
               (long long)ref.shape[0], (long long)ref.shape[2], e, t_max_abs_err(out.data, rd, n),
               o && o->compute_filters ? " (computed filters)" : "");
        free(rd);
    }
    h3_tensor_free(&lat);
    h3_tensor_free(&ref);
    h3_tensor_free(&out);
    h3_audio_vae_close(v);
    return e;
}

/* Every case with the file it was made for; the stereo case also through the diffusers folder (same weights).
 */
static void test_fixtures(void) {
    run_case("official", NULL, "stereo", 1e-4);
    run_case("official", NULL, "mono", 1e-4);
    run_case("diffusers", NULL, "stereo", 1e-4);
    run_case("comfy", NULL, "comfy_stereo", 1e-4);
}

/* The encoder (models/audio_vae_enc.h): the fixture waveforms to the reference's posterior mean (float64) from
 * each layout; a decoder-only file and bad waveforms refused with their messages. */
/* ex NULL: the host (g_ex); else the convolution stack placed on ex's device, its measured device peak against
 * h3_audio_enc_mem_of's. */
static double run_encode_at(const char *kind, const char *name, double tol, h3_exec *dev);
static double run_encode(const char *kind, const char *name, double tol) {
    return run_encode_at(kind, name, tol, NULL);
}

static double run_encode_at(const char *kind, const char *name, double tol, h3_exec *dev) {
    char mp[700], cp[700], file[128], what[160];
    snprintf(file, sizeof file, "case_%s.safetensors", name);
    h3_audio_vae *v = NULL;
    h3_audio_enc *e = NULL;
    h3_tensor wave = {0}, ref = {0}, out = {0};
    double err = -1;
    CHECK_OK(h3_audio_vae_open(model_path(kind, mp, sizeof mp), NULL, &v));
    if (v) CHECK_OK(h3_audio_enc_open(v, &e));
    CHECK_OK(load_f32(fx(file, cp, sizeof cp), "waveform", &wave));
    CHECK_OK(load_f32(fx(file, cp, sizeof cp), "latents", &ref));
    if (e && wave.data && ref.data) {
        const h3_audio_enc_config *c = h3_audio_enc_get_config(e);
        CHECK(c->encoder_dim == 4 && c->n_stages == 5 && c->hop == 800 && c->latent_dim == 64 &&
                  c->latent_channels == 32 && c->strides[0] == 2 && c->strides[4] == 5,
              "%s: the encoder's shape read from the tensors", kind);
        int64_t base = 0, used0 = 0, peak = 0;
        if (dev) {
            /* the backend's own bytes (its cuBLASLt workspace, H3_CUDA_BACKEND_BYTES) are in use before */
            h3_cuda_mem_stats(dev, &base, NULL, NULL);
            CHECK_OK(h3_audio_enc_place(e, dev, H3_PLACE_DEVICE));
            h3_cuda_mem_stats(dev, &used0, NULL, NULL);
            h3_cuda_reset_peak(dev);
        }
        CHECK_OK(h3_audio_enc_encode(e, dev ? dev : &g_ex, &wave, &out));
        if (dev) {
            h3_cuda_mem_stats(dev, NULL, &peak, NULL);
            h3_audio_enc_mem m;
            CHECK_OK(h3_audio_enc_mem_of(c, wave.shape[2], &m));
            /* the weights were placed before the reset: the peak is theirs plus the encode's, above the
             * backend's bytes, which h3_audio_enc_mem_of leaves out (the planner adds them) */
            peak -= base;
            used0 -= base;
            CHECK(peak <= m.dev_total && used0 >= m.dev_weights - 4096,
                  "%s on the device: peak %lld (weights %lld) against the plan's %lld (weights %lld), "
                  "above the backend's %lld",
                  kind, (long long)peak, (long long)used0, (long long)m.dev_total, (long long)m.dev_weights,
                  (long long)base);
            t_note("  %-12s %-9s on the device: peak %lld B, planned %lld B (weights %lld, buffers %lld, "
                   "scratch %lld)",
                   name, kind, (long long)peak, (long long)m.dev_total, (long long)m.dev_weights,
                   (long long)m.dev_buffers, (long long)m.dev_op_scratch);
            CHECK_OK(h3_audio_enc_place(e, dev, H3_PLACE_HOST));
        }
        if (out.data) {
            CHECK(out.ndim == 3 && out.shape[0] == ref.shape[0] && out.shape[1] == ref.shape[1] &&
                      out.shape[2] == ref.shape[2] && out.shape[2] == h3_audio_enc_frames(c, wave.shape[2]),
                  "%s: latents [%lld, %lld, %lld]", kind, (long long)out.shape[0], (long long)out.shape[1],
                  (long long)out.shape[2]);
            size_t n = (size_t)h3_tensor_numel(&ref);
            double *rd = malloc(n * sizeof *rd);
            for (size_t i = 0; i < n; i++) rd[i] = ((float *)ref.data)[i];
            snprintf(what, sizeof what, "encode %s with the %s file", name, kind);
            err = EXPECT_CLOSE(what, out.data, rd, n, tol);
            t_note("  %-12s %-9s waveform [%lld, 1, %lld] -> latents [%lld, %lld, %lld]: rel err %.2e", name, kind,
                   (long long)wave.shape[0], (long long)wave.shape[2], (long long)out.shape[0],
                   (long long)out.shape[1], (long long)out.shape[2], err);
            free(rd);
        }
    }
    h3_tensor_free(&wave);
    h3_tensor_free(&ref);
    h3_tensor_free(&out);
    h3_audio_enc_close(e);
    h3_audio_vae_close(v);
    return err;
}

static void test_encode(void) {
    run_encode("official", "encode", 1e-4);
    run_encode("diffusers", "encode", 1e-4);
    run_encode("comfy", "encode_comfy", 1e-4);
    /* the normalization the DiT takes: (x − mean) / std per latent channel */
    char mp[700];
    h3_audio_vae *v = NULL;
    CHECK_OK(h3_audio_vae_open(model_path("official", mp, sizeof mp), NULL, &v));
    if (v) {
        const h3_audio_vae_config *c = h3_audio_vae_get_config(v);
        int64_t s[3] = {1, c->latent_channels, 2};
        h3_tensor z;
        CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_OTHER));
        for (int k = 0; k < c->latent_channels; k++) {
            ((float *)z.data)[2 * k] = c->latents_mean[k];
            ((float *)z.data)[2 * k + 1] = c->latents_mean[k] + 2 * c->latents_std[k];
        }
        h3_audio_enc_normalize(c, &z);
        int bad = 0;
        for (int k = 0; k < c->latent_channels; k++)
            bad += fabsf(((float *)z.data)[2 * k]) > 1e-6f || fabsf(((float *)z.data)[2 * k + 1] - 2) > 1e-5f;
        CHECK(!bad, "normalize: %d channels off", bad);
        h3_tensor_free(&z);
        /* bad waveforms */
        h3_audio_enc *e = NULL;
        CHECK_OK(h3_audio_enc_open(v, &e));
        if (e) { /* the planner's view: the config from the headers, the device bytes growing with the samples */
            h3_audio_vae_opts ho;
            memset(&ho, 0, sizeof ho);
            ho.headers_only = 1;
            h3_audio_vae *vh = NULL;
            h3_audio_enc_config hc;
            CHECK_OK(h3_audio_vae_open(mp, &ho, &vh));
            if (vh) {
                CHECK_OK(h3_audio_enc_config_of(vh, &hc));
                CHECK(!memcmp(&hc, h3_audio_enc_get_config(e), sizeof hc), "the config from the headers differs");
                h3_audio_vae_close(vh);
            }
            h3_audio_enc_mem m1, m2;
            CHECK_OK(h3_audio_enc_mem_of(h3_audio_enc_get_config(e), 32000, &m1));
            CHECK_OK(h3_audio_enc_mem_of(h3_audio_enc_get_config(e), 320000, &m2));
            CHECK(m1.dev_weights == m2.dev_weights && m1.dev_weights > 0 && m2.dev_buffers > 5 * m1.dev_buffers &&
                      m2.dev_total == m2.dev_weights + m2.dev_buffers + m2.dev_op_scratch,
                  "mem_of: weights %lld/%lld, buffers %lld/%lld", (long long)m1.dev_weights,
                  (long long)m2.dev_weights, (long long)m1.dev_buffers, (long long)m2.dev_buffers);
            CHECK_ERR(h3_audio_enc_mem_of(h3_audio_enc_get_config(e), 0, &m1), H3_ERR_INVALID, "bad sizes");
            CHECK_ERR(h3_audio_enc_place(e, &g_ex, H3_PLACE_DEVICE), H3_ERR_INVALID, "needs a CUDA backend");
        }
        if (e) {
            h3_tensor w, out;
            int64_t w3[3] = {2, 2, 100}, w0[2] = {2, 0}, w9[2] = {65, 10}, ok[2] = {1, 100};
            CHECK_OK(h3_tensor_alloc(&w, H3_PLACE_HOST, H3_F32, 3, w3, H3_MEM_OTHER));
            CHECK_ERR(h3_audio_enc_encode(e, &g_ex, &w, &out), H3_ERR_INVALID, "[channels, 1, samples]");
            h3_tensor_free(&w);
            CHECK_OK(h3_tensor_alloc(&w, H3_PLACE_HOST, H3_F32, 2, w0, H3_MEM_OTHER));
            CHECK_ERR(h3_audio_enc_encode(e, &g_ex, &w, &out), H3_ERR_INVALID, "no samples");
            h3_tensor_free(&w);
            CHECK_OK(h3_tensor_alloc(&w, H3_PLACE_HOST, H3_F32, 2, w9, H3_MEM_OTHER));
            memset(w.data, 0, (size_t)h3_tensor_numel(&w) * sizeof(float));
            CHECK_ERR(h3_audio_enc_encode(e, &g_ex, &w, &out), H3_ERR_INVALID, "65 channels");
            h3_tensor_free(&w);
            CHECK_OK(h3_tensor_alloc(&w, H3_PLACE_HOST, H3_F32, 2, ok, H3_MEM_OTHER));
            memset(w.data, 0, (size_t)h3_tensor_numel(&w) * sizeof(float));
            ((float *)w.data)[37] = NAN;
            CHECK_ERR(h3_audio_enc_encode(e, &g_ex, &w, &out), H3_ERR_INVALID, "sample 37 of channel 0 is not finite");
            ((float *)w.data)[37] = 0;
            CHECK_OK(h3_audio_enc_encode(e, &g_ex, &w, &out)); /* 100 samples: one latent frame */
            CHECK(out.ndim == 3 && out.shape[2] == 1, "100 samples: %lld frames", (long long)out.shape[2]);
            h3_tensor_free(&out);
            h3_tensor_free(&w);
            h3_audio_enc_close(e);
        }
        h3_audio_vae_close(v);
    }
    /* a file holding the decoder only (no encoder tensors) */
    char man[700], path[800];
    snprintf(path, sizeof path, "%s/decoder_only.safetensors", g_dir);
    json_t *m = NULL;
    CHECK_OK(h3_json_load_file(fx("manifest_comfy.json", man, sizeof man), 16u << 20, &m));
    if (m) {
        json_t *ts = json_object_get(m, "tensors"), *keep = json_array();
        for (size_t i = 0; i < json_array_size(ts); i++) {
            const char *n = json_string_value(json_object_get(json_array_get(ts, i), "name"));
            if (strncmp(n, "encoder.", 8) && strncmp(n, "pre_block.", 10) && strncmp(n, "mean_proj.", 10) &&
                strncmp(n, "logs_proj.", 10))
                json_array_append(keep, json_array_get(ts, i));
        }
        json_object_set_new(m, "tensors", keep);
        char mp2[800];
        snprintf(mp2, sizeof mp2, "%s/decoder_only.json", g_dir);
        CHECK(json_dump_file(m, mp2, 0) == 0, "writing %s", mp2);
        CHECK_OK(write_manifest(mp2, path));
        json_decref(m);
        v = NULL;
        CHECK_OK(h3_audio_vae_open(path, NULL, &v));
        h3_audio_enc *e = NULL;
        if (v) CHECK_ERR(h3_audio_enc_open(v, &e), H3_ERR_FORMAT, "holds the decoder only");
        CHECK(e == NULL, "no encoder");
        h3_audio_vae_close(v);
    }
}

/* The encoder's convolution stack on the GPU against the reference (as on the host). Skips without a GPU. */
static void test_encode_cuda(void) {
    if (h3_cuda_device_count() == 0) {
        t_note("skipped: no CUDA device (%s)", h3_cuda_compiled() ? "CUDA backend compiled" : "built without CUDA");
        return;
    }
    h3_exec ex;
    CHECK_OK(h3_exec_init(&ex, 2));
    h3_status st = h3_cuda_init(&ex, 0, (int64_t)2 << 30);
    CHECK_OK(st);
    if (st == H3_OK) {
        run_encode_at("official", "encode", 1e-4, &ex);
        run_encode_at("comfy", "encode_comfy", 1e-4, &ex);
        h3_cuda_shutdown(&ex);
    }
    h3_exec_free(&ex);
}

/* The filter h3run computes is the one the files store (float64 formula vs torch's float32 one: within 1e-7),
 * and decoding with it instead changes nothing at the test's tolerance. */
static void test_filters(void) {
    float f[12];
    h3_audio_kaiser_filter(f, 12, 0.25, 0.3);
    char p[700];
    json_t *m = NULL;
    CHECK_OK(h3_json_load_file(fx("manifest_official.json", p, sizeof p), 16u << 20, &m));
    json_t *k = json_object_get(json_object_get(m, "values"), "kaiser12");
    CHECK(json_array_size(k) == 12, "the stored filter has 12 taps");
    double worst = 0, sum = 0;
    for (int i = 0; i < 12 && i < (int)json_array_size(k); i++) {
        double d = fabs(f[i] - json_number_value(json_array_get(k, (size_t)i)));
        worst = d > worst ? d : worst;
        sum += f[i];
    }
    CHECK(worst <= 1e-7, "computed vs stored filter: %.2e", worst);
    CHECK(fabs(sum - 1.0) < 1e-6 && f[0] == f[11] && f[5] == f[6], "sums to 1 (%.9f), symmetric", sum);
    t_note("  computed Kaiser filter vs stored: max diff %.2e", worst);
    json_decref(m);
    h3_audio_vae_opts o = {.compute_filters = 1};
    run_case("official", &o, "stereo", 1e-4);
}

/* Predicted peak (h3_audio_vae_decode_peak) vs measured, and the released decoder's figures. */
static void test_memory(void) {
    char mp[700];
    h3_audio_vae *v = NULL;
    CHECK_OK(h3_audio_vae_open(model_path("official", mp, sizeof mp), NULL, &v));
    if (!v) return;
    const h3_audio_vae_config *c = h3_audio_vae_get_config(v);
    int64_t Ts[2] = {5, 40};
    for (int i = 0; i < 2; i++) {
        int64_t s[3] = {2, c->latent_channels, Ts[i]}, ws[2] = {2, Ts[i] * c->hop};
        h3_tensor z, y;
        CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_OTHER));
        CHECK_OK(h3_tensor_alloc(&y, H3_PLACE_HOST, H3_F32, 2, ws, H3_MEM_OTHER));
        t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
        h3_mem_stats a, b;
        h3_mem_get_stats(&a);
        h3_mem_reset_peaks();
        CHECK_OK(h3_audio_vae_decode(v, &g_ex, &z, &y));
        h3_mem_get_stats(&b);
        int64_t peak = b.total_peak - a.total_current;
        h3_audio_vae_mem m;
        CHECK_OK(h3_audio_vae_decode_peak(c, Ts[i], 2, &m));
        t_note("  %lld latents per channel: peak %lld bytes measured, %lld predicted (buffers %lld, op %lld)",
               (long long)Ts[i], (long long)peak, (long long)m.total, (long long)m.buffers,
               (long long)m.op_scratch);
        CHECK(llabs(peak - m.total) <= m.total / 50, "predicted %lld vs measured %lld", (long long)m.total,
              (long long)peak);
        CHECK(b.total_current == a.total_current, "leaked %lld bytes",
              (long long)(b.total_current - a.total_current));
        float lo = 0, hi = 0;
        for (int64_t k = 0; k < h3_tensor_numel(&y); k++) {
            float x = ((float *)y.data)[k];
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
        CHECK(lo >= -1.0f && hi <= 1.0f, "clamped to [-1, 1]: [%g, %g]", lo, hi);
        h3_tensor_free(&z);
        h3_tensor_free(&y);
    }
    h3_audio_vae_close(v);
    h3_audio_vae_config r;
    memset(&r, 0, sizeof r);
    r.latent_channels = 32;
    r.latent_dim = 2048;
    r.decoder_dim = 1024;
    r.n_up = 7;
    int rates[7] = {5, 5, 2, 2, 2, 2, 2}, ks[7] = {9, 9, 4, 4, 4, 4, 4};
    memcpy(r.rates, rates, sizeof rates);
    memcpy(r.kernels, ks, sizeof ks);
    r.n_res = 3;
    r.res_kernels[0] = 3, r.res_kernels[1] = 7, r.res_kernels[2] = 11;
    r.n_dil = 3;
    for (int i = 0; i < 3; i++) r.dilations[i][0] = 1, r.dilations[i][1] = 3, r.dilations[i][2] = 5;
    r.filter_taps = 12;
    r.hop = 800;
    h3_audio_vae_mem a, b;
    CHECK_OK(h3_audio_vae_decode_peak(&r, 207, 2, &a));
    CHECK_OK(h3_audio_vae_decode_peak(&r, 600, 2, &b));
    t_note("  released decoder: 124 frames (207 latents) %.1f MiB, 15 s (600 latents) %.1f MiB on the host",
           a.total / 1048576.0, b.total / 1048576.0);
    t_note("  on the device, stereo: 207 latents %.1f MiB (weights %.1f, buffers %.1f, op scratch %.1f), 600 "
           "latents "
           "%.1f MiB",
           a.dev_total / 1048576.0, a.dev_weights / 1048576.0, a.dev_buffers / 1048576.0,
           a.dev_op_scratch / 1048576.0, b.dev_total / 1048576.0);
    /* the released decoder's weights: 65.1M floats (H3-FACTS §4: about 0.25 GB of f32 for the decoder) */
    CHECK(a.dev_weights > 240 << 20 && a.dev_weights < 270 << 20, "device weights %lld bytes",
          (long long)a.dev_weights);
}

/* The placement option without a device backend: a device decode is a clear error (naming h3_cuda_init, or
 * the build's lack of CUDA), the host decode works after a placement back; an unknown placement is refused.
 */
/* Opened for its headers (the planner's way): the same config, every layout's weight-normed convs checked by
 * shape, nothing read (the host memory it holds is a small fraction of the folded decoder's), and a decode
 * refused with a message. */
static void test_headers_only(void) {
    static const char *const layouts[] = {"official", "diffusers", "comfy"};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        char mp[700];
        h3_audio_vae *full = NULL, *hv = NULL;
        h3_mem_stats a, b, c;
        const h3_audio_vae_opts ho = {.headers_only = 1};
        h3_mem_get_stats(&a);
        CHECK_OK(h3_audio_vae_open(model_path(layouts[i], mp, sizeof mp), &ho, &hv));
        h3_mem_get_stats(&b);
        CHECK_OK(h3_audio_vae_open(mp, NULL, &full));
        h3_mem_get_stats(&c);
        if (!hv || !full) {
            h3_audio_vae_close(hv);
            h3_audio_vae_close(full);
            continue;
        }
        const h3_audio_vae_config *hc = h3_audio_vae_get_config(hv), *fc = h3_audio_vae_get_config(full);
        CHECK(hc->hop == fc->hop && hc->n_up == fc->n_up && hc->decoder_dim == fc->decoder_dim &&
                  hc->latent_channels == fc->latent_channels &&
                  !strcmp(h3_audio_vae_source(hv), h3_audio_vae_source(full)),
              "%s: the same config", layouts[i]);
        const int64_t held_h = b.total_current - a.total_current, held_f = c.total_current - b.total_current;
        CHECK(held_h * 4 < held_f, "%s: headers only hold %lld bytes, a full open %lld", layouts[i],
              (long long)held_h, (long long)held_f);
        int64_t s[3] = {2, 32, 2}, ws[3] = {2, 1, 2 * hc->hop};
        h3_tensor z, y;
        CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_OTHER));
        CHECK_OK(h3_tensor_alloc(&y, H3_PLACE_HOST, H3_F32, 3, ws, H3_MEM_OTHER));
        t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
        CHECK_ERR(h3_audio_vae_decode(hv, &g_ex, &z, &y), H3_ERR_INVALID, "headers only");
        CHECK_OK(h3_audio_vae_decode(full, &g_ex, &z, &y));
        h3_tensor_free(&z);
        h3_tensor_free(&y);
        h3_audio_vae_close(hv);
        h3_audio_vae_close(full);
    }
}

static void test_placement(void) {
    char mp[700];
    h3_audio_vae *v = NULL;
    h3_audio_vae_opts o = {.act_place = H3_PLACE_DEVICE};
    CHECK_OK(h3_audio_vae_open(model_path("official", mp, sizeof mp), &o, &v));
    if (!v) return;
    int64_t s[3] = {2, 32, 2}, ws[3] = {2, 1, 1600};
    h3_tensor z, y;
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&y, H3_PLACE_HOST, H3_F32, 3, ws, H3_MEM_OTHER));
    t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
    CHECK_ERR(h3_audio_vae_decode(v, &g_ex, &z, &y), H3_ERR_INVALID,
              h3_cuda_compiled() ? "CUDA backend is not initialized" : "this build has no CUDA backend");
    CHECK_ERR(h3_audio_vae_set_placement(v, (h3_place)42), H3_ERR_INVALID, "unknown placement");
    CHECK_OK(h3_audio_vae_set_placement(v, H3_PLACE_HOST));
    CHECK_OK(h3_audio_vae_decode(v, &g_ex, &z, &y));
    h3_tensor_free(&z);
    h3_tensor_free(&y);
    h3_audio_vae_close(v);
}

/* ---- the device path on a stand-in device: host memory and the CPU kernels behind the device place
 * ---------------- Runs the decode's device code (the units made resident as f32 by the first decode and the
 * views they hand out, every channel in one batch, the latents copied in and the waveform out) on any machine
 * (t_standin_begin). Its allocations are counted in the arena's granules; its ops take their scratch from the
 * host, so the peak is the plan's weights + buffers. */

/* Every fixture case through the device path on the stand-in: the waveform equals the host decode's exactly
 * (the same kernels; batching items changes no sum), the stand-in's peak is the plan's weights + buffers, the
 * weights stay until a placement back to the host gives them back. */
static void test_standin_device(void) {
    if (!t_standin_begin(&g_ex)) {
        t_note("  skipped: a device backend is active");
        return;
    }
    static const char *const cases[4][2] = {
        {"official", "stereo"}, {"official", "mono"}, {"diffusers", "stereo"}, {"comfy", "comfy_stereo"}};
    for (int i = 0; i < 4; i++) {
        char mp[700], cp[700], file[128];
        snprintf(file, sizeof file, "case_%s.safetensors", cases[i][1]);
        h3_audio_vae *vh = NULL, *vd = NULL;
        h3_audio_vae_opts od = {.act_place = H3_PLACE_DEVICE};
        h3_tensor lat = {0}, oh = {0}, odv = {0};
        CHECK_OK(h3_audio_vae_open(model_path(cases[i][0], mp, sizeof mp), NULL, &vh));
        CHECK_OK(h3_audio_vae_open(model_path(cases[i][0], mp, sizeof mp), &od, &vd));
        CHECK_OK(load_f32(fx(file, cp, sizeof cp), "latents", &lat));
        if (vh && vd && lat.data) {
            int64_t ch = lat.ndim == 3 ? lat.shape[0] : 1, T = lat.shape[lat.ndim - 1];
            const h3_audio_vae_config *c = h3_audio_vae_get_config(vd);
            int64_t sw[3] = {ch, 1, T * c->hop};
            CHECK_OK(h3_tensor_alloc(&oh, H3_PLACE_HOST, H3_F32, 3, sw, H3_MEM_OTHER));
            CHECK_OK(h3_tensor_alloc(&odv, H3_PLACE_HOST, H3_F32, 3, sw, H3_MEM_OTHER));
            h3_audio_vae_mem m;
            CHECK_OK(h3_audio_vae_decode_peak(c, T, ch, &m));
            CHECK_OK(h3_audio_vae_decode(vh, &g_ex, &lat, &oh));
            t_sd_used = t_sd_peak = 0;
            CHECK_OK(h3_audio_vae_decode(vd, &g_ex, &lat, &odv));
            size_t n = (size_t)h3_tensor_numel(&oh);
            double *ref = malloc(n * sizeof *ref);
            for (size_t k = 0; k < n; k++) ref[k] = ((float *)oh.data)[k];
            char what[160];
            snprintf(what, sizeof what, "%s/%s: the device path (stand-in) vs the host decode", cases[i][0],
                     cases[i][1]);
            EXPECT_CLOSE(what, odv.data, ref, n, 0);
            free(ref);
            t_note("  %-13s %-9s stand-in device: peak %lld bytes (plan: weights %lld + buffers %lld), %lld "
                   "kept",
                   cases[i][1], cases[i][0], (long long)t_sd_peak, (long long)m.dev_weights,
                   (long long)m.dev_buffers, (long long)t_sd_used);
            CHECK(t_sd_peak == m.dev_weights + m.dev_buffers && t_sd_used == m.dev_weights,
                  "%s/%s: peak %lld, kept %lld; plan weights %lld + buffers %lld", cases[i][0], cases[i][1],
                  (long long)t_sd_peak, (long long)t_sd_used, (long long)m.dev_weights,
                  (long long)m.dev_buffers);
            CHECK_OK(
                h3_audio_vae_decode(vd, &g_ex, &lat, &odv)); /* the weights stay: nothing is uploaded again */
            CHECK(t_sd_used == m.dev_weights, "a second decode left %lld bytes", (long long)t_sd_used);
            CHECK_OK(h3_audio_vae_set_placement(vd, H3_PLACE_HOST));
            CHECK(t_sd_used == 0, "%lld bytes left after the placement back to the host",
                  (long long)t_sd_used);
        }
        h3_tensor_free(&lat);
        h3_tensor_free(&oh);
        h3_tensor_free(&odv);
        h3_audio_vae_close(vh);
        h3_audio_vae_close(vd);
    }
    t_standin_end(&g_ex);
}

/* Decodes fixture `name` with the `kind` file on the GPU (activations and weights there, every channel in one
 * batch) and on the CPU: GPU vs CPU within 1e-5 relative L2 (f32 both; cuBLAS and OpenBLAS sum in other
 * orders), GPU vs the float64 reference within 1e-4 (the CPU's tolerance). The device memory equals the plan:
 * a fresh decoder's first decode peaks at weights + buffers + the largest op scratch and keeps the weights; a
 * second one peaks at buffers + scratch over them; a placement back to the host gives the weights back. */
static void cuda_case(h3_exec *ex, const char *kind, const char *name) {
    char mp[700], cp[700], file[128];
    snprintf(file, sizeof file, "case_%s.safetensors", name);
    h3_audio_vae *vh = NULL, *vd = NULL;
    h3_audio_vae_opts od = {.act_place = H3_PLACE_DEVICE};
    h3_tensor lat = {0}, ref = {0}, oh = {0}, od1 = {0}, od2 = {0};
    CHECK_OK(h3_audio_vae_open(model_path(kind, mp, sizeof mp), NULL, &vh));
    CHECK_OK(h3_audio_vae_open(model_path(kind, mp, sizeof mp), &od, &vd));
    CHECK_OK(load_f32(fx(file, cp, sizeof cp), "latents", &lat));
    CHECK_OK(load_f32(fx(file, cp, sizeof cp), "waveform", &ref));
    if (!vh || !vd || !lat.data || !ref.data) goto done;
    const h3_audio_vae_config *c = h3_audio_vae_get_config(vd);
    h3_tensor *outs[3] = {&oh, &od1, &od2};
    for (int i = 0; i < 3; i++)
        CHECK_OK(h3_tensor_alloc(outs[i], H3_PLACE_HOST, H3_F32, ref.ndim, ref.shape, H3_MEM_OTHER));
    int64_t ch = lat.ndim == 3 ? lat.shape[0] : 1, T = lat.shape[lat.ndim - 1];
    h3_audio_vae_mem m;
    CHECK_OK(h3_audio_vae_decode_peak(c, T, ch, &m));
    CHECK_OK(h3_audio_vae_decode(vh, ex, &lat, &oh));
    int64_t used0, used1, used2, peak1, peak2;
    h3_cuda_mem_stats(ex, &used0, NULL, NULL);
    h3_cuda_reset_peak(ex);
    CHECK_OK(h3_audio_vae_decode(vd, ex, &lat, &od1));
    h3_cuda_mem_stats(ex, &used1, &peak1, NULL);
    h3_cuda_reset_peak(ex);
    CHECK_OK(h3_audio_vae_decode(vd, ex, &lat, &od2));
    h3_cuda_mem_stats(ex, &used2, &peak2, NULL);
    t_note("  %-13s %-9s [%lld, 32, %lld] device bytes: first decode peak %lld (plan %lld: weights %lld + "
           "buffers "
           "%lld + op scratch %lld), resident after %lld, second decode peak %lld over them",
           name, kind, (long long)ch, (long long)T, (long long)(peak1 - used0), (long long)m.dev_total,
           (long long)m.dev_weights, (long long)m.dev_buffers, (long long)m.dev_op_scratch,
           (long long)(used1 - used0), (long long)(peak2 - used1));
    CHECK(peak1 - used0 == m.dev_total, "%s/%s: first device decode peaked at %lld bytes, the plan says %lld",
          kind, name, (long long)(peak1 - used0), (long long)m.dev_total);
    CHECK(used1 - used0 == m.dev_weights, "%s/%s: %lld bytes stay after the decode, the weights are %lld",
          kind, name, (long long)(used1 - used0), (long long)m.dev_weights);
    CHECK(used2 == used1 && peak2 - used1 == m.dev_buffers + m.dev_op_scratch,
          "%s/%s: second decode peaked at %lld over the weights (plan %lld), left %lld", kind, name,
          (long long)(peak2 - used1), (long long)(m.dev_buffers + m.dev_op_scratch),
          (long long)(used2 - used1));
    size_t n = (size_t)h3_tensor_numel(&ref);
    double *rh = malloc(n * sizeof *rh), *rr = malloc(n * sizeof *rr);
    for (size_t i = 0; i < n; i++) rh[i] = ((float *)oh.data)[i], rr[i] = ((float *)ref.data)[i];
    char what[160];
    snprintf(what, sizeof what, "%s/%s: GPU vs CPU decode", kind, name);
    double e1 = EXPECT_CLOSE(what, od1.data, rh, n, 1e-5);
    snprintf(what, sizeof what, "%s/%s: GPU vs the float64 reference", kind, name);
    double e2 = EXPECT_CLOSE(what, od1.data, rr, n, 1e-4);
    snprintf(what, sizeof what, "%s/%s: second GPU decode vs the first", kind, name);
    for (size_t i = 0; i < n; i++) rh[i] = ((float *)od1.data)[i];
    EXPECT_CLOSE(what, od2.data, rh, n, 0);
    for (size_t i = 0; i < n; i++) rh[i] = ((float *)oh.data)[i];
    t_note(
        "  %-13s %-9s GPU vs CPU: rel err %.2e, max abs %.2e; GPU vs reference: rel err %.2e, max abs %.2e",
        name, kind, e1, t_max_abs_err(od1.data, rh, n), e2, t_max_abs_err(od1.data, rr, n));
    free(rh);
    free(rr);
    CHECK_OK(h3_audio_vae_set_placement(vd, H3_PLACE_HOST));
    h3_cuda_mem_stats(ex, &used2, NULL, NULL);
    CHECK(used2 == used0, "%s/%s: %lld device bytes left after the placement back to the host", kind, name,
          (long long)(used2 - used0));
done:
    h3_tensor_free(&lat);
    h3_tensor_free(&ref);
    h3_tensor_free(&oh);
    h3_tensor_free(&od1);
    h3_tensor_free(&od2);
    h3_audio_vae_close(vh);
    h3_audio_vae_close(vd);
}

/* Every fixture case on the GPU (cuda_case). Skips without a GPU. */
static void test_cuda(void) {
    if (h3_cuda_device_count() == 0) {
        t_note("  skipped: no CUDA device on this machine (%s)",
               h3_cuda_compiled() ? "CUDA backend compiled" : "built without CUDA");
        return;
    }
    h3_exec ex;
    CHECK_OK(h3_exec_init(&ex, 2));
    h3_status st = h3_cuda_init(&ex, 0, (int64_t)2 << 30);
    CHECK_OK(st);
    if (st == H3_OK) {
        cuda_case(&ex, "official", "stereo");
        cuda_case(&ex, "official", "mono");
        cuda_case(&ex, "diffusers", "stereo");
        cuda_case(&ex, "comfy", "comfy_stereo");
        h3_cuda_shutdown(&ex);
    }
    h3_exec_free(&ex);
}

static void test_malformed_latents(void) {
    char mp[700];
    h3_audio_vae *v = NULL;
    CHECK_OK(h3_audio_vae_open(model_path("official", mp, sizeof mp), NULL, &v));
    if (!v) return;
    const h3_audio_vae_config *c = h3_audio_vae_get_config(v);
    struct {
        int nd;
        int64_t s[4];
        h3_dtype dt;
        const char *needle;
    } bad[] = {
        {3, {2, 24, 5}, H3_F32, "have 24 channels; this audio VAE takes 32"},
        {4, {1, 2, 32, 5}, H3_F32, "[channels, C, T] or [C, T]"},
        {3, {2, 32, 5}, H3_F16, "f32"},
        {3, {0, 32, 5}, H3_F32, "[0, 32, 5] hold no values"},
        {3, {2, 32, 0}, H3_F32, "[2, 32, 0] hold no values"},
        {3, {17, 32, 5}, H3_F32, "1 to 16 channels"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        h3_tensor z;
        CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, bad[i].dt, bad[i].nd, bad[i].s, H3_MEM_OTHER));
        CHECK_ERR(h3_audio_vae_check_latents(c, &z), H3_ERR_INVALID, bad[i].needle);
        CHECK_ERR(h3_audio_vae_decode(v, &g_ex, &z, &z), H3_ERR_INVALID, bad[i].needle);
        h3_tensor_free(&z);
    }
    int64_t s[3] = {2, 32, 3}, ws[2] = {2, 2399};
    h3_tensor z, y;
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&y, H3_PLACE_HOST, H3_F32, 2, ws, H3_MEM_OTHER));
    memset(z.data, 0, (size_t)h3_tensor_nbytes(&z));
    CHECK_ERR(h3_audio_vae_decode(v, &g_ex, &z, &y), H3_ERR_INVALID, "[2, 2400] or [2, 1, 2400]");
    h3_tensor_free(&z);
    h3_tensor_free(&y);
    h3_audio_vae_close(v);
}

/* A copy of the official model with one tensor dropped or reshaped, or a broken config: clear errors, no
 * leaks. */
static void test_bad_files(void) {
    char src[700], dir[800], p[900];
    model_path("official", src, sizeof src);
    snprintf(dir, sizeof dir, "%s/bad", g_dir);
    mkdir(dir, 0755);
    h3_audio_vae *v = NULL;
    CHECK_ERR(h3_audio_vae_open("/nonexistent/audio_vae", NULL, &v), H3_ERR_NOT_FOUND, "no such file");
    CHECK_ERR(h3_audio_vae_open(dir, NULL, &v), H3_ERR_NOT_FOUND, "no audio VAE here");
    char a[900], b[900];
    for (int i = 0; i < 2; i++) {
        const char *f = i ? "metadata.json" : "config.json";
        snprintf(a, sizeof a, "%s/%s", src, f);
        snprintf(b, sizeof b, "%s/%s", dir, f);
        copy_file(a, b);
    }
    snprintf(a, sizeof a, "%s/model.safetensors", src);
    h3_st_set s;
    CHECK_OK(h3_st_open(a, &s));
    const char *drop = "decoder.resblocks.4.activations.3.act.beta";
    const char *reshape = "decoder.ups.2.0.weight_v";
    for (int round = 0; round < 3 && s.entries; round++) {
        h3_st_writer *w = NULL;
        CHECK_OK(h3_st_writer_new(&w));
        h3_tensor *keep = calloc((size_t)s.n_entries, sizeof *keep);
        for (int64_t i = 0; i < s.n_entries; i++) {
            const char *n = s.entries[i].name;
            if (round == 0 && !strcmp(n, drop)) continue;
            CHECK_OK(h3_st_tensor(&s, &s.entries[i], &keep[i]));
            if (round == 1 && !strcmp(n, reshape)) {
                int64_t sh[3] = {keep[i].shape[1], keep[i].shape[0], keep[i].shape[2]};
                CHECK_OK(h3_st_writer_add(w, n, H3_F32, 3, sh, keep[i].data));
            } else {
                CHECK_OK(h3_st_writer_add_tensor(w, n, &keep[i]));
            }
        }
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        CHECK_OK(h3_st_writer_write(w, p, 0));
        h3_st_writer_free(w);
        for (int64_t i = 0; i < s.n_entries; i++) h3_tensor_free(&keep[i]);
        free(keep);
        if (round == 2) {
            snprintf(p, sizeof p, "%s/config.json", dir);
            FILE *f = fopen(p, "wb");
            if (f) {
                fputs("{\"latent_channels\": 32, \"sample_rate\": 32000, \"latents_mean\": [1, 2, 3]}", f);
                fclose(f);
            }
        }
        h3_mem_stats m0, m1;
        h3_mem_get_stats(&m0);
        if (round == 0)
            CHECK_ERR(h3_audio_vae_open(dir, NULL, &v), H3_ERR_FORMAT,
                      "'decoder.resblocks.4.activations.3.act.beta' is missing");
        if (round == 1)
            CHECK_ERR(h3_audio_vae_open(dir, NULL, &v), H3_ERR_FORMAT,
                      "'decoder.ups.2.0.weight_v' has shape [16, 32, 4]; BigVGAN stage 2 needs [channels in, "
                      "channels in / 2, kernel] = [32, 16, 4]");
        if (round == 2)
            CHECK_ERR(h3_audio_vae_open(dir, NULL, &v), H3_ERR_FORMAT,
                      "\"latents_mean\" must be a list of 32 numbers");
        CHECK(v == NULL, "no handle on failure");
        h3_mem_get_stats(&m1);
        CHECK(m0.total_current == m1.total_current, "round %d leaked %lld bytes", round,
              (long long)(m1.total_current - m0.total_current));
    }
    h3_st_close(&s);
}

/* A diffusers folder saved with diffusers' defaults has "latents_mean": null and "latents_std": null.
 * diffusers reads them as None; its decode step then builds a tensor from them (torch.tensor(None) raises),
 * so no diffusers pipeline decodes with such a folder either. h3run refuses it with a message that says null
 * and what to give (it said "must be a list of 32 numbers"). Absent keys are the same None to diffusers. */
static void test_null_statistics(void) {
    char src[700], dir[800], p[900], wsrc[900];
    model_path("diffusers", src, sizeof src);
    snprintf(dir, sizeof dir, "%s/nullstats", g_dir);
    mkdir(dir, 0755);
    snprintf(wsrc, sizeof wsrc, "%s/diffusion_pytorch_model.safetensors", src);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    CHECK(symlink(wsrc, p) == 0 || access(p, F_OK) == 0, "symlink %s", p);
    json_t *cfg = NULL;
    snprintf(p, sizeof p, "%s/config.json", src);
    CHECK_OK(h3_json_load_file(p, 1 << 20, &cfg));
    if (!cfg) return;
    snprintf(p, sizeof p, "%s/config.json", dir);
    static const struct {
        int drop; /* 0: null, 1: absent */
        const char *needle;
    } cases[] = {{0, "\"latents_mean\" is null: the config records no latent normalization"},
                 {1, "\"latents_mean\" is missing"}};
    for (int k = 0; k < 2; k++) {
        if (cases[k].drop) {
            json_object_del(cfg, "latents_mean");
            json_object_del(cfg, "latents_std");
        } else {
            json_object_set_new(cfg, "latents_mean", json_null());
            json_object_set_new(cfg, "latents_std", json_null());
        }
        CHECK(json_dump_file(cfg, p, 0) == 0, "writing %s", p);
        h3_audio_vae *v = NULL;
        CHECK_ERR(h3_audio_vae_open(dir, NULL, &v), H3_ERR_FORMAT, cases[k].needle);
        CHECK(v == NULL, "no handle");
    }
    json_decref(cfg);
}

/* Allocation n of open (and of decode) fails, for every n up to 60 and then every 53rd (the decode: up to
 * 100, then every 47th): the per-tensor loops repeat the same allocation sites, and trying every point takes
 * too long under the sanitizers. Every failure returns an error and leaks nothing; past the last allocation
 * the call succeeds. */
static void test_alloc_failures(void) {
    const char *kinds[3] = {"official", "diffusers", "comfy"};
    for (int k = 0; k < 3; k++) {
        char p[700];
        model_path(kinds[k], p, sizeof p);
        h3_mem_stats base;
        h3_mem_get_stats(&base);
        int n, ok = 0, tried = 0;
        for (n = 1; n < 1000000 && !ok; n += n < 60 ? 1 : 53, tried++) {
            h3_audio_vae *v = NULL;
            h3_mem_fail_at(n, 0);
            h3_clear_error();
            int64_t failed0 = h3_mem_failed_count();
            h3_status st = h3_audio_vae_open(p, NULL, &v);
            int64_t ticks = h3_mem_fail_at(0, 0);
            if (st == H3_OK) {
                ok = 1;
                CHECK(ticks < n, "%s: open succeeded although allocation %d failed", kinds[k], n);
                h3_audio_vae_close(v);
            } else {
                CHECK(v == NULL, "no handle on failure");
                CHECK(st == H3_ERR_NOMEM || h3_mem_failed_count() > failed0, "%s, failing allocation %d: %s",
                      kinds[k], n, h3_last_error());
            }
            h3_mem_stats now;
            h3_mem_get_stats(&now);
            CHECK(now.total_current == base.total_current, "%s, failing allocation %d leaked %lld bytes",
                  kinds[k], n, (long long)(now.total_current - base.total_current));
        }
        CHECK(ok, "%s never opened", kinds[k]);
        t_note("  open %-9s: %d failing allocations tried, up to the %dth", kinds[k], tried - 1, n);
    }
    char p[700];
    h3_audio_vae *v = NULL;
    CHECK_OK(h3_audio_vae_open(model_path("official", p, sizeof p), NULL, &v));
    if (!v) return;
    int64_t s[3] = {2, 32, 2}, ws[3] = {2, 1, 1600};
    h3_tensor z, y;
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&y, H3_PLACE_HOST, H3_F32, 3, ws, H3_MEM_OTHER));
    t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
    h3_mem_stats base;
    h3_mem_get_stats(&base);
    int n, ok = 0, tried = 0;
    for (n = 1; n < 1000000 && !ok; n += n < 100 ? 1 : 47, tried++) {
        h3_mem_fail_at(n, 0);
        h3_clear_error();
        h3_status st = h3_audio_vae_decode(v, &g_ex, &z, &y);
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
    t_note("  decode: %d failing allocations tried, up to the %dth", tried - 1, n);
    h3_tensor_free(&z);
    h3_tensor_free(&y);
    h3_audio_vae_close(v);
}

/* ---- WAV
 * ---------------------------------------------------------------------------------------------------- */

static uint32_t rd32le(const uint8_t *p) {
    return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t rd16le(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

/* The RIFF header fields by the format's definition, and every sample: round(clamp(x)·32767), left and right
 * interleaved from the two planes the decoder produces. */
static void test_wav(void) {
    int64_t frames = 3001;
    float *x = malloc((size_t)frames * 2 * sizeof *x); /* [2, frames]: left plane, then right */
    for (int64_t i = 0; i < frames * 2; i++) x[i] = (float)t_uniform(-1.2, 1.2);
    x[0] = 1.0f, x[frames] = -1.0f, x[1] = 0.5f / 32767.0f, x[frames + 1] = NAN;
    char path[600];
    t_tmp_path("avae.wav", path, sizeof path);
    CHECK_OK(h3_wav_write(path, x, x + frames, frames, 2, 32000));
    char *f = NULL;
    size_t len = 0;
    CHECK_OK(h3_read_file(path, 1 << 24, &f, &len));
    const uint8_t *b = (const uint8_t *)f;
    CHECK(f && len == 44 + (size_t)frames * 4, "%zu bytes", len);
    if (f && len >= 44) {
        CHECK(!memcmp(b, "RIFF", 4) && rd32le(b + 4) == len - 8 && !memcmp(b + 8, "WAVEfmt ", 8),
              "RIFF/WAVE");
        CHECK(rd32le(b + 16) == 16 && rd16le(b + 20) == 1 && rd16le(b + 22) == 2 && rd32le(b + 24) == 32000 &&
                  rd32le(b + 28) == 128000 && rd16le(b + 32) == 4 && rd16le(b + 34) == 16,
              "fmt: PCM, 2 channels, 32 kHz, 16 bits");
        CHECK(!memcmp(b + 36, "data", 4) && rd32le(b + 40) == (uint32_t)(frames * 4), "data chunk");
        int bad = 0;
        for (int64_t i = 0; i < frames * 2 && 44 + 2 * (size_t)i + 1 < len; i++) {
            float xi = x[(i % 2) * frames + i / 2];
            double v = xi != xi ? 0.0 : xi > 1 ? 1 : xi < -1 ? -1 : xi;
            long want = lrint(v * 32767.0);
            int16_t got = (int16_t)rd16le(b + 44 + 2 * i);
            bad += got != want;
        }
        CHECK(bad == 0, "%d samples differ from round(clamp(x)·32767)", bad);
        CHECK((int16_t)rd16le(b + 44) == 32767 && (int16_t)rd16le(b + 46) == -32767 && rd16le(b + 50) == 0,
              "ends, NaN");
    }
    CHECK_ERR(h3_wav_write(path, x, x + frames, frames, 0, 32000), H3_ERR_INVALID, "bad WAV request");
    unlink(path);
    h3_free(f);
    free(x);
}

/* --compare-pcm RAW REF: an s16le dump of a WAV (ffmpeg) against the fixture waveform [ch, 1, S] interleaved
 * as round(clamp(x)·32767): at most 1 off (float rounding), 99% exact. */
static int cmd_compare_pcm(char **argv) {
    h3_tensor w = {0};
    char *raw = NULL;
    size_t len = 0;
    if (load_f32(argv[3], "waveform", &w) != H3_OK || h3_read_file(argv[2], 1 << 28, &raw, &len) != H3_OK) {
        fprintf(stderr, "compare-pcm: %s\n", h3_last_error());
        return 1;
    }
    int64_t ch = w.shape[0], S = w.shape[2], exact = 0, worst = 0;
    int r = 1;
    if ((int64_t)len != ch * S * 2) {
        fprintf(stderr, "compare-pcm: %zu bytes for %lld × %lld samples\n", len, (long long)ch, (long long)S);
    } else {
        const uint8_t *b = (const uint8_t *)raw;
        for (int64_t i = 0; i < S; i++)
            for (int64_t c = 0; c < ch; c++) {
                double x = ((float *)w.data)[c * S + i];
                x = x > 1 ? 1 : x < -1 ? -1 : x;
                long want = lrint(x * 32767.0),
                     got = (int16_t)(b[2 * (i * ch + c)] | b[2 * (i * ch + c) + 1] << 8);
                long d = labs(want - got);
                exact += d == 0;
                worst = d > worst ? d : worst;
            }
        printf("%lld of %lld samples exact, worst off by %lld\n", (long long)exact, (long long)(ch * S),
               (long long)worst);
        r = (worst <= 1 && exact * 100 >= ch * S * 99) ? 0 : 1;
    }
    h3_free(raw);
    h3_tensor_free(&w);
    return r;
}

/* ---- the weight table's contract: every tensor, one at a time
 * ------------------------------------------------ */

static h3_status av_load(const char *path, void *user) {
    (void)user;
    h3_audio_vae *v = NULL;
    h3_status st = h3_audio_vae_open(path, NULL, &v);
    h3_audio_vae_close(v);
    return st;
}

/* The sweep's selection (each open reads and folds every weight, and the models hold about 1,000 tensors):
 * every tensor of the decoder as a whole (dec_in_proj, conv_pre, conv_post, activation_post, the latents
 * statistics) and of BigVGAN stage 0's upsampler and first AMP block (weight_g/weight_v or folded weights,
 * biases, SnakeBeta's alpha and beta, the resampling filters), which covers every kind of tensor the decoder
 * reads. */
static int av_select(const char *name, t_mutation m, void *user) {
    (void)m;
    (void)user;
    static const char *const pre[] = {"dec_in_proj.",
                                      "decoder.conv_pre.",
                                      "decoder.conv_post.",
                                      "decoder.activation_post.",
                                      "latents_",
                                      "decoder.ups.0.",
                                      "decoder.resblocks.0.convs1.0.",
                                      "decoder.resblocks.0.convs2.0.",
                                      "decoder.resblocks.0.activations.0."};
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++)
        if (h3_str_starts_with(name, pre[i])) return 0;
    return -1;
}

/* Those tensors emptied, truncated, reshaped and retyped (official; one mutation per tensor in turn for the
 * other two layouts): refused in the binder's one message form, never a crash. */
static void test_weight_sweep(void) {
    const char *kinds[3] = {"official", "diffusers", "comfy"};
    for (int i = 0; i < 3; i++) {
        char p[700];
        t_sweep(kinds[i], model_path(kinds[i], p, sizeof p), av_load, av_select, NULL, i > 0);
    }
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--compare-pcm")) return cmd_compare_pcm(argv);
    if (argc == 4 && !strcmp(argv[1], "--write-model")) {
        h3_status st = write_model(argv[2], argv[3]);
        if (st != H3_OK) fprintf(stderr, "test_audio_vae: %s\n", h3_last_error());
        return st == H3_OK ? 0 : 1;
    }
    static const t_case cases[] = {
        {"fixtures", test_fixtures},
        {"encode", test_encode},
        {"encode_cuda", test_encode_cuda},
        {"filters", test_filters},
        {"memory", test_memory},
        {"placement", test_placement},
        {"headers_only", test_headers_only},
        {"standin_device", test_standin_device},
        {"cuda", test_cuda},
        {"malformed_latents", test_malformed_latents},
        {"bad_files", test_bad_files},
        {"null_statistics", test_null_statistics},
        {"weight_sweep", test_weight_sweep},
        {"alloc_failures", test_alloc_failures},
        {"wav", test_wav},
        {NULL, NULL},
    };
    if (h3_exec_init(&g_ex, 2) != H3_OK) return 1;
    t_tmp_path("avae", g_dir, sizeof g_dir);
    mkdir(g_dir, 0755);
    const char *kinds[3] = {"official", "diffusers", "comfy"};
    for (int i = 0; i < 3; i++) {
        char p[700];
        if (write_model(kinds[i], model_path(kinds[i], p, sizeof p)) != H3_OK) {
            fprintf(stderr, "test_audio_vae: writing the %s model: %s\n", kinds[i], h3_last_error());
            return 1;
        }
    }
    int r = t_main("test_audio_vae", cases, argc, argv);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) r = 1;
    h3_exec_free(&g_ex);
    return r;
}

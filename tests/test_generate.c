/* h3_generate with the reduced model of tools/h3-tinymodel:
 *  - the component finder on the official, diffusers-named, repository-root and ComfyUI folders, with the
 * messages of folders that lack a part;
 *  - the pipeline's latents against the same request composed here from the components' own APIs (tokenizer,
 * text encoder, layout, noise, schedule, sampler, a DiT forward that computes its modulation per call instead
 * of the pipeline's precomputed table): relative L2 <= 1e-5 (the two differ only in how the AdaLN GEMMs are
 * batched);
 *  - the WAV and the PNG frames against the VAEs run here on the saved latents: exact (16-bit samples
 *    round(clamp(x)*32767) in double; 8-bit levels as numpy rounds float32 x*255), frame for frame;
 *  - a stop requested in each stage: H3_ERR_INTERRUPTED, no file left (not even a .partial), no memory held;
 *  - bad requests: H3_ERR_INVALID naming the fix before anything is written;
 *  - a session (pipeline/session.h): runs reuse what the first kept and give the same latents; a check plans
 * without writing;
 *  - allocation failures across the whole run (every allocation of the first ones, then a spread): an error,
 * no leak, no file;
 *  - on a GPU (skipped without one; tests/gpu/run.sh generate runs it): every stage planned on the device
 * and run there inside one backend brought up once, each giving back all it took, its measured device peak
 * within 5% of its plan's and within the budget; the latents against the CPU's, relative L2 <= 5e-2 (bf16
 * activations through every step). Needs ffmpeg for the PNG read-back (scripts/deps.sh installs it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "models/audio_vae.h"
#include "models/dit.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"
#include "pipeline/generate.h"
#include "pipeline/layout.h"
#include "pipeline/media.h"
#include "pipeline/session.h"
#include "sample/rng.h"
#include "sample/sampler.h"
#include "testutil.h"

static char g_tiny[600], g_comfy[600], g_dir[600];

static int exists(const char *p) {
    return access(p, F_OK) == 0;
}

static void sh(const char *fmt, const char *a, const char *b) {
    char cmd[2000];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    CHECK(system(cmd) == 0, "%s", cmd);
}

/* The reduced models, written once per run by the tool. */
static int make_models(void) {
    const char *build = getenv("H3_BUILD_DIR");
    char tool[700], cmd[2000];
    snprintf(tool, sizeof tool, "%s/h3-tinymodel", build ? build : ".");
    t_tmp_path("gen", g_dir, sizeof g_dir);
    mkdir(g_dir, 0755);
    snprintf(g_tiny, sizeof g_tiny, "%s/tiny", g_dir);
    snprintf(g_comfy, sizeof g_comfy, "%s/comfy", g_dir);
    snprintf(cmd, sizeof cmd, "'%s' '%s' >/dev/null && '%s' --layout comfy '%s' >/dev/null", tool, g_tiny,
             tool, g_comfy);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot write the reduced models with %s\n", tool);
        return 0;
    }
    return 1;
}

static const char *path_in(const char *name, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", g_dir, name);
    return buf;
}

/* ---- the component finder ------------------------------------------------------------------------------ */

static void expect_found(const char *model, const char *layout, const char *dit_suffix,
                         const char *vvae_suffix) {
    h3_model_files f;
    h3_status st = h3_model_files_find(model, NULL, &f);
    CHECK(st == H3_OK, "%s: %s", model, h3_last_error());
    if (st != H3_OK) return;
    CHECK(!strcmp(f.layout, layout), "%s: layout %s, expected %s", model, f.layout, layout);
    size_t a = strlen(f.dit), b = strlen(dit_suffix), c = strlen(f.video_vae), d = strlen(vvae_suffix);
    CHECK(a >= b && !strcmp(f.dit + a - b, dit_suffix), "%s: DiT %s", model, f.dit);
    CHECK(c >= d && !strcmp(f.video_vae + c - d, vvae_suffix), "%s: video VAE %s", model, f.video_vae);
    CHECK(f.text_encoder && f.tokenizer && f.audio_vae, "%s: a component is missing", model);
    h3_model_files_free(&f);
}

static void test_model_files(void) {
    char p[700], q[700], models[700];
    expect_found(g_tiny, "official", "/transformer", "/video_vae");
    /* diffusers folder names: vae/ for the video VAE */
    path_in("diffusers", p, sizeof p);
    mkdir(p, 0755);
    sh("ln -sfn '%s/transformer' '%s/transformer'", g_tiny, p);
    sh("ln -sfn '%s/text_encoder' '%s/text_encoder'", g_tiny, p);
    sh("ln -sfn '%s/tokenizer' '%s/tokenizer'", g_tiny, p);
    sh("ln -sfn '%s/audio_vae' '%s/audio_vae'", g_tiny, p);
    sh("ln -sfn '%s/video_vae' '%s/vae'", g_tiny, p);
    expect_found(p, "diffusers", "/transformer", "/vae");
    /* the repository root without the diffusers layout stands for FL2VA/ */
    path_in("repo", q, sizeof q);
    mkdir(q, 0755);
    sh("ln -sfn '%s' '%s/FL2VA'", g_tiny, q);
    expect_found(q, "official", "/FL2VA/transformer", "/FL2VA/video_vae");
    /* ComfyUI: recognized by tensor names; with a Ref2VA DiT and a quantized-looking name beside it, FL2VA
     * wins */
    snprintf(models, sizeof models, "%s/models", g_comfy);
    expect_found(models, "ComfyUI", "minimax_h3_fl2va_tiny_bf16.safetensors",
                 "minimax_h3_video_vae_tiny_fp16.safetensors");
    sh("cp '%s/models/diffusion_models/minimax_h3_fl2va_tiny_bf16.safetensors' "
       "'%s/models/diffusion_models/a_minimax_h3_ref2va_tiny_bf16.safetensors'",
       g_comfy, g_comfy);
    expect_found(models, "ComfyUI", "minimax_h3_fl2va_tiny_bf16.safetensors",
                 "minimax_h3_video_vae_tiny_fp16.safetensors");
    snprintf(p, sizeof p, "%s/models/diffusion_models/a_minimax_h3_ref2va_tiny_bf16.safetensors", g_comfy);
    unlink(p);

    /* Missing parts: H3_ERR_NOT_FOUND naming the part, where it was expected and the option that supplies it.
     */
    h3_model_files f;
    path_in("noaudio", p, sizeof p);
    mkdir(p, 0755);
    sh("ln -sfn '%s/transformer' '%s/transformer'", g_tiny, p);
    sh("ln -sfn '%s/text_encoder' '%s/text_encoder'", g_tiny, p);
    sh("ln -sfn '%s/tokenizer' '%s/tokenizer'", g_tiny, p);
    sh("ln -sfn '%s/video_vae' '%s/video_vae'", g_tiny, p);
    CHECK_ERR(h3_model_files_find(p, NULL, &f), H3_ERR_NOT_FOUND,
              "has no audio VAE: expected audio_vae/; download it from the release or give --audio-vae PATH");
    h3_model_files given;
    memset(&given, 0, sizeof given);
    snprintf(q, sizeof q, "%s/audio_vae", g_tiny);
    given.audio_vae = q;
    h3_status st = h3_model_files_find(p, &given, &f); /* the given part fills the gap */
    CHECK(st == H3_OK, "%s", h3_last_error());
    if (st == H3_OK) {
        CHECK(!strcmp(f.audio_vae, q), "given audio VAE %s", f.audio_vae);
        h3_model_files_free(&f);
    }
    CHECK_ERR(h3_model_files_find(g_dir, NULL, &f), H3_ERR_NOT_FOUND, "is not an H3 model folder");
    path_in("nowhere", p, sizeof p);
    CHECK_ERR(h3_model_files_find(p, NULL, &f), H3_ERR_INVALID, "no such folder");
    snprintf(p, sizeof p, "%s/tokenizer/tokenizer.json", g_tiny);
    CHECK_ERR(h3_model_files_find(p, NULL, &f), H3_ERR_INVALID, "is a file; it takes a folder");
    CHECK_ERR(h3_model_files_find(NULL, NULL, &f), H3_ERR_INVALID, "--model is required");
    /* Everything given, no folder. */
    char d[700], t[700], k[700], v[700], a[700];
    snprintf(d, sizeof d, "%s/transformer", g_tiny);
    snprintf(t, sizeof t, "%s/text_encoder", g_tiny);
    snprintf(k, sizeof k, "%s/tokenizer/tokenizer.json", g_tiny);
    snprintf(v, sizeof v, "%s/video_vae", g_tiny);
    snprintf(a, sizeof a, "%s/audio_vae", g_tiny);
    h3_model_files all = {d, t, k, v, a, NULL, NULL};
    st = h3_model_files_find(NULL, &all, &f);
    CHECK(st == H3_OK, "%s", h3_last_error());
    if (st == H3_OK) {
        CHECK(!strcmp(f.layout, "given") && !strcmp(f.tokenizer, k), "all given: %s", f.layout);
        h3_model_files_free(&f);
    }
}

/* ---- the pipeline against its parts -------------------------------------------------------------------- */

typedef struct {
    h3_dit *dit;
    h3_exec *ex;
    h3_seq_layout *L;
    h3_tensor *text;
    int32_t *tidx, *tags, *vi, *ai, *ti;
} ref_ctx;

/* The DiT as the reference calls it: no modulation kept, each forward computes its own timesteps' rows. */
static h3_status ref_model(void *user, const float *xv, const float *xa, float tv, float ta, float *vv,
                           float *va) {
    ref_ctx *c = user;
    float u[4];
    int nt = h3_seq_layout_timestep_indices(c->L, tv, ta, u, c->tidx);
    h3_tensor a, b, o1, o2;
    int64_t sv[2] = {c->L->n_video_rows, 96}, sa[2] = {c->L->n_audio_rows, 32};
    h3_tensor_wrap(&a, (void *)xv, H3_PLACE_HOST, H3_F32, 2, sv);
    h3_tensor_wrap(&b, (void *)xa, H3_PLACE_HOST, H3_F32, 2, sa);
    h3_tensor_wrap(&o1, vv, H3_PLACE_HOST, H3_F32, 2, sv);
    h3_tensor_wrap(&o2, va, H3_PLACE_HOST, H3_F32, 2, sa);
    h3_dit_inputs in = {&a,      &b,      c->text,   u,     nt,    c->L->seq_len,
                        c->tidx, c->tags, c->L->pos, c->vi, c->ai, c->ti};
    return h3_dit_forward(c->dit, c->ex, &in, &o1, &o2);
}

/* The request composed from the parts: latents video [24, T, H, W], audio [2, 32, T_a] (malloc'd). */
static void reference_latents(const h3_request *q, float **video, float **audio, int64_t *nv_out,
                              int64_t *na_out) {
    h3_exec ex;
    CHECK_OK(h3_exec_init(&ex, 2));
    h3_tokenizer *tok = NULL;
    h3_text_encoder *te = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer", g_tiny);
    CHECK_OK(h3_tokenizer_load(p, &tok));
    CHECK_OK(h3_tokenizer_encode(tok, q->prompt, &ids, &n));
    snprintf(p, sizeof p, "%s/text_encoder", g_tiny);
    CHECK_OK(h3_text_encoder_open(p, NULL, &te));
    h3_tensor hidden = {0};
    CHECK_OK(h3_tensor_alloc2(&hidden, H3_PLACE_HOST, H3_F32, n, h3_text_encoder_config(te)->hidden,
                              H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_text_encoder_encode(te, &ex, ids, n, 50, &hidden));
    h3_text_encoder_close(te);
    h3_seq_layout L;
    CHECK_OK(h3_seq_layout_t2va(n, NULL, q->frames, q->width, q->height, &L));
    h3_schedule s;
    CHECK_OK(h3_schedule_make(q->scheduler, q->steps, 12.0, 3.0, &s));
    int64_t nv = L.n_video_rows * 96, na = L.n_audio_rows * 32;
    float *lat = malloc((size_t)nv * 4), *rows = malloc((size_t)nv * 4), *arows = malloc((size_t)na * 4);
    h3_rng_t2va_noise(q->seed, lat, (size_t)nv, arows, (size_t)na);
    h3_video_patchify(lat, L.latent_t, L.latent_h, L.latent_w, rows);
    ref_ctx c = {NULL,
                 &ex,
                 &L,
                 &hidden,
                 malloc((size_t)L.seq_len * 4),
                 malloc((size_t)L.seq_len * 4),
                 malloc((size_t)L.n_video_rows * 4),
                 malloc((size_t)L.n_audio_rows * 4),
                 malloc((size_t)n * 4)};
    for (int64_t i = 0; i < L.seq_len; i++) c.tags[i] = L.tags[i];
    for (int64_t i = 0; i < L.n_video_rows; i++) c.vi[i] = (int32_t)L.video_indices[i];
    for (int64_t i = 0; i < L.n_audio_rows; i++) c.ai[i] = (int32_t)L.audio_indices[i];
    for (int64_t i = 0; i < n; i++) c.ti[i] = (int32_t)L.text_indices[i];
    snprintf(p, sizeof p, "%s/transformer", g_tiny);
    CHECK_OK(h3_dit_open(p, NULL, &c.dit));
    h3_sample_args sa = {q->sampler, &s, ref_model, &c, NULL, NULL, 0, 0};
    CHECK_OK(h3_sample(&sa, rows, (size_t)nv, arows, (size_t)na));
    h3_dit_stats ds;
    h3_dit_get_stats(c.dit, &ds);
    CHECK(ds.adaln_passes >= q->steps,
          "the reference computed modulation %lld times (once per forward expected)",
          (long long)ds.adaln_passes);
    h3_dit_close(c.dit);
    *video = malloc((size_t)nv * 4);
    *audio = malloc((size_t)na * 4);
    h3_video_unpatchify(rows, L.latent_t, L.latent_h, L.latent_w, *video);
    h3_audio_unpack(arows, L.audio_t, *audio);
    *nv_out = nv;
    *na_out = na;
    free(lat);
    free(rows);
    free(arows);
    free(c.tidx);
    free(c.tags);
    free(c.vi);
    free(c.ai);
    free(c.ti);
    h3_schedule_free(&s);
    h3_seq_layout_free(&L);
    h3_tensor_free(&hidden);
    h3_free(ids);
    h3_tokenizer_free(tok);
    h3_exec_free(&ex);
}

static uint8_t numpy_u8(float x) { /* numpy: (x * 255).round() on float32, x in [0, 1] */
    volatile float p = x * 255.0f;
    return (uint8_t)rint((double)p);
}

static void test_end_to_end(void) {
    static const char *const prompts[] = {
        "a harbor at sunrise, gulls over the boats",
        "A cat sits on a piano. <d>[English] Who is playing?</d>",
        "integrated_multimodal_description: [Shot 1] rain on a neon street"};
    static const int64_t sizes[][2] = {{128, 128}, {192, 96}, {96, 160}};
    static const h3_sampler samplers[] = {H3_SAMPLER_EULER, H3_SAMPLER_RES_MULTISTEP, H3_SAMPLER_DPMPP_2M};
    static const h3_scheduler scheds[] = {H3_SCHEDULER_H3, H3_SCHEDULER_SIMPLE, H3_SCHEDULER_BETA};
    int k = (int)(t_rand_u64() % 3);
    char mp4[700], wav[700], lat[700], png[700], p[800];
    h3_generate_request r;
    h3_generate_request_init(&r);
    r.req.prompt = prompts[k];
    r.req.frames = 22;
    r.req.width = sizes[k][0];
    r.req.height = sizes[k][1];
    r.req.steps = 5 + (int)(t_rand_u64() % 4);
    r.req.sampler = samplers[t_rand_u64() % 3];
    r.req.scheduler = scheds[t_rand_u64() % 3];
    r.req.seed = t_rand_u64() >> 12;
    r.model = g_tiny;
    r.output = path_in("e2e.mp4", mp4, sizeof mp4);
    r.wav = path_in("e2e.wav", wav, sizeof wav);
    r.latents = path_in("e2e.safetensors", lat, sizeof lat);
    r.png_dir = path_in("e2e_frames", png, sizeof png);
    r.device = H3_DEVICE_CPU;
    r.threads = 2;
    r.x264_preset = "ultrafast";
    t_note("  prompt %d, %lldx%lld, %d steps of %s on %s, seed %llu", k, (long long)r.req.width,
           (long long)r.req.height, r.req.steps, h3_sampler_name(r.req.sampler),
           h3_scheduler_name(r.req.scheduler), (unsigned long long)r.req.seed);
    h3_mem_stats m0, m1;
    h3_mem_get_stats(&m0);
    h3_generate_result res;
    CHECK_OK(h3_generate(&r, NULL, &res));
    h3_mem_get_stats(&m1);
    CHECK(m1.total_current == m0.total_current, "the run held %lld bytes after it returned",
          (long long)(m1.total_current - m0.total_current));
    CHECK(res.frames_written == 22 && res.audio_samples == 29333 && res.latent_t == 7 &&
              res.latent_h == r.req.height / 16 && res.audio_latents == 37,
          "result: %lld frames, %lld samples, latent T %lld H %lld, T_a %lld", (long long)res.frames_written,
          (long long)res.audio_samples, (long long)res.latent_t, (long long)res.latent_h,
          (long long)res.audio_latents);
    CHECK(res.seq_len == res.text_tokens + 74 + 7 * (r.req.height / 32) * (r.req.width / 32),
          "%lld packed rows", (long long)res.seq_len);
    /* The modulation table: one row set per distinct timestep of the schedule (both streams). */
    h3_schedule s;
    CHECK_OK(h3_schedule_make(r.req.scheduler, r.req.steps, 12.0, 3.0, &s));
    int distinct = 0;
    for (int i = 0; i < 2 * (s.n - 1); i++) {
        float t = i < s.n - 1 ? s.t_v[i] : s.t_a[i - (s.n - 1)];
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = (j < s.n - 1 ? s.t_v[j] : s.t_a[j - (s.n - 1)]) == t;
        distinct += !seen;
    }
    CHECK(res.modulation_timesteps == distinct, "%d timesteps precomputed, the schedule has %d distinct",
          res.modulation_timesteps, distinct);
    /* The step time excludes the first call and fits inside the DiT stage (it once counted from the clock's
     * zero). */
    if (r.req.steps > 1)
        CHECK(res.measured_step_s > 0 &&
                  res.measured_step_s * (r.req.steps - 1) <= res.stage_s[H3_GEN_DIT] + 1e-3,
              "%.3f s per model call after the first, %d calls, a DiT stage of %.3f s", res.measured_step_s,
              r.req.steps, res.stage_s[H3_GEN_DIT]);
    h3_schedule_free(&s);
    CHECK(exists(mp4) && exists(wav) && exists(lat), "outputs");
    snprintf(p, sizeof p, "%s.partial", mp4);
    CHECK(!exists(p), "a .partial was left");

    /* Latents: the pipeline against the parts composed here. */
    h3_st_set set;
    h3_tensor v = {0}, a = {0};
    CHECK_OK(h3_st_open(lat, &set));
    CHECK_OK(h3_st_load(&set, "video_latents", H3_PLACE_HOST, H3_F32, H3_MEM_IO, &v));
    CHECK_OK(h3_st_load(&set, "audio_latents", H3_PLACE_HOST, H3_F32, H3_MEM_IO, &a));
    h3_st_close(&set);
    float *rv = NULL, *ra = NULL;
    int64_t nv = 0, na = 0;
    h3_request q = r.req;
    reference_latents(&q, &rv, &ra, &nv, &na);
    if (v.data && a.data && h3_tensor_numel(&v) == nv && h3_tensor_numel(&a) == na) {
        double *dv = malloc((size_t)nv * sizeof(double)), *da = malloc((size_t)na * sizeof(double));
        for (int64_t i = 0; i < nv; i++) dv[i] = rv[i];
        for (int64_t i = 0; i < na; i++) da[i] = ra[i];
        EXPECT_CLOSE("video latents vs the composed parts", v.data, dv, (size_t)nv, 1e-5);
        EXPECT_CLOSE("audio latents vs the composed parts", a.data, da, (size_t)na, 1e-5);
        free(dv);
        free(da);
    } else {
        CHECK(0, "latents: %lld and %lld values, expected %lld and %lld", (long long)h3_tensor_numel(&v),
              (long long)h3_tensor_numel(&a), (long long)nv, (long long)na);
    }
    free(rv);
    free(ra);

    /* Sound: the audio VAE on the saved latents, trimmed to 22/24 s, as 16-bit samples. */
    h3_exec ex;
    CHECK_OK(h3_exec_init(&ex, 2));
    h3_audio_vae *av = NULL;
    snprintf(p, sizeof p, "%s/audio_vae", g_tiny);
    CHECK_OK(h3_audio_vae_open(p, NULL, &av));
    h3_tensor w = {0};
    int64_t S = 37 * 800;
    CHECK_OK(h3_tensor_alloc2(&w, H3_PLACE_HOST, H3_F32, 2, S, H3_MEM_IO));
    if (a.data) CHECK_OK(h3_audio_vae_decode(av, &ex, &a, &w));
    h3_audio_vae_close(av);
    char *file = NULL;
    size_t len = 0;
    CHECK_OK(h3_read_file(wav, 1 << 24, &file, &len));
    CHECK(len == 44 + 29333 * 4, "WAV of %zu bytes", len);
    int bad = 0;
    for (int64_t i = 0; file && len == 44 + 29333 * 4 && i < 29333; i++)
        for (int c = 0; c < 2; c++) {
            double x = ((float *)w.data)[c * S + i];
            x = x > 1 ? 1 : x < -1 ? -1 : x;
            int16_t got;
            memcpy(&got, file + 44 + 4 * i + 2 * c, 2);
            bad += got != (int16_t)lrint(x * 32767.0);
        }
    CHECK(bad == 0, "%d WAV samples differ from the audio VAE's output", bad);
    h3_free(file);
    h3_tensor_free(&w);

    /* Pictures: the video VAE on the saved latents, each frame against its PNG (read back by ffmpeg). */
    h3_video_vae *vv = NULL;
    snprintf(p, sizeof p, "%s/video_vae", g_tiny);
    CHECK_OK(h3_video_vae_open(p, NULL, &vv));
    int64_t W = r.req.width, H = r.req.height;
    h3_tensor frames = {0};
    int64_t fs[4] = {3, 22, H, W};
    CHECK_OK(h3_tensor_alloc(&frames, H3_PLACE_HOST, H3_F32, 4, fs, H3_MEM_IO));
    h3_video_decode_out o = {H3_PIXELS_UNIT, NULL, NULL, &frames};
    if (v.data && vv) CHECK_OK(h3_video_vae_decode(vv, &ex, &v, &o));
    h3_video_vae_close(vv);
    int badpx = 0, frames_read = 0;
    for (int t = 0; t < 22; t++) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd,
                 "ffmpeg -nostdin -v error -i '%s/frame_%05d.png' -f rawvideo -pix_fmt rgb24 -", png, t);
        FILE *pf = popen(cmd, "r");
        if (!pf) continue;
        size_t nb = (size_t)(W * H * 3);
        unsigned char *rgb = malloc(nb);
        size_t got = fread(rgb, 1, nb, pf);
        if (pclose(pf) == 0 && got == nb) {
            frames_read++;
            for (int64_t i = 0; i < W * H; i++)
                for (int c = 0; c < 3; c++)
                    badpx += rgb[i * 3 + c] != numpy_u8(((float *)frames.data)[(c * 22 + t) * W * H + i]);
        }
        free(rgb);
    }
    CHECK(frames_read == 22, "%d of 22 PNG frames read back by ffmpeg (is ffmpeg installed?)", frames_read);
    CHECK(badpx == 0, "%d PNG levels differ from the video VAE's frames", badpx);
    h3_tensor_free(&frames);
    h3_tensor_free(&v);
    h3_tensor_free(&a);
    h3_exec_free(&ex);
    snprintf(p, sizeof p, "rm -rf '%s' '%s' '%s' '%s'", mp4, wav, lat, png);
    CHECK(system(p) == 0);
}

/* ---- interruption in every stage ----------------------------------------------------------------------- */

typedef struct {
    const char *stop_in; /* stop once this stage has begun */
    const char *stage;   /* the stage running now */
    int steps_seen;
} stop_ctx;

static void track(const h3_progress_event *ev, void *user) {
    stop_ctx *s = user;
    if (ev->kind == H3_PROGRESS_STAGE_BEGIN) s->stage = ev->stage;
    if (ev->kind == H3_PROGRESS_STEP) s->steps_seen++;
}

static int stop_now(void *user) {
    stop_ctx *s = user;
    return s->stage && !strcmp(s->stage, s->stop_in);
}

static void no_outputs(const char *mp4, const char *wav, const char *lat, const char *png, const char *what) {
    char p[800];
    snprintf(p, sizeof p, "%s.partial", mp4);
    CHECK(!exists(mp4) && !exists(p), "%s: the MP4 or its .partial is left", what);
    CHECK(!exists(wav) && !exists(lat), "%s: the WAV or the latents are left", what);
    CHECK(!exists(png), "%s: the PNG folder (created by the run) is left", what);
}

static void test_interrupted(void) {
    char mp4[700], wav[700], lat[700], png[700];
    for (int s = 0; s < H3_GEN_STAGES; s++) {
        h3_generate_request r;
        h3_generate_request_init(&r);
        r.req.prompt = "a cat on a piano";
        r.req.frames = 22;
        r.req.width = r.req.height = 128;
        r.req.steps = 4;
        r.req.seed = 5;
        r.model = g_tiny;
        r.output = path_in("int.mp4", mp4, sizeof mp4);
        r.wav = path_in("int.wav", wav, sizeof wav);
        r.latents = path_in("int.safetensors", lat, sizeof lat);
        r.png_dir = path_in("int_frames", png, sizeof png);
        r.device = H3_DEVICE_CPU;
        r.threads = 2;
        r.x264_preset = "ultrafast";
        if (s == H3_GEN_REFINE) r.req.refine_width = r.req.refine_height = 160; /* the stage runs only then */
        char kf[700];
        if (s == H3_GEN_KEYFRAMES) { /* the stage runs only with keyframes: a 40x24 PPM */
            path_in("int_key.ppm", kf, sizeof kf);
            FILE *f = fopen(kf, "wb");
            CHECK(f != NULL);
            if (f) {
                fprintf(f, "P6 40 24 255\n");
                for (int i = 0; i < 40 * 24 * 3; i++) fputc((i * 7) & 255, f);
                fclose(f);
            }
            r.keyframe[0] = kf;
            r.keyframe_frame[0] = 0;
            r.n_keyframes = 1;
        }
        char snd[700];
        if (s == H3_GEN_SOUNDTRACK || s == H3_GEN_REFERENCES) { /* 1 s of a 16-bit mono WAV */
            path_in("int_sound.wav", snd, sizeof snd);
            FILE *f = fopen(snd, "wb");
            CHECK(f != NULL);
            if (f) {
                const uint32_t rate = 32000, n = 32000, bytes = 2 * n;
                const uint32_t hdr[] = {0x46464952u, 36 + bytes, 0x45564157u, 0x20746d66u, 16, 0x00010001u, rate,
                                        2 * rate,    0x00100002u, 0x61746164u, bytes};
                fwrite(hdr, sizeof hdr, 1, f);
                for (uint32_t i = 0; i < n; i++) {
                    const int16_t v = (int16_t)(8000.0 * sin(2 * 3.14159265358979 * 440.0 * i / rate));
                    fwrite(&v, 2, 1, f);
                }
                fclose(f);
            }
            if (s == H3_GEN_SOUNDTRACK) r.audio = snd; /* the stage runs only with a soundtrack */
        }
        if (s == H3_GEN_REFERENCES) { /* the stage runs only with references: the sound and an image */
            path_in("int_ref.ppm", kf, sizeof kf);
            FILE *f = fopen(kf, "wb");
            CHECK(f != NULL);
            if (f) {
                fprintf(f, "P6 48 32 255\n");
                for (int i = 0; i < 48 * 32 * 3; i++) fputc((i * 11) & 255, f);
                fclose(f);
            }
            r.ref[0] = snd;
            r.ref_kind[0] = H3_REF_AUDIO;
            r.ref[1] = kf;
            r.ref_kind[1] = H3_REF_IMAGE;
            r.n_refs = 2;
            r.ref_image_short = r.ref_video_short = 32;
        }
        stop_ctx sc = {h3_generate_stage_name(s), NULL, 0};
        h3_generate_callbacks cb = {track, &sc, stop_now, &sc};
        h3_mem_stats m0, m1;
        h3_mem_get_stats(&m0);
        h3_clear_error();
        h3_status st = h3_generate(&r, &cb, NULL);
        h3_mem_get_stats(&m1);
        CHECK(st == H3_ERR_INTERRUPTED, "stop in %s: status %d (%s)", sc.stop_in, st, h3_last_error());
        CHECK(strstr(h3_last_error(), "interrupted during") != NULL, "stop in %s: %s", sc.stop_in,
              h3_last_error());
        CHECK(m1.total_current == m0.total_current, "stop in %s: %lld bytes held", sc.stop_in,
              (long long)(m1.total_current - m0.total_current));
        no_outputs(mp4, wav, lat, png, sc.stop_in);
        if (s == H3_GEN_TEXT_ENCODER) /* stopped within the stage: after its first layer, not its 50th */
            CHECK(sc.steps_seen == 1, "stop in the text encoder: %d layer steps ran", sc.steps_seen);
    }
}

/* ---- bad requests -------------------------------------------------------------------------------------- */

static void test_bad_requests(void) {
    char mp4[700], png[700], p[700];
    h3_generate_request r;
    h3_generate_request_init(&r);
    r.req.prompt = "x";
    r.model = g_tiny;
    r.output = path_in("bad.mp4", mp4, sizeof mp4);
    r.device = H3_DEVICE_CPU;
    h3_generate_request b = r;
    b.req.frames = 120;
    CHECK_ERR(h3_generate(&b, NULL, NULL), H3_ERR_INVALID, "got 120: use 107 or 124");
    b = r;
    b.req.width = 1280, b.req.height = 720;
    CHECK_ERR(h3_generate(&b, NULL, NULL), H3_ERR_INVALID, "use 1280x704 or 1280x736");
    b = r;
    b.req.steps = 1001;
    CHECK_ERR(h3_generate(&b, NULL, NULL), H3_ERR_INVALID, "between 1 and 1000");
    b = r;
    b.req.prompt = NULL;
    CHECK_ERR(h3_generate(&b, NULL, NULL), H3_ERR_INVALID, "a prompt is required");
    b = r;
    b.req.frames = 22, b.req.width = b.req.height = 64;
    b.req.prompt = "\xff\xfe not UTF-8";
    CHECK_ERR(h3_generate(&b, NULL, NULL), H3_ERR_INVALID, "UTF-8");
    b = r;
    b.output = path_in("no/such/dir/x.mp4", p, sizeof p);
    CHECK_ERR(h3_generate(&b, NULL, NULL), H3_ERR_INVALID, "does not exist (create it first)");
    b = r;
    b.png_dir = mp4; /* a file where a folder is wanted */
    FILE *f = fopen(mp4, "w");
    if (f) fclose(f);
    b.output = path_in("bad2.mp4", png, sizeof png);
    CHECK_ERR(h3_generate(&b, NULL, NULL), H3_ERR_INVALID, "is a file; give a folder");
    unlink(mp4);
    b = r;
    b.x264_preset = "fastest";
    CHECK_ERR(h3_generate(&b, NULL, NULL), H3_ERR_INVALID, "unknown x264 preset 'fastest'");
    b = r;
    b.device = (h3_device)7;
    CHECK_ERR(h3_generate(&b, NULL, NULL), H3_ERR_INVALID, NULL);
    if (h3_cuda_device_count() == 0) {
        b = r;
        b.device = H3_DEVICE_CUDA;
        CHECK_ERR(h3_generate(&b, NULL, NULL), H3_ERR_INVALID, "use --device cpu");
    }
    h3_device d;
    CHECK_ERR(h3_device_parse("gpu", &d), H3_ERR_INVALID, "choose cpu, cuda or auto");
    CHECK_OK(h3_device_parse("cuda", &d));
    CHECK(d == H3_DEVICE_CUDA);
    CHECK(!exists(mp4) && !exists(png), "a bad request wrote a file");
}

/* ---- allocation failures ------------------------------------------------------------------------------- */

static h3_status small_run(const char *mp4, const char *wav, const char *lat) {
    h3_generate_request r;
    h3_generate_request_init(&r);
    r.req.prompt = "a cat";
    r.req.frames = 5;
    r.req.width = r.req.height = 64;
    r.req.steps = 2;
    r.req.seed = 9;
    r.model = g_tiny;
    r.output = mp4;
    r.wav = wav;
    r.latents = lat;
    r.device = H3_DEVICE_CPU;
    r.threads = 1;
    r.x264_preset = "ultrafast";
    return h3_generate(&r, NULL, NULL);
}

static void test_alloc_failures(void) {
    char mp4[700], wav[700], lat[700];
    path_in("af.mp4", mp4, sizeof mp4);
    path_in("af.wav", wav, sizeof wav);
    path_in("af.safetensors", lat, sizeof lat);
    h3_mem_fail_at(0, 0);
    CHECK_OK(small_run(mp4, wav, lat));
    int64_t total = h3_mem_fail_at(0, 0); /* allocations a whole run makes */
    unlink(mp4);
    unlink(wav);
    unlink(lat);
    CHECK(total > 100, "a run made %lld allocations", (long long)total);
    /* Every one of the first 40 (the checks, the finder, the headers), then 40 spread over the rest. */
    int tested = 0, failed = 0;
    h3_mem_stats m0, m1;
    h3_mem_get_stats(&m0);
    for (int i = 1; i <= 80; i++) {
        int64_t n = i <= 40 ? i : 40 + (total - 40) * (i - 40) / 41;
        h3_mem_fail_at(n, 0);
        h3_clear_error();
        h3_status st = small_run(mp4, wav, lat);
        h3_mem_fail_at(0, 0);
        h3_mem_get_stats(&m1);
        tested++;
        if (st != H3_OK) {
            failed++;
            CHECK(st == H3_ERR_NOMEM, "allocation %lld failing gave %d: %s", (long long)n, st,
                  h3_last_error());
            no_outputs(mp4, wav, lat, "/nonexistent-png-dir", "allocation failure");
        }
        unlink(mp4);
        unlink(wav);
        unlink(lat);
        CHECK(m1.total_current == m0.total_current, "allocation %lld failing leaked %lld bytes", (long long)n,
              (long long)(m1.total_current - m0.total_current));
    }
    CHECK(failed > tested / 2, "only %d of %d injected failures surfaced", failed, tested);
    t_note(
        "  %d of %d injected allocation failures (of %lld allocations per run) returned H3_ERR_NOMEM cleanly",
        failed, tested, (long long)total);
}

/* ---- a session: what runs keep between them --------------------------------------------------------------
 */

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* Runs through a session reuse what the first left (each bit of the result as expected, a prompt seen again
 * skipping the text encoder) and give the latents of a run without one, byte for byte; a check plans without
 * writing and refuses a budget too small with the planner's message; the session gives every byte back. */
static void test_session(void) {
    char mp4[700], lat[4][700];
    path_in("ses.mp4", mp4, sizeof mp4);
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "ses%d.safetensors", i);
        path_in(name, lat[i], sizeof lat[i]);
    }
    h3_mem_stats m0, m1;
    h3_mem_get_stats(&m0);
    h3_session *ses = NULL;
    CHECK_OK(h3_session_new(0, &ses));
    if (!ses) return;
    const unsigned all = H3_REUSED_FILES | H3_REUSED_TOKENIZER | H3_REUSED_PROMPT | H3_REUSED_DIT |
                         H3_REUSED_AUDIO_VAE | H3_REUSED_VIDEO_VAE;
    static const struct {
        const char *prompt;
        int session;
        unsigned reused; /* exactly these */
    } runs[4] = {
        {"a cat", 0, 0},
        {"a cat", 1, 0},
        {"a cat", 1, all},
        {"a dog", 1, (all & ~H3_REUSED_PROMPT) | H3_REUSED_TEXT_ENCODER},
    };
    for (int i = 0; i < 4; i++) {
        h3_generate_request r;
        h3_generate_request_init(&r);
        r.req.prompt = runs[i].prompt;
        r.req.frames = 5;
        r.req.width = r.req.height = 64;
        r.req.steps = 2;
        r.req.seed = 9;
        r.model = g_tiny;
        r.output = mp4;
        r.latents = lat[i];
        r.device = H3_DEVICE_CPU;
        r.threads = 1;
        r.x264_preset = "ultrafast";
        r.session = runs[i].session ? ses : NULL;
        h3_generate_result res;
        CHECK_OK(h3_generate(&r, NULL, &res));
        CHECK(res.reused == runs[i].reused, "run %d reused 0x%x, expected 0x%x", i, res.reused,
              runs[i].reused);
        CHECK(res.dit_start_s > 0 && res.dit_start_s < res.total_s, "run %d: the DiT began at %.3f s of %.3f",
              i, res.dit_start_s, res.total_s);
        unlink(mp4);
    }
    CHECK(same_file(lat[0], lat[1]) && same_file(lat[0], lat[2]),
          "the latents of runs through a session differ from a run without one");
    CHECK(!same_file(lat[0], lat[3]), "another prompt gave the same latents");
    /* The check: the plan in words, nothing written; too small a host budget refused with the plan's message.
     */
    h3_generate_request r;
    h3_generate_request_init(&r);
    r.req.prompt = "a cat";
    r.req.frames = 5;
    r.req.width = r.req.height = 64;
    r.req.steps = 2;
    r.model = g_tiny;
    r.output = mp4;
    r.device = H3_DEVICE_CPU;
    r.session = ses;
    h3_generate_result res;
    CHECK_OK(h3_generate_check(&r, &res));
    CHECK(strstr(res.plan, "host memory") != NULL, "the plan: '%s'", res.plan);
    CHECK(res.req.steps == 2 && res.req.frames == 5, "the resolved request");
    CHECK(!exists(mp4), "a check wrote the output");
    r.ram_budget = 1024;
    CHECK_ERR(h3_generate_check(&r, &res), H3_ERR_BUDGET, "fewer frames or a smaller canvas");
    r.ram_budget = 0;
    r.req.frames = 6;
    CHECK_ERR(h3_generate_check(&r, &res), H3_ERR_INVALID, "17n+5");
    h3_session_free(ses);
    for (int i = 0; i < 4; i++) unlink(lat[i]);
    h3_mem_get_stats(&m1);
    CHECK(m1.total_current == m0.total_current, "the session left %lld bytes held",
          (long long)(m1.total_current - m0.total_current));
}

/* ---- the stages on the GPU ----------------------------------------------------------------------------- */

/* Counts the device backend's start-ups (its "cuda: <name> ..." line) and the stages' warnings: a stage the
 * plan put on the host, device memory a stage still held when it ended. */
static int g_cuda_inits, g_warnings;
static void count_log(h3_log_level level, const char *msg, void *user) {
    (void)user;
    if (!strncmp(msg, "cuda: ", 6)) g_cuda_inits++;
    if (level >= H3_LOG_WARN && (!strncmp(msg, "plan: ", 6) || strstr(msg, "still held"))) {
        g_warnings++;
        t_note("  warning: %s", msg);
    }
}

/* The run on the GPU: every stage planned on the device runs there inside one backend (brought up once),
 * gives back everything it took (nothing held when it ends) and peaks where its plan said, within the budget;
 * the latents agree with the CPU's. */
static void test_cuda(void) {
    if (h3_cuda_device_count() == 0) {
        t_note("  skipped: no CUDA device on this machine");
        return;
    }
    char mp4[700], lat[2][700];
    h3_generate_request r;
    h3_generate_request_init(&r);
    r.req.prompt = "a harbor at sunrise";
    r.req.frames = 22;
    r.req.width = r.req.height = 128;
    r.req.steps = 8;
    r.req.seed = 21;
    r.model = g_tiny;
    r.output = path_in("gpu.mp4", mp4, sizeof mp4);
    h3_tensor v[2] = {{0}, {0}};
    for (int k = 0; k < 2; k++) {
        r.device = k ? H3_DEVICE_CUDA : H3_DEVICE_CPU;
        r.latents = path_in(k ? "gpu.safetensors" : "cpu.safetensors", lat[k], sizeof lat[k]);
        h3_generate_result res;
        g_cuda_inits = g_warnings = 0;
        h3_log_set_callback(count_log, NULL, H3_LOG_INFO);
        CHECK_OK(h3_generate(&r, NULL, &res));
        h3_log_set_callback(NULL, NULL, H3_LOG_WARN);
        CHECK(res.device == r.device, "ran on %s", h3_device_name(res.device));
        if (k) {
            CHECK(g_cuda_inits == 1, "the device backend came up %d times in one run (once expected)",
                  g_cuda_inits);
            CHECK(g_warnings == 0, "%d warnings (a stage on the host, or device memory still held)",
                  g_warnings);
            static const int st[4] = {H3_GEN_TEXT_ENCODER, H3_GEN_DIT, H3_GEN_AUDIO_VAE, H3_GEN_VIDEO_VAE};
            for (int i = 0; i < 4; i++) {
                const h3_stage_report *sr = &res.stages[st[i]];
                const char *nm = h3_generate_stage_name(st[i]);
                CHECK(sr->on_device, "%s ran on the host", nm);
                CHECK(sr->dev_held == 0, "%s left %lld device bytes held", nm, (long long)sr->dev_held);
                CHECK(sr->dev_peak > 0 && sr->dev_peak <= res.vram_budget,
                      "%s peaked at %lld of a %lld budget", nm, (long long)sr->dev_peak,
                      (long long)res.vram_budget);
                CHECK(llabs(sr->dev_peak - sr->dev_predicted) <= sr->dev_predicted / 20,
                      "%s: device peak %lld measured, %lld predicted (more than 5%% apart)", nm,
                      (long long)sr->dev_peak, (long long)sr->dev_predicted);
                t_note("  %s on the GPU: %.3f s, device peak %.1f MiB measured, %.1f MiB predicted", nm,
                       sr->seconds, sr->dev_peak / 1048576.0, sr->dev_predicted / 1048576.0);
            }
        }
        h3_st_set s;
        CHECK_OK(h3_st_open(lat[k], &s));
        CHECK_OK(h3_st_load(&s, "video_latents", H3_PLACE_HOST, H3_F32, H3_MEM_IO, &v[k]));
        h3_st_close(&s);
        unlink(lat[k]);
        unlink(mp4);
    }
    if (v[0].data && v[1].data) {
        size_t n = (size_t)h3_tensor_numel(&v[0]);
        double *ref = malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) ref[i] = ((float *)v[0].data)[i];
        EXPECT_CLOSE("video latents, DiT on the GPU vs the CPU", v[1].data, ref, n, 5e-2);
        free(ref);
    }
    h3_tensor_free(&v[0]);
    h3_tensor_free(&v[1]);
}

int main(int argc, char **argv) {
    if (!make_models()) return 1;
    static const t_case cases[] = {
        {"model_files", test_model_files},
        {"end_to_end", test_end_to_end},
        {"interrupted", test_interrupted},
        {"bad_requests", test_bad_requests},
        {"alloc_failures", test_alloc_failures},
        {"session", test_session},
        {"cuda", test_cuda},
        {NULL, NULL},
    };
    int r = t_main("test_generate", cases, argc, argv);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) r = 1;
    return r;
}

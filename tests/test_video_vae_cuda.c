/* The video VAE decoder on the GPU (bf16 GEMM operands, f32 residual stream, weights converted on the device)
 * against the same decoder on the CPU (f32), and the device memory its plan predicts against what the arena
 * measures. Skips without a GPU.
 *
 *   fixtures   every fixture case (official tiled 2×3 and 1×3 with a cross-fade, diffusers untiled and
 * padded, ComfyUI f16 with 12, 2 and 1 latent frames) under each device run of k_runs: resident with a
 *              chunk's tiles per pass, one tile per pass, every block streamed, one block streamed with 5-row
 *              steps; also compared with the float64 reference frames
 *   lengths    random latents of 1, 2, 7, 9 and 12 latent frames, tiled (official) and untiled (diffusers)
 *   wide       a decoder made in memory with heads of 64 channels (the release's attention kernel path) and
 *              random weights, placed by budget (all resident, then budgets that stream blocks and shrink the
 *              tile batch), against the CPU with the same random weights placed alike
 *   release_width  the release's widths on one tile-chunk, 6 blocks (H3_VVAE_BLOCKS=36: the release's depth)
 *   encoder    the small model's video VAE encoder (f32 weights resident on the device, its convolutions' GEMMs on TF32
 *              tensor cores and in exact f32) against the CPU's
 *              encode: an image of 2 × 2 tiles and 22 frames of one tile on TF32 within bf16 rounding (relative
 *              L2 <= 2⁻⁸), the 22 frames in exact f32 within 1e-4 (f32 on both sides: it lands near 1e-6), the
 *              device peak against h3_video_enc_mem_of
 *
 * Tolerance: relative L2 of the frames <= 1e-2 (the done-when of the video stage; bf16 rounding of the GEMM
 * operands through the blocks lands near 2e-3). Peaks: measured within 5% of the plan (they are equal unless
 * an allocation is missing from the plan). Every comparison prints its error, so a first run shows where it
 * stands. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "models/video_vae.h"
#include "models/video_vae_enc.h"
#include "testutil.h"

static h3_exec g_ex;  /* the device */
static h3_exec g_cpu; /* the host */

static const char *fx(const char *rel, char *buf, size_t n) {
    char r[512];
    snprintf(r, sizeof r, "tests/fixtures/video_vae/%s", rel);
    return t_src_path(r, buf, n);
}

static h3_status load_f32(const char *path, const char *name, h3_tensor *out) {
    h3_st_set s;
    H3_TRY(h3_st_open(path, &s));
    h3_status st = h3_st_load(&s, name, H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, out);
    h3_st_close(&s);
    return st;
}

/* One device run: tiles per pass, row steps, blocks forced to stream, a device budget for the plan. */
typedef struct {
    const char *name;
    int tile_batch, rows_per_step, stream_blocks;
    int64_t budget;
} drun;

static const drun k_runs[] = {
    {"resident, a chunk's tiles per pass", 0, 0, 0, 0},
    {"resident, 1 tile per pass", 1, 0, 0, 0},
    {"all blocks streamed, 2 tiles per pass", 2, 0, 1000, 0},
    {"1 block streamed, 5-row steps", 0, 5, 1, 0},
};

/* Decodes z on the device as planned by run (resets the arena's peak first) and returns the measured peak. */
static int64_t decode_device(h3_video_vae *v, const h3_tensor *z, const h3_video_vae_run *run, h3_tensor *out,
                             h3_video_vae_mem *m) {
    const int off = z->ndim == 5;
    memset(m, 0, sizeof *m);
    CHECK_OK(h3_video_vae_plan(v, z->shape[off + 1], z->shape[off + 2], z->shape[off + 3], run, m));
    CHECK_OK(h3_exec_sync(&g_ex));
    h3_cuda_reset_peak(&g_ex);
    CHECK_OK(h3_video_vae_place(v, &g_ex, m, NULL));
    h3_video_decode_out dst = {H3_PIXELS_RAW, NULL, NULL, out};
    CHECK_OK(h3_video_vae_decode(v, &g_ex, z, &dst));
    int64_t used, peak, cap;
    h3_cuda_mem_stats(&g_ex, &used, &peak, &cap);
    h3_video_vae_unplace(v);
    return peak;
}

/* The CPU decode of z from the file (or as placed there). */
static void decode_host(h3_video_vae *v, const h3_tensor *z, h3_tensor *out) {
    h3_video_decode_out dst = {H3_PIXELS_RAW, NULL, NULL, out};
    CHECK_OK(h3_video_vae_decode(v, &g_cpu, z, &dst));
}

static double *to_double(const h3_tensor *t) {
    size_t n = (size_t)h3_tensor_numel(t);
    double *d = malloc(n * sizeof *d + 8);
    for (size_t i = 0; i < n; i++) d[i] = ((const float *)t->data)[i];
    return d;
}

/* GPU frames against CPU frames: the relative L2 error (checked) and the largest difference (printed). */
static double compare(const char *what, const h3_tensor *gpu, const h3_tensor *cpu, double tol) {
    double *ref = to_double(cpu);
    const size_t n = (size_t)h3_tensor_numel(cpu);
    const double e = EXPECT_CLOSE(what, gpu->data, ref, n, tol), mx = t_max_abs_err(gpu->data, ref, n);
    int64_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(((const float *)gpu->data)[i]);
    CHECK(bad == 0, "%s: %lld values not finite", what, (long long)bad);
    free(ref);
    t_note("  %-78s rel L2 %.2e, max |diff| %.2e", what, e, mx);
    return e;
}

static void check_peak(const char *what, int64_t measured, const h3_video_vae_mem *m) {
    const int64_t d = measured - m->dev_peak;
    t_note(
        "  %-78s device peak predicted %lld, measured %lld (%+lld bytes); %d of %d blocks resident, %d tiles "
        "per pass, %lld-row steps",
        what, (long long)m->dev_peak, (long long)measured, (long long)d, m->n_resident, m->n_blocks,
        m->tile_batch, (long long)m->rows_per_step);
    CHECK(llabs(d) * 20 <= m->dev_peak, "%s: device peak predicted %lld, measured %lld (more than 5%% apart)",
          what, (long long)m->dev_peak, (long long)measured);
}

static void run_both(const char *label, h3_video_vae *v, const h3_tensor *z, const h3_tensor *ref) {
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    const int off = z->ndim == 5;
    const int64_t T = z->shape[off + 1], H = z->shape[off + 2], W = z->shape[off + 3];
    int64_t os[4] = {c->out_channels, h3_video_vae_num_frames(c, T), H * c->patch_size, W * c->patch_size};
    h3_tensor cpu = {0}, gpu = {0};
    CHECK_OK(h3_tensor_alloc(&cpu, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&gpu, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    if (!cpu.data || !gpu.data) goto done;
    decode_host(v, z, &cpu);
    for (size_t k = 0; k < sizeof k_runs / sizeof k_runs[0]; k++) {
        h3_video_vae_run run;
        memset(&run, 0, sizeof run);
        run.place = H3_PLACE_DEVICE;
        run.tile_batch = k_runs[k].tile_batch;
        run.rows_per_step = k_runs[k].rows_per_step;
        run.stream_blocks = k_runs[k].stream_blocks;
        run.vram_budget = k_runs[k].budget;
        h3_video_vae_mem m;
        memset(gpu.data, 0, h3_tensor_nbytes(&gpu));
        const int64_t peak = decode_device(v, z, &run, &gpu, &m);
        char what[200];
        snprintf(what, sizeof what, "%s, %s: GPU vs CPU", label, k_runs[k].name);
        compare(what, &gpu, &cpu, 1e-2);
        if (ref) {
            snprintf(what, sizeof what, "%s, %s: GPU vs reference", label, k_runs[k].name);
            compare(what, &gpu, ref, 1e-2);
        }
        snprintf(what, sizeof what, "%s, %s", label, k_runs[k].name);
        check_peak(what, peak, &m);
    }
done:
    h3_tensor_free(&cpu);
    h3_tensor_free(&gpu);
}

static void test_fixtures(void) {
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
        h3_tensor lat = {0}, ref = {0};
        CHECK_OK(h3_video_vae_open(mpath, &o, &v));
        CHECK_OK(load_f32(path, "latents", &lat));
        CHECK_OK(load_f32(path, "frames", &ref));
        if (v && lat.data && ref.data)
            run_both(name, v, &lat, &ref); /* ref [1, 3, F, H, W]: the same values */
        h3_tensor_free(&lat);
        h3_tensor_free(&ref);
        h3_video_vae_close(v);
    }
    json_decref(cases);
}

/* Latent lengths: 1 (an image), 2 (one padded chunk), 7 and 12 (5n+2: one and two chunks), 9 (padded). */
static void test_lengths(void) {
    static const struct {
        const char *model;
        int64_t T, H, W;
    } k[] = {
        {"official", 1, 10, 16}, {"official", 2, 10, 16}, {"official", 7, 10, 16}, {"official", 12, 4, 16},
        {"official", 9, 10, 6},  {"diffusers", 1, 4, 6},  {"diffusers", 2, 4, 6},  {"diffusers", 12, 4, 6},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        char p[700], label[128];
        fx(k[i].model, p, sizeof p);
        h3_video_vae *v = NULL;
        CHECK_OK(h3_video_vae_open(p, NULL, &v));
        if (!v) continue;
        int64_t s[4] = {24, k[i].T, k[i].H, k[i].W};
        h3_tensor z;
        CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 4, s, H3_MEM_OTHER));
        t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
        snprintf(label, sizeof label, "%s, %lld latent frames of %lld×%lld", k[i].model, (long long)k[i].T,
                 (long long)k[i].H, (long long)k[i].W);
        run_both(label, v, &z, NULL);
        h3_tensor_free(&z);
        h3_video_vae_close(v);
    }
}

/* A decoder made in memory with 64-channel heads (the flash attention kernel the release takes) and random
 * weights, placed by device budget; the CPU gets the same random weights placed the same way (the same values
 * before the device's bf16 rounding). */
static void test_wide(void) {
    h3_video_vae_config c;
    h3_video_vae_default_config(&c);
    c.num_layers = 4;
    c.heads = 4;
    c.head_dim = 64;
    c.rope_dim = 48;
    c.ffn_inner = 1024;
    c.tile_size = 64;
    c.tile_overlap_min = 16;
    h3_video_vae *v = NULL;
    CHECK_OK(h3_video_vae_create(&c, &v));
    if (!v) return;
    int64_t s[4] = {24, 7, 8, 12};
    h3_tensor z, cpu, gpu;
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 4, s, H3_MEM_OTHER));
    t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
    int64_t os[4] = {3, h3_video_vae_num_frames(&c, 7), 8 * 16, 12 * 16};
    CHECK_OK(h3_tensor_alloc(&cpu, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&gpu, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    /* budgets: unlimited; what all resident needs; what streaming 2 blocks needs; what streaming every block
     * one tile per pass needs (each plus the 64 MiB the plan keeps free) */
    h3_video_vae_run run;
    memset(&run, 0, sizeof run);
    run.place = H3_PLACE_DEVICE;
    run.random_seed = 11;
    int64_t budgets[4] = {0, 0, 0, 0};
    const int force[3][2] = {{0, 0}, {2, 0}, {1000, 1}}; /* stream_blocks, tile_batch */
    for (int k = 0; k < 3; k++) {
        h3_video_vae_run r2 = run;
        r2.stream_blocks = force[k][0];
        r2.tile_batch = force[k][1];
        h3_video_vae_mem m;
        CHECK_OK(h3_video_vae_plan(v, 7, 8, 12, &r2, &m));
        budgets[k + 1] = m.dev_peak + ((int64_t)64 << 20);
    }
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        run.vram_budget = budgets[b];
        h3_video_vae_mem m;
        h3_status ps = h3_video_vae_plan(v, 7, 8, 12, &run, &m);
        CHECK(ps == H3_OK, "wide decoder: budget %lld does not fit: %s", (long long)budgets[b],
              h3_last_error());
        if (ps != H3_OK) continue;
        memset(gpu.data, 0, h3_tensor_nbytes(&gpu));
        const int64_t peak = decode_device(v, &z, &run, &gpu, &m);
        h3_video_vae_run hr = run;
        hr.place = H3_PLACE_HOST;
        hr.packed = 1;
        hr.vram_budget = 0;
        hr.tile_batch = m.tile_batch;
        hr.stream_blocks = m.n_blocks - m.n_resident;
        h3_video_vae_mem hm;
        CHECK_OK(h3_video_vae_plan(v, 7, 8, 12, &hr, &hm));
        CHECK(hm.n_resident == m.n_resident, "host placement %d resident vs device %d", hm.n_resident,
              m.n_resident);
        CHECK_OK(h3_video_vae_place(v, &g_cpu, &hm, NULL));
        decode_host(v, &z, &cpu);
        h3_video_vae_unplace(v);
        char what[200];
        snprintf(what, sizeof what, "wide decoder (4×64 heads), budget %.0f MiB: GPU vs CPU",
                 budgets[b] / 1048576.0);
        compare(what, &gpu, &cpu, 1e-2);
        snprintf(what, sizeof what, "wide decoder, budget %.0f MiB", budgets[b] / 1048576.0);
        check_peak(what, peak, &m);
        if (budgets[b]) CHECK(peak <= budgets[b], "%s: peak %lld over the budget", what, (long long)peak);
    }
    h3_tensor_free(&z);
    h3_tensor_free(&cpu);
    h3_tensor_free(&gpu);
    h3_video_vae_close(v);
}

/* The release's widths (hidden 2048, 32 heads × 64, FFN 8192, 4 registers) with random weights on one 256 ×
 * 256 tile and one chunk (latents 7 × 16 × 16: 1,797 tokens), GPU against the CPU with the same random
 * weights: the done-when's 1e-2 at the release's depth when H3_VVAE_BLOCKS=36 (one tile-chunk takes the CPU
 * about a minute on 16 cores; the default, 6 blocks, a few seconds). */
static void test_release_width(void) {
    h3_video_vae_config c;
    h3_video_vae_default_config(&c);
    const char *nb = getenv("H3_VVAE_BLOCKS");
    c.num_layers = nb && atoi(nb) > 0 ? atoi(nb) : 6;
    h3_video_vae *v = NULL;
    CHECK_OK(h3_video_vae_create(&c, &v));
    if (!v) return;
    int64_t s[4] = {24, 7, 16, 16};
    h3_tensor z, cpu, gpu;
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 4, s, H3_MEM_OTHER));
    t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
    int64_t os[4] = {3, h3_video_vae_num_frames(&c, 7), 256, 256};
    CHECK_OK(h3_tensor_alloc(&cpu, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&gpu, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    h3_video_vae_run run;
    memset(&run, 0, sizeof run);
    run.place = H3_PLACE_DEVICE;
    run.random_seed = 5;
    h3_video_vae_mem m;
    const int64_t peak = decode_device(v, &z, &run, &gpu, &m);
    run.place = H3_PLACE_HOST;
    run.packed = 1;
    run.threads = g_cpu.threads;
    h3_video_vae_mem hm;
    CHECK_OK(h3_video_vae_plan(v, 7, 16, 16, &run, &hm));
    CHECK_OK(h3_video_vae_place(v, &g_cpu, &hm, NULL));
    decode_host(v, &z, &cpu);
    h3_video_vae_unplace(v);
    char what[160];
    snprintf(what, sizeof what, "release widths, %d blocks, one 256×256 tile-chunk: GPU vs CPU",
             c.num_layers);
    compare(what, &gpu, &cpu, 1e-2);
    snprintf(what, sizeof what, "release widths, %d blocks", c.num_layers);
    check_peak(what, peak, &m);
    h3_tensor_free(&z);
    h3_tensor_free(&cpu);
    h3_tensor_free(&gpu);
    h3_video_vae_close(v);
}

static void test_encoder(void) {
    char mp[1024];
    h3_video_vae *v = NULL;
    h3_video_enc *e = NULL;
    /* the small model's trained encoder; where it is not (a GPU machine without models/), h3-tinymodel's */
    struct stat sb;
    char probe[1024];
    if (stat(t_src_path("models/h3-small/video_vae/config.json", probe, sizeof probe), &sb) != 0) {
        char dir[512], cmd[2048];
        const char *build = getenv("H3_BUILD_DIR");
        t_tmp_path("vvae_cuda_tiny", dir, sizeof dir);
        snprintf(cmd, sizeof cmd, "'%s/h3-tinymodel' --force '%s' >/dev/null", build ? build : ".", dir);
        CHECK(system(cmd) == 0, "%s", cmd);
        snprintf(mp, sizeof mp, "%s/video_vae", dir);
    } else {
        t_src_path("models/h3-small/video_vae", mp, sizeof mp);
    }
    CHECK_OK(h3_video_vae_open(mp, NULL, &v));
    if (v) CHECK_OK(h3_video_enc_open(v, &e));
    if (!e) {
        h3_video_vae_close(v);
        return;
    }
    const h3_video_enc_config *c = h3_video_enc_get_config(e);
    /* the GEMMs of its convolutions on TF32 tensor cores (the default) and in exact f32 */
    static const struct {
        int F, H, W;
        h3_conv_math math;
    } k_cases[] = {{1, 320, 288, H3_CONV_TF32}, {22, 64, 96, H3_CONV_TF32}, {22, 64, 96, H3_CONV_EXACT}};
    for (size_t k = 0; k < sizeof k_cases / sizeof *k_cases; k++) {
        const int F = k_cases[k].F, H = k_cases[k].H, W = k_cases[k].W;
        h3_cuda_conv_set_math(H3_CONV_3D, k_cases[k].math);
        const int64_t T = h3_video_enc_latent_frames(c, F), ps[5] = {1, 3, F, H, W},
                      ms[5] = {1, 2 * (int64_t)c->latent_channels, T, H / 16, W / 16};
        h3_tensor px, mc, mg;
        CHECK_OK(h3_tensor_alloc(&px, H3_PLACE_HOST, H3_U8, 5, ps, H3_MEM_IO));
        CHECK_OK(h3_tensor_alloc(&mc, H3_PLACE_HOST, H3_F32, 5, ms, H3_MEM_IO));
        CHECK_OK(h3_tensor_alloc(&mg, H3_PLACE_HOST, H3_F32, 5, ms, H3_MEM_IO));
        for (int64_t i = 0; i < h3_tensor_numel(&px); i++)
            ((uint8_t *)px.data)[i] = (uint8_t)(t_rand_u64() & 255);
        CHECK_OK(h3_video_enc_place(e, &g_cpu, H3_PLACE_HOST));
        CHECK_OK(h3_video_enc_encode(e, &g_cpu, &px, &mc));
        h3_video_enc_mem m;
        CHECK_OK(h3_video_enc_mem_of(c, F, H, W, H3_PLACE_DEVICE, &m));
        CHECK_OK(h3_exec_sync(&g_ex));
        h3_cuda_reset_peak(&g_ex);
        CHECK_OK(h3_video_enc_place(e, &g_ex, H3_PLACE_DEVICE));
        CHECK_OK(h3_video_enc_encode(e, &g_ex, &px, &mg));
        int64_t used, peak, cap;
        h3_cuda_mem_stats(&g_ex, &used, &peak, &cap);
        CHECK_OK(h3_video_enc_place(e, &g_ex, H3_PLACE_HOST));
        char what[128];
        snprintf(what, sizeof what, "encoder, %d frames of %dx%d (%dx%d tiles), %s", F, W, H, m.tiles_x,
                 m.tiles_y, k_cases[k].math ? "TF32" : "exact f32");
        /* exact f32 differs from the host's f32 by the order of its sums alone */
        compare(what, &mg, &mc, k_cases[k].math ? 1.0 / 256 : 1e-4);
        t_note("  %-78s device peak predicted %lld, measured %lld", what, (long long)m.dev_peak,
               (long long)peak);
        CHECK(llabs(peak - m.dev_peak) * 20 <= m.dev_peak, "%s: device peak predicted %lld, measured %lld",
              what, (long long)m.dev_peak, (long long)peak);
        h3_tensor_free(&px);
        h3_tensor_free(&mc);
        h3_tensor_free(&mg);
    }
    h3_cuda_conv_set_math(H3_CONV_3D, H3_CONV_TF32);
    h3_video_enc_close(e);
    h3_video_vae_close(v);
}

int main(int argc, char **argv) {
    if (h3_cuda_device_count() == 0) {
        printf("test_video_vae_cuda: skipped: no CUDA device on this machine\n");
        return 0;
    }
    if (h3_exec_init(&g_cpu, 0) != H3_OK || h3_exec_init(&g_ex, 0) != H3_OK ||
        h3_cuda_init(&g_ex, 0, (int64_t)8 << 30) != H3_OK) {
        printf("test_video_vae_cuda: cannot start: %s\n", h3_last_error());
        return 1;
    }
    static const t_case cases[] = {
        {"fixtures", test_fixtures},           {"lengths", test_lengths}, {"wide", test_wide},
        {"release_width", test_release_width}, {"encoder", test_encoder}, {NULL, NULL},
    };
    int r = t_main("test_video_vae_cuda", cases, argc, argv);
    h3_cuda_shutdown(&g_ex);
    h3_exec_free(&g_ex);
    h3_exec_free(&g_cpu);
    return r;
}

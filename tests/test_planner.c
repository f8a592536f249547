/* The memory planner, the streamer's logic and the DiT stage, on the CPU. Cases:
 *
 * budgets: parsing and its errors.
 *
 * simulate: the step-time simulation against hand-computed pipelines.
 *
 * full_arithmetic: the full-size official DiT (a header-only copy of the release) against figures computed by
 * hand from the shapes: a block, its AdaLN projection, the non-block weights, the forward's buffers and
 * scratch at W124, the modulation kept for 40 timesteps.
 *
 * budget_edges: the planner's choices at budget edges: one more block's worth of budget streams one block
 * less; host budgets split pinned and disk exactly.
 *
 * no_fit: a request that cannot fit names the budget that is short and what would fit; the smallest budget it
 * names fits and 64 MiB less does not; each suggestion fits.
 *
 * measured_*: the runtime's measured activation peaks equal the planner's figures (DiT forward and modulation
 * on the CPU, the text encoder's encode).
 *
 * streamer_host: the streamer's host emulation: every item's bytes arrive intact through every tier, in and
 * out of sequence; failures are clean.
 *
 * streamer_cache: a disk item (three segments at odd offsets, out of order, several pieces over several
 * reading threads) read from a file whose pages are all, none or half in the page cache: the bytes arrive
 * intact either way; ranges the cache held are copied from it and stay there, the others are read and dropped
 * again.
 *
 * units: a model's units: the tensors as opened on the host, every tier's bytes intact, in-memory disk units
 * spilled, interleaved QKV reordered.
 *
 * units_convert: units placed in another dtype than stored (conversion on arrival): resident ones converted
 * once, streamed ones into the work block as acquired (one held at a time), joined tensors contiguous, the
 * tensors as opened converted once on the host; on a stand-in device the bytes a resident set takes equal
 * h3_units_mem_of; malformed packs refused.
 *
 * dit_streamed: the DiT streamed through the ring (resident, pinned and disk blocks, the official per-head
 * QKV reordered on the way) computes what the resident DiT computes, and every allocation failure of its
 * set-up is clean.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/alloc.h"
#include "cuda/cuda.h"
#include "mem/budget.h"
#include "models/dit_stream.h"
#include "pipeline/plan.h"
#include "mem/report.h"
#include "mem/streamer.h"
#include "mem/units.h"
#include "models/dit.h"
#include "models/audio_vae.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"
#include "testutil.h"

static h3_exec g_ex;
static const int64_t GiB = (int64_t)1 << 30, MiB = (int64_t)1 << 20;

/* ---- budgets ------------------------------------------------------------------------------------------- */

static void test_budget_parse(void) {
    struct {
        const char *s;
        int64_t want;
    } ok[] = {{"8GiB", 8 * GiB},     {"8G", 8 * GiB},       {"8gb", 8 * GiB},
              {"512MiB", 512 * MiB}, {"1.5G", 3 * GiB / 2}, {"123456", 123456},
              {"auto", 0},           {"2T", 2048 * GiB},    {"64K", 65536}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t b = -1;
        CHECK_OK(h3_budget_parse(ok[i].s, "--vram-budget", &b));
        CHECK(b == ok[i].want, "'%s' -> %lld, expected %lld", ok[i].s, (long long)b, (long long)ok[i].want);
    }
    const char *bad[] = {"", "8XB", "-1G", "GiB", "0", "8 G B", "1e30", "nan", "inf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t b = 0;
        CHECK_ERR(h3_budget_parse(bad[i], "--vram-budget", &b), H3_ERR_INVALID, "--vram-budget");
    }
    int64_t av = 0, tot = 0;
    CHECK_OK(h3_host_memory(&av, &tot));
    CHECK(av > 0 && tot >= av, "MemAvailable %lld, MemTotal %lld", (long long)av, (long long)tot);
    int64_t ram = h3_budget_default_ram();
    CHECK(ram > 0 && ram <= av, "default host budget %lld of %lld available", (long long)ram, (long long)av);
    if (h3_cuda_device_count() == 0) {
        int64_t v = 0;
        CHECK_ERR(h3_budget_default_vram(0, &v), H3_ERR_UNSUPPORTED, "--vram-budget");
    }
}

/* ---- the simulation ------------------------------------------------------------------------------------ */

static void test_simulate(void) {
    h3_sim_unit u[4];
    double cb, rb;
    /* resident: the compute alone */
    for (int i = 0; i < 4; i++) u[i] = (h3_sim_unit){1.0 + i, 0.5, 0, H3_TIER_RESIDENT};
    CHECK(fabs(h3_plan_simulate(u, 4, 0, 0, &cb, &rb) - 10.0) < 1e-12, "resident: 1+2+3+4");
    /* one slot: each copy waits for the previous block's compute: copy + compute in series */
    for (int i = 0; i < 4; i++) u[i] = (h3_sim_unit){1.0, 0.5, 0, H3_TIER_PINNED};
    CHECK(fabs(h3_plan_simulate(u, 4, 1, 0, &cb, &rb) - 6.0) < 1e-12, "1 slot: 4 x (1 + 0.5)");
    CHECK(fabs(cb - 2.0) < 1e-12, "copy stream busy %.3f, expected 2", cb);
    /* two slots, copies shorter than compute: hidden */
    CHECK(fabs(h3_plan_simulate(u, 4, 2, 0, NULL, NULL) - 4.0) < 1e-12,
          "2 slots hide 0.5 s copies behind 1 s");
    /* two slots, copies longer than compute: the copy stream is the step */
    for (int i = 0; i < 4; i++) u[i] = (h3_sim_unit){0.25, 1.0, 0, H3_TIER_PINNED};
    CHECK(fabs(h3_plan_simulate(u, 4, 2, 0, NULL, NULL) - 4.0) < 1e-12, "copy-bound: 4 x 1 s");
    /* disk: reads of 2 s through 2 staging buffers bound the step */
    for (int i = 0; i < 4; i++) u[i] = (h3_sim_unit){0.25, 0.5, 2.0, H3_TIER_DISK};
    CHECK(fabs(h3_plan_simulate(u, 4, 2, 2, &cb, &rb) - 8.0) < 1e-12, "read-bound: 4 x 2 s");
    CHECK(fabs(rb - 8.0) < 1e-12, "read stream busy %.3f", rb);
    /* one resident block hides one block's copy: compute 1, 1, 1, 1 (the third resident), copies 1.5 each */
    for (int i = 0; i < 4; i++) u[i] = (h3_sim_unit){1.0, 1.5, 0, i == 2 ? H3_TIER_RESIDENT : H3_TIER_PINNED};
    CHECK(fabs(h3_plan_simulate(u, 4, 2, 0, NULL, NULL) - 4.5) < 1e-12, "3 copies of 1.5 s per step");
    /* a streamed block without slots, or a disk block without staging, is impossible */
    CHECK(isinf(h3_plan_simulate(u, 4, 0, 0, NULL, NULL)), "streaming needs a slot");
}

/* ---- the full-size DiT (header only) ------------------------------------------------------------------- */

static char g_full[1024];
static h3_dit *g_dit; /* the release's DiT, weights left in a sparse file */

static h3_dit *full_dit(void) {
    if (g_dit) return g_dit;
    char cmd[2300];
    const char *bd = getenv("H3_BUILD_DIR");
    t_tmp_path("dit_full.safetensors", g_full, sizeof g_full);
    snprintf(cmd, sizeof cmd, "'%s/h3-testdata' dit-official '%s'", bd ? bd : ".", g_full);
    if (system(cmd) != 0) {
        CHECK(0, "h3-testdata dit-official failed (%s)", cmd);
        return NULL;
    }
    h3_dit_open_opts o;
    memset(&o, 0, sizeof o);
    o.act_place = H3_PLACE_DEVICE;
    o.weight_place = H3_PLACE_HOST;
    o.stream_weights = 1;
    CHECK_OK(h3_dit_open(g_full, &o, &g_dit));
    return g_dit;
}

static h3_plan_model full_model(void) {
    h3_plan_model m;
    memset(&m, 0, sizeof m);
    m.dit = full_dit();
    m.dit_weights_in_file = 1;
    m.host_threads = 2;
    return m;
}

static const h3_plan_request W124 = {
    .frames = 124, .width = 960, .height = 544, .text_tokens = 128, .n_timesteps = 40, .steps = 20};
static const h3_plan_request W73 = {
    .frames = 73, .width = 960, .height = 544, .text_tokens = 128, .n_timesteps = 40, .steps = 20};
static const h3_plan_request W362 = {
    .frames = 362, .width = 960, .height = 544, .text_tokens = 128, .n_timesteps = 40, .steps = 20};

static h3_plan *plan_at(const h3_plan_request *r, int64_t vram, int64_t ram) {
    static h3_plan p;
    h3_plan_model m = full_model();
    h3_plan_budgets b = {.vram = vram, .ram = ram};
    h3_device_figures f;
    h3_device_figures_find("h200", &f);
    memset(&p, 0, sizeof p);
    CHECK_OK(h3_plan_make(&m, r, &b, &f, &p));
    return &p;
}

static void test_full_arithmetic(void) {
    h3_dit *d = full_dit();
    if (!d) return;
    /* a block: norms 2 x 5376, qkv 21504 x 5376, q/k norms 2 x 128, out 5376 x 7168, fc1 28672 x 5376, fc2
     * 5376 x 14336, bf16, each a multiple of 256 bytes */
    for (int u = 0; u < 52; u++) {
        h3_dit_pack p;
        h3_dit_pack_unit(d, u, &p);
        CHECK(p.bytes == 770725376, "unit %d packs to %lld bytes, expected 770,725,376", u,
              (long long)p.bytes);
        CHECK(p.bytes_8bit == 385617408, "unit %d at 8 bits: %lld, expected 385,617,408", u,
              (long long)p.bytes_8bit);
        CHECK(p.n == 8 && p.interleaved[2] == 1, "unit %d: %d tensors, qkv interleaved %d", u, p.n,
              p.interleaved[2]);
    }
    h3_dit_pack a;
    h3_dit_pack_adaln(d, 17, &a);
    CHECK(a.bytes == 520418304, "AdaLN of a block: %lld, expected 96768 x 2688 x 2 + 96768 x 2 = 520,418,304",
          (long long)a.bytes);
    /* patch projections, condition projection, time MLP, refiner and final norms, final AdaLN, output heads
     */
    CHECK(h3_dit_globals_device_bytes(d) == 181795584,
          "non-block weights on the device: %lld, expected 181,795,584",
          (long long)h3_dit_globals_device_bytes(d));
    /* W124: S 19412 = 128 text + 414 audio + 18870 video; bf16 activations */
    h3_dit_forward_mem fm;
    h3_dit_forward_mem_of(d, (int64_t)1 << 30, 0, 19412, 128, 18870, 414, 40, &fm);
    CHECK(fm.workspace == 3216857584, "W124 buffers, whole FFN: %lld, expected 3,216,857,584",
          (long long)fm.workspace);
    CHECK(fm.scratch == 405780480,
          "W124 scratch: the f32 projection of 18870 video rows, 18870 x 5376 x 4 = "
          "405,780,480; got %lld",
          (long long)fm.scratch);
    CHECK(fm.inputs == 9920512 && fm.outputs == 7299072, "inputs %lld, outputs %lld", (long long)fm.inputs,
          (long long)fm.outputs);
    CHECK(fm.mod_tables == 387932160,
          "40 timesteps of modulation: 50 x 120 x 32256 x 2 + 40 x 10752 x 2 = "
          "387,932,160; got %lld",
          (long long)fm.mod_tables);
    CHECK(fm.mod_peak == 388577280,
          "the modulation's peak: tables + a + one block's bf16 copy of a = 388,577,280; got "
          "%lld",
          (long long)fm.mod_peak);
    h3_dit_forward_mem_of(d, 4096, 0, 19412, 128, 18870, 414, 40, &fm);
    CHECK(fm.workspace == 1899436528 && fm.scratch == 88080384,
          "W124 with 4096-row chunks: buffers %lld (expected "
          "1,899,436,528), scratch %lld (expected 4096 x 5376 x 4)",
          (long long)fm.workspace, (long long)fm.scratch);
    /* the official file's interleaved QKV would need its fused scratch; the streamer hands over [Q; K; V] */
    h3_dit_forward_mem fi;
    h3_dit_forward_mem_of(d, 4096, 1, 19412, 128, 18870, 414, 40, &fi);
    CHECK(fi.workspace - fm.workspace == (int64_t)4096 * 3 * 7168 * 2, "interleaved scratch %lld",
          (long long)(fi.workspace - fm.workspace));

    /* A plan's figures add up: the forward's peak is the sum of its categories. */
    h3_plan *p = plan_at(&W124, 8 * GiB, 100 * GiB);
    const h3_dit_plan *t = &p->dit;
    CHECK(p->fits && t->fits, "W124 fits 8 GiB: %s", p->why);
    CHECK(t->dev_peak_forward == t->dev_backend + t->dev_globals + t->dev_resident + t->dev_slots +
                                     t->dev_modulation + t->dev_workspace + t->dev_io + t->dev_scratch,
          "the forward's peak is the sum of its parts");
    CHECK(t->dev_resident == (int64_t)t->n_resident * 770725376, "%d resident blocks: %lld bytes",
          t->n_resident, (long long)t->dev_resident);
    CHECK(t->dev_slots == (int64_t)t->n_slots * 770725376, "%d slots: %lld bytes", t->n_slots,
          (long long)t->dev_slots);
    CHECK(t->dev_backend == H3_CUDA_BACKEND_BYTES && t->dev_globals == 181795584,
          "backend %lld, globals %lld", (long long)t->dev_backend, (long long)t->dev_globals);
    CHECK(t->dev_peak + h3_budget_slack(8 * GiB) <= 8 * GiB, "peak %lld + slack within 8 GiB",
          (long long)t->dev_peak);
    CHECK(t->streamed_bytes == (int64_t)(52 - t->n_resident) * 770725376, "streamed bytes");
    printf("  W124 at 8 GiB: %d resident, %d slots, chunk %lld, peak %.3f GiB, %.3f s/step (resident %.3f)\n",
           t->n_resident, t->n_slots, (long long)t->chunk_rows, (double)t->dev_peak / GiB, t->t_step,
           t->t_resident);
}

/* ---- choices at budget edges --------------------------------------------------------------------------- */

/* The step time of an fp8 DiT comes from the fp8 GEMM rate: the release-shaped pruned DiT written header-only
 * as bf16 and as fp8 (h3-testdata model --header-only), planned resident at W124: the fp8 step is the bf16
 * step less the GEMMs' share of it times (1 - bf16 rate / fp8 rate), the attention and element-wise parts
 * unchanged. */
static void test_fp8_time(void) {
    const char *bd = getenv("H3_BUILD_DIR");
    static const char *const fmt[2] = {"bf16", "fp8"};
    double step[2] = {0, 0};
    h3_device_figures f;
    CHECK(h3_device_figures_find("h200", &f) && f.gemm_fp8_tflops > f.gemm_tflops,
          "fp8 %.0f, bf16 %.0f TFLOP/s", f.gemm_fp8_tflops, f.gemm_tflops);
    for (int i = 0; i < 2; i++) {
        char dir[1024], cmd[2300], tf[1100];
        t_tmp_path(i ? "model_fp8" : "model_bf16", dir, sizeof dir);
        snprintf(cmd, sizeof cmd,
                 "rm -rf '%s' && '%s/h3-testdata' model '%s' --header-only --dit %s >/dev/null", dir,
                 bd ? bd : ".", dir, fmt[i]);
        if (system(cmd) != 0) {
            CHECK(0, "%s", cmd);
            return;
        }
        snprintf(tf, sizeof tf, "%s/transformer", dir);
        h3_dit_open_opts o;
        memset(&o, 0, sizeof o);
        o.act_place = H3_PLACE_DEVICE;
        o.weight_place = H3_PLACE_HOST;
        o.stream_weights = 1;
        h3_dit *d = NULL;
        CHECK_OK(h3_dit_open(tf, &o, &d));
        if (!d) return;
        h3_plan_model m;
        memset(&m, 0, sizeof m);
        m.dit = d;
        m.dit_weights_in_file = 1;
        static h3_plan p;
        const h3_plan_budgets b = {.vram = (int64_t)139 * GiB, .ram = 0};
        CHECK_OK(h3_plan_make(&m, &W124, &b, &f, &p));
        CHECK(p.dit.n_resident == p.dit.n_units, "%s resident", fmt[i]);
        step[i] = p.dit.t_step;
        if (i == 1) { /* fp8 attention on top: its quantized q, k, v in the forward's scratch, its rate in the step */
            static h3_plan pa;
            h3_dit_set_attention(d, H3_ATTN_FP8);
            CHECK_OK(h3_plan_make(&m, &W124, &b, &f, &pa));
            h3_dit_set_attention(d, 0);
            const int64_t need = h3_cuda_granule(
                h3_cuda_attention_lowbit_scratch_bytes(H3_ATTN_FP8, pa.dit.S, pa.dit.S, h3_dit_get_config(d)->heads,
                                                    h3_dit_get_config(d)->heads));
            CHECK(pa.dit.attention == H3_ATTN_FP8 && p.dit.attention == 0, "attention %u, %u", pa.dit.attention,
                  p.dit.attention);
            CHECK(pa.dit.dev_scratch >= need && pa.dit.dev_peak > p.dit.dev_peak,
                  "fp8 attention scratch %lld of %lld needed; peak %lld vs %lld", (long long)pa.dit.dev_scratch,
                  (long long)need, (long long)pa.dit.dev_peak, (long long)p.dit.dev_peak);
            /* 50 blocks of W124 attention (10.8 TFLOP each) at 515 against the H200's fp8 rate */
            const double saved = 50 * 4.0 * 19412.0 * 19412.0 * 7168.0 * (1.0 / (f.attn_tflops * 1e12) -
                                                                              1.0 / (f.attn_fp8_tflops * 1e12));
            CHECK(f.attn_fp8_tflops > f.attn_tflops && fabs((p.dit.t_step - pa.dit.t_step) - saved) < 0.05 * saved,
                  "fp8 attention saves %.3f s of %.3f predicted", p.dit.t_step - pa.dit.t_step, saved);
            t_note("  W124 resident fp8 step with fp8 attention: %.3f s (%.3fx of bf16 attention's)", pa.dit.t_step,
                   pa.dit.t_step / p.dit.t_step);
        }
        h3_dit_close(d);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(system(cmd) == 0);
    }
    CHECK(step[1] < step[0] * 0.9 && step[1] > step[0] * 0.7, "W124 step: bf16 %.3f s, fp8 %.3f s (%.3fx)",
          step[0], step[1], step[1] / step[0]);
    t_note("  W124 resident step: bf16 %.3f s, fp8 %.3f s (%.3fx; measured 0.782x)", step[0], step[1],
           step[1] / step[0]);
}

/* --attention: what auto picks, and an explicit fp8 where no kernel runs it */
static void test_attention_resolve(void) {
    unsigned fl = 7;
    char why[96];
    h3_attn_mode m;
    CHECK_OK(h3_attn_mode_parse("fp8", &m));
    CHECK(m == H3_ATTN_MODE_FP8);
    CHECK_OK(h3_attn_mode_parse("int8", &m));
    CHECK(m == H3_ATTN_MODE_INT8);
    CHECK_ERR(h3_attn_mode_parse("fp9", &m), H3_ERR_INVALID, "auto, bf16, fp8, int8 or sparse");
    /* what h3_cuda_lowbit_attention reports for an H200, an RTX 4090 (sm_89), an RTX 3090 (sm_86) */
    const unsigned hopper = H3_CUDA_ATTN_FP8 | H3_CUDA_ATTN_FP8_HOPPER | H3_CUDA_ATTN_INT8,
                   ada = H3_CUDA_ATTN_FP8 | H3_CUDA_ATTN_INT8, ampere = H3_CUDA_ATTN_INT8;
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_AUTO, 1, hopper, 128, 1, 19412, NULL, &fl, why, sizeof why));
    CHECK(fl == H3_ATTN_FP8 && strstr(why, "auto"), "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_AUTO, 1, hopper, 128, 0, 19412,
                                  NULL, &fl, why, sizeof why)); /* bf16 w */
    CHECK(fl == 0 && strstr(why, "not fp8"), "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_AUTO, 1, hopper, 128, 1, 4000, NULL, &fl, why, sizeof why)); /* short */
    CHECK(fl == 0 && strstr(why, "8,192"), "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_AUTO, 1, 0, 128, 1, 19412, NULL, &fl, why, sizeof why)); /* no kernel */
    CHECK(fl == 0 && strstr(why, "no low-bit attention kernel"), "%u %s", fl, why);
    /* auto never picks the kernels not measured against the release: Ada's fp8, int8 */
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_AUTO, 1, ada, 128, 1, 19412, NULL, &fl, why, sizeof why));
    CHECK(fl == 0 && strstr(why, "unmeasured"), "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_AUTO, 1, hopper, 64, 1, 19412,
                                  NULL, &fl, why, sizeof why)); /* head 64 */
    CHECK(fl == 0 && strstr(why, "no low-bit attention kernel"), "%u %s", fl, why);
    CHECK_ERR(h3_attention_resolve(H3_ATTN_MODE_FP8, 1, hopper, 64, 1, 19412, NULL, &fl, why, sizeof why),
              H3_ERR_UNSUPPORTED, "head size of 128");
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_AUTO, 0, 0, 128, 1, 19412, NULL, &fl, why, sizeof why)); /* host */
    CHECK(fl == 0 && strstr(why, "host"), "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_BF16, 1, hopper, 128, 1, 19412, NULL, &fl, why, sizeof why));
    CHECK(fl == 0, "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_FP8, 0, 0, 128, 0, 100,
                                  NULL, &fl, why, sizeof why)); /* the host reference */
    CHECK(fl == H3_ATTN_FP8 && strstr(why, "reference"), "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_INT8, 0, 0, 128, 0, 100, NULL, &fl, why, sizeof why));
    CHECK(fl == H3_ATTN_INT8 && strstr(why, "reference"), "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_FP8, 1, hopper, 128, 0, 100, NULL, &fl, why, sizeof why));
    CHECK(fl == H3_ATTN_FP8 && strstr(why, "wgmma"), "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_FP8, 1, ada, 128, 0, 100, NULL, &fl, why, sizeof why));
    CHECK(fl == H3_ATTN_FP8 && strstr(why, "mma.sync"), "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_INT8, 1, ampere, 128, 0, 100, NULL, &fl, why, sizeof why));
    CHECK(fl == H3_ATTN_INT8 && strstr(why, "mma.sync"), "%u %s", fl, why);
    CHECK_ERR(h3_attention_resolve(H3_ATTN_MODE_FP8, 1, ampere, 128, 1, 19412, NULL, &fl, why, sizeof why),
              H3_ERR_UNSUPPORTED, "8.9 or later");
    CHECK(fl == 0);
    CHECK_ERR(h3_attention_resolve(H3_ATTN_MODE_INT8, 1, 0, 128, 1, 19412,
                                   NULL, &fl, why, sizeof why), H3_ERR_UNSUPPORTED,
              "7.5 or later");
    /* sparse: asked for only (auto never), Hopper's kernel or the host's reference */
    CHECK_OK(h3_attn_mode_parse("sparse", &m));
    CHECK(m == H3_ATTN_MODE_SPARSE);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_SPARSE, 1, hopper | H3_CUDA_ATTN_SPARSE, 128, 0, 55904, NULL, &fl,
                                  why, sizeof why));
    CHECK(fl == H3_ATTN_SPARSE && strstr(why, "wgmma") && strstr(why, "4,096 rows or more"), "%u %s", fl, why);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_SPARSE, 0, 0, 128, 0, 1000, NULL, &fl, why, sizeof why));
    CHECK(fl == H3_ATTN_SPARSE && strstr(why, "reference") && strstr(why, "dense: under"), "%u %s", fl, why);
    CHECK_ERR(h3_attention_resolve(H3_ATTN_MODE_SPARSE, 1, ada, 128, 0, 55904, NULL, &fl, why, sizeof why),
              H3_ERR_UNSUPPORTED, "Hopper");
    CHECK_ERR(h3_attention_resolve(H3_ATTN_MODE_SPARSE, 1, hopper | H3_CUDA_ATTN_SPARSE, 64, 0, 55904, NULL, &fl,
                                  why, sizeof why),
              H3_ERR_UNSUPPORTED, "head size of 128");
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_AUTO, 1, hopper | H3_CUDA_ATTN_SPARSE, 128, 0, 55904, NULL, &fl,
                                  why, sizeof why));
    CHECK(fl == 0, "auto never picks sparse: %u %s", fl, why);
    /* its rule (--sparse): stated in why; parsed with its defaults and bounds */
    h3_sparse_rule sp;
    CHECK_OK(h3_sparse_rule_parse("0.5,0,1", &sp));
    CHECK(sp.tau == 0.5f && sp.start == 0.0f && sp.end == 1.0f);
    CHECK_OK(h3_attention_resolve(H3_ATTN_MODE_SPARSE, 0, 0, 128, 0, 5000, &sp, &fl, why, sizeof why));
    CHECK(fl == H3_ATTN_SPARSE && strstr(why, "tau 0.5, steps 0..1,"), "%s", why);
    CHECK_OK(h3_sparse_rule_parse("2", &sp));
    CHECK(sp.tau == 2.0f && sp.start == H3_DIT_SPARSE_T0 && sp.end == H3_DIT_SPARSE_T1);
    CHECK_OK(h3_sparse_rule_parse("-1.5,0.25,0.75", &sp));
    CHECK(sp.tau == -1.5f && sp.start == 0.25f && sp.end == 0.75f);
    const char *bad[] = {"", "x", "1.3,", "1.3,0.2", "1.3,0.9,0.2", "1.3,0.2,0.2", "1.3,-0.1,0.5", "1.3,0.2,1.5",
                         "11", "nan", "inf", "1.3,0.2,0.9,", "1.3;0.2;0.9", "1.3,0.2,0.9 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_ERR(h3_sparse_rule_parse(bad[i], &sp), H3_ERR_INVALID, "give TAU or TAU,START,END");
    CHECK_ERR(h3_sparse_rule_parse(NULL, &sp), H3_ERR_INVALID, "give TAU or TAU,START,END");
    /* a request's rule (generate's check) and --sparse as the commands take it */
    const h3_sparse_rule wide = {0.5f, 0.0f, 1.0f}, shut = {1.3f, 0.5f, 0.5f};
    CHECK_OK(h3_sparse_rule_fits(&wide, H3_ATTN_MODE_SPARSE));
    CHECK_ERR(h3_sparse_rule_fits(&shut, H3_ATTN_MODE_SPARSE), H3_ERR_INVALID, "START < END");
    CHECK_ERR(h3_sparse_rule_fits(&wide, H3_ATTN_MODE_FP8), H3_ERR_INVALID, "give --attention sparse");
    h3_attn_mode am = H3_ATTN_MODE_AUTO;
    CHECK_OK(h3_sparse_rule_take("0.5,0,1", 0, &am, &sp));
    CHECK(am == H3_ATTN_MODE_SPARSE && sp.tau == 0.5f);
    am = H3_ATTN_MODE_BF16;
    CHECK_ERR(h3_sparse_rule_take("0.5", 1, &am, &sp), H3_ERR_INVALID, "give --attention sparse");
}

static void test_budget_edges(void) {
    if (!full_dit()) return;
    /* Where copies hide (W124), the goals: W124 at 8 GiB within 1.05x, W73 at 6 GiB within 1.10x. */
    h3_plan *p = plan_at(&W124, 8 * GiB, 100 * GiB);
    CHECK(p->fits && p->dit.t_step <= 1.05 * p->dit.t_resident, "W124 at 8 GiB: %.3f vs %.3f s",
          p->dit.t_step, p->dit.t_resident);
    CHECK(p->dit.tier[0] == H3_TIER_RESIDENT && p->dit.tier[1] == H3_TIER_RESIDENT,
          "the refiner blocks (no compute to hide their copies behind) are resident first");
    p = plan_at(&W73, 6 * GiB, 100 * GiB);
    CHECK(p->fits && p->dit.t_step <= 1.10 * p->dit.t_resident, "W73 at 6 GiB: %.3f vs %.3f s", p->dit.t_step,
          p->dit.t_resident);
    /* Everything resident when it fits: no block streams, and the AdaLN pass has its two slots. */
    p = plan_at(&W124, 130 * GiB, 0);
    CHECK(p->fits && p->dit.n_resident == 52 && p->dit.streamed_bytes == 0 && p->dit.n_slots == 2 &&
              p->dit.slot_bytes == 520418304,
          "130 GiB: %d resident, %d slots of %lld", p->dit.n_resident, p->dit.n_slots,
          (long long)p->dit.slot_bytes);
    CHECK(fabs(p->dit.t_step - p->dit.t_resident) < 1e-9, "all resident: the resident time");
    /* More budget never streams more (W124: copies hide, so ties go to fewer streamed bytes). */
    int64_t prev = INT64_MAX;
    for (int64_t g = 6; g <= 48; g += 2) {
        p = plan_at(&W124, g * GiB, 0);
        if (!p->fits) continue;
        CHECK(p->dit.streamed_bytes <= prev, "%lld GiB streams %lld bytes, more than %lld at less budget",
              (long long)g, (long long)p->dit.streamed_bytes, (long long)prev);
        CHECK(p->dit.dev_peak + h3_budget_slack(g * GiB) <= g * GiB, "%lld GiB: peak %lld over the budget",
              (long long)g, (long long)p->dit.dev_peak);
        prev = p->dit.streamed_bytes;
    }
    /* One more block's worth of budget: one block less streamed. */
    p = plan_at(&W124, 10 * GiB, 0);
    h3_dit_plan base = p->dit;
    int64_t more = base.dev_peak + 770725376;
    int64_t b2 = (int64_t)ceil((double)more / 0.99) + 1;
    if (b2 < more + 64 * MiB) b2 = more + 64 * MiB;
    p = plan_at(&W124, b2, 0);
    CHECK(p->dit.streamed_bytes <= base.streamed_bytes - 770725376,
          "at %lld bytes: %lld streamed, expected at most %lld", (long long)b2,
          (long long)p->dit.streamed_bytes, (long long)(base.streamed_bytes - 770725376));
    /* Host budget: exactly n streamed blocks fit pinned; the rest go to disk. */
    p = plan_at(&W124, 8 * GiB, 100 * GiB);
    base = p->dit;
    int streamed = 52 - base.n_resident;
    int64_t ram = base.host_staging + base.host_other + 10 * (int64_t)770725376 + 770725376 / 2;
    p = plan_at(&W124, 8 * GiB, ram);
    /* (disk reads are slow: the planner may then trade FFN chunk size for more resident blocks) */
    streamed = 52 - p->dit.n_resident;
    CHECK(p->fits && p->dit.n_pinned == 10 && p->dit.n_disk == streamed - 10 &&
              p->dit.n_resident >= base.n_resident,
          "host budget %lld: %d pinned, %d disk (expected 10, %d)", (long long)ram, p->dit.n_pinned,
          p->dit.n_disk, streamed - 10);
    CHECK(p->dit.host_peak <= ram, "host peak %lld over %lld", (long long)p->dit.host_peak, (long long)ram);
    CHECK(p->dit.t_read > 0 && p->dit.t_step > base.t_step, "disk reads cost time: %.3f s vs %.3f s",
          p->dit.t_step, base.t_step);
    /* Below the staging and tables, nothing fits: the host budget is named. */
    p = plan_at(&W124, 8 * GiB, base.host_staging + base.host_other - 1);
    CHECK(!p->fits && strstr(p->why, "host budget"), "host budget too small: %s", p->why);
}

static void test_no_fit(void) {
    if (!full_dit()) return;
    h3_plan *p = plan_at(&W362, 2 * GiB, 100 * GiB);
    CHECK(!p->fits, "W362 cannot fit 2 GiB");
    CHECK(strstr(p->why, "device budget of 2.00 GiB is short by") != NULL, "message: %s", p->why);
    CHECK(strstr(p->why, "Would fit: --vram-budget") != NULL, "message: %s", p->why);
    CHECK_ERR(h3_plan_check(p), H3_ERR_BUDGET, "do not fit");
    h3_plan q = *p;
    printf("  %s\n", q.why);
    /* every suggestion fits; the smallest budget is tight to 64 MiB */
    CHECK(q.min_vram > 2 * GiB, "smallest budget %lld", (long long)q.min_vram);
    p = plan_at(&W362, q.min_vram, 100 * GiB);
    CHECK(p->fits, "W362 at the named %lld bytes: %s", (long long)q.min_vram, p->why);
    p = plan_at(&W362, q.min_vram - 64 * MiB, 100 * GiB);
    CHECK(!p->fits, "W362 fits 64 MiB below the smallest budget named");
    CHECK(q.fit_frames > 0 && (q.fit_frames - 5) % 17 == 0 && q.fit_frames < 362, "fewer frames: %lld",
          (long long)q.fit_frames);
    h3_plan_request r = W362;
    r.frames = q.fit_frames;
    p = plan_at(&r, 2 * GiB, 100 * GiB);
    CHECK(p->fits, "%lld frames fit 2 GiB", (long long)r.frames);
    r.frames = q.fit_frames + 17;
    p = plan_at(&r, 2 * GiB, 100 * GiB);
    CHECK(!p->fits, "%lld frames (one step more) do not fit 2 GiB", (long long)r.frames);
    CHECK(q.fit_width > 0 && q.fit_width % 32 == 0 && q.fit_height % 32 == 0, "canvas %lldx%lld",
          (long long)q.fit_width, (long long)q.fit_height);
    r = W362;
    r.width = q.fit_width;
    r.height = q.fit_height;
    p = plan_at(&r, 2 * GiB, 100 * GiB);
    CHECK(p->fits, "the suggested %lldx%lld canvas fits", (long long)r.width, (long long)r.height);
    /* a request the 8-bit suggestion decides: W124 (40 timesteps) needs 2.88 GiB with bf16 blocks; at 2.75
     * GiB a slot of 8-bit blocks (half the bytes) would fit */
    p = plan_at(&W124, 11 * GiB / 4, 100 * GiB);
    CHECK(!p->fits && p->fits_8bit && strstr(p->why, "8-bit"), "W124 at 2.75 GiB: fits %d, 8-bit %d: %s",
          p->fits, p->fits_8bit, p->why);
    /* bad requests are errors, not plans */
    h3_plan_model m = full_model();
    h3_plan_budgets b = {.vram = 8 * GiB, .ram = 0};
    h3_plan_request bad = W124;
    bad.frames = 100;
    static h3_plan pp;
    CHECK_ERR(h3_plan_make(&m, &bad, &b, NULL, &pp), H3_ERR_INVALID, "17n+5");
    bad = W124;
    bad.width = 1000;
    CHECK_ERR(h3_plan_make(&m, &bad, &b, NULL, &pp), H3_ERR_INVALID, "multiples of 32");
}

static void test_format(void) {
    if (!full_dit()) return;
    h3_plan *p = plan_at(&W124, 8 * GiB, 64 * GiB);
    char *s = h3_plan_format(p);
    CHECK(s != NULL, "format");
    if (!s) return;
    const char *want[] = {"DiT: 19412 packed rows", "placement:",  "device peak",    "resident weights",
                          "stream slots",           "activations", "time per step:", "pinned staging"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(strstr(s, want[i]) != NULL, "lacks '%s'", want[i]);
    h3_free(s);
}

/* ---- a DiT split over several GPUs (h3_plan_request.gpus) ------------------------------------------------- */

static h3_plan *plan_gpus(const h3_plan_request *r0, int gpus, const h3_plan_budgets *b) {
    static h3_plan p;
    h3_plan_request r = *r0;
    r.gpus = gpus;
    h3_plan_model m = full_model();
    h3_device_figures f;
    h3_device_figures_find("h200", &f);
    memset(&p, 0, sizeof p);
    CHECK_OK(h3_plan_make(&m, &r, b, &f, &p));
    return &p;
}

static void test_split(void) {
    h3_dit *d = full_dit();
    if (!d) return;
    /* rank 0 of 2 at W124 (rows 0..9706), whole FFN: the whole forward's 3,216,857,584 less q, k, v, o and the FFN's
     * u and g for the 9706 rows it does not run, (19412 - 9706) x (4 x 7168 + 3 x 14336) x 2 = 1,391,452,160; the
     * exchange: the send buffer 3 x 2 x 9706 rows and the receive buffer 4 x 19412 rows, of 3584 bf16 columns */
    int64_t ws = 0, xb = 0;
    {
        h3_dit_forward_mem fm;
        h3_dit_forward_mem_sp(d, (int64_t)1 << 30, 0, 19412, 128, 18870, 414, 40, 2, 0, &fm);
        ws = fm.workspace;
        xb = fm.exchange;
    }
    CHECK(ws == 1825405424 && xb == 974016512,
          "W124, rank 0 of 2: buffers %lld (expected 1,825,405,424), exchange %lld (expected 974,016,512)",
          (long long)ws, (long long)xb);

    const h3_plan_budgets big = {.vram = 139 * GiB, .ram = 0};
    h3_plan *one = plan_gpus(&W124, 1, &big);
    const double t1 = one->dit.t_step;
    const int64_t peak1 = one->dit.dev_peak; /* plan_gpus's plan is reused below */
    CHECK(one->dit.gpus == 1 && one->dit.dev_exchange == 0 && one->dit.t_exchange == 0, "one GPU: no exchange");
    h3_plan *p = plan_gpus(&W124, 2, &big);
    CHECK(p->fits, "W124 on two H200s: %s", p->why);
    for (int i = 0; i < 2; i++) {
        const h3_dit_plan *g = &p->dit_gpu[i];
        CHECK(g->gpus == 2 && g->rank == i && g->row0 == 9706 * i && g->rows == 9706, "GPU %d: rows %lld+%lld", i,
              (long long)g->row0, (long long)g->rows);
        CHECK(g->fits && g->n_resident == g->n_units, "GPU %d: all resident at 139 GiB", i);
        CHECK(g->dev_peak_forward == g->dev_backend + g->dev_globals + g->dev_resident + g->dev_slots +
                                         g->dev_modulation + g->dev_workspace + g->dev_io + g->dev_scratch +
                                         g->dev_exchange,
              "GPU %d: the forward's peak is the sum of its parts", i);
        CHECK(g->dev_exchange >= 974016512 && g->dev_exchange <= 974016512 + 1024, "GPU %d: exchange %lld", i,
              (long long)g->dev_exchange);
        /* 50 blocks of q, k, v from the other rank's 9706 rows and o of its own 9706 rows for the other's heads
         * (4 x 9706 x 3584 x 2 bytes), then the other's 9706 rows of the stream (x 5376 x 2) */
        CHECK(g->exchange_bytes == 14018880512LL, "GPU %d receives %lld bytes a step, Ulysses 14,018,880,512", i,
              (long long)g->exchange_bytes);
        CHECK(fabs(g->t_exchange - 14018880512.0 / 360e9) < 1e-6, "GPU %d: exchanges %.4f s", i, g->t_exchange);
    }
    const double t2 = p->dit.t_step;
    CHECK(t2 < 0.55 * t1 && t2 > 0.5 * t1, "two GPUs: %.3f s a step against one GPU's %.3f (%.3fx)", t2, t1,
          t2 / t1);
    CHECK(p->dit.dev_peak < peak1, "a GPU's peak %lld is below one GPU's %lld", (long long)p->dit.dev_peak,
          (long long)peak1);
    printf("  W124 resident: one H200 %.3f s a step, two %.3f s (%.3fx), exchanges %.3f s\n", t1, t2, t2 / t1,
           p->dit.t_exchange);

    /* 8 GiB a GPU: every GPU streams, its step within 1.1x of the two GPUs' resident step */
    const h3_plan_budgets b8 = {.vram = 8 * GiB, .ram = 0};
    p = plan_gpus(&W124, 2, &b8);
    CHECK(p->fits, "W124 on two GPUs at 8 GiB: %s", p->why);
    for (int i = 0; i < 2; i++) {
        const h3_dit_plan *g = &p->dit_gpu[i];
        CHECK(g->n_pinned > 0 && g->dev_peak + h3_budget_slack(8 * GiB) <= 8 * GiB, "GPU %d at 8 GiB: %d pinned, peak %lld",
              i, g->n_pinned, (long long)g->dev_peak);
        CHECK(g->t_step <= 1.1 * t2, "GPU %d at 8 GiB: %.3f s a step against %.3f resident", i, g->t_step, t2);
    }
    printf("  W124 at 8 GiB a GPU: %.3f s a step (%d blocks resident)\n", p->dit.t_step, p->dit.n_resident);

    /* budgets of their own: the GPU with more memory keeps more blocks; the host's shared equally */
    h3_plan_budgets mixed = {.vram = 8 * GiB, .ram = 60 * GiB};
    mixed.vram_gpu[1] = 16 * GiB;
    p = plan_gpus(&W124, 2, &mixed);
    CHECK(p->fits, "8 and 16 GiB: %s", p->why);
    CHECK(p->dit_gpu[1].n_resident > p->dit_gpu[0].n_resident, "16 GiB keeps %d blocks, 8 GiB %d",
          p->dit_gpu[1].n_resident, p->dit_gpu[0].n_resident);
    for (int i = 0; i < 2; i++)
        CHECK(p->dit_gpu[i].host_peak <= 30 * GiB, "GPU %d's host peak %lld within half of 60 GiB", i,
              (long long)p->dit_gpu[i].host_peak);
    char *s = h3_plan_format(p);
    const char *want[] = {"split over 2 GPUs", "each GPU:", "exchange buffers", "of 16.00 GiB", "exchanges:"};
    for (size_t i = 0; s && i < sizeof want / sizeof want[0]; i++)
        CHECK(strstr(s, want[i]) != NULL, "the report lacks '%s'", want[i]);
    h3_free(s);

    /* 56 heads split over 2, 4, 7 or 8 GPUs only; at most H3_PLAN_MAX_GPUS */
    h3_plan_model m = full_model();
    h3_plan_request r = W124;
    h3_plan q;
    r.gpus = 3;
    h3_clear_error();
    CHECK(h3_plan_make(&m, &r, &big, NULL, &q) == H3_ERR_INVALID && strstr(h3_last_error(), "give 2, 4, 7, 8"),
          "3 GPUs: %s", h3_last_error());
    r.gpus = H3_PLAN_MAX_GPUS + 1;
    CHECK(h3_plan_make(&m, &r, &big, NULL, &q) == H3_ERR_INVALID, "%d GPUs accepted", r.gpus);
    h3_clear_error();
}

/* ---- the other stages: the models' own figures ----------------------------------------------------------
 */

/* The release-shaped folder at half width, header-only (h3-testdata model --scale 2: the nvfp4 text encoder
 * with its int8 embedding and vision tower, the f16 video VAE, the f32 audio VAE). */
static char g_rel[1024];

static int rel_folder(void) {
    if (g_rel[0]) return 1;
    char cmd[2400];
    const char *bd = getenv("H3_BUILD_DIR");
    t_tmp_path("release_s2", g_rel, sizeof g_rel);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && '%s/h3-testdata' model '%s' --header-only --scale 2 >/dev/null",
             g_rel, bd ? bd : ".", g_rel);
    if (system(cmd) != 0) {
        CHECK(0, "h3-testdata model --header-only --scale 2 failed (%s)", cmd);
        g_rel[0] = 0;
        return 0;
    }
    return 1;
}

static void rel_sub(const char *sub, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", g_rel, sub);
}

/* Bytes of the file's tensors named "<...>layers.<l>.<...>" for l < layers, outside the vision tower: what
 * running the first `layers` layers reads, as stored. */
static int64_t te_file_layer_bytes(const char *set_path, int layers) {
    h3_st_set s;
    if (h3_st_open(set_path, &s) != H3_OK) return -1;
    int64_t total = 0;
    for (int64_t i = 0; i < s.n_entries; i++) {
        const char *nm = s.entries[i].name, *p = strstr(nm, "layers.");
        if (!p || strstr(nm, "visual")) continue;
        if (atoi(p + 7) < layers) total += (int64_t)(s.entries[i].end - s.entries[i].begin);
    }
    h3_st_close(&s);
    return total;
}

/* Each stage plan other than the DiT's holds the figures of the model's own memory function (the text
 * encoder's h3_text_encoder_device_bytes, the video VAE's h3_video_vae_plan and decode_peak, the audio VAE's
 * h3_audio_vae_decode_peak) at the budget that puts it on the device and at one that sends it to the host;
 * the text encoder's bytes read per prompt are its 50 layers' bytes in the file (they were an average bytes
 * per parameter over the whole file, its vision tower and int8 embedding included: 3.5 times too many). */
static void test_stage_plans(void) {
    if (!rel_folder()) return;
    char p[1100];
    h3_text_encoder *te = NULL;
    h3_video_vae *vv = NULL;
    h3_audio_vae *av = NULL;
    rel_sub("text_encoder", p, sizeof p);
    CHECK_OK(h3_text_encoder_open(p, NULL, &te));
    rel_sub("video_vae", p, sizeof p);
    CHECK_OK(h3_video_vae_open(p, NULL, &vv));
    rel_sub("audio_vae", p, sizeof p);
    CHECK_OK(h3_audio_vae_open(p, NULL, &av));
    if (!te || !vv || !av) goto done;
    h3_device_figures f;
    h3_device_figures_find("h200", &f);
    const h3_plan_budgets b8 = {.vram = 8 * GiB, .ram = 100 * GiB};
    h3_stage_plan *sp = calloc(1, sizeof *sp);
    if (!sp) goto done;

    /* text encoder, W124's 128 tokens to hidden_states[50] */
    CHECK_OK(h3_plan_text_encoder(te, 128, 50, &b8, &f, sp));
    int64_t want = h3_text_encoder_device_bytes(te, 128, 50);
    CHECK(sp->on_device && sp->fits && sp->dev_peak == want && sp->dev_need == want,
          "text encoder at 8 GiB: on the device %d, peak %lld, h3_text_encoder_device_bytes %lld",
          sp->on_device, (long long)sp->dev_peak, (long long)want);
    rel_sub("text_encoder/qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors", p, sizeof p);
    int64_t file = te_file_layer_bytes(p, 50);
    CHECK(file > 0 && llabs(sp->weight_bytes - file) <= file / 100,
          "text encoder: %lld bytes read per prompt planned, its 50 layers hold %lld in the file",
          (long long)sp->weight_bytes, (long long)file);
    t_note("  text encoder: %.3f GiB read per prompt (the file's 50 layers: %.3f GiB), device peak %.3f GiB",
           (double)sp->weight_bytes / GiB, (double)file / GiB, (double)sp->dev_peak / GiB);
    const h3_plan_budgets small = {.vram = want - 1, .ram = 100 * GiB};
    CHECK_OK(h3_plan_text_encoder(te, 128, 50, &small, &f, sp));
    CHECK(!sp->on_device && sp->fits && sp->dev_need == want && sp->dev_peak == 0 &&
              sp->host_peak == h3_plan_te_activation_bytes(h3_text_encoder_config(te), 128, 0) &&
              strstr(sp->reason, "more than the device budget"),
          "text encoder below its need: on the device %d, host %lld, reason '%s'", sp->on_device,
          (long long)sp->host_peak, sp->reason);

    /* video VAE, W124's latents [24, 37, 34, 60] */
    const h3_video_vae_config *vc = h3_video_vae_get_config(vv);
    h3_video_vae_run run;
    memset(&run, 0, sizeof run);
    run.place = H3_PLACE_DEVICE;
    run.vram_budget = b8.vram;
    run.ram_budget = b8.ram;
    run.threads = 2;
    h3_video_vae_mem m;
    CHECK_OK(h3_video_vae_plan(vv, 37, 34, 60, &run, &m));
    CHECK_OK(h3_plan_video_vae(vv, 37, 34, 60, 12345, 2, &b8, &f, sp));
    CHECK(sp->on_device && sp->fits && sp->dev_peak == m.dev_peak &&
              sp->host_peak == m.total + m.host_pinned && sp->vvae.n_resident == m.n_resident &&
              sp->vvae.tile_batch == m.tile_batch && sp->vvae.rows_per_step == m.rows_per_step &&
              sp->n_resident == m.n_resident && sp->weight_bytes == 12345 && sp->t_run > 0,
          "video VAE at 8 GiB: peak %lld (its plan %lld), %d resident (%d), %d tiles a pass (%d)",
          (long long)sp->dev_peak, (long long)m.dev_peak, sp->vvae.n_resident, m.n_resident,
          sp->vvae.tile_batch, m.tile_batch);
    const h3_plan_budgets tiny = {.vram = 64 * MiB, .ram = 100 * GiB};
    CHECK_OK(h3_plan_video_vae(vv, 37, 34, 60, 12345, 2, &tiny, &f, sp));
    CHECK_OK(h3_video_vae_decode_peak(vc, 37, 34, 60, 2, 0, &m));
    CHECK(!sp->on_device && sp->fits && sp->host_peak == m.total && sp->dev_need > 64 * MiB &&
              strstr(sp->reason, "needs at least"),
          "video VAE at 64 MiB: on the device %d, host %lld (decode_peak %lld), need %lld, reason '%s'",
          sp->on_device, (long long)sp->host_peak, (long long)m.total, (long long)sp->dev_need, sp->reason);
    /* the least it needs there is a plan that fits that budget (with its slack) */
    const h3_plan_budgets need = {.vram = sp->dev_need + h3_budget_slack(sp->dev_need) + 64 * MiB, .ram = 100 * GiB};
    CHECK_OK(h3_plan_video_vae(vv, 37, 34, 60, 12345, 2, &need, &f, sp));
    CHECK(sp->on_device, "video VAE at its named need plus slack: on the device %d (%s)", sp->on_device,
          sp->reason);

    /* audio VAE, 207 latents a channel, stereo */
    h3_audio_vae_mem am;
    CHECK_OK(h3_audio_vae_decode_peak(h3_audio_vae_get_config(av), 207, 2, &am));
    CHECK_OK(h3_plan_audio_vae(av, 207, 2, 777, &b8, &f, sp));
    CHECK(sp->on_device && sp->fits && sp->dev_peak == am.dev_total + H3_CUDA_BACKEND_BYTES &&
              sp->avae.dev_weights == am.dev_weights && sp->host_peak == 777,
          "audio VAE at 8 GiB: peak %lld, dev_total %lld + the backend's %lld", (long long)sp->dev_peak,
          (long long)am.dev_total, (long long)H3_CUDA_BACKEND_BYTES);
    const h3_plan_budgets abud = {.vram = am.dev_total, .ram = 100 * GiB};
    CHECK_OK(h3_plan_audio_vae(av, 207, 2, 777, &abud, &f, sp));
    CHECK(!sp->on_device && sp->host_peak == am.total + 777 &&
              sp->dev_need == am.dev_total + H3_CUDA_BACKEND_BYTES,
          "audio VAE below its need: on the device %d, host %lld", sp->on_device, (long long)sp->host_peak);

    /* The whole request: the same stage plans, each on the device within the budget. */
    h3_plan_model pm;
    memset(&pm, 0, sizeof pm);
    pm.te = te;
    pm.vvae = vv;
    pm.avae = av;
    pm.vvae_weight_bytes = 12345;
    pm.avae_weight_bytes = 777;
    pm.host_threads = 2;
    static h3_plan pl;
    CHECK_OK(h3_plan_make(&pm, &W124, &b8, &f, &pl));
    CHECK_OK(h3_plan_text_encoder(te, 128, 50, &b8, &f, sp));
    CHECK(pl.fits && pl.te.dev_peak == sp->dev_peak && pl.te.weight_bytes == sp->weight_bytes,
          "the plan's text encoder is h3_plan_text_encoder's");
    CHECK_OK(h3_plan_video_vae(vv, 37, 34, 60, 12345, 2, &b8, &f, sp));
    CHECK(pl.vvae.dev_peak == sp->dev_peak && pl.vvae.host_peak == sp->host_peak, "the plan's video VAE");
    CHECK(pl.vvae_gpus == 1, "one GPU: the decode split over %d", pl.vvae_gpus);
    { /* two GPUs: the first decodes chunks 0, 2, 4, 6 of 7 and gathers 3 canvases of 3 x 22 x 544 x 960 f32
       * at 360 GB/s (17 frames and the 5 it cross-fades into the next); a second GPU too small for a decoder
       * leaves the decode to the first */
        static h3_plan p2;
        h3_plan_request r2 = W124;
        r2.gpus = 2;
        CHECK_OK(h3_plan_make(&pm, &r2, &b8, &f, &p2));
        const int64_t canvas = 3LL * 22 * 544 * 960 * 4;
        CHECK(p2.vvae.vvae.canvas_bytes == canvas, "a chunk's canvas %lld bytes, expected %lld",
              (long long)p2.vvae.vvae.canvas_bytes, (long long)canvas);
        const double expect = pl.vvae.t_run * 4 / 7 + 3.0 * canvas / 360e9;
        CHECK(p2.vvae_gpus == 2 && fabs(p2.vvae.t_run - expect) < 1e-9 &&
                  strstr(p2.vvae.detail, "split over 2 GPUs"),
              "two GPUs: the decode over %d, %.4f s (expected %.4f), '%s'", p2.vvae_gpus, p2.vvae.t_run,
              expect, p2.vvae.detail);
        const double t_two = p2.vvae.t_run;
        char *txt = h3_plan_format(&p2);
        CHECK(txt && strstr(txt, "the video VAE split over them too"), "the report: %s", txt ? txt : "");
        h3_free(txt);
        h3_plan_budgets lop = b8;
        lop.vram_gpu[1] = 64 * MiB;
        CHECK_OK(h3_plan_make(&pm, &r2, &lop, &f, &p2));
        CHECK(p2.vvae_gpus == 1 && fabs(p2.vvae.t_run - pl.vvae.t_run) < 1e-9 &&
                  strstr(p2.vvae.detail, "on the first GPU alone: GPU 1's budget"),
              "GPU 1 at 64 MiB: the decode over %d, '%s'", p2.vvae_gpus, p2.vvae.detail);
        t_note("  video VAE of W124 on two GPUs: %.3f s predicted against one's %.3f (%.3fx; figures of this "
               "test)",
               t_two, pl.vvae.t_run, t_two / pl.vvae.t_run);
    }
    CHECK_OK(h3_plan_audio_vae(av, 207, 2, 777, &b8, &f, sp));
    CHECK(pl.avae.dev_peak == sp->dev_peak && pl.avae.host_peak == sp->host_peak, "the plan's audio VAE");
    const h3_stage_plan *all[3] = {&pl.te, &pl.avae, &pl.vvae};
    for (int i = 0; i < 3; i++)
        CHECK(all[i]->on_device && all[i]->dev_peak + h3_budget_slack(b8.vram) <= b8.vram,
              "stage %d: on the device %d, peak %lld", i, all[i]->on_device, (long long)all[i]->dev_peak);

    /* A DiT placement kept between runs (a session): the stages before the DiT (the text encoder) and after
     * it (the VAEs) each fit with their peak, the kept bytes and the quantized GEMMs' scratch within the
     * device budget, their host peak and the kept pinned bytes within the host budget; one byte more does
     * not, naming the stage. */
    {
        char why[320] = "";
        CHECK(h3_plan_fits_beside_dit(&pl, 1, 0, 0, why, sizeof why) &&
                  h3_plan_fits_beside_dit(&pl, 0, 0, 0, why, sizeof why),
              "nothing kept: every stage fits (%s)", why);
        const int vbig = pl.vvae.dev_peak >= pl.avae.dev_peak;
        const int64_t room_after =
            b8.vram - H3_CUDA_QGEMM_SCRATCH_BYTES - (vbig ? pl.vvae.dev_peak : pl.avae.dev_peak);
        const int64_t room_before = b8.vram - H3_CUDA_QGEMM_SCRATCH_BYTES - pl.te.dev_peak;
        CHECK(h3_plan_fits_beside_dit(&pl, 0, room_after, 0, why, sizeof why), "%.3f GiB kept beside the VAEs: %s",
              (double)room_after / GiB, why);
        why[0] = 0;
        CHECK(!h3_plan_fits_beside_dit(&pl, 0, room_after + 1, 0, why, sizeof why) &&
                  strstr(why, vbig ? "the video VAE's device peak" : "the audio VAE's device peak"),
              "a byte more beside the VAEs: '%s'", why);
        CHECK(h3_plan_fits_beside_dit(&pl, 1, room_before, 0, why, sizeof why), "beside the text encoder: %s", why);
        why[0] = 0;
        CHECK(!h3_plan_fits_beside_dit(&pl, 1, room_before + 1, 0, why, sizeof why) &&
                  strstr(why, "the text encoder's device peak"),
              "a byte more beside the text encoder: '%s'", why);
        const int64_t hmax = pl.vvae.host_peak > pl.avae.host_peak ? pl.vvae.host_peak : pl.avae.host_peak;
        CHECK(h3_plan_fits_beside_dit(&pl, 0, 0, b8.ram - hmax, why, sizeof why), "pinned beside the VAEs: %s",
              why);
        why[0] = 0;
        CHECK(!h3_plan_fits_beside_dit(&pl, 0, 0, b8.ram - hmax + 1, why, sizeof why) &&
                  strstr(why, "host peak") && strstr(why, "pinned"),
              "a pinned byte more beside the VAEs: '%s'", why);
        h3_plan unl = pl;
        unl.budgets.ram = 0; /* not limited */
        CHECK(h3_plan_fits_beside_dit(&unl, 0, 0, 1000 * GiB, why, sizeof why), "an unlimited host: %s", why);
        t_note("  kept beside the stages: at most %.3f GiB before the DiT, %.3f GiB after it (8 GiB budget)",
               (double)room_before / GiB, (double)room_after / GiB);
    }

    /* Files in the page cache read at the cache's rate: with the text encoder's files all cached, its
     * streamed layers' read time (the larger of compute and read per layer, reads dominating here) falls by
     * the ratio of the two rates; half cached, it lies between (harmonic mix); the video VAE's load likewise.
     */
    {
        static h3_plan cold, warm, half;
        CHECK(f.cache_gbs > f.disk_gbs && f.disk_gbs > 0, "figures: cache %.1f, disk %.1f GB/s", f.cache_gbs,
              f.disk_gbs);
        CHECK_OK(h3_plan_make(&pm, &W124, &b8, &f, &cold));
        pm.te_cached = pm.vvae_cached = 1.0;
        CHECK_OK(h3_plan_make(&pm, &W124, &b8, &f, &warm));
        pm.te_cached = pm.vvae_cached = 0.5;
        CHECK_OK(h3_plan_make(&pm, &W124, &b8, &f, &half));
        pm.te_cached = pm.vvae_cached = 0;
        const double te_read_cold = (double)cold.te.weight_bytes / (f.disk_gbs * 1e9);
        CHECK(cold.te.t_run >= te_read_cold * 0.999 && warm.te.t_run < cold.te.t_run &&
                  half.te.t_run < cold.te.t_run && half.te.t_run > warm.te.t_run,
              "text encoder run: cold %.3f s (reads alone %.3f), half %.3f, warm %.3f", cold.te.t_run,
              te_read_cold, half.te.t_run, warm.te.t_run);
        CHECK(fabs(warm.vvae.t_load * f.cache_gbs - cold.vvae.t_load * f.disk_gbs) <=
                  1e-9 * cold.vvae.t_load * f.disk_gbs + 1e-12,
              "video VAE load: cold %.6f s, warm %.6f s", cold.vvae.t_load, warm.vvae.t_load);
        CHECK(warm.cached[1] == 1.0 && cold.cached[1] == 0.0, "the plan keeps the shares it was made with");
        char *text = h3_plan_format(&warm);
        CHECK(text && strstr(text, "file reads:") && strstr(text, "100% of the text encoder's"), "%s",
              text ? text : "(null)");
        h3_free(text);
    }

    /* A stage that fits neither budget stops the plan, named, with the device budget that would hold it. */
    pm.te = NULL;
    pm.avae = NULL;
    const h3_plan_budgets none = {.vram = tiny.vram, .ram = 1 * MiB};
    CHECK_OK(h3_plan_make(&pm, &W124, &none, &f, &pl));
    CHECK(!pl.fits && strstr(pl.why, "the video VAE fits neither budget") &&
              strstr(pl.why, "Would fit: --vram-budget"),
          "the video VAE at 64 MiB and 1 MiB of host: %s", pl.why);
    CHECK_ERR(h3_plan_check(&pl), H3_ERR_BUDGET, "video VAE");
    t_note("  %s", pl.why);
    const char *vb = strstr(pl.why, "--vram-budget ");
    if (vb) {
        const h3_plan_budgets named = {.vram = (int64_t)(atof(vb + 14) * (double)GiB), .ram = 1 * MiB};
        CHECK_OK(h3_plan_make(&pm, &W124, &named, &f, &pl));
        CHECK(pl.fits && pl.vvae.on_device, "at the named --vram-budget %.2f GiB: %s",
              (double)named.vram / GiB, pl.why);
    }
    free(sp);
done:
    h3_text_encoder_close(te);
    h3_video_vae_close(vv);
    h3_audio_vae_close(av);
}

/* ---- measured peaks on the CPU equal the planner's ----------------------------------------------------- */

static int64_t act_now(void) {
    h3_mem_stats s;
    h3_mem_get_stats(&s);
    return s.current[H3_MEM_ACTIVATIONS];
}

static int64_t act_peak(void) {
    h3_mem_stats s;
    h3_mem_get_stats(&s);
    return s.peak[H3_MEM_ACTIVATIONS];
}

static void test_measured_dit(void) {
    char p[1024], q[1024];
    t_src_path("tests/fixtures/dit/official", p, sizeof p);
    t_src_path("tests/fixtures/dit/inputs.safetensors", q, sizeof q);
    h3_dit_open_opts o;
    memset(&o, 0, sizeof o);
    o.chunk_rows = 7;
    h3_dit *d = NULL;
    CHECK_OK(h3_dit_open(p, &o, &d));
    if (!d) return;
    h3_dit_inputs_file f;
    CHECK_OK(h3_dit_inputs_read(q, h3_dit_get_config(d), &f));
    const h3_dit_inputs *in = &f.in;
    int64_t Nv = in->video ? in->video->shape[0] : 0, Na = in->audio ? in->audio->shape[0] : 0;
    int64_t L = in->text ? in->text->shape[0] : 0;
    h3_dit_forward_mem fm;
    h3_dit_forward_mem_of(d, 0, -1, in->seq_len, L, Nv, Na, in->n_timesteps, &fm);
    /* the modulation: its peak while computing, then the tables it keeps */
    int64_t a0 = act_now();
    h3_mem_reset_peaks();
    CHECK_OK(h3_dit_precompute_modulation(d, &g_ex, in->timesteps, in->n_timesteps));
    CHECK(act_peak() - a0 == fm.mod_peak, "modulation peak measured %lld, planned %lld",
          (long long)(act_peak() - a0), (long long)fm.mod_peak);
    CHECK(act_now() - a0 == fm.mod_tables, "kept tables measured %lld, planned %lld",
          (long long)(act_now() - a0), (long long)fm.mod_tables);
    /* the forward: its buffers (the host forward allocates no scratch) */
    h3_tensor vo, ao;
    CHECK_OK(h3_tensor_alloc2(&vo, H3_PLACE_HOST, H3_F32, Nv, 96, H3_MEM_WORKSPACE));
    CHECK_OK(h3_tensor_alloc2(&ao, H3_PLACE_HOST, H3_F32, Na, 32, H3_MEM_WORKSPACE));
    a0 = act_now();
    h3_mem_reset_peaks();
    CHECK_OK(h3_dit_forward(d, &g_ex, in, &vo, &ao));
    CHECK(fm.scratch == 0, "host forwards need no scratch, planned %lld", (long long)fm.scratch);
    CHECK(act_peak() - a0 == fm.workspace, "forward buffers measured %lld, planned %lld (chunk 7)",
          (long long)(act_peak() - a0), (long long)fm.workspace);
    h3_tensor_free(&vo);
    h3_tensor_free(&ao);
    h3_dit_inputs_file_free(&f);
    h3_dit_close(d);
}

/* The video VAE's predicted decode time against the H200's measured decodes of the release-size decoder
 * (bench/NOTES.md, "The video VAE decode: where the time goes"; bench_video_vae_cuda, all blocks resident at the
 * default budget, the head-64 wgmma attention, two heads a warp in QK-norm + RoPE): W124 2.096 s, W124L 3.926 s.
 * Within 10%. */
static void test_measured_vvae(void) {
    h3_video_vae_config cfg;
    h3_video_vae_default_config(&cfg);
    h3_video_vae *v = NULL;
    CHECK_OK(h3_video_vae_create(&cfg, &v));
    if (!v) return;
    h3_device_figures f;
    h3_device_figures_find("h200", &f);
    const struct {
        const char *name;
        int64_t H, W;
        double measured;
    } w[2] = {{"W124", 34, 60, 2.096}, {"W124L", 48, 84, 3.926}};
    for (int i = 0; i < 2; i++) { /* placed as the bench placed it: random weights, the whole device */
        h3_video_vae_run run;
        memset(&run, 0, sizeof run);
        run.place = H3_PLACE_DEVICE;
        run.vram_budget = 139 * GiB;
        run.random_seed = 1;
        h3_video_vae_mem m;
        CHECK_OK(h3_video_vae_plan(v, 37, w[i].H, w[i].W, &run, &m));
        const double t = h3_plan_video_vae_seconds(&cfg, &m, &f), r = t / w[i].measured;
        t_note("  %s video decode: predicted %.3f s, measured %.3f s (%.3fx)", w[i].name, t, w[i].measured, r);
        CHECK(m.n_resident == cfg.num_layers && r > 0.9 && r < 1.1, "%s: predicted %.3f s against the measured %.3f",
              w[i].name, t, w[i].measured);
    }
    h3_video_vae_close(v);
}

static void test_measured_te(void) {
    char p[1024];
    t_src_path("tests/fixtures/text_encoder/official", p, sizeof p);
    h3_text_encoder *te = NULL;
    h3_te_open_opts o = {NULL, H3_PLACE_HOST, 5, NULL, NULL};
    CHECK_OK(h3_text_encoder_open(p, &o, &te));
    if (!te) return;
    const h3_te_config *c = h3_text_encoder_config(te);
    const int64_t ns[] = {1, 5, 13};
    for (int k = 0; k < 3; k++) {
        int64_t n = ns[k];
        int32_t ids[16];
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(t_rand_u64() % (uint64_t)c->vocab);
        h3_mem_reset_peaks();
        int64_t a0 = act_now();
        h3_tensor out;
        CHECK_OK(h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, n, c->hidden, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, n, (int)(c->n_layers < 2 ? c->n_layers : 2), &out));
        int64_t meas = act_peak() - a0, plan = h3_plan_te_activation_bytes(c, n, 5);
        CHECK(meas == plan, "%lld tokens: text encoder activations measured %lld, planned %lld", (long long)n,
              (long long)meas, (long long)plan);
        h3_tensor_free(&out);
    }
    h3_text_encoder_close(te);
}

/* ---- the streamer (host emulation) --------------------------------------------------------------------- */

enum { NI = 6, SLOT = 8192 };
static uint8_t g_src[NI][SLOT];
static char g_file[1024];

static uint8_t pattern(int item, int64_t j) {
    return (uint8_t)(item * 131 + j * 7 + (j >> 8));
}

/* items: 0 resident, 1 pinned, 2 disk (file), 3 pinned in two segments, 4 disk from host memory, 5 pinned */
static int make_items(h3_stream_item *it, h3_stream_seg *segs, int *fd) {
    static const int64_t bytes[NI] = {1000, 2048, 4096, 3000, 8192, 777};
    static const h3_tier tiers[NI] = {H3_TIER_RESIDENT, H3_TIER_PINNED, H3_TIER_DISK,
                                      H3_TIER_PINNED,   H3_TIER_DISK,   H3_TIER_PINNED};
    t_tmp_path("stream.bin", g_file, sizeof g_file);
    FILE *f = fopen(g_file, "wb");
    if (!f) return 0;
    for (int i = 0; i < NI; i++)
        for (int64_t j = 0; j < bytes[i]; j++) g_src[i][j] = pattern(i, j);
    fwrite("header--", 1, 8, f);
    fwrite(g_src[2], 1, (size_t)bytes[2], f);
    fclose(f);
    *fd = open(g_file, O_RDONLY);
    int ns = 0;
    for (int i = 0; i < NI; i++) {
        it[i] = (h3_stream_item){bytes[i], &segs[ns], 1, tiers[i], 0};
        if (i == 2) {
            segs[ns++] = (h3_stream_seg){NULL, *fd, 8, bytes[i], 0};
        } else if (i == 3) { /* two pieces, the second first */
            segs[ns++] = (h3_stream_seg){g_src[i] + 1000, -1, 0, bytes[i] - 1000, 1000};
            segs[ns++] = (h3_stream_seg){g_src[i], -1, 0, 1000, 0};
            it[i].n_segs = 2;
        } else {
            segs[ns++] = (h3_stream_seg){g_src[i], -1, 0, bytes[i], 0};
        }
    }
    return 1;
}

static int item_ok(int item, const uint8_t *p, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        if (p[j] != pattern(item, j)) return 0;
    return 1;
}

static void test_streamer_host(void) {
    h3_stream_item it[NI];
    h3_stream_seg segs[NI + 1];
    int fd = -1;
    if (!make_items(it, segs, &fd)) {
        CHECK(0, "cannot write %s", g_file);
        return;
    }
    h3_streamer_config cfg = {H3_PLACE_HOST, 2, SLOT, 2, NULL, 0, NULL};
    h3_streamer *s = NULL;
    CHECK_OK(h3_streamer_create(&g_ex, &cfg, it, NI, &s));
    if (!s) return;
    const int order[] = {1, 2, 3, 4, 5};
    CHECK_OK(h3_streamer_set_order(s, order, 5, 1));
    int bad = 0;
    for (int pass = 0; pass < 3; pass++)
        for (int k = 0; k < 5; k++) {
            void *d;
            CHECK_OK(h3_streamer_acquire(s, order[k], &d));
            bad += d == NULL || !item_ok(order[k], d, it[order[k]].bytes);
            void *r;
            CHECK_OK(h3_streamer_acquire(s, 0, &r)); /* a resident item, any time */
            bad += r == NULL || !item_ok(0, r, it[0].bytes);
            h3_streamer_release(s, 0);
            h3_streamer_release(s, order[k]);
        }
    CHECK(bad == 0, "%d acquires returned wrong bytes", bad);
    h3_stream_stats st;
    h3_streamer_get_stats(s, &st);
    CHECK(st.resyncs == 0, "in sequence: %lld resyncs", (long long)st.resyncs);
    CHECK(st.copies == 15 + 2, "15 uses and 2 prefetched: %lld copies", (long long)st.copies);
    CHECK(st.reads == 7, "disk items 2 and 4 read at each use, and 2 once more prefetched: %lld reads",
          (long long)st.reads);
    /* out of sequence: correct bytes, one resync */
    void *d;
    CHECK_OK(h3_streamer_acquire(s, 4, &d));
    CHECK(d && item_ok(4, d, it[4].bytes), "item 4 out of sequence");
    h3_streamer_release(s, 4);
    CHECK_OK(h3_streamer_acquire(s, 5, &d));
    CHECK(d && item_ok(5, d, it[5].bytes), "item 5 after it");
    h3_streamer_release(s, 5);
    h3_streamer_get_stats(s, &st);
    CHECK(st.resyncs == 1, "one resync, got %lld", (long long)st.resyncs);
    /* a one-shot sequence, then an item outside it */
    const int once[] = {3, 1};
    CHECK_OK(h3_streamer_set_order(s, once, 2, 0));
    for (int k = 0; k < 2; k++) {
        CHECK_OK(h3_streamer_acquire(s, once[k], &d));
        CHECK(d && item_ok(once[k], d, it[once[k]].bytes), "item %d", once[k]);
        h3_streamer_release(s, once[k]);
    }
    CHECK_ERR(h3_streamer_acquire(s, 5, &d), H3_ERR_INVALID, "not in the streaming sequence");
    CHECK_ERR(h3_streamer_set_order(s, (const int[]){0}, 1, 0), H3_ERR_INVALID, "resident");
    /* two held at once with two slots, a third cannot be queued */
    CHECK_OK(h3_streamer_set_order(s, order, 5, 1));
    void *d1, *d2;
    CHECK_OK(h3_streamer_acquire(s, 1, &d1));
    CHECK_OK(h3_streamer_acquire(s, 2, &d2));
    CHECK(d1 && d2 && d1 != d2 && item_ok(1, d1, it[1].bytes) && item_ok(2, d2, it[2].bytes), "two held");
    CHECK_ERR(h3_streamer_acquire(s, 3, &d), H3_ERR_INVALID, "held");
    h3_streamer_release(s, 1);
    h3_streamer_release(s, 2);
    /* a release of what is not held is reported at the next call */
    h3_streamer_release(s, 5);
    CHECK_ERR(h3_streamer_acquire(s, 3, &d), H3_ERR_INVALID, "not acquired");
    CHECK(h3_streamer_sync(s) != H3_OK, "the failure stays reported");
    h3_streamer_free(s);

    /* a file that shrank: the disk read fails with the file's error, not garbage */
    h3_stream_item it2[NI];
    memcpy(it2, it, sizeof it2);
    h3_stream_seg bad_seg = {NULL, fd, 1 << 20, it[2].bytes, 0};
    it2[2].segs = &bad_seg;
    CHECK_OK(h3_streamer_create(&g_ex, &cfg, it2, NI, &s));
    if (s) {
        CHECK_ERR(h3_streamer_set_order(s, order, 5, 1), H3_ERR_IO, "shorter");
        h3_streamer_free(s);
    }
    /* malformed items */
    it2[1].bytes = SLOT + 1;
    it2[2].segs = segs + 2;
    CHECK_ERR(h3_streamer_create(&g_ex, &cfg, it2, NI, &s), H3_ERR_INVALID, "more than a slot");

    /* every allocation failing in turn: an error, no leak */
    h3_mem_stats b0, b1;
    h3_mem_get_stats(&b0);
    int fails = 0;
    for (int n = 1; n < 200; n++) {
        h3_mem_fail_at(n, 0);
        h3_status r = h3_streamer_create(&g_ex, &cfg, it, NI, &s);
        if (r == H3_OK) r = h3_streamer_set_order(s, order, 5, 1);
        h3_mem_fail_at(0, 0);
        if (s) h3_streamer_free(s);
        s = NULL;
        h3_mem_get_stats(&b1);
        CHECK(b1.total_current == b0.total_current, "allocation %d leaked %lld bytes", n,
              (long long)(b1.total_current - b0.total_current));
        if (r == H3_OK) break;
        CHECK(r == H3_ERR_NOMEM, "allocation %d: %s", n, h3_last_error());
        fails++;
    }
    CHECK(fails > 15, "only %d allocation points", fails);
    close(fd);
    unlink(g_file);
}

/* ---- the streamer's reads and the page cache ----------------------------------------------------------- */

/* Pages lying wholly inside [off, off + len) of fd, and how many of them are in the page cache. */
static int64_t pages_cached(int fd, int64_t off, int64_t len, int64_t *total) {
    const int64_t pg = sysconf(_SC_PAGESIZE), a = (off + pg - 1) / pg * pg, b = (off + len) / pg * pg;
    *total = b > a ? (b - a) / pg : 0;
    if (b <= a) return 0;
    void *m = mmap(NULL, (size_t)(b - a), PROT_READ, MAP_SHARED, fd, a);
    unsigned char *v = malloc((size_t)*total);
    int64_t n = -1;
    if (m != MAP_FAILED && v && mincore(m, (size_t)(b - a), v) == 0) {
        n = 0;
        for (int64_t i = 0; i < *total; i++) n += v[i] & 1;
    }
    free(v);
    if (m != MAP_FAILED) munmap(m, (size_t)(b - a));
    return n;
}

/* The page state of a range: 0 none of its pages cached, 1 some, 2 all. */
static int state_is(int fd, int64_t off, int64_t len, int want) {
    int64_t t, n = pages_cached(fd, off, len, &t);
    if (n < 0) return 0;
    return want == 0 ? n == 0 : want == 2 ? n == t : n > 0 && n < t;
}

static void test_streamer_cache(void) {
    /* the item: segment 2 (12 MiB) first in the layout, then segment 1 (7 bytes), then segment 0 (9 MiB + 5);
     * in the file they follow each other from an odd offset */
    const int64_t O = 4096 + 123, n0 = 9 * MiB + 5, n1 = 7, n2 = 12 * MiB, bytes = n0 + n1 + n2;
    const int64_t foff[3] = {O, O + n0, O + n0 + n1}, len[3] = {n0, n1, n2}, dst[3] = {n2 + n1, n2, 0};
    char path[1024];
    t_tmp_path("stream_cache.bin", path, sizeof path);
    uint8_t *data = malloc((size_t)(O + bytes + 4096)), *want = malloc((size_t)bytes);
    if (!data || !want) {
        CHECK(0, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < O + bytes + 4096; i += 8) {
        uint64_t r = t_rand_u64();
        memcpy(data + i, &r, (size_t)(O + bytes + 4096 - i < 8 ? O + bytes + 4096 - i : 8));
    }
    for (int g = 0; g < 3; g++) memcpy(want + dst[g], data + foff[g], (size_t)len[g]);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, (size_t)(O + bytes + 4096), f) != (size_t)(O + bytes + 4096) || fflush(f) ||
        fsync(fileno(f))) { /* clean pages: only those can be dropped */
        CHECK(0, "cannot write %s", path);
        if (f) fclose(f);
        goto out;
    }
    fclose(f);
    const int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "cannot open %s", path);
    if (fd < 0) goto out;
    const char *readers = getenv("H3_STREAM_READERS");
    char saved[32] = "";
    if (readers) snprintf(saved, sizeof saved, "%s", readers);
    /* page states of segments 0 and 2 */
    enum { NONE, SOME, ALL };
    static const struct {
        const char *name;
        int cached; /* the first `cached` of 16 parts of the item's file range are made resident first */
        int before[2], after[2];
        int64_t want_cached; /* bytes the read copies from the cache (-1: all) */
    } cases[] = {
        {"all cached", 16, {ALL, ALL}, {ALL, ALL}, -1},
        {"none cached", 0, {NONE, NONE}, {NONE, NONE}, 0},
        /* segments 0 and 1 cached, the start of segment 2: its first piece is read and dropped */
        {"half cached", 8, {ALL, SOME}, {ALL, NONE}, 9 * MiB + 12},
    };
    /* one reader, and three (the pieces spread over threads): with several, the kernel's readahead for one
     * reader's piece may land in a piece another reader has already read and dropped (as it always could), so
     * the page states after the read are checked with one */
    for (int nr = 1; nr <= 3; nr += 2)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            setenv("H3_STREAM_READERS", nr == 1 ? "1" : "3", 1);
            const int64_t cl = bytes / 16 * cases[c].cached + (cases[c].cached == 16 ? bytes % 16 : 0);
            const int64_t wc = cases[c].want_cached < 0 ? bytes : cases[c].want_cached;
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            int64_t tot, before = pages_cached(fd, O, bytes, &tot);
            if (cl) { /* without readahead, which would bring in more than the part asked for */
                uint8_t *tmp = malloc((size_t)cl);
                const int rfd = open(path, O_RDONLY);
                posix_fadvise(rfd, 0, 0, POSIX_FADV_RANDOM);
                CHECK(tmp && pread(rfd, tmp, (size_t)cl, O) == cl, "%s: warming the file", cases[c].name);
                close(rfd);
                free(tmp);
            }
            /* a file system that keeps every page (tmpfs) or hides which are cached: the bytes are still
             * checked
             */
            int meaningful = before == 0;
            for (int k = 0; k < 2 && meaningful; k++)
                meaningful = state_is(fd, foff[2 * k], len[2 * k], cases[c].before[k]);
            if (!meaningful)
                printf(
                    "  %s: this file system does not let the test set which pages are cached (%lld of %lld "
                    "resident after dropping); checking the bytes only\n",
                    cases[c].name, (long long)before, (long long)tot);
            h3_stream_seg segs[3];
            for (int g = 0; g < 3; g++) segs[g] = (h3_stream_seg){NULL, fd, foff[g], len[g], dst[g]};
            h3_stream_item it = {bytes, segs, 3, H3_TIER_DISK, 0};
            h3_streamer_config cfg = {H3_PLACE_HOST, 1, bytes, 1, NULL, 0, NULL};
            h3_streamer *s = NULL;
            CHECK_OK(h3_streamer_create(&g_ex, &cfg, &it, 1, &s));
            if (!s) continue;
            CHECK_OK(h3_streamer_set_order(s, (const int[]){0}, 1, 0));
            void *d = NULL;
            CHECK_OK(h3_streamer_acquire(s, 0, &d));
            CHECK(d && memcmp(d, want, (size_t)bytes) == 0,
                  "%s, %d readers: the item's bytes differ from the file's", cases[c].name, nr);
            h3_streamer_release(s, 0);
            h3_stream_stats st;
            h3_streamer_get_stats(s, &st);
            h3_streamer_free(s);
            CHECK(st.reads == 1 && st.bytes_read == bytes, "%s: %lld reads of %lld bytes", cases[c].name,
                  (long long)st.reads, (long long)st.bytes_read);
            if (!meaningful) continue;
            CHECK(st.bytes_cached == wc,
                  "%s, %d readers: %lld bytes copied from the page cache, expected %lld", cases[c].name, nr,
                  (long long)st.bytes_cached, (long long)wc);
            if (nr > 1) continue;
            /* after the read: what was cached is still there, what was read from the disk is gone again (but
             * for the large folio, up to 2 MiB, that may hold both the cached end of segment 1 and the start
             * of segment 2: the kernel drops whole folios) */
            for (int k = 0; k < 2; k++) {
                const int64_t skip = k == 1 && cases[c].cached && cases[c].cached < 16 ? 2 * MiB : 0;
                int64_t t, n = pages_cached(fd, foff[2 * k] + skip, len[2 * k] - skip, &t);
                CHECK(state_is(fd, foff[2 * k] + skip, len[2 * k] - skip, cases[c].after[k]),
                      "%s: %lld of segment %d's %lld pages cached after the read, expected %s", cases[c].name,
                      (long long)n, 2 * k, (long long)t,
                      cases[c].after[k] == ALL    ? "all"
                      : cases[c].after[k] == NONE ? "none"
                                                  : "some");
            }
        }
    if (*saved)
        setenv("H3_STREAM_READERS", saved, 1);
    else
        unsetenv("H3_STREAM_READERS");
    close(fd);
out:
    unlink(path);
    free(data);
    free(want);
}

/* ---- the DiT through the streamer (host emulation) ----------------------------------------------------- */

typedef struct {
    h3_dit *plain, *streamed;
    h3_dit_inputs_file in;
} dit_pair;

static h3_status open_pair(const char *rel, dit_pair *p) {
    char path[1024], q[1024];
    memset(p, 0, sizeof *p);
    t_src_path(rel, path, sizeof path);
    t_src_path("tests/fixtures/dit/inputs.safetensors", q, sizeof q);
    h3_dit_open_opts o;
    memset(&o, 0, sizeof o);
    o.chunk_rows = 5;
    H3_TRY(h3_dit_open(path, &o, &p->plain));
    o.stream_weights = 1;
    H3_TRY(h3_dit_open(path, &o, &p->streamed));
    return h3_dit_inputs_read(q, h3_dit_get_config(p->plain), &p->in);
}

static void close_pair(dit_pair *p) {
    h3_dit_inputs_file_free(&p->in);
    h3_dit_close(p->plain);
    h3_dit_close(p->streamed);
}

/* A hand-made plan: every tier, two slots. */
/* A placement by hand: the tiers cycle pinned, resident, disk, pinned; 2 slots; FFN chunks of 5 rows. */
static uint8_t g_hand_tier[H3_PLAN_MAX_UNITS];
static void hand_plan(h3_dit *d, h3_dit_placement *pl) {
    memset(pl, 0, sizeof *pl);
    const h3_dit_config *c = h3_dit_get_config(d);
    pl->n_units = h3_dit_n_units(c);
    pl->chunk_rows = 5;
    pl->n_slots = 2;
    pl->tier = g_hand_tier;
    static const h3_tier tiers[] = {H3_TIER_PINNED, H3_TIER_RESIDENT, H3_TIER_DISK, H3_TIER_PINNED};
    for (int u = 0; u < pl->n_units; u++) {
        g_hand_tier[u] = (uint8_t)tiers[u % 4];
        h3_dit_pack p;
        h3_dit_pack_unit(d, u, &p);
        if (p.bytes > pl->slot_bytes) pl->slot_bytes = p.bytes;
    }
    for (int b = 0; b < c->n_layers; b++) {
        h3_dit_pack p;
        h3_dit_pack_adaln(d, b, &p);
        if (p.bytes > pl->slot_bytes) pl->slot_bytes = p.bytes;
    }
}

static h3_status forward(h3_dit *d, const h3_dit_inputs *in, h3_tensor *vo, h3_tensor *ao) {
    int64_t Nv = in->video ? in->video->shape[0] : 0, Na = in->audio ? in->audio->shape[0] : 0;
    H3_TRY(h3_tensor_alloc2(vo, H3_PLACE_HOST, H3_F32, Nv, 96, H3_MEM_IO));
    H3_TRY(h3_tensor_alloc2(ao, H3_PLACE_HOST, H3_F32, Na, 32, H3_MEM_IO));
    return h3_dit_forward(d, &g_ex, in, vo, ao);
}

static double max_rel(const h3_tensor *a, const h3_tensor *b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < h3_tensor_numel(a); i++) {
        double x = ((const float *)a->data)[i], y = ((const float *)b->data)[i];
        if (!(fabs(x - y) <= num)) num = fabs(x - y);
        if (fabs(y) > den) den = fabs(y);
    }
    return den > 0 ? num / den : num;
}

/* The units every model reaches its weights through: on the host with no tiers, the tensors as opened; with
 * tiers (the streamer's host emulation), every unit's bytes arrive intact whatever its tier: RESIDENT,
 * PINNED, and DISK for weights made in memory (spilled to an unlinked file first, then read back per use); an
 * interleaved fused QKV arrives as [Q; K; V]. */
static void test_units(void) {
    enum { NU = 3, HEADS = 2, HD = 3, K = 5 };
    /* unit u: a vector [7] and a matrix [3·HEADS·HD, K] whose rows are per head [q k v] in unit 2 */
    float vec[NU][7], mat[NU][3 * HEADS * HD * K];
    h3_tensor tv[NU], tm[NU];
    h3_pack packs[NU];
    memset(packs, 0, sizeof packs);
    for (int u = 0; u < NU; u++) {
        for (int i = 0; i < 7; i++) vec[u][i] = (float)(100 * u + i);
        for (int i = 0; i < 3 * HEADS * HD * K; i++) mat[u][i] = (float)(1000 * u + i);
        int64_t n = 7, s2[2] = {3 * HEADS * HD, K};
        h3_tensor_wrap(&tv[u], vec[u], H3_PLACE_HOST, H3_F32, 1, &n);
        h3_tensor_wrap(&tm[u], mat[u], H3_PLACE_HOST, H3_F32, 2, s2);
        h3_pack_add(&packs[u], &tv[u], 0);
        h3_pack_add(&packs[u], &tm[u], u == 2);
    }
    /* as opened */
    h3_units_config pc = {H3_PLACE_HOST, NULL, 0, 0, NULL, HEADS, HD, NULL, NULL, "test weights", 0, NULL};
    h3_units *us = NULL;
    CHECK_OK(h3_units_open(&g_ex, &pc, packs, NU, &us));
    if (us) {
        for (int u = 0; u < NU; u++) {
            const h3_tensor *t;
            CHECK_OK(h3_units_acquire(us, u, &t));
            CHECK(t && t[0].data == vec[u] && t[1].data == mat[u], "unit %d: the tensors as opened", u);
            h3_units_release(us, u);
        }
        const h3_tensor *t;
        CHECK_ERR(h3_units_acquire(us, NU, &t), H3_ERR_INVALID, "unit 3 does not exist");
        h3_units_close(us);
        us = NULL;
    }
    /* tiers: resident, pinned, disk (spilled) */
    const uint8_t tier[NU] = {H3_TIER_RESIDENT, H3_TIER_PINNED, H3_TIER_DISK};
    h3_units_config tc = {H3_PLACE_HOST, tier, 2, 0, NULL, HEADS, HD, NULL, NULL, "test weights", 0, NULL};
    CHECK_OK(h3_units_open(&g_ex, &tc, packs, NU, &us));
    if (!us) return;
    const int order[] = {0, 1, 2};
    CHECK_OK(h3_units_set_order(us, order, 3, 1));
    int bad = 0;
    for (int pass = 0; pass < 3; pass++)
        for (int u = 0; u < NU; u++) {
            const h3_tensor *t;
            CHECK_OK(h3_units_acquire(us, u, &t));
            if (!t) {
                bad++;
                continue;
            }
            const float *v = t[0].data, *m = t[1].data;
            bad += t[0].data == vec[u] || memcmp(v, vec[u], sizeof vec[u]) != 0;
            for (int r = 0; r < 3 * HEADS * HD; r++) {
                int src = r; /* [Q; K; V] row r = j·inner + h·HD + e comes from row h·3·HD + j·HD + e */
                if (u == 2) {
                    int j = r / (HEADS * HD), h = (r / HD) % HEADS, e = r % HD;
                    src = h * 3 * HD + j * HD + e;
                }
                bad += memcmp(m + r * K, mat[u] + src * K, K * sizeof(float)) != 0;
            }
            h3_units_release(us, u);
        }
    CHECK(bad == 0, "%d wrong tensors or rows", bad);
    CHECK_OK(h3_units_sync(us));
    h3_stream_stats st;
    h3_units_stats(us, &st);
    CHECK(st.reads >= 3, "the disk unit is read back at each use: %lld reads", (long long)st.reads);
    CHECK(h3_units_tier(us, 2) == H3_TIER_DISK && h3_units_count(us) == NU, "tiers and count kept");
    h3_units_close(us);
    /* a streamed unit larger than the slot asked for */
    h3_units_config small = tc;
    small.slot_bytes = 64;
    us = NULL;
    CHECK_ERR(h3_units_open(&g_ex, &small, packs, NU, &us), H3_ERR_INVALID, "more than a slot");
    CHECK(us == NULL, "nothing handed out on failure");
    small.slot_bytes = 0;
    small.n_slots = 0;
    CHECK_ERR(h3_units_open(&g_ex, &small, packs, NU, &us), H3_ERR_INVALID, "no slot");
}

/* Unit u of test_units_convert: m, a matrix [6, 5] stored f32, placed bf16 (rows per head [q k v] in unit 2:
 * 2 heads of 1 row); h, a vector [7] stored f16, placed f32; f, a vector [4] f32 as stored; j0 and j1, two
 * matrices [2, 5] stored f32, placed bf16 and joined. Every value is exact in bf16 and f16. */
enum { CU = 3 };
typedef struct {
    float m[6 * 5], f[4], j[2][10];
    uint16_t h[7];
    h3_tensor tm, th, tf, tj[2];
} cunit;

static float cval(int u, int t, int i) {
    return (float)(u + 1) + 0.25f * (float)(t * 10 + i) - 8.0f;
}

static void cunits_make(cunit *cu, h3_pack *packs) {
    memset(packs, 0, CU * sizeof *packs);
    for (int u = 0; u < CU; u++) {
        cunit *x = &cu[u];
        for (int i = 0; i < 30; i++) x->m[i] = cval(u, 0, i);
        for (int i = 0; i < 7; i++) x->h[i] = h3_f32_to_f16(cval(u, 1, i));
        for (int i = 0; i < 4; i++) x->f[i] = cval(u, 2, i);
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 10; i++) x->j[k][i] = cval(u, 3 + k, i);
        int64_t sm[2] = {6, 5}, sh = 7, sf = 4, sj[2] = {2, 5};
        h3_tensor_wrap(&x->tm, x->m, H3_PLACE_HOST, H3_F32, 2, sm);
        h3_tensor_wrap(&x->th, x->h, H3_PLACE_HOST, H3_F16, 1, &sh);
        h3_tensor_wrap(&x->tf, x->f, H3_PLACE_HOST, H3_F32, 1, &sf);
        h3_pack_add_as(&packs[u], &x->tm, u == 2, H3_BF16);
        h3_pack_add_as(&packs[u], &x->th, 0, H3_F32);
        h3_pack_add(&packs[u], &x->tf, 0);
        for (int k = 0; k < 2; k++) {
            h3_tensor_wrap(&x->tj[k], x->j[k], H3_PLACE_HOST, H3_F32, 2, sj);
            h3_pack_add_as(&packs[u], &x->tj[k], 0, H3_BF16);
        }
        h3_pack_join(&packs[u]);
    }
}

/* Wrong values or layout in unit u's tensors t as handed out, each in its placed dtype: packed (the
 * per-head rows reordered, the pair joined) or as opened on the host (converted copies, nothing reordered or
 * joined). Counts the bad values. */
static int cunit_bad(const cunit *x, int u, const h3_tensor *t, int packed) {
    int bad = 0;
    const h3_dtype want[5] = {H3_BF16, H3_F32, H3_F32, H3_BF16, H3_BF16};
    for (int k = 0; k < 5; k++) bad += t[k].dtype != want[k];
    if (bad) return bad;
    for (int r = 0; r < 6; r++) { /* [Q; K; V] row r of unit 2 comes from row h·3 + j (1 row per head) */
        const int src = u == 2 && packed ? (r % 2) * 3 + r / 2 : r;
        for (int i = 0; i < 5; i++)
            bad += h3_bf16_to_f32(((const uint16_t *)t[0].data)[r * 5 + i]) != x->m[src * 5 + i];
    }
    for (int i = 0; i < 7; i++) bad += ((const float *)t[1].data)[i] != cval(u, 1, i);
    for (int i = 0; i < 4; i++) bad += ((const float *)t[2].data)[i] != x->f[i];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 10; i++)
            bad += h3_bf16_to_f32(((const uint16_t *)t[3 + k].data)[i]) != x->j[k][i];
    if (packed) bad += (const uint8_t *)t[4].data != (const uint8_t *)t[3].data + 2 * 5 * 2; /* joined */
    return bad;
}

static void test_units_convert(void) {
    enum { HEADS = 2, HD = 1 };
    static cunit cu[CU];
    h3_pack packs[CU];
    cunits_make(cu, packs);
    /* the placed layout: the bf16 matrix, the f32 vectors, the joined pair, each run on a granule */
    const int64_t G = H3_CUDA_ARENA_ALIGN;
    CHECK(packs[0].converts && packs[0].pbytes == 4 * G && packs[0].poff[4] == 3 * G + 20 &&
              packs[0].max_cvt == 6 * 5 * 4 && packs[0].bytes == 5 * G,
          "placed layout: %lld bytes, joined at %lld; stored %lld", (long long)packs[0].pbytes,
          (long long)packs[0].poff[4], (long long)packs[0].bytes);
    /* as opened on the host: the tensors placed in another dtype converted once, the rest the sources */
    h3_units_config pc = {H3_PLACE_HOST, NULL, 0, 0, NULL, HEADS, HD, NULL, NULL, "test weights", 0, NULL};
    h3_units *us = NULL;
    CHECK_OK(h3_units_open(NULL, &pc, packs, CU, &us));
    for (int u = 0; us && u < CU; u++) {
        const h3_tensor *t;
        CHECK_OK(h3_units_acquire(us, u, &t));
        if (!t) continue;
        CHECK(t[0].data != cu[u].m && t[1].data != cu[u].h && t[2].data == cu[u].f,
              "unit %d: the f32 vector as opened, the others converted copies", u);
        CHECK(cunit_bad(&cu[u], u, t, 0) == 0, "unit %d: converted values", u);
        h3_units_release(us, u);
    }
    h3_units_close(us);
    us = NULL;
    /* placed (the streamer's host emulation): resident converted at open, pinned and disk units converted
     * into the work block as acquired */
    const uint8_t tier[CU] = {H3_TIER_RESIDENT, H3_TIER_PINNED, H3_TIER_DISK};
    h3_units_config tc = {H3_PLACE_HOST, tier, 1, 0, NULL, HEADS, HD, NULL, NULL, "test weights", 0, NULL};
    CHECK_OK(h3_units_open(&g_ex, &tc, packs, CU, &us));
    if (!us) return;
    const int order[] = {1, 2};
    CHECK_OK(h3_units_set_order(us, order, 2, 1));
    int bad = 0;
    for (int pass = 0; pass < 3; pass++)
        for (int u = 0; u < CU; u++) {
            const h3_tensor *t;
            CHECK_OK(h3_units_acquire(us, u, &t));
            bad += !t ? 1 : cunit_bad(&cu[u], u, t, 1);
            h3_units_release(us, u);
        }
    CHECK(bad == 0, "%d wrong values, dtypes or joins as placed", bad);
    {
        const h3_tensor *a, *b;
        CHECK_OK(h3_units_acquire(us, 1, &a));
        CHECK_ERR(h3_units_acquire(us, 2, &b), H3_ERR_INVALID, "holds the conversion block");
        h3_units_release(us, 1);
        CHECK_OK(h3_units_acquire(us, 2, &b)); /* released: the block is free again */
        if (b) CHECK(cunit_bad(&cu[2], 2, b, 1) == 0, "unit 2 after the refused acquire");
        h3_units_release(us, 2);
    }
    CHECK_OK(h3_units_sync(us));
    h3_stream_stats st;
    h3_units_stats(us, &st);
    CHECK(st.resident_bytes == packs[0].pbytes && st.reads >= 3, "stats: %lld resident bytes, %lld reads",
          (long long)st.resident_bytes, (long long)st.reads);
    h3_units_close(us);
    us = NULL;
    /* the arithmetic of such a set, by hand: unit 0 resident as placed (4 granules) with a load buffer of the
     * matrix's 120 stored bytes, one slot of the largest stored unit (5 granules), the work block of the
     * largest placed one, the disk unit's staging */
    h3_units_mem m;
    h3_units_mem_of(&tc, packs, CU, &m);
    CHECK(m.resident == 4 * G && m.load == G && m.ring == 5 * G && m.work == 4 * G &&
              m.peak == 4 * G + 5 * G + 4 * G && m.pinned == 5 * G + H3_STREAM_STAGING * 5 * G && !m.backend,
          "mem_of: resident %lld load %lld ring %lld work %lld peak %lld pinned %lld", (long long)m.resident,
          (long long)m.load, (long long)m.ring, (long long)m.work, (long long)m.peak, (long long)m.pinned);
    /* on a stand-in device: every unit resident, converted through the load buffer; its bytes are the
     * arithmetic's */
    if (t_standin_begin(&g_ex)) {
        h3_units_config dc = {H3_PLACE_DEVICE, NULL, 0, 0, NULL, HEADS, HD, NULL, NULL, "test weights", 0, NULL};
        h3_units_mem_of(&dc, packs, CU, &m);
        CHECK(m.resident == 3 * 4 * G && m.load == G && m.peak == 13 * G, "mem_of on the device: %lld, %lld",
              (long long)m.resident, (long long)m.peak);
        CHECK_OK(h3_units_open(&g_ex, &dc, packs, CU, &us));
        CHECK(t_sd_peak == m.peak && t_sd_used == m.resident,
              "device bytes: peak %lld (mem_of %lld), held %lld (mem_of %lld)", (long long)t_sd_peak,
              (long long)m.peak, (long long)t_sd_used, (long long)m.resident);
        bad = 0;
        for (int u = 0; us && u < CU; u++) {
            const h3_tensor *t;
            CHECK_OK(h3_units_acquire(us, u, &t));
            bad += !t ? 1 : t[0].place != H3_PLACE_DEVICE || cunit_bad(&cu[u], u, t, 1);
            h3_units_release(us, u);
        }
        CHECK(bad == 0, "%d wrong values on the stand-in device", bad);
        h3_units_close(us);
        us = NULL;
        CHECK(t_sd_used == 0, "%lld device bytes left after close", (long long)t_sd_used);
        t_standin_end(&g_ex);
    }
    /* malformed packs: too many tensors, a join across dtypes, a quantized tensor converted */
    h3_pack bad_packs[3];
    memset(bad_packs, 0, sizeof bad_packs);
    for (int i = 0; i <= H3_PACK_MAX; i++) h3_pack_add(&bad_packs[0], &cu[0].tf, 0);
    h3_pack_add_as(&bad_packs[1], &cu[0].tf, 0, H3_F32);
    h3_pack_add_as(&bad_packs[1], &cu[0].tj[0], 0, H3_BF16);
    h3_pack_join(&bad_packs[1]);
    h3_tensor q = cu[0].tm;
    float qs[6] = {1, 1, 1, 1, 1, 1};
    q.dtype = H3_I8;
    q.q.mode = H3_SCALE_ROW;
    q.q.scales = qs;
    h3_pack_add_as(&bad_packs[2], &q, 0, H3_BF16);
    static const char *const why[3] = {"more than", "bad join", "quantized tensor"};
    for (int k = 0; k < 3; k++) {
        CHECK_ERR(h3_units_open(&g_ex, &tc, &bad_packs[k], 1, &us), H3_ERR_INVALID, why[k]);
        CHECK(us == NULL, "nothing handed out");
    }
}

static void test_dit_streamed(void) {
    const char *models[] = {"tests/fixtures/dit/official", "tests/fixtures/dit/diffusers",
                            "tests/fixtures/dit/comfy_pruned.safetensors"};
    for (int m = 0; m < 3; m++) {
        dit_pair p;
        CHECK_OK(open_pair(models[m], &p));
        if (!p.streamed) {
            close_pair(&p);
            continue;
        }
        h3_dit_placement pl;
        hand_plan(p.streamed, &pl);
        h3_tensor v0 = {0}, a0 = {0}, v1 = {0}, a1 = {0}, v2 = {0}, a2 = {0};
        CHECK_ERR(forward(p.streamed, &p.in.in, &v1, &a1), H3_ERR_INVALID, "no streamer is attached");
        h3_tensor_free(&v1);
        h3_tensor_free(&a1);
        h3_dit_stream *ds = NULL;
        CHECK_OK(h3_dit_stream_open(p.streamed, &g_ex, &pl, NULL, NULL, &ds));
        CHECK_OK(forward(p.plain, &p.in.in, &v0, &a0));
        if (ds) {
            CHECK_OK(
                forward(p.streamed, &p.in.in, &v1, &a1)); /* computes the modulation through the ring first */
            CHECK_OK(forward(p.streamed, &p.in.in, &v2, &a2));
            CHECK_OK(h3_dit_stream_step_end(ds));
            double e1 = max_rel(&v1, &v0), e2 = max_rel(&v2, &v0), e3 = max_rel(&a2, &a0);
            CHECK(e1 <= 1e-6 && e2 <= 1e-6 && e3 <= 1e-6, "%s: streamed vs resident %.2e %.2e %.2e",
                  models[m], e1, e2, e3);
            h3_stream_stats st;
            h3_dit_stream_stats(ds, &st);
            CHECK(st.reads > 0 && st.copies > 0 && st.resident_bytes > 0 && st.pinned_bytes > 0,
                  "%s: every tier used (%lld reads, %lld copies)", models[m], (long long)st.reads,
                  (long long)st.copies);
            CHECK(st.resyncs == 0, "%s: %lld resyncs; the forward and the AdaLN pass follow their sequences",
                  models[m], (long long)st.resyncs);
            printf("  %s: streamed = resident (%.1e); %lld copies, %lld disk reads\n", models[m], e2,
                   (long long)st.copies, (long long)st.reads);
            /* kept placed for a later stage: it matches its own placement only, and computes as before */
            CHECK(h3_dit_stream_matches(ds, &pl), "%s: the stream matches the placement it was made with",
                  models[m]);
            h3_dit_placement other = pl;
            other.n_slots++;
            CHECK(!h3_dit_stream_matches(ds, &other), "%s: another ring depth", models[m]);
            other = pl;
            other.chunk_rows++;
            CHECK(!h3_dit_stream_matches(ds, &other), "%s: another row chunk", models[m]);
            uint8_t tier2[64];
            if (pl.n_units <= 64 && pl.n_units > 0) {
                memcpy(tier2, pl.tier, (size_t)pl.n_units);
                tier2[0] = tier2[0] == H3_TIER_RESIDENT ? H3_TIER_PINNED : H3_TIER_RESIDENT;
                other = pl;
                other.tier = tier2;
                CHECK(!h3_dit_stream_matches(ds, &other), "%s: another tier for block 0", models[m]);
            }
            h3_dit_stream_rebind(ds, NULL);
            h3_tensor v3 = {0}, a3 = {0};
            CHECK_OK(forward(p.streamed, &p.in.in, &v3, &a3));
            CHECK_OK(h3_dit_stream_step_end(ds));
            CHECK(max_rel(&v3, &v2) == 0 && max_rel(&a3, &a2) == 0,
                  "%s: the kept stream's next forward equals its last (%.2e, %.2e)", models[m], max_rel(&v3, &v2),
                  max_rel(&a3, &a2));
            h3_tensor_free(&v3);
            h3_tensor_free(&a3);
            /* its pinned copies outlive it: a later stream of the DiT adopts them (one whose size does not
             * match stays in the cache) and computes the same */
            h3_pinned_cache pc;
            CHECK_OK(h3_pinned_cache_init(&pc, h3_dit_stream_items(p.streamed)));
            CHECK_OK(h3_dit_stream_take_pinned(ds, &pc));
            const int64_t kept = h3_pinned_cache_bytes(&pc);
            CHECK(kept == st.pinned_bytes, "%s: %lld bytes of pinned copies taken, the stream pinned %lld",
                  models[m], (long long)kept, (long long)st.pinned_bytes);
            h3_dit_stream_close(ds);
            ds = NULL;
            int odd = -1; /* one copy that claims another size */
            for (int i = 0; i < pc.n && odd < 0; i++)
                if (pc.p[i]) odd = i;
            int64_t odd_bytes = odd >= 0 ? pc.bytes[odd] : 0;
            if (odd >= 0) pc.bytes[odd] = odd_bytes + 1;
            h3_dit_stream_opts so;
            memset(&so, 0, sizeof so);
            so.pinned_cache = &pc;
            CHECK_OK(h3_dit_stream_open(p.streamed, &g_ex, &pl, &so, NULL, &ds));
            if (ds) {
                h3_stream_stats s2;
                h3_dit_stream_stats(ds, &s2);
                CHECK(s2.pinned_adopted == kept - odd_bytes && s2.pinned_bytes == st.pinned_bytes,
                      "%s: %lld bytes adopted of %lld kept (%lld of them the wrong size), %lld pinned", models[m],
                      (long long)s2.pinned_adopted, (long long)kept, (long long)odd_bytes,
                      (long long)s2.pinned_bytes);
                CHECK(h3_pinned_cache_bytes(&pc) == (odd >= 0 ? odd_bytes + 1 : 0),
                      "%s: only the copy of the wrong size is left in the cache", models[m]);
                if (odd >= 0) pc.bytes[odd] = odd_bytes; /* freed at its real size */
                CHECK_OK(forward(p.streamed, &p.in.in, &v3, &a3));
                CHECK_OK(h3_dit_stream_step_end(ds));
                CHECK(max_rel(&v3, &v0) <= 1e-6 && max_rel(&a3, &a0) <= 1e-6,
                      "%s: with adopted pinned copies vs resident %.2e %.2e", models[m], max_rel(&v3, &v0),
                      max_rel(&a3, &a0));
                h3_tensor_free(&v3);
                h3_tensor_free(&a3);
                printf("  %s: %lld bytes of pinned copies kept and adopted by the next stream\n", models[m],
                       (long long)s2.pinned_adopted);
            }
            h3_pinned_cache_free(&pc);
            h3_dit_stream_close(ds);
            /* closed: the DiT has its host weights back and no streamer */
            h3_tensor_free(&v1);
            h3_tensor_free(&a1);
            CHECK_ERR(forward(p.streamed, &p.in.in, &v1, &a1), H3_ERR_INVALID, "no streamer is attached");
        }
        h3_tensor *ts[] = {&v0, &a0, &v1, &a1, &v2, &a2};
        for (int i = 0; i < 6; i++) h3_tensor_free(ts[i]);
        close_pair(&p);
    }
}

static void test_dit_stream_alloc_failures(void) {
    dit_pair p;
    CHECK_OK(open_pair("tests/fixtures/dit/official", &p));
    if (!p.streamed) {
        close_pair(&p);
        return;
    }
    h3_dit_placement pl;
    hand_plan(p.streamed, &pl);
    h3_tensor v = {0}, a = {0};
    CHECK_OK(forward(p.streamed, &p.in.in, &v, &a) == H3_ERR_INVALID ? H3_OK : H3_ERR_INTERNAL);
    h3_tensor_free(&v);
    h3_tensor_free(&a);
    h3_clear_error();
    for (int sticky = 0; sticky < 2; sticky++) {
        h3_mem_stats b0, b1;
        h3_mem_get_stats(&b0);
        int fails = 0;
        for (int n = 1; n < 5000; n++) {
            h3_dit_stream *ds = NULL;
            h3_mem_fail_at(n, sticky);
            h3_status r = h3_dit_stream_open(p.streamed, &g_ex, &pl, NULL, NULL, &ds);
            if (r == H3_OK) r = forward(p.streamed, &p.in.in, &v, &a);
            int64_t ticks = h3_mem_fail_at(0, 0);
            h3_tensor_free(&v);
            h3_tensor_free(&a);
            h3_dit_stream_close(ds);
            h3_dit_release_workspace(p.streamed);
            h3_dit_release_modulation(p.streamed);
            h3_mem_get_stats(&b1);
            CHECK(b1.total_current == b0.total_current, "failing allocation %d leaked %lld bytes", n,
                  (long long)(b1.total_current - b0.total_current));
            if (r == H3_OK) {
                CHECK(ticks < n, "succeeded although allocation %d should have failed", n);
                break;
            }
            CHECK(r == H3_ERR_NOMEM, "allocation %d: expected out of memory, got %s", n, h3_last_error());
            if (r != H3_ERR_NOMEM) break;
            fails++;
        }
        CHECK(fails > 30, "only %d allocation points", fails);
        if (sticky) printf("  %d allocation points of the streamed DiT fail cleanly\n", fails);
    }
    close_pair(&p);
}

/* ---- the report without a device ----------------------------------------------------------------------- */

static void test_report(void) {
    h3_memrep *r = NULL;
    CHECK_OK(h3_memrep_create(&g_ex, &r));
    if (!r) return;
    int64_t pred[H3_DEVCAT_COUNT] = {1, 2, 3, 4, 5};
    h3_memrep_set_predicted(r, pred, 15, 100);
    h3_memrep_mark(r, "a \"quoted\" mark");
    h3_memrep_set_copies(r, (int64_t)10e9, 200.0, (int64_t)10e9, 55.3);
    char *s = h3_memrep_format(r);
    CHECK(s && strstr(s, "stream slots") && strstr(s, "50.0 GB/s achieved") &&
              strstr(s, "90% of the 55.3 GB/s"),
          "report: %s", s ? s : "(null)");
    h3_free(s);
    char path[1024];
    t_tmp_path("trace.json", path, sizeof path);
    CHECK_OK(h3_memrep_write_trace(r, path));
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    CHECK(j && json_integer_value(json_object_get(j, "predicted_peak")) == 15 &&
              json_array_size(json_object_get(j, "marks")) == 1,
          "trace JSON: %s", j ? "fields" : je.text);
    json_decref(j);
    unlink(path);
    CHECK_ERR(h3_memrep_write_trace(r, "/nonexistent/dir/trace.json"), H3_ERR_IO, "trace");
    h3_memrep_free(r);
}

static void test_cleanup(void) {
    h3_dit_close(g_dit);
    g_dit = NULL;
    if (g_full[0]) unlink(g_full);
    if (g_rel[0]) {
        char cmd[1100];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_rel);
        CHECK(system(cmd) == 0, "removing %s", g_rel);
    }
}

int main(int argc, char **argv) {
    if (h3_exec_init(&g_ex, 2) != H3_OK) {
        fprintf(stderr, "exec init failed: %s\n", h3_last_error());
        return 1;
    }
    static const t_case cases[] = {
        {"budget_parse", test_budget_parse},
        {"simulate", test_simulate},
        {"full_arithmetic", test_full_arithmetic},
        {"fp8_time", test_fp8_time},
        {"measured_vvae", test_measured_vvae},
        {"attention_resolve", test_attention_resolve},
        {"budget_edges", test_budget_edges},
        {"no_fit", test_no_fit},
        {"format", test_format},
        {"split", test_split},
        {"stage_plans", test_stage_plans},
        {"measured_dit", test_measured_dit},
        {"measured_te", test_measured_te},
        {"streamer_host", test_streamer_host},
        {"streamer_cache", test_streamer_cache},
        {"units", test_units},
        {"units_convert", test_units_convert},
        {"dit_streamed", test_dit_streamed},
        {"dit_stream_alloc_failures", test_dit_stream_alloc_failures},
        {"report", test_report},
        {"cleanup", test_cleanup},
        {NULL, NULL},
    };
    int r = t_main("test_planner", cases, argc, argv);
    h3_exec_free(&g_ex);
    return r;
}

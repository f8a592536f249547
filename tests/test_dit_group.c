/* A DiT split over several ranks through the DiT stage (pipeline/dit_group.h), on the CPU: rank 0 runs the stage
 * with a group whose other ranks are threads (the same protocol, setup and calls over pipes as the worker
 * processes of `generate --gpus N`, the in-process group in place of NCCL). Every call's velocities equal the whole
 * stage's; a call with its own text states reaches the workers; a worker that cannot open its DiT fails rank 0's
 * call with its GPU and message instead of hanging. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda.h"
#include "models/dit.h"
#include "models/video_vae.h"
#include "pipeline/dit_group.h"
#include "pipeline/stages.h"
#include "testutil.h"

static h3_exec g_ex;

static double max_rel(const h3_tensor *a, const h3_tensor *b) {
    const float *x = a->data, *y = b->data;
    double num = 0, den = 0;
    for (int64_t i = 0; i < h3_tensor_numel(a); i++) {
        num = fmax(num, fabs((double)x[i] - (double)y[i]));
        den = fmax(den, fabs((double)y[i]));
    }
    return den > 0 ? num / den : num;
}

typedef struct {
    h3_dit_inputs_file f;
    h3_tensor text2; /* other text states, for a call that brings its own */
    h3_tensor video2;
    char dit_path[1024];
} fixture;

static int fixture_open(fixture *x, h3_dit **dit) {
    memset(x, 0, sizeof *x);
    char q[1024];
    t_src_path("tests/fixtures/dit/official", x->dit_path, sizeof x->dit_path);
    t_src_path("tests/fixtures/dit/inputs.safetensors", q, sizeof q);
    CHECK_OK(h3_dit_open(x->dit_path, NULL, dit));
    if (!*dit) return 0;
    CHECK_OK(h3_dit_inputs_read(q, h3_dit_get_config(*dit), &x->f));
    CHECK_OK(h3_tensor_alloc(&x->text2, H3_PLACE_HOST, H3_F32, 2, x->f.text.shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc(&x->video2, H3_PLACE_HOST, H3_F32, 2, x->f.video.shape, H3_MEM_ACTIVATIONS));
    if (t_failures) return 0;
    const float *t = x->f.text.data, *v = x->f.video.data;
    float *t2 = x->text2.data, *v2 = x->video2.data;
    for (int64_t i = 0; i < h3_tensor_numel(&x->text2); i++) t2[i] = 0.5f * t[i] + 0.1f;
    for (int64_t i = 0; i < h3_tensor_numel(&x->video2); i++) v2[i] = -0.7f * v[i];
    return 1;
}

static void fixture_close(fixture *x) {
    h3_dit_inputs_file_free(&x->f);
    h3_tensor_free(&x->text2);
    h3_tensor_free(&x->video2);
}

/* Three calls through a stage (group NULL: the whole DiT): the fixture's inputs; other video rows; other video rows
 * with the call's own text states. v[k], a[k] get the velocities. */
static void three_calls(h3_dit *dit, fixture *x, h3_dit_group *group, h3_tensor v[3], h3_tensor a[3]) {
    h3_dit_stage_args sa;
    memset(&sa, 0, sizeof sa);
    sa.dit = dit;
    sa.text = &x->f.text;
    sa.n_video_rows = x->f.video.shape[0];
    sa.n_audio_rows = x->f.audio.shape[0];
    sa.timesteps = x->f.in.timesteps;
    sa.n_timesteps = x->f.in.n_timesteps;
    sa.group = group;
    h3_dit_stage *s = NULL;
    CHECK_OK(h3_dit_stage_open(&g_ex, &sa, &s));
    for (int k = 0; k < 3; k++) {
        CHECK_OK(h3_tensor_alloc(&v[k], H3_PLACE_HOST, H3_F32, 2, x->f.video.shape, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_tensor_alloc(&a[k], H3_PLACE_HOST, H3_F32, 2, x->f.audio.shape, H3_MEM_ACTIVATIONS));
    }
    if (!s || t_failures) {
        h3_dit_stage_close(s, NULL);
        return;
    }
    for (int k = 0; k < 3; k++) {
        h3_dit_inputs in = x->f.in;
        in.text = k == 2 ? &x->text2 : NULL; /* NULL: the stage's */
        if (k > 0) in.video = &x->video2;
        CHECK_OK(h3_dit_stage_call(s, &in, &v[k], &a[k]));
    }
    h3_dit_stage_result res;
    h3_dit_stage_close(s, &res);
    CHECK(res.calls == 3, "%d calls counted", res.calls);
}

static h3_dit_rank_setup setup_of(fixture *x, const char *path) {
    h3_dit_rank_setup su;
    memset(&su, 0, sizeof su);
    su.dit_path = path;
    su.text = &x->f.text;
    su.n_video_rows = x->f.video.shape[0];
    su.n_audio_rows = x->f.audio.shape[0];
    su.timesteps = x->f.in.timesteps;
    su.n_timesteps = x->f.in.n_timesteps;
    su.verbosity = -1;
    return su;
}

static void test_split_stage(void) {
    fixture x;
    h3_dit *whole = NULL, *r0 = NULL;
    if (!fixture_open(&x, &whole)) goto done;
    h3_tensor v[2][3], a[2][3];
    memset(v, 0, sizeof v);
    memset(a, 0, sizeof a);
    three_calls(whole, &x, NULL, v[0], a[0]);
    CHECK_OK(h3_dit_open(x.dit_path, NULL, &r0));
    const h3_dit_rank_setup su = setup_of(&x, x.dit_path);
    h3_dit_group *g = NULL;
    CHECK_OK(h3_dit_group_start_local(2, &su, &g));
    if (g && r0) {
        three_calls(r0, &x, g, v[1], a[1]);
        h3_dit_group_stop(g);
    }
    for (int k = 0; k < 3 && t_failures == 0; k++) {
        const double ev = max_rel(&v[1][k], &v[0][k]), ea = max_rel(&a[1][k], &a[0][k]);
        printf("  call %d: split over 2 ranks, velocities %.2e / %.2e off the whole stage's\n", k, ev, ea);
        CHECK(ev <= 1e-5 && ea <= 1e-5, "call %d: %.2e / %.2e off", k, ev, ea);
    }
    /* the calls differ (so each was the call's own: the rows, then the text states, reached the ranks) */
    CHECK(max_rel(&v[0][1], &v[0][0]) > 1e-2 && max_rel(&v[0][2], &v[0][1]) > 1e-3,
          "the three calls' velocities do not differ: the test would not see a call's inputs lost");
    for (int j = 0; j < 2; j++)
        for (int k = 0; k < 3; k++) {
            h3_tensor_free(&v[j][k]);
            h3_tensor_free(&a[j][k]);
        }
done:
    h3_dit_close(r0);
    h3_dit_close(whole);
    fixture_close(&x);
}

/* Rank 0's stage over group g (dit r0) and its first call, whose status it returns with its message in msg; *second
 * the status of a call after it. The stage and the group end here. */
static h3_status first_call(fixture *x, h3_dit *r0, h3_dit_group *g, h3_status *second, char *msg, size_t n) {
    h3_dit_stage_args sa;
    memset(&sa, 0, sizeof sa);
    sa.dit = r0;
    sa.text = &x->f.text;
    sa.n_video_rows = x->f.video.shape[0];
    sa.n_audio_rows = x->f.audio.shape[0];
    sa.group = g;
    h3_dit_stage *s = NULL;
    h3_tensor v, a;
    h3_status st = H3_ERR_INTERNAL;
    CHECK_OK(h3_tensor_alloc(&v, H3_PLACE_HOST, H3_F32, 2, x->f.video.shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc(&a, H3_PLACE_HOST, H3_F32, 2, x->f.audio.shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_dit_stage_open(&g_ex, &sa, &s));
    if (s) {
        h3_clear_error();
        st = h3_dit_stage_call(s, &x->f.in, &v, &a);
        snprintf(msg, n, "%s", st == H3_OK ? "" : h3_last_error());
        *second = h3_dit_stage_call(s, &x->f.in, &v, &a);
        h3_clear_error();
    }
    h3_dit_stage_close(s, NULL);
    h3_dit_group_stop(g);
    h3_tensor_free(&v);
    h3_tensor_free(&a);
    return st;
}

/* A worker whose DiT does not open: rank 0's first call fails naming the GPU and the worker's reason, and the group
 * stays stopped (the next call fails at once; no thread left waiting). Three ranks cannot split the fixture's 2
 * heads: refused by every rank. */
static void test_worker_fails(void) {
    fixture x;
    h3_dit *r0 = NULL;
    if (!fixture_open(&x, &r0)) goto done;
    char bad[1100];
    snprintf(bad, sizeof bad, "%s/no-such-dit", x.dit_path);
    h3_dit_rank_setup su = setup_of(&x, bad);
    h3_dit_group *g = NULL;
    h3_status second = H3_OK;
    char msg[1024] = "";
    CHECK_OK(h3_dit_group_start_local(2, &su, &g));
    if (g) {
        const h3_status st = first_call(&x, r0, g, &second, msg, sizeof msg);
        printf("  a worker without its DiT: %s\n", msg);
        CHECK(st != H3_OK, "the call succeeded without its second rank");
        CHECK(strstr(msg, "GPU 1") && strstr(msg, "no-such-dit"),
              "the message names neither the GPU nor the worker's reason: %s", msg);
        CHECK(second != H3_OK, "a second call succeeded");
    }
    su = setup_of(&x, x.dit_path);
    g = NULL;
    CHECK_OK(h3_dit_group_start_local(3, &su, &g));
    if (g) {
        const h3_status st = first_call(&x, r0, g, &second, msg, sizeof msg);
        CHECK(st == H3_ERR_INVALID && strstr(msg, "heads"), "3 ranks over 2 heads: %s", msg);
    }
    h3_clear_error();
    /* bad groups */
    CHECK(h3_dit_group_start_local(1, &su, &g) == H3_ERR_INVALID, "a group of one rank");
    CHECK(h3_dit_group_start_local(H3_PLAN_MAX_GPUS + 1, &su, &g) == H3_ERR_INVALID, "a group of 9 ranks");
    h3_clear_error();
done:
    h3_dit_close(r0);
    fixture_close(&x);
}

/* After the DiT's calls the group decodes the video (h3_dit_group_end_dit, then the video VAE stage with the
 * group): the workers open the decoder and decode their chunks, rank 0 gathers them; the frames equal the
 * unsplit decode's bit for bit (every rank single-threaded). A worker whose decoder does not open fails the
 * decode naming its GPU and the path. */
static void test_decode(void) {
    fixture x;
    h3_dit *r0 = NULL;
    h3_video_vae *v = NULL;
    h3_tensor z = {0}, ref = {0}, got = {0};
    char vp[1024], bad[1100];
    t_src_path("tests/fixtures/video_vae/official", vp, sizeof vp);
    snprintf(bad, sizeof bad, "%s/no-such-vae", vp);
    if (!fixture_open(&x, &r0)) goto done;
    CHECK_OK(h3_video_vae_open(vp, NULL, &v));
    if (!v) goto done;
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    const int64_t T = 17, s[4] = {24, T, 4, 6}; /* 3 chunks */
    CHECK_OK(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 4, s, H3_MEM_OTHER));
    t_fill_randn(z.data, (size_t)h3_tensor_numel(&z), 1.0);
    const int64_t os[4] = {c->out_channels, h3_video_vae_num_frames(c, T), 4 * c->patch_size,
                           6 * c->patch_size};
    CHECK_OK(h3_tensor_alloc(&ref, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    CHECK_OK(h3_tensor_alloc(&got, H3_PLACE_HOST, H3_F32, 4, os, H3_MEM_OTHER));
    h3_video_decode_out dst = {H3_PIXELS_UNIT, NULL, NULL, &ref};
    CHECK_OK(h3_video_vae_decode(v, &g_ex, &z, &dst));
    for (int k = 0; k < 2 && !t_failures; k++) { /* the decode; then a worker without its decoder */
        const h3_dit_rank_setup su = setup_of(&x, x.dit_path);
        h3_dit_group *g = NULL;
        CHECK_OK(h3_dit_group_start_local(2, &su, &g));
        if (!g) break;
        h3_tensor vv[3], aa[3];
        memset(vv, 0, sizeof vv);
        memset(aa, 0, sizeof aa);
        three_calls(r0, &x, g, vv, aa);
        for (int i = 0; i < 3; i++) {
            h3_tensor_free(&vv[i]);
            h3_tensor_free(&aa[i]);
        }
        CHECK_OK(h3_dit_group_end_dit(g));
        memset(got.data, 0xff, (size_t)h3_tensor_numel(&got) * 4); /* NaN: a frame not handed out shows */
        h3_video_decode_out out = {H3_PIXELS_UNIT, NULL, NULL, &got};
        const h3_video_split split = {g, k ? bad : vp, NULL};
        h3_stage_report rep;
        h3_clear_error();
        const h3_status st = h3_stage_video_vae(&g_ex, v, NULL, &split, &z, &out, &rep);
        if (k == 0) {
            CHECK(st == H3_OK, "the split decode: %s", h3_last_error());
            CHECK(!memcmp(got.data, ref.data, (size_t)h3_tensor_numel(&ref) * 4),
                  "the split decode's frames differ from the unsplit decode's");
            if (st == H3_OK)
                printf("  3 chunks over 2 ranks after 3 DiT calls: the unsplit decode's frames\n");
        } else {
            printf("  a worker without its decoder: %s\n", h3_last_error());
            CHECK(st != H3_OK && strstr(h3_last_error(), "GPU 1") && strstr(h3_last_error(), "no-such-vae"),
                  "the failure names neither the GPU nor the path: %s", h3_last_error());
        }
        h3_dit_group_stop(g);
        h3_clear_error();
    }
done:
    h3_tensor_free(&z);
    h3_tensor_free(&ref);
    h3_tensor_free(&got);
    h3_video_vae_close(v);
    h3_dit_close(r0);
    fixture_close(&x);
}

/* The worker processes on a GPU (the CUDA build, a GPU, NCCL and an h3run beside this test; skipped otherwise): with
 * H3_DIT_GROUP_ONE_GPU=1 both ranks sit on GPU 0, so h3run's `__dit-rank` starts, takes its setup over the socket and
 * its GPU, answers, and joins NCCL, which refuses two ranks on one GPU: the group's start fails within a minute naming
 * NCCL, on both sides, and the worker is gone (h3_dit_group_stop waited for it). On two GPUs tests/gpu/run.sh group
 * runs the split for real. */
static void test_processes(void) {
    if (h3_cuda_device_count() < 1) {
        printf("  skipped: no GPU\n");
        return;
    }
    char exe[1200];
    const char *bd = getenv("H3_BUILD_DIR");
    snprintf(exe, sizeof exe, "%s/h3run", bd ? bd : ".");
    if (access(exe, X_OK) != 0) {
        printf("  skipped: no h3run at %s (H3_BUILD_DIR)\n", exe);
        return;
    }
    unsigned char id[128];
    if (h3_cuda_comm_unique_id(id) != H3_OK) {
        printf("  skipped: %s\n", h3_last_error());
        h3_clear_error();
        return;
    }
    h3_exec ex;
    CHECK_OK(h3_exec_init(&ex, 1));
    CHECK_OK(h3_cuda_init(&ex, 0, (int64_t)2 << 30));
    fixture x;
    h3_dit *d = NULL;
    h3_dit_open_opts oo;
    memset(&oo, 0, sizeof oo);
    oo.act_place = H3_PLACE_DEVICE;
    oo.weight_place = H3_PLACE_HOST;
    oo.stream_weights = 1;
    h3_plan *plan = calloc(1, sizeof *plan);
    if (!fixture_open(&x, &d) || !plan) goto done;
    h3_dit_close(d);
    d = NULL;
    CHECK_OK(h3_dit_open(x.dit_path, &oo, &d));
    if (!d) goto done;
    {
        h3_plan_model m;
        memset(&m, 0, sizeof m);
        m.dit = d;
        m.dit_weights_in_file = 1;
        h3_plan_request r = {.frames = 5, .width = 64, .height = 64, .text_tokens = x.f.text.shape[0],
                             .n_timesteps = x.f.in.n_timesteps, .steps = 1, .gpus = 2};
        const h3_plan_budgets b = {.vram = (int64_t)1 << 30, .ram = 0};
        CHECK_OK(h3_plan_make(&m, &r, &b, NULL, plan));
    }
    if (t_failures) goto done;
    h3_dit_rank_setup su = setup_of(&x, x.dit_path);
    su.plan = plan;
    su.exe = exe;
    setenv("H3_DIT_GROUP_ONE_GPU", "1", 1);
    h3_dit_group *g = NULL;
    const time_t t0 = time(NULL);
    h3_clear_error();
    const h3_status st = h3_dit_group_start(2, &su, &ex, &g);
    const long secs = (long)(time(NULL) - t0);
    unsetenv("H3_DIT_GROUP_ONE_GPU");
    printf("  two ranks on GPU 0: %s after %ld s: %s\n", st == H3_OK ? "started" : "refused", secs,
           st == H3_OK ? "" : h3_last_error());
    CHECK(st != H3_OK && strstr(h3_last_error(), "NCCL"), "two ranks on one GPU: %s", h3_last_error());
    CHECK(secs < 60, "the refusal took %ld s", secs);
    if (st == H3_OK) h3_dit_group_stop(g);
    h3_clear_error();
done:
    h3_dit_close(d);
    free(plan);
    fixture_close(&x);
    h3_cuda_shutdown(&ex);
    h3_exec_free(&ex);
}

int main(int argc, char **argv) {
    if (h3_exec_init(&g_ex, 1) != H3_OK) return 1;
    static const t_case cases[] = {
        {"split_stage", test_split_stage},
        {"worker_fails", test_worker_fails},
        {"decode", test_decode},
        {"processes", test_processes},
        {NULL, NULL},
    };
    const int r = t_main("test_dit_group", cases, argc, argv);
    h3_exec_free(&g_ex);
    return r;
}

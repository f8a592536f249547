/* h3run plan: where every weight block of a request would live and what each stage would take, without
 * loading weights and without a GPU (given a device budget). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "cli/cli.h"
#include "cuda/cuda.h"
#include "io/discover.h"
#include "mem/budget.h"
#include "models/vision.h"
#include "pipeline/generate.h"
#include "pipeline/plan.h"
#include "pipeline/window.h"
#include "pipeline/request.h"
#include "sample/schedule.h"

/* the plan reads the audio VAE's shapes only: no weight is read (no weight-norm fold) */
static const h3_audio_vae_opts k_avae_headers = {.headers_only = 1};

typedef struct found {
    h3_dit *dit;
    h3_text_encoder *te;
    h3_video_vae *vvae;
    h3_audio_vae *avae;
    char *dit_path, *te_path, *vvae_path, *avae_path;
    h3_status err; /* a component was found but would not open */
} found;

static const h3_dit_open_opts *dit_opts(void) {
    static h3_dit_open_opts o;
    memset(&o, 0, sizeof o);
    o.act_place = H3_PLACE_DEVICE;
    o.weight_place = H3_PLACE_HOST;
    o.stream_weights = 1;
    return &o;
}

static void keep_path(char **dst, const char *p) {
    if (!*dst) *dst = h3_strdup(p);
}

/* Tries every component's opener on path (each accepts a model folder holding it); quiet about misses. */
static void try_folder(found *f, const char *path) {
    if (!f->dit && h3_dit_open(path, dit_opts(), &f->dit) == H3_OK) keep_path(&f->dit_path, path);
    if (!f->te && h3_text_encoder_open(path, NULL, &f->te) == H3_OK) keep_path(&f->te_path, path);
    if (!f->vvae && h3_video_vae_open(path, NULL, &f->vvae) == H3_OK) keep_path(&f->vvae_path, path);
    if (!f->avae && h3_audio_vae_open(path, &k_avae_headers, &f->avae) == H3_OK)
        keep_path(&f->avae_path, path);
    h3_clear_error();
}

/* A weight set found under the path: what it holds decides which opener gets it; its failure is reported. */
static int on_set(const char *set_path, void *user) {
    found *f = user;
    h3_st_set s;
    if (h3_st_open(set_path, &s) != H3_OK) {
        h3_clear_error();
        return 0;
    }
    h3_detect_info info;
    h3_status st = h3_detect(&s, &info);
    h3_st_close(&s);
    if (st != H3_OK) {
        h3_clear_error();
        return 0;
    }
    switch (info.comp) {
        case H3_COMP_DIT:
            if (!f->dit) {
                st = h3_dit_open(set_path, dit_opts(), &f->dit);
                if (st == H3_OK) keep_path(&f->dit_path, set_path);
            }
            break;
        case H3_COMP_TEXT_ENCODER:
            if (!f->te) {
                st = h3_text_encoder_open(set_path, NULL, &f->te);
                if (st == H3_OK) keep_path(&f->te_path, set_path);
            }
            break;
        case H3_COMP_VIDEO_VAE:
            if (!f->vvae) {
                st = h3_video_vae_open(set_path, NULL, &f->vvae);
                if (st == H3_OK) keep_path(&f->vvae_path, set_path);
            }
            break;
        case H3_COMP_AUDIO_VAE:
            if (!f->avae) {
                st = h3_audio_vae_open(set_path, &k_avae_headers, &f->avae);
                if (st == H3_OK) keep_path(&f->avae_path, set_path);
            }
            break;
        default:
            break;
    }
    if (st != H3_OK) {
        f->err = h3_error_wrap(st, "%s", set_path);
        return 1;
    }
    return 0;
}

static void found_free(found *f) {
    h3_dit_close(f->dit);
    h3_text_encoder_close(f->te);
    h3_video_vae_close(f->vvae);
    h3_audio_vae_close(f->avae);
    h3_free(f->dit_path);
    h3_free(f->te_path);
    h3_free(f->vvae_path);
    h3_free(f->avae_path);
}

/* Bytes of the set a component came from, for the host stages. */
static int64_t set_bytes(const char *source) {
    int64_t b = 0;
    if (source && h3_plan_weight_bytes(source, &b) != H3_OK) {
        h3_clear_error();
        b = 0;
    }
    return b;
}

int h3_cmd_plan(int argc, char **argv) {
    const char *size = NULL, *work = NULL, *vram_s = NULL, *ram_s = NULL, *device = NULL, *refine = NULL;
    const char *attention = NULL, *sparse = NULL;
    int64_t frames = 0, tokens = 128, steps = 0, keyframes = 0, window = 0, overlap = 0, gpus = 1;
    int quiet = 0, verbose = 0;
    const h3_cli_opt opts[] = {
        {"frames", 'f', H3_OPT_INT, &frames, "N", "frames, 17n+5 (default 124: 5 s at 24 fps)", 1,
         H3_MAX_FRAMES},
        {"size", 's', H3_OPT_STR, &size, "WxH", "canvas, multiples of 32 (default 1344x768)", 0, 0},
        {"workload", 'w', H3_OPT_STR, &work, "NAME",
         "a benchmark workload: W73, W124, W362 (960x544) or W124L", 0, 0},
        {"refine", 0, H3_OPT_STR, &refine, "WxH[:D]",
         "plan generate's --refine too: a second DiT stage at the refine canvas (its longer sequence, the "
         "last round(D x steps) calls; D default 0.5), the VAEs at that canvas",
         0, 0},
        {"text-tokens", 0, H3_OPT_INT, &tokens, "N", "prompt length in tokens (default 128)", 1,
         H3_MAX_PROMPT_TOKENS},
        {"steps", 0, H3_OPT_INT, &steps, "N",
         "sampling steps of h3's schedule (default 49); the modulation of each distinct timestep they visit "
         "(video and audio: about 2 a step) is kept on the device, as generate does",
         1, H3_MAX_STEPS},
        {"vram-budget", 0, H3_OPT_STR, &vram_s, "SIZE",
         "device memory the engine may take (default: the GPU's free memory less 512 MiB; required without a "
         "GPU "
         "unless --device names one)",
         0, 0},
        {"ram-budget", 0, H3_OPT_STR, &ram_s, "SIZE",
         "host memory for weights and activations, or unlimited (default: 80% of the available memory)", 0,
         0},
        {"window", 0, H3_OPT_INT, &window, "N",
         "a clip longer than N frames runs the DiT on overlapping windows of N frames (generate's --window; default "
         "345 for clips over 360 frames)",
         1, H3_MAX_FRAMES},
        {"overlap", 0, H3_OPT_INT, &overlap, "N", "the windows' least overlap (generate's --overlap)", 1, H3_MAX_FRAMES},
        {"keyframes", 0, H3_OPT_INT, &keyframes, "N",
         "plan N keyframes (fl2va): their encode by the video VAE's encoder, one at a time, before the DiT; "
         "their image tokens in the prompt (the canvas through Qwen3-VL's processor, plus 10 a keyframe for "
         "the label and the vision block's ends), the vision tower in the text encoder's stage and one latent "
         "frame of rows each in the DiT's sequence",
         1, 64},
        {"gpus", 0, H3_OPT_INT, &gpus, "N",
         "split the DiT over N GPUs (sequence parallel over NCCL: every GPU holds all its weights, runs 1/N of the "
         "rows and the attention of 1/N of the heads) and plan each GPU: its budget is --vram-budget, or on this "
         "machine its free memory; the host budget is shared equally; the video decode's chunks are shared out "
         "when every GPU holds a decoder; the other stages run on the first GPU",
         1, H3_PLAN_MAX_GPUS},
        {"device", 'd', H3_OPT_STR, &device, "NAME",
         "predict times with the stated figures of a GPU (h200); default: the GPU here, if known", 0, 0},
        {"attention", 0, H3_OPT_STR, &attention, "MODE",
         "the DiT blocks' attention, as generate's --attention: auto (default), bf16, fp8, int8 or sparse (its scratch and time)",
         0, 0},
        {"sparse", 0, H3_OPT_STR, &sparse, "TAU[,START,END]",
         "sparse attention's rule, as generate's --sparse (implies it)", 0, 0},
        {"quiet", 'q', H3_OPT_FLAG, &quiet, NULL, "print only errors on stderr", 0, 0},
        {"verbose", 'v', H3_OPT_FLAG, &verbose, NULL, "log more", 0, 0},
        {0},
    };
    const h3_cli_cmd cmd = {
        "plan",
        "plan MODEL... [--frames N] [--size WxH] [--refine WxH[:D]] [--keyframes N] [--vram-budget SIZE] "
        "[--ram-budget SIZE] [--gpus N]",
        "Plan a generate request without loading weights: for each component found under MODEL (a model "
        "folder,\n"
        "component folders or files; header-only files plan like the real ones), each stage in the order it "
        "runs\n"
        "(text encoder, the video VAE encoder with --keyframes, DiT, audio VAE, video VAE), each against the "
        "whole device budget since they take "
        "turns:\n"
        "where it runs (on the GPU, or on the host and why), where its weights live (the DiT's blocks "
        "resident,\n"
        "streamed from pinned memory or from disk; the text encoder's layers streamed; the video VAE's "
        "blocks and\n"
        "tiles per pass), its predicted device and host peak, and its predicted time on the named GPU's "
        "figures;\n"
        "then one line per stage. When a stage does not fit, says which stage and budget are short, by how "
        "much,\n"
        "and what would fit; the exit status is then 1.",
        "examples:\n"
        "  h3run plan MiniMax-H3/FL2VA --vram-budget 8GiB --workload W124 --device h200\n"
        "  h3run plan ComfyUI/models --frames 362 --size 960x544 --vram-budget 24G --ram-budget 64G\n"
        "  h3run plan MiniMax-H3/FL2VA --workload W362 --gpus 2 --device h200",
        opts,
        1,
        8};
    const char *pos[8];
    int npos;
    int r = h3_cli_parse(&cmd, argc, argv, pos, &npos);
    if (r) return r < 0 ? H3_EXIT_OK : r;
    h3_cli_setup_logging(quiet ? -1 : verbose);
    for (int i = 0; i < npos; i++) { /* a FIFO or device is refused, not waited on */
        const h3_cli_path in = {"MODEL", pos[i], H3_CLI_IN};
        r = h3_cli_check_paths("plan", &in, 1);
        if (r) return r;
    }

    h3_plan_request req = {
        .frames = H3_DEFAULT_FRAMES, .width = H3_DEFAULT_WIDTH, .height = H3_DEFAULT_HEIGHT, .text_tokens = tokens};
    double denoise = 0;
    if (work) {
        const h3_workload *w = h3_workload_find(work);
        if (!w) {
            fprintf(stderr, "h3run plan: --workload must be one of " H3_WORKLOAD_NAMES "; got '%s'\n", work);
            return H3_EXIT_USAGE;
        }
        req.width = w->w;
        req.height = w->h;
        req.frames = w->frames;
    }
    if (frames) req.frames = frames;
    if (size && h3_request_parse_size(size, &req.width, &req.height) != H3_OK)
        return h3_cli_fail("plan", H3_ERR_INVALID);
    h3_status st = h3_request_check_frames(req.frames, NULL);
    if (st == H3_OK) st = h3_request_check_canvas(req.width, req.height, NULL);
    if (st != H3_OK) return h3_cli_fail("plan", st);
    /* the distinct timesteps of h3's schedule: what generate keeps the modulation for */
    req.steps = (int)(steps ? steps : H3_DEFAULT_STEPS_H3);
    req.n_timesteps = h3_schedule_distinct_count(H3_SCHEDULER_H3, req.steps);
    if (req.n_timesteps < 0) return h3_cli_fail("plan", h3_last_error_code());
    { /* a long clip: the DiT on windows, as generate resolves them (pipeline/request.h) */
        h3_windows win;
        st = h3_windows_resolve(req.frames, &window, &overlap);
        if (st == H3_OK) st = h3_windows_make(req.frames, window, overlap, &win);
        if (st != H3_OK) return h3_cli_fail("plan", st);
        if (win.n > 1) {
            req.window_frames = win.window;
            req.steps *= win.n; /* model calls: each step runs every window */
            req.refine_steps *= win.n;
            printf("windows: %d of %lld frames, overlapping by at least %lld frames\n", win.n, (long long)win.window,
                   (long long)overlap);
        }
        h3_windows_free(&win);
    }
    if (refine) { /* the refine pass as generate runs it: the last calls of the same schedule */
        st = h3_request_parse_refine(refine, &req.refine_width, &req.refine_height, &denoise);
        if (st == H3_OK && denoise == 0) denoise = H3_REFINE_DEFAULT_DENOISE;
        if (st == H3_OK)
            st = h3_request_check_refine(req.width, req.height, req.refine_width, req.refine_height, denoise,
                                         NULL);
        if (st != H3_OK) return h3_cli_fail("plan", st);
        h3_schedule sch, tail;
        st = h3_schedule_make(H3_SCHEDULER_H3, req.steps, H3_SHIFT_VIDEO, H3_SHIFT_AUDIO, &sch);
        if (st != H3_OK) return h3_cli_fail("plan", st);
        req.refine_steps = h3_request_refine_calls(sch.n - 1, denoise);
        h3_schedule_tail(&sch, req.refine_steps, &tail);
        float *u = h3_malloc((size_t)2 * (size_t)tail.n * sizeof(float) + 8, H3_MEM_OTHER);
        if (u) req.refine_timesteps = h3_schedule_distinct_timesteps(&tail, u);
        h3_free(u);
        h3_schedule_free(&sch);
        if (!u) return h3_cli_fail("plan", H3_ERR(H3_ERR_NOMEM, "out of memory"));
    }

    h3_device_figures fig;
    int have_fig = 0;
    char gpu[128] = "";
    if (device) {
        if (!h3_device_figures_find(device, &fig)) {
            fprintf(stderr, "h3run plan: no figures for a device named '%s' (known: %s)\n", device,
                    h3_device_figures_names());
            return H3_EXIT_USAGE;
        }
        have_fig = 1;
    } else if (h3_cuda_device_count() > 0 && h3_cuda_device_info(0, gpu, sizeof gpu, NULL, NULL) == H3_OK) {
        have_fig = h3_device_figures_for(gpu, &fig);
    }
    h3_clear_error();
    h3_plan_budgets b = {.vram = 0, .ram = 0};
    if (vram_s) {
        st = h3_budget_parse(vram_s, "--vram-budget", &b.vram);
        if (st != H3_OK) return h3_cli_fail("plan", st);
    }
    req.gpus = (int)gpus;
    if (!b.vram && gpus > 1 && h3_cuda_device_count() > 0 && h3_cuda_device_count() < gpus) {
        fprintf(stderr,
                "h3run plan: --gpus %lld, but this machine has %d GPU%s: give --vram-budget SIZE to plan for "
                "GPUs elsewhere (each gets that budget)\n",
                (long long)gpus, h3_cuda_device_count(), h3_cuda_device_count() == 1 ? "" : "s");
        return H3_EXIT_USAGE;
    }
    if (!b.vram) {
        if (h3_cuda_device_count() > 0) {
            st = h3_budget_default_vram(0, &b.vram);
            for (int i = 1; st == H3_OK && i < gpus; i++) st = h3_budget_default_vram(i, &b.vram_gpu[i]);
            if (st != H3_OK) return h3_cli_fail("plan", st);
        } else if (device) {
            b.vram = fig.memory - H3_VRAM_MARGIN;
        } else {
            fprintf(
                stderr,
                "h3run plan: there is no GPU here: give --vram-budget SIZE (e.g. 24GiB), or --device NAME "
                "to plan for all of a named GPU's memory\n");
            return H3_EXIT_USAGE;
        }
    }
    if (ram_s && !strcmp(ram_s, "unlimited")) {
        b.ram = 0;
    } else {
        if (ram_s) {
            st = h3_budget_parse(ram_s, "--ram-budget", &b.ram);
            if (st != H3_OK) return h3_cli_fail("plan", st);
        }
        if (!b.ram) b.ram = h3_budget_default_ram();
    }

    found f = {0};
    if (npos == 1) { /* a model folder: the components where generate finds them (official, diffusers, ComfyUI) */
        h3_model_files mf;
        if (h3_model_files_find(pos[0], NULL, &mf) == H3_OK) {
            const char *paths[4] = {mf.dit, mf.text_encoder, mf.video_vae, mf.audio_vae};
            for (int c = 0; c < 4; c++)
                if (paths[c]) try_folder(&f, paths[c]);
            h3_model_files_free(&mf);
        }
        h3_clear_error();
    }
    for (int i = 0; i < npos; i++) {
        try_folder(&f, pos[i]);
        if (!f.dit || !f.te || !f.vvae || !f.avae) {
            st = h3_discover_sets(pos[i], on_set, &f);
            if (st != H3_OK && st != H3_ERR_NOT_FOUND) break;
            if (f.err) { /* a component that did not open: its message stands */
                st = f.err;
                break;
            }
            h3_clear_error();
            st = H3_OK;
        }
    }
    if (st == H3_OK && !f.dit && !f.te && !f.vvae && !f.avae)
        st = H3_ERR(H3_ERR_NOT_FOUND,
                    "no MiniMax-H3 component (DiT, text encoder, video or audio VAE) was found under %s%s",
                    pos[0], npos > 1 ? " and the other paths" : "");
    if (st != H3_OK) {
        found_free(&f);
        return h3_cli_fail("plan", st);
    }
    h3_plan_model m = {0};
    m.dit = f.dit;
    m.dit_weights_in_file = 1;
    m.te = f.te;
    m.vvae = f.vvae;
    m.avae = f.avae;
    m.vvae_weight_bytes = f.vvae ? set_bytes(h3_video_vae_source(f.vvae)) : 0;
    m.avae_weight_bytes = f.avae ? set_bytes(h3_audio_vae_source(f.avae)) : 0;
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    m.host_threads = nproc > 0 ? (int)nproc : 1;
    /* the share of each component's files in the page cache: their reads are timed by it */
    m.dit_cached = f.dit ? h3_plan_set_cached_fraction(h3_dit_files(f.dit)) : 0;
    m.te_cached = f.te ? h3_plan_set_cached_fraction(h3_text_encoder_files(f.te)) : 0;
    m.avae_cached = f.avae ? h3_plan_cached_fraction(h3_audio_vae_source(f.avae)) : 0;
    m.vvae_cached = f.vvae ? h3_plan_cached_fraction(h3_video_vae_source(f.vvae)) : 0;
    h3_video_enc *enc = NULL;
    req.keyframes = (int)keyframes;
    if (keyframes > 0) req.n_timesteps++; /* the keyframe rows' t = 0.999, kept with the schedule's (generate) */
    if (keyframes > 0) {
        if (!f.vvae) {
            found_free(&f);
            return h3_cli_fail("plan", H3_ERR(H3_ERR_INVALID, "--keyframes needs a video VAE under MODEL"));
        }
        st = h3_video_enc_open(f.vvae, &enc);
        if (st != H3_OK) {
            found_free(&f);
            return h3_cli_fail("plan", st);
        }
        m.venc = h3_video_enc_get_config(enc);
        /* the prompt grows by each keyframe's presentation: a "<Picture i>: " label (counted as 8 tokens), the
         * vision block's two flanking tokens and its image tokens (the processor's grid of the canvas / 4); the
         * vision tower runs in the text encoder's stage (pipeline/keyframe.h) */
        h3_vision *vis = NULL;
        if (f.te && h3_vision_open(f.te, NULL, &vis) == H3_OK) {
            const h3_vis_config *vc = h3_vision_config(vis);
            int64_t rh = 0, rw = 0;
            if (h3_vis_smart_resize(vc, req.height, req.width, &rh, &rw) == H3_OK) {
                int64_t grid[64][3];
                const int64_t per = (rh / vc->patch) * (rw / vc->patch) / (vc->merge * vc->merge);
                for (int k = 0; k < keyframes && k < 64; k++) {
                    grid[k][0] = 1;
                    grid[k][1] = rh / vc->patch;
                    grid[k][2] = rw / vc->patch;
                }
                req.text_tokens += keyframes * (per + 2 + 8);
                m.te_vision_bytes = h3_vision_device_bytes(vis, (const int64_t(*)[3])grid, (int)keyframes);
                if (!quiet)
                    printf("keyframes: %lld, %lld image tokens each at %lldx%lld: %lld rows of text in all\n",
                           (long long)keyframes, (long long)per, (long long)req.width, (long long)req.height,
                           (long long)req.text_tokens);
            }
            h3_clear_error();
        } else {
            h3_clear_error();
            if (f.te && !quiet)
                printf("keyframes: the text encoder has no vision tower; its image tokens are not counted\n");
        }
        h3_vision_close(vis);
    }
    h3_plan *plan = h3_malloc(sizeof *plan, H3_MEM_OTHER);
    if (!plan) {
        h3_video_enc_close(enc);
        found_free(&f);
        return h3_cli_fail("plan", H3_ERR_NOMEM);
    }
    if (f.dit) { /* --attention as generate resolves it on this GPU (or the named figures' Hopper) */
        h3_attn_mode am = H3_ATTN_MODE_AUTO;
        h3_seq_layout L;
        unsigned fl = 0;
        char why[96];
        h3_sparse_rule sp = H3_SPARSE_RULE_DEFAULT;
        st = h3_attn_mode_parse(attention ? attention : "auto", &am);
        if (st == H3_OK && sparse) st = h3_sparse_rule_take(sparse, attention != NULL, &am, &sp);
        if (st == H3_OK)
            st = h3_seq_layout_sizes(req.text_tokens, req.keyframes, req.window_frames ? req.window_frames : req.frames,
                                     req.refine_width ? req.refine_width : req.width,
                                     req.refine_width ? req.refine_height : req.height, &L);
        const unsigned h200 = H3_CUDA_ATTN_FP8 | H3_CUDA_ATTN_FP8_HOPPER | H3_CUDA_ATTN_INT8 | H3_CUDA_ATTN_SPARSE;
        const unsigned kernels = h3_cuda_lowbit_attention(0) | (have_fig && !strcmp(fig.name, "h200") ? h200 : 0u);
        if (st == H3_OK)
            st = h3_attention_resolve(am, 1, kernels, h3_dit_get_config(f.dit)->head_dim, h3_dit_blocks_fp8(f.dit),
                                      L.seq_len, &sp, &fl, why, sizeof why);
        if (st == H3_OK) {
            h3_dit_set_attention(f.dit, fl);
            if (!quiet) printf("DiT attention: %s\n", why);
        }
    }
    if (st == H3_OK) st = h3_plan_make(&m, &req, &b, have_fig ? &fig : NULL, plan);
    int rc = H3_EXIT_OK;
    if (st == H3_OK) {
        printf("model:");
        if (f.dit) printf(" DiT %s;", f.dit_path);
        if (f.te) printf(" text encoder %s;", f.te_path);
        if (f.vvae) printf(" video VAE %s;", h3_video_vae_source(f.vvae));
        if (f.avae) printf(" audio VAE %s;", h3_audio_vae_source(f.avae));
        printf("\n");
        if (!f.dit || !f.te || !f.vvae || !f.avae)
            printf("  not found, so not planned:%s%s%s%s\n", f.dit ? "" : " DiT;", f.te ? "" : " text encoder;",
                   f.vvae ? "" : " video VAE;", f.avae ? "" : " audio VAE;");
        char *text = h3_plan_format(plan);
        if (text) fputs(text, stdout);
        h3_free(text);
        st = h3_plan_check(plan);
    }
    if (st != H3_OK) rc = h3_cli_fail("plan", st);
    h3_free(plan);
    h3_video_enc_close(enc);
    found_free(&f);
    return rc;
}

/* h3run decode: latents from a safetensors file through the video or audio VAE, to PNG frames or a WAV file,
 * and optionally to f32 tensors in diffusers' value range for comparisons. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/cancel.h"
#include "base/fs.h"
#include "cli/cli.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "mem/budget.h"
#include "models/audio_vae.h"
#include "models/video_vae.h"
#include "pipeline/generate.h"
#include "pipeline/media.h"
#include "pipeline/stages.h"

typedef struct {
    h3_png_seq *png; /* PNG frames, or NULL */
    h3_tensor *all;  /* every frame for --tensors-out [1, 3, F, H, W], or NULL */
    float *unit;     /* one frame [3, H, W] in [0, 1] */
    int64_t written;
} frames_sink;

/* Frames arrive as raw decoder output ([3, n, H, W] views); PNGs get them in [0, 1]. */
static h3_status on_frames(void *user, const h3_tensor *f, int64_t first) {
    frames_sink *s = user;
    int64_t n = f->shape[1], H = f->shape[2], W = f->shape[3], plane = H * W;
    const float *d = f->data;
    for (int64_t k = 0; k < n; k++) {
        H3_TRY(h3_cancel_check()); /* a stop request is seen between frames too, not only inside the VAE */
        if (s->all) {
            int64_t F = s->all->shape[2];
            for (int64_t c = 0; c < 3; c++)
                memcpy((float *)s->all->data + (c * F + first + k) * plane, d + c * f->stride[0] + k * plane,
                       (size_t)plane * sizeof(float));
        }
        if (s->png) {
            for (int c = 0; c < 3; c++)
                for (int64_t i = 0; i < plane; i++)
                    s->unit[c * plane + i] =
                        d[c * f->stride[0] + k * plane + i] * h3_imagenet_std[c] + h3_imagenet_mean[c];
            H3_TRY(h3_png_seq_write(s->png, s->unit, plane, W));
            s->written++;
        }
    }
    return H3_OK;
}

typedef struct {
    const char *model, *out, *tensors_out;
    int64_t out_w, out_h; /* --output-size: the PNG frames' size (0: the decoded size) */
    int64_t threads, tile, overlap, heads;
    int no_tiling, plan, quiet;
    h3_cli_device dev; /* where the VAE decodes: planned for the GPU when dev.cuda */
} decode_args;

/* Bytes of the weight set a VAE was opened from (the plan's load time); 0 when they cannot be counted. */
static int64_t set_bytes(const char *source) {
    int64_t b = 0;
    if (source && h3_plan_weight_bytes(source, &b) != H3_OK) {
        h3_clear_error();
        b = 0;
    }
    return b;
}

/* The plan of a stage for --device cuda or auto: on the GPU when the budget holds it; else the host (auto) or
 * an error naming what it needs (cuda). */
static h3_status device_or_host(const decode_args *a, const char *stage, const h3_stage_plan *sp) {
    if (sp->on_device || !a->dev.required) return H3_OK;
    return h3_cli_device_refused(stage, sp->reason);
}

/* Starts measuring the decode's own memory: returns what is allocated now (weights, latents, outputs). */
static int64_t mem_mark(void) {
    h3_mem_stats m;
    h3_mem_get_stats(&m);
    h3_mem_reset_peaks();
    return m.total_current;
}

static void report_mem(int64_t base, int64_t planned) {
    h3_mem_stats m;
    h3_mem_get_stats(&m);
    char a[32], b[32];
    printf("decode memory: peak %s measured, %s planned (beyond weights, latents and outputs)\n",
           h3_fmt_bytes((double)(m.total_peak - base), a, sizeof a),
           h3_fmt_bytes((double)planned, b, sizeof b));
}

static void report_device(const h3_stage_report *rep) {
    char p1[32], p2[32];
    printf("device memory: peak %s measured, %s predicted (the backend's workspace included)%s\n",
           h3_budget_str(rep->dev_peak, p1, sizeof p1), h3_budget_str(rep->dev_predicted, p2, sizeof p2),
           rep->dev_held ? "; NOT all given back" : "");
}

static h3_status decode_video(const decode_args *a, h3_exec *ex, h3_tensor *lat) {
    h3_video_vae_opts o = {0};
    o.tile_size = (int)a->tile;
    o.tile_overlap_min = (int)a->overlap;
    o.no_tiling = a->no_tiling;
    o.heads = (int)a->heads;
    h3_video_vae *v = NULL;
    h3_status st = H3_OK;
    frames_sink sink = {0};
    h3_png_seq png = {0};
    h3_tensor all = {0};
    h3_st_writer *w = NULL;
    h3_stage_plan *sp = NULL;
    int cuda_on = 0;
    st = h3_video_vae_open(a->model, &o, &v);
    if (st != H3_OK) {
        char b[96];
        st = h3_error_wrap(st, "video latents %s need a video VAE", h3_tensor_shape_str(lat, b, sizeof b));
        goto done;
    }
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    H3_CHECK(h3_video_vae_check_latents(c, lat));
    int off = lat->ndim == 5;
    int64_t T = lat->shape[off + 1], H = lat->shape[off + 2], W = lat->shape[off + 3];
    int64_t Hp = H * c->patch_size, Wp = W * c->patch_size;
    h3_video_vae_mem m;
    H3_CHECK(h3_video_vae_decode_peak(c, T, H, W, ex->threads, 0, &m));
    char b1[32], b2[32], b3[32];
    if (!a->quiet || a->plan)
        printf("video VAE %s (%s layout, %d blocks, %s weights): latents [%d, %lld, %lld, %lld] -> %lld "
               "frames of "
               "%lld×%lld px\n  %d chunks of %d×%d tiles (%lld tokens each); planned decode memory %s (chunk "
               "%s, ViT "
               "%s)\n",
               h3_video_vae_source(v), h3_layout_name(h3_video_vae_layout(v)), c->num_layers,
               h3_dtype_name(c->weight_dtype), c->latent_channels, (long long)T, (long long)H, (long long)W,
               (long long)m.frames, (long long)Wp, (long long)Hp, m.chunks, m.tiles_y, m.tiles_x,
               (long long)m.tokens_per_tile, h3_fmt_bytes((double)m.total, b1, sizeof b1),
               h3_fmt_bytes((double)m.chunk_buffers, b2, sizeof b2),
               h3_fmt_bytes((double)m.vit, b3, sizeof b3));
    if (a->dev.cuda) {
        /* the stage's plan: the blocks resident or streamed as the budget allows, the tiles per pass */
        sp = h3_malloc(sizeof *sp, H3_MEM_OTHER);
        if (!sp) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        const h3_plan_budgets b = {.vram = a->dev.vram, .ram = 0};
        H3_CHECK(h3_plan_video_vae(v, T, H, W, set_bytes(h3_video_vae_source(v)), ex->threads, &b,
                                   a->dev.have_fig ? &a->dev.fig : NULL, sp));
        H3_CHECK(device_or_host(a, "video VAE", sp));
        const h3_video_vae_mem *dm = &sp->vvae;
        if (!sp->on_device)
            printf("  on the host: %s\n", sp->reason);
        else if (!a->quiet || a->plan)
            printf("  on the GPU: %d of %d blocks resident, %d streamed; %d tiles per pass, %lld-row steps; "
                   "predicted device peak %s of the %s budget\n",
                   dm->n_resident, dm->n_blocks, dm->n_blocks - dm->n_resident, dm->tile_batch,
                   (long long)dm->rows_per_step, h3_budget_str(dm->dev_peak, b1, sizeof b1),
                   h3_budget_str(a->dev.vram, b2, sizeof b2));
    }
    if (a->plan && !a->out && !a->tensors_out) goto done;
    if (a->out) {
        if (Hp > 16384 || Wp > 16384)
            H3_FAIL(H3_ERR_INVALID, "frames of %lld×%lld px are too large for PNG output", (long long)Wp,
                    (long long)Hp);
        /* --output-size: each frame scaled (Lanczos) as generate scales it for the MP4 */
        H3_CHECK(h3_png_seq_open_scaled(a->out, (int)Wp, (int)Hp, a->out_w ? (int)a->out_w : (int)Wp,
                                        a->out_h ? (int)a->out_h : (int)Hp, &png));
        sink.png = &png;
        size_t n;
        if (!h3_mul_size((size_t)Hp * 3 * sizeof(float), (size_t)Wp, &n))
            H3_FAIL(H3_ERR_INVALID, "frames too large");
        sink.unit = h3_malloc(n, H3_MEM_IO);
        if (!sink.unit) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    }
    if (a->tensors_out) {
        int64_t s[5] = {1, c->out_channels, m.frames, Hp, Wp};
        H3_CHECK(h3_tensor_alloc(&all, H3_PLACE_HOST, H3_F32, 5, s, H3_MEM_IO));
        sink.all = &all;
    }
    if (sp && sp->on_device) {
        H3_CHECK_CTX(h3_cuda_init(ex, 0, a->dev.vram), "--device cuda");
        cuda_on = 1;
    }
    int64_t base = mem_mark();
    h3_video_decode_out dst = {H3_PIXELS_RAW, on_frames, &sink, NULL};
    h3_stage_report rep;
    H3_CHECK(h3_stage_video_vae(ex, v, sp, NULL, lat, &dst, &rep));
    if (a->out) H3_CHECK(h3_png_seq_finish(&png)); /* into place with the other outputs (cli.c) */
    if (!a->quiet) {
        printf("decoded %lld frames in %.2f s", (long long)m.frames, rep.seconds);
        if (a->out)
            printf("; %lld PNG frames (%lldx%lld) in %s", (long long)sink.written,
                   (long long)(a->out_w ? a->out_w : Wp), (long long)(a->out_h ? a->out_h : Hp), a->out);
        printf("\n");
        if (rep.on_device)
            report_device(&rep);
        else
            report_mem(base, m.total); /* PNG writing adds its own small buffers */
    }
    if (a->tensors_out) {
        H3_CHECK(h3_st_writer_new(&w));
        H3_CHECK(h3_st_writer_add_tensor(w, "frames", &all));
        H3_CHECK(h3_st_writer_write(w, a->tensors_out, 0));
        if (!a->quiet)
            printf("wrote frames [1, %d, %lld, %lld, %lld] (f32, diffusers' decode range) to %s\n",
                   c->out_channels, (long long)m.frames, (long long)Hp, (long long)Wp, a->tensors_out);
    }
done:
    h3_st_writer_free(w);
    h3_tensor_free(&all);
    h3_png_seq_close(&png);
    h3_free(sink.unit);
    h3_free(sp);
    h3_video_vae_close(v);
    if (cuda_on) h3_cuda_shutdown(ex);
    return st;
}

static h3_status decode_audio(const decode_args *a, h3_exec *ex, h3_tensor *lat) {
    h3_audio_vae *v = NULL;
    h3_status st = H3_OK;
    h3_tensor wave = {0};
    h3_st_writer *w = NULL;
    h3_stage_plan *sp = NULL;
    int cuda_on = 0;
    st = h3_audio_vae_open(a->model, NULL, &v);
    if (st != H3_OK) {
        char b[96];
        st = h3_error_wrap(st, "audio latents %s need an audio VAE", h3_tensor_shape_str(lat, b, sizeof b));
        goto done;
    }
    const h3_audio_vae_config *c = h3_audio_vae_get_config(v);
    H3_CHECK(h3_audio_vae_check_latents(c, lat));
    int off = lat->ndim == 3;
    int64_t ch = off ? lat->shape[0] : 1, T = lat->shape[off + 1], S = T * c->hop;
    if (a->out && ch > 2)
        H3_FAIL(H3_ERR_INVALID,
                "a WAV file holds 1 or 2 channels; these latents have %lld (write --tensors-out instead)",
                (long long)ch);
    if (a->dev.cuda) {
        sp = h3_malloc(sizeof *sp, H3_MEM_OTHER);
        if (!sp) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        const h3_plan_budgets b = {.vram = a->dev.vram, .ram = 0};
        H3_CHECK(h3_plan_audio_vae(v, T, ch, set_bytes(h3_audio_vae_source(v)), &b,
                                   a->dev.have_fig ? &a->dev.fig : NULL, sp));
        H3_CHECK(device_or_host(a, "audio VAE", sp));
    }
    h3_audio_vae_mem m;
    H3_CHECK(h3_audio_vae_decode_peak(c, T, ch, &m));
    const int on_dev = sp && sp->on_device;
    char b1[32], b2[32], b3[32];
    if (!a->quiet || a->plan) {
        printf("audio VAE %s (%s layout, %d upsamplers, hop %d): latents [%lld, %d, %lld] -> %lld samples "
               "per channel "
               "at %d Hz; ",
               h3_audio_vae_source(v), h3_layout_name(h3_audio_vae_layout(v)), c->n_up, c->hop, (long long)ch,
               c->latent_channels, (long long)T, (long long)S, c->sample_rate);
        if (on_dev)
            printf("on the GPU, planned device memory %s (f32 weights %s, buffers and scratch %s)\n",
                   h3_fmt_bytes((double)m.dev_total, b1, sizeof b1),
                   h3_fmt_bytes((double)m.dev_weights, b2, sizeof b2),
                   h3_fmt_bytes((double)(m.dev_buffers + m.dev_op_scratch), b3, sizeof b3));
        else
            printf("planned decode memory %s%s%s\n", h3_fmt_bytes((double)m.total, b1, sizeof b1),
                   sp ? "; on the host: " : "", sp ? sp->reason : "");
    }
    if (a->plan && !a->out && !a->tensors_out) goto done;
    int64_t s[3] = {ch, 1, S};
    H3_CHECK(h3_tensor_alloc(&wave, H3_PLACE_HOST, H3_F32, 3, s, H3_MEM_IO));
    if (on_dev) {
        H3_CHECK_CTX(h3_cuda_init(ex, 0, a->dev.vram), "--device cuda");
        cuda_on = 1;
    }
    int64_t base = mem_mark();
    h3_stage_report rep;
    H3_CHECK(h3_stage_audio_vae(ex, v, sp, lat, &wave, &rep));
    if (!a->quiet) {
        printf("decoded %lld × %lld samples in %.2f s%s\n", (long long)ch, (long long)S, rep.seconds,
               on_dev ? " (on the GPU, the weights' upload included)" : "");
        if (rep.on_device)
            report_device(&rep);
        else
            report_mem(base, m.total);
    }
    if (a->out) {
        const float *left = wave.data;
        H3_CHECK(h3_wav_write(a->out, left, ch == 2 ? left + S : NULL, S, (int)ch, c->sample_rate));
        if (!a->quiet)
            printf("wrote %s (16-bit PCM, %lld channels, %d Hz)\n", a->out, (long long)ch, c->sample_rate);
    }
    if (a->tensors_out) {
        H3_CHECK(h3_st_writer_new(&w));
        H3_CHECK(h3_st_writer_add_tensor(w, "waveform", &wave));
        H3_CHECK(h3_st_writer_write(w, a->tensors_out, 0));
        if (!a->quiet)
            printf("wrote waveform [%lld, 1, %lld] (f32) to %s\n", (long long)ch, (long long)S,
                   a->tensors_out);
    }
done:
    h3_st_writer_free(w);
    h3_tensor_free(&wave);
    h3_free(sp);
    h3_audio_vae_close(v); /* its device weights go back before the backend does */
    if (cuda_on) h3_cuda_shutdown(ex);
    return st;
}

int h3_cmd_decode(int argc, char **argv) {
    decode_args a = {0};
    const char *latents = NULL, *device = "cpu", *vram_s = NULL, *out_size = NULL;
    const h3_cli_opt opts[] = {
        {"model", 'm', H3_OPT_STR, &a.model, "PATH",
         "video or audio VAE: official video_vae/ or audio_vae/, diffusers "
         "vae/ or audio_vae/, a model folder holding them, or a ComfyUI file",
         0, 0},
        {"latents", 'l', H3_OPT_STR, &latents, "FILE",
         "safetensors with a tensor 'latents': video [1, C, T, H, W], "
         "audio [channels, C, T], normalized as the DiT produces them; or generate --latents' file "
         "(video_latents, or audio_latents when --out is a .wav)",
         0, 0},
        {"out", 'o', H3_OPT_STR, &a.out, "PATH", "video: a folder for frame_NNNNN.png; audio: a .wav file", 0,
         0},
        {"output-size", 0, H3_OPT_STR, &out_size, "WxH",
         "video: the PNG frames scaled to WxH (libswscale Lanczos, as generate's --output-size; even sides, "
         "2..16384)",
         0, 0},
        {"tensors-out", 0, H3_OPT_STR, &a.tensors_out, "FILE",
         "also write 'frames' [1, 3, F, H, W] or 'waveform' [channels, 1, samples] (f32, diffusers' decode "
         "range)",
         0, 0},
        {"threads", 't', H3_OPT_INT, &a.threads, "N", "CPU threads (default 0: one per CPU)", 0,
         H3_MAX_THREADS},
        {"tile-size", 0, H3_OPT_INT, &a.tile, "PX",
         "video tile size in pixels (default: the checkpoint's, 256)", 1, 65536},
        {"tile-overlap", 0, H3_OPT_INT, &a.overlap, "PX", "least video tile overlap in pixels (default 64)",
         1, 65536},
        {"no-tiling", 0, H3_OPT_FLAG, &a.no_tiling, NULL,
         "decode video chunks whole (not what the release does)", 0, 0},
        {"heads", 0, H3_OPT_INT, &a.heads, "N",
         "ViT heads for a video VAE file without a config (default hidden/64)", 1, 4096},
        {"plan", 0, H3_OPT_FLAG, &a.plan, NULL,
         "print the decode plan and its memory; decode only if an output is given", 0, 0},
        {"device", 0, H3_OPT_STR, &device, "NAME",
         "cpu (default), cuda, or auto (cuda when a GPU is present): where the VAE decodes (video: bf16 "
         "weights, "
         "a chunk's tiles in one batch; audio: f32 weights, the channels in one batch), planned as generate "
         "plans "
         "it; cuda refuses a decode the budget cannot hold on the GPU, auto then decodes on the CPU",
         0, 0},
        {"vram-budget", 0, H3_OPT_STR, &vram_s, "SIZE",
         "with --device cuda or auto: every byte the decode may take on the GPU, e.g. 8GiB (default: the "
         "free memory less "
         "512 MiB); blocks that do not fit stream from host memory",
         0, 0},
        {"quiet", 'q', H3_OPT_FLAG, &a.quiet, NULL, "print only errors", 0, 0},
        {0},
    };
    const h3_cli_cmd cmd = {
        "decode",
        "decode --model PATH --latents FILE [--out PATH] [--tensors-out FILE]",
        "Decode latents with the video VAE (to PNG frames) or the audio VAE (to a WAV file), for debugging.\n"
        "The latents' shape picks the VAE: 5 or 4 dims are video, 3 or 2 audio. The checkpoint's\n"
        "latents_mean/latents_std are applied first, as the pipeline does. Video is decoded in temporal "
        "chunks\n"
        "and spatial tiles exactly as the reference decodes it, with memory that does not depend on the "
        "number\n"
        "of frames. Frames go into a new or empty folder (written as FOLDER.partial, then renamed); all "
        "outputs\n"
        "appear together when the decode is complete, and a failed or interrupted run (Ctrl-C, SIGTERM) "
        "leaves\n"
        "none of them. --device cuda decodes on the GPU (video in bf16, its blocks resident or streamed as\n"
        "--vram-budget allows; audio in f32, both channels in one batch).",
        "examples:\n"
        "  h3run decode --model FL2VA/video_vae --latents video_latents.safetensors --out frames/\n"
        "  h3run decode --model FL2VA --latents video_latents.safetensors --out frames/ --device cuda\n"
        "  h3run decode --model FL2VA --latents audio_latents.safetensors --out sound.wav\n"
        "  h3run decode --model FL2VA --latents audio_latents.safetensors --out sound.wav --device cuda\n"
        "  h3run decode --model vae/ --latents l.safetensors --tensors-out decoded.safetensors",
        opts,
        0,
        0};
    const char *pos[1];
    int npos;
    int r = h3_cli_parse(&cmd, argc, argv, pos, &npos);
    if (r) return r < 0 ? H3_EXIT_OK : r;
    h3_cli_setup_logging(a.quiet ? -1 : 0);
    if (!a.model || !latents) {
        fprintf(stderr, "h3run decode: --model and --latents are required (see 'h3run decode --help')\n");
        return H3_EXIT_USAGE;
    }
    if (!a.out && !a.tensors_out && !a.plan) {
        fprintf(stderr, "h3run decode: nothing to write: give --out, --tensors-out or --plan\n");
        return H3_EXIT_USAGE;
    }
    if (out_size) {
        h3_status os = h3_request_parse_output_size(out_size, &a.out_w, &a.out_h);
        if (os != H3_OK) return h3_cli_fail("decode", os);
    }
    r = h3_cli_device_resolve("decode", device, vram_s, a.plan && !a.out && !a.tensors_out, &a.dev);
    if (r) return r;
    const h3_cli_path paths[] = {
        {"--model", a.model, H3_CLI_IN},
        {"--latents", latents, H3_CLI_IN},
        {"--out", a.out, H3_CLI_OUT_ANY},
        {"--tensors-out", a.tensors_out, H3_CLI_OUT_FILE},
    };
    r = h3_cli_check_paths("decode", paths, 4);
    if (r) return r;
    h3_st_set s;
    h3_tensor lat = {0};
    h3_exec ex = {0};
    int have_set = 0, have_ex = 0;
    h3_cli_run_begin();
    h3_status st = h3_st_open(latents, &s);
    const char *name = "latents";
    if (st == H3_OK) {
        have_set = 1;
        /* generate --latents writes video_latents and audio_latents: a .wav --out takes the audio */
        const size_t ol = a.out ? strlen(a.out) : 0;
        const int wav = ol > 4 && !strcmp(a.out + ol - 4, ".wav");
        if (!h3_st_find(&s, name)) name = wav ? "audio_latents" : "video_latents";
        if (!h3_st_find(&s, name))
            st = H3_ERR(H3_ERR_NOT_FOUND, "%s has no tensor named 'latents' (nor generate's '%s')", latents,
                        name);
    }
    if (st == H3_OK) st = h3_st_load(&s, name, H3_PLACE_HOST, H3_F32, H3_MEM_IO, &lat);
    /* The latents say what --out is: a folder of frames (video) or a WAV file (audio). */
    if (st == H3_OK && a.out && lat.ndim >= 2 && lat.ndim <= 5)
        st = h3_check_output(a.out, "--out", lat.ndim >= 4 ? H3_OUT_DIR : H3_OUT_FILE);
    if (st == H3_OK) {
        st = h3_exec_init(&ex, (int)a.threads);
        have_ex = st == H3_OK;
    }
    if (st == H3_OK) {
        if (lat.ndim == 5 || lat.ndim == 4)
            st = decode_video(&a, &ex, &lat);
        else if (lat.ndim == 3 || lat.ndim == 2)
            st = decode_audio(&a, &ex, &lat);
        else {
            char b[96];
            st = H3_ERR(H3_ERR_INVALID,
                        "%s: 'latents' %s is neither video [1, C, T, H, W] nor audio [channels, C, T]",
                        latents, h3_tensor_shape_str(&lat, b, sizeof b));
        }
    }
    h3_tensor_free(&lat);
    if (have_set) h3_st_close(&s);
    if (have_ex) h3_exec_free(&ex);
    st = h3_cli_run_end(st); /* the outputs appear together, or none when anything failed */
    return st == H3_OK ? H3_EXIT_OK : h3_cli_fail("decode", st);
}

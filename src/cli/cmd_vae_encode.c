/* h3run vae-encode: pixels from a safetensors file through the video VAE encoder, to latents, for comparisons
 * with diffusers' AutoencoderKLMiniMaxH3.encode. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "cli/cli.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "mem/budget.h"
#include "models/audio_vae.h"
#include "models/audio_vae_enc.h"
#include "models/video_vae.h"
#include "models/video_vae_enc.h"
#include "pipeline/stages.h"

typedef struct {
    const char *model, *input, *out;
    int64_t threads, seed;
    int sample, plan, quiet;
    h3_cli_device dev;
} venc_args;

/* The audio VAE's encoder: 'waveform' [channels, 1, samples] f32 at 32 kHz -> 'latents' [channels, 32, frames], the
 * posterior mean before normalization (the convolutions on the GPU with --device cuda). */
static h3_status audio_encode(const venc_args *a, h3_exec *ex, h3_st_set *s) {
    h3_status st = H3_OK;
    h3_audio_vae *v = NULL;
    h3_audio_enc *e = NULL;
    h3_tensor wave = {0}, lat = {0};
    h3_st_writer *w = NULL;
    int cuda_on = 0;
    if (a->sample) H3_FAIL(H3_ERR_INVALID, "--sample is the video VAE's (fl2va keyframes); the audio encoder gives the mean");
    H3_CHECK(h3_st_load(s, "waveform", H3_PLACE_HOST, H3_F32, H3_MEM_IO, &wave));
    st = h3_audio_enc_check_wave(&wave);
    if (st != H3_OK) H3_FAIL(H3_ERR_INVALID, "%s: 'waveform': %s", a->input, h3_last_error());
    H3_CHECK_CTX(h3_audio_vae_open(a->model, NULL, &v), "the audio VAE");
    H3_CHECK(h3_audio_enc_open(v, &e));
    const h3_audio_enc_config *c = h3_audio_enc_get_config(e);
    const int64_t ch = wave.shape[0], n = wave.shape[wave.ndim - 1], T = h3_audio_enc_frames(c, n);
    h3_audio_enc_mem m;
    H3_CHECK(h3_audio_enc_mem_of(c, n, &m));
    char b1[32], b2[32], b3[32];
    if (!a->quiet || a->plan) {
        printf("audio VAE encoder %s (%s layout, %d stages, hop %d, latent_dim %d): %lld channel%s of %lld samples "
               "(%.3f s at 32 kHz) -> latents [%lld, %d, %lld], ",
               h3_audio_vae_source(v), h3_layout_name(h3_audio_vae_layout(v)), c->n_stages, c->hop, c->latent_dim,
               (long long)ch, ch == 1 ? "" : "s", (long long)n, n / 32000.0, (long long)ch, c->latent_channels,
               (long long)T);
        if (a->dev.cuda)
            printf("the convolutions on the GPU: planned device peak %s (f32 weights %s) of the %s budget\n",
                   h3_budget_str(m.dev_total + H3_CUDA_BACKEND_BYTES, b1, sizeof b1),
                   h3_budget_str(m.dev_weights, b2, sizeof b2), h3_budget_str(a->dev.vram, b3, sizeof b3));
        else
            printf("on the CPU\n");
    }
    if (a->dev.cuda && m.dev_total + H3_CUDA_BACKEND_BYTES + h3_budget_slack(a->dev.vram) > a->dev.vram)
        H3_FAIL(H3_ERR_BUDGET, "the audio VAE encoder needs %s on the GPU for %lld samples, more than the %s budget; "
                "raise --vram-budget or use --device cpu",
                h3_budget_str(m.dev_total + H3_CUDA_BACKEND_BYTES, b1, sizeof b1), (long long)n,
                h3_budget_str(a->dev.vram, b2, sizeof b2));
    if (a->plan && !a->out) goto done;
    if (a->dev.cuda) {
        H3_CHECK_CTX(h3_cuda_init(ex, 0, a->dev.vram), "--device cuda");
        cuda_on = 1;
        H3_CHECK(h3_audio_enc_place(e, ex, H3_PLACE_DEVICE));
    }
    H3_CHECK(h3_audio_enc_encode(e, ex, &wave, &lat));
    H3_CHECK(h3_st_writer_new(&w));
    H3_CHECK(h3_st_writer_add_tensor(w, "latents", &lat));
    H3_CHECK(h3_st_writer_meta(w, "latents", "audio posterior mean, not normalized"));
    H3_CHECK(h3_st_writer_write(w, a->out, 0));
    if (!a->quiet)
        printf("wrote latents [%lld, %d, %lld] (the posterior mean) to %s\n", (long long)ch, c->latent_channels,
               (long long)T, a->out);
done:
    h3_st_writer_free(w);
    h3_tensor_free(&lat);
    h3_tensor_free(&wave);
    h3_audio_enc_close(e);
    h3_audio_vae_close(v);
    if (cuda_on) h3_cuda_shutdown(ex);
    return st;
}

static h3_status vae_encode(const venc_args *a, h3_exec *ex) {
    h3_st_set s;
    int have_set = 0, cuda_on = 0;
    h3_video_vae *v = NULL;
    h3_video_enc *e = NULL;
    h3_tensor px = {0}, lat = {0};
    h3_st_writer *w = NULL;
    h3_status st = h3_st_open(a->input, &s);
    if (st != H3_OK) return st;
    have_set = 1;
    const h3_st_entry *pe = h3_st_find(&s, "pixels");
    if (!pe && h3_st_find(&s, "waveform")) { /* audio: the audio VAE's encoder */
        st = audio_encode(a, ex, &s);
        goto done;
    }
    if (!pe)
        H3_FAIL(H3_ERR_INVALID,
                "%s has no tensor named 'pixels' (uint8 [1, 3, frames, H, W]: the video VAE) or 'waveform' (f32 "
                "[channels, 1, samples] at 32 kHz: the audio VAE)",
                a->input);
    H3_CHECK(h3_st_tensor(&s, pe, &px)); /* a view of the mapped file: nothing is copied */
    H3_CHECK(h3_video_vae_open(a->model, NULL, &v));
    H3_CHECK(h3_video_enc_open(v, &e));
    const h3_video_enc_config *c = h3_video_enc_get_config(e);
    H3_CHECK_CTX(h3_video_enc_check_pixels(c, &px), "%s: 'pixels'", a->input);
    const int lead = px.ndim == 5;
    const int64_t F = px.shape[lead + 1], H = px.shape[lead + 2], W = px.shape[lead + 3];
    const int64_t T = h3_video_enc_latent_frames(c, F), r = c->spatial_ratio;
    h3_video_enc_mem m;
    H3_CHECK(h3_video_enc_mem_of(c, F, H, W, a->dev.cuda ? H3_PLACE_DEVICE : H3_PLACE_HOST, &m));
    char b1[32], b2[32], b3[32];
    if (!a->quiet || a->plan) {
        printf("video VAE encoder %s (%s layout, %d levels of %d blocks, %s weights): %lld frames of "
               "%lldx%lld px -> "
               "latents [1, %d, %lld, %lld, %lld]\n  %d chunk%s of %d frames, %dx%d tiles of %lldx%lld px; ",
               h3_video_vae_source(v), h3_layout_name(h3_video_vae_layout(v)), c->levels, c->layers,
               h3_dtype_name(c->weight_dtype), (long long)F, (long long)W, (long long)H, c->latent_channels,
               (long long)T, (long long)(H / r), (long long)(W / r), m.chunks, m.chunks == 1 ? "" : "s",
               m.clip_frames, m.tiles_y, m.tiles_x, (long long)m.tile_w, (long long)m.tile_h);
        if (a->dev.cuda)
            printf("on the GPU: planned device peak %s (f32 weights %s) of the %s budget\n",
                   h3_budget_str(m.dev_peak, b1, sizeof b1), h3_budget_str(m.weights, b2, sizeof b2),
                   h3_budget_str(a->dev.vram, b3, sizeof b3));
        else
            printf("on the CPU: planned encode memory %s\n",
                   h3_fmt_bytes((double)m.host_total, b1, sizeof b1));
    }
    if (a->dev.cuda && m.dev_peak + h3_budget_slack(a->dev.vram) > a->dev.vram)
        H3_FAIL(H3_ERR_BUDGET,
                "the video VAE encoder needs %s on the GPU for %lldx%lld px, more than the %s budget; raise "
                "--vram-budget or use --device cpu",
                h3_budget_str(m.dev_peak, b1, sizeof b1), (long long)W, (long long)H,
                h3_budget_str(a->dev.vram, b2, sizeof b2));
    if (a->plan && !a->out) goto done;
    if (a->dev.cuda) {
        H3_CHECK_CTX(h3_cuda_init(ex, 0, a->dev.vram), "--device cuda");
        cuda_on = 1;
        H3_CHECK(h3_video_enc_place(e, ex, H3_PLACE_DEVICE));
    }
    const int64_t ls[5] = {1, c->latent_channels, T, H / r, W / r};
    H3_CHECK(h3_tensor_alloc(&lat, H3_PLACE_HOST, H3_F32, 5, ls, H3_MEM_IO));
    H3_CHECK(h3_stage_video_encode(ex, e, &px, a->sample, (uint64_t)a->seed, &lat));
    H3_CHECK(h3_st_writer_new(&w));
    H3_CHECK(h3_st_writer_add_tensor(w, "latents", &lat));
    H3_CHECK(h3_st_writer_meta(w, "latents",
                               a->sample ? "fl2va conditioning: sampled, f16-rounded, normalized"
                                         : "posterior mean, not normalized"));
    H3_CHECK(h3_st_writer_write(w, a->out, 0));
    if (!a->quiet)
        printf("wrote latents [1, %d, %lld, %lld, %lld] (%s) to %s\n", c->latent_channels, (long long)T,
               (long long)(H / r), (long long)(W / r),
               a->sample ? "the posterior sampled, rounded to f16 and normalized" : "the posterior mean",
               a->out);
done:
    h3_st_writer_free(w);
    h3_tensor_free(&lat);
    h3_tensor_free(&px);
    h3_video_enc_close(e); /* its device weights go back before the backend does */
    h3_video_vae_close(v);
    if (cuda_on) h3_cuda_shutdown(ex);
    if (have_set) h3_st_close(&s);
    return st;
}

int h3_cmd_vae_encode(int argc, char **argv) {
    venc_args a = {0};
    const char *device = "cpu", *vram_s = NULL;
    a.seed = -1;
    const h3_cli_opt opts[] = {
        {"model", 'm', H3_OPT_STR, &a.model, "PATH",
         "video VAE: official video_vae/, diffusers vae/, a model folder holding one, or a ComfyUI file; "
         "audio VAE (with 'waveform'): official or diffusers audio_vae/, or its ComfyUI file",
         0, 0},
        {"input", 'i', H3_OPT_STR, &a.input, "FILE",
         "safetensors with a tensor 'pixels': uint8 [1, 3, frames, H, W], frames 1 or 17n+5, sides multiples "
         "of 16; or 'waveform': f32 [channels, 1, samples] at 32 kHz (the audio VAE's encoder)",
         0, 0},
        {"out", 'o', H3_OPT_STR, &a.out, "FILE",
         "safetensors to write: a tensor 'latents' [1, 24, T, H/16, W/16] (video) or [channels, 32, ceil(samples "
         "/ 800)] (audio)",
         0, 0},
        {"sample", 0, H3_OPT_INT, &a.seed, "SEED",
         "write the fl2va conditioning latents instead of the mean: the posterior sampled with h3run's "
         "generator "
         "(stream 2 of SEED), rounded to f16 and normalized with latents_mean/std",
         0, 9007199254740991.0},
        {"threads", 't', H3_OPT_INT, &a.threads, "N", "CPU threads (default 0: one per CPU)", 0,
         H3_MAX_THREADS},
        {"device", 0, H3_OPT_STR, &device, "NAME",
         "cpu (default), cuda, or auto (cuda when a GPU is present): where the encoder runs (f32 weights "
         "resident on the GPU, a chunk's tiles one at a time)",
         0, 0},
        {"vram-budget", 0, H3_OPT_STR, &vram_s, "SIZE",
         "with --device cuda: every byte the encode may take on the GPU (default: the free memory less 512 "
         "MiB)",
         0, 0},
        {"plan", 0, H3_OPT_FLAG, &a.plan, NULL,
         "print the encode's chunks, tiles and memory; encode only if --out is given", 0, 0},
        {"quiet", 'q', H3_OPT_FLAG, &a.quiet, NULL, "print only errors", 0, 0},
        {0},
    };
    const h3_cli_cmd cmd = {
        "vae-encode",
        "vae-encode --model PATH --input FILE --out FILE [--device cpu|cuda] [--sample SEED]",
        "Encode pixels with the video VAE's encoder, for comparisons with diffusers' "
        "AutoencoderKLMiniMaxH3.\n"
        "One frame is an image (one latent frame, the spatial path fl2va keyframes take); 17n+5 frames are a "
        "clip\n"
        "(5n+2 latent frames: 17-frame chunks, the last 3 latent frames dropped). Inside a chunk the canvas "
        "is\n"
        "encoded in 256 px tiles with at least 64 px of overlap, blended as the release does; memory is one\n"
        "tile of one chunk. 'latents' is the posterior mean before normalization (encode(x).latent_dist.mean "
        "for\n"
        "x = (pixels / 255 - ImageNet mean) / ImageNet std); with --sample SEED, the conditioning latents "
        "fl2va\n"
        "feeds the DiT. With 'waveform' the audio VAE's encoder runs instead (each channel a mono item, right-\n"
        "padded to a multiple of 800 samples): 'latents' is its posterior mean before normalization, as\n"
        "AutoencoderKLMiniMaxH3Audio.encode(x).latent_dist.mode(). The output appears only when complete.",
        "examples:\n"
        "  h3run vae-encode --model FL2VA/video_vae --input keyframe.safetensors --out latents.safetensors\n"
        "  h3run vae-encode --model vae/ --input clip.safetensors --out l.safetensors --device cuda\n"
        "  h3run vae-encode --model FL2VA --input keyframe.safetensors --out cond.safetensors --sample 42\n"
        "  h3run vae-encode --model FL2VA/audio_vae --input wave.safetensors --out audio_latents.safetensors",
        opts,
        0,
        0};
    const char *pos[1];
    int npos;
    int r = h3_cli_parse(&cmd, argc, argv, pos, &npos);
    if (r) return r < 0 ? H3_EXIT_OK : r;
    h3_cli_setup_logging(a.quiet ? -1 : 0);
    if (!a.model || !a.input) {
        fprintf(stderr,
                "h3run vae-encode: --model and --input are required (see 'h3run vae-encode --help')\n");
        return H3_EXIT_USAGE;
    }
    if (!a.out && !a.plan) {
        fprintf(stderr, "h3run vae-encode: nothing to write: give --out or --plan\n");
        return H3_EXIT_USAGE;
    }
    a.sample = a.seed >= 0;
    r = h3_cli_device_resolve("vae-encode", device, vram_s, a.plan && !a.out, &a.dev);
    if (r) return r;
    const h3_cli_path paths[] = {
        {"--model", a.model, H3_CLI_IN},
        {"--input", a.input, H3_CLI_IN_FILE},
        {"--out", a.out, H3_CLI_OUT_FILE},
    };
    r = h3_cli_check_paths("vae-encode", paths, 3);
    if (r) return r;
    h3_exec ex = {0};
    h3_cli_run_begin();
    h3_status st = h3_exec_init(&ex, (int)a.threads);
    if (st == H3_OK) {
        st = vae_encode(&a, &ex);
        h3_exec_free(&ex);
    }
    st = h3_cli_run_end(st); /* the output appears when complete, or not at all */
    return st == H3_OK ? H3_EXIT_OK : h3_cli_fail("vae-encode", st);
}

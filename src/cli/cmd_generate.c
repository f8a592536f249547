/* h3run generate: a prompt to an MP4 with stereo sound (src/pipeline/generate.h runs the stages). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/threads.h"
#include "cli/cli.h"
#include "mem/budget.h"
#include "pipeline/generate.h"
#include "pipeline/plan.h"
#include "sample/cache.h"

/* -q: warnings and errors, in the format of the other commands' log. */
static void log_warnings(h3_log_level level, const char *msg, void *user) {
    (void)user;
    fprintf(stderr, "%s%s\n",
            level == H3_LOG_WARN    ? "warning: "
            : level == H3_LOG_ERROR ? "error: "
                                    : "",
            msg);
}

static int usage_error(const char *fmt, ...) H3_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
    fprintf(stderr, "h3run generate: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see 'h3run generate --help')\n");
    return H3_EXIT_USAGE;
}

int h3_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *prompt_file = NULL, *size = NULL, *sampler = NULL,
               *scheduler = NULL, *output = "out.mp4", *png_dir = NULL, *wav = NULL, *latents = NULL,
               *progress = "auto", *device = "auto", *dit = NULL, *te = NULL, *tok = NULL, *vvae = NULL,
               *avae = NULL, *preset = NULL, *vram_s = NULL, *ram_s = NULL, *trace = NULL,
               *lora_mode = "auto";
    h3_cli_list lora_s = {{0}, 0}, kf_s = {{0}, 0}, prompt_s = {{0}, 0};
    h3_cli_list ref_img = {{0}, 0}, ref_vid = {{0}, 0}, ref_aud = {{0}, 0};
    const char *prompts_file = NULL;
    const char *first_frame = NULL, *last_frame = NULL, *dump_inputs = NULL, *shift = NULL, *checkpoint = NULL,
               *audio = NULL;
    int64_t checkpoint_every = 0;
    int64_t frames = 0, steps = 0, seed = INT64_MIN, threads = 0; /* INT64_MIN: no --seed */
    int64_t gpus = 1;
    int64_t window = 0, overlap = 0;
    const char *refine = NULL, *out_size = NULL; /* --refine WxH[:DENOISE], --output-size WxH */
    double seconds = 0, cache_threshold = 0;
    const char *attention = NULL, *sparse = NULL;
    int64_t ref_image_size = 0, ref_video_size = 0;
    int quiet = 0, verbose = 0, cache = 0;
    const h3_cli_opt opts[] = {
        {"model", 'm', H3_OPT_STR, &model, "PATH",
         "the official folder (FL2VA/), a diffusers folder or a ComfyUI models/ folder (default: the small "
         "model h3-small, from H3RUN_MODELS, beside the program, the install prefix or the source tree)",
         0, 0},
        {"prompt", 'p', H3_OPT_TEXTS, &prompt_s, "TEXT",
         "the prompt, verbatim (text to video with audio); repeated in a clip of several windows (--window), "
         "the clip is divided into equal parts, one prompt each",
         0, H3_CLI_LIST_MAX},
        {"prompts", 0, H3_OPT_STR, &prompts_file, "FILE",
         "a clip of several windows with a prompt per part: each line of FILE is SECONDS PROMPT, the first at 0, "
         "the start times rising (lines that are empty or start with # are skipped)",
         0, 0},
        {"prompt-file", 0, H3_OPT_STR, &prompt_file, "FILE",
         "read the prompt from FILE (all of it, as is; for prompts too long for a command line)", 0, 0},
        {"frames", 'f', H3_OPT_INT, &frames, "N", "frames at 24 fps, 17n+5 (default 124; trained on 107-345)",
         1, H3_MAX_FRAMES},
        {"seconds", 0, H3_OPT_FLOAT, &seconds, "S", "length in seconds instead of frames (5 -> 124 frames)",
         0.2, H3_MAX_FRAMES / 24},
        {"size", 0, H3_OPT_STR, &size, "WxH", "canvas, multiples of 32, aspect 1:4..4:1 (default 1344x768)",
         0, 0},
        {"window", 0, H3_OPT_INT, &window, "N",
         "a clip longer than N frames (17n+5) is sampled as overlapping windows of N frames, all denoised at "
         "every step and blended where they overlap (default: 345 for clips over 360 frames, else the clip)",
         1, H3_MAX_FRAMES},
        {"overlap", 0, H3_OPT_INT, &overlap, "N",
         "the least overlap of neighbouring windows, in whole 17-frame chunks (default: about a quarter of the "
         "window)",
         1, H3_MAX_FRAMES},
        {"refine", 0, H3_OPT_STR, &refine, "WxH[:D]",
         "two passes: sample at --size, upscale the video latents (bilinear) to WxH (multiples of 32, "
         "at least --size), re-noise them to denoise D (0 < D <= 1, default 0.5: the last round(D x "
         "steps) model calls of the schedule) and sample there; the first pass's audio is kept",
         0, 0},
        {"output-size", 0, H3_OPT_STR, &out_size, "WxH",
         "delivery size of the MP4 and PNG frames: the decoded frames scaled to it (libswscale "
         "Lanczos), one at a time; even sides, 2..16384; another aspect ratio stretches (default: the "
         "render size)",
         0, 0},
        {"first-frame", 0, H3_OPT_STR, &first_frame, "IMG",
         "start the clip from this image (fl2va; PNG, JPEG, WebP, ...): without --size the canvas takes its "
         "aspect ratio",
         0, 0},
        {"last-frame", 0, H3_OPT_STR, &last_frame, "IMG", "end the clip on this image (fl2va)", 0, 0},
        {"audio", 0, H3_OPT_STR, &audio, "FILE",
         "a soundtrack the video follows (WAV, FLAC, MP3, AAC, an MP4's sound: whatever ffmpeg reads): encoded by "
         "the audio VAE and held as the clip's audio in every step; the MP4 carries it. Without --frames or "
         "--seconds the clip takes its length",
         0, 0},
        {"ref-image", 0, H3_OPT_LIST, &ref_img, "IMG",
         "a reference image of who or what appears (ref2va; the model's Ref2VA DiT); repeatable, at most 9; the "
         "references are read in the order given, all kinds together",
         0, H3_MAX_REF_IMAGES},
        {"ref-video", 0, H3_OPT_LIST, &ref_vid, "VID",
         "a reference video (motion, camera; its sound too when it has one), read at 24 fps; repeatable, at most 3",
         0, H3_MAX_REF_VIDEOS},
        {"ref-audio", 0, H3_OPT_LIST, &ref_aud, "AUD",
         "a reference sound (a voice, music) beside an image or video reference; repeatable, at most 3 (12 "
         "references in all)",
         0, H3_MAX_REF_AUDIOS},
        {"ref-image-size", 0, H3_OPT_INT, &ref_image_size, "N",
         "the short edge reference images are encoded at, a multiple of 32 (default 2048, the release's; 128 on "
         "the small model)",
         32, 8192},
        {"ref-video-size", 0, H3_OPT_INT, &ref_video_size, "N",
         "the short edge of a reference video's canvas, a multiple of 32 (default 768, the release's; 128 on the "
         "small model)",
         32, 8192},
        {"keyframe", 0, H3_OPT_LIST, &kf_s, "IMG@FRAME",
         "hold this image at frame FRAME (0 .. frames-1; ComfyUI's guide); repeatable", 0, H3_MAX_KEYFRAMES},
        {"steps", 0, H3_OPT_INT, &steps, "N",
         "MODEL CALLS, not sigma points (default 49 for h3: diffusers' 50 sigma points; 20 for the others)",
         1, H3_MAX_STEPS},
        {"sampler", 0, H3_OPT_STR, &sampler, "NAME", "euler (default), res_multistep, dpmpp_2m", 0, 0},
        {"shift", 0, H3_OPT_STR, &shift, "V[:A]",
         "the schedule's sigma shifts, video and audio (default 12:3, the release's; a turbo LoRA sets its own: "
         "docs/LORA.md)",
         0, 0},
        {"scheduler", 0, H3_OPT_STR, &scheduler, "NAME",
         "h3 (default; diffusers), simple, sgm_uniform, beta, normal (ComfyUI)", 0, 0},
        {"lora", 0, H3_OPT_LIST, &lora_s, "FILE[:STRENGTH]",
         "apply a LoRA to the DiT at STRENGTH (default 1.0): ai-toolkit, musubi, kohya, DiffSynth, diffusers "
         "or "
         "ComfyUI files (docs/LORA.md); repeat for several, which add up",
         0, H3_MAX_LORAS},
        {"lora-mode", 0, H3_OPT_STR, &lora_mode, "MODE",
         "auto (default: merged into float weights, streamed blocks as they arrive; a low-rank side path for "
         "quantized ones), merge, or side",
         0, 0},
        {"cache", 0, H3_OPT_FLAG, &cache, NULL,
         "step caching (EasyCache): skip the DiT calls whose output it predicts to change least, answering them "
         "from the last computed call (about 2x fewer calls at 49 steps; docs/SAMPLING.md); off by default",
         0, 0},
        {"cache-threshold", 0, H3_OPT_FLOAT, &cache_threshold, "X",
         "with --cache (implied): the estimated relative output change skips may add up to before a call runs "
         "(default 0.2, ComfyUI's; lower skips less)",
         0.001, 10},
        {"attention", 0, H3_OPT_STR, &attention, "MODE",
         "the DiT blocks' attention: auto (default: fp8 with fp8 block weights on a Hopper GPU at 8,192 rows or "
         "more, else bf16), bf16, fp8 (int8 q, k and e4m3 P·V, sm_89+; on Hopper 1.3-1.5x faster attention, a "
         "0.84-0.88x step at W124), int8 (int8 q, k and f16 P·V, sm_75+: Turing to "
         "Ada; not yet measured on such a GPU), or sparse (block-sparse, Sol-Attn's rule: exact key tiles "
         "picked per head and step, the rest as tile centroids, the text and audio rows exact; from 20% to 90% "
         "of the schedule (ComfyUI's percent) at 4,096 rows or more; Hopper); docs/CUDA.md",
         0, 0},
        {"sparse", 0, H3_OPT_STR, &sparse, "TAU[,START,END]",
         "--attention sparse's rule (implies it): Sol-Attn's tau (default 1.3; lower keeps more key tiles exact) "
         "and the window of the schedule it runs in, as fractions (default 0.2,0.9)",
         0, 0},
        {"seed", 0, H3_OPT_INT, &seed, "N",
         "noise seed (default: random, printed); same seed, same video here", 0, 0},
        {"output", 'o', H3_OPT_STR, &output, "FILE",
         "the MP4 (default out.mp4; written as FILE.partial, then renamed)", 0, 0},
        {"png-dir", 0, H3_OPT_STR, &png_dir, "DIR",
         "also write every frame as DIR/frame_00000.png ... (DIR new or empty; filled as DIR.partial, then "
         "renamed)",
         0, 0},
        {"wav", 0, H3_OPT_STR, &wav, "FILE", "also write the soundtrack as 16-bit WAV", 0, 0},
        {"latents", 0, H3_OPT_STR, &latents, "FILE",
         "also save the final latents (video_latents, audio_latents) as safetensors; with keyframes also "
         "what the DiT was given for them (keyframe_rows, keyframe_latents, keyframe_noise, keyframe_pixels, "
         "the presentation's text_ids and text_tags); with references what the DiT was given for them and what "
         "they were made from (reference_rows, reference_audio_rows, reference_latents, reference_noise, refK_source, "
         "refK_pixels, refK_wave, text_ids, text_tags, vision_pixels, vision_grid)",
         0, 0},
        {"checkpoint", 0, H3_OPT_STR, &checkpoint, "FILE",
         "keep the sampler's state in FILE every few model calls (euler on the h3 schedule); run the same "
         "request with the same FILE after a crash or a stop and it resumes from there; removed when done",
         0, 0},
        {"checkpoint-every", 0, H3_OPT_INT, &checkpoint_every, "N", "model calls between checkpoints (default 5)",
         1, H3_MAX_STEPS},
        {"dump-dit-inputs", 0, H3_OPT_STR, &dump_inputs, "FILE",
         "also write the first DiT call's inputs (rows, text states, positions, tags, timesteps, indices) "
         "in the format `h3run dit` reads, for comparisons with other implementations",
         0, 0},
        {"device", 0, H3_OPT_STR, &device, "NAME",
         "cpu or cuda (default: cuda when a GPU is present); on cuda every stage is planned on the GPU "
         "before "
         "anything loads: the DiT runs there, the text encoder and the VAEs too unless the budget cannot "
         "hold "
         "them (then on the CPU, the log says why)",
         0, 0},
        {"vram-budget", 0, H3_OPT_STR, &vram_s, "SIZE",
         "device memory the run may take, e.g. 8GiB (default: the free memory less 512 MiB): one arena the "
         "stages take turns in; the DiT's and the video VAE's blocks that do not fit stream from host memory "
         "while the others compute",
         0, 0},
        {"ram-budget", 0, H3_OPT_STR, &ram_s, "SIZE",
         "host memory for pinned copies of streamed blocks (default: 80% of available; 'unlimited'); blocks "
         "beyond it are read from the file each step; on the CPU, all the DiT stage may hold",
         0, 0},
        {"memory-trace", 0, H3_OPT_STR, &trace, "FILE", "write the device memory timeline as JSON", 0, 0},
        {"gpus", 0, H3_OPT_INT, &gpus, "N",
         "split the DiT over GPUs 0..N-1 (sequence parallel over NCCL; N divides its 56 heads: 2, 4, 7 or 8): a "
         "worker process a GPU, each planned within the budget (or its free memory) and an equal share of "
         "--ram-budget; the video decode's chunks shared out too when every GPU holds a decoder; the other "
         "stages on GPU 0 (default 1)",
         1, H3_PLAN_MAX_GPUS},
        {"threads", 't', H3_OPT_INT, &threads, "N", "CPU threads (default 0: one per CPU)", 0,
         H3_MAX_THREADS},
        {"progress", 0, H3_OPT_STR, &progress, "MODE",
         "auto (a bar on a terminal, lines otherwise), bar, lines (each stage's start and end, steps at most "
         "once a second), json (one object per event), none",
         0, 0},
        {"quiet", 'q', H3_OPT_FLAG, &quiet, NULL, "no progress and no summary: warnings and errors only", 0,
         0},
        {"verbose", 'v', H3_OPT_FLAG, &verbose, NULL, "log more", 0, 0},
        {"dit", 0, H3_OPT_STR, &dit, "PATH", "the DiT, instead of the one in --model", 0, 0},
        {"text-encoder", 0, H3_OPT_STR, &te, "PATH", "the text encoder, instead of the one in --model", 0, 0},
        {"tokenizer", 0, H3_OPT_STR, &tok, "PATH",
         "tokenizer.json or its folder, instead of the one in --model", 0, 0},
        {"video-vae", 0, H3_OPT_STR, &vvae, "PATH", "the video VAE, instead of the one in --model", 0, 0},
        {"audio-vae", 0, H3_OPT_STR, &avae, "PATH", "the audio VAE, instead of the one in --model", 0, 0},
        {"x264-preset", 0, H3_OPT_STR, &preset, "NAME", "x264 speed/size preset (default medium)", 0, 0},
        {0},
    };
    const h3_cli_cmd cmd = {
        "generate",
        "generate --model PATH (--prompt TEXT... | --prompt-file FILE | --prompts FILE) [--frames N | --seconds S] "
        "[--window N] [--size WxH] [--steps N] [--sampler NAME] [--scheduler NAME] [--seed N] [-o out.mp4]",
        "Generate a video with stereo sound from a prompt: tokenizer, text encoder (Qwen3-VL, layer 50), the "
        "DiT\n"
        "sampled over --steps model calls, then the audio and video VAEs, into an MP4 (H.264 yuv420p at 24 "
        "fps, AAC\n"
        "at 32 kHz stereo). The stages take turns: each loads its weights only while it runs. --steps counts "
        "model\n"
        "calls: diffusers' \"50 inference steps\" are 50 sigma points, i.e. --steps 49.\n"
        "Outputs appear only when complete, and all together. A failed or interrupted run (Ctrl-C or "
        "SIGTERM\n"
        "once stops it within a second or two and cleans up; twice ends it at once) leaves none of them, "
        "and\n"
        "the files already at those paths as they were. Outputs are regular files (a FIFO or a device is\n"
        "refused), each on its own path and none on a file the model reads; --png-dir takes a new or empty\n"
        "folder.\n"
        "A prompt has at most 8192 tokens (the attention of the text encoder and the DiT grows with the "
        "square\n"
        "of its length); a longer one is refused once tokenized, before the text encoder runs.\n"
        "Exit status: 0 done; 2 a bad request (options, frames, size, steps, names, missing paths, a prompt "
        "too\n"
        "long); 1 the model files or the run failed (a missing component, an unreadable tokenizer, broken\n"
        "weights, out of memory).\n"
        "A clip longer than one window (over 360 frames unless --window says otherwise) is sampled as overlapping\n"
        "windows, each denoised at every step and blended where they overlap, and decoded as one clip; --prompt\n"
        "repeated or --prompts changes the prompt along it.",
        "examples:\n"
        "  h3run generate --model ~/MiniMax-H3/FL2VA --prompt \"a cat on a piano\" --seconds 5 -o cat.mp4\n"
        "  h3run generate --model ComfyUI/models --prompt \"...\" --scheduler simple --sampler res_multistep "
        "--steps 20\n"
        "  h3run generate --model ~/MiniMax-H3/FL2VA --prompt \"...\" --size 896x512 --refine 1344x768:0.5 "
        "--output-size 1920x1080\n"
        "  h3run generate --model ~/MiniMax-H3/FL2VA --prompt \"...\" --first-frame start.png --last-frame "
        "end.jpg --seconds 5\n"
        "  h3run generate --model ~/MiniMax-H3/FL2VA --prompt \"a calm sea\" --prompt \"a storm\" --seconds 30 "
        "-o sea.mp4\n"
        "  h3run generate --model models/h3-tiny --prompt \"a harbor at sunrise\" --frames 22 --size 128x128 "
        "--seed 7 \\\n      --png-dir frames/ --wav sound.wav --latents latents.safetensors -o harbor.mp4",
        opts,
        0,
        0};
    const char *pos[1];
    int npos;
    int r = h3_cli_parse(&cmd, argc, argv, pos, &npos);
    if (r) return r < 0 ? H3_EXIT_OK : r;

    /* Options the request does not check itself. */
    h3_progress_style style;
    if (!strcmp(progress, "auto"))
        style = h3_progress_auto_style(stderr);
    else if (!strcmp(progress, "bar"))
        style = H3_PROGRESS_BAR;
    else if (!strcmp(progress, "lines"))
        style = H3_PROGRESS_LINES;
    else if (!strcmp(progress, "json"))
        style = H3_PROGRESS_JSON;
    else if (!strcmp(progress, "none"))
        style = H3_PROGRESS_QUIET;
    else
        return usage_error("--progress takes auto, bar, lines, json or none; got '%s'", progress);
    if (quiet) style = H3_PROGRESS_QUIET;
    if (prompt_s.n) prompt = prompt_s.v[0];
    if (!prompt && !prompt_file && !prompts_file)
        return usage_error("%s", "--prompt TEXT is required (or --prompt-file FILE, or --prompts FILE)");
    if (!!prompt + !!prompt_file + !!prompts_file > 1)
        return usage_error("%s", "give the prompt as --prompt, --prompt-file or --prompts, only one of them");
    if (seed != INT64_MIN && seed < 0) return usage_error("%s", "--seed takes a whole number >= 0");
    /* Read before anything else happens: a prompt too long is a bad request, refused at once. */
    char *prompt_text = NULL;
    if (prompt_file || prompts_file) {
        size_t len = 0;
        h3_status pst = h3_cli_read_prompt(prompt_file ? prompt_file : prompts_file, &prompt_text, &len);
        if (pst != H3_OK) return h3_cli_fail("generate", pst);
        prompt = prompt_text;
    }
    /* --prompts: "SECONDS PROMPT" lines, split in place */
    const char *more[H3_MAX_PROMPTS - 1];
    double more_s[H3_MAX_PROMPTS - 1];
    int n_more = 0;
    for (int i = 1; i < prompt_s.n; i++) more[n_more++] = prompt_s.v[i];
    if (prompts_file) {
        int n = 0, line = 0;
        char *p = prompt_text;
        prompt = NULL;
        while (p && *p) {
            char *nl = strchr(p, '\n');
            if (nl) *nl = 0;
            line++;
            size_t l = strlen(p);
            if (l && p[l - 1] == '\r') p[--l] = 0;
            char *q = p;
            while (*q == ' ' || *q == '\t') q++;
            if (*q && *q != '#') {
                char *end = NULL;
                const double t = strtod(q, &end);
                if (end == q || !(*end == ' ' || *end == '\t') || !isfinite(t)) {
                    const int rc = usage_error("--prompts %s, line %d: a line is SECONDS PROMPT (for example \"0 a "
                                               "red ball rolls\"); got '%.60s'",
                                               prompts_file, line, q); /* q points into prompt_text */
                    h3_free(prompt_text);
                    return rc;
                }
                while (*end == ' ' || *end == '\t') end++;
                if (n == 0 && t != 0) {
                    h3_free(prompt_text);
                    return usage_error("--prompts %s, line %d: the first prompt must start at 0 s; got %g", prompts_file,
                                       line, t);
                }
                if (n >= H3_MAX_PROMPTS) {
                    h3_free(prompt_text);
                    return usage_error("--prompts %s: at most %d prompts", prompts_file, H3_MAX_PROMPTS);
                }
                if (n == 0) {
                    prompt = end;
                } else {
                    more[n_more] = end;
                    more_s[n_more++] = t;
                }
                n++;
            }
            p = nl ? nl + 1 : NULL;
        }
        if (!n) {
            h3_free(prompt_text);
            return usage_error("--prompts %s holds no prompt", prompts_file);
        }
    }

    /* No --model (and not every component named): the small trained model, at what it was trained on unless
     * the request says otherwise. */
    char *default_model = NULL;
    if (!model && !(dit && te && tok && vvae && avae)) {
        char looked[2048];
        default_model = h3_cli_default_model(looked, sizeof looked);
        if (!default_model) {
            fprintf(
                stderr,
                "h3run generate: error: --model is required: give the official FL2VA/ folder, a diffusers "
                "folder or a ComfyUI models/ folder (the small model h3run uses without --model, "
                "models/" H3_SMALL_MODEL
                ", is in none of: %s; set H3RUN_MODELS to the folder holding " H3_SMALL_MODEL ")\n",
                looked);
            h3_free(prompt_text);
            return H3_EXIT_USAGE;
        }
        model = default_model;
        if (!frames && seconds == 0) frames = H3_SMALL_MODEL_FRAMES;
        if (!size) size = "128x128";
        if (!quiet)
            fprintf(
                stderr,
                "model: %s (the small model trained on h3run's synthetic world: coloured shapes that move, "
                "with a tone; no --model given)\n",
                model);
        if (frames != H3_SMALL_MODEL_FRAMES || seconds != 0 || strcmp(size, "128x128"))
            fprintf(
                stderr,
                "warning: the small model was trained on %d frames at 128x128; other lengths and canvases "
                "follow the prompt less well\n",
                H3_SMALL_MODEL_FRAMES);
    }
    h3_generate_request gr;
    h3_generate_request_init(&gr);
    gr.req.prompt = prompt;
    gr.req.frames = frames;
    gr.req.seconds = seconds;
    gr.req.window = window;
    gr.req.overlap = overlap;
    for (int i = 0; i < n_more; i++) {
        gr.more_prompt[i] = more[i];
        gr.more_prompt_s[i] = more_s[i];
    }
    gr.n_more_prompts = n_more;
    gr.more_prompt_split = prompt_s.n > 1;
    gr.req.steps = (int)steps;
    gr.model = model;
    gr.small_model = default_model != NULL;
    gr.given.dit = (char *)dit;
    gr.given.text_encoder = (char *)te;
    gr.given.tokenizer = (char *)tok;
    gr.given.video_vae = (char *)vvae;
    gr.given.audio_vae = (char *)avae;
    gr.output = output;
    gr.png_dir = png_dir;
    gr.wav = wav;
    gr.latents = latents;
    gr.dump_dit_inputs = dump_inputs;
    gr.audio = audio;
    gr.checkpoint = checkpoint;
    gr.checkpoint_every = (int)checkpoint_every;
    gr.threads = (int)threads;
    gr.gpus = (int)gpus;
    gr.x264_preset = preset;
    if (cache || cache_threshold > 0) gr.cache_threshold = cache_threshold > 0 ? cache_threshold : H3_CACHE_THRESHOLD;
    if (quiet)
        h3_log_set_callback(log_warnings, NULL, H3_LOG_WARN);
    else
        h3_cli_setup_logging(verbose);
    /* Names and sizes go through the library's checks, whose messages name the valid values. */
    h3_status st = H3_OK;
    if (size) st = h3_request_parse_size(size, &gr.req.width, &gr.req.height);
    if (st == H3_OK && refine)
        st = h3_request_parse_refine(refine, &gr.req.refine_width, &gr.req.refine_height,
                                     &gr.req.refine_denoise);
    if (st == H3_OK && out_size)
        st = h3_request_parse_output_size(out_size, &gr.req.out_width, &gr.req.out_height);
    if (st == H3_OK && sampler) st = h3_sampler_parse(sampler, &gr.req.sampler);
    h3_attn_mode am = H3_ATTN_MODE_AUTO;
    if (st == H3_OK && attention) st = h3_attn_mode_parse(attention, &am);
    h3_sparse_rule sp;
    if (st == H3_OK && sparse && (st = h3_sparse_rule_take(sparse, attention != NULL, &am, &sp)) == H3_OK)
        gr.sparse_given = 1, gr.sparse_tau = sp.tau, gr.sparse_start = sp.start, gr.sparse_end = sp.end;
    gr.attention = (int)am;
    if (st == H3_OK && shift) st = h3_request_parse_shift(shift, &gr.req.shift_video, &gr.req.shift_audio);
    if (st == H3_OK && scheduler) st = h3_scheduler_parse(scheduler, &gr.req.scheduler);
    if (st == H3_OK) st = h3_device_parse(device, &gr.device);
    if (st == H3_OK && vram_s) st = h3_budget_parse(vram_s, "--vram-budget", &gr.vram_budget);
    if (st == H3_OK && ram_s && !strcmp(ram_s, "unlimited"))
        gr.ram_budget = -1;
    else if (st == H3_OK && ram_s)
        st = h3_budget_parse(ram_s, "--ram-budget", &gr.ram_budget);
    gr.memory_trace = trace;
    if (st != H3_OK || (seconds != 0 && frames != 0)) {
        h3_free(default_model);
        h3_free(prompt_text);
        return st != H3_OK ? h3_cli_fail("generate", st)
                           : usage_error("%s", "give the length as --frames or as --seconds, not both");
    }
    h3_cli_loras loras;
    int lr = h3_cli_loras_parse("generate", &lora_s, lora_mode, &loras);
    if (!lr && loras.n) { /* the LoRA files against the outputs (generate checks the rest itself) */
        const h3_cli_path outs[] = {{"--output", output, H3_CLI_OUT_FILE},
                                    {"--wav", wav, H3_CLI_OUT_FILE},
                                    {"--latents", latents, H3_CLI_OUT_FILE}};
        lr = h3_cli_check_paths_loras("generate", outs, 3, &loras);
        if (lr) h3_cli_loras_free(&loras);
    }
    if (lr) {
        h3_free(default_model);
        h3_free(prompt_text);
        return lr;
    }
    for (int i = 0; i < loras.n; i++) {
        gr.lora[i] = loras.path[i];
        gr.lora_strength[i] = loras.strength[i];
    }
    gr.n_loras = loras.n;
    gr.lora_mode = loras.mode;
    /* keyframes in packed order: --first-frame, --last-frame, then each --keyframe as given */
    if (first_frame) {
        gr.keyframe[gr.n_keyframes] = first_frame;
        gr.keyframe_frame[gr.n_keyframes++] = 0;
    }
    if (last_frame) {
        gr.keyframe[gr.n_keyframes] = last_frame;
        gr.keyframe_frame[gr.n_keyframes++] = H3_KEYFRAME_LAST;
    }
    char *kf_paths[H3_CLI_LIST_MAX] = {0};
    for (int i = 0; i < kf_s.n; i++) {
        const char *at = strrchr(kf_s.v[i], '@');
        char *end = NULL;
        long long f = at && at[1] ? strtoll(at + 1, &end, 10) : -1;
        if (!at || at == kf_s.v[i] || !end || *end || f < 0 || f > H3_MAX_FRAMES ||
            gr.n_keyframes >= H3_MAX_KEYFRAMES) {
            for (int j = 0; j < i; j++) h3_free(kf_paths[j]);
            h3_cli_loras_free(&loras);
            h3_free(default_model);
            h3_free(prompt_text);
            if (gr.n_keyframes >= H3_MAX_KEYFRAMES)
                return usage_error("%s", "at most 16 keyframes in all (H3_MAX_KEYFRAMES)");
            return usage_error("--keyframe takes IMG@FRAME with FRAME a frame number from 0 (e.g. "
                               "pose.png@60); got '%s'",
                               kf_s.v[i]);
        }
        kf_paths[i] = h3_malloc((size_t)(at - kf_s.v[i]) + 1, H3_MEM_OTHER);
        if (!kf_paths[i]) {
            for (int j = 0; j < i; j++) h3_free(kf_paths[j]);
            h3_cli_loras_free(&loras);
            h3_free(default_model);
            h3_free(prompt_text);
            return h3_cli_fail("generate", H3_ERR(H3_ERR_NOMEM, "out of memory"));
        }
        memcpy(kf_paths[i], kf_s.v[i], (size_t)(at - kf_s.v[i]));
        kf_paths[i][at - kf_s.v[i]] = 0;
        gr.keyframe[gr.n_keyframes] = kf_paths[i];
        gr.keyframe_frame[gr.n_keyframes++] = f;
    }
    { /* the references in the order given, all kinds together: the i-th --ref-KIND takes that list's next value */
        int used[3] = {0, 0, 0};
        const h3_cli_list *lists[3] = {&ref_img, &ref_vid, &ref_aud};
        static const char *const names[3] = {"--ref-image", "--ref-video", "--ref-audio"};
        for (int i = 1; i < argc; i++) {
            if (!strcmp(argv[i], "--")) break;
            for (int k = 0; k < 3; k++) {
                const size_t nl = strlen(names[k]);
                if (strncmp(argv[i], names[k], nl) || (argv[i][nl] && argv[i][nl] != '=')) continue;
                if (used[k] < lists[k]->n && gr.n_refs < H3_MAX_REFS) {
                    gr.ref[gr.n_refs] = lists[k]->v[used[k]++];
                    gr.ref_kind[gr.n_refs++] = (h3_ref_kind)k;
                }
                if (!argv[i][nl]) i++; /* its value */
            }
        }
        if (ref_img.n + ref_vid.n + ref_aud.n > H3_MAX_REFS) {
            for (int i = 0; i < kf_s.n; i++) h3_free(kf_paths[i]);
            h3_cli_loras_free(&loras);
            h3_free(default_model);
            h3_free(prompt_text);
            return usage_error("%d references; H3 takes at most %d (images, videos and sounds together)",
                               ref_img.n + ref_vid.n + ref_aud.n, H3_MAX_REFS);
        }
        if (default_model) gr.ref_image_short = gr.ref_video_short = 128; /* the small model's canvas */
        if (ref_image_size) gr.ref_image_short = (int)ref_image_size;
        if (ref_video_size) gr.ref_video_short = (int)ref_video_size;
    }
    int chose_seed = seed != INT64_MIN;
    gr.req.seed = chose_seed ? (uint64_t)seed : h3_cli_random_seed();
    if (!chose_seed && !quiet)
        fprintf(stderr, "seed: %" PRIu64 " (repeat this run with --seed %" PRIu64 ")\n", gr.req.seed,
                gr.req.seed);

    h3_progress_printer pp;
    h3_progress_printer_init(&pp, stderr, style);
    /* A stop (Ctrl-C, SIGTERM) reaches the library through h3_cancel_request (cli.c); it is seen inside the
     * running op or kernel, not only between steps. */
    h3_generate_callbacks cb = {h3_progress_print, &pp, NULL, NULL};
    h3_cli_run_begin();
    h3_generate_result res;
    st = h3_cli_run_end(h3_generate(&gr, &cb, &res));
    h3_cli_loras_free(&loras);
    for (int i = 0; i < kf_s.n; i++) h3_free(kf_paths[i]);
    if (pp.bar_open) fputc('\n', stderr);
    if (st != H3_OK) {
        h3_free(default_model);
        h3_free(prompt_text);
        return h3_cli_fail("generate", st);
    }
    if (!quiet) {
        printf("wrote %s: %lld frames at %lldx%lld (%.2f s at 24 fps), AAC 32 kHz stereo; seed %" PRIu64
               "; %d steps "
               "of %s on the %s schedule (shift %g:%g), DiT on the %s; %.2f s in all\n",
               output, (long long)res.frames_written, (long long)res.out_width, (long long)res.out_height,
               (double)res.frames_written / 24.0, res.req.seed, res.req.steps,
               h3_sampler_name(res.req.sampler), h3_scheduler_name(res.req.scheduler), res.req.shift_video,
               res.req.shift_audio,
               res.device == H3_DEVICE_CUDA ? "GPU" : "CPU", res.total_s);
        if (res.resumed_step)
            printf("resumed from %s: %d of %d model calls were done before\n", checkpoint, res.resumed_step,
                   res.req.steps);
        if (gr.cache_threshold > 0)
            printf("step cache (threshold %g): %d of %d model calls answered from the cache, %d DiT calls "
                   "(%.2fx fewer); the largest estimated relative output change of a skip %.3f\n",
                   gr.cache_threshold, res.cache_skipped, res.cache_calls,
                   (res.cache_calls - res.cache_skipped) * (res.windows > 1 ? res.windows : 1), /* a call per window */
                   res.cache_calls > res.cache_skipped
                       ? (double)res.cache_calls / (res.cache_calls - res.cache_skipped)
                       : 0.0,
                   res.cache_est_max);
        if (res.windows > 1)
            printf("windows: %d overlapping windows of %lld frames (%lld packed rows each), overlapping by at least "
                   "%lld frames; %d DiT calls\n",
                   res.windows, (long long)res.req.window, (long long)res.seq_len, (long long)res.req.overlap,
                   (res.cache_calls ? res.cache_calls - res.cache_skipped /* every pass's */
                                    : res.req.steps + res.refine_calls) *
                       res.windows); /* the refine pass runs in the same windows */
        if (res.soundtrack_s > 0)
            printf("soundtrack: %s (%.2f s), held as the clip's audio; the MP4 carries it\n", audio, res.soundtrack_s);
        if (res.references)
            printf("references: %d (%lld video rows held at t = 0.999, %lld audio rows held clean), %lld text and "
                   "vision-token rows; text encoder with its vision tower %.2f s, references encoded %.2f s\n",
                   res.references, (long long)res.reference_video_rows, (long long)res.reference_audio_rows,
                   (long long)res.text_tokens, res.stage_s[H3_GEN_TEXT_ENCODER], res.stage_s[H3_GEN_REFERENCES]);
        if (res.keyframes)
            printf("keyframes: %d (%lld rows held at t = 0.999), %lld text and image-token rows; text encoder "
                   "with its vision tower %.2f s, keyframes encoded %.2f s\n",
                   res.keyframes, (long long)res.keyframe_rows, (long long)res.text_tokens,
                   res.stage_s[H3_GEN_TEXT_ENCODER], res.stage_s[H3_GEN_KEYFRAMES]);
        if (res.req.refine_width)
            printf("refine: sampled at %lldx%lld, then %d model calls at %lldx%lld from sigma %.4f "
                   "(denoise %g); the first pass's audio kept\n",
                   (long long)res.req.width, (long long)res.req.height, res.refine_calls,
                   (long long)res.req.refine_width, (long long)res.req.refine_height,
                   (double)res.refine_sigma_v, res.req.refine_denoise);
        if (res.out_width != res.render_width || res.out_height != res.render_height)
            printf("delivery: rendered at %lldx%lld, scaled to %lldx%lld (Lanczos)\n",
                   (long long)res.render_width, (long long)res.render_height, (long long)res.out_width,
                   (long long)res.out_height);
        if (res.device == H3_DEVICE_CUDA) {
            char a[32], b[32];
            printf(
                "DiT on the GPU: budget %s (host %s), %d blocks resident, %d streamed from pinned memory, %d "
                "from the file; %.3f s per model call after the first",
                h3_budget_str(res.vram_budget, a, sizeof a),
                res.ram_budget ? h3_budget_str(res.ram_budget, b, sizeof b) : "not limited", res.dit_resident,
                res.dit_pinned, res.dit_disk, res.measured_step_s);
            if (res.predicted_step_s > 0) printf(" (predicted %.3f)", res.predicted_step_s);
            printf("\n");
            /* each stage in turn within the one budget: where it ran, its device peak, its time */
            printf("stages (one device backend; each gave the device back)  predicted peak  measured peak   "
                   "predicted time  time\n");
            static const int order[6] = {H3_GEN_TEXT_ENCODER, H3_GEN_KEYFRAMES, H3_GEN_DIT,
                                         H3_GEN_REFINE,       H3_GEN_AUDIO_VAE, H3_GEN_VIDEO_VAE};
            for (int i = 0; i < 6; i++) {
                if (order[i] == H3_GEN_REFINE && !res.req.refine_width) continue;
                if (order[i] == H3_GEN_KEYFRAMES && !res.keyframes) continue;
                const h3_stage_report *sr = &res.stages[order[i]];
                char label[64];
                snprintf(label, sizeof label, "stage %s on the %s", h3_generate_stage_name(order[i]),
                         sr->on_device ? "GPU" : "CPU");
                char pt[32] = "-";
                if (res.stage_predicted_s[order[i]] > 0)
                    snprintf(pt, sizeof pt, "%.2f s", res.stage_predicted_s[order[i]]);
                if (sr->on_device)
                    printf("  %-38s %8.3f GiB   %8.3f GiB   %14s  %7.2f s%s\n", label,
                           sr->dev_predicted / 1073741824.0, sr->dev_peak / 1073741824.0, pt,
                           res.stage_s[order[i]], sr->dev_held ? "  (device memory left held)" : "");
                else
                    printf("  %-38s %12s   %12s   %14s  %7.2f s\n", label, "-", "-", pt,
                           res.stage_s[order[i]]);
            }
            fputs(res.memory_report, stdout);
            if (trace) printf("wrote %s (device memory timeline)\n", trace);
        }
        if (png_dir)
            printf("wrote %lld PNG frames (%lldx%lld) to %s\n", (long long)res.frames_written,
                   (long long)res.out_width, (long long)res.out_height, png_dir);
        if (wav) printf("wrote %s (16-bit PCM, 2 channels, 32000 Hz)\n", wav);
        if (latents)
            printf("wrote %s (video_latents [1, 24, %lld, %lld, %lld], audio_latents [2, 32, %lld])\n",
                   latents, (long long)res.latent_t, (long long)res.latent_h, (long long)res.latent_w,
                   (long long)res.audio_latents);
    }
    h3_free(default_model);
    h3_free(prompt_text);
    return H3_EXIT_OK;
}

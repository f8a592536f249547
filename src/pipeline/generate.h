/* h3_generate: a prompt to an MP4 with stereo sound, through the stages that take turns.
 *
 *   check         the request (frames, canvas, steps, names), the output paths and the device, before
 *                 anything loads; then every component's headers are opened once and checked against each
 *                 other (text width, latent channels, VAE geometry), so a broken or mismatched model folder
 *                 fails in milliseconds
 *   tokenize      the prompt with the model's tokenizer (an empty prompt is <|endoftext|>, as ComfyUI does)
 *   text_encoder  Qwen3-VL to hidden_states[50]; the encoder is closed afterwards
 *   dit           the packed t2va layout, seeded noise, the schedule; the AdaLN modulation of every timestep
 *                 of the schedule is computed once, then the sampler calls the DiT once per step; the DiT is
 *                 closed afterwards
 *   refine        (--refine only) the second pass: the video latents upscaled to the refine canvas, re-noised
 *                 to the sigma where the last share of the schedule begins and sampled there, the first
 *                 pass's audio held (docs/SAMPLING.md §8)
 *   audio_vae     the audio latents to a 32 kHz stereo waveform, trimmed or padded to the clip's length
 *   video_vae     the video latents to frames, chunk by chunk, each chunk's frames streamed into the MP4
 *                 encoder (and to PNG files) as they are decoded, scaled to the delivery size there when one
 *                 is asked for (--output-size): the decoded video is never in memory whole
 *   mux           the MP4 finished under "<output>.partial" and renamed to <output>; then the WAV and the
 *                 latents
 *
 * Each stage is a library function (pipeline/stages.h) that opens its component's weights when it begins and
 * gives them back when it ends; a stage's weights are never open while another stage runs. With device CUDA
 * every stage is planned before anything loads (pipeline/plan.h: the text encoder, the DiT, the audio VAE and
 * the video VAE, each against the whole device budget, since they take turns); a request some stage cannot
 * fit stops there. One CUDA backend serves the run (h3_cuda_init once with the budget as its arena, shut down
 * once at the end); the DiT runs on the GPU and each other stage where the plan put it: on the GPU, or on the
 * CPU when the budget cannot hold it there, with the plan's reason in the log.
 *
 * Outputs wait under their temporary names in an output group (base/fs.h) and appear together at the end.
 * Failure or interruption (the should_stop callback, polled between stages, after every DiT step and every
 * decoded chunk; or h3_cancel_request, seen inside every op and long kernel) removes everything the run
 * wrote: the partial MP4, the PNG folder, the WAV and the latents; the files that were at those paths stay. A
 * run therefore leaves either all its outputs, complete, or none of them.
 *
 * Status codes: H3_ERR_INVALID for the request (the CLI exits 2): a bad frame count, canvas, step count,
 * sampler or scheduler name, a --model path that does not exist, an output folder that does not exist, an
 * output that is not a regular file (a FIFO, a device), a --png-dir that is not empty, two outputs on one
 * path or an output on a file the model reads (h3_pathset),
 * --device cuda without a GPU. H3_ERR_NOT_FOUND / H3_ERR_FORMAT / H3_ERR_UNSUPPORTED for the model files
 * (the CLI exits 1): a folder that lacks a component, an unreadable tokenizer, malformed or mismatched
 * weights. H3_ERR_INTERRUPTED when stopped.
 */
#ifndef H3_PIPELINE_GENERATE_H
#define H3_PIPELINE_GENERATE_H

#include <stdint.h>

#include "base/status.h"
#include "pipeline/keyframe.h"
#include "pipeline/progress.h"
#include "pipeline/reference.h"
#include "pipeline/request.h"
#include "pipeline/stages.h"
#include "pipeline/window.h"
#include "models/lora.h"

typedef enum h3_device { H3_DEVICE_AUTO = 0, H3_DEVICE_CPU, H3_DEVICE_CUDA } h3_device;

const char *h3_device_name(h3_device d);
/* "auto", "cpu" or "cuda"; H3_ERR_INVALID naming them otherwise. */
h3_status h3_device_parse(const char *name, h3_device *out);

/* ---- where the components are -------------------------------------------------------------------------- */

typedef struct h3_model_files {
    char *dit, *text_encoder, *tokenizer, *video_vae, *audio_vae; /* paths the components' readers open */
    /* "official", "diffusers", "ComfyUI" or "given" (every component named by the caller) */
    const char *layout;
    char *root; /* the folder the components were found in (NULL when all were given) */
} h3_model_files;

/* Finds the components under `model`:
 *   - the official folder (FL2VA/ or Ref2VA/): transformer/, text_encoder/, tokenizer/, video_vae/,
 *     audio_vae/; a folder holding FL2VA/ (the repository root without the diffusers layout) stands for it;
 *   - the diffusers folder: transformer/, text_encoder/, tokenizer/, vae/, audio_vae/;
 *   - a ComfyUI models/ folder: the DiT in diffusion_models/ (or unet/), the text encoder in text_encoders/
 *     (or clip/), both VAEs in vae/, each recognized from its tensor names; where several files qualify,
 *     bf16 before quantized and FL2VA before Ref2VA; the tokenizer from tokenizer/ beside them or ComfyUI's
 *     own comfy/text_encoders/qwen25_tokenizer/ next to models/.
 * given (may be NULL) names components explicitly; its non-NULL paths win, and with all five given `model`
 * may be NULL. Paths are checked to exist; what each holds is checked when it is opened. Free with
 * h3_model_files_free. */
h3_status h3_model_files_find(const char *model, const h3_model_files *given, h3_model_files *out);
/* The same for a ref2va request (ref2va nonzero): the release's Ref2VA partition first: Ref2VA/ under a
 * repository root, transformer_ref/ in a diffusers folder, a ComfyUI DiT file named ref2va; where the model has
 * none, its one DiT. */
h3_status h3_model_files_find_for(const char *model, const h3_model_files *given, int ref2va, h3_model_files *out);
void h3_model_files_free(h3_model_files *f);

/* ---- the run ------------------------------------------------------------------------------------------- */

struct h3_session; /* pipeline/session.h */

typedef struct h3_generate_request {
    h3_request req;    /* prompt, frames or seconds, canvas, steps (model calls), sampler, scheduler, seed */
    const char *model; /* model folder (see h3_model_files_find) */
    h3_model_files given;    /* components named explicitly (NULL members: found under model) */
    const char *output;      /* the MP4 (required) */
    const char *png_dir;     /* also every frame as DIR/frame_00000.png ...; NULL: none */
    const char *wav;         /* also the soundtrack as 16-bit WAV; NULL: none */
    const char *latents;     /* also the final latents as safetensors; NULL: none */
    const char *dump_dit_inputs; /* the first DiT call's inputs in `h3run dit`'s format (comparisons); NULL */
    /* Resumable runs (the h3 schedule with euler): the sampler's state (the first pass's latent rows) is saved
     * to this file every checkpoint_every model calls (0: H3_CHECKPOINT_EVERY), atomically; a run given a file
     * that holds a state of the same request starts from it, after the text encoder and the keyframes; the
     * file is removed when the run succeeds. NULL: none. */
    const char *checkpoint;
    int checkpoint_every;
    h3_device device;        /* AUTO: CUDA when a GPU is present, else the CPU */
    int threads;             /* CPU threads; 0: one per CPU */
    const char *x264_preset; /* NULL: "medium" */
    /* The stages' memory (src/pipeline/plan.h plans every stage on the device before anything loads): */
    int64_t vram_budget; /* every device byte the run takes (the one backend's arena, each stage in turn);
                          * 0: free device memory less H3_VRAM_MARGIN; ignored on the CPU */
    int64_t ram_budget;  /* host bytes for pinned weight copies and staging (on the CPU: everything the DiT
                          * stage  holds, checked before the text encoder runs); 0: H3_RAM_SHARE of
                          * MemAvailable;  -1: not limited */
    const char *memory_trace; /* the device memory timeline as JSON (h3_memrep_write_trace); NULL: none */
    /* the DiT split over GPUs 0..gpus-1 (sequence parallel over NCCL, pipeline/dit_group.h): a worker process a
     * GPU beside this one, each GPU planned within the device budget (or its own free memory) and an equal share
     * of the host's; the other stages on GPU 0. 0 or 1: one GPU. */
    int gpus;
    /* LoRAs on the DiT (models/lora.h): files, strengths, and how they apply (an h3_lora_mode) */
    const char *lora[H3_MAX_LORAS];
    float lora_strength[H3_MAX_LORAS];
    int n_loras;
    int lora_mode;
    /* step caching (sample/cache.h): > 0 skips DiT calls whose output change EasyCache estimates below this
     * (H3_CACHE_THRESHOLD is ComfyUI's default); 0: off */
    double cache_threshold;
    int attention; /* the DiT blocks' attention, an h3_attn_mode (pipeline/plan.h): auto, bf16, fp8, int8 or sparse */
    /* sparse's rule (--sparse TAU,START,END; pipeline/plan.h h3_sparse_rule_take fills these) when sparse_given,
     * else Sol-Attn's (H3_SPARSE_RULE_DEFAULT); given with another attention than sparse, the request is refused */
    int sparse_given;
    float sparse_tau, sparse_start, sparse_end;
    int small_model; /* the model is h3run's small trained one (models/h3-small): no warnings about lengths
                      * and canvases outside the release's training range, which it does not share */
    struct h3_session *session; /* what earlier runs on this model kept (pipeline/session.h); NULL: none */
    /* fl2va keyframes (pipeline/keyframe.h), in packed order: images and their frames (H3_KEYFRAME_LAST: the
     * clip's last); without --size the canvas takes the first one's aspect ratio */
    const char *keyframe[H3_MAX_KEYFRAMES];
    int64_t keyframe_frame[H3_MAX_KEYFRAMES];
    int n_keyframes;
    /* A soundtrack the video follows (audio to video): any audio file libav reads; resampled to 32 kHz stereo,
     * encoded by the audio VAE's encoder and held clean (t = 1) as the target audio in every DiT call; the MP4
     * carries this sound, not a decoded one. Without frames or seconds the clip takes its length (17n+5 frames
     * that fit in it). NULL: none. */
    const char *audio;
    /* ref2va references (pipeline/reference.h), in the order the model reads them: files and kinds; the DiT is
     * the model's Ref2VA partition when it has one. ref_image_short / ref_video_short: the short edges images and
     * videos are put on (0: the release's, H3_REF_IMAGE_SHORT and H3_REF_VIDEO_SHORT). */
    const char *ref[H3_MAX_REFS];
    h3_ref_kind ref_kind[H3_MAX_REFS];
    int n_refs;
    int ref_image_short, ref_video_short;
    /* A long clip's later prompts (pipeline/window.h): req.prompt holds from 0 s, more_prompt[i] from second
     * more_prompt_s[i] (ascending, > 0, within the clip). Each window takes the prompt in effect at the middle
     * of its overlap with the window before (the first window: req.prompt), so a change is blended across that
     * overlap. n_more_prompts 0: one prompt. */
    const char *more_prompt[H3_MAX_PROMPTS - 1];
    double more_prompt_s[H3_MAX_PROMPTS - 1];
    int n_more_prompts;
    int more_prompt_split; /* nonzero: more_prompt_s is not read; prompt i starts at i/(n_more_prompts + 1) of
                            * the clip (`--prompt` repeated) */
} h3_generate_request;

#define H3_CHECKPOINT_EVERY 5

void h3_generate_request_init(h3_generate_request *r);

typedef int (*h3_stop_fn)(void *user); /* nonzero: stop the run as soon as possible */

typedef struct h3_generate_callbacks {
    h3_progress_fn progress; /* stage and step events (see progress.h); may be NULL */
    void *progress_user;
    h3_stop_fn should_stop; /* may be NULL */
    void *stop_user;
} h3_generate_callbacks;

enum {
    H3_GEN_TOKENIZE = 0,
    H3_GEN_TEXT_ENCODER,
    H3_GEN_KEYFRAMES, /* fl2va: the keyframes through the video VAE's encoder (no events without them) */
    H3_GEN_REFERENCES, /* ref2va: the references through the VAEs' encoders (no events without them) */
    H3_GEN_SOUNDTRACK, /* a given soundtrack through the audio VAE's encoder (no events without one) */
    H3_GEN_DIT,
    H3_GEN_REFINE, /* the second pass of --refine (no events without it) */
    H3_GEN_AUDIO_VAE,
    H3_GEN_VIDEO_VAE,
    H3_GEN_MUX,
    H3_GEN_STAGES
};
/* The stage names progress events carry: "tokenize", "text_encoder", "keyframes", "references", "soundtrack", "dit",
 * "refine", "audio_vae", "video_vae", "mux". */
const char *h3_generate_stage_name(int stage);

typedef struct h3_generate_result {
    h3_request req;      /* the resolved request (frames, canvas, steps filled in) */
    h3_device device;    /* where the DiT ran */
    int64_t text_tokens; /* L (with keyframes: their presentation and vision rows included) */
    int keyframes;       /* fl2va keyframes; their rows in the packed sequence */
    double soundtrack_s; /* the soundtrack's length as read (0: none) */
    int resumed_step;    /* the model calls a checkpoint saved, which this run skipped (0: from the start) */
    /* step caching (cache_threshold): model calls asked for and answered from the cache (every pass), and the
     * largest estimated relative output change a skipped call accumulated */
    int cache_calls, cache_skipped;
    double cache_est_max;
    int64_t keyframe_rows;
    int references;                        /* ref2va references */
    int64_t reference_video_rows, reference_audio_rows; /* their rows in the packed sequence */
    int windows;         /* overlapping windows the clip was sampled in (1: one; pipeline/window.h) */
    int64_t seq_len;     /* packed rows: L + 2*T_a + video rows (one window's) */
    int64_t latent_t, latent_h, latent_w, audio_latents; /* video latent [24, T, H, W]; audio [2, 32, T_a]
                                                          * (the last pass's) */
    int64_t render_width,
        render_height;             /* the frames the video VAE decodes: the canvas, or the refine canvas */
    int64_t out_width, out_height; /* the MP4's (and PNG frames') size: the delivery size, or the render's */
    /* --refine: the second pass (zeros without it) */
    int64_t refine_seq_len;
    int refine_calls;                      /* model calls of the refine pass */
    float refine_sigma_v;                  /* the video sigma it starts from (re-noised to it) */
    double refine_measured_step_s;         /* per model call of the refine pass */
    int64_t frames_written, audio_samples; /* into the MP4 (per channel for the audio) */
    int modulation_timesteps;              /* distinct timesteps whose AdaLN modulation was precomputed */
    double stage_s[H3_GEN_STAGES];         /* seconds per stage */
    double stage_predicted_s[H3_GEN_STAGES]; /* the plan's seconds for the model stages (0: not planned: the
                                              * CPU, or no figures for this GPU) */
    h3_stage_report
        stages[H3_GEN_STAGES]; /* text encoder, DiT (and refine), audio VAE, video VAE: where each ran, its
                                * predicted and measured device peak, what it left held */
    double total_s;
    int64_t peak_host_bytes; /* the largest host memory h3run's allocator held during the run */
    /* the DiT on the device (zeros on the CPU) */
    int64_t vram_budget, ram_budget;          /* the budgets planned for (ram 0: not limited) */
    int64_t dev_predicted_peak, dev_peak;     /* the plan's device peak and the arena's measured peak */
    int dit_resident, dit_pinned, dit_disk;   /* where the DiT's blocks lived */
    double predicted_step_s, measured_step_s; /* per model call (predicted 0: no figures for this GPU) */
    char memory_report[3072]; /* predicted vs measured per category, copy bandwidth ("" on CPU) */
    unsigned reused;          /* what the run took from its session (H3_REUSED_* bits, pipeline/session.h) */
    double dit_start_s; /* seconds from the run's start until the DiT's first model call began: the text
                         * states ready, its weights opened (on the CPU) or placed (on a GPU) and its
                         * modulation computed; every load before the DiT computes counts here */
    char attention[96]; /* the DiT blocks' attention as run and why ("fp8 (asked)", "bf16 (auto: ...)") */
    char plan[2048];    /* h3_generate_check: the plan in words (the stages' places and peaks on a GPU; the
                         * DiT's host memory against the budget on the CPU) */
} h3_generate_result;

/* Runs the request. cb and out may be NULL. The library never prints: warnings (an untrained length or
 * canvas) and what was found (model layout, device) go to the log. */
h3_status h3_generate(const h3_generate_request *r, const h3_generate_callbacks *cb, h3_generate_result *out);

/* Everything h3_generate does before the text encoder runs, and nothing after: the request resolved and
 * checked, the outputs' paths, the device, the model's files and how they fit, the prompt tokenized and its
 * length checked, every stage planned against the budgets (on the CPU: the DiT stage's host memory). H3_OK
 * when the run would start; otherwise the status and message h3_generate would give (H3_ERR_INVALID for the
 * request, H3_ERR_BUDGET when the plan does not fit, with what would fit). out->req is the resolved request
 * and out->plan the plan in words. Writes nothing. May run beside an h3_generate on the same session. */
h3_status h3_generate_check(const h3_generate_request *r, h3_generate_result *out);

#endif

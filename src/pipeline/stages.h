/* The stages of a run as library functions: the text encoder, the DiT (its sampling loop, or single calls),
 * the audio decode and the video decode. h3_generate composes them; `h3run encode`, `dit` and `decode` call
 * the same functions, so a stage runs alone exactly as it runs inside a run.
 *
 * Each stage takes its component (a path it opens, or a model the caller opened), its placement as the plan
 * decided (src/pipeline/plan.h: an h3_stage_plan for the text encoder and the VAEs, the h3_plan for the DiT;
 * NULL, or a plan that puts it on the host: the host), its inputs on the host and where its outputs go.
 *
 * On the device a stage runs inside the run's one CUDA backend: the caller brings it up once before the
 * first stage (h3_cuda_init with the run's device budget: the arena every stage takes its turn in) and shuts
 * it down once after the last. A stage gives back everything it took on the device before it returns (its
 * weights, its activations, the quantized GEMMs' scratch), so the next finds only the backend's workspace in
 * use, as the planner assumes. Its report says where it ran, for how long, its predicted and measured device
 * peak, and what it still held when it ended (0: everything given back); the stage logs it too.
 */
#ifndef H3_PIPELINE_STAGES_H
#define H3_PIPELINE_STAGES_H

#include <stdint.h>

#include "models/audio_vae.h"
#include "mem/report.h"
#include "models/dit.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"
#include "models/video_vae_enc.h"
#include "pipeline/dit_group.h"
#include "pipeline/keyframe.h"
#include "pipeline/layout.h"
#include "pipeline/plan.h"
#include "sample/cache.h"
#include "sample/sampler.h"
#include "sample/schedule.h"

typedef struct h3_stage_report {
    int on_device;
    double seconds;
    int64_t dev_predicted; /* the plan's device peak; 0 on the host */
    int64_t dev_peak;      /* the arena's peak during the stage, the backend's workspace included (device) */
    int64_t dev_held;      /* device bytes held when it ended beyond those held when it began: 0 when it gave
                            * everything back */
} h3_stage_report;

/* ---- text encoder -------------------------------------------------------------------------------------- */

typedef struct h3_te_stage {
    const char *path;    /* the text encoder: opened here (with config_path and on_layer) and closed; or */
    h3_text_encoder *te; /* one the caller opened (path then only names it in messages); left open and
                          * placed back on the host */
    const char *config_path;   /* with path: config.json to use (NULL: beside the weights) */
    const h3_stage_plan *plan; /* h3_plan_text_encoder's; NULL: the host */
    const int32_t *ids;
    int64_t n;
    int layer; /* hidden_states[layer] */
    /* with path: after each layer (done of total); nonzero stops the stage with H3_ERR_INTERRUPTED */
    int (*on_layer)(void *user, int done, int total);
    void *on_layer_user;
    /* images (NULL vis: a text prompt): the vision tower of te, the processor's pixel_values and grids; ids
     * hold the expanded image tokens. The tower runs where the text encoder runs. */
    struct h3_vision *vis;
    const h3_tensor *pixels;
    const int64_t (*grid)[3];
    int n_img;
} h3_te_stage;

/* hidden_states[layer] of the ids into *hidden, allocated here: f32 [n, hidden] on the host (freed on
 * failure). A value that is not finite is H3_ERR_FORMAT naming the weights. */
h3_status h3_stage_text_encoder(h3_exec *ex, const h3_te_stage *a, h3_tensor *hidden, h3_stage_report *rep);

/* ---- DiT ----------------------------------------------------------------------------------------------- */

typedef struct h3_dit_stage_args {
    h3_dit *dit;         /* opened by the caller as the plan planned it: on the device with act_place DEVICE,
                          * weight_place         HOST and stream_weights; on the host as it computes. Not closed: the
                          * stage         gives back         everything it placed (blocks, slots, workspace,
                          * modulation) */
    const h3_plan *plan; /* on the device: the plan (its DiT placement, budgets, figures); NULL: the host */
    const h3_tensor *text;              /* f32 [L, text_dim] on the host: the text states of every call */
    int64_t text_rows_max; /* calls may give their own text states (h3_dit_inputs.text, a long clip's prompts)
                            * of up to this many rows; 0: text's */
    int64_t n_video_rows, n_audio_rows; /* rows of every call */
    const float *timesteps; /* the modulation of these is computed once and kept (NULL, 0: each call computes
                             * its own; the host only) */
    int n_timesteps;
    const char *memory_trace; /* device: the memory timeline as JSON (h3_memrep_write_trace); NULL: none */
    /* On the device, a placement kept by an earlier stage (h3_dit_stage_result.stream) for this DiT, made as
     * this plan places it (h3_dit_stream_matches: the caller checks): the stage computes with it instead of
     * placing the blocks again. The stage owns it from the call on (closed with the stage unless kept
     * again). stream_dev: the device bytes it holds per category (h3_dit_stage_result.stream_dev), counted
     * in the stage's report as placed. NULL: the stage places the blocks. */
    struct h3_dit_stream *stream;
    int64_t stream_dev[H3_DEVCAT_COUNT];
    /* On the device: a stage that succeeds ends with its placement kept (h3_dit_stage_result.stream) instead of
     * given back; its activations, modulation and input rows go back as always. */
    int keep;
    /* On the device, placing the blocks: pinned copies kept by an earlier stage of this DiT
     * (h3_dit_stage_result.pinned), adopted by the units this plan pins (their entries emptied; the caller
     * frees the rest). NULL: none. */
    h3_pinned_cache *pinned;
    /* On the device, without keep: a stage that succeeds keeps the pinned copies of its streamed blocks
     * (h3_dit_stage_result.pinned) and gives back the rest. */
    int keep_pinned;
    /* A DiT split over several GPUs (docs/ARCHITECTURE.md "Several GPUs"): rank 0 gives its group (each call's
     * inputs go to the other ranks first, then every rank runs h3_dit_forward_sp and rank 0 collects their
     * answers); a worker gives its handle of the group (comm). NULL, NULL: the whole DiT here. */
    struct h3_dit_group *group;
    struct h3_comm *comm;
} h3_dit_stage_args;

typedef struct h3_dit_stage_result {
    h3_stage_report rep;
    int calls;
    double call_s; /* seconds per model call after the first (the first's own time when there is one call) */
    char memory_report[3072]; /* device: predicted vs measured per category, copy bandwidth; "" on the host */
    double open_s;     /* seconds from the stage's start until its first call began (the weights placed and
                        * the modulation computed) */
    int reused_stream; /* the stage computed with the placement it was given (h3_dit_stage_args.stream) */
    /* keep: the placement kept (the caller owns it: pass it to a later stage or h3_dit_stream_close it with the
     * backend still up), and the device bytes it holds per category; NULL when the stage gave it back */
    struct h3_dit_stream *stream;
    int64_t stream_dev[H3_DEVCAT_COUNT];
    /* keep_pinned: the pinned copies kept (the caller frees them with h3_pinned_cache_free while the backend
     * is up); empty (n 0) when none */
    h3_pinned_cache pinned;
    int64_t pinned_adopted; /* bytes of pinned copies the stage adopted from h3_dit_stage_args.pinned */
    h3_cache_stats cache;   /* h3_stage_dit_sample with a cache: the calls asked for and skipped */
} h3_dit_stage_result;

typedef struct h3_dit_stage h3_dit_stage;

/* Starts the stage: on the device the blocks placed as planned (resident, pinned, read from the files) and
 * the arena's allocations counted by category; the modulation of the timesteps computed and kept; the text
 * states copied to the activation place; the device's input and output rows. */
h3_status h3_dit_stage_open(h3_exec *ex, const h3_dit_stage_args *a, h3_dit_stage **out);
/* One model call: in's video [Nv, 96] and audio [Na, 32] rows are f32 host tensors (its text is the stage's, or
 * in->text when given: f32 host [L, text_dim], L at most the stage's text_rows_max);
 * the velocities go to video_v and audio_v, f32 host tensors of the same shapes (NULL when a count is 0). */
h3_status h3_dit_stage_call(h3_dit_stage *s, const h3_dit_inputs *in, h3_tensor *video_v, h3_tensor *audio_v);
/* Ends the stage: the memory report and the timeline (written whatever happened), and every byte the stage
 * placed given back. res may be NULL; s may be NULL. */
void h3_dit_stage_close(h3_dit_stage *s, h3_dit_stage_result *res);
/* The next call that brings its own text states has them copied even if it is the tensor the last call brought: for
 * a caller that refills one tensor between calls (a split DiT's worker). */
void h3_dit_stage_text_changed(h3_dit_stage *s);

typedef struct h3_dit_sample_args {
    h3_dit_stage_args dit;
    /* On the device: the DiT split over this many GPUs (h3_plan_request.gpus; 0 or 1: one): the stage starts the
     * other GPUs' workers with `split` (its text, rows and timesteps filled from the stage's own) and stops them at
     * its end; each worker's plan is dit.plan->dit_gpu[its rank]. */
    int gpus;
    h3_dit_rank_setup split;
    /* With gpus > 1: where the group goes when the stage succeeds, its DiT calls ended (h3_dit_group_end_dit)
     * and its workers waiting for a video decode (h3_stage_video_vae's split); the caller stops it. A group
     * whose workers cannot take that (one ended after its last call) is stopped, with a warning, and
     * *keep_group left as it was: the decode then runs on GPU 0 alone. NULL: stopped here. */
    struct h3_dit_group **keep_group;
    const h3_seq_layout *layout; /* the packed sequence (its rows are the calls' rows) */
    h3_sampler sampler;
    const h3_schedule *schedule;
    h3_step_fn on_step; /* after each model call (may be NULL); an error stops the loop with it */
    void *step_ctx;
    int from_latent; /* the rows hold latents noised to the schedule's first sigmas (h3_sample_args) */
    /* Held audio (the refine pass): held_audio [Na·32] clean audio rows that are not sampled; every call sees
     * them noised to its own audio sigma, (1 - sigma_a)*held_audio + sigma_a*held_noise (held_noise [Na·32]),
     * as the joint model was trained to see audio beside video at that step, and the audio rows come back
     * equal to held_audio. held_noise NULL (a soundtrack): every call sees held_audio itself at t_audio = 1
     * (clean), as the release's conditioning rows take audio at max(t, 1). held_audio NULL: the audio is
     * sampled with the video. */
    const float *held_audio, *held_noise;
    /* fl2va: the keyframe rows [layout->n_cond_rows·96] (noised to their fixed time, pipeline/keyframe.h):
     * every call sees them before the target's video rows, at max(t_video, 0.999); they are not sampled.
     * NULL when the layout has none. */
    const float *cond_rows;
    /* ref2va: the references' audio rows [layout->n_ref_audio_rows·32] (normalized latents, packed order): every
     * call sees them before the target's audio rows, clean (t = 1); they are not sampled. NULL when the layout
     * has none. (The references' video rows are cond_rows.) Not with windows. */
    const float *ref_audio_rows;
    /* the first model call's inputs written to this file in `h3run dit`'s format (h3_dit_inputs_read: video,
     * audio, text, timesteps, position_ids, timestep_indices, token_tags and the three index sets), for
     * comparisons with other implementations; NULL: none */
    const char *dump_inputs;
    int start_step; /* resume: the rows hold the state after this many calls (h3_sample_args.start_step) */
    /* step caching (sample/cache.h): calls predicted to change the output little are answered from the last
     * computed one; NULL: every call runs the DiT. The figures go to the result's `cache`. */
    const h3_cache_opts *cache;
    /* A long clip (pipeline/window.h) of more than one window: the layout is one window's, video_rows and
     * audio_rows hold the whole clip's rows ([windows->latent_t·(latent_h/2)·(latent_w/2), 96] and
     * [2·windows->audio_t, 32]; held_audio too), and every model call runs the DiT on each window and fuses
     * their velocities with the windows' weights (held audio and its noise taken a window at a time). NULL: the
     * layout is the clip's. */
    const struct h3_windows *windows;
    /* With windows, each window's own text states, layout and keyframe rows ([windows->n] each; window 0's are
     * dit.text, layout and cond_rows): a long clip's prompts, and the keyframes inside each window at their frames
     * in it. NULL: every window takes window 0's. */
    const h3_tensor *const *win_text;
    const h3_seq_layout *const *win_layout;
    const float *const *win_cond;
} h3_dit_sample_args;

/* The sampling loop: opens the stage, runs the sampler over the schedule with one model call per step, closes
 * the stage (res filled whatever happened; may be NULL). video_rows [Nv·96] and audio_rows [Na·32] hold unit
 * noise in the layout's row order on entry (or the noised latents: from_latent) and the sampled latents on
 * return. */
h3_status h3_stage_dit_sample(h3_exec *ex, const h3_dit_sample_args *a, float *video_rows, float *audio_rows,
                              h3_dit_stage_result *res);

/* ---- the VAEs ------------------------------------------------------------------------------------------ */

/* The audio decode of latents [channels, C, T] (host f32) into waveform (caller-allocated, host f32
 * [channels, T·hop] or [channels, 1, T·hop]). v is the caller's, left open and back on the host. plan:
 * h3_plan_audio_vae's (NULL: the host). */
h3_status h3_stage_audio_vae(h3_exec *ex, h3_audio_vae *v, const h3_stage_plan *plan,
                             const h3_tensor *latents, h3_tensor *waveform, h3_stage_report *rep);

/* A video decode split over the GPUs of a DiT group whose calls are over (h3_dit_group_end_dit): the workers
 * open the decoder at vae_path (with opts) on their GPUs. */
typedef struct h3_video_split {
    struct h3_dit_group *group;
    const char *vae_path;
    const h3_video_vae_opts *opts;
} h3_video_split;

/* The video decode of latents [C, T, H, W] or [1, C, T, H, W] (host f32) to out (frames chunk by chunk, or
 * the whole video). v is the caller's, left open and unplaced. plan: h3_plan_video_vae's for these latents
 * (NULL: the host, as v was opened). split (NULL: none): the decode's chunks shared with the group's workers
 * (h3_video_vae_decode_split), which are sent the decode before this GPU places its decoder; the group is the
 * caller's to stop. */
h3_status h3_stage_video_vae(h3_exec *ex, h3_video_vae *v, const h3_stage_plan *plan,
                             const h3_video_split *split, const h3_tensor *latents,
                             const h3_video_decode_out *out, h3_stage_report *rep);

/* The video VAE encoder's latents of pixels (uint8 [1, 3, F, H, W], checked by h3_video_enc_check_pixels)
 * into latents (host f32 [1, C, T, H/16, W/16], T = h3_video_enc_latent_frames), at the encoder's placement
 * (h3_video_enc_place). sample 0: the posterior mean before normalization (what diffusers'
 * encode(...).latent_dist.mean gives; `h3run vae-encode`). sample 1: the conditioning latents of diffusers'
 * fl2va encode_vae_condition: the posterior sampled with normal values 0.. of stream H3_RNG_STREAM_VAE_ENCODE
 * of `seed` (sample/rng.h), rounded to float16, normalized with the VAE's latents_mean/std. */
h3_status h3_stage_video_encode(h3_exec *ex, h3_video_enc *e, const h3_tensor *pixels, int sample,
                                uint64_t seed, h3_tensor *latents);

/* fl2va: the keyframes' conditioning (h3_keyframes_condition) with the encoder at the plan's place (plan:
 * h3_plan_make's venc; NULL or on the host: the host); the encoder's device weights given back before it
 * returns. */
/* ref2va: the references' conditioning: first the sounds (h3_refs_encode_sounds) with the audio encoder ae (NULL:
 * no sounds) at aplan's place, given back, then the images and videos (h3_refs_encode_visuals) with the video encoder
 * e (NULL: none) at vplan's place, given back. The stage's predicted device peak is the larger of the two. */
struct h3_ref_set;
struct h3_audio_enc;
struct h3_audio_vae_config;
h3_status h3_stage_references(h3_exec *ex, h3_video_enc *e, const h3_stage_plan *vplan, struct h3_audio_enc *ae,
                              const h3_stage_plan *aplan, const struct h3_audio_vae_config *avc,
                              const struct h3_ref_set *s, uint64_t seed, float **vrows, float **arows, float **clean,
                              h3_status (*on_done)(void *user, int done, int total), void *user,
                              h3_stage_report *rep);
/* A waveform through the audio VAE's encoder (h3_audio_enc_encode) with the convolution stack at the plan's place
 * (NULL or the host: the host), given back before it returns; the report's peak is the plan's. */
h3_status h3_stage_audio_encode(h3_exec *ex, struct h3_audio_enc *ae, const h3_stage_plan *plan, const h3_tensor *wave,
                                h3_tensor *latents, h3_stage_report *rep);

h3_status h3_stage_keyframes(h3_exec *ex, h3_video_enc *e, const h3_stage_plan *plan, const h3_keyframe_set *s,
                             uint64_t seed, h3_tensor *clean, float **rows,
                             h3_status (*on_done)(void *user, int done, int total), void *user,
                             h3_stage_report *rep);

#endif

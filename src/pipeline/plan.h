/* The memory planner: for a request (frames, canvas, prompt length) and the components a model folder holds,
 * decide before anything is loaded where each stage runs, where every weight block lives and how the
 * activations are chunked, so that each stage stays inside the device and host budgets at the best predicted
 * speed; or say, before loading, that nothing fits, which stage and which budget is short and what would fit.
 *
 * The stages take turns inside one device budget (text encoder, DiT, audio VAE, video VAE: each gives all its
 * device memory back before the next starts), so each is planned against the whole budget. Every stage's
 * memory comes from the model's own arithmetic, the one its allocations use: the DiT's h3_dit_forward_mem_of
 * and packed units, the text encoder's h3_text_encoder_device_bytes and its layers' packed sizes, the video
 * VAE's h3_video_vae_plan, the audio VAE's h3_audio_vae_decode_peak; so the plan cannot drift from what runs.
 * The time predictions are the planner's own model of each stage on a named device's figures.
 *
 * Pure arithmetic on headers: weights need not be readable (header-only files plan like the real ones) and no
 * GPU is needed.
 *
 * The DiT stage (per step: the token-refiner blocks then the DiT blocks, every step the same order):
 *     device = backend workspace + non-block weights + resident blocks + ring slots + kept modulation
 *              + max(forward: buffers + inputs/outputs + scratch, precompute: its scratch)
 * Each block ("unit": a refiner or DiT block's core weights, packed) is RESIDENT on the device, or streamed
 * through the ring from PINNED host memory, or from DISK (read into pinned staging per use) when the host
 * budget cannot hold it. The AdaLN projections never stream per step: the modulation of every timestep of the
 * run is computed once (streaming each block's projection through the ring once) and kept on the device.
 *
 * The plan tries every FFN row chunk and ring depths 1..H3_PLAN_MAX_SLOTS, fills what is left with resident
 * blocks (refiner blocks first: they compute almost nothing and cannot hide their copies; then DiT blocks
 * spread evenly), and predicts the step time by simulating the copy stream, the read stream and the compute
 * stream over several steps with the device figures (h3_device_figures). It keeps the fastest, judged with
 * copies and reads 25% slower than the figures (a plan must hide its copies with slack, not on paper); among
 * plans within 0.5% of it, the one that streams the fewest bytes, then the largest chunk. A plan fits when
 * its predicted peak plus h3_budget_slack(budget) is within the budget (the slack covers the arena's 256-byte
 * granules and the holes a first-fit arena can leave).
 *
 * The other stages (h3_stage_plan) run on the device when their device peak plus the slack fits the device
 * budget, else on the host, with the reason; a stage fits when the place it gets holds it (the host budget,
 * when it runs there). The DiT runs on the device only.
 */
#ifndef H3_MEM_PLAN_H
#define H3_MEM_PLAN_H

#include <stdint.h>

#include "mem/budget.h"
#include "mem/streamer.h"
#include "models/audio_vae.h"
#include "io/safetensors.h"
#include "models/dit.h"
#include "models/dit_stream.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"
#include "models/audio_vae_enc.h"
#include "models/video_vae_enc.h"

#define H3_PLAN_MAX_UNITS 256
#define H3_PLAN_MAX_SLOTS 8
#define H3_PLAN_MAX_GPUS 8 /* the most GPUs one DiT is split over (h3_plan_request.gpus) */

/* Figures of a GPU the time model uses. Rates are the effective ones inside the DiT at W124 (see
 * docs/MEMORY.md). */
typedef struct h3_device_figures {
    char name[16];                             /* "h200" */
    char label[128];                           /* where the figures come from */
    int64_t memory;                            /* device memory, bytes */
    double pinned_gbs, pageable_gbs, disk_gbs; /* host->device from pinned and pageable memory; file reads */
    double gemm_tflops;                        /* bf16 GEMM at M >= ~20k rows */
    double gemm_half_rows;       /* GEMM efficiency M/(M+half), relative to its value at 19,412 rows */
    double attn_tflops;          /* attention, 4·S²·inner FLOP per block */
    double eltwise_ns_per_kelem; /* norms, RoPE, SwiGLU, residuals of one block: ns per 1000 (row × hidden) */
    double f32_tflops;           /* f32 GEMMs without TF32 (the audio VAE's convolutions) */
    double cache_gbs;            /* file reads out of the page cache, through the streamer, GB/s */
    double gemm_fp8_tflops;      /* fp8 (e4m3) W8A8 GEMM inside a DiT block; 0: the bf16 rate */
    double attn_fp8_tflops;      /* fp8 attention (H3_ATTN_FP8) inside a DiT block, its quantization included; 0:
                                  * the bf16 rate */
    double link_gbs; /* a GPU's sends (and receives) to the others of a split DiT (NCCL over NVLink or PCIe), GB/s
                      * each way; 0: the exchange is not timed */
    double dit_eltwise_ns_per_kelem; /* the DiT blocks' own elementwise kernels (vectorized), as eltwise_ns_per_kelem;
                                      * 0: eltwise_ns_per_kelem */
    double attn64_tflops; /* attention at head size 64 (the video VAE decoder's), 4·S²·inner FLOP; 0: attn_tflops */
} h3_device_figures;
/* The DiT blocks' attention (--attention): AUTO picks (h3_attention_resolve), BF16 the exact kernel (f32 on the
 * host), FP8 int8 q, k and e4m3 P·V (H3_ATTN_FP8), INT8 int8 q, k and f16 P·V (H3_ATTN_INT8), SPARSE block-sparse
 * attention in its window of steps (H3_ATTN_SPARSE, h3_dit_set_sparse). */
typedef enum {
    H3_ATTN_MODE_AUTO = 0,
    H3_ATTN_MODE_BF16,
    H3_ATTN_MODE_FP8,
    H3_ATTN_MODE_INT8,
    H3_ATTN_MODE_SPARSE
} h3_attn_mode;
/* "auto", "bf16", "fp8", "int8", "sparse" into *out; H3_ERR_INVALID naming the choices for anything else. */
h3_status h3_attn_mode_parse(const char *s, h3_attn_mode *out);
/* --attention sparse's rule (--sparse TAU[,START,END]): Sol-Attn's threshold (a key tile is exact when its centroid
 * score passes mean + tau·std) and the window of the schedule's unshifted progress it runs in (ComfyUI's start and
 * end percent, as fractions); outside it, and under H3_DIT_SPARSE_MIN_ROWS rows, the blocks stay dense. */
typedef struct {
    float tau, start, end;
} h3_sparse_rule;
#define H3_SPARSE_RULE_DEFAULT {H3_DIT_SPARSE_TAU, H3_DIT_SPARSE_T0, H3_DIT_SPARSE_T1}
/* "TAU" or "TAU,START,END" into *out (START, END default to H3_DIT_SPARSE_T0, _T1); H3_ERR_INVALID naming the
 * rule for anything else: tau finite in [-10, 10], 0 <= START < END <= 1. */
h3_status h3_sparse_rule_parse(const char *s, h3_sparse_rule *out);
/* Whether rule r holds those bounds and may go with attention mode (only SPARSE takes a rule); H3_ERR_INVALID. */
h3_status h3_sparse_rule_fits(const h3_sparse_rule *r, h3_attn_mode mode);
/* --sparse as the commands take it: the rule s parsed into *out; with no --attention given (mode_given 0) it makes
 * *mode SPARSE, else *mode must be SPARSE (h3_sparse_rule_fits). */
h3_status h3_sparse_rule_take(const char *s, int mode_given, h3_attn_mode *mode, h3_sparse_rule *out);
/* The attention a DiT stage runs: mode as asked; on_cuda: the stage runs on a GPU, kernels: the low-bit kernels
 * that GPU runs (h3_cuda_lowbit_attention's H3_CUDA_ATTN_* bits), all at head size 128 only; fp8_weights: the
 * blocks' GEMM weights are e4m3 (h3_dit_blocks_fp8); rows: the packed sequence. AUTO takes fp8 only where the user
 * already chose fp8 precision for the blocks, on a GPU with Hopper's fp8 kernel (the one measured against the
 * release), at 8,192 rows or more (where attention is a large share of the step); bf16 elsewhere (the mma.sync fp8
 * and int8 kernels are asked for by name). An explicit fp8 or int8 on a GPU without the kernel is an error
 * (H3_ERR_UNSUPPORTED) naming the fix; on the host it runs the reference. SPARSE is never picked by AUTO (its effect
 * on a trained model's output is unmeasured) and needs H3_CUDA_ATTN_SPARSE on a GPU; sparse: its rule (NULL:
 * H3_SPARSE_RULE_DEFAULT), which why states. *flags gets 0, H3_ATTN_FP8, H3_ATTN_INT8 or H3_ATTN_SPARSE; why
 * (why_len bytes) says what was picked and why. */
h3_status h3_attention_resolve(h3_attn_mode mode, int on_cuda, unsigned kernels, int64_t head_dim, int fp8_weights,
                               int64_t rows, const h3_sparse_rule *sparse, unsigned *flags, char *why,
                               size_t why_len);

/* Fills the figures of a named device ("h200"); 0 when unknown. */
int h3_device_figures_find(const char *name, h3_device_figures *out);
/* The names known, comma-separated. */
const char *h3_device_figures_names(void);
/* Picks figures for a device by its CUDA name ("NVIDIA H200" -> h200); 0 when none match. */
int h3_device_figures_for(const char *cuda_name, h3_device_figures *out);

typedef struct h3_plan_request {
    int64_t frames, width, height; /* 17n+5 frames; multiples of 32 */
    int64_t text_tokens;           /* prompt length after tokenizing (128 in BENCH.md) */
    int n_timesteps;               /* distinct timesteps the run keeps modulation for (t2va: 2 per step) */
    int steps;                     /* model calls, for the DiT stage's predicted time (0: per step only) */
    /* two-pass refine (--refine): a second DiT stage at the refine canvas, whose latents the VAEs decode;
     * refine_width 0: one pass */
    int64_t refine_width, refine_height;
    int refine_timesteps; /* distinct timesteps of the refine pass's calls (its modulation kept) */
    int refine_steps;     /* its model calls */
    int keyframes; /* images the video VAE encoder encodes at the (first pass's) canvas before the DiT runs
                    * (fl2va keyframes), one at a time; 0: none (t2va) */
    int64_t window_frames; /* a long clip (pipeline/window.h): the DiT runs on windows of this many frames (17n+5),
                            * `steps` calls each; the VAEs decode all frames; 0 or >= frames: one window */
    /* ref2va: the references' rows in the DiT's sequence (video rows held at 0.999, audio rows clean), and the
     * largest reference the video VAE's encoder encodes (frames x height x width; 0: none) */
    int64_t ref_video_rows, ref_audio_rows;
    int64_t ref_enc_frames, ref_enc_height, ref_enc_width;
    int64_t aenc_samples; /* the longest sound the audio VAE's encoder encodes (samples a channel; 0: none) */
    /* the DiT split over this many GPUs (sequence parallel, h3_dit_forward_sp: each GPU holds every weight, runs
     * its share of the rows and the attention of its share of the heads); 0 or 1: one GPU. Every GPU gets the
     * device budget (or its own, h3_plan_budgets.vram_gpu) and an equal share of the host budget (each process
     * pins its own streamed blocks); the other stages run on the first GPU. */
    int gpus;
} h3_plan_request;

typedef struct h3_plan_budgets {
    int64_t vram, ram; /* bytes; ram 0: not limited (planning without a host budget) */
    int64_t vram_gpu[H3_PLAN_MAX_GPUS]; /* a split DiT (h3_plan_request.gpus): GPU i's device budget; 0: vram */
} h3_plan_budgets;

/* What the planner reads from the opened components (headers only). Absent components are NULL. */
typedef struct h3_plan_model {
    const h3_dit *dit;       /* opened with act_place DEVICE (bf16 activations), any weight place */
    int dit_weights_pinned;  /* the DiT's weights already sit in pinned host memory (benchmarks): no staging,
                              * and the host budget does not hold a second copy */
    int dit_weights_in_file; /* the block weights can be read back from their files (pread) */
    const h3_text_encoder *te;
    const h3_video_vae *vvae;
    const h3_audio_vae *avae;
    const h3_video_enc_config *venc; /* the video VAE's encoder, for requests with keyframes; NULL: none */
    const h3_audio_enc_config *aenc; /* the audio VAE's encoder, for requests with sounds to encode (a
                                      * soundtrack, sound references); NULL: none */
    int64_t te_vision_bytes; /* keyframes: the vision tower's device bytes for their images (h3_vision_device_bytes);
                              * it runs first in the text encoder's stage and gives them back, so the stage's
                              * device peak is the larger of the two; 0: none */
    int64_t vvae_weight_bytes,
        avae_weight_bytes; /* the VAEs' files, as stored (h3_plan_weight_bytes); the text
                            * encoder's layers are asked for their own packed sizes */
    int host_threads;      /* CPU threads the host stages use (the video VAE's scratch depends on it) */
    /* the share of each component's files in the page cache now (h3_plan_cached_fraction): their reads are
     * timed at the figures' cache rate for that share, the disk's for the rest; 0: all from the disk */
    double dit_cached, te_cached, avae_cached, vvae_cached;
} h3_plan_model;

/* Bytes of every tensor of the safetensors set (file, index or folder) a component was opened from. */
h3_status h3_plan_weight_bytes(const char *set_path, int64_t *bytes);
/* The share (0..1) of the bytes of the files of that set that sit in the page cache; 0 when it cannot be told
 * (h3_fd_cached_bytes) or the set cannot be opened. */
double h3_plan_cached_fraction(const char *set_path);
/* The same for a set already open (h3_dit_files, h3_text_encoder_files). */
double h3_plan_set_cached_fraction(const h3_st_set *set);

/* The DiT stage. */
typedef struct h3_dit_plan {
    int present, fits;
    int64_t S, L, Nv, Na;
    int64_t chunk_rows;
    int n_units, n_slots, n_resident, n_pinned, n_disk;
    uint8_t tier[H3_PLAN_MAX_UNITS];
    int64_t unit_bytes;  /* the largest unit, packed */
    int64_t adaln_bytes; /* one block's AdaLN projection, packed */
    int64_t slot_bytes;
    /* device, by category (each allocation rounded to the arena's granule) */
    int64_t dev_backend, dev_globals, dev_resident, dev_slots, dev_modulation;
    int64_t dev_workspace, dev_io,
        dev_scratch; /* forward: kept buffers, caller's tensors, transient scratch */
    unsigned attention; /* the blocks' attention flags (h3_dit_attention: 0 or H3_ATTN_FP8) as planned */
    int64_t dev_precompute_scratch;
    int64_t dev_lora; /* a LoRA's side factors (every slot counted) and scratch, or its merge's scratch */
    int64_t dev_peak_forward, dev_peak_precompute, dev_peak;
    /* host */
    int64_t host_pinned, host_staging, host_other, host_peak;
    /* per step */
    int64_t streamed_bytes, disk_bytes;
    /* time (seconds; from the figures) */
    double t_step, t_resident, t_compute, t_copy, t_read;
    double t_step_slow; /* the step if copies and reads ran 25% slower than the figures: plans are ranked by
                         * it, so a plan that only hides its copies on paper loses to one with slack */
    double t_modulation, t_load; /* once per run */
    /* a split DiT (h3_plan_request.gpus > 1): this GPU's place in it; gpus 1 for the whole DiT */
    int gpus, rank;
    int64_t row0, rows;   /* its rows of the packed sequence through the blocks: [row0, row0 + rows) */
    int64_t dev_exchange; /* the Ulysses send and receive buffers (h3_dit_forward_mem.exchange) */
    double t_exchange;    /* seconds a step in the exchanges (inside t_compute; 0 when not timed) */
    int64_t exchange_bytes; /* bytes this GPU receives a step */
} h3_dit_plan;

/* A stage other than the DiT (text encoder, audio VAE, video VAE): where it runs and what it takes. */
typedef struct h3_stage_plan {
    int present;
    int on_device; /* runs on the device; else on the host, and `reason` says why */
    int fits;      /* the place it got holds it: the device budget (peak + slack), or the host budget */
    int64_t weight_bytes; /* weight bytes it reads from its files per run, as stored (the layers it runs) */
    int64_t dev_peak;     /* device bytes at its peak, the backend's workspace included; 0 on the host */
    int64_t dev_need; /* the device bytes it takes there (also when it runs on the host); 0: no device plan */
    int64_t host_peak; /* host bytes it holds at its peak: activations, scratch, owned and pinned weight
                        * copies (mapped files are the page cache's) */
    int n_units,
        n_resident; /* weight units (layers, blocks) and how many stay on the device; the rest stream */
    double t_load,
        t_run;             /* predicted seconds on the device figures: reading and placing weights before it
                            * computes, and computing (streamed copies hidden where they can be); 0 on the host */
    char detail[320];      /* the placement in words */
    char reason[400];      /* on the host: why not on the device */
    h3_video_vae_mem vvae; /* video VAE: the decoder's own plan at its place (h3_video_vae_plan) */
    h3_audio_vae_mem avae; /* audio VAE: its decode memory (h3_audio_vae_decode_peak) */
    h3_video_enc_mem venc; /* video VAE encoder: its encode memory at its place (h3_video_enc_mem_of) */
    h3_audio_enc_mem aenc; /* audio VAE encoder: its device memory (h3_audio_enc_mem_of) */
} h3_stage_plan;

typedef struct h3_plan {
    h3_plan_request req;
    h3_plan_budgets budgets;
    h3_device_figures fig;
    int have_time; /* figures named or detected: times are predictions for that device */
    double
        cached[4]; /* the model's dit_cached, te_cached, avae_cached, vvae_cached the times were made with */
    h3_dit_plan dit;
    h3_dit_plan dit_refine; /* the refine pass's DiT stage (present only with a refine canvas): the longer
                             * sequence, planned on its own within the same budgets */
    /* a split DiT (req.gpus > 1): each GPU's plan of the first pass and of the refine pass; dit and dit_refine
     * are then the copies of the slowest GPU's (the one every block waits for) */
    h3_dit_plan dit_gpu[H3_PLAN_MAX_GPUS], dit_refine_gpu[H3_PLAN_MAX_GPUS];
    h3_stage_plan te, vvae, avae;
    /* a split DiT's video decode: over how many GPUs (1: the first alone; req.gpus when every GPU's decoder
     * fits its budget, vvae.t_run then the first GPU's share and the canvases it gathers) */
    int vvae_gpus;
    h3_stage_plan venc; /* the keyframes' encode (present only when the request has keyframes) */
    h3_stage_plan aenc; /* the sounds' encode (present only when the request has a soundtrack or sound references) */
    int fits;           /* every stage fits the same budgets */
    /* when it does not fit */
    int64_t min_vram, min_ram;     /* the smallest budgets that fit this request */
    int64_t fit_frames;            /* the most frames (17n+5) that fit the budgets at this canvas; 0: none */
    int64_t fit_width, fit_height; /* the largest canvas (same aspect, multiples of 32) that fits; 0: none */
    int fits_8bit;                 /* an 8-bit DiT file (int8/fp8 block weights) would fit */
    int fit_steps;  /* the most sampling steps (2 kept timesteps each) that fit; 0: none, or not fewer */
    char why[1536]; /* the message: which stage and budget is short, by how much, what would fit */
} h3_plan;

/* Plans the stages the model holds. fig NULL: no time predictions (the choices use the h200 figures for
 * ranking). H3_ERR_INVALID for an impossible request (frames not 17n+5, canvas not multiples of 32); a plan
 * that does not fit is still H3_OK with fits = 0 and `why` filled. */
h3_status h3_plan_make(const h3_plan_model *m, const h3_plan_request *r, const h3_plan_budgets *b,
                       const h3_device_figures *fig, h3_plan *out);
/* Each stage on its own, from the model's own memory function: what h3_plan_make does for every stage of a
 * request, and what `h3run encode`, `dit` and `decode` plan their one stage with. b->vram 0: no device (the
 * host). fig NULL: no time predictions (t_load and t_run are the h200's, for ranking only). */
/* The text encoder up to hidden_states[layer] of n_tokens: on the device, its layers streamed from the files
 * through two slots (h3_text_encoder_device_bytes), when that fits; the bytes read per prompt are its layers'
 * packed sizes. */
h3_status h3_plan_text_encoder(const h3_text_encoder *te, int64_t n_tokens, int layer,
                               const h3_plan_budgets *b, const h3_device_figures *fig, h3_stage_plan *out);
/* Predicted seconds of a decode placed as m says (h3_video_vae_plan's), loads not counted: every block's GEMMs,
 * attention and elementwise work per pass at f's rates, a streamed block's copy where it outlasts them. */
double h3_plan_video_vae_seconds(const h3_video_vae_config *c, const h3_video_vae_mem *m, const h3_device_figures *f);
/* The video VAE decoding latents [C, T, H, W]: on the device (h3_video_vae_plan: tiles per pass, resident and
 * streamed blocks) when some plan fits the budget, else on the host (h3_video_vae_decode_peak with
 * host_threads). weight_bytes: its file's bytes (h3_plan_weight_bytes). */
h3_status h3_plan_video_vae(const h3_video_vae *v, int64_t T, int64_t H, int64_t W, int64_t weight_bytes,
                            int host_threads, const h3_plan_budgets *b, const h3_device_figures *fig,
                            h3_stage_plan *out);
/* The video VAE encoder on `images` images (or a clip: frames > 1) of H × W pixels, one at a time: on the
 * device (h3_video_enc_mem_of: the weights resident as f32, a tile's activations) when that fits the budget,
 * else on the host (its activations, a tile of a chunk at a time; the weights are the mapped file). No time
 * is predicted (t_load and t_run 0): the planner's table has no rate for the encoder's convolutions (bench/NOTES.md
 * "ref2va at release size, measured" has the H200's). */
h3_status h3_plan_video_encoder(const h3_video_enc_config *c, int64_t frames, int64_t H, int64_t W,
                                int images, const h3_plan_budgets *b, h3_stage_plan *out);
/* The audio VAE's encoder on `samples` samples a channel: its convolution stack on the device
 * (h3_audio_enc_mem_of and the backend's workspace) when that fits the budget, else on the host. */
h3_status h3_plan_audio_encoder(const h3_audio_enc_config *e, int64_t samples, const h3_plan_budgets *b, h3_stage_plan *out);
/* The audio VAE decoding `channels` × T latents: on the device (h3_audio_vae_decode_peak's dev_* bytes and
 * the backend's workspace) when that fits, else on the host. */
h3_status h3_plan_audio_vae(const h3_audio_vae *v, int64_t T, int64_t channels, int64_t weight_bytes,
                            const h3_plan_budgets *b, const h3_device_figures *fig, h3_stage_plan *out);
/* The DiT for a packed sequence of S rows (L text, Nv video, Na audio) with n_timesteps of kept modulation:
 * the best placement at these budgets. H3_OK with out->fits 0 when none fits (out then holds the plan that
 * takes the least device memory). */
h3_status h3_plan_dit(const h3_plan_model *m, int64_t S, int64_t L, int64_t Nv, int64_t Na, int n_timesteps,
                      const h3_plan_budgets *b, const h3_device_figures *fig, h3_dit_plan *out);
/* The DiT stage's predicted seconds: loading, the modulation pass and `steps` model calls. */
double h3_dit_plan_seconds(const h3_dit_plan *p, int steps);

/* The DiT plan's placement, for h3_dit_stream_open (points into p). */
void h3_dit_plan_placement(const h3_dit_plan *p, h3_dit_placement *out);
/* The plan's device bytes by report category, and the peak (for h3_memrep_set_predicted). */
void h3_dit_plan_predicted(const h3_dit_plan *p, int64_t pred[H3_DEVCAT_COUNT], int64_t *peak);

/* H3_ERR_BUDGET carrying the plan's message when it does not fit (the stop before loading); H3_OK otherwise.
 */
h3_status h3_plan_check(const h3_plan *p);

/* Keeping the DiT placed between runs (a session, h3run serve): its placement (non-block weights, resident
 * blocks and slots on the device; pinned copies and staging on the host) held while the other stages run.
 * dev and host: the bytes the placement of p holds. */
void h3_dit_plan_kept_bytes(const h3_dit_plan *p, int64_t *dev, int64_t *host);
/* Whether the stages of the plan that run before the DiT's (before 1: the text encoder, the keyframes'
 * encoder) or after it (before 0: the VAEs) fit beside a placement of dev device and host host bytes held
 * kept: each device stage's peak plus dev (and the quantized GEMMs' scratch, which the arena may leave between
 * them) within the device budget, each stage's host peak plus host within the host budget. 0 with why (may
 * be NULL) naming the first that does not. */
int h3_plan_fits_beside_dit(const h3_plan *p, int before, int64_t dev, int64_t host, char *why, size_t n);
/* The plan for people, several lines (h3_malloc'd; h3_free it). NULL when out of memory. */
char *h3_plan_format(const h3_plan *p);

/* The text encoder's activation bytes for n tokens on the host (f32), as h3_text_encoder_encode allocates
 * them: the output [n, C] plus its layer workspace with MLP chunks of chunk_rows (0: 512). */
int64_t h3_plan_te_activation_bytes(const h3_te_config *c, int64_t n, int64_t chunk_rows);

/* The step-time simulation, exposed for tests: units in execution order with their compute seconds, tier and
 * copy/read seconds; k ring slots; staging buffers. Returns the steady-state seconds of one step. */
typedef struct h3_sim_unit {
    double compute, copy, read;
    h3_tier tier;
} h3_sim_unit;
double h3_plan_simulate(const h3_sim_unit *u, int n, int k, int n_staging, double *copy_busy,
                        double *read_busy);

#endif

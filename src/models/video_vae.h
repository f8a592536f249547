/* The MiniMax-H3 video VAE decoder ("f16t4d24", H3-FACTS §3): latents from the DiT -> RGB frames.
 *
 * Latents [C=24, T, H, W], normalized as the DiT produces them, are de-normalized per channel
 * (latents_mean/std), then decoded in temporal chunks that mirror the encoder's 17-frame clips (5 latent
 * frames per chunk plus 2 of look-ahead, 3 pre-padding frames dropped, a 5-frame linear cross-fade between
 * chunks) and, inside a chunk, in spatial tiles of 256 px with at least 64 px of overlap, linearly blended:
 * exactly what diffusers' AutoencoderKLMiniMaxH3 does with tiling on (its default, and what the released
 * frames were made with). Each tile runs the ViT decoder: post-quant 1×1×1 conv, a linear to 2048 per latent
 * voxel, 4 register tokens and one zero token, 36 pre-RMSNorm blocks (QKV with bias, per-head RMSNorm of q
 * and k, 3-axis RoPE θ = 100 on 48 of 64 channels, SwiGLU with biases, per-block residual scales), LayerNorm,
 * and a linear to 4 frames × 16 × 16 pixels.
 *
 * Memory does not grow with the number of frames: the decoder holds one chunk's canvas, the 5 frames it
 * cross-fades into the next chunk, the pixels of one tile and the activations of a pass (a batch of a chunk's
 * tiles that run through the blocks together, so the GEMMs see tiles × tokens rows), and hands finished
 * frames to the caller chunk by chunk. h3_video_vae_plan computes that memory from the same arithmetic the
 * decoder allocates with.
 *
 * Where it runs (h3_video_vae_place): on the CPU from the file, weights in their stored dtype and f32
 * activations (the default); or on a device, weights converted to bf16 there (norm weights, residual scales,
 * register tokens and the input projections in f32), bf16 GEMM operands around an f32 residual stream, the
 * blocks resident or streamed through a slot as the device budget allows. The weights are units
 * (mem/units.h): one per ViT block and one for the input and output layers, acquired and released by the
 * decode, converted on arrival where placed. Files: official   FL2VA/video_vae/ (config.json +
 * source/config.json + source/model.safetensors), or FL2VA/ itself diffusers  vae/ (config.json +
 * diffusion_pytorch_model*.safetensors), or the model root holding vae/ ComfyUI
 * minimax_h3_video_vae_fp16.safetensors: official tensor names, no config. Latents mean/std, tiling and clip
 * geometry come from the file's "minimax_h3_video_vae" metadata when present, else from built-in defaults
 * equal to the released video_vae/config.json (ComfyUI builds in the same values); heads default to
 * hidden/64.
 */
#ifndef H3_MODELS_VIDEO_VAE_H
#define H3_MODELS_VIDEO_VAE_H

#include "io/detect.h"
#include "tensor/ops.h"

#define H3_VVAE_MAX_CHANNELS 64
#define H3_VVAE_MAX_TILES    256 /* per axis */
#define H3_VVAE_MAX_LEVELS   16  /* encoder levels */

typedef struct h3_video_vae_config {
    int latent_channels;     /* 24 */
    int out_channels;        /* 3 */
    int patch_size;          /* 16: pixels per latent along height and width */
    int patch_size_t;        /* 4: frames per latent frame */
    int num_layers;          /* 36 */
    int heads, head_dim;     /* 32 × 64 */
    int num_register_tokens; /* 4 */
    int ffn_inner;           /* 8192 (hidden × 4) */
    int rope_dim;            /* 48: rotated channels of each head (head_dim × 0.75) */
    float rope_theta;        /* 100 */
    float norm_eps;          /* 1e-5 */
    int clip_length;         /* 17: pixel frames per encoder clip */
    int token_drop;          /* 3 */
    int tile_size;           /* 256 px; 0 decodes each chunk whole */
    int tile_overlap_min;    /* 64 px */
    float latents_mean[H3_VVAE_MAX_CHANNELS], latents_std[H3_VVAE_MAX_CHANNELS];
    /* storage, which sets the decode's scratch needs */
    h3_dtype weight_dtype; /* dtype of the block matrices */
    int fused_qkv; /* 1: one [3·H·D, hidden] QKV per block (official, ComfyUI); 0: three (diffusers) */
    /* the encoder's geometry (models/video_vae_enc.h reads its channels and depth from the tensors) */
    int enc_levels;                     /* 6: entries of space_down / time_down */
    int space_down[H3_VVAE_MAX_LEVELS]; /* [2,2,2,2,1,1] */
    int time_down[H3_VVAE_MAX_LEVELS];  /* [1,2,2,1,1,1] */
    int enc_groups;                     /* 32: GroupNorm groups */
    float enc_eps;                      /* 1e-6 */
} h3_video_vae_config;

/* The released decoder, f32 official layout. */
void h3_video_vae_default_config(h3_video_vae_config *c);

typedef struct h3_video_vae_opts {
    int tile_size, tile_overlap_min; /* pixels; 0 keeps the file's (or the released 256 / 64) */
    int no_tiling;                   /* decode every chunk whole: not what the release does */
    int heads;         /* attention heads for files without a config (ComfyUI); 0: hidden / 64 */
    int rows_per_step; /* rows per FFN / output-projection step; 0: 512 */
} h3_video_vae_opts;

typedef struct h3_video_vae h3_video_vae;

/* Opens a video VAE (see the layouts above): reads headers and configs and binds every weight (views of the
 * mapped file; nothing else is read but the residual scales of files that store them in f16, converted to
 * f32). */
h3_status h3_video_vae_open(const char *path, const h3_video_vae_opts *opts, h3_video_vae **out);
void h3_video_vae_close(h3_video_vae *v);
const h3_video_vae_config *h3_video_vae_get_config(const h3_video_vae *v);
h3_layout h3_video_vae_layout(const h3_video_vae *v);
/* Where the weights were read from (the file or set opened). */
const char *h3_video_vae_source(const h3_video_vae *v);
struct h3_wbind;
/* The binder over the opened weight files (the encoder binds its tensors through it); NULL for a decoder made
 * by h3_video_vae_create. Valid while v is open. */
const struct h3_wbind *h3_video_vae_binder(const h3_video_vae *v);

/* Pixel frames decoded from T latent frames: 5n+2 -> 17n+5 (the diffusers geometry for T >= 3; T = 2 -> 5 and
 * T = 1 -> 1 as ComfyUI decodes them). 0 when T < 1. */
int64_t h3_video_vae_num_frames(const h3_video_vae_config *c, int64_t latent_frames);

/* The tiles over `len` pixels (diffusers' _split_tiles, for the decoder and the encoder alike): the fewest
 * `tile`-pixel tiles whose overlaps are all at least min_ov, the slack spread over the overlaps round-robin
 * in steps of `ratio` pixels. *n_out tiles starting at starts[i], overlaps ov[i] (n_out − 1 of them), each
 * *tlen long; tile <= 0 or tile >= len: one tile of len. At most H3_VVAE_MAX_TILES (else H3_ERR_INVALID). */
h3_status h3_video_vae_split_tiles(int64_t len, int64_t tile, int64_t min_ov, int64_t ratio, int *n_out,
                                   int64_t *starts, int64_t *ov, int64_t *tlen);

/* Checks latents [C, T, H, W] or [1, C, T, H, W] (f32, contiguous) against the config: channel count, even
 * height and width (H3 canvases are multiples of 32 px), sizes. The message says what would be right. */
h3_status h3_video_vae_check_latents(const h3_video_vae_config *c, const h3_tensor *latents);

/* The ImageNet statistics of the VAE's pixel space: unit-range RGB = raw · std + mean, clamped to [0, 1]. */
extern const float h3_imagenet_mean[3], h3_imagenet_std[3];

typedef enum h3_pixel_range {
    H3_PIXELS_RAW = 0, /* as diffusers' AutoencoderKLMiniMaxH3.decode returns them (ImageNet-normalized) */
    H3_PIXELS_UNIT,    /* RGB in [0, 1]: × ImageNet std + mean, clamped (what the pipeline shows) */
} h3_pixel_range;

/* Receives frames [out_channels, n, H·16, W·16] f32 on the host, frames first_frame .. first_frame+n-1, in
 * order. The tensor is a view valid during the call only; its channel stride may exceed n·H·W (use
 * frames->stride[0]). Returning an error stops the decode with it. */
typedef h3_status (*h3_video_frames_fn)(void *user, const h3_tensor *frames, int64_t first_frame);

typedef struct h3_video_decode_out {
    h3_pixel_range range;
    h3_video_frames_fn on_frames; /* frames chunk by chunk; or */
    void *user;
    h3_tensor
        *frames; /* the whole video: f32 [oc, F, H·16, W·16] or [1, oc, F, ...], allocated by the caller */
} h3_video_decode_out;

h3_status h3_video_vae_decode(h3_video_vae *v, h3_exec *ex, const h3_tensor *latents,
                              const h3_video_decode_out *out);
struct h3_comm;
/* The decode split over the ranks of a group (tensor/comm.h; one rank a GPU, each with this decoder placed
 * for the same latents): chunk i is decoded by rank i mod n, the ranks' chunks of a round at once; each other
 * rank's raw canvas goes to rank 0, which cross-fades every chunk into the last and hands out every frame, as
 * h3_video_vae_decode does (out is rank 0's; the others hand out nothing and may pass NULL). No rank
 * allocates more than an unsplit decode: rank 0 takes a canvas into its own once it has handed its last one
 * out. The frames equal the unsplit decode's when the ranks compute alike (a canvas moves as bytes). A rank
 * that fails stops the group (comm->abort). comm NULL or of one rank: h3_video_vae_decode. */
h3_status h3_video_vae_decode_split(h3_video_vae *v, h3_exec *ex, const h3_tensor *latents,
                                    const h3_video_decode_out *out, struct h3_comm *comm);

/* How decodes run (h3_video_vae_plan chooses the rest, h3_video_vae_place makes it so). */
typedef struct h3_video_vae_run {
    h3_place place;       /* H3_PLACE_HOST: the CPU (an unplaced decoder's); H3_PLACE_DEVICE: the GPU */
    int packed;           /* host only: weights packed, converted and streamed as on the device (tests) */
    int threads;          /* CPU threads (the host ops' scratch) */
    int tile_batch;       /* tiles per pass; 0: 1 on the host, on a device the most that fit the budget */
    int rows_per_step;    /* FFN and output-projection rows per step; 0: the open option (512) on the host,
                           * on a device the largest that fits */
    int64_t vram_budget;  /* device (and packed host): every byte the stage takes, the backend's 32 MiB
                           * included; 0: not limited */
    int64_t ram_budget;   /* pinned host bytes for copies of streamed blocks (the rest are read from the
                           * file per use); 0: not limited */
    int stream_blocks;    /* tests: at least this many blocks stream even when more would fit */
    uint64_t random_seed; /* nonzero: the weights are random values made at the place, not read (benchmarks;
                           * the only way a decoder from h3_video_vae_create gets weights) */
} h3_video_vae_run;

/* The memory a decode of latents [C, T, H, W] takes, from the chunk and tile plan the decoder itself uses,
 * and the run's choices. Host: bytes beyond the weights and the caller's tensors. Device: every device byte
 * the stage holds (each allocation rounded to the arena's granule), by category, as h3_cuda_mem_stats
 * measures them. */
typedef struct h3_video_vae_mem {
    int64_t chunk_buffers; /* canvas, cross-fade frames, a tile's pixels, blend strips and tables, the plan */
    int64_t vit;           /* a pass's ViT activations, tables and indices */
    int64_t op_scratch;    /* host: the largest scratch an op takes meanwhile (GEMM panels, attention) */
    int64_t total;         /* host decodes: all of the above; device decodes: the host memory they take */
    int chunks, tiles_y, tiles_x;
    int64_t frames, tokens_per_tile;
    int64_t canvas_bytes; /* one chunk's raw canvas (f32 frames and look-ahead): a split decode's gather */
    /* the run */
    h3_place place;
    int packed;
    int64_t H, W;                      /* latent height and width the plan (and a placement) is for */
    int tile_batch, passes;            /* tiles per pass, passes per chunk */
    int64_t rows_per_step;             /* FFN and output-projection rows per step */
    int n_blocks, n_resident, n_slots; /* blocks resident at the place; the rest stream through n_slots */
    int n_pinned, n_disk; /* streamed blocks copied from pinned host memory / read from the file per use */
    int64_t block_bytes;  /* one block as placed (bf16 matrices and biases, f32 vectors), packed */
    int64_t stored_bytes; /* one block as stored (a slot's size) */
    /* device bytes (packed host runs: the same at the host place), h3_units_mem_of's arithmetic */
    int64_t dev_backend;  /* the backend's workspace, reserved at h3_cuda_init */
    int64_t dev_weights;  /* the input and output layers and the resident blocks, as placed */
    int64_t dev_load;     /* the load buffer a converting tensor passes through (during h3_video_vae_place) */
    int64_t dev_slots;    /* the slots and the work block streamed blocks are converted into */
    int64_t dev_arena;    /* a decode's buffers: activations, tables, canvas (one allocation) */
    int64_t dev_peak;     /* the most held at once: max(while loading, while decoding) */
    int64_t host_pinned;  /* pinned copies of streamed blocks, their staging, the random weights' sources,
                           * the frames handed out */
    int64_t budget;       /* the vram budget it was planned for (0: not limited) */
    int64_t budget_slack; /* kept free of the budget (the arena's granules and holes) */
    int64_t ram_budget;
    uint64_t random_seed;
} h3_video_vae_mem;

/* Plans a decode of latents [C, T, H, W] for run (NULL: on the host as opened). On a device (or packed host)
 * it picks the tile batch, the FFN row step and how many blocks stay resident: the fastest choice whose peak
 * fits the budget by the decoder's own allocation arithmetic. H3_ERR_BUDGET when nothing fits, saying by how
 * much. */
h3_status h3_video_vae_plan(const h3_video_vae *v, int64_t T, int64_t H, int64_t W,
                            const h3_video_vae_run *run, h3_video_vae_mem *out);
/* Host memory of a CPU decode (h3_video_vae_plan with run->place HOST from a config alone): tile batch 1. */
h3_status h3_video_vae_decode_peak(const h3_video_vae_config *c, int64_t T, int64_t H, int64_t W, int threads,
                                   int rows_per_step, h3_video_vae_mem *out);

struct h3_memrep;
/* Puts the weights where plan says (a plan from h3_video_vae_plan for this decoder): opens the units, which
 * upload and convert the resident blocks and make the pinned copies, slot and work block of the streamed
 * ones. Later decodes run there, on latents of the plan's height and width, in its tile batch and row step,
 * with the arena the plan counted. rep (may be NULL) counts the device allocations by category. A second call
 * replaces the placement. */
h3_status h3_video_vae_place(h3_video_vae *v, h3_exec *ex, const h3_video_vae_mem *plan,
                             struct h3_memrep *rep);
/* Returns everything h3_video_vae_place took; decodes run on the host from the file again. */
void h3_video_vae_unplace(h3_video_vae *v);
/* The placement's plan, or NULL when the decoder is not placed. */
const h3_video_vae_mem *h3_video_vae_placement(const h3_video_vae *v);
/* The predicted device bytes of a plan by memory-report category (h3_devcat order: backend, weights, slots,
 * modulation, activations) and its peak. */
void h3_video_vae_plan_predicted(const h3_video_vae_mem *m, int64_t pred[5], int64_t *peak);

/* A decoder of config c without weight files (benchmarks): it decodes once placed with a random seed. */
h3_status h3_video_vae_create(const h3_video_vae_config *c, h3_video_vae **out);

#endif

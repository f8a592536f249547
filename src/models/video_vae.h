/* The MiniMax-H3 video VAE decoder ("f16t4d24", H3-FACTS §3): latents from the DiT -> RGB frames.
 *
 * Latents [C=24, T, H, W], normalized as the DiT produces them, are de-normalized per channel (latents_mean/std),
 * then decoded in temporal chunks that mirror the encoder's 17-frame clips (5 latent frames per chunk plus 2 of
 * look-ahead, 3 pre-padding frames dropped, a 5-frame linear cross-fade between chunks) and, inside a chunk, in
 * spatial tiles of 256 px with at least 64 px of overlap, linearly blended: exactly what diffusers'
 * AutoencoderKLMiniMaxH3 does with tiling on (its default, and what the released frames were made with). Each tile
 * runs the ViT decoder: post-quant 1×1×1 conv, a linear to 2048 per latent voxel, 4 register tokens and one zero
 * token, 36 pre-RMSNorm blocks (QKV with bias, per-head RMSNorm of q and k, 3-axis RoPE θ = 100 on 48 of 64
 * channels, SwiGLU with biases, per-block residual scales), LayerNorm, and a linear to 4 frames × 16 × 16 pixels.
 *
 * Memory does not grow with the number of frames: the decoder holds one chunk's canvas, the 5 frames it cross-fades
 * into the next chunk, one tile's pixels and activations, and hands finished frames to the caller chunk by chunk.
 * h3_video_vae_decode_peak computes that peak from the same chunk and tile arithmetic the decoder runs.
 *
 * Weights stay in their stored dtype (f32 official and diffusers, f16 ComfyUI) and are reached per block through
 * one acquire/release function; activations are f32. Files:
 *   official   FL2VA/video_vae/ (config.json + source/config.json + source/model.safetensors), or FL2VA/ itself
 *   diffusers  vae/ (config.json + diffusion_pytorch_model*.safetensors), or the model root holding vae/
 *   ComfyUI    minimax_h3_video_vae_fp16.safetensors: official tensor names, no config. Latents mean/std, tiling and
 *              clip geometry come from the file's "minimax_h3_video_vae" metadata when present, else from built-in
 *              defaults equal to the released video_vae/config.json (ComfyUI builds in the same values); heads
 *              default to hidden/64.
 */
#ifndef H3_MODELS_VIDEO_VAE_H
#define H3_MODELS_VIDEO_VAE_H

#include "io/detect.h"
#include "tensor/ops.h"

#define H3_VVAE_MAX_CHANNELS 64
#define H3_VVAE_MAX_TILES 256 /* per axis */

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
    int fused_qkv;         /* 1: one [3·H·D, hidden] QKV per block (official, ComfyUI); 0: three (diffusers) */
} h3_video_vae_config;

/* The released decoder, f32 official layout. */
void h3_video_vae_default_config(h3_video_vae_config *c);

typedef struct h3_video_vae_opts {
    int tile_size, tile_overlap_min; /* pixels; 0 keeps the file's (or the released 256 / 64) */
    int no_tiling;                   /* decode every chunk whole: not what the release does */
    int heads;                       /* attention heads for files without a config (ComfyUI); 0: hidden / 64 */
    int rows_per_step;               /* rows per FFN / output-projection step; 0: 512 */
} h3_video_vae_opts;

typedef struct h3_video_vae h3_video_vae;

/* Opens a video VAE (see the layouts above); reads headers and configs only. */
h3_status h3_video_vae_open(const char *path, const h3_video_vae_opts *opts, h3_video_vae **out);
void h3_video_vae_close(h3_video_vae *v);
const h3_video_vae_config *h3_video_vae_get_config(const h3_video_vae *v);
h3_layout h3_video_vae_layout(const h3_video_vae *v);
/* Where the weights were read from (the file or set opened). */
const char *h3_video_vae_source(const h3_video_vae *v);

/* Pixel frames decoded from T latent frames: 5n+2 -> 17n+5 (the diffusers geometry for T >= 3; T = 2 -> 5 and
 * T = 1 -> 1 as ComfyUI decodes them). 0 when T < 1. */
int64_t h3_video_vae_num_frames(const h3_video_vae_config *c, int64_t latent_frames);

/* Checks latents [C, T, H, W] or [1, C, T, H, W] (f32, contiguous) against the config: channel count, even height
 * and width (H3 canvases are multiples of 32 px), sizes. The message says what would be right. */
h3_status h3_video_vae_check_latents(const h3_video_vae_config *c, const h3_tensor *latents);

/* The ImageNet statistics of the VAE's pixel space: unit-range RGB = raw · std + mean, clamped to [0, 1]. */
extern const float h3_imagenet_mean[3], h3_imagenet_std[3];

typedef enum h3_pixel_range {
    H3_PIXELS_RAW = 0, /* as diffusers' AutoencoderKLMiniMaxH3.decode returns them (ImageNet-normalized) */
    H3_PIXELS_UNIT,    /* RGB in [0, 1]: × ImageNet std + mean, clamped (what the pipeline shows) */
} h3_pixel_range;

/* Receives frames [out_channels, n, H·16, W·16] f32 on the host, frames first_frame .. first_frame+n-1, in order.
 * The tensor is a view valid during the call only; its channel stride may exceed n·H·W (use frames->stride[0]).
 * Returning an error stops the decode with it. */
typedef h3_status (*h3_video_frames_fn)(void *user, const h3_tensor *frames, int64_t first_frame);

typedef struct h3_video_decode_out {
    h3_pixel_range range;
    h3_video_frames_fn on_frames; /* frames chunk by chunk; or */
    void *user;
    h3_tensor *frames; /* the whole video: f32 [oc, F, H·16, W·16] or [1, oc, F, ...], allocated by the caller */
} h3_video_decode_out;

h3_status h3_video_vae_decode(h3_video_vae *v, h3_exec *ex, const h3_tensor *latents, const h3_video_decode_out *out);

/* Host memory a decode of latents [C, T, H, W] takes beyond the weights and the caller's tensors, from the chunk and
 * tile plan the decoder itself uses. */
typedef struct h3_video_vae_mem {
    int64_t chunk_buffers; /* chunk canvas, cross-fade frames, one tile's pixels, blend strips and tables, the plan */
    int64_t vit;           /* one tile's ViT activations, tables and indices */
    int64_t op_scratch;    /* the largest scratch an op takes while those are held (GEMM panels, attention tiles) */
    int64_t block_scratch; /* per-block weight conversions held during a block */
    int64_t total;
    int chunks, tiles_y, tiles_x;
    int64_t frames, tokens_per_tile;
} h3_video_vae_mem;
h3_status h3_video_vae_decode_peak(const h3_video_vae_config *c, int64_t T, int64_t H, int64_t W, int threads,
                                   int rows_per_step, h3_video_vae_mem *out);

#endif

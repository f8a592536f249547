/* The MiniMax-H3 video VAE encoder (H3-FACTS §3): RGB frames -> the posterior of the latents, as diffusers'
 * AutoencoderKLMiniMaxH3.encode computes it with tiling on (its default, and the release's).
 *
 * A causal 3-D CNN: conv_in (3 -> ch[0]), levels of ResNet3d blocks (GroupNorm per frame, SiLU, causal 3×3×3
 * conv, twice, with a 1×1×1 shortcut where the width changes), a strided 3×3×3 downsampler where a level's
 * space or time factor is 2 (space: one reflected pixel right and bottom, stride 2; time: stride 2 over the
 * causal padding), GroupNorm, SiLU, conv_out (-> 2 · latent channels: mean and log-variance) and quant_conv
 * (1×1×1). Every 3×3×3 conv pads space by reflection and time causally (2 zero frames before). Pixels are
 * ImageNet-normalized first: (u8 / 255 − mean) / std.
 *
 * Time: one image (1 frame) goes through the encoder alone (1 latent frame); a clip is cut into 17-frame
 * chunks (clip_length), the last padded by repeating the last frame, each chunk encoded on its own (5 latent
 * frames) and the last token_drop (3) latent frames of the whole dropped: 17n + 5 frames -> 5n + 2 latents.
 * Space: inside a chunk, tiles of tile_size (256) pixels with overlaps of at least tile_overlap_min (64),
 * laid out by h3_video_vae_split_tiles (the decoder's rule), each encoded alone and blended in latent space
 * as diffusers' _stitch_tiles does (a tile's top rows with the raw bottom of the tile above, then its left
 * columns with the raw right edge of the tile to its left, weights k/e).
 *
 * Memory is one tile of one chunk at a time: three activation buffers of the largest tensor the tile makes
 * (the per-frame GroupNorm reads the frames in place), the tile's pixels and moments, and on the host
 * the raw moments of a chunk's tiles for the blend (h3_video_enc_mem_of is that arithmetic). It does not grow
 * with the number of frames beyond the caller's pixels and moments.
 *
 * Weights: the encoder tensors of the video VAE's file (official/ComfyUI `encoder.down.I.block.J`,
 * `nin_shortcut`, `encoder.down.I.downsample.conv`; diffusers `encoder.down_blocks.I.resnets.J`,
 * `conv_shortcut`, `encoder.down_blocks.I.downsamplers.0.conv`; conv_in, norm_out, conv_out, quant_conv),
 * bound through the decoder's binder (io/wbind.h) and reached through units (mem/units.h): one for conv_in,
 * norm_out, conv_out and quant_conv, one per level. On the host they are the file's tensors as opened; on a
 * device every unit is resident as f32 (h3_video_enc_place). Levels, blocks per level and channels are read
 * from the tensors; the down factors, GroupNorm groups and eps come from the config (video_vae.h). */
#ifndef H3_MODELS_VIDEO_VAE_ENC_H
#define H3_MODELS_VIDEO_VAE_ENC_H

#include "io/detect.h"
#include "models/video_vae.h"
#include "tensor/ops.h"

#define H3_VENC_MAX_LAYERS 8 /* ResNet blocks per level */

typedef struct h3_video_enc_config {
    int in_channels;            /* 3 */
    int latent_channels;        /* 24; the encoder makes 2× (mean and log-variance) */
    int levels, layers;         /* 6 levels of 2 blocks */
    int ch[H3_VVAE_MAX_LEVELS]; /* [128, 256, 256, 512, 512, 1024] */
    int space_down[H3_VVAE_MAX_LEVELS], time_down[H3_VVAE_MAX_LEVELS]; /* per level: 1 or 2 */
    int groups;                                                        /* 32 */
    float eps;                                                         /* 1e-6 */
    int spatial_ratio, temporal_ratio;                                 /* 16, 4 */
    int clip_length, token_drop, tile_size, tile_overlap_min;          /* 17, 3, 256, 64 */
    float latents_mean[H3_VVAE_MAX_CHANNELS], latents_std[H3_VVAE_MAX_CHANNELS];
    h3_dtype weight_dtype; /* of the conv weights as stored */
} h3_video_enc_config;

typedef struct h3_video_enc h3_video_enc;

/* Opens the encoder of an opened video VAE (its files, layout and config; v must outlive the encoder).
 * H3_ERR_FORMAT naming the tensor when the file has no encoder or a malformed one. */
h3_status h3_video_enc_open(const h3_video_vae *v, h3_video_enc **out);
/* The same over any binder (wb and its set must outlive the encoder), with the geometry of c (down factors,
 * groups, eps, latent statistics, clip and tile sizes). */
h3_status h3_video_enc_open_set(const struct h3_wbind *wb, h3_layout layout, const h3_video_vae_config *c,
                                h3_video_enc **out);
void h3_video_enc_close(h3_video_enc *e);
const h3_video_enc_config *h3_video_enc_get_config(const h3_video_enc *e);

/* Latent frames of `frames` pixel frames: 1 -> 1, else chunks × latents per chunk − token_drop (17n+5 ->
 * 5n+2); 0 when frames < 1 or nothing is left after the drop. */
int64_t h3_video_enc_latent_frames(const h3_video_enc_config *c, int64_t frames);
/* Pixel frame counts that encode without padding: 1, or whole chunks less the dropped latents' frames
 * (17n + 5 for the release). */
int h3_video_enc_frames_ok(const h3_video_enc_config *c, int64_t frames);

/* Checks pixels: uint8 [1, 3, F, H, W] or [3, F, H, W], contiguous, on the host; F = 1 or 17n+5; H and W
 * multiples of the spatial ratio (16), at least twice it (the reflect padding of the deepest levels needs 2
 * rows) and at most 16384; F at most 65536. The message says what would be right. */
h3_status h3_video_enc_check_pixels(const h3_video_enc_config *c, const h3_tensor *pixels);

/* The memory an encode of F frames of H × W pixels takes at place (the host: f32 activations over the file's
 * weights; a device: the weights resident as f32), from the same arithmetic the encoder allocates with. */
typedef struct h3_video_enc_mem {
    int64_t frames, latent_frames, H, W; /* the request */
    int chunks, clip_frames;             /* chunks and pixel frames per chunk (1 for an image) */
    int tiles_y, tiles_x;
    int64_t tile_h, tile_w; /* pixels */
    int64_t act;            /* three activation buffers */
    int64_t tile_io;        /* a tile's pixels and moments at the place */
    int64_t host_tiles;     /* host: a chunk's raw tile moments and a tile's pixel staging */
    int64_t op_scratch;     /* host: the largest conv3d column chunk (and f32 weight copy) */
    int64_t weights;        /* at a device: the units resident as f32; host: 0 (the file's) */
    int64_t dev_backend;    /* the CUDA backend's own workspace */
    int64_t dev_peak;       /* device: backend + weights + max(a converting file's load buffer,
                             * act + tile_io), granule-rounded */
    int64_t host_total;     /* host bytes beyond the weights and the caller's tensors */
    h3_place place;
} h3_video_enc_mem;
h3_status h3_video_enc_mem_of(const h3_video_enc_config *c, int64_t frames, int64_t H, int64_t W,
                              h3_place place, h3_video_enc_mem *out);

/* Puts the weights at place: H3_PLACE_DEVICE makes every unit resident there as f32 (ex must have a CUDA
 * backend); H3_PLACE_HOST returns to the file's tensors. Encodes then run there. */
h3_status h3_video_enc_place(h3_video_enc *e, h3_exec *ex, h3_place place);

/* Encodes pixels (checked as h3_video_enc_check_pixels says, but any F >= 1: other counts are padded as
 * diffusers pads them) into moments: f32 [2·C, T, H/16, W/16] or [1, 2·C, ...] on the host, allocated by
 * the caller, T = h3_video_enc_latent_frames: channels 0..C-1 the posterior mean, C..2C-1 its log-variance.
 */
h3_status h3_video_enc_encode(h3_video_enc *e, h3_exec *ex, const h3_tensor *pixels, h3_tensor *moments);

/* The latents of moments (host f32 [2C, T, h, w], optionally with a leading 1) into out (f32 [C, T, h, w]
 * or [1, C, ...]): noise NULL: the posterior mean, as it is (what vae-encode writes). Else the sample of
 * diffusers' DiagonalGaussianDistribution with that noise (C·T·h·w normal values in out's order): mean +
 * exp(0.5 · clamp(logvar, −30, 20)) · noise, rounded to float16 and normalized (z − latents_mean) /
 * latents_std, as diffusers' fl2va encode_vae_condition makes the DiT's conditioning latents. */
h3_status h3_video_enc_posterior(const h3_video_enc_config *c, const h3_tensor *moments, const float *noise,
                                 h3_tensor *out);

#endif

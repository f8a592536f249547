/* Qwen3-VL's vision tower and image processor: keyframes into the text encoder's rows (fl2va).
 *
 * The image processor (transformers' Qwen2VLImageProcessor with Qwen3-VL's preprocessor config: patch 16,
 * merge 2, temporal patch 2, mean = std = 0.5, min/max pixels 65536 / 16777216): (h', w') = smart_resize(h,
 * w): multiples of factor = patch·merge (32), Python's round() (half to even) of h/32 and w/32, scaled down
 * (floor) above max_pixels or up (ceil) below min_pixels; an aspect ratio above 200 is refused the RGB8 image
 * resized to w'×h' as torchvision's resize(BICUBIC, antialias=True) of a uint8 tensor (transformers 5's processor:
 * h3_vis_resize_bicubic_tv), x = (f32(v ·
 * (1/255)) − 0.5) / 0.5 per channel (f32) the frame repeated to temporal_patch_size frames, then cut into
 * patches: pixel_values [gh·gw, C·tp·p·p]  rows (bh, bw, mh, mw), columns (c, tp, ph, pw), gh = h'/p, gw =
 * w'/p, row = ((bh·(gw/m) + bw)·m + mh)·m + mw with patch (bh·m + mh, bw·m + mw) image_grid_thw = [1, gh, gw]
 *
 * The ViT (Qwen3VLVisionModel; release: depth 27, hidden 1152, 16 heads of 72, FFN 4304, out 5120):
 *     x = pixel_values · patch_embed.proj.weightᵀ (the Conv3d as a linear over 1536 columns) + bias
 *       + pos(row): the 48×48 learned table bilinearly sampled at linspace(0, 47, gh) × linspace(0, 47, gw)
 *         (fast_pos_embed_interpolate, f32, weights (1−dh)(1−dw), (1−dh)dw, dh(1−dw), dh·dw) in row order
 *     rotary: head_dim D, inv_freq[j] = 10000^(−2j/(D/2)) for j < D/4; row r's angles
 *         [ph·inv_freq, pw·inv_freq] (D/2 values) tabled over cat(angles, angles), rotate-half over all D
 *     per block: x += proj(attn(rope(q), rope(k), v)) with q|k|v = qkv(LN1(x)) (biases), attention within
 *         each image only (non-causal); x += fc2(gelu_tanh(fc1(LN2(x)))); LayerNorm eps 1e-6
 *     after block deepstack_visual_indexes[k]: deep[k] = merger_k(x) with the norm after the 2×2 shuffle
 *     out = merger(x): LN over hidden, rows of 4 consecutive patches joined to [n/4, 4·hidden], fc1, GELU
 *         (erf), fc2 to out_hidden
 *
 * Into the text encoder (Qwen3VLModel.forward): the image pad rows of the prompt take out's rows in order;
 * deep[k] is added to those rows after decoder layer k (transformers' hidden_states[k + 1] is taken before
 * that addition); rotary positions from get_rope_index (h3_vision_rope_index).
 *
 * Weights: the text encoder's files, `model.visual.*` (official) or `visual.*` (ComfyUI repacks); float
 * dtypes only (bf16 as released). Bound through the weight table (io/wbind.h): the stem (patch embedding and
 * position table), each block, each merger is a unit. On the device every unit is resident (1.19 GB in bf16)
 * and activations take the weights' dtype.
 */
#ifndef H3_MODELS_VISION_H
#define H3_MODELS_VISION_H

#include <stdint.h>

#include "models/text_encoder.h"

#define H3_VIS_MAX_DEEP 8

typedef struct h3_vis_config {
    int64_t depth, hidden, intermediate, heads, in_channels;
    int64_t patch, temporal_patch, merge;
    int64_t out_hidden, num_pos;
    int n_deep;
    int64_t deep_idx[H3_VIS_MAX_DEEP];
    int act_tanh; /* block MLP activation: 1 gelu_pytorch_tanh (Qwen3-VL), 0 exact gelu */
    /* the processor (preprocessor_config.json; Qwen3-VL's values) */
    int64_t min_pixels, max_pixels;
    int64_t video_min_pixels, video_max_pixels; /* the video processor's (video_preprocessor_config.json's size:
                                                 * shortest_edge 4096, longest_edge 25165824) */
    float mean[3], std[3];
    /* the prompt's special tokens (config.json's top level) */
    int64_t image_token_id, video_token_id, vision_start_token_id;
} h3_vis_config;

/* Qwen3-VL-32B's vision config and processor. */
void h3_vis_config_default(h3_vis_config *c);

/* ---- the image processor ----------------------------------------------------------------------------------
 */

/* transformers' smart_resize for factor = patch·merge: H3_ERR_INVALID naming the image when a side is < 1 or
 * the aspect ratio is above 200. */
h3_status h3_vis_smart_resize(const h3_vis_config *c, int64_t h, int64_t w, int64_t *oh, int64_t *ow);

/* torchvision's resize(BICUBIC, antialias=True) of a uint8 tensor (transformers 5's Qwen2-VL processor): torch's
 * native uint8 kernel, PIL's algorithm with int16 weights at the largest precision the axis's biggest weight allows
 * (at most 22 bits), two 8-bit passes (width, then height). What the processor uses. */
h3_status h3_vis_resize_bicubic_tv(const uint8_t *src, int w, int h, uint8_t *dst, int ow, int oh);
/* PIL's Image.resize(LANCZOS) (a = 3, the same arithmetic): how diffusers puts fl2va keyframes on the canvas. */
h3_status h3_vis_resize_lanczos(const uint8_t *src, int w, int h, uint8_t *dst, int ow, int oh);

/* One RGB8 image [h, w, 3] to its patches: *grid = {1, gh, gw}; pixels gets an allocated f32 host tensor
 * [gh·gw, 3·tp·p·p] (free with h3_tensor_free). */
h3_status h3_vis_preprocess(const h3_vis_config *c, const uint8_t *rgb, int w, int h, h3_tensor *pixels,
                            int64_t grid[3]);

/* ref2va's reference videos (Qwen3VLVideoProcessor): transformers' video smart_resize of t sampled frames of
 * h x w (t_bar = round(t/2)·2; scaled by sqrt(t·h·w / video_max_pixels) down (floor) when t_bar·h'·w' is above
 * video_max_pixels, up (ceil) below video_min_pixels; multiples of patch·merge), and one merged block of two
 * sampled frames f0, f1 [h, w, 3] resized to ow x oh as h3_vis_preprocess resizes (torchvision's bicubic) and
 * cut into patches with f0 and f1 as the patch's two temporal slots: grid {1, oh/p, ow/p}. A video of T blocks
 * goes to the tower as T such images (its attention and positions are per frame pair either way) and to the
 * prompt as T blocks of <|video_pad|> (Qwen3-VL splits a video's grid into t = 1 blocks behind timestamps). */
h3_status h3_vis_video_smart_resize(const h3_vis_config *c, int64_t t, int64_t h, int64_t w, int64_t *oh,
                                    int64_t *ow);
h3_status h3_vis_preprocess_pair(const h3_vis_config *c, const uint8_t *f0, const uint8_t *f1, int w, int h,
                                 int64_t oh, int64_t ow, h3_tensor *pixels, int64_t grid[3]);

/* ---- positions --------------------------------------------------------------------------------------------
 */

/* transformers' get_rope_index for one prompt: pos [3, n] (t, h, w per row). An image (or a video's frame-pair
 * block) starts at each vision_start token followed by an image (video) token; its t·(h/m)·(w/m) rows from that token on take
 * (t, h, w) + the text position there, text after it continues from the largest position + 1. *n_vis gets the
 * image token count. Refused (H3_ERR_INVALID) when the blocks and grids disagree. */
h3_status h3_vision_rope_index(const h3_vis_config *c, const int32_t *ids, int64_t n,
                               const int64_t (*grid)[3], int n_img, int64_t *pos, int64_t *n_vis);

/* The ViT's rotary tables for grids: cos, sin [N, D] (N = Σ t·h·w), as rot_pos_emb builds them. */
void h3_vision_rope_tables(const h3_vis_config *c, const int64_t (*grid)[3], int n_img, float *cos_out,
                           float *sin_out);

/* fast_pos_embed_interpolate: the position table table [num_pos, hidden] (f32) sampled for the grids, in
 * patch row order: out [N, hidden]. */
void h3_vision_pos_embed(const h3_vis_config *c, const float *table, const int64_t (*grid)[3], int n_img,
                         float *out);

/* ---- the tower --------------------------------------------------------------------------------------------
 */

typedef struct h3_vision h3_vision;

/* The vision tower of an open text encoder (its files; the config beside them or config_path). A file without
 * one is refused naming what it holds. */
h3_status h3_vision_open(h3_text_encoder *te, const char *config_path, h3_vision **out);
void h3_vision_close(h3_vision *v);
const h3_vis_config *h3_vision_config(const h3_vision *v);
const char *h3_vision_describe(const h3_vision *v);

/* The tower on images: pixels [N, 3·tp·p·p] f32 host, grid [n_img][3]; embeds [N/m², out_hidden] and each
 * deep[k] (k < n_deep) the same shape, f32 host tensors the caller allocated. place: where it runs (HOST, or
 * DEVICE with the CUDA backend up: weights resident, activations in the weights' dtype, freed before return).
 */
h3_status h3_vision_forward(h3_vision *v, h3_exec *ex, h3_place place, const h3_tensor *pixels,
                            const int64_t (*grid)[3], int n_img, h3_tensor *embeds, h3_tensor *deep);

/* Device bytes h3_vision_forward takes on the device for these grids: the backend's workspace, the resident
 * weights, the activations and tables. Headers only. */
int64_t h3_vision_device_bytes(const h3_vision *v, const int64_t (*grid)[3], int n_img);

/* hidden_states[layer] of a prompt with images: ids hold the expanded image tokens, pixels/grid what the
 * processor gives. out f32 [n, hidden] at the text encoder's activation place; the tower runs at vis_place.
 */
h3_status h3_vision_encode_prompt(h3_vision *v, h3_text_encoder *te, h3_exec *ex, h3_place vis_place,
                                  const int32_t *ids, int64_t n, const h3_tensor *pixels,
                                  const int64_t (*grid)[3], int n_img, int layer, h3_tensor *out);

#endif

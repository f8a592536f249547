/* The MiniMax-H3 audio VAE decoder (H3-FACTS §4): audio latents from the DiT -> a 32 kHz waveform.
 *
 * Latents [channels, 32, T] (left and right decode as two items of one mono decoder), normalized as the DiT
 * produces them, are de-normalized per channel, projected by dec_in_proj (1×1 conv 32 -> 2048) and decoded by
 * BigVGAN: conv_pre (k7, 2048 -> 1024), then per upsampling stage a transposed conv (rates 5,5,2,2,2,2,2,
 * kernels 9,9,4,4,4,4,4, halving the channels) and the mean of 3 AMP blocks (kernels 3/7/11, dilations
 * 1/3/5), each conv preceded by an anti-aliased SnakeBeta: upsample ×2 (replicate-pad 5, depthwise transposed
 * conv by a 12-tap Kaiser-windowed sinc at stride 2, ×2, cut 15 each side), x + sin²(e^α·x)/(e^β + 1e-9),
 * then low-pass by the same kind of filter at stride 2 (replicate-pad 5 left, 6 right); then activation_post,
 * conv_post (k7 -> 1) and a clamp to [-1, 1]. 800 samples per latent.
 *
 * The resampling filters are the ones the checkpoint stores (every layout stores them, as diffusers and
 * ComfyUI do); when a file lacks them they are computed (h3_audio_kaiser_filter, the same formula).
 * Weight-normalized convolutions (weight_g / weight_v, or parametrizations.weight.original0/1) are folded at
 * open into f32 weights; ComfyUI's file stores them folded. Weights stay f32 (bf16 audio is audibly worse);
 * activations are f32. The three steps of each anti-aliased activation run as one op (h3_op_snake_aa). The
 * decode runs on the host (channels one after the other) or, with act_place DEVICE, on the GPU (the weights
 * resident there as f32, the channels in one batch; docs/VAE.md). The weights are units (mem/units.h): one
 * for dec_in_proj and conv_pre, one per BigVGAN stage, one for activation_post and conv_post, acquired and
 * released by the decode.
 *
 * Files: the official audio_vae/ folder (config.json with latents_mean/std, metadata.json with the
 * constructor arguments, model.safetensors), the diffusers audio_vae/ folder (config.json,
 * diffusion_pytorch_model.safetensors), a model folder holding audio_vae/, or ComfyUI's
 * minimax_h3_audio_vae_fp32.safetensors (latents_mean/std stored as tensors; architecture read from the
 * tensor shapes, the rate of a stage from its kernel: k = 2u − (u mod 2)).
 */
#ifndef H3_MODELS_AUDIO_VAE_H
#define H3_MODELS_AUDIO_VAE_H

#include "io/detect.h"
#include "io/safetensors.h"
#include "tensor/ops.h"

#define H3_AVAE_MAX_CHANNELS 64
#define H3_AVAE_MAX_UPS      12
#define H3_AVAE_MAX_RES      4

typedef struct h3_audio_vae_config {
    int latent_channels; /* 32 */
    int latent_dim;      /* 2048: dec_in_proj's output, conv_pre's input */
    int decoder_dim;     /* 1024: conv_pre's output; stage i has decoder_dim / 2^(i+1) channels */
    int n_up;            /* 7 */
    int rates[H3_AVAE_MAX_UPS], kernels[H3_AVAE_MAX_UPS];
    int n_res;                                       /* 3 AMP blocks per stage */
    int res_kernels[H3_AVAE_MAX_RES];                /* 3, 7, 11 */
    int n_dil;                                       /* 3 */
    int dilations[H3_AVAE_MAX_RES][H3_AVAE_MAX_RES]; /* 1, 3, 5 for each block */
    int filter_taps;                                 /* 12 */
    int sample_rate;                                 /* 32000 */
    int hop;                                         /* samples per latent: the product of the rates, 800 */
    float latents_mean[H3_AVAE_MAX_CHANNELS], latents_std[H3_AVAE_MAX_CHANNELS];
} h3_audio_vae_config;

typedef struct h3_audio_vae_opts {
    int compute_filters; /* use computed Kaiser filters even where the file stores them */
    /* Where a decode keeps its activations: HOST (the default; channels one after the other), or DEVICE: the
     * activations on the GPU with every channel in one batch, and the weights too (made resident as f32 by
     * the first decode, kept until h3_audio_vae_close or a placement back to HOST). Decoding there needs the
     * CUDA backend up (h3_cuda_init); close the decoder before h3_cuda_shutdown. */
    h3_place act_place;
    /* Headers only: the config and every tensor's name, shape and dtype are checked, nothing is read (no
     * weight-norm fold): for planning. Such a decoder cannot decode (H3_ERR_INVALID). */
    int headers_only;
} h3_audio_vae_opts;

typedef struct h3_audio_vae h3_audio_vae;

h3_status h3_audio_vae_open(const char *path, const h3_audio_vae_opts *opts, h3_audio_vae **out);
void h3_audio_vae_close(h3_audio_vae *v);
const h3_audio_vae_config *h3_audio_vae_get_config(const h3_audio_vae *v);
h3_layout h3_audio_vae_layout(const h3_audio_vae *v);
/* Moves where the next decodes run (opts' act_place), e.g. after h3_audio_vae_decode_peak's device bytes were
 * found to fit; HOST gives the device copy of the weights back. */
h3_status h3_audio_vae_set_placement(h3_audio_vae *v, h3_place act_place);
const char *h3_audio_vae_source(const h3_audio_vae *v);
/* The weight set the VAE was opened from (its encoder reads it: h3_audio_enc_open); whether it was opened
 * headers_only. */
h3_st_set *h3_audio_vae_weights(h3_audio_vae *v);
int h3_audio_vae_headers_only(const h3_audio_vae *v);
/* The names of a weight-normalized conv's two tensors in set (base.weight_g / .weight_v, or
 * base.parametrizations.weight.original0 / .original1), n bytes each; 0 when the set has neither form. */
int h3_weight_norm_names(const h3_st_set *set, const char *base, char *g, char *v, size_t n);
/* Weight norm folded: w = g · v / ‖v‖ per output row (the norm over every dim but the first), w f32 of v's
 * shape on the host (allocated here). H3_ERR_FORMAT naming `what` when g does not hold one value per row or a
 * row of v is all zeros. */
h3_status h3_weight_norm_fold(const h3_tensor *g, const h3_tensor *v, const char *what, h3_tensor *w);

/* Latents [channels, C, T] or [C, T] (one channel), contiguous f32 on the host. */
h3_status h3_audio_vae_check_latents(const h3_audio_vae_config *c, const h3_tensor *latents);

/* waveform: f32 [channels, T·hop] or [channels, 1, T·hop] (the shape diffusers' decode returns), in [-1, 1].
 * Latents and waveform are host tensors wherever the decode runs: with activations on the device, the latents
 * are copied in and the waveform out (a few MB), and the call returns when the waveform is on the host. */
h3_status h3_audio_vae_decode(h3_audio_vae *v, h3_exec *ex, const h3_tensor *latents, h3_tensor *waveform);

/* The memory a decode of `channels` × T latents takes beyond the weights on the host and the caller's
 * tensors, from the arithmetic the decode allocates with. It grows with T (about 36 floats per output sample
 * and channel for the released config): the audio is decoded whole, as the reference does. */
typedef struct h3_audio_vae_mem {
    /* activations on the host: one channel at a time */
    int64_t buffers;    /* host: the activations of the widest stage */
    int64_t op_scratch; /* host: the largest scratch one CPU op of the decode takes (im2col columns,
                           alpha/beta) */
    int64_t total;
    /* activations on the device: every channel in one batch; bytes of the device arena (whole granules) */
    int64_t dev_weights; /* every weight as f32, resident from the first decode until close */
    int64_t dev_buffers; /* the activations of the batch */
    int64_t
        dev_op_scratch; /* the largest scratch one op takes (im2col columns: h3_cuda_conv1d_scratch_bytes) */
    int64_t dev_total;  /* the CUDA backend's own workspace (H3_CUDA_BACKEND_BYTES) is not included */
} h3_audio_vae_mem;
h3_status h3_audio_vae_decode_peak(const h3_audio_vae_config *c, int64_t T, int64_t channels,
                                   h3_audio_vae_mem *out);

/* The Kaiser-windowed sinc low-pass of alias-free-torch / BigVGAN: `taps` values summing to 1 (computed in
 * double). For the 2× resampler: cutoff 0.25, half width 0.3, 12 taps. */
void h3_audio_kaiser_filter(float *out, int taps, double cutoff, double half_width);

#endif

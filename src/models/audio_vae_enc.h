/* The MiniMax-H3 audio VAE encoder (H3-FACTS §4): a 32 kHz waveform -> the posterior mean of the audio latents,
 * as diffusers' AutoencoderKLMiniMaxH3Audio.encode(...).latent_dist.mode() computes it.
 *
 * Each channel is one mono item. The samples are right-padded with zeros to a multiple of the hop (the product
 * of the strides, 800). The DAC-style encoder: conv (1 -> d, k7), then per stage three residual units (Snake,
 * conv k7 at dilation 1/3/9, Snake, conv k1, plus the input), Snake and a strided conv (kernel 2s, padding
 * ceil(s/2)) doubling the channels; then Snake and a k3 conv to latent_dim. Snake is x + sin²(αx)/(α + 1e-9)
 * with α as stored. Every conv is weight-normalized in the official and diffusers files (weight_g / weight_v,
 * or parametrizations.weight.original0/1: folded at open) or stored folded. Then pre_block, over the latent
 * frames as rows: h = proj(norm3(x)) + attn.proj(pool(attn(norm1(x)))), where attn is causal attention of 8
 * heads (qkv without bias but q_bias and v_bias; the key's bias is zero) whose heads are averaged and whose head
 * width is adaptive-average-pooled to the latent channels (pool is one GEMM by a fixed matrix made at open);
 * then h + w2(gelu_tanh(w0(m)) · w1(m)) with m = mlp.norm(norm2(h)); LayerNorms at eps 1e-5. The mean is
 * mean_proj (1×1 conv) of h. The result is before the DiT's normalization (h3_audio_enc_normalize).
 *
 * Weights are f32 copies made at open (the release's encoder: about 100 M values); the encode runs through the op
 * API, one channel after the other: the convolution stack (everything at the samples' rate: the work) on the host,
 * or on the device once placed there (h3_audio_enc_place), and the pre_block (a few hundred latent rows) on the
 * host. */
#ifndef H3_MODELS_AUDIO_VAE_ENC_H
#define H3_MODELS_AUDIO_VAE_ENC_H

#include "models/audio_vae.h"
#include "tensor/ops.h"

#define H3_AENC_MAX_STAGES 8

typedef struct h3_audio_enc_config {
    int encoder_dim;                        /* 64: the first conv's channels, doubled by every stage */
    int n_stages;                           /* 5 */
    int strides[H3_AENC_MAX_STAGES];        /* 2, 4, 4, 5, 5 (from the strided convs' kernels) */
    int latent_dim;                         /* 2048 */
    int latent_channels;                    /* 32 */
    int heads;                              /* 8 */
    int hop;                                /* samples per latent: the product of the strides, 800 */
} h3_audio_enc_config;

typedef struct h3_audio_enc h3_audio_enc;

/* Opens the encoder of an opened audio VAE (not opened headers_only; v must outlive the encoder): its tensors
 * checked and copied as f32. H3_ERR_FORMAT naming the tensor when the file has no encoder (a decoder-only
 * file) or a malformed one. */
h3_status h3_audio_enc_open(h3_audio_vae *v, h3_audio_enc **out);
void h3_audio_enc_close(h3_audio_enc *e);
const h3_audio_enc_config *h3_audio_enc_get_config(const h3_audio_enc *e);
/* Latent frames of `samples` samples: ceil(samples / hop). */
int64_t h3_audio_enc_frames(const h3_audio_enc_config *c, int64_t samples);
/* A waveform an encode takes: f32 [channels, 1, samples] or [channels, samples] on the host, 1 to
 * H3_AVAE_MAX_CHANNELS channels, at least one sample, every value finite. H3_ERR_INVALID saying what is wrong. */
h3_status h3_audio_enc_check_wave(const h3_tensor *wave);
/* The posterior mean of each channel into *latents (allocated here: f32 [channels, latent_channels, frames] on
 * the host), before normalization. */
h3_status h3_audio_enc_encode(h3_audio_enc *e, h3_exec *ex, const h3_tensor *wave, h3_tensor *latents);
/* Where the next encodes run the convolution stack: DEVICE copies its weights to the device as f32 (the CUDA
 * backend up), HOST gives them back. */
h3_status h3_audio_enc_place(h3_audio_enc *e, h3_exec *ex, h3_place place);
/* The device bytes an encode of `samples` samples a channel takes there: the stack's weights (each tensor on its
 * granules), the activations (three of the widest stage's, the samples, the stack's output) and the largest
 * convolution's im2col columns (h3_cuda_conv1d_scratch_bytes), from the arithmetic the encode allocates with. */
typedef struct h3_audio_enc_mem {
    int64_t dev_weights, dev_buffers, dev_op_scratch, dev_total;
} h3_audio_enc_mem;
h3_status h3_audio_enc_mem_of(const h3_audio_enc_config *c, int64_t samples, h3_audio_enc_mem *out);
/* The encoder's config from an audio VAE's tensor names and shapes (headers_only too): for planning. */
h3_status h3_audio_enc_config_of(h3_audio_vae *v, h3_audio_enc_config *out);
/* In place, per latent channel: (x − latents_mean) / latents_std, as the DiT takes audio latents. */
void h3_audio_enc_normalize(const h3_audio_vae_config *c, h3_tensor *latents);

#endif

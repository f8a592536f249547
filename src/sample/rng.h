/* Seedable Gaussian noise: Philox4x32-10 counters turned into normals by Box-Muller.
 *
 * The generator is counter-based, so value number i of a stream is a pure function of (seed, stream, i):
 * draws can be split into chunks or threads in any order and give the same numbers. Same seed, same numbers,
 * on the same machine (the Box-Muller step calls the C library's log, sqrt, cos and sin, whose last bits may
 * differ between C libraries).
 *
 * Algorithm (docs/SAMPLING.md has it with the test vectors):
 *   block b of stream s:  (w0, w1, w2, w3) = Philox4x32-10(counter = (lo32(b), hi32(b), s, 0),
 *                                                          key     = (lo32(seed), hi32(seed)))
 *   uniform:              u(w) = (w + 0.5) / 2^32, in (0, 1), never 0 or 1
 *   normals 4b .. 4b+3:   r = sqrt(-2 ln u(w0)), z[4b] = r cos(2 pi u(w1)), z[4b+1] = r sin(2 pi u(w1)),
 *                         the same with (w2, w3) for z[4b+2], z[4b+3]; computed in double, rounded to float.
 *
 * Noise of a t2va request (h3_rng_t2va_noise): the video latent [24, T, H, W] in that (C-contiguous) order
 * takes values 0.. of stream H3_RNG_STREAM_VIDEO; the audio rows [2*T_a, 32] (channel-major rows, as the DiT
 * packs them) take values 0.. of stream H3_RNG_STREAM_AUDIO. The two streams are independent, so the audio
 * noise of a seed does not depend on the canvas.
 */
#ifndef H3_SAMPLE_RNG_H
#define H3_SAMPLE_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* H3_RNG_STREAM_VAE_ENCODE: the noise the video VAE encoder's posterior is sampled with for a visual
 * condition (keyframe or reference), values 0.. in the latent's [C, T, H, W] order under the condition's seed
 * (pipeline/stages.h h3_stage_video_encode); the reference draws it from torch.Generator().manual_seed(42),
 * whose values h3run does not reproduce. */
/* H3_RNG_STREAM_KEYFRAME: the noise fl2va keyframes are mixed with to t = 0.999 (pipeline/keyframe.h), values
 * k·n .. (k+1)·n − 1 for keyframe k (n values each, the latent's [C, 1, H, W] order) under the request's seed;
 * the reference draws them from the request's generator before the target's noise. */
enum {
    H3_RNG_STREAM_VIDEO = 0,
    H3_RNG_STREAM_AUDIO = 1,
    H3_RNG_STREAM_VAE_ENCODE = 2,
    H3_RNG_STREAM_KEYFRAME = 3,
    H3_RNG_STREAM_REFERENCE = 4 /* ref2va: the image and video references' mix to t = 0.999, values from the
                                 * reference's offset (its latents' values before it, in order) */
};

/* One Philox4x32 block with 10 rounds (Salmon et al., SC'11, "Parallel random numbers: as easy as 1, 2, 3").
 */
void h3_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

typedef struct h3_rng {
    uint64_t seed;
    uint32_t stream;
    uint64_t pos; /* index of the next normal value of the stream */
} h3_rng;

void h3_rng_init(h3_rng *r, uint64_t seed, uint32_t stream);
/* Normal values pos .. pos+n-1 of the stream into out; advances pos by n. */
void h3_rng_normal(h3_rng *r, float *out, size_t n);
/* Values pos .. pos+n-1 of (seed, stream), without a generator object. */
void h3_rng_normal_at(uint64_t seed, uint32_t stream, uint64_t pos, float *out, size_t n);

/* The noise of a t2va request: video [n_video] (the latent in [C,T,H,W] order) and audio [n_audio] (rows
 * [2*T_a, 32]), as described above. Either pointer may be NULL with its count 0. */
void h3_rng_t2va_noise(uint64_t seed, float *video, size_t n_video, float *audio, size_t n_audio);

#endif

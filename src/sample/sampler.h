/* Samplers: integrate H3's video and audio latents from noise to data along a schedule (docs/SAMPLING.md).
 *
 * The model is a callback, so the DiT (or an analytic stand-in in tests) plugs in without this module knowing
 * it:
 *
 *   model(ctx, x_video, x_audio, t_video, t_audio, v_video, v_audio)
 *
 * gets the current video and audio latents (n_video and n_audio floats, in whatever row order the caller
 * uses: `generate` passes the packed DiT rows) and the DiT timesteps t = 1 - sigma of each stream, and writes
 * H3's data-ward velocity of each: x0 = x + sigma*v (the opposite sign of the usual flow-matching velocity).
 *
 * Two families:
 *  - scheduler h3 with sampler euler is diffusers' MiniMaxH3Scheduler loop, in its float32 arithmetic: each
 * stream steps on its own sigma grid, x0 = x + (1 - t)*v, then x = r*x + (1 - r)*x0 with r =
 * sigma_next/sigma.
 *  - every other combination is ComfyUI's: one k-diffusion sampler (euler, res_multistep, dpmpp_2m) on the
 * video sigma, with the audio carried as y = (sigma_v/sigma_a)*x_audio, which is a straight rectified-flow
 * path in sigma_v whose clean end is (shift_v/shift_a)*x0_audio. The model still sees x_audio =
 * (sigma_a/sigma_v)*y and its own t_audio; the sampler works on denoised values D_v = x_v + sigma_v*v_v and
 * D_y = (shift_v/shift_a)* (x_a + sigma_a*v_a), and the final audio is y*shift_a/shift_v. `steps` always
 * counts model calls.
 */
#ifndef H3_SAMPLE_SAMPLER_H
#define H3_SAMPLE_SAMPLER_H

#include <stddef.h>

#include "base/status.h"
#include "sample/schedule.h"

typedef enum h3_sampler {
    H3_SAMPLER_EULER = 0,
    H3_SAMPLER_RES_MULTISTEP,
    H3_SAMPLER_DPMPP_2M,
    H3_SAMPLER_COUNT
} h3_sampler;

const char *h3_sampler_name(h3_sampler s);
/* H3_ERR_INVALID naming the valid names when `name` is none of them. */
h3_status h3_sampler_parse(const char *name, h3_sampler *out);

/* The model: writes the data-ward velocities of both streams. A non-OK status stops sampling and is returned.
 */
typedef h3_status (*h3_model_fn)(void *ctx, const float *x_video, const float *x_audio, float t_video,
                                 float t_audio, float *v_video, float *v_audio);
/* Called after each model call with step = 1..steps; a non-OK status (e.g. H3_ERR_INTERRUPTED) stops
 * sampling. */
typedef h3_status (*h3_step_fn)(void *ctx, int step, int steps);

typedef struct h3_sample_args {
    h3_sampler sampler;
    const h3_schedule *schedule;
    h3_model_fn model;
    void *model_ctx;
    h3_step_fn on_step; /* may be NULL */
    void *step_ctx;
    /* 0: video and audio hold unit Gaussian noise on entry (scaled by the first sigma, 1 for every built-in
     * schedule). 1: they hold latents already noised to the schedule's first sigmas, each stream on its own,
     * x = (1 - sigma_0)*x0 + sigma_0*noise (a partial schedule's start: h3_schedule_tail, --refine); the
     * ComfyUI samplers carry the audio from there as (sigma_v/sigma_a)*x_audio. */
    int from_latent;
    /* Resume (h3 schedule with euler only): video and audio hold the state after this many model calls (what
     * the arrays held when on_step reported that step), and the loop goes on from the next call. 0: from the
     * start. The other samplers keep history and carried scales between calls, so they always start at 0. */
    int start_step;
} h3_sample_args;

/* 1 when a sampler on a schedule can stop after any call and resume from the arrays alone (h3 with euler). */
int h3_sample_resumable(h3_sampler sampler, h3_scheduler scheduler);

/* video [n_video] and audio [n_audio] hold the starting state (see from_latent) on entry and the sampled
 * clean latents on return. Allocates working buffers of about 3x (n_video + n_audio) floats
 * (H3_MEM_ACTIVATIONS); the model's outputs go to buffers of its own. */
h3_status h3_sample(const h3_sample_args *a, float *video, size_t n_video, float *audio, size_t n_audio);

#endif

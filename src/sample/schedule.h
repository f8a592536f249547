/* Sigma schedules for H3's two latent streams (docs/SAMPLING.md writes out every formula with its source).
 *
 * Conventions: sigma is the noise level of the rectified-flow path x = (1 - sigma)*x0 + sigma*noise; the
 * DiT's timestep is t = 1 - sigma (t = 1 is clean). A schedule holds n sigma values per stream, strictly
 * decreasing and ending at 0; a sampler makes n - 1 model calls, one per sigma except the last. Video and
 * audio run on different shifts (12 and 3): sigma_a at every step is the audio image of sigma_v,
 * time_shift_sigma(sigma_v, 12, 3).
 *
 *   h3           diffusers' MiniMaxH3Scheduler: base = linspace(1, 0, steps + 1) in float32, each stream
 *                sigma = s*base / (1 + (s - 1)*base) with its own shift, consecutive duplicates collapsed.
 *   simple       ComfyUI: every (1000/steps)-th entry of the 1000-entry table of ModelSamplingDiscreteFlow,
 *                from the top, then 0.
 *   sgm_uniform  ComfyUI: sigma(linspace(1000, 1000*sigma_min, steps + 1)[:-1] / 1000), then 0.
 *   normal       ComfyUI: sigma(linspace(1000, 1000*sigma_min, steps) / 1000), then 0.
 *   beta         ComfyUI: table entries at rint(999 * BetaPPF(1 - i/steps; 0.6, 0.6)), consecutive repeats
 *                dropped, then 0 (so it may hold fewer than steps + 1 values).
 * The ComfyUI table is sigma_k = shift12((k+1)/1000), k = 0..999, in float32 as ComfyUI builds it.
 */
#ifndef H3_SAMPLE_SCHEDULE_H
#define H3_SAMPLE_SCHEDULE_H

#include "base/status.h"

#define H3_SHIFT_VIDEO 12.0
#define H3_SHIFT_AUDIO 3.0
/* The most model calls a schedule may ask for. */
#define H3_MAX_STEPS 1000

typedef enum h3_scheduler {
    H3_SCHEDULER_H3 = 0,
    H3_SCHEDULER_SIMPLE,
    H3_SCHEDULER_SGM_UNIFORM,
    H3_SCHEDULER_BETA,
    H3_SCHEDULER_NORMAL,
    H3_SCHEDULER_COUNT
} h3_scheduler;

const char *h3_scheduler_name(h3_scheduler s);
/* H3_ERR_INVALID naming the valid names when `name` is none of them. */
h3_status h3_scheduler_parse(const char *name, h3_scheduler *out);

typedef struct h3_schedule {
    h3_scheduler kind;
    int n;          /* sigma values per stream, the terminal 0 included: n - 1 model calls */
    float *sigma_v; /* [n] video sigmas, strictly decreasing, sigma_v[n-1] == 0 */
    float *sigma_a; /* [n] audio sigmas, the same steps on the audio shift */
    float *t_v;     /* [n-1] DiT timesteps of the video rows, 1 - sigma_v[i] in float32 */
    float *t_a;     /* [n-1] DiT timesteps of the audio rows, 1 - sigma_a[i] in float32 */
    double shift_v, shift_a;
} h3_schedule;

/* Builds the schedule for `steps` model calls (1..H3_MAX_STEPS) on the given shifts (H3_SHIFT_VIDEO,
 * H3_SHIFT_AUDIO for the released model). Free with h3_schedule_free. */
h3_status h3_schedule_make(h3_scheduler kind, int steps, double shift_v, double shift_a, h3_schedule *out);
void h3_schedule_free(h3_schedule *s);
/* A view of the last `calls` model calls of s (1..s->n - 1): its last calls + 1 sigmas and calls timesteps,
 * pointing into s (not owned: never h3_schedule_free it). A partial-denoise pass (--refine) samples on it,
 * starting from latents noised to its first sigma. */
void h3_schedule_tail(const h3_schedule *s, int calls, h3_schedule *view);
/* The distinct DiT timesteps (video and audio) the schedule's model calls visit, sorted ascending, into
 * out[2·(n − 1)]; returns how many (what the AdaLN modulation is computed and kept for). */
int h3_schedule_distinct_timesteps(const h3_schedule *s, float *out);
/* How many distinct timesteps the released model's schedule of this kind and step count visits (what planning
 * the kept modulation needs); -1 with the error set when the schedule cannot be made. */
int h3_schedule_distinct_count(h3_scheduler kind, int steps);

/* sigma' = s*sigma / (1 + (s - 1)*sigma), in float32 operations as torch evaluates it on float32 tensors. */
float h3_shift_sigma_f32(float sigma, float shift);
/* Maps a sigma of the from-shift schedule to the same base point on the to-shift schedule:
 * base = sigma / (from + sigma*(1 - from)), result = to*base / (1 + (to - 1)*base). float32 operations. */
float h3_time_shift_sigma_f32(float sigma, float from_shift, float to_shift);
/* Inverse CDF of the Beta(a, b) distribution at p in [0, 1] (double precision; used by the beta scheduler).
 */
double h3_beta_ppf(double p, double a, double b);

#endif

/* Turbo presets: the step counts, sigma shifts and sampler the public step-distilled ("turbo") LoRAs of H3 were
 * trained for, found by the LoRA's file name.
 *
 * Sources: LightX2V's model specs (github.com/ModelTC/MiniMax-H3-Turbo README, "Model specs": training resolution,
 * training shifts video / audio, distillation and recommended NFE; the evaluation points are the unshifted grid
 * q_i = (N − i)/N, i = 0 .. N − 1, shifted, then 0: h3run's h3 schedule with N model calls) and its model page's
 * recommended settings for FL2V Turbo 4-step v1.1 768p (shift 6 / 3, 4 steps, euler, the "simple" scheduler,
 * whose grid for these shifts is the same):
 *
 *   file name holds                      steps  shifts   made for
 *   "turbo_4step" and "768p"               4    6 / 3    FL2VA / T2VA 4-step v1.0, v1.1, v1.2 (768p, 1344x768)
 *   "turbo_8step" and "768p"               8    6 / 3    FL2VA / T2VA 8-step v1.0 (768p), Ref2VA 8-step 768p
 *   "turbo_4step" (no "768p")              4    12 / 3   FL2VA / T2VA 4-step v0.1, Ref2VA 4-step v0.1 (544p)
 *   "turbo_8step" (no "768p")              8    12 / 3   FL2VA / T2VA 8-step v1.0 (544p; also 4 steps)
 *
 * With such a LoRA, a request that does not give --steps takes the preset's, one that does not give --shift its
 * shifts, and the sampler stays euler on the h3 schedule (h3run's defaults). A request that asks for other steps,
 * shifts, another sampler, or a schedule other than h3 and simple runs as asked, with a warning naming the preset. Other turbo LoRAs (names
 * holding "turbo" without a step count, e.g. larryvrh's MiniMax-H3-Turbo-Lora, tuned for its own sampler) get a
 * warning that no preset is known.
 */
#ifndef H3_PIPELINE_TURBO_H
#define H3_PIPELINE_TURBO_H

#include "pipeline/request.h"

typedef struct h3_turbo_preset {
    const char *name; /* e.g. "LightX2V turbo 4-step, 768p" */
    int steps;
    double shift_video, shift_audio;
} h3_turbo_preset;

/* The preset of a LoRA file (by its base name, case-insensitive), or NULL; *turbo_unknown (may be NULL) is 1
 * when the name says "turbo" but matches no preset. */
const h3_turbo_preset *h3_turbo_preset_for(const char *lora_path, int *turbo_unknown);

/* Applies the preset of the first turbo LoRA among paths to r before it is resolved: the steps and shifts r left
 * at 0. Warnings (may be NULL) get what differs from the preset or that no preset is known. Returns the preset
 * applied, or NULL. */
const h3_turbo_preset *h3_turbo_apply(const char *const *paths, int n, h3_request *r,
                                      h3_request_warnings *warnings);

#endif

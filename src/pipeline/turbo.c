#include "pipeline/turbo.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static const h3_turbo_preset k_presets[] = {
    {"LightX2V turbo 4-step, 768p", 4, 6.0, 3.0},
    {"LightX2V turbo 8-step, 768p", 8, 6.0, 3.0},
    {"LightX2V turbo 4-step, 544p", 4, 12.0, 3.0},
    {"LightX2V turbo 8-step, 544p", 8, 12.0, 3.0},
};

/* The base name, lower-cased into buf. */
static void base_lower(const char *path, char *buf, size_t n) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t i = 0;
    for (; b[i] && i + 1 < n; i++) buf[i] = (char)tolower((unsigned char)b[i]);
    buf[i] = 0;
}

const h3_turbo_preset *h3_turbo_preset_for(const char *lora_path, int *turbo_unknown) {
    if (turbo_unknown) *turbo_unknown = 0;
    if (!lora_path) return NULL;
    char b[512];
    base_lower(lora_path, b, sizeof b);
    const int p768 = strstr(b, "768p") != NULL;
    if (strstr(b, "turbo_4step") || strstr(b, "turbo-4step")) return &k_presets[p768 ? 0 : 2];
    if (strstr(b, "turbo_8step") || strstr(b, "turbo-8step")) return &k_presets[p768 ? 1 : 3];
    if (turbo_unknown && strstr(b, "turbo")) *turbo_unknown = 1;
    return NULL;
}

const h3_turbo_preset *h3_turbo_apply(const char *const *paths, int n, h3_request *r,
                                      h3_request_warnings *warnings) {
    for (int i = 0; i < n; i++) {
        int unknown = 0;
        const h3_turbo_preset *p = h3_turbo_preset_for(paths[i], &unknown);
        if (unknown && warnings && warnings->n < H3_REQUEST_MAX_WARNINGS)
            snprintf(warnings->msg[warnings->n++], sizeof warnings->msg[0],
                     "%.120s looks like a turbo LoRA, but h3run knows no preset for it: give the steps, sampler "
                     "and --shift its model card recommends",
                     paths[i]);
        if (!p) continue;
        const int asked_steps = r->steps, asked_shift = r->shift_video != 0.0 || r->shift_audio != 0.0;
        if (!asked_steps) r->steps = p->steps;
        if (!asked_shift) {
            r->shift_video = p->shift_video;
            r->shift_audio = p->shift_audio;
        }
        const double sv = r->shift_video, sa = r->shift_audio != 0.0 ? r->shift_audio : H3_SHIFT_AUDIO;
        if ((r->steps != p->steps || sv != p->shift_video || sa != p->shift_audio) && warnings &&
            warnings->n < H3_REQUEST_MAX_WARNINGS)
            snprintf(warnings->msg[warnings->n++], sizeof warnings->msg[0],
                     "the %s LoRA was made for %d model calls at shift %g:%g; this request asks %d at %g:%g, "
                     "which it was not trained for",
                     p->name, p->steps, p->shift_video, p->shift_audio, r->steps, sv, sa);
        if ((r->sampler != H3_SAMPLER_EULER ||
             (r->scheduler != H3_SCHEDULER_H3 && r->scheduler != H3_SCHEDULER_SIMPLE)) &&
            warnings &&
            warnings->n < H3_REQUEST_MAX_WARNINGS)
            snprintf(warnings->msg[warnings->n++], sizeof warnings->msg[0],
                     "the %s LoRA was made for euler on the shifted linear grid (--sampler euler, --scheduler h3 "
                     "or simple); this request uses %s on %s",
                     p->name, h3_sampler_name(r->sampler), h3_scheduler_name(r->scheduler));
        return p;
    }
    return NULL;
}

/* The config.json of every component (and the audio VAE's metadata.json), in the model folder they belong to.
 * The first input byte picks the file, the rest is its text. The model is the reduced one
 * (tools/h3-tinymodel.c) made of links, with that one file replaced; the component is opened (its config
 * checked against its weights), the DiT's and text encoder's config readers also run alone, and, when the
 * text is JSON, `h3run plan` plans the whole folder (it reads every component's config). */
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "cli/cli.h"
#include "fuzz.h"
#include "models/audio_vae.h"
#include "models/dit.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"

static const char *const g_files[] = {
    "transformer/config.json",      "text_encoder/config.json", "video_vae/config.json",
    "video_vae/source/config.json", "audio_vae/config.json",    "audio_vae/metadata.json",
};
enum { N_FILES = sizeof g_files / sizeof g_files[0] };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        ready = 1;
        fz_tiny_model();
        fz_keep();
    }
    fz_bytes in = {data, size};
    const int which = (int)(fz_u8(&in) % N_FILES);
    fz_quiet(1);
    const char *file = fz_model_with("m", g_files[which]);
    fz_write(file, in.p, in.n);
    const char *comp = fz_path(which == 0   ? "m/transformer"
                               : which == 1 ? "m/text_encoder"
                               : which <= 3 ? "m/video_vae"
                                            : "m/audio_vae");
    json_t *j = NULL;
    const int parsed = h3_json_parse((const char *)in.p, in.n, "config.json", &j) == H3_OK;
    if (parsed && which <= 1) {
        if (which == 0) {
            h3_dit_config c;
            h3_dit_config_default(&c);
            if (h3_dit_config_from_json(j, "config.json", &c) == H3_OK) h3_dit_config_check(&c);
        } else {
            h3_te_config c;
            h3_te_config_default(&c);
            h3_te_config_from_json(j, "config.json", &c);
        }
    }
    if (j) json_decref(j);
    if (which == 0) {
        h3_dit *d = NULL;
        if (h3_dit_open(comp, NULL, &d) == H3_OK) h3_dit_close(d);
    } else if (which == 1) {
        h3_text_encoder *te = NULL;
        if (h3_text_encoder_open(comp, NULL, &te) == H3_OK) h3_text_encoder_close(te);
    } else if (which <= 3) {
        h3_video_vae *v = NULL;
        if (h3_video_vae_open(comp, NULL, &v) == H3_OK) h3_video_vae_close(v);
    } else {
        h3_audio_vae *v = NULL;
        if (h3_audio_vae_open(comp, NULL, &v) == H3_OK) h3_audio_vae_close(v);
    }
    char *argv[] = {(char *)fz_path("m"), "--frames", "22", "--size", "64x64", "--vram-budget", "1GiB", NULL};
    if (parsed) h3_cmd_plan(7, argv); /* (text that is not JSON fails the component's open already) */
    fz_quiet(0);
    fz_end("config", 0);
    return 0;
}

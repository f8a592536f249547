/* Small readers for the VAEs' JSON configs: checked integers and per-channel number lists, and config files
 * beside the weights. Shared by video_vae.c and audio_vae.c; not a public interface. */
#ifndef H3_MODELS_MODEL_CFG_H
#define H3_MODELS_MODEL_CFG_H

#include "base/json.h"
#include "base/status.h"

/* An integer in [lo, hi] under key, if present (nothing changes when it is absent). `what` names the file in
 * errors. */
h3_status h3_cfg_int(const json_t *o, const char *key, int lo, int hi, int *out, const char *what);

/* n finite numbers under key (latents_mean / latents_std), nonzero where `nonzero`; required where `need`,
 * else optional. A JSON null (what diffusers writes for an audio VAE saved with its defaults) is refused with
 * a message saying so: diffusers reads it as None, which its decode step cannot use. */
h3_status h3_cfg_floats(const json_t *o, const char *key, int n, int need, int nonzero, float *out,
                        const char *what);

/* Parses dir/name (at most 16 MB). */
h3_status h3_cfg_load_json_in(const char *dir, const char *name, json_t **out);

/* *found = whether dir/name exists; fails only when the path cannot be built. */
h3_status h3_cfg_file_in(const char *dir, const char *name, int *found);

#endif

/* Readers for the VAEs' JSON configs. See model_cfg.h. */
#include "models/model_cfg.h"

#include <math.h>

#include "base/alloc.h"
#include "base/fs.h"

h3_status h3_cfg_int(const json_t *o, const char *key, int lo, int hi, int *out, const char *what) {
    json_t *j = o ? json_object_get(o, key) : NULL;
    if (!j) return H3_OK;
    double d = json_is_number(j) ? json_number_value(j) : NAN;
    if (!(d >= lo && d <= hi) || d != floor(d))
        return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be an integer in [%d, %d]", what, key, lo, hi);
    *out = (int)d;
    return H3_OK;
}

h3_status h3_cfg_floats(const json_t *o, const char *key, int n, int need, int nonzero, float *out,
                        const char *what) {
    json_t *j = o ? json_object_get(o, key) : NULL;
    if (!j) return need ? H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" is missing", what, key) : H3_OK;
    if (json_is_null(j))
        return H3_ERR(
            H3_ERR_FORMAT,
            "%s: \"%s\" is null: the config records no latent normalization, but decoding needs the %d "
            "per-channel values the latents were normalized with (diffusers' decode step cannot use a null "
            "either: it builds a tensor from the list); give them, e.g. from the release's config.json",
            what, key, n);
    if (!json_is_array(j) || json_array_size(j) != (size_t)n)
        return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be a list of %d numbers (one per latent channel)", what,
                      key, n);
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(j, (size_t)i);
        double d = json_is_number(e) ? json_number_value(e) : NAN;
        if (!isfinite(d) || (nonzero && d == 0.0) || fabs(d) > 1e30)
            return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\"[%d] must be a finite%s number", what, key, i,
                          nonzero ? " nonzero" : "");
        out[i] = (float)d;
    }
    return H3_OK;
}

h3_status h3_cfg_load_json_in(const char *dir, const char *name, json_t **out) {
    char *p = h3_path_join(dir, name);
    if (!p) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_status st = h3_json_load_file(p, 16u << 20, out);
    h3_free(p);
    return st;
}

h3_status h3_cfg_file_in(const char *dir, const char *name, int *found) {
    char *p = h3_path_join(dir, name);
    if (!p) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    *found = h3_path_exists(p);
    h3_free(p);
    return H3_OK;
}

/* A job's request as JSON (serve.h): the options of `generate` a client may give, checked for type and range
 * here; the request's own rules (17n+5 frames, the canvas) are h3_request_resolve's, asked for at the check.
 */
#include <math.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/serve.h"
#include "pipeline/media.h"
#include "pipeline/request.h"
#include "sample/schedule.h"

typedef enum { T_STR, T_TEXT, T_INT, T_NUM, T_BOOL } opt_type;

/* The options: name, type, range for numbers (inclusive), what it is. */
static const struct {
    const char *name;
    opt_type type;
    double min, max;
} g_opts[] = {
    {"prompt", T_TEXT, 0, 0},
    {"frames", T_INT, 1, H3_MAX_FRAMES},
    {"seconds", T_NUM, 0.2, H3_MAX_FRAMES / 24},
    {"size", T_STR, 0, 0},
    {"steps", T_INT, 1, H3_MAX_STEPS},
    {"sampler", T_STR, 0, 0},
    {"scheduler", T_STR, 0, 0},
    {"seed", T_INT, 0, 9007199254740991.0},
    {"x264_preset", T_STR, 0, 0},
    {"wav", T_BOOL, 0, 0},
    {"latents", T_BOOL, 0, 0},
};
enum { N_OPTS = sizeof g_opts / sizeof *g_opts };

static const char *type_words(opt_type t) {
    switch (t) {
        case T_STR:
            return "a non-empty string";
        case T_TEXT:
            return "a string";
        case T_INT:
            return "a whole number";
        case T_NUM:
            return "a number";
        case T_BOOL:
            return "true or false";
    }
    return "?";
}

static const char *json_type_words(const json_t *v) {
    switch (json_typeof(v)) {
        case JSON_OBJECT:
            return "an object";
        case JSON_ARRAY:
            return "an array";
        case JSON_STRING:
            return "a string";
        case JSON_INTEGER:
            return "a whole number";
        case JSON_REAL:
            return "a number";
        case JSON_TRUE:
        case JSON_FALSE:
            return "a boolean";
        case JSON_NULL:
            return "null";
    }
    return "?";
}

h3_status h3_serve_parse_request(json_t *obj, int defaults_small, h3_serve_request *out) {
    memset(out, 0, sizeof *out);
    h3_generate_request_init(&out->gen);
    h3_request *q = &out->gen.req;
    if (!json_is_object(obj))
        return H3_ERR(H3_ERR_INVALID, "the body must be a JSON object of the job's options (%s); got %s",
                      H3_SERVE_OPTIONS, json_type_words(obj));
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        int k = 0;
        while (k < N_OPTS && strcmp(g_opts[k].name, key)) k++;
        if (k == N_OPTS)
            return H3_ERR(H3_ERR_INVALID, "unknown option '%.64s': a job takes %s", key, H3_SERVE_OPTIONS);
        const opt_type t = g_opts[k].type;
        int ok = t == T_STR || t == T_TEXT ? json_is_string(v)
                 : t == T_INT              ? json_is_integer(v)
                 : t == T_NUM              ? json_is_number(v)
                                           : json_is_boolean(v);
        if (!ok)
            return H3_ERR(H3_ERR_INVALID, "option '%s' takes %s; got %s", key, type_words(t),
                          json_type_words(v));
        if (t == T_STR || t == T_TEXT) {
            const size_t len = json_string_length(v);
            if (strlen(json_string_value(v)) != len)
                return H3_ERR(H3_ERR_INVALID, "option '%s' holds a NUL character", key);
            if (t == T_STR && len == 0)
                return H3_ERR(H3_ERR_INVALID, "option '%s' takes a non-empty string", key);
        }
        if (t == T_INT || t == T_NUM) {
            const double x = json_number_value(v);
            if (!(x >= g_opts[k].min && x <= g_opts[k].max))
                return H3_ERR(H3_ERR_INVALID, "option '%s' takes %s from %g to %.0f; got %g", key,
                              type_words(t), g_opts[k].min, g_opts[k].max, x);
        }
    }
    json_t *p = json_object_get(obj, "prompt");
    if (!p) return H3_ERR(H3_ERR_INVALID, "the option 'prompt' is required (a string; it may be empty)");
    H3_TRY(h3_request_check_prompt_bytes(json_string_length(p)));
    q->prompt = json_string_value(p);
    json_t *fr = json_object_get(obj, "frames"), *se = json_object_get(obj, "seconds");
    if (fr && se) return H3_ERR(H3_ERR_INVALID, "give the length as 'frames' or as 'seconds', not both");
    if (fr) q->frames = json_integer_value(fr);
    if (se) q->seconds = json_number_value(se);
    json_t *sz = json_object_get(obj, "size");
    if (sz) H3_TRY(h3_request_parse_size(json_string_value(sz), &q->width, &q->height));
    json_t *st = json_object_get(obj, "steps");
    if (st) q->steps = (int)json_integer_value(st);
    json_t *sa = json_object_get(obj, "sampler");
    if (sa) H3_TRY(h3_sampler_parse(json_string_value(sa), &q->sampler));
    json_t *sc = json_object_get(obj, "scheduler");
    if (sc) H3_TRY(h3_scheduler_parse(json_string_value(sc), &q->scheduler));
    json_t *pr = json_object_get(obj, "x264_preset");
    if (pr) {
        H3_TRY(h3_mp4_check_preset(json_string_value(pr), "x264_preset"));
        out->gen.x264_preset = json_string_value(pr);
    }
    if (defaults_small) { /* what the small model was trained on, as generate does without --model */
        if (!fr && !se) q->frames = H3_SMALL_MODEL_FRAMES;
        if (!sz) q->width = q->height = 128;
        out->gen.small_model = 1;
    }
    json_t *seed = json_object_get(obj, "seed");
    if (!seed) {
        seed = json_integer((json_int_t)h3_cli_random_seed());
        if (!seed || json_object_set_new(obj, "seed", seed)) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    }
    q->seed = (uint64_t)json_integer_value(seed);
    out->wav = json_is_true(json_object_get(obj, "wav"));
    out->latents = json_is_true(json_object_get(obj, "latents"));
    return H3_OK;
}

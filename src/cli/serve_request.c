/* A job's request as JSON (serve.h): the options of `generate` a client may give, checked for type and range
 * here; the request's own rules (17n+5 frames, the canvas) are h3_request_resolve's, asked for at the check.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/serve.h"
#include "base/alloc.h"
#include "pipeline/keyframe.h"
#include "pipeline/media.h"
#include "pipeline/plan.h"
#include "pipeline/request.h"
#include "sample/cache.h"
#include "sample/schedule.h"

typedef enum { T_STR, T_TEXT, T_INT, T_NUM, T_BOOL, T_KEYFRAMES, T_LORAS, T_CACHE, T_PROMPTS } opt_type;

/* The options: name, type, range for numbers (inclusive), what it is. */
static const struct {
    const char *name;
    opt_type type;
    double min, max;
} g_opts[] = {
    {"prompt", T_TEXT, 0, 0},
    {"frames", T_INT, 1, H3_MAX_FRAMES},
    {"seconds", T_NUM, 0.2, H3_MAX_FRAMES / 24},
    {"window", T_INT, 1, H3_MAX_FRAMES},
    {"overlap", T_INT, 1, H3_MAX_FRAMES},
    {"size", T_STR, 0, 0},
    {"steps", T_INT, 1, H3_MAX_STEPS},
    {"sampler", T_STR, 0, 0},
    {"attention", T_STR, 0, 0},
    {"sparse", T_STR, 0, 0},
    {"scheduler", T_STR, 0, 0},
    {"seed", T_INT, 0, 9007199254740991.0},
    {"x264_preset", T_STR, 0, 0},
    {"wav", T_BOOL, 0, 0},
    {"latents", T_BOOL, 0, 0},
    {"refine", T_STR, 0, 0},
    {"output_size", T_STR, 0, 0},
    {"shift", T_STR, 0, 0},
    {"first_frame", T_STR, 0, 0},
    {"last_frame", T_STR, 0, 0},
    {"keyframes", T_KEYFRAMES, 0, 0},
    {"loras", T_LORAS, 0, 0},
    {"cache", T_CACHE, 0, 0},
    {"audio", T_STR, 0, 0},
    {"more_prompts", T_PROMPTS, 0, 0},
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
        case T_KEYFRAMES:
            return "an array of {\"image\": base64, \"frame\": a frame from 0}";
        case T_CACHE:
            return "true (step caching at the default threshold), false, or a threshold above 0, at most 10";
        case T_LORAS:
            return "an array of {\"name\": a file of the server's LoRA folder, \"strength\": a number}";
        case T_PROMPTS:
            return "an array of {\"start\": seconds, \"prompt\": a string}";
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

static h3_status upload_path(const char *ref, const char *what, const char *dir, char *buf, size_t n);

h3_status h3_serve_parse_request(json_t *obj, int defaults_small, const char *uploads_dir, const char *lora_dir,
                                 h3_serve_request *out) {
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
                 : t == T_KEYFRAMES || t == T_LORAS || t == T_PROMPTS ? json_is_array(v)
                 : t == T_CACHE                     ? json_is_boolean(v) || json_is_number(v)
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
    json_t *wi = json_object_get(obj, "window"), *ov = json_object_get(obj, "overlap"); /* a long clip's windows */
    if (wi) q->window = json_integer_value(wi);
    if (ov) q->overlap = json_integer_value(ov);
    json_t *sz = json_object_get(obj, "size");
    if (sz) H3_TRY(h3_request_parse_size(json_string_value(sz), &q->width, &q->height));
    json_t *st = json_object_get(obj, "steps");
    if (st) q->steps = (int)json_integer_value(st);
    json_t *sa = json_object_get(obj, "sampler");
    if (sa) H3_TRY(h3_sampler_parse(json_string_value(sa), &q->sampler));
    json_t *sc = json_object_get(obj, "scheduler");
    if (sc) H3_TRY(h3_scheduler_parse(json_string_value(sc), &q->scheduler));
    json_t *rf = json_object_get(obj, "refine"); /* the same forms and checks as generate's options */
    if (rf) H3_TRY(h3_request_parse_refine(json_string_value(rf), &q->refine_width, &q->refine_height, &q->refine_denoise));
    json_t *os = json_object_get(obj, "output_size");
    if (os) H3_TRY(h3_request_parse_output_size(json_string_value(os), &q->out_width, &q->out_height));
    json_t *sh = json_object_get(obj, "shift");
    if (sh) H3_TRY(h3_request_parse_shift(json_string_value(sh), &q->shift_video, &q->shift_audio));
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
    /* keyframes: first, last, then the list, each an upload the server stored */
    h3_generate_request *g = &out->gen;
    json_t *kl = json_object_get(obj, "keyframes");
    const size_t nlist = kl ? json_array_size(kl) : 0;
    const int total = !!json_object_get(obj, "first_frame") + !!json_object_get(obj, "last_frame") + (int)nlist;
    if (total > H3_MAX_KEYFRAMES)
        return H3_ERR(H3_ERR_INVALID, "%d keyframes; at most %d in all", total, H3_MAX_KEYFRAMES);
    static const char *const ends[2] = {"first_frame", "last_frame"};
    for (int e = 0; e < 2; e++) {
        json_t *im = json_object_get(obj, ends[e]);
        if (!im) continue;
        H3_TRY(upload_path(json_string_value(im), ends[e], uploads_dir, out->kf_path[g->n_keyframes],
                           sizeof out->kf_path[0]));
        g->keyframe[g->n_keyframes] = out->kf_path[g->n_keyframes];
        g->keyframe_frame[g->n_keyframes++] = e == 0 ? 0 : H3_KEYFRAME_LAST;
    }
    for (size_t i = 0; i < nlist; i++) {
        json_t *k = json_array_get(kl, i), *im = json_object_get(k, "image"), *fr2 = json_object_get(k, "frame");
        if (!json_is_object(k) || !json_is_string(im) || !json_is_integer(fr2) || json_object_size(k) != 2 ||
            json_integer_value(fr2) < 0 || json_integer_value(fr2) > H3_MAX_FRAMES)
            return H3_ERR(H3_ERR_INVALID,
                          "keyframes[%zu] must be {\"image\": base64 image, \"frame\": a frame from 0}", i);
        char what[32];
        snprintf(what, sizeof what, "keyframes[%zu]", i);
        H3_TRY(upload_path(json_string_value(im), what, uploads_dir, out->kf_path[g->n_keyframes],
                           sizeof out->kf_path[0]));
        g->keyframe[g->n_keyframes] = out->kf_path[g->n_keyframes];
        g->keyframe_frame[g->n_keyframes++] = json_integer_value(fr2);
    }
    /* a soundtrack (audio to video): an upload the server stored */
    json_t *au = json_object_get(obj, "audio");
    if (au) {
        H3_TRY(upload_path(json_string_value(au), "audio", uploads_dir, out->audio_path, sizeof out->audio_path));
        g->audio = out->audio_path;
    }
    json_t *at = json_object_get(obj, "attention"); /* the DiT blocks' attention: auto, bf16, fp8, int8, sparse */
    h3_attn_mode am = (h3_attn_mode)g->attention;
    if (at) H3_TRY(h3_attn_mode_parse(json_string_value(at), &am));
    json_t *spr = json_object_get(obj, "sparse"); /* sparse attention's rule, "TAU[,START,END]" (implies it) */
    if (spr) {
        h3_sparse_rule sp;
        H3_TRY(h3_sparse_rule_take(json_string_value(spr), at != NULL, &am, &sp));
        g->sparse_given = 1, g->sparse_tau = sp.tau, g->sparse_start = sp.start, g->sparse_end = sp.end;
    }
    g->attention = (int)am;
    /* step caching: true (the default threshold) or a threshold */
    json_t *ca = json_object_get(obj, "cache");
    if (ca && json_is_number(ca)) {
        const h3_cache_opts co = {json_number_value(ca), H3_CACHE_START, H3_CACHE_END};
        if (h3_cache_opts_check(&co) != H3_OK) {
            h3_clear_error();
            return H3_ERR(H3_ERR_INVALID, "option 'cache' takes %s; got %g", type_words(T_CACHE), json_number_value(ca));
        }
        g->cache_threshold = json_number_value(ca);
    } else if (json_is_true(ca)) {
        g->cache_threshold = H3_CACHE_THRESHOLD;
    }
    /* LoRAs: files of the server's folder, by name */
    json_t *mp = json_object_get(obj, "more_prompts"); /* a long clip's later prompts (generate's --prompts) */
    const size_t nmp = mp ? json_array_size(mp) : 0;
    if (nmp > H3_MAX_PROMPTS - 1) return H3_ERR(H3_ERR_INVALID, "%zu more prompts; at most %d", nmp, H3_MAX_PROMPTS - 1);
    for (size_t i = 0; i < nmp; i++) {
        json_t *e = json_array_get(mp, i), *t = json_object_get(e, "start"), *pt = json_object_get(e, "prompt");
        if (!json_is_object(e) || !json_is_number(t) || !json_is_string(pt) || json_object_size(e) != 2 ||
            strlen(json_string_value(pt)) != json_string_length(pt))
            return H3_ERR(H3_ERR_INVALID,
                          "more_prompts[%zu] must be {\"start\": the second it starts at, \"prompt\": a string}", i);
        out->gen.more_prompt[i] = json_string_value(pt);
        out->gen.more_prompt_s[i] = json_number_value(t);
    }
    out->gen.n_more_prompts = (int)nmp;
    json_t *ll = json_object_get(obj, "loras");
    const size_t nl = ll ? json_array_size(ll) : 0;
    if (nl && !lora_dir)
        return H3_ERR(H3_ERR_INVALID, "this server has no LoRA folder: start it with --lora-dir DIR (GET /api/info "
                                      "lists the LoRAs a server has)");
    if (nl > H3_MAX_LORAS) return H3_ERR(H3_ERR_INVALID, "%zu LoRAs; at most %d", nl, H3_MAX_LORAS);
    for (size_t i = 0; i < nl; i++) {
        json_t *l = json_array_get(ll, i), *nm = json_object_get(l, "name"), *sg = json_object_get(l, "strength");
        if (!json_is_object(l) || !json_is_string(nm) || (sg && !json_is_number(sg)) ||
            json_object_size(l) != 1u + !!sg)
            return H3_ERR(H3_ERR_INVALID,
                          "loras[%zu] must be {\"name\": a file of the server's LoRA folder, \"strength\": a number "
                          "(1 when left out)}",
                          i);
        const char *name = json_string_value(nm);
        const size_t len = json_string_length(nm);
        const size_t ext = strlen(".safetensors");
        if (strlen(name) != len || len <= ext || len > 255 || strchr(name, '/') || name[0] == '.' ||
            strcmp(name + len - ext, ".safetensors"))
            return H3_ERR(H3_ERR_INVALID,
                          "loras[%zu]: '%.64s' is not a LoRA's name: give a file name of the server's LoRA folder "
                          "ending in .safetensors (GET /api/info lists them)",
                          i, name);
        const double x = sg ? json_number_value(sg) : 1.0;
        if (!(x >= -100 && x <= 100))
            return H3_ERR(H3_ERR_INVALID, "loras[%zu]: the strength takes a number from -100 to 100; got %g", i, x);
        if (snprintf(out->lora_path[i], sizeof out->lora_path[0], "%s/%s", lora_dir, name) >=
            (int)sizeof out->lora_path[0])
            return H3_ERR(H3_ERR_INVALID, "loras[%zu]: the name is too long", i);
        struct stat sb;
        if (stat(out->lora_path[i], &sb) != 0 || !S_ISREG(sb.st_mode))
            return H3_ERR(H3_ERR_INVALID, "loras[%zu]: the server has no LoRA '%.64s' (GET /api/info lists them)",
                          i, name);
        g->lora[i] = out->lora_path[i];
        g->lora_strength[i] = (float)x;
    }
    g->n_loras = (int)nl;
    return H3_OK;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "name")),
                  json_string_value(json_object_get(*(json_t *const *)b, "name")));
}

json_t *h3_serve_list_loras(const char *lora_dir) {
    json_t *arr = json_array();
    DIR *d = lora_dir ? opendir(lora_dir) : NULL;
    if (!d || !arr) {
        if (d) closedir(d);
        return arr;
    }
    json_t *items[1024];
    size_t n = 0;
    const size_t ext = strlen(".safetensors");
    for (struct dirent *e; (e = readdir(d)) && n < sizeof items / sizeof *items;) {
        const size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len <= ext || len > 255 || strcmp(e->d_name + len - ext, ".safetensors")) continue;
        char path[1300];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", lora_dir, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        items[n++] = json_pack("{s:s, s:I}", "name", e->d_name, "bytes", (json_int_t)sb.st_size);
    }
    closedir(d);
    qsort(items, n, sizeof *items, name_cmp);
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, items[i]);
    return arr;
}

/* ---- uploads --------------------------------------------------------------------------------------------- */

#define UPLOAD_PREFIX "upload:"

/* 1 when s is UPLOAD_PREFIX, 32 lower-case hex digits, '.' and an extension of 2 to 4 lower-case letters. */
static int is_upload_ref(const char *s) {
    if (!s || strncmp(s, UPLOAD_PREFIX, strlen(UPLOAD_PREFIX))) return 0;
    s += strlen(UPLOAD_PREFIX);
    for (int i = 0; i < 32; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    if (s[32] != '.') return 0;
    int n = 0;
    for (const char *e = s + 33; *e; e++, n++)
        if (*e < 'a' || *e > 'z') return 0;
    return n >= 2 && n <= 4;
}

static h3_status upload_path(const char *ref, const char *what, const char *dir, char *buf, size_t n) {
    if (!dir) return H3_ERR(H3_ERR_INVALID, "'%s': this server takes no uploads", what);
    if (!is_upload_ref(ref))
        return H3_ERR(H3_ERR_INVALID, "'%s' must be %s as base64", what,
                      strcmp(what, "audio") ? "an image (PNG, JPEG, WebP, ...)" : "a sound file (WAV, FLAC, MP3, ...)");
    snprintf(buf, n, "%s/%s", dir, ref + strlen(UPLOAD_PREFIX));
    return H3_OK;
}

/* The file's kind from its first bytes, as an extension libav's image readers know ("img" when unknown: libav
 * then probes the content). */
static const char *image_ext(const uint8_t *b, int64_t n) {
    if (n >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8)) return "png";
    if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return "jpg";
    if (n >= 12 && !memcmp(b, "RIFF", 4) && !memcmp(b + 8, "WEBP", 4)) return "webp";
    if (n >= 6 && (!memcmp(b, "GIF87a", 6) || !memcmp(b, "GIF89a", 6))) return "gif";
    if (n >= 2 && b[0] == 'B' && b[1] == 'M') return "bmp";
    if (n >= 2 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6') return "ppm";
    if (n >= 4 && (!memcmp(b, "II*\0", 4) || !memcmp(b, "MM\0*", 4))) return "tif";
    /* sound files (a soundtrack's upload) */
    if (n >= 12 && !memcmp(b, "RIFF", 4) && !memcmp(b + 8, "WAVE", 4)) return "wav";
    if (n >= 4 && !memcmp(b, "fLaC", 4)) return "flac";
    if (n >= 4 && !memcmp(b, "OggS", 4)) return "ogg";
    if (n >= 3 && (!memcmp(b, "ID3", 3) || (b[0] == 0xFF && (b[1] & 0xE0) == 0xE0))) return "mp";
    if (n >= 8 && !memcmp(b + 4, "ftyp", 4)) return "mp";
    return "img";
}

static int b64_value(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

/* Standard or URL-safe base64, padding optional, whitespace skipped; *out h3_malloc'd. -1 on a bad character
 * or a length past max. */
static int64_t b64_decode(const char *s, size_t len, size_t max, uint8_t **out) {
    uint8_t *o = h3_malloc(len / 4 * 3 + 4, H3_MEM_IO);
    if (!o) return -1;
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0, pad = 0;
    for (size_t i = 0; i < len; i++) {
        const int c = (unsigned char)s[i];
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        if (c == '=') {
            pad++;
            continue;
        }
        const int v = b64_value(c);
        if (v < 0 || pad) {
            h3_free(o);
            return -1;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[n++] = (uint8_t)(acc >> bits);
            if (n > max) {
                h3_free(o);
                return -1;
            }
        }
    }
    *out = o;
    return (int64_t)n;
}

/* One image value: decoded and written as dir/<hex>.img; *ref gets "upload:<hex>". */
static h3_status store_one(json_t *v, const char *what, const char *dir, char ref[64]) {
    const char *s = json_string_value(v);
    const char *kind = strcmp(what, "audio") ? "an image" : "a sound file";
    if (!s) return H3_ERR(H3_ERR_INVALID, "'%s' must be %s as base64", what, kind);
    if (is_upload_ref(s) || !strncmp(s, UPLOAD_PREFIX, strlen(UPLOAD_PREFIX)))
        return H3_ERR(H3_ERR_INVALID, "'%s': send %s itself as base64, not a name", what, kind);
    size_t len = json_string_length(v);
    if (!strncmp(s, "data:", 5)) { /* a data: URL: the base64 after its comma */
        const char *c = memchr(s, ',', len);
        int b64 = 0;
        for (const char *q = s; c && q + 7 <= c; q++) b64 |= !memcmp(q, ";base64", 7);
        if (!c || !b64)
            return H3_ERR(H3_ERR_INVALID, "'%s': a data: URL must be base64 (data:%s;base64,...)", what,
                          strcmp(what, "audio") ? "image/png" : "audio/wav");
        len -= (size_t)(c + 1 - s);
        s = c + 1;
    }
    uint8_t *bytes = NULL;
    const int64_t n = b64_decode(s, len, H3_SERVE_MAX_IMAGE, &bytes);
    if (n < 0)
        return H3_ERR(H3_ERR_INVALID, "'%s' is not base64 of %s of at most %d MiB", what, kind,
                      H3_SERVE_MAX_IMAGE >> 20);
    if (n == 0) {
        h3_free(bytes);
        return H3_ERR(H3_ERR_INVALID, "'%s' is empty: send %s as base64", what, kind);
    }
    char hex[33], path[1024], tmp[1100];
    const char *ext = image_ext(bytes, n);
    uint8_t rnd[16];
    int fd = open("/dev/urandom", O_RDONLY);
    const ssize_t got = fd >= 0 ? read(fd, rnd, sizeof rnd) : -1;
    if (fd >= 0) close(fd);
    if (got != (ssize_t)sizeof rnd) {
        h3_free(bytes);
        return H3_ERR(H3_ERR_IO, "cannot read /dev/urandom for an upload's name");
    }
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    snprintf(path, sizeof path, "%s/%s.%s", dir, hex, ext);
    snprintf(tmp, sizeof tmp, "%s.partial", path);
    h3_status st = H3_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(bytes, 1, (size_t)n, f) != (size_t)n || fflush(f) != 0 || fsync(fileno(f)) != 0)
        st = H3_ERR(H3_ERR_IO, "cannot write the upload %s: %s", tmp, strerror(errno));
    if (f && fclose(f) != 0 && st == H3_OK) st = H3_ERR(H3_ERR_IO, "cannot write the upload %s", tmp);
    if (st == H3_OK && rename(tmp, path) != 0) st = H3_ERR(H3_ERR_IO, "cannot rename %s: %s", tmp, strerror(errno));
    if (st != H3_OK) unlink(tmp);
    h3_free(bytes);
    if (st == H3_OK) snprintf(ref, 64, UPLOAD_PREFIX "%s.%s", hex, ext);
    return st;
}

/* Calls fn on every uploaded value of a request (first_frame, last_frame, audio, keyframes[i].image). */
static h3_status each_image(json_t *obj, h3_status (*fn)(json_t *holder, const char *key, json_t *v,
                                                        const char *what, void *user),
                            void *user) {
    static const char *const ends[3] = {"first_frame", "last_frame", "audio"};
    for (int e = 0; e < 3; e++) {
        json_t *v = json_object_get(obj, ends[e]);
        if (v) H3_TRY(fn(obj, ends[e], v, ends[e], user));
    }
    json_t *kl = json_object_get(obj, "keyframes");
    for (size_t i = 0; json_is_array(kl) && i < json_array_size(kl); i++) {
        json_t *k = json_array_get(kl, i), *v = json_object_get(k, "image");
        char what[32];
        snprintf(what, sizeof what, "keyframes[%zu]", i);
        if (!json_is_object(k) || !v)
            return H3_ERR(H3_ERR_INVALID,
                          "keyframes[%zu] must be {\"image\": base64 image, \"frame\": a frame from 0}", i);
        H3_TRY(fn(k, "image", v, what, user));
    }
    return H3_OK;
}

static h3_status store_fn(json_t *holder, const char *key, json_t *v, const char *what, void *user) {
    char ref[64];
    H3_TRY(store_one(v, what, user, ref));
    json_t *r = json_string(ref);
    if (!r || json_object_set_new(holder, key, r)) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    return H3_OK;
}

static h3_status remove_fn(json_t *holder, const char *key, json_t *v, const char *what, void *user) {
    (void)holder;
    (void)key;
    (void)what;
    const char *s = json_string_value(v);
    if (is_upload_ref(s)) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", (const char *)user, s + strlen(UPLOAD_PREFIX));
        unlink(path);
    }
    return H3_OK;
}

h3_status h3_serve_store_uploads(json_t *obj, const char *uploads_dir) {
    if (!json_is_object(obj)) return H3_OK; /* the parser says what is wrong */
    h3_status st = each_image(obj, store_fn, (void *)uploads_dir);
    if (st != H3_OK) { /* what was written goes */
        h3_error_state kept;
        h3_error_save(&kept);
        h3_serve_remove_uploads(obj, uploads_dir);
        h3_error_restore(&kept);
    }
    return st;
}

void h3_serve_remove_uploads(json_t *obj, const char *uploads_dir) {
    if (!json_is_object(obj)) return;
    (void)each_image(obj, remove_fn, (void *)uploads_dir);
    h3_clear_error();
}

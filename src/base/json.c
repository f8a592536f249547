#include "base/json.h"

#include <pthread.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"

/* jansson's allocations are counted but not failure-injected: its lexer ignores a failed buffer growth and reads
 * past the buffer (jansson 2.14), so an injected failure there would test jansson, not h3run. A real exhaustion
 * inside jansson is reported as out of memory through the failed-allocation count below. */
static void *jmalloc(size_t n) {
    return h3_malloc_uninjected(n, H3_MEM_IO);
}

static pthread_once_t g_json_once = PTHREAD_ONCE_INIT;

static void json_init_once(void) {
    json_set_alloc_funcs(jmalloc, h3_free);
}

void h3_json_init(void) {
    pthread_once(&g_json_once, json_init_once);
}

h3_status h3_json_parse(const char *text, size_t len, const char *what, json_t **out) {
    h3_json_init();
    json_error_t err;
    int64_t failed_before = h3_mem_failed_count();
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!*out) {
        /* jansson reports some allocation failures as syntax errors: trust the allocator's count instead. */
        if (json_error_code(&err) == json_error_out_of_memory || h3_mem_failed_count() != failed_before)
            return H3_ERR(H3_ERR_NOMEM, "out of memory while parsing %s", what);
        return H3_ERR(H3_ERR_FORMAT, "%s is not valid JSON: %s (line %d, column %d)", what, err.text, err.line,
                      err.column);
    }
    if (h3_mem_failed_count() != failed_before) {
        /* jansson can drop bytes of a string when an allocation fails and still return a value. */
        json_decref(*out);
        *out = NULL;
        return H3_ERR(H3_ERR_NOMEM, "out of memory while parsing %s", what);
    }
    return H3_OK;
}

h3_status h3_json_load_file(const char *path, size_t max_size, json_t **out) {
    char *buf;
    size_t n;
    *out = NULL;
    H3_TRY(h3_read_file(path, max_size, &buf, &n));
    h3_status s = h3_json_parse(buf, n, path, out);
    h3_free(buf);
    return s;
}

int h3_json_get_int(const json_t *obj, const char *key, int64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == (double)(int64_t)d) {
            *out = (int64_t)d;
            return 1;
        }
    }
    return 0;
}

int h3_json_get_num(const json_t *obj, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || !json_is_number(v)) return 0;
    *out = json_number_value(v);
    return 1;
}

const char *h3_json_get_str(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return (v && json_is_string(v)) ? json_string_value(v) : NULL;
}

h3_status h3_json_dumps(const json_t *j, size_t flags, char **out) {
    h3_json_init();
    int64_t failed_before = h3_mem_failed_count();
    *out = json_dumps(j, flags);
    if (!*out || h3_mem_failed_count() != failed_before) {
        h3_free(*out);
        *out = NULL;
        return H3_ERR(H3_ERR_NOMEM, "out of memory serializing JSON");
    }
    return H3_OK;
}

/* JSON through jansson, with its allocations routed through h3_malloc (counted, failure-injectable) and
 * errors that name the file, line and column. */
#ifndef H3_BASE_JSON_H
#define H3_BASE_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Parses `len` bytes; `what` names the source in messages (a path, or "header of X"). Duplicate keys are
 * rejected. */
h3_status h3_json_parse(const char *text, size_t len, const char *what, json_t **out);
h3_status h3_json_load_file(const char *path, size_t max_size, json_t **out);

/* json_dumps that notices allocation failures jansson hides (it can return truncated text): the result is from
 * h3_malloc (free with h3_free). */
h3_status h3_json_dumps(const json_t *j, size_t flags, char **out);

/* Typed lookups. They return 0 when the key is absent or of the wrong type. */
int h3_json_get_int(const json_t *obj, const char *key, int64_t *out);
int h3_json_get_num(const json_t *obj, const char *key, double *out);
const char *h3_json_get_str(const json_t *obj, const char *key);

void h3_json_init(void);

#endif

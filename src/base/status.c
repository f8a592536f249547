#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define H3_ERRMSG_MAX 2048

typedef struct {
    int code;
    const char *file;
    int line;
    char msg[H3_ERRMSG_MAX];
    char full[H3_ERRMSG_MAX + 256];
} h3_error_slot;

static _Thread_local h3_error_slot g_err;

static const char *const g_code_names[H3_CODE_COUNT] = {
    [H3_OK] = "ok",
    [H3_ERR_NOMEM] = "out of memory",
    [H3_ERR_IO] = "i/o error",
    [H3_ERR_FORMAT] = "format error",
    [H3_ERR_INVALID] = "invalid argument",
    [H3_ERR_UNSUPPORTED] = "unsupported",
    [H3_ERR_NOT_FOUND] = "not found",
    [H3_ERR_BUDGET] = "does not fit the memory budget",
    [H3_ERR_DEVICE] = "device error",
    [H3_ERR_INTERNAL] = "internal error",
    [H3_ERR_INTERRUPTED] = "interrupted",
};

const char *h3_code_name(int code) {
    if (code < 0 || code >= H3_CODE_COUNT) return "unknown error";
    return g_code_names[code];
}

int h3_error_set(int code, const char *file, int line, const char *fmt, ...) {
    g_err.code = code;
    g_err.file = file;
    g_err.line = line;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err.msg, sizeof g_err.msg, fmt, ap);
    va_end(ap);
    return code;
}

int h3_error_wrap(int code, const char *fmt, ...) {
    char ctx[H3_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    char tmp[H3_ERRMSG_MAX];
    if (g_err.code == H3_OK || g_err.msg[0] == 0) {
        /* Nothing recorded (a caller returned a bare code): record the context alone. */
        g_err.code = code;
        g_err.file = "?";
        g_err.line = 0;
        snprintf(g_err.msg, sizeof g_err.msg, "%s: %s", ctx, h3_code_name(code));
        return code;
    }
    snprintf(tmp, sizeof tmp, "%s: %s", ctx, g_err.msg);
    memcpy(g_err.msg, tmp, sizeof tmp);
    g_err.code = code;
    return code;
}

const char *h3_last_error(void) {
    if (g_err.code == H3_OK) return "";
    /* Strip the source directory prefix so origins read "src/io/safetensors.c:12". */
    const char *f = g_err.file ? g_err.file : "?";
    const char *s = strstr(f, "/src/");
    if (s) f = s + 1;
    snprintf(g_err.full, sizeof g_err.full, "%s (%s:%d)", g_err.msg, f, g_err.line);
    return g_err.full;
}

const char *h3_last_error_message(void) {
    return g_err.code == H3_OK ? "" : g_err.msg;
}

int h3_last_error_code(void) {
    return g_err.code;
}

void h3_clear_error(void) {
    g_err.code = H3_OK;
    g_err.msg[0] = 0;
    g_err.file = NULL;
    g_err.line = 0;
}

void h3_error_save(h3_error_state *s) {
    s->code = g_err.code;
    s->file = g_err.file;
    s->line = g_err.line;
    memcpy(s->msg, g_err.msg, sizeof s->msg);
}

void h3_error_restore(const h3_error_state *s) {
    g_err.code = s->code;
    g_err.file = s->file;
    g_err.line = s->line;
    memcpy(g_err.msg, s->msg, sizeof s->msg);
}

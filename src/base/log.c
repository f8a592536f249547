#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>

static h3_log_fn g_log_fn;
static void *g_log_user;
static h3_log_level g_log_min = H3_LOG_INFO;

void h3_log_set_callback(h3_log_fn fn, void *user, h3_log_level min_level) {
    g_log_fn = fn;
    g_log_user = user;
    g_log_min = min_level;
}

int h3_log_enabled(h3_log_level level) {
    return g_log_fn != NULL && level >= g_log_min;
}

void h3_log(h3_log_level level, const char *fmt, ...) {
    if (!h3_log_enabled(level)) return;
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_log_fn(level, buf, g_log_user);
}

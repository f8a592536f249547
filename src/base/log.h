/* Logging through the callback installed with h3_log_set_callback. The library never prints by itself. */
#ifndef H3_BASE_LOG_H
#define H3_BASE_LOG_H

#include "base/status.h"

void h3_log(h3_log_level level, const char *fmt, ...) H3_PRINTF(2, 3);
int h3_log_enabled(h3_log_level level);

#define H3_DEBUG(...) h3_log(H3_LOG_DEBUG, __VA_ARGS__)
#define H3_INFO(...) h3_log(H3_LOG_INFO, __VA_ARGS__)
#define H3_WARN(...) h3_log(H3_LOG_WARN, __VA_ARGS__)

#endif

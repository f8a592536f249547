/* Status codes that carry where they came from.
 *
 * A failing function records a message on the calling thread and returns its code:
 *     return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s' has %d dims; the format allows at most %d", path, name, n, 8);
 * Callers that add context wrap the message already recorded:
 *     H3_TRY_CTX(st_open(path, &f), "loading the DiT from %s", dir);
 * which yields "loading the DiT from X: <inner message>" while keeping the innermost file:line.
 */
#ifndef H3_BASE_STATUS_H
#define H3_BASE_STATUS_H

#include "h3run.h"

#if defined(__GNUC__)
#define H3_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define H3_NODISCARD __attribute__((warn_unused_result))
#else
#define H3_PRINTF(a, b)
#define H3_NODISCARD
#endif

/* Record an error (code, origin, formatted message) for this thread; returns code. */
int h3_error_set(int code, const char *file, int line, const char *fmt, ...) H3_PRINTF(4, 5);
/* Prefix the message of the error already recorded with "context: ", keeping its code and origin. */
int h3_error_wrap(int code, const char *fmt, ...) H3_PRINTF(2, 3);

#define H3_ERR(code, ...) h3_error_set((code), __FILE__, __LINE__, __VA_ARGS__)

/* The thread's recorded error, kept across cleanup that records and clears errors of its own (a free that syncs a
 * stream after a failure must not wipe the failure's message). */
typedef struct h3_error_state {
    int code;
    const char *file;
    int line;
    char msg[2048];
} h3_error_state;
void h3_error_save(h3_error_state *s);
void h3_error_restore(const h3_error_state *s);

/* Evaluate an h3_status expression; return it from the enclosing function when it is not H3_OK. */
#define H3_TRY(expr)                                                                                         \
    do {                                                                                                       \
        h3_status h3__s = (expr);                                                                              \
        if (h3__s != H3_OK) return h3__s;                                                                      \
    } while (0)

/* Same, adding context to the message. */
#define H3_TRY_CTX(expr, ...)                                                                                \
    do {                                                                                                       \
        h3_status h3__s = (expr);                                                                              \
        if (h3__s != H3_OK) return h3_error_wrap(h3__s, __VA_ARGS__);                                          \
    } while (0)

/* Jump-to-cleanup variant: sets `st` and jumps to label `done` on failure. */
#define H3_CHECK(expr)                                                                                       \
    do {                                                                                                       \
        st = (expr);                                                                                           \
        if (st != H3_OK) goto done;                                                                            \
    } while (0)

#define H3_CHECK_CTX(expr, ...)                                                                              \
    do {                                                                                                       \
        st = (expr);                                                                                           \
        if (st != H3_OK) {                                                                                     \
            st = h3_error_wrap(st, __VA_ARGS__);                                                               \
            goto done;                                                                                         \
        }                                                                                                      \
    } while (0)

#define H3_FAIL(code, ...)                                                                                   \
    do {                                                                                                       \
        st = H3_ERR((code), __VA_ARGS__);                                                                      \
        goto done;                                                                                             \
    } while (0)

#endif

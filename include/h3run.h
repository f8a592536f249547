/* h3run: run MiniMax-H3 (joint audio+video diffusion) on GPUs smaller than the model.
 *
 * The public C API. The library never writes to stdout or stderr by itself: every message goes through the
 * log callback (h3_log_set_callback), and every failure is a status code whose message and origin
 * (file:line) are available through h3_last_error() on the calling thread.
 */
#ifndef H3RUN_H
#define H3RUN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define H3RUN_VERSION "0.1.0"

/* ---- status codes ---------------------------------------------------------------------------------- */

typedef enum h3_code {
    H3_OK = 0,
    H3_ERR_NOMEM,       /* an allocation failed (host, pinned or device) */
    H3_ERR_IO,          /* open/read/write/mmap failed */
    H3_ERR_FORMAT,      /* a file is malformed (safetensors header, JSON, tokenizer...) */
    H3_ERR_INVALID,     /* a caller passed a bad value (shape, dtype, request) */
    H3_ERR_UNSUPPORTED, /* valid but not implemented here (missing kernel, unknown quant format) */
    H3_ERR_NOT_FOUND,   /* a named tensor, file or component is absent */
    H3_ERR_BUDGET,      /* the plan does not fit the memory budget */
    H3_ERR_DEVICE,      /* CUDA runtime or cuBLAS failure */
    H3_ERR_INTERNAL,    /* an invariant broke: a bug in h3run */
    H3_ERR_INTERRUPTED, /* stopped by a signal or by the caller */
    H3_CODE_COUNT
} h3_code;

/* Every fallible function returns an h3_status: H3_OK (0) or an h3_code. */
typedef int h3_status;

/* Name of a code ("format error", ...). Never NULL. */
const char *h3_code_name(int code);

/* Message of the last error raised on this thread, with its origin: "src/io/safetensors.c:212: ...".
 * Empty string when there was none. Valid until the next error on this thread. */
const char *h3_last_error(void);
/* The message alone, without the origin. */
const char *h3_last_error_message(void);
/* The code of the last error on this thread (H3_OK when cleared). */
int h3_last_error_code(void);
void h3_clear_error(void);

/* ---- logging ----------------------------------------------------------------------------------------- */

typedef enum h3_log_level { H3_LOG_DEBUG = 0, H3_LOG_INFO, H3_LOG_WARN, H3_LOG_ERROR } h3_log_level;
typedef void (*h3_log_fn)(h3_log_level level, const char *msg, void *user);

/* Install the callback (NULL: messages are dropped, the default). Messages below min_level are dropped. */
void h3_log_set_callback(h3_log_fn fn, void *user, h3_log_level min_level);

/* ---- memory accounting ------------------------------------------------------------------------------- */

typedef enum h3_mem_category {
    H3_MEM_WEIGHTS = 0, /* model weights copied or converted into memory */
    H3_MEM_ACTIVATIONS, /* tensors that flow between ops */
    H3_MEM_WORKSPACE,   /* scratch inside one op (GEMM tiles, attention tiles) */
    H3_MEM_IO,          /* file headers, tokenizer tables, media buffers */
    H3_MEM_OTHER,
    H3_MEM_CATEGORY_COUNT
} h3_mem_category;

typedef struct h3_mem_stats {
    int64_t current[H3_MEM_CATEGORY_COUNT];
    int64_t peak[H3_MEM_CATEGORY_COUNT];
    int64_t total_current, total_peak;
    int64_t n_allocs, n_frees;
} h3_mem_stats;

/* Host-memory counters of the allocation wrapper (h3_malloc & co). */
void h3_mem_get_stats(h3_mem_stats *out);
void h3_mem_reset_peaks(void);
const char *h3_mem_category_name(int category);

/* Test hook: make the n-th allocation from now (1-based) fail, and every later one if sticky is nonzero.
 * n = 0 disables injection. Returns the number of allocations counted since the last call. */
int64_t h3_mem_fail_at(int64_t n, int sticky);

/* ---- stopping a run ---------------------------------------------------------------------------------- */

/* Asks every h3run computation in the process to stop: each op checks the flag before it starts, the long CPU
 * kernels between their pieces (GEMM row blocks and weight panels, attention query tiles, convolution
 * chunks), and they return H3_ERR_INTERRUPTED, which every caller propagates; a run therefore ends within a
 * fraction of a second of the request. Async-signal-safe: a SIGINT/SIGTERM handler may call it. The flag
 * stays set until h3_cancel_reset. */
void h3_cancel_request(void);
void h3_cancel_reset(void);
/* Nonzero once h3_cancel_request was called (and not reset). */
int h3_cancel_requested(void);

#ifdef __cplusplus
}
#endif
#endif /* H3RUN_H */

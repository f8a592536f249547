/* The memory report: predicted vs measured peak device memory per category, achieved copy bandwidth, and the
 * device memory timeline (--memory-trace).
 *
 * Measurement: an observer on the device arena (h3_cuda_set_alloc_observer) sees every allocation and free;
 * each allocation is counted under the category current when it was made (set by whoever allocates: the
 * streamer for resident weights and slots, the caller around the modulation and the forwards), so each
 * category's own peak and the arena's peak are measured, not inferred. The timeline keeps one point per
 * allocation and free (up to H3_MEMREP_MAX_POINTS, then every other point is dropped and the step doubles)
 * plus named marks. One report per process (the arena has one observer).
 */
#ifndef H3_MEM_REPORT_H
#define H3_MEM_REPORT_H

#include <stdint.h>

#include "base/status.h"
#include "tensor/ops.h"

typedef enum h3_devcat {
    H3_DEVCAT_BACKEND = 0, /* what the backend reserves at start-up (cuBLASLt workspace) */
    H3_DEVCAT_WEIGHTS,     /* resident weights: non-block weights and resident blocks */
    H3_DEVCAT_SLOTS,       /* stream slots */
    H3_DEVCAT_MODULATION,  /* the kept AdaLN modulation and its computation */
    H3_DEVCAT_ACTIVATIONS, /* forward buffers, inputs/outputs, op scratch */
    H3_DEVCAT_LORA,        /* LoRA factors of the side path and its scratch, the merge's transient scratch */
    H3_DEVCAT_COUNT
} h3_devcat;
const char *h3_devcat_name(h3_devcat c);

#define H3_MEMREP_MAX_POINTS 65536

typedef struct h3_memrep h3_memrep;

/* Installs the arena observer (when there is a device; without one the report holds predictions only). What
 * the arena holds already is counted as BACKEND. */
h3_status h3_memrep_create(h3_exec *ex, h3_memrep **out);
void h3_memrep_free(h3_memrep *r);
/* bytes of what the arena held when the report began (counted as BACKEND) are c's: weights a stage finds placed
 * by an earlier one (a kept DiT placement). */
void h3_memrep_carry(h3_memrep *r, h3_devcat c, int64_t bytes);
/* Allocations from now on count under c; returns the previous category. */
h3_devcat h3_memrep_set_category(h3_memrep *r, h3_devcat c);
/* A named mark in the timeline ("dit: forward 3"). */
void h3_memrep_mark(h3_memrep *r, const char *name);
/* The plan's predictions (bytes per category and the peak) for the comparison. */
void h3_memrep_set_predicted(h3_memrep *r, const int64_t pred[H3_DEVCAT_COUNT], int64_t peak, int64_t budget);
/* Copy figures to report: bytes, device milliseconds timed, and the ceiling they compare with (GB/s, 0:
 * none). */
void h3_memrep_set_copies(h3_memrep *r, int64_t bytes, double ms, int64_t bytes_timed, double ceiling_gbs);

typedef struct h3_memrep_figures {
    int64_t peak[H3_DEVCAT_COUNT], current[H3_DEVCAT_COUNT];
    int64_t total_peak; /* the arena's peak while observed */
    int64_t predicted[H3_DEVCAT_COUNT], predicted_peak, budget;
} h3_memrep_figures;
void h3_memrep_get(const h3_memrep *r, h3_memrep_figures *out);
/* The report for people (h3_malloc'd): one line per category, predicted, measured and the difference, the
 * peak against the budget, and the copy bandwidth achieved vs the ceiling. NULL when out of memory. */
char *h3_memrep_format(const h3_memrep *r);
/* {"budget": B, "predicted_peak": P, "points": [[t_s, used, category, delta], ...], "marks": [[t_s, used,
 * name],
 * ...], "peaks": {...}} */
h3_status h3_memrep_write_trace(const h3_memrep *r, const char *path);

#endif

/* The memory report and trace (report.h). */
#include "mem/report.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "mem/budget.h"
#include "cuda/cuda.h"

#define MAP_CAP   65536 /* live device blocks tracked (a DiT stage holds a few hundred) */
#define MAX_MARKS 4096

typedef struct live {
    const void *p;
    int64_t bytes;
    int cat;
} live;

typedef struct point {
    double t;
    int64_t used, delta;
    int cat;
} point;

typedef struct mark {
    double t;
    int64_t used;
    char name[56];
} mark;

struct h3_memrep {
    int observing;
    h3_devcat cur;
    int64_t current[H3_DEVCAT_COUNT], peak[H3_DEVCAT_COUNT], total_peak, used;
    live *map; /* open addressing on the block address */
    int64_t untracked;
    point *pts;
    int n_pts, step, skip;
    mark *marks;
    int n_marks;
    double t0;
    int64_t predicted[H3_DEVCAT_COUNT], predicted_peak, budget;
    int64_t copy_bytes, copy_bytes_timed;
    double copy_ms, ceiling_gbs;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *h3_devcat_name(h3_devcat c) {
    static const char *n[] = {"backend workspace", "resident weights", "stream slots",
                              "modulation",        "activations",      "LoRA factors"};
    return (unsigned)c < H3_DEVCAT_COUNT ? n[c] : "?";
}

static size_t slot_of(const void *p) {
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (size_t)(h & (MAP_CAP - 1));
}

static void add_point(h3_memrep *r, int64_t delta, int cat) {
    if (r->skip++ % r->step) return;
    if (r->n_pts == H3_MEMREP_MAX_POINTS) { /* keep every other point, take every other from now on */
        for (int i = 0; i < r->n_pts / 2; i++) r->pts[i] = r->pts[2 * i];
        r->n_pts /= 2;
        r->step *= 2;
    }
    r->pts[r->n_pts++] = (point){now_s() - r->t0, r->used, delta, cat};
}

static void observe(void *user, const void *p, int64_t delta, int64_t used) {
    h3_memrep *r = user;
    r->used = used;
    if (used > r->total_peak) r->total_peak = used;
    int cat = r->cur;
    if (delta > 0) {
        size_t i = slot_of(p), n = 0;
        while (r->map[i].p && n < MAP_CAP) {
            i = (i + 1) & (MAP_CAP - 1);
            n++;
        }
        if (n < MAP_CAP)
            r->map[i] = (live){p, delta, cat};
        else
            r->untracked += delta;
        r->current[cat] += delta;
        if (r->current[cat] > r->peak[cat]) r->peak[cat] = r->current[cat];
    } else {
        size_t i = slot_of(p), n = 0;
        while (r->map[i].p != p && n < MAP_CAP) {
            if (!r->map[i].p && !r->map[i].bytes) break; /* never used: not here */
            i = (i + 1) & (MAP_CAP - 1);
            n++;
        }
        if (r->map[i].p == p) {
            cat = r->map[i].cat;
            r->map[i].p = NULL; /* a tombstone: bytes stay nonzero so probing continues past it */
            r->map[i].bytes = 1;
        } else {
            cat = H3_DEVCAT_BACKEND; /* allocated before the report began */
        }
        r->current[cat] += delta;
    }
    add_point(r, delta, cat);
}

h3_status h3_memrep_create(h3_exec *ex, h3_memrep **out) {
    *out = NULL;
    h3_memrep *r = h3_calloc(1, sizeof *r, H3_MEM_OTHER);
    if (!r) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    r->map = h3_calloc(MAP_CAP, sizeof *r->map, H3_MEM_OTHER);
    r->pts = h3_calloc(H3_MEMREP_MAX_POINTS, sizeof *r->pts, H3_MEM_OTHER);
    r->marks = h3_calloc(MAX_MARKS, sizeof *r->marks, H3_MEM_OTHER);
    if (!r->map || !r->pts || !r->marks) {
        h3_memrep_free(r);
        return H3_ERR(H3_ERR_NOMEM, "out of memory");
    }
    r->step = 1;
    r->t0 = now_s();
    r->cur = H3_DEVCAT_ACTIVATIONS;
    if (ex && ex->cuda) {
        int64_t used = 0, peak = 0, cap = 0;
        h3_cuda_mem_stats(ex, &used, &peak, &cap);
        r->used = r->total_peak = used;
        r->current[H3_DEVCAT_BACKEND] = r->peak[H3_DEVCAT_BACKEND] = used;
        r->budget = cap;
        h3_cuda_set_alloc_observer(observe, r);
        r->observing = 1;
    }
    *out = r;
    return H3_OK;
}

void h3_memrep_carry(h3_memrep *r, h3_devcat c, int64_t bytes) {
    if (!r || (unsigned)c >= H3_DEVCAT_COUNT || c == H3_DEVCAT_BACKEND || bytes <= 0) return;
    if (bytes > r->current[H3_DEVCAT_BACKEND]) bytes = r->current[H3_DEVCAT_BACKEND];
    r->current[H3_DEVCAT_BACKEND] -= bytes;
    r->peak[H3_DEVCAT_BACKEND] -= bytes;
    r->current[c] += bytes;
    if (r->current[c] > r->peak[c]) r->peak[c] = r->current[c];
}

void h3_memrep_free(h3_memrep *r) {
    if (!r) return;
    if (r->observing) h3_cuda_set_alloc_observer(NULL, NULL);
    h3_free(r->map);
    h3_free(r->pts);
    h3_free(r->marks);
    h3_free(r);
}

h3_devcat h3_memrep_set_category(h3_memrep *r, h3_devcat c) {
    h3_devcat prev = r->cur;
    if ((unsigned)c < H3_DEVCAT_COUNT) r->cur = c;
    return prev;
}

void h3_memrep_mark(h3_memrep *r, const char *name) {
    if (r->n_marks == MAX_MARKS) return;
    mark *m = &r->marks[r->n_marks++];
    m->t = now_s() - r->t0;
    m->used = r->used;
    snprintf(m->name, sizeof m->name, "%s", name ? name : "");
}

void h3_memrep_set_predicted(h3_memrep *r, const int64_t pred[H3_DEVCAT_COUNT], int64_t peak,
                             int64_t budget) {
    memcpy(r->predicted, pred, sizeof r->predicted);
    r->predicted_peak = peak;
    if (budget > 0) r->budget = budget;
}

void h3_memrep_set_copies(h3_memrep *r, int64_t bytes, double ms, int64_t bytes_timed, double ceiling_gbs) {
    r->copy_bytes = bytes;
    r->copy_ms = ms;
    r->copy_bytes_timed = bytes_timed;
    r->ceiling_gbs = ceiling_gbs;
}

void h3_memrep_get(const h3_memrep *r, h3_memrep_figures *out) {
    memset(out, 0, sizeof *out);
    memcpy(out->peak, r->peak, sizeof out->peak);
    memcpy(out->current, r->current, sizeof out->current);
    out->total_peak = r->total_peak;
    memcpy(out->predicted, r->predicted, sizeof out->predicted);
    out->predicted_peak = r->predicted_peak;
    out->budget = r->budget;
}

static void appendf(char *buf, size_t n, const char *fmt, ...) H3_PRINTF(3, 4);
static void appendf(char *buf, size_t n, const char *fmt, ...) {
    size_t l = strlen(buf);
    if (l + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, n - l, fmt, ap);
    va_end(ap);
}

static void diff_str(int64_t pred, int64_t meas, char *b, size_t n) {
    if (pred <= 0)
        snprintf(b, n, "%s", meas ? "(not predicted)" : "");
    else
        snprintf(b, n, "%+.1f%%", 100.0 * ((double)meas - (double)pred) / (double)pred);
}

char *h3_memrep_format(const h3_memrep *r) {
    const size_t n = 4096;
    char *o = h3_malloc(n, H3_MEM_IO);
    if (!o) return NULL;
    o[0] = 0;
    const double G = H3_GIB;
    char d[32];
    appendf(o, n, "device memory     %-22s predicted   measured peak   difference\n", "");
    for (int c = 0; c < H3_DEVCAT_COUNT; c++) {
        diff_str(r->predicted[c], r->peak[c], d, sizeof d);
        appendf(o, n, "  %-38s %8.3f GiB   %8.3f GiB   %s\n", h3_devcat_name((h3_devcat)c),
                r->predicted[c] / G, r->peak[c] / G, d);
    }
    diff_str(r->predicted_peak, r->total_peak, d, sizeof d);
    appendf(o, n, "  %-38s %8.3f GiB   %8.3f GiB   %s   (budget %.3f GiB%s)\n", "peak, all together",
            r->predicted_peak / G, r->total_peak / G, d, r->budget / G,
            r->budget > 0 && r->total_peak > r->budget ? ": EXCEEDED" : "");
    if (!r->observing) appendf(o, n, "  (no device: nothing measured)\n");
    if (r->copy_bytes > 0) {
        double gbs = r->copy_ms > 0 ? (double)r->copy_bytes_timed / (r->copy_ms * 1e-3) / 1e9 : 0;
        appendf(o, n, "copies: %.2f GB to the device", r->copy_bytes / 1e9);
        if (gbs > 0) appendf(o, n, ", %.1f GB/s achieved", gbs);
        if (gbs > 0 && r->ceiling_gbs > 0)
            appendf(o, n, " (%.0f%% of the %.1f GB/s pinned ceiling)", 100.0 * gbs / r->ceiling_gbs,
                    r->ceiling_gbs);
        appendf(o, n, "\n");
    }
    return o;
}

h3_status h3_memrep_write_trace(const h3_memrep *r, const char *path) {
    /* Written whatever happened (a failed run is when it is wanted most), so in place now, not with the run's
     * other outputs (base/fs.h). */
    h3_outfile of;
    H3_TRY_CTX(h3_out_open(path, &of), "the memory trace");
    FILE *f = of.f;
    fprintf(f, "{\"budget\": %lld, \"predicted_peak\": %lld, \"measured_peak\": %lld,\n \"categories\": [",
            (long long)r->budget, (long long)r->predicted_peak, (long long)r->total_peak);
    for (int c = 0; c < H3_DEVCAT_COUNT; c++)
        fprintf(f, "%s{\"name\": \"%s\", \"predicted\": %lld, \"peak\": %lld}", c ? ", " : "",
                h3_devcat_name((h3_devcat)c), (long long)r->predicted[c], (long long)r->peak[c]);
    fprintf(f, "],\n \"points\": [");
    for (int i = 0; i < r->n_pts; i++)
        fprintf(f, "%s[%.6f, %lld, %d, %lld]", i ? ",\n  " : "", r->pts[i].t, (long long)r->pts[i].used,
                r->pts[i].cat, (long long)r->pts[i].delta);
    fprintf(f, "],\n \"marks\": [");
    for (int i = 0; i < r->n_marks; i++) {
        fprintf(f, "%s[%.6f, %lld, \"", i ? ",\n  " : "", r->marks[i].t, (long long)r->marks[i].used);
        for (const char *c = r->marks[i].name; *c; c++)
            if (*c == '"' || *c == '\\')
                fprintf(f, "\\%c", *c);
            else if ((unsigned char)*c >= 0x20)
                fputc(*c, f);
        fprintf(f, "\"]");
    }
    fprintf(f, "]}\n");
    H3_TRY_CTX(h3_out_commit_now(&of), "the memory trace");
    return H3_OK;
}

#include "pipeline/progress.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double mono_clock(void *user) {
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now(const h3_progress *p) {
    return p->clock(p->clock_user);
}

void h3_progress_init(h3_progress *p, h3_progress_fn fn, void *user) {
    memset(p, 0, sizeof *p);
    p->fn = fn;
    p->user = user;
    p->clock = mono_clock;
    p->t0 = now(p);
}

void h3_progress_set_clock(h3_progress *p, h3_clock_fn clock, void *clock_user) {
    p->clock = clock ? clock : mono_clock;
    p->clock_user = clock_user;
    p->t0 = now(p);
}

static double step_seconds(const h3_progress *p) {
    if (p->step <= 0) return 0.0;
    if (p->step == 1) return p->first_step_end - p->stage_t0;
    return (p->last_step_end - p->first_step_end) / (double)(p->step - 1);
}

static void emit(h3_progress *p, h3_progress_kind kind) {
    if (!p->fn) return;
    double t = now(p);
    h3_progress_event ev = {0};
    ev.kind = kind;
    ev.stage = kind == H3_PROGRESS_DONE ? NULL : p->stage;
    ev.step = p->step;
    ev.steps = p->steps;
    ev.elapsed_s = t - p->t0;
    ev.stage_s = kind == H3_PROGRESS_DONE ? 0.0 : t - p->stage_t0;
    ev.step_s = step_seconds(p);
    ev.eta_s = -1.0;
    if (p->steps > 0 && p->step > 0) ev.eta_s = ev.step_s * (double)(p->steps - p->step);
    if (kind == H3_PROGRESS_STAGE_END && p->steps > 0) ev.eta_s = 0.0;
    p->fn(&ev, p->user);
}

void h3_progress_stage(h3_progress *p, const char *stage, int steps) {
    if (p->stage) h3_progress_stage_end(p);
    p->stage = stage;
    p->steps = steps > 0 ? steps : 0;
    p->step = 0;
    p->stage_t0 = now(p);
    p->first_step_end = p->last_step_end = p->stage_t0;
    emit(p, H3_PROGRESS_STAGE_BEGIN);
}

void h3_progress_step(h3_progress *p) {
    if (!p->stage) return;
    double t = now(p);
    p->step++;
    if (p->step == 1) p->first_step_end = t;
    p->last_step_end = t;
    emit(p, H3_PROGRESS_STEP);
}

void h3_progress_stage_end(h3_progress *p) {
    if (!p->stage) return;
    emit(p, H3_PROGRESS_STAGE_END);
    p->stage = NULL;
    p->step = p->steps = 0;
}

void h3_progress_done(h3_progress *p) {
    if (p->stage) h3_progress_stage_end(p);
    emit(p, H3_PROGRESS_DONE);
}

/* ---- printer
 * --------------------------------------------------------------------------------------------------- */

const char *h3_progress_fmt_time(double s, char *buf, size_t n) {
    if (!(s >= 0.0) || !isfinite(s)) {
        snprintf(buf, n, "?");
        return buf;
    }
    long long t = (long long)llround(s);
    if (t >= 3600)
        snprintf(buf, n, "%lld:%02lld:%02lld", t / 3600, (t / 60) % 60, t % 60);
    else
        snprintf(buf, n, "%lld:%02lld", t / 60, t % 60);
    return buf;
}

h3_progress_style h3_progress_auto_style(FILE *out) {
    return isatty(fileno(out)) ? H3_PROGRESS_BAR : H3_PROGRESS_LINES;
}

void h3_progress_printer_init(h3_progress_printer *pp, FILE *out, h3_progress_style style) {
    pp->out = out;
    pp->style = style;
    pp->bar_open = 0;
    pp->last_line_s = 0;
}

static const char *kind_name(h3_progress_kind k) {
    switch (k) {
        case H3_PROGRESS_STAGE_BEGIN:
            return "stage_begin";
        case H3_PROGRESS_STEP:
            return "step";
        case H3_PROGRESS_STAGE_END:
            return "stage_end";
        case H3_PROGRESS_DONE:
            return "done";
    }
    return "?";
}

/* Appends to buf at *at (bounded by n; *at counts what would have been written). */
static void put(char *buf, size_t n, size_t *at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(*at < n ? buf + *at : NULL, *at < n ? n - *at : 0, fmt, ap);
    va_end(ap);
    if (k > 0) *at += (size_t)k;
}

size_t h3_progress_json(const h3_progress_event *ev, char *buf, size_t n) {
    size_t at = 0;
    if (n) buf[0] = 0;
    put(buf, n, &at, "{\"event\":\"%s\"", kind_name(ev->kind));
    if (ev->stage) { /* stage names are the library's own identifiers, escaped anyway */
        put(buf, n, &at, ",\"stage\":\"");
        for (const char *s = ev->stage; *s; s++) {
            unsigned char c = (unsigned char)*s;
            if (c == '"' || c == '\\')
                put(buf, n, &at, "\\%c", c);
            else if (c < 0x20)
                put(buf, n, &at, "\\u%04x", c);
            else
                put(buf, n, &at, "%c", c);
        }
        put(buf, n, &at, "\"");
    }
    if (ev->steps > 0) put(buf, n, &at, ",\"step\":%d,\"steps\":%d", ev->step, ev->steps);
    if (ev->step > 0) put(buf, n, &at, ",\"step_s\":%.3f", ev->step_s);
    if (ev->eta_s >= 0.0) put(buf, n, &at, ",\"eta_s\":%.3f", ev->eta_s);
    if (ev->kind != H3_PROGRESS_DONE) put(buf, n, &at, ",\"stage_s\":%.3f", ev->stage_s);
    put(buf, n, &at, ",\"elapsed_s\":%.3f}", ev->elapsed_s);
    return at;
}

static void print_json(FILE *f, const h3_progress_event *ev) {
    char line[512];
    h3_progress_json(ev, line, sizeof line);
    fprintf(f, "%s\n", line);
}

/* One line per stage start and end; a step only when H3_PROGRESS_LINE_INTERVAL_S has passed since the stage's
 * last line (a log of a fast stage, the text encoder's 50 layers in a second, is two lines, not fifty). */
static void print_line(h3_progress_printer *pp, const h3_progress_event *ev) {
    FILE *f = pp->out;
    char a[32], b[32], c[32];
    if (ev->kind == H3_PROGRESS_STEP) {
        if (ev->elapsed_s - pp->last_line_s < H3_PROGRESS_LINE_INTERVAL_S) return;
        pp->last_line_s = ev->elapsed_s;
    } else if (ev->kind == H3_PROGRESS_STAGE_BEGIN) {
        pp->last_line_s = ev->elapsed_s;
    }
    h3_progress_fmt_time(ev->elapsed_s, a, sizeof a);
    switch (ev->kind) {
        case H3_PROGRESS_STAGE_BEGIN:
            if (ev->steps > 0)
                fprintf(f, "%s: started (%d steps), elapsed %s\n", ev->stage, ev->steps, a);
            else
                fprintf(f, "%s: started, elapsed %s\n", ev->stage, a);
            break;
        case H3_PROGRESS_STEP:
            fprintf(f, "%s: step %d/%d, %.2f s/step, ETA %s, elapsed %s\n", ev->stage, ev->step, ev->steps,
                    ev->step_s, h3_progress_fmt_time(ev->eta_s, b, sizeof b), a);
            break;
        case H3_PROGRESS_STAGE_END:
            fprintf(f, "%s: done in %s, elapsed %s\n", ev->stage,
                    h3_progress_fmt_time(ev->stage_s, c, sizeof c), a);
            break;
        case H3_PROGRESS_DONE:
            fprintf(f, "finished in %s\n", a);
            break;
    }
}

static void print_bar(h3_progress_printer *pp, const h3_progress_event *ev) {
    FILE *f = pp->out;
    char a[32], b[32], c[32];
    h3_progress_fmt_time(ev->elapsed_s, a, sizeof a);
    if (ev->kind == H3_PROGRESS_STEP || (ev->kind == H3_PROGRESS_STAGE_BEGIN && ev->steps > 0)) {
        enum { W = 30 };
        int fill = ev->steps > 0 ? (int)((long long)W * ev->step / ev->steps) : 0;
        char bar[W + 1];
        for (int i = 0; i < W; i++) bar[i] = i < fill ? '#' : '.';
        bar[W] = 0;
        fprintf(f, "\r\033[K%-12s [%s] %d/%d", ev->stage, bar, ev->step, ev->steps);
        if (ev->step > 0)
            fprintf(f, "  %.2f s/step  ETA %s", ev->step_s, h3_progress_fmt_time(ev->eta_s, b, sizeof b));
        fprintf(f, "  elapsed %s", a);
        pp->bar_open = 1;
    } else if (ev->kind == H3_PROGRESS_STAGE_BEGIN) {
        fprintf(f, "\r\033[K%-12s ...  elapsed %s", ev->stage, a);
        pp->bar_open = 1;
    } else if (ev->kind == H3_PROGRESS_STAGE_END) {
        fprintf(f, "\r\033[K%-12s done in %s  elapsed %s\n", ev->stage,
                h3_progress_fmt_time(ev->stage_s, c, sizeof c), a);
        pp->bar_open = 0;
    } else {
        if (pp->bar_open) fputc('\n', f);
        fprintf(f, "finished in %s\n", a);
        pp->bar_open = 0;
    }
}

void h3_progress_print(const h3_progress_event *ev, void *printer) {
    h3_progress_printer *pp = printer;
    if (!pp || !pp->out) return;
    switch (pp->style) {
        case H3_PROGRESS_QUIET:
            return;
        case H3_PROGRESS_LINES:
            print_line(pp, ev);
            break;
        case H3_PROGRESS_BAR:
            print_bar(pp, ev);
            break;
        case H3_PROGRESS_JSON:
            print_json(pp->out, ev);
            break;
    }
    fflush(pp->out);
}

/* Progress of a generate run: stages that take turns (tokenize, text_encoder, dit, video_vae, audio_vae,
 * mux), steps within a stage, seconds per step, ETA and elapsed time. The library reports through a callback
 * and never prints; h3_progress_printer is the stderr printer the CLI installs (a bar on a terminal, plain
 * lines otherwise, JSON lines for programs, or nothing).
 */
#ifndef H3_PIPELINE_PROGRESS_H
#define H3_PIPELINE_PROGRESS_H

#include <stdio.h>

typedef enum h3_progress_kind {
    H3_PROGRESS_STAGE_BEGIN = 0,
    H3_PROGRESS_STEP,
    H3_PROGRESS_STAGE_END,
    H3_PROGRESS_DONE
} h3_progress_kind;

typedef struct h3_progress_event {
    h3_progress_kind kind;
    const char *stage; /* "tokenize", "text_encoder", "dit", ...; NULL for DONE */
    int step,
        steps; /* step done (1..steps) within the stage; steps 0 when the stage is not counted in steps */
    double elapsed_s; /* since h3_progress_init */
    double stage_s;   /* since the stage began */
    double step_s; /* seconds per step: the mean of the steps after the first (which carries warm-up), or the
                      first step's time while it is the only one; 0 before any step */
    double eta_s;  /* estimated seconds left in the stage; -1 when unknown */
} h3_progress_event;

typedef void (*h3_progress_fn)(const h3_progress_event *ev, void *user);
typedef double (*h3_clock_fn)(void *user); /* seconds on a monotonic clock */

typedef struct h3_progress {
    h3_progress_fn fn;
    void *user;
    h3_clock_fn clock;
    void *clock_user;
    double t0, stage_t0, first_step_end, last_step_end;
    const char *stage;
    int step, steps;
} h3_progress;

/* fn may be NULL (nothing is reported). The clock is CLOCK_MONOTONIC unless h3_progress_set_clock replaces
 * it. */
void h3_progress_init(h3_progress *p, h3_progress_fn fn, void *user);
void h3_progress_set_clock(h3_progress *p, h3_clock_fn clock, void *clock_user);
/* Begins a stage (ending the previous one if it is still open). steps = 0 for a stage without steps. The
 * stage name must outlive the stage (a string literal). */
void h3_progress_stage(h3_progress *p, const char *stage, int steps);
/* One step of the current stage is done. */
void h3_progress_step(h3_progress *p);
void h3_progress_stage_end(h3_progress *p);
/* The run is finished (ends an open stage). */
void h3_progress_done(h3_progress *p);

/* ---- the CLI's printer
 * ---------------------------------------------------------------------------------------- */

typedef enum h3_progress_style {
    H3_PROGRESS_QUIET = 0, /* nothing */
    H3_PROGRESS_LINES,     /* plain lines: each stage's start and end, its steps at most one a second */
    H3_PROGRESS_BAR,       /* a bar redrawn in place on a terminal */
    H3_PROGRESS_JSON       /* one JSON object per line */
} h3_progress_style;

typedef struct h3_progress_printer {
    FILE *out;
    h3_progress_style style;
    int bar_open;       /* a bar line is on screen without its newline */
    double last_line_s; /* LINES: elapsed_s of the stage's last line, so that steps print at most once a
                           second */
} h3_progress_printer;

/* LINES prints a step when this many seconds have passed since the stage's last line (its start or a step).
 */
#define H3_PROGRESS_LINE_INTERVAL_S 1.0

/* style "auto" picks BAR when out is a terminal and LINES otherwise. */
void h3_progress_printer_init(h3_progress_printer *pp, FILE *out, h3_progress_style style);
h3_progress_style h3_progress_auto_style(FILE *out);
/* The event as one JSON object (no newline): the form --progress json prints and h3run serve sends. Writes at
 * most n bytes, NUL-terminated; returns the length the whole object needs (>= n: cut short). */
size_t h3_progress_json(const h3_progress_event *ev, char *buf, size_t n);
/* The h3_progress_fn to install with the printer as user pointer. */
void h3_progress_print(const h3_progress_event *ev, void *printer);
/* Formats seconds as "m:ss" or "h:mm:ss" into buf. */
const char *h3_progress_fmt_time(double seconds, char *buf, size_t n);

#endif

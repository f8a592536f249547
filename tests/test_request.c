/* Request validation (src/pipeline/request): every rule, its exact suggestion and its warning; and progress
 * reporting (src/pipeline/progress): events, seconds per step and ETA on a scripted clock, and the printer's
 * three styles. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "pipeline/progress.h"
#include "pipeline/request.h"
#include "pipeline/turbo.h"
#include "testutil.h"

/* ---- frames
 * ------------------------------------------------------------------------------------------------------ */

static int valid_frames(int64_t f) {
    return f >= 5 && (f - 5) % 17 == 0;
}

static void test_frames(void) {
    h3_request_warnings w = {0};
    /* Every count up to 400: valid iff 17n+5; a bad one names the nearest valid counts below and above. */
    for (int64_t f = -3; f <= 400; f++) {
        w.n = 0;
        h3_clear_error();
        h3_status st = h3_request_check_frames(f, &w);
        if (valid_frames(f)) {
            CHECK(st == H3_OK, "%lld frames rejected: %s", (long long)f, h3_last_error());
            int untrained = f < 96 || f > 360;
            CHECK(w.n == untrained, "%lld frames: %d warnings", (long long)f, w.n);
            if (untrained && w.n) CHECK(strstr(w.msg[0], "4-15 s") != NULL, "%s", w.msg[0]);
            continue;
        }
        CHECK(st == H3_ERR_INVALID, "%lld frames accepted", (long long)f);
        if (f <= 0) {
            CHECK(strstr(h3_last_error_message(), "positive") != NULL, "%s", h3_last_error_message());
            continue;
        }
        int64_t lo = f, hi = f;
        while (lo > 0 && !valid_frames(lo)) lo--;
        while (!valid_frames(hi)) hi++;
        char want[96];
        if (lo >= 5)
            snprintf(want, sizeof want, "got %lld: use %lld or %lld", (long long)f, (long long)lo,
                     (long long)hi);
        else
            snprintf(want, sizeof want, "got %lld: use 5 or 22", (long long)f);
        CHECK(strstr(h3_last_error_message(), want) != NULL, "%lld frames: '%s' lacks '%s'", (long long)f,
              h3_last_error_message(), want);
        CHECK(strstr(h3_last_error_message(), "17n+5") != NULL);
    }
    CHECK_ERR(h3_request_check_frames(120, NULL), H3_ERR_INVALID,
              "frames must be 17n+5 (the video VAE works in 17-frame chunks); got 120: use 107 or 124");
    CHECK_ERR(h3_request_check_frames(H3_MAX_FRAMES + 1, NULL), H3_ERR_INVALID, "at most");
    /* Trained range: 107..345 quiet, 90 and 362 warn. */
    w.n = 0;
    CHECK_OK(h3_request_check_frames(107, &w));
    CHECK_OK(h3_request_check_frames(345, &w));
    CHECK(w.n == 0);
    CHECK_OK(h3_request_check_frames(362, &w));
    CHECK(w.n == 1 && strstr(w.msg[0], "362 frames is 15.08 s") != NULL, "%s", w.msg[0]);
}

static void test_seconds(void) {
    static const struct {
        double s;
        int64_t f;
    } cases[] = {{5, 124},      {4, 107},     {4.5, 124}, {10, 243}, {15, 362}, {14.4, 362},
                 {14.375, 345}, {0.9375, 22}, {0.01, 5},  {1, 39},   {0.2, 5}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t f = 0;
        CHECK_OK(h3_request_frames_from_seconds(cases[i].s, &f));
        CHECK(f == cases[i].f, "%g s -> %lld frames, expected %lld", cases[i].s, (long long)f,
              (long long)cases[i].f);
    }
    /* In general: the smallest 17n+5 >= max(5, round(24 s)), rounding half to even as Python's round() in
     * ComfyUI's formula does (0.9375 s = 22.5 frames -> 22 -> 22). */
    for (int k = 1; k <= 2000; k++) {
        double s = k * 0.0125;
        int64_t f = 0, want = (int64_t)rint(s * 24.0);
        if (want < 5) want = 5;
        while (!valid_frames(want)) want++;
        CHECK_OK(h3_request_frames_from_seconds(s, &f));
        CHECK(f == want, "%g s -> %lld, expected %lld", s, (long long)f, (long long)want);
    }
    int64_t f;
    CHECK_ERR(h3_request_frames_from_seconds(0, &f), H3_ERR_INVALID, "positive");
    CHECK_ERR(h3_request_frames_from_seconds(-2, &f), H3_ERR_INVALID, "positive");
    CHECK_ERR(h3_request_frames_from_seconds(NAN, &f), H3_ERR_INVALID, "positive");
    CHECK_ERR(h3_request_frames_from_seconds(INFINITY, &f), H3_ERR_INVALID, "positive");
    CHECK_ERR(h3_request_frames_from_seconds(1e9, &f), H3_ERR_INVALID, "at most");
}

/* ---- canvas
 * ------------------------------------------------------------------------------------------------------ */

static void test_canvas(void) {
    CHECK_OK(h3_request_check_canvas(1344, 768, NULL));
    CHECK_OK(h3_request_check_canvas(768, 768, NULL));
    CHECK_OK(h3_request_check_canvas(1536, 672, NULL)); /* 21:9 */
    CHECK_OK(h3_request_check_canvas(128, 32, NULL));   /* exactly 4:1 */
    CHECK_OK(h3_request_check_canvas(32, 128, NULL));
    CHECK_ERR(h3_request_check_canvas(1280, 720, NULL), H3_ERR_INVALID,
              "width and height must be multiples of 32 (16x video VAE, then 2x2 patches); got 1280x720: use "
              "1280x704 or 1280x736");
    CHECK_ERR(h3_request_check_canvas(1920, 1080, NULL), H3_ERR_INVALID,
              "got 1920x1080: use 1920x1088 or 1920x1056");
    CHECK_ERR(h3_request_check_canvas(1000, 1000, NULL), H3_ERR_INVALID, "use 992x992 or 992x1024");
    CHECK_ERR(h3_request_check_canvas(4096, 512, NULL), H3_ERR_INVALID,
              "the aspect ratio must lie between 1:4 and 4:1; got 4096x512 (8:1): use 4096x1024 or 2048x512");
    CHECK_ERR(h3_request_check_canvas(256, 1056, NULL), H3_ERR_INVALID, "aspect ratio");
    CHECK_ERR(h3_request_check_canvas(256, 1056, NULL), H3_ERR_INVALID, "use 256x1024 or 288x1056");
    CHECK_ERR(h3_request_check_canvas(0, 768, NULL), H3_ERR_INVALID, "positive");
    CHECK_ERR(h3_request_check_canvas(16, 16, NULL), H3_ERR_INVALID, "use 32x32");
    CHECK_ERR(h3_request_check_canvas(9000, 768, NULL), H3_ERR_INVALID, "at most 8192");
    /* Every suggestion is valid, and every canvas from 1 to 700 in steps of 7 either passes or gets one. */
    for (int64_t w = 1; w <= 700; w += 7)
        for (int64_t h = 1; h <= 700; h += 11) {
            int64_t sw[2], sh[2];
            int k = h3_request_nearest_canvases(w, h, sw, sh);
            CHECK(k >= 1, "no suggestion for %lldx%lld", (long long)w, (long long)h);
            for (int i = 0; i < k; i++)
                CHECK(h3_request_check_canvas(sw[i], sh[i], NULL) == H3_OK,
                      "suggested %lldx%lld for %lldx%lld is invalid", (long long)sw[i], (long long)sh[i],
                      (long long)w, (long long)h);
            if (k == 2) CHECK(sw[0] != sw[1] || sh[0] != sh[1]);
        }
    /* Above the released canvas area: allowed, with a warning. */
    h3_request_warnings w = {0};
    CHECK_OK(h3_request_check_canvas(1920, 1088, &w));
    CHECK(w.n == 1 && strstr(w.msg[0], "1344x768") != NULL, "%d warnings", w.n);
    w.n = 0;
    CHECK_OK(h3_request_check_canvas(1344, 768, &w));
    CHECK(w.n == 0);
}

static void test_parse_size(void) {
    int64_t w, h;
    CHECK_OK(h3_request_parse_size("1344x768", &w, &h));
    CHECK(w == 1344 && h == 768);
    CHECK_OK(h3_request_parse_size("64X32", &w, &h));
    CHECK(w == 64 && h == 32);
    const char *bad[] = {"",
                         "1344",
                         "1344x",
                         "x768",
                         "1344x768x2",
                         "-32x32",
                         "32x-32",
                         "13 44x768",
                         "axb",
                         "1344*768",
                         "99999999999999999999x2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_ERR(h3_request_parse_size(bad[i], &w, &h), H3_ERR_INVALID, "WIDTHxHEIGHT");
    CHECK_ERR(h3_request_parse_size(NULL, &w, &h), H3_ERR_INVALID, "WIDTHxHEIGHT");
    /* A zero side is a bad canvas, not "no size given" (which the request reads from 0x0, and then takes
     * 1344x768). */
    const char *zero[] = {"0x0", "0x768", "1344x0", "00x00"};
    for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++) {
        w = h = 7;
        CHECK_ERR(h3_request_parse_size(zero[i], &w, &h), H3_ERR_INVALID, "must be positive multiples of 32");
        CHECK(w == 7 && h == 7, "%s: a refused size is not stored", zero[i]);
    }
}

/* --refine and --output-size: the syntax, the rules (one table of accepted and refused values, each refusal
 * naming the fix), the defaults through h3_request_resolve, and the split of the steps between the passes. */
static void test_refine_and_output_size(void) {
    static const struct {
        const char *text;
        int ok;             /* parses */
        int64_t w, h;       /* when it does */
        double d;           /* 0: not given */
        const char *needle; /* the refusal's words */
    } refine[] = {
        {"256x256", 1, 256, 256, 0, NULL},
        {"2688x1536:0.4", 1, 2688, 1536, 0.4, NULL},
        {"256x256:1", 1, 256, 256, 1, NULL},
        {"256x256:0", 0, 0, 0, 0, "in (0, 1]"},
        {"256x256:1.5", 0, 0, 0, 0, "in (0, 1]"},
        {"256x256:-0.2", 0, 0, 0, 0, "in (0, 1]"},
        {"256x256:nan", 0, 0, 0, 0, "WIDTHxHEIGHT:DENOISE"},
        {"256x256:", 0, 0, 0, 0, "WIDTHxHEIGHT:DENOISE"},
        {"256", 0, 0, 0, 0, "WIDTHxHEIGHT:DENOISE"},
        {"0x0", 0, 0, 0, 0, "positive"},
        {"256x256:0.5x", 0, 0, 0, 0, "WIDTHxHEIGHT:DENOISE"},
    };
    for (size_t i = 0; i < sizeof refine / sizeof *refine; i++) {
        int64_t w = 0, h = 0;
        double d = 0;
        if (refine[i].ok) {
            CHECK_OK(h3_request_parse_refine(refine[i].text, &w, &h, &d));
            CHECK(w == refine[i].w && h == refine[i].h && d == refine[i].d, "%s: %lldx%lld:%g",
                  refine[i].text, (long long)w, (long long)h, d);
        } else {
            CHECK_ERR(h3_request_parse_refine(refine[i].text, &w, &h, &d), H3_ERR_INVALID, refine[i].needle);
        }
    }
    /* the rules against the first pass's canvas */
    CHECK_OK(h3_request_check_refine(128, 128, 256, 256, 0.5, NULL));
    CHECK_OK(h3_request_check_refine(896, 512, 1344, 768, 1.0, NULL));
    CHECK_OK(h3_request_check_refine(128, 128, 128, 128, 0.3, NULL));
    CHECK_ERR(h3_request_check_refine(128, 128, 250, 256, 0.5, NULL), H3_ERR_INVALID, "multiples of 32");
    CHECK_ERR(h3_request_check_refine(128, 128, 96, 96, 0.5, NULL), H3_ERR_INVALID,
              "smaller than the first pass's 128x128");
    CHECK_ERR(h3_request_check_refine(128, 128, 256, 96, 0.5, NULL), H3_ERR_INVALID, "e.g. 256x256");
    CHECK_ERR(h3_request_check_refine(128, 128, 256, 256, 0.0, NULL), H3_ERR_INVALID, "in (0, 1]");
    CHECK_ERR(h3_request_check_refine(128, 128, 256, 256, 1.01, NULL), H3_ERR_INVALID, "in (0, 1]");
    /* the steps of the refine pass: round(calls x denoise), at least 1, at most calls */
    static const struct {
        int calls;
        double d;
        int want;
    } split[] = {{49, 0.5, 25}, {49, 1.0, 49}, {49, 0.02, 1}, {49, 0.05, 2},
                 {20, 0.4, 8},  {3, 0.01, 1},  {1, 0.5, 1}};
    for (size_t i = 0; i < sizeof split / sizeof *split; i++)
        CHECK(h3_request_refine_calls(split[i].calls, split[i].d) == split[i].want, "%d calls at %g: %d",
              split[i].calls, split[i].d, h3_request_refine_calls(split[i].calls, split[i].d));
    /* --output-size */
    int64_t w, h;
    CHECK_OK(h3_request_parse_output_size("1920x1080", &w, &h));
    CHECK(w == 1920 && h == 1080);
    CHECK_ERR(h3_request_parse_output_size("1919x1080", &w, &h), H3_ERR_INVALID,
              "use 1918x1080 or 1920x1080");
    CHECK_ERR(h3_request_parse_output_size("0x0", &w, &h), H3_ERR_INVALID, "even number from 2");
    CHECK_ERR(h3_request_parse_output_size("1920", &w, &h), H3_ERR_INVALID, "WIDTHxHEIGHT");
    /* resolve: the default denoise, and the checks */
    h3_request r;
    h3_request_init(&r);
    r.prompt = "x";
    r.width = r.height = 128;
    r.refine_width = r.refine_height = 256;
    CHECK_OK(h3_request_resolve(&r, NULL));
    CHECK(r.refine_denoise == H3_REFINE_DEFAULT_DENOISE, "default denoise %g", r.refine_denoise);
    r.refine_width = 64;
    CHECK_ERR(h3_request_resolve(&r, NULL), H3_ERR_INVALID, "smaller than");
    h3_request_init(&r);
    r.prompt = "x";
    r.out_width = 101;
    r.out_height = 100;
    CHECK_ERR(h3_request_resolve(&r, NULL), H3_ERR_INVALID, "use 100x100 or 102x100");
}

/* ---- the prompt's length
 * --------------------------------------------------------------------------------------- */

static void test_prompt_length(void) {
    CHECK_OK(h3_request_check_prompt_bytes(0));
    CHECK_OK(h3_request_check_prompt_bytes(H3_MAX_PROMPT_BYTES));
    CHECK_ERR(h3_request_check_prompt_bytes(H3_MAX_PROMPT_BYTES + 1), H3_ERR_INVALID,
              "the prompt is 1048577 bytes; at most 1048576 (1 MiB)");
    CHECK_OK(h3_request_check_prompt_tokens(1, 262144));
    CHECK_OK(h3_request_check_prompt_tokens(H3_MAX_PROMPT_TOKENS, 262144));
    CHECK_OK(h3_request_check_prompt_tokens(H3_MAX_PROMPT_TOKENS, 0)); /* positions not known */
    CHECK_ERR(h3_request_check_prompt_tokens(H3_MAX_PROMPT_TOKENS + 1, 262144), H3_ERR_INVALID,
              "the prompt is 8193 tokens; at most 8192 are taken");
    CHECK_ERR(h3_request_check_prompt_tokens(60001, 0), H3_ERR_INVALID, "60001 tokens");
    /* A text encoder with fewer positions than the limit sets the limit. */
    CHECK_OK(h3_request_check_prompt_tokens(4096, 4096));
    CHECK_ERR(h3_request_check_prompt_tokens(4097, 4096), H3_ERR_INVALID, "has 4096 positions");
    /* The request refuses a prompt longer than a prompt may be before anything else. */
    size_t n = H3_MAX_PROMPT_BYTES + 1;
    char *text = malloc(n + 1);
    memset(text, 'a', n);
    text[n] = 0;
    h3_request r;
    h3_request_init(&r);
    r.prompt = text;
    CHECK_ERR(h3_request_resolve(&r, NULL), H3_ERR_INVALID, "1048577 bytes");
    text[H3_MAX_PROMPT_BYTES] = 0;
    CHECK_OK(h3_request_resolve(&r, NULL));
    free(text);
}

static void test_resolve(void) {
    h3_request r;
    h3_request_warnings w;
    h3_request_init(&r);
    CHECK_ERR(h3_request_resolve(&r, &w), H3_ERR_INVALID, "prompt");
    r.prompt = "a cat";
    CHECK_OK(h3_request_resolve(&r, &w));
    CHECK(r.frames == 124 && r.width == 1344 && r.height == 768 && r.steps == H3_DEFAULT_STEPS_H3 &&
          r.sampler == H3_SAMPLER_EULER && r.scheduler == H3_SCHEDULER_H3 && w.n == 0);
    h3_request_init(&r);
    r.prompt = "";
    r.seconds = 10;
    r.scheduler = H3_SCHEDULER_SIMPLE;
    CHECK_OK(h3_request_resolve(&r, &w));
    CHECK(r.frames == 243 && r.steps == H3_DEFAULT_STEPS_COMFY);
    h3_request_init(&r);
    r.prompt = "x";
    r.frames = 124;
    r.seconds = 5;
    CHECK_ERR(h3_request_resolve(&r, &w), H3_ERR_INVALID, "not both");
    h3_request_init(&r);
    r.prompt = "x";
    r.frames = 22;
    r.width = 128;
    r.height = 128;
    r.steps = 4;
    CHECK_OK(h3_request_resolve(&r, &w));
    CHECK(w.n == 1 && strstr(w.msg[0], "22 frames is 0.92 s") != NULL, "%s", w.n ? w.msg[0] : "");
    r.steps = H3_MAX_STEPS + 1;
    CHECK_ERR(h3_request_resolve(&r, &w), H3_ERR_INVALID, "steps counts model calls");
    r.steps = 4;
    r.width = 1280;
    r.height = 720;
    CHECK_ERR(h3_request_resolve(&r, &w), H3_ERR_INVALID, "1280x704 or 1280x736");
    r.width = 128;
    r.height = 0;
    CHECK_ERR(h3_request_resolve(&r, &w), H3_ERR_INVALID, "positive");
}

/* ---- progress
 * ---------------------------------------------------------------------------------------------------- */

typedef struct {
    double t;
} fake_clock;
static double fake_now(void *u) {
    return ((fake_clock *)u)->t;
}

typedef struct {
    h3_progress_event ev[64];
    char stage[64][32];
    int n;
} recorder;
static void record(const h3_progress_event *ev, void *u) {
    recorder *r = u;
    if (r->n >= 64) return;
    r->ev[r->n] = *ev;
    snprintf(r->stage[r->n], 32, "%s", ev->stage ? ev->stage : "");
    r->n++;
}

static void test_progress_events(void) {
    fake_clock clk = {100.0};
    recorder rec = {0};
    h3_progress p;
    h3_progress_init(&p, record, &rec);
    h3_progress_set_clock(&p, fake_now, &clk);
    clk.t = 101.0;
    h3_progress_stage(&p, "text_encoder", 0);
    clk.t = 103.5;
    h3_progress_stage(&p, "dit", 4); /* ends text_encoder */
    clk.t = 113.5;                   /* first step: 10 s (warm-up) */
    h3_progress_step(&p);
    clk.t = 117.5; /* then 4 s per step */
    h3_progress_step(&p);
    clk.t = 121.5;
    h3_progress_step(&p);
    clk.t = 125.5;
    h3_progress_step(&p);
    clk.t = 126.0;
    h3_progress_done(&p);
    /* stage_begin te, stage_end te, stage_begin dit, 4 steps, stage_end dit, done */
    CHECK(rec.n == 9, "%d events", rec.n);
    if (rec.n != 9) return;
    CHECK(rec.ev[0].kind == H3_PROGRESS_STAGE_BEGIN && !strcmp(rec.stage[0], "text_encoder") &&
          rec.ev[0].elapsed_s == 1.0);
    CHECK(rec.ev[1].kind == H3_PROGRESS_STAGE_END && !strcmp(rec.stage[1], "text_encoder") &&
          rec.ev[1].stage_s == 2.5);
    CHECK(rec.ev[2].kind == H3_PROGRESS_STAGE_BEGIN && !strcmp(rec.stage[2], "dit") && rec.ev[2].steps == 4 &&
          rec.ev[2].eta_s == -1.0);
    /* Step 1: 10 s per step, ETA 30 s. Steps 2..4: mean of the steps after the first, 4 s; ETA 8, 4, 0. */
    const double want_sps[4] = {10, 4, 4, 4}, want_eta[4] = {30, 8, 4, 0},
                 want_el[4] = {13.5, 17.5, 21.5, 25.5};
    for (int i = 0; i < 4; i++) {
        h3_progress_event *e = &rec.ev[3 + i];
        CHECK(e->kind == H3_PROGRESS_STEP && e->step == i + 1 && e->steps == 4);
        CHECK(fabs(e->step_s - want_sps[i]) < 1e-9 && fabs(e->eta_s - want_eta[i]) < 1e-9 &&
                  fabs(e->elapsed_s - want_el[i]) < 1e-9,
              "step %d: %.3f s/step, ETA %.3f, elapsed %.3f", i + 1, e->step_s, e->eta_s, e->elapsed_s);
    }
    CHECK(rec.ev[7].kind == H3_PROGRESS_STAGE_END && fabs(rec.ev[7].stage_s - 22.5) < 1e-9 &&
          rec.ev[7].eta_s == 0.0);
    CHECK(rec.ev[8].kind == H3_PROGRESS_DONE && rec.ev[8].stage == NULL &&
          fabs(rec.ev[8].elapsed_s - 26.0) < 1e-9);
    /* No callback: nothing happens, nothing crashes. */
    h3_progress q;
    h3_progress_init(&q, NULL, NULL);
    h3_progress_stage(&q, "dit", 2);
    h3_progress_step(&q);
    h3_progress_done(&q);
    h3_progress_step(&q); /* a step outside a stage is ignored */
}

/* Runs a small scripted run through the printer into a memory stream and returns the text. */
static char *printed(h3_progress_style style) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    h3_progress_printer pp;
    h3_progress_printer_init(&pp, f, style);
    fake_clock clk = {0};
    h3_progress p;
    h3_progress_init(&p, h3_progress_print, &pp);
    h3_progress_set_clock(&p, fake_now, &clk);
    h3_progress_stage(&p, "tokenize", 0);
    clk.t = 0.5;
    h3_progress_stage(&p, "dit", 3);
    for (int i = 0; i < 3; i++) {
        clk.t += 61.0;
        h3_progress_step(&p);
    }
    clk.t = 200;
    h3_progress_stage(&p, "mux", 0);
    clk.t = 3725;
    h3_progress_done(&p);
    fclose(f);
    return buf;
}

static void test_progress_printer(void) {
    char *s = printed(H3_PROGRESS_QUIET);
    CHECK(s && s[0] == 0, "quiet printed '%s'", s ? s : "(null)");
    free(s);

    s = printed(H3_PROGRESS_LINES);
    const char *want_lines = "tokenize: started, elapsed 0:00\n"
                             "tokenize: done in 0:01, elapsed 0:01\n"
                             "dit: started (3 steps), elapsed 0:01\n"
                             "dit: step 1/3, 61.00 s/step, ETA 2:02, elapsed 1:02\n"
                             "dit: step 2/3, 61.00 s/step, ETA 1:01, elapsed 2:03\n"
                             "dit: step 3/3, 61.00 s/step, ETA 0:00, elapsed 3:04\n"
                             "dit: done in 3:20, elapsed 3:20\n"
                             "mux: started, elapsed 3:20\n"
                             "mux: done in 58:45, elapsed 1:02:05\n"
                             "finished in 1:02:05\n";
    CHECK(s && !strcmp(s, want_lines), "lines:\n%s", s ? s : "(null)");
    free(s);

    s = printed(H3_PROGRESS_JSON);
    /* One JSON object per line, each parseable, with the fields a driving program needs. */
    int lines = 0, steps = 0;
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *j = NULL;
        h3_status st = h3_json_parse(line, strlen(line), "progress line", &j);
        CHECK(st == H3_OK, "not JSON: %s", line);
        if (st != H3_OK) continue;
        const char *ev = h3_json_get_str(j, "event");
        double el;
        CHECK(ev && h3_json_get_num(j, "elapsed_s", &el));
        if (ev && !strcmp(ev, "step")) {
            int64_t step, nsteps;
            double sps, eta;
            CHECK(h3_json_get_int(j, "step", &step) && h3_json_get_int(j, "steps", &nsteps) &&
                  h3_json_get_num(j, "step_s", &sps) && h3_json_get_num(j, "eta_s", &eta));
            CHECK(!strcmp(h3_json_get_str(j, "stage"), "dit") && nsteps == 3 && fabs(sps - 61) < 1e-9 &&
                  fabs(eta - 61.0 * (double)(3 - step)) < 1e-9);
            steps++;
        }
        json_decref(j);
        lines++;
    }
    CHECK(lines == 10 && steps == 3, "%d JSON lines, %d steps", lines, steps);
    free(s);

    s = printed(H3_PROGRESS_BAR);
    /* Redrawn in place: carriage returns, the bar, and a newline only when a stage ends or the run finishes.
     */
    CHECK(s && strstr(s, "\r\033[Kdit          [##########....................] 1/3  61.00 s/step  ETA 2:02  "
                         "elapsed 1:02") != NULL,
          "bar output: %s", s ? s : "(null)");
    CHECK(s && strstr(s, "[##############################] 3/3") != NULL);
    int nl = 0;
    for (char *c = s; c && *c; c++) nl += *c == '\n';
    CHECK(nl == 4, "%d newlines in bar mode", nl);
    free(s);

    char b[32];
    CHECK(!strcmp(h3_progress_fmt_time(59.4, b, sizeof b), "0:59"));
    CHECK(!strcmp(h3_progress_fmt_time(3600, b, sizeof b), "1:00:00"));
    CHECK(!strcmp(h3_progress_fmt_time(-1, b, sizeof b), "?"));
    CHECK(!strcmp(h3_progress_fmt_time(NAN, b, sizeof b), "?"));
}

/* --progress lines: each stage's start and end, and its steps at most about once a second: the text encoder's
 * 50 layers in half a second are two lines, not fifty; a slow stage still prints every step. */
static void test_progress_lines(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    h3_progress_printer pp;
    h3_progress_printer_init(&pp, f, H3_PROGRESS_LINES);
    fake_clock clk = {0};
    h3_progress p;
    h3_progress_init(&p, h3_progress_print, &pp);
    h3_progress_set_clock(&p, fake_now, &clk);
    h3_progress_stage(&p, "text_encoder", 50);
    for (int i = 0; i < 50; i++) { /* 0.01 s a layer */
        clk.t += 0.01;
        h3_progress_step(&p);
    }
    h3_progress_stage(&p, "dit", 60);
    for (int i = 0; i < 60; i++) { /* 0.1 s a step: one line in ten */
        clk.t += 0.1;
        h3_progress_step(&p);
    }
    h3_progress_stage(&p, "video_vae", 3);
    for (int i = 0; i < 3; i++) { /* 2 s a step: every step */
        clk.t += 2;
        h3_progress_step(&p);
    }
    h3_progress_done(&p);
    fclose(f);
    int te = 0, dit = 0, vae = 0, lines = 0;
    for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n")) {
        lines++;
        te += !strncmp(l, "text_encoder: step", 18);
        dit += !strncmp(l, "dit: step", 9);
        vae += !strncmp(l, "video_vae: step", 15);
    }
    CHECK(te == 0, "%d text_encoder step lines for 50 steps in 0.5 s", te);
    CHECK(dit >= 5 && dit <= 6, "%d dit step lines for 60 steps in 6 s", dit);
    CHECK(vae == 3, "%d video_vae step lines for 3 steps of 2 s", vae);
    CHECK(lines == te + dit + vae + 7, "%d lines: the steps, 3 starts, 3 ends and the finish", lines);
    free(buf);
}

/* The turbo presets by file name (the files LightX2V publishes, and others), and how they fill a request. */
static void test_turbo(void) {
    static const struct {
        const char *name;
        int steps;
        double sv;
        int unknown;
    } tab[] = {
        {"loras/minimax_h3_fl2v_turbo_4step_v1.0_768p_comfyui_bf16.safetensors", 4, 6.0, 0},
        {"minimax_h3_fl2v_turbo_4step_v1.1_768p_comfyui_bf16.safetensors", 4, 6.0, 0},
        {"/x/MINIMAX_H3_FL2V_TURBO_8STEP_V1.0_768P.safetensors", 8, 6.0, 0},
        {"minimax_h3_fl2v_turbo_8step_v1.0_comfyui_bf16.safetensors", 8, 12.0, 0},
        {"minimax_h3_ref2v_turbo_4step_v0.1_comfyui_bf16.safetensors", 4, 12.0, 0},
        {"minimax_h3_turbo_v4_step600_ema.safetensors", 0, 0, 1},
        {"style.safetensors", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        int unknown = -1;
        const h3_turbo_preset *p = h3_turbo_preset_for(tab[i].name, &unknown);
        CHECK(unknown == tab[i].unknown, "%s: unknown %d", tab[i].name, unknown);
        if (tab[i].steps) {
            CHECK(p && p->steps == tab[i].steps && p->shift_video == tab[i].sv && p->shift_audio == 3.0, "%s",
                  tab[i].name);
        } else {
            CHECK(p == NULL, "%s has no preset", tab[i].name);
        }
    }
    /* a request that leaves steps and shifts takes the preset's and gets no warning; one that sets them keeps
     * them and is warned */
    const char *paths[2] = {"style.safetensors", "minimax_h3_fl2v_turbo_4step_v1.0_768p_comfyui_bf16.safetensors"};
    h3_request r;
    h3_request_init(&r);
    h3_request_warnings w = {0};
    CHECK(h3_turbo_apply(paths, 2, &r, &w) != NULL && r.steps == 4 && r.shift_video == 6.0 && r.shift_audio == 3.0 &&
              w.n == 0,
          "steps %d shift %g:%g, %d warnings", r.steps, r.shift_video, r.shift_audio, w.n);
    h3_request_init(&r);
    r.steps = 8;
    w.n = 0;
    CHECK(h3_turbo_apply(paths, 2, &r, &w) != NULL && r.steps == 8 && r.shift_video == 6.0 && w.n == 1 &&
              strstr(w.msg[0], "made for 4 model calls at shift 6:3; this request asks 8 at 6:3"),
          "%d warnings: %s", w.n, w.n ? w.msg[0] : "");
    h3_request_init(&r);
    w.n = 0;
    CHECK(h3_turbo_apply(paths, 1, &r, &w) == NULL && r.steps == 0 && w.n == 0);
    /* --shift */
    double v = 0, a = 0;
    CHECK_OK(h3_request_parse_shift("6", &v, &a));
    CHECK(v == 6.0 && a == 0.0);
    CHECK_OK(h3_request_parse_shift("6.5:2", &v, &a));
    CHECK(v == 6.5 && a == 2.0);
    const char *bad[] = {"", "x", "0", "6:", "6:x", "1001", "6:-1", "6:3:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_ERR(h3_request_parse_shift(bad[i], &v, &a), H3_ERR_INVALID, "--shift takes V or V:A");
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"frames", test_frames},
        {"turbo", test_turbo},
        {"seconds", test_seconds},
        {"canvas", test_canvas},
        {"parse_size", test_parse_size},
        {"refine_and_output_size", test_refine_and_output_size},
        {"resolve", test_resolve},
        {"prompt_length", test_prompt_length},
        {"progress_lines", test_progress_lines},
        {"progress_events", test_progress_events},
        {"progress_printer", test_progress_printer},
        {NULL, NULL},
    };
    return t_main("test_request", cases, argc, argv);
}

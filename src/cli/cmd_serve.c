/* h3run serve: the HTTP API and web page over a persistent queue of generate jobs (docs/SERVE.md,
 * docs/openapi.yaml). libmicrohttpd parses HTTP (one thread per connection, so a Server-Sent Events stream
 * may wait for the next event); SQLite keeps the jobs (serve_store.c); one worker thread runs them in order
 * through one h3_session, so the next job finds the models and recent prompts the last one left. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "base/log.h"
#include "cli/cli.h"
#include "cli/serve.h"
#include "cuda/cuda.h"
#include "mem/budget.h"
#include "pipeline/generate.h"
#include "pipeline/plan.h"
#include "pipeline/session.h"
#include "sample/sampler.h"
#include "sample/schedule.h"

/* The web page's files, compiled in from src/cli/web/ (CMake writes serve_web.c). */
typedef struct h3_web_file {
    const char *path, *type;
    const unsigned char *data;
    size_t len;
} h3_web_file;
extern const h3_web_file h3_web_files[];

#define EV_RING         1024 /* progress events of the current job kept for its streams */
#define QUEUE_LIMIT     1000 /* queued jobs at most: more is 503 */
#define SSE_KEEPALIVE_S 10   /* a comment line this often on a quiet stream */
#define CANCEL_WAIT_S   60   /* DELETE and cancel wait this long for a running job to stop */

typedef struct server {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* any change: a job queued, a state, an event, stopping */
    h3_store *store;
    h3_session *ses;
    /* how every job runs */
    const char *model;
    int small;
    h3_device device;
    int threads;
    int gpus; /* every job's DiT split over GPUs 0..gpus-1 (generate's --gpus) */
    int64_t vram, ram;
    char *jobs_dir; /* DATA/jobs: the outputs, named by job id */
    char *uploads_dir; /* DATA/uploads: keyframe images, named by random hex (serve.h) */
    char *lora_dir;    /* --lora-dir: the LoRAs jobs may name (NULL: none) */
    char *token;    /* NULL: none needed (loopback) */
    int stopping;
    /* the job the worker runs (0: none) and what it reported last */
    int64_t cur_id;
    int cur_cancel, cur_running;
    const char *cur_stage;
    int cur_step, cur_steps;
    double cur_eta, cur_elapsed, cur_progress;
    /* its progress events, as JSON; ev_seq counts them, the ring keeps the last EV_RING */
    int64_t ev_job;
    uint64_t ev_seq;
    char *ev[EV_RING];
} server;

static server g_srv;

/* The library's message without its origin (" (src/...:N)"): what a client reads. */
static const char *client_message(char *buf, size_t n) {
    snprintf(buf, n, "%s", h3_last_error());
    char *o = strstr(buf, " (src/");
    if (o && strchr(o, ')') && !strchr(strchr(o, ')') + 1, '(')) *o = 0;
    return buf;
}

/* ---- outputs ------------------------------------------------------------------------------------------- */

typedef struct output_kind {
    const char *name, *ext, *type;
} output_kind;
static const output_kind g_outputs[] = {
    {"video", ".mp4", "video/mp4"},
    {"wav", ".wav", "audio/wav"},
    {"latents", ".safetensors", "application/octet-stream"},
    {"checkpoint", ".ckpt", "application/octet-stream"}, /* the sampler's state while the job runs */
};
enum { N_OUTPUTS = sizeof g_outputs / sizeof *g_outputs };

/* DATA/jobs/<id><ext>: the only paths a job's outputs take. */
static void output_path(const server *S, int64_t id, int kind, char *buf, size_t n) {
    snprintf(buf, n, "%s/%" PRId64 "%s", S->jobs_dir, id, g_outputs[kind].ext);
}

static void remove_outputs(const server *S, int64_t id) {
    for (int k = 0; k < N_OUTPUTS; k++) {
        char p[4096], pp[4200];
        output_path(S, id, k, p, sizeof p);
        snprintf(pp, sizeof pp, "%s.partial", p);
        unlink(p);
        unlink(pp);
    }
}

/* A file under the jobs folder left by a run that died (*.partial): never a finished result. */
static int remove_partials(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 8 && !strcmp(e->d_name + len - 8, ".partial")) {
            char p[4400];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (unlink(p) == 0) n++;
        }
    }
    closedir(d);
    return n;
}

/* ---- a job as the API shows it ------------------------------------------------------------------------- */

/* The stored row, with the live progress of the running job and the links to its outputs. Under S->mu. */
static json_t *job_view(server *S, json_t *job) {
    const int64_t id = json_integer_value(json_object_get(job, "id"));
    const char *state = json_string_value(json_object_get(job, "state"));
    if (id == S->cur_id && S->cur_stage) {
        json_t *p = json_object();
        json_object_set_new(p, "stage", json_string(S->cur_stage));
        json_object_set_new(p, "step", json_integer(S->cur_step));
        json_object_set_new(p, "steps", json_integer(S->cur_steps));
        json_object_set_new(p, "eta_s", S->cur_eta >= 0 ? json_real(S->cur_eta) : json_null());
        json_object_set_new(p, "elapsed_s", json_real(S->cur_elapsed));
        json_object_set_new(p, "fraction", json_real(S->cur_progress));
        json_object_set_new(job, "progress", p);
    }
    char url[128];
    snprintf(url, sizeof url, "/api/jobs/%" PRId64 "/events", id);
    json_object_set_new(job, "events", json_string(url));
    if (state && !strcmp(state, H3_JOB_DONE)) {
        json_t *links = json_object();
        json_t *req = json_object_get(job, "request");
        for (int k = 0; k < N_OUTPUTS; k++) {
            if (k > 0 && !json_is_true(json_object_get(req, g_outputs[k].name))) continue;
            snprintf(url, sizeof url, "/api/jobs/%" PRId64 "/%s", id, g_outputs[k].name);
            json_object_set_new(links, g_outputs[k].name, json_string(url));
        }
        json_object_set_new(job, "outputs", links);
    }
    return job;
}

static int terminal(const char *state) {
    return state &&
           (!strcmp(state, H3_JOB_DONE) || !strcmp(state, H3_JOB_FAILED) || !strcmp(state, H3_JOB_CANCELLED));
}

/* ---- the worker ---------------------------------------------------------------------------------------- */

/* Where the whole run is, 0..1, from the stage and its step: the stages weighted by their usual share. */
static double run_fraction(const char *stage, int step, int steps) {
    static const struct {
        const char *name;
        double w;
    } W[] = {{"tokenize", 0.01},  {"text_encoder", 0.04}, {"keyframes", 0},     {"references", 0}, {"soundtrack", 0},
             {"dit", 0.80},       {"refine", 0},          {"audio_vae", 0.03}, {"video_vae", 0.10},
             {"mux", 0.02}}; /* the stages of some runs only hold their place */
    double before = 0;
    for (size_t i = 0; i < sizeof W / sizeof *W; i++) {
        if (!strcmp(W[i].name, stage)) return before + W[i].w * (steps > 0 ? (double)step / steps : 0);
        before += W[i].w;
    }
    return before;
}

static void on_progress(const h3_progress_event *ev, void *user) {
    server *S = user;
    char line[512];
    h3_progress_json(ev, line, sizeof line);
    pthread_mutex_lock(&S->mu);
    if (ev->stage) {
        S->cur_stage = ev->stage;
        S->cur_step = ev->step;
        S->cur_steps = ev->steps;
        S->cur_eta = ev->eta_s;
        S->cur_progress = run_fraction(ev->stage, ev->step, ev->steps);
        if (ev->kind == H3_PROGRESS_STAGE_END) S->cur_progress = run_fraction(ev->stage, 1, 1);
    } else {
        S->cur_progress = 1.0;
    }
    S->cur_elapsed = ev->elapsed_s;
    if (!S->cur_running && ev->stage && strcmp(ev->stage, "tokenize")) { /* planned: the models run now */
        S->cur_running = 1;
        if (h3_store_set_state(S->store, S->cur_id, H3_JOB_RUNNING, NULL, NULL) != H3_OK) {
            h3_log(H3_LOG_ERROR, "%s", h3_last_error());
            h3_clear_error();
        }
    }
    char **slot = &S->ev[S->ev_seq % EV_RING];
    h3_free(*slot);
    *slot = h3_strdup(line);
    S->ev_seq++;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
}

static int should_stop(void *user) {
    server *S = user;
    pthread_mutex_lock(&S->mu);
    int stop = S->cur_cancel || S->stopping;
    pthread_mutex_unlock(&S->mu);
    return stop;
}

static json_t *report_json(const h3_generate_result *res) {
    json_t *r = json_object();
    json_object_set_new(r, "frames", json_integer(res->req.frames));
    json_object_set_new(r, "width", json_integer(res->req.width));
    json_object_set_new(r, "height", json_integer(res->req.height));
    json_object_set_new(r, "steps", json_integer(res->req.steps));
    json_object_set_new(r, "sampler", json_string(h3_sampler_name(res->req.sampler)));
    json_object_set_new(r, "scheduler", json_string(h3_scheduler_name(res->req.scheduler)));
    json_object_set_new(r, "seed", json_integer((json_int_t)res->req.seed));
    json_object_set_new(r, "device", json_string(res->device == H3_DEVICE_CUDA ? "cuda" : "cpu"));
    json_object_set_new(r, "text_tokens", json_integer(res->text_tokens));
    json_object_set_new(r, "keyframes", json_integer(res->keyframes));
    if (res->soundtrack_s > 0) json_object_set_new(r, "soundtrack_s", json_real(res->soundtrack_s));
    json_object_set_new(r, "resumed_step", json_integer(res->resumed_step));
    json_object_set_new(r, "total_s", json_real(res->total_s));
    json_object_set_new(r, "dit_start_s", json_real(res->dit_start_s));
    json_object_set_new(r, "dit_step_s", json_real(res->measured_step_s));
    if (res->cache_calls)
        json_object_set_new(r, "cache", json_pack("{s:i, s:i, s:f}", "calls", res->cache_calls, "skipped",
                                                  res->cache_skipped, "est_max", res->cache_est_max));
    json_t *stages = json_object();
    for (int i = 0; i < H3_GEN_STAGES; i++)
        json_object_set_new(stages, h3_generate_stage_name(i), json_real(res->stage_s[i]));
    json_object_set_new(r, "stage_s", stages);
    json_t *dpk = json_object(); /* the stages on the GPU: the arena's peak, predicted and measured */
    for (int i = 0; i < H3_GEN_STAGES; i++)
        if (res->stages[i].on_device)
            json_object_set_new(dpk, h3_generate_stage_name(i),
                                json_pack("{s:I, s:I}", "predicted", (json_int_t)res->stages[i].dev_predicted,
                                          "measured", (json_int_t)res->stages[i].dev_peak));
    json_object_set_new(r, "stage_device_peak", dpk);
    json_t *reused = json_array();
    for (int b = 0; b < H3_REUSED_COUNT; b++)
        if (res->reused & (1u << b)) json_array_append_new(reused, json_string(h3_reused_name(b)));
    json_object_set_new(r, "reused", reused);
    json_object_set_new(r, "peak_host_bytes", json_integer(res->peak_host_bytes));
    return r;
}

/* The job's request as the server runs it: the client's options, the server's model, device, budgets and
 * session, and its own output paths. */
static h3_status job_request(server *S, json_t *obj, int64_t id, h3_serve_request *sr,
                             char paths[N_OUTPUTS][4096]) {
    H3_TRY(h3_serve_parse_request(obj, S->small, S->uploads_dir, S->lora_dir, sr));
    h3_generate_request *g = &sr->gen;
    g->model = S->model;
    g->device = S->device;
    g->threads = S->threads;
    g->gpus = S->gpus;
    g->vram_budget = S->vram;
    g->ram_budget = S->ram;
    g->session = S->ses;
    for (int k = 0; k < N_OUTPUTS; k++) output_path(S, id, k, paths[k], sizeof paths[k]);
    g->output = paths[0];
    g->wav = sr->wav ? paths[1] : NULL;
    g->latents = sr->latents ? paths[2] : NULL;
    g->checkpoint = id ? paths[3] : NULL; /* a job killed mid-way resumes from it (DATA/jobs/<id>.ckpt) */
    return H3_OK;
}

static void run_job(server *S, int64_t id, const char *text) {
    char msg[2048] = "";
    const char *state = H3_JOB_FAILED;
    char *report = NULL;
    json_t *obj = json_loads(text, 0, NULL);
    h3_serve_request sr;
    static char paths[N_OUTPUTS][4096];
    h3_status st = obj ? job_request(S, obj, id, &sr, paths)
                       : H3_ERR(H3_ERR_FORMAT, "the stored request of job %" PRId64 " is not JSON", id);
    if (st == H3_OK) {
        h3_generate_callbacks cb = {on_progress, S, should_stop, S};
        h3_generate_result res;
        st = h3_generate(&sr.gen, &cb, &res);
        if (st == H3_OK) {
            state = H3_JOB_DONE;
            json_t *r = report_json(&res);
            report = r ? json_dumps(r, JSON_COMPACT) : NULL;
            json_decref(r);
            h3_log(H3_LOG_INFO, "job %" PRId64 ": done in %.2f s (the DiT began at %.3f s)", id, res.total_s,
                   res.dit_start_s);
        }
    }
    pthread_mutex_lock(&S->mu);
    if (st != H3_OK) {
        client_message(msg, sizeof msg);
        if (!(st == H3_ERR_INTERRUPTED && S->stopping && !S->cur_cancel)) {
            char ck[4096]; /* failed or cancelled: nothing will resume (a stopping server keeps it) */
            output_path(S, id, 3, ck, sizeof ck);
            unlink(ck);
        }
        if (st == H3_ERR_INTERRUPTED && S->cur_cancel) {
            state = H3_JOB_CANCELLED;
            snprintf(msg, sizeof msg, "cancelled while %s", S->cur_stage ? S->cur_stage : "planning");
        } else if (st == H3_ERR_INTERRUPTED && S->stopping) {
            state = H3_JOB_QUEUED; /* the server stops: the job runs again when it starts */
        }
        h3_clear_error();
        h3_log(H3_LOG_INFO, "job %" PRId64 ": %s: %s", id, state, msg);
    }
    if (h3_store_set_state(S->store, id, state, msg[0] ? msg : NULL, report) != H3_OK) {
        h3_log(H3_LOG_ERROR, "%s", h3_last_error());
        h3_clear_error();
    }
    S->cur_id = 0;
    S->cur_stage = NULL;
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    h3_free(report);
    json_decref(obj);
}

static void *worker(void *arg) {
    server *S = arg;
    for (;;) {
        int64_t id = 0;
        char *text = NULL;
        pthread_mutex_lock(&S->mu);
        while (!S->stopping) {
            if (h3_store_next(S->store, &id, &text) != H3_OK) {
                h3_log(H3_LOG_ERROR, "%s", h3_last_error());
                h3_clear_error();
            }
            if (id) break;
            pthread_cond_wait(&S->cv, &S->mu);
        }
        if (S->stopping) {
            pthread_mutex_unlock(&S->mu);
            h3_free(text);
            break;
        }
        S->cur_id = id;
        S->cur_cancel = S->cur_running = 0;
        S->cur_stage = NULL;
        S->cur_progress = 0;
        S->ev_job = id;
        S->ev_seq = 0;
        if (h3_store_set_state(S->store, id, H3_JOB_PLANNING, NULL, NULL) != H3_OK) {
            h3_log(H3_LOG_ERROR, "%s", h3_last_error());
            h3_clear_error();
        }
        pthread_cond_broadcast(&S->cv);
        pthread_mutex_unlock(&S->mu);
        run_job(S, id, text);
        h3_free(text);
    }
    return NULL;
}

/* ---- HTTP ---------------------------------------------------------------------------------------------- */

typedef struct conn {
    char *body;
    size_t len, cap; /* the body grows geometrically: bodies with images run to tens of MiB */
    int too_big;
} conn;

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned code, const char *type, const char *text,
                                 size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ok = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ok;
}

/* Sends o (its reference is taken). */
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned code, json_t *o) {
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) return send_text(c, 500, "application/json", "{\"error\":\"out of memory\"}", 25);
    enum MHD_Result ok = send_text(c, code, "application/json", text, strlen(text));
    h3_free(text);
    return ok;
}

/* {"error": message}: bytes that are not printable ASCII or valid UTF-8 (a path from the URL) become '?'. */
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *fmt, ...)
    H3_PRINTF(3, 4);
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *s = json_string(msg);
    if (!s) {
        for (char *p = msg; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
        s = json_string(msg);
    }
    json_t *o = json_object();
    json_object_set_new(o, "error", s);
    return send_json(c, code, o);
}

/* The status a library failure answers with: the request's fault (400), a plan that does not fit (422), no
 * such thing (404), else the server's (500). */
static unsigned http_status(h3_status st) {
    /* a request this server's model cannot run (it does not fit, or it lacks a part: keyframes without a vision
     * tower) is 422 */
    return st == H3_ERR_INVALID                                  ? 400
           : st == H3_ERR_BUDGET || st == H3_ERR_UNSUPPORTED     ? 422
           : st == H3_ERR_NOT_FOUND                              ? 404
                                                                 : 500;
}

static enum MHD_Result send_status(struct MHD_Connection *c, h3_status st) {
    char msg[2048];
    client_message(msg, sizeof msg);
    h3_clear_error();
    return send_error(c, http_status(st), "%s", msg);
}

static int token_ok(const server *S, struct MHD_Connection *c) {
    if (!S->token) return 1;
    const char *given = NULL;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (auth && !strncmp(auth, "Bearer ", 7)) given = auth + 7;
    if (!given) given = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "token");
    if (!given) return 0;
    const size_t n = strlen(S->token);
    if (strlen(given) != n) return 0;
    unsigned char diff = 0; /* the same time whatever the first wrong byte */
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(given[i] ^ S->token[i]);
    return diff == 0;
}

/* The body as a JSON object and a parsed request, or the answer already queued (*answered). */
static json_t *parse_body(struct MHD_Connection *c, conn *k, enum MHD_Result *answered) {
    json_error_t e;
    json_t *o = json_loadb(k->body ? k->body : "", k->len, JSON_REJECT_DUPLICATES, &e);
    if (!o) {
        *answered = send_error(c, 400,
                               "the body is not JSON: %s at line %d column %d (send the job's options as a "
                               "JSON object: {\"prompt\": \"...\", \"steps\": 8})",
                               e.text, e.line, e.column);
        return NULL;
    }
    return o;
}

/* Checks and plans a request as the server would run it (h3_generate_check): the resolved request and the
 * plan, or the error the job would fail with. */
static h3_status check_request(server *S, json_t *obj, h3_generate_result *res) {
    h3_serve_request sr;
    char paths[N_OUTPUTS][4096];
    H3_TRY(job_request(S, obj, 0, &sr, paths));
    return h3_generate_check(&sr.gen, res);
}

static json_t *resolved_json(const h3_generate_result *res) {
    json_t *o = json_object();
    json_object_set_new(o, "frames", json_integer(res->req.frames));
    json_object_set_new(o, "seconds", json_real((double)res->req.frames / 24.0));
    char size[64];
    snprintf(size, sizeof size, "%lldx%lld", (long long)res->req.width, (long long)res->req.height);
    json_object_set_new(o, "size", json_string(size));
    json_object_set_new(o, "steps", json_integer(res->req.steps));
    json_object_set_new(o, "sampler", json_string(h3_sampler_name(res->req.sampler)));
    json_object_set_new(o, "scheduler", json_string(h3_scheduler_name(res->req.scheduler)));
    json_object_set_new(o, "seed", json_integer((json_int_t)res->req.seed));
    char shift[64];
    snprintf(shift, sizeof shift, "%g:%g", res->req.shift_video, res->req.shift_audio);
    json_object_set_new(o, "shift", json_string(shift));
    if (res->req.refine_width) {
        char rf[64];
        snprintf(rf, sizeof rf, "%lldx%lld:%g", (long long)res->req.refine_width, (long long)res->req.refine_height,
                 res->req.refine_denoise);
        json_object_set_new(o, "refine", json_string(rf));
    }
    if (res->windows > 1) { /* a long clip (pipeline/window.h) */
        json_object_set_new(o, "windows", json_integer(res->windows));
        json_object_set_new(o, "window", json_integer(res->req.window));
        json_object_set_new(o, "overlap", json_integer(res->req.overlap));
    }
    if (res->req.out_width) {
        char os[64];
        snprintf(os, sizeof os, "%lldx%lld", (long long)res->req.out_width, (long long)res->req.out_height);
        json_object_set_new(o, "output_size", json_string(os));
    }
    return o;
}

static enum MHD_Result api_plan(server *S, struct MHD_Connection *c, conn *k) {
    enum MHD_Result a = MHD_NO;
    json_t *obj = parse_body(c, k, &a);
    if (!obj) return a;
    h3_generate_result res;
    h3_status st = h3_serve_store_uploads(obj, S->uploads_dir); /* the keyframes, for the check only */
    if (st == H3_OK) st = check_request(S, obj, &res);
    h3_error_state kept;
    h3_error_save(&kept);
    h3_serve_remove_uploads(obj, S->uploads_dir);
    h3_error_restore(&kept);
    json_decref(obj);
    if (st != H3_OK) return send_status(c, st);
    json_t *o = json_object();
    json_object_set_new(o, "request", resolved_json(&res));
    json_object_set_new(o, "plan", json_string(res.plan));
    return send_json(c, 200, o);
}

static enum MHD_Result api_submit(server *S, struct MHD_Connection *c, conn *k) {
    enum MHD_Result a = MHD_NO;
    json_t *obj = parse_body(c, k, &a);
    if (!obj) return a;
    h3_generate_result res;
    /* the keyframes written under uploads/ first (the check reads them), then plan before accept; the seed is
     * drawn into obj */
    h3_status st = h3_serve_store_uploads(obj, S->uploads_dir);
    if (st == H3_OK) {
        st = check_request(S, obj, &res);
        if (st != H3_OK) {
            h3_error_state kept;
            h3_error_save(&kept);
            h3_serve_remove_uploads(obj, S->uploads_dir);
            h3_error_restore(&kept);
        }
    }
    if (st != H3_OK) {
        json_decref(obj);
        return send_status(c, st);
    }
    char *text = json_dumps(obj, JSON_COMPACT);
    if (!text) {
        h3_serve_remove_uploads(obj, S->uploads_dir);
        json_decref(obj);
        return send_error(c, 500, "out of memory");
    }
    pthread_mutex_lock(&S->mu);
    int64_t id = 0;
    json_t *job = NULL;
    const int64_t queued = h3_store_count(S->store, H3_JOB_QUEUED);
    if (queued >= QUEUE_LIMIT) {
        pthread_mutex_unlock(&S->mu);
        h3_free(text);
        h3_serve_remove_uploads(obj, S->uploads_dir);
        json_decref(obj);
        return send_error(c, 503, "the queue holds %lld jobs, its limit: submit again when some have run",
                          (long long)queued);
    }
    st = h3_store_add(S->store, text, &id);
    if (st == H3_OK) st = h3_store_get(S->store, id, &job);
    if (st == H3_OK) {
        job = job_view(S, job);
        json_object_set_new(job, "plan", json_string(res.plan));
    }
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    h3_free(text);
    if (st != H3_OK && id == 0) { /* not stored: its uploads go */
        h3_error_state kept;
        h3_error_save(&kept);
        h3_serve_remove_uploads(obj, S->uploads_dir);
        h3_error_restore(&kept);
    }
    json_decref(obj);
    if (st != H3_OK) return send_status(c, st);
    char loc[64];
    snprintf(loc, sizeof loc, "/api/jobs/%" PRId64, id);
    char *body = json_dumps(job, JSON_COMPACT);
    json_decref(job);
    if (!body) return send_error(c, 500, "out of memory");
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    h3_free(body);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Location", loc);
    enum MHD_Result ok = MHD_queue_response(c, 201, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result api_list(server *S, struct MHD_Connection *c) {
    json_t *jobs = NULL;
    pthread_mutex_lock(&S->mu);
    h3_status st = h3_store_list(S->store, &jobs);
    size_t i;
    json_t *j;
    if (st == H3_OK) json_array_foreach(jobs, i, j) job_view(S, j);
    pthread_mutex_unlock(&S->mu);
    if (st != H3_OK) {
        json_decref(jobs);
        return send_status(c, st);
    }
    json_t *o = json_object();
    json_object_set_new(o, "jobs", jobs);
    return send_json(c, 200, o);
}

static enum MHD_Result api_get(server *S, struct MHD_Connection *c, int64_t id) {
    json_t *job = NULL;
    pthread_mutex_lock(&S->mu);
    h3_status st = h3_store_get(S->store, id, &job);
    if (st == H3_OK) job_view(S, job);
    pthread_mutex_unlock(&S->mu);
    return st == H3_OK ? send_json(c, 200, job) : send_status(c, st);
}

/* Cancels a queued or running job (a running one stops within a step; this waits for it). Under S->mu;
 * returns the state it ends in, or NULL with the error set. */
static h3_status cancel_locked(server *S, int64_t id, char *state, size_t n) {
    json_t *job = NULL;
    H3_TRY(h3_store_get(S->store, id, &job));
    snprintf(state, n, "%s", json_string_value(json_object_get(job, "state")));
    json_decref(job);
    if (!strcmp(state, H3_JOB_QUEUED)) {
        H3_TRY(h3_store_set_state(S->store, id, H3_JOB_CANCELLED, "cancelled while queued", NULL));
        snprintf(state, n, "%s", H3_JOB_CANCELLED);
        pthread_cond_broadcast(&S->cv);
        return H3_OK;
    }
    if (S->cur_id != id) return H3_OK; /* done, failed or cancelled already */
    S->cur_cancel = 1;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += CANCEL_WAIT_S;
    while (S->cur_id == id)
        if (pthread_cond_timedwait(&S->cv, &S->mu, &until) == ETIMEDOUT)
            return H3_ERR(H3_ERR_INTERNAL, "job %lld did not stop within %d s of its cancel", (long long)id,
                          CANCEL_WAIT_S);
    H3_TRY(h3_store_get(S->store, id, &job));
    snprintf(state, n, "%s", json_string_value(json_object_get(job, "state")));
    json_decref(job);
    return H3_OK;
}

static enum MHD_Result api_cancel(server *S, struct MHD_Connection *c, int64_t id, int delete) {
    char state[32] = "";
    pthread_mutex_lock(&S->mu);
    h3_status st = cancel_locked(S, id, state, sizeof state);
    json_t *job = NULL;
    if (st == H3_OK && delete) {
        json_t *gone = NULL;
        if (h3_store_get(S->store, id, &gone) != H3_OK) h3_clear_error();
        st = h3_store_delete(S->store, id);
        if (st == H3_OK) {
            remove_outputs(S, id);
            if (gone) h3_serve_remove_uploads(json_object_get(gone, "request"), S->uploads_dir);
        }
        json_decref(gone);
    } else if (st == H3_OK) {
        st = h3_store_get(S->store, id, &job);
        if (st == H3_OK) job_view(S, job);
    }
    pthread_cond_broadcast(&S->cv);
    pthread_mutex_unlock(&S->mu);
    if (st != H3_OK) return send_status(c, st);
    if (!delete) {
        if (strcmp(state, H3_JOB_CANCELLED)) {
            json_decref(job);
            return send_error(c, 409,
                              "job %lld is %s: only a queued or running job can be cancelled (DELETE "
                              "removes it)",
                              (long long)id, state);
        }
        return send_json(c, 200, job);
    }
    json_t *o = json_object();
    json_object_set_new(o, "deleted", json_integer(id));
    json_object_set_new(o, "state", json_string(state));
    return send_json(c, 200, o);
}

/* bytes=a-b, bytes=a-, bytes=-n: 1 with [*off, *off + *len) inside size; 0 when absent or not one plain range
 * (the whole file is sent); -1 when it lies outside the file (416). */
static int parse_range(const char *h, int64_t size, int64_t *off, int64_t *len) {
    if (!h || strncmp(h, "bytes=", 6) || strchr(h, ',')) return 0;
    const char *p = h + 6;
    char *end;
    if (*p == '-') {
        errno = 0;
        long long n = strtoll(p + 1, &end, 10);
        if (errno || *end || end == p + 1 || n <= 0) return 0;
        if (size == 0) return -1;
        if (n > size) n = size;
        *off = size - n;
        *len = n;
        return 1;
    }
    if (*p < '0' || *p > '9') return 0;
    errno = 0;
    long long a = strtoll(p, &end, 10);
    if (errno || *end != '-') return 0;
    long long b = size - 1;
    if (end[1]) {
        const char *q = end + 1;
        if (*q < '0' || *q > '9') return 0;
        b = strtoll(q, &end, 10);
        if (errno || *end || b < a) return 0;
    }
    if (a >= size) return -1;
    if (b >= size) b = size - 1;
    *off = a;
    *len = b - a + 1;
    return 1;
}

static enum MHD_Result api_file(server *S, struct MHD_Connection *c, int64_t id, int kind) {
    json_t *job = NULL;
    pthread_mutex_lock(&S->mu);
    h3_status st = h3_store_get(S->store, id, &job);
    pthread_mutex_unlock(&S->mu);
    if (st != H3_OK) return send_status(c, st);
    char state[32];
    snprintf(state, sizeof state, "%s", json_string_value(json_object_get(job, "state")));
    const int asked =
        kind == 0 || json_is_true(json_object_get(json_object_get(job, "request"), g_outputs[kind].name));
    json_decref(job);
    if (strcmp(state, H3_JOB_DONE))
        return send_error(c, 409, "job %lld is %s: its %s is served once it is done", (long long)id, state,
                          g_outputs[kind].name);
    if (!asked)
        return send_error(c, 404, "job %lld was not asked for its %s (submit with \"%s\": true)",
                          (long long)id, g_outputs[kind].name, g_outputs[kind].name);
    char p[4096];
    output_path(S, id, kind, p, sizeof p);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0) close(fd);
        return send_error(c, 404, "job %lld's %s is gone from the data folder", (long long)id,
                          g_outputs[kind].name);
    }
    const int64_t size = sb.st_size;
    int64_t off = 0, len = size;
    int ranged = parse_range(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range"), size, &off, &len);
    char cr[96];
    if (ranged < 0) {
        close(fd);
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        snprintf(cr, sizeof cr, "bytes */%lld", (long long)size);
        MHD_add_response_header(r, "Content-Range", cr);
        enum MHD_Result ok = MHD_queue_response(c, 416, r);
        MHD_destroy_response(r);
        return ok;
    }
    struct MHD_Response *r = MHD_create_response_from_fd_at_offset64((uint64_t)len, fd, (uint64_t)off);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", g_outputs[kind].type);
    MHD_add_response_header(r, "Accept-Ranges", "bytes");
    char disp[96];
    snprintf(disp, sizeof disp, "inline; filename=\"h3run-%lld%s\"", (long long)id, g_outputs[kind].ext);
    MHD_add_response_header(r, "Content-Disposition", disp);
    if (ranged) {
        snprintf(cr, sizeof cr, "bytes %lld-%lld/%lld", (long long)off, (long long)(off + len - 1),
                 (long long)size);
        MHD_add_response_header(r, "Content-Range", cr);
    }
    enum MHD_Result ok = MHD_queue_response(c, ranged ? 206 : 200, r);
    MHD_destroy_response(r);
    return ok;
}

/* ---- Server-Sent Events -------------------------------------------------------------------------------- */

typedef struct sse {
    server *S;
    int64_t id;
    int phase; /* 0: the status first; 1: the events; 2: the final status sent */
    uint64_t next;
    char *pending; /* text to send, from pos */
    size_t pos, len;
} sse;

static void sse_put(sse *e, const char *event, const char *data) {
    size_t n = strlen(event) + strlen(data) + 32;
    h3_free(e->pending);
    e->pending = h3_malloc(n, H3_MEM_IO);
    e->pos = e->len = 0;
    if (e->pending) e->len = (size_t)snprintf(e->pending, n, "event: %s\ndata: %s\n\n", event, data);
}

/* The job's status event: its JSON as GET /api/jobs/{id} gives it ({"id":..,"state":"gone"} once deleted).
 * Under S->mu; *state receives the state. */
static void sse_status(sse *e, char *state, size_t n) {
    json_t *job = NULL;
    if (h3_store_get(e->S->store, e->id, &job) != H3_OK) {
        h3_clear_error();
        job = json_object();
        json_object_set_new(job, "id", json_integer(e->id));
        json_object_set_new(job, "state", json_string("gone"));
        snprintf(state, n, "gone");
    } else {
        snprintf(state, n, "%s", json_string_value(json_object_get(job, "state")));
        job_view(e->S, job);
    }
    char *text = json_dumps(job, JSON_COMPACT);
    json_decref(job);
    sse_put(e, "status", text ? text : "{}");
    h3_free(text);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse *e = cls;
    server *S = e->S;
    pthread_mutex_lock(&S->mu);
    while (e->pos == e->len) {
        char state[32];
        if (S->stopping || e->phase == 2) {
            pthread_mutex_unlock(&S->mu);
            return e->phase == 2 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (e->phase == 0) {
            sse_status(e, state, sizeof state);
            e->phase = terminal(state) || !strcmp(state, "gone") ? 2 : 1;
            break;
        }
        if (S->ev_job == e->id && e->next < S->ev_seq) { /* the job's events, oldest kept first */
            if (S->ev_seq - e->next > EV_RING) e->next = S->ev_seq - EV_RING;
            const char *line = S->ev[e->next % EV_RING];
            e->next++;
            if (line) sse_put(e, "progress", line);
            continue;
        }
        if (S->cur_id != e->id) { /* not running (now): queued still, or ended */
            json_t *job = NULL;
            int ended = 1;
            if (h3_store_get(S->store, e->id, &job) == H3_OK)
                ended = terminal(json_string_value(json_object_get(job, "state")));
            else
                h3_clear_error();
            json_decref(job);
            if (ended) {
                sse_status(e, state, sizeof state);
                e->phase = 2;
                break;
            }
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += SSE_KEEPALIVE_S;
        if (pthread_cond_timedwait(&S->cv, &S->mu, &until) == ETIMEDOUT) {
            h3_free(e->pending);
            e->pending = h3_strdup(": keepalive\n\n");
            e->pos = 0;
            e->len = e->pending ? strlen(e->pending) : 0;
        }
    }
    pthread_mutex_unlock(&S->mu);
    size_t n = e->len - e->pos < max ? e->len - e->pos : max;
    memcpy(buf, e->pending + e->pos, n);
    e->pos += n;
    return (ssize_t)n;
}

static void sse_free(void *cls) {
    sse *e = cls;
    h3_free(e->pending);
    h3_free(e);
}

static enum MHD_Result api_events(server *S, struct MHD_Connection *c, int64_t id) {
    json_t *job = NULL;
    h3_status st = h3_store_get(S->store, id, &job);
    json_decref(job);
    if (st != H3_OK) return send_status(c, st);
    sse *e = h3_calloc(1, sizeof *e, H3_MEM_IO);
    if (!e) return send_error(c, 500, "out of memory");
    e->S = S;
    e->id = id;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, e, sse_free);
    if (!r) {
        sse_free(e);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

/* ---- routes -------------------------------------------------------------------------------------------- */

static enum MHD_Result api_info(server *S, struct MHD_Connection *c) {
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(S->model));
    json_object_set_new(o, "small_model", json_boolean(S->small));
    json_object_set_new(o, "device", json_string(h3_device_name(S->device)));
    json_object_set_new(o, "options", json_string(H3_SERVE_OPTIONS));
    json_t *sm = json_array(), *sc = json_array();
    for (int i = 0; i < H3_SAMPLER_COUNT; i++)
        json_array_append_new(sm, json_string(h3_sampler_name((h3_sampler)i)));
    for (int i = 0; i < H3_SCHEDULER_COUNT; i++)
        json_array_append_new(sc, json_string(h3_scheduler_name((h3_scheduler)i)));
    json_object_set_new(o, "samplers", sm);
    json_object_set_new(o, "schedulers", sc);
    json_t *d = json_object();
    json_object_set_new(d, "frames", json_integer(S->small ? H3_SMALL_MODEL_FRAMES : H3_DEFAULT_FRAMES));
    json_object_set_new(d, "size", json_string(S->small ? "128x128" : "1344x768"));
    json_object_set_new(d, "steps_h3", json_integer(H3_DEFAULT_STEPS_H3));
    json_object_set_new(d, "steps_other", json_integer(H3_DEFAULT_STEPS_COMFY));
    json_object_set_new(o, "defaults", d);
    json_object_set_new(o, "loras", h3_serve_list_loras(S->lora_dir)); /* read now: files may come and go */
    pthread_mutex_lock(&S->mu);
    json_object_set_new(o, "queued", json_integer(h3_store_count(S->store, H3_JOB_QUEUED)));
    json_object_set_new(o, "running", json_integer(S->cur_id));
    pthread_mutex_unlock(&S->mu);
    return send_json(c, 200, o);
}

/* "/api/jobs/<digits>[/rest]": the id and the rest ("" when none); 0 when the segment is not a job id. */
static int64_t parse_job_path(const char *p, const char **rest) {
    int64_t id = 0;
    int n = 0;
    while (p[n] >= '0' && p[n] <= '9') {
        if (n == 15) return 0;
        id = id * 10 + (p[n] - '0');
        n++;
    }
    if (n == 0 || (p[n] && p[n] != '/')) return 0;
    *rest = p[n] ? p + n + 1 : "";
    return id;
}

static enum MHD_Result not_allowed(struct MHD_Connection *c, const char *method, const char *url,
                                   const char *allow) {
    return send_error(c, 405, "%.16s is not allowed on %.200s: it takes %s", method, url, allow);
}

static enum MHD_Result route(server *S, struct MHD_Connection *c, const char *url, const char *method,
                             conn *k) {
    const int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST"),
              del = !strcmp(method, "DELETE");
    if (k->too_big)
        return send_error(c, 413,
                          "the body is larger than %d bytes: a job's options are smaller (the prompt at most %d "
                          "bytes, each keyframe image at most %d bytes before base64)",
                          H3_SERVE_MAX_BODY, H3_MAX_PROMPT_BYTES, H3_SERVE_MAX_IMAGE);
    if (strncmp(url, "/api/", 5)) {
        const char *p = !strcmp(url, "/") ? "/index.html" : url;
        for (const h3_web_file *f = h3_web_files; f->path; f++)
            if (!strcmp(f->path, p)) {
                if (!get) return not_allowed(c, method, url, "GET");
                return send_text(c, 200, f->type, (const char *)f->data, f->len);
            }
        return send_error(c, 404, "no page %.200s: the web page is at /, the API under /api/", url);
    }
    const char *a = url + 5;
    if (!strcmp(a, "info")) return get ? api_info(S, c) : not_allowed(c, method, url, "GET");
    if (!strcmp(a, "plan")) return post ? api_plan(S, c, k) : not_allowed(c, method, url, "POST");
    if (!strcmp(a, "jobs")) {
        if (get) return api_list(S, c);
        if (post) return api_submit(S, c, k);
        return not_allowed(c, method, url, "GET, POST");
    }
    if (!strncmp(a, "jobs/", 5)) {
        const char *rest = "";
        const int64_t id = parse_job_path(a + 5, &rest);
        if (!id)
            return send_error(
                c, 400, "'%.64s' is not a job id: jobs are numbered 1, 2, ... (GET /api/jobs lists them)",
                a + 5);
        if (!rest[0]) {
            if (get) return api_get(S, c, id);
            if (del) return api_cancel(S, c, id, 1);
            return not_allowed(c, method, url, "GET, DELETE");
        }
        if (!strcmp(rest, "events")) return get ? api_events(S, c, id) : not_allowed(c, method, url, "GET");
        if (!strcmp(rest, "cancel"))
            return post ? api_cancel(S, c, id, 0) : not_allowed(c, method, url, "POST");
        for (int kind = 0; kind < N_OUTPUTS; kind++)
            if (!strcmp(rest, g_outputs[kind].name))
                return get ? api_file(S, c, id, kind) : not_allowed(c, method, url, "GET");
    }
    return send_error(c, 404,
                      "no API at %.200s: see docs/openapi.yaml (jobs, jobs/{id}, jobs/{id}/events, "
                      "jobs/{id}/video, plan, info)",
                      url);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size,
                                  void **con_cls) {
    (void)version;
    server *S = cls;
    conn *k = *con_cls;
    if (!k) {
        k = h3_calloc(1, sizeof *k, H3_MEM_IO);
        if (!k) return MHD_NO;
        *con_cls = k;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_big && k->len + *upload_size <= H3_SERVE_MAX_BODY) {
            if (k->len + *upload_size + 1 > k->cap) {
                size_t cap = k->cap ? k->cap * 2 : 65536;
                while (cap < k->len + *upload_size + 1) cap *= 2;
                char *b = h3_realloc(k->body, cap, H3_MEM_IO);
                if (!b) return MHD_NO;
                k->body = b;
                k->cap = cap;
            }
            memcpy(k->body + k->len, upload, *upload_size);
            k->len += *upload_size;
        } else {
            k->too_big = 1; /* read to the end, kept nowhere */
            h3_free(k->body);
            k->body = NULL;
            k->len = k->cap = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!token_ok(S, c))
        return send_error(c, 401,
                          "this server needs its token: send the header 'Authorization: Bearer TOKEN' (or "
                          "?token=TOKEN in the URL)");
    return route(S, c, url, method, k);
}

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* %XX escapes of the URL and its arguments decoded in place, except %00: a NUL would cut the C string short
 * ("/api/jobs/%00" must not read as "/api/jobs/"), so it stays as the three characters and fails as they do.
 */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls;
    (void)c;
    char *w = s;
    for (const char *r = s; *r;) {
        int hi, lo;
        if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0 && (hi | lo)) {
            *w++ = (char)(hi * 16 + lo);
            r += 3;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
    return (size_t)(w - s);
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t) {
    (void)cls;
    (void)c;
    (void)t;
    conn *k = *con_cls;
    if (k) {
        h3_free(k->body);
        h3_free(k);
    }
    *con_cls = NULL;
}

/* ---- the command --------------------------------------------------------------------------------------- */

/* "HOST:PORT" (HOST an IPv4 address, localhost, or [IPv6]) into an address; *loopback when only this machine
 * reaches it. 0, or 2 after printing the problem. */
static int parse_listen(const char *s, struct sockaddr_storage *ss, int *v6, int *loopback) {
    memset(ss, 0, sizeof *ss);
    char host[128];
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || (size_t)(colon - s) >= sizeof host) goto bad;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || port < 0 || port > 65535) goto bad;
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        host[hl - 1] = 0;
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1) goto bad;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        *v6 = 1;
        *loopback = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
        return 0;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    if (inet_pton(AF_INET, host, &a->sin_addr) != 1) goto bad;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    *v6 = 0;
    *loopback = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    return 0;
bad:
    fprintf(stderr,
            "h3run serve: error: --listen %s: give HOST:PORT with HOST an IPv4 address, localhost or [IPv6] "
            "(e.g. "
            "127.0.0.1:8188; port 0 picks a free one)\n",
            s);
    return H3_EXIT_USAGE;
}

/* The token from --token-file: its first line, at least 16 characters. */
static char *read_token_file(const char *path) {
    char *text = NULL;
    size_t len = 0;
    h3_status st = h3_cli_read_prompt(path, &text, &len);
    if (st != H3_OK) {
        h3_cli_fail("serve", st);
        return NULL;
    }
    text[strcspn(text, "\r\n")] = 0;
    return text;
}

int h3_cmd_serve(int argc, char **argv) {
    const char *model = NULL, *listen = "127.0.0.1:8188", *data = "h3run-data", *token = NULL,
               *token_file = NULL, *device = "auto", *vram_s = NULL, *ram_s = NULL, *lora_dir = NULL;
    int64_t threads = 0, gpus = 1;
    int verbose = 0, quiet = 0;
    const h3_cli_opt opts[] = {
        {"model", 'm', H3_OPT_STR, &model, "PATH",
         "the model every job runs on, as generate takes it (default: the small model h3-small, found as "
         "generate finds it)",
         0, 0},
        {"listen", 'l', H3_OPT_STR, &listen, "HOST:PORT",
         "where to listen (default 127.0.0.1:8188; port 0 picks a free one and prints it); an address other "
         "than loopback needs --token or --token-file",
         0, 0},
        {"data", 'd', H3_OPT_STR, &data, "DIR",
         "the folder of the job store (jobs.db) and the results (jobs/<id>.mp4), created when missing "
         "(default h3run-data)",
         0, 0},
        {"token", 0, H3_OPT_STR, &token, "TOKEN",
         "every request must carry it (Authorization: Bearer TOKEN, or ?token=TOKEN); at least 16 characters",
         0, 0},
        {"token-file", 0, H3_OPT_STR, &token_file, "FILE", "the token, from the first line of FILE", 0, 0},
        {"lora-dir", 0, H3_OPT_STR, &lora_dir, "DIR",
         "the folder of the LoRA files (.safetensors) jobs may name in their 'loras' option (default: none)", 0,
         0},
        {"device", 0, H3_OPT_STR, &device, "NAME", "cpu or cuda (default: cuda when a GPU is present)", 0, 0},
        {"vram-budget", 0, H3_OPT_STR, &vram_s, "SIZE", "device memory every job may take (as generate)", 0,
         0},
        {"ram-budget", 0, H3_OPT_STR, &ram_s, "SIZE",
         "host memory for pinned copies (as generate; 'unlimited')", 0, 0},
        {"threads", 't', H3_OPT_INT, &threads, "N", "CPU threads (default 0: one per CPU)", 0,
         H3_MAX_THREADS},
        {"gpus", 0, H3_OPT_INT, &gpus, "N",
         "every job's DiT and video decode split over GPUs 0..N-1 (as generate's --gpus; the device budget applies to "
         "each GPU, and nothing of the DiT is kept between jobs)",
         1, H3_PLAN_MAX_GPUS},
        {"quiet", 'q', H3_OPT_FLAG, &quiet, NULL, "log warnings and errors only", 0, 0},
        {"verbose", 'v', H3_OPT_FLAG, &verbose, NULL, "log more", 0, 0},
        {0},
    };
    const h3_cli_cmd cmd = {
        "serve",
        "serve [--model PATH] [--listen 127.0.0.1:8188] [--data DIR] [--token TOKEN | --token-file FILE]",
        "An HTTP API and a web page over a queue of generate jobs that survives a crash.\n"
        "Jobs (POST /api/jobs, the options of generate as JSON) are checked and planned before they are\n"
        "accepted (400 for a bad request, 422 when the plan does not fit), kept in DATA/jobs.db (SQLite) "
        "and\n"
        "run one at a time in the order they came; the models and recent prompts stay loaded between jobs.\n"
        "A job that was running when the server died runs again when it starts; no queued job is lost.\n"
        "Progress comes as Server-Sent Events (GET /api/jobs/{id}/events: the events of --progress json);\n"
        "results are served from DATA/jobs/ with range requests. The page at / submits, shows the plan, the\n"
        "queue with live progress and the finished clips. docs/SERVE.md and docs/openapi.yaml describe it.\n"
        "SIGINT or SIGTERM stops it: a running job goes back to the queue.",
        "examples:\n"
        "  h3run serve                                  # the small model, http://127.0.0.1:8188/\n"
        "  h3run serve --model ~/MiniMax-H3/FL2VA --data /srv/h3 --listen 0.0.0.0:8188 --token-file tok",
        opts,
        0,
        0};
    const char *pos[1];
    int npos;
    int r = h3_cli_parse(&cmd, argc, argv, pos, &npos);
    if (r) return r < 0 ? H3_EXIT_OK : r;
    server *S = &g_srv;
    memset(S, 0, sizeof *S);
    h3_json_init(); /* jansson allocates through h3_malloc from here on: before any JSON is made */
    int rc = H3_EXIT_FAIL;
    char *default_model = NULL, *token_text = NULL, *db_path = NULL;
    struct MHD_Daemon *d = NULL;
    pthread_t worker_thread;
    int worker_on = 0;
    h3_cli_setup_logging(quiet ? -1 : verbose);

    struct sockaddr_storage addr;
    int v6 = 0, loopback = 0;
    if ((r = parse_listen(listen, &addr, &v6, &loopback))) return r;
    if (token && token_file) {
        fprintf(stderr, "h3run serve: error: give --token or --token-file, not both\n");
        return H3_EXIT_USAGE;
    }
    if (token_file && !(token = token_text = read_token_file(token_file))) return H3_EXIT_USAGE;
    if (token && strlen(token) < 16) {
        fprintf(stderr, "h3run serve: error: the token must have at least 16 characters (e.g. from "
                        "'head -c 24 /dev/urandom | base64')\n");
        h3_free(token_text);
        return H3_EXIT_USAGE;
    }
    if (!loopback && !token) {
        fprintf(
            stderr,
            "h3run serve: error: --listen %s reaches beyond this machine: give --token TOKEN or --token-file "
            "FILE (every request must then carry it), or listen on 127.0.0.1\n",
            listen);
        return H3_EXIT_USAGE;
    }
    S->token = (char *)token;
    h3_status st = h3_device_parse(device, &S->device);
    if (st == H3_OK && vram_s) st = h3_budget_parse(vram_s, "--vram-budget", &S->vram);
    if (st == H3_OK && ram_s && !strcmp(ram_s, "unlimited"))
        S->ram = -1;
    else if (st == H3_OK && ram_s)
        st = h3_budget_parse(ram_s, "--ram-budget", &S->ram);
    if (st != H3_OK) {
        h3_free(token_text);
        return h3_cli_fail("serve", st);
    }
    S->threads = (int)threads;
    S->gpus = (int)gpus;
    /* The budgets once, now: measured later, the free memory would count what a running job or the kept
     * models hold, and a job checked while another runs would be planned for less than it will have. */
    const int gpu =
        S->device == H3_DEVICE_CUDA || (S->device == H3_DEVICE_AUTO && h3_cuda_device_count() > 0);
    if (gpus > 1 && (!gpu || h3_cuda_device_count() < gpus)) {
        if (!gpu)
            fprintf(stderr, "h3run serve: error: --gpus %lld splits every job's DiT over GPUs: it needs --device cuda\n",
                    (long long)gpus);
        else
            fprintf(stderr, "h3run serve: error: --gpus %lld: this machine has %d GPU%s\n", (long long)gpus,
                    h3_cuda_device_count(), h3_cuda_device_count() == 1 ? "" : "s");
        h3_free(token_text);
        return H3_EXIT_USAGE;
    }
    if (gpu && !S->vram && (st = h3_budget_default_vram(0, &S->vram)) != H3_OK) {
        h3_free(token_text);
        return h3_cli_fail("serve", st);
    }
    if (!S->ram) S->ram = h3_budget_default_ram(); /* 0 when unknown: not limited */
    if (!model) {
        char looked[2048];
        default_model = h3_cli_default_model(looked, sizeof looked);
        if (!default_model) {
            fprintf(stderr,
                    "h3run serve: error: --model is required: the small model h3run uses without --model, "
                    "models/" H3_SMALL_MODEL
                    " is in none of: %s; set H3RUN_MODELS to the folder holding " H3_SMALL_MODEL "\n",
                    looked);
            h3_free(token_text);
            return H3_EXIT_USAGE;
        }
        model = default_model;
        S->small = 1;
    }
    S->model = model;
    if (lora_dir) { /* jobs name files of it; nothing else of the filesystem */
        if (!h3_path_is_dir(lora_dir)) {
            fprintf(stderr, "h3run serve: error: --lora-dir %s: not a folder (give the folder of the LoRA files)\n",
                    lora_dir);
            rc = H3_EXIT_USAGE;
            goto done;
        }
        S->lora_dir = h3_strdup(lora_dir);
        if (!S->lora_dir) goto done;
    }
    /* The data folder, its jobs/ folder and the store. */
    S->jobs_dir = h3_path_join(data, "jobs");
    S->uploads_dir = h3_path_join(data, "uploads");
    db_path = h3_path_join(data, "jobs.db");
    if (!S->jobs_dir || !S->uploads_dir || !db_path) goto done;
    if ((mkdir(data, 0755) != 0 && errno != EEXIST) || (mkdir(S->jobs_dir, 0755) != 0 && errno != EEXIST) ||
        !h3_path_is_dir(S->jobs_dir) || (mkdir(S->uploads_dir, 0755) != 0 && errno != EEXIST) ||
        !h3_path_is_dir(S->uploads_dir)) {
        fprintf(stderr, "h3run serve: error: --data %s: cannot make the folders %s and %s: %s\n", data,
                S->jobs_dir, S->uploads_dir, strerror(errno));
        rc = H3_EXIT_USAGE;
        goto done;
    }
    if ((st = h3_store_open(db_path, &S->store)) != H3_OK) {
        rc = h3_cli_fail("serve", st);
        goto done;
    }
    const int requeued = h3_store_requeue_interrupted(S->store);
    if (requeued < 0) {
        rc = h3_cli_fail("serve", H3_ERR_IO);
        goto done;
    }
    const int partials = remove_partials(S->jobs_dir);
    if (requeued || partials)
        h3_log(H3_LOG_INFO,
               "%d jobs that were running when the server stopped go back to the queue (%d unfinished "
               "files removed)",
               requeued, partials);
    if ((st = h3_session_new(0, &S->ses)) != H3_OK) {
        rc = h3_cli_fail("serve", st);
        goto done;
    }
    pthread_mutex_init(&S->mu, NULL);
    pthread_cond_init(&S->cv, NULL);
    /* Signals wait for sigwait below, in this thread only. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (pthread_create(&worker_thread, NULL, worker, S) != 0) {
        fprintf(stderr, "h3run serve: error: cannot start the worker thread\n");
        goto done;
    }
    worker_on = 1;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (v6) flags |= MHD_USE_IPv6;
    d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, S, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_done, S, MHD_OPTION_UNESCAPE_CALLBACK, unescape, S,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)256, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)120, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                         MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "h3run serve: error: cannot listen on %s: %s (is another server on that port?)\n",
                listen, strerror(errno));
        goto done;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char host[64];
    snprintf(host, sizeof host, "%.*s", (int)(strrchr(listen, ':') - listen), listen);
    printf("h3run serve: listening on http://%s:%u/ (model %s%s; data %s; %lld queued)\n", host,
           info ? info->port : 0, model, S->small ? ", the small model" : "", data,
           (long long)h3_store_count(S->store, H3_JOB_QUEUED));
    fflush(stdout);
    int sig = 0;
    sigwait(&sigs, &sig);
    h3_log(H3_LOG_INFO, "%s: stopping (a running job goes back to the queue)",
           sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = H3_EXIT_OK;
done:
    if (worker_on || d) {
        pthread_mutex_lock(&S->mu);
        S->stopping = 1;
        pthread_cond_broadcast(&S->cv);
        pthread_mutex_unlock(&S->mu);
    }
    if (d) MHD_stop_daemon(d);
    if (worker_on) pthread_join(worker_thread, NULL);
    for (int i = 0; i < EV_RING; i++) {
        h3_free(S->ev[i]);
        S->ev[i] = NULL;
    }
    h3_session_free(S->ses);
    h3_store_close(S->store);
    h3_free(S->jobs_dir);
    h3_free(S->uploads_dir);
    h3_free(S->lora_dir);
    h3_free(db_path);
    h3_free(default_model);
    h3_free(token_text);
    return rc;
}

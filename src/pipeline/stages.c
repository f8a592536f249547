/* The stages of a run (stages.h): text encoder, DiT, audio VAE, video VAE, each at the place its plan gives
 * it, each giving its device memory back before it returns. */
#include "pipeline/stages.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/cancel.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "mem/budget.h"
#include "mem/report.h"
#include "io/safetensors.h"
#include "models/vision.h"
#include "models/dit_stream.h"
#include "models/lora.h"
#include "pipeline/dit_group.h"
#include "pipeline/reference.h"
#include "pipeline/window.h"
#include "sample/rng.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- every stage's start and end on the device --------------------------------------------------------- */

typedef struct stage_mark {
    h3_exec *ex;
    const char *name;
    int on_device;
    int64_t predicted, used0;
    int64_t kept;    /* device bytes the stage leaves placed on purpose (the DiT's kept placement) */
    int64_t kept_in; /* of them, the bytes it found placed when it began (a kept placement it was given) */
    double t0;
} stage_mark;

/* A stage planned on the device needs the run's backend up. Whatever a stage before it left of the quantized
 * GEMMs' scratch goes back first (a stage that needs it counts it in its own plan), and the arena's peak is
 * measured from here. */
static h3_status mark_begin(h3_exec *ex, const char *name, int on_device, int64_t predicted, stage_mark *m) {
    memset(m, 0, sizeof *m);
    m->ex = ex;
    m->name = name;
    m->on_device = on_device;
    m->predicted = on_device ? predicted : 0;
    m->t0 = now_s();
    if (on_device && !ex->cuda)
        return H3_ERR(H3_ERR_INVALID,
                      "the %s is planned on the device but the device backend is not up (h3_cuda_init)",
                      name);
    if (ex->cuda) {
        h3_cuda_qgemm_release(ex);
        h3_cuda_mem_stats(ex, &m->used0, NULL, NULL);
        h3_cuda_reset_peak(ex);
    }
    return H3_OK;
}

/* The stage's report, after it gave its memory back: its measured device peak and what it still holds. */
static void mark_end(const stage_mark *m, h3_stage_report *rep) {
    memset(rep, 0, sizeof *rep);
    rep->on_device = m->on_device;
    rep->seconds = now_s() - m->t0;
    rep->dev_predicted = m->predicted;
    if (!m->ex->cuda) return;
    h3_cuda_qgemm_release(m->ex);
    int64_t used = 0, peak = 0;
    h3_cuda_mem_stats(m->ex, &used, &peak, NULL);
    rep->dev_held = used - m->used0 - m->kept + m->kept_in;
    if (!m->on_device) return;
    rep->dev_peak = peak;
    char kept[96] = "";
    if (m->kept) snprintf(kept, sizeof kept, "; %.3f GiB of weights kept placed for the next run", m->kept / H3_GIB);
    h3_log(H3_LOG_INFO, "%s: device peak %.3f GiB measured, %.3f GiB predicted; %s%s", m->name, peak / H3_GIB,
           m->predicted / H3_GIB, rep->dev_held > 0 ? "" : "all of it given back", kept);
    if (rep->dev_held > 0)
        h3_log(H3_LOG_WARN,
               "%s: %.3f MiB of the device still held when the stage ended (the next stage's plan "
               "does not count them)",
               m->name, rep->dev_held / 1048576.0);
}

/* ---- text encoder -------------------------------------------------------------------------------------- */

h3_status h3_stage_text_encoder(h3_exec *ex, const h3_te_stage *a, h3_tensor *hidden, h3_stage_report *rep) {
    h3_status st = H3_OK;
    h3_text_encoder *own = NULL, *te = a->te;
    h3_tensor dh = {0};
    memset(hidden, 0, sizeof *hidden);
    const int dev = a->plan && a->plan->on_device;
    const char *what = a->path ? a->path : "the text encoder";
    stage_mark mk;
    H3_CHECK(mark_begin(ex, "text encoder", dev, dev ? a->plan->dev_peak : 0, &mk));
    if (!te) {
        h3_te_open_opts o;
        memset(&o, 0, sizeof o);
        o.config_path = a->config_path;
        o.act_place = H3_PLACE_HOST;
        o.on_layer = a->on_layer;
        o.on_layer_user = a->on_layer_user;
        H3_CHECK_CTX(h3_text_encoder_open(a->path, &o, &own), "the text encoder");
        te = own;
    }
    const h3_te_config *c = h3_text_encoder_config(te);
    H3_CHECK(h3_tensor_alloc2(hidden, H3_PLACE_HOST, H3_F32, a->n, c->hidden, H3_MEM_ACTIVATIONS));
    if (dev) {
        /* the layers stream from the files through two device slots; the states come back to the host */
        H3_CHECK_CTX(h3_text_encoder_set_placement(te, H3_PLACE_DEVICE), "the text encoder");
        H3_CHECK(h3_tensor_alloc2(&dh, H3_PLACE_DEVICE, H3_F32, a->n, c->hidden, H3_MEM_ACTIVATIONS));
        if (a->vis)
            H3_CHECK_CTX(h3_vision_encode_prompt(a->vis, te, ex, H3_PLACE_DEVICE, a->ids, a->n, a->pixels,
                                                 a->grid, a->n_img, a->layer, &dh),
                         "the text encoder with images");
        else
            H3_CHECK_CTX(h3_text_encoder_encode(te, ex, a->ids, a->n, a->layer, &dh), "the text encoder");
        H3_CHECK(h3_copy(ex, hidden, &dh));
        H3_CHECK(h3_exec_sync(ex));
    } else {
        if (a->vis)
            H3_CHECK_CTX(h3_vision_encode_prompt(a->vis, te, ex, H3_PLACE_HOST, a->ids, a->n, a->pixels,
                                                 a->grid, a->n_img, a->layer, hidden),
                         "the text encoder with images");
        else
            H3_CHECK_CTX(h3_text_encoder_encode(te, ex, a->ids, a->n, a->layer, hidden), "the text encoder");
    }
    int64_t bad = 0;
    const float *hv = hidden->data;
    for (int64_t i = 0; i < h3_tensor_numel(hidden); i++) bad += !isfinite(hv[i]);
    if (bad)
        H3_FAIL(
            H3_ERR_FORMAT,
            "%lld values of the text encoder's hidden_states[%d] are not finite: its weights (%s) are broken",
            (long long)bad, a->layer, what);
done:
    h3_tensor_free(&dh);
    if (dev && te && h3_text_encoder_set_placement(te, H3_PLACE_HOST) != H3_OK) h3_clear_error();
    h3_text_encoder_close(own);
    if (st != H3_OK) h3_tensor_free(hidden);
    mark_end(&mk, rep);
    return st;
}

/* ---- DiT ----------------------------------------------------------------------------------------------- */

struct h3_dit_stage {
    h3_exec *ex;
    h3_dit *dit;
    const h3_plan *plan;
    int dev;
    const h3_tensor *text_in; /* the caller's */
    h3_tensor text;           /* on the device: its copy (room for text_rows_max rows) */
    int64_t text_rows;        /* the rows it holds now */
    const h3_tensor *text_last; /* the caller's text states it holds (a call's own), NULL: the stage's */
    h3_tensor dxv, dxa;       /* device: a call's input rows [Nv, 96], [Na, 32] */
    h3_tensor dvv, dva;       /* device: its velocities */
    h3_memrep *rep;
    h3_dit_stream *ds;
    int keep, reused; /* keep the placement at the end; it was given (h3_dit_stage_args.stream) */
    int keep_pinned;  /* keep the pinned copies at the end (without keep) */
    int64_t pinned_adopted;
    const char *trace;
    struct h3_dit_group *group; /* a split DiT's rank 0: its group */
    h3_comm *comm;              /* a split DiT's rank (rank 0: its group's handle) */
    stage_mark mk;
    int calls;
    double t_open, t_call0, t_first, t_last; /* when the stage began, the first call began and ended, the last
                                              * ended */
};

static h3_status dev_rows(h3_tensor *t, int64_t rows, int64_t cols) {
    return rows > 0 ? h3_tensor_alloc2(t, H3_PLACE_DEVICE, H3_F32, rows, cols, H3_MEM_ACTIVATIONS) : H3_OK;
}

h3_status h3_dit_stage_open(h3_exec *ex, const h3_dit_stage_args *a, h3_dit_stage **out) {
    *out = NULL;
    h3_dit_stage *s = h3_calloc(1, sizeof *s, H3_MEM_OTHER);
    if (!s) {
        h3_dit_stream_close(a->stream); /* the stage owns it */
        return H3_ERR(H3_ERR_NOMEM, "out of memory");
    }
    h3_status st = H3_OK;
    s->t_open = now_s();
    s->ds = a->stream;
    s->reused = a->stream != NULL;
    s->keep = a->keep && a->plan;
    s->keep_pinned = a->keep_pinned && a->plan;
    s->ex = ex;
    s->dit = a->dit;
    s->plan = a->plan;
    s->dev = a->plan != NULL;
    s->text_in = a->text;
    s->trace = a->memory_trace;
    s->group = a->group;
    s->comm = a->group ? h3_dit_group_comm(a->group) : a->comm;
    const h3_dit_plan *p = s->dev ? &a->plan->dit : NULL;
    H3_CHECK(mark_begin(ex, "DiT", s->dev, p ? p->dev_peak : 0, &s->mk));
    if (s->ds) s->mk.kept_in = a->stream_dev[H3_DEVCAT_WEIGHTS] + a->stream_dev[H3_DEVCAT_SLOTS];
    if (s->dev) {
        if (!p->present) H3_FAIL(H3_ERR_INVALID, "the DiT was not planned");
        /* the arena is the budget; the stream puts every block where the plan says; the report counts each
         * allocation by category */
        H3_CHECK(h3_memrep_create(ex, &s->rep));
        int64_t pred[H3_DEVCAT_COUNT], ppeak;
        h3_dit_plan_predicted(p, pred, &ppeak);
        h3_memrep_set_predicted(s->rep, pred, ppeak, a->plan->budgets.vram);
        h3_dit_placement pl;
        h3_dit_plan_placement(p, &pl);
        if (s->ds) { /* placed by an earlier stage as this plan places it: its bytes are this stage's weights */
            if (!h3_dit_stream_matches(s->ds, &pl))
                H3_FAIL(H3_ERR_INTERNAL, "the DiT's kept placement is not the one planned");
            for (int c = 0; c < H3_DEVCAT_COUNT; c++) h3_memrep_carry(s->rep, (h3_devcat)c, a->stream_dev[c]);
            h3_dit_stream_rebind(s->ds, s->rep);
            h3_memrep_mark(s->rep, "dit: placement kept from the last run");
        } else {
            h3_dit_stream_opts so;
            memset(&so, 0, sizeof so);
            so.pinned_cache = a->pinned;
            H3_CHECK_CTX(h3_dit_stream_open(s->dit, ex, &pl, &so, s->rep, &s->ds), "loading the DiT");
            h3_stream_stats ss;
            h3_dit_stream_stats(s->ds, &ss);
            s->pinned_adopted = ss.pinned_adopted;
            if (ss.pinned_adopted)
                h3_memrep_mark(s->rep, "dit: pinned copies kept from the last run");
            h3_lora_mode lmode;
            if (h3_dit_lora(s->dit, &lmode)) {
                h3_lora_mem lm;
                h3_lora_mem_of(s->dit, &lm);
                h3_log(H3_LOG_INFO,
                       "LoRA: %d weights merged once (resident), %d merged into streamed blocks as they arrive, %d on "
                       "the side path (%.3f GiB of factors at the activation place)",
                       lm.n_merged, lm.n_arrival, lm.n_side, (double)lm.side / H3_GIB);
            }
        }
        h3_memrep_set_category(s->rep, H3_DEVCAT_ACTIVATIONS);
    }
    if (a->n_timesteps > 0) {
        /* the AdaLN modulation of every timestep, once: the calls then read no AdaLN weight */
        if (s->rep) {
            h3_memrep_set_category(s->rep, H3_DEVCAT_MODULATION);
            h3_memrep_mark(s->rep, "dit: modulation");
        }
        H3_CHECK_CTX(h3_dit_precompute_modulation(s->dit, ex, a->timesteps, a->n_timesteps),
                     "precomputing the AdaLN modulation");
        if (s->rep) h3_memrep_set_category(s->rep, H3_DEVCAT_ACTIVATIONS);
    } else if (s->dev) {
        H3_FAIL(H3_ERR_INVALID,
                "the DiT on the device keeps the modulation of the timesteps it is called with");
    }
    if (s->dev) {
        /* after the modulation pass, whose own peak the plan counts without them */
        if (a->text && a->text->shape[0] > 0) {
            const int64_t rows = a->text_rows_max > a->text->shape[0] ? a->text_rows_max : a->text->shape[0];
            H3_CHECK(h3_tensor_alloc2(&s->text, H3_PLACE_DEVICE, H3_F32, rows, a->text->shape[1], H3_MEM_ACTIVATIONS));
            s->text_rows = a->text->shape[0];
            h3_tensor v = s->text;
            v.shape[0] = s->text_rows;
            H3_CHECK(h3_copy(ex, &v, a->text));
        }
        H3_CHECK(dev_rows(&s->dxv, a->n_video_rows, H3_VIDEO_ROW_DIM));
        H3_CHECK(dev_rows(&s->dxa, a->n_audio_rows, H3_AUDIO_LATENT_CHANNELS));
        H3_CHECK(dev_rows(&s->dvv, a->n_video_rows, H3_VIDEO_ROW_DIM));
        H3_CHECK(dev_rows(&s->dva, a->n_audio_rows, H3_AUDIO_LATENT_CHANNELS));
    }
    *out = s;
    return H3_OK;
done:
    h3_dit_stage_close(s, NULL);
    return st;
}

void h3_dit_stage_text_changed(h3_dit_stage *s) {
    if (s) s->text_last = NULL;
}

/* The whole forward, or this rank's share of the split one. */
static h3_status stage_forward(h3_dit_stage *s, const h3_dit_inputs *x, h3_tensor *v, h3_tensor *a) {
    if (s->comm && s->comm->size > 1) return h3_dit_forward_sp(s->dit, s->ex, s->comm, x, v, a);
    return h3_dit_forward(s->dit, s->ex, x, v, a);
}

static h3_status stage_call(h3_dit_stage *s, const h3_dit_inputs *in, h3_tensor *video_v, h3_tensor *audio_v);

h3_status h3_dit_stage_call(h3_dit_stage *s, const h3_dit_inputs *in, h3_tensor *video_v,
                            h3_tensor *audio_v) {
    if (!s->group) return stage_call(s, in, video_v, audio_v);
    /* rank 0 of a split DiT: the call to the other ranks first, then its own share with them */
    H3_TRY(h3_dit_group_send(s->group, in));
    return h3_dit_group_wait(s->group, stage_call(s, in, video_v, audio_v));
}

static h3_status stage_call(h3_dit_stage *s, const h3_dit_inputs *in, h3_tensor *video_v, h3_tensor *audio_v) {
    const double t0 = now_s();
    if (!s->calls) s->t_call0 = t0;
    h3_dit_inputs x = *in;
    if (s->dev) {
        if (!!in->video != !!s->dxv.data || !!in->audio != !!s->dxa.data)
            return H3_ERR(H3_ERR_INVALID, "DiT stage: a call's rows differ from the stage's");
        h3_tensor tv = s->text; /* the rows it holds */
        tv.shape[0] = s->text_rows;
        if (in->text && s->text.data) { /* this call's own text states */
            if (in->text->shape[0] > s->text.shape[0] || in->text->shape[1] != s->text.shape[1])
                return H3_ERR(H3_ERR_INVALID, "DiT stage: a call's text states exceed the stage's room");
            tv.shape[0] = in->text->shape[0];
            if (in->text != s->text_last) H3_TRY(h3_copy(s->ex, &tv, in->text));
            s->text_last = in->text;
            s->text_rows = tv.shape[0];
        }
        x.text = s->text.data ? &tv : NULL;
        /* a call may bring fewer video rows than the stage's room (a long clip's windows differ in keyframes) */
        h3_tensor xv = s->dxv, vv = s->dvv;
        if (in->video) {
            if (in->video->shape[0] > s->dxv.shape[0])
                return H3_ERR(H3_ERR_INVALID, "DiT stage: a call's video rows exceed the stage's room");
            xv.shape[0] = vv.shape[0] = in->video->shape[0];
            H3_TRY(h3_copy(s->ex, &xv, in->video));
            x.video = &xv;
        }
        if (in->audio) {
            H3_TRY(h3_copy(s->ex, &s->dxa, in->audio));
            x.audio = &s->dxa;
        }
        H3_TRY(stage_forward(s, &x, video_v ? &vv : NULL, audio_v ? &s->dva : NULL));
        if (video_v) H3_TRY(h3_copy(s->ex, video_v, &vv));
        if (audio_v) H3_TRY(h3_copy(s->ex, audio_v, &s->dva));
        H3_TRY(h3_exec_sync(s->ex));
        H3_TRY(h3_dit_stream_step_end(s->ds)); /* a failed weight read surfaces here */
    } else {
        x.text = in->text ? in->text : s->text_in;
        H3_TRY(stage_forward(s, &x, video_v, audio_v));
    }
    s->calls++;
    s->t_last = now_s();
    if (s->calls == 1) s->t_first = s->t_last;
    if (s->rep) {
        char mk[32];
        snprintf(mk, sizeof mk, "dit: step %d", s->calls);
        h3_memrep_mark(s->rep, mk);
    }
    return H3_OK;
}

void h3_dit_stage_close(h3_dit_stage *s, h3_dit_stage_result *res) {
    if (!s) return;
    if (res) memset(res, 0, sizeof *res);
    if (s->rep) { /* the report: predicted vs measured by category, copies against the pinned ceiling */
        if (s->ds) h3_dit_stream_to_report(s->ds, s->rep, s->plan->have_time ? s->plan->fig.pinned_gbs : 0);
        char *text = res ? h3_memrep_format(s->rep) : NULL;
        if (text) {
            snprintf(res->memory_report, sizeof res->memory_report, "%s", text);
            h3_free(text);
        }
        /* the timeline whatever happened: a run that failed for memory is when it is wanted most */
        if (s->trace && h3_memrep_write_trace(s->rep, s->trace) != H3_OK) {
            h3_log(H3_LOG_WARN, "--memory-trace: %s", h3_last_error());
            h3_clear_error();
        }
    }
    h3_tensor *ts[] = {&s->text, &s->dxv, &s->dxa, &s->dvv, &s->dva};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) h3_tensor_free(ts[i]);
    if (s->dit) {
        h3_dit_release_workspace(s->dit);
        h3_dit_release_modulation(s->dit);
    }
    h3_dit_stream *kept = NULL;
    int64_t kept_dev[H3_DEVCAT_COUNT] = {0};
    h3_pinned_cache kept_pinned = {0, NULL, NULL};
    if (s->ds && s->keep && s->rep && res && h3_exec_sync(s->ex) != H3_OK) {
        h3_log(H3_LOG_WARN, "DiT: its placement is not kept: %s", h3_last_error()); /* a device in doubt */
        h3_clear_error();
        s->keep = 0;
    }
    if (s->ds && s->keep && s->rep && res) { /* what stays: the stream's weights and slots */
        h3_memrep_figures f;
        h3_memrep_get(s->rep, &f);
        kept_dev[H3_DEVCAT_WEIGHTS] = f.current[H3_DEVCAT_WEIGHTS];
        kept_dev[H3_DEVCAT_SLOTS] = f.current[H3_DEVCAT_SLOTS];
        h3_dit_stream_rebind(s->ds, NULL);
        kept = s->ds;
        s->mk.kept = kept_dev[H3_DEVCAT_WEIGHTS] + kept_dev[H3_DEVCAT_SLOTS];
    } else if (s->ds) {
        if (s->keep_pinned && res) { /* the pinned copies stay for the next stage of this DiT */
            h3_status ps = h3_pinned_cache_init(&kept_pinned, h3_dit_stream_items(s->dit));
            if (ps == H3_OK) ps = h3_dit_stream_take_pinned(s->ds, &kept_pinned);
            if (ps != H3_OK) {
                h3_log(H3_LOG_WARN, "DiT: its pinned copies are not kept: %s", h3_last_error());
                h3_clear_error();
                h3_pinned_cache_free(&kept_pinned);
            }
        }
        h3_dit_stream_close(s->ds); /* slots, resident blocks, pinned copies, staging */
    }
    h3_memrep_free(s->rep);
    h3_stage_report rep;
    mark_end(&s->mk, &rep);
    if (res) {
        res->open_s = s->calls ? s->t_call0 - s->t_open : 0;
        res->reused_stream = s->reused;
        res->pinned = kept_pinned;
        res->pinned_adopted = s->pinned_adopted;
        res->stream = kept;
        memcpy(res->stream_dev, kept_dev, sizeof kept_dev);
        res->rep = rep;
        res->calls = s->calls;
        res->call_s = s->calls > 1 ? (s->t_last - s->t_first) / (s->calls - 1)
                      : s->calls   ? s->t_first - s->t_call0
                                   : 0;
    }
    h3_free(s);
}

typedef struct sample_ctx {
    h3_dit_stage *s;
    const h3_seq_layout *L;
    int32_t *tidx, *tags, *vi, *ai, *ti;
    const float *held, *held_noise; /* held audio rows and their noise (NULL: sampled) */
    float *held_x;                  /* [Na·32] the held rows at the call's sigma */
    int64_t nc;                     /* keyframe rows: the DiT's video rows are [cond | target] */
    const char *dump;               /* the first call's inputs go here (then NULL) */
    const h3_tensor *text;
    const h3_tensor *call_text;     /* a long clip's window: its text states, given with each call (NULL: the
                                     * stage's) */
    const float *cond;              /* [nc·96] the keyframe rows, copied in front of each call's rows */
    float *xv, *vv;                 /* [(nc + Nv)·96] a call's video rows and velocities (nc > 0) */
    int64_t nra;                    /* ref2va: reference audio rows in front of the target's audio rows */
    const float *ref_audio;         /* [nra·32] */
    float *xa, *va;                 /* [(nra + Na)·32] a call's audio rows and velocities (nra > 0) */
} sample_ctx;

/* The row tables of a layout (c->L, c->nc set) as the DiT takes them. */
static h3_status sample_tables(sample_ctx *c) {
    const h3_seq_layout *L = c->L;
    const size_t S = (size_t)L->seq_len;
    c->tidx = h3_malloc(S * sizeof(int32_t), H3_MEM_ACTIVATIONS);
    c->tags = h3_malloc(S * sizeof(int32_t), H3_MEM_ACTIVATIONS);
    c->vi = h3_malloc((size_t)(c->nc + L->n_video_rows) * sizeof(int32_t) + 4, H3_MEM_ACTIVATIONS);
    c->ai = h3_malloc((size_t)(c->nra + L->n_audio_rows) * sizeof(int32_t) + 4, H3_MEM_ACTIVATIONS);
    c->ti = h3_malloc((size_t)L->text_len * sizeof(int32_t) + 4, H3_MEM_ACTIVATIONS);
    if (!c->tidx || !c->tags || !c->vi || !c->ai || !c->ti)
        return H3_ERR(H3_ERR_NOMEM, "out of memory for the packed sequence (%lld rows)", (long long)L->seq_len);
    for (size_t i = 0; i < S; i++) c->tags[i] = L->tags[i];
    for (int64_t i = 0; i < c->nc; i++) c->vi[i] = (int32_t)L->cond_indices[i];
    for (int64_t i = 0; i < L->n_video_rows; i++) c->vi[c->nc + i] = (int32_t)L->video_indices[i];
    for (int64_t i = 0; i < c->nra; i++) c->ai[i] = (int32_t)L->ref_audio_indices[i];
    for (int64_t i = 0; i < L->n_audio_rows; i++) c->ai[c->nra + i] = (int32_t)L->audio_indices[i];
    for (int64_t i = 0; i < L->text_len; i++) c->ti[i] = (int32_t)L->text_indices[i];
    return H3_OK;
}

static void sample_tables_free(sample_ctx *c) {
    h3_free(c->tidx);
    h3_free(c->tags);
    h3_free(c->vi);
    h3_free(c->ai);
    h3_free(c->ti);
}

static h3_status sample_model(void *user, const float *x_video, const float *x_audio, float t_video,
                              float t_audio, float *v_video, float *v_audio) {
    sample_ctx *c = user;
    const h3_seq_layout *L = c->L;
    if (c->held && !c->held_noise) t_audio = 1.0f; /* audio held clean (a soundtrack): t = 1 in every call */
    float uniq[4];
    int nt = h3_seq_layout_timestep_indices(L, t_video, t_audio, uniq, c->tidx);
    const int64_t nv_all = c->nc + L->n_video_rows, na_all = c->nra + L->n_audio_rows;
    float *v_target = v_video, *va_target = v_audio;
    if (c->nc) { /* the keyframe rows ride in front of the target's, unchanged */
        memcpy(c->xv, c->cond, (size_t)(c->nc * H3_VIDEO_ROW_DIM) * sizeof(float)); /* a shared buffer */
        memcpy(c->xv + c->nc * H3_VIDEO_ROW_DIM, x_video,
               (size_t)(L->n_video_rows * H3_VIDEO_ROW_DIM) * sizeof(float));
        x_video = c->xv;
        v_video = c->vv;
    }
    if (c->held && !c->held_noise) {
        x_audio = c->held;
    } else if (c->held) { /* the kept audio at this call's noise level, in place of the sampler's */
        const float sig = 1.0f - t_audio, keep = 1.0f - sig;
        const int64_t n = L->n_audio_rows * H3_AUDIO_LATENT_CHANNELS;
        for (int64_t i = 0; i < n; i++) c->held_x[i] = keep * c->held[i] + sig * c->held_noise[i];
        x_audio = c->held_x;
    }
    if (c->nra) { /* the references' audio rows ride in front of the target's, clean */
        memcpy(c->xa, c->ref_audio, (size_t)(c->nra * H3_AUDIO_LATENT_CHANNELS) * sizeof(float));
        memcpy(c->xa + c->nra * H3_AUDIO_LATENT_CHANNELS, x_audio,
               (size_t)(L->n_audio_rows * H3_AUDIO_LATENT_CHANNELS) * sizeof(float));
        x_audio = c->xa;
        v_audio = c->va;
    }
    h3_tensor hxv, hxa, hvv, hva;
    H3_TRY(h3_tensor_wrap(&hxv, (void *)x_video, H3_PLACE_HOST, H3_F32, 2,
                          (int64_t[]){nv_all, H3_VIDEO_ROW_DIM}));
    H3_TRY(h3_tensor_wrap(&hxa, (void *)x_audio, H3_PLACE_HOST, H3_F32, 2,
                          (int64_t[]){na_all, H3_AUDIO_LATENT_CHANNELS}));
    H3_TRY(h3_tensor_wrap(&hvv, v_video, H3_PLACE_HOST, H3_F32, 2,
                          (int64_t[]){nv_all, H3_VIDEO_ROW_DIM}));
    H3_TRY(h3_tensor_wrap(&hva, v_audio, H3_PLACE_HOST, H3_F32, 2,
                          (int64_t[]){na_all, H3_AUDIO_LATENT_CHANNELS}));
    h3_dit_inputs in = {&hxv,    &hxa,    c->call_text, uniq,  nt,    L->seq_len,
                        c->tidx, c->tags, L->pos, c->vi, c->ai, c->ti};
    if (c->dump) { /* the first call's inputs, as `h3run dit` reads them */
        h3_st_writer *w = NULL;
        h3_status st = h3_st_writer_new(&w);
        const int64_t S = L->seq_len, s3[2] = {S, 3}, s1[1] = {S}, sv[1] = {nv_all},
                      sa[1] = {na_all}, stx[1] = {L->text_len}, su[1] = {nt};
        if (st == H3_OK) st = h3_st_writer_add_tensor(w, "video", &hxv);
        if (st == H3_OK) st = h3_st_writer_add_tensor(w, "audio", &hxa);
        if (st == H3_OK) st = h3_st_writer_add_tensor(w, "text", c->text);
        if (st == H3_OK) st = h3_st_writer_add(w, "timesteps", H3_F32, 1, su, uniq);
        if (st == H3_OK) st = h3_st_writer_add(w, "position_ids", H3_F64, 2, s3, L->pos);
        if (st == H3_OK) st = h3_st_writer_add(w, "timestep_indices", H3_I32, 1, s1, c->tidx);
        if (st == H3_OK) st = h3_st_writer_add(w, "token_tags", H3_I32, 1, s1, c->tags);
        if (st == H3_OK) st = h3_st_writer_add(w, "video_indices", H3_I32, 1, sv, c->vi);
        if (st == H3_OK) st = h3_st_writer_add(w, "audio_indices", H3_I32, 1, sa, c->ai);
        if (st == H3_OK) st = h3_st_writer_add(w, "text_indices", H3_I32, 1, stx, c->ti);
        if (st == H3_OK) st = h3_st_writer_write(w, c->dump, 0);
        h3_st_writer_free(w);
        H3_TRY_CTX(st, "writing the DiT's inputs to %s", c->dump);
        c->dump = NULL;
    }
    H3_TRY(h3_dit_stage_call(c->s, &in, &hvv, &hva));
    if (c->nc)
        memcpy(v_target, c->vv + c->nc * H3_VIDEO_ROW_DIM,
               (size_t)(L->n_video_rows * H3_VIDEO_ROW_DIM) * sizeof(float));
    if (c->nra)
        memcpy(va_target, c->va + c->nra * H3_AUDIO_LATENT_CHANNELS,
               (size_t)(L->n_audio_rows * H3_AUDIO_LATENT_CHANNELS) * sizeof(float));
    return H3_OK;
}

/* A long clip's model call: each window's rows gathered from the clip's, the DiT run on them, the velocities
 * added with the window's weights and divided by the weights' sums (pipeline/window.h). */
typedef struct window_ctx {
    sample_ctx *c;                 /* window 0's context (every window's without win_layout) */
    sample_ctx *own;               /* [n] each window's (its layout, tables, text states, keyframe rows), or NULL */
    const h3_windows *w;
    int64_t rv;                    /* floats of one latent frame's video rows */
    float *xv, *xa, *vv, *va;      /* one window's rows and velocities */
    const float *held, *held_noise; /* the clip's held audio rows (a soundtrack; the refine pass: with their
                                     * noise), or NULL */
    float *held_w, *held_nw;        /* one window's */
    float *sum_v, *sum_a;          /* [latent_t], [audio_t]: the weights' sums */
} window_ctx;

static h3_status window_model(void *user, const float *x_video, const float *x_audio, float t_video,
                              float t_audio, float *v_video, float *v_audio) {
    window_ctx *q = user;
    const h3_windows *w = q->w;
    const int64_t rv = q->rv, C = H3_AUDIO_LATENT_CHANNELS, Ta = w->audio_t, Tw = w->win_audio_t;
    memset(v_video, 0, (size_t)(w->latent_t * rv) * sizeof(float));
    memset(v_audio, 0, (size_t)(2 * Ta * C) * sizeof(float));
    for (int k = 0; k < w->n; k++) {
        if (k) H3_TRY(h3_cancel_check()); /* a step of many windows takes a while */
        const int64_t v0 = w->v_start[k], a0 = w->a_start[k];
        memcpy(q->xv, x_video + v0 * rv, (size_t)(w->win_t * rv) * sizeof(float));
        for (int ch = 0; ch < 2; ch++) {
            memcpy(q->xa + ch * Tw * C, x_audio + (ch * Ta + a0) * C, (size_t)(Tw * C) * sizeof(float));
            if (q->held)
                memcpy(q->held_w + ch * Tw * C, q->held + (ch * Ta + a0) * C, (size_t)(Tw * C) * sizeof(float));
            if (q->held_noise)
                memcpy(q->held_nw + ch * Tw * C, q->held_noise + (ch * Ta + a0) * C, (size_t)(Tw * C) * sizeof(float));
        }
        sample_ctx *c = q->own && k ? &q->own[k] : q->c;
        c->held = q->held ? q->held_w : NULL;
        c->held_noise = q->held_noise ? q->held_nw : NULL;
        H3_TRY(sample_model(c, q->xv, q->xa, t_video, t_audio, q->vv, q->va));
        for (int64_t j = 0; j < w->win_t; j++) {
            const float wt = h3_window_weight(w, k, j, 0);
            float *dst = v_video + (v0 + j) * rv;
            const float *src = q->vv + j * rv;
            for (int64_t i = 0; i < rv; i++) dst[i] += wt * src[i];
        }
        for (int64_t j = 0; j < Tw; j++) {
            const float wt = h3_window_weight(w, k, j, 1);
            for (int ch = 0; ch < 2; ch++) {
                float *dst = v_audio + (ch * Ta + a0 + j) * C;
                const float *src = q->va + (ch * Tw + j) * C;
                for (int64_t i = 0; i < C; i++) dst[i] += wt * src[i];
            }
        }
    }
    for (int64_t t = 0; t < w->latent_t; t++) {
        const float inv = 1.0f / q->sum_v[t];
        float *dst = v_video + t * rv;
        for (int64_t i = 0; i < rv; i++) dst[i] *= inv;
    }
    for (int ch = 0; ch < 2; ch++)
        for (int64_t t = 0; t < Ta; t++) {
            const float inv = 1.0f / q->sum_a[t];
            float *dst = v_audio + (ch * Ta + t) * C;
            for (int64_t i = 0; i < C; i++) dst[i] *= inv;
        }
    return H3_OK;
}

static void window_ctx_free(window_ctx *q) {
    for (int k = 1; q->own && k < q->w->n; k++) sample_tables_free(&q->own[k]); /* [0] is q->c's */
    h3_free(q->own);
    h3_free(q->xv);
    h3_free(q->xa);
    h3_free(q->vv);
    h3_free(q->va);
    h3_free(q->held_w);
    h3_free(q->held_nw);
    h3_free(q->sum_v);
    h3_free(q->sum_a);
}

static h3_status window_ctx_init(window_ctx *q, sample_ctx *c, const h3_windows *w, const h3_seq_layout *L,
                                 const float *held, const float *held_noise) {
    memset(q, 0, sizeof *q);
    q->c = c;
    q->held_noise = held_noise;
    q->w = w;
    q->held = held;
    if (L->latent_t != w->win_t || L->audio_t != w->win_audio_t)
        return H3_ERR(H3_ERR_INTERNAL, "the layout is not one window's");
    q->rv = L->n_video_rows / L->latent_t * H3_VIDEO_ROW_DIM;
    const size_t nv = (size_t)(w->win_t * q->rv) * sizeof(float),
                 na = (size_t)(2 * w->win_audio_t * H3_AUDIO_LATENT_CHANNELS) * sizeof(float);
    q->xv = h3_malloc(nv, H3_MEM_ACTIVATIONS);
    q->vv = h3_malloc(nv, H3_MEM_ACTIVATIONS);
    q->xa = h3_malloc(na, H3_MEM_ACTIVATIONS);
    q->va = h3_malloc(na, H3_MEM_ACTIVATIONS);
    q->held_w = held ? h3_malloc(na, H3_MEM_ACTIVATIONS) : NULL;
    q->held_nw = held_noise ? h3_malloc(na, H3_MEM_ACTIVATIONS) : NULL;
    q->sum_v = h3_calloc((size_t)w->latent_t, sizeof(float), H3_MEM_ACTIVATIONS);
    q->sum_a = h3_calloc((size_t)w->audio_t, sizeof(float), H3_MEM_ACTIVATIONS);
    if (!q->xv || !q->vv || !q->xa || !q->va || (held && !q->held_w) || (held_noise && !q->held_nw) || !q->sum_v ||
        !q->sum_a)
        return H3_ERR(H3_ERR_NOMEM, "out of memory for the windows' rows");
    for (int k = 0; k < w->n; k++) {
        for (int64_t j = 0; j < w->win_t; j++) q->sum_v[w->v_start[k] + j] += h3_window_weight(w, k, j, 0);
        for (int64_t j = 0; j < w->win_audio_t; j++) q->sum_a[w->a_start[k] + j] += h3_window_weight(w, k, j, 1);
    }
    for (int64_t t = 0; t < w->latent_t; t++)
        if (!(q->sum_v[t] > 0)) return H3_ERR(H3_ERR_INTERNAL, "latent frame %lld is in no window", (long long)t);
    for (int64_t t = 0; t < w->audio_t; t++)
        if (!(q->sum_a[t] > 0)) return H3_ERR(H3_ERR_INTERNAL, "audio latent %lld is in no window", (long long)t);
    if (held) c->held = q->held_w;
    return H3_OK;
}

h3_status h3_stage_dit_sample(h3_exec *ex, const h3_dit_sample_args *a, float *video_rows, float *audio_rows,
                              h3_dit_stage_result *res) {
    h3_status st = H3_OK;
    const h3_seq_layout *L = a->layout;
    sample_ctx c;
    memset(&c, 0, sizeof c);
    c.L = L;
    int stream_owned = a->dit.stream != NULL; /* a kept placement given: closed here if the stage never opens */
    h3_dit_group *group = NULL;
    h3_step_cache cache;
    int have_cache = 0;
    window_ctx wc;
    memset(&wc, 0, sizeof wc);
    const h3_windows *win = a->windows && a->windows->n > 1 ? a->windows : NULL;
    if (res) memset(res, 0, sizeof *res);
    if (L->seq_len > INT32_MAX)
        H3_FAIL(H3_ERR_INVALID, "%lld packed rows do not fit 32-bit row numbers", (long long)L->seq_len);
    c.nc = L->n_cond_rows;
    c.nra = L->n_ref_audio_rows;
    c.ref_audio = a->ref_audio_rows;
    c.dump = a->dump_inputs;
    c.text = a->dit.text;
    if (c.nc && !a->cond_rows) return H3_ERR(H3_ERR_INVALID, "the layout has keyframe rows but none were given");
    if (c.nra && (!a->ref_audio_rows || win))
        return H3_ERR(H3_ERR_INVALID, "the layout has reference audio rows but none were given (or windows)");
    int64_t nc_max = c.nc, text_max = 0; /* over the windows */
    if (win && a->win_layout)
        for (int k = 0; k < win->n; k++) {
            if (a->win_layout[k]->n_cond_rows > nc_max) nc_max = a->win_layout[k]->n_cond_rows;
            if (a->win_text[k]->shape[0] > text_max) text_max = a->win_text[k]->shape[0];
        }
    H3_CHECK(sample_tables(&c));
    if (a->held_audio) {
        c.held = a->held_audio;
        c.held_noise = a->held_noise;
        c.held_x = h3_malloc((size_t)L->n_audio_rows * H3_AUDIO_LATENT_CHANNELS * sizeof(float) + 4,
                             H3_MEM_ACTIVATIONS);
        if (!c.held_x) H3_FAIL(H3_ERR_NOMEM, "out of memory for the held audio rows");
    }
    c.cond = a->cond_rows;
    if (nc_max) { /* one buffer pair for every window's [keyframes | target] rows */
        const size_t nb = (size_t)((nc_max + L->n_video_rows) * H3_VIDEO_ROW_DIM) * sizeof(float);
        c.xv = h3_malloc(nb, H3_MEM_ACTIVATIONS);
        c.vv = h3_malloc(nb, H3_MEM_ACTIVATIONS);
        if (!c.xv || !c.vv) H3_FAIL(H3_ERR_NOMEM, "out of memory for the keyframe rows");
    }
    if (c.nra) {
        const size_t nb = (size_t)((c.nra + L->n_audio_rows) * H3_AUDIO_LATENT_CHANNELS) * sizeof(float);
        c.xa = h3_malloc(nb, H3_MEM_ACTIVATIONS);
        c.va = h3_malloc(nb, H3_MEM_ACTIVATIONS);
        if (!c.xa || !c.va) H3_FAIL(H3_ERR_NOMEM, "out of memory for the reference audio rows");
    }
    h3_dit_stage_args da = a->dit;
    da.n_video_rows = nc_max + L->n_video_rows; /* the most a call brings */
    da.n_audio_rows = c.nra + L->n_audio_rows;
    if (text_max > da.text_rows_max) da.text_rows_max = text_max;
    if (a->gpus > 1) { /* the other GPUs' workers: they place their blocks while this one places its own */
        if (!a->dit.plan) H3_FAIL(H3_ERR_INVALID, "a DiT split over GPUs runs on the device");
        h3_dit_rank_setup su = a->split;
        su.plan = a->dit.plan;
        su.text = da.text;
        su.text_rows_max = da.text_rows_max;
        su.n_video_rows = da.n_video_rows;
        su.n_audio_rows = da.n_audio_rows;
        su.timesteps = da.timesteps;
        su.n_timesteps = da.n_timesteps;
        H3_CHECK(h3_dit_group_start(a->gpus, &su, ex, &group));
        da.group = group;
        da.keep = da.keep_pinned = 0; /* the workers end with the stage: nothing of it is kept */
    }
    stream_owned = 0; /* the stage's from here, whatever happens */
    H3_CHECK(h3_dit_stage_open(ex, &da, &c.s));
    h3_sample_args sa = {a->sampler,  a->schedule,    sample_model,  &c,
                         a->on_step,  a->step_ctx,    a->from_latent, a->start_step};
    size_t na = (size_t)(L->n_audio_rows * H3_AUDIO_LATENT_CHANNELS);
    size_t nv = (size_t)(L->n_video_rows * H3_VIDEO_ROW_DIM);
    if (win) { /* the sampler integrates the whole clip; each call runs every window */
        H3_CHECK(window_ctx_init(&wc, &c, win, L, a->held_audio, a->held_noise));
        if (a->win_layout) { /* a context per window: its layout, tables, text states and keyframe rows */
            wc.own = h3_calloc((size_t)win->n, sizeof(sample_ctx), H3_MEM_ACTIVATIONS);
            if (!wc.own) H3_FAIL(H3_ERR_NOMEM, "out of memory for the windows' tables");
            c.call_text = a->win_text[0];
            for (int k = 1; k < win->n; k++) {
                const h3_seq_layout *lk = a->win_layout[k];
                if (lk->text_len != a->win_text[k]->shape[0] || lk->n_video_rows != L->n_video_rows ||
                    lk->n_audio_rows != L->n_audio_rows || (lk->n_cond_rows && !a->win_cond[k]))
                    H3_FAIL(H3_ERR_INTERNAL, "window %d's layout does not match its text, rows or keyframes", k);
                sample_ctx *e = &wc.own[k];
                *e = c;
                e->L = lk;
                e->nc = lk->n_cond_rows;
                e->cond = a->win_cond[k];
                e->text = e->call_text = a->win_text[k];
                e->dump = NULL;
                e->tidx = e->tags = e->vi = e->ai = e->ti = NULL; /* its own tables; held_x shared */
                H3_CHECK(sample_tables(e));
            }
        }
        nv = (size_t)(win->latent_t * wc.rv);
        na = (size_t)(2 * win->audio_t * H3_AUDIO_LATENT_CHANNELS);
        sa.model = window_model;
        sa.model_ctx = &wc;
    }
    if (a->cache) { /* EasyCache around the DiT's call */
        H3_CHECK(h3_step_cache_init(&cache, a->cache, sa.model, sa.model_ctx, nv, na, a->schedule->n - 1,
                                    a->start_step));
        have_cache = 1;
        sa.model = h3_step_cache_model;
        sa.model_ctx = &cache;
    }
    st = h3_sample(&sa, video_rows, nv, audio_rows, na);
    if (st == H3_OK && a->held_audio) memcpy(audio_rows, a->held_audio, na * sizeof(float)); /* kept, not sampled */
done:
    if (c.s && st != H3_OK) c.s->keep = c.s->keep_pinned = 0; /* a failed stage gives everything back */
    if (stream_owned) h3_dit_stream_close(a->dit.stream);
    h3_free(c.held_x);
    window_ctx_free(&wc);
    h3_free(c.xv);
    h3_free(c.vv);
    h3_free(c.xa);
    h3_free(c.va);
    h3_dit_stage_close(c.s, res);
    if (group && st == H3_OK &&
        a->keep_group) { /* the workers give their DiT back too and wait for the decode */
        st = h3_dit_group_end_dit(group);
        if (st == H3_OK) {
            *a->keep_group = group;
            group = NULL;
        }
    }
    h3_dit_group_stop(group);
    if (have_cache) {
        if (res) res->cache = cache.st;
        h3_step_cache_free(&cache);
    }
    sample_tables_free(&c);
    return st;
}

/* ---- the VAEs ------------------------------------------------------------------------------------------ */

h3_status h3_stage_audio_vae(h3_exec *ex, h3_audio_vae *v, const h3_stage_plan *plan,
                             const h3_tensor *latents, h3_tensor *waveform, h3_stage_report *rep) {
    h3_status st = H3_OK;
    const int dev = plan && plan->on_device;
    stage_mark mk;
    H3_CHECK(mark_begin(ex, "audio VAE", dev, dev ? plan->dev_peak : 0, &mk));
    /* on the device: the weights uploaded as f32 by the decode, both channels in one batch */
    if (dev) H3_CHECK_CTX(h3_audio_vae_set_placement(v, H3_PLACE_DEVICE), "the audio VAE");
    H3_CHECK_CTX(h3_audio_vae_decode(v, ex, latents, waveform), "the audio VAE");
done:
    if (dev && h3_audio_vae_set_placement(v, H3_PLACE_HOST) != H3_OK) /* the device weights back */
        h3_clear_error();
    mark_end(&mk, rep);
    return st;
}

h3_status h3_stage_video_vae(h3_exec *ex, h3_video_vae *v, const h3_stage_plan *plan,
                             const h3_video_split *split, const h3_tensor *latents,
                             const h3_video_decode_out *out, h3_stage_report *rep) {
    h3_status st = H3_OK;
    const int dev = plan && plan->on_device;
    h3_dit_group *g = split ? split->group : NULL;
    int sent = 0;
    stage_mark mk;
    H3_CHECK(mark_begin(ex, "video VAE", dev, dev ? plan->dev_peak : 0, &mk));
    if (g) { /* the workers place theirs while this GPU places its own */
        H3_CHECK(h3_dit_group_send_decode(g, split->vae_path, split->opts, latents));
        sent = 1;
    }
    if (dev) {
        const int off = latents->ndim == 5;
        if (latents->ndim < 4 || latents->shape[off + 2] != plan->vvae.H ||
            latents->shape[off + 3] != plan->vvae.W)
            H3_FAIL(H3_ERR_INVALID, "the video VAE was planned for %lldx%lld latents",
                    (long long)plan->vvae.H, (long long)plan->vvae.W);
        /* the blocks that fit stay resident, the rest stream; a chunk's tiles decode in passes */
        H3_CHECK_CTX(h3_video_vae_place(v, ex, &plan->vvae, NULL), "loading the video VAE");
    }
    H3_CHECK_CTX(h3_video_vae_decode_split(v, ex, latents, out, g ? h3_dit_group_comm(g) : NULL),
                 "the video VAE");
done:
    if (sent) st = h3_dit_group_wait(g, st); /* every worker's answer; a worker's failure named */
    if (dev) h3_video_vae_unplace(v);
    mark_end(&mk, rep);
    return st;
}

/* ---- the video VAE encoder ------------------------------------------------------------------------------
 */

h3_status h3_stage_video_encode(h3_exec *ex, h3_video_enc *e, const h3_tensor *pixels, int sample,
                                uint64_t seed, h3_tensor *latents) {
    const h3_video_enc_config *c = h3_video_enc_get_config(e);
    H3_TRY(h3_video_enc_check_pixels(c, pixels));
    const int lead = pixels->ndim == 5;
    const int64_t F = pixels->shape[lead + 1], r = c->spatial_ratio;
    const int64_t s[5] = {1, 2 * (int64_t)c->latent_channels, h3_video_enc_latent_frames(c, F),
                          pixels->shape[lead + 2] / r, pixels->shape[lead + 3] / r};
    h3_tensor m = {0};
    float *noise = NULL;
    h3_status st = h3_tensor_alloc(&m, H3_PLACE_HOST, H3_F32, 5, s, H3_MEM_ACTIVATIONS);
    if (st == H3_OK) st = h3_video_enc_encode(e, ex, pixels, &m);
    if (st == H3_OK && sample) {
        const int64_t n = h3_tensor_numel(&m) / 2;
        noise = h3_malloc((size_t)n * sizeof(float), H3_MEM_ACTIVATIONS);
        if (!noise)
            st = H3_ERR(H3_ERR_NOMEM, "out of memory for the posterior's noise");
        else
            h3_rng_normal_at(seed, H3_RNG_STREAM_VAE_ENCODE, 0, noise, (size_t)n);
    }
    if (st == H3_OK) st = h3_video_enc_posterior(c, &m, noise, latents);
    h3_free(noise);
    h3_tensor_free(&m);
    return st;
}

h3_status h3_stage_references(h3_exec *ex, h3_video_enc *e, const h3_stage_plan *vplan, struct h3_audio_enc *ae,
                              const h3_stage_plan *aplan, const struct h3_audio_vae_config *avc,
                              const struct h3_ref_set *s, uint64_t seed, float **vrows, float **arows, float **clean,
                              h3_status (*on_done)(void *user, int done, int total), void *user,
                              h3_stage_report *rep) {
    h3_status st = H3_OK;
    const int vdev = e && vplan && vplan->on_device, adev = ae && aplan && aplan->on_device;
    const int64_t vpeak = vdev ? vplan->dev_peak : 0, apeak = adev ? aplan->dev_peak : 0;
    stage_mark mk;
    H3_CHECK(mark_begin(ex, "references' encoders", vdev || adev, vpeak > apeak ? vpeak : apeak, &mk));
    if (ae) {
        if (adev) H3_CHECK_CTX(h3_audio_enc_place(ae, ex, H3_PLACE_DEVICE), "loading the audio VAE's encoder");
        H3_CHECK(h3_refs_encode_sounds(ex, ae, avc, s, arows, on_done, user));
        if (adev) H3_CHECK(h3_audio_enc_place(ae, ex, H3_PLACE_HOST));
    } else {
        H3_CHECK(h3_refs_encode_sounds(ex, NULL, avc, s, arows, on_done, user));
    }
    if (vdev) H3_CHECK_CTX(h3_video_enc_place(e, ex, H3_PLACE_DEVICE), "loading the video VAE's encoder");
    H3_CHECK(h3_refs_encode_visuals(ex, e, s, seed, vrows, clean, on_done, user));
done:
    if (adev && h3_audio_enc_place(ae, ex, H3_PLACE_HOST) != H3_OK) h3_clear_error();
    if (vdev && h3_video_enc_place(e, ex, H3_PLACE_HOST) != H3_OK) h3_clear_error();
    mark_end(&mk, rep);
    return st;
}

h3_status h3_stage_audio_encode(h3_exec *ex, struct h3_audio_enc *ae, const h3_stage_plan *plan, const h3_tensor *wave,
                                h3_tensor *latents, h3_stage_report *rep) {
    h3_status st = H3_OK;
    const int dev = plan && plan->on_device;
    stage_mark mk;
    H3_CHECK(mark_begin(ex, "audio VAE encoder", dev, dev ? plan->dev_peak : 0, &mk));
    if (dev) H3_CHECK_CTX(h3_audio_enc_place(ae, ex, H3_PLACE_DEVICE), "loading the audio VAE's encoder");
    H3_CHECK(h3_audio_enc_encode(ae, ex, wave, latents));
done:
    if (dev && h3_audio_enc_place(ae, ex, H3_PLACE_HOST) != H3_OK) h3_clear_error();
    mark_end(&mk, rep);
    return st;
}

h3_status h3_stage_keyframes(h3_exec *ex, h3_video_enc *e, const h3_stage_plan *plan, const h3_keyframe_set *s,
                             uint64_t seed, h3_tensor *clean, float **rows,
                             h3_status (*on_done)(void *user, int done, int total), void *user,
                             h3_stage_report *rep) {
    h3_status st = H3_OK;
    const int dev = plan && plan->on_device;
    stage_mark mk;
    H3_CHECK(mark_begin(ex, "video VAE encoder", dev, dev ? plan->dev_peak : 0, &mk));
    if (dev) H3_CHECK_CTX(h3_video_enc_place(e, ex, H3_PLACE_DEVICE), "loading the video VAE's encoder");
    H3_CHECK(h3_keyframes_condition(ex, e, s, seed, clean, rows, on_done, user));
done:
    if (dev && h3_video_enc_place(e, ex, H3_PLACE_HOST) != H3_OK) h3_clear_error();
    mark_end(&mk, rep);
    return st;
}

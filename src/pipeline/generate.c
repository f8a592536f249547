#include "pipeline/generate.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "io/detect.h"
#include "io/discover.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "mem/budget.h"
#include "models/dit_stream.h"
#include "pipeline/plan.h"
#include "mem/report.h"
#include "models/audio_vae.h"
#include "models/audio_vae_enc.h"
#include "models/dit.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"
#include "models/video_vae_enc.h"
#include "models/vision.h"
#include "pipeline/keyframe.h"
#include "pipeline/layout.h"
#include "pipeline/window.h"
#include "pipeline/media.h"
#include "pipeline/session.h"
#include "pipeline/stages.h"
#include "pipeline/turbo.h"
#include "sample/rng.h"
#include "sample/sampler.h"
#include "sample/schedule.h"

/* ---- names --------------------------------------------------------------------------------------------- */

static const char *const g_device_names[] = {"auto", "cpu", "cuda"};

const char *h3_device_name(h3_device d) {
    return (unsigned)d < 3 ? g_device_names[d] : "?";
}

h3_status h3_device_parse(const char *name, h3_device *out) {
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, g_device_names[i])) {
            *out = (h3_device)i;
            return H3_OK;
        }
    return H3_ERR(H3_ERR_INVALID,
                  "unknown device '%s': choose cpu, cuda or auto (cuda when a GPU is present)",
                  name ? name : "");
}

static const char *const g_stage_names[H3_GEN_STAGES] = {
    "tokenize", "text_encoder", "keyframes", "references", "soundtrack", "dit", "refine", "audio_vae", "video_vae",
    "mux"};

const char *h3_generate_stage_name(int stage) {
    return stage >= 0 && stage < H3_GEN_STAGES ? g_stage_names[stage] : "?";
}

void h3_generate_request_init(h3_generate_request *r) {
    memset(r, 0, sizeof *r);
    h3_request_init(&r->req);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- finding the components ---------------------------------------------------------------------------- */

void h3_model_files_free(h3_model_files *f) {
    if (!f) return;
    h3_free(f->dit);
    h3_free(f->text_encoder);
    h3_free(f->tokenizer);
    h3_free(f->video_vae);
    h3_free(f->audio_vae);
    h3_free(f->root);
    memset(f, 0, sizeof *f);
}

/* dir/name when it is a folder (is_dir) or a file, else NULL; *err set on allocation failure. */
static char *sub_if(const char *dir, const char *name, int want_dir, int *err) {
    char *p = h3_path_join(dir, name);
    if (!p) {
        *err = 1;
        return NULL;
    }
    if (want_dir ? h3_path_is_dir(p) : h3_path_is_file(p)) return p;
    h3_free(p);
    return NULL;
}

static int icontains(const char *s, const char *needle) {
    size_t n = strlen(needle);
    for (; *s; s++) {
        size_t i = 0;
        while (i < n && s[i] && tolower((unsigned char)s[i]) == needle[i]) i++;
        if (i == n) return 1;
    }
    return 0;
}

/* ComfyUI: the best weight set of each component among the files of a few subfolders. */
typedef struct {
    char *path[5];
    int score[5], count[5];
    int nomem;
    int ref; /* a ref2va request: the Ref2VA DiT first */
} comfy_scan;

static int comfy_visit(const char *set_path, void *user) {
    comfy_scan *cs = user;
    h3_st_set s;
    if (h3_st_open(set_path, &s) != H3_OK) {
        h3_log(H3_LOG_DEBUG, "skipping %s: %s", set_path, h3_last_error());
        h3_clear_error();
        return 0;
    }
    h3_detect_info info;
    h3_status st = h3_detect(&s, &info);
    h3_st_close(&s);
    if (st != H3_OK || info.comp == H3_COMP_UNKNOWN) {
        h3_clear_error();
        return 0;
    }
    int c = (int)info.comp, score = 1;
    if (info.comp == H3_COMP_DIT)
        score = (info.n_quantized ? 0 : 4) +
                (cs->ref ? (icontains(set_path, "ref2va") ? 2 : 0) + (icontains(set_path, "fl2va") ? 0 : 1)
                         : (icontains(set_path, "fl2va") ? 2 : 0) + (icontains(set_path, "ref2va") ? 0 : 1));
    else if (info.comp == H3_COMP_TEXT_ENCODER)
        score = info.n_quantized ? 0 : 2;
    cs->count[c]++;
    if (!cs->path[c] || score > cs->score[c]) {
        char *p = h3_strdup(set_path);
        if (!p) {
            cs->nomem = 1;
            return 1;
        }
        h3_free(cs->path[c]);
        cs->path[c] = p;
        cs->score[c] = score;
    }
    return 0;
}

static h3_status find_comfy(const char *root, int ref, h3_model_files *f) {
    comfy_scan cs;
    memset(&cs, 0, sizeof cs);
    cs.ref = ref;
    static const char *const subs[] = {"diffusion_models", "unet", "text_encoders", "clip", "vae"};
    h3_status st = H3_OK;
    int err = 0;
    for (size_t i = 0; i < sizeof subs / sizeof *subs && !cs.nomem; i++) {
        char *d = sub_if(root, subs[i], 1, &err);
        if (err) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        if (!d) continue;
        h3_status s2 = h3_discover_sets(d, comfy_visit, &cs);
        if (s2 != H3_OK) h3_clear_error(); /* an empty folder */
        h3_free(d);
    }
    if (cs.nomem) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    f->dit = cs.path[H3_COMP_DIT];
    f->text_encoder = cs.path[H3_COMP_TEXT_ENCODER];
    f->video_vae = cs.path[H3_COMP_VIDEO_VAE];
    f->audio_vae = cs.path[H3_COMP_AUDIO_VAE];
    cs.path[H3_COMP_DIT] = cs.path[H3_COMP_TEXT_ENCODER] = cs.path[H3_COMP_VIDEO_VAE] =
        cs.path[H3_COMP_AUDIO_VAE] = NULL;
    static const char *const opt[5] = {NULL, "--dit", "--text-encoder", "--video-vae", "--audio-vae"};
    char *const chosen[5] = {NULL, f->dit, f->text_encoder, f->video_vae, f->audio_vae};
    for (int c = 1; c < 5; c++)
        if (cs.count[c] > 1)
            h3_log(H3_LOG_INFO, "%d %s files in %s: using %s (choose another with %s)", cs.count[c],
                   h3_component_name((h3_component)c), root, chosen[c], opt[c]);
    /* ComfyUI keeps the tokenizer in its source tree, next to models/. */
    char *cands[3] = {NULL, NULL, NULL};
    cands[0] = h3_path_join(root, "tokenizer/tokenizer.json");
    cands[1] = h3_path_join(root, "text_encoders/tokenizer.json");
    cands[2] = h3_path_join(root, "../comfy/text_encoders/qwen25_tokenizer/tokenizer.json");
    for (int i = 0; i < 3; i++) {
        if (!cands[i]) err = 1;
        if (!err && !f->tokenizer && h3_path_is_file(cands[i])) {
            f->tokenizer = cands[i];
            cands[i] = NULL;
        }
        h3_free(cands[i]);
    }
    if (err) H3_FAIL(H3_ERR_NOMEM, "out of memory");
done:
    for (int c = 0; c < 5; c++) h3_free(cs.path[c]);
    return st;
}

static h3_status dup_given(const char *given, char **slot) {
    if (!given) return H3_OK;
    char *p = h3_strdup(given);
    if (!p) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_free(*slot);
    *slot = p;
    return H3_OK;
}

h3_status h3_model_files_find(const char *model, const h3_model_files *given, h3_model_files *out) {
    return h3_model_files_find_for(model, given, 0, out);
}

h3_status h3_model_files_find_for(const char *model, const h3_model_files *given, int ref2va, h3_model_files *out) {
    memset(out, 0, sizeof *out);
    static const h3_model_files none;
    if (!given) given = &none;
    const int all_given =
        given->dit && given->text_encoder && given->tokenizer && given->video_vae && given->audio_vae;
    h3_status st = H3_OK;
    int err = 0;
    char *fl2va = NULL;
    out->layout = "given";
    if (!model) {
        if (!all_given)
            return H3_ERR(H3_ERR_INVALID,
                          "--model is required (the official FL2VA/ folder, a diffusers folder or a "
                          "ComfyUI models/ folder), unless all of --dit, --text-encoder, --tokenizer, "
                          "--video-vae and --audio-vae are given");
    } else {
        if (!h3_path_exists(model))
            return H3_ERR(H3_ERR_INVALID,
                          "--model %s: no such folder (give the official FL2VA/ folder, a diffusers "
                          "folder or a ComfyUI models/ folder)",
                          model);
        if (!h3_path_is_dir(model))
            return H3_ERR(H3_ERR_INVALID,
                          "--model %s is a file; it takes a folder (the official FL2VA/ folder, a "
                          "diffusers folder or a ComfyUI models/ folder): name single files with "
                          "--dit, --text-encoder, --video-vae and --audio-vae",
                          model);
        const char *root = model;
        /* The repository root without the diffusers layout: FL2VA/ is the text-to-video-with-audio
         * checkpoint. */
        char *t = sub_if(model, "transformer", 1, &err);
        char *c = err ? NULL : sub_if(model, "diffusion_models", 1, &err);
        if (!t && !c && !err) {
            if (ref2va) fl2va = sub_if(model, "Ref2VA", 1, &err);
            if (!fl2va && !err) fl2va = sub_if(model, "FL2VA", 1, &err);
            if (fl2va) root = fl2va;
        }
        h3_free(t);
        h3_free(c);
        if (err) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        out->root = h3_strdup(root);
        if (!out->root) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        char *tr = sub_if(root, "transformer", 1, &err);
        char *dm = err ? NULL : sub_if(root, "diffusion_models", 1, &err);
        char *un = err ? NULL : sub_if(root, "unet", 1, &err);
        if (err) {
            h3_free(tr);
            h3_free(dm);
            H3_FAIL(H3_ERR_NOMEM, "out of memory");
        }
        if (tr) {
            char *tref = ref2va ? sub_if(root, "transformer_ref", 1, &err) : NULL; /* diffusers' Ref2VA DiT */
            if (tref) {
                h3_free(tr);
                tr = tref;
            }
            out->dit = tr;
            out->text_encoder = sub_if(root, "text_encoder", 1, &err);
            out->tokenizer = sub_if(root, "tokenizer", 1, &err);
            if (!out->tokenizer) out->tokenizer = sub_if(root, "tokenizer.json", 0, &err);
            out->video_vae = sub_if(root, "video_vae", 1, &err);
            out->layout = out->video_vae ? "official" : "diffusers";
            if (!out->video_vae) out->video_vae = sub_if(root, "vae", 1, &err);
            out->audio_vae = sub_if(root, "audio_vae", 1, &err);
            h3_free(dm);
            h3_free(un);
            if (err) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        } else if (dm || un) {
            h3_free(dm);
            h3_free(un);
            out->layout = "ComfyUI";
            H3_CHECK(find_comfy(root, ref2va, out));
        } else if (!all_given) {
            H3_FAIL(H3_ERR_NOT_FOUND,
                    "%s is not an H3 model folder: expected transformer/ (the official FL2VA/ folder "
                    "or a diffusers folder), FL2VA/, or diffusion_models/ (a ComfyUI models/ folder)",
                    model);
        }
    }
    H3_CHECK(dup_given(given->dit, &out->dit));
    H3_CHECK(dup_given(given->text_encoder, &out->text_encoder));
    H3_CHECK(dup_given(given->tokenizer, &out->tokenizer));
    H3_CHECK(dup_given(given->video_vae, &out->video_vae));
    H3_CHECK(dup_given(given->audio_vae, &out->audio_vae));
    /* Every component present, or a message that names what is missing and how to supply it. */
    {
        const char *where = out->root ? out->root : "the given paths";
        const int comfy = !strcmp(out->layout, "ComfyUI");
        struct {
            char *path;
            const char *given, *what, *official, *comfy, *opt;
        } need[5] = {
            {out->dit, given->dit, "DiT", "transformer/", "diffusion_models/", "--dit"},
            {out->text_encoder, given->text_encoder, "text encoder", "text_encoder/", "text_encoders/",
             "--text-encoder"},
            {out->tokenizer, given->tokenizer, "tokenizer", "tokenizer/tokenizer.json",
             "tokenizer/tokenizer.json (ComfyUI keeps it in comfy/text_encoders/qwen25_tokenizer/)",
             "--tokenizer"},
            {out->video_vae, given->video_vae, "video VAE", "video_vae/ (or vae/)", "vae/", "--video-vae"},
            {out->audio_vae, given->audio_vae, "audio VAE", "audio_vae/", "vae/", "--audio-vae"},
        };
        for (int i = 0; i < 5; i++) {
            if (!need[i].path)
                H3_FAIL(H3_ERR_NOT_FOUND,
                        "%s has no %s: expected %s; download it from the release or give %s PATH", where,
                        need[i].what, comfy ? need[i].comfy : need[i].official, need[i].opt);
            if (!h3_path_exists(need[i].path))
                H3_FAIL(need[i].given ? H3_ERR_INVALID : H3_ERR_NOT_FOUND, "%s %s: no such file or folder",
                        need[i].opt, need[i].path);
        }
    }
done:
    h3_free(fl2va);
    if (st != H3_OK) h3_model_files_free(out);
    return st;
}

/* ---- the run's state ----------------------------------------------------------------------------------- */

typedef struct wctx {
    int prompt;       /* index into gen.prompt */
    uint32_t mask;    /* the keyframes (bits over gen.kf) of its windows */
    int n_img;        /* keyframes in it */
    int32_t *ids;     /* its presentation (context 0: NULL, the run's ids) */
    int64_t n;
    uint8_t *tags;    /* its text rows' tags (NULL: all text) */
    h3_tensor pixels; /* its keyframes' images for the vision tower */
    int64_t (*grid)[3];
    h3_tensor hidden; /* its text states (context 0: empty, the run's hidden) */
    float *cond;      /* its keyframes' rows in packed order (NULL: none) */
} wctx;

typedef struct gen {
    const h3_generate_request *r;
    /* a split DiT's GPUs, kept from its last pass for the video decode (plan->vvae_gpus > 1) */
    struct h3_dit_group *group;
    h3_windows win; /* the clip's windows (n 1: one) */
    /* a long clip's prompts: those some window takes ([0] req.prompt), their ids ([0]: NULL, the run's), and each
     * window's */
    int n_prompts;
    const char *prompt[H3_MAX_PROMPTS];
    int32_t *p_ids[H3_MAX_PROMPTS];
    int64_t p_n[H3_MAX_PROMPTS];
    int *prompt_of;
    /* A long clip's contexts: what a window's DiT calls see besides its rows, its prompt and the keyframes inside
     * it. Context 0 is window 0's: its presentation, tags, images and text states are the run's own (ids,
     * text_tags, kf_pixels, kf_grid, hidden). n_ctx 1: one context (every window the run's). */
    int n_ctx;
    wctx *ctx;
    int *ctx_of;  /* [win.n] each window's context */
    int kf_n_img; /* keyframes in the run's own presentation (all of them, or context 0's) */
    const h3_generate_callbacks *cb;
    h3_generate_result res;
    h3_request req; /* resolved */
    h3_model_files files;
    h3_progress prog;
    h3_exec *ex;   /* the session's (a run with one) or own_ex */
    h3_exec own_ex;
    int have_ex;   /* own_ex is made */
    int cuda_on;   /* own_ex's device backend is up (h3_cuda_init once, the arena the budget) */
    /* a session's DiT placement: the run computes with the kept one (reuse_dit) and keeps its own for the next
     * run (keep_dit); held_dev: the device bytes it holds while the stage now running runs beside it */
    int reuse_dit, keep_dit;
    int reuse_pinned, keep_pinned; /* the same for the pinned copies alone */
    int64_t held_dev;
    /* on the device: every stage planned before the text encoder runs; the DiT opened (headers) for it */
    h3_dit *dit;
    h3_plan *plan;
    h3_lora lora; /* the LoRAs, read for the DiT the stage runs (they must outlive it) */
    /* the schedule, and the distinct timesteps it visits (the modulation kept; the plan counts them) */
    h3_schedule sch;
    float *uniq_t;
    int n_uniq;
    /* --refine: the last refine_calls calls of sch (a view into it) and their distinct timesteps */
    h3_schedule sch_refine;
    int refine_calls;
    float *uniq_r;
    int n_uniq_r;
    int stage;
    int model_phase; /* the request is checked: a failure now is the model's (or the machine's), not the
                        request's */
    double stage_t0;
    /* outputs: each finished one waits in the group under its temporary name until all are done */
    h3_outgroup outs;
    int outs_open;
    h3_mp4 *mp4;
    h3_png_seq png;
    int png_open;
    /* what earlier runs kept (session.h): the files, preflight and tokenizer under its lock (ses_locked); its
     * models only for a run (use_models), never for h3_generate_check, which may run beside one */
    h3_session *ses;
    int ses_locked, use_models, check_only;
    int files_borrowed, dit_borrowed; /* g->files and g->dit are the session's: not freed here */
    int te_opened;                    /* this run opened the session's text encoder (it is not reused) */
    double t0;
    /* fl2va: the keyframes on the canvas, the presentation's row tags and the processor's pixels, the text
     * encoder and its vision tower while the prompt is encoded, then the conditioning */
    h3_keyframe_set kf;
    uint8_t *text_tags;
    h3_tensor kf_pixels;
    int64_t (*kf_grid)[3];
    h3_text_encoder *kf_te; /* opened for the vision tower (NULL: the session's, kf_te_borrowed) */
    int kf_te_borrowed;
    h3_vision *vis;
    h3_tensor kf_clean;
    float *kf_rows;
    const int32_t *text_ids; /* the presentation's ids while the run lasts (--latents saves them) */
    /* a soundtrack (audio to video): the file's sound at 32 kHz stereo, and its latents as the DiT's audio rows
     * (normalized, packed), held clean in every call */
    h3_sound snd;
    float *snd_rows;
    /* ref2va: the references (read, normalized), their blocks, their conditioning rows (video at 0.999, audio
     * clean) */
    h3_ref_set refs;
    h3_ref_block ref_blocks[H3_MAX_REFS];
    float *ref_vrows, *ref_arows;
    float *ref_clean; /* their latents before the mix (kept for --latents) */
    int64_t ref_nv, ref_na;
    /* the checkpoint of the first pass: its rows (the sampler's state, in place), their sizes, the request's
     * fingerprint */
    float *ck_video, *ck_audio;
    int64_t ck_nv, ck_na;
    char ck_key[512];
} gen;

/* A stage's plan as the arena sees it: its own peak plus what the DiT's kept placement holds beside it. */
static const h3_stage_plan *beside_dit(const gen *g, const h3_stage_plan *p, h3_stage_plan *tmp) {
    if (!p->on_device || !g->held_dev) return p;
    *tmp = *p;
    tmp->dev_peak += g->held_dev;
    return tmp;
}

/* Reads the request's LoRAs for dit and applies them (a streaming DiT keeps them for its stage). */
static h3_status apply_loras(gen *g, h3_dit *dit) {
    if (!g->r->n_loras) return H3_OK;
    H3_TRY(h3_lora_read(&g->lora, dit, g->r->n_loras, (const char *const *)g->r->lora, g->r->lora_strength));
    H3_TRY(h3_lora_apply(dit, g->ex, &g->lora, (h3_lora_mode)g->r->lora_mode));
    char b[160];
    H3_INFO("DiT: %s", h3_lora_describe(&g->lora, b, sizeof b));
    return H3_OK;
}

static h3_status interrupted(const gen *g) {
    return H3_ERR(H3_ERR_INTERRUPTED,
                  "interrupted during %s: the run stopped and removed what it had written",
                  h3_generate_stage_name(g->stage));
}

/* The caller's should_stop, or a stop requested of the whole library (h3_cancel_request). */
static int stop_asked(const gen *g) {
    return h3_cancel_requested() || (g->cb && g->cb->should_stop && g->cb->should_stop(g->cb->stop_user));
}

static h3_status check_stop(gen *g) {
    return stop_asked(g) ? interrupted(g) : H3_OK;
}

static void stage_begin(gen *g, int stage, int steps) {
    g->stage = stage;
    g->stage_t0 = now_s();
    h3_progress_stage(&g->prog, g_stage_names[stage], steps);
}

static void stage_end(gen *g) {
    g->res.stage_s[g->stage] += now_s() - g->stage_t0; /* a long clip's prompts each encode in the same stage */
    h3_progress_stage_end(&g->prog);
}

/* ---- checks before anything loads ---------------------------------------------------------------------- */

/* Headers only: each component opens, and they fit together (text width, latent channels, VAE geometry). The
 * weights themselves are read by their stage. */
static h3_status preflight(gen *g, int64_t *te_vocab, int64_t *te_positions) {
    h3_status st = H3_OK;
    h3_dit *d = NULL;
    h3_text_encoder *te = NULL;
    h3_video_vae *vv = NULL;
    h3_st_set as;
    int have_as = 0;
    H3_CHECK_CTX(h3_dit_open(g->files.dit, NULL, &d), "the DiT (%s)", g->files.dit);
    const h3_dit_config *dc = h3_dit_get_config(d);
    if (dc->in_channels != H3_LATENT_CHANNELS || dc->patch[0] != 1 || dc->patch[1] != 2 ||
        dc->patch[2] != 2 || dc->audio_dim != H3_AUDIO_LATENT_CHANNELS)
        H3_FAIL(H3_ERR_FORMAT,
                "the DiT %s takes %lld-channel latents in %lldx%lldx%lld patches and %lld-wide audio "
                "rows; generate needs H3's 24 channels, 1x2x2 patches and 32-wide audio rows",
                g->files.dit, (long long)dc->in_channels, (long long)dc->patch[0], (long long)dc->patch[1],
                (long long)dc->patch[2], (long long)dc->audio_dim);
    {
        /* the LoRAs fit this DiT: refused now, before anything heavy runs */
        h3_lora l;
        memset(&l, 0, sizeof l);
        st = h3_lora_read(&l, d, g->r->n_loras, (const char *const *)g->r->lora, g->r->lora_strength);
        h3_lora_free(&l);
        H3_CHECK(st);
    }
    H3_CHECK_CTX(h3_text_encoder_open(g->files.text_encoder, NULL, &te), "the text encoder (%s)",
                 g->files.text_encoder);
    const h3_te_config *tc = h3_text_encoder_config(te);
    if (tc->n_layers < H3_TE_LAYER)
        H3_FAIL(H3_ERR_FORMAT,
                "the text encoder %s has %lld decoder layers; H3 conditions on the output of layer %d",
                g->files.text_encoder, (long long)tc->n_layers, H3_TE_LAYER);
    if (tc->hidden != dc->text_dim)
        H3_FAIL(H3_ERR_FORMAT,
                "the text encoder %s gives %lld-wide states but the DiT %s takes %lld: they are not "
                "parts of the same model",
                g->files.text_encoder, (long long)tc->hidden, g->files.dit, (long long)dc->text_dim);
    *te_vocab = tc->vocab;
    *te_positions = tc->max_positions;
    H3_CHECK_CTX(h3_video_vae_open(g->files.video_vae, NULL, &vv), "the video VAE (%s)", g->files.video_vae);
    const h3_video_vae_config *vc = h3_video_vae_get_config(vv);
    if (vc->latent_channels != H3_LATENT_CHANNELS || vc->patch_size != H3_VAE_SPATIAL ||
        vc->patch_size_t != 4 || vc->out_channels != 3)
        H3_FAIL(H3_ERR_FORMAT,
                "the video VAE %s decodes %d-channel latents to %d channels, %dx%d pixels and %d frames "
                "each; H3's is 24 channels to RGB, 16x16 pixels and 4 frames",
                g->files.video_vae, vc->latent_channels, vc->out_channels, vc->patch_size, vc->patch_size,
                vc->patch_size_t);
    /* The audio VAE folds its weight norm when it opens: here only its tensors are recognized. */
    {
        char *p = NULL;
        const char *ap = g->files.audio_vae;
        if (h3_path_is_dir(ap)) {
            int err = 0;
            p = sub_if(ap, "model.safetensors", 0, &err);
            if (!p && !err) p = sub_if(ap, "diffusion_pytorch_model.safetensors", 0, &err);
            if (!p && !err) {
                char *sub = sub_if(ap, "audio_vae", 1, &err);
                if (sub) {
                    p = sub_if(sub, "model.safetensors", 0, &err);
                    if (!p && !err) p = sub_if(sub, "diffusion_pytorch_model.safetensors", 0, &err);
                }
                h3_free(sub);
            }
            if (err) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        }
        st = h3_st_open(p ? p : ap, &as);
        h3_free(p);
        if (st != H3_OK) {
            st = h3_error_wrap(st, "the audio VAE (%s)", ap);
            goto done;
        }
        have_as = 1;
        h3_detect_info info;
        H3_CHECK(h3_detect(&as, &info));
        if (info.comp != H3_COMP_AUDIO_VAE)
            H3_FAIL(H3_ERR_FORMAT, "the audio VAE %s holds %s, not an audio VAE decoder", ap,
                    info.comp == H3_COMP_UNKNOWN ? "no H3 component h3run recognizes"
                                                 : h3_component_name(info.comp));
    }
    h3_log(H3_LOG_INFO,
           "model (%s layout): DiT %s; text encoder %s; tokenizer %s; video VAE %s; audio VAE %s",
           g->files.layout, g->files.dit, g->files.text_encoder, g->files.tokenizer, g->files.video_vae,
           g->files.audio_vae);
done:
    if (have_as) h3_st_close(&as);
    h3_dit_close(d);
    h3_text_encoder_close(te);
    h3_video_vae_close(vv);
    return st;
}

/* ---- text ---------------------------------------------------------------------------------------------- */

/* The prompt's token ids (*ids h3_malloc'd). */
static h3_status run_tokenize(gen *g, const h3_tokenizer *tok, int64_t te_vocab, int64_t te_positions,
                              int32_t **ids_out, int64_t *n_out) {
    h3_status st = H3_OK;
    int32_t *ids = NULL;
    int64_t n = 0;
    stage_begin(g, H3_GEN_TOKENIZE, 0);
    st = h3_tokenizer_encode(tok, g->req.prompt, &ids, &n);
    if (st == H3_ERR_INVALID) g->model_phase = 0; /* the prompt is not UTF-8: the request's fault */
    if (st != H3_OK) goto done;
    if (n == 0)
        H3_CHECK_CTX(h3_tokenizer_empty_prompt(tok, &ids, &n), "the tokenizer %s", g->files.tokenizer);
    st = h3_request_check_prompt_tokens(n, te_positions); /* before the text encoder and the DiT are sized */
    if (st != H3_OK) {
        g->model_phase = 0; /* a prompt too long: the request's fault */
        goto done;
    }
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= te_vocab)
            H3_FAIL(H3_ERR_FORMAT,
                    "the tokenizer %s gives token id %d but the text encoder %s has %lld embedding rows: "
                    "they are not parts of the same model",
                    g->files.tokenizer, ids[i], g->files.text_encoder, (long long)te_vocab);
    g->res.text_tokens = n;
    stage_end(g);
    *ids_out = ids;
    *n_out = n;
    ids = NULL;
done:
    h3_free(ids);
    return st;
}

/* After each text-encoder layer: a progress step; nonzero (stop) when the caller asks to stop. */
static int te_layer_done(void *user, int done, int total) {
    gen *g = user;
    (void)done;
    (void)total;
    h3_progress_step(&g->prog);
    return stop_asked(g);
}

/* The session's text encoder reports its layers to the run that encodes now. */
static int session_te_layer(void *user, int done, int total) {
    h3_session *s = user;
    return s->on_layer ? s->on_layer(s->on_layer_user, done, total) : 0;
}

/* The session's text encoder: kept from an earlier run (reused), or opened now (by the keyframes' presentation
 * or the text stage, whichever comes first; not counted as reused by the other). */
static h3_status session_te(gen *g) {
    h3_session *s = g->ses;
    if (s->te) {
        if (!g->te_opened) g->res.reused |= H3_REUSED_TEXT_ENCODER;
        return H3_OK;
    }
    h3_te_open_opts o;
    memset(&o, 0, sizeof o);
    o.act_place = H3_PLACE_HOST;
    o.on_layer = session_te_layer;
    o.on_layer_user = s;
    H3_TRY_CTX(h3_text_encoder_open(g->files.text_encoder, &o, &s->te), "the text encoder");
    g->te_opened = 1;
    return H3_OK;
}

/* The text states of ids (a presentation of n_img keyframes' images, pixels and grid, when n_img > 0). */
static h3_status run_text(gen *g, const int32_t *ids, int64_t n, const h3_tensor *pixels, int64_t (*grid)[3],
                          int n_img, h3_tensor *hidden) {
    const int images = n_img > 0; /* the prompt's states depend on the images: never kept */
    if (!images && g->use_models && h3_session_prompt_get(g->ses, g->req.prompt, hidden)) {
        stage_begin(g, H3_GEN_TEXT_ENCODER, 0); /* the prompt's states are kept: the encoder does not run */
        g->res.reused |= H3_REUSED_PROMPT;
        stage_end(g);
        return H3_OK;
    }
    stage_begin(g, H3_GEN_TEXT_ENCODER, H3_TE_LAYER);
    h3_te_stage a;
    memset(&a, 0, sizeof a);
    if (g->use_models) {
        h3_session *s = g->ses;
        H3_TRY(session_te(g));
        s->on_layer = te_layer_done;
        s->on_layer_user = g;
        a.te = s->te;
    }
    a.path = g->files.text_encoder;
    h3_stage_plan tb;
    a.plan = g->plan ? beside_dit(g, &g->plan->te, &tb) : NULL;
    a.ids = ids;
    a.n = n;
    a.layer = H3_TE_LAYER;
    a.on_layer = te_layer_done;
    a.on_layer_user = g;
    if (images) { /* the text encoder the vision tower was opened on */
        a.te = g->kf_te;
        a.vis = g->vis;
        a.pixels = pixels;
        a.grid = (const int64_t(*)[3])grid;
        a.n_img = n_img;
    }
    h3_status st = h3_stage_text_encoder(g->ex, &a, hidden, &g->res.stages[H3_GEN_TEXT_ENCODER]);
    if (g->use_models) g->ses->on_layer = NULL;
    if (st == H3_ERR_INTERRUPTED) H3_TRY(check_stop(g));
    H3_TRY(st);
    if (!images && g->use_models && h3_session_prompt_put(g->ses, g->req.prompt, hidden) != H3_OK) {
        h3_log(H3_LOG_WARN, "the prompt's text states are not kept: %s", h3_last_error());
        h3_clear_error();
    }
    stage_end(g);
    return H3_OK;
}

static h3_status open_vision(gen *g);

/* fl2va: the text encoder's vision tower, and the presentation of the keyframes before the prompt's ids
 * (pipeline/keyframe.h): *ids and *n become the presentation's, g->text_tags its row tags. */
static h3_status present_keyframes(gen *g, const h3_tokenizer *tok, int64_t te_positions, int32_t **ids,
                                   int64_t *n) {
    if (!g->kf.n) return H3_OK;
    h3_status st = H3_OK;
    int32_t *all = NULL;
    int64_t n_all = 0;
    H3_TRY(open_vision(g));
    H3_TRY(h3_keyframes_present(tok, h3_vision_config(g->vis), &g->kf, *ids, *n, &all, &g->text_tags, &n_all,
                                &g->kf_pixels, &g->kf_grid));
    st = h3_request_check_prompt_tokens(n_all, te_positions);
    if (st != H3_OK) {
        g->model_phase = 0;
        h3_free(all);
        return h3_error_wrap(st, "the prompt with its %d keyframes' image tokens", g->kf.n);
    }
    h3_free(*ids);
    *ids = all;
    *n = n_all;
    g->res.text_tokens = n_all;
    g->kf_n_img = g->kf.n;
    h3_log(H3_LOG_INFO, "keyframes: %d, %lld image tokens in the %lld rows of text", g->kf.n,
           (long long)(g->kf_pixels.shape[0] / 4), (long long)n_all);
    return H3_OK;
}

/* ref2va: the references' presentation before the prompt's ids (pipeline/reference.h), as present_keyframes. */
static h3_status present_refs(gen *g, const h3_tokenizer *tok, int64_t te_positions, int32_t **ids, int64_t *n) {
    if (!g->refs.n) return H3_OK;
    int32_t *all = NULL;
    int64_t n_all = 0;
    H3_TRY(open_vision(g));
    H3_TRY(h3_refs_present(tok, h3_vision_config(g->vis), &g->refs, *ids, *n, &all, &g->text_tags, &n_all,
                           &g->kf_pixels, &g->kf_grid, &g->kf_n_img));
    /* a reference image alone is thousands of rows (7,296 at the release's 2048 short edge): the presentation
     * may run past a prompt's limit, to the text encoder's positions or H3_MAX_REF_TOKENS */
    if (n_all > H3_MAX_REF_TOKENS || (te_positions > 0 && n_all > te_positions)) {
        g->model_phase = 0;
        h3_free(all);
        return H3_ERR(H3_ERR_INVALID, "the prompt with its %d references is %lld tokens; at most %lld are taken (%s): "
                      "give fewer or shorter references", g->refs.n, (long long)n_all,
                      (long long)(te_positions > 0 && te_positions < H3_MAX_REF_TOKENS ? te_positions : H3_MAX_REF_TOKENS),
                      te_positions > 0 && te_positions < H3_MAX_REF_TOKENS ? "the text encoder's positions"
                                                                            : "H3_MAX_REF_TOKENS");
    }
    h3_free(*ids);
    *ids = all;
    *n = n_all;
    g->res.text_tokens = n_all;
    h3_log(H3_LOG_INFO, "references: %d, %d vision blocks (%lld vision tokens) in the %lld rows of text", g->refs.n,
           g->kf_n_img, (long long)(g->kf_pixels.shape[0] / 4), (long long)n_all);
    return H3_OK;
}

/* The text encoder's vision tower (g->vis, on g->kf_te), once. */
static h3_status open_vision(gen *g) {
    if (g->vis) return H3_OK;
    h3_status st = H3_OK;
    if (g->use_models) {
        H3_TRY(session_te(g));
        g->kf_te = g->ses->te;
        g->kf_te_borrowed = 1;
    } else {
        h3_te_open_opts o;
        memset(&o, 0, sizeof o);
        o.act_place = H3_PLACE_HOST;
        o.on_layer = te_layer_done;
        o.on_layer_user = g;
        H3_TRY_CTX(h3_text_encoder_open(g->files.text_encoder, &o, &g->kf_te), "the text encoder");
    }
    st = h3_vision_open(g->kf_te, NULL, &g->vis);
    if (st != H3_OK) /* a model without one cannot take this request: unsupported, not broken */
        return h3_error_wrap(st == H3_ERR_FORMAT ? H3_ERR_UNSUPPORTED : st,
                             "%s need the vision tower of the text encoder (%s)", g->refs.n ? "references" : "keyframes",
                             g->files.text_encoder);
    return H3_OK;
}

/* A long clip's contexts (gen.ctx): one per distinct prompt and set of keyframes among the windows, window 0's
 * first. */
static h3_status make_contexts(gen *g) {
    const h3_windows *w = &g->win;
    g->ctx_of = h3_calloc((size_t)w->n, sizeof(int), H3_MEM_OTHER);
    g->ctx = h3_calloc((size_t)w->n, sizeof(wctx), H3_MEM_OTHER);
    if (!g->ctx_of || !g->ctx) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    g->n_ctx = 0;
    for (int k = 0; k < w->n; k++) {
        uint32_t mask = 0;
        int n_img = 0;
        for (int i = 0; i < g->kf.n; i++)
            if (g->kf.frame[i] >= w->f_start[k] && g->kf.frame[i] < w->f_start[k] + w->window) mask |= 1u << i, n_img++;
        int c = 0;
        while (c < g->n_ctx && !(g->ctx[c].prompt == g->prompt_of[k] && g->ctx[c].mask == mask)) c++;
        if (c == g->n_ctx) {
            g->ctx[c].prompt = g->prompt_of[k];
            g->ctx[c].mask = mask;
            g->ctx[c].n_img = n_img;
            g->n_ctx++;
        }
        g->ctx_of[k] = c;
    }
    return H3_OK;
}

static void free_contexts(gen *g) {
    for (int c = 0; g->ctx && c < g->n_ctx; c++) {
        h3_free(g->ctx[c].ids);
        h3_free(g->ctx[c].tags);
        h3_tensor_free(&g->ctx[c].pixels);
        h3_free(g->ctx[c].grid);
        h3_tensor_free(&g->ctx[c].hidden);
        h3_free(g->ctx[c].cond);
    }
    h3_free(g->ctx);
    h3_free(g->ctx_of);
    g->ctx = NULL;
    g->ctx_of = NULL;
}

/* A long clip's presentations: each context's prompt ids (prompt 0's: *ids), with its keyframes' vision blocks
 * before them when it has some. Context 0's become the run's own (*ids, *n, text_tags, kf_pixels, kf_grid);
 * *n_max the longest. */
static h3_status present_contexts(gen *g, const h3_tokenizer *tok, int64_t te_positions, int32_t **ids,
                                  int64_t *n, int64_t *n_max) {
    *n_max = *n;
    for (int c = g->n_ctx - 1; c >= 0; c--) { /* context 0 last: it replaces *ids, which the others read */
        wctx *x = &g->ctx[c];
        const int32_t *pi = x->prompt ? g->p_ids[x->prompt] : *ids;
        const int64_t pn = x->prompt ? g->p_n[x->prompt] : *n;
        int32_t *cids = NULL;
        uint8_t *ctags = NULL;
        int64_t cn = 0;
        h3_tensor cpix = {0};
        int64_t(*cgrid)[3] = NULL;
        if (x->mask) {
            H3_TRY(open_vision(g));
            h3_keyframe_set sub = g->kf; /* the context's keyframes, borrowed */
            sub.n = 0;
            for (int i = 0; i < g->kf.n; i++)
                if (x->mask >> i & 1) {
                    sub.path[sub.n] = g->kf.path[i];
                    sub.frame[sub.n] = g->kf.frame[i];
                    sub.rgb[sub.n] = g->kf.rgb[i];
                    sub.src[sub.n] = g->kf.src[i];
                    sub.sw[sub.n] = g->kf.sw[i];
                    sub.sh[sub.n] = g->kf.sh[i];
                    sub.n++;
                }
            H3_TRY(h3_keyframes_present(tok, h3_vision_config(g->vis), &sub, pi, pn, &cids, &ctags, &cn, &cpix,
                                        &cgrid));
        } else {
            cids = h3_malloc((size_t)(pn ? pn : 1) * sizeof(int32_t), H3_MEM_OTHER);
            if (!cids) return H3_ERR(H3_ERR_NOMEM, "out of memory");
            memcpy(cids, pi, (size_t)pn * sizeof(int32_t));
            cn = pn;
        }
        h3_status st = h3_request_check_prompt_tokens(cn, te_positions);
        if (st != H3_OK) {
            g->model_phase = 0;
            h3_free(cids);
            h3_free(ctags);
            h3_tensor_free(&cpix);
            h3_free(cgrid);
            return h3_error_wrap(st, "prompt %d with %d keyframes' image tokens", x->prompt + 1, x->n_img);
        }
        if (cn > *n_max) *n_max = cn;
        if (c) {
            x->ids = cids;
            x->n = cn;
            x->tags = ctags;
            x->pixels = cpix;
            x->grid = cgrid;
        } else {
            h3_free(*ids);
            *ids = cids;
            *n = cn;
            g->text_tags = ctags;
            g->kf_pixels = cpix;
            g->kf_grid = cgrid;
            g->kf_n_img = x->n_img;
            g->res.text_tokens = cn;
        }
    }
    if (g->kf.n)
        h3_log(H3_LOG_INFO,
               "keyframes: %d in a clip of %d windows: each window presents and holds those inside it (%d distinct "
               "contexts of prompt and keyframes)",
               g->kf.n, g->win.n, g->n_ctx);
    return H3_OK;
}

/* After a step of a stage (a keyframe encoded, a model call): the progress step, then a stop if asked. */
static h3_status step_done(void *user, int done, int total) {
    gen *g = user;
    (void)done;
    (void)total;
    h3_progress_step(&g->prog);
    return check_stop(g);
}

/* fl2va: the keyframes through the video VAE's encoder into their rows (g->kf_rows, g->kf_clean). */
static h3_status run_keyframes(gen *g) {
    if (!g->kf.n) return H3_OK;
    h3_status st = H3_OK;
    h3_video_vae *vv = NULL;
    h3_video_enc *e = NULL;
    stage_begin(g, H3_GEN_KEYFRAMES, g->kf.n);
    H3_CHECK_CTX(h3_video_vae_open(g->files.video_vae, NULL, &vv), "the video VAE");
    st = h3_video_enc_open(vv, &e);
    if (st != H3_OK) {
        st = h3_error_wrap(st == H3_ERR_FORMAT ? H3_ERR_UNSUPPORTED : st, "keyframes need the video VAE's encoder (%s)", g->files.video_vae);
        goto done;
    }
    h3_stage_plan tb;
    H3_CHECK(h3_stage_keyframes(g->ex, e, g->plan ? beside_dit(g, &g->plan->venc, &tb) : NULL, &g->kf, g->req.seed, &g->kf_clean,
                                &g->kf_rows, step_done, g, &g->res.stages[H3_GEN_KEYFRAMES]));
    stage_end(g);
done:
    h3_video_enc_close(e);
    h3_video_vae_close(vv);
    return st;
}

static h3_status audio_vae_of(gen *g, h3_audio_vae **out);

/* ref2va: the references through the video VAE's encoder (images, videos: at the plan's place) and the audio
 * VAE's encoder (sounds, on the host) into their rows (g->ref_vrows, g->ref_arows). */
static h3_status run_refs(gen *g) {
    if (!g->refs.n) return H3_OK;
    h3_status st = H3_OK;
    h3_video_vae *vv = NULL;
    h3_video_enc *e = NULL;
    h3_audio_vae *av = NULL;
    h3_audio_enc *ae = NULL;
    int n_enc = 0; /* encodes: a sound's and an image's or a video's each */
    for (int k = 0; k < g->refs.n; k++) n_enc += (g->ref_blocks[k].audio_t > 0) + (g->ref_blocks[k].kind != H3_REF_AUDIO);
    stage_begin(g, H3_GEN_REFERENCES, n_enc);
    if (g->ref_nv) {
        H3_CHECK_CTX(h3_video_vae_open(g->files.video_vae, NULL, &vv), "the video VAE");
        st = h3_video_enc_open(vv, &e);
        if (st != H3_OK) {
            st = h3_error_wrap(st == H3_ERR_FORMAT ? H3_ERR_UNSUPPORTED : st,
                               "image and video references need the video VAE's encoder (%s)", g->files.video_vae);
            goto done;
        }
    }
    if (g->ref_na) {
        H3_CHECK(audio_vae_of(g, &av));
        st = h3_audio_enc_open(av, &ae);
        if (st != H3_OK) {
            st = h3_error_wrap(st == H3_ERR_FORMAT ? H3_ERR_UNSUPPORTED : st,
                               "sound references need the audio VAE's encoder (%s)", g->files.audio_vae);
            goto done;
        }
    }
    h3_stage_plan tb;
    h3_stage_plan ta;
    H3_CHECK(h3_stage_references(g->ex, e, g->plan ? beside_dit(g, &g->plan->venc, &tb) : NULL, ae,
                                 g->plan ? beside_dit(g, &g->plan->aenc, &ta) : NULL,
                                 av ? h3_audio_vae_get_config(av) : NULL, &g->refs, g->req.seed, &g->ref_vrows,
                                 &g->ref_arows, g->r->latents ? &g->ref_clean : NULL, step_done, g,
                                 &g->res.stages[H3_GEN_REFERENCES]));
    stage_end(g);
done:
    h3_video_enc_close(e);
    h3_video_vae_close(vv);
    h3_audio_enc_close(ae);
    if (!g->use_models) h3_audio_vae_close(av);
    return st;
}

/* A long clip's contexts: the rows of their keyframes (packed order), from the run's rows of all of them. */
static h3_status context_rows(gen *g) {
    if (!g->kf.n || g->n_ctx < 1) return H3_OK;
    const int64_t per = (g->req.width / 32) * (g->req.height / 32) * H3_VIDEO_ROW_DIM; /* floats a keyframe */
    for (int c = 0; c < g->n_ctx; c++) {
        wctx *x = &g->ctx[c];
        if (!x->mask) continue;
        x->cond = h3_malloc((size_t)(x->n_img * per) * sizeof(float), H3_MEM_ACTIVATIONS);
        if (!x->cond) return H3_ERR(H3_ERR_NOMEM, "out of memory for the keyframes' rows");
        int j = 0;
        for (int i = 0; i < g->kf.n; i++)
            if (x->mask >> i & 1) memcpy(x->cond + (j++) * per, g->kf_rows + i * per, (size_t)per * sizeof(float));
    }
    return H3_OK;
}

/* ---- the plan ------------------------------------------------------------------------------------------ */

/* After model call `step` of `steps` (1-based, as the sampler counts them). */
/* The checkpoint: the first pass's rows after `step` calls, with the request's fingerprint, written atomically
 * (safetensors: video_rows, audio_rows; metadata h3run-checkpoint = the fingerprint, step). */
static h3_status write_checkpoint(gen *g, int step) {
    h3_st_writer *w = NULL;
    h3_status st = h3_st_writer_new(&w);
    const int64_t sv[1] = {g->ck_nv}, sa[1] = {g->ck_na};
    char buf[32];
    snprintf(buf, sizeof buf, "%d", step);
    if (st == H3_OK) st = h3_st_writer_add(w, "video_rows", H3_F32, 1, sv, g->ck_video);
    if (st == H3_OK) st = h3_st_writer_add(w, "audio_rows", H3_F32, 1, sa, g->ck_audio);
    if (st == H3_OK) st = h3_st_writer_meta(w, "h3run-checkpoint", g->ck_key);
    if (st == H3_OK) st = h3_st_writer_meta(w, "step", buf);
    void *groups = h3_outgroup_suspend(); /* on disk now, whatever the run's outputs wait for */
    if (st == H3_OK) st = h3_st_writer_write(w, g->r->checkpoint, 0);
    h3_outgroup_resume(groups);
    h3_st_writer_free(w);
    return st;
}

/* A checkpoint of this request, when the file holds one: its rows into video/audio; the calls it covers, 0
 * when there is none or it is another request's (said in the log). */
static int read_checkpoint(gen *g, float *video, float *audio, int steps) {
    struct stat sb;
    if (stat(g->r->checkpoint, &sb) != 0) return 0;
    h3_st_set set;
    if (h3_st_open(g->r->checkpoint, &set) != H3_OK) {
        h3_log(H3_LOG_WARN, "the checkpoint %s cannot be read (%s): starting from the first call",
               g->r->checkpoint, h3_last_error());
        h3_clear_error();
        return 0;
    }
    int step = 0;
    const char *key = h3_st_metadata(&set, "h3run-checkpoint"), *st_s = h3_st_metadata(&set, "step");
    const h3_st_entry *v = h3_st_find(&set, "video_rows"), *a = h3_st_find(&set, "audio_rows");
    if (!key || strcmp(key, g->ck_key) || !st_s || !v || !a || v->dtype != H3_F32 || a->dtype != H3_F32 ||
        h3_st_entry_numel(v) != g->ck_nv || h3_st_entry_numel(a) != g->ck_na) {
        h3_log(H3_LOG_WARN, "the checkpoint %s is another request's: starting from the first call",
               g->r->checkpoint);
    } else {
        step = atoi(st_s);
        const void *vb = NULL, *ab = NULL;
        if (step < 1 || step >= steps || h3_st_bytes(&set, v, &vb) != H3_OK || h3_st_bytes(&set, a, &ab) != H3_OK) {
            h3_clear_error();
            h3_log(H3_LOG_WARN, "the checkpoint %s is unusable: starting from the first call", g->r->checkpoint);
            step = 0;
        } else {
            memcpy(video, vb, (size_t)g->ck_nv * sizeof(float));
            memcpy(audio, ab, (size_t)g->ck_na * sizeof(float));
        }
    }
    h3_st_close(&set);
    return step;
}

static h3_status dit_step(void *user, int step, int steps) {
    gen *g = user;
    const int every = g->r->checkpoint_every > 0 ? g->r->checkpoint_every : H3_CHECKPOINT_EVERY;
    if (g->ck_video && step < steps && step % every == 0) {
        h3_status st = write_checkpoint(g, step);
        if (st != H3_OK) { /* the run goes on; only its resumability is lost */
            h3_log(H3_LOG_WARN, "the checkpoint after call %d was not written: %s", step, h3_last_error());
            h3_clear_error();
        }
    }
    return step_done(g, step, steps);
}

/* The schedule of the request and its distinct timesteps, once for the plan and the run. */
static h3_status make_schedule(gen *g) {
    const h3_request *q = &g->req;
    H3_TRY(h3_schedule_make(q->scheduler, q->steps, q->shift_video, q->shift_audio, &g->sch));
    g->uniq_t = h3_malloc((size_t)2 * (size_t)g->sch.n * sizeof(float) + 8, H3_MEM_OTHER);
    if (!g->uniq_t) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    g->n_uniq = h3_schedule_distinct_timesteps(&g->sch, g->uniq_t);
    if (g->r->audio || g->ref_na) { /* a soundtrack's or the references' audio rows are held clean: t = 1 */
        int have = 0;
        for (int i = 0; i < g->n_uniq; i++) have |= g->uniq_t[i] == 1.0f;
        if (!have) g->uniq_t[g->n_uniq++] = 1.0f;
    }
    if (g->kf.n || g->ref_nv) { /* the keyframe (reference) rows' time below t_video = 0.999 (pipeline/layout.h) */
        int have = 0;
        for (int i = 0; i < g->n_uniq; i++) have |= g->uniq_t[i] == H3_KEYFRAME_T;
        if (!have) g->uniq_t[g->n_uniq++] = H3_KEYFRAME_T;
    }
    if (q->refine_width) {
        g->refine_calls = h3_request_refine_calls(g->sch.n - 1, q->refine_denoise);
        h3_schedule_tail(&g->sch, g->refine_calls, &g->sch_refine);
        g->uniq_r = h3_malloc((size_t)2 * (size_t)g->sch_refine.n * sizeof(float) + 8, H3_MEM_OTHER);
        if (!g->uniq_r) return H3_ERR(H3_ERR_NOMEM, "out of memory");
        g->n_uniq_r = h3_schedule_distinct_timesteps(&g->sch_refine, g->uniq_r);
        h3_log(H3_LOG_INFO,
               "refine: %lldx%lld -> %lldx%lld, the last %d of %d model calls (denoise %g: re-noised to "
               "sigma %.4f video, %.4f audio held), the latents upscaled bilinearly per frame",
               (long long)q->width, (long long)q->height, (long long)q->refine_width,
               (long long)q->refine_height, g->refine_calls, g->sch.n - 1, q->refine_denoise,
               g->sch_refine.sigma_v[0], g->sch_refine.sigma_a[0]);
    }
    return H3_OK;
}

/* Bytes of the set a component was opened from; 0 when they cannot be counted (the plan then counts no
 * reads). */
static int64_t set_bytes(const char *source) {
    int64_t b = 0;
    if (source && h3_plan_weight_bytes(source, &b) != H3_OK) {
        h3_clear_error();
        b = 0;
    }
    return b;
}

/* The request's sparse rule: the one given, else Sol-Attn's. */
static h3_sparse_rule request_sparse_rule(const h3_generate_request *r) {
    const h3_sparse_rule def = H3_SPARSE_RULE_DEFAULT;
    return r->sparse_given ? (h3_sparse_rule){r->sparse_tau, r->sparse_start, r->sparse_end} : def;
}

/* The blocks' attention for this run's DiT (--attention, h3_attention_resolve) over `rows` packed rows: set on the
 * DiT before its plan or its stage, the choice logged and kept in the result. */
static h3_status set_attention(gen *g, h3_dit *d, int on_cuda, int64_t rows) {
    unsigned fl = 0;
    const h3_sparse_rule sp = request_sparse_rule(g->r);
    H3_TRY(h3_attention_resolve((h3_attn_mode)g->r->attention, on_cuda, on_cuda ? h3_cuda_lowbit_attention(0) : 0u,
                                h3_dit_get_config(d)->head_dim, h3_dit_blocks_fp8(d), rows, &sp, &fl,
                                g->res.attention, sizeof g->res.attention));
    h3_dit_set_attention(d, fl);
    H3_TRY(h3_dit_set_sparse(d, sp.tau, sp.start, sp.end, H3_DIT_SPARSE_MIN_ROWS));
    H3_TRY(h3_dit_set_sparse_shift(d, g->req.shift_video)); /* sparse: its window in the schedule's progress */
    H3_INFO("DiT attention: %s", g->res.attention);
    return H3_OK;
}

/* The sizes of the longest DiT call (one window; the refine pass's when there is one: the passes run one after the
 * other), the references' rows included. */
static h3_status dit_call_sizes(const gen *g, int64_t n_tokens, h3_seq_layout *L) {
    const h3_request *q = &g->req;
    const int64_t cw = q->refine_width ? q->refine_width : q->width,
                  ch = q->refine_width ? q->refine_height : q->height;
    H3_TRY(h3_seq_layout_sizes(n_tokens, g->kf.n, q->window, cw, ch, L));
    L->n_cond_rows += g->ref_nv;
    L->n_audio_rows += g->ref_na;
    L->seq_len += g->ref_nv + g->ref_na;
    return H3_OK;
}

/* Plans every stage on the device before anything loads (the text encoder included), from the headers and
 * each model's own memory function: the text encoder's layers streamed or on the host, the DiT's blocks
 * resident, streamed from pinned memory or from the file with its ring and row chunk, the audio VAE's f32
 * weights and batch, the video VAE's resident blocks and tiles per pass. A stage the budget cannot hold on
 * the device goes to the host, saying why; a request some stage cannot fit at all stops here with the plan's
 * message: which stage and budget are short, by how much, and what would fit. The DiT stays open (headers)
 * for its stage. */
static h3_status plan_run(gen *g, int64_t n_tokens) {
    h3_status st = H3_OK;
    const h3_generate_request *r = g->r;
    const h3_request *q = &g->req;
    h3_text_encoder *te = NULL;
    h3_video_vae *vv = NULL;
    h3_video_enc *venc = NULL;
    h3_audio_vae *av = NULL;
    h3_dit_open_opts oo;
    memset(&oo, 0, sizeof oo);
    oo.act_place = H3_PLACE_DEVICE;
    oo.weight_place = H3_PLACE_HOST; /* the blocks stay in the file; the plan says which go where */
    oo.stream_weights = 1;
    /* A run with LoRAs opens its own DiT and keeps it out of the session: the LoRAs belong to this run */
    const int keep = g->use_models && !g->r->n_loras;
    if (keep && g->ses->dit && g->ses->dit_device) {
        g->dit = g->ses->dit;
        g->dit_borrowed = 1;
        g->res.reused |= H3_REUSED_DIT;
    } else {
        H3_CHECK_CTX(h3_dit_open(g->files.dit, &oo, &g->dit), "the DiT");
        H3_CHECK_CTX(h3_dit_device_check(g->dit), "the DiT on --device cuda");
        if (keep) { /* kept for the next run (one opened for the host goes, its placement first) */
            h3_session_close_dit(g->ses);
            g->ses->dit = g->dit;
            g->ses->dit_device = 1;
            g->dit_borrowed = 1;
        }
    }
    H3_CHECK(
        apply_loras(g, g->dit)); /* recorded: the DiT stage merges or attaches them as it places weights */
    {
        h3_seq_layout L;
        H3_CHECK(dit_call_sizes(g, n_tokens, &L));
        H3_CHECK(set_attention(g, g->dit, 1, L.seq_len));
        if (r->gpus > 1 && (h3_dit_attention(g->dit) & H3_ATTN_SPARSE))
            h3_log(H3_LOG_WARN, "sparse attention: a DiT split over GPUs runs its attention dense (each GPU holds "
                                "all rows of its heads); --attention fp8 is the split's faster choice");
    }
    H3_CHECK_CTX(h3_text_encoder_open(g->files.text_encoder, NULL, &te), "the text encoder");
    H3_CHECK_CTX(h3_video_vae_open(g->files.video_vae, NULL, &vv), "the video VAE");
    const h3_audio_vae_opts ao = {.headers_only =
                                      1}; /* the plan reads shapes; the stage opens it to decode */
    H3_CHECK_CTX(h3_audio_vae_open(g->files.audio_vae, &ao, &av), "the audio VAE");

    h3_plan_budgets b = {.vram = r->vram_budget, .ram = r->ram_budget};
    for (int i = 1; i < r->gpus; i++) { /* the other GPUs of a split DiT: the budget given, or their free memory */
        b.vram_gpu[i] = r->vram_budget;
        if (!b.vram_gpu[i])
            H3_CHECK_CTX(h3_budget_default_vram(i, &b.vram_gpu[i]), "GPU %d's budget (--gpus %d)", i, r->gpus);
    }
    if (!b.vram && g->use_models && g->ses->cuda_on) b.vram = g->ses->cuda_budget; /* the arena it holds */
    if (!b.vram) H3_CHECK(h3_budget_default_vram(0, &b.vram));
    if (b.ram == 0) b.ram = h3_budget_default_ram(); /* 0 when unknown: not limited */
    if (b.ram < 0) b.ram = 0;
    char name[128] = "?";
    int64_t total = 0, free_b = 0;
    if (h3_cuda_device_info(0, name, sizeof name, &total, &free_b) != H3_OK) h3_clear_error();
    free_b += h3_cuda_arena_bytes(); /* this process's arena (a session's backend, kept up) is ours to plan in */
    h3_device_figures fig;
    const int have_fig = h3_device_figures_for(name, &fig);
    if (b.vram > free_b && free_b > 0) {
        char a[32], c[32];
        H3_FAIL(H3_ERR_BUDGET,
                "--vram-budget %s is more than the %s the GPU (%s) has free: give at most that, or leave the "
                "budget out (the default is the free memory less %lld MiB)",
                h3_budget_str(b.vram, a, sizeof a), h3_budget_str(free_b, c, sizeof c), name,
                (long long)(H3_VRAM_MARGIN >> 20));
    }

    h3_plan_model m;
    memset(&m, 0, sizeof m);
    m.dit = g->dit;
    m.dit_weights_in_file = 1;
    m.te = te;
    m.vvae = vv;
    m.avae = av;
    m.vvae_weight_bytes = set_bytes(h3_video_vae_source(vv));
    m.avae_weight_bytes = set_bytes(h3_audio_vae_source(av));
    m.host_threads = g->ex->threads;
    m.dit_cached = h3_plan_set_cached_fraction(h3_dit_files(g->dit));
    m.te_cached = h3_plan_set_cached_fraction(h3_text_encoder_files(te));
    m.avae_cached = h3_plan_cached_fraction(h3_audio_vae_source(av));
    m.vvae_cached = h3_plan_cached_fraction(h3_video_vae_source(vv));
    if (g->kf.n || g->ref_nv) {
        st = h3_video_enc_open(vv, &venc);
        if (st != H3_OK) {
            st = h3_error_wrap(st == H3_ERR_FORMAT ? H3_ERR_UNSUPPORTED : st, "%s need the video VAE's encoder (%s)",
                               g->kf.n ? "keyframes" : "image and video references", g->files.video_vae);
            goto done;
        }
        m.venc = h3_video_enc_get_config(venc);
        const int64_t(*vg)[3] = (const int64_t(*)[3])g->kf_grid; /* the largest presentation's images */
        int vn = g->kf_n_img;
        for (int c = 1; c < g->n_ctx; c++)
            if (g->ctx[c].n_img > vn) vg = (const int64_t(*)[3])g->ctx[c].grid, vn = g->ctx[c].n_img;
        if (g->vis && vn) m.te_vision_bytes = h3_vision_device_bytes(g->vis, vg, vn);
    }
    h3_plan_request pr = {.frames = q->frames,
                          .width = q->width,
                          .height = q->height,
                          .text_tokens = n_tokens,
                          .n_timesteps = g->n_uniq,
                          .steps = (g->sch.n - 1) * g->win.n,
                          .refine_width = q->refine_width,
                          .refine_height = q->refine_height,
                          .refine_timesteps = g->n_uniq_r,
                          .refine_steps = g->refine_calls * g->win.n,
                          .keyframes = g->kf.n,
                          .window_frames = q->window,
                          .gpus = r->gpus};
    pr.ref_video_rows = g->ref_nv;
    pr.ref_audio_rows = g->ref_na;
    h3_audio_enc_config acfg;
    if (g->ref_na || g->snd.samples) { /* the longest sound the audio VAE's encoder takes */
        st = h3_audio_enc_config_of(av, &acfg);
        if (st != H3_OK) {
            st = h3_error_wrap(st == H3_ERR_FORMAT ? H3_ERR_UNSUPPORTED : st, "%s need the audio VAE's encoder (%s)",
                               g->snd.samples ? "a soundtrack and sound references" : "sound references",
                               g->files.audio_vae);
            goto done;
        }
        m.aenc = &acfg;
        if (g->snd.samples) pr.aenc_samples = h3_audio_latents(q->frames) * H3_AUDIO_HOP;
        for (int k = 0; k < g->refs.n; k++)
            if (g->refs.r[k].samples > pr.aenc_samples) pr.aenc_samples = g->refs.r[k].samples;
    }
    for (int k = 0; k < g->refs.n; k++) { /* the largest reference the video VAE's encoder takes */
        const h3_ref *f = &g->refs.r[k];
        const int64_t fr = f->kind == H3_REF_IMAGE ? 1 : f->kind == H3_REF_VIDEO ? ((f->frames - 5) / 17) * 17 + 5 : 0;
        if (fr && fr * f->w * f->h > pr.ref_enc_frames * pr.ref_enc_width * pr.ref_enc_height) {
            pr.ref_enc_frames = fr;
            pr.ref_enc_width = f->w;
            pr.ref_enc_height = f->h;
        }
    }
    g->plan = h3_malloc(sizeof *g->plan, H3_MEM_OTHER);
    if (!g->plan) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(h3_plan_make(&m, &pr, &b, have_fig ? &fig : NULL, g->plan));
    const h3_dit_plan *p = &g->plan->dit;
    g->res.vram_budget = b.vram;
    g->res.ram_budget = b.ram;
    g->res.dev_predicted_peak = p->dev_peak;
    g->res.dit_resident = p->n_resident;
    g->res.dit_pinned = p->n_pinned;
    g->res.dit_disk = p->n_disk;
    g->res.predicted_step_s = g->plan->have_time ? p->t_step : 0;
    if (g->plan->have_time) {
        g->res.stage_predicted_s[H3_GEN_TEXT_ENCODER] = g->plan->te.t_load + g->plan->te.t_run;
        g->res.stage_predicted_s[H3_GEN_DIT] = h3_dit_plan_seconds(p, pr.steps);
        if (g->plan->dit_refine.present)
            g->res.stage_predicted_s[H3_GEN_REFINE] =
                h3_dit_plan_seconds(&g->plan->dit_refine, pr.refine_steps);
        g->res.stage_predicted_s[H3_GEN_AUDIO_VAE] = g->plan->avae.t_load + g->plan->avae.t_run;
        g->res.stage_predicted_s[H3_GEN_VIDEO_VAE] = g->plan->vvae.t_load + g->plan->vvae.t_run;
        if (g->kf.n) g->res.stage_predicted_s[H3_GEN_KEYFRAMES] = g->plan->venc.t_load + g->plan->venc.t_run;
        if (g->ref_nv) g->res.stage_predicted_s[H3_GEN_REFERENCES] = g->plan->venc.t_load + g->plan->venc.t_run;
    }
    H3_CHECK(h3_plan_check(g->plan));
    if (g->check_only) {
        char *text = h3_plan_format(g->plan);
        if (text) snprintf(g->res.plan, sizeof g->res.plan, "%s", text);
        h3_free(text);
    }
    char a[32], c[32], d[32];
    h3_log(H3_LOG_INFO, "plan: every stage on %s within a device budget of %s (host %s)", name,
           h3_budget_str(b.vram, a, sizeof a), b.ram ? h3_budget_str(b.ram, c, sizeof c) : "not limited");
    const h3_stage_plan *hs[5] = {&g->plan->te, &g->plan->avae, &g->plan->vvae, &g->plan->venc, &g->plan->aenc};
    static const char *const hs_name[5] = {"the text encoder", "the audio VAE", "the video VAE",
                                           "the video VAE's encoder", "the audio VAE's encoder"};
    for (int i = 0; i < 5; i++) {
        if (!hs[i]->present) continue;
        if (hs[i]->on_device)
            h3_log(H3_LOG_INFO, "plan: %s %s; predicted device peak %s", hs_name[i], hs[i]->detail,
                   h3_budget_str(hs[i]->dev_peak, d, sizeof d));
        else
            h3_log(H3_LOG_WARN, "plan: %s %s: %s", hs_name[i], hs[i]->detail, hs[i]->reason);
    }
    h3_log(
        H3_LOG_INFO,
        "plan: the DiT: %d of %d blocks resident, %d streamed from pinned memory, %d from the file, %d ring "
        "slots; predicted device peak %s",
        p->n_resident, p->n_units, p->n_pinned, p->n_disk, p->n_slots,
        h3_budget_str(p->dev_peak, d, sizeof d));
    for (int i = 0; r->gpus > 1 && i < r->gpus; i++) {
        const h3_dit_plan *gp = &g->plan->dit_gpu[i];
        h3_log(H3_LOG_INFO,
               "plan: the DiT split over %d GPUs: GPU %d rows %lld..%lld, %d of %d blocks resident, %d streamed from "
               "pinned memory, %d from the file; predicted device peak %s%s",
               r->gpus, i, (long long)gp->row0, (long long)(gp->row0 + gp->rows), gp->n_resident, gp->n_units,
               gp->n_pinned, gp->n_disk, h3_budget_str(gp->dev_peak, d, sizeof d),
               i == 0 ? " (the other stages on this GPU)" : "");
    }
    if (g->plan->have_time)
        h3_log(H3_LOG_INFO, "plan: predicted %.2f s per model call (%.2f s with every block resident)%s",
               p->t_step, p->t_resident, r->gpus > 1 ? ", the slowest GPU's, its exchanges estimated" : "");
    if (q->refine_width) {
        const h3_dit_plan *pr2 = &g->plan->dit_refine;
        h3_log(H3_LOG_INFO,
               "plan: the DiT's refine pass at %lldx%lld (%lld packed rows): %d of %d blocks resident, %d "
               "streamed from pinned memory, %d from the file; predicted device peak %s",
               (long long)q->refine_width, (long long)q->refine_height, (long long)pr2->S, pr2->n_resident,
               pr2->n_units, pr2->n_pinned, pr2->n_disk, h3_budget_str(pr2->dev_peak, d, sizeof d));
    }
done:
    h3_text_encoder_close(te);
    h3_video_enc_close(venc);
    h3_video_vae_close(vv);
    h3_audio_vae_close(av);
    return st;
}

/* On the CPU the DiT stage holds everything it uses in host memory: the packed layout and its index tables,
 * the latents and their rows, the sampler's state, the text states, the forward's buffers and kept modulation
 * (the DiT's own arithmetic: h3_dit_forward_mem_of) and the weights the DiT copies rather than maps. A
 * request whose stage needs more than the host budget (--ram-budget, default H3_RAM_SHARE of MemAvailable)
 * stops here, before the text encoder runs, instead of exhausting the machine's memory steps later. Headers
 * only. */
static h3_status check_cpu_dit(gen *g, int64_t n_tokens) {
    const h3_request *q = &g->req;
    int64_t budget = g->r->ram_budget;
    if (budget == 0) budget = h3_budget_default_ram(); /* 0 when unknown: not checked */
    if (budget <= 0) {
        snprintf(g->res.plan, sizeof g->res.plan, "every stage on the CPU; host memory not limited");
        return H3_OK;
    }
    h3_status st = H3_OK;
    h3_dit *d = NULL;
    h3_seq_layout L;
    H3_CHECK(dit_call_sizes(g, n_tokens, &L)); /* the longer pass's canvas (cw x ch in the message) */
    const int64_t cw = q->refine_width ? q->refine_width : q->width,
                  ch = q->refine_width ? q->refine_height : q->height;
    H3_CHECK_CTX(h3_dit_open(g->files.dit, NULL, &d), "the DiT (%s)", g->files.dit);
    const h3_dit_config *dc = h3_dit_get_config(d);
    h3_dit_forward_mem fm;
    h3_dit_forward_mem_of(d, 0, -1, L.seq_len, L.text_len, L.n_video_rows + L.n_cond_rows, L.n_audio_rows,
                          g->n_uniq, &fm);
    h3_dit_weight_bytes wb;
    h3_dit_weight_bytes_of(d, &wb);
    const double S = (double)L.seq_len, rows = (double)(L.n_video_rows + L.n_audio_rows + L.text_len);
    /* the sampler's rows are the whole clip's; a clip of several windows adds one window's rows and
     * velocities */
    const double nvw = (double)L.n_video_rows * H3_VIDEO_ROW_DIM, naw = (double)L.n_audio_rows * H3_AUDIO_LATENT_CHANNELS;
    const double nv = nvw * (double)g->win.latent_t / (double)L.latent_t,
                 na = 2.0 * (double)g->win.audio_t * H3_AUDIO_LATENT_CHANNELS;
    const double sampler = (q->sampler == H3_SAMPLER_EULER ? nv + na : 2 * (nv + na) + na) +
                           (g->win.n > 1 ? 2 * (nvw + naw) : 0.0);
    /* the layout (tags, positions, indices), run_dit's tables, the latents twice (latent order and rows), the
     * sampler, the text states (the encoder's output and the DiT's copy) */
    /* a long clip: every window has its own layout and tables, every other context its text states */
    const double tables = (S * (1 + 24 + 8) + rows * 8 + S * 8 + rows * 4) * (double)g->win.n;
    const double latents = 4 * (2 * (nv + na) + sampler) +
                           (8.0 + 4.0 * (g->n_ctx > 1 ? g->n_ctx - 1 : 0)) * (double)L.text_len * (double)dc->text_dim;
    const double forward = (double)(fm.workspace + fm.scratch + fm.mod_tables);
    double lora = 0; /* the LoRAs' factors and the owned copies of the weights they merge into */
    if (g->r->n_loras) {
        h3_lora l;
        memset(&l, 0, sizeof l);
        st = h3_lora_read(&l, d, g->r->n_loras, (const char *const *)g->r->lora, g->r->lora_strength);
        lora = (double)h3_lora_host_bytes(d, &l, (h3_lora_mode)g->r->lora_mode);
        h3_lora_free(&l);
        H3_CHECK(st);
    }
    const double dit =
        (forward > (double)fm.mod_peak ? forward : (double)fm.mod_peak) + (double)wb.owned + lora;
    const double need = tables + latents + dit;
    if (need > (double)budget) {
        char a[32], b[32], c[32], e[32];
        H3_FAIL(
            H3_ERR_BUDGET,
            "%lld frames at %lldx%lld (%lld packed rows) need %s of host memory for the DiT on the CPU "
            "(latents, rows and the sampler %s, the DiT's buffers and LoRAs %s); the host budget is %s (%s): "
            "ask for fewer frames or a smaller canvas (or --lora-mode side: merged LoRAs copy the weights "
            "they "
            "change)",
            (long long)q->frames, (long long)cw, (long long)ch, (long long)L.seq_len,
            h3_budget_str((int64_t)need, a, sizeof a),
            h3_budget_str((int64_t)(tables + latents), b, sizeof b), h3_budget_str((int64_t)dit, c, sizeof c),
            h3_budget_str(budget, e, sizeof e),
            g->r->ram_budget > 0 ? "--ram-budget" : "80% of the memory available");
    }
    h3_log(H3_LOG_DEBUG, "the DiT on the CPU: %.2f GiB of host memory planned, budget %.2f GiB",
           need / H3_GIB, (double)budget / H3_GIB);
    {
        char a[32], b[32];
        snprintf(g->res.plan, sizeof g->res.plan,
                 "every stage on the CPU; the DiT stage needs %s of host memory (%lld packed rows), within "
                 "the host budget of %s",
                 h3_budget_str((int64_t)need, a, sizeof a), (long long)L.seq_len,
                 h3_budget_str(budget, b, sizeof b));
    }
done:
    h3_dit_close(d);
    return st;
}

/* The keyframes inside window k of a long clip, at their frames in it (packed order); returns how many. */
static int window_keyframes(const gen *g, int k, int64_t *frames) {
    int n = 0;
    for (int i = 0; i < g->kf.n; i++)
        if (g->ctx[g->ctx_of[k]].mask >> i & 1) frames[n++] = g->kf.frame[i] - g->win.f_start[k];
    return n;
}

/* One sampling pass: the first (from the seed's noise at the canvas) or the refine pass (from the first
 * pass's latents: see run_refine). */
typedef struct pass_spec {
    int stage; /* H3_GEN_DIT or H3_GEN_REFINE */
    int64_t width, height;
    const h3_schedule *sch;
    const float *uniq;
    int n_uniq;
    const h3_plan *plan; /* on the device: the plan whose .dit places this pass */
    /* the refine pass: the first pass's latents (NULL: the first pass) */
    const h3_tensor *first_video, *first_audio;
    int last; /* the DiT's last pass: its headers close at the end */
} pass_spec;

/* Samples the latents of a pass: video_lat [24, T, H, W] and audio_lat [2, 32, T_a] (allocated here).
 *
 * The noise is the seed's at this pass's canvas (h3_rng_t2va_noise: the video latent's values, the audio
 * rows' own stream), so a refine pass at denoise 1 starts from exactly the noise a plain generation at the
 * refine canvas starts from. The refine pass starts at the first sigma of its schedule (sigma_v, sigma_a)
 * from video = (1 - sigma_v)*upscale(first pass's video) + sigma_v*noise     (then patchified) and holds the
 * first pass's audio: every call sees it noised to that call's sigma_a with the seed's audio noise, and it
 * comes back unchanged (h3_dit_sample_args.held_audio). */
static h3_status run_pass(gen *g, const h3_tensor *hidden, const pass_spec *ps, h3_tensor *video_lat,
                          h3_tensor *audio_lat) {
    h3_status st = H3_OK;
    h3_seq_layout L;
    memset(&L, 0, sizeof L);
    float *vrows = NULL, *arows = NULL, *held = NULL, *anoise = NULL, *up = NULL;
    h3_dit *own = NULL;
    h3_plan *split_plan = NULL; /* a DiT split over GPUs: GPU 0's plan */
    h3_seq_layout *WL = NULL; /* a long clip's windows' layouts (window 0's is L) */
    const h3_tensor **wtext = NULL;
    const h3_seq_layout **wlay = NULL;
    const float **wcond = NULL;
    const h3_request *q = &g->req;
    const int refine = ps->first_video != NULL;
    /* one window's layout (the clip's when it is one window); the rows are the clip's */
    const h3_windows *win = g->win.n > 1 ? &g->win : NULL; /* the refine pass too, at its canvas */
    int64_t lf[H3_MAX_KEYFRAMES]; /* window 0's keyframes' frames */
    const int nk0 = win ? window_keyframes(g, 0, lf) : refine ? 0 : g->kf.n;
    if (g->refs.n)
        H3_CHECK(h3_seq_layout_ref2va(hidden->shape[0], g->text_tags, q->frames, ps->width, ps->height, g->refs.n,
                                      g->ref_blocks, &L));
    else
        H3_CHECK(h3_seq_layout_fl2va(hidden->shape[0], g->text_tags, win ? q->window : q->frames, ps->width,
                                     ps->height, nk0, win ? lf : g->kf.frame, &L));
    if (!refine && !g->refs.n) g->res.keyframe_rows = L.n_cond_rows;
    if (g->refs.n) {
        g->res.reference_video_rows = L.n_cond_rows;
        g->res.reference_audio_rows = L.n_ref_audio_rows;
    }
    if (refine) {
        g->res.refine_seq_len = L.seq_len;
    } else {
        g->res.seq_len = L.seq_len;
    }
    const int64_t LT = win ? win->latent_t : L.latent_t, AT = win ? win->audio_t : L.audio_t; /* the clip's */
    g->res.latent_t = LT;
    g->res.latent_h = L.latent_h;
    g->res.latent_w = L.latent_w;
    g->res.audio_latents = AT;
    const int steps = ps->sch->n - 1;
    stage_begin(g, ps->stage, steps);

    /* Noise: the video latent in [24, T, H, W] order, patchified into rows; the audio directly in rows. */
    const int64_t nv = LT * (L.latent_h / 2) * (L.latent_w / 2) * H3_VIDEO_ROW_DIM,
                  na = 2 * AT * H3_AUDIO_LATENT_CHANNELS;
    int64_t vshape[4] = {H3_LATENT_CHANNELS, LT, L.latent_h, L.latent_w};
    int64_t ashape[3] = {2, H3_AUDIO_LATENT_CHANNELS, AT};
    H3_CHECK(h3_tensor_alloc(video_lat, H3_PLACE_HOST, H3_F32, 4, vshape, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_tensor_alloc(audio_lat, H3_PLACE_HOST, H3_F32, 3, ashape, H3_MEM_ACTIVATIONS));
    vrows = h3_malloc((size_t)nv * sizeof(float) + 64, H3_MEM_ACTIVATIONS);
    arows = h3_malloc((size_t)na * sizeof(float) + 64, H3_MEM_ACTIVATIONS);
    if (!vrows || !arows)
        H3_FAIL(H3_ERR_NOMEM, "out of memory for the packed sequence (%lld rows)", (long long)L.seq_len);
    h3_rng_t2va_noise(q->seed, video_lat->data, (size_t)nv, arows, (size_t)na);
    if (refine) {
        const h3_tensor *fv = ps->first_video, *fa = ps->first_audio;
        if (fv->shape[1] != LT || fa->shape[2] != AT)
            H3_FAIL(H3_ERR_INTERNAL, "the refine pass's latents do not follow the first pass's");
        const float sv = ps->sch->sigma_v[0], sa = ps->sch->sigma_a[0], kv = 1.0f - sv, ka = 1.0f - sa;
        up = h3_malloc((size_t)nv * sizeof(float) + 64, H3_MEM_ACTIVATIONS);
        held = h3_malloc((size_t)na * sizeof(float) + 64, H3_MEM_ACTIVATIONS);
        anoise = h3_malloc((size_t)na * sizeof(float) + 64, H3_MEM_ACTIVATIONS);
        if (!up || !held || !anoise) H3_FAIL(H3_ERR_NOMEM, "out of memory for the refine pass's latents");
        H3_CHECK(h3_video_latent_upscale(fv->data, H3_LATENT_CHANNELS, LT, fv->shape[2], fv->shape[3],
                                         L.latent_h, L.latent_w, up));
        float *x = video_lat->data; /* the noise, in latent order */
        for (int64_t i = 0; i < nv; i++) x[i] = kv * up[i] + sv * x[i];
        h3_free(up);
        up = NULL;
        h3_audio_pack(fa->data, AT, held);
        memcpy(anoise, arows, (size_t)na * sizeof(float));
        for (int64_t i = 0; i < na; i++) arows[i] = ka * held[i] + sa * anoise[i];
        g->res.refine_calls = steps;
        g->res.refine_sigma_v = sv;
    }
    if (!refine && g->snd_rows) { /* the soundtrack's rows, clean, in place of the audio noise */
        if (g->res.audio_latents * 2 * H3_AUDIO_LATENT_CHANNELS != na)
            H3_FAIL(H3_ERR_INTERNAL, "the soundtrack's latents do not fit the layout");
        memcpy(arows, g->snd_rows, (size_t)na * sizeof(float));
    }
    h3_video_patchify(video_lat->data, LT, L.latent_h, L.latent_w, vrows);
    int start_step = 0;
    if (!refine && g->r->checkpoint) { /* the first pass's state, saved every few calls; resumed when saved */
        if (!h3_sample_resumable(q->sampler, q->scheduler)) {
            h3_log(H3_LOG_WARN, "--checkpoint: %s on the %s schedule keeps state between calls that is not saved: "
                   "no checkpoint (euler on h3 resumes)", h3_sampler_name(q->sampler),
                   h3_scheduler_name(q->scheduler));
        } else {
            uint64_t hsh = 1469598103934665603ull; /* FNV-1a of the prompt */
            for (const unsigned char *c = (const unsigned char *)q->prompt; *c; c++) hsh = (hsh ^ *c) * 1099511628211ull;
            for (int i = 1; i < g->n_prompts; i++) /* a long clip's later prompts */
                for (const unsigned char *c = (const unsigned char *)g->prompt[i]; *c; c++)
                    hsh = (hsh ^ *c) * 1099511628211ull;
            snprintf(g->ck_key, sizeof g->ck_key,
                     "frames %lld size %lldx%lld steps %d seed %llu sampler %s scheduler %s shift %g:%g keyframes %d "
                     "rows %lld prompt %016llx",
                     (long long)q->frames, (long long)ps->width, (long long)ps->height, q->steps,
                     (unsigned long long)q->seed, h3_sampler_name(q->sampler), h3_scheduler_name(q->scheduler),
                     q->shift_video, q->shift_audio, g->kf.n, (long long)L.seq_len, (unsigned long long)hsh);
            if (win) {
                const size_t used = strlen(g->ck_key);
                snprintf(g->ck_key + used, sizeof g->ck_key - used, " window %lld overlap %lld", (long long)q->window,
                         (long long)q->overlap);
            }
            if (g->r->audio) {
                const size_t used = strlen(g->ck_key);
                snprintf(g->ck_key + used, sizeof g->ck_key - used, " soundtrack %s %lld", g->r->audio,
                         (long long)g->snd.samples);
            }
            if (g->refs.n) { /* the references, in order: their kinds and paths hashed (FNV-1a) */
                uint64_t rh = 1469598103934665603ull;
                for (int k = 0; k < g->refs.n; k++) {
                    rh = (rh ^ (unsigned)(g->refs.r[k].kind + 1)) * 1099511628211ull;
                    for (const unsigned char *c = (const unsigned char *)g->refs.r[k].path; *c; c++)
                        rh = (rh ^ *c) * 1099511628211ull;
                }
                const size_t used = strlen(g->ck_key);
                snprintf(g->ck_key + used, sizeof g->ck_key - used, " references %d %016llx", g->refs.n,
                         (unsigned long long)rh);
            }
            if (g->r->attention == H3_ATTN_MODE_FP8 || !strncmp(g->res.attention, "fp8", 3)) {
                const size_t used = strlen(g->ck_key);
                snprintf(g->ck_key + used, sizeof g->ck_key - used, " attention fp8");
            }
            if (g->r->attention == H3_ATTN_MODE_INT8 || !strncmp(g->res.attention, "int8", 4)) {
                const size_t used = strlen(g->ck_key);
                snprintf(g->ck_key + used, sizeof g->ck_key - used, " attention int8");
            }
            if (g->r->attention == H3_ATTN_MODE_SPARSE || !strncmp(g->res.attention, "sparse", 6)) {
                const size_t used = strlen(g->ck_key);
                const h3_sparse_rule sp = request_sparse_rule(g->r); /* the rule as run, given or not */
                snprintf(g->ck_key + used, sizeof g->ck_key - used, " attention sparse %a %a %a", (double)sp.tau,
                         (double)sp.start, (double)sp.end);
            }
            if (g->r->cache_threshold > 0) {
                const size_t used = strlen(g->ck_key);
                snprintf(g->ck_key + used, sizeof g->ck_key - used, " cache %g", g->r->cache_threshold);
            }
            for (int i = 0; i < g->r->n_loras; i++) {
                const size_t used = strlen(g->ck_key);
                snprintf(g->ck_key + used, sizeof g->ck_key - used, " lora %s:%g", g->r->lora[i],
                         (double)g->r->lora_strength[i]);
            }
            g->ck_video = vrows;
            g->ck_audio = arows;
            g->ck_nv = nv;
            g->ck_na = na;
            start_step = read_checkpoint(g, vrows, arows, steps);
            if (start_step) {
                g->res.resumed_step = start_step;
                h3_log(H3_LOG_INFO, "resuming from the checkpoint %s: %d of %d model calls done", g->r->checkpoint,
                       start_step, steps);
                for (int i = 0; i < start_step; i++) h3_progress_step(&g->prog);
            }
        }
    }

    /* The DiT: on the device as planned (plan_run opened it), or on the host, resident. */
    h3_dit_sample_args sa;
    memset(&sa, 0, sizeof sa);
    if (g->res.device == H3_DEVICE_CUDA) {
        if (!g->dit || !ps->plan) H3_FAIL(H3_ERR_INTERNAL, "the DiT was not planned");
        sa.dit.dit = g->dit;
        sa.dit.plan = ps->plan;
        if (g->r->gpus > 1) { /* GPU 0's own plan of the split; the workers get theirs */
            split_plan = h3_malloc(sizeof *split_plan, H3_MEM_OTHER);
            if (!split_plan) H3_FAIL(H3_ERR_NOMEM, "out of memory");
            *split_plan = *ps->plan;
            split_plan->dit = ps->plan->dit_gpu[0];
            sa.dit.plan = split_plan;
            sa.gpus = g->r->gpus;
            sa.split.dit_path = g->files.dit;
            sa.split.n_loras = g->r->n_loras;
            sa.split.lora = (const char *const *)g->r->lora;
            sa.split.lora_strength = g->r->lora_strength;
            sa.split.lora_mode = g->r->lora_mode;
            sa.split.attn_flags = h3_dit_attention(g->dit);
            sa.split.verbosity = h3_log_enabled(H3_LOG_DEBUG) ? 1 : -1;
            if (ps->last && ps->plan->vvae_gpus > 1) sa.keep_group = &g->group; /* the decode's GPUs too */
        }
        sa.dit.memory_trace = refine ? NULL : g->r->memory_trace;
        if (!refine && g->reuse_dit && g->ses->dit_stream) { /* placed by the last run: the stage owns it now */
            sa.dit.stream = g->ses->dit_stream;
            memcpy(sa.dit.stream_dev, g->ses->dit_stream_dev, sizeof sa.dit.stream_dev);
            g->ses->dit_stream = NULL;
            memset(g->ses->dit_stream_dev, 0, sizeof g->ses->dit_stream_dev);
            g->held_dev = 0;
            g->res.reused |= H3_REUSED_DIT_PLACEMENT;
        }
        sa.dit.keep = !refine && g->keep_dit;
        if (!refine && g->reuse_pinned && g->ses->dit_pinned.n) sa.dit.pinned = &g->ses->dit_pinned;
        sa.dit.keep_pinned = !refine && g->keep_pinned;
    } else if (g->use_models && !g->r->n_loras && g->ses->dit && !g->ses->dit_device) {
        sa.dit.dit = g->ses->dit; /* its weights as the last run left them */
        g->res.reused |= H3_REUSED_DIT;
    } else {
        h3_dit_open_opts oo;
        memset(&oo, 0, sizeof oo);
        oo.act_place = oo.weight_place = H3_PLACE_HOST;
        H3_CHECK_CTX(h3_dit_open(g->files.dit, &oo, &own), "the DiT");
        H3_CHECK(apply_loras(g, own));
        sa.dit.dit = own;
        if (g->use_models && !g->r->n_loras) { /* kept for the next run (one opened for a device's plan goes;
                                                * one with this run's LoRAs is not kept) */
            h3_session_close_dit(g->ses);
            g->ses->dit = own;
            g->ses->dit_device = 0;
            own = NULL;
        }
    }
    if (g->res.device != H3_DEVICE_CUDA) H3_CHECK(set_attention(g, (h3_dit *)sa.dit.dit, 0, L.seq_len));
    sa.dit.text = hidden;
    sa.dit.timesteps = ps->uniq;
    sa.dit.n_timesteps = ps->n_uniq;
    sa.layout = &L;
    sa.sampler = q->sampler;
    sa.schedule = ps->sch;
    sa.on_step = dit_step;
    sa.step_ctx = g;
    sa.from_latent = refine;
    sa.held_audio = held;
    sa.held_noise = anoise;
    if (!refine && g->snd_rows) { /* held clean: t = 1, no noise */
        sa.held_audio = g->snd_rows;
        sa.held_noise = NULL;
    }
    sa.cond_rows = refine ? NULL : g->refs.n ? g->ref_vrows : g->kf_rows;
    sa.ref_audio_rows = g->ref_arows;
    sa.dump_inputs = refine ? NULL : g->r->dump_dit_inputs;
    sa.start_step = start_step;
    sa.windows = win;
    if (win) { /* each window's text states, layout (its keyframes at their frames in it) and keyframe rows */
        sa.cond_rows = g->ctx[0].cond;
        WL = h3_calloc((size_t)win->n, sizeof *WL, H3_MEM_ACTIVATIONS);
        wtext = h3_calloc((size_t)win->n, sizeof *wtext, H3_MEM_OTHER);
        wlay = h3_calloc((size_t)win->n, sizeof *wlay, H3_MEM_OTHER);
        wcond = h3_calloc((size_t)win->n, sizeof *wcond, H3_MEM_OTHER);
        if (!WL || !wtext || !wlay || !wcond) H3_FAIL(H3_ERR_NOMEM, "out of memory for the windows' layouts");
        for (int k = 0; k < win->n; k++) {
            const int c = g->ctx_of[k];
            const wctx *x = &g->ctx[c];
            wtext[k] = c ? &x->hidden : hidden;
            wcond[k] = x->cond;
            if (!k) {
                wlay[k] = &L;
                continue;
            }
            const int nk = window_keyframes(g, k, lf);
            H3_CHECK(h3_seq_layout_fl2va(wtext[k]->shape[0], c ? x->tags : g->text_tags, q->window, ps->width,
                                         ps->height, nk, lf, &WL[k]));
            wlay[k] = &WL[k];
        }
        sa.win_text = wtext;
        sa.win_layout = wlay;
        sa.win_cond = wcond;
    }
    h3_cache_opts co = {g->r->cache_threshold, H3_CACHE_START, H3_CACHE_END};
    if (g->r->cache_threshold > 0) sa.cache = &co;
    if (!refine) g->res.modulation_timesteps = ps->n_uniq;
    h3_dit_stage_result dr;
    const double t_stage = now_s() - g->t0;
    st = h3_stage_dit_sample(g->ex, &sa, vrows, arows, &dr);
    if (!refine) g->res.dit_start_s = t_stage + dr.open_s;
    if (sa.dit.pinned) h3_pinned_cache_free(&g->ses->dit_pinned); /* what the stage did not adopt */
    if (dr.pinned_adopted) g->res.reused |= H3_REUSED_DIT_PINNED;
    if (dr.pinned.n) g->ses->dit_pinned = dr.pinned; /* kept for the next run */
    if (dr.stream) { /* kept placed for the next run; the stages after this one run beside it */
        g->ses->dit_stream = dr.stream;
        memcpy(g->ses->dit_stream_dev, dr.stream_dev, sizeof dr.stream_dev);
        g->held_dev = dr.stream_dev[H3_DEVCAT_WEIGHTS] + dr.stream_dev[H3_DEVCAT_SLOTS];
    }
    g->res.stages[ps->stage] = dr.rep;
    if (sa.cache) {
        g->res.cache_calls += dr.cache.calls;
        g->res.cache_skipped += dr.cache.skipped;
        if (dr.cache.est_max > g->res.cache_est_max) g->res.cache_est_max = dr.cache.est_max;
        h3_log(H3_LOG_INFO,
               "step cache (EasyCache, threshold %g): %d of %d model calls answered from the cache (%.2fx fewer "
               "DiT calls); estimated relative output change of a skip: at most %.3f, %.3f summed",
               g->r->cache_threshold, dr.cache.skipped, dr.cache.calls,
               dr.cache.calls > dr.cache.skipped ? (double)dr.cache.calls / (dr.cache.calls - dr.cache.skipped) : 0.0,
               dr.cache.est_max, dr.cache.est_total);
    }
    if (refine)
        g->res.refine_measured_step_s = dr.call_s;
    else
        g->res.measured_step_s = dr.call_s;
    if (dr.rep.on_device) {
        if (dr.rep.dev_peak > g->res.dev_peak) g->res.dev_peak = dr.rep.dev_peak;
        if (!refine) snprintf(g->res.memory_report, sizeof g->res.memory_report, "%s", dr.memory_report);
    }
    H3_CHECK(st);
    int64_t bad = 0;
    for (int64_t i = 0; i < nv; i++) bad += !isfinite(vrows[i]);
    for (int64_t i = 0; i < na; i++) bad += !isfinite(arows[i]);
    if (bad)
        H3_FAIL(H3_ERR_FORMAT,
                "%lld values of the sampled latents are not finite: the DiT's weights (%s) are broken",
                (long long)bad, g->files.dit);
    h3_video_unpatchify(vrows, LT, L.latent_h, L.latent_w, video_lat->data);
    h3_audio_unpack(arows, AT, audio_lat->data);
    g->ck_video = g->ck_audio = NULL; /* the rows go with the pass */
    stage_end(g);
done:
    g->ck_video = g->ck_audio = NULL;
    h3_dit_close(own);
    if (ps->last || st != H3_OK) { /* the DiT's stages are over: its headers, mapped files and LoRAs go too */
        if (!g->dit_borrowed) h3_dit_close(g->dit);
        g->dit = NULL;
        h3_lora_free(&g->lora);
    }
    h3_free(vrows);
    h3_free(arows);
    h3_free(held);
    h3_free(anoise);
    h3_free(up);
    h3_seq_layout_free(&L);
    for (int k = 0; WL && k < g->win.n; k++) h3_seq_layout_free(&WL[k]);
    h3_free(WL);
    h3_free(wtext);
    h3_free(wlay);
    h3_free(wcond);
    h3_free(split_plan);
    return st;
}

/* The first pass (and with --refine the second): the final latents in video_lat and audio_lat. */
static h3_status run_dit(gen *g, const h3_tensor *hidden, h3_tensor *video_lat, h3_tensor *audio_lat) {
    const h3_request *q = &g->req;
    const int refine = q->refine_width > 0;
    pass_spec first = {H3_GEN_DIT, q->width, q->height, &g->sch, g->uniq_t,
                       g->n_uniq,  g->plan,  NULL,      NULL,    !refine};
    H3_TRY(run_pass(g, hidden, &first, video_lat, audio_lat));
    if (!refine) return H3_OK;
    H3_TRY(check_stop(g));
    h3_status st = H3_OK;
    h3_tensor v2 = {0}, a2 = {0};
    h3_plan *rp = NULL;
    if (g->plan) { /* the same plan with the refine pass's DiT placement */
        rp = h3_malloc(sizeof *rp, H3_MEM_OTHER);
        if (!rp) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        *rp = *g->plan;
        rp->dit = g->plan->dit_refine;
        memcpy(rp->dit_gpu, g->plan->dit_refine_gpu, sizeof rp->dit_gpu);
    }
    pass_spec second = {H3_GEN_REFINE,
                        q->refine_width,
                        q->refine_height,
                        &g->sch_refine,
                        g->uniq_r,
                        g->n_uniq_r,
                        rp,
                        video_lat,
                        audio_lat,
                        1};
    H3_CHECK(run_pass(g, hidden, &second, &v2, &a2));
    h3_tensor_free(video_lat);
    h3_tensor_free(audio_lat);
    *video_lat = v2;
    *audio_lat = a2;
    memset(&v2, 0, sizeof v2);
    memset(&a2, 0, sizeof a2);
done:
    h3_tensor_free(&v2);
    h3_tensor_free(&a2);
    h3_free(rp);
    return st;
}

/* ---- the VAEs and the file ----------------------------------------------------------------------------- */

/* waveform [2, n] (allocated here): the clip's exact sample count, the decoder's output trimmed or padded. */
/* The audio VAE: the session's (kept from an earlier run) or opened now; a run with a session leaves it there. */
static h3_status audio_vae_of(gen *g, h3_audio_vae **out) {
    if (g->use_models && g->ses->avae) {
        *out = g->ses->avae;
        g->res.reused |= H3_REUSED_AUDIO_VAE;
        return H3_OK;
    }
    H3_TRY_CTX(h3_audio_vae_open(g->files.audio_vae, NULL, out), "the audio VAE");
    if (g->use_models) g->ses->avae = *out; /* kept (whatever happens next, the session owns it) */
    return H3_OK;
}

/* The soundtrack's first n samples of each side into dst [2, n], silence after its end. */
static void snd_fill(const gen *g, float *dst, int64_t n) {
    const int64_t m = g->snd.samples < n ? g->snd.samples : n;
    const float *src[2] = {g->snd.left, g->snd.right};
    for (int ch = 0; ch < 2; ch++) {
        memcpy(dst + ch * n, src[ch], (size_t)m * sizeof(float));
        if (m < n) memset(dst + ch * n + m, 0, (size_t)(n - m) * sizeof(float));
    }
}

/* A soundtrack through the audio VAE's encoder (on the host): its first T_a·800 samples (silence after its end)
 * to the posterior mean, normalized and packed as the DiT's audio rows (g->snd_rows). */
static h3_status run_soundtrack(gen *g) {
    if (!g->snd.samples) return H3_OK;
    h3_status st = H3_OK;
    h3_audio_vae *v = NULL;
    h3_audio_enc *e = NULL;
    h3_tensor wave = {0}, lat = {0};
    stage_begin(g, H3_GEN_SOUNDTRACK, 0);
    H3_CHECK(audio_vae_of(g, &v));
    st = h3_audio_enc_open(v, &e);
    if (st != H3_OK) {
        st = h3_error_wrap(st == H3_ERR_FORMAT ? H3_ERR_UNSUPPORTED : st,
                           "a soundtrack needs the audio VAE's encoder (%s)", g->files.audio_vae);
        goto done;
    }
    const int64_t T = h3_audio_latents(g->req.frames), n = T * H3_AUDIO_HOP;
    const int64_t ws[3] = {2, 1, n};
    H3_CHECK(h3_tensor_alloc(&wave, H3_PLACE_HOST, H3_F32, 3, ws, H3_MEM_ACTIVATIONS));
    snd_fill(g, wave.data, n);
    h3_stage_plan ta;
    H3_CHECK_CTX(h3_stage_audio_encode(g->ex, e, g->plan ? beside_dit(g, &g->plan->aenc, &ta) : NULL, &wave, &lat,
                                       &g->res.stages[H3_GEN_SOUNDTRACK]),
                 "the soundtrack %s", g->r->audio);
    if (lat.shape[2] != T) H3_FAIL(H3_ERR_INTERNAL, "the soundtrack's latents: %lld frames, not %lld",
                                   (long long)lat.shape[2], (long long)T);
    h3_audio_enc_normalize(h3_audio_vae_get_config(v), &lat);
    g->snd_rows = h3_malloc((size_t)(T * 2 * H3_AUDIO_LATENT_CHANNELS) * sizeof(float) + 64, H3_MEM_ACTIVATIONS);
    if (!g->snd_rows) H3_FAIL(H3_ERR_NOMEM, "out of memory for the soundtrack's latents");
    h3_audio_pack(lat.data, T, g->snd_rows);
    h3_log(H3_LOG_INFO, "soundtrack: %s (%.2f s, %d Hz, %d channel%s) encoded to %lld latents a channel, held "
                        "clean as the clip's audio",
           g->r->audio, g->res.soundtrack_s, g->snd.src_rate, g->snd.src_channels,
           g->snd.src_channels == 1 ? "" : "s", (long long)T);
    stage_end(g);
done:
    h3_tensor_free(&wave);
    h3_tensor_free(&lat);
    h3_audio_enc_close(e);
    if (!g->use_models) h3_audio_vae_close(v);
    return st;
}

static h3_status run_audio(gen *g, const h3_tensor *audio_lat, h3_tensor *waveform) {
    h3_status st = H3_OK;
    h3_audio_vae *v = NULL;
    h3_tensor w = {0};
    if (g->snd.samples) { /* the clip carries the given sound, not one decoded from its latents */
        const int64_t n = h3_audio_samples(g->req.frames);
        H3_TRY(h3_tensor_alloc2(waveform, H3_PLACE_HOST, H3_F32, 2, n, H3_MEM_IO));
        snd_fill(g, waveform->data, n);
        g->res.audio_samples = n;
        return H3_OK;
    }
    stage_begin(g, H3_GEN_AUDIO_VAE, 0);
    H3_CHECK(audio_vae_of(g, &v));
    const h3_audio_vae_config *c = h3_audio_vae_get_config(v);
    if (c->latent_channels != H3_AUDIO_LATENT_CHANNELS || c->hop != H3_AUDIO_HOP ||
        c->sample_rate != H3_AUDIO_RATE)
        H3_FAIL(H3_ERR_FORMAT,
                "the audio VAE %s decodes %d-channel latents at %d samples each, %d Hz; H3's takes 32 "
                "channels to 800 samples at 32000 Hz",
                g->files.audio_vae, c->latent_channels, c->hop, c->sample_rate);
    const int64_t T = audio_lat->shape[2], S = T * c->hop;
    const int64_t n = h3_audio_samples(g->req.frames);
    H3_CHECK(h3_tensor_alloc2(&w, H3_PLACE_HOST, H3_F32, 2, S, H3_MEM_ACTIVATIONS));
    h3_stage_plan tb;
    H3_CHECK(h3_stage_audio_vae(g->ex, v, g->plan ? beside_dit(g, &g->plan->avae, &tb) : NULL, audio_lat, &w,
                                &g->res.stages[H3_GEN_AUDIO_VAE]));
    if (!g->use_models) h3_audio_vae_close(v);
    v = NULL;
    H3_CHECK(h3_tensor_alloc2(waveform, H3_PLACE_HOST, H3_F32, 2, n, H3_MEM_IO));
    for (int ch = 0; ch < 2; ch++) {
        const float *src = (const float *)w.data + ch * S;
        float *dst = (float *)waveform->data + ch * n;
        int64_t m = n < S ? n : S;
        memcpy(dst, src, (size_t)m * sizeof(float));
        if (m < n) memset(dst + m, 0, (size_t)(n - m) * sizeof(float));
    }
    g->res.audio_samples = n;
    stage_end(g);
done:
    h3_tensor_free(&w);
    if (!g->use_models) h3_audio_vae_close(v);
    return st;
}

/* Frames [3, n, H, W] in [0, 1], chunk by chunk: into the MP4 (and PNG files) as they come. */
static h3_status on_frames(void *user, const h3_tensor *f, int64_t first) {
    gen *g = user;
    const int64_t n = f->shape[1], plane = f->shape[2] * f->shape[3];
    if (first != g->res.frames_written)
        return H3_ERR(H3_ERR_INTERNAL, "the video VAE handed frame %lld after %lld", (long long)first,
                      (long long)g->res.frames_written);
    for (int64_t k = 0; k < n; k++) {
        if (h3_cancel_requested()) return interrupted(g); /* encoding a chunk's frames takes a while too */
        const float *rgb = (const float *)f->data + k * plane;
        H3_TRY(h3_mp4_write_frame(g->mp4, rgb, f->stride[0], f->shape[3]));
        if (g->png_open) H3_TRY(h3_png_seq_write(&g->png, rgb, f->stride[0], f->shape[3]));
        g->res.frames_written++;
    }
    /* One step per chunk; the decoder hands the last chunk's look-ahead frames over in one more call. */
    if (g->prog.step < g->prog.steps) h3_progress_step(&g->prog);
    return check_stop(g);
}

static h3_status run_video(gen *g, const h3_tensor *video_lat) {
    h3_status st = H3_OK;
    h3_video_vae *v = NULL;
    if (g->use_models && g->ses->vvae) {
        v = g->ses->vvae;
        g->res.reused |= H3_REUSED_VIDEO_VAE;
    } else {
        H3_CHECK_CTX(h3_video_vae_open(g->files.video_vae, NULL, &v), "the video VAE");
    }
    if (g->use_models) g->ses->vvae = v;
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    const int64_t T = video_lat->shape[1], H = video_lat->shape[2], W = video_lat->shape[3];
    if (h3_video_vae_num_frames(c, T) != g->req.frames)
        H3_FAIL(H3_ERR_FORMAT,
                "the video VAE %s decodes %lld latent frames to %lld frames, not the %lld requested",
                g->files.video_vae, (long long)T, (long long)h3_video_vae_num_frames(c, T),
                (long long)g->req.frames);
    /* the chunks the decode hands over, one progress step each: the plan's, or the host decode's own */
    h3_video_vae_mem m;
    if (g->plan)
        m = g->plan->vvae.vvae;
    else
        H3_CHECK(h3_video_vae_decode_peak(c, T, H, W, g->ex->threads, 0, &m));
    stage_begin(g, H3_GEN_VIDEO_VAE, m.chunks);
    h3_video_decode_out out = {H3_PIXELS_UNIT, on_frames, g, NULL};
    h3_stage_plan tb;
    h3_video_split split = {g->group, g->files.video_vae, NULL};
    if (g->group)
        h3_log(H3_LOG_INFO,
               "video VAE: %d chunks split over %d GPUs (chunk i on GPU i mod %d; GPU 0 gathers them)",
               m.chunks, g->plan->vvae_gpus, g->plan->vvae_gpus);
    st = h3_stage_video_vae(g->ex, v, g->plan ? beside_dit(g, &g->plan->vvae, &tb) : NULL,
                            g->group ? &split : NULL, video_lat, &out, &g->res.stages[H3_GEN_VIDEO_VAE]);
    h3_dit_group_stop(g->group); /* its workers end with the decode */
    g->group = NULL;
    H3_CHECK(st);
    if (g->res.frames_written != g->req.frames)
        H3_FAIL(H3_ERR_INTERNAL, "the video VAE handed %lld frames of %lld", (long long)g->res.frames_written,
                (long long)g->req.frames);
    stage_end(g);
done:
    if (!g->use_models) h3_video_vae_close(v);
    return st;
}

static h3_status write_latents(gen *g, const h3_tensor *video_lat, const h3_tensor *audio_lat) {
    h3_st_writer *w = NULL;
    h3_status st = h3_st_writer_new(&w);
    char buf[64];
    const h3_request *q = &g->req;
    int64_t fr[H3_MAX_KEYFRAMES];
    uint8_t *kpix = NULL;
    float *knoise = NULL, *waves[H3_MAX_REFS] = {0}; /* the writer copies at write time */
    int64_t vs[5] = {1, video_lat->shape[0], video_lat->shape[1], video_lat->shape[2], video_lat->shape[3]};
    if (st == H3_OK) st = h3_st_writer_add(w, "video_latents", H3_F32, 5, vs, video_lat->data);
    if (st == H3_OK) st = h3_st_writer_add_tensor(w, "audio_latents", audio_lat);
    if (g->kf.n && g->kf_rows) { /* what the DiT was given for them: the rows and the clean latents */
        const int64_t lh = q->height / H3_VAE_SPATIAL, lw = q->width / H3_VAE_SPATIAL;
        const int64_t rs[2] = {(int64_t)g->kf.n * (lh / 2) * (lw / 2), H3_VIDEO_ROW_DIM};
        if (st == H3_OK) st = h3_st_writer_add(w, "keyframe_rows", H3_F32, 2, rs, g->kf_rows);
        if (st == H3_OK) st = h3_st_writer_add_tensor(w, "keyframe_latents", &g->kf_clean);
        for (int k = 0; k < g->kf.n; k++) fr[k] = g->kf.frame[k];
        const int64_t fs[1] = {g->kf.n};
        if (st == H3_OK) st = h3_st_writer_add(w, "keyframe_frames", H3_I64, 1, fs, fr);
        /* the keyframes on the canvas, their mix noise, the presentation's ids and tags */
        const int64_t per = h3_tensor_numel(&g->kf_clean) / g->kf.n;
        kpix = h3_malloc((size_t)g->kf.n * (size_t)(q->width * q->height * 3), H3_MEM_IO);
        knoise = h3_malloc((size_t)(g->kf.n * per) * sizeof(float), H3_MEM_IO);
        if (!kpix || !knoise) st = H3_ERR(H3_ERR_NOMEM, "out of memory");
        if (st == H3_OK) {
            for (int k = 0; k < g->kf.n; k++)
                memcpy(kpix + (size_t)k * (size_t)(q->width * q->height * 3), g->kf.rgb[k],
                       (size_t)(q->width * q->height * 3));
            h3_rng_normal_at(q->seed, H3_RNG_STREAM_KEYFRAME, 0, knoise, (size_t)(g->kf.n * per));
        }
        const int64_t ps[4] = {g->kf.n, q->height, q->width, 3};
        if (st == H3_OK) st = h3_st_writer_add(w, "keyframe_pixels", H3_U8, 4, ps, kpix);
        if (st == H3_OK)
            st = h3_st_writer_add(w, "keyframe_noise", H3_F32, 5, g->kf_clean.shape, knoise);
        const int64_t ns[1] = {g->res.text_tokens};
        if (st == H3_OK && g->text_ids) st = h3_st_writer_add(w, "text_ids", H3_I32, 1, ns, g->text_ids);
        if (st == H3_OK && g->text_tags) st = h3_st_writer_add(w, "text_tags", H3_U8, 1, ns, g->text_tags);
    }
    if (g->refs.n && g->ref_vrows) { /* what the DiT was given for the references, and what they were made from */
        const int64_t nl = h3_refs_latent_values(&g->refs);
        const int64_t rv[2] = {g->ref_nv, H3_VIDEO_ROW_DIM}, ra[2] = {g->ref_na, H3_AUDIO_LATENT_CHANNELS}, rl[1] = {nl};
        if (st == H3_OK) st = h3_st_writer_add(w, "reference_rows", H3_F32, 2, rv, g->ref_vrows);
        if (st == H3_OK) st = h3_st_writer_add(w, "reference_audio_rows", H3_F32, 2, ra, g->ref_arows);
        if (st == H3_OK && g->ref_clean) st = h3_st_writer_add(w, "reference_latents", H3_F32, 1, rl, g->ref_clean);
        knoise = h3_malloc((size_t)nl * sizeof(float) + 8, H3_MEM_IO);
        if (!knoise) st = H3_ERR(H3_ERR_NOMEM, "out of memory");
        if (st == H3_OK) h3_rng_normal_at(q->seed, H3_RNG_STREAM_REFERENCE, 0, knoise, (size_t)nl);
        if (st == H3_OK) st = h3_st_writer_add(w, "reference_noise", H3_F32, 1, rl, knoise);
        for (int k = 0; k < g->refs.n && st == H3_OK; k++) {
            const h3_ref *f = &g->refs.r[k];
            char name[64];
            if (f->kind != H3_REF_AUDIO) { /* as read, and normalized */
                const int64_t ss[4] = {f->kind == H3_REF_IMAGE ? 1 : f->src_frames, f->sh, f->sw, 3},
                              ns[4] = {f->kind == H3_REF_IMAGE ? 1 : f->frames, f->h, f->w, 3};
                snprintf(name, sizeof name, "ref%d_source", k);
                st = h3_st_writer_add(w, name, H3_U8, 4, ss, f->src);
                snprintf(name, sizeof name, "ref%d_pixels", k);
                if (st == H3_OK) st = h3_st_writer_add(w, name, H3_U8, 4, ns, f->rgb);
                snprintf(name, sizeof name, "ref%d_fps", k);
                snprintf(buf, sizeof buf, "%.17g", f->kind == H3_REF_IMAGE ? 0.0 : f->src_fps);
                if (st == H3_OK) st = h3_st_writer_meta(w, name, buf);
            }
            snprintf(name, sizeof name, "ref%d_kind", k);
            if (st == H3_OK)
                st = h3_st_writer_meta(w, name, f->kind == H3_REF_IMAGE ? "image" : f->kind == H3_REF_VIDEO ? "video" : "audio");
            if (f->samples && st == H3_OK) { /* the sound at 32 kHz, as encoded */
                float *wv = waves[k] = h3_malloc((size_t)(2 * f->samples) * sizeof(float), H3_MEM_IO);
                if (!wv) {
                    st = H3_ERR(H3_ERR_NOMEM, "out of memory");
                    break;
                }
                memcpy(wv, f->left, (size_t)f->samples * sizeof(float));
                memcpy(wv + f->samples, f->right, (size_t)f->samples * sizeof(float));
                const int64_t ws[2] = {2, f->samples};
                snprintf(name, sizeof name, "ref%d_wave", k);
                st = h3_st_writer_add(w, name, H3_F32, 2, ws, wv);
            }
        }
        const int64_t ns[1] = {g->res.text_tokens};
        if (st == H3_OK && g->text_ids) st = h3_st_writer_add(w, "text_ids", H3_I32, 1, ns, g->text_ids);
        if (st == H3_OK && g->text_tags) st = h3_st_writer_add(w, "text_tags", H3_U8, 1, ns, g->text_tags);
        if (st == H3_OK && g->kf_pixels.data) st = h3_st_writer_add_tensor(w, "vision_pixels", &g->kf_pixels);
        const int64_t gs[2] = {g->kf_n_img, 3};
        if (st == H3_OK && g->kf_grid && g->kf_n_img) st = h3_st_writer_add(w, "vision_grid", H3_I64, 2, gs, g->kf_grid);
    }
    if (st == H3_OK) st = h3_st_writer_meta(w, "h3run", "generate");
    if (st == H3_OK) st = h3_st_writer_meta(w, "prompt", q->prompt);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)q->seed);
    if (st == H3_OK) st = h3_st_writer_meta(w, "seed", buf);
    snprintf(buf, sizeof buf, "%d", q->steps);
    if (st == H3_OK) st = h3_st_writer_meta(w, "steps", buf);
    if (st == H3_OK) st = h3_st_writer_meta(w, "sampler", h3_sampler_name(q->sampler));
    if (st == H3_OK) st = h3_st_writer_meta(w, "scheduler", h3_scheduler_name(q->scheduler));
    snprintf(buf, sizeof buf, "%lld", (long long)q->frames);
    if (st == H3_OK) st = h3_st_writer_meta(w, "frames", buf);
    snprintf(buf, sizeof buf, "%g:%g", q->shift_video, q->shift_audio);
    if (st == H3_OK) st = h3_st_writer_meta(w, "shift", buf);
    snprintf(buf, sizeof buf, "%lldx%lld", (long long)q->width, (long long)q->height);
    if (st == H3_OK) st = h3_st_writer_meta(w, "size", buf);
    if (q->refine_width) { /* the latents are the refine pass's */
        snprintf(buf, sizeof buf, "%lldx%lld:%g", (long long)q->refine_width, (long long)q->refine_height,
                 q->refine_denoise);
        if (st == H3_OK) st = h3_st_writer_meta(w, "refine", buf);
    }
    if (st == H3_OK) st = h3_st_writer_write(w, g->r->latents, 0);
    h3_st_writer_free(w);
    h3_free(kpix);
    h3_free(knoise);
    for (int k = 0; k < H3_MAX_REFS; k++) h3_free(waves[k]);
    return st;
}

/* Removes everything this run wrote (a failed or interrupted run leaves nothing that looks finished): the MP4
 * and the PNG folder being written, and every finished output waiting in the group. */
static void remove_outputs(gen *g) {
    if (g->mp4) {
        h3_mp4_abort(g->mp4);
        g->mp4 = NULL;
    }
    if (g->png_open) {
        h3_png_seq_close(&g->png);
        g->png_open = 0;
    }
    if (g->outs_open) {
        h3_outgroup_abort(&g->outs);
        g->outs_open = 0;
    }
}

/* The device for the stages: its backend up (a session's kept from its last run while the budget is the same),
 * and a session's DiT placement kept from its last run used by this run when the plan places the DiT alike and
 * the stages before the DiT fit beside it (given back first otherwise); whether this run keeps its own
 * placement (the stages after the DiT fit beside it). Every decision is logged. */
static h3_status settle_device(gen *g, h3_device dev) {
    if (dev != H3_DEVICE_CUDA) return H3_OK;
    h3_session *s = g->use_models ? g->ses : NULL;
    const h3_plan *p = g->plan;
    const int64_t budget = p->budgets.vram;
    int64_t kdev = 0, khost = 0;
    h3_dit_plan_kept_bytes(&p->dit, &kdev, &khost);
    char why[320] = "";
    const int eligible =
        s && !g->r->n_loras && !g->req.refine_width && g->dit_borrowed && g->dit == s->dit && g->r->gpus <= 1;
    if (!eligible)
        snprintf(why, sizeof why, "%s",
                 !s                  ? ""
                 : g->r->gpus > 1    ? "a DiT split over GPUs is placed by every run"
                 : g->r->n_loras     ? "this run's LoRAs belong to it alone"
                 : g->req.refine_width ? "a run with a refine pass places the DiT twice"
                                     : "this run opened another DiT");
    if (s && s->cuda_on && s->cuda_budget != budget) {
        if (s->dit_stream)
            h3_log(H3_LOG_INFO, "the DiT's placement kept from the last run is given back: the device budget "
                                "changed");
        h3_session_release_device(s, 1);
    }
    if (s && s->dit_stream) {
        h3_dit_placement pl;
        h3_dit_plan_placement(&p->dit, &pl);
        const int64_t held = s->dit_stream_dev[H3_DEVCAT_WEIGHTS] + s->dit_stream_dev[H3_DEVCAT_SLOTS];
        if (eligible && !h3_dit_stream_matches(s->dit_stream, &pl))
            snprintf(why, sizeof why, "this run's plan places the DiT otherwise");
        else if (eligible && h3_plan_fits_beside_dit(p, 1, held, khost, why, sizeof why))
            g->reuse_dit = 1;
        if (g->reuse_dit) {
            g->held_dev = held;
            if (g->res.stage_predicted_s[H3_GEN_DIT] > p->dit.t_load) /* nothing to place */
                g->res.stage_predicted_s[H3_GEN_DIT] -= p->dit.t_load;
            h3_log(H3_LOG_INFO, "the DiT: its placement kept from the last run (%.2f GiB on the device) serves "
                                "this run",
                   held / H3_GIB);
        } else {
            h3_log(H3_LOG_INFO, "the DiT's placement kept from the last run is given back: %s", why);
            h3_session_release_device(s, 0);
        }
    }
    if (s && s->dit_pinned.n) { /* the pinned copies alone, kept from the last run */
        const int64_t pb = h3_pinned_cache_bytes(&s->dit_pinned);
        if (eligible && h3_plan_fits_beside_dit(p, 1, 0, pb, why, sizeof why)) {
            g->reuse_pinned = 1;
            h3_log(H3_LOG_INFO, "the DiT: the pinned copies kept from the last run (%.2f GiB) serve this run",
                   pb / H3_GIB);
        } else {
            h3_log(H3_LOG_INFO, "the DiT's pinned copies kept from the last run are given back: %s", why);
            h3_pinned_cache_free(&s->dit_pinned);
        }
    }
    h3_status st = H3_OK;
    if (s && !s->cuda_on) { /* one backend for the session's runs: its arena is the budget */
        st = h3_cuda_init(&s->ex, 0, budget);
        s->cuda_on = st == H3_OK;
        s->cuda_budget = s->cuda_on ? budget : 0;
    } else if (!s) { /* one backend for the run: its arena is the budget every stage takes its turn in */
        st = h3_cuda_init(g->ex, 0, budget);
        g->cuda_on = st == H3_OK;
    }
    if (st != H3_OK) return h3_error_wrap(st, "%s", "--device cuda");
    if (eligible) {
        g->keep_dit = h3_plan_fits_beside_dit(p, 0, kdev, khost, why, sizeof why);
        if (!g->keep_dit && p->dit.host_pinned > 0) {
            char why2[320] = "";
            g->keep_pinned = h3_plan_fits_beside_dit(p, 0, 0, p->dit.host_pinned, why2, sizeof why2);
            h3_log(H3_LOG_INFO, "the DiT's placement goes back after its stage (%s); its pinned copies (%.2f GiB) %s%s",
                   why, p->dit.host_pinned / H3_GIB, g->keep_pinned ? "stay for the next run" : "too: ",
                   g->keep_pinned ? "" : why2);
        } else if (!g->keep_dit) {
            h3_log(H3_LOG_INFO, "the DiT's placement goes back after its stage: %s", why);
        }
    }
    return H3_OK;
}

/* The session's key: the model's paths as given. A run on another model drops what the session kept. */
static char *session_key(const h3_generate_request *r) {
    const char *parts[6] = {r->model,           r->given.dit,       r->given.text_encoder,
                            r->given.tokenizer, r->given.video_vae, r->given.audio_vae};
    size_t n = 1;
    for (int i = 0; i < 6; i++) n += (parts[i] ? strlen(parts[i]) : 0) + 1;
    char *k = h3_malloc(n, H3_MEM_OTHER);
    if (!k) return NULL;
    k[0] = 0;
    for (int i = 0; i < 6; i++) {
        strcat(k, parts[i] ? parts[i] : "");
        strcat(k, "\n");
    }
    return k;
}

/* The model's files: the session's when it holds them for this model (taken under its lock, kept locked until
 * the prompt is tokenized), else found now. A run on another model drops what the session kept; a check never
 * drops (a run may be using them): it goes without the session instead. */
static h3_status find_files(gen *g) {
    const h3_generate_request *r = g->r;
    if (g->ses) {
        char *key = session_key(r);
        if (!key) return H3_ERR(H3_ERR_NOMEM, "out of memory");
        pthread_mutex_lock(&g->ses->lock);
        g->ses_locked = 1;
        const int same = g->ses->key && !strcmp(g->ses->key, key);
        if (!same && g->check_only) {
            pthread_mutex_unlock(&g->ses->lock);
            g->ses_locked = 0;
            g->ses = NULL;
            h3_free(key);
        } else if (!same) {
            h3_session_drop(g->ses);
            g->ses->key = key;
        } else {
            h3_free(key);
        }
    }
    if (g->ses && g->ses->have_files && g->check_only) { /* a copy: a run may drop the session's */
        const h3_model_files *f = &g->ses->files;
        char *const src[6] = {f->dit, f->text_encoder, f->tokenizer, f->video_vae, f->audio_vae, f->root};
        char **dst[6] = {&g->files.dit,       &g->files.text_encoder, &g->files.tokenizer,
                         &g->files.video_vae, &g->files.audio_vae,    &g->files.root};
        g->files.layout = f->layout;
        for (int i = 0; i < 6; i++)
            if (src[i] && !(*dst[i] = h3_strdup(src[i]))) return H3_ERR(H3_ERR_NOMEM, "out of memory");
        return H3_OK;
    }
    if (g->ses && g->ses->have_files) {
        g->files = g->ses->files;
        g->files_borrowed = 1;
        return H3_OK;
    }
    H3_TRY(h3_model_files_find_for(r->model, &r->given, r->n_refs > 0, &g->files));
    if (g->ses && !g->check_only) {
        g->ses->files = g->files;
        g->ses->have_files = 1;
        g->files_borrowed = 1;
    }
    return H3_OK;
}

/* A long clip's prompts: checked, and each window's (g->prompt_of, into g->prompt: those some window takes). */
static h3_status resolve_prompts(gen *g) {
    const h3_generate_request *r = g->r;
    g->n_prompts = 1;
    g->prompt[0] = g->req.prompt;
    g->prompt_of = h3_calloc((size_t)g->win.n, sizeof(int), H3_MEM_OTHER);
    if (!g->prompt_of) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    if (!r->n_more_prompts) return H3_OK;
    if (r->n_more_prompts < 0 || r->n_more_prompts > H3_MAX_PROMPTS - 1)
        return H3_ERR(H3_ERR_INVALID, "%d prompts; at most %d", r->n_more_prompts + 1, H3_MAX_PROMPTS);
    const double len = (double)g->req.frames / H3_FPS;
    if (g->win.n < 2)
        return H3_ERR(H3_ERR_INVALID,
                      "several prompts need a clip of several windows; this one (%lld frames) is one window of %lld: "
                      "give more frames or a shorter --window",
                      (long long)g->req.frames, (long long)g->req.window);
    double start[H3_MAX_PROMPTS];
    start[0] = 0;
    for (int i = 0; i < r->n_more_prompts; i++) {
        const double t = r->more_prompt_split ? len * (i + 1) / (r->n_more_prompts + 1) : r->more_prompt_s[i];
        if (!r->more_prompt[i]) return H3_ERR(H3_ERR_INVALID, "prompt %d is missing", i + 2);
        H3_TRY_CTX(h3_request_check_prompt_bytes(strlen(r->more_prompt[i])), "prompt %d", i + 2);
        if (!(t > start[i]) || !(t < len))
            return H3_ERR(H3_ERR_INVALID,
                          "prompt %d starts at %g s: each prompt must start after the one before and within the "
                          "clip (0 to %.2f s)",
                          i + 2, t, len);
        start[i + 1] = t;
    }
    int used[H3_MAX_PROMPTS], map[H3_MAX_PROMPTS];
    memset(used, 0, sizeof used);
    h3_windows_prompts(&g->win, start, r->n_more_prompts + 1, g->prompt_of);
    for (int k = 0; k < g->win.n; k++) {
        used[g->prompt_of[k]] = 1;
        if (!k || g->prompt_of[k] != g->prompt_of[k - 1])
            h3_log(H3_LOG_INFO, "window %d (from %.2f s): prompt %d", k + 1, (double)g->win.f_start[k] / H3_FPS,
                   g->prompt_of[k] + 1);
    }
    g->n_prompts = 0;
    for (int i = 0; i <= r->n_more_prompts; i++) {
        map[i] = -1;
        if (!used[i]) {
            h3_log(H3_LOG_WARN,
                   "prompt %d (from %.2f s) is taken by no window: the next prompt starts before a window boundary "
                   "passes; put the prompts further apart than a window's step (%.2f s)",
                   i + 1, start[i], (double)(g->win.f_start[1] - g->win.f_start[0]) / H3_FPS);
            continue;
        }
        map[i] = g->n_prompts;
        g->prompt[g->n_prompts++] = i ? r->more_prompt[i - 1] : g->req.prompt;
    }
    for (int k = 0; k < g->win.n; k++) g->prompt_of[k] = map[g->prompt_of[k]];
    return H3_OK;
}

static h3_status run(const h3_generate_request *r, const h3_generate_callbacks *cb, h3_generate_result *out,
                     int check_only) {
    gen *g = h3_calloc(1, sizeof *g, H3_MEM_OTHER);
    if (!g) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_status st = H3_OK;
    h3_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    h3_tensor hidden = {0}, video_lat = {0}, audio_lat = {0}, wave = {0};
    h3_pathset paths;
    h3_pathset_init(&paths);
    g->r = r;
    g->cb = cb;
    g->check_only = check_only;
    g->ses = r->session;
    g->use_models = g->ses && !check_only;
    if (g->use_models) pthread_mutex_lock(&g->ses->run_lock); /* one run at a time on a session */
    if (!check_only) h3_mem_reset_peaks();
    const double t0 = now_s();
    g->t0 = t0;
    h3_progress_init(&g->prog, cb ? cb->progress : NULL, cb ? cb->progress_user : NULL);

    /* The request, the outputs and the device: all checked before anything is opened. */
    g->req = r->req;
    if (r->n_keyframes) { /* read first: a bad image is the request's, and the canvas may come from one */
        if (r->n_keyframes > H3_MAX_KEYFRAMES)
            H3_FAIL(H3_ERR_INVALID, "%d keyframes; at most %d", r->n_keyframes, H3_MAX_KEYFRAMES);
        if (r->req.refine_width)
            H3_FAIL(H3_ERR_INVALID, "--refine with keyframes is not supported: the refine pass would move the "
                                    "keyframes' frames; leave out --refine (or --first-frame/--last-frame/--keyframe)");
        /* a keyframe that cannot be read is a bad request (exit 2), as a missing option would be */
        for (int k = 0; k < r->n_keyframes && st == H3_OK; k++)
            st = h3_pathset_input(&paths, "a keyframe", r->keyframe[k], 1);
        if (st == H3_OK) st = h3_keyframes_read(r->keyframe, r->keyframe_frame, r->n_keyframes, &g->kf);
        if (st != H3_OK && st != H3_ERR_NOMEM && st != H3_ERR_INVALID)
            st = h3_error_wrap(H3_ERR_INVALID, "%s", "a keyframe");
        H3_CHECK(st);
        if (!g->req.width && !g->req.height) {
            H3_CHECK_CTX(h3_canvas_from_aspect(g->kf.sw[0], g->kf.sh[0], &g->req.width, &g->req.height),
                         "the canvas from the keyframe %s (%dx%d)", g->kf.path[0], g->kf.sw[0], g->kf.sh[0]);
            h3_log(H3_LOG_INFO, "canvas %lldx%lld, from the aspect ratio of %s (%dx%d)", (long long)g->req.width,
                   (long long)g->req.height, g->kf.path[0], g->kf.sw[0], g->kf.sh[0]);
        }
    }
    if (r->n_refs) { /* the references' paths now (read once the clip's length is known) */
        if (r->n_refs > H3_MAX_REFS)
            H3_FAIL(H3_ERR_INVALID, "%d references; H3 takes at most %d", r->n_refs, H3_MAX_REFS);
        if (r->n_keyframes)
            H3_FAIL(H3_ERR_INVALID, "references (--ref-image/--ref-video/--ref-audio) and keyframes (--first-frame/"
                                    "--last-frame/--keyframe) are the release's two modes (ref2va and fl2va): give "
                                    "one or the other");
        if (r->req.refine_width)
            H3_FAIL(H3_ERR_INVALID, "--refine with references is not supported: leave out --refine");
        for (int k = 0; k < r->n_refs && st == H3_OK; k++) st = h3_pathset_input(&paths, "a reference", r->ref[k], 1);
        H3_CHECK(st);
    }
    if (r->audio) { /* read first too: a bad file is the request's, and the clip may take its length */
        if (r->req.refine_width)
            H3_FAIL(H3_ERR_INVALID, "--refine with --audio is not supported: the refine pass samples the audio "
                                    "again; leave out --refine (or --audio)");
        st = h3_pathset_input(&paths, "--audio", r->audio, 1);
        if (st == H3_OK)
            st = h3_sound_read(r->audio, H3_AUDIO_RATE, (int64_t)(H3_MAX_FRAMES / H3_FPS + 1) * H3_AUDIO_RATE,
                               &g->snd);
        if (st != H3_OK && st != H3_ERR_NOMEM && st != H3_ERR_INVALID)
            st = h3_error_wrap(H3_ERR_INVALID, "%s", "the soundtrack (--audio)");
        H3_CHECK(st);
        g->res.soundtrack_s = (double)g->snd.samples / H3_AUDIO_RATE;
        if (!g->req.frames && g->req.seconds == 0) { /* the 17n+5 frames its length holds */
            const int64_t f = (int64_t)floor(((double)g->snd.samples * H3_FPS / H3_AUDIO_RATE - 5) / 17) * 17 + 5;
            if (f < 22)
                H3_FAIL(H3_ERR_INVALID,
                        "the soundtrack %s is %.2f s: too short for a clip (at least 22 frames, 0.92 s); give a "
                        "longer one, or --frames (the rest is then silence)",
                        r->audio, g->res.soundtrack_s);
            g->req.frames = f;
            h3_log(H3_LOG_INFO, "length: %lld frames (%.2f s), from the soundtrack %s (%.2f s)", (long long)f,
                   (double)f / H3_FPS, r->audio, g->res.soundtrack_s);
        }
    }
    h3_request_warnings warn;
    { /* a turbo LoRA's steps and shifts, where the request leaves them (pipeline/turbo.h) */
        h3_request_warnings tw;
        tw.n = 0;
        const h3_turbo_preset *tp = h3_turbo_apply(r->lora, r->n_loras, &g->req, &tw);
        if (tp)
            h3_log(H3_LOG_INFO, "LoRA preset: %s: %d model calls at shift %g:%g (euler on the h3 schedule)",
                   tp->name, g->req.steps, g->req.shift_video, g->req.shift_audio != 0.0 ? g->req.shift_audio : H3_SHIFT_AUDIO);
        for (int i = 0; i < tw.n; i++) h3_log(H3_LOG_WARN, "%s", tw.msg[i]);
    }
    H3_CHECK(h3_request_resolve(&g->req, &warn));
    H3_CHECK(h3_windows_make(g->req.frames, g->req.window, g->req.overlap, &g->win));
    if (g->win.n > 1) { /* a long clip: overlapping windows, fused at every step (pipeline/window.h) */
        h3_log(H3_LOG_INFO,
               "long clip: %lld frames (%.2f s) in %d overlapping windows of %lld frames (%.2f s), neighbours "
               "overlapping by at least %lld frames; each step runs the DiT on every window",
               (long long)g->req.frames, (double)g->req.frames / H3_FPS, g->win.n, (long long)g->req.window,
               (double)g->req.window / H3_FPS, (long long)g->req.overlap);
    }
    g->res.windows = g->win.n;
    H3_CHECK(resolve_prompts(g));
    if (g->kf.n) H3_CHECK(h3_keyframes_fit(&g->kf, g->req.width, g->req.height, g->req.frames));
    if (r->n_refs) { /* read and normalized for this clip; a file that cannot be is the request's (exit 2) */
        if (g->win.n > 1)
            H3_FAIL(H3_ERR_INVALID, "references in a clip of several windows (--window) are not supported: make "
                                    "the clip at most one window long, or leave out the references");
        st = h3_refs_read(r->ref_kind, r->ref, r->n_refs, (double)(g->req.frames + 1) / H3_FPS, &g->refs);
        if (st == H3_OK)
            st = h3_refs_normalize(&g->refs, g->req.frames, r->ref_image_short ? r->ref_image_short : H3_REF_IMAGE_SHORT,
                                   r->ref_video_short ? r->ref_video_short : H3_REF_VIDEO_SHORT, H3_AUDIO_HOP);
        if (st != H3_OK && st != H3_ERR_NOMEM && st != H3_ERR_INVALID) st = h3_error_wrap(H3_ERR_INVALID, "%s", "a reference");
        H3_CHECK(st);
        h3_refs_blocks(&g->refs, g->ref_blocks);
        h3_ref_blocks_rows(g->refs.n, g->ref_blocks, &g->ref_nv, &g->ref_na);
        g->res.references = g->refs.n;
        for (int k = 0; k < g->refs.n; k++) {
            const h3_ref *f = &g->refs.r[k];
            if (f->kind == H3_REF_IMAGE)
                h3_log(H3_LOG_INFO, "reference %d: the image %s (%dx%d) at %dx%d", k + 1, f->path, f->sw, f->sh, f->w, f->h);
            else if (f->kind == H3_REF_VIDEO)
                h3_log(H3_LOG_INFO, "reference %d: the video %s (%dx%d, %lld frames at %.3g fps) as %lld frames at 24 "
                       "fps, %dx%d%s%s", k + 1, f->path, f->sw, f->sh, (long long)f->src_frames, f->src_fps,
                       (long long)f->frames, f->w, f->h, f->samples ? ", with its sound" : "",
                       f->samples ? "" : " (no sound)");
            else
                h3_log(H3_LOG_INFO, "reference %d: the sound %s, its first %.2f s", k + 1, f->path,
                       (double)f->samples / H3_AUDIO_RATE);
        }
        h3_log(H3_LOG_INFO, "references: %lld video rows at t = 0.999 and %lld audio rows held clean before the clip's",
               (long long)g->ref_nv, (long long)g->ref_na);
    }
    if (g->win.n > 1) H3_CHECK(make_contexts(g)); /* the keyframes' frames are the clip's now */
    if (g->snd.samples) {
        const int64_t n = h3_audio_samples(g->req.frames);
        if (g->snd.samples < n)
            h3_log(H3_LOG_WARN, "the soundtrack %s is %.2f s, the clip %.2f s: the rest of the clip is silence",
                   r->audio, g->res.soundtrack_s, (double)n / H3_AUDIO_RATE);
        else if (g->snd.samples > n)
            h3_log(H3_LOG_INFO, "the soundtrack %s is %.2f s: its first %.2f s are the clip's", r->audio,
                   g->res.soundtrack_s, (double)n / H3_AUDIO_RATE);
    }
    g->res.keyframes = g->kf.n;
    for (int i = 0; i < warn.n && !r->small_model; i++) h3_log(H3_LOG_WARN, "%s", warn.msg[i]);
    if (!h3_media_available())
        H3_FAIL(H3_ERR_UNSUPPORTED, "this h3run was built without MP4 output (cmake -DH3_MEDIA=OFF): rebuild "
                                    "it with libav (the default)");
    /* Outputs: regular files in writable folders, an empty or new folder for the frames, no two on one path
     * (the inputs are checked against them once the model's files are found). */
    H3_CHECK(h3_pathset_output(&paths, "--output", r->output, H3_OUT_FILE));
    if (r->wav) H3_CHECK(h3_pathset_output(&paths, "--wav", r->wav, H3_OUT_FILE));
    if (r->latents) H3_CHECK(h3_pathset_output(&paths, "--latents", r->latents, H3_OUT_FILE));
    if (r->memory_trace) H3_CHECK(h3_pathset_output(&paths, "--memory-trace", r->memory_trace, H3_OUT_FILE));
    if (r->dump_dit_inputs)
        H3_CHECK(h3_pathset_output(&paths, "--dump-dit-inputs", r->dump_dit_inputs, H3_OUT_FILE));
    if (r->checkpoint) H3_CHECK(h3_pathset_output(&paths, "--checkpoint", r->checkpoint, H3_OUT_FILE));
    if (r->checkpoint_every < 0 || r->checkpoint_every > H3_MAX_STEPS)
        H3_FAIL(H3_ERR_INVALID, "a checkpoint every %d model calls: give 1 to %d", r->checkpoint_every, H3_MAX_STEPS);
    if (r->png_dir) H3_CHECK(h3_pathset_output(&paths, "--png-dir", r->png_dir, H3_OUT_DIR));
    if (r->sparse_given) { /* the rule's bounds, and only with sparse attention */
        const h3_sparse_rule sp = request_sparse_rule(r);
        H3_CHECK(h3_sparse_rule_fits(&sp, (h3_attn_mode)r->attention));
    }
    if (r->cache_threshold != 0) { /* a bad threshold is the request's, said before anything loads */
        const h3_cache_opts co = {r->cache_threshold, H3_CACHE_START, H3_CACHE_END};
        H3_CHECK(h3_cache_opts_check(&co));
    }
    if (r->threads < 0 || r->threads > H3_MAX_THREADS)
        H3_FAIL(H3_ERR_INVALID, "threads must be 0 (one per CPU) to %d; got %d", H3_MAX_THREADS, r->threads);
    if (r->x264_preset) /* the writer checks the name too, but only after the DiT has run */
        H3_CHECK(h3_mp4_check_preset(r->x264_preset, NULL));
    const int gpus = h3_cuda_device_count();
    h3_device dev = r->device == H3_DEVICE_AUTO ? (gpus > 0 ? H3_DEVICE_CUDA : H3_DEVICE_CPU) : r->device;
    if (dev == H3_DEVICE_CUDA && gpus == 0)
        H3_FAIL(H3_ERR_INVALID, "--device cuda: %s; use --device cpu",
                h3_cuda_compiled() ? "no CUDA GPU is visible on this machine"
                                   : "this build of h3run has no CUDA backend");
    if ((unsigned)dev > H3_DEVICE_CUDA) H3_FAIL(H3_ERR_INVALID, "unknown device %d", (int)r->device);
    g->res.device = dev;
    if (r->vram_budget < 0 || r->ram_budget < -1)
        H3_FAIL(H3_ERR_INVALID, "a memory budget must be positive (or 0 for the default); got %lld",
                (long long)(r->vram_budget < 0 ? r->vram_budget : r->ram_budget));
    if (r->gpus < 0 || r->gpus > H3_PLAN_MAX_GPUS)
        H3_FAIL(H3_ERR_INVALID, "--gpus: 1 to %d GPUs; got %d", H3_PLAN_MAX_GPUS, r->gpus);
    if (r->gpus > 1 && dev != H3_DEVICE_CUDA)
        H3_FAIL(H3_ERR_INVALID, "--gpus %d splits the DiT over GPUs: it needs --device cuda", r->gpus);
    if (r->gpus > gpus && dev == H3_DEVICE_CUDA && !h3_dit_group_one_gpu())
        H3_FAIL(H3_ERR_INVALID, "--gpus %d: this machine has %d GPU%s", r->gpus, gpus, gpus == 1 ? "" : "s");
    if (dev == H3_DEVICE_CPU && (r->vram_budget || r->memory_trace))
        h3_log(H3_LOG_WARN, "--vram-budget and --memory-trace plan the GPU's memory; the DiT runs on the CPU "
                            "here, so they are ignored");

    /* The model: every component found, its headers readable, the parts fitting together. */
    H3_CHECK(find_files(g));
    /* No output may replace a file the run reads (a weight shard, the tokenizer, a config). */
    {
        const char *opt[6] = {"--model",     "--dit",       "--text-encoder",
                              "--tokenizer", "--video-vae", "--audio-vae"};
        const char *in[6] = {r->model,           g->files.dit,       g->files.text_encoder,
                             g->files.tokenizer, g->files.video_vae, g->files.audio_vae};
        for (int i = 0; i < 6; i++) H3_CHECK(h3_pathset_input(&paths, opt[i], in[i], 0));
    }
    g->model_phase = 1;
    if (g->use_models) { /* the session's executor, made again for another thread count */
        h3_session *s = g->ses;
        if (s->have_ex && s->ex_threads != r->threads) {
            h3_session_release_device(s, 1);
            h3_exec_free(&s->ex);
            s->have_ex = 0;
        }
        if (!s->have_ex) {
            H3_CHECK(h3_exec_init(&s->ex, r->threads));
            s->have_ex = 1;
            s->ex_threads = r->threads;
        }
        g->ex = &s->ex;
    } else {
        H3_CHECK(h3_exec_init(&g->own_ex, r->threads));
        g->have_ex = 1;
        g->ex = &g->own_ex;
    }
    int64_t te_vocab = 0, te_positions = 0;
    if (g->ses && g->ses->preflight_ok) {
        te_vocab = g->ses->te_vocab;
        te_positions = g->ses->te_positions;
        g->res.reused |= H3_REUSED_FILES;
    } else {
        H3_CHECK(preflight(g, &te_vocab, &te_positions));
        if (g->ses) {
            g->ses->te_vocab = te_vocab;
            g->ses->te_positions = te_positions;
            g->ses->preflight_ok = 1;
        }
    }
    if (g->ses && g->ses->tok) {
        tok = g->ses->tok;
        g->res.reused |= H3_REUSED_TOKENIZER;
    } else {
        st = h3_tokenizer_load(g->files.tokenizer, &tok);
    }
    if (st != H3_OK) {
        st = h3_error_wrap(
            st,
            "the tokenizer %s cannot be read (replace it with the release's tokenizer/ folder or "
            "give --tokenizer PATH)",
            g->files.tokenizer);
        goto done;
    }
    if (g->ses) g->ses->tok = tok; /* kept; the session frees it */
    if (h3_tokenizer_token_id(tok, "<d>") < 0 && !(g->res.reused & H3_REUSED_TOKENIZER))
        h3_log(H3_LOG_WARN,
               "the tokenizer %s lacks H3's added tokens (<d>, </d>, <|cutoff|>, ...): they will be "
               "split as text; the release's tokenizer/ has them",
               g->files.tokenizer);
    h3_log(H3_LOG_INFO,
           "request: %lld frames (%.2f s) at %lldx%lld, %d steps (model calls) of %s on the %s "
           "schedule, seed %llu; %s",
           (long long)g->req.frames, (double)g->req.frames / H3_FPS, (long long)g->req.width,
           (long long)g->req.height, g->req.steps, h3_sampler_name(g->req.sampler),
           h3_scheduler_name(g->req.scheduler), (unsigned long long)g->req.seed,
           dev == H3_DEVICE_CUDA ? "the DiT on the GPU, the other stages where the plan puts them"
                                 : "every stage on the CPU");
    H3_CHECK(check_stop(g));

    /* The stages, one after the other, each with its own weights. */
    H3_CHECK(run_tokenize(g, tok, te_vocab, te_positions, &ids, &n_ids));
    int64_t n_max = n_ids; /* the longest prompt sizes the DiT's sequence */
    for (int i = 1; i < g->n_prompts; i++) { /* a long clip's later prompts */
        const int64_t t0n = g->res.text_tokens;
        g->req.prompt = g->prompt[i];
        st = run_tokenize(g, tok, te_vocab, te_positions, &g->p_ids[i], &g->p_n[i]);
        g->req.prompt = g->prompt[0];
        g->res.text_tokens = t0n;
        H3_CHECK_CTX(st, "prompt %d", i + 1);
        if (g->p_n[i] > n_max) n_max = g->p_n[i];
    }
    if (g->win.n > 1) {
        H3_CHECK(present_contexts(g, tok, te_positions, &ids, &n_ids, &n_max));
    } else {
        H3_CHECK(present_keyframes(g, tok, te_positions, &ids, &n_ids));
        H3_CHECK(present_refs(g, tok, te_positions, &ids, &n_ids));
        if (n_ids > n_max) n_max = n_ids;
    }
    if (!g->ses) h3_tokenizer_free(tok);
    tok = NULL;
    if (g->ses_locked) { /* what a check shares is no longer needed */
        pthread_mutex_unlock(&g->ses->lock);
        g->ses_locked = 0;
    }
    H3_CHECK(make_schedule(g));
    if (dev == H3_DEVICE_CUDA)
        H3_CHECK(plan_run(g, n_max)); /* every stage, before the text encoder loads */
    else
        H3_CHECK(check_cpu_dit(g, n_max));
    if (check_only) goto done;
    H3_CHECK(check_stop(g));
    H3_CHECK(settle_device(g, dev));
    H3_CHECK(run_text(g, ids, n_ids, &g->kf_pixels, g->kf_grid, g->kf_n_img, &hidden));
    for (int c = 1; c < g->n_ctx; c++) { /* a long clip's other contexts */
        wctx *x = &g->ctx[c];
        g->req.prompt = g->prompt[x->prompt];
        st = run_text(g, x->ids, x->n, &x->pixels, x->grid, x->n_img, &x->hidden);
        g->req.prompt = g->prompt[0];
        H3_CHECK_CTX(st, "prompt %d", x->prompt + 1);
    }
    g->text_ids = ids; /* freed at the end */
    h3_vision_close(g->vis); /* the prompt is encoded: the tower and its text encoder go */
    g->vis = NULL;
    if (!g->kf_te_borrowed) h3_text_encoder_close(g->kf_te);
    g->kf_te = NULL;
    H3_CHECK(check_stop(g));
    H3_CHECK(run_keyframes(g));
    H3_CHECK(run_refs(g));
    H3_CHECK(context_rows(g));
    H3_CHECK(check_stop(g));
    H3_CHECK(run_soundtrack(g));
    H3_CHECK(check_stop(g));
    H3_CHECK(run_dit(g, &hidden, &video_lat, &audio_lat));
    h3_tensor_free(&hidden);
    H3_CHECK(check_stop(g));
    H3_CHECK(run_audio(g, &audio_lat, &wave));
    H3_CHECK(check_stop(g));

    /* The render size (the last pass's canvas) and the delivery size the frames are scaled to on their way
     * out */
    const int rw = (int)(g->req.refine_width ? g->req.refine_width : g->req.width),
              rh = (int)(g->req.refine_width ? g->req.refine_height : g->req.height);
    const int ow = g->req.out_width ? (int)g->req.out_width : rw,
              oh = g->req.out_width ? (int)g->req.out_height : rh;
    g->res.render_width = rw;
    g->res.render_height = rh;
    g->res.out_width = ow;
    g->res.out_height = oh;
    if (ow != rw || oh != rh) {
        h3_log(H3_LOG_INFO, "delivery: the %dx%d render scaled to %dx%d (Lanczos) on its way to the %s", rw,
               rh, ow, oh, r->png_dir ? "MP4 and the PNG frames" : "MP4");
        const double ar = (double)rw / rh, ao = (double)ow / oh;
        if (fabs(ao / ar - 1.0) > 0.01)
            h3_log(H3_LOG_WARN,
                   "--output-size %dx%d has another aspect ratio than the %dx%d render (%.3f vs %.3f): the "
                   "frames are stretched to it, not cropped",
                   ow, oh, rw, rh, ao, ar);
    }
    h3_mp4_opts mo;
    h3_mp4_opts_default(&mo, ow, oh);
    mo.src_width = rw;
    mo.src_height = rh;
    if (r->x264_preset) mo.preset = r->x264_preset;
    /* Every output waits under its temporary name until all are written; then they appear together. */
    h3_outgroup_begin(&g->outs);
    g->outs_open = 1;
    H3_CHECK(h3_mp4_open(r->output, &mo, &g->mp4));
    const float *wl = wave.data;
    H3_CHECK(h3_mp4_write_audio(g->mp4, wl, wl + g->res.audio_samples, g->res.audio_samples));
    if (r->png_dir) {
        H3_CHECK(h3_png_seq_open_scaled(r->png_dir, rw, rh, ow, oh, &g->png));
        g->png_open = 1;
    }
    H3_CHECK(run_video(g, &video_lat));

    stage_begin(g, H3_GEN_MUX, 0);
    H3_CHECK(check_stop(g));
    h3_mp4 *m = g->mp4;
    g->mp4 = NULL;
    H3_CHECK(h3_mp4_finish(m));
    if (r->png_dir) {
        g->png_open = 0;
        H3_CHECK(h3_png_seq_finish(&g->png));
    }
    if (r->wav)
        H3_CHECK(h3_wav_write(r->wav, wl, wl + g->res.audio_samples, g->res.audio_samples, 2, H3_AUDIO_RATE));
    if (r->latents) H3_CHECK(write_latents(g, &video_lat, &audio_lat));
    H3_CHECK(check_stop(g));
    g->outs_open = 0;
    H3_CHECK(h3_outgroup_commit(&g->outs));
    if (r->checkpoint) unlink(r->checkpoint); /* the run is done: nothing to resume */
    stage_end(g);
    h3_progress_done(&g->prog);
done:
    if (st != H3_OK) {
        /* Errors in a stage that are the model's, not the request's, must not read as a bad request. */
        if (st == H3_ERR_INVALID && g->model_phase) st = h3_error_wrap(H3_ERR_FORMAT, "%s", "the model");
        /* A stop seen deep inside a stage (an op, a kernel) reads as one seen between steps. */
        if (st == H3_ERR_INTERRUPTED) st = interrupted(g);
        remove_outputs(g);
    }
    h3_dit_group_stop(g->group); /* a run that ended before its video decode */
    if (g->ses_locked) pthread_mutex_unlock(&g->ses->lock);
    h3_pathset_free(&paths);
    if (!g->ses) h3_tokenizer_free(tok);
    h3_free(ids);
    if (!g->dit_borrowed) h3_dit_close(g->dit);
    h3_lora_free(&g->lora);
    h3_free(g->plan);
    h3_free(g->uniq_t);
    h3_free(g->uniq_r);
    h3_vision_close(g->vis);
    if (!g->kf_te_borrowed) h3_text_encoder_close(g->kf_te);
    h3_keyframes_free(&g->kf);
    h3_windows_free(&g->win);
    h3_free(g->prompt_of);
    for (int i = 1; i < H3_MAX_PROMPTS; i++) h3_free(g->p_ids[i]);
    free_contexts(g);
    h3_sound_free(&g->snd);
    h3_refs_free(&g->refs);
    h3_free(g->ref_vrows);
    h3_free(g->ref_arows);
    h3_free(g->ref_clean);
    h3_free(g->snd_rows);
    h3_free(g->text_tags);
    h3_free(g->kf_grid);
    h3_free(g->kf_rows);
    h3_tensor_free(&g->kf_pixels);
    h3_tensor_free(&g->kf_clean);
    h3_schedule_free(&g->sch);
    h3_tensor_free(&hidden);
    h3_tensor_free(&video_lat);
    h3_tensor_free(&audio_lat);
    h3_tensor_free(&wave);
    if (g->cuda_on) h3_cuda_shutdown(&g->own_ex); /* once, after every stage gave its memory back */
    if (g->have_ex) h3_exec_free(&g->own_ex);
    if (g->use_models && (st == H3_ERR_DEVICE || st == H3_ERR_NOMEM || st == H3_ERR_BUDGET))
        h3_session_release_device(g->ses, st == H3_ERR_DEVICE); /* memory in doubt: nothing kept; a backend
                                                                  * that failed goes too */
    h3_mem_stats ms;
    h3_mem_get_stats(&ms);
    g->res.req = g->req;
    g->res.total_s = now_s() - t0;
    g->res.peak_host_bytes = ms.total_peak;
    if (out) *out = g->res;
    if (!g->files_borrowed) h3_model_files_free(&g->files);
    if (g->use_models) pthread_mutex_unlock(&g->ses->run_lock);
    h3_free(g);
    return st;
}

h3_status h3_generate(const h3_generate_request *r, const h3_generate_callbacks *cb,
                      h3_generate_result *out) {
    return run(r, cb, out, 0);
}

h3_status h3_generate_check(const h3_generate_request *r, h3_generate_result *out) {
    return run(r, NULL, out, 1);
}

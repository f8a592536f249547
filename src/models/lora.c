/* LoRA files read and normalized onto the DiT's weights (lora.h). The applying half is in lora_apply.c. */
#include "models/lora.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/log.h"
#include "io/safetensors.h"
#include "models/dit_internal.h"

h3_status h3_lora_mode_parse(const char *s, h3_lora_mode *out) {
    if (s && !strcmp(s, "auto"))
        *out = H3_LORA_AUTO;
    else if (s && !strcmp(s, "merge"))
        *out = H3_LORA_MERGE;
    else if (s && !strcmp(s, "side"))
        *out = H3_LORA_SIDE;
    else
        return H3_ERR(H3_ERR_INVALID, "--lora-mode must be auto, merge or side; got '%s'", s ? s : "");
    return H3_OK;
}

/* ---- keys ---------------------------------------------------------------------------------------------- */

enum { K_A = 0, K_B, K_ALPHA };

/* One tensor of the file: its module (official or diffusers dotted name, prefixes removed) and what it is. */
typedef struct lkey {
    char module[160];
    int kind;
    const h3_st_entry *e;
} lkey;

static const struct {
    const char *suffix;
    int kind;
    int peft_default;
} SUFFIXES[] = {
    {".lora_A.default.weight", K_A, 1},
    {".lora_B.default.weight", K_B, 1},
    {".lora_down.weight", K_A, 0},
    {".lora_up.weight", K_B, 0},
    {".lora_A.weight", K_A, 0},
    {".lora_B.weight", K_B, 0},
    {".lora.down.weight", K_A, 0},
    {".lora.up.weight", K_B, 0},
    {"_lora.down.weight", K_A, 0},
    {"_lora.up.weight", K_B, 0},
    {".lora_linear_layer.down.weight", K_A, 0},
    {".lora_linear_layer.up.weight", K_B, 0},
    {".alpha", K_ALPHA, 0},
};

static int starts(const char *s, const char *p) {
    return strncmp(s, p, strlen(p)) == 0;
}

/* Reads a block index: 1 to 9 digits, then `sep`. Returns the rest after sep, or NULL. */
static const char *block_index(const char *s, char sep, int *idx) {
    int n = 0;
    long v = 0;
    while (s[n] >= '0' && s[n] <= '9' && n < 9) v = v * 10 + (s[n++] - '0');
    if (n == 0 || s[n] != sep) return NULL;
    *idx = (int)v;
    return s + n + 1;
}

/* musubi-tuner's (kohya's, ComfyUI's) flattened module name -> the official dotted one; 0 when it is none of
 * H3's modules (matched against the whole vocabulary, as H3's own names hold underscores). */
static int unflatten(const char *flat, char *out, size_t n) {
    static const char *const unit_parts[][2] = {
        {"attn_qkv_proj", "attn.qkv_proj"},
        {"attn_out_proj", "attn.out_proj"},
        {"mlp_fc1", "mlp.fc1"},
        {"mlp_fc2", "mlp.fc2"},
        {"adaln_proj_linear", "adaln_proj.linear"},
    };
    static const char *const globals[][2] = {
        {"video_patch_proj", "video_patch_proj"},
        {"audio_patch_proj", "audio_patch_proj"},
        {"condition_proj", "condition_proj"},
        {"time_embedder_proj_in", "time_embedder.proj_in"},
        {"time_embedder_proj_out", "time_embedder.proj_out"},
        {"final_layer_adaln_proj_linear", "final_layer.adaln_proj.linear"},
        {"final_layer_video_out", "final_layer.video_out"},
        {"final_layer_audio_out", "final_layer.audio_out"},
    };
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (!strcmp(flat, globals[i][0])) return snprintf(out, n, "%s", globals[i][1]) < (int)n;
    int ref = starts(flat, "token_refiner_blocks_");
    const char *p = ref ? flat + strlen("token_refiner_blocks_") : starts(flat, "blocks_") ? flat + 7 : NULL;
    int idx;
    if (!p || !(p = block_index(p, '_', &idx))) return 0;
    for (size_t i = 0; i < sizeof unit_parts / sizeof unit_parts[0]; i++) {
        if (ref && i == 4) continue; /* a refiner block has no AdaLN projection */
        if (!strcmp(p, unit_parts[i][0]))
            return snprintf(out, n, "%sblocks.%d.%s", ref ? "token_refiner." : "", idx, unit_parts[i][1]) <
                   (int)n;
    }
    return 0;
}

/* Splits a key into module and kind, removing prefixes and suffixes. Returns 1 on success, 0 when the key is
 * no LoRA factor (the caller refuses it), -1 for a key skipped with a warning (DoRA magnitudes). */
static int parse_key(const char *key, lkey *out, int *peft_default, h3_status *err, const char *path) {
    if (strstr(key, "dora_scale")) return -1;
    size_t len = strlen(key);
    int kind = -1;
    size_t cut = 0;
    for (size_t i = 0; i < sizeof SUFFIXES / sizeof SUFFIXES[0]; i++) {
        size_t sl = strlen(SUFFIXES[i].suffix);
        if (len > sl && !strcmp(key + len - sl, SUFFIXES[i].suffix)) {
            kind = SUFFIXES[i].kind;
            cut = len - sl;
            if (SUFFIXES[i].peft_default) *peft_default = 1;
            break;
        }
    }
    if (kind < 0) return 0;
    char mod[sizeof out->module];
    if (cut >= sizeof mod) return 0;
    memcpy(mod, key, cut);
    mod[cut] = 0;
    const char *m = mod;
    if (starts(m, "transformer_ref.")) {
        *err = H3_ERR(
            H3_ERR_FORMAT,
            "%s: key '%s' is for transformer_ref (the Ref2VA partition), which h3run does not run; use a "
            "LoRA for the t2va transformer",
            path, key);
        return 0;
    }
    static const char *const prefixes[] = {"base_model.model.", "transformer.", "model.diffusion_model.",
                                           "diffusion_model."};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (starts(m, prefixes[i])) m += strlen(prefixes[i]);
    if (starts(m, "lora_unet_")) {
        if (!unflatten(m + strlen("lora_unet_"), out->module, sizeof out->module)) {
            *err =
                H3_ERR(H3_ERR_FORMAT,
                       "%s: key '%s' names no MiniMax-H3 DiT module in the flattened lora_unet_ form (e.g. "
                       "lora_unet_blocks_0_attn_qkv_proj)",
                       path, key);
            return 0;
        }
    } else {
        snprintf(out->module, sizeof out->module, "%s", m);
    }
    out->kind = kind;
    return 1;
}

/* ---- modules ------------------------------------------------------------------------------------------- */

enum { R_QKV = 0, R_Q, R_K, R_V, R_OUT, R_FC1, R_FC2, R_ADALN, R_GLOBAL };

/* A module resolved: which weight of the DiT, and the row order its B is in. */
typedef struct lmod {
    int role;            /* R_* */
    int unit;            /* unit index (R_QKV..R_FC2), block (R_ADALN), global index (R_GLOBAL) */
    int refiner, index;  /* for messages */
    int qkv_interleaved; /* R_QKV: B rows per head [q k v] (DiffSynth) */
    int fc1_gate_first;  /* R_FC1: B rows [gate; value] (official names) or [value; gate] (diffusers) */
} lmod;

static const struct {
    const char *official, *diffusers;
    int g;
} GLOBALS[] = {
    {"video_patch_proj", "proj_in", H3_LS_VIDEO_IN},
    {"audio_patch_proj", "audio_proj_in", H3_LS_AUDIO_IN},
    {"condition_proj", "context_embedder", H3_LS_TEXT_IN},
    {"time_embedder.proj_in", "time_embedder.linear_1", H3_LS_TIME_IN},
    {"time_embedder.proj_out", "time_embedder.linear_2", H3_LS_TIME_OUT},
    {"final_layer.adaln_proj.linear", "norm_out.linear", H3_LS_FINAL_ADALN},
    {"final_layer.video_out", "proj_out", H3_LS_VIDEO_OUT},
    {"final_layer.audio_out", "audio_proj_out", H3_LS_AUDIO_OUT},
};

/* Resolves a module name (official or diffusers). 0 when it names nothing LoRA-able of an H3 DiT. */
static int resolve_module(const char *m, int diffsynth, lmod *out) {
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < sizeof GLOBALS / sizeof GLOBALS[0]; i++)
        if (!strcmp(m, GLOBALS[i].official) || !strcmp(m, GLOBALS[i].diffusers)) {
            out->role = R_GLOBAL;
            out->unit = GLOBALS[i].g;
            return 1;
        }
    const char *p;
    int df;
    if (starts(m, "token_refiner.blocks."))
        p = m + 21, out->refiner = 1, df = 0;
    else if (starts(m, "token_refiner.refiner_blocks."))
        p = m + 29, out->refiner = 1, df = 1;
    else if (starts(m, "blocks."))
        p = m + 7, df = 0;
    else if (starts(m, "transformer_blocks."))
        p = m + 19, df = 1;
    else
        return 0;
    if (!(p = block_index(p, '.', &out->index))) return 0;
    static const struct {
        const char *name;
        int df, role, gate_first;
    } parts[] = {
        {"attn.qkv_proj", 0, R_QKV, 0},
        {"attn.out_proj", 0, R_OUT, 0},
        {"mlp.fc1", 0, R_FC1, 1},
        {"mlp.fc2", 0, R_FC2, 0},
        {"adaln_proj.linear", 0, R_ADALN, 0},
        {"attn.to_q", 1, R_Q, 0},
        {"attn.to_k", 1, R_K, 0},
        {"attn.to_v", 1, R_V, 0},
        {"attn.to_out.0", 1, R_OUT, 0},
        {"ff.net.0.proj", 1, R_FC1, 0},
        {"ff.net.2", 1, R_FC2, 0},
        {"adaln_proj.linear", 1, R_ADALN, 0},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (parts[i].df != df || strcmp(p, parts[i].name)) continue;
        if (out->refiner && parts[i].role == R_ADALN) return 0;
        out->role = parts[i].role;
        out->fc1_gate_first = parts[i].gate_first;
        out->qkv_interleaved = parts[i].role == R_QKV && diffsynth;
        return 1;
    }
    return 0;
}

/* ---- the DiT's side: the weight a module modifies ------------------------------------------------------ */

typedef struct dtarget {
    int slot;
    const h3_tensor *w;
    char name[128];
} dtarget;

static const char *unit_name(const h3_dit *d, int refiner, int i, const char *suffix_off,
                             const char *suffix_df, char *buf, size_t n) {
    int df = d->layout == H3_LAYOUT_DIFFUSERS;
    snprintf(buf, n,
             df ? (refiner ? "token_refiner.refiner_blocks.%d.%s" : "transformer_blocks.%d.%s")
                : (refiner ? "token_refiner.blocks.%d.%s" : "blocks.%d.%s"),
             i, df ? suffix_df : suffix_off);
    return buf;
}

/* The DiT weight of role for unit u (R_QKV, R_Q, R_K, R_V: as the DiT holds QKV). */
static void unit_target(const h3_dit *d, int u, int role, dtarget *t) {
    const h3_dit_config *c = &d->cfg;
    int ref = u < c->n_refiner_layers, i = ref ? u : u - (int)c->n_refiner_layers;
    const h3_dit_block_weights *w = &d->units[u];
    static const char *const off[] = {
        "attn.qkv_proj.weight", NULL, NULL, NULL, "attn.out_proj.weight", "mlp.fc1.weight", "mlp.fc2.weight"};
    static const char *const dfn[] = {NULL,
                                      "attn.to_q.weight",
                                      "attn.to_k.weight",
                                      "attn.to_v.weight",
                                      "attn.to_out.0.weight",
                                      "ff.net.0.proj.weight",
                                      "ff.net.2.weight"};
    const h3_tensor *ts[] = {&w->qkv, &w->q, &w->k, &w->v, &w->out, &w->fc1, &w->fc2};
    t->slot = h3_lora_slot_unit(c, u, role);
    t->w = ts[role];
    unit_name(d, ref, i, off[role] ? off[role] : "", dfn[role] ? dfn[role] : "", t->name, sizeof t->name);
}

static void global_target(const h3_dit *d, int g, dtarget *t) {
    const h3_dit_globals *G = &d->g;
    const h3_tensor *ts[] = {&G->video_in_w, &G->audio_in_w,    &G->text_in_w,   &G->time_in_w,
                             &G->time_out_w, &G->final_adaln_w, &G->video_out_w, &G->audio_out_w};
    int df = d->layout == H3_LAYOUT_DIFFUSERS;
    t->slot = h3_lora_slot_global(&d->cfg, g);
    t->w = ts[g];
    snprintf(t->name, sizeof t->name, "%s.weight", df ? GLOBALS[g].diffusers : GLOBALS[g].official);
}

/* ---- the factor list ----------------------------------------------------------------------------------- */

static void factor_free(h3_lora_factor *f) {
    h3_free(f->a);
    h3_free(f->b);
}

h3_status h3_lora_read(h3_lora *l, const h3_dit *dit, int n, const char *const *paths, const float *strengths) {
    h3_lora_free(l);
    for (int i = 0; i < n; i++) {
        const h3_status st = h3_lora_add_file(l, dit, paths[i], strengths[i]);
        if (st != H3_OK) {
            h3_lora_free(l);
            return st;
        }
    }
    return H3_OK;
}

void h3_lora_free(h3_lora *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) {
        for (int j = 0; j < l->t[i].n; j++) factor_free(&l->t[i].f[j]);
        h3_free(l->t[i].f);
    }
    h3_free(l->t);
    h3_free(l->slot_target);
    memset(l, 0, sizeof *l);
}

int64_t h3_lora_bytes(const h3_lora *l) {
    return l->factor_elems * (int64_t)sizeof(float);
}

const char *h3_lora_describe(const h3_lora *l, char *buf, size_t n) {
    int64_t rmin = 0, rmax = 0;
    for (int i = 0; i < l->n; i++)
        for (int j = 0; j < l->t[i].n; j++) {
            int64_t r = l->t[i].f[j].rank;
            if (!rmin || r < rmin) rmin = r;
            if (r > rmax) rmax = r;
        }
    snprintf(buf, n, "%d LoRA file%s, %d weights, rank %lld..%lld, %.2f MB of factors", l->n_files,
             l->n_files == 1 ? "" : "s", l->n, (long long)rmin, (long long)rmax,
             (double)h3_lora_bytes(l) / 1e6);
    return buf;
}

/* Adds a factor (taking a and b) to the target of t, creating it. */
static h3_status push_factor(h3_lora *l, const dtarget *t, int64_t in, int64_t out, h3_lora_factor *f) {
    int ti = l->slot_target[t->slot];
    if (ti < 0) {
        if (l->n == l->cap) {
            int cap = l->cap ? 2 * l->cap : 64;
            h3_lora_target *nt = h3_realloc(l->t, (size_t)cap * sizeof *nt, H3_MEM_WEIGHTS);
            if (!nt) return H3_ERR(H3_ERR_NOMEM, "out of memory reading a LoRA");
            l->t = nt;
            l->cap = cap;
        }
        ti = l->n++;
        h3_lora_target *nt = &l->t[ti];
        memset(nt, 0, sizeof *nt);
        nt->slot = t->slot;
        snprintf(nt->name, sizeof nt->name, "%s", t->name);
        nt->in = in;
        nt->out = out;
        l->slot_target[t->slot] = ti;
    }
    h3_lora_target *tg = &l->t[ti];
    h3_lora_factor *nf = h3_realloc(tg->f, (size_t)(tg->n + 1) * sizeof *nf, H3_MEM_WEIGHTS);
    if (!nf) return H3_ERR(H3_ERR_NOMEM, "out of memory reading a LoRA");
    tg->f = nf;
    tg->f[tg->n++] = *f;
    l->factor_elems += f->rank * (in + out);
    memset(f, 0, sizeof *f);
    return H3_OK;
}

/* ---- row orders ---------------------------------------------------------------------------------------- */

/* dst row j·inner + h·hd + e (contiguous) <- src row h·3·hd + j·hd + e (per head), or the reverse. */
static void qkv_rows(float *dst, const float *src, int64_t heads, int64_t hd, int64_t r, int to_contiguous) {
    const int64_t inner = heads * hd;
    for (int64_t j = 0; j < 3; j++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t e = 0; e < hd; e++) {
                int64_t c = j * inner + h * hd + e, p = h * 3 * hd + j * hd + e;
                memcpy(dst + (to_contiguous ? c : p) * r, src + (to_contiguous ? p : c) * r,
                       (size_t)r * sizeof(float));
            }
}

/* ---- one module ---------------------------------------------------------------------------------------- */

typedef struct lctx {
    h3_lora *l;
    const h3_dit *d;
    h3_st_set *set;
    const char *path;
    float strength;
    int have_alpha_tensors;
    double meta_alpha; /* NAN: none */
    int file;
} lctx;

static h3_status load_f32(lctx *c, const h3_st_entry *e, float **out) {
    *out = NULL;
    if (e->dtype != H3_F32 && e->dtype != H3_BF16 && e->dtype != H3_F16)
        return H3_ERR(H3_ERR_FORMAT, "%s: '%s' has dtype %s; LoRA factors are f32, bf16 or f16", c->path,
                      e->name, h3_dtype_name(e->dtype));
    h3_tensor t;
    H3_TRY(h3_st_load(c->set, e->name, H3_PLACE_HOST, H3_F32, H3_MEM_WEIGHTS, &t));
    int64_t n = h3_st_entry_numel(e);
    float *p = h3_malloc((size_t)(n ? n : 1) * sizeof(float), H3_MEM_WEIGHTS);
    if (!p) {
        h3_tensor_free(&t);
        return H3_ERR(H3_ERR_NOMEM, "out of memory reading %s", c->path);
    }
    memcpy(p, t.data, (size_t)n * sizeof(float));
    h3_tensor_free(&t);
    *out = p;
    return H3_OK;
}

static const char *mod_words(const lmod *m, char *buf, size_t n) {
    static const char *const roles[] = {"fused QKV",      "q",   "k",   "v",
                                        "out projection", "fc1", "fc2", "AdaLN projection"};
    if (m->role == R_GLOBAL)
        snprintf(buf, n, "%s", GLOBALS[m->unit].official);
    else
        snprintf(buf, n, "%s %d's %s", m->refiner ? "token-refiner block" : "DiT block", m->index,
                 roles[m->role]);
    return buf;
}

/* Checks and adds one module's pair. a/b/alpha: its entries (any may be NULL). */
static h3_status add_module(lctx *c, const char *module, const lmod *m, const h3_st_entry *ea,
                            const h3_st_entry *eb, const h3_st_entry *ealpha) {
    const h3_dit *d = c->d;
    const h3_dit_config *cfg = &d->cfg;
    char words[96];
    mod_words(m, words, sizeof words);
    if (!ea || !eb)
        return H3_ERR(
            H3_ERR_FORMAT,
            "%s: module '%s' has %s but no %s factor; a LoRA needs both A (lora_A / lora_down, [rank, in]) "
            "and B (lora_B / lora_up, [out, rank])",
            c->path, module,
            ea   ? "an A"
            : eb ? "a B"
                 : "an alpha",
            ea ? "B" : "A");
    if (ea->ndim != 2 || eb->ndim != 2)
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: '%s' factors must be 2-D (A [rank, in], B [out, rank]); got %d-D and %d-D",
                      c->path, module, ea->ndim, eb->ndim);
    const int64_t r = ea->shape[0], in = ea->shape[1], out = eb->shape[0];
    if (r == 0 || eb->shape[1] == 0)
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: '%s' has rank 0 (A [%lld, %lld], B [%lld, %lld]); remove the module or "
                      "give it a rank of at least 1",
                      c->path, module, (long long)ea->shape[0], (long long)ea->shape[1],
                      (long long)eb->shape[0], (long long)eb->shape[1]);
    if (eb->shape[1] != r)
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: '%s' has A [%lld, %lld] and B [%lld, %lld]: B's columns must equal A's rank",
                      c->path, module, (long long)r, (long long)in, (long long)out, (long long)eb->shape[1]);
    /* the scale */
    double alpha = NAN;
    if (ealpha) {
        if (h3_st_entry_numel(ealpha) != 1)
            return H3_ERR(H3_ERR_FORMAT, "%s: '%s' must hold one number; it has %lld", c->path, ealpha->name,
                          (long long)h3_st_entry_numel(ealpha));
        h3_tensor t;
        if (ealpha->dtype != H3_F32 && ealpha->dtype != H3_BF16 && ealpha->dtype != H3_F16 &&
            ealpha->dtype != H3_F64)
            return H3_ERR(H3_ERR_FORMAT, "%s: '%s' has dtype %s; an alpha is a float", c->path, ealpha->name,
                          h3_dtype_name(ealpha->dtype));
        H3_TRY(h3_st_load(c->set, ealpha->name, H3_PLACE_HOST, H3_F32, H3_MEM_IO, &t));
        alpha = *(const float *)t.data;
        h3_tensor_free(&t);
        if (!isfinite(alpha))
            return H3_ERR(H3_ERR_FORMAT, "%s: '%s' is %g; an alpha must be a finite number", c->path,
                          ealpha->name, alpha);
    } else if (!c->have_alpha_tensors && !isnan(c->meta_alpha)) {
        alpha = c->meta_alpha;
    }
    const float scale = (float)(isnan(alpha) ? (double)c->strength : (double)c->strength * alpha / (double)r);

    /* the weight it modifies, and the rows it gives */
    const int64_t H = cfg->hidden, inner = h3_dit_inner(cfg), U = h3_dit_n_units(cfg);
    int unit = 0;
    if (m->role <= R_FC2) {
        int64_t nb = m->refiner ? cfg->n_refiner_layers : cfg->n_layers;
        if (m->index >= nb)
            return H3_ERR(
                H3_ERR_FORMAT,
                "%s: '%s' is for %s; this DiT has %lld %s: the LoRA was made for a deeper model (use one "
                "made for this DiT)",
                c->path, module, words, (long long)nb, m->refiner ? "token-refiner blocks" : "DiT blocks");
        unit = m->refiner ? m->index : (int)cfg->n_refiner_layers + m->index;
    } else if (m->role == R_ADALN && m->index >= cfg->n_layers) {
        return H3_ERR(H3_ERR_FORMAT, "%s: '%s' is for %s; this DiT has %lld DiT blocks", c->path, module,
                      words, (long long)cfg->n_layers);
    }
    (void)U;
    dtarget t;
    int64_t want_out = 0, want_in = 0;
    if (m->role == R_GLOBAL) {
        global_target(d, m->unit, &t);
    } else if (m->role == R_ADALN) {
        t.slot = h3_lora_slot_adaln(cfg, m->index);
        t.w = &d->adaln_w[m->index];
        snprintf(t.name, sizeof t.name, "%s.%d.adaln_proj.linear.weight",
                 d->layout == H3_LAYOUT_DIFFUSERS ? "transformer_blocks" : "blocks", m->index);
    } else {
        int role = m->role == R_QKV || m->role == R_Q || m->role == R_K || m->role == R_V
                       ? (d->units[unit].qkv.data ? H3_LS_QKV : (m->role == R_QKV ? H3_LS_Q : m->role))
                       : m->role;
        unit_target(d, unit, role, &t);
    }
    if (!t.w->data)
        return H3_ERR(
            H3_ERR_FORMAT,
            "%s: '%s' is for %s, which this DiT does not have (%s); use a LoRA made for this DiT or "
            "remove the module",
            c->path, module, words,
            cfg->adaln_pruned ? "its AdaLN is the pruned curve form" : "not in the file");
    want_out = t.w->shape[0];
    want_in = t.w->shape[1];
    /* the factor's rows as this module gives them */
    int64_t mod_out = want_out;
    if (m->role == R_QKV) mod_out = 3 * inner;
    if (m->role == R_Q || m->role == R_K || m->role == R_V) mod_out = inner;
    if (in != want_in || out != mod_out ||
        (m->role == R_QKV && t.w == &d->units[unit].qkv && want_out != 3 * inner))
        return H3_ERR(
            H3_ERR_FORMAT,
            "%s: '%s' has A [%lld, %lld] and B [%lld, %lld]; this DiT's %s ('%s') needs A [rank, %lld] and "
            "B [%lld, rank] (hidden %lld, FFN %lld, %lld heads x %lld%s): the LoRA was made for a different "
            "DiT",
            c->path, module, (long long)r, (long long)in, (long long)out, (long long)r, words, t.name,
            (long long)want_in, (long long)mod_out, (long long)H, (long long)cfg->ffn, (long long)cfg->heads,
            (long long)cfg->head_dim, cfg->adaln_pruned ? ", pruned AdaLN" : "");

    h3_status st = H3_OK;
    float *A = NULL, *B = NULL, *tmp = NULL;
    h3_lora_factor f = {0};
    H3_CHECK(load_f32(c, ea, &A));
    H3_CHECK(load_f32(c, eb, &B));
    const int64_t heads = cfg->heads, hd = cfg->head_dim;
    if (m->role == R_FC1) {
        const int dit_gate_first = d->units[unit].gate_first;
        if (dit_gate_first != m->fc1_gate_first) { /* swap the halves: a permutation of B's rows */
            const int64_t half = out / 2 * r;
            tmp = h3_malloc((size_t)half * sizeof(float), H3_MEM_WORKSPACE);
            if (!tmp) H3_FAIL(H3_ERR_NOMEM, "out of memory reading %s", c->path);
            memcpy(tmp, B, (size_t)half * sizeof(float));
            memmove(B, B + half, (size_t)half * sizeof(float));
            memcpy(B + half, tmp, (size_t)half * sizeof(float));
        }
    }
    const int dit_fused = m->role >= R_QKV && m->role <= R_V && d->units[unit].qkv.data;
    const int dit_interleaved = dit_fused && d->qkv_interleaved;
    if (m->role == R_QKV && !dit_fused) {
        /* fused factor onto split q, k, v: B in [Q; K; V] order, then its thirds with A shared */
        if (m->qkv_interleaved) {
            tmp = h3_malloc((size_t)(out * r) * sizeof(float), H3_MEM_WORKSPACE);
            if (!tmp) H3_FAIL(H3_ERR_NOMEM, "out of memory reading %s", c->path);
            qkv_rows(tmp, B, heads, hd, r, 1);
            memcpy(B, tmp, (size_t)(out * r) * sizeof(float));
        }
        for (int j = 0; j < 3; j++) {
            dtarget tj;
            unit_target(d, unit, H3_LS_Q + j, &tj);
            f.rank = r;
            f.scale = scale;
            f.file = c->file;
            f.a = h3_malloc((size_t)(r * in) * sizeof(float), H3_MEM_WEIGHTS);
            f.b = h3_malloc((size_t)(inner * r) * sizeof(float), H3_MEM_WEIGHTS);
            if (!f.a || !f.b) H3_FAIL(H3_ERR_NOMEM, "out of memory reading %s", c->path);
            memcpy(f.a, A, (size_t)(r * in) * sizeof(float));
            memcpy(f.b, B + j * inner * r, (size_t)(inner * r) * sizeof(float));
            H3_CHECK(push_factor(c->l, &tj, in, inner, &f));
        }
        goto done;
    }
    if (dit_fused && m->role != R_QKV) {
        /* a split q/k/v factor onto a fused weight: its rows in place, zeros elsewhere, in [Q; K; V] order */
        float *full = h3_calloc((size_t)(3 * inner * r), sizeof(float), H3_MEM_WEIGHTS);
        if (!full) H3_FAIL(H3_ERR_NOMEM, "out of memory reading %s", c->path);
        memcpy(full + (m->role - R_Q) * inner * r, B, (size_t)(inner * r) * sizeof(float));
        h3_free(B);
        B = full;
    }
    if (dit_fused) {
        const int src_interleaved = m->role == R_QKV && m->qkv_interleaved;
        if (src_interleaved != dit_interleaved) {
            h3_free(tmp);
            tmp = h3_malloc((size_t)(3 * inner * r) * sizeof(float), H3_MEM_WORKSPACE);
            if (!tmp) H3_FAIL(H3_ERR_NOMEM, "out of memory reading %s", c->path);
            qkv_rows(tmp, B, heads, hd, r, src_interleaved);
            memcpy(B, tmp, (size_t)(3 * inner * r) * sizeof(float));
        }
    }
    f.rank = r;
    f.scale = scale;
    f.file = c->file;
    f.a = A;
    f.b = B;
    A = B = NULL;
    H3_CHECK(push_factor(c->l, &t, want_in, want_out, &f));
done:
    factor_free(&f);
    h3_free(A);
    h3_free(B);
    h3_free(tmp);
    return st;
}

/* ---- a file -------------------------------------------------------------------------------------------- */

static int cmp_lkey(const void *pa, const void *pb) {
    const lkey *a = pa, *b = pb;
    int c = strcmp(a->module, b->module);
    return c ? c : a->kind - b->kind;
}

/* Removes what the targets gained since the marks (a failed file leaves l as it was). */
static void roll_back(h3_lora *l, int n_targets, int *n_factors, int64_t elems) {
    for (int i = 0; i < l->n; i++) {
        int keep = i < n_targets ? n_factors[i] : 0;
        for (int j = keep; j < l->t[i].n; j++) factor_free(&l->t[i].f[j]);
        l->t[i].n = keep;
        if (i >= n_targets) {
            h3_free(l->t[i].f);
            l->slot_target[l->t[i].slot] = -1;
        }
    }
    l->n = n_targets;
    l->factor_elems = elems;
}

h3_status h3_lora_add_file(h3_lora *l, const h3_dit *d, const char *path, float strength) {
    h3_status st = H3_OK;
    h3_st_set set;
    int have_set = 0;
    lkey *keys = NULL;
    int *marks = NULL;
    const int n_targets = l->n;
    const int64_t elems = l->factor_elems;
    if (!isfinite(strength))
        return H3_ERR(H3_ERR_INVALID, "%s: the LoRA strength must be a finite number", path);
    if (l->n_files >= H3_MAX_LORAS)
        return H3_ERR(H3_ERR_INVALID, "at most %d LoRA files at once; %s is one more", H3_MAX_LORAS, path);
    if (d->units && h3_dit_n_units(&d->cfg) > 0 && d->units[0].fc1.place == H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID,
                      "LoRA %s: read LoRAs for the DiT as opened, before its weights are placed", path);
    {
        int fd;
        uint64_t size;
        H3_TRY(h3_open_input(path, &fd, &size));
        close(fd);
    }
    if (!l->slot_target) {
        l->n_slots = h3_lora_n_slots(&d->cfg);
        l->slot_target = h3_malloc((size_t)(l->n_slots ? l->n_slots : 1) * sizeof(int), H3_MEM_WEIGHTS);
        if (!l->slot_target) return H3_ERR(H3_ERR_NOMEM, "out of memory reading %s", path);
        for (int i = 0; i < l->n_slots; i++) l->slot_target[i] = -1;
    }
    marks = h3_malloc((size_t)(l->n ? l->n : 1) * sizeof(int), H3_MEM_OTHER);
    if (!marks) return H3_ERR(H3_ERR_NOMEM, "out of memory reading %s", path);
    for (int i = 0; i < l->n; i++) marks[i] = l->t[i].n;
    H3_CHECK(h3_st_open(path, &set));
    have_set = 1;
    lctx c = {l, d, &set, path, strength, 0, NAN, l->n_files};
    /* keys */
    keys = h3_calloc((size_t)(set.n_entries ? set.n_entries : 1), sizeof *keys, H3_MEM_OTHER);
    if (!keys) H3_FAIL(H3_ERR_NOMEM, "out of memory reading %s", path);
    int nk = 0, peft_default = 0, skipped = 0, official = 0;
    for (int64_t i = 0; i < set.n_entries; i++) {
        h3_status kerr = H3_OK;
        int r = parse_key(set.entries[i].name, &keys[nk], &peft_default, &kerr, path);
        if (kerr != H3_OK) {
            st = kerr;
            goto done;
        }
        if (r < 0) {
            skipped++;
            continue;
        }
        if (r == 0)
            H3_FAIL(
                H3_ERR_FORMAT,
                "%s: key '%s' is not a LoRA factor (expected <module>.lora_A.weight / .lora_B.weight, "
                ".lora_down.weight / .lora_up.weight or .alpha); is this a LoRA file of a MiniMax-H3 DiT?",
                path, set.entries[i].name);
        keys[nk].e = &set.entries[i];
        if (keys[nk].kind == K_ALPHA) c.have_alpha_tensors = 1;
        if (starts(keys[nk].module, "blocks.") || starts(keys[nk].module, "token_refiner.blocks."))
            official = 1;
        nk++;
    }
    if (skipped)
        H3_WARN("%s: %d DoRA magnitude tensors (dora_scale) ignored, as diffusers does", path, skipped);
    if (nk == 0) H3_FAIL(H3_ERR_FORMAT, "%s: no LoRA factors in the file", path);
    /* DiffSynth-Studio: peft's .default. infix over the official names, fused QKV factors per head */
    const int diffsynth = peft_default && official;
    /* a network alpha recorded in the metadata (diffusers reads `alpha`; kohya records `ss_network_alpha`) */
    const char *ma = h3_st_metadata(&set, "alpha");
    const char *which = "alpha";
    if (!ma) ma = h3_st_metadata(&set, "ss_network_alpha"), which = "ss_network_alpha";
    if (ma && !c.have_alpha_tensors) {
        char *end;
        errno = 0;
        double v = strtod(ma, &end);
        if (end == ma || *end || errno == ERANGE) {
            H3_WARN(
                "%s: __metadata__ %s is '%.40s', not a number; loaded with alpha = rank, as diffusers does",
                path, which, ma);
        } else if (!isfinite(v)) {
            H3_FAIL(H3_ERR_FORMAT, "%s: __metadata__ %s is %s; an alpha must be a finite number", path, which,
                    ma);
        } else {
            c.meta_alpha = v;
        }
    }
    qsort(keys, (size_t)nk, sizeof *keys, cmp_lkey);
    for (int i = 0; i < nk;) {
        int j = i;
        const h3_st_entry *e[3] = {NULL, NULL, NULL};
        for (; j < nk && !strcmp(keys[j].module, keys[i].module); j++) {
            if (e[keys[j].kind])
                H3_FAIL(H3_ERR_FORMAT, "%s: '%s' and '%s' are the same factor of module '%s'; keep one", path,
                        e[keys[j].kind]->name, keys[j].e->name, keys[i].module);
            e[keys[j].kind] = keys[j].e;
        }
        lmod m;
        if (!resolve_module(keys[i].module, diffsynth, &m))
            H3_FAIL(H3_ERR_FORMAT,
                    "%s: key '%s' names no LoRA-able module of a MiniMax-H3 DiT (module '%s'; expected e.g. "
                    "blocks.N.attn.qkv_proj, blocks.N.mlp.fc1 or transformer_blocks.N.attn.to_q)",
                    path, keys[i].e->name, keys[i].module);
        H3_CHECK(add_module(&c, keys[i].module, &m, e[K_A], e[K_B], e[K_ALPHA]));
        i = j;
    }
    l->n_files++;
    l->qkv_interleaved = d->qkv_interleaved;
done:
    if (st != H3_OK) roll_back(l, n_targets, marks, elems);
    h3_free(marks);
    h3_free(keys);
    if (have_set) h3_st_close(&set);
    return st;
}

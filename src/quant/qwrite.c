/* Quantized checkpoints in ComfyUI's format (contract in qwrite.h). */
#include "quant/qwrite.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "base/alloc.h"
#include "base/cancel.h"
#include "base/fs.h"
#include "base/json.h"
#include "base/log.h"
#include "io/safetensors.h"
#include "io/wbind.h"
#include "quant/qload.h"

static const char *const g_target_names[H3_QT_COUNT] = {"default", "int8", "int8_convrot", "fp8", "nvfp4"};

const char *h3_qtarget_name(h3_qtarget t) {
    return (unsigned)t < H3_QT_COUNT ? g_target_names[t] : "?";
}

int h3_qtarget_parse(const char *s, h3_qtarget *out) {
    for (int i = 1; i < H3_QT_COUNT; i++)
        if (!strcmp(s, g_target_names[i])) {
            *out = (h3_qtarget)i;
            return 1;
        }
    return 0;
}

int h3_qtarget_group(int64_t K) {
    for (int g = 256; g >= 4; g /= 4)
        if (K > 0 && K % g == 0) return g;
    return 0;
}

/* ---- one tensor
 * ------------------------------------------------------------------------------------------------ */

typedef struct {
    const float *w;
    int64_t K;
    int group;
    int8_t *q;
    float *scales;
    float scale;
    uint8_t *bytes, *bscales;
    h3_status st;
} qctx;

static void int8_rows(void *p, int64_t b, int64_t e, int tid) {
    (void)tid;
    qctx *c = p;
    h3_status s =
        h3_quantize_int8_rows(c->w + b * c->K, e - b, c->K, c->group, c->q + b * c->K, c->scales + b);
    if (s != H3_OK) c->st = s;
}

static void fp8_rows(void *p, int64_t b, int64_t e, int tid) {
    (void)tid;
    qctx *c = p;
    h3_quantize_fp8(c->w + b * c->K, (size_t)((e - b) * c->K), c->scale, c->bytes + b * c->K);
}

static void nvfp4_rows(void *p, int64_t b, int64_t e, int tid) {
    (void)tid;
    qctx *c = p;
    h3_quantize_nvfp4_rows(c->w, b, e, c->K, c->scale, c->bytes, c->bscales);
}

h3_status h3_quantize_tensor(const float *w, int64_t N, int64_t K, h3_qtarget t, h3_pool *pool,
                             h3_tensor *out) {
    memset(out, 0, sizeof *out);
    int group = t == H3_QT_INT8_CONVROT ? h3_qtarget_group(K) : 0;
    if (t == H3_QT_INT8_CONVROT && !group)
        return H3_ERR(H3_ERR_INVALID, "int8_convrot needs K divisible by 4 (a ConvRot group), got %lld",
                      (long long)K);
    if (t == H3_QT_NVFP4 && K % 16)
        return H3_ERR(H3_ERR_INVALID, "nvfp4 needs K a multiple of 16, got %lld", (long long)K);
    if (t <= H3_QT_DEFAULT || t >= H3_QT_COUNT) return H3_ERR(H3_ERR_INVALID, "no quantization format given");
    size_t data = (size_t)(N * K), extra = 0;
    if (t == H3_QT_NVFP4) {
        data /= 2;
        extra = (size_t)h3_nvfp4_scale_count(N, K);
    } else if (t != H3_QT_FP8) {
        extra = (size_t)N * sizeof(float);
    }
    size_t off = (data + 63) / 64 * 64;
    uint8_t *blk = h3_malloc(off + extra + 1, H3_MEM_WEIGHTS);
    if (!blk) return H3_ERR_NOMEM;
    int64_t shape[2] = {N, K};
    h3_tensor_wrap(out, blk, H3_PLACE_HOST,
                   t == H3_QT_NVFP4 ? H3_U8
                   : t == H3_QT_FP8 ? H3_F8_E4M3
                                    : H3_I8,
                   2, shape);
    out->owner = blk;
    out->owned_bytes = off + extra + 1;
    out->cat = H3_MEM_WEIGHTS;
    qctx c = {w, K, group, (int8_t *)blk, (float *)(blk + off), 0, blk, blk + off, H3_OK};
    int64_t grain = N / 64 + 1;
    switch (t) {
        case H3_QT_INT8:
        case H3_QT_INT8_CONVROT:
            h3_parallel_for(pool, N, grain, int8_rows, &c);
            out->q.mode = H3_SCALE_ROW;
            out->q.scales = c.scales;
            out->q.rot_group = group;
            break;
        case H3_QT_FP8:
            c.scale = h3_quantize_fp8_scale(w, (size_t)(N * K));
            h3_parallel_for(pool, N, grain, fp8_rows, &c);
            out->q.mode = H3_SCALE_TENSOR;
            out->q.scale = c.scale;
            break;
        case H3_QT_NVFP4:
            c.scale = h3_quantize_nvfp4_scale2(w, (size_t)(N * K));
            memset(c.bscales, 0, extra);
            h3_parallel_for(pool, N, grain, nvfp4_rows, &c);
            out->stride[0] = K / 2;
            out->q.mode = H3_SCALE_FORMAT;
            out->q.format = H3_QF_NVFP4;
            out->q.scale = c.scale;
            out->q.fmt_scales = c.bscales;
            break;
        default:
            break;
    }
    if (c.st != H3_OK) {
        h3_tensor_free(out);
        return c.st;
    }
    return H3_OK;
}

/* ---- the plan
 * ------------------------------------------------------------------------------------------------ */

typedef enum { P_COPY, P_QKV_INTERLEAVED, P_CONCAT3, P_SWAP_HALVES, P_INV_FREQ } prod_kind;

typedef struct {
    prod_kind kind;
    const h3_st_entry *src[3];
    int64_t heads, head_dim; /* P_QKV_INTERLEAVED */
    int64_t n;               /* P_INV_FREQ: frequencies */
} producer;

typedef struct {
    char *name;
    h3_dtype dtype;
    int ndim;
    int64_t shape[H3_MAX_DIMS];
    uint64_t nbytes, offset;
    int layer; /* quantized piece of layers[layer], or -1 */
    producer prod;
    char marker[128]; /* a marker's bytes */
} otensor;

typedef struct {
    producer prod;
    int64_t N, K;
    h3_qtarget fmt;
    int ot[4]; /* weight, weight_scale, weight_scale_2, marker (-1 when absent) */
} qlayer;

typedef struct {
    h3_st_set set;
    int have_set;
    h3_detect_info info;
    otensor *ot;
    int n_ot, cap_ot;
    qlayer *ql;
    int n_ql, cap_ql;
    h3_qtarget target;
    int te_layers;
    int64_t kept;
} plan;

static void plan_free(plan *p) {
    for (int i = 0; i < p->n_ot; i++) h3_free(p->ot[i].name);
    h3_free(p->ot);
    h3_free(p->ql);
    if (p->have_set) h3_st_close(&p->set);
    memset(p, 0, sizeof *p);
}

static h3_status add_ot(plan *p, const char *name, h3_dtype dt, int nd, const int64_t *shape, int layer,
                        const producer *prod, int *idx) {
    if (p->n_ot == p->cap_ot) {
        int nc = p->cap_ot ? 2 * p->cap_ot : 256;
        otensor *v = h3_realloc(p->ot, (size_t)nc * sizeof *v, H3_MEM_OTHER);
        if (!v) return H3_ERR_NOMEM;
        p->ot = v;
        p->cap_ot = nc;
    }
    otensor *o = &p->ot[p->n_ot];
    memset(o, 0, sizeof *o);
    o->name = h3_strdup(name);
    if (!o->name) return H3_ERR_NOMEM;
    o->dtype = dt;
    o->ndim = nd;
    uint64_t n = 1;
    for (int i = 0; i < nd; i++) {
        o->shape[i] = shape[i];
        n *= (uint64_t)shape[i];
    }
    o->nbytes = n * h3_dtype_size(dt);
    o->layer = layer;
    if (prod) o->prod = *prod;
    if (idx) *idx = p->n_ot;
    p->n_ot++;
    return H3_OK;
}

/* A linear to quantize in format f (or to keep as it is when K does not suit f). */
static h3_status add_linear(plan *p, const char *wname, const producer *pr, h3_dtype src_dt, int64_t N,
                            int64_t K, h3_qtarget f, int fpmm) {
    int group = f == H3_QT_INT8_CONVROT ? h3_qtarget_group(K) : 0;
    if (f == H3_QT_INT8_CONVROT && !group) f = H3_QT_INT8;
    if (f == H3_QT_NVFP4 && (K % 16 || N % 16)) f = H3_QT_DEFAULT; /* keep: ComfyUI pads nvfp4 rows to 16 */
    int64_t shape[2] = {N, K};
    if (f == H3_QT_DEFAULT) {
        p->kept++;
        return add_ot(p, wname, src_dt, 2, shape, -1, pr, NULL);
    }
    if (p->n_ql == p->cap_ql) {
        int nc = p->cap_ql ? 2 * p->cap_ql : 128;
        qlayer *v = h3_realloc(p->ql, (size_t)nc * sizeof *v, H3_MEM_OTHER);
        if (!v) return H3_ERR_NOMEM;
        p->ql = v;
        p->cap_ql = nc;
    }
    int li = p->n_ql++;
    qlayer *q = &p->ql[li];
    memset(q, 0, sizeof *q);
    q->prod = *pr;
    q->N = N;
    q->K = K;
    q->fmt = f;
    q->ot[0] = q->ot[1] = q->ot[2] = q->ot[3] = -1;
    char base[256], nm[300];
    size_t bl = strlen(wname) - 7; /* without ".weight" */
    snprintf(base, sizeof base, "%.*s", (int)bl, wname);
    h3_qmarker m = {0};
    if (f == H3_QT_NVFP4) {
        int64_t ws[2] = {N, K / 2}, ss[2] = {(N + 127) / 128 * 128, (K / 16 + 3) / 4 * 4};
        H3_TRY(add_ot(p, wname, H3_U8, 2, ws, li, NULL, &q->ot[0]));
        snprintf(nm, sizeof nm, "%s.weight_scale", base);
        H3_TRY(add_ot(p, nm, H3_F8_E4M3, 2, ss, li, NULL, &q->ot[1]));
        snprintf(nm, sizeof nm, "%s.weight_scale_2", base);
        H3_TRY(add_ot(p, nm, H3_F32, 0, NULL, li, NULL, &q->ot[2]));
        m.fmt = H3_QF_NVFP4;
        m.full_precision_mm = fpmm;
    } else {
        H3_TRY(add_ot(p, wname, f == H3_QT_FP8 ? H3_F8_E4M3 : H3_I8, 2, shape, li, NULL, &q->ot[0]));
        snprintf(nm, sizeof nm, "%s.weight_scale", base);
        int64_t ss[2] = {N, 1};
        H3_TRY(add_ot(p, nm, H3_F32, f == H3_QT_FP8 ? 0 : 2, ss, li, NULL, &q->ot[1]));
        m.fmt = f == H3_QT_FP8 ? H3_QF_FP8 : H3_QF_INT8;
        m.convrot = group != 0;
        m.group = group;
    }
    char mk[128];
    int ml = h3_qmarker_json(&m, mk, sizeof mk);
    if (ml < 0) return H3_ERR(H3_ERR_INTERNAL, "marker too long");
    snprintf(nm, sizeof nm, "%s.comfy_quant", base);
    int64_t ms = ml;
    H3_TRY(add_ot(p, nm, H3_U8, 1, &ms, li, NULL, &q->ot[3]));
    memcpy(p->ot[q->ot[3]].marker, mk, (size_t)ml);
    return H3_OK;
}

static const h3_st_entry *find2(const h3_st_set *s, const char *prefix, const char *name) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s", prefix, name);
    return h3_st_find(s, buf);
}

/* A tensor copied through as it is: any shape, a float dtype (every weight of both models is one). */
static h3_status q_float(plan *p, const h3_st_entry *e) {
    const h3_wbind b = {&p->set, "", NULL, p->info.comp == H3_COMP_DIT ? "DiT" : "text encoder", NULL, NULL};
    h3_wb_row r = h3_wb_row_make(e->name, NULL, e->ndim, 0, 0, 0, 0, H3_WB_FLOATS, 0, "its stored shape",
                                 (h3_wb_unit){NULL, 0, -1});
    for (int i = 0; i < e->ndim; i++) r.shape[i] = H3_WB_ANY;
    return h3_wb_check(&b, &r, NULL, NULL);
}

/* diffusers' DiT names to ComfyUI's (the inverse of src/models/dit.c's table); NULL for names handled apart.
 */
static int diffusers_to_comfy(const char *n, char *out, size_t size) {
    static const struct {
        const char *from, *to;
    } top[] = {
        {"proj_in.", "video_patch_proj."},
        {"audio_proj_in.", "audio_patch_proj."},
        {"context_embedder.", "condition_proj."},
        {"time_embedder.linear_1.", "time_embedder.proj_in."},
        {"time_embedder.linear_2.", "time_embedder.proj_out."},
        {"norm_out.norm.", "final_layer.norm."},
        {"norm_out.linear.", "final_layer.adaln_proj.linear."},
        {"proj_out.", "final_layer.video_out."},
        {"audio_proj_out.", "final_layer.audio_out."},
    };
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (h3_str_starts_with(n, top[i].from))
            return snprintf(out, size, "%s%s", top[i].to, n + strlen(top[i].from)), 1;
    const char *rest = NULL;
    char stack[64];
    long idx = -1;
    if (h3_str_starts_with(n, "transformer_blocks.")) {
        idx = strtol(n + 19, (char **)&rest, 10);
        snprintf(stack, sizeof stack, "blocks.%ld.", idx);
    } else if (h3_str_starts_with(n, "token_refiner.refiner_blocks.")) {
        idx = strtol(n + 29, (char **)&rest, 10);
        snprintf(stack, sizeof stack, "token_refiner.blocks.%ld.", idx);
    } else {
        return snprintf(out, size, "%s", n), 1; /* token_refiner.final_norm, ... */
    }
    if (!rest || *rest != '.') return 0;
    rest++;
    static const struct {
        const char *from, *to;
    } blk[] = {
        {"attn.norm_q.", "attn.q_norm."},
        {"attn.norm_k.", "attn.k_norm."},
        {"attn.to_out.0.", "attn.out_proj."},
        {"ff.net.0.proj.", "mlp.fc1."},
        {"ff.net.2.", "mlp.fc2."},
    };
    if (h3_str_starts_with(rest, "attn.to_q.") || h3_str_starts_with(rest, "attn.to_k.") ||
        h3_str_starts_with(rest, "attn.to_v."))
        return 0;
    for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++)
        if (h3_str_starts_with(rest, blk[i].from))
            return snprintf(out, size, "%s%s%s", stack, blk[i].to, rest + strlen(blk[i].from)), 1;
    return snprintf(out, size, "%s%s", stack, rest), 1;
}

static int is_block_linear(const char *comfy) {
    if (!h3_str_starts_with(comfy, "blocks.")) return 0;
    return h3_str_ends_with(comfy, ".attn.qkv_proj.weight") ||
           h3_str_ends_with(comfy, ".attn.out_proj.weight") || h3_str_ends_with(comfy, ".mlp.fc1.weight") ||
           h3_str_ends_with(comfy, ".mlp.fc2.weight");
}

static h3_status plan_dit(plan *p) {
    const h3_st_set *s = &p->set;
    const char *pre = p->info.prefix;
    const int df = p->info.layout == H3_LAYOUT_DIFFUSERS, off = p->info.layout == H3_LAYOUT_OFFICIAL;
    int64_t head_dim = 0;
    const h3_st_entry *qn =
        find2(s, pre, df ? "transformer_blocks.0.attn.norm_q.weight" : "blocks.0.attn.q_norm.weight");
    if (qn && qn->ndim == 1) head_dim = qn->shape[0];
    int has_inv = 0;
    for (int64_t i = 0; i < s->n_entries; i++) {
        const h3_st_entry *e = &s->entries[i];
        if (!h3_str_starts_with(e->name, pre)) continue;
        const char *n = e->name + strlen(pre);
        char cn[512];
        if (df) {
            if (!diffusers_to_comfy(n, cn, sizeof cn)) {
                /* to_q / to_k / to_v: one fused [Q; K; V] at to_q */
                const char *q = strstr(n, "attn.to_q.");
                if (!q) continue;
                char kn[512], vn[512];
                snprintf(kn, sizeof kn, "%.*sattn.to_k.%s", (int)(q - n), n, q + 10);
                snprintf(vn, sizeof vn, "%.*sattn.to_v.%s", (int)(q - n), n, q + 10);
                const h3_st_entry *k = find2(s, pre, kn), *v = find2(s, pre, vn);
                if (!k || !v || k->dtype != e->dtype || v->dtype != e->dtype || k->ndim != e->ndim ||
                    v->ndim != e->ndim)
                    return H3_ERR(H3_ERR_FORMAT, "%s: %s needs matching to_k and to_v", s->source, e->name);
                char tmp[512];
                snprintf(tmp, sizeof tmp, "%.*sattn.qkv_proj.%s", (int)(q - n), n, q + 10);
                if (!diffusers_to_comfy(tmp, cn, sizeof cn)) return H3_ERR(H3_ERR_INTERNAL, "qkv name");
                producer pr = {P_CONCAT3, {e, k, v}, 0, 0, 0};
                int64_t shape[2] = {3 * e->shape[0], e->ndim > 1 ? e->shape[1] : 0};
                if (e->ndim == 2 && is_block_linear(cn) && p->target != H3_QT_DEFAULT)
                    H3_TRY(add_linear(p, cn, &pr, e->dtype, shape[0], shape[1], p->target, 1));
                else
                    H3_TRY(add_ot(p, cn, e->dtype, e->ndim, shape, -1, &pr, NULL));
                continue;
            }
        } else {
            snprintf(cn, sizeof cn, "%s", n);
        }
        if (h3_qweight_is_companion(cn)) continue;
        if (!strcmp(cn, "rope.inv_freq")) has_inv = 1;
        producer pr = {P_COPY, {e, NULL, NULL}, 0, 0, 0};
        if (off && h3_str_ends_with(cn, ".attn.qkv_proj.weight") && e->ndim == 2) {
            if (head_dim <= 0 || e->shape[0] % (3 * head_dim))
                return H3_ERR(H3_ERR_FORMAT, "%s: %s has %lld rows, not 3 x heads x head_dim %lld", s->source,
                              e->name, (long long)e->shape[0], (long long)head_dim);
            pr.kind = P_QKV_INTERLEAVED;
            pr.head_dim = head_dim;
            pr.heads = e->shape[0] / (3 * head_dim);
        }
        if (df && h3_str_ends_with(cn, ".mlp.fc1.weight"))
            pr.kind = P_SWAP_HALVES; /* [value; gate] -> [gate; value] */
        int lin = e->ndim == 2 && is_block_linear(cn);
        int adaln = e->ndim == 2 && h3_str_starts_with(cn, "blocks.") &&
                    h3_str_ends_with(cn, ".adaln_proj.linear.weight") && p->target == H3_QT_INT8_CONVROT &&
                    e->shape[1] > 8;
        if (lin || adaln) {
            H3_TRY(add_linear(p, cn, &pr, e->dtype, e->shape[0], e->shape[1], p->target, 1));
        } else {
            H3_TRY(q_float(p, e));
            H3_TRY(add_ot(p, cn, e->dtype, e->ndim, e->shape, -1, &pr, NULL));
        }
    }
    if (!has_inv && df) { /* ComfyUI's model keeps RoPE's frequencies as a buffer; diffusers computes them */
        int64_t n = 16;
        producer pr = {P_INV_FREQ, {NULL, NULL, NULL}, 0, 0, n};
        H3_TRY(add_ot(p, "rope.inv_freq", H3_F32, 1, &n, -1, &pr, NULL));
    }
    return H3_OK;
}

static h3_status plan_te(plan *p) {
    const h3_st_set *s = &p->set;
    const int official = p->info.layout == H3_LAYOUT_OFFICIAL;
    for (int64_t i = 0; i < s->n_entries; i++) {
        const h3_st_entry *e = &s->entries[i];
        char cn[512];
        if (official) {
            if (h3_str_starts_with(e->name, "model.language_model."))
                snprintf(cn, sizeof cn, "model.%s", e->name + 21);
            else if (h3_str_starts_with(e->name, "model.visual."))
                snprintf(cn, sizeof cn, "visual.%s", e->name + 13);
            else
                continue; /* lm_head */
        } else {
            snprintf(cn, sizeof cn, "%s", e->name);
        }
        if (h3_str_starts_with(cn, "model.norm.") || h3_str_starts_with(cn, "lm_head.")) continue;
        if (h3_qweight_is_companion(cn)) continue;
        if (h3_str_starts_with(cn, "model.layers.")) {
            long layer = strtol(cn + 13, NULL, 10);
            if (layer >= p->te_layers) continue;
        }
        producer pr = {P_COPY, {e, NULL, NULL}, 0, 0, 0};
        int lin =
            e->ndim == 2 && h3_str_starts_with(cn, "model.layers.") && h3_str_ends_with(cn, "_proj.weight");
        if (lin) {
            H3_TRY(add_linear(p, cn, &pr, e->dtype, e->shape[0], e->shape[1], p->target, 1));
        } else if (!strcmp(cn, "model.embed_tokens.weight") && p->target == H3_QT_NVFP4 && e->ndim == 2) {
            H3_TRY(add_linear(p, cn, &pr, e->dtype, e->shape[0], e->shape[1], H3_QT_INT8, 0));
        } else {
            H3_TRY(q_float(p, e));
            H3_TRY(add_ot(p, cn, e->dtype, e->ndim, e->shape, -1, &pr, NULL));
        }
    }
    return H3_OK;
}

/* ---- the source's contract: every tensor quantize and the error table read, checked through io/wbind ------
 * The widths come from block 0 (head_dim from its q_norm, hidden and heads from its fused or split QKV, FFN
 * from its fc2; for a text encoder hidden from the embedding, head_dim from q_norm, heads from q_proj and
 * k_proj, the intermediate size from gate_proj), each checked in the binder's message form; every block's
 * (layer's) tensors must then have the shapes those widths give, and the DiT's global tensors the hidden
 * size, before anything is read or written. Tensors copied through unchanged without a width of their own
 * (the time embedder, RoPE's frequencies, the curve table, the vision tower) need only exist with a float
 * dtype, as the copy does. */

typedef struct qdims {
    int64_t hidden, head_dim, inner, ffn; /* DiT */
    int64_t heads, kv_heads;              /* text encoder (and DiT heads) */
} qdims;

/* A float tensor of rank nd with every size at least 1; its shape into out. */
static h3_status q_anchor(const h3_wbind *b, const char *name, int nd, const char *words, h3_wb_unit u,
                          int64_t *out) {
    h3_wb_row r = h3_wb_row_make(name, NULL, nd, H3_WB_ANY, H3_WB_ANY, 0, 0, H3_WB_FLOATS, 0, words, u);
    h3_wb_info in;
    H3_TRY(h3_wb_check(b, &r, NULL, &in));
    for (int i = 0; i < nd; i++)
        if (in.shape[i] < 1)
            return h3_wb_shape_error(b, name, in.ndim, in.shape, &u, "%s with every size at least 1", words);
    memcpy(out, in.shape, (size_t)nd * sizeof *out);
    return H3_OK;
}

/* Checks one row given as name, rank and up to two sizes (H3_WB_ANY: free). */
static h3_status q_need(const h3_wbind *b, const char *name, int nd, int64_t d0, int64_t d1,
                        const char *words, h3_wb_unit u) {
    h3_wb_row r = h3_wb_row_make(name, NULL, nd, d0, d1, 0, 0, H3_WB_FLOATS, 0, words, u);
    return h3_wb_check(b, &r, NULL, NULL);
}

/* A weight [d0, d1] and its bias [d0] (the bias takes the weight's rows where d0 is free). */
static h3_status q_linear(const h3_wbind *b, const char *w, const char *bias, int64_t d0, int64_t d1,
                          const char *words, const char *bwords, h3_wb_unit u) {
    h3_wb_row r = h3_wb_row_make(w, NULL, 2, d0, d1, 0, 0, H3_WB_FLOATS, 0, words, u);
    h3_wb_info in;
    H3_TRY(h3_wb_check(b, &r, NULL, &in));
    return bias ? q_need(b, bias, 1, in.shape[0], 0, bwords, u) : H3_OK;
}

/* The DiT's widths and, for blocks [0, n_blocks) and every token-refiner block (n_blocks < 0: all; the table
 * reads block 0 only, n_blocks 1) and with globals, their tensors. */
static h3_status dit_contract(plan *p, int n_blocks, int globals, qdims *d) {
    const int df = p->info.layout == H3_LAYOUT_DIFFUSERS;
    const h3_wbind b = {&p->set, p->info.prefix, NULL, "DiT", NULL, NULL};
    const h3_wb_unit model = {NULL, 0, -1};
    char lp[512], nm[256];
    snprintf(lp, sizeof lp, "%s%s", p->info.prefix, df ? "transformer_blocks." : "blocks.");
    const int nb = h3_count_layers(&p->set, lp);
    snprintf(lp, sizeof lp, "%s%s", p->info.prefix,
             df ? "token_refiner.refiner_blocks." : "token_refiner.blocks.");
    const int nr = h3_count_layers(&p->set, lp);
    const h3_wb_unit blk0 = {"DiT block", 0, nr};
    int64_t s[2];
    const char *qn = df ? "transformer_blocks.0.attn.norm_q.weight" : "blocks.0.attn.q_norm.weight";
    const char *qkv = df ? "transformer_blocks.0.attn.to_q.weight" : "blocks.0.attn.qkv_proj.weight";
    const char *fc2 = df ? "transformer_blocks.0.ff.net.2.weight" : "blocks.0.mlp.fc2.weight";
    H3_TRY(q_anchor(&b, qn, 1, "[head_dim]", blk0, s));
    d->head_dim = s[0];
    H3_TRY(q_anchor(&b, qkv, 2, df ? "[heads·head_dim, hidden]" : "[3·heads·head_dim, hidden]", blk0, s));
    if (s[0] % ((df ? 1 : 3) * d->head_dim))
        return h3_wb_shape_error(&b, qkv, 2, s, &blk0,
                                 "%s rows in whole heads of head_dim %lld (from its q_norm)",
                                 df ? "heads·head_dim" : "3·heads·head_dim", (long long)d->head_dim);
    d->inner = s[0] / (df ? 1 : 3);
    d->heads = d->inner / d->head_dim;
    d->hidden = s[1];
    H3_TRY(q_anchor(&b, fc2, 2, "[hidden, FFN]", blk0, s));
    d->ffn = s[1];
    const int64_t H = d->hidden, I = d->inner, D = d->head_dim, F = d->ffn;
    for (int u = 0; u < nr + nb; u++) {
        const int ref = u < nr, i = ref ? u : u - nr;
        if (!ref && n_blocks >= 0 && i >= n_blocks) break;
        const h3_wb_unit un = {ref ? "token-refiner block" : "DiT block", i, u};
        char pre[96];
        if (df)
            snprintf(pre, sizeof pre, ref ? "token_refiner.refiner_blocks.%d." : "transformer_blocks.%d.", i);
        else
            snprintf(pre, sizeof pre, ref ? "token_refiner.blocks.%d." : "blocks.%d.", i);
        static const struct {
            const char *off, *dif;
            int nd;
            char d0, d1; /* h: hidden, 3: 3·inner, i: inner, d: head_dim, f: FFN, 2: 2·FFN */
            const char *words;
        } rows[] = {
            {"norm1.weight", "norm1.weight", 1, 'h', 0, "[hidden]"},
            {"norm2.weight", "norm2.weight", 1, 'h', 0, "[hidden]"},
            {"attn.qkv_proj.weight", NULL, 2, '3', 'h', "[3·heads·head_dim, hidden]"},
            {NULL, "attn.to_q.weight", 2, 'i', 'h', "[heads·head_dim, hidden]"},
            {NULL, "attn.to_k.weight", 2, 'i', 'h', "[heads·head_dim, hidden]"},
            {NULL, "attn.to_v.weight", 2, 'i', 'h', "[heads·head_dim, hidden]"},
            {"attn.q_norm.weight", "attn.norm_q.weight", 1, 'd', 0, "[head_dim]"},
            {"attn.k_norm.weight", "attn.norm_k.weight", 1, 'd', 0, "[head_dim]"},
            {"attn.out_proj.weight", "attn.to_out.0.weight", 2, 'h', 'i', "[hidden, heads·head_dim]"},
            {"mlp.fc1.weight", "ff.net.0.proj.weight", 2, '2', 'h', "[2·FFN, hidden]"},
            {"mlp.fc2.weight", "ff.net.2.weight", 2, 'h', 'f', "[hidden, FFN]"},
        };
        for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
            const char *n = df ? rows[k].dif : rows[k].off;
            if (!n) continue;
            int64_t dd[2];
            for (int j = 0; j < 2; j++) {
                char c = j ? rows[k].d1 : rows[k].d0;
                dd[j] = c == 'h' ? H : c == '3' ? 3 * I : c == 'i' ? I : c == 'd' ? D : c == 'f' ? F : 2 * F;
            }
            snprintf(nm, sizeof nm, "%s%s", pre, n);
            H3_TRY(q_need(&b, nm, rows[k].nd, dd[0], dd[1], rows[k].words, un));
        }
        if (!ref) {
            char bn[256];
            snprintf(nm, sizeof nm, "%sadaln_proj.linear.weight", pre);
            snprintf(bn, sizeof bn, "%sadaln_proj.linear.bias", pre);
            H3_TRY(q_linear(&b, nm, bn, 18 * H, H3_WB_ANY, "[6·3·hidden, time embedding width]",
                            "[6·3·hidden]", un));
        }
    }
    if (!globals) return H3_OK;
    static const struct {
        const char *w, *b, *dw, *db; /* official/ComfyUI and diffusers names */
        char d0, d1;                 /* h: hidden, 2: 2·hidden, *: free */
        const char *words, *bwords;
    } g[] = {
        {"video_patch_proj.weight", "video_patch_proj.bias", "proj_in.weight", "proj_in.bias", 'h', '*',
         "[hidden, video row width]", "[hidden]"},
        {"audio_patch_proj.weight", "audio_patch_proj.bias", "audio_proj_in.weight", "audio_proj_in.bias",
         'h', '*', "[hidden, audio channels]", "[hidden]"},
        {"condition_proj.weight", "condition_proj.bias", "context_embedder.weight", "context_embedder.bias",
         'h', '*', "[hidden, text dim]", "[hidden]"},
        {"final_layer.adaln_proj.linear.weight", "final_layer.adaln_proj.linear.bias",
         "norm_out.linear.weight", "norm_out.linear.bias", '2', '*', "[2·hidden, time embedding width]",
         "[2·hidden]"},
        {"final_layer.video_out.weight", "final_layer.video_out.bias", "proj_out.weight", "proj_out.bias",
         '*', 'h', "[video row width, hidden]", "[video row width]"},
        {"final_layer.audio_out.weight", "final_layer.audio_out.bias", "audio_proj_out.weight",
         "audio_proj_out.bias", '*', 'h', "[audio channels, hidden]", "[audio channels]"},
    };
    for (size_t k = 0; k < sizeof g / sizeof g[0]; k++) {
        int64_t dd[2];
        for (int j = 0; j < 2; j++) {
            char c = j ? g[k].d1 : g[k].d0;
            dd[j] = c == 'h' ? H : c == '2' ? 2 * H : H3_WB_ANY;
        }
        H3_TRY(q_linear(&b, df ? g[k].dw : g[k].w, df ? g[k].db : g[k].b, dd[0], dd[1], g[k].words,
                        g[k].bwords, model));
    }
    H3_TRY(q_need(&b, "token_refiner.final_norm.weight", 1, H, 0, "[hidden]", model));
    return q_need(&b, df ? "norm_out.norm.weight" : "final_layer.norm.weight", 1, H, 0, "[hidden]", model);
}

/* The text encoder's widths and the tensors of its layers [0, n_layers). */
static h3_status te_contract(plan *p, int n_layers, qdims *d) {
    const h3_wbind b = {&p->set, p->info.prefix, NULL, "text encoder", NULL, NULL};
    const h3_wb_unit model = {NULL, 0, -1};
    int64_t s[2], C, D, F;
    H3_TRY(q_anchor(&b, "embed_tokens.weight", 2, "[vocab, hidden]", model, s));
    C = s[1];
    H3_TRY(q_anchor(&b, "layers.0.self_attn.q_norm.weight", 1, "[head_dim]", model, s));
    D = s[0];
    static const char *const qk[2] = {"layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight"};
    int64_t h[2];
    for (int i = 0; i < 2; i++) {
        H3_TRY(
            q_anchor(&b, qk[i], 2, i ? "[kv_heads·head_dim, hidden]" : "[heads·head_dim, hidden]", model, s));
        if (s[0] % D)
            return h3_wb_shape_error(&b, qk[i], 2, s, &model,
                                     "rows in whole heads of head_dim %lld (from q_norm)", (long long)D);
        h[i] = s[0] / D;
    }
    H3_TRY(q_anchor(&b, "layers.0.mlp.gate_proj.weight", 2, "[intermediate, hidden]", model, s));
    F = s[0];
    d->hidden = C;
    d->head_dim = D;
    d->heads = h[0];
    d->kv_heads = h[1];
    d->ffn = F;
    static const struct {
        const char *name;
        char d0, d1; /* c: hidden, q: heads·head_dim, k: kv_heads·head_dim, d: head_dim, f: intermediate */
        const char *words;
    } rows[] = {
        {"input_layernorm.weight", 'c', 0, "[hidden]"},
        {"post_attention_layernorm.weight", 'c', 0, "[hidden]"},
        {"self_attn.q_proj.weight", 'q', 'c', "[heads·head_dim, hidden]"},
        {"self_attn.k_proj.weight", 'k', 'c', "[kv_heads·head_dim, hidden]"},
        {"self_attn.v_proj.weight", 'k', 'c', "[kv_heads·head_dim, hidden]"},
        {"self_attn.o_proj.weight", 'c', 'q', "[hidden, heads·head_dim]"},
        {"self_attn.q_norm.weight", 'd', 0, "[head_dim]"},
        {"self_attn.k_norm.weight", 'd', 0, "[head_dim]"},
        {"mlp.gate_proj.weight", 'f', 'c', "[intermediate, hidden]"},
        {"mlp.up_proj.weight", 'f', 'c', "[intermediate, hidden]"},
        {"mlp.down_proj.weight", 'c', 'f', "[hidden, intermediate]"},
    };
    char lp[512], nm[256];
    snprintf(lp, sizeof lp, "%slayers.", p->info.prefix);
    const int nl = h3_count_layers(&p->set, lp);
    for (int l = 0; l < nl && l < n_layers; l++) {
        const h3_wb_unit un = {"text-encoder layer", l, l};
        for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
            int64_t dd[2] = {0, 0};
            for (int j = 0; j < 2; j++) {
                char c = j ? rows[k].d1 : rows[k].d0;
                dd[j] = c == 'c' ? C : c == 'q' ? h[0] * D : c == 'k' ? h[1] * D : c == 'd' ? D : F;
            }
            snprintf(nm, sizeof nm, "layers.%d.%s", l, rows[k].name);
            H3_TRY(q_need(&b, nm, rows[k].d1 ? 2 : 1, dd[0], dd[1], rows[k].words, un));
        }
    }
    return H3_OK;
}

/* The contract of what a run reads: the whole checkpoint (table_only 0) or block / layer 0 (the error table).
 */
static h3_status check_source(plan *p, int table_only, qdims *d) {
    memset(d, 0, sizeof *d);
    if (p->info.comp == H3_COMP_DIT) return dit_contract(p, table_only ? 1 : -1, !table_only, d);
    return te_contract(p, table_only ? 1 : p->te_layers, d);
}

/* ---- producing --------------------------------------------------------------------------------------------
 */

/* The source of a tensor as f32 [rows, cols] (rows · cols = its elements). */
static h3_status produce_f32(h3_st_set *s, const producer *pr, int64_t n_out, float *dst) {
    if (pr->kind == P_INV_FREQ) {
        for (int64_t j = 0; j < pr->n; j++)
            dst[j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)(2 * pr->n));
        return H3_OK;
    }
    int nsrc = pr->kind == P_CONCAT3 ? 3 : 1;
    int64_t at = 0;
    for (int k = 0; k < nsrc; k++) {
        h3_tensor t;
        H3_TRY(h3_st_tensor(s, pr->src[k], &t));
        int64_t n = h3_tensor_numel(&t), rows = t.ndim ? h3_tensor_rows(&t) : 1;
        h3_status st = H3_OK;
        if (at + n > n_out) st = H3_ERR(H3_ERR_INTERNAL, "producer size");
        if (st == H3_OK && t.ndim == 0) {
            if (!h3_convert_to_f32(t.dtype, t.data, dst + at, 1))
                st = H3_ERR(H3_ERR_FORMAT, "%s: '%s' is not a float tensor", s->source, pr->src[k]->name);
        } else if (st == H3_OK) {
            st = h3_tensor_rows_to_f32(&t, 0, rows, dst + at);
        }
        h3_tensor_free(&t);
        if (st != H3_OK) return h3_error_wrap(st, "reading '%s'", pr->src[k]->name);
        at += n;
    }
    const h3_st_entry *e = pr->src[0];
    if (pr->kind == P_QKV_INTERLEAVED || pr->kind == P_SWAP_HALVES) {
        int64_t R = e->shape[0], C = e->ndim > 1 ? e->shape[1] : 1;
        float *tmp = h3_malloc((size_t)(R * C) * sizeof(float), H3_MEM_WORKSPACE);
        if (!tmp) return H3_ERR_NOMEM;
        memcpy(tmp, dst, (size_t)(R * C) * sizeof(float));
        for (int64_t r = 0; r < R; r++) {
            int64_t from;
            if (pr->kind == P_SWAP_HALVES) {
                from = r < R / 2 ? r + R / 2 : r - R / 2;
            } else { /* new row j·inner + h·hd + e reads old row h·3·hd + j·hd + e */
                int64_t inner = pr->heads * pr->head_dim, j = r / inner, h = (r % inner) / pr->head_dim,
                        ee = r % pr->head_dim;
                from = h * 3 * pr->head_dim + j * pr->head_dim + ee;
            }
            memcpy(dst + r * C, tmp + from * C, (size_t)C * sizeof(float));
        }
        h3_free(tmp);
    }
    return H3_OK;
}

static h3_status write_at(FILE *f, uint64_t off, const void *p, size_t n, const char *path) {
    if (fseeko(f, (off_t)off, SEEK_SET) != 0 || (n && fwrite(p, 1, n, f) != n))
        return H3_ERR(H3_ERR_IO, "writing %s failed: %s", path, strerror(errno));
    return H3_OK;
}

/* A plain tensor: its bytes (a copy) or, when transformed, the f32 values converted back to its dtype. */
static h3_status write_plain(plan *p, const otensor *o, FILE *f, uint64_t base, const char *path) {
    const producer *pr = &o->prod;
    if (pr->kind == P_COPY) {
        const void *src;
        H3_TRY(h3_st_bytes(&p->set, pr->src[0], &src));
        return write_at(f, base + o->offset, src, (size_t)o->nbytes, path);
    }
    int64_t n = 1;
    for (int i = 0; i < o->ndim; i++) n *= o->shape[i];
    float *v = h3_malloc((size_t)(n ? n : 1) * sizeof(float), H3_MEM_WORKSPACE);
    void *b = h3_malloc((size_t)(o->nbytes ? o->nbytes : 1), H3_MEM_WORKSPACE);
    h3_status st = (v && b) ? H3_OK : H3_ERR_NOMEM;
    if (st == H3_OK) st = produce_f32(&p->set, pr, n, v);
    if (st == H3_OK && !h3_convert_from_f32(o->dtype, v, b, (size_t)n))
        st = H3_ERR(H3_ERR_UNSUPPORTED, "cannot write '%s' as %s", o->name, h3_dtype_name(o->dtype));
    if (st == H3_OK) st = write_at(f, base + o->offset, b, (size_t)o->nbytes, path);
    h3_free(v);
    h3_free(b);
    return st;
}

/* A weight holding NaN or an infinity (a damaged file, or a tensor a test fills with NaN to prove it is never read)
 * has no int8, fp8 or nvfp4 code: the quantizers keep it not finite (an int8 row's scale, an nvfp4 block's scale,
 * fp8's NaN code), so what decodes from it is NaN as before, never an arbitrary value. Said once per tensor. */
static void warn_not_finite(const float *v, int64_t N, int64_t K, const char *source, const char *name) {
    for (int64_t i = 0; i < N * K; i++)
        if (!isfinite(v[i])) {
            H3_WARN("%s: tensor '%s' holds %s at row %lld, column %lld: its quantized rows decode as NaN",
                    source, name, isnan(v[i]) ? "NaN" : "an infinity", (long long)(i / (K ? K : 1)),
                    (long long)(i % (K ? K : 1)));
            return;
        }
}

static h3_status write_layer(plan *p, const qlayer *q, FILE *f, uint64_t base, const char *path,
                             h3_pool *pool) {
    float *w = h3_malloc((size_t)(q->N * q->K) * sizeof(float), H3_MEM_WORKSPACE);
    if (!w) return H3_ERR_NOMEM;
    h3_tensor t = {0};
    h3_status st = produce_f32(&p->set, &q->prod, q->N * q->K, w);
    if (st == H3_OK) warn_not_finite(w, q->N, q->K, p->set.source, p->ot[q->ot[0]].name);
    if (st == H3_OK) st = h3_quantize_tensor(w, q->N, q->K, q->fmt, pool, &t);
    h3_free(w);
    if (st != H3_OK) return st;
    const otensor *ow = &p->ot[q->ot[0]], *os = &p->ot[q->ot[1]], *om = &p->ot[q->ot[3]];
    st = write_at(f, base + ow->offset, t.data, (size_t)ow->nbytes, path);
    if (st == H3_OK) {
        if (q->fmt == H3_QT_NVFP4) {
            st = write_at(f, base + os->offset, t.q.fmt_scales, (size_t)os->nbytes, path);
            if (st == H3_OK) st = write_at(f, base + p->ot[q->ot[2]].offset, &t.q.scale, 4, path);
        } else if (q->fmt == H3_QT_FP8) {
            st = write_at(f, base + os->offset, &t.q.scale, 4, path);
        } else {
            st = write_at(f, base + os->offset, t.q.scales, (size_t)os->nbytes, path);
        }
    }
    if (st == H3_OK) st = write_at(f, base + om->offset, om->marker, (size_t)om->nbytes, path);
    h3_tensor_free(&t);
    return st;
}

static int cmp_ot(const void *a, const void *b) {
    const otensor *x = *(otensor *const *)a, *y = *(otensor *const *)b;
    size_t ex = h3_dtype_size(x->dtype), ey = h3_dtype_size(y->dtype);
    if (ex != ey) return ex > ey ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The safetensors header of the planned tensors; fails when two tensors would have one name (in: the source,
 * for the message). */
static h3_status header_json(plan *p, const char *in, char **text) {
    json_t *root = json_object();
    if (!root) return H3_ERR_NOMEM;
    h3_status st = H3_OK;
    for (int i = 0; i < p->n_ot && st == H3_OK; i++) {
        const otensor *o = &p->ot[i];
        if (json_object_get(root, o->name)) {
            st = H3_ERR(H3_ERR_FORMAT, "%s: two tensors would both be named '%s'", in, o->name);
            break;
        }
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        int bad = !e || !sh || !of;
        for (int d = 0; d < o->ndim && !bad; d++)
            bad = json_array_append_new(sh, json_integer(o->shape[d])) != 0;
        if (!bad) bad = json_array_append_new(of, json_integer((json_int_t)o->offset)) != 0;
        if (!bad) bad = json_array_append_new(of, json_integer((json_int_t)(o->offset + o->nbytes))) != 0;
        if (!bad) bad = json_object_set_new(e, "dtype", json_string(h3_dtype_st_name(o->dtype))) != 0;
        if (!bad) {
            bad = json_object_set_new(e, "shape", sh) != 0;
            sh = NULL;
        }
        if (!bad) {
            bad = json_object_set_new(e, "data_offsets", of) != 0;
            of = NULL;
        }
        if (!bad) {
            bad = json_object_set_new(root, o->name, e) != 0;
            e = NULL;
        }
        json_decref(e);
        json_decref(sh);
        json_decref(of);
        if (bad) st = H3_ERR(H3_ERR_NOMEM, "out of memory building a safetensors header");
    }
    if (st == H3_OK) st = h3_json_dumps(root, JSON_COMPACT, text);
    json_decref(root);
    return st;
}

static h3_status open_source(const char *in, plan *p) {
    h3_status st = h3_st_open(in, &p->set);
    if (st == H3_OK) {
        p->have_set = 1;
        h3_detect(&p->set, &p->info);
        if (p->info.comp == H3_COMP_DIT || p->info.comp == H3_COMP_TEXT_ENCODER) return H3_OK;
        h3_st_close(&p->set);
        p->have_set = 0;
    } else if (!h3_path_is_dir(in)) {
        return st;
    }
    /* A model folder: its transformer/ or text_encoder/. */
    const char *subs[] = {"transformer", "text_encoder"};
    for (int i = 0; i < 2; i++) {
        char *sub = h3_path_join(in, subs[i]);
        if (!sub) return H3_ERR_NOMEM;
        if (h3_path_is_dir(sub)) {
            h3_clear_error();
            st = h3_st_open(sub, &p->set);
            h3_free(sub);
            if (st != H3_OK) return st;
            p->have_set = 1;
            h3_detect(&p->set, &p->info);
            if (p->info.comp == H3_COMP_DIT || p->info.comp == H3_COMP_TEXT_ENCODER) return H3_OK;
            h3_st_close(&p->set);
            p->have_set = 0;
        } else {
            h3_free(sub);
        }
    }
    return H3_ERR(H3_ERR_FORMAT, "%s holds no MiniMax-H3 DiT or Qwen3-VL text encoder h3run can quantize",
                  in);
}

h3_status h3_quantize_checkpoint(const char *in, const char *out, const h3_quantize_opts *o,
                                 h3_quantize_result *res) {
    plan p;
    memset(&p, 0, sizeof p);
    memset(res, 0, sizeof *res);
    h3_status st = H3_OK;
    char *text = NULL;
    otensor **order = NULL;
    h3_outfile of = {0};
    H3_CHECK(open_source(in, &p));
    if (p.info.n_quantized)
        H3_FAIL(H3_ERR_INVALID,
                "%s is already quantized (%s); quantize a bf16 checkpoint (official, diffusers or "
                "ComfyUI bf16)",
                in, p.info.formats);
    p.target = o ? o->target : H3_QT_DEFAULT;
    if (p.target == H3_QT_DEFAULT) p.target = p.info.comp == H3_COMP_DIT ? H3_QT_INT8_CONVROT : H3_QT_NVFP4;
    p.te_layers = o && o->te_layers > 0 ? o->te_layers : 50;
    res->comp = p.info.comp;
    res->in_layout = p.info.layout;
    res->target = p.target;
    {
        qdims d;
        H3_CHECK(check_source(&p, 0, &d));
    }
    if (p.info.comp == H3_COMP_DIT)
        H3_CHECK(plan_dit(&p));
    else
        H3_CHECK(plan_te(&p));
    /* Offsets: element size descending, then name, so each tensor is aligned to its element size. */
    order = h3_malloc((size_t)(p.n_ot ? p.n_ot : 1) * sizeof *order, H3_MEM_OTHER);
    if (!order) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int i = 0; i < p.n_ot; i++) order[i] = &p.ot[i];
    qsort(order, (size_t)p.n_ot, sizeof *order, cmp_ot);
    uint64_t off = 0;
    for (int i = 0; i < p.n_ot; i++) {
        order[i]->offset = off;
        off += order[i]->nbytes;
    }
    H3_CHECK(header_json(&p, in, &text));
    size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
    H3_CHECK(h3_out_open(out, &of));
    {
        uint8_t lenb[8];
        for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
        H3_CHECK(write_at(of.f, 0, lenb, 8, of.tmp_path));
        H3_CHECK(write_at(of.f, 8, text, tl, of.tmp_path));
        for (size_t i = tl; i < padded; i++) fputc(' ', of.f);
    }
    const uint64_t base = 8 + padded;
    for (int i = 0; i < p.n_ot; i++) {
        if (p.ot[i].layer >= 0) continue;
        H3_CHECK_CTX(write_plain(&p, &p.ot[i], of.f, base, of.tmp_path), "writing '%s'", p.ot[i].name);
        res->in_bytes += (int64_t)p.ot[i].nbytes;
    }
    for (int i = 0; i < p.n_ql; i++) {
        H3_CHECK(h3_cancel_check()); /* a stop request (Ctrl-C) is seen between layers */
        H3_CHECK_CTX(write_layer(&p, &p.ql[i], of.f, base, of.tmp_path, o ? o->pool : NULL),
                     "quantizing '%s'", p.ot[p.ql[i].ot[0]].name);
        res->in_bytes += (int64_t)(p.ql[i].N * p.ql[i].K * 2);
    }
    if (fseeko(of.f, 0, SEEK_END) != 0 || (uint64_t)ftello(of.f) != base + off)
        H3_FAIL(H3_ERR_IO, "%s: wrote %lld bytes, expected %llu", of.tmp_path, (long long)ftello(of.f),
                (unsigned long long)(base + off));
    H3_CHECK(h3_out_commit(&of));
    res->n_tensors = p.n_ot;
    res->n_quantized = p.n_ql;
    res->n_kept = p.kept;
    res->out_bytes = (int64_t)off;
done:
    if (st != H3_OK && of.f) h3_out_abort(&of);
    h3_free(text);
    h3_free(order);
    plan_free(&p);
    return st;
}

/* ---- the error table's source: block 0 of a checkpoint ----------------------------------------------------
 */

static h3_status src_tensor(plan *p, h3_qbench_source *src, const char *name, int64_t *n, int64_t *k,
                            float **out) {
    for (int i = 0; i < p->n_ot; i++) {
        const otensor *o = &p->ot[i];
        if (strcmp(o->name, name)) continue;
        const producer *pr = o->layer >= 0 ? &p->ql[o->layer].prod : &o->prod;
        int64_t N = o->layer >= 0 ? p->ql[o->layer].N : o->shape[0];
        int64_t K = o->layer >= 0 ? p->ql[o->layer].K : (o->ndim > 1 ? o->shape[1] : 1);
        if (src->n_bufs >= (int)(sizeof src->bufs / sizeof src->bufs[0]))
            return H3_ERR(H3_ERR_INTERNAL, "too many");
        float *v = h3_malloc((size_t)(N * K) * sizeof(float), H3_MEM_WEIGHTS);
        if (!v) return H3_ERR_NOMEM;
        src->bufs[src->n_bufs++] = v;
        H3_TRY(produce_f32(&p->set, pr, N * K, v));
        warn_not_finite(v, N, K, p->set.source, name);
        *n = N;
        *k = K;
        *out = v;
        return H3_OK;
    }
    return H3_ERR(H3_ERR_NOT_FOUND, "%s has no tensor '%s'", p->set.source, name);
}

h3_status h3_qbench_source_load(const char *in, h3_qbench_source *src) {
    plan p;
    memset(&p, 0, sizeof p);
    memset(src, 0, sizeof *src);
    h3_status st = H3_OK;
    H3_CHECK(open_source(in, &p));
    if (p.info.n_quantized)
        H3_FAIL(H3_ERR_INVALID, "%s is already quantized (%s); the error table needs the bf16 weights", in,
                p.info.formats);
    p.target = H3_QT_INT8;
    p.te_layers = 1;
    src->comp = p.info.comp;
    static const char *const dit[] = {"blocks.0.attn.qkv_proj.weight", "blocks.0.attn.out_proj.weight",
                                      "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.weight"};
    static const char *const te[] = {
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",    "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight"};
    const int is_dit = p.info.comp == H3_COMP_DIT;
    qdims d;
    H3_CHECK(check_source(&p, 1, &d));
    if (is_dit)
        H3_CHECK(plan_dit(&p));
    else
        H3_CHECK(plan_te(&p));
    const char *const *names = is_dit ? dit : te;
    int n = is_dit ? 4 : 7;
    for (int i = 0; i < n; i++) {
        h3_qbench_layer *l = &src->layers[i];
        snprintf(l->name, sizeof l->name, "%s", names[i]);
        float *w;
        H3_CHECK(src_tensor(&p, src, names[i], &l->n, &l->k, &w));
        l->w = w;
        src->n_layers = i + 1;
    }
    if (is_dit) {
        h3_qbench_block *b = &src->block;
        int64_t a, c;
        float *v;
        b->qkv = src->layers[0].w;
        b->out = src->layers[1].w;
        b->fc1 = src->layers[2].w;
        b->fc2 = src->layers[3].w;
        /* the shapes chain: check_source bound every one of them to the widths d */
        H3_CHECK(src_tensor(&p, src, "blocks.0.norm1.weight", &a, &c, &v));
        b->norm1 = v;
        H3_CHECK(src_tensor(&p, src, "blocks.0.norm2.weight", &a, &c, &v));
        b->norm2 = v;
        H3_CHECK(src_tensor(&p, src, "blocks.0.attn.q_norm.weight", &a, &c, &v));
        b->q_norm = v;
        H3_CHECK(src_tensor(&p, src, "blocks.0.attn.k_norm.weight", &a, &c, &v));
        b->k_norm = v;
        b->hidden = d.hidden;
        b->head_dim = d.head_dim;
        b->heads = d.heads;
        b->ffn = d.ffn;
        b->eps = 1e-5;
        src->has_block = 1;
    }
done:
    plan_free(&p);
    if (st != H3_OK) h3_qbench_source_free(src);
    return st;
}

/* Weight tensors from stored formats (contracts in qload.h). */
#include "quant/qload.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"

int h3_qweight_is_companion(const char *name) {
    return h3_str_ends_with(name, ".comfy_quant") || h3_str_ends_with(name, ".weight_scale") ||
           h3_str_ends_with(name, ".weight_scale_2") || h3_str_ends_with(name, ".pre_quant_scale") ||
           h3_str_ends_with(name, ".scale_weight") || h3_str_ends_with(name, ".input_scale");
}

/* "<base><suffix>" where base is the weight's name without ".weight" (or the whole name). */
static const h3_st_entry *companion(const h3_st_set *s, const char *wname, const char *suffix) {
    char buf[512];
    size_t n = strlen(wname);
    if (h3_str_ends_with(wname, ".weight")) n -= 7;
    if (n + strlen(suffix) + 1 > sizeof buf) return NULL;
    memcpy(buf, wname, n);
    strcpy(buf + n, suffix);
    return h3_st_find(s, buf);
}

/* One float value of a scalar tensor (any float dtype, exactly one element). */
static h3_status scalar_of(h3_st_set *s, const h3_st_entry *e, const char *what, float *out) {
    if (!h3_dtype_is_float(e->dtype) || h3_st_entry_numel(e) != 1)
        return H3_ERR(H3_ERR_FORMAT, "%s: '%s' must be one float value (the %s), is %s with %lld values",
                      s->source, e->name, what, h3_dtype_name(e->dtype), (long long)h3_st_entry_numel(e));
    const void *p;
    H3_TRY(h3_st_bytes(s, e, &p));
    uint8_t tmp[8];
    memcpy(tmp, p, h3_dtype_size(e->dtype));
    if (!h3_convert_to_f32(e->dtype, tmp, out, 1))
        return H3_ERR(H3_ERR_FORMAT, "%s: '%s' is not a float", s->source, e->name);
    if (!isfinite(*out))
        return H3_ERR(H3_ERR_FORMAT, "%s: '%s' (the %s) is not finite", s->source, e->name, what);
    return H3_OK;
}

static void set_label(h3_qweight_info *i) {
    switch (i->fmt) {
        case H3_QF_NONE:
            snprintf(i->label, sizeof i->label, "%s", h3_dtype_name(i->dtype));
            break;
        case H3_QF_INT8:
            if (i->rot_group)
                snprintf(i->label, sizeof i->label, "int8_tensorwise convrot %d%s", i->rot_group,
                         i->per_row ? "" : " (one scale)");
            else
                snprintf(i->label, sizeof i->label, "int8_tensorwise%s", i->per_row ? "" : " (one scale)");
            break;
        case H3_QF_FP8:
            snprintf(i->label, sizeof i->label, "float8_e4m3fn%s", i->legacy ? " (legacy scale)" : "");
            break;
        case H3_QF_NVFP4:
            snprintf(i->label, sizeof i->label, "nvfp4%s%s", i->awq ? " awq" : "",
                     i->full_precision_mm ? " (full-precision matmul)" : "");
            break;
        default:
            snprintf(i->label, sizeof i->label, "%s", h3_qformat_name(i->fmt));
            break;
    }
}

static h3_status info_gguf(h3_st_set *s, const h3_gguf *g, const h3_st_entry *e, h3_qweight_info *out) {
    const h3_gguf_tensor *t = h3_gguf_find(g, e->name);
    if (!t)
        return H3_ERR(H3_ERR_INTERNAL, "%s: tensor '%s' is in the set but not in the GGUF index", s->source,
                      e->name);
    out->ggml_type = t->type;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->bytes = (int64_t)t->nbytes;
    out->gguf_reshaped = t->reshaped;
    h3_dtype dt;
    if (h3_ggml_dtype(t->type, &dt)) {
        out->dtype = dt;
        set_label(out);
        return H3_OK;
    }
    out->dtype = H3_U8;
    out->fmt = h3_ggml_qformat(t->type);
    const char *tn = h3_ggml_type_name(t->type);
    if (out->fmt == H3_QF_NONE)
        return H3_ERR(
            H3_ERR_UNSUPPORTED,
            "%s: tensor '%s' is GGUF type %s, which h3run does not decode (it reads F32, F16, BF16, Q4_0, "
            "Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K)",
            s->source, t->name, tn ? tn : "?");
    snprintf(out->label, sizeof out->label, "%s", tn);
    return H3_OK;
}

h3_status h3_qweight_info_of(h3_st_set *s, const h3_gguf *g, const h3_st_entry *e, h3_qweight_info *out) {
    char a[96], b[96];
    memset(out, 0, sizeof *out);
    out->ggml_type = UINT32_MAX;
    out->dtype = e->dtype;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof out->shape);
    out->bytes = (int64_t)(e->end - e->begin);
    if (g) return info_gguf(s, g, e, out);
    const h3_st_entry *mk = companion(s, e->name, ".comfy_quant");
    const h3_st_entry *ws = companion(s, e->name, ".weight_scale");
    h3_qmarker m = {0};
    if (mk) {
        const void *p;
        char what[600];
        if (mk->dtype != H3_U8 || mk->ndim != 1 || mk->end - mk->begin > 4096)
            return H3_ERR(H3_ERR_FORMAT, "%s: marker '%s' must be a U8 vector of JSON (at most 4096 bytes)",
                          s->source, mk->name);
        H3_TRY(h3_st_bytes(s, mk, &p));
        snprintf(what, sizeof what, "%s: the comfy_quant marker of '%s'", s->source, e->name);
        H3_TRY(h3_qmarker_parse(p, (size_t)(mk->end - mk->begin), what, &m));
        out->bytes += (int64_t)(mk->end - mk->begin);
    } else if (e->dtype == H3_I8 && ws) {
        m.fmt = H3_QF_INT8; /* scales without a marker: plain int8 */
    } else if (e->dtype == H3_F8_E4M3) {
        m.fmt = H3_QF_FP8;
        out->legacy = 1;
    } else if (e->dtype == H3_I8) {
        return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s' is i8 without a comfy_quant marker or a weight_scale",
                      s->source, e->name);
    } else {
        if (!h3_dtype_is_float(e->dtype))
            return H3_ERR(H3_ERR_FORMAT,
                          "%s: tensor '%s' is %s, not a weight dtype (float, or a quantized format)",
                          s->source, e->name, h3_dtype_name(e->dtype));
        set_label(out);
        return H3_OK;
    }
    out->fmt = m.fmt;
    const int64_t N = e->ndim == 2 ? e->shape[0] : 0, Ks = e->ndim == 2 ? e->shape[1] : 0;
    switch (m.fmt) {
        case H3_QF_INT8: {
            if (e->dtype != H3_I8 || e->ndim != 2)
                return H3_ERR(H3_ERR_FORMAT,
                              "%s: tensor '%s' is marked int8_tensorwise but is %s %s (expected I8 [N, K])",
                              s->source, e->name, h3_dtype_name(e->dtype),
                              h3_shape_str(e->ndim, e->shape, a, sizeof a));
            if (!ws)
                return H3_ERR(H3_ERR_FORMAT, "%s: int8 tensor '%s' has no weight_scale", s->source, e->name);
            int64_t ns = h3_st_entry_numel(ws);
            if (ws->dtype != H3_F32 || (ns != 1 && ns != N))
                return H3_ERR(
                    H3_ERR_FORMAT,
                    "%s: '%s' must be F32 with one value per row ([%lld, 1]) or one in all; it is %s %s",
                    s->source, ws->name, (long long)N, h3_dtype_name(ws->dtype),
                    h3_shape_str(ws->ndim, ws->shape, b, sizeof b));
            out->per_row = ns != 1; /* [1, 1] of a one-row weight is the same as one scale */
            out->rot_group = m.convrot ? m.group : 0;
            if (out->rot_group && Ks % out->rot_group)
                return H3_ERR(H3_ERR_FORMAT,
                              "%s: tensor '%s' has %lld columns, not a multiple of its ConvRot group %d",
                              s->source, e->name, (long long)Ks, out->rot_group);
            out->bytes += (int64_t)(ws->end - ws->begin);
            break;
        }
        case H3_QF_FP8: {
            if (e->dtype != H3_F8_E4M3)
                return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s' is marked float8_e4m3fn but is %s", s->source,
                              e->name, h3_dtype_name(e->dtype));
            const h3_st_entry *sc = ws ? ws : companion(s, e->name, ".scale_weight");
            if (!mk && !ws) out->legacy = 1;
            if (sc) {
                float v;
                H3_TRY(scalar_of(s, sc, "fp8 weight scale", &v));
                out->bytes += (int64_t)(sc->end - sc->begin);
            } else if (mk) {
                return H3_ERR(H3_ERR_FORMAT, "%s: fp8 tensor '%s' has no weight_scale", s->source, e->name);
            }
            break;
        }
        case H3_QF_NVFP4: {
            if (e->dtype != H3_U8 || e->ndim != 2)
                return H3_ERR(H3_ERR_FORMAT,
                              "%s: tensor '%s' is marked nvfp4 but is %s %s (expected U8 [N, K/2])",
                              s->source, e->name, h3_dtype_name(e->dtype),
                              h3_shape_str(e->ndim, e->shape, a, sizeof a));
            const int64_t K = 2 * Ks;
            if (K % 16)
                return H3_ERR(H3_ERR_FORMAT, "%s: nvfp4 tensor '%s' has %lld columns, not a multiple of 16",
                              s->source, e->name, (long long)K);
            const h3_st_entry *s2 = companion(s, e->name, ".weight_scale_2");
            if (!ws || !s2)
                return H3_ERR(H3_ERR_FORMAT, "%s: nvfp4 tensor '%s' needs weight_scale and weight_scale_2",
                              s->source, e->name);
            if (ws->dtype != H3_F8_E4M3 || h3_st_entry_numel(ws) != h3_nvfp4_scale_count(N, K))
                return H3_ERR(H3_ERR_FORMAT,
                              "%s: '%s' must be F8_E4M3 with %lld values (the [%lld, %lld] block scales of a "
                              "[%lld, %lld] "
                              "weight, padded to 128 x 4); it is %s %s",
                              s->source, ws->name, (long long)h3_nvfp4_scale_count(N, K),
                              (long long)((N + 127) / 128 * 128), (long long)((K / 16 + 3) / 4 * 4),
                              (long long)N, (long long)K, h3_dtype_name(ws->dtype),
                              h3_shape_str(ws->ndim, ws->shape, b, sizeof b));
            float v;
            H3_TRY(scalar_of(s, s2, "nvfp4 second-level scale", &v));
            const h3_st_entry *pq = companion(s, e->name, ".pre_quant_scale");
            if (pq) {
                if (pq->dtype != H3_BF16 || h3_st_entry_numel(pq) != K)
                    return H3_ERR(H3_ERR_FORMAT, "%s: '%s' must be BF16 [%lld], is %s %s", s->source,
                                  pq->name, (long long)K, h3_dtype_name(pq->dtype),
                                  h3_shape_str(pq->ndim, pq->shape, b, sizeof b));
                out->awq = 1;
                out->bytes += (int64_t)(pq->end - pq->begin);
            }
            out->full_precision_mm = m.full_precision_mm;
            out->shape[1] = K;
            out->bytes += (int64_t)(ws->end - ws->begin + s2->end - s2->begin);
            break;
        }
        default:
            return H3_ERR(H3_ERR_INTERNAL, "unexpected format");
    }
    set_label(out);
    return H3_OK;
}

/* Replaces a view's scales by an aligned owned copy when the mapped bytes are not 4-byte aligned. */
static h3_status f32_vector(h3_st_set *s, const h3_st_entry *e, const float **out, void **owner,
                            size_t *bytes) {
    const void *p;
    H3_TRY(h3_st_bytes(s, e, &p));
    size_t n = (size_t)(e->end - e->begin);
    *owner = NULL;
    *bytes = 0;
    if ((uintptr_t)p % 4 == 0) {
        *out = p;
        return H3_OK;
    }
    void *c = h3_malloc(n ? n : 1, H3_MEM_WEIGHTS);
    if (!c) return H3_ERR_NOMEM;
    memcpy(c, p, n);
    *out = c;
    *owner = c;
    *bytes = n;
    return H3_OK;
}

static h3_status get_gguf(h3_st_set *s, const h3_st_entry *e, const h3_qweight_info *info, h3_tensor *out) {
    if (info->fmt == H3_QF_NONE) { /* a plain dtype with its logical shape */
        H3_TRY(h3_st_tensor(s, e, out));
        if (info->gguf_reshaped) {
            out->ndim = info->ndim;
            int64_t st = 1;
            for (int d = info->ndim - 1; d >= 0; d--) {
                out->shape[d] = info->shape[d];
                out->stride[d] = st;
                st *= info->shape[d] ? info->shape[d] : 1;
            }
        }
        return H3_OK;
    }
    const void *p;
    H3_TRY(h3_st_bytes(s, e, &p));
    const int64_t rows = e->shape[0], row_bytes = e->shape[1];
    int64_t be = 1, bb = 1;
    h3_qformat_block(info->fmt, &be, &bb);
    const int64_t K = row_bytes / bb * be;
    h3_tensor v;
    int64_t shape[2] = {rows, K};
    H3_TRY(h3_tensor_wrap(&v, (void *)p, H3_PLACE_HOST, H3_U8, 2, shape));
    v.stride[0] = row_bytes;
    v.q.mode = H3_SCALE_FORMAT;
    v.q.format = info->fmt;
    if (!info->gguf_reshaped && info->ndim == 2) {
        *out = v;
        return H3_OK;
    }
    /* Flattened or higher-rank: decode into an owned f32 tensor of the true shape. */
    h3_status st = h3_tensor_alloc(out, H3_PLACE_HOST, H3_F32, info->ndim, info->shape, H3_MEM_WEIGHTS);
    if (st != H3_OK) return st;
    st = h3_tensor_rows_to_f32(&v, 0, rows, out->data);
    if (st != H3_OK) h3_tensor_free(out);
    return st;
}

h3_status h3_qweight_get(h3_st_set *s, const h3_gguf *g, const h3_st_entry *e, h3_tensor *out) {
    h3_qweight_info info;
    memset(out, 0, sizeof *out);
    H3_TRY(h3_qweight_info_of(s, g, e, &info));
    if (g) return get_gguf(s, e, &info, out);
    if (info.fmt == H3_QF_NONE) return h3_st_tensor(s, e, out);
    const h3_st_entry *ws = companion(s, e->name, ".weight_scale");
    switch (info.fmt) {
        case H3_QF_INT8: {
            H3_TRY(h3_st_tensor(s, e, out)); /* i8: always aligned, a view */
            if (info.per_row) {
                h3_status st = f32_vector(s, ws, &out->q.scales, &out->q.scales_owner, &out->q.scales_bytes);
                if (st != H3_OK) {
                    h3_tensor_free(out);
                    return st;
                }
                out->q.mode = H3_SCALE_ROW;
            } else {
                h3_status st = scalar_of(s, ws, "int8 weight scale", &out->q.scale);
                if (st != H3_OK) {
                    h3_tensor_free(out);
                    return st;
                }
                out->q.mode = H3_SCALE_TENSOR;
            }
            out->q.rot_group = info.rot_group;
            return H3_OK;
        }
        case H3_QF_FP8: {
            const h3_st_entry *sc = ws ? ws : companion(s, e->name, ".scale_weight");
            float v = 1.0f;
            if (sc) H3_TRY(scalar_of(s, sc, "fp8 weight scale", &v));
            H3_TRY(h3_st_tensor(s, e, out));
            out->q.mode = H3_SCALE_TENSOR;
            out->q.scale = v;
            return H3_OK;
        }
        case H3_QF_NVFP4: {
            const h3_st_entry *s2 = companion(s, e->name, ".weight_scale_2");
            const h3_st_entry *pq = companion(s, e->name, ".pre_quant_scale");
            const void *p, *sp, *pp = NULL;
            float v;
            H3_TRY(scalar_of(s, s2, "nvfp4 second-level scale", &v));
            H3_TRY(h3_st_bytes(s, e, &p));
            H3_TRY(h3_st_bytes(s, ws, &sp));
            if (pq) H3_TRY(h3_st_bytes(s, pq, &pp));
            int64_t shape[2] = {e->shape[0], info.shape[1]};
            H3_TRY(h3_tensor_wrap(out, (void *)p, H3_PLACE_HOST, H3_U8, 2, shape));
            out->stride[0] = e->shape[1];
            out->q.mode = H3_SCALE_FORMAT;
            out->q.format = H3_QF_NVFP4;
            out->q.scale = v;
            out->q.fmt_scales = sp;
            out->q.col_scale = pp;
            return H3_OK;
        }
        default:
            return H3_ERR(H3_ERR_INTERNAL, "unexpected format");
    }
}

h3_status h3_qweight_get_name(h3_st_set *s, const h3_gguf *g, const char *name, h3_tensor *out) {
    const h3_st_entry *e = h3_st_find(s, name);
    if (!e) {
        memset(out, 0, sizeof *out);
        return H3_ERR(H3_ERR_NOT_FOUND, "%s has no tensor '%s'", s->source ? s->source : "weights", name);
    }
    return h3_qweight_get(s, g, e, out);
}

static h3_status reader_info(void *user, const h3_st_entry *e, h3_wb_info *out) {
    h3_qweight_reader *r = user;
    h3_qweight_info qi;
    memset(out, 0, sizeof *out);
    H3_TRY(h3_qweight_info_of(r->set, r->g, e, &qi));
    out->dtype = qi.dtype;
    out->quantized = qi.fmt != H3_QF_NONE;
    out->ndim = qi.ndim;
    memcpy(out->shape, qi.shape, sizeof out->shape);
    snprintf(out->label, sizeof out->label, "%s", qi.label);
    return H3_OK;
}

static h3_status reader_get(void *user, const h3_st_entry *e, h3_tensor *out) {
    h3_qweight_reader *r = user;
    return h3_qweight_get(r->set, r->g, e, out);
}

void h3_qweight_reader_init(h3_qweight_reader *r, h3_st_set *s, const h3_gguf *g) {
    r->set = s;
    r->g = g;
    r->base.info = reader_info;
    r->base.get = reader_get;
    r->base.user = r;
}

h3_status h3_weights_open(const char *path, h3_st_set *set, h3_gguf **g) {
    *g = NULL;
    if (h3_path_is_gguf(path) && !h3_path_is_dir(path)) return h3_gguf_open(path, set, g);
    return h3_st_open(path, set);
}

/* ---- copies of quantized weights ------------------------------------------------------------------------
 */

static h3_status copy_bytes(h3_exec *ex, h3_place place, void *dst, const void *src, h3_place src_place,
                            int64_t n) {
    h3_tensor dt, st;
    H3_TRY(h3_tensor_wrap(&dt, dst, place, H3_U8, 1, &n));
    H3_TRY(h3_tensor_wrap(&st, (void *)src, src_place, H3_U8, 1, &n));
    return h3_copy(ex, &dt, &st);
}

h3_status h3_quant_copy_to(h3_exec *ex, const h3_tensor *src, h3_place place, h3_mem_category cat,
                           h3_tensor *out) {
    memset(out, 0, sizeof *out);
    h3_qaux parts[2];
    const int np = h3_quant_aux(src, parts);
    if (np < 0 || !src->data || (src->q.mode != H3_SCALE_FORMAT && !h3_tensor_is_contiguous(src)))
        return H3_ERR(H3_ERR_INVALID, "copying a quantized tensor: it must be a whole, contiguous tensor");
    const int64_t vb = (int64_t)h3_tensor_nbytes(src);
    int64_t off[2] = {0, 0}, total = 0;
    for (int i = 0; i < np; i++) {
        off[i] = total;
        total += (parts[i].bytes + 255) / 256 * 256;
    }
    h3_tensor t = *src;
    t.place = place;
    t.cat = cat;
    t.q.scales_owner = NULL;
    t.q.scales_bytes = 0;
    t.owned_bytes = (size_t)(vb > 0 ? vb : 1);
    t.data = t.owner = h3_place_alloc(place, t.owned_bytes, cat);
    if (!t.data)
        return H3_ERR(H3_ERR_NOMEM, "out of %s memory for a %lld-byte tensor", h3_place_name(place),
                      (long long)vb);
    h3_status st = vb > 0 ? copy_bytes(ex, place, t.data, src->data, src->place, vb) : H3_OK;
    void *copies[2] = {NULL, NULL};
    if (st == H3_OK && total) {
        t.q.scales_owner = h3_place_alloc(place, (size_t)total, cat);
        if (!t.q.scales_owner)
            st = H3_ERR(H3_ERR_NOMEM, "out of %s memory for %lld bytes of scales", h3_place_name(place),
                        (long long)total);
        else
            t.q.scales_bytes = (size_t)total;
        for (int i = 0; i < np && st == H3_OK; i++) {
            copies[i] = (uint8_t *)t.q.scales_owner + off[i];
            st = copy_bytes(ex, place, copies[i], parts[i].p, src->place, parts[i].bytes);
        }
        h3_quant_aux_rebind(&t, copies);
    }
    if (st == H3_OK) st = h3_exec_sync(ex);
    if (st != H3_OK) {
        h3_tensor_free(&t);
        return st;
    }
    *out = t;
    return H3_OK;
}

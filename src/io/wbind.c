/* One binder for every model's weight table (contract in wbind.h). */
#include "io/wbind.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

h3_wb_row h3_wb_row_make(const char *name, h3_tensor *dst, int ndim, int64_t d0, int64_t d1, int64_t d2,
                         int64_t d3, uint32_t dtypes, unsigned flags, const char *words, h3_wb_unit unit) {
    h3_wb_row r;
    memset(&r, 0, sizeof r);
    r.name = name;
    r.dst = dst;
    r.ndim = ndim;
    const int64_t d[4] = {d0, d1, d2, d3};
    for (int i = 0; i < 4 && i < ndim; i++) r.shape[i] = d[i];
    r.dtypes = dtypes;
    r.flags = flags;
    r.words = words;
    r.unit = unit;
    return r;
}

const char *h3_wb_unit_str(const h3_wbind *b, const h3_wb_unit *u, char *buf, size_t n) {
    if (u && u->kind)
        snprintf(buf, n, "%s %d", u->kind, u->index);
    else
        snprintf(buf, n, "the %s", b->model ? b->model : "model");
    return buf;
}

static const char *source_of(const h3_wbind *b) {
    if (b->source) return b->source;
    return b->set && b->set->source ? b->set->source : "weights";
}

static void full_name(const h3_wbind *b, const char *name, char *buf, size_t n) {
    snprintf(buf, n, "%s%s", b->prefix ? b->prefix : "", name);
}

/* " = [32, 64]" with "*" for free dims ("" when every dim is free); with H3_WB_NUMEL " = 32 values". */
static const char *need_str(const h3_wb_row *r, char *buf, size_t n) {
    if (r->flags & H3_WB_NUMEL) {
        snprintf(buf, n, " = %lld values", (long long)r->shape[0]);
        return buf;
    }
    int known = 0;
    for (int i = 0; i < r->ndim; i++) known |= r->shape[i] != H3_WB_ANY;
    buf[0] = 0;
    if (!known) return buf;
    size_t o = (size_t)snprintf(buf, n, " = [");
    for (int i = 0; i < r->ndim && o < n; i++) {
        if (r->shape[i] == H3_WB_ANY)
            o += (size_t)snprintf(buf + o, n - o, "%s*", i ? ", " : "");
        else
            o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)r->shape[i]);
    }
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

/* "f32, bf16 or f16" (and "or quantized") from a mask. */
static const char *dtypes_str(uint32_t mask, int quant, char *buf, size_t n) {
    int k = 0, total = 0;
    for (int t = 0; t < H3_DTYPE_COUNT; t++) total += (mask >> t) & 1;
    size_t o = 0;
    buf[0] = 0;
    /* the usual three in the order people say them */
    static const h3_dtype order[] = {H3_F32, H3_BF16, H3_F16, H3_F64, H3_F8_E4M3, H3_F8_E5M2, H3_I8,  H3_U8,
                                     H3_I16, H3_U16,  H3_I32, H3_U32, H3_I64,     H3_U64,     H3_BOOL};
    for (size_t i = 0; i < sizeof order / sizeof order[0] && o < n; i++) {
        if (!((mask >> order[i]) & 1)) continue;
        k++;
        const char *sep = k == 1 ? "" : (k == total && !quant ? " or " : ", ");
        o += (size_t)snprintf(buf + o, n - o, "%s%s", sep, h3_dtype_name(order[i]));
    }
    if (quant && o < n) snprintf(buf + o, n - o, "%sa quantized format", k ? " or " : "");
    return buf;
}

static uint32_t mask_of(const h3_wb_row *r) {
    return r->dtypes ? r->dtypes : H3_WB_FLOATS;
}

/* Stored dtypes of the quantized storages a reader understands: int8 codes, fp8 codes, packed bytes (nvfp4,
 * GGUF blocks). */
#define QUANT_STORAGE ((1u << H3_I8) | (1u << H3_F8_E4M3) | (1u << H3_U8))

h3_status h3_wb_lookup(const h3_wbind *b, const char *full, const h3_st_entry **out, h3_wb_info *info) {
    const h3_st_entry *e = h3_st_find(b->set, full);
    *out = e;
    memset(info, 0, sizeof *info);
    if (!e) return H3_OK;
    if (b->reader) return b->reader->info(b->reader->user, e, info);
    info->dtype = e->dtype;
    info->ndim = e->ndim;
    memcpy(info->shape, e->shape, sizeof info->shape);
    snprintf(info->label, sizeof info->label, "%s", h3_dtype_name(e->dtype));
    return H3_OK;
}

static int shape_ok(const h3_wb_row *r, const h3_wb_info *in) {
    if (r->flags & H3_WB_NUMEL) {
        int64_t n = 1;
        for (int i = 0; i < in->ndim; i++) n *= in->shape[i];
        return n == r->shape[0];
    }
    if (in->ndim != r->ndim) return 0;
    for (int i = 0; i < r->ndim; i++)
        if (r->shape[i] != H3_WB_ANY && in->shape[i] != r->shape[i]) return 0;
    return 1;
}

h3_status h3_wb_check(const h3_wbind *b, const h3_wb_row *r, const h3_st_entry **out, h3_wb_info *info_out) {
    char full[512], unit[96], a[128], c[128];
    h3_wb_info tmp, *info = info_out ? info_out : &tmp;
    if (out) *out = NULL;
    full_name(b, r->name, full, sizeof full);
    const h3_st_entry *e = h3_st_find(b->set, full);
    memset(info, 0, sizeof *info);
    if (!e) {
        if (r->flags & H3_WB_OPTIONAL) return H3_OK;
        return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s' is missing; %s needs it as %s%s", source_of(b), full,
                      h3_wb_unit_str(b, &r->unit, unit, sizeof unit), r->words ? r->words : "a weight",
                      need_str(r, a, sizeof a));
    }
    /* The stored dtype first: a reader is asked only about storages the role could accept. */
    const int quant_ok = (r->flags & H3_WB_QUANT) && b->reader;
    const uint32_t allowed = mask_of(r) | (quant_ok ? QUANT_STORAGE : 0);
    if (!((allowed >> e->dtype) & 1))
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; %s takes %s", source_of(b), full,
                      h3_dtype_name(e->dtype), h3_wb_unit_str(b, &r->unit, unit, sizeof unit),
                      dtypes_str(mask_of(r), quant_ok, a, sizeof a));
    H3_TRY(h3_wb_lookup(b, full, &e, info));
    if (info->quantized && !quant_ok)
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; %s takes %s", source_of(b), full,
                      info->label, h3_wb_unit_str(b, &r->unit, unit, sizeof unit),
                      dtypes_str(mask_of(r), 0, a, sizeof a));
    if (!info->quantized && !((mask_of(r) >> info->dtype) & 1))
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; %s takes %s", source_of(b), full,
                      h3_dtype_name(info->dtype), h3_wb_unit_str(b, &r->unit, unit, sizeof unit),
                      dtypes_str(mask_of(r), quant_ok, a, sizeof a));
    if (!shape_ok(r, info))
        return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s' has shape %s; %s needs %s%s%s%s", source_of(b), full,
                      h3_shape_str(info->ndim, info->shape, c, sizeof c),
                      h3_wb_unit_str(b, &r->unit, unit, sizeof unit), r->words ? r->words : "its shape",
                      need_str(r, a, sizeof a), b->context ? " " : "", b->context ? b->context : "");
    if (out) *out = e;
    return H3_OK;
}

h3_status h3_wb_bind(const h3_wbind *b, const h3_wb_row *r) {
    const h3_st_entry *e;
    if (r->dst) memset(r->dst, 0, sizeof *r->dst);
    H3_TRY(h3_wb_check(b, r, &e, NULL));
    if (!e || !r->dst) return H3_OK;
    h3_status st = b->reader ? b->reader->get(b->reader->user, e, r->dst) : h3_st_tensor(b->set, e, r->dst);
    if (st != H3_OK) {
        char unit[96];
        return h3_error_wrap(st, "%s: reading '%s'", h3_wb_unit_str(b, &r->unit, unit, sizeof unit), e->name);
    }
    return H3_OK;
}

h3_status h3_wb_check_rows(const h3_wbind *b, const h3_wb_row *rows, int n) {
    for (int i = 0; i < n; i++) H3_TRY(h3_wb_check(b, &rows[i], NULL, NULL));
    return H3_OK;
}

h3_status h3_wb_bind_rows(const h3_wbind *b, const h3_wb_row *rows, int n) {
    for (int i = 0; i < n; i++) {
        h3_status st = h3_wb_bind(b, &rows[i]);
        if (st != H3_OK) {
            for (int k = 0; k < i; k++)
                if (rows[k].dst) h3_tensor_free(rows[k].dst);
            return st;
        }
    }
    return H3_OK;
}

h3_status h3_wb_shape_error(const h3_wbind *b, const char *name, int ndim, const int64_t *have,
                            const h3_wb_unit *u, const char *need_fmt, ...) {
    char full[512], unit[96], a[128], need[512];
    va_list ap;
    va_start(ap, need_fmt);
    vsnprintf(need, sizeof need, need_fmt, ap);
    va_end(ap);
    full_name(b, name, full, sizeof full);
    return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s' has shape %s; %s needs %s%s%s", source_of(b), full,
                  h3_shape_str(ndim, have, a, sizeof a), h3_wb_unit_str(b, u, unit, sizeof unit), need,
                  b->context ? " " : "", b->context ? b->context : "");
}

h3_status h3_wb_missing_error(const h3_wbind *b, const char *name, const h3_wb_unit *u, const char *words) {
    char full[512], unit[96];
    full_name(b, name, full, sizeof full);
    return H3_ERR(H3_ERR_FORMAT, "%s: tensor '%s' is missing; %s needs it as %s", source_of(b), full,
                  h3_wb_unit_str(b, u, unit, sizeof unit), words);
}

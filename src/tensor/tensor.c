#include "tensor/tensor.h"

#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "tensor/qformat.h"

static const char *const g_place_names[H3_PLACE_COUNT] = {"host", "pinned host", "device"};

const char *h3_place_name(h3_place p) {
    return (unsigned)p < H3_PLACE_COUNT ? g_place_names[p] : "?";
}

static h3_place_allocator g_alloc[H3_PLACE_COUNT];

void h3_place_set_allocator(h3_place place, const h3_place_allocator *a) {
    if ((unsigned)place >= H3_PLACE_COUNT) return;
    if (a) g_alloc[place] = *a;
    else memset(&g_alloc[place], 0, sizeof g_alloc[place]);
}

void *h3_place_alloc(h3_place place, size_t bytes, h3_mem_category cat) {
    if (place == H3_PLACE_HOST || (place == H3_PLACE_PINNED && !g_alloc[place].alloc))
        return h3_malloc(bytes ? bytes : 1, cat);
    if (!g_alloc[place].alloc) {
        H3_ERR(H3_ERR_UNSUPPORTED, "no %s memory: this build or machine has no CUDA device", h3_place_name(place));
        return NULL;
    }
    if (h3_mem_should_fail()) {
        H3_ERR(H3_ERR_NOMEM, "out of %s memory: could not allocate %zu bytes for %s", h3_place_name(place), bytes,
               h3_mem_category_name(cat));
        return NULL;
    }
    void *p = g_alloc[place].alloc(bytes ? bytes : 1, g_alloc[place].user);
    if (!p) return NULL; /* the backend recorded the error */
    if (place == H3_PLACE_PINNED) h3_mem_account(cat, (int64_t)bytes);
    return p;
}

void h3_place_free(h3_place place, void *p, size_t bytes, h3_mem_category cat) {
    if (!p) return;
    if (place == H3_PLACE_HOST || (place == H3_PLACE_PINNED && !g_alloc[place].free)) {
        h3_free(p);
        return;
    }
    g_alloc[place].free(p, g_alloc[place].user);
    if (place == H3_PLACE_PINNED) h3_mem_account(cat, -(int64_t)bytes);
}

int64_t h3_tensor_numel(const h3_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t h3_tensor_nbytes(const h3_tensor *t) {
    if (t->q.mode == H3_SCALE_FORMAT && t->ndim == 2) return (size_t)(t->shape[0] * t->stride[0]);
    return (size_t)h3_tensor_numel(t) * h3_dtype_size(t->dtype);
}

int64_t h3_tensor_rows(const h3_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i + 1 < t->ndim; i++) n *= t->shape[i];
    return n;
}

int h3_tensor_is_contiguous(const h3_tensor *t) {
    if (h3_tensor_numel(t) == 0) return 1; /* no elements: nothing lies out of order */
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

int h3_tensor_is_rowwise(const h3_tensor *t, int64_t *ld) {
    if (t->ndim == 0) {
        if (ld) *ld = 1;
        return 1;
    }
    int last = t->ndim - 1;
    if (t->shape[last] != 1 && t->stride[last] != 1) return 0;
    /* The leading dims must collapse into one: the innermost of them with more than one index sets the row
     * stride, and each outer one must step over all of the inner ones. Dims of size 1 take no part. */
    int64_t row_stride = -1, span = 0;
    for (int i = last - 1; i >= 0; i--) {
        if (t->shape[i] == 1) continue;
        if (row_stride < 0) row_stride = t->stride[i];
        else if (t->stride[i] != span) return 0;
        span = t->stride[i] * t->shape[i];
    }
    if (ld) *ld = row_stride < 0 ? t->shape[last] : row_stride; /* one row: any stride works */
    return 1;
}

static h3_status set_shape(h3_tensor *t, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > H3_MAX_DIMS)
        return H3_ERR(H3_ERR_INVALID, "tensor rank %d is outside 0..%d", ndim, H3_MAX_DIMS);
    t->ndim = ndim;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] < 0) return H3_ERR(H3_ERR_INVALID, "negative dimension %lld", (long long)shape[i]);
        t->shape[i] = shape[i];
        t->stride[i] = s;
        if (!h3_mul_i64(s, shape[i] ? shape[i] : 1, &s))
            return H3_ERR(H3_ERR_INVALID, "tensor shape overflows 64-bit element counts");
    }
    return H3_OK;
}

h3_status h3_tensor_wrap(h3_tensor *t, void *data, h3_place place, h3_dtype dtype, int ndim, const int64_t *shape) {
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->place = place;
    t->data = data;
    return set_shape(t, ndim, shape);
}

h3_status h3_tensor_alloc(h3_tensor *t, h3_place place, h3_dtype dtype, int ndim, const int64_t *shape,
                          h3_mem_category cat) {
    H3_TRY(h3_tensor_wrap(t, NULL, place, dtype, ndim, shape));
    size_t n = 1, bytes;
    for (int i = 0; i < ndim; i++) {
        if (!h3_mul_size(n, (size_t)shape[i], &n)) return H3_ERR(H3_ERR_INVALID, "tensor size overflows");
    }
    if (!h3_mul_size(n, h3_dtype_size(dtype), &bytes)) return H3_ERR(H3_ERR_INVALID, "tensor size overflows");
    void *p = h3_place_alloc(place, bytes, cat);
    if (!p) return h3_last_error_code() ? h3_last_error_code() : H3_ERR_NOMEM;
    t->data = p;
    t->owner = p;
    t->cat = cat;
    t->owned_bytes = bytes;
    return H3_OK;
}

h3_status h3_tensor_alloc2(h3_tensor *t, h3_place place, h3_dtype dtype, int64_t d0, int64_t d1, h3_mem_category cat) {
    int64_t s[2] = {d0, d1};
    return h3_tensor_alloc(t, place, dtype, 2, s, cat);
}

void h3_tensor_free(h3_tensor *t) {
    if (!t) return;
    if (t->owner) h3_place_free(t->place, t->owner, t->owned_bytes, t->cat);
    if (t->q.scales_owner) h3_place_free(t->place, t->q.scales_owner, t->q.scales_bytes, t->cat);
    memset(t, 0, sizeof *t);
}

h3_status h3_tensor_narrow(const h3_tensor *t, int dim, int64_t start, int64_t len, h3_tensor *out) {
    if (dim < 0 || dim >= t->ndim)
        return H3_ERR(H3_ERR_INVALID, "narrow: dim %d out of range for a %d-d tensor", dim, t->ndim);
    if (start < 0 || len < 0 || start + len > t->shape[dim])
        return H3_ERR(H3_ERR_INVALID, "narrow: [%lld, %lld) outside dim %d of size %lld", (long long)start,
                      (long long)(start + len), dim, (long long)t->shape[dim]);
    h3_tensor v = *t;
    v.owner = NULL;
    v.owned_bytes = 0;
    v.q.scales_owner = NULL;
    v.shape[dim] = len;
    v.data = (uint8_t *)t->data + (size_t)(start * t->stride[dim]) * h3_dtype_size(t->dtype);
    if (t->q.mode == H3_SCALE_FORMAT) {
        /* Packed rows: only whole rows can be viewed; data moved by start row strides (bytes) above. */
        if (dim != 0 || t->ndim != 2)
            return H3_ERR(H3_ERR_UNSUPPORTED, "narrow of a packed-format tensor along dim %d (only rows are supported)",
                          dim);
        v.q.fmt_row0 = t->q.fmt_row0 + start;
    } else if (t->q.scales && dim == 0 && (t->q.mode == H3_SCALE_ROW || t->q.mode == H3_SCALE_BLOCK)) {
        int64_t per_row = 1;
        if (t->q.mode == H3_SCALE_BLOCK) per_row = h3_tensor_cols(t) / t->q.block;
        /* Rows of scales per index of dim 0: the product of the dims between the first and the last (no
         * division, so an empty dim 0 is fine). */
        int64_t rows_per = 1;
        for (int i = 1; i < t->ndim - 1; i++) rows_per *= t->shape[i];
        v.q.scales = t->q.scales + start * rows_per * per_row;
    } else if (t->q.scales && t->q.mode != H3_SCALE_TENSOR) {
        return H3_ERR(H3_ERR_UNSUPPORTED, "narrow of a quantized tensor along dim %d (only rows are supported)", dim);
    }
    *out = v;
    return H3_OK;
}

h3_status h3_tensor_reshape(const h3_tensor *t, int ndim, const int64_t *shape, h3_tensor *out) {
    if (!h3_tensor_is_contiguous(t)) return H3_ERR(H3_ERR_INVALID, "reshape needs a contiguous tensor");
    int64_t s[H3_MAX_DIMS], known = 1;
    int infer = -1;
    if (ndim < 0 || ndim > H3_MAX_DIMS) return H3_ERR(H3_ERR_INVALID, "reshape: rank %d out of range", ndim);
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) return H3_ERR(H3_ERR_INVALID, "reshape: more than one -1");
            infer = i;
        } else {
            known *= shape[i];
        }
    }
    int64_t n = h3_tensor_numel(t);
    if (infer >= 0) {
        if (known == 0 || n % known) return H3_ERR(H3_ERR_INVALID, "reshape: cannot infer a dim");
        s[infer] = n / known;
        known *= s[infer];
    }
    if (known != n)
        return H3_ERR(H3_ERR_INVALID, "reshape: %lld elements cannot take a shape of %lld", (long long)n,
                      (long long)known);
    h3_tensor v = *t;
    v.owner = NULL;
    v.owned_bytes = 0;
    v.q.scales_owner = NULL;
    H3_TRY(set_shape(&v, ndim, s));
    *out = v;
    return H3_OK;
}

const char *h3_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    if (n == 0) return buf;
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

const char *h3_tensor_shape_str(const h3_tensor *t, char *buf, size_t n) {
    return h3_shape_str(t->ndim, t->shape, buf, n);
}

int h3_tensor_same_shape(const h3_tensor *a, const h3_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

static h3_status packed_rows_to_f32(const h3_tensor *t, int64_t r0, int64_t n, float *dst);
static h3_status plain_rows_to_f32(const h3_tensor *t, int64_t r0, int64_t n, int64_t ld, float *dst);

h3_status h3_tensor_rows_to_f32(const h3_tensor *t, int64_t r0, int64_t n, float *dst) {
    int64_t ld;
    if (t->place == H3_PLACE_DEVICE) return H3_ERR(H3_ERR_INVALID, "rows_to_f32 needs host memory");
    if (!h3_tensor_is_rowwise(t, &ld)) return H3_ERR(H3_ERR_INVALID, "rows_to_f32 needs a row-wise tensor");
    int64_t cols = h3_tensor_cols(t), rows = h3_tensor_rows(t);
    if (r0 < 0 || n < 0 || r0 + n > rows) return H3_ERR(H3_ERR_INVALID, "rows_to_f32: rows out of range");
    if (t->q.rot_group && (!h3_convrot_group_ok(t->q.rot_group) || cols % t->q.rot_group))
        return H3_ERR(H3_ERR_INVALID, "ConvRot group %d must be a power of 4 dividing the %lld columns",
                      t->q.rot_group, (long long)cols);
    if (t->q.mode == H3_SCALE_FORMAT) {
        H3_TRY(packed_rows_to_f32(t, r0, n, dst));
    } else {
        H3_TRY(plain_rows_to_f32(t, r0, n, ld, dst));
    }
    for (int64_t r = 0; r < n; r++) {
        float *d = dst + r * cols;
        if (t->q.rot_group) h3_convrot_apply(d, cols, t->q.rot_group); /* W = (q·s)·H per group */
        if (t->q.col_scale)
            for (int64_t c = 0; c < cols; c++) {
                const uint8_t *b = t->q.col_scale + 2 * c;
                d[c] *= h3_bf16_to_f32((uint16_t)(b[0] | b[1] << 8));
            }
    }
    return H3_OK;
}

/* Rows of an H3_SCALE_FORMAT tensor (NVFP4, GGUF blocks) through their format's row decoder. */
static h3_status packed_rows_to_f32(const h3_tensor *t, int64_t r0, int64_t n, float *dst) {
    const h3_qformat f = (h3_qformat)t->q.format;
    const int64_t K = h3_tensor_cols(t);
    const int64_t ld = t->ndim == 2 ? t->stride[0] : 0;
    const int64_t rb = h3_qformat_row_bytes(f, K); /* -1 unless f is a packed format */
    if (t->dtype != H3_U8 || t->ndim != 2 || t->stride[1] != 1 || rb < 0 || ld < rb)
        return H3_ERR(H3_ERR_INVALID,
                      "a %s tensor of %lld columns needs 2-D U8 rows of %lld bytes (row stride %lld)",
                      h3_qformat_name(f), (long long)K, (long long)rb, (long long)ld);
    if (f == H3_QF_NVFP4 && !t->q.fmt_scales)
        return H3_ERR(H3_ERR_INVALID, "an nvfp4 tensor needs its block scales");
    const h3_qrow_decoder to_f32 = h3_qformat_get_traits(f)->to_f32;
    h3_qrow_side side = {t->q.fmt_scales, 0, t->q.scale};
    for (int64_t r = 0; r < n; r++) {
        side.row = t->q.fmt_row0 + r0 + r;
        to_f32((const uint8_t *)t->data + (r0 + r) * ld, dst + r * K, K, &side);
    }
    return H3_OK;
}

static h3_status plain_rows_to_f32(const h3_tensor *t, int64_t r0, int64_t n, int64_t ld, float *dst) {
    int64_t cols = h3_tensor_cols(t);
    size_t es = h3_dtype_size(t->dtype);
    /* int8 and fp8 e4m3 values through their formats' decoders; the other dtypes (fp8 e5m2 with a legacy
     * scale included) by their conversion. */
    const h3_qrow_decoder fmt_to_f32 = t->dtype == H3_I8        ? h3_qformat_get_traits(H3_QF_INT8)->to_f32
                                       : t->dtype == H3_F8_E4M3 ? h3_qformat_get_traits(H3_QF_FP8)->to_f32
                                                                : NULL;
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *src = (const uint8_t *)t->data + (size_t)((r0 + r) * ld) * es;
        float *d = dst + r * cols;
        if (t->dtype == H3_I8 && t->q.mode == H3_SCALE_NONE)
            return H3_ERR(H3_ERR_INVALID, "an i8 tensor used as weights needs scales");
        if (fmt_to_f32) {
            fmt_to_f32(src, d, cols, NULL);
        } else if (!h3_convert_to_f32(t->dtype, src, d, (size_t)cols)) {
            return H3_ERR(H3_ERR_UNSUPPORTED, "cannot convert %s values to f32", h3_dtype_name(t->dtype));
        }
        switch (t->q.mode) {
            case H3_SCALE_NONE: break;
            case H3_SCALE_TENSOR:
                for (int64_t c = 0; c < cols; c++) d[c] *= t->q.scale;
                break;
            case H3_SCALE_ROW: {
                float s = t->q.scales[r0 + r];
                for (int64_t c = 0; c < cols; c++) d[c] *= s;
                break;
            }
            case H3_SCALE_BLOCK: {
                int64_t nb = cols / t->q.block;
                const float *s = t->q.scales + (r0 + r) * nb;
                for (int64_t c = 0; c < cols; c++) d[c] *= s[c / t->q.block];
                break;
            }
            case H3_SCALE_FORMAT: return H3_ERR(H3_ERR_INTERNAL, "packed rows reached the plain conversion");
        }
    }
    return H3_OK;
}

/* Op validation and dispatch by place. Shape rules live here, once, for every backend. */
#include "tensor/ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/cancel.h"

extern const h3_backend h3_cpu_backend;
extern void h3_cpu_set_threads(int n);

static const h3_backend *g_device_backend;

static const char *const g_op_names[H3_OP_COUNT] = {
    [H3_OP_GEMM] = "gemm",
    [H3_OP_RMS_NORM] = "rms_norm",
    [H3_OP_LAYER_NORM] = "layer_norm",
    [H3_OP_GROUP_NORM] = "group_norm",
    [H3_OP_UNARY] = "unary",
    [H3_OP_SNAKE] = "snake",
    [H3_OP_SOFTMAX] = "softmax",
    [H3_OP_ROPE] = "rope",
    [H3_OP_ATTENTION] = "attention",
    [H3_OP_CONV1D] = "conv1d",
    [H3_OP_CONV_TRANSPOSE1D] = "conv_transpose1d",
    [H3_OP_CONV3D] = "conv3d",
    [H3_OP_GATHER_ROWS] = "gather_rows",
    [H3_OP_SCATTER_ROWS] = "scatter_rows",
    [H3_OP_BINARY] = "binary",
    [H3_OP_SCALE] = "scale",
    [H3_OP_SWIGLU] = "swiglu",
    [H3_OP_MODULATE] = "modulate",
    [H3_OP_GATED_ADD] = "gated_add",
    [H3_OP_CONVERT] = "convert",
    [H3_OP_FILL] = "fill",
    [H3_OP_CLAMP] = "clamp",
    [H3_OP_RANDOM] = "random_uniform",
    [H3_OP_RMS_NORM_MODULATE] = "rms_norm_modulate",
    [H3_OP_QK_NORM_ROPE] = "qk_norm_rope",
    [H3_OP_SNAKE_AA] = "snake_aa",
    [H3_OP_ATTENTION_SPARSE] = "attention_sparse",
};

const char *h3_op_name(h3_op_id op) {
    return (unsigned)op < H3_OP_COUNT ? g_op_names[op] : "?";
}

h3_status h3_exec_init(h3_exec *ex, int threads) {
    memset(ex, 0, sizeof *ex);
    H3_TRY(h3_threads_resolve(threads, &threads));
    ex->threads = threads;
    H3_TRY(h3_pool_create(threads, &ex->pool));
    h3_cpu_set_threads(threads);
    return H3_OK;
}

void h3_exec_free(h3_exec *ex) {
    h3_pool_free(ex->pool);
    memset(ex, 0, sizeof *ex);
}

void h3_backend_set_device(const h3_backend *be) {
    g_device_backend = be;
}

const h3_backend *h3_backend_for_place(h3_place place) {
    if (place == H3_PLACE_DEVICE) return g_device_backend;
    return &h3_cpu_backend;
}

h3_status h3_missing_kernel(h3_op_id op, const char *backend, const char *what, h3_dtype dtype) {
    return H3_ERR(H3_ERR_UNSUPPORTED, "op '%s' has no %s kernel for %s of dtype %s", h3_op_name(op), backend, what,
                  h3_dtype_name(dtype));
}

/* ---- validation helpers ---------------------------------------------------------------------------------- */

static const char *shp(const h3_tensor *t, char *buf) {
    return h3_tensor_shape_str(t, buf, 96);
}

/* All non-NULL tensors must be on one side (host/pinned vs device). Returns the backend or records an error. */
static h3_status pick_backend(h3_op_id op, const h3_backend **out, int n, const h3_tensor *const *ts) {
    int side = -1;
    h3_place first = H3_PLACE_HOST;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        int s = ts[i]->place == H3_PLACE_DEVICE;
        if (side < 0) {
            side = s;
            first = ts[i]->place;
        } else if (s != side) {
            return H3_ERR(H3_ERR_INVALID, "op '%s': tensors on different places (%s and %s); copy them to one first",
                          h3_op_name(op), h3_place_name(first), h3_place_name(ts[i]->place));
        }
        if (!ts[i]->data && h3_tensor_numel(ts[i]) > 0)
            return H3_ERR(H3_ERR_INVALID, "op '%s': argument %d has no data", h3_op_name(op), i);
    }
    const h3_backend *be = h3_backend_for_place(side == 1 ? H3_PLACE_DEVICE : H3_PLACE_HOST);
    if (!be)
        return H3_ERR(H3_ERR_UNSUPPORTED, "op '%s': tensors are on the device but no device backend is active",
                      h3_op_name(op));
    *out = be;
    return H3_OK;
}

#define PICK(op, ...)                                                                                          \
    const h3_backend *be = NULL;                                                                               \
    {                                                                                                          \
        const h3_tensor *ts__[] = {__VA_ARGS__};                                                               \
        H3_TRY(pick_backend(op, &be, (int)(sizeof ts__ / sizeof ts__[0]), ts__));                              \
    }

#define NEED_FN(op, fn)                                                                                        \
    if (!be->fn) return H3_ERR(H3_ERR_UNSUPPORTED, "op '%s' has no %s kernel", h3_op_name(op), be->name);

static h3_status need_rowwise(h3_op_id op, const char *what, const h3_tensor *t) {
    if (!h3_tensor_is_rowwise(t, NULL))
        return H3_ERR(H3_ERR_INVALID, "op '%s': %s must have a contiguous last dim and a constant row stride",
                      h3_op_name(op), what);
    return H3_OK;
}

static h3_status need_vec(h3_op_id op, const char *what, const h3_tensor *t, int64_t n) {
    if (!t) return H3_OK;
    if (h3_tensor_numel(t) != n || !h3_tensor_is_contiguous(t)) {
        char b[96];
        return H3_ERR(H3_ERR_INVALID, "op '%s': %s must be a contiguous vector of %lld values, got %s", h3_op_name(op),
                      what, (long long)n, shp(t, b));
    }
    return H3_OK;
}

static h3_status need_same(h3_op_id op, const h3_tensor *a, const h3_tensor *b) {
    if (h3_tensor_numel(a) != h3_tensor_numel(b) || h3_tensor_cols(a) != h3_tensor_cols(b)) {
        char x[96], y[96];
        return H3_ERR(H3_ERR_INVALID, "op '%s': shapes differ: %s vs %s", h3_op_name(op), shp(a, x), shp(b, y));
    }
    return H3_OK;
}

static h3_status need_index(h3_op_id op, const h3_tensor *idx, int64_t n) {
    if (idx->dtype != H3_I32 && idx->dtype != H3_I64)
        return H3_ERR(H3_ERR_INVALID, "op '%s': indices must be i32 or i64, got %s", h3_op_name(op),
                      h3_dtype_name(idx->dtype));
    return need_vec(op, "the index", idx, n);
}

/* ---- profiling ---------------------------------------------------------------------------------------------- */

#include <time.h>

static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

_Static_assert(H3_OP_COUNT <= 32, "h3_exec's profile arrays hold 32 ops");

/* Runs one backend call, timing it when the exec profiles. A requested stop (h3_cancel_request) is seen
 * before the op starts and after it ends: long CPU kernels stop between their pieces, leaving their output
 * unfinished, and the op reports H3_ERR_INTERRUPTED so nothing uses it. */
#define RUN(op, call)                                                                                        \
    do {                                                                                                     \
        H3_TRY(h3_cancel_check());                                                                           \
        h3_status s__;                                                                                       \
        if (!ex->profile) {                                                                                  \
            s__ = (call);                                                                                    \
        } else {                                                                                             \
            h3_exec_sync(ex);                                                                                \
            double t0__ = prof_now();                                                                        \
            s__ = (call);                                                                                    \
            h3_exec_sync(ex);                                                                                \
            ex->prof_s[op] += prof_now() - t0__;                                                             \
            ex->prof_n[op]++;                                                                                \
        }                                                                                                    \
        return s__ == H3_OK ? h3_cancel_check() : s__;                                                       \
    } while (0)

/* ---- ops ----------------------------------------------------------------------------------------------- */

h3_status h3_op_gemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *bias,
                     unsigned flags) {
    PICK(H3_OP_GEMM, y, x, w, bias);
    NEED_FN(H3_OP_GEMM, gemm);
    char a[96], b[96], c[96];
    if (w->ndim != 2) return H3_ERR(H3_ERR_INVALID, "op 'gemm': weight must be 2-D [N, K], got %s", shp(w, a));
    int64_t M = h3_tensor_rows(x), K = h3_tensor_cols(x), N = w->shape[0];
    if (w->shape[1] != K || h3_tensor_rows(y) != M || h3_tensor_cols(y) != N)
        return H3_ERR(H3_ERR_INVALID, "op 'gemm': y %s = x %s · wᵀ with w %s: shapes do not chain", shp(y, a),
                      shp(x, b), shp(w, c));
    H3_TRY(need_rowwise(H3_OP_GEMM, "x", x));
    H3_TRY(need_rowwise(H3_OP_GEMM, "y", y));
    H3_TRY(need_rowwise(H3_OP_GEMM, "w", w));
    H3_TRY(need_vec(H3_OP_GEMM, "bias", bias, N));
    if (y->data == x->data || y->data == w->data)
        return H3_ERR(H3_ERR_INVALID, "op 'gemm': the output must not alias an input");
    if (w->q.mode == H3_SCALE_BLOCK && (w->q.block <= 0 || K % w->q.block))
        return H3_ERR(H3_ERR_INVALID, "op 'gemm': block scale size %d does not divide K = %lld", w->q.block,
                      (long long)K);
    RUN(H3_OP_GEMM, be->gemm(ex, y, x, w, bias, flags));
}

h3_status h3_op_rms_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, float eps) {
    PICK(H3_OP_RMS_NORM, y, x, w);
    NEED_FN(H3_OP_RMS_NORM, rms_norm);
    H3_TRY(need_same(H3_OP_RMS_NORM, y, x));
    H3_TRY(need_rowwise(H3_OP_RMS_NORM, "x", x));
    H3_TRY(need_rowwise(H3_OP_RMS_NORM, "y", y));
    H3_TRY(need_vec(H3_OP_RMS_NORM, "weight", w, h3_tensor_cols(x)));
    RUN(H3_OP_RMS_NORM, be->rms_norm(ex, y, x, w, eps));
}

h3_status h3_op_layer_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                           float eps) {
    PICK(H3_OP_LAYER_NORM, y, x, w, b);
    NEED_FN(H3_OP_LAYER_NORM, layer_norm);
    H3_TRY(need_same(H3_OP_LAYER_NORM, y, x));
    H3_TRY(need_rowwise(H3_OP_LAYER_NORM, "x", x));
    H3_TRY(need_rowwise(H3_OP_LAYER_NORM, "y", y));
    H3_TRY(need_vec(H3_OP_LAYER_NORM, "weight", w, h3_tensor_cols(x)));
    H3_TRY(need_vec(H3_OP_LAYER_NORM, "bias", b, h3_tensor_cols(x)));
    RUN(H3_OP_LAYER_NORM, be->layer_norm(ex, y, x, w, b, eps));
}

h3_status h3_op_group_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, int groups, const h3_tensor *w,
                           const h3_tensor *b, float eps) {
    PICK(H3_OP_GROUP_NORM, y, x, w, b);
    NEED_FN(H3_OP_GROUP_NORM, group_norm);
    char s[96];
    if (x->ndim != 3 || x->stride[2] != 1 || y->stride[2] != 1 || !h3_tensor_same_shape(x, y))
        return H3_ERR(
            H3_ERR_INVALID,
            "op 'group_norm': x and y must be [B, C, S] of one shape with each S row contiguous, got %s",
            shp(x, s));
    if (y->data == x->data ? y->stride[0] != x->stride[0] || y->stride[1] != x->stride[1] : 0)
        return H3_ERR(H3_ERR_INVALID, "op 'group_norm': y may be x itself, not another view of its memory");
    if (groups <= 0 || x->shape[1] % groups)
        return H3_ERR(H3_ERR_INVALID, "op 'group_norm': %d groups do not divide %lld channels", groups,
                      (long long)x->shape[1]);
    H3_TRY(need_vec(H3_OP_GROUP_NORM, "weight", w, x->shape[1]));
    H3_TRY(need_vec(H3_OP_GROUP_NORM, "bias", b, x->shape[1]));
    RUN(H3_OP_GROUP_NORM, be->group_norm(ex, y, x, groups, w, b, eps));
}

h3_status h3_op_unary(h3_exec *ex, h3_tensor *y, const h3_tensor *x, h3_unary kind) {
    PICK(H3_OP_UNARY, y, x);
    NEED_FN(H3_OP_UNARY, unary);
    if ((unsigned)kind >= H3_UNARY_COUNT) return H3_ERR(H3_ERR_INVALID, "op 'unary': unknown kind %d", (int)kind);
    H3_TRY(need_same(H3_OP_UNARY, y, x));
    H3_TRY(need_rowwise(H3_OP_UNARY, "x", x));
    H3_TRY(need_rowwise(H3_OP_UNARY, "y", y));
    RUN(H3_OP_UNARY, be->unary(ex, y, x, kind));
}

h3_status h3_op_snake(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *alpha, const h3_tensor *beta,
                      unsigned flags) {
    PICK(H3_OP_SNAKE, y, x, alpha, beta);
    NEED_FN(H3_OP_SNAKE, snake);
    char s[96];
    if (x->ndim != 2) return H3_ERR(H3_ERR_INVALID, "op 'snake': x must be [C, T], got %s", shp(x, s));
    H3_TRY(need_same(H3_OP_SNAKE, y, x));
    H3_TRY(need_rowwise(H3_OP_SNAKE, "x", x));
    H3_TRY(need_rowwise(H3_OP_SNAKE, "y", y));
    if (!alpha) return H3_ERR(H3_ERR_INVALID, "op 'snake': alpha is required");
    H3_TRY(need_vec(H3_OP_SNAKE, "alpha", alpha, x->shape[0]));
    H3_TRY(need_vec(H3_OP_SNAKE, "beta", beta, x->shape[0]));
    RUN(H3_OP_SNAKE, be->snake(ex, y, x, alpha, beta, flags));
}

h3_status h3_op_snake_aa(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *alpha, const h3_tensor *beta,
                         const h3_tensor *up, const h3_tensor *down, unsigned flags) {
    PICK(H3_OP_SNAKE_AA, y, x, alpha, beta, up, down);
    NEED_FN(H3_OP_SNAKE_AA, snake_aa);
    char s1[96], s2[96];
    if ((x->ndim != 2 && x->ndim != 3) || !h3_tensor_same_shape(x, y) || !h3_tensor_is_contiguous(x) ||
        !h3_tensor_is_contiguous(y))
        return H3_ERR(H3_ERR_INVALID,
                      "op 'snake_aa': x and y must be contiguous [C, T] or [B, C, T] of one shape; got %s and %s",
                      shp(x, s1), shp(y, s2));
    if (y->data == x->data && h3_tensor_numel(x) > 0)
        return H3_ERR(H3_ERR_INVALID, "op 'snake_aa': the output must not alias the input");
    if (!alpha || !up || !down) return H3_ERR(H3_ERR_INVALID, "op 'snake_aa': alpha and both filters are required");
    const int64_t C = x->shape[x->ndim - 2], K = h3_tensor_numel(up);
    H3_TRY(need_vec(H3_OP_SNAKE_AA, "alpha", alpha, C));
    H3_TRY(need_vec(H3_OP_SNAKE_AA, "beta", beta, C));
    if (K < 2 || K > H3_SNAKE_AA_MAX_TAPS || K % 2)
        return H3_ERR(H3_ERR_INVALID, "op 'snake_aa': the filters need an even count of taps from 2 to %d, got %lld",
                      H3_SNAKE_AA_MAX_TAPS, (long long)K);
    H3_TRY(need_vec(H3_OP_SNAKE_AA, "the upsampling filter", up, K));
    H3_TRY(need_vec(H3_OP_SNAKE_AA, "the downsampling filter", down, K));
    RUN(H3_OP_SNAKE_AA, be->snake_aa(ex, y, x, alpha, beta, up, down, flags));
}

h3_status h3_op_softmax(h3_exec *ex, h3_tensor *y, const h3_tensor *x) {
    PICK(H3_OP_SOFTMAX, y, x);
    NEED_FN(H3_OP_SOFTMAX, softmax);
    H3_TRY(need_same(H3_OP_SOFTMAX, y, x));
    H3_TRY(need_rowwise(H3_OP_SOFTMAX, "x", x));
    H3_TRY(need_rowwise(H3_OP_SOFTMAX, "y", y));
    RUN(H3_OP_SOFTMAX, be->softmax(ex, y, x));
}

h3_status h3_op_clamp(h3_exec *ex, h3_tensor *y, const h3_tensor *x, float lo, float hi) {
    PICK(H3_OP_CLAMP, y, x);
    NEED_FN(H3_OP_CLAMP, clamp);
    H3_TRY(need_same(H3_OP_CLAMP, y, x));
    H3_TRY(need_rowwise(H3_OP_CLAMP, "x", x));
    H3_TRY(need_rowwise(H3_OP_CLAMP, "y", y));
    if (!(lo <= hi)) return H3_ERR(H3_ERR_INVALID, "op 'clamp': lo %g > hi %g", (double)lo, (double)hi);
    RUN(H3_OP_CLAMP, be->clamp(ex, y, x, lo, hi));
}

static h3_status need_heads(h3_op_id op, const char *what, const h3_tensor *t) {
    char s[96];
    if (t->ndim != 3 || t->stride[2] != 1 || t->stride[1] != t->shape[2])
        return H3_ERR(H3_ERR_INVALID, "op '%s': %s must be [S, H, D] with the last two dims contiguous, got %s",
                      h3_op_name(op), what, shp(t, s));
    return H3_OK;
}

h3_status h3_op_rope(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *cos, const h3_tensor *sin) {
    PICK(H3_OP_ROPE, y, x, cos, sin);
    NEED_FN(H3_OP_ROPE, rope);
    H3_TRY(need_heads(H3_OP_ROPE, "x", x));
    H3_TRY(need_heads(H3_OP_ROPE, "y", y));
    if (!h3_tensor_same_shape(x, y)) return H3_ERR(H3_ERR_INVALID, "op 'rope': x and y shapes differ");
    char s[96];
    int64_t S = x->shape[0], D = x->shape[2];
    if (cos->ndim != 2 || !h3_tensor_same_shape(cos, sin) || cos->shape[0] != S || cos->shape[1] % 2 ||
        cos->shape[1] > D || cos->dtype != H3_F32 || sin->dtype != H3_F32)
        return H3_ERR(H3_ERR_INVALID, "op 'rope': cos/sin must be f32 [S=%lld, R] with R even and R <= %lld, got %s",
                      (long long)S, (long long)D, shp(cos, s));
    H3_TRY(need_rowwise(H3_OP_ROPE, "cos", cos));
    H3_TRY(need_rowwise(H3_OP_ROPE, "sin", sin));
    RUN(H3_OP_ROPE, be->rope(ex, y, x, cos, sin));
}

/* What both attention ops ask of their operands: [S, H, D] rows, an output apart from the inputs. */
static h3_status need_attention_io(h3_op_id op, const h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                                   const h3_tensor *v) {
    H3_TRY(need_heads(op, "q", q));
    H3_TRY(need_heads(op, "k", k));
    H3_TRY(need_heads(op, "v", v));
    H3_TRY(need_heads(op, "o", o));
    if (o->data == q->data || o->data == k->data || o->data == v->data)
        return H3_ERR(H3_ERR_INVALID, "op '%s': the output must not alias an input", h3_op_name(op));
    return H3_OK;
}

h3_status h3_op_attention(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k, const h3_tensor *v,
                          float scale, unsigned flags) {
    PICK(H3_OP_ATTENTION, o, q, k, v);
    NEED_FN(H3_OP_ATTENTION, attention);
    H3_TRY(need_attention_io(H3_OP_ATTENTION, o, q, k, v));
    char a[96], b[96];
    if (!h3_tensor_same_shape(o, q) || !h3_tensor_same_shape(k, v) || k->shape[2] != q->shape[2] ||
        k->shape[1] == 0 || q->shape[1] % k->shape[1])
        return H3_ERR(H3_ERR_INVALID, "op 'attention': q %s and k/v %s do not fit (D equal, Hq a multiple of Hk)",
                      shp(q, a), shp(k, b));
    RUN(H3_OP_ATTENTION, be->attention(ex, o, q, k, v, scale, flags));
}

h3_status h3_op_attention_sparse(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                                 const h3_tensor *v, float scale, const h3_sparse_attn *p) {
    PICK(H3_OP_ATTENTION_SPARSE, o, q, k, v);
    NEED_FN(H3_OP_ATTENTION_SPARSE, attention_sparse);
    H3_TRY(need_attention_io(H3_OP_ATTENTION_SPARSE, o, q, k, v));
    char a[96], b[96];
    if (!h3_tensor_same_shape(o, q) || !h3_tensor_same_shape(k, q) || !h3_tensor_same_shape(v, q))
        return H3_ERR(H3_ERR_INVALID, "op 'attention_sparse' is self-attention: q %s and k/v %s must be one shape",
                      shp(q, a), shp(k, b));
    if (!p || !isfinite(p->tau))
        return H3_ERR(H3_ERR_INVALID, "op 'attention_sparse': the threshold tau must be a finite number");
    RUN(H3_OP_ATTENTION_SPARSE, be->attention_sparse(ex, o, q, k, v, scale, p));
}

/* A conv's x and y: [C, T] or [B, C, T], same rank and batch, contiguous and apart; w [·, ·, K] contiguous. */
static h3_status need_conv_io(h3_op_id op, const h3_tensor *x, const h3_tensor *w, const h3_tensor *y) {
    char s1[96], s2[96], s3[96];
    if ((x->ndim != 2 && x->ndim != 3) || y->ndim != x->ndim || w->ndim != 3 || !h3_tensor_is_contiguous(x) ||
        !h3_tensor_is_contiguous(w) || !h3_tensor_is_contiguous(y) || (x->ndim == 3 && y->shape[0] != x->shape[0]))
        return H3_ERR(H3_ERR_INVALID,
                      "op '%s': x [Cin, T] or [B, Cin, T], w [%s, K], y of x's rank and batch, all contiguous; got "
                      "x %s, w %s, y %s",
                      h3_op_name(op), op == H3_OP_CONV1D ? "Cout, Cin/groups" : "Cin, Cout/groups", shp(x, s1),
                      shp(w, s2), shp(y, s3));
    if (y->data == x->data && h3_tensor_numel(x) > 0)
        return H3_ERR(H3_ERR_INVALID, "op '%s': the output must not alias the input", h3_op_name(op));
    return H3_OK;
}

h3_status h3_op_conv1d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                       const h3_conv1d_params *p) {
    PICK(H3_OP_CONV1D, y, x, w, b);
    NEED_FN(H3_OP_CONV1D, conv1d);
    char s1[96], s2[96];
    H3_TRY(need_conv_io(H3_OP_CONV1D, x, w, y));
    const int o = x->ndim - 2; /* dims of channels and time: o, o + 1 */
    int g = p->groups > 0 ? p->groups : 1;
    int64_t cin = x->shape[o], cout = w->shape[0], K = w->shape[2];
    if (p->stride < 1 || p->dilation < 1 || p->pad_left < 0 || p->pad_right < 0 || cin % g || cout % g ||
        w->shape[1] != cin / g || y->shape[o] != cout)
        return H3_ERR(H3_ERR_INVALID, "op 'conv1d': channels or parameters do not fit: x %s, w %s, groups %d",
                      shp(x, s1), shp(w, s2), g);
    int64_t span = (int64_t)p->dilation * (K - 1) + 1, tin = x->shape[o + 1] + p->pad_left + p->pad_right;
    if (tin < span) return H3_ERR(H3_ERR_INVALID, "op 'conv1d': input of %lld steps is shorter than the kernel span %lld",
                                  (long long)tin, (long long)span);
    int64_t tout = (tin - span) / p->stride + 1;
    if (y->shape[o + 1] != tout)
        return H3_ERR(H3_ERR_INVALID, "op 'conv1d': y must have %lld steps, has %lld", (long long)tout,
                      (long long)y->shape[o + 1]);
    if (p->pad_mode == H3_PAD_REFLECT && (p->pad_left >= x->shape[o + 1] || p->pad_right >= x->shape[o + 1]))
        return H3_ERR(H3_ERR_INVALID, "op 'conv1d': reflect padding must be shorter than the input");
    H3_TRY(need_vec(H3_OP_CONV1D, "bias", b, cout));
    RUN(H3_OP_CONV1D, be->conv1d(ex, y, x, w, b, p));
}

h3_status h3_op_conv_transpose1d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                                 const h3_tensor *b, const h3_convt1d_params *p) {
    PICK(H3_OP_CONV_TRANSPOSE1D, y, x, w, b);
    NEED_FN(H3_OP_CONV_TRANSPOSE1D, conv_transpose1d);
    char s1[96], s2[96];
    H3_TRY(need_conv_io(H3_OP_CONV_TRANSPOSE1D, x, w, y));
    const int o = x->ndim - 2;
    int g = p->groups > 0 ? p->groups : 1, dil = p->dilation > 0 ? p->dilation : 1;
    int64_t cin = x->shape[o], K = w->shape[2], cout = w->shape[1] * g;
    if (p->stride < 1 || p->padding < 0 || p->output_padding < 0 || w->shape[0] != cin || cin % g ||
        y->shape[o] != cout)
        return H3_ERR(H3_ERR_INVALID, "op 'conv_transpose1d': channels or parameters do not fit: x %s, w %s",
                      shp(x, s1), shp(w, s2));
    int64_t tout = (x->shape[o + 1] - 1) * p->stride - 2 * (int64_t)p->padding + (int64_t)dil * (K - 1) +
                   p->output_padding + 1;
    if (tout <= 0 || y->shape[o + 1] != tout)
        return H3_ERR(H3_ERR_INVALID, "op 'conv_transpose1d': y must have %lld steps, has %lld", (long long)tout,
                      (long long)y->shape[o + 1]);
    H3_TRY(need_vec(H3_OP_CONV_TRANSPOSE1D, "bias", b, cout));
    RUN(H3_OP_CONV_TRANSPOSE1D, be->conv_transpose1d(ex, y, x, w, b, p));
}

h3_status h3_op_conv3d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                       const h3_conv3d_params *p) {
    PICK(H3_OP_CONV3D, y, x, w, b);
    NEED_FN(H3_OP_CONV3D, conv3d);
    char s1[96], s2[96];
    if (x->ndim != 4 || w->ndim != 5 || y->ndim != 4 || !h3_tensor_is_contiguous(x) || !h3_tensor_is_contiguous(w) ||
        !h3_tensor_is_contiguous(y) || w->shape[1] != x->shape[0] || y->shape[0] != w->shape[0])
        return H3_ERR(H3_ERR_INVALID, "op 'conv3d': x [Cin, T, H, W], w [Cout, Cin, kt, kh, kw] contiguous; got %s, %s",
                      shp(x, s1), shp(w, s2));
    for (int a = 0; a < 3; a++) {
        int64_t n = x->shape[1 + a], k = w->shape[2 + a];
        if (p->stride[a] < 1 || p->pad[a][0] < 0 || p->pad[a][1] < 0)
            return H3_ERR(H3_ERR_INVALID, "op 'conv3d': bad stride or padding on axis %d", a);
        if (p->pad_mode[a] == H3_PAD_REFLECT && (p->pad[a][0] >= n || p->pad[a][1] >= n))
            return H3_ERR(H3_ERR_INVALID, "op 'conv3d': reflect padding on axis %d must be shorter than the input", a);
        int64_t len = n + p->pad[a][0] + p->pad[a][1];
        if (len < k) return H3_ERR(H3_ERR_INVALID, "op 'conv3d': axis %d is shorter than the kernel", a);
        int64_t o = (len - k) / p->stride[a] + 1;
        if (y->shape[1 + a] != o)
            return H3_ERR(H3_ERR_INVALID, "op 'conv3d': output axis %d must have %lld steps, has %lld", a, (long long)o,
                          (long long)y->shape[1 + a]);
    }
    H3_TRY(need_vec(H3_OP_CONV3D, "bias", b, w->shape[0]));
    RUN(H3_OP_CONV3D, be->conv3d(ex, y, x, w, b, p));
}

h3_status h3_op_gather_rows(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *idx) {
    PICK(H3_OP_GATHER_ROWS, y, x, idx);
    NEED_FN(H3_OP_GATHER_ROWS, gather_rows);
    H3_TRY(need_rowwise(H3_OP_GATHER_ROWS, "x", x));
    H3_TRY(need_rowwise(H3_OP_GATHER_ROWS, "y", y));
    if (h3_tensor_cols(x) != h3_tensor_cols(y) || x->dtype != y->dtype)
        return H3_ERR(H3_ERR_INVALID, "op 'gather_rows': x and y need the same row width and dtype");
    H3_TRY(need_index(H3_OP_GATHER_ROWS, idx, h3_tensor_rows(y)));
    RUN(H3_OP_GATHER_ROWS, be->gather_rows(ex, y, x, idx));
}

h3_status h3_op_scatter_rows(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *idx) {
    PICK(H3_OP_SCATTER_ROWS, y, x, idx);
    NEED_FN(H3_OP_SCATTER_ROWS, scatter_rows);
    H3_TRY(need_rowwise(H3_OP_SCATTER_ROWS, "x", x));
    H3_TRY(need_rowwise(H3_OP_SCATTER_ROWS, "y", y));
    if (h3_tensor_cols(x) != h3_tensor_cols(y) || x->dtype != y->dtype)
        return H3_ERR(H3_ERR_INVALID, "op 'scatter_rows': x and y need the same row width and dtype");
    H3_TRY(need_index(H3_OP_SCATTER_ROWS, idx, h3_tensor_rows(x)));
    RUN(H3_OP_SCATTER_ROWS, be->scatter_rows(ex, y, x, idx));
}

h3_status h3_op_binary(h3_exec *ex, h3_tensor *y, const h3_tensor *a, const h3_tensor *b, h3_binary kind) {
    PICK(H3_OP_BINARY, y, a, b);
    NEED_FN(H3_OP_BINARY, binary);
    if ((unsigned)kind >= H3_BINARY_COUNT) return H3_ERR(H3_ERR_INVALID, "op 'binary': unknown kind %d", (int)kind);
    H3_TRY(need_same(H3_OP_BINARY, y, a));
    H3_TRY(need_rowwise(H3_OP_BINARY, "a", a));
    H3_TRY(need_rowwise(H3_OP_BINARY, "y", y));
    H3_TRY(need_rowwise(H3_OP_BINARY, "b", b));
    int64_t nb = h3_tensor_numel(b);
    if (!(nb == 1 || (nb == h3_tensor_cols(a) && h3_tensor_rows(b) == 1) ||
          (nb == h3_tensor_numel(a) && h3_tensor_cols(b) == h3_tensor_cols(a)))) {
        char s1[96], s2[96];
        return H3_ERR(H3_ERR_INVALID, "op 'binary': b %s does not broadcast to a %s", shp(b, s1), shp(a, s2));
    }
    RUN(H3_OP_BINARY, be->binary(ex, y, a, b, kind));
}

h3_status h3_op_scale(h3_exec *ex, h3_tensor *y, const h3_tensor *x, float alpha, float beta) {
    PICK(H3_OP_SCALE, y, x);
    NEED_FN(H3_OP_SCALE, scale);
    H3_TRY(need_same(H3_OP_SCALE, y, x));
    H3_TRY(need_rowwise(H3_OP_SCALE, "x", x));
    H3_TRY(need_rowwise(H3_OP_SCALE, "y", y));
    RUN(H3_OP_SCALE, be->scale(ex, y, x, alpha, beta));
}

h3_status h3_op_swiglu(h3_exec *ex, h3_tensor *y, const h3_tensor *x, int gate_first) {
    PICK(H3_OP_SWIGLU, y, x);
    NEED_FN(H3_OP_SWIGLU, swiglu);
    H3_TRY(need_rowwise(H3_OP_SWIGLU, "x", x));
    H3_TRY(need_rowwise(H3_OP_SWIGLU, "y", y));
    if (h3_tensor_rows(x) != h3_tensor_rows(y) || h3_tensor_cols(x) != 2 * h3_tensor_cols(y)) {
        char s1[96], s2[96];
        return H3_ERR(H3_ERR_INVALID, "op 'swiglu': x %s must be [M, 2F] for y %s [M, F]", shp(x, s1), shp(y, s2));
    }
    if (y->data == x->data) return H3_ERR(H3_ERR_INVALID, "op 'swiglu': the output must not alias the input");
    RUN(H3_OP_SWIGLU, be->swiglu(ex, y, x, gate_first));
}

static h3_status need_table(h3_op_id op, const char *what, const h3_tensor *t, const h3_tensor *x,
                            const h3_tensor *idx) {
    H3_TRY(need_rowwise(op, what, t));
    int64_t C = h3_tensor_cols(x);
    if (h3_tensor_cols(t) != C)
        return H3_ERR(H3_ERR_INVALID, "op '%s': %s rows have %lld values, x rows %lld", h3_op_name(op), what,
                      (long long)h3_tensor_cols(t), (long long)C);
    if (!idx && h3_tensor_rows(t) != 1)
        return H3_ERR(H3_ERR_INVALID, "op '%s': %s has %lld rows: an index is needed", h3_op_name(op), what,
                      (long long)h3_tensor_rows(t));
    return H3_OK;
}

h3_status h3_op_modulate(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *shift,
                         const h3_tensor *scale, const h3_tensor *idx) {
    PICK(H3_OP_MODULATE, y, x, shift, scale, idx);
    NEED_FN(H3_OP_MODULATE, modulate);
    H3_TRY(need_same(H3_OP_MODULATE, y, x));
    H3_TRY(need_rowwise(H3_OP_MODULATE, "x", x));
    H3_TRY(need_rowwise(H3_OP_MODULATE, "y", y));
    H3_TRY(need_table(H3_OP_MODULATE, "shift", shift, x, idx));
    H3_TRY(need_table(H3_OP_MODULATE, "scale", scale, x, idx));
    if (h3_tensor_rows(shift) != h3_tensor_rows(scale))
        return H3_ERR(H3_ERR_INVALID, "op 'modulate': shift and scale tables differ in rows");
    if (idx) H3_TRY(need_index(H3_OP_MODULATE, idx, h3_tensor_rows(x)));
    RUN(H3_OP_MODULATE, be->modulate(ex, y, x, shift, scale, idx));
}

h3_status h3_op_gated_add(h3_exec *ex, h3_tensor *x, const h3_tensor *h, const h3_tensor *gate,
                          const h3_tensor *idx) {
    PICK(H3_OP_GATED_ADD, x, h, gate, idx);
    NEED_FN(H3_OP_GATED_ADD, gated_add);
    H3_TRY(need_same(H3_OP_GATED_ADD, x, h));
    H3_TRY(need_rowwise(H3_OP_GATED_ADD, "x", x));
    H3_TRY(need_rowwise(H3_OP_GATED_ADD, "h", h));
    H3_TRY(need_table(H3_OP_GATED_ADD, "gate", gate, x, idx));
    if (idx) H3_TRY(need_index(H3_OP_GATED_ADD, idx, h3_tensor_rows(x)));
    RUN(H3_OP_GATED_ADD, be->gated_add(ex, x, h, gate, idx));
}

h3_status h3_op_convert(h3_exec *ex, h3_tensor *y, const h3_tensor *x) {
    PICK(H3_OP_CONVERT, y, x);
    NEED_FN(H3_OP_CONVERT, convert);
    H3_TRY(need_same(H3_OP_CONVERT, y, x));
    H3_TRY(need_rowwise(H3_OP_CONVERT, "x", x));
    H3_TRY(need_rowwise(H3_OP_CONVERT, "y", y));
    RUN(H3_OP_CONVERT, be->convert(ex, y, x));
}

h3_status h3_op_fill(h3_exec *ex, h3_tensor *y, float value) {
    PICK(H3_OP_FILL, y);
    NEED_FN(H3_OP_FILL, fill);
    H3_TRY(need_rowwise(H3_OP_FILL, "y", y));
    RUN(H3_OP_FILL, be->fill(ex, y, value));
}

h3_status h3_op_random_uniform(h3_exec *ex, h3_tensor *y, uint64_t seed, float lo, float hi) {
    PICK(H3_OP_RANDOM, y);
    NEED_FN(H3_OP_RANDOM, random_uniform);
    H3_TRY(need_rowwise(H3_OP_RANDOM, "y", y));
    if (!(lo <= hi)) return H3_ERR(H3_ERR_INVALID, "op 'random_uniform': lo %g > hi %g", (double)lo, (double)hi);
    RUN(H3_OP_RANDOM, be->random_uniform(ex, y, seed, lo, hi));
}

h3_status h3_op_rms_norm_modulate(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, float eps,
                                  const h3_tensor *shift, const h3_tensor *scale, const h3_tensor *idx) {
    PICK(H3_OP_RMS_NORM_MODULATE, y, x, w, shift, scale, idx);
    NEED_FN(H3_OP_RMS_NORM_MODULATE, rms_norm_modulate);
    H3_TRY(need_same(H3_OP_RMS_NORM_MODULATE, y, x));
    H3_TRY(need_rowwise(H3_OP_RMS_NORM_MODULATE, "x", x));
    H3_TRY(need_rowwise(H3_OP_RMS_NORM_MODULATE, "y", y));
    H3_TRY(need_vec(H3_OP_RMS_NORM_MODULATE, "weight", w, h3_tensor_cols(x)));
    H3_TRY(need_table(H3_OP_RMS_NORM_MODULATE, "shift", shift, x, idx));
    H3_TRY(need_table(H3_OP_RMS_NORM_MODULATE, "scale", scale, x, idx));
    if (h3_tensor_rows(shift) != h3_tensor_rows(scale))
        return H3_ERR(H3_ERR_INVALID, "op 'rms_norm_modulate': shift and scale tables differ in rows");
    if (idx) H3_TRY(need_index(H3_OP_RMS_NORM_MODULATE, idx, h3_tensor_rows(x)));
    RUN(H3_OP_RMS_NORM_MODULATE, be->rms_norm_modulate(ex, y, x, w, eps, shift, scale, idx));
}

h3_status h3_op_qk_norm_rope(h3_exec *ex, h3_tensor *x, const h3_tensor *w, float eps, const h3_tensor *cos,
                             const h3_tensor *sin) {
    PICK(H3_OP_QK_NORM_ROPE, x, w, cos, sin);
    NEED_FN(H3_OP_QK_NORM_ROPE, qk_norm_rope);
    H3_TRY(need_heads(H3_OP_QK_NORM_ROPE, "x", x));
    H3_TRY(need_vec(H3_OP_QK_NORM_ROPE, "weight", w, x->shape[2]));
    char s[96];
    int64_t S = x->shape[0], D = x->shape[2];
    if (cos->ndim != 2 || !h3_tensor_same_shape(cos, sin) || cos->shape[0] != S || cos->shape[1] % 2 ||
        cos->shape[1] > D || cos->dtype != H3_F32 || sin->dtype != H3_F32)
        return H3_ERR(H3_ERR_INVALID, "op 'qk_norm_rope': cos/sin must be f32 [S=%lld, R] with R even and R <= %lld, "
                      "got %s", (long long)S, (long long)D, shp(cos, s));
    H3_TRY(need_rowwise(H3_OP_QK_NORM_ROPE, "cos", cos));
    H3_TRY(need_rowwise(H3_OP_QK_NORM_ROPE, "sin", sin));
    RUN(H3_OP_QK_NORM_ROPE, be->qk_norm_rope(ex, x, w, eps, cos, sin));
}

h3_status h3_copy(h3_exec *ex, h3_tensor *dst, const h3_tensor *src) {
    if (dst->dtype != src->dtype || h3_tensor_numel(dst) != h3_tensor_numel(src) ||
        h3_tensor_cols(dst) != h3_tensor_cols(src)) {
        char a[96], b[96];
        return H3_ERR(H3_ERR_INVALID, "copy: %s %s to %s %s: dtype or shape differ", h3_dtype_name(src->dtype),
                      shp(src, a), h3_dtype_name(dst->dtype), shp(dst, b));
    }
    H3_TRY(need_rowwise(H3_OP_CONVERT, "copy source", src));
    H3_TRY(need_rowwise(H3_OP_CONVERT, "copy destination", dst));
    if (src->place != H3_PLACE_DEVICE && dst->place != H3_PLACE_DEVICE) return h3_cpu_backend.convert(ex, dst, src);
    const h3_backend *be = h3_backend_for_place(H3_PLACE_DEVICE);
    if (!be || !be->copy) return H3_ERR(H3_ERR_UNSUPPORTED, "copy to or from the device: no device backend is active");
    return be->copy(ex, dst, src);
}

h3_status h3_exec_sync(h3_exec *ex) {
    const h3_backend *be = h3_backend_for_place(H3_PLACE_DEVICE);
    if (!be || !be->sync || !ex->cuda) return H3_OK;
    return be->sync(ex);
}

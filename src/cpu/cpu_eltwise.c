/* Row-wise CPU kernels: norms, activations, softmax, rotary embedding, row gathers, elementwise arithmetic.
 * Each parallelizes over rows with the exec's thread pool. Statistics accumulate in double. */
#include <math.h>
#include <string.h>

#include "cpu/cpu_internal.h"

typedef struct {
    const h3_tensor *x, *y;
    int64_t ldx, ldy, C;
    const float *w, *b;
    float eps, p0, p1;
    int kind;
} row_ctx;

#define ROWS_GRAIN(C) ((C) >= 4096 ? 1 : (4096 / ((C) > 0 ? (C) : 1)) + 1)

/* ---- rms / layer norm ------------------------------------------------------------------------------------ */

static void rms_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    row_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        const float *x = cpu_row(c->x, c->ldx, r);
        float *y = cpu_row(c->y, c->ldy, r);
        double ss = 0;
        for (int64_t i = 0; i < c->C; i++) ss += (double)x[i] * x[i];
        float inv = (float)(1.0 / sqrt(ss / (double)c->C + c->eps));
        if (c->w)
            for (int64_t i = 0; i < c->C; i++) y[i] = x[i] * inv * c->w[i];
        else
            for (int64_t i = 0; i < c->C; i++) y[i] = x[i] * inv;
    }
}

static h3_status cpu_rms_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, float eps) {
    H3_TRY(cpu_need_f32(H3_OP_RMS_NORM, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_RMS_NORM, "y", y));
    float *wf;
    H3_TRY(cpu_vec_f32(H3_OP_RMS_NORM, "weight", w, &wf));
    row_ctx c = {x, y, cpu_ld(x), cpu_ld(y), h3_tensor_cols(x), wf, NULL, eps, 0, 0, 0};
    h3_parallel_for(ex->pool, h3_tensor_rows(x), ROWS_GRAIN(c.C), rms_rows, &c);
    h3_free(wf);
    return H3_OK;
}

static void ln_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    row_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        const float *x = cpu_row(c->x, c->ldx, r);
        float *y = cpu_row(c->y, c->ldy, r);
        double s = 0, ss = 0;
        for (int64_t i = 0; i < c->C; i++) s += x[i];
        double mean = s / (double)c->C;
        for (int64_t i = 0; i < c->C; i++) ss += ((double)x[i] - mean) * ((double)x[i] - mean);
        float inv = (float)(1.0 / sqrt(ss / (double)c->C + c->eps)), m = (float)mean;
        for (int64_t i = 0; i < c->C; i++) {
            float v = (x[i] - m) * inv;
            if (c->w) v *= c->w[i];
            if (c->b) v += c->b[i];
            y[i] = v;
        }
    }
}

static h3_status cpu_layer_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                                const h3_tensor *b, float eps) {
    H3_TRY(cpu_need_f32(H3_OP_LAYER_NORM, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_LAYER_NORM, "y", y));
    float *wf = NULL, *bf = NULL;
    h3_status st = cpu_vec_f32(H3_OP_LAYER_NORM, "weight", w, &wf);
    if (st == H3_OK) st = cpu_vec_f32(H3_OP_LAYER_NORM, "bias", b, &bf);
    if (st == H3_OK) {
        row_ctx c = {x, y, cpu_ld(x), cpu_ld(y), h3_tensor_cols(x), wf, bf, eps, 0, 0, 0};
        h3_parallel_for(ex->pool, h3_tensor_rows(x), ROWS_GRAIN(c.C), ln_rows, &c);
    }
    h3_free(wf);
    h3_free(bf);
    return st;
}

typedef struct {
    const float *x;
    float *y;
    int64_t C, S, G;
    int64_t xb, xc, yb, yc; /* strides of B and C (S rows are contiguous) */
    const float *w, *b;
    float eps;
} gn_ctx;

static void gn_groups(void *p, int64_t gb, int64_t ge, int tid) {
    (void)tid;
    gn_ctx *c = p;
    int64_t cpg = c->C / c->G;
    for (int64_t bg = gb; bg < ge; bg++) {
        int64_t bi = bg / c->G, g = bg % c->G;
        const float *x = c->x + bi * c->xb + g * cpg * c->xc;
        float *y = c->y + bi * c->yb + g * cpg * c->yc;
        int64_t n = cpg * c->S;
        double s = 0, ss = 0;
        for (int64_t ch = 0; ch < cpg; ch++)
            for (int64_t i = 0; i < c->S; i++) s += x[ch * c->xc + i];
        double mean = s / (double)n;
        for (int64_t ch = 0; ch < cpg; ch++)
            for (int64_t i = 0; i < c->S; i++)
                ss += ((double)x[ch * c->xc + i] - mean) * ((double)x[ch * c->xc + i] - mean);
        float inv = (float)(1.0 / sqrt(ss / (double)n + c->eps)), m = (float)mean;
        for (int64_t ch = 0; ch < cpg; ch++) {
            float ww = c->w ? c->w[g * cpg + ch] : 1.0f, bb = c->b ? c->b[g * cpg + ch] : 0.0f;
            for (int64_t i = 0; i < c->S; i++) y[ch * c->yc + i] = (x[ch * c->xc + i] - m) * inv * ww + bb;
        }
    }
}

static h3_status cpu_group_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, int groups, const h3_tensor *w,
                                const h3_tensor *b, float eps) {
    H3_TRY(cpu_need_f32(H3_OP_GROUP_NORM, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_GROUP_NORM, "y", y));
    float *wf = NULL, *bf = NULL;
    h3_status st = cpu_vec_f32(H3_OP_GROUP_NORM, "weight", w, &wf);
    if (st == H3_OK) st = cpu_vec_f32(H3_OP_GROUP_NORM, "bias", b, &bf);
    if (st == H3_OK) {
        gn_ctx c = {x->data,      y->data,      x->shape[1],  x->shape[2], groups, x->stride[0],
                    x->stride[1], y->stride[0], y->stride[1], wf,          bf,     eps};
        h3_parallel_for(ex->pool, x->shape[0] * groups, 1, gn_groups, &c);
    }
    h3_free(wf);
    h3_free(bf);
    return st;
}

/* ---- activations ----------------------------------------------------------------------------------------- */

static void unary_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    row_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        const float *x = cpu_row(c->x, c->ldx, r);
        float *y = cpu_row(c->y, c->ldy, r);
        switch ((h3_unary)c->kind) {
            case H3_UNARY_SILU:
                for (int64_t i = 0; i < c->C; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
                break;
            case H3_UNARY_GELU:
                for (int64_t i = 0; i < c->C; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
                break;
            case H3_UNARY_GELU_TANH:
                for (int64_t i = 0; i < c->C; i++) {
                    float v = x[i];
                    y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
                }
                break;
            case H3_UNARY_TANH:
                for (int64_t i = 0; i < c->C; i++) y[i] = tanhf(x[i]);
                break;
            case H3_UNARY_SIGMOID:
                for (int64_t i = 0; i < c->C; i++) y[i] = 1.0f / (1.0f + expf(-x[i]));
                break;
            case H3_UNARY_EXP:
                for (int64_t i = 0; i < c->C; i++) y[i] = expf(x[i]);
                break;
            default: break;
        }
    }
}

static h3_status cpu_unary(h3_exec *ex, h3_tensor *y, const h3_tensor *x, h3_unary kind) {
    H3_TRY(cpu_need_f32(H3_OP_UNARY, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_UNARY, "y", y));
    row_ctx c = {x, y, cpu_ld(x), cpu_ld(y), h3_tensor_cols(x), NULL, NULL, 0, 0, 0, (int)kind};
    h3_parallel_for(ex->pool, h3_tensor_rows(x), ROWS_GRAIN(c.C), unary_rows, &c);
    return H3_OK;
}

static void snake_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    row_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        const float *x = cpu_row(c->x, c->ldx, r);
        float *y = cpu_row(c->y, c->ldy, r);
        float a = c->w[r], bt = c->b ? c->b[r] : c->w[r];
        if (c->kind) {
            a = expf(a);
            bt = expf(bt);
        }
        float inv = 1.0f / (bt + 1e-9f);
        for (int64_t i = 0; i < c->C; i++) {
            float s = sinf(a * x[i]);
            y[i] = x[i] + inv * s * s;
        }
    }
}

static h3_status cpu_snake(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *alpha,
                           const h3_tensor *beta, unsigned flags) {
    H3_TRY(cpu_need_f32(H3_OP_SNAKE, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_SNAKE, "y", y));
    float *af = NULL, *bf = NULL;
    h3_status st = cpu_vec_f32(H3_OP_SNAKE, "alpha", alpha, &af);
    if (st == H3_OK) st = cpu_vec_f32(H3_OP_SNAKE, "beta", beta, &bf);
    if (st == H3_OK) {
        row_ctx c = {x, y, cpu_ld(x), cpu_ld(y), h3_tensor_cols(x), af, bf, 0, 0, 0,
                     (flags & H3_SNAKE_LOGSCALE) ? 1 : 0};
        h3_parallel_for(ex->pool, h3_tensor_rows(x), 1, snake_rows, &c);
    }
    h3_free(af);
    h3_free(bf);
    return st;
}

/* ---- anti-aliased snake (h3_op_snake_aa) ------------------------------------------------------------------ */

#define AA_TILE 256 /* outputs per work item */
#define AA_XM   (H3_SNAKE_AA_MAX_TAPS / 2 + 1) /* input halo each side of a tile: K/2 + 1 for every K allowed */

typedef struct {
    const float *x;
    float *y;
    int64_t C, L, ntiles;
    const float *al, *be;
    float fu[H3_SNAKE_AA_MAX_TAPS], fd[H3_SNAKE_AA_MAX_TAPS];
    int K, logscale;
} aa_ctx;

/* One tile of AA_TILE outputs of one row per item: the inputs it reads (replicate-clamped), the 2·tile + K − 2
 * upsampled and activated values its outputs read (at clamped positions: the replicate padding of the
 * downsampler), then the outputs. The CUDA kernel (cuda_conv.cu) does the same per thread block. */
static void aa_tiles(void *p, int64_t ib, int64_t ie, int tid) {
    (void)tid;
    const aa_ctx *c = p;
    const int K = c->K, H = K / 2 - 1;
    const int64_t L = c->L;
    float xs[AA_TILE + 2 * AA_XM], vs[2 * AA_TILE + H3_SNAKE_AA_MAX_TAPS];
    for (int64_t it = ib; it < ie; it++) {
        const int64_t row = it / c->ntiles, n0 = (it % c->ntiles) * AA_TILE;
        const int64_t tn = L - n0 < AA_TILE ? L - n0 : AA_TILE, x0 = n0 - AA_XM; /* xs[i] = x[clamp(x0 + i)] */
        const float *x = c->x + row * L;
        float *y = c->y + row * L;
        const int64_t ch = row % c->C;
        float a = c->al[ch], b = c->be ? c->be[ch] : c->al[ch];
        if (c->logscale) {
            a = expf(a);
            b = expf(b);
        }
        const float inv = 1.0f / (b + 1e-9f);
        for (int64_t i = 0; i < tn + 2 * AA_XM; i++) {
            int64_t s = x0 + i;
            xs[i] = x[s < 0 ? 0 : s >= L ? L - 1 : s];
        }
        const int64_t nv = 2 * tn + K - 2;
        for (int64_t jj = 0; jj < nv; jj++) {
            int64_t j = 2 * n0 - H + jj;
            j = j < 0 ? 0 : j > 2 * L - 1 ? 2 * L - 1 : j;
            float u = 0.0f;
            for (int m = (int)((j + H) & 1); m < K; m += 2) u += c->fu[m] * xs[(j + H - m) / 2 - x0];
            u *= 2.0f;
            const float sn = sinf(a * u);
            vs[jj] = u + inv * sn * sn;
        }
        for (int64_t n = 0; n < tn; n++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += c->fd[k] * vs[2 * n + k];
            y[n0 + n] = acc;
        }
    }
}

int64_t h3_cpu_snake_aa_scratch_bytes(int64_t C) {
    return 2 * C * (int64_t)sizeof(float); /* alpha and beta as f32 (the filters are copied onto the stack) */
}

static h3_status cpu_snake_aa(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *alpha,
                              const h3_tensor *beta, const h3_tensor *up, const h3_tensor *down, unsigned flags) {
    H3_TRY(cpu_need_f32(H3_OP_SNAKE_AA, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_SNAKE_AA, "y", y));
    aa_ctx c;
    memset(&c, 0, sizeof c);
    c.K = (int)h3_tensor_numel(up);
    if (up->q.mode != H3_SCALE_NONE || down->q.mode != H3_SCALE_NONE ||
        !h3_convert_to_f32(up->dtype, up->data, c.fu, (size_t)c.K) ||
        !h3_convert_to_f32(down->dtype, down->data, c.fd, (size_t)c.K))
        return h3_missing_kernel(H3_OP_SNAKE_AA, CPU_NAME, "filters", up->dtype);
    float *af = NULL, *bf = NULL;
    h3_status st = cpu_vec_f32(H3_OP_SNAKE_AA, "alpha", alpha, &af);
    if (st == H3_OK) st = cpu_vec_f32(H3_OP_SNAKE_AA, "beta", beta, &bf);
    if (st == H3_OK) {
        c.x = x->data;
        c.y = y->data;
        c.C = x->shape[x->ndim - 2];
        c.L = x->shape[x->ndim - 1];
        c.ntiles = (c.L + AA_TILE - 1) / AA_TILE;
        c.al = af;
        c.be = bf;
        c.logscale = (flags & H3_SNAKE_LOGSCALE) ? 1 : 0;
        h3_parallel_for(ex->pool, h3_tensor_rows(x) * c.ntiles, 4, aa_tiles, &c);
    }
    h3_free(af);
    h3_free(bf);
    return st;
}

static void softmax_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    row_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        const float *x = cpu_row(c->x, c->ldx, r);
        float *y = cpu_row(c->y, c->ldy, r);
        float m = -INFINITY;
        for (int64_t i = 0; i < c->C; i++) m = x[i] > m ? x[i] : m;
        double s = 0;
        for (int64_t i = 0; i < c->C; i++) {
            y[i] = expf(x[i] - m);
            s += y[i];
        }
        float inv = (float)(1.0 / s);
        for (int64_t i = 0; i < c->C; i++) y[i] *= inv;
    }
}

static h3_status cpu_softmax(h3_exec *ex, h3_tensor *y, const h3_tensor *x) {
    H3_TRY(cpu_need_f32(H3_OP_SOFTMAX, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_SOFTMAX, "y", y));
    row_ctx c = {x, y, cpu_ld(x), cpu_ld(y), h3_tensor_cols(x), NULL, NULL, 0, 0, 0, 0};
    h3_parallel_for(ex->pool, h3_tensor_rows(x), ROWS_GRAIN(c.C), softmax_rows, &c);
    return H3_OK;
}

static void clamp_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    row_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        const float *x = cpu_row(c->x, c->ldx, r);
        float *y = cpu_row(c->y, c->ldy, r);
        for (int64_t i = 0; i < c->C; i++) y[i] = x[i] < c->p0 ? c->p0 : (x[i] > c->p1 ? c->p1 : x[i]);
    }
}

static h3_status cpu_clamp(h3_exec *ex, h3_tensor *y, const h3_tensor *x, float lo, float hi) {
    H3_TRY(cpu_need_f32(H3_OP_CLAMP, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_CLAMP, "y", y));
    row_ctx c = {x, y, cpu_ld(x), cpu_ld(y), h3_tensor_cols(x), NULL, NULL, 0, lo, hi, 0};
    h3_parallel_for(ex->pool, h3_tensor_rows(x), ROWS_GRAIN(c.C), clamp_rows, &c);
    return H3_OK;
}

/* ---- rotary ---------------------------------------------------------------------------------------------- */

typedef struct {
    const h3_tensor *x, *y, *cos, *sin;
    int64_t H, D, R, ldcs_c, ldcs_s;
} rope_ctx;

static void rope_rows(void *p, int64_t sb, int64_t se, int tid) {
    (void)tid;
    rope_ctx *c = p;
    int64_t half = c->R / 2;
    for (int64_t s = sb; s < se; s++) {
        const float *cs = (const float *)c->cos->data + s * c->ldcs_c;
        const float *sn = (const float *)c->sin->data + s * c->ldcs_s;
        for (int64_t h = 0; h < c->H; h++) {
            const float *x = (const float *)c->x->data + s * c->x->stride[0] + h * c->D;
            float *y = (float *)c->y->data + s * c->y->stride[0] + h * c->D;
            for (int64_t i = 0; i < half; i++) {
                float a = x[i], b = x[i + half];
                y[i] = a * cs[i] - b * sn[i];
                y[i + half] = b * cs[i + half] + a * sn[i + half];
            }
            if (y != x)
                for (int64_t i = c->R; i < c->D; i++) y[i] = x[i];
        }
    }
}

static h3_status cpu_rope(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *cos,
                          const h3_tensor *sin) {
    H3_TRY(cpu_need_f32(H3_OP_ROPE, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_ROPE, "y", y));
    rope_ctx c = {x, y, cos, sin, x->shape[1], x->shape[2], cos->shape[1], cpu_ld(cos), cpu_ld(sin)};
    h3_parallel_for(ex->pool, x->shape[0], 16, rope_rows, &c);
    return H3_OK;
}

/* ---- rows ------------------------------------------------------------------------------------------------ */

typedef struct {
    const h3_tensor *x, *y, *idx;
    int64_t ldx, ldy;
    size_t row_bytes, es;
    int scatter;
} rows_ctx;

static void move_rows(void *p, int64_t b, int64_t e, int tid) {
    (void)tid;
    rows_ctx *c = p;
    for (int64_t i = b; i < e; i++) {
        int64_t j = cpu_index(c->idx, i);
        int64_t src = c->scatter ? i : j, dst = c->scatter ? j : i;
        memcpy((uint8_t *)c->y->data + (size_t)(dst * c->ldy) * c->es,
               (const uint8_t *)c->x->data + (size_t)(src * c->ldx) * c->es, c->row_bytes);
    }
}

static h3_status cpu_move_rows(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *idx, int scatter) {
    h3_op_id op = scatter ? H3_OP_SCATTER_ROWS : H3_OP_GATHER_ROWS;
    int64_t n = h3_tensor_numel(idx);
    H3_TRY(cpu_check_indices(op, idx, n, scatter ? h3_tensor_rows(y) : h3_tensor_rows(x)));
    size_t es = h3_dtype_size(x->dtype);
    rows_ctx c = {x, y, idx, cpu_ld(x), cpu_ld(y), (size_t)h3_tensor_cols(x) * es, es, scatter};
    h3_parallel_for(ex->pool, n, 64, move_rows, &c);
    return H3_OK;
}

static h3_status cpu_gather_rows(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *idx) {
    return cpu_move_rows(ex, y, x, idx, 0);
}
static h3_status cpu_scatter_rows(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *idx) {
    return cpu_move_rows(ex, y, x, idx, 1);
}

/* ---- elementwise ----------------------------------------------------------------------------------------- */

typedef struct {
    const h3_tensor *y, *a, *b;
    int64_t ldy, lda, ldb, C;
    int bmode; /* 0: same shape, 1: one row broadcast, 2: scalar */
    h3_binary kind;
} bin_ctx;

static void binary_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    bin_ctx *c = p;
    float scalar = c->bmode == 2 ? *(const float *)c->b->data : 0.0f;
    for (int64_t r = rb; r < re; r++) {
        const float *a = cpu_row(c->a, c->lda, r);
        float *y = cpu_row(c->y, c->ldy, r);
        const float *b = c->bmode == 0 ? cpu_row(c->b, c->ldb, r) : (const float *)c->b->data;
        for (int64_t i = 0; i < c->C; i++) {
            float bv = c->bmode == 2 ? scalar : b[i];
            switch (c->kind) {
                case H3_BINARY_ADD: y[i] = a[i] + bv; break;
                case H3_BINARY_SUB: y[i] = a[i] - bv; break;
                default: y[i] = a[i] * bv; break;
            }
        }
    }
}

static h3_status cpu_binary(h3_exec *ex, h3_tensor *y, const h3_tensor *a, const h3_tensor *b, h3_binary kind) {
    H3_TRY(cpu_need_f32(H3_OP_BINARY, "a", a));
    H3_TRY(cpu_need_f32(H3_OP_BINARY, "b", b));
    H3_TRY(cpu_need_f32(H3_OP_BINARY, "y", y));
    int64_t nb = h3_tensor_numel(b);
    int bmode = (nb == h3_tensor_numel(a) && h3_tensor_rows(b) == h3_tensor_rows(a)) ? 0 : (nb == 1 ? 2 : 1);
    if (nb == 1 && h3_tensor_numel(a) == 1) bmode = 0;
    bin_ctx c = {y, a, b, cpu_ld(y), cpu_ld(a), cpu_ld(b), h3_tensor_cols(a), bmode, kind};
    h3_parallel_for(ex->pool, h3_tensor_rows(a), ROWS_GRAIN(c.C), binary_rows, &c);
    return H3_OK;
}

static void scale_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    row_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        const float *x = cpu_row(c->x, c->ldx, r);
        float *y = cpu_row(c->y, c->ldy, r);
        for (int64_t i = 0; i < c->C; i++) y[i] = c->p0 * x[i] + c->p1;
    }
}

static h3_status cpu_scale(h3_exec *ex, h3_tensor *y, const h3_tensor *x, float alpha, float beta) {
    H3_TRY(cpu_need_f32(H3_OP_SCALE, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_SCALE, "y", y));
    row_ctx c = {x, y, cpu_ld(x), cpu_ld(y), h3_tensor_cols(x), NULL, NULL, 0, alpha, beta, 0};
    h3_parallel_for(ex->pool, h3_tensor_rows(x), ROWS_GRAIN(c.C), scale_rows, &c);
    return H3_OK;
}

static void swiglu_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    row_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        const float *x = cpu_row(c->x, c->ldx, r);
        float *y = cpu_row(c->y, c->ldy, r);
        const float *g = c->kind ? x : x + c->C, *v = c->kind ? x + c->C : x;
        for (int64_t i = 0; i < c->C; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * v[i];
    }
}

static h3_status cpu_swiglu(h3_exec *ex, h3_tensor *y, const h3_tensor *x, int gate_first) {
    H3_TRY(cpu_need_f32(H3_OP_SWIGLU, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_SWIGLU, "y", y));
    row_ctx c = {x, y, cpu_ld(x), cpu_ld(y), h3_tensor_cols(y), NULL, NULL, 0, 0, 0, gate_first ? 1 : 0};
    h3_parallel_for(ex->pool, h3_tensor_rows(x), ROWS_GRAIN(c.C), swiglu_rows, &c);
    return H3_OK;
}

typedef struct {
    const h3_tensor *x, *y, *t0, *t1, *idx;
    int64_t ldx, ldy, ld0, ld1, C;
} mod_ctx;

static void modulate_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    mod_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        int64_t t = c->idx ? cpu_index(c->idx, r) : 0;
        const float *x = cpu_row(c->x, c->ldx, r);
        float *y = cpu_row(c->y, c->ldy, r);
        const float *sh = cpu_row(c->t0, c->ld0, t), *sc = cpu_row(c->t1, c->ld1, t);
        for (int64_t i = 0; i < c->C; i++) y[i] = x[i] * (1.0f + sc[i]) + sh[i];
    }
}

static h3_status cpu_modulate(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *shift,
                              const h3_tensor *scale, const h3_tensor *idx) {
    H3_TRY(cpu_need_f32(H3_OP_MODULATE, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_MODULATE, "y", y));
    H3_TRY(cpu_need_f32(H3_OP_MODULATE, "shift", shift));
    H3_TRY(cpu_need_f32(H3_OP_MODULATE, "scale", scale));
    if (idx) H3_TRY(cpu_check_indices(H3_OP_MODULATE, idx, h3_tensor_rows(x), h3_tensor_rows(shift)));
    mod_ctx c = {x, y, shift, scale, idx, cpu_ld(x), cpu_ld(y), cpu_ld(shift), cpu_ld(scale), h3_tensor_cols(x)};
    h3_parallel_for(ex->pool, h3_tensor_rows(x), ROWS_GRAIN(c.C), modulate_rows, &c);
    return H3_OK;
}

static void gated_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    mod_ctx *c = p; /* x: residual (written), y: h, t0: gate */
    for (int64_t r = rb; r < re; r++) {
        int64_t t = c->idx ? cpu_index(c->idx, r) : 0;
        float *x = cpu_row(c->x, c->ldx, r);
        const float *h = cpu_row(c->y, c->ldy, r), *g = cpu_row(c->t0, c->ld0, t);
        for (int64_t i = 0; i < c->C; i++) x[i] += g[i] * h[i];
    }
}

static h3_status cpu_gated_add(h3_exec *ex, h3_tensor *x, const h3_tensor *h, const h3_tensor *gate,
                               const h3_tensor *idx) {
    H3_TRY(cpu_need_f32(H3_OP_GATED_ADD, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_GATED_ADD, "h", h));
    H3_TRY(cpu_need_f32(H3_OP_GATED_ADD, "gate", gate));
    if (idx) H3_TRY(cpu_check_indices(H3_OP_GATED_ADD, idx, h3_tensor_rows(x), h3_tensor_rows(gate)));
    mod_ctx c = {x, h, gate, NULL, idx, cpu_ld(x), cpu_ld(h), cpu_ld(gate), 0, h3_tensor_cols(x)};
    h3_parallel_for(ex->pool, h3_tensor_rows(x), ROWS_GRAIN(c.C), gated_rows, &c);
    return H3_OK;
}

typedef struct {
    const h3_tensor *x, *y;
    int64_t ldx, ldy, C;
    h3_status st;
} cvt_ctx;

static void convert_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    cvt_ctx *c = p;
    size_t ex_ = h3_dtype_size(c->x->dtype), ey = h3_dtype_size(c->y->dtype);
    float buf[1024];
    for (int64_t r = rb; r < re; r++) {
        const uint8_t *x = (const uint8_t *)c->x->data + (size_t)(r * c->ldx) * ex_;
        uint8_t *y = (uint8_t *)c->y->data + (size_t)(r * c->ldy) * ey;
        if (c->x->dtype == c->y->dtype) {
            memmove(y, x, (size_t)c->C * ex_);
            continue;
        }
        for (int64_t i = 0; i < c->C; i += 1024) {
            size_t n = (size_t)(c->C - i < 1024 ? c->C - i : 1024);
            if (!h3_convert_to_f32(c->x->dtype, x + (size_t)i * ex_, buf, n) ||
                !h3_convert_from_f32(c->y->dtype, buf, y + (size_t)i * ey, n)) {
                c->st = H3_ERR_UNSUPPORTED;
                return;
            }
        }
    }
}

static h3_status cpu_convert(h3_exec *ex, h3_tensor *y, const h3_tensor *x) {
    if (x->q.mode != H3_SCALE_NONE || y->q.mode != H3_SCALE_NONE)
        return H3_ERR(H3_ERR_UNSUPPORTED, "op 'convert' does not take scaled (quantized) tensors");
    if (x->dtype != y->dtype && (!h3_dtype_is_float(x->dtype) || !h3_dtype_is_float(y->dtype)))
        return H3_ERR(H3_ERR_UNSUPPORTED, "op 'convert': no conversion from %s to %s", h3_dtype_name(x->dtype),
                      h3_dtype_name(y->dtype));
    cvt_ctx c = {x, y, cpu_ld(x), cpu_ld(y), h3_tensor_cols(x), H3_OK};
    h3_parallel_for(ex->pool, h3_tensor_rows(x), ROWS_GRAIN(c.C), convert_rows, &c);
    if (c.st != H3_OK)
        return H3_ERR(H3_ERR_UNSUPPORTED, "op 'convert': no conversion from %s to %s", h3_dtype_name(x->dtype),
                      h3_dtype_name(y->dtype));
    return H3_OK;
}

static void fill_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    row_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        float *y = cpu_row(c->y, c->ldy, r);
        for (int64_t i = 0; i < c->C; i++) y[i] = c->p0;
    }
}

static h3_status cpu_fill(h3_exec *ex, h3_tensor *y, float value) {
    if (y->dtype != H3_F32) {
        /* Fill other float types through a converted constant row. */
        if (!h3_dtype_is_float(y->dtype) || y->dtype == H3_F64 || y->dtype == H3_F8_E5M2)
            return h3_missing_kernel(H3_OP_FILL, CPU_NAME, "y", y->dtype);
        uint8_t one[2];
        h3_convert_from_f32(y->dtype, &value, one, 1);
        size_t es = h3_dtype_size(y->dtype);
        int64_t ld = cpu_ld(y), C = h3_tensor_cols(y), R = h3_tensor_rows(y);
        for (int64_t r = 0; r < R; r++)
            for (int64_t i = 0; i < C; i++) memcpy((uint8_t *)y->data + (size_t)(r * ld + i) * es, one, es);
        return H3_OK;
    }
    row_ctx c = {NULL, y, 0, cpu_ld(y), h3_tensor_cols(y), NULL, NULL, 0, value, 0, 0};
    h3_parallel_for(ex->pool, h3_tensor_rows(y), ROWS_GRAIN(c.C), fill_rows, &c);
    return H3_OK;
}

typedef struct {
    const h3_tensor *y;
    int64_t ld, C;
    uint64_t seed;
    float lo, hi;
} rnd_ctx;

static void random_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    rnd_ctx *c = p;
    size_t es = h3_dtype_size(c->y->dtype);
    for (int64_t r = rb; r < re; r++) {
        uint8_t *row = (uint8_t *)c->y->data + (size_t)(r * c->ld) * es;
        for (int64_t i = 0; i < c->C; i++) {
            float v = c->lo + (c->hi - c->lo) * h3_random_unit(c->seed, (uint64_t)(r * c->C + i));
            h3_convert_from_f32(c->y->dtype, &v, row + (size_t)i * es, 1);
        }
    }
}

static h3_status cpu_random_uniform(h3_exec *ex, h3_tensor *y, uint64_t seed, float lo, float hi) {
    if (y->dtype != H3_F32 && y->dtype != H3_BF16 && y->dtype != H3_F16)
        return h3_missing_kernel(H3_OP_RANDOM, CPU_NAME, "y", y->dtype);
    rnd_ctx c = {y, cpu_ld(y), h3_tensor_cols(y), seed, lo, hi};
    h3_parallel_for(ex->pool, h3_tensor_rows(y), ROWS_GRAIN(c.C), random_rows, &c);
    return H3_OK;
}

static h3_status cpu_rms_norm_modulate(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, float eps,
                                       const h3_tensor *shift, const h3_tensor *scale, const h3_tensor *idx) {
    H3_TRY(cpu_rms_norm(ex, y, x, w, eps));
    return cpu_modulate(ex, y, y, shift, scale, idx);
}

typedef struct {
    const h3_tensor *x, *cos, *sin;
    const float *w;
    int64_t H, D, R, ldc, lds;
    float eps;
} qkr_ctx;

static void qk_norm_rope_rows(void *p, int64_t sb, int64_t se, int tid) {
    (void)tid;
    qkr_ctx *c = p;
    float v[512];
    const int64_t half = c->R / 2;
    for (int64_t s = sb; s < se; s++) {
        const float *cs = (const float *)c->cos->data + s * c->ldc, *sn = (const float *)c->sin->data + s * c->lds;
        for (int64_t h = 0; h < c->H; h++) {
            float *x = (float *)c->x->data + s * c->x->stride[0] + h * c->D;
            double ss = 0;
            for (int64_t i = 0; i < c->D; i++) ss += (double)x[i] * x[i];
            float inv = (float)(1.0 / sqrt(ss / (double)c->D + c->eps));
            for (int64_t i = 0; i < c->D; i++) v[i] = x[i] * inv * c->w[i];
            for (int64_t i = 0; i < half; i++) {
                x[i] = v[i] * cs[i] - v[i + half] * sn[i];
                x[i + half] = v[i + half] * cs[i + half] + v[i] * sn[i + half];
            }
            for (int64_t i = c->R; i < c->D; i++) x[i] = v[i];
        }
    }
}

static h3_status cpu_qk_norm_rope(h3_exec *ex, h3_tensor *x, const h3_tensor *w, float eps, const h3_tensor *cos,
                                  const h3_tensor *sin) {
    H3_TRY(cpu_need_f32(H3_OP_QK_NORM_ROPE, "x", x));
    if (x->shape[2] > 512) return H3_ERR(H3_ERR_UNSUPPORTED, "op 'qk_norm_rope' supports head sizes up to 512");
    float *wf;
    H3_TRY(cpu_vec_f32(H3_OP_QK_NORM_ROPE, "weight", w, &wf));
    qkr_ctx c = {x, cos, sin, wf, x->shape[1], x->shape[2], cos->shape[1], cpu_ld(cos), cpu_ld(sin), eps};
    h3_parallel_for(ex->pool, x->shape[0], 16, qk_norm_rope_rows, &c);
    h3_free(wf);
    return H3_OK;
}

const h3_backend h3_cpu_backend = {
    .name = CPU_NAME,
    .gemm = cpu_gemm,
    .rms_norm = cpu_rms_norm,
    .layer_norm = cpu_layer_norm,
    .group_norm = cpu_group_norm,
    .unary = cpu_unary,
    .snake = cpu_snake,
    .softmax = cpu_softmax,
    .clamp = cpu_clamp,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .attention_sparse = cpu_attention_sparse,
    .conv1d = cpu_conv1d,
    .conv_transpose1d = cpu_conv_transpose1d,
    .conv3d = cpu_conv3d,
    .gather_rows = cpu_gather_rows,
    .scatter_rows = cpu_scatter_rows,
    .binary = cpu_binary,
    .scale = cpu_scale,
    .swiglu = cpu_swiglu,
    .modulate = cpu_modulate,
    .gated_add = cpu_gated_add,
    .convert = cpu_convert,
    .fill = cpu_fill,
    .random_uniform = cpu_random_uniform,
    .rms_norm_modulate = cpu_rms_norm_modulate,
    .qk_norm_rope = cpu_qk_norm_rope,
    .snake_aa = cpu_snake_aa,
};

/* Convolutions on the CPU: im2col in bounded column chunks + OpenBLAS, with a direct loop for depthwise
 * (one input channel per group) filters such as the anti-aliasing filters of BigVGAN.
 *
 * Column chunks hold at most ~16 MB, so memory does not grow with the length of the signal or video. A stop
 * request (h3_cancel_requested) is seen between chunks: the kernel returns early and the op reports it
 * (ops.c).
 */
#include <cblas.h>
#include <string.h>

#include "cpu/cpu_internal.h"

size_t h3_cpu_conv_col_bytes = 16u << 20;
#define COL_BYTES h3_cpu_conv_col_bytes

/* Time steps per im2col column chunk of `rows` rows over `len` steps. */
static int64_t col_steps(int64_t rows, int64_t len) {
    int64_t tc = (int64_t)(COL_BYTES / sizeof(float)) / rows;
    if (tc < 64) tc = 64;
    return tc > len ? len : tc;
}

int64_t h3_cpu_conv1d_scratch_bytes(int64_t cin_per_group, int64_t K, int64_t tout) {
    if (cin_per_group == 1 && K <= 64) return 0; /* the direct depthwise loop */
    return cin_per_group * K * col_steps(cin_per_group * K, tout) * (int64_t)sizeof(float);
}

int64_t h3_cpu_convt1d_scratch_bytes(int64_t cout_per_group, int64_t cin_per_group, int64_t K, int64_t tin) {
    if (cin_per_group == 1) return 0; /* the direct depthwise loop */
    return cout_per_group * K * col_steps(cout_per_group * K, tin) * (int64_t)sizeof(float);
}

int64_t h3_cpu_conv3d_scratch_bytes(int64_t rows, int64_t npos) {
    return rows * col_steps(rows, npos) * (int64_t)sizeof(float);
}

/* The weight (or bias) as f32: the tensor's own data when it already is contiguous f32 without scales, else a
 * converted copy in *owned (free it with h3_free; NULL when nothing was allocated). NULL in -> NULL out. */
static h3_status conv_f32(h3_op_id op, const char *what, const h3_tensor *t, const float **out,
                          float **owned) {
    *out = NULL;
    *owned = NULL;
    if (!t) return H3_OK;
    if (t->dtype == H3_F32 && t->q.mode == H3_SCALE_NONE && h3_tensor_is_contiguous(t)) {
        *out = t->data;
        return H3_OK;
    }
    H3_TRY(cpu_vec_f32(op, what, t, owned));
    *out = *owned;
    return H3_OK;
}

/* ---- conv1d ----------------------------------------------------------------------------------------------
 */

typedef struct {
    const float *x, *w, *b;
    float *y, *col;
    int64_t cin, tin, cout, tout, K, cig, cog, t0, tc;
    int stride, dil, pad_left, g;
    h3_pad_mode mode;
} c1_ctx;

/* col[(ci*K + k), j] = xpad[ci, (t0+j)*stride + k*dil] for the channels of group g. */
static void c1_im2col(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    c1_ctx *c = p;
    for (int64_t r = rb; r < re; r++) {
        int64_t ci = r / c->K, k = r % c->K;
        const float *xr = c->x + (c->g * c->cig + ci) * c->tin;
        float *dst = c->col + r * c->tc;
        for (int64_t j = 0; j < c->tc; j++) {
            int64_t src = cpu_pad_index((c->t0 + j) * c->stride + k * c->dil - c->pad_left, c->tin, c->mode);
            dst[j] = src < 0 ? 0.0f : xr[src];
        }
    }
}

static void c1_depthwise(void *p, int64_t cb, int64_t ce, int tid) {
    (void)tid;
    c1_ctx *c = p; /* groups == cin; cog output channels per input channel */
    for (int64_t co = cb; co < ce; co++) {
        int64_t ci = co / c->cog;
        const float *xr = c->x + ci * c->tin, *wr = c->w + co * c->K;
        float *yr = c->y + co * c->tout;
        float bias = c->b ? c->b[co] : 0.0f;
        for (int64_t t = 0; t < c->tout; t++) {
            float acc = bias;
            int64_t base = t * c->stride - c->pad_left;
            if (base >= 0 && base + (c->K - 1) * c->dil < c->tin) {
                for (int64_t k = 0; k < c->K; k++) acc += wr[k] * xr[base + k * c->dil];
            } else {
                for (int64_t k = 0; k < c->K; k++) {
                    int64_t src = cpu_pad_index(base + k * c->dil, c->tin, c->mode);
                    if (src >= 0) acc += wr[k] * xr[src];
                }
            }
            yr[t] = acc;
        }
    }
}

static void add_channel_bias(h3_exec *ex, float *y, const float *b, int64_t C, int64_t T);

h3_status cpu_conv1d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                     const h3_conv1d_params *p) {
    H3_TRY(cpu_need_f32(H3_OP_CONV1D, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_CONV1D, "y", y));
    const float *wf = NULL, *bf = NULL;
    float *wown = NULL, *bown = NULL;
    h3_status st = conv_f32(H3_OP_CONV1D, "weight", w, &wf, &wown);
    if (st == H3_OK) st = conv_f32(H3_OP_CONV1D, "bias", b, &bf, &bown);
    if (st != H3_OK) goto done;
    {
        const int o = x->ndim - 2; /* [B, C, T]: batch items one after the other, through the same weights */
        const int64_t batch = o ? x->shape[0] : 1;
        int g = p->groups > 0 ? p->groups : 1;
        c1_ctx c = {0};
        c.w = wf;
        c.b = bf;
        c.cin = x->shape[o];
        c.tin = x->shape[o + 1];
        c.cout = w->shape[0];
        c.tout = y->shape[o + 1];
        c.K = w->shape[2];
        c.cig = c.cin / g;
        c.cog = c.cout / g;
        c.stride = p->stride;
        c.dil = p->dilation;
        c.pad_left = p->pad_left;
        c.mode = p->pad_mode;
        const int depthwise = c.cig == 1 && c.K <= 64;
        int64_t rows = c.cig * c.K;
        int64_t tc = col_steps(rows, c.tout);
        if (!depthwise) {
            c.col = h3_malloc((size_t)(rows * tc) * sizeof(float), H3_MEM_WORKSPACE);
            if (!c.col) {
                st = H3_ERR_NOMEM;
                goto done;
            }
        }
        for (int64_t bi = 0; bi < batch; bi++) {
            c.x = (const float *)x->data + bi * c.cin * c.tin;
            c.y = (float *)y->data + bi * c.cout * c.tout;
            if (depthwise) {
                h3_parallel_for(ex->pool, c.cout, 1, c1_depthwise, &c);
                continue;
            }
            for (int gi = 0; gi < g; gi++) {
                c.g = gi;
                for (int64_t t0 = 0; t0 < c.tout && !h3_cancel_requested(); t0 += tc) {
                    c.t0 = t0;
                    c.tc = c.tout - t0 < tc ? c.tout - t0 : tc;
                    h3_parallel_for(ex->pool, rows, 1, c1_im2col, &c);
                    /* y[g*cog.., t0..] = W_g [cog, rows] · col [rows, tc] */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)c.cog, (int)c.tc, (int)rows,
                                1.0f, wf + (int64_t)gi * c.cog * rows, (int)rows, c.col, (int)c.tc, 0.0f,
                                c.y + (int64_t)gi * c.cog * c.tout + t0, (int)c.tout);
                }
            }
            if (bf) add_channel_bias(ex, c.y, bf, c.cout, c.tout);
        }
        h3_free(c.col);
    }
done:
    h3_free(wown);
    h3_free(bown);
    return st;
}

typedef struct {
    float *y;
    const float *b;
    int64_t T;
} cb_ctx;

static void cb_rows(void *p, int64_t rb, int64_t re, int tid) {
    (void)tid;
    cb_ctx *c = p;
    for (int64_t r = rb; r < re; r++)
        for (int64_t t = 0; t < c->T; t++) c->y[r * c->T + t] += c->b[r];
}

static void add_channel_bias(h3_exec *ex, float *y, const float *b, int64_t C, int64_t T) {
    cb_ctx c = {y, b, T};
    h3_parallel_for(ex->pool, C, 1, cb_rows, &c);
}

/* ---- conv_transpose1d -------------------------------------------------------------------------------------
 */

typedef struct {
    const float *x, *w, *b;
    float *y, *col;
    int64_t cin, tin, cout, tout, K, cig, cog, t0, tc;
    int stride, pad, dil, g;
} ct_ctx;

/* Depthwise transposed conv: each output channel co reads input channel co/cog. */
static void ct_depthwise(void *p, int64_t cb, int64_t ce, int tid) {
    (void)tid;
    ct_ctx *c = p;
    for (int64_t co = cb; co < ce; co++) {
        int64_t ci = co / c->cog, j = co % c->cog;
        const float *xr = c->x + ci * c->tin, *wr = c->w + (ci * c->cog + j) * c->K;
        float *yr = c->y + co * c->tout;
        float bias = c->b ? c->b[co] : 0.0f;
        for (int64_t t = 0; t < c->tout; t++) yr[t] = bias;
        for (int64_t t = 0; t < c->tin; t++) {
            float xv = xr[t];
            int64_t base = t * c->stride - c->pad;
            for (int64_t k = 0; k < c->K; k++) {
                int64_t o = base + k * c->dil;
                if (o >= 0 && o < c->tout) yr[o] += xv * wr[k];
            }
        }
    }
}

/* Scatter-add cols [(co*K + k), j] into y[co, (t0+j)*stride − pad + k*dil] for output channels of group g. */
static void ct_col2im(void *p, int64_t cb, int64_t ce, int tid) {
    (void)tid;
    ct_ctx *c = p;
    for (int64_t co = cb; co < ce; co++) {
        float *yr = c->y + (c->g * c->cog + co) * c->tout;
        for (int64_t k = 0; k < c->K; k++) {
            const float *src = c->col + (co * c->K + k) * c->tc;
            for (int64_t j = 0; j < c->tc; j++) {
                int64_t o = (c->t0 + j) * c->stride - c->pad + k * c->dil;
                if (o >= 0 && o < c->tout) yr[o] += src[j];
            }
        }
    }
}

h3_status cpu_conv_transpose1d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                               const h3_tensor *b, const h3_convt1d_params *p) {
    H3_TRY(cpu_need_f32(H3_OP_CONV_TRANSPOSE1D, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_CONV_TRANSPOSE1D, "y", y));
    const float *wf = NULL, *bf = NULL;
    float *wown = NULL, *bown = NULL;
    h3_status st = conv_f32(H3_OP_CONV_TRANSPOSE1D, "weight", w, &wf, &wown);
    if (st == H3_OK) st = conv_f32(H3_OP_CONV_TRANSPOSE1D, "bias", b, &bf, &bown);
    if (st != H3_OK) goto done;
    {
        const int o = x->ndim - 2; /* [B, C, T]: batch items one after the other, through the same weights */
        const int64_t batch = o ? x->shape[0] : 1;
        int g = p->groups > 0 ? p->groups : 1;
        ct_ctx c = {0};
        c.w = wf;
        c.b = bf;
        c.cin = x->shape[o];
        c.tin = x->shape[o + 1];
        c.cog = w->shape[1];
        c.cout = c.cog * g;
        c.tout = y->shape[o + 1];
        c.K = w->shape[2];
        c.cig = c.cin / g;
        c.stride = p->stride;
        c.pad = p->padding;
        c.dil = p->dilation > 0 ? p->dilation : 1;
        int64_t rows = c.cog * c.K;
        int64_t tc = col_steps(rows, c.tin);
        if (c.cig != 1) {
            c.col = h3_malloc((size_t)(rows * tc) * sizeof(float), H3_MEM_WORKSPACE);
            if (!c.col) {
                st = H3_ERR_NOMEM;
                goto done;
            }
        }
        for (int64_t bi = 0; bi < batch; bi++) {
            c.x = (const float *)x->data + bi * c.cin * c.tin;
            c.y = (float *)y->data + bi * c.cout * c.tout;
            if (c.cig == 1) {
                h3_parallel_for(ex->pool, c.cout, 1, ct_depthwise, &c);
                continue;
            }
            memset(c.y, 0, (size_t)(c.cout * c.tout) * sizeof(float));
            for (int gi = 0; gi < g; gi++) {
                c.g = gi;
                /* W_g viewed as [cig, cog*K]; cols [cog*K, tc] = W_gᵀ · x_g[:, t0..] */
                const float *wg = wf + (int64_t)gi * c.cig * rows;
                for (int64_t t0 = 0; t0 < c.tin && !h3_cancel_requested(); t0 += tc) {
                    c.t0 = t0;
                    c.tc = c.tin - t0 < tc ? c.tin - t0 : tc;
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)rows, (int)c.tc, (int)c.cig,
                                1.0f, wg, (int)rows, c.x + (int64_t)gi * c.cig * c.tin + t0, (int)c.tin, 0.0f,
                                c.col, (int)c.tc);
                    h3_parallel_for(ex->pool, c.cog, 1, ct_col2im, &c);
                }
            }
            if (bf) add_channel_bias(ex, c.y, bf, c.cout, c.tout);
        }
        h3_free(c.col);
    }
done:
    h3_free(wown);
    h3_free(bown);
    return st;
}

/* ---- conv3d ----------------------------------------------------------------------------------------------
 */

typedef struct {
    const float *x;
    float *col;
    int64_t cin, T, H, W, kt, kh, kw, To, Ho, Wo;
    int64_t p0, np; /* output positions [p0, p0+np) in flattened (to, ho, wo) order */
    const h3_conv3d_params *p;
} c3_ctx;

static void c3_im2col(void *pp, int64_t rb, int64_t re, int tid) {
    (void)tid;
    c3_ctx *c = pp;
    const h3_conv3d_params *p = c->p;
    for (int64_t r = rb; r < re; r++) {
        int64_t kx = r % c->kw, ky = (r / c->kw) % c->kh, kz = (r / (c->kw * c->kh)) % c->kt;
        int64_t ci = r / (c->kw * c->kh * c->kt);
        const float *xc = c->x + ci * c->T * c->H * c->W;
        float *dst = c->col + r * c->np;
        for (int64_t j = 0; j < c->np; j++) {
            int64_t pos = c->p0 + j;
            int64_t wo = pos % c->Wo, ho = (pos / c->Wo) % c->Ho, to = pos / (c->Wo * c->Ho);
            int64_t ti = cpu_pad_index(to * p->stride[0] + kz - p->pad[0][0], c->T, p->pad_mode[0]);
            int64_t hi = cpu_pad_index(ho * p->stride[1] + ky - p->pad[1][0], c->H, p->pad_mode[1]);
            int64_t wi = cpu_pad_index(wo * p->stride[2] + kx - p->pad[2][0], c->W, p->pad_mode[2]);
            dst[j] = (ti < 0 || hi < 0 || wi < 0) ? 0.0f : xc[(ti * c->H + hi) * c->W + wi];
        }
    }
}

h3_status cpu_conv3d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                     const h3_conv3d_params *p) {
    H3_TRY(cpu_need_f32(H3_OP_CONV3D, "x", x));
    H3_TRY(cpu_need_f32(H3_OP_CONV3D, "y", y));
    const float *wf = NULL, *bf = NULL;
    float *wown = NULL, *bown = NULL;
    h3_status st = conv_f32(H3_OP_CONV3D, "weight", w, &wf, &wown);
    if (st == H3_OK) st = conv_f32(H3_OP_CONV3D, "bias", b, &bf, &bown);
    if (st != H3_OK) goto done;
    {
        c3_ctx c = {0};
        c.x = x->data;
        c.cin = x->shape[0];
        c.T = x->shape[1];
        c.H = x->shape[2];
        c.W = x->shape[3];
        c.kt = w->shape[2];
        c.kh = w->shape[3];
        c.kw = w->shape[4];
        c.To = y->shape[1];
        c.Ho = y->shape[2];
        c.Wo = y->shape[3];
        c.p = p;
        int64_t cout = w->shape[0], rows = c.cin * c.kt * c.kh * c.kw, npos = c.To * c.Ho * c.Wo;
        const int64_t chunk = col_steps(rows, npos);
        c.col = h3_malloc((size_t)(rows * chunk) * sizeof(float), H3_MEM_WORKSPACE);
        if (!c.col) {
            st = H3_ERR_NOMEM;
            goto done;
        }
        for (int64_t p0 = 0; p0 < npos && !h3_cancel_requested(); p0 += chunk) {
            c.p0 = p0;
            c.np = npos - p0 < chunk ? npos - p0 : chunk;
            h3_parallel_for(ex->pool, rows, 1, c3_im2col, &c);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)cout, (int)c.np, (int)rows, 1.0f, wf,
                        (int)rows, c.col, (int)c.np, 0.0f, (float *)y->data + p0, (int)npos);
        }
        h3_free(c.col);
        if (bf) add_channel_bias(ex, y->data, bf, cout, npos);
    }
done:
    h3_free(wown);
    h3_free(bown);
    return st;
}

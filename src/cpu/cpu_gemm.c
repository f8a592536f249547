/* GEMM on the CPU: y = x·wᵀ + b with weights in any stored format.
 *
 * f32 weights go straight to OpenBLAS. Other formats are converted panel by panel (NB rows of w at a time, a
 * few MB) to f32 by the thread pool and multiplied by OpenBLAS, so no full f32 copy of a weight ever exists.
 * Large products are issued in blocks of rows of x (about h3_cpu_gemm_block_flops each), and a stop request
 * (h3_cancel_request) is seen between blocks and panels: the kernel returns early and the op reports it.
 */
#include <cblas.h>
#include <string.h>

#include "cpu/cpu_internal.h"

void openblas_set_num_threads(int num_threads);

size_t h3_cpu_gemm_panel_bytes = 8u << 20;
static int g_blas_threads = 1;
static _Thread_local int g_single_depth;

void h3_cpu_set_threads(int n) {
    g_blas_threads = n > 0 ? n : 1;
    openblas_set_num_threads(g_blas_threads);
}
void h3_cpu_blas_threads_push_single(void) {
    if (g_single_depth++ == 0 && g_blas_threads > 1) openblas_set_num_threads(1);
}
void h3_cpu_blas_threads_pop(void) {
    if (--g_single_depth == 0 && g_blas_threads > 1) openblas_set_num_threads(g_blas_threads);
}

h3_status cpu_need_f32(h3_op_id op, const char *what, const h3_tensor *t) {
    if (t && t->dtype != H3_F32) return h3_missing_kernel(op, CPU_NAME, what, t->dtype);
    return H3_OK;
}

h3_status cpu_vec_f32(h3_op_id op, const char *what, const h3_tensor *t, float **out) {
    *out = NULL;
    if (!t) return H3_OK;
    int64_t n = h3_tensor_numel(t);
    float *v = h3_malloc((size_t)(n > 0 ? n : 1) * sizeof(float), H3_MEM_WORKSPACE);
    if (!v) return H3_ERR_NOMEM;
    if (t->q.mode != H3_SCALE_NONE || !h3_convert_to_f32(t->dtype, t->data, v, (size_t)n)) {
        h3_free(v);
        return h3_missing_kernel(op, CPU_NAME, what, t->dtype);
    }
    *out = v;
    return H3_OK;
}

h3_status cpu_check_indices(h3_op_id op, const h3_tensor *idx, int64_t n, int64_t limit) {
    for (int64_t i = 0; i < n; i++) {
        int64_t r = cpu_index(idx, i);
        if (r < 0 || r >= limit)
            return H3_ERR(H3_ERR_INVALID, "op '%s': index %lld at position %lld is outside [0, %lld)", h3_op_name(op),
                          (long long)r, (long long)i, (long long)limit);
    }
    return H3_OK;
}

typedef struct {
    const h3_tensor *w;
    int64_t n0, K;
    float *panel;
    h3_status st;
} conv_panel_ctx;

static void conv_panel_rows(void *p, int64_t b, int64_t e, int tid) {
    (void)tid;
    conv_panel_ctx *c = p;
    h3_status s = h3_tensor_rows_to_f32(c->w, c->n0 + b, e - b, c->panel + b * c->K);
    if (s != H3_OK) c->st = s;
}

typedef struct {
    float *y;
    int64_t ldy, N;
    const float *bias;
} bias_ctx;

static void add_bias_rows(void *p, int64_t b, int64_t e, int tid) {
    (void)tid;
    bias_ctx *c = p;
    for (int64_t r = b; r < e; r++) {
        float *y = c->y + r * c->ldy;
        for (int64_t n = 0; n < c->N; n++) y[n] += c->bias[n];
    }
}

/* Rows of a converted weight panel: about h3_cpu_gemm_panel_bytes of f32, at least 16 rows, a multiple of 16.
 */
static int64_t panel_rows(int64_t N, int64_t K) {
    int64_t NB = (int64_t)h3_cpu_gemm_panel_bytes / (4 * (K > 0 ? K : 1));
    if (NB < 16) NB = 16;
    NB = (NB + 15) / 16 * 16;
    return NB > N ? N : NB;
}

double h3_cpu_gemm_block_flops = 8e9;

/* y[:, n0:n0+nb] (+)= x · panelᵀ for panel [nb, K], in blocks of rows of x of about h3_cpu_gemm_block_flops
 * each (never below 256 rows, where OpenBLAS is at full speed; equal blocks, so no small remainder changes
 * the kernel). */
static void sgemm_rows(int64_t M, int64_t nb, int64_t K, const float *x, int64_t ldx, const float *panel,
                       int64_t ldp, float beta, float *y, int64_t ldy) {
    int64_t mb = (int64_t)(h3_cpu_gemm_block_flops / (2.0 * (double)nb * (double)K));
    if (mb < 256) mb = 256;
    const int64_t nblk = (M + mb - 1) / mb;
    mb = (M + nblk - 1) / nblk;
    for (int64_t m0 = 0; m0 < M; m0 += mb) {
        if (m0 > 0 && h3_cancel_requested()) return;
        const int64_t m = M - m0 < mb ? M - m0 : mb;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)nb, (int)K, 1.0f, x + m0 * ldx,
                    (int)ldx, panel, (int)ldp, beta, y + m0 * ldy, (int)ldy);
    }
}

int64_t h3_cpu_gemm_scratch_bytes(int64_t N, int64_t K, h3_dtype wdt, int quantized) {
    int64_t s = N * 4; /* a bias in another dtype, as f32 (after the panel is freed) */
    if (wdt != H3_F32 || quantized) {
        const int64_t p = panel_rows(N, K) * K * 4;
        if (p > s) s = p;
    }
    return s;
}

h3_status cpu_gemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *bias,
                   unsigned flags) {
    H3_TRY(cpu_need_f32(H3_OP_GEMM, "activations", x));
    H3_TRY(cpu_need_f32(H3_OP_GEMM, "outputs", y));
    switch (w->dtype) {
        case H3_F32: case H3_BF16: case H3_F16: case H3_F64: case H3_F8_E4M3: case H3_F8_E5M2: break;
        case H3_I8:
            if (w->q.mode == H3_SCALE_NONE) return H3_ERR(H3_ERR_INVALID, "op 'gemm': i8 weights need scales");
            break;
        case H3_U8: /* packed blocks (nvfp4, GGUF): decoded panel by panel like the rest */
            if (w->q.mode != H3_SCALE_FORMAT) return h3_missing_kernel(H3_OP_GEMM, CPU_NAME, "weights", w->dtype);
            break;
        default: return h3_missing_kernel(H3_OP_GEMM, CPU_NAME, "weights", w->dtype);
    }
    int64_t M = h3_tensor_rows(x), K = h3_tensor_cols(x), N = w->shape[0];
    int64_t ldx = cpu_ld(x), ldy = cpu_ld(y), ldw = cpu_ld(w);
    float beta = (flags & H3_GEMM_ACCUMULATE) ? 1.0f : 0.0f;
    if (M == 0 || N == 0) return H3_OK;
    if (K == 0) {
        if (beta == 0.0f)
            for (int64_t r = 0; r < M; r++) memset(cpu_row(y, ldy, r), 0, (size_t)N * sizeof(float));
    } else if (w->dtype == H3_F32 && w->q.mode == H3_SCALE_NONE) {
        sgemm_rows(M, N, K, x->data, ldx, w->data, ldw, beta, y->data, ldy);
    } else {
        const int64_t NB = panel_rows(N, K);
        float *panel = h3_malloc((size_t)(NB * K) * sizeof(float), H3_MEM_WORKSPACE);
        if (!panel) return H3_ERR_NOMEM;
        for (int64_t n0 = 0; n0 < N && !h3_cancel_requested(); n0 += NB) {
            int64_t nb = N - n0 < NB ? N - n0 : NB;
            conv_panel_ctx c = {w, n0, K, panel, H3_OK};
            h3_parallel_for(ex->pool, nb, 1, conv_panel_rows, &c);
            if (c.st != H3_OK) {
                h3_free(panel);
                return c.st;
            }
            sgemm_rows(M, nb, K, x->data, ldx, panel, K, beta, (float *)y->data + n0, ldy);
        }
        h3_free(panel);
    }
    if (bias) {
        float *b;
        H3_TRY(cpu_vec_f32(H3_OP_GEMM, "bias", bias, &b));
        bias_ctx c = {y->data, ldy, N, b};
        h3_parallel_for(ex->pool, M, 64, add_bias_rows, &c);
        h3_free(b);
    }
    return H3_OK;
}

/* GEMM on the GPU through cuBLASLt: y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias[N]) (+ y when accumulating).
 *
 * Row-major y is column-major yᵀ [N, M], so cuBLASLt computes yᵀ = op(w) · xᵀ with w read transposed. bf16 and f16
 * run on tensor cores with fp32 accumulation; f32 stays exact f32 (no TF32), as the checkpoint's f32 layers want.
 * The bias is added in the epilogue. Plans (descriptors + the heuristic's algorithm) are cached per shape. */
#include <pthread.h>
#include <string.h>

#include "cuda/cuda_internal.cuh"

#define LT_TRY(call, what)                                                                                       \
    do {                                                                                                         \
        cublasStatus_t s__ = (call);                                                                             \
        if (s__ != CUBLAS_STATUS_SUCCESS)                                                                        \
            return H3_ERR(H3_ERR_DEVICE, "cuBLASLt %s failed: status %d", what, (int)s__);                      \
    } while (0)

typedef struct {
    int64_t M, N, K, ldx, ldw, ldy;
    int kind, dt, bias_dt, epilogue, align;
    int fast; /* fp8: cuBLASLt's fast accumulation (on unless H3_QGEMM_FP8_EXACT) */
    int valid;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    uint64_t last_use;
} gemm_plan;

#define N_PLANS 128
static gemm_plan g_plans[N_PLANS];
static uint64_t g_clock;
static pthread_mutex_t g_plan_mu = PTHREAD_MUTEX_INITIALIZER;

/* Destroys every handle of p that exists (a plan that failed half-way has only some). */
static void plan_release(gemm_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    p->op = NULL;
    p->a = p->b = p->c = NULL;
    p->valid = 0;
}

extern "C" h3_status cuda_gemm_init(h3_cuda_state *s) {
    LT_TRY(cublasLtCreate(&s->lt), "create");
    /* The whole H3_CUDA_BACKEND_BYTES, so the planner's budget (src/pipeline/plan.c) and the backend agree. */
    s->workspace_size = (size_t)H3_CUDA_BACKEND_BYTES;
    s->workspace = cuda_arena_alloc(s, s->workspace_size);
    if (!s->workspace) {
        cublasLtDestroy(s->lt);
        return h3_error_wrap(H3_ERR_NOMEM, "reserving the %lld MiB cuBLASLt workspace",
                             (long long)(H3_CUDA_BACKEND_BYTES >> 20));
    }
    return H3_OK;
}

extern "C" void cuda_gemm_shutdown(h3_cuda_state *s) {
    pthread_mutex_lock(&g_plan_mu);
    for (int i = 0; i < N_PLANS; i++) plan_release(&g_plans[i]);
    pthread_mutex_unlock(&g_plan_mu);
    cuda_arena_free(s, s->workspace);
    cublasLtDestroy(s->lt);
}

/* dt: 0 f32 (exact: pedantic f32 compute), 1 bf16, 2 f16, 3 f32 data on TF32 tensor cores (CUDA_LT_TF32) */
static cudaDataType_t lt_type(int dt) {
    return dt == 1 ? CUDA_R_16BF : dt == 2 ? CUDA_R_16F : CUDA_R_32F;
}

static int ptr_align(const void *p, int64_t ld, size_t es) {
    uintptr_t a = (uintptr_t)p | (uintptr_t)((size_t)ld * es);
    int al = 256;
    while (al > 1 && (a % (uintptr_t)al)) al /= 2;
    return al;
}

/* Sets st and jumps to fail when a cuBLASLt call inside plan_make fails. */
#define LT_PLAN(call, what)                                                                                  \
    do {                                                                                                     \
        cublasStatus_t s__ = (call);                                                                         \
        if (s__ != CUBLAS_STATUS_SUCCESS) {                                                                  \
            st = H3_ERR(H3_ERR_DEVICE, "cuBLASLt %s failed: status %d", what, (int)s__);                     \
            goto fail;                                                                                       \
        }                                                                                                    \
    } while (0)

/* Builds the descriptors and picks the algorithm of p (whose handles are NULL); on failure every handle
 * created so far is destroyed and p stays invalid. */
static h3_status plan_make(h3_cuda_state *s, gemm_plan *p) {
    h3_status st = H3_OK;
    cublasLtMatmulPreference_t pref = NULL;
    /* float: A, B, C of one dtype; int8: int8 A and B, int32 C and scalars; fp8: e4m3 A and B, C of dt */
    cudaDataType_t tc = p->kind == CUDA_LT_INT8 ? CUDA_R_32I : lt_type(p->dt);
    const int fp8 = p->kind == CUDA_LT_FP8 || p->kind == CUDA_LT_FP8_ROWS;
    cudaDataType_t tab = p->kind == CUDA_LT_INT8 ? CUDA_R_8I : fp8 ? CUDA_R_8F_E4M3 : tc;
    cudaDataType_t tscale = p->kind == CUDA_LT_INT8 ? CUDA_R_32I : CUDA_R_32F;
    cublasComputeType_t ct = p->kind == CUDA_LT_INT8                  ? CUBLAS_COMPUTE_32I
                             : p->kind == CUDA_LT_FLOAT && p->dt == 0 ? CUBLAS_COMPUTE_32F_PEDANTIC
                             : p->kind == CUDA_LT_FLOAT && p->dt == CUDA_LT_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                      : CUBLAS_COMPUTE_32F;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    uint64_t ws = s->workspace_size;
    uint32_t al = (uint32_t)p->align;
    static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    cublasStatus_t hs;
    LT_PLAN(cublasLtMatmulDescCreate(&p->op, ct, tscale), "matmul descriptor");
    LT_PLAN(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    LT_PLAN(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    if (fp8) { /* the heuristic must see scale pointers (the call sets the real ones) */
        const void *ph = s->workspace;
        const int8_t fast = (int8_t)p->fast;
        LT_PLAN(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast),
                "set FAST_ACCUM");
        if (p->kind == CUDA_LT_FP8_ROWS) {
            const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
            LT_PLAN(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec),
                    "set A_SCALE_MODE");
            LT_PLAN(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec),
                    "set B_SCALE_MODE");
        }
        LT_PLAN(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ph, sizeof ph),
                "set A_SCALE_POINTER");
        LT_PLAN(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ph, sizeof ph),
                "set B_SCALE_POINTER");
    }
    if (p->epilogue) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = lt_type(p->bias_dt);
        LT_PLAN(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep),
                "set EPILOGUE");
        LT_PLAN(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
                "set BIAS_DATA_TYPE");
    }
    /* A = w as column-major [K, N] (ld = ldw), used transposed; B = x as column-major [K, M]; C = y as [N, M]. */
    LT_PLAN(cublasLtMatrixLayoutCreate(&p->a, tab, (uint64_t)p->K, (uint64_t)p->N, p->ldw), "layout A");
    LT_PLAN(cublasLtMatrixLayoutCreate(&p->b, tab, (uint64_t)p->K, (uint64_t)p->M, p->ldx), "layout B");
    LT_PLAN(cublasLtMatrixLayoutCreate(&p->c, tc, (uint64_t)p->N, (uint64_t)p->M, p->ldy), "layout C");
    LT_PLAN(cublasLtMatmulPreferenceCreate(&pref), "preference");
    LT_PLAN(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
        "set workspace preference");
    for (int i = 0; i < 4; i++)
        LT_PLAN(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &al, sizeof al),
                "set alignment preference");
    hs = cublasLtMatmulAlgoGetHeuristic(s->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &n);
    if (hs != CUBLAS_STATUS_SUCCESS || n == 0) {
        const char *dn = p->kind == CUDA_LT_INT8  ? "int8"
                         : p->kind == CUDA_LT_FP8 ? "fp8 e4m3"
                         : p->kind == CUDA_LT_FP8_ROWS ? "fp8 e4m3 with scale vectors"
                         : p->dt == 1             ? "bf16"
                         : p->dt == 2             ? "f16"
                         : p->dt == CUDA_LT_TF32  ? "f32 on TF32"
                                                  : "f32";
        st = H3_ERR(H3_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for gemm M%lld N%lld K%lld (%s)",
                    (long long)p->M, (long long)p->N, (long long)p->K, dn);
        goto fail;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    p->algo = res.algo;
    p->valid = 1;
    return H3_OK;
fail:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    plan_release(p);
    return st;
}

#undef LT_PLAN

static h3_status lt_matmul(h3_exec *ex, int kind, int dt, int64_t M, int64_t N, int64_t K, const void *w,
                           int64_t ldw, const void *x, int64_t ldx, void *y, int64_t ldy, const void *bias,
                           int bias_dt, const void *alpha, const void *beta, const float *sa, const float *sb);

extern "C" h3_status cuda_lt_matmul(h3_exec *ex, int kind, int dt, int64_t M, int64_t N, int64_t K,
                                    const void *w, int64_t ldw, const void *x, int64_t ldx, void *y,
                                    int64_t ldy, const void *bias, int bias_dt, const void *alpha,
                                    const void *beta) {
    return lt_matmul(ex, kind, dt, M, N, K, w, ldw, x, ldx, y, ldy, bias, bias_dt, alpha, beta, NULL, NULL);
}

extern "C" h3_status cuda_lt_matmul_fp8(h3_exec *ex, int dt, int64_t M, int64_t N, int64_t K, const void *w,
                                        int64_t ldw, const void *x, int64_t ldx, const float *scales, void *y,
                                        int64_t ldy, const void *beta) {
    const float one = 1.0f;
    return lt_matmul(ex, CUDA_LT_FP8, dt, M, N, K, w, ldw, x, ldx, y, ldy, NULL, -1, &one, beta, scales + 32,
                     scales);
}

extern "C" h3_status cuda_lt_matmul_fp8_rows(h3_exec *ex, int dt, int64_t M, int64_t N, int64_t K, const void *w,
                                             int64_t ldw, const void *x, int64_t ldx, const float *sw,
                                             const float *sx, void *y, int64_t ldy, const void *beta) {
    const float one = 1.0f;
    return lt_matmul(ex, CUDA_LT_FP8_ROWS, dt, M, N, K, w, ldw, x, ldx, y, ldy, NULL, -1, &one, beta, sw, sx);
}

static h3_status lt_matmul(h3_exec *ex, int kind, int dt, int64_t M, int64_t N, int64_t K, const void *w,
                           int64_t ldw, const void *x, int64_t ldx, void *y, int64_t ldy, const void *bias,
                           int bias_dt, const void *alpha, const void *beta, const float *sa, const float *sb) {
    h3_cuda_state *s = cuda_state(ex);
    const int f32 = dt == 0 || dt == CUDA_LT_TF32;
    const size_t es_ab = kind == CUDA_LT_FLOAT ? (f32 ? 4 : 2) : 1;
    const size_t es_c = kind == CUDA_LT_INT8 ? 4 : f32 ? 4 : 2;
    int al = ptr_align(x, ldx, es_ab);
    int a2 = ptr_align(w, ldw, es_ab), a3 = ptr_align(y, ldy, es_c);
    if (a2 < al) al = a2;
    if (a3 < al) al = a3;
    gemm_plan key;
    memset(&key, 0, sizeof key);
    key.M = M;
    key.N = N;
    key.K = K;
    key.ldx = ldx;
    key.ldw = ldw;
    key.ldy = ldy;
    key.kind = kind;
    key.dt = dt;
    key.bias_dt = bias ? bias_dt : -1;
    key.epilogue = bias != NULL;
    key.align = al;
    key.fast = (kind == CUDA_LT_FP8 || kind == CUDA_LT_FP8_ROWS) && !(s->qgemm_mode & H3_QGEMM_FP8_EXACT);
    pthread_mutex_lock(&g_plan_mu);
    gemm_plan *p = NULL, *victim = &g_plans[0];
    for (int i = 0; i < N_PLANS; i++) {
        gemm_plan *c = &g_plans[i];
        if (c->valid && c->M == key.M && c->N == key.N && c->K == key.K && c->ldx == key.ldx &&
            c->ldw == key.ldw && c->ldy == key.ldy && c->kind == key.kind && c->dt == key.dt &&
            c->bias_dt == key.bias_dt && c->epilogue == key.epilogue && c->align == key.align &&
            c->fast == key.fast) {
            p = c;
            break;
        }
        if (!c->valid || c->last_use < victim->last_use) victim = c;
    }
    h3_status st = H3_OK;
    if (!p) {
        plan_release(victim);
        *victim = key;
        st = plan_make(s, victim);
        if (st == H3_OK) p = victim;
    }
    if (p) p->last_use = ++g_clock;
    if (st == H3_OK && (kind == CUDA_LT_FP8 || kind == CUDA_LT_FP8_ROWS)) { /* on every call: plans are shared */
        if (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb) !=
                CUBLAS_STATUS_SUCCESS)
            st = H3_ERR(H3_ERR_DEVICE, "cuBLASLt: setting the fp8 GEMM's scales failed");
    }
    if (st == H3_OK) {
        cublasStatus_t r = CUBLAS_STATUS_SUCCESS;
        if (bias)
            r = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        if (r == CUBLAS_STATUS_SUCCESS)
            r = cublasLtMatmul(s->lt, p->op, alpha, w, p->a, x, p->b, beta, y, p->c, y, p->c, &p->algo,
                               s->workspace, s->workspace_size, cuda_stream(ex));
        if (r != CUBLAS_STATUS_SUCCESS)
            st = H3_ERR(H3_ERR_DEVICE, "cuBLASLt matmul M%lld N%lld K%lld failed: status %d", (long long)M,
                        (long long)N, (long long)K, (int)r);
    }
    pthread_mutex_unlock(&g_plan_mu);
    return st;
}

extern "C" h3_status cuda_gemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                               const h3_tensor *bias, unsigned flags) {
    if (w->q.mode != H3_SCALE_NONE || cuda_dt(w->dtype) < 0) return cuda_qgemm(ex, y, x, w, bias, flags);
    int dt = cuda_dt(x->dtype);
    if (dt < 0 || y->dtype != x->dtype)
        return h3_missing_kernel(H3_OP_GEMM, CUDA_NAME, "activations", x->dtype);
    if (w->dtype != x->dtype)
        return h3_missing_kernel(H3_OP_GEMM, CUDA_NAME, "weights (with activations of the same dtype)",
                                 w->dtype);
    if (bias && cuda_dt(bias->dtype) < 0)
        return h3_missing_kernel(H3_OP_GEMM, CUDA_NAME, "bias", bias->dtype);
    rw_view X = rw_of(x), Y = rw_of(y), W = rw_of(w);
    if (X.rows == 0 || W.rows == 0) return H3_OK;
    float alpha = 1.0f, beta = (flags & H3_GEMM_ACCUMULATE) ? 1.0f : 0.0f;
    /* cuBLASLt's bias epilogue wants the bias in the output's dtype: another dtype is added in a pass of its
     * own */
    const int sep = bias && bias->dtype != y->dtype;
    H3_TRY(cuda_lt_matmul(ex, CUDA_LT_FLOAT, dt, X.rows, W.rows, X.cols, w->data, W.ld, x->data, X.ld,
                          y->data, Y.ld, bias && !sep ? bias->data : NULL,
                          bias && !sep ? cuda_dt(bias->dtype) : -1, &alpha, &beta));
    return sep ? cuda_add_bias(ex, y->data, dt, Y.ld, X.rows, W.rows, bias->data, cuda_dt(bias->dtype))
               : H3_OK;
}

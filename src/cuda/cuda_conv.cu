/* Convolutions and the anti-aliased Snake on the GPU: h3_op_conv1d, h3_op_conv_transpose1d, h3_op_snake_aa.
 *
 * conv1d: per chunk of output steps, im2col writes col[b][ci·K + k][j] = x[b][ci][pad((t0 + j)·stride + k·dil −
 * pad_left)] for every item b of the batch into arena scratch, then one cuBLASLt GEMM per group, batched over the
 * items, writes y_b[g·cog.., t0 + j] = W_g [cog, cig·K] · col_b,g. Pointwise convs (K 1, stride 1, no padding)
 * multiply x itself; depthwise filters (one input channel per group) run a direct kernel. The bias is added in a
 * pass of its own (cuBLASLt's bias epilogue runs along the other dimension of these products).
 *
 * conv_transpose1d: y starts as the bias; per chunk of input steps the GEMM writes col_b[co·K + k][j] = Σ_ci
 * x_b[ci][t0 + j]·W[ci][co][k] (per group), then a gather adds to each output the taps that land on it from the
 * chunk: no atomics, the same sums in every run.
 *
 * Row-major [R, C] with a row stride ld is column-major [C, R] with the same ld, so with column-major operands the
 * products are D[steps, Cout] = col[steps, rows] · W[rows, Cout]: A is the column matrix, B the weight (one matrix for
 * every item of the batch: batch stride 0), D the output. f32 is exact f32 (CUBLAS_COMPUTE_32F_PEDANTIC: no TF32), as
 * in cuda_gemm.cu, unless h3_cuda_conv_set_math asks otherwise (benchmarks).
 *
 * Scratch: the columns come from the arena for the length of one call (h3_cuda_conv1d_scratch_bytes and
 * h3_cuda_convt1d_scratch_bytes in cuda.h are the arithmetic the planners use), at most H3_CUDA_CONV_COL_BYTES per
 * chunk. They are given back before the op returns: work queued later on the compute stream that reuses the bytes
 * runs after the GEMMs that read them.
 *
 * snake_aa: one thread block per (row, tile of AA_TN outputs): the inputs the tile reads, the 2·AA_TN + K − 2
 * upsampled and activated values its outputs read, then the outputs, all in shared memory (the CPU kernel in
 * cpu_eltwise.c does the same per tile). */
#include <pthread.h>
#include <string.h>

#include "cuda/cuda_internal.cuh"

/* ---- the batched GEMM ------------------------------------------------------------------------------------- */

#define CG_TRY(call, what)                                                                                       \
    do {                                                                                                         \
        cublasStatus_t s__ = (call);                                                                             \
        if (s__ != CUBLAS_STATUS_SUCCESS) {                                                                      \
            st = H3_ERR(H3_ERR_DEVICE, "cuBLASLt %s failed: status %d", what, (int)s__);                         \
            goto fail;                                                                                           \
        }                                                                                                        \
    } while (0)

typedef struct {
    int64_t m, n, k, lda, ldb, ldd, sa, sd;
    int batch, transb, dt, math, align;
    int valid;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    uint64_t last_use;
} cg_plan;

#define CG_PLANS 96
static cg_plan g_cg[CG_PLANS];
static uint64_t g_cg_clock;
static h3_conv_math g_conv_math[2] = {H3_CONV_EXACT, H3_CONV_TF32}; /* h3_cuda_conv_set_math, by kind */
static pthread_mutex_t g_cg_mu = PTHREAD_MUTEX_INITIALIZER;

extern "C" void h3_cuda_conv_set_math(h3_conv_kind kind, h3_conv_math math) {
    if (kind == H3_CONV_1D) g_conv_math[0] = math >= H3_CONV_EXACT && math <= H3_CONV_TF32 ? math : H3_CONV_EXACT;
    if (kind == H3_CONV_3D) g_conv_math[1] = math == H3_CONV_TF32 ? H3_CONV_TF32 : H3_CONV_EXACT;
}

extern "C" h3_conv_math h3_cuda_conv_math(h3_conv_kind kind) {
    return g_conv_math[kind == H3_CONV_3D ? 1 : 0];
}

static void cg_release(cg_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    p->op = NULL;
    p->a = p->b = p->d = NULL;
    p->valid = 0;
}

extern "C" void cuda_conv_shutdown(void) {
    pthread_mutex_lock(&g_cg_mu);
    for (int i = 0; i < CG_PLANS; i++) cg_release(&g_cg[i]);
    pthread_mutex_unlock(&g_cg_mu);
}

static cudaDataType_t cg_type(int dt) {
    return dt == 1 ? CUDA_R_16BF : dt == 2 ? CUDA_R_16F : CUDA_R_32F;
}

/* A layout of rows × cols (column-major, leading dimension ld), batched with `stride` elements between items. */
static cublasStatus_t cg_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                                int batch, int64_t stride) {
    cublasStatus_t r = cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
    if (r != CUBLAS_STATUS_SUCCESS || batch <= 1) return r;
    int32_t bc = batch;
    r = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    return r;
}

/* Descriptors and the heuristic's algorithm for p (handles NULL); on failure p stays invalid and owns nothing. */
static h3_status cg_make(h3_cuda_state *s, cg_plan *p) {
    h3_status st = H3_OK;
    cublasLtMatmulPreference_t pref = NULL;
    const cudaDataType_t t = cg_type(p->dt);
    const cublasComputeType_t ct = p->dt != 0       ? CUBLAS_COMPUTE_32F
                                   : p->math == 2   ? CUBLAS_COMPUTE_32F_FAST_TF32
                                   : p->math == 1   ? CUBLAS_COMPUTE_32F
                                                    : CUBLAS_COMPUTE_32F_PEDANTIC;
    const cublasOperation_t ta = CUBLAS_OP_N, tb = p->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t ws = s->workspace_size;
    uint32_t al = (uint32_t)p->align;
    static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    cublasStatus_t hs;
    CG_TRY(cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F), "matmul descriptor");
    CG_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    CG_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    CG_TRY(cg_layout(&p->a, t, p->m, p->k, p->lda, p->batch, p->sa), "layout A");
    CG_TRY(p->transb ? cg_layout(&p->b, t, p->n, p->k, p->ldb, p->batch, 0)
                     : cg_layout(&p->b, t, p->k, p->n, p->ldb, p->batch, 0),
           "layout B");
    CG_TRY(cg_layout(&p->d, t, p->m, p->n, p->ldd, p->batch, p->sd), "layout D");
    CG_TRY(cublasLtMatmulPreferenceCreate(&pref), "preference");
    CG_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "set workspace preference");
    for (int i = 0; i < 4; i++)
        CG_TRY(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &al, sizeof al), "set alignment preference");
    hs = cublasLtMatmulAlgoGetHeuristic(s->lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &res, &n);
    if (hs != CUBLAS_STATUS_SUCCESS || n == 0) {
        st = H3_ERR(H3_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for the convolution GEMM m%lld n%lld k%lld batch %d",
                    (long long)p->m, (long long)p->n, (long long)p->k, p->batch);
        goto fail;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    p->algo = res.algo;
    p->valid = 1;
    return H3_OK;
fail:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    cg_release(p);
    return st;
}

/* The largest power of two up to 256 dividing every address and byte stride. */
static int cg_align(uintptr_t a) {
    int al = 256;
    while (al > 1 && (a % (uintptr_t)al)) al /= 2;
    return al;
}

/* Column-major, for i < batch: D_i[m, n] = A_i[m, k] · op(B)[k, n] with A_i = A + i·sa (ld lda), D_i = D + i·sd
 * (ld ldd) and one B for every item: stored [k, n] (ld ldb), or [n, k] when transb. Offsets and strides count
 * elements of dtype dt (cuda_dt codes); every operand has that dtype. One batched cuBLASLt call. */
static h3_status cg_matmul_batched(h3_exec *ex, int dt, int transb, int64_t m, int64_t n, int64_t k, const void *A,
                                   int64_t lda, int64_t sa, const void *B, int64_t ldb, void *D, int64_t ldd,
                                   int64_t sd, int batch) {
    h3_cuda_state *s = cuda_state(ex);
    const uintptr_t es = dt == 0 ? 4 : 2;
    if (batch <= 1) sa = sd = 0;
    cg_plan key;
    memset(&key, 0, sizeof key);
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldd = ldd;
    key.sa = sa;
    key.sd = sd;
    key.batch = batch > 1 ? batch : 1;
    key.transb = transb;
    key.dt = dt;
    key.math = dt == 0 ? (int)g_conv_math[0] : 0;
    key.align = cg_align((uintptr_t)A | (uintptr_t)B | (uintptr_t)D | (uintptr_t)lda * es | (uintptr_t)ldb * es |
                         (uintptr_t)ldd * es | (uintptr_t)sa * es | (uintptr_t)sd * es);
    pthread_mutex_lock(&g_cg_mu);
    cg_plan *p = NULL, *victim = &g_cg[0];
    for (int i = 0; i < CG_PLANS; i++) {
        cg_plan *c = &g_cg[i];
        if (c->valid && c->m == key.m && c->n == key.n && c->k == key.k && c->lda == key.lda && c->ldb == key.ldb &&
            c->ldd == key.ldd && c->sa == key.sa && c->sd == key.sd && c->batch == key.batch &&
            c->transb == key.transb && c->dt == key.dt && c->math == key.math && c->align == key.align) {
            p = c;
            break;
        }
        if (!c->valid || c->last_use < victim->last_use) victim = c;
    }
    h3_status st = H3_OK;
    if (!p) {
        cg_release(victim);
        *victim = key;
        st = cg_make(s, victim);
        if (st == H3_OK) p = victim;
    }
    if (st == H3_OK) {
        p->last_use = ++g_cg_clock;
        const float one = 1.0f, zero = 0.0f;
        cublasStatus_t r = cublasLtMatmul(s->lt, p->op, &one, A, p->a, B, p->b, &zero, D, p->d, D, p->d, &p->algo,
                                          s->workspace, s->workspace_size, cuda_stream(ex));
        if (r != CUBLAS_STATUS_SUCCESS)
            st = H3_ERR((r == CUBLAS_STATUS_NOT_SUPPORTED || r == CUBLAS_STATUS_INVALID_VALUE) && key.batch > 1
                            ? H3_ERR_UNSUPPORTED /* cg_matmul then runs the items one by one */
                            : H3_ERR_DEVICE,
                        "cuBLASLt matmul of a convolution (m%lld n%lld k%lld batch %d) failed: status %d",
                        (long long)m, (long long)n, (long long)k, batch, (int)r);
    }
    pthread_mutex_unlock(&g_cg_mu);
    return st;
}

/* cg_matmul_batched, or one call per item where cuBLASLt has no batched algorithm for the shape (B shared by the
 * items: a batch stride of 0). */
static h3_status cg_matmul(h3_exec *ex, int dt, int transb, int64_t m, int64_t n, int64_t k, const void *A,
                           int64_t lda, int64_t sa, const void *B, int64_t ldb, void *D, int64_t ldd, int64_t sd,
                           int batch) {
    h3_status st = cg_matmul_batched(ex, dt, transb, m, n, k, A, lda, sa, B, ldb, D, ldd, sd, batch);
    if (st != H3_ERR_UNSUPPORTED || batch <= 1) return st;
    h3_clear_error();
    const size_t es = dt == 0 ? 4 : 2;
    st = H3_OK;
    for (int i = 0; i < batch && st == H3_OK; i++)
        st = cg_matmul_batched(ex, dt, transb, m, n, k, (const char *)A + (size_t)(i * sa) * es, lda, 0, B, ldb,
                               (char *)D + (size_t)(i * sd) * es, ldd, 0, 1);
    return st;
}

/* ---- kernels ------------------------------------------------------------------------------------------------ */

#define CV_NT  256 /* threads per block */
#define CV_PER 4   /* steps per thread in the column kernels */

/* Blocks over `cols` columns (per steps of `per` per thread) and `rows` rows (grid y at most 65535: kernels loop). */
static dim3 cv_grid(int64_t cols, int64_t per, int64_t rows) {
    int64_t gx = (cols + CV_NT * per - 1) / (CV_NT * per), gy = rows < 65535 ? rows : 65535;
    return dim3((unsigned)(gx > 0 ? gx : 1), (unsigned)(gy > 0 ? gy : 1));
}

/* col[row][j] for row = (b·cin + ci)·K + k < nrows (all items of the batch, all channels), j < tc:
 * x[b][ci][pad((t0 + j)·stride + k·dil − pl)]. */
__global__ void k_im2col(void *col, const void *x, int dt, int64_t nrows, int64_t tin, int K, int64_t t0, int64_t tc,
                         int stride, int dil, int pl, int mode) {
    const int64_t j0 = (int64_t)blockIdx.x * (CV_NT * CV_PER) + threadIdx.x;
    for (int64_t row = blockIdx.y; row < nrows; row += gridDim.y) {
        const int64_t xrow = row / K, k = row - xrow * K; /* xrow = b·cin + ci */
        const int64_t base = t0 * stride + k * dil - pl;
        for (int i = 0; i < CV_PER; i++) {
            const int64_t j = j0 + (int64_t)i * CV_NT;
            if (j >= tc) break;
            const int64_t src = cuda_pad_index(base + j * stride, tin, mode);
            st_f(col, dt, row * tc + j, src < 0 ? 0.0f : ld_f(x, dt, xrow * tin + src));
        }
    }
}

/* y[row][t] for row < rows (= b·C + c), t < T: set ? bias[c] (0 without a bias) : y + bias[c]. */
__global__ void k_chan_bias(void *y, int dt, int64_t rows, int64_t C, int64_t T, const void *bias, int bdt, int set) {
    const int64_t t0 = (int64_t)blockIdx.x * (CV_NT * CV_PER) + threadIdx.x;
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
        const float bv = bias ? ld_f(bias, bdt, row % C) : 0.0f;
        for (int i = 0; i < CV_PER; i++) {
            const int64_t t = t0 + (int64_t)i * CV_NT;
            if (t >= T) break;
            st_f(y, dt, row * T + t, set ? bv : ld_f(y, dt, row * T + t) + bv);
        }
    }
}

/* Depthwise conv1d (cin groups of one input channel, cog outputs each): for row = b·cout + co,
 * y[row][t] = bias[co] + Σ_k w[co][k]·x[b][co / cog][pad(t·stride + k·dil − pl)]. */
__global__ void k_conv1d_dw(void *y, int ydt, const void *x, int xdt, const void *w, int wdt, const void *bias, int bdt,
                            int64_t rows, int64_t cout, int64_t cog, int64_t cin, int64_t tin, int64_t tout, int K,
                            int stride, int dil, int pl, int mode) {
    const int64_t t = (int64_t)blockIdx.x * CV_NT + threadIdx.x;
    if (t >= tout) return;
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
        const int64_t b = row / cout, co = row - b * cout, xrow = b * cin + co / cog;
        float acc = bias ? ld_f(bias, bdt, co) : 0.0f;
        for (int k = 0; k < K; k++) {
            const int64_t src = cuda_pad_index(t * stride + (int64_t)k * dil - pl, tin, mode);
            if (src >= 0) acc += ld_f(w, wdt, co * K + k) * ld_f(x, xdt, xrow * tin + src);
        }
        st_f(y, ydt, row * tout + t, acc);
    }
}

/* Depthwise conv_transpose1d (w [cin, cog, K], output channel co = ci·cog + j reads input channel ci = co / cog and
 * the weight row co), as a gather: for row = b·cout + co, y[row][o] = bias[co] + Σ_k x[b][co / cog][t]·w[co][k] over
 * the taps with o + pad − k·dil = t·stride, 0 <= t < tin. */
__global__ void k_convt1d_dw(void *y, int ydt, const void *x, int xdt, const void *w, int wdt, const void *bias,
                             int bdt, int64_t rows, int64_t cout, int64_t cog, int64_t cin, int64_t tin, int64_t tout,
                             int K, int stride, int pad, int dil) {
    const int64_t o = (int64_t)blockIdx.x * CV_NT + threadIdx.x;
    if (o >= tout) return;
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
        const int64_t b = row / cout, co = row - b * cout, xrow = b * cin + co / cog;
        float acc = bias ? ld_f(bias, bdt, co) : 0.0f;
        for (int k = 0; k < K; k++) {
            const int64_t num = o + pad - (int64_t)k * dil;
            if (num < 0 || num % stride) continue;
            const int64_t t = num / stride;
            if (t < tin) acc += ld_f(x, xdt, xrow * tin + t) * ld_f(w, wdt, co * K + k);
        }
        st_f(y, ydt, row * tout + o, acc);
    }
}

/* conv_transpose1d's gather after the GEMM of the input chunk [t0, t0 + tc): for row = b·cout + co and
 * o0 <= o < o0 + no, y[row][o] += Σ_k col[row·K + k][t − t0] over the taps with o + pad − k·dil = t·stride and t in
 * the chunk. */
__global__ void k_col2im_add(void *y, int dt, const void *col, int64_t rows, int64_t tout, int K, int64_t t0,
                             int64_t tc, int stride, int pad, int dil, int64_t o0, int64_t no) {
    const int64_t i = (int64_t)blockIdx.x * CV_NT + threadIdx.x;
    if (i >= no) return;
    const int64_t o = o0 + i;
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            const int64_t num = o + pad - (int64_t)k * dil;
            if (num < 0 || num % stride) continue;
            const int64_t t = num / stride;
            if (t >= t0 && t < t0 + tc) acc += ld_f(col, dt, (row * K + k) * tc + (t - t0));
        }
        st_f(y, dt, row * tout + o, ld_f(y, dt, row * tout + o) + acc);
    }
}

#define AA_TN 256                                /* outputs per block and row */
#define AA_XM (H3_SNAKE_AA_MAX_TAPS / 2 + 1)     /* input halo each side: K/2 + 1 for every K allowed */
#define AA_NV (2 * AA_TN + H3_SNAKE_AA_MAX_TAPS) /* activated values a tile reads: 2·AA_TN + K − 2 at most */

/* h3_op_snake_aa: x, y [rows, L] (row = b·C + c). With H = K/2 − 1, for outputs n0 <= n < n0 + AA_TN:
 *   xs[i] = x[clamp(n0 − AA_XM + i)]                                          (replicate padding of the input)
 *   v[jj] = snake(u(j)), j = clamp(2·n0 − H + jj) < 2L,  u(j) = 2·Σ_{m ≡ j+H (2)} up[m]·x[clamp((j + H − m)/2)]
 *   y[n]  = Σ_k down[k]·v[2·(n − n0) + k]                                     (replicate padding of v)
 * (j + H − m)/2 lies in [n0 − K/2, n0 + AA_TN + K/2], inside xs; the clamp of j only moves it towards the tile. */
__global__ void k_snake_aa(void *y, const void *x, int dt, int64_t rows, int64_t C, int64_t L, const void *al, int adt,
                           const void *be, int bdt, int logscale, const void *up, const void *down, int fdt, int K) {
    __shared__ float xs[AA_TN + 2 * AA_XM], vs[AA_NV], fu[H3_SNAKE_AA_MAX_TAPS], fd[H3_SNAKE_AA_MAX_TAPS];
    const int H = K / 2 - 1, nv = 2 * AA_TN + K - 2;
    const int64_t n0 = (int64_t)blockIdx.x * AA_TN, x0 = n0 - AA_XM;
    if (threadIdx.x < K) {
        fu[threadIdx.x] = ld_f(up, fdt, threadIdx.x);
        fd[threadIdx.x] = ld_f(down, fdt, threadIdx.x);
    }
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
        const int64_t c = row % C;
        float a = ld_f(al, adt, c), b = be ? ld_f(be, bdt, c) : a;
        if (logscale) {
            a = expf(a);
            b = expf(b);
        }
        const float inv = 1.0f / (b + 1e-9f);
        __syncthreads(); /* the filters are in; the previous row's tiles are no longer read */
        for (int i = threadIdx.x; i < AA_TN + 2 * AA_XM; i += blockDim.x) {
            const int64_t s = x0 + i;
            xs[i] = ld_f(x, dt, row * L + (s < 0 ? 0 : s >= L ? L - 1 : s));
        }
        __syncthreads();
        for (int jj = threadIdx.x; jj < nv; jj += blockDim.x) {
            int64_t j = 2 * n0 - H + jj;
            j = j < 0 ? 0 : j > 2 * L - 1 ? 2 * L - 1 : j;
            float u = 0.0f;
            for (int m = (int)((j + H) & 1); m < K; m += 2) u += fu[m] * xs[(j + H - m) / 2 - x0];
            u *= 2.0f;
            const float sn = sinf(a * u);
            vs[jj] = u + inv * sn * sn;
        }
        __syncthreads();
        for (int n = threadIdx.x; n < AA_TN; n += blockDim.x) {
            if (n0 + n >= L) break;
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += fd[k] * vs[2 * n + k];
            st_f(y, dt, row * L + n0 + n, acc);
        }
    }
}

/* ---- the ops ------------------------------------------------------------------------------------------------ */

/* Element i of dtype size es at p (operands of the GEMMs; A and B are only read). */
static inline void *cv_at(const void *p, int64_t i, size_t es) {
    return (char *)p + (size_t)i * es;
}

static h3_status cv_need_one_dtype(h3_op_id op, const h3_tensor *y, const h3_tensor *x, const h3_tensor *w) {
    if (w->dtype != x->dtype || y->dtype != x->dtype)
        return h3_missing_kernel(op, CUDA_NAME, "weights or outputs in another dtype than the input (the GEMM path)",
                                 w->dtype != x->dtype ? w->dtype : y->dtype);
    return H3_OK;
}

static h3_status cuda_conv1d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                             const h3_conv1d_params *p) {
    H3_TRY(cuda_need_float(H3_OP_CONV1D, "x", x));
    H3_TRY(cuda_need_float(H3_OP_CONV1D, "y", y));
    H3_TRY(cuda_need_float(H3_OP_CONV1D, "weight", w));
    H3_TRY(cuda_need_float(H3_OP_CONV1D, "bias", b));
    const int o = x->ndim - 2; /* [B, C, T] or [C, T] */
    const int64_t B = o ? x->shape[0] : 1, cin = x->shape[o], tin = x->shape[o + 1], cout = w->shape[0];
    const int64_t K = w->shape[2], tout = y->shape[o + 1];
    const int g = p->groups > 0 ? p->groups : 1;
    const int64_t cig = cin / g, cog = cout / g;
    if (B == 0 || cout == 0 || tout == 0) return H3_OK;
    const int bdt = b ? cuda_dt(b->dtype) : 0;
    if (cig == 1) {
        k_conv1d_dw<<<cv_grid(tout, 1, B * cout), CV_NT, 0, cuda_stream(ex)>>>(
            y->data, cuda_dt(y->dtype), x->data, cuda_dt(x->dtype), w->data, cuda_dt(w->dtype), b ? b->data : NULL,
            bdt, B * cout, cout, cog, cin, tin, tout, (int)K, p->stride, p->dilation, p->pad_left, (int)p->pad_mode);
        CU_LAUNCHED("conv1d (depthwise)");
        return H3_OK;
    }
    H3_TRY(cv_need_one_dtype(H3_OP_CONV1D, y, x, w));
    const int dt = cuda_dt(x->dtype);
    const size_t es = h3_dtype_size(x->dtype);
    h3_cuda_state *s = cuda_state(ex);
    const int64_t scratch = h3_cuda_conv1d_scratch_bytes(B, cin, K, tout, p, (int64_t)es);
    void *col = NULL;
    if (scratch && !(col = cuda_arena_alloc(s, (size_t)scratch)))
        return h3_error_wrap(H3_ERR_NOMEM, "op 'conv1d' on the device: %.1f MiB of im2col columns",
                             scratch / 1048576.0);
    h3_status st = H3_OK;
    if (!col) { /* pointwise: y_b,g [tout, cog] = x_b,g [tin = tout, cig] · W_g [cig, cog] (column-major) */
        for (int gi = 0; gi < g && st == H3_OK; gi++)
            st = cg_matmul(ex, dt, 0, tout, cog, cig, cv_at(x->data, gi * cig * tin, es), tin, cin * tin,
                           cv_at(w->data, gi * cog * cig, es), cig, cv_at(y->data, gi * cog * tout, es), tout,
                           cout * tout, (int)B);
    } else {
        const int64_t rows = cin * K, tc_max = h3_cuda_conv_col_steps(B * rows * (int64_t)es, tout);
        for (int64_t t0 = 0; t0 < tout && st == H3_OK; t0 += tc_max) {
            const int64_t tc = tout - t0 < tc_max ? tout - t0 : tc_max;
            k_im2col<<<cv_grid(tc, CV_PER, B * rows), CV_NT, 0, cuda_stream(ex)>>>(
                col, x->data, dt, B * rows, tin, (int)K, t0, tc, p->stride, p->dilation, p->pad_left,
                (int)p->pad_mode);
            cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess) {
                st = H3_ERR(H3_ERR_DEVICE, "kernel im2col failed to launch: %s", cudaGetErrorString(e));
                break;
            }
            /* y_b[g·cog.., t0..t0+tc) as [tc, cog] (ld tout) = col_b,g [tc, cig·K] (ld tc) · W_g [cig·K, cog] */
            for (int gi = 0; gi < g && st == H3_OK; gi++)
                st = cg_matmul(ex, dt, 0, tc, cog, cig * K, cv_at(col, gi * cig * K * tc, es), tc, rows * tc,
                               cv_at(w->data, gi * cog * cig * K, es), cig * K,
                               cv_at(y->data, gi * cog * tout + t0, es), tout, cout * tout, (int)B);
        }
    }
    if (st == H3_OK && b) {
        k_chan_bias<<<cv_grid(tout, CV_PER, B * cout), CV_NT, 0, cuda_stream(ex)>>>(y->data, dt, B * cout, cout, tout,
                                                                                  b->data, bdt, 0);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            st = H3_ERR(H3_ERR_DEVICE, "kernel conv1d bias failed to launch: %s", cudaGetErrorString(e));
    }
    cuda_arena_free(s, col);
    return st;
}

static h3_status cuda_conv_transpose1d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                                       const h3_tensor *b, const h3_convt1d_params *p) {
    H3_TRY(cuda_need_float(H3_OP_CONV_TRANSPOSE1D, "x", x));
    H3_TRY(cuda_need_float(H3_OP_CONV_TRANSPOSE1D, "y", y));
    H3_TRY(cuda_need_float(H3_OP_CONV_TRANSPOSE1D, "weight", w));
    H3_TRY(cuda_need_float(H3_OP_CONV_TRANSPOSE1D, "bias", b));
    const int o = x->ndim - 2;
    const int64_t B = o ? x->shape[0] : 1, cin = x->shape[o], tin = x->shape[o + 1], cout = y->shape[o];
    const int64_t cog = w->shape[1], K = w->shape[2], tout = y->shape[o + 1];
    const int g = p->groups > 0 ? p->groups : 1, dil = p->dilation > 0 ? p->dilation : 1;
    const int64_t cig = cin / g;
    if (B == 0 || cout == 0 || tout == 0) return H3_OK;
    const int bdt = b ? cuda_dt(b->dtype) : 0;
    if (cig == 1) {
        k_convt1d_dw<<<cv_grid(tout, 1, B * cout), CV_NT, 0, cuda_stream(ex)>>>(
            y->data, cuda_dt(y->dtype), x->data, cuda_dt(x->dtype), w->data, cuda_dt(w->dtype), b ? b->data : NULL,
            bdt, B * cout, cout, cog, cin, tin, tout, (int)K, p->stride, p->padding, dil);
        CU_LAUNCHED("conv_transpose1d (depthwise)");
        return H3_OK;
    }
    H3_TRY(cv_need_one_dtype(H3_OP_CONV_TRANSPOSE1D, y, x, w));
    const int dt = cuda_dt(x->dtype);
    const size_t es = h3_dtype_size(x->dtype);
    h3_cuda_state *s = cuda_state(ex);
    const int64_t scratch = h3_cuda_convt1d_scratch_bytes(B, cin, cout, K, tin, g, (int64_t)es);
    void *col = cuda_arena_alloc(s, (size_t)scratch);
    if (!col)
        return h3_error_wrap(H3_ERR_NOMEM, "op 'conv_transpose1d' on the device: %.1f MiB of columns",
                             scratch / 1048576.0);
    h3_status st = H3_OK;
    k_chan_bias<<<cv_grid(tout, CV_PER, B * cout), CV_NT, 0, cuda_stream(ex)>>>(y->data, dt, B * cout, cout, tout,
                                                                              b ? b->data : NULL, bdt, 1);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        st = H3_ERR(H3_ERR_DEVICE, "kernel conv_transpose1d bias failed to launch: %s", cudaGetErrorString(e));
    const int64_t tc_max = h3_cuda_conv_col_steps(B * cout * K * (int64_t)es, tin);
    for (int64_t t0 = 0; t0 < tin && st == H3_OK; t0 += tc_max) {
        const int64_t tc = tin - t0 < tc_max ? tin - t0 : tc_max;
        /* col_b[(g·cog + c)·K + k][j] as [tc, cog·K] (ld tc) = x_b,g[:, t0..] as [tc, cig] (ld tin) · W_g, W_g stored
         * [cig, cog·K] row-major = column-major [cog·K, cig] (ld cog·K), used transposed */
        for (int gi = 0; gi < g && st == H3_OK; gi++)
            st = cg_matmul(ex, dt, 1, tc, cog * K, cig, cv_at(x->data, gi * cig * tin + t0, es), tin, cin * tin,
                           cv_at(w->data, gi * cig * cog * K, es), cog * K, cv_at(col, gi * cog * K * tc, es), tc,
                           cout * K * tc, (int)B);
        if (st != H3_OK) break;
        int64_t o0 = t0 * p->stride - p->padding, o1 = (t0 + tc - 1) * p->stride - p->padding + (K - 1) * dil + 1;
        if (o0 < 0) o0 = 0;
        if (o1 > tout) o1 = tout;
        if (o1 <= o0) continue;
        k_col2im_add<<<cv_grid(o1 - o0, 1, B * cout), CV_NT, 0, cuda_stream(ex)>>>(
            y->data, dt, col, B * cout, tout, (int)K, t0, tc, p->stride, p->padding, dil, o0, o1 - o0);
        e = cudaGetLastError();
        if (e != cudaSuccess) st = H3_ERR(H3_ERR_DEVICE, "kernel col2im failed to launch: %s", cudaGetErrorString(e));
    }
    cuda_arena_free(s, col);
    return st;
}

static h3_status cuda_snake_aa(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *alpha,
                               const h3_tensor *beta, const h3_tensor *up, const h3_tensor *down, unsigned flags) {
    H3_TRY(cuda_need_float(H3_OP_SNAKE_AA, "x", x));
    H3_TRY(cuda_need_float(H3_OP_SNAKE_AA, "y", y));
    H3_TRY(cuda_need_float(H3_OP_SNAKE_AA, "alpha", alpha));
    H3_TRY(cuda_need_float(H3_OP_SNAKE_AA, "beta", beta));
    H3_TRY(cuda_need_float(H3_OP_SNAKE_AA, "filter", up));
    H3_TRY(cuda_need_float(H3_OP_SNAKE_AA, "filter", down));
    if (up->dtype != down->dtype)
        return H3_ERR(H3_ERR_INVALID, "op 'snake_aa' on the device: the two filters need one dtype");
    if (x->dtype != y->dtype)
        return h3_missing_kernel(H3_OP_SNAKE_AA, CUDA_NAME, "an output unlike its input", y->dtype);
    const int64_t L = x->shape[x->ndim - 1], C = x->shape[x->ndim - 2], rows = h3_tensor_rows(x);
    if (rows == 0 || L == 0) return H3_OK;
    k_snake_aa<<<cv_grid(L, AA_TN / CV_NT, rows), CV_NT, 0, cuda_stream(ex)>>>(
        y->data, x->data, cuda_dt(x->dtype), rows, C, L, alpha->data, cuda_dt(alpha->dtype), beta ? beta->data : NULL,
        beta ? cuda_dt(beta->dtype) : 0, (flags & H3_SNAKE_LOGSCALE) ? 1 : 0, up->data, down->data,
        cuda_dt(up->dtype), (int)h3_tensor_numel(up));
    CU_LAUNCHED("snake_aa");
    return H3_OK;
}

extern "C" void cuda_conv_table(h3_backend *t) {
    t->conv1d = cuda_conv1d;
    t->conv_transpose1d = cuda_conv_transpose1d;
    t->snake_aa = cuda_snake_aa;
}

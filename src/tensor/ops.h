/* The op API: every computation the models do, declared once.
 *
 * Model code calls h3_op_* only. Each op validates shapes here, checks that all tensors share a place, and
 * dispatches to the backend of that place (host and pinned host -> CPU, device -> CUDA). A backend that lacks
 * a kernel for an op or a dtype returns H3_ERR_UNSUPPORTED with a message naming the op, the backend and the
 * dtype. Ops never allocate their outputs: the caller provides them (so the planner can account for them).
 *
 * Conventions: shapes are row-major, outermost first. "Row-wise" tensors have a contiguous last dim and a
 * constant row stride (views of rows, or of column blocks of a wider matrix, qualify). Unless an op says
 * otherwise, y may alias x (in-place) but must not partially overlap it.
 */
#ifndef H3_TENSOR_OPS_H
#define H3_TENSOR_OPS_H

#include <math.h>

#include "base/threads.h"
#include "tensor/tensor.h"

typedef struct h3_exec {
    h3_pool *pool; /* CPU worker threads; NULL runs CPU kernels on the calling thread */
    int threads;
    void *cuda; /* device backend state (streams, BLAS handles, workspace), NULL without one */
    /* Profiling (off unless set): each op waits for the device before and after, and its wall time is added
     * to prof_s[op] and counted in prof_n[op]. Serializes the device: for finding where time goes, not for
     * speed. */
    int profile;
    double prof_s[32];
    int64_t prof_n[32];
} h3_exec;

/* threads <= 0: one per CPU; more than H3_MAX_THREADS (base/threads.h) is H3_ERR_INVALID. */
h3_status h3_exec_init(h3_exec *ex, int threads);
void h3_exec_free(h3_exec *ex);

typedef enum h3_op_id {
    H3_OP_GEMM = 0,
    H3_OP_RMS_NORM,
    H3_OP_LAYER_NORM,
    H3_OP_GROUP_NORM,
    H3_OP_UNARY,
    H3_OP_SNAKE,
    H3_OP_SOFTMAX,
    H3_OP_ROPE,
    H3_OP_ATTENTION,
    H3_OP_CONV1D,
    H3_OP_CONV_TRANSPOSE1D,
    H3_OP_CONV3D,
    H3_OP_GATHER_ROWS,
    H3_OP_SCATTER_ROWS,
    H3_OP_BINARY,
    H3_OP_SCALE,
    H3_OP_SWIGLU,
    H3_OP_MODULATE,
    H3_OP_GATED_ADD,
    H3_OP_CONVERT,
    H3_OP_FILL,
    H3_OP_CLAMP,
    H3_OP_RANDOM,
    H3_OP_RMS_NORM_MODULATE,
    H3_OP_QK_NORM_ROPE,
    H3_OP_SNAKE_AA,
    H3_OP_ATTENTION_SPARSE,
    H3_OP_COUNT
} h3_op_id;

const char *h3_op_name(h3_op_id op);

/* ---- linear algebra ------------------------------------------------------------------------------------ */

#define H3_GEMM_ACCUMULATE 1u /* y += x·wᵀ (+ bias) instead of y = ... */

/* y[M,N] = x[M,K] · w[N,K]ᵀ + bias[N].  x, y row-wise f32 on the CPU; w any weight dtype the backend takes
 * (CPU: f32, bf16, f16, f64, fp8 and i8 with scales); bias f32/bf16/f16 or NULL. y must not alias x or w. */
h3_status h3_op_gemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *bias,
                     unsigned flags);

/* ---- normalization ------------------------------------------------------------------------------------- */

/* Over the last dim: y = x / sqrt(mean(x²) + eps) · w.  w [C] or NULL (no affine). */
h3_status h3_op_rms_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, float eps);
/* Over the last dim: y = (x − mean) / sqrt(var + eps) · w + b.  w, b [C] or NULL. */
h3_status h3_op_layer_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                           const h3_tensor *b, float eps);
/* x, y [B, C, S], each S row contiguous (B and C may be strided, as a [C, T, S] buffer's frames seen as [T, C, S]);
 * y is x itself or apart from it: statistics per (b, group) over C/groups channels × S; then per-channel w, b. */
h3_status h3_op_group_norm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, int groups, const h3_tensor *w,
                           const h3_tensor *b, float eps);

/* Fused AdaLN pre-norm: y[r] = rms_norm(x[r])·w · (1 + scale[idx[r]]) + shift[idx[r]] (one pass instead of
 * two; same contract as h3_op_rms_norm followed by h3_op_modulate). */
h3_status h3_op_rms_norm_modulate(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                                  float eps, const h3_tensor *shift, const h3_tensor *scale,
                                  const h3_tensor *idx);
/* Per-head QK-RMSNorm then rotary embedding, in place on x [S, H, D]: x = rope(rms_norm(x)·w) with w [D] and
 * cos/sin [S, R] (h3_op_rms_norm over head rows followed by h3_op_rope, in one pass). */
h3_status h3_op_qk_norm_rope(h3_exec *ex, h3_tensor *x, const h3_tensor *w, float eps, const h3_tensor *cos,
                             const h3_tensor *sin);

/* ---- activations --------------------------------------------------------------------------------------- */

typedef enum h3_unary {
    H3_UNARY_SILU = 0,  /* x·σ(x) */
    H3_UNARY_GELU,      /* exact, with erf */
    H3_UNARY_GELU_TANH, /* tanh approximation */
    H3_UNARY_TANH,
    H3_UNARY_SIGMOID,
    H3_UNARY_EXP,
    H3_UNARY_COUNT
} h3_unary;
h3_status h3_op_unary(h3_exec *ex, h3_tensor *y, const h3_tensor *x, h3_unary kind);

#define H3_SNAKE_LOGSCALE 1u /* parameters are stored as logs: alpha = exp(alpha), beta = exp(beta) */
/* x, y [C, T]: y = x + 1/(β + 1e-9) · sin²(α·x) per channel. beta NULL: β = α (Snake); else SnakeBeta. */
h3_status h3_op_snake(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *alpha,
                      const h3_tensor *beta, unsigned flags);
/* The anti-aliased Snake(Beta) of BigVGAN (alias-free-torch's Activation1d at ratio 2) in one pass: x, y [C,
 * T] or [B, C, T], contiguous, y not aliasing x; alpha, beta [C] as in h3_op_snake; up, down: the two
 * resampling filters, K values each (K even, 2..64; any float dtype, contiguous, e.g. the stored [1, 1, K]).
 * With H = K/2 − 1: u[j] = 2 · Σ_m up[m] · x[clamp((j + H − m)/2)]  over m ≡ j + H (mod 2), j < 2T
 * (replicate-pad H, transposed conv at stride 2, ×2, 3H cut from each end: the ×2 upsampler) v[j] =
 * snake(u[j]) y[n] = Σ_k down[k] · v[clamp(2n + k − H)]  (replicate-pad H left and H + 1 right, conv at
 * stride 2) with clamp into the signal (replicate padding). Equal to pad, conv_transpose1d, snake and conv1d
 * in sequence. */
h3_status h3_op_snake_aa(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *alpha,
                         const h3_tensor *beta, const h3_tensor *up, const h3_tensor *down, unsigned flags);
#define H3_SNAKE_AA_MAX_TAPS 64
/* Softmax over the last dim. */
h3_status h3_op_softmax(h3_exec *ex, h3_tensor *y, const h3_tensor *x);
/* y = clamp(x, lo, hi). */
h3_status h3_op_clamp(h3_exec *ex, h3_tensor *y, const h3_tensor *x, float lo, float hi);

/* ---- attention ----------------------------------------------------------------------------------------- */

/* x, y [S, H, D] (last two dims contiguous, any row stride): rotate-half rotary embedding on the first R
 * channels of every head, cos/sin [S, R] f32 (R even, R <= D); channels R..D-1 pass through.
 *   y[i]     = x[i]·cos[i]     − x[i+R/2]·sin[i]       (i < R/2)
 *   y[i+R/2] = x[i+R/2]·cos[i+R/2] + x[i]·sin[i+R/2] */
h3_status h3_op_rope(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *cos,
                     const h3_tensor *sin);

#define H3_ATTN_CAUSAL 1u /* query i sees keys 0..i (+ Sk − Sq offset when Sk > Sq) */
/* q and k in int8, v and P·V in float8 e4m3 (docs/CUDA.md "fp8 attention", SageAttention 2's recipe): k less
 * its mean over all keys per head and channel (softmax-invariant), then q and k with one scale per head and
 * block of 128 rows (k: 192 with H3_ATTN_FP8_K192; max|x|/127, rounded to nearest even), v in e4m3 with one
 * scale per head and channel (max|v|/448); per query row and block of keys (k's blocks) in order,
 * s = (q8·k8)·sq·sk·scale (base 2), the online softmax in f32 with p = exp2(s − max + 8) (at most 256) taken
 * straight as an e4m3 code by the exponent's linear interpolation, P = e4m3(max(0, rint(8·(s − max + 8) + 56
 * + H3_ATTN_FP8_CODE_SHIFT))) (2^f as 1 + f: P 3.1% rms off exp2, against 2.6% for exp2 rounded to e4m3, and
 * no exponential to compute), l = Σ P (the probabilities P·V takes), P·V with P and v8, o = Σ·sv / l. The
 * device runs it on sm_89+ (Hopper's wgmma kernel, Ada's and Blackwell's mma.sync one) at head size 128 with
 * bf16 q, k, v only (H3_ERR_UNSUPPORTED elsewhere); the CPU computes the same at any head size (the tests'
 * reference). */
#define H3_ATTN_FP8 2u
/* fp8's probability codes: round(8x + 56 + shift) for p = 2^x. −0.375 shifts the linear mantissa's error (2^f
 * as 1 + f, always over) toward none: off exact attention it lands within 2% of the best of the shifts 0 to
 * −0.5 at each sharpness tried (bench/fp8_p_code.c), and x = 8 still lands on 256. */
#define H3_ATTN_FP8_CODE_SHIFT (-0.375f)
/* With H3_ATTN_FP8: k's scale blocks and the softmax's key blocks of 192 rows instead of 128, as Hopper's fp8
 * kernel tiles them (query blocks stay 128). The CPU computes what it is asked; the device computes its
 * kernel's blocks whatever this bit says (192 with Hopper's kernel, 128 with the mma.sync one):
 * h3_cuda_attention_ref_flags gives the flags under which the CPU reproduces a device's result. */
#define H3_ATTN_FP8_K192 16u /* (8u is dit.h's H3_ATTN_SPARSE) */
/* q and k in int8, v and P·V in f16 (docs/CUDA.md "int8 attention", SageAttention's recipe): k less its mean
 * over all keys per head and channel (softmax-invariant), then q and k with one scale per head and block of
 * 64 rows (max|x|/127, round to nearest even); v in f16 as v·(256/max|v|) per head and channel. Per query row
 * and block of 64 keys in order, s = (q8·k8)·sq·sk·scale (base 2, the integer dot product exact), the online
 * softmax in f32 with p = exp2(s − max), l = Σp, P·V with f16(p) and the f16 v, o = Σ·max|v|/256 / l. The
 * device runs it on sm_75+ at head size 128 with bf16 q, k, v (H3_ERR_UNSUPPORTED elsewhere); the CPU at any
 * head size. */
#define H3_ATTN_INT8 4u
/* o[Sq, Hq, D] = softmax(q·kᵀ·scale)·v per head; k, v [Sk, Hk, D] with Hq a multiple of Hk (grouped-query:
 * query head h reads key head h / (Hq/Hk)). Last two dims contiguous, any row stride. Computed in tiles with
 * memory linear in sequence length. o must not alias q, k or v. */
h3_status h3_op_attention(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                          const h3_tensor *v, float scale, unsigned flags);

/* Block-sparse attention (docs/CUDA.md "sparse attention"; Sol-Attn's rule on tiles of H3_SPARSE_TILE rows):
 * self-attention, q, k, v, o [S, H, D] (Hq = Hk). Per head, q tile i's centroid c_i (the mean of its rows) scores
 * every key tile j's centroid kc_j: r_ij = (c_i·kc_j)·scale·log2(e), in double precision (h3_sparse_score). Key
 * tile j is computed exactly for the rows of tile i when r_ij > mean_j(r_i·) + tau·sqrt(var_j(r_i·) + 1e-6)
 * (h3_sparse_threshold), when |i − j| <= 1, or when p->exact_tiles marks tile j; a marked query tile attends every
 * key exactly. Every other key tile j enters the softmax as one key, its centroid kc_j with the weight of its
 * len_j rows (score + log(len_j)) and value vc_j (the mean of its v rows); kc and vc are rounded to bf16 (the
 * device's tensor cores read them so; the host does the same). The selection is the same bits on every backend
 * (fixed-order double sums and explicit fma), so a device result can be checked against the host's. */
#define H3_SPARSE_TILE 128
typedef struct h3_sparse_attn {
    float tau;                  /* the threshold in standard deviations of the tile's scores (Sol-Attn: 1.3) */
    const uint8_t *exact_tiles; /* host [⌈S/128⌉] or NULL: 1 where tile t (rows 128t..) holds a row that stays
                                 * exact both ways (H3: the text and audio rows, the video is sparse) */
    int64_t *n_exact;           /* or NULL: receives the (head, query tile, key tile) triples computed exactly, of
                                 * H·⌈S/128⌉² (the device waits for its selection to count them) */
} h3_sparse_attn;
h3_status h3_op_attention_sparse(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                                 const h3_tensor *v, float scale, const h3_sparse_attn *p);

/* The selection's arithmetic, shared by the backends so that they pick the same tiles. */
static inline H3_HD double h3_sparse_score(const double *c, const double *kc, int D, double scale_log2) {
    double acc = 0.0;
    for (int d = 0; d < D; d++) acc = fma(c[d], kc[d], acc);
    return acc * scale_log2;
}
/* mean + tau·sqrt(var + 1e-6) of r[0..n−1], summed in order. */
static inline H3_HD double h3_sparse_threshold(const double *r, int n, double tau) {
    double sum = 0.0, var = 0.0;
    for (int j = 0; j < n; j++) sum += r[j];
    const double mean = sum / n;
    for (int j = 0; j < n; j++) {
        const double e = r[j] - mean;
        var = fma(e, e, var);
    }
    return fma(tau, sqrt(var / n + 1e-6), mean);
}
/* Whether key tile j is exact for query tile i given its score r and the threshold. */
static inline H3_HD int h3_sparse_exact(int i, int j, double r, double thr, int q_exact, int k_exact) {
    return q_exact || k_exact || (i - j <= 1 && j - i <= 1) || r > thr;
}

/* ---- convolutions -------------------------------------------------------------------------------------- */

typedef enum h3_pad_mode { H3_PAD_ZEROS = 0, H3_PAD_REFLECT, H3_PAD_REPLICATE } h3_pad_mode;

typedef struct h3_conv1d_params {
    int stride, dilation, groups;
    int pad_left, pad_right;
    h3_pad_mode pad_mode;
} h3_conv1d_params;
/* x [Cin, Tin] or [B, Cin, Tin] (a batch: every item through the same weights), w [Cout, Cin/groups, K], b
 * [Cout] or NULL, y [Cout, Tout] or [B, Cout, Tout] (x's rank) with Tout = (Tin + pad_left + pad_right −
 * dilation·(K−1) − 1)/stride + 1. All contiguous; y must not alias x. */
h3_status h3_op_conv1d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                       const h3_conv1d_params *p);

typedef struct h3_convt1d_params {
    int stride, padding, output_padding, groups, dilation;
} h3_convt1d_params;
/* PyTorch ConvTranspose1d: x [Cin, Tin] or [B, Cin, Tin], w [Cin, Cout/groups, K], y [Cout, Tout] or
 * [B, Cout, Tout] (x's rank) with Tout = (Tin−1)·stride − 2·padding + dilation·(K−1) + output_padding + 1.
 * All contiguous; y must not alias x. */
h3_status h3_op_conv_transpose1d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                                 const h3_tensor *b, const h3_convt1d_params *p);
/* Host scratch the CPU kernels of these two ops allocate per call with contiguous f32 weights and bias (other
 * weights add an f32 copy of themselves): the im2col column chunk, 0 on the direct depthwise paths; the same
 * for a batch (its items reuse the chunk). Memory planners call these so that they cannot drift from the
 * kernels (the device's: h3_cuda_conv1d_scratch_bytes in cuda/cuda.h). */
int64_t h3_cpu_conv1d_scratch_bytes(int64_t cin_per_group, int64_t K, int64_t tout);
/* Host scratch of the CPU GEMM y = x·wᵀ with w [N, K] of dtype wdt (quantized: scales or packed blocks): the
 * converted weight panel, or the f32 copy of a bias in another dtype, whichever is larger (one at a time). */
int64_t h3_cpu_gemm_scratch_bytes(int64_t N, int64_t K, h3_dtype wdt, int quantized);
/* Host scratch of the CPU attention kernel with `threads` workers and head size D (its score and output
 * tiles). */
int64_t h3_cpu_attention_scratch_bytes(int threads, int64_t D);
int64_t h3_cpu_convt1d_scratch_bytes(int64_t cout_per_group, int64_t cin_per_group, int64_t K, int64_t tin);
/* Host scratch of the CPU h3_op_snake_aa over C channels with alpha and beta (their f32 copies). */
int64_t h3_cpu_snake_aa_scratch_bytes(int64_t C);

typedef struct h3_conv3d_params {
    int stride[3]; /* t, h, w */
    int pad[3][2]; /* before/after per axis: causal temporal padding is {k−1, 0} */
    h3_pad_mode pad_mode[3];
} h3_conv3d_params;
/* x [Cin, T, H, W], w [Cout, Cin, kt, kh, kw], b [Cout] or NULL, y [Cout, To, Ho, Wo]. */
/* Host scratch of the CPU conv3d with contiguous f32 weights: the im2col column chunk of rows = Cin·kt·kh·kw
 * over npos output positions (other weight dtypes add an f32 copy of the weight and bias). */
int64_t h3_cpu_conv3d_scratch_bytes(int64_t rows, int64_t npos);
h3_status h3_op_conv3d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                       const h3_conv3d_params *p);

/* ---- rows ---------------------------------------------------------------------------------------------- */

/* y[i, :] = x[idx[i], :]. idx I32 or I64 [n], y [n, C]. */
h3_status h3_op_gather_rows(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *idx);
/* y[idx[i], :] = x[i, :]; rows of y not named by idx are untouched. Indices must be distinct. */
h3_status h3_op_scatter_rows(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *idx);

/* ---- elementwise --------------------------------------------------------------------------------------- */

typedef enum h3_binary { H3_BINARY_ADD = 0, H3_BINARY_SUB, H3_BINARY_MUL, H3_BINARY_COUNT } h3_binary;
/* y = a op b. b has a's shape, or is [C] (one row, broadcast over rows), or has one element. */
h3_status h3_op_binary(h3_exec *ex, h3_tensor *y, const h3_tensor *a, const h3_tensor *b, h3_binary kind);
/* y = alpha·x + beta. */
h3_status h3_op_scale(h3_exec *ex, h3_tensor *y, const h3_tensor *x, float alpha, float beta);
/* x [M, 2F] -> y [M, F]: y = silu(gate) · value. gate_first: x = [gate | value] (H3 official fc1);
 * otherwise x = [value | gate] (diffusers' order). y must not alias x. */
h3_status h3_op_swiglu(h3_exec *ex, h3_tensor *y, const h3_tensor *x, int gate_first);
/* AdaLN: y[r] = x[r] · (1 + scale[idx[r]]) + shift[idx[r]].  shift, scale [T, C] row-wise (views into one
 * modulation table are fine); idx I32/I64 [rows of x], or NULL when T == 1. */
h3_status h3_op_modulate(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *shift,
                         const h3_tensor *scale, const h3_tensor *idx);
/* Gated residual: x[r] += gate[idx[r]] · h[r].  gate [T, C] row-wise, idx I32/I64 or NULL when T == 1
 * (then gate may be [C]). */
h3_status h3_op_gated_add(h3_exec *ex, h3_tensor *x, const h3_tensor *h, const h3_tensor *gate,
                          const h3_tensor *idx);
/* y = x converted to y's dtype (same shape; also a plain copy when dtypes match). */
h3_status h3_op_convert(h3_exec *ex, h3_tensor *y, const h3_tensor *x);
h3_status h3_op_fill(h3_exec *ex, h3_tensor *y, float value);
/* y[i] = lo + (hi − lo)·u_i with u_i = (splitmix64(seed + i) >> 40)·2⁻²⁴, i the element's row-major logical
 * index: the same values on every backend (up to the last bit of the final rounding), for synthetic weights
 * in tests and benchmarks that must not go through host memory. */
h3_status h3_op_random_uniform(h3_exec *ex, h3_tensor *y, uint64_t seed, float lo, float hi);
/* (H3_HD, tensor/dtype.h: the CUDA kernel of random_uniform calls h3_random_unit too.) */
/* u_i of h3_op_random_uniform: a float in [0, 1). */
static inline H3_HD float h3_random_unit(uint64_t seed, uint64_t i) {
    uint64_t z = seed + i * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* ---- moving data between places ------------------------------------------------------------------------ */

/* dst = src across places (host, pinned, device), same dtype and shape, both row-wise. Device copies are
 * queued on the exec's compute stream: call h3_exec_sync before reading device results on the host. */
h3_status h3_copy(h3_exec *ex, h3_tensor *dst, const h3_tensor *src);
/* Waits for all queued device work of the exec (no-op without a device). */
h3_status h3_exec_sync(h3_exec *ex);

/* ---- backends ------------------------------------------------------------------------------------------ */

typedef struct h3_backend {
    const char *name;
    h3_status (*gemm)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, const h3_tensor *,
                      unsigned);
    h3_status (*rms_norm)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, float);
    h3_status (*layer_norm)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, const h3_tensor *,
                            float);
    h3_status (*group_norm)(h3_exec *, h3_tensor *, const h3_tensor *, int, const h3_tensor *,
                            const h3_tensor *, float);
    h3_status (*unary)(h3_exec *, h3_tensor *, const h3_tensor *, h3_unary);
    h3_status (*snake)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, const h3_tensor *,
                       unsigned);
    h3_status (*softmax)(h3_exec *, h3_tensor *, const h3_tensor *);
    h3_status (*clamp)(h3_exec *, h3_tensor *, const h3_tensor *, float, float);
    h3_status (*rope)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, const h3_tensor *);
    h3_status (*attention)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, const h3_tensor *,
                           float, unsigned);
    h3_status (*attention_sparse)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *,
                                  const h3_tensor *, float, const h3_sparse_attn *);
    h3_status (*conv1d)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, const h3_tensor *,
                        const h3_conv1d_params *);
    h3_status (*conv_transpose1d)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *,
                                  const h3_tensor *, const h3_convt1d_params *);
    h3_status (*conv3d)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, const h3_tensor *,
                        const h3_conv3d_params *);
    h3_status (*gather_rows)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *);
    h3_status (*scatter_rows)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *);
    h3_status (*binary)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, h3_binary);
    h3_status (*scale)(h3_exec *, h3_tensor *, const h3_tensor *, float, float);
    h3_status (*swiglu)(h3_exec *, h3_tensor *, const h3_tensor *, int);
    h3_status (*modulate)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, const h3_tensor *,
                          const h3_tensor *);
    h3_status (*gated_add)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, const h3_tensor *);
    h3_status (*convert)(h3_exec *, h3_tensor *, const h3_tensor *);
    h3_status (*fill)(h3_exec *, h3_tensor *, float);
    h3_status (*random_uniform)(h3_exec *, h3_tensor *, uint64_t, float, float);
    h3_status (*rms_norm_modulate)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, float,
                                   const h3_tensor *, const h3_tensor *, const h3_tensor *);
    h3_status (*qk_norm_rope)(h3_exec *, h3_tensor *, const h3_tensor *, float, const h3_tensor *,
                              const h3_tensor *);
    h3_status (*snake_aa)(h3_exec *, h3_tensor *, const h3_tensor *, const h3_tensor *, const h3_tensor *,
                          const h3_tensor *, const h3_tensor *, unsigned);
    /* Device backends only: copies where either side is on the device, and waiting for queued work. */
    h3_status (*copy)(h3_exec *, h3_tensor *, const h3_tensor *);
    h3_status (*sync)(h3_exec *);
} h3_backend;

/* The CPU backend always exists; the device backend registers itself when a GPU is initialized. */
void h3_backend_set_device(const h3_backend *be);
const h3_backend *h3_backend_for_place(h3_place place);

/* The error a kernel returns for a dtype it lacks: "op 'gemm' has no cpu kernel for weights of dtype fp8". */
h3_status h3_missing_kernel(h3_op_id op, const char *backend, const char *what, h3_dtype dtype);

#endif

/* Shared helpers of the CPU kernels. Kernels are called after ops.c validated shapes; they check dtypes. */
#ifndef H3_CPU_INTERNAL_H
#define H3_CPU_INTERNAL_H

#include <stdint.h>

#include "base/alloc.h"
#include "tensor/ops.h"

#define CPU_NAME "cpu"

static inline int64_t cpu_ld(const h3_tensor *t) {
    int64_t ld = h3_tensor_cols(t);
    h3_tensor_is_rowwise(t, &ld);
    return ld;
}
static inline float *cpu_row(const h3_tensor *t, int64_t ld, int64_t r) {
    return (float *)t->data + r * ld;
}
static inline int64_t cpu_index(const h3_tensor *idx, int64_t i) {
    return idx->dtype == H3_I64 ? ((const int64_t *)idx->data)[i] : (int64_t)((const int32_t *)idx->data)[i];
}

/* Require f32 for activations. */
h3_status cpu_need_f32(h3_op_id op, const char *what, const h3_tensor *t);
/* Copy a small float vector of any float dtype into f32 (from h3_malloc, category WORKSPACE); NULL in -> NULL out
 * with H3_OK. */
h3_status cpu_vec_f32(h3_op_id op, const char *what, const h3_tensor *t, float **out);
/* Validate indices against a row count. */
h3_status cpu_check_indices(h3_op_id op, const h3_tensor *idx, int64_t n, int64_t limit);

/* OpenBLAS threads: the count set by h3_exec_init; kernels that call sgemm from pool threads drop it to 1. */
void h3_cpu_set_threads(int n);
void h3_cpu_blas_threads_push_single(void);
void h3_cpu_blas_threads_pop(void);

h3_status cpu_gemm(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *bias,
                   unsigned flags);
h3_status cpu_attention(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k, const h3_tensor *v,
                        float scale, unsigned flags);
h3_status cpu_attention_sparse(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                               const h3_tensor *v, float scale, const h3_sparse_attn *p);
h3_status cpu_conv1d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                     const h3_conv1d_params *p);
h3_status cpu_conv_transpose1d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w,
                               const h3_tensor *b, const h3_convt1d_params *p);
h3_status cpu_conv3d(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, const h3_tensor *b,
                     const h3_conv3d_params *p);

/* Bytes of one im2col column chunk in the convolutions (tests shrink it to exercise chunking). */
extern size_t h3_cpu_conv_col_bytes;
/* Bytes of one f32 weight panel in the GEMM for non-f32 weights (tests shrink it). */
extern size_t h3_cpu_gemm_panel_bytes;
/* Floating-point operations of one sgemm call of the GEMM (8e9: a stop request waits for at most that much
 * work, well under a second on one core); larger products go in blocks of rows of x (tests shrink it). */
extern double h3_cpu_gemm_block_flops;

/* Source index of position i (may be outside [0, n)) under a padding mode; -1 means "zero". */
static inline int64_t cpu_pad_index(int64_t i, int64_t n, h3_pad_mode mode) {
    if (i >= 0 && i < n) return i;
    switch (mode) {
        case H3_PAD_REFLECT:
            if (n == 1) return 0;
            while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
            return i;
        case H3_PAD_REPLICATE: return i < 0 ? 0 : n - 1;
        default: return -1;
    }
}

#endif

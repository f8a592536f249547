/* Stored weight formats, at the bottom beside the dtypes: one table indexed by format (as ggml's type_traits)
 * with each format's name, block size, bytes per block and row decoder; ConvRot's transform; E2M1 codes and
 * nvfp4's swizzled block scales; which formats the GPU's GEMM reads. h3_tensor_rows_to_f32 (tensor.h) decodes
 * every stored format through this table, and the CUDA backend decodes GGUF blocks with the same code
 * (tensor/gguf_blocks.h). The file readers above only say which format a tensor has (src/io/gguf.h: GGUF type
 * ids; src/quant/qload.h: ComfyUI's markers); the quantizers that write the formats are in src/quant/quant.h.
 * Facts: ../shared/docs/H3-FILE-FORMATS.md §1 and §4; docs/QUANT.md says how h3run uses them.
 *
 * Formats (a Linear weight is W [N, K]: N output rows, K input columns):
 *   INT8   int8_tensorwise: I8 [N, K], symmetric; one f32 scale per row ([N, 1]) or one for the tensor ([]);
 *          optionally rotated by ConvRot: W_rot[n, g] = W[n, g]·H_G per group g of G columns, so the exact
 *          dequantization is W[n, g] = (q[n, g]·s[n])·H_G (H is symmetric and its own inverse).
 *   FP8    float8_e4m3fn: F8_E4M3 [N, K], one f32 scale: W = f32(q)·s.
 *   NVFP4  nvfp4: U8 [N, K/2], two E2M1 codes per byte, the even element in the high nibble; one e4m3 scale
 *          per 16 columns stored in cuBLAS's 128×4 swizzled order over [roundup(N,128), roundup(K/16,4)]; one
 *          f32 second-level scale: W[r, 16b+i] = LUT[code]·(f32(e4m3 scale[r, b])·scale_2). AWQ's
 *          pre_quant_scale (bf16 [K], o_proj/down_proj of the text encoder) multiplies the input:
 *          y = (x ⊙ s)·Wᵀ.
 *   GGUF   ggml's blocks along each row (Q4_0 .. Q8_0 of 32 values, Q2_K .. Q6_K of 256), decoded as ggml's
 *          dequantize_row_* do (tensor/gguf_blocks.h).
 *
 * In memory, INT8 and FP8 are I8/F8_E4M3 tensors with H3_SCALE_ROW/TENSOR scales (and q.rot_group for
 * ConvRot); NVFP4 and GGUF are H3_SCALE_FORMAT tensors (tensor.h): logical shape [N, K], stride[0] = stored
 * bytes of a row, so views of row ranges (h3_tensor_narrow along dim 0) and the CPU GEMM's panel conversion
 * work on them unchanged, and no full-precision copy of a weight ever exists.
 */
#ifndef H3_TENSOR_QFORMAT_H
#define H3_TENSOR_QFORMAT_H

#include <stdint.h>

#include "tensor/tensor.h"

typedef enum h3_qformat {
    H3_QF_NONE = 0, /* a plain float tensor */
    H3_QF_INT8,     /* int8_tensorwise (+ convrot) */
    H3_QF_FP8,      /* float8_e4m3fn */
    H3_QF_NVFP4,    /* nvfp4 */
    /* GGUF block formats (H3_SCALE_FORMAT) */
    H3_QF_Q4_0,
    H3_QF_Q4_1,
    H3_QF_Q5_0,
    H3_QF_Q5_1,
    H3_QF_Q8_0,
    H3_QF_Q2_K,
    H3_QF_Q3_K,
    H3_QF_Q4_K,
    H3_QF_Q5_K,
    H3_QF_Q6_K,
    H3_QF_COUNT
} h3_qformat;

/* ---- format traits ------------------------------------------------------------------------------------- */

/* What a row decoder needs besides the row's bytes: nvfp4 keeps its block scales outside the rows. */
typedef struct h3_qrow_side {
    const uint8_t *block_scales; /* NVFP4: the e4m3 block scales of the whole matrix, swizzled */
    int64_t row;                 /* NVFP4: the row's index within the whole matrix */
    float scale2;                /* NVFP4: the second-level scale */
} h3_qrow_side;

/* n values (a whole number of blocks) of one stored row at src to f32: the format's own values with the
 * scales that live in its blocks (GGUF) or beside them (NVFP4: side); not INT8's and FP8's per-row or tensor
 * scales (tensor.h's q.mode), ConvRot's un-rotation or a column scale, which h3_tensor_rows_to_f32 applies
 * after. side may be NULL for every format but NVFP4. */
typedef void (*h3_qrow_decoder)(const uint8_t *src, float *dst, int64_t n, const h3_qrow_side *side);

typedef struct h3_qformat_traits {
    const char *name;    /* the files' spelling: "int8_tensorwise", "float8_e4m3fn", "nvfp4", "Q4_K", ... */
    int64_t block_elems; /* values per block along a row (1 for INT8 and FP8) */
    int64_t block_bytes; /* stored bytes per block (NVFP4: without its block scale) */
    int packed;          /* stored as H3_SCALE_FORMAT rows (NVFP4, GGUF); INT8 and FP8 are I8/F8 tensors */
    h3_qrow_decoder to_f32; /* NULL for H3_QF_NONE */
} h3_qformat_traits;

/* The traits of format f; NULL when f is out of range. */
const h3_qformat_traits *h3_qformat_get_traits(h3_qformat f);
/* "int8_tensorwise", "float8_e4m3fn", "nvfp4", "Q4_K", ... ("?" when out of range). */
const char *h3_qformat_name(h3_qformat f);
/* Packed formats (NVFP4 and GGUF): values per block along a row and stored bytes per block (NVFP4: 16 values
 * in 8 bytes; its scales live outside the rows). Returns 0 for other formats. */
int h3_qformat_block(h3_qformat f, int64_t *elems, int64_t *bytes);
/* Stored bytes of one row of cols values of a packed format; -1 when cols is not a whole number of blocks. */
int64_t h3_qformat_row_bytes(h3_qformat f, int64_t cols);

/* ---- ConvRot: the grouped regular Hadamard transform ------------------------------------------------------
 */

/* Group sizes ConvRot allows: powers of 4 from 4 up (H_G = H4 ⊗ ... ⊗ H4 / sqrt(G)). */
int h3_convrot_group_ok(int64_t g);
/* v[j·g .. (j+1)·g) ← v[j·g .. (j+1)·g)·H_g for every group of n values (n a multiple of g): radix-4
 * butterflies with H4 = [[1,1,1,−1],[1,1,−1,1],[1,−1,1,1],[−1,1,1,1]], each stage scaled by 1/2. Its own
 * inverse. */
void h3_convrot_apply(float *v, int64_t n, int64_t g);

/* ---- nvfp4's elements and block scales -------------------------------------------------------------------
 */

/* E2M1 code (4 bits; higher bits ignored) to its value. */
static inline float h3_e2m1_to_f32(uint8_t code) {
    static const float v[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return v[code & 15];
}
/* Flat index of block scale (r, c) of an [R, C] scale matrix stored in cuBLAS's 128×4 swizzled order (the
 * matrix padded to [roundup(R, 128), roundup(C, 4)]): ((r/128)·⌈C/4⌉ + c/4)·512 + (r%32)·16 + ((r%128)/32)·4
 * + c%4. */
static inline int64_t h3_nvfp4_scale_index(int64_t r, int64_t c, int64_t C) {
    return ((r / 128) * ((C + 3) / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}
/* Elements of the padded swizzled scale matrix of an [R, K] nvfp4 weight (K a multiple of 16). */
static inline int64_t h3_nvfp4_scale_count(int64_t R, int64_t K) {
    return (R + 127) / 128 * 128 * ((K / 16 + 3) / 4 * 4);
}

/* ---- the GPU
 * ----------------------------------------------------------------------------------------------- */

/* Whether the GPU's GEMM computes with weight w (src/cuda/cuda_qgemm.cu): int8 with per-row or tensor scales
 * (ConvRot or not), fp8 (e4m3/e5m2) with a tensor or per-row scale or none, nvfp4 with K a multiple of 16,
 * the GGUF block formats h3run reads. Otherwise (block scales) 0, and *why (may be NULL) names what is
 * missing. Plain float weights: 1. Reads the description only (no values), so a model can refuse a device
 * before loading anything; here, not in src/cuda, because builds without CUDA ask it too. */
int h3_quant_gpu_supported(const h3_tensor *w, const char **why);

#endif

/* Quantized weights: the formats ComfyUI and GGUF files store, their exact decoding, and the quantizers that
 * write them. The facts behind every rule are in ../shared/docs/H3-FILE-FORMATS.md §1 and §4; docs/QUANT.md
 * says how h3run uses them.
 *
 * Formats (a Linear weight is W [N, K]: N output rows, K input columns):
 *   INT8   int8_tensorwise: I8 [N, K], symmetric; one f32 scale per row ([N, 1]) or one for the tensor ([]);
 *          optionally rotated by ConvRot: W_rot[n, g] = W[n, g]·H_G per group g of G columns, so the exact
 *          dequantization is W[n, g] = (q[n, g]·s[n])·H_G (H is symmetric and its own inverse).
 *   FP8    float8_e4m3fn: F8_E4M3 [N, K], one f32 scale: W = f32(q)·s.
 *   NVFP4  nvfp4: U8 [N, K/2], two E2M1 codes per byte, the even element in the high nibble; one e4m3 scale
 * per 16 columns stored in cuBLAS's 128×4 swizzled order over [roundup(N,128), roundup(K/16,4)]; one f32
 *          second-level scale: W[r, 16b+i] = LUT[code]·(f32(e4m3 scale[r, b])·scale_2). AWQ's pre_quant_scale
 *          (bf16 [K], o_proj/down_proj of the text encoder) multiplies the input: y = (x ⊙ s)·Wᵀ.
 *   GGUF   ggml's blocks along each row (Q4_0 .. Q8_0 of 32 values, Q2_K .. Q6_K of 256), decoded as ggml's
 *          dequantize_row_* do (src/io/gguf.h).
 *
 * In memory, INT8 and FP8 are I8/F8_E4M3 tensors with H3_SCALE_ROW/TENSOR scales (and q.rot_group for
 * ConvRot); NVFP4 and GGUF are H3_SCALE_FORMAT tensors (tensor.h): logical shape [N, K], stride[0] = stored
 * bytes of a row, so views of row ranges (h3_tensor_narrow along dim 0) and the CPU GEMM's panel conversion
 * work on them unchanged, and no full-precision copy of a weight ever exists.
 */
#ifndef H3_QUANT_QUANT_H
#define H3_QUANT_QUANT_H

#include <stddef.h>
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

/* ---- element formats
 * ---------------------------------------------------------------------------------------- */

/* E2M1 code (4 bits) to its value: [0, .5, 1, 1.5, 2, 3, 4, 6, −0, −.5, −1, −1.5, −2, −3, −4, −6][c]. */
float h3_e2m1_to_f32(uint8_t code);
/* Nearest E2M1 code, ties to the even code, saturating at ±6 (torchao's _f32_to_floatx_unpacked(x, 2, 1)). */
uint8_t h3_f32_to_e2m1(float x);
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

/* ---- decoding
 * ----------------------------------------------------------------------------------------------- */

/* Rows [r0, r0+n) of an H3_SCALE_FORMAT tensor to f32 (no rotation or column scale: the caller applies
 * those). What h3_tensor_rows_to_f32 calls; validates the format and the row length. */
h3_status h3_quant_decode_rows(const h3_tensor *t, int64_t r0, int64_t n, float *dst);

/* ---- quantized weights on a device ----------------------------------------------------------------------
 */

/* Whether the GPU's GEMM computes with weight w (src/cuda/cuda_qgemm.cu): int8 with per-row or tensor scales
 * (ConvRot or not), fp8 (e4m3/e5m2) with a tensor or per-row scale or none, nvfp4 with K a multiple of 16,
 * the GGUF block formats h3run reads. Otherwise (block scales) 0, and *why (may be NULL) names what is
 * missing. Plain float weights: 1. */
int h3_quant_gpu_supported(const h3_tensor *w, const char **why);

/* The side data a quantized tensor needs beside its stored values, to be copied with them: per-row or block
 * f32 scales; nvfp4's swizzled block scales (the whole matrix: t must not be a row view) and AWQ's column
 * scale. Fills parts (at most 2) and returns how many; -1 for a row view of nvfp4. */
typedef struct h3_qaux {
    const void *p;
    int64_t bytes;
} h3_qaux;
int h3_quant_aux(const h3_tensor *t, h3_qaux parts[2]);
/* Points t's side data at copies of the parts h3_quant_aux listed, in its order (t does not own them). */
void h3_quant_aux_rebind(h3_tensor *t, void *const copies[2]);

/* ---- quantizers (what h3run quantize writes; ComfyUI's rules, so its loaders read the result)
 * ---------------- */

/* int8_tensorwise with one scale per row: rows of w [N, K] are rotated first when group > 0 (K a multiple of
 * group). s[n] = max|row|/127 (at least 1e-30), q = clamp(round_half_even(x / s), −128, 127). */
h3_status h3_quantize_int8_rows(const float *w, int64_t N, int64_t K, int group, int8_t *q, float *scales);
/* float8_e4m3fn with one scale: s = max|w|/448 (1 when w is all zero), q = e4m3(clamp(w·(1/s), ±448)). */
float h3_quantize_fp8_scale(const float *w, size_t n);
void h3_quantize_fp8(const float *w, size_t n, float scale, uint8_t *q);
/* nvfp4: scale_2 = max|w|/(448·6) (1 when w is all zero); per 16-value block b of row r,
 * bs = e4m3(min(max|block|/6 / scale_2, 448)), codes = e2m1(clamp(x / (scale_2·f32(bs)), ±6)) (0 where the
 * product is 0); packed [N, K/2] high nibble first; scales [h3_nvfp4_scale_count(N, K)] swizzled, padding 0.
 */
float h3_quantize_nvfp4_scale2(const float *w, size_t n);
h3_status h3_quantize_nvfp4(const float *w, int64_t N, int64_t K, float scale2, uint8_t *packed,
                            uint8_t *scales);
/* Rows [r0, r1) only (w, packed and scales of the whole matrix; the caller zeroes the scales' padding first):
 * for workers that split the rows. */
void h3_quantize_nvfp4_rows(const float *w, int64_t r0, int64_t r1, int64_t K, float scale2, uint8_t *packed,
                            uint8_t *scales);

/* ---- ComfyUI's per-layer markers
 * ------------------------------------------------------------------------------ */

typedef struct h3_qmarker {
    h3_qformat fmt;        /* INT8, FP8, NVFP4 */
    int convrot;           /* INT8: rotated */
    int group;             /* INT8 + convrot: convrot_groupsize (default 256) */
    int full_precision_mm; /* NVFP4: "full_precision_matrix_mult": true (the text encoder's form) */
} h3_qmarker;

/* Parses a <layer>.comfy_quant marker (UTF-8 JSON without NUL). A format h3run does not read is
 * H3_ERR_UNSUPPORTED naming it and `what`; malformed JSON or fields H3_ERR_FORMAT. */
h3_status h3_qmarker_parse(const void *bytes, size_t n, const char *what, h3_qmarker *out);
/* The marker as ComfyUI's json.dumps writes it ({"format": "int8_tensorwise", "convrot": true,
 * "convrot_groupsize": 256} is 72 bytes). Returns the length, or -1 if buf is too small. */
int h3_qmarker_json(const h3_qmarker *m, char *buf, size_t n);

#endif

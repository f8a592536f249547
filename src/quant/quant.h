/* Quantized weights: the quantizers that write the formats ComfyUI's loaders read, ComfyUI's per-layer
 * markers, and the side data a quantized tensor carries to a device. The formats themselves (what each is,
 * its row decoder, ConvRot, E2M1, nvfp4's swizzle) sit at the bottom, beside the dtypes: tensor/qformat.h,
 * included here. The facts behind every rule are in ../shared/docs/H3-FILE-FORMATS.md §1 and §4;
 * docs/QUANT.md says how h3run uses them.
 */
#ifndef H3_QUANT_QUANT_H
#define H3_QUANT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/qformat.h"
#include "tensor/tensor.h"

/* ---- quantized weights on a device ----------------------------------------------------------------------
 */

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
/* Nearest E2M1 code, ties to the even code, saturating at ±6 (torchao's _f32_to_floatx_unpacked(x, 2, 1)). */
uint8_t h3_f32_to_e2m1(float x);

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

/* Weight tensors from files in any stored format: plain float, ComfyUI's per-layer markers (int8_tensorwise
 * with or without ConvRot, float8_e4m3fn, nvfp4 with AWQ's pre_quant_scale), the legacy scaled-fp8 form, and
 * GGUF blocks.
 *
 * For a weight entry "<layer>.weight" of a set, the companions are "<layer>.comfy_quant" (U8 JSON),
 * "<layer>.weight_scale", "<layer>.weight_scale_2", "<layer>.pre_quant_scale" and, legacy,
 * "<layer>.scale_weight". Everything is checked before a tensor is made: the marker against the weight's
 * dtype, the companions' dtypes and element counts against the weight's shape, scalar scales finite. A
 * failure names the file, the tensor and what would be right. Tensors are views over the mapped file (scales
 * too) where alignment allows.
 */
#ifndef H3_QUANT_QLOAD_H
#define H3_QUANT_QLOAD_H

#include "io/gguf.h"
#include "io/safetensors.h"
#include "io/wbind.h"
#include "quant/quant.h"
#include "tensor/ops.h"

typedef struct h3_qweight_info {
    h3_qformat fmt; /* H3_QF_NONE for plain float tensors */
    h3_dtype dtype; /* the stored dtype of the weight itself (U8 for packed formats) */
    int ndim;       /* logical shape */
    int64_t shape[H3_MAX_DIMS];
    int rot_group;         /* INT8: ConvRot group, 0 when not rotated */
    int per_row;           /* INT8: one scale per row (else one for the tensor) */
    int awq;               /* NVFP4: a pre_quant_scale multiplies the input */
    int full_precision_mm; /* NVFP4: the marker's full_precision_matrix_mult */
    int legacy;            /* FP8 without a marker (scale_weight / weight_scale / none) */
    int gguf_reshaped;     /* GGUF: the tensor has a comfy.gguf.orig_shape (decoded at load into f32) */
    uint32_t ggml_type;    /* GGUF tensors: the ggml type id; otherwise UINT32_MAX */
    int64_t bytes;         /* stored bytes of the weight and its companions */
    char label[64];        /* for people: "int8_tensorwise convrot 256", "nvfp4 awq", "Q4_K", "bf16" */
} h3_qweight_info;

/* What entry e of set s is as a weight. g: the handle when s came from h3_gguf_open, else NULL. Reads only
 * markers and scalar scales. */
h3_status h3_qweight_info_of(h3_st_set *s, const h3_gguf *g, const h3_st_entry *e, h3_qweight_info *out);
/* The weight as a tensor the ops take: plain float (as h3_st_tensor), I8 with ROW/TENSOR scales and
 * rot_group, F8_E4M3 with a TENSOR scale, or an H3_SCALE_FORMAT tensor (nvfp4, GGUF blocks). A GGUF tensor
 * with an orig_shape that is block-quantized is decoded into an owned f32 tensor (its flattened rows are not
 * rows of the true shape); a GGUF type h3run does not decode is H3_ERR_UNSUPPORTED naming it. Release with
 * h3_tensor_free. */
h3_status h3_qweight_get(h3_st_set *s, const h3_gguf *g, const h3_st_entry *e, h3_tensor *out);
/* The same by name; H3_ERR_NOT_FOUND naming the set when absent. */
h3_status h3_qweight_get_name(h3_st_set *s, const h3_gguf *g, const char *name, h3_tensor *out);

/* A companion of a weight set that is not itself a weight (markers, scales): models skip these when they walk
 * every tensor. */
int h3_qweight_is_companion(const char *name);

/* The binder's reader (io/wbind.h) for weights in any stored format above: info is h3_qweight_info_of's view
 * (quantized = a format other than a plain dtype), get is h3_qweight_get. g: the handle of a GGUF set, else
 * NULL. The struct must outlive the binding (base.user points at it). */
typedef struct h3_qweight_reader {
    h3_wb_reader base;
    h3_st_set *set;
    const h3_gguf *g;
} h3_qweight_reader;
void h3_qweight_reader_init(h3_qweight_reader *r, h3_st_set *s, const h3_gguf *g);

/* Opens weights: a .gguf file through h3_gguf_open (*g set), anything else through h3_st_open (*g NULL). */
h3_status h3_weights_open(const char *path, h3_st_set *set, h3_gguf **g);

/* An owned copy of src (a whole, contiguous tensor, quantized or not) at place: its stored values in one
 * allocation, its side data in another (out->q.scales_owner), both counted under cat. Copies on ex's
 * streams and waits for them. */
h3_status h3_quant_copy_to(h3_exec *ex, const h3_tensor *src, h3_place place, h3_mem_category cat,
                           h3_tensor *out);

#endif

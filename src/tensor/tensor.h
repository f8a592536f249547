/* Tensors: a dtype, a shape, strides, a place, and (for quantized weights) their scales.
 *
 * Shapes are row-major and outermost first, as in safetensors and PyTorch: a Linear weight is [N_out, K_in].
 * Strides count elements. A tensor owns its memory (t->owner != NULL, freed by h3_tensor_free) or views
 * memory owned elsewhere (a parent tensor, a mapped file): views must not outlive what they view.
 */
#ifndef H3_TENSOR_TENSOR_H
#define H3_TENSOR_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tensor/dtype.h"

#define H3_MAX_DIMS 6

typedef enum h3_place {
    H3_PLACE_HOST = 0, /* ordinary host memory (h3_malloc, or a mapped file) */
    H3_PLACE_PINNED,   /* page-locked host memory: CPU kernels use it like HOST; fast to copy to the device */
    H3_PLACE_DEVICE,   /* GPU memory */
    H3_PLACE_COUNT
} h3_place;

const char *h3_place_name(h3_place p);

/* How the stored values of an I8 or F8 tensor map to real values. */
typedef enum h3_scale_mode {
    H3_SCALE_NONE = 0, /* values are real values (all float types; integer tensors that are indices) */
    H3_SCALE_TENSOR,   /* one scale for the whole tensor: q.scale */
    H3_SCALE_ROW,      /* one scale per outermost row: q.scales[rows] */
    H3_SCALE_BLOCK,    /* one scale per q.block elements along the last dim: q.scales[rows][cols/block] */
    H3_SCALE_FORMAT,   /* packed blocks of q.format (tensor/qformat.h) that carry their own scales: dtype U8, the
                        * shape is the logical [rows, cols] of real values and stride[0] counts the stored bytes of
                        * one row (the last dim has stride 1); only h3_tensor_rows_to_f32 reads the values */
} h3_scale_mode;

typedef struct h3_quant {
    h3_scale_mode mode;
    int32_t block;        /* BLOCK: elements per scale along the last dim (divides it) */
    int32_t rot_group;    /* nonzero: weights were rotated by the grouped Hadamard of this size (ConvRot): each group
                           * of rot_group values of a row is multiplied by H once scaled (tensor/qformat.h) */
    float scale;          /* TENSOR; FORMAT nvfp4: the second-level scale (weight_scale_2) */
    const float *scales;  /* ROW / BLOCK: f32, same place as the data */
    void *scales_owner;   /* allocation holding scales when the tensor owns them */
    size_t scales_bytes;
    int32_t format;              /* FORMAT: an h3_qformat (tensor/qformat.h) */
    const uint8_t *fmt_scales;   /* FORMAT nvfp4: e4m3 block scales of the whole matrix in cuBLAS's swizzled order */
    int64_t fmt_row0;            /* FORMAT nvfp4: index of this view's first row within the whole matrix */
    const uint8_t *col_scale;    /* NULL, or bf16 [cols] (any alignment): each decoded column is multiplied by it
                                  * (AWQ's pre_quant_scale folded into the weight: (x ⊙ s)·Wᵀ = x·(W ⊙ s)ᵀ) */
} h3_quant;

typedef struct h3_tensor {
    h3_dtype dtype;
    h3_place place;
    int ndim;
    int64_t shape[H3_MAX_DIMS];
    int64_t stride[H3_MAX_DIMS];
    void *data;
    h3_quant q;
    void *owner;          /* allocation to free, or NULL for a view */
    h3_mem_category cat;  /* category the owned bytes are counted under */
    size_t owned_bytes;
} h3_tensor;

/* Element count (product of the shape). */
int64_t h3_tensor_numel(const h3_tensor *t);
/* Bytes of the elements if contiguous (numel * dtype size); for H3_SCALE_FORMAT, the stored bytes (rows * stride[0]). */
size_t h3_tensor_nbytes(const h3_tensor *t);
int h3_tensor_is_contiguous(const h3_tensor *t);
/* Rows = product of all dims but the last; cols = the last dim. */
int64_t h3_tensor_rows(const h3_tensor *t);
static inline int64_t h3_tensor_cols(const h3_tensor *t) {
    return t->ndim ? t->shape[t->ndim - 1] : 1;
}
/* Last dim contiguous and the leading dims collapse to one row stride: the layout every row-wise kernel takes.
 * *ld receives the row stride in elements. */
int h3_tensor_is_rowwise(const h3_tensor *t, int64_t *ld);

/* Describe (without allocating) a contiguous tensor over existing memory. */
h3_status h3_tensor_wrap(h3_tensor *t, void *data, h3_place place, h3_dtype dtype, int ndim, const int64_t *shape);
/* Allocate a contiguous tensor at a place. Contents are undefined. */
h3_status h3_tensor_alloc(h3_tensor *t, h3_place place, h3_dtype dtype, int ndim, const int64_t *shape,
                          h3_mem_category cat);
/* Convenience for 1..4 dims. */
h3_status h3_tensor_alloc2(h3_tensor *t, h3_place place, h3_dtype dtype, int64_t d0, int64_t d1, h3_mem_category cat);
void h3_tensor_free(h3_tensor *t);

/* Views (no copies). */
/* Rows [start, start+len) of the outermost dim; quant scales follow. */
h3_status h3_tensor_narrow(const h3_tensor *t, int dim, int64_t start, int64_t len, h3_tensor *out);
/* New shape over the same elements; requires a contiguous tensor. One dim may be -1. */
h3_status h3_tensor_reshape(const h3_tensor *t, int ndim, const int64_t *shape, h3_tensor *out);
/* Shape string "[2, 3, 4]" of ndim dims into buf (cut short, still NUL-terminated, when n is too small);
 * returns buf. */
const char *h3_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
/* h3_shape_str of a tensor's shape. */
const char *h3_tensor_shape_str(const h3_tensor *t, char *buf, size_t n);
int h3_tensor_same_shape(const h3_tensor *a, const h3_tensor *b);

/* Dequantize/convert rows [r0, r0+n) of a host 2-D (or row-wise) tensor to f32 rows of cols floats.
 * Handles f32, f16, bf16, f64, fp8 (with or without scales), i8 with tensor/row/block scales, the ConvRot
 * un-rotation (q.rot_group), packed formats (H3_SCALE_FORMAT: nvfp4, GGUF blocks) and q.col_scale; the
 * stored formats' values through their row decoders (tensor/qformat.h). */
h3_status h3_tensor_rows_to_f32(const h3_tensor *t, int64_t r0, int64_t n, float *dst);

/* Host-side allocation hooks for places other than HOST; backends register them (the CUDA backend registers
 * PINNED and DEVICE). Without a hook, PINNED falls back to ordinary host memory and DEVICE fails. */
typedef struct h3_place_allocator {
    void *(*alloc)(size_t bytes, void *user);
    void (*free)(void *ptr, void *user);
    void *user;
} h3_place_allocator;
void h3_place_set_allocator(h3_place place, const h3_place_allocator *a);
/* Raw allocation at a place, counted under cat (device bytes are counted by the device backend). */
void *h3_place_alloc(h3_place place, size_t bytes, h3_mem_category cat);
void h3_place_free(h3_place place, void *p, size_t bytes, h3_mem_category cat);

#endif

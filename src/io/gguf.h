/* GGUF: strict reader and the view of a GGUF file as a weight set (the block formats' traits and decoders are
 * tensor/qformat.h: this reader only says which format a tensor has).
 *
 * Layout (version 2 and 3, little-endian): "GGUF", u32 version, u64 tensor count, u64 key/value count; the
 * key/value pairs (string key, u32 value type, value; strings are u64 length + bytes; arrays are u32 element
 * type, u64 count, elements); the tensor infos (name, u32 n_dims, u64 ne[n_dims] fastest dim first, u32 ggml
 * type, u64 offset); padding to general.alignment (32 unless given); the data, each tensor at its offset (a
 * multiple of the alignment). A row is ne[0] values, so a Linear weight stored as ne = [K, N] is [N, K]
 * outermost first.
 *
 * Nothing is trusted before it is checked: every count, length and offset is checked against the file size
 * with overflow-checked arithmetic, dims against 4, ne[0] against the type's block size, tensor bytes against
 * their neighbours (no overlaps) and the end of the file. A failure names the file, the tensor or key, and
 * the rule. Types h3run cannot decode (IQ*, TQ*, MXFP4, Q8_K) open and list; loading one names the type and
 * tensor.
 *
 * As a weight set: h3_gguf_open also fills an h3_st_set over the same file, so component detection, name and
 * shape lookups work as for safetensors. Names are those of the file, except llama.cpp's text-model names
 * (token_embd, blk.N.attn_q, ffn_gate, output_norm, ...), which become the ComfyUI text-encoder names
 * (model.embed_tokens, model.layers.N.self_attn.q_proj, ...). Float tensors (F32, F16, BF16, F64, I8..I64)
 * are entries of their dtype and logical shape; block-quantized ones are U8 entries of their stored bytes
 * ([rows, row bytes]); h3_qweight_get (src/quant/qload.h) makes weight tensors of them. ComfyUI-GGUF's
 * flattened matrices (a tensor whose true shape is in the key "comfy.gguf.orig_shape.<name>", INT32 array,
 * outermost first) have that shape.
 */
#ifndef H3_IO_GGUF_H
#define H3_IO_GGUF_H

#include <stdint.h>

#include "io/safetensors.h"
#include "tensor/qformat.h"

/* ggml's type ids (ggml.h). */
enum {
    H3_GGML_F32 = 0,
    H3_GGML_F16 = 1,
    H3_GGML_Q4_0 = 2,
    H3_GGML_Q4_1 = 3,
    H3_GGML_Q5_0 = 6,
    H3_GGML_Q5_1 = 7,
    H3_GGML_Q8_0 = 8,
    H3_GGML_Q8_1 = 9,
    H3_GGML_Q2_K = 10,
    H3_GGML_Q3_K = 11,
    H3_GGML_Q4_K = 12,
    H3_GGML_Q5_K = 13,
    H3_GGML_Q6_K = 14,
    H3_GGML_Q8_K = 15,
    H3_GGML_I8 = 24,
    H3_GGML_I16 = 25,
    H3_GGML_I32 = 26,
    H3_GGML_I64 = 27,
    H3_GGML_F64 = 28,
    H3_GGML_BF16 = 30,
    H3_GGML_TYPE_LIMIT = 40
};

/* "Q4_K", "IQ2_XXS", ...; NULL for ids ggml does not define (or no longer uses). */
const char *h3_ggml_type_name(uint32_t type);
/* Values per block and bytes per block; 0 for unknown ids. */
int h3_ggml_type_size(uint32_t type, int64_t *block_elems, int64_t *block_bytes);
/* The h3_qformat of a block type h3run decodes (Q4_0 .. Q6_K), else H3_QF_NONE. */
h3_qformat h3_ggml_qformat(uint32_t type);
/* The dtype of a plain type (F32, F16, BF16, F64, I8 .. I64); 0 when it has none. */
int h3_ggml_dtype(uint32_t type, h3_dtype *out);

typedef struct h3_gguf_tensor {
    char *name;           /* as stored */
    const char *set_name; /* the weight set's name for it (points into the set's entry) */
    uint32_t type;        /* ggml type id */
    int ndim;             /* logical: GGUF's dims reversed, or comfy.gguf.orig_shape */
    int64_t shape[H3_MAX_DIMS];
    int stored_ndim; /* GGUF's dims reversed */
    int64_t stored_shape[4];
    int reshaped;            /* a comfy.gguf.orig_shape applies */
    uint64_t offset, nbytes; /* within the data section */
} h3_gguf_tensor;

typedef enum h3_gguf_vtype {
    H3_GGUF_U8 = 0,
    H3_GGUF_I8,
    H3_GGUF_U16,
    H3_GGUF_I16,
    H3_GGUF_U32,
    H3_GGUF_I32,
    H3_GGUF_F32,
    H3_GGUF_BOOL,
    H3_GGUF_STRING,
    H3_GGUF_ARRAY,
    H3_GGUF_U64,
    H3_GGUF_I64,
    H3_GGUF_F64,
    H3_GGUF_VTYPE_COUNT
} h3_gguf_vtype;

typedef struct h3_gguf_kv {
    char *key;
    uint32_t type;      /* h3_gguf_vtype */
    uint32_t elem_type; /* ARRAY: element type */
    uint64_t count;     /* ARRAY: element count */
    int64_t i;          /* integer and bool values */
    double f;           /* float values */
    char *s;            /* STRING values */
    uint64_t array_at;  /* ARRAY: file offset of the first element */
} h3_gguf_kv;

typedef struct h3_gguf {
    char *path;
    uint32_t version;
    uint64_t alignment, data_start, file_size;
    h3_gguf_tensor *tensors; /* sorted by set name */
    int64_t n_tensors;
    h3_gguf_kv *kv; /* sorted by key */
    int64_t n_kv;
    int llama_names; /* llama.cpp text-model names were mapped */
} h3_gguf;

/* Opens a .gguf file: parses and validates everything but the tensor data, and fills set (which owns the file
 * descriptor and mapping; close it with h3_st_close) with one entry per tensor. */
h3_status h3_gguf_open(const char *path, h3_st_set *set, h3_gguf **out);
void h3_gguf_free(h3_gguf *g);
/* By the weight set's name; NULL when absent. */
const h3_gguf_tensor *h3_gguf_find(const h3_gguf *g, const char *set_name);
const h3_gguf_kv *h3_gguf_get_kv(const h3_gguf *g, const char *key);
/* A path that names a GGUF file (ends in ".gguf"). */
int h3_path_is_gguf(const char *path);

#endif

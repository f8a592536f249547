/* Binding a model's weights from one table: the contract every loader states and one binder checks.
 *
 * A model describes what it reads as rows, one per tensor (as llama.cpp's create_tensor rows):
 *
 *     {"blocks.3.mlp.fc2.weight", &b->fc2, 2, {H, F}, H3_WB_FLOATS, H3_WB_QUANT, "[hidden, FFN]",
 *      {"DiT block", 3, 5}}
 *
 * the tensor's name in the layout being read (without the set's prefix), where the bound tensor goes, the
 * shape its role needs (H3_WB_ANY for a dim the role leaves free, or with H3_WB_NUMEL an element count), the
 * stored dtypes the role accepts, whether it may be absent or stored quantized, the shape in words, and the
 * unit it belongs to (a DiT block, a text-encoder layer, a ViT block, a BigVGAN stage; or the model as a
 * whole). The unit is what a forward acquires and releases; the binder only names it in messages.
 *
 * The binder finds each row's tensor in a weight set (safetensors or GGUF, through h3_st_set), checks it
 * before anything reads its values and makes the tensor the ops take. Every loader refuses a bad file with
 * one message form, naming the file, the tensor, what it has and what its role needs:
 *
 *     <source>: tensor '<name>' is missing; <unit> needs it as <words> = [a, b]
 *     <source>: tensor '<name>' has shape [x, y]; <unit> needs <words> = [a, b]
 *     <source>: tensor '<name>' has dtype <dtype>; <unit> takes <accepted>
 *
 * where <unit> is "DiT block 3", "text-encoder layer 7", "ViT block 0", "BigVGAN stage 2" or "the <model>".
 * Missing tensors and wrong shapes are H3_ERR_FORMAT, wrong dtypes H3_ERR_UNSUPPORTED. Sizes a loader infers
 * from the tensors themselves (files without a config) are checked through h3_wb_shape_error, in the same
 * form.
 *
 * Stored formats that are not plain dtypes (ComfyUI's int8/fp8/nvfp4 markers, GGUF blocks) are the business
 * of a reader (quant/qload.h gives one): it says what an entry is (logical shape, whether quantized) and
 * makes its tensor. Without a reader the stored tensor is the tensor (h3_st_tensor). This module sits in io/
 * so that every loader above it (models/, quant/) binds through it.
 */
#ifndef H3_IO_WBIND_H
#define H3_IO_WBIND_H

#include <stdint.h>

#include "io/safetensors.h"

/* A dim of a row's shape the role leaves free. */
#define H3_WB_ANY (-1)

/* The float dtypes every model reads as weights. */
#define H3_WB_FLOATS ((1u << H3_F32) | (1u << H3_BF16) | (1u << H3_F16))

enum {
    H3_WB_OPTIONAL = 1u << 0, /* may be absent: the row's tensor stays empty (data NULL) */
    H3_WB_QUANT =
        1u << 1, /* a quantized storage the reader understands is accepted; its logical shape counts */
    H3_WB_NUMEL = 1u << 2, /* shape[0] is an element count: any shape holding that many values */
};

/* The unit a weight belongs to. */
typedef struct h3_wb_unit {
    const char *kind; /* "DiT block", "text-encoder layer", ...; NULL: the model as a whole */
    int index;        /* within kind, for messages */
    int id; /* the model's unit number (what its acquire/release take); -1 for the model as a whole */
} h3_wb_unit;

typedef struct h3_wb_row {
    const char *name;           /* in the layout being read, without the binder's prefix */
    h3_tensor *dst;             /* receives the bound tensor (h3_wb_bind); NULL for rows only checked */
    int ndim;                   /* rank the role needs (with H3_WB_NUMEL: 1) */
    int64_t shape[H3_MAX_DIMS]; /* outermost first; H3_WB_ANY where free */
    uint32_t dtypes;            /* stored dtypes accepted, a mask of 1u << h3_dtype; 0 means H3_WB_FLOATS */
    unsigned flags;             /* H3_WB_OPTIONAL, H3_WB_QUANT, H3_WB_NUMEL */
    const char *words;          /* the shape in words: "[hidden, heads·head_dim]" */
    h3_wb_unit unit;
    int tag; /* the model's own use (e.g. the DiT marks its AdaLN weights) */
} h3_wb_row;

/* What an entry is as a weight: its stored dtype, and its logical shape (quantized storage has another). */
typedef struct h3_wb_info {
    h3_dtype dtype;
    int quantized; /* a quantized storage (values are not plain dtype elements) */
    int ndim;
    int64_t shape[H3_MAX_DIMS];
    char label[64]; /* for messages: "bf16", "int8_tensorwise convrot 256", "Q4_K" */
} h3_wb_info;

/* How entries become tensors, for stored formats beyond plain dtypes. */
typedef struct h3_wb_reader {
    h3_status (*info)(void *user, const h3_st_entry *e, h3_wb_info *out);
    h3_status (*get)(void *user, const h3_st_entry *e, h3_tensor *out);
    void *user;
} h3_wb_reader;

typedef struct h3_wbind {
    h3_st_set *set;
    const char *prefix;         /* prepended to every row's name; NULL or "" for none */
    const char *source;         /* names the weights in messages; NULL: the set's source */
    const char *model;          /* "DiT", "text encoder", "video VAE", "audio VAE", ... */
    const char *context;        /* appended to shape messages, e.g. "(config from X)"; may be NULL */
    const h3_wb_reader *reader; /* NULL: the stored tensor as it is */
} h3_wbind;

/* A row from its parts (shape given as up to 4 dims; unused ones ignored). */
h3_wb_row h3_wb_row_make(const char *name, h3_tensor *dst, int ndim, int64_t d0, int64_t d1, int64_t d2,
                         int64_t d3, uint32_t dtypes, unsigned flags, const char *words, h3_wb_unit unit);

/* Finds and checks a row's tensor; headers (and a reader's markers) only. *e receives the entry, NULL when an
 * optional row is absent; info (may be NULL) what it is. */
h3_status h3_wb_check(const h3_wbind *b, const h3_wb_row *r, const h3_st_entry **e, h3_wb_info *info);
/* Checks a row and makes its tensor in r->dst (an absent optional row leaves it zeroed). Release with
 * h3_tensor_free. */
h3_status h3_wb_bind(const h3_wbind *b, const h3_wb_row *r);
/* Every row, in order; stops at the first failure. bind_rows frees what it bound before failing. */
h3_status h3_wb_check_rows(const h3_wbind *b, const h3_wb_row *rows, int n);
h3_status h3_wb_bind_rows(const h3_wbind *b, const h3_wb_row *rows, int n);

/* The logical view of a tensor of the set by full name (with the prefix): NULL entry when absent. */
h3_status h3_wb_lookup(const h3_wbind *b, const char *name, const h3_st_entry **e, h3_wb_info *info);

/* The shape message for sizes a loader infers from the tensors themselves: "<source>: tensor '<name>' has
 * shape
 * [..]; <unit> needs <need...>" (name without the prefix; unit NULL: the model). */
h3_status h3_wb_shape_error(const h3_wbind *b, const char *name, int ndim, const int64_t *have,
                            const h3_wb_unit *unit, const char *need_fmt, ...) H3_PRINTF(6, 7);
/* The missing message for a tensor a loader needs outside a row: "...is missing; <unit> needs it as <words>".
 */
h3_status h3_wb_missing_error(const h3_wbind *b, const char *name, const h3_wb_unit *unit, const char *words);

/* "DiT block 3" or "the DiT". */
const char *h3_wb_unit_str(const h3_wbind *b, const h3_wb_unit *u, char *buf, size_t n);

#endif

/* Packing units: the tensors of one unit (a DiT block, an AdaLN projection, a text-encoder layer, a ViT
 * block, a BigVGAN stage) laid out for one slot at the arena's alignment, quantized tensors with their side
 * data (scales) after their values; the segments that fill the layout from memory or from the mapped files;
 * views of the tensors at a slot.
 *
 * A pack has two layouts. The stored layout holds each tensor as opened (its stored dtype): it is what is
 * read, copied and streamed. The placed layout holds each tensor in the dtype the forward takes it in
 * (h3_pack_add_as: e.g. bf16 matrices from an f32 file); where every tensor is placed as stored the two are
 * the same and the pack does not convert. Only plain float tensors convert (not quantized ones). Tensors may
 * be joined in the placed layout (h3_pack_join). */
#ifndef H3_MEM_PACK_H
#define H3_MEM_PACK_H

#include <stdint.h>

#include "io/safetensors.h"
#include "mem/streamer.h"
#include "tensor/tensor.h"

/* Tensors of one unit at most: a BigVGAN stage of 4 AMP blocks × 4 dilations (its transposed conv, 64 convs
 * and 32 activations of 4 tensors each) takes 194. */
#define H3_PACK_MAX 256
typedef struct h3_pack {
    int n;
    int overflow; /* h3_pack_add past H3_PACK_MAX, or a bad h3_pack_join (h3_units_open refuses the pack) */
    const h3_tensor *src[H3_PACK_MAX]; /* the tensors as opened */
    int64_t off[H3_PACK_MAX];
    int n_aux[H3_PACK_MAX];          /* side data of a quantized tensor (h3_quant_aux): scales */
    int64_t aux_off[H3_PACK_MAX][2]; /* packed after its values */
    int interleaved[H3_PACK_MAX];    /* the official per-head [q k v] order, reordered when copied */
    int64_t bytes;                   /* total, a multiple of the alignment */
    int64_t bytes_8bit;              /* the same with 8-bit matrices (1 byte + an f32 scale per row) */
    int quantized;                   /* some tensor has quantization scales (sized with them) */
    /* the placed layout */
    h3_dtype as[H3_PACK_MAX]; /* the dtype the forward takes tensor i in */
    int64_t poff[H3_PACK_MAX];
    int64_t psize[H3_PACK_MAX]; /* bytes of tensor i as placed (values; a quantized one with its side data) */
    int64_t pend;               /* where the last tensor ends */
    int64_t pbytes;  /* total, a multiple of the alignment (== bytes when nothing converts or joins) */
    int converts;    /* the placed layout is not the stored one: a tensor changes dtype, or tensors join */
    int64_t max_cvt; /* the stored bytes of the largest tensor that converts */
} h3_pack;

/* Appends t (its stored bytes at the next aligned offset, then its side data), placed as stored. Beyond
 * H3_PACK_MAX: not added, and p->overflow is set. */
void h3_pack_add(h3_pack *p, const h3_tensor *t, int interleaved);
/* The same, placed in dtype `as` (converted on arrival: mem/units.h). */
void h3_pack_add_as(h3_pack *p, const h3_tensor *t, int interleaved, h3_dtype as);
/* Places the tensor added last right after the one before it (no alignment between them), so that a run of
 * joined tensors of one placed dtype is one contiguous tensor as placed (three projections stacked into one
 * matrix). Only plain (not quantized) tensors join; otherwise the pack is marked bad. */
void h3_pack_join(h3_pack *p);
/* Where host memory ptr lies in set's mapped files: the file's fd and *off, or -1. set may be NULL. */
int h3_pack_file_of(const h3_st_set *set, const void *ptr, int64_t *off);
/* The segments that fill p's stored layout, written at segs (NULL: only counted); returns how many.
 * Interleaved tensors (fused QKV rows per head: heads × [q k v] of head_dim rows each; a vector counts an
 * element as a row) are reordered to [Q; K; V]. *pinned: every source is pinned host memory. */
int h3_pack_segs(const h3_st_set *set, const h3_pack *p, int64_t heads, int64_t head_dim, h3_stream_seg *segs,
                 int *pinned);
/* Tensor i of p as stored at base (values and side data), at place; a view (owns nothing). */
void h3_pack_view(const h3_pack *p, int i, void *base, h3_place place, h3_tensor *dst);
/* Tensor i of p as placed at base (its dtype `as`); a view. */
void h3_pack_view_placed(const h3_pack *p, int i, void *base, h3_place place, h3_tensor *dst);

#endif

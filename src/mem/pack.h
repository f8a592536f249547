/* Packing streamed items: the tensors of one item (a DiT unit, an AdaLN projection, a text-encoder layer)
 * laid out for one slot at the arena's alignment, quantized tensors with their side data (scales) after their
 * values; the segments that fill the layout from memory or from the mapped files; views of the tensors at a
 * slot. */
#ifndef H3_MEM_PACK_H
#define H3_MEM_PACK_H

#include <stdint.h>

#include "io/safetensors.h"
#include "mem/streamer.h"
#include "tensor/tensor.h"

#define H3_PACK_MAX 12
typedef struct h3_pack {
    int n;
    const h3_tensor *src[H3_PACK_MAX]; /* the tensors as opened */
    int64_t off[H3_PACK_MAX];
    int n_aux[H3_PACK_MAX];          /* side data of a quantized tensor (h3_quant_aux): scales */
    int64_t aux_off[H3_PACK_MAX][2]; /* packed after its values */
    int interleaved[H3_PACK_MAX];    /* the official per-head [q k v] order, reordered when copied */
    int64_t bytes;                   /* total, a multiple of the alignment */
    int64_t bytes_8bit;              /* the same with 8-bit matrices (1 byte + an f32 scale per row) */
    int quantized;                   /* some tensor has quantization scales (sized with them) */
} h3_pack;

/* Appends t (its stored bytes at the next aligned offset, then its side data). Beyond H3_PACK_MAX: ignored.
 */
void h3_pack_add(h3_pack *p, const h3_tensor *t, int interleaved);
/* Where host memory ptr lies in set's mapped files: the file's fd and *off, or -1. set may be NULL. */
int h3_pack_file_of(const h3_st_set *set, const void *ptr, int64_t *off);
/* The segments that fill p's layout, written at segs (NULL: only counted); returns how many. Interleaved
 * tensors (fused QKV rows per head: heads × [q k v] of head_dim rows each) are reordered to [Q; K; V].
 * *pinned: every source is pinned host memory. */
int h3_pack_segs(const h3_st_set *set, const h3_pack *p, int64_t heads, int64_t head_dim, h3_stream_seg *segs,
                 int *pinned);
/* Tensor i of p as packed at base (values and side data), at place; a view (owns nothing). */
void h3_pack_view(const h3_pack *p, int i, void *base, h3_place place, h3_tensor *dst);

#endif

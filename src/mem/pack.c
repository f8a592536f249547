/* Packing streamed items (pack.h). */
#include "mem/pack.h"

#include "cuda/cuda.h"
#include "quant/quant.h"

/* Bytes tensor i takes in the stored layout with its side data (the span from off[i]). */
static int64_t pack_span(const h3_pack *p, int i) {
    return (i + 1 < p->n ? p->off[i + 1] : p->bytes) - p->off[i];
}

void h3_pack_add_as(h3_pack *p, const h3_tensor *t, int interleaved, h3_dtype as) {
    if (p->n == H3_PACK_MAX) {
        p->overflow = 1;
        return;
    }
    const int64_t b = (int64_t)h3_tensor_nbytes(t);
    const int i = p->n++;
    p->src[i] = t;
    p->off[i] = p->bytes;
    p->interleaved[i] = interleaved;
    p->bytes += h3_cuda_granule(b);
    /* scales travel with their values, each part on its own granule */
    h3_qaux parts[2];
    int na = h3_quant_aux(t, parts);
    p->n_aux[i] = na > 0 ? na : 0;
    for (int a = 0; a < p->n_aux[i]; a++) {
        p->aux_off[i][a] = p->bytes;
        p->bytes += h3_cuda_granule(parts[a].bytes);
    }
    if (t->q.mode != H3_SCALE_NONE) p->quantized = 1;
    if (t->ndim == 2)
        p->bytes_8bit += h3_cuda_granule(t->shape[0] * t->shape[1]) + h3_cuda_granule(t->shape[0] * 4);
    else
        p->bytes_8bit += h3_cuda_granule(b);
    /* placed: a quantized tensor keeps its storage and side data (h3_units_open refuses to convert it); a
     * plain one takes its values in `as` */
    p->as[i] = as;
    if (t->q.mode != H3_SCALE_NONE)
        p->psize[i] = pack_span(p, i);
    else
        p->psize[i] = h3_tensor_numel(t) * (int64_t)h3_dtype_size(as);
    p->poff[i] = h3_cuda_granule(p->pend);
    p->pend = p->poff[i] + p->psize[i];
    p->pbytes = h3_cuda_granule(p->pend);
    if (as != t->dtype && t->q.mode == H3_SCALE_NONE) {
        p->converts = 1;
        if (b > p->max_cvt) p->max_cvt = b;
    }
}

void h3_pack_join(h3_pack *p) {
    const int i = p->n - 1;
    if (i < 1 || p->src[i]->q.mode != H3_SCALE_NONE || p->src[i - 1]->q.mode != H3_SCALE_NONE ||
        p->as[i] != p->as[i - 1]) {
        p->overflow = 1; /* not a joinable pair: h3_units_open refuses the pack */
        return;
    }
    p->poff[i] = p->poff[i - 1] + p->psize[i - 1];
    p->pend = p->poff[i] + p->psize[i];
    p->pbytes = h3_cuda_granule(p->pend);
    p->converts = 1; /* the placed layout is not the stored one */
}

void h3_pack_add(h3_pack *p, const h3_tensor *t, int interleaved) {
    h3_pack_add_as(p, t, interleaved, t->dtype);
}

int h3_pack_file_of(const h3_st_set *set, const void *p, int64_t *off) {
    if (!set) return -1;
    for (int i = 0; i < set->n_files; i++) {
        const h3_st_file *f = &set->files[i];
        const uint8_t *b = f->map.data;
        if (f->mapped && b && (const uint8_t *)p >= b && (const uint8_t *)p < b + f->map.size) {
            *off = (const uint8_t *)p - b;
            return f->fd;
        }
    }
    return -1;
}

int h3_pack_segs(const h3_st_set *set, const h3_pack *p, int64_t heads, int64_t head_dim, h3_stream_seg *segs,
                 int *pinned) {
    int n = 0;
    *pinned = 1;
    for (int i = 0; i < p->n; i++) {
        const h3_tensor *t = p->src[i];
        const uint8_t *base = t->data;
        int64_t foff = 0;
        int fd = h3_pack_file_of(set, base, &foff);
        if (fd < 0 && t->place != H3_PLACE_PINNED) *pinned = 0;
        if (fd >= 0) *pinned = 0;
        if (p->interleaved[i]) {
            /* rows [h: q k v] per head -> [Q; K; V]: new row j·inner + h·hd + e is old row h·3·hd + j·hd + e
             */
            const int64_t hd = head_dim, inner = heads * head_dim,
                          rb = t->ndim >= 2 ? (int64_t)h3_tensor_nbytes(t) / t->shape[0]
                                            : (int64_t)h3_dtype_size(t->dtype);
            for (int64_t j = 0; j < 3; j++)
                for (int64_t h = 0; h < heads; h++) {
                    if (segs) {
                        int64_t so = (h * 3 * hd + j * hd) * rb;
                        segs[n] = (h3_stream_seg){fd >= 0 ? NULL : base + so, fd, foff + so, hd * rb,
                                                  p->off[i] + (j * inner + h * hd) * rb};
                    }
                    n++;
                }
        } else {
            if (segs)
                segs[n] =
                    (h3_stream_seg){fd >= 0 ? NULL : base, fd, foff, (int64_t)h3_tensor_nbytes(t), p->off[i]};
            n++;
        }
        h3_qaux parts[2];
        const int na = p->n_aux[i] ? h3_quant_aux(t, parts) : 0;
        for (int a = 0; a < na; a++) {
            int64_t ao = 0;
            int afd = h3_pack_file_of(set, parts[a].p, &ao);
            if (afd >= 0) *pinned = 0;
            if (segs)
                segs[n] =
                    (h3_stream_seg){afd >= 0 ? NULL : parts[a].p, afd, ao, parts[a].bytes, p->aux_off[i][a]};
            n++;
        }
    }
    return n;
}

static void view_at(const h3_pack *p, int i, void *base, int64_t off, h3_dtype dt, h3_place place,
                    h3_tensor *dst) {
    const h3_tensor *src = p->src[i];
    *dst = *src;
    dst->dtype = dt;
    dst->data = (uint8_t *)base + off;
    dst->place = place;
    dst->owner = NULL;
    dst->owned_bytes = 0;
    dst->q.scales_owner = NULL;
    dst->q.scales_bytes = 0;
    if (src->ndim >= 1 && src->q.mode != H3_SCALE_FORMAT) { /* packed contiguous */
        int64_t st = 1;
        for (int d = src->ndim - 1; d >= 0; d--) {
            dst->stride[d] = st;
            st *= src->shape[d];
        }
    }
    void *copies[2] = {NULL, NULL};
    for (int a = 0; a < p->n_aux[i]; a++) copies[a] = (uint8_t *)base + off + (p->aux_off[i][a] - p->off[i]);
    if (p->n_aux[i]) h3_quant_aux_rebind(dst, copies);
}

void h3_pack_view(const h3_pack *p, int i, void *base, h3_place place, h3_tensor *dst) {
    view_at(p, i, base, p->off[i], p->src[i]->dtype, place, dst);
}

void h3_pack_view_placed(const h3_pack *p, int i, void *base, h3_place place, h3_tensor *dst) {
    view_at(p, i, base, p->poff[i], p->as[i], place, dst);
}

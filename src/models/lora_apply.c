/* LoRA applied to the DiT (lora.h): merged into float weights, or a side path after the weight's GEMM. */
#include <string.h>

#include "base/alloc.h"
#include "base/log.h"
#include "models/dit_internal.h"
#include "models/lora.h"

/* Rows per side-path piece, which bounds its scratch. On the host pieces stay at 256 rows; on the device a
 * piece is two GEMM launches whatever its size, so pieces are as long as an 8 MiB scratch allows (up to 16,384
 * rows): a block's row chunk in one or a few pieces. With 256-row pieces W124 (19,412 rows) took 76 pieces per weight
 * and the side path cost 9% of the step at an 8 GiB budget (bench/NOTES.md). */
#define H3_LORA_CHUNK 256
#define H3_LORA_DEVICE_SCRATCH ((int64_t)8 << 20)
#define H3_LORA_DEVICE_ROWS_MAX 16384

static int64_t side_rows(h3_place place, int64_t rmax, h3_dtype dt) {
    if (place == H3_PLACE_HOST || rmax < 1) return H3_LORA_CHUNK;
    int64_t r = H3_LORA_DEVICE_SCRATCH / (rmax * (int64_t)h3_dtype_size(dt));
    r = r > H3_LORA_DEVICE_ROWS_MAX ? H3_LORA_DEVICE_ROWS_MAX : r;
    return r < H3_LORA_CHUNK ? H3_LORA_CHUNK : r;
}
#define MERGE_SCRATCH (64 << 20)

static int is_float_weight(const h3_tensor *w) {
    return w->q.mode == H3_SCALE_NONE && (w->dtype == H3_F32 || w->dtype == H3_BF16 || w->dtype == H3_F16);
}

static const char *const ROLE_NAMES[] = {"fused QKV", "q", "k", "v", "out projection", "fc1", "fc2"};

static h3_tensor *unit_tensor(h3_dit_block_weights *w, int role) {
    h3_tensor *ts[] = {&w->qkv, &w->q, &w->k, &w->v, &w->out, &w->fc1, &w->fc2};
    return ts[role];
}

static h3_tensor *global_tensor(h3_dit *d, int g) {
    h3_dit_globals *G = &d->g;
    h3_tensor *ts[] = {&G->video_in_w, &G->audio_in_w,    &G->text_in_w,   &G->time_in_w,
                       &G->time_out_w, &G->final_adaln_w, &G->video_out_w, &G->audio_out_w};
    return ts[g];
}

/* The target's factors side by side on the host: A [R, in], its transpose At [in, R], and Bs [out, R] with
 * each factor's scale folded in; B's rows turned from per-head to contiguous QKV order when to_contiguous. */
static h3_status concat(const h3_dit *d, const h3_lora_target *t, int to_contiguous, float **pa, float **pat,
                        float **pb, int64_t *pR) {
    int64_t R = 0;
    for (int i = 0; i < t->n; i++) R += t->f[i].rank;
    const int64_t in = t->in, out = t->out;
    float *A = h3_malloc((size_t)(R * in) * sizeof(float), H3_MEM_WORKSPACE);
    float *At = h3_malloc((size_t)(R * in) * sizeof(float), H3_MEM_WORKSPACE);
    float *B = h3_malloc((size_t)(R * out) * sizeof(float), H3_MEM_WORKSPACE);
    if (!A || !At || !B) {
        h3_free(A);
        h3_free(At);
        h3_free(B);
        return H3_ERR(H3_ERR_NOMEM, "out of memory applying a LoRA to '%s'", t->name);
    }
    const int64_t heads = d->cfg.heads, hd = d->cfg.head_dim, inner = heads * hd;
    int64_t r0 = 0;
    for (int i = 0; i < t->n; i++) {
        const h3_lora_factor *f = &t->f[i];
        for (int64_t k = 0; k < f->rank; k++)
            for (int64_t j = 0; j < in; j++) {
                A[(r0 + k) * in + j] = f->a[k * in + j];
                At[j * R + r0 + k] = f->a[k * in + j];
            }
        for (int64_t o = 0; o < out; o++) {
            int64_t src = o;
            if (to_contiguous) { /* contiguous row o = j·inner + h·hd + e reads per-head row h·3·hd + j·hd + e
                                  */
                int64_t j = o / inner, h = (o % inner) / hd, e = o % hd;
                src = h * 3 * hd + j * hd + e;
            }
            for (int64_t k = 0; k < f->rank; k++) B[o * R + r0 + k] = f->scale * f->b[src * f->rank + k];
        }
        r0 += f->rank;
    }
    *pa = A;
    *pat = At;
    *pb = B;
    *pR = R;
    return H3_OK;
}

/* A host array as a tensor at place (an owned copy there, or a view on the host). */
static h3_status at_place(h3_exec *ex, h3_place place, h3_dtype dt, const float *host, int64_t d0, int64_t d1,
                          h3_tensor *out) {
    h3_tensor src;
    int64_t s[2] = {d0, d1};
    H3_TRY(h3_tensor_wrap(&src, (void *)host, H3_PLACE_HOST, H3_F32, 2, s));
    H3_TRY(h3_tensor_alloc(out, place, dt, 2, s, H3_MEM_WEIGHTS));
    h3_status st;
    if (dt == H3_F32) {
        st = h3_copy(ex, out, &src);
    } else { /* convert on the host, then copy */
        h3_tensor tmp;
        st = h3_tensor_alloc(&tmp, H3_PLACE_HOST, dt, 2, s, H3_MEM_WORKSPACE);
        if (st == H3_OK) {
            if (!h3_convert_from_f32(dt, host, tmp.data, (size_t)(d0 * d1)))
                st = H3_ERR(H3_ERR_INTERNAL, "LoRA: factors cannot be held as %s", h3_dtype_name(dt));
            if (st == H3_OK) st = h3_copy(ex, out, &tmp);
            if (st == H3_OK) st = h3_exec_sync(ex);
            h3_tensor_free(&tmp);
        }
    }
    if (st == H3_OK) st = h3_exec_sync(ex);
    if (st != H3_OK) h3_tensor_free(out);
    return st;
}

/* W += Bs·A (At = Aᵀ), computed in f32 in row chunks and rounded once to W's dtype, at W's place. */
static h3_status merge_into(h3_exec *ex, h3_tensor *W, const float *At, const float *Bs, int64_t R) {
    const int64_t out = W->shape[0], in = W->shape[1];
    int64_t rc = MERGE_SCRATCH / (in * (int64_t)sizeof(float));
    if (rc < 1) rc = 1;
    if (rc > out) rc = out;
    h3_status st = H3_OK;
    h3_tensor at = {0}, bs = {0}, tmp = {0};
    H3_CHECK(at_place(ex, W->place, H3_F32, At, in, R, &at));
    H3_CHECK(at_place(ex, W->place, H3_F32, Bs, out, R, &bs));
    H3_CHECK(h3_tensor_alloc2(&tmp, W->place, H3_F32, rc, in, H3_MEM_WORKSPACE));
    for (int64_t r0 = 0; r0 < out; r0 += rc) {
        int64_t m = out - r0 < rc ? out - r0 : rc;
        h3_tensor wc, tc, bc;
        H3_CHECK(h3_tensor_narrow(W, 0, r0, m, &wc));
        H3_CHECK(h3_tensor_narrow(&tmp, 0, 0, m, &tc));
        H3_CHECK(h3_tensor_narrow(&bs, 0, r0, m, &bc));
        H3_CHECK(h3_op_convert(ex, &tc, &wc));
        H3_CHECK(h3_op_gemm(ex, &tc, &bc, &at, NULL, H3_GEMM_ACCUMULATE));
        H3_CHECK(h3_op_convert(ex, &wc, &tc));
    }
    H3_CHECK(h3_exec_sync(ex));
done:
    h3_tensor_free(&at);
    h3_tensor_free(&bs);
    h3_tensor_free(&tmp);
    return st;
}

/* Replaces a host weight that views the mapped file by an owned copy (the file stays untouched). */
static h3_status own_copy(h3_dit *d, h3_tensor *W) {
    if (W->owner || W->place != H3_PLACE_HOST) return H3_OK;
    h3_tensor c;
    H3_TRY(h3_tensor_alloc(&c, H3_PLACE_HOST, W->dtype, W->ndim, W->shape, H3_MEM_WEIGHTS));
    memcpy(c.data, W->data, h3_tensor_nbytes(W));
    d->lora_merged_bytes += (int64_t)h3_tensor_nbytes(W);
    *W = c;
    return H3_OK;
}

static h3_status ensure_state(h3_dit *d) {
    if (d->lside) return H3_OK;
    int n = h3_lora_n_slots(&d->cfg);
    d->lside = h3_calloc((size_t)(n ? n : 1), sizeof *d->lside, H3_MEM_OTHER);
    d->lora_done = h3_calloc((size_t)(n ? n : 1), 1, H3_MEM_OTHER);
    if (!d->lside || !d->lora_done) return H3_ERR(H3_ERR_NOMEM, "out of memory applying a LoRA");
    return H3_OK;
}

/* Merges or attaches the target of slot. W: the weight as the forward will read it (NULL: read elsewhere,
 * only its dtype matters: wref). writable: W may be modified; dit_own: W is the DiT's own table entry, whose
 * host views of the mapped file become owned copies first (a placed unit's memory is the units' own, written in
 * place). */
static h3_status apply_slot(h3_dit *d, h3_exec *ex, int slot, h3_tensor *W, const h3_tensor *wref,
                            int writable, int dit_own, int to_contiguous, h3_dtype side_dt, int arrival) {
    const h3_lora *l = d->lora;
    int ti = l->slot_target[slot];
    if (ti < 0 || d->lora_done[slot]) return H3_OK;
    const h3_lora_target *t = &l->t[ti];
    const int fl = is_float_weight(wref);
    if (d->lora_mode == H3_LORA_MERGE && !fl)
        return H3_ERR(
            H3_ERR_INVALID,
            "LoRA: '%s' is stored %s%s, which cannot take a merged LoRA; use --lora-mode auto or side (the "
            "low-rank side path)",
            t->name, h3_dtype_name(wref->dtype), wref->q.mode != H3_SCALE_NONE ? " with scales" : "");
    const int merge = fl && writable && W && d->lora_mode != H3_LORA_SIDE;
    /* a streamed block weight held as the activations are: merged into its slot on each arrival */
    const int on_arrival = arrival && fl && wref->dtype == side_dt && d->lora_mode != H3_LORA_SIDE;
    float *A = NULL, *At = NULL, *B = NULL;
    int64_t R = 0;
    H3_TRY(concat(d, t, to_contiguous, &A, &At, &B, &R));
    h3_status st = H3_OK;
    if (merge) {
        if (dit_own) H3_CHECK(own_copy(d, W));
        H3_CHECK_CTX(merge_into(ex, W, At, B, R), "merging a LoRA into '%s'", t->name);
        d->lora_n_merged++;
    } else if (on_arrival) {
        h3_dit_lside *s = &d->lside[slot];
        H3_CHECK(at_place(ex, d->act_place, side_dt, At, t->in, R, &s->mt));
        H3_CHECK(at_place(ex, d->act_place, side_dt, B, t->out, R, &s->mb));
        d->lora_n_arrival++;
    } else {
        h3_dit_lside *s = &d->lside[slot];
        H3_CHECK(at_place(ex, d->act_place, side_dt, A, R, t->in, &s->a));
        H3_CHECK(at_place(ex, d->act_place, side_dt, B, t->out, R, &s->b));
        d->lora_n_side++;
    }
    d->lora_done[slot] = 1;
done:
    h3_free(A);
    h3_free(At);
    h3_free(B);
    return st;
}

/* q, k, v views of a contiguous fused QKV after the fused tensor was replaced. */
static h3_status qkv_views(h3_dit *d, h3_dit_block_weights *w) {
    const int64_t inner = h3_dit_inner(&d->cfg);
    H3_TRY(h3_tensor_narrow(&w->qkv, 0, 0, inner, &w->q));
    H3_TRY(h3_tensor_narrow(&w->qkv, 0, inner, inner, &w->k));
    return h3_tensor_narrow(&w->qkv, 0, 2 * inner, inner, &w->v);
}

h3_status h3_lora_apply_unit(h3_dit *d, h3_exec *ex, int u, h3_dit_block_weights *placed, int resident,
                             int qkv_contiguous) {
    if (!d->lora || d->lora->n == 0) return H3_OK;
    H3_TRY(ensure_state(d));
    h3_dit_block_weights *own = &d->units[u];
    for (int role = H3_LS_QKV; role <= H3_LS_FC2; role++) {
        int slot = h3_lora_slot_unit(&d->cfg, u, role);
        const h3_tensor *ref = unit_tensor(own, role);
        h3_tensor *W = placed ? unit_tensor(placed, role) : NULL;
        int to_contig = role == H3_LS_QKV && d->lora->qkv_interleaved && qkv_contiguous;
        h3_dtype sdt = d->act_dtype;
        void *before = W ? W->data : NULL;
        const int arrival = !placed && (d->stream_weights || d->wsrc);
        H3_TRY_CTX(apply_slot(d, ex, slot, W, ref, resident, placed == own, to_contig, sdt, arrival), "LoRA on %s %d",
                   u < d->cfg.n_refiner_layers ? "token-refiner block" : "DiT block",
                   u < d->cfg.n_refiner_layers ? u : u - (int)d->cfg.n_refiner_layers);
        if (W && role == H3_LS_QKV && W->data != before && placed->qkv.data && !placed->qkv_interleaved)
            H3_TRY(qkv_views(d, placed));
    }
    return H3_OK;
}

h3_status h3_lora_merge_arrived(h3_dit *d, h3_exec *ex, int u, h3_dit_block_weights *w) {
    if (!d->lside || !d->lora_n_arrival) return H3_OK;
    for (int role = H3_LS_QKV; role <= H3_LS_FC2; role++) {
        const h3_dit_lside *s = &d->lside[h3_lora_slot_unit(&d->cfg, u, role)];
        if (!s->mt.data) continue;
        h3_tensor *W = unit_tensor(w, role);
        if (!W || !W->data || W->dtype != s->mb.dtype || W->ndim != 2 || W->shape[0] != s->mb.shape[0] ||
            W->shape[1] != s->mt.shape[0])
            return H3_ERR(H3_ERR_INTERNAL, "LoRA: unit %d's %s arrived as %s, not as its factors expect", u,
                          ROLE_NAMES[role], W && W->data ? h3_dtype_name(W->dtype) : "nothing");
        H3_TRY(h3_op_gemm(ex, W, &s->mb, &s->mt, NULL, H3_GEMM_ACCUMULATE));
    }
    return H3_OK;
}

h3_status h3_lora_apply_rest(h3_dit *d, h3_exec *ex) {
    const h3_lora *l = d->lora;
    if (!l || l->n == 0) return H3_OK;
    H3_TRY(ensure_state(d));
    const h3_dit_config *c = &d->cfg;
    const int streamed = d->stream_weights || d->wsrc;
    for (int u = 0; u < h3_dit_n_units(c); u++) /* units not placed: the side path */
        H3_TRY(h3_lora_apply_unit(d, ex, u, NULL, 0, streamed || !d->qkv_interleaved));
    for (int b = 0; b < c->n_layers; b++) {
        h3_tensor *W = &d->adaln_w[b];
        int writable = !streamed && (W->place == H3_PLACE_HOST || W->owner);
        H3_TRY_CTX(apply_slot(d, ex, h3_lora_slot_adaln(c, b), W, W, writable, 1, 0, H3_F32, 0),
                   "LoRA on DiT block %d's "
                   "AdaLN projection",
                   b);
    }
    for (int g = 0; g < H3_LS_GLOBALS; g++) {
        h3_tensor *W = global_tensor(d, g);
        /* non-block weights: read in place on the host; on the device, the owned copies the stage uploaded */
        int writable = W->place == H3_PLACE_HOST ? d->act_place == H3_PLACE_HOST && !d->stream_weights
                                                 : W->place == d->act_place && W->owner != NULL;
        H3_TRY(apply_slot(d, ex, h3_lora_slot_global(c, g), W, W, writable, 1, 0, H3_F32, 0));
    }
    /* the side path's scratch: [chunk, largest rank] in the unit slots' dtype */
    int64_t rmax = 0;
    for (int s = 0; s < l->n_slots; s++)
        if (d->lside[s].a.data && d->lside[s].a.shape[0] > rmax) rmax = d->lside[s].a.shape[0];
    h3_tensor_free(&d->lora_t);
    if (rmax)
        H3_TRY(h3_tensor_alloc2(&d->lora_t, d->act_place, d->act_dtype, side_rows(d->act_place, rmax, d->act_dtype),
                                rmax, H3_MEM_WEIGHTS));
    return H3_OK;
}

h3_status h3_lora_apply(h3_dit *d, h3_exec *ex, const h3_lora *l, h3_lora_mode mode) {
    if (d->lora) return H3_ERR(H3_ERR_INVALID, "DiT: a LoRA was applied already (give every file at once)");
    d->lora = l;
    d->lora_mode = (int)mode;
    if (!l || l->n == 0 || d->stream_weights) return H3_OK; /* a streaming DiT: the stage applies it */
    h3_status st = H3_OK;
    for (int u = 0; u < h3_dit_n_units(&d->cfg) && st == H3_OK; u++)
        st = h3_lora_apply_unit(d, ex, u, &d->units[u], 1, !d->qkv_interleaved);
    if (st == H3_OK) st = h3_lora_apply_rest(d, ex);
    return st;
}

const h3_lora *h3_dit_lora(const h3_dit *d, h3_lora_mode *mode) {
    if (mode) *mode = (h3_lora_mode)d->lora_mode;
    return d->lora;
}

void h3_lora_detach(h3_dit *d) {
    if (d->lside) {
        for (int s = 0; s < h3_lora_n_slots(&d->cfg); s++) {
            h3_tensor_free(&d->lside[s].a);
            h3_tensor_free(&d->lside[s].b);
            h3_tensor_free(&d->lside[s].mt);
            h3_tensor_free(&d->lside[s].mb);
        }
        h3_free(d->lside);
    }
    h3_free(d->lora_done);
    h3_tensor_free(&d->lora_t);
    d->lside = NULL;
    d->lora_done = NULL;
    d->lora_n_side = 0;
    d->lora_n_merged = 0;
    d->lora_n_arrival = 0;
}

void h3_lora_mem_of(const h3_dit *d, h3_lora_mem *out) {
    memset(out, 0, sizeof *out);
    out->merged = d->lora_merged_bytes;
    out->n_merged = d->lora_n_merged;
    out->n_side = d->lora_n_side;
    out->n_arrival = d->lora_n_arrival;
    if (!d->lside) return;
    for (int s = 0; s < h3_lora_n_slots(&d->cfg); s++) {
        const h3_dit_lside *l = &d->lside[s];
        if (l->a.data) out->side += (int64_t)h3_tensor_nbytes(&l->a) + (int64_t)h3_tensor_nbytes(&l->b);
        if (l->mt.data) out->side += (int64_t)h3_tensor_nbytes(&l->mt) + (int64_t)h3_tensor_nbytes(&l->mb);
    }
    if (d->lora_t.data) out->side += (int64_t)h3_tensor_nbytes(&d->lora_t);
}

int64_t h3_lora_host_bytes(const h3_dit *d, const h3_lora *l, h3_lora_mode mode) {
    if (!l || l->n == 0) return 0;
    int64_t b = h3_lora_bytes(l);
    for (int i = 0; i < l->n; i++) {
        const h3_lora_target *t = &l->t[i];
        const h3_tensor *w = NULL;
        const h3_dit_config *c = &d->cfg;
        const int U = h3_dit_n_units(c), per = U * H3_LS_PER_UNIT;
        if (t->slot < per) w = unit_tensor(&d->units[t->slot / H3_LS_PER_UNIT], t->slot % H3_LS_PER_UNIT);
        else if (t->slot < per + c->n_layers) w = &d->adaln_w[t->slot - per];
        else w = global_tensor((h3_dit *)d, t->slot - per - (int)c->n_layers);
        int64_t R = 0;
        for (int j = 0; j < t->n; j++) R += t->f[j].rank;
        if (mode != H3_LORA_SIDE && is_float_weight(w)) b += w->owner ? 0 : (int64_t)h3_tensor_nbytes(w);
        else b += R * (t->in + t->out) * (int64_t)sizeof(float);
    }
    return b + MERGE_SCRATCH;
}

int64_t h3_lora_side_bytes(const h3_lora *l, h3_dtype act_dtype) {
    if (!l || l->n == 0) return 0;
    int64_t e = 0, rmax = 0;
    for (int i = 0; i < l->n; i++) {
        int64_t R = 0;
        for (int j = 0; j < l->t[i].n; j++) R += l->t[i].f[j].rank;
        e += R * (l->t[i].in + l->t[i].out);
        if (R > rmax) rmax = R;
    }
    /* f32 for the AdaLN and non-block slots, the activation dtype for the blocks': count the wider; the scratch
     * as the device sizes it */
    return e * (int64_t)sizeof(float) +
           side_rows(H3_PLACE_DEVICE, rmax, act_dtype) * rmax * (int64_t)h3_dtype_size(act_dtype);
}

h3_status h3_lora_side(h3_dit *d, h3_exec *ex, int slot, h3_tensor *y, const h3_tensor *x) {
    if (!d->lside || !d->lside[slot].a.data) return H3_OK;
    const h3_dit_lside *s = &d->lside[slot];
    const int64_t R = s->a.shape[0], in = s->a.shape[1], out = s->b.shape[0], M = h3_tensor_rows(x);
    const h3_dtype fdt = s->a.dtype;
    const int direct = x->dtype == fdt && y->dtype == fdt && d->lora_t.dtype == fdt;
    const int64_t P = direct ? d->lora_t.shape[0] : H3_LORA_CHUNK; /* rows per piece */
    h3_status st = H3_OK;
    h3_tensor xs = {0}, ts = {0}, us = {0}, uy = {0};
    if (!direct) { /* mixed dtypes (f32 islands among bf16 activations): convert through scratch of one piece
                    */
        H3_CHECK(h3_tensor_alloc2(&xs, x->place, fdt, H3_LORA_CHUNK, in, H3_MEM_WORKSPACE));
        H3_CHECK(h3_tensor_alloc2(&ts, x->place, fdt, H3_LORA_CHUNK, R, H3_MEM_WORKSPACE));
        H3_CHECK(h3_tensor_alloc2(&us, x->place, fdt, H3_LORA_CHUNK, out, H3_MEM_WORKSPACE));
        H3_CHECK(h3_tensor_alloc2(&uy, x->place, y->dtype, H3_LORA_CHUNK, out, H3_MEM_WORKSPACE));
    }
    for (int64_t r0 = 0; r0 < M; r0 += P) {
        int64_t m = M - r0 < P ? M - r0 : P;
        h3_tensor xc, yc, t;
        int64_t st2[2] = {m, R};
        H3_CHECK(h3_tensor_narrow(x, 0, r0, m, &xc));
        H3_CHECK(h3_tensor_narrow(y, 0, r0, m, &yc));
        if (direct) {
            H3_CHECK(h3_tensor_wrap(&t, d->lora_t.data, d->lora_t.place, fdt, 2, st2));
            H3_CHECK(h3_op_gemm(ex, &t, &xc, &s->a, NULL, 0));
            H3_CHECK(h3_op_gemm(ex, &yc, &t, &s->b, NULL, H3_GEMM_ACCUMULATE));
        } else {
            h3_tensor xv, uv, yv;
            H3_CHECK(h3_tensor_narrow(&xs, 0, 0, m, &xv));
            H3_CHECK(h3_tensor_wrap(&t, ts.data, ts.place, fdt, 2, st2));
            H3_CHECK(h3_tensor_narrow(&us, 0, 0, m, &uv));
            H3_CHECK(h3_tensor_narrow(&uy, 0, 0, m, &yv));
            H3_CHECK(h3_op_convert(ex, &xv, &xc));
            H3_CHECK(h3_op_gemm(ex, &t, &xv, &s->a, NULL, 0));
            H3_CHECK(h3_op_gemm(ex, &uv, &t, &s->b, NULL, 0));
            H3_CHECK(h3_op_convert(ex, &yv, &uv));
            H3_CHECK(h3_op_binary(ex, &yc, &yc, &yv, H3_BINARY_ADD));
        }
    }
    if (!direct) H3_CHECK(h3_exec_sync(ex));
done:
    h3_tensor_free(&xs);
    h3_tensor_free(&ts);
    h3_tensor_free(&us);
    h3_tensor_free(&uy);
    return st;
}

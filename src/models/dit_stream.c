/* The DiT stage on a device budget (dit_stream.h): packing, the streamer's items, the weight source. */
#include "models/dit_stream.h"

#include <string.h>

#include "base/alloc.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "mem/units.h"
#include "models/lora.h"
#include "quant/quant.h"

/* The tensors of a unit in pack order; out (may be NULL) receives the matching fields of dst. */
static int unit_fields(const h3_dit_block_weights *w, h3_dit_block_weights *dst, const h3_tensor **src,
                       h3_tensor **out, int *interleaved) {
    int n = 0;
#define F(x)                                                                                                 \
    do {                                                                                                     \
        if (w->x.data) {                                                                                     \
            src[n] = &w->x;                                                                                  \
            if (out) out[n] = dst ? &dst->x : NULL;                                                          \
            interleaved[n] = 0;                                                                              \
            n++;                                                                                             \
        }                                                                                                    \
    } while (0)
    F(norm1);
    F(norm2);
    if (w->qkv.data) {
        F(qkv);
        interleaved[n - 1] = w->qkv_interleaved;
    } else {
        F(q);
        F(k);
        F(v);
    }
    F(q_norm);
    F(k_norm);
    F(out);
    F(fc1);
    F(fc2);
#undef F
    return n;
}

void h3_dit_pack_unit(const h3_dit *dit, int unit, h3_dit_pack *out) {
    memset(out, 0, sizeof *out);
    const h3_dit_block_weights *w = h3_dit_unit_weights(dit, unit);
    if (!w) return;
    const h3_tensor *src[H3_DIT_PACK_MAX];
    int il[H3_DIT_PACK_MAX];
    int n = unit_fields(w, NULL, src, NULL, il);
    for (int i = 0; i < n; i++) h3_pack_add(out, src[i], il[i]);
}

void h3_dit_pack_adaln(const h3_dit *dit, int block, h3_dit_pack *out) {
    memset(out, 0, sizeof *out);
    const h3_tensor *w, *b;
    if (h3_dit_adaln_weights(dit, block, &w, &b) != H3_OK) {
        h3_clear_error();
        return;
    }
    if (w->data) h3_pack_add(out, w, 0);
    if (b->data) h3_pack_add(out, b, 0);
}

/* The weights outside the blocks that the device forward reads: every tensor whose name is not a block's, but
 * the curve table and the RoPE frequencies, which the host reads. */
static int is_global(const char *name) {
    return !strstr(name, "blocks.") && strcmp(name, "adaln_t_table") != 0 &&
           strcmp(name, "rope.inv_freq") != 0;
}

static int sum_global(const char *name, h3_tensor *t, void *user) {
    if (is_global(name)) *(int64_t *)user += h3_cuda_granule((int64_t)h3_tensor_nbytes(t));
    return 0;
}

int64_t h3_dit_globals_device_bytes(const h3_dit *dit) {
    int64_t b = 0;
    h3_dit_visit_weights((h3_dit *)dit, sum_global, &b);
    return b;
}

/* ---- the stage ----------------------------------------------------------------------------------------- */

enum { MODE_NONE = 0, MODE_FORWARD, MODE_ADALN };
#define MAX_GLOBALS 64

struct h3_dit_stream {
    h3_dit *dit;
    h3_exec *ex;
    h3_place place;
    h3_units *u; /* items: the units, then the AdaLN projection of each block */
    int n_units, n_blocks, n_items;
    h3_dit_block_weights *unit_w; /* [n_units]: views handed to the forward */
    h3_tensor *ad_w, *ad_b;       /* [n_blocks] */
    int *fwd_order, n_fwd, *ad_order, n_ad, mode;
    h3_dit_weight_source src;
    /* non-block weights uploaded: where they live in the DiT, and what was there */
    h3_tensor *saved_at[MAX_GLOBALS];
    h3_tensor saved[MAX_GLOBALS];
    int n_saved;
    /* the placement it made (h3_dit_stream_matches), and its copies before the current stage */
    uint8_t *tier;
    int n_slots;
    int64_t slot_bytes, chunk_rows;
    h3_stream_stats base;
};

/* The forward's view of unit u from the tensors the units hand out (pack order of unit_fields). */
static h3_status build_unit_views(h3_dit_stream *ds, int u, const h3_tensor *t) {
    const h3_dit_block_weights *w = h3_dit_unit_weights(ds->dit, u);
    h3_dit_block_weights *o = &ds->unit_w[u];
    *o = *w;
    const h3_tensor *src[H3_DIT_PACK_MAX];
    h3_tensor *dst[H3_DIT_PACK_MAX];
    int il[H3_DIT_PACK_MAX];
    int n = unit_fields(w, o, src, dst, il);
    for (int i = 0; i < n; i++) *dst[i] = t[i];
    if (o->qkv.data) { /* packed contiguous [Q; K; V] whatever the file's order */
        const int64_t inner = h3_dit_inner(h3_dit_get_config(ds->dit));
        o->qkv_interleaved = 0;
        H3_TRY(h3_tensor_narrow(&o->qkv, 0, 0, inner, &o->q));
        H3_TRY(h3_tensor_narrow(&o->qkv, 0, inner, inner, &o->k));
        H3_TRY(h3_tensor_narrow(&o->qkv, 0, 2 * inner, inner, &o->v));
    }
    return H3_OK;
}

static h3_status src_acquire(void *user, h3_exec *ex, int unit, const h3_dit_block_weights **w) {
    h3_dit_stream *ds = user;
    if (ds->mode != MODE_FORWARD && ds->n_fwd) {
        H3_TRY(h3_units_set_order(ds->u, ds->fwd_order, ds->n_fwd, 1));
        ds->mode = MODE_FORWARD;
    }
    const h3_tensor *t;
    H3_TRY(h3_units_acquire(ds->u, unit, &t));
    if (h3_units_tier(ds->u, unit) != H3_TIER_RESIDENT) {
        H3_TRY(build_unit_views(ds, unit, t));
        /* a LoRA merged into the slot the block just arrived in (its bytes are fresh with every arrival) */
        H3_TRY(h3_lora_merge_arrived(ds->dit, ex, unit, &ds->unit_w[unit]));
    }
    *w = &ds->unit_w[unit];
    return H3_OK;
}

static void src_release(void *user, h3_exec *ex, int unit) {
    (void)ex;
    h3_dit_stream *ds = user;
    h3_units_release(ds->u, unit);
}

static h3_status src_adaln_acquire(void *user, h3_exec *ex, int block, const h3_tensor **w,
                                   const h3_tensor **b) {
    (void)ex;
    h3_dit_stream *ds = user;
    if (ds->mode != MODE_ADALN) {
        H3_TRY(h3_units_set_order(ds->u, ds->ad_order, ds->n_ad, 0));
        ds->mode = MODE_ADALN;
    }
    const h3_tensor *t;
    H3_TRY(h3_units_acquire(ds->u, ds->n_units + block, &t));
    ds->ad_w[block] = t[0];
    ds->ad_b[block] = t[1];
    *w = &ds->ad_w[block];
    *b = &ds->ad_b[block];
    return H3_OK;
}

static void src_adaln_release(void *user, h3_exec *ex, int block) {
    (void)ex;
    h3_dit_stream *ds = user;
    h3_units_release(ds->u, ds->n_units + block);
}

typedef struct {
    h3_dit_stream *ds;
    h3_status st;
} up_ctx;

/* Replaces a non-block weight by an owned copy at the activation place, keeping the original to put back at
 * close (so the DiT can stream again into another arena). */
static int upload_global(const char *name, h3_tensor *t, void *user) {
    up_ctx *c = user;
    h3_dit_stream *ds = c->ds;
    if (!is_global(name) || t->place == ds->place) return 0;
    if (ds->n_saved == MAX_GLOBALS) {
        c->st = H3_ERR(H3_ERR_INTERNAL, "DiT stream: more than %d non-block weights", MAX_GLOBALS);
        return 1;
    }
    h3_tensor dev;
    c->st = h3_tensor_alloc(&dev, ds->place, t->dtype, t->ndim, t->shape, H3_MEM_WEIGHTS);
    if (c->st == H3_OK) c->st = h3_copy(ds->ex, &dev, t);
    if (c->st == H3_OK) c->st = h3_exec_sync(ds->ex);
    if (c->st != H3_OK) {
        h3_tensor_free(&dev);
        c->st = h3_error_wrap(c->st, "uploading DiT weight '%s'", name);
        return 1;
    }
    ds->saved_at[ds->n_saved] = t;
    ds->saved[ds->n_saved++] = *t;
    *t = dev;
    return 0;
}

static void restore_globals(h3_dit_stream *ds) {
    for (int i = ds->n_saved - 1; i >= 0; i--) {
        h3_tensor_free(ds->saved_at[i]);
        *ds->saved_at[i] = ds->saved[i];
    }
    ds->n_saved = 0;
}

void h3_dit_stream_close(h3_dit_stream *ds) {
    if (!ds) return;
    h3_error_state kept; /* a failure that led here keeps its message */
    h3_error_save(&kept);
    h3_dit_set_weight_source(ds->dit, NULL);
    h3_lora_detach(ds->dit); /* side factors; merged units and globals go with them below */
    h3_clear_error();
    h3_units_close(ds->u);
    h3_exec_sync(ds->ex);
    h3_clear_error();
    restore_globals(ds);
    h3_free(ds->unit_w);
    h3_free(ds->ad_w);
    h3_free(ds->ad_b);
    h3_free(ds->fwd_order);
    h3_free(ds->ad_order);
    h3_free(ds->tier);
    h3_free(ds);
    h3_error_restore(&kept);
}

h3_status h3_dit_stream_open(h3_dit *dit, h3_exec *ex, const h3_dit_placement *plan,
                             const h3_dit_stream_opts *opts, h3_memrep *rep, h3_dit_stream **out) {
    *out = NULL;
    const h3_dit_config *c = h3_dit_get_config(dit);
    const int U = h3_dit_n_units(c), B = (int)c->n_layers;
    if (plan->n_units != U || !plan->tier)
        return H3_ERR(H3_ERR_INVALID, "DiT stream: the plan is for %d blocks, the DiT has %d", plan->n_units,
                      U);
    const h3_place place = h3_dit_act_place(dit);
    if (U > 0 && h3_dit_unit_weights(dit, 0)->fc1.place == H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID, "DiT stream: the blocks are on the device already (open the DiT with "
                                      "stream_weights and host weights)");
    h3_status st = H3_OK;
    h3_dit_stream *ds = h3_calloc(1, sizeof *ds, H3_MEM_OTHER);
    if (!ds) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    ds->dit = dit;
    ds->ex = ex;
    ds->place = place;
    ds->n_units = U;
    ds->n_blocks = B;
    ds->n_items = U + B;
    const int NI = ds->n_items ? ds->n_items : 1;
    h3_dit_pack *packs = h3_calloc((size_t)NI, sizeof *packs, H3_MEM_OTHER);
    uint8_t *tier = h3_calloc((size_t)NI, 1, H3_MEM_OTHER);
    ds->unit_w = h3_calloc((size_t)(U ? U : 1), sizeof *ds->unit_w, H3_MEM_OTHER);
    ds->ad_w = h3_calloc((size_t)(B ? B : 1), sizeof *ds->ad_w, H3_MEM_OTHER);
    ds->ad_b = h3_calloc((size_t)(B ? B : 1), sizeof *ds->ad_b, H3_MEM_OTHER);
    ds->fwd_order = h3_calloc((size_t)(U ? U : 1), sizeof(int), H3_MEM_OTHER);
    ds->ad_order = h3_calloc((size_t)(B ? B : 1), sizeof(int), H3_MEM_OTHER);
    ds->tier = h3_calloc((size_t)(U ? U : 1), 1, H3_MEM_OTHER);
    if (!packs || !tier || !ds->unit_w || !ds->ad_w || !ds->ad_b || !ds->fwd_order || !ds->ad_order ||
        !ds->tier)
        H3_FAIL(H3_ERR_NOMEM, "out of memory");
    if (U) memcpy(ds->tier, plan->tier, (size_t)U);
    ds->n_slots = plan->n_slots;
    ds->slot_bytes = plan->slot_bytes;
    ds->chunk_rows = plan->chunk_rows;

    /* 1. Row chunks as planned; the non-block weights at the activation place. */
    H3_CHECK(h3_dit_device_check(dit));
    H3_CHECK(h3_dit_set_chunk_rows(dit, plan->chunk_rows));
    {
        h3_devcat prev = rep ? h3_memrep_set_category(rep, H3_DEVCAT_WEIGHTS) : H3_DEVCAT_WEIGHTS;
        up_ctx uc = {ds, H3_OK};
        h3_dit_visit_weights(dit, upload_global, &uc);
        if (rep) h3_memrep_set_category(rep, prev);
        H3_CHECK(uc.st);
    }
    /* 2. The units (packed blocks as planned, then each block's AdaLN projection: read once per run, never
     * pinned) and their residency. */
    const h3_st_set *set = h3_dit_files(dit);
    int64_t max_streamed = 0;
    for (int i = 0; i < ds->n_items; i++) {
        if (i < U) {
            h3_dit_pack_unit(dit, i, &packs[i]);
            tier[i] = plan->tier[i];
        } else {
            int pin;
            h3_dit_pack_adaln(dit, i - U, &packs[i]);
            h3_pack_segs(set, &packs[i], c->heads, c->head_dim, NULL, &pin);
            tier[i] = pin && place == H3_PLACE_DEVICE ? H3_TIER_PINNED : H3_TIER_DISK;
            if (packs[i].n < 2)
                H3_FAIL(H3_ERR_INTERNAL, "DiT stream: block %d has no AdaLN projection", i - U);
        }
        if (tier[i] != H3_TIER_RESIDENT && packs[i].bytes > max_streamed) max_streamed = packs[i].bytes;
    }
    if (max_streamed > plan->slot_bytes || (max_streamed && plan->n_slots < 1))
        H3_FAIL(H3_ERR_INVALID, "DiT stream: the plan's %d slots of %lld bytes cannot hold a %lld-byte block",
                plan->n_slots, (long long)plan->slot_bytes, (long long)max_streamed);
    {
        h3_units_config uc = {place,
                              tier,
                              plan->n_slots,
                              plan->slot_bytes,
                              set,
                              c->heads,
                              c->head_dim,
                              opts ? opts->spill_dir : NULL,
                              rep,
                              "the DiT's weights",
                              opts ? opts->unsafe_skip_waits : 0,
                              opts ? opts->pinned_cache : NULL};
        H3_CHECK(h3_units_open(ex, &uc, packs, ds->n_items, &ds->u));
    }
    /* 3. The resident units' views, once, with a LoRA merged into them (their device memory is theirs); the
     * streaming sequences. */
    for (int u = 0; u < U; u++) {
        if (tier[u] == H3_TIER_RESIDENT) {
            const h3_tensor *t;
            H3_CHECK(h3_units_acquire(ds->u, u, &t));
            H3_CHECK(build_unit_views(ds, u, t));
            h3_devcat prev = rep ? h3_memrep_set_category(rep, H3_DEVCAT_LORA) : H3_DEVCAT_LORA;
            st = h3_lora_apply_unit(dit, ex, u, &ds->unit_w[u], 1, 1);
            if (rep) h3_memrep_set_category(rep, prev);
            H3_CHECK(st);
        } else {
            ds->fwd_order[ds->n_fwd++] = u;
        }
    }
    for (int b = 0; b < B; b++) ds->ad_order[ds->n_ad++] = U + b;
    /* the LoRA's side path for streamed units and AdaLN projections, merged into the uploaded globals */
    {
        h3_devcat prev = rep ? h3_memrep_set_category(rep, H3_DEVCAT_LORA) : H3_DEVCAT_LORA;
        st = h3_lora_apply_rest(dit, ex);
        if (rep) h3_memrep_set_category(rep, prev);
        H3_CHECK_CTX(st, "applying the LoRA");
    }
    ds->src = (h3_dit_weight_source){src_acquire, src_release, src_adaln_acquire, src_adaln_release, 1, ds};
    H3_CHECK(h3_dit_set_weight_source(dit, &ds->src));
    h3_free(packs);
    h3_free(tier);
    *out = ds;
    return H3_OK;
done:
    h3_free(packs);
    h3_free(tier);
    h3_dit_stream_close(ds);
    return st;
}

h3_status h3_dit_stream_step_end(h3_dit_stream *ds) {
    return h3_units_sync(ds->u);
}

void h3_dit_stream_stats(const h3_dit_stream *ds, h3_stream_stats *out) {
    h3_units_stats(ds->u, out);
}

void h3_dit_stream_to_report(const h3_dit_stream *ds, h3_memrep *rep, double ceiling_gbs) {
    h3_stream_stats st;
    h3_units_stats(ds->u, &st);
    h3_memrep_set_copies(rep, st.bytes_copied - ds->base.bytes_copied, st.copy_ms - ds->base.copy_ms,
                         st.bytes_timed - ds->base.bytes_timed, ceiling_gbs);
}

int h3_dit_stream_items(const h3_dit *dit) {
    const h3_dit_config *c = h3_dit_get_config(dit);
    return h3_dit_n_units(c) + (int)c->n_layers;
}

h3_status h3_dit_stream_take_pinned(h3_dit_stream *ds, h3_pinned_cache *c) {
    return h3_units_take_pinned(ds->u, c);
}

int h3_dit_stream_matches(const h3_dit_stream *ds, const h3_dit_placement *pl) {
    return ds && pl && pl->tier && pl->n_units == ds->n_units && pl->n_slots == ds->n_slots &&
           pl->slot_bytes == ds->slot_bytes && pl->chunk_rows == ds->chunk_rows &&
           (!ds->n_units || !memcmp(pl->tier, ds->tier, (size_t)ds->n_units));
}

void h3_dit_stream_rebind(h3_dit_stream *ds, h3_memrep *rep) {
    h3_units_set_report(ds->u, rep);
    h3_units_stats(ds->u, &ds->base);
}

/* The DiT on a device budget: its non-block weights uploaded, its blocks resident or streamed through a ring
 * of device slots (mem/units.h) as a placement says, attached to the DiT as its weight source so the forward
 * runs unchanged. The placement is the planner's choice (src/pipeline/plan.h); docs/MEMORY.md has the whole
 * sequence; in short:
 *
 *     open the DiT with act_place DEVICE, weight_place HOST, stream_weights 1    (headers; weights mapped)
 *     h3_plan_make, then h3_plan_check               (stop here, before loading, when nothing fits)
 *     h3_cuda_init(&ex, 0, plan.budgets.vram)        (the arena is the budget)
 *     h3_dit_plan_placement(&plan.dit, &pl); h3_dit_stream_open(dit, &ex, &pl, NULL, rep, &ds)
 *                                                    (uploads, pins, slots: all of it, once)
 *     h3_dit_precompute_modulation(dit, &ex, all_t, n)     (AdaLN streamed once, kept on the device)
 *     per step: h3_dit_forward, then h3_dit_stream_step_end(ds)
 *     h3_dit_stream_close(ds), h3_dit_release_workspace, h3_dit_release_modulation   (memory returned)
 *
 * Every unit reaches the device packed (h3_dit_pack_unit): the official per-head interleaved QKV is reordered
 * into [Q; K; V] on the way (file reads land each head's rows where they belong), so the forward sees
 * contiguous QKV.
 */
#ifndef H3_MODELS_DIT_STREAM_H
#define H3_MODELS_DIT_STREAM_H

#include "mem/pack.h"
#include "mem/report.h"
#include "mem/streamer.h"
#include "models/dit.h"

/* ---- packing ------------------------------------------------------------------------------------------- */

#define H3_DIT_PACK_MAX H3_PACK_MAX
/* One streamed item laid out for a slot (mem/pack.h). */
typedef h3_pack h3_dit_pack;
/* Unit u (refiner blocks first): norm1, norm2, qkv (or q, k, v), q_norm, k_norm, out, fc1, fc2. */
void h3_dit_pack_unit(const h3_dit *dit, int unit, h3_dit_pack *out);
/* DiT block b's AdaLN projection: weight, bias. */
void h3_dit_pack_adaln(const h3_dit *dit, int block, h3_dit_pack *out);
/* The non-block weights that go to the device (patch projections, condition projection, time MLP, final
 * layer), each rounded to the arena's granule; the curve table and RoPE frequencies stay on the host. */
int64_t h3_dit_globals_device_bytes(const h3_dit *dit);

/* ---- the stage ----------------------------------------------------------------------------------------- */

typedef struct h3_dit_stream_opts {
    const char *spill_dir; /* DISK-tier units whose weights are not in a file (created in memory) are written
                            * to an unlinked file here first; NULL: $TMPDIR or /tmp */
    int unsafe_skip_waits; /* tests only: see h3_streamer_config */
    /* pinned copies kept from an earlier stream of this DiT (h3_dit_stream_take_pinned; h3_dit_stream_items
     * entries): the PINNED units adopt theirs instead of reading them again; the caller frees the rest */
    h3_pinned_cache *pinned_cache;
} h3_dit_stream_opts;

typedef struct h3_dit_stream h3_dit_stream;

/* Makes the plan real: chunk rows, non-block weights on the device, resident units uploaded, pinned copies of
 * the PINNED units (read from the files), the ring of slots; attaches itself to the DiT. The DiT must have
 * been opened (or created) with stream_weights. rep may be NULL; with it, device allocations are counted by
 * category. Everything the stage needs is allocated here: the step loop allocates nothing. */
/* Where the DiT's units live during its stage. */
typedef struct h3_dit_placement {
    int n_units;         /* refiner blocks, then DiT blocks (h3_dit_n_units) */
    const uint8_t *tier; /* [n_units] h3_tier of each */
    int n_slots;         /* ring depth */
    int64_t slot_bytes;  /* at least every streamed unit's and AdaLN projection's packed bytes */
    int64_t chunk_rows;  /* rows per FFN / fused-QKV chunk (h3_dit_set_chunk_rows) */
} h3_dit_placement;
h3_status h3_dit_stream_open(h3_dit *dit, h3_exec *ex, const h3_dit_placement *plan,
                             const h3_dit_stream_opts *opts, h3_memrep *rep, h3_dit_stream **out);
/* After each forward: waits for the streamer's queues and reports a failed read (H3_ERR_IO). */
h3_status h3_dit_stream_step_end(h3_dit_stream *ds);
void h3_dit_stream_stats(const h3_dit_stream *ds, h3_stream_stats *out);
/* Copies so far into the report: bytes, timed device milliseconds, against the pinned ceiling (GB/s, 0:
 * none). */
void h3_dit_stream_to_report(const h3_dit_stream *ds, h3_memrep *rep, double ceiling_gbs);
/* Entries of a pinned cache for dit's streams: its units, then each block's AdaLN projection. */
int h3_dit_stream_items(const h3_dit *dit);
/* Moves the stream's pinned copies into c (h3_dit_stream_items entries) once its queues are done; closing the
 * stream then leaves them, for a later stream of the same DiT (h3_dit_stream_opts.pinned_cache). */
h3_status h3_dit_stream_take_pinned(h3_dit_stream *ds, h3_pinned_cache *c);
/* Whether the stream was placed as pl says (the same tiers, slots, slot size and row chunk): a stream kept
 * placed after its stage serves a later stage whose plan places the DiT alike (h3_dit_stage_args.stream). */
int h3_dit_stream_matches(const h3_dit_stream *ds, const h3_dit_placement *pl);
/* A stream kept placed between stages: the report its allocations count in from now on (NULL: none; the
 * stage's report goes with its stage) and the start of its copy figures for the next stage's report. */
void h3_dit_stream_rebind(h3_dit_stream *ds, h3_memrep *rep);
/* Detaches from the DiT, frees the slots, resident units, pinned copies and staging, and puts the non-block
 * weights back where they were. With h3_dit_release_workspace and h3_dit_release_modulation, the DiT then
 * holds nothing on the device (the next stage gets the whole budget; the DiT may stream again later, into
 * another arena). */
void h3_dit_stream_close(h3_dit_stream *ds);

#endif

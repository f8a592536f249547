/* A model's weights as units: the one residency interface every model's forward reaches its weights through.
 *
 * A unit is the set of tensors one piece of a forward needs at once (a DiT block, one block's AdaLN
 * projection, a text-encoder layer, a ViT decoder block, a BigVGAN stage), described by a pack (mem/pack.h):
 * the tensors as the model opened them (views of the mapped files, or owned memory) laid out for one slot,
 * each with the dtype the forward takes it in. The forward acquires a unit, runs its ops on the returned
 * tensors, and releases it after the unit's last op is queued:
 *
 *     on the host (place HOST, no tiers): acquire returns the tensors as opened; nothing is copied, but for
 * tensors placed in another dtype than stored, converted once at open.
 *     on the device: every unit has a tier (mem/streamer.h). RESIDENT units are copied to the device once, at
 * open; PINNED units are copied per use from pinned host memory; DISK units are read per use from their files
 *     (or, for weights made in memory, from an unlinked spill file written at open) into pinned staging, then
 *     copied. Streamed units go through a ring of slots filled ahead of use (mem/streamer.h) in the order the
 *     caller names (h3_units_set_order), so copies hide behind compute.
 *
 * Conversion on arrival: a unit whose pack places some tensor in another dtype than stored (bf16 matrices
 * from an f32 file) travels as stored and is converted at the place. A resident unit is converted once, at
 * open: its tensors are read into host memory and copied, each converting tensor through a load buffer at the
 * place (the largest such tensor; freed before open returns) into the unit's own block, so the forward pays
 * nothing per acquire. A streamed unit is converted as it is acquired, from its slot into the set's one work
 * block (the largest placed unit that converts); its slot is released at once, so the next unit's copy runs
 * while this one computes. One converted streamed unit is held at a time.
 *
 * Everything is allocated at open; acquire and release never allocate and never wait on the host. The model
 * keeps its own knowledge (which tensors make a unit, how its forward uses them); this module knows no model.
 * Device memory by category (mem/report.h): resident units and the load buffer count as WEIGHTS, the ring and
 * the work block as SLOTS; h3_units_mem_of is that arithmetic, for planners.
 */
#ifndef H3_MEM_UNITS_H
#define H3_MEM_UNITS_H

#include <stdint.h>

#include "io/safetensors.h"
#include "mem/pack.h"
#include "mem/report.h"
#include "mem/streamer.h"

typedef struct h3_units_config {
    h3_place place;      /* HOST (with tier NULL: the tensors as opened) or DEVICE; HOST with tiers runs the
                          * streamer's synchronous emulation (tests) */
    const uint8_t *tier; /* [n] H3_TIER_* per unit; NULL: every unit RESIDENT (on the device) or as opened */
    int n_slots;         /* ring depth for streamed units (0 when none streams) */
    int64_t slot_bytes;  /* 0: the largest streamed unit */
    const h3_st_set
        *files; /* the mapped files the tensors may view (DISK units are read from them); may be NULL */
    int64_t heads,
        head_dim; /* fused QKV tensors packed `interleaved` are per-head [q k v] of head_dim rows */
    const char
        *spill_dir;   /* DISK units whose bytes are not in a file are spilled here; NULL: $TMPDIR or /tmp */
    h3_memrep *rep;   /* device allocations counted as resident weights / stream slots; may be NULL */
    const char *what; /* for messages: "the DiT's weights" */
    int unsafe_skip_waits; /* tests only: see h3_streamer_config */
    /* pinned copies kept from an earlier set over the same packs (h3_units_take_pinned), indexed by unit: a
     * PINNED unit adopts its copy (the entry is emptied); the caller frees the rest. NULL: none. */
    h3_pinned_cache *pinned_cache;
} h3_units_config;

typedef struct h3_units h3_units;

/* Makes the residency real: packs are copied (their source tensors must outlive the set). ex may be NULL for
 * a set on the host without tiers (its conversions run on this thread). On the device: the
 * quantized GEMMs' scratch when a pack is quantized, the resident units (loaded and converted through host
 * memory and the load buffer), then the spill file, the pinned copies, the ring and the work block. */
h3_status h3_units_open(h3_exec *ex, const h3_units_config *cfg, const h3_pack *packs, int n, h3_units **out);
/* The sequence in which streamed units will be acquired (see h3_streamer_set_order); resident units may be
 * named and are skipped. Nothing may be held. */
h3_status h3_units_set_order(h3_units *u, const int *order, int n, int cyclic);
/* Unit i's tensors at the set's place, in pack order, each in its placed dtype (a pack's interleaved QKV
 * arrives as [Q; K; V]): views valid until h3_units_release(i). One unit may be held at a time per slot, one
 * converted streamed unit at a time. A resident unit's memory may be written (synthetic weights). */
h3_status h3_units_acquire(h3_units *u, int i, const h3_tensor **tensors);
/* Work queued so far is the last that reads unit i. */
void h3_units_release(h3_units *u, int i);
/* Waits for the copy and read queues; H3_ERR_IO naming the file when a read failed. */
h3_status h3_units_sync(h3_units *u);
void h3_units_stats(const h3_units *u, h3_stream_stats *out);
/* Moves the pinned copies of the PINNED units into c (entry i for unit i; at least as many entries as units),
 * after everything queued is done; closing the set then leaves them. */
h3_status h3_units_take_pinned(h3_units *u, h3_pinned_cache *c);
/* The report later device allocations of the set count in (NULL: none), for a set that outlives the report
 * it was opened with. */
void h3_units_set_report(h3_units *u, h3_memrep *rep);
int h3_units_count(const h3_units *u);
h3_tier h3_units_tier(const h3_units *u, int i);
/* Waits for everything queued and frees all it allocated. NULL is fine. */
void h3_units_close(h3_units *u);

/* The slot a set of packs needs: the largest pack whose tier streams (tier NULL: all stream). */
int64_t h3_units_slot_bytes(const h3_pack *packs, int n, const uint8_t *tier);

/* What h3_units_open takes at a placed set's place (cfg's place, tiers, slots; each allocation rounded to
 * the arena's granule) and in pinned host memory, for planners: the same arithmetic it allocates with. The
 * packs may describe tensors without data (headers only); a source counts as pinned when its tensor's place
 * is PINNED. */
typedef struct h3_units_mem {
    int64_t resident; /* the resident units as placed */
    int64_t load;     /* the load buffer converting resident units pass through at open (freed after) */
    int64_t ring;     /* the slots of the streamed units */
    int64_t work;     /* the block streamed units that convert are converted into */
    int64_t backend;  /* the quantized GEMMs' scratch (device, some pack quantized) */
    int64_t peak;     /* backend + max(resident + load, resident + ring + work) */
    int64_t pinned;   /* pinned host bytes held until close: copies of PINNED units whose sources are not
                       * pinned, staging for DISK units */
} h3_units_mem;
void h3_units_mem_of(const h3_units_config *cfg, const h3_pack *packs, int n, h3_units_mem *out);

#endif

/* A model's weights as units: the one residency interface every model's forward reaches its weights through.
 *
 * A unit is the set of tensors one piece of a forward needs at once (a DiT block, one block's AdaLN
 * projection, a text-encoder layer, a ViT decoder block, a BigVGAN stage), described by a pack (mem/pack.h):
 * the tensors as the model opened them (views of the mapped files, or owned memory) laid out for one slot.
 * The forward acquires a unit, runs its ops on the returned tensors, and releases it after the unit's last op
 * is queued:
 *
 *     on the host (place HOST, no tiers): acquire returns the tensors as opened; nothing is copied.
 *     on the device: every unit has a tier (mem/streamer.h). RESIDENT units are copied to the device once, at
 * open; PINNED units are copied per use from pinned host memory; DISK units are read per use from their files
 *     (or, for weights made in memory, from an unlinked spill file written at open) into pinned staging, then
 *     copied. Streamed units go through a ring of slots filled ahead of use (mem/streamer.h) in the order the
 *     caller names (h3_units_set_order), so copies hide behind compute.
 *
 * Everything is allocated at open; acquire and release never allocate and never wait on the host. The model
 * keeps its own knowledge (which tensors make a unit, how its forward uses them); this module knows no model.
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
} h3_units_config;

typedef struct h3_units h3_units;

/* Makes the residency real: packs are copied (their source tensors must outlive the set). On the device: the
 * quantized GEMMs' scratch when a pack is quantized, the spill file, the pinned copies, the resident units
 * and the ring. */
h3_status h3_units_open(h3_exec *ex, const h3_units_config *cfg, const h3_pack *packs, int n, h3_units **out);
/* The sequence in which streamed units will be acquired (see h3_streamer_set_order); resident units may be
 * named and are skipped. Nothing may be held. */
h3_status h3_units_set_order(h3_units *u, const int *order, int n, int cyclic);
/* Unit i's tensors at the set's place, in pack order (a pack's interleaved QKV arrives as [Q; K; V]): views
 * valid until h3_units_release(i). One unit may be held at a time per slot. */
h3_status h3_units_acquire(h3_units *u, int i, const h3_tensor **tensors);
/* Work queued so far is the last that reads unit i. */
void h3_units_release(h3_units *u, int i);
/* Waits for the copy and read queues; H3_ERR_IO naming the file when a read failed. */
h3_status h3_units_sync(h3_units *u);
void h3_units_stats(const h3_units *u, h3_stream_stats *out);
int h3_units_count(const h3_units *u);
h3_tier h3_units_tier(const h3_units *u, int i);
/* Waits for everything queued and frees all it allocated. NULL is fine. */
void h3_units_close(h3_units *u);

/* The slot a set of packs needs: the largest pack whose tier streams (tier NULL: all stream). */
int64_t h3_units_slot_bytes(const h3_pack *packs, int n, const uint8_t *tier);

#endif

/* The block streamer: a ring of device slots filled ahead of use on the copy stream, so weight copies hide
 * behind compute.
 *
 * Items are byte ranges laid out for a slot (a DiT unit's packed weights, one block's AdaLN projection, a
 * text-encoder layer). Each has a tier (below): RESIDENT items are copied to their own device block once, at
 * creation; PINNED items are copied per use from pinned host memory (the item's sources when they are pinned
 * already, else a packed pinned copy made at creation: the pinned host cache); DISK items are read per use
 * from their sources (from a file, or memcpy from pageable memory) into a pinned staging buffer on a read
 * stream, then copied.
 *
 * Reads from files go in pieces of 8 MiB over the reading threads. A piece whose pages were all in the page
 * cache when its item's read began is copied from a mapping of the file the streamer makes at creation, and
 * left in the cache; any other piece is read with pread and, for DISK items, dropped from the page cache
 * again (the host budget does not count the page cache: a disk-tier read must not grow it, and must not empty
 * it of what it held before). bytes_cached in the stats counts what came from the cache. A file must not
 * shrink while a streamer reads it (as for any mapped weight file: a copy from a page the file no longer has
 * faults).
 *
 * Order: the caller names the sequence in which streamed items will be acquired (h3_streamer_set_order),
 * cyclic for a step loop. The streamer keeps up to n_slots items in flight: at start it fills every free
 * slot; each release frees a slot and at once queues the next item of the sequence into it. Events order
 * everything:
 *     copy into slot s:   the copy stream waits free[s] (the last compute release of s), copies, records
 *                         ready[s]
 *     acquire:            the compute stream waits ready[s]
 *     release:            the compute stream records free[s]
 *     DISK read into j:   the read stream waits staged_free[j] (the copy out of j), runs the read as a host
 *                         function, records staged[j]; the copy stream waits staged[j] before copying
 * so a slot is never overwritten before the compute that reads it is done, and never read before its copy
 * is. The host never waits (no allocation, no synchronization in acquire/release); an acquire out of
 * sequence resynchronizes (drops what was prefetched and refills from that item: correct, just slower), and
 * is counted.
 *
 * Without a device (place HOST, or a build without CUDA) the same logic runs synchronously on the host: slots
 * are host memory and a copy happens when it is queued. The CPU tests exercise the ordering, the tiers and
 * the reads that way; tests/test_streamer.c checks the device version on a GPU.
 */
#ifndef H3_MEM_STREAMER_H
#define H3_MEM_STREAMER_H

#include <stdint.h>

#include "mem/report.h"
#include "tensor/ops.h"

/* Where a weight unit lives during a stage. */
typedef enum h3_tier {
    H3_TIER_RESIDENT = 0, /* on the device for the whole stage */
    H3_TIER_PINNED,       /* streamed per use from pinned host memory */
    H3_TIER_DISK,         /* streamed per use from its file (or page cache) through pinned staging */
    H3_TIER_COUNT
} h3_tier;
#define H3_STREAM_STAGING 2 /* pinned staging buffers for reads from files */

/* Where an item's bytes come from: host memory (src), or a file (fd >= 0: pread at off). */
typedef struct h3_stream_seg {
    const void *src;
    int fd;
    int64_t off; /* file offset when fd >= 0 */
    int64_t bytes;
    int64_t dst; /* offset in the item's layout */
} h3_stream_seg;

typedef struct h3_stream_item {
    int64_t bytes;             /* the item's layout size (at most the slot size when streamed) */
    const h3_stream_seg *segs; /* copied by h3_streamer_create */
    int n_segs;
    h3_tier tier;
    int src_pinned; /* every host source is pinned memory: PINNED copies go straight from it */
} h3_stream_item;

typedef struct h3_streamer_config {
    h3_place place; /* DEVICE, or HOST for the synchronous emulation (PINNED: the same, its slots in pinned
                     * memory, for gathering what is then copied to a device) */
    int n_slots;    /* ring depth (0: nothing streams) */
    int64_t slot_bytes;
    int n_staging;  /* pinned staging buffers for DISK items (and for loading RESIDENT and PINNED copies from
                     * non-pinned sources); 0 when no item needs one */
    h3_memrep *rep; /* device allocations counted as resident weights / stream slots; may be NULL */
    int unsafe_skip_waits; /* tests only: queue copies and computes without the event waits (a test that must
                            * see corrupted reads proves it can detect them) */
    /* Pinned copies kept from an earlier streamer over the same items (h3_streamer_take_pinned), indexed as
     * the items: a PINNED item whose copy is there (of its bytes) adopts it instead of allocating and filling
     * one (the entry is set NULL); the caller frees what is left (h3_pinned_cache_free). NULL: none. */
    struct h3_pinned_cache *pinned_cache;
} h3_streamer_config;

/* Packed pinned copies of items (a streamer's PINNED tier) outliving their streamer: p[i] of bytes[i], NULL
 * where none. */
typedef struct h3_pinned_cache {
    int n;
    void **p;
    int64_t *bytes;
} h3_pinned_cache;
/* n entries, all empty. */
h3_status h3_pinned_cache_init(h3_pinned_cache *c, int n);
/* Frees every copy left and the arrays (pinned memory: while the backend that made it is up). */
void h3_pinned_cache_free(h3_pinned_cache *c);
/* Bytes of the copies it holds. */
int64_t h3_pinned_cache_bytes(const h3_pinned_cache *c);

typedef struct h3_stream_stats {
    int64_t acquires, copies, bytes_copied;
    int64_t reads, bytes_read; /* DISK items read into staging */
    int64_t bytes_cached;      /* of bytes_read: copied from the page cache (the file's pages were there) */
    int64_t resyncs;           /* acquires out of sequence */
    double copy_ms;            /* device time of the copies timed (bytes_timed of them) */
    int64_t bytes_timed;
    double read_s; /* wall time of the reads */
    int64_t resident_bytes, pinned_bytes, staging_bytes, slot_bytes;
    int64_t pinned_adopted; /* of pinned_bytes, copies adopted from an earlier streamer (not read again) */
} h3_stream_stats;

typedef struct h3_streamer h3_streamer;

/* Allocates the slots, staging, events, the pinned copies of PINNED items with non-pinned sources, and the
 * device copies of RESIDENT items (filled before it returns). Items are copied; their sources must outlive
 * the streamer. */
h3_status h3_streamer_create(h3_exec *ex, const h3_streamer_config *cfg, const h3_stream_item *items,
                             int n_items, h3_streamer **out);
/* The sequence of streamed items the next acquires follow (indices; RESIDENT items may not appear). cyclic:
 * after the last comes the first again (a step loop). Replaces the previous sequence; nothing may be held.
 * Fills the free slots with the first items. */
h3_status h3_streamer_set_order(h3_streamer *s, const int *items, int n, int cyclic);
/* The item's bytes at the streamer's place, usable by work queued on the compute stream from now on until
 * h3_streamer_release. */
h3_status h3_streamer_acquire(h3_streamer *s, int item, void **data);
/* Work queued on the compute stream so far is the last that reads the item: its slot is refilled after it. */
void h3_streamer_release(h3_streamer *s, int item);
/* Waits for the copy and read queues; H3_ERR_IO naming the file when a read failed. Harvests copy timings. */
h3_status h3_streamer_sync(h3_streamer *s);
void h3_streamer_get_stats(const h3_streamer *s, h3_stream_stats *out);
/* Waits for everything queued, then moves the pinned copies of PINNED items into c (entry i for item i; c has
 * at least n_items entries, the ones it fills empty); h3_streamer_free then leaves them. */
h3_status h3_streamer_take_pinned(h3_streamer *s, h3_pinned_cache *c);
/* Waits for everything queued, then frees all it allocated. */
void h3_streamer_free(h3_streamer *s);

#endif

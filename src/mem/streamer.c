/* The block streamer (streamer.h): ring of slots, copy and read queues ordered by events, pinned copies. */
#include "mem/streamer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/threads.h"
#include "cuda/cuda.h"

typedef struct read_job {
    struct h3_streamer *s;
    int item, buf;
} read_job;

/* A file the items read from (segments with fd >= 0), mapped once at creation where the kernel tells this
 * process which of the file's pages are cached (map; else NULL): a piece whose pages were all cached when its
 * item's read began is copied from the mapping and left in the cache; any other piece is read with pread and,
 * for the disk tier, dropped again (fill_piece). */
typedef struct stream_file {
    int fd;
    void *map;
    int64_t size;
} stream_file;

struct h3_streamer {
    h3_exec *ex;
    h3_streamer_config cfg;
    int dev; /* 1: device queues; 0: the synchronous host emulation */
    int n_items;
    h3_stream_item *items;
    h3_stream_seg *segs;
    void **pinned;   /* [n_items] packed pinned copies (PINNED items with non-pinned sources) */
    void **resident; /* [n_items] copies at the place (RESIDENT items) */
    void **slot;     /* [n_slots] */
    void **staging;  /* [n_staging] pinned, staging_bytes each */
    int64_t staging_bytes;
    h3_cuda_stream_h compute, copy, read;
    h3_cuda_event_h *ev_ready, *ev_free, *ev_staged, *ev_stfree;
    /* copy timings: a ring of start/end event pairs, harvested when done */
    int n_timing;
    h3_cuda_event_h *tm0, *tm1;
    int64_t *tm_bytes;
    uint8_t *tm_pending;
    int64_t tm_next;
    /* the sequence */
    int *order;
    int n_order, cyclic, next_issue, order_done;
    /* prefetched (issued, not yet acquired), in sequence order; free and held slots */
    int *fifo_item, *fifo_slot;
    int fifo_head, fifo_len;
    int *free_slot;
    int n_free;
    int *held_item, *held_slot;
    int n_held;
    int next_staging;
    read_job *jobs;     /* [n_items × n_staging]: immutable arguments of the read host functions */
    stream_file *files; /* [n_files]: the distinct fds of the segments */
    int n_files;
    uint8_t *cached_at; /* [the most pieces of an item]: fill_item's table (NULL when no file is mapped); the
                         * fills of one streamer never overlap (creation, then one read at a time) */
    h3_pool *rpool;     /* workers that gather items from host memory and files (H3_STREAM_READERS) */
    /* failures seen where no status can be returned (release, host functions) */
    pthread_mutex_t mu;
    int failed;
    h3_code fail_code;
    char fail_msg[512];
    h3_stream_stats st;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void set_failure(h3_streamer *s, h3_code code, const char *msg) {
    pthread_mutex_lock(&s->mu);
    if (!s->failed) {
        s->failed = 1;
        s->fail_code = code;
        snprintf(s->fail_msg, sizeof s->fail_msg, "%s", msg);
    }
    pthread_mutex_unlock(&s->mu);
}

static h3_status check_failure(h3_streamer *s) {
    pthread_mutex_lock(&s->mu);
    int f = s->failed;
    h3_code c = s->fail_code;
    char m[512];
    snprintf(m, sizeof m, "%s", s->fail_msg);
    pthread_mutex_unlock(&s->mu);
    return f ? H3_ERR(c, "weight streamer: %s", m) : H3_OK;
}

/* Pieces of at most FILL_PIECE bytes, spread over the read workers: several threads reach more of the
 * memory's bandwidth than one, and a disk serves several requests at once faster than one. */
#define FILL_PIECE ((int64_t)8 << 20)

static int64_t page_size(void) {
    const long p = sysconf(_SC_PAGESIZE);
    return p >= 4096 ? p : 4096;
}

/* 1 when every page of [off, off + len) of the mapped file is in the page cache. */
static int range_cached(const stream_file *f, int64_t off, int64_t len) {
    const int64_t page = page_size();
    if (!f->map || off < 0 || len <= 0 || off + len > f->size) return 0;
    const int64_t a = off / page * page, n = (off + len - a + page - 1) / page;
    unsigned char vec[(FILL_PIECE >> 12) + 2];
    if (n > (int64_t)sizeof vec || mincore((uint8_t *)f->map + a, (size_t)(n * page), vec) != 0) return 0;
    for (int64_t i = 0; i < n; i++)
        if (!(vec[i] & 1)) return 0;
    return 1;
}

/* One piece of an item: a range of one segment, at most FILL_PIECE bytes. */
typedef struct piece {
    const h3_stream_seg *g;
    const stream_file *f; /* the segment's file (NULL for a host source) */
    int64_t from, len;    /* within the segment */
} piece;

typedef struct {
    const h3_stream_item *it;
    const stream_file *files;
    int n_files;
    uint8_t *dst;
    int drop;
    uint8_t
        *cached_at; /* [pieces]: 1 where the piece was all in the page cache before any read of the item */
    pthread_mutex_t mu;
    int failed;
    int64_t cached;
    char err[256];
} fill_ctx;

/* Piece k of the item (pieces numbered segment after segment); 0 past the last. */
static int piece_at(const fill_ctx *c, int64_t k, piece *p) {
    for (int i = 0; i < c->it->n_segs; i++) {
        const h3_stream_seg *g = &c->it->segs[i];
        const int64_t np = (g->bytes + FILL_PIECE - 1) / FILL_PIECE;
        if (k >= np) {
            k -= np;
            continue;
        }
        p->g = g;
        p->f = NULL;
        for (int j = 0; g->fd >= 0 && j < c->n_files && !p->f; j++)
            if (c->files[j].fd == g->fd) p->f = &c->files[j];
        p->from = k * FILL_PIECE;
        p->len = g->bytes - p->from < FILL_PIECE ? g->bytes - p->from : FILL_PIECE;
        return 1;
    }
    return 0;
}

/* Whether a file piece is in the page cache (0 without a mapping: read it). */
static int piece_cached(const piece *p) {
    return p->f && range_cached(p->f, p->g->off + p->from, p->len);
}

/* Fills one piece: a memcpy from a host source, or from a file: copied from the file's mapping when every
 * page of the piece is in the page cache (cached = 1: nothing read, nothing dropped, the cache held it
 * already; the copy runs at memory speed where pread's per-page path out of the cache costs ~3x that), else
 * read with pread and, when drop is set, dropped from the page cache again. *ncached counts the bytes copied
 * from the cache. */
static int fill_piece(const piece *p, int cached, uint8_t *d, int drop, int64_t *ncached, char *err,
                      size_t errn) {
    const h3_stream_seg *g = p->g;
    uint8_t *to = d + g->dst + p->from;
    if (g->fd < 0) {
        memcpy(to, (const uint8_t *)g->src + p->from, (size_t)p->len);
        return 0;
    }
    if (cached) {
        memcpy(to, (const uint8_t *)p->f->map + g->off + p->from, (size_t)p->len);
        *ncached += p->len;
        return 0;
    }
    const int fd = g->fd;
    const int64_t off = g->off + p->from;
    int64_t done = 0;
    while (done < p->len) {
        ssize_t r = pread(fd, to + done, (size_t)(p->len - done), (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(err, errn, "reading %lld bytes at offset %lld of a weight file failed: %s",
                     (long long)p->len, (long long)off, r < 0 ? strerror(errno) : "the file is shorter");
            return -1;
        }
        done += r;
    }
#ifdef POSIX_FADV_DONTNEED
    if (drop) { /* the kernel drops whole pages only: round out, or the pages a piece boundary splits stay */
        const int64_t pg = page_size(), a = off / pg * pg, b = (off + p->len + pg - 1) / pg * pg;
        posix_fadvise(fd, (off_t)a, (off_t)(b - a), POSIX_FADV_DONTNEED);
    }
#else
    (void)drop;
#endif
    return 0;
}

/* Which pieces [begin, end) are in the page cache: taken for the whole item before any of it is read, since
 * the kernel's readahead for one piece brings in pages of the next ones, which would then look cached. */
static void probe_range(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    fill_ctx *c = arg;
    piece p;
    for (int64_t k = begin; k < end && piece_at(c, k, &p); k++) c->cached_at[k] = (uint8_t)piece_cached(&p);
}

static void fill_range(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    fill_ctx *c = arg;
    int64_t ncached = 0;
    piece p;
    for (int64_t k = begin; k < end && piece_at(c, k, &p); k++) {
        char e[256];
        if (fill_piece(&p, c->cached_at ? c->cached_at[k] : 0, c->dst, c->drop, &ncached, e, sizeof e)) {
            pthread_mutex_lock(&c->mu);
            if (!c->failed) snprintf(c->err, sizeof c->err, "%s", e);
            c->failed = 1;
            pthread_mutex_unlock(&c->mu);
        }
    }
    if (ncached) {
        pthread_mutex_lock(&c->mu);
        c->cached += ncached;
        pthread_mutex_unlock(&c->mu);
    }
}

/* Drops the item's file ranges read with pread once more, as runs of consecutive pieces: the kernel drops
 * only the folios that lie wholly inside a range, and a large folio across two pieces' boundary lies in
 * neither. */
static void drop_runs(const fill_ctx *c, int64_t pieces) {
#ifdef POSIX_FADV_DONTNEED
    const int64_t pg = page_size();
    int fd = -1;
    int64_t a = 0, b = 0; /* the run [a, b) of file fd */
    for (int64_t k = 0; k <= pieces; k++) {
        piece p;
        const int more = k < pieces && piece_at(c, k, &p);
        const int read = more && p.g->fd >= 0 && !(c->cached_at && c->cached_at[k]);
        const int64_t off = read ? p.g->off + p.from : 0;
        if (read && p.g->fd == fd && off == b) {
            b = off + p.len;
            continue;
        }
        if (fd >= 0)
            posix_fadvise(fd, (off_t)(a / pg * pg), (off_t)((b + pg - 1) / pg * pg - a / pg * pg),
                          POSIX_FADV_DONTNEED);
        fd = read ? p.g->fd : -1;
        a = off;
        b = read ? off + p.len : 0;
    }
#else
    (void)c, (void)pieces;
#endif
}

/* Gathers an item's bytes into dst (its layout): memcpy from host sources, from files' mappings where the
 * page cache holds the range, pread from files elsewhere, in pieces over the streamer's workers (none: this
 * thread). drop: tell the kernel a file range read with pread is not needed again (disk-tier reads must not
 * grow the page cache the host budget excludes; ranges the cache held before are left there). *cached (may be
 * NULL) gets the bytes copied from the cache. Runs on CUDA's callback thread for DISK reads: no CUDA and no
 * h3 error state here. */
static int fill_item(h3_streamer *s, const h3_stream_item *it, void *dst, int drop, int64_t *cached,
                     char *err, size_t errn) {
    int64_t pieces = 0;
    for (int i = 0; i < it->n_segs; i++) pieces += (it->segs[i].bytes + FILL_PIECE - 1) / FILL_PIECE;
    fill_ctx c;
    memset(&c, 0, sizeof c);
    c.it = it;
    c.files = s->files;
    c.n_files = s->n_files;
    c.dst = dst;
    c.drop = drop;
    c.cached_at = s->cached_at;
    pthread_mutex_init(&c.mu, NULL);
    h3_pool *pool = pieces > 1 ? s->rpool : NULL;
    if (c.cached_at) h3_parallel_for(pool, pieces, 1, probe_range, &c);
    h3_parallel_for(pool, pieces, 1, fill_range, &c);
    if (drop) drop_runs(&c, pieces);
    pthread_mutex_destroy(&c.mu);
    if (cached) *cached = c.cached;
    if (c.failed) snprintf(err, errn, "%s", c.err);
    return c.failed ? -1 : 0;
}

static void read_job_fn(void *arg) {
    read_job *j = arg;
    h3_streamer *s = j->s;
    const h3_stream_item *it = &s->items[j->item];
    char err[256];
    int64_t cached = 0;
    double t0 = now_s();
    int r = fill_item(s, it, s->staging[j->buf], it->tier == H3_TIER_DISK, &cached, err, sizeof err);
    double t1 = now_s();
    pthread_mutex_lock(&s->mu);
    s->st.reads++;
    s->st.bytes_read += it->bytes;
    s->st.bytes_cached += cached;
    s->st.read_s += t1 - t0;
    pthread_mutex_unlock(&s->mu);
    if (r) set_failure(s, H3_ERR_IO, err);
}

/* ---- timing -------------------------------------------------------------------------------------------- */

static void harvest(h3_streamer *s, int t, int wait) {
    if (!s->tm_pending[t]) return;
    if (!wait && !h3_cuda_event_done(s->tm1[t])) {
        s->tm_pending[t] = 0; /* dropped: not done yet and the entry is needed */
        return;
    }
    double ms = 0;
    if (h3_cuda_event_elapsed_ms(s->tm0[t], s->tm1[t], &ms) == H3_OK) {
        pthread_mutex_lock(&s->mu);
        s->st.copy_ms += ms;
        s->st.bytes_timed += s->tm_bytes[t];
        pthread_mutex_unlock(&s->mu);
    } else {
        h3_clear_error();
    }
    s->tm_pending[t] = 0;
}

/* ---- queueing a copy ----------------------------------------------------------------------------------- */

static h3_status issue(h3_streamer *s, int item, int slot) {
    const h3_stream_item *it = &s->items[item];
    uint8_t *dst = s->slot[slot];
    if (!s->dev) {
        if (s->pinned[item]) {
            memcpy(dst, s->pinned[item], (size_t)it->bytes);
        } else {
            char err[256];
            int64_t cached = 0;
            double t0 = now_s();
            if (fill_item(s, it, dst, it->tier == H3_TIER_DISK, &cached, err, sizeof err))
                return H3_ERR(H3_ERR_IO, "weight streamer: %s", err);
            if (it->tier == H3_TIER_DISK) {
                s->st.reads++;
                s->st.bytes_read += it->bytes;
                s->st.bytes_cached += cached;
                s->st.read_s += now_s() - t0;
            }
        }
        s->st.copies++;
        s->st.bytes_copied += it->bytes;
        return H3_OK;
    }
    int j = -1;
    if (it->tier == H3_TIER_DISK || (!s->pinned[item] && !it->src_pinned)) {
        if (s->cfg.n_staging < 1)
            return H3_ERR(H3_ERR_INTERNAL, "weight streamer: item %d needs staging and there is none", item);
        j = s->next_staging++ % s->cfg.n_staging;
        H3_TRY(h3_cuda_stream_wait(s->read, s->ev_stfree[j]));
        H3_TRY(h3_cuda_host_fn(s->read, read_job_fn, &s->jobs[item * s->cfg.n_staging + j]));
        H3_TRY(h3_cuda_event_record(s->ev_staged[j], s->read));
        H3_TRY(h3_cuda_stream_wait(s->copy, s->ev_staged[j]));
    }
    if (!s->cfg.unsafe_skip_waits) H3_TRY(h3_cuda_stream_wait(s->copy, s->ev_free[slot]));
    int t = (int)(s->tm_next++ % s->n_timing);
    harvest(s, t, 0);
    H3_TRY(h3_cuda_event_record(s->tm0[t], s->copy));
    if (j >= 0) {
        H3_TRY(h3_cuda_copy_h2d_async(dst, s->staging[j], (size_t)it->bytes, s->copy));
        H3_TRY(h3_cuda_event_record(s->ev_stfree[j], s->copy));
    } else if (s->pinned[item]) {
        H3_TRY(h3_cuda_copy_h2d_async(dst, s->pinned[item], (size_t)it->bytes, s->copy));
    } else {
        for (int i = 0; i < it->n_segs; i++)
            H3_TRY(h3_cuda_copy_h2d_async(dst + it->segs[i].dst, it->segs[i].src, (size_t)it->segs[i].bytes,
                                          s->copy));
    }
    H3_TRY(h3_cuda_event_record(s->tm1[t], s->copy));
    s->tm_bytes[t] = it->bytes;
    s->tm_pending[t] = 1;
    H3_TRY(h3_cuda_event_record(s->ev_ready[slot], s->copy));
    s->st.copies++;
    s->st.bytes_copied += it->bytes;
    return H3_OK;
}

/* Queues the next items of the sequence into every free slot. */
static h3_status issue_more(h3_streamer *s) {
    while (s->n_free > 0 && s->n_order > 0 && !s->order_done) {
        int item = s->order[s->next_issue];
        int slot = s->free_slot[--s->n_free];
        h3_status st = issue(s, item, slot);
        if (st != H3_OK) {
            s->free_slot[s->n_free++] = slot;
            return st;
        }
        int k = s->cfg.n_slots;
        s->fifo_item[(s->fifo_head + s->fifo_len) % k] = item;
        s->fifo_slot[(s->fifo_head + s->fifo_len) % k] = slot;
        s->fifo_len++;
        if (++s->next_issue == s->n_order) {
            s->next_issue = 0;
            if (!s->cyclic) s->order_done = 1;
        }
    }
    return H3_OK;
}

/* Forgets what was prefetched: its slots are free again. A later copy into such a slot is queued behind the
 * dropped one on the same copy stream, and no compute ever waited for it, so nothing can observe it. */
static void drop_prefetched(h3_streamer *s) {
    int k = s->cfg.n_slots;
    while (s->fifo_len > 0) {
        s->free_slot[s->n_free++] = s->fifo_slot[s->fifo_head];
        s->fifo_head = (s->fifo_head + 1) % k;
        s->fifo_len--;
    }
    s->fifo_head = 0;
}

h3_status h3_streamer_set_order(h3_streamer *s, const int *items, int n, int cyclic) {
    if (s->n_held)
        return H3_ERR(H3_ERR_INVALID, "weight streamer: the sequence cannot change while %d items are held",
                      s->n_held);
    if (n < 0 || n > s->n_items)
        return H3_ERR(H3_ERR_INVALID, "weight streamer: a sequence of %d items (the streamer has %d)", n,
                      s->n_items);
    if (n > 0 && s->cfg.n_slots < 1)
        return H3_ERR(H3_ERR_INVALID, "weight streamer: nothing can stream through a ring of 0 slots");
    for (int i = 0; i < n; i++) {
        if (items[i] < 0 || items[i] >= s->n_items)
            return H3_ERR(H3_ERR_INVALID, "weight streamer: item %d does not exist", items[i]);
        if (s->items[items[i]].tier == H3_TIER_RESIDENT)
            return H3_ERR(H3_ERR_INVALID, "weight streamer: item %d is resident, not streamed", items[i]);
    }
    drop_prefetched(s);
    if (n) memcpy(s->order, items, (size_t)n * sizeof *items);
    s->n_order = n;
    s->cyclic = cyclic;
    s->next_issue = 0;
    s->order_done = 0;
    return issue_more(s);
}

h3_status h3_streamer_acquire(h3_streamer *s, int item, void **data) {
    *data = NULL;
    if (item < 0 || item >= s->n_items)
        return H3_ERR(H3_ERR_INVALID, "weight streamer: item %d does not exist (%d items)", item, s->n_items);
    H3_TRY(check_failure(s));
    s->st.acquires++;
    if (s->items[item].tier == H3_TIER_RESIDENT) {
        *data = s->resident[item];
        return H3_OK;
    }
    if (s->fifo_len == 0 || s->fifo_item[s->fifo_head] != item) {
        /* Out of sequence: refill from this item. */
        int pos = -1;
        for (int i = 0; i < s->n_order && pos < 0; i++)
            if (s->order[i] == item) pos = i;
        if (pos < 0)
            return H3_ERR(H3_ERR_INVALID, "weight streamer: item %d is not in the streaming sequence", item);
        if (s->n_held)
            return H3_ERR(H3_ERR_INVALID,
                          "weight streamer: item %d was acquired out of sequence while %d others are held",
                          item, s->n_held);
        s->st.resyncs++;
        drop_prefetched(s);
        s->next_issue = pos;
        s->order_done = 0;
        H3_TRY(issue_more(s));
        if (s->fifo_len == 0 || s->fifo_item[s->fifo_head] != item)
            return H3_ERR(H3_ERR_INTERNAL, "weight streamer: item %d could not be queued", item);
    }
    int slot = s->fifo_slot[s->fifo_head];
    s->fifo_head = (s->fifo_head + 1) % s->cfg.n_slots;
    s->fifo_len--;
    s->held_item[s->n_held] = item;
    s->held_slot[s->n_held] = slot;
    s->n_held++;
    if (s->dev && !s->cfg.unsafe_skip_waits) {
        h3_status st = h3_cuda_stream_wait(s->compute, s->ev_ready[slot]);
        if (st != H3_OK) return st;
    }
    *data = s->slot[slot];
    return H3_OK;
}

void h3_streamer_release(h3_streamer *s, int item) {
    if (item < 0 || item >= s->n_items || s->items[item].tier == H3_TIER_RESIDENT) return;
    int h = -1;
    for (int i = 0; i < s->n_held && h < 0; i++)
        if (s->held_item[i] == item) h = i;
    if (h < 0) {
        set_failure(s, H3_ERR_INVALID, "an item was released that was not acquired");
        return;
    }
    int slot = s->held_slot[h];
    s->held_item[h] = s->held_item[s->n_held - 1];
    s->held_slot[h] = s->held_slot[s->n_held - 1];
    s->n_held--;
    if (s->dev && h3_cuda_event_record(s->ev_free[slot], s->compute) != H3_OK) {
        set_failure(s, H3_ERR_DEVICE, h3_last_error_message());
        return;
    }
    s->free_slot[s->n_free++] = slot;
    if (issue_more(s) != H3_OK) set_failure(s, (h3_code)h3_last_error_code(), h3_last_error_message());
}

h3_status h3_streamer_sync(h3_streamer *s) {
    if (s->dev) {
        if (s->read) H3_TRY(h3_cuda_stream_sync(s->read));
        H3_TRY(h3_cuda_stream_sync(s->copy));
        for (int t = 0; t < s->n_timing; t++) harvest(s, t, 1);
    }
    return check_failure(s);
}

void h3_streamer_get_stats(const h3_streamer *s, h3_stream_stats *out) {
    pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    *out = s->st;
    pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
}

/* ---- creation ------------------------------------------------------------------------------------------ */

static void *place_alloc(h3_streamer *s, h3_place pl, int64_t bytes, h3_mem_category cat) {
    (void)s;
    return h3_place_alloc(pl, (size_t)bytes, cat);
}

h3_status h3_pinned_cache_init(h3_pinned_cache *c, int n) {
    memset(c, 0, sizeof *c);
    const int m = n > 0 ? n : 1;
    c->p = h3_calloc((size_t)m, sizeof *c->p, H3_MEM_OTHER);
    c->bytes = h3_calloc((size_t)m, sizeof *c->bytes, H3_MEM_OTHER);
    if (!c->p || !c->bytes) {
        h3_pinned_cache_free(c);
        return H3_ERR(H3_ERR_NOMEM, "out of memory");
    }
    c->n = n > 0 ? n : 0;
    return H3_OK;
}

void h3_pinned_cache_free(h3_pinned_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++)
        if (c->p && c->p[i]) h3_place_free(H3_PLACE_PINNED, c->p[i], (size_t)c->bytes[i], H3_MEM_WEIGHTS);
    h3_free(c->p);
    h3_free(c->bytes);
    memset(c, 0, sizeof *c);
}

int64_t h3_pinned_cache_bytes(const h3_pinned_cache *c) {
    int64_t b = 0;
    for (int i = 0; c && i < c->n; i++)
        if (c->p[i]) b += c->bytes[i];
    return b;
}

h3_status h3_streamer_take_pinned(h3_streamer *s, h3_pinned_cache *c) {
    if (s->n_items > c->n) return H3_ERR(H3_ERR_INTERNAL, "a pinned cache of %d entries for %d items", c->n, s->n_items);
    H3_TRY(h3_streamer_sync(s));
    if (s->dev) {
        H3_TRY(h3_cuda_stream_sync(s->copy));
        H3_TRY(h3_cuda_stream_sync(s->compute));
    }
    for (int i = 0; i < s->n_items; i++) {
        if (!s->pinned[i] || c->p[i]) continue;
        c->p[i] = s->pinned[i];
        c->bytes[i] = s->items[i].bytes;
        s->pinned[i] = NULL;
        s->st.pinned_bytes -= s->items[i].bytes;
    }
    return H3_OK;
}

void h3_streamer_free(h3_streamer *s) {
    if (!s) return;
    if (s->dev) { /* a failure that led here keeps its message */
        h3_error_state kept;
        h3_error_save(&kept);
        h3_exec_sync(s->ex);
        if (s->read) h3_cuda_stream_sync(s->read);
        h3_cuda_stream_sync(s->copy);
        h3_error_restore(&kept);
    }
    const h3_place pl = s->cfg.place;
    for (int i = 0; s->items && i < s->n_items; i++) {
        if (s->resident && s->resident[i])
            h3_place_free(pl, s->resident[i], (size_t)s->items[i].bytes, H3_MEM_WEIGHTS);
        if (s->pinned && s->pinned[i])
            h3_place_free(H3_PLACE_PINNED, s->pinned[i], (size_t)s->items[i].bytes, H3_MEM_WEIGHTS);
    }
    for (int k = 0; s->slot && k < s->cfg.n_slots; k++)
        if (s->slot[k]) h3_place_free(pl, s->slot[k], (size_t)s->cfg.slot_bytes, H3_MEM_WEIGHTS);
    for (int j = 0; s->staging && j < s->cfg.n_staging; j++)
        if (s->staging[j])
            h3_place_free(H3_PLACE_PINNED, s->staging[j], (size_t)s->staging_bytes, H3_MEM_WORKSPACE);
    h3_cuda_event_h *evs[] = {s->ev_ready, s->ev_free, s->ev_staged, s->ev_stfree, s->tm0, s->tm1};
    int nev[] = {s->cfg.n_slots,   s->cfg.n_slots, s->cfg.n_staging,
                 s->cfg.n_staging, s->n_timing,    s->n_timing};
    for (int a = 0; a < 6; a++) {
        for (int i = 0; evs[a] && i < nev[a]; i++) h3_cuda_event_destroy(evs[a][i]);
        h3_free(evs[a]);
    }
    if (s->read) h3_cuda_stream_destroy(s->read);
    h3_pool_free(s->rpool);
    for (int i = 0; s->files && i < s->n_files; i++)
        if (s->files[i].map) munmap(s->files[i].map, (size_t)s->files[i].size);
    void *arrays[] = {s->items,     s->segs,       s->pinned, s->resident,  s->slot,      s->staging,
                      s->tm_bytes,  s->tm_pending, s->order,  s->fifo_item, s->fifo_slot, s->free_slot,
                      s->held_item, s->held_slot,  s->jobs,   s->files,     s->cached_at};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) h3_free(arrays[i]);
    pthread_mutex_destroy(&s->mu);
    h3_free(s);
}

/* Maps every file the segments read from, once each (stream_file), and sizes the table of which pieces of an
 * item are cached. Only where mincore tells the truth about the file's pages: Linux reports every page of a
 * file that this process neither owns nor may write as cached, which would turn disk reads into page faults
 * whose pages stay in the cache. Where it does not, or the file cannot be mapped, the file is read with pread
 * as before. */
static void map_file(stream_file *f) {
    struct stat sb;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", f->fd);
    if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0) return;
    if (sb.st_uid != geteuid() && geteuid() != 0 && faccessat(AT_FDCWD, proc, W_OK, AT_EACCESS) != 0) return;
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, f->fd, 0);
    if (p == MAP_FAILED) return;
    f->map = p;
    f->size = (int64_t)sb.st_size;
}

static h3_status map_files(h3_streamer *s) {
    int n = 0, mapped = 0;
    int64_t most = 0;
    for (int i = 0; i < s->n_items; i++) {
        int64_t pieces = 0;
        for (int g = 0; g < s->items[i].n_segs; g++) {
            n += s->items[i].segs[g].fd >= 0;
            pieces += (s->items[i].segs[g].bytes + FILL_PIECE - 1) / FILL_PIECE;
        }
        if (pieces > most) most = pieces;
    }
    if (!n) return H3_OK;
    s->files = h3_calloc((size_t)n, sizeof *s->files, H3_MEM_OTHER);
    if (!s->files) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->n_items; i++)
        for (int g = 0; g < s->items[i].n_segs; g++) {
            const int fd = s->items[i].segs[g].fd;
            int seen = fd < 0;
            for (int j = 0; j < s->n_files && !seen; j++) seen = s->files[j].fd == fd;
            if (seen) continue;
            stream_file *f = &s->files[s->n_files++];
            *f = (stream_file){fd, NULL, 0};
            map_file(f);
            mapped |= f->map != NULL;
        }
    if (mapped) {
        s->cached_at = h3_calloc((size_t)most, 1, H3_MEM_OTHER);
        if (!s->cached_at) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    }
    return H3_OK;
}

static h3_status make_events(h3_cuda_event_h **out, int n, int timing) {
    *out = h3_calloc((size_t)(n ? n : 1), sizeof **out, H3_MEM_OTHER);
    if (!*out) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) H3_TRY(h3_cuda_event_create(&(*out)[i], timing));
    return H3_OK;
}

/* Uploads a RESIDENT item: straight from pinned sources, else through staging buffer 0. */
static h3_status load_resident(h3_streamer *s, int i) {
    const h3_stream_item *it = &s->items[i];
    uint8_t *dst = s->resident[i];
    char err[256];
    if (!s->dev) {
        if (fill_item(s, it, dst, 0, NULL, err, sizeof err))
            return H3_ERR(H3_ERR_IO, "weight streamer: %s", err);
        return H3_OK;
    }
    if (it->src_pinned) {
        for (int g = 0; g < it->n_segs; g++)
            H3_TRY(h3_cuda_copy_h2d_async(dst + it->segs[g].dst, it->segs[g].src, (size_t)it->segs[g].bytes,
                                          s->copy));
        return H3_OK;
    }
    if (s->cfg.n_staging < 1)
        return H3_ERR(H3_ERR_INVALID,
                      "weight streamer: item %d is read from a file or pageable memory and there is "
                      "no staging buffer",
                      i);
    H3_TRY(h3_cuda_stream_sync(s->copy)); /* staging 0 is free again */
    if (fill_item(s, it, s->staging[0], 0, NULL, err, sizeof err))
        return H3_ERR(H3_ERR_IO, "weight streamer: %s", err);
    H3_TRY(h3_cuda_copy_h2d_async(dst, s->staging[0], (size_t)it->bytes, s->copy));
    return H3_OK;
}

h3_status h3_streamer_create(h3_exec *ex, const h3_streamer_config *cfg, const h3_stream_item *items,
                             int n_items, h3_streamer **out) {
    *out = NULL;
    if (n_items < 0 || cfg->n_slots < 0 || cfg->n_slots > 64 || cfg->n_staging < 0 || cfg->n_staging > 8)
        return H3_ERR(H3_ERR_INVALID, "weight streamer: %d items, %d slots, %d staging buffers", n_items,
                      cfg->n_slots, cfg->n_staging);
    if (cfg->place != H3_PLACE_DEVICE && cfg->place != H3_PLACE_HOST && cfg->place != H3_PLACE_PINNED)
        return H3_ERR(H3_ERR_INVALID, "weight streamer: slots live on the device (or the host, for tests)");
    int64_t nsegs = 0;
    for (int i = 0; i < n_items; i++) {
        const h3_stream_item *it = &items[i];
        if (it->bytes < 0 || it->n_segs < 0 || (it->n_segs && !it->segs) ||
            (unsigned)it->tier >= H3_TIER_COUNT)
            return H3_ERR(H3_ERR_INVALID, "weight streamer: item %d is malformed", i);
        if (it->tier != H3_TIER_RESIDENT && it->bytes > cfg->slot_bytes)
            return H3_ERR(H3_ERR_INVALID, "weight streamer: item %d has %lld bytes, more than a slot's %lld",
                          i, (long long)it->bytes, (long long)cfg->slot_bytes);
        for (int g = 0; g < it->n_segs; g++) {
            const h3_stream_seg *sg = &it->segs[g];
            if (sg->bytes < 0 || sg->dst < 0 || sg->dst + sg->bytes > it->bytes ||
                (sg->fd < 0 && !sg->src && sg->bytes))
                return H3_ERR(H3_ERR_INVALID, "weight streamer: segment %d of item %d lies outside the item",
                              g, i);
        }
        nsegs += it->n_segs;
    }
    h3_status st = H3_OK;
    h3_streamer *s = h3_calloc(1, sizeof *s, H3_MEM_OTHER);
    if (!s) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    s->ex = ex;
    s->cfg = *cfg;
    s->dev = cfg->place == H3_PLACE_DEVICE;
    s->n_items = n_items;
    const int k = cfg->n_slots, ns = cfg->n_staging, ni = n_items ? n_items : 1;
    s->n_timing = 2 * (k + n_items) + 2;
    int gathers =
        0; /* some item is gathered by the host (memcpy or read) rather than copied from pinned memory */
    for (int i = 0; i < n_items; i++) gathers |= !items[i].src_pinned;
    if (gathers) { /* the gathering workers: H3_STREAM_READERS of them, else up to 8 */
        int nr = h3_cpu_count() < 8 ? h3_cpu_count() : 8;
        const char *e = getenv("H3_STREAM_READERS");
        if (e && atoi(e) > 0) nr = atoi(e) < 64 ? atoi(e) : 64;
        if (nr > 1 && h3_pool_create(nr, &s->rpool) != H3_OK) {
            st = h3_error_wrap(H3_ERR_NOMEM, "starting %d weight-reading threads", nr);
            goto done;
        }
    }
    s->items = h3_calloc((size_t)ni, sizeof *s->items, H3_MEM_OTHER);
    s->segs = h3_calloc((size_t)(nsegs ? nsegs : 1), sizeof *s->segs, H3_MEM_OTHER);
    s->pinned = h3_calloc((size_t)ni, sizeof *s->pinned, H3_MEM_OTHER);
    s->resident = h3_calloc((size_t)ni, sizeof *s->resident, H3_MEM_OTHER);
    s->slot = h3_calloc((size_t)(k ? k : 1), sizeof *s->slot, H3_MEM_OTHER);
    s->staging = h3_calloc((size_t)(ns ? ns : 1), sizeof *s->staging, H3_MEM_OTHER);
    s->tm_bytes = h3_calloc((size_t)s->n_timing, sizeof *s->tm_bytes, H3_MEM_OTHER);
    s->tm_pending = h3_calloc((size_t)s->n_timing, 1, H3_MEM_OTHER);
    s->order = h3_calloc((size_t)ni, sizeof *s->order, H3_MEM_OTHER);
    s->fifo_item = h3_calloc((size_t)(k ? k : 1), sizeof(int), H3_MEM_OTHER);
    s->fifo_slot = h3_calloc((size_t)(k ? k : 1), sizeof(int), H3_MEM_OTHER);
    s->free_slot = h3_calloc((size_t)(k ? k : 1), sizeof(int), H3_MEM_OTHER);
    s->held_item = h3_calloc((size_t)(k ? k : 1), sizeof(int), H3_MEM_OTHER);
    s->held_slot = h3_calloc((size_t)(k ? k : 1), sizeof(int), H3_MEM_OTHER);
    s->jobs = h3_calloc((size_t)(ni * (ns ? ns : 1)), sizeof *s->jobs, H3_MEM_OTHER);
    if (!s->items || !s->segs || !s->pinned || !s->resident || !s->slot || !s->staging || !s->tm_bytes ||
        !s->tm_pending || !s->order || !s->fifo_item || !s->fifo_slot || !s->free_slot || !s->held_item ||
        !s->held_slot || !s->jobs)
        H3_FAIL(H3_ERR_NOMEM, "out of memory");
    {
        int64_t o = 0;
        for (int i = 0; i < n_items; i++) {
            s->items[i] = items[i];
            if (items[i].n_segs)
                memcpy(s->segs + o, items[i].segs, (size_t)items[i].n_segs * sizeof *s->segs);
            s->items[i].segs = s->segs + o;
            o += items[i].n_segs;
            for (int j = 0; j < ns; j++) s->jobs[i * ns + j] = (read_job){s, i, j};
        }
    }
    H3_CHECK(map_files(s));
    if (s->dev) {
        s->compute = h3_cuda_compute_stream(ex);
        s->copy = h3_cuda_copy_stream(ex);
        if (!s->compute || !s->copy)
            H3_FAIL(H3_ERR_UNSUPPORTED, "weight streamer: the device place needs an exec with a CUDA device");
        H3_CHECK(make_events(&s->ev_ready, k, 0));
        H3_CHECK(make_events(&s->ev_free, k, 0));
        H3_CHECK(make_events(&s->ev_staged, ns, 0));
        H3_CHECK(make_events(&s->ev_stfree, ns, 0));
        H3_CHECK(make_events(&s->tm0, s->n_timing, 1));
        H3_CHECK(make_events(&s->tm1, s->n_timing, 1));
        if (ns) H3_CHECK(h3_cuda_stream_create(&s->read));
    }
    /* Pinned staging first (host), then the device: resident items, then the slots. Staging holds any item
     * that passes through it: streamed ones (at most a slot) and resident ones loaded from non-pinned
     * sources. */
    s->staging_bytes = cfg->slot_bytes;
    for (int i = 0; i < n_items; i++)
        if (!s->items[i].src_pinned && s->items[i].bytes > s->staging_bytes)
            s->staging_bytes = s->items[i].bytes;
    for (int j = 0; j < ns; j++) {
        s->staging[j] = place_alloc(s, H3_PLACE_PINNED, s->staging_bytes, H3_MEM_WORKSPACE);
        if (!s->staging[j])
            H3_FAIL(h3_last_error_code() ? h3_last_error_code() : H3_ERR_NOMEM,
                    "out of pinned memory for a %lld-byte staging buffer", (long long)s->staging_bytes);
        s->st.staging_bytes += s->staging_bytes;
    }
    for (int i = 0; i < n_items; i++) {
        const h3_stream_item *it = &s->items[i];
        if (it->tier != H3_TIER_PINNED || (it->src_pinned && s->dev)) continue;
        h3_pinned_cache *pc = cfg->pinned_cache;
        if (pc && i < pc->n && pc->p[i] && pc->bytes[i] == it->bytes) { /* kept from an earlier streamer */
            s->pinned[i] = pc->p[i];
            pc->p[i] = NULL;
            pc->bytes[i] = 0;
            s->st.pinned_bytes += it->bytes;
            s->st.pinned_adopted += it->bytes;
            continue;
        }
        /* the pinned host cache: a packed copy, filled once */
        s->pinned[i] = place_alloc(s, H3_PLACE_PINNED, it->bytes, H3_MEM_WEIGHTS);
        if (!s->pinned[i])
            H3_FAIL(H3_ERR_NOMEM, "out of pinned memory for a %lld-byte weight block", (long long)it->bytes);
        char err[256];
        if (fill_item(s, it, s->pinned[i], 0, NULL, err, sizeof err))
            H3_FAIL(H3_ERR_IO, "weight streamer: %s", err);
        s->st.pinned_bytes += it->bytes;
    }
    {
        h3_devcat prev = cfg->rep ? h3_memrep_set_category(cfg->rep, H3_DEVCAT_WEIGHTS) : H3_DEVCAT_WEIGHTS;
        for (int i = 0; i < n_items && st == H3_OK; i++) {
            if (s->items[i].tier != H3_TIER_RESIDENT) continue;
            s->resident[i] = place_alloc(s, cfg->place, s->items[i].bytes, H3_MEM_WEIGHTS);
            if (!s->resident[i]) {
                st = h3_error_wrap(h3_last_error_code() ? h3_last_error_code() : H3_ERR_NOMEM,
                                   "weight streamer: a resident block of %lld bytes",
                                   (long long)s->items[i].bytes);
                break;
            }
            st = load_resident(s, i);
            s->st.resident_bytes += s->items[i].bytes;
        }
        if (cfg->rep) h3_memrep_set_category(cfg->rep, H3_DEVCAT_SLOTS);
        for (int j = 0; j < k && st == H3_OK; j++) {
            s->slot[j] = place_alloc(s, cfg->place, cfg->slot_bytes, H3_MEM_WEIGHTS);
            if (!s->slot[j])
                st = h3_error_wrap(h3_last_error_code() ? h3_last_error_code() : H3_ERR_NOMEM,
                                   "weight streamer: stream slot %d of %lld bytes", j,
                                   (long long)cfg->slot_bytes);
            else
                s->st.slot_bytes += cfg->slot_bytes;
        }
        if (cfg->rep) h3_memrep_set_category(cfg->rep, prev);
        if (st != H3_OK) goto done;
        if (s->dev) H3_CHECK(h3_cuda_stream_sync(s->copy));
    }
    for (int j = 0; j < k; j++) s->free_slot[j] = k - 1 - j; /* slot 0 is taken first */
    s->n_free = k;
    *out = s;
    return H3_OK;
done:
    h3_streamer_free(s);
    return st;
}

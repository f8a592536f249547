/* Units (units.h): packs, their stream items and spill file, the streamer, the views handed to a forward. */
#include "mem/units.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "cuda/cuda.h"

struct h3_units {
    h3_exec *ex;
    h3_units_config cfg;
    int n;
    int passthrough;  /* host, no tiers: the tensors as opened */
    h3_pack *packs;   /* [n] */
    uint8_t *tier;    /* [n] */
    h3_tensor *views; /* [n × H3_PACK_MAX] */
    h3_stream_seg *segs;
    h3_stream_item *items;
    h3_stream_seg *spill_segs; /* [n] */
    int spill_fd;
    h3_streamer *s;
};

int64_t h3_units_slot_bytes(const h3_pack *packs, int n, const uint8_t *tier) {
    int64_t m = 0;
    for (int i = 0; i < n; i++)
        if ((!tier || tier[i] != H3_TIER_RESIDENT) && packs[i].bytes > m) m = packs[i].bytes;
    return m;
}

static int item_in_file(const h3_stream_item *it) {
    int file = it->n_segs > 0;
    for (int g = 0; g < it->n_segs; g++) file &= it->segs[g].fd >= 0;
    return file;
}

/* Writes the DISK items whose bytes are not in a file to an unlinked spill file and points them at it. */
static h3_status spill(h3_units *u) {
    int need = 0;
    for (int i = 0; i < u->n; i++) need |= u->items[i].tier == H3_TIER_DISK && !item_in_file(&u->items[i]);
    if (!need) return H3_OK;
    const char *dir = u->cfg.spill_dir;
    if (!dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    char path[1024];
    snprintf(path, sizeof path, "%s/h3run-spill-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0)
        return H3_ERR(H3_ERR_IO, "cannot create a spill file in %s for disk-tier weights: %s", dir,
                      strerror(errno));
    unlink(path);
    u->spill_fd = fd;
    int64_t off = 0;
    for (int i = 0; i < u->n; i++) {
        h3_stream_item *it = &u->items[i];
        if (it->tier != H3_TIER_DISK || item_in_file(it)) continue;
        uint8_t *buf = h3_malloc((size_t)it->bytes, H3_MEM_IO);
        if (!buf)
            return H3_ERR(H3_ERR_NOMEM, "out of memory for a %lld-byte spill buffer", (long long)it->bytes);
        memset(buf, 0, (size_t)it->bytes);
        for (int g = 0; g < it->n_segs; g++)
            memcpy(buf + it->segs[g].dst, it->segs[g].src, (size_t)it->segs[g].bytes);
        int64_t done = 0;
        while (done < it->bytes) {
            ssize_t w = pwrite(fd, buf + done, (size_t)(it->bytes - done), (off_t)(off + done));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                h3_free(buf);
                return H3_ERR(H3_ERR_IO, "writing %lld bytes of disk-tier weights to %s failed: %s",
                              (long long)it->bytes, dir, w < 0 ? strerror(errno) : "no space");
            }
            done += w;
        }
        h3_free(buf);
        u->spill_segs[i] = (h3_stream_seg){NULL, fd, off, it->bytes, 0};
        it->segs = &u->spill_segs[i];
        it->n_segs = 1;
        it->src_pinned = 0;
        off += it->bytes;
    }
    if (fsync(fd) != 0 && errno != EINVAL)
        return H3_ERR(H3_ERR_IO, "syncing the spill file failed: %s", strerror(errno));
#ifdef POSIX_FADV_DONTNEED
    posix_fadvise(fd, 0, (off_t)off, POSIX_FADV_DONTNEED); /* reads come from the disk, as planned */
#endif
    return H3_OK;
}

static void build_views(h3_units *u, int i, void *base) {
    const h3_pack *p = &u->packs[i];
    h3_tensor *v = u->views + (int64_t)i * H3_PACK_MAX;
    for (int k = 0; k < p->n; k++) h3_pack_view(p, k, base, u->cfg.place, &v[k]);
}

void h3_units_close(h3_units *u) {
    if (!u) return;
    if (u->s) {
        h3_streamer_free(u->s);
        h3_exec_sync(u->ex);
        h3_clear_error();
    }
    if (u->spill_fd >= 0) close(u->spill_fd);
    h3_free(u->packs);
    h3_free(u->tier);
    h3_free(u->views);
    h3_free(u->segs);
    h3_free(u->items);
    h3_free(u->spill_segs);
    h3_free(u);
}

h3_status h3_units_open(h3_exec *ex, const h3_units_config *cfg, const h3_pack *packs, int n,
                        h3_units **out) {
    *out = NULL;
    const char *what = cfg->what ? cfg->what : "weights";
    if (n < 0 || (n > 0 && !packs)) return H3_ERR(H3_ERR_INVALID, "%s: %d units", what, n);
    if (cfg->place != H3_PLACE_HOST && cfg->place != H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID, "%s: units live on the host or the device", what);
    if (cfg->tier)
        for (int i = 0; i < n; i++)
            if (cfg->tier[i] >= H3_TIER_COUNT)
                return H3_ERR(H3_ERR_INVALID, "%s: unit %d has no tier", what, i);
    h3_status st = H3_OK;
    h3_units *u = h3_calloc(1, sizeof *u, H3_MEM_OTHER);
    if (!u) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    const int N = n ? n : 1;
    u->ex = ex;
    u->cfg = *cfg;
    u->cfg.tier = NULL;
    u->n = n;
    u->spill_fd = -1;
    u->passthrough = cfg->place == H3_PLACE_HOST && !cfg->tier;
    u->packs = h3_calloc((size_t)N, sizeof *u->packs, H3_MEM_OTHER);
    u->tier = h3_calloc((size_t)N, 1, H3_MEM_OTHER);
    u->views = h3_calloc((size_t)N * H3_PACK_MAX, sizeof *u->views, H3_MEM_OTHER);
    if (!u->packs || !u->tier || !u->views) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    memcpy(u->packs, packs, (size_t)n * sizeof *packs);
    for (int i = 0; i < n; i++) u->tier[i] = cfg->tier ? cfg->tier[i] : H3_TIER_RESIDENT;
    if (u->passthrough) {
        for (int i = 0; i < n; i++)
            for (int k = 0; k < u->packs[i].n; k++)
                u->views[(int64_t)i * H3_PACK_MAX + k] = *u->packs[i].src[k];
        *out = u;
        return H3_OK;
    }
    /* the items: packed layouts and their sources */
    int64_t nsegs = 0, slot = cfg->slot_bytes;
    int quantized = 0, streamed = 0;
    for (int i = 0; i < n; i++) {
        int pin;
        nsegs += h3_pack_segs(cfg->files, &u->packs[i], cfg->heads, cfg->head_dim, NULL, &pin);
        quantized |= u->packs[i].quantized;
        streamed |= u->tier[i] != H3_TIER_RESIDENT;
    }
    if (!slot) slot = h3_units_slot_bytes(u->packs, n, u->tier);
    if (streamed && cfg->n_slots < 1)
        H3_FAIL(H3_ERR_INVALID, "%s: units stream but the ring has no slot", what);
    u->segs = h3_calloc((size_t)(nsegs ? nsegs : 1), sizeof *u->segs, H3_MEM_OTHER);
    u->items = h3_calloc((size_t)N, sizeof *u->items, H3_MEM_OTHER);
    u->spill_segs = h3_calloc((size_t)N, sizeof *u->spill_segs, H3_MEM_OTHER);
    if (!u->segs || !u->items || !u->spill_segs) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    int need_staging = 0;
    for (int64_t i = 0, o = 0; i < n; i++) {
        h3_stream_item *it = &u->items[i];
        int pin;
        it->segs = u->segs + o;
        it->n_segs = h3_pack_segs(cfg->files, &u->packs[i], cfg->heads, cfg->head_dim, u->segs + o, &pin);
        o += it->n_segs;
        it->bytes = u->packs[i].bytes;
        it->tier = (h3_tier)u->tier[i];
        it->src_pinned = pin && cfg->place == H3_PLACE_DEVICE;
        if (it->tier != H3_TIER_RESIDENT && it->bytes > slot)
            H3_FAIL(H3_ERR_INVALID, "%s: unit %lld has %lld bytes, more than a slot's %lld", what,
                    (long long)i, (long long)it->bytes, (long long)slot);
        if (it->tier == H3_TIER_DISK || !it->src_pinned) need_staging = 1;
    }
    if (quantized && cfg->place == H3_PLACE_DEVICE) {
        h3_devcat prev = cfg->rep ? h3_memrep_set_category(cfg->rep, H3_DEVCAT_BACKEND) : H3_DEVCAT_BACKEND;
        h3_status qs = h3_cuda_qgemm_reserve(ex);
        if (cfg->rep) h3_memrep_set_category(cfg->rep, prev);
        H3_CHECK(qs);
    }
    H3_CHECK(spill(u));
    {
        h3_streamer_config sc = {cfg->place,
                                 streamed ? cfg->n_slots : 0,
                                 streamed ? slot : 0,
                                 need_staging ? H3_STREAM_STAGING : 0,
                                 cfg->rep,
                                 cfg->unsafe_skip_waits};
        H3_CHECK_CTX(h3_streamer_create(ex, &sc, u->items, n, &u->s), "loading %s", what);
    }
    for (int i = 0; i < n; i++)
        if (u->tier[i] == H3_TIER_RESIDENT) {
            void *base;
            H3_CHECK(h3_streamer_acquire(u->s, i, &base));
            build_views(u, i, base);
        }
    *out = u;
    return H3_OK;
done:
    h3_units_close(u);
    return st;
}

h3_status h3_units_set_order(h3_units *u, const int *order, int n, int cyclic) {
    if (u->passthrough) return H3_OK;
    int *seq = h3_calloc((size_t)(n > 0 ? n : 1), sizeof *seq, H3_MEM_OTHER);
    if (!seq) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (order[i] < 0 || order[i] >= u->n) {
            h3_free(seq);
            return H3_ERR(H3_ERR_INVALID, "%s: unit %d does not exist (%d units)",
                          u->cfg.what ? u->cfg.what : "weights", order[i], u->n);
        }
        if (u->tier[order[i]] != H3_TIER_RESIDENT) seq[m++] = order[i];
    }
    h3_status st = h3_streamer_set_order(u->s, seq, m, cyclic);
    h3_free(seq);
    return st;
}

h3_status h3_units_acquire(h3_units *u, int i, const h3_tensor **tensors) {
    *tensors = NULL;
    if (i < 0 || i >= u->n)
        return H3_ERR(H3_ERR_INVALID, "%s: unit %d does not exist (%d units)",
                      u->cfg.what ? u->cfg.what : "weights", i, u->n);
    if (!u->passthrough) {
        void *base;
        H3_TRY(h3_streamer_acquire(u->s, i, &base));
        if (u->tier[i] != H3_TIER_RESIDENT) build_views(u, i, base);
    }
    *tensors = u->views + (int64_t)i * H3_PACK_MAX;
    return H3_OK;
}

void h3_units_release(h3_units *u, int i) {
    if (!u->passthrough && i >= 0 && i < u->n) h3_streamer_release(u->s, i);
}

h3_status h3_units_sync(h3_units *u) {
    return u->passthrough ? H3_OK : h3_streamer_sync(u->s);
}

void h3_units_stats(const h3_units *u, h3_stream_stats *out) {
    if (u->passthrough) {
        memset(out, 0, sizeof *out);
        return;
    }
    h3_streamer_get_stats(u->s, out);
}

int h3_units_count(const h3_units *u) {
    return u->n;
}

h3_tier h3_units_tier(const h3_units *u, int i) {
    return i >= 0 && i < u->n ? (h3_tier)u->tier[i] : H3_TIER_RESIDENT;
}

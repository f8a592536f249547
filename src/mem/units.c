/* Units (units.h): packs, their stream items and spill file, resident units loaded (and converted) at open,
 * the streamer of the streamed ones, the views handed to a forward. */
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
    int64_t *vstart;  /* [n + 1]: unit i's views are views[vstart[i] .. vstart[i+1]) */
    h3_tensor *views; /* the tensors handed out */
    h3_tensor *conv;  /* passthrough: converted copies (owned) where a tensor is placed in another dtype */
    uint8_t **block;  /* [n] resident units as placed, at the place */
    int *sidx;        /* [n] the streamer's item of a streamed unit; -1 for a resident one */
    h3_stream_seg *segs;
    h3_stream_item *items;     /* [n] every unit's stored layout and its sources */
    h3_stream_seg *spill_segs; /* [n] */
    int spill_fd;
    h3_streamer *s; /* the streamed units; NULL when none streams */
    uint8_t *work;  /* the block converted streamed units are converted into */
    int64_t work_bytes, resident_bytes;
    int work_held; /* the unit converted into the work block and not yet released; -1: none */
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

/* Allocates bytes at the set's place, counted under category c of the report. */
static void *place_alloc(h3_units *u, int64_t bytes, h3_devcat c) {
    h3_memrep *rep = u->cfg.rep;
    h3_devcat prev = rep ? h3_memrep_set_category(rep, c) : c;
    void *p = h3_place_alloc(u->cfg.place, (size_t)bytes, H3_MEM_WEIGHTS);
    if (rep) h3_memrep_set_category(rep, prev);
    return p;
}

/* n bytes from src (at place sp) to dst (at place dp), in copies of at most 1 GiB (a row's pitch limit). */
static h3_status copy_bytes(h3_exec *ex, void *dst, h3_place dp, const void *src, h3_place sp, int64_t n) {
    for (int64_t o = 0; o < n; o += (int64_t)1 << 30) {
        int64_t m = n - o < ((int64_t)1 << 30) ? n - o : (int64_t)1 << 30;
        h3_tensor a, b;
        h3_tensor_wrap(&a, (uint8_t *)src + o, sp, H3_U8, 1, &m);
        h3_tensor_wrap(&b, (uint8_t *)dst + o, dp, H3_U8, 1, &m);
        H3_TRY(h3_copy(ex, &b, &a));
    }
    return H3_OK;
}

/* Converts unit i from its stored layout at src (at place sp) into its placed layout at dst (the set's
 * place): tensors placed as stored are copied with their side data; the others are copied to `stage` (at the
 * place; NULL when src is there already) and converted from there. */
static h3_status convert_unit(h3_units *u, int i, const uint8_t *src, h3_place sp, uint8_t *stage,
                              uint8_t *dst) {
    const h3_pack *p = &u->packs[i];
    const h3_place pl = u->cfg.place;
    for (int k = 0; k < p->n; k++) {
        const h3_tensor *t = p->src[k];
        if (t->q.mode != H3_SCALE_NONE || p->as[k] == t->dtype) { /* as stored: the bytes, side data too */
            H3_TRY(copy_bytes(u->ex, dst + p->poff[k], pl, src + p->off[k], sp, p->psize[k]));
            continue;
        }
        h3_tensor sv, pv;
        h3_pack_view(p, k, (void *)src, sp, &sv);
        if (stage) {
            h3_tensor lv = sv;
            lv.data = stage;
            lv.place = pl;
            H3_TRY(h3_copy(u->ex, &lv, &sv));
            sv = lv;
        }
        h3_pack_view_placed(p, k, dst, pl, &pv);
        H3_TRY(h3_op_convert(u->ex, &pv, &sv));
    }
    return H3_OK;
}

/* The resident units: their blocks at the place (WEIGHTS), filled as placed. A unit's stored bytes are
 * gathered into host memory by a loader (a streamer at the host: its one slot, filled by its readers), then
 * copied; converting tensors go through the load buffer. On the device, a unit that does not convert and
 * whose sources are pinned is copied straight from them. */
static h3_status load_resident(h3_units *u) {
    const h3_place pl = u->cfg.place;
    const int dev = pl == H3_PLACE_DEVICE;
    int64_t gather = 0, load = 0;
    int ng = 0;
    for (int i = 0; i < u->n; i++) {
        if (u->tier[i] != H3_TIER_RESIDENT) continue;
        const h3_pack *p = &u->packs[i];
        u->block[i] = place_alloc(u, p->pbytes, H3_DEVCAT_WEIGHTS);
        if (!u->block[i])
            return H3_ERR(h3_last_error_code() ? h3_last_error_code() : H3_ERR_NOMEM,
                          "%s: a resident unit of %lld bytes", u->cfg.what ? u->cfg.what : "weights",
                          (long long)p->pbytes);
        u->resident_bytes += p->pbytes;
        if (p->converts && p->max_cvt > load) load = p->max_cvt;
        if (!(dev && u->items[i].src_pinned && !p->converts)) {
            ng++;
            if (u->items[i].bytes > gather) gather = u->items[i].bytes;
        }
    }
    h3_status st = H3_OK;
    uint8_t *stage = NULL;
    h3_streamer *ld = NULL;
    h3_stream_item *li = NULL;
    int *lo = NULL;
    if (load) {
        stage = place_alloc(u, load, H3_DEVCAT_WEIGHTS);
        if (!stage)
            H3_FAIL(h3_last_error_code() ? h3_last_error_code() : H3_ERR_NOMEM,
                    "%s: a %lld-byte buffer to convert weights in", u->cfg.what ? u->cfg.what : "weights",
                    (long long)load);
    }
    if (ng) {
        li = h3_calloc((size_t)ng, sizeof *li, H3_MEM_OTHER);
        lo = h3_calloc((size_t)ng, sizeof *lo, H3_MEM_OTHER);
        if (!li || !lo) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        for (int i = 0, j = 0; i < u->n; i++) {
            if (u->tier[i] != H3_TIER_RESIDENT || (dev && u->items[i].src_pinned && !u->packs[i].converts))
                continue;
            li[j] = u->items[i];
            li[j].tier = H3_TIER_DISK; /* read through, once */
            li[j].src_pinned = 0;
            lo[j] = j;
            j++;
        }
        /* on a device the gathering slot is pinned: the copy out of it runs at the bus's rate, not pageable memory's */
        h3_streamer_config lc = {dev ? H3_PLACE_PINNED : H3_PLACE_HOST, 1, gather, 0, NULL, 0, NULL};
        H3_CHECK(h3_streamer_create(u->ex, &lc, li, ng, &ld));
        H3_CHECK(h3_streamer_set_order(ld, lo, ng, 0));
    }
    for (int i = 0, j = 0; i < u->n; i++) {
        if (u->tier[i] != H3_TIER_RESIDENT) continue;
        const h3_pack *p = &u->packs[i];
        if (dev && u->items[i].src_pinned && !p->converts) {
            const h3_stream_item *it = &u->items[i];
            for (int g = 0; g < it->n_segs; g++)
                H3_CHECK(copy_bytes(u->ex, u->block[i] + it->segs[g].dst, pl, it->segs[g].src,
                                    H3_PLACE_PINNED, it->segs[g].bytes));
            continue;
        }
        void *hb;
        H3_CHECK(h3_streamer_acquire(ld, j, &hb));
        const h3_place hp = dev ? H3_PLACE_PINNED : H3_PLACE_HOST;
        if (p->converts)
            st = convert_unit(u, i, hb, hp, stage, u->block[i]);
        else
            st = copy_bytes(u->ex, u->block[i], pl, hb, hp, p->bytes);
        /* the release refills the slot at once (the loader gathers on the host): the copies out of it first */
        if (st == H3_OK && dev) st = h3_exec_sync(u->ex);
        h3_streamer_release(ld, j++);
        if (st != H3_OK) goto done;
    }
    if (ld) H3_CHECK(h3_streamer_sync(ld));
    H3_CHECK(h3_exec_sync(u->ex));
done:
    if (st != H3_OK) (void)h3_exec_sync(u->ex); /* nothing queued may still read the load buffer */
    h3_streamer_free(ld);
    if (stage) h3_place_free(pl, stage, (size_t)load, H3_MEM_WEIGHTS);
    h3_free(li);
    h3_free(lo);
    return st;
}

/* Unit i's views: as stored at base, or as placed. */
static void build_views(h3_units *u, int i, void *base, int placed) {
    const h3_pack *p = &u->packs[i];
    h3_tensor *v = u->views + u->vstart[i];
    for (int k = 0; k < p->n; k++) {
        if (placed)
            h3_pack_view_placed(p, k, base, u->cfg.place, &v[k]);
        else
            h3_pack_view(p, k, base, u->cfg.place, &v[k]);
    }
}

void h3_units_close(h3_units *u) {
    if (!u) return;
    if (u->s) {
        h3_error_state kept; /* a failure that led here keeps its message */
        h3_error_save(&kept);
        h3_streamer_free(u->s);
        h3_exec_sync(u->ex);
        h3_error_restore(&kept);
    } else if (u->cfg.place == H3_PLACE_DEVICE) {
        (void)h3_exec_sync(u->ex); /* nothing queued may still read the blocks */
    }
    const h3_place pl = u->cfg.place;
    for (int i = 0; u->block && i < u->n; i++)
        if (u->block[i]) h3_place_free(pl, u->block[i], (size_t)u->packs[i].pbytes, H3_MEM_WEIGHTS);
    if (u->work) h3_place_free(pl, u->work, (size_t)u->work_bytes, H3_MEM_WEIGHTS);
    if (u->conv && u->vstart)
        for (int64_t k = 0; k < u->vstart[u->n]; k++) h3_tensor_free(&u->conv[k]);
    if (u->spill_fd >= 0) close(u->spill_fd);
    h3_free(u->packs);
    h3_free(u->tier);
    h3_free(u->vstart);
    h3_free(u->views);
    h3_free(u->conv);
    h3_free(u->block);
    h3_free(u->sidx);
    h3_free(u->segs);
    h3_free(u->items);
    h3_free(u->spill_segs);
    h3_free(u);
}

/* dst (owned host memory, contiguous) = src converted, through f32 in pieces: no exec needed. */
static h3_status host_convert(const h3_tensor *src, h3_tensor *dst) {
    if (!h3_tensor_is_contiguous(src))
        return H3_ERR(H3_ERR_INVALID, "a tensor to convert on the host must be contiguous");
    const size_t es = h3_dtype_size(src->dtype), ed = h3_dtype_size(dst->dtype);
    const int64_t n = h3_tensor_numel(src);
    float buf[4096];
    for (int64_t i = 0; i < n; i += 4096) {
        const size_t m = (size_t)(n - i < 4096 ? n - i : 4096);
        if (!h3_convert_to_f32(src->dtype, (const uint8_t *)src->data + i * (int64_t)es, buf, m) ||
            !h3_convert_from_f32(dst->dtype, buf, (uint8_t *)dst->data + i * (int64_t)ed, m))
            return H3_ERR(H3_ERR_UNSUPPORTED, "converting %s to %s on the host is not supported",
                          h3_dtype_name(src->dtype), h3_dtype_name(dst->dtype));
    }
    return H3_OK;
}

/* The tensors as opened; those placed in another dtype converted once into owned host memory. */
static h3_status open_passthrough(h3_units *u) {
    u->conv = h3_calloc((size_t)(u->vstart[u->n] ? u->vstart[u->n] : 1), sizeof *u->conv, H3_MEM_OTHER);
    if (!u->conv) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    for (int i = 0; i < u->n; i++) {
        const h3_pack *p = &u->packs[i];
        for (int k = 0; k < p->n; k++) {
            const h3_tensor *t = p->src[k];
            h3_tensor *v = &u->views[u->vstart[i] + k];
            *v = *t;
            v->owner = NULL;
            v->owned_bytes = 0;
            v->q.scales_owner = NULL;
            v->q.scales_bytes = 0;
            if (p->as[k] == t->dtype || t->q.mode != H3_SCALE_NONE) continue;
            h3_tensor *c = &u->conv[u->vstart[i] + k]; /* (joins only matter where tensors are packed) */
            H3_TRY(h3_tensor_alloc(c, H3_PLACE_HOST, p->as[k], t->ndim, t->shape, H3_MEM_WEIGHTS));
            H3_TRY_CTX(host_convert(t, c), "%s: unit %d", u->cfg.what ? u->cfg.what : "weights", i);
            *v = *c;
            v->owner = NULL;
            v->owned_bytes = 0;
        }
    }
    return H3_OK;
}

h3_status h3_units_open(h3_exec *ex, const h3_units_config *cfg, const h3_pack *packs, int n,
                        h3_units **out) {
    *out = NULL;
    const char *what = cfg->what ? cfg->what : "weights";
    if (n < 0 || (n > 0 && !packs)) return H3_ERR(H3_ERR_INVALID, "%s: %d units", what, n);
    if (cfg->place != H3_PLACE_HOST && cfg->place != H3_PLACE_DEVICE)
        return H3_ERR(H3_ERR_INVALID, "%s: units live on the host or the device", what);
    if (!ex && (cfg->place != H3_PLACE_HOST || cfg->tier))
        return H3_ERR(H3_ERR_INVALID, "%s: placed units need an exec to copy and convert with", what);
    for (int i = 0; i < n; i++) {
        if (cfg->tier && cfg->tier[i] >= H3_TIER_COUNT)
            return H3_ERR(H3_ERR_INVALID, "%s: unit %d has no tier", what, i);
        if (packs[i].overflow)
            return H3_ERR(H3_ERR_INVALID, "%s: unit %d has more than %d tensors or a bad join", what, i,
                          H3_PACK_MAX);
        for (int k = 0; k < packs[i].n; k++)
            if (packs[i].as[k] != packs[i].src[k]->dtype && packs[i].src[k]->q.mode != H3_SCALE_NONE)
                return H3_ERR(H3_ERR_INVALID, "%s: unit %d: a quantized tensor cannot be converted to %s",
                              what, i, h3_dtype_name(packs[i].as[k]));
    }
    h3_status st = H3_OK;
    h3_units *u = h3_calloc(1, sizeof *u, H3_MEM_OTHER);
    if (!u) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    const int N = n ? n : 1;
    u->ex = ex;
    u->cfg = *cfg;
    u->cfg.tier = NULL;
    u->n = n;
    u->spill_fd = -1;
    u->work_held = -1;
    u->passthrough = cfg->place == H3_PLACE_HOST && !cfg->tier;
    u->packs = h3_calloc((size_t)N, sizeof *u->packs, H3_MEM_OTHER);
    u->tier = h3_calloc((size_t)N, 1, H3_MEM_OTHER);
    u->vstart = h3_calloc((size_t)n + 1, sizeof *u->vstart, H3_MEM_OTHER);
    if (!u->packs || !u->tier || !u->vstart) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    memcpy(u->packs, packs, (size_t)n * sizeof *packs);
    for (int i = 0; i < n; i++) {
        u->tier[i] = cfg->tier ? cfg->tier[i] : H3_TIER_RESIDENT;
        u->vstart[i + 1] = u->vstart[i] + packs[i].n;
    }
    u->views = h3_calloc((size_t)(u->vstart[n] ? u->vstart[n] : 1), sizeof *u->views, H3_MEM_OTHER);
    if (!u->views) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    if (u->passthrough) {
        H3_CHECK(open_passthrough(u));
        *out = u;
        return H3_OK;
    }
    /* the items: stored layouts and their sources */
    int64_t nsegs = 0, slot = cfg->slot_bytes, work = 0;
    int quantized = 0, n_str = 0;
    for (int i = 0; i < n; i++) {
        int pin;
        nsegs += h3_pack_segs(cfg->files, &u->packs[i], cfg->heads, cfg->head_dim, NULL, &pin);
        quantized |= u->packs[i].quantized;
        if (u->tier[i] == H3_TIER_RESIDENT) continue;
        n_str++;
        if (u->packs[i].converts && u->packs[i].pbytes > work) work = u->packs[i].pbytes;
    }
    if (!slot) slot = h3_units_slot_bytes(u->packs, n, u->tier);
    if (n_str && cfg->n_slots < 1) H3_FAIL(H3_ERR_INVALID, "%s: units stream but the ring has no slot", what);
    u->segs = h3_calloc((size_t)(nsegs ? nsegs : 1), sizeof *u->segs, H3_MEM_OTHER);
    u->items = h3_calloc((size_t)N, sizeof *u->items, H3_MEM_OTHER);
    u->spill_segs = h3_calloc((size_t)N, sizeof *u->spill_segs, H3_MEM_OTHER);
    u->block = h3_calloc((size_t)N, sizeof *u->block, H3_MEM_OTHER);
    u->sidx = h3_calloc((size_t)N, sizeof *u->sidx, H3_MEM_OTHER);
    if (!u->segs || !u->items || !u->spill_segs || !u->block || !u->sidx)
        H3_FAIL(H3_ERR_NOMEM, "out of memory");
    int need_staging = 0;
    for (int64_t i = 0, o = 0, j = 0; i < n; i++) {
        h3_stream_item *it = &u->items[i];
        int pin;
        it->segs = u->segs + o;
        it->n_segs = h3_pack_segs(cfg->files, &u->packs[i], cfg->heads, cfg->head_dim, u->segs + o, &pin);
        o += it->n_segs;
        it->bytes = u->packs[i].bytes;
        it->tier = (h3_tier)u->tier[i];
        it->src_pinned = pin && cfg->place == H3_PLACE_DEVICE;
        u->sidx[i] = it->tier == H3_TIER_RESIDENT ? -1 : (int)j++;
        if (it->tier != H3_TIER_RESIDENT && it->bytes > slot)
            H3_FAIL(H3_ERR_INVALID, "%s: unit %lld has %lld bytes, more than a slot's %lld", what,
                    (long long)i, (long long)it->bytes, (long long)slot);
        if (it->tier == H3_TIER_DISK) need_staging = 1;
    }
    if (quantized && cfg->place == H3_PLACE_DEVICE) {
        h3_devcat prev = cfg->rep ? h3_memrep_set_category(cfg->rep, H3_DEVCAT_BACKEND) : H3_DEVCAT_BACKEND;
        h3_status qs = h3_cuda_qgemm_reserve(ex);
        if (cfg->rep) h3_memrep_set_category(cfg->rep, prev);
        H3_CHECK(qs);
    }
    H3_CHECK_CTX(load_resident(u), "loading %s", what);
    for (int i = 0; i < n; i++)
        if (u->tier[i] == H3_TIER_RESIDENT) build_views(u, i, u->block[i], 1);
    if (n_str) {
        H3_CHECK(spill(u));
        h3_stream_item *si = h3_calloc((size_t)n_str, sizeof *si, H3_MEM_OTHER);
        if (!si) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n; i++)
            if (u->sidx[i] >= 0) si[u->sidx[i]] = u->items[i];
        h3_streamer_config sc = {cfg->place, cfg->n_slots,
                                 slot,       need_staging ? H3_STREAM_STAGING : 0,
                                 cfg->rep,   cfg->unsafe_skip_waits, NULL};
        h3_pinned_cache given = {0, NULL, NULL}; /* the kept copies, in the streamer's item order */
        h3_pinned_cache *pc = cfg->pinned_cache;
        if (pc && pc->n >= n) {
            st = h3_pinned_cache_init(&given, n_str);
            for (int i = 0; i < n && st == H3_OK; i++)
                if (u->sidx[i] >= 0) {
                    given.p[u->sidx[i]] = pc->p[i];
                    given.bytes[u->sidx[i]] = pc->bytes[i];
                }
            sc.pinned_cache = &given;
        }
        if (st == H3_OK) st = h3_streamer_create(ex, &sc, si, n_str, &u->s);
        if (given.p) /* the adopted ones leave the caller's cache; the rest stay there */
            for (int i = 0; i < n; i++)
                if (u->sidx[i] >= 0 && !given.p[u->sidx[i]]) {
                    pc->p[i] = NULL;
                    pc->bytes[i] = 0;
                }
        h3_free(given.p);
        h3_free(given.bytes);
        h3_free(si);
        H3_CHECK_CTX(st, "loading %s", what);
        if (work) {
            u->work = place_alloc(u, work, H3_DEVCAT_SLOTS);
            if (!u->work)
                H3_FAIL(h3_last_error_code() ? h3_last_error_code() : H3_ERR_NOMEM,
                        "%s: a %lld-byte block to convert streamed units in", what, (long long)work);
            u->work_bytes = work;
        }
    }
    *out = u;
    return H3_OK;
done:
    h3_units_close(u);
    return st;
}

h3_status h3_units_set_order(h3_units *u, const int *order, int n, int cyclic) {
    if (u->passthrough || !u->s) {
        for (int i = 0; i < n; i++)
            if (order[i] < 0 || order[i] >= u->n)
                return H3_ERR(H3_ERR_INVALID, "%s: unit %d does not exist (%d units)",
                              u->cfg.what ? u->cfg.what : "weights", order[i], u->n);
        return H3_OK;
    }
    int *seq = h3_calloc((size_t)(n > 0 ? n : 1), sizeof *seq, H3_MEM_OTHER);
    if (!seq) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (order[i] < 0 || order[i] >= u->n) {
            h3_free(seq);
            return H3_ERR(H3_ERR_INVALID, "%s: unit %d does not exist (%d units)",
                          u->cfg.what ? u->cfg.what : "weights", order[i], u->n);
        }
        if (u->sidx[order[i]] >= 0) seq[m++] = u->sidx[order[i]];
    }
    h3_status st = h3_streamer_set_order(u->s, seq, m, cyclic);
    h3_free(seq);
    return st;
}

h3_status h3_units_acquire(h3_units *u, int i, const h3_tensor **tensors) {
    *tensors = NULL;
    const char *what = u->cfg.what ? u->cfg.what : "weights";
    if (i < 0 || i >= u->n)
        return H3_ERR(H3_ERR_INVALID, "%s: unit %d does not exist (%d units)", what, i, u->n);
    if (!u->passthrough && u->sidx[i] >= 0) {
        const int j = u->sidx[i];
        const h3_pack *p = &u->packs[i];
        if (p->converts && u->work_held >= 0)
            return H3_ERR(H3_ERR_INVALID, "%s: unit %d is acquired while unit %d holds the conversion block",
                          what, i, u->work_held);
        void *base;
        H3_TRY(h3_streamer_acquire(u->s, j, &base));
        if (p->converts) {
            h3_status st = convert_unit(u, i, base, u->cfg.place, NULL, u->work);
            h3_streamer_release(u->s, j); /* converted: the slot takes the next unit's copy meanwhile */
            H3_TRY_CTX(st, "%s: converting unit %d", what, i);
            build_views(u, i, u->work, 1);
            u->work_held = i;
        } else {
            build_views(u, i, base, 0);
        }
    }
    *tensors = u->views + u->vstart[i];
    return H3_OK;
}

void h3_units_release(h3_units *u, int i) {
    if (u->passthrough || i < 0 || i >= u->n || u->sidx[i] < 0) return;
    if (u->packs[i].converts) {
        if (u->work_held == i) u->work_held = -1;
        return;
    }
    h3_streamer_release(u->s, u->sidx[i]);
}

h3_status h3_units_sync(h3_units *u) {
    return u->s ? h3_streamer_sync(u->s) : H3_OK;
}

void h3_units_stats(const h3_units *u, h3_stream_stats *out) {
    memset(out, 0, sizeof *out);
    if (u->s) h3_streamer_get_stats(u->s, out);
    out->resident_bytes += u->resident_bytes;
}

h3_status h3_units_take_pinned(h3_units *u, h3_pinned_cache *c) {
    if (!u->s || u->passthrough) return H3_OK;
    if (c->n < u->n) return H3_ERR(H3_ERR_INTERNAL, "a pinned cache of %d entries for %d units", c->n, u->n);
    h3_pinned_cache mine;
    int ns = 0;
    for (int i = 0; i < u->n; i++)
        if (u->sidx[i] >= 0) ns++;
    H3_TRY(h3_pinned_cache_init(&mine, ns));
    h3_status st = h3_streamer_take_pinned(u->s, &mine);
    for (int i = 0; i < u->n && st == H3_OK; i++)
        if (u->sidx[i] >= 0 && mine.p[u->sidx[i]] && !c->p[i]) {
            c->p[i] = mine.p[u->sidx[i]];
            c->bytes[i] = mine.bytes[u->sidx[i]];
            mine.p[u->sidx[i]] = NULL;
        }
    h3_pinned_cache_free(&mine); /* none left unless the take failed part way */
    return st;
}

void h3_units_set_report(h3_units *u, h3_memrep *rep) {
    if (u) u->cfg.rep = rep;
}

int h3_units_count(const h3_units *u) {
    return u->n;
}

h3_tier h3_units_tier(const h3_units *u, int i) {
    return i >= 0 && i < u->n ? (h3_tier)u->tier[i] : H3_TIER_RESIDENT;
}

void h3_units_mem_of(const h3_units_config *cfg, const h3_pack *packs, int n, h3_units_mem *out) {
    memset(out, 0, sizeof *out);
    const int dev = cfg->place == H3_PLACE_DEVICE;
    int64_t load = 0, work = 0, slot = cfg->slot_bytes;
    int quantized = 0, n_str = 0, disk = 0;
    if (!slot) slot = h3_units_slot_bytes(packs, n, cfg->tier);
    for (int i = 0; i < n; i++) {
        const h3_pack *p = &packs[i];
        const h3_tier t = cfg->tier ? (h3_tier)cfg->tier[i] : H3_TIER_RESIDENT;
        quantized |= p->quantized;
        if (t == H3_TIER_RESIDENT) {
            out->resident += h3_cuda_granule(p->pbytes);
            if (p->converts && p->max_cvt > load) load = p->max_cvt;
            continue;
        }
        n_str++;
        if (p->converts && p->pbytes > work) work = p->pbytes;
        int pin;
        h3_pack_segs(cfg->files, p, cfg->heads, cfg->head_dim, NULL, &pin);
        if (t == H3_TIER_DISK)
            disk = 1;
        else if (!(pin && dev))
            out->pinned += p->bytes; /* the pinned host cache */
    }
    out->load = h3_cuda_granule(load);
    out->ring = n_str ? (int64_t)cfg->n_slots * h3_cuda_granule(slot) : 0;
    out->work = n_str ? h3_cuda_granule(work) : 0;
    out->backend = quantized && dev ? H3_CUDA_QGEMM_SCRATCH_BYTES : 0;
    const int64_t a = out->resident + out->load, b = out->resident + out->ring + out->work;
    out->peak = out->backend + (a > b ? a : b);
    if (disk) out->pinned += (int64_t)H3_STREAM_STAGING * slot;
}

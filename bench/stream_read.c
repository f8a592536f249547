/* Reading weights through the streamer from a file in the page cache: the text encoder's layers in generate
 * (each prompt reads all 50 from the model file) and the DiT's disk tier, when the file is already cached
 * (written just before, or read by an earlier run).
 *
 *     bench_stream_read [--layers N] [--readers R] [--passes P] [--file PATH] [--device cuda] [--cold]
 *
 * The file holds N (default 8) layers laid out as one nvfp4 layer of the release's text encoder
 * (Qwen3-VL-32B: seven linears' values and block scales, their global scales, four norms: 274 MB, 29
 * tensors). It is written unless PATH already has that size, then read once so that it is resident. Then:
 *
 *   pread        the whole file in the streamer's 8 MiB pieces over R threads (default: as the streamer
 * chooses), into one buffer per thread: the copy out of the page cache alone; pread+drop   the same, each
 * piece followed by POSIX_FADV_DONTNEED (what the streamer did after every disk-tier piece before it checked
 * residency), the file made resident again first; mapped       pread+drop with the file's pages mapped into
 * this process, as a model file's are (the safetensors reader maps it): the kernel cannot drop mapped pages
 * and drains every CPU's LRU caches to retry; streamer     the streamer itself: every layer a DISK-tier item
 * of 29 segments, a ring of 2 slots and 2 staging buffers, acquired in order, P passes (default 3) over the
 * file. On the host (default) the synchronous emulation reads straight into the slot; with --device cuda the
 * reads go through pinned staging on the read stream and are copied to device slots, as generate runs them.
 *
 * Each line: GB/s (wall), and the MiB of the file resident in the page cache after it (mincore): a streamer
 * pass that leaves the file resident means the next pass (the next prompt, the next run) reads from memory
 * again.
 */
#define _GNU_SOURCE
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
#include "mem/streamer.h"
#include "tensor/ops.h"

#define PIECE ((int64_t)8 << 20) /* the streamer's piece */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define DIE(...)                                                                                             \
    do {                                                                                                     \
        fprintf(stderr, "bench_stream_read: " __VA_ARGS__);                                                  \
        fputc('\n', stderr);                                                                                 \
        exit(1);                                                                                             \
    } while (0)

/* One nvfp4 layer of Qwen3-VL-32B (hidden 5120, 64 x 128 query heads, 8 x 128 key/value heads, FFN 25600):
 * each linear's packed values (2 per byte), its fp8 block scales (one per 16), its f32 global scale; the
 * norms in bf16. */
static int layer_segments(int64_t *bytes) {
    static const int64_t lin[7][2] = {{8192, 5120},  {1024, 5120},  {1024, 5120}, {5120, 8192},
                                      {25600, 5120}, {25600, 5120}, {5120, 25600}};
    int n = 0;
    for (int i = 0; i < 7; i++) {
        bytes[n++] = lin[i][0] * lin[i][1] / 2;
        bytes[n++] = lin[i][0] * lin[i][1] / 16;
        bytes[n++] = 4;
    }
    bytes[n++] = 5120 * 2; /* input_layernorm */
    bytes[n++] = 5120 * 2; /* post_attention_layernorm */
    bytes[n++] = 128 * 2;  /* q_norm */
    bytes[n++] = 128 * 2;  /* k_norm */
    return n;
}

static int64_t resident_bytes(int fd, int64_t size) {
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return -1;
    const int64_t pg = sysconf(_SC_PAGESIZE), np = (size + pg - 1) / pg;
    unsigned char *v = malloc((size_t)np);
    int64_t r = 0;
    if (v && mincore(p, (size_t)size, v) == 0)
        for (int64_t i = 0; i < np; i++) r += v[i] & 1;
    free(v);
    munmap(p, (size_t)size);
    return r * pg;
}

static void make_resident(int fd, int64_t size) {
    char *b = malloc((size_t)PIECE);
    if (!b) DIE("out of memory");
    for (int64_t o = 0; o < size; o += PIECE)
        if (pread(fd, b, (size_t)(size - o < PIECE ? size - o : PIECE), o) < 0) DIE("reading the file");
    free(b);
}

/* ---- raw preads over threads --------------------------------------------------------------------------- */

typedef struct {
    int fd, drop;
    int64_t off, len;
    uint8_t *dst;
} raw_ctx;

static void raw_range(void *arg, int64_t begin, int64_t end, int tid) {
    (void)tid;
    raw_ctx *c = arg;
    for (int64_t k = begin; k < end; k++) {
        const int64_t from = k * PIECE, len = c->len - from < PIECE ? c->len - from : PIECE;
        for (int64_t done = 0; done < len;) {
            ssize_t r = pread(c->fd, c->dst + from + done, (size_t)(len - done), c->off + from + done);
            if (r <= 0) DIE("pread failed");
            done += r;
        }
        if (c->drop) posix_fadvise(c->fd, c->off + from, len, POSIX_FADV_DONTNEED);
    }
}

/* The file layer by layer, each in pieces over the pool, into two layer-sized buffers in turn (the slots). */
static double raw_pass(h3_pool *pool, int fd, int64_t layer, int layers, uint8_t *const dst[2], int drop) {
    double t0 = now();
    for (int l = 0; l < layers; l++) {
        raw_ctx c = {fd, drop, l * layer, layer, dst[l % 2]};
        h3_parallel_for(pool, (layer + PIECE - 1) / PIECE, 1, raw_range, &c);
    }
    return layer * layers / (now() - t0) / 1e9;
}

int main(int argc, char **argv) {
    int layers = 8, readers = 0, passes = 3, cuda = 0, cold = 0;
    char path[1024] = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--layers") && v)
            layers = atoi(v), i++;
        else if (!strcmp(a, "--readers") && v)
            readers = atoi(v), i++;
        else if (!strcmp(a, "--passes") && v)
            passes = atoi(v), i++;
        else if (!strcmp(a, "--file") && v)
            snprintf(path, sizeof path, "%s", v), i++;
        else if (!strcmp(a, "--device") && v && !strcmp(v, "cuda"))
            cuda = 1, i++;
        else if (!strcmp(a, "--cold"))
            cold = 1;
        else
            DIE("usage: bench_stream_read [--layers N] [--readers R] [--passes P] [--file PATH] [--device "
                "cuda] [--cold]");
    }
    if (layers < 1 || layers > 1000 || passes < 1 || passes > 100 || readers < 0 || readers > 64)
        DIE("--layers 1..1000, --passes 1..100, --readers 0..64");
    if (!*path) {
        const char *tmp = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/h3_stream_read.bin", tmp && *tmp ? tmp : "/tmp");
    }
    if (readers) {
        char n[16];
        snprintf(n, sizeof n, "%d", readers);
        setenv("H3_STREAM_READERS", n, 1);
    } else {
        readers = h3_cpu_count() < 8 ? h3_cpu_count() : 8; /* the streamer's own choice */
    }

    int64_t seg[64];
    const int nseg = layer_segments(seg);
    int64_t layer = 0;
    for (int i = 0; i < nseg; i++) layer += seg[i];
    const int64_t size = layer * layers;

    /* the file: written unless it has the size already, then made resident */
    struct stat sb;
    if (stat(path, &sb) != 0 || sb.st_size != size) {
        FILE *f = fopen(path, "wb");
        if (!f) DIE("cannot write %s", path);
        uint8_t *b = malloc((size_t)PIECE);
        if (!b) DIE("out of memory");
        uint64_t z = 1;
        for (int64_t o = 0; o < size; o += PIECE) {
            for (int64_t j = 0; j < PIECE; j += 8) {
                z = z * 6364136223846793005ULL + 1442695040888963407ULL;
                memcpy(b + j, &z, 8);
            }
            const int64_t n = size - o < PIECE ? size - o : PIECE;
            if (fwrite(b, 1, (size_t)n, f) != (size_t)n) DIE("writing %s", path);
        }
        free(b);
        if (fclose(f) != 0) DIE("writing %s", path);
    }
    const int fd = open(path, O_RDONLY);
    if (fd < 0) DIE("cannot open %s", path);
    (void)fdatasync(fd); /* dirty pages cannot be dropped: make them clean, as a model file's are */
    make_resident(fd, size);
    printf("file %s: %d layers of %.1f MB (%d segments each), %.2f GB; %d readers; %.0f MiB resident\n", path,
           layers, layer / 1e6, nseg, size / 1e9, readers, resident_bytes(fd, size) / 1048576.0);

    uint8_t *dst[2];
    for (int k = 0; k < 2; k++) {
        dst[k] = malloc((size_t)layer);
        if (!dst[k]) DIE("out of memory");
        memset(dst[k], 0, (size_t)layer); /* faulted in, as a slot or a pinned staging buffer is */
    }
    h3_pool *pool = NULL;
    if (readers > 1 && h3_pool_create(readers, &pool) != H3_OK) DIE("%s", h3_last_error());
    printf("%-26s %10s %16s\n", "what", "GB/s", "resident after");
    struct {
        const char *name;
        int drop, map;
    } raw[] = {{"pread", 0, 0}, {"pread+drop", 1, 0}, {"pread+drop, mapped", 1, 1}};
    for (size_t r = 0; r < sizeof raw / sizeof raw[0]; r++) {
        make_resident(fd, size);
        const volatile uint8_t *m = NULL;
        if (raw[r].map) { /* every page mapped into this process */
            m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
            if (m == MAP_FAILED) DIE("cannot map %s", path);
            uint8_t sink = 0;
            for (int64_t o = 0; o < size; o += 4096) sink ^= m[o];
            (void)sink;
        }
        double gbs = raw_pass(pool, fd, layer, layers, dst, raw[r].drop);
        printf("%-26s %10.2f %12.0f MiB\n", raw[r].name, gbs, resident_bytes(fd, size) / 1048576.0);
        if (m) munmap((void *)m, (size_t)size);
    }
    h3_pool_free(pool);
    free(dst[0]);
    free(dst[1]);

    /* the streamer */
    h3_exec ex;
    memset(&ex, 0, sizeof ex);
    if (cuda) {
        if (h3_cuda_init(&ex, 0, 2 * layer + ((int64_t)1 << 30)) != H3_OK) DIE("%s", h3_last_error());
    } else if (h3_exec_init(&ex, 1) != H3_OK) {
        DIE("%s", h3_last_error());
    }
    h3_stream_seg *segs = calloc((size_t)(layers * nseg), sizeof *segs);
    h3_stream_item *items = calloc((size_t)layers, sizeof *items);
    int *order = calloc((size_t)layers, sizeof *order);
    if (!segs || !items || !order) DIE("out of memory");
    for (int l = 0; l < layers; l++) {
        int64_t o = 0;
        for (int i = 0; i < nseg; i++) {
            segs[l * nseg + i] = (h3_stream_seg){NULL, fd, l * layer + o, seg[i], o};
            o += seg[i];
        }
        items[l] = (h3_stream_item){layer, &segs[l * nseg], nseg, H3_TIER_DISK, 0};
        order[l] = l;
    }
    if (!cold) make_resident(fd, size);
    h3_streamer_config cfg = {cuda ? H3_PLACE_DEVICE : H3_PLACE_HOST, 2, layer, H3_STREAM_STAGING, NULL, 0, NULL};
    h3_streamer *s = NULL;
    if (h3_streamer_create(&ex, &cfg, items, layers, &s) != H3_OK) DIE("%s", h3_last_error());
    h3_stream_stats st0;
    memset(&st0, 0, sizeof st0);
    for (int p = 0; p < passes; p++) {
        if (cold) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        double t0 = now();
        if (h3_streamer_set_order(s, order, layers, 0) != H3_OK) DIE("%s", h3_last_error());
        for (int l = 0; l < layers; l++) {
            void *d;
            if (h3_streamer_acquire(s, l, &d) != H3_OK) DIE("%s", h3_last_error());
            h3_streamer_release(s, l);
        }
        if (h3_streamer_sync(s) != H3_OK) DIE("%s", h3_last_error());
        double dt = now() - t0;
        h3_stream_stats st;
        h3_streamer_get_stats(s, &st);
        const double rs = st.read_s - st0.read_s;
        const int64_t rb = st.bytes_read - st0.bytes_read, cb = st.bytes_cached - st0.bytes_cached;
        st0 = st;
        char name[64];
        snprintf(name, sizeof name, "streamer (%s%s), pass %d", cuda ? "device" : "host",
                 cold ? ", cold" : "", p + 1);
        printf("%-26s %10.2f %12.0f MiB   (reads alone %.2f GB/s, %.0f%% from the cache)%s\n", name,
               size / dt / 1e9, resident_bytes(fd, size) / 1048576.0, rs > 0 ? rb / rs / 1e9 : 0.0,
               rb > 0 ? 100.0 * cb / rb : 0.0,
               p == 0 && !cuda ? "  (the first touches the slots' pages)" : "");
    }
    h3_streamer_free(s);
    if (cuda)
        h3_cuda_shutdown(&ex);
    else
        h3_exec_free(&ex);
    free(segs);
    free(items);
    free(order);
    close(fd);
    return 0;
}

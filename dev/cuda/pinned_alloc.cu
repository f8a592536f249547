/* Scratch bench: how fast can a process make pinned host copies of weights (the DiT's PINNED tier at a small
 * device budget: 47 blocks of ~0.36 GiB filled from the model file before the first step)?
 *
 *   nvcc -O3 -arch=sm_90 -o pinned_alloc pinned_alloc.cu -lpthread && ./pinned_alloc [GiB] [piece MiB] [threads]
 *
 * Each way makes GiB of pinned memory in pieces of `piece` MiB and fills every piece from a source buffer (pages
 * already present, as a file in the page cache would be mapped) with `threads` threads, then times a copy of
 * each piece to the device (a pinned copy runs at the bus's rate; a copy from memory that is not pinned does not):
 *   A  cudaHostAlloc per piece, then the fill (what the streamer does today)
 *   B  mmap + MADV_HUGEPAGE per piece, the fill (which faults the pages in), then cudaHostRegister
 *   C  as B with the pieces registered from `threads` threads at once
 *   D  as A with the pieces allocated from `threads` threads at once
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int g_pieces, g_threads, g_way;
static size_t g_piece;
static char **g_p;
static const char *g_src;
static int g_next;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* work items: (piece, part) for fills; piece for allocations/registrations */
static void *fill_worker(void *arg) {
    (void)arg;
    const size_t part = (size_t)8 << 20;
    const size_t parts = (g_piece + part - 1) / part;
    for (;;) {
        pthread_mutex_lock(&g_mu);
        int k = g_next++;
        pthread_mutex_unlock(&g_mu);
        if ((size_t)k >= parts * g_pieces) return NULL;
        size_t i = k / parts, off = (k % parts) * part, n = g_piece - off < part ? g_piece - off : part;
        memcpy(g_p[i] + off, g_src + off, n);
    }
}

static void *piece_worker(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&g_mu);
        int i = g_next++;
        pthread_mutex_unlock(&g_mu);
        if (i >= g_pieces) return NULL;
        if (g_way == 'C') CK(cudaHostRegister(g_p[i], g_piece, cudaHostRegisterDefault));
        if (g_way == 'D') CK(cudaHostAlloc((void **)&g_p[i], g_piece, cudaHostAllocDefault));
    }
}

static void run_threads(void *(*fn)(void *), int n) {
    pthread_t t[64];
    g_next = 0;
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, fn, NULL);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
}

int main(int argc, char **argv) {
    const double gib = argc > 1 ? atof(argv[1]) : 8.0;
    g_piece = (size_t)(argc > 2 ? atof(argv[2]) : 368.0) * (1 << 20);
    g_threads = argc > 3 ? atoi(argv[3]) : 8;
    g_pieces = (int)(gib * (1 << 30) / g_piece);
    g_p = (char **)calloc(g_pieces, sizeof *g_p);
    char *src = (char *)malloc(g_piece);
    memset(src, 1, g_piece);
    g_src = src;
    void *dev;
    CK(cudaMalloc(&dev, g_piece));
    CK(cudaFree(0));
    printf("%d pieces of %.0f MiB (%.2f GiB), %d threads\n", g_pieces, g_piece / 1048576.0,
           (double)g_pieces * g_piece / (1 << 30), g_threads);
    printf("way  make+fill s   GB/s   (alloc s  fill s  register s)   H2D GB/s\n");
    const char ways[] = "ABCD";
    for (int w = 0; w < 4; w++) {
        g_way = ways[w];
        double t0 = now(), ta = 0, tf = 0, tr = 0;
        if (g_way == 'A') {
            for (int i = 0; i < g_pieces; i++) CK(cudaHostAlloc((void **)&g_p[i], g_piece, cudaHostAllocDefault));
        } else if (g_way == 'D') {
            run_threads(piece_worker, g_threads);
        } else {
            for (int i = 0; i < g_pieces; i++) {
                g_p[i] = (char *)mmap(NULL, g_piece, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (g_p[i] == MAP_FAILED) {
                    perror("mmap");
                    return 1;
                }
                madvise(g_p[i], g_piece, MADV_HUGEPAGE);
            }
        }
        ta = now() - t0;
        double t1 = now();
        run_threads(fill_worker, g_threads);
        tf = now() - t1;
        double t2 = now();
        if (g_way == 'B')
            for (int i = 0; i < g_pieces; i++) CK(cudaHostRegister(g_p[i], g_piece, cudaHostRegisterDefault));
        if (g_way == 'C') run_threads(piece_worker, g_threads);
        tr = now() - t2;
        const double total = now() - t0;
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaEventRecord(e0));
        for (int i = 0; i < g_pieces; i++) CK(cudaMemcpyAsync(dev, g_p[i], g_piece, cudaMemcpyHostToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double bytes = (double)g_pieces * g_piece;
        printf("%c    %10.3f  %6.2f   (%7.3f  %6.3f  %9.3f)   %8.2f\n", g_way, total, bytes / total / 1e9, ta, tf, tr,
               bytes / (ms * 1e-3) / 1e9);
        fflush(stdout);
        double tfree = now();
        for (int i = 0; i < g_pieces; i++) {
            if (g_way == 'A' || g_way == 'D') {
                CK(cudaFreeHost(g_p[i]));
            } else {
                CK(cudaHostUnregister(g_p[i]));
                munmap(g_p[i], g_piece);
            }
        }
        printf("     freed in %.3f s\n", now() - tfree);
    }
    return 0;
}

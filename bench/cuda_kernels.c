/* CUDA kernel throughput through the op API at DiT shapes: bf16 GEMMs (cuBLASLt), attention, elementwise
 * bandwidth, and host<->device copies. Skips without a GPU.
 *   usage: bench_cuda_kernels [rows]   (default 19412 = W124's packed rows)
 *          bench_cuda_kernels conv3d   the video VAE encoder's 3-D convolutions on TF32 at the release's tile
 * (17 frames of 256x256 at the first level): the implicit GEMM against im2col H3_BENCH_ATTN_AMP: q, k, v in
 * ±amp (default 3); H3_BENCH_ATTN_ONLY=1: bf16 and this GPU's fp8 attention only (A/B runs of kernel
 * variants, tests/gpu/run.sh ab) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda.h"
#include "tensor/ops.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define TRY(x)                                                                                                   \
    do {                                                                                                         \
        if ((x) != H3_OK) {                                                                                      \
            fprintf(stderr, "%s failed: %s\n", #x, h3_last_error());                                             \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

static h3_exec ex;

/* Uniform values in ±0.1 (GEMMs), or in ±amp with amp from H3_BENCH_ATTN_AMP for attention's q, k, v (default
 * 3: scores of a few units, softmax neither flat nor one-hot); each call its own stream of values. */
static void dev_fill_amp(h3_tensor *t, float amp) {
    static uint32_t seed = 777;
    h3_tensor h;
    TRY(h3_tensor_alloc(&h, H3_PLACE_HOST, H3_F32, t->ndim, t->shape, H3_MEM_ACTIVATIONS));
    float *p = h.data;
    uint32_t s = seed;
    seed = seed * 69069u + 1u;
    for (int64_t i = 0; i < h3_tensor_numel(&h); i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 2.0f * amp;
    }
    h3_tensor hb;
    TRY(h3_tensor_alloc(&hb, H3_PLACE_HOST, t->dtype, t->ndim, t->shape, H3_MEM_ACTIVATIONS));
    TRY(h3_op_convert(&ex, &hb, &h));
    TRY(h3_copy(&ex, t, &hb));
    TRY(h3_exec_sync(&ex));
    h3_tensor_free(&h);
    h3_tensor_free(&hb);
}

static void dev_fill(h3_tensor *t) {
    dev_fill_amp(t, 0.1f);
}
/* H3_BENCH_ATTN_ONLY=1: bf16 attention and this GPU's fp8 kernel only (A/B runs of kernel variants) */
static int attn_only(void) {
    const char *e = getenv("H3_BENCH_ATTN_ONLY");
    return e && *e && *e != '0';
}
static float attn_amp(void) {
    const char *e = getenv("H3_BENCH_ATTN_AMP");
    return e ? (float)atof(e) : 3.0f;
}

/* relative L2 distance of two device tensors of one shape */
static double dev_rel_l2(const h3_tensor *a, const h3_tensor *b) {
    h3_tensor h[2], f[2];
    const h3_tensor *src[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        TRY(h3_tensor_alloc(&h[i], H3_PLACE_HOST, src[i]->dtype, src[i]->ndim, src[i]->shape,
                            H3_MEM_ACTIVATIONS));
        TRY(h3_tensor_alloc(&f[i], H3_PLACE_HOST, H3_F32, src[i]->ndim, src[i]->shape, H3_MEM_ACTIVATIONS));
        TRY(h3_copy(&ex, &h[i], src[i]));
        TRY(h3_exec_sync(&ex));
        TRY(h3_op_convert(&ex, &f[i], &h[i]));
    }
    double num = 0, den = 0;
    const float *x = f[0].data, *y = f[1].data;
    for (int64_t i = 0; i < h3_tensor_numel(&f[0]); i++) {
        num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        den += (double)y[i] * y[i];
    }
    for (int i = 0; i < 2; i++) {
        h3_tensor_free(&h[i]);
        h3_tensor_free(&f[i]);
    }
    return den > 0 ? sqrt(num / den) : 0.0;
}

/* median of reps timings of fn(ctx), each bracketed by device syncs */
typedef h3_status (*bench_fn)(void *);
static double timeit(bench_fn fn, void *ctx, int reps) {
    TRY(fn(ctx));
    TRY(h3_exec_sync(&ex));
    double t[16];
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        TRY(fn(ctx));
        TRY(h3_exec_sync(&ex));
        t[r] = now() - t0;
    }
    for (int i = 0; i < reps; i++)
        for (int j = i + 1; j < reps; j++)
            if (t[j] < t[i]) {
                double x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    return t[reps / 2];
}

typedef struct {
    h3_tensor *y, *x, *w, *o, *q, *k, *v;
    unsigned flags;
    h3_sparse_attn *sp;
} ctx_t;

static h3_status run_gemm(void *p) {
    ctx_t *c = p;
    return h3_op_gemm(&ex, c->y, c->x, c->w, NULL, 0);
}
static h3_status run_attn(void *p) {
    ctx_t *c = p;
    return h3_op_attention(&ex, c->o, c->q, c->k, c->v, 1.0f / sqrtf(128.0f), c->flags);
}
static h3_status run_attn_sparse(void *p) {
    ctx_t *c = p;
    return h3_op_attention_sparse(&ex, c->o, c->q, c->k, c->v, 1.0f / sqrtf(128.0f), c->sp);
}
static h3_status run_rms(void *p) {
    ctx_t *c = p;
    return h3_op_rms_norm(&ex, c->y, c->x, NULL, 1e-5f);
}
static h3_status run_h2d(void *p) {
    ctx_t *c = p;
    return h3_copy(&ex, c->y, c->x);
}

typedef struct {
    h3_tensor *y, *x, *w, *b;
    h3_conv3d_params p;
} conv_ctx;

static h3_status run_conv3d(void *p) {
    conv_ctx *c = p;
    return h3_op_conv3d(&ex, c->y, c->x, c->w, c->b, &c->p);
}

/* The encoder's convolutions of one tile of a 17-frame chunk (video_vae_enc.c ve_conv's padding: two zero
 * frames before, space reflected; its downsamplers one reflected pixel right and bottom), each on TF32
 * through the implicit GEMM (this GPU's path) and through im2col + cuBLASLt: ms, TFLOP/s of the taps that
 * read samples, and the two outputs' distance. */
static void bench_conv3d(void) {
    static const struct {
        const char *name;
        int64_t cin, cout, T, H, W, k;
        int ts, ss;
    } cs[] = {
        {"level 0 3x3x3 128->128 17x256x256", 128, 128, 17, 256, 256, 3, 1, 1},
        {"level 1 3x3x3 256->256 17x128x128", 256, 256, 17, 128, 128, 3, 1, 1},
        {"level 3 3x3x3 512->512 9x32x32", 512, 512, 9, 32, 32, 3, 1, 1},
        {"space down 128 17x256x256", 128, 128, 17, 256, 256, 3, 1, 2},
        {"time+space down 256 17x64x64", 256, 256, 17, 64, 64, 3, 2, 2},
        {"1x1x1 128->256 17x128x128", 128, 256, 17, 128, 128, 1, 1, 1},
        {"one frame 3x3x3 128->128 256x256", 128, 128, 1, 256, 256, 3, 1, 1},
    };
    h3_cuda_conv_set_math(H3_CONV_3D, H3_CONV_TF32);
    printf("%-44s %10s %10s %10s %10s %9s\n", "conv3d (TF32)", "igemm ms", "TFLOP/s", "im2col ms", "TFLOP/s",
           "rel L2");
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const int64_t k = cs[i].k, down = cs[i].ss > 1 || cs[i].ts > 1;
        conv_ctx c;
        memset(&c.p, 0, sizeof c.p);
        c.p.stride[0] = cs[i].ts;
        c.p.stride[1] = c.p.stride[2] = cs[i].ss;
        c.p.pad_mode[0] = H3_PAD_ZEROS;
        c.p.pad_mode[1] = c.p.pad_mode[2] = H3_PAD_REFLECT;
        if (k == 3) c.p.pad[0][0] = 2;
        if (k == 3 && !down) c.p.pad[1][0] = c.p.pad[1][1] = c.p.pad[2][0] = c.p.pad[2][1] = 1;
        if (down && cs[i].ss == 2) c.p.pad[1][1] = c.p.pad[2][1] = 1;
        const int64_t sx[4] = {cs[i].cin, cs[i].T, cs[i].H, cs[i].W},
                      sw[5] = {cs[i].cout, cs[i].cin, k, k, k}, sb[1] = {cs[i].cout};
        int64_t sy[4] = {cs[i].cout, 0, 0, 0};
        for (int a = 0; a < 3; a++)
            sy[1 + a] = (sx[1 + a] + c.p.pad[a][0] + c.p.pad[a][1] - k) / c.p.stride[a] + 1;
        h3_tensor x, w, b, y, y2;
        TRY(h3_tensor_alloc(&x, H3_PLACE_DEVICE, H3_F32, 4, sx, H3_MEM_ACTIVATIONS));
        TRY(h3_tensor_alloc(&w, H3_PLACE_DEVICE, H3_F32, 5, sw, H3_MEM_WEIGHTS));
        TRY(h3_tensor_alloc(&b, H3_PLACE_DEVICE, H3_F32, 1, sb, H3_MEM_WEIGHTS));
        TRY(h3_tensor_alloc(&y, H3_PLACE_DEVICE, H3_F32, 4, sy, H3_MEM_ACTIVATIONS));
        TRY(h3_tensor_alloc(&y2, H3_PLACE_DEVICE, H3_F32, 4, sy, H3_MEM_ACTIVATIONS));
        dev_fill_amp(&x, 1.0f);
        dev_fill_amp(&w, 0.05f);
        dev_fill(&b);
        c.x = &x, c.w = &w, c.b = &b;
        /* the taps that read samples: a one-frame input's two causal taps read only zeros */
        const double live = k == 1 ? 1 : cs[i].T == 1 ? 9 : 27;
        const double fl = 2.0 * cs[i].cin * cs[i].cout * live * sy[1] * sy[2] * sy[3];
        c.y = &y;
        h3_cuda_conv3d_prefer_im2col(0);
        const double ti = timeit(run_conv3d, &c, 5);
        c.y = &y2;
        h3_cuda_conv3d_prefer_im2col(1);
        const double tc = timeit(run_conv3d, &c, 3);
        h3_cuda_conv3d_prefer_im2col(0);
        printf("%-44s %10.3f %10.1f %10.3f %10.1f %9.2e\n", cs[i].name, ti * 1e3, fl / ti * 1e-12, tc * 1e3,
               fl / tc * 1e-12, dev_rel_l2(&y, &y2));
        h3_tensor_free(&x);
        h3_tensor_free(&w);
        h3_tensor_free(&b);
        h3_tensor_free(&y);
        h3_tensor_free(&y2);
    }
}

int main(int argc, char **argv) {
    if (h3_cuda_device_count() == 0) {
        printf("bench_cuda_kernels: skipped: no CUDA device\n");
        return 0;
    }
    int64_t M = argc > 1 ? atoll(argv[1]) : 19412;
    TRY(h3_exec_init(&ex, 0));
    TRY(h3_cuda_init(&ex, 0, (int64_t)40 << 30));
    if (argc > 1 && strcmp(argv[1], "conv3d") == 0) {
        bench_conv3d();
        h3_cuda_shutdown(&ex);
        h3_exec_free(&ex);
        return 0;
    }
    printf("%-44s %10s %12s\n", "kernel", "ms", "rate");
    const int64_t shapes[4][2] = {{21504, 5376}, {5376, 7168}, {28672, 5376}, {5376, 14336}};
    const char *names[4] = {"qkv_proj", "out_proj", "fc1", "fc2"};
    double total_gemm = 0;
    for (int i = 0; i < 4 && !attn_only(); i++) {
        h3_tensor x, w, y;
        TRY(h3_tensor_alloc2(&x, H3_PLACE_DEVICE, H3_BF16, M, shapes[i][1], H3_MEM_ACTIVATIONS));
        TRY(h3_tensor_alloc2(&w, H3_PLACE_DEVICE, H3_BF16, shapes[i][0], shapes[i][1], H3_MEM_WEIGHTS));
        TRY(h3_tensor_alloc2(&y, H3_PLACE_DEVICE, H3_BF16, M, shapes[i][0], H3_MEM_ACTIVATIONS));
        dev_fill(&x);
        dev_fill(&w);
        ctx_t c = {&y, &x, &w, NULL, NULL, NULL, NULL, 0, NULL};
        double t = timeit(run_gemm, &c, 7);
        double fl = 2.0 * M * shapes[i][0] * shapes[i][1];
        total_gemm += t;
        char nm[96];
        snprintf(nm, sizeof nm, "gemm bf16 %s M%lld N%lld K%lld", names[i], (long long)M, (long long)shapes[i][0],
                 (long long)shapes[i][1]);
        printf("%-44s %10.3f %9.1f TFLOP/s\n", nm, t * 1e3, fl / t * 1e-12);
        h3_tensor_free(&x);
        h3_tensor_free(&w);
        h3_tensor_free(&y);
    }
    printf("%-44s %10.3f %12s\n", "gemm sum per block", total_gemm * 1e3, "");
    /* attention, bf16 and low-bit (H3_ATTN_FP8, H3_ATTN_INT8: their quantization passes included), on contiguous q, k, v and on
     * the DiT's column blocks of one [M, 3·7168] projection (row stride 21,504) */
    for (int strided = 0; strided < 2; strided++) {
        int64_t s3[3] = {M, 56, 128};
        h3_tensor q, k, v, o, qkv, ob;
        if (strided) {
            TRY(h3_tensor_alloc2(&qkv, H3_PLACE_DEVICE, H3_BF16, M, 3 * 56 * 128, H3_MEM_ACTIVATIONS));
            dev_fill_amp(&qkv, attn_amp());
            h3_tensor *t[3] = {&q, &k, &v};
            for (int j = 0; j < 3; j++) {
                TRY(h3_tensor_wrap(t[j], (char *)qkv.data + (size_t)j * 56 * 128 * 2, H3_PLACE_DEVICE,
                                   H3_BF16, 3, s3));
                t[j]->stride[0] = 3 * 56 * 128;
            }
        } else {
            TRY(h3_tensor_alloc(&q, H3_PLACE_DEVICE, H3_BF16, 3, s3, H3_MEM_ACTIVATIONS));
            TRY(h3_tensor_alloc(&k, H3_PLACE_DEVICE, H3_BF16, 3, s3, H3_MEM_ACTIVATIONS));
            TRY(h3_tensor_alloc(&v, H3_PLACE_DEVICE, H3_BF16, 3, s3, H3_MEM_ACTIVATIONS));
            dev_fill_amp(&q, attn_amp());
            dev_fill_amp(&k, attn_amp());
            dev_fill_amp(&v, attn_amp());
        }
        TRY(h3_tensor_alloc(&o, H3_PLACE_DEVICE, H3_BF16, 3, s3, H3_MEM_ACTIVATIONS));
        TRY(h3_tensor_alloc(&ob, H3_PLACE_DEVICE, H3_BF16, 3, s3, H3_MEM_ACTIVATIONS));
        ctx_t c = {0};
        c.o = &ob;
        c.q = &q;
        c.k = &k;
        c.v = &v;
        double tb = timeit(run_attn, &c, 5);
        char nm[96];
        snprintf(nm, sizeof nm, "attention bf16 S%lld H56 D128%s", (long long)M, strided ? " strided" : "");
        printf("%-44s %10.3f %9.1f TFLOP/s\n", nm, tb * 1e3, 4.0 * M * M * 56 * 128 / tb * 1e-12);
        c.o = &o;
        /* low-bit: this GPU's fp8 kernel (Hopper's wgmma one on an H200), the mma.sync fp8 kernel (Ada's), int8 */
        static const struct {
            const char *name;
            unsigned flags;
            int mma8;
        } lb[] = {{"fp8", H3_ATTN_FP8, 0}, {"fp8 mma.sync", H3_ATTN_FP8, 1}, {"int8", H3_ATTN_INT8, 0}};
        for (size_t m = 0; m < (attn_only() ? 1 : sizeof lb / sizeof lb[0]); m++) {
            c.flags = lb[m].flags;
            h3_cuda_attention_prefer_mma8(lb[m].mma8);
            h3_status st = run_attn(&c);
            if (st == H3_OK) {
                double t = timeit(run_attn, &c, 5);
                snprintf(nm, sizeof nm, "attention %s S%lld H56 D128%s", lb[m].name, (long long)M,
                         strided ? " strided" : "");
                printf("%-44s %10.3f %9.1f TFLOP/s  %.2fx bf16, %.2e rel L2 off bf16\n", nm, t * 1e3,
                       4.0 * M * M * 56 * 128 / t * 1e-12, tb / t, dev_rel_l2(&o, &ob));
            } else {
                printf("attention %s: %s\n", lb[m].name, h3_last_error());
                h3_clear_error();
            }
        }
        h3_cuda_attention_prefer_mma8(0);
        /* block-sparse (Hopper): Sol-Attn's threshold and a lower one; the first tile marked exact (H3's text and
         * audio rows); the selection included. On random q, k, v the tile scores are near-Gaussian, so the share of
         * exact tiles follows tau; the error off dense says nothing of a trained model's. */
        const double taus[2] = {1.3, 0.5};
        const int64_t nt = (M + 127) / 128;
        uint8_t *mark = calloc((size_t)nt, 1);
        if (mark) mark[0] = 1;
        for (int m = 0; m < 2 && mark && !attn_only(); m++) {
            int64_t n_exact = 0;
            h3_sparse_attn sp = {(float)taus[m], mark, &n_exact};
            c.sp = &sp;
            h3_status st = run_attn_sparse(&c);
            if (st == H3_OK) {
                sp.n_exact = NULL;
                double t = timeit(run_attn_sparse, &c, 5);
                snprintf(nm, sizeof nm, "attention sparse tau %.1f S%lld%s", taus[m], (long long)M,
                         strided ? " strided" : "");
                printf("%-44s %10.3f %9.1f%% tiles exact  %.2fx bf16, %.2e rel L2 off bf16\n", nm, t * 1e3,
                       100.0 * n_exact / (56.0 * nt * nt), tb / t, dev_rel_l2(&o, &ob));
            } else {
                printf("attention sparse: %s\n", h3_last_error());
                h3_clear_error();
            }
        }
        free(mark);
        if (strided)
            h3_tensor_free(&qkv);
        else {
            h3_tensor_free(&q);
            h3_tensor_free(&k);
            h3_tensor_free(&v);
        }
        h3_tensor_free(&o);
        h3_tensor_free(&ob);
    }
    if (!attn_only()) {
        h3_tensor x, y;
        TRY(h3_tensor_alloc2(&x, H3_PLACE_DEVICE, H3_BF16, M, 5376, H3_MEM_ACTIVATIONS));
        TRY(h3_tensor_alloc2(&y, H3_PLACE_DEVICE, H3_BF16, M, 5376, H3_MEM_ACTIVATIONS));
        dev_fill(&x);
        ctx_t c = {&y, &x, NULL, NULL, NULL, NULL, NULL, 0, NULL};
        double t = timeit(run_rms, &c, 7);
        printf("%-44s %10.3f %9.1f GB/s\n", "rms_norm bf16 M x 5376", t * 1e3, 2.0 * 2 * M * 5376 / t * 1e-9);
        h3_tensor_free(&x);
        h3_tensor_free(&y);
    }
    if (!attn_only()) {
        int64_t n = (int64_t)1 << 30; /* 2 GiB of bf16 */
        h3_tensor hp, d;
        TRY(h3_tensor_alloc2(&hp, H3_PLACE_PINNED, H3_BF16, n / 8192, 8192, H3_MEM_WEIGHTS));
        TRY(h3_tensor_alloc2(&d, H3_PLACE_DEVICE, H3_BF16, n / 8192, 8192, H3_MEM_WEIGHTS));
        memset(hp.data, 0, (size_t)n * 2);
        ctx_t c = {&d, &hp, NULL, NULL, NULL, NULL, NULL, 0, NULL};
        double t = timeit(run_h2d, &c, 5);
        printf("%-44s %10.3f %9.1f GB/s\n", "copy pinned host -> device, 2 GiB", t * 1e3, 2.0 * n / t * 1e-9);
        h3_tensor_free(&hp);
        h3_tensor_free(&d);
    }
    int64_t used, peak, cap;
    h3_cuda_mem_stats(&ex, &used, &peak, &cap);
    printf("device arena peak %.2f GiB of %.2f GiB\n", peak / 1073741824.0, cap / 1073741824.0);
    h3_cuda_shutdown(&ex);
    h3_exec_free(&ex);
    return 0;
}

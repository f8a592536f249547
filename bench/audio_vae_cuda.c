/* The release-size audio VAE decoder (BigVGAN, diffusers' AutoencoderKLMiniMaxH3Audio defaults) on the GPU: the
 * 5.2 s stereo decode of BENCH.md (latents [2, 32, 207] -> waveform [2, 1, 165600]) timed with device events.
 *
 *   bench_audio_vae_cuda [--latents T] [--reps N] [--math exact|f32|tf32|all] [--no-cpu] [--dir DIR]
 *
 * The decoder is written once as a ComfyUI-layout file (official names, folded f32 weights, latents statistics as
 * tensors; 248 MiB) into DIR (default $TMPDIR or /tmp) with random values in PyTorch's default ranges (uniform within
 * 1/sqrt(fan_in)), then opened like any checkpoint with its activations on the device: the first decode uploads the
 * weights. Timing: 2 warm-up decodes, then N (default 20) decodes per arithmetic, the arithmetics interleaved, each
 * between two events on the compute stream (the latents' copy in and the waveform's copy out included); median and
 * spread. --math picks the convolutions' GEMMs: exact f32 (the default, what h3run runs), cuBLAS's plain f32 compute
 * type, TF32 tensor cores, or all three; the others are compared with exact f32. A profiled decode then gives the
 * time per op (serialized: the sum exceeds an unprofiled decode), and unless --no-cpu the same decode on the CPU
 * (all cores) gives the reference the GPU's output is compared with (relative L2 and largest difference).
 * Device memory: measured peak against h3_audio_vae_decode_peak. Writes $OUT/audio_vae_cuda.json when OUT is set.
 * The matching diffusers figure: bench/audio_vae_diffusers.py (tests/gpu/run.sh audio-vae runs both). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "models/audio_vae.h"

#define TRY(x)                                                                                                   \
    do {                                                                                                         \
        if ((x) != H3_OK) {                                                                                      \
            fprintf(stderr, "%s failed: %s\n", #x, h3_last_error());                                             \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the release-size decoder file ------------------------------------------------------------------------- */

typedef struct {
    h3_st_writer *w;
    float **bufs;
    int n, cap;
    uint64_t seed;
} model_writer;

/* A tensor of uniform values in [-bound, bound] + offset. */
static void put(model_writer *m, const char *name, int nd, const int64_t *shape, double bound, double offset) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *b = malloc((size_t)n * sizeof(float));
    if (!b) {
        fprintf(stderr, "out of memory for %s\n", name);
        exit(1);
    }
    for (int64_t i = 0; i < n; i++)
        b[i] = (float)(offset + bound * (2.0 * h3_random_unit(m->seed, (uint64_t)i) - 1.0));
    m->seed += 0x9e3779b97f4a7c15ULL;
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 256;
        m->bufs = realloc(m->bufs, (size_t)m->cap * sizeof *m->bufs);
    }
    m->bufs[m->n++] = b;
    TRY(h3_st_writer_add(m->w, name, H3_F32, nd, shape, b));
}

/* A conv (transposed: w [in, out, k]) with PyTorch's default ranges: 1/sqrt(fan_in) for the weight and the bias,
 * fan_in = w.size(1)·k. */
static void put_conv(model_writer *m, const char *base, int64_t s0, int64_t s1, int64_t k, int bias_len) {
    char name[160];
    int64_t s[3] = {s0, s1, k}, sb[1] = {bias_len};
    double bound = 1.0 / sqrt((double)(s1 * k));
    snprintf(name, sizeof name, "%s.weight", base);
    put(m, name, 3, s, bound, 0.0);
    if (bias_len) {
        snprintf(name, sizeof name, "%s.bias", base);
        put(m, name, 1, sb, bound, 0.0);
    }
}

static void put_act(model_writer *m, const char *base, int64_t C) {
    char name[160];
    int64_t s[1] = {C};
    snprintf(name, sizeof name, "%s.act.alpha", base); /* SnakeBeta's log-scale parameters: near 0 (α, β near 1) */
    put(m, name, 1, s, 0.1, 0.0);
    snprintf(name, sizeof name, "%s.act.beta", base);
    put(m, name, 1, s, 0.1, 0.0);
}

/* diffusers' AutoencoderKLMiniMaxH3Audio() decoder: 32 -> 2048, conv_pre 1024, rates 5 5 2 2 2 2 2 (kernels 9 9 4 4 4
 * 4 4), 3 AMP blocks per stage (kernels 3 7 11, dilations 1 3 5: h3run reads those from the shapes). */
static void write_release_model(const char *path) {
    static const int kernels[7] = {9, 9, 4, 4, 4, 4, 4}, rk[3] = {3, 7, 11}; /* rate u: kernel 2u − (u mod 2) */
    model_writer m = {0};
    m.seed = 12345;
    TRY(h3_st_writer_new(&m.w));
    char name[160];
    int64_t s32[1] = {32};
    put(&m, "latents_mean", 1, s32, 0.0, 0.0);
    put(&m, "latents_std", 1, s32, 0.0, 1.0);
    put_conv(&m, "dec_in_proj", 2048, 32, 1, 2048);
    put_conv(&m, "decoder.conv_pre", 1024, 2048, 7, 1024);
    for (int i = 0; i < 7; i++) {
        int64_t cin = 1024 >> i, C = 512 >> i;
        snprintf(name, sizeof name, "decoder.ups.%d.0", i);
        put_conv(&m, name, cin, C, kernels[i], (int)C);
        for (int r = 0; r < 3; r++) {
            for (int d = 0; d < 3; d++)
                for (int which = 1; which <= 2; which++) {
                    snprintf(name, sizeof name, "decoder.resblocks.%d.convs%d.%d", i * 3 + r, which, d);
                    put_conv(&m, name, C, C, rk[r], (int)C);
                }
            for (int a = 0; a < 6; a++) {
                snprintf(name, sizeof name, "decoder.resblocks.%d.activations.%d", i * 3 + r, a);
                put_act(&m, name, C);
            }
        }
    }
    put_act(&m, "decoder.activation_post", 8);
    put_conv(&m, "decoder.conv_post", 1, 8, 7, 0);
    TRY(h3_st_writer_write(m.w, path, 0));
    h3_st_writer_free(m.w);
    for (int i = 0; i < m.n; i++) free(m.bufs[i]);
    free(m.bufs);
}

/* ---- timing -------------------------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *const g_math_names[3] = {"exact f32", "f32 (cuBLAS default)", "TF32"};

static double rel_l2(const float *a, const float *ref, int64_t n, double *max_abs) {
    double num = 0, den = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        mx = fabs(d) > mx ? fabs(d) : mx;
    }
    *max_abs = mx;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int main(int argc, char **argv) {
    if (h3_cuda_device_count() == 0) {
        printf("bench_audio_vae_cuda: skipped: no CUDA device\n");
        return 0;
    }
    int64_t T = 207;
    int reps = 20, cpu = 1, modes[3] = {1, 0, 0};
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--latents") && i + 1 < argc) T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-cpu")) cpu = 0;
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--math") && i + 1 < argc) {
            const char *s = argv[++i];
            modes[0] = !strcmp(s, "exact") || !strcmp(s, "all");
            modes[1] = !strcmp(s, "f32") || !strcmp(s, "all");
            modes[2] = !strcmp(s, "tf32") || !strcmp(s, "all");
            if (!modes[0] && !modes[1] && !modes[2]) {
                fprintf(stderr, "--math takes exact, f32, tf32 or all\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: bench_audio_vae_cuda [--latents T] [--reps N] [--math exact|f32|tf32|all] "
                            "[--no-cpu] [--dir DIR]\n");
            return 2;
        }
    }
    if (T < 1 || T > 100000 || reps < 1 || reps > 1000) {
        fprintf(stderr, "--latents takes 1..100000, --reps 1..1000\n");
        return 2;
    }
    modes[0] = 1; /* exact f32 always runs: it is what h3run runs, and the others are compared with it */
    char path[1024];
    snprintf(path, sizeof path, "%s/h3_audio_vae_release_%d.safetensors", dir, (int)getpid());
    double t0 = now();
    write_release_model(path);
    printf("release-size audio VAE decoder written to %s in %.1f s\n", path, now() - t0);

    h3_exec ex;
    TRY(h3_exec_init(&ex, 0));
    TRY(h3_cuda_init(&ex, 0, 0));
    char gpu[256] = "?";
    h3_cuda_device_info(0, gpu, sizeof gpu, NULL, NULL);
    h3_audio_vae *v;
    h3_audio_vae_opts o = {.act_place = H3_PLACE_DEVICE};
    TRY(h3_audio_vae_open(path, &o, &v));
    const h3_audio_vae_config *c = h3_audio_vae_get_config(v);
    const int64_t S = T * c->hop, n = 2 * S;
    h3_audio_vae_mem m;
    TRY(h3_audio_vae_decode_peak(c, T, 2, &m));
    h3_tensor z, y[3], yc = {0};
    int64_t sz[3] = {2, c->latent_channels, T}, sy[3] = {2, 1, S};
    TRY(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 3, sz, H3_MEM_ACTIVATIONS));
    for (int64_t i = 0; i < h3_tensor_numel(&z); i++) /* latents of unit spread, as the DiT produces them */
        ((float *)z.data)[i] = (float)(1.7320508 * (2.0 * h3_random_unit(777, (uint64_t)i) - 1.0));
    for (int k = 0; k < 3; k++) TRY(h3_tensor_alloc(&y[k], H3_PLACE_HOST, H3_F32, 3, sy, H3_MEM_ACTIVATIONS));

    /* the first decode uploads the weights; the peak then is weights + buffers + the largest op scratch */
    int64_t used0, peak, used1;
    h3_cuda_mem_stats(&ex, &used0, NULL, NULL);
    h3_cuda_reset_peak(&ex);
    t0 = now();
    TRY(h3_audio_vae_decode(v, &ex, &z, &y[0]));
    const double first_s = now() - t0;
    h3_cuda_mem_stats(&ex, &used1, &peak, NULL);
    const int64_t first_peak = peak - used0;
    TRY(h3_audio_vae_decode(v, &ex, &z, &y[0])); /* warm-up */

    h3_cuda_event_h e0, e1;
    TRY(h3_cuda_event_create(&e0, 1));
    TRY(h3_cuda_event_create(&e1, 1));
    h3_cuda_stream_h cs = h3_cuda_compute_stream(&ex);
    double *times[3];
    for (int k = 0; k < 3; k++) times[k] = calloc((size_t)reps, sizeof(double));
    for (int k = 0; k < 3; k++) /* a warm-up per arithmetic: its GEMM plans */
        if (modes[k]) {
            h3_cuda_conv_set_math(H3_CONV_1D, (h3_conv_math)k);
            TRY(h3_audio_vae_decode(v, &ex, &z, &y[k]));
        }
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 3; k++) {
            if (!modes[k]) continue;
            h3_cuda_conv_set_math(H3_CONV_1D, (h3_conv_math)k);
            TRY(h3_cuda_event_record(e0, cs));
            TRY(h3_audio_vae_decode(v, &ex, &z, &y[k]));
            TRY(h3_cuda_event_record(e1, cs));
            TRY(h3_cuda_event_sync(e1));
            double ms;
            TRY(h3_cuda_event_elapsed_ms(e0, e1, &ms));
            times[k][r] = ms / 1000.0;
        }
    h3_cuda_conv_set_math(H3_CONV_1D, H3_CONV_EXACT);
    h3_cuda_reset_peak(&ex);
    h3_cuda_mem_stats(&ex, &used0, NULL, NULL);
    TRY(h3_audio_vae_decode(v, &ex, &z, &y[0]));
    h3_cuda_mem_stats(&ex, &used1, &peak, NULL);
    const int64_t warm_peak = peak - used0;

    /* where the time goes: one profiled decode (each op waits for the device before and after) */
    memset(ex.prof_s, 0, sizeof ex.prof_s);
    memset(ex.prof_n, 0, sizeof ex.prof_n);
    ex.profile = 1;
    t0 = now();
    TRY(h3_audio_vae_decode(v, &ex, &z, &y[0]));
    const double prof_wall = now() - t0;
    ex.profile = 0;
    printf("\none profiled decode (ops serialized, %.1f ms in all):\n", prof_wall * 1e3);
    for (int op = 0; op < H3_OP_COUNT; op++)
        if (ex.prof_n[op])
            printf("  %-18s %5lld calls  %8.2f ms\n", h3_op_name((h3_op_id)op), (long long)ex.prof_n[op],
                   ex.prof_s[op] * 1e3);

    /* the CPU decode of the same latents: the reference */
    double cpu_s = 0, err_cpu = -1, max_cpu = 0, err_m[3] = {0}, max_m[3] = {0};
    if (cpu) {
        h3_audio_vae *vc;
        TRY(h3_audio_vae_open(path, NULL, &vc));
        TRY(h3_tensor_alloc(&yc, H3_PLACE_HOST, H3_F32, 3, sy, H3_MEM_ACTIVATIONS));
        t0 = now();
        TRY(h3_audio_vae_decode(vc, &ex, &z, &yc));
        cpu_s = now() - t0;
        h3_audio_vae_close(vc);
        err_cpu = rel_l2(y[0].data, yc.data, n, &max_cpu);
    }
    for (int k = 1; k < 3; k++)
        if (modes[k]) err_m[k] = rel_l2(y[k].data, y[0].data, n, &max_m[k]);
    int64_t clamped = 0;
    double rms = 0;
    for (int64_t i = 0; i < n; i++) {
        float s = ((float *)y[0].data)[i];
        clamped += fabsf(s) >= 1.0f;
        rms += (double)s * s;
    }
    rms = sqrt(rms / (double)n);

    printf("\naudio VAE decode on %s: latents [2, %d, %lld] -> waveform [2, 1, %lld] (%.2f s of stereo at %d Hz)\n",
           gpu, c->latent_channels, (long long)T, (long long)S, (double)S / c->sample_rate, c->sample_rate);
    printf("output: rms %.4f, %lld of %lld samples clamped to +-1\n", rms, (long long)clamped, (long long)n);
    printf("first decode (uploads the %.1f MiB of f32 weights): %.3f s\n", m.dev_weights / 1048576.0, first_s);
    printf("device memory: first decode peak %.1f MiB (plan %.1f MiB: weights %.1f + buffers %.1f + op scratch "
           "%.1f)%s; warm decode %.1f MiB over the weights (plan %.1f)%s\n",
           first_peak / 1048576.0, m.dev_total / 1048576.0, m.dev_weights / 1048576.0, m.dev_buffers / 1048576.0,
           m.dev_op_scratch / 1048576.0, first_peak == m.dev_total ? "" : "  MISMATCH", warm_peak / 1048576.0,
           (m.dev_buffers + m.dev_op_scratch) / 1048576.0,
           warm_peak == m.dev_buffers + m.dev_op_scratch ? "" : "  MISMATCH");
    if (cpu)
        printf("CPU decode (%d threads): %.2f s; GPU (exact f32) vs CPU: rel L2 %.2e, max abs %.2e\n", ex.threads,
               cpu_s, err_cpu, max_cpu);
    printf("\n| arithmetic | median s | min s | max s | vs exact f32 (rel L2 / max abs) |\n|---|---|---|---|---|\n");
    double med[3] = {0};
    for (int k = 0; k < 3; k++) {
        if (!modes[k]) continue;
        qsort(times[k], (size_t)reps, sizeof(double), cmp_double);
        med[k] = times[k][reps / 2];
        printf("| %s | %.4f | %.4f | %.4f | ", g_math_names[k], med[k], times[k][0], times[k][reps - 1]);
        if (k) printf("%.2e / %.2e |\n", err_m[k], max_m[k]);
        else printf("- |\n");
    }
    const char *out = getenv("OUT");
    if (out) {
        char p[1024];
        snprintf(p, sizeof p, "%s/audio_vae_cuda.json", out);
        FILE *js = fopen(p, "w");
        if (js) {
            fprintf(js, "{\"gpu\": \"%s\", \"latents\": [2, %d, %lld], \"reps\": %d, \"first_decode_s\": %.6f,\n",
                    gpu, c->latent_channels, (long long)T, reps, first_s);
            fprintf(js, " \"device_peak_first\": %lld, \"device_plan\": %lld, \"device_peak_warm\": %lld,\n",
                    (long long)first_peak, (long long)m.dev_total, (long long)warm_peak);
            fprintf(js, " \"cpu_s\": %.6f, \"gpu_vs_cpu_rel_l2\": %.3e, \"gpu_vs_cpu_max_abs\": %.3e,\n", cpu_s,
                    err_cpu, max_cpu);
            fprintf(js, " \"modes\": {");
            int first = 1;
            for (int k = 0; k < 3; k++) {
                if (!modes[k]) continue;
                fprintf(js, "%s\"%s\": {\"median_s\": %.6f, \"min_s\": %.6f, \"max_s\": %.6f, \"rel_l2_vs_exact\": "
                            "%.3e}",
                        first ? "" : ", ", g_math_names[k], med[k], times[k][0], times[k][reps - 1], err_m[k]);
                first = 0;
            }
            fprintf(js, "}}\n");
            fclose(js);
        }
    }
    int bad = first_peak != m.dev_total || warm_peak != m.dev_buffers + m.dev_op_scratch ||
              (cpu && !(err_cpu <= 1e-4));
    for (int k = 0; k < 3; k++) free(times[k]);
    for (int k = 0; k < 3; k++) h3_tensor_free(&y[k]);
    h3_tensor_free(&yc);
    h3_tensor_free(&z);
    h3_cuda_event_destroy(e0);
    h3_cuda_event_destroy(e1);
    h3_audio_vae_close(v);
    h3_cuda_shutdown(&ex);
    h3_exec_free(&ex);
    unlink(path);
    if (bad) printf("FAILED: device memory off the plan, or the GPU decode more than 1e-4 off the CPU's\n");
    return bad;
}

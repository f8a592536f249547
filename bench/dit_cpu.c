/* The DiT at full width on the CPU: the released shapes (hidden 5376, 56 heads × 128, FFN 14336, text 5120,
 * full AdaLN) with 2 blocks and the 2 refiner blocks, random bf16 weights (fp32 islands as released) made in
 * memory, one forward over a packed sequence of S rows (default 1,000: text 128, stereo audio 2 × 36, video 4
 * frames × 200).
 *
 * usage: bench_dit_cpu [threads] [rows]     (defaults: all CPUs, 1000)
 * Prints the AdaLN precomputation time, the forward time with the modulation precomputed and with it computed
 * inside the forward, the GEMM FLOP rate, and peak memory (the allocator's counters and the process's VmHWM).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "models/dit.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long vm_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) v = atol(line + n + 1);
    if (f) fclose(f);
    return v;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* uniform in [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* Uniform values with the spread of a 1/sqrt(fan_in) init (norm weights near 1), in the tensor's dtype. */
static int fill(const char *name, h3_tensor *t, void *user) {
    (void)user;
    int64_t n = h3_tensor_numel(t), cols = h3_tensor_cols(t);
    int norm = strstr(name, "norm") != NULL;
    float a = t->ndim == 2 ? sqrtf(3.0f / (float)cols) : 0.1f;
    for (int64_t i = 0; i < n; i++) {
        float v = norm ? 1.0f + 0.1f * urand() : a * urand();
        if (t->dtype == H3_BF16)
            ((uint16_t *)t->data)[i] = h3_f32_to_bf16(v);
        else
            ((float *)t->data)[i] = v;
    }
    return 0;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    int64_t S = argc > 2 ? atoll(argv[2]) : 1000;
    const int64_t L = 128, Na = 72, Nv = S - L - Na;
    if (Nv < 1) {
        fprintf(stderr, "rows must exceed %lld\n", (long long)(L + Na));
        return 2;
    }
    h3_exec ex;
    if (h3_exec_init(&ex, threads) != H3_OK) return 1;
    h3_dit_config c;
    h3_dit_config_default(&c);
    c.n_layers = 2;
    h3_dit *dit = NULL;
    double t0 = now();
    if (h3_dit_create(&c, H3_BF16, NULL, &dit) != H3_OK) {
        fprintf(stderr, "%s\n", h3_last_error());
        return 1;
    }
    h3_dit_visit_weights(dit, fill, NULL);
    h3_dit_weight_bytes wb;
    h3_dit_weight_bytes_of(dit, &wb);
    printf("DiT %s\n", h3_dit_describe(dit));
    printf("weights: %.3f GB (AdaLN %.3f GB), made in %.1f s; threads %d\n", wb.total / 1e9, wb.adaln / 1e9,
           now() - t0, ex.threads);

    /* Packed sequence [text | audio (2 channels) | video frames], positions by the release's rules. */
    h3_tensor video, audio, text, vout, aout;
    h3_tensor_alloc2(&video, H3_PLACE_HOST, H3_F32, Nv, h3_dit_video_dim(&c), H3_MEM_ACTIVATIONS);
    h3_tensor_alloc2(&audio, H3_PLACE_HOST, H3_F32, Na, c.audio_dim, H3_MEM_ACTIVATIONS);
    h3_tensor_alloc2(&text, H3_PLACE_HOST, H3_F32, L, c.text_dim, H3_MEM_ACTIVATIONS);
    h3_tensor_alloc2(&vout, H3_PLACE_HOST, H3_F32, Nv, h3_dit_video_dim(&c), H3_MEM_ACTIVATIONS);
    h3_tensor_alloc2(&aout, H3_PLACE_HOST, H3_F32, Na, c.audio_dim, H3_MEM_ACTIVATIONS);
    h3_tensor *rows[3] = {&video, &audio, &text};
    for (int k = 0; k < 3; k++)
        for (int64_t i = 0; i < h3_tensor_numel(rows[k]); i++) ((float *)rows[k]->data)[i] = 1.7f * urand();
    int32_t *tags = malloc((size_t)S * 4), *tidx = malloc((size_t)S * 4), *vi = malloc((size_t)Nv * 4),
            *ai = malloc((size_t)Na * 4), *ti = malloc((size_t)L * 4);
    double *pos = calloc((size_t)S * 3, sizeof(double));
    float ts[2] = {0.62f, 0.867f}; /* target video, target audio */
    int64_t r = 0;
    for (int64_t i = 0; i < L; i++, r++) {
        ti[i] = (int32_t)r;
        tags[r] = 1;
        tidx[r] = 0;
        pos[r * 3] = (double)i;
    }
    for (int64_t i = 0; i < Na; i++, r++) {
        ai[i] = (int32_t)r;
        tags[r] = 2;
        tidx[r] = 1;
        pos[r * 3] = (double)L + (double)(i % (Na / 2));
        pos[r * 3 + 2] = i < Na / 2 ? 0.5 : 31.5;
    }
    for (int64_t i = 0; i < Nv; i++, r++) {
        const int64_t per_frame = 200, w = 20;
        int64_t f = i / per_frame, p = i % per_frame;
        vi[i] = (int32_t)r;
        tags[r] = 0;
        tidx[r] = 0;
        pos[r * 3] = (double)L + (f ? 5.0 / 3.0 + (double)(f - 1) * 20.0 / 3.0 : 0.0);
        pos[r * 3 + 1] = 8.0 + 1.6 * (double)(p / w);
        pos[r * 3 + 2] = 1.0 + 1.6 * (double)(p % w);
    }
    h3_dit_inputs in = {&video, &audio, &text, ts, 2, S, tidx, tags, pos, vi, ai, ti};

    double flop = 2.0 * (double)S * (double)c.n_layers * 385.36e6 + 2.0 * (double)L * 2 * 385.36e6 +
                  4.0 * (double)S * (double)S * 7168.0 * (double)c.n_layers + 4.0 * L * L * 7168.0 * 2;
    h3_mem_reset_peaks();
    t0 = now();
    if (h3_dit_forward(dit, &ex, &in, &vout, &aout) != H3_OK) {
        fprintf(stderr, "forward: %s\n", h3_last_error());
        return 1;
    }
    double t_first = now() - t0;
    /* The forward above computed and kept the modulation of its 2 timesteps; this one reads it. */
    t0 = now();
    if (h3_dit_forward(dit, &ex, &in, &vout, &aout) != H3_OK) {
        fprintf(stderr, "forward: %s\n", h3_last_error());
        return 1;
    }
    double t_fwd = now() - t0;
    h3_mem_stats ms; /* peaks of the two forwards */
    h3_mem_get_stats(&ms);
    long hwm_kb = vm_kb("VmHWM:");
    t0 = now();
    float sched[100];
    for (int i = 0; i < 100; i++) sched[i] = (float)i / 99.0f;
    if (h3_dit_precompute_modulation(dit, &ex, sched, 100) != H3_OK) {
        fprintf(stderr, "precompute: %s\n", h3_last_error());
        return 1;
    }
    double t_pre = now() - t0;
    /* The GEMM rate of this machine at the block's largest shape (fc1 of DiT block 0), for scale. */
    double t_gemm = 0, gemm_flop = 0;
    {
        const h3_dit_block_weights *bw;
        h3_tensor x, y;
        h3_tensor_alloc2(&x, H3_PLACE_HOST, H3_F32, S, c.hidden, H3_MEM_ACTIVATIONS);
        h3_tensor_alloc2(&y, H3_PLACE_HOST, H3_F32, S, 2 * c.ffn, H3_MEM_ACTIVATIONS);
        for (int64_t i = 0; i < h3_tensor_numel(&x); i++) ((float *)x.data)[i] = urand();
        h3_dit_block_acquire(dit, &ex, (int)c.n_refiner_layers, &bw);
        t0 = now();
        h3_op_gemm(&ex, &y, &x, &bw->fc1, NULL, 0);
        t_gemm = now() - t0;
        h3_dit_block_release(dit, &ex, (int)c.n_refiner_layers);
        gemm_flop = 2.0 * (double)S * (double)(2 * c.ffn) * (double)c.hidden;
        h3_tensor_free(&x);
        h3_tensor_free(&y);
    }
    double vsum = 0;
    for (int64_t i = 0; i < h3_tensor_numel(&vout); i++) vsum += fabs(((float *)vout.data)[i]);
    int64_t ws = h3_dit_workspace_bytes(dit, S, L, Nv, Na);

    printf("sequence: %lld rows (text %lld, audio %lld, video %lld), 2 timesteps; mean |v| %.3f\n",
           (long long)S, (long long)L, (long long)Na, (long long)Nv, vsum / (double)h3_tensor_numel(&vout));
    printf("%-52s %10s\n", "what", "seconds");
    printf("%-52s %10.2f\n", "forward, AdaLN modulation computed inside", t_first);
    printf("%-52s %10.2f   (%.0f GFLOP/s)\n", "forward, modulation precomputed", t_fwd, flop / t_fwd / 1e9);
    printf("%-52s %10.2f\n", "precompute the modulation of 100 timesteps", t_pre);
    printf("%-52s %10.2f   (%.0f GFLOP/s)\n", "one GEMM at fc1's shape, for scale", t_gemm,
           gemm_flop / t_gemm / 1e9);
    printf("peak host memory during the forwards (allocator): total %.3f GB = weights %.3f + activations "
           "%.3f + workspace %.3f + other "
           "%.3f\n",
           ms.total_peak / 1e9, ms.peak[H3_MEM_WEIGHTS] / 1e9, ms.peak[H3_MEM_ACTIVATIONS] / 1e9,
           ms.peak[H3_MEM_WORKSPACE] / 1e9, ms.peak[H3_MEM_OTHER] / 1e9);
    printf(
        "forward workspace (predicted by h3_dit_workspace_bytes): %.3f GB; kept modulation of 100 timesteps "
        "%.1f MB\n",
        ws / 1e9, h3_dit_modulation_bytes(&c, 100) / 1e6);
    printf("process VmHWM after the forwards %.3f GB (the whole run: %.3f GB)\n", hwm_kb / 1e6 * 1.024,
           vm_kb("VmHWM:") / 1e6 * 1.024);
    FILE *la = fopen("/proc/loadavg", "r");
    char load[64] = "?";
    if (la && fgets(load, sizeof load, la)) load[strcspn(load, "\n")] = 0;
    if (la) fclose(la);
    printf("load average during the run (other work on this machine slows it): %s\n", load);
    free(tags);
    free(tidx);
    free(vi);
    free(ai);
    free(ti);
    free(pos);
    h3_tensor *all[] = {&video, &audio, &text, &vout, &aout};
    for (int k = 0; k < 5; k++) h3_tensor_free(all[k]);
    h3_dit_close(dit);
    h3_exec_free(&ex);
    return 0;
}

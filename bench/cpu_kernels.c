/* CPU kernel throughput at DiT-like shapes: GEMM with each weight format, attention, norms.
 * usage: bench_cpu_kernels [threads] [M]      (defaults: all CPUs, M = 2048 rows)
 * Prints one table; GFLOP/s counts 2·M·N·K for a GEMM and 4·S²·H·D for attention. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "tensor/ops.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Random values of realistic magnitude in the tensor's own format (random bit patterns would include
 * denormals and NaNs, which slow f32 arithmetic down by orders of magnitude and are not what weights hold). */
static void fill(h3_tensor *t) {
    uint32_t s = 12345;
    size_t n = (size_t)h3_tensor_numel(t);
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float v = ((float)(s >> 8) / 16777216.0f - 0.5f);
        switch (t->dtype) {
            case H3_F32: ((float *)t->data)[i] = v; break;
            case H3_BF16: ((uint16_t *)t->data)[i] = h3_f32_to_bf16(v); break;
            case H3_F16: ((uint16_t *)t->data)[i] = h3_f32_to_f16(v); break;
            case H3_I8: ((int8_t *)t->data)[i] = (int8_t)(v * 250.0f); break;
            case H3_F8_E4M3: ((uint8_t *)t->data)[i] = h3_f32_to_fp8e4m3(v * 100.0f); break;
            default: break;
        }
    }
}

static double median3(double a, double b, double c) {
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    int64_t M = argc > 2 ? atoll(argv[2]) : 2048, N = 5376, K = 5376;
    h3_exec ex;
    if (h3_exec_init(&ex, threads) != H3_OK) return 1;
    printf("threads %d, M %lld\n", ex.threads, (long long)M);
    h3_tensor x, y, w;
    h3_tensor_alloc2(&x, H3_PLACE_HOST, H3_F32, M, K, H3_MEM_ACTIVATIONS);
    h3_tensor_alloc2(&y, H3_PLACE_HOST, H3_F32, M, N, H3_MEM_ACTIVATIONS);
    fill(&x);
    const h3_dtype dts[] = {H3_F32, H3_BF16, H3_F16, H3_I8, H3_F8_E4M3};
    printf("%-34s %10s %12s\n", "kernel", "ms", "GFLOP/s");
    for (int d = 0; d < 5; d++) {
        h3_tensor_alloc2(&w, H3_PLACE_HOST, dts[d], N, K, H3_MEM_WEIGHTS);
        fill(&w);
        float *sc = NULL;
        if (dts[d] == H3_I8) {
            sc = malloc((size_t)N * sizeof(float));
            for (int64_t i = 0; i < N; i++) sc[i] = 0.01f;
            w.q.mode = H3_SCALE_ROW;
            w.q.scales = sc;
        } else if (dts[d] == H3_F8_E4M3) {
            w.q.mode = H3_SCALE_TENSOR;
            w.q.scale = 0.01f;
        }
        double t[3];
        h3_op_gemm(&ex, &y, &x, &w, NULL, 0); /* warm-up */
        for (int r = 0; r < 3; r++) {
            double t0 = now();
            if (h3_op_gemm(&ex, &y, &x, &w, NULL, 0) != H3_OK) {
                fprintf(stderr, "%s\n", h3_last_error());
                return 1;
            }
            t[r] = now() - t0;
        }
        double tm = median3(t[0], t[1], t[2]);
        char name[64];
        snprintf(name, sizeof name, "gemm %lldx%lldx%lld %s w", (long long)M, (long long)N, (long long)K,
                 h3_dtype_name(dts[d]));
        printf("%-34s %10.1f %12.1f\n", name, tm * 1e3, 2.0 * M * N * K / tm * 1e-9);
        h3_tensor_free(&w);
        free(sc);
    }
    /* attention: 1000 rows, 56 heads x 128 */
    int64_t S = 1000, H = 56, D = 128, sh[3] = {S, H, D};
    h3_tensor q, k, v, o;
    h3_tensor_alloc(&q, H3_PLACE_HOST, H3_F32, 3, sh, H3_MEM_ACTIVATIONS);
    h3_tensor_alloc(&k, H3_PLACE_HOST, H3_F32, 3, sh, H3_MEM_ACTIVATIONS);
    h3_tensor_alloc(&v, H3_PLACE_HOST, H3_F32, 3, sh, H3_MEM_ACTIVATIONS);
    h3_tensor_alloc(&o, H3_PLACE_HOST, H3_F32, 3, sh, H3_MEM_ACTIVATIONS);
    fill(&q);
    fill(&k);
    fill(&v);
    double ta[3];
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        h3_op_attention(&ex, &o, &q, &k, &v, 1.0f / sqrtf((float)D), 0);
        ta[r] = now() - t0;
    }
    double tm = median3(ta[0], ta[1], ta[2]);
    printf("%-34s %10.1f %12.1f\n", "attention S1000 H56 D128", tm * 1e3, 4.0 * S * S * H * D / tm * 1e-9);
    /* rms norm over the GEMM output: bandwidth-bound */
    double tr[3];
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        h3_op_rms_norm(&ex, &y, &y, NULL, 1e-5f);
        tr[r] = now() - t0;
    }
    tm = median3(tr[0], tr[1], tr[2]);
    printf("%-34s %10.1f %12.1f GB/s\n", "rms_norm 2048x5376 in place", tm * 1e3, 2.0 * 4 * M * N / tm * 1e-9);
    h3_tensor_free(&x);
    h3_tensor_free(&y);
    h3_tensor_free(&q);
    h3_tensor_free(&k);
    h3_tensor_free(&v);
    h3_tensor_free(&o);
    h3_exec_free(&ex);
    return 0;
}

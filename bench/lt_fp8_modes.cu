/* What cuBLASLt's fp8 GEMM offers on this GPU at the DiT's W124 shapes (tokens 19,412; QKV, out, fc1, fc2):
 * one scale per operand against a vector per operand (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: one scale
 * per weight row and one per token), each with and without fast accumulation
 * (CUBLASLT_MATMUL_DESC_FAST_ACCUM). Prints each mode's time (median of 20), TFLOP/s, whether the heuristic
 * has an algorithm at all, and how far its output is from the per-tensor, promoted-accumulation GEMM's (the
 * vector mode's against that output times a_i · b_j). Standalone (no h3run code): nvcc -O2 -o lt_fp8_modes
 * bench/lt_fp8_modes.cu -lcublasLt; tests/gpu/run.sh lt-fp8. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                                \
    do {                                                                                                     \
        cudaError_t e_ = (x);                                                                                \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                                         \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

__global__ void k_fill_fp8(__nv_fp8_storage_t *p, size_t n, unsigned seed, float amp) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        const float u = (h & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
        p[i] = __nv_cvt_float_to_fp8(u * amp, __NV_SATFINITE, __NV_E4M3);
    }
}

__global__ void k_fill_f32(float *p, int n, unsigned seed) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 16;
        p[i] = 0.5f + 1.5f * (h & 0xffff) / 65536.0f;
    }
}

/* sum of (y - ref·a_n·b_m)² and of (ref·a_n·b_m)², in double: y, ref [M tokens, N] row-major */
__global__ void k_diff(const __nv_bfloat16 *y, const __nv_bfloat16 *ref, const float *a, const float *b,
                       int64_t M, int64_t N, double *acc) {
    double d = 0, r = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < M * N;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / N, n = i % N;
        const double e = (double)__bfloat162float(ref[i]) * (a ? a[n] : 1.0f) * (b ? b[m] : 1.0f);
        const double v = __bfloat162float(y[i]);
        d += (v - e) * (v - e);
        r += e * e;
    }
    atomicAdd(&acc[0], d);
    atomicAdd(&acc[1], r);
}

static cublasLtHandle_t lt;
static void *ws;
static const size_t ws_size = 64u << 20;

/* one GEMM y[M, N] = x[M, K] · w[N, K]ᵀ as h3run's cuda_gemm lays it out; returns ms (median of 20), < 0 when
 * cuBLASLt has no algorithm or fails */
static float run(int outer, int fast, int64_t M, int64_t N, int64_t K, const void *w, const void *x,
                 const float *sa, const float *sb, __nv_bfloat16 *y, int algo_i = 0, int *n_algos = NULL) {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int32_t mode =
        outer ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    int8_t fa = (int8_t)fast;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa, sizeof fa);
    cublasStatus_t s1 =
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
    cublasStatus_t s2 =
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, N, K);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, M, K);
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N);
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t wss = ws_size;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wss, sizeof wss);
    cublasLtMatmulHeuristicResult_t all[8], res;
    int n = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 8, all, &n);
    if (n_algos) *n_algos = n;
    float ms = -1;
    if (algo_i >= n)
        n = 0;
    else
        res = all[algo_i];
    if (s1 || s2 || hs || n == 0) {
        printf("    (no algorithm: set mode %d/%d, heuristic %d, %d results)\n", (int)s1, (int)s2, (int)hs,
               n);
    } else {
        const float one = 1, zero = 0;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        float t[20];
        cublasStatus_t r = CUBLAS_STATUS_SUCCESS;
        for (int i = 0; i < 23 && r == CUBLAS_STATUS_SUCCESS; i++) {
            cudaEventRecord(e0);
            r = cublasLtMatmul(lt, op, &one, w, la, x, lb, &zero, y, lc, y, lc, &res.algo, ws, ws_size, 0);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            if (i >= 3) cudaEventElapsedTime(&t[i - 3], e0, e1);
        }
        if (r != CUBLAS_STATUS_SUCCESS) {
            printf("    (matmul failed: status %d)\n", (int)r);
        } else {
            for (int i = 0; i < 20; i++)
                for (int j = i + 1; j < 20; j++)
                    if (t[j] < t[i]) {
                        float s = t[i];
                        t[i] = t[j];
                        t[j] = s;
                    }
            ms = (t[9] + t[10]) / 2;
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    return ms;
}

static double diff(const __nv_bfloat16 *y, const __nv_bfloat16 *ref, const float *a, const float *b,
                   int64_t M, int64_t N, double *acc) {
    double h[2];
    CK(cudaMemset(acc, 0, 2 * sizeof(double)));
    k_diff<<<1024, 256>>>(y, ref, a, b, M, N, acc);
    CK(cudaMemcpy(h, acc, sizeof h, cudaMemcpyDeviceToHost));
    return sqrt(h[0] / (h[1] > 0 ? h[1] : 1));
}

int main(int argc, char **argv) {
    const int64_t M = argc > 1 ? atoll(argv[1]) : 19412;
    const int64_t shapes[4][2] = {{21504, 5376}, {5376, 7168}, {28672, 5376}, {5376, 14336}};
    const char *names[4] = {"qkv", "out", "fc1", "fc2"};
    cublasLtCreate(&lt);
    CK(cudaMalloc(&ws, ws_size));
    double *acc;
    CK(cudaMalloc(&acc, 2 * sizeof(double)));
    printf("cuBLASLt %zu, tokens %lld\n", cublasLtGetVersion(), (long long)M);
    double flop_all = 0, t_all[4] = {0, 0, 0, 0};
    for (int s = 0; s < 4; s++) {
        const int64_t N = shapes[s][0], K = shapes[s][1];
        void *w, *x;
        float *sa, *sb, *sa2, *sb2, *s1;
        __nv_bfloat16 *y[4];
        CK(cudaMalloc(&w, N * K));
        CK(cudaMalloc(&x, M * K));
        CK(cudaMalloc(&sa, N * 4));
        CK(cudaMalloc(&sb, M * 4));
        CK(cudaMalloc(&sa2, N * 4));
        CK(cudaMalloc(&sb2, M * 4));
        CK(cudaMalloc(&s1, 4));
        for (int i = 0; i < 4; i++) CK(cudaMalloc(&y[i], M * N * 2));
        k_fill_fp8<<<1024, 256>>>((__nv_fp8_storage_t *)w, N * K, 1234u + s, 400.0f);
        k_fill_fp8<<<1024, 256>>>((__nv_fp8_storage_t *)x, M * K, 777u + s, 400.0f);
        k_fill_f32<<<(N + 255) / 256, 256>>>(sa, (int)N, 5u); /* factors in [0.5, 2) */
        k_fill_f32<<<(M + 255) / 256, 256>>>(sb, (int)M, 9u);
        { /* the scalar runs scale both operands by 1/64 (products of ±400 over K stay in bf16's range); the
           * vector runs by factor/64, so theirs is the scalar output times sa[n]·sb[m] */
            const float h1 = 1.0f / 64.0f;
            float *ha = (float *)malloc(N * 4), *hb = (float *)malloc(M * 4);
            CK(cudaMemcpy(s1, &h1, 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(ha, sa, N * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hb, sb, M * 4, cudaMemcpyDeviceToHost));
            for (int64_t i = 0; i < N; i++) ha[i] *= h1;
            for (int64_t i = 0; i < M; i++) hb[i] *= h1;
            CK(cudaMemcpy(sa2, ha, N * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(sb2, hb, M * 4, cudaMemcpyHostToDevice));
            free(ha);
            free(hb);
        }
        const double flop = 2.0 * M * N * K;
        flop_all += flop;
        printf("%s: N %lld K %lld\n", names[s], (long long)N, (long long)K);
        float ms[4];
        for (int mode = 0; mode < 4; mode++) {
            const int outer = mode >= 2, fast = mode & 1;
            ms[mode] = outer ? run(1, fast, M, N, K, w, x, sa2, sb2, y[mode])
                             : run(0, fast, M, N, K, w, x, s1, s1, y[mode]);
            CK(cudaDeviceSynchronize());
            const double e = ms[mode] < 0 ? -1
                             : mode == 0  ? 0
                             : outer      ? diff(y[mode], y[0], sa, sb, M, N, acc)
                                          : diff(y[mode], y[0], NULL, NULL, M, N, acc);
            printf("  %-6s %-5s %8.3f ms %7.0f TFLOP/s  off scalar+promoted %.2e\n",
                   outer ? "vector" : "scalar", fast ? "fast" : "exact", ms[mode],
                   ms[mode] > 0 ? flop / ms[mode] / 1e9 : 0.0, e);
            if (ms[mode] > 0) t_all[mode] += ms[mode];
        }
        { /* the heuristic's other algorithms, vector scales and fast accumulation */
            int na = 0;
            run(1, 1, M, N, K, w, x, sa2, sb2, y[3], 0, &na);
            for (int i = 1; i < na; i++) {
                const float t = run(1, 1, M, N, K, w, x, sa2, sb2, y[3], i);
                printf("  vector fast, the heuristic's algorithm %d of %d: %8.3f ms %7.0f TFLOP/s\n", i + 1,
                       na, t, t > 0 ? flop / t / 1e9 : 0.0);
            }
        }
        { /* h3run's chunks of rows through a 128 MiB scratch: as they fall, and of equal size */
            const int64_t mc = ((128ll << 20) - 512 - ((N * 4 + 127) / 128) * 128 - 128) / (K + 4);
            if (mc < M) {
                const int64_t nch = (M + mc - 1) / mc, eq = (M + nch - 1) / nch;
                float t_fall = 0, t_eq = 0;
                for (int64_t m0 = 0; m0 < M; m0 += mc)
                    t_fall += run(1, 1, M - m0 < mc ? M - m0 : mc, N, K, w, x, sa2, sb2, y[3]);
                for (int64_t m0 = 0; m0 < M; m0 += eq)
                    t_eq += run(1, 1, M - m0 < eq ? M - m0 : eq, N, K, w, x, sa2, sb2, y[3]);
                printf("  vector fast in chunks of at most %lld rows: %.3f ms as they fall, %.3f ms in %lld "
                       "of %lld\n",
                       (long long)mc, t_fall, t_eq, (long long)nch, (long long)eq);
            }
        }
        for (int i = 0; i < 4; i++) cudaFree(y[i]);
        cudaFree(w);
        cudaFree(x);
        cudaFree(sa);
        cudaFree(sb);
        cudaFree(sa2);
        cudaFree(sb2);
        cudaFree(s1);
    }
    printf("block's four GEMMs: scalar exact %.3f ms, scalar fast %.3f, vector exact %.3f, vector fast %.3f "
           "(%.0f / %.0f / %.0f / %.0f TFLOP/s)\n",
           t_all[0], t_all[1], t_all[2], t_all[3], flop_all / t_all[0] / 1e9, flop_all / t_all[1] / 1e9,
           flop_all / t_all[2] / 1e9, flop_all / t_all[3] / 1e9);
    return 0;
}

/* fp8 attention's probability rule (tensor/ops.h "H3_ATTN_FP8"), against the alternatives it was chosen from.
 * usage: bench_fp8_p_code
 * Rules for p = 2^x, x = s − max + 8 ≤ 8: "e4m3(exp2)" rounds an exact exp2 to e4m3 (the rule before the
 * codes); "code c" takes the e4m3 code round(8x + 56 + c), i.e. 2^f as 1 + f with the error shifted by c (the
 * shipped rule has c = H3_ATTN_FP8_CODE_SHIFT). Prints, for each rule, the rms relative error of p over x
 * uniform in [−6, 8] (its mean factor removed: l sums the same values, so a common factor cancels), and the
 * relative L2 off exact attention of one head (64 queries, 4,096 keys, head size 128, q, k, v uniform in
 * ±amp: scores of a few units at amp 3) with only P quantized, so the table isolates the probability's share
 * of fp8's error. Deterministic. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tensor/dtype.h"
#include "tensor/ops.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static double rule(int r, double shift, double x) {
    if (r == 0) return h3_fp8e4m3_to_f32(h3_f32_to_fp8e4m3((float)exp2(x)));
    const double c = nearbyint(8 * x + 56 + shift);
    return c > 0 ? h3_fp8e4m3_to_f32((uint8_t)fmin(c, 126)) : 0;
}

int main(void) {
    const double shifts[] = {0, -0.125, -0.25, -0.375, -0.5};
    const int nr = 1 + (int)(sizeof shifts / sizeof shifts[0]);
    printf("%-22s %12s %14s %14s %14s\n", "rule", "p rms off", "amp 1", "amp 3", "amp 5");
    enum { N = 4096, D = 128, M = 64 };
    double *q = malloc(sizeof(double) * M * D), *k = malloc(sizeof(double) * N * D);
    double *v = malloc(sizeof(double) * N * D), *s = malloc(sizeof(double) * N);
    double *ex = malloc(sizeof(double) * M * D), *o = malloc(sizeof(double) * D);
    if (!q || !k || !v || !s || !ex || !o) return 1;
    double err[8][3] = {{0}};
    for (int ai = 0; ai < 3; ai++) {
        const double amp = 1 + 2 * ai;
        for (int i = 0; i < M * D; i++) q[i] = amp * (2 * urand() - 1);
        for (int i = 0; i < N * D; i++) k[i] = amp * (2 * urand() - 1), v[i] = amp * (2 * urand() - 1);
        double nrm = 0;
        for (int r = -1; r < nr; r++) /* r = -1: exact */
            for (int i = 0; i < M; i++) {
                double mx = -INFINITY, l = 0;
                for (int j = 0; j < N; j++) {
                    double d = 0;
                    for (int c = 0; c < D; c++) d += q[i * D + c] * k[j * D + c];
                    s[j] = d / sqrt((double)D) * M_LOG2E;
                    mx = fmax(mx, s[j]);
                }
                for (int c = 0; c < D; c++) o[c] = 0;
                for (int j = 0; j < N; j++) {
                    const double x = s[j] - mx + 8, p = r < 0 ? exp2(x) : rule(r, r ? shifts[r - 1] : 0, x);
                    l += p;
                    for (int c = 0; c < D; c++) o[c] += p * v[j * D + c];
                }
                for (int c = 0; c < D; c++) {
                    o[c] /= l;
                    if (r < 0) {
                        ex[i * D + c] = o[c];
                        nrm += o[c] * o[c];
                    } else
                        err[r][ai] += (o[c] - ex[i * D + c]) * (o[c] - ex[i * D + c]);
                }
            }
        for (int r = 0; r < nr; r++) err[r][ai] = sqrt(err[r][ai] / nrm);
    }
    for (int r = 0; r < nr; r++) {
        double sum = 0, sum2 = 0;
        const int n = 1000000;
        for (int i = 0; i < n; i++) {
            const double x = -6 + 14 * urand(), f = rule(r, r ? shifts[r - 1] : 0, x) / exp2(x);
            sum += f;
            sum2 += f * f;
        }
        const double mu = sum / n;
        char name[32];
        if (r)
            snprintf(name, sizeof name, "code %+.3f%s", shifts[r - 1],
                     shifts[r - 1] == H3_ATTN_FP8_CODE_SHIFT ? " (used)" : "");
        else
            snprintf(name, sizeof name, "e4m3(exp2)");
        printf("%-22s %11.2f%% %14.3e %14.3e %14.3e\n", name, 100 * sqrt(sum2 / n / (mu * mu) - 1), err[r][0],
               err[r][1], err[r][2]);
    }
    free(q), free(k), free(v), free(s), free(ex), free(o);
    return 0;
}

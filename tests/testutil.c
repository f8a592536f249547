#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "h3run.h"

int t_failures;
uint64_t t_seed;
static uint64_t g_state;
static const char *g_case;

void t_fail_at(const char *file, int line, const char *fmt, ...) {
    const char *f = strrchr(file, '/');
    fprintf(stderr, "FAIL [%s] %s:%d: ", g_case ? g_case : "?", f ? f + 1 : file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    t_failures++;
}

void t_fail_cond(const char *file, int line, const char *cond) {
    const char *f = strrchr(file, '/');
    fprintf(stderr, "FAIL [%s] %s:%d: CHECK(%s) ", g_case ? g_case : "?", f ? f + 1 : file, line, cond);
    t_failures++;
}

void t_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

void t_check_err(const char *file, int line, const char *expr, h3_status got, int code, const char *needle) {
    if (got != code) {
        t_fail_at(file, line, "%s returned %d (%s), expected %d (%s); message: %s", expr, got, h3_code_name(got), code,
                  h3_code_name(code), h3_last_error());
        return;
    }
    if (needle && !strstr(h3_last_error(), needle))
        t_fail_at(file, line, "%s: message '%s' does not mention '%s'", expr, h3_last_error(), needle);
}

uint64_t t_rand_u64(void) {
    /* splitmix64 */
    uint64_t z = (g_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double t_uniform(double lo, double hi) {
    return lo + (hi - lo) * ((double)(t_rand_u64() >> 11) / 9007199254740992.0);
}

double t_randn(void) {
    double u1 = t_uniform(1e-300, 1.0), u2 = t_uniform(0.0, 1.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void t_fill_uniform(float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)t_uniform(lo, hi);
}

void t_fill_randn(float *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(t_randn() * scale);
}

double t_rel_err(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        if (isnan(a[i])) return INFINITY;
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (den == 0) return sqrt(num);
    return sqrt(num / den);
}

double t_max_abs_err(const float *a, const double *ref, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (isnan(a[i])) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

double t_expect_close(const char *file, int line, const char *what, const float *a, const double *ref, size_t n,
                      double tol) {
    double e = t_rel_err(a, ref, n);
    if (!(e <= tol))
        t_fail_at(file, line, "%s: relative error %.3e > tolerance %.1e (max abs %.3e over %zu values)", what, e, tol,
                  t_max_abs_err(a, ref, n), n);
    else if (getenv("H3_TEST_VERBOSE"))
        fprintf(stderr, "  ok %-48s rel err %.3e (tol %.0e)\n", what, e, tol);
    return e;
}

const char *t_src_path(const char *rel, char *buf, size_t n) {
    const char *root = getenv("H3_SOURCE_DIR");
    snprintf(buf, n, "%s/%s", root ? root : "..", rel);
    return buf;
}

const char *t_tmp_path(const char *name, char *buf, size_t n) {
    const char *root = getenv("H3_BUILD_DIR");
    snprintf(buf, n, "%s/test-tmp-%d-%s", root ? root : ".", (int)getpid(), name);
    return buf;
}

int t_main(const char *suite, const t_case *cases, int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *env = getenv("H3_TEST_SEED");
    t_seed = env ? strtoull(env, NULL, 0) : ((uint64_t)time(NULL) * 1000003u) ^ (uint64_t)getpid();
    g_state = t_seed;
    printf("%s: seed %llu (replay with H3_TEST_SEED=%llu)\n", suite, (unsigned long long)t_seed,
           (unsigned long long)t_seed);
    const char *filter = argc > 1 ? argv[1] : NULL;
    int ran = 0;
    for (const t_case *c = cases; c->name; c++) {
        if (filter && !strstr(c->name, filter)) continue;
        g_case = c->name;
        int before = t_failures;
        h3_clear_error();
        clock_t t0 = clock();
        c->fn();
        double dt = (double)(clock() - t0) / CLOCKS_PER_SEC;
        printf("%s %-40s (%.2fs cpu)\n", t_failures == before ? "ok  " : "FAIL", c->name, dt);
        ran++;
    }
    g_case = NULL;
    if (ran == 0) {
        fprintf(stderr, "%s: no test matches '%s'\n", suite, filter ? filter : "");
        return 1;
    }
    printf("%s: %d cases, %d failures\n", suite, ran, t_failures);
    return t_failures ? 1 : 0;
}

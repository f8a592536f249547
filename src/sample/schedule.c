#include "sample/schedule.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

static const char *const g_sched_names[H3_SCHEDULER_COUNT] = {"h3", "simple", "sgm_uniform", "beta",
                                                              "normal"};

const char *h3_scheduler_name(h3_scheduler s) {
    return (unsigned)s < H3_SCHEDULER_COUNT ? g_sched_names[s] : "?";
}

h3_status h3_scheduler_parse(const char *name, h3_scheduler *out) {
    for (int i = 0; i < H3_SCHEDULER_COUNT; i++)
        if (name && !strcmp(name, g_sched_names[i])) {
            *out = (h3_scheduler)i;
            return H3_OK;
        }
    return H3_ERR(H3_ERR_INVALID, "unknown scheduler '%s': choose h3, simple, sgm_uniform, beta or normal",
                  name ? name : "");
}

float h3_shift_sigma_f32(float sigma, float shift) {
    float num = shift * sigma;
    float den = 1.0f + (shift - 1.0f) * sigma;
    return num / den;
}

float h3_time_shift_sigma_f32(float sigma, float from_shift, float to_shift) {
    float base = sigma / (from_shift + sigma * (1.0f - from_shift));
    return h3_shift_sigma_f32(base, to_shift);
}

/* ---- Beta distribution: regularized incomplete beta by its continued fraction, inverse by bisection
 * ---------- */

/* I_x(a, b) for x < (a+1)/(a+b+2), where the continued fraction (DLMF 8.17.22) converges fast. */
static double ibeta_cf(double x, double a, double b) {
    const double tiny = 1e-300;
    double lfront = a * log(x) + b * log1p(-x) - (lgamma(a) + lgamma(b) - lgamma(a + b));
    double f = 1.0, c = 1.0, d = 0.0;
    for (int i = 0; i < 1000; i++) {
        double num;
        int m = i / 2;
        if (i == 0)
            num = 1.0;
        else if (i & 1)
            num = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1));
        else
            num = (m * (b - m) * x) / ((a + 2 * m - 1) * (a + 2 * m));
        d = 1.0 + num * d;
        if (fabs(d) < tiny) d = tiny;
        d = 1.0 / d;
        c = 1.0 + num / c;
        if (fabs(c) < tiny) c = tiny;
        double cd = c * d;
        f *= cd;
        if (fabs(1.0 - cd) < 1e-16) break;
    }
    return exp(lfront) / a * (f - 1.0);
}

static double beta_cdf(double x, double a, double b) {
    if (x <= 0.0) return 0.0;
    if (x >= 1.0) return 1.0;
    if (x < (a + 1.0) / (a + b + 2.0)) return ibeta_cf(x, a, b);
    return 1.0 - ibeta_cf(1.0 - x, b, a);
}

double h3_beta_ppf(double p, double a, double b) {
    if (!(p > 0.0)) return 0.0;
    if (p >= 1.0) return 1.0;
    double lo = 0.0, hi = 1.0;
    for (int it = 0; it < 200; it++) {
        double mid = 0.5 * (lo + hi);
        if (mid <= lo || mid >= hi) break;
        if (beta_cdf(mid, a, b) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* ---- grids
 * ----------------------------------------------------------------------------------------------------- */

/* torch.linspace(start, end, n) on float32 as its elementwise definition states: step = (end - start)/(n -
 * 1), the first half counted up from start, the second half down from end. */
static void linspace_f32(float start, float end, int n, float *out) {
    if (n == 1) {
        out[0] = start;
        return;
    }
    float step = (end - start) / (float)(n - 1);
    int half = n / 2;
    for (int i = 0; i < n; i++) out[i] = i < half ? start + step * (float)i : end - step * (float)(n - i - 1);
}

/* ComfyUI's ModelSamplingDiscreteFlow table: sigma_k = shift((k+1)/1000) for k = 0..999, float32 steps
 * t = (k+1)/1000, timestep = t*1000, sigma = shift(timestep/1000). */
static void comfy_table(float shift, float *tab /* [1000] */) {
    for (int k = 0; k < 1000; k++) {
        float t = (float)(k + 1) / 1000.0f;
        float ts = t * 1000.0f;
        tab[k] = h3_shift_sigma_f32(ts / 1000.0f, shift);
    }
}

static int unique_consecutive(float *v, int n) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || v[i] != v[m - 1]) v[m++] = v[i];
    return m;
}

void h3_schedule_free(h3_schedule *s) {
    if (!s) return;
    h3_free(s->sigma_v);
    h3_free(s->sigma_a);
    h3_free(s->t_v);
    h3_free(s->t_a);
    memset(s, 0, sizeof *s);
}

h3_status h3_schedule_make(h3_scheduler kind, int steps, double shift_v, double shift_a, h3_schedule *out) {
    memset(out, 0, sizeof *out);
    if ((unsigned)kind >= H3_SCHEDULER_COUNT)
        return H3_ERR(H3_ERR_INVALID, "unknown scheduler %d", (int)kind);
    if (steps < 1 || steps > H3_MAX_STEPS)
        return H3_ERR(H3_ERR_INVALID, "steps (model calls) must be between 1 and %d; got %d", H3_MAX_STEPS,
                      steps);
    if (!(shift_v > 0.0) || !(shift_a > 0.0) || !isfinite(shift_v) || !isfinite(shift_a))
        return H3_ERR(H3_ERR_INVALID, "sigma shifts must be positive; got video %g, audio %g", shift_v,
                      shift_a);
    h3_status st = H3_OK;
    float *tab = NULL;
    const int cap = steps + 1;
    out->kind = kind;
    out->shift_v = shift_v;
    out->shift_a = shift_a;
    out->sigma_v = h3_malloc((size_t)cap * sizeof(float), H3_MEM_OTHER);
    out->sigma_a = h3_malloc((size_t)cap * sizeof(float), H3_MEM_OTHER);
    out->t_v = h3_malloc((size_t)cap * sizeof(float), H3_MEM_OTHER);
    out->t_a = h3_malloc((size_t)cap * sizeof(float), H3_MEM_OTHER);
    if (!out->sigma_v || !out->sigma_a || !out->t_v || !out->t_a)
        H3_FAIL(H3_ERR_NOMEM, "out of memory for a schedule");
    const float sv = (float)shift_v, sa = (float)shift_a;
    int n = 0;
    if (kind == H3_SCHEDULER_H3) {
        linspace_f32(1.0f, 0.0f, cap, out->sigma_v);
        for (int i = 0; i < cap; i++) {
            float base = out->sigma_v[i];
            out->sigma_v[i] = h3_shift_sigma_f32(base, sv);
            out->sigma_a[i] = h3_shift_sigma_f32(base, sa);
        }
        n = unique_consecutive(out->sigma_v, cap);
        int na = unique_consecutive(out->sigma_a, cap);
        if (n != na)
            H3_FAIL(H3_ERR_INVALID,
                    "%d steps collapse the float32 sigma grids to %d video and %d audio points; use fewer",
                    steps, n - 1, na - 1);
    } else {
        tab = h3_malloc(1000 * sizeof(float), H3_MEM_OTHER);
        if (!tab) H3_FAIL(H3_ERR_NOMEM, "out of memory for a schedule");
        comfy_table(sv, tab);
        switch (kind) {
            case H3_SCHEDULER_SIMPLE: {
                double ss = 1000.0 / (double)steps;
                for (int x = 0; x < steps; x++) out->sigma_v[n++] = tab[999 - (int)((double)x * ss)];
                break;
            }
            case H3_SCHEDULER_SGM_UNIFORM:
            case H3_SCHEDULER_NORMAL: {
                float start = tab[999] * 1000.0f, end = tab[0] * 1000.0f;
                int m = kind == H3_SCHEDULER_SGM_UNIFORM ? steps + 1 : steps;
                linspace_f32(start, end, m, out->t_v); /* scratch */
                for (int x = 0; x < steps; x++)
                    out->sigma_v[n++] = h3_shift_sigma_f32(out->t_v[x] / 1000.0f, sv);
                break;
            }
            case H3_SCHEDULER_BETA: {
                double last = -1.0;
                for (int x = 0; x < steps; x++) {
                    double p = 1.0 - (double)x * (1.0 / (double)steps);
                    double t = nearbyint(h3_beta_ppf(p, 0.6, 0.6) * 999.0);
                    if (t != last) out->sigma_v[n++] = tab[(int)t];
                    last = t;
                }
                break;
            }
            default:
                H3_FAIL(H3_ERR_INTERNAL, "unhandled scheduler");
        }
        out->sigma_v[n++] = 0.0f;
        for (int i = 0; i < n; i++) out->sigma_a[i] = h3_time_shift_sigma_f32(out->sigma_v[i], sv, sa);
    }
    for (int i = 0; i + 1 < n; i++)
        if (!(out->sigma_v[i + 1] < out->sigma_v[i]) || !(out->sigma_a[i + 1] < out->sigma_a[i]))
            H3_FAIL(H3_ERR_INVALID, "the %s schedule with %d steps is not strictly decreasing at step %d",
                    h3_scheduler_name(kind), steps, i);
    out->n = n;
    for (int i = 0; i + 1 < n; i++) {
        out->t_v[i] = 1.0f - out->sigma_v[i];
        out->t_a[i] = 1.0f - out->sigma_a[i];
    }
done:
    h3_free(tab);
    if (st != H3_OK) h3_schedule_free(out);
    return st;
}

void h3_schedule_tail(const h3_schedule *s, int calls, h3_schedule *view) {
    const int total = s->n - 1;
    if (calls < 1) calls = 1;
    if (calls > total) calls = total;
    const int k = total - calls;
    *view = *s;
    view->n = calls + 1;
    view->sigma_v = s->sigma_v + k;
    view->sigma_a = s->sigma_a + k;
    view->t_v = s->t_v + k;
    view->t_a = s->t_a + k;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int h3_schedule_distinct_timesteps(const h3_schedule *sch, float *out) {
    const int steps = sch->n - 1;
    int nu = 0;
    for (int i = 0; i < steps; i++) out[nu++] = sch->t_v[i], out[nu++] = sch->t_a[i];
    qsort(out, (size_t)nu, sizeof *out, cmp_float);
    int k = 0;
    for (int i = 0; i < nu; i++)
        if (k == 0 || out[i] != out[k - 1]) out[k++] = out[i];
    return k;
}

int h3_schedule_distinct_count(h3_scheduler kind, int steps) {
    h3_schedule sch;
    if (h3_schedule_make(kind, steps, H3_SHIFT_VIDEO, H3_SHIFT_AUDIO, &sch) != H3_OK) return -1;
    float *t = h3_malloc((size_t)2 * (size_t)sch.n * sizeof(float) + 8, H3_MEM_OTHER);
    int n = t ? h3_schedule_distinct_timesteps(&sch, t) : -1;
    if (!t) H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_free(t);
    h3_schedule_free(&sch);
    return n;
}

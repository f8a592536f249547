/* Step caching (cache.h): EasyCache's rule around the sampler's model call. The model here writes H3's
 * data-ward velocity v = -u (u: the usual noise-ward velocity EasyCache is written for); the norms and changes
 * are the same for either sign, and a skipped call answers the last computed v. */
#include "sample/cache.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"

h3_status h3_cache_opts_check(const h3_cache_opts *o) {
    if (!(o->threshold > 0 && o->threshold <= 10))
        return H3_ERR(H3_ERR_INVALID, "the cache threshold takes a number above 0, at most 10; got %g",
                      o->threshold);
    if (!(o->start >= 0 && o->start < o->end && o->end <= 1))
        return H3_ERR(H3_ERR_INVALID, "the cache window takes 0 <= start < end <= 1; got %g to %g", o->start,
                      o->end);
    return H3_OK;
}

h3_status h3_step_cache_init(h3_step_cache *c, const h3_cache_opts *o, h3_model_fn model, void *model_ctx,
                             size_t nv, size_t na, int n_calls, int first_call) {
    memset(c, 0, sizeof *c);
    H3_TRY(h3_cache_opts_check(o));
    c->o = *o;
    c->model = model;
    c->model_ctx = model_ctx;
    c->nv = nv;
    c->na = na;
    c->n_calls = n_calls;
    c->call = first_call;
    const size_t n = nv + na + 1;
    c->x_prev = h3_malloc(n * sizeof(float), H3_MEM_ACTIVATIONS);
    c->u_prev = h3_malloc(n * sizeof(float), H3_MEM_ACTIVATIONS);
    if (!c->x_prev || !c->u_prev) {
        h3_step_cache_free(c);
        return H3_ERR(H3_ERR_NOMEM, "out of memory for the step cache (2 x %zu floats)", n);
    }
    return H3_OK;
}

void h3_step_cache_free(h3_step_cache *c) {
    h3_free(c->x_prev);
    h3_free(c->u_prev);
    c->x_prev = c->u_prev = NULL;
}

/* mean |s·a - b| over n floats */
static double mean_abs_diff(const float *a, const float *b, size_t n, float s) {
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += fabs((double)(s * a[i] - b[i]));
    return n ? sum / (double)n : 0;
}

h3_status h3_step_cache_model(void *ctx, const float *xv, const float *xa, float tv, float ta, float *vv,
                              float *va) {
    h3_step_cache *c = ctx;
    const int i = c->call++;
    const size_t n[2] = {c->nv, c->na}, off[2] = {0, c->nv};
    const float *x[2] = {xv, xa};
    float *v[2] = {vv, va};
    const double frac = c->n_calls > 0 ? (double)i / c->n_calls : 1.0;
    c->st.calls++;
    if (frac >= c->o.end) return c->model(c->model_ctx, xv, xa, tv, ta, vv, va); /* past the window */
    const int window = frac >= c->o.start;
    double in_change[2] = {-1, -1};
    if (window && c->have_prev) {
        int skip = c->have_k;
        double est[2] = {0, 0};
        for (int s = 0; s < 2; s++) { /* each stream's own estimate: both must stay below the threshold */
            in_change[s] = mean_abs_diff(x[s], c->x_prev + off[s], n[s], 1.0f);
            if (!n[s] || !c->have_k) continue;
            est[s] = c->u_norm[s] > 0 ? c->k[s] * in_change[s] / c->u_norm[s] : 0;
            c->acc[s] += est[s];
            if (!(c->acc[s] < c->o.threshold)) skip = 0;
        }
        if (skip) { /* skipped: the last computed call's velocity */
            for (int s = 0; s < 2; s++)
                for (size_t j = 0; j < n[s]; j++) v[s][j] = -c->u_prev[off[s] + j];
            c->st.skipped++;
            for (int s = 0; s < 2; s++) {
                c->st.est_total += est[s];
                if (c->acc[s] > c->st.est_max) c->st.est_max = c->acc[s];
            }
            return H3_OK;
        }
        c->acc[0] = c->acc[1] = 0;
    }
    H3_TRY(c->model(c->model_ctx, xv, xa, tv, ta, vv, va));
    if (c->have_prev && window) { /* the rate at which each output follows its input, measured */
        for (int s = 0; s < 2; s++)
            c->k[s] = in_change[s] > 0 ? mean_abs_diff(v[s], c->u_prev + off[s], n[s], -1.0f) / in_change[s] : 0;
        c->have_k = 1;
    }
    for (int s = 0; s < 2; s++) {
        double un = 0;
        for (size_t j = 0; j < n[s]; j++) {
            c->x_prev[off[s] + j] = x[s][j];
            c->u_prev[off[s] + j] = -v[s][j];
            un += fabs((double)v[s][j]);
        }
        c->u_norm[s] = n[s] ? un / (double)n[s] : 0;
    }
    c->have_prev = 1;
    return H3_OK;
}

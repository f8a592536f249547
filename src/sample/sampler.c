#include "sample/sampler.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"

static const char *const g_sampler_names[H3_SAMPLER_COUNT] = {"euler", "res_multistep", "dpmpp_2m"};

const char *h3_sampler_name(h3_sampler s) {
    return (unsigned)s < H3_SAMPLER_COUNT ? g_sampler_names[s] : "?";
}

h3_status h3_sampler_parse(const char *name, h3_sampler *out) {
    for (int i = 0; i < H3_SAMPLER_COUNT; i++)
        if (name && !strcmp(name, g_sampler_names[i])) {
            *out = (h3_sampler)i;
            return H3_OK;
        }
    return H3_ERR(H3_ERR_INVALID, "unknown sampler '%s': choose euler, res_multistep or dpmpp_2m",
                  name ? name : "");
}

static h3_status call_model(const h3_sample_args *a, const float *xv, const float *xa, float tv, float ta,
                            float *vv, float *va, int step) {
    h3_status st = a->model(a->model_ctx, xv, xa, tv, ta, vv, va);
    if (st != H3_OK) return h3_error_wrap(st, "model call %d of %d", step + 1, a->schedule->n - 1);
    return H3_OK;
}

static h3_status report_step(const h3_sample_args *a, int step) {
    if (!a->on_step) return H3_OK;
    return a->on_step(a->step_ctx, step + 1, a->schedule->n - 1);
}

/* One stream of diffusers' MiniMaxH3Scheduler.step in float32: x0 = x + (1 - t)*v, x = r*x + (1 - r)*x0. */
static void h3_euler_stream(float *x, const float *v, size_t n, float t, float sigma, float sigma_next) {
    const float s_t = 1.0f - t;
    const float r = sigma_next / sigma;
    const float q = 1.0f - r;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i] + s_t * v[i];
        float a = r * x[i];
        float b = q * x0;
        x[i] = a + b;
    }
}

static h3_status sample_h3_euler(const h3_sample_args *a, float *video, size_t nv, float *audio, size_t na) {
    const h3_schedule *s = a->schedule;
    h3_status st = H3_OK;
    float *buf = h3_malloc((nv + na) * sizeof(float) + 64, H3_MEM_ACTIVATIONS);
    if (!buf)
        return H3_ERR(H3_ERR_NOMEM, "out of memory for the sampler's velocity buffers (%zu floats)", nv + na);
    float *vv = buf, *va = buf + nv;
    for (int i = a->start_step; i + 1 < s->n; i++) {
        H3_CHECK(call_model(a, video, audio, s->t_v[i], s->t_a[i], vv, va, i));
        h3_euler_stream(video, vv, nv, s->t_v[i], s->sigma_v[i], s->sigma_v[i + 1]);
        h3_euler_stream(audio, va, na, s->t_a[i], s->sigma_a[i], s->sigma_a[i + 1]);
        H3_CHECK(report_step(a, i));
    }
done:
    h3_free(buf);
    return st;
}

/* ComfyUI's k-diffusion samplers on the joint state (x_video, y), y the carried audio (see sampler.h). */
static h3_status sample_k(const h3_sample_args *a, float *video, size_t nv, float *audio, size_t na) {
    const h3_schedule *s = a->schedule;
    const size_t n = nv + na;
    const int multistep = a->sampler != H3_SAMPLER_EULER;
    const double scale = s->shift_v / s->shift_a; /* clean end of the carried audio: scale * x0_audio */
    h3_status st = H3_OK;
    size_t nbuf = (multistep ? 2 * n : n) + na;
    float *buf = h3_malloc(nbuf * sizeof(float) + 64, H3_MEM_ACTIVATIONS);
    if (!buf) return H3_ERR(H3_ERR_NOMEM, "out of memory for the sampler's buffers (%zu floats)", nbuf);
    float *den = buf; /* [n]: velocities, then denoised values (video, then carried audio) */
    float *old = multistep ? buf + n : NULL;   /* [n]: the previous step's denoised values */
    float *xa = buf + (multistep ? 2 * n : n); /* [na]: the audio latent the model sees */
    int have_old = 0;

    /* Noise scaling at the first sigma (the latent image is zero); or latents noised already, whose audio
     * the sampler carries as (sigma_v/sigma_a)*x_audio. */
    const float s0 = s->sigma_v[0];
    if (a->from_latent) {
        const float carry0 = (float)((double)s->sigma_v[0] / (double)s->sigma_a[0]);
        for (size_t i = 0; i < na; i++) audio[i] *= carry0;
    } else if (s0 != 1.0f) {
        for (size_t i = 0; i < nv; i++) video[i] *= s0;
        for (size_t i = 0; i < na; i++) audio[i] *= s0;
    }
    for (int i = 0; i + 1 < s->n; i++) {
        const double sig = s->sigma_v[i], sig_next = s->sigma_v[i + 1];
        const double sig_a = s->sigma_a[i];
        const float carry = (float)(sig_a / sig);
        for (size_t k = 0; k < na; k++) xa[k] = audio[k] * carry;
        H3_CHECK(call_model(a, video, xa, s->t_v[i], s->t_a[i], den, den + nv, i));
        for (size_t k = 0; k < nv; k++) den[k] = (float)((double)video[k] + sig * (double)den[k]);
        for (size_t k = 0; k < na; k++)
            den[nv + k] = (float)(scale * ((double)xa[k] + sig_a * (double)den[nv + k]));

        /* The joint state is the two arrays back to back in meaning: element k < nv is video[k], else
         * audio[k-nv]. */
        const int first_order = !have_old || sig_next == 0.0 || a->sampler == H3_SAMPLER_EULER;
        if (first_order) {
            /* Euler: x + d*(sigma_next - sigma), d = (x - D)/sigma. */
            const double dt = sig_next - sig;
            for (size_t k = 0; k < n; k++) {
                float *x = k < nv ? &video[k] : &audio[k - nv];
                double d = ((double)*x - (double)den[k]) / sig;
                *x = (float)((double)*x + d * dt);
            }
        } else {
            const double sig_prev = s->sigma_v[i - 1];
            const double h = log(sig / sig_next);      /* t_next - t with t = -log(sigma) */
            const double h_last = log(sig_prev / sig); /* t - t_prev */
            const double ratio = sig_next / sig;       /* exp(-h) */
            if (a->sampler == H3_SAMPLER_DPMPP_2M) {
                const double r = h_last / h;
                const double c_new = 1.0 + 1.0 / (2.0 * r), c_old = 1.0 / (2.0 * r);
                const double em1 = -expm1(-h);
                for (size_t k = 0; k < n; k++) {
                    float *x = k < nv ? &video[k] : &audio[k - nv];
                    double dd = c_new * (double)den[k] - c_old * (double)old[k];
                    *x = (float)(ratio * (double)*x + em1 * dd);
                }
            } else { /* res_multistep with eta = 0 */
                const double c2 =
                    -h_last / h; /* (t_prev - t_old)/h, t_old = t since sigma_down = sigma_next */
                const double phi1 = expm1(-h) / (-h);
                const double phi2 = (phi1 - 1.0) / (-h);
                const double b1 = phi1 - phi2 / c2, b2 = phi2 / c2;
                for (size_t k = 0; k < n; k++) {
                    float *x = k < nv ? &video[k] : &audio[k - nv];
                    *x = (float)(ratio * (double)*x + h * (b1 * (double)den[k] + b2 * (double)old[k]));
                }
            }
        }
        if (multistep) {
            float *t = old;
            old = den;
            den = t;
            have_old = 1;
        }
        H3_CHECK(report_step(a, i));
    }
    /* The carried audio ends at scale * x0. */
    for (size_t k = 0; k < na; k++) audio[k] = (float)((double)audio[k] / scale);
done:
    h3_free(buf);
    return st;
}

int h3_sample_resumable(h3_sampler sampler, h3_scheduler scheduler) {
    return sampler == H3_SAMPLER_EULER && scheduler == H3_SCHEDULER_H3;
}

h3_status h3_sample(const h3_sample_args *a, float *video, size_t n_video, float *audio, size_t n_audio) {
    if (!a || !a->schedule || !a->model)
        return H3_ERR(H3_ERR_INVALID, "h3_sample needs a schedule and a model");
    if ((unsigned)a->sampler >= H3_SAMPLER_COUNT)
        return H3_ERR(H3_ERR_INVALID, "unknown sampler %d", (int)a->sampler);
    const h3_schedule *s = a->schedule;
    if (s->n < 2 || s->sigma_v[s->n - 1] != 0.0f)
        return H3_ERR(H3_ERR_INVALID, "a schedule needs at least two sigmas and must end at 0");
    if ((n_video && !video) || (n_audio && !audio))
        return H3_ERR(H3_ERR_INVALID, "h3_sample: missing latent buffer");
    if (a->start_step < 0 || a->start_step >= s->n - 1 ||
        (a->start_step && !h3_sample_resumable(a->sampler, s->kind)))
        return H3_ERR(H3_ERR_INVALID, "h3_sample: cannot start at call %d of %d with %s on %s", a->start_step,
                      s->n - 1, h3_sampler_name(a->sampler), h3_scheduler_name(s->kind));
    if (s->kind == H3_SCHEDULER_H3 && a->sampler == H3_SAMPLER_EULER)
        return sample_h3_euler(a, video, n_video, audio, n_audio);
    return sample_k(a, video, n_video, audio, n_audio);
}

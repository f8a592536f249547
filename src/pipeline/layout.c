#include "pipeline/layout.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"

/* One aspect-normalised rotary axis: dim/2 coordinates (numpy linspace, endpoint excluded) scaled by 32. */
static void axis_grid(int64_t dim, double sqrt_area, double *out) {
    const double ratio = (double)dim / sqrt_area;
    const double left = (1.0 - ratio) / 2.0;
    const double stop = left + ratio;
    const int64_t n = dim / 2;
    const double step = (stop - left) / (double)n;
    for (int64_t i = 0; i < n; i++) {
        double y = (double)i * step;
        y += left;
        out[i] = y * 32.0;
    }
}

/* Text rows: t = row index, tagged text or as text_tags say. */
static void fill_text(h3_seq_layout *out, const uint8_t *text_tags) {
    double *p = out->pos;
    for (int64_t k = 0; k < out->text_len; k++) {
        out->tags[k] = text_tags ? text_tags[k] : (uint8_t)H3_TAG_TEXT;
        out->text_indices[k] = k;
        p[3 * k] = (double)k;
        p[3 * k + 1] = 0.0;
        p[3 * k + 2] = 0.0;
    }
}

void h3_seq_layout_free(h3_seq_layout *l) {
    if (!l) return;
    h3_free(l->tags);
    h3_free(l->pos);
    h3_free(l->video_indices);
    h3_free(l->cond_indices);
    h3_free(l->audio_indices);
    h3_free(l->text_indices);
    h3_free(l->ref_audio_indices);
    memset(l, 0, sizeof *l);
}

h3_status h3_seq_layout_sizes(int64_t text_len, int n_keyframes, int64_t frames, int64_t width,
                              int64_t height, h3_seq_layout *out) {
    memset(out, 0, sizeof *out);
    if (text_len < 0 || text_len > ((int64_t)1 << 30))
        return H3_ERR(H3_ERR_INVALID, "layout: text length %lld is out of range", (long long)text_len);
    if (!h3_frames_valid(frames) || frames > ((int64_t)1 << 24))
        return H3_ERR(H3_ERR_INVALID, "layout: frames must be 17n+5; got %lld", (long long)frames);
    if (!h3_canvas_valid(width, height))
        return H3_ERR(H3_ERR_INVALID,
                      "layout: width and height must be positive multiples of 32; got %lldx%lld",
                      (long long)width, (long long)height);
    if (n_keyframes < 0 || n_keyframes > H3_MAX_KEYFRAMES)
        return H3_ERR(H3_ERR_INVALID, "layout: %d keyframes; at most %d", n_keyframes, H3_MAX_KEYFRAMES);
    h3_geometry g;
    h3_geometry_of(text_len, frames, width, height, &g);
    out->text_len = text_len;
    out->frames = frames;
    out->width = width;
    out->height = height;
    out->latent_t = g.latent_t;
    out->latent_h = g.latent_h;
    out->latent_w = g.latent_w;
    out->audio_t = g.audio_t;
    out->n_video_rows = g.n_video_rows;
    out->n_audio_rows = g.n_audio_rows;
    out->n_keyframes = n_keyframes;
    out->n_cond_rows = (int64_t)n_keyframes * (g.latent_h / 2) * (g.latent_w / 2);
    out->cond_start = text_len;
    out->audio_start = text_len + out->n_cond_rows;
    out->video_start = out->audio_start + out->n_audio_rows;
    out->seq_len = out->video_start + out->n_video_rows;
    return H3_OK;
}

/* numpy's pairwise summation of a float64 array (add.reduce: 8 accumulators up to 128 values, halves above),
 * the order the reference sums the latent frames' spans in for the "last" anchor. */
static double pairwise_sum(const double *a, int64_t n) {
    if (n < 8) {
        double r = 0.0;
        for (int64_t i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        int64_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

static const int k_frames_per_latent[5] = {1, 4, 4, 4, 4};

double h3_keyframe_time(int64_t text_len, int64_t frames, int64_t f) {
    const double L = (double)text_len, span = 5.0 / 3.0;
    if (f <= 0) return L;
    if (f == frames - 1) {
        const int64_t lt = h3_video_latent_frames(frames);
        double spans[4352], total; /* H3_MAX_FRAMES (14400) has 4237 latent frames */
        if (lt > 0 && lt <= 4352) {
            for (int64_t g = 0; g < lt; g++) spans[g] = span * (double)k_frames_per_latent[g % 5];
            total = pairwise_sum(spans, lt);
        } else { /* beyond any trained length: the plain sum */
            total = 0.0;
            for (int64_t g = 0; g < lt; g++) total += span * (double)k_frames_per_latent[g % 5];
        }
        return L + total - span;
    }
    return L + span * (double)f;
}

h3_status h3_seq_layout_t2va(int64_t text_len, const uint8_t *text_tags, int64_t frames, int64_t width,
                             int64_t height, h3_seq_layout *out) {
    return h3_seq_layout_fl2va(text_len, text_tags, frames, width, height, 0, NULL, out);
}

h3_status h3_seq_layout_fl2va(int64_t text_len, const uint8_t *text_tags, int64_t frames, int64_t width,
                              int64_t height, int n_keyframes, const int64_t *kf_frames, h3_seq_layout *out) {
    H3_TRY(h3_seq_layout_sizes(text_len, n_keyframes, frames, width, height, out));
    for (int k = 0; k < n_keyframes; k++)
        if (kf_frames[k] < 0 || kf_frames[k] >= frames) {
            const int64_t f = kf_frames[k];
            memset(out, 0, sizeof *out);
            return H3_ERR(H3_ERR_INVALID, "layout: keyframe %d is at frame %lld, outside the clip's 0..%lld",
                          k + 1, (long long)f, (long long)(frames - 1));
        }
    const int64_t lt = out->latent_t, ph = out->latent_h / 2, pw = out->latent_w / 2, per_frame = ph * pw;
    const size_t S = (size_t)out->seq_len;
    h3_status st = H3_OK;
    double *hgrid = NULL, *wgrid = NULL;

    out->tags = h3_malloc(S + 1, H3_MEM_OTHER);
    out->pos = h3_malloc(S * 3 * sizeof(double) + 8, H3_MEM_OTHER);
    out->video_indices = h3_malloc((size_t)out->n_video_rows * sizeof(int64_t) + 8, H3_MEM_OTHER);
    out->audio_indices = h3_malloc((size_t)out->n_audio_rows * sizeof(int64_t) + 8, H3_MEM_OTHER);
    out->text_indices = h3_malloc((size_t)text_len * sizeof(int64_t) + 8, H3_MEM_OTHER);
    out->cond_indices = h3_malloc((size_t)out->n_cond_rows * sizeof(int64_t) + 8, H3_MEM_OTHER);
    hgrid = h3_malloc((size_t)ph * sizeof(double), H3_MEM_OTHER);
    wgrid = h3_malloc((size_t)pw * sizeof(double), H3_MEM_OTHER);
    if (!out->tags || !out->pos || !out->video_indices || !out->audio_indices || !out->text_indices ||
        !out->cond_indices || !hgrid || !wgrid)
        H3_FAIL(H3_ERR_NOMEM, "out of memory for the packed layout (%zu rows)", S);

    const double sqrt_area = sqrt((double)(out->latent_h * out->latent_w));
    axis_grid(out->latent_h, sqrt_area, hgrid);
    axis_grid(out->latent_w, sqrt_area, wgrid);

    double *p = out->pos;
    /* Text: t = row index. */
    fill_text(out, text_tags);
    /* Keyframes: one latent frame each on the target's grid, at its anchor's time. */
    for (int k = 0; k < n_keyframes; k++) {
        const double t = h3_keyframe_time(text_len, frames, kf_frames[k]);
        for (int64_t i = 0; i < ph; i++)
            for (int64_t j = 0; j < pw; j++) {
                const int64_t v = (int64_t)k * per_frame + i * pw + j, r = out->cond_start + v;
                out->tags[r] = H3_TAG_VIDEO;
                out->cond_indices[v] = r;
                p[3 * r] = t;
                p[3 * r + 1] = hgrid[i];
                p[3 * r + 2] = wgrid[j];
            }
    }
    /* Audio: channel-major; one rotary unit per latent from L; w pinned to the width grid's ends. */
    const double L = (double)text_len;
    for (int64_t c = 0; c < 2; c++)
        for (int64_t k = 0; k < out->audio_t; k++) {
            int64_t r = out->audio_start + c * out->audio_t + k;
            out->tags[r] = H3_TAG_AUDIO;
            out->audio_indices[c * out->audio_t + k] = r;
            p[3 * r] = L + (double)k;
            p[3 * r + 1] = 0.0;
            p[3 * r + 2] = c == 0 ? wgrid[0] : wgrid[pw - 1];
        }
    /* Video: frame-major, then patch rows, then patch columns; time = L + exclusive running sum of the spans.
     */
    double cum = 0.0;
    for (int64_t f = 0; f < lt; f++) {
        const double t = L + cum;
        cum += (5.0 / 3.0) * (double)k_frames_per_latent[f % 5];
        for (int64_t i = 0; i < ph; i++)
            for (int64_t j = 0; j < pw; j++) {
                int64_t v = f * per_frame + i * pw + j;
                int64_t r = out->video_start + v;
                out->tags[r] = H3_TAG_VIDEO;
                out->video_indices[v] = r;
                p[3 * r] = t;
                p[3 * r + 1] = hgrid[i];
                p[3 * r + 2] = wgrid[j];
            }
    }
done:
    h3_free(hgrid);
    h3_free(wgrid);
    if (st != H3_OK) h3_seq_layout_free(out);
    return st;
}

int h3_seq_layout_timestep_indices(const h3_seq_layout *l, float t_video, float t_audio, float unique_t[4],
                                   int32_t *index) {
    const float t_cond = t_video > H3_KEYFRAME_T ? t_video : H3_KEYFRAME_T;
    const float v[4] = {t_video, t_audio, t_cond, 1.0f};
    const int use[4] = {1, 1, l->n_cond_rows > 0, l->n_ref_audio_rows > 0};
    const int nv = 4;
    int n = 0;
    for (int i = 0; i < nv; i++) { /* sorted distinct values */
        if (!use[i]) continue;
        int seen = 0;
        for (int j = 0; j < n; j++) seen |= unique_t[j] == v[i];
        if (seen) continue;
        int at = n++;
        while (at > 0 && unique_t[at - 1] > v[i]) {
            unique_t[at] = unique_t[at - 1];
            at--;
        }
        unique_t[at] = v[i];
    }
    int32_t idx[4] = {0, 0, 0, 0};
    for (int i = 0; i < nv; i++)
        for (int j = 0; j < n; j++)
            if (use[i] && unique_t[j] == v[i]) idx[i] = j;
    for (int64_t r = 0; r < l->seq_len; r++) index[r] = idx[0];
    for (int64_t k = 0; k < l->n_audio_rows; k++) index[l->audio_indices[k]] = idx[1];
    for (int64_t k = 0; k < l->n_cond_rows; k++) index[l->cond_indices[k]] = idx[2];
    for (int64_t k = 0; k < l->n_ref_audio_rows; k++) index[l->ref_audio_indices[k]] = idx[3];
    return n;
}

void h3_ref_blocks_rows(int n_refs, const h3_ref_block *refs, int64_t *video_rows, int64_t *audio_rows) {
    int64_t v = 0, a = 0;
    for (int k = 0; k < n_refs; k++) {
        if (refs[k].kind != H3_REF_AUDIO) v += refs[k].lt * (refs[k].lh / 2) * (refs[k].lw / 2);
        if (refs[k].kind != H3_REF_IMAGE) a += 2 * refs[k].audio_t;
    }
    *video_rows = v;
    *audio_rows = a;
}

/* The (h, w) grids of an lh x lw latent: hg [lh/2], wg [lw/2]. */
static void frame_grids(int64_t lh, int64_t lw, double *hg, double *wg) {
    const double sqrt_area = sqrt((double)(lh * lw));
    axis_grid(lh, sqrt_area, hg);
    axis_grid(lw, sqrt_area, wg);
}

h3_status h3_seq_layout_ref2va(int64_t text_len, const uint8_t *text_tags, int64_t frames, int64_t width,
                               int64_t height, int n_refs, const h3_ref_block *refs, h3_seq_layout *out) {
    if (n_refs < 0 || n_refs > H3_MAX_REFS)
        return H3_ERR(H3_ERR_INVALID, "layout: %d references; at most %d", n_refs, H3_MAX_REFS);
    int64_t maxg = 1;
    for (int k = 0; k < n_refs; k++) {
        const h3_ref_block *b = &refs[k];
        const int vis = b->kind != H3_REF_AUDIO;
        if ((int)b->kind < 0 || b->kind > H3_REF_AUDIO || (vis && (b->lt < 1 || b->lh < 2 || b->lw < 2 ||
                                                                    b->lh % 2 || b->lw % 2 || b->lh > 4096 ||
                                                                    b->lw > 4096 || b->lt > 65536)) ||
            (b->kind == H3_REF_IMAGE && b->lt != 1) || b->audio_t < 0 || b->audio_t > ((int64_t)1 << 24) ||
            (b->kind == H3_REF_AUDIO && b->audio_t < 1))
            return H3_ERR(H3_ERR_INVALID, "layout: reference %d has an invalid geometry", k + 1);
        if (vis && b->lh / 2 > maxg) maxg = b->lh / 2;
        if (vis && b->lw / 2 > maxg) maxg = b->lw / 2;
    }
    H3_TRY(h3_seq_layout_sizes(text_len, 0, frames, width, height, out));
    int64_t rv = 0, ra = 0;
    h3_ref_blocks_rows(n_refs, refs, &rv, &ra);
    out->n_cond_rows = rv;
    out->n_ref_audio_rows = ra;
    out->audio_start = text_len + rv + ra;
    out->video_start = out->audio_start + out->n_audio_rows;
    out->seq_len = out->video_start + out->n_video_rows;
    const int64_t lt = out->latent_t, ph = out->latent_h / 2, pw = out->latent_w / 2;
    if (maxg < ph) maxg = ph;
    if (maxg < pw) maxg = pw;
    const size_t S = (size_t)out->seq_len;
    h3_status st = H3_OK;
    double *thg = NULL, *twg = NULL, *hg = NULL, *wg = NULL;
    out->tags = h3_malloc(S + 1, H3_MEM_OTHER);
    out->pos = h3_malloc(S * 3 * sizeof(double) + 8, H3_MEM_OTHER);
    out->video_indices = h3_malloc((size_t)out->n_video_rows * sizeof(int64_t) + 8, H3_MEM_OTHER);
    out->audio_indices = h3_malloc((size_t)out->n_audio_rows * sizeof(int64_t) + 8, H3_MEM_OTHER);
    out->text_indices = h3_malloc((size_t)text_len * sizeof(int64_t) + 8, H3_MEM_OTHER);
    out->cond_indices = h3_malloc((size_t)rv * sizeof(int64_t) + 8, H3_MEM_OTHER);
    out->ref_audio_indices = h3_malloc((size_t)ra * sizeof(int64_t) + 8, H3_MEM_OTHER);
    thg = h3_malloc((size_t)ph * sizeof(double), H3_MEM_OTHER);
    twg = h3_malloc((size_t)pw * sizeof(double), H3_MEM_OTHER);
    hg = h3_malloc((size_t)maxg * sizeof(double), H3_MEM_OTHER);
    wg = h3_malloc((size_t)maxg * sizeof(double), H3_MEM_OTHER);
    if (!out->tags || !out->pos || !out->video_indices || !out->audio_indices || !out->text_indices ||
        !out->cond_indices || !out->ref_audio_indices || !thg || !twg || !hg || !wg)
        H3_FAIL(H3_ERR_NOMEM, "out of memory for the packed layout (%zu rows)", S);
    frame_grids(out->latent_h, out->latent_w, thg, twg);
    double *p = out->pos;
    fill_text(out, text_tags);
    int64_t r = text_len, nvr = 0, nar = 0;
    double clock = (double)text_len;
    for (int k = 0; k < n_refs; k++) {
        const h3_ref_block *b = &refs[k];
        const int64_t bh = b->lh / 2, bw = b->lw / 2;
        if (b->kind != H3_REF_AUDIO) frame_grids(b->lh, b->lw, hg, wg);
        if (b->kind != H3_REF_IMAGE) { /* audio rows: the target's width grid for a clip, the video's for a soundtrack */
            const double wl = b->kind == H3_REF_AUDIO ? twg[0] : wg[0], wr = b->kind == H3_REF_AUDIO ? twg[pw - 1] : wg[bw - 1];
            for (int64_t c = 0; c < 2; c++)
                for (int64_t i = 0; i < b->audio_t; i++, r++) {
                    out->tags[r] = H3_TAG_AUDIO;
                    out->ref_audio_indices[nar++] = r;
                    p[3 * r] = clock + (double)i;
                    p[3 * r + 1] = 0.0;
                    p[3 * r + 2] = c == 0 ? wl : wr;
                }
        }
        double span = 0.0;
        if (b->kind != H3_REF_AUDIO)
            for (int64_t f = 0; f < b->lt; f++) {
                const double t = clock + span;
                span += (5.0 / 3.0) * (double)k_frames_per_latent[f % 5];
                for (int64_t i = 0; i < bh; i++)
                    for (int64_t j = 0; j < bw; j++, r++) {
                        out->tags[r] = H3_TAG_VIDEO;
                        out->cond_indices[nvr++] = r;
                        p[3 * r] = t;
                        p[3 * r + 1] = hg[i];
                        p[3 * r + 2] = wg[j];
                    }
            }
        if (b->kind == H3_REF_IMAGE)
            clock += 1.0;
        else if (b->kind == H3_REF_AUDIO)
            clock += (double)b->audio_t;
        else
            clock += (double)b->audio_t > span ? (double)b->audio_t : span;
    }
    for (int64_t c = 0; c < 2; c++)
        for (int64_t k = 0; k < out->audio_t; k++) {
            const int64_t q = out->audio_start + c * out->audio_t + k;
            out->tags[q] = H3_TAG_AUDIO;
            out->audio_indices[c * out->audio_t + k] = q;
            p[3 * q] = clock + (double)k;
            p[3 * q + 1] = 0.0;
            p[3 * q + 2] = c == 0 ? twg[0] : twg[pw - 1];
        }
    double cum = 0.0;
    for (int64_t f = 0; f < lt; f++) {
        const double t = clock + cum;
        cum += (5.0 / 3.0) * (double)k_frames_per_latent[f % 5];
        for (int64_t i = 0; i < ph; i++)
            for (int64_t j = 0; j < pw; j++) {
                const int64_t v = (f * ph + i) * pw + j, q = out->video_start + v;
                out->tags[q] = H3_TAG_VIDEO;
                out->video_indices[v] = q;
                p[3 * q] = t;
                p[3 * q + 1] = thg[i];
                p[3 * q + 2] = twg[j];
            }
    }
done:
    h3_free(thg);
    h3_free(twg);
    h3_free(hg);
    h3_free(wg);
    if (st != H3_OK) h3_seq_layout_free(out);
    return st;
}

void h3_video_patchify(const float *latent, int64_t T, int64_t H, int64_t W, float *rows) {
    const int64_t ph = H / 2, pw = W / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < ph; i++)
            for (int64_t j = 0; j < pw; j++) {
                float *row = rows + ((t * ph + i) * pw + j) * (H3_LATENT_CHANNELS * 4);
                for (int64_t c = 0; c < H3_LATENT_CHANNELS; c++)
                    for (int64_t dy = 0; dy < 2; dy++)
                        for (int64_t dx = 0; dx < 2; dx++)
                            row[c * 4 + dy * 2 + dx] =
                                latent[((c * T + t) * H + 2 * i + dy) * W + 2 * j + dx];
            }
}

void h3_video_unpatchify(const float *rows, int64_t T, int64_t H, int64_t W, float *latent) {
    const int64_t ph = H / 2, pw = W / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < ph; i++)
            for (int64_t j = 0; j < pw; j++) {
                const float *row = rows + ((t * ph + i) * pw + j) * (H3_LATENT_CHANNELS * 4);
                for (int64_t c = 0; c < H3_LATENT_CHANNELS; c++)
                    for (int64_t dy = 0; dy < 2; dy++)
                        for (int64_t dx = 0; dx < 2; dx++)
                            latent[((c * T + t) * H + 2 * i + dy) * W + 2 * j + dx] =
                                row[c * 4 + dy * 2 + dx];
            }
}

void h3_audio_pack(const float *latent, int64_t T_a, float *rows) {
    for (int64_t ch = 0; ch < 2; ch++)
        for (int64_t k = 0; k < T_a; k++)
            for (int64_t c = 0; c < H3_AUDIO_LATENT_CHANNELS; c++)
                rows[(ch * T_a + k) * H3_AUDIO_LATENT_CHANNELS + c] =
                    latent[(ch * H3_AUDIO_LATENT_CHANNELS + c) * T_a + k];
}

void h3_audio_unpack(const float *rows, int64_t T_a, float *latent) {
    for (int64_t ch = 0; ch < 2; ch++)
        for (int64_t k = 0; k < T_a; k++)
            for (int64_t c = 0; c < H3_AUDIO_LATENT_CHANNELS; c++)
                latent[(ch * H3_AUDIO_LATENT_CHANNELS + c) * T_a + k] =
                    rows[(ch * T_a + k) * H3_AUDIO_LATENT_CHANNELS + c];
}

/* One axis of the half-pixel bilinear map: for each output index its two source indices and their weights. */
static void bilinear_axis(int64_t in, int64_t out, int64_t *i0, int64_t *i1, float *w1) {
    const double scale = (double)in / (double)out;
    for (int64_t j = 0; j < out; j++) {
        double p = scale * ((double)j + 0.5) - 0.5;
        if (p < 0) p = 0;
        int64_t a = (int64_t)p;
        if (a > in - 1) a = in - 1;
        i0[j] = a;
        i1[j] = a < in - 1 ? a + 1 : a;
        w1[j] = (float)(p - (double)a);
    }
}

h3_status h3_video_latent_upscale(const float *src, int64_t C, int64_t T, int64_t H, int64_t W, int64_t H2,
                                  int64_t W2, float *dst) {
    if (H < 1 || W < 1 || H2 < 1 || W2 < 1) return H3_ERR(H3_ERR_INVALID, "latent upscale: empty plane");
    int64_t *tab = h3_malloc((size_t)(2 * H2 + 2 * W2) * sizeof(int64_t), H3_MEM_WORKSPACE);
    float *wt = h3_malloc((size_t)(H2 + W2) * sizeof(float), H3_MEM_WORKSPACE);
    if (!tab || !wt) {
        h3_free(tab);
        h3_free(wt);
        return H3_ERR(H3_ERR_NOMEM, "out of memory for the latent upscale's tables");
    }
    int64_t *y0 = tab, *y1 = tab + H2, *x0 = tab + 2 * H2, *x1 = tab + 2 * H2 + W2;
    float *wy = wt, *wx = wt + H2;
    bilinear_axis(H, H2, y0, y1, wy);
    bilinear_axis(W, W2, x0, x1, wx);
    for (int64_t f = 0; f < C * T; f++) {
        const float *s = src + f * H * W;
        float *d = dst + f * H2 * W2;
        for (int64_t i = 0; i < H2; i++) {
            const float *r0 = s + y0[i] * W, *r1 = s + y1[i] * W;
            const float b = wy[i];
            for (int64_t j = 0; j < W2; j++) { /* as lerps: a constant plane stays exactly that constant */
                const float u = wx[j];
                const float top = r0[x0[j]] + u * (r0[x1[j]] - r0[x0[j]]);
                const float bot = r1[x0[j]] + u * (r1[x1[j]] - r1[x0[j]]);
                d[i * W2 + j] = top + b * (bot - top);
            }
        }
    }
    h3_free(tab);
    h3_free(wt);
    return H3_OK;
}

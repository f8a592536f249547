/* The DiT against the fixtures of the project's PyTorch reference (tools/reference/dit.py, float64), in each
 * layout; AdaLN precomputation; input checks; permutation invariance; loader allocation failures.
 *
 * Tolerance: max |c − ref| / max |ref| <= 1e-4 per output. The weights are the fixture's stored bf16/f16/f32
 * values, which the C code converts to f32 exactly, and the reference computes with the same values in
 * float64: what remains is f32 rounding of activations through 4 blocks (measured ~4e-7), so 1e-4 leaves room
 * for other summation orders (threads, BLAS) while a wrong formula (RoPE split, chunk order: ≥ 7e-2) fails by
 * orders of magnitude. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "io/safetensors.h"
#include "models/dit.h"
#include "quant/qload.h"
#include "quant/qwrite.h"
#include "sample/schedule.h"
#include "tensor/comm.h"
#include "testutil.h"

static h3_exec g_ex;
static const double TOL = 1e-4;

#define FIX "tests/fixtures/dit/"

static const char *fix(const char *rel, char *buf, size_t n) {
    char r[256];
    snprintf(r, sizeof r, FIX "%s", rel);
    return t_src_path(r, buf, n);
}

/* max |a − ref| / max |ref| over n values of an f32 tensor from a file. */
static double max_rel(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)ref[i]);
        if (!(d <= num)) num = d; /* NaN propagates */
        if (fabs((double)ref[i]) > den) den = fabs((double)ref[i]);
    }
    return den > 0 ? num / den : num;
}

static void expect_tensor(const char *what, const h3_tensor *got, h3_st_set *exp, const char *name,
                          double tol) {
    h3_tensor ref;
    CHECK_OK(h3_st_load(exp, name, H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &ref));
    if (!ref.data) return;
    CHECK(h3_tensor_numel(got) == h3_tensor_numel(&ref), "%s: %lld values, expected %lld", what,
          (long long)h3_tensor_numel(got), (long long)h3_tensor_numel(&ref));
    if (h3_tensor_numel(got) == h3_tensor_numel(&ref)) {
        double e = max_rel(got->data, ref.data, h3_tensor_numel(&ref));
        CHECK(e <= tol, "%s: max relative error %.3e > %.0e", what, e, tol);
        printf("  %-44s max rel err %.2e (tol %.0e)\n", what, e, tol);
    }
    h3_tensor_free(&ref);
}

typedef struct {
    h3_dit *dit;
    h3_dit_inputs_file in;
    h3_tensor v, a;
} run_t;

static h3_status run_open(run_t *r, const char *model_rel, const h3_dit_open_opts *o) {
    char p[512], q[512];
    memset(r, 0, sizeof *r);
    H3_TRY(h3_dit_open(fix(model_rel, p, sizeof p), o, &r->dit));
    const h3_dit_config *c = h3_dit_get_config(r->dit);
    H3_TRY(h3_dit_inputs_read(fix("inputs.safetensors", q, sizeof q), c, &r->in));
    H3_TRY(h3_tensor_alloc2(&r->v, H3_PLACE_HOST, H3_F32, r->in.video.shape[0], h3_dit_video_dim(c),
                            H3_MEM_ACTIVATIONS));
    return h3_tensor_alloc2(&r->a, H3_PLACE_HOST, H3_F32, r->in.audio.shape[0], c->audio_dim,
                            H3_MEM_ACTIVATIONS);
}

static h3_status run_forward(run_t *r) {
    return h3_dit_forward(r->dit, &g_ex, &r->in.in, &r->v, &r->a);
}

static void run_close(run_t *r) {
    h3_tensor_free(&r->v);
    h3_tensor_free(&r->a);
    h3_dit_inputs_file_free(&r->in);
    h3_dit_close(r->dit);
    memset(r, 0, sizeof *r);
}

/* ---- each layout against the reference --------------------------------------------------------------------
 */

static void fixture_case(const char *model_rel, const char *expected_rel, h3_layout layout, int interleaved) {
    char p[512];
    run_t r;
    CHECK_OK(run_open(&r, model_rel, NULL));
    if (!r.dit) return;
    CHECK(h3_dit_layout(r.dit) == layout, "%s: detected layout %s", model_rel,
          h3_layout_name(h3_dit_layout(r.dit)));
    CHECK(h3_dit_qkv_interleaved(r.dit) == interleaved, "%s: qkv order", model_rel);
    printf("  %s: %s\n", model_rel, h3_dit_describe(r.dit));
    h3_dit_weight_bytes wb;
    h3_dit_weight_bytes_of(r.dit, &wb);
    CHECK(wb.owned == 0 && wb.mapped == wb.total && wb.total > 0,
          "%s: %lld of %lld weight bytes are copies, not views", model_rel, (long long)wb.owned,
          (long long)wb.total);
    CHECK_OK(run_forward(&r));
    h3_st_set exp;
    CHECK_OK(h3_st_open(fix(expected_rel, p, sizeof p), &exp));
    char what[128];
    snprintf(what, sizeof what, "%s video velocity", model_rel);
    expect_tensor(what, &r.v, &exp, "video_velocity", TOL);
    snprintf(what, sizeof what, "%s audio velocity", model_rel);
    expect_tensor(what, &r.a, &exp, "audio_velocity", TOL);
    /* The kept modulation tables (the forward computed them for its timesteps, in their order). */
    const h3_dit_config *c = h3_dit_get_config(r.dit);
    for (int b = 0; b <= c->n_layers; b++) {
        char name[64];
        int n = 0;
        const h3_tensor *m = h3_dit_modulation(r.dit, b, NULL, &n);
        CHECK(m && n == r.in.in.n_timesteps, "modulation %d kept for %d timesteps", b, n);
        if (!m) continue;
        if (b < c->n_layers)
            snprintf(name, sizeof name, "modulation.blocks.%d", b);
        else
            snprintf(name, sizeof name, "modulation.final");
        snprintf(what, sizeof what, "%s %s", model_rel, name);
        expect_tensor(what, m, &exp, name, TOL);
    }
    h3_dit_stats s;
    h3_dit_get_stats(r.dit, &s);
    CHECK(s.acquires == h3_dit_n_units(c) && s.releases == s.acquires,
          "one acquire/release per block: %lld/%lld for "
          "%d blocks",
          (long long)s.acquires, (long long)s.releases, h3_dit_n_units(c));
    h3_st_close(&exp);
    run_close(&r);
}

static void test_official(void) {
    fixture_case("official", "expected_full.safetensors", H3_LAYOUT_OFFICIAL, 1);
    /* The shard index and a single shard's folder name the same set. */
    fixture_case("official/model.safetensors.index.json", "expected_full.safetensors", H3_LAYOUT_OFFICIAL, 1);
}
static void test_diffusers(void) {
    fixture_case("diffusers", "expected_full.safetensors", H3_LAYOUT_DIFFUSERS, 0);
    fixture_case("diffusers/diffusion_pytorch_model.safetensors", "expected_full.safetensors",
                 H3_LAYOUT_DIFFUSERS, 0);
}
static void test_comfy_pruned(void) {
    fixture_case("comfy_pruned.safetensors", "expected_pruned.safetensors", H3_LAYOUT_COMFY, 0);
}

/* The QKV order matters: reading the official shards as contiguous must not pass (a test that cannot fail is
 * a defect). */
static void test_qkv_order_matters(void) {
    h3_dit_open_opts o = {0};
    o.qkv_order = H3_DIT_QKV_CONTIGUOUS;
    run_t r;
    char p[512];
    CHECK_OK(run_open(&r, "official", &o));
    if (!r.dit) return;
    CHECK_OK(run_forward(&r));
    h3_st_set exp;
    CHECK_OK(h3_st_open(fix("expected_full.safetensors", p, sizeof p), &exp));
    h3_tensor ref;
    CHECK_OK(h3_st_load(&exp, "video_velocity", H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &ref));
    double e = max_rel(r.v.data, ref.data, h3_tensor_numel(&ref));
    CHECK(e > 100 * TOL, "official shards read as contiguous QKV still match (%.2e)", e);
    printf("  official read with the wrong QKV order: max rel err %.2e (must fail)\n", e);
    h3_tensor_free(&ref);
    h3_st_close(&exp);
    run_close(&r);
}

/* ---- AdaLN precomputation ---------------------------------------------------------------------------------
 */

static int copy_weight(const char *name, h3_tensor *t, void *user) {
    h3_st_set *s = user;
    h3_tensor src;
    if (h3_st_get(s, name, &src) != H3_OK) {
        t_fail_at(__FILE__, __LINE__, "fixture lacks %s", name);
        return 1;
    }
    int64_t n = h3_tensor_numel(t);
    float *f = malloc((size_t)n * sizeof(float));
    CHECK(h3_tensor_numel(&src) == n, "%s: size", name);
    CHECK(t->dtype == H3_F32, "%s: created as %s", name, h3_dtype_name(t->dtype));
    CHECK(h3_convert_to_f32(src.dtype, src.data, f, (size_t)n), "%s: convert", name);
    memcpy(t->data, f, (size_t)n * sizeof(float));
    free(f);
    h3_tensor_free(&src);
    return 0;
}

static int poison_adaln(const char *name, h3_tensor *t, void *user) {
    (*(int *)user)++;
    if (strstr(name, "adaln") || strstr(name, "time_embedder")) {
        float *f = t->data;
        for (int64_t i = 0; i < h3_tensor_numel(t); i++) f[i] = NAN;
    }
    return 0;
}

/* A DiT created in memory (h3_dit_create) with the pruned fixture's weights: it must compute the pruned
 * fixture's outputs; after precomputing the modulation, NaN in every AdaLN parameter must not reach a
 * forward. */
static void test_precompute(void) {
    char p[512];
    run_t r;
    CHECK_OK(run_open(&r, "comfy_pruned.safetensors", NULL));
    if (!r.dit) return;
    h3_dit_config cfg = *h3_dit_get_config(r.dit);
    h3_dit *d = NULL;
    CHECK_OK(h3_dit_create(&cfg, H3_F32, NULL, &d));
    if (!d) {
        run_close(&r);
        return;
    }
    h3_st_set wset, exp;
    CHECK_OK(h3_st_open(fix("comfy_pruned.safetensors", p, sizeof p), &wset));
    CHECK(h3_dit_visit_weights(d, copy_weight, &wset) == 0, "copying the fixture's weights");
    h3_st_close(&wset);
    CHECK_OK(h3_st_open(fix("expected_pruned.safetensors", p, sizeof p), &exp));

    /* Precompute for a schedule that holds the forward's timesteps among others, in another order. */
    const h3_dit_inputs *in = &r.in.in;
    float sched[8];
    int n = 0;
    sched[n++] = 0.05f;
    for (int i = in->n_timesteps - 1; i >= 0; i--) {
        sched[n++] = in->timesteps[i];
        sched[n++] = 0.1f * (float)(i + 3);
    }
    sched[n++] = in->timesteps[0]; /* a repeat is kept once */
    CHECK_OK(h3_dit_precompute_modulation(d, &g_ex, sched, n));
    int kept = 0;
    CHECK(h3_dit_modulation(d, 0, NULL, &kept) && kept == n - 1, "kept %d distinct timesteps of %d", kept,
          n - 1);
    h3_dit_stats s0, s1;
    h3_dit_get_stats(d, &s0);
    CHECK_OK(h3_dit_forward(d, &g_ex, in, &r.v, &r.a));
    h3_dit_get_stats(d, &s1);
    CHECK(s1.adaln_passes == s0.adaln_passes,
          "a forward with precomputed timesteps recomputed the modulation");
    expect_tensor("created DiT (pruned weights) video velocity", &r.v, &exp, "video_velocity", TOL);
    expect_tensor("created DiT (pruned weights) audio velocity", &r.a, &exp, "audio_velocity", TOL);

    /* Poison every AdaLN parameter: the next forward must give the same bits. */
    int64_t nv = h3_tensor_numel(&r.v), na = h3_tensor_numel(&r.a);
    float *v0 = malloc((size_t)nv * sizeof(float)), *a0 = malloc((size_t)na * sizeof(float));
    memcpy(v0, r.v.data, (size_t)nv * sizeof(float));
    memcpy(a0, r.a.data, (size_t)na * sizeof(float));
    int visited = 0;
    h3_dit_visit_weights(d, poison_adaln, &visited);
    CHECK(visited > 10, "visited %d weights", visited);
    CHECK_OK(h3_dit_forward(d, &g_ex, in, &r.v, &r.a));
    CHECK(memcmp(v0, r.v.data, (size_t)nv * sizeof(float)) == 0 &&
              memcmp(a0, r.a.data, (size_t)na * sizeof(float)) == 0,
          "a forward after precomputation read an AdaLN parameter");
    /* A timestep that was not precomputed needs them: the NaNs show up, proving the poison was real. */
    float t_other = 0.33f;
    h3_dit_inputs in2 = *in;
    int32_t *ti = malloc((size_t)in->seq_len * sizeof(int32_t));
    for (int64_t i = 0; i < in->seq_len; i++) ti[i] = 0;
    in2.timesteps = &t_other;
    in2.n_timesteps = 1;
    in2.timestep_indices = ti;
    CHECK_OK(h3_dit_forward(d, &g_ex, &in2, &r.v, &r.a));
    CHECK(isnan(((float *)r.v.data)[0]), "NaN AdaLN weights gave a finite output for a new timestep");
    h3_dit_get_stats(d, &s1);
    CHECK(s1.adaln_passes == s0.adaln_passes + 1, "the new timestep was computed once (%lld passes)",
          (long long)(s1.adaln_passes - s0.adaln_passes));
    free(ti);
    free(v0);
    free(a0);
    h3_st_close(&exp);
    h3_dit_close(d);
    run_close(&r);
}

/* The bytes-per-step claim of docs/DIT.md, from the released shapes. */
static void test_modulation_bytes(void) {
    h3_dit_config c;
    h3_dit_config_default(&c);
    /* 50 × [96768, 2688] + [96768] bf16, final [10752, 2688] + [10752] bf16, time MLP f32. */
    int64_t adaln = 50 * (96768LL * 2688 + 96768) * 2 + (10752LL * 2688 + 10752) * 2 +
                    (5376LL * 256 + 5376 + 2688LL * 5376 + 2688) * 4;
    CHECK(adaln == 26142079488LL, "AdaLN bytes of the release: %lld", (long long)adaln);
    /* Kept rows for 4 distinct timesteps in a step (video, audio, keyframe 0.999, reference audio 1.0), f32.
     */
    CHECK(h3_dit_modulation_bytes(&c, 4) == 4LL * (50 * 96768 + 10752) * 4, "modulation bytes");
    printf("  per step: AdaLN parameters %lld bytes vs kept rows of 4 timesteps %lld bytes\n",
           (long long)adaln, (long long)h3_dit_modulation_bytes(&c, 4));
}

/* ---- layout handling
 * ---------------------------------------------------------------------------------------- */

typedef struct {
    h3_dit_inputs in;
    int32_t *tags, *tidx, *vi, *ai, *ti;
    double *pos;
    float *ts;
    h3_tensor video, audio;
} owned_in;

static void owned_free(owned_in *o) {
    free(o->tags);
    free(o->tidx);
    free(o->vi);
    free(o->ai);
    free(o->ti);
    free(o->pos);
    free(o->ts);
    h3_tensor_free(&o->video);
    h3_tensor_free(&o->audio);
}

/* Rows of the packed sequence moved by a random permutation, video and audio rows given in a shuffled order,
 * and the timesteps reversed: the velocities are those of the original rows, in the new row order. */
static void test_permutation(void) {
    run_t r;
    CHECK_OK(run_open(&r, "official", NULL));
    if (!r.dit) return;
    CHECK_OK(run_forward(&r));
    const h3_dit_inputs *in = &r.in.in;
    const int64_t S = in->seq_len, Nv = r.v.shape[0], Na = r.a.shape[0], L = r.in.text.shape[0];
    const int T = in->n_timesteps;
    int64_t *P = malloc((size_t)S * sizeof(int64_t)), *Qv = malloc((size_t)Nv * sizeof(int64_t)),
            *Qa = malloc((size_t)Na * sizeof(int64_t));
    for (int64_t i = 0; i < S; i++) P[i] = i;
    for (int64_t i = S - 1; i > 0; i--) {
        int64_t j = (int64_t)(t_rand_u64() % (uint64_t)(i + 1)), t = P[i];
        P[i] = P[j];
        P[j] = t;
    }
    for (int64_t i = 0; i < Nv; i++) Qv[i] = Nv - 1 - i;
    for (int64_t i = 0; i < Na; i++) Qa[i] = (i * 5 + 1) % Na;
    owned_in o = {0};
    o.tags = malloc((size_t)S * 4);
    o.tidx = malloc((size_t)S * 4);
    o.pos = malloc((size_t)S * 3 * 8);
    o.vi = malloc((size_t)Nv * 4);
    o.ai = malloc((size_t)Na * 4);
    o.ti = malloc((size_t)L * 4);
    o.ts = malloc((size_t)T * 4);
    for (int i = 0; i < T; i++) o.ts[i] = in->timesteps[T - 1 - i];
    for (int64_t rr = 0; rr < S; rr++) {
        o.tags[P[rr]] = in->token_tags[rr];
        o.tidx[P[rr]] = T - 1 - in->timestep_indices[rr];
        for (int a = 0; a < 3; a++) o.pos[P[rr] * 3 + a] = in->position_ids[rr * 3 + a];
    }
    CHECK_OK(h3_tensor_alloc2(&o.video, H3_PLACE_HOST, H3_F32, Nv, r.v.shape[1], H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc2(&o.audio, H3_PLACE_HOST, H3_F32, Na, r.a.shape[1], H3_MEM_ACTIVATIONS));
    int64_t vd = r.in.video.shape[1], ad = r.in.audio.shape[1];
    for (int64_t i = 0; i < Nv; i++) {
        o.vi[i] = (int32_t)P[in->video_indices[Qv[i]]];
        memcpy((float *)o.video.data + i * vd, (const float *)r.in.video.data + Qv[i] * vd, (size_t)vd * 4);
    }
    for (int64_t i = 0; i < Na; i++) {
        o.ai[i] = (int32_t)P[in->audio_indices[Qa[i]]];
        memcpy((float *)o.audio.data + i * ad, (const float *)r.in.audio.data + Qa[i] * ad, (size_t)ad * 4);
    }
    for (int64_t i = 0; i < L; i++) o.ti[i] = (int32_t)P[in->text_indices[i]];
    o.in = *in;
    o.in.video = &o.video;
    o.in.audio = &o.audio;
    o.in.timesteps = o.ts;
    o.in.token_tags = o.tags;
    o.in.timestep_indices = o.tidx;
    o.in.position_ids = o.pos;
    o.in.video_indices = o.vi;
    o.in.audio_indices = o.ai;
    o.in.text_indices = o.ti;
    h3_tensor v2, a2;
    CHECK_OK(h3_tensor_alloc2(&v2, H3_PLACE_HOST, H3_F32, Nv, vd, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc2(&a2, H3_PLACE_HOST, H3_F32, Na, ad, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_dit_forward(r.dit, &g_ex, &o.in, &v2, &a2));
    /* Expected: original outputs reordered by Qv / Qa (attention sums in another order: f32 rounding only).
     */
    float *ev = malloc((size_t)(Nv * vd) * 4), *ea = malloc((size_t)(Na * ad) * 4);
    for (int64_t i = 0; i < Nv; i++)
        memcpy(ev + i * vd, (const float *)r.v.data + Qv[i] * vd, (size_t)vd * 4);
    for (int64_t i = 0; i < Na; i++)
        memcpy(ea + i * ad, (const float *)r.a.data + Qa[i] * ad, (size_t)ad * 4);
    double e1 = max_rel(v2.data, ev, Nv * vd), e2 = max_rel(a2.data, ea, Na * ad);
    CHECK(e1 <= 1e-5 && e2 <= 1e-5, "permuted rows: video %.2e, audio %.2e", e1, e2);
    printf("  permuted packed rows, shuffled row lists, reversed timesteps: max rel diff %.2e / %.2e\n", e1,
           e2);
    free(ev);
    free(ea);
    free(P);
    free(Qv);
    free(Qa);
    h3_tensor_free(&v2);
    h3_tensor_free(&a2);
    owned_free(&o);
    run_close(&r);
}

/* ---- the split forward (h3_dit_forward_sp) -------------------------------------------------------------------
 * N ranks as threads of this process (tensor/comm.h's in-process group), each with its own DiT opened from the same
 * files and its own exec: every rank's velocities equal the whole forward's, and each rank received exactly the
 * bytes Ulysses moves (so the blocks did run split: q, k, v of the other ranks' rows for its heads, its rows of
 * the other ranks' heads back, the other ranks' rows of the residual stream at the end). */
typedef struct {
    h3_dit *dit;
    h3_exec ex;
    h3_comm *comm;
    const h3_dit_inputs *in;
    h3_tensor v, a;
    h3_status st;
    char err[256]; /* the rank's error (the message is per thread) */
} sp_rank;

static void *sp_thread(void *p) {
    sp_rank *r = p;
    r->st = h3_dit_forward_sp(r->dit, &r->ex, r->comm, r->in, &r->v, &r->a);
    if (r->st != H3_OK) snprintf(r->err, sizeof r->err, "%s", h3_last_error());
    return NULL;
}

/* Deterministic values from a weight's name (every rank's DiT gets the same): ±0.1, and 1 ± 0.1 for norms. */
static int random_weight(const char *name, h3_tensor *t, void *user) {
    (void)user;
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    float *f = t->data;
    const float base = strstr(name, "norm") ? 1.0f : 0.0f;
    for (int64_t i = 0; i < h3_tensor_numel(t); i++) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        f[i] = base + 0.2f * ((float)(h >> 40) / 16777216.0f - 0.5f);
    }
    return 0;
}

/* The fixture's DiT (heads 0), or one created with its config but `heads` attention heads and random weights. */
static h3_dit *make_dit(const h3_dit_config *fixture, int heads) {
    char p[512];
    h3_dit *d = NULL;
    if (!heads) {
        CHECK_OK(h3_dit_open(fix("official", p, sizeof p), NULL, &d));
        return d;
    }
    h3_dit_config cfg = *fixture;
    cfg.heads = heads;
    CHECK_OK(h3_dit_create(&cfg, H3_F32, NULL, &d));
    if (d) CHECK(h3_dit_visit_weights(d, random_weight, NULL) == 0, "filling the created DiT");
    return d;
}

static void split_case(int heads, int N) {
    run_t ref;
    CHECK_OK(run_open(&ref, "official", NULL));
    if (!ref.dit) return;
    h3_dit *whole = heads ? make_dit(h3_dit_get_config(ref.dit), heads) : ref.dit;
    if (!whole) {
        run_close(&ref);
        return;
    }
    CHECK_OK(h3_dit_forward(whole, &g_ex, &ref.in.in, &ref.v, &ref.a));
    const h3_dit_config *c = h3_dit_get_config(whole);
    char what[64];
    snprintf(what, sizeof what, "%s, %d heads", heads ? "created" : "official", (int)c->heads);
    h3_comm comm[8];
    sp_rank r[8];
    memset(r, 0, sizeof r);
    CHECK_OK(h3_comm_local_create(N, comm));
    for (int i = 0; i < N; i++) {
        r[i].dit = make_dit(h3_dit_get_config(ref.dit), heads);
        CHECK_OK(h3_exec_init(&r[i].ex, 1));
        CHECK_OK(h3_tensor_alloc2(&r[i].v, H3_PLACE_HOST, H3_F32, ref.v.shape[0], ref.v.shape[1], H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_tensor_alloc2(&r[i].a, H3_PLACE_HOST, H3_F32, ref.a.shape[0], ref.a.shape[1], H3_MEM_ACTIVATIONS));
        r[i].comm = &comm[i];
        r[i].in = &ref.in.in;
    }
    const int64_t S = ref.in.in.seq_len, L = ref.in.text.shape[0], Nv = ref.v.shape[0], Na = ref.a.shape[0];
    /* the modulation kept first, so what the forwards allocate is their workspaces and exchange buffers only */
    for (int i = 0; i < N && t_failures == 0; i++)
        CHECK_OK(h3_dit_precompute_modulation(r[i].dit, &r[i].ex, ref.in.in.timesteps, ref.in.in.n_timesteps));
    if (t_failures == 0) {
        pthread_t th[8];
        h3_mem_stats before, after;
        h3_mem_get_stats(&before);
        h3_mem_reset_peaks();
        for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, sp_thread, &r[i]);
        for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
        h3_mem_get_stats(&after);
        /* every rank holds its workspace and exchange buffers at once (the first exchange waits for all): the
         * activations' peak grew by their sum, as h3_dit_forward_mem_sp predicts rank by rank */
        int64_t want_mem = 0, whole_ws = 0;
        for (int i = 0; i < N; i++) {
            h3_dit_forward_mem fm;
            h3_dit_forward_mem_sp(r[i].dit, 0, -1, S, L, Nv, Na, 0, N, i, &fm);
            want_mem += fm.workspace + fm.exchange;
            /* and the bytes it says the rank receives (the planner's count) are the ones the group moved */
            CHECK(fm.received_block * c->n_layers + fm.received_end == comm[i].bytes_in,
                  "rank %d of %d: h3_dit_forward_mem_sp says %lld bytes received, the group moved %lld", i, N,
                  (long long)(fm.received_block * c->n_layers + fm.received_end), (long long)comm[i].bytes_in);
            CHECK(N > 1 || fm.exchange == 0, "one rank: no exchange buffers, %lld predicted", (long long)fm.exchange);
        }
        whole_ws = h3_dit_workspace_bytes(r[0].dit, S, L, Nv, Na);
        const int64_t grew = after.peak[H3_MEM_ACTIVATIONS] - before.current[H3_MEM_ACTIVATIONS];
        CHECK(grew == want_mem, "%s, %d ranks: the activations' peak grew by %lld bytes, predicted %lld", what, N,
              (long long)grew, (long long)want_mem);
        printf("  %s, %d ranks: activations %lld bytes over all ranks (predicted = measured; the whole forward's "
               "workspace %lld)\n",
               what, N, (long long)grew, (long long)whole_ws);
        const int64_t blk = c->heads / N * c->head_dim * 4, row = c->hidden * 4;
        for (int i = 0; i < N; i++) {
            CHECK(r[i].st == H3_OK, "rank %d of %d: %s", i, N, r[i].err);
            double ev = max_rel(r[i].v.data, ref.v.data, h3_tensor_numel(&ref.v));
            double ea = max_rel(r[i].a.data, ref.a.data, h3_tensor_numel(&ref.a));
            CHECK(ev <= 1e-5 && ea <= 1e-5, "%s, rank %d of %d: velocities %.2e / %.2e off the whole forward's",
                  what, i, N, ev, ea);
            const int64_t n = S * (i + 1) / N - S * i / N;
            const int64_t want = c->n_layers * (3 * (S - n) + (int64_t)(N - 1) * n) * blk + (S - n) * row;
            CHECK(comm[i].bytes_in == want, "rank %d of %d received %lld bytes, Ulysses moves %lld", i, N,
                  (long long)comm[i].bytes_in, (long long)want);
            printf("  %s, %d ranks, rank %d: rows %lld..%lld, %lld bytes in, velocities %.2e / %.2e off\n", what,
                   N, i, (long long)(S * i / N), (long long)(S * (i + 1) / N), (long long)comm[i].bytes_in, ev, ea);
        }
    }
    for (int i = 0; i < N; i++) {
        h3_tensor_free(&r[i].v);
        h3_tensor_free(&r[i].a);
        h3_exec_free(&r[i].ex);
        h3_dit_close(r[i].dit);
    }
    h3_comm_local_destroy(comm, N);
    if (whole != ref.dit) h3_dit_close(whole);
    run_close(&ref);
}

static void test_split(void) {
    split_case(0, 2);
    split_case(0, 1); /* one rank: the whole forward, no exchange */
    split_case(6, 3); /* 29 rows as 9, 10, 10; two heads a rank */
    split_case(6, 6); /* one head a rank */
    /* three ranks cannot share two heads: refused on every rank before any exchange */
    run_t r;
    CHECK_OK(run_open(&r, "official", NULL));
    if (!r.dit) return;
    h3_comm comm[3];
    CHECK_OK(h3_comm_local_create(3, comm));
    CHECK_ERR(h3_dit_forward_sp(r.dit, &g_ex, &comm[1], &r.in.in, &r.v, &r.a), H3_ERR_INVALID, "give a divisor");
    CHECK_ERR(h3_dit_forward_sp(r.dit, &g_ex, NULL, &r.in.in, &r.v, &r.a), H3_ERR_INVALID, "no group");
    CHECK_ERR(h3_comm_local_create(0, comm), H3_ERR_INVALID, "1 to");
    h3_comm_local_destroy(comm, 3);
    /* a rank that fails stops the group: the other's forward returns instead of waiting for it */
    CHECK_OK(h3_comm_local_create(2, comm));
    sp_rank one;
    memset(&one, 0, sizeof one);
    one.dit = r.dit;
    one.ex = g_ex;
    one.comm = &comm[0];
    one.in = &r.in.in;
    one.v = r.v;
    one.a = r.a;
    pthread_t th;
    pthread_create(&th, NULL, sp_thread, &one);
    usleep(20000);
    comm[1].abort(&comm[1]);
    pthread_join(th, NULL);
    CHECK(one.st == H3_ERR_INTERRUPTED, "rank 0 after rank 1 stopped the group: status %d", (int)one.st);
    h3_comm_local_destroy(comm, 2);
    run_close(&r);
}

/* Sparse attention in the blocks (h3_dit_set_attention H3_ATTN_SPARSE, h3_dit_set_sparse): a created DiT over a
 * made-up sequence of 5 tiles (560 video rows, the first 128 a clean keyframe, then 10 text and 40 audio rows; the
 * keyframe's and the text/audio tiles stay exact), its step at t = 0.5. With every
 * tile exact (tau −1e9) the velocities are the dense forward's; at tau 1.3 they move but stay finite; outside the
 * window of t or under the row threshold the forward is the dense one bit for bit. */
static void test_sparse(void) {
    run_t ref;
    CHECK_OK(run_open(&ref, "official", NULL));
    if (!ref.dit) return;
    h3_dit *d = make_dit(h3_dit_get_config(ref.dit), (int)h3_dit_get_config(ref.dit)->heads);
    run_close(&ref);
    if (!d) return;
    const h3_dit_config *c = h3_dit_get_config(d);
    const int64_t Nv = 560, L = 10, Na = 40, S = Nv + L + Na;
    h3_tensor vid, aud, txt, v[2], a[2];
    CHECK_OK(h3_tensor_alloc2(&vid, H3_PLACE_HOST, H3_F32, Nv, h3_dit_video_dim(c), H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc2(&aud, H3_PLACE_HOST, H3_F32, Na, c->audio_dim, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc2(&txt, H3_PLACE_HOST, H3_F32, L, c->text_dim, H3_MEM_ACTIVATIONS));
    t_fill_randn(vid.data, (size_t)h3_tensor_numel(&vid), 1.0);
    t_fill_randn(aud.data, (size_t)h3_tensor_numel(&aud), 1.0);
    t_fill_randn(txt.data, (size_t)h3_tensor_numel(&txt), 1.0);
    for (int i = 0; i < 2; i++) {
        CHECK_OK(h3_tensor_alloc2(&v[i], H3_PLACE_HOST, H3_F32, Nv, h3_dit_video_dim(c), H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_tensor_alloc2(&a[i], H3_PLACE_HOST, H3_F32, Na, c->audio_dim, H3_MEM_ACTIVATIONS));
    }
    int32_t *tags = malloc((size_t)S * 4), *tix = calloc((size_t)S, 4), *vi = malloc((size_t)Nv * 4),
            *ti = malloc((size_t)L * 4), *ai = malloc((size_t)Na * 4);
    double *pos = malloc((size_t)S * 24);
    for (int64_t r = 0; r < S; r++) {
        tags[r] = r < Nv ? 0 : r < Nv + L ? 1 : 2;
        if (r < Nv) vi[r] = (int32_t)r, pos[3 * r] = (double)(r / 56), pos[3 * r + 1] = (double)(r / 8 % 7),
                    pos[3 * r + 2] = (double)(r % 8);
        else if (r < Nv + L) ti[r - Nv] = (int32_t)r, pos[3 * r] = pos[3 * r + 1] = pos[3 * r + 2] = 0.0;
        else ai[r - Nv - L] = (int32_t)r, pos[3 * r] = (double)(r - Nv - L), pos[3 * r + 1] = pos[3 * r + 2] = 0.0;
    }
    float ts[2] = {0.5f, 1.0f}; /* the first tile's video rows clean (t = 1: a keyframe), the rest at 0.5 */
    for (int64_t r = 0; r < 128; r++) tix[r] = 1;
    h3_dit_inputs in = {&vid, &aud, &txt, ts, 2, S, tix, tags, pos, vi, ai, ti};
    CHECK_OK(h3_dit_forward(d, &g_ex, &in, &v[0], &a[0])); /* dense */
    const size_t nv = (size_t)h3_tensor_numel(&v[0]), na = (size_t)h3_tensor_numel(&a[0]);
    struct {
        float tau, t0, t1;
        int64_t min_rows;
        int expect; /* 0 bit-equal to dense, 1 within 1e-5, 2 moved */
    } cs[] = {{-1e9f, 0.0f, 1.0f, 0, 1},
              {1.3f, 0.0f, 1.0f, 0, 2},
              {1.3f, 0.4f, 0.6f, 0, 2}, /* the step's t is the noisy rows' 0.5, not the keyframe's 1 */
              {1.3f, 0.6f, 0.9f, 0, 0},
              {1.3f, 0.0f, 1.0f, S + 1, 0}};
    h3_dit_set_attention(d, H3_ATTN_SPARSE);
    CHECK(h3_dit_attention(d) == H3_ATTN_SPARSE);
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        CHECK_OK(h3_dit_set_sparse(d, cs[k].tau, cs[k].t0, cs[k].t1, cs[k].min_rows));
        CHECK_OK(h3_dit_forward(d, &g_ex, &in, &v[1], &a[1]));
        const double ev = max_rel(v[1].data, v[0].data, (int64_t)nv), ea = max_rel(a[1].data, a[0].data, (int64_t)na);
        int finite = 1;
        for (size_t i = 0; i < nv; i++) finite &= isfinite(((float *)v[1].data)[i]) != 0;
        CHECK(finite, "sparse case %zu: non-finite velocities", k);
        printf("  sparse tau %g, t in %g..%g, from %lld rows: velocities %.2e / %.2e off dense\n", (double)cs[k].tau,
               (double)cs[k].t0, (double)cs[k].t1, (long long)cs[k].min_rows, ev, ea);
        if (cs[k].expect == 0)
            CHECK(!memcmp(v[1].data, v[0].data, nv * 4) && !memcmp(a[1].data, a[0].data, na * 4),
                  "sparse case %zu must run the dense forward", k);
        else if (cs[k].expect == 1)
            CHECK(ev <= 1e-4 && ea <= 1e-4, "sparse case %zu: every tile exact, %.2e / %.2e off dense", k, ev, ea);
        else
            CHECK(ev > 1e-6, "sparse case %zu: no tile was approximated (%.2e off dense)", k, ev);
    }
    /* the window in the schedule's unshifted progress (ComfyUI's percent): on the release's shift 12 the call at
     * t = 0.5 (σ 0.5, unshifted u = 0.5 / 6.5) is at progress 0.92, past 0.9; percent 0.2 is σ = 9.6 / 9.8 */
    CHECK(fabs(h3_dit_sparse_progress(12.0, 1.0 - 9.6 / 9.8) - 0.2) < 1e-12 &&
              fabs(h3_dit_sparse_progress(1.0, 0.37) - 0.37) < 1e-12,
          "progress: %.6f, %.6f", h3_dit_sparse_progress(12.0, 1.0 - 9.6 / 9.8), h3_dit_sparse_progress(1.0, 0.37));
    CHECK_OK(h3_dit_set_sparse_shift(d, 12.0));
    const float win[2][2] = {{0.2f, 0.9f}, {0.2f, 0.95f}};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(h3_dit_set_sparse(d, 1.3f, win[k][0], win[k][1], 0));
        CHECK_OK(h3_dit_forward(d, &g_ex, &in, &v[1], &a[1]));
        const int same = !memcmp(v[1].data, v[0].data, nv * 4);
        CHECK(same == (k == 0), "shift 12, window %g..%g: the step at progress 0.92 ran %s", (double)win[k][0],
              (double)win[k][1], same ? "dense" : "sparse");
    }
    /* the h3 schedule's calls on the window's edges (10 steps, shift 12: calls 3 and 10 at progress 0.2 and 0.9, their
     * float32 timesteps 1e-7 off) run sparse */
    h3_schedule sch;
    CHECK_OK(h3_schedule_make(H3_SCHEDULER_H3, 10, 12.0, 3.0, &sch));
    CHECK_OK(h3_dit_set_sparse(d, 1.3f, H3_DIT_SPARSE_T0, H3_DIT_SPARSE_T1, 0));
    for (int k = 0; k < 2 && sch.t_v; k++) {
        ts[0] = sch.t_v[k ? 9 : 2];
        h3_dit_set_attention(d, 0);
        CHECK_OK(h3_dit_forward(d, &g_ex, &in, &v[0], &a[0]));
        h3_dit_set_attention(d, H3_ATTN_SPARSE);
        CHECK_OK(h3_dit_forward(d, &g_ex, &in, &v[1], &a[1]));
        CHECK(memcmp(v[1].data, v[0].data, nv * 4) != 0, "the h3 schedule's call %d (progress %.7f) ran dense",
              k ? 10 : 3, h3_dit_sparse_progress(12.0, ts[0]));
    }
    h3_schedule_free(&sch);
    CHECK_ERR(h3_dit_set_sparse_shift(d, 0.0), H3_ERR_INVALID, "shift");
    CHECK_ERR(h3_dit_set_sparse(d, 1.3f, 0.9f, 0.2f, 0), H3_ERR_INVALID, "window");
    CHECK_ERR(h3_dit_set_sparse(d, NAN, 0.2f, 0.9f, 0), H3_ERR_INVALID, "tau");
    h3_dit_set_attention(d, H3_ATTN_SPARSE | H3_ATTN_FP8);
    CHECK(h3_dit_attention(d) == H3_ATTN_SPARSE, "sparse excludes the low-bit modes");
    free(tags);
    free(tix);
    free(vi);
    free(ti);
    free(ai);
    free(pos);
    for (int i = 0; i < 2; i++) {
        h3_tensor_free(&v[i]);
        h3_tensor_free(&a[i]);
    }
    h3_tensor_free(&vid);
    h3_tensor_free(&aud);
    h3_tensor_free(&txt);
    h3_dit_close(d);
}

/* Sequences without audio rows or without text rows (NULL tensors, index lists and outputs) run and give
 * finite velocities. */
static void test_missing_modalities(void) {
    run_t r;
    CHECK_OK(run_open(&r, "official", NULL));
    if (!r.dit) return;
    const h3_dit_inputs *in = &r.in.in;
    const int64_t S = in->seq_len;
    for (int drop = 0; drop < 2; drop++) { /* 0: audio, 1: text */
        const int32_t *gone = drop ? in->text_indices : in->audio_indices;
        int64_t ngone = drop ? r.in.text.shape[0] : r.a.shape[0];
        int32_t *newrow = malloc((size_t)S * 4);
        int64_t n = 0;
        for (int64_t i = 0; i < S; i++) {
            int g = 0;
            for (int64_t j = 0; j < ngone; j++) g |= gone[j] == i;
            newrow[i] = g ? -1 : (int32_t)n++;
        }
        int32_t *tags = malloc((size_t)n * 4), *tidx = malloc((size_t)n * 4),
                *vi = malloc((size_t)r.v.shape[0] * 4), *ai = malloc((size_t)r.a.shape[0] * 4),
                *ti = malloc((size_t)r.in.text.shape[0] * 4);
        double *pos = malloc((size_t)n * 24);
        for (int64_t i = 0; i < S; i++)
            if (newrow[i] >= 0) {
                tags[newrow[i]] = in->token_tags[i];
                tidx[newrow[i]] = in->timestep_indices[i];
                memcpy(pos + 3 * newrow[i], in->position_ids + 3 * i, 24);
            }
        for (int64_t i = 0; i < r.v.shape[0]; i++) vi[i] = newrow[in->video_indices[i]];
        for (int64_t i = 0; i < r.a.shape[0]; i++) ai[i] = newrow[in->audio_indices[i]];
        for (int64_t i = 0; i < r.in.text.shape[0]; i++) ti[i] = newrow[in->text_indices[i]];
        h3_dit_inputs b = *in;
        b.seq_len = n;
        b.token_tags = tags;
        b.timestep_indices = tidx;
        b.position_ids = pos;
        b.video_indices = vi;
        b.audio_indices = drop ? ai : NULL;
        b.text_indices = drop ? NULL : ti;
        if (drop)
            b.text = NULL;
        else
            b.audio = NULL;
        CHECK_OK(h3_dit_forward(r.dit, &g_ex, &b, &r.v, drop ? &r.a : NULL));
        int finite = 1;
        for (int64_t i = 0; i < h3_tensor_numel(&r.v); i++) finite &= isfinite(((float *)r.v.data)[i]) != 0;
        CHECK(finite, "dropping the %s rows gave non-finite video velocities", drop ? "text" : "audio");
        free(newrow);
        free(tags);
        free(tidx);
        free(vi);
        free(ai);
        free(ti);
        free(pos);
    }
    run_close(&r);
}

/* ---- bad inputs
 * ------------------------------------------------------------------------------------------------ */

static void test_bad_inputs(void) {
    run_t r;
    CHECK_OK(run_open(&r, "diffusers", NULL));
    if (!r.dit) return;
    const h3_dit_inputs *in = &r.in.in;
    const int64_t S = in->seq_len;
    int32_t *tags = malloc((size_t)S * 4), *tidx = malloc((size_t)S * 4);
    int32_t *ti = malloc((size_t)r.in.text.shape[0] * 4);
    double *pos = malloc((size_t)S * 3 * 8);
    h3_dit_inputs b;
#define RESET()                                                                                              \
    do {                                                                                                     \
        b = *in;                                                                                             \
        memcpy(tags, in->token_tags, (size_t)S * 4);                                                         \
        memcpy(tidx, in->timestep_indices, (size_t)S * 4);                                                   \
        memcpy(ti, in->text_indices, (size_t)r.in.text.shape[0] * 4);                                        \
        memcpy(pos, in->position_ids, (size_t)S * 3 * 8);                                                    \
        b.token_tags = tags;                                                                                 \
        b.timestep_indices = tidx;                                                                           \
        b.text_indices = ti;                                                                                 \
        b.position_ids = pos;                                                                                \
    } while (0)
    RESET();
    tags[3] = 3;
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, &r.a), H3_ERR_INVALID, "token_tags");
    RESET();
    tidx[7] = in->n_timesteps;
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, &r.a), H3_ERR_INVALID, "timestep_indices");
    RESET();
    ti[1] = ti[0];
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, &r.a), H3_ERR_INVALID, "already named");
    RESET();
    ti[0] = (int32_t)S;
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, &r.a), H3_ERR_INVALID, "outside the sequence");
    RESET();
    ti[0] = in->video_indices[0];
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, &r.a), H3_ERR_INVALID, "video_indices");
    RESET();
    pos[10] = NAN;
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, &r.a), H3_ERR_INVALID, "position_ids");
    RESET();
    b.seq_len = S + 1;
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, &r.a), H3_ERR_INVALID, "rows");
    RESET();
    b.text = NULL;
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, &r.a), H3_ERR_INVALID, "rows");
    RESET();
    float tnan = NAN;
    b.timesteps = &tnan;
    b.n_timesteps = 1;
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, &r.a), H3_ERR_INVALID, "timesteps");
    RESET();
    h3_tensor narrow;
    CHECK_OK(h3_tensor_narrow(&r.in.audio, 1, 0, 16, &narrow));
    b.audio = &narrow;
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, &r.a), H3_ERR_INVALID, "'audio'");
    RESET();
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.a, &r.a), H3_ERR_INVALID, "video velocity");
    CHECK_ERR(h3_dit_forward(r.dit, &g_ex, &b, &r.v, NULL), H3_ERR_INVALID, "audio velocity");
    /* After all that, a good forward still works and no block is left acquired. */
    CHECK_OK(run_forward(&r));
    h3_dit_stats s;
    h3_dit_get_stats(r.dit, &s);
    CHECK(s.acquires == s.releases, "acquires %lld, releases %lld", (long long)s.acquires,
          (long long)s.releases);
#undef RESET
    free(tags);
    free(tidx);
    free(ti);
    free(pos);
    run_close(&r);
}

/* ---- files that are not right
 * ------------------------------------------------------------------------------------ */

/* Copies a fixture file, leaving out `skip`, reshaping `reshape` to [2, 3] f32, and adding a comfy_quant
 * marker when marker is set. */
static void rewrite(const char *src_rel, const char *dst, const char *skip, const char *reshape,
                    const char *marker, const char *meta_config) {
    char p[512];
    h3_st_set s;
    CHECK_OK(h3_st_open(fix(src_rel, p, sizeof p), &s));
    h3_st_writer *w;
    CHECK_OK(h3_st_writer_new(&w));
    static float six[6];
    for (int64_t i = 0; i < s.n_entries; i++) {
        const h3_st_entry *e = &s.entries[i];
        if (skip && !strcmp(e->name, skip)) continue;
        if (reshape && !strcmp(e->name, reshape)) {
            int64_t sh[2] = {2, 3};
            CHECK_OK(h3_st_writer_add(w, e->name, H3_F32, 2, sh, six));
            continue;
        }
        const void *data;
        CHECK_OK(h3_st_bytes(&s, e, &data));
        CHECK_OK(h3_st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, data));
    }
    if (marker) {
        int64_t n = (int64_t)strlen(marker);
        CHECK_OK(h3_st_writer_add(w, "blocks.0.attn.qkv_proj.comfy_quant", H3_U8, 1, &n, marker));
    }
    if (meta_config) CHECK_OK(h3_st_writer_meta(w, "config", meta_config));
    CHECK_OK(h3_st_writer_write(w, dst, 0));
    h3_st_writer_free(w);
    h3_st_close(&s);
}

static void test_bad_files(void) {
    char dir[512], f[600], cfgp[600], p[512];
    h3_dit *d = NULL;
    t_tmp_path("ditfiles", dir, sizeof dir);
    CHECK(mkdir(dir, 0755) == 0 || access(dir, F_OK) == 0, "mkdir %s", dir);
    snprintf(f, sizeof f, "%s/model.safetensors", dir);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);

    rewrite("comfy_pruned.safetensors", f, "blocks.1.mlp.fc2.weight", NULL, NULL, NULL);
    CHECK_ERR(
        h3_dit_open(f, NULL, &d), H3_ERR_FORMAT,
        "tensor 'blocks.1.mlp.fc2.weight' is missing; DiT block 1 needs it as [hidden, FFN] = [32, 64]");
    rewrite("comfy_pruned.safetensors", f, NULL, "blocks.0.attn.out_proj.weight", NULL, NULL);
    CHECK_ERR(h3_dit_open(f, NULL, &d), H3_ERR_FORMAT, "blocks.0.attn.out_proj.weight");
    rewrite("comfy_pruned.safetensors", f, NULL, NULL, "{\"format\": \"int8_tensorwise\"}", NULL);
    CHECK_ERR(h3_dit_open(f, NULL, &d), H3_ERR_FORMAT, "marked int8_tensorwise but is bf16");
    rewrite("comfy_pruned.safetensors", f, "blocks.0.attn.qkv_proj.weight", NULL, NULL, NULL);
    CHECK_ERR(h3_dit_open(f, NULL, &d), H3_ERR_FORMAT, "tensor 'blocks.0.attn.qkv_proj.weight' is missing");
    /* Metadata config that disagrees with the shapes. */
    rewrite("comfy_pruned.safetensors", f, NULL, NULL, NULL, "{\"hidden_size\": 64, \"num_layers\": 2}");
    CHECK_ERR(h3_dit_open(f, NULL, &d), H3_ERR_FORMAT, "video_patch_proj.weight");
    rewrite("comfy_pruned.safetensors", f, NULL, NULL, NULL,
            "{\"hidden_size\": 32, \"num_layers\": 3, "
            "\"num_attention_heads\": 2, \"ffn_hidden_size\": 64, \"text_dim\": 24, "
            "\"time_embed_hidden_size\": 32}");
    CHECK_ERR(h3_dit_open(f, NULL, &d), H3_ERR_FORMAT, "3 blocks");
    /* config.json beside the weights wins over the metadata; a bad one is an error naming it. */
    rewrite("comfy_pruned.safetensors", f, NULL, NULL, NULL, NULL);
    FILE *cf = fopen(cfgp, "w");
    fputs("{\"hidden_size\": 32, \"num_layers\": \"two\"}", cf);
    fclose(cf);
    CHECK_ERR(h3_dit_open(f, NULL, &d), H3_ERR_FORMAT, "num_layers");
    cf = fopen(cfgp, "w");
    fputs("{\"hidden_size\": 32, \"num_layers\": 2, \"adaln_out_features\": 5}", cf);
    fclose(cf);
    CHECK_ERR(h3_dit_open(f, NULL, &d), H3_ERR_FORMAT, "adaln_out_features");
    cf = fopen(cfgp, "w");
    fputs("{\"hidden_size\": 32, \"num_layers\": 2, \"num_attention_heads\": 2, \"attention_head_dim\": 128, "
          "\"rope_inv_freq_len\": 22}",
          cf);
    fclose(cf);
    CHECK_ERR(h3_dit_open(f, NULL, &d), H3_ERR_INVALID, "RoPE");
    /* A config.json of something else is ignored (shapes decide). */
    cf = fopen(cfgp, "w");
    fputs("{\"_class_name\": \"AutoencoderKL\", \"latent_channels\": 24}", cf);
    fclose(cf);
    CHECK_OK(h3_dit_open(f, NULL, &d));
    h3_dit_close(d);
    d = NULL;
    unlink(cfgp);
    /* Not a DiT. */
    CHECK_ERR(h3_dit_open(fix("inputs.safetensors", p, sizeof p), NULL, &d), H3_ERR_FORMAT,
              "not a MiniMax-H3 DiT");
    CHECK(d == NULL, "a failed open returns no model");
    unlink(f);
    rmdir(dir);
}

static void test_config_json(void) {
    const char *off =
        "{\"hidden_size\": 64, \"num_layers\": 3, \"token_refiner_num_layers\": 1, "
        "\"num_attention_heads\": 4, \"attention_head_dim\": 64, \"ffn_hidden_size\": 96, "
        "\"latents_dim\": 8, \"audio_latents_dim\": 16, \"patch_size\": [1, 2, 2], \"text_dim\": 40, "
        "\"timestep_input_dim\": 32, \"time_embed_hidden_size\": 48, \"time_embed_dim\": 24, "
        "\"adaln_out_features\": 1152, \"final_adaln_out_features\": 128, \"rope_inv_freq_len\": 8, "
        "\"norm_eps\": 1e-6, \"qk_norm_eps\": 1e-05, \"final_norm_eps\": 1e-05}";
    const char *dif =
        "{\"_class_name\": \"MiniMaxH3Transformer3DModel\", \"hidden_size\": 64, \"num_layers\": 3, "
        "\"num_refiner_layers\": 1, \"num_attention_heads\": 4, \"attention_head_dim\": 64, "
        "\"ffn_dim\": 96, \"in_channels\": 8, \"audio_in_channels\": 16, \"patch_size\": [1, 2, 2], "
        "\"text_dim\": 40, \"freq_dim\": 32, \"time_embed_hidden_dim\": 48, \"time_embed_dim\": 24, "
        "\"rope_freq_dim\": 8, \"rope_theta\": 10000.0, \"norm_eps\": 1e-6, \"qk_norm_eps\": 1e-05, "
        "\"final_norm_eps\": 1e-05}";
    json_t *a = NULL, *b = NULL;
    CHECK_OK(h3_json_parse(off, strlen(off), "official", &a));
    CHECK_OK(h3_json_parse(dif, strlen(dif), "diffusers", &b));
    h3_dit_config ca, cb, rel;
    CHECK_OK(h3_dit_config_from_json(a, "official", &ca));
    CHECK_OK(h3_dit_config_from_json(b, "diffusers", &cb));
    CHECK(memcmp(&ca, &cb, sizeof ca) == 0, "the two namings give different configs");
    CHECK(ca.hidden == 64 && ca.n_refiner_layers == 1 && ca.ffn == 96 && ca.in_channels == 8 &&
              ca.audio_dim == 16 && ca.freq_dim == 32 && ca.time_hidden == 48 && ca.rope_freq_dim == 8 &&
              ca.norm_eps == 1e-6,
          "values");
    json_decref(a);
    json_decref(b);
    /* An empty object is the release. */
    CHECK_OK(h3_json_parse("{}", 2, "empty", &a));
    CHECK_OK(h3_dit_config_from_json(a, "empty", &ca));
    h3_dit_config_default(&rel);
    CHECK(memcmp(&ca, &rel, sizeof ca) == 0 && rel.hidden == 5376 && rel.n_layers == 50 &&
              rel.time_embed_dim == 2688,
          "defaults");
    json_decref(a);
    const char *bad[] = {"{\"patch_size\": [1, 2]}",
                         "{\"hidden_size\": 1.5}",
                         "{\"rope_theta\": \"x\"}",
                         "{\"hidden_size\": 0}",
                         "[1, 2]",
                         "{\"attention_head_dim\": 64, \"rope_freq_dim\": 16}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_OK(h3_json_parse(bad[i], strlen(bad[i]), "bad", &a));
        h3_clear_error();
        CHECK(h3_dit_config_from_json(a, "bad", &ca) != H3_OK, "accepted %s", bad[i]);
        CHECK(strstr(h3_last_error(), "bad") != NULL, "message names the source: %s", h3_last_error());
        json_decref(a);
    }
}

/* ---- memory
 * ------------------------------------------------------------------------------------------------------ */

static void test_workspace_bytes(void) {
    run_t r;
    CHECK_OK(run_open(&r, "official", NULL));
    if (!r.dit) return;
    CHECK_OK(h3_dit_precompute_modulation(r.dit, &g_ex, r.in.in.timesteps, r.in.in.n_timesteps));
    h3_mem_stats before, after;
    h3_mem_get_stats(&before);
    h3_mem_reset_peaks();
    CHECK_OK(run_forward(&r));
    h3_mem_get_stats(&after);
    int64_t ws =
        h3_dit_workspace_bytes(r.dit, r.in.in.seq_len, r.in.text.shape[0], r.v.shape[0], r.a.shape[0]);
    int64_t grew = after.peak[H3_MEM_ACTIVATIONS] - before.current[H3_MEM_ACTIVATIONS];
    CHECK(grew == ws, "forward's activation peak grew by %lld bytes; h3_dit_workspace_bytes says %lld",
          (long long)grew, (long long)ws);
    /* A second forward of the same shape allocates no activations. */
    h3_mem_reset_peaks();
    h3_mem_get_stats(&before);
    CHECK_OK(run_forward(&r));
    h3_mem_get_stats(&after);
    CHECK(after.peak[H3_MEM_ACTIVATIONS] == before.current[H3_MEM_ACTIVATIONS],
          "second forward allocated activations");
    printf("  workspace %lld bytes for %lld rows (predicted = measured)\n", (long long)ws,
           (long long)r.in.in.seq_len);
    run_close(&r);
}

/* Every allocation failing in turn: an error (out of memory), never a crash or a leak. The official layout
 * runs open + inputs + forward (the forward is the same code for every layout but the QKV split); the others
 * run their own open paths (diffusers names, shape inference, the curve table) and the modulation. */
static void test_alloc_failures(void) {
    const char *models[] = {"official", "diffusers", "comfy_pruned.safetensors"};
    for (int m = 0; m < 3; m++) {
        for (int sticky = 0; sticky < 2; sticky++) {
            h3_mem_stats base;
            h3_mem_get_stats(&base);
            int failures = 0, n;
            for (n = 1; n < 20000; n++) {
                run_t r;
                h3_clear_error();
                h3_mem_fail_at(n, sticky);
                h3_status st = run_open(&r, models[m], NULL);
                if (st == H3_OK && m == 0) st = run_forward(&r);
                if (st == H3_OK && m > 0)
                    st = h3_dit_precompute_modulation(r.dit, &g_ex, r.in.in.timesteps, r.in.in.n_timesteps);
                int64_t ticks = h3_mem_fail_at(0, 0);
                run_close(&r);
                h3_mem_stats now;
                h3_mem_get_stats(&now);
                CHECK(now.total_current == base.total_current, "%s, failing allocation %d leaked %lld bytes",
                      models[m], n, (long long)(now.total_current - base.total_current));
                if (st == H3_OK) {
                    CHECK(ticks < n, "succeeded although allocation %d should have failed", n);
                    break;
                }
                failures++;
                CHECK(st == H3_ERR_NOMEM, "%s, failing allocation %d: expected out of memory, got %s: %s",
                      models[m], n, h3_code_name(st), h3_last_error());
                if (st != H3_ERR_NOMEM) break;
            }
            CHECK(failures > 40, "%s: only %d allocation points were exercised", models[m], failures);
            if (sticky) printf("  %s: %d allocation points fail cleanly\n", models[m], failures);
        }
    }
}

/* ---- quantized weights ---------------------------------------------------------------------------------- */

static h3_status run_open_path(run_t *r, const char *path, const h3_dit_open_opts *o) {
    char q[512];
    memset(r, 0, sizeof *r);
    H3_TRY(h3_dit_open(path, o, &r->dit));
    const h3_dit_config *c = h3_dit_get_config(r->dit);
    H3_TRY(h3_dit_inputs_read(fix("inputs.safetensors", q, sizeof q), c, &r->in));
    H3_TRY(h3_tensor_alloc2(&r->v, H3_PLACE_HOST, H3_F32, r->in.video.shape[0], h3_dit_video_dim(c),
                            H3_MEM_ACTIVATIONS));
    return h3_tensor_alloc2(&r->a, H3_PLACE_HOST, H3_F32, r->in.audio.shape[0], c->audio_dim,
                            H3_MEM_ACTIVATIONS);
}

/* A plain f32 copy of a weight set: every weight decoded by the loader (h3_qweight_get + h3_tensor_rows_to_f32)
 * under its set name, companions left out. A forward with it must give what the quantized file gives. */
static void write_twin(const char *src, const char *dst) {
    h3_st_set s;
    h3_gguf *g = NULL;
    CHECK_OK(h3_weights_open(src, &s, &g));
    h3_st_writer *w = NULL;
    CHECK_OK(h3_st_writer_new(&w));
    float **bufs = calloc((size_t)s.n_entries + 1, sizeof *bufs);
    for (int64_t i = 0; i < s.n_entries; i++) {
        const h3_st_entry *e = &s.entries[i];
        if (h3_qweight_is_companion(e->name)) continue;
        h3_tensor t;
        CHECK_OK(h3_qweight_get(&s, g, e, &t));
        if (!t.data) continue;
        bufs[i] = malloc((size_t)h3_tensor_numel(&t) * sizeof(float));
        CHECK_OK(h3_tensor_rows_to_f32(&t, 0, h3_tensor_rows(&t), bufs[i]));
        CHECK_OK(h3_st_writer_add(w, e->name, H3_F32, t.ndim, t.shape, bufs[i]));
        h3_tensor_free(&t);
    }
    CHECK_OK(h3_st_writer_write(w, dst, 0));
    h3_st_writer_free(w);
    for (int64_t i = 0; i < s.n_entries; i++) free(bufs[i]);
    free(bufs);
    h3_st_close(&s);
    h3_gguf_free(g);
}

/* max |a − b| / max |b| */
static double max_rel_of(const h3_tensor *a, const h3_tensor *b) {
    return max_rel(a->data, b->data, h3_tensor_numel(b));
}

/* A quantized DiT: it computes what its decoded twin computes (f32 rounding: 1e-5) and the fixture's outputs
 * within its format's error (tol, max |Δ| / max |ref|); its weights take fewer bytes than the bf16 file's. */
static void check_quantized(const char *path, const char *what, const char *expected_rel, double tol) {
    char twin[512], p[512];
    t_tmp_path("dit_twin.safetensors", twin, sizeof twin);
    run_t r, t;
    CHECK_OK(run_open_path(&r, path, NULL));
    if (!r.dit) return;
    write_twin(path, twin);
    /* A twin of a full model has neither markers nor a curve table: say its fused QKV is ComfyUI's. */
    h3_dit_open_opts to = {0};
    to.qkv_order = H3_DIT_QKV_CONTIGUOUS;
    CHECK_OK(run_open_path(&t, twin, &to));
    CHECK(h3_dit_layout(r.dit) == H3_LAYOUT_COMFY && !h3_dit_qkv_interleaved(r.dit), "%s: ComfyUI layout", what);
    CHECK_OK(run_forward(&r));
    if (t.dit) CHECK_OK(run_forward(&t));
    h3_st_set exp;
    CHECK_OK(h3_st_open(fix(expected_rel, p, sizeof p), &exp));
    h3_tensor ev, ea;
    CHECK_OK(h3_st_load(&exp, "video_velocity", H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &ev));
    CHECK_OK(h3_st_load(&exp, "audio_velocity", H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &ea));
    if (t.dit && ev.data && ea.data) {
        double tv = max_rel_of(&r.v, &t.v), ta = max_rel_of(&r.a, &t.a);
        double qv = max_rel_of(&r.v, &ev), qa = max_rel_of(&r.a, &ea);
        CHECK(tv <= 1e-5 && ta <= 1e-5, "%s vs its decoded twin: %.2e / %.2e > 1e-5", what, tv, ta);
        CHECK(qv <= tol && qa <= tol, "%s vs the bf16 reference: %.3f / %.3f > %.2f", what, qv, qa, tol);
        h3_dit_weight_bytes wb;
        h3_dit_weight_bytes_of(r.dit, &wb);
        printf("  %-26s video/audio velocity: vs decoded twin %.1e/%.1e, vs bf16 reference %.4f/%.4f (bound %.2f); "
               "weights %lld bytes\n",
               what, tv, ta, qv, qa, tol, (long long)wb.total);
    }
    h3_tensor_free(&ev);
    h3_tensor_free(&ea);
    h3_st_close(&exp);
    run_close(&r);
    run_close(&t);
    unlink(twin);
}

/* h3run's quantized files of every layout in every format, and the reference's GGUF file (sd.cpp's prefix,
 * Q8_0/Q4_K/Q5_0/Q4_1/Q5_1/Q6_K/Q4_0 linears, a flattened F16 and a flattened Q8_0 matrix). */
static void test_quantized(void) {
    char p[512], out[512];
    t_tmp_path("dit_q.safetensors", out, sizeof out);
    const struct {
        h3_qtarget t;
        const char *what;
        double tol;
    } f[] = {{H3_QT_INT8, "int8", 0.05}, {H3_QT_INT8_CONVROT, "int8_convrot", 0.05},
             {H3_QT_FP8, "fp8", 0.15},  {H3_QT_NVFP4, "nvfp4", 0.6}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        h3_quantize_opts o = {f[i].t, 0, g_ex.pool};
        h3_quantize_result res;
        CHECK_OK(h3_quantize_checkpoint(fix("comfy_pruned.safetensors", p, sizeof p), out, &o, &res));
        CHECK(res.comp == H3_COMP_DIT && res.n_quantized == 8, "%s: 8 block linears quantized, got %lld", f[i].what,
              (long long)res.n_quantized);
        char what[64];
        snprintf(what, sizeof what, "comfy_pruned -> %s", f[i].what);
        check_quantized(out, what, "expected_pruned.safetensors", f[i].tol);
    }
    /* The official (per-head interleaved QKV, full AdaLN quantized with group 16 here) and diffusers (split q/k/v,
     * fc1 = [value; gate]) layouts come out in ComfyUI's order. */
    const char *layouts[] = {"official", "diffusers"};
    for (int i = 0; i < 2; i++) {
        h3_quantize_opts o = {H3_QT_INT8_CONVROT, 0, g_ex.pool};
        h3_quantize_result res;
        CHECK_OK(h3_quantize_checkpoint(fix(layouts[i], p, sizeof p), out, &o, &res));
        CHECK(res.n_quantized == 10, "%s: %lld layers quantized (8 linears, 2 AdaLN projections)", layouts[i],
              (long long)res.n_quantized);
        char what[64];
        snprintf(what, sizeof what, "%s -> int8_convrot", layouts[i]);
        check_quantized(out, what, "expected_full.safetensors", 0.05);
    }
    unlink(out);
    check_quantized(t_src_path("tests/fixtures/quant/dit.gguf", p, sizeof p), "dit.gguf", "expected_pruned.safetensors",
                    0.25);
}

static void test_quantized_alloc_failures(void) {
    char paths[2][512], p[512];
    t_tmp_path("dit_q_alloc.safetensors", paths[0], sizeof paths[0]);
    t_src_path("tests/fixtures/quant/dit.gguf", paths[1], sizeof paths[1]);
    h3_quantize_opts o = {H3_QT_NVFP4, 0, NULL};
    h3_quantize_result res;
    CHECK_OK(h3_quantize_checkpoint(fix("comfy_pruned.safetensors", p, sizeof p), paths[0], &o, &res));
    for (int m = 0; m < 2; m++) {
        h3_mem_stats base;
        h3_mem_get_stats(&base);
        int failures = 0;
        for (int n = 1; n < 20000; n++) {
            run_t r;
            h3_clear_error();
            h3_mem_fail_at(n, 0);
            h3_status st = run_open_path(&r, paths[m], NULL);
            if (st == H3_OK) st = run_forward(&r);
            int64_t ticks = h3_mem_fail_at(0, 0);
            run_close(&r);
            h3_mem_stats now;
            h3_mem_get_stats(&now);
            CHECK(now.total_current == base.total_current, "%s, failing allocation %d leaked %lld bytes", paths[m], n,
                  (long long)(now.total_current - base.total_current));
            if (st == H3_OK) {
                CHECK(ticks < n, "succeeded although allocation %d should have failed", n);
                break;
            }
            failures++;
            CHECK(st == H3_ERR_NOMEM, "%s, failing allocation %d: expected out of memory, got %s: %s", paths[m], n,
                  h3_code_name(st), h3_last_error());
            if (st != H3_ERR_NOMEM) break;
        }
        CHECK(failures > 40, "%s: only %d allocation points were exercised", paths[m], failures);
        printf("  %s: %d allocation points fail cleanly\n", h3_path_base(paths[m]), failures);
    }
    unlink(paths[0]);
}

static void test_no_leaks(void) {
    h3_mem_stats s;
    h3_mem_get_stats(&s);
    for (int c = 0; c < H3_MEM_CATEGORY_COUNT; c++)
        if (c != H3_MEM_OTHER)
            CHECK(s.current[c] == 0, "%s still holds %lld bytes", h3_mem_category_name(c),
                  (long long)s.current[c]);
}

static void noop_range(void *ctx, int64_t b, int64_t e, int tid) {
    (void)ctx;
    (void)b;
    (void)e;
    (void)tid;
}

/* For tests/cli_dit.sh: inputs files each with one thing wrong, named after it ("<what>.safetensors"). */
static int write_bad_inputs(const char *dir) {
    static const char *names[] = {
        "video",      "audio",        "text",          "timesteps",     "timestep_indices",
        "token_tags", "position_ids", "video_indices", "audio_indices", "text_indices"};
    char p[512];
    h3_st_set s;
    if (h3_st_open(fix("inputs.safetensors", p, sizeof p), &s) != H3_OK) return 1;
    mkdir(dir, 0755);
    int rc = 0;
    for (int variant = 0; variant < 2 * 10 + 3 && !rc; variant++) {
        /* 0..9: tensor `names[v]` missing; 10..19: it has an extra dimension; 20: a tag of 5; 21: indices
         * as F32; 22: a duplicated text index. */
        const char *target = names[variant % 10];
        char path[600];
        if (variant < 10)
            snprintf(path, sizeof path, "%s/missing_%s.safetensors", dir, target);
        else if (variant < 20)
            snprintf(path, sizeof path, "%s/shape_%s.safetensors", dir, target);
        else
            snprintf(path, sizeof path, "%s/%s.safetensors", dir,
                     variant == 20   ? "bad_tag"
                     : variant == 21 ? "float_indices"
                                     : "duplicate_index");
        h3_st_writer *w;
        if (h3_st_writer_new(&w) != H3_OK) return 1;
        for (int64_t i = 0; i < s.n_entries && !rc; i++) {
            const h3_st_entry *e = &s.entries[i];
            const void *data;
            if (h3_st_bytes(&s, e, &data) != H3_OK) rc = 1;
            size_t nb = (size_t)(e->end - e->begin);
            static uint8_t buf[1 << 16];
            if (rc || nb > sizeof buf) {
                rc = 1;
                break;
            }
            int is_target = !strcmp(e->name, target);
            if (variant < 10 && is_target) continue;
            int64_t shape[H3_MAX_DIMS];
            memcpy(shape, e->shape, sizeof shape);
            int nd = e->ndim;
            h3_dtype dt = e->dtype;
            const void *src = data;
            if (variant >= 10 && variant < 20 && is_target) { /* [..] -> [1, ..] */
                memmove(shape + 1, shape, (size_t)nd * sizeof shape[0]);
                shape[0] = 1;
                nd++;
            }
            if (variant == 20 && !strcmp(e->name, "token_tags")) {
                memcpy(buf, data, nb);
                int64_t five = 5;
                memcpy(buf + 8 * 3, &five, 8);
                src = buf;
            }
            if (variant == 21 && !strcmp(e->name, "audio_indices")) {
                float *f = (float *)buf;
                for (int64_t k = 0; k < e->shape[0]; k++) {
                    int64_t v;
                    memcpy(&v, (const uint8_t *)data + 8 * k, 8);
                    f[k] = (float)v;
                }
                dt = H3_F32;
                src = buf;
            }
            if (variant == 22 && !strcmp(e->name, "text_indices")) {
                memcpy(buf, data, nb);
                memcpy(buf + 8, buf, 8);
                src = buf;
            }
            /* buf holds at most one changed tensor per file: valid until the write below */
            if (h3_st_writer_add(w, e->name, dt, nd, shape, src) != H3_OK) rc = 1;
        }
        if (!rc && h3_st_writer_write(w, path, 0) != H3_OK) rc = 1;
        h3_st_writer_free(w);
    }
    h3_st_close(&s);
    if (rc) fprintf(stderr, "writing bad inputs failed: %s\n", h3_last_error());
    return rc;
}

/* ---- the weight table's contract: every tensor, one at a time
 * ------------------------------------------------ */

static h3_status dit_load(const char *path, void *user) {
    (void)user;
    h3_dit *d = NULL;
    h3_status st = h3_dit_open(path, NULL, &d);
    h3_dit_close(d);
    return st;
}

/* Sizes a file without a config takes from its own tensors: the curve table's grid (its rows), and RoPE's
 * frequencies (as many as rope.inv_freq holds, 6 of them per axis fitting in head_dim). */
static int dit_accepts(const char *name, t_mutation m, void *user) {
    const int inferred = *(const int *)user;
    return inferred && m == T_MUT_TRUNCATE &&
           (!strcmp(name, "adaln_t_table") || !strcmp(name, "rope.inv_freq"));
}

/* Every tensor of the DiT fixtures in the three layouts emptied, truncated, reshaped and retyped: refused in
 * the binder's one message form, never a crash. */
static void test_weight_sweep(void) {
    char p[512];
    static const struct {
        const char *rel;
        int inferred; /* no config: widths from the shapes */
    } f[] = {{"official", 0}, {"diffusers", 0}, {"comfy_pruned.safetensors", 1}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        int inferred = f[i].inferred;
        t_sweep(f[i].rel, fix(f[i].rel, p, sizeof p), dit_load, dit_accepts, &inferred, 0);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-bad-inputs")) return write_bad_inputs(argv[2]);
    if (h3_exec_init(&g_ex, 2) != H3_OK) {
        fprintf(stderr, "exec init failed: %s\n", h3_last_error());
        return 1;
    }
    /* Let the pool's workers start: each frees its start-up argument when it runs, which would otherwise show
     * up in the allocation counters in the middle of a leak check. A parallel loop waits for every worker. */
    h3_parallel_for(g_ex.pool, 64, 1, noop_range, NULL);
    static const t_case cases[] = {
        {"official", test_official},
        {"diffusers", test_diffusers},
        {"comfy_pruned", test_comfy_pruned},
        {"qkv_order_matters", test_qkv_order_matters},
        {"precompute", test_precompute},
        {"modulation_bytes", test_modulation_bytes},
        {"permutation", test_permutation},
        {"split", test_split},
        {"sparse", test_sparse},
        {"missing_modalities", test_missing_modalities},
        {"bad_inputs", test_bad_inputs},
        {"bad_files", test_bad_files},
        {"weight_sweep", test_weight_sweep},
        {"config_json", test_config_json},
        {"workspace_bytes", test_workspace_bytes},
        {"alloc_failures", test_alloc_failures},
        {"quantized", test_quantized},
        {"quantized_alloc_failures", test_quantized_alloc_failures},
        {"no_leaks", test_no_leaks},
        {NULL, NULL},
    };
    int r = t_main("test_dit", cases, argc, argv);
    h3_exec_free(&g_ex);
    return r;
}

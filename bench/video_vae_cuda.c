/* The release-size video VAE decoder on the GPU: random weights of the released shapes made on the device
 * (h3_video_vae_create + a random placement: 2.42B parameters, bf16 4.84 GB), one decode of BENCH.md's
 * workloads (W124: latents [1, 24, 37, 34, 60] -> 124 frames of 960x544, 7 chunks x 15 tiles), frames handed
 * to a callback on the host chunk by chunk as the generate pipeline takes them.
 *
 *     bench_video_vae_cuda [W124 W73 W362 W124L ...] [--budgets default,8] [--reps N] [--split N]
 *
 * Each budget (GiB, or "default": the free device memory less 512 MiB) reserves exactly that as the device
 * arena (h3_cuda_init), so 8 GiB behaves as an 8 GiB card; the plan picks the tile batch, the FFN row step
 * and the resident blocks for it. Per run: the plan, the time to place the weights, a warm-up decode, then N
 * timed decodes (device events around each, the median with min and max), the ratio to the first budget's
 * median, and the arena's measured peak against the plan's prediction (placement and decodes). H3_PROFILE=1
 * adds one decode with every op timed. The table is printed last; $OUT/video_vae_cuda.json gets the numbers
 * when OUT is set. Exit status 1 when a run failed, broke its budget, or missed its predicted peak by more
 * than 5%.
 *
 * --split N adds, at each budget, GPU 0's share of the decode split over N GPUs (h3_video_vae_decode_split as
 * rank 0 of N, bench/loopback_comm.h standing in for the others: chunks 0, N, 2N, ... decoded, every frame
 * handed out, the others' canvases not moved): its median against the whole decode's in the same run, and
 * with the gathers' bytes at a link rate of 360 GB/s (NVLink on an H200, assumed) added as an estimate. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda.h"
#include "mem/budget.h"
#include "models/video_vae.h"
#include "pipeline/request.h"
#include "loopback_comm.h"

#define GIB 1073741824.0

#define TRY(x)                                                                                               \
    do {                                                                                                     \
        if ((x) != H3_OK) {                                                                                  \
            fprintf(stderr, "%s failed: %s\n", #x, h3_last_error());                                         \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The frames callback: counts them and checks a sample of each chunk is finite. */
typedef struct {
    int64_t frames, bad;
} sink;

static h3_status on_frames(void *user, const h3_tensor *f, int64_t first) {
    (void)first;
    sink *s = user;
    const float *d = f->data;
    const int64_t plane = f->shape[2] * f->shape[3];
    for (int64_t c = 0; c < f->shape[0]; c++)
        for (int64_t i = 0; i < plane; i += 997) s->bad += !isfinite(d[c * f->stride[0] + i]);
    s->frames += f->shape[1];
    return H3_OK;
}

typedef struct {
    char workload[16], placement[96];
    double budget_gib, load_s, med, lo, hi, ratio;
    int64_t predicted, measured;
    int ok;
    int split;                              /* --split N (0: none) */
    double share_s, share_lo, gather_est_s; /* GPU 0's share (median, min) and its gathers' estimated time */
} row;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median (and min) of reps decodes, each timed by device events; comm NULL: the whole decode. */
static void time_decodes(h3_video_vae *v, h3_exec *ex, const h3_tensor *z, const h3_video_decode_out *out,
                         h3_comm *comm, int reps, double *med, double *lo, double *hi) {
    h3_cuda_event_h e0, e1;
    TRY(h3_cuda_event_create(&e0, 1));
    TRY(h3_cuda_event_create(&e1, 1));
    double t[32];
    if (reps > 32) reps = 32;
    for (int i = 0; i < reps; i++) {
        TRY(h3_cuda_event_record(e0, h3_cuda_compute_stream(ex)));
        TRY(h3_video_vae_decode_split(v, ex, z, out, comm));
        TRY(h3_cuda_event_record(e1, h3_cuda_compute_stream(ex)));
        TRY(h3_cuda_event_sync(e1));
        double ms;
        TRY(h3_cuda_event_elapsed_ms(e0, e1, &ms));
        t[i] = ms / 1000.0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    *med = t[reps / 2];
    *lo = t[0];
    if (hi) *hi = t[reps - 1];
    h3_cuda_event_destroy(e0);
    h3_cuda_event_destroy(e1);
}

/* One workload at one budget (0: the default). */
static row run_one(h3_video_vae *v, const h3_workload *w, double budget_gib, int reps, int split) {
    row r;
    memset(&r, 0, sizeof r);
    snprintf(r.workload, sizeof r.workload, "%s", w->name);
    h3_exec ex;
    TRY(h3_exec_init(&ex, 0));
    int64_t budget = (int64_t)(budget_gib * GIB);
    if (budget == 0) TRY(h3_budget_default_vram(0, &budget));
    r.budget_gib = budget / GIB;
    TRY(h3_cuda_init(&ex, 0, budget));
    const int64_t T = ((w->frames - 5) / 17) * 5 + 2, H = w->h / 16, W = w->w / 16;
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    int64_t s[5] = {1, c->latent_channels, T, H, W};
    h3_tensor z;
    TRY(h3_tensor_alloc(&z, H3_PLACE_HOST, H3_F32, 5, s, H3_MEM_ACTIVATIONS));
    float *zd = z.data;
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < h3_tensor_numel(&z); i++) { /* xorshift, roughly N(0, 1) by summing 4 uniforms */
        double u = 0;
        for (int k = 0; k < 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            u += (double)(x >> 11) / 9007199254740992.0;
        }
        zd[i] = (float)((u - 2.0) * 1.7320508);
    }
    h3_video_vae_run run;
    memset(&run, 0, sizeof run);
    run.place = H3_PLACE_DEVICE;
    run.vram_budget = budget;
    run.random_seed = 1;
    h3_video_vae_mem m;
    TRY(h3_video_vae_plan(v, T, H, W, &run, &m));
    snprintf(r.placement, sizeof r.placement, "R%d S%d, %d tiles/pass of %d, rows %lld", m.n_resident,
             m.n_blocks - m.n_resident, m.tile_batch, m.tiles_x * m.tiles_y, (long long)m.rows_per_step);
    printf(
        "%s at %.2f GiB: %lld frames of %lldx%lld in %d chunks of %dx%d tiles (%lld tokens each); plan: %s, "
        "predicted device peak %.3f GiB (weights %.3f, slots %.3f, arena %.3f, load %.3f)\n",
        w->name, r.budget_gib, (long long)m.frames, (long long)(W * 16), (long long)(H * 16), m.chunks,
        m.tiles_y, m.tiles_x, (long long)m.tokens_per_tile, r.placement, m.dev_peak / GIB,
        m.dev_weights / GIB, m.dev_slots / GIB, m.dev_arena / GIB, m.dev_load / GIB);
    h3_cuda_reset_peak(&ex);
    double t0 = now();
    TRY(h3_video_vae_place(v, &ex, &m, NULL));
    TRY(h3_exec_sync(&ex));
    r.load_s = now() - t0;
    sink sk = {0, 0};
    h3_video_decode_out out = {H3_PIXELS_UNIT, on_frames, &sk, NULL};
    TRY(h3_video_vae_decode(v, &ex, &z, &out)); /* warm-up: GEMM plans, first touches */
    if (reps > 32) reps = 32;
    time_decodes(v, &ex, &z, &out, NULL, reps, &r.med, &r.lo, &r.hi);
    int64_t decoded = (int64_t)(reps + 1) * m.frames;
    if (split > 1) { /* GPU 0's share of the split decode, the others stood in for */
        h3_comm lb;
        loopback_comm(&lb, 0, split);
        time_decodes(v, &ex, &z, &out, &lb, reps, &r.share_s, &r.share_lo, NULL);
        decoded += (int64_t)reps * m.frames;
        const int own = (m.chunks + split - 1) / split;
        r.split = split;
        r.gather_est_s = (double)(m.chunks - own) * m.canvas_bytes / 360e9;
        printf("  split over %d GPUs, GPU 0's share (%d of %d chunks, every frame handed out): %.3f s "
               "(min %.3f) = %.3fx the whole decode; with its %d gathers of %.1f MiB at 360 GB/s "
               "(estimated, %.4f s): %.3fx\n",
               split, own, m.chunks, r.share_s, r.share_lo, r.share_s / r.med, m.chunks - own,
               m.canvas_bytes / 1048576.0, r.gather_est_s, (r.share_s + r.gather_est_s) / r.med);
    }
    int64_t used, peak, cap;
    h3_cuda_mem_stats(&ex, &used, &peak, &cap);
    r.predicted = m.dev_peak;
    r.measured = peak;
    r.ok =
        sk.bad == 0 && sk.frames == decoded && peak <= budget && llabs(peak - m.dev_peak) * 20 <= m.dev_peak;
    printf(
        "  placed in %.2f s; decode %.3f s (min %.3f, max %.3f over %d), measured peak %.3f GiB vs predicted "
        "%.3f%s\n",
        r.load_s, r.med, r.lo, r.hi, reps, peak / GIB, m.dev_peak / GIB, sk.bad ? "  NON-FINITE FRAMES" : "");
    if (getenv("H3_PROFILE")) {
        memset(ex.prof_s, 0, sizeof ex.prof_s);
        memset(ex.prof_n, 0, sizeof ex.prof_n);
        ex.profile = 1;
        double a = now();
        TRY(h3_video_vae_decode(v, &ex, &z, &out));
        double total = now() - a, ops = 0;
        ex.profile = 0;
        printf("  profile of one decode (each op synchronized): %.3f s\n", total);
        for (int op = 0; op < H3_OP_COUNT; op++) {
            if (!ex.prof_n[op]) continue;
            ops += ex.prof_s[op];
            printf("    %-20s %8lld calls %9.3f s  %5.1f%%\n", h3_op_name((h3_op_id)op),
                   (long long)ex.prof_n[op], ex.prof_s[op], 100.0 * ex.prof_s[op] / total);
        }
        printf("    %-20s %14s %9.3f s\n", "outside ops", "", total - ops);
    }
    h3_video_vae_unplace(v);
    h3_tensor_free(&z);
    h3_cuda_shutdown(&ex);
    h3_exec_free(&ex);
    return r;
}

int main(int argc, char **argv) {
    if (h3_cuda_device_count() == 0) {
        printf("bench_video_vae_cuda: skipped: no CUDA device\n");
        return 0;
    }
    const char *names[8];
    int nn = 0, reps = 5, nb = 0, split = 0;
    double budgets[8];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--split") && i + 1 < argc) {
            split = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--budgets") && i + 1 < argc) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", argv[++i]);
            for (char *tok = strtok(buf, ","); tok && nb < 8; tok = strtok(NULL, ","))
                budgets[nb++] = strcmp(tok, "default") ? atof(tok) : 0.0;
        } else if (nn < 8) {
            names[nn++] = argv[i];
        }
    }
    if (!nn) names[nn++] = "W124";
    if (!nb) budgets[nb++] = 0.0, budgets[nb++] = 8.0;
    if (reps < 1) reps = 1;
    h3_video_vae_config cfg;
    h3_video_vae_default_config(&cfg);
    h3_video_vae *v;
    TRY(h3_video_vae_create(&cfg, &v));
    printf("h3run video VAE decoder, release shapes: %d blocks, hidden %d (%d heads x %d), FFN %d, random "
           "weights "
           "made on the device\n",
           cfg.num_layers, cfg.heads * cfg.head_dim, cfg.heads, cfg.head_dim, cfg.ffn_inner);
    row rows[64];
    int nr = 0, fail = 0;
    for (int k = 0; k < nn; k++) {
        const h3_workload *w = h3_workload_find(names[k]);
        if (!w) {
            fprintf(stderr, "unknown workload %s (%s)\n", names[k], H3_WORKLOAD_NAMES);
            return 2;
        }
        double base = 0;
        for (int b = 0; b < nb && nr < 64; b++) {
            row r = run_one(v, w, budgets[b], reps, split);
            if (b == 0) base = r.med;
            r.ratio = base > 0 ? r.med / base : 0;
            fail |= !r.ok;
            rows[nr++] = r;
        }
    }
    printf("\n%-6s %9s %-40s %8s %8s %8s %7s %11s %11s %5s\n", "work", "budget", "placement", "decode s",
           "min", "max", "ratio", "pred GiB", "meas GiB", "ok");
    for (int i = 0; i < nr; i++)
        printf("%-6s %8.2fG %-40s %8.3f %8.3f %8.3f %6.3fx %11.4f %11.4f %5s\n", rows[i].workload,
               rows[i].budget_gib, rows[i].placement, rows[i].med, rows[i].lo, rows[i].hi, rows[i].ratio,
               rows[i].predicted / GIB, rows[i].measured / GIB, rows[i].ok ? "yes" : "NO");
    const char *out = getenv("OUT");
    if (out) {
        char p[1024];
        snprintf(p, sizeof p, "%s/video_vae_cuda.json", out);
        FILE *js = fopen(p, "w");
        if (js) {
            fprintf(js, "[");
            for (int i = 0; i < nr; i++)
                fprintf(
                    js,
                    "%s{\"workload\": \"%s\", \"budget_gib\": %.3f, \"placement\": \"%s\", \"load_s\": %.3f, "
                    "\"decode_s\": %.4f, \"min\": %.4f, \"max\": %.4f, \"ratio\": %.4f, "
                    "\"predicted_peak\": %lld, \"measured_peak\": %lld, \"ok\": %s, \"split\": %d, "
                    "\"share_s\": %.4f, \"share_min\": %.4f, \"gather_est_s\": %.4f}",
                    i ? ", " : "", rows[i].workload, rows[i].budget_gib, rows[i].placement, rows[i].load_s,
                    rows[i].med, rows[i].lo, rows[i].hi, rows[i].ratio, (long long)rows[i].predicted,
                    (long long)rows[i].measured, rows[i].ok ? "true" : "false", rows[i].split,
                    rows[i].share_s, rows[i].share_lo, rows[i].gather_est_s);
            fprintf(js, "]\n");
            fclose(js);
        }
    }
    h3_video_vae_close(v);
    return fail;
}

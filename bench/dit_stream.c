/* The full-size DiT on device budgets: random bf16 weights of the official shapes (fp32 islands kept f32) in
 * pinned host memory, planned and streamed at BENCH.md's workloads and budgets, one forward = one sampling
 * step. Each run reserves exactly its budget as the device arena (h3_cuda_init), so a budget of 8 GiB behaves
 * as an 8 GiB card.
 *
 *     bench_dit_stream                          W73, W124, W362 at unlimited, 24, 16, 12, 8, 6 GiB, then the
 *                                               disk-tier run
 *     bench_dit_stream W124 --budgets 8,6 [--no-disk] [--reps N] [--pruned] [--quant int8_convrot|int8|fp8]
 *                      [--split N]
 *
 * --split N: every run is the last GPU's share of the DiT split over N GPUs (h3_dit_forward_sp, the most rows),
 * placed as the planner plans that GPU (h3_plan.dit_gpu) within the budget, the other GPUs stood in for by
 * bench/loopback_comm.h: the ratio to the unlimited run is a split GPU's streamed step against its resident one
 * (without the exchange, which the loopback does not time).
 * --pruned: ComfyUI's curve-form AdaLN (the 20B files' shapes); --quant F: the blocks' four linears as random
 * stored values of format F (h3_dit_randomize_blocks_quantized), streamed at their stored size.
 *
 * Per run: seconds per step (median of the timed steps, with min and max), the ratio to the unlimited (all
 * resident) run of the same workload, the plan's predicted step and peak, the arena's measured peak over the
 * whole stage (uploads, the AdaLN pass for 40 timesteps, the steps), whether it stayed within the budget and
 * within 5% of the prediction, and the copy bandwidth achieved against the pinned ceiling measured first. The
 * disk-tier run (W124 at 8 GiB) gives the host budget room for only some streamed blocks: the rest are
 * written to a spill file and read back every step through pinned staging. The table is printed last;
 * $OUT/dit_stream.json gets the numbers when OUT is set. Exit status 1 when a run failed or broke its budget
 * or its prediction.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "cuda/cuda.h"
#include "mem/budget.h"
#include "models/dit_stream.h"
#include "pipeline/plan.h"
#include "mem/report.h"
#include "models/dit.h"
#include "pipeline/layout.h"
#include "pipeline/request.h"
#include "quant/qwrite.h"

#include "loopback_comm.h"

#define GIB         1073741824.0
#define N_TIMESTEPS 40 /* a 20-step run's modulation, kept on the device */

static h3_exec ex;
static int g_split; /* --split N: the last GPU's share of the DiT split over N (the loopback stands in for the rest) */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define TRY(x)                                                                                               \
    do {                                                                                                     \
        if ((x) != H3_OK) {                                                                                  \
            fprintf(stderr, "%s failed: %s\n", #x, h3_last_error());                                         \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

typedef struct result {
    char work[8], budget[16];
    int ok, fits, disk;
    int64_t budget_bytes, ram_bytes, pred_peak, peak;
    double s_step, s_min, s_max, ratio, pred_step, pred_resident;
    double copy_gbs, read_gbs;
    int n_resident, n_slots, n_pinned, n_disk;
    int64_t chunk;
    char note[256];
} result;

static result g_res[64];
static int g_nres;

static int fill_weight(const char *name, h3_tensor *t, void *user) {
    uint64_t *seed = user;
    size_t n = strlen(name);
    int is_norm = strstr(name, "norm") != NULL, is_bias = n > 5 && strcmp(name + n - 5, ".bias") == 0;
    float lo = -0.03f, hi = 0.03f;
    if (is_norm) lo = 0.9f, hi = 1.1f;
    if (is_bias) lo = -0.01f, hi = 0.01f;
    TRY(h3_op_random_uniform(&ex, t, (*seed)++, lo, hi));
    return 0;
}

/* Host->device bandwidth from pinned memory, 2 GiB, best of 3 (the ceiling the streamer is compared with). */
static double pinned_ceiling(void) {
    TRY(h3_cuda_init(&ex, 0, (int64_t)3 << 30));
    const int64_t n = (int64_t)1 << 31;
    h3_tensor h, d;
    TRY(h3_tensor_alloc2(&h, H3_PLACE_PINNED, H3_U8, 1, n, H3_MEM_IO));
    TRY(h3_tensor_alloc2(&d, H3_PLACE_DEVICE, H3_U8, 1, n, H3_MEM_IO));
    memset(h.data, 1, (size_t)n);
    double best = 0;
    for (int r = 0; r < 4; r++) {
        double a = now();
        TRY(h3_copy(&ex, &d, &h));
        TRY(h3_exec_sync(&ex));
        double gbs = n / (now() - a) / 1e9;
        if (r && gbs > best) best = gbs;
    }
    h3_tensor_free(&h);
    h3_tensor_free(&d);
    h3_cuda_shutdown(&ex);
    return best;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One run: plan, reserve the budget, stream, time. */
static void run(h3_dit *dit, const h3_workload *w, const char *bname, int64_t budget, int64_t ram, int reps,
                double ceiling, const h3_device_figures *fig, result *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->work, sizeof r->work, "%s", w->name);
    snprintf(r->budget, sizeof r->budget, "%s", bname);
    r->budget_bytes = budget;
    r->ram_bytes = ram;
    r->disk = ram > 0;
    h3_seq_layout L;
    TRY(h3_seq_layout_t2va(128, NULL, w->frames, w->w, w->h, &L));
    const int64_t S = L.seq_len, Nv = L.n_video_rows, Na = L.n_audio_rows;

    h3_plan_model m;
    memset(&m, 0, sizeof m);
    m.dit = dit;
    m.dit_weights_pinned = 1;
    m.host_threads = 1;
    h3_plan_request req = {
        .frames = w->frames, .width = w->w, .height = w->h, .text_tokens = 128, .n_timesteps = N_TIMESTEPS,
        .gpus = g_split};
    h3_plan_budgets b = {.vram = budget, .ram = ram};
    static h3_plan plan;
    TRY(h3_plan_make(&m, &req, &b, fig, &plan));
    const h3_dit_plan *p = g_split > 1 ? &plan.dit_gpu[g_split - 1] : &plan.dit; /* the split's most rows */
    h3_comm loop;
    loopback_comm(&loop, g_split > 1 ? g_split - 1 : 0, g_split > 1 ? g_split : 1);
    r->fits = plan.fits;
    r->pred_peak = p->dev_peak;
    r->pred_step = p->t_step;
    r->pred_resident = p->t_resident;
    r->n_resident = p->n_resident;
    r->n_slots = p->n_slots;
    r->n_pinned = p->n_pinned;
    r->n_disk = p->n_disk;
    r->chunk = p->chunk_rows < S ? p->chunk_rows : S;
    if (!plan.fits) {
        snprintf(r->note, sizeof r->note, "does not fit: %.200s", plan.why);
        r->ok = 1; /* stopping before loading is the expected outcome */
        printf("%-5s %-9s does not fit (stopped before loading): %s\n", w->name, bname, plan.why);
        h3_seq_layout_free(&L);
        return;
    }

    int32_t *tidx = malloc((size_t)S * 4), *tags = malloc((size_t)S * 4), *vi = malloc((size_t)Nv * 4),
            *ai = malloc((size_t)Na * 4), *ti = malloc(128 * 4);
    float uniq[4], all_t[N_TIMESTEPS];
    int nt = h3_seq_layout_timestep_indices(&L, 0.37f, 0.61f, uniq, tidx);
    for (int64_t i = 0; i < S; i++) tags[i] = L.tags[i];
    for (int64_t i = 0; i < Nv; i++) vi[i] = (int32_t)L.video_indices[i];
    for (int64_t i = 0; i < Na; i++) ai[i] = (int32_t)L.audio_indices[i];
    for (int64_t i = 0; i < 128; i++) ti[i] = (int32_t)L.text_indices[i];
    for (int i = 0; i < N_TIMESTEPS; i++) all_t[i] = i < nt ? uniq[i] : (float)(i + 1) / (N_TIMESTEPS + 2);

    TRY(h3_cuda_init(&ex, 0, budget));
    h3_memrep *rep = NULL;
    TRY(h3_memrep_create(&ex, &rep));
    int64_t pred[H3_DEVCAT_COUNT], ppeak;
    h3_dit_plan_predicted(p, pred, &ppeak);
    h3_memrep_set_predicted(rep, pred, ppeak, budget);
    h3_dit_stream *ds = NULL;
    h3_tensor video = {0}, audio = {0}, text = {0}, vout = {0}, aout = {0};
    double t0 = now();
    h3_dit_placement pl;
    h3_dit_plan_placement(p, &pl);
    h3_status st = h3_dit_stream_open(dit, &ex, &pl, NULL, rep, &ds);
    double t_open = now() - t0, t_mod = 0;
    double times[16];
    int nrep = 0;
    if (st == H3_OK) {
        h3_memrep_set_category(rep, H3_DEVCAT_ACTIVATIONS);
        st = h3_tensor_alloc2(&video, H3_PLACE_DEVICE, H3_F32, Nv, 96, H3_MEM_ACTIVATIONS);
        if (st == H3_OK) st = h3_tensor_alloc2(&audio, H3_PLACE_DEVICE, H3_F32, Na, 32, H3_MEM_ACTIVATIONS);
        if (st == H3_OK) st = h3_tensor_alloc2(&text, H3_PLACE_DEVICE, H3_F32, 128, 5120, H3_MEM_ACTIVATIONS);
        if (st == H3_OK) st = h3_tensor_alloc2(&vout, H3_PLACE_DEVICE, H3_F32, Nv, 96, H3_MEM_ACTIVATIONS);
        if (st == H3_OK) st = h3_tensor_alloc2(&aout, H3_PLACE_DEVICE, H3_F32, Na, 32, H3_MEM_ACTIVATIONS);
        if (st == H3_OK) st = h3_op_random_uniform(&ex, &video, 11, -2.0f, 2.0f);
        if (st == H3_OK) st = h3_op_random_uniform(&ex, &audio, 12, -2.0f, 2.0f);
        if (st == H3_OK) st = h3_op_random_uniform(&ex, &text, 13, -1.0f, 1.0f);
    }
    if (st == H3_OK) {
        h3_memrep_set_category(rep, H3_DEVCAT_MODULATION);
        h3_memrep_mark(rep, "modulation");
        t0 = now();
        st = h3_dit_precompute_modulation(dit, &ex, all_t, N_TIMESTEPS);
        if (st == H3_OK) st = h3_exec_sync(&ex);
        t_mod = now() - t0;
        h3_memrep_set_category(rep, H3_DEVCAT_ACTIVATIONS);
    }
    h3_dit_inputs in = {&video, &audio, &text, uniq, nt, S, tidx, tags, L.pos, vi, ai, ti};
    for (int k = 0; k < reps + 1 && st == H3_OK; k++) { /* the first is the warm-up */
        char mk[32];
        snprintf(mk, sizeof mk, "step %d", k);
        h3_memrep_mark(rep, mk);
        double a = now();
        st = g_split > 1 ? h3_dit_forward_sp(dit, &ex, &loop, &in, &vout, &aout)
                         : h3_dit_forward(dit, &ex, &in, &vout, &aout);
        if (st == H3_OK) st = h3_exec_sync(&ex);
        if (st == H3_OK) st = h3_dit_stream_step_end(ds);
        if (k > 0) times[nrep++] = now() - a;
    }
    if (st == H3_OK && g_split > 1) { /* a share's velocities are not the model's (loopback_comm.h) */
        r->ok = 1;
    } else if (st == H3_OK) {
        /* the velocities are finite */
        h3_tensor hv;
        st = h3_tensor_alloc2(&hv, H3_PLACE_HOST, H3_F32, Nv, 96, H3_MEM_IO);
        if (st == H3_OK) st = h3_copy(&ex, &hv, &vout);
        if (st == H3_OK) st = h3_exec_sync(&ex);
        int64_t bad = 0;
        for (int64_t i = 0; st == H3_OK && i < Nv * 96; i++) bad += !isfinite(((float *)hv.data)[i]);
        h3_tensor_free(&hv);
        if (bad) snprintf(r->note, sizeof r->note, "%lld non-finite velocities", (long long)bad);
        r->ok = !bad;
    } else {
        snprintf(r->note, sizeof r->note, "failed: %.200s", h3_last_error());
    }
    int64_t used, peak, cap;
    h3_cuda_mem_stats(&ex, &used, &peak, &cap);
    r->peak = peak;
    if (nrep) {
        qsort(times, (size_t)nrep, sizeof *times, cmp_d);
        r->s_step = times[nrep / 2];
        r->s_min = times[0];
        r->s_max = times[nrep - 1];
    }
    if (ds) {
        h3_stream_stats ss;
        h3_dit_stream_stats(ds, &ss);
        r->copy_gbs = ss.copy_ms > 0 ? ss.bytes_timed / (ss.copy_ms * 1e-3) / 1e9 : 0;
        r->read_gbs = ss.read_s > 0 ? ss.bytes_read / ss.read_s / 1e9 : 0;
        h3_dit_stream_to_report(ds, rep, ceiling);
        if (ss.resyncs)
            snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note), " %lld resyncs",
                     (long long)ss.resyncs);
    }
    printf("%-5s %-9s %s%d resident, %d pinned, %d disk, %d slots, chunk %lld; streams %.2f GiB per step; open "
           "%.1f "
           "s, AdaLN pass %.2f s\n",
           w->name, bname, g_split > 1 ? "the last GPU's share of a split (rows through the blocks, loopback): " : "",
           p->n_resident, p->n_pinned, p->n_disk, p->n_slots, (long long)r->chunk, p->streamed_bytes / GIB, t_open,
           t_mod);
    char *txt = h3_memrep_format(rep);
    if (txt) {
        fputs(txt, stdout);
        h3_free(txt);
    }
    const char *out = getenv("OUT");
    if (out) {
        char path[1024], tag[64];
        snprintf(tag, sizeof tag, "%s", bname); /* "8 GiB" -> "8GiB": file names without spaces */
        char *d = tag;
        for (const char *c = tag; *c; c++)
            if (*c != ' ') *d++ = *c;
        *d = 0;
        snprintf(path, sizeof path, "%s/dit_stream_trace_%s_%s%s.json", out, w->name, tag,
                 r->disk ? "_disk" : "");
        if (h3_memrep_write_trace(rep, path) != H3_OK) h3_clear_error();
    }
    h3_tensor *ts[] = {&video, &audio, &text, &vout, &aout};
    for (int i = 0; i < 5; i++) h3_tensor_free(ts[i]);
    h3_dit_stream_close(ds);
    h3_dit_release_workspace(dit);
    h3_dit_release_modulation(dit);
    h3_memrep_free(rep);
    h3_cuda_shutdown(&ex);
    free(tidx);
    free(tags);
    free(vi);
    free(ai);
    free(ti);
    h3_seq_layout_free(&L);
}

int main(int argc, char **argv) {
    if (h3_cuda_device_count() == 0) {
        printf("bench_dit_stream: skipped: no CUDA device\n");
        return 0;
    }
    const char *names[8];
    int nn = 0, disk = 1, reps = 0, pruned = 0, have_q = 0;
    h3_qtarget quant = H3_QT_DEFAULT;
    double budgets_gib[16] = {0, 24, 16, 12, 8, 6}; /* 0: unlimited */
    int nb = 6;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-disk")) {
            disk = 0;
        } else if (!strcmp(argv[i], "--pruned")) {
            pruned = 1;
        } else if (!strcmp(argv[i], "--quant") && i + 1 < argc) {
            if (!h3_qtarget_parse(argv[++i], &quant) || quant == H3_QT_NVFP4 || quant == H3_QT_DEFAULT) {
                fprintf(stderr, "--quant takes int8_convrot, int8 or fp8, not '%s'\n", argv[i]);
                return 2;
            }
            have_q = 1;
        } else if (!strcmp(argv[i], "--split") && i + 1 < argc) {
            g_split = atoi(argv[++i]);
            if (g_split < 2 || g_split > 8 || 56 % g_split) {
                fprintf(stderr, "--split takes 2, 4, 7 or 8, not '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--budgets") && i + 1 < argc) {
            nb = 0;
            budgets_gib[nb++] = 0;
            for (char *t = strtok(argv[++i], ","); t && nb < 16; t = strtok(NULL, ","))
                budgets_gib[nb++] = atof(t);
        } else if (nn < 8) {
            names[nn++] = argv[i];
        }
    }
    if (!nn) {
        names[nn++] = "W73";
        names[nn++] = "W124";
        names[nn++] = "W362";
    }
    TRY(h3_exec_init(&ex, 0));
    char gpu[128] = "?";
    int64_t total = 0, free0 = 0;
    TRY(h3_cuda_device_info(0, gpu, sizeof gpu, &total, &free0));
    h3_device_figures fig;
    int have_fig = h3_device_figures_for(gpu, &fig);
    double ceiling = pinned_ceiling();
    printf("%s: %.1f GiB, %.1f GiB free; pinned host->device ceiling %.1f GB/s (2 GiB copies, best of 3)\n",
           gpu, total / GIB, free0 / GIB, ceiling);

    /* The DiT: every weight in pinned memory (the pinned allocator belongs to the backend: keep one up while
     * the weights are made and until they are freed). */
    TRY(h3_cuda_init(&ex, 0, (int64_t)1 << 30));
    h3_dit_config cfg;
    h3_dit_config_default(&cfg);
    if (pruned) { /* ComfyUI's curve form: adaln_t_table [1025, 8], AdaLN matrices [18·hidden, 8] */
        cfg.adaln_pruned = 1;
        cfg.time_embed_dim = 8;
        cfg.curve_grid = 1025;
    }
    h3_dit_open_opts oo;
    memset(&oo, 0, sizeof oo);
    oo.act_place = H3_PLACE_DEVICE;
    oo.weight_place = H3_PLACE_PINNED;
    oo.stream_weights = 1;
    h3_dit *dit;
    double t0 = now();
    TRY(h3_dit_create(&cfg, H3_BF16, &oo, &dit));
    uint64_t seed = 1;
    h3_dit_visit_weights(dit, fill_weight, &seed);
    if (have_q) TRY(h3_dit_randomize_blocks_quantized(dit, &ex, quant));
    h3_dit_weight_bytes wb;
    h3_dit_weight_bytes_of(dit, &wb);
    {
        h3_dit_pack pk;
        h3_dit_pack_unit(dit, h3_dit_n_units(&cfg) - 1, &pk);
        printf("DiT%s%s%s: %.2f GiB of weights in pinned memory (%.2f GiB AdaLN), a block packs %.3f GiB "
               "(values "
               "and scales), made in %.1f s\n",
               pruned ? ", pruned" : "", have_q ? ", blocks " : "", have_q ? h3_qtarget_name(quant) : "",
               wb.total / GIB, wb.adaln / GIB, pk.bytes / GIB, now() - t0);
    }
    h3_cuda_shutdown(&ex);

    int failed = 0;
    for (int k = 0; k < nn; k++) {
        const h3_workload *w = h3_workload_find(names[k]);
        if (!w) {
            fprintf(stderr, "unknown workload %s (W73, W124, W362, W124L)\n", names[k]);
            return 2;
        }
        int r_reps = reps ? reps : (w->frames > 300 ? 2 : 3);
        double resident = 0;
        for (int bi = 0; bi < nb; bi++) {
            int64_t free_b = 0;
            TRY(h3_cuda_device_info(0, NULL, 0, NULL, &free_b));
            int64_t budget = budgets_gib[bi] > 0 ? (int64_t)(budgets_gib[bi] * GIB) : free_b - H3_VRAM_MARGIN;
            char bname[16];
            if (budgets_gib[bi] > 0)
                snprintf(bname, sizeof bname, "%g GiB", budgets_gib[bi]);
            else
                snprintf(bname, sizeof bname, "unlimited");
            result *r = &g_res[g_nres++];
            run(dit, w, bname, budget, 0, r_reps, ceiling, have_fig ? &fig : NULL, r);
            if (bi == 0 && r->s_step > 0) resident = r->s_step;
            r->ratio = resident > 0 && r->s_step > 0 ? r->s_step / resident : 0;
            if (g_nres == 64) break;
        }
    }
    if (disk) {
        /* W124 at 8 GiB with a host budget that holds 8 fewer streamed blocks than the plan streams */
        const h3_workload *w = h3_workload_find("W124");
        h3_plan_model m;
        memset(&m, 0, sizeof m);
        m.dit = dit;
        m.dit_weights_pinned = 1;
        h3_plan_request req = {
            .frames = w->frames, .width = w->w, .height = w->h, .text_tokens = 128, .n_timesteps = N_TIMESTEPS};
        h3_plan_budgets b = {.vram = (int64_t)8 << 30, .ram = 0};
        static h3_plan plan;
        TRY(h3_plan_make(&m, &req, &b, NULL, &plan));
        h3_dit_pack pk;
        h3_dit_pack_unit(dit, 0, &pk);
        int streamed = plan.dit.n_units - plan.dit.n_resident;
        int64_t ram =
            (int64_t)2 * pk.bytes + plan.dit.host_other + (int64_t)(streamed - 8) * pk.bytes + pk.bytes / 2;
        double resident = 0;
        for (int i = 0; i < g_nres; i++)
            if (!strcmp(g_res[i].work, "W124") && !strcmp(g_res[i].budget, "unlimited"))
                resident = g_res[i].s_step;
        result *r = &g_res[g_nres++];
        run(dit, w, "8 GiB", (int64_t)8 << 30, ram, 2, ceiling, have_fig ? &fig : NULL, r);
        r->ratio = resident > 0 && r->s_step > 0 ? r->s_step / resident : 0;
    }
    TRY(h3_cuda_init(&ex, 0, (int64_t)1 << 30)); /* the pinned weights are freed through the backend */
    h3_dit_close(dit);
    h3_cuda_shutdown(&ex);

    printf("\n%-5s %-10s %-6s %9s %15s %7s %9s %10s %10s %8s %7s %s\n", "work", "budget", "host", "s/step",
           "(min-max)", "ratio", "predicted", "pred peak", "peak GiB", "peak err", "copy", "placement");
    FILE *js = NULL;
    const char *out = getenv("OUT");
    if (out) {
        char p[1024];
        snprintf(p, sizeof p, "%s/dit_stream.json", out);
        js = fopen(p, "w");
        if (js) fprintf(js, "{\"gpu\": \"%s\", \"pinned_ceiling_gbs\": %.2f, \"runs\": [\n", gpu, ceiling);
    }
    for (int i = 0; i < g_nres; i++) {
        result *r = &g_res[i];
        double err =
            r->pred_peak ? 100.0 * ((double)r->peak - (double)r->pred_peak) / (double)r->pred_peak : 0;
        int bad_mem = r->fits && (r->peak > r->budget_bytes || fabs(err) > 5.0);
        if (!r->ok || bad_mem) failed = 1;
        char host[16];
        snprintf(host, sizeof host, "%s", r->ram_bytes ? "disk" : "-");
        if (!r->fits) {
            printf("%-5s %-10s %-6s %s\n", r->work, r->budget, host, "does not fit: stopped before loading");
        } else {
            char ratio[16] = "-"; /* no resident run of this workload to compare with */
            if (r->ratio > 0) snprintf(ratio, sizeof ratio, "%.3f", r->ratio);
            printf("%-5s %-10s %-6s %9.3f   (%.3f-%.3f) %7s %9.3f %10.2f %10.2f %+7.2f%% %5.1f/%.0f  R%d "
                   "P%d D%d k%d "
                   "chunk %lld%s%s%s\n",
                   r->work, r->budget, host, r->s_step, r->s_min, r->s_max, ratio, r->pred_step,
                   r->pred_peak / GIB, r->peak / GIB, err, r->copy_gbs, ceiling, r->n_resident, r->n_pinned,
                   r->n_disk, r->n_slots, (long long)r->chunk, bad_mem ? "  MEMORY OFF PLAN" : "",
                   r->ok ? "" : "  FAILED ", r->note);
            if (r->disk) printf("      disk tier: %.2f GB/s read from the spill file\n", r->read_gbs);
        }
        if (js)
            fprintf(js,
                    "%s {\"workload\": \"%s\", \"budget\": \"%s\", \"budget_bytes\": %lld, "
                    "\"host_budget_bytes\": %lld, "
                    "\"fits\": %d, \"ok\": %d, \"s_per_step\": %.4f, \"min\": %.4f, \"max\": %.4f, "
                    "\"ratio\": %.4f, "
                    "\"predicted_s_per_step\": %.4f, \"predicted_resident\": %.4f, \"predicted_peak\": %lld, "
                    "\"measured_peak\": %lld, \"copy_gbs\": %.2f, \"read_gbs\": %.2f, \"resident\": %d, "
                    "\"pinned\": %d, "
                    "\"disk\": %d, \"slots\": %d, \"chunk\": %lld, \"note\": \"%s\"}",
                    i ? ",\n" : "", r->work, r->budget, (long long)r->budget_bytes, (long long)r->ram_bytes,
                    r->fits, r->ok, r->s_step, r->s_min, r->s_max, r->ratio, r->pred_step, r->pred_resident,
                    (long long)r->pred_peak, (long long)r->peak, r->copy_gbs, r->read_gbs, r->n_resident,
                    r->n_pinned, r->n_disk, r->n_slots, (long long)r->chunk,
                    r->fits ? "" : "stopped before loading");
    }
    if (js) {
        fprintf(js, "\n]}\n");
        fclose(js);
    }
    h3_exec_free(&ex);
    return failed;
}

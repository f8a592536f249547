/* The full-size DiT on the GPU, all weights resident: random bf16 weights of the official shapes (fp32
 * islands kept f32) generated in device memory, one forward = one sampling step at BENCH.md's workloads, with
 * the packed t2va layout the pipeline builds (128 text rows). Prints s/step (median and spread) and peak
 * device memory; writes the numbers as JSON to $OUT/dit_cuda.json when OUT is set.
 *
 *   bench_dit_cuda [--pruned] [--quant int8_convrot|int8|fp8 ...
 *                  | --quantize F [--quantize-blocks FIRST:COUNT] [--fp8-variants]] [--attention fp8|int8|sparse]
 *                  [--split N] [--init diffusers] [W73 W124 W362 W124L]
 *
 * --pruned: ComfyUI's curve-form AdaLN (rank 8) instead of the full time MLP: the 20B "pruned" files' shapes.
 * --quant F: after the bf16 runs, the blocks' four linears are replaced by random stored values of format F
 * (h3_dit_randomize_blocks_quantized: int8 per-row scales, ConvRot marked; fp8 one scale) and every workload
 * runs again: the quantized GEMMs (W8A8 int8 through cuBLASLt IMMA, fp8 through cuBLASLt fp8) against bf16 in
 * the same process. Several --quant run in the order given. Random stored values are fast to make but are not
 * the bf16 weights' quantization (the same 64 MiB of bytes in every block), so their velocities are not comparable
 * with the bf16 run's.
 * --quantize F: instead, the bf16 blocks' four linears are quantized to F (h3_dit_quantize_blocks: the format's
 * real rule, fp8 with one scale per tensor on the device, the others on the CPU) and every workload runs again;
 * its velocities (and those with --attention's low-bit attention) are printed as relative L2 distances from the
 * bf16 step's on the same weights and inputs: how far the quantized step moves the DiT's output.
 * --quantize-blocks FIRST:COUNT: with --quantize, only DiT blocks [FIRST, FIRST + COUNT) are quantized (the others
 * stay bf16): where in the stack the format's distance from the bf16 step comes from.
 * --fp8-variants: with --quantize fp8, every workload runs twice more on the same fp8 weights: with one activation
 * scale a chunk of rows instead of one a token (h3_cuda_qgemm_set_mode 2, Ada's rule), and with cuBLASLt's fast
 * accumulation off (H3_QGEMM_FP8_EXACT): the fp8 GEMM's choices timed and measured against the bf16 step in
 * one process.
 * --attention fp8|int8|sparse: each workload of each weight format runs again with the blocks' attention in fp8,
 * int8 or block-sparse (h3_dit_set_attention; sparse at its default tau on every timed step): its s/step, peak, and
 * the velocities' relative L2 distance from the same weights' run with bf16 attention.
 *
 * --init diffusers: the random weights spread as bench/dit_diffusers.py makes diffusers' (every matrix N(0, 0.02),
 * every vector, norms' and biases' alike, N(0, 0.5)), as uniform values of those deviations, instead of the default
 * (matrices uniform in ±0.03, norms in [0.9, 1.1], biases in ±0.01). Times do not depend on it; the distances of
 * --quantize and --attention do, since how far a random DiT carries a perturbation depends on its weights' spread.
 *
 * --split N: after each workload's whole step, the first and the last rank's share of the forward split over N GPUs
 * (h3_dit_forward_sp) run here alone, the other ranks stood in for by a loopback that moves only the rank's own
 * blocks: every kernel of its share at its real shapes; the exchange's bytes are counted and timed at 360 GB/s.
 *
 * The step time excludes the AdaLN modulation, which h3run computes once per run for all the schedule's
 * timesteps (h3_dit_precompute_modulation); its one-off cost is printed separately. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/threads.h"
#include "cuda/cuda.h"
#include "models/dit.h"
#include "pipeline/layout.h"
#include "pipeline/request.h"
#include "quant/qwrite.h"
#include "tensor/comm.h"

#include "loopback_comm.h"

#define TRY(x)                                                                                                   \
    do {                                                                                                         \
        if ((x) != H3_OK) {                                                                                      \
            fprintf(stderr, "%s failed: %s\n", #x, h3_last_error());                                             \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static h3_exec ex;
static uint64_t g_seed = 1;
static unsigned g_attn_lb; /* --attention: H3_ATTN_FP8, H3_ATTN_INT8 or H3_ATTN_SPARSE (0: bf16 only) */

/* --quantize: the bf16 step's velocities per workload (host), the reference of the quantized runs */
static float *g_ref_v[8], *g_ref_a[8];
static int g_quantized; /* the blocks now hold the bf16 weights' quantization */
static int g_sp;        /* --split N: each rank's share of the split forward timed on this GPU alone */

/* Each rank's share of the W forward split over g_sp GPUs, timed alone (loopback_comm.h): its s/step against the
 * whole step (whole_s), its device peak against h3_dit_forward_mem_sp's, and the step with the exchange at 360 GB/s
 * a direction (H200s on NVLink, assumed: the planner's figure). */
static void time_split(h3_dit *dit, const h3_workload *w, const char *label, h3_dit_inputs *in, h3_tensor *vout,
                       h3_tensor *aout, double whole_s, int64_t whole_peak, int reps, FILE *js) {
    for (int r = 0; r < g_sp; r++) {
        if (r > 0 && r < g_sp - 1) continue; /* the first and the last (most rows) */
        h3_comm c;
        loopback_comm(&c, r, g_sp);
        TRY(h3_dit_forward_sp(dit, &ex, &c, in, vout, aout)); /* warm-up */
        TRY(h3_exec_sync(&ex));
        h3_dit_release_workspace(dit); /* the whole forward's buffers out of the peak */
        int64_t used0, peak, cap;
        h3_cuda_reset_peak(&ex);
        c.bytes_in = 0;
        double t[8];
        for (int k = 0; k < reps; k++) {
            const double a = now();
            TRY(h3_dit_forward_sp(dit, &ex, &c, in, vout, aout));
            TRY(h3_exec_sync(&ex));
            t[k] = now() - a;
        }
        for (int i = 0; i < reps; i++)
            for (int j = i + 1; j < reps; j++)
                if (t[j] < t[i]) {
                    const double x = t[i];
                    t[i] = t[j];
                    t[j] = x;
                }
        h3_cuda_mem_stats(&ex, &used0, &peak, &cap);
        const double med = t[reps / 2], xbytes = (double)c.bytes_in / reps, xs = xbytes / 360e9;
        const int64_t L = in->text ? in->text->shape[0] : 0, Nv = in->video ? in->video->shape[0] : 0,
                      Na = in->audio ? in->audio->shape[0] : 0;
        h3_dit_forward_mem fw, fs;
        h3_dit_forward_mem_of(dit, 0, -1, in->seq_len, L, Nv, Na, 0, &fw);
        h3_dit_forward_mem_sp(dit, 0, -1, in->seq_len, L, Nv, Na, 0, g_sp, r, &fs);
        const double pred_d = (double)(fs.workspace + fs.exchange - fw.workspace) + (double)(fs.scratch - fw.scratch);
        printf("%-6s %-13s split %d/%d rank %d  %8.3f s/step alone (%.3fx the whole step)  + exchange %.2f GB at 360 "
               "GB/s %.3f s = %.3f s (%.3fx)  peak %.2f GiB (whole %.2f; predicted change %+.3f GiB, measured %+.3f)\n",
               w->name, label, r, g_sp, r, med, med / whole_s, xbytes / 1e9, xs, med + xs, (med + xs) / whole_s,
               peak / 1073741824.0, whole_peak / 1073741824.0, pred_d / 1073741824.0,
               (double)(peak - whole_peak) / 1073741824.0);
        if (js)
            fprintf(js, ", \"%s %s split %d rank %d\": {\"s_per_step\": %.4f, \"ratio\": %.4f, \"exchange_gb\": %.3f, "
                        "\"peak_gib\": %.3f}",
                    w->name, label, g_sp, r, med, med / whole_s, xbytes / 1e9, peak / 1073741824.0);
    }
    h3_dit_release_workspace(dit);
}

static const char *attn_name(void) {
    return g_attn_lb == H3_ATTN_INT8 ? "int8" : g_attn_lb == H3_ATTN_SPARSE ? "sparse" : "fp8";
}

static int g_init_diffusers; /* --init diffusers */

static int fill_weight(const char *name, h3_tensor *t, void *user) {
    (void)user;
    size_t n = strlen(name);
    int is_norm = strstr(name, "norm") != NULL;
    int is_bias = n > 5 && strcmp(name + n - 5, ".bias") == 0;
    float lo = -0.03f, hi = 0.03f; /* ~N(0, 0.02²) in spread */
    if (is_norm) lo = 0.9f, hi = 1.1f;
    if (is_bias) lo = -0.01f, hi = 0.01f;
    if (g_init_diffusers) { /* uniform in ±a has deviation a / sqrt(3) */
        const float a = (t->ndim > 1 ? 0.02f : 0.5f) * sqrtf(3.0f);
        lo = -a, hi = a;
    }
    if (h3_op_random_uniform(&ex, t, g_seed++, lo, hi) != H3_OK) {
        fprintf(stderr, "filling %s: %s\n", name, h3_last_error());
        exit(1);
    }
    return 0;
}

typedef struct {
    double s, peak_gib, s_fa; /* s_fa: s/step with low-bit attention (--attention fp8|int8) */
} result;

static double rel_l2(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : 0.0;
}

/* The median of reps timed forwards (at most 8), and their fastest and slowest in *lo, *hi. */
static double time_forwards(h3_dit *dit, h3_dit_inputs *in, h3_tensor *vout, h3_tensor *aout, int reps, double *lo,
                            double *hi) {
    double t[8];
    for (int r = 0; r < reps; r++) {
        double a = now();
        TRY(h3_dit_forward(dit, &ex, in, vout, aout));
        TRY(h3_exec_sync(&ex));
        t[r] = now() - a;
    }
    for (int i = 0; i < reps; i++)
        for (int j = i + 1; j < reps; j++)
            if (t[j] < t[i]) {
                double x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    *lo = t[0];
    *hi = t[reps - 1];
    return t[reps / 2];
}

/* One workload: modulation once, a warm-up forward, then the median of a few timed forwards. */
static result run_workload(h3_dit *dit, const h3_workload *w, int wi, const char *label, FILE *js, int *first) {
    result res = {0, 0, 0};
    int64_t used, peak, cap;
    h3_seq_layout L;
    TRY(h3_seq_layout_t2va(128, NULL, w->frames, w->w, w->h, &L));
    const int64_t S = L.seq_len, Nv = L.n_video_rows, Na = L.n_audio_rows;
    float uniq[4];
    int32_t *tidx = malloc((size_t)S * sizeof *tidx), *tags = malloc((size_t)S * sizeof *tags);
    int32_t *vi = malloc((size_t)Nv * 4), *ai = malloc((size_t)Na * 4), *ti = malloc(128 * 4);
    int nt = h3_seq_layout_timestep_indices(&L, 0.37f, 0.61f, uniq, tidx);
    for (int64_t r = 0; r < S; r++) tags[r] = L.tags[r];
    for (int64_t i = 0; i < Nv; i++) vi[i] = (int32_t)L.video_indices[i];
    for (int64_t i = 0; i < Na; i++) ai[i] = (int32_t)L.audio_indices[i];
    for (int64_t i = 0; i < 128; i++) ti[i] = (int32_t)L.text_indices[i];
    h3_tensor video, audio, text, vout, aout;
    TRY(h3_tensor_alloc2(&video, H3_PLACE_DEVICE, H3_F32, Nv, 96, H3_MEM_ACTIVATIONS));
    TRY(h3_tensor_alloc2(&audio, H3_PLACE_DEVICE, H3_F32, Na, 32, H3_MEM_ACTIVATIONS));
    TRY(h3_tensor_alloc2(&text, H3_PLACE_DEVICE, H3_F32, 128, 5120, H3_MEM_ACTIVATIONS));
    TRY(h3_tensor_alloc2(&vout, H3_PLACE_DEVICE, H3_F32, Nv, 96, H3_MEM_ACTIVATIONS));
    TRY(h3_tensor_alloc2(&aout, H3_PLACE_DEVICE, H3_F32, Na, 32, H3_MEM_ACTIVATIONS));
    TRY(h3_op_random_uniform(&ex, &video, 11, -2.0f, 2.0f));
    TRY(h3_op_random_uniform(&ex, &audio, 12, -2.0f, 2.0f));
    TRY(h3_op_random_uniform(&ex, &text, 13, -1.0f, 1.0f));
    h3_dit_inputs in = {&video, &audio, &text, uniq, nt, S, tidx, tags, L.pos, vi, ai, ti};
    double tm0 = now();
    TRY(h3_dit_precompute_modulation(dit, &ex, uniq, nt));
    TRY(h3_exec_sync(&ex));
    double tmod = now() - tm0;
    TRY(h3_dit_forward(dit, &ex, &in, &vout, &aout)); /* warm-up: workspace, plans */
    TRY(h3_exec_sync(&ex));
    h3_cuda_reset_peak(&ex);
    const int reps = S > 40000 ? 2 : 4;
    double t_lo, t_hi;
    const double med = time_forwards(dit, &in, &vout, &aout, reps, &t_lo, &t_hi);
    h3_cuda_mem_stats(&ex, &used, &peak, &cap);
    if (getenv("H3_PROFILE")) { /* one more forward with every op timed on its own */
        memset(ex.prof_s, 0, sizeof ex.prof_s);
        memset(ex.prof_n, 0, sizeof ex.prof_n);
        ex.profile = 1;
        double a = now();
        TRY(h3_dit_forward(dit, &ex, &in, &vout, &aout));
        TRY(h3_exec_sync(&ex));
        double total = now() - a, ops = 0;
        ex.profile = 0;
        printf("  profile of one %s %s forward (each op synchronized): %.3f s\n", label, w->name, total);
        for (int op = 0; op < H3_OP_COUNT; op++) {
            if (!ex.prof_n[op]) continue;
            ops += ex.prof_s[op];
            printf("    %-20s %6lld calls %9.3f s  %5.1f%%\n", h3_op_name((h3_op_id)op),
                   (long long)ex.prof_n[op], ex.prof_s[op], 100.0 * ex.prof_s[op] / total);
        }
        printf("    %-20s %16s %9.3f s  %5.1f%%\n", "outside ops", "", total - ops,
               100.0 * (total - ops) / total);
    }
    /* sanity: the velocities are finite */
    h3_tensor hv;
    TRY(h3_tensor_alloc2(&hv, H3_PLACE_HOST, H3_F32, Nv, 96, H3_MEM_ACTIVATIONS));
    TRY(h3_copy(&ex, &hv, &vout));
    TRY(h3_exec_sync(&ex));
    int bad = 0;
    for (int64_t i = 0; i < Nv * 96; i++) bad += !isfinite(((float *)hv.data)[i]);
    printf("%-6s %-13s rows %6lld  %8.3f s/step  (min %.3f, max %.3f)  peak %6.1f GiB  modulation once %.3f "
           "s%s\n",
           w->name, label, (long long)S, med, t_lo, t_hi, peak / 1073741824.0, tmod,
           bad ? "  NON-FINITE OUTPUT" : "");
    if (js) {
        fprintf(js,
                "%s\"%s %s\": {\"rows\": %lld, \"s_per_step\": %.4f, \"min\": %.4f, \"max\": %.4f, "
                "\"peak_gib\": %.2f}",
                *first ? "" : ", ", w->name, label, (long long)S, med, t_lo, t_hi,
                peak / 1073741824.0);
        *first = 0;
    }
    h3_tensor ha;
    TRY(h3_tensor_alloc2(&ha, H3_PLACE_HOST, H3_F32, Na, 32, H3_MEM_ACTIVATIONS));
    TRY(h3_copy(&ex, &ha, &aout));
    TRY(h3_exec_sync(&ex));
    if (!g_quantized && !bad) { /* the reference of a later --quantize run */
        free(g_ref_v[wi]);
        free(g_ref_a[wi]);
        g_ref_v[wi] = malloc((size_t)Nv * 96 * 4);
        g_ref_a[wi] = malloc((size_t)Na * 32 * 4);
        if (g_ref_v[wi]) memcpy(g_ref_v[wi], hv.data, (size_t)Nv * 96 * 4);
        if (g_ref_a[wi]) memcpy(g_ref_a[wi], ha.data, (size_t)Na * 32 * 4);
    }
    if (g_quantized && !bad && g_ref_v[wi] && g_ref_a[wi]) {
        const double ev = rel_l2(hv.data, g_ref_v[wi], Nv * 96), ea = rel_l2(ha.data, g_ref_a[wi], Na * 32);
        printf("%-6s %-13s velocities %.2e (video) %.2e (audio) relative L2 off the bf16 step (same weights)\n",
               w->name, label, ev, ea);
        if (js)
            fprintf(js, ", \"%s %s off bf16\": {\"rel_l2_video\": %.3e, \"rel_l2_audio\": %.3e}", w->name, label,
                    ev, ea);
    }
    if (g_sp > 1 && !bad) time_split(dit, w, label, &in, &vout, &aout, med, peak, reps, js);
    if (g_attn_lb && !bad) { /* the same weights and inputs with low-bit attention in the blocks */
        h3_tensor hv8, ha8;
        TRY(h3_tensor_alloc2(&hv8, H3_PLACE_HOST, H3_F32, Nv, 96, H3_MEM_ACTIVATIONS));
        TRY(h3_tensor_alloc2(&ha8, H3_PLACE_HOST, H3_F32, Na, 32, H3_MEM_ACTIVATIONS));
        h3_dit_set_attention(dit, g_attn_lb);
        /* sparse: Sol-Attn's tau on every step the bench times (its window of t set wide open) */
        TRY(h3_dit_set_sparse(dit, H3_DIT_SPARSE_TAU, 0.0f, 1.0f, H3_DIT_SPARSE_MIN_ROWS));
        TRY(h3_dit_forward(dit, &ex, &in, &vout, &aout));
        TRY(h3_exec_sync(&ex));
        h3_cuda_reset_peak(&ex);
        double fa_lo, fa_hi;
        res.s_fa = time_forwards(dit, &in, &vout, &aout, reps, &fa_lo, &fa_hi);
        int64_t used8, peak8, cap8;
        h3_cuda_mem_stats(&ex, &used8, &peak8, &cap8);
        TRY(h3_copy(&ex, &hv8, &vout));
        TRY(h3_copy(&ex, &ha8, &aout));
        TRY(h3_exec_sync(&ex));
        h3_dit_set_attention(dit, 0);
        const double ev = rel_l2(hv8.data, hv.data, Nv * 96), ea = rel_l2(ha8.data, ha.data, Na * 32);
        printf("%-6s %-13s rows %6lld  %8.3f s/step  %.3fx of bf16 attention  peak %6.1f GiB  velocities %.2e "
               "(video) %.2e (audio) relative L2 off bf16 attention\n",
               w->name, g_attn_lb == H3_ATTN_INT8 ? "+int8 attn" : g_attn_lb == H3_ATTN_SPARSE ? "+sparse attn" : "+fp8 attn", (long long)S, res.s_fa, res.s_fa / med, peak8 / 1073741824.0, ev, ea);
        if (js) fprintf(js, ", \"%s %s %sattn\": {\"s_per_step\": %.4f, \"peak_gib\": %.2f, \"rel_l2_video\": %.3e, "
                        "\"rel_l2_audio\": %.3e}", w->name, label, attn_name(), res.s_fa, peak8 / 1073741824.0, ev, ea);
        if (g_quantized && g_ref_v[wi] && g_ref_a[wi]) {
            const double rv = rel_l2(hv8.data, g_ref_v[wi], Nv * 96), ra = rel_l2(ha8.data, g_ref_a[wi], Na * 32);
            const char *lb = g_attn_lb == H3_ATTN_INT8     ? "+int8 attn"
                             : g_attn_lb == H3_ATTN_SPARSE ? "+sparse attn"
                                                           : "+fp8 attn";
            printf("%-6s %-13s velocities %.2e (video) %.2e (audio) relative L2 off the bf16 step (same weights)\n",
                   w->name, lb, rv, ra);
            if (js)
                fprintf(js, ", \"%s %s %sattn off bf16\": {\"rel_l2_video\": %.3e, \"rel_l2_audio\": %.3e}", w->name,
                        label, attn_name(), rv, ra);
        }
        h3_tensor_free(&hv8);
        h3_tensor_free(&ha8);
    }
    h3_tensor_free(&hv);
    h3_tensor_free(&ha);
    h3_tensor_free(&video);
    h3_tensor_free(&audio);
    h3_tensor_free(&text);
    h3_tensor_free(&vout);
    h3_tensor_free(&aout);
    free(tidx);
    free(tags);
    free(vi);
    free(ai);
    free(ti);
    h3_seq_layout_free(&L);
    h3_dit_release_workspace(dit);
    if (bad) exit(1);
    res.s = med;
    res.peak_gib = peak / 1073741824.0;
    return res;
}

int main(int argc, char **argv) {
    if (h3_cuda_device_count() == 0) {
        printf("bench_dit_cuda: skipped: no CUDA device\n");
        return 0;
    }
    const char *names[8];
    int nn = 0, pruned = 0, nq = 0, quantize = 0, fp8_variants = 0, qb_first = -1, qb_count = 0;
    h3_qtarget quant[4];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pruned")) {
            pruned = 1;
        } else if (!strcmp(argv[i], "--split") && i + 1 < argc) {
            g_sp = atoi(argv[++i]);
            if (g_sp < 2 || g_sp > 8 || 56 % g_sp) {
                fprintf(stderr, "--split takes 2, 4, 7 or 8 (ranks of the 56 heads), not '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--init") && i + 1 < argc) {
            if (strcmp(argv[++i], "diffusers")) {
                fprintf(stderr, "--init takes diffusers, not '%s'\n", argv[i]);
                return 2;
            }
            g_init_diffusers = 1;
        } else if (!strcmp(argv[i], "--fp8-variants")) {
            fp8_variants = 1;
        } else if (!strcmp(argv[i], "--quantize-blocks") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d:%d", &qb_first, &qb_count) != 2 || qb_first < 0 || qb_count < 1) {
                fprintf(stderr, "--quantize-blocks takes FIRST:COUNT (blocks from 0), not '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--attention") && i + 1 < argc) {
            ++i;
            if (strcmp(argv[i], "fp8") && strcmp(argv[i], "int8") && strcmp(argv[i], "sparse")) {
                fprintf(stderr, "--attention takes fp8, int8 or sparse (bf16 always runs), not '%s'\n", argv[i]);
                return 2;
            }
            g_attn_lb = !strcmp(argv[i], "int8") ? H3_ATTN_INT8 : !strcmp(argv[i], "sparse") ? H3_ATTN_SPARSE : H3_ATTN_FP8;
        } else if ((!strcmp(argv[i], "--quant") || !strcmp(argv[i], "--quantize")) && i + 1 < argc && nq < 4) {
            if (!strcmp(argv[i], "--quantize")) quantize = 1;
            if (!h3_qtarget_parse(argv[++i], &quant[nq]) || quant[nq] == H3_QT_NVFP4 ||
                quant[nq] == H3_QT_DEFAULT) {
                fprintf(stderr, "--quant takes int8_convrot, int8 or fp8, not '%s'\n", argv[i]);
                return 2;
            }
            nq++;
        } else if (nn < 8) {
            names[nn++] = argv[i];
        }
    }
    if (quantize && nq != 1) {
        fprintf(stderr, "--quantize takes one format and no --quant beside it (the bf16 weights are quantized once)\n");
        return 2;
    }
    if (qb_first >= 0 && !quantize) {
        fprintf(stderr, "--quantize-blocks goes with --quantize\n");
        return 2;
    }
    if (fp8_variants && (!quantize || quant[0] != H3_QT_FP8)) {
        fprintf(stderr, "--fp8-variants goes with --quantize fp8\n");
        return 2;
    }
    if (nn == 0) {
        names[nn++] = "W73";
        names[nn++] = "W124";
        names[nn++] = "W362";
    }
    const h3_workload *ws[8];
    for (int k = 0; k < nn; k++) {
        ws[k] = h3_workload_find(names[k]);
        if (!ws[k]) {
            fprintf(stderr, "unknown workload %s\n", names[k]);
            return 2;
        }
    }
    TRY(h3_exec_init(&ex, 0));
    TRY(h3_cuda_init(&ex, 0, 0));
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
    oo.weight_place = H3_PLACE_DEVICE;
    h3_dit *dit;
    double t0 = now();
    TRY(h3_dit_create(&cfg, H3_BF16, &oo, &dit));
    h3_dit_visit_weights(dit, fill_weight, NULL);
    TRY(h3_exec_sync(&ex));
    FILE *js = NULL;
    const char *out = getenv("OUT");
    if (out) {
        char p[1024];
        snprintf(p, sizeof p, "%s/dit_cuda.json", out);
        js = fopen(p, "w");
        if (js) fprintf(js, "{");
    }
    result base[8], q[4][8];
    int first = 1;
    for (int f = -1; f < nq; f++) {
        const char *label = f < 0 ? "bf16" : h3_qtarget_name(quant[f]);
        if (f >= 0) {
            double tq = now();
            if (quantize) {
                h3_pool *pool = NULL;
                TRY(h3_pool_create(0, &pool));
                if (qb_first >= 0)
                    TRY(h3_dit_quantize_block_range(dit, &ex, quant[f], pool, qb_first, qb_count));
                else
                    TRY(h3_dit_quantize_blocks(dit, &ex, quant[f], pool));
                h3_pool_free(pool);
                g_quantized = 1;
                if (qb_first >= 0)
                    printf("blocks %d..%d quantized to %s (from the bf16 weights; the others stay bf16) in %.1f s\n",
                           qb_first, qb_first + qb_count - 1, label, now() - tq);
                else
                    printf("blocks quantized to %s (from the bf16 weights) in %.1f s\n", label, now() - tq);
            } else {
                TRY(h3_dit_randomize_blocks_quantized(dit, &ex, quant[f]));
                printf("blocks replaced by random %s in %.1f s\n", label, now() - tq);
            }
        }
        h3_dit_weight_bytes wb;
        h3_dit_weight_bytes_of(dit, &wb);
        int64_t used, peak, cap;
        h3_cuda_mem_stats(&ex, &used, &peak, &cap);
        printf("h3run DiT (%s%s): %.2f GiB of weights (%.2f GiB AdaLN), %.2f GiB of the device in use%s; "
               "budget %.1f "
               "GiB\n",
               pruned ? "pruned, " : "", label, wb.total / 1073741824.0, wb.adaln / 1073741824.0,
               used / 1073741824.0, f < 0 ? "" : " (values + scales + the quantized GEMMs' scratch)",
               cap / 1073741824.0);
        if (f < 0) printf("  built in %.1f s\n", now() - t0);
        for (int k = 0; k < nn; k++) {
            result r = run_workload(dit, ws[k], k, label, js, &first);
            if (f < 0)
                base[k] = r;
            else
                q[f][k] = r;
        }
    }
    if (fp8_variants) { /* the same fp8 weights, the GEMM's other choices */
        static const struct {
            int mode;
            const char *label;
        } var[2] = {{2, "fp8 a-chunk"}, {H3_QGEMM_FP8_EXACT, "fp8 exact-acc"}};
        for (int v = 0; v < 2; v++) {
            h3_cuda_qgemm_set_mode(&ex, var[v].mode);
            printf("fp8 GEMMs %s\n", v == 0 ? "with one activation scale a chunk of rows (Ada's rule)"
                                             : "with one activation scale a token, partial sums promoted to fp32");
            for (int k = 0; k < nn; k++) run_workload(dit, ws[k], k, var[v].label, js, &first);
        }
        h3_cuda_qgemm_set_mode(&ex, 0);
    }
    if (nq) {
        printf("\nsame process, resident, one step (ratio: quantized s/step over bf16 s/step)\n");
        printf("%-6s %10s", "", "bf16 s");
        for (int f = 0; f < nq; f++) printf(" %14s s %7s", h3_qtarget_name(quant[f]), "ratio");
        printf("\n");
        for (int k = 0; k < nn; k++) {
            printf("%-6s %10.3f", ws[k]->name, base[k].s);
            for (int f = 0; f < nq; f++) printf(" %16.3f %6.3fx", q[f][k].s, q[f][k].s / base[k].s);
            printf("\n");
        }
    }
    if (g_attn_lb) {
        printf("\nwith %s attention (s/step; ratio over bf16 weights with bf16 attention)\n", attn_name());
        for (int k = 0; k < nn; k++) {
            printf("%-6s bf16 %.3f -> %.3f (%.3fx)", ws[k]->name, base[k].s, base[k].s_fa, base[k].s_fa / base[k].s);
            for (int f = 0; f < nq; f++)
                printf("   %s %.3f -> %.3f (%.3fx)", h3_qtarget_name(quant[f]), q[f][k].s, q[f][k].s_fa,
                       q[f][k].s_fa / base[k].s);
            printf("\n");
        }
    }
    if (js) {
        fprintf(js, "}\n");
        fclose(js);
    }
    for (int k = 0; k < 8; k++) {
        free(g_ref_v[k]);
        free(g_ref_a[k]);
    }
    h3_dit_close(dit);
    h3_cuda_shutdown(&ex);
    h3_exec_free(&ex);
    return 0;
}

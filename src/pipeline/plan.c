/* The memory planner (plan.h): the arithmetic of every stage's memory, the choice of chunking, ring depth and
 * placement of each DiT unit, the step-time model, and the message when nothing fits. */
#include "pipeline/plan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "mem/budget.h"
#include "mem/pack.h"
#include "models/lora.h"
#include "models/dit_stream.h"
#include "pipeline/layout.h"
#include "quant/quant.h"
#include "sample/schedule.h"

#define GIB H3_GIB

/* ---- device figures ------------------------------------------------------------------------------------ */

/* fp8 attention inside a DiT block on the H200, its quantization passes included: the W124 step with fp8
 * attention (192-key tiles, O flushed every 4) saves 0.316-0.325 s of the bf16 step's 1.048 s of attention
 * (bench/NOTES.md "fp8 attention: O's flush every four tiles": 50 x 10.8 TFLOP in 0.728 s) */
#define H3_H200_ATTN_FP8_TFLOPS 742.0
/* fp8 (W8A8) GEMMs inside a DiT block on the H200, their activation passes included: 0.537 s of a W124 step's
 * GEMMs for 50 x 14.96 TFLOP (one activation scale a token, fast accumulation; same notes) */
#define H3_H200_GEMM_FP8_TFLOPS 1393.0
/* A split DiT's exchanges between H200s (SXM, NVLink 4: 450 GB/s each way on paper): 80% of it assumed for NCCL's
 * grouped sends and receives. Not measured: no machine with two GPUs has run the split yet (docs/MEMORY.md). */
#define H3_H200_LINK_GBS 360.0
/* The DiT blocks' norms, RoPE, SwiGLU and residuals since they read and write four values a thread: 0.121 s a W124
 * step (swiglu 0.027, gated residuals 0.020, AdaLN pre-norms 0.022, QK-norm + RoPE 0.052; bench/NOTES.md, "fp8 GEMMs
 * with one scale a token") over 50 blocks of 19,412 rows by 5,376: 23.2 ns per 1000. The other stages' elementwise
 * work (the audio VAE's) keeps the general figure. */
#define H3_H200_DIT_ELTWISE_NS 23.2
/* Attention at head size 64 (the video VAE decoder's 32 heads; the wgmma kernel's head-64 instance): a W124 decode's
 * 36 blocks x 105 tiles of 1,797 tokens, 100.0 TFLOP, took 0.462 s (bench/NOTES.md, "The video VAE decode: where the
 * time goes"; the mma.sync kernel it replaced took 0.825) */
#define H3_H200_ATTN64_TFLOPS 216.0

/* The H200's are measured (BENCH.md ceilings; bench/NOTES.md profile of a W124 step): the GEMM and attention
 * rates are what the DiT achieves inside a block (1.012 s of GEMMs for 50 × 14.96 TFLOP; 1.048 s of attention
 * for 50 × 10.8 TFLOP; 0.184 s of norms, RoPE, SwiGLU and residuals for 50 × 19,412 × 5,376 elements), so the
 * model reproduces the measured 2.227 s step. The disk figure is an assumption (a data-centre NVMe drive)
 * until measured (the GPU machine's cold reads ran at 1.0-1.5 GB/s, bench/NOTES.md); the page-cache figure is
 * the streamer's measured rate out of cached files (6.7-10.2 GB/s; the text encoder's 12.8 GiB per prompt
 * took 1.02 s in the end-to-end run); the f32 rate (the audio VAE's convolutions, no TF32) is the data
 * sheet's. */
static const h3_device_figures g_figures[] = {
    {"h200", "NVIDIA H200, measured: pinned copies 55.3 GB/s, in-DiT GEMM 739 and attention 515 TFLOP/s",
     (int64_t)139 << 30, 55.3, 6.75, 2.0, 739.1, 128.0, 515.0, 35.3, 67.0, 10.0, H3_H200_GEMM_FP8_TFLOPS,
     H3_H200_ATTN_FP8_TFLOPS, H3_H200_LINK_GBS, H3_H200_DIT_ELTWISE_NS, H3_H200_ATTN64_TFLOPS},
};

int h3_device_figures_find(const char *name, h3_device_figures *out) {
    for (size_t i = 0; i < sizeof g_figures / sizeof g_figures[0]; i++)
        if (name && !strcmp(name, g_figures[i].name)) {
            *out = g_figures[i];
            return 1;
        }
    return 0;
}

const char *h3_device_figures_names(void) {
    return "h200";
}

int h3_device_figures_for(const char *cuda_name, h3_device_figures *out) {
    if (cuda_name && strstr(cuda_name, "H200")) return h3_device_figures_find("h200", out);
    return 0;
}

h3_status h3_attn_mode_parse(const char *s, h3_attn_mode *out) {
    static const char *const names[] = {"auto", "bf16", "fp8", "int8", "sparse"};
    for (int i = 0; i < 5; i++)
        if (s && !strcmp(s, names[i])) {
            *out = (h3_attn_mode)i;
            return H3_OK;
        }
    return H3_ERR(H3_ERR_INVALID, "unknown --attention '%s': choose auto, bf16, fp8, int8 or sparse", s ? s : "");
}

#define SPARSE_RULE_WORDS                                                                                            \
    "give TAU or TAU,START,END (tau from -10 to 10, Sol-Attn's 1.3; the window of the schedule as fractions, 0 <= "   \
    "START < END <= 1, default 0.2,0.9), e.g. --sparse 1.3,0.2,0.9"

static int sparse_rule_ok(const h3_sparse_rule *r) {
    return isfinite(r->tau) && r->tau >= -10.0f && r->tau <= 10.0f && r->start >= 0.0f && r->start < r->end &&
           r->end <= 1.0f;
}

h3_status h3_sparse_rule_parse(const char *s, h3_sparse_rule *out) {
    h3_sparse_rule r = H3_SPARSE_RULE_DEFAULT;
    char *end = NULL;
    int ok = s && *s;
    if (ok) {
        r.tau = strtof(s, &end);
        ok = end != s;
    }
    if (ok && *end == ',') { /* START,END */
        const char *p = end + 1;
        r.start = strtof(p, &end);
        ok = end != p && *end == ',';
        if (ok) {
            p = end + 1;
            r.end = strtof(p, &end);
            ok = end != p;
        }
    }
    if (!ok || *end || !sparse_rule_ok(&r))
        return H3_ERR(H3_ERR_INVALID, "--sparse '%s': " SPARSE_RULE_WORDS, s ? s : "");
    *out = r;
    return H3_OK;
}

h3_status h3_sparse_rule_fits(const h3_sparse_rule *r, h3_attn_mode mode) {
    if (!sparse_rule_ok(r))
        return H3_ERR(H3_ERR_INVALID, "--sparse %g,%g,%g: " SPARSE_RULE_WORDS, (double)r->tau, (double)r->start,
                      (double)r->end);
    if (mode != H3_ATTN_MODE_SPARSE)
        return H3_ERR(H3_ERR_INVALID,
                      "--sparse sets the rule of --attention sparse; give --attention sparse or leave --sparse out");
    return H3_OK;
}

h3_status h3_sparse_rule_take(const char *s, int mode_given, h3_attn_mode *mode, h3_sparse_rule *out) {
    H3_TRY(h3_sparse_rule_parse(s, out));
    if (!mode_given) *mode = H3_ATTN_MODE_SPARSE;
    return h3_sparse_rule_fits(out, *mode);
}

h3_status h3_attention_resolve(h3_attn_mode mode, int on_cuda, unsigned kernels, int64_t head_dim, int fp8_weights,
                               int64_t rows, const h3_sparse_rule *sparse, unsigned *flags, char *why,
                               size_t why_len) {
    const h3_sparse_rule def = H3_SPARSE_RULE_DEFAULT, *sp = sparse ? sparse : &def;
    *flags = 0;
    if (head_dim != 128) kernels = 0;
    if (mode == H3_ATTN_MODE_SPARSE) {
        if (on_cuda && !(kernels & H3_CUDA_ATTN_SPARSE)) {
            snprintf(why, why_len, "sparse asked; no sparse attention kernel for this GPU and model");
            return H3_ERR(H3_ERR_UNSUPPORTED,
                          "--attention sparse runs on Hopper GPUs (compute capability 9.0) at the release's head size "
                          "of 128 only; this GPU or model has no such kernel: leave --attention out or give bf16");
        }
        *flags = H3_ATTN_SPARSE;
        snprintf(why, why_len, "sparse (asked%s; tau %.2g, steps %.2g..%.2g, %s)",
                 on_cuda ? "; Hopper's wgmma kernel" : "; on the host: the reference", (double)sp->tau,
                 (double)sp->start, (double)sp->end,
                 rows < H3_DIT_SPARSE_MIN_ROWS ? "dense: under 4,096 rows" : "4,096 rows or more");
        return H3_OK;
    }
    if (mode == H3_ATTN_MODE_FP8 || mode == H3_ATTN_MODE_INT8) {
        const int fp8 = mode == H3_ATTN_MODE_FP8;
        const char *name = fp8 ? "fp8" : "int8";
        if (on_cuda && !(kernels & (fp8 ? H3_CUDA_ATTN_FP8 : H3_CUDA_ATTN_INT8))) {
            snprintf(why, why_len, "%s asked; no %s attention kernel for this GPU and model", name, name);
            return H3_ERR(H3_ERR_UNSUPPORTED,
                          "--attention %s runs on GPUs of compute capability %s at the release's head size of 128 "
                          "only; this GPU or model has no such kernel: leave --attention out or give bf16",
                          name, fp8 ? "8.9 or later (Ada, Hopper, Blackwell)" : "7.5 or later (Turing onwards)");
        }
        *flags = fp8 ? H3_ATTN_FP8 : H3_ATTN_INT8;
        snprintf(why, why_len, "%s (asked%s)", name,
                 !on_cuda                                    ? "; on the host: the reference computation"
                 : fp8 && (kernels & H3_CUDA_ATTN_FP8_HOPPER) ? "; Hopper's wgmma kernel"
                                                              : "; the mma.sync kernel");
        return H3_OK;
    }
    if (mode == H3_ATTN_MODE_BF16) {
        snprintf(why, why_len, "bf16 (asked)");
        return H3_OK;
    }
    const int hopper = (kernels & H3_CUDA_ATTN_FP8_HOPPER) != 0;
    if (on_cuda && hopper && fp8_weights && rows >= 8192) {
        *flags = H3_ATTN_FP8;
        snprintf(why, why_len, "fp8 (auto: fp8 block weights, a Hopper GPU, %lld rows)", (long long)rows);
    } else {
        snprintf(why, why_len, "bf16 (auto: %s)",
                 !on_cuda      ? "on the host"
                 : !hopper     ? (kernels ? "this GPU's low-bit kernels are unmeasured; --attention asks for them"
                                          : "no low-bit attention kernel for this GPU and model")
                 : !fp8_weights ? "the block weights are not fp8; --attention fp8 trades accuracy for speed"
                               : "under 8,192 rows, attention is a small share of the step");
    }
    return H3_OK;
}

/* ---- helpers ------------------------------------------------------------------------------------------- */

static int64_t max64(int64_t a, int64_t b) {
    return a > b ? a : b;
}

static double maxd(double a, double b) {
    return a > b ? a : b;
}

static int fits_in(int64_t peak, int64_t budget) {
    return peak + h3_budget_slack(budget) <= budget;
}

/* The smallest budget b with fits_in(peak, b), rounded up to 64 MiB. */
static int64_t min_budget_for(int64_t peak) {
    const int64_t q = (int64_t)64 << 20;
    int64_t b = max64(peak + q, (int64_t)ceil((double)peak / 0.99));
    b = (b + q - 1) / q * q;
    while (!fits_in(peak, b)) b += q;
    return b;
}

h3_status h3_plan_weight_bytes(const char *set_path, int64_t *bytes) {
    h3_st_set s;
    *bytes = 0;
    H3_TRY(h3_st_open(set_path, &s));
    for (int64_t i = 0; i < s.n_entries; i++) *bytes += (int64_t)(s.entries[i].end - s.entries[i].begin);
    h3_st_close(&s);
    return H3_OK;
}

/* ---- the step-time simulation -------------------------------------------------------------------------- */

double h3_plan_simulate(const h3_sim_unit *u, int n, int k, int n_staging, double *copy_busy,
                        double *read_busy) {
    int streamed = 0, disk = 0;
    for (int i = 0; i < n; i++) {
        streamed += u[i].tier != H3_TIER_RESIDENT;
        disk += u[i].tier == H3_TIER_DISK;
    }
    if (copy_busy) *copy_busy = 0;
    if (read_busy) *read_busy = 0;
    if ((streamed && (k < 1 || k > H3_PLAN_MAX_SLOTS)) || (disk && (n_staging < 1 || n_staging > 8)))
        return INFINITY;
    double comp = 0, copy_free = 0, read_free = 0, slot_free[H3_PLAN_MAX_SLOTS] = {0}, stag_free[8] = {0};
    int64_t p = 0, pd = 0;
    double start = 0, cb = 0, rb = 0;
    const int cycles = 4; /* the ring settles within a step; the last is the steady state */
    for (int cy = 0; cy < cycles; cy++) {
        start = comp;
        double cb0 = cb, rb0 = rb;
        for (int i = 0; i < n; i++) {
            double ready = 0;
            int s = 0;
            if (u[i].tier != H3_TIER_RESIDENT) {
                s = (int)(p % k);
                double cs = maxd(copy_free, slot_free[s]); /* queued after the previous copy; waits free[s] */
                if (u[i].tier == H3_TIER_DISK) {
                    int j = (int)(pd % n_staging);
                    double rs = maxd(read_free, stag_free[j]); /* waits for the copy out of staging j */
                    read_free = rs + u[i].read;
                    rb += u[i].read;
                    cs = maxd(cs, read_free);
                }
                copy_free = cs + u[i].copy;
                cb += u[i].copy;
                if (u[i].tier == H3_TIER_DISK) stag_free[pd++ % n_staging] = copy_free;
                ready = copy_free;
            }
            comp = maxd(comp, ready) + u[i].compute;
            if (u[i].tier != H3_TIER_RESIDENT) {
                slot_free[s] = comp;
                p++;
            }
        }
        if (cy == cycles - 1) {
            if (copy_busy) *copy_busy = cb - cb0;
            if (read_busy) *read_busy = rb - rb0;
        }
    }
    return comp - start;
}

/* ---- DiT ----------------------------------------------------------------------------------------------- */

/* Compute seconds of one unit over `rows` rows with FFN chunks of `chunk` rows. A DiT block of a forward split over
 * `ranks` GPUs (h3_dit_forward_sp) runs its GEMMs on its rows but its attention on all S rows of heads / ranks
 * heads, and receives xbytes from the others (sending about as many at once) at the figures' link rate, on the
 * same stream; the whole forward: ranks 1, S = rows, xbytes 0. */
static double unit_seconds(const h3_dit_config *c, const h3_device_figures *f, int64_t rows, int64_t chunk,
                           int fp8, int fp8_attn, int64_t S, int ranks, double xbytes) {
    if (rows <= 0) return 0;
    if (ranks < 1) ranks = 1;
    const double H = (double)c->hidden, in = (double)h3_dit_inner(c), F = (double)c->ffn, M = (double)rows;
    const double ref = 19412.0 / (19412.0 + f->gemm_half_rows);
    const double mc = (double)(rows < chunk ? rows : chunk);
    const double eff_all = M / (M + f->gemm_half_rows) / ref, eff_ch = mc / (mc + f->gemm_half_rows) / ref;
    const double proj = 2.0 * M * (3.0 * in * H + in * H), ffn = 2.0 * M * (2.0 * F * H + F * H);
    const double attn = 4.0 * (double)S * (double)S * in / ranks;
    /* fp8 block weights run fp8 GEMMs (W8A8) where the device has a rate for them */
    const double g = fp8 && f->gemm_fp8_tflops > 0 ? f->gemm_fp8_tflops : f->gemm_tflops;
    const double ar = fp8_attn && f->attn_fp8_tflops > 0 ? f->attn_fp8_tflops : f->attn_tflops;
    return proj / (g * 1e12 * eff_all) + ffn / (g * 1e12 * eff_ch) + attn / (ar * 1e12) +
           M * H * (f->dit_eltwise_ns_per_kelem > 0 ? f->dit_eltwise_ns_per_kelem : f->eltwise_ns_per_kelem) * 1e-12 +
           (f->link_gbs > 0 ? xbytes / (f->link_gbs * 1e9) : 0);
}

/* Sizes of the DiT that do not depend on the plan. */
typedef struct dit_static {
    int n_units, n_ref;
    int64_t unit_bytes[H3_PLAN_MAX_UNITS];
    int64_t unit_max, adaln_bytes, adaln_total, globals;
    int from_file, pinned;
    int quantized; /* some weight is quantized (or would be, eight_bit): the quantized GEMMs' scratch */
    int fp8;       /* the blocks' GEMM weights are fp8 (e4m3): their GEMMs run at the fp8 rate */
} dit_static;

static h3_status dit_static_of(const h3_plan_model *m, int eight_bit, dit_static *ds) {
    const h3_dit_config *c = h3_dit_get_config(m->dit);
    memset(ds, 0, sizeof *ds);
    ds->n_units = h3_dit_n_units(c);
    ds->n_ref = (int)c->n_refiner_layers;
    if (ds->n_units > H3_PLAN_MAX_UNITS)
        return H3_ERR(H3_ERR_UNSUPPORTED, "the planner takes at most %d DiT blocks; this DiT has %d",
                      H3_PLAN_MAX_UNITS, ds->n_units);
    for (int u = 0; u < ds->n_units; u++) {
        h3_dit_pack p;
        h3_dit_pack_unit(m->dit, u, &p);
        ds->unit_bytes[u] = eight_bit ? p.bytes_8bit : p.bytes;
        ds->unit_max = max64(ds->unit_max, ds->unit_bytes[u]);
        ds->quantized |= eight_bit || p.quantized;
    }
    for (int b = 0; b < c->n_layers; b++) {
        h3_dit_pack p;
        h3_dit_pack_adaln(m->dit, b, &p);
        ds->adaln_bytes = max64(ds->adaln_bytes, p.bytes);
        ds->adaln_total += p.bytes;
        ds->quantized |= p.quantized;
    }
    ds->fp8 = ds->n_units > ds->n_ref && h3_dit_blocks_fp8(m->dit);
    ds->globals = h3_dit_globals_device_bytes(m->dit);
    ds->pinned = m->dit_weights_pinned;
    ds->from_file = m->dit_weights_in_file;
    return H3_OK;
}

/* Marks r of the units resident: refiner units first (their copies cannot hide behind their tiny compute),
 * then DiT blocks spread evenly so every stretch of streamed blocks has resident ones to hide behind. */
static void pick_resident(const dit_static *ds, int r, uint8_t *tier) {
    for (int u = 0; u < ds->n_units; u++) tier[u] = H3_TIER_PINNED;
    int nr = r < ds->n_ref ? r : ds->n_ref;
    for (int u = 0; u < nr; u++) tier[u] = H3_TIER_RESIDENT;
    int rest = r - nr, nd = ds->n_units - ds->n_ref;
    for (int j = 0; j < rest && j < nd; j++)
        tier[ds->n_ref + (int)(((double)j + 0.5) * nd / rest)] = H3_TIER_RESIDENT;
}

/* Of the streamed units, nd go to the disk tier, spread evenly. */
static void pick_disk(const dit_static *ds, int nd, uint8_t *tier) {
    int idx[H3_PLAN_MAX_UNITS], n = 0;
    for (int u = 0; u < ds->n_units; u++)
        if (tier[u] != H3_TIER_RESIDENT) idx[n++] = u;
    for (int j = 0; j < nd && j < n; j++) tier[idx[(int)(((double)j + 0.5) * n / nd)]] = H3_TIER_DISK;
}

typedef struct dit_ctx {
    const h3_plan_model *m;
    const h3_dit_config *c;
    const dit_static *ds;
    const h3_device_figures *f;
    int64_t S, L, Nv, Na;
    int n_t;
    int64_t vram, ram;
    int ranks, rank; /* a split DiT: this GPU's rank of `ranks` (0, 0: the whole DiT); ram is then its share */
} dit_ctx;

/* Fills all of p for one choice of chunk, ring depth k and resident count r; returns whether it fits. */
static int dit_eval(const dit_ctx *x, int64_t chunk, int k, int r, h3_dit_plan *p) {
    const dit_static *ds = x->ds;
    memset(p, 0, sizeof *p);
    p->present = 1;
    p->S = x->S;
    p->L = x->L;
    p->Nv = x->Nv;
    p->Na = x->Na;
    p->chunk_rows = chunk;
    const int ranks = x->ranks > 1 ? x->ranks : 1;
    p->gpus = ranks;
    p->rank = ranks > 1 ? x->rank : 0;
    p->row0 = x->S * p->rank / ranks;
    p->rows = x->S * (p->rank + 1) / ranks - p->row0;
    p->n_units = ds->n_units;
    p->unit_bytes = ds->unit_max;
    p->adaln_bytes = ds->adaln_bytes;
    pick_resident(ds, r, p->tier);
    p->n_resident = r;
    const int streamed = ds->n_units - r;
    /* The AdaLN projections stream once through the ring; with every unit resident, two slots of their size.
     */
    p->n_slots = streamed ? k : 2;
    p->slot_bytes = streamed ? max64(ds->unit_max, ds->adaln_bytes) : ds->adaln_bytes;
    if (!ds->adaln_bytes && !streamed) p->n_slots = 0;

    h3_dit_forward_mem fm;
    h3_dit_forward_mem_sp(x->m->dit, chunk, 0, x->S, x->L, x->Nv, x->Na, x->n_t, ranks, p->rank, &fm);
    p->attention = h3_dit_attention(x->m->dit);
    p->dev_backend = H3_CUDA_BACKEND_BYTES + (ds->quantized ? H3_CUDA_QGEMM_SCRATCH_BYTES : 0);
    p->dev_globals = ds->globals;
    for (int u = 0; u < ds->n_units; u++)
        if (p->tier[u] == H3_TIER_RESIDENT) p->dev_resident += h3_cuda_granule(ds->unit_bytes[u]);
    p->dev_slots = (int64_t)p->n_slots * h3_cuda_granule(p->slot_bytes);
    const int64_t H = x->c->hidden, nt = x->n_t;
    const size_t es = h3_dtype_size(h3_dit_act_dtype(x->m->dit));
    /* per-allocation granules of the kept tables; the scratch is a handful of buffers */
    p->dev_modulation = x->c->n_layers * h3_cuda_granule(nt * 3 * 6 * H * (int64_t)es) +
                        h3_cuda_granule(nt * 2 * H * (int64_t)es);
    if (nt < 1) p->dev_modulation = 0;
    /* the precompute's own buffers beside its tables: a handful, each rounded to a granule */
    p->dev_precompute_scratch = fm.mod_peak - fm.mod_tables + 4 * H3_CUDA_ARENA_ALIGN;
    p->dev_workspace = fm.workspace + 16 * H3_CUDA_ARENA_ALIGN; /* ~15 buffers, each rounded up */
    p->dev_io = h3_cuda_granule(fm.inputs) + h3_cuda_granule(fm.outputs) + 3 * H3_CUDA_ARENA_ALIGN;
    p->dev_scratch = h3_cuda_granule(fm.scratch) + H3_CUDA_ARENA_ALIGN;
    p->dev_exchange = fm.exchange ? fm.exchange + 2 * H3_CUDA_ARENA_ALIGN : 0; /* two buffers */
    {
        h3_lora_mode lm;
        const h3_lora *l = h3_dit_lora(x->m->dit, &lm);
        /* the side path's factors at most (every slot on it) and the merge's f32 scratch */
        p->dev_lora = l && l->n ? h3_cuda_granule(h3_lora_side_bytes(l, h3_dit_act_dtype(x->m->dit))) +
                                      3 * h3_cuda_granule(64 << 20)
                                : 0;
    }
    const int64_t base =
        p->dev_backend + p->dev_globals + p->dev_resident + p->dev_slots + p->dev_modulation + p->dev_lora;
    p->dev_peak_precompute = base + p->dev_precompute_scratch;
    p->dev_peak_forward = base + p->dev_workspace + p->dev_io + p->dev_scratch + p->dev_exchange;
    p->dev_peak = max64(p->dev_peak_forward, p->dev_peak_precompute);

    /* Host: pinned staging for reads from files (loading, the AdaLN pass, the disk tier), the pinned copies
     * of the streamed units the budget holds, and the forward's host tables (RoPE angles, row indices: ~1 KB
     * a row). */
    p->host_other = x->S * 1024 + ((int64_t)64 << 20);
    const int need_staging = !ds->pinned || ds->from_file;
    p->host_staging = need_staging ? (int64_t)H3_STREAM_STAGING * h3_cuda_granule(p->slot_bytes) : 0;
    int n_pin = streamed;
    if (x->ram > 0) {
        int64_t avail = x->ram - p->host_staging - p->host_other;
        int64_t can = avail > 0 ? avail / max64(ds->unit_max, 1) : 0;
        if (can < n_pin) n_pin = (int)can;
    }
    int n_disk = streamed - n_pin;
    if (n_disk > 0 && !p->host_staging)
        p->host_staging = (int64_t)H3_STREAM_STAGING * h3_cuda_granule(p->slot_bytes);
    if (n_disk > 0 && x->ram > 0) { /* staging appeared: recount what still fits pinned */
        int64_t avail = x->ram - p->host_staging - p->host_other;
        int64_t can = avail > 0 ? avail / max64(ds->unit_max, 1) : 0;
        n_pin = (int)(can < streamed ? can : streamed);
        n_disk = streamed - n_pin;
    }
    pick_disk(ds, n_disk, p->tier);
    p->n_pinned = n_pin;
    p->n_disk = n_disk;
    for (int u = 0; u < ds->n_units; u++) {
        if (p->tier[u] == H3_TIER_PINNED) p->host_pinned += ds->unit_bytes[u];
        if (p->tier[u] != H3_TIER_RESIDENT) p->streamed_bytes += ds->unit_bytes[u];
        if (p->tier[u] == H3_TIER_DISK) p->disk_bytes += ds->unit_bytes[u];
    }
    p->host_peak = p->host_pinned + p->host_staging + p->host_other;

    /* Time. */
    const h3_device_figures *f = x->f;
    h3_sim_unit su[H3_PLAN_MAX_UNITS] = {{0}}, sr[H3_PLAN_MAX_UNITS] = {{0}};
    /* the bytes received, the model's own count (h3_dit_forward_mem_sp) */
    const double xblock = (double)fm.received_block, xstep = (double)fm.received_end;
    p->exchange_bytes = fm.received_block * x->c->n_layers + fm.received_end;
    for (int u = 0; u < ds->n_units; u++) {
        const int ref = u < ds->n_ref;
        const int64_t rows = ref ? x->L : p->rows;
        su[u].compute = unit_seconds(x->c, f, rows, chunk, ds->fp8,
                                     u >= x->c->n_refiner_layers && (h3_dit_attention(x->m->dit) & H3_ATTN_FP8),
                                     ref ? x->L : x->S, ref ? 1 : ranks, ref ? 0 : xblock);
        su[u].copy = (double)ds->unit_bytes[u] / (f->pinned_gbs * 1e9);
        su[u].read = (double)ds->unit_bytes[u] / (f->disk_gbs * 1e9);
        su[u].tier = (h3_tier)p->tier[u];
        sr[u] = su[u];
        sr[u].tier = H3_TIER_RESIDENT;
        p->t_compute += su[u].compute;
    }
    /* the step's last exchange (the rows gathered after the blocks) */
    const double xlast = f->link_gbs > 0 ? xstep / (f->link_gbs * 1e9) : 0;
    p->t_exchange = f->link_gbs > 0 ? (double)p->exchange_bytes / (f->link_gbs * 1e9) : 0;
    p->t_compute += xlast;
    p->t_step = h3_plan_simulate(su, ds->n_units, p->n_slots, H3_STREAM_STAGING, &p->t_copy, &p->t_read) + xlast;
    for (int u = 0; u < ds->n_units; u++) {
        su[u].copy *= 1.25;
        su[u].read *= 1.25;
    }
    p->t_step_slow = h3_plan_simulate(su, ds->n_units, p->n_slots, H3_STREAM_STAGING, NULL, NULL) + xlast;
    p->t_resident = h3_plan_simulate(sr, ds->n_units, 0, 0, NULL, NULL) + xlast;
    /* Once per run: the AdaLN projections through the ring, from their files or pinned memory. */
    double src_gbs = ds->pinned && !ds->from_file ? f->pinned_gbs : f->disk_gbs;
    p->t_modulation = (double)ds->adaln_total / (fmin(src_gbs, f->pinned_gbs) * 1e9);
    p->t_load = ds->pinned && !ds->from_file
                    ? (double)p->dev_resident / (f->pinned_gbs * 1e9)
                    : (double)(p->dev_resident + p->host_pinned) / (f->disk_gbs * 1e9);
    p->fits = fits_in(p->dev_peak, x->vram) && (x->ram <= 0 || p->host_peak <= x->ram);
    return p->fits;
}

static const int64_t g_chunks[] = {(int64_t)1 << 30, 16384, 8192, 4096, 2048, 1024, 512};
#define N_CHUNKS ((int)(sizeof g_chunks / sizeof g_chunks[0]))

/* The best plan at these budgets; 0 when none fits (p then holds the smallest-memory plan). */
static int dit_search(const dit_ctx *x, h3_dit_plan *best) {
    const dit_static *ds = x->ds;
    int found = 0;
    h3_dit_plan cand;
    for (int ci = 0; ci < N_CHUNKS; ci++) {
        int64_t chunk = g_chunks[ci];
        if (ci > 0 && chunk >= x->S) continue; /* the same as the whole sequence */
        for (int k = 0; k <= H3_PLAN_MAX_SLOTS; k++) {
            int r;
            if (k == 0) {
                r = ds->n_units;
            } else {
                /* the most resident units next to k slots */
                dit_eval(x, chunk, k, 0, &cand);
                int64_t room = x->vram - h3_budget_slack(x->vram) - cand.dev_peak;
                r = 0;
                for (int u = 0; u < ds->n_units; u++)
                    if (room >= h3_cuda_granule(ds->unit_max)) {
                        room -= h3_cuda_granule(ds->unit_max);
                        r++;
                    }
                if (r >= ds->n_units) continue;             /* all resident: k = 0 covers it */
                if (ds->n_units - r < k && k > 1) continue; /* more slots than streamed units */
            }
            if (!dit_eval(x, chunk, k, r, &cand)) continue;
            int better = 0;
            if (!found) {
                better = 1;
            } else if (cand.t_step_slow < best->t_step_slow * 0.995) {
                better = 1;
            } else if (cand.t_step_slow <= best->t_step_slow * 1.005) {
                if (cand.streamed_bytes < best->streamed_bytes)
                    better = 1;
                else if (cand.streamed_bytes == best->streamed_bytes && cand.chunk_rows > best->chunk_rows &&
                         cand.t_step_slow <= best->t_step_slow)
                    better = 1;
            }
            if (better) {
                *best = cand;
                found = 1;
            }
        }
    }
    if (!found) dit_eval(x, g_chunks[N_CHUNKS - 1] < x->S ? g_chunks[N_CHUNKS - 1] : x->S, 1, 0, best);
    return found;
}

/* The least device memory any plan of this request takes, and the host memory with every streamed unit on
 * disk. */
static void dit_minimum(const dit_ctx *x, int64_t *dev, int64_t *host) {
    dit_ctx y = *x;
    y.vram = (int64_t)1 << 62;
    y.ram = 1; /* nothing pinned: every streamed unit from disk */
    h3_dit_plan p;
    int64_t chunk = g_chunks[N_CHUNKS - 1] < x->S ? g_chunks[N_CHUNKS - 1] : x->S;
    dit_eval(&y, chunk, 1, 0, &p);
    *dev = p.dev_peak;
    *host = p.host_staging + p.host_other;
}

/* ---- the other stages ---------------------------------------------------------------------------------- */

int64_t h3_plan_te_activation_bytes(const h3_te_config *c, int64_t n, int64_t chunk_rows) {
    /* as text_encoder.c's ws_alloc (f32): h [n, C], q and o [n, heads·D], k and v [n, kv·D], gate|up [chunk,
     * 2F], SwiGLU [chunk, F], cos and sin [n, D]; plus the caller's output [n, C] the layers update in place
     */
    const int64_t ch = n < (chunk_rows > 0 ? chunk_rows : 512) ? n : (chunk_rows > 0 ? chunk_rows : 512);
    const int64_t D = c->head_dim;
    int64_t e =
        n * c->hidden + 2 * n * c->heads * D + 2 * n * c->kv_heads * D + ch * 3 * c->intermediate + 2 * n * D;
    return (e + n * c->hidden) * 4;
}

static const h3_device_figures *figures_or_h200(const h3_device_figures *fig, h3_device_figures *ref) {
    if (fig) return fig;
    h3_device_figures_find("h200", ref);
    return ref;
}

/* The figures with file reads at the rate a component's files give now: the share of them in the page cache
 * at cache_gbs, the rest at disk_gbs (cached 0: all from the disk). */
static h3_device_figures with_cache(const h3_device_figures *fig, double cached) {
    h3_device_figures ref;
    h3_device_figures g = *figures_or_h200(fig, &ref);
    if (cached > 0 && g.cache_gbs > 0 && g.disk_gbs > 0) {
        if (cached > 1) cached = 1;
        g.disk_gbs = 1.0 / (cached / g.cache_gbs + (1.0 - cached) / g.disk_gbs);
    }
    return g;
}

double h3_plan_set_cached_fraction(const h3_st_set *s) {
    double cached = 0, total = 0;
    for (int i = 0; s && i < s->n_files; i++) {
        const int64_t c = h3_fd_cached_bytes(s->files[i].fd);
        if (c < 0) return 0;
        cached += (double)c;
        total += (double)s->files[i].file_size;
    }
    return total > 0 ? cached / total : 0;
}

double h3_plan_cached_fraction(const char *set_path) {
    h3_st_set s;
    if (!set_path || h3_st_open(set_path, &s) != H3_OK) {
        h3_clear_error();
        return 0;
    }
    const double r = h3_plan_set_cached_fraction(&s);
    h3_st_close(&s);
    return r;
}

/* The bytes text-encoder layer l streams (its tensors packed as the device's slots hold them: values and
 * scales at the arena's alignment), or -1 when its weights cannot be read; *gpu_why is set when a tensor is
 * in a form the GPU's GEMMs do not take. Acquiring a layer makes views of the mapped files and reads nothing.
 */
static int64_t te_layer_bytes(h3_text_encoder *te, int l, const char **gpu_why) {
    const h3_te_layer_weights *w;
    if (h3_text_encoder_layer_acquire(te, NULL, l, &w) != H3_OK) {
        h3_clear_error();
        return -1;
    }
    const h3_tensor *t[] = {&w->input_norm, &w->post_norm, &w->q,    &w->k,  &w->v,   &w->o,
                            &w->q_norm,     &w->k_norm,    &w->gate, &w->up, &w->down};
    h3_pack p;
    memset(&p, 0, sizeof p);
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        const char *why = NULL;
        if (!*gpu_why && !h3_quant_gpu_supported(t[i], &why)) *gpu_why = why ? why : "not on the GPU";
        h3_pack_add(&p, t[i], 0);
    }
    h3_text_encoder_layer_release(te, NULL, l);
    return p.bytes;
}

h3_status h3_plan_text_encoder(const h3_text_encoder *te_c, int64_t n, int layer, const h3_plan_budgets *b,
                               const h3_device_figures *fig, h3_stage_plan *s) {
    memset(s, 0, sizeof *s);
    /* the plan only makes views of the layers' tensors: nothing an encode depends on changes */
    h3_text_encoder *te = (h3_text_encoder *)te_c;
    const h3_te_config *c = h3_text_encoder_config(te);
    if (n < 1 || layer < 0 || layer > c->n_layers)
        return H3_ERR(H3_ERR_INVALID, "plan: the text encoder runs 1 or more tokens to a layer in 0..%lld",
                      (long long)c->n_layers);
    h3_device_figures ref;
    const h3_device_figures *f = figures_or_h200(fig, &ref);
    s->present = 1;
    s->n_units = layer;
    const char *gpu_why = NULL;
    int unreadable = 0;
    /* per layer: the GEMMs' FLOPs (2 per parameter and token) against its read from the file */
    const double params = (double)(c->hidden * (c->heads + 2 * c->kv_heads) * c->head_dim +
                                   c->heads * c->head_dim * c->hidden + 3 * c->intermediate * c->hidden);
    const double comp =
        2.0 * (double)n * params / (f->gemm_tflops * 1e12) +
        4.0 * (double)n * (double)n * (double)(c->heads * c->head_dim) / (f->attn_tflops * 1e12);
    for (int l = 0; l < layer; l++) {
        int64_t lb = te_layer_bytes(te, l, &gpu_why);
        if (lb < 0) {
            unreadable = 1;
            break;
        }
        s->weight_bytes += lb;
        s->t_run += maxd(comp, (double)lb / (f->disk_gbs * 1e9));
    }
    const int64_t host_act = h3_plan_te_activation_bytes(c, n, 0);
    s->dev_need = unreadable || gpu_why ? 0 : h3_text_encoder_device_bytes(te, n, layer);
    if (s->dev_need < 0) s->dev_need = 0;
    char a[32], d[32], e[32];
    h3_budget_str(s->weight_bytes, a, sizeof a);
    h3_budget_str(s->dev_need, d, sizeof d);
    s->on_device = b->vram > 0 && s->dev_need > 0 && fits_in(s->dev_need, b->vram);
    if (s->on_device) {
        s->dev_peak = s->dev_need;
        /* encode_device's host tensors: the prompt's embedding rows, the rotary tables, the caller's output
         */
        s->host_peak = 2 * n * c->hidden * 4 + 2 * n * c->head_dim * 4;
        snprintf(s->detail, sizeof s->detail,
                 "on the device: %d of %lld layers streamed from the mapped file through %d slot%s (%s read "
                 "per prompt), %s of the device for %lld tokens",
                 layer, (long long)c->n_layers, layer > 1 ? 2 : 1, layer > 1 ? "s" : "", a, d, (long long)n);
    } else {
        s->host_peak = host_act;
        s->t_run = 0;
        if (b->vram <= 0)
            snprintf(s->reason, sizeof s->reason, "no device");
        else if (unreadable)
            snprintf(s->reason, sizeof s->reason, "a layer's weights cannot be read for the device");
        else if (gpu_why)
            snprintf(s->reason, sizeof s->reason,
                     "its weights are in a form the GPU's GEMMs do not take (%s)", gpu_why);
        else
            snprintf(s->reason, sizeof s->reason,
                     "on the device it would need %s, more than the device budget of %s holds", d,
                     h3_budget_str(b->vram, e, sizeof e));
        snprintf(
            s->detail, sizeof s->detail,
            "runs on the host: %d of %lld layers read once from the mapped file (%s), activations %s for "
            "%lld tokens",
            layer, (long long)c->n_layers, a, h3_budget_str(host_act, e, sizeof e), (long long)n);
    }
    s->fits = s->on_device || b->ram <= 0 || s->host_peak <= b->ram;
    return H3_OK;
}

/* Predicted seconds of a video VAE decode placed on the device by plan m: per pass of a chunk, each block's
 * GEMMs (QKV, output, SwiGLU FFN: 2 FLOPs a weight and token), attention over the tile's tokens (at the head-64
 * rate for heads of 64 or fewer) and its norms, RoPE, SwiGLU and residuals, at the device's rates; a streamed
 * block's copy hides behind its compute when shorter. On the H200 the W124 decode is predicted 2.19 s, measured
 * 2.10 (test_planner `measured_vvae`). */
double h3_plan_video_vae_seconds(const h3_video_vae_config *c, const h3_video_vae_mem *m,
                                 const h3_device_figures *f) {
    const double dim = (double)c->heads * c->head_dim, I = c->ffn_inner, S = (double)m->tokens_per_tile;
    const double gemm = 2.0 * S * dim * (4.0 * dim + 3.0 * I), attn = 4.0 * S * S * dim;
    const double ref = 19412.0 / (19412.0 + f->gemm_half_rows);
    const double attn_tf = c->head_dim <= 64 && f->attn64_tflops > 0 ? f->attn64_tflops : f->attn_tflops;
    const int tiles = m->tiles_y * m->tiles_x, nb = m->tile_batch > 0 ? m->tile_batch : 1;
    double t = 0;
    for (int t0 = 0; t0 < tiles; t0 += nb) {
        const int k = tiles - t0 < nb ? tiles - t0 : nb;
        const double rows = k * S, eff = rows / (rows + f->gemm_half_rows) / ref;
        const double comp = k * (gemm / (f->gemm_tflops * 1e12 * eff) + attn / (attn_tf * 1e12)) +
                            rows * dim * 1e-3 * f->eltwise_ns_per_kelem * 1e-9;
        for (int l = 0; l < m->n_blocks; l++) {
            if (l < m->n_resident) {
                t += comp;
                continue;
            }
            const double gbs = l - m->n_resident < m->n_pinned ? f->pinned_gbs : f->disk_gbs;
            t += maxd(comp, (double)m->stored_bytes / (gbs * 1e9));
        }
    }
    return t * m->chunks;
}

h3_status h3_plan_video_vae(const h3_video_vae *v, int64_t T, int64_t H, int64_t W, int64_t weight_bytes,
                            int host_threads, const h3_plan_budgets *b, const h3_device_figures *fig,
                            h3_stage_plan *s) {
    memset(s, 0, sizeof *s);
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    h3_device_figures ref;
    const h3_device_figures *f = figures_or_h200(fig, &ref);
    s->present = 1;
    s->weight_bytes = weight_bytes;
    s->n_units = c->num_layers;
    const int threads = host_threads > 0 ? host_threads : 1;
    char a[32], d[32], e[32];
    if (b->vram > 0) {
        h3_video_vae_run run;
        memset(&run, 0, sizeof run);
        run.place = H3_PLACE_DEVICE;
        run.vram_budget = b->vram;
        run.ram_budget = b->ram > 0 ? b->ram : 0;
        run.threads = threads;
        h3_status st = h3_video_vae_plan(v, T, H, W, &run, &s->vvae);
        if (st == H3_OK) {
            const h3_video_vae_mem *m = &s->vvae;
            s->on_device = 1;
            s->dev_peak = s->dev_need = m->dev_peak;
            s->host_peak = m->total + m->host_pinned;
            s->n_resident = m->n_resident;
            s->t_load = (double)(weight_bytes - m->stored_bytes * m->n_disk) / (f->disk_gbs * 1e9);
            s->t_run = h3_plan_video_vae_seconds(c, m, f);
            snprintf(
                s->detail, sizeof s->detail,
                "on the device: %d of %d blocks resident, %d streamed (%d from pinned memory); %d temporal "
                "chunks of %d x %d tiles, %d tiles per pass, FFN rows in steps of %lld",
                m->n_resident, m->n_blocks, m->n_blocks - m->n_resident, m->n_pinned, m->chunks, m->tiles_y,
                m->tiles_x, m->tile_batch, (long long)m->rows_per_step);
            s->fits = 1;
            return H3_OK;
        }
        if (st != H3_ERR_BUDGET) return st;
        snprintf(s->reason, sizeof s->reason, "%s", h3_last_error_message());
        h3_clear_error();
        /* the least it takes there: one tile per pass, the smallest row step, every block streamed */
        run.vram_budget = 0;
        run.tile_batch = 1;
        run.rows_per_step = 1;
        run.stream_blocks = c->num_layers;
        h3_video_vae_mem least;
        if (h3_video_vae_plan(v, T, H, W, &run, &least) == H3_OK)
            s->dev_need = least.dev_peak;
        else
            h3_clear_error();
    } else {
        snprintf(s->reason, sizeof s->reason, "no device");
    }
    H3_TRY(h3_video_vae_decode_peak(c, T, H, W, threads, 0, &s->vvae));
    s->host_peak = s->vvae.total;
    snprintf(s->detail, sizeof s->detail,
             "runs on the host: %d temporal chunks of %d x %d tiles, decode memory %s (does not grow with "
             "frames); weights %s mapped%s%s",
             s->vvae.chunks, s->vvae.tiles_y, s->vvae.tiles_x, h3_budget_str(s->vvae.total, a, sizeof a),
             h3_budget_str(weight_bytes, d, sizeof d), s->dev_need ? "; on the device it would need " : "",
             s->dev_need ? h3_budget_str(s->dev_need, e, sizeof e) : "");
    s->fits = b->ram <= 0 || s->host_peak <= b->ram;
    return H3_OK;
}

/* A split DiT's video decode over its n GPUs (h3_video_vae_decode_split): when each other GPU's decoder fits
 * that GPU's budget, the first GPU decodes chunks 0, n, 2n, ... and gathers the others' raw canvases (at the
 * link rate; its own hand-out as before); otherwise the first GPU decodes alone, and the detail says why. */
static h3_status split_video_vae(const h3_video_vae *v, int64_t T, int64_t H, int64_t W, int n,
                                 const h3_plan_budgets *b, const h3_device_figures *fig, h3_plan *p) {
    h3_stage_plan *s = &p->vvae;
    for (int i = 1; i < n; i++) {
        h3_video_vae_run run;
        memset(&run, 0, sizeof run);
        run.place = H3_PLACE_DEVICE;
        run.vram_budget = b->vram_gpu[i] > 0 ? b->vram_gpu[i] : b->vram;
        run.ram_budget = b->ram > 0 ? b->ram / n : 0;
        run.threads = 1;
        h3_video_vae_mem m;
        const h3_status st = h3_video_vae_plan(v, T, H, W, &run, &m);
        if (st == H3_ERR_BUDGET) {
            const size_t used = strlen(s->detail);
            snprintf(s->detail + used, sizeof s->detail - used,
                     "; on the first GPU alone: GPU %d's budget does not hold a decoder (%s)", i,
                     h3_last_error_message());
            h3_clear_error();
            return H3_OK;
        }
        H3_TRY(st);
    }
    h3_device_figures ref;
    const h3_device_figures *f = figures_or_h200(fig, &ref);
    const int chunks = s->vvae.chunks, own = (chunks + n - 1) / n;
    p->vvae_gpus = n;
    s->t_run = s->t_run * own / (chunks > 0 ? chunks : 1) +
               (f->link_gbs > 0 ? (double)(chunks - own) * s->vvae.canvas_bytes / (f->link_gbs * 1e9) : 0);
    const size_t used = strlen(s->detail);
    snprintf(s->detail + used, sizeof s->detail - used,
             "; split over %d GPUs: the first decodes %d of the %d chunks and gathers the others' canvases",
             n, own, chunks);
    return H3_OK;
}

h3_status h3_plan_video_encoder(const h3_video_enc_config *c, int64_t frames, int64_t H, int64_t W,
                                int images, const h3_plan_budgets *b, h3_stage_plan *s) {
    memset(s, 0, sizeof *s);
    s->present = 1;
    s->n_units = c->levels + 1;
    char a[32], d[32];
    h3_video_enc_mem dev;
    H3_TRY(h3_video_enc_mem_of(c, frames, H, W, H3_PLACE_DEVICE, &dev));
    s->dev_need = dev.dev_peak;
    if (b->vram > 0 && dev.dev_peak + h3_budget_slack(b->vram) <= b->vram) {
        s->venc = dev;
        s->on_device = 1;
        s->fits = 1;
        s->n_resident = s->n_units;
        s->dev_peak = dev.dev_peak;
        s->host_peak = dev.host_total;
        char what[96];
        if (frames > 1) /* the largest video reference */
            snprintf(what, sizeof what, "%lld frames of %lldx%lld px, %d at a time", (long long)frames,
                     (long long)W, (long long)H, c->clip_length);
        else
            snprintf(what, sizeof what, "%d image%s of %lldx%lld px, one at a time", images, images == 1 ? "" : "s",
                     (long long)W, (long long)H);
        snprintf(s->detail, sizeof s->detail,
                 "on the device: %s; %d x %d tiles of %lldx%lld px; f32 weights %s resident, activations %s, "
                 "its convolutions %s",
                 what, dev.tiles_y, dev.tiles_x, (long long)dev.tile_w, (long long)dev.tile_h,
                 h3_budget_str(dev.weights, a, sizeof a), h3_budget_str(dev.act + dev.tile_io, d, sizeof d),
                 h3_cuda_conv_math(H3_CONV_3D) == H3_CONV_TF32 ? "on TF32 tensor cores" : "in exact f32");
        return H3_OK;
    }
    if (b->vram > 0)
        snprintf(s->reason, sizeof s->reason, "it needs %s on the device, more than the %s budget",
                 h3_budget_str(dev.dev_peak, a, sizeof a), h3_budget_str(b->vram, d, sizeof d));
    else
        snprintf(s->reason, sizeof s->reason, "no device");
    H3_TRY(h3_video_enc_mem_of(c, frames, H, W, H3_PLACE_HOST, &s->venc));
    s->host_peak = s->venc.host_total;
    snprintf(s->detail, sizeof s->detail,
             "runs on the host: %d image%s of %lldx%lld px, one at a time; %d x %d tiles; encode memory %s",
             images, images == 1 ? "" : "s", (long long)W, (long long)H, s->venc.tiles_y, s->venc.tiles_x,
             h3_budget_str(s->venc.host_total, a, sizeof a));
    s->fits = b->ram <= 0 || s->host_peak <= b->ram;
    return H3_OK;
}

h3_status h3_plan_audio_encoder(const h3_audio_enc_config *e, int64_t samples, const h3_plan_budgets *b, h3_stage_plan *s) {
    memset(s, 0, sizeof *s);
    s->present = 1;
    s->n_units = 1;
    char a[32], d[32];
    H3_TRY(h3_audio_enc_mem_of(e, samples, &s->aenc));
    s->dev_need = s->aenc.dev_total + H3_CUDA_BACKEND_BYTES;
    s->on_device = b->vram > 0 && fits_in(s->dev_need, b->vram);
    s->fits = 1;
    if (s->on_device) {
        s->dev_peak = s->dev_need;
        s->n_resident = 1;
        snprintf(s->detail, sizeof s->detail,
                 "on the device: %.2f s a channel; its convolutions' f32 weights %s, activations %s (the pre_block on "
                 "the host)",
                 (double)samples / 32000.0, h3_budget_str(s->aenc.dev_weights, a, sizeof a),
                 h3_budget_str(s->aenc.dev_buffers + s->aenc.dev_op_scratch, d, sizeof d));
        return H3_OK;
    }
    if (b->vram > 0)
        snprintf(s->reason, sizeof s->reason, "it needs %s on the device, more than the %s budget",
                 h3_budget_str(s->dev_need, a, sizeof a), h3_budget_str(b->vram, d, sizeof d));
    else
        snprintf(s->reason, sizeof s->reason, "no device");
    snprintf(s->detail, sizeof s->detail, "runs on the host: %.2f s a channel", (double)samples / 32000.0);
    return H3_OK;
}

/* Predicted seconds of an audio VAE decode on the device: BigVGAN's convolutions (2 FLOPs a weight and output
 * step) at the f32 GEMM rate, and its anti-aliased activations (one pass a value) at the element-wise rate.
 */
static double avae_run_seconds(const h3_audio_vae_config *c, int64_t T, int64_t channels,
                               const h3_device_figures *f) {
    const double k_pre = 7, k_post = 7; /* conv_pre and conv_post (audio_vae.h) */
    double len = (double)T,
           flops = 2.0 * c->latent_channels * c->latent_dim * len +
                   2.0 * c->latent_dim * c->decoder_dim * k_pre * len,
           acts = 0, cin = c->decoder_dim;
    for (int i = 0; i < c->n_up; i++) {
        const double cout = cin / 2;
        flops += 2.0 * cin * cout * c->kernels[i] * len;
        len *= c->rates[i];
        for (int r = 0; r < c->n_res; r++)
            flops += 2.0 * c->n_dil * 2.0 * cout * cout * c->res_kernels[r] * len;
        acts += (double)c->n_res * 2 * c->n_dil * cout * len;
        cin = cout;
    }
    flops += 2.0 * cin * k_post * len;
    acts += cin * len;
    return (double)channels * (flops / (f->f32_tflops * 1e12) + acts * f->eltwise_ns_per_kelem * 1e-12);
}

h3_status h3_plan_audio_vae(const h3_audio_vae *v, int64_t T, int64_t channels, int64_t weight_bytes,
                            const h3_plan_budgets *b, const h3_device_figures *fig, h3_stage_plan *s) {
    memset(s, 0, sizeof *s);
    const h3_audio_vae_config *c = h3_audio_vae_get_config(v);
    h3_device_figures ref;
    const h3_device_figures *f = figures_or_h200(fig, &ref);
    H3_TRY(h3_audio_vae_decode_peak(c, T, channels, &s->avae));
    const h3_audio_vae_mem *m = &s->avae;
    s->present = 1;
    s->weight_bytes = weight_bytes;
    s->n_units = c->n_up;
    s->dev_need = m->dev_total + H3_CUDA_BACKEND_BYTES;
    s->on_device = b->vram > 0 && fits_in(s->dev_need, b->vram);
    char a[32], d[32], e[32];
    h3_budget_str(weight_bytes, a, sizeof a);
    if (s->on_device) {
        s->dev_peak = s->dev_need;
        s->n_resident = s->n_units;
        s->host_peak = weight_bytes; /* the weights folded at open stay on the host too */
        s->t_load =
            (double)weight_bytes / (f->disk_gbs * 1e9) + (double)m->dev_weights / (f->pageable_gbs * 1e9);
        s->t_run = avae_run_seconds(c, T, channels, f);
        snprintf(s->detail, sizeof s->detail,
                 "on the device: f32 weights %s resident, %lld channels in one batch of %lld latents each, "
                 "buffers and scratch %s",
                 h3_budget_str(m->dev_weights, d, sizeof d), (long long)channels, (long long)T,
                 h3_budget_str(m->dev_buffers + m->dev_op_scratch, e, sizeof e));
        s->fits = 1;
        return H3_OK;
    }
    if (b->vram <= 0)
        snprintf(s->reason, sizeof s->reason, "no device");
    else
        snprintf(s->reason, sizeof s->reason,
                 "on the device it would need %s (f32 weights, both channels' buffers, the backend's "
                 "workspace), more than the device budget of %s holds",
                 h3_budget_str(s->dev_need, d, sizeof d), h3_budget_str(b->vram, e, sizeof e));
    s->host_peak = m->total + weight_bytes;
    snprintf(s->detail, sizeof s->detail,
             "runs on the host: decode memory %s for %lld latents per channel, weights %s",
             h3_budget_str(m->total, d, sizeof d), (long long)T, a);
    s->fits = b->ram <= 0 || s->host_peak <= b->ram;
    return H3_OK;
}

/* ---- the whole plan ------------------------------------------------------------------------------------ */

typedef struct try_ctx {
    const h3_plan_model *m;
    h3_plan_budgets b;
    const h3_device_figures *f;
    int eight_bit;
} try_ctx;

/* The frames of the DiT's sequence: one window's in a long clip (pipeline/window.h). */
static int64_t dit_frames(const h3_plan_request *r) {
    return r->window_frames > 0 && r->window_frames < r->frames ? r->window_frames : r->frames;
}

/* The packed sequence's counts of a request at a canvas: keyframes, and the references' rows. */
static h3_status request_sizes(const h3_plan_request *r, int64_t width, int64_t height, h3_seq_layout *L) {
    H3_TRY(h3_seq_layout_sizes(r->text_tokens, r->keyframes, dit_frames(r), width, height, L));
    L->n_cond_rows += r->ref_video_rows;
    L->n_audio_rows += r->ref_audio_rows;
    L->seq_len += r->ref_video_rows + r->ref_audio_rows;
    return H3_OK;
}

/* The DiT stage of one pass: the packed sequence of a canvas (counts only), the best placement; 0 when none
 * fits. Split over r->gpus GPUs: each GPU's best placement for its rows within its budget and its share of the
 * host's into gpu[0..gpus-1], and *out the slowest GPU's (every block waits for it). */
static h3_status plan_dit_pass(const try_ctx *t, const h3_plan_request *r, int64_t width, int64_t height,
                               int n_timesteps, h3_dit_plan *out, h3_dit_plan *gpu, int *fits) {
    h3_seq_layout L;
    H3_TRY(request_sizes(r, width, height, &L));
    dit_static ds;
    H3_TRY(dit_static_of(t->m, t->eight_bit, &ds));
    const h3_device_figures fd = with_cache(t->f, t->m->dit_cached);
    dit_ctx x = {t->m,
                 h3_dit_get_config(t->m->dit),
                 &ds,
                 &fd,
                 L.seq_len,
                 L.text_len,
                 L.n_video_rows + L.n_cond_rows,
                 L.n_audio_rows,
                 n_timesteps,
                 t->b.vram,
                 t->b.ram,
                 1,
                 0};
    h3_seq_layout_free(&L);
    const int n = r->gpus > 1 ? r->gpus : 1;
    if (n == 1) {
        *fits = dit_search(&x, out);
        return H3_OK;
    }
    *fits = 1;
    int slow = 0;
    x.ranks = n;
    x.ram = t->b.ram > 0 ? t->b.ram / n : 0;
    for (int i = 0; i < n; i++) {
        x.rank = i;
        x.vram = t->b.vram_gpu[i] > 0 ? t->b.vram_gpu[i] : t->b.vram;
        if (!dit_search(&x, &gpu[i])) *fits = 0;
        if (gpu[i].t_step_slow > gpu[slow].t_step_slow) slow = i;
    }
    *out = gpu[slow];
    return H3_OK;
}

/* Plans request r entirely; *fits receives the outcome. */
static h3_status plan_all(const try_ctx *t, const h3_plan_request *r, h3_plan *p) {
    memset(&p->dit, 0, sizeof p->dit);
    memset(&p->dit_refine, 0, sizeof p->dit_refine);
    p->fits = 1;
    const int refine = r->refine_width > 0;
    if (t->m->dit) {
        int ok = 1;
        H3_TRY(plan_dit_pass(t, r, r->width, r->height, r->n_timesteps, &p->dit, p->dit_gpu, &ok));
        if (!ok) p->fits = 0;
        if (refine) {
            H3_TRY(plan_dit_pass(t, r, r->refine_width, r->refine_height,
                                 r->refine_timesteps > 0 ? r->refine_timesteps : r->n_timesteps,
                                 &p->dit_refine, p->dit_refine_gpu, &ok));
            if (!ok) p->fits = 0;
        }
    }
    /* the VAEs decode the last pass's latents */
    const int64_t vw = refine ? r->refine_width : r->width, vh = refine ? r->refine_height : r->height;
    const h3_plan_model *m = t->m;
    memset(&p->te, 0, sizeof p->te);
    memset(&p->avae, 0, sizeof p->avae);
    memset(&p->vvae, 0, sizeof p->vvae);
    memset(&p->venc, 0, sizeof p->venc);
    const h3_device_figures fte = with_cache(t->f, m->te_cached), fav = with_cache(t->f, m->avae_cached),
                            fvv = with_cache(t->f, m->vvae_cached);
    if (m->te) {
        const int64_t nl = h3_text_encoder_config(m->te)->n_layers;
        H3_TRY(h3_plan_text_encoder(m->te, r->text_tokens, (int)(nl < H3_TE_LAYER ? nl : H3_TE_LAYER), &t->b,
                                    &fte, &p->te));
        if (m->te_vision_bytes > 0 && p->te.on_device) {
            /* the vision tower runs inside the stage, first, and gives its memory back before the layers
             * stream: the stage's peak is the larger of the two (each counts the backend's workspace); the
             * stage's device output, hidden [n, hidden] f32, is allocated before the tower runs */
            const int64_t out = h3_cuda_granule(r->text_tokens * h3_text_encoder_config(m->te)->hidden * 4);
            const int64_t vis = m->te_vision_bytes + out;
            if (vis > p->te.dev_need) p->te.dev_need = vis;
            if (vis > p->te.dev_peak) p->te.dev_peak = vis;
            char v[32];
            const size_t used = strlen(p->te.detail);
            snprintf(p->te.detail + used, sizeof p->te.detail - used, ", and the vision tower resident (%s)",
                     h3_budget_str(m->te_vision_bytes, v, sizeof v));
            if (!fits_in(p->te.dev_need, t->b.vram)) {
                p->te.fits = 0;
                snprintf(p->te.reason, sizeof p->te.reason,
                         "the text encoder with its vision tower needs more than the device budget");
            }
        }
    }
    if (m->avae)
        H3_TRY(h3_plan_audio_vae(m->avae, h3_audio_latents(r->frames), 2 /* stereo */, m->avae_weight_bytes,
                                 &t->b, &fav, &p->avae));
    if (m->vvae)
        H3_TRY(h3_plan_video_vae(m->vvae, h3_video_latent_frames(r->frames), vh / H3_VAE_SPATIAL,
                                 vw / H3_VAE_SPATIAL, m->vvae_weight_bytes, m->host_threads, &t->b, &fvv,
                                 &p->vvae));
    p->vvae_gpus = 1;
    if (m->vvae && r->gpus > 1 && p->vvae.on_device)
        H3_TRY(split_video_vae(m->vvae, h3_video_latent_frames(r->frames), vh / H3_VAE_SPATIAL,
                               vw / H3_VAE_SPATIAL, r->gpus, &t->b, &fvv, p));
    if (m->venc && r->keyframes > 0) /* keyframes at the first pass's canvas */
        H3_TRY(h3_plan_video_encoder(m->venc, 1, r->height, r->width, r->keyframes, &t->b, &p->venc));
    else if (m->venc && r->ref_enc_frames > 0) /* the largest reference */
        H3_TRY(h3_plan_video_encoder(m->venc, r->ref_enc_frames, r->ref_enc_height, r->ref_enc_width, 1, &t->b,
                                     &p->venc));
    if (m->aenc && r->aenc_samples > 0) H3_TRY(h3_plan_audio_encoder(m->aenc, r->aenc_samples, &t->b, &p->aenc));
    const h3_stage_plan *hs[4] = {&p->te, &p->avae, &p->vvae, &p->venc};
    for (int i = 0; i < 4; i++)
        if (hs[i]->present && !hs[i]->fits) p->fits = 0;
    return H3_OK;
}

h3_status h3_plan_dit(const h3_plan_model *m, int64_t S, int64_t L, int64_t Nv, int64_t Na, int n_timesteps,
                      const h3_plan_budgets *b, const h3_device_figures *fig, h3_dit_plan *out) {
    memset(out, 0, sizeof *out);
    if (!m->dit) return H3_ERR(H3_ERR_INVALID, "plan: no DiT");
    if (S < 1 || L < 0 || Nv < 0 || Na < 0 || L + Nv + Na != S || n_timesteps < 0)
        return H3_ERR(H3_ERR_INVALID,
                      "plan: a packed sequence of %lld rows is not %lld text + %lld video + %lld audio",
                      (long long)S, (long long)L, (long long)Nv, (long long)Na);
    if (b->vram < 1) return H3_ERR(H3_ERR_INVALID, "plan: a device budget is needed");
    h3_device_figures ref;
    const h3_device_figures *f = figures_or_h200(fig, &ref);
    dit_static ds;
    H3_TRY(dit_static_of(m, 0, &ds));
    dit_ctx x = {m, h3_dit_get_config(m->dit), &ds, f, S, L, Nv, Na, n_timesteps, b->vram, b->ram, 1, 0};
    dit_search(&x, out);
    return H3_OK;
}

double h3_dit_plan_seconds(const h3_dit_plan *p, int steps) {
    return p->present ? p->t_load + p->t_modulation + (steps > 0 ? steps : 0) * p->t_step : 0;
}

static void appendf(char *buf, size_t n, const char *fmt, ...) H3_PRINTF(3, 4);
static void appendf(char *buf, size_t n, const char *fmt, ...) {
    size_t l = strlen(buf);
    if (l + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, n - l, fmt, ap);
    va_end(ap);
}

h3_status h3_plan_make(const h3_plan_model *m, const h3_plan_request *r, const h3_plan_budgets *b,
                       const h3_device_figures *fig, h3_plan *out) {
    memset(out, 0, sizeof *out);
    out->cached[0] = m->dit_cached;
    out->cached[1] = m->te_cached;
    out->cached[2] = m->avae_cached;
    out->cached[3] = m->vvae_cached;
    if (h3_video_latent_frames(r->frames) < 0)
        return H3_ERR(H3_ERR_INVALID, "plan: frames must be 17n+5 (e.g. 73, 124, 362); got %lld",
                      (long long)r->frames);
    if (!h3_canvas_valid(r->width, r->height))
        return H3_ERR(H3_ERR_INVALID,
                      "plan: width and height must be positive multiples of 32; got %lldx%lld",
                      (long long)r->width, (long long)r->height);
    if (r->text_tokens < 1 || r->text_tokens > 65536)
        return H3_ERR(H3_ERR_INVALID, "plan: the prompt must have 1 to 65536 tokens; got %lld",
                      (long long)r->text_tokens);
    if (r->n_timesteps < 1 || r->n_timesteps > 100000)
        return H3_ERR(H3_ERR_INVALID, "plan: the run keeps 1 to 100000 distinct timesteps; got %d",
                      r->n_timesteps);
    if (r->refine_width && (r->refine_width < r->width || r->refine_height < r->height ||
                            !h3_canvas_valid(r->refine_width, r->refine_height) || r->refine_steps < 1))
        return H3_ERR(H3_ERR_INVALID,
                      "plan: a refine canvas must be multiples of 32 at least %lldx%lld, with its steps; "
                      "got %lldx%lld",
                      (long long)r->width, (long long)r->height, (long long)r->refine_width,
                      (long long)r->refine_height);
    if (b->vram < 1) return H3_ERR(H3_ERR_INVALID, "plan: a device budget is needed");
    if (r->gpus < 0 || r->gpus > H3_PLAN_MAX_GPUS)
        return H3_ERR(H3_ERR_INVALID, "plan: a DiT splits over 1 to %d GPUs; got %d", H3_PLAN_MAX_GPUS, r->gpus);
    if (r->gpus > 1 && m->dit) {
        const int64_t heads = h3_dit_get_config(m->dit)->heads;
        if (heads % r->gpus) {
            char ok[64] = "";
            for (int g = 2; g <= H3_PLAN_MAX_GPUS; g++)
                if (heads % g == 0) appendf(ok, sizeof ok, "%s%d", ok[0] ? ", " : "", g);
            return H3_ERR(H3_ERR_INVALID,
                          "plan: the DiT's %lld attention heads do not split over %d GPUs (each GPU takes an equal "
                          "share): give %s",
                          (long long)heads, r->gpus, ok[0] ? ok : "1");
        }
    }
    out->req = *r;
    out->budgets = *b;
    h3_device_figures ref;
    h3_device_figures_find("h200", &ref);
    out->have_time = fig != NULL;
    out->fig = fig ? *fig : ref;
    try_ctx t = {m, *b, &out->fig, 0};
    H3_TRY(plan_all(&t, r, out));
    if (out->fits) return H3_OK;

    /* Nothing fits: the smallest budgets for this request, and the changes that fit these budgets. */
    char a[32], c2[32], c3[32];
    int64_t dmin = 0, hmin = 0;
    const int refine = r->refine_width > 0;
    if (m->dit) { /* the longer sequence: the refine pass's when there is one */
        h3_seq_layout L;
        H3_TRY(request_sizes(r, refine ? r->refine_width : r->width, refine ? r->refine_height : r->height, &L));
        dit_static ds;
        h3_status st = dit_static_of(m, 0, &ds);
        dit_ctx x = {m,
                     h3_dit_get_config(m->dit),
                     &ds,
                     &out->fig,
                     L.seq_len,
                     L.text_len,
                     L.n_video_rows + L.n_cond_rows,
                     L.n_audio_rows,
                     r->n_timesteps,
                     b->vram,
                     b->ram,
                     r->gpus > 1 ? r->gpus : 1,
                     r->gpus > 1 ? r->gpus - 1 : 0}; /* a split's last GPU has the most rows */
        h3_seq_layout_free(&L);
        H3_TRY(st);
        dit_minimum(&x, &dmin, &hmin);
        if (r->gpus > 1) hmin *= r->gpus; /* every GPU's process stages its own reads */
    }
    out->min_vram = dmin ? min_budget_for(dmin) : 0;
    out->min_ram = hmin;
    /* A stage that fits neither budget: the device budget that would put it on the device. */
    const h3_stage_plan *hs[4] = {&out->te, &out->avae, &out->vvae, &out->venc};
    static const char *const hs_name[4] = {"text encoder", "audio VAE", "video VAE", "video VAE encoder"};
    int64_t stage_vram = 0;
    for (int i = 0; i < 4; i++)
        if (hs[i]->present && !hs[i]->fits && hs[i]->dev_need > 0)
            stage_vram = max64(stage_vram, min_budget_for(hs[i]->dev_need));
    h3_plan scratch;
    /* fewer frames */
    for (int64_t f = r->frames - H3_FRAMES_CHUNK; f >= H3_FRAMES_FIRST; f -= H3_FRAMES_CHUNK) {
        h3_plan_request q = *r;
        q.frames = f;
        scratch.req = q;
        H3_TRY(plan_all(&t, &q, &scratch));
        if (scratch.fits) {
            out->fit_frames = f;
            break;
        }
    }
    /* a smaller canvas of about the same aspect */
    for (int s = 95; s >= 10; s -= 5) {
        h3_plan_request q = *r;
        if (refine) { /* the refine canvas shrinks; the first pass's stays at most as large */
            q.refine_width = r->refine_width * s / 100 / H3_CANVAS_MULTIPLE * H3_CANVAS_MULTIPLE;
            q.refine_height = r->refine_height * s / 100 / H3_CANVAS_MULTIPLE * H3_CANVAS_MULTIPLE;
            if (q.refine_width < 32 || q.refine_height < 32) break;
            if (q.width > q.refine_width) q.width = q.refine_width;
            if (q.height > q.refine_height) q.height = q.refine_height;
        } else {
            q.width = r->width * s / 100 / H3_CANVAS_MULTIPLE * H3_CANVAS_MULTIPLE;
            q.height = r->height * s / 100 / H3_CANVAS_MULTIPLE * H3_CANVAS_MULTIPLE;
            if (q.width < 32 || q.height < 32) break;
        }
        if (q.width == r->width && q.height == r->height && q.refine_width == r->refine_width &&
            q.refine_height == r->refine_height)
            continue;
        H3_TRY(plan_all(&t, &q, &scratch));
        if (scratch.fits) {
            out->fit_width = refine ? q.refine_width : q.width;
            out->fit_height = refine ? q.refine_height : q.height;
            break;
        }
    }
    /* fewer sampling steps: less modulation kept on the device (memory grows with steps: bisect) */
    if (m->dit && r->n_timesteps >= 4) {
        int lo = 0, hi = (r->n_timesteps + 1) / 2; /* fits(lo) (0: none known), !fits(hi) */
        while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            h3_plan_request q = *r;
            q.n_timesteps = h3_schedule_distinct_count(H3_SCHEDULER_H3, mid);
            if (q.n_timesteps < 0) {
                h3_clear_error();
                q.n_timesteps = 2 * mid;
            }
            H3_TRY(plan_all(&t, &q, &scratch));
            if (scratch.fits)
                lo = mid;
            else
                hi = mid;
        }
        out->fit_steps = lo;
    }
    /* 8-bit block weights */
    if (m->dit) {
        try_ctx t8 = t;
        t8.eight_bit = 1;
        H3_TRY(plan_all(&t8, r, &scratch));
        out->fits_8bit = scratch.fits;
    }
    /* the message */
    char *w = out->why;
    size_t wn = sizeof out->why;
    w[0] = 0;
    appendf(w, wn, "%lld frames at %lldx%lld", (long long)r->frames, (long long)r->width,
            (long long)r->height);
    if (m->dit) appendf(w, wn, " (%lld packed rows)", (long long)out->dit.S);
    if (refine)
        appendf(w, wn, " refined at %lldx%lld (%lld packed rows)", (long long)r->refine_width,
                (long long)r->refine_height, (long long)out->dit_refine.S);
    appendf(w, wn, " do not fit");
    int dev_short = m->dit && out->min_vram > b->vram;
    int host_short = b->ram > 0 && out->min_ram > b->ram;
    if (dev_short)
        appendf(
            w, wn,
            ": the device budget of %s is short by %s (this request needs at least %s: one weight slot of "
            "%.2f GiB, activations %.2f GiB, the rest of the DiT stage %.2f GiB, and %.2f GiB of slack for "
            "the "
            "arena, in steps of 64 MiB)",
            h3_budget_str(b->vram, a, sizeof a), h3_budget_str(out->min_vram - b->vram, c2, sizeof c2),
            h3_budget_str(out->min_vram, c3, sizeof c3), (double)out->dit.slot_bytes / GIB,
            (double)(out->dit.dev_workspace + out->dit.dev_io + out->dit.dev_scratch) / GIB,
            (double)(dmin - out->dit.slot_bytes - out->dit.dev_workspace - out->dit.dev_io -
                     out->dit.dev_scratch) /
                GIB,
            (double)(out->min_vram - dmin) / GIB);
    if (host_short)
        appendf(w, wn, "%s the host budget of %s is short by %s (at least %s)", dev_short ? ";" : ":",
                h3_budget_str(b->ram, a, sizeof a), h3_budget_str(out->min_ram - b->ram, c2, sizeof c2),
                h3_budget_str(out->min_ram, c3, sizeof c3));
    int stage_short = 0;
    for (int i = 0; i < 4; i++) {
        if (!hs[i]->present || hs[i]->fits) continue;
        appendf(
            w, wn,
            "%s the %s fits neither budget: %s, and on the host it needs %s, more than the host budget of %s",
            dev_short || host_short || stage_short ? ";" : ":", hs_name[i], hs[i]->reason,
            h3_budget_str(hs[i]->host_peak, a, sizeof a), h3_budget_str(b->ram, c2, sizeof c2));
        stage_short = 1;
    }
    if (!dev_short && !host_short && !stage_short) appendf(w, wn, " within these budgets");
    appendf(w, wn, ". Would fit:");
    int any = 0;
    if (dev_short || host_short || stage_vram > b->vram) {
        appendf(w, wn, " --vram-budget %.2fGiB",
                (double)max64(max64(out->min_vram, stage_vram), b->vram) / GIB);
        if (host_short) appendf(w, wn, " --ram-budget %.2fGiB", (double)out->min_ram / GIB);
        any = 1;
    }
    if (out->fit_frames) {
        appendf(w, wn, "%s %lld frames", any ? "; or" : "", (long long)out->fit_frames);
        any = 1;
    }
    if (out->fit_width) {
        appendf(w, wn, "%s a %lldx%lld %scanvas", any ? "; or" : "", (long long)out->fit_width,
                (long long)out->fit_height, refine ? "refine " : "");
        any = 1;
    }
    if (out->fit_steps) {
        appendf(w, wn, "%s %d sampling steps (the modulation of each is kept on the device)",
                any ? "; or" : "", out->fit_steps);
        any = 1;
    }
    if (out->fits_8bit) {
        appendf(w, wn, "%s a DiT file with 8-bit block weights (int8 or fp8)", any ? "; or" : "");
        any = 1;
    }
    if (!any) appendf(w, wn, " nothing smaller at these budgets");
    return H3_OK;
}

void h3_dit_plan_placement(const h3_dit_plan *p, h3_dit_placement *out) {
    out->n_units = p->present ? p->n_units : 0;
    out->tier = p->tier;
    out->n_slots = p->n_slots;
    out->slot_bytes = p->slot_bytes;
    out->chunk_rows = p->chunk_rows;
}

void h3_dit_plan_predicted(const h3_dit_plan *p, int64_t pred[H3_DEVCAT_COUNT], int64_t *peak) {
    pred[H3_DEVCAT_BACKEND] = p->dev_backend;
    pred[H3_DEVCAT_WEIGHTS] = p->dev_globals + p->dev_resident;
    pred[H3_DEVCAT_SLOTS] = p->dev_slots;
    pred[H3_DEVCAT_MODULATION] = p->dev_modulation + p->dev_precompute_scratch;
    pred[H3_DEVCAT_ACTIVATIONS] = p->dev_workspace + p->dev_io + p->dev_scratch + p->dev_exchange;
    pred[H3_DEVCAT_LORA] = p->dev_lora;
    if (peak) *peak = p->dev_peak;
}

void h3_dit_plan_kept_bytes(const h3_dit_plan *p, int64_t *dev, int64_t *host) {
    *dev = p->dev_globals + p->dev_resident + p->dev_slots;
    *host = p->host_pinned + p->host_staging;
}

int h3_plan_fits_beside_dit(const h3_plan *p, int before, int64_t dev, int64_t host, char *why, size_t n) {
    const h3_stage_plan *st[2] = {before ? &p->te : &p->avae, before ? &p->venc : &p->vvae};
    static const char *const names[2][2] = {{"the audio VAE", "the video VAE"},
                                            {"the text encoder", "the keyframes' encoder"}};
    char a[32], b[32], c[32];
    for (int i = 0; i < 2; i++) {
        const h3_stage_plan *s = st[i];
        if (!s->present) continue;
        const int64_t d = s->on_device ? s->dev_peak + dev + H3_CUDA_QGEMM_SCRATCH_BYTES : 0;
        if (s->on_device && d > p->budgets.vram) {
            if (why)
                snprintf(why, n, "%s's device peak %s beside the DiT's %s is more than the budget's %s",
                         names[before][i], h3_budget_str(s->dev_peak, a, sizeof a),
                         h3_budget_str(dev, b, sizeof b), h3_budget_str(p->budgets.vram, c, sizeof c));
            return 0;
        }
        if (p->budgets.ram > 0 && s->host_peak + host > p->budgets.ram) {
            if (why)
                snprintf(why, n, "%s's host peak %s beside the DiT's pinned %s is more than the host budget's %s",
                         names[before][i], h3_budget_str(s->host_peak, a, sizeof a),
                         h3_budget_str(host, b, sizeof b), h3_budget_str(p->budgets.ram, c, sizeof c));
            return 0;
        }
    }
    return 1;
}

h3_status h3_plan_check(const h3_plan *p) {
    if (p->fits) return H3_OK;
    return H3_ERR(H3_ERR_BUDGET, "%s", p->why);
}

/* ---- formatting ---------------------------------------------------------------------------------------- */

/* One stage's lines: its placement, its peaks against the budgets, its predicted time or why it is on the
 * host. */
static void stage_format(char *o, size_t n, const h3_plan *p, const char *name, const h3_stage_plan *s) {
    char a[32], b[32], c[32];
    appendf(o, n, "\n%s: %s%s\n", name, s->detail, s->fits ? "" : "; DOES NOT FIT");
    if (s->on_device)
        appendf(o, n, "  device peak %s of %s, host %s\n", h3_budget_str(s->dev_peak, a, sizeof a),
                h3_budget_str(p->budgets.vram, b, sizeof b), h3_budget_str(s->host_peak, c, sizeof c));
    else
        appendf(o, n, "  host %s (%s)\n", h3_budget_str(s->host_peak, a, sizeof a), s->reason);
    if (s->on_device && p->have_time)
        appendf(o, n, "  predicted %.1f s: loading %.1f s, running %.1f s\n", s->t_load + s->t_run, s->t_load,
                s->t_run);
}

/* A DiT stage's lines (the first pass, or the refine pass); gpu: a split's per-GPU plans (t->gpus of them). */
static void dit_format(char *o, size_t n, const h3_plan *p, const char *title, const h3_dit_plan *t,
                       const h3_dit_plan *gpu, int steps) {
    char a[32], b[32], c[32], d[32];
    int all_fit = t->fits;
    for (int i = 0; t->gpus > 1 && i < t->gpus; i++) all_fit &= gpu[i].fits;
    appendf(o, n, "\n%s: %lld packed rows (%lld text, %lld audio, %lld video); %s\n", title, (long long)t->S,
            (long long)t->L, (long long)t->Na, (long long)t->Nv, all_fit ? "fits" : "DOES NOT FIT");
    if (t->gpus > 1) {
        appendf(o, n,
                "  split over %d GPUs (sequence parallel): each holds every weight, runs its share of the rows "
                "through the blocks and the attention of all rows for its share of the heads, over NCCL; the "
                "lines below are GPU %d's (rows %lld..%lld), the slowest, and the table after them each GPU's\n",
                t->gpus, t->rank, (long long)t->row0, (long long)(t->row0 + t->rows));
    }
    appendf(o, n,
            "  placement: %d of %d blocks resident, %d streamed from pinned memory, %d from disk; ring of %d "
            "slots of %s; FFN chunk %s rows\n",
            t->n_resident, t->n_units, t->n_pinned, t->n_disk, t->n_slots,
            h3_budget_str(t->slot_bytes, a, sizeof a),
            t->chunk_rows >= t->S ? "all" : (snprintf(b, sizeof b, "%lld", (long long)t->chunk_rows), b));
    appendf(o, n, "  attention: %s\n",
            t->attention & H3_ATTN_FP8    ? "fp8 (int8 q, k with k smoothed, e4m3 v and P·V, per-block scales)"
            : t->attention & H3_ATTN_INT8 ? "int8 (int8 q, k with k smoothed, f16 v and P·V, per-block scales)"
            : t->attention & H3_ATTN_SPARSE
                ? "sparse (block-sparse bf16 inside its window of steps, dense outside; timed here as dense)"
                : "bf16 (exact softmax, bf16 operands)");
    appendf(o, n, "  blocks: ");
    for (int u = 0; u < t->n_units; u++) appendf(o, n, "%c", "RPD"[t->tier[u] < 3 ? t->tier[u] : 0]);
    appendf(o, n, "  (R resident, P pinned, D disk; refiner blocks first)\n");
    appendf(o, n, "  device peak %s of %s:\n", h3_budget_str(t->dev_peak, a, sizeof a),
            h3_budget_str(p->budgets.vram, b, sizeof b));
    appendf(o, n, "    backend workspace %s, resident weights %s (non-block %s), stream slots %s,\n",
            h3_budget_str(t->dev_backend, a, sizeof a),
            h3_budget_str(t->dev_globals + t->dev_resident, b, sizeof b),
            h3_budget_str(t->dev_globals, c, sizeof c), h3_budget_str(t->dev_slots, d, sizeof d));
    char e[32];
    appendf(o, n, "    modulation %s, activations %s (buffers %s, inputs/outputs %s, scratch %s)\n",
            h3_budget_str(t->dev_modulation, a, sizeof a),
            h3_budget_str(t->dev_workspace + t->dev_io + t->dev_scratch, b, sizeof b),
            h3_budget_str(t->dev_workspace, c, sizeof c), h3_budget_str(t->dev_io, d, sizeof d),
            h3_budget_str(t->dev_scratch, e, sizeof e));
    if (t->dev_lora)
        appendf(o, n, "    LoRA factors %s (the side path's factors for every weight, and scratch)\n",
                h3_budget_str(t->dev_lora, a, sizeof a));
    if (t->dev_exchange)
        appendf(o, n, "    exchange buffers %s (q, k, v and o of all rows for its heads, and its rows to send)\n",
                h3_budget_str(t->dev_exchange, a, sizeof a));
    appendf(o, n, "  host: pinned copies %s, pinned staging %s, tables %s (total %s)\n",
            h3_budget_str(t->host_pinned, a, sizeof a), h3_budget_str(t->host_staging, b, sizeof b),
            h3_budget_str(t->host_other, c, sizeof c), h3_budget_str(t->host_peak, d, sizeof d));
    appendf(o, n, "  per step: %s streamed (%s from disk)\n", h3_budget_str(t->streamed_bytes, a, sizeof a),
            h3_budget_str(t->disk_bytes, b, sizeof b));
    if (p->have_time) {
        appendf(o, n,
                "  time per step: %.3f s predicted (all resident: %.3f s, ratio %.3f); compute %.3f s, "
                "copies "
                "%.3f s, disk reads %.3f s\n",
                t->t_step, t->t_resident, t->t_resident > 0 ? t->t_step / t->t_resident : 0, t->t_compute,
                t->t_copy, t->t_read);
        if (t->gpus > 1)
            appendf(o, n, "  exchanges: %s received a step, %.3f s of it at %.0f GB/s%s\n",
                    h3_budget_str(t->exchange_bytes, a, sizeof a), t->t_exchange, p->fig.link_gbs,
                    p->fig.link_gbs > 0 ? " (assumed, not measured)" : " (no link rate known: not timed)");
        appendf(o, n, "  once per run: load %.1f s, AdaLN modulation pass %.1f s\n", t->t_load,
                t->t_modulation);
        if (steps > 0)
            appendf(o, n, "  the stage: %.1f s predicted for %d model calls\n", h3_dit_plan_seconds(t, steps),
                    steps);
    }
    if (t->gpus > 1) {
        appendf(o, n, "  each GPU:\n    %-4s %-15s %-8s %-24s %-10s %-10s %s\n", "GPU", "rows", "R/P/D", "device peak",
                "host peak", "step", "fits");
        for (int i = 0; i < t->gpus; i++) {
            const h3_dit_plan *g = &gpu[i];
            const int64_t vb = p->budgets.vram_gpu[i] > 0 ? p->budgets.vram_gpu[i] : p->budgets.vram;
            char rows[40], rpd[24], pk[48], st[24];
            snprintf(rows, sizeof rows, "%lld..%lld", (long long)g->row0, (long long)(g->row0 + g->rows));
            snprintf(rpd, sizeof rpd, "%d/%d/%d", g->n_resident, g->n_pinned, g->n_disk);
            snprintf(pk, sizeof pk, "%s of %s", h3_budget_str(g->dev_peak, a, sizeof a), h3_budget_str(vb, b, sizeof b));
            if (p->have_time)
                snprintf(st, sizeof st, "%.3f s", g->t_step);
            else
                snprintf(st, sizeof st, "-");
            appendf(o, n, "    %-4d %-15s %-8s %-24s %-10s %-10s %s\n", i, rows, rpd, pk,
                    h3_budget_str(g->host_peak, c, sizeof c), st, g->fits ? "yes" : "NO");
        }
    }
}

char *h3_plan_format(const h3_plan *p) {
    const size_t n = 16384;
    char *o = h3_malloc(n, H3_MEM_IO);
    if (!o) return NULL;
    o[0] = 0;
    char a[32], b[32], c[32];
    const h3_plan_request *r = &p->req;
    appendf(o, n, "request: %lld frames at %lldx%lld, %lld prompt tokens, modulation kept for %d timesteps\n",
            (long long)r->frames, (long long)r->width, (long long)r->height, (long long)r->text_tokens,
            r->n_timesteps);
    if (dit_frames(r) < r->frames)
        appendf(o, n, "windows: the DiT runs on overlapping windows of %lld frames (%d model calls in all)\n",
                (long long)dit_frames(r), r->steps);
    if (r->refine_width)
        appendf(
            o, n, "refine: a second pass at %lldx%lld, %d model calls (modulation kept for %d timesteps)\n",
            (long long)r->refine_width, (long long)r->refine_height, r->refine_steps, r->refine_timesteps);
    appendf(o, n, "budgets: device %s%s, host %s%s\n", h3_budget_str(p->budgets.vram, a, sizeof a),
            r->gpus > 1 ? " a GPU" : "",
            p->budgets.ram > 0 ? h3_budget_str(p->budgets.ram, b, sizeof b) : "not limited",
            r->gpus > 1 && p->budgets.ram > 0 ? " (an equal share to each GPU's process for its DiT)" : "");
    if (r->gpus > 1)
        appendf(o, n,
                "GPUs: the DiT split over %d; the text encoder and the audio VAE on the first, the video "
                "VAE %s\n",
                r->gpus, p->vvae_gpus > 1 ? "split over them too" : "on the first");
    appendf(o, n, "times: %s\n", p->have_time ? p->fig.label : "not predicted (name a device with --device)");
    if (p->have_time)
        appendf(
            o, n,
            "  file reads: %.1f GB/s from the disk, %.1f GB/s from the page cache, which holds %.0f%% of the "
            "DiT's files, %.0f%% of the text encoder's, %.0f%% of the audio VAE's, %.0f%% of the video "
            "VAE's\n",
            p->fig.disk_gbs, p->fig.cache_gbs, 100 * p->cached[0], 100 * p->cached[1], 100 * p->cached[2],
            100 * p->cached[3]);
    const h3_stage_plan *hs[4] = {&p->te, &p->avae, &p->vvae, &p->venc};
    static const char *const names[4] = {"text encoder", "audio VAE", "video VAE", "keyframes"};
    const h3_stage_plan *te = hs[0];
    if (te->present) stage_format(o, n, p, names[0], te);
    if (hs[3]->present) stage_format(o, n, p, "video VAE encoder (keyframes, references)", hs[3]);
    if (p->aenc.present) stage_format(o, n, p, "audio VAE encoder (soundtrack, sound references)", &p->aenc);
    const h3_dit_plan *t = &p->dit;
    if (t->present) dit_format(o, n, p, "DiT", t, p->dit_gpu, r->steps);
    const h3_dit_plan *tr = &p->dit_refine;
    char rt[96];
    snprintf(rt, sizeof rt, "DiT, refine pass at %lldx%lld", (long long)r->refine_width,
             (long long)r->refine_height);
    if (tr->present) dit_format(o, n, p, rt, tr, p->dit_refine_gpu, r->refine_steps);
    for (int i = 1; i < 3; i++)
        if (hs[i]->present) stage_format(o, n, p, names[i], hs[i]);
    /* the stages in the order they run, each on its own within the same budgets */
    appendf(o, n, "\nstages, in turn (each gives the device back before the next):\n");
    appendf(o, n, "  %-13s %-7s %-22s %-10s %s\n", "stage", "place", "device peak", "host peak", "predicted");
    for (int k = 0; k < 6;
         k++) { /* text encoder, keyframes (the encoder), DiT, DiT refine, audio VAE, video VAE */
        const int i = k == 0 ? 0 : k == 1 ? 5 : k - 1;
        const h3_stage_plan *sp = i == 0 ? hs[0] : i == 3 ? hs[1] : i == 4 ? hs[2] : i == 5 ? hs[3] : NULL;
        const h3_dit_plan *dp = i == 1 ? t : i == 2 ? tr : NULL;
        if (sp ? !sp->present : !dp->present) continue;
        const int calls = i == 2 ? r->refine_steps : r->steps;
        const int on_dev = sp ? sp->on_device : 1;
        const int64_t dpk = sp ? sp->dev_peak : dp->dev_peak, hpk = sp ? sp->host_peak : dp->host_peak;
        char pk[48], tm[48];
        if (on_dev)
            snprintf(pk, sizeof pk, "%s of %s", h3_budget_str(dpk, a, sizeof a),
                     h3_budget_str(p->budgets.vram, b, sizeof b));
        else
            snprintf(pk, sizeof pk, "-");
        if (!p->have_time || !on_dev || sp == hs[3]) /* the encoder's time is not predicted */
            snprintf(tm, sizeof tm, "-");
        else if (sp)
            snprintf(tm, sizeof tm, "%.1f s", sp->t_load + sp->t_run);
        else if (calls > 0)
            snprintf(tm, sizeof tm, "%.1f s (%d calls)", h3_dit_plan_seconds(dp, calls), calls);
        else
            snprintf(tm, sizeof tm, "%.3f s a call", dp->t_step);
        appendf(o, n, "  %-13s %-7s %-22s %-10s %s\n",
                sp       ? names[i == 0 ? 0 : i - 2]
                : i == 1 ? "DiT"
                         : "DiT refine",
                on_dev ? "device" : "host", pk, h3_budget_str(hpk, c, sizeof c), tm);
    }
    if (!p->fits) appendf(o, n, "\nDOES NOT FIT: %s\n", p->why);
    return o;
}

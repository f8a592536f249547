/* The block streamer on a GPU (skips without one).
 *
 * ordering: items of 32 MiB with distinct contents stream through a ring of 2 and of 3 slots, from pinned
 * memory and from a file (read into pinned staging on the read stream), while each use is a kernel that first
 * spins ~3 ms and then sums its slot. A slot refilled before that kernel finished, or read before its copy
 * finished, gives a wrong sum. The same run with the event waits switched off must produce wrong sums: the
 * test can see the fault it guards against.
 *
 * dit: a full-width DiT (hidden 5376, 56 heads, FFN 14336; 2 blocks + 2 refiner blocks, random bf16 weights
 * in pinned memory) planned for a device budget that forces streaming; the arena reserved is that budget. The
 * streamed forward must equal the resident GPU forward bit for bit; the measured peak of the arena must be
 * within 5% of the plan's prediction and never above the budget; each report category within 5% of its
 * prediction. Once with every streamed block in pinned memory, once with a host budget that sends blocks to
 * the disk tier. dit_int8: the same with the blocks' linears int8 + ConvRot (the GPU's W8A8 GEMMs; the blocks
 * stream at their stored size, values and scales).
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "cuda/cuda.h"
#include "models/dit_stream.h"
#include "pipeline/plan.h"
#include "mem/report.h"
#include "mem/streamer.h"
#include "models/dit.h"
#include "pipeline/layout.h"
#include "quant/qwrite.h"
#include "testutil.h"

static h3_exec g_ex;

static uint32_t word(int item, int64_t i) {
    uint64_t z = (uint64_t)item * 0x9e3779b97f4a7c15ULL + (uint64_t)i;
    z = (z ^ (z >> 29)) * 0xbf58476d1ce4e5b9ULL;
    return (uint32_t)(z >> 32);
}

/* Runs 3 passes over NI items through k slots; returns how many sums were wrong. */
static int ring_run(int k, int unsafe, const char *file) {
    enum { NI = 8 };
    const int64_t bytes = (int64_t)32 << 20, words = bytes / 4;
    int wrong = -1;
    void *src[NI] = {0};
    uint64_t expect[NI];
    h3_stream_seg segs[NI];
    h3_stream_item items[NI];
    h3_streamer *s = NULL;
    h3_tensor sums = {0}, back = {0};
    int fd = -1;
    FILE *f = fopen(file, "wb");
    if (!f) return -1;
    for (int i = 0; i < NI; i++) {
        src[i] = h3_place_alloc(H3_PLACE_PINNED, (size_t)bytes, H3_MEM_WEIGHTS);
        if (!src[i]) goto done;
        uint32_t *w = src[i];
        expect[i] = 0;
        for (int64_t j = 0; j < words; j++) expect[i] += w[j] = word(i, j);
        if (i % 3 == 2) fwrite(w, 1, (size_t)bytes, f); /* items 2 and 5 come from the file */
    }
    fclose(f);
    fd = open(file, O_RDONLY);
    if (fd < 0) goto done;
    int64_t foff = 0;
    for (int i = 0; i < NI; i++) {
        int disk = i % 3 == 2;
        segs[i] = (h3_stream_seg){disk ? NULL : src[i], disk ? fd : -1, disk ? foff : 0, bytes, 0};
        if (disk) foff += bytes;
        items[i] = (h3_stream_item){bytes, &segs[i], 1, disk ? H3_TIER_DISK : H3_TIER_PINNED, !disk};
    }
    h3_streamer_config cfg = {H3_PLACE_DEVICE, k, bytes, 2, NULL, unsafe, NULL};
    if (h3_streamer_create(&g_ex, &cfg, items, NI, &s) != H3_OK) goto done;
    int order[NI];
    for (int i = 0; i < NI; i++) order[i] = i;
    const int passes = 3;
    if (h3_tensor_alloc2(&sums, H3_PLACE_DEVICE, H3_F32, passes * NI, 2, H3_MEM_ACTIVATIONS) != H3_OK)
        goto done;
    if (h3_op_fill(&g_ex, &sums, 0.0f) != H3_OK) goto done;
    if (h3_exec_sync(&g_ex) != H3_OK) goto done;
    if (h3_streamer_set_order(s, order, NI, 1) != H3_OK) goto done;
    h3_cuda_stream_h cs = h3_cuda_compute_stream(&g_ex);
    for (int p = 0; p < passes; p++)
        for (int i = 0; i < NI; i++) {
            void *d;
            if (h3_streamer_acquire(s, i, &d) != H3_OK) goto done;
            uint64_t *out = (uint64_t *)((float *)sums.data + 2 * (p * NI + i));
            if (h3_cuda_debug_spin_sum(cs, d, (size_t)words, out, 3000) != H3_OK) goto done;
            h3_streamer_release(s, i);
        }
    if (h3_exec_sync(&g_ex) != H3_OK || h3_streamer_sync(s) != H3_OK) goto done;
    if (h3_tensor_alloc2(&back, H3_PLACE_HOST, H3_F32, passes * NI, 2, H3_MEM_ACTIVATIONS) != H3_OK)
        goto done;
    if (h3_copy(&g_ex, &back, &sums) != H3_OK || h3_exec_sync(&g_ex) != H3_OK) goto done;
    wrong = 0;
    for (int p = 0; p < passes; p++)
        for (int i = 0; i < NI; i++) wrong += ((uint64_t *)back.data)[p * NI + i] != expect[i];
    h3_stream_stats st;
    h3_streamer_get_stats(s, &st);
    if (!unsafe)
        printf("  %d slots: %d/%d sums right; %lld copies, %.1f GB/s timed, %lld disk reads at %.2f GB/s\n",
               k, passes * NI - wrong, passes * NI, (long long)st.copies,
               st.copy_ms > 0 ? st.bytes_timed / (st.copy_ms * 1e-3) / 1e9 : 0.0, (long long)st.reads,
               st.read_s > 0 ? st.bytes_read / st.read_s / 1e9 : 0.0);
done:
    if (wrong < 0) printf("  ring run failed: %s\n", h3_last_error());
    h3_streamer_free(s);
    h3_tensor_free(&sums);
    h3_tensor_free(&back);
    for (int i = 0; i < NI; i++)
        if (src[i]) h3_place_free(H3_PLACE_PINNED, src[i], (size_t)bytes, H3_MEM_WEIGHTS);
    if (fd >= 0) close(fd);
    unlink(file);
    return wrong;
}

static void test_ordering(void) {
    if (h3_cuda_init(&g_ex, 0, (int64_t)4 << 30) != H3_OK) {
        CHECK(0, "init: %s", h3_last_error());
        return;
    }
    char file[1024];
    t_tmp_path("ring.bin", file, sizeof file);
    for (int k = 2; k <= 3; k++) {
        int w = ring_run(k, 0, file);
        CHECK(w == 0,
              "%d slots: %d wrong sums (a slot reused before its reader finished, or read before its copy)",
              k, w);
    }
    int w = ring_run(2, 1, file);
    printf("  without the event waits: %d of 24 sums wrong\n", w);
    CHECK(w > 0, "with the waits switched off every sum was still right: the test cannot see a reused slot");
    h3_cuda_shutdown(&g_ex);
}

/* ---- the DiT ------------------------------------------------------------------------------------------- */

typedef struct {
    h3_tensor *t[4096];
    int n;
} tlist;

static int collect(const char *name, h3_tensor *t, void *user) {
    (void)name;
    tlist *l = user;
    if (l->n < 4096) l->t[l->n++] = t;
    return 0;
}

typedef struct {
    h3_seq_layout L;
    float uniq[4];
    int nt;
    int32_t *tidx, *tags, *vi, *ai, *ti;
    h3_tensor video, audio, text; /* host */
} inputs;

static void inputs_make(inputs *x) {
    memset(x, 0, sizeof *x);
    CHECK_OK(h3_seq_layout_t2va(128, NULL, 22, 512, 256, &x->L));
    const int64_t S = x->L.seq_len, Nv = x->L.n_video_rows, Na = x->L.n_audio_rows;
    x->tidx = malloc((size_t)S * 4);
    x->tags = malloc((size_t)S * 4);
    x->vi = malloc((size_t)Nv * 4);
    x->ai = malloc((size_t)Na * 4);
    x->ti = malloc(128 * 4);
    x->nt = h3_seq_layout_timestep_indices(&x->L, 0.4f, 0.7f, x->uniq, x->tidx);
    for (int64_t r = 0; r < S; r++) x->tags[r] = x->L.tags[r];
    for (int64_t i = 0; i < Nv; i++) x->vi[i] = (int32_t)x->L.video_indices[i];
    for (int64_t i = 0; i < Na; i++) x->ai[i] = (int32_t)x->L.audio_indices[i];
    for (int i = 0; i < 128; i++) x->ti[i] = (int32_t)x->L.text_indices[i];
    CHECK_OK(h3_tensor_alloc2(&x->video, H3_PLACE_HOST, H3_F32, Nv, 96, H3_MEM_IO));
    CHECK_OK(h3_tensor_alloc2(&x->audio, H3_PLACE_HOST, H3_F32, Na, 32, H3_MEM_IO));
    CHECK_OK(h3_tensor_alloc2(&x->text, H3_PLACE_HOST, H3_F32, 128, 5120, H3_MEM_IO));
    t_fill_randn(x->video.data, (size_t)(Nv * 96), 1.0);
    t_fill_randn(x->audio.data, (size_t)(Na * 32), 1.0);
    t_fill_randn(x->text.data, (size_t)(128 * 5120), 1.0);
}

static void inputs_free(inputs *x) {
    h3_tensor_free(&x->video);
    h3_tensor_free(&x->audio);
    h3_tensor_free(&x->text);
    free(x->tidx);
    free(x->tags);
    free(x->vi);
    free(x->ai);
    free(x->ti);
    h3_seq_layout_free(&x->L);
}

/* One forward on the device; velocities back on the host (f32 [Nv, 96], [Na, 32]). Device tensors of the
 * caller are counted as activations. */
static h3_status forward_dev(h3_dit *d, const inputs *x, h3_memrep *rep, h3_tensor *hv, h3_tensor *ha) {
    const int64_t S = x->L.seq_len, Nv = x->L.n_video_rows, Na = x->L.n_audio_rows;
    h3_tensor dv = {0}, da = {0}, dt = {0}, ov = {0}, oa = {0};
    h3_status st = H3_OK;
    if (rep) h3_memrep_set_category(rep, H3_DEVCAT_ACTIVATIONS);
    H3_CHECK(h3_tensor_alloc2(&dv, H3_PLACE_DEVICE, H3_F32, Nv, 96, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_tensor_alloc2(&da, H3_PLACE_DEVICE, H3_F32, Na, 32, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_tensor_alloc2(&dt, H3_PLACE_DEVICE, H3_F32, 128, 5120, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_tensor_alloc2(&ov, H3_PLACE_DEVICE, H3_F32, Nv, 96, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_tensor_alloc2(&oa, H3_PLACE_DEVICE, H3_F32, Na, 32, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_copy(&g_ex, &dv, &x->video));
    H3_CHECK(h3_copy(&g_ex, &da, &x->audio));
    H3_CHECK(h3_copy(&g_ex, &dt, &x->text));
    {
        h3_dit_inputs in = {&dv,     &da,     &dt,      x->uniq, x->nt, S,
                            x->tidx, x->tags, x->L.pos, x->vi,   x->ai, x->ti};
        if (rep) h3_memrep_set_category(rep, H3_DEVCAT_MODULATION);
        H3_CHECK(h3_dit_precompute_modulation(d, &g_ex, x->uniq, x->nt));
        if (rep) h3_memrep_set_category(rep, H3_DEVCAT_ACTIVATIONS);
        H3_CHECK(h3_dit_forward(d, &g_ex, &in, &ov, &oa));
        H3_CHECK(h3_dit_forward(d, &g_ex, &in, &ov, &oa)); /* a second step: the ring runs on across steps */
    }
    H3_CHECK(h3_tensor_alloc2(hv, H3_PLACE_HOST, H3_F32, Nv, 96, H3_MEM_IO));
    H3_CHECK(h3_tensor_alloc2(ha, H3_PLACE_HOST, H3_F32, Na, 32, H3_MEM_IO));
    H3_CHECK(h3_copy(&g_ex, hv, &ov));
    H3_CHECK(h3_copy(&g_ex, ha, &oa));
    H3_CHECK(h3_exec_sync(&g_ex));
done:
    h3_tensor *ts[] = {&dv, &da, &dt, &ov, &oa};
    for (int i = 0; i < 5; i++) h3_tensor_free(ts[i]);
    return st;
}

static int same_bits(const h3_tensor *a, const h3_tensor *b) {
    return h3_tensor_numel(a) == h3_tensor_numel(b) && !memcmp(a->data, b->data, h3_tensor_nbytes(a));
}

/* The plan of the 2-block DiT at a budget; ram 0: not limited. */
static int plan_for(h3_dit *dit, const inputs *x, int64_t vram, int64_t ram, h3_plan *plan) {
    h3_plan_model m;
    memset(&m, 0, sizeof m);
    m.dit = dit;
    m.dit_weights_pinned = 1;
    m.host_threads = 1;
    h3_plan_request req = {.frames = 22, .width = 512, .height = 256, .text_tokens = 128, .n_timesteps = x->nt};
    h3_plan_budgets b = {.vram = vram, .ram = ram};
    CHECK_OK(h3_plan_make(&m, &req, &b, NULL, plan));
    CHECK(plan->fits, "the plan does not fit %lld bytes: %s", (long long)vram, plan->why);
    return plan->fits;
}

/* The same weights resident on the device with the same row chunk (cuBLAS may round differently for other M),
 * in an arena of their own: the reference velocities. The pinned weights stay valid across arenas. */
static void reference(h3_dit *str, const h3_dit_config *cfg, const inputs *x, int64_t chunk, int quant,
                      h3_tensor *rv, h3_tensor *ra) {
    h3_dit_open_opts go;
    memset(&go, 0, sizeof go);
    go.act_place = H3_PLACE_DEVICE;
    go.weight_place = H3_PLACE_DEVICE;
    go.chunk_rows = chunk;
    h3_dit *res = NULL;
    if (h3_cuda_init(&g_ex, 0, (int64_t)16 << 30) != H3_OK) {
        CHECK(0, "init: %s", h3_last_error());
        return;
    }
    CHECK_OK(h3_dit_create(cfg, H3_BF16, &go, &res));
    if (res) {
        static tlist a, b;
        a.n = b.n = 0;
        h3_dit_visit_weights(str, collect, &a);
        h3_dit_visit_weights(res, collect, &b);
        CHECK(a.n == b.n && a.n > 0, "%d vs %d weights", a.n, b.n);
        if (quant) { /* the same values (the generator gives the same numbers on either place), quantized
                        alike */
            for (int i = 0; i < b.n; i++)
                CHECK_OK(h3_op_random_uniform(&g_ex, b.t[i], 1000 + (uint64_t)i, -0.03f, 0.03f));
            CHECK_OK(h3_dit_quantize_blocks(res, &g_ex, H3_QT_INT8_CONVROT, NULL));
        } else {
            for (int i = 0; i < a.n && i < b.n; i++) CHECK_OK(h3_copy(&g_ex, b.t[i], a.t[i]));
        }
        CHECK_OK(forward_dev(res, x, NULL, rv, ra));
    }
    h3_dit_close(res);
    h3_cuda_shutdown(&g_ex);
}

/* The streamed DiT as planned, in an arena of exactly the plan's budget, against the reference. */
static void streamed_run(h3_dit *dit, const inputs *x, const h3_plan *plan, const h3_tensor *rv,
                         const h3_tensor *ra) {
    const h3_dit_plan *p = &plan->dit;
    const int64_t vram = plan->budgets.vram, ram = plan->budgets.ram;
    printf("  plan at %.2f GiB (host %s): %d resident, %d pinned, %d disk, %d slots, chunk %lld; predicted "
           "peak %.3f "
           "GiB\n",
           vram / 1073741824.0, ram ? "limited" : "not limited", p->n_resident, p->n_pinned, p->n_disk,
           p->n_slots, (long long)p->chunk_rows, p->dev_peak / 1073741824.0);
    CHECK(p->n_resident < p->n_units && p->n_slots >= 1, "the budget must force streaming");
    if (ram) CHECK(p->n_disk > 0, "the host budget must send blocks to disk");
    if (h3_cuda_init(&g_ex, 0, vram) != H3_OK) {
        CHECK(0, "init with the budget: %s", h3_last_error());
        return;
    }
    h3_memrep *rep = NULL;
    h3_dit_stream *ds = NULL;
    h3_tensor hv = {0}, ha = {0};
    CHECK_OK(h3_memrep_create(&g_ex, &rep));
    int64_t pred[H3_DEVCAT_COUNT], ppeak;
    h3_dit_plan_predicted(p, pred, &ppeak);
    if (rep) h3_memrep_set_predicted(rep, pred, ppeak, vram);
    h3_cuda_reset_peak(&g_ex);
    h3_dit_placement pl;
    h3_dit_plan_placement(p, &pl);
    CHECK_OK(h3_dit_stream_open(dit, &g_ex, &pl, NULL, rep, &ds));
    if (ds) {
        CHECK_OK(forward_dev(dit, x, rep, &hv, &ha));
        CHECK_OK(h3_dit_stream_step_end(ds));
        CHECK(hv.data && rv->data && same_bits(&hv, rv) && same_bits(&ha, ra),
              "streamed velocities differ from the resident ones");
        int64_t used, peak, cap;
        h3_cuda_mem_stats(&g_ex, &used, &peak, &cap);
        double dev = fabs((double)peak - (double)p->dev_peak) / (double)p->dev_peak;
        printf("  measured peak %.4f GiB, predicted %.4f GiB (%+.2f%%), budget %.2f GiB\n",
               peak / 1073741824.0, p->dev_peak / 1073741824.0,
               100.0 * ((double)peak - (double)p->dev_peak) / (double)p->dev_peak, cap / 1073741824.0);
        CHECK(dev <= 0.05, "measured peak %lld vs predicted %lld: %.2f%% apart", (long long)peak,
              (long long)p->dev_peak, 100 * dev);
        CHECK(peak <= vram && cap == vram, "peak %lld, arena %lld, budget %lld", (long long)peak,
              (long long)cap, (long long)vram);
        if (rep) {
            h3_dit_stream_to_report(ds, rep, 0);
            h3_memrep_figures mf;
            h3_memrep_get(rep, &mf);
            for (int c = 0; c < H3_DEVCAT_COUNT; c++) {
                double e = mf.predicted[c]
                               ? fabs((double)mf.peak[c] - (double)mf.predicted[c]) / (double)mf.predicted[c]
                               : (double)mf.peak[c];
                CHECK(e <= 0.05, "%s: measured %lld, predicted %lld", h3_devcat_name((h3_devcat)c),
                      (long long)mf.peak[c], (long long)mf.predicted[c]);
            }
            char *txt = h3_memrep_format(rep);
            if (txt) fputs(txt, stdout);
            h3_free(txt);
            char path[1024];
            t_tmp_path("trace.json", path, sizeof path);
            CHECK_OK(h3_memrep_write_trace(rep, path));
            unlink(path);
        }
        h3_stream_stats st;
        h3_dit_stream_stats(ds, &st);
        CHECK(st.resyncs == 0, "%lld resyncs", (long long)st.resyncs);
        if (ram) CHECK(st.reads > 0, "no disk reads with blocks on the disk tier");
    }
    h3_dit_stream_close(ds);
    h3_dit_release_workspace(dit);
    h3_dit_release_modulation(dit);
    int64_t used;
    h3_cuda_mem_stats(&g_ex, &used, NULL, NULL);
    const int64_t backend =
        H3_CUDA_BACKEND_BYTES + (p->dev_backend > H3_CUDA_BACKEND_BYTES ? H3_CUDA_QGEMM_SCRATCH_BYTES : 0);
    CHECK(used == backend, "after the stage the arena holds %lld bytes, expected the backend's %lld",
          (long long)used, (long long)backend);
    h3_memrep_free(rep);
    h3_tensor_free(&hv);
    h3_tensor_free(&ha);
    h3_cuda_shutdown(&g_ex);
}

static void dit_case(int quant) {
    h3_dit_config cfg;
    h3_dit_config_default(&cfg);
    cfg.n_layers = 2;
    inputs x;
    inputs_make(&x);
    h3_dit *str = NULL;
    h3_dit_open_opts so;
    memset(&so, 0, sizeof so);
    so.act_place = H3_PLACE_DEVICE;
    so.weight_place = H3_PLACE_PINNED;
    so.stream_weights = 1;
    /* the pinned allocator belongs to the backend: one is up while the weights are made and when they are
     * freed */
    if (h3_cuda_init(&g_ex, 0, (int64_t)1 << 30) != H3_OK) {
        CHECK(0, "init: %s", h3_last_error());
        inputs_free(&x);
        return;
    }
    CHECK_OK(h3_dit_create(&cfg, H3_BF16, &so, &str));
    if (str) {
        static tlist a;
        a.n = 0;
        h3_dit_visit_weights(str, collect, &a);
        for (int i = 0; i < a.n; i++)
            CHECK_OK(h3_op_random_uniform(&g_ex, a.t[i], 1000 + (uint64_t)i, -0.03f, 0.03f));
        if (quant)
            CHECK_OK(h3_dit_quantize_blocks(str, &g_ex, H3_QT_INT8_CONVROT, NULL)); /* into pinned memory */
    }
    h3_cuda_shutdown(&g_ex);
    if (str) {
        static h3_plan pin, disk;
        h3_dit_pack pk;
        h3_dit_pack_unit(str, 0, &pk);
        /* 2.5 GiB: four blocks of 0.72 GiB cannot all be resident; int8: 2.25 GiB, with two refiner blocks of
         * 0.72 and two int8 blocks of 0.36 GiB and the quantized GEMMs' 128 MiB */
        const int64_t budget = quant ? (int64_t)9 << 28 : (int64_t)5 << 29;
        if (quant) {
            h3_dit_pack p2;
            h3_dit_pack_unit(str, (int)cfg.n_refiner_layers, &p2);
            CHECK(p2.quantized && p2.bytes < pk.bytes * 0.55,
                  "an int8 block packs %lld bytes, a bf16 one %lld", (long long)p2.bytes,
                  (long long)pk.bytes);
            printf("  int8 block: %.3f GiB packed (bf16 refiner block %.3f GiB)\n", p2.bytes / 1073741824.0,
                   pk.bytes / 1073741824.0);
        }
        /* The host budget holds the forward's host tables and two and a half blocks: fewer than the streamed
         * blocks, so some must come from the disk, which needs two blocks of pinned staging, and what is left
         * holds none of them pinned: every streamed block comes from the disk tier. */
        int ok = plan_for(str, &x, budget, 0, &pin) &&
                 plan_for(str, &x, budget, 2 * pk.bytes + pin.dit.host_other + pk.bytes / 2, &disk);
        h3_tensor rv = {0}, ra = {0};
        if (ok) {
            reference(str, &cfg, &x, pin.dit.chunk_rows, quant, &rv, &ra);
            streamed_run(str, &x, &pin, &rv, &ra);
            if (disk.dit.chunk_rows != pin.dit.chunk_rows) {
                h3_tensor_free(&rv);
                h3_tensor_free(&ra);
                reference(str, &cfg, &x, disk.dit.chunk_rows, quant, &rv, &ra);
            }
            streamed_run(str, &x, &disk, &rv, &ra);
        }
        h3_tensor_free(&rv);
        h3_tensor_free(&ra);
    }
    CHECK_OK(h3_cuda_init(&g_ex, 0, (int64_t)1 << 30));
    h3_dit_close(str);
    h3_cuda_shutdown(&g_ex);
    inputs_free(&x);
}

static void test_dit(void) {
    dit_case(0);
}

static void test_dit_int8(void) {
    dit_case(1);
}

int main(int argc, char **argv) {
    if (h3_cuda_device_count() == 0) {
        printf("test_streamer: skipped: no CUDA device on this machine\n");
        return 0;
    }
    if (h3_exec_init(&g_ex, 0) != H3_OK) {
        fprintf(stderr, "init failed: %s\n", h3_last_error());
        return 1;
    }
    /* Each case reserves the arenas it needs and shuts the backend down again. */
    static const t_case cases[] = {
        {"ordering", test_ordering}, {"dit", test_dit}, {"dit_int8", test_dit_int8}, {NULL, NULL}};
    int r = t_main("test_streamer", cases, argc, argv);
    h3_exec_free(&g_ex);
    return r;
}

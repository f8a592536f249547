/* h3run dit: one DiT forward on a packed sequence given as named tensors, for debugging and for comparing
 * with other implementations. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "cli/cli.h"
#include "io/safetensors.h"
#include "cuda/cuda.h"
#include "mem/budget.h"
#include "models/dit.h"
#include "models/lora.h"
#include "pipeline/stages.h"

/* max |got − ref| / max |ref| of the named tensor of `ref_path` against got; prints one line. 1 when above
 * tol. */
static h3_status compare(h3_st_set *ref, const char *name, const h3_tensor *got, double tol, int *bad,
                         int quiet) {
    if (!h3_st_find(ref, name)) return H3_OK;
    h3_tensor r;
    H3_TRY(h3_st_load(ref, name, H3_PLACE_HOST, H3_F32, H3_MEM_IO, &r));
    h3_status st = H3_OK;
    if (h3_tensor_numel(&r) != h3_tensor_numel(got) || h3_tensor_cols(&r) != h3_tensor_cols(got)) {
        char a[64], b[64];
        st = H3_ERR(H3_ERR_FORMAT, "%s: '%s' is %s, the output %s", ref->source, name,
                    h3_tensor_shape_str(&r, a, sizeof a), h3_tensor_shape_str(got, b, sizeof b));
    } else {
        double num = 0, den = 0;
        const float *x = got->data, *y = r.data;
        for (int64_t i = 0; i < h3_tensor_numel(&r); i++) {
            double dd = fabs((double)x[i] - (double)y[i]);
            if (!(dd <= num)) num = dd;
            if (fabs((double)y[i]) > den) den = fabs((double)y[i]);
        }
        double e = den > 0 ? num / den : num;
        if (!(e <= tol)) *bad = 1;
        if (!quiet || !(e <= tol))
            printf("compare %-15s max |diff| / max |ref| = %.3e (tolerance %.1e)%s\n", name, e, tol,
                   e <= tol ? "" : "  FAIL");
    }
    h3_tensor_free(&r);
    return st;
}

static void print_lora(const h3_lora *l, const h3_dit *dit) {
    if (!l->n) return;
    char a[160], b[32], e[32];
    h3_lora_mem lm;
    h3_lora_mem_of(dit, &lm);
    printf("  LoRA: %s; %d weights merged (owned copies %s bytes), %d on the side path (%s bytes)\n",
           h3_lora_describe(l, a, sizeof a), lm.n_merged, h3_fmt_int(lm.merged, b, sizeof b), lm.n_side,
           h3_fmt_int(lm.side, e, sizeof e));
}

static void print_model(const char *path, const h3_dit *dit) {
    const h3_dit_config *c = h3_dit_get_config(dit);
    h3_dit_weight_bytes wb;
    h3_dit_weight_bytes_of(dit, &wb);
    char a[32], b[32], e[32], f[32], g[32];
    printf("model: %s\n  %s\n", path, h3_dit_describe(dit));
    printf("  weights: %s bytes (%s), AdaLN %s bytes, mapped from the file %s bytes, owned copies %s bytes\n",
           h3_fmt_int(wb.total, a, sizeof a), h3_fmt_bytes((double)wb.total, b, sizeof b),
           h3_fmt_int(wb.adaln, e, sizeof e), h3_fmt_int(wb.mapped, f, sizeof f),
           h3_fmt_int(wb.owned, g, sizeof g));
    printf("  per step with precomputed modulation: the AdaLN bytes stay unread; 4 timesteps of kept rows "
           "are %s "
           "bytes\n",
           h3_fmt_int(h3_dit_modulation_bytes(c, 4), a, sizeof a));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int h3_cmd_dit(int argc, char **argv) {
    const char *model = NULL, *inputs = NULL, *output = NULL, *config = NULL, *qkv = "auto", *expect = NULL,
               *device = "cpu", *vram_s = NULL, *ram_s = NULL, *lora_mode = "auto";
    h3_cli_list lora_s = {{0}, 0};
    int quiet = 0, verbose = 0, describe = 0;
    double tol = 1e-4;
    int64_t threads = 0, chunk = 0;
    const h3_cli_opt opts[] = {
        {"model", 'm', H3_OPT_STR, &model, "PATH",
         "DiT weights: a .safetensors file, a shard index or a folder "
         "(official, diffusers or ComfyUI pruned layout)",
         0, 0},
        {"inputs", 'i', H3_OPT_STR, &inputs, "FILE",
         "the packed sequence: a .safetensors file of named tensors", 0, 0},
        {"output", 'o', H3_OPT_STR, &output, "FILE", "where to write video_velocity and audio_velocity (f32)",
         0, 0},
        {"config", 0, H3_OPT_STR, &config, "FILE", "config.json to use instead of the one beside the weights",
         0, 0},
        {"qkv-order", 0, H3_OPT_STR, &qkv, "ORDER",
         "rows of a fused qkv_proj: auto (official: per-head interleaved; ComfyUI: contiguous), interleaved, "
         "contiguous",
         0, 0},
        {"expect", 0, H3_OPT_STR, &expect, "FILE",
         "compare with video_velocity / audio_velocity of FILE; fail when max |diff| / max |ref| > --tol "
         "(exit 1, and -o is not written)",
         0, 0},
        {"tol", 0, H3_OPT_FLOAT, &tol, "X", "tolerance of --expect (default 1e-4)", 0, 1e6},
        {"describe", 0, H3_OPT_FLAG, &describe, NULL,
         "only open the model: print its layout, config and weight bytes (no --inputs / -o needed)", 0, 0},
        {"lora", 0, H3_OPT_LIST, &lora_s, "FILE[:STRENGTH]",
         "apply a LoRA file (any published H3 LoRA format; docs/LORA.md) at STRENGTH (default 1.0); repeat "
         "for "
         "several, which add up",
         0, H3_MAX_LORAS},
        {"lora-mode", 0, H3_OPT_STR, &lora_mode, "MODE",
         "auto (default: merged into float weights, a low-rank side path for quantized or streamed ones), "
         "merge, "
         "or side",
         0, 0},
        {"threads", 't', H3_OPT_INT, &threads, "N", "CPU threads (default 0: one per CPU)", 0,
         H3_MAX_THREADS},
        {"chunk-rows", 0, H3_OPT_INT, &chunk, "N",
         "rows per FFN chunk on the CPU (default 2048; on the GPU the plan chooses it)", 1, 1 << 30},
        {"device", 0, H3_OPT_STR, &device, "NAME",
         "cpu (default), cuda, or auto (cuda when a GPU is present): where the DiT runs; on the GPU its "
         "blocks are "
         "resident or streamed as planned for --vram-budget and the modulation of the inputs' timesteps is "
         "computed "
         "once, as generate runs it",
         0, 0},
        {"vram-budget", 0, H3_OPT_STR, &vram_s, "SIZE",
         "with --device cuda or auto: every byte the DiT may take on the GPU, e.g. 8GiB (default: the free "
         "memory "
         "less 512 MiB)",
         0, 0},
        {"ram-budget", 0, H3_OPT_STR, &ram_s, "SIZE",
         "with the GPU: host memory for pinned copies of streamed blocks (default: 80% of available; "
         "'unlimited'); blocks beyond it are read from the file",
         0, 0},
        {"quiet", 'q', H3_OPT_FLAG, &quiet, NULL, "print only errors on stderr", 0, 0},
        {"verbose", 'v', H3_OPT_FLAG, &verbose, NULL, "log more", 0, 0},
        {0},
    };
    const h3_cli_cmd cmd = {
        "dit",
        "dit --model PATH --inputs FILE -o OUT",
        "Run the MiniMax-H3 DiT once on a packed sequence. The inputs file holds the arguments of "
        "diffusers'\n"
        "MiniMaxH3Transformer3DModel.forward without the batch axis:\n"
        "  video [Nv, 96], audio [Na, 32], text [L, text_dim]      f32 (other float types are converted)\n"
        "  timesteps [T]                                           the distinct t = 1 - sigma\n"
        "  timestep_indices [S], token_tags [S] (0 video, 1 text, 2 audio)\n"
        "  position_ids [S, 3]                                     F64 (t, h, w)\n"
        "  video_indices [Nv], audio_indices [Na], text_indices [L] I64 or I32 rows of the packed sequence\n"
        "It writes video_velocity [Nv, 96] and audio_velocity [Na, 32] (f32, x0 = x_t + sigma * v).",
        "examples:\n  h3run dit --model FL2VA/transformer --inputs packed.safetensors -o "
        "velocity.safetensors\n"
        "  h3run dit -m tests/fixtures/dit/official -i tests/fixtures/dit/inputs.safetensors -o "
        "/tmp/v.safetensors \\\n"
        "      --expect tests/fixtures/dit/expected_full.safetensors",
        opts,
        0,
        0};
    const char *pos[1];
    int npos;
    int r = h3_cli_parse(&cmd, argc, argv, pos, &npos);
    if (r) return r < 0 ? H3_EXIT_OK : r;
    if (!model || (!describe && (!inputs || !output))) {
        fprintf(stderr, "h3run dit: --model, --inputs and -o are required (see h3run dit --help)\n");
        return H3_EXIT_USAGE;
    }
    h3_cli_device dev;
    memset(&dev, 0, sizeof dev);
    if (!describe) {
        r = h3_cli_device_resolve("dit", device, vram_s, 0, &dev);
        if (r) return r;
    }
    int64_t ram = 0; /* the host budget of the GPU's plan (0: not limited) */
    if (ram_s && strcmp(ram_s, "unlimited")) {
        h3_status bs = h3_budget_parse(ram_s, "--ram-budget", &ram);
        if (bs != H3_OK) return h3_cli_fail("dit", bs);
    } else if (!ram_s) {
        ram = h3_budget_default_ram();
    }
    h3_dit_open_opts oo = {0};
    oo.config_path = config;
    oo.act_place = H3_PLACE_HOST;
    oo.chunk_rows = chunk;
    if (dev.cuda) { /* as the plan wants it: headers, the blocks left in the file until the stage places them
                     */
        oo.act_place = H3_PLACE_DEVICE;
        oo.weight_place = H3_PLACE_HOST;
        oo.stream_weights = 1;
        oo.chunk_rows = 0;
    }
    if (!strcmp(qkv, "auto"))
        oo.qkv_order = H3_DIT_QKV_AUTO;
    else if (!strcmp(qkv, "interleaved"))
        oo.qkv_order = H3_DIT_QKV_INTERLEAVED;
    else if (!strcmp(qkv, "contiguous"))
        oo.qkv_order = H3_DIT_QKV_CONTIGUOUS;
    else {
        fprintf(stderr, "h3run dit: --qkv-order must be auto, interleaved or contiguous; got '%s'\n", qkv);
        return H3_EXIT_USAGE;
    }
    h3_cli_loras loras;
    r = h3_cli_loras_parse("dit", &lora_s, lora_mode, &loras);
    if (r) return r;
    h3_cli_setup_logging(quiet ? -1 : verbose);
    const h3_cli_path paths[] = {
        {"--model", model, H3_CLI_IN},
        {"--inputs", inputs, H3_CLI_IN},
        {"--config", config, H3_CLI_IN_FILE},
        {"--expect", expect, H3_CLI_IN},
        {"-o", describe ? NULL : output, H3_CLI_OUT_FILE},
    };
    r = h3_cli_check_paths_loras("dit", paths, (int)(sizeof paths / sizeof paths[0]), &loras);
    if (r) {
        h3_cli_loras_free(&loras);
        return r;
    }
    h3_lora lora;
    memset(&lora, 0, sizeof lora);

    h3_exec ex = {0};
    h3_dit *dit = NULL;
    h3_dit_inputs_file in = {0};
    h3_tensor vout = {0}, aout = {0};
    h3_st_writer *w = NULL;
    int rc = H3_EXIT_OK;
    h3_cli_run_begin();
    h3_status st = h3_exec_init(&ex, (int)threads);
    if (st == H3_OK) st = h3_dit_open(model, &oo, &dit);
    if (st == H3_OK) st = h3_lora_read(&lora, dit, loras.n, (const char *const *)loras.path, loras.strength);
    if (st == H3_OK && loras.n) st = h3_lora_apply(dit, &ex, &lora, (h3_lora_mode)loras.mode);
    if (describe) {
        if (st == H3_OK) {
            print_model(model, dit);
            print_lora(&lora, dit);
        }
        h3_lora_free(&lora);
        h3_cli_loras_free(&loras);
        h3_dit_close(dit);
        h3_exec_free(&ex);
        st = h3_cli_run_end(st);
        return st == H3_OK ? H3_EXIT_OK : (h3_cli_fail("dit", st), H3_EXIT_FAIL);
    }
    if (st == H3_OK) st = h3_dit_inputs_read(inputs, h3_dit_get_config(dit), &in);
    int64_t Nv = in.video.shape[0], Na = in.audio.shape[0];
    const h3_dit_config *cfg = dit ? h3_dit_get_config(dit) : NULL;
    if (st == H3_OK)
        st = h3_tensor_alloc2(&vout, H3_PLACE_HOST, H3_F32, Nv > 0 ? Nv : 1, h3_dit_video_dim(cfg),
                              H3_MEM_ACTIVATIONS);
    if (st == H3_OK)
        st = h3_tensor_alloc2(&aout, H3_PLACE_HOST, H3_F32, Na > 0 ? Na : 1, cfg->audio_dim,
                              H3_MEM_ACTIVATIONS);
    /* The stage generate runs: on the GPU as planned for this sequence (its modulation computed once), or on
     * the CPU as opened (each call computes its own modulation). */
    h3_plan *plan = NULL;
    if (st == H3_OK && dev.cuda) {
        plan = h3_calloc(1, sizeof *plan, H3_MEM_OTHER);
        st = plan ? h3_dit_device_check(dit) : H3_ERR(H3_ERR_NOMEM, "out of memory");
        if (st == H3_OK) {
            h3_plan_model m;
            memset(&m, 0, sizeof m);
            m.dit = dit;
            m.dit_weights_in_file = 1;
            m.host_threads = ex.threads;
            plan->budgets = (h3_plan_budgets){.vram = dev.vram, .ram = ram};
            plan->have_time = dev.have_fig;
            if (dev.have_fig)
                plan->fig = dev.fig;
            else
                h3_device_figures_find("h200", &plan->fig); /* for ranking the choices only */
            int64_t L = in.text.data ? in.text.shape[0] : 0;
            st = h3_plan_dit(&m, in.in.seq_len, L, Nv, Na, in.in.n_timesteps, &plan->budgets, &plan->fig,
                             &plan->dit);
        }
        if (st == H3_OK && !plan->dit.fits) {
            char a[32], b[32], c[32];
            st = H3_ERR(
                H3_ERR_BUDGET,
                "the DiT does not fit the device budget of %s for %lld rows: its smallest plan takes %s and "
                "%s of slack; raise --vram-budget (or --ram-budget), or use --device cpu",
                h3_budget_str(dev.vram, a, sizeof a), (long long)in.in.seq_len,
                h3_budget_str(plan->dit.dev_peak, b, sizeof b),
                h3_budget_str(h3_budget_slack(dev.vram), c, sizeof c));
        }
        if (st == H3_OK && !quiet) {
            char a[32], b[32];
            const h3_dit_plan *p = &plan->dit;
            printf("on the GPU: %d of %d blocks resident, %d streamed from pinned memory, %d from the file; "
                   "ring of "
                   "%d slots; predicted device peak %s of the %s budget\n",
                   p->n_resident, p->n_units, p->n_pinned, p->n_disk, p->n_slots,
                   h3_budget_str(p->dev_peak, a, sizeof a), h3_budget_str(dev.vram, b, sizeof b));
        }
        if (st == H3_OK) st = h3_cuda_init(&ex, 0, dev.vram);
    }
    double t0 = now_s(), t1 = t0;
    h3_dit_stage_result dres;
    memset(&dres, 0, sizeof dres);
    if (st == H3_OK) {
        vout.shape[0] = Nv;
        aout.shape[0] = Na;
        h3_dit_stage_args da;
        memset(&da, 0, sizeof da);
        da.dit = dit;
        da.plan = plan;
        da.text = in.text.data ? &in.text : NULL;
        da.n_video_rows = Nv;
        da.n_audio_rows = Na;
        if (plan) {
            da.timesteps = in.in.timesteps;
            da.n_timesteps = in.in.n_timesteps;
        }
        h3_dit_stage *ds = NULL;
        st = h3_dit_stage_open(&ex, &da, &ds);
        t0 = now_s();
        if (st == H3_OK) st = h3_dit_stage_call(ds, &in.in, Nv ? &vout : NULL, Na ? &aout : NULL);
        t1 = now_s();
        h3_dit_stage_close(ds, &dres);
    }
    if (st == H3_OK) st = h3_st_writer_new(&w);
    if (st == H3_OK) st = h3_st_writer_add_tensor(w, "video_velocity", &vout);
    if (st == H3_OK) st = h3_st_writer_add_tensor(w, "audio_velocity", &aout);
    if (st == H3_OK) st = h3_st_writer_meta(w, "h3run", "dit velocity (x0 = x_t + sigma * v)");
    if (st == H3_OK) st = h3_st_writer_write(w, output, 0);
    if (st == H3_OK && !quiet) {
        print_model(model, dit);
        print_lora(&lora, dit);
        printf("sequence: %lld rows (video %lld, audio %lld, text %lld), %d timesteps\n",
               (long long)in.in.seq_len, (long long)Nv, (long long)Na, (long long)in.text.shape[0],
               in.in.n_timesteps);
        if (dres.rep.on_device) {
            char a[32], b[32];
            printf("forward: %.3f s on the GPU; device peak %s measured, %s predicted%s\n", t1 - t0,
                   h3_budget_str(dres.rep.dev_peak, a, sizeof a),
                   h3_budget_str(dres.rep.dev_predicted, b, sizeof b),
                   dres.rep.dev_held ? "; NOT all given back" : "");
        } else {
            printf("forward: %.3f s on %d threads\n", t1 - t0, ex.threads);
        }
    }
    int bad = 0;
    if (st == H3_OK && expect) {
        h3_st_set ref;
        st = h3_st_open(expect, &ref);
        if (st == H3_OK) {
            st = compare(&ref, "video_velocity", &vout, tol, &bad, quiet);
            if (st == H3_OK) st = compare(&ref, "audio_velocity", &aout, tol, &bad, quiet);
            h3_st_close(&ref);
        }
    }
    /* A failed check is a failed command: -o is removed with the rest (outputs appear only on success). */
    if (st == H3_OK && bad)
        st = H3_ERR(H3_ERR_FORMAT, "the velocities differ from %s by more than %g (%s not written)", expect,
                    tol, output);
    st = h3_cli_run_end(st);
    if (st == H3_OK && !quiet) printf("wrote %s\n", output);
    if (st != H3_OK) {
        h3_cli_fail("dit", st);
        rc = H3_EXIT_FAIL; /* bad weights or inputs: the work failed (usage errors were caught above) */
    }
    h3_st_writer_free(w);
    h3_tensor_free(&vout);
    h3_tensor_free(&aout);
    h3_dit_inputs_file_free(&in);
    h3_dit_close(dit);
    h3_lora_free(&lora);
    h3_cli_loras_free(&loras);
    h3_free(plan);
    if (ex.cuda) h3_cuda_shutdown(&ex);
    h3_exec_free(&ex);
    return rc;
}

/* h3run quantize: int8 (with or without ConvRot), fp8 and 4-bit versions of a DiT or text encoder in
 * ComfyUI's format, and the error table of every format. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "mem/budget.h"
#include "quant/qwrite.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Host bytes the error table takes beyond the f32 weights it reads, for `rows` activation rows: for each
 * layer its input, two outputs and a quantized copy (at most 2 bytes an element); for the block, its
 * activations (qbench.c's block_forward and the five [rows, H] buffers around it) and the quantized copies of
 * its four linears. An upper bound: the table is refused when it exceeds the host memory available. */
static double table_bytes(const h3_qbench_layer *layers, int n_layers, const h3_qbench_block *b,
                          int64_t rows) {
    double need = 0, R = (double)rows;
    for (int i = 0; i < n_layers; i++) {
        double n = (double)layers[i].n, k = (double)layers[i].k, one = R * (k + 2 * n) * 4 + n * k * 2;
        if (one > need) need = one;
    }
    if (b) {
        double H = (double)b->hidden, I = (double)b->heads * (double)b->head_dim, F = (double)b->ffn;
        double one = R * (8 * H + 7 * I + 3 * F) * 4 + (4 * I * H + 3 * F * H) * 2;
        if (one > need) need = one;
    }
    return need;
}

/* The table of `weights` bytes of f32 weights and `table` bytes more must fit the host memory available
 * (h3_budget_default_ram: what can be taken without swapping); unknown memory is not checked. */
static h3_status check_host_memory(double weights, double table, int64_t rows) {
    const int64_t avail = h3_budget_default_ram();
    if (avail <= 0 || weights + table <= (double)avail) return H3_OK;
    char a[32], b[32], c[32], d[32];
    return H3_ERR(
        H3_ERR_INVALID,
        "the error table needs about %s (%s of f32 weights and %s for %lld activation rows); this machine "
        "can spare %s (80%% of its available memory): lower --rows%s",
        h3_fmt_bytes(weights + table, a, sizeof a), h3_fmt_bytes(weights, b, sizeof b),
        h3_fmt_bytes(table, c, sizeof c), (long long)rows, h3_fmt_bytes((double)avail, d, sizeof d),
        weights > 0 ? " or the --random-dit widths" : "");
}

static h3_status run_table(h3_exec *ex, const h3_qbench_source *src, int64_t rows, uint64_t seed) {
    H3_TRY(check_host_memory(
        0, table_bytes(src->layers, src->n_layers, src->has_block ? &src->block : NULL, rows), rows));
    h3_qbench_result r;
    double t0 = now_s();
    H3_TRY(
        h3_qbench_run(ex, src->layers, src->n_layers, src->has_block ? &src->block : NULL, rows, seed, &r));
    printf("\n");
    h3_qbench_print(stdout, src, &r);
    printf("(%lld activation rows, seed %llu, %.1f s)\n", (long long)rows, (unsigned long long)seed,
           now_s() - t0);
    return H3_OK;
}

int h3_cmd_quantize(int argc, char **argv) {
    const char *format = NULL;
    int no_table = 0, table_only = 0, random_dit = 0, quiet = 0;
    int64_t te_layers = 0, rows = 64, seed = 1, threads = 0;
    int64_t hidden = 5376, heads = 56, head_dim = 128, ffn = 14336;
    const h3_cli_opt opts[] = {
        {"format", 'f', H3_OPT_STR, &format, "FORMAT",
         "int8, int8_convrot, fp8 or nvfp4; default: int8_convrot for a DiT, nvfp4 for a text encoder", 0, 0},
        {"te-layers", 0, H3_OPT_INT, &te_layers, "N",
         "text encoder: decoder layers to keep (default 50, the hidden state H3 reads)", 1, 1 << 20},
        {"no-table", 0, H3_OPT_FLAG, &no_table, NULL, "write the file without the error table", 0, 0},
        {"table", 0, H3_OPT_FLAG, &table_only, NULL, "print the error table of IN only (no OUT)", 0, 0},
        {"random-dit", 0, H3_OPT_FLAG, &random_dit, NULL,
         "print the error table of a DiT block with random weights of the release's shapes (no IN, no OUT)",
         0, 0},
        {"hidden", 0, H3_OPT_INT, &hidden, "H", "--random-dit: hidden size (default 5376)", 1, 1 << 16},
        {"heads", 0, H3_OPT_INT, &heads, "A", "--random-dit: attention heads (default 56)", 1, 1 << 17},
        {"head-dim", 0, H3_OPT_INT, &head_dim, "D", "--random-dit: head dim (default 128)", 1, 1 << 17},
        {"ffn", 0, H3_OPT_INT, &ffn, "F", "--random-dit: FFN width (default 14336)", 1, 1 << 17},
        {"rows", 0, H3_OPT_INT, &rows, "M", "activation rows of the error table (default 64)", 1, 1 << 20},
        {"seed", 0, H3_OPT_INT, &seed, "S", "seed of the table's random activations and weights (default 1)",
         0, 0},
        {"threads", 't', H3_OPT_INT, &threads, "N", "CPU threads (default 0: one per CPU)", 0,
         H3_MAX_THREADS},
        {"quiet", 'q', H3_OPT_FLAG, &quiet, NULL, "print only errors on stderr", 0, 0},
        {0},
    };
    const h3_cli_cmd cmd = {
        "quantize",
        "quantize IN OUT [--format F] | quantize --table IN | quantize --random-dit",
        "Write an int8 (optionally ConvRot-rotated), fp8 or nvfp4 version of a MiniMax-H3 DiT or Qwen3-VL "
        "text\n"
        "encoder (official, diffusers or ComfyUI bf16 weights) as one .safetensors file in ComfyUI's format, "
        "which\n"
        "ComfyUI and h3run read, and print the relative error of every format on random activations: each\n"
        "quantized linear of block 0, and (DiT) block 0's output.",
        "The table's columns: weights in a format with f32 activations (what h3run's CPU path and ComfyUI's "
        "text\n"
        "encoders compute), and with the activation quantization ComfyUI's DiT path adds on GPUs: int8 per "
        "token\n"
        "after the ConvRot rotation (W8A8), fp8 activations, nvfp4 activations (W4A4).\n\n"
        "examples:\n  h3run quantize FL2VA/transformer minimax_h3_fl2va_int8_convrot.safetensors\n"
        "  h3run quantize FL2VA/text_encoder qwen3vl_32b_minimax_h3_nvfp4.safetensors\n"
        "  h3run quantize --random-dit --rows 64",
        opts,
        0,
        2};
    const char *pos[2] = {NULL, NULL};
    int npos;
    int r = h3_cli_parse(&cmd, argc, argv, pos, &npos);
    if (r) return r < 0 ? H3_EXIT_OK : r;
    h3_cli_setup_logging(quiet ? -1 : 0);
    h3_qtarget target = H3_QT_DEFAULT;
    if (format && !h3_qtarget_parse(format, &target)) {
        fprintf(stderr, "h3run quantize: --format must be int8, int8_convrot, fp8 or nvfp4; got '%s'\n",
                format);
        return H3_EXIT_USAGE;
    }
    if (random_dit + table_only > 1 || (random_dit && npos) || (table_only && npos != 1) ||
        (!random_dit && !table_only && npos != 2)) {
        fprintf(stderr, "h3run quantize: give IN and OUT, or --table IN, or --random-dit (see --help)\n");
        return H3_EXIT_USAGE;
    }
    if (seed < 0 || heads * head_dim > (1 << 17)) {
        fprintf(stderr,
                "h3run quantize: --seed must not be negative; --heads x --head-dim must be at most 131072\n");
        return H3_EXIT_USAGE;
    }
    const h3_cli_path paths[] = {
        {"IN", random_dit ? NULL : pos[0], H3_CLI_IN},
        {"OUT", random_dit || table_only ? NULL : pos[1], H3_CLI_OUT_FILE},
    };
    r = h3_cli_check_paths("quantize", paths, 2);
    if (r) return r;
    h3_status st = H3_OK;
    if (random_dit) { /* the block's f32 weights and the table must fit before anything is allocated */
        const double H = (double)hidden, I = (double)(heads * head_dim), F = (double)ffn;
        const h3_qbench_layer L[4] = {{"", NULL, 3 * heads * head_dim, hidden},
                                      {"", NULL, hidden, heads * head_dim},
                                      {"", NULL, 2 * ffn, hidden},
                                      {"", NULL, hidden, ffn}};
        const h3_qbench_block b = {.hidden = hidden, .heads = heads, .head_dim = head_dim, .ffn = ffn};
        st = check_host_memory((4 * I * H + 3 * F * H) * 4, table_bytes(L, 4, &b, rows), rows);
        if (st != H3_OK) return h3_cli_fail("quantize", st);
    }
    h3_exec ex;
    st = h3_exec_init(&ex, (int)threads);
    if (st != H3_OK) return h3_cli_fail("quantize", st);
    h3_cli_run_begin();
    h3_qbench_source src;
    memset(&src, 0, sizeof src);
    if (random_dit) {
        st = h3_qbench_source_random(hidden, heads, head_dim, ffn, (uint64_t)seed, &src);
        if (st == H3_OK) {
            if (!quiet)
                printf("random DiT block: hidden %lld, %lld heads x %lld, FFN %lld (weights N(0, 1/K) in "
                       "bf16)\n",
                       (long long)hidden, (long long)heads, (long long)head_dim, (long long)ffn);
            st = run_table(&ex, &src, rows, (uint64_t)seed);
        }
    } else if (table_only) {
        st = h3_qbench_source_load(pos[0], &src);
        if (st == H3_OK) st = run_table(&ex, &src, rows, (uint64_t)seed);
    } else {
        h3_quantize_opts o = {target, (int)te_layers, ex.pool};
        h3_quantize_result res;
        double t0 = now_s();
        st = h3_quantize_checkpoint(pos[0], pos[1], &o, &res);
        if (st == H3_OK && !quiet) {
            char a[32], b[32], c[32], d[32];
            printf("%s (%s layout) -> %s: %s, %lld tensors, %lld layers quantized%s, %s data bytes (%s; read "
                   "%s) "
                   "in %.1f s\n",
                   h3_component_name(res.comp), h3_layout_name(res.in_layout), pos[1],
                   h3_qtarget_name(res.target), (long long)res.n_tensors, (long long)res.n_quantized,
                   res.n_kept ? " (some linears kept: their widths suit no rule of the format)" : "",
                   h3_fmt_int(res.out_bytes, a, sizeof a), h3_fmt_bytes((double)res.out_bytes, b, sizeof b),
                   h3_fmt_bytes((double)res.in_bytes, c, sizeof c), now_s() - t0);
            (void)d;
        }
        if (st == H3_OK && !no_table) {
            st = h3_qbench_source_load(pos[0], &src);
            if (st == H3_OK) st = run_table(&ex, &src, rows, (uint64_t)seed);
        }
    }
    h3_qbench_source_free(&src);
    h3_exec_free(&ex);
    st =
        h3_cli_run_end(st); /* OUT appears only when the whole command, its error table included, succeeded */
    if (st != H3_OK) return h3_cli_fail("quantize", st);
    return H3_EXIT_OK;
}

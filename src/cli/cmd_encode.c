/* h3run encode: a prompt through the tokenizer and the text encoder, to H3's conditioning
 * (hidden_states[50]), for debugging, for comparing with other implementations, and for the pipeline. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "cli/cli.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "mem/budget.h"
#include "cuda/cuda.h"
#include "models/text_encoder.h"
#include "models/vision.h"
#include "pipeline/media.h"
#include "pipeline/request.h"
#include "pipeline/stages.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "1,2, 3" -> ids (h3_malloc). Returns 0 on success; prints the problem and returns H3_EXIT_USAGE otherwise.
 */
static int parse_ids(const char *s, int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    size_t cap = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr,
                    "h3run encode: --token-ids takes comma-separated ids in [0, 2^31), e.g. 64,8251,220; "
                    "got '%s'\n",
                    s);
            h3_free(*ids);
            *ids = NULL;
            return H3_EXIT_USAGE;
        }
        if ((size_t)*n == cap) {
            cap = cap ? 2 * cap : 64;
            int32_t *q = h3_realloc(*ids, cap * sizeof *q, H3_MEM_IO);
            if (!q) {
                fprintf(stderr, "h3run encode: out of memory\n");
                h3_free(*ids);
                *ids = NULL;
                return H3_EXIT_FAIL;
            }
            *ids = q;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p == 0) return 0;
        if (*p != ',') {
            fprintf(stderr,
                    "h3run encode: --token-ids takes comma-separated ids, e.g. 64,8251,220; got '%s'\n", s);
            h3_free(*ids);
            *ids = NULL;
            return H3_EXIT_USAGE;
        }
        p++;
    }
}

/* Relative L2 and max |diff| / max |ref| of out against tensor `name` of file; prints one line; *bad when
 * above. */
static h3_status compare(const char *file, const char *name, const h3_tensor *out, double tol, int *bad) {
    h3_st_set s;
    H3_TRY(h3_st_open(file, &s));
    h3_tensor r = {0};
    h3_status st = h3_st_load(&s, name, H3_PLACE_HOST, H3_F32, H3_MEM_IO, &r);
    if (st == H3_OK && h3_tensor_numel(&r) != h3_tensor_numel(out)) {
        char a[64], b[64];
        st = H3_ERR(H3_ERR_FORMAT, "%s: '%s' is %s, the output %s", file, name,
                    h3_tensor_shape_str(&r, a, sizeof a), h3_tensor_shape_str(out, b, sizeof b));
    }
    if (st == H3_OK) {
        double num = 0, den = 0, mx = 0, mref = 0;
        const float *x = out->data, *y = r.data;
        for (int64_t i = 0; i < h3_tensor_numel(&r); i++) {
            double d = (double)x[i] - (double)y[i];
            num += d * d;
            den += (double)y[i] * y[i];
            if (!(fabs(d) <= mx)) mx = fabs(d);
            if (fabs((double)y[i]) > mref) mref = fabs((double)y[i]);
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num), rmax = mref > 0 ? mx / mref : mx;
        int ok = rel <= tol && rmax <= tol;
        if (!ok) *bad = 1;
        printf("compare %s: relative L2 %.3e, max |diff| / max |ref| %.3e (tolerance %.1e)%s\n", name, rel,
               rmax, tol, ok ? "" : "  FAIL");
    }
    h3_tensor_free(&r);
    h3_st_close(&s);
    return st;
}

/* The images of --image (comma-separated) through the processor: pixel_values rows of every image in order
 * and one grid row each. */
static h3_status process_images(const h3_vis_config *vc, const char *list, h3_tensor *pixels, int64_t **grid,
                                int *n_img) {
    h3_status st = H3_OK;
    char *copy = h3_strdup(list), *save = NULL;
    h3_tensor *parts = NULL;
    int n = 0, cap = 0;
    int64_t rows = 0;
    memset(pixels, 0, sizeof *pixels);
    *grid = NULL;
    *n_img = 0;
    if (!copy) return H3_ERR_NOMEM;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            h3_tensor *np = h3_realloc(parts, (size_t)cap * sizeof *np, H3_MEM_IO);
            if (np) parts = np;
            int64_t *ng = h3_realloc(*grid, (size_t)cap * 3 * sizeof *ng, H3_MEM_IO);
            if (ng) *grid = ng;
            if (!np || !ng) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        }
        uint8_t *rgb = NULL;
        int w, h;
        H3_CHECK(h3_image_read(tok, H3_IMAGE_MAX_PIXELS, &rgb, &w, &h));
        st = h3_vis_preprocess(vc, rgb, w, h, &parts[n], *grid + 3 * n);
        h3_free(rgb);
        if (st != H3_OK) {
            st = h3_error_wrap(st, "%s", tok);
            goto done;
        }
        rows += parts[n].shape[0];
        n++;
    }
    if (n == 0) H3_FAIL(H3_ERR_INVALID, "--image names no file");
    H3_CHECK(h3_tensor_alloc2(pixels, H3_PLACE_HOST, H3_F32, rows, parts[0].shape[1], H3_MEM_IO));
    for (int i = 0, r = 0; i < n; r += (int)parts[i].shape[0], i++)
        memcpy((float *)pixels->data + (int64_t)r * parts[0].shape[1], parts[i].data,
               h3_tensor_nbytes(&parts[i]));
    *n_img = n;
done:
    for (int i = 0; i < n; i++) h3_tensor_free(&parts[i]);
    h3_free(parts);
    h3_free(copy);
    if (st != H3_OK) {
        h3_tensor_free(pixels);
        h3_free(*grid);
        *grid = NULL;
    }
    return st;
}

/* --vision FILE: pixel_values (any float dtype, read as f32) and image_grid_thw (i64 or i32 [n, 3]). */
static h3_status load_vision(const char *path, h3_tensor *pixels, int64_t **grid, int *n_img) {
    h3_st_set s;
    memset(pixels, 0, sizeof *pixels);
    *grid = NULL;
    H3_TRY(h3_st_open(path, &s));
    h3_status st = H3_OK;
    const h3_st_entry *g = h3_st_find(&s, "image_grid_thw"), *p = h3_st_find(&s, "pixel_values");
    if (!g || !p)
        H3_FAIL(H3_ERR_FORMAT,
                "%s needs 'pixel_values' and 'image_grid_thw' (what transformers' Qwen3-VL processor "
                "returns); it lacks '%s'",
                path, !p ? "pixel_values" : "image_grid_thw");
    if ((g->dtype != H3_I64 && g->dtype != H3_I32) || g->ndim != 2 || g->shape[1] != 3 || g->shape[0] < 1 ||
        g->shape[0] > 4096)
        H3_FAIL(H3_ERR_FORMAT, "%s: 'image_grid_thw' must be i64 or i32 [images, 3] (1 to 4096 images)",
                path);
    if (p->ndim != 2) H3_FAIL(H3_ERR_FORMAT, "%s: 'pixel_values' must be [patches, values]", path);
    {
        const void *b;
        H3_CHECK(h3_st_bytes(&s, g, &b));
        *n_img = (int)g->shape[0];
        *grid = h3_malloc((size_t)*n_img * 3 * sizeof **grid, H3_MEM_IO);
        if (!*grid) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        for (int i = 0; i < 3 * *n_img; i++) {
            if (g->dtype == H3_I64) {
                int64_t v;
                memcpy(&v, (const char *)b + 8 * i, 8);
                (*grid)[i] = v;
            } else {
                int32_t v;
                memcpy(&v, (const char *)b + 4 * i, 4);
                (*grid)[i] = v;
            }
        }
    }
    H3_CHECK(h3_st_load(&s, "pixel_values", H3_PLACE_HOST, H3_F32, H3_MEM_IO, pixels));
done:
    h3_st_close(&s);
    if (st != H3_OK) {
        h3_free(*grid);
        *grid = NULL;
        h3_tensor_free(pixels);
    }
    return st;
}

int h3_cmd_encode(int argc, char **argv) {
    const char *model = NULL, *tok_path = NULL, *te_path = NULL, *config = NULL, *prompt = NULL,
               *prompt_file = NULL, *token_ids = NULL, *out_path = NULL, *expect = NULL, *device = "cpu",
               *vram_s = NULL, *vision = NULL, *image = NULL, *vision_out = NULL;
    int show_ids = 0, quiet = 0, verbose = 0;
    int64_t layer = H3_TE_LAYER, threads = 0;
    double tol = 1e-4;
    const h3_cli_opt opts[] = {
        {"model", 'm', H3_OPT_STR, &model, "DIR",
         "model folder: tokenizer/tokenizer.json (or tokenizer.json) and text_encoder/ (official or ComfyUI "
         "names)",
         0, 0},
        {"prompt", 'p', H3_OPT_TEXT, &prompt, "TEXT", "the prompt (UTF-8)", 0, 0},
        {"prompt-file", 0, H3_OPT_STR, &prompt_file, "FILE", "read the prompt from FILE (all of it, as is)",
         0, 0},
        {"token-ids", 0, H3_OPT_STR, &token_ids, "1,2,3",
         "encode these ids instead of a prompt (no tokenizer)", 0, 0},
        {"ids", 0, H3_OPT_FLAG, &show_ids, NULL,
         "print the token ids; without --out only the tokenizer is needed", 0, 0},
        {"out", 'o', H3_OPT_STR, &out_path, "FILE",
         "write the conditioning to FILE (.safetensors): hidden [L, hidden] f32 and input_ids [L] i32", 0, 0},
        {"layer", 'l', H3_OPT_INT, &layer, "N",
         "which hidden state: 0 = embeddings, N = after N layers (default 50; the model's last: after its "
         "final norm)",
         0, 1 << 20},
        {"tokenizer", 0, H3_OPT_STR, &tok_path, "PATH", "tokenizer.json or its folder (default: --model)", 0,
         0},
        {"text-encoder", 0, H3_OPT_STR, &te_path, "PATH",
         "text-encoder weights: a file, shard index or folder (default: --model)", 0, 0},
        {"config", 0, H3_OPT_STR, &config, "FILE", "config.json to use instead of the one beside the weights",
         0, 0},
        {"expect", 0, H3_OPT_STR, &expect, "FILE[:TENSOR]",
         "compare the hidden state with TENSOR (default 'hidden') of FILE; fail above --tol", 0, 0},
        {"tol", 0, H3_OPT_FLOAT, &tol, "X", "tolerance of --expect, relative (default 1e-4)", 0, 1e6},
        {"threads", 't', H3_OPT_INT, &threads, "N", "CPU threads (default 0: one per CPU)", 0,
         H3_MAX_THREADS},
        {"device", 0, H3_OPT_STR, &device, "NAME",
         "cpu (default), cuda, or auto (cuda when a GPU is present): where the text encoder runs; on the GPU "
         "its "
         "layers stream from the file through two slots (bf16 activations), as generate runs it",
         0, 0},
        {"vram-budget", 0, H3_OPT_STR, &vram_s, "SIZE",
         "with --device cuda or auto: every byte the encode may take on the GPU, e.g. 8GiB (default: the "
         "free "
         "memory less 512 MiB); auto runs on the CPU when that cannot hold it",
         0, 0},
        {"vision", 0, H3_OPT_STR, &vision, "FILE",
         "images for the prompt: FILE (.safetensors) holds pixel_values and image_grid_thw as transformers' "
         "Qwen3-VL processor returns them; the ids hold the expanded image tokens",
         0, 0},
        {"image", 0, H3_OPT_STR, &image, "IMG[,IMG...]",
         "images for the prompt, read (PNG, JPEG, WebP, ...) and processed as Qwen3-VL's processor does", 0,
         0},
        {"vision-out", 0, H3_OPT_STR, &vision_out, "FILE",
         "write the processed --image to FILE: pixel_values f32 and image_grid_thw i64 (alone: no encode)", 0,
         0},
        {"quiet", 'q', H3_OPT_FLAG, &quiet, NULL, "print only errors on stderr", 0, 0},
        {"verbose", 'v', H3_OPT_FLAG, &verbose, NULL, "log more", 0, 0},
        {0},
    };
    const h3_cli_cmd cmd = {
        "encode",
        "encode --model DIR (--prompt TEXT | --prompt-file FILE | --token-ids 1,2,3) [--ids] [--out FILE]",
        "Tokenize a prompt as H3 does (Qwen2 byte-level BPE with H3's added tokens, no special tokens, no "
        "chat\n"
        "template) and run the Qwen3-VL text encoder to hidden_states[--layer]: the un-normalized output of "
        "that many\n"
        "decoder layers (H3 uses 50), as transformers' hidden_states[N]; for the model's last layer that is "
        "after the\n"
        "final norm (a file holding every layer but not the norm is refused there; a repack truncated to N "
        "layers\n"
        "gives them un-normalized). Only the prompt's embedding rows, the layers below --layer and (for the "
        "last)\n"
        "the final norm are read.\n"
        "Prints the token count (and the ids with --ids); --out writes the conditioning for the pipeline.\n"
        "A prompt is at most 1 MiB and, to be encoded, 8192 tokens (fewer when the text encoder's config has "
        "fewer\n"
        "positions): a longer one is refused (exit 2) before the text encoder's activations are allocated.\n"
        "Images (--vision or --image): Qwen3-VL's vision tower (from the text encoder's files) turns them "
        "into the\n"
        "image-token rows, its DeepStack features are added after the first layers and the rows take 3-D "
        "rotary\n"
        "positions, as transformers' Qwen3VLForConditionalGeneration; --image with --vision-out alone only "
        "runs\n"
        "the image processor.",
        "examples:\n  h3run encode -m MiniMax-H3/FL2VA --prompt 'a cat <d> walking' --ids\n"
        "  h3run encode -m MiniMax-H3/FL2VA --prompt-file prompt.txt -o cond.safetensors\n"
        "  h3run encode --tokenizer tokenizer.json --text-encoder "
        "ComfyUI/models/text_encoders/qwen3vl_32b.safetensors "
        "\\\n      --prompt 'integrated_multimodal_description: [Shot 1] ...' -o cond.safetensors\n"
        "  h3run encode --text-encoder tests/fixtures/text_encoder/official --token-ids 3,1,4 --layer 4\n"
        "  h3run encode --image a.png,b.jpg --vision-out pixels.safetensors\n"
        "  h3run encode --text-encoder TE --token-ids IDS --vision pixels.safetensors --layer 2 -o "
        "h.safetensors",
        opts,
        0,
        0};
    const char *pos[1];
    int npos;
    int r = h3_cli_parse(&cmd, argc, argv, pos, &npos);
    if (r) return r < 0 ? H3_EXIT_OK : r;
    int n_sources = (prompt != NULL) + (prompt_file != NULL) + (token_ids != NULL);
    if (vision && image) {
        fprintf(stderr, "h3run encode: give --vision or --image, not both\n");
        return H3_EXIT_USAGE;
    }
    if (vision_out && !image) {
        fprintf(stderr, "h3run encode: --vision-out writes the processed --image; give --image IMG\n");
        return H3_EXIT_USAGE;
    }
    const int proc_only = image && vision_out && n_sources == 0;
    if (n_sources != 1 && !proc_only) {
        fprintf(stderr,
                "h3run encode: give exactly one of --prompt, --prompt-file and --token-ids (see --help)\n");
        return H3_EXIT_USAGE;
    }
    if (!tok_path) tok_path = model;
    if (!te_path) te_path = model;
    int need_te = !proc_only && (out_path || expect || !show_ids);
    if (!proc_only && !token_ids && !tok_path) {
        fprintf(stderr, "h3run encode: --model (or --tokenizer) is needed to tokenize a prompt\n");
        return H3_EXIT_USAGE;
    }
    if (need_te && !te_path) {
        fprintf(
            stderr,
            "h3run encode: --model (or --text-encoder) is needed to encode; --ids alone only tokenizes\n");
        return H3_EXIT_USAGE;
    }
    h3_cli_setup_logging(quiet ? -1 : verbose);
    h3_cli_device dev;
    r = h3_cli_device_resolve("encode", device, vram_s, 0, &dev);
    if (r) return r;
    /* --expect FILE[:TENSOR]: a colon splits off the tensor name unless the whole argument names a file. */
    char *exp_file = NULL;
    const char *exp_name = "hidden";
    if (expect) {
        exp_file = h3_strdup(expect);
        if (!exp_file) return h3_cli_fail("encode", H3_ERR_NOMEM);
        char *colon = strrchr(exp_file, ':');
        if (colon && !h3_path_exists(exp_file)) {
            *colon = 0;
            exp_name = colon + 1;
        }
    }
    const h3_cli_path paths[] = {
        {"--model", model, H3_CLI_IN},
        {"--tokenizer", token_ids ? NULL : tok_path, H3_CLI_IN},
        {"--text-encoder", need_te ? te_path : NULL, H3_CLI_IN},
        {"--config", config, H3_CLI_IN_FILE},
        {"--prompt-file", prompt_file, H3_CLI_IN_FILE},
        {"--expect", exp_file, H3_CLI_IN},
        {"--out", out_path, H3_CLI_OUT_FILE},
        {"--vision", vision, H3_CLI_IN_FILE},
        {"--vision-out", vision_out, H3_CLI_OUT_FILE},
    };
    r = h3_cli_check_paths("encode", paths, 9);
    if (r) {
        h3_free(exp_file);
        return r;
    }

    int rc = H3_EXIT_OK;
    h3_status st = H3_OK;
    h3_tokenizer *tok = NULL;
    h3_text_encoder *te = NULL;
    h3_exec ex = {0};
    int have_ex = 0;
    h3_tensor hidden = {0};
    h3_st_writer *w = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    h3_vision *vis = NULL;
    h3_tensor pixels = {0};
    int64_t *grid = NULL;
    int n_img = 0;
    char *text = NULL;
    size_t text_len = 0;
    h3_cli_run_begin();
    if (proc_only) { /* the image processor alone: Qwen3-VL's settings, or those of --text-encoder's config */
        h3_vis_config vc;
        h3_vis_config_default(&vc);
        if (te_path) {
            h3_te_open_opts o0 = {config, H3_PLACE_HOST, 0, NULL, NULL};
            st = h3_text_encoder_open(te_path, &o0, &te);
            if (st == H3_OK) st = h3_vision_open(te, config, &vis);
            if (st != H3_OK) goto fail;
            vc = *h3_vision_config(vis);
        }
        st = process_images(&vc, image, &pixels, &grid, &n_img);
        if (st != H3_OK) goto fail;
        const int64_t gs[2] = {n_img, 3};
        st = h3_st_writer_new(&w);
        if (st == H3_OK) st = h3_st_writer_add_tensor(w, "pixel_values", &pixels);
        if (st == H3_OK) st = h3_st_writer_add(w, "image_grid_thw", H3_I64, 2, gs, grid);
        if (st == H3_OK) st = h3_st_writer_meta(w, "format", "pt");
        if (st == H3_OK) st = h3_st_writer_write(w, vision_out, 0);
        if (st != H3_OK) goto fail;
        if (!quiet)
            for (int i = 0; i < n_img; i++)
                printf("image %d: grid [%lld, %lld, %lld], %lld image tokens\n", i, (long long)grid[3 * i],
                       (long long)grid[3 * i + 1], (long long)grid[3 * i + 2],
                       (long long)(grid[3 * i] * grid[3 * i + 1] * grid[3 * i + 2] / (vc.merge * vc.merge)));
        goto done;
    }
    /* ---- tokens */
    if (token_ids) {
        rc = parse_ids(token_ids, &ids, &n);
        if (rc) goto done;
    } else {
        double t0 = now_s();
        st = h3_tokenizer_load(tok_path, &tok);
        if (st != H3_OK) goto fail;
        double t1 = now_s();
        if (prompt_file) {
            st = h3_cli_read_prompt(prompt_file, &text, &text_len);
            if (st != H3_OK) goto fail;
            st = h3_tokenizer_encode_n(tok, text, text_len, &ids, &n);
        } else {
            st = h3_request_check_prompt_bytes(strlen(prompt));
            if (st != H3_OK) goto fail;
            st = h3_tokenizer_encode(tok, prompt, &ids, &n);
        }
        if (st != H3_OK) goto fail;
        double t2 = now_s();
        if (verbose)
            fprintf(stderr, "tokenizer: loaded in %.0f ms, encoded in %.2f ms\n", (t1 - t0) * 1e3,
                    (t2 - t1) * 1e3);
    }
    if (!quiet) printf("tokens: %lld\n", (long long)n);
    if (show_ids) {
        printf("ids:");
        for (int64_t i = 0; i < n; i++) printf("%s%d", i ? "," : " ", ids[i]);
        printf("\n");
    }
    if (!need_te) goto done;

    /* ---- hidden states */
    if (n == 0) {
        if (!tok) {
            st = H3_ERR(H3_ERR_INVALID,
                        "the prompt has no tokens and there is no tokenizer to give <|endoftext|>");
            goto fail;
        }
        h3_free(ids);
        st = h3_tokenizer_empty_prompt(tok, &ids, &n);
        if (st != H3_OK) goto fail;
        if (!quiet) printf("the empty prompt is encoded as <|endoftext|> (%d)\n", ids[0]);
    }
    h3_te_open_opts oo = {config, H3_PLACE_HOST, 0, NULL, NULL};
    st = h3_exec_init(&ex, (int)threads);
    if (st != H3_OK) goto fail;
    have_ex = 1;
    double t0 = now_s();
    st = h3_text_encoder_open(te_path, &oo, &te);
    if (st != H3_OK) goto fail;
    const h3_te_config *c = h3_text_encoder_config(te);
    if (verbose) fprintf(stderr, "%s\n", h3_text_encoder_describe(te));
    if (vision || image) {
        st = h3_vision_open(te, config, &vis);
        if (st != H3_OK) goto fail;
        if (verbose) fprintf(stderr, "%s\n", h3_vision_describe(vis));
        st = vision ? load_vision(vision, &pixels, &grid, &n_img)
                    : process_images(h3_vision_config(vis), image, &pixels, &grid, &n_img);
        if (st != H3_OK) goto fail;
    }
    if (layer > c->n_layers) {
        st = H3_ERR(H3_ERR_INVALID, "--layer %lld: %s has %lld decoder layers, so 0..%lld are available",
                    (long long)layer, te_path, (long long)c->n_layers, (long long)c->n_layers);
        goto fail;
    }
    st = h3_request_check_prompt_tokens(n, c->max_positions); /* before the activations are allocated */
    if (st != H3_OK) goto fail;
    /* The stage generate runs: on the GPU when the plan puts it there (its layers streamed through two
     * slots), else on the CPU. */
    h3_stage_plan sp;
    memset(&sp, 0, sizeof sp);
    if (dev.cuda) {
        const h3_plan_budgets b = {.vram = dev.vram, .ram = 0};
        st = h3_plan_text_encoder(te, n, (int)layer, &b, dev.have_fig ? &dev.fig : NULL, &sp);
        if (st == H3_OK && !sp.on_device && dev.required)
            st = h3_cli_device_refused("text encoder", sp.reason);
        if (st != H3_OK) goto fail;
        if (!quiet) {
            char a[32], b2[32];
            if (sp.on_device)
                printf("on the GPU: %s; predicted device peak %s of the %s budget\n", sp.detail,
                       h3_budget_str(sp.dev_peak, a, sizeof a), h3_budget_str(dev.vram, b2, sizeof b2));
            else
                printf("on the CPU: %s\n", sp.reason);
        }
        if (sp.on_device) {
            st = h3_cuda_init(&ex, 0, dev.vram);
            if (st != H3_OK) goto fail;
        }
    }
    double t1 = now_s();
    h3_te_stage ts;
    memset(&ts, 0, sizeof ts);
    ts.path = te_path;
    ts.te = te;
    ts.plan = dev.cuda ? &sp : NULL;
    ts.ids = ids;
    ts.n = n;
    ts.layer = (int)layer;
    ts.vis = vis;
    ts.pixels = &pixels;
    ts.grid = (const int64_t(*)[3])grid;
    ts.n_img = n_img;
    h3_stage_report rep;
    st = h3_stage_text_encoder(&ex, &ts, &hidden, &rep);
    if (st != H3_OK) goto fail;
    double t2 = now_s();
    if (!quiet && rep.on_device) {
        char a[32], b2[32];
        printf("device memory: peak %s measured, %s predicted (the backend's workspace included)%s\n",
               h3_budget_str(rep.dev_peak, a, sizeof a), h3_budget_str(rep.dev_predicted, b2, sizeof b2),
               rep.dev_held ? "; NOT all given back" : "");
    }
    double sum = 0, sq = 0;
    const float *hv = hidden.data;
    int64_t nv = n * c->hidden, nonfinite = 0;
    for (int64_t i = 0; i < nv; i++) {
        if (!isfinite(hv[i])) {
            nonfinite++;
            continue;
        }
        sum += hv[i];
        sq += (double)hv[i] * hv[i];
    }
    double mean = sum / (double)nv, sd = sqrt(fmax(sq / (double)nv - mean * mean, 0));
    if (!quiet)
        printf(
            "hidden_states[%lld]: [%lld, %lld] f32, mean %.6g, std %.6g%s (open %.0f ms, encode %.0f ms)\n",
            (long long)layer, (long long)n, (long long)c->hidden, mean, sd, nonfinite ? ", NOT FINITE" : "",
            (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    if (nonfinite) {
        st =
            H3_ERR(H3_ERR_FORMAT, "%lld values of hidden_states[%lld] are not finite: the weights are broken",
                   (long long)nonfinite, (long long)layer);
        goto fail;
    }
    if (expect) {
        int bad = 0;
        st = compare(exp_file, exp_name, &hidden, tol, &bad);
        if (st != H3_OK) goto fail;
        /* A failed check is a failed command: --out is not written (outputs appear only on success). */
        if (bad) {
            st = H3_ERR(H3_ERR_FORMAT, "hidden_states[%lld] differs from %s by more than %g%s",
                        (long long)layer, expect, tol, out_path ? "; --out not written" : "");
            goto fail;
        }
    }
    if (out_path) {
        char lay[32];
        snprintf(lay, sizeof lay, "%lld", (long long)layer);
        int64_t shape_ids[1] = {n};
        st = h3_st_writer_new(&w);
        if (st == H3_OK) st = h3_st_writer_add_tensor(w, "hidden", &hidden);
        if (st == H3_OK) st = h3_st_writer_add(w, "input_ids", H3_I32, 1, shape_ids, ids);
        if (st == H3_OK) st = h3_st_writer_meta(w, "format", "pt");
        if (st == H3_OK) st = h3_st_writer_meta(w, "h3run", "encode");
        if (st == H3_OK) st = h3_st_writer_meta(w, "layer", lay);
        if (st == H3_OK) st = h3_st_writer_write(w, out_path, 0);
        if (st != H3_OK) goto fail;
    }
fail:
done:
    if (rc == H3_EXIT_OK) {      /* else a usage error was printed already */
        st = h3_cli_run_end(st); /* --out appears now, or not at all */
        if (st != H3_OK)
            rc = h3_cli_fail("encode", st);
        else if (out_path && !quiet)
            printf("wrote %s\n", out_path);
    } else {
        h3_cli_run_end(H3_ERR_INVALID);
    }
    h3_st_writer_free(w);
    h3_tensor_free(&hidden);
    h3_tensor_free(&pixels);
    h3_free(grid);
    h3_vision_close(vis);
    h3_text_encoder_close(te);
    if (ex.cuda) h3_cuda_shutdown(&ex);
    if (have_ex) h3_exec_free(&ex);
    h3_tokenizer_free(tok);
    h3_free(ids);
    h3_free(text);
    h3_free(exp_file);
    return rc;
}

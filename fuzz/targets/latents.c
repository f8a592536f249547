/* Latents files: what `h3run decode --latents` reads (a safetensors file with a tensor 'latents', video
 * [1, C, T, H, W] or audio [channels, C, T]) and what `h3run dit --inputs` reads (the packed sequence as
 * named tensors). The input is a whole file. decode plans it with the reduced model's VAEs and, when it holds
 * at most 2048 values, decodes it to a tensors file (a success may write that output; a failure must leave
 * nothing); the DiT inputs reader reads it for the reduced model's DiT, which then runs on what was read (its
 * input checks: index ranges, the partition of the rows, tags, finite positions). */
#include <string.h>

#include "base/json.h"
#include "cli/cli.h"
#include "fuzz.h"
#include "io/safetensors.h"
#include "models/dit.h"

static h3_dit *g_dit;
static h3_exec g_ex;

static void setup(void) {
    if (g_dit) return;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/transformer", fz_tiny_model());
    if (h3_dit_open(cfg, NULL, &g_dit) != H3_OK || h3_exec_init(&g_ex, 1) != H3_OK) abort();
    fz_keep();
}

static void run_dit(const char *path) {
    h3_dit_inputs_file f;
    if (h3_dit_inputs_read(path, h3_dit_get_config(g_dit), &f) != H3_OK) return;
    const h3_dit_inputs *in = &f.in;
    h3_tensor v = {0}, a = {0};
    const int64_t nv = in->video ? in->video->shape[0] : 0, na = in->audio ? in->audio->shape[0] : 0;
    int ok = in->seq_len <= 4096;
    if (ok && nv) ok = h3_tensor_alloc2(&v, H3_PLACE_HOST, H3_F32, nv, 96, H3_MEM_ACTIVATIONS) == H3_OK;
    if (ok && na) ok = h3_tensor_alloc2(&a, H3_PLACE_HOST, H3_F32, na, 32, H3_MEM_ACTIVATIONS) == H3_OK;
    if (ok) h3_dit_forward(g_dit, &g_ex, in, nv ? &v : NULL, na ? &a : NULL);
    h3_tensor_free(&v);
    h3_tensor_free(&a);
    h3_dit_release_workspace(g_dit);
    h3_dit_release_modulation(g_dit);
    h3_dit_inputs_file_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    const char *path = fz_write("lat.safetensors", data, size);
    /* how many values 'latents' holds; zero-element tensors reach h3_st_load's memcpy(dst, NULL, 0) (F1) */
    h3_st_set s;
    int64_t numel = -1;
    int empty = 0;
    if (h3_st_open(path, &s) == H3_OK) {
        const h3_st_entry *e = h3_st_find(&s, "latents");
        if (e) numel = h3_st_entry_numel(e);
        for (int64_t i = 0; i < s.n_entries; i++) empty |= h3_st_entry_numel(&s.entries[i]) == 0;
        h3_st_close(&s);
    }
    if (empty && fz_open_finding("F1")) {
        fz_end("latents", 0);
        return 0;
    }
    fz_quiet(1);
    char model[4096], out[4096];
    snprintf(model, sizeof model, "%s", fz_tiny_model());
    snprintf(out, sizeof out, "%s", fz_path("decoded.safetensors"));
    char *argv[] = {"--model",   model, "--latents",     (char *)path, "--plan", "-q",
                    "--threads", "1",   "--tensors-out", out,          NULL};
    const int decode = numel >= 0 && numel <= 2048;
    const int rc = h3_cmd_decode(decode ? 10 : 8, argv);
    run_dit(path);
    fz_quiet(0);
    fz_end("latents", rc == 0);
    return 0;
}

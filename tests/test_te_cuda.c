/* The text encoder on the GPU (layers streamed through two device slots, bf16 activations) against the same
 * file on the CPU (f32 activations), on the fixtures in every form h3run reads (official folder, ComfyUI
 * repack, nvfp4 with AWQ, GGUF) and on a full-width file of two Qwen3-VL-32B layers written here.
 *
 * Tolerance: relative L2 of hidden_states[L] <= 3e-2. The weights are the same stored values on both sides;
 * what is left is bf16 activations (the residual stream too, as transformers runs the model) through the
 * layers. The device's arena must hold nothing of the stage after encode returns (components take turns), and
 * the measured peak must stay within h3_text_encoder_device_bytes. Skips without a GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "models/text_encoder.h"
#include "testutil.h"

static h3_exec g_ex;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* hidden_states[layer] of ids on the CPU and on the GPU; returns the relative L2 difference. */
static double both(const char *path, const char *what, const int32_t *ids, int64_t n, int layer, double tol) {
    h3_text_encoder *cpu = NULL, *gpu = NULL;
    h3_te_open_opts go;
    memset(&go, 0, sizeof go);
    go.act_place = H3_PLACE_DEVICE;
    CHECK_OK(h3_text_encoder_open(path, NULL, &cpu));
    CHECK_OK(h3_text_encoder_open(path, &go, &gpu));
    double e = NAN;
    if (cpu && gpu) {
        const int64_t C = h3_text_encoder_config(cpu)->hidden;
        h3_tensor hc, hd, back;
        CHECK_OK(h3_tensor_alloc2(&hc, H3_PLACE_HOST, H3_F32, n, C, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_tensor_alloc2(&back, H3_PLACE_HOST, H3_F32, n, C, H3_MEM_ACTIVATIONS));
        double t0 = now();
        CHECK_OK(h3_text_encoder_encode(cpu, &g_ex, ids, n, layer, &hc));
        double t_cpu = now() - t0;
        int64_t used0, peak, cap;
        h3_cuda_mem_stats(&g_ex, &used0, &peak, &cap);
        h3_cuda_reset_peak(&g_ex);
        CHECK_OK(h3_tensor_alloc2(&hd, H3_PLACE_DEVICE, H3_F32, n, C, H3_MEM_ACTIVATIONS));
        t0 = now();
        CHECK_OK(h3_text_encoder_encode(gpu, &g_ex, ids, n, layer, &hd));
        double t_gpu = now() - t0;
        CHECK_OK(h3_copy(&g_ex, &back, &hd));
        CHECK_OK(h3_exec_sync(&g_ex));
        h3_tensor_free(&hd);
        int64_t used1;
        h3_cuda_mem_stats(&g_ex, &used1, &peak, &cap);
        /* the quantized GEMMs' scratch, once reserved, stays with the backend */
        CHECK(used1 == used0 || used1 == used0 + H3_CUDA_QGEMM_SCRATCH_BYTES,
              "%s: the stage left %lld bytes on the device", what, (long long)(used1 - used0));
        const int64_t need = h3_text_encoder_device_bytes(gpu, n, layer);
        CHECK(peak - used0 <= need, "%s: peak %lld bytes above the stage's %lld", what,
              (long long)(peak - used0), (long long)need);
        double *ref = malloc((size_t)(n * C) * sizeof(double));
        for (int64_t i = 0; i < n * C; i++) ref[i] = ((const float *)hc.data)[i];
        e = EXPECT_CLOSE(what, back.data, ref, (size_t)(n * C), tol);
        free(ref);
        h3_te_stats ts;
        h3_text_encoder_get_stats(gpu, &ts);
        if (ts.read_s > 0)
            printf("  %s: %.3f GB of layers read from the files at %.2f GB/s\n", what, ts.bytes_read / 1e9,
                   ts.bytes_read / 1e9 / ts.read_s);
        printf("  %s, hidden_states[%d] of %lld tokens: relative L2 %.3e (tolerance %.0e); CPU %.3f s, GPU "
               "%.3f s; "
               "device peak %.3f GiB of the %.3f GiB the stage may take\n",
               what, layer, (long long)n, e, tol, t_cpu, t_gpu, (peak - used0) / 1073741824.0,
               need / 1073741824.0);
        h3_tensor_free(&hc);
        h3_tensor_free(&back);
    }
    h3_text_encoder_close(cpu);
    h3_text_encoder_close(gpu);
    return e;
}

static void test_fixtures(void) {
    static const struct {
        const char *rel, *what;
        int layer;
    } cases[] = {
        {"tests/fixtures/text_encoder/official", "official folder", 4},
        {"tests/fixtures/text_encoder/comfy.safetensors", "ComfyUI repack", 4},
        {"tests/fixtures/quant/te_nvfp4_awq.safetensors", "nvfp4 + AWQ", 4},
        {"tests/fixtures/quant/te.gguf", "GGUF (llama.cpp names)", 4},
    };
    int32_t ids[37];
    for (int i = 0; i < 37; i++) ids[i] = (i * 37 + 11) % 256;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char p[1024];
        t_src_path(cases[c].rel, p, sizeof p);
        both(p, cases[c].what, ids, 37, cases[c].layer, 3e-2);
        both(p, cases[c].what, ids, 1, cases[c].layer, 3e-2); /* one token */
        both(p, cases[c].what, ids, 37, 0, 0);                /* the embedding alone: exact */
    }
}

/* hidden_states[n_layers] of a file with the final norm (the repack with a model.norm.weight added): the
 * device applies the norm after the last streamed layer as the CPU does. */
static void test_final_norm(void) {
    char src[1024], path[1024];
    t_src_path("tests/fixtures/text_encoder/comfy.safetensors", src, sizeof src);
    t_tmp_path("te_norm.safetensors", path, sizeof path);
    h3_st_set s;
    h3_st_writer *w = NULL;
    CHECK_OK(h3_st_open(src, &s));
    CHECK_OK(h3_st_writer_new(&w));
    for (int64_t i = 0; i < s.n_entries; i++) {
        const void *d;
        CHECK_OK(h3_st_bytes(&s, &s.entries[i], &d));
        CHECK_OK(h3_st_writer_add(w, s.entries[i].name, s.entries[i].dtype, s.entries[i].ndim,
                                  s.entries[i].shape, d));
    }
    const int64_t C = 64;
    uint16_t norm[64];
    for (int i = 0; i < C; i++) norm[i] = h3_f32_to_bf16((float)t_uniform(0.5, 1.5));
    CHECK_OK(h3_st_writer_add(w, "model.norm.weight", H3_BF16, 1, &C, norm));
    CHECK_OK(h3_st_writer_write(w, path, 0));
    h3_st_writer_free(w);
    h3_st_close(&s);
    int32_t ids[37];
    for (int i = 0; i < 37; i++) ids[i] = (i * 37 + 11) % 256;
    both(path, "final norm (hidden_states[4] of 4 layers)", ids, 37, 4, 3e-2);
    unlink(path);
}

/* Two decoder layers of Qwen3-VL-32B's width (C 5120, 64 + 8 heads of 128, F 25600) with random bf16 weights
 * and a 1,000-row embedding, written to a file: the streamed device path on real sizes (0.9 GiB per layer).
 */
static void test_full_width(void) {
    const int64_t C = 5120, V = 1000;
    h3_st_writer *w = NULL;
    CHECK_OK(h3_st_writer_new(&w));
    if (!w) return;
    struct {
        char name[96];
        int nd;
        int64_t s[2];
        uint16_t *data;
    } t[2 * 11 + 1];
    int nt = 0;
    snprintf(t[nt].name, sizeof t[nt].name, "model.embed_tokens.weight");
    t[nt].nd = 2, t[nt].s[0] = V, t[nt].s[1] = C, nt++;
    static const struct {
        const char *n;
        int nd;
        int64_t a, b;
    } f[] = {{"input_layernorm.weight", 1, 5120, 0},         {"post_attention_layernorm.weight", 1, 5120, 0},
             {"self_attn.q_proj.weight", 2, 64 * 128, 5120}, {"self_attn.k_proj.weight", 2, 8 * 128, 5120},
             {"self_attn.v_proj.weight", 2, 8 * 128, 5120},  {"self_attn.o_proj.weight", 2, 5120, 64 * 128},
             {"self_attn.q_norm.weight", 1, 128, 0},         {"self_attn.k_norm.weight", 1, 128, 0},
             {"mlp.gate_proj.weight", 2, 25600, 5120},       {"mlp.up_proj.weight", 2, 25600, 5120},
             {"mlp.down_proj.weight", 2, 5120, 25600}};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 11; i++) {
            snprintf(t[nt].name, sizeof t[nt].name, "model.layers.%d.%s", l, f[i].n);
            t[nt].nd = f[i].nd, t[nt].s[0] = f[i].a, t[nt].s[1] = f[i].b, nt++;
        }
    for (int i = 0; i < nt; i++) {
        int64_t n = t[i].s[0] * (t[i].nd == 2 ? t[i].s[1] : 1);
        t[i].data = malloc((size_t)n * 2);
        float *tmp = malloc((size_t)n * 4);
        int norm = strstr(t[i].name, "norm") != NULL;
        t_fill_randn(tmp, (size_t)n, norm ? 0.1 : (i == 0 ? 1.0 : 0.02));
        for (int64_t j = 0; j < n; j++) {
            float v = norm ? 1.0f + tmp[j] : tmp[j];
            uint32_t u;
            memcpy(&u, &v, 4);
            t[i].data[j] = (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
        }
        free(tmp);
        CHECK_OK(h3_st_writer_add(w, t[i].name, H3_BF16, t[i].nd, t[i].s, t[i].data));
    }
    char path[1024];
    t_tmp_path("te_full_width.safetensors", path, sizeof path);
    CHECK_OK(h3_st_writer_write(w, path, 0));
    h3_st_writer_free(w);
    for (int i = 0; i < nt; i++) free(t[i].data);
    int32_t *ids = malloc(300 * sizeof *ids);
    for (int i = 0; i < 300; i++) ids[i] = (int32_t)((i * 7919) % V);
    both(path, "full width, 2 layers", ids, 300, 2, 3e-2);
    free(ids);
    unlink(path);
}

int main(int argc, char **argv) {
    if (h3_cuda_device_count() == 0) {
        printf("test_te_cuda: skipped: no CUDA device on this machine\n");
        return 0;
    }
    if (h3_exec_init(&g_ex, 0) != H3_OK || h3_cuda_init(&g_ex, 0, (int64_t)8 << 30) != H3_OK) {
        fprintf(stderr, "init failed: %s\n", h3_last_error());
        return 1;
    }
    static const t_case cases[] = {{"fixtures", test_fixtures},
                                   {"final_norm", test_final_norm},
                                   {"full_width", test_full_width},
                                   {NULL, NULL}};
    int r = t_main("test_te_cuda", cases, argc, argv);
    h3_cuda_shutdown(&g_ex);
    h3_exec_free(&g_ex);
    return r;
}

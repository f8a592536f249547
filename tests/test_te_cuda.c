/* The text encoder on the GPU (layers streamed through two device slots, bf16 activations) against the same
 * file on the CPU (f32 activations), on the fixtures in every form h3run reads (official folder, ComfyUI
 * repack, nvfp4 with AWQ, GGUF) and on a full-width file of two Qwen3-VL-32B layers written here.
 *
 * Tolerance: relative L2 of hidden_states[L] <= 3e-2. The weights are the same stored values on both sides;
 * what is left is bf16 activations (the residual stream too, as transformers runs the model) through the
 * layers. The device's arena must hold nothing of the stage after encode returns (components take turns), and
 * the measured peak must stay within h3_text_encoder_device_bytes. The vision tower (case `vision`): a small
 * bf16 Qwen3-VL written here, its tower and a two-image prompt on the GPU against the CPU, within the same
 * tolerance. Skips without a GPU. */
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "models/text_encoder.h"
#include "models/vision.h"
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

/* ---- the vision tower: a small bf16 Qwen3-VL (official names, config.json) on the GPU against the CPU ----
 */

typedef struct {
    h3_st_writer *w;
    int n;
    void *bufs[256];
} vis_writer;

/* A bf16 tensor of N(0, scale²) + bias values. */
static void vput(vis_writer *vw, const char *name, int nd, const int64_t *s, double scale, double bias) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= s[i];
    uint16_t *b = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) b[i] = h3_f32_to_bf16((float)(bias + scale * t_randn()));
    CHECK_OK(h3_st_writer_add(vw->w, name, H3_BF16, nd, s, b));
    vw->bufs[vw->n++] = b;
}

static void vput2(vis_writer *vw, const char *fmt, int l, int64_t a, int64_t b, double scale, double bias) {
    char n[160];
    snprintf(n, sizeof n, fmt, l);
    const int64_t s[2] = {a, b};
    vput(vw, n, b ? 2 : 1, s, scale, bias);
}

enum {
    XC = 64,
    XL = 2,
    XH = 4,
    XKV = 2,
    XD = 16,
    XF = 96,
    XV = 256,
    YH = 144, /* 2 heads of 72: the release's head size (padded to 128 on the GPU) */
    YHEADS = 2,
    YF = 128,
    YDEPTH = 3
};

static void write_vision_model(const char *dir) {
    char p[600];
    mkdir(dir, 0755);
    vis_writer vw;
    memset(&vw, 0, sizeof vw);
    CHECK_OK(h3_st_writer_new(&vw.w));
    vput2(&vw, "model.language_model.embed_tokens.weight%.0d", 0, XV, XC, 1, 0);
    for (int l = 0; l < XL; l++) {
        vput2(&vw, "model.language_model.layers.%d.input_layernorm.weight", l, XC, 0, 0.1, 1);
        vput2(&vw, "model.language_model.layers.%d.post_attention_layernorm.weight", l, XC, 0, 0.1, 1);
        vput2(&vw, "model.language_model.layers.%d.self_attn.q_proj.weight", l, XH * XD, XC, 0.125, 0);
        vput2(&vw, "model.language_model.layers.%d.self_attn.k_proj.weight", l, XKV * XD, XC, 0.125, 0);
        vput2(&vw, "model.language_model.layers.%d.self_attn.v_proj.weight", l, XKV * XD, XC, 0.125, 0);
        vput2(&vw, "model.language_model.layers.%d.self_attn.o_proj.weight", l, XC, XH * XD, 0.06, 0);
        vput2(&vw, "model.language_model.layers.%d.self_attn.q_norm.weight", l, XD, 0, 0.1, 1);
        vput2(&vw, "model.language_model.layers.%d.self_attn.k_norm.weight", l, XD, 0, 0.1, 1);
        vput2(&vw, "model.language_model.layers.%d.mlp.gate_proj.weight", l, XF, XC, 0.125, 0);
        vput2(&vw, "model.language_model.layers.%d.mlp.up_proj.weight", l, XF, XC, 0.125, 0);
        vput2(&vw, "model.language_model.layers.%d.mlp.down_proj.weight", l, XC, XF, 0.05, 0);
    }
    /* the final norm: hidden_states[XL] of transformers is taken after it */
    vput2(&vw, "model.language_model.norm.weight%.0d", 0, XC, 0, 0.1, 1);
    const int64_t pe[5] = {YH, 3, 2, 16, 16};
    vput(&vw, "model.visual.patch_embed.proj.weight", 5, pe, 1 / sqrt(1536.0), 0);
    vput2(&vw, "model.visual.patch_embed.proj.bias%.0d", 0, YH, 0, 0.1, 0);
    vput2(&vw, "model.visual.pos_embed.weight%.0d", 0, 2304, YH, 0.5, 0);
    for (int l = 0; l < YDEPTH; l++) {
        vput2(&vw, "model.visual.blocks.%d.norm1.weight", l, YH, 0, 0.1, 1);
        vput2(&vw, "model.visual.blocks.%d.norm1.bias", l, YH, 0, 0.1, 0);
        vput2(&vw, "model.visual.blocks.%d.norm2.weight", l, YH, 0, 0.1, 1);
        vput2(&vw, "model.visual.blocks.%d.norm2.bias", l, YH, 0, 0.1, 0);
        vput2(&vw, "model.visual.blocks.%d.attn.qkv.weight", l, 3 * YH, YH, 0.125, 0);
        vput2(&vw, "model.visual.blocks.%d.attn.qkv.bias", l, 3 * YH, 0, 0.1, 0);
        vput2(&vw, "model.visual.blocks.%d.attn.proj.weight", l, YH, YH, 0.06, 0);
        vput2(&vw, "model.visual.blocks.%d.attn.proj.bias", l, YH, 0, 0.1, 0);
        vput2(&vw, "model.visual.blocks.%d.mlp.linear_fc1.weight", l, YF, YH, 0.125, 0);
        vput2(&vw, "model.visual.blocks.%d.mlp.linear_fc1.bias", l, YF, 0, 0.1, 0);
        vput2(&vw, "model.visual.blocks.%d.mlp.linear_fc2.weight", l, YH, YF, 0.05, 0);
        vput2(&vw, "model.visual.blocks.%d.mlp.linear_fc2.bias", l, YH, 0, 0.1, 0);
    }
    for (int k = -1; k < 2; k++) {
        char f[160], pre[96];
        if (k < 0)
            snprintf(pre, sizeof pre, "model.visual.merger.");
        else
            snprintf(pre, sizeof pre, "model.visual.deepstack_merger_list.%d.", k);
        const int64_t nw = k < 0 ? YH : 4 * YH;
        snprintf(f, sizeof f, "%snorm.weight%%.0d", pre);
        vput2(&vw, f, 0, nw, 0, 0.1, 1);
        snprintf(f, sizeof f, "%snorm.bias%%.0d", pre);
        vput2(&vw, f, 0, nw, 0, 0.1, 0);
        snprintf(f, sizeof f, "%slinear_fc1.weight%%.0d", pre);
        vput2(&vw, f, 0, 4 * YH, 4 * YH, 0.06, 0);
        snprintf(f, sizeof f, "%slinear_fc1.bias%%.0d", pre);
        vput2(&vw, f, 0, 4 * YH, 0, 0.1, 0);
        snprintf(f, sizeof f, "%slinear_fc2.weight%%.0d", pre);
        vput2(&vw, f, 0, XC, 4 * YH, 0.06, 0);
        snprintf(f, sizeof f, "%slinear_fc2.bias%%.0d", pre);
        vput2(&vw, f, 0, XC, 0, 0.1, 0);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(h3_st_writer_write(vw.w, p, 0));
    h3_st_writer_free(vw.w);
    for (int i = 0; i < vw.n; i++) free(vw.bufs[i]);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fprintf(
        f,
        "{\"image_token_id\": 250, \"video_token_id\": 253, \"vision_start_token_id\": 251, \"text_config\": "
        "{\"hidden_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
        "\"num_key_value_heads\": "
        "%d, \"head_dim\": %d, \"intermediate_size\": %d, \"vocab_size\": %d, \"rope_theta\": 5000000.0, "
        "\"rope_scaling\": {\"rope_type\": \"default\", \"mrope_section\": [2, 3, 3]}}, \"vision_config\": "
        "{\"depth\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, \"num_heads\": %d, \"patch_size\": "
        "16, "
        "\"temporal_patch_size\": 2, \"spatial_merge_size\": 2, \"out_hidden_size\": %d, "
        "\"num_position_embeddings\": 2304, \"deepstack_visual_indexes\": [0, 1]}}",
        XC, XL, XH, XKV, XD, XF, XV, YDEPTH, YH, YF, YHEADS, XC);
    fclose(f);
}

/* The ViT and a prompt with two images on the GPU (bf16 weights and activations) against the CPU (f32
 * activations): the tower's outputs and hidden_states[1], [2]; the device holds nothing of the tower after it
 * returns and its peak stays within h3_vision_device_bytes. */
static void test_vision(void) {
    char dir[512];
    t_tmp_path("te_cuda_vision", dir, sizeof dir);
    write_vision_model(dir);
    h3_text_encoder *te = NULL;
    h3_vision *vis = NULL;
    CHECK_OK(h3_text_encoder_open(dir, NULL, &te));
    if (te) CHECK_OK(h3_vision_open(te, NULL, &vis));
    if (!vis) {
        h3_text_encoder_close(te);
        return;
    }
    static const int64_t grid[2][3] = {{1, 8, 12}, {1, 6, 6}};
    const int64_t N = 96 + 36, M = N / 4;
    h3_tensor px, ec, ed, dc[2], dd[2];
    CHECK_OK(h3_tensor_alloc2(&px, H3_PLACE_HOST, H3_F32, N, 1536, H3_MEM_OTHER));
    t_fill_uniform(px.data, (size_t)N * 1536, -1, 1);
    h3_tensor *all[] = {&ec, &ed, &dc[0], &dc[1], &dd[0], &dd[1]};
    for (int i = 0; i < 6; i++)
        CHECK_OK(h3_tensor_alloc2(all[i], H3_PLACE_HOST, H3_F32, M, XC, H3_MEM_OTHER));
    CHECK_OK(h3_vision_forward(vis, &g_ex, H3_PLACE_HOST, &px, grid, 2, &ec, dc));
    int64_t used0, peak, cap, used1;
    h3_cuda_mem_stats(&g_ex, &used0, &peak, &cap);
    h3_cuda_reset_peak(&g_ex);
    double t0 = now();
    CHECK_OK(h3_vision_forward(vis, &g_ex, H3_PLACE_DEVICE, &px, grid, 2, &ed, dd));
    const double t_gpu = now() - t0;
    h3_cuda_mem_stats(&g_ex, &used1, &peak, &cap);
    CHECK(used1 == used0, "the vision tower left %lld bytes on the device", (long long)(used1 - used0));
    const int64_t need = h3_vision_device_bytes(vis, grid, 2);
    CHECK(peak - used0 <= need, "vision tower: peak %lld bytes above the %lld predicted",
          (long long)(peak - used0), (long long)need);
    printf("  vision tower, %lld patches: GPU %.3f s, device peak %.2f MiB of %.2f MiB predicted\n",
           (long long)N, t_gpu, (peak - used0) / 1048576.0, need / 1048576.0);
    const h3_tensor *cpu_out[3] = {&ec, &dc[0], &dc[1]}, *gpu_out[3] = {&ed, &dd[0], &dd[1]};
    static const char *const names[3] = {"vision tower: merger (GPU vs CPU)", "vision tower: deepstack 0",
                                         "vision tower: deepstack 1"};
    double *ref = malloc((size_t)(M > 20 ? M : 20) * XC * 8 * sizeof(double));
    for (int k = 0; k < 3; k++) {
        for (int64_t i = 0; i < M * XC; i++) ref[i] = ((const float *)cpu_out[k]->data)[i];
        EXPECT_CLOSE(names[k], gpu_out[k]->data, ref, (size_t)(M * XC), 3e-2);
    }
    /* a prompt with both images through the text encoder, on each side */
    int32_t ids[80];
    int n = 0;
    ids[n++] = 5;
    for (int im = 0; im < 2; im++) {
        ids[n++] = 251;
        for (int64_t k = 0; k < grid[im][1] * grid[im][2] / 4; k++) ids[n++] = 250;
        ids[n++] = 252;
        ids[n++] = 7;
    }
    h3_text_encoder *tg = NULL;
    h3_te_open_opts go;
    memset(&go, 0, sizeof go);
    go.act_place = H3_PLACE_DEVICE;
    CHECK_OK(h3_text_encoder_open(dir, &go, &tg));
    for (int layer = 1; layer <= 2 && tg; layer++) {
        h3_tensor hc, hd, back;
        CHECK_OK(h3_tensor_alloc2(&hc, H3_PLACE_HOST, H3_F32, n, XC, H3_MEM_OTHER));
        CHECK_OK(h3_tensor_alloc2(&back, H3_PLACE_HOST, H3_F32, n, XC, H3_MEM_OTHER));
        CHECK_OK(h3_tensor_alloc2(&hd, H3_PLACE_DEVICE, H3_F32, n, XC, H3_MEM_OTHER));
        CHECK_OK(h3_vision_encode_prompt(vis, te, &g_ex, H3_PLACE_HOST, ids, n, &px, grid, 2, layer, &hc));
        CHECK_OK(h3_vision_encode_prompt(vis, tg, &g_ex, H3_PLACE_DEVICE, ids, n, &px, grid, 2, layer, &hd));
        CHECK_OK(h3_copy(&g_ex, &back, &hd));
        CHECK_OK(h3_exec_sync(&g_ex));
        for (int64_t i = 0; i < n * XC; i++) ref[i] = ((const float *)hc.data)[i];
        char what[80];
        snprintf(what, sizeof what, "two images, hidden_states[%d] (GPU vs CPU)", layer);
        EXPECT_CLOSE(what, back.data, ref, (size_t)(n * XC), 3e-2);
        h3_tensor_free(&hc);
        h3_tensor_free(&hd);
        h3_tensor_free(&back);
    }
    free(ref);
    h3_text_encoder_close(tg);
    for (int i = 0; i < 6; i++) h3_tensor_free(all[i]);
    h3_tensor_free(&px);
    h3_vision_close(vis);
    h3_text_encoder_close(te);
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
                                   {"vision", test_vision},
                                   {NULL, NULL}};
    int r = t_main("test_te_cuda", cases, argc, argv);
    h3_cuda_shutdown(&g_ex);
    h3_exec_free(&g_ex);
    return r;
}

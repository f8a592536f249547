/* The DiT on the GPU (bf16 activations, weights on the device) against the same DiT on the CPU (f32), on the
 * reference fixtures in every layout and on a full-width 2-block model with 1,000+ packed rows.
 *
 * Tolerance: relative L2 error of each output <= 3e-2. The GPU keeps the residual stream, the projections and
 * the attention probabilities in bf16 (8 significant bits, ~2e-3 per rounding) through several blocks; the
 * weights are the same bf16 values on both sides, so what is left is activation rounding. Skips without a GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "models/dit.h"
#include "models/lora.h"
#include "pipeline/layout.h"
#include "quant/qwrite.h"
#include "testutil.h"

static h3_exec g_ex;

static h3_tensor to_dev(const h3_tensor *h) {
    h3_tensor d = {0};
    if (!h || !h->data) return d;
    CHECK_OK(h3_tensor_alloc(&d, H3_PLACE_DEVICE, h->dtype, h->ndim, h->shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_copy(&g_ex, &d, h));
    return d;
}

static void compare_dev(const char *what, const h3_tensor *dev, const h3_tensor *host, double tol) {
    h3_tensor back;
    CHECK_OK(h3_tensor_alloc(&back, H3_PLACE_HOST, H3_F32, host->ndim, host->shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_copy(&g_ex, &back, dev));
    CHECK_OK(h3_exec_sync(&g_ex));
    size_t n = (size_t)h3_tensor_numel(host);
    double *ref = malloc(n * sizeof(double) + 8);
    for (size_t i = 0; i < n; i++) ref[i] = ((float *)host->data)[i];
    const double e = EXPECT_CLOSE(what, back.data, ref, n, tol);
    printf("  %s: relative L2 error %.3e (tolerance %.0e)\n", what, e, tol);
    free(ref);
    h3_tensor_free(&back);
}

/* One forward on each side with the same inputs. */
static void forward_both(const char *what, h3_dit *cpu, h3_dit *gpu, const h3_dit_inputs *in, double tol) {
    const h3_dit_config *c = h3_dit_get_config(cpu);
    int64_t Nv = in->video ? in->video->shape[0] : 0, Na = in->audio ? in->audio->shape[0] : 0;
    h3_tensor vo, ao, dvo = {0}, dao = {0};
    CHECK_OK(h3_tensor_alloc2(&vo, H3_PLACE_HOST, H3_F32, Nv ? Nv : 1, h3_dit_video_dim(c), H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc2(&ao, H3_PLACE_HOST, H3_F32, Na ? Na : 1, c->audio_dim, H3_MEM_ACTIVATIONS));
    vo.shape[0] = Nv;
    ao.shape[0] = Na;
    CHECK_OK(h3_dit_forward(cpu, &g_ex, in, Nv ? &vo : NULL, Na ? &ao : NULL));
    h3_tensor dv = to_dev(in->video), da = to_dev(in->audio), dt = to_dev(in->text);
    h3_dit_inputs din = *in;
    din.video = in->video ? &dv : NULL;
    din.audio = in->audio ? &da : NULL;
    din.text = in->text ? &dt : NULL;
    if (Nv) CHECK_OK(h3_tensor_alloc2(&dvo, H3_PLACE_DEVICE, H3_F32, Nv, h3_dit_video_dim(c), H3_MEM_ACTIVATIONS));
    if (Na) CHECK_OK(h3_tensor_alloc2(&dao, H3_PLACE_DEVICE, H3_F32, Na, c->audio_dim, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_dit_forward(gpu, &g_ex, &din, Nv ? &dvo : NULL, Na ? &dao : NULL));
    char w[160];
    if (Nv) {
        snprintf(w, sizeof w, "%s video velocity", what);
        compare_dev(w, &dvo, &vo, tol);
    }
    if (Na) {
        snprintf(w, sizeof w, "%s audio velocity", what);
        compare_dev(w, &dao, &ao, tol);
    }
    h3_tensor *ts[] = {&vo, &ao, &dvo, &dao, &dv, &da, &dt};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) h3_tensor_free(ts[i]);
}

/* The DiT file at path on the GPU and on the CPU, on the fixture inputs. */
static void file_case(const char *path, const char *what, double tol) {
    char q[1024];
    t_src_path("tests/fixtures/dit/inputs.safetensors", q, sizeof q);
    h3_dit *cpu = NULL, *gpu = NULL;
    h3_dit_open_opts go;
    memset(&go, 0, sizeof go);
    go.act_place = H3_PLACE_DEVICE;
    go.weight_place = H3_PLACE_DEVICE;
    CHECK_OK(h3_dit_open(path, NULL, &cpu));
    CHECK_OK(h3_dit_open(path, &go, &gpu));
    if (cpu && gpu) {
        CHECK_OK(h3_dit_upload_weights(gpu, &g_ex));
        h3_dit_inputs_file f;
        CHECK_OK(h3_dit_inputs_read(q, h3_dit_get_config(cpu), &f));
        forward_both(what, cpu, gpu, &f.in, tol);
        h3_dit_inputs_file_free(&f);
    }
    h3_dit_close(cpu);
    h3_dit_close(gpu);
}

/* A LoRA over every linear of the reduced DiT (ai-toolkit names, f32 factors), written to path. */
static void write_fixture_lora(const char *path) {
    static const struct {
        const char *fmt;
        int64_t out, in;
    } mods[] = {{"%s.%d.attn.qkv_proj", 768, 32},
                {"%s.%d.attn.out_proj", 32, 256},
                {"%s.%d.mlp.fc1", 128, 32},
                {"%s.%d.mlp.fc2", 32, 64},
                {"%s.%d.adaln_proj.linear", 576, 16}};
    static const struct {
        const char *name;
        int64_t out, in;
    } globals[] = {{"video_patch_proj", 32, 96},
                   {"audio_patch_proj", 32, 32},
                   {"condition_proj", 32, 24},
                   {"time_embedder.proj_in", 32, 256},
                   {"final_layer.adaln_proj.linear", 64, 16},
                   {"final_layer.video_out", 96, 32}};
    h3_st_writer *w;
    CHECK_OK(h3_st_writer_new(&w));
    float *bufs[128];
    int nb = 0;
    char key[160];
    const int64_t r = 4;
    for (int m = 0; m < 5 + 6; m++)
        for (int b = 0; b < (m < 5 ? 4 : 1); b++) {
            int ref = b < 2;
            if (m == 4 && ref) continue; /* refiner blocks have no AdaLN */
            char mod[96];
            int64_t out = m < 5 ? mods[m].out : globals[m - 5].out,
                    in = m < 5 ? mods[m].in : globals[m - 5].in;
            if (m < 5)
                snprintf(mod, sizeof mod, mods[m].fmt, ref ? "token_refiner.blocks" : "blocks",
                         ref ? b : b - 2);
            else
                snprintf(mod, sizeof mod, "%s", globals[m - 5].name);
            float *a = malloc((size_t)(r * in) * sizeof(float)),
                  *bb = malloc((size_t)(out * r) * sizeof(float));
            t_fill_uniform(a, (size_t)(r * in), -0.3, 0.3);
            t_fill_uniform(bb, (size_t)(out * r), -0.2, 0.2);
            bufs[nb++] = a;
            bufs[nb++] = bb;
            int64_t sa[2] = {r, in}, sb[2] = {out, r};
            snprintf(key, sizeof key, "diffusion_model.%s.lora_A.weight", mod);
            CHECK_OK(h3_st_writer_add(w, key, H3_F32, 2, sa, a));
            snprintf(key, sizeof key, "diffusion_model.%s.lora_B.weight", mod);
            CHECK_OK(h3_st_writer_add(w, key, H3_F32, 2, sb, bb));
        }
    CHECK_OK(h3_st_writer_write(w, path, 0));
    h3_st_writer_free(w);
    for (int i = 0; i < nb; i++) free(bufs[i]);
}

/* A LoRA on the GPU, merged into the uploaded weights on the device or on the side path there (bf16 factors),
 * against the CPU's merge (f32, rounded once to the stored dtype): the same tolerance as without. */
static void test_lora(void) {
    char lp[1024], q[1024];
    t_tmp_path("cuda_lora.safetensors", lp, sizeof lp);
    write_fixture_lora(lp);
    t_src_path("tests/fixtures/dit/inputs.safetensors", q, sizeof q);
    static const char *const rel[] = {"tests/fixtures/dit/official", "tests/fixtures/dit/diffusers"};
    for (int i = 0; i < 2; i++)
        for (int mode = H3_LORA_MERGE; mode <= H3_LORA_SIDE; mode++) {
            char p[1024], what[160];
            t_src_path(rel[i], p, sizeof p);
            snprintf(what, sizeof what, "%s with a LoRA, %s on the GPU", rel[i],
                     mode == H3_LORA_MERGE ? "merged" : "side path");
            h3_dit *cpu = NULL, *gpu = NULL;
            h3_lora lc, lg;
            memset(&lc, 0, sizeof lc);
            memset(&lg, 0, sizeof lg);
            h3_dit_open_opts go;
            memset(&go, 0, sizeof go);
            go.act_place = H3_PLACE_DEVICE;
            go.weight_place = H3_PLACE_DEVICE;
            CHECK_OK(h3_dit_open(p, NULL, &cpu));
            CHECK_OK(h3_dit_open(p, &go, &gpu));
            if (cpu && gpu) {
                CHECK_OK(h3_lora_add_file(&lc, cpu, lp, 0.8f));
                CHECK_OK(h3_lora_add_file(&lg, gpu, lp, 0.8f));
                CHECK_OK(h3_lora_apply(cpu, &g_ex, &lc, H3_LORA_MERGE));
                CHECK_OK(h3_dit_upload_weights(gpu, &g_ex));
                CHECK_OK(h3_lora_apply(gpu, &g_ex, &lg, (h3_lora_mode)mode));
                h3_lora_mem lm;
                h3_lora_mem_of(gpu, &lm);
                CHECK(mode == H3_LORA_MERGE ? lm.n_side == 0 && lm.n_merged > 0
                                            : lm.n_merged == 0 && lm.n_side > 0,
                      "%s: %d merged, %d on the side path", what, lm.n_merged, lm.n_side);
                h3_dit_inputs_file f;
                CHECK_OK(h3_dit_inputs_read(q, h3_dit_get_config(cpu), &f));
                forward_both(what, cpu, gpu, &f.in, 3e-2);
                h3_dit_inputs_file_free(&f);
            }
            h3_dit_close(cpu);
            h3_dit_close(gpu);
            h3_lora_free(&lc);
            h3_lora_free(&lg);
        }
    unlink(lp);
}

static void test_fixtures(void) {
    static const char *const rel[] = {"tests/fixtures/dit/official", "tests/fixtures/dit/diffusers",
                                       "tests/fixtures/dit/comfy_pruned.safetensors"};
    for (int i = 0; i < 3; i++) {
        char p[1024];
        t_src_path(rel[i], p, sizeof p);
        file_case(p, rel[i], 3e-2);
    }
}

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

/* Hidden 5376, 56 heads x 128, FFN 14336, 2 DiT blocks + 2 refiner blocks; a 512x256, 22-frame t2va layout.
 * quant: the blocks' linears int8 + ConvRot on both sides (quantized from the same values: the same bytes).
 * lowbit_attn: the blocks' attention in fp8 or int8 on both sides (the CPU computes the same quantization); bf16
 * activations on the GPU put some q, k and v values on the other side of a rounding boundary, yet the H200 measured
 * 2.5e-3 (video) and 3.3e-3 (audio) for fp8, as close as bf16 attention's: tolerance 1e-2 (3x that). Whether the
 * flag reaches the op is checked on the CPU (cli_attention.sh: low-bit latents move off bf16's).
 */
static void full_width(int quant, unsigned lowbit_attn) {
    h3_dit_config cfg;
    h3_dit_config_default(&cfg);
    cfg.n_layers = 2;
    h3_dit_open_opts go;
    memset(&go, 0, sizeof go);
    go.act_place = H3_PLACE_DEVICE;
    go.weight_place = H3_PLACE_DEVICE;
    h3_dit *cpu = NULL, *gpu = NULL;
    CHECK_OK(h3_dit_create(&cfg, H3_BF16, NULL, &cpu));
    CHECK_OK(h3_dit_create(&cfg, H3_BF16, &go, &gpu));
    if (!cpu || !gpu) goto out;
    static tlist a, b;
    a.n = b.n = 0;
    h3_dit_visit_weights(cpu, collect, &a);
    h3_dit_visit_weights(gpu, collect, &b);
    CHECK(a.n == b.n && a.n > 0, "%d vs %d weights", a.n, b.n);
    for (int i = 0; i < a.n && i < b.n; i++) {
        CHECK_OK(h3_op_random_uniform(&g_ex, a.t[i], 1000 + (uint64_t)i, -0.03f, 0.03f));
        CHECK_OK(h3_copy(&g_ex, b.t[i], a.t[i]));
    }
    h3_seq_layout L;
    CHECK_OK(h3_seq_layout_t2va(128, NULL, 22, 512, 256, &L));
    const int64_t S = L.seq_len, Nv = L.n_video_rows, Na = L.n_audio_rows;
    CHECK(S >= 1000, "the layout has %lld rows", (long long)S);
    float uniq[4];
    int32_t *tidx = malloc((size_t)S * 4), *tags = malloc((size_t)S * 4), *vi = malloc((size_t)Nv * 4),
            *ai = malloc((size_t)Na * 4), *ti = malloc(128 * 4);
    int nt = h3_seq_layout_timestep_indices(&L, 0.4f, 0.7f, uniq, tidx);
    for (int64_t r = 0; r < S; r++) tags[r] = L.tags[r];
    for (int64_t i = 0; i < Nv; i++) vi[i] = (int32_t)L.video_indices[i];
    for (int64_t i = 0; i < Na; i++) ai[i] = (int32_t)L.audio_indices[i];
    for (int i = 0; i < 128; i++) ti[i] = (int32_t)L.text_indices[i];
    h3_tensor video, audio, text;
    CHECK_OK(h3_tensor_alloc2(&video, H3_PLACE_HOST, H3_F32, Nv, 96, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc2(&audio, H3_PLACE_HOST, H3_F32, Na, 32, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc2(&text, H3_PLACE_HOST, H3_F32, 128, 5120, H3_MEM_ACTIVATIONS));
    t_fill_randn(video.data, (size_t)(Nv * 96), 1.0);
    t_fill_randn(audio.data, (size_t)(Na * 32), 1.0);
    t_fill_randn(text.data, (size_t)(128 * 5120), 1.0);
    h3_dit_inputs in = {&video, &audio, &text, uniq, nt, S, tidx, tags, L.pos, vi, ai, ti};
    if (quant) {
        h3_pool *pool = NULL;
        CHECK_OK(h3_pool_create(0, &pool));
        CHECK_OK(h3_dit_quantize_blocks(cpu, &g_ex, H3_QT_INT8_CONVROT, pool));
        CHECK_OK(h3_dit_quantize_blocks(gpu, &g_ex, H3_QT_INT8_CONVROT, pool));
        h3_pool_free(pool);
    }
    if (lowbit_attn) { /* the CPU computes the device kernel's key blocks (192 with Hopper's fp8 kernel) */
        h3_dit_set_attention(cpu, h3_cuda_attention_ref_flags(&g_ex, lowbit_attn));
        h3_dit_set_attention(gpu, lowbit_attn);
    }
    if (lowbit_attn == H3_ATTN_SPARSE) { /* sparse at this length and step (the defaults ask 4,096 rows) */
        CHECK_OK(h3_dit_set_sparse(cpu, H3_DIT_SPARSE_TAU, 0.0f, 1.0f, 0));
        CHECK_OK(h3_dit_set_sparse(gpu, H3_DIT_SPARSE_TAU, 0.0f, 1.0f, 0));
    }
    forward_both(lowbit_attn == H3_ATTN_FP8    ? "full width, 2 blocks, fp8 attention"
                 : lowbit_attn == H3_ATTN_INT8 ? "full width, 2 blocks, int8 attention"
                 : lowbit_attn == H3_ATTN_SPARSE
                     ? "full width, 2 blocks, sparse attention"
                 : quant                       ? "full width, 2 blocks, int8 + ConvRot (W8A8 on the GPU)"
                                               : "full width, 2 blocks",
                 cpu, gpu, &in, lowbit_attn == H3_ATTN_SPARSE ? 3e-2 : lowbit_attn ? 1e-2 : quant ? 2e-2 : 3e-2);
    h3_tensor_free(&video);
    h3_tensor_free(&audio);
    h3_tensor_free(&text);
    free(tidx);
    free(tags);
    free(vi);
    free(ai);
    free(ti);
    h3_seq_layout_free(&L);
out:
    h3_dit_close(cpu);
    h3_dit_close(gpu);
}

static void test_full_width(void) {
    full_width(0, 0);
}

static void test_full_width_int8(void) {
    full_width(1, 0);
}

static void test_full_width_fp8_attention(void) {
    full_width(0, H3_ATTN_FP8);
}

/* int8 attention in the blocks on both sides (the CPU computes the device's quantization): not yet run on a GPU,
 * so its tolerance is fp8's. */
static void test_full_width_int8_attention(void) {
    full_width(0, H3_ATTN_INT8);
}

/* Block-sparse attention in the blocks on both sides (a tile whose score sits at the threshold may fall either way:
 * the device's activations are bf16, the host's f32), so the dense path's tolerance. */
static void test_full_width_sparse(void) {
    full_width(0, H3_ATTN_SPARSE);
}

/* h3run quantize's ComfyUI files of the pruned fixture, on the GPU and on the CPU. The CPU computes with f32
 * activations; the GPU quantizes its activations (int8 per token after the rotation, as ComfyUI's GPU path does;
 * fp8 with one scale a token on Hopper, one a call on Ada) or, for nvfp4, decodes weight tiles into bf16 (W4A16).
 * Tolerances: the activation quantization's error through the blocks (error table: ~1e-2 per int8 linear, ~3e-2
 * per fp8 linear), plus bf16 activations: measured 6.6e-3..8.1e-3 (int8), 2.1e-2..3.7e-2 (fp8 one scale a call),
 * 2.0e-2..2.7e-2 (fp8 one scale a token, H200), ~5e-3 (nvfp4, GGUF).
 */

static void quant_case(h3_qtarget t, double tol) {
    char in[1024], out[1024], name[64];
    t_src_path("tests/fixtures/dit/comfy_pruned.safetensors", in, sizeof in);
    snprintf(name, sizeof name, "dit_%s.safetensors", h3_qtarget_name(t));
    t_tmp_path(name, out, sizeof out);
    h3_quantize_opts o;
    memset(&o, 0, sizeof o);
    o.target = t;
    h3_quantize_result r;
    CHECK_OK(h3_quantize_checkpoint(in, out, &o, &r));
    CHECK(r.n_quantized >= 8, "%s: %lld layers quantized", h3_qtarget_name(t), (long long)r.n_quantized);
    char what[96];
    snprintf(what, sizeof what, "comfy_pruned as %s", h3_qtarget_name(t));
    file_case(out, what, tol);
    unlink(out);
}

static void test_quantized(void) {
    quant_case(H3_QT_INT8_CONVROT, 3e-2);
    quant_case(H3_QT_INT8, 3e-2);
    quant_case(H3_QT_FP8, 8e-2);
    quant_case(H3_QT_NVFP4, 3e-2);
    /* sd.cpp's GGUF of the pruned fixture: Q8_0, Q4_K, Q5_0, Q4_1, Q5_1, Q6_K, Q4_0 linears, decoded in tiles
     */
    char p[1024];
    t_src_path("tests/fixtures/quant/dit.gguf", p, sizeof p);
    file_case(p, "dit.gguf", 3e-2);
}

int main(int argc, char **argv) {
    if (h3_cuda_device_count() == 0) {
        printf("test_dit_cuda: skipped: no CUDA device on this machine\n");
        return 0;
    }
    if (h3_exec_init(&g_ex, 0) != H3_OK || h3_cuda_init(&g_ex, 0, (int64_t)24 << 30) != H3_OK) {
        fprintf(stderr, "init failed: %s\n", h3_last_error());
        return 1;
    }
    static const t_case cases[] = {{"fixtures", test_fixtures},   {"full_width", test_full_width},
                                   {"quantized", test_quantized}, {"full_width_int8", test_full_width_int8},
                                   {"lora", test_lora},           {"full_width_fp8_attention", test_full_width_fp8_attention},
                                   {"full_width_int8_attention", test_full_width_int8_attention},
                                   {"full_width_sparse", test_full_width_sparse},
                                   {NULL, NULL}};
    int r = t_main("test_dit_cuda", cases, argc, argv);
    h3_cuda_shutdown(&g_ex);
    h3_exec_free(&g_ex);
    return r;
}

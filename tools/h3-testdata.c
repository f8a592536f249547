/* h3-testdata: writes test inputs that stand in for files users have.
 *
 *   h3-testdata dit-official PATH     header-only (sparse) copy of the official FL2VA/transformer shapes:
 *                                     535 tensors, bf16 with the fp32 islands, 66,280,430,144 data bytes
 *   h3-testdata te-official PATH      header-only copy of the official FL2VA/text_encoder shapes (Qwen3-VL-32B:
 *                                     64 decoder layers, embedding, norm, lm_head, vision tower): 1,058 tensors,
 *                                     bf16, 66,714,780,128 data bytes
 *
 * "Header-only" means the safetensors header is real and the data area is a hole: the file has its full size
 * but occupies a few hundred KB on disk. Every tool that reads only headers treats it as the real checkpoint.
 */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "io/safetensors.h"

typedef struct {
    h3_st_writer *w;
    h3_status st;
} gen;

static void add(gen *g, h3_dtype dt, const char *name, int nd, int64_t a, int64_t b) {
    if (g->st != H3_OK) return;
    int64_t s[2] = {a, b};
    g->st = h3_st_writer_add(g->w, name, dt, nd, s, NULL);
}

/* Official DiT (H3-FACTS §1.6): hidden 5376, 50 blocks, 56x128 heads, FFN 14336, text 5120. */
static h3_status dit_official(const char *path) {
    const int64_t Hd = 5376, inner = 56 * 128, ffn = 14336, temb = 2688;
    gen g = {NULL, H3_OK};
    H3_TRY(h3_st_writer_new(&g.w));
    char n[128];
    for (int i = 0; i < 50; i++) {
#define B(suffix) (snprintf(n, sizeof n, "blocks.%d.%s", i, suffix), n)
        add(&g, H3_BF16, B("norm1.weight"), 1, Hd, 0);
        add(&g, H3_BF16, B("norm2.weight"), 1, Hd, 0);
        add(&g, H3_BF16, B("attn.qkv_proj.weight"), 2, 3 * inner, Hd);
        add(&g, H3_BF16, B("attn.q_norm.weight"), 1, 128, 0);
        add(&g, H3_BF16, B("attn.k_norm.weight"), 1, 128, 0);
        add(&g, H3_BF16, B("attn.out_proj.weight"), 2, Hd, inner);
        add(&g, H3_BF16, B("mlp.fc1.weight"), 2, 2 * ffn, Hd);
        add(&g, H3_BF16, B("mlp.fc2.weight"), 2, Hd, ffn);
        add(&g, H3_BF16, B("adaln_proj.linear.weight"), 2, 18 * Hd, temb);
        add(&g, H3_BF16, B("adaln_proj.linear.bias"), 1, 18 * Hd, 0);
#undef B
    }
    for (int i = 0; i < 2; i++) {
#define R(suffix) (snprintf(n, sizeof n, "token_refiner.blocks.%d.%s", i, suffix), n)
        add(&g, H3_BF16, R("norm1.weight"), 1, Hd, 0);
        add(&g, H3_BF16, R("norm2.weight"), 1, Hd, 0);
        add(&g, H3_BF16, R("attn.qkv_proj.weight"), 2, 3 * inner, Hd);
        add(&g, H3_BF16, R("attn.q_norm.weight"), 1, 128, 0);
        add(&g, H3_BF16, R("attn.k_norm.weight"), 1, 128, 0);
        add(&g, H3_BF16, R("attn.out_proj.weight"), 2, Hd, inner);
        add(&g, H3_BF16, R("mlp.fc1.weight"), 2, 2 * ffn, Hd);
        add(&g, H3_BF16, R("mlp.fc2.weight"), 2, Hd, ffn);
#undef R
    }
    add(&g, H3_F32, "video_patch_proj.weight", 2, Hd, 96);
    add(&g, H3_F32, "video_patch_proj.bias", 1, Hd, 0);
    add(&g, H3_F32, "audio_patch_proj.weight", 2, Hd, 32);
    add(&g, H3_F32, "audio_patch_proj.bias", 1, Hd, 0);
    add(&g, H3_BF16, "condition_proj.weight", 2, Hd, 5120);
    add(&g, H3_BF16, "condition_proj.bias", 1, Hd, 0);
    add(&g, H3_F32, "time_embedder.proj_in.weight", 2, Hd, 256);
    add(&g, H3_F32, "time_embedder.proj_in.bias", 1, Hd, 0);
    add(&g, H3_F32, "time_embedder.proj_out.weight", 2, temb, Hd);
    add(&g, H3_F32, "time_embedder.proj_out.bias", 1, temb, 0);
    add(&g, H3_F32, "rope.inv_freq", 1, 16, 0);
    add(&g, H3_BF16, "token_refiner.final_norm.weight", 1, Hd, 0);
    add(&g, H3_BF16, "final_layer.norm.weight", 1, Hd, 0);
    add(&g, H3_BF16, "final_layer.adaln_proj.linear.weight", 2, 2 * Hd, temb);
    add(&g, H3_BF16, "final_layer.adaln_proj.linear.bias", 1, 2 * Hd, 0);
    add(&g, H3_F32, "final_layer.video_out.weight", 2, 96, Hd);
    add(&g, H3_F32, "final_layer.video_out.bias", 1, 96, 0);
    add(&g, H3_F32, "final_layer.audio_out.weight", 2, 32, Hd);
    add(&g, H3_F32, "final_layer.audio_out.bias", 1, 32, 0);
    if (g.st == H3_OK) g.st = h3_st_writer_meta(g.w, "format", "pt");
    if (g.st == H3_OK) g.st = h3_st_writer_write(g.w, path, 1);
    h3_st_writer_free(g.w);
    return g.st;
}

static void add_nd(gen *g, h3_dtype dt, const char *name, int nd, const int64_t *shape) {
    if (g->st != H3_OK) return;
    g->st = h3_st_writer_add(g->w, name, dt, nd, shape, NULL);
}

/* Official text encoder (H3-FACTS §2, H3-FILE-FORMATS §3.1): Qwen3-VL-32B in transformers' names, all bf16.
 * Text: hidden 5120, 64 layers, 64/8 heads of 128, FFN 25600, vocab 151936. Vision: 27 blocks of width 1152
 * (FFN 4304), patch 16x16x2, 2304 position embeddings, a merger and 3 deepstack mergers into 5120. */
static h3_status te_official(const char *path) {
    const int64_t C = 5120, V = 151936, F = 25600, vh = 1152, vf = 4304, m = 4 * vh; /* merged width 4608 */
    gen g = {NULL, H3_OK};
    H3_TRY(h3_st_writer_new(&g.w));
    char n[160];
    add(&g, H3_BF16, "model.language_model.embed_tokens.weight", 2, V, C);
    for (int i = 0; i < 64; i++) {
#define T(suffix) (snprintf(n, sizeof n, "model.language_model.layers.%d.%s", i, suffix), n)
        add(&g, H3_BF16, T("input_layernorm.weight"), 1, C, 0);
        add(&g, H3_BF16, T("post_attention_layernorm.weight"), 1, C, 0);
        add(&g, H3_BF16, T("self_attn.q_proj.weight"), 2, 64 * 128, C);
        add(&g, H3_BF16, T("self_attn.k_proj.weight"), 2, 8 * 128, C);
        add(&g, H3_BF16, T("self_attn.v_proj.weight"), 2, 8 * 128, C);
        add(&g, H3_BF16, T("self_attn.o_proj.weight"), 2, C, 64 * 128);
        add(&g, H3_BF16, T("self_attn.q_norm.weight"), 1, 128, 0);
        add(&g, H3_BF16, T("self_attn.k_norm.weight"), 1, 128, 0);
        add(&g, H3_BF16, T("mlp.gate_proj.weight"), 2, F, C);
        add(&g, H3_BF16, T("mlp.up_proj.weight"), 2, F, C);
        add(&g, H3_BF16, T("mlp.down_proj.weight"), 2, C, F);
#undef T
    }
    add(&g, H3_BF16, "model.language_model.norm.weight", 1, C, 0);
    add(&g, H3_BF16, "lm_head.weight", 2, V, C);
    const int64_t patch[5] = {vh, 3, 2, 16, 16};
    add_nd(&g, H3_BF16, "model.visual.patch_embed.proj.weight", 5, patch);
    add(&g, H3_BF16, "model.visual.patch_embed.proj.bias", 1, vh, 0);
    add(&g, H3_BF16, "model.visual.pos_embed.weight", 2, 2304, vh);
    for (int i = 0; i < 27; i++) {
#define B(suffix) (snprintf(n, sizeof n, "model.visual.blocks.%d.%s", i, suffix), n)
        add(&g, H3_BF16, B("norm1.weight"), 1, vh, 0);
        add(&g, H3_BF16, B("norm1.bias"), 1, vh, 0);
        add(&g, H3_BF16, B("norm2.weight"), 1, vh, 0);
        add(&g, H3_BF16, B("norm2.bias"), 1, vh, 0);
        add(&g, H3_BF16, B("attn.qkv.weight"), 2, 3 * vh, vh);
        add(&g, H3_BF16, B("attn.qkv.bias"), 1, 3 * vh, 0);
        add(&g, H3_BF16, B("attn.proj.weight"), 2, vh, vh);
        add(&g, H3_BF16, B("attn.proj.bias"), 1, vh, 0);
        add(&g, H3_BF16, B("mlp.linear_fc1.weight"), 2, vf, vh);
        add(&g, H3_BF16, B("mlp.linear_fc1.bias"), 1, vf, 0);
        add(&g, H3_BF16, B("mlp.linear_fc2.weight"), 2, vh, vf);
        add(&g, H3_BF16, B("mlp.linear_fc2.bias"), 1, vh, 0);
#undef B
    }
    /* The merger normalizes before the 2x2 shuffle (width 1152); the deepstack mergers after it (width 4608). */
    for (int k = -1; k < 3; k++) {
        char p[64];
        if (k < 0) snprintf(p, sizeof p, "model.visual.merger.");
        else snprintf(p, sizeof p, "model.visual.deepstack_merger_list.%d.", k);
        int64_t nw = k < 0 ? vh : m;
#define M(suffix) (snprintf(n, sizeof n, "%s%s", p, suffix), n)
        add(&g, H3_BF16, M("norm.weight"), 1, nw, 0);
        add(&g, H3_BF16, M("norm.bias"), 1, nw, 0);
        add(&g, H3_BF16, M("linear_fc1.weight"), 2, m, m);
        add(&g, H3_BF16, M("linear_fc1.bias"), 1, m, 0);
        add(&g, H3_BF16, M("linear_fc2.weight"), 2, C, m);
        add(&g, H3_BF16, M("linear_fc2.bias"), 1, C, 0);
#undef M
    }
    if (g.st == H3_OK) g.st = h3_st_writer_meta(g.w, "format", "pt");
    if (g.st == H3_OK) g.st = h3_st_writer_write(g.w, path, 1);
    h3_st_writer_free(g.w);
    return g.st;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: h3-testdata dit-official|te-official PATH\n");
        return 2;
    }
    h3_status st;
    if (strcmp(argv[1], "dit-official") == 0) {
        st = dit_official(argv[2]);
    } else if (strcmp(argv[1], "te-official") == 0) {
        st = te_official(argv[2]);
    } else {
        fprintf(stderr, "h3-testdata: unknown kind '%s'\n", argv[1]);
        return 2;
    }
    if (st != H3_OK) {
        fprintf(stderr, "h3-testdata: %s\n", h3_last_error());
        return 1;
    }
    return 0;
}

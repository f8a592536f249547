/* h3-testdata: writes test inputs that stand in for files users have.
 *
 *   h3-testdata dit-official PATH     header-only (sparse) copy of the official FL2VA/transformer shapes:
 *                                     535 tensors, bf16 with the fp32 islands, 66,280,430,144 data bytes
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

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: h3-testdata dit-official PATH\n");
        return 2;
    }
    h3_status st;
    if (strcmp(argv[1], "dit-official") == 0) {
        st = dit_official(argv[2]);
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

/* Writing quantized checkpoints in ComfyUI's format, and the error microbenchmark of each format.
 *
 * h3_quantize_checkpoint reads a DiT or a text encoder in any layout h3run opens (official shards or folder,
 * diffusers, ComfyUI bf16) and writes one .safetensors file in ComfyUI's names with its per-layer markers,
 * byte for byte as ComfyUI's own files spell them (../shared/docs/H3-FILE-FORMATS.md §0-§1), so ComfyUI and
 * h3run read it: DiT:  the four linears of every block (attn.qkv_proj with contiguous [Q; K; V] rows,
 * attn.out_proj, mlp.fc1 as [gate; value], mlp.fc2); with int8_convrot also the full model's
 * blocks.N.adaln_proj.linear (group 64). Everything else keeps its stored dtype (patch projections, heads,
 * curve table, norms, token refiner). Text encoder: q, k, v, o, gate, up, down of the first te_layers decoder
 * layers (50: H3 reads hidden_states[50]); with nvfp4 the embedding becomes int8 with per-row scales;
 * model.norm and lm_head are dropped and model.visual.* becomes visual.* (ComfyUI's names). Formats: int8
 * (per-row scales), int8_convrot (ConvRot group 256, or the largest power of 4 that divides K when 256 does
 * not), fp8 (one scale per tensor), nvfp4 (the text encoder's full-precision-matmul form, no AWQ: AWQ needs
 * calibration activations h3run does not have; N and K multiples of 16). A linear whose shape suits no rule of
 * the format stays unquantized. Defaults follow the evidence: DiT int8_convrot, text encoder nvfp4.
 *
 * The file is written tensor by tensor (one layer in memory at a time) under "<out>.partial", tensors ordered
 * by element size then name so every tensor is aligned to its element size, and renamed when complete.
 */
#ifndef H3_QUANT_QWRITE_H
#define H3_QUANT_QWRITE_H

#include <stdio.h>

#include "base/threads.h"
#include "io/detect.h"
#include "quant/quant.h"
#include "tensor/ops.h"

typedef enum h3_qtarget {
    H3_QT_DEFAULT = 0, /* per component: DiT int8_convrot, text encoder nvfp4 */
    H3_QT_INT8,
    H3_QT_INT8_CONVROT,
    H3_QT_FP8,
    H3_QT_NVFP4,
    H3_QT_COUNT
} h3_qtarget;

/* "int8", "int8_convrot", "fp8", "nvfp4" ("default"). */
const char *h3_qtarget_name(h3_qtarget t);
/* Parses one of those names; returns 0 when unknown. */
int h3_qtarget_parse(const char *s, h3_qtarget *out);
/* The ConvRot group int8_convrot uses for K columns: 256 if it divides K, else the largest power of 4 that
 * does (64 for the full DiT's 2688-wide adaln); 0 when none does (then the layer is plain int8). */
int h3_qtarget_group(int64_t K);

/* Quantizes w [N, K] (f32) into an owned weight tensor the ops take (data, scales and nvfp4 block scales in
 * one allocation, freed by h3_tensor_free). H3_ERR_INVALID when K does not suit the format. */
h3_status h3_quantize_tensor(const float *w, int64_t N, int64_t K, h3_qtarget t, h3_pool *pool,
                             h3_tensor *out);

typedef struct h3_quantize_opts {
    h3_qtarget target; /* DEFAULT: DiT int8_convrot, text encoder nvfp4 */
    int te_layers;     /* text encoder: decoder layers kept; 0: 50 */
    h3_pool *pool;     /* workers for the quantizers; NULL: the calling thread */
} h3_quantize_opts;

typedef struct h3_quantize_result {
    h3_component comp;
    h3_layout in_layout;
    h3_qtarget target;   /* the format used */
    int64_t n_tensors;   /* written */
    int64_t n_quantized; /* layers quantized */
    int64_t n_kept;      /* linears left unquantized (K unsuitable) */
    int64_t in_bytes;    /* source tensors read */
    int64_t out_bytes;   /* data bytes written */
} h3_quantize_result;

/* in: a file, shard index or folder (a model folder's transformer/ or text_encoder/); out: a .safetensors
 * path. */
h3_status h3_quantize_checkpoint(const char *in, const char *out, const h3_quantize_opts *o,
                                 h3_quantize_result *res);

/* ---- the error microbenchmark
 * ------------------------------------------------------------------------------- */

/* The variants the table compares: weight formats with activations kept in f32 (W·A16, the CPU GEMM and every
 * text-encoder path), and the activation quantization ComfyUI's DiT path adds on GPUs (W8A8 int8 per token
 * after the ConvRot rotation; fp8 activations with one scale a token, max|x[r]| / 448; nvfp4 activations with a
 * per-tensor scale: W4A4). */
typedef enum h3_qvariant {
    H3_QV_INT8 = 0,
    H3_QV_INT8_CONVROT,
    H3_QV_INT8_CONVROT_W8A8,
    H3_QV_FP8,
    H3_QV_FP8_W8A8,
    H3_QV_NVFP4,
    H3_QV_NVFP4_W4A4,
    H3_QV_COUNT
} h3_qvariant;
const char *h3_qvariant_name(h3_qvariant v);
/* The activation quantization of variant v, in place on x [R, K] (round trip to f32): INT8_CONVROT_W8A8 rotates
 * each row per group (0: none), quantizes it to int8 per row and decodes it back un-rotated; FP8_W8A8 rounds each
 * row x[r] / s_r to e4m3 with its own scale s_r = max|x[r]| / 448 (h3_qbench_act_quant_fp8 with rows = 1, what
 * Hopper's fp8 GEMM does); NVFP4_W4A4 quantizes with the tensor's own scale; other variants leave x. The CPU
 * statement of what the GPU's W8A8 and fp8 GEMMs do to their activations (tests/test_cuda_ops.c). */
h3_status h3_qbench_act_quant(float *x, int64_t R, int64_t K, h3_qvariant v, int group);
/* fp8 activations in place on x [R, K]: rows = 1, one scale a row (Hopper's fp8 GEMM); rows = 0, one scale
 * s = max|x| / 448 for all of x (Ada's, which takes one scale per chunk of rows its scratch holds: the whole x up
 * to 128 MiB of e4m3). x / s rounded to e4m3, clamped at ±448; non-finite values do not count in the maximum. */
void h3_qbench_act_quant_fp8(float *x, int64_t R, int64_t K, int rows);

/* One linear of the table: f32 weights (the stored bf16 values) [n, k]. */
typedef struct h3_qbench_layer {
    char name[128];
    const float *w;
    int64_t n, k;
} h3_qbench_layer;

/* One DiT block's weights in ComfyUI's order (qkv [3·inner, H] contiguous, out [H, inner], fc1 [2F, H] =
 * [gate; value], fc2 [H, F]) and its norms, all f32. */
typedef struct h3_qbench_block {
    const float *qkv, *out, *fc1, *fc2;
    const float *norm1, *norm2, *q_norm, *k_norm; /* [H], [H], [head_dim], [head_dim] */
    int64_t hidden, heads, head_dim, ffn;
    double eps;
} h3_qbench_block;

/* rel[layer][variant] = ||Y_q − Y|| / ||Y|| with Y = X·Wᵀ over random X [rows, k] ~ N(0, 1) (seeded), and for
 * the block: rel of its output x + attn + mlp, and of its update (output − x), over random x [rows, H].
 * Variants whose format does not suit a layer's K are NaN. The block is the plain pre-norm form (no
 * modulation, no RoPE): the formats' errors, not the model's conditioning, are what it measures. */
typedef struct h3_qbench_result {
    double layer[64][H3_QV_COUNT];
    int n_layers;
    double block_out[H3_QV_COUNT], block_update[H3_QV_COUNT];
    int has_block;
} h3_qbench_result;

h3_status h3_qbench_run(h3_exec *ex, const h3_qbench_layer *layers, int n_layers,
                        const h3_qbench_block *block, int64_t rows, uint64_t seed, h3_qbench_result *out);

/* The layers of block 0 of a checkpoint (DiT: qkv, out, fc1, fc2; text encoder: q..down) and, for a DiT, its
 * block, as f32 in ComfyUI's order, from any layout h3run quantizes. Free with h3_qbench_source_free. */
typedef struct h3_qbench_source {
    h3_component comp;
    h3_qbench_layer layers[8];
    int n_layers;
    h3_qbench_block block;
    int has_block;
    float *bufs[16];
    int n_bufs;
} h3_qbench_source;
h3_status h3_qbench_source_load(const char *in, h3_qbench_source *src);
/* A DiT block of the given shapes with random weights (N(0, 1/fan_in), norms 1 + N(0, 0.1)), seeded. */
h3_status h3_qbench_source_random(int64_t hidden, int64_t heads, int64_t head_dim, int64_t ffn, uint64_t seed,
                                  h3_qbench_source *src);
void h3_qbench_source_free(h3_qbench_source *src);

/* Prints the table (one row per layer, the block's output and update last; one column per variant). */
void h3_qbench_print(FILE *f, const h3_qbench_source *src, const h3_qbench_result *r);

#endif

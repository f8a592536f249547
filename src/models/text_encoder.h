/* The text encoder: the text path of Qwen3-VL (H3-Encoder, Qwen3-VL-32B), up to the hidden state H3
 * conditions on.
 *
 * H3 uses hidden_states[50]: the un-normalized residual stream after decoder layers 0..49 (H3-FACTS §2). This
 * module computes hidden_states[layer] for any layer in 0..n_layers (0 is the token embedding); the final
 * norm, the LM head and the vision tower (models/vision.h reads it) are never read here, nor are layers >=
 * layer.
 *
 * One decoder layer (Qwen3; shapes of Qwen3-VL-32B: hidden C 5120, 64 query heads and 8 key/value heads of
 * head_dim D 128, intermediate F 25600, RMSNorm eps 1e-6, no biases):
 *     h = rms_norm(x, input_layernorm)
 *     q = h·Wqᵀ [n, 64, D], k = h·Wkᵀ [n, 8, D], v = h·Wvᵀ [n, 8, D]
 *     q, k = rms_norm over D of each head (q_norm, k_norm), then rotary embedding (θ = 5e6, rotate-half, all
 * D) x += softmax(q·kᵀ/√D, causal, query head i reads key head i/8)·v ·Woᵀ x += down(silu(gate(h2)) ·
 * up(h2)),  h2 = rms_norm(x, post_attention_layernorm)
 *
 * Rotary positions of text-only prompts. Qwen3-VL's rotary embedding is "interleaved mRoPE": each of the D/2
 * = 64 frequencies j takes its angle from one of three position axes (t, h, w): with mrope_section [24, 20,
 * 20], j ≡ 1 (mod 3) and j < 60 takes h, j ≡ 2 (mod 3) and j < 60 takes w, the rest take t; angle_j =
 * p_axis(j) · θ^(−2j/D), and cos/sin are tabled over cat(angles, angles). For a prompt without images or
 * videos, transformers' position ids are arange(L) on all three axes (get_rope_index's text-only branch), so
 * p_t = p_h = p_w = p for every token and angle_j = p · θ^(−2j/D) whichever axis j takes: exactly ordinary
 * 1-D RoPE over positions 0..L−1. That is what this module computes (tests/test_text_encoder.c builds the
 * interleaved tables from the definition and checks they equal these). Vision blocks in a prompt
 * (fl2va/ref2va presentations) give tokens distinct (t, h, w): h3_text_encoder_encode_mm takes them with the
 * vision tower's rows (models/vision.h).
 *
 * Weights stay in their stored dtype (bf16 as released; f32 and f16 work too) and are views over the mapped
 * file: the layer loop fetches each layer's weights through one acquire/release pair (a streamer can later
 * move the 62 GiB model through a few layer slots without changing the forward), and the embedding is read
 * row by row for the prompt's ids only (the table is 1.5 GB in bf16).
 *
 * Weight names: the official text_encoder/ folder (transformers' Qwen3VLForConditionalGeneration):
 *   model.language_model.{embed_tokens, layers.N.*, norm}.weight, lm_head.weight, model.visual.*
 * and the ComfyUI / Wan2GP repacks truncated to 50 layers: model.{embed_tokens, layers.N.*}.weight, visual.*
 * Quantized files load in their stored format (src/quant/qload.h): ComfyUI's comfy_quant markers (int8
 * ConvRot, fp8, nvfp4 with AWQ's pre_quant_scale, the int8 embedding) and GGUF files in ComfyUI's or
 * llama.cpp's names (token_embd, blk.N.*); linears are decoded panel by panel in the GEMM, embedding rows one
 * by one.
 */
#ifndef H3_MODELS_TEXT_ENCODER_H
#define H3_MODELS_TEXT_ENCODER_H

#include <stdint.h>

#include "base/json.h"
#include "io/detect.h"
#include "tensor/ops.h"

/* The layer whose output conditions H3. */
#define H3_TE_LAYER 50

typedef struct h3_te_config {
    int64_t hidden;           /* C: 5120 */
    int64_t n_layers;         /* decoder layers in the file: 64 official, 50 in the repacks */
    int64_t heads;            /* query heads: 64 */
    int64_t kv_heads;         /* key/value heads: 8 */
    int64_t head_dim;         /* D: 128 */
    int64_t intermediate;     /* F: 25600 */
    int64_t vocab;            /* rows of the embedding: 151936 */
    int64_t max_positions;    /* max_position_embeddings: 262144 (the longest prompt it was made for) */
    double rope_theta;        /* 5e6 */
    double rms_eps;           /* 1e-6 */
    int64_t mrope_section[3]; /* interleaved mRoPE: frequencies per axis (t, h, w): [24, 20, 20], sum
                                 head_dim/2 */
} h3_te_config;

/* Qwen3-VL-32B's text config (H3-FACTS §2), with 64 layers. */
void h3_te_config_default(h3_te_config *c);
/* Reads a transformers config.json: Qwen3VLConfig (its "text_config") or a plain Qwen3 text config, over the
 * defaults. Keys of the wrong type, impossible values, biases or an activation other than silu are errors
 * naming `what`. n_layers is the config's num_hidden_layers; the file decides how many exist. */
h3_status h3_te_config_from_json(const json_t *j, const char *what, h3_te_config *c);

typedef struct h3_te_open_opts {
    const char
        *config_path;   /* config.json to use; NULL: config.json beside the weights if any, else the shapes */
    h3_place act_place; /* where activations live: HOST (or PINNED), or DEVICE: the layers then stream through
                         * two device slots (bf16 activations), the CUDA backend must be up */
    int64_t chunk_rows; /* rows per MLP chunk (bounds the [rows, 2F] scratch); 0: 512 */
    /* Called after each decoder layer of an encode (done of total); nonzero stops the encode there with
     * H3_ERR_INTERRUPTED. NULL: none. */
    int (*on_layer)(void *user, int done, int total);
    void *on_layer_user;
} h3_te_open_opts;

typedef struct h3_text_encoder h3_text_encoder;

/* Opens a text encoder: a .safetensors file, a shard index, a text_encoder/ folder, or a model folder holding
 * text_encoder/. Reads headers only; every used tensor's name, shape and dtype is checked here, so a file
 * that opens encodes. opts may be NULL. */
h3_status h3_text_encoder_open(const char *path, const h3_te_open_opts *opts, h3_text_encoder **out);
void h3_text_encoder_close(h3_text_encoder *te);
/* Moves where the next encodes keep their activations (opts' act_place), e.g. after
 * h3_text_encoder_device_bytes has said whether the device fits. DEVICE needs a build with CUDA. */
h3_status h3_text_encoder_set_placement(h3_text_encoder *te, h3_place act_place);

const h3_te_config *h3_text_encoder_config(const h3_text_encoder *te);
/* The safetensors set the weights come from; NULL for an encoder made in memory. */
const h3_st_set *h3_text_encoder_files(const h3_text_encoder *te);
/* For people: "Qwen3-VL text encoder, official names, 64 decoder layers, bf16, config from ...". */
const char *h3_text_encoder_describe(const h3_text_encoder *te);
h3_layout h3_text_encoder_layout(const h3_text_encoder *te);

/* hidden_states[layer] of the prompt ids[0..n): out is a caller-allocated f32 tensor [n, hidden] at the
 * activation place. 0 <= layer <= n_layers; ids must lie in [0, vocab). n >= 1. */
h3_status h3_text_encoder_encode(h3_text_encoder *te, h3_exec *ex, const int32_t *ids, int64_t n, int layer,
                                 h3_tensor *out);

#define H3_TE_MAX_DEEP 8

/* A prompt with vision rows (models/vision.h makes one): the rotary positions of every row and the rows the
 * vision tower's outputs go to. */
typedef struct h3_te_mm {
    const int64_t *pos;  /* [3, n]: positions (t, h, w) per row (get_rope_index); NULL: 0..n-1 on each axis */
    const int64_t *rows; /* [n_vis] the vision rows, ascending */
    int64_t n_vis;
    const h3_tensor *embeds; /* f32 host [n_vis, hidden]: replace those rows' embeddings */
    const h3_tensor
        *deep; /* [n_deep] f32 host [n_vis, hidden]: deep[k] added to those rows after layer k
                * (hidden_states[k + 1] is taken before the addition, as transformers records it) */
    int n_deep;
} h3_te_mm;

/* h3_text_encoder_encode with vision rows (mm NULL: the text-only encode). */
h3_status h3_text_encoder_encode_mm(h3_text_encoder *te, h3_exec *ex, const int32_t *ids, int64_t n,
                                    int layer, const h3_te_mm *mm, h3_tensor *out);

/* The config.json the encoder read (NULL when the widths came from the shapes). */
const char *h3_text_encoder_config_file(const h3_text_encoder *te);

/* Device bytes h3_text_encoder_encode takes with activations on the device for n tokens up to hidden state
 * `layer` (the backend's workspace, the quantized GEMMs' scratch when a layer is quantized, two layer slots,
 * the activations and the f32 output); -1 when a layer's weights cannot be read. Headers only. */
int64_t h3_text_encoder_device_bytes(h3_text_encoder *te, int64_t n, int layer);

/* ---- layer weights: one acquire/release pair per layer ----------------------------------------------------
 */

typedef struct h3_te_layer_weights {
    h3_tensor input_norm, post_norm; /* [C] */
    h3_tensor q, k, v;               /* [heads·D, C], [kv_heads·D, C], [kv_heads·D, C] */
    h3_tensor q_norm, k_norm;        /* [D] */
    h3_tensor o;                     /* [C, heads·D] */
    h3_tensor gate, up;              /* [F, C] */
    h3_tensor down;                  /* [C, F] */
} h3_te_layer_weights;

/* Makes layer i's weights usable by ops and returns them; every acquire is matched by a release after the
 * layer's last op. Today the weights are views over the mapped file. One layer may be acquired at a time. */
h3_status h3_text_encoder_layer_acquire(h3_text_encoder *te, h3_exec *ex, int layer,
                                        const h3_te_layer_weights **w);
void h3_text_encoder_layer_release(h3_text_encoder *te, h3_exec *ex, int layer);

typedef struct h3_te_stats {
    int64_t acquires, releases; /* layer acquire/release calls since open */
    int64_t layers_run;         /* decoder layers computed */
    int64_t embedding_rows;     /* embedding rows read (one per prompt token) */
    int64_t max_layer_acquired; /* highest layer index ever acquired, -1 if none */
    int64_t bytes_read;         /* on the device: layer bytes read from the files into pinned staging */
    double read_s;              /* and the wall time of those reads */
} h3_te_stats;
void h3_text_encoder_get_stats(const h3_text_encoder *te, h3_te_stats *out);

/* Rotary tables of a text-only prompt: cos, sin [n, head_dim] (row p = position p), as the forward uses them:
 * inv_freq[j] = f32(θ^(−2j/D)), angle = f32(p · inv_freq[j]), entries j and j + D/2 equal. */
void h3_te_rope_tables(const h3_te_config *c, int64_t n, float *cos_out, float *sin_out);

/* Interleaved mRoPE tables for positions pos [3, n] (t, h, w): frequency j takes axis h when j ≡ 1 (mod 3)
 * and j < 3·section[1], w when j ≡ 2 (mod 3) and j < 3·section[2], else t; angle = f32(p_axis · inv_freq[j]).
 * With equal axes this is h3_te_rope_tables. */
void h3_te_mrope_tables(const h3_te_config *c, const int64_t *pos, int64_t n, float *cos_out, float *sin_out);

#endif

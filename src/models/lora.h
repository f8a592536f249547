/* LoRA for the DiT: reading LoRA files in every format MiniMax-H3 LoRAs are published in, normalized onto the
 * DiT's own weights, and applying them (merged into float weights, or as a low-rank side path).
 *
 * Reading (h3_lora_add_file). A LoRA safetensors file is a set of factor pairs per module: A [r, in] ("down")
 * and B [out, r] ("up"), optionally a scalar alpha. Accepted, as diffusers' MiniMaxH3LoraLoaderMixin reads
 * them (docs/LORA.md has the table):
 *   - module names: the official checkpoint's (blocks.N.attn.qkv_proj, blocks.N.attn.out_proj,
 * blocks.N.mlp.fc1, blocks.N.mlp.fc2, blocks.N.adaln_proj.linear, token_refiner.blocks.N.*, video_patch_proj,
 * audio_patch_proj, condition_proj, time_embedder.proj_in/proj_out, final_layer.adaln_proj.linear,
 * final_layer.video_out, final_layer.audio_out), bare or under `diffusion_model.` / `model.diffusion_model.`
 * (ai-toolkit, ComfyUI); musubi-tuner's / ComfyUI's flattened `lora_unet_blocks_0_attn_qkv_proj`; diffusers'
 * (transformer_blocks.N. attn.to_q/to_k/to_v/to_out.0, ff.net.0.proj, ff.net.2,
 * token_refiner.refiner_blocks.N.*, proj_in, audio_proj_in, context_embedder,
 * time_embedder.linear_1/linear_2, norm_out.linear, proj_out, audio_proj_out) under `transformer.` or bare (a
 * peft dump);
 *   - factor suffixes: .lora_A/.lora_B.weight (peft, ai-toolkit), .lora_down/.lora_up.weight (kohya, musubi),
 *     peft's .lora_A.default.weight, ComfyUI's .lora.down/.lora.up.weight and _lora.down/_lora.up.weight;
 *   - row orders: a fused qkv_proj factor is [Q; K; V] (ai-toolkit, musubi, kohya: trained on the reordered
 *     weight) except in DiffSynth-Studio's files (official names with peft's `.default.` infix), whose
 * factors are per-head interleaved like the raw checkpoint; official fc1 factors are [gate; value],
 * diffusers' ff.net.0.proj [value; gate]; split to_q/to_k/to_v factors onto a fused weight become one factor
 * each with zero rows elsewhere;
 *   - scale: strength · alpha / rank with alpha from the module's `.alpha` tensor; in a file without `.alpha`
 *     tensors from its __metadata__ `alpha` (diffusers reads this one) or `ss_network_alpha` (kohya's
 * record); otherwise alpha = rank (scale = strength), as diffusers loads alpha-less files;
 *   - factor dtypes f32, bf16, f16 (read as f32).
 * Every factor ends up in the canonical form: per DiT weight, a list of (A [r, in], B [out, r], scale) in the
 * row layout the DiT holds that weight in as opened (official per-head interleaved fused QKV, ComfyUI's
 * contiguous one, diffusers' split q/k/v; fc1 in the DiT's gate order). Refused, as H3_ERR_FORMAT naming the
 * file, the key and the fix: a key that is no LoRA factor or names no module of this DiT, a factor whose
 * shape does not fit the weight it modifies (a LoRA made for another DiT: the full one given a pruned one,
 * another width), rank 0, a non-finite alpha, an A without its B or the reverse, a `transformer_ref.` key
 * (Ref2VA's partition).
 *
 * Applying (h3_lora_apply): merged, W += Σ scale·B·A computed in f32 and rounded once to W's dtype, into
 * float weights (f32, bf16, f16); or a side path y = W·x + Σ scale·B·(A·x) after the weight's GEMM, for
 * quantized weights (int8, ConvRot, fp8, nvfp4, GGUF) or when asked. On the host the weights are views of the
 * mapped file: a merged weight becomes an owned copy of that one tensor (the file stays read-only and
 * untouched; only modified tensors cost memory). On the device (the DiT stage, models/dit_stream.h) the LoRA
 * merges into the resident units and the non-block weights as they are uploaded and takes the side path for
 * the units that stream.
 */
#ifndef H3_MODELS_LORA_H
#define H3_MODELS_LORA_H

#include <stdint.h>

#include "models/dit.h"

#define H3_MAX_LORAS 16 /* LoRA files at once */

typedef enum h3_lora_mode {
    H3_LORA_AUTO = 0, /* merge into float weights the forward reads in place, side path elsewhere */
    H3_LORA_MERGE,    /* merge everywhere; a quantized weight is an error */
    H3_LORA_SIDE,     /* side path everywhere */
} h3_lora_mode;
/* "auto", "merge", "side" -> mode; H3_ERR_INVALID naming the choices otherwise. */
h3_status h3_lora_mode_parse(const char *s, h3_lora_mode *out);

/* ---- the DiT's LoRA slots: one per linear the forward runs -----------------------------------------------
 */

enum { /* per unit (refiner blocks, then DiT blocks) */
       H3_LS_QKV = 0,
       H3_LS_Q,
       H3_LS_K,
       H3_LS_V,
       H3_LS_OUT,
       H3_LS_FC1,
       H3_LS_FC2,
       H3_LS_PER_UNIT
};
enum { /* outside the blocks */
       H3_LS_VIDEO_IN = 0,
       H3_LS_AUDIO_IN,
       H3_LS_TEXT_IN,
       H3_LS_TIME_IN,
       H3_LS_TIME_OUT,
       H3_LS_FINAL_ADALN,
       H3_LS_VIDEO_OUT,
       H3_LS_AUDIO_OUT,
       H3_LS_GLOBALS
};
static inline int h3_lora_slot_unit(const h3_dit_config *c, int unit, int role) {
    (void)c;
    return unit * H3_LS_PER_UNIT + role;
}
static inline int h3_lora_slot_adaln(const h3_dit_config *c, int block) {
    return h3_dit_n_units(c) * H3_LS_PER_UNIT + block;
}
static inline int h3_lora_slot_global(const h3_dit_config *c, int g) {
    return h3_dit_n_units(c) * H3_LS_PER_UNIT + (int)c->n_layers + g;
}
static inline int h3_lora_n_slots(const h3_dit_config *c) {
    return h3_lora_slot_global(c, H3_LS_GLOBALS);
}

/* ---- reading ------------------------------------------------------------------------------------------- */

typedef struct h3_lora_factor {
    int64_t rank;
    float *a;    /* [rank, in] */
    float *b;    /* [out, rank], rows in the layout the DiT holds the weight in as opened */
    float scale; /* strength · alpha / rank */
    int file;    /* which added file it came from */
} h3_lora_factor;

typedef struct h3_lora_target {
    int slot;       /* h3_lora_slot_* */
    char name[128]; /* the DiT weight's name as stored */
    int64_t in, out;
    int n;
    h3_lora_factor *f;
} h3_lora_target;

/* The LoRAs given for one DiT, all files together. */
typedef struct h3_lora {
    h3_lora_target *t;
    int n, cap;
    int *slot_target; /* [n_slots]: index into t, or -1 */
    int n_slots;
    int n_files;
    int qkv_interleaved;  /* the DiT's fused QKV rows were per head when read (the factors' row order) */
    int64_t factor_elems; /* Σ over factors of rank·(in + out) */
} h3_lora;

/* Reads a LoRA file (h3_open_input's rules: a regular file) for the DiT as opened (before its weights are
 * placed) and adds its factors at `strength` to l (zeroed before the first call). On failure l is as before
 * the call. */
h3_status h3_lora_add_file(h3_lora *l, const h3_dit *dit, const char *path, float strength);
/* l (freed first) becomes the n files paths[i] at strengths[i], read in order for dit; on failure l is empty. */
h3_status h3_lora_read(h3_lora *l, const h3_dit *dit, int n, const char *const *paths, const float *strengths);
void h3_lora_free(h3_lora *l);
/* Bytes of the factors as read (f32 on the host). */
int64_t h3_lora_bytes(const h3_lora *l);
/* "2 files, 28 weights, ranks 4..16, 1.2 MB of factors" (for logs and the memory report). */
const char *h3_lora_describe(const h3_lora *l, char *buf, size_t n);

/* ---- applying ------------------------------------------------------------------------------------------ */

/* Applies l to the DiT's weights where they are now: merges (mode, and for AUTO float weights) into owned
 * copies of the modified host weights, or into the weights on the device (h3_dit_upload_weights done), and
 * attaches the side path for the rest at the activation place. Call once, before the first forward; a DiT
 * opened to stream (stream_weights) keeps l (which must outlive it) and the DiT stage applies it as it places
 * the weights (h3_lora_apply_placed). H3_ERR_INVALID when MERGE meets a quantized weight, naming it. */
h3_status h3_lora_apply(h3_dit *dit, h3_exec *ex, const h3_lora *l, h3_lora_mode mode);
/* For the DiT stage: the LoRA given to a streaming DiT (NULL when none), its mode. */
const h3_lora *h3_dit_lora(const h3_dit *dit, h3_lora_mode *mode);
/* Merges the factors of unit u's slots into its placed tensors (resident on the device: writable) when they
 * are float and the mode allows, else attaches them as side factors. qkv_contiguous: the placed fused QKV is
 * [Q; K; V] whatever the file's order. Non-block weights (n = -1): into the DiT's current global tensors. */
h3_status h3_lora_apply_unit(h3_dit *dit, h3_exec *ex, int unit, h3_dit_block_weights *placed, int resident,
                             int qkv_contiguous);
/* Every slot not merged by h3_lora_apply_unit (streamed units, AdaLN projections, globals) as side factors,
 * and the non-block weights merged where float; then the side path's scratch. Called once after the units are
 * placed. A streamed unit's weights held in the activation dtype (bf16 blocks on the GPU) take the merge on
 * arrival instead of the side path, unless the mode is SIDE: their factors wait at the activation place and
 * h3_lora_merge_arrived adds them to the slot the block arrived in. */
h3_status h3_lora_apply_rest(h3_dit *dit, h3_exec *ex);
/* For the DiT stage's weight source, as streamed unit u arrives in its slot (w: the views the forward reads,
 * writable, filled afresh by every arrival): W += B·A for each of its weights that takes the merge on arrival,
 * one GEMM each into the weight as held (f32 accumulation, rounded once), queued before the forward's use. The
 * slot's bytes are the only ones written: the pinned copies and the file stay as they are. */
h3_status h3_lora_merge_arrived(h3_dit *dit, h3_exec *ex, int u, h3_dit_block_weights *w);
/* Frees the side factors and scratch (the DiT stage's close). */
void h3_lora_detach(h3_dit *dit);
/* Bytes the applied LoRA holds at the activation place (side factors and scratch) and merged copies on the
 * host. */
typedef struct h3_lora_mem {
    int64_t side;   /* side factors and the side path's scratch */
    int64_t merged; /* owned host copies of merged weights that were views of the file */
    int n_merged, n_side;
    int n_arrival; /* weights of streamed blocks merged into their slot each time the block arrives */
} h3_lora_mem;
void h3_lora_mem_of(const h3_dit *dit, h3_lora_mem *out);
/* Host bytes h3_lora_apply takes on a DiT held on the host (as opened, not streamed): the factors as read, the
 * owned copies of the float weights it would merge into (mode permitting), and the side factors of the rest. */
int64_t h3_lora_host_bytes(const h3_dit *dit, const h3_lora *l, h3_lora_mode mode);
/* What the side path of a LoRA costs at the activation place for a DiT whose every slot takes it (the
 * planner's upper bound): factors in the activation dtype plus the scratch. */
int64_t h3_lora_side_bytes(const h3_lora *l, h3_dtype act_dtype);

/* The forward's hook, after the GEMM y = x·Wᵀ of slot: y += x·Aᵀ·Bᵀ (scaled) when the slot has side factors.
 */
h3_status h3_lora_side(h3_dit *dit, h3_exec *ex, int slot, h3_tensor *y, const h3_tensor *x);

#endif

/* The MiniMax-H3 DiT ("omni transformer"): config, weights in any released layout, AdaLN precomputation, and
 * one forward over one packed sequence, written once against the op API.
 *
 * Shapes (released config; see docs/DIT.md and H3-FACTS §1):
 *   hidden H 5376, heads 56 × head_dim 128 (inner 7168), FFN F 14336, 50 blocks, 2 refiner blocks,
 *   video rows 96 (24 channels × patch 1·2·2), audio rows 32, text rows 5120.
 *
 * Weights stay in their stored dtype and, where the file's alignment allows, are views over the mapped file:
 * no layout is converted at load. The one canonical in-memory form of a block is h3_dit_block_weights below:
 *   - q, k, v: three [inner, H] matrices. diffusers stores them so; ComfyUI's fused [Q; K; V] rows give them
 * as row views. The official shards interleave the fused rows per head ([h0: q k v, h1: q k v, ...]): for
 * them qkv_interleaved is set, q/k/v are empty, and the forward multiplies by the fused matrix and takes q,
 * k, v out of its output (the per-head QK-norm and a copy read the interleaved columns with a row stride),
 * which costs a [chunk_rows, 3·inner] f32 scratch (0.18 GB at 2048 rows) instead of a 231 MB reordered copy
 * of every block's weight (12.0 GB for the release).
 *   - fc1: the fused [2F, H] matrix as stored, with gate_first = 1 for [gate; value] (official, ComfyUI) and
 * 0 for diffusers' [value; gate]; the SwiGLU op takes either order. So every layout costs zero bytes of
 * converted weights; the process holds the mapped file (page cache).
 *
 * Activations: opts.act_dtype at opts.act_place (f32 on the host; bf16 on the device, where the GEMMs and the
 * attention run on tensor cores), allocated in one place (the forward's workspace, sized by
 * h3_dit_workspace_bytes) and reused across forwards with the same row counts. The release's f32 islands (patch
 * projections, time MLP, output heads) stay f32: on the device their inputs are converted in row chunks.
 */
#ifndef H3_MODELS_DIT_H
#define H3_MODELS_DIT_H

#include <stdint.h>

#include "base/json.h"
#include "io/detect.h"
#include "tensor/ops.h"

/* ---- config ----------------------------------------------------------------------------------------------
 */

typedef struct h3_dit_config {
    int64_t hidden;           /* 5376 */
    int64_t n_layers;         /* 50 DiT blocks */
    int64_t n_refiner_layers; /* 2 token-refiner blocks */
    int64_t heads;            /* 56 */
    int64_t head_dim;         /* 128 */
    int64_t ffn;              /* 14336 */
    int64_t in_channels;      /* 24 video latent channels */
    int64_t patch[3];         /* 1, 2, 2 (t, h, w) */
    int64_t audio_dim;        /* 32 */
    int64_t text_dim;         /* 5120 */
    int64_t freq_dim;         /* 256: timestep sinusoid width (full AdaLN) */
    int64_t time_hidden;      /* 5376: time MLP inner width (full AdaLN) */
    int64_t time_embed_dim;   /* 2688; pruned: the curve basis rank (8) */
    int64_t rope_freq_dim;    /* 16 frequencies per axis: RoPE on the first 6·16 = 96 head channels */
    double rope_theta;        /* 10000 */
    double norm_eps, qk_norm_eps, final_norm_eps; /* 1e-5 */
    int adaln_pruned;   /* ComfyUI curve form: adaln_t_table + rank-r projections, no time embedder */
    int64_t curve_grid; /* pruned: rows of adaln_t_table (1025) */
} h3_dit_config;

/* The released config (H3-FACTS §1.1). */
void h3_dit_config_default(h3_dit_config *c);
/* Reads config.json in either naming (official: hidden_size, token_refiner_num_layers, ffn_hidden_size,
 * latents_dim, ...; diffusers: num_refiner_layers, ffn_dim, in_channels, ...) over the released defaults.
 * Keys of the wrong type or impossible values are errors naming `what`. */
h3_status h3_dit_config_from_json(const json_t *j, const char *what, h3_dit_config *c);
/* Positive widths, RoPE that fits the head, ... */
h3_status h3_dit_config_check(const h3_dit_config *c);
static inline int64_t h3_dit_video_dim(const h3_dit_config *c) {
    return c->in_channels * c->patch[0] * c->patch[1] * c->patch[2];
}
static inline int64_t h3_dit_inner(const h3_dit_config *c) {
    return c->heads * c->head_dim;
}

/* ---- opening ------------------------------------------------------------------------------------------- */

typedef enum h3_dit_qkv_order {
    H3_DIT_QKV_AUTO = 0,    /* official files: per-head interleaved; ComfyUI files: contiguous */
    H3_DIT_QKV_INTERLEAVED, /* fused rows [h0: q k v, h1: q k v, ...] */
    H3_DIT_QKV_CONTIGUOUS,  /* fused rows [Q; K; V] */
} h3_dit_qkv_order;

typedef struct h3_dit_open_opts {
    const char
        *config_path; /* config.json to use; NULL: the one beside the weights, else infer from shapes */
    h3_dit_qkv_order qkv_order; /* how a fused qkv_proj is ordered (AUTO decides by layout) */
    h3_place act_place;         /* where activations and modulation tables live (HOST or DEVICE) */
    h3_dtype act_dtype;         /* activation dtype; 0 (= H3_F32) picks f32 on the host, bf16 on the device */
    h3_place weight_place;      /* where weights live: HOST (mapped or owned), or DEVICE (uploaded at open, or
                                 * allocated there by h3_dit_create) */
    int64_t chunk_rows;         /* rows per FFN / fused-QKV chunk; 0: 2048 */
    int stream_weights;         /* 1: block and AdaLN weights stay at weight_place (HOST or PINNED) while activations
                                 * are on the device; a weight source (h3_dit_set_weight_source) brings them there */
} h3_dit_open_opts;

typedef struct h3_dit h3_dit;

/* Opens a DiT file, shard index or folder in the official, diffusers or ComfyUI (pruned) layout, detected
 * from tensor names. The config comes from opts->config_path, else config.json beside the weights, else the
 * file's "config" metadata, else the tensor shapes; every tensor's shape is checked against it. Quantized
 * files load in their stored format (src/quant/qload.h): ComfyUI's int8_tensorwise (+ ConvRot), float8_e4m3fn
 * and nvfp4 markers, and GGUF files (.gguf, sd.cpp's "model.diffusion_model." prefix or none); the CPU GEMM
 * decodes them panel by panel. opts may be NULL. */
h3_status h3_dit_open(const char *path, const h3_dit_open_opts *opts, h3_dit **out);
/* With opts->weight_place DEVICE, h3_dit_open binds the file's weights on the host as usual; this then replaces each
 * one by an owned copy on the device (one pass over the file). A no-op for host weights. */
/* H3_ERR_UNSUPPORTED naming the weight when some weight the device would compute with is in a form the GPU's GEMMs
 * do not take (h3_quant_gpu_supported), or quantized QKV rows are in the official per-head order; headers only, so a
 * run can refuse before loading anything. h3_dit_upload_weights and h3_dit_stream_open check it too. */
h3_status h3_dit_device_check(const h3_dit *dit);
h3_status h3_dit_upload_weights(h3_dit *dit, h3_exec *ex);
/* Replaces the four linears of every DiT block (fused qkv or q, k, v; out; fc1; fc2; not the token refiner's,
 * as in ComfyUI's files) by their quantization in format `target` (an h3_qtarget of quant/qwrite.h), computed
 * from their current values on the host in f32 and placed where they were (pool: quantizer workers, may be
 * NULL); fp8 of device weights is computed on the device (h3_cuda_quantize_fp8: the host's rule and bytes). For
 * tests and benchmarks of the quantized paths on weights made in memory; the official per-head QKV order is
 * refused. */
struct h3_pool;
h3_status h3_dit_quantize_blocks(h3_dit *dit, h3_exec *ex, int target, struct h3_pool *pool);
/* The same for DiT blocks [first, first + count) only (0 is the first after the token refiner): where in the stack
 * a format's error grows (bench_dit_cuda --quantize-blocks). */
h3_status h3_dit_quantize_block_range(h3_dit *dit, h3_exec *ex, int target, struct h3_pool *pool, int first,
                                      int count);
/* The same replacement with random stored values instead of the current ones (int8 codes with per-row scales
 * around 1e-3, ConvRot marked for int8_convrot; fp8 codes of |x| < 2 with one scale): benchmarks of speed
 * and memory at full size, where quantizing 33B values on the host would take minutes. One pool of random bytes
 * fills every block, so every block gets the same weights: another model than the bf16 one, whose outputs are
 * not comparable with it (h3_dit_quantize_blocks is). */
h3_status h3_dit_randomize_blocks_quantized(h3_dit *dit, h3_exec *ex, int target);
/* A DiT with owned weights in the canonical form (fused contiguous QKV, fc1 = [gate; value]) and the
 * release's dtypes (core_dtype for the block stack, condition_proj and AdaLN: H3_BF16 as released; the fp32
 * islands stay f32). Contents are undefined: fill them through h3_dit_visit_weights (benchmarks, tests). */
h3_status h3_dit_create(const h3_dit_config *cfg, h3_dtype core_dtype, const h3_dit_open_opts *opts,
                        h3_dit **out);
void h3_dit_close(h3_dit *dit);

const h3_dit_config *h3_dit_get_config(const h3_dit *dit);
/* What was opened, for people: "official layout, per-head interleaved QKV, full AdaLN, 535 tensors, ...". */
const char *h3_dit_describe(const h3_dit *dit);
h3_layout h3_dit_layout(const h3_dit *dit);
int h3_dit_qkv_interleaved(const h3_dit *dit);

/* Calls fn for every weight tensor under its stored name (without any file prefix); stops at a nonzero
 * return. */
typedef int (*h3_dit_weight_fn)(const char *name, h3_tensor *t, void *user);
int h3_dit_visit_weights(h3_dit *dit, h3_dit_weight_fn fn, void *user);

/* Bytes of weights: all of them, the AdaLN part (time embedder, curve table, every adaln_proj), and those
 * held in owned memory rather than mapped from the file. */
typedef struct h3_dit_weight_bytes {
    int64_t total, adaln, owned, mapped;
} h3_dit_weight_bytes;
void h3_dit_weight_bytes_of(const h3_dit *dit, h3_dit_weight_bytes *out);

/* ---- block weights: one acquire/release pair per block ----------------------------------------------------
 */

/* The core weights of one block (token-refiner blocks have the same, and never AdaLN). */
typedef struct h3_dit_block_weights {
    h3_tensor norm1, norm2;   /* [H] */
    h3_tensor q, k, v;        /* [inner, H] each; empty (data NULL) when qkv_interleaved */
    h3_tensor qkv;            /* fused [3·inner, H] as stored, when the file has one */
    int qkv_interleaved;      /* 1: use qkv, rows per-head [q k v] */
    h3_tensor q_norm, k_norm; /* [head_dim] */
    h3_tensor out;            /* [H, inner] */
    h3_tensor fc1;            /* [2F, H] */
    int gate_first;           /* fc1 = [gate; value] (1) or [value; gate] (0) */
    h3_tensor fc2;            /* [H, F] */
} h3_dit_block_weights;

/* Blocks in execution order: the n_refiner_layers token-refiner blocks, then the n_layers DiT blocks. */
static inline int h3_dit_n_units(const h3_dit_config *c) {
    return (int)(c->n_refiner_layers + c->n_layers);
}
/* Makes unit i's weights usable by ops at the activation place and returns them; every acquire is matched by
 * a release after the unit's last op. Today the weights are resident (mapped or owned) and both are
 * bookkeeping; a streamer moves them ahead of use without changing the forward. */
h3_status h3_dit_block_acquire(h3_dit *dit, h3_exec *ex, int unit, const h3_dit_block_weights **w);
void h3_dit_block_release(h3_dit *dit, h3_exec *ex, int unit);

typedef struct h3_dit_stats {
    int64_t acquires, releases; /* block acquire/release calls since open */
    int64_t adaln_passes;       /* modulation computations, i.e. reads of every AdaLN projection */
} h3_dit_stats;
void h3_dit_get_stats(const h3_dit *dit, h3_dit_stats *out);

/* ---- weights supplied by a streamer (src/mem/dit_stream.h) ------------------------------------------------ */

/* With a weight source attached, h3_dit_block_acquire/release and the modulation's reads of each block's AdaLN
 * projection go through it: it returns the weights at the activation place (resident, or copied into a ring slot
 * ahead of use) and learns when their last op is queued. */
typedef struct h3_dit_weight_source {
    h3_status (*acquire)(void *user, h3_exec *ex, int unit, const h3_dit_block_weights **w);
    void (*release)(void *user, h3_exec *ex, int unit);
    /* DiT block b's AdaLN projection: weight [18H, time_embed_dim], bias [18H] */
    h3_status (*adaln_acquire)(void *user, h3_exec *ex, int block, const h3_tensor **w, const h3_tensor **b);
    void (*adaln_release)(void *user, h3_exec *ex, int block);
    int qkv_contiguous; /* the supplied fused QKV is [Q; K; V] whatever the file's order */
    void *user;
} h3_dit_weight_source;
/* Attaches (or, with NULL, detaches) a source; the DiT keeps the pointer. No unit may be acquired. */
h3_status h3_dit_set_weight_source(h3_dit *dit, const h3_dit_weight_source *src);
/* The weights as opened (views over the file, or owned), whatever source is attached: what a streamer copies. */
const h3_dit_block_weights *h3_dit_unit_weights(const h3_dit *dit, int unit);
h3_status h3_dit_adaln_weights(const h3_dit *dit, int block, const h3_tensor **w, const h3_tensor **b);
/* The modulation's access to block b's AdaLN projection (through the source when one is attached). */
h3_status h3_dit_adaln_acquire(h3_dit *dit, h3_exec *ex, int block, const h3_tensor **w, const h3_tensor **b);
void h3_dit_adaln_release(h3_dit *dit, h3_exec *ex, int block);
/* The files the weights were opened from (NULL for h3_dit_create): a streamer reads them with pread. */
const h3_st_set *h3_dit_files(const h3_dit *dit);
/* Rows per FFN / fused-QKV / f32-island chunk (the planner's choice); frees the workspace when it changes. */
h3_status h3_dit_set_chunk_rows(h3_dit *dit, int64_t rows);
int64_t h3_dit_chunk_rows(const h3_dit *dit);
/* The blocks' joint attention: 0 (bf16 on the device, f32 on the host), H3_ATTN_FP8 (tensor/ops.h: q, k in int8,
 * v and P·V in e4m3; on the device sm_89+) or H3_ATTN_INT8 (q, k in int8, P·V in f16; sm_75+), their quantized
 * copies in arena scratch that h3_dit_forward_mem_of counts.
 * The text refiner's short attention stays exact. */
void h3_dit_set_attention(h3_dit *dit, unsigned flags);
/* h3_dit_set_attention's block-sparse mode (a DiT mode, not an op flag: the blocks call h3_op_attention_sparse). */
#define H3_ATTN_SPARSE 8u
/* H3_ATTN_SPARSE (alone: it excludes the low-bit modes): the blocks run h3_op_attention_sparse (tensor/ops.h) when a
 * forward has at least min_rows rows and its noisiest video rows' progress (h3_dit_set_sparse_shift) lies in
 * [t_start, t_end], the tiles holding text or audio rows or rows of another timestep (keyframes, references) exact
 * both ways; dense bf16 attention otherwise, and always in the split forward. The defaults are Sol-Attn's (ComfyUI's
 * BlockSparseAttention): tau 1.3, start 0.2, end 0.9, 4,096 rows. */
#define H3_DIT_SPARSE_TAU 1.3f
#define H3_DIT_SPARSE_T0 0.2f
#define H3_DIT_SPARSE_T1 0.9f
#define H3_DIT_SPARSE_MIN_ROWS 4096
h3_status h3_dit_set_sparse(h3_dit *dit, float tau, float t_start, float t_end, int64_t min_rows);
/* The window [t_start, t_end] is in the sampling's unshifted progress, as ComfyUI's start/end percent: a call at σ on
 * a schedule of shift s (σ = s·u / (1 + (s − 1)·u) for the unshifted u) is at progress 1 − u
 * (h3_dit_sparse_progress). The default shift 1 makes progress = t = 1 − σ; the pipeline gives its schedule's video
 * shift (the release's 12 keeps σ near 1 for most steps, so a window in t would start only near the end). */
h3_status h3_dit_set_sparse_shift(h3_dit *dit, double shift);
double h3_dit_sparse_progress(double shift, double t);
/* 1 when the blocks' GEMM weights (fc1 and fc2 of the first block) are float8 e4m3: their GEMMs run in fp8. */
int h3_dit_blocks_fp8(const h3_dit *dit);
unsigned h3_dit_attention(const h3_dit *dit);
h3_place h3_dit_act_place(const h3_dit *dit);
h3_dtype h3_dit_act_dtype(const h3_dit *dit);

/* ---- AdaLN modulation
 * -------------------------------------------------------------------------------------- */

/* Computes the modulation rows of every block and of the final layer for n timesteps (t = 1 − σ, in [0, 1])
 * and keeps them, replacing what was kept. Full AdaLN: sinusoid (256, cos first), time MLP, silu, then each
 * block's adaln_proj [18H, 2688]; pruned: lerp of adaln_t_table rows at t·(grid−1), then the rank-r
 * projections. Per block the rows are [n·3, 6H] (row t·3 + tag with tag 0 video, 1 text, 2 audio; columns
 * shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp), the final layer's [n, 2H] (shift, scale).
 * A forward whose timesteps are all kept reads no AdaLN parameter; one that needs others computes them (with
 * the kept ones) first. */
h3_status h3_dit_precompute_modulation(h3_dit *dit, h3_exec *ex, const float *timesteps, int n);
/* Bytes the kept modulation of n timesteps takes. */
int64_t h3_dit_modulation_bytes(const h3_dit_config *c, int n);
/* The kept table of DiT block b ([n·3, 6H]) or, for b == n_layers, the final layer's ([n, 2H]); and the kept
 * timesteps. NULL when nothing is kept or b is out of range. */
const h3_tensor *h3_dit_modulation(const h3_dit *dit, int b, const float **timesteps, int *n);

/* ---- forward
 * ------------------------------------------------------------------------------------------------ */

/* One packed sequence of S rows (diffusers' MiniMaxH3Transformer3DModel.forward without the batch axis).
 * Row data are tensors at the activation place; the layout arrays are host memory. */
typedef struct h3_dit_inputs {
    const h3_tensor *video; /* [Nv, 96] f32 patchified video rows, in video_indices order; NULL if Nv = 0 */
    const h3_tensor *audio; /* [Na, 32] f32 audio rows, in audio_indices order; NULL if Na = 0 */
    const h3_tensor *text;  /* [L, text_dim] f32 text-encoder states, in text_indices order; NULL if L = 0 */
    const float *timesteps; /* [T] distinct t = 1 − σ */
    int n_timesteps;
    int64_t seq_len;                 /* S = Nv + Na + L */
    const int32_t *timestep_indices; /* [S] row -> index into timesteps */
    const int32_t *token_tags;       /* [S] 0 video, 1 text, 2 audio */
    const double *position_ids;      /* [S, 3] (t, h, w) RoPE coordinates */
    const int32_t *video_indices;    /* [Nv] rows of the packed sequence */
    const int32_t *audio_indices;    /* [Na] */
    const int32_t *text_indices;     /* [L] */
} h3_dit_inputs;

/* Runs the DiT: video_out [Nv, 96] and audio_out [Na, 32] (f32, activation place, caller-allocated; NULL when
 * the count is 0) receive the velocities (x0 = x_t + σ·v) in the order of video_indices / audio_indices.
 * Inputs are checked first (shapes, index ranges, the three index sets partitioning 0..S−1, tags, finite
 * positions); a bad one is H3_ERR_INVALID naming the input. */
h3_status h3_dit_forward(h3_dit *dit, h3_exec *ex, const h3_dit_inputs *in, h3_tensor *video_out,
                         h3_tensor *audio_out);

struct h3_comm;
/* The same forward split over the ranks of a sequence-parallel group (Ulysses; tensor/comm.h): every rank calls it
 * with its own h3_dit (the same weights), its own exec and the same inputs. Rank r runs the DiT blocks on rows
 * [r·S/n, (r+1)·S/n) of the packed sequence; around each block's attention an all-to-all turns its rows of all
 * heads into all rows of heads/n heads and back, so attention sees the whole sequence. The input projections,
 * the text refiner and the output heads run on every rank, the rows gathered after the last block: every rank's
 * velocities are h3_dit_forward's (up to the GEMMs' rounding on fewer rows). The heads must be a multiple of n
 * (H3_ERR_INVALID otherwise). A rank that fails aborts the group (comm->abort), so the others' collectives fail
 * too instead of waiting for it; the group is unusable afterwards. */
h3_status h3_dit_forward_sp(h3_dit *dit, h3_exec *ex, struct h3_comm *comm, const h3_dit_inputs *in,
                            h3_tensor *video_out, h3_tensor *audio_out);

/* Inputs read from named tensors: the `h3run dit` file format (diffusers' forward arguments without the batch
 * axis): video [Nv, 96], audio [Na, 32], text [L, text_dim] (any float dtype, converted to f32), timesteps
 * [T] (float), position_ids [S, 3] (F64 or F32), timestep_indices [S], token_tags [S], video_indices [Nv],
 * audio_indices [Na], text_indices [L] (I64 or I32). Host memory; a missing or misshaped tensor is
 * H3_ERR_FORMAT naming it and the shape it needs. */
typedef struct h3_dit_inputs_file {
    h3_dit_inputs in; /* points into the members below */
    h3_tensor video, audio, text;
    float *timesteps;
    double *position_ids;
    int32_t *timestep_indices, *token_tags, *video_indices, *audio_indices, *text_indices;
} h3_dit_inputs_file;
h3_status h3_dit_inputs_read(const char *path, const h3_dit_config *c, h3_dit_inputs_file *out);
void h3_dit_inputs_file_free(h3_dit_inputs_file *f);

/* Activation bytes a forward allocates (its workspace) for S rows of which L text rows, Nv video and Na
 * audio; the forward's peak of H3_MEM_ACTIVATIONS equals this plus the kept modulation. */
int64_t h3_dit_workspace_bytes(const h3_dit *dit, int64_t S, int64_t L, int64_t Nv, int64_t Na);

/* What a forward and the modulation allocate at the activation place, from the arithmetic their allocations use,
 * for a chunk of rows the caller chooses (the memory planner tries several): chunk_rows 0 takes the DiT's own;
 * qkv_interleaved -1 takes the DiT's own (a weight source with contiguous QKV makes it 0). */
typedef struct h3_dit_forward_mem {
    int64_t workspace;  /* the forward's buffers, kept across forwards with the same row counts */
    int64_t scratch;    /* the most a forward holds at once on top (device: row chunks of the f32-island GEMMs) */
    int64_t inputs;     /* the caller's tensors: video [Nv, 96], audio [Na, 32], text [L, text_dim] f32 */
    int64_t outputs;    /* the caller's velocities [Nv, 96], [Na, 32] f32 */
    int64_t mod_tables; /* the modulation kept for n timesteps */
    int64_t mod_peak;   /* the most h3_dit_precompute_modulation holds at once: the tables and its scratch */
    int64_t exchange;   /* a split forward's send and receive buffers (allocated by each forward, held while the
                         * blocks run); 0 for the whole forward */
    /* the bytes this rank of a split forward receives (attention_sp): in each DiT block (q, k, v of the other ranks'
     * rows for its heads, then its rows of the other ranks' heads) and once after the blocks (the other ranks' rows
     * of the residual stream); 0 for the whole forward */
    int64_t received_block, received_end;
} h3_dit_forward_mem;
void h3_dit_forward_mem_of(const h3_dit *dit, int64_t chunk_rows, int qkv_interleaved, int64_t S, int64_t L,
                           int64_t Nv, int64_t Na, int n_timesteps, h3_dit_forward_mem *out);
/* The same for rank `rank` of a forward split over `ranks` (h3_dit_forward_sp): its workspace holds the residual
 * stream of all S rows but q, k, v, o and the chunks for its own rows (or the L text rows, if more: the refiner
 * runs whole); the low-bit attention's scratch is for all S rows of heads / ranks heads; `exchange` is the
 * Ulysses buffers, received_* the bytes it receives. ranks 1 is h3_dit_forward_mem_of. */
void h3_dit_forward_mem_sp(const h3_dit *dit, int64_t chunk_rows, int qkv_interleaved, int64_t S, int64_t L,
                           int64_t Nv, int64_t Na, int n_timesteps, int ranks, int rank, h3_dit_forward_mem *out);
/* Frees the workspace (the next forward allocates it again). */
void h3_dit_release_workspace(h3_dit *dit);
/* Frees the kept modulation (the next forward computes what it needs). With the workspace, what a stage returns
 * of its device memory before the next stage starts. */
void h3_dit_release_modulation(h3_dit *dit);

#endif

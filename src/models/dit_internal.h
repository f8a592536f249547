/* What dit.c (config, weights) and dit_forward.c (modulation, forward) share. Not a public interface. */
#ifndef H3_MODELS_DIT_INTERNAL_H
#define H3_MODELS_DIT_INTERNAL_H

#include "io/safetensors.h"
#include "models/dit.h"
#include "tensor/comm.h"


/* Weights outside the block stacks (all small next to a block). */
typedef struct h3_dit_globals {
    h3_tensor video_in_w, video_in_b;       /* [H, 96], [H] f32 */
    h3_tensor audio_in_w, audio_in_b;       /* [H, 32], [H] f32 */
    h3_tensor text_in_w, text_in_b;         /* [H, text_dim], [H] */
    h3_tensor time_in_w, time_in_b;         /* full: [time_hidden, freq_dim], [time_hidden] f32 */
    h3_tensor time_out_w, time_out_b;       /* full: [time_embed_dim, time_hidden], [time_embed_dim] f32 */
    h3_tensor curve;                        /* pruned: adaln_t_table [grid, rank] */
    h3_tensor inv_freq;                     /* [rope_freq_dim] when the file ships it */
    h3_tensor refiner_norm;                 /* [H] */
    h3_tensor final_norm;                   /* [H] */
    h3_tensor final_adaln_w, final_adaln_b; /* [2H, time_embed_dim], [2H] */
    h3_tensor video_out_w, video_out_b;     /* [96, H], [96] f32 */
    h3_tensor audio_out_w, audio_out_b;     /* [32, H], [32] f32 */
} h3_dit_globals;

/* The forward's buffers, allocated once for a set of row counts and reused. */
typedef struct h3_dit_ws {
    int64_t S, L, Nv, Na;       /* the counts they were allocated for (S == 0: none) */
    int64_t B;                  /* rows of qkv, o and the chunks: S, or a split forward's rank's (unit_rows) */
    h3_tensor x;                /* [S, H] residual stream */
    h3_tensor h;                /* [S, H] normed / modulated input of a sub-block, then its output */
    h3_tensor xt;               /* [L, H] text stream through the refiner */
    h3_tensor qkv;              /* [B, 3·inner]: q | k | v side by side (one GEMM when the weight is fused) */
    h3_tensor q, k, v;          /* [B, inner] column views of qkv (row stride 3·inner) */
    h3_tensor o;                /* [B, inner] */
    h3_tensor fused;            /* [chunk, 3·inner] per-head interleaved projection scratch (official files) */
    h3_tensor u, g;             /* [chunk, 2F], [chunk, F] FFN */
    h3_tensor cos, sin;         /* [S, 6·rope_freq_dim] */
    h3_tensor mod_idx, fin_idx; /* I32 [S]: modulation row per packed row (block tables, final table) */
    h3_tensor vidx, aidx, tidx; /* I32 [Nv], [Na], [L] */
    double *rope_pos;           /* [S, 3] positions cos/sin were computed for (a sampling run keeps them) */
} h3_dit_ws;

/* A LoRA slot's side path at the activation place (models/lora.h): y += x·Aᵀ·Bᵀ; or, for a block weight that
 * streams, the factors merged into its slot each time it arrives: W += B·A. */
typedef struct h3_dit_lside {
    h3_tensor a;  /* side path: [R, in] */
    h3_tensor b;  /* side path: [out, R], the scales folded in */
    h3_tensor mt; /* merge on arrival: Aᵀ [in, R] */
    h3_tensor mb; /* merge on arrival: [out, R], the scales folded in */
} h3_dit_lside;

struct h3_lora;

struct h3_dit {
    h3_dit_config cfg;
    h3_layout layout;
    int qkv_interleaved, gate_first;
    char *source;
    char describe[320];
    h3_st_set set;
    int have_set;
    struct h3_gguf *gguf; /* the GGUF index when the weights are a .gguf file, else NULL */
    h3_dit_globals g;
    h3_dit_block_weights *units;  /* n_refiner_layers + n_layers, execution order */
    h3_tensor *adaln_w, *adaln_b; /* [n_layers]: [18H, time_embed_dim], [18H] */
    float *inv_freq;              /* [rope_freq_dim], host */
    h3_place act_place;
    h3_dtype act_dtype; /* f32 on the host, bf16 on the device (apply_opts decides, once) */
    h3_place weight_place;
    int64_t chunk_rows;
    unsigned attn_flags; /* h3_dit_set_attention */
    /* H3_ATTN_SPARSE: h3_dit_set_sparse's rule, and during a forward whether its blocks run sparse and the tiles
     * holding text or audio rows (exact) */
    float sparse_tau, sparse_t0, sparse_t1;
    double sparse_shift; /* the schedule's video shift: the window is in unshifted progress (1 by default) */
    int64_t sparse_min_rows;
    int sparse_now;
    uint8_t *sparse_tiles;
    /* the split forward's group while h3_dit_forward_sp runs (NULL otherwise), its sequence length and buffers:
     * sp_send [3·size·share, heads/size·head_dim] (q, k, v by destination; the attention output's blocks come
     * back into its first third), sp_recv [4·S, heads/size·head_dim] (q, k, v and o of all rows, this rank's
     * heads) */
    h3_comm *sp;
    int64_t sp_S;
    h3_tensor sp_send, sp_recv;
    /* kept modulation */
    float *mod_t; /* [mod_n] timesteps */
    int mod_n;
    h3_tensor *mod; /* [n_layers + 1]: blocks [mod_n·3, 6H], then final [mod_n, 2H] */
    h3_dit_ws ws;
    h3_dit_stats stats;
    int acquired; /* units acquired and not yet released */
    /* streaming: block and AdaLN weights come from wsrc at the activation place */
    int stream_weights;
    const h3_dit_weight_source *wsrc;
    int file_qkv_interleaved; /* qkv_interleaved as opened, restored when the source is detached */
    /* LoRA (models/lora.h): what was given, the side factors by slot, their scratch, what was merged */
    const struct h3_lora *lora;
    int lora_mode;
    h3_dit_lside *lside; /* [h3_lora_n_slots] or NULL */
    h3_tensor lora_t;    /* [piece rows, max rank] side scratch at the activation place (lora_apply.c) */
    int64_t lora_merged_bytes;
    int lora_n_merged, lora_n_side, lora_n_arrival; /* merged once / side path / merged as streamed */
    uint8_t *lora_done; /* [n_slots]: merged or attached in this placement */
};

/* Host data into a tensor at the activation place: the one point where host-built layout data cross over. */
h3_status h3_dit_upload(h3_exec *ex, h3_tensor *dst, const void *host);

#endif

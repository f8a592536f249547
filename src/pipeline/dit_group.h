/* A DiT split over several GPUs (docs/ARCHITECTURE.md "Several GPUs"): the run's process is rank 0 and drives the
 * sampling; ranks 1..n-1 are worker processes (h3run's hidden command `__dit-rank`), one a GPU, each with its own CUDA
 * backend, DiT placement and streamer (as the planner planned that GPU: h3_plan.dit_gpu), joined by an NCCL group.
 * Each model call, rank 0 sends the call's inputs (the layout, the latent rows, the text states when the call brings
 * its own) to every worker over a pipe, then all ranks run h3_dit_forward_sp together; each worker answers with its
 * status. The DiT stage does this by itself when given a group (h3_dit_stage_args.group).
 *
 * A worker that fails (its DiT does not load, a forward fails, the process ends) is noticed while rank 0 waits in the
 * forward: a watchdog thread reading the workers' answers stops rank 0's group (comm->abort), so rank 0's forward
 * returns an error naming the GPU and its message instead of waiting for ever. Workers ignore Ctrl-C (rank 0 stops
 * them) and die with rank 0.
 *
 * h3_dit_group_start_local runs the same protocol with ranks as threads of this process on the host (the in-process
 * group, tensor/comm.h): what the CPU tests run. */
#ifndef H3_PIPELINE_DIT_GROUP_H
#define H3_PIPELINE_DIT_GROUP_H

#include "models/dit.h"
#include "models/video_vae.h"
#include "pipeline/plan.h"
#include "tensor/comm.h"

typedef struct h3_dit_group h3_dit_group;

/* What every rank sets its DiT and stage up from (as the run's own DiT stage: generate.c's plan_run and run_pass). */
typedef struct h3_dit_rank_setup {
    const char *dit_path; /* the DiT's file or folder, opened by every rank */
    int n_loras;
    const char *const *lora;
    const float *lora_strength;
    int lora_mode;       /* an h3_lora_mode */
    unsigned attn_flags; /* h3_dit_set_attention's (the split forward runs sparse attention dense) */
    /* the pass's plan: rank r places its DiT as plan->dit_gpu[r] (the refine pass's plan holds that pass's) within
     * its budget (plan->budgets.vram_gpu[r], or .vram), and its host share of plan->budgets.ram; NULL: every rank on
     * the host (h3_dit_group_start_local) */
    const h3_plan *plan;
    const h3_tensor *text;        /* f32 [L, text_dim] on the host: the stage's text states */
    int64_t text_rows_max, n_video_rows, n_audio_rows; /* as h3_dit_stage_args */
    const float *timesteps;                             /* the modulation kept (h3_dit_stage_args) */
    int n_timesteps;
    int verbosity; /* the workers' logging (h3_cli_setup_logging): -1 errors only, 0 normal, 1 more */
    const char *exe; /* the h3run binary the workers run (NULL: this process's own, /proc/self/exe) */
} h3_dit_rank_setup;

/* Starts n - 1 worker processes for GPUs 1..n-1 (n 2..H3_PLAN_MAX_GPUS) and joins them with rank 0 (this process,
 * GPU 0, ex its CUDA exec) in an NCCL group. Returns when every worker has its GPU and the group exists; the workers
 * then load their DiT while rank 0 loads its own, and the first call waits for them. H3_ERR_UNSUPPORTED without
 * NCCL or GPUs enough; a worker that cannot start is an error naming its GPU. */
h3_status h3_dit_group_start(int n, const h3_dit_rank_setup *su, h3_exec *ex, h3_dit_group **out);
/* The same with n ranks as threads of this process, each with its own host DiT opened from su->dit_path and its own
 * exec, joined by the in-process group (rank 0's handle is h3_dit_group_comm). su->plan must be NULL. */
h3_status h3_dit_group_start_local(int n, const h3_dit_rank_setup *su, h3_dit_group **out);
/* Rank 0's handle of the group (for h3_dit_forward_sp). */
h3_comm *h3_dit_group_comm(h3_dit_group *g);
/* 1 when H3_DIT_GROUP_ONE_GPU=1 (tests only): every rank on GPU 0, so a machine with one GPU runs the worker
 * processes up to NCCL, which refuses two ranks on one GPU: the launch, the setup and that failure's path, not the
 * split. generate then accepts more --gpus than the machine has. */
int h3_dit_group_one_gpu(void);
/* Before rank 0's share of a call: the call's inputs (host tensors, as h3_dit_stage_call takes them; text NULL: the
 * stage's) to every worker. Fails at once, with the worker's message, when one has failed. */
h3_status h3_dit_group_send(h3_dit_group *g, const h3_dit_inputs *in);
/* After rank 0's share (own: its status): waits for every worker's answer to the call. Returns own when it failed,
 * else the first worker's error (naming its GPU), else H3_OK. */
h3_status h3_dit_group_wait(h3_dit_group *g, h3_status own);
/* The DiT's calls are over: each worker closes its stage and DiT (its GPU's memory given back) and waits for
 * a video decode or the end. No answer is owed. */
h3_status h3_dit_group_end_dit(h3_dit_group *g);
/* After h3_dit_group_end_dit: every worker opens the video VAE at vae_path (opts: NULL, the file's), plans it
 * within its GPU's budget (its host share), places it and decodes its chunks of latents (host f32 [C, T, H,
 * W] or [1, C, T, H, W]) with h3_video_vae_decode_split as its rank of the group; then rank 0 runs its own
 * share with h3_dit_group_comm(g) and h3_dit_group_wait(g, own) collects the answers. Threads as ranks decode
 * on the host. */
h3_status h3_dit_group_send_decode(h3_dit_group *g, const char *vae_path, const h3_video_vae_opts *opts,
                                   const h3_tensor *latents);
/* Tells the workers to finish, waits for them (a worker that does not end within 30 s, 3 s once the group has
 * failed or was stopped mid-call, is killed) and frees g. */
void h3_dit_group_stop(h3_dit_group *g);

/* The worker process: `h3run __dit-rank` with the setup on stdin (fd 0) and its answers on fd 3; setup_logging
 * (the command's) takes the verbosity rank 0 asks for. Returns the exit status. */
int h3_dit_rank_main(void (*setup_logging)(int verbosity));

#endif

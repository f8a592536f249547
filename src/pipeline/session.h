/* A session: what h3_generate keeps between runs on the same model (h3run serve runs every job through one).
 *
 * Without a session every run finds the model's files, opens and checks every component's headers, loads the
 * tokenizer, runs the text encoder and opens each model again. With one (h3_generate_request.session), the
 * first run does that and leaves in the session:
 *   - the model's files and the checks of how its parts fit (preflight),
 *   - the tokenizer,
 *   - the text encoder, opened, and the text states of the most recent prompts (H3_SESSION_PROMPTS by
 * default): a prompt seen again skips the text encoder altogether,
 *   - the DiT, opened as the device wants it (on the CPU with its owned weight copies; on a GPU the headers),
 *   - on a GPU, the device backend (h3_cuda_init once: its arena the device budget), and the DiT's placement
 *     (its non-block weights, resident blocks and slots on the device, the pinned copies of the streamed
 *     ones) when the plan says the other stages fit beside it: a run whose plan places the DiT alike starts
 *     its steps without loading a weight (H3_REUSED_DIT_PLACEMENT); any other run gives it back first; when
 *     only the host side fits beside the other stages, the pinned copies alone, which the next run's pinned
 *     blocks adopt instead of reading them again (H3_REUSED_DIT_PINNED),
 *   - the audio VAE (its weight norm folded once) and the video VAE.
 * A run on another model (other paths, another device) drops everything kept first. Each run's result says
 * what it reused (h3_generate_result.reused).
 *
 * Threads: one h3_generate at a time runs on a session (a second waits); h3_generate_check may run beside it
 * (it shares only the files, the preflight and the tokenizer, under the session's lock).
 */
#ifndef H3_PIPELINE_SESSION_H
#define H3_PIPELINE_SESSION_H

#include <pthread.h>
#include <stdint.h>

#include "base/status.h"
#include "io/tokenizer.h"
#include "pipeline/generate.h"
#include "models/audio_vae.h"
#include "mem/report.h"
#include "models/dit.h"
#include "models/dit_stream.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

#define H3_SESSION_PROMPTS 16 /* text states of this many recent prompts are kept */

/* What a run took from its session instead of loading it (h3_generate_result.reused, bits). */
enum {
    H3_REUSED_FILES = 1 << 0,        /* the model's files found and checked (preflight) */
    H3_REUSED_TOKENIZER = 1 << 1,    /* the tokenizer */
    H3_REUSED_TEXT_ENCODER = 1 << 2, /* the text encoder, opened */
    H3_REUSED_PROMPT = 1 << 3,       /* the prompt's text states: the text encoder did not run */
    H3_REUSED_DIT = 1 << 4,          /* the DiT, opened (on the CPU: its weights) */
    H3_REUSED_AUDIO_VAE = 1 << 5,
    H3_REUSED_VIDEO_VAE = 1 << 6,
    H3_REUSED_DIT_PLACEMENT = 1 << 7, /* the DiT's weights placed on the device (no weight loaded for it) */
    H3_REUSED_DIT_PINNED = 1 << 8,    /* the pinned copies of the DiT's streamed blocks (not read again) */
    H3_REUSED_COUNT = 9
};
/* "files", "tokenizer", "text_encoder", "prompt", "dit", "audio_vae", "video_vae", "dit_placement",
 * "dit_pinned" (bit i). */
const char *h3_reused_name(int bit);

typedef struct h3_session_prompt {
    char *prompt;     /* h3_malloc'd */
    h3_tensor hidden; /* f32 [L, hidden] on the host */
    uint64_t used;    /* the session's clock when it was last used */
} h3_session_prompt;

/* The members are the pipeline's (generate.c fills and reads them); callers only create and free. */
typedef struct h3_session {
    pthread_mutex_t lock;     /* the files, the preflight and the tokenizer (shared with h3_generate_check) */
    pthread_mutex_t run_lock; /* one h3_generate at a time */
    char *key;                /* the model's paths and the device the kept objects were opened for */
    int have_files;
    h3_model_files files;
    int preflight_ok;
    int64_t te_vocab, te_positions;
    h3_tokenizer *tok;
    h3_text_encoder *te;
    /* the text encoder's per-layer callback, set by the run that encodes (the encoder is opened once) */
    int (*on_layer)(void *user, int done, int total);
    void *on_layer_user;
    h3_dit *dit;
    int dit_device; /* opened for the device's plan (stream options) rather than on the host */
    h3_audio_vae *avae;
    h3_video_vae *vvae;
    /* the runs' executor (ex_threads: the threads asked for), and on a GPU its backend (cuda_on, the arena
     * cuda_budget bytes), kept up between runs */
    h3_exec ex;
    int have_ex, ex_threads, cuda_on;
    int64_t cuda_budget;
    /* the DiT's placement kept from the last run (on dit, without LoRAs; the backend up), and its device
     * bytes per category */
    h3_dit_stream *dit_stream;
    int64_t dit_stream_dev[H3_DEVCAT_COUNT];
    /* or, when the placement could not stay, the pinned copies of its streamed blocks (n 0: none) */
    h3_pinned_cache dit_pinned;
    int max_prompts, n_prompts;
    h3_session_prompt prompts[H3_SESSION_PROMPTS];
    uint64_t clock;
} h3_session;

/* prompts: text states kept (0: H3_SESSION_PROMPTS; at most that). */
h3_status h3_session_new(int prompts, h3_session **out);
void h3_session_free(h3_session *s);
/* Drops everything kept (the next run loads again). The caller holds both locks or knows no run is on. */
void h3_session_drop(h3_session *s);
/* Gives the kept DiT placement back (the backend stays up); with backend, the backend too. Under the run's
 * lock. */
void h3_session_release_device(h3_session *s, int backend);
/* Closes the session's DiT (its kept placement first). Under the run's lock. */
void h3_session_close_dit(h3_session *s);

/* The text states kept for this prompt, copied into *hidden (allocated here); 0 when none are kept. Under the
 * caller's run. */
int h3_session_prompt_get(h3_session *s, const char *prompt, h3_tensor *hidden);
/* Keeps a copy of the prompt's states, replacing the least recently used entry when full. */
h3_status h3_session_prompt_put(h3_session *s, const char *prompt, const h3_tensor *hidden);

#endif

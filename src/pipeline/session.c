/* What runs keep between them (session.h): the objects themselves; generate.c decides when to use them. */
#include "pipeline/session.h"

#include <string.h>

#include "base/alloc.h"
#include "cuda/cuda.h"

static const char *const g_reused_names[H3_REUSED_COUNT] = {
    "files", "tokenizer", "text_encoder", "prompt", "dit", "audio_vae", "video_vae", "dit_placement",
    "dit_pinned"};

const char *h3_reused_name(int bit) {
    return bit >= 0 && bit < H3_REUSED_COUNT ? g_reused_names[bit] : "?";
}

h3_status h3_session_new(int prompts, h3_session **out) {
    *out = NULL;
    if (prompts < 0 || prompts > H3_SESSION_PROMPTS)
        return H3_ERR(H3_ERR_INVALID, "a session keeps 0 to %d prompts' text states; got %d",
                      H3_SESSION_PROMPTS, prompts);
    h3_session *s = h3_calloc(1, sizeof *s, H3_MEM_OTHER);
    if (!s) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->run_lock, NULL);
    s->max_prompts = prompts ? prompts : H3_SESSION_PROMPTS;
    *out = s;
    return H3_OK;
}

void h3_session_release_device(h3_session *s, int backend) {
    if (!s) return;
    h3_dit_stream_close(s->dit_stream); /* the backend is up while a placement is kept */
    s->dit_stream = NULL;
    memset(s->dit_stream_dev, 0, sizeof s->dit_stream_dev);
    h3_pinned_cache_free(&s->dit_pinned); /* pinned memory: while its backend is up */
    if (backend && s->cuda_on) {
        h3_cuda_shutdown(&s->ex);
        s->cuda_on = 0;
        s->cuda_budget = 0;
    }
}

void h3_session_close_dit(h3_session *s) {
    h3_session_release_device(s, 0);
    h3_dit_close(s->dit);
    s->dit = NULL;
    s->dit_device = 0;
}

void h3_session_drop(h3_session *s) {
    if (!s) return;
    h3_session_release_device(s, 1);
    h3_free(s->key);
    s->key = NULL;
    if (s->have_files) h3_model_files_free(&s->files);
    s->have_files = 0;
    s->preflight_ok = 0;
    h3_tokenizer_free(s->tok);
    s->tok = NULL;
    h3_text_encoder_close(s->te);
    s->te = NULL;
    h3_session_close_dit(s);
    h3_audio_vae_close(s->avae);
    s->avae = NULL;
    h3_video_vae_close(s->vvae);
    s->vvae = NULL;
    for (int i = 0; i < s->n_prompts; i++) {
        h3_free(s->prompts[i].prompt);
        h3_tensor_free(&s->prompts[i].hidden);
    }
    s->n_prompts = 0;
    if (s->have_ex) h3_exec_free(&s->ex);
    s->have_ex = 0;
}

void h3_session_free(h3_session *s) {
    if (!s) return;
    h3_session_drop(s);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->run_lock);
    h3_free(s);
}

static h3_status copy_host(h3_tensor *dst, const h3_tensor *src) {
    H3_TRY(h3_tensor_alloc2(dst, H3_PLACE_HOST, H3_F32, src->shape[0], src->shape[1], H3_MEM_ACTIVATIONS));
    memcpy(dst->data, src->data, (size_t)h3_tensor_numel(src) * sizeof(float));
    return H3_OK;
}

int h3_session_prompt_get(h3_session *s, const char *prompt, h3_tensor *hidden) {
    for (int i = 0; i < s->n_prompts; i++)
        if (!strcmp(s->prompts[i].prompt, prompt)) {
            if (copy_host(hidden, &s->prompts[i].hidden) != H3_OK) {
                h3_clear_error(); /* out of memory: the text encoder runs instead */
                return 0;
            }
            s->prompts[i].used = ++s->clock;
            return 1;
        }
    return 0;
}

h3_status h3_session_prompt_put(h3_session *s, const char *prompt, const h3_tensor *hidden) {
    if (hidden->ndim != 2 || hidden->dtype != H3_F32 || hidden->place != H3_PLACE_HOST)
        return H3_ERR(H3_ERR_INTERNAL, "the session keeps f32 [L, hidden] text states on the host");
    int slot = s->n_prompts;
    if (slot == s->max_prompts) { /* the least recently used goes */
        slot = 0;
        for (int i = 1; i < s->n_prompts; i++)
            if (s->prompts[i].used < s->prompts[slot].used) slot = i;
        h3_free(s->prompts[slot].prompt);
        h3_tensor_free(&s->prompts[slot].hidden);
        s->prompts[slot] = s->prompts[--s->n_prompts];
        slot = s->n_prompts;
    }
    h3_session_prompt *e = &s->prompts[slot];
    memset(e, 0, sizeof *e);
    e->prompt = h3_strdup(prompt);
    if (!e->prompt) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_status st = copy_host(&e->hidden, hidden);
    if (st != H3_OK) {
        h3_free(e->prompt);
        e->prompt = NULL;
        return st;
    }
    e->used = ++s->clock;
    s->n_prompts++;
    return H3_OK;
}

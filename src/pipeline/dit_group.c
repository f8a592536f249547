/* A DiT split over several GPUs: rank 0 (the run) and its workers (pipeline/dit_group.h). The messages are the
 * process's own structs and arrays in its byte order (every rank is the same binary on the same machine). */
#define _GNU_SOURCE /* pipe2 */
#include "pipeline/dit_group.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/cancel.h"
#include "base/log.h"
#include "cuda/cuda.h"
#include "models/lora.h"
#include "models/video_vae.h"
#include "pipeline/stages.h"

extern char **environ;

enum {
    MAGIC_SETUP = 0x50533348,  /* "H3SP" */
    MAGIC_CALL = 0x4c4c4143,   /* "CALL" */
    MAGIC_QUIT = 0x54495551,   /* "QUIT" */
    MAGIC_UP = 0x20205055,     /* "UP  ": the worker has its GPU */
    MAGIC_READY = 0x20594452,  /* "RDY ": its DiT is placed and its stage open */
    MAGIC_DONE = 0x454e4f44,   /* "DONE": a call's (or a decode's) answer */
    MAGIC_ENDDIT = 0x54494445, /* "EDIT": the DiT's calls are over */
    MAGIC_DECODE = 0x45444f43, /* "CODE": a video decode */
    VERSION = 1,
    REPLY_FD = 3, /* the worker's answers */
};

typedef struct setup_hdr {
    uint32_t magic, version;
    int32_t rank, size, device, have_plan, have_time, lora_mode, n_loras, n_timesteps, verbosity;
    uint32_t attn_flags, pad;
    int64_t text_rows, text_dim, text_rows_max, n_video_rows, n_audio_rows;
    unsigned char id[128];
    h3_plan_budgets budgets; /* vram: this rank's */
    h3_device_figures fig;
    h3_dit_plan plan; /* this rank's */
} setup_hdr;

typedef struct call_hdr {
    uint32_t magic;
    int32_t n_timesteps, has_text, pad;
    int64_t S, Nv, Na, L, text_rows, text_dim;
} call_hdr;

typedef struct decode_hdr {
    uint32_t magic, pad;
    int64_t shape[4]; /* the latents [C, T, H, W] */
    h3_video_vae_opts opts;
} decode_hdr;

typedef struct reply_hdr {
    uint32_t magic;
    int32_t status;
    uint32_t len, pad;
} reply_hdr;

/* ---- bytes over pipes ------------------------------------------------------------------------------------- */

/* The channels are stream sockets (socketpair): a send to a rank that is gone fails with EPIPE instead of
 * raising SIGPIPE in the run's process. */
static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        const ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* 0 when all n bytes came; -1 at the end of the stream or on an error. */
static int read_all(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {
        const ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

/* A worker's two directions, each fds[1] writing and fds[0] reading: to the worker and back. 0, or -1 with errno
 * set and nothing left open. */
static int channels(int to[2], int from[2]) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, to) != 0) return -1;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, from) == 0) return 0;
    const int e = errno;
    close(to[0]);
    close(to[1]);
    errno = e;
    return -1;
}

static int write_str(int fd, const char *s) {
    const uint32_t n = s ? (uint32_t)strlen(s) : 0;
    return write_all(fd, &n, sizeof n) || (n && write_all(fd, s, n)) ? -1 : 0;
}

/* A string of at most 64 KiB, allocated. */
static char *read_str(int fd) {
    uint32_t n = 0;
    if (read_all(fd, &n, sizeof n) || n > 65536) return NULL;
    char *s = h3_malloc(n + 1, H3_MEM_OTHER);
    if (!s) return NULL;
    if (n && read_all(fd, s, n)) {
        h3_free(s);
        return NULL;
    }
    s[n] = 0;
    return s;
}

static int write_reply(int fd, uint32_t magic, h3_status st) {
    const char *msg = st == H3_OK ? "" : h3_last_error();
    reply_hdr h = {magic, (int32_t)st, (uint32_t)strlen(msg), 0};
    return write_all(fd, &h, sizeof h) || write_all(fd, msg, h.len) ? -1 : 0;
}

/* ---- the group (rank 0) ----------------------------------------------------------------------------------- */

typedef struct worker {
    int to, from; /* rank 0's ends of the pipes */
    pid_t pid;    /* a process (0: a thread) */
    pthread_t th;
    int have_thread;
    int pending; /* answers owed: the readiness, then one a call */
    int dead;    /* its stream of answers ended */
    h3_status err;
    char msg[768];
} worker;

struct h3_dit_group {
    int n, local;
    worker w[H3_PLAN_MAX_GPUS];
    h3_comm comm;                            /* rank 0's (processes: NCCL) */
    h3_comm local_ranks[H3_PLAN_MAX_GPUS];   /* threads: every rank's handle of the in-process group */
    int have_comm;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t watch;
    int have_watch, wake[2], stopping;
    int failed; /* a worker failed: the group is stopped */
    const char *task; /* what the workers run, for errors: "the DiT", then "the video VAE" */
};

h3_comm *h3_dit_group_comm(h3_dit_group *g) {
    return g->local ? &g->local_ranks[0] : &g->comm;
}

/* Marks worker r failed (under g->mu) and stops rank 0's group, so a forward waiting for it returns. */
static void fail_worker(h3_dit_group *g, int r, h3_status st, const char *msg) {
    worker *w = &g->w[r];
    if (w->err == H3_OK) {
        w->err = st == H3_OK ? H3_ERR_DEVICE : st;
        snprintf(w->msg, sizeof w->msg, "%s", msg);
    }
    if (!g->failed) {
        g->failed = 1;
        h3_comm *c = h3_dit_group_comm(g);
        if (g->have_comm && c->abort) c->abort(c);
    }
}

/* The watchdog: reads every worker's answers while rank 0 computes. */
static void *watch_main(void *arg) {
    h3_dit_group *g = arg;
    for (;;) {
        struct pollfd pf[H3_PLAN_MAX_GPUS + 1];
        int idx[H3_PLAN_MAX_GPUS + 1], k = 0;
        pf[k].fd = g->wake[0];
        pf[k].events = POLLIN;
        idx[k++] = -1;
        pthread_mutex_lock(&g->mu);
        const int stopping = g->stopping;
        for (int r = 1; r < g->n; r++)
            if (!g->w[r].dead) {
                pf[k].fd = g->w[r].from;
                pf[k].events = POLLIN;
                idx[k++] = r;
            }
        pthread_mutex_unlock(&g->mu);
        if (stopping || k == 1) break;
        if (poll(pf, (nfds_t)k, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[0].revents) break; /* h3_dit_group_stop */
        for (int i = 1; i < k; i++) {
            if (!pf[i].revents) continue;
            const int r = idx[i];
            reply_hdr h;
            char msg[768] = "";
            int ok = read_all(g->w[r].from, &h, sizeof h) == 0;
            if (ok) {
                const uint32_t keep = h.len < sizeof msg - 1 ? h.len : (uint32_t)sizeof msg - 1;
                ok = read_all(g->w[r].from, msg, keep) == 0;
                msg[ok ? keep : 0] = 0;
                for (uint32_t rest = h.len - keep; ok && rest > 0; rest--) { /* a longer message: the rest dropped */
                    char c;
                    ok = read_all(g->w[r].from, &c, 1) == 0;
                }
            }
            pthread_mutex_lock(&g->mu);
            worker *w = &g->w[r];
            if (!ok) {
                w->dead = 1;
                if (!g->stopping)
                    fail_worker(g, r, H3_ERR_DEVICE,
                                "its process ended without an answer (see its messages above; out of memory?)");
                w->pending = 0;
            } else {
                if (w->pending > 0) w->pending--;
                if (h.status != H3_OK) fail_worker(g, r, (h3_status)h.status, msg);
            }
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
        }
    }
    return NULL;
}

/* The first failed worker's error (g->mu not held: taken here). */
static h3_status group_error(h3_dit_group *g) {
    char msg[768] = "";
    h3_status err = H3_OK;
    int who = 0;
    pthread_mutex_lock(&g->mu);
    for (int r = 1; r < g->n && err == H3_OK; r++)
        if (g->w[r].err != H3_OK) {
            err = g->w[r].err;
            who = r;
            snprintf(msg, sizeof msg, "%s", g->w[r].msg[0] ? g->w[r].msg : "failed");
        }
    pthread_mutex_unlock(&g->mu);
    if (err != H3_OK) return H3_ERR(err, "%s on GPU %d: %s", g->task, who, msg);
    return H3_ERR(H3_ERR_INTERRUPTED, "the GPUs' group was stopped");
}

int h3_dit_group_one_gpu(void) {
    const char *e = getenv("H3_DIT_GROUP_ONE_GPU");
    return e && !strcmp(e, "1");
}

/* The setup of rank r. */
static int send_setup(int fd, int r, int n, const unsigned char id[128], const h3_dit_rank_setup *su) {
    setup_hdr *h = h3_calloc(1, sizeof *h, H3_MEM_OTHER);
    if (!h) return -1;
    h->magic = MAGIC_SETUP;
    h->version = VERSION;
    h->rank = r;
    h->size = n;
    h->device = h3_dit_group_one_gpu() ? 0 : r;
    h->have_plan = su->plan != NULL;
    h->lora_mode = su->lora_mode;
    h->n_loras = su->n_loras;
    h->n_timesteps = su->n_timesteps;
    h->verbosity = su->verbosity;
    h->attn_flags = su->attn_flags;
    h->text_rows = su->text ? su->text->shape[0] : 0;
    h->text_dim = su->text ? su->text->shape[1] : 0;
    h->text_rows_max = su->text_rows_max;
    h->n_video_rows = su->n_video_rows;
    h->n_audio_rows = su->n_audio_rows;
    if (id) memcpy(h->id, id, 128);
    if (su->plan) {
        h->have_time = su->plan->have_time;
        h->budgets = su->plan->budgets;
        if (su->plan->budgets.vram_gpu[r] > 0) h->budgets.vram = su->plan->budgets.vram_gpu[r];
        if (h->budgets.ram > 0) h->budgets.ram /= n;
        h->fig = su->plan->fig;
        h->plan = su->plan->dit_gpu[r];
    }
    int bad = write_all(fd, h, sizeof *h) || write_str(fd, su->dit_path);
    h3_free(h);
    for (int i = 0; !bad && i < su->n_loras; i++)
        bad = write_str(fd, su->lora[i]) || write_all(fd, &su->lora_strength[i], sizeof(float));
    if (!bad && su->n_timesteps) bad = write_all(fd, su->timesteps, (size_t)su->n_timesteps * sizeof(float));
    if (!bad && su->text && su->text->shape[0] > 0)
        bad = write_all(fd, su->text->data, (size_t)h3_tensor_numel(su->text) * sizeof(float));
    return bad ? -1 : 0;
}

static h3_status group_alloc(int n, const h3_dit_rank_setup *su, h3_dit_group **out) {
    *out = NULL;
    if (n < 2 || n > H3_PLAN_MAX_GPUS)
        return H3_ERR(H3_ERR_INVALID, "a DiT splits over 2 to %d GPUs; got %d", H3_PLAN_MAX_GPUS, n);
    if (!su->dit_path) return H3_ERR(H3_ERR_INVALID, "the GPUs' group needs the DiT's path");
    if (su->text && (su->text->dtype != H3_F32 || su->text->ndim != 2 || su->text->place != H3_PLACE_HOST ||
                     !h3_tensor_is_contiguous(su->text)))
        return H3_ERR(H3_ERR_INVALID, "the GPUs' group takes the text states as contiguous f32 rows on the host");
    h3_dit_group *g = h3_calloc(1, sizeof *g, H3_MEM_OTHER);
    if (!g) return H3_ERR_NOMEM;
    g->n = n;
    g->task = "the DiT";
    g->wake[0] = g->wake[1] = -1;
    for (int r = 0; r < H3_PLAN_MAX_GPUS; r++) g->w[r].to = g->w[r].from = -1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pipe2(g->wake, O_CLOEXEC) != 0) {
        h3_dit_group_stop(g);
        return H3_ERR(H3_ERR_IO, "creating a pipe: %s", strerror(errno));
    }
    *out = g;
    return H3_OK;
}

/* Reads worker r's first answer (that it has its GPU) before the watchdog runs. */
static h3_status await_up(h3_dit_group *g, int r) {
    reply_hdr h;
    char msg[768] = "";
    if (read_all(g->w[r].from, &h, sizeof h) != 0 || h.magic != MAGIC_UP)
        return H3_ERR(H3_ERR_DEVICE, "the DiT's process for GPU %d ended before it started (see its messages)", r);
    const uint32_t keep = h.len < sizeof msg - 1 ? h.len : (uint32_t)sizeof msg - 1;
    if (read_all(g->w[r].from, msg, keep) != 0)
        return H3_ERR(H3_ERR_DEVICE, "the DiT's process for GPU %d ended before it started", r);
    msg[keep] = 0;
    for (uint32_t rest = h.len - keep; rest > 0; rest--) {
        char c;
        if (read_all(g->w[r].from, &c, 1) != 0) break;
    }
    if (h.status != H3_OK) return H3_ERR((h3_status)h.status, "GPU %d: %s", r, msg);
    return H3_OK;
}

static h3_status start_watch(h3_dit_group *g) {
    for (int r = 1; r < g->n; r++) g->w[r].pending = 1; /* the readiness */
    if (pthread_create(&g->watch, NULL, watch_main, g) != 0)
        return H3_ERR(H3_ERR_INTERNAL, "starting the GPUs' watchdog thread failed");
    g->have_watch = 1;
    return H3_OK;
}

h3_status h3_dit_group_start(int n, const h3_dit_rank_setup *su, h3_exec *ex, h3_dit_group **out) {
    if (!su->plan) return H3_ERR(H3_ERR_INVALID, "a DiT on several GPUs needs their plan");
    if (h3_cuda_device_count() < n && !h3_dit_group_one_gpu())
        return H3_ERR(H3_ERR_UNSUPPORTED, "--gpus %d: this machine has %d GPU%s", n, h3_cuda_device_count(),
                      h3_cuda_device_count() == 1 ? "" : "s");
    unsigned char id[128];
    H3_TRY(h3_cuda_comm_unique_id(id));
    h3_dit_group *g;
    H3_TRY(group_alloc(n, su, &g));
    h3_status st = H3_OK;
    for (int r = 1; r < n; r++) {
        int to[2], from[2];
        if (channels(to, from) != 0) H3_FAIL(H3_ERR_IO, "creating a channel: %s", strerror(errno));
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, to[0], 0);
        posix_spawn_file_actions_adddup2(&fa, from[1], REPLY_FD);
        char *av[] = {"h3run", "__dit-rank", NULL};
        const int e = posix_spawn(&g->w[r].pid, su->exe ? su->exe : "/proc/self/exe", &fa, NULL, av, environ);
        posix_spawn_file_actions_destroy(&fa);
        close(to[0]);
        close(from[1]);
        g->w[r].to = to[1];
        g->w[r].from = from[0];
        if (e != 0) {
            g->w[r].pid = 0;
            H3_FAIL(H3_ERR_IO, "starting the DiT's process for GPU %d: %s", r, strerror(e));
        }
        if (send_setup(g->w[r].to, r, n, id, su) != 0)
            H3_FAIL(H3_ERR_IO, "the DiT's process for GPU %d did not take its setup", r);
    }
    for (int r = 1; r < n; r++) H3_CHECK(await_up(g, r));
    /* every worker waits in NCCL's setup for rank 0 now */
    H3_CHECK_CTX(h3_cuda_comm_create(ex, 0, n, id, &g->comm), "joining the GPUs' NCCL group");
    g->have_comm = 1;
    H3_CHECK(start_watch(g));
    h3_log(H3_LOG_INFO, "DiT: split over %d GPUs (sequence parallel over NCCL); the workers place their blocks", n);
    *out = g;
    return H3_OK;
done:
    h3_dit_group_stop(g);
    return st;
}

/* ---- a worker ------------------------------------------------------------------------------------------- */

typedef struct rank_setup {
    setup_hdr h;
    char *dit_path;
    char *lora[H3_MAX_LORAS];
    float strength[H3_MAX_LORAS];
    float *timesteps;
    h3_tensor text;
} rank_setup;

static void rank_setup_free(rank_setup *s) {
    h3_free(s->dit_path);
    for (int i = 0; i < H3_MAX_LORAS; i++) h3_free(s->lora[i]);
    h3_free(s->timesteps);
    h3_tensor_free(&s->text);
    memset(s, 0, sizeof *s);
}

static h3_status read_setup(int fd, rank_setup *s) {
    memset(s, 0, sizeof *s);
    if (read_all(fd, &s->h, sizeof s->h) != 0 || s->h.magic != MAGIC_SETUP || s->h.version != VERSION)
        return H3_ERR(H3_ERR_FORMAT, "a DiT worker's setup did not come (it is started by h3run, not by hand)");
    if (s->h.n_loras < 0 || s->h.n_loras > H3_MAX_LORAS || s->h.n_timesteps < 0 || s->h.n_timesteps > 100000 ||
        s->h.text_rows < 0 || s->h.text_dim < 0 || s->h.text_rows > (1 << 20) || s->h.text_dim > (1 << 16))
        return H3_ERR(H3_ERR_FORMAT, "a DiT worker's setup is malformed");
    s->dit_path = read_str(fd);
    if (!s->dit_path) return H3_ERR(H3_ERR_FORMAT, "a DiT worker's setup ended early");
    for (int i = 0; i < s->h.n_loras; i++) {
        s->lora[i] = read_str(fd);
        if (!s->lora[i] || read_all(fd, &s->strength[i], sizeof(float)) != 0)
            return H3_ERR(H3_ERR_FORMAT, "a DiT worker's setup ended early");
    }
    if (s->h.n_timesteps) {
        s->timesteps = h3_malloc((size_t)s->h.n_timesteps * sizeof(float), H3_MEM_OTHER);
        if (!s->timesteps) return H3_ERR_NOMEM;
        if (read_all(fd, s->timesteps, (size_t)s->h.n_timesteps * sizeof(float)) != 0)
            return H3_ERR(H3_ERR_FORMAT, "a DiT worker's setup ended early");
    }
    if (s->h.text_rows > 0) {
        H3_TRY(h3_tensor_alloc2(&s->text, H3_PLACE_HOST, H3_F32, s->h.text_rows, s->h.text_dim, H3_MEM_ACTIVATIONS));
        if (read_all(fd, s->text.data, (size_t)h3_tensor_numel(&s->text) * sizeof(float)) != 0)
            return H3_ERR(H3_ERR_FORMAT, "a DiT worker's setup ended early");
    }
    return H3_OK;
}

/* A call's inputs, in buffers kept across calls (grown when a call is larger). */
typedef struct call_buf {
    call_hdr h;
    float *timesteps;
    int32_t *tidx, *tags, *vidx, *aidx, *xidx;
    double *pos;
    h3_tensor video, audio, text, vout, aout;
    size_t cap[6];
} call_buf;

static void call_buf_free(call_buf *b) {
    h3_free(b->timesteps);
    h3_free(b->tidx);
    h3_free(b->tags);
    h3_free(b->vidx);
    h3_free(b->aidx);
    h3_free(b->xidx);
    h3_free(b->pos);
    h3_tensor *t[] = {&b->video, &b->audio, &b->text, &b->vout, &b->aout};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) h3_tensor_free(t[i]);
    memset(b, 0, sizeof *b);
}

static int read_into(int fd, void **p, size_t n) {
    h3_free(*p);
    *p = h3_malloc(n + 8, H3_MEM_ACTIVATIONS);
    return *p && (n == 0 || read_all(fd, *p, n) == 0) ? 0 : -1;
}

/* A host tensor of rows x cols f32 (reallocated when its shape changes), filled from fd. */
static int read_rows(int fd, h3_tensor *t, int64_t rows, int64_t cols, int fill) {
    if (rows <= 0) return 0;
    if (!t->data || t->shape[0] != rows || t->shape[1] != cols) {
        h3_tensor_free(t);
        if (h3_tensor_alloc2(t, H3_PLACE_HOST, H3_F32, rows, cols, H3_MEM_ACTIVATIONS) != H3_OK) return -1;
    }
    return fill ? read_all(fd, t->data, (size_t)(rows * cols) * sizeof(float)) : 0;
}

/* 1: a call read; 2: the DiT's calls are over (ENDDIT); 0: the end (QUIT or the stream closed); -1:
 * malformed. */
static int read_call(int fd, call_buf *b, const h3_dit_config *c) {
    if (read_all(fd, &b->h, sizeof b->h) != 0 || b->h.magic == MAGIC_QUIT) return 0;
    if (b->h.magic == MAGIC_ENDDIT) return 2;
    const call_hdr *h = &b->h;
    if (h->magic != MAGIC_CALL || h->S < 1 || h->Nv < 0 || h->Na < 0 || h->L < 0 || h->Nv + h->Na + h->L != h->S ||
        h->S > ((int64_t)1 << 26) || h->n_timesteps < 1 || h->n_timesteps > 100000 || h->text_rows < 0 ||
        h->text_rows > (1 << 20) || h->text_dim < 0 || h->text_dim > (1 << 16))
        return -1;
    const size_t S = (size_t)h->S;
    if (read_into(fd, (void **)&b->timesteps, (size_t)h->n_timesteps * sizeof(float)) ||
        read_into(fd, (void **)&b->tidx, S * 4) || read_into(fd, (void **)&b->tags, S * 4) ||
        read_into(fd, (void **)&b->pos, S * 3 * sizeof(double)) ||
        read_into(fd, (void **)&b->vidx, (size_t)h->Nv * 4) || read_into(fd, (void **)&b->aidx, (size_t)h->Na * 4) ||
        read_into(fd, (void **)&b->xidx, (size_t)h->L * 4))
        return -1;
    if (read_rows(fd, &b->video, h->Nv, h3_dit_video_dim(c), 1) || read_rows(fd, &b->audio, h->Na, c->audio_dim, 1) ||
        read_rows(fd, &b->vout, h->Nv, h3_dit_video_dim(c), 0) || read_rows(fd, &b->aout, h->Na, c->audio_dim, 0))
        return -1;
    if (h->has_text && read_rows(fd, &b->text, h->text_rows, h->text_dim, 1)) return -1;
    return 1;
}

/* A worker's share of a video decode (d read; its path and latents follow on fin): the video VAE opened,
 * planned and placed within this GPU's budget (on the host for threads as ranks), its chunks decoded as rank
 * su->h.rank. */
static h3_status rank_decode(int fin, const rank_setup *su, const decode_hdr *d, h3_exec *ex, h3_comm *comm) {
    h3_status st = H3_OK;
    h3_video_vae *v = NULL;
    h3_tensor lat = {0};
    int placed = 0;
    char *path = NULL;
    const int64_t *sh = d->shape;
    if (d->magic != MAGIC_DECODE || sh[0] < 1 || sh[1] < 1 || sh[2] < 1 || sh[3] < 1 || sh[0] > 4096 ||
        sh[1] > (1 << 20) || sh[2] > (1 << 16) || sh[3] > (1 << 16) ||
        sh[0] * sh[1] * sh[2] * sh[3] > ((int64_t)1 << 34))
        return H3_ERR(H3_ERR_FORMAT, "GPU %d: a malformed decode from rank 0", su->h.rank);
    path = read_str(fin);
    if (!path) return H3_ERR(H3_ERR_FORMAT, "GPU %d: a decode from rank 0 ended early", su->h.rank);
    H3_CHECK(h3_tensor_alloc(&lat, H3_PLACE_HOST, H3_F32, 4, sh, H3_MEM_ACTIVATIONS));
    if (read_all(fin, lat.data, (size_t)h3_tensor_numel(&lat) * sizeof(float)) != 0)
        H3_FAIL(H3_ERR_FORMAT, "GPU %d: a decode from rank 0 ended early", su->h.rank);
    H3_CHECK(h3_video_vae_open(path, &d->opts, &v)); /* its message names the path */
    if (su->h.have_plan) {
        h3_video_vae_run run;
        memset(&run, 0, sizeof run);
        run.place = H3_PLACE_DEVICE;
        run.vram_budget = su->h.budgets.vram;
        run.ram_budget = su->h.budgets.ram > 0 ? su->h.budgets.ram : 0;
        run.threads = ex->threads;
        h3_video_vae_mem m;
        H3_CHECK(h3_video_vae_plan(v, sh[1], sh[2], sh[3], &run, &m));
        H3_CHECK_CTX(h3_video_vae_place(v, ex, &m, NULL), "loading it");
        placed = 1;
    }
    H3_CHECK(h3_video_vae_decode_split(v, ex, &lat, NULL, comm));
done:
    if (placed) h3_video_vae_unplace(v);
    h3_video_vae_close(v);
    h3_tensor_free(&lat);
    h3_free(path);
    return st;
}

/* The worker's life after it has its exec and its handle of the group: its DiT and stage as rank 0's, then calls
 * until the end. Answers RDY, then DONE a call. */
static h3_status rank_serve(int fin, int fout, const rank_setup *su, h3_exec *ex, h3_comm *comm) {
    h3_status st = H3_OK;
    h3_dit *dit = NULL;
    h3_lora lora;
    memset(&lora, 0, sizeof lora);
    h3_plan *plan = NULL;
    h3_dit_stage *stage = NULL;
    call_buf b;
    memset(&b, 0, sizeof b);
    const setup_hdr *h = &su->h;
    {
        h3_dit_open_opts oo;
        memset(&oo, 0, sizeof oo);
        if (h->have_plan) {
            oo.act_place = H3_PLACE_DEVICE;
            oo.weight_place = H3_PLACE_HOST;
            oo.stream_weights = 1;
        } else {
            oo.act_place = oo.weight_place = H3_PLACE_HOST;
        }
        H3_CHECK_CTX(h3_dit_open(su->dit_path, &oo, &dit), "the DiT (%s)", su->dit_path);
        if (h->have_plan) H3_CHECK_CTX(h3_dit_device_check(dit), "the DiT on --device cuda");
        H3_CHECK(h3_lora_read(&lora, dit, h->n_loras, (const char *const *)su->lora, su->strength));
        if (h->n_loras) H3_CHECK(h3_lora_apply(dit, ex, &lora, (h3_lora_mode)h->lora_mode));
        h3_dit_set_attention(dit, h->attn_flags);
        h3_dit_stage_args a;
        memset(&a, 0, sizeof a);
        if (h->have_plan) {
            plan = h3_calloc(1, sizeof *plan, H3_MEM_OTHER);
            if (!plan) H3_FAIL(H3_ERR_NOMEM, "out of memory");
            plan->budgets = h->budgets;
            plan->fig = h->fig;
            plan->have_time = h->have_time;
            plan->fits = 1;
            plan->dit = h->plan;
            a.plan = plan;
        }
        a.dit = dit;
        a.text = su->text.data ? &su->text : NULL;
        a.text_rows_max = h->text_rows_max;
        a.n_video_rows = h->n_video_rows;
        a.n_audio_rows = h->n_audio_rows;
        a.timesteps = su->timesteps;
        a.n_timesteps = h->n_timesteps;
        a.comm = comm;
        H3_CHECK_CTX(h3_dit_stage_open(ex, &a, &stage), "placing the DiT on GPU %d", h->rank);
    }
done:
    if (st != H3_OK && comm->abort) comm->abort(comm);
    if (write_reply(fout, MAGIC_READY, st) != 0 && st == H3_OK)
        st = H3_ERR(H3_ERR_IO, "rank 0 is gone");
    const h3_dit_config *c = dit ? h3_dit_get_config(dit) : NULL;
    int decodes = 0;
    while (st == H3_OK) {
        const int got = read_call(fin, &b, c);
        if (got == 0) break;
        if (got == 2) {
            decodes = 1;
            break;
        }
        if (got < 0) {
            st = H3_ERR(H3_ERR_FORMAT, "GPU %d: a malformed call from rank 0", h->rank);
            if (comm->abort) comm->abort(comm);
        } else {
            h3_dit_inputs in = {b.h.Nv ? &b.video : NULL,
                                b.h.Na ? &b.audio : NULL,
                                b.h.has_text ? &b.text : NULL,
                                b.timesteps,
                                b.h.n_timesteps,
                                b.h.S,
                                b.tidx,
                                b.tags,
                                b.pos,
                                b.vidx,
                                b.aidx,
                                b.xidx};
            if (b.h.has_text) h3_dit_stage_text_changed(stage); /* b.text is refilled, always the same tensor */
            st = h3_dit_stage_call(stage, &in, b.h.Nv ? &b.vout : NULL, b.h.Na ? &b.aout : NULL);
            if (st != H3_OK && comm->abort) comm->abort(comm);
        }
        if (write_reply(fout, MAGIC_DONE, st) != 0 && st == H3_OK) st = H3_ERR(H3_ERR_IO, "rank 0 is gone");
    }
    h3_dit_stage_close(stage, NULL);
    h3_lora_free(&lora);
    h3_dit_close(dit);
    h3_free(plan);
    call_buf_free(&b);
    while (st == H3_OK && decodes) { /* the DiT given back: decodes until the end */
        decode_hdr d;
        if (read_all(fin, &d, sizeof d) != 0 || d.magic == MAGIC_QUIT) break;
        st = rank_decode(fin, su, &d, ex, comm);
        if (st != H3_OK && comm->abort) comm->abort(comm);
        if (write_reply(fout, MAGIC_DONE, st) != 0 && st == H3_OK) st = H3_ERR(H3_ERR_IO, "rank 0 is gone");
    }
    return st;
}

int h3_dit_rank_main(void (*setup_logging)(int verbosity)) {
    signal(SIGINT, SIG_IGN); /* Ctrl-C reaches the whole terminal's group: rank 0 stops the workers */
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a worker never outlives rank 0 (it may wait in NCCL for it) */
    if (getppid() == 1) return 1;
    rank_setup su;
    h3_status st = read_setup(0, &su);
    if (st != H3_OK) {
        fprintf(stderr, "h3run __dit-rank: %s\n", h3_last_error());
        rank_setup_free(&su);
        return 2;
    }
    if (setup_logging) setup_logging(su.h.verbosity);
    h3_exec ex;
    h3_comm comm;
    memset(&comm, 0, sizeof comm);
    int have_cuda = 0, have_comm = 0;
    st = h3_exec_init(&ex, 0);
    if (st == H3_OK) {
        st = h3_cuda_init(&ex, su.h.device, su.h.budgets.vram);
        if (st != H3_OK) st = h3_error_wrap(st, "GPU %d with a budget of %lld bytes", su.h.rank, (long long)su.h.budgets.vram);
        have_cuda = st == H3_OK;
    }
    if (write_reply(REPLY_FD, MAGIC_UP, st) != 0 && st == H3_OK) st = H3_ERR(H3_ERR_IO, "rank 0 is gone");
    if (st == H3_OK) {
        st = h3_cuda_comm_create(&ex, su.h.rank, su.h.size, su.h.id, &comm);
        have_comm = st == H3_OK;
        if (st != H3_OK) write_reply(REPLY_FD, MAGIC_READY, st);
    }
    if (st == H3_OK) st = rank_serve(0, REPLY_FD, &su, &ex, &comm);
    if (st != H3_OK) h3_log(H3_LOG_ERROR, "the worker for GPU %d: %s", su.h.rank, h3_last_error());
    if (have_comm) h3_cuda_comm_destroy(&comm);
    if (have_cuda) h3_cuda_shutdown(&ex);
    h3_exec_free(&ex);
    rank_setup_free(&su);
    return st == H3_OK ? 0 : 1;
}

/* ---- threads as ranks (the CPU's stand-in) ------------------------------------------------------------------ */

typedef struct local_arg {
    int fin, fout;
    h3_comm *comm;
} local_arg;

static void *local_rank(void *p) {
    local_arg *a = p;
    rank_setup su;
    h3_status st = read_setup(a->fin, &su);
    h3_exec ex;
    int have_ex = 0;
    if (st == H3_OK) {
        st = h3_exec_init(&ex, 1);
        have_ex = st == H3_OK;
    }
    if (write_reply(a->fout, MAGIC_UP, st) == 0 && st == H3_OK) rank_serve(a->fin, a->fout, &su, &ex, a->comm);
    if (have_ex) h3_exec_free(&ex);
    rank_setup_free(&su);
    close(a->fin);
    close(a->fout);
    h3_free(a);
    return NULL;
}

h3_status h3_dit_group_start_local(int n, const h3_dit_rank_setup *su, h3_dit_group **out) {
    if (su->plan) return H3_ERR(H3_ERR_INVALID, "threads as ranks run on the host: no plan");
    h3_dit_group *g;
    H3_TRY(group_alloc(n, su, &g));
    g->local = 1;
    h3_status st = H3_OK;
    H3_CHECK(h3_comm_local_create(n, g->local_ranks));
    g->have_comm = 1;
    for (int r = 1; r < n; r++) {
        int to[2], from[2];
        if (channels(to, from) != 0) H3_FAIL(H3_ERR_IO, "creating a channel: %s", strerror(errno));
        g->w[r].to = to[1];
        g->w[r].from = from[0];
        local_arg *a = h3_malloc(sizeof *a, H3_MEM_OTHER);
        if (!a) {
            close(to[0]);
            close(from[1]);
            H3_FAIL(H3_ERR_NOMEM, "out of memory");
        }
        *a = (local_arg){to[0], from[1], &g->local_ranks[r]};
        if (pthread_create(&g->w[r].th, NULL, local_rank, a) != 0) {
            close(to[0]);
            close(from[1]);
            h3_free(a);
            H3_FAIL(H3_ERR_INTERNAL, "starting rank %d's thread failed", r);
        }
        g->w[r].have_thread = 1;
        if (send_setup(g->w[r].to, r, n, NULL, su) != 0) H3_FAIL(H3_ERR_IO, "rank %d did not take its setup", r);
    }
    for (int r = 1; r < n; r++) H3_CHECK(await_up(g, r));
    H3_CHECK(start_watch(g));
    *out = g;
    return H3_OK;
done:
    h3_dit_group_stop(g);
    return st;
}

/* Worker r did not take what rank 0 wrote (g->mu held): its own reason first, as the watchdog reads what it said
 * before it went (5 s at most), else `what`. */
static void fail_unsent(h3_dit_group *g, int r, const char *what) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    while (!g->w[r].dead && g->w[r].err == H3_OK)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) != 0) break;
    fail_worker(g, r, H3_ERR_IO, what);
}

/* ---- calls and the end ---------------------------------------------------------------------------------- */

h3_status h3_dit_group_send(h3_dit_group *g, const h3_dit_inputs *in) {
    pthread_mutex_lock(&g->mu);
    const int failed = g->failed;
    pthread_mutex_unlock(&g->mu);
    if (failed) return group_error(g);
    call_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = MAGIC_CALL;
    h.n_timesteps = in->n_timesteps;
    h.S = in->seq_len;
    h.Nv = in->video ? in->video->shape[0] : 0;
    h.Na = in->audio ? in->audio->shape[0] : 0;
    h.L = h.S - h.Nv - h.Na;
    h.has_text = in->text != NULL;
    h.text_rows = in->text ? in->text->shape[0] : 0;
    h.text_dim = in->text ? in->text->shape[1] : 0;
    const h3_tensor *rows[3] = {in->video, in->audio, in->text};
    for (int i = 0; i < 3; i++)
        if (rows[i] && (rows[i]->place != H3_PLACE_HOST || rows[i]->dtype != H3_F32 || !h3_tensor_is_contiguous(rows[i])))
            return H3_ERR(H3_ERR_INVALID, "the GPUs' group sends contiguous f32 rows from the host");
    for (int r = 1; r < g->n; r++) {
        const int fd = g->w[r].to;
        int bad = write_all(fd, &h, sizeof h) ||
                  write_all(fd, in->timesteps, (size_t)h.n_timesteps * sizeof(float)) ||
                  write_all(fd, in->timestep_indices, (size_t)h.S * 4) || write_all(fd, in->token_tags, (size_t)h.S * 4) ||
                  write_all(fd, in->position_ids, (size_t)h.S * 3 * sizeof(double)) ||
                  write_all(fd, in->video_indices, (size_t)h.Nv * 4) ||
                  write_all(fd, in->audio_indices, (size_t)h.Na * 4) || write_all(fd, in->text_indices, (size_t)h.L * 4);
        for (int i = 0; i < 3 && !bad; i++)
            if (rows[i]) bad = write_all(fd, rows[i]->data, (size_t)h3_tensor_numel(rows[i]) * sizeof(float));
        pthread_mutex_lock(&g->mu);
        if (bad) {
            fail_unsent(g, r, "it did not take a call (its process ended?)");
        } else {
            g->w[r].pending++;
        }
        pthread_mutex_unlock(&g->mu);
        if (bad) return group_error(g);
    }
    return H3_OK;
}

/* Every worker: the message in hdr (len bytes), then the string and the floats; one answer owed when
 * `answered`. */
static h3_status send_all_workers(h3_dit_group *g, const void *hdr, size_t len, const char *str,
                                  const float *data, size_t n, int answered) {
    pthread_mutex_lock(&g->mu);
    const int failed = g->failed;
    pthread_mutex_unlock(&g->mu);
    if (failed) return group_error(g);
    for (int r = 1; r < g->n; r++) {
        const int fd = g->w[r].to;
        const int bad = write_all(fd, hdr, len) || (str && write_str(fd, str)) ||
                        (n && write_all(fd, data, n * sizeof(float)));
        pthread_mutex_lock(&g->mu);
        if (bad)
            fail_unsent(g, r, "it did not take a message (its process ended?)");
        else if (answered)
            g->w[r].pending++;
        pthread_mutex_unlock(&g->mu);
        if (bad) return group_error(g);
    }
    return H3_OK;
}

h3_status h3_dit_group_end_dit(h3_dit_group *g) {
    call_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = MAGIC_ENDDIT;
    return send_all_workers(g, &h, sizeof h, NULL, NULL, 0, 0);
}

h3_status h3_dit_group_send_decode(h3_dit_group *g, const char *vae_path, const h3_video_vae_opts *opts,
                                   const h3_tensor *latents) {
    const int off = latents->ndim == 5;
    if (!vae_path || latents->place != H3_PLACE_HOST || latents->dtype != H3_F32 ||
        !h3_tensor_is_contiguous(latents) || latents->ndim < 4 || (off && latents->shape[0] != 1))
        return H3_ERR(H3_ERR_INVALID,
                      "the GPUs' group decodes contiguous f32 latents [C, T, H, W] from the host");
    decode_hdr d;
    memset(&d, 0, sizeof d);
    d.magic = MAGIC_DECODE;
    for (int i = 0; i < 4; i++) d.shape[i] = latents->shape[off + i];
    if (opts) d.opts = *opts;
    g->task = "the video VAE";
    return send_all_workers(g, &d, sizeof d, vae_path, latents->data, (size_t)h3_tensor_numel(latents), 1);
}

/* Whether some worker has failed or ended (g->mu held). */
static int any_worker_down(const h3_dit_group *g) {
    for (int r = 1; r < g->n; r++)
        if (g->w[r].err != H3_OK || g->w[r].dead) return 1;
    return 0;
}

h3_status h3_dit_group_wait(h3_dit_group *g, h3_status own) {
    char keep[1024] = "";
    if (own != H3_OK) snprintf(keep, sizeof keep, "%s", h3_last_error());
    pthread_mutex_lock(&g->mu);
    /* a worker's failure reached rank 0 first: the watchdog stopped the group (NCCL), so rank 0's error is its echo */
    int from_worker = g->failed && any_worker_down(g);
    const int stop_asked = h3_cancel_check() != H3_OK; /* the user's stop, not another rank's */
    if (stop_asked) h3_clear_error();
    if (own == H3_ERR_INTERRUPTED && !from_worker && !stop_asked) {
        /* the group was stopped by another rank (the in-process group: a failing worker stops it itself, maybe
         * before the watchdog has read its answer): up to 5 s for that answer */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 5;
        while (!any_worker_down(g))
            if (pthread_cond_timedwait(&g->cv, &g->mu, &until) != 0) break;
        from_worker = any_worker_down(g);
    }
    if (own != H3_OK && !g->failed) { /* the workers may wait in a collective rank 0 never reached */
        g->failed = 1;
        h3_comm *c = h3_dit_group_comm(g);
        if (g->have_comm && c->abort) c->abort(c);
    }
    for (;;) {
        int owed = 0;
        for (int r = 1; r < g->n; r++) owed |= g->w[r].pending > 0 && !g->w[r].dead;
        if (!owed || g->failed) break;
        pthread_cond_wait(&g->cv, &g->mu);
    }
    const int failed = g->failed;
    pthread_mutex_unlock(&g->mu);
    /* rank 0's own error first, unless it was the echo of a worker's */
    if (own != H3_OK && !from_worker) return H3_ERR(own, "%s", keep);
    return failed ? group_error(g) : H3_OK;
}

void h3_dit_group_stop(h3_dit_group *g) {
    if (!g) return;
    const uint32_t quit = MAGIC_QUIT;
    pthread_mutex_lock(&g->mu);
    int owed = 0; /* a call still in flight: its collectives would never complete */
    for (int r = 1; r < g->n; r++) owed |= g->w[r].pending > 0 && !g->w[r].dead;
    if (owed && g->have_watch && !g->failed) {
        g->failed = 1;
        h3_comm *c = h3_dit_group_comm(g);
        if (g->have_comm && c->abort) c->abort(c);
    }
    pthread_mutex_unlock(&g->mu);
    for (int r = 1; r < g->n; r++)
        if (g->w[r].to >= 0) {
            (void)write_all(g->w[r].to, &quit, sizeof quit);
            close(g->w[r].to);
            g->w[r].to = -1;
        }
    pthread_mutex_lock(&g->mu);
    g->stopping = 1;
    /* a stopped group's workers may wait in a collective rank 0 left (their GPU never returns from it): 3 s
     * to end, not 30 */
    const int grace = g->failed ? 30 : 300;
    pthread_mutex_unlock(&g->mu);
    if (g->wake[1] >= 0) (void)!write(g->wake[1], "x", 1);
    if (g->have_watch) pthread_join(g->watch, NULL);
    for (int r = 1; r < g->n; r++) {
        worker *w = &g->w[r];
        if (w->have_thread) pthread_join(w->th, NULL);
        if (w->pid > 0) { /* 30 s to finish (3 s after a failure), then killed */
            int status = 0;
            for (int i = 0; i < grace && waitpid(w->pid, &status, WNOHANG) == 0; i++) usleep(100000);
            if (waitpid(w->pid, &status, WNOHANG) == 0) {
                h3_log(H3_LOG_WARN, "the DiT's process for GPU %d did not end: killed", r);
                kill(w->pid, SIGKILL);
                while (waitpid(w->pid, &status, 0) < 0 && errno == EINTR) {
                }
            }
        }
        if (w->from >= 0) close(w->from);
    }
    if (g->have_comm) {
        if (g->local)
            h3_comm_local_destroy(g->local_ranks, g->n);
        else
            h3_cuda_comm_destroy(&g->comm);
    }
    if (g->wake[0] >= 0) close(g->wake[0]);
    if (g->wake[1] >= 0) close(g->wake[1]);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    h3_free(g);
}

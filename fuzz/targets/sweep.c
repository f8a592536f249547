/* One tensor at a time through every command that loads a model folder. The reduced model
 * (tools/h3-tinymodel.c) is copied as links, and one tensor of one component is changed in its file:
 *
 *   input: [component] [tensor, u16 little-endian] [change] [parameter]
 *   component  0 DiT (transformer/, two shards), 1 text encoder, 2 video VAE (video_vae/source/), 3 audio VAE
 *   tensor     an index into that component's tensors, sorted by name (modulo their count)
 *   change     0 empty (one dim set to 0), 1 drop, 2 reshape (a dim halved or grown by one, the dims
 * reversed, flattened, a leading 1 added, the last dim dropped), 3 retype (another dtype, same shape; the
 * bytes are the old ones repeated)
 *
 * Then the component is opened as generate opens it and, when that succeeds, run once on a few tokens, rows
 * or latents (so a shape the loader should have refused and did not is used, as a run would use it); the DiT
 * and the text encoder go through `h3run quantize --table` and `h3run quantize IN OUT` (whose source load
 * reads every block-0 tensor); `h3run inspect --summary` lists the component and `h3run plan` plans the whole
 * folder. A command that fails must leave no file behind; the reduced model itself must stay as it was.
 *
 * fuzz/seeds.sh writes every (tensor, change) of the model as inputs, for a full deterministic sweep. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "cli/cli.h"
#include "fuzz.h"
#include "io/safetensors.h"
#include "models/audio_vae.h"
#include "models/dit.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"

typedef struct {
    const char *dir; /* in the model folder */
    h3_st_set set;   /* the original files */
    int64_t n;       /* tensors */
} component;

static const char *const g_dirs[4] = {"transformer", "text_encoder", "video_vae/source", "audio_vae"};
static component g_comp[4];
static h3_exec g_ex;

static void setup(void) {
    static int done;
    if (done) return;
    done = 1;
    for (int c = 0; c < 4; c++) {
        char p[4096];
        g_comp[c].dir = g_dirs[c];
        snprintf(p, sizeof p, "%s/%s", fz_tiny_model(), g_comp[c].dir);
        if (h3_st_open(p, &g_comp[c].set) != H3_OK) {
            fprintf(stderr, "fuzz harness: cannot open %s: %s\n", p, h3_last_error());
            abort();
        }
        g_comp[c].n = g_comp[c].set.n_entries;
    }
    if (h3_exec_init(&g_ex, 1) != H3_OK) abort();
    fz_keep();
}

static const h3_dtype g_types[] = {H3_F32, H3_F16, H3_BF16, H3_F64, H3_F8_E4M3,
                                   H3_I8,  H3_U8,  H3_I32,  H3_I64, H3_BOOL};

/* The changed entry: new dtype and shape; returns 0 to drop it. */
static int change(const h3_st_entry *e, int op, int param, h3_dtype *dt, int *nd, int64_t *shape) {
    *dt = e->dtype;
    *nd = e->ndim;
    memcpy(shape, e->shape, sizeof e->shape);
    const int d = e->ndim ? param / 8 % e->ndim : 0;
    switch (op) {
        case 0:
            if (*nd == 0) *nd = 1;
            shape[d] = 0;
            return 1;
        case 1:
            return 0;
        case 2:
            switch (param % 6) {
                case 0:
                    if (*nd) shape[d] = shape[d] > 1 ? shape[d] / 2 : 2;
                    break;
                case 1:
                    if (*nd)
                        shape[d] += 1;
                    else
                        shape[(*nd)++] = 2;
                    break;
                case 2:
                    for (int i = 0; i < *nd / 2; i++) {
                        int64_t t = shape[i];
                        shape[i] = shape[*nd - 1 - i];
                        shape[*nd - 1 - i] = t;
                    }
                    break;
                case 3:
                    shape[0] = h3_st_entry_numel(e);
                    *nd = 1;
                    break;
                case 4:
                    if (*nd < H3_MAX_DIMS) {
                        memmove(shape + 1, shape, (size_t)*nd * sizeof *shape);
                        shape[0] = 1;
                        (*nd)++;
                    }
                    break;
                default:
                    if (*nd) (*nd)--;
                    break;
            }
            return 1;
        default: {
            const int n = (int)(sizeof g_types / sizeof g_types[0]);
            *dt = g_types[param % n] == e->dtype ? g_types[(param + 1) % n] : g_types[param % n];
            return 1;
        }
    }
}

/* Writes the component's file holding entry `which` (all its other tensors as they were) to path. */
static h3_status write_changed(component *c, const h3_st_entry *which, int op, int param, const char *path) {
    h3_st_writer *w = NULL;
    uint8_t *buf = NULL;
    h3_status st = h3_st_writer_new(&w);
    const h3_st_file *file = &c->set.files[which->file];
    for (int64_t i = 0; i < c->n && st == H3_OK; i++) {
        const h3_st_entry *e = &c->set.entries[i];
        if (e->file != which->file) continue;
        const void *bytes = NULL;
        if (e->end > e->begin && (st = h3_st_bytes(&c->set, e, &bytes)) != H3_OK) break;
        if (e != which) {
            st = h3_st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, bytes);
            continue;
        }
        h3_dtype dt;
        int nd;
        int64_t shape[H3_MAX_DIMS];
        if (!change(e, op, param, &dt, &nd, shape)) continue;
        int64_t numel = 1;
        for (int k = 0; k < nd; k++) numel *= shape[k];
        const size_t nbytes = (size_t)numel * h3_dtype_size(dt), old = (size_t)(e->end - e->begin);
        buf = h3_malloc(nbytes ? nbytes : 1, H3_MEM_IO);
        if (!buf) abort();
        for (size_t k = 0; k < nbytes; k++) buf[k] = old ? ((const uint8_t *)bytes)[k % old] : 0;
        st = h3_st_writer_add(w, e->name, dt, nd, shape, buf);
    }
    if (st == H3_OK && file->metadata) {
        const char *key;
        json_t *v;
        json_object_foreach(file->metadata, key, v) {
            if (json_is_string(v)) h3_st_writer_meta(w, key, json_string_value(v));
        }
    }
    if (st == H3_OK) st = h3_st_writer_write(w, path, 0);
    h3_st_writer_free(w);
    h3_free(buf);
    return st;
}

/* ---- runs of each component on a few tokens, rows or latents ------------------------------------ */

static h3_status frames_sink(void *user, const h3_tensor *frames, int64_t first) {
    (void)user;
    (void)frames;
    (void)first;
    return H3_OK;
}

static void run_dit(const char *path) {
    h3_dit *d = NULL;
    if (fz_note("DiT open", h3_dit_open(path, NULL, &d)) != H3_OK) return;
    const h3_dit_config *c = h3_dit_get_config(d);
    /* 4 video rows (one latent frame of 2 x 2 patches... as rows), 2 audio rows, 2 text rows */
    enum { NV = 4, NA = 2, NL = 2, S = NV + NA + NL };
    const int64_t vdim = c->in_channels * c->patch[0] * c->patch[1] * c->patch[2];
    h3_tensor v = {0}, a = {0}, t = {0}, vo = {0}, ao = {0};
    int32_t ti[S] = {0}, tags[S], vi[NV], ai[NA], li[NL];
    double pos[S * 3];
    const float ts[1] = {0.5f};
    for (int i = 0; i < S; i++) {
        tags[i] = i < NV ? 0 : i < NV + NA ? 2 : 1;
        pos[3 * i] = i % 2, pos[3 * i + 1] = i / 2 % 2, pos[3 * i + 2] = i % 3;
        if (i < NV)
            vi[i] = i;
        else if (i < NV + NA)
            ai[i - NV] = i;
        else
            li[i - NV - NA] = i;
    }
    if (vdim > 0 && vdim <= 4096 && c->audio_dim > 0 && c->audio_dim <= 4096 && c->text_dim > 0 &&
        c->text_dim <= 4096 &&
        h3_tensor_alloc2(&v, H3_PLACE_HOST, H3_F32, NV, vdim, H3_MEM_ACTIVATIONS) == H3_OK &&
        h3_tensor_alloc2(&a, H3_PLACE_HOST, H3_F32, NA, c->audio_dim, H3_MEM_ACTIVATIONS) == H3_OK &&
        h3_tensor_alloc2(&t, H3_PLACE_HOST, H3_F32, NL, c->text_dim, H3_MEM_ACTIVATIONS) == H3_OK &&
        h3_tensor_alloc2(&vo, H3_PLACE_HOST, H3_F32, NV, vdim, H3_MEM_ACTIVATIONS) == H3_OK &&
        h3_tensor_alloc2(&ao, H3_PLACE_HOST, H3_F32, NA, c->audio_dim, H3_MEM_ACTIVATIONS) == H3_OK) {
        float *p[3] = {v.data, a.data, t.data};
        const int64_t n[3] = {NV * vdim, NA * c->audio_dim, NL * c->text_dim};
        for (int k = 0; k < 3; k++)
            for (int64_t i = 0; i < n[k]; i++) p[k][i] = (float)((i * 37 + k) % 17) / 17.0f - 0.5f;
        const h3_dit_inputs in = {&v, &a, &t, ts, 1, S, ti, tags, pos, vi, ai, li};
        fz_note("DiT forward", h3_dit_forward(d, &g_ex, &in, &vo, &ao));
    }
    h3_tensor_free(&v);
    h3_tensor_free(&a);
    h3_tensor_free(&t);
    h3_tensor_free(&vo);
    h3_tensor_free(&ao);
    h3_dit_close(d);
}

static void run_te(const char *path) {
    h3_text_encoder *te = NULL;
    if (fz_note("text encoder open", h3_text_encoder_open(path, NULL, &te)) != H3_OK) return;
    const int32_t ids[3] = {1, 2, 3};
    h3_tensor out = {0};
    const int64_t hidden = h3_text_encoder_config(te)->hidden;
    if (hidden > 0 && hidden <= 1 << 16 &&
        h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, 3, hidden, H3_MEM_ACTIVATIONS) == H3_OK)
        fz_note("text encoder encode", h3_text_encoder_encode(te, &g_ex, ids, 3, H3_TE_LAYER, &out));
    h3_tensor_free(&out);
    h3_text_encoder_close(te);
}

static void run_video_vae(const char *path) {
    h3_video_vae *v = NULL;
    if (fz_note("video VAE open", h3_video_vae_open(path, NULL, &v)) != H3_OK) return;
    const h3_video_vae_config *c = h3_video_vae_get_config(v);
    h3_tensor lat = {0};
    const int64_t shape[5] = {1, c->latent_channels, 1, 2, 2};
    if (c->latent_channels > 0 && c->latent_channels <= H3_VVAE_MAX_CHANNELS &&
        h3_tensor_alloc(&lat, H3_PLACE_HOST, H3_F32, 5, shape, H3_MEM_IO) == H3_OK) {
        float *x = lat.data;
        for (int i = 0; i < 4 * c->latent_channels; i++) x[i] = (float)(i % 5) * 0.25f - 0.5f;
        const h3_video_decode_out out = {H3_PIXELS_UNIT, frames_sink, NULL, NULL};
        fz_note("video VAE decode", h3_video_vae_decode(v, &g_ex, &lat, &out));
    }
    h3_tensor_free(&lat);
    h3_video_vae_close(v);
}

static void run_audio_vae(const char *path) {
    h3_audio_vae *v = NULL;
    if (fz_note("audio VAE open", h3_audio_vae_open(path, NULL, &v)) != H3_OK) return;
    const h3_audio_vae_config *c = h3_audio_vae_get_config(v);
    h3_tensor lat = {0}, wave = {0};
    const int64_t shape[3] = {2, c->latent_channels, 1};
    if (c->latent_channels > 0 && c->latent_channels <= 4096 && c->hop > 0 && c->hop <= 1 << 16 &&
        h3_tensor_alloc(&lat, H3_PLACE_HOST, H3_F32, 3, shape, H3_MEM_IO) == H3_OK &&
        h3_tensor_alloc2(&wave, H3_PLACE_HOST, H3_F32, 2, c->hop, H3_MEM_IO) == H3_OK) {
        float *x = lat.data;
        for (int i = 0; i < 2 * c->latent_channels; i++) x[i] = (float)(i % 7) * 0.2f - 0.6f;
        fz_note("audio VAE decode", h3_audio_vae_decode(v, &g_ex, &lat, &wave));
    }
    h3_tensor_free(&lat);
    h3_tensor_free(&wave);
    h3_audio_vae_close(v);
}

/* Runs an h3run subcommand; whether it succeeded. */
static int cli(int (*fn)(int, char **), char **argv) {
    int argc = 0;
    while (argv[argc]) argc++;
    return fn(argc, argv) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    fz_bytes in = {data, size};
    const int ci = (int)(fz_u8(&in) % 4);
    component *c = &g_comp[ci];
    const h3_st_entry *e = &c->set.entries[fz_u16(&in) % (uint32_t)c->n];
    const int op = (int)(fz_u8(&in) % 4), param = (int)fz_u8(&in);
    h3_dtype dt;
    int nd;
    int64_t shape[H3_MAX_DIMS];
    int64_t numel = 1;
    const int kept = change(e, op, param, &dt, &nd, shape);
    for (int k = 0; k < nd; k++) numel *= shape[k];
    /* known: zero-element tensors (F1); quantize's source load and table trust every block-0 shape but qkv's
     * and fc1's (F2-F4) */
    int quant_ok = !(ci <= 1 && (fz_open_finding("F2") || fz_open_finding("F3") || fz_open_finding("F4")) &&
                     (strstr(e->name, "blocks.0.") || strstr(e->name, "layers.0.")));
    /* and a retype makes values of any bytes: NaN and infinity, which quantize casts to int8 (N1) */
    if (op == 3 && fz_open_finding("N1")) quant_ok = 0;
    if (kept && numel == 0 && fz_open_finding("F1")) return 0;

    fz_quiet(1);
    char rel[4096];
    const char *base = h3_path_base(c->set.files[e->file].path);
    snprintf(rel, sizeof rel, "%s/%s", c->dir, base);
    const char *file = fz_model_with("m", rel);
    if (write_changed(c, e, op, param, fz_path(file)) != H3_OK) {
        fz_quiet(0);
        fprintf(stderr, "fuzz harness: cannot write %s: %s\n", fz_path(file), h3_last_error());
        abort();
    }
    char comp[4096], model[4096], out[4096];
    snprintf(comp, sizeof comp, "%s/%s", fz_path("m"), ci == 2 ? "video_vae" : c->dir);
    snprintf(model, sizeof model, "%s", fz_path("m"));
    snprintf(out, sizeof out, "%s", fz_path("quantized.safetensors"));
    switch (ci) {
        case 0:
            run_dit(comp);
            break;
        case 1:
            run_te(comp);
            break;
        case 2:
            run_video_vae(comp);
            break;
        default:
            run_audio_vae(comp);
            break;
    }
    char *inspect[] = {comp, "--summary", NULL};
    cli(h3_cmd_inspect, inspect);
    char *plan[] = {model, "--frames", "22", "--size", "64x64", "--vram-budget", "1GiB", "-q", NULL};
    cli(h3_cmd_plan, plan);
    int wrote = 0;
    if (ci <= 1 && quant_ok) {
        char *table[] = {comp, "--table", "--rows", "4", "--threads", "1", "-q", NULL};
        cli(h3_cmd_quantize, table);
        char *write[] = {comp, out, "--format", "int8", "--no-table", "--threads", "1", "-q", NULL};
        wrote = cli(h3_cmd_quantize, write);
    }
    fz_quiet(0);
    fz_end("sweep", wrote);
    return 0;
}

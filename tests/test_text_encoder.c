/* The text encoder against the fixtures of the project's PyTorch reference (tools/reference/qwen3.py, float64), in
 * both weight namings; what is and is not read; the text-only mRoPE equivalence; bad files and inputs; allocation
 * failures.
 *
 * Tolerance: relative L2 error <= 1e-4 and max |c − ref| / max |ref| <= 1e-4 per hidden state. The C code converts
 * the fixture's bf16 weights to f32 exactly and the reference computes with the same values in float64, so what
 * remains is f32 rounding of activations through 4 layers (measured ~1e-7); 1e-4 leaves room for other summation
 * orders (threads, BLAS) while a wrong formula (rotary pairing, QK-norm over the wrong axis, GQA head mapping) is off
 * by 1e-2 or more. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "models/text_encoder.h"
#include "quant/qload.h"
#include "quant/qwrite.h"
#include "testutil.h"

static h3_exec g_ex;
static const double TOL = 1e-4;
#define USED_LAYERS 4 /* hidden_states[0..4] are in the fixtures; layer 4 of official/ is NaN */

static const char *fix(const char *rel, char *buf, size_t n) {
    char r[256];
    snprintf(r, sizeof r, "tests/fixtures/text_encoder/%s", rel);
    return t_src_path(r, buf, n);
}

/* The ids of prompt `name` from expected.safetensors (caller frees). */
static int32_t *load_ids(h3_st_set *exp, const char *name, int64_t *n) {
    char key[64];
    snprintf(key, sizeof key, "ids.%s", name);
    h3_tensor t;
    *n = 0;
    if (h3_st_load(exp, key, H3_PLACE_HOST, H3_I32, H3_MEM_OTHER, &t) != H3_OK) {
        CHECK(0, "expected.safetensors lacks %s: %s", key, h3_last_error());
        return NULL;
    }
    *n = h3_tensor_numel(&t);
    int32_t *ids = malloc((size_t)*n * sizeof *ids);
    memcpy(ids, t.data, (size_t)*n * sizeof *ids);
    h3_tensor_free(&t);
    return ids;
}

/* Compares got [n, C] with expected "hidden.<prompt>.<layer>". Returns the relative L2 error. */
static double compare_hidden(const char *what, const h3_tensor *got, h3_st_set *exp, const char *prompt, int layer) {
    char key[64];
    snprintf(key, sizeof key, "hidden.%s.%d", prompt, layer);
    h3_tensor ref;
    h3_status st = h3_st_load(exp, key, H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &ref);
    CHECK(st == H3_OK, "%s: %s", key, h3_last_error());
    if (st != H3_OK) return INFINITY;
    int64_t n = h3_tensor_numel(&ref);
    CHECK(h3_tensor_numel(got) == n, "%s: %lld values, expected %lld", what, (long long)h3_tensor_numel(got),
          (long long)n);
    double e = INFINITY;
    if (h3_tensor_numel(got) == n) {
        double *r = malloc((size_t)n * sizeof *r), mx = 0, mref = 0;
        const float *g = got->data, *rf = ref.data;
        for (int64_t i = 0; i < n; i++) {
            r[i] = rf[i];
            double d = fabs((double)g[i] - r[i]);
            if (!(d <= mx)) mx = d;
            if (fabs(r[i]) > mref) mref = fabs(r[i]);
        }
        e = t_rel_err(g, r, (size_t)n);
        double emax = mref > 0 ? mx / mref : mx;
        CHECK(e <= TOL && emax <= TOL, "%s layer %d: relative L2 error %.3e, max error / max |ref| %.3e (tol %.0e)",
              what, layer, e, emax, TOL);
        if (getenv("H3_TEST_VERBOSE") || layer == USED_LAYERS)
            printf("  %-28s prompt %s hidden_states[%d]: rel L2 %.2e, max %.2e (tol %.0e)\n", what, prompt, layer, e,
                   emax, TOL);
        free(r);
    }
    h3_tensor_free(&ref);
    return e;
}

/* Encodes both fixture prompts at every layer 0..USED_LAYERS with te and compares. */
static void check_against_fixtures(h3_text_encoder *te, const char *what) {
    char p[512];
    h3_st_set exp;
    CHECK_OK(h3_st_open(fix("expected.safetensors", p, sizeof p), &exp));
    const h3_te_config *c = h3_text_encoder_config(te);
    static const char *const prompts[] = {"a", "b"};
    for (int pi = 0; pi < 2; pi++) {
        int64_t n;
        int32_t *ids = load_ids(&exp, prompts[pi], &n);
        if (!ids) break;
        for (int layer = 0; layer <= USED_LAYERS; layer++) {
            h3_tensor out;
            CHECK_OK(h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, n, c->hidden, H3_MEM_ACTIVATIONS));
            h3_te_stats before, after;
            h3_text_encoder_get_stats(te, &before);
            h3_status st = h3_text_encoder_encode(te, &g_ex, ids, n, layer, &out);
            CHECK(st == H3_OK, "%s layer %d: %s", what, layer, h3_last_error());
            h3_text_encoder_get_stats(te, &after);
            /* Exactly layers 0..layer-1 were fetched, once each, each fetch released; one embedding row per id. */
            CHECK(after.acquires - before.acquires == layer && after.releases - before.releases == layer,
                  "%s: hidden_states[%d] acquired %lld and released %lld layers", what, layer,
                  (long long)(after.acquires - before.acquires), (long long)(after.releases - before.releases));
            CHECK(after.embedding_rows - before.embedding_rows == n, "%s: %lld embedding rows read for %lld tokens",
                  what, (long long)(after.embedding_rows - before.embedding_rows), (long long)n);
            if (st == H3_OK) compare_hidden(what, &out, &exp, prompts[pi], layer);
            h3_tensor_free(&out);
        }
        free(ids);
    }
    h3_te_stats s;
    h3_text_encoder_get_stats(te, &s);
    CHECK(s.max_layer_acquired == USED_LAYERS - 1, "%s: layer %lld was fetched; the highest used is %d", what,
          (long long)s.max_layer_acquired, USED_LAYERS - 1);
    h3_st_close(&exp);
}

static void test_official(void) {
    char p[512];
    h3_text_encoder *te = NULL;
    CHECK_OK(h3_text_encoder_open(fix("official", p, sizeof p), NULL, &te));
    if (!te) return;
    const h3_te_config *c = h3_text_encoder_config(te);
    CHECK(c->hidden == 64 && c->n_layers == 5 && c->heads == 4 && c->kv_heads == 2 && c->head_dim == 32 &&
              c->intermediate == 96 && c->vocab == 256,
          "config of official/: %s", h3_text_encoder_describe(te));
    CHECK(c->rope_theta == 5e6 && c->rms_eps == 1e-6, "theta %g, eps %g from config.json", c->rope_theta, c->rms_eps);
    CHECK(h3_text_encoder_layout(te) == H3_LAYOUT_OFFICIAL, "official names");
    CHECK(strstr(h3_text_encoder_describe(te), "config.json") != NULL, "config from config.json: %s",
          h3_text_encoder_describe(te));
    check_against_fixtures(te, "official/");
    h3_text_encoder_close(te);
}

static void test_comfy(void) {
    char p[512];
    h3_text_encoder *te = NULL;
    CHECK_OK(h3_text_encoder_open(fix("comfy.safetensors", p, sizeof p), NULL, &te));
    if (!te) return;
    const h3_te_config *c = h3_text_encoder_config(te);
    CHECK(c->hidden == 64 && c->n_layers == 4 && c->heads == 4 && c->kv_heads == 2 && c->head_dim == 32 &&
              c->intermediate == 96 && c->vocab == 256,
          "config inferred from comfy.safetensors: %s", h3_text_encoder_describe(te));
    CHECK(h3_text_encoder_layout(te) == H3_LAYOUT_COMFY, "ComfyUI names");
    check_against_fixtures(te, "comfy.safetensors");
    /* The repack has 4 layers: hidden_states[4] (all of them, un-normalized) is the last one there is. */
    int32_t id = 1;
    h3_tensor out;
    CHECK_OK(h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, 1, c->hidden, H3_MEM_ACTIVATIONS));
    CHECK_ERR(h3_text_encoder_encode(te, &g_ex, &id, 1, 5, &out), H3_ERR_INVALID, "0..4 are available");
    h3_tensor_free(&out);
    h3_text_encoder_close(te);
}

/* official/'s layer 4, final norm, lm_head and vision tensors are NaN. hidden_states[4] matched the reference
 * above (so none of them was used); hidden_states[5] runs layer 4 and is not finite, which shows the poison is
 * real. */
static void test_unused_weights_are_poison(void) {
    char p[512];
    h3_text_encoder *te = NULL;
    CHECK_OK(h3_text_encoder_open(fix("official", p, sizeof p), NULL, &te));
    if (!te) return;
    int32_t ids[3] = {5, 17, 200};
    h3_tensor out;
    CHECK_OK(h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, 3, 64, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, 3, 4, &out));
    int finite = 1;
    for (int i = 0; i < 3 * 64; i++) finite &= isfinite(((float *)out.data)[i]) != 0;
    CHECK(finite, "hidden_states[4] is finite");
    CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, 3, 5, &out));
    int nonfinite = 0;
    for (int i = 0; i < 3 * 64; i++) nonfinite += !isfinite(((float *)out.data)[i]);
    CHECK(nonfinite == 3 * 64, "hidden_states[5] runs the NaN layer: %d of %d values are not finite", nonfinite, 3 * 64);
    h3_tensor_free(&out);
    h3_text_encoder_close(te);
}

/* Weights are views in their stored dtype; encoding copies no weight. */
static void test_zero_copy(void) {
    char p[512];
    h3_text_encoder *te = NULL;
    CHECK_OK(h3_text_encoder_open(fix("comfy.safetensors", p, sizeof p), NULL, &te));
    if (!te) return;
    const h3_te_layer_weights *w = NULL;
    CHECK_OK(h3_text_encoder_layer_acquire(te, &g_ex, 2, &w));
    if (w) {
        CHECK(w->q.dtype == H3_BF16 && w->down.dtype == H3_BF16 && w->q_norm.dtype == H3_BF16, "stored dtype bf16");
        CHECK(w->q.owner == NULL && w->down.owner == NULL && w->input_norm.owner == NULL,
              "the weights are views over the mapped file");
        CHECK(w->q.shape[0] == 128 && w->q.shape[1] == 64 && w->o.shape[0] == 64 && w->o.shape[1] == 128,
              "q [heads·D, C], o [C, heads·D]");
    }
    const h3_te_layer_weights *w2 = NULL;
    CHECK_ERR(h3_text_encoder_layer_acquire(te, &g_ex, 3, &w2), H3_ERR_INVALID, "still held");
    h3_text_encoder_layer_release(te, &g_ex, 2);
    CHECK_ERR(h3_text_encoder_layer_acquire(te, &g_ex, 4, &w2), H3_ERR_INVALID, "does not exist");
    h3_mem_stats before, after;
    h3_mem_get_stats(&before);
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    h3_tensor out;
    CHECK_OK(h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, 8, 64, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, 8, 4, &out));
    h3_mem_get_stats(&after);
    CHECK(after.peak[H3_MEM_WEIGHTS] == before.peak[H3_MEM_WEIGHTS] || after.peak[H3_MEM_WEIGHTS] == 0,
          "encoding copied weights (weights peak %lld -> %lld bytes)", (long long)before.peak[H3_MEM_WEIGHTS],
          (long long)after.peak[H3_MEM_WEIGHTS]);
    h3_tensor_free(&out);
    h3_text_encoder_close(te);
}

/* Interleaved mRoPE, built here from its definition (transformers' apply_interleaved_mrope: frequency j reads axis
 * h when j % 3 == 1 and j < 3·s_h, axis w when j % 3 == 2 and j < 3·s_w, else t), with the text-only positions
 * (t = h = w = p) equals the 1-D tables the encoder uses; with distinct axes it does not (so the check can fail). */
static void mrope_tables(const h3_te_config *c, const int sec[3], const int64_t *pos3, int64_t n, float *cs,
                         float *sn) {
    const int64_t D = c->head_dim, half = D / 2;
    for (int64_t j = 0; j < half; j++) {
        int axis = 0;
        if (j % 3 == 1 && j < 3 * sec[1]) axis = 1;
        if (j % 3 == 2 && j < 3 * sec[2]) axis = 2;
        float inv = (float)(1.0 / pow(c->rope_theta, (double)(2 * j) / (double)D));
        for (int64_t p = 0; p < n; p++) {
            float ang = (float)pos3[axis * n + p] * inv;
            cs[p * D + j] = cs[p * D + j + half] = (float)cos((double)ang);
            sn[p * D + j] = sn[p * D + j + half] = (float)sin((double)ang);
        }
    }
}

static void test_text_only_mrope(void) {
    h3_te_config c;
    h3_te_config_default(&c); /* D = 128, theta = 5e6 */
    const int sec[3] = {24, 20, 20};
    const int64_t n = 300, D = c.head_dim;
    int64_t *pos = malloc(3 * (size_t)n * sizeof *pos);
    float *c1 = malloc((size_t)(n * D) * sizeof *c1), *s1 = malloc((size_t)(n * D) * sizeof *s1);
    float *c2 = malloc((size_t)(n * D) * sizeof *c2), *s2 = malloc((size_t)(n * D) * sizeof *s2);
    for (int64_t p = 0; p < n; p++) pos[p] = pos[n + p] = pos[2 * n + p] = p;
    h3_te_rope_tables(&c, n, c1, s1);
    mrope_tables(&c, sec, pos, n, c2, s2);
    CHECK(memcmp(c1, c2, (size_t)(n * D) * sizeof *c1) == 0 && memcmp(s1, s2, (size_t)(n * D) * sizeof *s1) == 0,
          "mRoPE with t = h = w = p equals 1-D RoPE, bit for bit");
    for (int64_t p = 0; p < n; p++) pos[n + p] = pos[2 * n + p] = p / 2; /* an image-like (t, h, w) */
    mrope_tables(&c, sec, pos, n, c2, s2);
    CHECK(memcmp(c1, c2, (size_t)(n * D) * sizeof *c1) != 0, "distinct axes give other tables");
    /* And the 1-D tables are the rotary definition: cos(p·θ^(−2j/D)) (angle rounded to f32 as in transformers). */
    double worst = 0;
    for (int64_t p = 0; p < n; p += 7)
        for (int64_t j = 0; j < D / 2; j++) {
            double ang = (double)p * pow(c.rope_theta, -(double)(2 * j) / (double)D);
            double e = fabs(c1[p * D + j] - cos(ang)) + fabs(s1[p * D + j + D / 2] - sin(ang));
            if (e > worst) worst = e;
        }
    CHECK(worst < 1e-4, "rotary tables differ from cos/sin(p·θ^(−2j/D)) by %.2e", worst);
    free(pos);
    free(c1);
    free(s1);
    free(c2);
    free(s2);
}

/* ---- bad files and inputs ------------------------------------------------------------------------------------ */

typedef enum { EDIT_DROP, EDIT_RESHAPE, EDIT_DTYPE, EDIT_ADD } edit_kind;

/* Writes a copy of comfy.safetensors with one change: drop a tensor, give it another shape or dtype (data
 * zero-filled), or add a tensor. */
static void write_variant(const char *out, edit_kind kind, const char *name, h3_dtype dt, int nd, int64_t d0,
                          int64_t d1) {
    char p[512];
    h3_st_set s;
    CHECK_OK(h3_st_open(fix("comfy.safetensors", p, sizeof p), &s));
    h3_st_writer *w = NULL;
    CHECK_OK(h3_st_writer_new(&w));
    void *zeros = calloc(1, 1 << 20);
    for (int64_t i = 0; i < s.n_entries; i++) {
        const h3_st_entry *e = &s.entries[i];
        int match = strcmp(e->name, name) == 0;
        if (match && kind == EDIT_DROP) continue;
        if (match && (kind == EDIT_RESHAPE || kind == EDIT_DTYPE)) {
            int64_t sh[2] = {d0, d1};
            CHECK_OK(h3_st_writer_add(w, e->name, dt, nd, sh, zeros));
            continue;
        }
        const void *data;
        CHECK_OK(h3_st_bytes(&s, e, &data));
        CHECK_OK(h3_st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, data));
    }
    if (kind == EDIT_ADD) {
        int64_t sh[2] = {d0, d1};
        CHECK_OK(h3_st_writer_add(w, name, dt, nd, sh, zeros));
    }
    CHECK_OK(h3_st_writer_write(w, out, 0));
    h3_st_writer_free(w);
    free(zeros);
    h3_st_close(&s);
}

static void test_bad_files(void) {
    char path[512], p[512];
    t_tmp_path("te_variant.safetensors", path, sizeof path);
    h3_text_encoder *te = NULL;
    static const struct {
        edit_kind kind;
        const char *name;
        h3_dtype dt;
        int nd;
        int64_t d0, d1;
        int code;
        const char *phrase;
    } cases[] = {
        {EDIT_DROP, "model.layers.2.mlp.up_proj.weight", H3_BF16, 0, 0, 0, H3_ERR_FORMAT,
         "layers.2.mlp.up_proj.weight' is missing"},
        {EDIT_RESHAPE, "model.layers.1.self_attn.v_proj.weight", H3_BF16, 2, 32, 64, H3_ERR_FORMAT,
         "has shape [32, 64]; text-encoder layer 1 needs [kv_heads·head_dim, hidden] = [64, 64]"},
        {EDIT_RESHAPE, "model.layers.3.input_layernorm.weight", H3_BF16, 1, 48, 0, H3_ERR_FORMAT,
         "has shape [48]; text-encoder layer 3 needs [hidden] = [64]"},
        {EDIT_DTYPE, "model.layers.0.mlp.down_proj.weight", H3_I8, 2, 64, 96, H3_ERR_FORMAT, "is i8 without"},
        {EDIT_ADD, "model.layers.0.self_attn.q_proj.bias", H3_BF16, 1, 128, 0, H3_ERR_UNSUPPORTED,
         "no biases"},
        {EDIT_ADD, "model.layers.0.mlp.gate_proj.comfy_quant", H3_U8, 1, 27, 0, H3_ERR_FORMAT,
         "comfy_quant marker"},
        {EDIT_DROP, "model.embed_tokens.weight", H3_BF16, 0, 0, 0, H3_ERR_FORMAT, "embed_tokens.weight"},
        {EDIT_DROP, "model.layers.0.self_attn.q_proj.weight", H3_BF16, 0, 0, 0, H3_ERR_FORMAT, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_variant(path, cases[i].kind, cases[i].name, cases[i].dt, cases[i].nd, cases[i].d0, cases[i].d1);
        h3_clear_error();
        h3_status st = h3_text_encoder_open(path, NULL, &te);
        CHECK(st == cases[i].code, "case %zu (%s): code %d, expected %d: %s", i, cases[i].name, st, cases[i].code,
              h3_last_error());
        if (cases[i].phrase)
            CHECK(strstr(h3_last_error(), cases[i].phrase) != NULL, "case %zu: message '%s' lacks '%s'", i,
                  h3_last_error(), cases[i].phrase);
        CHECK(te == NULL, "case %zu: nothing opened", i);
        h3_text_encoder_close(te);
        te = NULL;
    }
    unlink(path);
    /* A comfy_quant marker that does not fit its tensor: the message names the format and the dtype. */
    {
        h3_st_writer *w = NULL;
        h3_st_set s;
        CHECK_OK(h3_st_open(fix("comfy.safetensors", p, sizeof p), &s));
        CHECK_OK(h3_st_writer_new(&w));
        for (int64_t i = 0; i < s.n_entries; i++) {
            const void *data;
            CHECK_OK(h3_st_bytes(&s, &s.entries[i], &data));
            CHECK_OK(h3_st_writer_add(w, s.entries[i].name, s.entries[i].dtype, s.entries[i].ndim, s.entries[i].shape,
                                      data));
        }
        const char *marker = "{\"format\": \"float8_e4m3fn\"}";
        int64_t ml = (int64_t)strlen(marker);
        CHECK_OK(h3_st_writer_add(w, "model.layers.0.mlp.up_proj.comfy_quant", H3_U8, 1, &ml, marker));
        CHECK_OK(h3_st_writer_write(w, path, 0));
        h3_st_writer_free(w);
        h3_st_close(&s);
        CHECK_ERR(h3_text_encoder_open(path, NULL, &te), H3_ERR_FORMAT, "marked float8_e4m3fn but is bf16");
        unlink(path);
    }
    /* Not a text encoder. */
    CHECK_ERR(h3_text_encoder_open(t_src_path("tests/fixtures/dit/comfy_pruned.safetensors", p, sizeof p), NULL, &te),
              H3_ERR_FORMAT, "not a Qwen3-VL text encoder");
    CHECK_ERR(h3_text_encoder_open(fix("absent.safetensors", p, sizeof p), NULL, &te), H3_ERR_IO, "absent");
    /* A config.json that disagrees with the weights. */
    char dir[512], cfg[600], model[600], src[512];
    t_tmp_path("te_cfgdir", dir, sizeof dir);
    mkdir(dir, 0755);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    CHECK(symlink(fix("comfy.safetensors", src, sizeof src), model) == 0, "symlink");
    FILE *f = fopen(cfg, "w");
    fputs("{\"text_config\": {\"hidden_size\": 48, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
          "\"head_dim\": 32, \"intermediate_size\": 96, \"vocab_size\": 256, \"num_hidden_layers\": 4}}",
          f);
    fclose(f);
    CHECK_ERR(h3_text_encoder_open(dir, NULL, &te), H3_ERR_FORMAT,
              "the text encoder needs [vocab, hidden] = [256, 48]");
    f = fopen(cfg, "w");
    fputs("{\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32, "
          "\"intermediate_size\": 96, \"vocab_size\": 256, \"num_hidden_layers\": 3}",
          f);
    fclose(f);
    CHECK_ERR(h3_text_encoder_open(dir, NULL, &te), H3_ERR_FORMAT, "the weights have 4");
    f = fopen(cfg, "w");
    fputs("{\"hidden_size\": 64, \"num_attention_heads\": 4, \"hidden_act\": \"gelu\"}", f);
    fclose(f);
    CHECK_ERR(h3_text_encoder_open(dir, NULL, &te), H3_ERR_UNSUPPORTED, "gelu");
    f = fopen(cfg, "w");
    fputs("{\"hidden_size\": -3, \"num_attention_heads\": 4}", f);
    fclose(f);
    CHECK_ERR(h3_text_encoder_open(dir, NULL, &te), H3_ERR_FORMAT, "hidden_size");
    /* A plain Qwen3 config with the right numbers is used. */
    f = fopen(cfg, "w");
    fputs("{\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32, "
          "\"intermediate_size\": 96, \"vocab_size\": 256, \"num_hidden_layers\": 28, \"rope_theta\": 1000000.0}",
          f);
    fclose(f);
    CHECK_OK(h3_text_encoder_open(dir, NULL, &te));
    if (te) {
        CHECK(h3_text_encoder_config(te)->rope_theta == 1e6 && h3_text_encoder_config(te)->n_layers == 4,
              "theta from config.json, layer count from the weights");
        h3_text_encoder_close(te);
        te = NULL;
    }
    /* A model folder holding text_encoder/ opens that. */
    unlink(cfg);
    unlink(model);
    char sub[600];
    snprintf(sub, sizeof sub, "%s/text_encoder", dir);
    CHECK(symlink(fix("official", src, sizeof src), sub) == 0, "symlink");
    CHECK_OK(h3_text_encoder_open(dir, NULL, &te));
    if (te) CHECK(h3_text_encoder_config(te)->n_layers == 5, "the model folder's text_encoder/ was opened");
    h3_text_encoder_close(te);
    unlink(sub);
    rmdir(dir);
}

static void test_bad_inputs(void) {
    char p[512];
    h3_text_encoder *te = NULL;
    CHECK_OK(h3_text_encoder_open(fix("comfy.safetensors", p, sizeof p), NULL, &te));
    if (!te) return;
    h3_tensor out, wrong;
    CHECK_OK(h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, 3, 64, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc2(&wrong, H3_PLACE_HOST, H3_F32, 3, 63, H3_MEM_ACTIVATIONS));
    int32_t ids[3] = {0, 255, 7}, bad[3] = {0, 256, 7}, neg[3] = {-1, 0, 0};
    CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, 3, 2, &out));
    CHECK_ERR(h3_text_encoder_encode(te, &g_ex, bad, 3, 2, &out), H3_ERR_INVALID, "id 256");
    CHECK_ERR(h3_text_encoder_encode(te, &g_ex, neg, 3, 2, &out), H3_ERR_INVALID, "id -1");
    CHECK_ERR(h3_text_encoder_encode(te, &g_ex, ids, 0, 2, &out), H3_ERR_INVALID, "no tokens");
    CHECK_ERR(h3_text_encoder_encode(te, &g_ex, ids, 3, -1, &out), H3_ERR_INVALID, "does not exist");
    CHECK_ERR(h3_text_encoder_encode(te, &g_ex, ids, 3, 2, &wrong), H3_ERR_INVALID, "[3, 64]");
    CHECK_ERR(h3_text_encoder_encode(te, &g_ex, ids, 2, 2, &out), H3_ERR_INVALID, "[2, 64]");
    /* the placement moves after opening: to the device only in a CUDA build, and the output must follow it */
    if (h3_cuda_compiled()) {
        CHECK_OK(h3_text_encoder_set_placement(te, H3_PLACE_DEVICE));
        CHECK_ERR(h3_text_encoder_encode(te, &g_ex, ids, 3, 2, &out), H3_ERR_INVALID, "device");
    } else {
        CHECK_ERR(h3_text_encoder_set_placement(te, H3_PLACE_DEVICE), H3_ERR_UNSUPPORTED, "CUDA");
    }
    CHECK_OK(h3_text_encoder_set_placement(te, H3_PLACE_HOST));
    CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, 3, 2, &out));
    h3_tensor_free(&out);
    h3_tensor_free(&wrong);
    h3_text_encoder_close(te);
}

/* Threads and chunking change summation order only. */
static void test_threads_and_chunks(void) {
    char p[512];
    h3_text_encoder *te1 = NULL, *te2 = NULL;
    h3_te_open_opts o = {NULL, H3_PLACE_HOST, 5, NULL, NULL};
    CHECK_OK(h3_text_encoder_open(fix("comfy.safetensors", p, sizeof p), NULL, &te1));
    CHECK_OK(h3_text_encoder_open(fix("comfy.safetensors", p, sizeof p), &o, &te2));
    if (!te1 || !te2) return;
    h3_exec one;
    CHECK_OK(h3_exec_init(&one, 1));
    int32_t ids[23];
    for (int i = 0; i < 23; i++) ids[i] = (int32_t)(t_rand_u64() % 256);
    h3_tensor a, b;
    CHECK_OK(h3_tensor_alloc2(&a, H3_PLACE_HOST, H3_F32, 23, 64, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc2(&b, H3_PLACE_HOST, H3_F32, 23, 64, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_text_encoder_encode(te1, &g_ex, ids, 23, 4, &a));
    CHECK_OK(h3_text_encoder_encode(te2, &one, ids, 23, 4, &b));
    double *r = malloc(23 * 64 * sizeof *r);
    for (int i = 0; i < 23 * 64; i++) r[i] = ((float *)a.data)[i];
    EXPECT_CLOSE("1 thread, 5-row MLP chunks vs default", b.data, r, 23 * 64, 1e-5);
    /* Causality: the first 10 tokens' states do not depend on the tokens after them. */
    h3_tensor c;
    CHECK_OK(h3_tensor_alloc2(&c, H3_PLACE_HOST, H3_F32, 10, 64, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_text_encoder_encode(te1, &g_ex, ids, 10, 4, &c));
    EXPECT_CLOSE("prefix of 10 tokens vs the same rows of 23", c.data, r, 10 * 64, 1e-5);
    free(r);
    h3_tensor_free(&a);
    h3_tensor_free(&b);
    h3_tensor_free(&c);
    h3_exec_free(&one);
    h3_text_encoder_close(te1);
    h3_text_encoder_close(te2);
}

typedef struct {
    int calls, last_done, last_total, stop_after;
} layer_ctx;

static int on_layer(void *user, int done, int total) {
    layer_ctx *c = user;
    c->calls++;
    c->last_done = done;
    c->last_total = total;
    return c->stop_after && done >= c->stop_after;
}

/* The per-layer callback: once per layer in order; nonzero stops the encode there (interruption). */
static void test_layer_callback(void) {
    char p[512];
    layer_ctx lc = {0, 0, 0, 0};
    h3_te_open_opts o = {NULL, H3_PLACE_HOST, 0, on_layer, &lc};
    h3_text_encoder *te = NULL;
    CHECK_OK(h3_text_encoder_open(fix("comfy.safetensors", p, sizeof p), &o, &te));
    if (!te) return;
    int32_t ids[5] = {1, 2, 3, 4, 5};
    h3_tensor a;
    CHECK_OK(h3_tensor_alloc2(&a, H3_PLACE_HOST, H3_F32, 5, 64, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, 5, 4, &a));
    CHECK(lc.calls == 4 && lc.last_done == 4 && lc.last_total == 4, "%d calls, last %d of %d", lc.calls,
          lc.last_done, lc.last_total);
    lc = (layer_ctx){0, 0, 0, 2};
    h3_te_stats s0, s1;
    h3_text_encoder_get_stats(te, &s0);
    CHECK_ERR(h3_text_encoder_encode(te, &g_ex, ids, 5, 4, &a), H3_ERR_INTERRUPTED,
              "stopped after layer 2 of 4");
    h3_text_encoder_get_stats(te, &s1);
    CHECK(lc.calls == 2 && s1.layers_run - s0.layers_run == 2 && s1.releases - s0.releases == 2,
          "stopped after %d calls, %lld layers run", lc.calls, (long long)(s1.layers_run - s0.layers_run));
    /* it encodes again afterwards */
    lc = (layer_ctx){0, 0, 0, 0};
    CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, 5, 4, &a));
    h3_tensor_free(&a);
    h3_text_encoder_close(te);
}

/* Opens `path` and encodes 4 tokens with allocation n failing, for every n until none fails: each failure is an
 * out-of-memory error that leaks nothing. */
static void alloc_failures_of(const char *path) {
    h3_mem_stats base;
    h3_mem_get_stats(&base);
    int failures = 0;
    for (int n = 1; n < 20000; n++) {
        h3_mem_fail_at(n, 0);
        h3_text_encoder *te = NULL;
        h3_tensor out = {0};
        int32_t ids[4] = {3, 1, 4, 1};
        h3_clear_error();
        h3_status st = h3_text_encoder_open(path, NULL, &te);
        if (st == H3_OK) st = h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, 4, 64, H3_MEM_ACTIVATIONS);
        if (st == H3_OK) st = h3_text_encoder_encode(te, &g_ex, ids, 4, 2, &out);
        int64_t ticks = h3_mem_fail_at(0, 0);
        h3_tensor_free(&out);
        h3_text_encoder_close(te);
        h3_mem_stats now;
        h3_mem_get_stats(&now);
        CHECK(now.total_current == base.total_current, "%s, failing allocation %d leaked %lld bytes", path, n,
              (long long)(now.total_current - base.total_current));
        if (st == H3_OK) {
            CHECK(ticks < n, "succeeded although allocation %d should have failed", n);
            break;
        }
        failures++;
        CHECK(st == H3_ERR_NOMEM, "%s, failing allocation %d: expected out of memory, got %d: %s", path, n, st,
              h3_last_error());
    }
    CHECK(failures > 10, "%s: only %d allocation points were exercised", path, failures);
    printf("  %s: %d allocation points fail cleanly\n", h3_path_base(path), failures);
}

/* Every allocation of opening and encoding can fail; each failure is an error and leaks nothing.
 * Only the single-file repack is looped over: official/ has JSON files (shard index, config) with strings longer
 * than jansson's initial 16-byte buffer, and jansson's lexer ignores a failed growth of that buffer (lex_save), so
 * an injected failure at a string's closing quote makes jansson read past its buffer. That is a jansson defect
 * under injected failures, outside this module; the config and index paths are covered by the cases above. */
static void test_alloc_failures(void) {
    char p[512];
    alloc_failures_of(fix("comfy.safetensors", p, sizeof p));
}

/* ---- quantized weights ---------------------------------------------------------------------------------- */

/* A plain f32 copy of a weight set: every weight decoded by the loader (h3_qweight_get + h3_tensor_rows_to_f32)
 * under its set name, companions left out. Encoding with it must give what the quantized file gives. */
static void write_twin(const char *src, const char *dst) {
    h3_st_set s;
    h3_gguf *g = NULL;
    CHECK_OK(h3_weights_open(src, &s, &g));
    h3_st_writer *w = NULL;
    CHECK_OK(h3_st_writer_new(&w));
    float **bufs = calloc((size_t)s.n_entries + 1, sizeof *bufs);
    for (int64_t i = 0; i < s.n_entries; i++) {
        const h3_st_entry *e = &s.entries[i];
        if (h3_qweight_is_companion(e->name) || !strncmp(e->name, "visual.", 7)) continue;
        h3_tensor t;
        CHECK_OK(h3_qweight_get(&s, g, e, &t));
        if (!t.data) continue;
        bufs[i] = malloc((size_t)h3_tensor_numel(&t) * sizeof(float));
        CHECK_OK(h3_tensor_rows_to_f32(&t, 0, h3_tensor_rows(&t), bufs[i]));
        CHECK_OK(h3_st_writer_add(w, e->name, H3_F32, t.ndim, t.shape, bufs[i]));
        h3_tensor_free(&t);
    }
    CHECK_OK(h3_st_writer_write(w, dst, 0));
    h3_st_writer_free(w);
    for (int64_t i = 0; i < s.n_entries; i++) free(bufs[i]);
    free(bufs);
    h3_st_close(&s);
    h3_gguf_free(g);
}

/* hidden_states[4] of prompt "a" through te into a new tensor. */
static h3_status encode_a(h3_text_encoder *te, h3_tensor *out) {
    char p[512];
    h3_st_set exp;
    H3_TRY(h3_st_open(fix("expected.safetensors", p, sizeof p), &exp));
    int64_t n;
    int32_t *ids = load_ids(&exp, "a", &n);
    h3_st_close(&exp);
    if (!ids) return H3_ERR_NOT_FOUND;
    h3_status st = h3_tensor_alloc2(out, H3_PLACE_HOST, H3_F32, n, h3_text_encoder_config(te)->hidden, H3_MEM_ACTIVATIONS);
    if (st == H3_OK) st = h3_text_encoder_encode(te, &g_ex, ids, n, USED_LAYERS, out);
    free(ids);
    return st;
}

static double rel_to(const h3_tensor *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)((const float *)a->data)[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* A quantized text encoder: its describe names the format; it computes what its decoded twin computes (f32
 * rounding: 1e-5) and hidden_states[4] within the format's error of the bf16 reference (rel_tol). */
static void check_quantized(const char *path, const char *label, double rel_tol) {
    char twin[512], p[512];
    t_tmp_path("te_twin.safetensors", twin, sizeof twin);
    h3_text_encoder *te = NULL, *tw = NULL;
    CHECK_OK(h3_text_encoder_open(path, NULL, &te));
    if (!te) return;
    CHECK(strstr(h3_text_encoder_describe(te), label) != NULL, "describe names %s: %s", label,
          h3_text_encoder_describe(te));
    write_twin(path, twin);
    CHECK_OK(h3_text_encoder_open(twin, NULL, &tw));
    h3_tensor a = {0}, b = {0}, ref = {0};
    CHECK_OK(encode_a(te, &a));
    if (tw) CHECK_OK(encode_a(tw, &b));
    h3_st_set exp;
    CHECK_OK(h3_st_open(fix("expected.safetensors", p, sizeof p), &exp));
    CHECK_OK(h3_st_load(&exp, "hidden.a.4", H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &ref));
    if (a.data && b.data && ref.data) {
        int64_t n = h3_tensor_numel(&ref);
        double et = rel_to(&a, b.data, n), er = rel_to(&a, ref.data, n);
        CHECK(et <= 1e-5, "%s vs its decoded twin: rel L2 %.2e > 1e-5", label, et);
        CHECK(er <= rel_tol, "%s vs the bf16 reference: rel L2 %.3f > %.2f", label, er, rel_tol);
        printf("  %-34s hidden_states[4]: vs decoded twin %.1e, vs bf16 reference %.4f (bound %.2f)\n", label, et, er,
               rel_tol);
    }
    h3_tensor_free(&a);
    h3_tensor_free(&b);
    h3_tensor_free(&ref);
    h3_st_close(&exp);
    h3_text_encoder_close(te);
    h3_text_encoder_close(tw);
    unlink(twin);
}

/* The reference's ComfyUI nvfp4 file (AWQ pre_quant_scale on o_proj and down_proj, the int8 embedding), the
 * llama.cpp-named GGUF, and h3run's own quantized files of the official folder in every format. */
static void test_quantized(void) {
    char p[512], out[512];
    check_quantized(t_src_path("tests/fixtures/quant/te_nvfp4_awq.safetensors", p, sizeof p), "nvfp4 awq", 0.3);
    check_quantized(t_src_path("tests/fixtures/quant/te.gguf", p, sizeof p), "Q4_0", 0.2);
    t_tmp_path("te_q.safetensors", out, sizeof out);
    const struct {
        h3_qtarget t;
        const char *label;
        double tol;
    } f[] = {{H3_QT_INT8, "int8_tensorwise", 0.05},
             {H3_QT_INT8_CONVROT, "int8_tensorwise convrot", 0.05},
             {H3_QT_FP8, "float8_e4m3fn", 0.1},
             {H3_QT_NVFP4, "nvfp4 (full-precision matmul)", 0.3}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        h3_quantize_opts o = {f[i].t, 0, g_ex.pool};
        h3_quantize_result r;
        CHECK_OK(h3_quantize_checkpoint(fix("official", p, sizeof p), out, &o, &r));
        CHECK(r.comp == H3_COMP_TEXT_ENCODER && r.in_layout == H3_LAYOUT_OFFICIAL && r.n_quantized >= 7 * 5,
              "%s: %lld layers quantized", f[i].label, (long long)r.n_quantized);
        check_quantized(out, f[i].label, f[i].tol);
        /* The file holds ComfyUI's names: no lm_head, no final norm, visual.* without "model.". */
        h3_st_set s;
        CHECK_OK(h3_st_open(out, &s));
        CHECK(!h3_st_find(&s, "lm_head.weight") && !h3_st_find(&s, "model.norm.weight") &&
                  !h3_st_find(&s, "model.language_model.embed_tokens.weight") && h3_st_find(&s, "model.embed_tokens.weight"),
              "%s: ComfyUI names", f[i].label);
        h3_st_close(&s);
    }
    unlink(out);
}

/* Opening and encoding with a quantized file under every failing allocation (nvfp4 with AWQ and the int8
 * embedding; the GGUF file). */
static void test_quantized_alloc_failures(void) {
    char p[512];
    alloc_failures_of(t_src_path("tests/fixtures/quant/te_nvfp4_awq.safetensors", p, sizeof p));
    alloc_failures_of(t_src_path("tests/fixtures/quant/te.gguf", p, sizeof p));
}

static void test_setup(void) {
    CHECK_OK(h3_exec_init(&g_ex, 2));
}

static void test_teardown(void) {
    h3_exec_free(&g_ex);
}

/* ---- hidden_states[n_layers]: after the final norm
 * --------------------------------------------------------- */

/* transformers' hidden_states[N] of an N-layer model is the last layer's output after model.norm (its other
 * entries are un-normalized). A file with the final norm holds the last layer, so encode N gives norm(raw):
 * checked against the reference's un-normalized hidden_states[4] normalized here in float64 (x / sqrt(mean x²
 * + eps) · w, eps 1e-6). hidden_states[3] stays raw. A file whose config says it holds every layer but that
 * lacks the norm cannot give hidden_states[N]: refused. The repack (no config, no norm) is a truncation of a
 * deeper model, where hidden_states[N] is un-normalized (the other tests). */
static void test_final_norm(void) {
    char p[512], dir[512], model[600], cfg[600];
    h3_st_set src, exp;
    CHECK_OK(h3_st_open(fix("comfy.safetensors", p, sizeof p), &src));
    CHECK_OK(h3_st_open(fix("expected.safetensors", p, sizeof p), &exp));
    t_tmp_path("te_norm", dir, sizeof dir);
    mkdir(dir, 0755);
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    const int64_t C = 64;
    uint16_t w16[64];
    double w[64];
    for (int i = 0; i < C; i++) {
        w16[i] = h3_f32_to_bf16((float)t_uniform(0.5, 1.5));
        w[i] = h3_bf16_to_f32(w16[i]);
    }
    for (int with_norm = 1; with_norm >= 0; with_norm--) {
        h3_st_writer *wr = NULL;
        CHECK_OK(h3_st_writer_new(&wr));
        for (int64_t i = 0; i < src.n_entries; i++) {
            const void *d;
            CHECK_OK(h3_st_bytes(&src, &src.entries[i], &d));
            CHECK_OK(h3_st_writer_add(wr, src.entries[i].name, src.entries[i].dtype, src.entries[i].ndim,
                                      src.entries[i].shape, d));
        }
        if (with_norm) CHECK_OK(h3_st_writer_add(wr, "model.norm.weight", H3_BF16, 1, &C, w16));
        CHECK_OK(h3_st_writer_write(wr, model, 0));
        h3_st_writer_free(wr);
        if (!with_norm) { /* a config that says the file holds all 4 layers */
            FILE *f = fopen(cfg, "w");
            fputs("{\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                  "\"head_dim\": 32, "
                  "\"intermediate_size\": 96, \"vocab_size\": 256, \"num_hidden_layers\": 4}",
                  f);
            fclose(f);
        }
        h3_text_encoder *te = NULL;
        CHECK_OK(h3_text_encoder_open(dir, NULL, &te));
        if (!te) continue;
        int64_t n;
        int32_t *ids = load_ids(&exp, "a", &n);
        h3_tensor out;
        CHECK_OK(h3_tensor_alloc2(&out, H3_PLACE_HOST, H3_F32, n, C, H3_MEM_ACTIVATIONS));
        if (with_norm) {
            CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, n, 3, &out));
            compare_hidden("with a final norm, raw", &out, &exp, "a", 3);
            CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, n, 4, &out));
            h3_tensor ref;
            CHECK_OK(h3_st_load(&exp, "hidden.a.4", H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &ref));
            double *want = malloc((size_t)(n * C) * sizeof *want);
            const float *r = ref.data;
            for (int64_t t = 0; t < n; t++) {
                double ss = 0;
                for (int64_t c = 0; c < C; c++) ss += (double)r[t * C + c] * r[t * C + c];
                double k = 1.0 / sqrt(ss / (double)C + 1e-6);
                for (int64_t c = 0; c < C; c++) want[t * C + c] = r[t * C + c] * k * w[c];
            }
            EXPECT_CLOSE("hidden_states[4] = model.norm(layer 3's output)", out.data, want, (size_t)(n * C),
                         1e-4);
            free(want);
            h3_tensor_free(&ref);
        } else {
            CHECK_OK(h3_text_encoder_encode(te, &g_ex, ids, n, 3, &out));
            CHECK_ERR(
                h3_text_encoder_encode(te, &g_ex, ids, n, 4, &out), H3_ERR_INVALID,
                "hidden_states[4] of a 4-layer model is taken after the final norm ('model.norm.weight')");
        }
        h3_tensor_free(&out);
        free(ids);
        h3_text_encoder_close(te);
    }
    unlink(cfg);
    unlink(model);
    rmdir(dir);
    h3_st_close(&src);
    h3_st_close(&exp);
}

/* ---- the weight table's contract: every tensor, one at a time
 * ------------------------------------------------ */

static h3_status te_load(const char *path, void *user) {
    (void)user;
    h3_text_encoder *te = NULL;
    h3_status st = h3_text_encoder_open(path, NULL, &te);
    h3_text_encoder_close(te);
    return st;
}

/* Never read: the vision tower and the LM head. A file without a config takes its vocabulary from the
 * embedding's rows, whatever their count. */
static int te_accepts(const char *name, t_mutation m, void *user) {
    const int inferred = *(const int *)user;
    if (inferred && m == T_MUT_TRUNCATE && !strcmp(name, "model.embed_tokens.weight")) return 1;
    return h3_str_starts_with(name, "visual.") || h3_str_starts_with(name, "model.visual.") ||
           h3_str_starts_with(name, "lm_head.");
}

/* A quantized file: its weights' storage (markers, block scales, AWQ's pre_quant_scale) has checks of its own
 * in quant/qload; here only a crash is wrong. */
static int te_any(const char *name, t_mutation m, void *user) {
    (void)name;
    (void)m;
    (void)user;
    return 2;
}

/* Every tensor of both fixtures emptied, truncated, reshaped and retyped: refused in the binder's one message
 * form (the final norm too: it is read for hidden_states[n_layers]), never a crash; and the nvfp4 + AWQ file
 * never crashes. */
static void test_weight_sweep(void) {
    char p[512];
    int inferred = 0;
    t_sweep("nvfp4 + AWQ", t_src_path("tests/fixtures/quant/te_nvfp4_awq.safetensors", p, sizeof p), te_load,
            te_any, NULL, 0);
    t_sweep("official", fix("official", p, sizeof p), te_load, te_accepts, &inferred, 0);
    inferred = 1;
    t_sweep("comfy.safetensors", fix("comfy.safetensors", p, sizeof p), te_load, te_accepts, &inferred, 0);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"setup", test_setup},
        {"official", test_official},
        {"comfy", test_comfy},
        {"unused_weights_are_poison", test_unused_weights_are_poison},
        {"zero_copy", test_zero_copy},
        {"text_only_mrope", test_text_only_mrope},
        {"bad_files", test_bad_files},
        {"weight_sweep", test_weight_sweep},
        {"final_norm", test_final_norm},
        {"bad_inputs", test_bad_inputs},
        {"threads_and_chunks", test_threads_and_chunks},
        {"layer_callback", test_layer_callback},
        {"alloc_failures", test_alloc_failures},
        {"quantized", test_quantized},
        {"quantized_alloc_failures", test_quantized_alloc_failures},
        {"teardown", test_teardown},
        {NULL, NULL},
    };
    return t_main("test_text_encoder", cases, argc, argv);
}

/* The Qwen3-VL text path up to hidden_states[layer]. The contract and the layer's formulas are in
 * text_encoder.h. */
#include "models/text_encoder.h"

#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "cuda/cuda.h"
#include "io/safetensors.h"
#include "io/wbind.h"
#include "mem/pack.h"
#include "mem/units.h"
#include "quant/qload.h"
#include "quant/quant.h"

#define TE_ACT_DTYPE H3_F32  /* the output, and every activation on the host */
#define TE_DEV_DTYPE H3_BF16 /* activations on the device (as transformers runs the model in bf16) */

struct h3_text_encoder {
    h3_te_config cfg;
    h3_layout layout;
    const char *prefix; /* "model.language_model." or "model." */
    char *source;
    char describe[400];
    h3_st_set set;
    int have_set;
    struct h3_gguf *gguf;     /* the GGUF index when the weights are a .gguf file, else NULL */
    h3_qweight_reader rd;     /* how the binder reads the stored formats */
    h3_wbind wb;              /* the binder over the set (io/wbind.h): every weight is reached through it */
    const h3_st_entry *embed; /* [vocab, C] */
    h3_tensor final_norm;     /* the final RMSNorm [C] (a view), when the file has one */
    int complete;      /* the file holds the model's last layer: hidden_states[n_layers] is after the norm */
    h3_tensor embed_q; /* a quantized table (ComfyUI's int8 embedding, GGUF blocks): rows decoded on use */
    char weight_label[64]; /* the stored format of the linears, for describe */
    h3_place act_place;
    int64_t chunk_rows;
    int (*on_layer)(void *, int, int);
    void *on_layer_user;
    h3_te_layer_weights cur; /* the acquired layer's views */
    int acquired;            /* index of the acquired layer, -1 if none */
    h3_te_stats stats;
    char *config_file; /* the config.json read, or NULL */
};

/* ---- config ----------------------------------------------------------------------------------------------
 */

void h3_te_config_default(h3_te_config *c) {
    memset(c, 0, sizeof *c);
    c->hidden = 5120;
    c->n_layers = 64;
    c->heads = 64;
    c->kv_heads = 8;
    c->head_dim = 128;
    c->intermediate = 25600;
    c->vocab = 151936;
    c->max_positions = 262144;
    c->rope_theta = 5e6;
    c->rms_eps = 1e-6;
    c->mrope_section[0] = 24;
    c->mrope_section[1] = 20;
    c->mrope_section[2] = 20;
}

/* "mrope_section": [t, h, w] of rope_parameters (transformers 5) or rope_scaling (4.x). */
static h3_status get_mrope(const json_t *o, const char *what, h3_te_config *c) {
    const json_t *a = json_is_object(o) ? json_object_get(o, "mrope_section") : NULL;
    if (!a || json_is_null(a)) return H3_OK;
    if (!json_is_array(a) || json_array_size(a) != 3)
        return H3_ERR(H3_ERR_FORMAT, "%s: \"mrope_section\" must be 3 integers (t, h, w), e.g. [24, 20, 20]",
                      what);
    for (int i = 0; i < 3; i++) {
        const json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 4096)
            return H3_ERR(H3_ERR_FORMAT,
                          "%s: \"mrope_section\" must be 3 integers (t, h, w), e.g. [24, 20, 20]", what);
        c->mrope_section[i] = json_integer_value(v);
    }
    return H3_OK;
}

static h3_status get_pos_int(const json_t *o, const char *key, const char *what, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return H3_OK;
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > ((int64_t)1 << 40))
        return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be a positive integer", what, key);
    *out = json_integer_value(v);
    return H3_OK;
}

static h3_status get_pos_num(const json_t *o, const char *key, const char *what, double *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return H3_OK;
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return H3_ERR(H3_ERR_FORMAT, "%s: \"%s\" must be a positive number", what, key);
    *out = json_number_value(v);
    return H3_OK;
}

h3_status h3_te_config_from_json(const json_t *j, const char *what, h3_te_config *c) {
    if (!json_is_object(j)) return H3_ERR(H3_ERR_FORMAT, "%s is not a JSON object", what);
    const json_t *t = json_object_get(j, "text_config");
    if (t && !json_is_object(t)) return H3_ERR(H3_ERR_FORMAT, "%s: \"text_config\" is not an object", what);
    if (!t) t = j;
    H3_TRY(get_pos_int(t, "hidden_size", what, &c->hidden));
    H3_TRY(get_pos_int(t, "num_hidden_layers", what, &c->n_layers));
    H3_TRY(get_pos_int(t, "num_attention_heads", what, &c->heads));
    H3_TRY(get_pos_int(t, "num_key_value_heads", what, &c->kv_heads));
    H3_TRY(get_pos_int(t, "head_dim", what, &c->head_dim));
    H3_TRY(get_pos_int(t, "intermediate_size", what, &c->intermediate));
    H3_TRY(get_pos_int(t, "vocab_size", what, &c->vocab));
    H3_TRY(get_pos_int(t, "max_position_embeddings", what, &c->max_positions));
    H3_TRY(get_pos_num(t, "rms_norm_eps", what, &c->rms_eps));
    H3_TRY(get_pos_num(t, "rope_theta", what, &c->rope_theta));
    /* transformers 5 keeps theta under rope_parameters; older versions have rope_scaling for the mRoPE part.
     */
    const json_t *rp = json_object_get(t, "rope_parameters");
    H3_TRY(get_mrope(json_object_get(t, "rope_scaling"), what, c));
    H3_TRY(get_mrope(rp, what, c));
    if (json_is_object(rp)) {
        H3_TRY(get_pos_num(rp, "rope_theta", what, &c->rope_theta));
        const char *type = h3_json_get_str(rp, "rope_type");
        if (type && strcmp(type, "default") != 0)
            return H3_ERR(H3_ERR_UNSUPPORTED, "%s: rope_type '%s' is not supported (Qwen3-VL uses 'default')",
                          what, type);
    }
    const char *act = h3_json_get_str(t, "hidden_act");
    if (act && strcmp(act, "silu") != 0)
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (Qwen3 uses silu)", what,
                      act);
    if (json_is_true(json_object_get(t, "attention_bias")))
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: attention biases are not supported (Qwen3 has none)", what);
    if (c->heads % c->kv_heads)
        return H3_ERR(H3_ERR_FORMAT, "%s: %lld attention heads are not a multiple of %lld key/value heads",
                      what, (long long)c->heads, (long long)c->kv_heads);
    if (c->head_dim % 2)
        return H3_ERR(H3_ERR_FORMAT, "%s: head_dim %lld is odd", what, (long long)c->head_dim);
    return H3_OK;
}

/* ---- opening ---------------------------------------------------------------------------------------------
 */

static const h3_st_entry *find_p(const h3_text_encoder *te, const char *name) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s%s", te->prefix, name);
    return h3_st_find(&te->set, buf);
}

/* ---- the weight table ------------------------------------------------------------------------------------
 */

enum { TD_NONE, TD_C, TD_Q, TD_KV, TD_D, TD_F }; /* the widths a layer's shapes are made of */

/* The tensors of a layer in a fixed order (the device packs them so), with the shape each role needs. */
static const struct {
    const char *name;
    size_t off;
    int d0, d1; /* TD_*: d1 TD_NONE for vectors */
    const char *words;
} g_layer_fields[] = {
    {"input_layernorm.weight", offsetof(h3_te_layer_weights, input_norm), TD_C, TD_NONE, "[hidden]"},
    {"post_attention_layernorm.weight", offsetof(h3_te_layer_weights, post_norm), TD_C, TD_NONE, "[hidden]"},
    {"self_attn.q_proj.weight", offsetof(h3_te_layer_weights, q), TD_Q, TD_C, "[heads·head_dim, hidden]"},
    {"self_attn.k_proj.weight", offsetof(h3_te_layer_weights, k), TD_KV, TD_C, "[kv_heads·head_dim, hidden]"},
    {"self_attn.v_proj.weight", offsetof(h3_te_layer_weights, v), TD_KV, TD_C, "[kv_heads·head_dim, hidden]"},
    {"self_attn.o_proj.weight", offsetof(h3_te_layer_weights, o), TD_C, TD_Q, "[hidden, heads·head_dim]"},
    {"self_attn.q_norm.weight", offsetof(h3_te_layer_weights, q_norm), TD_D, TD_NONE, "[head_dim]"},
    {"self_attn.k_norm.weight", offsetof(h3_te_layer_weights, k_norm), TD_D, TD_NONE, "[head_dim]"},
    {"mlp.gate_proj.weight", offsetof(h3_te_layer_weights, gate), TD_F, TD_C, "[intermediate, hidden]"},
    {"mlp.up_proj.weight", offsetof(h3_te_layer_weights, up), TD_F, TD_C, "[intermediate, hidden]"},
    {"mlp.down_proj.weight", offsetof(h3_te_layer_weights, down), TD_C, TD_F, "[hidden, intermediate]"},
};
#define TE_N_FIELDS ((int)(sizeof g_layer_fields / sizeof g_layer_fields[0]))

static h3_tensor *layer_field(h3_te_layer_weights *w, int i) {
    return (h3_tensor *)((char *)w + g_layer_fields[i].off);
}

static int64_t width(const h3_te_config *c, int d) {
    switch (d) {
        case TD_C:
            return c->hidden;
        case TD_Q:
            return c->heads * c->head_dim;
        case TD_KV:
            return c->kv_heads * c->head_dim;
        case TD_D:
            return c->head_dim;
        case TD_F:
            return c->intermediate;
        default:
            return 0;
    }
}

/* Layer l's rows into rows[TE_N_FIELDS] (names into names[]), bound into w (may be NULL: checks only).
 * Matrices may be stored quantized; vectors are plain floats (in GGUF files they may be blocks too). */
static void layer_rows(const h3_text_encoder *te, int l, h3_te_layer_weights *w, h3_wb_row *rows,
                       char (*names)[96]) {
    const h3_te_config *c = &te->cfg;
    for (int i = 0; i < TE_N_FIELDS; i++) {
        const int mat = g_layer_fields[i].d1 != TD_NONE;
        snprintf(names[i], 96, "layers.%d.%s", l, g_layer_fields[i].name);
        rows[i] = h3_wb_row_make(names[i], w ? layer_field(w, i) : NULL, mat ? 2 : 1,
                                 width(c, g_layer_fields[i].d0), width(c, g_layer_fields[i].d1), 0, 0,
                                 H3_WB_FLOATS, mat || te->gguf ? H3_WB_QUANT : 0u, g_layer_fields[i].words,
                                 (h3_wb_unit){"text-encoder layer", l, l});
    }
}

static h3_wb_row embed_row(const h3_text_encoder *te) {
    return h3_wb_row_make("embed_tokens.weight", NULL, 2, te->cfg.vocab, te->cfg.hidden, 0, 0, H3_WB_FLOATS,
                          H3_WB_QUANT, "[vocab, hidden]", (h3_wb_unit){NULL, 0, -1});
}

static h3_wb_row norm_row(const h3_text_encoder *te, h3_tensor *dst) {
    return h3_wb_row_make("norm.weight", dst, 1, te->cfg.hidden, 0, 0, 0, H3_WB_FLOATS,
                          H3_WB_OPTIONAL | (te->gguf ? H3_WB_QUANT : 0u), "[hidden]",
                          (h3_wb_unit){NULL, 0, -1});
}

/* An anchor of a config inferred from the shapes: a weight of rank nd with every size at least 1; its logical
 * shape into out (NULL entry: missing is an error). */
static h3_status anchor(const h3_text_encoder *te, const char *name, int nd, const char *words,
                        int64_t *out) {
    const h3_wb_unit model = {NULL, 0, -1};
    h3_wb_row r = h3_wb_row_make(name, NULL, nd, H3_WB_ANY, H3_WB_ANY, 0, 0, H3_WB_FLOATS,
                                 nd == 2 || te->gguf ? H3_WB_QUANT : 0u, words, model);
    h3_wb_info in;
    H3_TRY(h3_wb_check(&te->wb, &r, NULL, &in));
    for (int i = 0; i < nd; i++)
        if (in.shape[i] < 1)
            return h3_wb_shape_error(&te->wb, name, in.ndim, in.shape, &model,
                                     "%s with every size at least 1", words);
    memcpy(out, in.shape, (size_t)nd * sizeof *out);
    return H3_OK;
}

/* Widths from the tensor shapes (files without config.json: the ComfyUI and Wan2GP repacks), each checked in
 * the binder's message form; the rows then check every tensor against them. */
static h3_status infer_config(h3_text_encoder *te, h3_te_config *c) {
    const h3_wb_unit model = {NULL, 0, -1};
    int64_t s[2];
    h3_te_config_default(c);
    H3_TRY(anchor(te, "embed_tokens.weight", 2, "[vocab, hidden]", s));
    c->vocab = s[0];
    c->hidden = s[1];
    H3_TRY(anchor(te, "layers.0.self_attn.q_norm.weight", 1, "[head_dim]", s));
    if (s[0] % 2)
        return h3_wb_shape_error(&te->wb, "layers.0.self_attn.q_norm.weight", 1, s, &model,
                                 "[head_dim] with an even head_dim (rotary pairs)");
    c->head_dim = s[0];
    static const char *const qk[2] = {"layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight"};
    int64_t heads[2];
    for (int i = 0; i < 2; i++) {
        H3_TRY(anchor(te, qk[i], 2, i ? "[kv_heads·head_dim, hidden]" : "[heads·head_dim, hidden]", s));
        if (s[0] % c->head_dim)
            return h3_wb_shape_error(&te->wb, qk[i], 2, s, &model,
                                     "rows in whole heads of head_dim %lld (from q_norm)",
                                     (long long)c->head_dim);
        heads[i] = s[0] / c->head_dim;
    }
    if (heads[0] % heads[1]) {
        int64_t q[2] = {heads[0] * c->head_dim, c->hidden};
        return h3_wb_shape_error(&te->wb, qk[0], 2, q, &model,
                                 "a multiple of k_proj's %lld key/value heads (grouped-query attention)",
                                 (long long)heads[1]);
    }
    c->heads = heads[0];
    c->kv_heads = heads[1];
    H3_TRY(anchor(te, "layers.0.mlp.gate_proj.weight", 2, "[intermediate, hidden]", s));
    c->intermediate = s[0];
    return H3_OK;
}

/* config.json: the given one, else the one beside the weights when it describes a Qwen3(-VL) text model. */
static h3_status read_config(h3_text_encoder *te, const char *dir, const h3_te_open_opts *o, h3_te_config *c,
                             int *found, char *src, size_t srcn) {
    *found = 0;
    json_t *j = NULL;
    char *cand = NULL;
    h3_status st = H3_OK;
    if (o && o->config_path) {
        H3_CHECK_CTX(h3_json_load_file(o->config_path, 4u << 20, &j), "reading the text-encoder config");
        h3_te_config_default(c);
        H3_CHECK(h3_te_config_from_json(j, o->config_path, c));
        snprintf(src, srcn, "%s", o->config_path);
        *found = 1;
        goto done;
    }
    cand = h3_path_join(dir, "config.json");
    if (!cand) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    if (h3_path_is_file(cand)) {
        H3_CHECK_CTX(h3_json_load_file(cand, 4u << 20, &j), "reading the config beside the text encoder");
        const json_t *t = json_object_get(j, "text_config");
        if (!t) t = j;
        if (json_object_get(t, "hidden_size") && json_object_get(t, "num_attention_heads")) {
            h3_te_config_default(c);
            H3_CHECK(h3_te_config_from_json(j, cand, c));
            snprintf(src, srcn, "%s", cand);
            *found = 1;
        }
    }
    (void)te;
done:
    json_decref(j);
    h3_free(cand);
    return st;
}

/* Every layer's rows, and no attention biases (Qwen3 has none; a file with them is some other model). Headers
 * only. */
static h3_status check_layers(h3_text_encoder *te) {
    const h3_te_config *c = &te->cfg;
    h3_wb_row rows[TE_N_FIELDS];
    char names[TE_N_FIELDS][96], n[160];
    for (int64_t l = 0; l < c->n_layers; l++) {
        layer_rows(te, (int)l, NULL, rows, names);
        H3_TRY(h3_wb_check_rows(&te->wb, rows, TE_N_FIELDS));
        static const char *const lin[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                          "self_attn.o_proj"};
        for (int k = 0; k < 4; k++) {
            snprintf(n, sizeof n, "layers.%lld.%s.bias", (long long)l, lin[k]);
            if (find_p(te, n))
                return H3_ERR(H3_ERR_UNSUPPORTED, "%s: '%s%s' exists; Qwen3 attention has no biases",
                              te->source, te->prefix, n);
        }
    }
    return H3_OK;
}

h3_status h3_text_encoder_set_placement(h3_text_encoder *te, h3_place act_place) {
    if (act_place == H3_PLACE_DEVICE && !h3_cuda_compiled())
        return H3_ERR(H3_ERR_UNSUPPORTED, "text encoder: activations on the device need a build with CUDA");
    te->act_place = act_place;
    return H3_OK;
}

h3_status h3_text_encoder_open(const char *path, const h3_te_open_opts *opts, h3_text_encoder **out) {
    *out = NULL;
    if (!path) return H3_ERR(H3_ERR_INVALID, "text encoder: no path");
    h3_status st = H3_OK;
    char *sub = NULL, *dir = NULL;
    h3_text_encoder *te = h3_calloc(1, sizeof *te, H3_MEM_OTHER);
    if (!te) return H3_ERR_NOMEM;
    te->acquired = -1;
    te->stats.max_layer_acquired = -1;
    te->act_place = opts ? opts->act_place : H3_PLACE_HOST;
    te->chunk_rows = (opts && opts->chunk_rows > 0) ? opts->chunk_rows : 512;
    te->on_layer = opts ? opts->on_layer : NULL;
    te->on_layer_user = opts ? opts->on_layer_user : NULL;
    if (te->act_place == H3_PLACE_DEVICE && !h3_cuda_compiled())
        H3_FAIL(H3_ERR_UNSUPPORTED, "text encoder: activations on the device need a build with CUDA");
    /* A model folder holding text_encoder/ stands for that folder. */
    if (h3_path_is_dir(path)) {
        sub = h3_path_join(path, "text_encoder");
        if (!sub) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        if (h3_path_is_dir(sub)) path = sub;
    }
    te->source = h3_strdup(path);
    if (!te->source) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    H3_CHECK_CTX(h3_weights_open(path, &te->set, &te->gguf), "opening the text encoder");
    te->have_set = 1;
    h3_detect_info info;
    H3_CHECK(h3_detect(&te->set, &info));
    if (info.comp != H3_COMP_TEXT_ENCODER)
        H3_FAIL(H3_ERR_FORMAT,
                "%s holds %s, not a Qwen3-VL text encoder (no model.language_model.layers.0 or "
                "model.layers.0 weights)",
                path,
                info.comp == H3_COMP_UNKNOWN ? "no H3 component h3run recognizes"
                                             : h3_component_name(info.comp));
    te->layout = info.layout;
    te->prefix = info.prefix;
    h3_qweight_reader_init(&te->rd, &te->set, te->gguf);
    te->wb = (h3_wbind){&te->set, te->prefix, te->source, "text encoder", NULL, &te->rd.base};
    int layers_in_file = info.n_layers;
    if (layers_in_file <= 0) H3_FAIL(H3_ERR_FORMAT, "%s: no decoder layers", path);

    if (h3_path_is_dir(path)) {
        dir = h3_strdup(path);
    } else {
        dir = h3_path_dir(path);
    }
    if (!dir) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    int found = 0;
    char src[300] = "the tensor shapes";
    H3_CHECK(read_config(te, dir, opts, &te->cfg, &found, src, sizeof src));
    if (!found) H3_CHECK(infer_config(te, &te->cfg));
    if (found) {
        te->config_file = h3_strdup(src);
        if (!te->config_file) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    }
    if (found && te->cfg.n_layers < layers_in_file)
        H3_FAIL(H3_ERR_FORMAT, "%s: the config has %lld decoder layers but the weights have %d", path,
                (long long)te->cfg.n_layers, layers_in_file);
    /* The file holds the model's last layer when it has the final norm (which follows only the last layer),
     * or when its config says it has no more layers than the file; the repacks (no config, no norm) are
     * truncations of a deeper model. */
    const int config_layers = found ? (int)te->cfg.n_layers : 0;
    te->cfg.n_layers = layers_in_file; /* a truncated repack keeps fewer layers than its model had */
    {
        h3_wb_row er = embed_row(te);
        h3_wb_info ei;
        H3_CHECK(h3_wb_check(&te->wb, &er, &te->embed, &ei));
        if (ei.quantized || te->gguf) {
            er.dst = &te->embed_q;
            H3_CHECK(h3_wb_bind(&te->wb, &er));
        }
    }
    H3_CHECK(check_layers(te));
    {
        h3_wb_row nr = norm_row(te, &te->final_norm);
        H3_CHECK(h3_wb_bind(&te->wb, &nr));
        te->complete = te->final_norm.data != NULL || config_layers == layers_in_file;
        h3_wb_row q0[TE_N_FIELDS];
        char names[TE_N_FIELDS][96];
        h3_wb_info qi;
        layer_rows(te, layers_in_file - 1, NULL, q0, names); /* the label of the last matrix, for describe */
        H3_CHECK(h3_wb_check(&te->wb, &q0[TE_N_FIELDS - 1], NULL, &qi));
        snprintf(te->weight_label, sizeof te->weight_label, "%s", qi.label);
    }
    snprintf(te->describe, sizeof te->describe,
             "Qwen3-VL text encoder, %s names, %lld decoder layers, hidden %lld, %lld/%lld heads x %lld, FFN "
             "%lld, "
             "vocab %lld, %s weights, config from %s",
             te->layout == H3_LAYOUT_OFFICIAL ? "official (transformers)" : "ComfyUI",
             (long long)te->cfg.n_layers, (long long)te->cfg.hidden, (long long)te->cfg.heads,
             (long long)te->cfg.kv_heads, (long long)te->cfg.head_dim, (long long)te->cfg.intermediate,
             (long long)te->cfg.vocab, te->weight_label, src);
done:
    h3_free(sub);
    h3_free(dir);
    if (st != H3_OK) {
        h3_text_encoder_close(te);
        te = NULL;
    }
    *out = te;
    return st;
}

static void free_layer(h3_te_layer_weights *w) {
    h3_tensor *all[] = {&w->input_norm, &w->post_norm, &w->q,    &w->k,  &w->v,   &w->q_norm,
                        &w->k_norm,     &w->o,         &w->gate, &w->up, &w->down};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) h3_tensor_free(all[i]);
    memset(w, 0, sizeof *w);
}

void h3_text_encoder_close(h3_text_encoder *te) {
    if (!te) return;
    free_layer(&te->cur);
    h3_tensor_free(&te->embed_q);
    h3_tensor_free(&te->final_norm);
    if (te->have_set) h3_st_close(&te->set);
    h3_gguf_free(te->gguf);
    h3_free(te->source);
    h3_free(te->config_file);
    h3_free(te);
}

const h3_st_set *h3_text_encoder_files(const h3_text_encoder *te) {
    return te->have_set ? &te->set : NULL;
}

const char *h3_text_encoder_config_file(const h3_text_encoder *te) {
    return te->config_file;
}

const h3_te_config *h3_text_encoder_config(const h3_text_encoder *te) {
    return &te->cfg;
}

const char *h3_text_encoder_describe(const h3_text_encoder *te) {
    return te->describe;
}

h3_layout h3_text_encoder_layout(const h3_text_encoder *te) {
    return te->layout;
}

void h3_text_encoder_get_stats(const h3_text_encoder *te, h3_te_stats *out) {
    *out = te->stats;
}

/* ---- layer weights ---------------------------------------------------------------------------------------
 */

/* Views of layer i's weights over the mapped files (quantized ones in their stored form), through the binder.
 */
static h3_status fetch_layer(h3_text_encoder *te, int layer, h3_te_layer_weights *c) {
    h3_wb_row rows[TE_N_FIELDS];
    char names[TE_N_FIELDS][96];
    memset(c, 0, sizeof *c);
    layer_rows(te, layer, c, rows, names);
    return h3_wb_bind_rows(&te->wb, rows, TE_N_FIELDS);
}

h3_status h3_text_encoder_layer_acquire(h3_text_encoder *te, h3_exec *ex, int layer,
                                        const h3_te_layer_weights **w) {
    (void)ex;
    *w = NULL;
    if (layer < 0 || layer >= te->cfg.n_layers)
        return H3_ERR(H3_ERR_INVALID, "text encoder: layer %d does not exist (0..%lld)", layer,
                      (long long)te->cfg.n_layers - 1);
    if (te->acquired >= 0)
        return H3_ERR(H3_ERR_INVALID, "text encoder: layer %d is acquired while layer %d is still held",
                      layer, te->acquired);
    h3_te_layer_weights *c = &te->cur;
    h3_status st = fetch_layer(te, layer, c);
    if (st != H3_OK) return h3_error_wrap(st, "fetching the weights of text-encoder layer %d", layer);
    te->acquired = layer;
    te->stats.acquires++;
    if (layer > te->stats.max_layer_acquired) te->stats.max_layer_acquired = layer;
    *w = c;
    return H3_OK;
}

void h3_text_encoder_layer_release(h3_text_encoder *te, h3_exec *ex, int layer) {
    (void)ex;
    if (te->acquired != layer) return;
    free_layer(&te->cur);
    te->acquired = -1;
    te->stats.releases++;
}

/* ---- forward ---------------------------------------------------------------------------------------------
 */

void h3_te_rope_tables(const h3_te_config *c, int64_t n, float *cos_out, float *sin_out) {
    const int64_t D = c->head_dim, half = D / 2;
    for (int64_t j = 0; j < half; j++) {
        float inv = (float)(1.0 / pow(c->rope_theta, (double)(2 * j) / (double)D));
        for (int64_t p = 0; p < n; p++) {
            float ang = (float)p * inv;
            float cs = (float)cos((double)ang), sn = (float)sin((double)ang);
            cos_out[p * D + j] = cos_out[p * D + j + half] = cs;
            sin_out[p * D + j] = sin_out[p * D + j + half] = sn;
        }
    }
}

void h3_te_mrope_tables(const h3_te_config *c, const int64_t *pos, int64_t n, float *cos_out,
                        float *sin_out) {
    const int64_t D = c->head_dim, half = D / 2;
    for (int64_t j = 0; j < half; j++) {
        float inv = (float)(1.0 / pow(c->rope_theta, (double)(2 * j) / (double)D));
        int axis = 0;
        if (j % 3 == 1 && j < 3 * c->mrope_section[1]) axis = 1;
        if (j % 3 == 2 && j < 3 * c->mrope_section[2]) axis = 2;
        for (int64_t r = 0; r < n; r++) {
            float ang = (float)pos[axis * n + r] * inv;
            float cs = (float)cos((double)ang), sn = (float)sin((double)ang);
            cos_out[r * D + j] = cos_out[r * D + j + half] = cs;
            sin_out[r * D + j] = sin_out[r * D + j + half] = sn;
        }
    }
}

/* The rotary tables of a prompt: text-only or with the vision rows' positions. */
static void rope_tables(const h3_te_config *c, const h3_te_mm *mm, int64_t n, float *cs, float *sn) {
    if (mm && mm->pos)
        h3_te_mrope_tables(c, mm->pos, n, cs, sn);
    else
        h3_te_rope_tables(c, n, cs, sn);
}

/* The vision rows of a prompt at the activation place: their indices, and embeds / deep in the activations'
 * dtype (views of the caller's host tensors when they already are). */
typedef struct te_vis {
    int active;
    h3_tensor idx;   /* i64 [n_vis] */
    h3_tensor tmp;   /* [n_vis, C] */
    h3_tensor *deep; /* [n_deep] */
    int n_deep;
} te_vis;

static void te_vis_free(te_vis *v) {
    h3_tensor_free(&v->idx);
    h3_tensor_free(&v->tmp);
    if (v->deep)
        for (int k = 0; k < v->n_deep; k++) h3_tensor_free(&v->deep[k]);
    h3_free(v->deep);
    memset(v, 0, sizeof *v);
}

/* A host f32 tensor into a new one at place pl in dt. */
static h3_status place_copy(h3_exec *ex, h3_place pl, h3_dtype dt, const h3_tensor *src, h3_tensor *dst) {
    h3_tensor f = {0};
    H3_TRY(h3_tensor_alloc(dst, pl, dt, src->ndim, src->shape, H3_MEM_ACTIVATIONS));
    if (pl == H3_PLACE_DEVICE && dt != src->dtype) {
        H3_TRY(h3_tensor_alloc(&f, pl, src->dtype, src->ndim, src->shape, H3_MEM_ACTIVATIONS));
        h3_status st = h3_copy(ex, &f, src);
        if (st == H3_OK) st = h3_op_convert(ex, dst, &f);
        if (st == H3_OK) st = h3_exec_sync(ex);
        h3_tensor_free(&f);
        return st;
    }
    if (pl == H3_PLACE_DEVICE) return h3_copy(ex, dst, src);
    return h3_op_convert(ex, dst, src);
}

static h3_status te_vis_make(h3_text_encoder *te, h3_exec *ex, const h3_te_mm *mm, int64_t n, h3_place pl,
                             h3_dtype dt, te_vis *v) {
    memset(v, 0, sizeof *v);
    if (!mm || mm->n_vis == 0) return H3_OK;
    const int64_t C = te->cfg.hidden;
    for (int64_t i = 0; i < mm->n_vis; i++)
        if (mm->rows[i] < 0 || mm->rows[i] >= n || (i && mm->rows[i] <= mm->rows[i - 1]))
            return H3_ERR(H3_ERR_INVALID,
                          "text encoder: vision row %lld (%lld) is outside the prompt or out of order",
                          (long long)i, (long long)mm->rows[i]);
    const h3_tensor *all[1 + H3_TE_MAX_DEEP];
    if (mm->n_deep < 0 || mm->n_deep > H3_TE_MAX_DEEP)
        return H3_ERR(H3_ERR_INVALID, "text encoder: %d deepstack features (at most %d)", mm->n_deep,
                      H3_TE_MAX_DEEP);
    all[0] = mm->embeds;
    for (int k = 0; k < mm->n_deep; k++) all[1 + k] = &mm->deep[k];
    for (int k = 0; k <= mm->n_deep; k++)
        if (!all[k] || all[k]->dtype != H3_F32 || all[k]->ndim != 2 || all[k]->shape[0] != mm->n_vis ||
            all[k]->shape[1] != C || all[k]->place == H3_PLACE_DEVICE || !h3_tensor_is_contiguous(all[k]))
            return H3_ERR(H3_ERR_INVALID,
                          "text encoder: the vision features must be f32 host tensors [%lld, %lld]",
                          (long long)mm->n_vis, (long long)C);
    v->active = 1;
    v->n_deep = mm->n_deep;
    h3_tensor hidx = {0};
    const int64_t s1[1] = {mm->n_vis};
    H3_TRY(h3_tensor_wrap(&hidx, (void *)mm->rows, H3_PLACE_HOST, H3_I64, 1, s1));
    H3_TRY(h3_tensor_alloc(&v->idx, pl, H3_I64, 1, s1, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_copy(ex, &v->idx, &hidx));
    H3_TRY(h3_tensor_alloc2(&v->tmp, pl, dt, mm->n_vis, C, H3_MEM_ACTIVATIONS));
    if (mm->n_deep) {
        v->deep = h3_calloc((size_t)mm->n_deep, sizeof *v->deep, H3_MEM_OTHER);
        if (!v->deep) return H3_ERR_NOMEM;
        for (int k = 0; k < mm->n_deep; k++) H3_TRY(place_copy(ex, pl, dt, &mm->deep[k], &v->deep[k]));
    }
    H3_TRY(h3_exec_sync(ex));
    return H3_OK;
}

/* x's vision rows: set to src (src NULL: tmp already holds them), or add src to them. */
static h3_status vis_rows(h3_exec *ex, te_vis *v, h3_tensor *x, const h3_tensor *src, int add) {
    if (add) {
        H3_TRY(h3_op_gather_rows(ex, &v->tmp, x, &v->idx));
        H3_TRY(h3_op_binary(ex, &v->tmp, &v->tmp, src, H3_BINARY_ADD));
    } else if (src) {
        H3_TRY(h3_op_convert(ex, &v->tmp, src));
    }
    return h3_op_scatter_rows(ex, x, &v->tmp, &v->idx);
}

/* After layer l of an encode to hidden state `layer`: deep[l] goes into the rows unless hidden_states[l + 1]
 * is the result (transformers records a layer's output before the addition); the normed last state includes
 * it. */
static h3_status vis_after_layer(h3_text_encoder *te, h3_exec *ex, te_vis *v, h3_tensor *x, int l,
                                 int layer) {
    if (!v->active || l >= v->n_deep) return H3_OK;
    const int normed = layer == te->cfg.n_layers && te->final_norm.data;
    if (l + 1 >= layer && !normed) return H3_OK;
    return vis_rows(ex, v, x, &v->deep[l], 1);
}

/* Writes embedding rows ids[0..n) into out [n, C] f32, converting from the stored dtype. Only those rows of
 * the table are read. */
static h3_status gather_embeddings(h3_text_encoder *te, const int32_t *ids, int64_t n, h3_tensor *out) {
    if (te->embed_q.data) { /* quantized: decode the rows the prompt uses */
        int64_t ld;
        h3_tensor_is_rowwise(out, &ld);
        for (int64_t i = 0; i < n; i++)
            H3_TRY(h3_tensor_rows_to_f32(&te->embed_q, ids[i], 1, (float *)out->data + i * ld));
        te->stats.embedding_rows += n;
        return H3_OK;
    }
    const void *base;
    H3_TRY(h3_st_bytes(&te->set, te->embed, &base));
    const int64_t C = te->cfg.hidden;
    const size_t es = h3_dtype_size(te->embed->dtype), row_bytes = (size_t)C * es;
    int64_t ld;
    h3_tensor_is_rowwise(out, &ld);
    void *tmp = NULL;
    if (((uintptr_t)base % es) != 0) { /* unaligned table: convert from an aligned copy of each row */
        tmp = h3_malloc(row_bytes, H3_MEM_WORKSPACE);
        if (!tmp) return H3_ERR_NOMEM;
    }
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *row = (const uint8_t *)base + (size_t)ids[i] * row_bytes;
        if (tmp) {
            memcpy(tmp, row, row_bytes);
            row = tmp;
        }
        h3_convert_to_f32(te->embed->dtype, row, (float *)out->data + i * ld, (size_t)C);
    }
    h3_free(tmp);
    te->stats.embedding_rows += n;
    return H3_OK;
}

typedef struct te_ws {
    h3_tensor h;        /* [n, C] normed input of a sub-block */
    h3_tensor q, k, v;  /* [n, heads·D], [n, kv·D], [n, kv·D] */
    h3_tensor o;        /* [n, heads·D] attention output */
    h3_tensor gu;       /* [chunk, 2F]: gate | up */
    h3_tensor g;        /* [chunk, F] */
    h3_tensor cos, sin; /* [n, D] */
} te_ws;

static void ws_free(te_ws *w) {
    h3_tensor *all[] = {&w->h, &w->q, &w->k, &w->v, &w->o, &w->gu, &w->g, &w->cos, &w->sin};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) h3_tensor_free(all[i]);
}

/* The forward's buffers: activations in dt at the activation place, rotary tables in f32. */
static h3_status ws_alloc(h3_text_encoder *te, int64_t n, h3_dtype dt, te_ws *w) {
    const h3_te_config *c = &te->cfg;
    const int64_t D = c->head_dim, chunk = n < te->chunk_rows ? n : te->chunk_rows;
    const h3_place pl = te->act_place;
    memset(w, 0, sizeof *w);
    H3_TRY(h3_tensor_alloc2(&w->h, pl, dt, n, c->hidden, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->q, pl, dt, n, c->heads * D, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->k, pl, dt, n, c->kv_heads * D, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->v, pl, dt, n, c->kv_heads * D, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->o, pl, dt, n, c->heads * D, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->gu, pl, dt, chunk, 2 * c->intermediate, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->g, pl, dt, chunk, c->intermediate, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->cos, pl, H3_F32, n, D, H3_MEM_ACTIVATIONS));
    H3_TRY(h3_tensor_alloc2(&w->sin, pl, H3_F32, n, D, H3_MEM_ACTIVATIONS));
    return H3_OK;
}

/* [n, H·D] as [n·H, D] (per-head norms) or [n, H, D] (rope, attention). */
static h3_status heads_view(const h3_tensor *t, int64_t H, int64_t D, int three, h3_tensor *out) {
    int64_t n = t->shape[0];
    if (three) {
        const int64_t s[3] = {n, H, D};
        return h3_tensor_reshape(t, 3, s, out);
    }
    const int64_t s[2] = {n * H, D};
    return h3_tensor_reshape(t, 2, s, out);
}

static h3_status run_layer(h3_text_encoder *te, h3_exec *ex, const h3_te_layer_weights *w, h3_tensor *x,
                           te_ws *s) {
    const h3_te_config *c = &te->cfg;
    const int64_t n = x->shape[0], D = c->head_dim, F = c->intermediate;
    const float eps = (float)c->rms_eps;
    h3_tensor q2, k2, q3, k3, v3, o3;
    /* attention */
    H3_TRY(h3_op_rms_norm(ex, &s->h, x, &w->input_norm, eps));
    H3_TRY(h3_op_gemm(ex, &s->q, &s->h, &w->q, NULL, 0));
    H3_TRY(h3_op_gemm(ex, &s->k, &s->h, &w->k, NULL, 0));
    H3_TRY(h3_op_gemm(ex, &s->v, &s->h, &w->v, NULL, 0));
    H3_TRY(heads_view(&s->q, c->heads, D, 0, &q2));
    H3_TRY(heads_view(&s->k, c->kv_heads, D, 0, &k2));
    H3_TRY(h3_op_rms_norm(ex, &q2, &q2, &w->q_norm, eps));
    H3_TRY(h3_op_rms_norm(ex, &k2, &k2, &w->k_norm, eps));
    H3_TRY(heads_view(&s->q, c->heads, D, 1, &q3));
    H3_TRY(heads_view(&s->k, c->kv_heads, D, 1, &k3));
    H3_TRY(heads_view(&s->v, c->kv_heads, D, 1, &v3));
    H3_TRY(heads_view(&s->o, c->heads, D, 1, &o3));
    H3_TRY(h3_op_rope(ex, &q3, &q3, &s->cos, &s->sin));
    H3_TRY(h3_op_rope(ex, &k3, &k3, &s->cos, &s->sin));
    H3_TRY(h3_op_attention(ex, &o3, &q3, &k3, &v3, (float)(1.0 / sqrt((double)D)), H3_ATTN_CAUSAL));
    H3_TRY(h3_op_gemm(ex, x, &s->o, &w->o, NULL, H3_GEMM_ACCUMULATE));
    /* MLP, in row chunks */
    H3_TRY(h3_op_rms_norm(ex, &s->h, x, &w->post_norm, eps));
    for (int64_t r0 = 0; r0 < n; r0 += s->gu.shape[0]) {
        int64_t rows = n - r0 < s->gu.shape[0] ? n - r0 : s->gu.shape[0];
        h3_tensor hr, xr, gu, gate, up, g;
        H3_TRY(h3_tensor_narrow(&s->h, 0, r0, rows, &hr));
        H3_TRY(h3_tensor_narrow(x, 0, r0, rows, &xr));
        H3_TRY(h3_tensor_narrow(&s->gu, 0, 0, rows, &gu));
        H3_TRY(h3_tensor_narrow(&gu, 1, 0, F, &gate));
        H3_TRY(h3_tensor_narrow(&gu, 1, F, F, &up));
        H3_TRY(h3_tensor_narrow(&s->g, 0, 0, rows, &g));
        H3_TRY(h3_op_gemm(ex, &gate, &hr, &w->gate, NULL, 0));
        H3_TRY(h3_op_gemm(ex, &up, &hr, &w->up, NULL, 0));
        H3_TRY(h3_op_swiglu(ex, &g, &gu, 1));
        H3_TRY(h3_op_gemm(ex, &xr, &g, &w->down, NULL, H3_GEMM_ACCUMULATE));
    }
    return H3_OK;
}

/* transformers' hidden_states[n_layers]: the last layer's output after the final RMSNorm, in place on x (at
 * the activation place; on the device the norm's [C] weights are copied there first). */
static h3_status final_norm(h3_text_encoder *te, h3_exec *ex, h3_tensor *x) {
    if (x->place != H3_PLACE_DEVICE) return h3_op_rms_norm(ex, x, x, &te->final_norm, (float)te->cfg.rms_eps);
    h3_tensor w;
    H3_TRY(
        h3_tensor_alloc(&w, H3_PLACE_DEVICE, te->final_norm.dtype, 1, te->final_norm.shape, H3_MEM_WEIGHTS));
    h3_status st = h3_copy(ex, &w, &te->final_norm);
    if (st == H3_OK) st = h3_op_rms_norm(ex, x, x, &w, (float)te->cfg.rms_eps);
    if (st == H3_OK) st = h3_exec_sync(ex);
    h3_tensor_free(&w);
    return st;
}

/* The caller's per-layer callback: H3_ERR_INTERRUPTED when it asks to stop. */
static h3_status layer_done(h3_text_encoder *te, int done, int total) {
    if (te->on_layer && te->on_layer(te->on_layer_user, done, total))
        return H3_ERR(H3_ERR_INTERRUPTED, "text encoder: stopped after layer %d of %d", done, total);
    return H3_OK;
}

/* ---- on a device ----------------------------------------------------------------------------------------
 * The layers stream through a ring of two device slots (h3_streamer): each layer's tensors packed in the
 * order of g_layer_fields (quantized ones with their scales), read from the mapped files into pinned staging
 * on a read stream and copied while the previous layer computes. Activations are bf16 (the residual stream
 * too, as transformers runs the model), the rotary tables f32; the output is converted to f32 at the end.
 * Everything the stage takes from the device is returned before encode returns. */

typedef struct te_dev {
    int n;
    h3_te_layer_weights *host; /* [n] views over the files: the packs' sources */
    h3_pack *packs;            /* [n] */
    uint8_t *tier;             /* [n] */
    int64_t slot_bytes;
} te_dev;

static void te_dev_free(te_dev *d) {
    if (d->host)
        for (int l = 0; l < d->n; l++) free_layer(&d->host[l]);
    h3_free(d->host);
    h3_free(d->packs);
    h3_free(d->tier);
    memset(d, 0, sizeof *d);
}

/* The units of layers 0..n-1: each layer's tensors packed in g_layer_fields order, streamed from pinned
 * memory when the files are pinned, else read per encode from the files (never held in pinned memory). */
static h3_status te_dev_make(h3_text_encoder *te, int n, te_dev *d) {
    memset(d, 0, sizeof *d);
    d->n = n;
    d->host = h3_calloc((size_t)n, sizeof *d->host, H3_MEM_OTHER);
    d->packs = h3_calloc((size_t)n, sizeof *d->packs, H3_MEM_OTHER);
    d->tier = h3_calloc((size_t)n, 1, H3_MEM_OTHER);
    if (!d->host || !d->packs || !d->tier) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    const h3_st_set *set = te->have_set ? &te->set : NULL;
    for (int l = 0; l < n; l++) {
        H3_TRY_CTX(fetch_layer(te, l, &d->host[l]), "fetching the weights of text-encoder layer %d", l);
        for (int i = 0; i < TE_N_FIELDS; i++) {
            const h3_tensor *t = layer_field(&d->host[l], i);
            const char *why;
            if (!h3_quant_gpu_supported(t, &why))
                return H3_ERR(
                    H3_ERR_UNSUPPORTED,
                    "text-encoder layer %d: %s weights (%s) run on the CPU only for now: use --device cpu", l,
                    h3_dtype_name(t->dtype), why);
            h3_pack_add(&d->packs[l], t, 0);
        }
        int pin;
        h3_pack_segs(set, &d->packs[l], 0, 0, NULL, &pin);
        d->tier[l] = pin ? H3_TIER_PINNED : H3_TIER_DISK;
        if (d->packs[l].bytes > d->slot_bytes) d->slot_bytes = d->packs[l].bytes;
    }
    return H3_OK;
}

static h3_status encode_device(h3_text_encoder *te, h3_exec *ex, const int32_t *ids, int64_t n, int layer,
                               const h3_te_mm *mm, h3_tensor *out) {
    const h3_te_config *c = &te->cfg;
    const int64_t C = c->hidden, D = c->head_dim;
    h3_status st = H3_OK;
    h3_tensor he = {0}, hc = {0}, hs = {0}, x = {0};
    te_ws s;
    memset(&s, 0, sizeof s);
    te_dev d;
    memset(&d, 0, sizeof d);
    h3_units *units = NULL;
    int *order = NULL;
    te_vis vis;
    memset(&vis, 0, sizeof vis);
    /* the prompt's embedding rows, gathered on the host (the vision rows' features put in) */
    H3_CHECK(h3_tensor_alloc2(&he, H3_PLACE_HOST, H3_F32, n, C, H3_MEM_ACTIVATIONS));
    H3_CHECK(gather_embeddings(te, ids, n, &he));
    if (mm && mm->n_vis) {
        te_vis hv;
        H3_CHECK(te_vis_make(te, ex, mm, n, H3_PLACE_HOST, H3_F32, &hv));
        st = vis_rows(ex, &hv, &he, mm->embeds, 0);
        te_vis_free(&hv);
        if (st != H3_OK) goto done;
    }
    H3_CHECK(h3_copy(ex, out, &he));
    if (layer == 0) goto sync;
    H3_CHECK(te_dev_make(te, layer, &d));
    H3_CHECK(ws_alloc(te, n, TE_DEV_DTYPE, &s));
    H3_CHECK(h3_tensor_alloc2(&x, H3_PLACE_DEVICE, TE_DEV_DTYPE, n, C, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_op_convert(ex, &x, out));
    H3_CHECK(h3_tensor_alloc2(&hc, H3_PLACE_HOST, H3_F32, n, D, H3_MEM_ACTIVATIONS));
    H3_CHECK(h3_tensor_alloc2(&hs, H3_PLACE_HOST, H3_F32, n, D, H3_MEM_ACTIVATIONS));
    rope_tables(c, mm, n, hc.data, hs.data);
    H3_CHECK(te_vis_make(te, ex, mm, n, H3_PLACE_DEVICE, TE_DEV_DTYPE, &vis));
    H3_CHECK(h3_copy(ex, &s.cos, &hc));
    H3_CHECK(h3_copy(ex, &s.sin, &hs));
    {
        h3_units_config uc = {H3_PLACE_DEVICE,
                              d.tier,
                              layer > 1 ? 2 : 1,
                              d.slot_bytes,
                              te->have_set ? &te->set : NULL,
                              0,
                              0,
                              NULL,
                              NULL,
                              "the text encoder's layers",
                              0, NULL};
        H3_CHECK(h3_units_open(ex, &uc, d.packs, d.n, &units));
        order = h3_calloc((size_t)d.n, sizeof *order, H3_MEM_OTHER);
        if (!order) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        for (int l = 0; l < d.n; l++) order[l] = l;
        H3_CHECK(h3_units_set_order(units, order, d.n, 0));
    }
    for (int l = 0; l < layer; l++) {
        const h3_tensor *t;
        h3_te_layer_weights w;
        memset(&w, 0, sizeof w);
        H3_CHECK_CTX(h3_units_acquire(units, l, &t), "text-encoder layer %d", l);
        for (int i = 0; i < TE_N_FIELDS; i++) *layer_field(&w, i) = t[i];
        st = run_layer(te, ex, &w, &x, &s);
        h3_units_release(units, l);
        if (st == H3_OK) st = vis_after_layer(te, ex, &vis, &x, l, layer);
        if (st != H3_OK) {
            st = h3_error_wrap(st, "text-encoder layer %d", l);
            goto done;
        }
        te->stats.layers_run++;
        te->stats.acquires++;
        te->stats.releases++;
        if (l > te->stats.max_layer_acquired) te->stats.max_layer_acquired = l;
        H3_CHECK(layer_done(te, l + 1, layer));
    }
    if (layer == c->n_layers && te->final_norm.data) H3_CHECK(final_norm(te, ex, &x));
    H3_CHECK(h3_units_sync(units));
    {
        h3_stream_stats ss;
        h3_units_stats(units, &ss);
        te->stats.bytes_read += ss.bytes_read;
        te->stats.read_s += ss.read_s;
    }
    H3_CHECK(h3_op_convert(ex, out, &x));
sync:
    H3_CHECK(h3_exec_sync(ex));
done:
    te_vis_free(&vis);
    h3_units_close(units);
    h3_free(order);
    te_dev_free(&d);
    ws_free(&s);
    h3_tensor *ts[] = {&he, &hc, &hs, &x};
    for (int i = 0; i < 4; i++) h3_tensor_free(ts[i]);
    return st;
}

int64_t h3_text_encoder_device_bytes(h3_text_encoder *te, int64_t n, int layer) {
    const h3_te_config *c = &te->cfg;
    if (layer > c->n_layers) layer = (int)c->n_layers;
    const int64_t C = c->hidden, D = c->head_dim, F = c->intermediate,
                  ch = n < te->chunk_rows ? n : te->chunk_rows;
    int64_t slot = 0;
    int quantized = 0;
    for (int l = 0; l < layer; l++) {
        h3_te_layer_weights w;
        if (fetch_layer(te, l, &w) != H3_OK) {
            h3_clear_error();
            return -1;
        }
        h3_pack p;
        memset(&p, 0, sizeof p);
        for (int i = 0; i < TE_N_FIELDS; i++) h3_pack_add(&p, layer_field(&w, i), 0);
        free_layer(&w);
        if (p.bytes > slot) slot = p.bytes;
        quantized |= p.quantized;
    }
    const int64_t es = (int64_t)h3_dtype_size(TE_DEV_DTYPE);
    int64_t act = h3_cuda_granule(n * C * es) * 2 /* h, x */ +
                  h3_cuda_granule(n * c->heads * D * es) * 2 /* q, o */ +
                  h3_cuda_granule(n * c->kv_heads * D * es) * 2 + h3_cuda_granule(ch * 2 * F * es) +
                  h3_cuda_granule(ch * F * es) + h3_cuda_granule(n * D * 4) * 2 +
                  h3_cuda_granule(n * C * 4) /* the f32 output */;
    /* hidden_states[n_layers]: the final norm's weights, copied to the device for the last step */
    const int64_t norm = layer == c->n_layers && te->final_norm.data
                             ? h3_cuda_granule((int64_t)h3_tensor_nbytes(&te->final_norm))
                             : 0;
    return H3_CUDA_BACKEND_BYTES + (quantized ? H3_CUDA_QGEMM_SCRATCH_BYTES : 0) +
           (layer > 1 ? 2 : 1) * slot + act + norm;
}

h3_status h3_text_encoder_encode(h3_text_encoder *te, h3_exec *ex, const int32_t *ids, int64_t n, int layer,
                                 h3_tensor *out) {
    return h3_text_encoder_encode_mm(te, ex, ids, n, layer, NULL, out);
}

h3_status h3_text_encoder_encode_mm(h3_text_encoder *te, h3_exec *ex, const int32_t *ids, int64_t n,
                                    int layer, const h3_te_mm *mm, h3_tensor *out) {
    const h3_te_config *c = &te->cfg;
    if (!ex) return H3_ERR(H3_ERR_INVALID, "text encoder: no exec context");
    if (n <= 0 || !ids) return H3_ERR(H3_ERR_INVALID, "text encoder: the prompt has no tokens");
    if (layer < 0 || layer > c->n_layers)
        return H3_ERR(H3_ERR_INVALID,
                      "text encoder: hidden state %d does not exist; %s has %lld decoder layers, so "
                      "0..%lld are available",
                      layer, te->source, (long long)c->n_layers, (long long)c->n_layers);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return H3_ERR(H3_ERR_INVALID,
                          "text encoder: token %lld has id %d, outside the embedding's %lld rows",
                          (long long)i, ids[i], (long long)c->vocab);
    if (!out || out->dtype != TE_ACT_DTYPE || out->ndim != 2 || out->shape[0] != n ||
        out->shape[1] != c->hidden || !h3_tensor_is_rowwise(out, &(int64_t){0}) || !out->data)
        return H3_ERR(H3_ERR_INVALID, "text encoder: the output must be an allocated f32 tensor [%lld, %lld]",
                      (long long)n, (long long)c->hidden);
    if (out->place != te->act_place)
        return H3_ERR(H3_ERR_INVALID, "text encoder: the output is on the %s, activations on the %s",
                      h3_place_name(out->place), h3_place_name(te->act_place));
    if (layer == c->n_layers && te->complete && !te->final_norm.data)
        return H3_ERR(H3_ERR_INVALID,
                      "text encoder: hidden_states[%d] of a %lld-layer model is taken after the final norm "
                      "('%snorm.weight'), which %s lacks; hidden states 0..%lld are available",
                      layer, (long long)c->n_layers, te->prefix, te->source, (long long)c->n_layers - 1);
    if (te->act_place == H3_PLACE_DEVICE) return encode_device(te, ex, ids, n, layer, mm, out);
    te_vis vis;
    H3_TRY(gather_embeddings(te, ids, n, out));
    h3_status st = te_vis_make(te, ex, mm, n, te->act_place, TE_ACT_DTYPE, &vis);
    if (st == H3_OK && vis.active) st = vis_rows(ex, &vis, out, mm->embeds, 0);
    if (st != H3_OK || layer == 0) {
        te_vis_free(&vis);
        return st;
    }
    te_ws s;
    st = ws_alloc(te, n, TE_ACT_DTYPE, &s);
    if (st == H3_OK) rope_tables(c, mm, n, s.cos.data, s.sin.data);
    for (int l = 0; l < layer && st == H3_OK; l++) {
        const h3_te_layer_weights *w;
        st = h3_text_encoder_layer_acquire(te, ex, l, &w);
        if (st != H3_OK) break;
        st = run_layer(te, ex, w, out, &s);
        h3_text_encoder_layer_release(te, ex, l);
        if (st == H3_OK) st = vis_after_layer(te, ex, &vis, out, l, layer);
        if (st != H3_OK)
            st = h3_error_wrap(st, "text-encoder layer %d", l);
        else
            te->stats.layers_run++;
        if (st == H3_OK) st = layer_done(te, l + 1, layer);
    }
    if (st == H3_OK && layer == c->n_layers && te->final_norm.data) st = final_norm(te, ex, out);
    ws_free(&s);
    te_vis_free(&vis);
    return st;
}

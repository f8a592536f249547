/* GGUF reader (contracts in gguf.h). */
#define _GNU_SOURCE
#include "io/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"

/* ---- types
 * -------------------------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int64_t blck, bytes;
} g_types[H3_GGML_TYPE_LIMIT] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 36},      [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},  [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},  [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},   [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},
};

const char *h3_ggml_type_name(uint32_t type) {
    return type < H3_GGML_TYPE_LIMIT ? g_types[type].name : NULL;
}

int h3_ggml_type_size(uint32_t type, int64_t *block_elems, int64_t *block_bytes) {
    if (type >= H3_GGML_TYPE_LIMIT || !g_types[type].name) return 0;
    if (block_elems) *block_elems = g_types[type].blck;
    if (block_bytes) *block_bytes = g_types[type].bytes;
    return 1;
}

h3_qformat h3_ggml_qformat(uint32_t type) {
    switch (type) {
        case H3_GGML_Q4_0:
            return H3_QF_Q4_0;
        case H3_GGML_Q4_1:
            return H3_QF_Q4_1;
        case H3_GGML_Q5_0:
            return H3_QF_Q5_0;
        case H3_GGML_Q5_1:
            return H3_QF_Q5_1;
        case H3_GGML_Q8_0:
            return H3_QF_Q8_0;
        case H3_GGML_Q2_K:
            return H3_QF_Q2_K;
        case H3_GGML_Q3_K:
            return H3_QF_Q3_K;
        case H3_GGML_Q4_K:
            return H3_QF_Q4_K;
        case H3_GGML_Q5_K:
            return H3_QF_Q5_K;
        case H3_GGML_Q6_K:
            return H3_QF_Q6_K;
        default:
            return H3_QF_NONE;
    }
}

int h3_ggml_dtype(uint32_t type, h3_dtype *out) {
    switch (type) {
        case H3_GGML_F32:
            *out = H3_F32;
            return 1;
        case H3_GGML_F16:
            *out = H3_F16;
            return 1;
        case H3_GGML_BF16:
            *out = H3_BF16;
            return 1;
        case H3_GGML_F64:
            *out = H3_F64;
            return 1;
        case H3_GGML_I8:
            *out = H3_I8;
            return 1;
        case H3_GGML_I16:
            *out = H3_I16;
            return 1;
        case H3_GGML_I32:
            *out = H3_I32;
            return 1;
        case H3_GGML_I64:
            *out = H3_I64;
            return 1;
        default:
            return 0;
    }
}

/* ---- parsing
 * ------------------------------------------------------------------------------------------------ */

static uint32_t u32_at(const uint8_t *p) { /* little-endian, any alignment */
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#define GGUF_MAX_TENSORS (1 << 20)
#define GGUF_MAX_KV      (1 << 20)
#define GGUF_MAX_NAME    1024

typedef struct {
    const uint8_t *p;
    uint64_t size, off;
    const char *path;
} reader;

static h3_status need(reader *r, uint64_t n, const char *what) {
    if (n > r->size - r->off)
        return H3_ERR(H3_ERR_FORMAT,
                      "%s: %s at byte %llu runs past the end of the %llu-byte file (truncated?)", r->path,
                      what, (unsigned long long)r->off, (unsigned long long)r->size);
    return H3_OK;
}

static h3_status rd_u32(reader *r, uint32_t *v, const char *what) {
    H3_TRY(need(r, 4, what));
    *v = u32_at(r->p + r->off);
    r->off += 4;
    return H3_OK;
}

static h3_status rd_u64(reader *r, uint64_t *v, const char *what) {
    H3_TRY(need(r, 8, what));
    *v = (uint64_t)u32_at(r->p + r->off) | (uint64_t)u32_at(r->p + r->off + 4) << 32;
    r->off += 8;
    return H3_OK;
}

/* A string's bytes (not NUL-terminated) without copying. */
static h3_status rd_str(reader *r, const char **s, uint64_t *len, const char *what) {
    H3_TRY(rd_u64(r, len, what));
    H3_TRY(need(r, *len, what));
    *s = (const char *)r->p + r->off;
    r->off += *len;
    return H3_OK;
}

static const int64_t g_vsize[H3_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static h3_status skip_value(reader *r, uint32_t type, int depth, const char *key) {
    if (type >= H3_GGUF_VTYPE_COUNT)
        return H3_ERR(H3_ERR_FORMAT, "%s: key '%s' has value type %u (known: 0..12)", r->path, key, type);
    if (type == H3_GGUF_STRING) {
        const char *s;
        uint64_t len;
        return rd_str(r, &s, &len, key);
    }
    if (type == H3_GGUF_ARRAY) {
        uint32_t et;
        uint64_t n;
        if (depth > 2) return H3_ERR(H3_ERR_FORMAT, "%s: key '%s' nests arrays too deeply", r->path, key);
        H3_TRY(rd_u32(r, &et, key));
        H3_TRY(rd_u64(r, &n, key));
        if (et >= H3_GGUF_VTYPE_COUNT)
            return H3_ERR(H3_ERR_FORMAT, "%s: key '%s' is an array of value type %u (known: 0..12)", r->path,
                          key, et);
        if (et != H3_GGUF_STRING && et != H3_GGUF_ARRAY) {
            if (n > (r->size - r->off) / (uint64_t)g_vsize[et])
                return H3_ERR(H3_ERR_FORMAT, "%s: array '%s' of %llu values runs past the end of the file",
                              r->path, key, (unsigned long long)n);
            r->off += n * (uint64_t)g_vsize[et];
            return H3_OK;
        }
        /* Each element takes at least 8 bytes (a length or a nested header). */
        if (n > (r->size - r->off) / 8)
            return H3_ERR(H3_ERR_FORMAT, "%s: array '%s' of %llu values runs past the end of the file",
                          r->path, key, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) H3_TRY(skip_value(r, et, depth + 1, key));
        return H3_OK;
    }
    H3_TRY(need(r, (uint64_t)g_vsize[type], key));
    r->off += (uint64_t)g_vsize[type];
    return H3_OK;
}

static int64_t int_at(const uint8_t *p, uint32_t type) {
    switch (type) {
        case H3_GGUF_U8:
            return p[0];
        case H3_GGUF_I8:
            return (int8_t)p[0];
        case H3_GGUF_U16:
            return (uint16_t)(p[0] | p[1] << 8);
        case H3_GGUF_I16:
            return (int16_t)(uint16_t)(p[0] | p[1] << 8);
        case H3_GGUF_U32:
            return u32_at(p);
        case H3_GGUF_I32:
            return (int32_t)u32_at(p);
        case H3_GGUF_BOOL:
            return p[0] != 0;
        case H3_GGUF_U64:
        case H3_GGUF_I64:
            return (int64_t)((uint64_t)u32_at(p) | (uint64_t)u32_at(p + 4) << 32);
        default:
            return 0;
    }
}

static h3_status read_kv(reader *r, h3_gguf_kv *kv) {
    const char *k;
    uint64_t klen;
    memset(kv, 0, sizeof *kv);
    H3_TRY(rd_str(r, &k, &klen, "a metadata key"));
    if (klen == 0 || klen > GGUF_MAX_NAME)
        return H3_ERR(H3_ERR_FORMAT, "%s: a metadata key of %llu bytes (allowed 1..%d)", r->path,
                      (unsigned long long)klen, GGUF_MAX_NAME);
    kv->key = h3_strndup(k, (size_t)klen);
    if (!kv->key) return H3_ERR_NOMEM;
    H3_TRY(rd_u32(r, &kv->type, kv->key));
    uint64_t start = r->off;
    if (kv->type == H3_GGUF_ARRAY) {
        H3_TRY(rd_u32(r, &kv->elem_type, kv->key));
        H3_TRY(rd_u64(r, &kv->count, kv->key));
        kv->array_at = r->off;
        r->off = start;
    }
    H3_TRY(skip_value(r, kv->type, 0, kv->key));
    const uint8_t *v = r->p + start;
    switch (kv->type) {
        case H3_GGUF_STRING: {
            uint64_t len = (uint64_t)int_at(v, H3_GGUF_U64);
            kv->s = h3_strndup((const char *)v + 8, (size_t)len);
            if (!kv->s) return H3_ERR_NOMEM;
            break;
        }
        case H3_GGUF_F32: {
            float f;
            uint32_t u = u32_at(v);
            memcpy(&f, &u, 4);
            kv->f = f;
            break;
        }
        case H3_GGUF_F64: {
            double f;
            uint64_t u = (uint64_t)int_at(v, H3_GGUF_U64);
            memcpy(&f, &u, 8);
            kv->f = f;
            break;
        }
        case H3_GGUF_ARRAY:
            break;
        default:
            kv->i = int_at(v, kv->type);
            break;
    }
    return H3_OK;
}

void h3_gguf_free(h3_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_tensors; i++) h3_free(g->tensors[i].name);
    h3_free(g->tensors);
    for (int64_t i = 0; i < g->n_kv; i++) {
        h3_free(g->kv[i].key);
        h3_free(g->kv[i].s);
    }
    h3_free(g->kv);
    h3_free(g->path);
    h3_free(g);
}

const h3_gguf_kv *h3_gguf_get_kv(const h3_gguf *g, const char *key) {
    int64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->kv[mid].key, key);
        if (c == 0) return &g->kv[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int cmp_kv(const void *a, const void *b) {
    return strcmp(((const h3_gguf_kv *)a)->key, ((const h3_gguf_kv *)b)->key);
}

int h3_path_is_gguf(const char *path) {
    return h3_str_ends_with(path, ".gguf");
}

/* llama.cpp's text-model names to the ComfyUI text-encoder names ("blk.3.attn_q.weight" ->
 * "model.layers.3.self_attn.q_proj.weight") into buf; 0 when the name is not one of them. */
static int llama_map(const char *n, char *buf, size_t size) {
    static const struct {
        const char *from, *to;
    } per_layer[] = {
        {"attn_norm", "input_layernorm"},    {"ffn_norm", "post_attention_layernorm"},
        {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
        {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},
        {"attn_v", "self_attn.v_proj"},      {"attn_output", "self_attn.o_proj"},
        {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
        {"ffn_down", "mlp.down_proj"},
    };
    if (!strncmp(n, "token_embd.", 11)) return snprintf(buf, size, "model.embed_tokens.%s", n + 11), 1;
    if (!strncmp(n, "output_norm.", 12)) return snprintf(buf, size, "model.norm.%s", n + 12), 1;
    if (!strncmp(n, "output.", 7)) return snprintf(buf, size, "lm_head.%s", n + 7), 1;
    if (strncmp(n, "blk.", 4)) return 0;
    char *end;
    long layer = strtol(n + 4, &end, 10);
    if (end == n + 4 || *end != '.' || layer < 0) return 0;
    const char *rest = end + 1;
    for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++) {
        size_t l = strlen(per_layer[i].from);
        if (!strncmp(rest, per_layer[i].from, l) && rest[l] == '.') {
            snprintf(buf, size, "model.layers.%ld.%s%s", layer, per_layer[i].to, rest + l);
            return 1;
        }
    }
    return 0;
}

static char *set_name_of(const char *n, int llama) {
    char buf[GGUF_MAX_NAME + 64];
    return h3_strdup(llama && llama_map(n, buf, sizeof buf) ? buf : n);
}

typedef struct {
    h3_st_entry e;
    int64_t src; /* index into the parse order */
} tmp_entry;

static int cmp_tmp(const void *a, const void *b) {
    return strcmp(((const tmp_entry *)a)->e.name, ((const tmp_entry *)b)->e.name);
}

static int cmp_off(const void *a, const void *b) {
    const h3_gguf_tensor *x = *(h3_gguf_tensor *const *)a, *y = *(h3_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The orig_shape key of a tensor, if any: fills shape (outermost first) and returns its rank, 0 when absent,
 * -1 when malformed. */
static int orig_shape(const h3_gguf *g, reader *r, const char *name, int64_t *shape) {
    char key[GGUF_MAX_NAME + 64];
    snprintf(key, sizeof key, "comfy.gguf.orig_shape.%s", name);
    const h3_gguf_kv *kv = h3_gguf_get_kv(g, key);
    if (kv) {
        if (kv->type != H3_GGUF_ARRAY || (kv->elem_type != H3_GGUF_I32 && kv->elem_type != H3_GGUF_U32 &&
                                          kv->elem_type != H3_GGUF_I64 && kv->elem_type != H3_GGUF_U64))
            return -1;
        if (kv->count < 1 || kv->count > H3_MAX_DIMS) return -1;
        int64_t es = g_vsize[kv->elem_type];
        for (uint64_t d = 0; d < kv->count; d++) {
            int64_t v = int_at(r->p + kv->array_at + d * (uint64_t)es, kv->elem_type);
            if (v < 0) return -1;
            shape[d] = v;
        }
        return (int)kv->count;
    }
    return 0;
}

h3_status h3_gguf_open(const char *path, h3_st_set *set, h3_gguf **out) {
    *out = NULL;
    memset(set, 0, sizeof *set);
    h3_status st = H3_OK;
    h3_gguf *g = h3_calloc(1, sizeof *g, H3_MEM_IO);
    tmp_entry *tmp = NULL;
    h3_gguf_tensor **by_off = NULL;
    int64_t n_tmp = 0;
    if (!g) return H3_ERR_NOMEM;
    g->path = h3_strdup(path);
    set->source = h3_strdup(path);
    set->files = h3_calloc(1, sizeof *set->files, H3_MEM_IO);
    if (!g->path || !set->source || !set->files) H3_FAIL(H3_ERR_NOMEM, "out of memory opening %s", path);
    set->n_files = 1;
    h3_st_file *f = &set->files[0];
    f->fd = -1;
    f->map.fd = -1;
    f->path = h3_strdup(path);
    if (!f->path) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    /* a regular file: a FIFO or device is refused, not waited on */
    H3_CHECK(h3_open_input(path, &f->fd, &f->file_size));
    g->file_size = f->file_size;
    if (f->file_size < 24)
        H3_FAIL(H3_ERR_FORMAT, "%s: %llu bytes is too short for a GGUF file (its header alone is 24 bytes)",
                path, (unsigned long long)f->file_size);
    H3_CHECK(h3_mmap_open(path, &f->map));
    f->mapped = 1;
    if (f->map.size != f->file_size) H3_FAIL(H3_ERR_IO, "%s changed size while being opened", path);
    reader r = {f->map.data, f->map.size, 0, path};
    if (memcmp(r.p, "GGUF", 4) != 0) H3_FAIL(H3_ERR_FORMAT, "%s does not start with the GGUF magic", path);
    r.off = 4;
    H3_CHECK(rd_u32(&r, &g->version, "the version"));
    if (g->version != 2 && g->version != 3)
        H3_FAIL(H3_ERR_FORMAT, "%s: GGUF version %u is not supported (h3run reads versions 2 and 3%s)", path,
                g->version, g->version > 0xffff ? "; a big-endian file?" : "");
    uint64_t n_tensors, n_kv;
    H3_CHECK(rd_u64(&r, &n_tensors, "the tensor count"));
    H3_CHECK(rd_u64(&r, &n_kv, "the key count"));
    /* A key takes at least 12 bytes, a tensor info at least 28: counts beyond that cannot fit. */
    if (n_tensors > GGUF_MAX_TENSORS || n_tensors > f->file_size / 28)
        H3_FAIL(H3_ERR_FORMAT, "%s: %llu tensors cannot fit in a %llu-byte file", path,
                (unsigned long long)n_tensors, (unsigned long long)f->file_size);
    if (n_kv > GGUF_MAX_KV || n_kv > f->file_size / 12)
        H3_FAIL(H3_ERR_FORMAT, "%s: %llu metadata keys cannot fit in a %llu-byte file", path,
                (unsigned long long)n_kv, (unsigned long long)f->file_size);
    g->kv = h3_calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv, H3_MEM_IO);
    if (!g->kv) H3_FAIL(H3_ERR_NOMEM, "out of memory reading %s", path);
    g->alignment = 32;
    for (uint64_t i = 0; i < n_kv; i++) {
        st = read_kv(&r, &g->kv[i]);
        g->n_kv = (int64_t)i + 1;
        if (st != H3_OK) goto done;
        if (!strcmp(g->kv[i].key, "general.alignment")) {
            if (g->kv[i].type != H3_GGUF_U32 || g->kv[i].i < 1 || (g->kv[i].i & (g->kv[i].i - 1)))
                H3_FAIL(H3_ERR_FORMAT, "%s: general.alignment must be a UINT32 power of two", path);
            g->alignment = (uint64_t)g->kv[i].i;
        }
    }
    qsort(g->kv, (size_t)g->n_kv, sizeof *g->kv, cmp_kv);
    for (int64_t i = 1; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, g->kv[i - 1].key))
            H3_FAIL(H3_ERR_FORMAT, "%s: key '%s' appears twice", path, g->kv[i].key);
    g->tensors = h3_calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors, H3_MEM_IO);
    if (!g->tensors) H3_FAIL(H3_ERR_NOMEM, "out of memory reading %s", path);
    for (uint64_t i = 0; i < n_tensors; i++) {
        h3_gguf_tensor *t = &g->tensors[i];
        const char *nm;
        uint64_t nl;
        H3_CHECK(rd_str(&r, &nm, &nl, "a tensor name"));
        if (nl == 0 || nl > GGUF_MAX_NAME || memchr(nm, 0, (size_t)nl))
            H3_FAIL(H3_ERR_FORMAT, "%s: tensor %llu has a name of %llu bytes (allowed 1..%d, no NUL)", path,
                    (unsigned long long)i, (unsigned long long)nl, GGUF_MAX_NAME);
        t->name = h3_strndup(nm, (size_t)nl);
        g->n_tensors = (int64_t)i + 1;
        if (!t->name) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        uint32_t nd;
        H3_CHECK(rd_u32(&r, &nd, t->name));
        if (nd < 1 || nd > 4)
            H3_FAIL(H3_ERR_FORMAT, "%s: tensor '%s' has %u dims (GGUF allows 1..4)", path, t->name, nd);
        t->stored_ndim = (int)nd;
        uint64_t numel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne;
            H3_CHECK(rd_u64(&r, &ne, t->name));
            if (ne > ((uint64_t)1 << 40) || (ne && numel > ((uint64_t)1 << 50) / ne))
                H3_FAIL(H3_ERR_FORMAT, "%s: tensor '%s' has an impossible size (dim %u = %llu)", path,
                        t->name, d, (unsigned long long)ne);
            numel *= ne;
            t->stored_shape[nd - 1 - d] = (int64_t)ne; /* reversed: outermost first */
        }
        H3_CHECK(rd_u32(&r, &t->type, t->name));
        H3_CHECK(rd_u64(&r, &t->offset, t->name));
        int64_t be, bb;
        if (!h3_ggml_type_size(t->type, &be, &bb))
            H3_FAIL(H3_ERR_FORMAT, "%s: tensor '%s' has ggml type %u, which is not a type ggml defines", path,
                    t->name, t->type);
        int64_t row = t->stored_shape[nd - 1];
        if (row % be)
            H3_FAIL(H3_ERR_FORMAT,
                    "%s: tensor '%s' (%s) has rows of %lld values, not a multiple of its %lld-value blocks",
                    path, t->name, h3_ggml_type_name(t->type), (long long)row, (long long)be);
        t->nbytes = numel / (uint64_t)be * (uint64_t)bb;
        if (t->offset % g->alignment)
            H3_FAIL(H3_ERR_FORMAT,
                    "%s: tensor '%s' starts at offset %llu, not a multiple of the alignment %llu", path,
                    t->name, (unsigned long long)t->offset, (unsigned long long)g->alignment);
        t->ndim = t->stored_ndim;
        memcpy(t->shape, t->stored_shape, sizeof t->stored_shape);
    }
    g->data_start = (r.off + g->alignment - 1) / g->alignment * g->alignment;
    if (g->data_start > f->file_size)
        H3_FAIL(H3_ERR_FORMAT, "%s: the data section would start past the end of the file", path);
    f->data_start = g->data_start;
    f->header_len = g->data_start;
    const uint64_t data_size = f->file_size - g->data_start;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        h3_gguf_tensor *t = &g->tensors[i];
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            H3_FAIL(H3_ERR_FORMAT,
                    "%s: tensor '%s' [%llu, +%llu) lies past the end of the %llu-byte data section "
                    "(truncated?)",
                    path, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                    (unsigned long long)data_size);
        int64_t os[H3_MAX_DIMS];
        int on = orig_shape(g, &r, t->name, os);
        if (on < 0)
            H3_FAIL(H3_ERR_FORMAT, "%s: comfy.gguf.orig_shape.%s must be 1..%d non-negative integers", path,
                    t->name, H3_MAX_DIMS);
        if (on > 0) {
            int64_t n1 = 1, n2 = 1;
            for (int d = 0; d < on; d++)
                if (!h3_mul_i64(n1, os[d], &n1)) n1 = -1;
            for (int d = 0; d < t->stored_ndim; d++) n2 *= t->stored_shape[d];
            if (n1 != n2)
                H3_FAIL(H3_ERR_FORMAT,
                        "%s: comfy.gguf.orig_shape.%s has %lld values but the tensor holds %lld", path,
                        t->name, (long long)n1, (long long)n2);
            t->ndim = on;
            memcpy(t->shape, os, (size_t)on * sizeof *os);
            t->reshaped = 1;
        }
    }
    /* No two tensors overlap. */
    by_off = h3_malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *by_off, H3_MEM_IO);
    if (!by_off) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    {
        int64_t m = 0;
        for (int64_t i = 0; i < g->n_tensors; i++)
            if (g->tensors[i].nbytes) by_off[m++] = &g->tensors[i];
        qsort(by_off, (size_t)m, sizeof *by_off, cmp_off);
        for (int64_t i = 1; i < m; i++)
            if (by_off[i]->offset < by_off[i - 1]->offset + by_off[i - 1]->nbytes)
                H3_FAIL(H3_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", path, by_off[i - 1]->name,
                        by_off[i]->name);
    }
    /* The set: names (llama.cpp's mapped), dtypes and shapes. */
    for (int64_t i = 0; i < g->n_tensors && !g->llama_names; i++)
        g->llama_names =
            !strcmp(g->tensors[i].name, "token_embd.weight") || !strncmp(g->tensors[i].name, "blk.0.", 6);
    tmp = h3_calloc((size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *tmp, H3_MEM_IO);
    if (!tmp) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const h3_gguf_tensor *t = &g->tensors[i];
        h3_st_entry *e = &tmp[i].e;
        tmp[i].src = i;
        e->name = set_name_of(t->name, g->llama_names);
        n_tmp = i + 1;
        if (!e->name) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        e->begin = t->offset;
        e->end = t->offset + t->nbytes;
        e->file = 0;
        h3_dtype dt;
        if (h3_ggml_dtype(t->type, &dt)) {
            e->dtype = dt;
            e->ndim = t->ndim;
            memcpy(e->shape, t->shape, sizeof e->shape);
        } else { /* stored bytes: rows of the stored shape */
            int64_t be = 1, bb = 1, rows = 1;
            h3_ggml_type_size(t->type, &be, &bb);
            for (int d = 0; d + 1 < t->stored_ndim; d++) rows *= t->stored_shape[d];
            e->dtype = H3_U8;
            e->ndim = 2;
            e->shape[0] = rows;
            e->shape[1] = t->stored_shape[t->stored_ndim - 1] / be * bb;
        }
    }
    qsort(tmp, (size_t)n_tmp, sizeof *tmp, cmp_tmp);
    for (int64_t i = 1; i < n_tmp; i++)
        if (!strcmp(tmp[i].e.name, tmp[i - 1].e.name))
            H3_FAIL(H3_ERR_FORMAT, "%s: tensor '%s' appears twice%s", path, tmp[i].e.name,
                    g->llama_names ? " (llama.cpp names mapped)" : "");
    set->entries = h3_malloc((size_t)(n_tmp ? n_tmp : 1) * sizeof *set->entries, H3_MEM_IO);
    if (!set->entries) H3_FAIL(H3_ERR_NOMEM, "out of memory");
    {
        /* Tensors in the set's (sorted) order, each pointing at its entry's name. */
        h3_gguf_tensor *sorted = h3_malloc((size_t)(n_tmp ? n_tmp : 1) * sizeof *sorted, H3_MEM_IO);
        if (!sorted) H3_FAIL(H3_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; i < n_tmp; i++) {
            set->entries[i] = tmp[i].e;
            sorted[i] = g->tensors[tmp[i].src];
            sorted[i].set_name = set->entries[i].name;
        }
        set->n_entries = n_tmp;
        n_tmp = 0; /* the names now belong to the set */
        h3_free(g->tensors);
        g->tensors = sorted;
    }
done:
    for (int64_t i = 0; i < n_tmp; i++) h3_free(tmp[i].e.name);
    h3_free(tmp);
    h3_free(by_off);
    if (st != H3_OK) {
        h3_gguf_free(g);
        h3_st_close(set);
        return st;
    }
    *out = g;
    return H3_OK;
}

const h3_gguf_tensor *h3_gguf_find(const h3_gguf *g, const char *set_name) {
    int64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->tensors[mid].set_name, set_name);
        if (c == 0) return &g->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

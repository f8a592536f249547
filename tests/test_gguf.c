/* The GGUF reader: every block type decoded against the project's reference
 * (tools/reference/quant_reference.py, tests/fixtures/quant/gguf_*), bit for bit; the weight-set view
 * (reversed dims, ComfyUI-GGUF's flattened matrices, llama.cpp names); strict validation of lying files
 * (truncation at every byte of the header, bad counts, dims, types, offsets, overlaps, alignment, keys);
 * types h3run does not decode; allocation failures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "io/gguf.h"
#include "quant/qload.h"
#include "testutil.h"

static const char *fix(const char *rel, char *buf, size_t n) {
    char r[256];
    snprintf(r, sizeof r, "tests/fixtures/quant/%s", rel);
    return t_src_path(r, buf, n);
}

/* Decoded values of a set entry as f32 through the weight path (h3_qweight_get + h3_tensor_rows_to_f32). */
static float *decode_all(h3_st_set *s, h3_gguf *g, const char *name, int64_t *n, int *ndim, int64_t *shape) {
    h3_tensor t;
    *n = 0;
    h3_status st = h3_qweight_get_name(s, g, name, &t);
    CHECK(st == H3_OK, "%s: %s", name, h3_last_error());
    if (st != H3_OK) return NULL;
    *ndim = t.ndim;
    memcpy(shape, t.shape, sizeof t.shape);
    *n = h3_tensor_numel(&t);
    float *v = malloc((size_t)*n * sizeof(float));
    int64_t rows = h3_tensor_rows(&t);
    CHECK_OK(h3_tensor_rows_to_f32(&t, 0, rows, v));
    h3_tensor_free(&t);
    return v;
}

static void test_types_bitexact(void) {
    char p[512], q[512];
    h3_st_set s, exp;
    h3_gguf *g = NULL;
    CHECK_OK(h3_gguf_open(fix("gguf_types.gguf", p, sizeof p), &s, &g));
    CHECK_OK(h3_st_open(fix("gguf_expected.safetensors", q, sizeof q), &exp));
    if (!g) return;
    CHECK(g->version == 3 && g->alignment == 32, "version %u alignment %llu", g->version,
          (unsigned long long)g->alignment);
    const h3_gguf_kv *arch = h3_gguf_get_kv(g, "general.architecture");
    CHECK(arch && arch->type == H3_GGUF_STRING && !strcmp(arch->s, "h3test"), "general.architecture");
    int checked = 0;
    for (int64_t i = 0; i < exp.n_entries; i++) {
        const char *name = exp.entries[i].name;
        if (strstr(name, ".orig")) continue;
        int64_t n = 0, shape[H3_MAX_DIMS] = {0};
        int nd = 0;
        float *got = decode_all(&s, g, name, &n, &nd, shape);
        h3_tensor ref;
        CHECK_OK(h3_st_load(&exp, name, H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &ref));
        if (!got || !ref.data) {
            free(got);
            h3_tensor_free(&ref);
            continue;
        }
        CHECK(h3_tensor_numel(&ref) == n && nd == ref.ndim, "%s: %lld values in %d dims, expected %lld in %d",
              name, (long long)n, nd, (long long)h3_tensor_numel(&ref), ref.ndim);
        for (int d = 0; d < nd && d < ref.ndim; d++)
            CHECK(shape[d] == ref.shape[d], "%s: dim %d is %lld, expected %lld", name, d, (long long)shape[d],
                  (long long)ref.shape[d]);
        int64_t bad = 0;
        for (int64_t k = 0; k < n && k < h3_tensor_numel(&ref); k++)
            if (memcmp(&got[k], &((float *)ref.data)[k], 4) != 0) bad++;
        CHECK(bad == 0, "%s: %lld of %lld values differ from the reference's bits", name, (long long)bad,
              (long long)n);
        const h3_gguf_tensor *t = h3_gguf_find(g, name);
        printf("  %-8s %-5s %lld values bit-exact%s\n", name, t ? h3_ggml_type_name(t->type) : "?",
               (long long)n, bad ? " NO" : "");
        /* The encoders of the reference (used for the model fixtures) reproduce their input. */
        char on[128];
        snprintf(on, sizeof on, "%s.orig", name);
        if (h3_st_find(&exp, on)) {
            h3_tensor o;
            CHECK_OK(h3_st_load(&exp, on, H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &o));
            double num = 0, den = 0;
            for (int64_t k = 0; k < n; k++) {
                double dd = got[k] - ((float *)o.data)[k];
                num += dd * dd;
                den += (double)((float *)o.data)[k] * ((float *)o.data)[k];
            }
            double rel = sqrt(num / den);
            printf("    encoded from f32: rel err %.4f\n", rel);
            CHECK(rel < 0.12, "%s: the reference encoder's error %.3f is too large for its type", name, rel);
            h3_tensor_free(&o);
        }
        checked++;
        free(got);
        h3_tensor_free(&ref);
    }
    CHECK(checked >= 20, "checked %d tensors", checked);
    h3_st_close(&exp);
    h3_st_close(&s);
    h3_gguf_free(g);
}

static void test_set_view(void) {
    char p[512];
    h3_st_set s;
    h3_gguf *g = NULL;
    CHECK_OK(h3_gguf_open(fix("gguf_types.gguf", p, sizeof p), &s, &g));
    if (!g) return;
    /* Dims reversed: ne = [512, 2] is [2, 512]; quantized entries are their stored bytes. */
    const h3_st_entry *e = h3_st_find(&s, "q4_k");
    CHECK(e && e->dtype == H3_U8 && e->ndim == 2 && e->shape[0] == 2 && e->shape[1] == 2 * 144,
          "q4_k entry: U8 [2, 288]");
    h3_qweight_info qi;
    CHECK_OK(h3_qweight_info_of(&s, g, e, &qi));
    CHECK(qi.fmt == H3_QF_Q4_K && qi.ndim == 2 && qi.shape[0] == 2 && qi.shape[1] == 512 &&
              !strcmp(qi.label, "Q4_K"),
          "q4_k info: %s [%lld, %lld]", qi.label, (long long)qi.shape[0], (long long)qi.shape[1]);
    e = h3_st_find(&s, "f16");
    CHECK(e && e->dtype == H3_F16 && e->ndim == 2 && e->shape[0] == 5 && e->shape[1] == 7,
          "f16 entry [5, 7]");
    e = h3_st_find(&s, "bf16");
    CHECK(e && e->dtype == H3_BF16, "bf16 entry");
    /* The flattened matrix has its true shape; the 3-D one is rows of its last dim. */
    CHECK_OK(h3_qweight_info_of(&s, g, h3_st_find(&s, "flat"), &qi));
    CHECK(qi.gguf_reshaped && qi.ndim == 2 && qi.shape[0] == 12 && qi.shape[1] == 40,
          "flat: [12, 40] from orig_shape");
    CHECK_OK(h3_qweight_info_of(&s, g, h3_st_find(&s, "cube"), &qi));
    CHECK(qi.ndim == 3 && qi.shape[0] == 2 && qi.shape[1] == 3 && qi.shape[2] == 64, "cube [2, 3, 64]");
    /* A packed weight is a row-wise tensor whose row views decode like its rows. */
    h3_tensor t, v;
    CHECK_OK(h3_qweight_get_name(&s, g, "q6_k", &t));
    CHECK(t.q.mode == H3_SCALE_FORMAT && t.stride[0] == 420 && h3_tensor_nbytes(&t) == 840, "q6_k tensor");
    float full[2 * 512], row[512];
    CHECK_OK(h3_tensor_rows_to_f32(&t, 0, 2, full));
    CHECK_OK(h3_tensor_narrow(&t, 0, 1, 1, &v));
    CHECK_OK(h3_tensor_rows_to_f32(&v, 0, 1, row));
    CHECK(memcmp(row, full + 512, sizeof row) == 0, "row view of a Q6_K tensor");
    CHECK_ERR(h3_tensor_narrow(&t, 1, 0, 256, &v), H3_ERR_UNSUPPORTED, "packed");
    h3_tensor_free(&t);
    h3_st_close(&s);
    h3_gguf_free(g);
}

static void test_llama_names(void) {
    char p[512];
    h3_st_set s;
    h3_gguf *g = NULL;
    CHECK_OK(h3_gguf_open(fix("te.gguf", p, sizeof p), &s, &g));
    if (!g) return;
    CHECK(g->llama_names, "llama.cpp names recognized");
    const char *want[] = {"model.embed_tokens.weight",
                          "model.layers.0.input_layernorm.weight",
                          "model.layers.3.post_attention_layernorm.weight",
                          "model.layers.1.self_attn.q_proj.weight",
                          "model.layers.2.self_attn.o_proj.weight",
                          "model.layers.0.self_attn.k_norm.weight",
                          "model.layers.3.mlp.down_proj.weight"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(h3_st_find(&s, want[i]) != NULL, "mapped name %s", want[i]);
    const h3_gguf_tensor *t = h3_gguf_find(g, "model.layers.1.self_attn.q_proj.weight");
    CHECK(t && !strcmp(t->name, "blk.1.attn_q.weight") && t->type == H3_GGML_Q8_0,
          "stored name and type kept");
    CHECK(h3_st_find(&s, "blk.0.attn_q.weight") == NULL, "stored names are not in the set");
    h3_st_close(&s);
    h3_gguf_free(g);
}

/* ---- hand-written files
 * ------------------------------------------------------------------------------------ */

typedef struct {
    uint8_t *b;
    size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->b = realloc(b->b, b->cap);
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void u32(buf *b, uint32_t v) {
    put(b, &v, 4);
}
static void u64(buf *b, uint64_t v) {
    put(b, &v, 8);
}
static void str(buf *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void pad(buf *b, size_t a) {
    static const uint8_t z[64];
    while (b->n % a) put(b, z, 1);
}

typedef struct {
    const char *name;
    uint32_t type, nd;
    uint64_t ne[5];
    uint64_t offset;
} tinfo;

/* A file: kv pairs as given by the caller's writer, tensors with their infos, then data_bytes of data. */
static void write_file(const char *path, uint32_t version, void (*kvs)(buf *, int *), const tinfo *t, int nt,
                       size_t data_bytes) {
    buf b = {0};
    int nkv = 0;
    buf kvb = {0};
    if (kvs) kvs(&kvb, &nkv);
    put(&b, "GGUF", 4);
    u32(&b, version);
    u64(&b, (uint64_t)nt);
    u64(&b, (uint64_t)nkv);
    if (kvb.n) put(&b, kvb.b, kvb.n);
    for (int i = 0; i < nt; i++) {
        str(&b, t[i].name);
        u32(&b, t[i].nd);
        for (uint32_t d = 0; d < t[i].nd; d++) u64(&b, t[i].ne[d]);
        u32(&b, t[i].type);
        u64(&b, t[i].offset);
    }
    pad(&b, 32);
    for (size_t i = 0; i < data_bytes; i++) {
        uint8_t v = (uint8_t)(i * 7);
        if (i % 34 < 2) v = 0x10; /* keeps any f16 block scale small and finite */
        put(&b, &v, 1);
    }
    FILE *f = fopen(path, "wb");
    fwrite(b.b, 1, b.n, f);
    fclose(f);
    free(b.b);
    free(kvb.b);
}

static void kv_none(buf *b, int *n) {
    (void)b;
    *n = 0;
}
static void kv_align64(buf *b, int *n) {
    str(b, "general.alignment");
    u32(b, 4);
    u32(b, 64);
    *n = 1;
}
static void kv_align3(buf *b, int *n) {
    str(b, "general.alignment");
    u32(b, 4);
    u32(b, 3);
    *n = 1;
}
static void kv_dup(buf *b, int *n) {
    for (int i = 0; i < 2; i++) {
        str(b, "general.name");
        u32(b, 8);
        str(b, "x");
    }
    *n = 2;
}
static void kv_badtype(buf *b, int *n) {
    str(b, "k");
    u32(b, 13);
    *n = 1;
}
static void kv_hugearray(buf *b, int *n) {
    str(b, "k");
    u32(b, 9);
    u32(b, 6);
    u64(b, (uint64_t)1 << 60);
    *n = 1;
}
static void kv_orig_bad(buf *b, int *n) {
    str(b, "comfy.gguf.orig_shape.w");
    u32(b, 9);
    u32(b, 5);
    u64(b, 2);
    u32(b, 7);
    u32(b, 7);
    *n = 1;
}
static void kv_hugestring(buf *b, int *n) {
    str(b, "k");
    u32(b, 8);
    u64(b, (uint64_t)1 << 62);
    *n = 1;
}

static void test_strict(void) {
    char path[512];
    t_tmp_path("bad.gguf", path, sizeof path);
    h3_st_set s;
    h3_gguf *g = NULL;
    const tinfo ok1[] = {{"w", H3_GGML_Q8_0, 2, {64, 3}, 0}, {"b", H3_GGML_F32, 1, {8}, 224}};
    write_file(path, 3, kv_none, ok1, 2, 224 + 32);
    CHECK_OK(h3_gguf_open(path, &s, &g));
    if (g) {
        h3_st_close(&s);
        h3_gguf_free(g);
    }
    /* Every truncation of the header (and of the data) is an error, never a crash. */
    {
        FILE *f = fopen(path, "rb");
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *all = malloc((size_t)size);
        CHECK(fread(all, 1, (size_t)size, f) == (size_t)size, "read back");
        fclose(f);
        char tp[512];
        t_tmp_path("trunc.gguf", tp, sizeof tp);
        int failed = 0;
        for (long cut = 0; cut < size; cut++) {
            FILE *o = fopen(tp, "wb");
            fwrite(all, 1, (size_t)cut, o);
            fclose(o);
            h3_clear_error();
            h3_status st = h3_gguf_open(tp, &s, &g);
            if (st == H3_OK) {
                h3_st_close(&s);
                h3_gguf_free(g);
            } else {
                failed++;
                CHECK(st == H3_ERR_FORMAT, "cut at %ld: code %d (%s)", cut, st, h3_last_error());
            }
        }
        CHECK(failed == size, "%d of %ld truncations fail", failed, size);
        printf("  %ld truncations fail cleanly\n", size);
        unlink(tp);
        free(all);
    }
    struct {
        uint32_t version;
        void (*kv)(buf *, int *);
        tinfo t[2];
        int nt;
        size_t data;
        const char *needle;
    } bad[] = {
        {1, kv_none, {{"w", 0, 1, {4}, 0}}, 1, 32, "version 1"},
        {3, kv_none, {{"w", 0, 5, {1, 1, 1, 1, 1}, 0}}, 1, 32, "5 dims"},
        {3, kv_none, {{"w", H3_GGML_Q8_0, 2, {48, 2}, 0}}, 1, 256, "not a multiple of its 32-value blocks"},
        {3, kv_none, {{"w", H3_GGML_F32, 1, {4}, 16}}, 1, 64, "not a multiple of the alignment"},
        {3, kv_none, {{"w", H3_GGML_F32, 1, {64}, 0}}, 1, 128, "past the end"},
        {3, kv_none, {{"w", 4, 1, {32}, 0}}, 1, 64, "not a type ggml defines"},
        {3, kv_none, {{"w", 99, 1, {32}, 0}}, 1, 64, "not a type ggml defines"},
        {3, kv_none, {{"a", H3_GGML_F32, 1, {16}, 0}, {"b", H3_GGML_F32, 1, {16}, 32}}, 2, 96, "overlap"},
        {3, kv_none, {{"a", H3_GGML_F32, 1, {4}, 0}, {"a", H3_GGML_F32, 1, {4}, 32}}, 2, 64, "appears twice"},
        {3, kv_dup, {{"w", 0, 1, {4}, 0}}, 1, 32, "appears twice"},
        {3, kv_align3, {{"w", 0, 1, {4}, 0}}, 1, 32, "power of two"},
        {3, kv_badtype, {{"w", 0, 1, {4}, 0}}, 1, 32, "value type 13"},
        {3, kv_hugearray, {{"w", 0, 1, {4}, 0}}, 1, 32, "runs past the end"},
        {3, kv_hugestring, {{"w", 0, 1, {4}, 0}}, 1, 32, "runs past the end"},
        {3, kv_orig_bad, {{"w", 0, 2, {4, 2}, 0}}, 1, 32, "has 49 values but the tensor holds 8"},
        {3, kv_none, {{"w", 0, 2, {(uint64_t)1 << 41, 4}, 0}}, 1, 32, "impossible size"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(path, bad[i].version, bad[i].kv, bad[i].t, bad[i].nt, bad[i].data);
        g = (h3_gguf *)1;
        CHECK_ERR(h3_gguf_open(path, &s, &g), H3_ERR_FORMAT, bad[i].needle);
        CHECK(g == NULL, "case %zu returns no handle", i);
    }
    /* Alignment 64 is honoured: an offset of 32 is misaligned, 64 is fine. */
    const tinfo a1[] = {{"a", 0, 1, {4}, 0}, {"b", 0, 1, {4}, 32}};
    write_file(path, 3, kv_align64, a1, 2, 128);
    CHECK_ERR(h3_gguf_open(path, &s, &g), H3_ERR_FORMAT, "alignment 64");
    const tinfo a2[] = {{"a", 0, 1, {4}, 0}, {"b", 0, 1, {4}, 64}};
    write_file(path, 3, kv_align64, a2, 2, 128);
    CHECK_OK(h3_gguf_open(path, &s, &g));
    if (g) {
        CHECK(g->alignment == 64 && g->data_start % 64 == 0, "data section aligned to 64");
        h3_st_close(&s);
        h3_gguf_free(g);
    }
    /* A type ggml defines but h3run does not decode: opens and lists; loading names the type and tensor. */
    const tinfo iq[] = {{"blk.w", 16, 2, {256, 1}, 0}};
    write_file(path, 3, kv_none, iq, 1, 96);
    CHECK_OK(h3_gguf_open(path, &s, &g));
    if (g) {
        h3_tensor t;
        CHECK_ERR(h3_qweight_get_name(&s, g, "blk.w", &t), H3_ERR_UNSUPPORTED, "GGUF type IQ2_XXS");
        CHECK(strstr(h3_last_error(), "blk.w") != NULL, "the message names the tensor");
        h3_st_close(&s);
        h3_gguf_free(g);
    }
    /* Not GGUF at all. */
    FILE *f = fopen(path, "wb");
    fputs("GGML this is not a gguf file at all....", f);
    fclose(f);
    CHECK_ERR(h3_gguf_open(path, &s, &g), H3_ERR_FORMAT, "magic");
    unlink(path);
    CHECK_ERR(h3_gguf_open(path, &s, &g), H3_ERR_IO, "cannot open");
}

static void test_alloc_failures(void) {
    char p[512];
    h3_mem_stats base;
    h3_mem_get_stats(&base);
    int failures = 0, n;
    for (n = 1; n < 10000; n++) {
        h3_st_set s;
        h3_gguf *g = NULL;
        h3_tensor t = {0};
        h3_mem_fail_at(n, 0);
        h3_clear_error();
        h3_status st = h3_gguf_open(fix("te.gguf", p, sizeof p), &s, &g);
        if (st == H3_OK) st = h3_qweight_get_name(&s, g, "model.layers.0.self_attn.q_proj.weight", &t);
        int64_t ticks = h3_mem_fail_at(0, 0);
        h3_tensor_free(&t);
        if (g) {
            h3_st_close(&s);
            h3_gguf_free(g);
        }
        if (st == H3_OK) {
            CHECK(ticks < n, "succeeded although allocation %d should have failed", n);
            break;
        }
        failures++;
        CHECK(st == H3_ERR_NOMEM, "failing allocation %d: expected out of memory, got %d: %s", n, st,
              h3_last_error());
        h3_mem_stats now;
        h3_mem_get_stats(&now);
        CHECK(now.total_current == base.total_current, "failing allocation %d leaked %lld bytes", n,
              (long long)(now.total_current - base.total_current));
    }
    printf("  %d allocation points fail cleanly\n", failures);
    CHECK(failures > 5, "only %d allocation points were exercised", failures);
}

int main(int argc, char **argv) {
    const t_case cases[] = {
        {"types_bitexact", test_types_bitexact}, {"set_view", test_set_view},
        {"llama_names", test_llama_names},       {"strict", test_strict},
        {"alloc_failures", test_alloc_failures}, {NULL, NULL},
    };
    return t_main("test_gguf", cases, argc, argv);
}

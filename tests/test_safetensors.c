/* safetensors: round trips, shard indexes and folders, a table of malformed files, and allocation failures.
 *
 * `test_safetensors --write-malformed DIR` writes the malformed table into DIR (used by the CLI test). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "io/detect.h"
#include "io/safetensors.h"
#include "testutil.h"

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot create %s", path);
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

/* A file from a literal header and `data_len` data bytes (pattern-filled). hdr_len_override != 0 lies about the
 * header length. */
static void write_raw(const char *path, const char *header, size_t data_len, uint64_t hdr_len_override,
                      size_t truncate_to) {
    size_t hl = strlen(header);
    size_t total = 8 + hl + data_len;
    uint8_t *buf = malloc(total);
    uint64_t n = hdr_len_override ? hdr_len_override : hl;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (uint8_t)(i * 7 + 1);
    write_bytes(path, buf, truncate_to ? truncate_to : total);
    free(buf);
}

typedef struct {
    const char *file, *header;
    size_t data_len;
    uint64_t hdr_len;
    size_t truncate_to;
    const char *rule; /* a phrase the message must contain */
} bad_case;

static const bad_case g_bad[] = {
    {"truncated_header.safetensors", "{}", 0, 0, 5, "too short"},
    {"header_past_eof.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 1000, 0,
     "past the end"},
    {"bad_json.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, 0, 0,
     "not valid JSON"},
    {"not_object.safetensors", "[1,2,3]                 ", 0, 0, 0, "not an object"},
    {"unknown_dtype.safetensors", "{\"w\":{\"dtype\":\"F12\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, 0, 0,
     "unknown dtype 'F12'"},
    {"span_mismatch.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24, 0, 0,
     "does not match shape"},
    {"overlap.safetensors",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
     24, 0, 0, "overlap"},
    {"offsets_past_end.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12, 0, 0,
     "past the data area"},
    {"overflow_shape.safetensors",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],\"data_offsets\":[0,16]}}", 16, 0,
     0, "overflows"},
    {"overflow_bytes.safetensors",
     "{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,16]}}", 16, 0, 0, "overflows"},
    {"negative_shape.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, 0, 0,
     "non-negative"},
    {"reversed_offsets.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, 0, 0,
     "reversed"},
    {"duplicate_key.safetensors",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
     "\"data_offsets\":[4,8]}}",
     8, 0, 0, "duplicate"},
    {"bad_metadata.safetensors", "{\"__metadata__\":{\"a\":1}}", 0, 0, 0, "not a string"},
    {"too_many_dims.safetensors",
     "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, 0, 0, "dims"},
    {"missing_offsets.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, 0, 0, "data_offsets"},
    {"huge_header_len.safetensors", "{}", 0, 0xffffffffffffull, 0, "past the end"},
    {NULL, NULL, 0, 0, 0, NULL},
};

static void write_malformed(const char *dir) {
    mkdir(dir, 0755);
    for (const bad_case *c = g_bad; c->file; c++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, c->file);
        write_raw(p, c->header, c->data_len, c->hdr_len, c->truncate_to);
    }
    char p[1024];
    snprintf(p, sizeof p, "%s/empty.safetensors", dir);
    write_bytes(p, "", 0);
}

static void test_malformed(void) {
    char dir[512];
    t_tmp_path("malformed", dir, sizeof dir);
    write_malformed(dir);
    for (const bad_case *c = g_bad; c->file; c++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, c->file);
        h3_st_set s;
        h3_clear_error();
        h3_status st = h3_st_open(p, &s);
        CHECK(st == H3_ERR_FORMAT, "%s: expected a format error, got %d: %s", c->file, st, h3_last_error());
        CHECK(strstr(h3_last_error(), c->rule) != NULL, "%s: message '%s' does not name the rule '%s'", c->file,
              h3_last_error(), c->rule);
        CHECK(strstr(h3_last_error(), c->file) != NULL, "%s: message does not name the file", c->file);
        if (strchr(c->header, 'w') && strstr(c->rule, "JSON") == NULL && strstr(c->header, "\"w\"") &&
            strcmp(c->rule, "duplicate") != 0)
            CHECK(strstr(h3_last_error(), "'w'") != NULL, "%s: message '%s' does not name the tensor", c->file,
                  h3_last_error());
        if (st == H3_OK) h3_st_close(&s);
    }
    char p[1024];
    snprintf(p, sizeof p, "%s/empty.safetensors", dir);
    h3_st_set s;
    CHECK_ERR(h3_st_open(p, &s), H3_ERR_FORMAT, "too short");
    snprintf(p, sizeof p, "%s/does_not_exist.safetensors", dir);
    CHECK_ERR(h3_st_open(p, &s), H3_ERR_IO, "does_not_exist");
    for (const bad_case *c = g_bad; c->file; c++) {
        snprintf(p, sizeof p, "%s/%s", dir, c->file);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/empty.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

/* ---- valid files ------------------------------------------------------------------------------------------ */

static void write_sample(const char *path, float *f32, uint16_t *b16, int8_t *i8) {
    h3_st_writer *w;
    CHECK_OK(h3_st_writer_new(&w));
    int64_t s1[2] = {3, 5}, s2[1] = {7}, s3[3] = {2, 0, 4}, s4[1] = {9};
    for (int i = 0; i < 15; i++) f32[i] = (float)t_randn();
    for (int i = 0; i < 7; i++) b16[i] = h3_f32_to_bf16((float)t_randn());
    for (int i = 0; i < 9; i++) i8[i] = (int8_t)(t_rand_u64() & 0xff);
    CHECK_OK(h3_st_writer_add(w, "layer.weight", H3_F32, 2, s1, f32));
    CHECK_OK(h3_st_writer_add(w, "layer.bias", H3_BF16, 1, s2, b16));
    CHECK_OK(h3_st_writer_add(w, "empty", H3_F16, 3, s3, NULL));
    CHECK_OK(h3_st_writer_add(w, "scalar", H3_F32, 0, NULL, f32 + 3));
    CHECK_OK(h3_st_writer_add(w, "q", H3_I8, 1, s4, i8));
    CHECK_ERR(h3_st_writer_add(w, "q", H3_I8, 1, s4, i8), H3_ERR_INVALID, "twice");
    CHECK_OK(h3_st_writer_meta(w, "format", "pt"));
    CHECK_OK(h3_st_writer_write(w, path, 0));
    h3_st_writer_free(w);
}

static void test_roundtrip(void) {
    char path[512];
    t_tmp_path("rt.safetensors", path, sizeof path);
    float f32[15];
    uint16_t b16[7];
    int8_t i8[9];
    write_sample(path, f32, b16, i8);
    h3_st_set s;
    CHECK_OK(h3_st_open(path, &s));
    CHECK(s.n_entries == 5, "%lld entries", (long long)s.n_entries);
    CHECK(h3_st_metadata(&s, "format") && strcmp(h3_st_metadata(&s, "format"), "pt") == 0);
    h3_tensor t;
    CHECK_OK(h3_st_get(&s, "layer.weight", &t));
    CHECK(t.dtype == H3_F32 && t.ndim == 2 && t.shape[0] == 3 && t.shape[1] == 5);
    CHECK(memcmp(t.data, f32, sizeof f32) == 0, "f32 bytes differ");
    h3_tensor_free(&t);
    CHECK_OK(h3_st_get(&s, "scalar", &t));
    CHECK(t.ndim == 0 && h3_tensor_numel(&t) == 1 && ((float *)t.data)[0] == f32[3]);
    h3_tensor_free(&t);
    CHECK_OK(h3_st_get(&s, "empty", &t));
    CHECK(h3_tensor_numel(&t) == 0);
    h3_tensor_free(&t);
    /* Loading a tensor with no elements copies nothing: its mapped view has no data pointer, and memcpy from
     * NULL (even of 0 bytes) is undefined (UBSan stopped here in decode --latents of a [1, 32, 0] file).
     * Converting too. */
    for (int k = 0; k < 2; k++) {
        h3_dtype want = k ? H3_F16 : H3_F32; /* "empty" is f16 [2, 0, 3] */
        CHECK_OK(h3_st_load(&s, "empty", H3_PLACE_HOST, want, H3_MEM_WEIGHTS, &t));
        CHECK(h3_tensor_numel(&t) == 0 && t.dtype == want && h3_tensor_is_contiguous(&t),
              "an empty %s tensor, contiguous", h3_dtype_name(want));
        h3_tensor_free(&t);
    }
    CHECK_ERR(h3_st_load(&s, "empty", H3_PLACE_HOST, H3_BF16, H3_MEM_WEIGHTS, &t), H3_ERR_UNSUPPORTED, "f16");
    CHECK_OK(h3_st_get(&s, "q", &t));
    CHECK(memcmp(t.data, i8, sizeof i8) == 0);
    h3_tensor_free(&t);
    CHECK_OK(h3_st_load(&s, "layer.bias", H3_PLACE_HOST, H3_F32, H3_MEM_WEIGHTS, &t));
    for (int i = 0; i < 7; i++) CHECK(((float *)t.data)[i] == h3_bf16_to_f32(b16[i]));
    h3_tensor_free(&t);
    CHECK_ERR(h3_st_get(&s, "nope", &t), H3_ERR_NOT_FOUND, "'nope'");
    CHECK_ERR(h3_st_load(&s, "q", H3_PLACE_HOST, H3_F32, H3_MEM_WEIGHTS, &t), H3_ERR_UNSUPPORTED, "i8");
    h3_st_close(&s);
    unlink(path);
}

static void test_shards(void) {
    char dir[512], p1[600], p2[600], idx[600];
    t_tmp_path("shards", dir, sizeof dir);
    mkdir(dir, 0755);
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    int64_t sa[1] = {4}, sb[2] = {1, 2};
    h3_st_writer *w;
    CHECK_OK(h3_st_writer_new(&w));
    CHECK_OK(h3_st_writer_add(w, "blocks.0.w", H3_F32, 1, sa, a));
    CHECK_OK(h3_st_writer_write(w, p1, 0));
    h3_st_writer_free(w);
    CHECK_OK(h3_st_writer_new(&w));
    CHECK_OK(h3_st_writer_add(w, "blocks.1.w", H3_F32, 2, sb, b));
    CHECK_OK(h3_st_writer_write(w, p2, 0));
    h3_st_writer_free(w);
    const char *good = "{\"metadata\":{\"total_size\":24},\"weight_map\":{\"blocks.0.w\":\"model-00001-of-00002."
                       "safetensors\",\"blocks.1.w\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes(idx, good, strlen(good));
    const char *paths[2] = {idx, dir};
    for (int k = 0; k < 2; k++) {
        h3_st_set s;
        CHECK_OK(h3_st_open(paths[k], &s));
        CHECK(s.n_entries == 2 && s.n_files == 2);
        h3_tensor t;
        CHECK_OK(h3_st_get(&s, "blocks.1.w", &t));
        CHECK(((float *)t.data)[1] == 6.0f);
        h3_tensor_free(&t);
        CHECK(h3_count_layers(&s, "blocks.") == 2);
        h3_st_close(&s);
    }
    /* The index names a tensor in the wrong shard. */
    const char *bad = "{\"weight_map\":{\"blocks.0.w\":\"model-00002-of-00002.safetensors\",\"blocks.1.w\":"
                      "\"model-00002-of-00002.safetensors\"}}";
    write_bytes(idx, bad, strlen(bad));
    h3_st_set s;
    CHECK_ERR(h3_st_open(idx, &s), H3_ERR_FORMAT, "does not hold it");
    const char *escape = "{\"weight_map\":{\"x\":\"../etc/passwd\"}}";
    write_bytes(idx, escape, strlen(escape));
    CHECK_ERR(h3_st_open(idx, &s), H3_ERR_FORMAT, "must be a file in the index's folder");
    unlink(idx);
    /* Without the index, the folder's files form one set. */
    CHECK_OK(h3_st_open(dir, &s));
    CHECK(s.n_entries == 2);
    h3_st_close(&s);
    /* The same tensor in two files is an error. */
    CHECK_OK(h3_st_writer_new(&w));
    CHECK_OK(h3_st_writer_add(w, "blocks.0.w", H3_F32, 1, sa, a));
    CHECK_OK(h3_st_writer_write(w, p2, 0));
    h3_st_writer_free(w);
    CHECK_ERR(h3_st_open(dir, &s), H3_ERR_FORMAT, "appears in both");
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

/* Every allocation inside the loaders can fail; each failure must come back as an error with nothing leaked. */
static void test_alloc_failures(void) {
    char dir[512], p1[600], idx[600];
    t_tmp_path("allocfail", dir, sizeof dir);
    mkdir(dir, 0755);
    snprintf(p1, sizeof p1, "%s/model-00001-of-00001.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    float f32[15];
    uint16_t b16[7];
    int8_t i8[9];
    write_sample(p1, f32, b16, i8);
    const char *ix = "{\"weight_map\":{\"layer.weight\":\"model-00001-of-00001.safetensors\",\"layer.bias\":\"model-"
                     "00001-of-00001.safetensors\",\"empty\":\"model-00001-of-00001.safetensors\",\"scalar\":\"model-"
                     "00001-of-00001.safetensors\",\"q\":\"model-00001-of-00001.safetensors\"}}";
    write_bytes(idx, ix, strlen(ix));
    const char *targets[3] = {p1, idx, dir};
    for (int k = 0; k < 3; k++) {
        h3_mem_stats base;
        h3_mem_get_stats(&base);
        int failures = 0, n;
        for (n = 1; n < 10000; n++) {
            h3_mem_fail_at(n, k == 2); /* sticky on the folder pass: every allocation after the n-th fails too */
            h3_st_set s;
            h3_clear_error();
            h3_status st = h3_st_open(targets[k], &s);
            int64_t ticks = h3_mem_fail_at(0, 0);
            if (st == H3_OK) {
                h3_tensor t;
                CHECK_OK(h3_st_get(&s, "layer.weight", &t));
                h3_tensor_free(&t);
                h3_st_close(&s);
                CHECK(ticks < n, "succeeded although allocation %d should have failed", n);
                break;
            }
            failures++;
            CHECK(st == H3_ERR_NOMEM, "target %d, failing allocation %d: expected out of memory, got %d: %s", k, n, st,
                  h3_last_error());
            h3_mem_stats now;
            h3_mem_get_stats(&now);
            CHECK(now.total_current == base.total_current, "target %d, failing allocation %d leaked %lld bytes", k, n,
                  (long long)(now.total_current - base.total_current));
        }
        CHECK(failures > 5, "target %d: only %d allocation points were exercised", k, failures);
    }
    unlink(p1);
    unlink(idx);
    rmdir(dir);
}

static void test_writer_alloc_failures(void) {
    char path[512];
    t_tmp_path("wfail.safetensors", path, sizeof path);
    float x[6] = {1, 2, 3, 4, 5, 6};
    int64_t s[2] = {2, 3};
    h3_mem_stats base;
    h3_mem_get_stats(&base);
    int n;
    for (n = 1; n < 1000; n++) {
        h3_mem_fail_at(n, 0);
        h3_st_writer *w = NULL;
        h3_status st = h3_st_writer_new(&w);
        if (st == H3_OK) st = h3_st_writer_add(w, "x", H3_F32, 2, s, x);
        if (st == H3_OK) st = h3_st_writer_meta(w, "k", "v");
        if (st == H3_OK) st = h3_st_writer_write(w, path, 0);
        h3_st_writer_free(w);
        h3_mem_fail_at(0, 0);
        h3_mem_stats now;
        h3_mem_get_stats(&now);
        CHECK(now.total_current == base.total_current, "writer with failing allocation %d leaked", n);
        if (st == H3_OK) break;
        CHECK(st == H3_ERR_NOMEM, "failing allocation %d: got %d: %s", n, st, h3_last_error());
        char partial[600];
        snprintf(partial, sizeof partial, "%s.partial", path);
        CHECK(access(partial, F_OK) != 0, "a failed write left %s behind", partial);
        CHECK(access(path, F_OK) != 0, "a failed write left %s looking complete", path);
    }
    h3_st_set st;
    CHECK_OK(h3_st_open(path, &st));
    h3_st_close(&st);
    unlink(path);
}

static void test_sparse_official_dit(void) {
    /* The header-only official DiT from tools/h3-testdata: real header, data area a hole. */
    char path[512], cmd[1200];
    t_tmp_path("dit-official.safetensors", path, sizeof path);
    const char *bd = getenv("H3_BUILD_DIR");
    snprintf(cmd, sizeof cmd, "%s/h3-testdata dit-official %s", bd ? bd : ".", path);
    CHECK(system(cmd) == 0, "h3-testdata failed");
    h3_st_set s;
    CHECK_OK(h3_st_open(path, &s));
    int64_t elems = 0, bytes = 0;
    for (int64_t i = 0; i < s.n_entries; i++) {
        elems += h3_st_entry_numel(&s.entries[i]);
        bytes += (int64_t)(s.entries[i].end - s.entries[i].begin);
    }
    CHECK(s.n_entries == 535, "%lld tensors", (long long)s.n_entries);
    CHECK(elems == 33122992912LL, "%lld elements", (long long)elems);
    CHECK(bytes == 66280430144LL, "%lld bytes", (long long)bytes);
    h3_detect_info d;
    CHECK_OK(h3_detect(&s, &d));
    CHECK(d.comp == H3_COMP_DIT && d.layout == H3_LAYOUT_OFFICIAL && !d.adaln_pruned && d.n_layers == 50, "%s",
          d.summary);
    h3_st_close(&s);
    unlink(path);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-malformed") == 0) {
        write_malformed(argv[2]);
        return 0;
    }
    static const t_case cases[] = {
        {"roundtrip", test_roundtrip},
        {"shards", test_shards},
        {"malformed", test_malformed},
        {"alloc_failures", test_alloc_failures},
        {"writer_alloc_failures", test_writer_alloc_failures},
        {"sparse_official_dit", test_sparse_official_dit},
        {NULL, NULL},
    };
    return t_main("test_safetensors", cases, argc, argv);
}

/* The stored formats' traits table (src/tensor/qformat.h): every format's entry is whole and agrees with the
 * helpers that answer from it; the GGUF reader's ggml type table (src/io/gguf.c, which only parses) names
 * every block format the table decodes, with the same name, block size and bytes per block; the host's row
 * decoders (the table) and the device's block dispatch (h3_gguf_block_decode, tensor/gguf_blocks.h) give the
 * same bits; nvfp4's row decoder takes each row's block scales from the swizzled matrix at the row it is
 * told. The values themselves are checked against the formats' references in test_quant.c and test_gguf.c. */
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "tensor/gguf_blocks.h"
#include "tensor/qformat.h"
#include "testutil.h"

static int is_gguf(h3_qformat f) {
    return f >= H3_QF_Q4_0 && f <= H3_QF_Q6_K;
}

static void test_traits(void) {
    CHECK(h3_qformat_get_traits((h3_qformat)H3_QF_COUNT) == NULL &&
              h3_qformat_get_traits((h3_qformat)-1) == NULL,
          "out-of-range formats have no traits");
    CHECK(!strcmp(h3_qformat_name((h3_qformat)H3_QF_COUNT), "?"), "out-of-range name");
    for (int i = 0; i < H3_QF_COUNT; i++) {
        const h3_qformat f = (h3_qformat)i;
        const h3_qformat_traits *t = h3_qformat_get_traits(f);
        CHECK(t && t->name && t->name[0], "format %d has a name", i);
        if (!t || !t->name) continue;
        CHECK(!strcmp(h3_qformat_name(f), t->name), "%s: h3_qformat_name", t->name);
        CHECK((f == H3_QF_NONE) == (t->to_f32 == NULL), "%s: a row decoder exactly when it is stored",
              t->name);
        const int want_packed = f == H3_QF_NVFP4 || is_gguf(f);
        CHECK(t->packed == want_packed, "%s: packed %d", t->name, t->packed);
        int64_t be = -1, bb = -1;
        const int has = h3_qformat_block(f, &be, &bb);
        CHECK(has == want_packed, "%s: h3_qformat_block answers for packed formats only", t->name);
        if (!want_packed) {
            CHECK(h3_qformat_row_bytes(f, 64) == -1, "%s: no row bytes", t->name);
            continue;
        }
        CHECK(be == t->block_elems && bb == t->block_bytes && be > 0 && bb > 0, "%s: block %lld/%lld",
              t->name, (long long)be, (long long)bb);
        CHECK(h3_qformat_row_bytes(f, 7 * be) == 7 * bb, "%s: row bytes of 7 blocks", t->name);
        CHECK(h3_qformat_row_bytes(f, 7 * be + 1) == -1 && h3_qformat_row_bytes(f, -be) == -1,
              "%s: partial blocks and negative widths have no row bytes", t->name);
    }
}

/* Each of the ten GGUF block formats is the h3_qformat of exactly one ggml type id, under the same name and
 * block sizes; no other type id maps to a format. */
static void test_ggml_types_agree(void) {
    int seen[H3_QF_COUNT] = {0};
    for (uint32_t id = 0; id < H3_GGML_TYPE_LIMIT + 4; id++) {
        const h3_qformat f = h3_ggml_qformat(id);
        if (f == H3_QF_NONE) continue;
        CHECK(is_gguf(f), "ggml type %u maps to %s, not a GGUF block format", id, h3_qformat_name(f));
        if (!is_gguf(f)) continue;
        seen[f]++;
        const h3_qformat_traits *t = h3_qformat_get_traits(f);
        int64_t be = 0, bb = 0;
        const char *name = h3_ggml_type_name(id);
        CHECK(h3_ggml_type_size(id, &be, &bb) && be == t->block_elems && bb == t->block_bytes,
              "ggml type %u (%s): the reader's block %lld/%lld, the traits' %lld/%lld", id, name ? name : "?",
              (long long)be, (long long)bb, (long long)t->block_elems, (long long)t->block_bytes);
        CHECK(name && !strcmp(name, t->name), "ggml type %u: the reader's name %s, the traits' %s", id,
              name ? name : "(none)", t->name);
    }
    for (int f = H3_QF_Q4_0; f <= H3_QF_Q6_K; f++)
        CHECK(seen[f] == 1, "%s is the format of %d ggml types", h3_qformat_name((h3_qformat)f), seen[f]);
}

/* Random stored bytes (f16 fields included: NaN and infinity decode the same on both paths) through the
 * table's row decoder and, block by block, through the device's dispatch: the same bits. */
static void test_host_device_same(void) {
    enum { BLOCKS = 5 };
    for (int i = H3_QF_Q4_0; i <= H3_QF_Q6_K; i++) {
        const h3_qformat f = (h3_qformat)i;
        const h3_qformat_traits *t = h3_qformat_get_traits(f);
        const int64_t n = BLOCKS * t->block_elems;
        uint8_t *src = malloc((size_t)(BLOCKS * t->block_bytes));
        float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < BLOCKS * t->block_bytes; k++) src[k] = (uint8_t)t_rand_u64();
        t->to_f32(src, a, n, NULL);
        int ok = 1;
        for (int64_t k = 0; k < BLOCKS; k++)
            ok &= h3_gguf_block_decode(i, src + k * t->block_bytes, b + k * t->block_elems);
        CHECK(ok, "%s: the device's dispatch knows it", t->name);
        CHECK(!memcmp(a, b, (size_t)n * sizeof(float)), "%s: row decoder and block dispatch differ", t->name);
        free(src);
        free(a);
        free(b);
    }
    float y[256];
    CHECK(!h3_gguf_block_decode(H3_QF_NVFP4, (const uint8_t *)y, y) &&
              !h3_gguf_block_decode(H3_QF_INT8, (const uint8_t *)y, y),
          "the device's GGUF dispatch declines other formats");
}

/* nvfp4: row r's block c scales by the e4m3 at h3_nvfp4_scale_index(r, c, C) times scale_2; codes high
 * nibble first. Rows past the first 128-row tile and a width that pads the scale matrix's columns. */
static void test_nvfp4_side(void) {
    const int64_t R = 260, K = 48, C = K / 16;
    uint8_t *scales = calloc((size_t)h3_nvfp4_scale_count(R, K), 1);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++)
            scales[h3_nvfp4_scale_index(r, c, C)] = (uint8_t)(0x30 + (r * 3 + c) % 40); /* finite e4m3 */
    uint8_t row[24];
    for (int k = 0; k < 24; k++) row[k] = (uint8_t)t_rand_u64();
    const h3_qformat_traits *t = h3_qformat_get_traits(H3_QF_NVFP4);
    const int64_t rows[] = {0, 31, 127, 128, 200, 259};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        h3_qrow_side side = {scales, rows[i], 0.375f};
        float d[48];
        t->to_f32(row, d, K, &side);
        int bad = 0;
        for (int64_t k = 0; k < K; k++) {
            const uint8_t code = (k & 1) ? (row[k / 2] & 15) : (row[k / 2] >> 4);
            const float s = h3_fp8e4m3_to_f32(scales[h3_nvfp4_scale_index(rows[i], k / 16, C)]) * 0.375f;
            bad += d[k] != h3_e2m1_to_f32(code) * s;
        }
        CHECK(!bad, "nvfp4 row %lld: %d of %lld values differ from the definition", (long long)rows[i], bad,
              (long long)K);
    }
    free(scales);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"traits", test_traits},
        {"ggml_types_agree", test_ggml_types_agree},
        {"host_device_same", test_host_device_same},
        {"nvfp4_side", test_nvfp4_side},
        {NULL, NULL},
    };
    return t_main("test_qformat", cases, argc, argv);
}

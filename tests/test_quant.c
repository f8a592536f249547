/* Quantized formats: ConvRot against the definition of the regular Hadamard matrix (float64), E2M1 and the
 * nvfp4 scale swizzle against their definitions, every ComfyUI format of
 * tests/fixtures/quant/formats.safetensors (written by tools/reference/quant_reference.py) decoded and
 * compared with the reference's dequantized weights, h3run's quantizers against the reference's bytes,
 * markers byte for byte, bad files, allocation failures.
 *
 * Tolerances: decodes that are one rounding per value (int8 without rotation, fp8, nvfp4, AWQ) are bit-exact;
 * the ConvRot un-rotation sums G terms in another order than the reference's matmul, so |Δ| <= 1e-6·max|row|
 * (f32 rounding of G = 256 terms is < 3e-6 relative in the worst case, typically 1e-7); rotated quantization
 * may round a value that lies on a .5 boundary differently: at most 0.5% of the codes differ, by one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "quant/qload.h"
#include "quant/qwrite.h"
#include "testutil.h"

static const char *fix(const char *rel, char *buf, size_t n) {
    char r[256];
    snprintf(r, sizeof r, "tests/fixtures/quant/%s", rel);
    return t_src_path(r, buf, n);
}

/* ---- ConvRot ----------------------------------------------------------------------------------------------
 */

/* H_G[i][j] = G^-1/2 · Π over base-4 digits (a, b) of i, j of H4[a][b], H4[a][b] = -1 iff a + b == 3. */
static double hadamard_entry(int64_t g, int64_t i, int64_t j) {
    double v = 1.0 / sqrt((double)g);
    for (int64_t m = 1; m < g; m *= 4) {
        int a = (int)((i / m) % 4), b = (int)((j / m) % 4);
        if (a + b == 3) v = -v;
    }
    return v;
}

static void test_convrot(void) {
    const int64_t groups[] = {4, 16, 64, 256};
    for (size_t k = 0; k < sizeof groups / sizeof groups[0]; k++) {
        int64_t g = groups[k], n = 3 * g;
        float *v = malloc((size_t)n * sizeof(float)), *w = malloc((size_t)n * sizeof(float));
        double *ref = malloc((size_t)n * sizeof(double));
        t_fill_randn(v, (size_t)n, 1.0);
        memcpy(w, v, (size_t)n * sizeof(float));
        for (int64_t b = 0; b < n; b += g)
            for (int64_t j = 0; j < g; j++) {
                double acc = 0;
                for (int64_t i = 0; i < g; i++) acc += (double)v[b + i] * hadamard_entry(g, i, j);
                ref[b + j] = acc;
            }
        h3_convrot_apply(w, n, g);
        char what[64];
        snprintf(what, sizeof what, "ConvRot G=%lld vs the definition", (long long)g);
        EXPECT_CLOSE(what, w, ref, (size_t)n, 1e-6);
        /* its own inverse */
        h3_convrot_apply(w, n, g);
        double *vd = malloc((size_t)n * sizeof(double));
        for (int64_t i = 0; i < n; i++) vd[i] = v[i];
        snprintf(what, sizeof what, "ConvRot G=%lld twice", (long long)g);
        EXPECT_CLOSE(what, w, vd, (size_t)n, 1e-6);
        free(vd);
        free(v);
        free(w);
        free(ref);
    }
    /* Sylvester's H4 = [[1,1,1,1],[1,-1,1,-1],...] is not it: its first row differs. */
    CHECK(hadamard_entry(4, 0, 3) < 0 && hadamard_entry(4, 1, 1) > 0, "regular H4, not Sylvester");
    CHECK(h3_convrot_group_ok(4) && h3_convrot_group_ok(256) && h3_convrot_group_ok(1024), "powers of 4");
    CHECK(!h3_convrot_group_ok(0) && !h3_convrot_group_ok(1) && !h3_convrot_group_ok(2) &&
              !h3_convrot_group_ok(8) && !h3_convrot_group_ok(128) && !h3_convrot_group_ok(96),
          "not powers of 4");
}

/* ---- element formats and the swizzle
 * ------------------------------------------------------------------------ */

static void test_e2m1(void) {
    const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++) {
        float v = h3_e2m1_to_f32((uint8_t)c);
        CHECK(fabsf(v) == mags[c & 7] && (signbit(v) != 0) == (c >= 8), "code %d -> %g", c, v);
        CHECK(h3_f32_to_e2m1(v) == c, "value %g encodes back to %d, got %d", v, c, h3_f32_to_e2m1(v));
    }
    /* midpoints round to the even code; beyond 6 saturates */
    const struct {
        float x;
        int code;
    } t[] = {{0.25f, 0}, {0.75f, 2},  {1.25f, 2}, {1.75f, 4},  {2.5f, 4},  {3.5f, 6},  {5.0f, 6},
             {5.01f, 7}, {100.0f, 7}, {-0.1f, 8}, {-2.9f, 13}, {0.26f, 1}, {-5.5f, 15}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        CHECK(h3_f32_to_e2m1(t[i].x) == t[i].code, "%g -> %d, got %d", t[i].x, t[i].code,
              h3_f32_to_e2m1(t[i].x));
}

static void test_swizzle(void) {
    /* cuBLAS's layout as comfy-kitchen's to_blocked builds it: the padded [Rp, Cp] matrix viewed as
     * [Rp/128, 128, Cp/4, 4], permuted to [Rp/128, Cp/4, 128, 4], each 128 rows split [4, 32] and transposed
     * to [32, 4], flattened. */
    const int64_t shapes[][2] = {{128, 4}, {256, 8}, {200, 5}, {1, 1}, {130, 9}, {40, 3}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int64_t R = shapes[k][0], C = shapes[k][1], nrb = (R + 127) / 128, ncb = (C + 3) / 4;
        int64_t total = nrb * 128 * ncb * 4;
        CHECK(total == h3_nvfp4_scale_count(R, 16 * C), "padded count for [%lld, %lld]", (long long)R,
              (long long)C);
        int64_t bad = 0;
        int64_t out = 0;
        for (int64_t rb = 0; rb < nrb; rb++)
            for (int64_t cb = 0; cb < ncb; cb++)
                for (int64_t j = 0; j < 32; j++)
                    for (int64_t i = 0; i < 4; i++)
                        for (int64_t c = 0; c < 4; c++, out++) {
                            int64_t row = rb * 128 + i * 32 + j, col = cb * 4 + c;
                            if (row < R && col < C && h3_nvfp4_scale_index(row, col, C) != out) bad++;
                        }
        CHECK(bad == 0 && out == total, "[%lld, %lld]: %lld positions differ", (long long)R, (long long)C,
              (long long)bad);
    }
}

/* ---- the reference's files
 * ---------------------------------------------------------------------------------- */

typedef struct {
    const char *layer;
    h3_qformat fmt;
    const char *label;
    int64_t n, k;
    double exact_tol; /* 0: bit-exact decode; else |Δ| <= tol · max|row| */
    double rt_tol;    /* round trip: ||W − orig|| / ||orig|| below this */
} layer_case;

static const layer_case g_layers[] = {
    {"int8r256", H3_QF_INT8, "int8_tensorwise convrot 256", 16, 512, 1e-6, 0.012},
    {"int8r64", H3_QF_INT8, "int8_tensorwise convrot 64", 12, 128, 1e-6, 0.012},
    {"int8", H3_QF_INT8, "int8_tensorwise", 12, 48, 0, 0.02},
    {"int8s", H3_QF_INT8, "int8_tensorwise (one scale)", 8, 32, 0, 0.04},
    {"fp8", H3_QF_FP8, "float8_e4m3fn", 16, 64, 0, 0.04},
    {"nvfp4", H3_QF_NVFP4, "nvfp4 awq (full-precision matmul)", 128, 64, 0, 0.15},
    {"nvfp4p", H3_QF_NVFP4, "nvfp4 (full-precision matmul)", 40, 48, 0, 0.15},
    {"embed", H3_QF_INT8, "int8_tensorwise", 50, 32, 0, 0.02},
};

static float *load_f32(h3_st_set *s, const char *name, int64_t n) {
    h3_tensor t;
    CHECK_OK(h3_st_load(s, name, H3_PLACE_HOST, H3_F32, H3_MEM_OTHER, &t));
    if (!t.data) return NULL;
    CHECK(h3_tensor_numel(&t) == n, "%s has %lld values, expected %lld", name, (long long)h3_tensor_numel(&t),
          (long long)n);
    float *v = malloc((size_t)n * sizeof(float));
    memcpy(v, t.data, (size_t)n * sizeof(float));
    h3_tensor_free(&t);
    return v;
}

static void test_formats_decode(void) {
    char p[512];
    h3_st_set s;
    CHECK_OK(h3_st_open(fix("formats.safetensors", p, sizeof p), &s));
    for (size_t i = 0; i < sizeof g_layers / sizeof g_layers[0]; i++) {
        const layer_case *L = &g_layers[i];
        char name[96];
        snprintf(name, sizeof name, "%s.weight", L->layer);
        const h3_st_entry *e = h3_st_find(&s, name);
        CHECK(e != NULL, "%s present", name);
        if (!e) continue;
        h3_qweight_info qi;
        CHECK_OK(h3_qweight_info_of(&s, NULL, e, &qi));
        CHECK(qi.fmt == L->fmt && qi.ndim == 2 && qi.shape[0] == L->n && qi.shape[1] == L->k &&
                  !strcmp(qi.label, L->label),
              "%s: %s [%lld, %lld], expected %s [%lld, %lld]", L->layer, qi.label, (long long)qi.shape[0],
              (long long)qi.shape[1], L->label, (long long)L->n, (long long)L->k);
        h3_tensor w;
        CHECK_OK(h3_qweight_get(&s, NULL, e, &w));
        if (!w.data) continue;
        CHECK(w.shape[0] == L->n && w.shape[1] == L->k, "%s tensor shape", L->layer);
        float *got = malloc((size_t)(L->n * L->k) * sizeof(float));
        CHECK_OK(h3_tensor_rows_to_f32(&w, 0, L->n, got));
        char en[96], on[96];
        snprintf(en, sizeof en, "%s.expected", L->layer);
        snprintf(on, sizeof on, "%s.orig", L->layer);
        float *exp = load_f32(&s, en, L->n * L->k), *orig = load_f32(&s, on, L->n * L->k);
        if (exp && orig) {
            double worst = 0, num = 0, den = 0;
            int64_t differ = 0;
            for (int64_t r = 0; r < L->n; r++) {
                double rmax = 0;
                for (int64_t c = 0; c < L->k; c++) rmax = fmax(rmax, fabs(exp[r * L->k + c]));
                for (int64_t c = 0; c < L->k; c++) {
                    int64_t x = r * L->k + c;
                    if (memcmp(&got[x], &exp[x], 4)) differ++;
                    if (rmax > 0) worst = fmax(worst, fabs((double)got[x] - exp[x]) / rmax);
                    double d = (double)exp[x] - orig[x];
                    num += d * d;
                    den += (double)orig[x] * orig[x];
                }
            }
            double rt = sqrt(num / den);
            if (L->exact_tol == 0)
                CHECK(differ == 0, "%s: %lld values differ from the reference's bits", L->layer,
                      (long long)differ);
            else
                CHECK(worst <= L->exact_tol, "%s: max |Δ| / max|row| = %.2e > %.0e", L->layer, worst,
                      L->exact_tol);
            CHECK(rt < L->rt_tol, "%s: round-trip error %.4f >= %.3f", L->layer, rt, L->rt_tol);
            printf("  %-9s %-34s decode %s (max |Δ|/max|row| %.1e), round trip vs f32 %.4f\n", L->layer,
                   L->label, differ ? "within f32 rounding" : "bit-exact", worst, rt);
        }
        /* Row views: the nvfp4 swizzle and the row scales follow a view's first row. */
        h3_tensor v;
        int64_t r0 = L->n / 3, nr = L->n - r0;
        CHECK_OK(h3_tensor_narrow(&w, 0, r0, nr, &v));
        float *part = malloc((size_t)(nr * L->k) * sizeof(float));
        CHECK_OK(h3_tensor_rows_to_f32(&v, 0, nr, part));
        CHECK(memcmp(part, got + r0 * L->k, (size_t)(nr * L->k) * sizeof(float)) == 0,
              "%s: rows %lld.. of a view", L->layer, (long long)r0);
        free(part);
        free(got);
        free(exp);
        free(orig);
        h3_tensor_free(&w);
    }
    h3_st_close(&s);
}

/* h3run's quantizers on the reference's f32 weights give the reference's bytes. */
static void test_quantizers(void) {
    char p[512];
    h3_st_set s;
    CHECK_OK(h3_st_open(fix("formats.safetensors", p, sizeof p), &s));
    const struct {
        const char *layer;
        int group, per_row;
    } i8[] = {{"int8r256", 256, 1}, {"int8r64", 64, 1}, {"int8", 0, 1}, {"int8s", 0, 0}, {"embed", 0, 1}};
    for (size_t i = 0; i < sizeof i8 / sizeof i8[0]; i++) {
        char on[96], wn[96], sn[96];
        snprintf(on, sizeof on, "%s.orig", i8[i].layer);
        snprintf(wn, sizeof wn, "%s.weight", i8[i].layer);
        snprintf(sn, sizeof sn, "%s.weight_scale", i8[i].layer);
        const h3_st_entry *e = h3_st_find(&s, wn);
        if (!e) continue;
        int64_t N = e->shape[0], K = e->shape[1];
        float *w = load_f32(&s, on, N * K);
        const void *qref, *sref;
        CHECK_OK(h3_st_bytes(&s, e, &qref));
        CHECK_OK(h3_st_bytes(&s, h3_st_find(&s, sn), &sref));
        int8_t *q = malloc((size_t)(N * K));
        float *sc = malloc((size_t)N * sizeof(float));
        if (i8[i].per_row) {
            CHECK_OK(h3_quantize_int8_rows(w, N, K, i8[i].group, q, sc));
        } else { /* one scale: quantize the tensor as one row */
            CHECK_OK(h3_quantize_int8_rows(w, 1, N * K, 0, q, sc));
        }
        int64_t ns = i8[i].per_row ? N : 1, sdiff = 0, qdiff = 0, qbig = 0;
        for (int64_t r = 0; r < ns; r++) {
            float sr;
            memcpy(&sr, (const uint8_t *)sref + 4 * r, 4);
            if (i8[i].group ? fabsf(sc[r] - sr) > 1e-6f * sr : sc[r] != sr) sdiff++;
        }
        for (int64_t x = 0; x < N * K; x++) {
            int d = q[x] - ((const int8_t *)qref)[x];
            qdiff += d != 0;
            qbig += d > 1 || d < -1;
        }
        if (i8[i].group) {
            CHECK(sdiff == 0 && qbig == 0 && qdiff * 200 <= N * K,
                  "%s: %lld scales, %lld codes differ (%lld by more than one)", i8[i].layer, (long long)sdiff,
                  (long long)qdiff, (long long)qbig);
        } else {
            CHECK(sdiff == 0 && qdiff == 0, "%s: %lld scales and %lld codes differ from the reference",
                  i8[i].layer, (long long)sdiff, (long long)qdiff);
        }
        printf("  %-9s int8 quantizer: %lld of %lld codes differ from the reference\n", i8[i].layer,
               (long long)qdiff, (long long)(N * K));
        free(w);
        free(q);
        free(sc);
    }
    /* fp8 */
    {
        const h3_st_entry *e = h3_st_find(&s, "fp8.weight");
        int64_t n = h3_st_entry_numel(e);
        float *w = load_f32(&s, "fp8.orig", n);
        const void *qref, *sref;
        CHECK_OK(h3_st_bytes(&s, e, &qref));
        CHECK_OK(h3_st_bytes(&s, h3_st_find(&s, "fp8.weight_scale"), &sref));
        float sc = h3_quantize_fp8_scale(w, (size_t)n), sr;
        memcpy(&sr, sref, 4);
        uint8_t *q = malloc((size_t)n);
        h3_quantize_fp8(w, (size_t)n, sc, q);
        CHECK(sc == sr && memcmp(q, qref, (size_t)n) == 0, "fp8: scale %g vs %g, bytes equal %d", sc, sr,
              memcmp(q, qref, (size_t)n) == 0);
        free(q);
        free(w);
    }
    /* nvfp4 (for the AWQ layer the reference quantized W / pre_quant_scale) */
    const char *nv[] = {"nvfp4", "nvfp4p"};
    for (int i = 0; i < 2; i++) {
        char on[96], wn[96], sn[96], s2n[96], pn[96];
        snprintf(on, sizeof on, "%s.orig", nv[i]);
        snprintf(wn, sizeof wn, "%s.weight", nv[i]);
        snprintf(sn, sizeof sn, "%s.weight_scale", nv[i]);
        snprintf(s2n, sizeof s2n, "%s.weight_scale_2", nv[i]);
        snprintf(pn, sizeof pn, "%s.pre_quant_scale", nv[i]);
        const h3_st_entry *e = h3_st_find(&s, wn);
        int64_t N = e->shape[0], K = 2 * e->shape[1];
        float *w = load_f32(&s, on, N * K);
        const h3_st_entry *pe = h3_st_find(&s, pn);
        if (pe) {
            const void *pp;
            CHECK_OK(h3_st_bytes(&s, pe, &pp));
            for (int64_t r = 0; r < N; r++)
                for (int64_t c = 0; c < K; c++) w[r * K + c] /= h3_bf16_to_f32(((const uint16_t *)pp)[c]);
        }
        const void *qref, *sref, *s2ref;
        CHECK_OK(h3_st_bytes(&s, e, &qref));
        CHECK_OK(h3_st_bytes(&s, h3_st_find(&s, sn), &sref));
        CHECK_OK(h3_st_bytes(&s, h3_st_find(&s, s2n), &s2ref));
        float s2 = h3_quantize_nvfp4_scale2(w, (size_t)(N * K)), s2r;
        memcpy(&s2r, s2ref, 4);
        int64_t ns = h3_nvfp4_scale_count(N, K);
        uint8_t *q = malloc((size_t)(N * K / 2)), *sc = malloc((size_t)ns);
        CHECK_OK(h3_quantize_nvfp4(w, N, K, s2, q, sc));
        CHECK(s2 == s2r, "%s: scale_2 %g vs %g", nv[i], s2, s2r);
        CHECK(memcmp(sc, sref, (size_t)ns) == 0, "%s: block scales equal the reference's", nv[i]);
        CHECK(memcmp(q, qref, (size_t)(N * K / 2)) == 0, "%s: packed codes equal the reference's", nv[i]);
        free(q);
        free(sc);
        free(w);
    }
    h3_st_close(&s);
}

static void test_markers(void) {
    const struct {
        const char *json;
        int len;
        h3_qformat fmt;
        int convrot, group, fpmm;
    } m[] = {
        {"{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 256}", 72, H3_QF_INT8,
         1, 256, 0},
        {"{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 64}", 71, H3_QF_INT8, 1,
         64, 0},
        {"{\"format\": \"float8_e4m3fn\"}", 27, H3_QF_FP8, 0, 0, 0},
        {"{\"format\": \"nvfp4\", \"full_precision_matrix_mult\": true}", 55, H3_QF_NVFP4, 0, 0, 1},
        {"{\"format\": \"int8_tensorwise\"}", 29, H3_QF_INT8, 0, 0, 0},
        {"{\"format\": \"nvfp4\"}", 19, H3_QF_NVFP4, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        h3_qmarker q;
        CHECK((int)strlen(m[i].json) == m[i].len, "marker %zu is %d bytes", i, m[i].len);
        CHECK_OK(h3_qmarker_parse(m[i].json, strlen(m[i].json), "test", &q));
        CHECK(q.fmt == m[i].fmt && q.convrot == m[i].convrot && q.group == m[i].group &&
                  q.full_precision_mm == m[i].fpmm,
              "marker %zu parsed", i);
        char buf[128];
        int n = h3_qmarker_json(&q, buf, sizeof buf);
        CHECK(n == m[i].len && !strcmp(buf, m[i].json), "marker %zu written back byte for byte: %s", i, buf);
    }
    h3_qmarker q;
    CHECK_OK(h3_qmarker_parse("{\"format\":\"int8_tensorwise\",\"convrot\":true}", 43, "t", &q));
    CHECK(q.group == 256, "convrot_groupsize defaults to 256");
    CHECK_ERR(h3_qmarker_parse("{\"format\": \"mxfp8\"}", 19, "layer x", &q), H3_ERR_UNSUPPORTED, "'mxfp8'");
    CHECK_ERR(h3_qmarker_parse("{\"format\": \"convrot_w4a4\"}", 26, "layer x", &q), H3_ERR_UNSUPPORTED,
              "convrot_w4a4");
    CHECK_ERR(h3_qmarker_parse("{\"format\": 3}", 13, "layer x", &q), H3_ERR_FORMAT, "\"format\"");
    CHECK_ERR(h3_qmarker_parse("[1]", 3, "layer x", &q), H3_ERR_FORMAT, "not a JSON object");
    CHECK_ERR(
        h3_qmarker_parse("{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 128}",
                         72, "layer x", &q),
        H3_ERR_FORMAT, "power of 4");
    CHECK_ERR(h3_qmarker_parse("{\"format\": \"int8", 16, "layer x", &q), H3_ERR_FORMAT, "layer x");
    char small[8];
    CHECK(h3_qmarker_json(&q, small, sizeof small) == -1, "a short buffer is refused");
}

/* ---- bad files
 * ---------------------------------------------------------------------------------------------- */

static void write_layer(const char *path, h3_dtype wdt, int nd, const int64_t *wshape, const char *marker,
                        h3_dtype sdt, int snd, const int64_t *sshape, const void *extra_name, h3_dtype edt,
                        int64_t en) {
    h3_st_writer *w;
    static uint8_t zeros[1 << 16];
    static float ones[4096];
    for (int i = 0; i < 4096; i++) ones[i] = 1.0f;
    CHECK_OK(h3_st_writer_new(&w));
    CHECK_OK(h3_st_writer_add(w, "l.weight", wdt, nd, wshape, zeros));
    if (marker) {
        int64_t ml = (int64_t)strlen(marker);
        CHECK_OK(h3_st_writer_add(w, "l.comfy_quant", H3_U8, 1, &ml, marker));
    }
    if (snd >= 0)
        CHECK_OK(
            h3_st_writer_add(w, "l.weight_scale", sdt, snd, sshape, sdt == H3_F32 ? (void *)ones : zeros));
    if (extra_name)
        CHECK_OK(h3_st_writer_add(w, extra_name, edt, 1, &en, edt == H3_F32 ? (void *)ones : zeros));
    CHECK_OK(h3_st_writer_write(w, path, 0));
    h3_st_writer_free(w);
}

static void expect_bad(const char *path, int code, const char *needle) {
    h3_st_set s;
    CHECK_OK(h3_st_open(path, &s));
    h3_tensor t;
    CHECK_ERR(h3_qweight_get_name(&s, NULL, "l.weight", &t), code, needle);
    CHECK(t.data == NULL, "no tensor on failure");
    h3_st_close(&s);
}

static void test_bad_layers(void) {
    char path[512];
    t_tmp_path("badq.safetensors", path, sizeof path);
    const int64_t w2[2] = {4, 64}, s41[2] = {4, 1}, s31[2] = {3, 1}, nv[2] = {4, 32}, nvs[2] = {128, 4};
    const char *i8r = "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 256}";
    write_layer(path, H3_BF16, 2, w2, i8r, H3_F32, 2, s41, NULL, 0, 0);
    expect_bad(path, H3_ERR_FORMAT, "marked int8_tensorwise but is bf16");
    write_layer(path, H3_I8, 2, w2, i8r, H3_F32, -1, NULL, NULL, 0, 0);
    expect_bad(path, H3_ERR_FORMAT, "has no weight_scale");
    write_layer(path, H3_I8, 2, w2, i8r, H3_F32, 2, s31, NULL, 0, 0);
    expect_bad(path, H3_ERR_FORMAT, "one value per row");
    write_layer(path, H3_I8, 2, w2, i8r, H3_F32, 2, s41, NULL, 0, 0);
    expect_bad(path, H3_ERR_FORMAT, "not a multiple of its ConvRot group 256");
    write_layer(path, H3_I8, 2, w2, NULL, H3_F32, -1, NULL, NULL, 0, 0);
    expect_bad(path, H3_ERR_FORMAT, "i8 without a comfy_quant marker");
    write_layer(path, H3_I8, 2, w2, "{\"format\": \"svdquant_w4a4\"}", H3_F32, 2, s41, NULL, 0, 0);
    expect_bad(path, H3_ERR_UNSUPPORTED, "svdquant_w4a4");
    write_layer(path, H3_F8_E4M3, 2, w2, "{\"format\": \"float8_e4m3fn\"}", H3_F32, -1, NULL, NULL, 0, 0);
    expect_bad(path, H3_ERR_FORMAT, "fp8 tensor 'l.weight' has no weight_scale");
    write_layer(path, H3_F8_E4M3, 2, w2, "{\"format\": \"float8_e4m3fn\"}", H3_F32, 2, s41, NULL, 0, 0);
    expect_bad(path, H3_ERR_FORMAT, "must be one float value");
    const char *nvm = "{\"format\": \"nvfp4\", \"full_precision_matrix_mult\": true}";
    write_layer(path, H3_U8, 2, nv, nvm, H3_F8_E4M3, 2, nvs, NULL, 0, 0);
    expect_bad(path, H3_ERR_FORMAT, "needs weight_scale and weight_scale_2");
    write_layer(path, H3_U8, 2, nv, nvm, H3_F8_E4M3, 2, s41, "l.weight_scale_2", H3_F32, 1);
    expect_bad(path, H3_ERR_FORMAT, "padded to 128 x 4");
    write_layer(path, H3_U8, 2, nv, nvm, H3_F8_E4M3, 2, nvs, "l.pre_quant_scale", H3_F32, 64);
    expect_bad(path, H3_ERR_FORMAT, "needs weight_scale and weight_scale_2");
    const int64_t nv_odd[2] = {4, 12};
    write_layer(path, H3_U8, 2, nv_odd, nvm, H3_F8_E4M3, 2, nvs, "l.weight_scale_2", H3_F32, 1);
    expect_bad(path, H3_ERR_FORMAT, "not a multiple of 16");
    write_layer(path, H3_BF16, 2, w2, "{\"format\": \"nvfp4\"}", H3_F32, -1, NULL, NULL, 0, 0);
    expect_bad(path, H3_ERR_FORMAT, "marked nvfp4 but is bf16");
    write_layer(path, H3_I8, 2, w2, "not json", H3_F32, 2, s41, NULL, 0, 0);
    expect_bad(path, H3_ERR_FORMAT, "comfy_quant marker of 'l.weight'");
    /* a NaN scalar scale */
    {
        h3_st_writer *w;
        static uint8_t zeros[256];
        float nanv = NAN;
        CHECK_OK(h3_st_writer_new(&w));
        CHECK_OK(h3_st_writer_add(w, "l.weight", H3_F8_E4M3, 2, w2, zeros));
        CHECK_OK(h3_st_writer_add(w, "l.weight_scale", H3_F32, 0, NULL, &nanv));
        CHECK_OK(h3_st_writer_write(w, path, 0));
        h3_st_writer_free(w);
        expect_bad(path, H3_ERR_FORMAT, "not finite");
    }
    /* legacy fp8 without a marker: one scale under scale_weight */
    {
        h3_st_writer *w;
        static uint8_t q[256];
        float sc = 0.5f;
        memset(q, 0x38, sizeof q); /* e4m3 1.0 */
        CHECK_OK(h3_st_writer_new(&w));
        CHECK_OK(h3_st_writer_add(w, "l.weight", H3_F8_E4M3, 2, w2, q));
        CHECK_OK(h3_st_writer_add(w, "l.scale_weight", H3_F32, 0, NULL, &sc));
        CHECK_OK(h3_st_writer_write(w, path, 0));
        h3_st_writer_free(w);
        h3_st_set s;
        h3_tensor t;
        float row[64];
        CHECK_OK(h3_st_open(path, &s));
        CHECK_OK(h3_qweight_get_name(&s, NULL, "l.weight", &t));
        CHECK_OK(h3_tensor_rows_to_f32(&t, 2, 1, row));
        CHECK(row[0] == 0.5f && row[63] == 0.5f, "legacy fp8 value 1.0 × scale_weight 0.5, got %g", row[0]);
        h3_tensor_free(&t);
        h3_st_close(&s);
    }
    unlink(path);
}

static void test_alloc_failures(void) {
    char p[512];
    h3_mem_stats base;
    h3_mem_get_stats(&base);
    int failures = 0;
    const char *names[] = {"int8r256.weight", "nvfp4.weight", "fp8.weight", "embed.weight"};
    for (int n = 1; n < 10000; n++) {
        h3_st_set s;
        h3_tensor t[4] = {{0}};
        h3_mem_fail_at(n, 0);
        h3_clear_error();
        h3_status st = h3_st_open(fix("formats.safetensors", p, sizeof p), &s);
        for (int i = 0; i < 4 && st == H3_OK; i++) st = h3_qweight_get_name(&s, NULL, names[i], &t[i]);
        int64_t ticks = h3_mem_fail_at(0, 0);
        for (int i = 0; i < 4; i++) h3_tensor_free(&t[i]);
        if (s.files || st == H3_OK) h3_st_close(&s);
        if (st == H3_OK) {
            CHECK(ticks < n, "succeeded although allocation %d should have failed", n);
            break;
        }
        failures++;
        CHECK(st == H3_ERR_NOMEM, "failing allocation %d: got %d: %s", n, st, h3_last_error());
        h3_mem_stats now;
        h3_mem_get_stats(&now);
        CHECK(now.total_current == base.total_current, "failing allocation %d leaked %lld bytes", n,
              (long long)(now.total_current - base.total_current));
    }
    printf("  %d allocation points fail cleanly\n", failures);
    CHECK(failures > 5, "only %d allocation points were exercised", failures);
}

/* ---- the checkpoint source's contract
 * ------------------------------------------------------------------------ */

static const char *dit_fix(const char *rel, char *buf, size_t n) {
    char r[256];
    snprintf(r, sizeof r, "tests/fixtures/dit/%s", rel);
    return t_src_path(r, buf, n);
}

/* Regressions of the error table's loader (quantize --table, and quantize IN OUT after writing): it checked
 * only qkv's rows and K and fc1's rows, and trusted the rest. A q_norm with no elements divided by zero
 * (SIGFPE); a short norm2 or k_norm was read past its end; a short out_proj or fc2 was read past its end and
 * after it was freed, and the release build printed a table of garbage. Now every such file is refused, by
 * the table and by the writer, in the binder's message form naming the tensor, and the writer leaves no
 * output. */
static void test_source_shapes(void) {
    static const struct {
        const char *name;
        t_mutation m;
        const char *named; /* the tensor the message names, when not the mutated one */
    } cases[] = {
        {"blocks.0.attn.q_norm.weight", T_MUT_EMPTY, NULL}, /* SIGFPE */
        {"blocks.0.attn.q_norm.weight", T_MUT_TRUNCATE,
         "blocks.0.attn.qkv_proj.weight"},               /* 127 does not divide */
        {"blocks.0.norm2.weight", T_MUT_TRUNCATE, NULL}, /* heap overflow in the block's rms_norm */
        {"blocks.0.norm2.weight", T_MUT_EMPTY, NULL},
        {"blocks.0.attn.k_norm.weight", T_MUT_TRUNCATE, NULL}, /* heap overflow in the per-head norm */
        {"blocks.0.attn.k_norm.weight", T_MUT_EMPTY, NULL},
        {"blocks.0.attn.out_proj.weight", T_MUT_TRUNCATE, NULL}, /* heap overflow and use after free */
        {"blocks.0.attn.out_proj.weight", T_MUT_EMPTY, NULL},
        {"blocks.0.mlp.fc2.weight", T_MUT_TRUNCATE, NULL},
        {"blocks.0.mlp.fc2.weight", T_MUT_EMPTY, NULL},
        {"blocks.0.norm1.weight", T_MUT_RESHAPE, NULL},
        {"blocks.0.mlp.fc1.weight", T_MUT_RETYPE, NULL},
    };
    char src[512], in[512], out[512];
    dit_fix("comfy_pruned.safetensors", src, sizeof src);
    t_tmp_path("qsrc.safetensors", in, sizeof in);
    t_tmp_path("qout.safetensors", out, sizeof out);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(t_st_mutate(src, in, cases[i].name, cases[i].m), "mutating %s", cases[i].name);
        h3_qbench_source q;
        char needle[160];
        snprintf(needle, sizeof needle, "tensor '%s'", cases[i].named ? cases[i].named : cases[i].name);
        h3_clear_error();
        h3_status st = h3_qbench_source_load(in, &q);
        CHECK(st == H3_ERR_FORMAT || st == H3_ERR_UNSUPPORTED, "%s %s: the table's source loaded (%d)",
              cases[i].name, t_mutation_name(cases[i].m), st);
        CHECK(strstr(h3_last_error(), needle) && t_wbind_form(h3_last_error()), "%s %s: message: %s",
              cases[i].name, t_mutation_name(cases[i].m), h3_last_error());
        if (st == H3_OK) h3_qbench_source_free(&q);
        h3_quantize_opts o = {H3_QT_INT8, 0, NULL};
        h3_quantize_result res;
        h3_clear_error();
        st = h3_quantize_checkpoint(in, out, &o, &res);
        CHECK(st != H3_OK && strstr(h3_last_error(), needle) && t_wbind_form(h3_last_error()),
              "%s %s: quantize: %s", cases[i].name, t_mutation_name(cases[i].m), h3_last_error());
        CHECK(access(out, F_OK) != 0, "%s %s: a refused source left %s", cases[i].name,
              t_mutation_name(cases[i].m), out);
        unlink(out);
    }
    unlink(in);
}

/* What quantize copies through without a width of its own (the time embedder, RoPE's frequencies, the curve
 * table, the vision tower) takes any shape, only a float dtype; the embedding's rows are the vocabulary,
 * whatever their count; the text encoder's final norm and head are dropped from the output, never read. */
static int quant_accepts(const char *name, t_mutation m, void *user) {
    (void)user;
    if (strstr(name, "time_embedder.") || !strcmp(name, "rope.inv_freq") || !strcmp(name, "adaln_t_table") ||
        h3_str_starts_with(name, "visual.") || h3_str_starts_with(name, "model.visual."))
        return m != T_MUT_RETYPE; /* a copy needs a float */
    if (!strcmp(name, "model.embed_tokens.weight"))
        return m == T_MUT_TRUNCATE; /* the vocabulary is its rows */
    return h3_str_starts_with(name, "lm_head.") || strstr(name, "language_model.norm.") != NULL;
}

typedef struct {
    char out[512];
} qsweep;

/* The error table and the writer over one source; the writer's output must not exist after a refusal. */
static h3_status quant_load(const char *path, void *user) {
    qsweep *q = user;
    h3_qbench_source src;
    h3_status st = h3_qbench_source_load(path, &src);
    if (st == H3_OK) h3_qbench_source_free(&src);
    h3_quantize_opts o = {H3_QT_INT8, 0, NULL};
    h3_quantize_result res;
    const char *msg = NULL;
    char first[2048];
    if (st != H3_OK) {
        snprintf(first, sizeof first, "%s", h3_last_error());
        msg = first;
    }
    h3_status st2 = h3_quantize_checkpoint(path, q->out, &o, &res);
    CHECK((st == H3_OK) == (st2 == H3_OK) || st == H3_OK, "%s: the table refused what the writer took: %s",
          path, msg ? msg : "");
    if (st2 != H3_OK) CHECK(access(q->out, F_OK) != 0, "a refused source left %s", q->out);
    unlink(q->out);
    if (st != H3_OK && st2 == H3_OK) h3_error_set(st, __FILE__, __LINE__, "%s", first);
    return st2 != H3_OK ? st2 : st;
}

/* Every tensor of the DiT in each layout and of the text encoder, emptied, truncated, reshaped and retyped.
 */
static void test_source_sweep(void) {
    qsweep q;
    char p[512];
    t_tmp_path("qsweep_out.safetensors", q.out, sizeof q.out);
    static const char *const dits[] = {"comfy_pruned.safetensors", "official", "diffusers"};
    for (int i = 0; i < 3; i++)
        t_sweep(dits[i], dit_fix(dits[i], p, sizeof p), quant_load, quant_accepts, &q, 0);
    t_sweep("text encoder comfy.safetensors",
            t_src_path("tests/fixtures/text_encoder/comfy.safetensors", p, sizeof p), quant_load,
            quant_accepts, &q, 0);
}

/* Weights that are not finite (a damaged file, or the fixtures' never-read NaN layers): every format quantizes them
 * without undefined behaviour (the int8 cast of NaN was, finding N1) and keeps them not finite: an int8 row and an
 * nvfp4 block holding NaN or an infinity decode as NaN (their scale holds it), the other rows and blocks as
 * before; fp8 keeps each such value as its NaN code, and the one tensor scale comes from the finite values. */
static void test_not_finite(void) {
    enum { N = 4, K = 64 };
    float w[N * K];
    t_fill_uniform(w, N * K, -1.0, 1.0);
    w[1 * K + 5] = NAN;
    w[2 * K + 40] = INFINITY;
    static const struct {
        h3_qtarget t;
        const char *name;
    } fs[] = {{H3_QT_INT8, "int8"}, {H3_QT_INT8_CONVROT, "int8 convrot"}, {H3_QT_NVFP4, "nvfp4"}, {H3_QT_FP8, "fp8"}};
    for (size_t f = 0; f < sizeof fs / sizeof fs[0]; f++) {
        h3_tensor q;
        CHECK_OK(h3_quantize_tensor(w, N, K, fs[f].t, NULL, &q));
        if (!q.data) continue;
        float d[N * K];
        CHECK_OK(h3_tensor_rows_to_f32(&q, 0, N, d));
        int bad = 0;
        for (int64_t r = 0; r < N; r++)
            for (int64_t c = 0; c < K; c++) {
                const float v = d[r * K + c];
                const int damaged = fs[f].t == H3_QT_NVFP4 ? (r == 1 && c / 16 == 0) || (r == 2 && c / 16 == 2)
                                    : fs[f].t == H3_QT_FP8 ? !isfinite(w[r * K + c])
                                                           : r == 1 || r == 2;
                if (damaged)
                    bad += !isnan(v);
                else
                    bad += !(fabsf(v - w[r * K + c]) <= (fs[f].t == H3_QT_NVFP4 ? 0.5f : 0.08f));
            }
        CHECK(bad == 0, "%s: %d values decode wrongly", fs[f].name, bad);
        h3_tensor_free(&q);
    }
}

int main(int argc, char **argv) {
    const t_case cases[] = {
        {"source_shapes", test_source_shapes},
        {"source_sweep", test_source_sweep},
        {"convrot", test_convrot},
        {"e2m1", test_e2m1},
        {"swizzle", test_swizzle},
        {"formats_decode", test_formats_decode},
        {"quantizers", test_quantizers},
        {"markers", test_markers},
        {"bad_layers", test_bad_layers},
        {"alloc_failures", test_alloc_failures},
        {"not_finite", test_not_finite},
        {NULL, NULL},
    };
    return t_main("test_quant", cases, argc, argv);
}

/* Every op on the CUDA backend against the CPU backend, on fresh random inputs, in f32 and bf16.
 *
 * The CPU runs on exactly the values the GPU sees (inputs rounded to the device dtype first), so the error left is
 * the GPU's arithmetic and output rounding. Tolerances (relative L2): f32 1e-5 (the f32 GEMM is exact f32, no
 * TF32); bf16 outputs 8e-3 (one bf16 rounding of each output is about 2^-9 relative, ~2e-3 in L2, plus bf16
 * intermediates where the kernel keeps them: attention's probabilities). Skips (exit 0) without a GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "cuda/cuda.h"
#include "quant/quant.h"
#include "quant/qwrite.h"
#include "tensor/ops.h"
#include "testutil.h"

static h3_exec g_ex;

static int64_t ri(int64_t lo, int64_t hi) {
    return lo + (int64_t)(t_rand_u64() % (uint64_t)(hi - lo + 1));
}

/* A pair: the same values on the host (f32, already rounded to dt) and on the device (in dt). */
typedef struct {
    h3_tensor h, d;
} pair;

static pair mk(h3_dtype dt, int nd, const int64_t *shape, double scale) {
    pair p;
    CHECK_OK(h3_tensor_alloc(&p.h, H3_PLACE_HOST, H3_F32, nd, shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc(&p.d, H3_PLACE_DEVICE, dt, nd, shape, H3_MEM_ACTIVATIONS));
    size_t n = (size_t)h3_tensor_numel(&p.h);
    t_fill_randn(p.h.data, n, scale);
    h3_tensor tmp;
    CHECK_OK(h3_tensor_alloc(&tmp, H3_PLACE_HOST, dt, nd, shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_op_convert(&g_ex, &tmp, &p.h)); /* round to dt */
    CHECK_OK(h3_op_convert(&g_ex, &p.h, &tmp)); /* and back: the host now holds exactly the device values */
    CHECK_OK(h3_copy(&g_ex, &p.d, &tmp));
    CHECK_OK(h3_exec_sync(&g_ex));
    h3_tensor_free(&tmp);
    return p;
}

static pair mk2(h3_dtype dt, int64_t a, int64_t b, double scale) {
    int64_t s[2] = {a, b};
    return mk(dt, 2, s, scale);
}

static void pfree(pair *p) {
    h3_tensor_free(&p->h);
    h3_tensor_free(&p->d);
}

/* Copies the device result back, converts to f32 and compares with the host result. */
static void compare(const char *what, const pair *p, double tol) {
    h3_tensor back, f;
    CHECK_OK(h3_tensor_alloc(&back, H3_PLACE_HOST, p->d.dtype, p->d.ndim, p->d.shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc(&f, H3_PLACE_HOST, H3_F32, p->d.ndim, p->d.shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_copy(&g_ex, &back, &p->d));
    CHECK_OK(h3_exec_sync(&g_ex));
    CHECK_OK(h3_op_convert(&g_ex, &f, &back));
    size_t n = (size_t)h3_tensor_numel(&f);
    double *ref = malloc(n * sizeof(double) + 8);
    for (size_t i = 0; i < n; i++) ref[i] = ((float *)p->h.data)[i];
    char name[160];
    snprintf(name, sizeof name, "%s (%s)", what, h3_dtype_name(p->d.dtype));
    EXPECT_CLOSE(name, f.data, ref, n, tol);
    free(ref);
    h3_tensor_free(&back);
    h3_tensor_free(&f);
}

static double tol_of(h3_dtype dt) {
    return dt == H3_F32 ? 1e-5 : 8e-3;
}

static const h3_dtype g_dts[2] = {H3_F32, H3_BF16};

static void test_gemm(void) {
    for (int k = 0; k < 2; k++) {
        h3_dtype dt = g_dts[k];
        for (int rep = 0; rep < 3; rep++) {
            int64_t M = ri(1, 300), N = ri(1, 260), K = 8 * ri(1, 80);
            pair x = mk2(dt, M, K, 1.0), w = mk2(dt, N, K, 0.3), b = mk2(dt, 1, N, 1.0), y = mk2(dt, M, N, 1.0);
            h3_tensor bh, bd;
            int64_t sb[1] = {N};
            CHECK_OK(h3_tensor_reshape(&b.h, 1, sb, &bh));
            CHECK_OK(h3_tensor_reshape(&b.d, 1, sb, &bd));
            unsigned fl = rep == 1 ? H3_GEMM_ACCUMULATE : 0;
            CHECK_OK(h3_op_gemm(&g_ex, &y.h, &x.h, &w.h, rep != 2 ? &bh : NULL, fl));
            CHECK_OK(h3_op_gemm(&g_ex, &y.d, &x.d, &w.d, rep != 2 ? &bd : NULL, fl));
            compare(rep == 1 ? "gemm accumulate" : "gemm", &y, tol_of(dt));
            pfree(&x);
            pfree(&w);
            pfree(&b);
            pfree(&y);
        }
        /* x as a column block of a wider matrix (a view into a fused projection) */
        int64_t M = ri(10, 200), K = 64, N = ri(8, 100);
        pair xw = mk2(dt, M, 3 * K, 1.0), w = mk2(dt, N, K, 0.3), y = mk2(dt, M, N, 1.0);
        h3_tensor xh, xd;
        CHECK_OK(h3_tensor_narrow(&xw.h, 1, K, K, &xh));
        CHECK_OK(h3_tensor_narrow(&xw.d, 1, K, K, &xd));
        CHECK_OK(h3_op_gemm(&g_ex, &y.h, &xh, &w.h, NULL, 0));
        CHECK_OK(h3_op_gemm(&g_ex, &y.d, &xd, &w.d, NULL, 0));
        compare("gemm strided x", &y, tol_of(dt));
        pfree(&xw);
        pfree(&w);
        pfree(&y);
    }
    /* a bias in another dtype than the output (f32 bias, bf16 output: a GGUF file's F16 weight with an F32
     * bias) */
    {
        int64_t M = ri(1, 100), N = ri(1, 90), K = 8 * ri(1, 20);
        pair x = mk2(H3_BF16, M, K, 1.0), w = mk2(H3_BF16, N, K, 0.3), b = mk2(H3_F32, 1, N, 1.0),
             y = mk2(H3_BF16, M, N, 1.0);
        h3_tensor bh, bd;
        int64_t sb[1] = {N};
        CHECK_OK(h3_tensor_reshape(&b.h, 1, sb, &bh));
        CHECK_OK(h3_tensor_reshape(&b.d, 1, sb, &bd));
        CHECK_OK(h3_op_gemm(&g_ex, &y.h, &x.h, &w.h, &bh, 0));
        CHECK_OK(h3_op_gemm(&g_ex, &y.d, &x.d, &w.d, &bd, 0));
        compare("gemm with an f32 bias", &y, tol_of(H3_BF16));
        pfree(&x);
        pfree(&w);
        pfree(&b);
        pfree(&y);
    }
}

static void test_rows_ops(void) {
    for (int k = 0; k < 2; k++) {
        h3_dtype dt = g_dts[k];
        double tol = tol_of(dt);
        int64_t R = ri(1, 90), C = ri(1, 700);
        pair x = mk2(dt, R, C, 2.0), y = mk2(dt, R, C, 1.0), w = mk2(dt, 1, C, 1.0), b = mk2(dt, 1, C, 1.0);
        h3_tensor wh, wd, bh, bd;
        int64_t sc[1] = {C};
        CHECK_OK(h3_tensor_reshape(&w.h, 1, sc, &wh));
        CHECK_OK(h3_tensor_reshape(&w.d, 1, sc, &wd));
        CHECK_OK(h3_tensor_reshape(&b.h, 1, sc, &bh));
        CHECK_OK(h3_tensor_reshape(&b.d, 1, sc, &bd));
        CHECK_OK(h3_op_rms_norm(&g_ex, &y.h, &x.h, &wh, 1e-5f));
        CHECK_OK(h3_op_rms_norm(&g_ex, &y.d, &x.d, &wd, 1e-5f));
        compare("rms_norm", &y, tol);
        CHECK_OK(h3_op_layer_norm(&g_ex, &y.h, &x.h, &wh, &bh, 1e-6f));
        CHECK_OK(h3_op_layer_norm(&g_ex, &y.d, &x.d, &wd, &bd, 1e-6f));
        compare("layer_norm", &y, tol);
        for (int u = 0; u < H3_UNARY_COUNT; u++) {
            CHECK_OK(h3_op_unary(&g_ex, &y.h, &x.h, (h3_unary)u));
            CHECK_OK(h3_op_unary(&g_ex, &y.d, &x.d, (h3_unary)u));
            compare("unary", &y, tol);
        }
        CHECK_OK(h3_op_softmax(&g_ex, &y.h, &x.h));
        CHECK_OK(h3_op_softmax(&g_ex, &y.d, &x.d));
        compare("softmax", &y, tol);
        CHECK_OK(h3_op_clamp(&g_ex, &y.h, &x.h, -0.7f, 0.9f));
        CHECK_OK(h3_op_clamp(&g_ex, &y.d, &x.d, -0.7f, 0.9f));
        compare("clamp", &y, tol);
        CHECK_OK(h3_op_scale(&g_ex, &y.h, &x.h, 1.7f, -0.25f));
        CHECK_OK(h3_op_scale(&g_ex, &y.d, &x.d, 1.7f, -0.25f));
        compare("scale", &y, tol);
        for (int bm = 0; bm < 3; bm++) {
            const pair *bb = bm == 0 ? &y : &b;
            h3_tensor b1h, b1d;
            if (bm == 2) {
                CHECK_OK(h3_tensor_narrow(&bh, 0, 0, 1, &b1h));
                CHECK_OK(h3_tensor_narrow(&bd, 0, 0, 1, &b1d));
            }
            const h3_tensor *Bh = bm == 0 ? &bb->h : bm == 1 ? &bh : &b1h, *Bd = bm == 0 ? &bb->d : bm == 1 ? &bd : &b1d;
            for (int kind = 0; kind < H3_BINARY_COUNT; kind++) {
                pair z = mk2(dt, R, C, 1.0);
                CHECK_OK(h3_op_binary(&g_ex, &z.h, &x.h, Bh, (h3_binary)kind));
                CHECK_OK(h3_op_binary(&g_ex, &z.d, &x.d, Bd, (h3_binary)kind));
                compare("binary", &z, tol);
                pfree(&z);
            }
        }
        /* snake over [C=R, T=C] */
        pair al = mk2(dt, 1, R, 0.5), be = mk2(dt, 1, R, 0.5);
        h3_tensor alh, ald, beh, bed;
        int64_t sr[1] = {R};
        CHECK_OK(h3_tensor_reshape(&al.h, 1, sr, &alh));
        CHECK_OK(h3_tensor_reshape(&al.d, 1, sr, &ald));
        CHECK_OK(h3_tensor_reshape(&be.h, 1, sr, &beh));
        CHECK_OK(h3_tensor_reshape(&be.d, 1, sr, &bed));
        CHECK_OK(h3_op_snake(&g_ex, &y.h, &x.h, &alh, &beh, H3_SNAKE_LOGSCALE));
        CHECK_OK(h3_op_snake(&g_ex, &y.d, &x.d, &ald, &bed, H3_SNAKE_LOGSCALE));
        compare("snakebeta", &y, tol);
        /* convert to the other dtype and back */
        h3_dtype other = dt == H3_F32 ? H3_BF16 : H3_F32;
        h3_tensor od;
        CHECK_OK(h3_tensor_alloc(&od, H3_PLACE_DEVICE, other, 2, x.d.shape, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_op_convert(&g_ex, &od, &x.d));
        CHECK_OK(h3_op_convert(&g_ex, &y.d, &od));
        if (dt == H3_F32) { /* f32 -> bf16 -> f32 rounds */
            h3_tensor tmp;
            CHECK_OK(h3_tensor_alloc(&tmp, H3_PLACE_HOST, H3_BF16, 2, x.h.shape, H3_MEM_ACTIVATIONS));
            CHECK_OK(h3_op_convert(&g_ex, &tmp, &x.h));
            CHECK_OK(h3_op_convert(&g_ex, &y.h, &tmp));
            h3_tensor_free(&tmp);
            compare("convert f32->bf16->f32", &y, 0);
        } else {
            CHECK_OK(h3_op_convert(&g_ex, &y.h, &x.h));
            compare("convert bf16->f32->bf16", &y, 0);
        }
        h3_tensor_free(&od);
        CHECK_OK(h3_op_fill(&g_ex, &y.h, -1.5f));
        CHECK_OK(h3_op_fill(&g_ex, &y.d, -1.5f));
        compare("fill", &y, 0);
        pfree(&x);
        pfree(&y);
        pfree(&w);
        pfree(&b);
        pfree(&al);
        pfree(&be);
    }
}

static void test_group_norm(void) {
    for (int k = 0; k < 2; k++) {
        h3_dtype dt = g_dts[k];
        int64_t B = ri(1, 3), G = ri(1, 8), Cg = G * ri(1, 6), S = ri(1, 500);
        int64_t sx[3] = {B, Cg, S}, sw[1] = {Cg};
        pair x = mk(dt, 3, sx, 3.0), y = mk(dt, 3, sx, 1.0), w = mk(dt, 1, sw, 1.0), b = mk(dt, 1, sw, 1.0);
        CHECK_OK(h3_op_group_norm(&g_ex, &y.h, &x.h, (int)G, &w.h, &b.h, 1e-6f));
        CHECK_OK(h3_op_group_norm(&g_ex, &y.d, &x.d, (int)G, &w.d, &b.d, 1e-6f));
        compare("group_norm", &y, tol_of(dt));
        pfree(&x);
        pfree(&y);
        pfree(&w);
        pfree(&b);
    }
    /* the video encoder's per-frame GroupNorm: the frames of [C, T, S] as strided items [T, C, S], f32, in
     * place; S a multiple of 4 (four values at a time) and not */
    for (int k = 0; k < 2; k++) {
        const int64_t G = 4, C = G * ri(1, 4), T = ri(2, 5), S = k ? 4 * ri(1, 300) : 4 * ri(1, 300) + 1;
        const int64_t sb[3] = {C, T, S}, sv[3] = {T, C, S}, sw[1] = {C};
        pair x = mk(H3_F32, 3, sb, 3.0), w = mk(H3_F32, 1, sw, 1.0), b = mk(H3_F32, 1, sw, 1.0);
        h3_tensor vh, vd;
        CHECK_OK(h3_tensor_wrap(&vh, x.h.data, H3_PLACE_HOST, H3_F32, 3, sv));
        CHECK_OK(h3_tensor_wrap(&vd, x.d.data, H3_PLACE_DEVICE, H3_F32, 3, sv));
        vh.stride[0] = vd.stride[0] = S;
        vh.stride[1] = vd.stride[1] = T * S;
        CHECK_OK(h3_op_group_norm(&g_ex, &vh, &vh, (int)G, &w.h, &b.h, 1e-6f));
        CHECK_OK(h3_op_group_norm(&g_ex, &vd, &vd, (int)G, &w.d, &b.d, 1e-6f));
        compare(k ? "group_norm frames, 4 at a time" : "group_norm frames", &x, tol_of(H3_F32));
        pfree(&x);
        pfree(&w);
        pfree(&b);
    }
}

static void test_table_ops(void) {
    for (int k = 0; k < 4; k++) { /* k >= 2: widths of whole groups of 4 (the kernels' 4-wide paths) */
        h3_dtype dt = g_dts[k & 1];
        double tol = tol_of(dt);
        int64_t R = ri(1, 200), C = k >= 2 ? 4 * ri(1, 150) : ri(1, 600), T = ri(2, 9);
        pair x = mk2(dt, R, C, 1.0), y = mk2(dt, R, C, 1.0), h = mk2(dt, R, C, 1.0);
        pair table = mk2(H3_F32, T, 3 * C, 0.5); /* modulation tables stay f32 */
        h3_tensor shh, shd, sch, scd, gh, gd;
        CHECK_OK(h3_tensor_narrow(&table.h, 1, 0, C, &shh));
        CHECK_OK(h3_tensor_narrow(&table.d, 1, 0, C, &shd));
        CHECK_OK(h3_tensor_narrow(&table.h, 1, C, C, &sch));
        CHECK_OK(h3_tensor_narrow(&table.d, 1, C, C, &scd));
        CHECK_OK(h3_tensor_narrow(&table.h, 1, 2 * C, C, &gh));
        CHECK_OK(h3_tensor_narrow(&table.d, 1, 2 * C, C, &gd));
        h3_tensor ih, id;
        int64_t si[1] = {R};
        CHECK_OK(h3_tensor_alloc(&ih, H3_PLACE_HOST, H3_I32, 1, si, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_tensor_alloc(&id, H3_PLACE_DEVICE, H3_I32, 1, si, H3_MEM_ACTIVATIONS));
        for (int64_t r = 0; r < R; r++) ((int32_t *)ih.data)[r] = (int32_t)ri(0, T - 1);
        CHECK_OK(h3_copy(&g_ex, &id, &ih));
        CHECK_OK(h3_op_modulate(&g_ex, &y.h, &x.h, &shh, &sch, &ih));
        CHECK_OK(h3_op_modulate(&g_ex, &y.d, &x.d, &shd, &scd, &id));
        compare("modulate", &y, tol);
        CHECK_OK(h3_op_gated_add(&g_ex, &y.h, &h.h, &gh, &ih));
        CHECK_OK(h3_op_gated_add(&g_ex, &y.d, &h.d, &gd, &id));
        compare("gated_add", &y, tol);
        /* swiglu from a [R, 2C] input, both half orders */
        pair x2 = mk2(dt, R, 2 * C, 2.0);
        for (int gf = 0; gf < 2; gf++) {
            CHECK_OK(h3_op_swiglu(&g_ex, &y.h, &x2.h, gf));
            CHECK_OK(h3_op_swiglu(&g_ex, &y.d, &x2.d, gf));
            compare("swiglu", &y, tol);
        }
        /* gather / scatter with a permutation prefix */
        int64_t n = ri(1, R);
        int64_t *perm = malloc((size_t)R * sizeof *perm);
        for (int64_t i = 0; i < R; i++) perm[i] = i;
        for (int64_t i = R - 1; i > 0; i--) {
            int64_t j = ri(0, i), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        h3_tensor gih, gid;
        int64_t sn[1] = {n};
        CHECK_OK(h3_tensor_alloc(&gih, H3_PLACE_HOST, H3_I64, 1, sn, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_tensor_alloc(&gid, H3_PLACE_DEVICE, H3_I64, 1, sn, H3_MEM_ACTIVATIONS));
        for (int64_t i = 0; i < n; i++) ((int64_t *)gih.data)[i] = perm[i];
        CHECK_OK(h3_copy(&g_ex, &gid, &gih));
        pair g = mk2(dt, n, C, 1.0);
        CHECK_OK(h3_op_gather_rows(&g_ex, &g.h, &x.h, &gih));
        CHECK_OK(h3_op_gather_rows(&g_ex, &g.d, &x.d, &gid));
        compare("gather_rows", &g, 0);
        CHECK_OK(h3_op_scatter_rows(&g_ex, &h.h, &g.h, &gih));
        CHECK_OK(h3_op_scatter_rows(&g_ex, &h.d, &g.d, &gid));
        compare("scatter_rows", &h, 0);
        free(perm);
        h3_tensor_free(&ih);
        h3_tensor_free(&id);
        h3_tensor_free(&gih);
        h3_tensor_free(&gid);
        pfree(&x);
        pfree(&y);
        pfree(&h);
        pfree(&x2);
        pfree(&g);
        pfree(&table);
    }
}

static void test_rope(void) {
    for (int k = 0; k < 2; k++) {
        h3_dtype dt = g_dts[k];
        int64_t S = ri(1, 300), H = ri(1, 8), D = 2 * ri(8, 64), R = 2 * ri(1, D / 2);
        int64_t sx[3] = {S, H, D};
        pair x = mk(dt, 3, sx, 1.0), y = mk(dt, 3, sx, 1.0), c = mk2(H3_F32, S, R, 1.0), s = mk2(H3_F32, S, R, 1.0);
        CHECK_OK(h3_op_rope(&g_ex, &y.h, &x.h, &c.h, &s.h));
        CHECK_OK(h3_op_rope(&g_ex, &y.d, &x.d, &c.d, &s.d));
        compare("rope", &y, tol_of(dt));
        CHECK_OK(h3_op_rope(&g_ex, &x.h, &x.h, &c.h, &s.h));
        CHECK_OK(h3_op_rope(&g_ex, &x.d, &x.d, &c.d, &s.d));
        compare("rope in place", &x, tol_of(dt));
        pfree(&x);
        pfree(&y);
        pfree(&c);
        pfree(&s);
    }
}

static void attn_case(h3_dtype dt, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hk, int64_t D, int causal, int fused) {
    pair q, kk, v, qkv = {0};
    h3_tensor qh, qd, kh, kd, vh, vd;
    if (fused) {
        qkv = mk2(dt, Sq, (Hq + 2 * Hk) * D, 1.0);
        int64_t sq[3] = {Sq, Hq, D}, sk[3] = {Sq, Hk, D};
        h3_tensor *src[2] = {&qkv.h, &qkv.d};
        h3_tensor *dq[2] = {&qh, &qd}, *dk[2] = {&kh, &kd}, *dv[2] = {&vh, &vd};
        for (int i = 0; i < 2; i++) {
            size_t es = h3_dtype_size(src[i]->dtype);
            CHECK_OK(h3_tensor_wrap(dq[i], src[i]->data, src[i]->place, src[i]->dtype, 3, sq));
            CHECK_OK(h3_tensor_wrap(dk[i], (char *)src[i]->data + Hq * D * es, src[i]->place, src[i]->dtype, 3, sk));
            CHECK_OK(h3_tensor_wrap(dv[i], (char *)src[i]->data + (Hq + Hk) * D * es, src[i]->place, src[i]->dtype, 3,
                                    sk));
            dq[i]->stride[0] = dk[i]->stride[0] = dv[i]->stride[0] = (Hq + 2 * Hk) * D;
        }
    } else {
        int64_t sq[3] = {Sq, Hq, D}, sk[3] = {Sk, Hk, D};
        q = mk(dt, 3, sq, 1.0);
        kk = mk(dt, 3, sk, 1.0);
        v = mk(dt, 3, sk, 1.0);
        qh = q.h;
        qd = q.d;
        kh = kk.h;
        kd = kk.d;
        vh = v.h;
        vd = v.d;
    }
    int64_t so[3] = {Sq, Hq, D};
    pair o = mk(dt, 3, so, 1.0);
    float scale = 1.0f / sqrtf((float)D);
    CHECK_OK(h3_op_attention(&g_ex, &o.h, &qh, &kh, &vh, scale, causal ? H3_ATTN_CAUSAL : 0));
    CHECK_OK(h3_op_attention(&g_ex, &o.d, &qd, &kd, &vd, scale, causal ? H3_ATTN_CAUSAL : 0));
    char what[128];
    snprintf(what, sizeof what, "attention Sq%lld Sk%lld Hq%lld Hk%lld D%lld causal%d fused%d", (long long)Sq,
             (long long)Sk, (long long)Hq, (long long)Hk, (long long)D, causal, fused);
    compare(what, &o, dt == H3_F32 ? 2e-5 : 1e-2);
    pfree(&o);
    if (fused) pfree(&qkv);
    else {
        pfree(&q);
        pfree(&kk);
        pfree(&v);
    }
}

static void test_attention(void) {
    for (int k = 0; k < 2; k++) {
        h3_dtype dt = g_dts[k];
        attn_case(dt, ri(1, 70), ri(1, 70), 2, 2, 64, 0, 0);
        attn_case(dt, ri(65, 400), ri(65, 500), 4, 2, 128, 0, 0);
        int64_t S = ri(100, 500);
        attn_case(dt, S, S, 4, 1, 128, 1, 1);
        attn_case(dt, S, S, 2, 2, 64, 1, 0);
        attn_case(dt, ri(20, 100), ri(100, 300), 2, 2, 128, 1, 0);
        attn_case(dt, 1000, 1000, 2, 2, 128, 0, 1);
        /* head 64 (the video VAE decoder's): its tiles' q, k, v strided in the fused buffer; grouped heads with
         * ragged last tiles */
        attn_case(dt, 1797, 1797, 4, 4, 64, 0, 1);
        attn_case(dt, ri(129, 700), ri(129, 900), 4, 2, 64, 0, 0);
    }
    attn_case(H3_BF16, 256, 256, 2, 2, 96, 0, 0); /* a head size the flash kernel lacks: plain kernel */
}

/* p + shift in every value, rounded to dt again on both sides (mk's rule) */
static void pshift(pair *p, h3_dtype dt, double shift) {
    const size_t n = (size_t)h3_tensor_numel(&p->h);
    for (size_t i = 0; i < n; i++) ((float *)p->h.data)[i] += (float)shift;
    h3_tensor tmp;
    CHECK_OK(h3_tensor_alloc(&tmp, H3_PLACE_HOST, dt, p->h.ndim, p->h.shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_op_convert(&g_ex, &tmp, &p->h));
    CHECK_OK(h3_op_convert(&g_ex, &p->h, &tmp));
    CHECK_OK(h3_copy(&g_ex, &p->d, &tmp));
    CHECK_OK(h3_exec_sync(&g_ex));
    h3_tensor_free(&tmp);
}

/* Low-bit attention (H3_ATTN_FP8, H3_ATTN_INT8): the device's kernel against the CPU's same quantization, on
 * the same bf16 values (the output's bf16 rounding, the tensor cores' sum order and the rare probability
 * rounded to the other e4m3 or f16 neighbour apart); its distance from the bf16 kernel printed. Devices
 * without a kernel (fp8 before sm_89, int8 before sm_75) must refuse with H3_ERR_UNSUPPORTED. vshift is added
 * to every v (unfused only): a component all keys share, which a row's output keeps however flat its scores
 * are, so that its sum over a long row grows with the keys. */
static void attn_lowbit_case(unsigned mode, const char *kernel, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hk,
                             int causal, int fused, double amp, double vshift) {
    const int64_t D = 128;
    pair q, kk, v, qkv = {0};
    h3_tensor qh, qd, kh, kd, vh, vd;
    if (fused) { /* column blocks of one projection, as in the DiT */
        qkv = mk2(H3_BF16, Sq, (Hq + 2 * Hk) * D, amp);
        int64_t sq[3] = {Sq, Hq, D}, sk[3] = {Sq, Hk, D};
        h3_tensor *src[2] = {&qkv.h, &qkv.d}, *dq[2] = {&qh, &qd}, *dk[2] = {&kh, &kd}, *dv[2] = {&vh, &vd};
        for (int i = 0; i < 2; i++) {
            size_t es = h3_dtype_size(src[i]->dtype);
            CHECK_OK(h3_tensor_wrap(dq[i], src[i]->data, src[i]->place, src[i]->dtype, 3, sq));
            CHECK_OK(h3_tensor_wrap(dk[i], (char *)src[i]->data + Hq * D * es, src[i]->place, src[i]->dtype,
                                    3, sk));
            CHECK_OK(h3_tensor_wrap(dv[i], (char *)src[i]->data + (Hq + Hk) * D * es, src[i]->place,
                                    src[i]->dtype, 3, sk));
            dq[i]->stride[0] = dk[i]->stride[0] = dv[i]->stride[0] = (Hq + 2 * Hk) * D;
        }
        Sk = Sq;
    } else {
        int64_t sq[3] = {Sq, Hq, D}, sk[3] = {Sk, Hk, D};
        q = mk(H3_BF16, 3, sq, amp);
        kk = mk(H3_BF16, 3, sk, amp);
        v = mk(H3_BF16, 3, sk, 1.0);
        if (vshift != 0) pshift(&v, H3_BF16, vshift);
        qh = q.h, qd = q.d, kh = kk.h, kd = kk.d, vh = v.h, vd = v.d;
    }
    int64_t so[3] = {Sq, Hq, D};
    pair o = mk(H3_BF16, 3, so, 1.0), ob = mk(H3_BF16, 3, so, 1.0);
    const float scale = 1.0f / sqrtf((float)D);
    const unsigned fl = causal ? H3_ATTN_CAUSAL : 0;
    h3_status st = h3_op_attention(&g_ex, &o.d, &qd, &kd, &vd, scale, fl | mode);
    char what[160];
    snprintf(what, sizeof what, "attention %s (%s) Sq%lld Sk%lld Hq%lld Hk%lld causal%d fused%d q,k sd %g v+%g",
             mode == H3_ATTN_FP8 ? "fp8" : "int8", kernel, (long long)Sq, (long long)Sk, (long long)Hq, (long long)Hk,
             causal, fused, amp, vshift);
    if (st == H3_ERR_UNSUPPORTED) {
        printf("  %s: refused on this GPU (%s)\n", what, h3_last_error());
        h3_clear_error();
    } else {
        CHECK_OK(st);
        /* the CPU with the device kernel's key blocks (192 with Hopper's fp8 kernel) */
        CHECK_OK(h3_op_attention(&g_ex, &o.h, &qh, &kh, &vh, scale, h3_cuda_attention_ref_flags(&g_ex, fl | mode)));
        compare(what, &o, 1e-2);
        /* the bf16 kernel on the same inputs, then the fp8 result's distance from it */
        CHECK_OK(h3_op_attention(&g_ex, &ob.d, &qd, &kd, &vd, scale, fl));
        CHECK_OK(h3_op_attention(&g_ex, &ob.h, &qh, &kh, &vh, scale, fl));
        h3_tensor back, f;
        CHECK_OK(h3_tensor_alloc(&back, H3_PLACE_HOST, H3_BF16, 3, so, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_tensor_alloc(&f, H3_PLACE_HOST, H3_F32, 3, so, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_copy(&g_ex, &back, &o.d));
        CHECK_OK(h3_exec_sync(&g_ex));
        CHECK_OK(h3_op_convert(&g_ex, &f, &back));
        size_t n = (size_t)(Sq * Hq * D);
        double *ref = malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) ref[i] = ((float *)ob.h.data)[i];
        const double e = t_rel_err(f.data, ref, n);
        printf("  %s: %.3e relative L2 off exact attention (the CPU's f32 on the same bf16 inputs)\n", what, e);
        /* Both modes take q and k in int8 (127 steps); P and V in e4m3 (fp8) or f16 (int8): test_ops measures the
         * CPU's same quantization 3-5% (fp8) and 0.2-3% (int8) off exact attention on random data, peaked scores
         * (here q, k of standard deviation 2) the most; with q, k in e4m3 the fp8 mode was 4-9% off. */
        CHECK(e < 0.06, "%s: %.3e off exact attention (at most 6e-2)", what, e);
        free(ref);
        h3_tensor_free(&back);
        h3_tensor_free(&f);
    }
    pfree(&o);
    pfree(&ob);
    if (fused)
        pfree(&qkv);
    else {
        pfree(&q);
        pfree(&kk);
        pfree(&v);
    }
}

static void attn_lowbit_cases(unsigned mode, const char *kernel) {
    attn_lowbit_case(mode, kernel, ri(1, 100), ri(1, 100), 2, 2, 0, 0, 1.0, 0);
    attn_lowbit_case(mode, kernel, ri(129, 400), ri(129, 500), 4, 2, 0, 0, 1.0, 0); /* partial blocks, GQA */
    attn_lowbit_case(mode, kernel, 1000, 1000, 2, 2, 0, 1, 1.0, 0);                 /* the DiT's strided q, k, v */
    int64_t S = ri(200, 500);
    attn_lowbit_case(mode, kernel, S, S, 2, 1, 1, 0, 1.0, 0);                      /* causal */
    attn_lowbit_case(mode, kernel, ri(20, 100), ri(300, 600), 2, 2, 1, 0, 1.0, 0); /* causal, more keys than queries */
    attn_lowbit_case(mode, kernel, 4096, 4096, 4, 4, 0, 1, 1.0, 0);
    attn_lowbit_case(mode, kernel, 2000, 2000, 2, 2, 0, 1, 2.0, 0); /* peaked scores (a few keys carry a row) */
    /* flat scores over W124's 19,412 keys, v with a shared component: each row's P·V sum grows with the keys, the
     * case where the tensor cores' fp8 accumulation (about 13 bits kept against the accumulator) loses most */
    attn_lowbit_case(mode, kernel, 256, 19412, 2, 2, 0, 0, 0.1, 1.0);
}

/* Block-sparse attention: the GPU against the CPU's rendering on the same bf16 values (both select the same tiles:
 * the selection is shared double-precision arithmetic), with the DiT's fused [S, 3·H·128] rows when fused; marked
 * exact tiles at both ends when mark; tau −1e9 makes every tile exact, which must equal the GPU's dense kernel. */
static void sparse_case(int64_t S, int64_t H, double tau, int mark, int fused) {
    const int64_t D = 128, nt = (S + 127) / 128;
    int64_t s3[3] = {S, H, D}, sf[2] = {S, 3 * H * D};
    pair qkv, q, k, v;
    h3_tensor qh, qd, kh, kd, vh, vd;
    if (fused) {
        qkv = mk(H3_BF16, 2, sf, 1.0);
        h3_tensor *src[2] = {&qkv.h, &qkv.d}, *dq[2] = {&qh, &qd}, *dk[2] = {&kh, &kd}, *dv[2] = {&vh, &vd};
        for (int i = 0; i < 2; i++) {
            const size_t es = src[i]->dtype == H3_F32 ? 4 : 2;
            CHECK_OK(h3_tensor_wrap(dq[i], src[i]->data, src[i]->place, src[i]->dtype, 3, s3));
            CHECK_OK(h3_tensor_wrap(dk[i], (char *)src[i]->data + H * D * es, src[i]->place, src[i]->dtype, 3, s3));
            CHECK_OK(h3_tensor_wrap(dv[i], (char *)src[i]->data + 2 * H * D * es, src[i]->place, src[i]->dtype, 3, s3));
            dq[i]->stride[0] = dk[i]->stride[0] = dv[i]->stride[0] = 3 * H * D;
        }
    } else {
        q = mk(H3_BF16, 3, s3, 1.0);
        k = mk(H3_BF16, 3, s3, 1.0);
        v = mk(H3_BF16, 3, s3, 1.0);
        qh = q.h, qd = q.d, kh = k.h, kd = k.d, vh = v.h, vd = v.d;
    }
    pair o = mk(H3_BF16, 3, s3, 1.0), od = mk(H3_BF16, 3, s3, 1.0);
    uint8_t *ex = calloc((size_t)nt, 1);
    ex[0] = ex[nt - 1] = 1;
    int64_t n_dev = -1, n_host = -2;
    h3_sparse_attn p = {(float)tau, mark ? ex : NULL, &n_dev};
    const float scale = 1.0f / sqrtf((float)D);
    char what[160];
    snprintf(what, sizeof what, "attention_sparse S%lld H%lld tau %g%s%s", (long long)S, (long long)H, tau,
             mark ? " marked" : "", fused ? " fused" : "");
    h3_status st = h3_op_attention_sparse(&g_ex, &o.d, &qd, &kd, &vd, scale, &p);
    if (st == H3_ERR_UNSUPPORTED) {
        printf("  %s: refused on this GPU (%s)\n", what, h3_last_error());
        h3_clear_error();
    } else {
        CHECK_OK(st);
        p.n_exact = &n_host;
        CHECK_OK(h3_op_attention_sparse(&g_ex, &o.h, &qh, &kh, &vh, scale, &p));
        CHECK(n_dev == n_host, "%s: the GPU selected %lld exact tiles, the CPU %lld", what, (long long)n_dev,
              (long long)n_host);
        printf("  %s: %lld of %lld tiles exact\n", what, (long long)n_dev, (long long)(H * nt * nt));
        compare(what, &o, 1e-2);
        if (tau < -1e8) { /* every tile exact: the dense kernel's result */
            CHECK_OK(h3_op_attention(&g_ex, &od.d, &qd, &kd, &vd, scale, 0));
            CHECK_OK(h3_op_attention(&g_ex, &od.h, &qh, &kh, &vh, scale, 0));
            compare("attention dense beside it", &od, 1e-2);
            h3_tensor a, b;
            CHECK_OK(h3_tensor_alloc(&a, H3_PLACE_HOST, H3_BF16, 3, s3, H3_MEM_ACTIVATIONS));
            CHECK_OK(h3_tensor_alloc(&b, H3_PLACE_HOST, H3_BF16, 3, s3, H3_MEM_ACTIVATIONS));
            CHECK_OK(h3_copy(&g_ex, &a, &o.d));
            CHECK_OK(h3_copy(&g_ex, &b, &od.d));
            CHECK_OK(h3_exec_sync(&g_ex));
            CHECK(!memcmp(a.data, b.data, (size_t)(S * H * D * 2)),
                  "%s: with every tile exact the sparse kernel must be the dense one bit for bit", what);
            h3_tensor_free(&a);
            h3_tensor_free(&b);
        }
    }
    free(ex);
    pfree(&o);
    pfree(&od);
    if (fused)
        pfree(&qkv);
    else {
        pfree(&q);
        pfree(&k);
        pfree(&v);
    }
}

static void test_attention_sparse(void) {
    sparse_case(ri(1000, 3000), 2, 1.3, 0, 0);
    sparse_case(ri(1000, 3000), 2, 1.3, 1, 1);
    sparse_case(ri(100, 127), 2, 1.3, 0, 0); /* one tile */
    sparse_case(ri(1000, 3000), 2, 1e9, 1, 0); /* the band and the marked tiles only */
    sparse_case(ri(1000, 3000), 2, -1e9, 0, 1);
    sparse_case(20000, 2, 1.3, 1, 1); /* more than 128 tiles: two centroid tiles */
}

/* fp8: the kernel this GPU picks (Hopper's wgmma one on an H200), then the mma.sync kernel Ada and Blackwell run,
 * forced (h3_cuda_attention_prefer_mma8), so a Hopper GPU checks both. */
static void test_attention_fp8(void) {
    attn_lowbit_cases(H3_ATTN_FP8, "this GPU's kernel");
    h3_cuda_attention_prefer_mma8(1);
    attn_lowbit_cases(H3_ATTN_FP8, "mma.sync");
    h3_cuda_attention_prefer_mma8(0);
}

static void test_attention_int8(void) {
    attn_lowbit_cases(H3_ATTN_INT8, "mma.sync");
}

static void test_conv(void) {
    int64_t cin = 6, cout = 8, T = ri(20, 200), K = 7;
    int64_t sx[2] = {cin, T}, sw[3] = {cout, cin / 2, K}, sb[1] = {cout};
    h3_conv1d_params p = {2, 3, 2, 9, 9, H3_PAD_REFLECT};
    int64_t tout = (T + 18 - 3 * (K - 1) - 1) / 2 + 1;
    int64_t sy[2] = {cout, tout};
    pair x = mk(H3_F32, 2, sx, 1.0), w = mk(H3_F32, 3, sw, 0.3), b = mk(H3_F32, 1, sb, 1.0), y = mk(H3_F32, 2, sy, 1.0);
    CHECK_OK(h3_op_conv1d(&g_ex, &y.h, &x.h, &w.h, &b.h, &p));
    CHECK_OK(h3_op_conv1d(&g_ex, &y.d, &x.d, &w.d, &b.d, &p));
    compare("conv1d", &y, 1e-5);
    h3_convt1d_params pt = {3, 2, 1, 2, 1};
    int64_t swt[3] = {cin, cout / 2, K}, toutt = (T - 1) * 3 - 4 + (K - 1) + 1 + 1, syt[2] = {cout, toutt};
    pair wt = mk(H3_F32, 3, swt, 0.3), yt = mk(H3_F32, 2, syt, 1.0);
    CHECK_OK(h3_op_conv_transpose1d(&g_ex, &yt.h, &x.h, &wt.h, &b.h, &pt));
    CHECK_OK(h3_op_conv_transpose1d(&g_ex, &yt.d, &x.d, &wt.d, &b.d, &pt));
    compare("conv_transpose1d", &yt, 1e-5);
    int64_t s3[4] = {3, 5, 9, 8}, w3[5] = {4, 3, 3, 3, 3}, b3[1] = {4}, y3[4] = {4, 5, 5, 4};
    h3_conv3d_params p3 = {{1, 2, 2}, {{2, 0}, {1, 1}, {1, 1}}, {H3_PAD_REPLICATE, H3_PAD_REFLECT, H3_PAD_ZEROS}};
    pair x3 = mk(H3_F32, 4, s3, 1.0), ww3 = mk(H3_F32, 5, w3, 0.3), bb3 = mk(H3_F32, 1, b3, 1.0), yy3 = mk(H3_F32, 4, y3, 1.0);
    CHECK_OK(h3_op_conv3d(&g_ex, &yy3.h, &x3.h, &ww3.h, &bb3.h, &p3));
    /* the 3-D convolutions' GEMMs run on TF32 by default (cuda.h h3_cuda_conv_set_math): exact f32 to f32's
     * tolerance, then TF32 to its own: 1e-3, about one product's worst rounding (10-bit mantissas round each
     * input by up to 4.9e-4 of itself), three times what the H200 measured (3.1e-4) */
    const h3_conv_math math3 = h3_cuda_conv_math(H3_CONV_3D);
    h3_cuda_conv_set_math(H3_CONV_3D, H3_CONV_EXACT);
    CHECK_OK(h3_op_conv3d(&g_ex, &yy3.d, &x3.d, &ww3.d, &bb3.d, &p3));
    compare("conv3d exact", &yy3, 1e-5);
    h3_cuda_conv_set_math(H3_CONV_3D, H3_CONV_TF32);
    CHECK_OK(h3_op_conv3d(&g_ex, &yy3.d, &x3.d, &ww3.d, &bb3.d, &p3));
    compare("conv3d tf32", &yy3, 1e-3);
    h3_cuda_conv_set_math(H3_CONV_3D, math3);
    pfree(&x);
    pfree(&w);
    pfree(&b);
    pfree(&y);
    pfree(&wt);
    pfree(&yt);
    pfree(&x3);
    pfree(&ww3);
    pfree(&bb3);
    pfree(&yy3);
}

/* ---- the audio decoder's ops: batched conv1d / conv_transpose1d (im2col + cuBLASLt GEMMs, direct depthwise
 * kernels) and the fused anti-aliased snake. Every case prints its error, so a failure names the shape. */

/* compare(), and a line with the case's relative L2 and largest absolute difference whatever the outcome. */
static void compare_noted(const char *what, const pair *p, double tol) {
    h3_tensor back, f;
    CHECK_OK(h3_tensor_alloc(&back, H3_PLACE_HOST, p->d.dtype, p->d.ndim, p->d.shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc(&f, H3_PLACE_HOST, H3_F32, p->d.ndim, p->d.shape, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_copy(&g_ex, &back, &p->d));
    CHECK_OK(h3_exec_sync(&g_ex));
    CHECK_OK(h3_op_convert(&g_ex, &f, &back));
    size_t n = (size_t)h3_tensor_numel(&f);
    double *ref = malloc(n * sizeof(double) + 8);
    for (size_t i = 0; i < n; i++) ref[i] = ((float *)p->h.data)[i];
    char name[200];
    snprintf(name, sizeof name, "%s (%s)", what, h3_dtype_name(p->d.dtype));
    double e = EXPECT_CLOSE(name, f.data, ref, n, tol);
    t_note("  %-74s rel %.2e  max abs %.2e  (tol %.0e)%s", name, e, t_max_abs_err(f.data, ref, n), tol,
           e <= tol ? "" : "  FAILED");
    free(ref);
    h3_tensor_free(&back);
    h3_tensor_free(&f);
}

/* The f32 3-D convolutions on TF32 against the CPU's exact f32: this GPU's path (the implicit GEMM of
 * cuda_conv3d.cu on sm_80 and later), then im2col and cuBLASLt (h3_cuda_conv3d_prefer_im2col: older GPUs'
 * path), over the video VAE encoder's kinds of convolution: 3x3x3 with causal time and reflected space, one
 * frame (its two causal taps read only zeros and are skipped), the space and the space-and-time downsamplers,
 * 1x1x1, replicate and zero padding, output channels and positions that do not fill a block, two blocks of
 * channels. Tolerance: TF32's (test_conv). */
static void test_conv3d_tf32(void) {
    static const struct {
        const char *name;
        int64_t cin, cout, T, H, W, k;
        int st[3], pad[3][2];
        h3_pad_mode mt, ms;
    } cs[] = {
        /* clang-format off */
        {"3x3x3 causal",     32,  48, 5,  9, 13, 3, {1, 1, 1}, {{2, 0}, {1, 1}, {1, 1}}, H3_PAD_ZEROS,     H3_PAD_REFLECT},
        {"one frame",        64, 130, 1, 20, 12, 3, {1, 1, 1}, {{2, 0}, {1, 1}, {1, 1}}, H3_PAD_ZEROS,     H3_PAD_REFLECT},
        {"space down",       32,  32, 3, 18, 22, 3, {1, 2, 2}, {{2, 0}, {0, 1}, {0, 1}}, H3_PAD_ZEROS,     H3_PAD_REFLECT},
        {"space-time down",  32,  64, 7, 10, 10, 3, {2, 2, 2}, {{2, 0}, {0, 1}, {0, 1}}, H3_PAD_ZEROS,     H3_PAD_REFLECT},
        {"1x1x1",            64,  96, 3,  7,  9, 1, {1, 1, 1}, {{0, 0}, {0, 0}, {0, 0}}, H3_PAD_ZEROS,     H3_PAD_ZEROS},
        {"replicate, zeros", 32, 256, 4, 16, 16, 3, {1, 1, 1}, {{1, 1}, {1, 1}, {1, 1}}, H3_PAD_REPLICATE, H3_PAD_ZEROS},
        /* clang-format on */
    };
    const h3_conv_math math3 = h3_cuda_conv_math(H3_CONV_3D);
    h3_cuda_conv_set_math(H3_CONV_3D, H3_CONV_TF32);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const int64_t k = cs[i].k, sx[4] = {cs[i].cin, cs[i].T, cs[i].H, cs[i].W},
                      sw[5] = {cs[i].cout, cs[i].cin, k, k, k}, sb[1] = {cs[i].cout};
        int64_t sy[4] = {cs[i].cout, 0, 0, 0};
        h3_conv3d_params p;
        memset(&p, 0, sizeof p);
        for (int a = 0; a < 3; a++) {
            p.stride[a] = cs[i].st[a];
            p.pad[a][0] = cs[i].pad[a][0];
            p.pad[a][1] = cs[i].pad[a][1];
            p.pad_mode[a] = a ? cs[i].ms : cs[i].mt;
            sy[1 + a] = (sx[1 + a] + p.pad[a][0] + p.pad[a][1] - k) / p.stride[a] + 1;
        }
        pair x = mk(H3_F32, 4, sx, 1.0), w = mk(H3_F32, 5, sw, 0.1), b = mk(H3_F32, 1, sb, 1.0),
             y = mk(H3_F32, 4, sy, 1.0);
        CHECK_OK(h3_op_conv3d(&g_ex, &y.h, &x.h, &w.h, &b.h, &p));
        char nm[96];
        for (int path = 0; path < 2; path++) {
            h3_cuda_conv3d_prefer_im2col(path);
            CHECK_OK(h3_op_conv3d(&g_ex, &y.d, &x.d, &w.d, &b.d, &p));
            snprintf(nm, sizeof nm, "conv3d tf32 %s, %s", cs[i].name, path ? "im2col" : "this GPU's path");
            compare_noted(nm, &y, 1e-3);
        }
        h3_cuda_conv3d_prefer_im2col(0);
        pfree(&x);
        pfree(&w);
        pfree(&b);
        pfree(&y);
    }
    h3_cuda_conv_set_math(H3_CONV_3D, math3);
}

/* x [B, C, T] (B 0: [C, T]) */
static pair mk_bct(h3_dtype dt, int64_t B, int64_t C, int64_t T, double scale) {
    int64_t s3[3] = {B, C, T}, s2[2] = {C, T};
    return B ? mk(dt, 3, s3, scale) : mk(dt, 2, s2, scale);
}

static void test_conv_batched(void) {
    static const struct {
        int64_t B, cin, cout, K;
        int stride, dil, groups, pl, pr;
        h3_pad_mode mode;
        int64_t T;
        int bf16; /* also with bf16 activations and weights */
    } c1[] = {
        {0, 6, 8, 7, 2, 3, 2, 9, 9, H3_PAD_REFLECT, 150, 0},   /* groups, stride, dilation, reflect */
        {2, 6, 8, 7, 2, 3, 2, 9, 9, H3_PAD_REFLECT, 150, 0},   /* the same, batched */
        {2, 64, 64, 11, 1, 5, 1, 25, 25, H3_PAD_ZEROS, 2000, 1}, /* an AMP block's dilated conv */
        {2, 64, 64, 3, 1, 1, 1, 1, 1, H3_PAD_ZEROS, 2000, 1},   /* its second conv */
        {3, 32, 128, 7, 1, 1, 1, 3, 3, H3_PAD_ZEROS, 207, 1},  /* conv_pre-like: K 7, few steps */
        {2, 32, 96, 1, 1, 1, 1, 0, 0, H3_PAD_ZEROS, 207, 1},   /* pointwise (dec_in_proj): x is its own columns */
        {2, 12, 6, 1, 1, 1, 3, 0, 0, H3_PAD_ZEROS, 100, 0},    /* pointwise in groups */
        {2, 8, 1, 7, 1, 1, 1, 3, 3, H3_PAD_ZEROS, 5000, 0},    /* conv_post: one output channel */
        {2, 5, 10, 12, 2, 1, 5, 5, 6, H3_PAD_REPLICATE, 300, 1}, /* depthwise: the direct kernel */
        {1, 4, 4, 5, 1, 2, 1, 4, 4, H3_PAD_REPLICATE, 90, 0},
        {2, 48, 16, 11, 1, 1, 1, 5, 5, H3_PAD_ZEROS, 40000, 0}, /* 3 column chunks of at most 64 MiB */
    };
    for (size_t i = 0; i < sizeof c1 / sizeof c1[0]; i++)
        for (int k = 0; k < 1 + c1[i].bf16; k++) {
            h3_dtype dt = g_dts[k];
            h3_conv1d_params p = {c1[i].stride, c1[i].dil, c1[i].groups, c1[i].pl, c1[i].pr, c1[i].mode};
            int64_t T = c1[i].T, K = c1[i].K;
            int64_t tout = (T + p.pad_left + p.pad_right - p.dilation * (K - 1) - 1) / p.stride + 1;
            int64_t sw[3] = {c1[i].cout, c1[i].cin / c1[i].groups, K}, sb[1] = {c1[i].cout};
            pair x = mk_bct(dt, c1[i].B, c1[i].cin, T, 1.0), y = mk_bct(dt, c1[i].B, c1[i].cout, tout, 1.0);
            pair w = mk(dt, 3, sw, 1.0 / sqrt((double)(sw[1] * K))), b = mk(dt, 1, sb, 0.5);
            CHECK_OK(h3_op_conv1d(&g_ex, &y.h, &x.h, &w.h, &b.h, &p));
            CHECK_OK(h3_op_conv1d(&g_ex, &y.d, &x.d, &w.d, &b.d, &p));
            char what[160];
            snprintf(what, sizeof what, "conv1d B%lld cin%lld cout%lld K%lld s%d d%d g%d pad%d/%d mode%d T%lld",
                     (long long)c1[i].B, (long long)c1[i].cin, (long long)c1[i].cout, (long long)K, p.stride,
                     p.dilation, p.groups, p.pad_left, p.pad_right, (int)p.pad_mode, (long long)T);
            compare_noted(what, &y, tol_of(dt));
            pfree(&x);
            pfree(&y);
            pfree(&w);
            pfree(&b);
        }
    static const struct {
        int64_t B, cin, cout, K;
        int stride, pad, outpad, groups, dil;
        int64_t T;
        int bf16;
    } ct[] = {
        {0, 6, 8, 7, 3, 2, 1, 2, 1, 120, 0},
        {2, 6, 8, 7, 3, 2, 1, 2, 2, 120, 0},      /* groups, dilation, output padding */
        {2, 1024, 512, 9, 5, 2, 0, 1, 1, 207, 1}, /* the first upsampler */
        {2, 64, 32, 4, 2, 1, 0, 1, 1, 5000, 1},   /* a later one */
        {2, 5, 5, 12, 2, 15, 0, 5, 1, 200, 0},    /* depthwise (the resampler's form): the direct kernel */
        {2, 16, 32, 16, 2, 7, 0, 1, 1, 40000, 0}, /* 3 column chunks of at most 64 MiB */
    };
    for (size_t i = 0; i < sizeof ct / sizeof ct[0]; i++)
        for (int k = 0; k < 1 + ct[i].bf16; k++) {
            h3_dtype dt = g_dts[k];
            h3_convt1d_params p = {ct[i].stride, ct[i].pad, ct[i].outpad, ct[i].groups, ct[i].dil};
            int64_t T = ct[i].T, K = ct[i].K;
            int64_t tout = (T - 1) * p.stride - 2 * p.padding + p.dilation * (K - 1) + p.output_padding + 1;
            int64_t sw[3] = {ct[i].cin, ct[i].cout / ct[i].groups, K}, sb[1] = {ct[i].cout};
            pair x = mk_bct(dt, ct[i].B, ct[i].cin, T, 1.0), y = mk_bct(dt, ct[i].B, ct[i].cout, tout, 1.0);
            pair w = mk(dt, 3, sw, 1.0 / sqrt((double)(ct[i].cin / ct[i].groups * K))), b = mk(dt, 1, sb, 0.5);
            CHECK_OK(h3_op_conv_transpose1d(&g_ex, &y.h, &x.h, &w.h, &b.h, &p));
            CHECK_OK(h3_op_conv_transpose1d(&g_ex, &y.d, &x.d, &w.d, &b.d, &p));
            char what[160];
            snprintf(what, sizeof what, "conv_transpose1d B%lld cin%lld cout%lld K%lld s%d p%d op%d g%d d%d T%lld",
                     (long long)ct[i].B, (long long)ct[i].cin, (long long)ct[i].cout, (long long)K, p.stride,
                     p.padding, p.output_padding, p.groups, p.dilation, (long long)T);
            compare_noted(what, &y, tol_of(dt));
            pfree(&x);
            pfree(&y);
            pfree(&w);
            pfree(&b);
        }
    /* the scratch comes from the arena and goes back: nothing stays after the ops */
    int64_t used0, used1;
    h3_cuda_mem_stats(&g_ex, &used0, NULL, NULL);
    {
        h3_conv1d_params p = {1, 1, 1, 5, 5, H3_PAD_ZEROS};
        int64_t sw[3] = {16, 16, 11};
        pair x = mk_bct(H3_F32, 2, 16, 500, 1.0), y = mk_bct(H3_F32, 2, 16, 500, 1.0), w = mk(H3_F32, 3, sw, 0.1);
        h3_cuda_mem_stats(&g_ex, &used0, NULL, NULL);
        h3_cuda_reset_peak(&g_ex);
        CHECK_OK(h3_op_conv1d(&g_ex, &y.d, &x.d, &w.d, NULL, &p));
        CHECK_OK(h3_exec_sync(&g_ex));
        int64_t peak;
        h3_cuda_mem_stats(&g_ex, &used1, &peak, NULL);
        int64_t want = h3_cuda_granule(h3_cuda_conv1d_scratch_bytes(2, 16, 11, 500, &p, 4));
        t_note("  conv1d scratch: %lld bytes taken during the op (h3_cuda_conv1d_scratch_bytes: %lld), %lld left",
               (long long)(peak - used0), (long long)want, (long long)(used1 - used0));
        CHECK(peak - used0 == want && used1 == used0, "scratch %lld (want %lld), left %lld", (long long)(peak - used0),
              (long long)want, (long long)(used1 - used0));
        pfree(&x);
        pfree(&y);
        pfree(&w);
    }
}

/* The unfused sequence the audio decoder ran before h3_op_snake_aa, on one place: a 1-tap replicate-padding conv, the
 * depthwise transposed conv by 2·up, snake, the depthwise strided conv by down (filters laid out per channel). */
static void snake_aa_unfused(const pair *x, const pair *al, const pair *be, const pair *fu2, const pair *fd,
                             const pair *ones, int on_device, h3_tensor *y) {
    const h3_tensor *X = on_device ? &x->d : &x->h;
    int64_t B = X->shape[0], C = X->shape[1], L = X->shape[2], K = fd->h.shape[2];
    h3_place pl = on_device ? H3_PLACE_DEVICE : H3_PLACE_HOST;
    h3_tensor xp, u;
    int64_t sxp[3] = {B, C, L + K - 2}, su[3] = {B, C, 2 * L};
    CHECK_OK(h3_tensor_alloc(&xp, pl, H3_F32, 3, sxp, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc(&u, pl, H3_F32, 3, su, H3_MEM_ACTIVATIONS));
    h3_conv1d_params pad = {1, 1, (int)C, (int)K / 2 - 1, (int)K / 2 - 1, H3_PAD_REPLICATE};
    h3_convt1d_params up = {2, ((int)K / 2 - 1) * 2 + ((int)K - 2) / 2, 0, (int)C, 1};
    h3_conv1d_params down = {2, 1, (int)C, (int)K / 2 - 1, (int)K / 2, H3_PAD_REPLICATE};
    CHECK_OK(h3_op_conv1d(&g_ex, &xp, X, on_device ? &ones->d : &ones->h, NULL, &pad));
    CHECK_OK(h3_op_conv_transpose1d(&g_ex, &u, &xp, on_device ? &fu2->d : &fu2->h, NULL, &up));
    for (int64_t b = 0; b < B; b++) {
        h3_tensor ub;
        int64_t s2[2] = {C, 2 * L};
        CHECK_OK(h3_tensor_wrap(&ub, (float *)u.data + b * C * 2 * L, pl, H3_F32, 2, s2));
        CHECK_OK(h3_op_snake(&g_ex, &ub, &ub, on_device ? &al->d : &al->h, on_device ? &be->d : &be->h,
                             H3_SNAKE_LOGSCALE));
    }
    CHECK_OK(h3_op_conv1d(&g_ex, y, &u, on_device ? &fd->d : &fd->h, NULL, &down));
    h3_tensor_free(&xp);
    h3_tensor_free(&u);
}

/* h3_op_snake_aa on the GPU against the CPU kernel (random filters and parameters, f32 and bf16 activations,
 * lengths below, at and across the 256-output tiles), and against the unfused sequence on the GPU. */
static void test_snake_aa(void) {
    static const struct {
        int64_t B, C, T;
        int K;
    } cs[] = {
        {0, 3, 1, 12},   {2, 5, 7, 12},   {2, 4, 256, 12}, {2, 3, 257, 12}, {1, 8, 1000, 12},
        {2, 512, 1035, 12}, {2, 8, 20000, 12}, {2, 3, 90, 2}, {2, 3, 300, 64},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int k = 0; k < 2; k++) {
            h3_dtype dt = g_dts[k];
            int64_t C = cs[i].C, sc[1] = {C}, sk[1] = {cs[i].K};
            pair x = mk_bct(dt, cs[i].B, C, cs[i].T, 1.5), y = mk_bct(dt, cs[i].B, C, cs[i].T, 1.0);
            pair a = mk(H3_F32, 1, sc, 0.5), b = mk(H3_F32, 1, sc, 0.5), fu = mk(H3_F32, 1, sk, 0.3),
                 fd = mk(H3_F32, 1, sk, 0.3);
            CHECK_OK(h3_op_snake_aa(&g_ex, &y.h, &x.h, &a.h, &b.h, &fu.h, &fd.h, H3_SNAKE_LOGSCALE));
            CHECK_OK(h3_op_snake_aa(&g_ex, &y.d, &x.d, &a.d, &b.d, &fu.d, &fd.d, H3_SNAKE_LOGSCALE));
            char what[128];
            snprintf(what, sizeof what, "snake_aa B%lld C%lld T%lld K%d", (long long)cs[i].B, (long long)C,
                     (long long)cs[i].T, cs[i].K);
            compare_noted(what, &y, tol_of(dt));
            pfree(&x);
            pfree(&y);
            pfree(&a);
            pfree(&b);
            pfree(&fu);
            pfree(&fd);
        }
    /* against the unfused sequence, both on the GPU, Kaiser-like filters (the fused op applies the ×2 itself) */
    static const int64_t un[][3] = {{2, 16, 5175}, {1, 4, 300}};
    for (size_t i = 0; i < sizeof un / sizeof un[0]; i++) {
        const int64_t B = un[i][0], C = un[i][1], T = un[i][2], K = 12;
        int64_t sc[1] = {C}, sk[1] = {K}, sck[3] = {C, 1, K}, s1[3] = {C, 1, 1};
        pair x = mk_bct(H3_F32, B, C, T, 1.0), y = mk_bct(H3_F32, B, C, T, 1.0), a = mk(H3_F32, 1, sc, 0.5),
             b = mk(H3_F32, 1, sc, 0.5), fu = mk(H3_F32, 1, sk, 0.3), fd = mk(H3_F32, 1, sk, 0.3);
        pair fu2 = mk(H3_F32, 3, sck, 1.0), fdc = mk(H3_F32, 3, sck, 1.0), ones = mk(H3_F32, 3, s1, 1.0);
        for (int64_t c = 0; c < C; c++) {
            ((float *)ones.h.data)[c] = 1.0f;
            for (int64_t j = 0; j < K; j++) {
                ((float *)fu2.h.data)[c * K + j] = 2.0f * ((float *)fu.h.data)[j];
                ((float *)fdc.h.data)[c * K + j] = ((float *)fd.h.data)[j];
            }
        }
        CHECK_OK(h3_copy(&g_ex, &ones.d, &ones.h));
        CHECK_OK(h3_copy(&g_ex, &fu2.d, &fu2.h));
        CHECK_OK(h3_copy(&g_ex, &fdc.d, &fdc.h));
        CHECK_OK(h3_op_snake_aa(&g_ex, &y.d, &x.d, &a.d, &b.d, &fu.d, &fd.d, H3_SNAKE_LOGSCALE));
        h3_tensor seq;
        CHECK_OK(h3_tensor_alloc(&seq, H3_PLACE_DEVICE, H3_F32, 3, y.d.shape, H3_MEM_ACTIVATIONS));
        snake_aa_unfused(&x, &a, &b, &fu2, &fdc, &ones, 1, &seq);
        CHECK_OK(h3_copy(&g_ex, &y.h, &seq)); /* the reference: the unfused ops' result */
        CHECK_OK(h3_exec_sync(&g_ex));
        char what[128];
        snprintf(what, sizeof what, "snake_aa vs the unfused ops on the GPU B%lld C%lld T%lld", (long long)B,
                 (long long)C, (long long)T);
        compare_noted(what, &y, 1e-5);
        h3_tensor_free(&seq);
        pair *ps[] = {&x, &y, &a, &b, &fu, &fd, &fu2, &fdc, &ones};
        for (size_t j = 0; j < sizeof ps / sizeof *ps; j++) pfree(ps[j]);
    }
}

static void test_fused(void) {
    for (int k = 0; k < 4; k++) { /* k >= 2: widths of whole groups of 4 (the kernels' 4-wide paths) */
        h3_dtype dt = g_dts[k & 1];
        int64_t R = ri(1, 200), C = k >= 2 ? 4 * ri(1, 175) : ri(1, 700), T = ri(2, 7);
        pair x = mk2(dt, R, C, 2.0), y = mk2(dt, R, C, 1.0), w = mk2(dt, 1, C, 1.0), tab = mk2(dt, T, 2 * C, 0.5);
        h3_tensor wh, wd, shh, shd, sch, scd, ih, id;
        int64_t sc1[1] = {C}, sr[1] = {R};
        CHECK_OK(h3_tensor_reshape(&w.h, 1, sc1, &wh));
        CHECK_OK(h3_tensor_reshape(&w.d, 1, sc1, &wd));
        CHECK_OK(h3_tensor_narrow(&tab.h, 1, 0, C, &shh));
        CHECK_OK(h3_tensor_narrow(&tab.d, 1, 0, C, &shd));
        CHECK_OK(h3_tensor_narrow(&tab.h, 1, C, C, &sch));
        CHECK_OK(h3_tensor_narrow(&tab.d, 1, C, C, &scd));
        CHECK_OK(h3_tensor_alloc(&ih, H3_PLACE_HOST, H3_I32, 1, sr, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_tensor_alloc(&id, H3_PLACE_DEVICE, H3_I32, 1, sr, H3_MEM_ACTIVATIONS));
        for (int64_t r = 0; r < R; r++) ((int32_t *)ih.data)[r] = (int32_t)ri(0, T - 1);
        CHECK_OK(h3_copy(&g_ex, &id, &ih));
        CHECK_OK(h3_op_rms_norm_modulate(&g_ex, &y.h, &x.h, &wh, 1e-5f, &shh, &sch, &ih));
        CHECK_OK(h3_op_rms_norm_modulate(&g_ex, &y.d, &x.d, &wd, 1e-5f, &shd, &scd, &id));
        compare("rms_norm_modulate", &y, tol_of(dt));
        /* qk_norm_rope in place on a strided head view, 128-wide heads, 96 rotated channels (k >= 2: the
         * 4-wide kernel) or 90 (halves of 45: the scalar one); then 64-wide heads (the video VAE decoder's),
         * 48 rotated (k >= 2: two heads a warp, an odd head count leaving the last warp's second head empty)
         * or 42 */
        for (int wide = 0; wide < 2; wide++) {
            int64_t S = ri(1, 300), H = wide ? 2 * ri(1, 6) - 1 : ri(1, 8), D = wide ? 64 : 128;
            int64_t Rr = k >= 2 ? (wide ? 48 : 96) : (wide ? 42 : 90);
            pair buf = mk2(dt, S, 3 * H * D, 1.5), qw = mk2(dt, 1, D, 1.0), cs = mk2(H3_F32, S, Rr, 1.0),
                 sn = mk2(H3_F32, S, Rr, 1.0);
            h3_tensor qh, qd, qwh, qwd;
            int64_t s3[3] = {S, H, D}, sd[1] = {D};
            CHECK_OK(h3_tensor_reshape(&qw.h, 1, sd, &qwh));
            CHECK_OK(h3_tensor_reshape(&qw.d, 1, sd, &qwd));
            size_t es = h3_dtype_size(dt);
            CHECK_OK(h3_tensor_wrap(&qh, (float *)buf.h.data + H * D, H3_PLACE_HOST, H3_F32, 3, s3));
            CHECK_OK(
                h3_tensor_wrap(&qd, (char *)buf.d.data + (size_t)(H * D) * es, H3_PLACE_DEVICE, dt, 3, s3));
            qh.stride[0] = qd.stride[0] = 3 * H * D;
            CHECK_OK(h3_op_qk_norm_rope(&g_ex, &qh, &qwh, 1e-5f, &cs.h, &sn.h));
            CHECK_OK(h3_op_qk_norm_rope(&g_ex, &qd, &qwd, 1e-5f, &cs.d, &sn.d));
            compare(wide ? "qk_norm_rope, head 64" : "qk_norm_rope", &buf, tol_of(dt));
            pfree(&buf);
            pfree(&qw);
            pfree(&cs);
            pfree(&sn);
        }
        h3_tensor_free(&ih);
        h3_tensor_free(&id);
        pfree(&x);
        pfree(&y);
        pfree(&w);
        pfree(&tab);
    }
}

/* ---- quantized weights
 * ------------------------------------------------------------------------------------- The GPU's paths (W8A8
 * int8 with and without ConvRot, fp8 through fp8 GEMMs, dequantized tiles for everything) against the CPU
 * GEMM on the same stored weights, the CPU's activations passed through the same activation quantization
 * first (h3_qbench_act_quant, the definition the error table uses). What is left is the GPU's arithmetic and
 * output rounding: the int8 products are exact in int32. */
enum { QF_I8_ROW, QF_I8_TENSOR, QF_FP8, QF_NVFP4, QF_FP8_ROW };

typedef struct {
    h3_tensor h, d;         /* host and device weights, same stored bytes */
    h3_tensor d_data, d_sc; /* device allocations behind d */
    void *h_data, *h_sc;
} qweight;

static void qw_make(qweight *w, int fmt, int64_t N, int64_t K, int group) {
    memset(w, 0, sizeof *w);
    float *wf = malloc((size_t)(N * K) * sizeof(float));
    t_fill_randn(wf, (size_t)(N * K), 0.1);
    int64_t shape[2] = {N, K};
    size_t data_b = (size_t)(N * K), sc_b = 0;
    if (fmt == QF_I8_ROW || fmt == QF_I8_TENSOR) {
        w->h_data = malloc(data_b);
        w->h_sc = malloc((size_t)N * 4);
        CHECK_OK(h3_quantize_int8_rows(wf, N, K, group, w->h_data, w->h_sc));
        CHECK_OK(h3_tensor_wrap(&w->h, w->h_data, H3_PLACE_HOST, H3_I8, 2, shape));
        if (fmt == QF_I8_ROW) {
            w->h.q.mode = H3_SCALE_ROW;
            w->h.q.scales = w->h_sc;
            sc_b = (size_t)N * 4;
        } else {
            w->h.q.mode = H3_SCALE_TENSOR;
            w->h.q.scale = ((float *)w->h_sc)[0];
        }
        w->h.q.rot_group = group;
    } else if (fmt == QF_FP8) {
        w->h_data = malloc(data_b);
        float sc = h3_quantize_fp8_scale(wf, data_b);
        h3_quantize_fp8(wf, data_b, sc, w->h_data);
        CHECK_OK(h3_tensor_wrap(&w->h, w->h_data, H3_PLACE_HOST, H3_F8_E4M3, 2, shape));
        w->h.q.mode = H3_SCALE_TENSOR;
        w->h.q.scale = sc;
    } else if (fmt == QF_FP8_ROW) { /* one scale a row, each row's values spread over 1e-3..1 in size */
        w->h_data = malloc(data_b);
        w->h_sc = malloc((size_t)N * 4);
        for (int64_t n = 0; n < N; n++) {
            float *row = wf + n * K;
            const float g = powf(10.0f, -3.0f * (float)n / (float)(N > 1 ? N - 1 : 1));
            for (int64_t k = 0; k < K; k++) row[k] *= g;
            ((float *)w->h_sc)[n] = h3_quantize_fp8_scale(row, (size_t)K);
            h3_quantize_fp8(row, (size_t)K, ((float *)w->h_sc)[n], (uint8_t *)w->h_data + n * K);
        }
        CHECK_OK(h3_tensor_wrap(&w->h, w->h_data, H3_PLACE_HOST, H3_F8_E4M3, 2, shape));
        w->h.q.mode = H3_SCALE_ROW;
        w->h.q.scales = w->h_sc;
        sc_b = (size_t)N * 4;
    } else {
        data_b = (size_t)(N * K / 2);
        sc_b = (size_t)h3_nvfp4_scale_count(N, K);
        w->h_data = malloc(data_b);
        w->h_sc = calloc(1, sc_b);
        float s2 = h3_quantize_nvfp4_scale2(wf, (size_t)(N * K));
        CHECK_OK(h3_quantize_nvfp4(wf, N, K, s2, w->h_data, w->h_sc));
        CHECK_OK(h3_tensor_wrap(&w->h, w->h_data, H3_PLACE_HOST, H3_U8, 2, shape));
        w->h.stride[0] = K / 2;
        w->h.q.mode = H3_SCALE_FORMAT;
        w->h.q.format = H3_QF_NVFP4;
        w->h.q.fmt_scales = w->h_sc;
        w->h.q.scale = s2;
    }
    int64_t nb = (int64_t)data_b, ns = (int64_t)sc_b;
    CHECK_OK(h3_tensor_alloc(&w->d_data, H3_PLACE_DEVICE, H3_U8, 1, &nb, H3_MEM_WEIGHTS));
    CHECK_OK(h3_cuda_copy_h2d_async(w->d_data.data, w->h_data, data_b, h3_cuda_compute_stream(&g_ex)));
    if (sc_b) {
        CHECK_OK(h3_tensor_alloc(&w->d_sc, H3_PLACE_DEVICE, H3_U8, 1, &ns, H3_MEM_WEIGHTS));
        CHECK_OK(h3_cuda_copy_h2d_async(w->d_sc.data, w->h_sc, sc_b, h3_cuda_compute_stream(&g_ex)));
    }
    CHECK_OK(h3_exec_sync(&g_ex));
    w->d = w->h;
    w->d.place = H3_PLACE_DEVICE;
    w->d.data = w->d_data.data;
    if (fmt == QF_I8_ROW || fmt == QF_FP8_ROW) w->d.q.scales = w->d_sc.data;
    if (fmt == QF_NVFP4) w->d.q.fmt_scales = w->d_sc.data;
    free(wf);
}

static void qw_free(qweight *w) {
    h3_tensor_free(&w->d_data);
    h3_tensor_free(&w->d_sc);
    free(w->h_data);
    free(w->h_sc);
}

/* mode: h3_cuda_qgemm_set_mode's (0 the fastest path, 1 dequantized tiles, 2 fp8 with one activation scale a
 * chunk) */
static void qgemm_case_k(int fmt, int group, h3_dtype dt, int mode, int rep, int64_t K_fixed) {
    static const char *const names[] = {"int8 per-row", "int8 tensor", "fp8", "nvfp4", "fp8 per-row"};
    const int dequant = (mode & 3) == 1;
    int64_t M = ri(1, 300), N = 16 * ri(1, 24), K = group ? group * ri(1, 4) : 16 * ri(1, 40);
    if (K_fixed) K = K_fixed;
    qweight w;
    qw_make(&w, fmt, N, K, group);
    pair x = mk2(dt, M, K, 1.0), b = mk2(dt, 1, N, 1.0), y = mk2(dt, M, N, 1.0);
    h3_tensor bh, bd, wh = w.h, wd = w.d;
    int64_t sb[1] = {N};
    CHECK_OK(h3_tensor_reshape(&b.h, 1, sb, &bh));
    CHECK_OK(h3_tensor_reshape(&b.d, 1, sb, &bd));
    if (rep == 3 && N >= 32) { /* a row view (the DiT's q, k, v of a fused QKV): scales move with the rows */
        CHECK_OK(h3_tensor_narrow(&w.h, 0, 16, N - 16, &wh));
        CHECK_OK(h3_tensor_narrow(&w.d, 0, 16, N - 16, &wd));
        pfree(&y);
        pfree(&b);
        b = mk2(dt, 1, N - 16, 1.0);
        y = mk2(dt, M, N - 16, 1.0);
        sb[0] = N - 16;
        CHECK_OK(h3_tensor_reshape(&b.h, 1, sb, &bh));
        CHECK_OK(h3_tensor_reshape(&b.d, 1, sb, &bd));
    }
    /* the CPU sees the activations the GPU's path quantizes: fp8 GEMMs one scale a row on Hopper (tensor or
     * per-row weights) or one a chunk (Ada, mode 2; tensor weights only, per-row ones run dequantized there) */
    h3_cuda_qgemm_set_mode(&g_ex, mode);
    const int fp8_rows = h3_cuda_fp8_act_rows(&g_ex);
    h3_qvariant v = H3_QV_INT8;
    if (!dequant && (fmt == QF_I8_ROW || fmt == QF_I8_TENSOR)) v = H3_QV_INT8_CONVROT_W8A8;
    CHECK_OK(h3_qbench_act_quant(x.h.data, M, K, v, group));
    const int fp8_gemm = !dequant && (fmt == QF_FP8 || (fmt == QF_FP8_ROW && fp8_rows));
    if (fp8_gemm) h3_qbench_act_quant_fp8(x.h.data, M, K, fp8_rows);
    unsigned fl = rep == 1 ? H3_GEMM_ACCUMULATE : 0;
    CHECK_OK(h3_op_gemm(&g_ex, &y.h, &x.h, &wh, rep != 2 ? &bh : NULL, fl));
    CHECK_OK(h3_op_gemm(&g_ex, &y.d, &x.d, &wd, rep != 2 ? &bd : NULL, fl));
    h3_cuda_qgemm_set_mode(&g_ex, 0);
    char what[128];
    snprintf(what, sizeof what, "gemm %s%s%s%s%s M%lld N%lld K%lld", names[fmt], group ? " convrot" : "",
             dequant    ? " (dequantized tiles)"
             : fp8_gemm ? (fp8_rows ? (mode & H3_QGEMM_FP8_EXACT ? " (fp8 GEMM, a scale a row, fp32 sums)"
                                                                  : " (fp8 GEMM, a scale a row)")
                                    : " (fp8 GEMM, a scale a chunk)")
             : fmt == QF_NVFP4 || fmt == QF_FP8_ROW ? ""
                                                    : " (W8A8)",
             rep == 1   ? " accumulate"
             : rep == 2 ? " no bias"
                        : "",
             rep == 3 ? " row view" : "", (long long)M, (long long)wh.shape[0], (long long)K);
    /* fp8 tensor cores accumulate with fewer bits than fp32, fast accumulation (the default) fewer still */
    double tol = dt == H3_F32 ? (fp8_gemm ? (mode & H3_QGEMM_FP8_EXACT ? 1e-3 : 1e-2) : 1e-5) : 8e-3;
    if (fp8_gemm)
        compare_noted(what, &y, tol);
    else
        compare(what, &y, tol);
    pfree(&x);
    pfree(&b);
    pfree(&y);
    qw_free(&w);
}

static void qgemm_case(int fmt, int group, h3_dtype dt, int mode, int rep) {
    qgemm_case_k(fmt, group, dt, mode, rep, 0);
}

/* GGUF blocks (dequantized tiles, the CPU's decoder compiled for the GPU): random codes, the blocks' f16
 * scales set to sane values. */
static void gguf_case(h3_qformat f, h3_dtype dt) {
    int64_t be, bb;
    CHECK(h3_qformat_block(f, &be, &bb), "format %d", (int)f);
    const int64_t M = ri(1, 120), N = ri(1, 40), K = be * ri(1, 3), rb = K / be * bb;
    uint8_t *hw = malloc((size_t)(N * rb));
    for (int64_t i = 0; i < N * rb; i++) hw[i] = (uint8_t)t_rand_u64();
    /* byte offsets of the f16 fields (d, and m/dmin where the format has one) in each block */
    int o1 = 0, o2 = -1;
    if (f == H3_QF_Q4_1 || f == H3_QF_Q5_1 || f == H3_QF_Q4_K || f == H3_QF_Q5_K) o2 = 2;
    if (f == H3_QF_Q2_K) o1 = 80, o2 = 82;
    if (f == H3_QF_Q3_K) o1 = 108;
    if (f == H3_QF_Q6_K) o1 = 208;
    for (int64_t b = 0; b < N * (K / be); b++) {
        uint8_t *p = hw + b * bb;
        const uint16_t d = (uint16_t)(0x2000 + (t_rand_u64() % 0x400)),
                       m = (uint16_t)(0x2000 + (t_rand_u64() % 0x400));
        p[o1] = (uint8_t)d, p[o1 + 1] = (uint8_t)(d >> 8); /* ~0.008 .. 0.016 */
        if (o2 >= 0) p[o2] = (uint8_t)m, p[o2 + 1] = (uint8_t)(m >> 8);
    }
    int64_t shape[2] = {N, K}, nb = N * rb;
    h3_tensor wh, wd, dd;
    CHECK_OK(h3_tensor_wrap(&wh, hw, H3_PLACE_HOST, H3_U8, 2, shape));
    wh.stride[0] = rb;
    wh.q.mode = H3_SCALE_FORMAT;
    wh.q.format = f;
    CHECK_OK(h3_tensor_alloc(&dd, H3_PLACE_DEVICE, H3_U8, 1, &nb, H3_MEM_WEIGHTS));
    CHECK_OK(h3_cuda_copy_h2d_async(dd.data, hw, (size_t)nb, h3_cuda_compute_stream(&g_ex)));
    CHECK_OK(h3_exec_sync(&g_ex));
    wd = wh;
    wd.place = H3_PLACE_DEVICE;
    wd.data = dd.data;
    pair x = mk2(dt, M, K, 1.0), y = mk2(dt, M, N, 1.0);
    CHECK_OK(h3_op_gemm(&g_ex, &y.h, &x.h, &wh, NULL, 0));
    CHECK_OK(h3_op_gemm(&g_ex, &y.d, &x.d, &wd, NULL, 0));
    char what[96];
    snprintf(what, sizeof what, "gemm %s (dequantized tiles) M%lld N%lld K%lld", h3_qformat_name(f),
             (long long)M, (long long)N, (long long)K);
    compare(what, &y, tol_of(dt));
    pfree(&x);
    pfree(&y);
    h3_tensor_free(&dd);
    free(hw);
}

/* h3_cuda_quantize_fp8 against the host's rule (h3_quantize_fp8_scale, h3_quantize_fp8) on the same values: the
 * same scale and the same bytes, a non-finite value and an all-zero matrix included. */
static void quantize_fp8_case(h3_dtype dt, int64_t N, int64_t K, int zero) {
    pair w = mk2(dt, N, K, zero ? 0.0 : 0.05);
    const size_t n = (size_t)(N * K);
    float *h = w.h.data;
    if (!zero && n > 9) { /* skipped by the maximum, 0x7f in the bytes */
        h[3] = INFINITY;
        h[9] = NAN;
        h3_tensor tmp;
        CHECK_OK(h3_tensor_alloc2(&tmp, H3_PLACE_HOST, dt, N, K, H3_MEM_ACTIVATIONS));
        CHECK_OK(h3_op_convert(&g_ex, &tmp, &w.h));
        CHECK_OK(h3_copy(&g_ex, &w.d, &tmp));
        CHECK_OK(h3_exec_sync(&g_ex));
        h3_tensor_free(&tmp);
    }
    h3_tensor qd;
    CHECK_OK(h3_tensor_alloc2(&qd, H3_PLACE_DEVICE, H3_U8, N, K, H3_MEM_WEIGHTS));
    float sc = 0.0f;
    CHECK_OK(h3_cuda_quantize_fp8(&g_ex, &w.d, qd.data, &sc));
    uint8_t *got = malloc(n), *want = malloc(n);
    h3_tensor gh;
    int64_t shape[2] = {N, K};
    CHECK_OK(h3_tensor_wrap(&gh, got, H3_PLACE_HOST, H3_U8, 2, shape));
    CHECK_OK(h3_copy(&g_ex, &gh, &qd));
    CHECK_OK(h3_exec_sync(&g_ex));
    const float want_sc = h3_quantize_fp8_scale(h, n);
    h3_quantize_fp8(h, n, want_sc, want);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++) diff += got[i] != want[i];
    CHECK(sc == want_sc && diff == 0, "quantize_fp8 %s [%lld, %lld]%s: scale %g (host %g), %zu of %zu bytes differ",
          h3_dtype_name(dt), (long long)N, (long long)K, zero ? " zeros" : "", (double)sc, (double)want_sc, diff, n);
    free(got);
    free(want);
    h3_tensor_free(&qd);
    pfree(&w);
}

static void test_qgemm(void) {
    for (int k = 0; k < 2; k++) {
        quantize_fp8_case(g_dts[k], ri(1, 300), 8 * ri(1, 80), 0); /* bf16: 8 values a thread for the maximum */
        quantize_fp8_case(g_dts[k], ri(1, 300), ri(1, 700), 0);
        quantize_fp8_case(g_dts[k], 7, 24, 1);
    }
    for (int k = 0; k < 2; k++)
        for (int dq = 0; dq < 2; dq++) {
            for (int rep = 0; rep < 4; rep++) qgemm_case(QF_I8_ROW, 0, g_dts[k], dq, rep);
            qgemm_case(QF_I8_ROW, 256, g_dts[k], dq, 0);
            qgemm_case(QF_I8_ROW, 64, g_dts[k], dq, 3);
            qgemm_case(QF_I8_TENSOR, 0, g_dts[k], dq, 1);
            for (int rep = 0; rep < 3; rep++) qgemm_case(QF_FP8, 0, g_dts[k], dq, rep);
            for (int rep = 0; rep < 4; rep++) qgemm_case(QF_FP8_ROW, 0, g_dts[k], dq, rep);
        }
    for (int k = 0; k < 2; k++) /* Ada's rule, forced on Hopper; sums promoted to fp32 */
        for (int rep = 0; rep < 3; rep++) {
            qgemm_case(QF_FP8, 0, g_dts[k], 2, rep);
            qgemm_case(QF_FP8, 0, g_dts[k], H3_QGEMM_FP8_EXACT, rep);
        }
    /* the DiT's longest sum (fc2's K), both ways of accumulating */
    qgemm_case_k(QF_FP8, 0, H3_F32, 0, 0, 14336);
    qgemm_case_k(QF_FP8, 0, H3_F32, H3_QGEMM_FP8_EXACT, 0, 14336);
    for (int k = 0; k < 2; k++)
        for (int rep = 0; rep < 4; rep++) qgemm_case(QF_NVFP4, 0, g_dts[k], 0, rep);
    for (int f = H3_QF_Q4_0; f <= H3_QF_Q6_K; f++)
        for (int k = 0; k < 2; k++) gguf_case((h3_qformat)f, g_dts[k]);
    /* a scale form the GPU does not compute with: a clear error, not a wrong answer */
    {
        pair x = mk2(H3_BF16, 4, 64, 1.0), y = mk2(H3_BF16, 4, 32, 1.0);
        h3_tensor wd, sd;
        CHECK_OK(h3_tensor_alloc2(&wd, H3_PLACE_DEVICE, H3_I8, 32, 64, H3_MEM_WEIGHTS));
        CHECK_OK(h3_tensor_alloc2(&sd, H3_PLACE_DEVICE, H3_F32, 32, 2, H3_MEM_WEIGHTS));
        wd.q.mode = H3_SCALE_BLOCK;
        wd.q.block = 32;
        wd.q.scales = sd.data;
        CHECK_ERR(h3_op_gemm(&g_ex, &y.d, &x.d, &wd, NULL, 0), H3_ERR_UNSUPPORTED, "CPU only");
        wd.q.mode = H3_SCALE_NONE;
        h3_tensor_free(&wd);
        h3_tensor_free(&sd);
        pfree(&x);
        pfree(&y);
    }
}

static void test_random(void) {
    for (int k = 0; k < 2; k++) {
        int64_t R = ri(1, 200), C = ri(1, 900);
        pair y = mk2(g_dts[k], R, C, 1.0);
        uint64_t seed = t_rand_u64();
        CHECK_OK(h3_op_random_uniform(&g_ex, &y.h, seed, -0.02f, 0.02f));
        CHECK_OK(h3_op_random_uniform(&g_ex, &y.d, seed, -0.02f, 0.02f));
        if (g_dts[k] == H3_BF16) { /* the host reference rounded the same way */
            h3_tensor tmp;
            CHECK_OK(h3_tensor_alloc(&tmp, H3_PLACE_HOST, H3_BF16, 2, y.h.shape, H3_MEM_ACTIVATIONS));
            CHECK_OK(h3_op_convert(&g_ex, &tmp, &y.h));
            CHECK_OK(h3_op_convert(&g_ex, &y.h, &tmp));
            h3_tensor_free(&tmp);
        }
        compare("random_uniform", &y, 0);
        pfree(&y);
    }
}

static void test_arena(void) {
    int64_t used0, peak, cap;
    h3_cuda_mem_stats(&g_ex, &used0, &peak, &cap);
    h3_tensor a, b, c;
    CHECK_OK(h3_tensor_alloc2(&a, H3_PLACE_DEVICE, H3_F32, 1000, 1000, H3_MEM_ACTIVATIONS));
    CHECK_OK(h3_tensor_alloc2(&b, H3_PLACE_DEVICE, H3_F32, 10, 10, H3_MEM_ACTIVATIONS));
    int64_t used1;
    h3_cuda_mem_stats(&g_ex, &used1, &peak, &cap);
    CHECK(used1 - used0 >= 4000000 + 400 && used1 - used0 < 4000000 + 400 + 1024, "arena counted %lld bytes",
          (long long)(used1 - used0));
    h3_tensor_free(&a);
    h3_tensor_free(&b);
    int64_t used2;
    h3_cuda_mem_stats(&g_ex, &used2, &peak, &cap);
    CHECK(used2 == used0, "arena did not return to %lld bytes (%lld)", (long long)used0, (long long)used2);
    /* More than the budget: a clear error, not a crash */
    CHECK_ERR(h3_tensor_alloc2(&c, H3_PLACE_DEVICE, H3_F32, cap / 4 + 1024, 1, H3_MEM_ACTIVATIONS), H3_ERR_NOMEM,
              "device budget");
}

int main(int argc, char **argv) {
    if (h3_cuda_device_count() == 0) {
        printf("test_cuda_ops: skipped: no CUDA device on this machine (%s)\n",
               h3_cuda_compiled() ? "CUDA backend compiled" : "built without CUDA");
        return 0;
    }
    if (h3_exec_init(&g_ex, 0) != H3_OK || h3_cuda_init(&g_ex, 0, (int64_t)4 << 30) != H3_OK) {
        fprintf(stderr, "init failed: %s\n", h3_last_error());
        return 1;
    }
    static const t_case cases[] = {
        {"arena", test_arena},
        {"gemm", test_gemm},
        {"rows_ops", test_rows_ops},
        {"group_norm", test_group_norm},
        {"table_ops", test_table_ops},
        {"rope", test_rope},
        {"attention", test_attention},
        {"attention_fp8", test_attention_fp8},
        {"attention_int8", test_attention_int8},
        {"attention_sparse", test_attention_sparse},
        {"conv", test_conv},
        {"conv3d_tf32", test_conv3d_tf32},
        {"random", test_random},
        {"qgemm", test_qgemm},
        {"fused", test_fused},
        {"conv_batched", test_conv_batched},
        {"snake_aa", test_snake_aa},
        {NULL, NULL},
    };
    int r = t_main("test_cuda_ops", cases, argc, argv);
    h3_cuda_shutdown(&g_ex);
    h3_exec_free(&g_ex);
    return r;
}

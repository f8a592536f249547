/* The error microbenchmark of the quantized formats (contract in qwrite.h). */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "quant/qwrite.h"

static const char *const g_variants[H3_QV_COUNT] = {"int8",     "int8_convrot", "int8_convrot W8A8", "fp8",
                                                    "fp8 W8A8", "nvfp4",        "nvfp4 W4A4"};

const char *h3_qvariant_name(h3_qvariant v) {
    return (unsigned)v < H3_QV_COUNT ? g_variants[v] : "?";
}

static h3_qtarget weight_format(h3_qvariant v) {
    switch (v) {
        case H3_QV_INT8:
            return H3_QT_INT8;
        case H3_QV_INT8_CONVROT:
        case H3_QV_INT8_CONVROT_W8A8:
            return H3_QT_INT8_CONVROT;
        case H3_QV_FP8:
        case H3_QV_FP8_W8A8:
            return H3_QT_FP8;
        default:
            return H3_QT_NVFP4;
    }
}

/* N(0, 1) values from the seeded counter-based generator (Box-Muller on two uniforms). */
static void randn(float *x, int64_t n, uint64_t seed, double scale) {
    for (int64_t i = 0; i < n; i++) {
        double u1 = h3_random_unit(seed, (uint64_t)(2 * i)) + 0.5 / 16777216.0,
               u2 = h3_random_unit(seed, (uint64_t)(2 * i + 1));
        x[i] = (float)(scale * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}

static double rel_err(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

void h3_qbench_act_quant_fp8(float *x, int64_t R, int64_t K, int rows) {
    const int64_t n = rows ? K : R * K; /* values under one scale */
    for (int64_t r0 = 0; r0 < R * K; r0 += n) {
        float *p = x + r0, m = 0.0f;
        for (int64_t i = 0; i < n; i++)
            if (isfinite(p[i])) m = fmaxf(m, fabsf(p[i])); /* as the device's maximum */
        const int ok = m > 0.0f && m <= 3.0e38f;
        const float inv = ok ? 448.0f / m : 1.0f, s = ok ? m / 448.0f : 1.0f;
        for (int64_t i = 0; i < n; i++) {
            float a = p[i] * inv;
            a = a > 448.0f ? 448.0f : a < -448.0f ? -448.0f : a;
            p[i] = h3_fp8e4m3_to_f32(h3_f32_to_fp8e4m3(a)) * s;
        }
    }
}

/* What the GPU path does to a linear's input rows x [R, K] (contiguous), in place, in f32: the values the
 * int8 / fp8 / nvfp4 GEMM multiplies, brought back to the weights' basis. */
h3_status h3_qbench_act_quant(float *x, int64_t R, int64_t K, h3_qvariant v, int group) {
    if (v == H3_QV_INT8_CONVROT_W8A8) { /* rotate per group, int8 per token, back */
        int8_t *q = h3_malloc((size_t)K, H3_MEM_WORKSPACE);
        float s;
        if (!q) return H3_ERR_NOMEM;
        for (int64_t r = 0; r < R; r++) {
            float *row = x + r * K;
            h3_status st = h3_quantize_int8_rows(row, 1, K, group, q, &s);
            if (st != H3_OK) {
                h3_free(q);
                return st;
            }
            for (int64_t c = 0; c < K; c++) row[c] = (float)q[c] * s;
            if (group) h3_convrot_apply(row, K, group);
        }
        h3_free(q);
    } else if (v == H3_QV_FP8_W8A8) {
        h3_qbench_act_quant_fp8(x, R, K, 1);
    } else if (v == H3_QV_NVFP4_W4A4) { /* nvfp4 with the tensor's own scale_2, as ComfyUI quantizes inputs */
        h3_tensor t;
        H3_TRY(h3_quantize_tensor(x, R, K, H3_QT_NVFP4, NULL, &t));
        h3_status st = h3_tensor_rows_to_f32(&t, 0, R, x);
        h3_tensor_free(&t);
        return st;
    }
    return H3_OK;
}

static int has_act_quant(h3_qvariant v) {
    return v == H3_QV_INT8_CONVROT_W8A8 || v == H3_QV_FP8_W8A8 || v == H3_QV_NVFP4_W4A4;
}

/* y = fake_quant(x)·wᵀ; x [R, K] any row stride. */
static h3_status linear(h3_exec *ex, h3_tensor *y, const h3_tensor *x, const h3_tensor *w, int v) {
    if (v < 0 || !has_act_quant((h3_qvariant)v)) return h3_op_gemm(ex, y, x, w, NULL, 0);
    int64_t R = x->shape[0], K = x->shape[1], ld;
    h3_tensor_is_rowwise(x, &ld);
    h3_tensor xs;
    H3_TRY(h3_tensor_alloc2(&xs, H3_PLACE_HOST, H3_F32, R, K, H3_MEM_WORKSPACE));
    for (int64_t r = 0; r < R; r++)
        memcpy((float *)xs.data + r * K, (const float *)x->data + r * ld, (size_t)K * 4);
    h3_status st = h3_qbench_act_quant(xs.data, R, K, (h3_qvariant)v, w->q.rot_group);
    if (st == H3_OK) st = h3_op_gemm(ex, y, &xs, w, NULL, 0);
    h3_tensor_free(&xs);
    return st;
}

static h3_status wrap_vec(h3_tensor *t, const float *p, int64_t n) {
    return h3_tensor_wrap(t, (void *)p, H3_PLACE_HOST, H3_F32, 1, &n);
}

/* The plain pre-norm DiT block: x + out(attn(qk_norm(qkv(rms(x))))), then + fc2(swiglu(fc1(rms(·)))). w: qkv,
 * out, fc1, fc2 as tensors (f32 or quantized); v: the variant (activation quantization) or -1. */
static h3_status block_forward(h3_exec *ex, const h3_qbench_block *b, const h3_tensor *w, int v,
                               const float *x0, int64_t R, float *y) {
    const int64_t H = b->hidden, I = b->heads * b->head_dim, F = b->ffn, D = b->head_dim;
    h3_tensor x, h, qkv, qc, kc, vc, o, u, g, m, n1, n2, qn, kn;
    h3_tensor *all[] = {&x, &h, &qkv, &qc, &kc, &vc, &o, &u, &g, &m};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) memset(all[i], 0, sizeof(h3_tensor));
    h3_status st = H3_OK;
    H3_CHECK(h3_tensor_alloc2(&x, H3_PLACE_HOST, H3_F32, R, H, H3_MEM_WORKSPACE));
    H3_CHECK(h3_tensor_alloc2(&h, H3_PLACE_HOST, H3_F32, R, H, H3_MEM_WORKSPACE));
    H3_CHECK(h3_tensor_alloc2(&qkv, H3_PLACE_HOST, H3_F32, R, 3 * I, H3_MEM_WORKSPACE));
    H3_CHECK(h3_tensor_alloc2(&qc, H3_PLACE_HOST, H3_F32, R, I, H3_MEM_WORKSPACE));
    H3_CHECK(h3_tensor_alloc2(&kc, H3_PLACE_HOST, H3_F32, R, I, H3_MEM_WORKSPACE));
    H3_CHECK(h3_tensor_alloc2(&vc, H3_PLACE_HOST, H3_F32, R, I, H3_MEM_WORKSPACE));
    H3_CHECK(h3_tensor_alloc2(&o, H3_PLACE_HOST, H3_F32, R, I, H3_MEM_WORKSPACE));
    H3_CHECK(h3_tensor_alloc2(&u, H3_PLACE_HOST, H3_F32, R, 2 * F, H3_MEM_WORKSPACE));
    H3_CHECK(h3_tensor_alloc2(&g, H3_PLACE_HOST, H3_F32, R, F, H3_MEM_WORKSPACE));
    H3_CHECK(h3_tensor_alloc2(&m, H3_PLACE_HOST, H3_F32, R, H, H3_MEM_WORKSPACE));
    memcpy(x.data, x0, (size_t)(R * H) * sizeof(float));
    H3_CHECK(wrap_vec(&n1, b->norm1, H));
    H3_CHECK(wrap_vec(&n2, b->norm2, H));
    H3_CHECK(wrap_vec(&qn, b->q_norm, D));
    H3_CHECK(wrap_vec(&kn, b->k_norm, D));
    const float eps = (float)b->eps;
    /* attention */
    H3_CHECK(h3_op_rms_norm(ex, &h, &x, &n1, eps));
    H3_CHECK(linear(ex, &qkv, &h, &w[0], v));
    h3_tensor *dst[3] = {&qc, &kc, &vc};
    for (int j = 0; j < 3; j++) {
        h3_tensor col;
        H3_CHECK(h3_tensor_narrow(&qkv, 1, j * I, I, &col));
        H3_CHECK(h3_op_convert(ex, dst[j], &col));
    }
    {
        int64_t s2[2] = {R * b->heads, D}, s3[3] = {R, b->heads, D};
        h3_tensor q2, k2, q3, k3, v3, o3;
        H3_CHECK(h3_tensor_reshape(&qc, 2, s2, &q2));
        H3_CHECK(h3_tensor_reshape(&kc, 2, s2, &k2));
        H3_CHECK(h3_op_rms_norm(ex, &q2, &q2, &qn, eps));
        H3_CHECK(h3_op_rms_norm(ex, &k2, &k2, &kn, eps));
        H3_CHECK(h3_tensor_reshape(&qc, 3, s3, &q3));
        H3_CHECK(h3_tensor_reshape(&kc, 3, s3, &k3));
        H3_CHECK(h3_tensor_reshape(&vc, 3, s3, &v3));
        H3_CHECK(h3_tensor_reshape(&o, 3, s3, &o3));
        H3_CHECK(h3_op_attention(ex, &o3, &q3, &k3, &v3, (float)(1.0 / sqrt((double)D)), 0));
    }
    H3_CHECK(linear(ex, &h, &o, &w[1], v));
    H3_CHECK(h3_op_binary(ex, &x, &x, &h, H3_BINARY_ADD));
    /* MLP */
    H3_CHECK(h3_op_rms_norm(ex, &h, &x, &n2, eps));
    H3_CHECK(linear(ex, &u, &h, &w[2], v));
    H3_CHECK(h3_op_swiglu(ex, &g, &u, 1));
    H3_CHECK(linear(ex, &m, &g, &w[3], v));
    H3_CHECK(h3_op_binary(ex, &x, &x, &m, H3_BINARY_ADD));
    memcpy(y, x.data, (size_t)(R * H) * sizeof(float));
done:
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) h3_tensor_free(all[i]);
    return st;
}

h3_status h3_qbench_run(h3_exec *ex, const h3_qbench_layer *layers, int n_layers,
                        const h3_qbench_block *block, int64_t rows, uint64_t seed, h3_qbench_result *out) {
    memset(out, 0, sizeof *out);
    if (n_layers > 64) return H3_ERR(H3_ERR_INVALID, "the table holds at most 64 layers");
    h3_status st = H3_OK;
    for (int l = 0; l < n_layers && st == H3_OK; l++) {
        const h3_qbench_layer *L = &layers[l];
        h3_tensor x = {0}, y = {0}, yq = {0}, wf;
        H3_CHECK(h3_tensor_alloc2(&x, H3_PLACE_HOST, H3_F32, rows, L->k, H3_MEM_WORKSPACE));
        H3_CHECK(h3_tensor_alloc2(&y, H3_PLACE_HOST, H3_F32, rows, L->n, H3_MEM_WORKSPACE));
        H3_CHECK(h3_tensor_alloc2(&yq, H3_PLACE_HOST, H3_F32, rows, L->n, H3_MEM_WORKSPACE));
        randn(x.data, rows * L->k, seed + (uint64_t)l * 7919u, 1.0);
        int64_t ws[2] = {L->n, L->k};
        H3_CHECK(h3_tensor_wrap(&wf, (void *)L->w, H3_PLACE_HOST, H3_F32, 2, ws));
        H3_CHECK(h3_op_gemm(ex, &y, &x, &wf, NULL, 0));
        for (int v = 0; v < H3_QV_COUNT; v++) {
            h3_tensor wq;
            h3_clear_error();
            h3_status qs = h3_quantize_tensor(L->w, L->n, L->k, weight_format((h3_qvariant)v), ex->pool, &wq);
            if (qs == H3_ERR_INVALID) { /* the format does not suit K */
                out->layer[l][v] = NAN;
                continue;
            }
            H3_CHECK(qs);
            st = linear(ex, &yq, &x, &wq, v);
            h3_tensor_free(&wq);
            if (st != H3_OK) goto done;
            out->layer[l][v] = rel_err(yq.data, y.data, rows * L->n);
        }
        out->n_layers = l + 1;
    done:
        h3_tensor_free(&x);
        h3_tensor_free(&y);
        h3_tensor_free(&yq);
    }
    if (st != H3_OK || !block) return st;
    const int64_t H = block->hidden, I = block->heads * block->head_dim, F = block->ffn;
    const int64_t ns[4] = {3 * I, H, 2 * F, H}, ks[4] = {H, I, H, F};
    const float *src[4] = {block->qkv, block->out, block->fc1, block->fc2};
    float *x = h3_malloc((size_t)(rows * H) * sizeof(float), H3_MEM_WORKSPACE);
    float *y = h3_malloc((size_t)(rows * H) * sizeof(float), H3_MEM_WORKSPACE);
    float *yq = h3_malloc((size_t)(rows * H) * sizeof(float), H3_MEM_WORKSPACE);
    float *d0 = h3_malloc((size_t)(rows * H) * sizeof(float), H3_MEM_WORKSPACE);
    float *d1 = h3_malloc((size_t)(rows * H) * sizeof(float), H3_MEM_WORKSPACE);
    h3_tensor w[4];
    memset(w, 0, sizeof w);
    if (!x || !y || !yq || !d0 || !d1) {
        st = H3_ERR_NOMEM;
        goto out;
    }
    randn(x, rows * H, seed ^ 0xb10c, 1.0);
    for (int i = 0; i < 4; i++) {
        int64_t s[2] = {ns[i], ks[i]};
        h3_tensor_wrap(&w[i], (void *)src[i], H3_PLACE_HOST, H3_F32, 2, s);
    }
    st = block_forward(ex, block, w, -1, x, rows, y);
    for (int64_t i = 0; i < rows * H && st == H3_OK; i++) d0[i] = y[i] - x[i];
    for (int v = 0; v < H3_QV_COUNT && st == H3_OK; v++) {
        h3_tensor wq[4];
        memset(wq, 0, sizeof wq);
        int ok = 1;
        for (int i = 0; i < 4 && st == H3_OK && ok; i++) {
            h3_clear_error();
            h3_status qs =
                h3_quantize_tensor(src[i], ns[i], ks[i], weight_format((h3_qvariant)v), ex->pool, &wq[i]);
            if (qs == H3_ERR_INVALID)
                ok = 0;
            else
                st = qs;
        }
        if (st == H3_OK && ok) st = block_forward(ex, block, wq, v, x, rows, yq);
        for (int i = 0; i < 4; i++) h3_tensor_free(&wq[i]);
        if (st != H3_OK) break;
        if (!ok) {
            out->block_out[v] = out->block_update[v] = NAN;
            continue;
        }
        for (int64_t i = 0; i < rows * H; i++) d1[i] = yq[i] - x[i];
        out->block_out[v] = rel_err(yq, y, rows * H);
        out->block_update[v] = rel_err(d1, d0, rows * H);
    }
    out->has_block = st == H3_OK;
out:
    h3_free(x);
    h3_free(y);
    h3_free(yq);
    h3_free(d0);
    h3_free(d1);
    return st;
}

h3_status h3_qbench_source_random(int64_t hidden, int64_t heads, int64_t head_dim, int64_t ffn, uint64_t seed,
                                  h3_qbench_source *src) {
    memset(src, 0, sizeof *src);
    src->comp = H3_COMP_DIT;
    const int64_t H = hidden, I = heads * head_dim, F = ffn;
    const struct {
        const char *name;
        int64_t n, k;
    } L[4] = {{"blocks.0.attn.qkv_proj.weight", 3 * I, H},
              {"blocks.0.attn.out_proj.weight", H, I},
              {"blocks.0.mlp.fc1.weight", 2 * F, H},
              {"blocks.0.mlp.fc2.weight", H, F}};
    for (int i = 0; i < 4; i++) {
        float *w = h3_malloc((size_t)(L[i].n * L[i].k) * sizeof(float), H3_MEM_WEIGHTS);
        if (!w) {
            h3_qbench_source_free(src);
            return H3_ERR_NOMEM;
        }
        src->bufs[src->n_bufs++] = w;
        randn(w, L[i].n * L[i].k, seed + (uint64_t)i, 1.0 / sqrt((double)L[i].k));
        /* bf16 values, as the stored weights are */
        for (int64_t j = 0; j < L[i].n * L[i].k; j++) w[j] = h3_bf16_to_f32(h3_f32_to_bf16(w[j]));
        snprintf(src->layers[i].name, sizeof src->layers[i].name, "%s", L[i].name);
        src->layers[i].w = w;
        src->layers[i].n = L[i].n;
        src->layers[i].k = L[i].k;
    }
    src->n_layers = 4;
    const int64_t nv[4] = {H, H, head_dim, head_dim};
    const float *nvp[4];
    for (int i = 0; i < 4; i++) {
        float *v = h3_malloc((size_t)nv[i] * sizeof(float), H3_MEM_WEIGHTS);
        if (!v) {
            h3_qbench_source_free(src);
            return H3_ERR_NOMEM;
        }
        src->bufs[src->n_bufs++] = v;
        randn(v, nv[i], seed + 100 + (uint64_t)i, 0.1);
        for (int64_t j = 0; j < nv[i]; j++) v[j] += 1.0f;
        nvp[i] = v;
    }
    h3_qbench_block *b = &src->block;
    b->qkv = src->layers[0].w;
    b->out = src->layers[1].w;
    b->fc1 = src->layers[2].w;
    b->fc2 = src->layers[3].w;
    b->norm1 = nvp[0];
    b->norm2 = nvp[1];
    b->q_norm = nvp[2];
    b->k_norm = nvp[3];
    b->hidden = H;
    b->heads = heads;
    b->head_dim = head_dim;
    b->ffn = F;
    b->eps = 1e-5;
    src->has_block = 1;
    return H3_OK;
}

void h3_qbench_source_free(h3_qbench_source *src) {
    for (int i = 0; i < src->n_bufs; i++) h3_free(src->bufs[i]);
    memset(src, 0, sizeof *src);
}

void h3_qbench_print(FILE *f, const h3_qbench_source *src, const h3_qbench_result *r) {
    fprintf(f, "relative error vs the bf16 weights (||Y_q - Y|| / ||Y||, random N(0,1) activations):\n");
    fprintf(f, "%-52s", "layer [N, K]");
    for (int v = 0; v < H3_QV_COUNT; v++) fprintf(f, " %17s", h3_qvariant_name((h3_qvariant)v));
    fprintf(f, "\n");
    for (int l = 0; l < r->n_layers; l++) {
        char nm[96];
        snprintf(nm, sizeof nm, "%s [%lld, %lld]", src->layers[l].name, (long long)src->layers[l].n,
                 (long long)src->layers[l].k);
        fprintf(f, "%-52s", nm);
        for (int v = 0; v < H3_QV_COUNT; v++) {
            if (isnan(r->layer[l][v]))
                fprintf(f, " %17s", "-");
            else
                fprintf(f, " %17.4f", r->layer[l][v]);
        }
        fprintf(f, "\n");
    }
    if (r->has_block) {
        const char *rows[2] = {"DiT block 0 output (x + attn + mlp)", "DiT block 0 update (output - x)"};
        const double *vals[2] = {r->block_out, r->block_update};
        for (int k = 0; k < 2; k++) {
            fprintf(f, "%-52s", rows[k]);
            for (int v = 0; v < H3_QV_COUNT; v++) {
                if (isnan(vals[k][v]))
                    fprintf(f, " %17s", "-");
                else
                    fprintf(f, " %17.4f", vals[k][v]);
            }
            fprintf(f, "\n");
        }
    }
}

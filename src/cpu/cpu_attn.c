/* Attention on the CPU, flash-style: per (head, query block) an online softmax over key blocks, so memory is
 * O(threads × (BQ×BK + BQ×D)) whatever the sequence length. Tile products go through OpenBLAS (one BLAS
 * thread per pool thread while this runs). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu/cpu_internal.h"

enum { BQ = 64, BK = 256 };

typedef struct {
    const float *q, *k, *v;
    float *o;
    int64_t ldq, ldk, ldv, ldo; /* row strides */
    int64_t Sq, Sk, Hq, Hk, D, nqb;
    float scale; /* fp8: in base 2 (scale · log2 e) */
    int causal;
    float *ws; /* per thread: S[BQ*BK], O[BQ*D], m[BQ], l[BQ]; fp8: Q, K, V blocks and O [FB*D], m, l, s [FB] */
    size_t ws_per_thread;
    const float *vinv, *vs; /* fp8: [Hk·D] 448 / max|v| of each channel, and its scale */
} attn_ctx;

/* The operands' pointers, strides and shapes (nqb: query blocks of qb rows). */
static attn_ctx attn_ctx_of(h3_tensor *o, const h3_tensor *q, const h3_tensor *k, const h3_tensor *v, float scale,
                            unsigned flags, int64_t qb) {
    attn_ctx c;
    memset(&c, 0, sizeof c);
    c.q = q->data;
    c.k = k->data;
    c.v = v->data;
    c.o = o->data;
    c.ldq = q->stride[0];
    c.ldk = k->stride[0];
    c.ldv = v->stride[0];
    c.ldo = o->stride[0];
    c.Sq = q->shape[0];
    c.Sk = k->shape[0];
    c.Hq = q->shape[1];
    c.Hk = k->shape[1];
    c.D = q->shape[2];
    c.scale = scale;
    c.causal = (flags & H3_ATTN_CAUSAL) != 0;
    c.nqb = (c.Sq + qb - 1) / qb;
    return c;
}

static void attn_tasks(void *p, int64_t tb, int64_t te, int tid) {
    attn_ctx *c = p;
    float *S = c->ws + (size_t)tid * c->ws_per_thread;
    float *O = S + BQ * BK, *m = O + BQ * c->D, *l = m + BQ;
    int64_t D = c->D, group = c->Hq / c->Hk;
    int64_t shift = c->Sk - c->Sq; /* causal alignment when keys outnumber queries */
    for (int64_t t = tb; t < te; t++) {
        if (h3_cancel_requested()) return; /* the op reports the stop (ops.c) */
        int64_t h = t / c->nqb, qb = t % c->nqb;
        int64_t q0 = qb * BQ, nq = c->Sq - q0 < BQ ? c->Sq - q0 : BQ;
        int64_t hk = h / group;
        const float *Q = c->q + q0 * c->ldq + h * D;
        const float *Kh = c->k + hk * D, *Vh = c->v + hk * D;
        for (int64_t i = 0; i < nq; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        memset(O, 0, (size_t)(nq * D) * sizeof(float));
        int64_t kend = c->Sk;
        if (c->causal) {
            kend = q0 + nq + shift;
            if (kend > c->Sk) kend = c->Sk;
        }
        for (int64_t k0 = 0; k0 < kend; k0 += BK) {
            int64_t nk = kend - k0 < BK ? kend - k0 : BK;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)D, c->scale, Q, (int)c->ldq,
                        Kh + k0 * c->ldk, (int)c->ldk, 0.0f, S, (int)nk);
            for (int64_t i = 0; i < nq; i++) {
                float *s = S + i * nk;
                int64_t lim = nk;
                if (c->causal) {
                    lim = q0 + i + shift + 1 - k0; /* keys k0..k0+lim-1 visible */
                    if (lim > nk) lim = nk;
                    if (lim < 0) lim = 0;
                }
                float mx = m[i];
                for (int64_t j = 0; j < lim; j++) mx = s[j] > mx ? s[j] : mx;
                float corr = (m[i] == -INFINITY) ? 0.0f : expf(m[i] - mx);
                float sum = 0.0f;
                for (int64_t j = 0; j < lim; j++) {
                    s[j] = expf(s[j] - mx);
                    sum += s[j];
                }
                for (int64_t j = lim; j < nk; j++) s[j] = 0.0f;
                if (lim > 0) {
                    l[i] = l[i] * corr + sum;
                    m[i] = mx;
                    float *orow = O + i * D;
                    if (corr != 1.0f)
                        for (int64_t d = 0; d < D; d++) orow[d] *= corr;
                }
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)D, (int)nk, 1.0f, S, (int)nk,
                        Vh + k0 * c->ldv, (int)c->ldv, 1.0f, O, (int)D);
        }
        for (int64_t i = 0; i < nq; i++) {
            float *dst = c->o + (q0 + i) * c->ldo + h * D;
            float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
            for (int64_t d = 0; d < D; d++) dst[d] = O[i * D + d] * inv;
        }
    }
}

/* ---- fp8 attention (H3_ATTN_FP8): the device kernel's quantization, computed in f32
 * ----------------------------- The reference of attn_fp8.cuh (docs/CUDA.md "fp8 attention"): q and k in e4m3
 * with one scale per head and block of 128 rows, v with one per head and channel; per query row and block of
 * 128 keys, in order, the online softmax in f32 with its probabilities ·256 rounded to e4m3 before P·V. Any
 * head size. Each task quantizes the key blocks it reads (the same values every time: the scales depend on
 * the block only). */
enum { FB = 128 };


static float e4m3(float x) {
    return h3_fp8e4m3_to_f32(h3_f32_to_fp8e4m3(x));
}

/* rows [n, D] (ld) of one head into e4m3 values (as f32) in dst [FB, D]; returns the block's scale. */
static float fp8_block(float *dst, const float *src, int64_t ld, int64_t n, int64_t D) {
    float m = 0.0f;
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < D; d++) m = fmaxf(m, fabsf(src[r * ld + d]));
    const float inv = m > 0.0f ? 448.0f / m : 1.0f;
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < D; d++) dst[r * D + d] = e4m3(src[r * ld + d] * inv);
    return m > 0.0f ? m / 448.0f : 1.0f;
}

static void fp8_tasks(void *p, int64_t tb, int64_t te, int tid) {
    attn_ctx *c = p;
    const int64_t D = c->D, group = c->Hq / c->Hk, shift = c->Sk - c->Sq;
    float *Q = c->ws + (size_t)tid * c->ws_per_thread, *K = Q + FB * D, *V = K + FB * D, *O = V + FB * D;
    float *m = O + FB * D, *l = m + FB, *sc = l + FB;
    for (int64_t t = tb; t < te; t++) {
        if (h3_cancel_requested()) return;
        const int64_t h = t / c->nqb, qb = t % c->nqb, hk = h / group;
        const int64_t q0 = qb * FB, nq = c->Sq - q0 < FB ? c->Sq - q0 : FB;
        const float qs = fp8_block(Q, c->q + q0 * c->ldq + h * D, c->ldq, nq, D);
        const float qsc = c->scale * qs;
        for (int64_t i = 0; i < nq; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        memset(O, 0, (size_t)(nq * D) * sizeof(float));
        int64_t kend = c->Sk;
        if (c->causal) {
            kend = q0 + FB + shift;
            if (kend > c->Sk) kend = c->Sk;
            if (kend < 0) kend = 0;
        }
        for (int64_t k0 = 0; k0 < kend; k0 += FB) {
            const int64_t nk = c->Sk - k0 < FB ? c->Sk - k0 : FB;
            const float ks = fp8_block(K, c->k + k0 * c->ldk + hk * D, c->ldk, nk, D);
            for (int64_t r = 0; r < nk; r++)
                for (int64_t d = 0; d < D; d++)
                    V[r * D + d] = e4m3(c->v[(k0 + r) * c->ldv + hk * D + d] * c->vinv[hk * D + d]);
            const float f = qsc * ks;
            for (int64_t i = 0; i < nq; i++) {
                float mx = m[i];
                for (int64_t j = 0; j < nk; j++) {
                    const int64_t key = k0 + j;
                    if (c->causal && key > q0 + i + shift) {
                        sc[j] = -INFINITY;
                        continue;
                    }
                    float acc = 0.0f;
                    for (int64_t d = 0; d < D; d++) acc += Q[i * D + d] * K[j * D + d];
                    sc[j] = acc * f;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                const float corr = mx == -INFINITY ? 1.0f : exp2f(m[i] - mx),
                            b = mx == -INFINITY ? 0.0f : mx - 8.0f;
                float sum = 0.0f, *orow = O + i * D;
                for (int64_t d = 0; d < D; d++) orow[d] *= corr;
                for (int64_t j = 0; j < nk; j++) {
                    const float pj = exp2f(sc[j] - b);
                    sum += pj;
                    const float p8 = e4m3(pj);
                    if (p8 != 0.0f)
                        for (int64_t d = 0; d < D; d++) orow[d] += p8 * V[j * D + d];
                }
                l[i] = l[i] * corr + sum;
                m[i] = mx;
            }
        }
        for (int64_t i = 0; i < nq; i++) {
            float *dst = c->o + (q0 + i) * c->ldo + h * D;
            const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
            for (int64_t d = 0; d < D; d++) dst[d] = O[i * D + d] * inv * c->vs[hk * D + d];
        }
    }
}

static h3_status cpu_attention_fp8(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                                   const h3_tensor *v, float scale, unsigned flags) {
    attn_ctx c = attn_ctx_of(o, q, k, v, scale * 1.4426950408889634f, flags, FB);
    const int64_t D = c.D, HD = c.Hk * D;
    float *vsc = h3_malloc((size_t)(2 * HD) * sizeof(float), H3_MEM_WORKSPACE);
    if (!vsc) return H3_ERR_NOMEM;
    for (int64_t i = 0; i < HD; i++) vsc[i] = 0.0f;
    for (int64_t r = 0; r < c.Sk; r++)
        for (int64_t i = 0; i < HD; i++) vsc[i] = fmaxf(vsc[i], fabsf(c.v[r * c.ldv + i]));
    for (int64_t i = 0; i < HD; i++) {
        const float mx = vsc[i];
        vsc[i] = mx > 0.0f ? 448.0f / mx : 1.0f;
        vsc[HD + i] = mx > 0.0f ? mx / 448.0f : 1.0f;
    }
    c.vinv = vsc;
    c.vs = vsc + HD;
    const int nt = h3_pool_threads(ex->pool);
    c.ws_per_thread = (size_t)(4 * FB * D + 3 * FB);
    c.ws = h3_malloc((size_t)nt * c.ws_per_thread * sizeof(float), H3_MEM_WORKSPACE);
    if (!c.ws) {
        h3_free(vsc);
        return H3_ERR_NOMEM;
    }
    h3_parallel_for(ex->pool, c.Hq * c.nqb, 1, fp8_tasks, &c);
    h3_free(c.ws);
    h3_free(vsc);
    return H3_OK;
}

/* ---- int8 attention (H3_ATTN_INT8): the device kernel's quantization (attn_mma8.cuh, docs/CUDA.md "int8
 * attention") ------------------------------------------------------------------------------------------------
 * q and k in int8 with one scale per head and block of 64 rows, k less its mean over all keys; v in f16 scaled
 * per head and channel; per query row and block of 64 keys, in order, the online softmax in f32 with its
 * probabilities rounded to f16 before P·V. Integer dot products (exact, as the device's). Any head size. */
enum { IB = 64 };

/* rows [n, D] (ld) of one head, less mean[D] (or nothing), into int8 in dst [IB, D]; returns the block's scale. */
static float int8_block(int8_t *dst, const float *src, int64_t ld, int64_t n, int64_t D, const float *mean) {
    float m = 0.0f;
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < D; d++) m = fmaxf(m, fabsf(src[r * ld + d] - (mean ? mean[d] : 0.0f)));
    const float inv = m > 0.0f ? 127.0f / m : 1.0f;
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < D; d++) {
            long v = lrintf((src[r * ld + d] - (mean ? mean[d] : 0.0f)) * inv);
            dst[r * D + d] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    return m > 0.0f ? m / 127.0f : 1.0f;
}

typedef struct {
    attn_ctx c;
    const float *kmean; /* [Hk·D] */
} int8_ctx;

static void int8_tasks(void *p, int64_t tb, int64_t te, int tid) {
    const int8_ctx *x = p;
    const attn_ctx *c = &x->c;
    const int64_t D = c->D, group = c->Hq / c->Hk, shift = c->Sk - c->Sq;
    float *O = c->ws + (size_t)tid * c->ws_per_thread, *V = O + IB * D, *m = V + IB * D, *l = m + IB, *sc = l + IB;
    int8_t *Q = (int8_t *)(sc + IB), *K = Q + IB * D;
    for (int64_t t = tb; t < te; t++) {
        if (h3_cancel_requested()) return;
        const int64_t h = t / c->nqb, qb = t % c->nqb, hk = h / group;
        const int64_t q0 = qb * IB, nq = c->Sq - q0 < IB ? c->Sq - q0 : IB;
        const float qsc = c->scale * int8_block(Q, c->q + q0 * c->ldq + h * D, c->ldq, nq, D, NULL);
        for (int64_t i = 0; i < nq; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        memset(O, 0, (size_t)(nq * D) * sizeof(float));
        int64_t kend = c->Sk;
        if (c->causal) {
            kend = q0 + IB + shift;
            if (kend > c->Sk) kend = c->Sk;
            if (kend < 0) kend = 0;
        }
        for (int64_t k0 = 0; k0 < kend; k0 += IB) {
            const int64_t nk = c->Sk - k0 < IB ? c->Sk - k0 : IB;
            const float ks = int8_block(K, c->k + k0 * c->ldk + hk * D, c->ldk, nk, D, x->kmean + hk * D);
            for (int64_t r = 0; r < nk; r++)
                for (int64_t d = 0; d < D; d++)
                    V[r * D + d] =
                        h3_f16_to_f32(h3_f32_to_f16(c->v[(k0 + r) * c->ldv + hk * D + d] * c->vinv[hk * D + d]));
            const float f = qsc * ks;
            for (int64_t i = 0; i < nq; i++) {
                float mx = m[i];
                for (int64_t j = 0; j < nk; j++) {
                    if (c->causal && k0 + j > q0 + i + shift) {
                        sc[j] = -INFINITY;
                        continue;
                    }
                    int32_t acc = 0;
                    for (int64_t d = 0; d < D; d++) acc += (int32_t)Q[i * D + d] * K[j * D + d];
                    sc[j] = (float)acc * f;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                const float corr = mx == -INFINITY ? 1.0f : exp2f(m[i] - mx), b = mx == -INFINITY ? 0.0f : mx;
                float sum = 0.0f, *orow = O + i * D;
                for (int64_t d = 0; d < D; d++) orow[d] *= corr;
                for (int64_t j = 0; j < nk; j++) {
                    const float pj = exp2f(sc[j] - b);
                    sum += pj;
                    const float p16 = h3_f16_to_f32(h3_f32_to_f16(pj));
                    if (p16 != 0.0f)
                        for (int64_t d = 0; d < D; d++) orow[d] += p16 * V[j * D + d];
                }
                l[i] = l[i] * corr + sum;
                m[i] = mx;
            }
        }
        for (int64_t i = 0; i < nq; i++) {
            float *dst = c->o + (q0 + i) * c->ldo + h * D;
            const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
            for (int64_t d = 0; d < D; d++) dst[d] = O[i * D + d] * inv * c->vs[hk * D + d];
        }
    }
}

static h3_status cpu_attention_int8(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                                    const h3_tensor *v, float scale, unsigned flags) {
    int8_ctx x;
    x.c = attn_ctx_of(o, q, k, v, scale * 1.4426950408889634f, flags, IB);
    attn_ctx *c = &x.c;
    const int64_t D = c->D, HD = c->Hk * D;
    float *tab = h3_malloc((size_t)(3 * HD) * sizeof(float), H3_MEM_WORKSPACE);
    if (!tab) return H3_ERR_NOMEM;
    for (int64_t i = 0; i < HD; i++) {
        double sum = 0.0;
        float mx = 0.0f;
        for (int64_t r = 0; r < c->Sk; r++) {
            sum += c->k[r * c->ldk + i];
            mx = fmaxf(mx, fabsf(c->v[r * c->ldv + i]));
        }
        tab[i] = (float)(sum / (double)c->Sk);
        tab[HD + i] = mx > 0.0f ? 256.0f / mx : 1.0f;
        tab[2 * HD + i] = mx > 0.0f ? mx / 256.0f : 1.0f;
    }
    x.kmean = tab;
    c->vinv = tab + HD;
    c->vs = tab + 2 * HD;
    const int nt = h3_pool_threads(ex->pool);
    /* floats: O, V [IB·D], m, l, s [IB]; then int8 Q, K [IB·D] (rounded up to whole floats) */
    c->ws_per_thread = (size_t)(2 * IB * D + 3 * IB + (2 * IB * D + 3) / 4);
    c->ws = h3_malloc((size_t)nt * c->ws_per_thread * sizeof(float), H3_MEM_WORKSPACE);
    if (!c->ws) {
        h3_free(tab);
        return H3_ERR_NOMEM;
    }
    h3_parallel_for(ex->pool, c->Hq * c->nqb, 1, int8_tasks, &x);
    h3_free(c->ws);
    h3_free(tab);
    return H3_OK;
}

int64_t h3_cpu_attention_scratch_bytes(int threads, int64_t D) {
    return (int64_t)(threads > 0 ? threads : 1) * (BQ * BK + BQ * D + 2 * BQ) * (int64_t)sizeof(float);
}

h3_status cpu_attention(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k, const h3_tensor *v,
                        float scale, unsigned flags) {
    H3_TRY(cpu_need_f32(H3_OP_ATTENTION, "q", q));
    H3_TRY(cpu_need_f32(H3_OP_ATTENTION, "k", k));
    H3_TRY(cpu_need_f32(H3_OP_ATTENTION, "v", v));
    H3_TRY(cpu_need_f32(H3_OP_ATTENTION, "o", o));
    attn_ctx c = attn_ctx_of(o, q, k, v, scale, flags, BQ);
    if (c.Sq == 0) return H3_OK;
    if (c.Sk == 0) {
        for (int64_t i = 0; i < c.Sq; i++) memset(c.o + i * c.ldo, 0, (size_t)(c.Hq * c.D) * sizeof(float));
        return H3_OK;
    }
    if ((flags & H3_ATTN_FP8) && (flags & H3_ATTN_INT8))
        return H3_ERR(H3_ERR_INVALID, "op 'attention': fp8 and int8 attention are exclusive");
    if (flags & H3_ATTN_FP8) return cpu_attention_fp8(ex, o, q, k, v, scale, flags);
    if (flags & H3_ATTN_INT8) return cpu_attention_int8(ex, o, q, k, v, scale, flags);
    int nt = h3_pool_threads(ex->pool);
    c.ws_per_thread = (size_t)(BQ * BK + BQ * c.D + 2 * BQ);
    c.ws = h3_malloc((size_t)h3_cpu_attention_scratch_bytes(nt, c.D), H3_MEM_WORKSPACE);
    if (!c.ws) return H3_ERR_NOMEM;
    h3_cpu_blas_threads_push_single();
    h3_parallel_for(ex->pool, c.Hq * c.nqb, 1, attn_tasks, &c);
    h3_cpu_blas_threads_pop();
    h3_free(c.ws);
    return H3_OK;
}

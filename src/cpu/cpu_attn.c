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
    float scale; /* low-bit: in base 2 (scale · log2 e) */
    int causal;
    float *ws; /* per thread: S[BQ*BK], O[BQ*D], m[BQ], l[BQ]; low-bit: Q, K, V blocks and O [B*D], m, l, s [B] */
    size_t ws_per_thread;
    const float *vinv, *vs; /* low-bit: [Hk·D] 448 (fp8) or 256 (int8) / max|v| of each channel, and its scale */
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

/* ---- low-bit attention (H3_ATTN_FP8, H3_ATTN_INT8): the device kernels' quantization, computed in f32
 * ------------------------------------------------------------------------------------------------------------
 * The references of attn_fp8.cuh / attn_mma8.cuh (docs/CUDA.md "fp8 attention", "int8 attention"), at any
 * head size. Both: k less its mean over the keys, q and k in int8 with one scale per head and block of rows
 * (128 for fp8, 64 for int8; k's blocks of 192 for fp8 with H3_ATTN_FP8_K192, Hopper's tiles). fp8: v in e4m3
 * per head and channel, probabilities exp2(s − max + 8) as their e4m3 codes (fp8_p) before P·V. int8: v in
 * f16 scaled per head and channel, probabilities exp2(s − max) rounded to f16. Per query row and block of
 * keys (the scales' block), in order, the online softmax in f32 (fp8: l sums the e4m3 probabilities, as the
 * tensor cores do there; int8: the f32 ones). The int8 values are kept as floats: their dot products are
 * exact integers in f32 up to head size 1,040 (127² · D < 2²⁴). Each task quantizes the key blocks it reads
 * (the same values every time: the scales depend on the block only). */
typedef struct {
    attn_ctx c;
    int int8;
    int64_t blk;        /* query blocks: 128 (fp8) or 64 (int8) */
    int64_t kblk;       /* key blocks: blk, or 192 (fp8 with H3_ATTN_FP8_K192) */
    const float *kmean; /* [Hk·D] k's mean over the keys */
} lowbit_ctx;

static float e4m3(float x) {
    return h3_fp8e4m3_to_f32(h3_f32_to_fp8e4m3(x));
}

/* fp8's probability p = 2^x (x ≤ 8) as the e4m3 value of its code round(8x + 56 + H3_ATTN_FP8_CODE_SHIFT), 0
 * below (tensor/ops.h "H3_ATTN_FP8"; the device's fp8_p_code). */
static float fp8_p(float x) {
    const float c = rintf(8.0f * x + (56.0f + H3_ATTN_FP8_CODE_SHIFT));
    return c > 0.0f ? h3_fp8e4m3_to_f32((uint8_t)fminf(c, 126.0f)) : 0.0f;
}

static float f16r(float x) {
    return h3_f16_to_f32(h3_f32_to_f16(x));
}

/* rows [n, D] (ld) of one head, less mean[D] when given, quantized (as f32 values) into dst [n, D]; returns the
 * block's scale: x · 127 / max|x| rounded to nearest even. */
static float lowbit_block(float *dst, const float *src, int64_t ld, int64_t n, int64_t D, const float *mean) {
    const float top = 127.0f;
    float m = 0.0f;
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < D; d++) m = fmaxf(m, fabsf(src[r * ld + d] - (mean ? mean[d] : 0.0f)));
    const float inv = m > 0.0f ? top / m : 1.0f;
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < D; d++) {
            const float x = (src[r * ld + d] - (mean ? mean[d] : 0.0f)) * inv;
            dst[r * D + d] = fminf(fmaxf(nearbyintf(x), -127.0f), 127.0f);
        }
    return m > 0.0f ? m / top : 1.0f;
}

static void lowbit_tasks(void *p, int64_t tb, int64_t te, int tid) {
    const lowbit_ctx *x = p;
    const attn_ctx *c = &x->c;
    const int64_t D = c->D, B = x->blk, KB = x->kblk, group = c->Hq / c->Hk, shift = c->Sk - c->Sq;
    float *Q = c->ws + (size_t)tid * c->ws_per_thread, *K = Q + B * D, *V = K + KB * D, *O = V + KB * D;
    float *m = O + B * D, *l = m + B, *sc = l + B;
    const float off = x->int8 ? 0.0f : 8.0f; /* fp8: probabilities up to 256, e4m3's range */
    for (int64_t t = tb; t < te; t++) {
        if (h3_cancel_requested()) return;
        const int64_t h = t / c->nqb, qb = t % c->nqb, hk = h / group;
        const int64_t q0 = qb * B, nq = c->Sq - q0 < B ? c->Sq - q0 : B;
        const float qsc = c->scale * lowbit_block(Q, c->q + q0 * c->ldq + h * D, c->ldq, nq, D, NULL);
        for (int64_t i = 0; i < nq; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        memset(O, 0, (size_t)(nq * D) * sizeof(float));
        int64_t kend = c->Sk;
        if (c->causal) {
            kend = q0 + B + shift;
            if (kend > c->Sk) kend = c->Sk;
            if (kend < 0) kend = 0;
        }
        for (int64_t k0 = 0; k0 < kend; k0 += KB) {
            const int64_t nk = c->Sk - k0 < KB ? c->Sk - k0 : KB;
            const float ks = lowbit_block(K, c->k + k0 * c->ldk + hk * D, c->ldk, nk, D, x->kmean + hk * D);
            for (int64_t r = 0; r < nk; r++)
                for (int64_t d = 0; d < D; d++) {
                    const float vv = c->v[(k0 + r) * c->ldv + hk * D + d] * c->vinv[hk * D + d];
                    V[r * D + d] = x->int8 ? f16r(vv) : e4m3(vv);
                }
            const float f = qsc * ks;
            for (int64_t i = 0; i < nq; i++) {
                float mx = m[i];
                for (int64_t j = 0; j < nk; j++) {
                    if (c->causal && k0 + j > q0 + i + shift) {
                        sc[j] = -INFINITY;
                        continue;
                    }
                    float acc = 0.0f;
                    for (int64_t d = 0; d < D; d++) acc += Q[i * D + d] * K[j * D + d];
                    sc[j] = acc * f;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                const float corr = mx == -INFINITY ? 1.0f : exp2f(m[i] - mx),
                            b = mx == -INFINITY ? 0.0f : mx - off;
                float sum = 0.0f, *orow = O + i * D;
                for (int64_t d = 0; d < D; d++) orow[d] *= corr;
                for (int64_t j = 0; j < nk; j++) {
                    const float pj = x->int8 ? exp2f(sc[j] - b) : 0.0f;
                    const float pr = x->int8 ? f16r(pj) : fp8_p(sc[j] - b);
                    sum += x->int8 ? pj : pr; /* fp8: l sums the probabilities P·V took */
                    if (pr != 0.0f)
                        for (int64_t d = 0; d < D; d++) orow[d] += pr * V[j * D + d];
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

static h3_status cpu_attention_lowbit(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                                      const h3_tensor *v, float scale, unsigned flags) {
    lowbit_ctx x;
    x.int8 = (flags & H3_ATTN_INT8) != 0;
    x.blk = x.int8 ? 64 : 128;
    x.kblk = !x.int8 && (flags & H3_ATTN_FP8_K192) ? 192 : x.blk;
    x.c = attn_ctx_of(o, q, k, v, scale * 1.4426950408889634f, flags, x.blk);
    attn_ctx *c = &x.c;
    const int64_t D = c->D, HD = c->Hk * D;
    /* v's scales per channel (max|v| onto 448, or onto 256 in f16) and k's means */
    const float top = x.int8 ? 256.0f : 448.0f;
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
        tab[HD + i] = mx > 0.0f ? top / mx : 1.0f;
        tab[2 * HD + i] = mx > 0.0f ? mx / top : 1.0f;
    }
    x.kmean = tab;
    c->vinv = tab + HD;
    c->vs = tab + 2 * HD;
    const int nt = h3_pool_threads(ex->pool);
    c->ws_per_thread = (size_t)(2 * (x.blk + x.kblk) * D + 2 * x.blk + x.kblk);
    c->ws = h3_malloc((size_t)nt * c->ws_per_thread * sizeof(float), H3_MEM_WORKSPACE);
    if (!c->ws) {
        h3_free(tab);
        return H3_ERR_NOMEM;
    }
    h3_parallel_for(ex->pool, c->Hq * c->nqb, 1, lowbit_tasks, &x);
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
    if (flags & (H3_ATTN_FP8 | H3_ATTN_INT8)) return cpu_attention_lowbit(ex, o, q, k, v, scale, flags);
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

/* ---- block-sparse attention (tensor/ops.h h3_op_attention_sparse) ----------------------------------------
 * The host's rendering, a reference in double precision: per (head, query tile) the tile's selection
 * (h3_sparse_score, h3_sparse_threshold, h3_sparse_exact), then per query row a two-pass softmax over the exact
 * tiles' keys and the other tiles' centroids. */
enum { SP_T = H3_SPARSE_TILE };

typedef struct {
    attn_ctx a; /* the operands (attn_ctx_of: Sq = Sk = S, Hq = Hk = H, nqb = the tiles) */
    double scale_log2;
    double tau;
    const uint8_t *exact_tiles;
    const double *qc, *kc;   /* [H][nt][D] centroids in double */
    const float *kcb, *vcb;  /* [H][nt][D] centroids rounded to bf16 */
    double *ws;              /* per thread: r [nt], scores [S + nt] */
    int64_t *n_exact;        /* [H·nt]: exact key tiles of each (head, query tile) */
    size_t ws_per_thread;
} sparse_ctx;

static int64_t sp_len(int64_t S, int64_t t) {
    return S - t * SP_T < SP_T ? S - t * SP_T : SP_T;
}

static void sparse_centroids(void *p, int64_t tb, int64_t te, int tid) {
    (void)tid;
    sparse_ctx *c = p;
    double *qc = (double *)c->qc, *kc = (double *)c->kc;
    float *kcb = (float *)c->kcb, *vcb = (float *)c->vcb;
    for (int64_t t = tb; t < te; t++) {
        const int64_t h = t / c->a.nqb, j = t % c->a.nqb, n = sp_len(c->a.Sq, j), D = c->a.D;
        double *cq = qc + t * D, *ck = kc + t * D;
        for (int64_t d = 0; d < D; d++) {
            double sq = 0.0, sk = 0.0, sv = 0.0;
            for (int64_t r = j * SP_T; r < j * SP_T + n; r++) {
                sq += (double)c->a.q[r * c->a.ldq + h * D + d];
                sk += (double)c->a.k[r * c->a.ldk + h * D + d];
                sv += (double)c->a.v[r * c->a.ldv + h * D + d];
            }
            cq[d] = sq / (double)n;
            ck[d] = sk / (double)n;
            kcb[t * D + d] = h3_bf16_to_f32(h3_f32_to_bf16((float)ck[d]));
            vcb[t * D + d] = h3_bf16_to_f32(h3_f32_to_bf16((float)(sv / (double)n)));
        }
    }
}

static void sparse_tasks(void *p, int64_t tb, int64_t te, int tid) {
    sparse_ctx *c = p;
    const int64_t D = c->a.D, nt = c->a.nqb;
    double *r = c->ws + (size_t)tid * c->ws_per_thread, *sc = r + nt;
    unsigned char *exact = (unsigned char *)(sc + c->a.Sq + nt);
    for (int64_t t = tb; t < te; t++) {
        if (h3_cancel_requested()) return;
        const int64_t h = t / nt, i = t % nt;
        const int q_exact = c->exact_tiles && c->exact_tiles[i];
        for (int64_t j = 0; j < nt; j++)
            r[j] = h3_sparse_score(c->qc + (h * nt + i) * D, c->kc + (h * nt + j) * D, (int)D, c->scale_log2);
        const double thr = h3_sparse_threshold(r, (int)nt, c->tau);
        int64_t ne = 0;
        for (int64_t j = 0; j < nt; j++) {
            exact[j] = (unsigned char)h3_sparse_exact((int)i, (int)j, r[j], thr, q_exact,
                                                      c->exact_tiles && c->exact_tiles[j]);
            ne += exact[j];
        }
        c->n_exact[t] = ne;
        for (int64_t row = i * SP_T; row < i * SP_T + sp_len(c->a.Sq, i); row++) {
            const float *qr = c->a.q + row * c->a.ldq + h * D;
            int64_t n = 0;
            double mx = -INFINITY;
            for (int64_t j = 0; j < nt; j++) {
                if (exact[j]) {
                    for (int64_t key = j * SP_T; key < j * SP_T + sp_len(c->a.Sq, j); key++) {
                        const float *kr = c->a.k + key * c->a.ldk + h * D;
                        double s = 0.0;
                        for (int64_t d = 0; d < D; d++) s += (double)qr[d] * kr[d];
                        sc[n] = s * c->a.scale;
                        mx = sc[n] > mx ? sc[n] : mx;
                        n++;
                    }
                } else {
                    const float *kr = c->kcb + (h * nt + j) * D;
                    double s = 0.0;
                    for (int64_t d = 0; d < D; d++) s += (double)qr[d] * kr[d];
                    sc[n] = s * c->a.scale + log((double)sp_len(c->a.Sq, j));
                    mx = sc[n] > mx ? sc[n] : mx;
                    n++;
                }
            }
            double l = 0.0;
            for (int64_t e = 0; e < n; e++) {
                sc[e] = exp(sc[e] - mx);
                l += sc[e];
            }
            float *orow = c->a.o + row * c->a.ldo + h * D;
            for (int64_t d = 0; d < D; d++) {
                double acc = 0.0;
                int64_t e = 0;
                for (int64_t j = 0; j < nt; j++) {
                    if (exact[j]) {
                        for (int64_t key = j * SP_T; key < j * SP_T + sp_len(c->a.Sq, j); key++)
                            acc += sc[e++] * c->a.v[key * c->a.ldv + h * D + d];
                    } else {
                        acc += sc[e++] * c->vcb[(h * nt + j) * D + d];
                    }
                }
                orow[d] = (float)(acc / l);
            }
        }
    }
}

h3_status cpu_attention_sparse(h3_exec *ex, h3_tensor *o, const h3_tensor *q, const h3_tensor *k,
                               const h3_tensor *v, float scale, const h3_sparse_attn *p) {
    H3_TRY(cpu_need_f32(H3_OP_ATTENTION_SPARSE, "q", q));
    H3_TRY(cpu_need_f32(H3_OP_ATTENTION_SPARSE, "k", k));
    H3_TRY(cpu_need_f32(H3_OP_ATTENTION_SPARSE, "v", v));
    H3_TRY(cpu_need_f32(H3_OP_ATTENTION_SPARSE, "o", o));
    sparse_ctx c;
    memset(&c, 0, sizeof c);
    c.a = attn_ctx_of(o, q, k, v, scale, 0, SP_T);
    c.scale_log2 = (double)(scale * 1.4426950408889634f); /* the device's float constant, so both select alike */
    c.tau = p->tau;
    c.exact_tiles = p->exact_tiles;
    if (c.a.Sq == 0) return H3_OK;
    const int64_t cn = c.a.Hq * c.a.nqb * c.a.D;
    const int nthr = h3_pool_threads(ex->pool);
    c.ws_per_thread = (size_t)(c.a.nqb + c.a.Sq + c.a.nqb) + (size_t)(c.a.nqb + 7) / 8;
    void *cent = h3_malloc((size_t)cn * (2 * sizeof(double) + 2 * sizeof(float)) + (size_t)(c.a.Hq * c.a.nqb) * 8,
                           H3_MEM_WORKSPACE);
    c.ws = h3_malloc((size_t)nthr * c.ws_per_thread * sizeof(double), H3_MEM_WORKSPACE);
    if (!cent || !c.ws) {
        h3_free(cent);
        h3_free(c.ws);
        return H3_ERR_NOMEM;
    }
    c.qc = cent;
    c.kc = c.qc + cn;
    c.kcb = (const float *)(c.kc + cn);
    c.vcb = c.kcb + cn;
    c.n_exact = (int64_t *)(c.vcb + cn);
    h3_parallel_for(ex->pool, c.a.Hq * c.a.nqb, 1, sparse_centroids, &c);
    h3_parallel_for(ex->pool, c.a.Hq * c.a.nqb, 1, sparse_tasks, &c);
    if (p->n_exact) {
        *p->n_exact = 0;
        for (int64_t t = 0; t < c.a.Hq * c.a.nqb; t++) *p->n_exact += c.n_exact[t];
    }
    h3_free(c.ws);
    h3_free(cent);
    return H3_OK;
}

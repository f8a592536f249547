/* Qwen2 byte-level BPE from tokenizer.json. The contract is in tokenizer.h; the steps below follow it in order. */
#include "io/tokenizer.h"

#include <string.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "io/unicode_data.h"

/* The pre-tokenizer pattern of Qwen2/Qwen3 tokenizer.json files (as it appears in the JSON, unescaped). */
static const char k_qwen_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

#define TOK_MAX_FILE (512u << 20)
#define NO_TOKEN UINT32_MAX
/* Ids index per-id tables (8 bytes an id), so the largest id sizes them: it must lie below the larger of
 * TOK_ID_FLOOR and twice the entries the file holds (vocab and added tokens). Qwen's ids (151,936 embedding
 * rows) lie below the floor whatever the file; a file of a few entries naming id 2^30 is refused instead of
 * taking gigabytes. */
#define TOK_ID_FLOOR (1 << 18)

typedef struct added_tok {
    char *text;
    size_t len;
    int32_t id;
    uint8_t normalized, lstrip, rstrip;
} added_tok;

struct h3_tokenizer {
    int32_t n_ids;       /* one past the largest id */
    uint32_t *off, *len; /* [n_ids] bytes of each id in pool; len == NO_TOKEN: the id names nothing */
    char *pool;
    size_t pool_len, pool_cap;
    int32_t *vhash; /* BPE vocab ids by their bytes (open addressing, -1 empty) */
    uint64_t vmask;
    uint64_t *mkey; /* merges: (left id << 32 | right id) -> rank and result id; key UINT64_MAX is empty */
    uint32_t *mrank;
    int32_t *mres;
    uint64_t mmask;
    int32_t byte_id[256]; /* id of the single-byte token of each byte */
    added_tok *added;
    int n_added, n_added_normalized;
    uint8_t added_first[256]; /* bit 0: some non-normalized added token starts with this byte; bit 1: normalized */
    int nfc, ignore_merges;
};

/* ---- hashing ---------------------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return mix64(h);
}

static uint64_t table_size_for(uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    return cap;
}

static int32_t vocab_find(const h3_tokenizer *t, const char *s, size_t n) {
    if (!t->vhash) return -1;
    for (uint64_t h = hash_bytes(s, n) & t->vmask;; h = (h + 1) & t->vmask) {
        int32_t id = t->vhash[h];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->pool + t->off[id], s, n) == 0) return id;
    }
}

static void vocab_insert(h3_tokenizer *t, int32_t id) {
    uint64_t h = hash_bytes(t->pool + t->off[id], t->len[id]) & t->vmask;
    while (t->vhash[h] >= 0) h = (h + 1) & t->vmask;
    t->vhash[h] = id;
}

static int merge_find(const h3_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *res) {
    if (!t->mkey) return 0;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t h = mix64(key) & t->mmask;; h = (h + 1) & t->mmask) {
        if (t->mkey[h] == UINT64_MAX) return 0;
        if (t->mkey[h] == key) {
            *rank = t->mrank[h];
            *res = t->mres[h];
            return 1;
        }
    }
}

/* ---- UTF-8 ------------------------------------------------------------------------------------------------ */

/* Decodes one code point at s[*i] (strict: no overlong forms, surrogates or values past U+10FFFF). Returns 0 and
 * leaves *i when the bytes there are not valid UTF-8. */
static int utf8_next(const uint8_t *s, size_t n, size_t *i, uint32_t *cp) {
    size_t p = *i;
    uint8_t c = s[p];
    if (c < 0x80) {
        *cp = c;
        *i = p + 1;
        return 1;
    }
    int len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) len = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (n - p < (size_t)len) return 0;
    for (int k = 1; k < len; k++) {
        uint8_t d = s[p + (size_t)k];
        if ((d & 0xC0) != 0x80) return 0;
        v = v << 6 | (d & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    *i = p + (size_t)len;
    return 1;
}

static int utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Offset of the first invalid byte, or n when all of s is valid UTF-8. */
static size_t utf8_check(const char *s, size_t n) {
    size_t i = 0;
    uint32_t cp;
    while (i < n) {
        if ((uint8_t)s[i] < 0x80) {
            i++;
            continue;
        }
        if (!utf8_next((const uint8_t *)s, n, &i, &cp)) return i;
    }
    return n;
}

/* ---- growing buffers -------------------------------------------------------------------------------------- */

static h3_status grow(void **p, size_t *cap, size_t need, size_t elem, h3_mem_category cat) {
    if (need <= *cap) return H3_OK;
    size_t nc = *cap ? *cap : 64, bytes;
    while (nc < need) nc *= 2;
    if (!h3_mul_size(nc, elem, &bytes)) return H3_ERR(H3_ERR_NOMEM, "tokenizer buffer of %zu elements overflows", nc);
    void *q = h3_realloc(*p, bytes, cat);
    if (!q) return H3_ERR_NOMEM;
    *p = q;
    *cap = nc;
    return H3_OK;
}

/* ---- NFC -------------------------------------------------------------------------------------------------- */

enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7 };
enum { HANGUL_LN = 19, HANGUL_VN = 21, HANGUL_TN = 28, HANGUL_SN = 19 * 21 * 28 };

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_LN && b >= HANGUL_V && b < HANGUL_V + HANGUL_VN)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_VN + (b - HANGUL_V)) * HANGUL_TN;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_SN && (a - HANGUL_S) % HANGUL_TN == 0 && b > HANGUL_T &&
        b < HANGUL_T + HANGUL_TN)
        return a + (b - HANGUL_T);
    return h3_uc_compose(a, b);
}

typedef struct nfc_buf {
    uint32_t *d;
    size_t cap;
    uint32_t *tmp; /* the canonical ordering's scratch for long runs of marks */
    size_t tmp_cap;
} nfc_buf;

/* Canonical ordering of one run of non-starters d[0..n) (all of combining class > 0): a stable sort by class.
 * Short runs (what text holds) by insertion; long ones by counting, so that a run of a million marks costs a
 * million steps, not a million squared. */
static h3_status order_marks(uint32_t *d, size_t n, nfc_buf *b) {
    if (n < 32) {
        for (size_t i = 1; i < n; i++) {
            uint32_t c = d[i];
            int cc = h3_uc_ccc(c);
            size_t j = i;
            while (j > 0 && h3_uc_ccc(d[j - 1]) > cc) {
                d[j] = d[j - 1];
                j--;
            }
            d[j] = c;
        }
        return H3_OK;
    }
    H3_TRY(grow((void **)&b->tmp, &b->tmp_cap, n, sizeof *b->tmp, H3_MEM_WORKSPACE));
    size_t start[257] = {0};
    for (size_t i = 0; i < n; i++) start[h3_uc_ccc(d[i]) + 1]++;
    for (int c = 0; c < 256; c++) start[c + 1] += start[c];
    for (size_t i = 0; i < n; i++) b->tmp[start[h3_uc_ccc(d[i])]++] = d[i];
    memcpy(d, b->tmp, n * sizeof *d);
    return H3_OK;
}

/* NFC of the code points cp[0..n): canonical decomposition, canonical ordering, canonical composition
 * (Unicode Standard Annex #15). The result goes to b->d, its length to *out_n. */
static h3_status nfc_cps(const uint32_t *cp, size_t n, nfc_buf *b, size_t *out_n) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        H3_TRY(grow((void **)&b->d, &b->cap, m + 32, sizeof *b->d, H3_MEM_WORKSPACE));
        uint32_t c = cp[i];
        const uint32_t *dec;
        int dn;
        if (c >= HANGUL_S && c < HANGUL_S + HANGUL_SN) {
            uint32_t s = c - HANGUL_S;
            b->d[m++] = HANGUL_L + s / (HANGUL_VN * HANGUL_TN);
            b->d[m++] = HANGUL_V + s % (HANGUL_VN * HANGUL_TN) / HANGUL_TN;
            if (s % HANGUL_TN) b->d[m++] = HANGUL_T + s % HANGUL_TN;
        } else if ((dn = h3_uc_decompose(c, &dec)) > 0) {
            for (int k = 0; k < dn; k++) b->d[m++] = dec[k];
        } else {
            b->d[m++] = c;
        }
    }
    uint32_t *d = b->d;
    /* Canonical ordering: every run of non-starters sorted by combining class, stably. */
    for (size_t i = 0; i < m;) {
        if (h3_uc_ccc(d[i]) == 0) {
            i++;
            continue;
        }
        size_t e = i + 1;
        while (e < m && h3_uc_ccc(d[e]) != 0) e++;
        H3_TRY(order_marks(d + i, e - i, b));
        i = e;
    }
    /* Canonical composition: a character joins the last starter unless something between them blocks it
     * (a starter, or a mark of the same or higher class). */
    size_t o = 0;
    int64_t starter = -1;
    int last_cc = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t c = d[i];
        int cc = h3_uc_ccc(c);
        if (starter >= 0 && ((size_t)starter == o - 1 || (last_cc != 0 && last_cc < cc))) {
            uint32_t comp = compose_pair(d[starter], c);
            if (comp) {
                d[starter] = comp;
                continue;
            }
        }
        if (cc == 0) starter = (int64_t)o;
        last_cc = cc;
        d[o++] = c;
    }
    *out_n = o;
    return H3_OK;
}

/* ---- the encoder's workspace ------------------------------------------------------------------------------ */

typedef struct sym {
    int32_t id, prev, next;
} sym;

typedef struct heap_ent {
    uint32_t rank;
    int32_t pos, a, b, res;
} heap_ent;

typedef struct enc_ws {
    uint32_t *cp;
    size_t cp_cap;
    nfc_buf nfc;
    char *u8;
    size_t u8_cap;
    size_t *boff;
    size_t boff_cap;
    uint8_t *cls;
    size_t cls_cap;
    sym *sy;
    size_t sy_cap;
    heap_ent *hp;
    size_t hp_cap, hp_n;
    int32_t *ids;
    size_t ids_cap;
    int64_t n_ids;
} enc_ws;

static void ws_free(enc_ws *w) {
    h3_free(w->cp);
    h3_free(w->nfc.d);
    h3_free(w->nfc.tmp);
    h3_free(w->u8);
    h3_free(w->boff);
    h3_free(w->cls);
    h3_free(w->sy);
    h3_free(w->hp);
    h3_free(w->ids);
}

static h3_status emit(enc_ws *w, int32_t id) {
    H3_TRY(grow((void **)&w->ids, &w->ids_cap, (size_t)w->n_ids + 1, sizeof *w->ids, H3_MEM_IO));
    w->ids[w->n_ids++] = id;
    return H3_OK;
}

/* ---- BPE -------------------------------------------------------------------------------------------------- */

static int heap_less(const heap_ent *x, const heap_ent *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static h3_status heap_push(enc_ws *w, heap_ent e) {
    H3_TRY(grow((void **)&w->hp, &w->hp_cap, w->hp_n + 1, sizeof *w->hp, H3_MEM_WORKSPACE));
    size_t i = w->hp_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &w->hp[p])) break;
        w->hp[i] = w->hp[p];
        i = p;
    }
    w->hp[i] = e;
    return H3_OK;
}

static heap_ent heap_pop(enc_ws *w) {
    heap_ent top = w->hp[0], last = w->hp[--w->hp_n];
    size_t i = 0, n = w->hp_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&w->hp[c + 1], &w->hp[c])) c++;
        if (!heap_less(&w->hp[c], &last)) break;
        w->hp[i] = w->hp[c];
        i = c;
    }
    if (n) w->hp[i] = last;
    return top;
}

/* Queues the pair that starts at symbol k, when the merge list has it. */
static h3_status push_pair(const h3_tokenizer *t, enc_ws *w, int32_t k) {
    int32_t nx = w->sy[k].next;
    if (nx < 0) return H3_OK;
    heap_ent e = {0, k, w->sy[k].id, w->sy[nx].id, 0};
    if (!merge_find(t, e.a, e.b, &e.rank, &e.res)) return H3_OK;
    return heap_push(w, e);
}

/* One pre-tokenized piece (raw bytes) through BPE; its ids are appended to the output. */
static h3_status bpe_piece(const h3_tokenizer *t, enc_ws *w, const char *s, size_t n) {
    if (n == 1) return emit(w, t->byte_id[(uint8_t)s[0]]);
    if (t->ignore_merges) {
        int32_t id = vocab_find(t, s, n);
        if (id >= 0) return emit(w, id);
    }
    if (n > INT32_MAX) return H3_ERR(H3_ERR_INVALID, "a piece of %zu bytes is too long to tokenize", n);
    H3_TRY(grow((void **)&w->sy, &w->sy_cap, n, sizeof *w->sy, H3_MEM_WORKSPACE));
    for (size_t k = 0; k < n; k++) {
        w->sy[k].id = t->byte_id[(uint8_t)s[k]];
        w->sy[k].prev = (int32_t)k - 1;
        w->sy[k].next = k + 1 < n ? (int32_t)k + 1 : -1;
    }
    w->hp_n = 0;
    for (size_t k = 0; k + 1 < n; k++) H3_TRY(push_pair(t, w, (int32_t)k));
    while (w->hp_n) {
        heap_ent e = heap_pop(w);
        sym *a = &w->sy[e.pos];
        if (a->id != e.a || a->next < 0) continue; /* stale: the left symbol changed or was absorbed */
        sym *b = &w->sy[a->next];
        if (b->id != e.b) continue;
        a->id = e.res;
        a->next = b->next;
        if (b->next >= 0) w->sy[b->next].prev = e.pos;
        b->id = -1; /* absorbed */
        if (a->prev >= 0) H3_TRY(push_pair(t, w, a->prev));
        H3_TRY(push_pair(t, w, e.pos));
    }
    for (int32_t k = 0; k >= 0; k = w->sy[k].next) H3_TRY(emit(w, w->sy[k].id));
    return H3_OK;
}

/* ---- pre-tokenizer ---------------------------------------------------------------------------------------- */

static int is_crlf(uint32_t c) {
    return c == '\r' || c == '\n';
}

/* Letters whose simple case folding is s, t, r, e, v, m, l or d: the ASCII pair, and U+017F (long s), which
 * folds to s in a case-insensitive Unicode match. */
static uint32_t fold_contraction_letter(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c == 0x17F) return 's';
    return c;
}

/* End (exclusive) of the match of Qwen's pattern at cp[i]; every position matches one alternative, with at least
 * one code point. The alternatives are tried in the pattern's order, with the backtracking a regex engine does. */
static size_t match_at(const uint32_t *cp, const uint8_t *cl, size_t i, size_t n) {
    uint32_t c = cp[i];
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (c == '\'' && i + 1 < n) {
        uint32_t a = fold_contraction_letter(cp[i + 1]);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            uint32_t b = fold_contraction_letter(cp[i + 2]);
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    size_t j = n;
    if (cl[i] == H3_UC_LETTER) j = i;
    else if (!is_crlf(c) && cl[i] != H3_UC_NUMBER && i + 1 < n && cl[i + 1] == H3_UC_LETTER) j = i + 1;
    if (j < n) {
        while (j < n && cl[j] == H3_UC_LETTER) j++;
        return j;
    }
    /* \p{N} */
    if (cl[i] == H3_UC_NUMBER) return i + 1;
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    j = (c == ' ' && i + 1 < n && cl[i + 1] == H3_UC_OTHER) ? i + 1 : i;
    if (cl[j] == H3_UC_OTHER) {
        while (j < n && cl[j] == H3_UC_OTHER) j++;
        while (j < n && is_crlf(cp[j])) j++;
        return j;
    }
    /* c is white space from here on. */
    size_t e = i;
    while (e < n && cl[e] == H3_UC_SPACE) e++;
    /* \s*[\r\n]+ : the run up to and including its last line break */
    for (size_t k = e; k > i; k--)
        if (is_crlf(cp[k - 1])) return k;
    /* \s+(?!\S) : the run, less its last character when something follows it */
    if (e == n) return e;
    if (e - i >= 2) return e - 1;
    /* \s+ */
    return e;
}

/* Pre-tokenizes and encodes s[0..n) (already normalized, valid UTF-8). */
static h3_status encode_plain(const h3_tokenizer *t, enc_ws *w, const char *s, size_t n) {
    if (n == 0) return H3_OK;
    H3_TRY(grow((void **)&w->cp, &w->cp_cap, n, sizeof *w->cp, H3_MEM_WORKSPACE));
    H3_TRY(grow((void **)&w->cls, &w->cls_cap, n, 1, H3_MEM_WORKSPACE));
    H3_TRY(grow((void **)&w->boff, &w->boff_cap, n + 1, sizeof *w->boff, H3_MEM_WORKSPACE));
    size_t m = 0, i = 0;
    while (i < n) {
        w->boff[m] = i;
        uint32_t c;
        if (!utf8_next((const uint8_t *)s, n, &i, &c))
            return H3_ERR(H3_ERR_INTERNAL, "tokenizer: invalid UTF-8 after validation");
        w->cp[m] = c;
        w->cls[m] = (uint8_t)h3_uc_class(c);
        m++;
    }
    w->boff[m] = n;
    for (size_t k = 0; k < m;) {
        size_t e = match_at(w->cp, w->cls, k, m);
        H3_TRY(bpe_piece(t, w, s + w->boff[k], w->boff[e] - w->boff[k]));
        k = e;
    }
    return H3_OK;
}

h3_status h3_qwen_pretokenize(const char *utf8, size_t len, size_t **ends, int64_t *n) {
    *ends = NULL;
    *n = 0;
    size_t bad = utf8_check(utf8, len);
    if (bad < len) return H3_ERR(H3_ERR_INVALID, "the text is not valid UTF-8 (byte %zu of %zu)", bad, len);
    uint32_t *cp = NULL;
    uint8_t *cl = NULL;
    size_t *off = NULL, cp_cap = 0, cl_cap = 0, off_cap = 0, m = 0, i = 0;
    h3_status st = grow((void **)&cp, &cp_cap, len + 1, sizeof *cp, H3_MEM_WORKSPACE);
    if (st == H3_OK) st = grow((void **)&cl, &cl_cap, len + 1, 1, H3_MEM_WORKSPACE);
    if (st == H3_OK) st = grow((void **)&off, &off_cap, len + 1, sizeof *off, H3_MEM_WORKSPACE);
    if (st == H3_OK) {
        while (i < len) {
            off[m] = i;
            utf8_next((const uint8_t *)utf8, len, &i, &cp[m]);
            cl[m] = (uint8_t)h3_uc_class(cp[m]);
            m++;
        }
        off[m] = len;
        *ends = h3_malloc((m + 1) * sizeof **ends, H3_MEM_IO);
        if (!*ends) st = H3_ERR_NOMEM;
    }
    for (size_t k = 0; st == H3_OK && k < m;) {
        size_t e = match_at(cp, cl, k, m);
        (*ends)[(*n)++] = off[e];
        k = e;
    }
    h3_free(cp);
    h3_free(cl);
    h3_free(off);
    return st;
}

/* ---- added tokens ----------------------------------------------------------------------------------------- */

/* Leftmost-longest match of an added token (of the given kind: normalized or not) in s[from..n). On a match sets
 * [*ms, *me) to the span it consumes (lstrip/rstrip white space included, never before `from`) and returns the
 * token; NULL when none matches. */
static const added_tok *find_added(const h3_tokenizer *t, int normalized, const char *s, size_t from, size_t n,
                                   size_t *ms, size_t *me) {
    uint8_t bit = normalized ? 2 : 1;
    for (size_t p = from; p < n; p++) {
        if (!(t->added_first[(uint8_t)s[p]] & bit)) continue;
        const added_tok *best = NULL;
        for (int k = 0; k < t->n_added; k++) {
            const added_tok *a = &t->added[k];
            if (a->normalized != normalized || a->len > n - p || (best && a->len <= best->len)) continue;
            if (memcmp(s + p, a->text, a->len) == 0) best = a;
        }
        if (!best) continue;
        size_t b = p, e = p + best->len;
        if (best->lstrip) {
            while (b > from) {
                size_t q = b - 1, k;
                while (q > from && ((uint8_t)s[q] & 0xC0) == 0x80) q--;
                uint32_t c;
                k = q;
                if (!utf8_next((const uint8_t *)s, n, &k, &c) || h3_uc_class(c) != H3_UC_SPACE) break;
                b = q;
            }
        }
        if (best->rstrip) {
            for (;;) {
                size_t k = e;
                uint32_t c;
                if (k >= n || !utf8_next((const uint8_t *)s, n, &k, &c) || h3_uc_class(c) != H3_UC_SPACE) break;
                e = k;
            }
        }
        *ms = b;
        *me = e;
        return best;
    }
    return NULL;
}

/* Splits s[0..n) around added tokens of one kind; the text between goes to encode_plain (normalized kind) or to
 * normalization and a second split (raw kind). */
static h3_status encode_normalized(const h3_tokenizer *t, enc_ws *w, const char *s, size_t n);

static h3_status encode_split(const h3_tokenizer *t, enc_ws *w, int normalized, const char *s, size_t n) {
    size_t pos = 0;
    while (pos < n) {
        size_t ms = n, me = n;
        const added_tok *a = find_added(t, normalized, s, pos, n, &ms, &me);
        if (ms > pos) {
            if (normalized) H3_TRY(encode_plain(t, w, s + pos, ms - pos));
            else H3_TRY(encode_normalized(t, w, s + pos, ms - pos));
        }
        if (!a) break;
        H3_TRY(emit(w, a->id));
        pos = me;
    }
    return H3_OK;
}

static h3_status encode_normalized(const h3_tokenizer *t, enc_ws *w, const char *s, size_t n) {
    int fast = 1;
    if (t->nfc)
        for (size_t i = 0; i < n && fast; i++) fast = (uint8_t)s[i] < 0xCC; /* all code points below U+0300 */
    if (!fast) {
        /* Decode, normalize, re-encode into w->u8 (the pre-tokenizer's buffers are filled from it afterwards). */
        H3_TRY(grow((void **)&w->cp, &w->cp_cap, n, sizeof *w->cp, H3_MEM_WORKSPACE));
        size_t m = 0, i = 0, dn;
        while (i < n) {
            if (!utf8_next((const uint8_t *)s, n, &i, &w->cp[m]))
                return H3_ERR(H3_ERR_INTERNAL, "tokenizer: invalid UTF-8 after validation");
            m++;
        }
        H3_TRY(nfc_cps(w->cp, m, &w->nfc, &dn));
        size_t need;
        if (!h3_mul_size(dn, 4, &need)) return H3_ERR(H3_ERR_NOMEM, "normalized text too long");
        H3_TRY(grow((void **)&w->u8, &w->u8_cap, need + 1, 1, H3_MEM_WORKSPACE));
        size_t o = 0;
        for (size_t k = 0; k < dn; k++) o += (size_t)utf8_put(w->nfc.d[k], w->u8 + o);
        /* encode_plain reuses w->cp but not w->u8, so the normalized text can be read from w->u8 in place. */
        s = w->u8;
        n = o;
    }
    if (t->n_added_normalized) {
        /* The split may call encode_plain, which does not touch w->u8. */
        return encode_split(t, w, 1, s, n);
    }
    return encode_plain(t, w, s, n);
}

h3_status h3_tokenizer_encode_n(const h3_tokenizer *t, const char *utf8, size_t len, int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    if (!t) return H3_ERR(H3_ERR_INVALID, "tokenizer: no tokenizer");
    if (len && !utf8) return H3_ERR(H3_ERR_INVALID, "tokenizer: text is NULL");
    size_t bad = utf8_check(utf8, len);
    if (bad < len) return H3_ERR(H3_ERR_INVALID, "the text is not valid UTF-8 (byte %zu of %zu)", bad, len);
    if (memchr(utf8, 0, len)) return H3_ERR(H3_ERR_INVALID, "the text contains a NUL byte");
    enc_ws w = {0};
    h3_status st = encode_split(t, &w, 0, utf8, len);
    if (st == H3_OK && w.n_ids > 0) {
        *ids = w.ids;
        *n = w.n_ids;
        w.ids = NULL;
    }
    ws_free(&w);
    return st;
}

h3_status h3_tokenizer_encode(const h3_tokenizer *t, const char *utf8, int32_t **ids, int64_t *n) {
    return h3_tokenizer_encode_n(t, utf8, utf8 ? strlen(utf8) : 0, ids, n);
}

h3_status h3_utf8_nfc(const char *utf8, size_t len, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    size_t bad = utf8_check(utf8, len);
    if (bad < len) return H3_ERR(H3_ERR_INVALID, "the text is not valid UTF-8 (byte %zu of %zu)", bad, len);
    uint32_t *cp = NULL;
    size_t cap = 0, m = 0, i = 0, dn = 0;
    nfc_buf b = {0};
    h3_status st = grow((void **)&cp, &cap, len + 1, sizeof *cp, H3_MEM_WORKSPACE);
    while (st == H3_OK && i < len) utf8_next((const uint8_t *)utf8, len, &i, &cp[m++]);
    if (st == H3_OK) st = nfc_cps(cp, m, &b, &dn);
    if (st == H3_OK) {
        *out = h3_malloc(dn * 4 + 1, H3_MEM_IO);
        if (!*out) st = H3_ERR_NOMEM;
    }
    if (st == H3_OK) {
        size_t o = 0;
        for (size_t k = 0; k < dn; k++) o += (size_t)utf8_put(b.d[k], *out + o);
        (*out)[o] = 0;
        *out_len = o;
    }
    h3_free(cp);
    h3_free(b.d);
    h3_free(b.tmp);
    return st;
}

/* ---- a JSON scanner for the two big members ---------------------------------------------------------------
 *
 * model.vocab (150k entries) and model.merges (150k pairs) are read straight from the file's text into the
 * tables, without building a JSON tree (which would take a million small allocations); everything else in the
 * file is small and goes through jansson. The scanner accepts exactly JSON (RFC 8259) and reports the line and
 * column of what it rejects. */

typedef struct tj {
    const char *s;
    size_t n, i;
    const char *path;
    char *buf; /* decoded string */
    size_t cap, len;
} tj;

static h3_status tj_error(const tj *j, const char *what) {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < j->i && k < j->n; k++) {
        if (j->s[k] == '\n') line++, col = 1;
        else col++;
    }
    return H3_ERR(H3_ERR_FORMAT, "%s is not valid tokenizer JSON: %s (line %zu, column %zu)", j->path, what, line, col);
}

static void tj_ws(tj *j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\n' || j->s[j->i] == '\r' || j->s[j->i] == '\t'))
        j->i++;
}

/* Consumes c after white space; 0 when the next character is something else. */
static int tj_eat(tj *j, char c) {
    tj_ws(j);
    if (j->i < j->n && j->s[j->i] == c) {
        j->i++;
        return 1;
    }
    return 0;
}

static int hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v << 4 | (uint32_t)d;
    }
    return 1;
}

/* Reads a string into j->buf (NUL-terminated, j->len bytes). The text was checked to be UTF-8 beforehand. */
static h3_status tj_string(tj *j) {
    tj_ws(j);
    if (j->i >= j->n || j->s[j->i] != '"') return tj_error(j, "expected a string");
    j->i++;
    j->len = 0;
    for (;;) {
        size_t start = j->i;
        while (j->i < j->n && j->s[j->i] != '"' && j->s[j->i] != '\\' && (uint8_t)j->s[j->i] >= 0x20) j->i++;
        size_t run = j->i - start;
        H3_TRY(grow((void **)&j->buf, &j->cap, j->len + run + 5, 1, H3_MEM_WORKSPACE));
        memcpy(j->buf + j->len, j->s + start, run);
        j->len += run;
        if (j->i >= j->n) return tj_error(j, "unterminated string");
        char c = j->s[j->i];
        if (c == '"') {
            j->i++;
            j->buf[j->len] = 0;
            return H3_OK;
        }
        if (c != '\\') return tj_error(j, "control character inside a string");
        if (j->i + 1 >= j->n) return tj_error(j, "unterminated string");
        char e = j->s[j->i + 1];
        j->i += 2;
        char out;
        switch (e) {
            case '"': out = '"'; break;
            case '\\': out = '\\'; break;
            case '/': out = '/'; break;
            case 'b': out = '\b'; break;
            case 'f': out = '\f'; break;
            case 'n': out = '\n'; break;
            case 'r': out = '\r'; break;
            case 't': out = '\t'; break;
            case 'u': {
                uint32_t v, lo;
                if (j->n - j->i < 4 || !hex4(j->s + j->i, &v)) return tj_error(j, "bad \\u escape");
                j->i += 4;
                if (v >= 0xD800 && v <= 0xDBFF) {
                    if (j->n - j->i < 6 || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u' || !hex4(j->s + j->i + 2, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return tj_error(j, "lone surrogate in a \\u escape");
                    j->i += 6;
                    v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                } else if (v >= 0xDC00 && v <= 0xDFFF) {
                    return tj_error(j, "lone surrogate in a \\u escape");
                }
                if (v == 0) return tj_error(j, "\\u0000 inside a string");
                j->len += (size_t)utf8_put(v, j->buf + j->len);
                continue;
            }
            default: return tj_error(j, "bad escape");
        }
        j->buf[j->len++] = out;
    }
}

/* Skips one value of any kind (containers up to 64 deep). */
static h3_status tj_skip(tj *j, int depth) {
    if (depth > 64) return tj_error(j, "nested more than 64 deep");
    tj_ws(j);
    if (j->i >= j->n) return tj_error(j, "unexpected end");
    char c = j->s[j->i];
    if (c == '"') return tj_string(j);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->i++;
        if (tj_eat(j, close)) return H3_OK;
        do {
            if (c == '{') {
                H3_TRY(tj_string(j));
                if (!tj_eat(j, ':')) return tj_error(j, "expected ':'");
            }
            H3_TRY(tj_skip(j, depth + 1));
        } while (tj_eat(j, ','));
        if (!tj_eat(j, close)) return tj_error(j, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        return H3_OK;
    }
    static const char *const lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (j->n - j->i >= l && memcmp(j->s + j->i, lits[k], l) == 0) {
            j->i += l;
            return H3_OK;
        }
    }
    /* number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
    size_t i = j->i;
    if (i < j->n && j->s[i] == '-') i++;
    if (i >= j->n || j->s[i] < '0' || j->s[i] > '9') return tj_error(j, "expected a value");
    if (j->s[i] == '0') i++;
    else while (i < j->n && j->s[i] >= '0' && j->s[i] <= '9') i++;
    if (i < j->n && j->s[i] == '.') {
        i++;
        if (i >= j->n || j->s[i] < '0' || j->s[i] > '9') return tj_error(j, "bad number");
        while (i < j->n && j->s[i] >= '0' && j->s[i] <= '9') i++;
    }
    if (i < j->n && (j->s[i] == 'e' || j->s[i] == 'E')) {
        i++;
        if (i < j->n && (j->s[i] == '+' || j->s[i] == '-')) i++;
        if (i >= j->n || j->s[i] < '0' || j->s[i] > '9') return tj_error(j, "bad number");
        while (i < j->n && j->s[i] >= '0' && j->s[i] <= '9') i++;
    }
    j->i = i;
    return H3_OK;
}

/* A non-negative integer id below 2^31. */
static h3_status tj_id(tj *j, int32_t *out) {
    tj_ws(j);
    size_t start = j->i;
    int64_t v = 0;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9' && v < INT32_MAX) v = v * 10 + (j->s[j->i++] - '0');
    if (j->i == start || v >= INT32_MAX || (j->i - start > 1 && j->s[start] == '0') ||
        (j->i < j->n && (j->s[j->i] == '.' || j->s[j->i] == 'e' || j->s[j->i] == 'E' || (j->s[j->i] >= '0' && j->s[j->i] <= '9'))))
        return tj_error(j, "a vocab id must be an integer in [0, 2^31)");
    *out = (int32_t)v;
    return H3_OK;
}

/* Parses the value at span [b, e) of the file with jansson (wrapped in an array, so that a bare scalar parses). */
static h3_status tj_subtree(const tj *j, size_t b, size_t e, const char *what, json_t **out) {
    *out = NULL;
    char name[256];
    snprintf(name, sizeof name, "%s (%s)", j->path, what);
    char *w = h3_malloc(e - b + 2, H3_MEM_WORKSPACE);
    if (!w) return H3_ERR_NOMEM;
    w[0] = '[';
    memcpy(w + 1, j->s + b, e - b);
    w[e - b + 1] = ']';
    json_t *arr = NULL;
    h3_status st = h3_json_parse(w, e - b + 2, name, &arr);
    h3_free(w);
    if (st != H3_OK) return st;
    *out = json_incref(json_array_get(arr, 0));
    json_decref(arr);
    return *out ? H3_OK : H3_ERR(H3_ERR_FORMAT, "%s: empty value", name);
}

/* ---- loading ---------------------------------------------------------------------------------------------- */

/* GPT-2's byte-to-unicode alphabet, inverted: code point (< 324) -> byte, or -1. */
static void byte_alphabet(int16_t u2b[324]) {
    for (int i = 0; i < 324; i++) u2b[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if (direct) u2b[b] = (int16_t)b;
        else u2b[256 + extra++] = (int16_t)b;
    }
}

/* Decodes a byte-level token string into raw bytes at dst (room for n bytes). Returns the byte count, or -1 when s
 * uses characters outside the alphabet. */
static int64_t unbyte(const int16_t u2b[324], const char *s, size_t n, char *dst) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t c;
        if (!utf8_next((const uint8_t *)s, n, &i, &c) || c >= 324 || u2b[c] < 0) return -1;
        dst[o++] = (char)u2b[c];
    }
    return (int64_t)o;
}

static h3_status pool_add(h3_tokenizer *t, const char *s, size_t n, uint32_t *off) {
    if (t->pool_len + n > UINT32_MAX) return H3_ERR(H3_ERR_FORMAT, "tokenizer: vocab text exceeds 4 GB");
    H3_TRY(grow((void **)&t->pool, &t->pool_cap, t->pool_len + n + 1, 1, H3_MEM_IO));
    memcpy(t->pool + t->pool_len, s, n);
    *off = (uint32_t)t->pool_len;
    t->pool_len += n;
    return H3_OK;
}

/* Accepts null, NFC, or a Sequence of those. */
static h3_status check_normalizer(h3_tokenizer *t, const json_t *nz, const char *path) {
    if (!nz || json_is_null(nz)) return H3_OK;
    const char *type = h3_json_get_str(nz, "type");
    if (type && strcmp(type, "NFC") == 0) {
        t->nfc = 1;
        return H3_OK;
    }
    if (type && strcmp(type, "Sequence") == 0) {
        json_t *list = json_object_get(nz, "normalizers");
        if (!json_is_array(list)) return H3_ERR(H3_ERR_FORMAT, "%s: normalizer Sequence without a list", path);
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) H3_TRY(check_normalizer(t, v, path));
        return H3_OK;
    }
    return H3_ERR(H3_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported (h3run reads Qwen2 tokenizers: NFC or none)",
                  path, type ? type : "?");
}

static int json_false_or_absent(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return !v || json_is_false(v) || json_is_null(v);
}

/* Accepts exactly Qwen2's pre-tokenizer: Sequence[Split(Qwen pattern, Isolated), ByteLevel(no prefix space,
 * no regex)]. */
static h3_status check_pretokenizer(const json_t *pt, const char *path) {
    const char *type = pt ? h3_json_get_str(pt, "type") : NULL;
    json_t *list = pt ? json_object_get(pt, "pretokenizers") : NULL;
    if (!type || strcmp(type, "Sequence") != 0 || !json_is_array(list) || json_array_size(list) != 2)
        return H3_ERR(H3_ERR_UNSUPPORTED,
                      "%s: pre-tokenizer is not Qwen2's (a Sequence of a Split with Qwen's pattern and a ByteLevel)",
                      path);
    json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
    const char *st = h3_json_get_str(split, "type"), *bt = h3_json_get_str(bl, "type");
    json_t *pat = json_object_get(split, "pattern");
    const char *re = pat ? h3_json_get_str(pat, "Regex") : NULL;
    const char *beh = h3_json_get_str(split, "behavior");
    if (!st || strcmp(st, "Split") != 0 || !re || strcmp(re, k_qwen_pattern) != 0 || !beh ||
        strcmp(beh, "Isolated") != 0 || !json_false_or_absent(split, "invert"))
        return H3_ERR(H3_ERR_UNSUPPORTED,
                      "%s: the pre-tokenizer's Split is not Qwen2's (pattern %s, behavior Isolated expected)", path,
                      k_qwen_pattern);
    if (!bt || strcmp(bt, "ByteLevel") != 0 || !json_false_or_absent(bl, "add_prefix_space") ||
        !json_false_or_absent(bl, "use_regex"))
        return H3_ERR(H3_ERR_UNSUPPORTED,
                      "%s: the pre-tokenizer's second step must be ByteLevel without prefix space or regex", path);
    return H3_OK;
}

/* The small members of "model" (everything but vocab and merges). */
static h3_status check_model(h3_tokenizer *t, const json_t *model, const char *path) {
    const char *type = h3_json_get_str(model, "type");
    if (type && strcmp(type, "BPE") != 0)
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (h3run reads byte-level BPE)", path,
                      type);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", path);
    const char *pre = h3_json_get_str(model, "continuing_subword_prefix");
    const char *suf = h3_json_get_str(model, "end_of_word_suffix");
    if ((pre && *pre) || (suf && *suf))
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: BPE subword prefixes/suffixes are not supported", path);
    if (!json_false_or_absent(model, "byte_fallback"))
        return H3_ERR(H3_ERR_UNSUPPORTED, "%s: BPE byte_fallback is not supported (byte-level BPE needs none)", path);
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    return H3_OK;
}

/* First pass over model.vocab at j->i: syntax, entry count and the largest id. */
static h3_status vocab_scan(tj *j, size_t *count, int32_t *max_id) {
    *count = 0;
    *max_id = -1;
    if (!tj_eat(j, '{')) return tj_error(j, "model.vocab must be an object");
    if (tj_eat(j, '}')) return H3_OK;
    do {
        int32_t id;
        H3_TRY(tj_string(j));
        if (!tj_eat(j, ':')) return tj_error(j, "expected ':'");
        H3_TRY(tj_id(j, &id));
        if (id > *max_id) *max_id = id;
        (*count)++;
    } while (tj_eat(j, ','));
    if (!tj_eat(j, '}')) return tj_error(j, "expected ',' or '}' in model.vocab");
    return H3_OK;
}

/* Second pass: fills the per-id tables and the vocab hash (t->off/len allocated for t->n_ids ids). */
static h3_status vocab_fill(h3_tokenizer *t, tj *j, size_t count) {
    t->vmask = table_size_for(count) - 1;
    t->vhash = h3_malloc((t->vmask + 1) * sizeof *t->vhash, H3_MEM_IO);
    if (!t->vhash) return H3_ERR_NOMEM;
    memset(t->vhash, 0xff, (t->vmask + 1) * sizeof *t->vhash);
    int16_t u2b[324];
    byte_alphabet(u2b);
    tj_eat(j, '{');
    if (tj_eat(j, '}')) return H3_OK;
    do {
        int32_t id;
        H3_TRY(tj_string(j));
        tj_eat(j, ':');
        H3_TRY(tj_id(j, &id));
        int64_t bl = unbyte(u2b, j->buf, j->len, j->buf); /* decodes in place: never longer than the input */
        if (bl < 0)
            return H3_ERR(H3_ERR_FORMAT, "%s: vocab entry '%s' (id %d) is not in the byte-level alphabet", j->path,
                          j->buf, id);
        if (t->len[id] != NO_TOKEN) return H3_ERR(H3_ERR_FORMAT, "%s: vocab id %d is given to two entries", j->path, id);
        if (vocab_find(t, j->buf, (size_t)bl) >= 0)
            return H3_ERR(H3_ERR_FORMAT, "%s: vocab entry with id %d appears twice", j->path, id);
        H3_TRY(pool_add(t, j->buf, (size_t)bl, &t->off[id]));
        t->len[id] = (uint32_t)bl;
        vocab_insert(t, id);
    } while (tj_eat(j, ','));
    tj_eat(j, '}');
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = vocab_find(t, &c, 1);
        if (t->byte_id[b] < 0)
            return H3_ERR(H3_ERR_FORMAT, "%s: the vocab lacks the byte-level token of byte 0x%02x", j->path, b);
    }
    return H3_OK;
}

/* One merge at j->i: "A B" or ["A", "B"]; the two token texts (byte-level, NUL-separated) end up in *pair. */
static h3_status merge_read(tj *j, char **pair, size_t *cap, size_t *la, size_t *lb) {
    if (tj_eat(j, '[')) {
        H3_TRY(tj_string(j));
        *la = j->len;
        H3_TRY(grow((void **)pair, cap, *la + 1, 1, H3_MEM_WORKSPACE));
        memcpy(*pair, j->buf, *la + 1);
        if (!tj_eat(j, ',')) return tj_error(j, "a merge given as an array must have two strings");
        H3_TRY(tj_string(j));
        *lb = j->len;
        H3_TRY(grow((void **)pair, cap, *la + *lb + 2, 1, H3_MEM_WORKSPACE));
        memcpy(*pair + *la + 1, j->buf, *lb + 1);
        if (!tj_eat(j, ']')) return tj_error(j, "a merge given as an array must have two strings");
        return H3_OK;
    }
    H3_TRY(tj_string(j));
    char *sp = memchr(j->buf, ' ', j->len);
    if (!sp || memchr(sp + 1, ' ', j->len - (size_t)(sp + 1 - j->buf)))
        return tj_error(j, "a merge given as a string must be two tokens separated by one space");
    H3_TRY(grow((void **)pair, cap, j->len + 1, 1, H3_MEM_WORKSPACE));
    memcpy(*pair, j->buf, j->len + 1);
    *la = (size_t)(sp - j->buf);
    (*pair)[*la] = 0;
    *lb = j->len - *la - 1;
    return H3_OK;
}

static h3_status merges_fill(h3_tokenizer *t, tj *j) {
    /* Count first (to size the table), then fill. */
    size_t start = j->i, nm = 0;
    if (!tj_eat(j, '[')) return tj_error(j, "model.merges must be an array");
    if (!tj_eat(j, ']')) {
        do {
            H3_TRY(tj_skip(j, 0));
            nm++;
        } while (tj_eat(j, ','));
        if (!tj_eat(j, ']')) return tj_error(j, "expected ',' or ']' in model.merges");
    }
    if (nm >= UINT32_MAX) return H3_ERR(H3_ERR_FORMAT, "%s: too many merges", j->path);
    t->mmask = table_size_for(nm) - 1;
    size_t slots = t->mmask + 1;
    t->mkey = h3_malloc(slots * sizeof *t->mkey, H3_MEM_IO);
    t->mrank = h3_malloc(slots * sizeof *t->mrank, H3_MEM_IO);
    t->mres = h3_malloc(slots * sizeof *t->mres, H3_MEM_IO);
    if (!t->mkey || !t->mrank || !t->mres) return H3_ERR_NOMEM;
    memset(t->mkey, 0xff, slots * sizeof *t->mkey);
    if (nm == 0) return H3_OK;
    int16_t u2b[324];
    byte_alphabet(u2b);
    char *pair = NULL, *raw = NULL;
    size_t pair_cap = 0, raw_cap = 0;
    h3_status st = H3_OK;
    j->i = start;
    tj_eat(j, '[');
    for (size_t r = 0; r < nm && st == H3_OK; r++) {
        if (r) tj_eat(j, ',');
        size_t la = 0, lb = 0;
        st = merge_read(j, &pair, &pair_cap, &la, &lb);
        if (st == H3_OK) st = grow((void **)&raw, &raw_cap, la + lb + 1, 1, H3_MEM_WORKSPACE);
        if (st != H3_OK) break;
        int64_t ra = unbyte(u2b, pair, la, raw), rb = ra < 0 ? -1 : unbyte(u2b, pair + la + 1, lb, raw + ra);
        int32_t ia = ra < 0 ? -1 : vocab_find(t, raw, (size_t)ra);
        int32_t ib = rb < 0 ? -1 : vocab_find(t, raw + ra, (size_t)rb);
        int32_t ic = (ia < 0 || ib < 0) ? -1 : vocab_find(t, raw, (size_t)(ra + rb));
        if (ic < 0) {
            st = H3_ERR(H3_ERR_FORMAT, "%s: merge %zu (\"%s\" + \"%s\") names a token that is not in the vocab",
                        j->path, r, pair, pair + la + 1);
            break;
        }
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        uint64_t h = mix64(key) & t->mmask;
        while (t->mkey[h] != UINT64_MAX && t->mkey[h] != key) h = (h + 1) & t->mmask;
        if (t->mkey[h] == key) continue; /* a repeated merge keeps its first (lowest) rank */
        t->mkey[h] = key;
        t->mrank[h] = (uint32_t)r;
        t->mres[h] = ic;
    }
    h3_free(pair);
    h3_free(raw);
    return st;
}

static h3_status load_added(h3_tokenizer *t, const json_t *list, const char *path) {
    if (!list || json_is_null(list)) return H3_OK;
    if (!json_is_array(list)) return H3_ERR(H3_ERR_FORMAT, "%s: added_tokens is not an array", path);
    size_t n = json_array_size(list);
    if (n == 0) return H3_OK;
    t->added = h3_calloc(n, sizeof *t->added, H3_MEM_IO);
    if (!t->added) return H3_ERR_NOMEM;
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        const char *content = h3_json_get_str(v, "content");
        int64_t id;
        if (!content || !*content || !h3_json_get_int(v, "id", &id) || id < 0 || id >= INT32_MAX)
            return H3_ERR(H3_ERR_FORMAT, "%s: added token %zu needs a non-empty \"content\" and an id in [0, 2^31)",
                          path, i);
        if (json_is_true(json_object_get(v, "single_word")))
            return H3_ERR(H3_ERR_UNSUPPORTED, "%s: added token '%s' is single_word, which h3run does not support",
                          path, content);
        if (utf8_check(content, strlen(content)) != strlen(content))
            return H3_ERR(H3_ERR_FORMAT, "%s: added token %zu is not valid UTF-8", path, i);
        added_tok *a = &t->added[t->n_added];
        a->text = h3_strdup(content);
        if (!a->text) return H3_ERR_NOMEM;
        t->n_added++;
        a->len = strlen(content);
        a->id = (int32_t)id;
        /* tokenizers' default for "normalized" is true for non-special tokens, false for special ones. */
        json_t *nz = json_object_get(v, "normalized");
        a->normalized = nz ? json_is_true(nz) : !json_is_true(json_object_get(v, "special"));
        a->lstrip = json_is_true(json_object_get(v, "lstrip"));
        a->rstrip = json_is_true(json_object_get(v, "rstrip"));
        for (int k = 0; k < t->n_added - 1; k++)
            if (strcmp(t->added[k].text, a->text) == 0 && t->added[k].id != a->id)
                return H3_ERR(H3_ERR_FORMAT, "%s: added token '%s' appears twice with ids %d and %d", path, a->text,
                              t->added[k].id, a->id);
        if (a->normalized) t->n_added_normalized++;
        t->added_first[(uint8_t)a->text[0]] |= a->normalized ? 2 : 1;
    }
    return H3_OK;
}

/* Where the members of the file are: the small ones parsed by jansson, the two big ones as spans of text. */
typedef struct tok_doc {
    json_t *added, *normalizer, *pretok, *model; /* model: its members other than vocab and merges */
    size_t vocab_at, merges_at;                  /* offsets of the values; 0 when absent */
    int has_model;
} tok_doc;

static void doc_free(tok_doc *d) {
    json_decref(d->added);
    json_decref(d->normalizer);
    json_decref(d->pretok);
    json_decref(d->model);
}

static h3_status doc_read(tj *j, tok_doc *d) {
    if (!tj_eat(j, '{')) return tj_error(j, "the file must hold a JSON object");
    int seen_model = 0;
    if (!tj_eat(j, '}')) {
        do {
            H3_TRY(tj_string(j));
            if (!tj_eat(j, ':')) return tj_error(j, "expected ':'");
            tj_ws(j);
            size_t b = j->i;
            json_t **slot = NULL;
            if (strcmp(j->buf, "model") == 0) {
                if (seen_model++) return tj_error(j, "\"model\" appears twice");
                d->has_model = 1;
                d->model = json_object();
                if (!d->model) return H3_ERR_NOMEM;
                if (!tj_eat(j, '{')) return tj_error(j, "\"model\" must be an object");
                if (tj_eat(j, '}')) continue;
                do {
                    H3_TRY(tj_string(j));
                    if (!tj_eat(j, ':')) return tj_error(j, "expected ':'");
                    tj_ws(j);
                    size_t vb = j->i;
                    if (strcmp(j->buf, "vocab") == 0 || strcmp(j->buf, "merges") == 0) {
                        int is_vocab = j->buf[0] == 'v';
                        size_t *at = is_vocab ? &d->vocab_at : &d->merges_at;
                        if (*at) return tj_error(j, "a member of \"model\" appears twice");
                        if (j->i >= j->n || j->s[j->i] != (is_vocab ? '{' : '['))
                            return tj_error(j, is_vocab ? "model.vocab must be an object" : "model.merges must be an array");
                        *at = vb;
                        H3_TRY(tj_skip(j, 1));
                        continue;
                    }
                    char key[64];
                    snprintf(key, sizeof key, "%s", j->buf);
                    H3_TRY(tj_skip(j, 1));
                    if (json_object_get(d->model, key)) return tj_error(j, "a member of \"model\" appears twice");
                    json_t *v;
                    H3_TRY(tj_subtree(j, vb, j->i, "model", &v));
                    if (json_object_set_new(d->model, key, v)) return H3_ERR_NOMEM;
                } while (tj_eat(j, ','));
                if (!tj_eat(j, '}')) return tj_error(j, "expected ',' or '}' in \"model\"");
                continue;
            }
            if (strcmp(j->buf, "added_tokens") == 0) slot = &d->added;
            else if (strcmp(j->buf, "normalizer") == 0) slot = &d->normalizer;
            else if (strcmp(j->buf, "pre_tokenizer") == 0) slot = &d->pretok;
            char key[32];
            snprintf(key, sizeof key, "%s", j->buf);
            H3_TRY(tj_skip(j, 0));
            if (slot) {
                if (*slot) return tj_error(j, "a top-level member appears twice");
                H3_TRY(tj_subtree(j, b, j->i, key, slot));
            }
        } while (tj_eat(j, ','));
        if (!tj_eat(j, '}')) return tj_error(j, "expected ',' or '}'");
    }
    tj_ws(j);
    if (j->i != j->n) return tj_error(j, "text after the JSON object");
    return H3_OK;
}

static h3_status tokenizer_from_text(const char *text, size_t len, const char *path, h3_tokenizer **out) {
    *out = NULL;
    size_t bad = utf8_check(text, len);
    if (bad < len) return H3_ERR(H3_ERR_FORMAT, "%s is not UTF-8 (byte %zu)", path, bad);
    tj j = {text, len, 0, path, NULL, 0, 0};
    tok_doc d = {0};
    h3_tokenizer *t = h3_calloc(1, sizeof *t, H3_MEM_IO);
    if (!t) return H3_ERR_NOMEM;
    h3_status st = H3_OK;
    H3_CHECK(doc_read(&j, &d));
    if (!d.has_model) H3_FAIL(H3_ERR_FORMAT, "%s has no \"model\" object", path);
    if (!d.vocab_at) H3_FAIL(H3_ERR_FORMAT, "%s: model has no \"vocab\"", path);
    if (!d.merges_at) H3_FAIL(H3_ERR_FORMAT, "%s: model has no \"merges\"", path);
    H3_CHECK(check_model(t, d.model, path));
    H3_CHECK(check_normalizer(t, d.normalizer, path));
    H3_CHECK(check_pretokenizer(d.pretok, path));
    H3_CHECK(load_added(t, d.added, path));
    size_t count;
    int32_t max_id;
    j.i = d.vocab_at;
    H3_CHECK(vocab_scan(&j, &count, &max_id));
    const int64_t entries = (int64_t)count + t->n_added,
                  id_limit = 2 * entries > TOK_ID_FLOOR ? 2 * entries : TOK_ID_FLOOR;
    t->n_ids = max_id + 1;
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].id >= t->n_ids) t->n_ids = t->added[k].id + 1;
    if (t->n_ids > id_limit)
        H3_FAIL(H3_ERR_FORMAT,
                "%s: id %d is out of reach: a tokenizer of %lld entries (vocab and added tokens) may use ids "
                "below "
                "%lld (the larger of %d and twice its entries)",
                path, t->n_ids - 1, (long long)entries, (long long)id_limit, TOK_ID_FLOOR);
    t->off = h3_malloc((size_t)t->n_ids * sizeof *t->off + 1, H3_MEM_IO);
    t->len = h3_malloc((size_t)t->n_ids * sizeof *t->len + 1, H3_MEM_IO);
    if (!t->off || !t->len) H3_FAIL(H3_ERR_NOMEM, "tokenizer: no memory for %d ids", t->n_ids);
    for (int32_t i = 0; i < t->n_ids; i++) t->len[i] = NO_TOKEN, t->off[i] = 0;
    j.i = d.vocab_at;
    H3_CHECK(vocab_fill(t, &j, count));
    j.i = d.merges_at;
    H3_CHECK(merges_fill(t, &j));
    for (int k = 0; k < t->n_added; k++) {
        added_tok *a = &t->added[k];
        if (t->len[a->id] == NO_TOKEN) {
            H3_CHECK(pool_add(t, a->text, a->len, &t->off[a->id]));
            t->len[a->id] = (uint32_t)a->len;
        }
    }
done:
    h3_free(j.buf);
    doc_free(&d);
    if (st != H3_OK) {
        h3_tokenizer_free(t);
        t = NULL;
    }
    *out = t;
    return st;
}

h3_status h3_tokenizer_load(const char *path, h3_tokenizer **out) {
    *out = NULL;
    if (!path) return H3_ERR(H3_ERR_INVALID, "tokenizer: no path");
    char *file = NULL;
    if (h3_path_is_dir(path)) {
        static const char *const cands[] = {"tokenizer.json", "tokenizer/tokenizer.json"};
        for (int i = 0; i < 2 && !file; i++) {
            char *p = h3_path_join(path, cands[i]);
            if (!p) return H3_ERR_NOMEM;
            if (h3_path_is_file(p)) file = p;
            else h3_free(p);
        }
        if (!file)
            return H3_ERR(H3_ERR_NOT_FOUND, "%s holds neither tokenizer.json nor tokenizer/tokenizer.json", path);
    } else {
        file = h3_strdup(path);
        if (!file) return H3_ERR_NOMEM;
    }
    char *text = NULL;
    size_t len = 0;
    h3_status st = h3_read_file(file, TOK_MAX_FILE, &text, &len);
    if (st == H3_OK) st = tokenizer_from_text(text, len, file, out);
    h3_free(text);
    h3_free(file);
    return st;
}

void h3_tokenizer_free(h3_tokenizer *t) {
    if (!t) return;
    for (int k = 0; k < t->n_added; k++) h3_free(t->added[k].text);
    h3_free(t->added);
    h3_free(t->off);
    h3_free(t->len);
    h3_free(t->pool);
    h3_free(t->vhash);
    h3_free(t->mkey);
    h3_free(t->mrank);
    h3_free(t->mres);
    h3_free(t);
}

int32_t h3_tokenizer_n_ids(const h3_tokenizer *t) {
    return t->n_ids;
}

int h3_tokenizer_nfc(const h3_tokenizer *t) {
    return t->nfc;
}

h3_status h3_tokenizer_empty_prompt(const h3_tokenizer *t, int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    int32_t eot = h3_tokenizer_token_id(t, "<|endoftext|>");
    if (eot < 0)
        return H3_ERR(H3_ERR_FORMAT,
                      "the prompt is empty and the tokenizer has no <|endoftext|> to stand for it");
    *ids = h3_malloc(sizeof **ids, H3_MEM_IO);
    if (!*ids) return H3_ERR(H3_ERR_NOMEM, "out of memory");
    (*ids)[0] = eot;
    *n = 1;
    return H3_OK;
}

int32_t h3_tokenizer_token_id(const h3_tokenizer *t, const char *text) {
    size_t n = strlen(text);
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].len == n && memcmp(t->added[k].text, text, n) == 0) return t->added[k].id;
    return vocab_find(t, text, n);
}

const char *h3_tokenizer_token_bytes(const h3_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || t->len[id] == NO_TOKEN) return NULL;
    *len = t->len[id];
    return t->pool + t->off[id];
}

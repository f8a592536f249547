/* Prompts through the tokenizer users have: Qwen3's tokenizer.json with H3's added tokens (the one in
 * models/h3-small/tokenizer, loaded once). The input is the prompt's bytes (up to the first NUL, as a C
 * string reaches the encoder; the whole input when it holds none). Text that is not UTF-8 must be refused;
 * text that is must encode, and the ids' bytes must spell the text again (after NFC when the tokenizer asks
 * for it): a difference is a finding too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "fuzz.h"
#include "io/tokenizer.h"

static h3_tokenizer *g_tok;

/* The ids' bytes, joined, compared with want. */
static int spells(const int32_t *ids, int64_t n, const char *want, size_t want_len) {
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t len = 0;
        const char *b = h3_tokenizer_token_bytes(g_tok, ids[i], &len);
        if (!b || at + len > want_len || memcmp(want + at, b, len)) return 0;
        at += len;
    }
    return at == want_len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok) {
        const char *path = H3_FUZZ_DIR "/../models/h3-small/tokenizer/tokenizer.json";
        if (h3_tokenizer_load(path, &g_tok) != H3_OK) {
            fprintf(stderr, "fuzz harness: cannot load %s: %s\n", path, h3_last_error());
            abort();
        }
        fz_keep();
    }
    fz_quiet(1);
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    const size_t len = strlen(text);
    int32_t *ids = NULL;
    int64_t n = 0;
    h3_status st = len == size ? h3_tokenizer_encode_n(g_tok, text, len, &ids, &n)
                               : h3_tokenizer_encode(g_tok, text, &ids, &n);
    if (st == H3_OK) {
        char *norm = NULL;
        size_t norm_len = len;
        if (h3_tokenizer_nfc(g_tok) && h3_utf8_nfc(text, len, &norm, &norm_len) != H3_OK) abort();
        if (!spells(ids, n, norm ? norm : text, norm_len)) {
            fz_quiet(0);
            fprintf(stderr, "==FUZZ== prompt: the %lld ids do not spell the prompt again\n", (long long)n);
            abort();
        }
        h3_free(norm);
        size_t *ends = NULL;
        int64_t pieces = 0;
        if (h3_qwen_pretokenize(text, len, &ends, &pieces) == H3_OK) h3_free(ends);
    }
    h3_free(ids);
    free(text);
    fz_quiet(0);
    fz_end("prompt", 0);
    return 0;
}

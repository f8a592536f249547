/* tokenizer.json files: the model (vocab, merges, byte-level alphabet), the added tokens, the normalizer and
 * pre-tokenizer checks. The input is the file; a loaded tokenizer encodes a few fixed prompts (plain, added
 * tokens, accents to normalize, white space runs) and the empty prompt, and answers id and byte lookups. */
#include "base/alloc.h"
#include "fuzz.h"
#include "io/tokenizer.h"

static const char *const g_prompts[] = {
    "A red square moves from the left to the right.",
    "<|endoftext|>text<|im_start|> and  spaces\t\n\n  end",
    "caf\xc3\xa9 cafe\xcc\x81 \xe5\x9b\xbe 123456 it's",
    "",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* ids past a million allocate a table of that size (F5: no limit yet) */
    if (fz_open_finding("F5")) {
        for (size_t i = 0, run = 0; i < size; i++) {
            run = data[i] >= '0' && data[i] <= '9' ? run + 1 : 0;
            if (run >= 7) return 0;
        }
    }
    fz_quiet(1);
    h3_tokenizer *tok = NULL;
    if (h3_tokenizer_load(fz_write("tok/tokenizer.json", data, size), &tok) == H3_OK) {
        for (size_t i = 0; i < sizeof g_prompts / sizeof g_prompts[0]; i++) {
            int32_t *ids = NULL;
            int64_t n = 0;
            if (h3_tokenizer_encode(tok, g_prompts[i], &ids, &n) == H3_OK) h3_free(ids);
        }
        int32_t *ids = NULL;
        int64_t n = 0;
        if (h3_tokenizer_empty_prompt(tok, &ids, &n) == H3_OK) h3_free(ids);
        const int32_t max = h3_tokenizer_n_ids(tok);
        size_t len;
        for (int32_t id = -1; id <= max && id < 300; id++) h3_tokenizer_token_bytes(tok, id, &len);
        h3_tokenizer_token_bytes(tok, max, &len);
        h3_tokenizer_token_id(tok, "<|endoftext|>");
        h3_tokenizer_token_id(tok, "a");
        h3_tokenizer_nfc(tok);
        h3_tokenizer_free(tok);
    }
    fz_quiet(0);
    fz_end("tokenizer", 0);
    return 0;
}

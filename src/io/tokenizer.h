/* Qwen2's byte-level BPE tokenizer, read from a Hugging Face tokenizer.json.
 *
 * What encoding does, in order (the pipeline of Qwen2TokenizerFast with add_special_tokens off, no chat template,
 * no padding, no truncation):
 *   1. added tokens are split out of the raw text first, leftmost-longest (tokens marked "normalized": true are
 *      matched after normalization instead, and lstrip/rstrip swallow the white space beside a match);
 *   2. the other segments are normalized (NFC when the file asks for it);
 *   3. the pre-tokenizer cuts them with Qwen's pattern
 *        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *      (implemented by hand; \p{L}, \p{N} and \s come from src/io/unicode_data.c);
 *   4. each piece's UTF-8 bytes go through BPE: adjacent pairs merge by rank (lowest first, leftmost on ties) until
 *      no pair in the merge list remains; the symbols' ids are the output.
 * The byte-to-unicode alphabet of the file's vocab and merges is undone at load time, so BPE runs on raw bytes.
 *
 * Only what Qwen2/Qwen3 tokenizer.json files use is accepted; anything else (another model type, another
 * pre-tokenizer pattern, a normalizer other than NFC) is rejected at load with a message naming it.
 * A loaded tokenizer is immutable: encoding from several threads at once is safe.
 */
#ifndef H3_IO_TOKENIZER_H
#define H3_IO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct h3_tokenizer h3_tokenizer;

/* path: a tokenizer.json file, or a folder holding tokenizer.json or tokenizer/tokenizer.json. */
h3_status h3_tokenizer_load(const char *path, h3_tokenizer **out);
void h3_tokenizer_free(h3_tokenizer *tok);

/* Encodes NUL-terminated UTF-8 text. *ids is a new array from h3_malloc (free it with h3_free; NULL when *n is 0).
 * Text that is not valid UTF-8 is an H3_ERR_INVALID naming the byte offset. */
h3_status h3_tokenizer_encode(const h3_tokenizer *tok, const char *utf8, int32_t **ids, int64_t *n);
/* The ids an empty prompt is conditioned on: <|endoftext|> alone, as ComfyUI does (H3-FILE-FORMATS §3.3).
 * *ids from h3_malloc, *n = 1. H3_ERR_FORMAT when the tokenizer has no <|endoftext|>. */
h3_status h3_tokenizer_empty_prompt(const h3_tokenizer *tok, int32_t **ids, int64_t *n);
/* Same for len bytes (which must not contain NUL). */
h3_status h3_tokenizer_encode_n(const h3_tokenizer *tok, const char *utf8, size_t len, int32_t **ids, int64_t *n);

/* One more than the largest id of the vocab and the added tokens. */
int32_t h3_tokenizer_n_ids(const h3_tokenizer *tok);
/* Id of a token given by its text (an added token such as "<d>", or a vocab entry given as raw UTF-8), or -1. */
int32_t h3_tokenizer_token_id(const h3_tokenizer *tok, const char *text);
/* Raw bytes of an id (vocab entries without the byte-level alphabet; added tokens as written), or NULL for an id
 * that names nothing. */
const char *h3_tokenizer_token_bytes(const h3_tokenizer *tok, int32_t id, size_t *len);
/* Whether the file asked for NFC normalization. */
int h3_tokenizer_nfc(const h3_tokenizer *tok);

/* Qwen's pre-tokenizer alone (exposed for tests): cuts valid UTF-8 into pieces; (*ends)[i] is the byte offset where
 * piece i ends. *ends is from h3_malloc. No normalization and no added-token split happen here. */
h3_status h3_qwen_pretokenize(const char *utf8, size_t len, size_t **ends, int64_t *n);

/* NFC normalization of valid UTF-8 (exposed for tests). *out is from h3_malloc, NUL-terminated. */
h3_status h3_utf8_nfc(const char *utf8, size_t len, char **out, size_t *out_len);

#endif

/* The tokenizer: Hugging Face tokenizer.json (byte-level BPE, as Qwen3 ships it) to token ids and back,
 * with the same ids as Hugging Face tokenizers' `encode(text, add_special_tokens=False)`.
 *
 * Supported tokenizer.json (anything else is refused with KITE_ERROR_UNSUPPORTED naming the construct):
 * - model: BPE with byte-level symbols; merges as "a b" strings or ["a", "b"] pairs; dropout null,
 *   unk_token null, byte_fallback false, fuse_unk false, no continuing_subword_prefix / end_of_word_suffix;
 *   ignore_merges true or false.
 * - added_tokens with their special, lstrip, rstrip, single_word and normalized flags.
 * - normalizer: null, NFC, or a Sequence of those.
 * - pre_tokenizer: Split (Regex, behavior Isolated, invert false), ByteLevel (add_prefix_space false; with
 *   use_regex true it splits with GPT-2's pattern first), or a Sequence of them ending in ByteLevel.
 * - decoder: ByteLevel. post_processor: ByteLevel or null (encode adds no special tokens either way).
 *
 * Encoding steps, as Hugging Face does them: added tokens are split out of the raw text first (leftmost,
 * longest), the rest is NFC-normalized (utf8proc), split with the pre-tokenizer regex exactly as written
 * in tokenizer.json (PCRE2, UTF + UCP, JIT-compiled), and each piece is BPE-merged by merge rank.
 *
 * Invalid UTF-8 input: encode never fails on it. Each maximal invalid subsequence is replaced by U+FFFD
 * before anything else, exactly as Python's bytes.decode("utf-8", errors="replace") does, so the ids are
 * those Hugging Face gives for the replaced string.
 *
 * Decode follows Hugging Face's decode(ids, skip_special_tokens=False): each token's bytes (special and
 * added tokens give their content) are concatenated, and invalid UTF-8 in the result becomes U+FFFD
 * (maximal subparts, as Rust's String::from_utf8_lossy does).
 *
 * Thread safety: a loaded tokenizer is read-only and may be shared by any number of threads. Encode keeps
 * a cache of recently merged pieces per thread (thread-local, freed when the thread exits); a detokenizer
 * is used by one thread at a time.
 */
#ifndef KITE_TOKENIZER_TOKENIZER_H
#define KITE_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kite.h"

typedef struct tokenizer tokenizer;

/* Size limits, checked before a file is read: Qwen3's tokenizer.json is 11 MB and its tokenizer_config.json
 * 10 KB; files far beyond these are not tokenizers, and parsing them would cost memory in proportion. */
#define TOKENIZER_JSON_MAX_BYTES ((size_t)64 << 20)
#define TOKENIZER_CONFIG_MAX_BYTES ((size_t)4 << 20)
/* Values in tokenizer.json, bounded before parsing (util/json_scan.h) by its commas and opening brackets:
 * Qwen3's has 606053, and the limit leaves room for vocabularies several times its size. */
#define TOKENIZER_JSON_MAX_SEPARATORS (4 * 1000 * 1000)

/* Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (eos/bos tokens, add_bos_token). */
kite_status tokenizer_load(const char *dir, tokenizer **out);

/* Loads a tokenizer.json held in memory; `path` only names it in error messages (may be NULL). */
kite_status tokenizer_load_json(const char *json, size_t length, const char *path, tokenizer **out);

/* Applies a tokenizer_config.json held in memory (eos_token, bos_token, add_bos_token). */
kite_status tokenizer_apply_config_json(tokenizer *t, const char *json, size_t length, const char *path);

void tokenizer_free(tokenizer *t);

/* Number of ids, added tokens included (the largest id + 1). */
int32_t tokenizer_vocab_size(const tokenizer *t);

/* Encodes text[0..length) (any bytes; see above). *ids is malloc'd (free() it; NULL when *n_ids is 0). */
kite_status tokenizer_encode(const tokenizer *t, const char *text, size_t length, int32_t **ids, size_t *n_ids);

/* Decodes ids into malloc'd, NUL-terminated UTF-8 text (free() it). An id outside the vocabulary is
 * KITE_ERROR_INVALID_INPUT. */
kite_status tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *length);

/* The id of a token given as it is written in tokenizer.json (added-token content, or a vocab string such
 * as "Ġthe"); -1 if there is none. */
int32_t tokenizer_token_to_id(const tokenizer *t, const char *token);

/* The bytes a token decodes to, alone (may be part of a UTF-8 sequence); NULL for an id out of range. */
const char *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *length);

/* Whether the id is an added token marked special (such as <|im_end|>). */
bool tokenizer_is_special(const tokenizer *t, int32_t id);

/* From tokenizer_config.json: the eos / bos token ids (-1 when not set) and whether a bos token is added. */
int32_t tokenizer_eos_id(const tokenizer *t);
int32_t tokenizer_bos_id(const tokenizer *t);
bool tokenizer_add_bos(const tokenizer *t);

/* Streaming detokenizer for generation: push ids one at a time and get back the text they complete.
 * An incomplete UTF-8 sequence at the end is held back until a later token completes it (or until
 * detokenizer_flush, which turns what is left into U+FFFD), so the concatenation of everything returned
 * equals tokenizer_decode() of all pushed ids. Returned text stays valid until the next call on `d`. */
typedef struct detokenizer detokenizer;

kite_status detokenizer_create(const tokenizer *t, detokenizer **out);
kite_status detokenizer_push(detokenizer *d, int32_t id, const char **text, size_t *length);
kite_status detokenizer_flush(detokenizer *d, const char **text, size_t *length);
void detokenizer_free(detokenizer *d);

#endif

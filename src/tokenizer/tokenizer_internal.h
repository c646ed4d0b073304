/* Internals shared by the tokenizer's files (tokenizer.c loads, pretokenize.c normalizes and splits,
 * bpe.c merges, detokenize.c decodes). Not part of any API; tests may use it. */
#ifndef KITE_TOKENIZER_INTERNAL_H
#define KITE_TOKENIZER_INTERNAL_H

#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* A growable array of ids. */
typedef struct id_buffer {
    int32_t *ids;
    size_t count;
    size_t capacity;
} id_buffer;

kite_status id_buffer_push(id_buffer *b, int32_t id);
kite_status id_buffer_reserve(id_buffer *b, size_t extra);

/* Byte string -> id, open addressing over offsets into the tokenizer's byte blob. */
typedef struct bytes_slot {
    int32_t id;   /* -1 when empty */
    uint32_t tag; /* high bits of the hash: most mismatches are rejected without reading the blob */
} bytes_slot;

typedef struct bytes_map {
    bytes_slot *slots;
    size_t mask; /* capacity - 1 (capacity is a power of two) */
} bytes_map;

/* (left id, right id) -> merge rank and merged id. */
typedef struct merge_entry {
    uint64_t key;   /* (left << 32 | right) + 1; 0 marks an empty slot */
    uint64_t value; /* rank << 32 | merged id */
} merge_entry;

typedef struct merge_map {
    merge_entry *entries; /* key and value side by side: one cache line per probe */
    size_t mask;
} merge_map;

typedef struct added_token {
    int32_t id;
    const char *content; /* NUL-terminated, owned by the tokenizer */
    size_t length;
    bool special;
    bool lstrip;
    bool rstrip;
    bool single_word;
    bool normalized;
} added_token;

/* The added tokens matched in one pass (leftmost, then longest), like Hugging Face's Aho-Corasick. */
typedef struct added_matcher {
    const added_token **tokens; /* sorted by first byte, then longest first */
    size_t count;
    uint32_t first[257];        /* tokens[first[b] .. first[b + 1]) start with byte b */
    int single_first_byte;      /* the one first byte all tokens share, or -1 (then memchr finds them) */
} added_matcher;

enum { TOKENIZER_MAX_SPLITS = 4 };

struct tokenizer {
    int32_t n_ids;           /* largest id + 1 */
    /* Per id, what it decodes to: bytes blob[offsets[id] .. offsets[id + 1]). */
    char *blob;
    uint32_t *offsets;
    uint8_t *id_kind;        /* 0: unused id, 1: model vocab, 2: added token, 3: added special token */
    bytes_map vocab;         /* byte string -> model id, for tokens written in byte-level symbols */
    int32_t byte_to_id[256]; /* the model id of each single byte */
    merge_map merges;
    bool ignore_merges;

    added_token *added;
    size_t n_added;
    char *added_strings;
    added_matcher raw_matcher;        /* added tokens with normalized = false: matched on the raw text */
    added_matcher normalized_matcher; /* normalized = true: matched on NFC text */

    /* Model tokens whose vocab string is not all byte-level symbols: unreachable by encode, but
     * token_to_id still finds them. Rare (none in Qwen3). */
    char **odd_strings;
    int32_t *odd_ids;
    size_t n_odd;

    bool normalize_nfc;
    pcre2_code *splits[TOKENIZER_MAX_SPLITS]; /* applied in order, each "Isolated" */
    size_t n_splits;
    bool jit;

    int32_t eos_id;
    int32_t bos_id;
    bool add_bos;
    uint64_t generation; /* distinguishes tokenizers in the per-thread piece cache */
};

/* Maps the 256 bytes to GPT-2's printable byte-level symbols and back. */
void byte_level_tables(uint32_t byte_to_char[256]);
/* Decodes a vocab string written in byte-level symbols into raw bytes (out needs length bytes);
 * false when some character is not a byte-level symbol. */
bool byte_level_decode(const char *s, size_t length, char *out, size_t *out_length);

uint64_t bytes_hash(const void *data, size_t length);
int32_t bytes_map_find(const tokenizer *t, const char *bytes, size_t length);
/* Inserts a model id under its blob bytes; false when those bytes are already there. */
bool bytes_map_insert(tokenizer *t, int32_t id);
uint64_t merge_hash(uint64_t key);

/* One member of model.vocab: its key (not NUL-terminated) and its id (-1 when it is not an integer). */
typedef struct vocab_item {
    const char *key;
    size_t key_length;
    int64_t id;
} vocab_item;

/* One of model.merges: its two sides, or (from the JSON reader) what is wrong with its form. */
typedef struct merge_item {
    const char *left, *right;
    size_t left_length, right_length;
    const char *bad_pair;  /* a string that is not "a b" (NUL-terminated), or NULL */
    bool bad_form;         /* neither a string nor two strings */
} merge_item;

/* model.vocab and model.merges read from the text itself (model_text.c), and the rest of the text with "{}"
 * and "[]" in their places for the JSON reader. The entries point into the text or into `decoded`. */
typedef struct model_text {
    vocab_item *vocab;
    size_t n_vocab, vocab_bytes; /* bytes reserved */
    merge_item *merges;
    size_t n_merges, merges_bytes;
    char *rest;
    size_t rest_length;
    char *decoded; /* the strings that had escapes, decoded */
    size_t decoded_used;
} model_text;

/* False, with nothing kept and no message, when the text is not in the plain form model_text.c reads. */
bool model_text_read(const char *text, size_t length, model_text *out);
void model_text_free(model_text *m);

/* Merged piece -> ids appended to out. */
kite_status bpe_encode_piece(const tokenizer *t, const char *piece, size_t length, id_buffer *out);

/* Valid UTF-8 copy of text with each maximal invalid subpart replaced by U+FFFD; NULL *out when the text
 * is already valid (then use it as is). */
kite_status utf8_repair(const char *text, size_t length, char **out, size_t *out_length);
/* Length of the valid UTF-8 sequence starting at s (1..4), or 0 when s does not start one; `available`
 * bytes may be read. *maximal_subpart gets how many bytes an invalid start covers (for U+FFFD). */
size_t utf8_sequence_check(const unsigned char *s, size_t available, size_t *maximal_subpart);
/* Appends text with invalid UTF-8 replaced by U+FFFD to a growable char buffer. */
kite_status utf8_append_lossy(char **buffer, size_t *length, size_t *capacity, const char *text, size_t n);

/* NFC (when the tokenizer asks for it) of valid UTF-8; *out is NULL when text is unchanged. */
kite_status pretokenize_normalize(const tokenizer *t, const char *text, size_t length, char **out,
                                  size_t *out_length);

/* Calls piece() for each pre-token of normalized text, in order. */
typedef kite_status (*pretokenize_piece_fn)(void *user, const char *piece, size_t length);
kite_status pretokenize_split(const tokenizer *t, const char *text, size_t length, pretokenize_piece_fn piece,
                              void *user);

/* Compiles a split pattern (PCRE2_UTF | PCRE2_UCP, JIT when available). */
kite_status pretokenize_compile(tokenizer *t, const char *pattern, size_t length, const char *where);

#endif

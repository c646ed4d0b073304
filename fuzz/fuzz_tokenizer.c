/* libFuzzer: encode on arbitrary bytes. Encode must accept anything (invalid UTF-8 becomes U+FFFD), every
 * id must be in the vocabulary, decode(encode(x)) must equal NFC of the repaired x, and the streaming
 * detokenizer must give the same text. The Qwen3 tokenizer is read once from tests/data/tokenizer (or
 * from $KITE_TOKENIZER_DIR). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tokenizer *fuzz_tokenizer;

static tokenizer *fuzz_get_tokenizer(void) {
    if (fuzz_tokenizer) return fuzz_tokenizer;
    const char *dir = getenv("KITE_TOKENIZER_DIR");
    char path[4096];
    if (!dir) {
        /* This file is fuzz/fuzz_tokenizer.c; the data sits in tests/data/tokenizer. */
        const char *file = __FILE__;
        const char *slash = strrchr(file, '/');
        size_t n = slash ? (size_t)(slash - file) : 0;
        snprintf(path, sizeof path, "%.*s%s../tests/data/tokenizer", (int)n, file, n ? "/" : "");
        dir = path;
    }
    if (tokenizer_load(dir, &fuzz_tokenizer) != KITE_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s (set KITE_TOKENIZER_DIR)\n", kite_last_error());
        abort();
    }
    return fuzz_tokenizer;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tokenizer *t = fuzz_get_tokenizer();
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode(t, (const char *)data, size, &ids, &n) != KITE_OK) __builtin_trap();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(t)) __builtin_trap();
    char *text = NULL;
    size_t length = 0;
    if (tokenizer_decode(t, ids, n, &text, &length) != KITE_OK) __builtin_trap();

    char *repaired = NULL;
    size_t repaired_length = 0;
    if (utf8_repair((const char *)data, size, &repaired, &repaired_length) != KITE_OK) __builtin_trap();
    utf8proc_uint8_t *expected = NULL;
    utf8proc_ssize_t expected_length =
        utf8proc_map(repaired ? (const utf8proc_uint8_t *)repaired : data,
                     (utf8proc_ssize_t)(repaired ? repaired_length : size), &expected, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    /* Added tokens are split out before normalization (as Hugging Face does), so NFC never composes across
     * them: the round trip equals NFC of the whole text only when no added token was found. */
    bool has_added_token = false;
    for (size_t i = 0; i < n; i++) has_added_token |= t->id_kind[ids[i]] >= 2;
    if (expected_length < 0) __builtin_trap();
    if (!has_added_token && ((size_t)expected_length != length || memcmp(expected, text, length) != 0)) __builtin_trap();

    detokenizer *d = NULL;
    if (detokenizer_create(t, &d) != KITE_OK) __builtin_trap();
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *piece;
        size_t piece_length;
        kite_status status = i < n ? detokenizer_push(d, ids[i], &piece, &piece_length)
                                   : detokenizer_flush(d, &piece, &piece_length);
        if (status != KITE_OK || at + piece_length > length || memcmp(text + at, piece, piece_length) != 0)
            __builtin_trap();
        at += piece_length;
    }
    if (at != length) __builtin_trap();
    detokenizer_free(d);
    free(expected);
    free(repaired);
    free(text);
    free(ids);
    return 0;
}

#include "serve_dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/file.h"

/* A text for prompts is a few megabytes at most; more is a wrong path. */
#define SERVE_CORPUS_MAX_BYTES (256u << 20)

bool serve_corpus_load(serve_corpus *corpus, const kite_tokenizer *tokenizer, const char *text_path) {
    *corpus = (serve_corpus){0};
    char *text = NULL;
    size_t length = 0;
    if (file_read_all(text_path, SERVE_CORPUS_MAX_BYTES, KITE_ERROR_IO, &text, &length) != KITE_OK) {
        fprintf(stderr, "kite-serve-bench: --text: %s\n", kite_last_error());
        return false;
    }
    kite_status status = kite_tokenizer_encode(tokenizer, text, length, &corpus->ids, &corpus->n_ids);
    free(text);
    if (status != KITE_OK) {
        fprintf(stderr, "kite-serve-bench: --text %s: %s\n", text_path, kite_last_error());
        return false;
    }
    return true;
}

void serve_corpus_free(serve_corpus *corpus) {
    kite_free(corpus->ids);
    *corpus = (serve_corpus){0};
}

uint64_t serve_rng_next(serve_rng *rng) {
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double serve_rng_uniform(serve_rng *rng) {
    return (double)((serve_rng_next(rng) >> 11) + 1) * (1.0 / 9007199254740992.0);
}

/* Whether text[0..length) is well-formed UTF-8 with no NUL (a request body is JSON, and a prompt a C string). */
static bool utf8_valid(const unsigned char *text, size_t length) {
    for (size_t i = 0; i < length;) {
        const unsigned char c = text[i];
        size_t extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : 4;
        if (c == 0 || extra == 4 || (extra && c < 0xc2) || i + extra >= length + (extra ? 0 : 1)) return false;
        uint32_t point = extra ? c & (0x3f >> extra) : c;
        for (size_t k = 1; k <= extra; k++) {
            if ((text[i + k] & 0xc0) != 0x80) return false;
            point = (point << 6) | (text[i + k] & 0x3f);
        }
        if ((extra == 2 && point < 0x800) || (extra == 3 && (point < 0x10000 || point > 0x10ffff)) ||
            (point >= 0xd800 && point <= 0xdfff))
            return false;
        i += extra + 1;
    }
    return true;
}

/* A window may start or end inside a character (byte-level BPE splits some into several tokens); such a window
 * is drawn again, up to this many times. */
#define SERVE_WINDOW_TRIES 1000

/* The decoded text of a window of `length` tokens at a random place; NULL (message on stderr) on failure. */
static char *window_text(const serve_corpus *corpus, const kite_tokenizer *tokenizer, size_t length, serve_rng *rng) {
    const size_t places = corpus->n_ids - length + 1;
    for (int attempt = 0; attempt < SERVE_WINDOW_TRIES; attempt++) {
        size_t start = (size_t)(serve_rng_next(rng) % places);
        char *text = NULL;
        size_t text_length = 0;
        if (kite_tokenizer_decode(tokenizer, corpus->ids + start, length, &text, &text_length) != KITE_OK) {
            fprintf(stderr, "kite-serve-bench: decoding a prompt: %s\n", kite_last_error());
            return NULL;
        }
        if (utf8_valid((const unsigned char *)text, text_length)) return text;
        kite_free(text);
    }
    fprintf(stderr,
            "kite-serve-bench: --text: no window of %zu tokens decodes to whole UTF-8 characters in %d "
            "tries\n",
            length, SERVE_WINDOW_TRIES);
    return NULL;
}

bool serve_dataset_make(serve_dataset_kind kind, const serve_corpus *corpus, const kite_tokenizer *tokenizer, size_t n,
                        size_t input_len, size_t prefix_len, serve_rng *rng, char ***prompts) {
    *prompts = NULL;
    const size_t longest = kind == SERVE_DATASET_SHARED_PREFIX && prefix_len > input_len ? prefix_len : input_len;
    if (input_len == 0 || (kind == SERVE_DATASET_SHARED_PREFIX && prefix_len == 0)) {
        fprintf(stderr, "kite-serve-bench: --input-len%s must be at least 1\n",
                kind == SERVE_DATASET_SHARED_PREFIX ? " and --prefix-len" : "");
        return false;
    }
    if (corpus->n_ids < longest) {
        fprintf(stderr, "kite-serve-bench: --text has %zu tokens; a window of %zu needs a longer text\n", corpus->n_ids,
                longest);
        return false;
    }
    char **out = calloc(n ? n : 1, sizeof *out);
    if (!out) {
        fprintf(stderr, "kite-serve-bench: out of memory for %zu prompts\n", n);
        return false;
    }
    char *prefix = NULL;
    size_t prefix_length = 0;
    if (kind == SERVE_DATASET_SHARED_PREFIX) {
        prefix = window_text(corpus, tokenizer, prefix_len, rng);
        if (!prefix) {
            free(out);
            return false;
        }
        prefix_length = strlen(prefix);
    }
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        char *turn = window_text(corpus, tokenizer, input_len, rng);
        if (!turn) {
            ok = false;
            break;
        }
        /* Copied so that every prompt is the generator's to free(). */
        size_t turn_length = strlen(turn);
        out[i] = malloc(prefix_length + turn_length + 1);
        if (out[i]) {
            if (prefix_length) memcpy(out[i], prefix, prefix_length);
            memcpy(out[i] + prefix_length, turn, turn_length + 1);
        } else {
            fprintf(stderr, "kite-serve-bench: out of memory for a prompt\n");
            ok = false;
        }
        kite_free(turn);
    }
    kite_free(prefix);
    if (!ok) {
        serve_dataset_free(out, n);
        return false;
    }
    *prompts = out;
    return true;
}

void serve_dataset_free(char **prompts, size_t n) {
    if (!prompts) return;
    for (size_t i = 0; i < n; i++)
        free(prompts[i]);
    free(prompts);
}

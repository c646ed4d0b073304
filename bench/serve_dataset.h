/* The load generator's prompts, cut from a text by token count with the checkpoint's tokenizer, as vLLM's
 * `bench serve` datasets are:
 *   random:        each prompt a window of `input_len` tokens at a random place in the text, decoded;
 *   shared-prefix: one window of `prefix_len` tokens (the system prompt, the same in every request) followed by
 *                  a window of `input_len` tokens of its own (the user turn).
 * A decoded window tokenizes back to about its length (a word cut at either end may split differently), so the
 * figures use the server's own count (usage.prompt_tokens), never these lengths. */
#ifndef KITE_BENCH_SERVE_DATASET_H
#define KITE_BENCH_SERVE_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kite.h"

typedef enum serve_dataset_kind {
    SERVE_DATASET_RANDOM,
    SERVE_DATASET_SHARED_PREFIX,
} serve_dataset_kind;

typedef struct serve_corpus {
    int32_t *ids; /* the whole text, tokenized */
    size_t n_ids;
} serve_corpus;

/* Reads and tokenizes `text_path`. False with a message on stderr. */
bool serve_corpus_load(serve_corpus *corpus, const kite_tokenizer *tokenizer, const char *text_path);
void serve_corpus_free(serve_corpus *corpus);

/* A deterministic generator (splitmix64): the same seed gives the same prompts and arrival times. */
typedef struct serve_rng {
    uint64_t state;
} serve_rng;
uint64_t serve_rng_next(serve_rng *rng);
double serve_rng_uniform(serve_rng *rng); /* in (0, 1] */

/* n prompts (malloc'd, NUL-terminated, in *prompts[0..n)), or false with a message on stderr. prefix_len is read
 * for SHARED_PREFIX only. */
bool serve_dataset_make(serve_dataset_kind kind, const serve_corpus *corpus, const kite_tokenizer *tokenizer, size_t n,
                        size_t input_len, size_t prefix_len, serve_rng *rng, char ***prompts);
void serve_dataset_free(char **prompts, size_t n);

#endif

/* The life of one request inside the engine: its tokens, how many of them are in the KV cache, its
 * blocks, its sampler, and the text it has produced (with stop strings and incomplete UTF-8 held back
 * until they are decided). */
#ifndef KITE_ENGINE_REQUEST_H
#define KITE_ENGINE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kite.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

typedef enum request_state {
    REQUEST_WAITING,  /* queued, or preempted: nothing in the KV cache */
    REQUEST_RUNNING,  /* in the batch: has blocks */
    REQUEST_FINISHED, /* done; removed at the end of the step */
} request_state;

typedef struct engine_request {
    kite_request_id id;
    request_state state;

    /* Prompt then generated tokens. tokens[0 .. n_computed) have keys/values in the cache; the rest
     * are fed at the next steps (a prompt in chunks, then one sampled token per step). */
    int32_t *tokens;
    size_t n_tokens, tokens_capacity;
    size_t n_prompt;
    size_t n_computed;
    int32_t n_generated;

    int32_t *block_table; /* block_table[i] holds positions [i * block_size, (i + 1) * block_size) */
    int32_t n_blocks, block_table_capacity;
    /* Prefix caching (kv_cache.h): block_table[0 .. n_hashed_blocks) are full blocks whose content is in the
     * cache (taken from it at admission, or registered once computed); prefix_serial is the serial of that
     * content's last block (0 when none), the parent of the next block to register. */
    int32_t n_hashed_blocks;
    uint64_t prefix_serial;

    sampler *sampler;
    bool greedy;          /* temperature 0, no penalty, bias or min_tokens: the backend's argmax is enough */
    int32_t max_tokens;   /* 0 = no limit but the context */
    bool ignore_eos;
    int32_t min_tokens;   /* eos, stop ids and stop strings end the request only from this many tokens on */
    int32_t stop_ids[KITE_MAX_STOP_IDS]; /* end the request like eos, ignore_eos or not */
    int32_t n_stop_ids;
    int32_t n_logprobs;
    /* The insertion (kite_request.insert_after / insert_ids): n_insert_ids 0 when there is none. `inserted` once
     * it was appended; n_just_inserted is how many ids the last appended token brought (its event reports them). */
    int32_t insert_after;
    int32_t insert_ids[KITE_MAX_INSERT_IDS];
    int32_t n_insert_ids;
    bool inserted;
    int32_t n_just_inserted;
    kite_token_callback on_token;
    void *user_data;

    /* Text. `text` holds everything decoded so far; text[0 .. text_emitted) went to the callback. */
    detokenizer *detokenizer; /* NULL when the model has no tokenizer (ids only) */
    int32_t text_vocab_size;  /* ids at or past this (the lm_head's padding rows) have no text */
    char *text;
    size_t text_length, text_capacity, text_emitted;
    char **stop_strings;
    int32_t n_stop_strings;
    size_t longest_stop;

    kite_finish_reason finish;
    bool finish_reported;
} engine_request;

/* Builds a request from the public description, validating every field (kite_fail names it). The prompt must
 * already be token ids; `eos_ids` are the model's (min_tokens masks them). */
kite_status request_create(const kite_request *desc, const int32_t *prompt, size_t n_prompt, int32_t vocab_size,
                           const int32_t *eos_ids, int32_t n_eos_ids, const tokenizer *tok, kite_request_id id,
                           engine_request **out);
void request_free(engine_request *r);

/* Appends a sampled token: updates the sampler context, the text, and the finish reason (eos, stop
 * string, max_tokens, context limit). `eos_ids` are the model's. When the token triggers the request's insertion
 * and does not end it, the insertion's ids follow it (tokens, sampler context as prompt tokens, text) and
 * n_just_inserted says how many. */
kite_status request_append_token(engine_request *r, int32_t token, const int32_t *eos_ids, int32_t n_eos_ids,
                                 size_t max_context);

/* The text that may be released now: all of it when finished (cut before a stop string), otherwise
 * everything but a tail that could still begin a stop string. Advances text_emitted. */
void request_take_text(engine_request *r, const char **text, size_t *length);

#endif

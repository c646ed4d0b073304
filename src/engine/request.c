#include "engine/request.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "util/error.h"

static bool reserve_bytes(char **buffer, size_t *capacity, size_t needed) {
    if (needed <= *capacity) return true;
    size_t grown = *capacity ? *capacity * 2 : 256;
    while (grown < needed) grown *= 2;
    char *p = realloc(*buffer, grown);
    if (!p) return false;
    *buffer = p;
    *capacity = grown;
    return true;
}

/* A seed from the system's entropy, for a request that gives none (kite_sampling.fresh_seed). */
static kite_status draw_fresh_seed(uint64_t *seed) {
    if (getentropy(seed, sizeof *seed) != 0)
        return kite_fail(KITE_ERROR_IO, "request: getentropy for a fresh seed failed: %s", strerror(errno));
    return KITE_OK;
}

/* The request's sampler: its kite_sampling with the logit_bias, and min_tokens over the ids that could end the
 * request (its stop ids, and the model's eos ids unless ignore_eos, as vLLM's all_stop_token_ids). *processes:
 * whether it changes logits before temperature (sampler_params_process_logits). */
static kite_status create_sampler(const kite_request *desc, int32_t vocab_size, const int32_t *eos_ids,
                                  int32_t n_eos_ids, sampler **out, bool *processes) {
    sampler_params sp = sampler_params_from(&desc->sampling);
    if (desc->sampling.fresh_seed) KITE_TRY(draw_fresh_seed(&sp.seed));
    sp.logit_bias = desc->logit_bias;
    sp.n_logit_bias = desc->n_logit_bias;
    sp.min_tokens = desc->min_tokens;
    int32_t *ending_ids = NULL;
    int32_t n_ending = 0;
    if (desc->min_tokens > 0) {
        ending_ids = malloc((size_t)(desc->n_stop_ids + n_eos_ids + 1) * sizeof *ending_ids);
        if (!ending_ids) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "request: out of memory");
        for (int32_t i = 0; i < desc->n_stop_ids; i++) ending_ids[n_ending++] = desc->stop_ids[i];
        if (!desc->ignore_eos)
            for (int32_t i = 0; i < n_eos_ids; i++) ending_ids[n_ending++] = eos_ids[i];
    }
    sp.min_tokens_ids = ending_ids;
    sp.n_min_tokens_ids = n_ending;
    *processes = sampler_params_process_logits(&sp);
    kite_status status = sampler_create(&sp, vocab_size, out); /* copies the ids */
    free(ending_ids);
    return status;
}

kite_status request_create(const kite_request *desc, const int32_t *prompt, size_t n_prompt, int32_t vocab_size,
                           const int32_t *eos_ids, int32_t n_eos_ids, const tokenizer *tok, kite_request_id id,
                           engine_request **out) {
    *out = NULL;
    if (n_prompt == 0) return kite_fail(KITE_ERROR_INVALID_INPUT, "request: the prompt is empty");
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= vocab_size)
            return kite_fail(KITE_ERROR_INVALID_INPUT, "request: prompt token %zu is %d, outside the vocabulary [0, %d)",
                             i, prompt[i], vocab_size);
    if (desc->max_tokens < 0) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: max_tokens is negative");
    if (desc->n_logprobs < 0 || desc->n_logprobs > KITE_MAX_LOGPROBS)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: n_logprobs %d is outside 0..%d", desc->n_logprobs,
                         KITE_MAX_LOGPROBS);
    if (desc->n_stop_strings < 0 || (desc->n_stop_strings > 0 && !desc->stop_strings))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: bad stop strings");
    if (desc->n_stop_ids < 0 || desc->n_stop_ids > KITE_MAX_STOP_IDS || (desc->n_stop_ids > 0 && !desc->stop_ids))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: %d stop ids, at most %d", desc->n_stop_ids,
                         KITE_MAX_STOP_IDS);
    for (int32_t i = 0; i < desc->n_stop_ids; i++)
        if (desc->stop_ids[i] < 0 || desc->stop_ids[i] >= vocab_size)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: stop id %d is outside the vocabulary [0, %d)",
                             desc->stop_ids[i], vocab_size);
    if (desc->n_stop_strings > 0 && !tok)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: stop strings need a model with a tokenizer");
    if (desc->min_tokens < 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: min_tokens %d must be >= 0", desc->min_tokens);
    if (desc->max_tokens > 0 && desc->min_tokens > desc->max_tokens)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: min_tokens %d is more than max_tokens %d",
                         desc->min_tokens, desc->max_tokens);
    if (desc->n_logit_bias < 0 || desc->n_logit_bias > KITE_MAX_LOGIT_BIAS ||
        (desc->n_logit_bias > 0 && !desc->logit_bias))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: logit_bias has %d entries, at most %d",
                         desc->n_logit_bias, KITE_MAX_LOGIT_BIAS);
    if (desc->n_insert_ids < 0 || desc->n_insert_ids > KITE_MAX_INSERT_IDS ||
        (desc->n_insert_ids > 0 && !desc->insert_ids))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: the insertion has %d ids, at most %d",
                         desc->n_insert_ids, KITE_MAX_INSERT_IDS);
    if (desc->n_insert_ids > 0 && (desc->insert_after < 0 || desc->insert_after >= vocab_size))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: insert_after %d is outside the vocabulary [0, %d)",
                         desc->insert_after, vocab_size);
    for (int32_t i = 0; i < desc->n_insert_ids; i++)
        if (desc->insert_ids[i] < 0 || desc->insert_ids[i] >= vocab_size)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                             "request: insert_ids[%d] is %d, outside the vocabulary [0, %d)", i, desc->insert_ids[i],
                             vocab_size);
    if (desc->sampling.fresh_seed && desc->sampling.seed != 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: sampling.seed %llu and fresh_seed together (a fresh "
                         "seed replaces it: give one or the other)", (unsigned long long)desc->sampling.seed);

    engine_request *r = calloc(1, sizeof *r);
    if (!r) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "out of memory");
    r->id = id;
    r->state = REQUEST_WAITING;
    r->tokens_capacity = n_prompt + 64;
    r->tokens = malloc(r->tokens_capacity * sizeof(int32_t));
    if (!r->tokens) goto out_of_memory;
    memcpy(r->tokens, prompt, n_prompt * sizeof(int32_t));
    r->n_tokens = r->n_prompt = n_prompt;
    r->max_tokens = desc->max_tokens;
    r->ignore_eos = desc->ignore_eos;
    r->min_tokens = desc->min_tokens;
    if (desc->n_stop_ids > 0) memcpy(r->stop_ids, desc->stop_ids, (size_t)desc->n_stop_ids * sizeof(int32_t));
    r->n_stop_ids = desc->n_stop_ids;
    r->n_logprobs = desc->n_logprobs;
    r->insert_after = desc->insert_after;
    if (desc->n_insert_ids > 0)
        memcpy(r->insert_ids, desc->insert_ids, (size_t)desc->n_insert_ids * sizeof(int32_t));
    r->n_insert_ids = desc->n_insert_ids;
    r->on_token = desc->on_token;
    r->user_data = desc->user_data;

    bool processes = false;
    kite_status status = create_sampler(desc, vocab_size, eos_ids, n_eos_ids, &r->sampler, &processes);
    if (status != KITE_OK) {
        request_free(r);
        return status;
    }
    for (size_t i = 0; i < n_prompt; i++) sampler_accept_prompt(r->sampler, prompt[i]);
    /* A request whose logits are processed (penalties, logit_bias, min_tokens) is never read by argmax alone: the
     * backend's argmax and its reduced rows see the raw logits. */
    r->greedy = desc->sampling.temperature == 0.0f && !processes;

    if (tok) {
        r->text_vocab_size = tokenizer_vocab_size(tok);
        status = detokenizer_create(tok, &r->detokenizer);
        if (status != KITE_OK) {
            request_free(r);
            return status;
        }
    }
    if (desc->n_stop_strings > 0) {
        r->stop_strings = calloc((size_t)desc->n_stop_strings, sizeof(char *));
        if (!r->stop_strings) goto out_of_memory;
        r->n_stop_strings = desc->n_stop_strings;
        for (int32_t i = 0; i < desc->n_stop_strings; i++) {
            const char *stop = desc->stop_strings[i];
            if (!stop || !stop[0]) {
                request_free(r);
                return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: stop string %d is empty", i);
            }
            r->stop_strings[i] = strdup(stop);
            if (!r->stop_strings[i]) goto out_of_memory;
            size_t n = strlen(stop);
            if (n > r->longest_stop) r->longest_stop = n;
        }
    }
    *out = r;
    return KITE_OK;

out_of_memory:
    request_free(r);
    return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "request: out of memory");
}

void request_free(engine_request *r) {
    if (!r) return;
    free(r->tokens);
    free(r->block_table);
    sampler_free(r->sampler);
    detokenizer_free(r->detokenizer);
    free(r->text);
    for (int32_t i = 0; i < r->n_stop_strings; i++) free(r->stop_strings[i]);
    free(r->stop_strings);
    free(r);
}

/* Looks for a stop string that ends in the text added since `search_from` (minus the longest stop's
 * length, so a stop spanning two tokens is found). Cuts the text before the earliest one. */
static bool apply_stop_strings(engine_request *r, size_t new_text_start) {
    if (r->n_stop_strings == 0) return false;
    size_t from = new_text_start > r->longest_stop ? new_text_start - r->longest_stop + 1 : 0;
    if (from < r->text_emitted) from = r->text_emitted;
    size_t earliest = (size_t)-1;
    for (int32_t i = 0; i < r->n_stop_strings; i++) {
        const char *stop = r->stop_strings[i];
        size_t n = strlen(stop);
        for (size_t at = from; at + n <= r->text_length; at++) {
            if (memcmp(r->text + at, stop, n) == 0) {
                if (at < earliest) earliest = at;
                break;
            }
        }
    }
    if (earliest == (size_t)-1) return false;
    r->text_length = earliest; /* the stop string itself is not part of the output, as in vLLM */
    return true;
}

static kite_status push_token(engine_request *r, int32_t token) {
    if (r->n_tokens == r->tokens_capacity) {
        size_t grown = r->tokens_capacity * 2;
        int32_t *p = realloc(r->tokens, grown * sizeof(int32_t));
        if (!p) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "request: out of memory");
        r->tokens = p;
        r->tokens_capacity = grown;
    }
    r->tokens[r->n_tokens++] = token;
    return KITE_OK;
}

/* Adds a token's text and looks for stop strings in it; a stop string ends the request (*stop_string_hit). */
static kite_status append_text(engine_request *r, int32_t token, bool *stop_string_hit) {
    /* Ids past the tokenizer's vocabulary (config.json's vocab_size pads the lm_head, 151,936 rows against
     * 151,669 tokens) decode to nothing, as Hugging Face's decode skips ids it does not know. */
    if (!r->detokenizer || token >= r->text_vocab_size) return KITE_OK;
    const char *piece;
    size_t piece_length;
    KITE_TRY(detokenizer_push(r->detokenizer, token, &piece, &piece_length));
    size_t start = r->text_length;
    if (!reserve_bytes(&r->text, &r->text_capacity, r->text_length + piece_length + 1))
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "request: out of memory");
    memcpy(r->text + r->text_length, piece, piece_length);
    r->text_length += piece_length;
    /* Stop strings count from the token after min_tokens, as vLLM's detokenizer looks for them. */
    if (r->n_generated > r->min_tokens && apply_stop_strings(r, start)) {
        r->finish = KITE_FINISH_STOP;
        *stop_string_hit = true;
    }
    return KITE_OK;
}

/* The insertion after its trigger: its ids join the sequence as prompt tokens do (the sampler's context, no
 * generated count) and their text joins the answer, where a stop string may still end it. */
static kite_status insert_tokens(engine_request *r, size_t max_context, bool *stop_string_hit) {
    r->inserted = true;
    if (r->n_tokens + (size_t)r->n_insert_ids >= max_context) {
        r->finish = KITE_FINISH_LENGTH; /* no room for the insertion and one more token */
        return KITE_OK;
    }
    for (int32_t i = 0; i < r->n_insert_ids && r->finish == KITE_FINISH_NONE; i++) {
        KITE_TRY(push_token(r, r->insert_ids[i]));
        sampler_accept_prompt(r->sampler, r->insert_ids[i]);
        r->n_just_inserted++;
        KITE_TRY(append_text(r, r->insert_ids[i], stop_string_hit));
    }
    return KITE_OK;
}

kite_status request_append_token(engine_request *r, int32_t token, const int32_t *eos_ids, int32_t n_eos_ids,
                                 size_t max_context) {
    KITE_TRY(push_token(r, token));
    r->n_generated++;
    r->n_just_inserted = 0;
    sampler_accept(r->sampler, token);

    bool is_eos = false, stop_string_hit = false;
    for (int32_t i = 0; i < n_eos_ids; i++) is_eos |= token == eos_ids[i];
    bool is_stop_id = false;
    for (int32_t i = 0; i < r->n_stop_ids; i++) is_stop_id |= token == r->stop_ids[i];
    /* Before min_tokens, nothing but a length limit ends the request (vLLM's check_stop); the sampler has masked
     * the eos and stop ids meanwhile, so this only decides a token that came anyway. */
    const bool may_stop = r->n_generated >= r->min_tokens;
    if (may_stop && ((is_eos && !r->ignore_eos) || is_stop_id))
        r->finish = KITE_FINISH_STOP; /* the eos token's text is not part of the output */
    else
        KITE_TRY(append_text(r, token, &stop_string_hit));
    if (r->finish == KITE_FINISH_NONE) {
        if (r->max_tokens > 0 && r->n_generated >= r->max_tokens)
            r->finish = KITE_FINISH_LENGTH;
        else if (r->n_tokens >= max_context)
            r->finish = KITE_FINISH_LENGTH;
    }
    if (r->finish == KITE_FINISH_NONE && r->n_insert_ids > 0 && !r->inserted && token == r->insert_after)
        KITE_TRY(insert_tokens(r, max_context, &stop_string_hit));
    if (r->finish != KITE_FINISH_NONE && !stop_string_hit && r->detokenizer) {
        /* Whatever incomplete UTF-8 is left becomes U+FFFD, exactly as a full decode would render it. */
        const char *rest;
        size_t rest_length;
        KITE_TRY(detokenizer_flush(r->detokenizer, &rest, &rest_length));
        if (!reserve_bytes(&r->text, &r->text_capacity, r->text_length + rest_length + 1))
            return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "request: out of memory");
        memcpy(r->text + r->text_length, rest, rest_length);
        r->text_length += rest_length;
    }
    return KITE_OK;
}

void request_take_text(engine_request *r, const char **text, size_t *length) {
    size_t release = r->text_length;
    if (r->finish == KITE_FINISH_NONE && r->n_stop_strings > 0) {
        /* Hold back the longest tail that is a proper prefix of some stop string. */
        size_t hold = 0;
        for (int32_t i = 0; i < r->n_stop_strings; i++) {
            size_t n = strlen(r->stop_strings[i]);
            for (size_t k = n - 1; k > hold; k--) {
                if (k <= r->text_length - r->text_emitted &&
                    memcmp(r->text + r->text_length - k, r->stop_strings[i], k) == 0) {
                    hold = k;
                    break;
                }
            }
        }
        release = r->text_length - hold;
    }
    if (release < r->text_emitted) release = r->text_emitted;
    *text = r->text ? r->text + r->text_emitted : "";
    *length = release - r->text_emitted;
    r->text_emitted = release;
}

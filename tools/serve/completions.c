/* /v1/completions (completions.h). */
#include "serve/completions.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The prompt: text (tokenized here) or token ids. */
static bool parse_prompt(const kite_model *model, const json_t *prompt, serve_request *r, field_error *e) {
    if (json_is_string(prompt)) {
        kite_status status = kite_tokenize(model, json_string_value(prompt), json_string_length(prompt),
                                           &r->prompt_ids, &r->n_prompt);
        if (status != KITE_OK) {
            field_error_set(e, "prompt", "prompt: %s", kite_last_error());
            return false;
        }
    } else if (json_is_array(prompt) && json_array_size(prompt) > 0 && json_is_number(json_array_get(prompt, 0))) {
        size_t n = json_array_size(prompt);
        r->prompt_ids = malloc(n * sizeof(int32_t));
        if (!r->prompt_ids) {
            field_error_set(e, "prompt", "out of memory");
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *item = json_array_get(prompt, i);
            json_int_t v = json_is_integer(item) ? json_integer_value(item) : -1;
            if (v < 0 || v > INT32_MAX) {
                field_error_set(e, "prompt", "prompt[%zu] is not a token id", i);
                return false;
            }
            r->prompt_ids[i] = (int32_t)v;
        }
        r->n_prompt = n;
    } else {
        field_error_set(e, "prompt",
                        "'prompt' must be a string or an array of token ids (one prompt per request)");
        return false;
    }
    if (r->n_prompt == 0) {
        field_error_set(e, "prompt", "the prompt is empty");
        return false;
    }
    r->request.prompt_ids = r->prompt_ids;
    r->request.n_prompt_ids = r->n_prompt;
    return true;
}

/* echo, suffix, best_of above 1 and streamed logprobs change what a completion returns: until kite returns them, a
 * request asking for them gets a 400 rather than an answer without them. */
static bool refuse_unimplemented(const json_t *root, field_error *e) {
    const json_t *echo = json_object_get(root, "echo"), *suffix = json_object_get(root, "suffix");
    const json_t *best_of = json_object_get(root, "best_of"), *logprobs = json_object_get(root, "logprobs");
    if (echo && !json_is_null(echo) && !json_is_false(echo)) {
        field_error_set(e, "echo", "'echo' is not implemented");
        return false;
    }
    if (suffix && !json_is_null(suffix)) {
        field_error_set(e, "suffix", "'suffix' is not implemented (kite has no fill-in-the-middle completions)");
        return false;
    }
    if (best_of && !json_is_null(best_of) && !(json_is_integer(best_of) && json_integer_value(best_of) == 1)) {
        field_error_set(e, "best_of", "'best_of' above 1 is not implemented");
        return false;
    }
    if (logprobs && !json_is_null(logprobs)) {
        if (!json_is_integer(logprobs) || json_integer_value(logprobs) < 1 ||
            json_integer_value(logprobs) > KITE_MAX_LOGPROBS) {
            field_error_set(e, "logprobs", "'logprobs' must be an integer in [1, %d] (the top tokens per position)",
                            KITE_MAX_LOGPROBS);
            return false;
        }
        const json_t *stream = json_object_get(root, "stream");
        if (json_is_true(stream)) {
            field_error_set(e, "logprobs", "'logprobs' with 'stream' is not implemented yet");
            return false;
        }
    }
    return true;
}

serve_request *completions_parse(const kite_model *model, const char *served_model, const char *body, size_t length,
                                 field_error *e) {
    json_t *root = request_fields_load(body, length, e);
    if (!root) return NULL;
    serve_request *r = serve_request_new(SERVE_ENDPOINT_COMPLETIONS);
    if (!r) {
        field_error_set(e, NULL, "out of memory");
        json_decref(root);
        return NULL;
    }
    r->request.max_tokens = 16; /* OpenAI's default for completions */
    const json_t *seed = json_object_get(root, "seed");
    /* Fields kite does not know are ignored, as OpenAI-compatible servers do; those of OpenAI's API that kite
     * does not implement yet are refused. */
    const bool ok = request_fields_model(root, served_model, e) && refuse_unimplemented(root, e) &&
                    parse_prompt(model, json_object_get(root, "prompt"), r, e) &&
                    request_fields_numbers(root, &r->request, e) && request_fields_logit_bias(root, r, e) &&
                    request_fields_stop(root, r, e) && request_fields_stream(root, r, e) &&
                    request_fields_bool(root, "ignore_eos", &r->request.ignore_eos, e); /* vLLM's extension */
    const json_t *logprobs = json_object_get(root, "logprobs");
    if (ok && json_is_integer(logprobs)) r->request.n_logprobs = (int32_t)json_integer_value(logprobs);
    /* No seed: a fresh one per request (OpenAI's and vLLM's), drawn by the library at submit. */
    if (ok && (!seed || json_is_null(seed))) r->request.sampling.fresh_seed = true;
    json_decref(root);
    if (!ok) {
        serve_request_free(r);
        return NULL;
    }
    return r;
}

static void head(text_buffer *b, const char *model_name, const serve_request *r) {
    text_buffer_printf(b, "{\"id\":\"cmpl-%ld\",\"object\":\"text_completion\",\"created\":%lld,\"model\":",
                       r->number, (long long)time(NULL));
    text_buffer_json_string(b, model_name, strlen(model_name));
}

/* A token's text as its own piece (kite_detokenize of it alone: a piece of a multi-byte character reads as U+FFFD,
 * as vLLM's tokens do); false when out of memory. */
static bool token_string(const kite_model *model, int32_t token, char **text, size_t *length) {
    if (kite_detokenize(model, &token, 1, text, length) == KITE_OK) return true;
    *text = NULL;
    return false;
}

/* The number of characters (code points) of UTF-8 text: OpenAI's text_offset counts characters. */
static size_t utf8_characters(const char *text, size_t length) {
    size_t n = 0;
    for (size_t i = 0; i < length; i++) n += ((unsigned char)text[i] & 0xC0) != 0x80;
    return n;
}

/* OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs (token text -> logprob) and text_offset. */
static void logprobs_json(text_buffer *b, const kite_model *model, const serve_request *r) {
    text_buffer tokens = {0}, values = {0}, tops = {0}, offsets = {0};
    size_t offset = 0;
    for (size_t i = 0; i < r->n_logprobs_kept; i++) {
        const serve_logprob *lp = &r->logprobs[i];
        const char *sep = i ? "," : "";
        char *text = NULL;
        size_t length = 0;
        token_string(model, lp->token, &text, &length);
        text_buffer_puts(&tokens, sep);
        text_buffer_json_string(&tokens, text ? text : "", text ? length : 0);
        text_buffer_printf(&values, "%s%.9g", sep, (double)lp->logprob);
        text_buffer_printf(&offsets, "%s%zu", sep, offset);
        offset += text ? utf8_characters(text, length) : 0;
        kite_free(text);
        text_buffer_printf(&tops, "%s{", sep);
        for (int32_t k = 0; k < lp->n_top; k++) {
            char *top = NULL;
            size_t top_length = 0;
            token_string(model, lp->top_ids[k], &top, &top_length);
            if (k) text_buffer_puts(&tops, ",");
            text_buffer_json_string(&tops, top ? top : "", top ? top_length : 0);
            text_buffer_printf(&tops, ":%.9g", (double)lp->top_logprobs[k]);
            kite_free(top);
        }
        text_buffer_puts(&tops, "}");
    }
    text_buffer_puts(b, "{\"tokens\":[");
    text_buffer_append(b, tokens.data ? tokens.data : "", tokens.length);
    text_buffer_puts(b, "],\"token_logprobs\":[");
    text_buffer_append(b, values.data ? values.data : "", values.length);
    text_buffer_puts(b, "],\"top_logprobs\":[");
    text_buffer_append(b, tops.data ? tops.data : "", tops.length);
    text_buffer_puts(b, "],\"text_offset\":[");
    text_buffer_append(b, offsets.data ? offsets.data : "", offsets.length);
    text_buffer_puts(b, "]}");
    text_buffer_free(&tokens);
    text_buffer_free(&values);
    text_buffer_free(&tops);
    text_buffer_free(&offsets);
}

static void choice(text_buffer *b, const kite_model *model, const serve_request *r, const char *text, size_t length,
                   bool last) {
    text_buffer_puts(b, ",\"choices\":[{\"index\":0,\"text\":");
    text_buffer_json_string(b, text ? text : "", length);
    text_buffer_puts(b, ",\"logprobs\":");
    if (model && r->request.n_logprobs > 0)
        logprobs_json(b, model, r);
    else
        text_buffer_puts(b, "null");
    text_buffer_puts(b, ",\"finish_reason\":");
    if (last)
        text_buffer_printf(b, "\"%s\"", kite_finish_reason_string(r->finish));
    else
        text_buffer_puts(b, "null");
    text_buffer_puts(b, "}]");
}

void completions_chunk_json(text_buffer *b, const char *model_name, const serve_request *r, const char *text,
                            size_t length, bool last) {
    head(b, model_name, r);
    choice(b, NULL, r, text, length, last); /* streamed logprobs are refused at parse */
    if (r->include_usage) text_buffer_puts(b, ",\"usage\":null"); /* OpenAI's: usage comes in a chunk of its own */
    text_buffer_puts(b, "}");
}

void completions_usage_chunk_json(text_buffer *b, const char *model_name, const serve_request *r) {
    head(b, model_name, r);
    text_buffer_puts(b, ",\"choices\":[]");
    serve_request_usage_json(b, r);
    text_buffer_puts(b, "}");
}

void completions_whole_json(text_buffer *b, const kite_model *model, const char *model_name, const serve_request *r) {
    head(b, model_name, r);
    choice(b, model, r, r->whole_text.data, r->whole_text.length, true);
    serve_request_usage_json(b, r);
    text_buffer_puts(b, "}");
}

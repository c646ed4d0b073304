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

/* suffix, best_of above 1 and echo with logprobs change what a completion returns: until kite returns them, a
 * request asking for them gets a 400 rather than an answer without them. */
static bool refuse_unimplemented(const json_t *root, int n, bool echo, field_error *e) {
    const json_t *suffix = json_object_get(root, "suffix"), *best_of = json_object_get(root, "best_of");
    const json_t *logprobs = json_object_get(root, "logprobs");
    if (suffix && !json_is_null(suffix)) {
        field_error_set(e, "suffix", "'suffix' is not implemented (kite has no fill-in-the-middle completions)");
        return false;
    }
    if (best_of && !json_is_null(best_of)) {
        if (!json_is_integer(best_of) || json_integer_value(best_of) < n) {
            field_error_set(e, "best_of", "'best_of' must be an integer of at least 'n' (%d)", n);
            return false;
        }
        if (json_integer_value(best_of) > 1) {
            field_error_set(e, "best_of", "'best_of' above 1 is not implemented (ask for 'n' choices instead)");
            return false;
        }
    }
    if (logprobs && !json_is_null(logprobs)) {
        if (!json_is_integer(logprobs) || json_integer_value(logprobs) < 1 ||
            json_integer_value(logprobs) > KITE_MAX_LOGPROBS) {
            field_error_set(e, "logprobs", "'logprobs' must be an integer in [1, %d] (the top tokens per position)",
                            KITE_MAX_LOGPROBS);
            return false;
        }
        /* echo's logprobs begin with the prompt's tokens, which the engine computes but does not score. */
        if (echo) {
            field_error_set(e, "echo", "'echo' with 'logprobs' is not implemented (kite has no prompt logprobs)");
            return false;
        }
    }
    return true;
}

/* echo's prompt as text: the prompt string itself, or the token ids detokenized (as vLLM echoes them). */
static bool keep_echo_text(const kite_model *model, const json_t *prompt, serve_request *r, field_error *e) {
    if (json_is_string(prompt)) {
        r->echo_length = json_string_length(prompt);
        r->echo_text = malloc(r->echo_length + 1);
        if (r->echo_text) memcpy(r->echo_text, json_string_value(prompt), r->echo_length + 1);
    } else {
        char *text = NULL;
        if (kite_detokenize(model, r->prompt_ids, r->n_prompt, &text, &r->echo_length) != KITE_OK) {
            field_error_set(e, "prompt", "echo: %s", kite_last_error());
            return false;
        }
        r->echo_text = malloc(r->echo_length + 1);
        if (r->echo_text) memcpy(r->echo_text, text, r->echo_length + 1);
        kite_free(text);
    }
    if (!r->echo_text) {
        field_error_set(e, NULL, "out of memory");
        return false;
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
    const json_t *seed = json_object_get(root, "seed"), *prompt = json_object_get(root, "prompt");
    int n = 1;
    bool echo = false;
    /* Fields kite does not know are ignored, as OpenAI-compatible servers do; those of OpenAI's API that kite
     * does not implement yet are refused. */
    bool ok = request_fields_model(root, served_model, e) && request_fields_n(root, &n, e) &&
              request_fields_bool(root, "echo", &echo, e) && refuse_unimplemented(root, n, echo, e) &&
              parse_prompt(model, prompt, r, e) && request_fields_numbers(root, &r->request, e) &&
              request_fields_logit_bias(root, r, e) && request_fields_stop(root, r, e) &&
              request_fields_stream(root, r, e) &&
              request_fields_bool(root, "ignore_eos", &r->request.ignore_eos, e) && /* vLLM's extension */
              (!echo || keep_echo_text(model, prompt, r, e));
    /* The engine reads max_tokens 0 as "no limit"; a completion of no tokens is the prompt alone, which only echo
     * returns (answered without the engine). */
    if (ok && r->request.max_tokens == 0 && !echo) {
        field_error_set(e, "max_tokens", "'max_tokens' 0 is only allowed with 'echo' (the prompt alone)");
        ok = false;
    } else if (ok && r->request.max_tokens == 0 && r->request.min_tokens > 0) {
        field_error_set(e, "min_tokens", "'min_tokens' %d is more than 'max_tokens' 0", r->request.min_tokens);
        ok = false;
    }
    const json_t *logprobs = json_object_get(root, "logprobs");
    if (ok && json_is_integer(logprobs)) r->request.n_logprobs = (int32_t)json_integer_value(logprobs);
    /* No seed: a fresh one per request (OpenAI's and vLLM's), drawn by the library at submit. */
    if (ok && (!seed || json_is_null(seed))) r->request.sampling.fresh_seed = true;
    json_decref(root);
    if (ok && !serve_request_make_choices(r, n)) {
        field_error_set(e, NULL, "out of memory");
        ok = false;
    }
    if (!ok) {
        serve_request_free(r);
        return NULL;
    }
    return r;
}

bool completions_prompt_alone(const serve_request *r) {
    return r->lead->echo_text && r->request.max_tokens == 0;
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

/* OpenAI's completions logprobs for `n` tokens: tokens, token_logprobs, top_logprobs (token text -> logprob) and
 * text_offset, which begins at *offset and counts each token's characters on (a stream's chunks go on from where
 * the last one ended, so that they concatenate to the whole response's logprobs). */
static void logprobs_json(text_buffer *b, const kite_model *model, const serve_logprob *logprobs, size_t n,
                          size_t *offset) {
    text_buffer tokens = {0}, values = {0}, tops = {0}, offsets = {0};
    for (size_t i = 0; i < n; i++) {
        const serve_logprob *lp = &logprobs[i];
        const char *sep = i ? "," : "";
        char *text = NULL;
        size_t length = 0;
        token_string(model, lp->token, &text, &length);
        text_buffer_puts(&tokens, sep);
        text_buffer_json_string(&tokens, text ? text : "", text ? length : 0);
        text_buffer_printf(&values, "%s%.9g", sep, (double)lp->logprob);
        text_buffer_printf(&offsets, "%s%zu", sep, *offset);
        *offset += text ? utf8_characters(text, length) : 0;
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
    if (tokens.failed || values.failed || tops.failed || offsets.failed) b->failed = true;
    text_buffer_free(&tokens);
    text_buffer_free(&values);
    text_buffer_free(&tops);
    text_buffer_free(&offsets);
}

/* One choice: {"index","text","logprobs","finish_reason"}; `echo` (the prompt, or NULL) goes before the text. */
static void choice(text_buffer *b, const kite_model *model, const serve_request *c, bool echo, const char *text,
                   size_t length, const serve_logprob *logprobs, size_t n_logprobs, size_t *offset, bool last) {
    const serve_request *lead = c->lead;
    text_buffer_printf(b, "{\"index\":%d,\"text\":", c->choice);
    if (echo && lead->echo_text) {
        text_buffer joined = {0};
        text_buffer_append(&joined, lead->echo_text, lead->echo_length);
        text_buffer_append(&joined, text ? text : "", text ? length : 0);
        if (joined.failed) b->failed = true;
        text_buffer_json_string(b, joined.data ? joined.data : "", joined.length);
        text_buffer_free(&joined);
    } else {
        text_buffer_json_string(b, text ? text : "", text ? length : 0);
    }
    text_buffer_puts(b, ",\"logprobs\":");
    if (c->request.n_logprobs > 0)
        logprobs_json(b, model, logprobs, n_logprobs, offset);
    else
        text_buffer_puts(b, "null");
    text_buffer_puts(b, ",\"finish_reason\":");
    if (last)
        text_buffer_printf(b, "\"%s\"", kite_finish_reason_string(c->finish));
    else
        text_buffer_puts(b, "null");
    text_buffer_puts(b, "}");
}

void completions_chunk_json(text_buffer *b, const kite_model *model, const char *model_name, serve_request *c,
                            const char *text, size_t length, const serve_logprob *logprobs, size_t n_logprobs,
                            bool last) {
    head(b, model_name, c->lead);
    text_buffer_puts(b, ",\"choices\":[");
    choice(b, model, c, !c->first_chunk_out, text, length, logprobs, n_logprobs, &c->text_offset, last);
    c->first_chunk_out = true;
    text_buffer_puts(b, "]");
    if (c->include_usage) text_buffer_puts(b, ",\"usage\":null"); /* OpenAI's: usage comes in a chunk of its own */
    text_buffer_puts(b, "}");
}

void completions_usage_chunk_json(text_buffer *b, const char *model_name, const serve_request *r) {
    head(b, model_name, r->lead);
    text_buffer_puts(b, ",\"choices\":[]");
    serve_request_usage_json(b, r);
    text_buffer_puts(b, "}");
}

void completions_whole_json(text_buffer *b, const kite_model *model, const char *model_name, const serve_request *r) {
    const serve_request *lead = r->lead;
    head(b, model_name, lead);
    text_buffer_puts(b, ",\"choices\":[");
    for (int i = 0; i < lead->n_choices; i++) {
        const serve_request *c = lead->choices[i];
        size_t offset = 0;
        if (i) text_buffer_puts(b, ",");
        choice(b, model, c, true, c->whole_text.data, c->whole_text.length, c->logprobs, c->n_logprobs_kept, &offset,
               true);
    }
    text_buffer_puts(b, "]");
    serve_request_usage_json(b, lead);
    text_buffer_puts(b, "}");
}

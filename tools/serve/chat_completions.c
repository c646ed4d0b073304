/* /v1/chat/completions (chat_completions.h). */
#include "serve/chat_completions.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static uint64_t fresh_seed(void) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    return seed;
}

/* The sampling and length fields are read as for completions, each one not given taken from
 * generation_config.json, and a request without a seed draws a fresh one. */
static bool parse_fields(json_t *root, serve_request *r, field_error *e) {
    const json_t *logprobs = json_object_get(root, "logprobs"), *top = json_object_get(root, "top_logprobs");
    if ((logprobs && !json_is_null(logprobs) && !json_is_false(logprobs)) || (top && !json_is_null(top))) {
        field_error_set(e, "logprobs", "'logprobs' is not implemented for chat completions");
        return false;
    }
    json_t *max_completion = json_object_get(root, "max_completion_tokens");
    if (max_completion && !json_is_null(max_completion)) {
        const json_t *max_tokens = json_object_get(root, "max_tokens");
        if (max_tokens && !json_is_null(max_tokens)) {
            field_error_set(e, "max_completion_tokens", "give 'max_tokens' or 'max_completion_tokens', not both");
            return false;
        }
        if (json_object_set(root, "max_tokens", max_completion) != 0) { /* the same limit under its newer name */
            field_error_set(e, NULL, "out of memory");
            return false;
        }
    }
    (void)json_object_del(root, "logprobs"); /* false or null: nothing asked */
    const json_t *seed = json_object_get(root, "seed");
    const bool seeded = seed && !json_is_null(seed);
    if (!request_fields_numbers(root, &r->request, e) || !request_fields_logit_bias(root, r, e) ||
        !request_fields_stop(root, r, e) || !request_fields_stream(root, r, e) ||
        !request_fields_bool(root, "ignore_eos", &r->request.ignore_eos, e))
        return false;
    if (!seeded) r->request.sampling.seed = fresh_seed();
    return true;
}

serve_request *chat_completions_parse(const kite_model *model, const char *served_model, const char *body,
                                      size_t length, field_error *e) {
    const kite_chat *chat = kite_model_chat(model);
    if (!chat) {
        field_error_set(e, NULL, "this model has no chat template (use /v1/completions)");
        return NULL;
    }
    json_t *root = request_fields_load(body, length, e);
    if (!root) return NULL;
    serve_request *r = serve_request_new(SERVE_ENDPOINT_CHAT);
    if (!r) {
        field_error_set(e, NULL, "out of memory");
        json_decref(root);
        return NULL;
    }
    r->request.sampling = kite_chat_sampling_defaults(chat);
    r->request.max_tokens = 0; /* until the turn ends (or the context does), as OpenAI's chat default */
    int n = 1;
    bool ok = request_fields_model(root, served_model, e) && parse_fields(root, r, e) && request_fields_n(root, &n, e);
    json_decref(root);
    if (ok && kite_chat_render(chat, body, length, &r->prompt) != KITE_OK) {
        field_error_set(e, "messages", "%s", kite_last_error());
        ok = false;
    }
    if (ok) r->n_prompt = r->prompt.n_ids;
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

/* The calls buffer's objects ("{...}\n{...}\n") as a JSON array. */
static void append_calls(text_buffer *b, const char *calls, size_t length) {
    text_buffer_puts(b, "[");
    bool first = true;
    for (size_t start = 0; start < length;) {
        const char *end = memchr(calls + start, '\n', length - start);
        const size_t n = end ? (size_t)(end - (calls + start)) : length - start;
        if (!first) text_buffer_puts(b, ",");
        text_buffer_append(b, calls + start, n);
        first = false;
        start += n + 1;
    }
    text_buffer_puts(b, "]");
}

/* finish_reason as OpenAI's chat API says it: "tool_calls" when the answer called tools. */
static const char *finish_reason(const serve_request *r) {
    return r->n_calls > 0 && r->finish == KITE_FINISH_STOP ? "tool_calls" : kite_finish_reason_string(r->finish);
}

static void head(text_buffer *b, const char *model_name, const serve_request *r, bool chunk) {
    text_buffer_printf(b, "{\"id\":\"chatcmpl-%ld\",\"object\":\"%s\",\"created\":%lld,\"model\":", r->number,
                       chunk ? "chat.completion.chunk" : "chat.completion", (long long)time(NULL));
    text_buffer_json_string(b, model_name, strlen(model_name));
}

void chat_completions_chunk_json(text_buffer *b, const char *model_name, const serve_request *r,
                                 const text_buffer *content, const text_buffer *reasoning, const text_buffer *calls,
                                 bool first, bool last) {
    head(b, model_name, r, true);
    text_buffer_printf(b, ",\"choices\":[{\"index\":%d,\"delta\":{", r->choice);
    bool any = false;
    if (first) {
        text_buffer_puts(b, "\"role\":\"assistant\"");
        any = true;
    }
    if (reasoning->length) {
        text_buffer_puts(b, any ? ",\"reasoning_content\":" : "\"reasoning_content\":");
        text_buffer_json_string(b, reasoning->data, reasoning->length);
        any = true;
    }
    if (content->length) {
        text_buffer_puts(b, any ? ",\"content\":" : "\"content\":");
        text_buffer_json_string(b, content->data, content->length);
        any = true;
    }
    if (calls->length) {
        text_buffer_puts(b, any ? ",\"tool_calls\":" : "\"tool_calls\":");
        append_calls(b, calls->data, calls->length);
    }
    text_buffer_puts(b, "},\"logprobs\":null,\"finish_reason\":");
    if (last)
        text_buffer_printf(b, "\"%s\"", finish_reason(r));
    else
        text_buffer_puts(b, "null");
    text_buffer_puts(b, "}]");
    if (r->include_usage) text_buffer_puts(b, ",\"usage\":null"); /* OpenAI's: usage comes in a chunk of its own */
    text_buffer_puts(b, "}");
}

void chat_completions_usage_chunk_json(text_buffer *b, const char *model_name, const serve_request *r) {
    head(b, model_name, r, true);
    text_buffer_puts(b, ",\"choices\":[]");
    serve_request_usage_json(b, r);
    text_buffer_puts(b, "}");
}

/* One choice of a whole answer: {"index","message","logprobs","finish_reason"}. */
static void whole_choice(text_buffer *b, const serve_request *r) {
    text_buffer_printf(b, "{\"index\":%d,\"message\":{\"role\":\"assistant\",\"content\":", r->choice);
    if (r->whole_text.length || r->n_calls == 0)
        text_buffer_json_string(b, r->whole_text.data ? r->whole_text.data : "", r->whole_text.length);
    else
        text_buffer_puts(b, "null"); /* tool calls and nothing else, as vLLM answers */
    if (r->whole_reasoning.length) {
        text_buffer_puts(b, ",\"reasoning_content\":");
        text_buffer_json_string(b, r->whole_reasoning.data, r->whole_reasoning.length);
    }
    if (r->whole_calls.length) {
        text_buffer_puts(b, ",\"tool_calls\":");
        append_calls(b, r->whole_calls.data, r->whole_calls.length);
    }
    text_buffer_printf(b, "},\"logprobs\":null,\"finish_reason\":\"%s\"}", finish_reason(r));
}

void chat_completions_whole_json(text_buffer *b, const char *model_name, const serve_request *lead) {
    head(b, model_name, lead, false);
    text_buffer_puts(b, ",\"choices\":[");
    for (int i = 0; i < lead->n_choices; i++) {
        if (i) text_buffer_puts(b, ",");
        whole_choice(b, lead->choices[i]);
    }
    text_buffer_puts(b, "]");
    serve_request_usage_json(b, lead);
    text_buffer_puts(b, "}");
}

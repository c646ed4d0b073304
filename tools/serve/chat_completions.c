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

/* "logprobs" (true or false) and "top_logprobs" (0..KITE_MAX_LOGPROBS, only with logprobs), OpenAI's. The
 * engine is asked for at least one top entry, since it reports the sampled token's logprob only then. */
static bool parse_logprobs(const json_t *root, serve_request *r, field_error *e) {
    if (!request_fields_bool(root, "logprobs", &r->chat_logprobs, e)) return false;
    const json_t *top = json_object_get(root, "top_logprobs");
    if (top && !json_is_null(top)) {
        if (!json_is_integer(top) || json_integer_value(top) < 0 || json_integer_value(top) > KITE_MAX_LOGPROBS) {
            field_error_set(e, "top_logprobs", "'top_logprobs' must be an integer in [0, %d]", KITE_MAX_LOGPROBS);
            return false;
        }
        if (!r->chat_logprobs) {
            field_error_set(e, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
            return false;
        }
        r->chat_top_logprobs = (int32_t)json_integer_value(top);
    }
    if (r->chat_logprobs) r->request.n_logprobs = r->chat_top_logprobs > 0 ? r->chat_top_logprobs : 1;
    return true;
}

/* The sampling and length fields are read as for completions, each one not given taken from
 * generation_config.json, and a request without a seed draws a fresh one. */
static bool parse_fields(json_t *root, serve_request *r, field_error *e) {
    if (!parse_logprobs(root, r, e)) return false;
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
    const json_t *seed = json_object_get(root, "seed");
    const bool seeded = seed && !json_is_null(seed);
    if (!request_fields_numbers(root, &r->request, e) || !request_fields_logit_bias(root, r, e) ||
        !request_fields_stop(root, r, e) || !request_fields_stream(root, r, e) ||
        !request_fields_bool(root, "ignore_eos", &r->request.ignore_eos, e))
        return false;
    if (!seeded) r->request.sampling.seed = fresh_seed();
    return true;
}

/* The request field a rendering error is about: its message begins with the field ("tool_choice.function.name:
 * ...", "tools[2]: ..."); "messages" for the rest (the template's own errors are about the conversation). */
static const char *render_error_field(const char *message) {
    static const char *const fields[] = {"tools", "tool_choice", "chat_template_kwargs", "add_generation_prompt"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const size_t n = strlen(fields[i]);
        if (strncmp(message, fields[i], n) == 0 && strchr(":.[", message[n]) && message[n] != '\0') return fields[i];
    }
    return "messages";
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
    r->tokenizer = kite_model_tokenizer(model);
    r->request.max_tokens = 0; /* until the turn ends (or the context does), as OpenAI's chat default */
    int n = 1;
    bool ok = request_fields_model(root, served_model, e) && parse_fields(root, r, e) && request_fields_n(root, &n, e);
    json_decref(root);
    if (ok && kite_chat_render(chat, body, length, &r->prompt) != KITE_OK) {
        field_error_set(e, render_error_field(kite_last_error()), "%s", kite_last_error());
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

/* finish_reason as OpenAI's chat API says it: "tool_calls" when the answer called tools, but "stop" when the
 * request named the function (vLLM answers "stop" for both forced choices when not streamed and "tool_calls"
 * when streamed; kite gives OpenAI's answer either way). */
static const char *finish_reason(const serve_request *r) {
    if (r->n_calls > 0 && r->finish == KITE_FINISH_STOP)
        return r->prompt.tool_choice == KITE_TOOL_CHOICE_NAMED ? "stop" : "tool_calls";
    return kite_finish_reason_string(r->finish);
}

/* {"token","logprob","bytes"}: the token's text alone (a piece of a character reads as U+FFFD, as vLLM's
 * tokens do) and its own bytes (OpenAI's: the pieces of a character join up). -inf is -9999, as vLLM clamps.
 * The engine's ids are the tokenizer's, so only memory can fail here: b is then marked failed, as when it
 * cannot grow, and the caller answers out of memory. */
static void token_logprob_json(text_buffer *b, const kite_tokenizer *tokenizer, int32_t id, float logprob) {
    char *text = NULL;
    size_t length = 0;
    const char *bytes = NULL;
    size_t n_bytes = 0;
    if (kite_tokenizer_decode(tokenizer, &id, 1, &text, &length) != KITE_OK ||
        kite_tokenizer_token_bytes(tokenizer, id, &bytes, &n_bytes) != KITE_OK) {
        kite_free(text);
        b->failed = true;
        return;
    }
    text_buffer_puts(b, "{\"token\":");
    text_buffer_json_string(b, text, length);
    kite_free(text);
    text_buffer_printf(b, ",\"logprob\":%.9g,\"bytes\":[", logprob >= -9999.0f ? (double)logprob : -9999.0);
    for (size_t i = 0; i < n_bytes; i++)
        text_buffer_printf(b, "%s%u", i ? "," : "", (unsigned char)bytes[i]);
    text_buffer_puts(b, "]");
}

/* OpenAI's chat logprobs, {"content":[...],"refusal":null}, for lp[0..n): one entry per generated token, with
 * the request's top_logprobs alternatives, best first. */
static void logprobs_json(text_buffer *b, const serve_request *r, const serve_logprob *lp, size_t n) {
    text_buffer_puts(b, "{\"content\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) text_buffer_puts(b, ",");
        token_logprob_json(b, r->tokenizer, lp[i].token, lp[i].logprob);
        text_buffer_puts(b, ",\"top_logprobs\":[");
        const int32_t shown = lp[i].n_top < r->chat_top_logprobs ? lp[i].n_top : r->chat_top_logprobs;
        for (int32_t k = 0; k < shown; k++) {
            if (k) text_buffer_puts(b, ",");
            token_logprob_json(b, r->tokenizer, lp[i].top_ids[k], lp[i].top_logprobs[k]);
            text_buffer_puts(b, "}");
        }
        text_buffer_puts(b, "]}");
    }
    text_buffer_puts(b, "],\"refusal\":null}");
}

static void head(text_buffer *b, const char *model_name, const serve_request *r, bool chunk) {
    text_buffer_printf(b, "{\"id\":\"chatcmpl-%ld\",\"object\":\"%s\",\"created\":%lld,\"model\":", r->number,
                       chunk ? "chat.completion.chunk" : "chat.completion", (long long)time(NULL));
    text_buffer_json_string(b, model_name, strlen(model_name));
}

void chat_completions_chunk_json(text_buffer *b, const char *model_name, serve_request *r, const text_buffer *content,
                                 const text_buffer *reasoning, const text_buffer *calls, bool first, bool last) {
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
    text_buffer_puts(b, "},\"logprobs\":");
    if (r->chat_logprobs) {
        logprobs_json(b, r, r->stream_logprobs, r->n_stream_logprobs);
        r->n_stream_logprobs = 0; /* sent */
    } else {
        text_buffer_puts(b, "null");
    }
    text_buffer_puts(b, ",\"finish_reason\":");
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
    text_buffer_puts(b, "},\"logprobs\":");
    if (r->chat_logprobs)
        logprobs_json(b, r, r->logprobs, r->n_logprobs_kept); /* done: the engine no longer writes them */
    else
        text_buffer_puts(b, "null");
    text_buffer_printf(b, ",\"finish_reason\":\"%s\"}", finish_reason(r));
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

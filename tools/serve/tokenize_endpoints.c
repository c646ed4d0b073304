/* /tokenize and /detokenize (tokenize_endpoints.h). */
#include "serve/tokenize_endpoints.h"

#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "serve/request_fields.h"
#include "text_buffer.h"

/* The body as a JSON object with only the given keys; NULL after a 400. "model", when present, must be the
 * served model's name (404 otherwise, as vLLM answers). */
static json_t *load_body(router *rt, struct evhttp_request *request, const char *const *keys, size_t n_keys) {
    struct evbuffer *input = evhttp_request_get_input_buffer(request);
    const size_t length = evbuffer_get_length(input);
    const char *body = length ? (const char *)evbuffer_pullup(input, -1) : "";
    field_error e = {0};
    json_t *root = body ? request_fields_load(body, length, &e) : NULL;
    if (!root) {
        router_send_error(rt, request, body ? 400 : 500, body ? e.message : "out of memory", NULL, 0);
        return NULL;
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        bool known = strcmp(key, "model") == 0;
        for (size_t i = 0; i < n_keys && !known; i++) known = strcmp(key, keys[i]) == 0;
        if (!known) {
            field_error_set(&e, key, "'%s' is not a field of this endpoint", key);
            router_send_error(rt, request, 400, e.message, e.param, 0);
            json_decref(root);
            return NULL;
        }
    }
    const json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model) &&
        (!json_is_string(model) || strcmp(json_string_value(model), rt->options.model_name) != 0)) {
        router_send_error(rt, request, 404, "the model does not exist", "model", 0);
        json_decref(root);
        return NULL;
    }
    return root;
}

void tokenize_endpoints_tokenize(router *rt, struct evhttp_request *request) {
    static const char *const keys[] = {"prompt", "messages", "add_special_tokens", "add_generation_prompt",
                                       "chat_template_kwargs", "tools"};
    json_t *root = load_body(rt, request, keys, sizeof keys / sizeof keys[0]);
    if (!root) return;
    const json_t *prompt = json_object_get(root, "prompt"), *messages = json_object_get(root, "messages");
    const json_t *special = json_object_get(root, "add_special_tokens");
    int32_t *ids = NULL;
    size_t n = 0;
    kite_chat_prompt rendered = {0};
    const char *why = NULL, *param = NULL;
    if (special && !json_is_boolean(special)) {
        why = "'add_special_tokens' must be true or false";
        param = "add_special_tokens";
    } else if (json_is_string(prompt) && !messages) {
        /* Qwen3's tokenizer adds no special tokens to a text, so add_special_tokens changes nothing. */
        if (kite_tokenize(rt->link->model, json_string_value(prompt), json_string_length(prompt), &ids, &n) !=
            KITE_OK) {
            why = kite_last_error();
            param = "prompt";
        }
    } else if (json_is_array(messages) && !prompt) {
        const kite_chat *chat = kite_model_chat(rt->link->model);
        struct evbuffer *input = evhttp_request_get_input_buffer(request);
        const char *body = (const char *)evbuffer_pullup(input, -1);
        if (!chat) {
            why = "this model has no chat template";
            param = "messages";
        } else if (kite_chat_render(chat, body, evbuffer_get_length(input), &rendered) != KITE_OK) {
            why = kite_last_error();
            param = "messages";
        }
    } else {
        why = "give 'prompt' (a string) or 'messages' (an array)";
        param = "prompt";
    }
    if (why) {
        router_send_error(rt, request, 400, why, param, 0);
    } else {
        const int32_t *tokens = messages ? rendered.ids : ids;
        const size_t count = messages ? rendered.n_ids : n;
        text_buffer b = {0};
        text_buffer_printf(&b, "{\"count\":%zu,\"max_model_len\":%d,\"tokens\":", count,
                           engine_link_get_stats(rt->link).max_context);
        text_buffer_json_int_array(&b, tokens, count);
        text_buffer_puts(&b, ",\"token_strs\":null}");
        router_send_built(rt, request, &b, "application/json");
    }
    kite_free(ids);
    kite_chat_prompt_free(&rendered);
    json_decref(root);
}

void tokenize_endpoints_detokenize(router *rt, struct evhttp_request *request) {
    static const char *const keys[] = {"tokens"};
    json_t *root = load_body(rt, request, keys, 1);
    if (!root) return;
    const json_t *tokens = json_object_get(root, "tokens");
    const size_t n = json_is_array(tokens) ? json_array_size(tokens) : 0;
    int32_t *ids = json_is_array(tokens) ? malloc((n ? n : 1) * sizeof *ids) : NULL;
    field_error e = {0};
    bool ok = true;
    if (!json_is_array(tokens)) {
        field_error_set(&e, "tokens", "'tokens' must be an array of token ids");
        ok = false;
    } else if (!ids) {
        router_send_error(rt, request, 500, "out of memory", NULL, 0);
        json_decref(root);
        return;
    }
    for (size_t i = 0; ok && i < n; i++) {
        const json_t *item = json_array_get(tokens, i);
        const json_int_t v = json_is_integer(item) ? json_integer_value(item) : -1;
        if (v < 0 || v > INT32_MAX) {
            field_error_set(&e, "tokens", "tokens[%zu] is not a token id", i);
            ok = false;
        } else {
            ids[i] = (int32_t)v;
        }
    }
    char *text = NULL;
    size_t length = 0;
    if (ok && kite_detokenize(rt->link->model, ids, n, &text, &length) != KITE_OK) {
        field_error_set(&e, "tokens", "%s", kite_last_error());
        ok = false;
    }
    if (!ok) {
        router_send_error(rt, request, 400, e.message, e.param, 0);
    } else {
        text_buffer b = {0};
        text_buffer_puts(&b, "{\"prompt\":");
        text_buffer_json_string(&b, text ? text : "", length);
        text_buffer_puts(&b, "}");
        router_send_built(rt, request, &b, "application/json");
    }
    kite_free(text);
    free(ids);
    json_decref(root);
}

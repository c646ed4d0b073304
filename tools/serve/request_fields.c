/* Shared request fields (request_fields.h). */
#include "serve/request_fields.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void field_error_set(field_error *e, const char *param, const char *format, ...) {
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(e->message, sizeof e->message, format, arguments);
    va_end(arguments);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
}

json_t *request_fields_load(const char *body, size_t length, field_error *e) {
    json_error_t error;
    /* Any value at the top (so a non-object gets its own message); "\u0000" kept inside strings. A key given
     * twice is refused, as the chat template's reader refuses it: Python's json (and so vLLM) would keep the last
     * value silently, and which of two values a client meant is a guess. */
    json_t *root = json_loadb(body, length, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &error);
    if (!root) {
        field_error_set(e, NULL, "the body is not JSON: %s at line %d column %d", error.text, error.line,
                        error.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        field_error_set(e, NULL, "the body must be a JSON object");
        json_decref(root);
        return NULL;
    }
    return root;
}

bool request_fields_model(const json_t *root, const char *served_model, field_error *e) {
    const json_t *model = json_object_get(root, "model");
    if (!model || json_is_null(model)) return true;
    if (!json_is_string(model)) {
        field_error_set(e, "model", "'model' must be a string");
        return false;
    }
    if (strcmp(json_string_value(model), served_model) == 0) return true;
    field_error_set(e, "model", "the model '%.200s' does not exist (this server serves '%.200s')",
                    json_string_value(model), served_model);
    e->status = 404;
    return false;
}

static bool optional_number(const json_t *object, const char *key, bool *present, double *out, field_error *e) {
    const json_t *v = json_object_get(object, key);
    *present = false;
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) {
        field_error_set(e, key, "'%s' must be a number", key);
        return false;
    }
    *present = true;
    *out = json_number_value(v);
    return true;
}

bool request_fields_bool(const json_t *root, const char *key, bool *out, field_error *e) {
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        field_error_set(e, key, "'%s' must be true or false", key);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

bool request_fields_numbers(const json_t *root, kite_request *request, field_error *e) {
    enum { MAX_TOKENS, TEMPERATURE, TOP_P, TOP_K, MIN_P, REPETITION_PENALTY, PRESENCE_PENALTY, FREQUENCY_PENALTY,
           MIN_TOKENS, SEED };
    static const struct {
        const char *key;
        double min, max;
    } fields[] = {
        [MAX_TOKENS] = {"max_tokens", 0, 1 << 30},
        [TEMPERATURE] = {"temperature", 0, 100},
        [TOP_P] = {"top_p", 0, 1},
        [TOP_K] = {"top_k", -1, 1 << 30}, /* -1: off, as vLLM */
        [MIN_P] = {"min_p", 0, 1},
        [REPETITION_PENALTY] = {"repetition_penalty", 0.01, 100},
        [PRESENCE_PENALTY] = {"presence_penalty", -2, 2},
        [FREQUENCY_PENALTY] = {"frequency_penalty", -2, 2},
        [MIN_TOKENS] = {"min_tokens", 0, 1 << 30}, /* vLLM's extension */
        [SEED] = {"seed", 0, 9.0e15}, /* integers a double holds exactly */
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        bool present;
        double v = 0;
        if (!optional_number(root, fields[i].key, &present, &v, e)) return false;
        if (!present) continue;
        if (!(v >= fields[i].min && v <= fields[i].max)) {
            field_error_set(e, fields[i].key, "'%s' must be in [%g, %g]", fields[i].key, fields[i].min,
                            fields[i].max);
            return false;
        }
        switch (i) {
        case MAX_TOKENS: request->max_tokens = (int32_t)v; break;
        case TEMPERATURE: request->sampling.temperature = (float)v; break;
        case TOP_P: request->sampling.top_p = (float)v; break;
        case TOP_K: request->sampling.top_k = v < 0 ? 0 : (int32_t)v; break;
        case MIN_P: request->sampling.min_p = (float)v; break;
        case REPETITION_PENALTY: request->sampling.repetition_penalty = (float)v; break;
        case PRESENCE_PENALTY: request->sampling.presence_penalty = (float)v; break;
        case FREQUENCY_PENALTY: request->sampling.frequency_penalty = (float)v; break;
        case MIN_TOKENS: request->min_tokens = (int32_t)v; break;
        case SEED: request->sampling.seed = (uint64_t)v; break;
        default: break;
        }
    }
    return true;
}

bool request_fields_n(const json_t *root, int *n, field_error *e) {
    const json_t *v = json_object_get(root, "n");
    *n = 1;
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > SERVE_MAX_CHOICES) {
        field_error_set(e, "n", "'n' must be an integer in [1, %d] (the choices to generate)", SERVE_MAX_CHOICES);
        return false;
    }
    *n = (int)json_integer_value(v);
    return true;
}

bool request_fields_logit_bias(const json_t *root, serve_request *r, field_error *e) {
    const json_t *bias = json_object_get(root, "logit_bias");
    if (!bias || json_is_null(bias)) return true;
    if (!json_is_object(bias)) {
        field_error_set(e, "logit_bias", "'logit_bias' must be an object from token ids to biases");
        return false;
    }
    if (json_object_size(bias) > KITE_MAX_LOGIT_BIAS) {
        field_error_set(e, "logit_bias", "'logit_bias' has %zu entries; at most %d", json_object_size(bias),
                        KITE_MAX_LOGIT_BIAS);
        return false;
    }
    const char *key;
    const json_t *value;
    int32_t n = 0;
    json_object_foreach((json_t *)bias, key, value) {
        char *end = NULL;
        const long id = strtol(key, &end, 10);
        if (!*key || *end || id < 0 || id > INT32_MAX) {
            field_error_set(e, "logit_bias", "'logit_bias' keys must be token ids (\"%.32s\" is not)", key);
            return false;
        }
        if (!json_is_number(value) || !(json_number_value(value) >= -100.0 && json_number_value(value) <= 100.0)) {
            field_error_set(e, "logit_bias", "'logit_bias' values must be numbers in [-100, 100] (token %ld)", id);
            return false;
        }
        r->logit_bias[n].token = (int32_t)id;
        r->logit_bias[n].bias = (float)json_number_value(value);
        n++;
    }
    /* Token ids past the vocabulary are refused by the library at submit, naming the field. */
    r->request.logit_bias = r->logit_bias;
    r->request.n_logit_bias = n;
    return true;
}

bool request_fields_stop(const json_t *root, serve_request *r, field_error *e) {
    const json_t *stop = json_object_get(root, "stop");
    if (json_is_string(stop)) {
        r->stop_storage[0] = strdup(json_string_value(stop));
        if (!r->stop_storage[0]) {
            field_error_set(e, "stop", "out of memory");
            return false;
        }
        r->request.n_stop_strings = 1;
    } else if (json_is_array(stop)) {
        size_t n = json_array_size(stop);
        if (n > SERVE_MAX_STOP_STRINGS) {
            field_error_set(e, "stop", "at most %d stop strings", SERVE_MAX_STOP_STRINGS);
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *item = json_array_get(stop, i);
            if (!json_is_string(item)) {
                field_error_set(e, "stop", "'stop' must hold strings");
                return false;
            }
            r->stop_storage[i] = strdup(json_string_value(item));
            if (!r->stop_storage[i]) {
                field_error_set(e, "stop", "out of memory");
                return false;
            }
        }
        r->request.n_stop_strings = (int32_t)n;
    } else if (stop && !json_is_null(stop)) {
        field_error_set(e, "stop", "'stop' must be a string or an array of strings");
        return false;
    }
    r->request.stop_strings = (const char *const *)r->stop_storage;
    return true;
}

bool request_fields_stream(const json_t *root, serve_request *r, field_error *e) {
    r->stream = false;
    if (!request_fields_bool(root, "stream", &r->stream, e)) return false;
    const json_t *options = json_object_get(root, "stream_options");
    if (!options || json_is_null(options)) return true;
    if (!json_is_object(options)) {
        field_error_set(e, "stream_options", "'stream_options' must be an object");
        return false;
    }
    if (!r->stream) {
        field_error_set(e, "stream_options", "'stream_options' is only allowed with \"stream\": true");
        return false;
    }
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)options, key, value) {
        if (strcmp(key, "include_usage") == 0) {
            if (!json_is_boolean(value) && !json_is_null(value)) {
                field_error_set(e, "stream_options.include_usage", "'stream_options.include_usage' must be true or false");
                return false;
            }
            r->include_usage = json_is_true(value);
        } else if (strcmp(key, "continuous_usage_stats") == 0 && (json_is_false(value) || json_is_null(value))) {
            continue; /* vLLM's extension, off: nothing to do */
        } else {
            field_error_set(e, "stream_options", "'stream_options.%s' is not implemented", key);
            return false;
        }
    }
    return true;
}

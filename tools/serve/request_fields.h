/* The request body fields /v1/completions and /v1/chat/completions share, read from jansson's tree: the
 * sampling and length numbers, stop strings, stream and stream_options. Each is optional (null counts as
 * absent) and checked against its type and range; a bad one fills a field_error naming it. */
#ifndef KITE_TOOLS_SERVE_REQUEST_FIELDS_H
#define KITE_TOOLS_SERVE_REQUEST_FIELDS_H

#include <stdbool.h>

/* json_object_get and friends are jansson's. */
#include <jansson.h>

#include "serve/serve_request.h"

typedef struct field_error {
    char message[512];
    char param[64]; /* the field at fault ("" for the body as a whole) */
    int status;     /* the HTTP status to answer: 0 for 400, 404 for a model this server does not serve */
} field_error;

void field_error_set(field_error *e, const char *param, const char *format, ...) __attribute__((format(printf, 3, 4)));

/* Parses the body as a JSON object; NULL with the error filled otherwise. */
json_t *request_fields_load(const char *body, size_t length, field_error *e);

/* "model", when given, must be the served model's name; another is 404 (vLLM's answer), a non-string 400. */
bool request_fields_model(const json_t *root, const char *served_model, field_error *e);
bool request_fields_bool(const json_t *root, const char *key, bool *out, field_error *e);
/* max_tokens, temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty,
 * min_tokens and seed into the request. */
bool request_fields_numbers(const json_t *root, kite_request *request, field_error *e);
/* "n": the choices to generate, 1..SERVE_MAX_CHOICES (1 when absent); serve_request_make_choices makes them. */
bool request_fields_n(const json_t *root, int *n, field_error *e);
/* "logit_bias": an object from token ids (as strings, OpenAI's) to biases in [-100, 100], copied into the request. */
bool request_fields_logit_bias(const json_t *root, serve_request *r, field_error *e);
/* "stop": a string or at most SERVE_MAX_STOP_STRINGS strings, copied into the request. */
bool request_fields_stop(const json_t *root, serve_request *r, field_error *e);
/* "stream" and "stream_options" (include_usage; only with "stream": true). */
bool request_fields_stream(const json_t *root, serve_request *r, field_error *e);

#endif

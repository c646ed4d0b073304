/* POST /v1/completions: the body into a serve_request, and the responses' JSON (OpenAI's text_completion). */
#ifndef KITE_TOOLS_SERVE_COMPLETIONS_H
#define KITE_TOOLS_SERVE_COMPLETIONS_H

#include "serve/request_fields.h"

/* A request from the body (the prompt tokenized here, on the caller's thread); NULL with `e` filled when the
 * body is not acceptable. */
serve_request *completions_parse(const kite_model *model, const char *served_model, const char *body, size_t length,
                                 field_error *e);

/* One streamed chunk of `text`; the last carries finish_reason (and, unless include_usage asks for a chunk of
 * its own, nothing more). */
void completions_chunk_json(text_buffer *b, const char *model_name, const serve_request *r, const char *text,
                            size_t length, bool last);
/* include_usage's last chunk: empty choices and the usage. */
void completions_usage_chunk_json(text_buffer *b, const char *model_name, const serve_request *r);
/* The whole response of a request that is not streamed (its text collected in whole_text). */
void completions_whole_json(text_buffer *b, const kite_model *model, const char *model_name, const serve_request *r);

#endif

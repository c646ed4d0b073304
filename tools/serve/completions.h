/* POST /v1/completions: the body into a serve_request, and the responses' JSON (OpenAI's text_completion). */
#ifndef KITE_TOOLS_SERVE_COMPLETIONS_H
#define KITE_TOOLS_SERVE_COMPLETIONS_H

#include "serve/request_fields.h"

/* A request from the body (the prompt tokenized here, on the caller's thread); NULL with `e` filled when the
 * body is not acceptable. */
serve_request *completions_parse(const kite_model *model, const char *served_model, const char *body, size_t length,
                                 field_error *e);

/* One streamed chunk of choice `c`: `text` and the logprobs of its tokens (text_offset going on from the chunks
 * before); the first of a choice's chunks carries echo's prompt before its text, the last finish_reason (and,
 * unless include_usage asks for a chunk of its own, nothing more). */
void completions_chunk_json(text_buffer *b, const kite_model *model, const char *model_name, serve_request *c,
                            const char *text, size_t length, const serve_logprob *logprobs, size_t n_logprobs,
                            bool last);
/* include_usage's last chunk: empty choices and the usage. */
void completions_usage_chunk_json(text_buffer *b, const char *model_name, const serve_request *r);
/* echo with max_tokens 0: the answer is the prompt alone, given without the engine. */
bool completions_prompt_alone(const serve_request *r);
/* The whole response of a request that is not streamed: every choice of r's lead (each one's text collected in
 * whole_text). */
void completions_whole_json(text_buffer *b, const kite_model *model, const char *model_name, const serve_request *r);

#endif

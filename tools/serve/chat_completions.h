/* POST /v1/chat/completions: the body rendered with the checkpoint's chat template into a serve_request, and
 * the responses' JSON (OpenAI's chat.completion and its chunks, with vLLM's reasoning_content). */
#ifndef KITE_TOOLS_SERVE_CHAT_COMPLETIONS_H
#define KITE_TOOLS_SERVE_CHAT_COMPLETIONS_H

#include "serve/request_fields.h"

/* NULL with `e` filled when the body is not acceptable or the model has no chat template. */
serve_request *chat_completions_parse(const kite_model *model, const char *served_model, const char *body,
                                      size_t length, field_error *e);

/* One streamed chunk with the new pieces (the role in the first; finish_reason in the last). `calls` holds
 * complete tool calls, each a JSON object followed by '\n'. With logprobs, the chunk carries those of every
 * token since the last chunk (r->stream_logprobs, emptied), so the chunks' lists add up to the whole answer's. */
void chat_completions_chunk_json(text_buffer *b, const char *model_name, serve_request *r, const text_buffer *content,
                                 const text_buffer *reasoning, const text_buffer *calls, bool first, bool last);
void chat_completions_usage_chunk_json(text_buffer *b, const char *model_name, const serve_request *r);
/* The whole answer of a request that is not streamed: every choice of the lead (each one's collected in
 * whole_text, whole_reasoning, whole_calls). */
void chat_completions_whole_json(text_buffer *b, const char *model_name, const serve_request *lead);

#endif

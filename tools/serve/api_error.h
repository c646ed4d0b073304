/* Errors as OpenAI's API returns them: {"error":{"message","type","param","code"}} with the HTTP status, `code`
 * the status as a number (as vLLM writes it), `param` the request field at fault or null. */
#ifndef KITE_TOOLS_SERVE_API_ERROR_H
#define KITE_TOOLS_SERVE_API_ERROR_H

#include "text_buffer.h"

struct evhttp_request;

/* The reason phrase of the statuses kite serve answers with ("Bad Request"). */
const char *api_error_reason(int status);
/* OpenAI's error type for a status: invalid_request_error, authentication_error, rate_limit_error,
 * server_error. */
const char *api_error_type(int status);

/* Appends the error object (param NULL writes null). */
void api_error_json(text_buffer *b, int status, const char *message, const char *param);

/* Sends the error as the whole response, as JSON (headers already added to the request's output headers go
 * with it); retry_after_seconds > 0 adds Retry-After. */
void api_error_send(struct evhttp_request *request, int status, const char *message, const char *param,
                    int retry_after_seconds);

#endif

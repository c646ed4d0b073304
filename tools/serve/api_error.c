/* OpenAI-shaped error responses (api_error.h). */
#include "serve/api_error.h"

#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

const char *api_error_reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

const char *api_error_type(int status) {
    if (status == 401) return "authentication_error";
    if (status == 429) return "rate_limit_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

void api_error_json(text_buffer *b, int status, const char *message, const char *param) {
    text_buffer_puts(b, "{\"error\":{\"message\":");
    text_buffer_json_string(b, message, strlen(message));
    text_buffer_printf(b, ",\"type\":\"%s\",\"param\":", api_error_type(status));
    if (param)
        text_buffer_json_string(b, param, strlen(param));
    else
        text_buffer_puts(b, "null");
    text_buffer_printf(b, ",\"code\":%d}}", status);
}

void api_error_send(struct evhttp_request *request, int status, const char *message, const char *param,
                    int retry_after_seconds) {
    struct evkeyvalq *headers = evhttp_request_get_output_headers(request);
    struct evbuffer *body = evbuffer_new();
    text_buffer b = {0};
    api_error_json(&b, status, message, param);
    (void)evhttp_add_header(headers, "Content-Type", "application/json");
    if (retry_after_seconds > 0) {
        char seconds[16];
        snprintf(seconds, sizeof seconds, "%d", retry_after_seconds);
        (void)evhttp_add_header(headers, "Retry-After", seconds);
    }
    if (!body || b.failed || evbuffer_add(body, b.data, b.length) != 0) {
        /* Out of memory: the status alone still tells the client. */
        evhttp_send_reply(request, status, api_error_reason(status), NULL);
    } else {
        evhttp_send_reply(request, status, api_error_reason(status), body);
    }
    if (body) evbuffer_free(body);
    text_buffer_free(&b);
}

/* Routing, authentication, CORS and the small endpoints (router.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "serve/access_log.h"
#include "serve/api_error.h"
#include "serve/router.h"
#include "serve/tokenize_endpoints.h"
#include "text_buffer.h"

#define RETRY_AFTER_SECONDS 1

const char *router_method_name(struct evhttp_request *request) {
    switch (evhttp_request_get_command(request)) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_PATCH: return "PATCH";
    default: return "OTHER";
    }
}

bool router_request_path(struct evhttp_request *request, char *path, size_t size) {
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(request);
    const char *p = uri ? evhttp_uri_get_path(uri) : NULL;
    if (!p || !*p) p = "/";
    const size_t n = strlen(p);
    if (n >= size) return false;
    memcpy(path, p, n + 1);
    return true;
}

static void log_simple(router *rt, struct evhttp_request *request, int status) {
    char path[256];
    if (!router_request_path(request, path, sizeof path)) snprintf(path, sizeof path, "(too long)");
    access_log_entry e = {.method = router_method_name(request), .endpoint = path, .status = status,
                          .ttft_seconds = -1};
    access_log_write(rt->options.access_log, &e);
    metrics_record(&rt->metrics, &e);
}

static void send_body(router *rt, struct evhttp_request *request, int status, const char *content_type,
                      const char *body, size_t length) {
    struct evbuffer *out = evbuffer_new();
    (void)evhttp_add_header(evhttp_request_get_output_headers(request), "Content-Type", content_type);
    if (!out || evbuffer_add(out, body, length) != 0) {
        if (out) evbuffer_free(out);
        api_error_send(request, 500, "out of memory", NULL, 0);
        log_simple(rt, request, 500);
        return;
    }
    log_simple(rt, request, status);
    evhttp_send_reply(request, status, api_error_reason(status), out);
    evbuffer_free(out);
}

void router_send_json(router *rt, struct evhttp_request *request, int status, const char *body, size_t length) {
    send_body(rt, request, status, "application/json", body, length);
}

void router_send_built(router *rt, struct evhttp_request *request, text_buffer *b, const char *content_type) {
    if (b->failed)
        router_send_error(rt, request, 500, "out of memory", NULL, 0);
    else
        send_body(rt, request, 200, content_type, b->data ? b->data : "", b->length);
    text_buffer_free(b);
}

void router_send_error(router *rt, struct evhttp_request *request, int status, const char *message,
                       const char *param, int retry_after_seconds) {
    log_simple(rt, request, status);
    api_error_send(request, status, message, param, retry_after_seconds);
}

/* Compares without an early exit, so the time taken says nothing about how much of the key matched. */
static bool same_secret(const char *given, size_t given_length, const char *expected) {
    const size_t expected_length = strlen(expected);
    unsigned char difference = given_length == expected_length ? 0 : 1;
    for (size_t i = 0; i < expected_length; i++) {
        const unsigned char g = i < given_length ? (unsigned char)given[i] : 0;
        difference |= (unsigned char)(g ^ (unsigned char)expected[i]);
    }
    return difference == 0;
}

static bool authorized(const router *rt, struct evhttp_request *request) {
    if (!rt->options.api_key) return true;
    const char *header = evhttp_find_header(evhttp_request_get_input_headers(request), "Authorization");
    if (!header || strncmp(header, "Bearer ", 7) != 0) return false;
    const char *key = header + 7;
    return same_secret(key, strlen(key), rt->options.api_key);
}

static void add_cors_headers(const router *rt, struct evhttp_request *request, bool preflight) {
    if (!rt->options.cors_origin) return;
    struct evkeyvalq *headers = evhttp_request_get_output_headers(request);
    (void)evhttp_add_header(headers, "Access-Control-Allow-Origin", rt->options.cors_origin);
    if (strcmp(rt->options.cors_origin, "*") != 0) (void)evhttp_add_header(headers, "Vary", "Origin");
    if (!preflight) return;
    (void)evhttp_add_header(headers, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    (void)evhttp_add_header(headers, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    (void)evhttp_add_header(headers, "Access-Control-Max-Age", "600");
}

static void send_health(router *rt, struct evhttp_request *request) {
    const engine_link_state state = engine_link_get_state(rt->link, NULL, 0);
    if (state == ENGINE_LINK_READY) {
        router_send_json(rt, request, 200, "{\"status\":\"ok\"}", 15);
    } else {
        const char *body = state == ENGINE_LINK_LOADING ? "{\"status\":\"loading\"}" : "{\"status\":\"failed\"}";
        (void)evhttp_add_header(evhttp_request_get_output_headers(request), "Retry-After", "1");
        router_send_json(rt, request, 503, body, strlen(body));
    }
}

static void model_object(text_buffer *b, const char *name) {
    text_buffer_puts(b, "{\"id\":");
    text_buffer_json_string(b, name, strlen(name));
    text_buffer_puts(b, ",\"object\":\"model\",\"owned_by\":\"kite\"}");
}

static void send_metrics(router *rt, struct evhttp_request *request) {
    const kite_engine_stats stats = engine_link_get_stats(rt->link);
    text_buffer b = {0};
    metrics_render(&rt->metrics, &stats, &b); /* this request is counted in the next one */
    router_send_built(rt, request, &b, "text/plain; version=0.0.4; charset=utf-8");
}

static void send_models(router *rt, struct evhttp_request *request, const char *id) {
    text_buffer b = {0};
    if (id && strcmp(id, rt->options.model_name) != 0) {
        text_buffer_puts(&b, "The model '");
        text_buffer_puts(&b, id);
        text_buffer_puts(&b, "' does not exist");
        router_send_error(rt, request, 404, b.failed ? "no such model" : b.data, "model", 0);
        text_buffer_free(&b);
        return;
    }
    if (id) {
        model_object(&b, rt->options.model_name);
    } else {
        text_buffer_puts(&b, "{\"object\":\"list\",\"data\":[");
        model_object(&b, rt->options.model_name);
        text_buffer_puts(&b, "]}");
    }
    router_send_built(rt, request, &b, "application/json");
}

/* Checks the method; false after a 405. */
static bool method_is(router *rt, struct evhttp_request *request, enum evhttp_cmd_type method) {
    if (evhttp_request_get_command(request) == method) return true;
    (void)evhttp_add_header(evhttp_request_get_output_headers(request), "Allow",
                            method == EVHTTP_REQ_GET ? "GET" : "POST");
    router_send_error(rt, request, 405, method == EVHTTP_REQ_GET ? "use GET" : "use POST", NULL, 0);
    return false;
}

void router_handle(struct evhttp_request *request, void *argument) {
    router *rt = argument;
    struct evkeyvalq *out_headers = evhttp_request_get_output_headers(request);
    char path[1024];
    if (!router_request_path(request, path, sizeof path)) {
        router_send_error(rt, request, 404, "no such endpoint", NULL, 0);
        return;
    }
    const bool preflight = evhttp_request_get_command(request) == EVHTTP_REQ_OPTIONS;
    add_cors_headers(rt, request, preflight);
    if (rt->draining) {
        (void)evhttp_add_header(out_headers, "Connection", "close");
        router_send_error(rt, request, 503, "the server is stopping", NULL, RETRY_AFTER_SECONDS);
        return;
    }
    serve_connection *c = http_server_connection(rt->server, request);
    if (!c) {
        (void)evhttp_add_header(out_headers, "Connection", "close");
        router_send_error(rt, request, 503, "too many connections", NULL, RETRY_AFTER_SECONDS);
        return;
    }
    if (preflight) {
        if (!rt->options.cors_origin) {
            router_send_error(rt, request, 405, "OPTIONS answers CORS preflights only with --cors-origin", NULL, 0);
            return;
        }
        log_simple(rt, request, 204);
        evhttp_send_reply(request, 204, "No Content", NULL);
        return;
    }
    if (strcmp(path, "/health") == 0) {
        if (method_is(rt, request, EVHTTP_REQ_GET)) send_health(rt, request);
        return;
    }
    if (strcmp(path, "/metrics") == 0) { /* Prometheus scrapes it without the API key, as vLLM's */
        if (method_is(rt, request, EVHTTP_REQ_GET)) send_metrics(rt, request);
        return;
    }
    const bool tokenize = strcmp(path, "/tokenize") == 0, detokenize = strcmp(path, "/detokenize") == 0;
    const bool api = strncmp(path, "/v1/", 4) == 0 || tokenize || detokenize;
    if (api && !authorized(rt, request)) {
        (void)evhttp_add_header(out_headers, "WWW-Authenticate", "Bearer");
        router_send_error(rt, request, 401, "Incorrect API key provided (Authorization: Bearer KEY)", NULL, 0);
        return;
    }
    if (strcmp(path, "/v1/models") == 0) {
        if (method_is(rt, request, EVHTTP_REQ_GET)) send_models(rt, request, NULL);
        return;
    }
    if (strncmp(path, "/v1/models/", 11) == 0 && path[11] && !strchr(path + 11, '/')) {
        if (!method_is(rt, request, EVHTTP_REQ_GET)) return;
        char *id = evhttp_uridecode(path + 11, 0, NULL);
        if (!id) {
            router_send_error(rt, request, 500, "out of memory", NULL, 0);
            return;
        }
        send_models(rt, request, id);
        free(id);
        return;
    }
    const bool completions = strcmp(path, "/v1/completions") == 0, chat = strcmp(path, "/v1/chat/completions") == 0;
    if (!completions && !chat && !tokenize && !detokenize) {
        router_send_error(rt, request, 404, "no such endpoint", NULL, 0);
        return;
    }
    if (!method_is(rt, request, EVHTTP_REQ_POST)) return;
    const engine_link_state state = engine_link_get_state(rt->link, NULL, 0);
    if (state != ENGINE_LINK_READY) {
        router_send_error(rt, request, 503,
                          state == ENGINE_LINK_LOADING ? "the model is loading" : "the engine has failed", NULL,
                          RETRY_AFTER_SECONDS);
        return;
    }
    if (tokenize)
        tokenize_endpoints_tokenize(rt, request);
    else if (detokenize)
        tokenize_endpoints_detokenize(rt, request);
    else
        router_generate(rt, request, c, completions ? SERVE_ENDPOINT_COMPLETIONS : SERVE_ENDPOINT_CHAT);
}

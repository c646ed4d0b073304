#include "serve_client.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A body that is not an event stream is an error page or a small JSON document: more is not kept. */
#define SERVE_CLIENT_MAX_RESPONSE (1u << 20)

typedef struct serve_connection {
    struct evhttp_connection *http;
    struct serve_connection *next_idle;
    struct serve_connection *next_all;
    serve_pool *pool;
    serve_call *call; /* in flight on it; NULL when idle */
    unsigned served;  /* requests it completed: a failure after the first may be a stale connection */
} serve_connection;

struct serve_pool {
    struct event_base *base;
    char *host;
    int port;
    int timeout_seconds;
    char *authorization; /* "Bearer KEY", or NULL */
    char host_header[300];
    serve_connection *idle;
    serve_connection *all;
};

double serve_now(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        perror("clock_gettime");
        exit(1); /* every figure depends on it: there is nothing sensible to measure without */
    }
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

serve_pool *serve_pool_new(struct event_base *base, const char *host, int port, int timeout_seconds,
                           const char *api_key) {
    serve_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->base = base;
    pool->port = port;
    pool->timeout_seconds = timeout_seconds;
    pool->host = strdup(host);
    bool ok = pool->host != NULL;
    if (ok && api_key) {
        size_t n = strlen(api_key) + sizeof "Bearer ";
        pool->authorization = malloc(n);
        ok = pool->authorization != NULL;
        if (ok) snprintf(pool->authorization, n, "Bearer %s", api_key);
    }
    /* An IPv6 literal is bracketed in Host (RFC 7230 section 5.4). */
    int written = strchr(host, ':') ? snprintf(pool->host_header, sizeof pool->host_header, "[%s]:%d", host, port)
                                    : snprintf(pool->host_header, sizeof pool->host_header, "%s:%d", host, port);
    if (written < 0 || (size_t)written >= sizeof pool->host_header) ok = false;
    if (!ok) {
        serve_pool_free(pool);
        return NULL;
    }
    return pool;
}

void serve_pool_free(serve_pool *pool) {
    if (!pool) return;
    for (serve_connection *c = pool->all, *next; c; c = next) {
        next = c->next_all;
        evhttp_connection_free(c->http);
        free(c);
    }
    free(pool->host);
    free(pool->authorization);
    free(pool);
}

void serve_call_clear(serve_call *call) {
    serve_stream_free(&call->events);
    text_builder_free(&call->response);
    call->status = 0;
    call->sent_at = call->done_at = 0;
    call->transport_error[0] = '\0';
    call->connection = NULL;
    call->received = 0;
    call->retried = false;
}

static const char *request_error_name(enum evhttp_request_error error) {
    switch (error) {
    case EVREQ_HTTP_TIMEOUT:
        return "timed out";
    case EVREQ_HTTP_EOF:
        return "the server closed the connection";
    case EVREQ_HTTP_INVALID_HEADER:
        return "an invalid response header";
    case EVREQ_HTTP_BUFFER_ERROR:
        return "a read or write error (connection refused or reset)";
    case EVREQ_HTTP_REQUEST_CANCEL:
        return "cancelled";
    case EVREQ_HTTP_DATA_TOO_LONG:
        return "a response too long";
    }
    return "an unknown evhttp error";
}

static void on_error(enum evhttp_request_error error, void *arg) {
    serve_connection *c = arg;
    if (c->call && !c->call->transport_error[0])
        snprintf(c->call->transport_error, sizeof c->call->transport_error, "%s", request_error_name(error));
}

/* Each piece of the body as it is read; evhttp drains the buffer after this returns. */
static void on_chunk(struct evhttp_request *request, void *arg) {
    serve_connection *c = arg;
    serve_call *call = c->call;
    const double now = serve_now();
    struct evbuffer *input = evhttp_request_get_input_buffer(request);
    const bool events = call->stream && evhttp_request_get_response_code(request) == 200;
    int n = evbuffer_peek(input, -1, NULL, NULL, 0);
    if (n <= 0) return;
    call->received += evbuffer_get_length(input);
    struct evbuffer_iovec extents[16];
    struct evbuffer_iovec *v = n <= 16 ? extents : malloc((size_t)n * sizeof *v);
    if (!v) {
        snprintf(call->transport_error, sizeof call->transport_error, "out of memory reading the body");
        return;
    }
    evbuffer_peek(input, -1, NULL, v, n);
    for (int i = 0; i < n; i++) {
        if (events) {
            serve_stream_feed(&call->events, v[i].iov_base, v[i].iov_len, now);
        } else if (call->response.length + v[i].iov_len <= SERVE_CLIENT_MAX_RESPONSE) {
            text_builder_append(&call->response, v[i].iov_base, v[i].iov_len);
        } else if (!call->transport_error[0]) {
            snprintf(call->transport_error, sizeof call->transport_error, "a response body over %u bytes",
                     SERVE_CLIENT_MAX_RESPONSE);
        }
    }
    if (v != extents) free(v);
}

static void retry_call(evutil_socket_t fd, short what, void *arg) {
    (void)fd;
    (void)what;
    serve_call *call = arg;
    const double first_sent_at = call->sent_at; /* the retry's cost counts in the call's latency */
    if (serve_pool_start(call->pool, call, call->done, call->done_arg)) {
        call->sent_at = first_sent_at;
        return;
    }
    snprintf(call->transport_error, sizeof call->transport_error, "the retry on a new connection could not start");
    call->done_at = serve_now();
    call->done(call, call->done_arg);
}

static void on_done(struct evhttp_request *request, void *arg) {
    serve_connection *c = arg;
    serve_call *call = c->call;
    call->done_at = serve_now();
    const bool no_response = request == NULL || evhttp_request_get_response_code(request) == 0;
    if (no_response && c->served > 0 && call->received == 0 && !call->retried) {
        /* evhttp reconnects this connection when it is next used; the retry runs from the loop, after evhttp is
         * done with the failed request. */
        c->call = NULL;
        c->next_idle = c->pool->idle;
        c->pool->idle = c;
        call->connection = NULL;
        call->retried = true;
        call->transport_error[0] = '\0';
        const struct timeval now = {0, 0};
        if (event_base_once(c->pool->base, -1, EV_TIMEOUT, retry_call, call, &now) == 0) return;
        snprintf(call->transport_error, sizeof call->transport_error, "could not schedule the retry");
        call->done(call, call->done_arg);
        return;
    }
    if (no_response) {
        if (!call->transport_error[0])
            snprintf(call->transport_error, sizeof call->transport_error,
                     "no response (connection refused, reset or closed)");
    } else {
        call->status = evhttp_request_get_response_code(request);
        /* Bytes evhttp still holds (a body read whole without the chunk callback). */
        if (evbuffer_get_length(evhttp_request_get_input_buffer(request)) > 0) on_chunk(request, c);
        if (call->stream && call->status == 200) serve_stream_finish(&call->events);
        if (call->response.failed && !call->transport_error[0])
            snprintf(call->transport_error, sizeof call->transport_error, "out of memory holding the body");
    }
    if (!no_response) c->served++;
    c->call = NULL;
    c->next_idle = c->pool->idle;
    c->pool->idle = c;
    call->connection = NULL;
    call->done(call, call->done_arg);
}

static serve_connection *pool_take_connection(serve_pool *pool) {
    serve_connection *c = pool->idle;
    if (c) {
        pool->idle = c->next_idle;
        c->next_idle = NULL;
        return c;
    }
    c = calloc(1, sizeof *c);
    if (!c) return NULL;
    /* NULL dns base: the name is resolved with a blocking getaddrinfo once per connect (loopback here). */
    c->http = evhttp_connection_base_new(pool->base, NULL, pool->host, (unsigned short)pool->port);
    if (!c->http) {
        free(c);
        return NULL;
    }
    evhttp_connection_set_timeout(c->http, pool->timeout_seconds);
    c->pool = pool;
    c->next_all = pool->all;
    pool->all = c;
    return c;
}

bool serve_pool_start(serve_pool *pool, serve_call *call, serve_call_done_fn done, void *arg) {
    serve_connection *c = pool_take_connection(pool);
    if (!c) {
        fprintf(stderr, "kite-serve-bench: cannot open a connection to %s\n", pool->host_header);
        return false;
    }
    struct evhttp_request *request = evhttp_request_new(on_done, c);
    if (!request) {
        fprintf(stderr, "kite-serve-bench: out of memory making a request\n");
        c->next_idle = pool->idle;
        pool->idle = c;
        return false;
    }
    evhttp_request_set_chunked_cb(request, on_chunk);
    evhttp_request_set_error_cb(request, on_error);
    struct evkeyvalq *headers = evhttp_request_get_output_headers(request);
    bool ok = evhttp_add_header(headers, "Host", pool->host_header) == 0 &&
              evhttp_add_header(headers, "Connection", "keep-alive") == 0;
    if (ok && pool->authorization) ok = evhttp_add_header(headers, "Authorization", pool->authorization) == 0;
    if (ok && call->body) {
        ok = evhttp_add_header(headers, "Content-Type", "application/json") == 0 &&
             evbuffer_add_reference(evhttp_request_get_output_buffer(request), call->body, call->body_length, NULL,
                                    NULL) == 0;
    }
    if (ok && call->stream) ok = evhttp_add_header(headers, "Accept", "text/event-stream") == 0;
    enum evhttp_cmd_type type = strcmp(call->method, "POST") == 0 ? EVHTTP_REQ_POST : EVHTTP_REQ_GET;
    if (!ok) {
        fprintf(stderr, "kite-serve-bench: out of memory building a request\n");
        evhttp_request_free(request);
        c->next_idle = pool->idle;
        pool->idle = c;
        return false;
    }
    call->done = done;
    call->done_arg = arg;
    call->pool = pool;
    call->received = 0;
    call->connection = c;
    c->call = call;
    call->sent_at = serve_now();
    /* On failure evhttp_make_request frees the request itself. */
    if (evhttp_make_request(c->http, request, type, call->path) != 0) {
        fprintf(stderr, "kite-serve-bench: evhttp could not send %s %s\n", call->method, call->path);
        c->call = NULL;
        call->connection = NULL;
        c->next_idle = pool->idle;
        pool->idle = c;
        return false;
    }
    return true;
}

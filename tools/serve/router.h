/* The HTTP loop thread's side of kite serve: routing, authentication, CORS and the small endpoints
 * (routes.c), and the generation requests from admission to the last byte (generation.c). Everything here
 * runs on the loop thread. */
#ifndef KITE_TOOLS_SERVE_ROUTER_H
#define KITE_TOOLS_SERVE_ROUTER_H

#include <stdbool.h>
#include <stdio.h>

#include "serve/engine_link.h"
#include "serve/http_server.h"
#include "serve/metrics.h"

struct event;
struct evhttp_request;

typedef struct router_options {
    const char *model_name;
    const char *api_key;     /* NULL: the API needs no key */
    const char *cors_origin; /* NULL: no CORS headers */
    int max_queue;           /* requests waiting beyond the running batch before 503 */
    int drain_seconds;       /* after SIGTERM, how long in-flight requests may run before they are cancelled */
    FILE *access_log;        /* one JSON line per answered request; NULL: none */
} router_options;

typedef struct router {
    router_options options;
    http_server *server;
    engine_link *link;
    struct event_base *base;
    struct event *wake; /* made active by the engine thread */
    struct event *drain_timer;
    struct event *flush_timer; /* the drain's end: waits for the last responses to leave */
    struct event *idle_trim;   /* armed when the last request is answered: gives freed memory back (generation.c) */
    double flush_deadline;
    bool ready_reported;
    bool draining;
    bool load_failed;
    int in_flight; /* generation requests admitted and not yet answered */
    long next_number;
    serve_metrics metrics;
} router;

/* evhttp's callback for every request. */
void router_handle(struct evhttp_request *request, void *argument);
/* The engine thread woke the loop: output, finished requests, or the end of the model load. */
void router_on_wake(int fd, short what, void *argument);
/* http_server's hangup callback: the client of a running request is gone. */
void router_on_hangup(serve_connection *c, void *argument);
/* The idle_trim timer: nothing has been in flight for a moment (generation.c says why it trims). */
void router_on_idle(int fd, short what, void *argument);
/* SIGTERM / SIGINT: stop accepting, let in-flight requests finish within drain_seconds, then cancel them. */
void router_start_drain(router *r);

/* ---- shared between routes.c and generation.c ---- */

/* Sends a JSON body with the status (and logs it). */
void router_send_json(router *rt, struct evhttp_request *request, int status, const char *body, size_t length);
/* Sends a response built in `b` with status 200 and this content type, or a 500 when building it ran out of
 * memory (and logs it); frees `b`. */
void router_send_built(router *rt, struct evhttp_request *request, text_buffer *b, const char *content_type);
/* Sends an OpenAI-shaped error (and logs it); retry_after_seconds > 0 adds Retry-After. */
void router_send_error(router *rt, struct evhttp_request *request, int status, const char *message,
                       const char *param, int retry_after_seconds);
/* Admits a generation request: parsed, checked against the queue bound, handed to the engine. */
void router_generate(router *rt, struct evhttp_request *request, serve_connection *c, serve_endpoint endpoint);
/* The path without the query string, into `path` (false when it does not fit or there is none). */
bool router_request_path(struct evhttp_request *request, char *path, size_t size);
const char *router_method_name(struct evhttp_request *request);

#endif

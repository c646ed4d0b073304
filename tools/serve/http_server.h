/* `kite serve`'s HTTP layer on libevent's evhttp: the listening socket (an IPv4 or IPv6 address or a host name,
 * resolved with getaddrinfo), evhttp's limits, and one record per client connection.
 *
 * evhttp gives keep-alive, pipelining (the requests of one connection are answered one after another, in
 * order), chunked request bodies and header, body and timeout limits; this module adds the connection limit
 * and notices a client that hangs up while its request runs (evhttp stops reading a connection while it
 * answers it, so its own close callback would come only when a write fails).
 */
#ifndef KITE_TOOLS_SERVE_HTTP_SERVER_H
#define KITE_TOOLS_SERVE_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>

struct event_base;
struct event;
struct evhttp;
struct evhttp_bound_socket;
struct evhttp_connection;
struct evhttp_request;

typedef struct http_limits {
    size_t max_header_bytes;
    size_t max_body_bytes;
    int timeout_seconds;   /* a connection idle, or stalled reading or writing, for longer is closed */
    int max_connections;   /* open client connections at most; the next is answered 503 and closed */
    size_t max_output_bytes; /* unsent response bytes a client may leave queued before it is dropped */
} http_limits;

typedef struct http_server http_server;

/* One client connection, from its first request until evhttp closes it. */
typedef struct serve_connection {
    http_server *server;
    struct evhttp_connection *connection;
    void *current;              /* the generation request it waits for (the router's), or NULL */
    struct event *hangup_watch; /* readable while `current` runs: the client sent more or hung up */
    struct serve_connection *next, *prev;
} serve_connection;

struct http_server {
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    http_limits limits;
    int n_connections;
    serve_connection *connections;
    /* Called on the loop thread when a connection with a `current` request closes (the client hung up, or
     * was dropped, or the server is closing). The record is freed when it returns. */
    void (*on_hangup)(serve_connection *c, void *argument);
    void *argument;
    char address[128]; /* "HOST:PORT" as it listens, IPv6 in brackets */
};

/* Listens on host:port (port 0 picks one) with the limits; requests go to `handler`. false after a line on
 * stderr. */
bool http_server_open(http_server *s, struct event_base *base, const char *host, int port,
                      const http_limits *limits, void (*handler)(struct evhttp_request *, void *), void *argument);
/* Closes the listening socket; open connections stay. */
void http_server_stop_accepting(http_server *s);
/* Closes every connection and frees evhttp. */
void http_server_close(http_server *s);

/* The record of the request's connection, made on its first request; NULL when the connection limit is
 * reached (or memory is out): the caller answers 503 with "Connection: close". */
serve_connection *http_server_connection(http_server *s, struct evhttp_request *request);
/* Starts or stops watching the connection for a hangup while `c->current` runs. */
void http_server_watch_hangup(serve_connection *c, bool on);
/* Unsent bytes queued on the connection. */
size_t http_server_queued_bytes(const serve_connection *c);
/* Unsent bytes queued on every connection together. */
size_t http_server_total_queued_bytes(const http_server *s);
/* Drops a client (one that does not read its response); on_hangup follows. */
void http_server_drop(serve_connection *c);

#endif

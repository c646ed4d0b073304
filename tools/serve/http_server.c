/* evhttp set up for kite serve (http_server.h). */
#define _GNU_SOURCE
#include "serve/http_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/util.h>

/* Binds and listens on the first address of `host` that takes it. -1 after a line on stderr. */
static int listen_on(const char *host, int port, char *address, size_t address_size) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *found = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int status = getaddrinfo(host, service, &hints, &found);
    if (status != 0) {
        fprintf(stderr, "kite serve: --host %s: %s\n", host, gai_strerror(status));
        return -1;
    }
    int fd = -1, last_errno = 0;
    for (struct addrinfo *a = found; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int one = 1;
        /* IPV6_V6ONLY stays the system's (off on Linux): --host :: takes IPv4 clients too. */
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
            bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
            last_errno = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(found);
    if (fd < 0) {
        fprintf(stderr, "kite serve: cannot listen on %s:%d: %s\n", host, port, strerror(last_errno));
        return -1;
    }
    struct sockaddr_storage bound;
    socklen_t length = sizeof bound;
    char text[INET6_ADDRSTRLEN] = "";
    if (getsockname(fd, (struct sockaddr *)&bound, &length) != 0) {
        fprintf(stderr, "kite serve: getsockname: %s\n", strerror(errno));
        close(fd);
        return -1;
    }
    if (bound.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)&bound;
        inet_ntop(AF_INET6, &a6->sin6_addr, text, sizeof text);
        snprintf(address, address_size, "[%s]:%d", text, ntohs(a6->sin6_port));
    } else {
        const struct sockaddr_in *a4 = (const struct sockaddr_in *)&bound;
        inet_ntop(AF_INET, &a4->sin_addr, text, sizeof text);
        snprintf(address, address_size, "%s:%d", text, ntohs(a4->sin_port));
    }
    return fd;
}

bool http_server_open(http_server *s, struct event_base *base, const char *host, int port,
                      const http_limits *limits, void (*handler)(struct evhttp_request *, void *), void *argument) {
    s->base = base;
    s->limits = *limits;
    s->http = evhttp_new(base);
    if (!s->http) {
        fprintf(stderr, "kite serve: cannot create the HTTP server\n");
        return false;
    }
    evhttp_set_max_headers_size(s->http, (ev_ssize_t)limits->max_header_bytes);
    evhttp_set_max_body_size(s->http, (ev_ssize_t)limits->max_body_bytes);
    evhttp_set_timeout(s->http, limits->timeout_seconds);
    evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_HEAD |
                                            EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_PATCH);
    evhttp_set_gencb(s->http, handler, argument);
    const int fd = listen_on(host, port, s->address, sizeof s->address);
    if (fd < 0) return false;
    s->bound = evhttp_accept_socket_with_handle(s->http, fd);
    if (!s->bound) {
        fprintf(stderr, "kite serve: cannot accept on %s\n", s->address);
        close(fd);
        return false;
    }
    return true;
}

void http_server_stop_accepting(http_server *s) {
    if (!s->bound) return;
    evhttp_del_accept_socket(s->http, s->bound); /* closes the socket */
    s->bound = NULL;
}

void http_server_close(http_server *s) {
    if (s->http) evhttp_free(s->http); /* every connection's close callback runs */
    s->http = NULL;
    s->bound = NULL;
}

static void connection_forget(serve_connection *c) {
    http_server *s = c->server;
    if (c->hangup_watch) event_free(c->hangup_watch);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->connections = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_connections--;
    free(c);
}

/* evhttp is closing the connection: a request still running has lost its client. */
static void on_close(struct evhttp_connection *connection, void *argument) {
    (void)connection;
    serve_connection *c = argument;
    if (c->current && c->server->on_hangup) c->server->on_hangup(c, c->server->argument);
    connection_forget(c);
}

/* The socket turned readable while a request runs: the client hung up, or sent its next request early
 * (pipelining), which evhttp reads once this one is answered. */
static void on_readable(evutil_socket_t fd, short what, void *argument) {
    (void)what;
    serve_connection *c = argument;
    char byte;
    const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    http_server_watch_hangup(c, false);
    if (n > 0) return; /* more requests: a hangup now shows when a write fails */
    http_server_drop(c);
}

serve_connection *http_server_connection(http_server *s, struct evhttp_request *request) {
    struct evhttp_connection *connection = evhttp_request_get_connection(request);
    if (!connection) return NULL;
    for (serve_connection *c = s->connections; c; c = c->next)
        if (c->connection == connection) return c;
    if (s->n_connections >= s->limits.max_connections) return NULL;
    serve_connection *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = (serve_connection){.server = s, .connection = connection, .next = s->connections};
    if (s->connections) s->connections->prev = c;
    s->connections = c;
    s->n_connections++;
    evhttp_connection_set_closecb(connection, on_close, c);
    return c;
}

void http_server_watch_hangup(serve_connection *c, bool on) {
    if (!on) {
        if (c->hangup_watch) event_del(c->hangup_watch);
        return;
    }
    if (!c->hangup_watch) {
        struct bufferevent *stream = evhttp_connection_get_bufferevent(c->connection);
        const evutil_socket_t fd = stream ? bufferevent_getfd(stream) : -1;
        if (fd < 0) return;
        c->hangup_watch = event_new(c->server->base, fd, EV_READ | EV_PERSIST, on_readable, c);
        if (!c->hangup_watch) return; /* out of memory: a hangup shows when a write fails */
    }
    (void)event_add(c->hangup_watch, NULL);
}

size_t http_server_queued_bytes(const serve_connection *c) {
    struct bufferevent *stream = evhttp_connection_get_bufferevent(c->connection);
    return stream ? evbuffer_get_length(bufferevent_get_output(stream)) : 0;
}

size_t http_server_total_queued_bytes(const http_server *s) {
    size_t total = 0;
    for (const serve_connection *c = s->connections; c; c = c->next) total += http_server_queued_bytes(c);
    return total;
}

void http_server_drop(serve_connection *c) {
    evhttp_connection_free(c->connection); /* on_close runs inside, and frees c */
}

/* The load generator's HTTP/1.1 client, on libevent's evhttp (the library kite serve is built on): a pool of
 * keep-alive connections to one server, each carrying one request at a time, so that N requests in flight hold N
 * connections, reused from one request to the next. A call's body is read as it arrives: a 200 with
 * `stream` set is fed to a serve_stream (stamped with the time each piece of it came), anything else is kept
 * whole (up to 1 MiB) for the caller to read or to quote in an error.
 *
 * A request that fails on a reused connection before any byte of its response arrived is sent once more on a
 * new one, as HTTP clients do (RFC 9112 section 9.3.1): a server may close an idle keep-alive connection at any
 * time (llama-server closes them after each streamed response), and the client only learns of it by writing.
 *
 * Single-threaded: everything runs on the event loop of the base the pool was made with. */
#ifndef KITE_BENCH_SERVE_CLIENT_H
#define KITE_BENCH_SERVE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#include "serve_stream.h"
#include "util/text_builder.h"

struct event_base;
typedef struct serve_pool serve_pool;
typedef struct serve_call serve_call;

typedef void (*serve_call_done_fn)(serve_call *call, void *arg);

struct serve_call {
    /* in */
    const char *method; /* "GET" or "POST" */
    const char *path;   /* "/v1/completions" */
    const char *body;   /* POST: the JSON body (not copied: valid until the call is done) */
    size_t body_length;
    bool stream; /* a 200's body is server-sent events */
    /* out */
    int status;                /* the HTTP status; 0 when no response came */
    double sent_at;            /* monotonic seconds when the request was handed to the connection */
    double done_at;            /* when its last byte (or its failure) arrived */
    serve_stream events;       /* stream and status 200 */
    text_builder response;     /* otherwise: the body */
    char transport_error[160]; /* non-empty when the connection failed (refused, reset, timed out, body too large) */
    /* the pool's */
    struct serve_connection *connection;
    serve_call_done_fn done;
    void *done_arg;
    serve_pool *pool;
    size_t received;      /* body bytes read in this attempt */
    bool retried;         /* sent again after a stale keep-alive connection failed it */
};

/* Connections to host:port; `timeout_seconds` bounds each read and write (a stalled server fails the call). */
serve_pool *serve_pool_new(struct event_base *base, const char *host, int port, int timeout_seconds,
                           const char *api_key);
void serve_pool_free(serve_pool *pool);

/* Starts `call` on an idle connection (a new one when none is idle); `done` runs on the loop once it ended, with
 * the call's results filled in. False (with a message on stderr) when the request could not be started. */
bool serve_pool_start(serve_pool *pool, serve_call *call, serve_call_done_fn done, void *arg);

/* Releases what a finished call holds, leaving its inputs. */
void serve_call_clear(serve_call *call);

/* Monotonic seconds. */
double serve_now(void);

#endif

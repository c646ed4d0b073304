/* Generation requests on the loop thread (router.h): admission, the engine's output written out as it
 * arrives, hangups, and the drain on SIGTERM. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "serve/access_log.h"
#include "serve/api_error.h"
#include "serve/chat_completions.h"
#include "serve/completions.h"
#include "serve/router.h"

#define RETRY_AFTER_SECONDS 1

static const char *endpoint_path(const serve_request *r) {
    return r->endpoint == SERVE_ENDPOINT_CHAT ? "/v1/chat/completions" : "/v1/completions";
}

/* A refusal at submission (a prompt the library will not take) is the client's fault: 400 with the library's
 * message. Anything else failed on the server's side, a request whose logits allowed no token (KITE_FINISH_ERROR:
 * the model's weights or activations are not finite) too: 500, as vLLM answers an error in generation. */
static int failure_status(const serve_request *r) {
    if (r->finish == KITE_FINISH_ERROR) return 500;
    switch (r->failed_status) {
    case KITE_ERROR_INVALID_ARGUMENT:
    case KITE_ERROR_INVALID_INPUT:
    case KITE_ERROR_CAPACITY:
    case KITE_ERROR_UNSUPPORTED: return 400;
    default: return 500;
    }
}

static void log_request(router *rt, const serve_request *r, int status) {
    char id[48];
    snprintf(id, sizeof id, "%s-%ld", r->endpoint == SERVE_ENDPOINT_CHAT ? "chatcmpl" : "cmpl", r->number);
    const double now = serve_now_seconds();
    access_log_entry e = {
        .id = id,
        .method = "POST",
        .endpoint = endpoint_path(r),
        .status = status,
        .prompt_tokens = r->n_prompt,
        .generated_tokens = r->n_generated,
        .ttft_seconds = r->first_token_seconds > 0 ? r->first_token_seconds - r->start_seconds : -1,
        .total_seconds = now - r->start_seconds,
        .finish_reason = r->done && (!r->failed || r->finish == KITE_FINISH_ERROR) && r->finish != KITE_FINISH_NONE
                             ? kite_finish_reason_string(r->finish)
                             : NULL,
    };
    access_log_write(rt->options.access_log, &e);
    metrics_record(&rt->metrics, &e);
}

#define FLUSH_SECONDS 5.0

static void on_flush_tick(int fd, short what, void *argument) {
    (void)fd;
    (void)what;
    router *rt = argument;
    if (http_server_total_queued_bytes(rt->server) == 0 || serve_now_seconds() > rt->flush_deadline)
        event_base_loopexit(rt->base, NULL);
}

/* The drain is over: the loop ends once the last responses are written (or FLUSH_SECONDS passed: a client
 * that does not read them does not hold the exit). */
static void exit_when_flushed(router *rt) {
    if (rt->flush_timer) return;
    rt->flush_deadline = serve_now_seconds() + FLUSH_SECONDS;
    rt->flush_timer = event_new(rt->base, -1, EV_PERSIST, on_flush_tick, rt);
    const struct timeval tick = {.tv_usec = 20 * 1000};
    if (!rt->flush_timer || event_add(rt->flush_timer, &tick) != 0) event_base_loopexit(rt->base, NULL);
}

/* The connection is free for its next request. */
static void release_connection(serve_request *r) {
    if (!r->connection) return;
    http_server_watch_hangup(r->connection, false);
    r->connection->current = NULL;
    r->connection = NULL;
}

/* The loop is done with the request: no more watching, no more output; the loop's reference goes back. */
static void finish(router *rt, serve_request *r, int status) {
    r->answered = true;
    release_connection(r);
    log_request(rt, r, status);
    rt->in_flight--;
    engine_link_release(rt->link, r);
    if (rt->draining && rt->in_flight == 0) exit_when_flushed(rt);
}

static void send_body(struct evhttp_request *http, int status, const text_buffer *b) {
    struct evbuffer *out = evbuffer_new();
    if (!out || b->failed || evbuffer_add(out, b->data, b->length) != 0) {
        if (out) evbuffer_free(out);
        api_error_send(http, 500, "out of memory", NULL, 0);
        return;
    }
    (void)evhttp_add_header(evhttp_request_get_output_headers(http), "Content-Type", "application/json");
    evhttp_send_reply(http, status, api_error_reason(status), out);
    evbuffer_free(out);
}

/* One server-sent event ("data: ...\n\n") onto the stream; false when the client was dropped for not reading. */
static bool send_event(router *rt, serve_request *r, const text_buffer *payload) {
    if (!r->http) return false; /* dropped already */
    struct evbuffer *out = evbuffer_new();
    bool ok = out && !payload->failed && evbuffer_add(out, "data: ", 6) == 0 &&
              evbuffer_add(out, payload->data, payload->length) == 0 && evbuffer_add(out, "\n\n", 2) == 0;
    if (ok) evhttp_send_reply_chunk(r->http, out);
    if (out) evbuffer_free(out);
    if (ok && r->connection && http_server_queued_bytes(r->connection) <= rt->server->limits.max_output_bytes)
        return true;
    /* Out of memory, or a client that lets its unread output pile up: it is dropped (the hangup handler
     * cancels the request). */
    if (r->connection) http_server_drop(r->connection);
    return false;
}

static void send_error_event(router *rt, serve_request *r, int status, const char *message) {
    text_buffer b = {0};
    api_error_json(&b, status, message, NULL);
    if (send_event(rt, r, &b)) {
        text_buffer_clear(&b);
        text_buffer_puts(&b, "[DONE]");
        (void)send_event(rt, r, &b);
    }
    text_buffer_free(&b);
}

static void start_stream(serve_request *r) {
    struct evkeyvalq *headers = evhttp_request_get_output_headers(r->http);
    (void)evhttp_add_header(headers, "Content-Type", "text/event-stream");
    (void)evhttp_add_header(headers, "Cache-Control", "no-cache");
    evhttp_send_reply_start(r->http, 200, "OK");
    r->reply_started = true;
}

static void end_stream(router *rt, serve_request *r, int status) {
    if (r->http) evhttp_send_reply_end(r->http);
    r->http = NULL;
    finish(rt, r, status);
}

/* The response is over before the engine is done with the request (it failed on this side): the engine is
 * told to stop, and deliver_nowhere finishes the request once it has. */
static void abandon(router *rt, serve_request *r, int status) {
    if (r->http && r->reply_started) evhttp_send_reply_end(r->http);
    r->http = NULL;
    release_connection(r);
    r->client_gone = true;
    r->final_status = status;
    if (!r->cancel_sent) {
        r->cancel_sent = true;
        engine_link_cancel(rt->link, r);
    }
}

/* The chunks for what arrived; false when the client was dropped. */
static bool send_chunks(router *rt, serve_request *r, const text_buffer *text, const text_buffer *reasoning,
                        const text_buffer *calls, bool done) {
    const char *name = rt->options.model_name;
    text_buffer chunk = {0};
    bool alive = true;
    if (r->endpoint == SERVE_ENDPOINT_CHAT) {
        if (text->length || reasoning->length || calls->length || done || !r->first_chunk_out) {
            chat_completions_chunk_json(&chunk, name, r, text, reasoning, calls, !r->first_chunk_out, done);
            r->first_chunk_out = true;
            alive = send_event(rt, r, &chunk);
        }
    } else if (text->length || done) {
        completions_chunk_json(&chunk, name, r, text->data, text->length, done);
        alive = send_event(rt, r, &chunk);
    }
    if (alive && done && r->include_usage) {
        text_buffer_clear(&chunk);
        if (r->endpoint == SERVE_ENDPOINT_CHAT)
            chat_completions_usage_chunk_json(&chunk, name, r);
        else
            completions_usage_chunk_json(&chunk, name, r);
        alive = send_event(rt, r, &chunk);
    }
    if (alive && done) {
        text_buffer_clear(&chunk);
        text_buffer_puts(&chunk, "[DONE]");
        alive = send_event(rt, r, &chunk);
    }
    text_buffer_free(&chunk);
    return alive;
}

/* What the engine produced for a streamed request, as chunks; on the last one, the end of the stream. The
 * stream's header goes out with the first output, so a request refused at submission is still a plain 400. */
static void deliver_stream(router *rt, serve_request *r) {
    text_buffer text = {0}, reasoning = {0}, calls = {0};
    const bool done = engine_link_take_output(rt->link, r, &text, &reasoning, &calls);
    const bool cancelled = done && !r->failed && r->finish == KITE_FINISH_CANCELLED;
    if (text.failed || reasoning.failed || calls.failed) {
        if (r->reply_started) {
            send_error_event(rt, r, 500, "out of memory");
        } else {
            api_error_send(r->http, 500, "out of memory", NULL, 0);
            r->http = NULL;
        }
        if (done)
            end_stream(rt, r, 500);
        else
            abandon(rt, r, 500);
    } else if (done && (r->failed || cancelled)) {
        const int status = r->failed ? failure_status(r) : 503;
        const char *message = r->failed ? r->error : "the server stopped before the request finished";
        bool alive = true;
        if (r->finish == KITE_FINISH_ERROR) {
            /* Generation had begun: its failure is an event of the stream (as vLLM's), after the text made before
             * the row that allowed no token. */
            if (!r->reply_started) start_stream(r);
            alive = send_chunks(rt, r, &text, &reasoning, &calls, false);
        }
        if (!alive) {
            end_stream(rt, r, 499);
        } else if (r->reply_started) {
            send_error_event(rt, r, status, message); /* the stream has begun: the error is an event */
        } else {
            api_error_send(r->http, status, message, NULL, r->failed ? 0 : RETRY_AFTER_SECONDS);
            r->http = NULL;
        }
        end_stream(rt, r, status);
    } else {
        if (!r->reply_started) start_stream(r);
        const bool alive = send_chunks(rt, r, &text, &reasoning, &calls, done);
        if (done) end_stream(rt, r, alive ? 200 : 499);
    }
    text_buffer_free(&text);
    text_buffer_free(&reasoning);
    text_buffer_free(&calls);
}

static void deliver_whole(router *rt, serve_request *r) {
    if (!engine_link_take_output(rt->link, r, &r->whole_text, &r->whole_reasoning, &r->whole_calls)) return;
    int status = 200;
    if (r->failed) {
        status = failure_status(r);
        api_error_send(r->http, status, r->error, NULL, 0);
    } else if (r->finish == KITE_FINISH_CANCELLED) {
        status = 503;
        api_error_send(r->http, status, "the server stopped before the request finished", NULL, RETRY_AFTER_SECONDS);
    } else if (r->whole_text.failed || r->whole_reasoning.failed || r->whole_calls.failed) {
        status = 500;
        api_error_send(r->http, status, "out of memory", NULL, 0);
    } else {
        text_buffer b = {0};
        if (r->endpoint == SERVE_ENDPOINT_CHAT)
            chat_completions_whole_json(&b, rt->options.model_name, r);
        else
            completions_whole_json(&b, rt->link->model, rt->options.model_name, r);
        send_body(r->http, status, &b);
        text_buffer_free(&b);
    }
    r->http = NULL;
    finish(rt, r, status);
}

/* A request whose client is gone: its output is dropped; once the engine is done with it, a request evhttp
 * detached from its connection is freed (by the reply it no longer sends anywhere). */
static void deliver_nowhere(router *rt, serve_request *r) {
    if (!engine_link_take_output(rt->link, r, NULL, NULL, NULL)) return;
    if (r->http) {
        if (r->reply_started)
            evhttp_send_reply_end(r->http);
        else
            evhttp_send_reply(r->http, 500, "Client Gone", NULL);
        r->http = NULL;
    }
    finish(rt, r, r->final_status ? r->final_status : 499); /* 499: nginx's "client closed request" */
}

static void report_load(router *rt) {
    char error[512];
    const engine_link_state state = engine_link_get_state(rt->link, error, sizeof error);
    if (state == ENGINE_LINK_LOADING || rt->ready_reported) return;
    rt->ready_reported = true;
    if (state == ENGINE_LINK_FAILED) {
        fprintf(stderr, "kite: %s\n", error);
        rt->load_failed = true;
        event_base_loopexit(rt->base, NULL);
        return;
    }
    const kite_engine_stats stats = engine_link_get_stats(rt->link);
    fprintf(stderr, "kite serve: %s backend; KV cache %zu tokens, %d sequences of the full %d-token context; ready\n",
            kite_model_get_info(rt->link->model).backend_name, stats.kv_capacity_tokens, stats.max_concurrent_full,
            stats.max_context);
}

void router_on_wake(int fd, short what, void *argument) {
    (void)fd;
    (void)what;
    router *rt = argument;
    report_load(rt);
    for (serve_request *r = engine_link_take_outbox(rt->link), *next; r; r = next) {
        next = engine_link_outbox_next(rt->link, r);
        if (r->answered) {
            /* nothing more to write */
        } else if (r->client_gone) {
            deliver_nowhere(rt, r);
        } else if (r->stream) {
            deliver_stream(rt, r);
        } else {
            deliver_whole(rt, r);
        }
        engine_link_release(rt->link, r); /* the outbox's */
    }
}

void router_on_hangup(serve_connection *c, void *argument) {
    router *rt = argument;
    serve_request *r = c->current;
    c->current = NULL;
    r->connection = NULL;
    r->client_gone = true;
    /* evhttp frees a request still on its connection; one it detached (the client hung up or timed out) waits
     * for a reply to be freed. */
    if (r->http && evhttp_request_get_connection(r->http) != NULL) r->http = NULL;
    if (!r->cancel_sent) {
        r->cancel_sent = true;
        engine_link_cancel(rt->link, r);
    }
}

void router_generate(router *rt, struct evhttp_request *request, serve_connection *c, serve_endpoint endpoint) {
    struct evbuffer *input = evhttp_request_get_input_buffer(request);
    const size_t length = evbuffer_get_length(input);
    const char *body = length ? (const char *)evbuffer_pullup(input, -1) : "";
    if (!body) {
        router_send_error(rt, request, 500, "out of memory", NULL, 0);
        return;
    }
    /* Up to max_sequences run at once; beyond them, max_queue may wait. */
    if (rt->in_flight >= rt->link->engine_params.max_sequences + rt->options.max_queue) {
        router_send_error(rt, request, 503, "the server is busy: too many requests are waiting", NULL,
                          RETRY_AFTER_SECONDS);
        return;
    }
    field_error e = {0};
    const char *served = rt->options.model_name;
    serve_request *r = endpoint == SERVE_ENDPOINT_CHAT
                           ? chat_completions_parse(rt->link->model, served, body, length, &e)
                           : completions_parse(rt->link->model, served, body, length, &e);
    if (!r) {
        router_send_error(rt, request, e.status ? e.status : 400, e.message, e.param[0] ? e.param : NULL, 0);
        return;
    }
    r->number = ++rt->next_number;
    r->http = request;
    r->connection = c;
    c->current = r;
    rt->in_flight++;
    http_server_watch_hangup(c, true);
    engine_link_submit(rt->link, r);
}

static void on_drain_deadline(int fd, short what, void *argument) {
    (void)fd;
    (void)what;
    router *rt = argument;
    fprintf(stderr, "kite serve: the drain timed out; cancelling %d requests\n", rt->in_flight);
    engine_link_cancel_everything(rt->link);
}

void router_start_drain(router *rt) {
    if (rt->draining) return;
    rt->draining = true;
    http_server_stop_accepting(rt->server);
    fprintf(stderr, "kite serve: stopping; %d requests in flight\n", rt->in_flight);
    if (rt->in_flight == 0) {
        exit_when_flushed(rt);
        return;
    }
    rt->drain_timer = evtimer_new(rt->base, on_drain_deadline, rt);
    const struct timeval deadline = {.tv_sec = rt->options.drain_seconds};
    if (!rt->drain_timer || evtimer_add(rt->drain_timer, &deadline) != 0) {
        fprintf(stderr, "kite serve: cannot time the drain; cancelling now\n");
        engine_link_cancel_everything(rt->link);
    }
}

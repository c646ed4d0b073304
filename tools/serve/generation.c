/* Generation requests on the loop thread (router.h): admission, the engine's output written out as it
 * arrives, hangups, and the drain on SIGTERM. */
#include <malloc.h>
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

/* The first token of any choice. */
static double first_token_seconds(const serve_request *lead) {
    double first = 0;
    for (int i = 0; i < lead->n_choices; i++) {
        const double t = lead->choices[i]->first_token_seconds;
        if (t > 0 && (first == 0 || t < first)) first = t;
    }
    return first;
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
        .prompt_tokens = serve_request_prompt_tokens(r),
        .generated_tokens = serve_request_generated(r),
        .ttft_seconds = first_token_seconds(r) > 0 ? first_token_seconds(r) - r->start_seconds : -1,
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

/* A burst leaves its freed memory in glibc's arenas, most of it in free chunks below a chunk still live, which
 * free() never gives back (it trims only an arena's top), so RSS would stay at the burst's peak for good.
 * malloc_trim(0) gives every wholly free page of every arena back to the system. It walks the free lists, so it
 * runs only once nothing has been in flight for this long, never under a steady load. */
#define IDLE_TRIM_SECONDS 0.2

static void arm_idle_trim(router *rt) {
    if (!rt->idle_trim || rt->in_flight != 0 || rt->draining) return;
    const struct timeval delay = {.tv_sec = 0, .tv_usec = (long)(IDLE_TRIM_SECONDS * 1e6)};
    (void)evtimer_add(rt->idle_trim, &delay); /* re-arms a pending one; a missed trim costs memory only */
}

void router_on_idle(int fd, short what, void *argument) {
    (void)fd;
    (void)what;
    router *rt = argument;
    if (rt->in_flight != 0) return;
#if defined(__GLIBC__)
    (void)malloc_trim(0); /* 1 when it gave memory back, 0 when there was none: either is fine */
#endif
}

/* The connection is free for its next request. */
static void release_connection(serve_request *r) {
    if (!r->connection) return;
    http_server_watch_hangup(r->connection, false);
    r->connection->current = NULL;
    r->connection = NULL;
}

/* The loop is done with the lead's request: no more watching, no more output; the loop's references to every
 * choice go back (the lead's last: the others point to it). */
static void finish(router *rt, serve_request *r, int status) {
    const int n = r->n_choices;
    for (int i = 0; i < n; i++) r->choices[i]->answered = true;
    release_connection(r);
    log_request(rt, r, status);
    rt->in_flight -= n;
    for (int i = n - 1; i >= 0; i--) engine_link_release(rt->link, r->choices[i]);
    if (rt->draining && rt->in_flight == 0) exit_when_flushed(rt);
    arm_idle_trim(rt);
}

/* Every choice whose end the loop has not seen is cancelled (the client left, or the response ended early). */
static void cancel_choices(router *rt, serve_request *lead) {
    for (int i = 0; i < lead->n_choices; i++) {
        serve_request *c = lead->choices[i];
        if (c->done_seen || c->cancel_sent) continue;
        c->cancel_sent = true;
        engine_link_cancel(rt->link, c);
    }
}

/* Takes a choice's new output (into the buffers, or dropped where NULL; with its logprobs for a stream that
 * reports them); true when the choice is done, which is counted on the lead once. */
static bool take_choice_output(router *rt, serve_request *c, text_buffer *text, text_buffer *reasoning,
                               text_buffer *calls, serve_logprob **logprobs, size_t *n_logprobs, bool *failed,
                               int32_t *n_new_tokens) {
    bool done;
    *failed = false;
    if (logprobs) {
        done = engine_link_take_output_logprobs(rt->link, c, text, logprobs, n_logprobs, failed, n_new_tokens);
    } else {
        done = engine_link_take_output(rt->link, c, text, reasoning, calls, n_new_tokens);
    }
    if (done && !c->done_seen) {
        c->done_seen = true;
        c->lead->n_choices_done++;
    }
    return done;
}

static bool all_choices_done(const serve_request *lead) { return lead->n_choices_done == lead->n_choices; }

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

/* The response is over (its error went out) before the engine is done with every choice: the engine is told to
 * stop the others, and deliver_nowhere finishes the request once it has; or now, when nothing runs. */
static void abandon(router *rt, serve_request *lead, int status) {
    if (lead->http && lead->reply_started) evhttp_send_reply_end(lead->http);
    lead->http = NULL;
    if (all_choices_done(lead)) {
        finish(rt, lead, status);
        return;
    }
    release_connection(lead);
    lead->client_gone = true;
    lead->final_status = status;
    cancel_choices(rt, lead);
}

/* The chunks for what arrived for choice `c` (the usage and [DONE] after the last choice's end); false when the
 * client was dropped. A completions stream sends a chunk for every step that made a token, also when its text is
 * empty (a character still incomplete, or a token with no text), as vLLM's does: clients time tokens by chunks. */
static bool send_chunks(router *rt, serve_request *c, const text_buffer *text, const text_buffer *reasoning,
                        const text_buffer *calls, const serve_logprob *logprobs, size_t n_logprobs,
                        int32_t n_new_tokens, bool done) {
    const char *name = rt->options.model_name;
    text_buffer chunk = {0};
    bool alive = true;
    if (c->endpoint == SERVE_ENDPOINT_CHAT) {
        if (text->length || reasoning->length || calls->length || done || !c->first_chunk_out) {
            chat_completions_chunk_json(&chunk, name, c, text, reasoning, calls, !c->first_chunk_out, done);
            c->first_chunk_out = true;
            alive = send_event(rt, c->lead, &chunk);
        }
    } else if (text->length || n_logprobs || n_new_tokens > 0 || done) {
        completions_chunk_json(&chunk, rt->link->model, name, c, text->data, text->length, logprobs, n_logprobs, done);
        alive = send_event(rt, c->lead, &chunk);
    }
    const bool last = done && all_choices_done(c->lead);
    if (alive && last && c->include_usage) {
        text_buffer_clear(&chunk);
        if (c->endpoint == SERVE_ENDPOINT_CHAT)
            chat_completions_usage_chunk_json(&chunk, name, c);
        else
            completions_usage_chunk_json(&chunk, name, c);
        alive = send_event(rt, c->lead, &chunk);
    }
    if (alive && last) {
        text_buffer_clear(&chunk);
        text_buffer_puts(&chunk, "[DONE]");
        alive = send_event(rt, c->lead, &chunk);
    }
    text_buffer_free(&chunk);
    return alive;
}

/* What the engine produced for one choice of a streamed request, as chunks; after the last choice's end, the end
 * of the stream. The stream's header goes out with the first output, so a request refused at submission is still
 * a plain 400. A choice that fails ends the response with the error (an event once the stream began) and cancels
 * the others. */
static void deliver_stream(router *rt, serve_request *c) {
    serve_request *lead = c->lead;
    text_buffer text = {0}, reasoning = {0}, calls = {0};
    serve_logprob *logprobs = NULL;
    size_t n_logprobs = 0;
    bool logprobs_failed = false;
    const bool with_logprobs = c->endpoint == SERVE_ENDPOINT_COMPLETIONS && c->request.n_logprobs > 0;
    int32_t n_new_tokens = 0;
    const bool done = take_choice_output(rt, c, &text, &reasoning, &calls, with_logprobs ? &logprobs : NULL,
                                         &n_logprobs, &logprobs_failed, &n_new_tokens);
    const bool cancelled = done && !c->failed && c->finish == KITE_FINISH_CANCELLED;
    int status = 0;
    const char *message = NULL;
    if (text.failed || reasoning.failed || calls.failed || logprobs_failed) {
        status = 500;
        message = "out of memory";
    } else if (done && (c->failed || cancelled)) {
        status = c->failed ? failure_status(c) : 503;
        message = c->failed ? c->error : "the server stopped before the request finished";
    }
    bool alive = true;
    if (status && c->finish == KITE_FINISH_ERROR && !text.failed) {
        /* Generation had begun: its failure is an event of the stream (as vLLM's), after the text made before the
         * row that allowed no token. */
        if (!lead->reply_started) start_stream(lead);
        alive = send_chunks(rt, c, &text, &reasoning, &calls, logprobs, n_logprobs, n_new_tokens, false);
    }
    if (status && !alive) {
        abandon(rt, lead, 499);
    } else if (status) {
        if (lead->reply_started) {
            send_error_event(rt, lead, status, message); /* the stream has begun: the error is an event */
        } else {
            api_error_send(lead->http, status, message, NULL, c->failed || status == 500 ? 0 : RETRY_AFTER_SECONDS);
            lead->http = NULL;
        }
        abandon(rt, lead, status);
    } else {
        if (!lead->reply_started) start_stream(lead);
        alive = send_chunks(rt, c, &text, &reasoning, &calls, logprobs, n_logprobs, n_new_tokens, done);
        /* A client dropped for not reading was cancelled by the hangup handler; deliver_nowhere takes the rest. */
        if (all_choices_done(lead)) end_stream(rt, lead, alive ? 200 : 499);
    }
    free(logprobs);
    text_buffer_free(&text);
    text_buffer_free(&reasoning);
    text_buffer_free(&calls);
}

/* The whole response once every choice is done; a choice that fails answers the request with its error and
 * cancels the others. */
static void deliver_whole(router *rt, serve_request *c) {
    serve_request *lead = c->lead;
    bool unused;
    if (!take_choice_output(rt, c, &c->whole_text, &c->whole_reasoning, &c->whole_calls, NULL, NULL, &unused, NULL)) return;
    int status = 200;
    if (c->failed) {
        status = failure_status(c);
        api_error_send(lead->http, status, c->error, NULL, 0);
    } else if (c->finish == KITE_FINISH_CANCELLED) {
        status = 503;
        api_error_send(lead->http, status, "the server stopped before the request finished", NULL,
                       RETRY_AFTER_SECONDS);
    } else if (c->whole_text.failed || c->whole_reasoning.failed || c->whole_calls.failed) {
        status = 500;
        api_error_send(lead->http, status, "out of memory", NULL, 0);
    } else if (!all_choices_done(lead)) {
        return;
    } else {
        text_buffer b = {0};
        if (lead->endpoint == SERVE_ENDPOINT_CHAT)
            chat_completions_whole_json(&b, rt->options.model_name, lead);
        else
            completions_whole_json(&b, rt->link->model, rt->options.model_name, lead);
        send_body(lead->http, status, &b);
        text_buffer_free(&b);
    }
    lead->http = NULL;
    if (status == 200)
        finish(rt, lead, status);
    else
        abandon(rt, lead, status);
}

/* A request whose client is gone (or whose response ended early): its output is dropped; once the engine is done
 * with every choice, a request evhttp detached from its connection is freed (by the reply it no longer sends
 * anywhere). */
static void deliver_nowhere(router *rt, serve_request *c) {
    serve_request *r = c->lead;
    bool unused;
    if (!take_choice_output(rt, c, NULL, NULL, NULL, NULL, NULL, &unused, NULL) || !all_choices_done(r)) return;
    if (r->http) {
        if (r->reply_started)
            evhttp_send_reply_end(r->http);
        else
            evhttp_send_reply(r->http, 500, "Client Gone", NULL);
        r->http = NULL;
    }
    finish(rt, r, r->final_status ? r->final_status : 499); /* 499: nginx's "client closed request" */
}

/* echo with max_tokens 0: every choice is the prompt alone, finished for its length, without the engine. */
static void answer_prompt_alone(router *rt, serve_request *lead) {
    for (int i = 0; i < lead->n_choices; i++) {
        serve_request *c = lead->choices[i];
        c->finish = KITE_FINISH_LENGTH;
        c->done = c->done_seen = true;
        lead->n_choices_done++;
    }
    if (lead->stream) {
        const text_buffer none = {0};
        start_stream(lead);
        bool alive = true;
        for (int i = 0; i < lead->n_choices && alive; i++)
            alive = send_chunks(rt, lead->choices[i], &none, &none, &none, NULL, 0, 0, true);
        end_stream(rt, lead, alive ? 200 : 499);
        return;
    }
    text_buffer b = {0};
    completions_whole_json(&b, rt->link->model, rt->options.model_name, lead);
    send_body(lead->http, 200, &b);
    text_buffer_free(&b);
    lead->http = NULL;
    finish(rt, lead, 200);
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
        if (r->answered || r->done_seen) {
            /* nothing more to write */
        } else if (r->lead->client_gone) {
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
    cancel_choices(rt, r);
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
    /* Each choice is a request of the engine's: n of them count against the bound. */
    const int bound = rt->link->engine_params.max_sequences + rt->options.max_queue;
    if (rt->in_flight + r->n_choices > bound) {
        if (r->n_choices > bound)
            router_send_error(rt, request, 400, "'n' is more than this server ever admits at once (--max-batch plus "
                              "--max-queue)", "n", 0);
        else
            router_send_error(rt, request, 503, "the server is busy: too many requests are waiting", NULL,
                              RETRY_AFTER_SECONDS);
        serve_request_discard(r);
        return;
    }
    r->number = ++rt->next_number;
    for (int i = 1; i < r->n_choices; i++) r->choices[i]->number = r->number;
    r->http = request;
    r->connection = c;
    c->current = r;
    rt->in_flight += r->n_choices;
    if (r->endpoint == SERVE_ENDPOINT_COMPLETIONS && completions_prompt_alone(r)) {
        answer_prompt_alone(rt, r);
        return;
    }
    http_server_watch_hangup(c, true);
    for (int i = 0; i < r->n_choices; i++) engine_link_submit(rt->link, r->choices[i]);
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

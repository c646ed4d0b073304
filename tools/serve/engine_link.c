/* The engine thread and its lists (engine_link.h). */
#include "serve/engine_link.h"

#include "cli_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Puts a request on the outbox unless it is there already; the outbox holds a reference. Under the mutex. */
static void outbox_push_locked(engine_link *link, serve_request *r) {
    if (r->on_outbox) return;
    r->on_outbox = true;
    r->references++;
    r->next_out = NULL;
    if (link->outbox_tail)
        link->outbox_tail->next_out = r;
    else
        link->outbox_head = r;
    link->outbox_tail = r;
}

static void live_remove(engine_link *link, serve_request *r) {
    if (r->prev_live)
        r->prev_live->next_live = r->next_live;
    else if (link->live == r)
        link->live = r->next_live;
    if (r->next_live) r->next_live->prev_live = r->prev_live;
    r->next_live = r->prev_live = NULL;
}

/* The request reached the engine, or ended before it did. Under the mutex. */
static void leave_waiting_locked(engine_link *link, serve_request *r) {
    if (!r->counted_waiting) return;
    r->counted_waiting = false;
    link->n_before_engine--;
}

/* The request's last event: done, off the live list, the engine's reference given back (the outbox keeps
 * one, so the request lives on). Under the mutex, on the engine thread. */
static void finish_locked(engine_link *link, serve_request *r, kite_finish_reason finish) {
    r->finish = finish;
    r->done = true;
    r->prompt_read = true;
    leave_waiting_locked(link, r);
    live_remove(link, r);
    outbox_push_locked(link, r);
    r->references--;
}

static void note_token_locked(serve_request *r, int32_t token) {
    if (token < 0) return;
    r->prompt_read = true;
    if (r->n_generated++ == 0) r->first_token_seconds = serve_now_seconds();
}

static void mark_out_of_memory_locked(serve_request *r) {
    if (r->failed || !(r->text.failed || r->reasoning.failed || r->calls.failed)) return;
    r->failed = true;
    r->failed_status = KITE_ERROR_OUT_OF_MEMORY;
    snprintf(r->error, sizeof r->error, "out of memory collecting the output");
}

/* A request the engine ended with KITE_FINISH_ERROR (its logits allowed no token): failed with the library's
 * message; the text before it is kept, for a stream to send before its error event. */
static void note_error_locked(serve_request *r, const kite_token_event *event) {
    if (!event || event->finish != KITE_FINISH_ERROR || r->failed) return;
    r->failed = true;
    r->failed_status = KITE_ERROR_INVALID_INPUT;
    snprintf(r->error, sizeof r->error, "generation failed: %s", event->error ? event->error : "no token can be chosen");
}

/* The token's log-probabilities, kept for a response that reports them. */
static void keep_logprob_locked(serve_request *r, const kite_token_event *event) {
    if (r->request.n_logprobs <= 0 || event->token < 0 || r->failed) return;
    if (r->n_logprobs_kept == r->logprobs_capacity) {
        const size_t capacity = r->logprobs_capacity ? 2 * r->logprobs_capacity : 64;
        serve_logprob *grown = realloc(r->logprobs, capacity * sizeof *grown);
        if (!grown) {
            r->failed = true;
            r->failed_status = KITE_ERROR_OUT_OF_MEMORY;
            snprintf(r->error, sizeof r->error, "out of memory collecting the logprobs");
            return;
        }
        r->logprobs = grown;
        r->logprobs_capacity = capacity;
    }
    serve_logprob *lp = &r->logprobs[r->n_logprobs_kept++];
    lp->token = event->token;
    lp->logprob = event->logprob;
    lp->n_top = event->n_top < KITE_MAX_LOGPROBS ? event->n_top : KITE_MAX_LOGPROBS;
    for (int32_t i = 0; i < lp->n_top; i++) {
        lp->top_ids[i] = event->top_ids[i];
        lp->top_logprobs[i] = event->top_logprobs[i];
    }
}

static void on_token(const kite_token_event *event, void *user_data) {
    serve_request *r = user_data;
    engine_link *link = r->link;
    pthread_mutex_lock(&link->mutex);
    if (event->text_length > 0 && !r->failed) text_buffer_append(&r->text, event->text, event->text_length);
    mark_out_of_memory_locked(r);
    keep_logprob_locked(r, event);
    note_token_locked(r, event->token);
    note_error_locked(r, event);
    if (event->finish != KITE_FINISH_NONE)
        finish_locked(link, r, event->finish);
    else
        outbox_push_locked(link, r);
    pthread_mutex_unlock(&link->mutex);
}

/* A chat answer's parsed pieces. A tool call is written here as the JSON object OpenAI's tool_calls hold,
 * because its strings are valid only during the callback. */
static void on_chat_event(const kite_chat_event *event, void *user_data) {
    serve_request *r = user_data;
    engine_link *link = r->link;
    const kite_chat_delta *d = &event->delta;
    pthread_mutex_lock(&link->mutex);
    if (!r->failed) {
        text_buffer_append(&r->text, d->content, d->content_length);
        text_buffer_append(&r->reasoning, d->reasoning, d->reasoning_length);
        for (size_t i = 0; i < d->n_tool_calls; i++) {
            const kite_tool_call *c = &d->tool_calls[i];
            text_buffer_printf(&r->calls, "{\"index\":%d,\"id\":", r->n_calls++);
            text_buffer_json_string(&r->calls, c->id, strlen(c->id));
            text_buffer_puts(&r->calls, ",\"type\":\"function\",\"function\":{\"name\":");
            text_buffer_json_string(&r->calls, c->name, strlen(c->name));
            text_buffer_puts(&r->calls, ",\"arguments\":");
            text_buffer_json_string(&r->calls, c->arguments, strlen(c->arguments));
            text_buffer_puts(&r->calls, "}}\n");
        }
    }
    mark_out_of_memory_locked(r);
    if (event->token) {
        keep_logprob_locked(r, event->token);
        note_token_locked(r, event->token->token);
        r->n_inserted += event->token->n_inserted;
    }
    note_error_locked(r, event->token);
    if (event->finish != KITE_FINISH_NONE)
        finish_locked(link, r, event->finish);
    else
        outbox_push_locked(link, r);
    pthread_mutex_unlock(&link->mutex);
}

/* A request the engine refused or can no longer run: failed and done, with the library's message. */
static void fail_locked(engine_link *link, serve_request *r, kite_status status, const char *message) {
    r->failed = true;
    r->failed_status = status;
    snprintf(r->error, sizeof r->error, "%s", message);
    finish_locked(link, r, KITE_FINISH_NONE);
}

static void submit_one(engine_link *link, serve_request *r) {
    /* On the live list before the submission: the library may end the request inside the call (its final event
     * takes it off again). */
    pthread_mutex_lock(&link->mutex);
    leave_waiting_locked(link, r);
    r->next_live = link->live;
    r->prev_live = NULL;
    if (link->live) link->live->prev_live = r;
    link->live = r;
    pthread_mutex_unlock(&link->mutex);
    kite_request_id id = 0;
    kite_status status;
    if (r->endpoint == SERVE_ENDPOINT_CHAT) {
        status = kite_chat_submit(link->engine, kite_model_chat(link->model), &r->lead->prompt, &r->request,
                                  on_chat_event, r, &id);
    } else {
        r->request.on_token = on_token;
        r->request.user_data = r;
        status = kite_engine_submit(link->engine, &r->request, &id);
    }
    pthread_mutex_lock(&link->mutex);
    if (status == KITE_OK) {
        r->id = id;
        r->submitted = true;
    } else if (!r->done) {
        fail_locked(link, r, status, kite_last_error());
    }
    pthread_mutex_unlock(&link->mutex);
}

/* Takes the first held choice off the held list; NULL when there is none. The engine thread's. */
static serve_request *held_pop(engine_link *link) {
    serve_request *r = link->held;
    if (r) {
        link->held = r->next_held;
        r->next_held = NULL;
        r->held = false;
    }
    return r;
}

/* A held choice ends without reaching the engine (its client left, or the drain cancels it). */
static void end_held(engine_link *link, serve_request *r, kite_finish_reason finish) {
    serve_request **at = &link->held;
    while (*at && *at != r) at = &(*at)->next_held;
    if (*at) *at = r->next_held;
    r->next_held = NULL;
    r->held = false;
    pthread_mutex_lock(&link->mutex);
    finish_locked(link, r, finish);
    pthread_mutex_unlock(&link->mutex);
}

/* A choice after the first waits while the prefix cache is on, its prompt has a full block to share (the cache
 * keeps full blocks, and a prompt always computes its last token), and its lead's prompt is still being computed. */
static bool should_hold(engine_link *link, serve_request *r) {
    if (r->choice == 0) return false;
    pthread_mutex_lock(&link->mutex);
    const bool hold = link->stats.prefix_cache && r->n_prompt > (size_t)link->stats.kv_block_size &&
                      !r->lead->prompt_read;
    pthread_mutex_unlock(&link->mutex);
    return hold;
}

static void hold(engine_link *link, serve_request *r) {
    r->held = true;
    r->next_held = link->held;
    link->held = r;
}

/* Submits the held choices whose lead's prompt is now in the cache (or whose lead ended). */
static void release_held(engine_link *link) {
    serve_request *still = NULL;
    for (serve_request *r = held_pop(link); r; r = held_pop(link)) {
        if (should_hold(link, r)) {
            r->held = true;
            r->next_held = still;
            still = r;
        } else {
            submit_one(link, r);
        }
    }
    link->held = still;
}

/* After a failed step the engine's state is unknown: every request still running ends with the failure and
 * the engine is not stepped again. */
static void fail_everything(engine_link *link, const char *message) {
    pthread_mutex_lock(&link->mutex);
    link->state = ENGINE_LINK_FAILED;
    snprintf(link->error, sizeof link->error, "engine step failed: %s", message);
    while (link->live) fail_locked(link, link->live, KITE_ERROR_BACKEND, link->error);
    for (serve_request *r = held_pop(link); r; r = held_pop(link))
        fail_locked(link, r, KITE_ERROR_BACKEND, link->error);
    pthread_mutex_unlock(&link->mutex);
}

static void wake_loop_if_needed(engine_link *link) {
    pthread_mutex_lock(&link->mutex);
    const bool wake = link->outbox_head && !link->wake_pending;
    if (wake) link->wake_pending = true;
    pthread_mutex_unlock(&link->mutex);
    if (wake) link->wake(link->wake_argument);
}

bool engine_link_load(engine_link *link) {
    cli_load_report load_report;
    cli_load_report_attach(&load_report, &link->load);
    kite_status status = kite_model_load(link->model_dir, &link->load, &link->model);
    link->load.on_load_event = NULL; /* load_report ends here */
    const char *what = "load";
    if (status == KITE_OK) {
        what = "engine";
        status = kite_engine_create(link->model, &link->engine_params, &link->engine);
    }
    if (status == KITE_OK) cli_load_report_finish(&load_report);
    pthread_mutex_lock(&link->mutex);
    if (status == KITE_OK) {
        link->state = ENGINE_LINK_READY;
        link->stats = kite_engine_get_stats(link->engine);
    } else {
        link->state = ENGINE_LINK_FAILED;
        snprintf(link->error, sizeof link->error, "%s: %s", what, kite_last_error());
    }
    pthread_mutex_unlock(&link->mutex);
    link->wake(link->wake_argument);
    return status == KITE_OK;
}

/* Cancels every live request (each one's last event comes inside kite_engine_cancel) and every held one. */
static void cancel_live(engine_link *link) {
    while (link->held) end_held(link, link->held, KITE_FINISH_CANCELLED);
    for (;;) {
        pthread_mutex_lock(&link->mutex);
        serve_request *first = link->live;
        const kite_request_id id = first ? first->id : 0;
        pthread_mutex_unlock(&link->mutex);
        if (!first) return;
        if (kite_engine_cancel(link->engine, id) != KITE_OK) {
            fail_everything(link, kite_last_error());
            return;
        }
        pthread_mutex_lock(&link->mutex);
        if (link->live == first) fail_locked(link, first, KITE_ERROR_BACKEND, "the engine lost the request");
        pthread_mutex_unlock(&link->mutex);
    }
}

bool engine_link_work(engine_link *link, bool wait) {
    pthread_mutex_lock(&link->mutex);
    while (wait && !link->quit && !link->inbox_head && !link->cancels && !link->cancel_everything &&
           (link->state != ENGINE_LINK_READY || kite_engine_idle(link->engine)))
        pthread_cond_wait(&link->changed, &link->mutex);
    serve_request *arrived = link->inbox_head, *cancels = link->cancels;
    link->inbox_head = link->inbox_tail = NULL;
    link->cancels = NULL;
    const bool cancel_everything = link->cancel_everything || link->quit, quit = link->quit;
    const bool usable = link->state == ENGINE_LINK_READY;
    link->cancel_everything = false;
    pthread_mutex_unlock(&link->mutex);

    for (serve_request *r = arrived, *next; r; r = next) {
        next = r->next_in;
        if (usable && should_hold(link, r)) {
            hold(link, r);
        } else if (usable) {
            submit_one(link, r);
        } else {
            pthread_mutex_lock(&link->mutex);
            fail_locked(link, r, KITE_ERROR_BACKEND, link->error);
            pthread_mutex_unlock(&link->mutex);
        }
    }
    for (serve_request *r = cancels, *next; r; r = next) {
        next = r->next_cancel;
        if (r->held) end_held(link, r, KITE_FINISH_CANCELLED);
        pthread_mutex_lock(&link->mutex);
        const kite_request_id id = r->done || !r->submitted ? 0 : r->id;
        pthread_mutex_unlock(&link->mutex);
        /* The cancelled request's last event comes inside this call; it gives back the engine's hold. */
        if (id && usable) (void)kite_engine_cancel(link->engine, id);
        engine_link_release(link, r); /* the cancel list's hold */
    }
    if (cancel_everything && usable) cancel_live(link);
    if (usable && !kite_engine_idle(link->engine) && kite_engine_step(link->engine) != KITE_OK) {
        fprintf(stderr, "kite serve: engine step failed: %s\n", kite_last_error());
        fail_everything(link, kite_last_error());
    }
    if (usable && link->state == ENGINE_LINK_READY) release_held(link);
    if (usable) {
        const kite_engine_stats stats = kite_engine_get_stats(link->engine);
        const kite_engine_timings timings = kite_engine_get_timings(link->engine);
        pthread_mutex_lock(&link->mutex);
        link->stats = stats;
        link->timings = timings;
        pthread_mutex_unlock(&link->mutex);
    }
    wake_loop_if_needed(link);
    return !quit;
}

static void *engine_thread(void *argument) {
    engine_link *link = argument;
    if (!engine_link_load(link)) return NULL;
    while (engine_link_work(link, true)) {
    }
    return NULL;
}

bool engine_link_init(engine_link *link) {
    if (pthread_mutex_init(&link->mutex, NULL) != 0) {
        fprintf(stderr, "kite serve: cannot create the engine thread's lock\n");
        return false;
    }
    if (pthread_cond_init(&link->changed, NULL) != 0) {
        pthread_mutex_destroy(&link->mutex);
        fprintf(stderr, "kite serve: cannot create the engine thread's condition variable\n");
        return false;
    }
    link->state = ENGINE_LINK_LOADING;
    link->initialized = true;
    return true;
}

bool engine_link_start(engine_link *link) {
    if (!engine_link_init(link)) return false;
    if (pthread_create(&link->thread, NULL, engine_thread, link) != 0) {
        fprintf(stderr, "kite serve: cannot start the engine thread\n");
        return false;
    }
    link->started = true;
    return true;
}

void engine_link_stop(engine_link *link) {
    if (!link->initialized) return;
    pthread_mutex_lock(&link->mutex);
    link->quit = true;
    pthread_cond_signal(&link->changed);
    pthread_mutex_unlock(&link->mutex);
    if (link->started)
        pthread_join(link->thread, NULL);
    else if (link->state == ENGINE_LINK_READY)
        (void)engine_link_work(link, false); /* no thread: this cancels what is left */
    link->started = false;
    kite_engine_free(link->engine);
    link->engine = NULL;
    kite_model_free(link->model);
    link->model = NULL;
    pthread_cond_destroy(&link->changed);
    pthread_mutex_destroy(&link->mutex);
    link->initialized = false;
}

engine_link_state engine_link_get_state(engine_link *link, char *error, size_t error_size) {
    pthread_mutex_lock(&link->mutex);
    const engine_link_state state = link->state;
    if (error && error_size) snprintf(error, error_size, "%s", link->error);
    pthread_mutex_unlock(&link->mutex);
    return state;
}

kite_engine_stats engine_link_get_stats(engine_link *link) {
    pthread_mutex_lock(&link->mutex);
    kite_engine_stats stats = link->stats;
    stats.waiting += link->n_before_engine;
    pthread_mutex_unlock(&link->mutex);
    return stats;
}

void engine_link_submit(engine_link *link, serve_request *r) {
    pthread_mutex_lock(&link->mutex);
    r->link = link;
    r->references++; /* the engine's, given back with the request's last event */
    r->counted_waiting = true;
    link->n_before_engine++;
    r->next_in = NULL;
    if (link->inbox_tail)
        link->inbox_tail->next_in = r;
    else
        link->inbox_head = r;
    link->inbox_tail = r;
    pthread_cond_signal(&link->changed);
    pthread_mutex_unlock(&link->mutex);
}

void engine_link_cancel(engine_link *link, serve_request *r) {
    pthread_mutex_lock(&link->mutex);
    r->references++; /* the cancel list's, until the engine thread has seen it */
    r->next_cancel = link->cancels;
    link->cancels = r;
    pthread_cond_signal(&link->changed);
    pthread_mutex_unlock(&link->mutex);
}

void engine_link_cancel_everything(engine_link *link) {
    pthread_mutex_lock(&link->mutex);
    link->cancel_everything = true;
    pthread_cond_signal(&link->changed);
    pthread_mutex_unlock(&link->mutex);
}

serve_request *engine_link_take_outbox(engine_link *link) {
    pthread_mutex_lock(&link->mutex);
    serve_request *list = link->outbox_head;
    link->outbox_head = link->outbox_tail = NULL;
    link->wake_pending = false;
    pthread_mutex_unlock(&link->mutex);
    return list;
}

serve_request *engine_link_outbox_next(engine_link *link, serve_request *r) {
    pthread_mutex_lock(&link->mutex);
    serve_request *next = r->next_out;
    r->on_outbox = false;
    pthread_mutex_unlock(&link->mutex);
    return next;
}

static void take_new(const text_buffer *from, size_t *taken, text_buffer *to) {
    if (to && from->length > *taken) text_buffer_append(to, from->data + *taken, from->length - *taken);
    *taken = from->length;
}

/* A streamed request's new logprobs, copied for the loop thread (the engine thread may grow `logprobs` after
 * the lock is let go); false when out of memory. Under the mutex. */
static bool take_new_logprobs_locked(serve_request *r) {
    const size_t n = r->n_logprobs_kept - r->logprobs_taken;
    if (n == 0) return true;
    if (r->n_stream_logprobs + n > r->stream_logprobs_capacity) {
        const size_t capacity = 2 * (r->n_stream_logprobs + n);
        serve_logprob *grown = realloc(r->stream_logprobs, capacity * sizeof *grown);
        if (!grown) return false;
        r->stream_logprobs = grown;
        r->stream_logprobs_capacity = capacity;
    }
    memcpy(r->stream_logprobs + r->n_stream_logprobs, r->logprobs + r->logprobs_taken, n * sizeof *r->logprobs);
    r->n_stream_logprobs += n;
    r->logprobs_taken = r->n_logprobs_kept;
    return true;
}

/* The tokens generated since the last take (under the mutex). */
static int32_t take_new_tokens_locked(serve_request *r) {
    const int32_t n = r->n_generated - r->generated_taken;
    r->generated_taken = r->n_generated;
    return n;
}

bool engine_link_take_output(engine_link *link, serve_request *r, text_buffer *text, text_buffer *reasoning,
                             text_buffer *calls, int32_t *n_new_tokens) {
    pthread_mutex_lock(&link->mutex);
    const int32_t n_new = take_new_tokens_locked(r);
    if (n_new_tokens) *n_new_tokens = n_new;
    /* Logprobs that cannot be copied mark the text incomplete: the caller answers out of memory, as for text. */
    if (r->stream && text && !take_new_logprobs_locked(r)) text->failed = true;
    take_new(&r->text, &r->text_taken, text);
    take_new(&r->reasoning, &r->reasoning_taken, reasoning);
    take_new(&r->calls, &r->calls_taken, calls);
    const bool done = r->done;
    pthread_mutex_unlock(&link->mutex);
    return done;
}

bool engine_link_take_output_logprobs(engine_link *link, serve_request *r, text_buffer *text,
                                      serve_logprob **logprobs, size_t *n_logprobs, bool *logprobs_failed,
                                      int32_t *n_new_tokens) {
    *logprobs = NULL;
    *n_logprobs = 0;
    *logprobs_failed = false;
    pthread_mutex_lock(&link->mutex);
    const int32_t n_new = take_new_tokens_locked(r);
    if (n_new_tokens) *n_new_tokens = n_new;
    take_new(&r->text, &r->text_taken, text);
    const size_t n = r->n_logprobs_kept - r->logprobs_taken;
    if (n > 0) {
        *logprobs = malloc(n * sizeof **logprobs);
        if (*logprobs) {
            memcpy(*logprobs, r->logprobs + r->logprobs_taken, n * sizeof **logprobs);
            *n_logprobs = n;
            r->logprobs_taken = r->n_logprobs_kept;
        } else {
            *logprobs_failed = true;
        }
    }
    const bool done = r->done;
    pthread_mutex_unlock(&link->mutex);
    return done;
}

void engine_link_release(engine_link *link, serve_request *r) {
    pthread_mutex_lock(&link->mutex);
    const int left = --r->references;
    pthread_mutex_unlock(&link->mutex);
    if (left == 0) serve_request_free(r);
}

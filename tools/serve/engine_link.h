/* The hand-over between `kite serve`'s HTTP loop thread and its engine thread.
 *
 * The engine thread loads the model, owns the kite_engine (an engine is used by one thread) and runs
 * continuous batching over every submitted request; it never touches a socket. The loop thread submits and
 * cancels requests through two lists under one mutex, and the engine thread puts each request that produced
 * output, or ended, on an outbox and wakes the loop through `wake` (an event the loop waits on) once per step.
 */
#ifndef KITE_TOOLS_SERVE_ENGINE_LINK_H
#define KITE_TOOLS_SERVE_ENGINE_LINK_H

#include <pthread.h>
#include <stdbool.h>

#include "kite.h"
#include "serve/serve_request.h"

typedef enum engine_link_state {
    ENGINE_LINK_LOADING = 0,
    ENGINE_LINK_READY,
    ENGINE_LINK_FAILED, /* the load or a step failed: `error` says why */
} engine_link_state;

typedef struct engine_link {
    /* Set before engine_link_start. */
    const char *model_dir;
    kite_load_params load;
    kite_engine_params engine_params;
    void (*wake)(void *wake_argument); /* called on the engine thread; must only wake the loop */
    void *wake_argument;

    /* Set by the engine thread before it reports ENGINE_LINK_READY; the model is read-only afterwards and its
     * tokenizer and chat format may be used by the loop thread (kite.h's thread-safety notes). */
    kite_model *model;
    kite_engine *engine;

    pthread_t thread;
    bool initialized;
    bool started;
    pthread_mutex_t mutex; /* guards everything below and every request's engine output */
    pthread_cond_t changed;
    engine_link_state state;
    char error[512];
    serve_request *inbox_head, *inbox_tail;
    serve_request *cancels;
    serve_request *outbox_head, *outbox_tail;
    bool wake_pending;
    bool cancel_everything; /* the drain timed out: cancel what runs */
    bool quit;
    kite_engine_stats stats; /* the engine's, refreshed after every step */
    kite_engine_timings timings; /* the engine's, refreshed with stats */
    int n_before_engine;     /* requests handed to the link and not yet to the engine: in the inbox, or held */

    serve_request *live; /* the engine thread's: submitted and not finished */
    /* The engine thread's: choices 1..n-1 waiting for their lead's prompt to be computed, so that their prefill
     * takes its full KV blocks from the prefix cache instead of computing the same prompt n times. */
    serve_request *held;
} engine_link;

/* Starts the engine thread, which loads the model and then works until engine_link_stop. false (with a line
 * on stderr) when no thread starts. */
bool engine_link_start(engine_link *link);
/* Asks the engine thread to cancel what is left and leave, then joins it and frees the engine and model. */
void engine_link_stop(engine_link *link);

/* The engine thread's parts, for a caller that runs the engine on its own thread (fuzz/fuzz_http_request.c):
 * init the lock, load (ENGINE_LINK_READY or _FAILED, then `wake`), and one round of work: submit what
 * arrived, cancel what was asked, one engine step, wake the loop if the outbox has anything. With `wait`, a
 * round first sleeps until there is something to do. false once engine_link_stop asked it to leave. */
bool engine_link_init(engine_link *link);
bool engine_link_load(engine_link *link);
bool engine_link_work(engine_link *link, bool wait);

engine_link_state engine_link_get_state(engine_link *link, char *error, size_t error_size);
/* The engine's stats, with `waiting` counting the requests not yet handed to the engine as well (a held choice
 * waits for a place in the batch as much as a queued one). */
kite_engine_stats engine_link_get_stats(engine_link *link);

/* Hands a request to the engine thread (it takes a reference). Choices after the first are submitted to the
 * engine once their lead has its first token (or ended), when the prefix cache is on. */
void engine_link_submit(engine_link *link, serve_request *r);
/* Asks the engine thread to cancel a submitted request; its last event comes through the outbox. */
void engine_link_cancel(engine_link *link, serve_request *r);
/* Cancels every running and waiting request (the drain's deadline). */
void engine_link_cancel_everything(engine_link *link);

/* The requests the engine put on the outbox since the last call, the first of a list walked with
 * engine_link_outbox_next; each holds an outbox reference the caller gives back with engine_link_release. */
serve_request *engine_link_take_outbox(engine_link *link);
/* Takes `r` off the outbox (output arriving from now on puts it back on) and returns the next one. Call it
 * before taking r's output, so that nothing the engine adds is missed. */
serve_request *engine_link_outbox_next(engine_link *link, serve_request *r);
/* Appends what the engine produced since the last call to the three buffers (any may be NULL to drop it), sets
 * *n_new_tokens (when not NULL) to the tokens generated since the last call, and returns whether the request is
 * done. A streamed chat request's new logprobs go to r->stream_logprobs (with `text` given; text->failed when
 * they cannot). engine_link_take_output_logprobs takes the text alone and, with
 * it under one lock, the logprobs kept since the last call (a malloc'd copy in *logprobs, *n_logprobs of them;
 * NULL when none, and *logprobs_failed when out of memory): the completions stream's. */
bool engine_link_take_output(engine_link *link, serve_request *r, text_buffer *text, text_buffer *reasoning,
                             text_buffer *calls, int32_t *n_new_tokens);
bool engine_link_take_output_logprobs(engine_link *link, serve_request *r, text_buffer *text,
                                      serve_logprob **logprobs, size_t *n_logprobs, bool *logprobs_failed,
                                      int32_t *n_new_tokens);
/* Gives back one reference; the last one frees the request. */
void engine_link_release(engine_link *link, serve_request *r);

#endif

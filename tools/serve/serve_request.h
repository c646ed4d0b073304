/* One generation request of `kite serve`, shared by the HTTP loop thread and the engine thread.
 *
 * The loop thread builds it (parsing and tokenizing happen there), hands it to the engine thread
 * (engine_link.h), and writes out what the engine produced. The fields are grouped by who touches them: the
 * engine's output is written under the link's mutex and taken by the loop under the same mutex; the rest is
 * owned by one thread. A request is freed when its last holder (the loop, the engine, the outbox) lets go.
 */
#ifndef KITE_TOOLS_SERVE_REQUEST_H
#define KITE_TOOLS_SERVE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kite.h"
#include "text_buffer.h"

#define SERVE_MAX_STOP_STRINGS 8
#define SERVE_MAX_CHOICES 16 /* the most choices ("n") one request may ask for */

struct evhttp_request;
struct serve_connection;
struct engine_link;

typedef enum serve_endpoint { SERVE_ENDPOINT_COMPLETIONS, SERVE_ENDPOINT_CHAT } serve_endpoint;

/* One generated token's log-probabilities (raw: before penalties and temperature, as vLLM's default). */
typedef struct serve_logprob {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_ids[KITE_MAX_LOGPROBS];
    float top_logprobs[KITE_MAX_LOGPROBS];
} serve_logprob;

/* An HTTP request asking for n choices is n serve_requests, one engine request each: the lead (choice 0) owns
 * the HTTP exchange, the prompt, stop strings and logit bias (the others' kite_request points into the lead's
 * copies, which the engine copies at submit) and lives until every choice is done; each choice has its own output.
 * Fields marked "the lead's" are used on the lead only. */
typedef struct serve_request {
    /* Built by the loop thread before the hand-over; read-only afterwards. */
    serve_endpoint endpoint;
    kite_request request; /* prompt ids and stop strings point into the lead's own copies */
    int choice;           /* the index of this choice, 0..n_choices-1 */
    int n_choices;        /* n */
    struct serve_request *lead;
    struct serve_request *choices[SERVE_MAX_CHOICES]; /* the lead's: every choice, the lead first */
    char *echo_text;      /* the lead's: echo's prompt text, put before each choice's text (NULL: no echo) */
    size_t echo_length;
    int32_t *prompt_ids;
    size_t n_prompt;
    char *stop_storage[SERVE_MAX_STOP_STRINGS];
    kite_logit_bias logit_bias[KITE_MAX_LOGIT_BIAS];
    kite_chat_prompt prompt; /* chat only: the rendered prompt, submitted through kite_chat_submit */
    const kite_tokenizer *tokenizer; /* chat only: the model's, for the logprobs' token texts */
    bool chat_logprobs;              /* chat's "logprobs": true (request.n_logprobs is then at least 1) */
    int32_t chat_top_logprobs;       /* chat's "top_logprobs": the alternatives shown per token */
    bool stream;
    bool include_usage; /* stream_options.include_usage: a last chunk with the usage */
    long number;        /* the response's id: cmpl-N / chatcmpl-N */
    double start_seconds;

    /* The engine's output, under the link's mutex. */
    text_buffer text; /* completions' text, chat's content */
    text_buffer reasoning;
    text_buffer calls; /* completed tool calls, each a JSON object followed by '\n' */
    int n_calls;
    int32_t n_generated;
    int32_t n_inserted; /* chat: the tokens of a forced call's opening the engine inserted after the reasoning */
    serve_logprob *logprobs; /* one per generated token when the request asks for logprobs */
    size_t n_logprobs_kept, logprobs_capacity;
    kite_finish_reason finish;
    bool done;                /* the engine will not touch the request again */
    bool failed;              /* refused or failed in the engine: `error` says why */
    kite_status failed_status;
    char error[512];
    double first_token_seconds; /* 0 until the first token */
    bool prompt_read;           /* a token came, or the request ended: its prompt's blocks are in the prefix cache */
    bool on_outbox;             /* queued for the loop thread */
    struct serve_request *next_out;
    int references; /* the loop, the engine and the outbox each hold one while they keep it */

    /* The engine thread's. */
    struct engine_link *link; /* the callbacks' way back to the mutex and the outbox */
    kite_request_id id;
    bool submitted;
    struct serve_request *next_in; /* inbox link */
    struct serve_request *next_cancel;
    struct serve_request *next_live, *prev_live; /* submitted and not finished */
    struct serve_request *next_held;             /* engine_link's held list */
    bool held;                                   /* on it */
    bool counted_waiting; /* in engine_link's n_before_engine: handed to the link, not yet to the engine */

    /* The loop thread's. */
    struct evhttp_request *http;   /* NULL once the connection freed it */
    struct serve_connection *connection;
    size_t text_taken, reasoning_taken, calls_taken;
    int32_t generated_taken; /* of n_generated: a stream sends a chunk for each step that made a token */
    size_t logprobs_taken; /* of `logprobs`, those taken for a stream (chat: into stream_logprobs) */
    serve_logprob *stream_logprobs; /* a stream's logprobs not yet sent in a chunk */
    size_t n_stream_logprobs, stream_logprobs_capacity;
    bool reply_started;   /* the stream's header is out */
    bool client_gone;     /* the connection closed (or was dropped) before the response ended */
    bool cancel_sent;
    int final_status;     /* the status logged for a response that ended early (0: 499, the client left) */
    bool answered;        /* the loop has finished with it (the outbox may still hand it over once more) */
    bool first_chunk_out; /* chat: the role went out; completions: the echo went out */
    bool done_seen;       /* the loop took this choice's last output */
    int n_choices_done;   /* the lead's: choices whose last output the loop took */
    size_t text_offset;    /* streamed logprobs: the characters of the tokens already sent (text_offset goes on) */
    text_buffer whole_text, whole_reasoning, whole_calls; /* a response that is not streamed, collected */
} serve_request;

/* A zeroed request with kite_request_default() and one reference (the loop's); NULL when out of memory. */
serve_request *serve_request_new(serve_endpoint endpoint);
/* Frees what the request owns and the request itself (no locking: the caller holds the last reference). */
void serve_request_free(serve_request *r);
/* Makes a lead built with every other field into n choices (n >= 1): choices 1..n-1 copy its request, and with a
 * seed S choice i samples with S + i (vLLM's rule: the choices differ and each one is reproducible as a request
 * of its own with that seed); without one (fresh_seed) each draws its own. false when out of memory. */
bool serve_request_make_choices(serve_request *lead, int n);
/* Frees a lead that was never handed over, with its choices. */
void serve_request_discard(serve_request *lead);

/* The completion tokens of every choice of the lead's request. */
int32_t serve_request_generated(const serve_request *lead);
/* The prompt tokens of the lead's request: the prompt once, and every choice's inserted tokens (a forced call's
 * opening after the reasoning is prompt, as it is at the prompt's end without thinking: it was not sampled). */
size_t serve_request_prompt_tokens(const serve_request *lead);
/* ,"usage":{"prompt_tokens":P,"completion_tokens":C,"total_tokens":T} for a finished request: the prompt once, the
 * completion tokens of every choice (r may be any choice). */
void serve_request_usage_json(text_buffer *b, const serve_request *r);

/* Seconds on a monotonic clock, for TTFT and total times. */
double serve_now_seconds(void);

#endif

/* One streamed /v1/completions response read as the load generator sees it: the bytes of the body (server-sent
 * events: "data: {json}" lines, a blank line ending each event, "data: [DONE]" last) fed as they arrive, and what
 * they said: the text, when each piece of it arrived, the finish reason and the usage. kite serve and llama-server
 * both send OpenAI's chunks: {"choices":[{"text","finish_reason"}], "usage"} (usage in its own last chunk, with empty
 * choices, when stream_options.include_usage asks for it; in the finishing chunk on some servers).
 *
 * Pure parsing, no sockets: the HTTP client (serve_client.c) feeds it, and tests feed it bytes directly. */
#ifndef KITE_BENCH_SERVE_STREAM_H
#define KITE_BENCH_SERVE_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/text_builder.h"

typedef struct serve_stream {
    text_builder line;   /* the line being read, without its end */
    text_builder data;   /* the data lines of the event being read, joined by '\n' (the SSE rule) */
    bool in_event;       /* a data line was read since the last blank line */
    bool after_cr;       /* the last byte was '\r': a '\n' right after it ends no second line */
    text_builder text;   /* every choice's text, in order */
    double *chunk_times; /* monotonic seconds at which each chunk with a token arrived (serve_stream.c) */
    size_t n_chunk_times, chunk_times_capacity;
    char finish_reason[32]; /* "" until a choice carries one */
    bool has_usage;
    int64_t prompt_tokens, completion_tokens; /* the server's usage, once has_usage */
    bool done;                                /* "data: [DONE]" was read */
    bool failed;                              /* the stream is not a valid completion stream: `error` says why */
    char error[512];
} serve_stream;

/* A stream is ready when zeroed (serve_stream s = {0};). */
void serve_stream_free(serve_stream *s);

/* Reads the next bytes of the body, received at `now` (monotonic seconds). Returns false (and sets `failed`,
 * `error`) on the first event that is not a completion chunk: a server's error event, malformed JSON, a chunk
 * without choices or usage, text that is not a string, anything after [DONE], or out of memory. Bytes after a
 * failure are ignored. */
bool serve_stream_feed(serve_stream *s, const char *bytes, size_t length, double now);

/* Called once the body ended: false (with `error`) when it ended inside an event or before [DONE]. */
bool serve_stream_finish(serve_stream *s);

#endif

/* kite serve: an OpenAI-compatible HTTP server (POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
 * GET /health).
 *
 * Threads: the main thread accepts connections and gives each its own thread; one engine thread owns the
 * kite_engine (an engine is used by one thread) and runs continuous batching over every open request.
 * A connection thread parses its request, tokenizes the prompt (a tokenizer may be shared between threads),
 * hands a server_request to the engine thread through the inbox, then waits on the request's condition
 * variable for text and writes it out: as server-sent events with "stream": true, else as one JSON object.
 * A client that goes away has its request cancelled. Every response closes its connection.
 * Request bodies are read with jansson; every response is written with the text buffer's JSON writer.
 * A chat request is rendered with the checkpoint's chat template (kite_chat_render, on the connection thread) and
 * its answer runs through kite_chat_submit, whose events arrive already split into reasoning, content and tool
 * calls; they go out as OpenAI's chat.completion (or its chunks), with vLLM's reasoning_content.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* json_object_get here is jansson's, renamed by the build (CMakeLists.txt): libkite.a has its own. */
#include <jansson.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "kite.h"
#include "text_buffer.h"

enum { SERVE_MODEL = 1, SERVE_HOST, SERVE_PORT, SERVE_NAME };

static const cli_option serve_options[] = {
    {SERVE_MODEL, "model", 'm', "DIR", "the checkpoint directory (config.json, safetensors, tokenizer.json)", false},
    {SERVE_HOST, "host", 0, "ADDRESS", "the IPv4 address to listen on (default 127.0.0.1)", false},
    {SERVE_PORT, "port", 0, "PORT", "the TCP port (default 8080; 0 picks a free one)", false},
    {SERVE_NAME, "served-model-name", 0, "NAME", "the model's name in responses (default: the directory's name)",
     false},
    CLI_ENGINE_OPTIONS,
};

static const cli_command serve_command = {
    "serve", "--model DIR [--host 127.0.0.1] [--port 8080] [options]",
    "  POST /v1/completions (OpenAI-compatible: prompt as text or token ids, max_tokens, temperature, top_p,\n"
    "  top_k, min_p, repetition_penalty, seed, stop, stream, logprobs), POST /v1/chat/completions (messages,\n"
    "  tools, tool_choice auto|none, chat_template_kwargs such as enable_thinking; the answer's reasoning_content\n"
    "  and tool_calls parsed; sampling not given follows generation_config.json), GET /v1/models, GET /health.\n"
    "  The port is printed on stdout as \"listening on HOST:PORT\" once the model is loaded.\n",
    serve_options, sizeof serve_options / sizeof serve_options[0]};

#define MAX_HEADER_BYTES (16 << 10)
#define MAX_BODY_BYTES (16 << 20)
#define MAX_STOP_STRINGS 8

/* ---- one request, shared by its connection thread and the engine thread ----------------------------- */

typedef struct server_request {
    pthread_mutex_t mutex;
    pthread_cond_t changed;
    int references; /* the connection and the engine each hold one */

    kite_request request; /* prompt ids and stop strings point into this struct's own copies */
    int32_t *prompt_ids;
    size_t n_prompt;
    char *stop_storage[MAX_STOP_STRINGS];

    /* Written by the engine thread under the mutex, read by the connection thread. */
    text_buffer text;
    size_t text_taken; /* bytes of text the connection has written out */
    int32_t n_generated;
    kite_finish_reason finish;
    bool done;
    bool failed;
    char error[256];

    /* /v1/chat/completions: `text` above holds the content; the engine thread submits through kite_chat_submit. */
    bool chat;
    kite_chat_prompt prompt;
    text_buffer reasoning;
    size_t reasoning_taken;
    text_buffer calls; /* completed tool calls, each a JSON object followed by '\n' */
    size_t calls_taken;
    int n_calls;

    kite_request_id id;             /* set by the engine thread once submitted */
    struct server_request *next;    /* inbox / cancel list link */
} server_request;

typedef struct server {
    kite_model *model;
    kite_engine *engine;
    const char *model_name;
    pthread_mutex_t mutex; /* guards inbox, cancels and stopping */
    pthread_cond_t wake;
    server_request *inbox;
    server_request *cancels;
    bool stopping;
    long next_completion;
} server;

static volatile sig_atomic_t stop_signal;
static atomic_int active_connections; /* connection threads still running */

static void on_signal(int signal_number) {
    (void)signal_number;
    stop_signal = 1;
}

static void request_release(server_request *r) {
    pthread_mutex_lock(&r->mutex);
    int left = --r->references;
    pthread_mutex_unlock(&r->mutex);
    if (left > 0) return;
    pthread_mutex_destroy(&r->mutex);
    pthread_cond_destroy(&r->changed);
    free(r->prompt_ids);
    for (int i = 0; i < MAX_STOP_STRINGS; i++) free(r->stop_storage[i]);
    text_buffer_free(&r->text);
    text_buffer_free(&r->reasoning);
    text_buffer_free(&r->calls);
    kite_chat_prompt_free(&r->prompt);
    free(r);
}

/* The engine thread's token callback: append the text, mark the end, wake the connection. */
static void on_token(const kite_token_event *event, void *user_data) {
    server_request *r = user_data;
    pthread_mutex_lock(&r->mutex);
    if (event->text_length > 0 && !r->failed) {
        text_buffer_append(&r->text, event->text, event->text_length);
        if (r->text.failed) {
            r->failed = true;
            snprintf(r->error, sizeof r->error, "out of memory collecting the output");
        }
    }
    if (event->token >= 0) r->n_generated++;
    bool last = event->finish != KITE_FINISH_NONE;
    if (last) {
        r->finish = event->finish;
        r->done = true;
    }
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->mutex);
    if (last) request_release(r); /* the engine will not call back for this request again */
}

/* The engine thread's chat callback: the parsed pieces, each into its buffer. */
static void on_chat_event(const kite_chat_event *event, void *user_data) {
    server_request *r = user_data;
    const kite_chat_delta *d = &event->delta;
    pthread_mutex_lock(&r->mutex);
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
        if (r->text.failed || r->reasoning.failed || r->calls.failed) {
            r->failed = true;
            snprintf(r->error, sizeof r->error, "out of memory collecting the output");
        }
    }
    if (event->token && event->token->token >= 0) r->n_generated++;
    bool last = event->finish != KITE_FINISH_NONE;
    if (last) {
        r->finish = event->finish;
        r->done = true;
    }
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->mutex);
    if (last) request_release(r);
}

/* ---- the engine thread ---------------------------------------------------------------------------- */

static void fail_request(server_request *r, const char *message) {
    pthread_mutex_lock(&r->mutex);
    r->failed = true;
    r->done = true;
    snprintf(r->error, sizeof r->error, "%s", message);
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->mutex);
    request_release(r);
}

static void *engine_thread(void *argument) {
    server *s = argument;
    for (;;) {
        pthread_mutex_lock(&s->mutex);
        while (!s->stopping && !s->inbox && !s->cancels && kite_engine_idle(s->engine))
            pthread_cond_wait(&s->wake, &s->mutex);
        bool stopping = s->stopping;
        server_request *arrived = s->inbox, *cancels = s->cancels;
        s->inbox = s->cancels = NULL;
        pthread_mutex_unlock(&s->mutex);

        /* The inbox is a stack: submit in arrival order. */
        server_request *ordered = NULL;
        while (arrived) {
            server_request *next = arrived->next;
            arrived->next = ordered;
            ordered = arrived;
            arrived = next;
        }
        for (server_request *r = ordered, *next; r; r = next) {
            next = r->next;
            kite_request_id id = 0;
            kite_status status = stopping ? KITE_ERROR_INVALID_ARGUMENT
                                 : r->chat    ? kite_chat_submit(s->engine, kite_model_chat(s->model), &r->prompt,
                                                                 &r->request, on_chat_event, r, &id)
                                              : kite_engine_submit(s->engine, &r->request, &id);
            if (status != KITE_OK) {
                fail_request(r, stopping ? "the server is stopping" : kite_last_error());
                continue;
            }
            pthread_mutex_lock(&r->mutex);
            r->id = id;
            pthread_mutex_unlock(&r->mutex);
        }
        for (server_request *r = cancels, *next; r; r = next) {
            next = r->next;
            pthread_mutex_lock(&r->mutex);
            kite_request_id id = r->done ? 0 : r->id;
            pthread_mutex_unlock(&r->mutex);
            if (id) (void)kite_engine_cancel(s->engine, id); /* its final event releases the engine's hold */
            request_release(r); /* the hold taken when it was put on the cancel list */
        }
        if (stopping) {
            (void)kite_engine_run(s->engine); /* finish what is running, then leave */
            return NULL;
        }
        if (!kite_engine_idle(s->engine) && kite_engine_step(s->engine) != KITE_OK) {
            fprintf(stderr, "kite serve: engine step failed: %s\n", kite_last_error());
            pthread_mutex_lock(&s->mutex);
            s->stopping = true;
            pthread_mutex_unlock(&s->mutex);
        }
    }
}

/* ---- HTTP ---------------------------------------------------------------------------------------- */

static bool write_all(int fd, const char *data, size_t length) {
    while (length > 0) {
        ssize_t n = send(fd, data, length, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        data += n;
        length -= (size_t)n;
    }
    return true;
}

static bool respond(int fd, int code, const char *reason, const char *content_type, const char *body, size_t length) {
    char header[256];
    int n = snprintf(header, sizeof header,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", code,
                     reason, content_type, length);
    return write_all(fd, header, (size_t)n) && write_all(fd, body, length);
}

static void respond_error(int fd, int code, const char *reason, const char *message) {
    text_buffer body = {0};
    text_buffer_puts(&body, "{\"error\":{\"message\":");
    text_buffer_json_string(&body, message, strlen(message));
    text_buffer_printf(&body, ",\"type\":\"invalid_request_error\",\"code\":%d}}", code);
    if (body.failed)
        respond(fd, 500, "Internal Server Error", "application/json", "{}", 2);
    else
        respond(fd, code, reason, "application/json", body.data, body.length);
    text_buffer_free(&body);
}

/* Reads one HTTP request: method, path and body (Content-Length only). false with a response sent. */
static bool read_request(int fd, char *method, size_t method_size, char *path, size_t path_size, char **body,
                         size_t *body_length) {
    char *buffer = malloc(MAX_HEADER_BYTES + 1);
    if (!buffer) return false;
    size_t used = 0;
    char *end = NULL;
    while (!end) {
        if (used == MAX_HEADER_BYTES) {
            respond_error(fd, 431, "Request Header Fields Too Large", "the request header is too large");
            free(buffer);
            return false;
        }
        ssize_t n = recv(fd, buffer + used, MAX_HEADER_BYTES - used, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            free(buffer);
            return false;
        }
        used += (size_t)n;
        buffer[used] = '\0';
        end = strstr(buffer, "\r\n\r\n");
    }
    size_t header_length = (size_t)(end - buffer) + 4;
    if (sscanf(buffer, "%15s %1023s", method, path) != 2) {
        respond_error(fd, 400, "Bad Request", "malformed request line");
        free(buffer);
        return false;
    }
    (void)method_size;
    (void)path_size;
    size_t content_length = 0;
    for (char *line = strstr(buffer, "\r\n"); line && line < end; line = strstr(line + 2, "\r\n")) {
        if (strncasecmp(line + 2, "Content-Length:", 15) == 0) {
            char *value_end = NULL;
            errno = 0;
            unsigned long long v = strtoull(line + 17, &value_end, 10);
            if (errno != 0 || value_end == line + 17 || v > MAX_BODY_BYTES) {
                respond_error(fd, 413, "Payload Too Large", "bad or too large Content-Length");
                free(buffer);
                return false;
            }
            content_length = (size_t)v;
        }
    }
    char *data = malloc(content_length + 1);
    if (!data) {
        free(buffer);
        return false;
    }
    size_t have = used - header_length < content_length ? used - header_length : content_length;
    memcpy(data, buffer + header_length, have);
    free(buffer);
    while (have < content_length) {
        ssize_t n = recv(fd, data + have, content_length - have, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            free(data);
            return false;
        }
        have += (size_t)n;
    }
    data[content_length] = '\0';
    *body = data;
    *body_length = content_length;
    return true;
}

/* ---- /v1/completions ----------------------------------------------------------------------------- */

/* An optional number field: false (with `why` filled) when present with another type; *present says whether
 * it was there (null counts as absent). */
static bool optional_number(const json_t *object, const char *key, bool *present, double *out, char *why,
                            size_t why_size) {
    const json_t *v = json_object_get(object, key);
    *present = false;
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) {
        snprintf(why, why_size, "'%s' must be a number", key);
        return false;
    }
    *present = true;
    *out = json_number_value(v);
    return true;
}

/* An optional true / false field; false (with `why` filled) when present with another type. */
static bool optional_bool(const json_t *object, const char *key, bool *out, char *why, size_t why_size) {
    const json_t *v = json_object_get(object, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        snprintf(why, why_size, "'%s' must be true or false", key);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

/* The prompt: text (tokenized here, on the connection's thread) or token ids. */
static bool parse_prompt(server *s, const json_t *prompt, server_request *r, char *why, size_t why_size) {
    if (json_is_string(prompt)) {
        kite_status status = kite_tokenize(s->model, json_string_value(prompt), json_string_length(prompt),
                                           &r->prompt_ids, &r->n_prompt);
        if (status != KITE_OK) {
            snprintf(why, why_size, "prompt: %s", kite_last_error());
            return false;
        }
    } else if (json_is_array(prompt) && json_array_size(prompt) > 0 && json_is_number(json_array_get(prompt, 0))) {
        size_t n = json_array_size(prompt);
        r->prompt_ids = malloc(n * sizeof(int32_t));
        if (!r->prompt_ids) {
            snprintf(why, why_size, "out of memory");
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *item = json_array_get(prompt, i);
            json_int_t v = json_is_integer(item) ? json_integer_value(item) : -1;
            if (v < 0 || v > INT32_MAX) {
                snprintf(why, why_size, "prompt[%zu] is not a token id", i);
                return false;
            }
            r->prompt_ids[i] = (int32_t)v;
        }
        r->n_prompt = n;
    } else {
        snprintf(why, why_size, "'prompt' must be a string or an array of token ids (one prompt per request)");
        return false;
    }
    if (r->n_prompt == 0) {
        snprintf(why, why_size, "the prompt is empty");
        return false;
    }
    r->request.prompt_ids = r->prompt_ids;
    r->request.n_prompt_ids = r->n_prompt;
    return true;
}

/* The sampling and length fields, each optional, each checked against its range. Fields kite does not know
 * are ignored, as OpenAI-compatible servers do. */
static bool parse_numbers(const json_t *root, kite_request *request, char *why, size_t why_size) {
    enum { MAX_TOKENS, TEMPERATURE, TOP_P, TOP_K, MIN_P, REPETITION_PENALTY, SEED, LOGPROBS, N };
    static const struct {
        const char *key;
        double min, max;
    } fields[] = {
        [MAX_TOKENS] = {"max_tokens", 0, 1 << 30},
        [TEMPERATURE] = {"temperature", 0, 100},
        [TOP_P] = {"top_p", 0, 1},
        [TOP_K] = {"top_k", -1, 1 << 30}, /* -1: off, as vLLM */
        [MIN_P] = {"min_p", 0, 1},
        [REPETITION_PENALTY] = {"repetition_penalty", 0.01, 100},
        [SEED] = {"seed", 0, 9.0e15}, /* integers a double holds exactly */
        [LOGPROBS] = {"logprobs", 0, KITE_MAX_LOGPROBS},
        [N] = {"n", 1, 1}, /* one choice per request */
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        bool present;
        double v = 0;
        if (!optional_number(root, fields[i].key, &present, &v, why, why_size)) return false;
        if (!present) continue;
        if (!(v >= fields[i].min && v <= fields[i].max)) {
            snprintf(why, why_size, "'%s' must be in [%g, %g]", fields[i].key, fields[i].min, fields[i].max);
            return false;
        }
        switch (i) {
        case MAX_TOKENS: request->max_tokens = (int32_t)v; break;
        case TEMPERATURE: request->sampling.temperature = (float)v; break;
        case TOP_P: request->sampling.top_p = (float)v; break;
        case TOP_K: request->sampling.top_k = v < 0 ? 0 : (int32_t)v; break;
        case MIN_P: request->sampling.min_p = (float)v; break;
        case REPETITION_PENALTY: request->sampling.repetition_penalty = (float)v; break;
        case SEED: request->sampling.seed = (uint64_t)v; break;
        case LOGPROBS: request->n_logprobs = (int32_t)v; break;
        default: break;
        }
    }
    return true;
}

/* "stop": a string or an array of at most MAX_STOP_STRINGS strings, copied into the request. */
static bool parse_stop(const json_t *stop, server_request *r, char *why, size_t why_size) {
    if (json_is_string(stop)) {
        r->stop_storage[0] = strdup(json_string_value(stop));
        if (!r->stop_storage[0]) {
            snprintf(why, why_size, "out of memory");
            return false;
        }
        r->request.n_stop_strings = 1;
    } else if (json_is_array(stop)) {
        size_t n = json_array_size(stop);
        if (n > MAX_STOP_STRINGS) {
            snprintf(why, why_size, "at most %d stop strings", MAX_STOP_STRINGS);
            return false;
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *item = json_array_get(stop, i);
            if (!json_is_string(item)) {
                snprintf(why, why_size, "'stop' must hold strings");
                return false;
            }
            r->stop_storage[i] = strdup(json_string_value(item));
            if (!r->stop_storage[i]) {
                snprintf(why, why_size, "out of memory");
                return false;
            }
        }
        r->request.n_stop_strings = (int32_t)n;
    } else if (stop && !json_is_null(stop)) {
        snprintf(why, why_size, "'stop' must be a string or an array of strings");
        return false;
    }
    r->request.stop_strings = (const char *const *)r->stop_storage;
    return true;
}

/* Builds a server_request from the JSON body; NULL with `why` filled when the body is not acceptable. */
static server_request *parse_completion(server *s, const char *body, size_t length, bool *stream, char *why,
                                        size_t why_size) {
    json_error_t error;
    /* Any value at the top (so a non-object gets its own message); "\u0000" kept inside strings. A key given
     * twice keeps its last value, as Python's json (and so vLLM) does. */
    json_t *root = json_loadb(body, length, JSON_DECODE_ANY | JSON_ALLOW_NUL, &error);
    if (!root) {
        snprintf(why, why_size, "the body is not JSON: %s at line %d column %d", error.text, error.line,
                 error.column);
        return NULL;
    }
    server_request *r = calloc(1, sizeof *r);
    if (!r || !json_is_object(root)) {
        snprintf(why, why_size, r ? "the body must be a JSON object" : "out of memory");
        free(r);
        json_decref(root);
        return NULL;
    }
    pthread_mutex_init(&r->mutex, NULL);
    pthread_cond_init(&r->changed, NULL);
    r->references = 2;
    r->request = kite_request_default();
    r->request.max_tokens = 16; /* OpenAI's default for completions */
    *stream = false;
    bool ok = parse_prompt(s, json_object_get(root, "prompt"), r, why, why_size) &&
              parse_numbers(root, &r->request, why, why_size) &&
              parse_stop(json_object_get(root, "stop"), r, why, why_size) &&
              optional_bool(root, "stream", stream, why, why_size) &&
              optional_bool(root, "ignore_eos", &r->request.ignore_eos, why, why_size); /* vLLM's extension */
    json_decref(root);
    if (!ok) {
        r->references = 1;
        request_release(r);
        return NULL;
    }
    r->request.on_token = on_token;
    r->request.user_data = r;
    return r;
}

/* Waits until the request has new text or is done; takes the new text (malloc'd copy). */
static bool wait_for_text(server_request *r, char **text, size_t *length, bool *done) {
    pthread_mutex_lock(&r->mutex);
    while (!r->done && r->text_taken == r->text.length) pthread_cond_wait(&r->changed, &r->mutex);
    *length = r->text.length - r->text_taken;
    *text = malloc(*length + 1);
    bool ok = *text != NULL;
    if (ok) {
        if (*length > 0) memcpy(*text, r->text.data + r->text_taken, *length);
        (*text)[*length] = '\0';
        r->text_taken = r->text.length;
    }
    *done = r->done;
    pthread_mutex_unlock(&r->mutex);
    return ok;
}

static void completion_json(server *s, text_buffer *b, long id, const server_request *r, const char *text,
                            size_t length, bool chunk, bool last) {
    text_buffer_printf(b, "{\"id\":\"cmpl-%ld\",\"object\":\"text_completion\",\"created\":%lld,\"model\":", id,
                       (long long)time(NULL));
    text_buffer_json_string(b, s->model_name, strlen(s->model_name));
    text_buffer_puts(b, ",\"choices\":[{\"index\":0,\"text\":");
    text_buffer_json_string(b, text, length);
    text_buffer_puts(b, ",\"logprobs\":null,\"finish_reason\":");
    if (last)
        text_buffer_printf(b, "\"%s\"", kite_finish_reason_string(r->finish));
    else
        text_buffer_puts(b, "null");
    text_buffer_puts(b, "}]");
    if (!chunk || last)
        text_buffer_printf(b, ",\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":%d,\"total_tokens\":%zu}",
                           r->n_prompt, r->n_generated, r->n_prompt + (size_t)r->n_generated);
    text_buffer_puts(b, "}");
}

static void cancel_request(server *s, server_request *r) {
    pthread_mutex_lock(&r->mutex);
    r->references++; /* held by the cancel list until the engine thread has seen it */
    pthread_mutex_unlock(&r->mutex);
    pthread_mutex_lock(&s->mutex);
    r->next = s->cancels;
    s->cancels = r;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mutex);
}

/* Hands a parsed request to the engine thread; its number for the response's id, or -1 after a 503 (the
 * server is stopping: the request is released). */
static long enqueue_request(server *s, int fd, server_request *r) {
    pthread_mutex_lock(&s->mutex);
    const long id = ++s->next_completion;
    const bool stopping = s->stopping;
    if (!stopping) {
        r->next = s->inbox;
        s->inbox = r;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mutex);
    if (!stopping) return id;
    respond_error(fd, 503, "Service Unavailable", "the server is stopping");
    r->references = 1;
    request_release(r);
    return -1;
}

static bool write_stream_header(int fd) {
    const char *header = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         "Connection: close\r\n\r\n";
    return write_all(fd, header, strlen(header));
}

/* A request that failed in the engine: a 400, or an error event when the stream had begun. */
static void respond_failure(int fd, const server_request *r, bool stream, bool client_gone) {
    if (!stream) {
        respond_error(fd, 400, "Bad Request", r->error);
        return;
    }
    if (client_gone) return;
    text_buffer event = {0};
    text_buffer_puts(&event, "data: {\"error\":{\"message\":");
    text_buffer_json_string(&event, r->error, strlen(r->error));
    text_buffer_puts(&event, "}}\n\ndata: [DONE]\n\n");
    if (!event.failed) (void)write_all(fd, event.data, event.length);
    text_buffer_free(&event);
}

static void serve_completion(server *s, int fd, const char *body, size_t length) {
    char why[256] = "";
    bool stream = false;
    server_request *r = parse_completion(s, body, length, &stream, why, sizeof why);
    if (!r) {
        respond_error(fd, 400, "Bad Request", why);
        return;
    }
    const long id = enqueue_request(s, fd, r);
    if (id < 0) return;
    bool client_gone = stream && !write_stream_header(fd);
    text_buffer all = {0};
    for (bool done = false; !done;) {
        char *text;
        size_t n;
        if (!wait_for_text(r, &text, &n, &done)) {
            client_gone = true;
            break;
        }
        if (r->failed) {
            free(text);
            break;
        }
        if (stream && !client_gone && (n > 0 || done)) {
            text_buffer event = {0};
            text_buffer_puts(&event, "data: ");
            completion_json(s, &event, id, r, text, n, true, done);
            text_buffer_puts(&event, "\n\n");
            if (done) text_buffer_puts(&event, "data: [DONE]\n\n");
            client_gone = event.failed || !write_all(fd, event.data, event.length);
            text_buffer_free(&event);
        } else if (!stream) {
            text_buffer_append(&all, text, n);
        }
        free(text);
        if (client_gone) break;
    }
    if (client_gone && !r->done) cancel_request(s, r);
    if (r->failed) {
        respond_failure(fd, r, stream, client_gone);
    } else if (!stream && !client_gone) {
        text_buffer out = {0};
        completion_json(s, &out, id, r, all.data ? all.data : "", all.length, false, true);
        if (out.failed || all.failed)
            respond_error(fd, 500, "Internal Server Error", "out of memory");
        else
            respond(fd, 200, "OK", "application/json", out.data, out.length);
        text_buffer_free(&out);
    }
    text_buffer_free(&all);
    request_release(r);
}

/* ---- /v1/chat/completions ------------------------------------------------------------------------ */

static uint64_t fresh_seed(void) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    return seed;
}

/* A chat request: the template renders the body (messages, tools, tool_choice, chat_template_kwargs), the
 * sampling and length fields are read as for completions, each one not given taken from generation_config.json,
 * and a request without a seed draws a fresh one. */
static server_request *parse_chat(server *s, const char *body, size_t length, bool *stream, char *why,
                                  size_t why_size) {
    const kite_chat *chat = kite_model_chat(s->model);
    if (!chat) {
        snprintf(why, why_size, "this model has no chat template (use /v1/completions)");
        return NULL;
    }
    json_error_t error;
    json_t *root = json_loadb(body, length, JSON_DECODE_ANY | JSON_ALLOW_NUL, &error);
    if (!root) {
        snprintf(why, why_size, "the body is not JSON: %s at line %d column %d", error.text, error.line,
                 error.column);
        return NULL;
    }
    server_request *r = json_is_object(root) ? calloc(1, sizeof *r) : NULL;
    if (!r) {
        snprintf(why, why_size, json_is_object(root) ? "out of memory" : "the body must be a JSON object");
        json_decref(root);
        return NULL;
    }
    pthread_mutex_init(&r->mutex, NULL);
    pthread_cond_init(&r->changed, NULL);
    r->references = 2;
    r->chat = true;
    r->request = kite_request_default();
    r->request.sampling = kite_chat_sampling_defaults(chat);
    r->request.max_tokens = 0; /* until the turn ends (or the context does), as OpenAI's chat default */
    *stream = false;
    bool ok = true;
    const json_t *logprobs = json_object_get(root, "logprobs"), *top = json_object_get(root, "top_logprobs");
    if ((logprobs && !json_is_null(logprobs) && !json_is_false(logprobs)) || (top && !json_is_null(top))) {
        snprintf(why, why_size, "'logprobs' is not implemented for chat completions");
        ok = false;
    }
    json_t *max_completion = json_object_get(root, "max_completion_tokens");
    if (ok && max_completion && !json_is_null(max_completion)) {
        const json_t *max_tokens = json_object_get(root, "max_tokens");
        if (max_tokens && !json_is_null(max_tokens)) {
            snprintf(why, why_size, "give 'max_tokens' or 'max_completion_tokens', not both");
            ok = false;
        } else {
            json_object_set(root, "max_tokens", max_completion); /* the same limit under its newer name */
        }
    }
    if (ok) {
        json_object_del(root, "logprobs"); /* false or null: nothing asked */
        const json_t *seed = json_object_get(root, "seed");
        const bool seeded = seed && !json_is_null(seed);
        ok = parse_numbers(root, &r->request, why, why_size) &&
             parse_stop(json_object_get(root, "stop"), r, why, why_size) &&
             optional_bool(root, "stream", stream, why, why_size) &&
             optional_bool(root, "ignore_eos", &r->request.ignore_eos, why, why_size);
        if (!seeded) r->request.sampling.seed = fresh_seed();
    }
    json_decref(root);
    if (ok && kite_chat_render(chat, body, length, &r->prompt) != KITE_OK) {
        snprintf(why, why_size, "%s", kite_last_error());
        ok = false;
    }
    if (!ok) {
        r->references = 1;
        request_release(r);
        return NULL;
    }
    r->n_prompt = r->prompt.n_ids;
    return r;
}

/* What arrived since the last call: content, reasoning and complete tool calls (each malloc'd, NUL-ended). */
typedef struct chat_piece {
    char *content, *reasoning, *calls;
    size_t content_length, reasoning_length, calls_length;
} chat_piece;

static char *take_new(const text_buffer *b, size_t *taken, size_t *length) {
    *length = b->length - *taken;
    char *copy = malloc(*length + 1);
    if (!copy) return NULL;
    if (*length) memcpy(copy, b->data + *taken, *length);
    copy[*length] = '\0';
    *taken = b->length;
    return copy;
}

static void chat_piece_free(chat_piece *p) {
    free(p->content);
    free(p->reasoning);
    free(p->calls);
    *p = (chat_piece){0};
}

static bool wait_for_chat(server_request *r, chat_piece *p, bool *done) {
    pthread_mutex_lock(&r->mutex);
    while (!r->done && r->text_taken == r->text.length && r->reasoning_taken == r->reasoning.length &&
           r->calls_taken == r->calls.length)
        pthread_cond_wait(&r->changed, &r->mutex);
    p->content = take_new(&r->text, &r->text_taken, &p->content_length);
    p->reasoning = take_new(&r->reasoning, &r->reasoning_taken, &p->reasoning_length);
    p->calls = take_new(&r->calls, &r->calls_taken, &p->calls_length);
    *done = r->done;
    pthread_mutex_unlock(&r->mutex);
    return p->content && p->reasoning && p->calls;
}

/* The calls buffer's objects ("{...}\n{...}\n") as a JSON array's items. */
static void append_calls(text_buffer *b, const char *calls, size_t length) {
    text_buffer_puts(b, "[");
    bool first = true;
    for (size_t start = 0; start < length;) {
        const char *end = memchr(calls + start, '\n', length - start);
        const size_t n = end ? (size_t)(end - (calls + start)) : length - start;
        if (!first) text_buffer_puts(b, ",");
        text_buffer_append(b, calls + start, n);
        first = false;
        start += n + 1;
    }
    text_buffer_puts(b, "]");
}

/* finish_reason as OpenAI's chat API says it: "tool_calls" when the answer called tools. */
static const char *chat_finish_reason(const server_request *r) {
    return r->n_calls > 0 && r->finish == KITE_FINISH_STOP ? "tool_calls" : kite_finish_reason_string(r->finish);
}

static void chat_head(server *s, text_buffer *b, long id, bool chunk) {
    text_buffer_printf(b, "{\"id\":\"chatcmpl-%ld\",\"object\":\"%s\",\"created\":%lld,\"model\":", id,
                       chunk ? "chat.completion.chunk" : "chat.completion", (long long)time(NULL));
    text_buffer_json_string(b, s->model_name, strlen(s->model_name));
}

static void chat_usage(text_buffer *b, const server_request *r) {
    text_buffer_printf(b, ",\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":%d,\"total_tokens\":%zu}",
                       r->n_prompt, r->n_generated, r->n_prompt + (size_t)r->n_generated);
}

/* One streamed chunk: the piece's delta (role in the first), finish_reason and usage in the last. */
static void chat_chunk(server *s, text_buffer *b, long id, const server_request *r, const chat_piece *p, bool first,
                       bool last) {
    chat_head(s, b, id, true);
    text_buffer_puts(b, ",\"choices\":[{\"index\":0,\"delta\":{");
    bool any = false;
    if (first) {
        text_buffer_puts(b, "\"role\":\"assistant\"");
        any = true;
    }
    if (p->reasoning_length) {
        text_buffer_puts(b, any ? ",\"reasoning_content\":" : "\"reasoning_content\":");
        text_buffer_json_string(b, p->reasoning, p->reasoning_length);
        any = true;
    }
    if (p->content_length) {
        text_buffer_puts(b, any ? ",\"content\":" : "\"content\":");
        text_buffer_json_string(b, p->content, p->content_length);
        any = true;
    }
    if (p->calls_length) {
        text_buffer_puts(b, any ? ",\"tool_calls\":" : "\"tool_calls\":");
        append_calls(b, p->calls, p->calls_length);
    }
    text_buffer_puts(b, "},\"logprobs\":null,\"finish_reason\":");
    if (last)
        text_buffer_printf(b, "\"%s\"", chat_finish_reason(r));
    else
        text_buffer_puts(b, "null");
    text_buffer_puts(b, "}]");
    if (last) chat_usage(b, r);
    text_buffer_puts(b, "}");
}

static void chat_completion_json(server *s, text_buffer *b, long id, const server_request *r, const text_buffer *content,
                                 const text_buffer *reasoning, const text_buffer *calls) {
    chat_head(s, b, id, false);
    text_buffer_puts(b, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    if (content->length || r->n_calls == 0)
        text_buffer_json_string(b, content->data ? content->data : "", content->length);
    else
        text_buffer_puts(b, "null"); /* tool calls and nothing else, as vLLM answers */
    if (reasoning->length) {
        text_buffer_puts(b, ",\"reasoning_content\":");
        text_buffer_json_string(b, reasoning->data, reasoning->length);
    }
    if (calls->length) {
        text_buffer_puts(b, ",\"tool_calls\":");
        append_calls(b, calls->data, calls->length);
    }
    text_buffer_printf(b, "},\"logprobs\":null,\"finish_reason\":\"%s\"}]", chat_finish_reason(r));
    chat_usage(b, r);
    text_buffer_puts(b, "}");
}

static void serve_chat(server *s, int fd, const char *body, size_t length) {
    char why[512] = "";
    bool stream = false;
    server_request *r = parse_chat(s, body, length, &stream, why, sizeof why);
    if (!r) {
        respond_error(fd, 400, "Bad Request", why);
        return;
    }
    const long id = enqueue_request(s, fd, r);
    if (id < 0) return;
    bool client_gone = stream && !write_stream_header(fd);
    text_buffer content = {0}, reasoning = {0}, calls = {0};
    bool first = true;
    for (bool done = false; !done;) {
        chat_piece p = {0};
        if (!wait_for_chat(r, &p, &done)) {
            chat_piece_free(&p);
            client_gone = true;
            break;
        }
        if (r->failed) {
            chat_piece_free(&p);
            break;
        }
        const bool news = p.content_length || p.reasoning_length || p.calls_length;
        if (stream && !client_gone && (news || done || first)) {
            text_buffer event = {0};
            text_buffer_puts(&event, "data: ");
            chat_chunk(s, &event, id, r, &p, first, done);
            text_buffer_puts(&event, "\n\n");
            if (done) text_buffer_puts(&event, "data: [DONE]\n\n");
            client_gone = event.failed || !write_all(fd, event.data, event.length);
            text_buffer_free(&event);
            first = false;
        } else if (!stream) {
            text_buffer_append(&content, p.content, p.content_length);
            text_buffer_append(&reasoning, p.reasoning, p.reasoning_length);
            text_buffer_append(&calls, p.calls, p.calls_length);
        }
        chat_piece_free(&p);
        if (client_gone) break;
    }
    if (client_gone && !r->done) cancel_request(s, r);
    if (r->failed) {
        respond_failure(fd, r, stream, client_gone);
    } else if (!stream && !client_gone) {
        text_buffer out = {0};
        chat_completion_json(s, &out, id, r, &content, &reasoning, &calls);
        if (out.failed || content.failed || reasoning.failed || calls.failed)
            respond_error(fd, 500, "Internal Server Error", "out of memory");
        else
            respond(fd, 200, "OK", "application/json", out.data, out.length);
        text_buffer_free(&out);
    }
    text_buffer_free(&content);
    text_buffer_free(&reasoning);
    text_buffer_free(&calls);
    request_release(r);
}

typedef struct connection {
    server *server;
    int fd;
} connection;

static void *connection_thread(void *argument) {
    connection *c = argument;
    char method[16], path[1024];
    char *body = NULL;
    size_t body_length = 0;
    if (read_request(c->fd, method, sizeof method, path, sizeof path, &body, &body_length)) {
        if (strcmp(method, "GET") == 0 && strcmp(path, "/health") == 0) {
            respond(c->fd, 200, "OK", "application/json", "{\"status\":\"ok\"}", 15);
        } else if (strcmp(method, "GET") == 0 && strcmp(path, "/v1/models") == 0) {
            text_buffer b = {0};
            text_buffer_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
            text_buffer_json_string(&b, c->server->model_name, strlen(c->server->model_name));
            text_buffer_puts(&b, ",\"object\":\"model\",\"owned_by\":\"kite\"}]}");
            if (b.failed)
                respond_error(c->fd, 500, "Internal Server Error", "out of memory");
            else
                respond(c->fd, 200, "OK", "application/json", b.data, b.length);
            text_buffer_free(&b);
        } else if (strcmp(path, "/v1/chat/completions") == 0) {
            if (strcmp(method, "POST") != 0)
                respond_error(c->fd, 405, "Method Not Allowed", "use POST");
            else
                serve_chat(c->server, c->fd, body, body_length);
        } else if (strcmp(path, "/v1/completions") == 0) {
            if (strcmp(method, "POST") != 0)
                respond_error(c->fd, 405, "Method Not Allowed", "use POST");
            else
                serve_completion(c->server, c->fd, body, body_length);
        } else {
            respond_error(c->fd, 404, "Not Found", "no such endpoint");
        }
    }
    free(body);
    close(c->fd);
    free(c);
    atomic_fetch_sub(&active_connections, 1);
    return NULL;
}

/* ---- main ---------------------------------------------------------------------------------------- */

int cmd_serve(int argc, char **argv) {
    const char *model_dir = NULL, *host = "127.0.0.1", *name = NULL;
    long long port = 8080;
    kite_load_params load = kite_load_params_default();
    kite_engine_params engine_params = kite_engine_params_default();
    cli_parser parser;
    cli_parser_init(&parser, &serve_command, argc, argv);
    for (int id; (id = cli_parser_next(&parser)) != CLI_END;) {
        switch (id) {
        case CLI_HELP: return 0;
        case CLI_ERROR: return 2;
        case SERVE_MODEL: model_dir = parser.value; break;
        case SERVE_HOST: host = parser.value; break;
        case SERVE_PORT:
            if (!cli_value_int(&parser, 0, 65535, &port)) return 2;
            break;
        case SERVE_NAME: name = parser.value; break;
        default:
            if (cli_take_engine_option(&parser, &load, &engine_params) != CLI_OPTION_TAKEN) return 2;
        }
    }
    if (parser.first_argument < argc) {
        fprintf(stderr, "kite serve: unexpected argument '%s'\n", argv[parser.first_argument]);
        cli_print_usage(&serve_command, stderr);
        return 2;
    }
    if (!model_dir) {
        fprintf(stderr, "kite serve: --model DIR is required\n");
        cli_print_usage(&serve_command, stderr);
        return 2;
    }
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &address.sin_addr) != 1) {
        fprintf(stderr, "kite serve: --host: '%s' is not an IPv4 address\n", host);
        return 2;
    }
    if (!name) {
        const char *slash = strrchr(model_dir, '/');
        name = slash && slash[1] ? slash + 1 : model_dir;
    }

    server s = {.model_name = name};
    kite_status status = kite_model_load(model_dir, &load, &s.model);
    if (status != KITE_OK) return cli_report("load", status);
    status = kite_engine_create(s.model, &engine_params, &s.engine);
    if (status != KITE_OK) {
        kite_model_free(s.model);
        return cli_report("engine", status);
    }
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (listener < 0 || setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(listener, (struct sockaddr *)&address, sizeof address) != 0 || listen(listener, 128) != 0) {
        fprintf(stderr, "kite serve: cannot listen on %s:%lld: %s\n", host, port, strerror(errno));
        if (listener >= 0) close(listener);
        kite_engine_free(s.engine);
        kite_model_free(s.model);
        return 1;
    }
    socklen_t address_length = sizeof address;
    if (getsockname(listener, (struct sockaddr *)&address, &address_length) != 0) {
        fprintf(stderr, "kite serve: getsockname: %s\n", strerror(errno));
        close(listener);
        kite_engine_free(s.engine);
        kite_model_free(s.model);
        return 1;
    }
    pthread_mutex_init(&s.mutex, NULL);
    pthread_cond_init(&s.wake, NULL);
    struct sigaction action = {.sa_handler = on_signal};
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, NULL); /* no SA_RESTART: accept() returns EINTR and the loop sees the flag */
    sigaction(SIGTERM, &action, NULL);
    kite_engine_stats stats = kite_engine_get_stats(s.engine);
    fprintf(stderr, "kite serve: %s backend; KV cache %zu tokens, %d sequences of the full %d-token context\n",
            kite_model_get_info(s.model).backend_name, stats.kv_capacity_tokens, stats.max_concurrent_full,
            stats.max_context);
    printf("listening on %s:%d\n", host, ntohs(address.sin_port));
    fflush(stdout);

    pthread_t engine;
    if (pthread_create(&engine, NULL, engine_thread, &s) != 0) {
        fprintf(stderr, "kite serve: cannot start the engine thread\n");
        close(listener);
        kite_engine_free(s.engine);
        kite_model_free(s.model);
        return 1;
    }
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    while (!stop_signal) {
        /* Poll with a timeout so a signal handled on any thread stops the loop within a moment. */
        struct pollfd ready = {.fd = listener, .events = POLLIN};
        int n = poll(&ready, 1, 200);
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "kite serve: poll: %s\n", strerror(errno));
            break;
        }
        if (n <= 0) continue;
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
            fprintf(stderr, "kite serve: accept: %s\n", strerror(errno));
            break;
        }
        /* A client that stops sending does not hold a thread forever. */
        struct timeval timeout = {.tv_sec = 60};
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
        connection *c = malloc(sizeof *c);
        pthread_t thread;
        if (!c) {
            close(fd);
            continue;
        }
        *c = (connection){.server = &s, .fd = fd};
        atomic_fetch_add(&active_connections, 1);
        if (pthread_create(&thread, &detached, connection_thread, c) != 0) {
            atomic_fetch_sub(&active_connections, 1);
            close(fd);
            free(c);
        }
    }
    pthread_attr_destroy(&detached);
    close(listener);
    pthread_mutex_lock(&s.mutex);
    s.stopping = true;
    pthread_cond_signal(&s.wake);
    pthread_mutex_unlock(&s.mutex);
    pthread_join(engine, NULL);
    /* Let connection threads write their last bytes (their requests are finished or refused by now). */
    for (int i = 0; i < 100 && atomic_load(&active_connections) > 0; i++) {
        struct timespec pause = {.tv_nsec = 50 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    if (atomic_load(&active_connections) > 0) {
        /* A client still holds a connection: leave the model to the process exit rather than free it under
         * a thread that may still read it. */
        fprintf(stderr, "kite serve: stopped (%d connections still open)\n", atomic_load(&active_connections));
        return 0;
    }
    fprintf(stderr, "kite serve: stopped\n");
    kite_engine_free(s.engine);
    kite_model_free(s.model);
    pthread_mutex_destroy(&s.mutex);
    pthread_cond_destroy(&s.wake);
    return 0;
}

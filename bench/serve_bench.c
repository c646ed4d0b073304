/* kite-serve-bench: a load generator for OpenAI-compatible servers (kite serve, llama-server), after vLLM's
 * `vllm bench serve`. Streamed /v1/completions over keep-alive HTTP/1.1 connections; closed loop (a fixed number
 * of requests in flight, --concurrency) or open loop (Poisson arrivals, --rate, optionally capped by
 * --concurrency); warm-up requests first, not counted. Every request is greedy with max_tokens = --output-len and
 * ignore_eos, so each must generate exactly that many tokens; the gate (below) checks that before any figure.
 *
 *   kite-serve-bench --tokenizer DIR --text FILE [--host H] [--port P] [--dataset random|shared-prefix]
 *       [--input-len N] [--prefix-len N] [--output-len N] [--num-requests N] [--warmup N]
 *       [--concurrency C] [--rate R] [--seed S] [--reference FILE] [--model NAME] [--api-key KEY]
 *       [--server LABEL] [--gpu NAME] [--commit HASH] [--timeout S] [--wait S] [--out results.jsonl]
 *
 * The gate: every request (reference, warm-up and measured) is HTTP 200, a well-formed event stream ending in
 * [DONE], finish_reason "length", usage.completion_tokens = --output-len (the server's count); with --reference,
 * each line's prompt completed greedily gives exactly the line's text. A request that fails any of it fails the
 * run: the failures are printed, no figure is, and the exit code is 1 (2 for a usage error). */
#include <errno.h>
#include <event2/event.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/python_json.h"
#include "kite.h"
#include "serve_client.h"
#include "serve_dataset.h"
#include "serve_report.h"
#include "util/file.h"
#include "util/json.h"

#define MAX_REFERENCE_BYTES (64u << 20)
/* The failures printed in full; the rest are counted. */
#define MAX_FAILURES_SHOWN 8

typedef struct options {
    const char *host, *tokenizer_dir, *text_path, *dataset, *reference_path, *model, *api_key;
    const char *server, *gpu, *commit, *out_path;
    int port, timeout_seconds;
    size_t wait_seconds;
    size_t input_len, prefix_len, output_len, num_requests, warmup, concurrency;
    bool warmup_given;
    double rate;
    unsigned long long seed;
} options;

static void usage(FILE *f) {
    fprintf(f, "usage: kite-serve-bench --tokenizer DIR --text FILE [options]\n"
               "  --host HOST           the server (127.0.0.1)\n"
               "  --port PORT           (8080)\n"
               "  --dataset NAME        random (prompts of --input-len tokens) or shared-prefix (a common\n"
               "                        --prefix-len system prompt + a --input-len user turn each)\n"
               "  --input-len N         prompt (or user turn) tokens, cut from --text with the tokenizer (256)\n"
               "  --prefix-len N        shared-prefix: the common prompt's tokens (2048)\n"
               "  --output-len N        max_tokens with ignore_eos: every request generates exactly N (128)\n"
               "  --num-requests N      measured requests (64)\n"
               "  --warmup N            requests before the measured ones, not counted (default: --concurrency, or 1)\n"
               "  --concurrency C       at most C requests in flight (closed loop when --rate is not given)\n"
               "  --rate R              open loop: Poisson arrivals at R requests/s (default: all at once)\n"
               "  --seed S              prompts and arrival times (0)\n"
               "  --reference FILE      JSON lines ({\"prompt\" or \"prompt_tokens\", \"text\",\n"
               "                        \"tokens\" or \"max_tokens\"}, such as `kite run --json --ignore-eos`\n"
               "                        prints): each completed greedily must\n"
               "                        give exactly its text, before anything is measured\n"
               "  --model NAME          the request's model (default: the first of GET /v1/models)\n"
               "  --api-key KEY         sent as Authorization: Bearer KEY\n"
               "  --server LABEL        the row's server (default: /v1/models' owned_by)\n"
               "  --gpu NAME, --commit HASH   labels for the row (default unknown)\n"
               "  --timeout S           a read or write stalled S seconds fails the request (600)\n"
               "  --wait S              first wait up to S seconds for GET /health to answer 200 (0: do not wait)\n"
               "  --out FILE            append the row (one JSON line) to FILE\n");
}

static bool parse_size(const char *name, const char *text, size_t min, size_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-' || v < min || v > (unsigned long long)INT_MAX) {
        fprintf(stderr, "kite-serve-bench: %s: '%s' is not an integer from %zu to %d\n", name, text, min, INT_MAX);
        return false;
    }
    *out = (size_t)v;
    return true;
}

static bool parse_options(int argc, char **argv, options *o) {
    *o = (options){.host = "127.0.0.1",
                   .dataset = "random",
                   .port = 8080,
                   .timeout_seconds = 600,
                   .input_len = 256,
                   .prefix_len = 2048,
                   .output_len = 128,
                   .num_requests = 64,
                   .server = NULL,
                   .gpu = "unknown",
                   .commit = "unknown"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kite-serve-bench: %s needs a value (or is unknown; --help lists the options)\n", a);
            return false;
        }
        const char *v = argv[++i];
        size_t n = 0;
        bool ok = true;
        if (strcmp(a, "--host") == 0)
            o->host = v;
        else if (strcmp(a, "--port") == 0)
            ok = parse_size(a, v, 1, &n) && n <= 65535 && ((o->port = (int)n), true);
        else if (strcmp(a, "--tokenizer") == 0)
            o->tokenizer_dir = v;
        else if (strcmp(a, "--text") == 0)
            o->text_path = v;
        else if (strcmp(a, "--dataset") == 0)
            o->dataset = v;
        else if (strcmp(a, "--input-len") == 0)
            ok = parse_size(a, v, 1, &o->input_len);
        else if (strcmp(a, "--prefix-len") == 0)
            ok = parse_size(a, v, 1, &o->prefix_len);
        else if (strcmp(a, "--output-len") == 0)
            ok = parse_size(a, v, 1, &o->output_len);
        else if (strcmp(a, "--num-requests") == 0)
            ok = parse_size(a, v, 1, &o->num_requests);
        else if (strcmp(a, "--warmup") == 0)
            ok = parse_size(a, v, 0, &o->warmup) && (o->warmup_given = true);
        else if (strcmp(a, "--concurrency") == 0)
            ok = parse_size(a, v, 1, &o->concurrency);
        else if (strcmp(a, "--wait") == 0)
            ok = parse_size(a, v, 0, &o->wait_seconds);
        else if (strcmp(a, "--timeout") == 0)
            ok = parse_size(a, v, 1, &n) && ((o->timeout_seconds = (int)n), true);
        else if (strcmp(a, "--rate") == 0) {
            char *end = NULL;
            errno = 0;
            o->rate = strtod(v, &end);
            ok = !errno && end != v && !*end && isfinite(o->rate) && o->rate > 0;
            if (!ok) fprintf(stderr, "kite-serve-bench: --rate: '%s' is not a positive number of requests/s\n", v);
        } else if (strcmp(a, "--seed") == 0) {
            ok = parse_size(a, v, 0, &n);
            o->seed = n;
        } else if (strcmp(a, "--reference") == 0)
            o->reference_path = v;
        else if (strcmp(a, "--model") == 0)
            o->model = v;
        else if (strcmp(a, "--api-key") == 0)
            o->api_key = v;
        else if (strcmp(a, "--server") == 0)
            o->server = v;
        else if (strcmp(a, "--gpu") == 0)
            o->gpu = v;
        else if (strcmp(a, "--commit") == 0)
            o->commit = v;
        else if (strcmp(a, "--out") == 0)
            o->out_path = v;
        else {
            fprintf(stderr, "kite-serve-bench: unknown option %s (--help lists them)\n", a);
            return false;
        }
        if (!ok) {
            if (strcmp(a, "--port") == 0) fprintf(stderr, "kite-serve-bench: --port must be 1-65535\n");
            return false;
        }
    }
    if (!o->tokenizer_dir || !o->text_path) {
        fprintf(stderr, "kite-serve-bench: --tokenizer DIR and --text FILE are required (the prompts are cut from "
                        "the text by token count)\n");
        return false;
    }
    if (strcmp(o->dataset, "random") != 0 && strcmp(o->dataset, "shared-prefix") != 0) {
        fprintf(stderr, "kite-serve-bench: --dataset '%s': random or shared-prefix\n", o->dataset);
        return false;
    }
    if (!o->warmup_given) o->warmup = o->concurrency ? o->concurrency : 1;
    return true;
}

/* ---- one phase: calls sent under the concurrency bound and the arrival process, until all are done ---- */

typedef struct phase {
    struct event_base *base;
    serve_pool *pool;
    serve_call *calls;
    size_t n;
    size_t next;     /* the next call to start */
    size_t released; /* calls whose arrival time has come */
    size_t in_flight, finished;
    size_t cap;  /* the most in flight; SIZE_MAX: none */
    double rate; /* arrivals per second; 0: all at once */
    serve_rng *rng;
    struct event *arrival;
    bool start_failed;
    double started_at, ended_at;
} phase;

static void phase_on_done(serve_call *call, void *arg);

static void phase_pump(phase *p) {
    while (!p->start_failed && p->next < p->released && p->in_flight < p->cap) {
        serve_call *call = &p->calls[p->next++];
        p->in_flight++;
        if (!serve_pool_start(p->pool, call, phase_on_done, p)) {
            p->start_failed = true;
            event_base_loopbreak(p->base);
        }
    }
}

static void phase_schedule_arrival(phase *p) {
    /* Exponential gaps: a Poisson process of the given rate. */
    double gap = -log(serve_rng_uniform(p->rng)) / p->rate;
    struct timeval tv = {.tv_sec = (time_t)gap, .tv_usec = (suseconds_t)((gap - floor(gap)) * 1e6)};
    if (event_add(p->arrival, &tv) != 0) {
        fprintf(stderr, "kite-serve-bench: event_add failed scheduling an arrival\n");
        p->start_failed = true;
        event_base_loopbreak(p->base);
    }
}

static void phase_on_arrival(evutil_socket_t fd, short what, void *arg) {
    phase *p = arg;
    p->released++;
    phase_pump(p);
    if (p->released < p->n) phase_schedule_arrival(p);
}

static void phase_on_done(serve_call *call, void *arg) {
    phase *p = arg;
    p->in_flight--;
    p->finished++;
    if (p->finished == p->n) {
        p->ended_at = serve_now();
        event_base_loopbreak(p->base);
        return;
    }
    phase_pump(p);
}

/* Runs calls[0..n) to their end; false when one could not even be started (the message is on stderr). */
static bool phase_run(struct event_base *base, serve_pool *pool, serve_call *calls, size_t n, size_t cap, double rate,
                      serve_rng *rng, double *duration) {
    phase p = {
        .base = base, .pool = pool, .calls = calls, .n = n, .cap = cap ? cap : SIZE_MAX, .rate = rate, .rng = rng};
    if (n == 0) return true;
    if (rate > 0) {
        p.arrival = evtimer_new(base, phase_on_arrival, &p);
        if (!p.arrival) {
            fprintf(stderr, "kite-serve-bench: evtimer_new failed\n");
            return false;
        }
    }
    p.started_at = serve_now();
    p.released = rate > 0 ? 1 : n;
    phase_pump(&p);
    if (rate > 0 && n > 1 && !p.start_failed) phase_schedule_arrival(&p);
    if (!p.start_failed && event_base_dispatch(base) < 0) {
        fprintf(stderr, "kite-serve-bench: the event loop failed\n");
        p.start_failed = true;
    }
    if (p.arrival) event_free(p.arrival);
    if (!p.start_failed && p.finished != n) {
        fprintf(stderr, "kite-serve-bench: the event loop ended with %zu of %zu requests done\n", p.finished, n);
        return false;
    }
    if (duration) *duration = p.ended_at - p.started_at;
    return !p.start_failed;
}

/* ---- requests and the gate ---- */

/* The completion body; `prompt_json` is already JSON (a string or an array of ids). */
static char *completion_body(const char *model, const char *prompt_json, size_t max_tokens, size_t *length) {
    text_builder b = {0};
    text_builder_puts(&b, "{\"model\":");
    python_json_string(&b, model, strlen(model));
    text_builder_printf(&b,
                        ",\"prompt\":%s,\"max_tokens\":%zu,\"temperature\":0,\"ignore_eos\":true,"
                        "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                        prompt_json, max_tokens);
    return text_builder_take(&b, length);
}

static char *text_prompt_body(const char *model, const char *prompt, size_t max_tokens, size_t *length) {
    text_builder p = {0};
    python_json_string(&p, prompt, strlen(prompt));
    char *json = text_builder_take(&p, NULL);
    if (!json) return NULL;
    char *body = completion_body(model, json, max_tokens, length);
    free(json);
    return body;
}

typedef struct gate {
    size_t failures;
} gate;

static void gate_fail(gate *g, const char *phase_name, size_t index, const char *format, ...)
    __attribute__((format(printf, 4, 5)));
static void gate_fail(gate *g, const char *phase_name, size_t index, const char *format, ...) {
    if (g->failures++ >= MAX_FAILURES_SHOWN) return;
    fprintf(stderr, "kite-serve-bench: FAILED %s request %zu: ", phase_name, index);
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
}

/* Whether one finished call is a complete greedy completion of exactly `max_tokens` tokens (and, when `expected`
 * is not NULL, of exactly that text). */
static bool gate_check(gate *g, const char *phase_name, size_t index, const serve_call *c, size_t max_tokens,
                       const char *expected, size_t expected_length) {
    const serve_stream *e = &c->events;
    if (c->transport_error[0]) {
        gate_fail(g, phase_name, index, "%s", c->transport_error);
    } else if (c->status != 200) {
        const char *body = c->response.data ? c->response.data : "";
        gate_fail(g, phase_name, index, "HTTP %d: %.300s", c->status, body);
    } else if (e->failed) {
        gate_fail(g, phase_name, index, "%s", e->error);
    } else if (strcmp(e->finish_reason, "length") != 0) {
        gate_fail(g, phase_name, index, "finish_reason \"%s\", not \"length\" (max_tokens %zu with ignore_eos)",
                  e->finish_reason[0] ? e->finish_reason : "(none)", max_tokens);
    } else if (!e->has_usage) {
        gate_fail(g, phase_name, index, "no usage in the stream (stream_options.include_usage was asked)");
    } else if (e->completion_tokens != (int64_t)max_tokens) {
        gate_fail(g, phase_name, index, "usage.completion_tokens %lld, not max_tokens %zu",
                  (long long)e->completion_tokens, max_tokens);
    } else if (e->n_chunk_times == 0) {
        gate_fail(g, phase_name, index, "no chunk carried a token (no first token to time)");
    } else if (expected && (e->text.length != expected_length ||
                            (expected_length && memcmp(e->text.data, expected, expected_length) != 0))) {
        size_t at = 0;
        while (at < e->text.length && at < expected_length && e->text.data[at] == expected[at])
            at++;
        gate_fail(g, phase_name, index,
                  "the completion differs from the reference at byte %zu (%zu bytes, the "
                  "reference's %zu)",
                  at, e->text.length, expected_length);
    } else {
        return true;
    }
    return false;
}

/* ---- the reference file ---- */

typedef struct reference {
    char *body;
    size_t body_length, max_tokens;
    char *text;
    size_t text_length;
} reference;

static bool reference_line(const char *path, int line_number, const char *line, size_t length, const char *model,
                           reference *r) {
    json_error error;
    json_document *d = json_parse(line, length, &error);
    if (!d) {
        fprintf(stderr, "kite-serve-bench: --reference %s:%d: %s\n", path, line_number, error.message);
        return false;
    }
    const json_value *root = json_root(d);
    const json_value *prompt = json_object_member(root, "prompt");
    const json_value *ids = json_object_member(root, "prompt_tokens");
    const json_value *text = json_object_member(root, "text");
    const json_value *tokens = json_object_member(root, "tokens");
    const json_value *max_tokens = json_object_member(root, "max_tokens");
    const json_value *finish = json_object_member(root, "finish_reason");
    const char *problem = NULL;
    int64_t k = 0;
    if (!json_is_object(root))
        problem = "not a JSON object";
    else if (!json_is_string(text))
        problem = "no string \"text\"";
    else if (!json_is_string(prompt) && !json_is_array(ids))
        problem = "no \"prompt\" string or \"prompt_tokens\" array";
    else if (json_is_array(tokens))
        k = (int64_t)tokens->length;
    else if (!json_get_int64(max_tokens, &k))
        problem = "no \"tokens\" array or integer \"max_tokens\"";
    if (!problem && k < 1) problem = "no tokens to generate";
    if (!problem && finish && !(json_is_string(finish) && strcmp(finish->as.string, "length") == 0))
        problem = "finish_reason is not \"length\" (make it with --ignore-eos, so that the server, which ignores "
                  "eos, generates the same tokens)";
    text_builder p = {0};
    if (!problem && json_is_string(prompt)) {
        python_json_string(&p, prompt->as.string, prompt->length);
    } else if (!problem) {
        text_builder_putc(&p, '[');
        for (size_t i = 0; i < ids->length && !problem; i++) {
            int64_t id = 0;
            if (!json_get_int64(&ids->as.items[i], &id) || id < 0 || id > INT32_MAX)
                problem = "a prompt token is not a token id";
            text_builder_printf(&p, "%s%lld", i ? "," : "", (long long)id);
        }
        text_builder_putc(&p, ']');
    }
    if (problem) {
        fprintf(stderr, "kite-serve-bench: --reference %s:%d: %s\n", path, line_number, problem);
        text_builder_free(&p);
        json_free(d);
        return false;
    }
    char *prompt_json = text_builder_take(&p, NULL);
    r->max_tokens = (size_t)k;
    r->body = prompt_json ? completion_body(model, prompt_json, r->max_tokens, &r->body_length) : NULL;
    free(prompt_json);
    r->text = malloc(text->length + 1);
    if (r->text) {
        memcpy(r->text, text->as.string, text->length + 1);
        r->text_length = text->length;
    }
    json_free(d);
    if (!r->body || !r->text) {
        fprintf(stderr, "kite-serve-bench: out of memory reading --reference\n");
        return false;
    }
    return true;
}

static bool reference_load(const char *path, const char *model, reference **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    char *all = NULL;
    size_t length = 0;
    if (file_read_all(path, MAX_REFERENCE_BYTES, KITE_ERROR_IO, &all, &length) != KITE_OK) {
        fprintf(stderr, "kite-serve-bench: --reference: %s\n", kite_last_error());
        return false;
    }
    size_t capacity = 0, n = 0;
    reference *refs = NULL;
    bool ok = true;
    int line_number = 0;
    for (char *line = all; ok && line < all + length;) {
        char *end = memchr(line, '\n', (size_t)(all + length - line));
        if (!end) end = all + length;
        line_number++;
        size_t line_length = (size_t)(end - line);
        bool blank = true;
        for (size_t i = 0; i < line_length; i++)
            blank = blank && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r');
        if (!blank) {
            if (n == capacity) {
                capacity = capacity ? 2 * capacity : 8;
                reference *grown = realloc(refs, capacity * sizeof *grown);
                if (!grown) {
                    fprintf(stderr, "kite-serve-bench: out of memory reading --reference\n");
                    ok = false;
                    break;
                }
                refs = grown;
            }
            refs[n] = (reference){0};
            ok = reference_line(path, line_number, line, line_length, model, &refs[n]);
            n++;
        }
        line = end + 1;
    }
    free(all);
    if (ok && n == 0) {
        fprintf(stderr, "kite-serve-bench: --reference %s has no lines\n", path);
        ok = false;
    }
    if (!ok) {
        for (size_t i = 0; i < n; i++)
            free(refs[i].body), free(refs[i].text);
        free(refs);
        return false;
    }
    *out = refs;
    *n_out = n;
    return true;
}

/* ---- the server ---- */

/* Polls GET /health every 100 ms until it answers 200 (a server loading its model answers 503, one not yet
 * listening refuses the connection), for at most `seconds`. */
static bool wait_healthy(struct event_base *base, serve_pool *pool, size_t seconds) {
    const double deadline = serve_now() + (double)seconds;
    for (;;) {
        serve_call call = {.method = "GET", .path = "/health"};
        if (!phase_run(base, pool, &call, 1, 1, 0, NULL, NULL)) return false;
        const int status = call.status;
        char last[200];
        if (call.transport_error[0]) {
            snprintf(last, sizeof last, "%s", call.transport_error);
        } else {
            snprintf(last, sizeof last, "HTTP %d", status);
        }
        serve_call_clear(&call);
        if (status == 200) return true;
        if (serve_now() >= deadline) {
            fprintf(stderr, "kite-serve-bench: GET /health did not answer 200 within %zu s (last: %s)\n", seconds,
                    last);
            return false;
        }
        struct timespec pause = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
        if (nanosleep(&pause, NULL) != 0 && errno != EINTR) {
            perror("kite-serve-bench: nanosleep");
            return false;
        }
    }
}

/* GET /v1/models: the first model's id and owned_by (malloc'd), so that requests name what the server serves. */
static bool query_models(struct event_base *base, serve_pool *pool, char **id, char **owned_by) {
    serve_call call = {.method = "GET", .path = "/v1/models"};
    if (!phase_run(base, pool, &call, 1, 1, 0, NULL, NULL)) return false;
    bool ok = false;
    if (call.transport_error[0]) {
        fprintf(stderr, "kite-serve-bench: GET /v1/models: %s\n", call.transport_error);
    } else if (call.status != 200) {
        fprintf(stderr, "kite-serve-bench: GET /v1/models: HTTP %d: %.300s\n", call.status,
                call.response.data ? call.response.data : "");
    } else {
        json_error error;
        json_document *d = json_parse(call.response.data ? call.response.data : "", call.response.length, &error);
        const json_value *data = d ? json_object_member(json_root(d), "data") : NULL;
        const json_value *first = json_is_array(data) && data->length > 0 ? &data->as.items[0] : NULL;
        const json_value *v_id = json_object_member(first, "id");
        const json_value *v_owner = json_object_member(first, "owned_by");
        if (json_is_string(v_id)) {
            *id = strdup(v_id->as.string);
            *owned_by = strdup(json_is_string(v_owner) ? v_owner->as.string : "unknown");
            ok = *id && *owned_by;
            if (!ok) fprintf(stderr, "kite-serve-bench: out of memory\n");
        } else {
            fprintf(stderr, "kite-serve-bench: GET /v1/models: no data[0].id in %.300s\n",
                    call.response.data ? call.response.data : "");
        }
        json_free(d);
    }
    serve_call_clear(&call);
    return ok;
}

/* The command line as a shell would take it back: an argument with anything but [A-Za-z0-9_./=:,+-] in
 * single quotes. */
static char *join_command(int argc, char **argv) {
    text_builder b = {0};
    text_builder_puts(&b, "kite-serve-bench");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool plain = a[0] != '\0';
        for (const char *c = a; *c && plain; c++)
            plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                    strchr("_./=:,+-", *c) != NULL;
        text_builder_putc(&b, ' ');
        if (plain) {
            text_builder_puts(&b, a);
            continue;
        }
        text_builder_putc(&b, '\'');
        for (const char *c = a; *c; c++) {
            if (*c == '\'') {
                text_builder_puts(&b, "'\\''");
            } else {
                text_builder_putc(&b, *c);
            }
        }
        text_builder_putc(&b, '\'');
    }
    return text_builder_take(&b, NULL);
}

/* Bodies for prompts[0..n) into calls[0..n). */
static bool make_calls(const char *model, char **prompts, size_t n, size_t max_tokens, serve_call *calls) {
    for (size_t i = 0; i < n; i++) {
        size_t length = 0;
        char *body = text_prompt_body(model, prompts[i], max_tokens, &length);
        if (!body) {
            fprintf(stderr, "kite-serve-bench: out of memory building requests\n");
            return false;
        }
        calls[i] = (serve_call){
            .method = "POST", .path = "/v1/completions", .body = body, .body_length = length, .stream = true};
    }
    return true;
}

static void free_calls(serve_call *calls, size_t n) {
    if (!calls) return;
    for (size_t i = 0; i < n; i++) {
        serve_call_clear(&calls[i]);
        free((char *)calls[i].body);
    }
    free(calls);
}

int main(int argc, char **argv) {
    options o;
    if (!parse_options(argc, argv, &o)) return 2;
    const serve_dataset_kind kind =
        strcmp(o.dataset, "random") == 0 ? SERVE_DATASET_RANDOM : SERVE_DATASET_SHARED_PREFIX;
    int rc = 1;
    kite_tokenizer *tokenizer = NULL;
    serve_corpus corpus = {0};
    char **prompts = NULL;
    serve_call *calls = NULL, *ref_calls = NULL;
    reference *refs = NULL;
    size_t n_refs = 0;
    char *model = NULL, *owned_by = NULL, *command = NULL;
    struct event_base *base = NULL;
    serve_pool *pool = NULL;
    const size_t n_all = o.warmup + o.num_requests;

    if (kite_tokenizer_load(o.tokenizer_dir, &tokenizer) != KITE_OK) {
        fprintf(stderr, "kite-serve-bench: --tokenizer %s: %s\n", o.tokenizer_dir, kite_last_error());
        goto done;
    }
    if (!serve_corpus_load(&corpus, tokenizer, o.text_path)) goto done;
    serve_rng rng = {.state = o.seed};
    if (!serve_dataset_make(kind, &corpus, tokenizer, n_all, o.input_len, o.prefix_len, &rng, &prompts)) goto done;

    base = event_base_new();
    pool = base ? serve_pool_new(base, o.host, o.port, o.timeout_seconds, o.api_key) : NULL;
    if (!pool) {
        fprintf(stderr, "kite-serve-bench: cannot set up libevent\n");
        goto done;
    }
    if (o.wait_seconds && !wait_healthy(base, pool, o.wait_seconds)) goto done;
    if (!query_models(base, pool, &model, &owned_by)) goto done;
    if (o.model) {
        free(model);
        model = strdup(o.model);
        if (!model) goto done;
    }
    if (o.reference_path && !reference_load(o.reference_path, model, &refs, &n_refs)) goto done;

    calls = calloc(n_all, sizeof *calls);
    ref_calls = calloc(n_refs ? n_refs : 1, sizeof *ref_calls);
    if (!calls || !ref_calls || !make_calls(model, prompts, n_all, o.output_len, calls)) {
        fprintf(stderr, "kite-serve-bench: out of memory\n");
        goto done;
    }
    gate g = {0};
    /* The reference prompts one at a time: the comparison is with a single-sequence run. */
    for (size_t i = 0; i < n_refs; i++) {
        ref_calls[i] = (serve_call){.method = "POST",
                                    .path = "/v1/completions",
                                    .body = refs[i].body,
                                    .body_length = refs[i].body_length,
                                    .stream = true};
        if (!phase_run(base, pool, &ref_calls[i], 1, 1, 0, NULL, NULL)) goto done;
        gate_check(&g, "reference", i, &ref_calls[i], refs[i].max_tokens, refs[i].text, refs[i].text_length);
    }
    const size_t warmup_cap = o.concurrency ? o.concurrency : o.warmup;
    if (!g.failures && !phase_run(base, pool, calls, o.warmup, warmup_cap, 0, NULL, NULL)) goto done;
    for (size_t i = 0; i < o.warmup && !g.failures; i++)
        gate_check(&g, "warm-up", i, &calls[i], o.output_len, NULL, 0);
    double duration = 0;
    if (!g.failures && !phase_run(base, pool, calls + o.warmup, o.num_requests, o.concurrency, o.rate, &rng, &duration))
        goto done;
    for (size_t i = 0; i < o.num_requests && !g.failures; i++)
        gate_check(&g, "measured", i, &calls[o.warmup + i], o.output_len, NULL, 0);
    if (g.failures) {
        if (g.failures > MAX_FAILURES_SHOWN)
            fprintf(stderr, "kite-serve-bench: ... %zu more failures\n", g.failures - MAX_FAILURES_SHOWN);
        fprintf(stderr, "kite-serve-bench: the gate failed: no figures\n");
        goto done;
    }
    command = join_command(argc, argv);
    serve_run_info info = {.server = o.server ? o.server : owned_by,
                           .model = model,
                           .dataset = o.dataset,
                           .input_len = o.input_len,
                           .prefix_len = kind == SERVE_DATASET_SHARED_PREFIX ? o.prefix_len : 0,
                           .output_len = o.output_len,
                           .concurrency = o.concurrency,
                           .rate = o.rate,
                           .num_requests = o.num_requests,
                           .warmup = o.warmup,
                           .reference_prompts = n_refs,
                           .seed = o.seed,
                           .gpu = o.gpu,
                           .commit = o.commit,
                           .command = command ? command : "?"};
    if (serve_report(&info, calls + o.warmup, o.num_requests, duration, o.out_path)) rc = 0;

done:
    free_calls(calls, n_all);
    if (ref_calls) {
        for (size_t i = 0; i < n_refs; i++)
            serve_call_clear(&ref_calls[i]);
        free(ref_calls);
    }
    for (size_t i = 0; i < n_refs; i++)
        free(refs[i].body), free(refs[i].text);
    free(refs);
    serve_pool_free(pool);
    if (base) event_base_free(base);
    serve_dataset_free(prompts, n_all);
    serve_corpus_free(&corpus);
    kite_tokenizer_free(tokenizer);
    free(model), free(owned_by), free(command);
    return rc;
}

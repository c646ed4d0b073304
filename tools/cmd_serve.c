/* kite serve: an OpenAI-compatible HTTP server (POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
 * GET /v1/models/{id}, GET /health, POST /tokenize, POST /detokenize) on libevent's evhttp.
 *
 * Two threads: this one runs the event loop (every socket, parsing, tokenizing, chat rendering and writing the
 * responses: tools/serve/router.h), and the engine thread loads the model and runs continuous batching over
 * every request (tools/serve/engine_link.h). The engine thread never waits on a socket; it hands output back
 * through a queue and an event the loop wakes on.
 */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "kite.h"
#include "serve/engine_link.h"
#include "serve/http_server.h"
#include "serve/router.h"

enum {
    SERVE_MODEL = 1,
    SERVE_HOST,
    SERVE_PORT,
    SERVE_NAME,
    SERVE_API_KEY,
    SERVE_CORS_ORIGIN,
    SERVE_MAX_QUEUE,
    SERVE_MAX_CONNECTIONS,
    SERVE_TIMEOUT,
    SERVE_DRAIN_TIMEOUT,
};

static const cli_option serve_options[] = {
    {SERVE_MODEL, "model", 'm', "DIR", "the checkpoint directory (config.json, safetensors, tokenizer.json)", false},
    {SERVE_HOST, "host", 0, "HOST", "the address or host name to listen on, IPv4 or IPv6 (default 127.0.0.1)", false},
    {SERVE_PORT, "port", 0, "PORT", "the TCP port (default 8080; 0 picks a free one)", false},
    {SERVE_NAME, "served-model-name", 0, "NAME", "the model's name in responses (default: the directory's name)",
     false},
    {SERVE_API_KEY, "api-key", 0, "KEY", "require \"Authorization: Bearer KEY\" on /v1/* (default: $KITE_API_KEY)",
     false},
    {SERVE_CORS_ORIGIN, "cors-origin", 0, "ORIGIN", "answer CORS preflights and allow this origin (or *)", false},
    {SERVE_MAX_QUEUE, "max-queue", 0, "N", "requests waiting beyond the running batch before 503 (default 1024)",
     false},
    {SERVE_MAX_CONNECTIONS, "max-connections", 0, "N", "open client connections at most (default 1024)", false},
    {SERVE_TIMEOUT, "timeout", 0, "S", "close a connection idle or stalled for S seconds (default 60)", false},
    {SERVE_DRAIN_TIMEOUT, "drain-timeout", 0, "S",
     "on SIGTERM, let running requests finish for S seconds, then cancel them (default 30)", false},
    CLI_ENGINE_OPTIONS,
};

static const cli_command serve_command = {
    "serve", "--model DIR [--host 127.0.0.1] [--port 8080] [options]",
    "  POST /v1/completions (OpenAI-compatible: prompt as text or token ids, max_tokens, temperature, top_p,\n"
    "  top_k, min_p, repetition_penalty, seed, stop, stream, stream_options.include_usage, ignore_eos),\n"
    "  POST /v1/chat/completions (messages, tools, tool_choice auto|none|required|a function, logprobs,\n"
    "  top_logprobs, chat_template_kwargs such as enable_thinking; the answer's reasoning_content and tool_calls\n"
    "  parsed; sampling not given follows generation_config.json), GET /v1/models, GET /v1/models/{id},\n"
    "  GET /health (503 while the model loads),\n"
    "  POST /tokenize, POST /detokenize (vLLM's shapes).\n"
    "  \"listening on HOST:PORT\" is printed on stdout once the socket listens; the model loads after it.\n",
    serve_options, sizeof serve_options / sizeof serve_options[0]};

#define MAX_HEADER_BYTES (16 << 10)
#define MAX_BODY_BYTES (16 << 20)
#define MAX_OUTPUT_BYTES (8 << 20)

typedef struct serve_config {
    const char *model_dir, *host, *name;
    long long port, max_queue, max_connections, timeout, drain_timeout;
    const char *api_key, *cors_origin;
    kite_load_params load;
    kite_engine_params engine;
} serve_config;

/* A value that goes into an HTTP header (or is compared with one) must be one line of visible text. */
static bool header_safe(const char *option, const char *value) {
    for (const unsigned char *c = (const unsigned char *)value; *c; c++) {
        if (*c < 0x20 || *c == 0x7f) {
            fprintf(stderr, "kite serve: --%s: control characters cannot go into an HTTP header\n", option);
            return false;
        }
    }
    return true;
}

/* Parses the command line; 0 to go on, else the exit code. */
static int parse_arguments(int argc, char **argv, serve_config *c) {
    cli_parser parser;
    cli_parser_init(&parser, &serve_command, argc, argv);
    for (int id; (id = cli_parser_next(&parser)) != CLI_END;) {
        switch (id) {
        case CLI_HELP: return -1;
        case CLI_ERROR: return 2;
        case SERVE_MODEL: c->model_dir = parser.value; break;
        case SERVE_HOST: c->host = parser.value; break;
        case SERVE_PORT:
            if (!cli_value_int(&parser, 0, 65535, &c->port)) return 2;
            break;
        case SERVE_NAME: c->name = parser.value; break;
        case SERVE_API_KEY: c->api_key = parser.value; break;
        case SERVE_CORS_ORIGIN: c->cors_origin = parser.value; break;
        case SERVE_MAX_QUEUE:
            if (!cli_value_int(&parser, 0, 1 << 20, &c->max_queue)) return 2;
            break;
        case SERVE_MAX_CONNECTIONS:
            if (!cli_value_int(&parser, 1, 1 << 20, &c->max_connections)) return 2;
            break;
        case SERVE_TIMEOUT:
            if (!cli_value_int(&parser, 1, 86400, &c->timeout)) return 2;
            break;
        case SERVE_DRAIN_TIMEOUT:
            if (!cli_value_int(&parser, 0, 86400, &c->drain_timeout)) return 2;
            break;
        default:
            if (cli_take_engine_option(&parser, &c->load, &c->engine) != CLI_OPTION_TAKEN) return 2;
        }
    }
    if (parser.first_argument < argc) {
        fprintf(stderr, "kite serve: unexpected argument '%s'\n", argv[parser.first_argument]);
        cli_print_usage(&serve_command, stderr);
        return 2;
    }
    if (!c->model_dir) {
        fprintf(stderr, "kite serve: --model DIR is required\n");
        cli_print_usage(&serve_command, stderr);
        return 2;
    }
    if (!c->api_key) {
        const char *from_environment = getenv("KITE_API_KEY");
        if (from_environment && *from_environment) c->api_key = from_environment;
    }
    if (c->api_key && !*c->api_key) {
        fprintf(stderr, "kite serve: --api-key: the key is empty\n");
        return 2;
    }
    if (c->cors_origin && !*c->cors_origin) {
        fprintf(stderr, "kite serve: --cors-origin: the origin is empty (give one, or *)\n");
        return 2;
    }
    if ((c->api_key && !header_safe("api-key", c->api_key)) ||
        (c->cors_origin && !header_safe("cors-origin", c->cors_origin)))
        return 2;
    if (!c->name) {
        const char *slash = strrchr(c->model_dir, '/');
        c->name = slash && slash[1] ? slash + 1 : c->model_dir;
    }
    return 0;
}

static void on_stop_signal(evutil_socket_t signal_number, short what, void *argument) {
    (void)signal_number;
    (void)what;
    router_start_drain(argument);
}

static void wake_loop(void *argument) {
    event_active(argument, EV_READ, 0);
}

int cmd_serve(int argc, char **argv) {
    serve_config config = {.host = "127.0.0.1", .port = 8080, .max_queue = 1024, .max_connections = 1024,
                           .timeout = 60, .drain_timeout = 30, .load = kite_load_params_default(),
                           .engine = kite_engine_params_default()};
    const int parsed = parse_arguments(argc, argv, &config);
    if (parsed != 0) return parsed < 0 ? 0 : parsed;

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
    /* glibc gives a thread that allocates while the others hold the arenas one of its own, up to 8 per core, and
     * each arena keeps its own share of a burst's fragments: pages that hold a live chunk, which malloc_trim
     * cannot give back. The requests' memory comes from two threads, this loop and the engine thread (the
     * backend's workers allocate no more than scratch), so two arenas serve them without contention. (Under
     * AddressSanitizer malloc is the sanitizer's, which refuses the option.) The bound only saves memory, so a
     * refusal is said and the server goes on. */
    if (mallopt(M_ARENA_MAX, 2) != 1)
        fprintf(stderr, "kite serve: glibc refused to bound its malloc arenas (mallopt M_ARENA_MAX 2); "
                        "memory freed after a burst may stay with the process longer\n");
#endif
    /* The engine thread makes the loop's wake event active: libevent's locks must be on before the base. */
    if (evthread_use_pthreads() != 0) {
        fprintf(stderr, "kite serve: cannot enable libevent's thread support\n");
        return 1;
    }
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) { /* a client that hangs up is a failed write, not the end */
        fprintf(stderr, "kite serve: cannot ignore SIGPIPE\n");
        return 1;
    }
    struct event_base *base = event_base_new();
    if (!base) {
        fprintf(stderr, "kite serve: cannot create the event loop\n");
        return 1;
    }
    engine_link link = {.model_dir = config.model_dir, .load = config.load, .engine_params = config.engine};
    http_server server = {0};
    router rt = {
        .options = {.model_name = config.name, .api_key = config.api_key, .cors_origin = config.cors_origin,
                    .max_queue = (int)config.max_queue, .drain_seconds = (int)config.drain_timeout,
                    .access_log = stderr},
        .server = &server,
        .link = &link,
        .base = base,
    };
    server.on_hangup = router_on_hangup;
    server.argument = &rt;
    const http_limits limits = {.max_header_bytes = MAX_HEADER_BYTES, .max_body_bytes = MAX_BODY_BYTES,
                                .timeout_seconds = (int)config.timeout, .max_connections = (int)config.max_connections,
                                .max_output_bytes = MAX_OUTPUT_BYTES};
    int code = 1;
    struct event *term = NULL, *interrupt = NULL;
    rt.wake = event_new(base, -1, 0, router_on_wake, &rt);
    rt.idle_trim = evtimer_new(base, router_on_idle, &rt);
    term = evsignal_new(base, SIGTERM, on_stop_signal, &rt);
    interrupt = evsignal_new(base, SIGINT, on_stop_signal, &rt);
    if (!rt.wake || !rt.idle_trim || !term || !interrupt || evsignal_add(term, NULL) != 0 || evsignal_add(interrupt, NULL) != 0) {
        fprintf(stderr, "kite serve: cannot set up the event loop's events\n");
        goto done;
    }
    link.wake = wake_loop;
    link.wake_argument = rt.wake;
    if (!http_server_open(&server, base, config.host, (int)config.port, &limits, router_handle, &rt)) goto done;
    printf("listening on %s\n", server.address);
    fflush(stdout);
    if (!engine_link_start(&link)) goto done;
    if (event_base_dispatch(base) != 0) fprintf(stderr, "kite serve: the event loop failed\n");
    code = rt.load_failed ? 1 : 0;
done:
    http_server_close(&server);
    engine_link_stop(&link);
    if (code == 0) {
        const kite_engine_stats stats = link.stats;
        const kite_engine_timings t = link.timings;
        fprintf(stderr, "kite serve: stopped; KV blocks free %d of %d\n", stats.kv_blocks_free, stats.kv_blocks_total);
        /* Where the engine's time went: steps that read prompt tokens (beside the generating rows) run the general
         * path, decode-only steps the batched one. */
        fprintf(stderr,
                "kite serve: engine steps: %lld reading prompts (%.3f s; %lld prompt tokens, %lld generated beside "
                "them), %lld decode only (%.3f s; %lld tokens)\n",
                (long long)t.prefill_steps, t.prefill_seconds, (long long)t.prefill_tokens,
                (long long)t.prefill_step_generated, (long long)t.decode_steps, t.decode_seconds,
                (long long)t.decode_tokens);
    }
    if (rt.drain_timer) event_free(rt.drain_timer);
    if (rt.flush_timer) event_free(rt.flush_timer);
    if (term) event_free(term);
    if (interrupt) event_free(interrupt);
    if (rt.wake) event_free(rt.wake);
    if (rt.idle_trim) event_free(rt.idle_trim);
    event_base_free(base);
    return code;
}

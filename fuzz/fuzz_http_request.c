/* libFuzzer: the input is what one client sends on a connection to kite serve's HTTP layer — evhttp's parsing,
 * the router (paths, methods, the API key "k", CORS), the body parsers and the generation path — on the tiny
 * checkpoint (CPU backend, one thread, a 64-token context). The engine runs on this thread, between rounds of the
 * event loop, so a run is repeatable. The client then hangs up. Whatever the input: no crash or leak, no
 * request left in flight, every connection closed and every KV block back in the pool. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "kite.h"
#include "serve/engine_link.h"
#include "serve/http_server.h"
#include "serve/router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ROUNDS 4000
#define MAX_ENGINE_STEPS 48 /* a step costs milliseconds (the tiny model's lm_head is Qwen3's vocabulary) */
#define IDLE_ROUNDS 5

static struct {
    struct event_base *base;
    engine_link link;
    http_server server;
    router router;
    int port;
} fuzz;

static void wake_loop(void *argument) {
    event_active(argument, EV_READ, 0);
}

static void fail(const char *what) {
    fprintf(stderr, "fuzz_http_request: %s\n", what);
    abort();
}

static void set_up(void) {
    fuzz.base = event_base_new();
    if (!fuzz.base) fail("event_base_new");
    fuzz.link.model_dir = KITE_FUZZ_TINY;
    fuzz.link.load = kite_load_params_default();
    fuzz.link.load.backend = KITE_BACKEND_CPU;
    fuzz.link.load.n_threads = 1;
    fuzz.link.engine_params = kite_engine_params_default();
    fuzz.link.engine_params.max_sequences = 4;
    fuzz.link.engine_params.max_context = 64;
    fuzz.link.engine_params.kv_block_size = 16;
    fuzz.router = (router){
        /* no access log: a line per request would bury libFuzzer's own output */
        .options = {.model_name = "tiny", .api_key = "k", .cors_origin = "*", .max_queue = 2, .drain_seconds = 1},
        .server = &fuzz.server,
        .link = &fuzz.link,
        .base = fuzz.base,
    };
    fuzz.router.wake = event_new(fuzz.base, -1, 0, router_on_wake, &fuzz.router);
    if (!fuzz.router.wake) fail("event_new");
    fuzz.link.wake = wake_loop;
    fuzz.link.wake_argument = fuzz.router.wake;
    fuzz.server.on_hangup = router_on_hangup;
    fuzz.server.argument = &fuzz.router;
    if (!engine_link_init(&fuzz.link) || !engine_link_load(&fuzz.link)) fail("cannot load the tiny checkpoint");
    const http_limits limits = {.max_header_bytes = 4096, .max_body_bytes = 64 << 10, .timeout_seconds = 5,
                                .max_connections = 4, .max_output_bytes = 1 << 20};
    if (!http_server_open(&fuzz.server, fuzz.base, "127.0.0.1", 0, &limits, router_handle, &fuzz.router))
        fail("cannot listen");
    const char *colon = strrchr(fuzz.server.address, ':');
    fuzz.port = colon ? atoi(colon + 1) : 0;
    (void)event_base_loop(fuzz.base, EVLOOP_NONBLOCK); /* the load's wake */
}

/* Reads and drops what the server answered; true when something came. *closed once the server closed. */
static bool drain_client(int fd, bool *closed) {
    char buffer[16384];
    bool any = false;
    for (;;) {
        const ssize_t n = recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
        if (n > 0) {
            any = true;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) *closed = true;
        return any;
    }
}

/* Event-loop and engine rounds until nothing happens for IDLE_ROUNDS rounds (or `until_closed` and every
 * connection is gone). Past MAX_ENGINE_STEPS, whatever runs is cancelled. */
static void settle(int client, bool until_closed, int *steps) {
    for (int round = 0, idle = 0; round < MAX_ROUNDS && idle < IDLE_ROUNDS; round++) {
        bool progress = false, closed = false;
        (void)event_base_loop(fuzz.base, EVLOOP_NONBLOCK);
        if (client >= 0) progress |= drain_client(client, &closed);
        const bool busy = fuzz.router.in_flight > 0;
        if (busy) {
            if (++*steps == MAX_ENGINE_STEPS) engine_link_cancel_everything(&fuzz.link);
            (void)engine_link_work(&fuzz.link, false);
            progress = true;
        }
        if (until_closed && fuzz.server.n_connections > 0) progress = true;
        idle = progress ? 0 : idle + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fuzz.base) set_up();
    int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fuzz.port)};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (client < 0 || connect(client, (struct sockaddr *)&address, sizeof address) != 0) fail("connect");
    for (size_t sent = 0; sent < size;) {
        const ssize_t n = send(client, data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break; /* the server closed */
        int steps_unused = 0;
        settle(client, false, &steps_unused); /* let the server read */
    }
    int steps = 0;
    settle(client, false, &steps);
    close(client);
    settle(-1, true, &steps);
    if (fuzz.router.in_flight != 0) fail("a request is still in flight after its client left");
    if (fuzz.server.n_connections != 0) fail("a connection is still open after its client left");
    const kite_engine_stats stats = engine_link_get_stats(&fuzz.link);
    if (stats.kv_blocks_free != stats.kv_blocks_total) fail("KV blocks are missing");
    return 0;
}

/* The serving benchmark's figures from the calls of a run that passed the gate, as vLLM's `bench serve` defines
 * them: request and token throughput over the run's wall time; per request the time to first token (TTFT, from
 * sending the request to its first chunk with a token), the time per output token after the first (TPOT,
 * (end-to-end - TTFT) / (completion tokens - 1)) and the end-to-end latency; over all requests the inter-token
 * latencies (ITL, the gaps between a request's successive chunks). Token counts are the server's usage.
 * Percentiles interpolate linearly between order statistics (numpy's default, which vLLM uses). */
#ifndef KITE_BENCH_SERVE_REPORT_H
#define KITE_BENCH_SERVE_REPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "serve_client.h"

typedef struct serve_run_info {
    const char *server;  /* the label of the row: "kite serve", "llama-server" */
    const char *model;   /* the model id the server reported */
    const char *dataset; /* "random" or "shared-prefix" */
    size_t input_len;    /* tokens of each prompt (shared-prefix: of each user turn) */
    size_t prefix_len;   /* shared-prefix: tokens of the common system prompt; else 0 */
    size_t output_len;   /* max_tokens, ignore_eos: every request generates exactly this many */
    size_t concurrency;  /* the most requests in flight; 0: no bound */
    double rate;         /* Poisson arrivals per second; 0: all at once */
    size_t num_requests, warmup, reference_prompts;
    unsigned long long seed;
    const char *gpu, *commit, *command;
} serve_run_info;

/* The linearly interpolated p-th percentile (0..100) of v[0..n), sorted in place; 0 when n is 0. */
double serve_percentile(double *v, size_t n, double p);

/* Prints the table on stdout and, when out_path is not NULL, appends the row (one JSON line) to it. `duration`
 * is the run's wall time in seconds. False with a message on stderr when memory or the file fails. */
bool serve_report(const serve_run_info *info, const serve_call *calls, size_t n, double duration, const char *out_path);

#endif

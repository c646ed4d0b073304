/* kite serve's /metrics: counters and latency histograms of the answered requests (fed from the access-log entry
 * each one gets) and the engine's gauges, in Prometheus' text format, every name prefixed kite_. Loop thread only. */
#ifndef KITE_TOOLS_SERVE_METRICS_H
#define KITE_TOOLS_SERVE_METRICS_H

#include <stdint.h>

#include "kite.h"
#include "serve/access_log.h"
#include "text_buffer.h"

enum {
    METRICS_ENDPOINTS = 8,   /* the endpoints kite serves, and "other" (so a path cannot grow the label set) */
    METRICS_STATUSES = 16,   /* distinct statuses counted per endpoint; more fold into the last one */
    METRICS_BUCKETS = 16,
};

typedef struct metrics_histogram {
    uint64_t counts[METRICS_BUCKETS]; /* per upper bound (metrics.c), not cumulative; the last is +Inf */
    uint64_t count;
    double sum;
} metrics_histogram;

typedef struct serve_metrics {
    struct {
        int status;
        uint64_t count;
    } requests[METRICS_ENDPOINTS][METRICS_STATUSES];
    uint64_t prompt_tokens, generated_tokens;
    metrics_histogram time_to_first_token, time_per_output_token, e2e_latency;
} serve_metrics;

/* Counts one answered request. */
void metrics_record(serve_metrics *m, const access_log_entry *entry);
/* The exposition: the counters, the histograms and the engine's gauges. */
void metrics_render(const serve_metrics *m, const kite_engine_stats *engine, text_buffer *out);

#endif

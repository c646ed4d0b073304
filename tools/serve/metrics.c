/* /metrics (metrics.h). */
#include "serve/metrics.h"

#include <string.h>

static const char *const ENDPOINTS[METRICS_ENDPOINTS] = {
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/tokenize", "/detokenize",
    "other"};

/* Upper bounds in seconds (the last bucket is +Inf): from a millisecond to a minute, as vLLM's latency buckets. */
static const double BOUNDS[METRICS_BUCKETS - 1] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                                   0.25,  0.5,   1.0,  2.5,  5.0,  10.0, 60.0};

static int endpoint_index(const char *path) {
    if (path && strncmp(path, "/v1/models/", 11) == 0) return 2;
    for (int i = 0; i < METRICS_ENDPOINTS - 1; i++)
        if (path && strcmp(path, ENDPOINTS[i]) == 0) return i;
    return METRICS_ENDPOINTS - 1;
}

static void observe(metrics_histogram *h, double seconds) {
    int b = 0;
    while (b < METRICS_BUCKETS - 1 && seconds > BOUNDS[b]) b++;
    h->counts[b]++;
    h->count++;
    h->sum += seconds;
}

void metrics_record(serve_metrics *m, const access_log_entry *entry) {
    const int e = endpoint_index(entry->endpoint);
    int s = 0;
    while (s < METRICS_STATUSES - 1 && m->requests[e][s].count > 0 && m->requests[e][s].status != entry->status) s++;
    m->requests[e][s].status = m->requests[e][s].count > 0 ? m->requests[e][s].status : entry->status;
    m->requests[e][s].count++;
    m->prompt_tokens += entry->prompt_tokens;
    if (entry->generated_tokens > 0) m->generated_tokens += (uint64_t)entry->generated_tokens;
    if (entry->ttft_seconds < 0) return; /* not a generation, or no token came */
    observe(&m->time_to_first_token, entry->ttft_seconds);
    observe(&m->e2e_latency, entry->total_seconds);
    if (entry->generated_tokens > 1)
        observe(&m->time_per_output_token,
                (entry->total_seconds - entry->ttft_seconds) / (double)(entry->generated_tokens - 1));
}

static void histogram(text_buffer *out, const char *name, const char *help, const metrics_histogram *h) {
    text_buffer_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cumulative = 0;
    for (int b = 0; b < METRICS_BUCKETS; b++) {
        cumulative += h->counts[b];
        if (b < METRICS_BUCKETS - 1)
            text_buffer_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, BOUNDS[b], (unsigned long long)cumulative);
        else
            text_buffer_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cumulative);
    }
    text_buffer_printf(out, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

static void gauge(text_buffer *out, const char *name, const char *type, const char *help, long long value) {
    text_buffer_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %lld\n", name, help, name, type, name, value);
}

void metrics_render(const serve_metrics *m, const kite_engine_stats *engine, text_buffer *out) {
    text_buffer_puts(out, "# HELP kite_requests_total Requests answered, by endpoint and HTTP status.\n"
                          "# TYPE kite_requests_total counter\n");
    for (int e = 0; e < METRICS_ENDPOINTS; e++)
        for (int s = 0; s < METRICS_STATUSES && m->requests[e][s].count > 0; s++)
            text_buffer_printf(out, "kite_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", ENDPOINTS[e],
                               m->requests[e][s].status, (unsigned long long)m->requests[e][s].count);
    gauge(out, "kite_prompt_tokens_total", "counter", "Prompt tokens of the answered generation requests.",
          (long long)m->prompt_tokens);
    gauge(out, "kite_generation_tokens_total", "counter", "Tokens generated for the answered requests.",
          (long long)m->generated_tokens);
    histogram(out, "kite_time_to_first_token_seconds", "From a request's arrival to its first token.",
              &m->time_to_first_token);
    histogram(out, "kite_time_per_output_token_seconds", "Mean time between a request's tokens after the first.",
              &m->time_per_output_token);
    histogram(out, "kite_e2e_request_latency_seconds", "From a request's arrival to its last byte.", &m->e2e_latency);
    gauge(out, "kite_requests_running", "gauge", "Requests in the engine's batch.", engine->running);
    gauge(out, "kite_requests_waiting", "gauge",
          "Requests waiting for a place in the batch: queued or preempted in the engine, or a choice held for its "
          "lead's prompt.",
          engine->waiting);
    gauge(out, "kite_kv_blocks_used", "gauge", "KV cache blocks held by requests.",
          (long long)engine->kv_blocks_total - engine->kv_blocks_free);
    gauge(out, "kite_kv_blocks_free", "gauge",
          "KV cache blocks no request holds, kite_kv_blocks_cached included (those are evicted for new ones as needed).",
          engine->kv_blocks_free);
    gauge(out, "kite_kv_blocks_cached", "gauge",
          "Free KV cache blocks that keep an earlier request's prefix for reuse by the prefix cache.",
          engine->kv_blocks_cached);
    gauge(out, "kite_prefix_cache_queries_total", "counter",
          "Prompt tokens looked up in the prefix cache (a preempted request counts again when it resumes).",
          (long long)engine->prefix_cache_queried_tokens);
    gauge(out, "kite_prefix_cache_hits_total", "counter",
          "Prompt tokens found in the prefix cache and not computed.", (long long)engine->prefix_cache_hit_tokens);
    gauge(out, "kite_preemptions_total", "counter", "Requests preempted to free KV blocks.", (long long)engine->preemptions);
}

#include "serve_report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/python_json.h"

static int compare_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double serve_percentile(double *v, size_t n, double p) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, compare_double);
    const double rank = p / 100.0 * (double)(n - 1);
    const size_t lo = (size_t)floor(rank), hi = (size_t)ceil(rank);
    return v[lo] + (v[hi] - v[lo]) * (rank - (double)lo);
}

typedef struct summary {
    double mean, p50, p90, p99;
} summary;

/* Milliseconds; v is sorted. */
static summary summarize(double *v, size_t n) {
    summary s = {0};
    if (n == 0) return s;
    double total = 0;
    for (size_t i = 0; i < n; i++)
        total += v[i];
    s.mean = 1e3 * total / (double)n;
    s.p50 = 1e3 * serve_percentile(v, n, 50);
    s.p90 = 1e3 * serve_percentile(v, n, 90);
    s.p99 = 1e3 * serve_percentile(v, n, 99);
    return s;
}

/* Four decimals are more than any of the figures resolves. */
static void put_number(text_builder *b, const char *key, double value) {
    text_builder_printf(b, ", \"%s\": ", key);
    python_json_float(b, round(value * 1e4) / 1e4);
}

static void put_summary(text_builder *b, const char *name, summary s) {
    char key[64];
    snprintf(key, sizeof key, "%s_ms_mean", name);
    put_number(b, key, s.mean);
    snprintf(key, sizeof key, "%s_ms_p50", name);
    put_number(b, key, s.p50);
    snprintf(key, sizeof key, "%s_ms_p90", name);
    put_number(b, key, s.p90);
    snprintf(key, sizeof key, "%s_ms_p99", name);
    put_number(b, key, s.p99);
}

static void put_string(text_builder *b, const char *key, const char *value) {
    text_builder_printf(b, ", \"%s\": ", key);
    if (value) {
        python_json_string(b, value, strlen(value));
    } else {
        text_builder_puts(b, "null");
    }
}

static bool append_line(const char *path, const char *line, size_t length) {
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "kite-serve-bench: --out %s: %s\n", path, strerror(errno));
        return false;
    }
    bool ok = fwrite(line, 1, length, f) == length && fputc('\n', f) != EOF;
    if (fclose(f) != 0) ok = false;
    if (!ok) fprintf(stderr, "kite-serve-bench: --out %s: writing failed: %s\n", path, strerror(errno));
    return ok;
}

bool serve_report(const serve_run_info *info, const serve_call *calls, size_t n, double duration,
                  const char *out_path) {
    size_t n_itl = 0;
    for (size_t i = 0; i < n; i++)
        n_itl += calls[i].events.n_chunk_times - 1;
    double *ttft = malloc((n ? n : 1) * sizeof *ttft), *tpot = malloc((n ? n : 1) * sizeof *tpot);
    double *e2el = malloc((n ? n : 1) * sizeof *e2el), *itl = malloc((n_itl ? n_itl : 1) * sizeof *itl);
    if (!ttft || !tpot || !e2el || !itl) {
        fprintf(stderr, "kite-serve-bench: out of memory for the figures\n");
        free(ttft), free(tpot), free(e2el), free(itl);
        return false;
    }
    long long input_tokens = 0, output_tokens = 0, prompt_min = 0, prompt_max = 0;
    size_t n_tpot = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        const serve_call *c = &calls[i];
        const serve_stream *e = &c->events;
        input_tokens += e->prompt_tokens;
        output_tokens += e->completion_tokens;
        if (i == 0 || e->prompt_tokens < prompt_min) prompt_min = e->prompt_tokens;
        if (i == 0 || e->prompt_tokens > prompt_max) prompt_max = e->prompt_tokens;
        ttft[i] = e->chunk_times[0] - c->sent_at;
        e2el[i] = c->done_at - c->sent_at;
        if (e->completion_tokens > 1) tpot[n_tpot++] = (e2el[i] - ttft[i]) / (double)(e->completion_tokens - 1);
        for (size_t j = 1; j < e->n_chunk_times; j++)
            itl[at++] = e->chunk_times[j] - e->chunk_times[j - 1];
    }
    const summary s_ttft = summarize(ttft, n), s_tpot = summarize(tpot, n_tpot), s_itl = summarize(itl, n_itl),
                  s_e2el = summarize(e2el, n);
    free(ttft), free(tpot), free(e2el), free(itl);
    const double request_throughput = (double)n / duration, output_tok_s = (double)output_tokens / duration,
                 total_tok_s = (double)(input_tokens + output_tokens) / duration;
    const double prompt_mean = n ? (double)input_tokens / (double)n : 0;

    char concurrency[32], rate[32];
    if (info->concurrency) {
        snprintf(concurrency, sizeof concurrency, "%zu", info->concurrency);
    } else {
        snprintf(concurrency, sizeof concurrency, "unbounded");
    }
    if (info->rate > 0) {
        snprintf(rate, sizeof rate, "%g/s (Poisson)", info->rate);
    } else {
        snprintf(rate, sizeof rate, "inf");
    }
    printf("== %s (%s): %s", info->server, info->model, info->dataset);
    if (info->prefix_len) printf(" %zu shared +", info->prefix_len);
    printf(" %zu in / %zu out, concurrency %s, rate %s, %zu requests (+%zu warm-up)\n", info->input_len,
           info->output_len, concurrency, rate, info->num_requests, info->warmup);
    printf("gate: pass (every request HTTP 200, finish_reason length, %zu completion tokens", info->output_len);
    if (info->reference_prompts) printf("; %zu reference completions match", info->reference_prompts);
    printf(")\n");
    printf("%-26s %zu (0 failed)\n", "completed requests", n);
    printf("%-26s %.3f\n", "duration s", duration);
    printf("%-26s %.3f\n", "requests/s", request_throughput);
    printf("%-26s %.1f\n", "output tok/s", output_tok_s);
    printf("%-26s %.1f\n", "total tok/s", total_tok_s);
    printf("%-26s %lld in, %lld out; prompt mean %.1f, min %lld, max %lld\n", "tokens (server's usage)", input_tokens,
           output_tokens, prompt_mean, prompt_min, prompt_max);
    printf("%-26s %10s %10s %10s %10s\n", "", "mean", "p50", "p90", "p99");
    const struct {
        const char *name;
        summary s;
    } rows[] = {{"TTFT ms", s_ttft}, {"TPOT ms", s_tpot}, {"ITL ms", s_itl}, {"end-to-end ms", s_e2el}};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
        printf("%-26s %10.3f %10.3f %10.3f %10.3f\n", rows[r].name, rows[r].s.mean, rows[r].s.p50, rows[r].s.p90,
               rows[r].s.p99);

    text_builder b = {0};
    text_builder_puts(&b, "{\"test\": \"serve\"");
    put_string(&b, "server", info->server);
    put_string(&b, "model", info->model);
    put_string(&b, "dataset", info->dataset);
    text_builder_printf(&b, ", \"input_len\": %zu", info->input_len);
    if (info->prefix_len) {
        text_builder_printf(&b, ", \"prefix_len\": %zu", info->prefix_len);
    } else {
        text_builder_puts(&b, ", \"prefix_len\": null");
    }
    text_builder_printf(&b, ", \"output_len\": %zu", info->output_len);
    if (info->concurrency) {
        text_builder_printf(&b, ", \"concurrency\": %zu", info->concurrency);
    } else {
        text_builder_puts(&b, ", \"concurrency\": null");
    }
    if (info->rate > 0) {
        put_number(&b, "request_rate", info->rate);
    } else {
        text_builder_puts(&b, ", \"request_rate\": \"inf\"");
    }
    text_builder_printf(&b, ", \"num_requests\": %zu, \"warmup\": %zu, \"seed\": %llu", info->num_requests,
                        info->warmup, info->seed);
    text_builder_printf(&b, ", \"completed\": %zu, \"failed\": 0, \"gate\": \"pass\", \"reference_prompts\": %zu", n,
                        info->reference_prompts);
    put_number(&b, "duration_s", duration);
    put_number(&b, "request_throughput", request_throughput);
    put_number(&b, "tok_s", output_tok_s);
    put_number(&b, "total_tok_s", total_tok_s);
    text_builder_printf(&b, ", \"total_input_tokens\": %lld, \"total_output_tokens\": %lld", input_tokens,
                        output_tokens);
    put_number(&b, "prompt_tokens_mean", prompt_mean);
    text_builder_printf(&b, ", \"prompt_tokens_min\": %lld, \"prompt_tokens_max\": %lld", prompt_min, prompt_max);
    put_summary(&b, "ttft", s_ttft);
    put_summary(&b, "tpot", s_tpot);
    put_summary(&b, "itl", s_itl);
    put_summary(&b, "e2el", s_e2el);
    put_string(&b, "gpu", info->gpu);
    put_string(&b, "commit", info->commit);
    char date[32];
    time_t now = time(NULL);
    struct tm utc;
    if (now == (time_t)-1 || !gmtime_r(&now, &utc) || strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &utc) == 0)
        snprintf(date, sizeof date, "unknown");
    put_string(&b, "date", date);
    put_string(&b, "command", info->command);
    text_builder_putc(&b, '}');
    if (b.failed) {
        fprintf(stderr, "kite-serve-bench: out of memory writing the row\n");
        text_builder_free(&b);
        return false;
    }
    printf("%s\n", b.data);
    bool ok = fflush(stdout) == 0;
    if (!ok) fprintf(stderr, "kite-serve-bench: writing stdout failed\n");
    if (ok && out_path) ok = append_line(out_path, b.data, b.length);
    text_builder_free(&b);
    return ok;
}

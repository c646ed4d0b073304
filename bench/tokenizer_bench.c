/* Tokenizer speed: load time of tokenizer.json and single-thread encode throughput over the documents of
 * bench/tokenizer_bench_text.py (the same ones bench/tokenizer_hf_bench.py gives Hugging Face).
 *
 *   tokenizer_bench --model DIR --text FILE [--repeat 3] [--host NAME] [--out results.jsonl]
 *
 * Prints JSON lines (test, ms and cpu_ms, or mb_s, host, commit, date, command) and appends them to --out. The
 * load is timed five times; the medians are reported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

#ifndef KITE_GIT_COMMIT
#define KITE_GIT_COMMIT "unknown"
#endif

static double now_seconds(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of this process: on a shared machine it moves less with the other load than wall time does. */
static double cpu_seconds(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *model = NULL, *text_path = NULL, *out_path = NULL, *host = "unknown", *commit = NULL;
    int repeat = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) model = argv[++i];
        else if (strcmp(argv[i], "--text") == 0 && i + 1 < argc) text_path = argv[++i];
        else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) out_path = argv[++i];
        else if (strcmp(argv[i], "--host") == 0 && i + 1 < argc) host = argv[++i];
        else if (strcmp(argv[i], "--commit") == 0 && i + 1 < argc) commit = argv[++i];
        else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) repeat = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: tokenizer_bench --model DIR --text FILE [--repeat N] [--host NAME] [--commit C] [--out FILE]\n");
            return 2;
        }
    }
    if (!model || !text_path || repeat < 1) {
        fprintf(stderr, "usage: tokenizer_bench --model DIR --text FILE [--repeat N] [--host NAME] [--commit C] [--out FILE]\n");
        return 2;
    }
    if (!commit) commit = KITE_GIT_COMMIT;

    enum { LOADS = 5 };
    double load_ms[LOADS], load_cpu_ms[LOADS];
    tokenizer *t = NULL;
    for (int i = 0; i < LOADS; i++) {
        tokenizer_free(t);
        t = NULL;
        double t0 = now_seconds(), c0 = cpu_seconds();
        if (tokenizer_load(model, &t) != KITE_OK) {
            fprintf(stderr, "tokenizer_bench: %s\n", kite_last_error());
            return 1;
        }
        load_ms[i] = (now_seconds() - t0) * 1e3;
        load_cpu_ms[i] = (cpu_seconds() - c0) * 1e3;
    }
    qsort(load_ms, LOADS, sizeof load_ms[0], compare_double);
    qsort(load_cpu_ms, LOADS, sizeof load_cpu_ms[0], compare_double);

    size_t length = 0;
    char *text = test_read_file(text_path, &length);
    if (!text) {
        fprintf(stderr, "tokenizer_bench: cannot read %s\n", text_path);
        return 1;
    }
    double best = 1e30;
    size_t n_tokens = 0, n_documents = 0;
    for (int r = 0; r < repeat; r++) {
        n_tokens = 0;
        n_documents = 0;
        double t0 = now_seconds();
        for (size_t start = 0; start <= length;) {
            const char *end = memchr(text + start, '\0', length - start);
            size_t doc_length = end ? (size_t)(end - (text + start)) : length - start;
            int32_t *ids = NULL;
            size_t n = 0;
            if (tokenizer_encode(t, text + start, doc_length, &ids, &n) != KITE_OK) {
                fprintf(stderr, "tokenizer_bench: %s\n", kite_last_error());
                return 1;
            }
            free(ids);
            n_tokens += n;
            n_documents++;
            start += doc_length + 1;
        }
        double elapsed = now_seconds() - t0;
        if (elapsed < best) best = elapsed;
    }
    size_t n_bytes = length - (n_documents - 1); /* the NUL separators are not text */

    char date[32];
    time_t now = time(NULL);
    struct tm tm_utc;
    if (!gmtime_r(&now, &tm_utc) || strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm_utc) == 0)
        snprintf(date, sizeof date, "unknown");
    char command[1024];
    size_t used = 0;
    for (int i = 0; i < argc && used < sizeof command; i++) {
        int n = snprintf(command + used, sizeof command - used, "%s%s", i ? " " : "", argv[i]);
        if (n < 0) break;
        used += (size_t)n;
    }
    char lines[2][1536];
    snprintf(lines[0], sizeof lines[0],
             "{\"test\": \"tokenizer_load_kite\", \"ms\": %.2f, \"cpu_ms\": %.2f, \"host\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\", "
             "\"command\": \"%s\", \"impl\": \"kite\", \"threads\": 1}",
             load_ms[LOADS / 2], load_cpu_ms[LOADS / 2], host, commit, date, command);
    snprintf(lines[1], sizeof lines[1],
             "{\"test\": \"tokenizer_encode_kite\", \"mb_s\": %.3f, \"bytes\": %zu, \"tokens\": %zu, \"documents\": %zu, "
             "\"host\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\", \"command\": \"%s\", \"impl\": \"kite\", \"threads\": 1}",
             (double)n_bytes / 1e6 / best, n_bytes, n_tokens, n_documents, host, commit, date, command);
    FILE *out = out_path ? fopen(out_path, "a") : NULL;
    if (out_path && !out) {
        fprintf(stderr, "tokenizer_bench: cannot open %s\n", out_path);
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        puts(lines[i]);
        if (out) fprintf(out, "%s\n", lines[i]);
    }
    if (out && fclose(out) != 0) {
        fprintf(stderr, "tokenizer_bench: cannot write %s\n", out_path);
        return 1;
    }
    free(text);
    tokenizer_free(t);
    return 0;
}

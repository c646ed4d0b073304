#include "weights/load_progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define REPORT_INTERVAL_SECONDS 0.1

static double monotonic_seconds(void) {
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC, &t) != 0) return 0.0; /* progress only: a stuck clock shows 0 GB/s */
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

load_progress load_progress_make(kite_load_callback callback, void *user_data) {
    return (load_progress){.callback = callback, .user_data = user_data};
}

static void report(const load_progress *p, kite_load_event_kind kind, double now) {
    if (!p->callback) return;
    kite_load_event event = {.kind = kind, .stage = p->stage, .bytes_done = p->bytes_done,
                             .bytes_total = p->bytes_total, .seconds = now - p->start_seconds, .message = NULL};
    p->callback(&event, p->user_data);
}

void load_progress_begin(load_progress *p, kite_load_stage stage, uint64_t bytes_total) {
    p->stage = stage;
    p->bytes_done = 0;
    p->bytes_total = bytes_total;
    p->start_seconds = monotonic_seconds();
    p->last_report_seconds = p->start_seconds;
    report(p, KITE_LOAD_EVENT_PROGRESS, p->start_seconds);
}

void load_progress_advance(load_progress *p, uint64_t bytes) {
    if (!p) return;
    p->bytes_done += bytes;
    if (!p->callback) return;
    double now = monotonic_seconds();
    if (now - p->last_report_seconds < REPORT_INTERVAL_SECONDS) return;
    p->last_report_seconds = now;
    report(p, KITE_LOAD_EVENT_PROGRESS, now);
}

void load_progress_end(load_progress *p) { report(p, KITE_LOAD_EVENT_DONE, monotonic_seconds()); }

void load_progress_notice(const load_progress *p, const char *fmt, ...) {
    char line[4096];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(line, sizeof line, fmt, args);
    va_end(args);
    if (n < 0) snprintf(line, sizeof line, "(a notice that could not be formatted: %s)", fmt);
    else if ((size_t)n >= sizeof line) memcpy(line + sizeof line - 4, "...", 4); /* shown cut, not cut silently */
    if (!p->callback) {
        /* stderr is the caller's stream; a failed write has nowhere better to go. */
        fprintf(stderr, "kite: %s\n", line);
        return;
    }
    kite_load_event event = {.kind = KITE_LOAD_EVENT_NOTICE, .stage = p->stage, .bytes_done = p->bytes_done,
                             .bytes_total = p->bytes_total, .seconds = 0.0, .message = line};
    p->callback(&event, p->user_data);
}

/* The load's reports (kite_load_event): progress of one stage at a time, and notices. The library has no
 * channel of its own to stderr, so it hands events to kite_load_params.on_load_event and the front end prints
 * them (the CLI: a live line on a terminal, else one summary line); without a callback only notices reach
 * stderr, one line each. */
#ifndef KITE_WEIGHTS_LOAD_PROGRESS_H
#define KITE_WEIGHTS_LOAD_PROGRESS_H

#include <stdint.h>

#include "kite.h"
#include "util/error.h"

typedef struct load_progress {
    kite_load_callback callback; /* NULL: notices to stderr, nothing else */
    void *user_data;
    kite_load_stage stage;
    uint64_t bytes_done;
    uint64_t bytes_total;
    double start_seconds;       /* monotonic clock at load_progress_begin */
    double last_report_seconds; /* of the last PROGRESS event */
} load_progress;

load_progress load_progress_make(kite_load_callback callback, void *user_data);
void load_progress_begin(load_progress *p, kite_load_stage stage, uint64_t bytes_total);
/* Adds bytes to the stage's count; reports PROGRESS when a tenth of a second has passed since the last. NULL p
 * is allowed (nobody listens). */
void load_progress_advance(load_progress *p, uint64_t bytes);
/* Reports DONE with the bytes counted. */
void load_progress_end(load_progress *p);
/* A one-line NOTICE (printf format, no newline). */
void load_progress_notice(const load_progress *p, const char *fmt, ...) KITE_PRINTF_LIKE(2, 3);

#endif

/* One JSON line per answered request (kite serve writes them on stderr): id, method, endpoint, status, prompt and generated tokens,
 * time to first token, total time and finish reason (null where a request has none). */
#ifndef KITE_TOOLS_SERVE_ACCESS_LOG_H
#define KITE_TOOLS_SERVE_ACCESS_LOG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct access_log_entry {
    const char *id; /* "cmpl-3", or NULL */
    const char *method;
    const char *endpoint;
    int status;
    size_t prompt_tokens;
    int32_t generated_tokens;
    double ttft_seconds;  /* < 0: no token */
    double total_seconds;
    const char *finish_reason; /* NULL: none */
} access_log_entry;

/* Writes the line to `out`; NULL writes nothing. */
void access_log_write(FILE *out, const access_log_entry *entry);

#endif

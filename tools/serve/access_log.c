/* The access log (access_log.h). */
#include "serve/access_log.h"

#include <stdio.h>
#include <string.h>

#include "text_buffer.h"

static void optional_string(text_buffer *b, const char *key, const char *value) {
    text_buffer_printf(b, ",\"%s\":", key);
    if (value)
        text_buffer_json_string(b, value, strlen(value));
    else
        text_buffer_puts(b, "null");
}

void access_log_write(FILE *out, const access_log_entry *e) {
    if (!out) return;
    text_buffer b = {0};
    text_buffer_puts(&b, "{\"log\":\"access\"");
    optional_string(&b, "id", e->id);
    optional_string(&b, "method", e->method);
    optional_string(&b, "endpoint", e->endpoint);
    text_buffer_printf(&b, ",\"status\":%d,\"prompt_tokens\":%zu,\"generated_tokens\":%d,\"ttft_ms\":", e->status,
                       e->prompt_tokens, e->generated_tokens);
    if (e->ttft_seconds >= 0)
        text_buffer_json_fixed(&b, e->ttft_seconds * 1e3, 3);
    else
        text_buffer_puts(&b, "null");
    text_buffer_puts(&b, ",\"total_ms\":");
    text_buffer_json_fixed(&b, e->total_seconds * 1e3, 3);
    optional_string(&b, "finish_reason", e->finish_reason);
    text_buffer_puts(&b, "}\n");
    /* A log line that cannot be built or written is lost; the response it describes is not affected. */
    (void)text_buffer_write(&b, out);
    text_buffer_free(&b);
}

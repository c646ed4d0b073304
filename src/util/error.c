#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One message per thread, so engines on different threads do not overwrite each other's errors. */
static _Thread_local char last_error_message[1024];

/* Copies text into the message with every control character escaped (\n, \t, \r by name, the rest \xHH; the
 * C1 controls U+0080-U+009F as \u00HH): a message quotes values from files and requests, and a newline or a
 * terminal escape sequence in a model_type or a shard name must not split the line or move the cursor. */
static void set_message_escaped(const char *text) {
    size_t out = 0;
    const size_t room = sizeof last_error_message - 1;
    for (const unsigned char *p = (const unsigned char *)text; *p && out < room; p++) {
        char escaped[8] = {0};
        if (*p == '\n' || *p == '\t' || *p == '\r')
            snprintf(escaped, sizeof escaped, "\\%c", *p == '\n' ? 'n' : *p == '\t' ? 't' : 'r');
        else if (*p < 0x20 || *p == 0x7f)
            snprintf(escaped, sizeof escaped, "\\x%02x", *p);
        else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
            snprintf(escaped, sizeof escaped, "\\u%04x", *++p);
        if (!escaped[0]) {
            last_error_message[out++] = (char)*p;
            continue;
        }
        const size_t n = strlen(escaped);
        if (out + n > room) break;
        memcpy(last_error_message + out, escaped, n);
        out += n;
    }
    last_error_message[out] = '\0';
}

kite_status kite_fail(kite_status code, const char *fmt, ...) {
    char raw[sizeof last_error_message];
    va_list args;
    va_start(args, fmt);
    vsnprintf(raw, sizeof raw, fmt, args);
    va_end(args);
    set_message_escaped(raw);
    return code;
}

void kite_error_prefix(const char *fmt, ...) {
    char prefix[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, args);
    va_end(args);
    /* Truncation is acceptable here: a message is one line for people, and its start matters most. */
    char combined[sizeof prefix + sizeof last_error_message + 2];
    int written = snprintf(combined, sizeof combined, "%s: %s", prefix, last_error_message);
    if (written < 0) return;
    combined[sizeof last_error_message - 1] = '\0';
    set_message_escaped(combined); /* the message part is escaped already, and escaping has nothing left to do there */
}

void kite_error_clear(void) { last_error_message[0] = '\0'; }

const char *kite_last_error(void) { return last_error_message; }

const char *kite_status_string(kite_status status) {
    switch (status) {
    case KITE_OK: return "ok";
    case KITE_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case KITE_ERROR_IO: return "i/o error";
    case KITE_ERROR_INVALID_CHECKPOINT: return "invalid checkpoint";
    case KITE_ERROR_INVALID_TOKENIZER: return "invalid tokenizer";
    case KITE_ERROR_UNSUPPORTED: return "unsupported";
    case KITE_ERROR_OUT_OF_MEMORY: return "out of memory";
    case KITE_ERROR_BACKEND: return "backend error";
    case KITE_ERROR_INVALID_INPUT: return "invalid input";
    case KITE_ERROR_CAPACITY: return "capacity exceeded";
    case KITE_ERROR_INVALID_TEMPLATE: return "invalid template";
    }
    return "unknown status";
}

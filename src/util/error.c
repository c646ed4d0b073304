#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One message per thread, so engines on different threads do not overwrite each other's errors. */
static _Thread_local char last_error_message[1024];

kite_status kite_fail(kite_status code, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_error_message, sizeof last_error_message, fmt, args);
    va_end(args);
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
    size_t length = strnlen(combined, sizeof last_error_message - 1);
    memcpy(last_error_message, combined, length);
    last_error_message[length] = '\0';
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

#include "text_buffer.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void text_buffer_free(text_buffer *b) {
    free(b->data);
    *b = (text_buffer){0};
}

void text_buffer_clear(text_buffer *b) {
    b->length = 0;
    b->failed = false;
    if (b->data) b->data[0] = '\0';
}

/* Makes room for `extra` more bytes and the NUL; false (and `failed`) when it cannot. */
static bool text_buffer_reserve(text_buffer *b, size_t extra) {
    if (b->failed) return false;
    if (extra > SIZE_MAX - b->length - 1) {
        b->failed = true;
        return false;
    }
    size_t needed = b->length + extra + 1;
    if (needed <= b->capacity) return true;
    size_t grown = b->capacity ? b->capacity : 256;
    while (grown < needed) grown = grown > SIZE_MAX / 2 ? needed : grown * 2;
    char *p = realloc(b->data, grown);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->data = p;
    b->capacity = grown;
    return true;
}

void text_buffer_append(text_buffer *b, const char *data, size_t length) {
    if (!text_buffer_reserve(b, length)) return;
    if (length > 0) memcpy(b->data + b->length, data, length);
    b->length += length;
    b->data[b->length] = '\0';
}

void text_buffer_puts(text_buffer *b, const char *text) { text_buffer_append(b, text, strlen(text)); }

void text_buffer_printf(text_buffer *b, const char *format, ...) {
    if (b->failed) return;
    va_list args;
    va_start(args, format);
    va_list again;
    va_copy(again, args);
    /* Format straight into the spare room; when it does not fit, grow to the size vsnprintf reported. */
    size_t room = b->capacity > b->length ? b->capacity - b->length : 0;
    int n = vsnprintf(room ? b->data + b->length : NULL, room, format, args);
    va_end(args);
    if (n < 0) {
        b->failed = true;
    } else if ((size_t)n >= room) {
        if (text_buffer_reserve(b, (size_t)n)) vsnprintf(b->data + b->length, (size_t)n + 1, format, again);
    }
    va_end(again);
    if (n >= 0 && !b->failed) {
        b->length += (size_t)n;
        b->data[b->length] = '\0';
    } else if (b->data && b->length < b->capacity) {
        b->data[b->length] = '\0'; /* drop what a failed format left behind */
    }
}

bool text_buffer_write(const text_buffer *b, FILE *out) {
    if (b->failed) return false;
    return b->length == 0 || fwrite(b->data, 1, b->length, out) == b->length;
}

void text_buffer_json_string(text_buffer *b, const char *text, size_t length) {
    text_buffer_append(b, "\"", 1);
    size_t plain = 0; /* the start of the run of bytes that need no escape */
    for (size_t i = 0; i < length; i++) {
        unsigned char c = (unsigned char)text[i];
        const char *escape = NULL;
        char control[8];
        switch (c) {
        case '"': escape = "\\\""; break;
        case '\\': escape = "\\\\"; break;
        case '\n': escape = "\\n"; break;
        case '\r': escape = "\\r"; break;
        case '\t': escape = "\\t"; break;
        default:
            if (c < 0x20) {
                snprintf(control, sizeof control, "\\u%04x", c);
                escape = control;
            }
        }
        if (!escape) continue;
        text_buffer_append(b, text + plain, i - plain);
        text_buffer_puts(b, escape);
        plain = i + 1;
    }
    text_buffer_append(b, text + plain, length - plain);
    text_buffer_append(b, "\"", 1);
}

void text_buffer_json_fixed(text_buffer *b, double value, int decimals) {
    if (isfinite(value))
        text_buffer_printf(b, "%.*f", decimals, value);
    else
        text_buffer_puts(b, "null");
}

void text_buffer_json_general(text_buffer *b, double value, int digits) {
    if (isfinite(value))
        text_buffer_printf(b, "%.*g", digits, value);
    else
        text_buffer_puts(b, "null");
}

void text_buffer_json_int_array(text_buffer *b, const int32_t *values, size_t n) {
    text_buffer_append(b, "[", 1);
    for (size_t i = 0; i < n; i++) text_buffer_printf(b, i ? ",%d" : "%d", (int)values[i]);
    text_buffer_append(b, "]", 1);
}

#include "util/text_builder.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void text_builder_free(text_builder *b) {
    free(b->data);
    *b = (text_builder){.limit = b->limit};
}

void text_builder_clear(text_builder *b) {
    b->length = 0;
    b->failed = b->over_limit = false;
    if (b->data) b->data[0] = '\0';
}

/* Room for `extra` more bytes and the NUL. */
static bool reserve(text_builder *b, size_t extra) {
    if (b->failed) return false;
    if (extra > SIZE_MAX / 2 - b->length || (b->limit && b->length + extra > b->limit)) {
        b->failed = true;
        b->over_limit = b->limit != 0;
        return false;
    }
    const size_t need = b->length + extra + 1;
    if (need <= b->capacity) return true;
    size_t grown = b->capacity ? b->capacity : 64;
    while (grown < need) grown *= 2;
    char *p = realloc(b->data, grown);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->data = p;
    b->capacity = grown;
    return true;
}

void text_builder_append(text_builder *b, const char *data, size_t length) {
    if (!reserve(b, length)) return;
    if (length) memcpy(b->data + b->length, data, length);
    b->length += length;
    b->data[b->length] = '\0';
}

void text_builder_puts(text_builder *b, const char *text) { text_builder_append(b, text, strlen(text)); }

void text_builder_putc(text_builder *b, char c) { text_builder_append(b, &c, 1); }

void text_builder_printf(text_builder *b, const char *format, ...) {
    va_list args;
    va_start(args, format);
    char small[128];
    const int n = vsnprintf(small, sizeof small, format, args);
    va_end(args);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        text_builder_append(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n)) return;
    va_start(args, format);
    vsnprintf(b->data + b->length, (size_t)n + 1, format, args);
    va_end(args);
    b->length += (size_t)n;
}

char *text_builder_take(text_builder *b, size_t *length) {
    if (b->failed) return NULL;
    if (!b->data && !reserve(b, 0)) return NULL;
    if (b->length == 0) b->data[0] = '\0';
    char *text = b->data;
    if (length) *length = b->length;
    *b = (text_builder){.limit = b->limit};
    return text;
}

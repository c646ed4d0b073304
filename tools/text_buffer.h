/* One growable text buffer for everything the CLI builds before writing it: JSON lines, HTTP bodies, usage text.
 *
 * JSON is written here and only here: strings escaped as RFC 8259 requires, numbers in a fixed or a
 * significant-digits style, and a number that is not finite (JSON has no inf or nan) written as null.
 *
 * Appends never fail loudly: a failed allocation sets `failed`, later appends do nothing, and the caller
 * checks once at the end (text_buffer_write returns false). `data` is NUL-terminated whenever it is not NULL.
 */
#ifndef KITE_TOOLS_TEXT_BUFFER_H
#define KITE_TOOLS_TEXT_BUFFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct text_buffer {
    char *data;     /* NULL until something is appended */
    size_t length;  /* bytes, without the terminating NUL */
    size_t capacity;
    bool failed;    /* an allocation failed: the contents are incomplete */
} text_buffer;

/* A buffer is ready when zeroed (text_buffer b = {0};). */
void text_buffer_free(text_buffer *b);
/* Empties the buffer, keeping its memory (and clearing `failed`). */
void text_buffer_clear(text_buffer *b);

void text_buffer_append(text_buffer *b, const char *data, size_t length);
void text_buffer_puts(text_buffer *b, const char *text); /* a NUL-terminated string */
void text_buffer_printf(text_buffer *b, const char *format, ...) __attribute__((format(printf, 2, 3)));

/* Writes the contents to `out`; false when the buffer failed or the write did. */
bool text_buffer_write(const text_buffer *b, FILE *out);

/* text[0..length) as a JSON string literal, quotes included: '"' and '\\' escaped, \n \r \t by name, the
 * other control characters as \u00XX; every other byte (UTF-8 included) as it is. */
void text_buffer_json_string(text_buffer *b, const char *text, size_t length);
/* A number with `decimals` digits after the point ("%.*f"), or null when it is not finite. */
void text_buffer_json_fixed(text_buffer *b, double value, int decimals);
/* A number with `digits` significant digits ("%.*g": 9 round-trips a float), or null when it is not finite. */
void text_buffer_json_general(text_buffer *b, double value, int digits);
/* [a,b,c] */
void text_buffer_json_int_array(text_buffer *b, const int32_t *values, size_t n);

#endif

/* A growable byte string for text the library builds (rendered templates, JSON it writes, parsed chat output).
 *
 * Appends never fail loudly: a failed allocation (or growth past `limit`, when one is set) sets `failed`, later
 * appends do nothing, and the owner checks once at the end. `data` is NUL-terminated whenever it is not NULL.
 */
#ifndef KITE_UTIL_TEXT_BUILDER_H
#define KITE_UTIL_TEXT_BUILDER_H

#include <stdbool.h>
#include <stddef.h>

typedef struct text_builder {
    char *data;      /* NULL until something is appended */
    size_t length;   /* bytes, without the terminating NUL */
    size_t capacity;
    size_t limit;    /* 0: none; else the most bytes the text may hold */
    bool failed;     /* out of memory or past `limit`: the contents are incomplete */
    bool over_limit; /* `failed` because of `limit` */
} text_builder;

/* A builder is ready when zeroed (text_builder b = {0};). */
void text_builder_free(text_builder *b);
void text_builder_clear(text_builder *b); /* empties it, keeping its memory, and clears `failed` */

void text_builder_append(text_builder *b, const char *data, size_t length);
void text_builder_puts(text_builder *b, const char *text);
void text_builder_putc(text_builder *b, char c);
void text_builder_printf(text_builder *b, const char *format, ...) __attribute__((format(printf, 2, 3)));

/* Hands the text over (NUL-terminated, "" when empty) and leaves the builder empty; NULL when it failed or on
 * out of memory. */
char *text_builder_take(text_builder *b, size_t *length);

#endif

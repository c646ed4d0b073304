#include "util/json_scan.h"

#include <stdint.h>
#include <string.h>

#define ONES 0x0101010101010101ull
#define LOW7 0x7F7F7F7F7F7F7F7Full

/* The high bit of each byte of w that equals b, and of no other (exact: no borrow crosses bytes). */
static inline uint64_t bytes_equal(uint64_t w, unsigned char b) {
    uint64_t x = w ^ (ONES * b);
    return ~(((x & LOW7) + LOW7) | x | LOW7);
}

static inline uint64_t load_word(const char *p) {
    uint64_t w;
    memcpy(&w, p, sizeof w);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* Eight bytes at a time: a word with no quote or backslash inside a string, or no quote outside one (its
 * separators counted at once), is passed in one step; tokenizer.json is mostly such words. */
bool json_scan_separators_within(const char *text, size_t length, size_t max_separators, size_t *offset) {
    size_t separators = 0;
    bool in_string = false;
    size_t i = 0;
    while (i + 8 <= length) {
        uint64_t w = load_word(text + i);
        if (in_string) {
            uint64_t stops = bytes_equal(w, '"') | bytes_equal(w, '\\');
            if (!stops) {
                i += 8;
                continue;
            }
            i += (size_t)__builtin_ctzll(stops) / 8;
            if (text[i] == '\\') {
                i += 2; /* the escaped byte cannot end the string */
            } else {
                in_string = false;
                i++;
            }
            continue;
        }
        uint64_t quotes = bytes_equal(w, '"');
        uint64_t marks = bytes_equal(w, ',') | bytes_equal(w, '[') | bytes_equal(w, '{');
        size_t span = quotes ? (size_t)__builtin_ctzll(quotes) / 8 : 8; /* bytes before the first quote */
        if (span < 8) marks &= (1ull << (8 * span)) - 1;
        /* One bit per marked byte, at its top: their sum lands in the top byte (a popcount without -mpopcnt
         * is a library call). */
        size_t n = (size_t)(((marks >> 7) * ONES) >> 56);
        if (separators + n > max_separators) {
            for (size_t k = 0;; k++) { /* the mark that passes the limit */
                char c = text[i + k];
                if ((c == ',' || c == '[' || c == '{') && ++separators > max_separators) {
                    *offset = i + k;
                    return false;
                }
            }
        }
        separators += n;
        i += span;
        if (span < 8) {
            in_string = true;
            i++;
        }
    }
    for (; i < length; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if ((c == ',' || c == '[' || c == '{') && ++separators > max_separators) {
            *offset = i;
            return false;
        }
    }
    return true;
}

/* A pass over JSON text, before it is parsed, that bounds what parsing costs. The reader (util/json.h)
 * spends ~32 bytes of arena per value, so a file of "0,0,0,..." costs 16 times its size in memory before
 * its loader can see that it is not what it should be. Counting the commas and opening brackets outside
 * strings (at least one per value after the first) costs only a read of the text. */
#ifndef KITE_UTIL_JSON_SCAN_H
#define KITE_UTIL_JSON_SCAN_H

#include <stdbool.h>
#include <stddef.h>

/* Whether text[0..length) holds at most max_separators commas and opening brackets outside strings; when it
 * does not, *offset is the byte where the count passed the limit. Says nothing about validity. */
bool json_scan_separators_within(const char *text, size_t length, size_t max_separators, size_t *offset);

#endif

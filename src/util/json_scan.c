#include "util/json_scan.h"

bool json_scan_separators_within(const char *text, size_t length, size_t max_separators, size_t *offset) {
    size_t separators = 0;
    bool in_string = false;
    for (size_t i = 0; i < length; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\')
                i++; /* the escaped byte cannot end the string */
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

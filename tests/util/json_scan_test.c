/* util/json_scan: the separator count that bounds a parse's cost, and strings (with escaped quotes) skipped. */
#include <string.h>

#include "test_util.h"
#include "util/json_scan.h"

static bool within(const char *text, size_t limit, size_t *offset) {
    return json_scan_separators_within(text, strlen(text), limit, offset);
}

static void test_counts(void) {
    size_t offset = 99;
    CHECK(within("[0,0,0]", 3, &offset) && offset == 99); /* '[' and two commas */
    CHECK(!within("[0,0,0]", 2, &offset) && offset == 4);
    CHECK(within("{\"a\":[1],\"b\":{}}", 4, &offset));
    CHECK(!within("{\"a\":[1],\"b\":{}}", 3, &offset) && offset == 13);
    CHECK(within("", 0, &offset) && within("7", 0, &offset));
}

static void test_strings_are_skipped(void) {
    size_t offset = 0;
    CHECK(within("\"[,,,{,]\"", 0, &offset));
    CHECK(within("\"a\\\",[,\"", 0, &offset));        /* an escaped quote does not end the string */
    CHECK(!within("[\"a\\\\\",1]", 1, &offset) && offset == 6); /* an escaped backslash does not escape the quote */
}

int main(void) {
    TEST_RUN(test_counts);
    TEST_RUN(test_strings_are_skipped);
    return test_finish();
}

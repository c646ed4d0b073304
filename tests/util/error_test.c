/* kite's error message: one line whatever it quotes. Control characters from files or requests (a newline, a
 * terminal escape sequence, a C1 control) come out escaped, also through kite_error_prefix. */
#include <string.h>

#include "kite.h"
#include "test_util.h"
#include "util/error.h"

static void test_controls_are_escaped(void) {
    CHECK(kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "config.json: model_type \"%s\" is not supported",
                    "qwen3\n\x1b[2J\r\t\x7f\xc2\x9b\xc3\xa9") == KITE_ERROR_INVALID_CHECKPOINT);
    const char *expected = "config.json: model_type \"qwen3\\n\\x1b[2J\\r\\t\\x7f\\u009b\xc3\xa9\" is not supported";
    CHECK_MSG(strcmp(kite_last_error(), expected) == 0, "[%s]", kite_last_error());
    kite_error_prefix("loading %s", "dir\nname");
    CHECK_MSG(strncmp(kite_last_error(), "loading dir\\nname: config.json: model_type \"qwen3\\n", 51) == 0, "[%s]",
              kite_last_error());
    CHECK(strchr(kite_last_error(), '\n') == NULL && strchr(kite_last_error(), '\x1b') == NULL);
}

static void test_long_messages_stay_terminated(void) {
    char value[3000];
    memset(value, '\n', sizeof value - 1);
    value[sizeof value - 1] = '\0';
    kite_fail(KITE_ERROR_INVALID_INPUT, "%s", value);
    const size_t length = strlen(kite_last_error());
    CHECK(length > 0 && length < 1024 && length % 2 == 0); /* whole escapes only */
}

int main(void) {
    TEST_RUN(test_controls_are_escaped);
    TEST_RUN(test_long_messages_stay_terminated);
    return test_finish();
}

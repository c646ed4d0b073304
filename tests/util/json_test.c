/* The JSON reader: valid documents, every kind of malformed input, and the speed-relevant big file. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "test_util.h"
#include "util/json.h"

static json_document *parse(const char *text) { return json_parse(text, strlen(text), NULL); }

static void test_scalars_and_containers(void) {
    json_document *d = parse(" {\"a\": 1, \"b\": [true, false, null, -2.5e1, \"x\\u00e9\\ud83d\\ude00\"], \"c\": {}} ");
    CHECK(d != NULL);
    if (!d) return;
    const json_value *root = json_root(d);
    CHECK(json_is_object(root));
    int64_t a = 0;
    CHECK(json_get_int64(json_object_member(root, "a"), &a) && a == 1);
    const json_value *b = json_object_member(root, "b");
    CHECK(json_is_array(b) && b->length == 5);
    bool flag = false;
    CHECK(json_get_bool(&b->as.items[0], &flag) && flag);
    CHECK(json_get_bool(&b->as.items[1], &flag) && !flag);
    CHECK(json_is_null(&b->as.items[2]));
    double x = 0;
    CHECK(json_get_double(&b->as.items[3], &x) && x == -25.0);
    CHECK(!json_get_int64(&b->as.items[3], &a));
    CHECK(json_is_string(&b->as.items[4]) && b->as.items[4].length == 7 &&
          memcmp(b->as.items[4].as.string, "x\xc3\xa9\xf0\x9f\x98\x80", 7) == 0);
    CHECK(json_is_object(json_object_member(root, "c")) && json_object_member(root, "c")->length == 0);
    CHECK(json_object_member(root, "missing") == NULL);
    json_free(d);
}

static void test_integers_are_exact(void) {
    json_document *d = parse("[9223372036854775807, -9223372036854775808, 9223372036854775808, 0, -0]");
    CHECK(d != NULL);
    if (!d) return;
    const json_value *r = json_root(d);
    int64_t v = 0;
    CHECK(json_get_int64(&r->as.items[0], &v) && v == INT64_MAX);
    CHECK(json_get_int64(&r->as.items[1], &v) && v == INT64_MIN);
    CHECK(!json_get_int64(&r->as.items[2], &v)); /* out of range: not an integer, still a number */
    CHECK(json_get_int64(&r->as.items[3], &v) && v == 0);
    /* Beyond int64, an integer literal keeps its digits (Python reads it as an int); floats do not. */
    CHECK(r->as.items[2].is_big_integer && strcmp(r->as.items[2].as.num.digits, "9223372036854775808") == 0);
    CHECK(!r->as.items[0].is_big_integer && !r->as.items[3].is_big_integer);
    json_free(d);
    d = parse("[-123456789012345678901234567890, 1.5e300, 12345678901234567890.0]");
    CHECK(d != NULL);
    if (!d) return;
    r = json_root(d);
    CHECK(r->as.items[0].is_big_integer && strcmp(r->as.items[0].as.num.digits, "-123456789012345678901234567890") == 0);
    CHECK(!r->as.items[1].is_big_integer && !r->as.items[2].is_big_integer && !r->as.items[2].is_integer);
    json_free(d);
}

static void test_embedded_nul(void) {
    json_document *d = parse("\"a\\u0000b\"");
    CHECK(d && json_root(d)->length == 3 && json_root(d)->as.string[1] == '\0');
    json_free(d);
}

static void test_rejects_malformed(void) {
    static const char *bad[] = {
        "", "   ", "{", "}", "[1,]", "[1 2]", "{\"a\" 1}", "{\"a\":}", "{a:1}", "01", "1.", "-", "1e",
        "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"", "tru", "nul", "[1] x", "\"\x01\"",
        "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "{\"a\":1,}", "NaN", "Infinity", "+1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_error err;
        json_document *d = json_parse(bad[i], strlen(bad[i]), &err);
        CHECK_MSG(d == NULL, "accepted malformed input #%zu", i);
        CHECK(err.message[0] != '\0');
        json_free(d);
    }
}

static void test_depth_limit(void) {
    char deep[2 * (JSON_MAX_DEPTH + 10) + 1];
    size_t n = 0;
    for (int i = 0; i < JSON_MAX_DEPTH + 10; i++) deep[n++] = '[';
    for (int i = 0; i < JSON_MAX_DEPTH + 10; i++) deep[n++] = ']';
    json_error err;
    CHECK(json_parse(deep, n, &err) == NULL);
    CHECK(strstr(err.message, "nesting") != NULL);
}

static void test_error_position(void) {
    json_error err;
    const char *text = "{\n  \"a\": [1,\n   oops]\n}";
    CHECK(json_parse(text, strlen(text), &err) == NULL);
    CHECK_MSG(err.line == 3 && err.column == 4, "line %d column %d", err.line, err.column);
}

static void test_tokenizer_json_parses(void) {
    size_t length = 0;
    char *text = test_read_file(KITE_TEST_DATA_DIR "/tokenizer/tokenizer.json", &length);
    if (!text) {
        printf("  (tests/data/tokenizer/tokenizer.json not present; skipping this case)\n");
        return;
    }
    json_document *d = json_parse(text, length, NULL);
    CHECK(d != NULL);
    const json_value *model = d ? json_object_member(json_root(d), "model") : NULL;
    const json_value *vocab = json_object_member(model, "vocab");
    CHECK(json_is_object(vocab) && vocab->length == 151643);
    json_free(d);
    free(text);
}

int main(void) {
    TEST_RUN(test_scalars_and_containers);
    TEST_RUN(test_integers_are_exact);
    TEST_RUN(test_embedded_nul);
    TEST_RUN(test_rejects_malformed);
    TEST_RUN(test_depth_limit);
    TEST_RUN(test_error_position);
    TEST_RUN(test_tokenizer_json_parses);
    return test_finish();
}

/* The JSON reader: valid documents, every kind of malformed input, and the speed-relevant big file. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* A key twice in one object is refused at the repeat, small objects and hashed large ones alike, nested too. */
static void test_duplicate_keys_refused(void) {
    static const struct {
        const char *text;
        const char *message;
        int line, column;
    } cases[] = {
        {"{\"hidden_act\": \"silu\",\n \"hidden_act\": \"gelu\"}", "duplicate key \"hidden_act\"", 2, 2},
        {"[{\"a\": 1}, {\"b\": {\"x\": 1, \"y\": 2, \"x\": 3}}]", "duplicate key \"x\"", 1, 35},
        {"{\"a\\u0000b\": 1, \"a\\u0000b\": 2}", "duplicate key \"a\\x00b\"", 1, 17},
        {"{\"\": 1, \"\": 2}", "duplicate key \"\"", 1, 9},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_error err;
        json_document *d = json_parse(cases[i].text, strlen(cases[i].text), &err);
        CHECK_MSG(d == NULL, "case %zu accepted", i);
        json_free(d);
        CHECK_MSG(strcmp(err.message, cases[i].message) == 0, "case %zu: message '%s'", i, err.message);
        CHECK_MSG(err.line == cases[i].line && err.column == cases[i].column, "case %zu: line %d column %d", i,
                  err.line, err.column);
    }
    /* The same key spelled differently ("a" and "\u0061") is the same key once decoded. */
    json_error err;
    const char *spelled = "{\"a\": 1, \"\\u0061\": 2}";
    CHECK(json_parse(spelled, strlen(spelled), &err) == NULL && strcmp(err.message, "duplicate key \"a\"") == 0);
    /* Keys that differ only in length or a last byte are distinct. */
    json_document *d = parse("{\"a\": 1, \"ab\": 2, \"b\": 3, \"A\": 4}");
    CHECK(d && json_root(d)->length == 4);
    json_free(d);
}

/* Builds {"k0": 0, "k1": 1, ..., "k<n-1>": n-1}, with key `repeat` written again last when repeat < n. */
static char *make_object(size_t n, size_t repeat, size_t *length) {
    char *text = malloc(n * 24 + 64);
    if (!text) return NULL;
    size_t used = 0;
    text[used++] = '{';
    for (size_t i = 0; i < n; i++) used += (size_t)sprintf(text + used, "%s\"k%zu\": %zu", i ? ", " : "", i, i);
    if (repeat < n) used += (size_t)sprintf(text + used, ", \"k%zu\": -1", repeat);
    text[used++] = '}';
    text[used] = '\0';
    *length = used;
    return text;
}

static void test_duplicate_keys_in_large_objects(void) {
    const size_t sizes[] = {9, 100, 200000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const size_t n = sizes[s];
        size_t length = 0;
        char *text = make_object(n, n, &length);
        CHECK(text != NULL);
        if (!text) return;
        json_document *d = json_parse(text, length, NULL);
        CHECK_MSG(d && json_root(d)->length == n, "distinct keys refused at n=%zu", n);
        json_free(d);
        free(text);
        const size_t repeats[] = {0, n / 2, n - 1};
        for (size_t r = 0; r < 3; r++) {
            text = make_object(n, repeats[r], &length);
            CHECK(text != NULL);
            if (!text) return;
            json_error err;
            d = json_parse(text, length, &err);
            char expected[64];
            snprintf(expected, sizeof expected, "duplicate key \"k%zu\"", repeats[r]);
            CHECK_MSG(d == NULL && strcmp(err.message, expected) == 0, "n=%zu repeat %zu: '%s'", n, repeats[r],
                      err.message);
            /* the repeat is the last member: its key sits after the last ", " */
            const char *last = strrchr(text, ',');
            CHECK_MSG(err.offset == (size_t)(last - text) + 2, "n=%zu: offset %zu", n, err.offset);
            json_free(d);
            free(text);
        }
    }
}

/* JSON_DUPLICATE_KEYS_LAST_WINS reads as json.loads: one member per key, at its first place, last value. */
static void test_duplicate_keys_last_wins(void) {
    const json_parse_options options = {.duplicate_keys = JSON_DUPLICATE_KEYS_LAST_WINS};
    const char *text = "{\"a\": 1, \"b\": {\"x\": 1, \"x\": [2]}, \"a\": 3, \"c\": 4, \"a\": 5}";
    json_error err;
    json_document *d = json_parse_with_options(text, strlen(text), &options, &err);
    CHECK(d != NULL);
    if (!d) return;
    const json_value *root = json_root(d);
    CHECK(root->length == 3);
    CHECK(strcmp(root->as.members[0].key, "a") == 0 && strcmp(root->as.members[1].key, "b") == 0 &&
          strcmp(root->as.members[2].key, "c") == 0);
    int64_t a = 0;
    CHECK(json_get_int64(json_object_member(root, "a"), &a) && a == 5);
    const json_value *b = json_object_member(root, "b");
    CHECK(json_is_object(b) && b->length == 1 && json_is_array(json_object_member(b, "x")));
    json_free(d);
    size_t length = 0;
    char *big = make_object(1000, 500, &length);
    CHECK(big != NULL);
    if (!big) return;
    d = json_parse_with_options(big, length, &options, &err);
    CHECK(d && json_root(d)->length == 1000);
    int64_t v = 0;
    CHECK(d && json_get_int64(json_object_member(json_root(d), "k500"), &v) && v == -1);
    CHECK(d && strcmp(json_root(d)->as.members[500].key, "k500") == 0);
    CHECK(d && json_get_int64(json_object_member(json_root(d), "k999"), &v) && v == 999);
    json_free(d);
    free(big);
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
    TEST_RUN(test_duplicate_keys_refused);
    TEST_RUN(test_duplicate_keys_in_large_objects);
    TEST_RUN(test_duplicate_keys_last_wins);
    TEST_RUN(test_tokenizer_json_parses);
    return test_finish();
}

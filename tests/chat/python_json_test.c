/* python_json against what Python's json.dumps(ensure_ascii=False) prints for the same values (the expected
 * strings below are its output, python3 3.11). */
#include <string.h>

#include "chat/python_json.h"
#include "test_util.h"

static void expect_float(double value, const char *expected) {
    text_builder b = {0};
    python_json_float(&b, value);
    CHECK_MSG(b.data && strcmp(b.data, expected) == 0, "%.17g: '%s', expected '%s'", value, b.data, expected);
    text_builder_free(&b);
}

static void test_floats_as_repr(void) {
    expect_float(1.0, "1.0");
    expect_float(0.1, "0.1");
    expect_float(1e-5, "1e-05");
    expect_float(0.0001, "0.0001");
    expect_float(1e16, "1e+16");
    expect_float(1e15, "1000000000000000.0");
    expect_float(123.456, "123.456");
    expect_float(-0.0, "-0.0");
    expect_float(2.5e-300, "2.5e-300");
    expect_float(1.7976931348623157e308, "1.7976931348623157e+308");
    expect_float(100.0, "100.0");
    expect_float(1.5e22, "1.5e+22");
    expect_float(-3.14159, "-3.14159");
    expect_float(1.0 / 3.0, "0.3333333333333333");
}

static void expect_value(const char *json, int indent, bool compact, const char *expected) {
    json_document *d = json_parse(json, strlen(json), NULL);
    CHECK(d != NULL);
    if (!d) return;
    text_builder b = {0};
    python_json_value(&b, json_root(d), indent, compact);
    CHECK_MSG(b.data && strcmp(b.data, expected) == 0, "%s: '%s', expected '%s'", json, b.data, expected);
    text_builder_free(&b);
    json_free(d);
}

static void test_values_in_dumps_layout(void) {
    const char *doc = "{\"a\": [1, 2.0, \"x\\u00e9\\n\\u0001\\\"\\\\/\"], \"b\": {}, \"c\": {\"d\": null, "
                      "\"e\": [true, false, []]}}";
    expect_value(doc, -1, false,
                 "{\"a\": [1, 2.0, \"x\xc3\xa9\\n\\u0001\\\"\\\\/\"], \"b\": {}, \"c\": {\"d\": null, \"e\": [true, "
                 "false, []]}}");
    expect_value(doc, -1, true,
                 "{\"a\":[1,2.0,\"x\xc3\xa9\\n\\u0001\\\"\\\\/\"],\"b\":{},\"c\":{\"d\":null,\"e\":[true,false,[]]}}");
    expect_value("{\"a\": [1, {\"b\": []}]}", 2, false, "{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ]\n}");
    expect_value("\"\\t\\b\\f\\r\\u001f\\u007f\"", -1, false, "\"\\t\\b\\f\\r\\u001f\x7f\"");
}

int main(void) {
    TEST_RUN(test_floats_as_repr);
    TEST_RUN(test_values_in_dumps_layout);
    return test_finish();
}

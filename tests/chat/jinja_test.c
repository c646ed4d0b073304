/* kite's Jinja interpreter against python3's jinja2 run with transformers' settings: the table in jinja_cases.h
 * (made by tests/chat/jinja_expected.py: templates, variables, and what jinja2 printed or whether it failed) and
 * the Qwen3 chat template for a few conversations; then what only kite defines: constructs refused at parse time
 * with their line, and the bounds that keep any template finite. */
#include <stdio.h>
#include <string.h>

#include "chat/jinja.h"
#include "test_util.h"
#include "util/error.h"

typedef struct jinja_case {
    const char *name;
    const char *template_; /* NULL: the Qwen3 template */
    size_t template_length;
    const char *variables; /* JSON object */
    kite_status status;
    const char *expected;       /* output when status is KITE_OK */
    size_t expected_length;
    const char *error_contains; /* a substring of kite's message on failure, or NULL */
} jinja_case;

#define TEXT(s) s, sizeof(s) - 1

#include "jinja_cases.h"

/* Renders `source` with `variables`; the status, and the output or the error message in *result (malloc'd). */
static kite_status run(const char *name, const char *source, size_t source_length, const char *variables,
                       char **result, size_t *result_length) {
    *result = NULL;
    json_document *doc = json_parse(variables, strlen(variables), NULL);
    if (!doc) {
        fprintf(stderr, "  %s: the case's variables are not JSON\n", name);
        return KITE_ERROR_INVALID_ARGUMENT;
    }
    jinja_template *t = NULL;
    kite_status status = jinja_parse(source, source_length, name, &t);
    if (status == KITE_OK) {
        status = jinja_render(t, json_root(doc), result, result_length);
        jinja_free(t);
    }
    if (status != KITE_OK) {
        *result = strdup(kite_last_error());
        *result_length = *result ? strlen(*result) : 0;
    }
    json_free(doc);
    return status;
}

static void check_case(const jinja_case *c, const char *source, size_t source_length) {
    char *result = NULL;
    size_t length = 0;
    kite_status status = run(c->name, source, source_length, c->variables, &result, &length);
    if (c->status == KITE_OK) {
        CHECK_MSG(status == KITE_OK && result && length == c->expected_length &&
                      memcmp(result, c->expected, length) == 0,
                  "%s: status %d\n    got      [%s]\n    expected [%s]", c->name, (int)status, result ? result : "",
                  c->expected);
    } else {
        CHECK_MSG(status == c->status, "%s: status %d, expected %d (%s)", c->name, (int)status, (int)c->status,
                  result ? result : "");
        if (c->error_contains)
            CHECK_MSG(result && strstr(result, c->error_contains), "%s: message [%s] lacks [%s]", c->name,
                      result ? result : "", c->error_contains);
    }
    free(result);
}

static void test_cases_match_jinja2(void) {
    for (size_t i = 0; i < sizeof jinja_cases / sizeof jinja_cases[0]; i++)
        check_case(&jinja_cases[i], jinja_cases[i].template_, jinja_cases[i].template_length);
}

static void test_qwen3_template_matches_jinja2(void) {
    size_t length = 0;
    char *source = test_read_file(KITE_TEST_DATA_DIR "/chat/templates/qwen3.jinja", &length);
    CHECK(source != NULL);
    if (!source) return;
    for (size_t i = 0; i < sizeof qwen3_cases / sizeof qwen3_cases[0]; i++) check_case(&qwen3_cases[i], source, length);
    free(source);
}

/* One parsed template rendered many times gives the same text each time (it is immutable after parsing). */
static void test_template_renders_repeatedly(void) {
    size_t length = 0;
    char *source = test_read_file(KITE_TEST_DATA_DIR "/chat/templates/qwen3.jinja", &length);
    CHECK(source != NULL);
    if (!source) return;
    jinja_template *t = NULL;
    CHECK(jinja_parse(source, length, "qwen3.jinja", &t) == KITE_OK);
    const jinja_case *c = &qwen3_cases[3];
    json_document *doc = json_parse(c->variables, strlen(c->variables), NULL);
    CHECK(doc != NULL);
    for (int i = 0; t && doc && i < 3; i++) {
        char *out = NULL;
        CHECK(jinja_render(t, json_root(doc), &out, NULL) == KITE_OK);
        CHECK(out && strcmp(out, c->expected) == 0);
        free(out);
    }
    json_free(doc);
    jinja_free(t);
    free(source);
}

/* Fails to parse with KITE_ERROR_INVALID_TEMPLATE and a message holding `contains`. */
static void expect_refused(const char *source, const char *contains) {
    jinja_template *t = NULL;
    kite_status status = jinja_parse(source, strlen(source), "t.jinja", &t);
    CHECK_MSG(status == KITE_ERROR_INVALID_TEMPLATE && t == NULL, "[%s]: status %d", source, (int)status);
    CHECK_MSG(strstr(kite_last_error(), contains) != NULL, "[%s]: message [%s] lacks [%s]", source, kite_last_error(),
              contains);
    jinja_free(t);
}

static void test_unsupported_constructs_refused_with_line(void) {
    expect_refused("a\n{% include 'x.jinja' %}", "t.jinja:2: the 'include' tag is not supported");
    expect_refused("{% extends 'base' %}", "t.jinja:1: the 'extends' tag");
    expect_refused("{% import 'm' as m %}", "'import' tag");
    expect_refused("{% from 'm' import x %}", "'from' tag");
    expect_refused("\n\n{% block body %}{% endblock %}", "t.jinja:3: the 'block' tag");
    expect_refused("{% with a = 1 %}{% endwith %}", "'with' tag");
    expect_refused("{% autoescape true %}{% endautoescape %}", "'autoescape' tag");
    expect_refused("{% do x %}", "'do' tag");
    expect_refused("{% for x in y recursive %}{% endfor %}", "recursive for loops are not supported");
    expect_refused("{{ f(*args) }}", "'*' arguments in calls are not supported");
    expect_refused("{{ f(**kw) }}", "'**' arguments");
    expect_refused("{{ x|wordcount }}", "filter 'wordcount' is not supported by kite");
    expect_refused("{{ x|format(1) }}", "filter 'format' is not supported");
    expect_refused("{{ x|groupby('a') }}", "filter 'groupby' is not supported");
    expect_refused("\n{{ x|nosuch }}", "t.jinja:2: No filter named 'nosuch'");
    expect_refused("{{ x is startingwith 'a' }}", "No test named 'startingwith'");
    expect_refused("{{ a[1, 2] }}", "tuple subscripts");
    expect_refused("{{ 99999999999999999999 }}", "integer literal too large");
    expect_refused("{{ '\\N{BULLET}' }}", "\\N{...} escapes are not supported");
    expect_refused("{% set x = 1 %}\n{% if x %}\n{% endfor %}", "t.jinja:3:");
}

/* Renders `source` (no variables) and expects `status` with `contains` in the message. */
static void expect_render_error(const char *source, kite_status expected, const char *contains) {
    jinja_template *t = NULL;
    kite_status status = jinja_parse(source, strlen(source), "t.jinja", &t);
    CHECK_MSG(status == KITE_OK, "[%s]: parse failed: %s", source, kite_last_error());
    if (status != KITE_OK) return;
    char *out = NULL;
    status = jinja_render(t, NULL, &out, NULL);
    CHECK_MSG(status == expected && out == NULL, "[%s]: status %d", source, (int)status);
    CHECK_MSG(strstr(kite_last_error(), contains) != NULL, "[%s]: message [%s] lacks [%s]", source, kite_last_error(),
              contains);
    free(out);
    jinja_free(t);
}

static void test_bounds_are_clean_errors(void) {
    /* Output: 2^27 bytes of 'x' through doubling in a namespace. */
    expect_render_error("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s }}",
                        KITE_ERROR_INVALID_INPUT, "limit");
    expect_render_error("{{ 'x' * 100000000 }}", KITE_ERROR_INVALID_INPUT, "output is past its limit");
    expect_render_error("{{ [1] * 10000000000 }}", KITE_ERROR_INVALID_INPUT, "memory limit");
    /* Steps: nested loops that would run 10^9 iterations. */
    expect_render_error("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}"
                        "{% endfor %}{% endfor %}{% endfor %}",
                        KITE_ERROR_INVALID_INPUT, "steps");
    /* Nested captures share the output limit: each level would capture 40 MiB. */
    expect_render_error("{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
                        "{% macro f(n) %}{% for i in range(40) %}{{ ns.s }}{% endfor %}{% if n < 40 %}{{ f(n + 1) }}"
                        "{% endif %}{% endmacro %}{{ f(0) }}",
                        KITE_ERROR_INVALID_INPUT, "output is past its limit");
    /* Macro recursion without a base case. */
    expect_render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", KITE_ERROR_INVALID_INPUT,
                        "macro calls nest deeper");
    expect_render_error("{{ 9223372036854775807 + 1 }}", KITE_ERROR_INVALID_INPUT, "integer overflow");
    expect_render_error("{{ 2 ** 64 }}", KITE_ERROR_INVALID_INPUT, "integer overflow");
    expect_render_error("{{ '%s' % 1 }}", KITE_ERROR_INVALID_INPUT, "string formatting with '%' is not supported");
    expect_render_error("{{ 'a'.zfill(3) }}", KITE_ERROR_INVALID_INPUT, "the str method 'zfill' is not supported");
    expect_render_error("{{ range }}", KITE_ERROR_INVALID_INPUT, "cannot print a function");
    expect_render_error("\n\n{{ undefined_function() }}", KITE_ERROR_INVALID_INPUT,
                        "t.jinja:3: 'undefined_function' is undefined");
}

/* An integer beyond int64 from the variables prints as written (the table checks that against jinja2) but
 * takes part in no arithmetic or ordering: refused, where Python would compute with it exactly. */
static void test_big_integers_refuse_arithmetic(void) {
    static const char *const templates[] = {"{{ x + 1 }}", "{{ x < 5 }}", "{{ -x }}", "{{ x * 2 }}"};
    for (size_t i = 0; i < sizeof templates / sizeof templates[0]; i++) {
        char *result = NULL;
        size_t length = 0;
        const kite_status s = run("big", templates[i], strlen(templates[i]), "{\"x\": 12345678901234567890}",
                                  &result, &length);
        CHECK_MSG(s == KITE_ERROR_INVALID_INPUT, "%s: status %d, [%s]", templates[i], (int)s, result ? result : "");
        free(result);
    }
}

/* Deeply nested brackets or blocks fail to parse instead of exhausting the stack. */
static void test_deep_nesting_refused(void) {
    char source[4096];
    size_t n = 0;
    n += (size_t)snprintf(source + n, sizeof source - n, "{{ ");
    for (int i = 0; i < 1000; i++) source[n++] = '(';
    source[n++] = '1';
    for (int i = 0; i < 1000; i++) source[n++] = ')';
    n += (size_t)snprintf(source + n, sizeof source - n, " }}");
    jinja_template *t = NULL;
    CHECK(jinja_parse(source, n, "deep", &t) == KITE_ERROR_INVALID_TEMPLATE);
    CHECK(strstr(kite_last_error(), "deep") != NULL);
    jinja_free(t);
    n = 0;
    for (int i = 0; i < 300; i++) n += (size_t)snprintf(source + n, sizeof source - n, "{%% if 1 %%}");
    CHECK(jinja_parse(source, n, "deep", &t) == KITE_ERROR_INVALID_TEMPLATE);
    jinja_free(t);
    n = 0;
    for (int i = 0; i < 300; i++) n += (size_t)snprintf(source + n, sizeof source - n, "-");
    n += (size_t)snprintf(source + n, sizeof source - n, "1");
    char wrapped[4200];
    int m = snprintf(wrapped, sizeof wrapped, "{{ %.*s }}", (int)n, source);
    CHECK(jinja_parse(wrapped, (size_t)m, "deep", &t) == KITE_ERROR_INVALID_TEMPLATE);
    jinja_free(t);
    /* Left-deep chains are as deep as nesting: 1 + 1 + ..., x|trim|trim..., a.b.c... */
    static const char *const links[] = {" + 1", "|trim", ".a", " or 1", " and 1", " ** 1", " * 1", "[0]", "()"};
    for (size_t k = 0; k < sizeof links / sizeof links[0]; k++) {
        n = (size_t)snprintf(source, sizeof source, "{{ x");
        for (int i = 0; i < 300; i++) n += (size_t)snprintf(source + n, sizeof source - n, "%s", links[k]);
        n += (size_t)snprintf(source + n, sizeof source - n, " }}");
        CHECK_MSG(jinja_parse(source, n, "deep", &t) == KITE_ERROR_INVALID_TEMPLATE, "chain of '%s'", links[k]);
        jinja_free(t);
    }
    /* Long chains within the bound still parse. */
    n = (size_t)snprintf(source, sizeof source, "{{ 1");
    for (int i = 0; i < 60; i++) n += (size_t)snprintf(source + n, sizeof source - n, " + 1");
    n += (size_t)snprintf(source + n, sizeof source - n, " }}");
    CHECK(jinja_parse(source, n, "long", &t) == KITE_OK);
    char *out = NULL;
    CHECK(t && jinja_render(t, NULL, &out, NULL) == KITE_OK && out && strcmp(out, "61") == 0);
    free(out);
    jinja_free(t);
}

static void test_strftime_now(void) {
    jinja_template *t = NULL;
    const char *source = "{{ strftime_now('%Y') }}|{{ strftime_now('%d %b %Y')|length }}";
    CHECK(jinja_parse(source, strlen(source), "t", &t) == KITE_OK);
    char *out = NULL;
    CHECK(t && jinja_render(t, NULL, &out, NULL) == KITE_OK);
    /* A four-digit year, then "01 Dec 2026" is 11 characters. */
    CHECK_MSG(out && strlen(out) == 7 && out[4] == '|' && strcmp(out + 5, "11") == 0, "[%s]", out ? out : "");
    free(out);
    jinja_free(t);
}

static void test_bad_arguments(void) {
    jinja_template *t = NULL;
    CHECK(jinja_parse("x", 1, "t", &t) == KITE_OK);
    char *out = NULL;
    json_document *doc = json_parse("[1]", 3, NULL);
    CHECK(jinja_render(t, json_root(doc), &out, NULL) == KITE_ERROR_INVALID_ARGUMENT && out == NULL);
    CHECK(jinja_render(NULL, NULL, &out, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    json_free(doc);
    jinja_free(t);
    jinja_free(NULL);
    CHECK(jinja_parse("", 0, "empty", &t) == KITE_OK);
    size_t length = 99;
    CHECK(jinja_render(t, NULL, &out, &length) == KITE_OK && out && out[0] == '\0' && length == 0);
    free(out);
    jinja_free(t);
}

int main(void) {
    TEST_RUN(test_cases_match_jinja2);
    TEST_RUN(test_qwen3_template_matches_jinja2);
    TEST_RUN(test_template_renders_repeatedly);
    TEST_RUN(test_unsupported_constructs_refused_with_line);
    TEST_RUN(test_bounds_are_clean_errors);
    TEST_RUN(test_big_integers_refuse_arithmetic);
    TEST_RUN(test_deep_nesting_refused);
    TEST_RUN(test_strftime_now);
    TEST_RUN(test_bad_arguments);
    return test_finish();
}

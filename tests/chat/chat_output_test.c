/* chat_output against what vLLM's qwen3 reasoning parser and hermes tool parser return for the same text
 * (worked out from their code: str.partition on the think tags, the hermes regex, json.loads, json.dumps with
 * ensure_ascii=False); where kite's rules knowingly differ (chat_output.h) the case says what vLLM returns.
 * Every case runs whole, at every single split point, byte by byte and in random pieces: the concatenated
 * deltas and the final result must be the expected ones each time, and no delta may split a UTF-8 character. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "chat/chat_output.h"
#include "test_util.h"
#include "util/text_builder.h"

#define MAX_CALLS 4
#define DEFAULT_MAX_CALL_BYTES 4096

typedef struct expected_call {
    const char *name;
    const char *arguments;
} expected_call;

typedef struct output_case {
    const char *label;
    chat_output_params params;
    const char *text;
    const char *reasoning;
    const char *content;
    size_t n_calls;
    expected_call calls[MAX_CALLS];
} output_case;

static const chat_output_params PLAIN = {.id_seed = 1};
static const chat_output_params THINK = {.reasoning = true, .id_seed = 1};
static const chat_output_params THINK_OPEN = {.reasoning = true, .starts_in_reasoning = true, .id_seed = 1};
static const chat_output_params TOOLS = {.tools = true, .max_call_bytes = DEFAULT_MAX_CALL_BYTES, .id_seed = 1};
static const chat_output_params THINK_TOOLS = {
    .reasoning = true, .tools = true, .max_call_bytes = DEFAULT_MAX_CALL_BYTES, .id_seed = 1};
static const chat_output_params OPEN_TOOLS = {
    .reasoning = true, .starts_in_reasoning = true, .tools = true, .max_call_bytes = DEFAULT_MAX_CALL_BYTES,
    .id_seed = 1};

/* A forced tool_choice's parser (T6): named get_weather, or required over get_weather and lookup. */
static const char *const NAMED_WEATHER[] = {"get_weather"};
static const chat_output_params NAMED = {.tools = true, .max_call_bytes = DEFAULT_MAX_CALL_BYTES, .id_seed = 1,
                                         .call_names = NAMED_WEATHER, .n_call_names = 1};
static const char *const TWO_TOOLS[] = {"lookup", "get_weather"};
static const chat_output_params REQUIRED = {.tools = true, .max_call_bytes = DEFAULT_MAX_CALL_BYTES, .id_seed = 1,
                                            .call_names = TWO_TOOLS, .n_call_names = 2};

/* A forced call after the reasoning (R5): the engine inserted "\n\n" and the opening after </think>. */
static const chat_output_params THINK_REQUIRED = {
    .reasoning = true, .tools = true, .max_call_bytes = DEFAULT_MAX_CALL_BYTES, .id_seed = 1,
    .call_names = TWO_TOOLS, .n_call_names = 2, .separator = "\n\n", .separator_length = 2};
static const chat_output_params OPEN_NAMED = {
    .reasoning = true, .starts_in_reasoning = true, .tools = true, .max_call_bytes = DEFAULT_MAX_CALL_BYTES,
    .id_seed = 1, .call_names = NAMED_WEATHER, .n_call_names = 1, .separator = "\n\n", .separator_length = 2};

#define WEATHER_CALL "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"

static const output_case CASES[] = {
    /* Reasoning. With thinking off vLLM routes the stream as content; its non-streamed extract_reasoning would
     * still cut at a </think> the model wrote, kite never does (R1). */
    {"thinking off: the tags are content", PLAIN, "<think>\nhi\n</think>\n\nHello", "", "<think>\nhi\n</think>\n\nHello", 0, {{0}}},
    {"think block then answer, content keeps its \\n\\n", THINK, "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
     "\nLet me think.\n", "\n\nThe answer is 4.", 0, {{0}}},
    {"nothing after </think>: content None", THINK, "<think>r</think>", "r", "", 0, {{0}}},
    {"empty think block", THINK, "<think>\n\n</think>\n\nHi", "\n\n", "\n\nHi", 0, {{0}}},
    {"prompt opened <think>", THINK_OPEN, "Let me think.\n</think>\n\nAnswer.", "Let me think.\n", "\n\nAnswer.", 0, {{0}}},
    {"prompt opened <think>, no end tag: all reasoning", THINK_OPEN, "still thinking", "still thinking", "", 0, {{0}}},
    {"prompt opened <think>, the model repeats it", THINK_OPEN, "<think>x</think>y", "x", "y", 0, {{0}}},
    {"<think> without </think>: all reasoning (truncated)", THINK, "<think>\nhmm, so", "\nhmm, so", "", 0, {{0}}},
    /* vLLM's current parser would call this reasoning (it assumes an open <think> in the prompt); kite's caller
     * says so with starts_in_reasoning, and without it the text is content (R2). */
    {"thinking on, no <think> at all: content", THINK, "Hello there", "", "Hello there", 0, {{0}}},
    {"thinking on, no leading <think>: </think> is text", THINK, "abc</think>def", "", "abc</think>def", 0, {{0}}},
    {"a second </think> is content", THINK, "<think>a</think>b</think>c", "a", "b</think>c", 0, {{0}}},
    /* vLLM would drop "a<think>" (partition on the first <think> anywhere); kite drops only a leading one. */
    {"a later <think> is reasoning text", THINK_OPEN, "a<think>b</think>c", "a<think>b", "c", 0, {{0}}},
    {"a partial <think> at the end is content", THINK, "<thi", "", "<thi", 0, {{0}}},
    {"a partial </think> at the end is reasoning", THINK_OPEN, "abc</thi", "abc</thi", "", 0, {{0}}},
    {"'<' that begins no tag", THINK, "<b>bold</b> <", "", "<b>bold</b> <", 0, {{0}}},
    {"UTF-8 in both parts", THINK, "<think>日本</think>語😀", "日本", "語😀", 0, {{0}}},
    {"invalid UTF-8 passes through", THINK_OPEN, "a\xe6\x97</think>b\xff\xe6\x97", "a\xe6\x97", "b\xff\xe6\x97", 0, {{0}}},
    {"empty text", THINK_TOOLS, "", "", "", 0, {{0}}},

    /* Tool calls. */
    {"one call", TOOLS, WEATHER_CALL, "", "", 1, {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {"content before the call", TOOLS, "Let me check.\n" WEATHER_CALL, "", "Let me check.\n", 1,
     {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {"two calls, text between and after dropped", TOOLS,
     "<tool_call>\n{\"name\":\"a\",\"arguments\":{\"x\":1}}\n</tool_call>\n<tool_call>\n{\"name\":\"b\",\"arguments\":"
     "{\"y\":[1,2.50,null,true,1E2]}}\n</tool_call>\nDone.",
     "", "", 2, {{"a", "{\"x\": 1}"}, {"b", "{\"y\": [1, 2.5, null, true, 100.0]}"}}},
    {"reasoning, then a call", THINK_TOOLS, "<think>\nNeed weather.\n</think>\n\n" WEATHER_CALL, "\nNeed weather.\n",
     "\n\n", 1, {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {"prompt opened <think>, then three calls", OPEN_TOOLS,
     "plan</think>\n\n<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\",\"arguments\":"
     "{}}</tool_call>\n<tool_call>{\"name\":\"c\",\"arguments\":{}}</tool_call>",
     "plan", "\n\n", 3, {{"a", "{}"}, {"b", "{}"}, {"c", "{}"}}},
    {"a call inside reasoning stays reasoning", THINK_TOOLS,
     "<think>I could call <tool_call>{\"name\":\"x\",\"arguments\":{}}</tool_call> here</think>\n\nOK",
     "I could call <tool_call>{\"name\":\"x\",\"arguments\":{}}</tool_call> here", "\n\nOK", 0, {{0}}},
    {"no </think>: a call in the truncated reasoning stays reasoning", OPEN_TOOLS,
     "maybe <tool_call>{\"name\":\"x\",\"arguments\":{}}</tool_call>",
     "maybe <tool_call>{\"name\":\"x\",\"arguments\":{}}</tool_call>", "", 0, {{0}}},
    {"arguments given as a string are json.dumps'ed", TOOLS,
     "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>", "", "", 1,
     {{"f", "\"{\\\"a\\\": 1}\""}}},
    {"nested arguments, unicode, escapes", TOOLS,
     "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"caf\\u00e9 ☕ \\\"x\\\"\\n\\t\\u0001\", \"n\": "
     "{\"deep\": [{\"k\": -0.0}], \"e\": 1e-7, \"big\": 12345678901234}, \"s\": \"\\ud83d\\ude00\"}}\n</tool_call>",
     "", "", 1,
     {{"search", "{\"q\": \"café ☕ \\\"x\\\"\\n\\t\\u0001\", \"n\": {\"deep\": [{\"k\": -0.0}], \"e\": 1e-07, \"big\": "
                 "12345678901234}, \"s\": \"😀\"}"}}},
    {"arguments as an array", TOOLS, "<tool_call>{\"name\":\"f\",\"arguments\":[1,\"a\"]}</tool_call>", "", "", 1,
     {{"f", "[1, \"a\"]"}}},
    {"members in any order, extra ones ignored, whitespace around", TOOLS,
     "<tool_call> \t{\"arguments\": {\"a\": \"b\"}, \"name\": \"f\", \"id\": 7}\r\n </tool_call>", "", "", 1,
     {{"f", "{\"a\": \"b\"}"}}},
    {"a repeated name: the last counts (Python dict)", TOOLS,
     "<tool_call>{\"name\":\"a\",\"name\":\"b\",\"arguments\":{}}</tool_call>", "", "", 1, {{"b", "{}"}}},
    {"repeated keys inside the arguments: one member each, first place, last value (Python dict)", TOOLS,
     "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1,\"b\":2,\"a\":{\"x\":1,\"x\":3}}}</tool_call>", "", "", 1,
     {{"f", "{\"a\": {\"x\": 3}, \"b\": 2}"}}},
    {"repeated arguments: the last counts", TOOLS,
     "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1},\"arguments\":[2]}</tool_call>", "", "", 1, {{"f", "[2]"}}},
    {"an empty name is a name", TOOLS, "<tool_call>{\"name\":\"\",\"arguments\":{}}</tool_call>", "", "", 1,
     {{"", "{}"}}},
    {"unterminated call with complete JSON", TOOLS, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n", "", "", 1,
     {{"f", "{}"}}},
    {"a call, then an unterminated complete one", TOOLS,
     "ok<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\",\"arguments\":{}}", "",
     "ok", 2, {{"a", "{}"}, {"b", "{}"}}},
    /* Forced choices (T6): only calls to the allowed names count; any other is malformed (T4). */
    {"named: the named call", NAMED, WEATHER_CALL, "", "", 1, {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {"named: another name is text", NAMED, "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {}}\n</tool_call>", "",
     "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {}}\n</tool_call>", 0, {{0}}},
    {"named: a prefix of the name is text", NAMED, "<tool_call>{\"name\": \"get_weathe\", \"arguments\": 1}", "",
     "<tool_call>{\"name\": \"get_weathe\", \"arguments\": 1}", 0, {{0}}},
    {"named: a later key renames the call, which is then text", NAMED,
     "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}, \"name\": \"x\"}</tool_call>", "",
     "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}, \"name\": \"x\"}</tool_call>", 0, {{0}}},
    {"required: either tool, then a stranger ends the calls", REQUIRED,
     "<tool_call>{\"name\": \"lookup\", \"arguments\": {}}</tool_call>" WEATHER_CALL
     "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
     "", "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", 2,
     {{"lookup", "{}"}, {"get_weather", "{\"city\": \"Paris\"}"}}},
    {"tools off: a call is content", THINK, "<think>x</think>" WEATHER_CALL, "x", WEATHER_CALL, 0, {{0}}},
    {"a stray </tool_call> is content", TOOLS, "a</tool_call>b", "", "a</tool_call>b", 0, {{0}}},
    {"a partial <tool_call> at the end is content", TOOLS, "hi <tool_ca", "", "hi <tool_ca", 0, {{0}}},

    /* Malformed calls: the whole text is content, as vLLM's except-branch returns it. */
    {"malformed JSON", TOOLS, "Sure.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> bye", "",
     "Sure.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> bye", 0, {{0}}},
    {"no name", TOOLS, "<tool_call>{\"arguments\": {}}</tool_call>", "", "<tool_call>{\"arguments\": {}}</tool_call>", 0, {{0}}},
    {"a name that is not a string", TOOLS, "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>", "",
     "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>", 0, {{0}}},
    {"no arguments (vLLM: KeyError)", TOOLS, "<tool_call>{\"name\": \"f\"}</tool_call>", "",
     "<tool_call>{\"name\": \"f\"}</tool_call>", 0, {{0}}},
    {"not an object", TOOLS, "<tool_call>[\"f\"]</tool_call>x", "", "<tool_call>[\"f\"]</tool_call>x", 0, {{0}}},
    {"empty body", TOOLS, "<tool_call></tool_call>", "", "<tool_call></tool_call>", 0, {{0}}},
    {"unterminated, JSON incomplete", TOOLS, "x<tool_call>\n{\"name\": \"f\", \"argu", "",
     "x<tool_call>\n{\"name\": \"f\", \"argu", 0, {{0}}},
    {"unterminated, partial end tag (json.loads: extra data)", TOOLS,
     "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_ca", "", "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_ca", 0, {{0}}},
    {"a <tool_call> inside a body", TOOLS, "<tool_call>{\"name\":\"a\"<tool_call>,\"arguments\":{}}</tool_call>", "",
     "<tool_call>{\"name\":\"a\"<tool_call>,\"arguments\":{}}</tool_call>", 0, {{0}}},
    {"a malformed call ends tool parsing", TOOLS,
     "<tool_call>{bad}</tool_call>\n<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>", "",
     "<tool_call>{bad}</tool_call>\n<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>", 0, {{0}}},
    {"NaN, which json.loads reads, is malformed here", TOOLS, "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":NaN}}",
     "", "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":NaN}}", 0, {{0}}},
    /* vLLM's non-streamed path returns the whole text as content and no calls here; kite keeps the valid call it
     * may already have streamed and drops the text between (T4). */
    {"a valid call, then a malformed one", TOOLS,
     "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{bad}</tool_call>\nafter", "",
     "<tool_call>{bad}</tool_call>\nafter", 1, {{"a", "{}"}}},
    /* R5: the separator the engine inserted before a forced call is no content; other content is kept whole. */
    {"forced after reasoning: the separator is dropped", THINK_REQUIRED, "<think>\nok\n</think>\n\n" WEATHER_CALL,
     "\nok\n", "", 1, {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {"forced after an opened <think>", OPEN_NAMED, "ok</think>\n\n" WEATHER_CALL, "ok", "", 1,
     {{"get_weather", "{\"city\": \"Paris\"}"}}},
    {"a separator cut short is content", THINK_REQUIRED, "<think>a</think>\nb", "a", "\nb", 0, {{0}}},
    {"only the first separator is dropped", THINK_REQUIRED, "<think>a</think>\n\n\n\nb", "a", "\n\nb", 0, {{0}}},
    {"the end right after </think>", THINK_REQUIRED, "<think>a</think>\n", "a", "\n", 0, {{0}}},
    {"reasoning that never ends drops nothing", THINK_REQUIRED, "<think>\n\nhmm", "\n\nhmm", "", 0, {{0}}},
    /* T5: the body {"name":"f","arguments":{}} is 27 bytes. */
    {"a body at the limit is read", {.tools = true, .max_call_bytes = 27, .id_seed = 1},
     "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", "", "", 1, {{"f", "{}"}}},
    {"a body past the limit is content", {.tools = true, .max_call_bytes = 26, .id_seed = 1},
     "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>tail", "",
     "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>tail", 0, {{0}}},
    {"an unterminated body past the limit is content", {.tools = true, .max_call_bytes = 26, .id_seed = 1},
     "<tool_call>{\"name\":\"f\",\"arguments\":{}}", "", "<tool_call>{\"name\":\"f\",\"arguments\":{}}", 0, {{0}}},
};

/* What one run collected: the deltas concatenated and the calls in order. */
typedef struct run_output {
    text_builder reasoning;
    text_builder content;
    size_t n_calls;
    char names[MAX_CALLS][128];
    char arguments[MAX_CALLS][512];
    char ids[MAX_CALLS][64];
    bool split_character; /* a delta ended inside a UTF-8 character */
    bool failed;
} run_output;

static bool is_valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || i + len > n) return false;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

static void take_delta(run_output *out, const chat_output_delta *d, bool text_is_utf8) {
    text_builder_append(&out->reasoning, d->reasoning, d->reasoning_length);
    text_builder_append(&out->content, d->content, d->content_length);
    if (text_is_utf8 && (!is_valid_utf8(d->reasoning, d->reasoning_length) ||
                         !is_valid_utf8(d->content, d->content_length)))
        out->split_character = true;
    for (size_t i = 0; i < d->n_calls; i++) {
        if (out->n_calls == MAX_CALLS) {
            out->failed = true;
            return;
        }
        snprintf(out->names[out->n_calls], sizeof out->names[0], "%s", d->calls[i].name);
        snprintf(out->arguments[out->n_calls], sizeof out->arguments[0], "%s", d->calls[i].arguments);
        snprintf(out->ids[out->n_calls], sizeof out->ids[0], "%s", d->calls[i].id);
        out->n_calls++;
    }
}

/* Feeds text in pieces that end at cuts[0..n_cuts) (ascending), checks the final result against the deltas. */
static void run_pieces(const output_case *c, const size_t *cuts, size_t n_cuts, run_output *out) {
    memset(out, 0, sizeof *out);
    const size_t length = strlen(c->text);
    const bool text_is_utf8 = is_valid_utf8(c->text, length);
    chat_output_parser *p = NULL;
    if (chat_output_create(&c->params, &p) != KITE_OK) {
        out->failed = true;
        return;
    }
    chat_output_delta d;
    size_t start = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        const size_t end = i < n_cuts ? cuts[i] : length;
        if (chat_output_feed(p, c->text + start, end - start, &d) != KITE_OK) out->failed = true;
        take_delta(out, &d, text_is_utf8);
        start = end;
    }
    if (chat_output_finish(p, &d) != KITE_OK) out->failed = true;
    take_delta(out, &d, text_is_utf8);
    chat_output_delta r;
    chat_output_result(p, &r);
    if (r.reasoning_length != out->reasoning.length || memcmp(r.reasoning, out->reasoning.data, r.reasoning_length) ||
        r.content_length != out->content.length || memcmp(r.content, out->content.data, r.content_length) ||
        r.n_calls != out->n_calls)
        out->failed = true;
    for (size_t i = 0; i < r.n_calls && i < out->n_calls; i++)
        if (strcmp(r.calls[i].id, out->ids[i]) || strcmp(r.calls[i].arguments, out->arguments[i])) out->failed = true;
    chat_output_free(p);
}

static bool is_call_id(const char *id) {
    if (strncmp(id, "chatcmpl-tool-", 14) != 0 || strlen(id) != 14 + 32) return false;
    for (const char *h = id + 14; *h; h++)
        if (!((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f'))) return false;
    return id[14 + 12] == '4' && strchr("89ab", id[14 + 16]) != NULL; /* uuid4 version and variant */
}

/* One run against the case's expected values and, for ids, against the whole-text run. */
static bool check_run(const output_case *c, const run_output *out, const run_output *whole, const char *how) {
    const char *reasoning = out->reasoning.data ? out->reasoning.data : "";
    const char *content = out->content.data ? out->content.data : "";
    bool ok = !out->failed && !out->split_character;
    CHECK_MSG(!out->failed, "%s (%s): a call failed or the result differs from the deltas", c->label, how);
    CHECK_MSG(!out->split_character, "%s (%s): a delta split a UTF-8 character", c->label, how);
    if (strcmp(reasoning, c->reasoning) != 0 || out->reasoning.length != strlen(c->reasoning)) {
        CHECK_MSG(false, "%s (%s): reasoning '%s', expected '%s'", c->label, how, reasoning, c->reasoning);
        ok = false;
    }
    if (strcmp(content, c->content) != 0 || out->content.length != strlen(c->content)) {
        CHECK_MSG(false, "%s (%s): content '%s', expected '%s'", c->label, how, content, c->content);
        ok = false;
    }
    if (out->n_calls != c->n_calls) {
        CHECK_MSG(false, "%s (%s): %zu calls, expected %zu", c->label, how, out->n_calls, c->n_calls);
        return false;
    }
    for (size_t i = 0; i < c->n_calls; i++) {
        if (strcmp(out->names[i], c->calls[i].name) || strcmp(out->arguments[i], c->calls[i].arguments)) {
            CHECK_MSG(false, "%s (%s): call %zu is %s(%s), expected %s(%s)", c->label, how, i, out->names[i],
                      out->arguments[i], c->calls[i].name, c->calls[i].arguments);
            ok = false;
        }
        if (!is_call_id(out->ids[i]) || (whole && strcmp(out->ids[i], whole->ids[i]) != 0)) {
            CHECK_MSG(false, "%s (%s): call %zu has id '%s'", c->label, how, i, out->ids[i]);
            ok = false;
        }
    }
    return ok;
}

static void free_run(run_output *out) {
    text_builder_free(&out->reasoning);
    text_builder_free(&out->content);
}

static void run_case(const output_case *c) {
    const size_t length = strlen(c->text);
    run_output whole;
    run_pieces(c, NULL, 0, &whole);
    if (!check_run(c, &whole, NULL, "whole")) {
        free_run(&whole);
        return;
    }
    /* Every single split point, empty first and last pieces included. */
    for (size_t cut = 0; cut <= length; cut++) {
        run_output out;
        run_pieces(c, &cut, 1, &out);
        char how[48];
        snprintf(how, sizeof how, "split at byte %zu", cut);
        const bool ok = check_run(c, &out, &whole, how);
        free_run(&out);
        if (!ok) break;
    }
    size_t cuts[1024];
    if (length > 0 && length <= sizeof cuts / sizeof cuts[0]) {
        for (size_t i = 0; i < length; i++) cuts[i] = i + 1;
        run_output out;
        run_pieces(c, cuts, length - 1, &out);
        check_run(c, &out, &whole, "byte by byte");
        free_run(&out);
        /* Random pieces of 0 to 5 bytes, a fixed generator. */
        uint64_t state = 0x2545F4914F6CDD1Dull ^ length;
        for (int round = 0; round < 20; round++) {
            size_t n_cuts = 0;
            for (size_t at = 0; n_cuts < sizeof cuts / sizeof cuts[0];) {
                state = state * 6364136223846793005ull + 1442695040888963407ull;
                at += (size_t)(state >> 61) % 6;
                if (at >= length) break;
                cuts[n_cuts++] = at;
            }
            run_pieces(c, cuts, n_cuts, &out);
            const bool ok = check_run(c, &out, &whole, "random pieces");
            free_run(&out);
            if (!ok) break;
        }
    }
    free_run(&whole);
}

static void test_cases_whole_and_split(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(&CASES[i]);
}

static void test_ids_follow_the_seed(void) {
    const char *text = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\","
                       "\"arguments\":{}}</tool_call>";
    char ids[3][64] = {{0}};
    const uint64_t seeds[3] = {7, 7, 8};
    char second[64] = {0};
    for (int i = 0; i < 3; i++) {
        chat_output_params params = TOOLS;
        params.id_seed = seeds[i];
        chat_output_parser *p = NULL;
        CHECK(chat_output_create(&params, &p) == KITE_OK);
        if (!p) return;
        chat_output_delta d;
        CHECK(chat_output_feed(p, text, strlen(text), &d) == KITE_OK);
        CHECK(chat_output_finish(p, &d) == KITE_OK);
        chat_output_result(p, &d);
        CHECK(d.n_calls == 2);
        if (d.n_calls == 2) {
            snprintf(ids[i], sizeof ids[i], "%s", d.calls[0].id);
            snprintf(second, sizeof second, "%s", d.calls[1].id);
            CHECK(is_call_id(d.calls[0].id) && is_call_id(d.calls[1].id));
            CHECK_MSG(strcmp(d.calls[0].id, d.calls[1].id) != 0, "two calls share the id %s", d.calls[0].id);
        }
        chat_output_free(p);
    }
    CHECK_MSG(strcmp(ids[0], ids[1]) == 0, "seed 7 gave %s and %s", ids[0], ids[1]);
    CHECK_MSG(strcmp(ids[0], ids[2]) != 0, "seeds 7 and 8 both gave %s", ids[0]);
}

static void test_a_held_call_streams_nothing_until_it_closes(void) {
    chat_output_parser *p = NULL;
    CHECK(chat_output_create(&TOOLS, &p) == KITE_OK);
    if (!p) return;
    chat_output_delta d;
    CHECK(chat_output_feed(p, "Hi <tool_call>{\"name\":\"f\",", 26, &d) == KITE_OK);
    CHECK(d.content_length == 3 && memcmp(d.content, "Hi ", 3) == 0 && d.n_calls == 0);
    CHECK(chat_output_feed(p, "\"arguments\":{}}</tool_c", 23, &d) == KITE_OK);
    CHECK(d.content_length == 0 && d.n_calls == 0);
    CHECK(chat_output_feed(p, "all>", 4, &d) == KITE_OK);
    CHECK(d.content_length == 0 && d.n_calls == 1 && d.calls && strcmp(d.calls[0].name, "f") == 0);
    CHECK(chat_output_finish(p, &d) == KITE_OK);
    CHECK(d.n_calls == 0 && d.content_length == 0);
    chat_output_free(p);
}

static void test_a_partial_tag_is_released_when_it_cannot_be_one(void) {
    chat_output_parser *p = NULL;
    CHECK(chat_output_create(&THINK_OPEN, &p) == KITE_OK);
    if (!p) return;
    chat_output_delta d;
    CHECK(chat_output_feed(p, "so </thi", 8, &d) == KITE_OK);
    CHECK(d.reasoning_length == 3 && memcmp(d.reasoning, "so ", 3) == 0);
    CHECK(chat_output_feed(p, "s", 1, &d) == KITE_OK);
    CHECK(d.reasoning_length == 6 && memcmp(d.reasoning, "</this", 6) == 0);
    CHECK(chat_output_feed(p, "\xe2\x98", 2, &d) == KITE_OK);
    CHECK(d.reasoning_length == 0);
    CHECK(chat_output_feed(p, "\x95", 1, &d) == KITE_OK);
    CHECK(d.reasoning_length == 3 && memcmp(d.reasoning, "☕", 3) == 0);
    chat_output_free(p);
}

/* T5 bounds what an open call holds: past max_call_bytes its text is released while the generation goes on. */
static void test_an_overlong_call_is_released_before_the_end(void) {
    const chat_output_params params = {.tools = true, .max_call_bytes = 16, .id_seed = 1};
    chat_output_parser *p = NULL;
    CHECK(chat_output_create(&params, &p) == KITE_OK);
    if (!p) return;
    chat_output_delta d;
    CHECK(chat_output_feed(p, "<tool_call>{\"name\": \"f\", ", 25, &d) == KITE_OK);
    CHECK(d.content_length == 0);
    CHECK(chat_output_feed(p, "\"arguments\"", 11, &d) == KITE_OK);
    CHECK_MSG(d.content_length == 36 && memcmp(d.content, "<tool_call>{\"name\": \"f\", \"arguments\"", 36) == 0,
              "released '%s'", d.content);
    CHECK(chat_output_feed(p, ": {}}</tool_call>", 17, &d) == KITE_OK);
    CHECK(d.content_length == 17 && d.n_calls == 0);
    chat_output_free(p);
}

static void test_misuse_is_refused(void) {
    chat_output_parser *p = NULL;
    chat_output_params params = {.starts_in_reasoning = true};
    CHECK(chat_output_create(&params, &p) == KITE_ERROR_INVALID_ARGUMENT && p == NULL);
    params = (chat_output_params){.tools = true};
    CHECK(chat_output_create(&params, &p) == KITE_ERROR_INVALID_ARGUMENT && p == NULL);
    params = (chat_output_params){.separator = "\n\n", .separator_length = 2}; /* a separator needs reasoning */
    CHECK(chat_output_create(&params, &p) == KITE_ERROR_INVALID_ARGUMENT && p == NULL);
    CHECK(chat_output_create(&PLAIN, &p) == KITE_OK);
    if (!p) return;
    chat_output_delta d;
    CHECK(chat_output_feed(p, NULL, 0, &d) == KITE_OK);
    CHECK(chat_output_feed(p, NULL, 1, &d) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(chat_output_finish(p, &d) == KITE_OK);
    CHECK(chat_output_feed(p, "x", 1, &d) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(chat_output_finish(p, &d) == KITE_ERROR_INVALID_ARGUMENT);
    chat_output_free(p);
}

int main(void) {
    TEST_RUN(test_cases_whole_and_split);
    TEST_RUN(test_ids_follow_the_seed);
    TEST_RUN(test_a_held_call_streams_nothing_until_it_closes);
    TEST_RUN(test_a_partial_tag_is_released_when_it_cannot_be_one);
    TEST_RUN(test_an_overlong_call_is_released_before_the_end);
    TEST_RUN(test_misuse_is_refused);
    return test_finish();
}

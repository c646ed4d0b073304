/* The chat format of a checkpoint directory (chat_format.h): where the template comes from, the end-of-turn
 * token and generation_config.json's defaults, what a rendered prompt says about the answer (thinking, an open
 * <think>, tools), and every malformed request or template refused with a message naming the field or line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat/chat_format.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/text_builder.h"

static tokenizer *tok;
static char dir[64];

/* A fresh directory holding `files` (name, text pairs, NULL-terminated). */
static void make_dir(const char *const *files) {
    snprintf(dir, sizeof dir, "/tmp/kite-chat-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    for (size_t i = 0; files && files[i]; i += 2) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        if (!f) continue;
        CHECK(fputs(files[i + 1], f) >= 0);
        CHECK(fclose(f) == 0);
    }
}

static void remove_dir(void) {
    static const char *const names[] = {"tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                                        "other.jinja"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    CHECK(rmdir(dir) == 0);
}

static chat_format *load(kite_status expected) {
    chat_format *f = NULL;
    const kite_status s = chat_format_load(dir, tok, &f);
    CHECK_MSG(s == expected, "load: %s (%s), expected %s", kite_status_string(s), kite_last_error(),
              kite_status_string(expected));
    return f;
}

static void render(const chat_format *f, const char *request, kite_status expected, const char *needle,
                   kite_chat_prompt *out) {
    const kite_status s = chat_format_render(f, request, strlen(request), out);
    CHECK_MSG(s == expected && (!needle || strstr(s == KITE_OK ? out->text : kite_last_error(), needle)),
              "%s: %s, '%s' (expected %s with '%s')", request, kite_status_string(s),
              s == KITE_OK ? out->text : kite_last_error(), kite_status_string(expected), needle ? needle : "");
}

/* The tiny checkpoint carries Qwen3's template: its end of turn is <|im_end|>, its generation_config.json adds
 * eos 151643 and does not sample. */
static void test_checkpoint_template(void) {
    chat_format *f = NULL;
    CHECK_MSG(chat_format_load(KITE_TEST_DATA_DIR "/tiny", tok, &f) == KITE_OK && f, "%s", kite_last_error());
    if (!f) return;
    int32_t ids[CHAT_MAX_STOP_IDS];
    const int32_t n = chat_format_stop_ids(f, ids);
    bool im_end = false, endoftext = false;
    for (int32_t i = 0; i < n; i++) {
        im_end |= ids[i] == tokenizer_token_to_id(tok, "<|im_end|>");
        endoftext |= ids[i] == 151643;
    }
    CHECK_MSG(im_end && endoftext, "%d stop ids", n);
    const kite_sampling s = chat_format_sampling_defaults(f);
    CHECK(s.temperature == 0.0f);

    kite_chat_prompt p;
    render(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", KITE_OK,
           "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", &p);
    CHECK(p.thinking && !p.starts_in_reasoning && !p.has_tools && p.n_ids > 0);
    CHECK(p.n_ids > 0 && p.ids[0] == tokenizer_token_to_id(tok, "<|im_start|>"));
    kite_chat_prompt_free(&p);
    render(f,
           "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": "
           "{\"enable_thinking\": false}}",
           KITE_OK, "<think>\n\n</think>\n\n", &p);
    CHECK(!p.thinking && !p.starts_in_reasoning);
    kite_chat_prompt_free(&p);
    const char *with_tools = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": "
                             "\"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}]}";
    render(f, with_tools, KITE_OK, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\"", &p);
    CHECK(p.has_tools);
    kite_chat_prompt_free(&p);
    render(f,
           "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", "
           "\"function\": {\"name\": \"f\"}}], \"tool_choice\": \"none\"}",
           KITE_OK, "<tools>", &p);
    CHECK(!p.has_tools); /* the tools are shown, as vLLM shows them, but not called */
    kite_chat_prompt_free(&p);
    /* An assistant turn's arguments string is parsed as vLLM parses it; its content may be null or absent. */
    render(f,
           "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": "
           "[{\"id\": \"1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
           "\"{\\\"a\\\":1.50}\"}}]}, {\"role\": \"tool\", \"content\": \"r\"}]}",
           KITE_OK, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1.5}}\n</tool_call>", &p);
    kite_chat_prompt_free(&p);
    render(f, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
              "{\"type\": \"text\", \"text\": \"b\"}]}]}",
           KITE_OK, "user\na\nb<|im_end|>", &p);
    kite_chat_prompt_free(&p);
    chat_format_free(f);
}

static void test_malformed_requests(void) {
    chat_format *f = NULL;
    CHECK(chat_format_load(KITE_TEST_DATA_DIR "/tiny", tok, &f) == KITE_OK && f);
    if (!f) return;
    static const struct {
        const char *request;
        kite_status status;
        const char *needle;
    } cases[] = {
        {"{\"messages\": [", KITE_ERROR_INVALID_INPUT, "chat request:1:"},
        {"[]", KITE_ERROR_INVALID_INPUT, "expected a JSON object"},
        {"{}", KITE_ERROR_INVALID_INPUT, "messages: expected a non-empty list"},
        {"{\"messages\": []}", KITE_ERROR_INVALID_INPUT, "messages: expected a non-empty list"},
        {"{\"messages\": [3]}", KITE_ERROR_INVALID_INPUT, "messages[0]: expected an object"},
        {"{\"messages\": [{\"content\": \"x\"}]}", KITE_ERROR_INVALID_INPUT, "messages[0].role"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", KITE_ERROR_INVALID_INPUT, "messages[0].content"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {}}]}]}",
         KITE_ERROR_UNSUPPORTED, "messages[0].content[0]"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"content\": \"b\"}]}", KITE_ERROR_INVALID_INPUT,
         "chat request:1:48: duplicate key \"content\""},
        {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": "
         "\"{\\\"a\\\": 1, \\\"a\\\": 2}\"}}]}]}",
         KITE_ERROR_INVALID_INPUT, "messages[0].tool_calls[0].function.arguments: not JSON (duplicate key \"a\")"},
        {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": "
         "\"{nope\"}}]}]}",
         KITE_ERROR_INVALID_INPUT, "messages[0].tool_calls[0].function.arguments: not JSON"},
        {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {}}]}]}", KITE_ERROR_INVALID_INPUT,
         "messages[0].tool_calls[0].function"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", KITE_ERROR_INVALID_INPUT,
         "tools: expected a list"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}",
         KITE_ERROR_INVALID_INPUT, "tool_choice: \"required\" needs tools"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": 1}",
         KITE_ERROR_INVALID_INPUT, "add_generation_prompt"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": []}",
         KITE_ERROR_INVALID_INPUT, "chat_template_kwargs: expected an object"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": {\"messages\": 1}}",
         KITE_ERROR_INVALID_INPUT, "chat_template_kwargs.messages"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kite_chat_prompt p;
        render(f, cases[i].request, cases[i].status, cases[i].needle, &p);
        if (cases[i].status == KITE_OK) kite_chat_prompt_free(&p);
    }
    chat_format_free(f);
}

#define TWO_TOOLS                                                                                                      \
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}, {\"type\": \"function\", "       \
    "\"function\": {\"name\": \"lookup\"}}]"
#define QUESTION_MESSAGE "\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}"
#define QUESTION QUESTION_MESSAGE "]"

/* Whether the prompt's ids are the start of the ids of its text followed by `rest` (what the model writes
 * next): the forced opening ends where the tokenizer would split the whole call anyway. */
static bool ids_begin_the_call(const kite_chat_prompt *p, const char *rest) {
    text_builder b = {0};
    text_builder_append(&b, p->text, p->length);
    text_builder_puts(&b, rest);
    int32_t *ids = NULL;
    size_t n = 0;
    const bool ok = !b.failed && tokenizer_encode(tok, b.data, b.length, &ids, &n) == KITE_OK && n > p->n_ids &&
                    memcmp(ids, p->ids, p->n_ids * sizeof *ids) == 0;
    free(ids);
    text_builder_free(&b);
    return ok;
}

/* Whether ids[0..n) hold seq[0..n_seq) somewhere. */
static bool ids_contain(const int32_t *ids, size_t n, const int32_t *seq, size_t n_seq) {
    for (size_t at = 0; at + n_seq <= n; at++)
        if (memcmp(ids + at, seq, n_seq * sizeof *seq) == 0) return true;
    return false;
}

/* With thinking, a forced call's insertion is "\n\n" and the opening after the </think> id, and those are the
 * tokens of Qwen3's template rendering an assistant turn that reasoned and then made the call (`call`, the
 * arguments as the template writes them): the engine's sequence is the one the template would give. */
static void check_insertion(const chat_format *f, const kite_chat_prompt *p, const char *call) {
    int32_t *end = NULL;
    size_t n_end = 0;
    CHECK(tokenizer_encode(tok, "</think>", 8, &end, &n_end) == KITE_OK && n_end == 1);
    CHECK(n_end == 1 && p->insert_after == end[0]);
    free(end);
    text_builder b = {0};
    text_builder_puts(&b, "\n\n");
    text_builder_append(&b, p->forced, p->forced_length);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(!b.failed && tokenizer_encode(tok, b.data, b.length, &ids, &n) == KITE_OK);
    CHECK(n == p->n_insert_ids && p->insert_ids && memcmp(ids, p->insert_ids, n * sizeof *ids) == 0);
    free(ids);
    text_builder_free(&b);
    /* The template's own rendering of the turn: </think>, then the insertion, then what the model writes. */
    text_builder request = {0};
    text_builder_printf(&request,
                        "{" QUESTION_MESSAGE ", {\"role\": \"assistant\", \"reasoning_content\": \"Let me see.\", "
                        "\"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": %s}]}], "
                        "\"add_generation_prompt\": false, " TWO_TOOLS "}",
                        call);
    kite_chat_prompt turn;
    render(f, request.data, KITE_OK, "Let me see.\n</think>\n\n<tool_call>\n", &turn);
    int32_t seq[1 + KITE_MAX_INSERT_IDS];
    seq[0] = p->insert_after;
    memcpy(seq + 1, p->insert_ids, p->n_insert_ids * sizeof *seq);
    CHECK_MSG(turn.ids && ids_contain(turn.ids, turn.n_ids, seq, 1 + p->n_insert_ids),
              "the insertion is not where the template's turn has it: %s", turn.text);
    kite_chat_prompt_free(&turn);
    text_builder_free(&request);
}

/* tool_choice "required" and a named function. With thinking (the default, or enable_thinking true) the turn
 * renders as asked and the call's opening is the insertion after the model's </think>; with enable_thinking
 * false the prompt ends with the opening exactly as Qwen3's template writes an assistant call, after its empty
 * think block. The call names are the tools' (required) or the one (named); the opening's tokens are those of
 * the whole call either way; bad choices are refused naming the field. */
static void test_forced_tool_choice(void) {
    chat_format *f = NULL;
    CHECK(chat_format_load(KITE_TEST_DATA_DIR "/tiny", tok, &f) == KITE_OK && f);
    if (!f) return;
    static const char opened[] = "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"";
    static const char asked[] = "<|im_start|>assistant\n";
    kite_chat_prompt p;
    render(f,
           "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": \"required\", \"chat_template_kwargs\": "
           "{\"enable_thinking\": false}}",
           KITE_OK, NULL, &p);
    CHECK_MSG(p.length > strlen(opened) && strcmp(p.text + p.length - strlen(opened), opened) == 0, "%s", p.text);
    CHECK(p.forced && strcmp(p.forced, "<tool_call>\n{\"name\": \"") == 0 && p.forced_length == strlen(p.forced));
    CHECK(p.tool_choice == KITE_TOOL_CHOICE_REQUIRED && p.has_tools && !p.thinking && !p.starts_in_reasoning);
    CHECK(p.n_insert_ids == 0 && !p.insert_ids);
    CHECK(p.n_call_names == 2 && strcmp(p.call_names[0], "get_weather") == 0 && strcmp(p.call_names[1], "lookup") == 0);
    CHECK(ids_begin_the_call(&p, "get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
    kite_chat_prompt_free(&p);

    kite_chat_prompt q;
    render(f, "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": \"required\"}", KITE_OK, NULL, &p);
    CHECK_MSG(strcmp(p.text + p.length - strlen(asked), asked) == 0, "%s", p.text);
    CHECK(p.forced && strcmp(p.forced, "<tool_call>\n{\"name\": \"") == 0);
    CHECK(p.tool_choice == KITE_TOOL_CHOICE_REQUIRED && p.has_tools && p.thinking && !p.starts_in_reasoning);
    CHECK(p.n_call_names == 2);
    check_insertion(f, &p, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}");
    render(f, "{" QUESTION ", " TWO_TOOLS ", \"chat_template_kwargs\": {\"enable_thinking\": true}}", KITE_OK, NULL,
           &q);
    CHECK(q.length == p.length && memcmp(q.text, p.text, p.length) == 0); /* as auto renders it */
    kite_chat_prompt_free(&q);
    render(f,
           "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": \"required\", \"chat_template_kwargs\": "
           "{\"enable_thinking\": true}}",
           KITE_OK, NULL, &q);
    CHECK(q.length == p.length && memcmp(q.text, p.text, p.length) == 0 && q.thinking);
    CHECK(q.n_insert_ids == p.n_insert_ids &&
          memcmp(q.insert_ids, p.insert_ids, p.n_insert_ids * sizeof(int32_t)) == 0);
    kite_chat_prompt_free(&q);
    kite_chat_prompt_free(&p);

    render(f,
           "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": "
           "{\"name\": \"lookup\"}}, \"chat_template_kwargs\": {\"enable_thinking\": false}}",
           KITE_OK, "</think>\n\n<tool_call>\n{\"name\": \"lookup\", \"arguments\":", &p);
    CHECK(p.forced && strcmp(p.forced, "<tool_call>\n{\"name\": \"lookup\", \"arguments\":") == 0);
    CHECK(p.length >= p.forced_length && strcmp(p.text + p.length - p.forced_length, p.forced) == 0);
    CHECK(p.tool_choice == KITE_TOOL_CHOICE_NAMED && p.has_tools && !p.thinking && p.n_insert_ids == 0);
    CHECK(p.n_call_names == 1 && strcmp(p.call_names[0], "lookup") == 0);
    CHECK(ids_begin_the_call(&p, " {\"city\": \"Paris\"}}\n</tool_call>"));
    kite_chat_prompt_free(&p);
    render(f,
           "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": "
           "{\"name\": \"lookup\"}}}",
           KITE_OK, NULL, &p);
    CHECK(strcmp(p.text + p.length - strlen(asked), asked) == 0 && p.thinking && p.n_call_names == 1);
    CHECK(p.forced && strcmp(p.forced, "<tool_call>\n{\"name\": \"lookup\", \"arguments\":") == 0);
    check_insertion(f, &p, "{\"name\": \"lookup\", \"arguments\": {\"city\": \"Paris\"}}");
    kite_chat_prompt_free(&p);

    render(f, "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": \"auto\"}", KITE_OK, NULL, &p);
    CHECK(p.tool_choice == KITE_TOOL_CHOICE_AUTO && p.has_tools && p.thinking && !p.forced && !p.call_names);
    CHECK(p.n_insert_ids == 0);
    kite_chat_prompt_free(&p);
    render(f, "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": \"none\"}", KITE_OK, NULL, &p);
    CHECK(p.tool_choice == KITE_TOOL_CHOICE_NONE && !p.has_tools && !p.forced);
    kite_chat_prompt_free(&p);

    static const struct {
        const char *request, *needle;
    } bad[] = {
        {"{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}}",
         "tool_choice.function.name: \"f\" is not one of the request's tools"},
        {"{" QUESTION ", \"tools\": [], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}}",
         "tool_choice: a named function needs tools"},
        {"{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": {\"function\": {\"name\": \"lookup\"}}}",
         "tool_choice.type: expected \"function\""},
        {"{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": \"lookup\"}}",
         "tool_choice.function.name: expected a string"},
        {"{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": \"any\"}", "tool_choice: expected \"auto\""},
        {"{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": 1}", "tool_choice: expected \"auto\""},
        {"{" QUESTION ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\\u0000b\"}}], "
         "\"tool_choice\": \"required\"}",
         "tools[0].function.name: expected a string without NUL"},
        {"{" QUESTION ", \"tools\": [{\"type\": \"function\"}], \"tool_choice\": \"required\"}",
         "tools[0].function.name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        render(f, bad[i].request, KITE_ERROR_INVALID_INPUT, bad[i].needle, &p);
    chat_format_free(f);

    /* A template that opens <think> for the answer (QwQ's) thinks whatever enable_thinking says: the opening is
     * the insertion after the model's </think>, and the answer starts as reasoning. */
    const char *files[] = {"tokenizer_config.json",
                           "{\"chat_template\": \"{{ '<|im_start|>assistant\\n<think>\\n' }}\"}", NULL};
    make_dir(files);
    f = load(KITE_OK);
    const char *const requests[] = {
        "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": \"required\"}",
        "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": \"required\", \"chat_template_kwargs\": "
        "{\"enable_thinking\": false}}"};
    for (size_t i = 0; f && i < 2; i++) {
        render(f, requests[i], KITE_OK, NULL, &p);
        CHECK(strcmp(p.text, "<|im_start|>assistant\n<think>\n") == 0 && p.thinking && p.starts_in_reasoning);
        CHECK(p.n_insert_ids > 0 && p.forced && strcmp(p.forced, "<tool_call>\n{\"name\": \"") == 0);
        kite_chat_prompt_free(&p);
    }
    chat_format_free(f);
    remove_dir();
}

/* Writes `length` bytes of `text` to DIR/name. */
static void write_file(const char *folder, const char *name, const char *text, size_t length) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", folder, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(text, 1, length, f) == length);
    CHECK(fclose(f) == 0);
}

/* With a tokenizer that has no single </think> token there is nothing to insert after: a template that opens
 * <think> itself is refused with a forced choice, and Qwen3's falls back to the opening at the prompt's end. */
static void test_forced_without_a_think_token(void) {
    size_t length = 0;
    char *json = test_read_file(KITE_TEST_DATA_DIR "/tokenizer/tokenizer.json", &length);
    CHECK(json != NULL);
    if (!json) return;
    char *added = strstr(json, "\"content\": \"</think>\"");
    CHECK(added != NULL);
    if (added) memcpy(added + strlen("\"content\": \"</th"), "o", 1); /* </thonk>: </think> is BPE text now */
    char folder[64];
    snprintf(folder, sizeof folder, "/tmp/kite-tok-XXXXXX");
    CHECK(mkdtemp(folder) != NULL);
    write_file(folder, "tokenizer.json", json, length);
    free(json);
    tokenizer *plain = NULL;
    CHECK_MSG(tokenizer_load(folder, &plain) == KITE_OK, "%s", kite_last_error());
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", folder);
    CHECK(unlink(path) == 0);
    CHECK(rmdir(folder) == 0);
    if (!plain) return;

    const char *files[] = {"tokenizer_config.json",
                           "{\"chat_template\": \"{{ '<|im_start|>assistant\\n<think>\\n' }}\"}", NULL};
    make_dir(files);
    chat_format *f = NULL;
    CHECK(chat_format_load(dir, plain, &f) == KITE_OK && f);
    kite_chat_prompt p;
    if (f)
        render(f, "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": \"required\"}", KITE_ERROR_UNSUPPORTED,
               "no single </think> token", &p);
    chat_format_free(f);
    remove_dir();

    f = NULL;
    CHECK(chat_format_load(KITE_TEST_DATA_DIR "/tiny", plain, &f) == KITE_OK && f);
    if (f) {
        static const char opened[] = "</think>\n\n<tool_call>\n{\"name\": \"";
        render(f, "{" QUESTION ", " TWO_TOOLS ", \"tool_choice\": \"required\"}", KITE_OK, NULL, &p);
        CHECK_MSG(strcmp(p.text + p.length - strlen(opened), opened) == 0, "%s", p.text);
        CHECK(!p.thinking && p.n_insert_ids == 0 && !p.insert_ids);
        kite_chat_prompt_free(&p);
    }
    chat_format_free(f);
    tokenizer_free(plain);
}

/* chat_template.jinja wins over tokenizer_config.json's chat_template; a named list gives "default" and, for
 * requests with tools, "tool_use"; a prompt that leaves <think> open starts the answer as reasoning;
 * generation_config.json's sampling and eos ids are read; a directory without a template has no format. */
static void test_template_sources(void) {
    const char *config_named = "{\"eos_token\": \"<|im_end|>\", \"chat_template\": [{\"name\": \"default\", "
                               "\"template\": \"D{{ messages[0].content }}\"}, {\"name\": \"tool_use\", \"template\": "
                               "\"T{{ tools | length }}\"}]}";
    const char *files[] = {"tokenizer_config.json", config_named, NULL};
    make_dir(files);
    chat_format *f = load(KITE_OK);
    kite_chat_prompt p;
    if (f) {
        render(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", KITE_OK, "Dx", &p);
        kite_chat_prompt_free(&p);
        render(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{}, {}]}", KITE_OK, "T2",
               &p);
        kite_chat_prompt_free(&p);
        const kite_sampling s = chat_format_sampling_defaults(f);
        CHECK(s.temperature == 0.0f); /* no generation_config.json: greedy */
    }
    chat_format_free(f);
    remove_dir();

    const char *files2[] = {"tokenizer_config.json", "{\"chat_template\": \"config\"}", "chat_template.jinja",
                            "{{ '<|im_start|>assistant\\n<think>\\n' }}", "generation_config.json",
                            "{\"do_sample\": true, \"temperature\": 0.6, \"top_p\": 0.95, \"top_k\": 20, "
                            "\"eos_token_id\": [151645, 151643]}",
                            NULL};
    make_dir(files2);
    f = load(KITE_OK);
    if (f) {
        render(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", KITE_OK, "<think>\n", &p);
        CHECK(p.starts_in_reasoning && p.thinking);
        kite_chat_prompt_free(&p);
        const kite_sampling s = chat_format_sampling_defaults(f);
        CHECK_MSG(s.temperature == 0.6f && s.top_p == 0.95f && s.top_k == 20, "%g %g %d", s.temperature, s.top_p,
                  s.top_k);
        int32_t ids[CHAT_MAX_STOP_IDS];
        CHECK(chat_format_stop_ids(f, ids) == 2 && ids[0] == 151645 && ids[1] == 151643);
    }
    chat_format_free(f);
    remove_dir();

    const char *none[] = {"tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}", NULL};
    make_dir(none);
    CHECK(load(KITE_OK) == NULL);
    remove_dir();
}

static void test_bad_files_refused(void) {
    static const struct {
        const char *name, *text;
        kite_status status;
        const char *needle;
    } cases[] = {
        {"chat_template.jinja", "line one\n{% if x %}\nunclosed", KITE_ERROR_INVALID_TEMPLATE, "chat_template.jinja"},
        {"chat_template.jinja", "{% frobnicate %}", KITE_ERROR_INVALID_TEMPLATE, "frobnicate"},
        {"tokenizer_config.json", "{\"chat_template\": 5}", KITE_ERROR_INVALID_TEMPLATE, "chat_template"},
        {"tokenizer_config.json", "{\"chat_template\": [{\"name\": \"default\"}]}", KITE_ERROR_INVALID_TEMPLATE,
         "chat_template[0]"},
        {"tokenizer_config.json", "{\"chat_template\": \"{{ x \"}", KITE_ERROR_INVALID_TEMPLATE, "tokenizer_config.json"},
        {"tokenizer_config.json", "{\"chat_template\": \"x\", \"eos_token\": 7}", KITE_ERROR_INVALID_TOKENIZER,
         "eos_token"},
        {"tokenizer_config.json", "{nope", KITE_ERROR_INVALID_TOKENIZER, "tokenizer_config.json:1:"},
        {"tokenizer_config.json", "{\"chat_template\": \"x\",\n \"chat_template\": \"y\"}", KITE_ERROR_INVALID_TOKENIZER,
         "tokenizer_config.json:2:2: duplicate key \"chat_template\""},
        {"generation_config.json", "{\"temperature\": 0.6, \"temperature\": 1.0}", KITE_ERROR_INVALID_CHECKPOINT,
         "generation_config.json:1:22: duplicate key \"temperature\""},
        {"generation_config.json", "{\"temperature\": \"hot\"}", KITE_ERROR_INVALID_CHECKPOINT, "temperature"},
        {"generation_config.json", "{\"eos_token_id\": [1, 99999999]}", KITE_ERROR_INVALID_CHECKPOINT,
         "eos_token_id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bool template_file = strcmp(cases[i].name, "tokenizer_config.json") != 0;
        const char *files[] = {cases[i].name, cases[i].text, template_file ? "tokenizer_config.json" : NULL,
                               "{\"chat_template\": \"x\"}", NULL};
        make_dir(files);
        chat_format *f = NULL;
        const kite_status s = chat_format_load(dir, tok, &f);
        CHECK_MSG(s == cases[i].status && strstr(kite_last_error(), cases[i].needle) && !f,
                  "case %zu: %s '%s' (expected %s with '%s')", i, kite_status_string(s), kite_last_error(),
                  kite_status_string(cases[i].status), cases[i].needle);
        chat_format_free(f);
        remove_dir();
    }
}

/* A template that raises: the request is refused with the template's own message. */
static void test_raise_exception(void) {
    const char *files[] = {"chat_template.jinja",
                           "{% if messages[0].role != 'user' %}{{ raise_exception('the first message must be the "
                           "user\\'s') }}{% endif %}ok",
                           NULL};
    make_dir(files);
    chat_format *f = load(KITE_OK);
    kite_chat_prompt p;
    if (f) {
        render(f, "{\"messages\": [{\"role\": \"system\", \"content\": \"x\"}]}", KITE_ERROR_INVALID_INPUT,
               "the first message must be the user's", &p);
        render(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", KITE_OK, "ok", &p);
        kite_chat_prompt_free(&p);
    }
    chat_format_free(f);
    remove_dir();
}

int main(void) {
    if (tokenizer_load(KITE_TEST_DATA_DIR "/tokenizer", &tok) != KITE_OK) {
        printf("cannot load tests/data/tokenizer: %s\n", kite_last_error());
        return 1;
    }
    TEST_RUN(test_checkpoint_template);
    TEST_RUN(test_malformed_requests);
    TEST_RUN(test_template_sources);
    TEST_RUN(test_forced_tool_choice);
    TEST_RUN(test_forced_without_a_think_token);
    TEST_RUN(test_bad_files_refused);
    TEST_RUN(test_raise_exception);
    tokenizer_free(tok);
    return test_finish();
}

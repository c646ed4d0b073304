/* A chat on the CPU with the tiny checkpoint (its tokenizer files carry Qwen3's real template), through kite.h:
 * kite_chat_render, then kite_chat_submit. The answer's deltas must be exactly what the output parser makes of
 * the raw text a plain request with the same ids, sampling and stop ids produces (with thinking on and off, with
 * tools; with a forced tool choice, the forced opening and then that text, or with thinking the text with the
 * opening inserted after the first </think>), the final event comes once and last,
 * and a cancelled answer ends as cancelled. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat_output.h"
#include "kite.h"
#include "test_util.h"
#include "util/text_builder.h"

typedef struct collected {
    text_builder reasoning, content, calls;
    int finals, after_final, events;
    int insertions; /* events whose token brought the prompt's insertion */
    kite_finish_reason finish;
} collected;

static void collect_chat(const kite_chat_event *e, void *user_data) {
    collected *c = user_data;
    if (c->finals) c->after_final++;
    c->events++;
    if (e->token && e->token->n_inserted > 0) c->insertions++;
    text_builder_append(&c->reasoning, e->delta.reasoning, e->delta.reasoning_length);
    text_builder_append(&c->content, e->delta.content, e->delta.content_length);
    for (size_t i = 0; i < e->delta.n_tool_calls; i++)
        text_builder_printf(&c->calls, "%s(%s);", e->delta.tool_calls[i].name, e->delta.tool_calls[i].arguments);
    if (e->finish) {
        c->finals++;
        c->finish = e->finish;
    }
}

typedef struct raw {
    text_builder text;
    kite_finish_reason finish;
    int insertions;
} raw;

static void collect_raw(const kite_token_event *e, void *user_data) {
    raw *r = user_data;
    if (e->n_inserted > 0) r->insertions++;
    text_builder_append(&r->text, e->text ? e->text : "", e->text_length);
    if (e->finish) r->finish = e->finish;
}

static kite_model *load_tiny(void) {
    kite_load_params p = kite_load_params_default();
    p.backend = KITE_BACKEND_CPU;
    p.n_threads = 2;
    kite_model *m = NULL;
    CHECK_MSG(kite_model_load(KITE_TEST_DATA_DIR "/tiny", &p, &m) == KITE_OK, "%s", kite_last_error());
    return m;
}

/* `bias`: a token the answer is pushed to write (logit_bias +100: every token then), -1 for none. Returns how
 * many of the answer's events brought the prompt's insertion. */
static int answer_matches_parsed_raw_text(kite_model *m, kite_engine *e, const char *request, kite_sampling s,
                                          int32_t bias) {
    const kite_chat *chat = kite_model_chat(m);
    kite_chat_prompt prompt;
    CHECK_MSG(kite_chat_render(chat, request, strlen(request), &prompt) == KITE_OK, "%s", kite_last_error());
    kite_request r = kite_request_default();
    r.sampling = s;
    r.max_tokens = 24;
    const kite_logit_bias push = {.token = bias, .bias = 100.0f};
    if (bias >= 0) {
        r.logit_bias = &push;
        r.n_logit_bias = 1;
    }
    collected c = {0};
    CHECK_MSG(kite_chat_submit(e, chat, &prompt, &r, collect_chat, &c, NULL) == KITE_OK, "%s", kite_last_error());
    CHECK(kite_engine_run(e) == KITE_OK);
    CHECK(c.finals == 1 && c.after_final == 0 && c.events >= 1);

    /* The same answer as a plain request with the prompt's insertion, its text parsed in one piece. */
    int32_t stop_ids[KITE_MAX_STOP_IDS];
    raw plain = {0};
    r.insert_after = prompt.insert_after;
    r.insert_ids = prompt.insert_ids;
    r.n_insert_ids = (int32_t)prompt.n_insert_ids;
    r.prompt_ids = prompt.ids;
    r.n_prompt_ids = prompt.n_ids;
    r.stop_ids = stop_ids;
    r.n_stop_ids = kite_chat_stop_ids(chat, stop_ids, KITE_MAX_STOP_IDS);
    r.on_token = collect_raw;
    r.user_data = &plain;
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
    CHECK(kite_engine_run(e) == KITE_OK);
    CHECK(plain.finish == c.finish && plain.insertions == c.insertions);
    const bool inserts = prompt.n_insert_ids > 0;
    chat_output_params params = {.reasoning = prompt.thinking,
                                 .starts_in_reasoning = prompt.thinking && prompt.starts_in_reasoning,
                                 .tools = prompt.has_tools,
                                 .max_call_bytes = 24 * 64 + prompt.forced_length,
                                 .id_seed = s.seed ^ 0x7001ca11ull,
                                 .call_names = (const char *const *)prompt.call_names,
                                 .n_call_names = prompt.n_call_names,
                                 .separator = inserts ? "\n\n" : NULL,
                                 .separator_length = inserts ? 2 : 0};
    chat_output_parser *parser = NULL;
    CHECK(chat_output_create(&params, &parser) == KITE_OK);
    chat_output_delta d, result;
    if (!inserts) /* the opening at the prompt's end is the answer's first bytes; an inserted one is in the text */
        CHECK(chat_output_feed(parser, prompt.forced ? prompt.forced : "", prompt.forced_length, &d) == KITE_OK);
    CHECK(chat_output_feed(parser, plain.text.data ? plain.text.data : "", plain.text.length, &d) == KITE_OK);
    CHECK(chat_output_finish(parser, &d) == KITE_OK);
    chat_output_result(parser, &result);
    CHECK_MSG(result.content_length == c.content.length &&
                  memcmp(result.content, c.content.data ? c.content.data : "", c.content.length) == 0,
              "content '%s' vs '%s'", c.content.data, result.content);
    CHECK_MSG(result.reasoning_length == c.reasoning.length &&
                  memcmp(result.reasoning, c.reasoning.data ? c.reasoning.data : "", c.reasoning.length) == 0,
              "reasoning '%s' vs '%s'", c.reasoning.data, result.reasoning);
    text_builder calls = {0};
    for (size_t i = 0; i < result.n_calls; i++)
        text_builder_printf(&calls, "%s(%s);", result.calls[i].name, result.calls[i].arguments);
    CHECK_MSG(calls.length == c.calls.length && memcmp(calls.data ? calls.data : "", c.calls.data ? c.calls.data : "",
                                                        calls.length) == 0,
              "calls '%s' vs '%s'", c.calls.data, calls.data);
    text_builder_free(&calls);
    chat_output_free(parser);
    text_builder_free(&plain.text);
    text_builder_free(&c.reasoning);
    text_builder_free(&c.content);
    text_builder_free(&c.calls);
    kite_chat_prompt_free(&prompt);
    return c.insertions;
}

static void test_answers_are_the_parsed_text(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    CHECK(kite_model_chat(m) != NULL);
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    kite_sampling greedy = kite_sampling_default(), sampled = kite_sampling_default();
    sampled.temperature = 0.9f;
    sampled.seed = 7;
    const char *think = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello there\"}]}";
    const char *no_think = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello there\"}], "
                           "\"chat_template_kwargs\": {\"enable_thinking\": false}}";
    const char *tools = "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"tools\": [{\"type\": "
                        "\"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
                        "\"object\"}}}]}";
    CHECK(answer_matches_parsed_raw_text(m, e, think, greedy, -1) == 0);
    CHECK(answer_matches_parsed_raw_text(m, e, no_think, greedy, -1) == 0);
    CHECK(answer_matches_parsed_raw_text(m, e, tools, sampled, -1) == 0);
    CHECK(answer_matches_parsed_raw_text(m, e, think, sampled, -1) == 0);
    /* The tiny model does not know how to go on from a forced opening: its answer is the malformed call's text,
     * the opening first. Without thinking the opening ends the prompt; with it (the default) the opening waits
     * for a </think> the tiny model does not write by itself, so it is pushed to write </think> (every token, so
     * its answer is not reasoning but text, with the opening inserted after the first one). */
    const char *required = "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"tools\": [{\"type\": "
                           "\"function\", \"function\": {\"name\": \"get_weather\"}}], \"tool_choice\": \"required\"}";
    const char *named = "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"tools\": [{\"type\": "
                        "\"function\", \"function\": {\"name\": \"get_weather\"}}], \"tool_choice\": {\"type\": "
                        "\"function\", \"function\": {\"name\": \"get_weather\"}}}";
    const char *required_no_think =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"tools\": [{\"type\": "
        "\"function\", \"function\": {\"name\": \"get_weather\"}}], \"tool_choice\": \"required\", "
        "\"chat_template_kwargs\": {\"enable_thinking\": false}}";
    int32_t *think_end = NULL;
    size_t n_think_end = 0;
    CHECK(kite_tokenize(m, "</think>", 8, &think_end, &n_think_end) == KITE_OK && n_think_end == 1);
    const int32_t end_id = n_think_end == 1 ? think_end[0] : -1;
    kite_free(think_end);
    CHECK(answer_matches_parsed_raw_text(m, e, required_no_think, greedy, -1) == 0);
    CHECK(answer_matches_parsed_raw_text(m, e, required, greedy, -1) == 0);
    CHECK(answer_matches_parsed_raw_text(m, e, required, greedy, end_id) == 1);
    CHECK(answer_matches_parsed_raw_text(m, e, named, sampled, end_id) == 1);
    CHECK(answer_matches_parsed_raw_text(m, e, named, sampled, -1) == 0);
    kite_engine_free(e);
    kite_model_free(m);
}

static void test_cancel_ends_the_answer(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    const kite_chat *chat = kite_model_chat(m);
    const char *request = "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me a story\"}]}";
    kite_chat_prompt prompt;
    CHECK(kite_chat_render(chat, request, strlen(request), &prompt) == KITE_OK);
    kite_request r = kite_request_default();
    r.max_tokens = 100;
    collected c = {0};
    kite_request_id id = -1;
    CHECK(kite_chat_submit(e, chat, &prompt, &r, collect_chat, &c, &id) == KITE_OK);
    kite_chat_prompt_free(&prompt);
    for (int i = 0; i < 3; i++) CHECK(kite_engine_step(e) == KITE_OK);
    CHECK(kite_engine_cancel(e, id) == KITE_OK);
    CHECK(kite_engine_run(e) == KITE_OK);
    CHECK_MSG(c.finals == 1 && c.after_final == 0 && c.finish == KITE_FINISH_CANCELLED, "finals %d finish %d",
              c.finals, c.finish);
    text_builder_free(&c.reasoning);
    text_builder_free(&c.content);
    text_builder_free(&c.calls);
    /* Misuse is refused before anything is queued. */
    kite_request bad = kite_request_default();
    kite_chat_prompt empty = {0};
    CHECK(kite_chat_submit(e, chat, &empty, &bad, collect_chat, &c, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(kite_chat_submit(e, NULL, &empty, &bad, collect_chat, &c, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    /* A forced opening must open a tool call. */
    const char *tools = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
                        "\"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"required\", "
                        "\"chat_template_kwargs\": {\"enable_thinking\": false}}";
    CHECK(kite_chat_render(chat, tools, strlen(tools), &prompt) == KITE_OK);
    prompt.forced[0] = 'x'; /* "xtool_call>..." is text */
    CHECK(kite_chat_submit(e, chat, &prompt, &bad, collect_chat, &c, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(kite_last_error(), "forced opening") != NULL);
    kite_chat_prompt_free(&prompt);
    /* An insertion is the forced call after the reasoning: without thinking it is refused. */
    const char *thinking_tools = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
                                 "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
                                 "\"tool_choice\": \"required\"}";
    CHECK(kite_chat_render(chat, thinking_tools, strlen(thinking_tools), &prompt) == KITE_OK);
    CHECK(prompt.n_insert_ids > 0 && prompt.thinking);
    prompt.thinking = false;
    CHECK(kite_chat_submit(e, chat, &prompt, &bad, collect_chat, &c, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(kite_last_error(), "an insertion needs") != NULL);
    kite_chat_prompt_free(&prompt);
    CHECK(kite_engine_idle(e));
    kite_engine_free(e);
    kite_model_free(m);
}

int main(void) {
    TEST_RUN(test_answers_are_the_parsed_text);
    TEST_RUN(test_cancel_ends_the_answer);
    return test_finish();
}

/* kite_chat_submit: a chat answer as an engine request whose text runs through the output parser
 * (chat_output.h), so the caller's callback gets reasoning, content and tool calls instead of raw text.
 *
 * The run lives from the submit to the request's final event, where it frees itself: the engine calls a
 * request's callback with exactly one final event, also when the request ends inside kite_engine_submit. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "chat/chat_output.h"
#include "chat/chat_tool_choice.h"
#include "kite.h"
#include "util/error.h"
#include "util/text_builder.h"

typedef struct chat_run {
    chat_output_parser *parser;
    kite_chat_callback on_event;
    void *user_data;
    text_builder reasoning, content; /* the final event's two deltas (the last feed's and finish's) joined */
    kite_tool_call *calls;           /* the public view of a delta's calls */
    size_t calls_capacity;
    chat_tool_call *final_calls;     /* copies of the last feed's calls, for the joined final delta */
    size_t n_final_calls;
    bool failed;                     /* out of memory: the rest of the answer is dropped, the final event says so */
} chat_run;

static void free_final_calls(chat_run *run) {
    for (size_t i = 0; i < run->n_final_calls; i++) {
        free(run->final_calls[i].id);
        free(run->final_calls[i].name);
        free(run->final_calls[i].arguments);
    }
    free(run->final_calls);
    run->final_calls = NULL;
    run->n_final_calls = 0;
}

static void run_free(chat_run *run) {
    chat_output_free(run->parser);
    text_builder_free(&run->reasoning);
    text_builder_free(&run->content);
    free(run->calls);
    free_final_calls(run);
    free(run);
}

/* The public kite_tool_call views of calls[0..n) (borrowed pointers). */
static bool view_calls(chat_run *run, const chat_tool_call *calls, size_t n) {
    if (n > run->calls_capacity) {
        kite_tool_call *grown = realloc(run->calls, n * sizeof *grown);
        if (!grown) return false;
        run->calls = grown;
        run->calls_capacity = n;
    }
    for (size_t i = 0; i < n; i++)
        run->calls[i] = (kite_tool_call){.id = calls[i].id, .name = calls[i].name, .arguments = calls[i].arguments};
    return true;
}

static bool copy_calls(chat_run *run, const chat_tool_call *calls, size_t n) {
    if (n == 0) return true;
    run->final_calls = calloc(n, sizeof *run->final_calls);
    if (!run->final_calls) return false;
    run->n_final_calls = n;
    for (size_t i = 0; i < n; i++) {
        chat_tool_call *c = &run->final_calls[i];
        c->id = strdup(calls[i].id);
        c->name = malloc(calls[i].name_length + 1);
        c->arguments = strdup(calls[i].arguments);
        if (!c->id || !c->name || !c->arguments) return false;
        memcpy(c->name, calls[i].name, calls[i].name_length + 1);
        c->name_length = calls[i].name_length;
        c->arguments_length = calls[i].arguments_length;
    }
    return true;
}

static void emit(chat_run *run, const kite_token_event *token, const chat_output_delta *d, kite_finish_reason finish) {
    kite_chat_event event = {.request = token->request, .token = token, .finish = finish};
    if (d && view_calls(run, d->calls, d->n_calls)) {
        event.delta = (kite_chat_delta){.reasoning = d->reasoning,
                                        .reasoning_length = d->reasoning_length,
                                        .content = d->content,
                                        .content_length = d->content_length,
                                        .tool_calls = run->calls,
                                        .n_tool_calls = d->n_calls};
    } else {
        run->failed = run->failed || d != NULL;
        event.delta = (kite_chat_delta){.reasoning = "", .content = ""};
    }
    run->on_event(&event, run->user_data);
}

/* The final event: what the last piece of text added and what the parser still held, as one delta. */
static void emit_final(chat_run *run, const kite_token_event *token, const chat_output_delta *last) {
    text_builder_append(&run->reasoning, last->reasoning, last->reasoning_length);
    text_builder_append(&run->content, last->content, last->content_length);
    if (!copy_calls(run, last->calls, last->n_calls)) run->failed = true;
    chat_output_delta rest;
    if (chat_output_finish(run->parser, &rest) != KITE_OK) run->failed = true;
    if (!run->failed) {
        text_builder_append(&run->reasoning, rest.reasoning, rest.reasoning_length);
        text_builder_append(&run->content, rest.content, rest.content_length);
    }
    const size_t n_calls = run->n_final_calls + (run->failed ? 0 : rest.n_calls);
    chat_tool_call *all = n_calls ? malloc(n_calls * sizeof *all) : NULL;
    if (n_calls && !all) run->failed = true;
    if (run->failed || run->reasoning.failed || run->content.failed) {
        free(all);
        /* Nothing of the answer's end can be trusted after a failed allocation: the request ends as cancelled. */
        kite_token_event cancelled = *token;
        cancelled.finish = KITE_FINISH_CANCELLED;
        emit(run, &cancelled, NULL, KITE_FINISH_CANCELLED);
        return;
    }
    if (n_calls) {
        memcpy(all, run->final_calls, run->n_final_calls * sizeof *all);
        memcpy(all + run->n_final_calls, rest.calls, rest.n_calls * sizeof *all);
    }
    const chat_output_delta joined = {.reasoning = run->reasoning.data ? run->reasoning.data : "",
                                      .reasoning_length = run->reasoning.length,
                                      .content = run->content.data ? run->content.data : "",
                                      .content_length = run->content.length,
                                      .calls = all,
                                      .n_calls = n_calls};
    emit(run, token, &joined, token->finish);
    free(all);
}

static void on_token(const kite_token_event *token, void *user_data) {
    chat_run *run = user_data;
    chat_output_delta d = {0};
    const bool fed = !run->failed && chat_output_feed(run->parser, token->text ? token->text : "",
                                                      token->text_length, &d) == KITE_OK;
    if (!fed) run->failed = true;
    if (token->finish == KITE_FINISH_NONE) {
        if (fed) emit(run, token, &d, KITE_FINISH_NONE);
        return;
    }
    emit_final(run, token, fed ? &d : &(chat_output_delta){.reasoning = "", .content = ""});
    run_free(run);
}

/* The forced opening at the prompt's end (kite_chat_prompt.forced) is the answer's first bytes for the parser. It
 * opens a tool call, which the parser holds until the call is complete, so it adds nothing to the first event. An
 * opening inserted after the reasoning reaches the parser in the engine's text instead. */
static kite_status feed_forced(chat_output_parser *parser, const kite_chat_prompt *prompt) {
    if (prompt->forced_length == 0) return KITE_OK;
    if (!prompt->forced || !prompt->has_tools)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_chat_submit: a forced opening needs its text and tools");
    if (prompt->n_insert_ids > 0) return KITE_OK; /* it comes after the reasoning, in the engine's text */
    chat_output_delta d;
    KITE_TRY(chat_output_feed(parser, prompt->forced, prompt->forced_length, &d));
    if (d.reasoning_length || d.content_length || d.n_calls)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "kite_chat_submit: the prompt's forced opening must open a tool call (it gave text)");
    return KITE_OK;
}

kite_status kite_chat_submit(kite_engine *engine, const kite_chat *chat, const kite_chat_prompt *prompt,
                             const kite_request *request, kite_chat_callback on_event, void *user_data,
                             kite_request_id *id) {
    if (!engine || !chat || !prompt || !request || !on_event)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_chat_submit: NULL argument");
    if (!prompt->ids || prompt->n_ids == 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_chat_submit: the prompt has no token ids");
    chat_run *run = calloc(1, sizeof *run);
    if (!run) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "chat: out of memory");
    run->on_event = on_event;
    run->user_data = user_data;
    /* A request without a seed (fresh_seed) gets fresh tool-call ids too, not the ids of seed 0. */
    uint64_t id_seed = request->sampling.seed;
    if (request->sampling.fresh_seed && getentropy(&id_seed, sizeof id_seed) != 0) {
        run_free(run);
        return kite_fail(KITE_ERROR_IO, "chat: getentropy for fresh tool-call ids failed: %s", strerror(errno));
    }
    /* An open tool call holds at most what the answer may produce (64 bytes a token is more than any token),
     * after the forced opening. */
    const size_t max_call_bytes =
        (request->max_tokens > 0 ? (size_t)request->max_tokens * 64 : (size_t)1 << 24) + prompt->forced_length;
    /* An insertion is the forced call after the model's </think> (kite_chat_prompt.insert_ids): it needs the
     * reasoning split, and the "\n\n" the engine inserts before the opening is no content of the answer. */
    const bool inserts = prompt->n_insert_ids > 0;
    if (inserts && (!prompt->insert_ids || !prompt->thinking || !prompt->forced || !prompt->has_tools ||
                    prompt->n_insert_ids > KITE_MAX_INSERT_IDS)) {
        run_free(run);
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "kite_chat_submit: an insertion needs its ids (at most %d), thinking and a forced opening",
                         KITE_MAX_INSERT_IDS);
    }
    const chat_output_params params = {.reasoning = prompt->thinking,
                                       .starts_in_reasoning = prompt->thinking && prompt->starts_in_reasoning,
                                       .tools = prompt->has_tools,
                                       .max_call_bytes = max_call_bytes,
                                       .id_seed = id_seed ^ 0x7001ca11ull,
                                       .call_names = (const char *const *)prompt->call_names,
                                       .n_call_names = prompt->n_call_names,
                                       .separator = inserts ? CHAT_THINK_SEPARATOR : NULL,
                                       .separator_length = inserts ? strlen(CHAT_THINK_SEPARATOR) : 0};
    kite_status status = chat_output_create(&params, &run->parser);
    if (status == KITE_OK) status = feed_forced(run->parser, prompt);
    if (status != KITE_OK) {
        run_free(run);
        return status;
    }
    int32_t stop_ids[KITE_MAX_STOP_IDS];
    int32_t n_stop = request->n_stop_ids < 0 ? 0 : request->n_stop_ids;
    if (n_stop > KITE_MAX_STOP_IDS || (n_stop > 0 && !request->stop_ids)) {
        run_free(run);
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_chat_submit: bad stop ids");
    }
    if (n_stop > 0) memcpy(stop_ids, request->stop_ids, (size_t)n_stop * sizeof *stop_ids);
    int32_t chat_stops[KITE_MAX_STOP_IDS];
    const int32_t n_chat = kite_chat_stop_ids(chat, chat_stops, KITE_MAX_STOP_IDS);
    for (int32_t i = 0; i < n_chat && n_stop < KITE_MAX_STOP_IDS; i++) stop_ids[n_stop++] = chat_stops[i];
    kite_request r = *request;
    r.prompt_ids = prompt->ids;
    r.n_prompt_ids = prompt->n_ids;
    r.prompt_text = NULL;
    r.prompt_text_length = 0;
    r.stop_ids = stop_ids;
    r.n_stop_ids = n_stop;
    r.insert_after = prompt->insert_after;
    r.insert_ids = prompt->insert_ids;
    r.n_insert_ids = (int32_t)prompt->n_insert_ids;
    r.on_token = on_token;
    r.user_data = run;
    status = kite_engine_submit(engine, &r, id);
    if (status != KITE_OK) run_free(run); /* no event was delivered: the request was refused before it existed */
    return status;
}

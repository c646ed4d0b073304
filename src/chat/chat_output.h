/* A Qwen3 model's generated text split into reasoning_content, content and tool_calls, incrementally: what the
 * server's /v1/chat/completions (streamed or not) and `kite chat` show. The reference is vLLM's `qwen3` reasoning
 * parser (vllm/reasoning/qwen3_reasoning_parser.py over basic_parsers.py) followed by its `hermes` tool parser
 * (vllm/tool_parsers/hermes_tool_parser.py), applied as vLLM's serving layer applies them: reasoning first, the
 * tool parser on the content only.
 *
 * Rules (tags are matched as exact ASCII bytes, anywhere, whatever the pieces the text arrives in):
 *
 * Reasoning (params.reasoning):
 *  R1. Off: no split at all; every byte is content, `<think>` and `</think>` included. (vLLM skips its
 *      reasoning parser when the prompt already closed thinking, enable_thinking=False; its non-streamed
 *      extract_reasoning would still cut at a `</think>` the model wrote anyway; kite never does.)
 *  R2. On: a `<think>` at the very first byte of the text is dropped and the text after it is reasoning.
 *      With `starts_in_reasoning` (the prompt ends with an open "<think>\n", as Qwen3-2507 Thinking templates
 *      do) the text is reasoning from its first byte, whether or not it repeats `<think>`.
 *      Without it and without a leading `<think>`, the text is content from its first byte (R4 does not apply).
 *      vLLM's current qwen3 parser treats the text before `</think>` as reasoning even when `<think>` appears
 *      nowhere, since it cannot know the prompt; kite's caller knows, so it says so with starts_in_reasoning.
 *      vLLM also drops everything before the first `<think>` found anywhere (str.partition); kite only drops
 *      a leading one, and a later `<think>` is text of the part it falls in.
 *  R3. Reasoning ends at the first `</think>` (dropped); everything after it is content, as it is: Qwen3
 *      writes "</think>\n\n", so content starts with "\n\n", as in vLLM (which strips nothing either).
 *  R4. No `</think>` ever comes: everything after the start is reasoning and content is empty, as in vLLM's
 *      current qwen3 parser with thinking enabled ("the output was truncated"). (Older vLLM returned such
 *      text as content when `<think>` was absent; kite's R2 keeps that case, without starts_in_reasoning.)
 *      `<tool_call>` inside reasoning is reasoning text: vLLM ends reasoning at a `<tool_call>` only when
 *      `<function=` follows it, Qwen3.5's XML call format, which this parser does not read.
 *  R5. With params.separator (a forced tool call after the reasoning: the engine inserts "\n\n" and the call's
 *      opening after the model's `</think>`, chat_tool_choice.h), the content drops those bytes when it begins
 *      with them, so a forced call's content is empty as it is without thinking (vLLM's forced calls have
 *      content ""). Content that begins otherwise is kept whole.
 *
 * Tool calls (params.tools: the request has tools and tool_choice is not "none"),
 * in the content only, as vLLM's hermes parser:
 *  T1. The content is the text before the first `<tool_call>`. A call is `<tool_call>` BODY `</tool_call>`,
 *      or `<tool_call>` BODY running to the end of the text (vLLM's `<tool_call>(.*)` alternative).
 *  T2. BODY, with its surrounding whitespace, is one JSON object (json.loads) with a string "name" and an
 *      "arguments" member of any JSON type; other members are ignored; for a key given twice the last value
 *      counts, at any depth, as in a Python dict (the body is read with JSON_DUPLICATE_KEYS_LAST_WINS, so the
 *      arguments keep one member per key, in the order of their first appearance). The call: id "chatcmpl-tool-" + 32 lower-case hex digits of a version-4
 *      UUID (vLLM's make_tool_call_id; drawn here from params.id_seed so tests are deterministic), type
 *      "function", name as given, arguments = json.dumps(arguments, ensure_ascii=False) (python_json_value).
 *      Arguments given as a JSON string come out as that string re-serialized, quotes and escapes included,
 *      exactly as vLLM's json.dumps does (vLLM does not pass a string through unquoted).
 *  T3. Text between and after valid calls is dropped, as vLLM's findall drops it (its content is only the text
 *      before the first call, in both its streamed and non-streamed paths).
 *  T4. A malformed call (BODY not a JSON object, no string "name", no "arguments", an empty body) ends tool
 *      parsing: that call's text, tags included, and everything after it are content. When it is the first
 *      call, the content is therefore the whole text and there are no calls, exactly vLLM's non-streamed
 *      result ("everything is content"). When valid calls came before it, kite keeps them (they may already
 *      have been streamed and cannot be taken back) and drops the text between them (T3); vLLM's
 *      non-streamed path would return no calls and the whole text as content there.
 *  T5. A call whose BODY grows past params.max_call_bytes without its `</tool_call>` is malformed (T4),
 *      which bounds the memory held for an open call. vLLM has no such limit; with the request's output
 *      budget as the limit the two agree.
 *  T6. With params.call_names (a forced tool_choice: chat_tool_choice.h), a call whose name is none of them
 *      is malformed (T4). vLLM's grammar never lets such a call be written; kite's parser turns it into text.
 *  JSON differences left (kite's reader is strict RFC 8259, Python's is not): NaN, Infinity and -Infinity
 *  make a call malformed here while json.loads reads them; so do invalid UTF-8 inside a string (vLLM's
 *  detokenizer would have made it U+FFFD first) and nesting deeper than JSON_MAX_DEPTH; integers beyond int64
 *  are re-serialized as floats (Python keeps every digit).
 *
 * Streaming: chat_output_feed takes pieces split at any byte (inside a tag, inside a UTF-8 sequence) and
 * returns what each piece adds. Held back are only bytes that could still begin a tag (a suffix such as
 * "<thi" or "</tool_ca"), the body of an open tool call (emitted whole when `</tool_call>` arrives or at the
 * end; content only if it turns out malformed, T4), and the bytes of a UTF-8 sequence not yet complete, so a
 * delta never ends inside a character; at chat_output_finish everything held is resolved (a partial tag is
 * text, invalid UTF-8 passes through unchanged). The guarantee, tested for every split: the deltas,
 * concatenated, and the final result are the same as for the whole text fed at once. vLLM's streamed path
 * instead sends content up to a `<tool_call>` and argument fragments as they come, and cannot match its own
 * non-streamed result for a malformed call; kite streams whole calls.
 */
#ifndef KITE_CHAT_CHAT_OUTPUT_H
#define KITE_CHAT_CHAT_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kite.h"

typedef struct chat_output_params {
    bool reasoning;           /* split <think>...</think> (R1-R4) */
    bool starts_in_reasoning; /* the prompt opened <think>: the text starts as reasoning (R2); needs reasoning */
    bool tools;               /* parse <tool_call> blocks in the content (T1-T5) */
    size_t max_call_bytes;    /* with tools: the most bytes an open call's body may hold (T5); must be > 0 */
    uint64_t id_seed;         /* seeds the tool call ids; callers pass a random value, tests a fixed one */
    const char *const *call_names; /* with tools: the only names a call may have (T6); NULL: any name */
    size_t n_call_names;
    const char *separator;    /* with reasoning: bytes dropped where they begin the content (R5); borrowed, */
    size_t separator_length;  /* must outlive the parser; NULL (0) for none */
} chat_output_params;

typedef struct chat_tool_call {
    char *id;        /* "chatcmpl-tool-" + 32 hex digits, NUL-terminated */
    char *name;      /* NUL-terminated; name_length bytes (a "\u0000" in the name stays) */
    size_t name_length;
    char *arguments; /* json.dumps(arguments, ensure_ascii=False), NUL-terminated */
    size_t arguments_length;
} chat_tool_call;

/* Text and calls, owned by the parser. Strings are NUL-terminated ("" when empty); an empty string stands for
 * vLLM's None. In a delta: what one feed or finish added, valid until the next call on the parser. */
typedef struct chat_output_delta {
    const char *reasoning;
    size_t reasoning_length;
    const char *content;
    size_t content_length;
    const chat_tool_call *calls;
    size_t n_calls;
} chat_output_delta;

typedef struct chat_output_parser chat_output_parser;

/* KITE_ERROR_INVALID_ARGUMENT for starts_in_reasoning without reasoning or tools without max_call_bytes. */
kite_status chat_output_create(const chat_output_params *params, chat_output_parser **out);
/* Feeds generated text[0..length) (any split; length 0 is fine) and fills *delta with what it adds. */
kite_status chat_output_feed(chat_output_parser *parser, const char *text, size_t length, chat_output_delta *delta);
/* The end of generation: resolves everything held back and fills *delta with it. Feeding after it is
 * KITE_ERROR_INVALID_ARGUMENT. */
kite_status chat_output_finish(chat_output_parser *parser, chat_output_delta *delta);
/* Everything so far, for non-streamed responses (after finish: the final result); valid until the next feed,
 * finish or free. */
void chat_output_result(const chat_output_parser *parser, chat_output_delta *result);
void chat_output_free(chat_output_parser *parser);

#endif

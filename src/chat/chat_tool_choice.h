/* A chat request's tool_choice, in OpenAI's shapes ("auto", "none", "required", {"type": "function",
 * "function": {"name": N}}), read against the request's tools, and what a forced choice adds to the prompt.
 *
 * kite has no grammar engine to constrain decoding (vLLM and llama.cpp force these choices with one), so a
 * forced choice is kept by writing the first call's opening for the model: the bytes Qwen3's template writes
 * for an assistant tool call, '<tool_call>\n{"name": "' for "required" (the model must name a tool) and
 * '<tool_call>\n{"name": "N", "arguments":' for a named function (the model writes the arguments). Without
 * thinking the prompt ends with them; with thinking the engine inserts CHAT_THINK_SEPARATOR and them after
 * the model's own </think> (kite_request.insert_ids), so the model reasons first, as vLLM lets it before its
 * grammar takes over. The named opening stops before the space the template writes after the colon: Qwen's
 * pre-tokenizer joins that space to the "{" that follows (' {"'), so a prompt ending in the space would end
 * in a token the model never writes; ending at the colon, the model's own next token is ' {"'. The output
 * parser reads the opening as the answer's first bytes and accepts only calls whose name is allowed (the
 * tools' names, or N), so an answer that goes wrong after the opening is what a malformed call always is:
 * text, never a made-up call. */
#ifndef KITE_CHAT_CHAT_TOOL_CHOICE_H
#define KITE_CHAT_CHAT_TOOL_CHOICE_H

#include <stdbool.h>

#include "kite.h"
#include "util/json.h"

/* What Qwen3's template writes between an assistant turn's </think> and its content, and what the models write
 * after their own </think>: the insertion's first bytes, which the output parser drops again (chat_output.h, R5). */
#define CHAT_THINK_SEPARATOR "\n\n"

typedef struct chat_tool_choice {
    kite_tool_choice choice;
    const json_value *name; /* NAMED: the function's name, a string of the request's document */
} chat_tool_choice;

/* Reads root's "tool_choice" (absent or null: auto) against `tools` (the request's list, NULL when it offers
 * none). A shape OpenAI does not define, "required" or a function without tools, or a function that is not one
 * of the tools is KITE_ERROR_INVALID_INPUT naming the field. */
kite_status chat_tool_choice_read(const json_value *root, const json_value *tools, chat_tool_choice *out);

/* Whether the choice forces the answer's first call. */
bool chat_tool_choice_forces(const chat_tool_choice *choice);

/* For a forcing choice: the opening (prompt->forced) and the names a call may have (prompt->call_names), both
 * malloc'd, freed by kite_chat_prompt_free; nothing for the others. */
kite_status chat_tool_choice_prepare(const chat_tool_choice *choice, const json_value *tools, kite_chat_prompt *prompt);

#endif

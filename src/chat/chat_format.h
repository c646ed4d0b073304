/* A checkpoint's chat format: its chat template (parsed once), the tokens the template is rendered with, the
 * token that ends an assistant turn, and the sampling defaults of generation_config.json.
 *
 * Where the template comes from, as transformers reads it: DIR/chat_template.jinja when it exists, else the
 * `chat_template` of DIR/tokenizer_config.json (a string, or a list of {name, template} of which "default" is
 * used, and "tool_use" for requests with tools when present). A checkpoint without either has no chat format.
 *
 * Rendering takes a /v1/chat/completions request body and prepares it as vLLM does before the template sees it:
 * content that is null or absent becomes "", content given as a list of text parts is joined with "\n", a tool
 * call's `arguments` string is parsed into its object (an empty one becomes {}), an empty tools list offers no
 * tools, `add_generation_prompt` defaults to true, and the members of `chat_template_kwargs` (enable_thinking,
 * ...) become template variables. The template then sees, as with
 * transformers' apply_chat_template: messages, tools (none when absent), documents (none),
 * add_generation_prompt, the special tokens of tokenizer_config.json (bos_token, eos_token, unk_token, pad_token,
 * additional_special_tokens, where set) and the kwargs.
 */
#ifndef KITE_CHAT_CHAT_FORMAT_H
#define KITE_CHAT_CHAT_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kite.h"
#include "tokenizer/tokenizer.h"

#define CHAT_MAX_STOP_IDS 8

typedef struct chat_format chat_format;

/* Loads DIR's chat format for `tokenizer` (borrowed: it must outlive the format). *out is NULL, with KITE_OK,
 * when DIR has no chat template. A template kite cannot run is KITE_ERROR_INVALID_TEMPLATE naming its file
 * and line; a damaged generation_config.json is KITE_ERROR_INVALID_CHECKPOINT. */
kite_status chat_format_load(const char *dir, const tokenizer *tokenizer, chat_format **out);
/* The same with the template read from `template_path` (a .jinja file) instead of DIR's own; the rest (special
 * tokens, generation_config.json) still comes from DIR. */
kite_status chat_format_load_template(const char *dir, const char *template_path, const tokenizer *tokenizer,
                                      chat_format **out);
void chat_format_free(chat_format *format);

/* Renders request_json (see kite_chat_render in kite.h)[0..length). A malformed request (bad JSON, a missing or mistyped field) or an error the
 * template raises is KITE_ERROR_INVALID_INPUT naming the field or quoting the template's message. */
kite_status chat_format_render(const chat_format *format, const char *request_json, size_t length, kite_chat_prompt *out);

/* The ids that end an answer besides config.json's eos ids: the template's end-of-turn token and
 * generation_config.json's eos_token_id. Returns how many (at most CHAT_MAX_STOP_IDS). */
int32_t chat_format_stop_ids(const chat_format *format, int32_t *ids);

/* generation_config.json's sampling (temperature, top_k, top_p, min_p, repetition_penalty; greedy when
 * do_sample is false), for requests that set none; kite_sampling_default() when the file is absent. */
kite_sampling chat_format_sampling_defaults(const chat_format *format);

#endif

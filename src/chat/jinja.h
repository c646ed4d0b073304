/* A Jinja2 interpreter for chat templates: the subset that real Hugging Face chat templates use, with the
 * semantics of jinja2 as transformers runs it (`apply_chat_template`: trim_blocks and lstrip_blocks on, the
 * loopcontrols extension, `tojson` as json.dumps(ensure_ascii=False), `raise_exception`, `strftime_now`).
 *
 * A template is parsed once (when the model loads) and rendered per request. Parsing refuses any construct the
 * interpreter does not implement, naming the template's line and the construct, so an unsupported template
 * fails at load time and never half-renders. Rendering takes the variables as one JSON object (its members are
 * the template's top-level names: messages, tools, add_generation_prompt, enable_thinking, bos_token, ...):
 * JSON maps onto Jinja's values exactly (object -> dict in key order, array -> list, integer/float kept apart,
 * true/false/null -> True/False/None), and a key that is absent is undefined, which is how templates tell
 * "reasoning_content is defined" from "is none".
 *
 * The implementation, one job a file: jinja_lex.c (tokens, whitespace control), jinja_parse.c (the syntax tree;
 * its header lists the statements and what is refused), jinja_eval.c (scopes, operators, bounds),
 * jinja_builtins.c (filters, tests, methods, global functions; its header lists them), jinja_value.c (values,
 * Python's printing, comparison and json.dumps), jinja_internal.h (what they share).
 * Known differences from jinja2, each refused rather than guessed where it matters: integers are int64 (an
 * overflow is an error); dict views and range() are plain lists (printing one shows a list, not
 * "dict_items([...])" or "range(0, 3)"); generators (map, select, ...) are computed eagerly; `%` formatting,
 * str.format and a few rarely used filters and methods are refused.
 */
#ifndef KITE_CHAT_JINJA_H
#define KITE_CHAT_JINJA_H

#include <stddef.h>

#include "kite.h"
#include "util/json.h"

typedef struct jinja_template jinja_template;

/* Parses source[0..length). `name` labels messages ("tokenizer_config.json chat_template:12: ..."). A syntax
 * error or an unimplemented construct is KITE_ERROR_INVALID_TEMPLATE with the line and the construct named. */
kite_status jinja_parse(const char *source, size_t length, const char *name, jinja_template **out);
void jinja_free(jinja_template *template_);

/* Renders with `variables` (a JSON object) into a malloc'd NUL-terminated string (*out, *out_length bytes).
 * A `raise_exception(message)` in the template is KITE_ERROR_INVALID_INPUT with the template's message; a
 * runtime error (calling an undefined function, a type error jinja2 would raise) is KITE_ERROR_INVALID_INPUT
 * naming the line. Rendering is bounded (output size, loop iterations, recursion depth): a template can never
 * hang or exhaust memory. A template is immutable after parsing and may be rendered from several threads. */
kite_status jinja_render(const jinja_template *template_, const json_value *variables, char **out, size_t *out_length);

#endif

/* JSON written byte for byte as Python's json.dumps(value, ensure_ascii=False) writes it, which is what chat
 * templates see through transformers' `tojson` and what vLLM puts in a tool call's `arguments`: ", " between
 * items and ": " after keys (unless `compact`: "," and ":"), keys in their order, non-ASCII text as it is, only
 * '"', '\\' and control characters escaped (\n \r \t \b \f by name, the rest \u00XX), integers as integers
 * and floats as Python's repr (shortest round trip: 1.0, 0.1, 1e-05, 1e+16). */
#ifndef KITE_CHAT_PYTHON_JSON_H
#define KITE_CHAT_PYTHON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/json.h"
#include "util/text_builder.h"

void python_json_string(text_builder *b, const char *text, size_t length);
/* repr(float(value)); json.dumps writes inf and nan as Infinity, -Infinity, NaN. */
void python_json_float(text_builder *b, double value);
void python_json_int(text_builder *b, int64_t value);
/* A whole parsed value; `indent` < 0: on one line; >= 0: json.dumps(indent=N) layout (newlines, N spaces a
 * level, "," at line ends). */
void python_json_value(text_builder *b, const json_value *value, int indent, bool compact);

#endif

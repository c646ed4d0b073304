/* config.json of a Hugging Face Qwen3 checkpoint -> qwen3_config.
 *
 * Both published layouts are read: the hub's (top-level `rope_theta`, `torch_dtype`) and the newer
 * transformers one (`rope_parameters: {rope_theta, rope_type}`, `dtype`). Every field kite depends on is
 * checked; a damaged or inconsistent file gives KITE_ERROR_INVALID_CHECKPOINT, a well-formed one asking for
 * a feature kite lacks (attention bias, rope scaling, sliding windows, another architecture) gives
 * KITE_ERROR_UNSUPPORTED. Messages name the file and the field.
 */
#ifndef KITE_CHECKPOINT_CONFIG_H
#define KITE_CHECKPOINT_CONFIG_H

#include <stddef.h>

#include "kite.h"
#include "model/qwen3.h"

/* Parses config.json text[0..length). `path` is only used in messages. */
kite_status qwen3_config_parse(const char *text, size_t length, const char *path, qwen3_config *out);

/* Reads and parses DIR/config.json. A missing or unreadable file is KITE_ERROR_IO. */
kite_status qwen3_config_load(const char *dir, qwen3_config *out);

#endif

/* config.json of a Hugging Face Qwen3 checkpoint -> qwen3_config.
 *
 * Every field is read as transformers reads it, in each spelling it accepts: the hub's layout (top-level
 * `rope_theta`, `rope_scaling`, `torch_dtype`) and transformers 5's (`rope_parameters: {rope_theta,
 * rope_type}`, `dtype`), the RoPE type as `rope_type` or the legacy `type`, defaults as Qwen3Config's
 * (head_dim 128, num_key_value_heads = num_attention_heads, untied embeddings). Where the spellings disagree
 * the file is refused rather than read as one transformers version would. Every field kite depends on is
 * checked; a damaged or inconsistent file gives KITE_ERROR_INVALID_CHECKPOINT, a well-formed one asking for
 * a feature kite lacks (attention bias, a rope scaling other than YaRN, sliding windows, another architecture)
 * gives KITE_ERROR_UNSUPPORTED. Messages name the file and the field.
 *
 * RoPE scaling: the default rotation or YaRN (`rope_type` or `type` "yarn", in rope_scaling or rope_parameters),
 * its parameters read as transformers 5 reads them (config.c says where each rule comes from). The context limit
 * follows: factor x original_max_position_embeddings with YaRN, else max_position_embeddings.
 */
#ifndef KITE_CHECKPOINT_CONFIG_H
#define KITE_CHECKPOINT_CONFIG_H

#include <stddef.h>

#include "kite.h"
#include "model/qwen3.h"

/* How messages name a rope scaling override. */
#define QWEN3_ROPE_OVERRIDE_LABEL "rope scaling override (--rope-scaling, kite_load_params.rope_scaling)"

/* Parses config.json text[0..length). `path` is only used in messages. */
kite_status qwen3_config_parse(const char *text, size_t length, const char *path, qwen3_config *out);

/* As qwen3_config_parse, with rope_scaling (NUL-terminated JSON text, a rope_scaling object such as
 * {"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768}; NULL for none) replacing the
 * file's rope_scaling and rope_parameters' scaling, validated as they are. Its rope_theta, if it has one, must
 * agree with the file's. */
kite_status qwen3_config_parse_overriding(const char *text, size_t length, const char *path, const char *rope_scaling,
                                         qwen3_config *out);

/* Reads and parses DIR/config.json. A missing or unreadable file is KITE_ERROR_IO. */
kite_status qwen3_config_load(const char *dir, qwen3_config *out);
kite_status qwen3_config_load_overriding(const char *dir, const char *rope_scaling, qwen3_config *out);

#endif

/* A Hugging Face Qwen3 checkpoint directory, loaded as published on the hub.
 *
 * DIR/config.json plus either DIR/model.safetensors or DIR/model.safetensors.index.json (its weight_map
 * names, for each tensor, the shard file holding it; every shard named must exist and be valid, and each
 * tensor must sit in the shard the index names). When both exist the single file wins, as in transformers.
 *
 * Every Qwen3 tensor must be present with exactly the shape config.json implies; tensors may mix BF16, F16
 * and F32. lm_head.weight is required when tie_word_embeddings is false; when tied, lm_head aliases
 * embed_tokens and a stored lm_head.weight is ignored, as transformers does. Any other tensor is an error.
 *
 * FP8 checkpoints (config.json quantization_config, read by quantization.h): each layer's linear weight that
 * modules_to_not_convert does not name is stored F8_E4M3 with `<name>_scale_inv` (F32 or BF16, one value per
 * weight_block_size block, shape [ceil(rows / 128), ceil(cols / 128)]); its view then carries the scales
 * (tensor_view.scale_inv). Refused by name, before anything is allocated: a missing or misshapen scale, a
 * scale that is NaN, infinite or negative, a scale without an F8 weight, an F8 tensor that the config does
 * not quantize (or any F8 tensor without quantization_config), and a quantized weight stored unquantized.
 * The weight views point into the read-only mappings, which live until checkpoint_close(). Each view's data
 * is aligned to its dtype size (checked; an unaligned tensor is KITE_ERROR_UNSUPPORTED).
 *
 * Errors: KITE_ERROR_IO (a file missing or unreadable), KITE_ERROR_INVALID_CHECKPOINT (damaged or
 * inconsistent), KITE_ERROR_UNSUPPORTED (well-formed, but not something kite runs); the message names the
 * file, the tensor and the field.
 */
#ifndef KITE_CHECKPOINT_CHECKPOINT_H
#define KITE_CHECKPOINT_CHECKPOINT_H

#include <stddef.h>

#include "kite.h"
#include "model/qwen3.h"

typedef struct checkpoint checkpoint;

kite_status checkpoint_open(const char *dir, checkpoint **out);
/* With rope_scaling (JSON text or NULL) replacing config.json's rope scaling (qwen3_config_parse_overriding). */
kite_status checkpoint_open_overriding(const char *dir, const char *rope_scaling, checkpoint **out);
const qwen3_config *checkpoint_config(const checkpoint *c);
const qwen3_weights *checkpoint_weights(const checkpoint *c);
/* Bytes of tensor data the views cover (lm_head counted once when tied). */
size_t checkpoint_weight_bytes(const checkpoint *c);
/* The safetensors files the weights come from (model.safetensors, or the index's shards in the index's order),
 * for the weight cache's key. */
size_t checkpoint_file_count(const checkpoint *c);
const struct safetensors_file *checkpoint_file(const checkpoint *c, size_t index);
void checkpoint_close(checkpoint *c);

#endif

/* config.json's `quantization_config`: which quantized layout a checkpoint's weights are stored in.
 *
 * kite reads one layout, Qwen's FP8 releases (transformers' FineGrainedFP8Config, vLLM's Fp8Config with
 * block scales):
 *   {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
 *    "weight_block_size": [128, 128], "modules_to_not_convert": [...]}
 * fmt absent means e4m3 and activation_scheme absent means dynamic (transformers' defaults); weight_block_size
 * must be given (vLLM reads its absence as one scale per tensor) and be [128, 128]. modules_to_not_convert
 * (and vLLM's spelling ignored_layers) lists modules kept unquantized; an entry names a module when it matches
 * whole dot-separated parts of its name ("lm_head", "q_proj", "model.layers.3.mlp"), never a part of one
 * ("mlp.gate" does not name mlp.gate_proj). `dequantize` (transformers' load-time switch) is allowed and has
 * no effect on how kite reads the file. Every other quant_method (awq, gptq, bitsandbytes,
 * compressed-tensors, ...), fmt (e5m2), activation_scheme (static), block size or key is refused with
 * KITE_ERROR_UNSUPPORTED naming the field; a malformed value is KITE_ERROR_INVALID_CHECKPOINT.
 */
#ifndef KITE_CHECKPOINT_QUANTIZATION_H
#define KITE_CHECKPOINT_QUANTIZATION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kite.h"
#include "util/json.h"

typedef struct checkpoint_quantization {
    bool fp8;           /* false: no quantization_config (or null); the fields below are then unset */
    int32_t block_rows; /* weight_block_size[0], over a weight's rows (out features) */
    int32_t block_cols; /* weight_block_size[1], over its columns (in features) */
    size_t n_excluded;
    char **excluded; /* modules_to_not_convert and ignored_layers, owned */
} checkpoint_quantization;

/* Reads root's quantization_config (root: config.json's top-level object; `path` labels messages). */
kite_status checkpoint_quantization_read(const json_value *root, const char *path, checkpoint_quantization *out);

/* Reads and parses DIR/config.json for its quantization_config. */
kite_status checkpoint_quantization_load(const char *dir, checkpoint_quantization *out);

/* Whether modules_to_not_convert names the module (a weight's name without ".weight"). */
bool checkpoint_quantization_excludes(const checkpoint_quantization *q, const char *module);

void checkpoint_quantization_free(checkpoint_quantization *q);

#endif

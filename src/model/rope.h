/* RoPE frequencies and the cos / sin of a position, built the same way for every backend.
 *
 * transformers computes them in float32 torch ops (modeling_rope_utils.py, Qwen3RotaryEmbedding.forward);
 * these functions round after each of those ops, so kite's tables are transformers' up to the last bit of
 * torch's float32 pow and cos (which kite computes in double and rounds once).
 */
#ifndef KITE_MODEL_ROPE_H
#define KITE_MODEL_ROPE_H

#include <stdint.h>

#include "model/qwen3.h"

#ifdef __cplusplus
extern "C" {
#endif

/* inv_freq[0 .. head_dim / 2): the default rotation's, or YaRN's blend of interpolated and extrapolated ones. */
void rope_inv_freq(const qwen3_config *config, float *inv_freq);

/* What cos and sin are multiplied by: YaRN's attention factor, 1 for the default rotation. */
float rope_attention_factor(const qwen3_config *config);

/* cos_out / sin_out[0 .. half) of `position`: each angle is position x inv_freq[i] rounded to float32 (the
 * float32 matmul of transformers' forward), its cos and sin then multiplied by attention_factor. */
void rope_position_angles(const float *inv_freq, int32_t half, float attention_factor, int32_t position,
                          float *cos_out, float *sin_out);

#ifdef __cplusplus
}
#endif

#endif

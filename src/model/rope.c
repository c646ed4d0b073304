#include "model/rope.h"

#include <math.h>

/* Rounds to float32 through memory: every torch op rounds its result, and a compiler that contracts
 * a * b + c into one fused multiply-add (GCC does so in gnu11 mode where the target has FMA) would not. */
static float round_f32(float x) {
    volatile float stored = x;
    return stored;
}

/* base ** (arange(0, dim, 2).float() / dim): the exponent is a float32 division, the power torch's float32
 * pow of float32(base), here computed in double and rounded once (torch's is within one ulp of that). */
static float rope_pos_freq(double base, int32_t i, int32_t dim) {
    float exponent = round_f32((float)(2 * i) / (float)dim);
    return (float)pow((double)(float)base, (double)exponent);
}

/* find_correction_dim of transformers' _compute_yarn_parameters, in Python floats (double): the dimension
 * whose wavelength turns num_rotations times over the original context. */
static double yarn_correction_dim(double num_rotations, int32_t dim, double base, int32_t original_max_positions) {
    return ((double)dim * log((double)original_max_positions / (num_rotations * 2.0 * M_PI))) / (2.0 * log(base));
}

/* _compute_yarn_parameters (transformers 5 modeling_rope_utils.py), op by op in float32 where it uses torch. */
static void yarn_inv_freq(const qwen3_config *c, float *inv_freq) {
    const qwen3_yarn *y = &c->yarn;
    const int32_t dim = c->head_dim, half = dim / 2;
    /* find_correction_range: floor / ceil only when truncate, then clamped to [0, dim - 1]. */
    double low = yarn_correction_dim(y->beta_fast, dim, c->rope_theta, y->original_max_positions);
    double high = yarn_correction_dim(y->beta_slow, dim, c->rope_theta, y->original_max_positions);
    if (y->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0.0) low = 0.0;
    if (high > (double)(dim - 1)) high = (double)(dim - 1);
    /* linear_ramp_factor: max += 0.001 when min == max ("prevent singularity"); then
     * (arange(half, float32) - min) / (max - min), both scalars rounded to float32 by torch, clamped to [0, 1]. */
    if (low == high) high += 0.001;
    const float low_f32 = (float)low, span_f32 = (float)(high - low), factor_f32 = (float)y->factor;
    for (int32_t i = 0; i < half; i++) {
        const float pos_freq = rope_pos_freq(c->rope_theta, i, dim);
        const float extrapolation = round_f32(1.0f / pos_freq);
        const float interpolation = round_f32(1.0f / round_f32(factor_f32 * pos_freq));
        float ramp = round_f32(round_f32((float)i - low_f32) / span_f32);
        if (ramp < 0.0f) ramp = 0.0f;
        if (ramp > 1.0f) ramp = 1.0f;
        /* inv_freq_extrapolation_factor = 1 - ramp; inv_freq = interpolation * (1 - factor) + extrapolation * factor */
        const float extrapolation_factor = round_f32(1.0f - ramp);
        const float interpolated_part = round_f32(interpolation * round_f32(1.0f - extrapolation_factor));
        const float extrapolated_part = round_f32(extrapolation * extrapolation_factor);
        inv_freq[i] = round_f32(interpolated_part + extrapolated_part);
    }
}

void rope_inv_freq(const qwen3_config *c, float *inv_freq) {
    if (c->rope_yarn) {
        yarn_inv_freq(c, inv_freq);
        return;
    }
    /* _compute_default_rope_parameters: 1.0 / (base ** (arange(0, dim, 2).float() / dim)) */
    for (int32_t i = 0; i < c->head_dim / 2; i++)
        inv_freq[i] = round_f32(1.0f / rope_pos_freq(c->rope_theta, i, c->head_dim));
}

float rope_attention_factor(const qwen3_config *c) {
    /* torch multiplies the float32 cos by the Python float, which it rounds to float32 first */
    return c->rope_yarn ? (float)c->yarn.attention_factor : 1.0f;
}

void rope_position_angles(const float *inv_freq, int32_t half, float attention_factor, int32_t position,
                          float *cos_out, float *sin_out) {
    const float p = (float)position; /* exact: positions stay below 2^24 */
    for (int32_t i = 0; i < half; i++) {
        const float angle = round_f32(inv_freq[i] * p);
        cos_out[i] = round_f32((float)cos((double)angle) * attention_factor);
        sin_out[i] = round_f32((float)sin((double)angle) * attention_factor);
    }
}

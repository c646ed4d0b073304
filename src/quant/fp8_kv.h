/* The fp8 KV cache's number format (kite_load_params.kv_cache_dtype KITE_KV_CACHE_FP8): one key or value vector of
 * one (token, kv head), head_dim values, becomes head_dim E4M3 codes (quant/fp8.h's format) and one float32 scale.
 *
 * Specified operation by operation in IEEE float32 with round-to-nearest-even, so that the CPU oracle (which
 * calls these functions) and the CUDA K/V write kernel (which must match them bit for bit: __fdiv_rn, never the
 * fast division, and the hardware cvt to e4m3 with saturation) produce the same codes:
 *   1. amax = the largest |x| (exact, order-free).
 *   2. A vector with a NaN or an infinity gets scale NaN and every code FP8_E4M3_NAN_CODE: it dequantizes to NaN,
 *      which reaches the logits and ends the request under the engine's non-finite rule, as a non-finite K or V
 *      does in the bf16 cache (nothing is refused in the step path, where no request can be named).
 *   3. scale = amax / 448.0f (one float32 division).
 *   4. scale == 0 (an all-zero vector, or one so small that amax / 448 underflows): every code is 0 (+0, or
 *      0x80 for a negative zero) and the scale 0, so the vector dequantizes to zeros without a 0 / 0.
 *   5. else each code = fp8_e4m3_from_float(x / scale) (one float32 division): nearest even, magnitudes above
 *      448 saturating to 448 (none is, but for a rounding of x / scale just above it), the sign of zero kept.
 * Dequantization: fp8_e4m3_to_float(code) x scale, one float32 multiplication. Attention reads exactly these
 * values, for every cached position, the current prefill chunk's included.
 */
#ifndef KITE_QUANT_FP8_KV_H
#define KITE_QUANT_FP8_KV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Quantizes x[0 .. n) into codes[0 .. n) as above and returns the scale. */
float fp8_kv_quantize(const float *x, int32_t n, uint8_t *codes);
/* out[i] = fp8_e4m3_to_float(codes[i]) x scale. */
void fp8_kv_dequantize(const uint8_t *codes, float scale, int32_t n, float *out);
/* x[0 .. n) replaced by its quantize-dequantize round trip (what the CPU backend stores). */
void fp8_kv_round_trip(float *x, int32_t n);

#ifdef __cplusplus
}
#endif

#endif

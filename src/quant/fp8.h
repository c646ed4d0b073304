/* FP8 E4M3 weights: the number format, and the 128x128 block quantization of a linear weight.
 *
 * The format is OCP's "e4m3fn" (torch.float8_e4m3fn, safetensors F8_E4M3): 1 sign bit, 4 exponent bits
 * (bias 7), 3 mantissa bits, subnormals at exponent 0 (m / 8 x 2^-6), no infinities, 0x7f and 0xff NaN,
 * largest finite magnitude 448 (0x7e).
 *
 * Quantization of a weight W [rows = out features][cols = in features], given as float32 (a bf16 or f16
 * weight widens exactly), is specified operation by operation in IEEE float32 with round-to-nearest-even,
 * so that any implementation (this file, the CUDA loader, tests/data/tools/make_fp8_checkpoint.py)
 * produces the same bytes:
 *   1. The blocks tile W from the top left: block (i, j) holds rows [i*B, min((i+1)*B, rows)) and columns
 *      [j*B, min((j+1)*B, cols)), B = FP8_BLOCK_SIZE; the edge blocks are partial (no padding is read).
 *      The scales form a row-major [ceil(rows / B)][ceil(cols / B)] array, as Qwen's FP8 checkpoints store
 *      `weight_scale_inv`.
 *   2. amax = the largest |w| in the block (exact: no rounding, order-free). A NaN or infinite w is an
 *      error: the caller names the tensor.
 *   3. amax = max(amax, FP8_MIN_AMAX): an all-zero (or nearly zero) block gets a finite, non-zero scale and
 *      quantizes to zeros. This is the convention of vLLM / DeepGEMM's per_block_cast_to_fp8
 *      (`amax.clamp(1e-4)`); a scale of exactly 1 for a zero block would do as well, but the clamp also
 *      keeps a block of tiny subnormal weights from dividing by a scale that underflowed to zero.
 *   4. scale_inv = amax / 448.0f (one float32 division). Stored as is: Qwen's convention is w = q x scale_inv.
 *   5. each q = fp8_e4m3_from_float(w / scale_inv) (one float32 division; on CUDA __fdiv_rn, never the fast
 *      approximate division), rounding to nearest even, magnitudes above 448 saturating to 448, the sign of
 *      zero kept (-0.0 and negative values that round to zero give 0x80). vLLM's per_block_cast_to_fp8
 *      multiplies by 448 / amax instead, which can land one code apart at a rounding boundary; dividing by
 *      the stored scale_inv makes the scaling exactly the one that dequantization undoes.
 * Dequantization: w' = fp8_e4m3_to_float(q) x scale_inv, one float32 multiplication, rounded to nearest even
 * (a 4-bit significand times a 24-bit one can need 28 bits, so the rounding is part of the result).
 */
#ifndef KITE_QUANT_FP8_H
#define KITE_QUANT_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "kite.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP8_E4M3_MAX 448.0f
#define FP8_E4M3_MAX_CODE 0x7e
#define FP8_E4M3_NAN_CODE 0x7f
/* The block edge of kite's own quantization, and the only weight_block_size kite reads from checkpoints. */
#define FP8_BLOCK_SIZE 128
#define FP8_MIN_AMAX 1e-4f

/* Round to nearest even with saturation; NaN gives FP8_E4M3_NAN_CODE (callers refuse NaN before). */
uint8_t fp8_e4m3_from_float(float value);
/* Exact; 0x7f and 0xff give a quiet NaN. */
float fp8_e4m3_to_float(uint8_t code);

/* ceil(n / block): the scale grid's extent along a dimension of n elements. */
static inline int64_t fp8_block_count(int64_t n, int64_t block) { return (n + block - 1) / block; }

/* Quantizes w [rows][cols] into q [rows][cols] and scale_inv [ceil(rows/B)][ceil(cols/B)] (B = FP8_BLOCK_SIZE)
 * exactly as specified above. A non-finite weight is KITE_ERROR_INVALID_CHECKPOINT naming `name`, the row and
 * the column; q and scale_inv are then unspecified. Runs block rows in parallel (OpenMP); the result does
 * not depend on the thread count. */
kite_status fp8_quantize_blocks(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *scale_inv,
                                const char *name);

/* out [rows][cols] = decode(q) x scale_inv of the element's block; block_rows x block_cols blocks, scale_inv
 * row-major [ceil(rows/block_rows)][ceil(cols/block_cols)] in float32. */
void fp8_dequantize_blocks(const uint8_t *q, const float *scale_inv, int64_t rows, int64_t cols, int32_t block_rows,
                           int32_t block_cols, float *out);

#ifdef __cplusplus
}
#endif

#endif

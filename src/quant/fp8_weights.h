/* The linear weights a backend computes on, from a view of any stored dtype and a kite_weights mode.
 *
 * The CPU backend is the oracle of the GPU, so each mode yields here, in float32, exactly the values the CUDA
 * backend holds:
 *   stored BF16/F16/F32, KITE_WEIGHTS_BF16: the stored values (widened);
 *   stored BF16/F16/F32, KITE_WEIGHTS_FP8:  quantized as quant/fp8.h specifies, then dequantized
 *                                           (q x scale_inv in float32);
 *   stored F8_E4M3,      KITE_WEIGHTS_FP8:  dequantized as stored (q x scale_inv in float32);
 *   stored F8_E4M3,      KITE_WEIGHTS_BF16: dequantized, then rounded to bf16 (nearest even), which is what the
 *                                           CUDA backend uploads for a bf16 run of an FP8 checkpoint.
 */
#ifndef KITE_QUANT_FP8_WEIGHTS_H
#define KITE_QUANT_FP8_WEIGHTS_H

#include <stdint.h>

#include "kite.h"
#include "model/qwen3.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out [rows][cols] (t's shape) as above; `name` labels errors (a non-finite weight refused by fp8 quantization,
 * an F8 view without scales, out of memory for the quantization's scratch). */
kite_status fp8_weights_linear_to_float(const tensor_view *t, kite_weights mode, const char *name, float *out);

/* Rows [row_begin, row_end) of an F8_E4M3 view dequantized into out [(row_end - row_begin)][cols]. */
void fp8_weights_dequantize_rows(const tensor_view *t, int64_t row_begin, int64_t row_end, float *out);

/* Whether an F8_E4M3 view carries what fp8_weights_dequantize_rows reads (scales, positive block sizes). */
kite_status fp8_weights_check_view(const tensor_view *t, const char *name);

#ifdef __cplusplus
}
#endif

#endif

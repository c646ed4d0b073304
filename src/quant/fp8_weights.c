#include "quant/fp8_weights.h"

#include <stdlib.h>
#include <string.h>

#include "quant/fp8.h"
#include "util/error.h"

kite_status fp8_weights_check_view(const tensor_view *t, const char *name) {
    if (t->dtype != TENSOR_DTYPE_F8_E4M3 || t->n_dims != 2 || !t->data || !t->scale_inv || t->block_rows <= 0 ||
        t->block_cols <= 0 || (t->scale_dtype != TENSOR_DTYPE_F32 && t->scale_dtype != TENSOR_DTYPE_BF16))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "weight %s: an F8_E4M3 matrix needs F32 or BF16 block scales",
                         name);
    return KITE_OK;
}

void fp8_weights_dequantize_rows(const tensor_view *t, int64_t row_begin, int64_t row_end, float *out) {
    const int64_t cols = t->shape[1];
    const int64_t n_block_cols = fp8_block_count(cols, t->block_cols);
    const uint8_t *codes = t->data;
    const unsigned char *scale_bytes = t->scale_inv;
    const size_t scale_size = tensor_dtype_size(t->scale_dtype);
    float table[256];
    for (int code = 0; code < 256; code++)
        table[code] = fp8_e4m3_to_float((uint8_t)code);
#pragma omp parallel for schedule(static) if (row_end - row_begin >= t->block_rows)
    for (int64_t r = row_begin; r < row_end; r++) {
        const unsigned char *scale_row = scale_bytes + (size_t)((r / t->block_rows) * n_block_cols) * scale_size;
        float *dst = out + (r - row_begin) * cols;
        for (int64_t bj = 0; bj < n_block_cols; bj++) {
            float scale;
            tensor_to_float(t->scale_dtype, scale_row + (size_t)bj * scale_size, &scale, 1);
            const int64_t end = (bj + 1) * t->block_cols < cols ? (bj + 1) * t->block_cols : cols;
            for (int64_t c = bj * t->block_cols; c < end; c++)
                dst[c] = table[codes[r * cols + c]] * scale;
        }
    }
}

kite_status fp8_weights_linear_to_float(const tensor_view *t, kite_weights mode, const char *name, float *out) {
    if (mode != KITE_WEIGHTS_BF16 && mode != KITE_WEIGHTS_FP8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "weights mode %d is not bf16 or fp8", (int)mode);
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const size_t n = (size_t)rows * (size_t)cols;
    if (t->dtype == TENSOR_DTYPE_F8_E4M3) {
        KITE_TRY(fp8_weights_check_view(t, name));
        fp8_weights_dequantize_rows(t, 0, rows, out);
        if (mode == KITE_WEIGHTS_BF16)
            for (size_t i = 0; i < n; i++)
                out[i] = bf16_to_float(float_to_bf16(out[i]));
        return KITE_OK;
    }
    tensor_to_float(t->dtype, t->data, out, n);
    if (mode == KITE_WEIGHTS_BF16) return KITE_OK;
    const size_t n_scales =
        (size_t)fp8_block_count(rows, FP8_BLOCK_SIZE) * (size_t)fp8_block_count(cols, FP8_BLOCK_SIZE);
    uint8_t *codes = malloc(n ? n : 1);
    float *scales = malloc(n_scales ? n_scales * sizeof *scales : 1);
    kite_status status = KITE_OK;
    if (!codes || !scales)
        status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "weight %s: out of memory quantizing it to fp8", name);
    if (status == KITE_OK) status = fp8_quantize_blocks(out, rows, cols, codes, scales, name);
    if (status == KITE_OK) fp8_dequantize_blocks(codes, scales, rows, cols, FP8_BLOCK_SIZE, FP8_BLOCK_SIZE, out);
    free(codes);
    free(scales);
    return status;
}

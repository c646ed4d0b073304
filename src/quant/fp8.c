#include "quant/fp8.h"

#include <math.h>
#include <string.h>

#include "util/error.h"

static uint32_t float_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

uint8_t fp8_e4m3_from_float(float value) {
    uint32_t bits = float_bits(value);
    uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
    float magnitude = fabsf(value);
    if (isnan(value)) return (uint8_t)(sign | FP8_E4M3_NAN_CODE);
    if (magnitude > FP8_E4M3_MAX) return (uint8_t)(sign | FP8_E4M3_MAX_CODE);
    if (magnitude < 0x1p-6f) {
        /* Subnormal range: units of 2^-9, the smallest subnormal. Scaling by 512 is exact, and so are the
         * floor and the fraction below; code 8 (a carry) is the smallest normal, 2^-6, as it should be. */
        float units = magnitude * 512.0f;
        float whole = floorf(units);
        float fraction = units - whole;
        uint32_t code = (uint32_t)whole;
        if (fraction > 0.5f || (fraction == 0.5f && (code & 1u))) code++;
        return (uint8_t)(sign | code);
    }
    /* Normal: keep the top 3 of float32's 23 mantissa bits, rounding the other 20 to nearest even; a carry
     * runs into the exponent, which is what rounding up to the next binade means. */
    uint32_t magnitude_bits = bits & 0x7fffffffu;
    int32_t exponent = (int32_t)(magnitude_bits >> 23) - 127; /* -6 .. 8 */
    uint32_t mantissa = magnitude_bits & 0x7fffffu;
    uint32_t kept = mantissa >> 20, rest = mantissa & 0xfffffu;
    uint32_t code = ((uint32_t)(exponent + 7) << 3) + kept;
    if (rest > 0x80000u || (rest == 0x80000u && (kept & 1u))) code++;
    if (code > FP8_E4M3_MAX_CODE) code = FP8_E4M3_MAX_CODE; /* (448, 464) rounds down before this; kept as a guard */
    return (uint8_t)(sign | code);
}

float fp8_e4m3_to_float(uint8_t code) {
    if ((code & 0x7fu) == FP8_E4M3_NAN_CODE) return NAN;
    int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
    float magnitude = exponent == 0 ? ldexpf((float)mantissa, -9) : ldexpf((float)(8 + mantissa), exponent - 10);
    return (code & 0x80u) ? -magnitude : magnitude;
}

kite_status fp8_quantize_blocks(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *scale_inv,
                                const char *name) {
    const int64_t block = FP8_BLOCK_SIZE;
    const int64_t n_block_rows = fp8_block_count(rows, block), n_block_cols = fp8_block_count(cols, block);
    int64_t bad_row = -1, bad_col = -1;
#pragma omp parallel for schedule(dynamic, 1) if (n_block_rows > 1)
    for (int64_t bi = 0; bi < n_block_rows; bi++) {
        const int64_t row_begin = bi * block, row_end = row_begin + block < rows ? row_begin + block : rows;
        for (int64_t bj = 0; bj < n_block_cols; bj++) {
            const int64_t col_begin = bj * block, col_end = col_begin + block < cols ? col_begin + block : cols;
            float amax = 0.0f;
            int64_t first_bad = -1;
            for (int64_t r = row_begin; r < row_end && first_bad < 0; r++)
                for (int64_t c = col_begin; c < col_end; c++) {
                    float value = w[r * cols + c];
                    if (!isfinite(value)) {
                        first_bad = r * cols + c;
                        break;
                    }
                    float magnitude = fabsf(value);
                    if (magnitude > amax) amax = magnitude;
                }
            if (first_bad >= 0) {
#pragma omp critical(fp8_quantize_bad)
                if (bad_row < 0 || first_bad < bad_row * cols + bad_col) {
                    bad_row = first_bad / cols;
                    bad_col = first_bad % cols;
                }
                continue;
            }
            if (amax < FP8_MIN_AMAX) amax = FP8_MIN_AMAX;
            const float scale = amax / FP8_E4M3_MAX;
            scale_inv[bi * n_block_cols + bj] = scale;
            for (int64_t r = row_begin; r < row_end; r++)
                for (int64_t c = col_begin; c < col_end; c++)
                    q[r * cols + c] = fp8_e4m3_from_float(w[r * cols + c] / scale);
        }
    }
    if (bad_row >= 0)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: element [%lld, %lld] is %g; a weight quantized to fp8 must be finite", name,
                         (long long)bad_row, (long long)bad_col, (double)w[bad_row * cols + bad_col]);
    return KITE_OK;
}

void fp8_dequantize_blocks(const uint8_t *q, const float *scale_inv, int64_t rows, int64_t cols, int32_t block_rows,
                           int32_t block_cols, float *out) {
    const int64_t n_block_cols = fp8_block_count(cols, block_cols);
    float table[256];
    for (int code = 0; code < 256; code++)
        table[code] = fp8_e4m3_to_float((uint8_t)code);
#pragma omp parallel for schedule(static) if (rows >= block_rows)
    for (int64_t r = 0; r < rows; r++) {
        const float *scales = scale_inv + (r / block_rows) * n_block_cols;
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = table[q[r * cols + c]] * scales[c / block_cols];
    }
}

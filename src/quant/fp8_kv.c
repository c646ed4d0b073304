#include "quant/fp8_kv.h"

#include <math.h>

#include "quant/fp8.h"

/* Steps 1 to 3 of the header's specification: NaN for a vector that is not finite. */
static float vector_scale(const float *x, int32_t n) {
    float amax = 0.0f;
    int finite = 1;
    for (int32_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) finite = 0;
        float magnitude = fabsf(x[i]);
        if (magnitude > amax) amax = magnitude;
    }
    return finite ? amax / FP8_E4M3_MAX : NAN;
}

static uint8_t code_of(float x, float scale) {
    if (isnan(scale)) return FP8_E4M3_NAN_CODE;
    if (scale == 0.0f) return signbit(x) ? 0x80 : 0x00;
    return fp8_e4m3_from_float(x / scale);
}

float fp8_kv_quantize(const float *x, int32_t n, uint8_t *codes) {
    const float scale = vector_scale(x, n);
    for (int32_t i = 0; i < n; i++) codes[i] = code_of(x[i], scale);
    return scale;
}

void fp8_kv_dequantize(const uint8_t *codes, float scale, int32_t n, float *out) {
    for (int32_t i = 0; i < n; i++) out[i] = fp8_e4m3_to_float(codes[i]) * scale;
}

void fp8_kv_round_trip(float *x, int32_t n) {
    const float scale = vector_scale(x, n);
    for (int32_t i = 0; i < n; i++) x[i] = fp8_e4m3_to_float(code_of(x[i], scale)) * scale;
}

#include "model/qwen3.h"

#include <string.h>

#include "quant/fp8.h"

float f16_to_float(uint16_t bits) {
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1fu;
    uint32_t mantissa = bits & 0x3ffu;
    union {
        uint32_t u;
        float f;
    } v;
    if (exponent == 0) {
        /* Zero or subnormal: mantissa x 2^-24, exact in float32. */
        float magnitude = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 31) {
        v.u = sign | 0x7f800000u | (mantissa << 13); /* infinity, or NaN keeping its payload */
        return v.f;
    }
    v.u = sign | ((exponent + 112u) << 23) | (mantissa << 13); /* rebias 15 -> 127 */
    return v.f;
}

/* Element loads go through memcpy: a tensor inside a safetensors file is only as aligned as its offset. */
void tensor_to_float(tensor_dtype dtype, const void *src, float *dst, size_t n) {
    const unsigned char *bytes = src;
    switch (dtype) {
    case TENSOR_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t bits;
            memcpy(&bits, bytes + 2 * i, sizeof bits);
            dst[i] = bf16_to_float(bits);
        }
        return;
    case TENSOR_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t bits;
            memcpy(&bits, bytes + 2 * i, sizeof bits);
            dst[i] = f16_to_float(bits);
        }
        return;
    case TENSOR_DTYPE_F32: memcpy(dst, src, n * sizeof(float)); return;
    case TENSOR_DTYPE_F8_E4M3:
        for (size_t i = 0; i < n; i++) dst[i] = fp8_e4m3_to_float(bytes[i]);
        return;
    }
}

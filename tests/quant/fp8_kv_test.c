/* The fp8 KV cache's per-vector quantization (quant/fp8_kv.h) against its specification restated here, and the
 * edge cases it names: zeros, an amax that lands exactly on 448, subnormal codes, underflow, non-finite input. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant/fp8.h"
#include "quant/fp8_kv.h"
#include "test_util.h"

#define N 128

static uint32_t xorshift(uint32_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 17;
    *state ^= *state << 5;
    return *state;
}

static void test_zeros(void) {
    float x[N];
    uint8_t codes[N];
    for (int i = 0; i < N; i++) x[i] = (i & 1) ? -0.0f : 0.0f;
    float scale = fp8_kv_quantize(x, N, codes);
    CHECK(scale == 0.0f && !signbit(scale));
    for (int i = 0; i < N; i++) CHECK_MSG(codes[i] == ((i & 1) ? 0x80 : 0x00), "code %d is 0x%02x", i, codes[i]);
    float out[N];
    fp8_kv_dequantize(codes, scale, N, out);
    for (int i = 0; i < N; i++) CHECK(out[i] == 0.0f);
    fp8_kv_round_trip(x, N);
    for (int i = 0; i < N; i++) CHECK(x[i] == 0.0f && !isnan(x[i]));
}

/* The element of largest magnitude maps to code 448 (0x7e / 0xfe), and dequantizes to amax within one rounding. */
static void test_amax_maps_to_448(void) {
    float x[N];
    uint8_t codes[N];
    for (int i = 0; i < N; i++) x[i] = 0.01f * (float)(i - 64);
    x[17] = -3.75f;
    float scale = fp8_kv_quantize(x, N, codes);
    CHECK(scale == 3.75f / 448.0f);
    CHECK_MSG(codes[17] == 0xfe, "amax code 0x%02x", codes[17]);
    CHECK(fabsf(fp8_e4m3_to_float(codes[17]) * scale + 3.75f) <= 3.75f * 0x1p-21f);
    /* A vector whose amax is 448 has scale 1: the codes are the plain conversion. */
    for (int i = 0; i < N; i++) x[i] = (float)(i * 3) - 1.5f;
    x[5] = 448.0f;
    scale = fp8_kv_quantize(x, N, codes);
    CHECK(scale == 1.0f);
    for (int i = 0; i < N; i++) CHECK_MSG(codes[i] == fp8_e4m3_from_float(x[i]), "element %d", i);
}

/* Elements far below amax land in E4M3's subnormals (amax / 448 x 2^-6 and below) and round to nearest even there;
 * those below half the smallest subnormal become signed zeros. */
static void test_subnormals(void) {
    float x[N];
    uint8_t codes[N];
    memset(x, 0, sizeof x);
    x[0] = 448.0f;            /* scale 1 */
    x[1] = 0x1p-9f;           /* the smallest subnormal: code 1 */
    x[2] = 3.0f * 0x1p-10f;   /* 1.5 units: a tie, to the even code 2 */
    x[3] = 0x1p-10f;          /* half a unit: a tie, to the even code 0 */
    x[4] = -0x1p-11f;         /* below half a unit: -0 */
    x[5] = 7.0f * 0x1p-9f;    /* the largest subnormal */
    x[6] = 15.5f * 0x1p-9f * 0.5f; /* 7.75 units: rounds up to 8, the smallest normal, 2^-6 */
    float scale = fp8_kv_quantize(x, N, codes);
    CHECK(scale == 1.0f);
    CHECK(codes[1] == 0x01);
    CHECK(codes[2] == 0x02);
    CHECK(codes[3] == 0x00);
    CHECK(codes[4] == 0x80);
    CHECK(codes[5] == 0x07);
    CHECK(codes[6] == 0x08);
}

/* A vector so small that amax / 448 underflows to 0 quantizes as zeros rather than dividing by zero. */
static void test_underflow(void) {
    float x[N];
    uint8_t codes[N];
    memset(x, 0, sizeof x);
    x[3] = 0x1p-149f; /* the smallest float32 subnormal: / 448 rounds to 0 */
    x[4] = -0x1p-149f;
    float scale = fp8_kv_quantize(x, N, codes);
    CHECK(scale == 0.0f);
    CHECK(codes[3] == 0x00 && codes[4] == 0x80);
    fp8_kv_round_trip(x, N);
    for (int i = 0; i < N; i++) CHECK(x[i] == 0.0f);
}

/* Non-finite input propagates: scale NaN and NaN codes, so the round trip is NaN everywhere (the engine's
 * non-finite rule then ends the request at its logits). */
static void test_non_finite_propagates(void) {
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int b = 0; b < 3; b++) {
        float x[N];
        uint8_t codes[N];
        for (int i = 0; i < N; i++) x[i] = 0.5f * (float)i;
        x[40] = bad[b];
        float scale = fp8_kv_quantize(x, N, codes);
        CHECK_MSG(isnan(scale), "case %d: scale %g", b, (double)scale);
        for (int i = 0; i < N; i++) CHECK((codes[i] & 0x7f) == FP8_E4M3_NAN_CODE);
        fp8_kv_round_trip(x, N);
        for (int i = 0; i < N; i++) CHECK(isnan(x[i]));
    }
}

/* Random vectors against the specification restated: scale = amax / 448, codes = from_float(x / scale), the
 * round trip = to_float(code) x scale; and every element within half a code step (relative 2^-4) of its value. */
static void test_random_against_specification(void) {
    uint32_t state = 12345;
    for (int trial = 0; trial < 2000; trial++) {
        float x[N], y[N];
        uint8_t codes[N];
        float magnitude = ldexpf(1.0f, (int)(xorshift(&state) % 40) - 20);
        float amax = 0.0f;
        for (int i = 0; i < N; i++) {
            x[i] = magnitude * ((float)(xorshift(&state) & 0xffffff) / 8388608.0f - 1.0f);
            if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
        }
        float scale = fp8_kv_quantize(x, N, codes);
        CHECK(scale == amax / 448.0f);
        memcpy(y, x, sizeof x);
        fp8_kv_round_trip(y, N);
        for (int i = 0; i < N; i++) {
            CHECK_MSG(codes[i] == fp8_e4m3_from_float(x[i] / scale), "trial %d element %d", trial, i);
            float back = fp8_e4m3_to_float(codes[i]) * scale;
            CHECK(memcmp(&back, &y[i], sizeof back) == 0);
            /* 3 mantissa bits: a normal code is within 2^-4 relative; a subnormal one within half a unit. */
            float bound = fmaxf(fabsf(x[i]) * 0x1p-4f, scale * 0x1p-10f) * 1.0001f;
            CHECK_MSG(fabsf(back - x[i]) <= bound, "trial %d element %d: %g -> %g", trial, i, (double)x[i],
                      (double)back);
        }
    }
}

int main(void) {
    TEST_RUN(test_zeros);
    TEST_RUN(test_amax_maps_to_448);
    TEST_RUN(test_subnormals);
    TEST_RUN(test_underflow);
    TEST_RUN(test_non_finite_propagates);
    TEST_RUN(test_random_against_specification);
    return test_finish();
}

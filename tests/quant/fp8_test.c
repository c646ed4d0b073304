/* The E4M3 format and the block quantization of quant/fp8.h, against values worked out by hand and an
 * independent restatement of the specification. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kite.h"
#include "model/qwen3.h"
#include "quant/fp8.h"
#include "quant/fp8_weights.h"
#include "test_util.h"

static int is_nan_code(int code) { return (code & 0x7f) == 0x7f; }

static void test_every_code_round_trips(void) {
    for (int code = 0; code < 256; code++) {
        float value = fp8_e4m3_to_float((uint8_t)code);
        if (is_nan_code(code)) {
            CHECK_MSG(isnan(value), "code 0x%02x decodes to %g", code, (double)value);
            continue;
        }
        CHECK_MSG(isfinite(value), "code 0x%02x", code);
        CHECK_MSG(fp8_e4m3_from_float(value) == code, "code 0x%02x -> %g -> 0x%02x", code, (double)value,
                  fp8_e4m3_from_float(value));
    }
}

static void test_known_values(void) {
    CHECK(fp8_e4m3_to_float(0x7e) == 448.0f);
    CHECK(fp8_e4m3_to_float(0x38) == 1.0f);
    CHECK(fp8_e4m3_to_float(0x01) == 0x1p-9f);
    CHECK(fp8_e4m3_to_float(0x08) == 0x1p-6f);
    CHECK(fp8_e4m3_to_float(0x07) == 7.0f * 0x1p-9f);
    CHECK(fp8_e4m3_to_float(0xb8) == -1.0f);
    CHECK(fp8_e4m3_to_float(0x00) == 0.0f && !signbit(fp8_e4m3_to_float(0x00)));
    CHECK(fp8_e4m3_to_float(0x80) == 0.0f && signbit(fp8_e4m3_to_float(0x80)));
    CHECK(fp8_e4m3_from_float(-0.0f) == 0x80);
    CHECK(fp8_e4m3_from_float(-1e-30f) == 0x80);
    CHECK(fp8_e4m3_from_float(1e-30f) == 0x00);
    CHECK(fp8_e4m3_from_float(3.0f) == 0x44);
    CHECK(fp8_e4m3_from_float(-240.0f) == 0xf7);
}

/* Between each pair of neighbouring finite codes: the midpoint goes to the even code, anything off it to
 * the nearer. Covers the subnormal ties, the subnormal-normal boundary and the binade carries. */
static void test_rounding_ties(void) {
    for (int code = 0; code < FP8_E4M3_MAX_CODE; code++) {
        for (int sign = 0; sign < 2; sign++) {
            float low = fp8_e4m3_to_float((uint8_t)code), high = fp8_e4m3_to_float((uint8_t)(code + 1));
            float middle = (low + high) / 2; /* exact: both have 4-bit significands */
            float s = sign ? -1.0f : 1.0f;
            int even = (code & 1) ? code + 1 : code;
            int flag = sign ? 0x80 : 0;
            CHECK_MSG(fp8_e4m3_from_float(s * middle) == (even | flag), "midpoint of 0x%02x and 0x%02x (%g) -> 0x%02x",
                      code, code + 1, (double)(s * middle), fp8_e4m3_from_float(s * middle));
            float below = nextafterf(middle, 0.0f), above = nextafterf(middle, INFINITY);
            CHECK_MSG(fp8_e4m3_from_float(s * below) == (code | flag), "just below the midpoint of 0x%02x", code);
            CHECK_MSG(fp8_e4m3_from_float(s * above) == ((code + 1) | flag), "just above the midpoint of 0x%02x", code);
        }
    }
    CHECK(fp8_e4m3_from_float(0.5f * 0x1p-9f) == 0x00);
    CHECK(fp8_e4m3_from_float(1.5f * 0x1p-9f) == 0x02);
    CHECK(fp8_e4m3_from_float(2.5f * 0x1p-9f) == 0x02);
    CHECK(fp8_e4m3_from_float(7.5f * 0x1p-9f) == 0x08);
    CHECK(fp8_e4m3_from_float(1.0625f) == 0x38);
    CHECK(fp8_e4m3_from_float(1.1875f) == 0x3a);
    CHECK(fp8_e4m3_from_float(15.5f) == 0x58); /* midpoint of 15 (0x57) and 16 (0x58): the carry into the binade */
}

static void test_saturation_and_nan(void) {
    const float large[] = {nextafterf(448.0f, INFINITY), 463.99f, 464.0f, 480.0f, 1e30f, 3.4e38f, INFINITY};
    for (size_t i = 0; i < sizeof large / sizeof large[0]; i++) {
        CHECK_MSG(fp8_e4m3_from_float(large[i]) == 0x7e, "%g", (double)large[i]);
        CHECK_MSG(fp8_e4m3_from_float(-large[i]) == 0xfe, "%g", (double)-large[i]);
    }
    CHECK(fp8_e4m3_from_float(NAN) == 0x7f);
}

/* The specification restated plainly, one element at a time. */
static void reference_quantize(const float *w, int64_t rows, int64_t cols, uint8_t *q, float *scale) {
    int64_t nbc = fp8_block_count(cols, 128);
    for (int64_t bi = 0; bi * 128 < rows; bi++)
        for (int64_t bj = 0; bj * 128 < cols; bj++) {
            float amax = 0;
            for (int64_t r = bi * 128; r < rows && r < bi * 128 + 128; r++)
                for (int64_t c = bj * 128; c < cols && c < bj * 128 + 128; c++)
                    amax = fmaxf(amax, fabsf(w[r * cols + c]));
            amax = fmaxf(amax, 1e-4f);
            float s = amax / 448.0f;
            scale[bi * nbc + bj] = s;
            for (int64_t r = bi * 128; r < rows && r < bi * 128 + 128; r++)
                for (int64_t c = bj * 128; c < cols && c < bj * 128 + 128; c++)
                    q[r * cols + c] = fp8_e4m3_from_float(w[r * cols + c] / s);
        }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float random_weight(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(rng_state >> 11) / 9007199254740992.0;
    return (float)((u - 0.5) * 0.2);
}

static void test_partial_blocks(void) {
    const int64_t rows = 300, cols = 130; /* blocks: 3 x 2, the last row and column of blocks partial */
    float *w = malloc((size_t)(rows * cols) * sizeof *w), *back = malloc((size_t)(rows * cols) * sizeof *back);
    uint8_t *q = malloc((size_t)(rows * cols)), *q_ref = malloc((size_t)(rows * cols));
    float scale[6], scale_ref[6];
    CHECK(w && back && q && q_ref);
    if (!w || !back || !q || !q_ref) return;
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = random_weight();
    /* Block (0, 1) (columns 128..129) all zero; block (2, 0) one large outlier. */
    for (int64_t r = 0; r < 128; r++)
        w[r * cols + 128] = w[r * cols + 129] = 0.0f;
    w[290 * cols + 5] = -3.5f;
    CHECK(fp8_quantize_blocks(w, rows, cols, q, scale, "test.weight") == KITE_OK);
    reference_quantize(w, rows, cols, q_ref, scale_ref);
    CHECK(memcmp(q, q_ref, (size_t)(rows * cols)) == 0);
    CHECK(memcmp(scale, scale_ref, sizeof scale) == 0);
    CHECK(scale[1] == 1e-4f / 448.0f);
    CHECK(scale[4] == 3.5f / 448.0f);
    CHECK(q[290 * cols + 5] == 0xfe);
    for (int64_t r = 0; r < 128; r++)
        CHECK(q[r * cols + 128] == 0 && q[r * cols + 129] == 0);
    fp8_dequantize_blocks(q, scale, rows, cols, 128, 128, back);
    double worst = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float s = scale[(r / 128) * 2 + c / 128];
            CHECK(back[r * cols + c] == fp8_e4m3_to_float(q[r * cols + c]) * s);
            /* In units of the block's scale the error is at most half of the top binade's step of 32. */
            double error = fabs((double)back[r * cols + c] - w[r * cols + c]) / s;
            if (error > worst) worst = error;
        }
    CHECK_MSG(worst <= 16.0, "worst error %g scale units", worst);
    free(w), free(back), free(q), free(q_ref);
}

static void test_non_finite_weight_refused(void) {
    float w[4 * 200];
    for (int i = 0; i < 800; i++)
        w[i] = 0.01f;
    w[3 * 200 + 150] = NAN;
    uint8_t q[800];
    float scale[2];
    CHECK(fp8_quantize_blocks(w, 4, 200, q, scale, "model.layers.0.mlp.up_proj.weight") ==
          KITE_ERROR_INVALID_CHECKPOINT);
    const char *message = kite_last_error();
    CHECK_MSG(strstr(message, "model.layers.0.mlp.up_proj.weight") && strstr(message, "[3, 150]"), "%s", message);
    w[3 * 200 + 150] = -INFINITY;
    CHECK(fp8_quantize_blocks(w, 4, 200, q, scale, "x") == KITE_ERROR_INVALID_CHECKPOINT);
}

/* The four cases of fp8_weights.h on one 130 x 140 weight (2 x 2 blocks, three partial). */
static void test_weight_modes(void) {
    enum { ROWS = 130, COLS = 140, N = ROWS * COLS };
    static uint16_t bf16[N];
    static float widened[N], out[N], expected[N], scales[4];
    static uint8_t codes[N];
    for (int i = 0; i < N; i++) {
        bf16[i] = float_to_bf16(random_weight());
        widened[i] = bf16_to_float(bf16[i]);
    }
    tensor_view stored = {.dtype = TENSOR_DTYPE_BF16, .n_dims = 2, .shape = {ROWS, COLS}, .data = bf16};
    /* bf16 as stored: the stored values. */
    CHECK(fp8_weights_linear_to_float(&stored, KITE_WEIGHTS_BF16, "w", out) == KITE_OK);
    CHECK(memcmp(out, widened, sizeof out) == 0);
    /* fp8 from bf16: quantized as fp8.h specifies, then q x scale_inv. */
    CHECK(fp8_quantize_blocks(widened, ROWS, COLS, codes, scales, "w") == KITE_OK);
    fp8_dequantize_blocks(codes, scales, ROWS, COLS, 128, 128, expected);
    CHECK(fp8_weights_linear_to_float(&stored, KITE_WEIGHTS_FP8, "w", out) == KITE_OK);
    CHECK(memcmp(out, expected, sizeof out) == 0);
    /* An F8 view as a checkpoint gives it: as stored under fp8, rounded to bf16 under bf16. */
    tensor_view f8 = {.dtype = TENSOR_DTYPE_F8_E4M3,
                      .n_dims = 2,
                      .shape = {ROWS, COLS},
                      .data = codes,
                      .scale_inv = scales,
                      .scale_dtype = TENSOR_DTYPE_F32,
                      .block_rows = 128,
                      .block_cols = 128};
    CHECK(fp8_weights_linear_to_float(&f8, KITE_WEIGHTS_FP8, "w", out) == KITE_OK);
    CHECK(memcmp(out, expected, sizeof out) == 0);
    CHECK(fp8_weights_linear_to_float(&f8, KITE_WEIGHTS_BF16, "w", out) == KITE_OK);
    int rounded = 0;
    for (int i = 0; i < N; i++) {
        CHECK(out[i] == bf16_to_float(float_to_bf16(expected[i])));
        rounded += out[i] != expected[i];
    }
    CHECK_MSG(rounded > 0, "no value needed rounding to bf16: the case would not tell the modes apart");
    /* BF16 scales widen exactly; rows of a band as the CUDA upload reads them. */
    uint16_t bf16_scales[4];
    for (int i = 0; i < 4; i++)
        bf16_scales[i] = float_to_bf16(scales[i]);
    f8.scale_inv = bf16_scales, f8.scale_dtype = TENSOR_DTYPE_BF16;
    fp8_weights_dequantize_rows(&f8, 100, 130, out);
    for (int r = 100; r < 130; r++)
        for (int c = 0; c < COLS; c++)
            CHECK(out[(r - 100) * COLS + c] ==
                  fp8_e4m3_to_float(codes[r * COLS + c]) * bf16_to_float(bf16_scales[(r / 128) * 2 + c / 128]));
    /* An F8 view without scales is refused. */
    f8.scale_inv = NULL;
    CHECK(fp8_weights_linear_to_float(&f8, KITE_WEIGHTS_FP8, "model.layers.0.mlp.up_proj.weight", out) ==
          KITE_ERROR_INVALID_ARGUMENT);
}

int main(void) {
    TEST_RUN(test_every_code_round_trips);
    TEST_RUN(test_known_values);
    TEST_RUN(test_rounding_ties);
    TEST_RUN(test_saturation_and_nan);
    TEST_RUN(test_partial_blocks);
    TEST_RUN(test_non_finite_weight_refused);
    TEST_RUN(test_weight_modes);
    return test_finish();
}

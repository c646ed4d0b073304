/* The CUDA backend's fp8 weights (--weights fp8, W8A16) against the CPU backend's fp8 mode:
 * - quantization on the device (cuda_fp8_quantize_weight) equals quant/fp8.c's fp8_quantize_blocks bit for bit, codes
 *   and scales, on matrices with partial edge blocks, an all-zero block and a block of subnormal-sized weights; a
 *   non-finite weight is flagged;
 * - dequantization to bf16 (cuda_fp8_dequantize_weight) equals bf16(code x scale) on the host bit for bit;
 * - the fp8 decode GEMV (cuda_gemv_fp8) against a double reference on the weights' exact values, and against the bf16
 *   GEMV over the same values (power-of-two scales, so that code x scale is exact in bf16), every linear epilogue,
 *   with and without the fused RMSNorm, the 0.6B and 8B row lengths and partial blocks;
 * - the W8A16 batched kernel (cuda_gemm_rows_fp8) against a double reference for every row count 1..32, each batched
 *   product's epilogue and input, partial tiles, chunks and blocks;
 * - the weight allocation a load fills (read back through the backend's segments), every layer's codes and scales of
 *   every source matrix at its place (cuda_weight_layout_fp8_sources), equals quant/fp8.c's quantization of the
 *   checkpoint's values byte for byte: quantized on the device from bf16, and kept from an FP8 checkpoint;
 * - end to end on the Qwen3-0.6B shape with random (dummy) weights, CPU fp8 against CUDA fp8: teacher-forced logits
 *   (prefill, then 16 decode steps) relative L2 <= 2e-2, greedy tokens over 64 steps under the near-tie rule, and
 *   batched decode of B = 4 sequences (rel L2 <= 2e-2) through both fp8 routes (W8A16 kernels, bf16 scratch);
 * - the same weights given as an FP8 checkpoint gives them (F8_E4M3 views with 128x128 float32 scales, as Qwen's FP8
 *   checkpoints store them) keep their codes: the logits equal those of the bf16 weights quantized on the device
 *   (rel L2 <= 1e-5: the same device bytes, the same kernels).
 * The tiny checkpoints of tests/data (and their FP8 versions in tests/data/fp8) have head_dim 16 and 32, which the
 * CUDA backend does not implement (head_dim 128 only): the FP8 checkpoint case runs on the 0.6B shape instead. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda_weight_layout.h"
#include "cuda_test_util.h"
#include "logits_compare.h"
#include "model/dummy.h"
#include "quant/fp8.h"

#define TRY(expr) DEVICE_CHECK(expr)

/* ---- quantization and dequantization ---------------------------------------------------------------- */

static void check_quantize_shape(int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    const int scale_cols = KITE_TEST_CEIL(cols, FP8_BLOCK_SIZE), scale_rows = KITE_TEST_CEIL(rows, FP8_BLOCK_SIZE);
    const size_t n_scales = (size_t)scale_rows * scale_cols;
    uint16_t *bits = xmalloc(n * 2);
    float *values = xmalloc(n * 4), *scales_cpu = xmalloc(n_scales * 4), *scales_gpu = xmalloc(n_scales * 4);
    uint8_t *codes_cpu = xmalloc(n), *codes_gpu = xmalloc(n);
    random_bf16(bits, values, n, 0.05f);
    /* Block (0, 1) all zeros (amax clamped to FP8_MIN_AMAX); block (1, 0), where it exists, of tiny weights. */
    for (int r = 0; r < rows && r < FP8_BLOCK_SIZE; r++)
        for (int c = FP8_BLOCK_SIZE; c < cols && c < 2 * FP8_BLOCK_SIZE; c++) {
            bits[(size_t)r * cols + c] = (r + c) % 3 == 0 ? 0x8000u : 0;
            values[(size_t)r * cols + c] = bf16_to_float(bits[(size_t)r * cols + c]);
        }
    for (int r = FP8_BLOCK_SIZE; r < rows && r < 2 * FP8_BLOCK_SIZE; r++)
        for (int c = 0; c < cols && c < FP8_BLOCK_SIZE; c++) {
            bits[(size_t)r * cols + c] = float_to_bf16(values[(size_t)r * cols + c] * 1e-5f);
            values[(size_t)r * cols + c] = bf16_to_float(bits[(size_t)r * cols + c]);
        }
    CHECK(fp8_quantize_blocks(values, rows, cols, codes_cpu, scales_cpu, "test") == KITE_OK);

    void *d_w = device_buffer(n * 2, bits), *d_q = device_buffer(n, NULL), *d_s = device_buffer(n_scales * 4, NULL);
    int zero = 0, flag = -1;
    void *d_flag = device_buffer(sizeof zero, &zero);
    TRY(cuda_fp8_quantize_weight(d_w, rows, cols, d_q, d_s, scale_cols, d_flag, NULL));
    TRY(kite_cuda_synchronize());
    TRY(kite_cuda_copy_to_host(codes_gpu, d_q, n));
    TRY(kite_cuda_copy_to_host(scales_gpu, d_s, n_scales * 4));
    TRY(kite_cuda_copy_to_host(&flag, d_flag, sizeof flag));
    CHECK_MSG(flag == 0, "%d x %d: finite weights flagged", rows, cols);
    CHECK_MSG(guard_intact(d_q, n) && guard_intact(d_s, n_scales * 4), "%d x %d: a write past the end", rows, cols);
    size_t code_diffs = 0, scale_diffs = 0;
    for (size_t i = 0; i < n; i++) code_diffs += codes_cpu[i] != codes_gpu[i];
    for (size_t i = 0; i < n_scales; i++) scale_diffs += memcmp(&scales_cpu[i], &scales_gpu[i], 4) != 0;
    CHECK_MSG(code_diffs == 0 && scale_diffs == 0, "%d x %d: %zu codes and %zu scales differ from quant/fp8.c", rows,
              cols, code_diffs, scale_diffs);

    /* Dequantization to bf16. */
    void *d_out = device_buffer(n * 2, NULL);
    uint16_t *out = xmalloc(n * 2);
    if (cols % 8 == 0) {
        TRY(cuda_fp8_dequantize_weight(d_q, d_s, scale_cols, rows, cols, d_out, NULL));
        TRY(kite_cuda_synchronize());
        TRY(kite_cuda_copy_to_host(out, d_out, n * 2));
        size_t diffs = 0;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                const size_t at = (size_t)r * cols + c;
                const float w = fp8_e4m3_to_float(codes_cpu[at]) *
                                scales_cpu[(r / FP8_BLOCK_SIZE) * scale_cols + c / FP8_BLOCK_SIZE];
                diffs += out[at] != float_to_bf16(w);
            }
        CHECK_MSG(diffs == 0 && guard_intact(d_out, n * 2), "%d x %d: %zu dequantized values differ", rows, cols,
                  diffs);
    } else {
        CHECK(cuda_fp8_dequantize_weight(d_q, d_s, scale_cols, rows, cols, d_out, NULL) ==
              KITE_ERROR_INVALID_ARGUMENT);
    }

    /* A NaN is flagged. */
    bits[n / 2] = 0x7fc0u;
    TRY(kite_cuda_copy_to_device(d_w, bits, n * 2));
    TRY(cuda_fp8_quantize_weight(d_w, rows, cols, d_q, d_s, scale_cols, d_flag, NULL));
    TRY(kite_cuda_synchronize());
    TRY(kite_cuda_copy_to_host(&flag, d_flag, sizeof flag));
    CHECK_MSG(flag == 1, "%d x %d: a NaN weight not flagged", rows, cols);
    printf("  %d x %d: codes and scales equal quant/fp8.c\n", rows, cols);
    kite_cuda_free(d_w), kite_cuda_free(d_q), kite_cuda_free(d_s), kite_cuda_free(d_flag), kite_cuda_free(d_out);
    free(bits), free(values), free(scales_cpu), free(scales_gpu), free(codes_cpu), free(codes_gpu), free(out);
}

static void test_quantize_matches_cpu(void) {
    require_gpu();
    check_quantize_shape(300, 200); /* partial blocks along both edges */
    check_quantize_shape(128, 136);
    check_quantize_shape(257, 1030);
    check_quantize_shape(384, 1024);
}

/* ---- the fp8 decode GEMV and the W8A16 batched kernel ------------------------------------------------- */

/* Random E4M3 codes (no NaN) for a rows x cols matrix and its block scales: powers of two (so that code x scale is exact
 * in bf16) or any positive floats. */
static void random_fp8(uint8_t *codes, float *scales, int rows, int cols, int pow2_scales) {
    const int scale_cols = KITE_TEST_CEIL(cols, FP8_BLOCK_SIZE), scale_rows = KITE_TEST_CEIL(rows, FP8_BLOCK_SIZE);
    for (int i = 0; i < scale_rows * scale_cols; i++)
        scales[i] = pow2_scales ? ldexpf(1.0f, -12 + (int)(rng_next() % 6)) : (0.5f + rng_uniform()) * 1e-3f;
    for (size_t i = 0; i < (size_t)rows * cols; i++) {
        uint8_t code = (uint8_t)(rng_next() & 0xff);
        if ((code & 0x7f) == 0x7f) code = 0x7e; /* no NaN */
        codes[i] = code;
    }
}

/* The weight a code and its block's scale stand for, exactly (double). */
static double fp8_weight(const uint8_t *codes, const float *scales, int cols, int r, int c) {
    const int scale_cols = KITE_TEST_CEIL(cols, FP8_BLOCK_SIZE);
    return (double)fp8_e4m3_to_float(codes[(size_t)r * cols + c]) *
           (double)scales[(r / FP8_BLOCK_SIZE) * scale_cols + c / FP8_BLOCK_SIZE];
}

/* The epilogue on the host: dots (rows) -> ref (outputs) given the old outputs y0. */
static void host_epilogue(const double *dots, int rows, int epilogue, const float *y0, double *ref) {
    const int outputs = epilogue == CUDA_GEMV_SWIGLU ? rows / 2 : rows;
    for (int o = 0; o < outputs; o++) {
        double v = dots[o];
        if (epilogue == CUDA_GEMV_SWIGLU) v = dots[o] / (1.0 + exp(-dots[o])) * dots[o + outputs];
        else if (epilogue == CUDA_GEMV_ADD || epilogue == CUDA_GEMV_ADD_SETTLED) v += y0[o];
        ref[o] = v;
    }
}

/* cuda_gemv_fp8 against a double reference on the weights' exact values (fp32 input, RMSNorm in double), and with
 * power-of-two scales also against the bf16 GEMV over the same values (bf16 then holds code x scale exactly). */
static void check_gemv(int rows, int cols, int epilogue, int with_norm, int pow2_scales) {
    const size_t n = (size_t)rows * cols;
    const int scale_cols = KITE_TEST_CEIL(cols, FP8_BLOCK_SIZE), scale_rows = KITE_TEST_CEIL(rows, FP8_BLOCK_SIZE);
    const size_t n_scales = (size_t)scale_rows * scale_cols;
    uint8_t *codes = xmalloc(n);
    float *scales = xmalloc(n_scales * 4), *x = xmalloc((size_t)cols * 4), *norm = xmalloc((size_t)cols * 4);
    random_fp8(codes, scales, rows, cols, pow2_scales);
    random_f32(x, (size_t)cols, 1.0f);
    random_f32(norm, (size_t)cols, 1.0f);
    const int outputs = epilogue == CUDA_GEMV_SWIGLU ? rows / 2 : rows;
    float *y0 = xmalloc((size_t)outputs * 4), *y_fp8 = xmalloc((size_t)outputs * 4);
    random_f32(y0, (size_t)outputs, 1.0f);
    double *dots = xmalloc((size_t)rows * 8), *ref = xmalloc((size_t)outputs * 8);
    double ss = 0.0;
    for (int c = 0; c < cols; c++) ss += (double)x[c] * x[c];
    const double norm_scale = with_norm ? 1.0 / sqrt(ss / cols + 1e-6) : 1.0;
    for (int r = 0; r < rows; r++) {
        double acc = 0.0;
        for (int c = 0; c < cols; c++)
            acc += fp8_weight(codes, scales, cols, r, c) * x[c] * (with_norm ? (double)norm[c] : 1.0);
        dots[r] = acc * norm_scale;
    }
    host_epilogue(dots, rows, epilogue, y0, ref);
    void *d_codes = device_buffer(n, codes), *d_scales = device_buffer(n_scales * 4, scales);
    void *d_x = device_buffer((size_t)cols * 4, x), *d_norm = device_buffer((size_t)cols * 4, norm);
    void *d_y_fp8 = device_buffer((size_t)outputs * 4, y0);
    const float *norm_arg = with_norm ? d_norm : NULL;
    TRY(cuda_gemv_fp8(d_codes, d_scales, scale_cols, d_x, norm_arg, 1e-6f, d_y_fp8, rows, cols, epilogue, NULL, 0));
    TRY(kite_cuda_synchronize());
    TRY(kite_cuda_copy_to_host(y_fp8, d_y_fp8, (size_t)outputs * 4));
    const double e_ref = nmse(y_fp8, ref, (size_t)outputs);
    double e_bf16 = 0.0;
    if (pow2_scales) {
        uint16_t *w16 = xmalloc(n * 2);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                const float w = (float)fp8_weight(codes, scales, cols, r, c);
                w16[(size_t)r * cols + c] = float_to_bf16(w);
                CHECK(bf16_to_float(w16[(size_t)r * cols + c]) == w); /* exact: a power-of-two scale */
            }
        float *y_bf16 = xmalloc((size_t)outputs * 4);
        void *d_w16 = device_buffer(n * 2, w16), *d_y_bf16 = device_buffer((size_t)outputs * 4, y0);
        TRY(cuda_gemv(d_w16, d_x, norm_arg, 1e-6f, d_y_bf16, rows, cols, epilogue, NULL, NULL, NULL, 0));
        TRY(kite_cuda_synchronize());
        TRY(kite_cuda_copy_to_host(y_bf16, d_y_bf16, (size_t)outputs * 4));
        double *as_ref = xmalloc((size_t)outputs * 8);
        for (int i = 0; i < outputs; i++) as_ref[i] = y_bf16[i];
        e_bf16 = nmse(y_fp8, as_ref, (size_t)outputs);
        kite_cuda_free(d_w16), kite_cuda_free(d_y_bf16);
        free(w16), free(y_bf16), free(as_ref);
    }
    printf("  gemv fp8 %d x %d epilogue %d norm %d: nmse vs double %.2e%s", rows, cols, epilogue, with_norm, e_ref,
           pow2_scales ? "" : "\n");
    if (pow2_scales) printf(", vs bf16 gemv %.2e\n", e_bf16);
    /* fp32 products and sums (a few ulp over some thousand terms), fast-math rsqrt and exp. */
    CHECK_MSG(e_ref <= 1e-9, "%d x %d epilogue %d: nmse vs double %.3e", rows, cols, epilogue, e_ref);
    CHECK_MSG(e_bf16 <= 1e-10, "%d x %d epilogue %d: nmse vs the bf16 gemv %.3e", rows, cols, epilogue, e_bf16);
    CHECK(guard_intact(d_y_fp8, (size_t)outputs * 4));
    kite_cuda_free(d_codes), kite_cuda_free(d_scales), kite_cuda_free(d_x), kite_cuda_free(d_norm);
    kite_cuda_free(d_y_fp8);
    free(codes), free(scales), free(x), free(norm), free(y0), free(y_fp8), free(dots), free(ref);
}

static void test_gemv_fp8(void) {
    require_gpu();
    /* The 0.6B products (steps of 4 rows x 1,024 columns, and 2 x 2,048 for o_proj), power-of-two scales. */
    check_gemv(4096, 1024, CUDA_GEMV_STORE, 1, 1); /* qkv */
    check_gemv(1024, 2048, CUDA_GEMV_ADD, 0, 1);   /* o_proj */
    check_gemv(6144, 1024, CUDA_GEMV_SWIGLU, 1, 1);
    check_gemv(1024, 3072, CUDA_GEMV_ADD_SETTLED, 0, 1); /* down: three steps per task */
    /* Any scales; partial blocks in both directions (1,040 columns: a block of one chunk, a step's second chunk of it
     * past the row); a last task with fewer rows; 8B-shaped rows (4,096 and 12,288 columns: 2 and 6 steps). */
    check_gemv(200, 1040, CUDA_GEMV_STORE, 0, 1);
    check_gemv(203, 1040, CUDA_GEMV_STORE, 1, 0);
    check_gemv(202, 1040, CUDA_GEMV_SWIGLU, 1, 0); /* 101 outputs: the last task holds one */
    check_gemv(130, 4096, CUDA_GEMV_STORE, 1, 0);
    check_gemv(258, 4096, CUDA_GEMV_SWIGLU, 1, 0);
    check_gemv(136, 12288, CUDA_GEMV_ADD_SETTLED, 0, 0);
    check_gemv(64, 16, CUDA_GEMV_ADD, 0, 0); /* one chunk per row */
    CHECK(cuda_gemv_fp8(NULL, NULL, 1, NULL, NULL, 0.0f, NULL, 128, 120, CUDA_GEMV_STORE, NULL, 0) ==
          KITE_ERROR_INVALID_ARGUMENT);
}

/* cuda_gemm_rows_fp8 over n_rows rows against a double reference: weights code x scale exactly, the input as the
 * kernel stages it (RMS-normalised, times the norm weight, rounded to bf16; or bf16 as given). x_bf16: the input is
 * bf16 (ADD without a norm); y_bf16: the output is stored as bf16 (SWIGLU). */
static void check_gemm_rows_fp8(int n_rows, int rows, int cols, int epilogue, int with_norm, int x_bf16, int y_bf16) {
    const size_t wn = (size_t)rows * cols, xn = (size_t)n_rows * cols;
    const int scale_cols = KITE_TEST_CEIL(cols, FP8_BLOCK_SIZE), scale_rows = KITE_TEST_CEIL(rows, FP8_BLOCK_SIZE);
    const size_t n_scales = (size_t)scale_rows * scale_cols;
    const int outputs = epilogue == CUDA_GEMV_SWIGLU ? rows / 2 : rows;
    const size_t yn = (size_t)n_rows * outputs;
    uint8_t *codes = xmalloc(wn);
    float *scales = xmalloc(n_scales * 4), *x = xmalloc(xn * 4), *g = xmalloc((size_t)cols * 4);
    double *w = xmalloc(wn * 8);
    random_fp8(codes, scales, rows, cols, 0);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) w[(size_t)r * cols + c] = fp8_weight(codes, scales, cols, r, c);
    random_f32(x, xn, 1.0f);
    for (int i = 0; i < cols; i++) g[i] = 1.0f + 0.1f * rng_normal();
    float *y0 = xmalloc(yn * 4), *y = xmalloc(yn * 4), *in = xmalloc((size_t)cols * 4);
    double *ref = xmalloc(yn * 8), *dots = xmalloc((size_t)rows * 8);
    random_f32(y0, yn, 1.0f);
    for (int b = 0; b < n_rows; b++) {
        const float *xb = x + (size_t)b * cols;
        double ss = 0;
        for (int i = 0; i < cols; i++) ss += (double)xb[i] * xb[i];
        const float s = with_norm ? (float)(1.0 / sqrt(ss / cols + 1e-6)) : 1.0f;
        for (int i = 0; i < cols; i++) /* the kernel rounds its input to bf16 */
            in[i] = bf16_to_float(float_to_bf16(with_norm ? xb[i] * s * g[i] : xb[i]));
        for (int r = 0; r < rows; r++) {
            double acc = 0;
            const double *wr = w + (size_t)r * cols;
            for (int i = 0; i < cols; i++) acc += wr[i] * in[i];
            dots[r] = acc;
        }
        host_epilogue(dots, rows, epilogue, y0 + (size_t)b * outputs, ref + (size_t)b * outputs);
    }
    uint16_t *x_bits = xmalloc(xn * 2);
    for (size_t i = 0; i < xn; i++) x_bits[i] = float_to_bf16(x[i]);
    void *d_codes = device_buffer(wn, codes), *d_scales = device_buffer(n_scales * 4, scales);
    void *d_x = x_bf16 ? device_buffer(xn * 2, x_bits) : device_buffer(xn * 4, x);
    float *d_g = device_buffer((size_t)cols * 4, g);
    const size_t y_bytes = yn * (y_bf16 ? 2 : 4);
    const int add = epilogue == CUDA_GEMV_ADD || epilogue == CUDA_GEMV_ADD_SETTLED;
    void *d_y = device_buffer(y_bytes, add ? y0 : NULL);
    TRY(cuda_gemm_rows_fp8(d_codes, d_scales, scale_cols, d_x, x_bf16, with_norm ? d_g : NULL, 1e-6f, d_y, y_bf16,
                           n_rows, rows, cols, epilogue, NULL, 1));
    TRY(kite_cuda_synchronize());
    if (y_bf16) {
        uint16_t *bits = xmalloc(yn * 2);
        TRY(kite_cuda_copy_to_host(bits, d_y, yn * 2));
        bf16_to_floats(bits, y, yn);
        free(bits);
    } else {
        TRY(kite_cuda_copy_to_host(y, d_y, yn * 4));
    }
    /* Near-ties in the bf16 rounding of the input aside, products agree to fp32 accumulation (a bf16 output: to its
     * rounding), as cuda_ops_test asks of the bf16 kernel. */
    const double e = nmse(y, ref, yn);
    CHECK_MSG(e < (y_bf16 ? 2e-5 : 1e-7), "gemm_rows_fp8 %d x %d x %d epilogue %d norm %d bf16 in %d out %d: nmse %g",
              n_rows, rows, cols, epilogue, with_norm, x_bf16, y_bf16, e);
    CHECK_MSG(guard_intact(d_y, y_bytes), "gemm_rows_fp8 %d x %d x %d: a write past the output", n_rows, rows, cols);
    if (n_rows == 1 || n_rows == 32 || rows > 1000)
        printf("  gemm_rows_fp8 %d x %d x %d epilogue %d norm %d bf16 in %d out %d: nmse vs double %.2e\n", n_rows, rows,
               cols, epilogue, with_norm, x_bf16, y_bf16, e);
    kite_cuda_free(d_codes), kite_cuda_free(d_scales), kite_cuda_free(d_x), kite_cuda_free(d_g), kite_cuda_free(d_y);
    free(codes), free(scales), free(x), free(g), free(w), free(y0), free(y), free(in), free(ref), free(dots);
    free(x_bits);
}

static void test_gemm_rows_fp8(void) {
    require_gpu();
    /* Every row count of the kernel (1, 2 and 4 n-tiles), on shapes with partial 16-row tiles, partial 64-k chunks
     * and partial 128 x 128 blocks, each batched product's epilogue and input: qkv (fp32 input, norm), o_proj and down
     * (bf16 input, the settled residual add), gate_up (norm, SwiGLU, bf16 output). */
    for (int n_rows = 1; n_rows <= 32; n_rows++) {
        check_gemm_rows_fp8(n_rows, 264, 1040, CUDA_GEMV_STORE, 1, 0, 0);
        check_gemm_rows_fp8(n_rows, 200, 2064, CUDA_GEMV_ADD_SETTLED, 0, 1, 0);
        check_gemm_rows_fp8(n_rows, 272, 528, CUDA_GEMV_SWIGLU, 1, 0, 1);
    }
    /* fp32 output of SwiGLU, a plain ADD of a fp32 input, one k slice per tile over several iterations per block
     * (60,000 rows), and the 0.6B shapes at the bucket sizes. */
    check_gemm_rows_fp8(5, 130, 1024, CUDA_GEMV_SWIGLU, 1, 0, 0);
    check_gemm_rows_fp8(7, 130, 1024, CUDA_GEMV_ADD, 0, 0, 0);
    check_gemm_rows_fp8(3, 60000, 128, CUDA_GEMV_STORE, 1, 0, 0);
    check_gemm_rows_fp8(8, 4096, 1024, CUDA_GEMV_STORE, 1, 0, 0);
    check_gemm_rows_fp8(16, 1024, 2048, CUDA_GEMV_ADD_SETTLED, 0, 1, 0);
    check_gemm_rows_fp8(32, 6144, 1024, CUDA_GEMV_SWIGLU, 1, 0, 1);
    check_gemm_rows_fp8(4, 1024, 3072, CUDA_GEMV_ADD_SETTLED, 0, 1, 0);
    /* Refused: the lm_head's epilogue (it stays bf16), columns not a multiple of 16, no scales. */
    CHECK(cuda_gemm_rows_fp8(NULL, NULL, 1, NULL, 0, NULL, 0.0f, NULL, 0, 4, 128, 128, CUDA_GEMV_ARGMAX, NULL, 0) ==
          KITE_ERROR_INVALID_ARGUMENT);
    void *d = device_buffer(4096, NULL);
    CHECK(cuda_gemm_rows_fp8(d, d, 1, d, 0, NULL, 0.0f, d, 0, 4, 16, 120, CUDA_GEMV_STORE, NULL, 0) ==
          KITE_ERROR_INVALID_ARGUMENT);
    CHECK(cuda_gemm_rows_fp8(d, NULL, 1, d, 0, NULL, 0.0f, d, 0, 4, 16, 128, CUDA_GEMV_STORE, NULL, 0) ==
          KITE_ERROR_INVALID_ARGUMENT);
    kite_cuda_free(d);
}

/* ---- the loaded weights ------------------------------------------------------------------------------ */

/* Bytes [start, start + n) of b's weight allocation, through its segments (CUDA_WEIGHT_SEGMENT_MAX_BYTES each). */
static void read_weight_bytes(backend *b, uint64_t start, unsigned char *dst, size_t n) {
    while (n > 0) {
        const int32_t index = (int32_t)(start / CUDA_WEIGHT_SEGMENT_MAX_BYTES);
        const uint64_t offset = start % CUDA_WEIGHT_SEGMENT_MAX_BYTES;
        size_t piece = (size_t)(CUDA_WEIGHT_SEGMENT_MAX_BYTES - offset);
        if (piece > n) piece = n;
        TRY(b->segments->read_segment(b, index, offset, dst, piece));
        dst += piece;
        start += piece;
        n -= piece;
    }
}

/* Every layer's fp8 codes and scales in b's allocation against quant/fp8.c's quantization of w's linear weights
 * (their values: bf16, or an F8 view's codes and scales as stored). */
static void check_loaded_codes(backend *b, const qwen3_config *c, const qwen3_weights *w, const char *what) {
    cuda_weight_layout layout;
    cuda_fp8_source_place places[CUDA_FP8_SOURCES];
    TRY(cuda_weight_layout_make(c, w->lm_head.data == w->embed_tokens.data, KITE_WEIGHTS_FP8, &layout));
    TRY(cuda_weight_layout_fp8_sources(&layout, c, places));
    unsigned char *layer = xmalloc((size_t)layout.layer_bytes);
    size_t code_diffs = 0, scale_diffs = 0;
    int first_bad_layer = -1;
    const char *first_bad = "";
    for (int l = 0; l < c->n_layers; l++) {
        read_weight_bytes(b, layout.first_layer + (uint64_t)l * layout.layer_bytes, layer, (size_t)layout.layer_bytes);
        const qwen3_layer_weights *lw = &w->layers[l];
        const tensor_view *sources[CUDA_FP8_SOURCES] = {&lw->q_proj,    &lw->k_proj,  &lw->v_proj,  &lw->o_proj,
                                                        &lw->gate_proj, &lw->up_proj, &lw->down_proj};
        for (int i = 0; i < CUDA_FP8_SOURCES; i++) {
            const tensor_view *t = sources[i];
            const int64_t rows = t->shape[0], cols = t->shape[1];
            const size_t n = (size_t)rows * (size_t)cols;
            const size_t n_scales = (size_t)fp8_block_count(rows, FP8_BLOCK_SIZE) * (size_t)places[i].scale_ld;
            uint8_t *codes = xmalloc(n);
            float *scales = xmalloc(n_scales * 4);
            if (t->dtype == TENSOR_DTYPE_F8_E4M3) {
                memcpy(codes, t->data, n);
                tensor_to_float(t->scale_dtype, t->scale_inv, scales, n_scales);
            } else {
                float *values = xmalloc(n * 4);
                tensor_to_float(t->dtype, t->data, values, n);
                TRY(fp8_quantize_blocks(values, rows, cols, codes, scales, places[i].name));
                free(values);
            }
            size_t codes_here = 0, scales_here = 0;
            for (size_t k = 0; k < n; k++) codes_here += layer[places[i].codes + k] != codes[k];
            for (size_t k = 0; k < n_scales; k++)
                scales_here += memcmp(layer + places[i].scales + 4 * k, &scales[k], 4) != 0;
            if ((codes_here || scales_here) && first_bad_layer < 0) {
                first_bad_layer = l;
                first_bad = places[i].name;
            }
            code_diffs += codes_here;
            scale_diffs += scales_here;
            free(codes), free(scales);
        }
    }
    printf("  %s: %zu codes and %zu scales of %d layers differ from quant/fp8.c\n", what, code_diffs, scale_diffs,
           c->n_layers);
    CHECK_MSG(code_diffs == 0 && scale_diffs == 0, "%s: loaded codes / scales differ (first: layer %d %s)", what,
              first_bad_layer, first_bad);
    free(layer);
}

/* ---- end to end --------------------------------------------------------------------------------------- */

#define BLOCK_SIZE 16
#define BLOCKS_PER_SEQ 16 /* 256 positions */
#define N_SEQS 4
#define PROMPT 32
#define GREEDY_STEPS 64

static qwen3_config config;
static dummy_model *model;
static backend *cpu, *gpu;
static int32_t tables[N_SEQS][BLOCKS_PER_SEQ];

static void run_seq(backend *b, int seq, const int32_t *tokens, int n, int before) {
    int32_t start[2] = {0, n}, ctx = before + n;
    const int32_t *table = tables[seq];
    uint8_t wants = 1;
    step_batch batch = {1, n, tokens, start, &ctx, &table, &wants, false, false};
    TRY(b->ops->forward(b, &batch));
}

static void prompt_tokens(int32_t *out, int n, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        out[i] = (int32_t)((seed >> 8) % (uint32_t)config.vocab_size);
    }
}

/* Teacher-forced: a prompt (prefill path), then 16 decode steps (single-stream fp8 GEMV); worst rel L2 of a vs ref. */
static double teacher_forced(backend *ref, backend *b, int seq, uint32_t seed, float *logits_ref, float *logits_b) {
    const int V = config.vocab_size;
    int32_t tokens[PROMPT + 16];
    prompt_tokens(tokens, PROMPT, seed);
    run_seq(ref, seq, tokens, PROMPT, 0);
    run_seq(b, seq, tokens, PROMPT, 0);
    TRY(ref->ops->read_logits(ref, logits_ref, 1));
    TRY(b->ops->read_logits(b, logits_b, 1));
    double worst = rel_l2(logits_b, logits_ref, (size_t)V);
    for (int step = 0; step < 16; step++) {
        tokens[PROMPT + step] = argmax_of(logits_ref, V);
        run_seq(ref, seq, tokens + PROMPT + step, 1, PROMPT + step);
        run_seq(b, seq, tokens + PROMPT + step, 1, PROMPT + step);
        TRY(ref->ops->read_logits(ref, logits_ref, 1));
        TRY(b->ops->read_logits(b, logits_b, 1));
        const double e = rel_l2(logits_b, logits_ref, (size_t)V);
        if (e > worst) worst = e;
    }
    return worst;
}

static void test_loaded_codes(void) {
    check_loaded_codes(gpu, &config, dummy_model_weights(model), "BF16 weights quantized on the device");
}

static void test_teacher_forced(void) {
    const int V = config.vocab_size;
    float *a = xmalloc((size_t)V * 4), *b = xmalloc((size_t)V * 4);
    const double worst = teacher_forced(cpu, gpu, 0, 1, a, b);
    printf("  fp8 prefill %d + 16 decode steps: worst logits rel L2 vs cpu fp8 %.3e\n", PROMPT, worst);
    CHECK_MSG(worst <= 2e-2, "logits rel L2 %.3e > 2e-2", worst);
    free(a), free(b);
}

static void test_greedy(void) {
    const int V = config.vocab_size;
    float *a = xmalloc((size_t)V * 4), *b = xmalloc((size_t)V * 4);
    int32_t prompt[PROMPT];
    prompt_tokens(prompt, PROMPT, 7);
    run_seq(cpu, 1, prompt, PROMPT, 0);
    run_seq(gpu, 1, prompt, PROMPT, 0);
    int step = 0;
    for (; step < GREEDY_STEPS; step++) {
        int32_t next_cpu, next_gpu;
        TRY(cpu->ops->argmax(cpu, &next_cpu, 1));
        TRY(gpu->ops->argmax(gpu, &next_gpu, 1));
        if (next_cpu != next_gpu) {
            TRY(cpu->ops->read_logits(cpu, a, 1));
            TRY(gpu->ops->read_logits(gpu, b, 1));
            const int ok = in_top5(a, V, next_gpu) && in_top5(b, V, next_cpu);
            printf("  greedy fp8: first difference at step %d (cpu %d, gpu %d): %s\n", step, next_cpu, next_gpu,
                   ok ? "a near tie" : "NOT a near tie");
            CHECK_MSG(ok, "greedy tokens differ at step %d beyond a near tie", step);
            break;
        }
        run_seq(cpu, 1, &next_cpu, 1, PROMPT + step);
        run_seq(gpu, 1, &next_gpu, 1, PROMPT + step);
    }
    if (step == GREEDY_STEPS) printf("  greedy fp8: %d steps identical\n", GREEDY_STEPS);
    free(a), free(b);
}

/* B = 4 sequences of one token each per step (the batched path), teacher-forced by the CPU's argmax; `route` names
 * the products the path runs (cuda_backend_set_batch_fp8_rows_max). */
static void batched_run(const char *route) {
    const int V = config.vocab_size, n = 4;
    const int32_t *bt[4];
    int32_t ctx[4], tokens[4], start[5];
    uint8_t wants[4];
    float *cpu_rows = xmalloc((size_t)n * V * 4), *gpu_rows = xmalloc((size_t)n * V * 4);
    for (int s = 0; s < n; s++) {
        bt[s] = tables[s];
        int32_t prompt[64];
        const int len = 5 + 13 * s;
        prompt_tokens(prompt, len, 100 + (uint32_t)s);
        run_seq(cpu, s, prompt, len, 0);
        run_seq(gpu, s, prompt, len, 0);
        ctx[s] = len;
        tokens[s] = (int32_t)((s * 7919 + 13) % V);
        wants[s] = 1;
        start[s] = s;
    }
    start[n] = n;
    double worst = 0;
    for (int step = 0; step < 4; step++) {
        for (int s = 0; s < n; s++) ctx[s]++;
        step_batch b = {n, n, tokens, start, ctx, bt, wants, false, false};
        TRY(gpu->ops->forward(gpu, &b));
        TRY(gpu->ops->read_logits(gpu, gpu_rows, n));
        TRY(cpu->ops->forward(cpu, &b));
        TRY(cpu->ops->read_logits(cpu, cpu_rows, n));
        for (int s = 0; s < n; s++) {
            const double e = rel_l2(gpu_rows + (size_t)s * V, cpu_rows + (size_t)s * V, (size_t)V);
            if (e > worst) worst = e;
            tokens[s] = argmax_of(cpu_rows + (size_t)s * V, V);
        }
    }
    printf("  batched fp8 decode B=%d (%s), 4 steps: worst logits rel L2 vs cpu fp8 %.3e\n", n, route, worst);
    CHECK_MSG(worst <= 2e-2, "B=%d (%s): logits rel L2 %.3e > 2e-2", n, route, worst);
    free(cpu_rows), free(gpu_rows);
}

/* Both fp8 routes of batched decode: the W8A16 gemm_rows kernels (the default up to 32 rows), and the per-layer
 * dequantization into a bf16 scratch with cuBLASLt (larger buckets; here forced by a limit of 0 rows). */
static void test_batched(void) {
    batched_run("W8A16 gemm_rows");
    TRY(cuda_backend_set_batch_fp8_rows_max(gpu, 0));
    batched_run("bf16 scratch, cuBLASLt");
    TRY(cuda_backend_set_batch_fp8_rows_max(gpu, 32));
}

/* The dummy's weights with every linear layer given as an FP8 checkpoint stores it: E4M3 codes and float32
 * 128x128 scales, quantized on the host by quant/fp8.c. The buffers are owned by the returned arrays. */
typedef struct fp8_copy {
    qwen3_weights weights;
    qwen3_layer_weights *layers;
    void **buffers;
    size_t n_buffers;
} fp8_copy;

static void quantized_view(fp8_copy *copy, tensor_view *t) {
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const size_t n = (size_t)rows * (size_t)cols;
    const size_t n_scales =
        (size_t)fp8_block_count(rows, FP8_BLOCK_SIZE) * (size_t)fp8_block_count(cols, FP8_BLOCK_SIZE);
    float *values = xmalloc(n * 4), *scales = xmalloc(n_scales * 4);
    uint8_t *codes = xmalloc(n);
    tensor_to_float(t->dtype, t->data, values, n);
    TRY(fp8_quantize_blocks(values, rows, cols, codes, scales, "fp8 copy"));
    free(values);
    copy->buffers[copy->n_buffers++] = codes;
    copy->buffers[copy->n_buffers++] = scales;
    t->dtype = TENSOR_DTYPE_F8_E4M3;
    t->data = codes;
    t->scale_inv = scales;
    t->scale_dtype = TENSOR_DTYPE_F32;
    t->block_rows = FP8_BLOCK_SIZE;
    t->block_cols = FP8_BLOCK_SIZE;
}

static void test_fp8_checkpoint_keeps_codes(void) {
    const int V = config.vocab_size;
    fp8_copy copy;
    copy.weights = *dummy_model_weights(model);
    copy.layers = xmalloc((size_t)config.n_layers * sizeof *copy.layers);
    copy.buffers = xmalloc((size_t)config.n_layers * 14 * sizeof(void *));
    copy.n_buffers = 0;
    for (int l = 0; l < config.n_layers; l++) {
        copy.layers[l] = copy.weights.layers[l];
        tensor_view *views[7] = {&copy.layers[l].q_proj,    &copy.layers[l].k_proj,  &copy.layers[l].v_proj,
                                 &copy.layers[l].o_proj,    &copy.layers[l].gate_proj, &copy.layers[l].up_proj,
                                 &copy.layers[l].down_proj};
        for (int i = 0; i < 7; i++) quantized_view(&copy, views[i]);
    }
    copy.weights.layers = copy.layers;
    backend_params params = {.n_threads = 0, .device = 0, .weights = KITE_WEIGHTS_FP8};
    backend *stored = NULL;
    TRY(cuda_backend_create(&config, &copy.weights, &params, &stored));
    check_loaded_codes(stored, &config, &copy.weights, "FP8 checkpoint, codes kept");
    TRY(stored->ops->kv_reserve(stored, N_SEQS * BLOCKS_PER_SEQ, BLOCK_SIZE));
    float *a = xmalloc((size_t)V * 4), *b = xmalloc((size_t)V * 4);
    const double e = teacher_forced(gpu, stored, 2, 11, a, b);
    printf("  FP8 checkpoint (stored codes) vs bf16 quantized on the device: logits rel L2 %.3e\n", e);
    CHECK_MSG(e <= 1e-5, "stored fp8 codes give other logits than the device's quantization (rel L2 %.3e)", e);
    stored->ops->destroy(stored);
    for (size_t i = 0; i < copy.n_buffers; i++) free(copy.buffers[i]);
    free(copy.buffers), free(copy.layers), free(a), free(b);
}

int main(void) {
    char reason[256];
    if (!cuda_backend_available(reason, sizeof reason)) {
        char why[300];
        snprintf(why, sizeof why, "CUDA backend unavailable: %s", reason);
        test_skip(why);
    }
    TEST_RUN(test_quantize_matches_cpu);
    TEST_RUN(test_gemv_fp8);
    TEST_RUN(test_gemm_rows_fp8);

    TRY(known_shape_config("qwen3-0.6b-base", &config));
    TRY(dummy_model_create(&config, 1234, &model));
    const qwen3_weights *w = dummy_model_weights(model);
    backend_params params = {.n_threads = 0, .device = 0, .weights = KITE_WEIGHTS_FP8};
    TRY(cpu_backend_create(&config, w, &params, &cpu));
    TRY(cuda_backend_create(&config, w, &params, &gpu));
    TRY(cpu->ops->kv_reserve(cpu, N_SEQS * BLOCKS_PER_SEQ, BLOCK_SIZE));
    TRY(gpu->ops->kv_reserve(gpu, N_SEQS * BLOCKS_PER_SEQ, BLOCK_SIZE));
    for (int s = 0; s < N_SEQS; s++)
        for (int i = 0; i < BLOCKS_PER_SEQ; i++) tables[s][i] = (BLOCKS_PER_SEQ - 1 - i) * N_SEQS + s;
    TEST_RUN(test_loaded_codes);
    TEST_RUN(test_teacher_forced);
    TEST_RUN(test_greedy);
    TEST_RUN(test_batched);
    TEST_RUN(test_fp8_checkpoint_keeps_codes);
    gpu->ops->destroy(gpu);
    cpu->ops->destroy(cpu);
    dummy_model_free(model);
    return test_finish();
}

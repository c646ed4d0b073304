/* fp8 E4M3 linear weights on the device (--weights fp8):
 *   quantization of a bf16 matrix, operation for operation as quant/fp8.h specifies it, so codes and scales equal
 *   the CPU's fp8_quantize_blocks bit for bit (cuda_fp8_test compares): one block of 256 threads per 128x128 block,
 *   amax (exact, order-free), max(amax, FP8_MIN_AMAX), scale = amax / 448 and q = e4m3(w / scale), both IEEE
 *   divisions (__fdiv_rn, never the fast approximation), the conversion rounding to nearest even and saturating
 *   (cvt.rn.satfinite);
 *   dequantization to bf16 (w = e4m3(q) x scale in float32, rounded to nearest even), which the batched and prefill
 *   paths run one matrix at a time into a scratch before their bf16 products. */
#include "backend/cuda/kernels/cuda_common.cuh"
#include "quant/fp8.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace {

constexpr int BLOCK = FP8_BLOCK_SIZE;
constexpr int QUANTIZE_THREADS = 256;

__device__ __forceinline__ uint8_t e4m3_of(float v) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float e4m3_value(uint8_t code) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
    return __half2float(*reinterpret_cast<const __half *>(&h));
}

__global__ void __launch_bounds__(QUANTIZE_THREADS)
    quantize_weight_kernel(const bf16 *__restrict__ w, int rows, int cols, uint8_t *__restrict__ q,
                           float *__restrict__ scale, int scale_ld, int *nonfinite) {
    __shared__ float warp_amax[QUANTIZE_THREADS / 32];
    const int row0 = (int)blockIdx.y * BLOCK, col0 = (int)blockIdx.x * BLOCK;
    const int n_rows = min(BLOCK, rows - row0), n_cols = min(BLOCK, cols - col0);
    float amax = 0.0f;
    bool bad = false;
    for (int i = threadIdx.x; i < BLOCK * BLOCK; i += QUANTIZE_THREADS) {
        const int r = i / BLOCK, c = i % BLOCK;
        if (r < n_rows && c < n_cols) {
            const float v = __bfloat162float(w[(size_t)(row0 + r) * cols + col0 + c]);
            bad |= !isfinite(v);
            amax = fmaxf(amax, fabsf(v));
        }
    }
    if (__syncthreads_or(bad)) {
        if (threadIdx.x == 0) atomicExch(nonfinite, 1);
        return;
    }
    amax = warp_max(amax);
    if ((threadIdx.x & 31) == 0) warp_amax[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = warp_amax[0];
    for (int i = 1; i < QUANTIZE_THREADS / 32; i++) amax = fmaxf(amax, warp_amax[i]);
    const float s = __fdiv_rn(fmaxf(amax, FP8_MIN_AMAX), FP8_E4M3_MAX);
    if (threadIdx.x == 0) scale[(size_t)blockIdx.y * scale_ld + blockIdx.x] = s;
    for (int i = threadIdx.x; i < BLOCK * BLOCK; i += QUANTIZE_THREADS) {
        const int r = i / BLOCK, c = i % BLOCK;
        if (r < n_rows && c < n_cols) {
            const size_t at = (size_t)(row0 + r) * cols + col0 + c;
            q[at] = e4m3_of(__fdiv_rn(__bfloat162float(w[at]), s));
        }
    }
}

/* One thread per 8 codes (cols % 8 == 0): one 8-byte load, one 16-byte store. */
__global__ void dequantize_weight_kernel(const uint8_t *__restrict__ q, const float *__restrict__ scale,
                                         int scale_ld, int rows, int cols, bf16 *__restrict__ out) {
    const size_t groups_per_row = (size_t)cols / 8;
    const size_t group = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (group >= (size_t)rows * groups_per_row) return;
    const int row = (int)(group / groups_per_row), col = (int)(group % groups_per_row) * 8;
    const float s = scale[(size_t)(row / BLOCK) * scale_ld + col / BLOCK];
    const uint2 codes = *reinterpret_cast<const uint2 *>(q + (size_t)row * cols + col);
    uint32_t packed[4];
    for (int i = 0; i < 4; i++) {
        const uint32_t word = i < 2 ? codes.x : codes.y, shift = 16 * (i & 1);
        const float lo = e4m3_value((uint8_t)(word >> shift)) * s, hi = e4m3_value((uint8_t)(word >> (shift + 8))) * s;
        const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
        packed[i] = *reinterpret_cast<const uint32_t *>(&pair);
    }
    *reinterpret_cast<uint4 *>(out + (size_t)row * cols + col) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

} // namespace

extern "C" kite_status cuda_fp8_quantize_weight(const void *w, int rows, int cols, void *q, float *scale,
                                                int scale_ld, int *nonfinite, void *stream) {
    if (rows <= 0 || cols <= 0 || scale_ld < KITE_CEIL_DIV(cols, BLOCK) || !nonfinite)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_fp8_quantize_weight: %d x %d with scale rows of %d", rows,
                         cols, scale_ld);
    const dim3 grid(KITE_CEIL_DIV(cols, BLOCK), KITE_CEIL_DIV(rows, BLOCK));
    CUDA_CHECK(launch_kernel(quantize_weight_kernel, grid, dim3(QUANTIZE_THREADS), 0,
                             static_cast<cudaStream_t>(stream), false, static_cast<const bf16 *>(w), rows, cols,
                             static_cast<uint8_t *>(q), scale, scale_ld, nonfinite));
    return KITE_OK;
}

extern "C" kite_status cuda_fp8_dequantize_weight(const void *q, const float *scale, int scale_ld, int rows, int cols,
                                                  void *out, void *stream) {
    if (rows <= 0 || cols <= 0 || cols % 8 != 0 || scale_ld < KITE_CEIL_DIV(cols, BLOCK))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_fp8_dequantize_weight: %d x %d with scale rows of %d",
                         rows, cols, scale_ld);
    const size_t groups = (size_t)rows * (size_t)(cols / 8);
    const int threads = 256;
    /* Launched without programmatic dependent launch and never triggering it: the product before it, which may read
     * the scratch this overwrites, has ended, and the product after it starts only once this has. */
    CUDA_CHECK(launch_kernel(dequantize_weight_kernel, dim3((unsigned)((groups + threads - 1) / threads)),
                             dim3(threads), 0, static_cast<cudaStream_t>(stream), false,
                             static_cast<const uint8_t *>(q), scale, scale_ld, rows, cols, static_cast<bf16 *>(out)));
    return KITE_OK;
}

/* The fp8 KV cache's quantization as a kernel of its own (kv_fp8.cuh holds the warp's part, which the cache's
 * write kernels share): bf16 vectors in, codes and scales out, for the op test that holds it to quant/fp8_kv.h bit
 * for bit. */
#include "backend/cuda/kernels/cuda_common.cuh"
#include "backend/cuda/kernels/kv_fp8.cuh"

namespace {

constexpr int kHeadDim = 128, kValuesPerLane = kHeadDim / 32, kWarpsPerBlock = 4;

__global__ void kv_fp8_quantize_kernel(const bf16 *__restrict__ x, uint8_t *__restrict__ codes,
                                       float *__restrict__ scales, int n_vectors) {
    const int vector = blockIdx.x * kWarpsPerBlock + (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32);
    if (vector >= n_vectors) return; /* whole warps leave together: the shuffles see full warps */
    const bf16 *in = x + (size_t)vector * kHeadDim + lane * kValuesPerLane;
    float values[kValuesPerLane];
    uint8_t lane_codes[kValuesPerLane];
#pragma unroll
    for (int i = 0; i < kValuesPerLane; i++) values[i] = __bfloat162float(in[i]);
    const float scale = kv_fp8_quantize_warp<kValuesPerLane>(values, lane_codes);
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < kValuesPerLane; i++) packed |= (uint32_t)lane_codes[i] << (8 * i);
    reinterpret_cast<uint32_t *>(codes + (size_t)vector * kHeadDim)[lane] = packed;
    if (lane == 0) scales[vector] = scale;
}

} // namespace

extern "C" kite_status cuda_kv_fp8_quantize(const void *x, uint8_t *codes, float *scales, int n_vectors, int head_dim,
                                            void *stream) {
    if (head_dim != kHeadDim || n_vectors <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_kv_fp8_quantize: %d vectors of head_dim %d (only %d)",
                         n_vectors, head_dim, kHeadDim);
    const unsigned blocks = (unsigned)KITE_CEIL_DIV(n_vectors, kWarpsPerBlock);
    kv_fp8_quantize_kernel<<<blocks, 32 * kWarpsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16 *>(x), codes, scales, n_vectors);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

/* SwiGLU for prefill: the fused gate/up GEMM output (tokens, 2 * intermediate) -> (tokens, intermediate),
 * silu(gate) * up in fp32, 16-byte loads and stores. */
#include "backend/cuda/kernels/cuda_common.cuh"

namespace {

__global__ void swiglu_kernel(const bf16 *__restrict__ gate_up, bf16 *out, int intermediate, size_t n_chunks) {
    const size_t chunks_per_row = (size_t)intermediate / 8;
    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < n_chunks; c += (size_t)gridDim.x * blockDim.x) {
        const size_t token = c / chunks_per_row, col = (c % chunks_per_row) * 8;
        const bf16 *row = gate_up + token * 2 * (size_t)intermediate;
        float g[8], u[8];
        bf16x8_to_float(*reinterpret_cast<const uint4 *>(row + col), g);
        bf16x8_to_float(*reinterpret_cast<const uint4 *>(row + intermediate + col), u);
        uint32_t packed[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float a = g[2 * i] / (1.0f + __expf(-g[2 * i])) * u[2 * i];
            const float b = g[2 * i + 1] / (1.0f + __expf(-g[2 * i + 1])) * u[2 * i + 1];
            packed[i] = pack_bf16x2(a, b);
        }
        *reinterpret_cast<uint4 *>(out + token * (size_t)intermediate + col) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
}

} // namespace

extern "C" kite_status cuda_swiglu(const void *gate_up, void *out, int n_tokens, int intermediate, void *stream) {
    if (intermediate % 8 != 0 || n_tokens <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_swiglu: tokens %d intermediate %d", n_tokens, intermediate);
    const size_t n_chunks = (size_t)n_tokens * (size_t)(intermediate / 8);
    size_t blocks = KITE_CEIL_DIV(n_chunks, (size_t)256);
    if (blocks > 4096) blocks = 4096;
    swiglu_kernel<<<(unsigned)blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16 *>(gate_up), static_cast<bf16 *>(out), intermediate, n_chunks);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

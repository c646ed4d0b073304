/* Argmax of each logits row (the general path; the decode graph fuses its argmax into the lm_head
 * GEMV). One block per row; ties go to the lowest id; NaN never wins. */
#include "backend/cuda/cuda_common.cuh"

#include <float.h>

namespace {

__device__ __forceinline__ bool better(float v, int i, float best_v, int best_i) {
    return v > best_v || (v == best_v && i < best_i);
}

__global__ void argmax_rows_kernel(const float *__restrict__ logits, int32_t *ids, int vocab) {
    __shared__ float scratch_value[32];
    __shared__ int scratch_index[32];
    const float *row = logits + (size_t)blockIdx.x * (size_t)vocab;
    float best_v = -FLT_MAX;
    int best_i = INT32_MAX;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = row[i];
        if (better(v, i, best_v, best_i)) {
            best_v = v;
            best_i = i;
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best_v, offset);
        const int i = __shfl_xor_sync(0xffffffffu, best_i, offset);
        if (better(v, i, best_v, best_i)) {
            best_v = v;
            best_i = i;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        scratch_value[warp] = best_v;
        scratch_index[warp] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (better(scratch_value[w], scratch_index[w], best_v, best_i)) {
                best_v = scratch_value[w];
                best_i = scratch_index[w];
            }
        ids[blockIdx.x] = best_i == INT32_MAX ? 0 : best_i;
    }
}

} // namespace

extern "C" kite_status cuda_argmax_rows(const float *logits, int32_t *ids, int n_rows, int vocab, void *stream) {
    if (n_rows <= 0 || vocab <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_argmax_rows: rows %d vocab %d", n_rows, vocab);
    argmax_rows_kernel<<<n_rows, 1024, 0, static_cast<cudaStream_t>(stream)>>>(logits, ids, vocab);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

/* Argmax of each logits row (the general path; the decode graph fuses its argmax into the lm_head
 * GEMV). One block per row; ties go to the lowest id; NaN never wins. */
#include "backend/cuda/cuda_common.cuh"

#include <float.h>

namespace {

__global__ void argmax_rows_kernel(const float *__restrict__ logits, int32_t *ids, int vocab) {
    __shared__ argmax_entry scratch[32];
    const float *row = logits + (size_t)blockIdx.x * (size_t)vocab;
    argmax_entry best = argmax_none();
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = row[i];
        if (argmax_better(v, i, best.value, best.index)) best = argmax_entry{v, i};
    }
    best = block_argmax(best, scratch);
    if (threadIdx.x == 0) ids[blockIdx.x] = argmax_id(best);
}

} // namespace

extern "C" kite_status cuda_argmax_rows(const float *logits, int32_t *ids, int n_rows, int vocab, void *stream) {
    if (n_rows <= 0 || vocab <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_argmax_rows: rows %d vocab %d", n_rows, vocab);
    argmax_rows_kernel<<<n_rows, 1024, 0, static_cast<cudaStream_t>(stream)>>>(logits, ids, vocab);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

/* Argmax of each logits row (the prefill path; the decode graph fuses its argmax into the lm_head
 * GEMV). One block per row; ties go to the lowest id; a NaN or +inf gives ARGMAX_NO_TOKEN (cuda_common.cuh). */
#include "backend/cuda/kernels/cuda_common.cuh"

#include <float.h>

namespace {

/* One 1024-thread block per row. A row of 151,936 logits is ~150 loads per thread: with 16-byte loads, 8 in
 * flight per thread (the logits were just written, so they come from L2), that is ~5 round trips instead of
 * the ~37 of 4-byte loads unrolled by 4. */
__global__ void argmax_rows_kernel(const float *__restrict__ logits, int32_t *ids, int vocab) {
    __shared__ argmax_entry scratch[32];
    const float *row = logits + (size_t)blockIdx.x * (size_t)vocab;
    argmax_entry best = argmax_none();
    int tail = 0; /* the first index the scalar loop covers */
    if (vocab % 4 == 0) { /* rows start 16-byte aligned */
        const float4 *row4 = reinterpret_cast<const float4 *>(row);
        const int n4 = vocab / 4;
#pragma unroll 8
        for (int i = threadIdx.x; i < n4; i += blockDim.x) {
            const float4 v = row4[i];
            const int at = 4 * i;
            if (argmax_better(v.x, at, best.value, best.index)) best = argmax_entry{v.x, at};
            if (argmax_better(v.y, at + 1, best.value, best.index)) best = argmax_entry{v.y, at + 1};
            if (argmax_better(v.z, at + 2, best.value, best.index)) best = argmax_entry{v.z, at + 2};
            if (argmax_better(v.w, at + 3, best.value, best.index)) best = argmax_entry{v.w, at + 3};
        }
        tail = vocab;
    }
    for (int i = tail + threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = row[i];
        if (argmax_better(v, i, best.value, best.index)) best = argmax_entry{v, i};
    }
    best = block_argmax(best, scratch);
    if (threadIdx.x == 0) ids[blockIdx.x] = argmax_id(best);
}

/* Copies n ids into slot (*parity & 1) of a ring of two in mapped host memory (overlapped decode: the host reads
 * a step's ids there after its event, while the next step writes the other slot). */
__global__ void publish_ids_kernel(const int32_t *ids, int n, const int32_t *parity, int32_t *ring) {
    pdl_wait();
    pdl_launch_dependents();
    int32_t *slot = ring + (size_t)(*parity & 1) * (size_t)n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) slot[i] = ids[i];
}

/* publish_ids_kernel for one id, then the step moved on by one position (cuda_publish_and_advance). One thread:
 * the values it writes are read by the next step's kernels only, which start after this kernel has ended. */
__global__ void publish_and_advance_kernel(const int32_t *id, cuda_decode_step step, int32_t *ring) {
    pdl_wait();
    pdl_launch_dependents();
    const int32_t position = *step.position;
    ring[position & 1] = *id;
    const int32_t next = position + 1, block = next / step.block_size;
    *step.position = next;
    *step.context = *step.context + 1;
    if (block < step.table_entries) *step.slot = step.table[block] * step.block_size + next % step.block_size;
}

} // namespace

extern "C" kite_status cuda_publish_and_advance(const int32_t *id, cuda_decode_step step, int32_t *ring, void *stream,
                                                int use_pdl) {
    if (!id || !ring || !step.position || !step.slot || !step.context || !step.table || step.block_size <= 0 ||
        step.table_entries <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_publish_and_advance: block size %d, %d table entries",
                         step.block_size, step.table_entries);
    CUDA_CHECK(launch_kernel(publish_and_advance_kernel, dim3(1), dim3(1), 0, static_cast<cudaStream_t>(stream),
                             use_pdl != 0, id, step, ring));
    return KITE_OK;
}

extern "C" kite_status cuda_publish_ids(const int32_t *ids, int n, const int32_t *parity, int32_t *ring, void *stream,
                                        int use_pdl) {
    if (n <= 0 || !ids || !parity || !ring)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_publish_ids: %d ids", n);
    CUDA_CHECK(launch_kernel(publish_ids_kernel, dim3(1), dim3(32), 0, static_cast<cudaStream_t>(stream), use_pdl != 0,
                             ids, n, parity, ring));
    return KITE_OK;
}

extern "C" kite_status cuda_argmax_rows(const float *logits, int32_t *ids, int n_rows, int vocab, void *stream) {
    if (n_rows <= 0 || vocab <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_argmax_rows: rows %d vocab %d", n_rows, vocab);
    argmax_rows_kernel<<<n_rows, 1024, 0, static_cast<cudaStream_t>(stream)>>>(logits, ids, vocab);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

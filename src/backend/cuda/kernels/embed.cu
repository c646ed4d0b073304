/* Token embedding lookup: one block per token, 16-byte loads of the bf16 row, fp32 out (the residual
 * stream is fp32). A negative id stands for fallback[t] (overlapped decode: the previous step's argmax, which
 * the host has not read yet when it enqueues this step); a negative fallback (ARGMAX_NO_TOKEN, cuda_common.cuh)
 * gives a row of NaN, so the step's own argmax allows no token either and the host refuses both. */
#include "backend/cuda/kernels/cuda_common.cuh"

namespace {

__global__ void embed_kernel(const bf16 *__restrict__ table, const int32_t *ids, const int32_t *fallback, float *x,
                             int hidden) {
    pdl_wait();
    pdl_launch_dependents();
    const size_t token = blockIdx.x;
    int32_t id = ids[token];
    if (id < 0 && fallback) id = fallback[token];
    float4 *out = reinterpret_cast<float4 *>(x + token * (size_t)hidden);
    if (id < 0) { /* the argmax of a row that allowed no token (ARGMAX_NO_TOKEN): the step carries NaN on */
        const float nan = __uint_as_float(0x7fc00000u);
        for (int c = threadIdx.x; c < hidden / 4; c += blockDim.x) out[c] = make_float4(nan, nan, nan, nan);
        return;
    }
    const uint4 *row = reinterpret_cast<const uint4 *>(table + (size_t)id * (size_t)hidden);
    for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) {
        float v[8];
        bf16x8_to_float(row[c], v);
        out[2 * c] = make_float4(v[0], v[1], v[2], v[3]);
        out[2 * c + 1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

} // namespace

extern "C" kite_status cuda_embed(const void *table, const int32_t *ids, const int32_t *fallback, float *x,
                                  int n_tokens, int hidden, void *stream, int use_pdl) {
    if (hidden % 8 != 0 || n_tokens <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_embed: hidden %d tokens %d", hidden, n_tokens);
    CUDA_CHECK(launch_kernel(embed_kernel, dim3(n_tokens), dim3(128), 0, static_cast<cudaStream_t>(stream),
                             use_pdl != 0, static_cast<const bf16 *>(table), ids, fallback, x, hidden));
    return KITE_OK;
}

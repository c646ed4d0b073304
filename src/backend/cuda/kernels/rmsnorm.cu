/* RMSNorm of fp32 rows into bf16 (the input of a prefill GEMM), optionally gathering rows (the last
 * token of each sequence before the lm_head); and the same after adding split-K partial products to the rows
 * (cuda_residual_rmsnorm). One block per row, float4 loads. */
#include "backend/cuda/kernels/cuda_common.cuh"

namespace {

/* The second half of both kernels: with each thread's share of the row's sum of squares, out = bf16(x * rsqrt(mean
 * square + eps) * weight), each thread writing the pieces it summed. */
__device__ __forceinline__ void store_normed_row(const float4 *x4, float sum_sq, const float *__restrict__ weight,
                                                 bf16 *out_row, int dim, float eps) {
    __shared__ float scratch[32];
    sum_sq = block_sum(sum_sq, scratch);
    const float scale = rsqrtf(sum_sq / (float)dim + eps);
    uint2 *o = reinterpret_cast<uint2 *>(out_row);
    const float4 *w4 = reinterpret_cast<const float4 *>(weight);
    for (int i = threadIdx.x; i < dim / 4; i += blockDim.x) {
        const float4 v = x4[i], g = w4[i];
        o[i] = make_uint2(pack_bf16x2(v.x * scale * g.x, v.y * scale * g.y),
                          pack_bf16x2(v.z * scale * g.z, v.w * scale * g.w));
    }
}

__global__ void rmsnorm_kernel(const float *__restrict__ x, const float *__restrict__ weight, bf16 *out,
                               const int32_t *row_index, int dim, float eps) {
    const size_t row = blockIdx.x;
    const size_t src = row_index ? (size_t)row_index[row] : row;
    const float4 *x4 = reinterpret_cast<const float4 *>(x + src * (size_t)dim);
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < dim / 4; i += blockDim.x) {
        const float4 v = x4[i];
        sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    store_normed_row(x4, sum_sq, weight, out + row * (size_t)dim, dim, eps);
}

/* x += the partials, in order; then the norm of the new x. Each thread re-reads only the x pieces it wrote. */
__global__ void residual_rmsnorm_kernel(float *x, const float *__restrict__ partials, int n_partials,
                                        size_t partial_stride, const float *__restrict__ weight, bf16 *out, int dim,
                                        float eps) {
    const size_t row = blockIdx.x;
    float4 *x4 = reinterpret_cast<float4 *>(x + row * (size_t)dim);
    const float4 *p4 = reinterpret_cast<const float4 *>(partials + row * (size_t)dim);
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < dim / 4; i += blockDim.x) {
        float4 v = x4[i];
        for (int s = 0; s < n_partials; s++) {
            const float4 p = p4[(size_t)s * (partial_stride / 4) + i];
            v.x += p.x;
            v.y += p.y;
            v.z += p.z;
            v.w += p.w;
        }
        x4[i] = v;
        sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    store_normed_row(x4, sum_sq, weight, out + row * (size_t)dim, dim, eps);
}

} // namespace

extern "C" kite_status cuda_residual_rmsnorm(float *x, const float *partials, int n_partials, const float *weight,
                                             void *out, int n_rows, int dim, float eps, void *stream) {
    if (dim % 4 != 0 || n_rows <= 0 || n_partials < 1 || n_partials > 16)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_residual_rmsnorm: rows %d dim %d partials %d", n_rows, dim,
                         n_partials);
    residual_rmsnorm_kernel<<<n_rows, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        x, partials, n_partials, (size_t)n_rows * (size_t)dim, weight, static_cast<bf16 *>(out), dim, eps);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

extern "C" kite_status cuda_rmsnorm(const float *x, const float *weight, void *out, const int32_t *row_index,
                                    int n_rows, int dim, float eps, void *stream) {
    if (dim % 4 != 0 || n_rows <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_rmsnorm: rows %d dim %d", n_rows, dim);
    rmsnorm_kernel<<<n_rows, 256, 0, static_cast<cudaStream_t>(stream)>>>(x, weight, static_cast<bf16 *>(out),
                                                                         row_index, dim, eps);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

/* Qwen3's per-head Q/K RMSNorm, RoPE (rotate-half, angles from a table computed in double on the host)
 * and the KV-cache append, fused: one warp per (token, head), the head's 128 values in registers (lane l
 * holds dims 2l, 2l+1 and their rotation partners 64 + 2l, 65 + 2l). An fp8 layer receives each K and V vector
 * quantized by its warp (kv_fp8.cuh). */
#include "backend/cuda/kernels/cuda_common.cuh"
#include "backend/cuda/kernels/kv_fp8.cuh"

namespace {

constexpr int HEAD_DIM = 128;
constexpr int HALF = HEAD_DIM / 2;

__device__ __forceinline__ float2 load_pair(const float *p) { return *reinterpret_cast<const float2 *>(p); }
__device__ __forceinline__ float2 load_pair(const bf16 *p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
}
__device__ __forceinline__ void store_pair(float *p, float a, float b) { *reinterpret_cast<float2 *>(p) = make_float2(a, b); }
__device__ __forceinline__ void store_pair(bf16 *p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(a, b);
}

template <typename T>
__global__ void qk_norm_rope_kv_kernel(const T *__restrict__ qkv, T *q_out, const int32_t *positions,
                                       const int32_t *slots, const float *__restrict__ q_norm,
                                       const float *__restrict__ k_norm, const float *__restrict__ rope_cos,
                                       const float *__restrict__ rope_sin, cuda_kv_layer kv, int n_heads, float eps) {
    pdl_wait();
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31;
    const int head = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int n_kv = kv.n_kv_heads;
    if (head >= n_heads + 2 * n_kv) return;
    const size_t token = blockIdx.x;
    const T *src = qkv + (token * (size_t)(n_heads + 2 * n_kv) + (size_t)head) * HEAD_DIM;
    const int d0 = 2 * lane, d1 = HALF + 2 * lane;
    float2 lo = load_pair(src + d0), hi = load_pair(src + d1);

    bf16 *cache = static_cast<bf16 *>(kv.base);
    const int32_t slot_global = slots[token];
    const int32_t block = slot_global / kv.block_size, slot = slot_global % kv.block_size;

    if (head >= n_heads + n_kv) { /* V: stored as is */
        if (kv.dtype == KITE_KV_CACHE_FP8) {
            const float v[4] = {lo.x, lo.y, hi.x, hi.y};
            kv_fp8_store_warp(kv, block, 1, head - n_heads - n_kv, slot, v, lane);
            return;
        }
        bf16 *dst = cache + kv_offset(kv, block, 1, head - n_heads - n_kv, slot);
        store_pair(dst + d0, lo.x, lo.y);
        store_pair(dst + d1, hi.x, hi.y);
        return;
    }
    const float *norm = head < n_heads ? q_norm : k_norm;
    const float sum_sq = warp_sum(lo.x * lo.x + lo.y * lo.y + hi.x * hi.x + hi.y * hi.y);
    const float scale = rsqrtf(sum_sq / (float)HEAD_DIM + eps);
    lo.x *= scale * norm[d0];
    lo.y *= scale * norm[d0 + 1];
    hi.x *= scale * norm[d1];
    hi.y *= scale * norm[d1 + 1];

    const size_t position = (size_t)positions[token];
    const float2 c = *reinterpret_cast<const float2 *>(rope_cos + position * HALF + d0);
    const float2 s = *reinterpret_cast<const float2 *>(rope_sin + position * HALF + d0);
    const float out_lo_x = lo.x * c.x - hi.x * s.x, out_hi_x = hi.x * c.x + lo.x * s.x;
    const float out_lo_y = lo.y * c.y - hi.y * s.y, out_hi_y = hi.y * c.y + lo.y * s.y;

    if (head < n_heads) {
        T *dst = q_out + (token * (size_t)n_heads + (size_t)head) * HEAD_DIM;
        store_pair(dst + d0, out_lo_x, out_lo_y);
        store_pair(dst + d1, out_hi_x, out_hi_y);
    } else if (kv.dtype == KITE_KV_CACHE_FP8) {
        const float v[4] = {out_lo_x, out_lo_y, out_hi_x, out_hi_y};
        kv_fp8_store_warp(kv, block, 0, head - n_heads, slot, v, lane);
    } else {
        bf16 *dst = cache + kv_offset(kv, block, 0, head - n_heads, slot);
        store_pair(dst + d0, out_lo_x, out_lo_y);
        store_pair(dst + d1, out_hi_x, out_hi_y);
    }
}

} // namespace

extern "C" kite_status cuda_qk_norm_rope_kv(const void *qkv, void *q_out, int io_f32, const int32_t *positions,
                                            const int32_t *slots, const float *q_norm, const float *k_norm,
                                            const float *rope_cos, const float *rope_sin, cuda_kv_layer kv,
                                            int n_tokens, int n_heads, float eps, void *stream, int use_pdl) {
    if (kv.head_dim != HEAD_DIM || n_tokens <= 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_qk_norm_rope_kv: head_dim %d (only %d), tokens %d",
                         kv.head_dim, HEAD_DIM, n_tokens);
    const int warps = 8;
    const dim3 grid(n_tokens, KITE_CEIL_DIV(n_heads + 2 * kv.n_kv_heads, warps));
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (io_f32)
        CUDA_CHECK(launch_kernel(qk_norm_rope_kv_kernel<float>, grid, dim3(32 * warps), 0, s, use_pdl != 0,
                                 static_cast<const float *>(qkv), static_cast<float *>(q_out), positions, slots,
                                 q_norm, k_norm, rope_cos, rope_sin, kv, n_heads, eps));
    else
        CUDA_CHECK(launch_kernel(qk_norm_rope_kv_kernel<bf16>, grid, dim3(32 * warps), 0, s, use_pdl != 0,
                                 static_cast<const bf16 *>(qkv), static_cast<bf16 *>(q_out), positions, slots,
                                 q_norm, k_norm, rope_cos, rope_sin, kv, n_heads, eps));
    return KITE_OK;
}

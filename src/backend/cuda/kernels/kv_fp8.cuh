/* The fp8 KV cache's quantization of one (token, kv head) vector on the device, bit for bit quant/fp8_kv.h's
 * (the CPU oracle calls that): one warp per vector of head_dim = 32 x VALUES values, each lane holding VALUES of
 * them in float32 (a bf16 K or V widens exactly).
 *
 * kite compiles CUDA with --use_fast_math, whose -ftz=true makes fmaxf, comparisons and even __fdiv_rn treat
 * float32 subnormals as zero; the host does not. So nothing here is a float operation under the compiler's flags:
 * amax, the finiteness test and the zero test work on the bits (for non-NaN floats the magnitude bits order as
 * unsigned integers), the divisions are PTX div.rn.f32 (IEEE, round to nearest even, subnormals kept), and the
 * conversion is the hardware's cvt.rn.satfinite.e4m3x2.f32: nearest even, saturating at 448, the sign of zero
 * kept, which is fp8_e4m3_from_float exactly. */
#ifndef KITE_BACKEND_CUDA_KERNELS_KV_FP8_CUH
#define KITE_BACKEND_CUDA_KERNELS_KV_FP8_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "backend/cuda/kernels/cuda_common.cuh"

#define KV_FP8_NAN_CODE 0x7f /* quant/fp8.h's FP8_E4M3_NAN_CODE */

__device__ __forceinline__ float kv_fp8_divide(float a, float b) {
    float quotient;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(quotient) : "f"(a), "f"(b));
    return quotient;
}

/* Returns the vector's scale (the same in every lane) and writes the lane's VALUES codes. A lane with a NaN or an
 * infinity makes the whole vector's scale NaN and its codes NaN, as the host does. */
template <int VALUES>
__device__ __forceinline__ float kv_fp8_quantize_warp(const float (&x)[VALUES], uint8_t (&codes)[VALUES]) {
    uint32_t amax_bits = 0;
    bool finite = true;
#pragma unroll
    for (int i = 0; i < VALUES; i++) {
        const uint32_t magnitude = __float_as_uint(x[i]) & 0x7fffffffu;
        finite = finite && magnitude < 0x7f800000u;
        amax_bits = magnitude > amax_bits ? magnitude : amax_bits;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) amax_bits = max(amax_bits, __shfl_xor_sync(0xffffffffu, amax_bits, offset));
    if (!__all_sync(0xffffffffu, finite)) {
#pragma unroll
        for (int i = 0; i < VALUES; i++) codes[i] = KV_FP8_NAN_CODE;
        return __uint_as_float(0x7fc00000u);
    }
    const float scale = kv_fp8_divide(__uint_as_float(amax_bits), 448.0f);
    const bool zero = (__float_as_uint(scale) & 0x7fffffffu) == 0;
#pragma unroll
    for (int i = 0; i < VALUES; i++) {
        if (zero) codes[i] = (__float_as_uint(x[i]) >> 24) & 0x80u;
        else codes[i] = (uint8_t)__nv_cvt_float_to_fp8(kv_fp8_divide(x[i], scale), __NV_SATFINITE, __NV_E4M3);
    }
    return scale;
}

/* Byte offsets inside one fp8 layer's cache (cuda_ops.h's layout) of the codes and of the scale of (block, K=0 / V=1,
 * kv_head, slot). */
__device__ __forceinline__ size_t kv_fp8_code_offset(const cuda_kv_layer &kv, int32_t block, int kind, int kv_head,
                                                     int32_t slot) {
    const size_t rows = 2 * (size_t)kv.n_kv_heads * (size_t)kv.block_size;
    const size_t row = ((size_t)kind * (size_t)kv.n_kv_heads + (size_t)kv_head) * (size_t)kv.block_size + (size_t)slot;
    return (size_t)block * rows * ((size_t)kv.head_dim + 4) + row * (size_t)kv.head_dim;
}
__device__ __forceinline__ size_t kv_fp8_scale_offset(const cuda_kv_layer &kv, int32_t block, int kind, int kv_head,
                                                      int32_t slot) {
    const size_t rows = 2 * (size_t)kv.n_kv_heads * (size_t)kv.block_size;
    const size_t row = ((size_t)kind * (size_t)kv.n_kv_heads + (size_t)kv_head) * (size_t)kv.block_size + (size_t)slot;
    return (size_t)block * rows * ((size_t)kv.head_dim + 4) + rows * (size_t)kv.head_dim + row * sizeof(float);
}

/* Writes one K or V vector of 128 values into an fp8 layer at (block, kind, kv_head, slot), from the warp that holds
 * it in the norm / RoPE kernels' layout: lane l has dims 2l, 2l + 1, 64 + 2l, 65 + 2l in v[0 .. 3]. The values are
 * rounded to bf16 first, so that the codes are those quant/fp8_kv.h gives for the row a bf16 cache would hold (the
 * tests compare the two caches; the rounding is far below fp8's). Every lane of the warp calls it. */
__device__ __forceinline__ void kv_fp8_store_warp(const cuda_kv_layer &kv, int32_t block, int kind, int kv_head,
                                                  int32_t slot, const float (&v)[4], int lane) {
    float x[4];
#pragma unroll
    for (int i = 0; i < 4; i++) x[i] = __bfloat162float(__float2bfloat16_rn(v[i]));
    uint8_t codes[4];
    const float scale = kv_fp8_quantize_warp<4>(x, codes);
    unsigned char *base = static_cast<unsigned char *>(kv.base);
    unsigned char *row = base + kv_fp8_code_offset(kv, block, kind, kv_head, slot);
    *reinterpret_cast<uint16_t *>(row + 2 * lane) = (uint16_t)(codes[0] | (codes[1] << 8));
    *reinterpret_cast<uint16_t *>(row + kv.head_dim / 2 + 2 * lane) = (uint16_t)(codes[2] | (codes[3] << 8));
    if (lane == 0) *reinterpret_cast<float *>(base + kv_fp8_scale_offset(kv, block, kind, kv_head, slot)) = scale;
}

/* 16 E4M3 codes (one 16-byte load) to 16 floats, unscaled, through the hardware conversion (cvt.rn.f16x2.e4m3x2;
 * every E4M3 value is exact in f16, and so in float). */
__device__ __forceinline__ void kv_fp8x16_to_float(const uint4 v, float out[16]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
                static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * half)) & 0xffffu), __NV_E4M3);
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
            out[4 * i + 2 * half] = f.x;
            out[4 * i + 2 * half + 1] = f.y;
        }
    }
}

#endif

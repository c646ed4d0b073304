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

#include <cuda_fp8.h>
#include <stdint.h>

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

#endif

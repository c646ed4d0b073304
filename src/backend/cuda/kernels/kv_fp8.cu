/* The fp8 KV cache's kernels of their own (kv_fp8.cuh holds the warp's quantization, which the cache's write kernels
 * share):
 * - quantization: bf16 vectors in, codes and scales out, for the op test that holds it to quant/fp8_kv.h bit for bit;
 * - the prefill attention's bf16 view of an fp8 layer: the blocks of a step's block tables dequantized into a
 *   scratch laid out as a bf16 layer, which the prefill attention kernels (wgmma / TMA, and the mma fallback) read
 *   unchanged. */
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

/* Block (blockIdx.x + first_entry)'s K or V rows of one kv head (blockIdx.y = kind * n_kv_heads + kv_head): each
 * thread takes 16 codes (one 16-byte load) and writes 16 bf16 (two 16-byte stores). */
constexpr int kDequantizeThreads = 256;
__global__ void kv_fp8_dequantize_blocks_kernel(cuda_kv_layer kv, const int32_t *__restrict__ tables, int first_entry,
                                                bf16 *__restrict__ out) {
    const int32_t block = tables[first_entry + (int)blockIdx.x];
    const int kind = (int)blockIdx.y / kv.n_kv_heads, kv_head = (int)blockIdx.y % kv.n_kv_heads;
    const unsigned char *base = static_cast<const unsigned char *>(kv.base);
    const uint4 *codes = reinterpret_cast<const uint4 *>(base + kv_fp8_code_offset(kv, block, kind, kv_head, 0));
    const float *scales = reinterpret_cast<const float *>(base + kv_fp8_scale_offset(kv, block, kind, kv_head, 0));
    const size_t out_rows = ((size_t)blockIdx.x * 2 * kv.n_kv_heads + blockIdx.y) * (size_t)kv.block_size;
    uint4 *dst = reinterpret_cast<uint4 *>(out + out_rows * kHeadDim);
    constexpr int kPiecesPerRow = kHeadDim / 16;
    for (int i = (int)threadIdx.x; i < kv.block_size * kPiecesPerRow; i += kDequantizeThreads) {
        const float scale = scales[i / kPiecesPerRow];
        float values[16];
        kv_fp8x16_to_float(codes[i], values);
        uint4 lo, hi;
        lo.x = pack_bf16x2(values[0] * scale, values[1] * scale);
        lo.y = pack_bf16x2(values[2] * scale, values[3] * scale);
        lo.z = pack_bf16x2(values[4] * scale, values[5] * scale);
        lo.w = pack_bf16x2(values[6] * scale, values[7] * scale);
        hi.x = pack_bf16x2(values[8] * scale, values[9] * scale);
        hi.y = pack_bf16x2(values[10] * scale, values[11] * scale);
        hi.z = pack_bf16x2(values[12] * scale, values[13] * scale);
        hi.w = pack_bf16x2(values[14] * scale, values[15] * scale);
        dst[2 * i] = lo;
        dst[2 * i + 1] = hi;
    }
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

extern "C" kite_status cuda_kv_fp8_dequantize_blocks(cuda_kv_layer kv, const int32_t *tables, int first_entry,
                                                     int n_entries, void *out, void *stream) {
    if (kv.head_dim != kHeadDim || kv.dtype != KITE_KV_CACHE_FP8 || kv.n_kv_heads <= 0 || kv.block_size <= 0 ||
        first_entry < 0 || n_entries < 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "cuda_kv_fp8_dequantize_blocks: head_dim %d (only %d), dtype %d, %d kv heads, block size %d, "
                         "entries %d + %d",
                         kv.head_dim, kHeadDim, kv.dtype, kv.n_kv_heads, kv.block_size, first_entry, n_entries);
    if (n_entries == 0) return KITE_OK;
    const dim3 grid((unsigned)n_entries, (unsigned)(2 * kv.n_kv_heads));
    kv_fp8_dequantize_blocks_kernel<<<grid, kDequantizeThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        kv, tables, first_entry, static_cast<bf16 *>(out));
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

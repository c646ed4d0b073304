/* Hopper warpgroup matrix products (wgmma) for the prefill attention: shared-memory matrix descriptors for
 * 128-byte-swizzled tiles, and the m64n128k16 bf16 products with fp32 accumulators it uses.
 *
 * Swizzled tiles: a tile with rows of 64 bf16 (128 bytes) is stored row after row, 8 rows (1,024 bytes) to an
 * atom, the 16-byte chunk c of row r at chunk position c ^ (r % 8) (what TMA's CU_TENSOR_MAP_SWIZZLE_128B writes);
 * atoms start at 1,024-byte-aligned addresses. A 128-wide row is two such tiles ("planes": columns 0-63, 64-127).
 * The accumulator fragment of m64nN: thread t of the warpgroup holds, for each 8-column group g, the elements
 * (row 16 (t / 32) + (t % 32) / 4 + 8 (e / 2), column 8 g + 2 (t % 4) + e % 2) in d[4 g + e], as mma.sync's m16n8
 * fragment with the four warps stacked in rows. */
#ifndef KITE_BACKEND_CUDA_WGMMA_CUH
#define KITE_BACKEND_CUDA_WGMMA_CUH

#include <stdint.h>

/* A shared-memory matrix descriptor for a 128-byte-swizzled operand (layout type 1 in bits 62-63).
 * K-major operands (rows of the reduction dimension contiguous): stride_bytes = 1,024 between 8-row groups,
 * leading_bytes unused. MN-major operands (the transposed B): leading_bytes = the distance between 64-wide column
 * groups, stride_bytes = 1,024 between groups of 8 reduction rows. */
__device__ __forceinline__ uint64_t wgmma_descriptor(const void *smem, uint32_t leading_bytes, uint32_t stride_bytes) {
    const uint32_t address = (uint32_t)__cvta_generic_to_shared(smem);
    uint64_t desc = (uint64_t)((address & 0x3FFFF) >> 4);
    desc |= (uint64_t)((leading_bytes >> 4) & 0x3FFF) << 16;
    desc |= (uint64_t)((stride_bytes >> 4) & 0x3FFF) << 32;
    desc |= 1ull << 62;
    return desc;
}

/* Orders register accesses to accumulators around asynchronous products (the compiler must not move them). */
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int Pending> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}

/* The 64 fp32 accumulators of an m64n128 wgmma (one warpgroup, per thread): as operands %0..%63 of the asm
 * text, and as the matching read-write constraints on d[0..63]. */
#define WGMMA_ACCUMULATOR_OPERANDS_64                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "   \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
    "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WGMMA_ACCUMULATORS_8(d, i)                                                                                 \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]),     \
        "+f"(d[i + 7])
#define WGMMA_ACCUMULATORS_64(d)                                                                                   \
    WGMMA_ACCUMULATORS_8(d, 0), WGMMA_ACCUMULATORS_8(d, 8), WGMMA_ACCUMULATORS_8(d, 16), WGMMA_ACCUMULATORS_8(d, 24), \
        WGMMA_ACCUMULATORS_8(d, 32), WGMMA_ACCUMULATORS_8(d, 40), WGMMA_ACCUMULATORS_8(d, 48),                   \
        WGMMA_ACCUMULATORS_8(d, 56)

/* d (+)= A B for A 64x16 and B 16x128, both K-major in shared memory; accumulate unless zero_d. */
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WGMMA_ACCUMULATOR_OPERANDS_64
        ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : WGMMA_ACCUMULATORS_64(d)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* d += A B for A 64x16 in registers (mma.sync's m16n8k16 A fragment per warp) and B 16x128 MN-major (transposed)
 * in shared memory. */
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WGMMA_ACCUMULATOR_OPERANDS_64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : WGMMA_ACCUMULATORS_64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

#endif

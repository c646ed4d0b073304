/* Shared by every .cu file of the CUDA backend: the error macros, bf16 helpers, warp reductions and the
 * programmatic-dependent-launch (PDL) helpers. Never included by host C code. */
#ifndef KITE_BACKEND_CUDA_COMMON_CUH
#define KITE_BACKEND_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

#include "backend/cuda/kernels/cuda_ops.h"

#include "backend/backend.h"
#include "model/qwen3.h"
#include "util/error.h"

/* Every CUDA runtime call goes through CUDA_CHECK: a failure becomes a KITE_ERROR_BACKEND return whose
 * message names the statement, file:line and the error name. */
#define CUDA_CHECK(stmt)                                                                                 \
    do {                                                                                                 \
        cudaError_t cuda_check_error_ = (stmt);                                                          \
        if (cuda_check_error_ != cudaSuccess)                                                            \
            return kite_fail(KITE_ERROR_BACKEND, "cuda: %s failed at %s:%d: %s (%s)", #stmt, __FILE__,   \
                             __LINE__, cudaGetErrorName(cuda_check_error_),                             \
                             cudaGetErrorString(cuda_check_error_));                                     \
    } while (0)

/* After a <<<>>> launch: reports a bad configuration at once (the kernel's own faults surface at the
 * next synchronising call). */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define KITE_CEIL_DIV(a, b) (((a) + (b)-1) / (b))

typedef __nv_bfloat16 bf16;

/* 8 bf16 packed in 16 bytes -> 8 floats. A bf16 is the high half of a float. */
__device__ __forceinline__ void bf16x8_to_float(const uint4 v, float out[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Two E4M3 codes (the low 16 bits of pair, the first in the low byte) to floats through the hardware conversion
 * (cvt.rn.f16x2.e4m3x2; every E4M3 value is exact in f16, and so in float and in bf16). */
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t pair) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    return __half22float2(*reinterpret_cast<const __half2 *>(&h));
}

/* Weights are read once per step: stream them past L1 (no allocation) through the read-only path. */
/* 16 bytes global -> shared memory without passing through registers (cp.async, cached in L2 only); bytes
 * past src_bytes are zero-filled (0: nothing is read). cp_async_commit() closes a group of copies,
 * cp_async_wait<N>() waits until at most N of this thread's groups are pending. */
__device__ __forceinline__ void cp_async_16(void *smem, const void *global, int src_bytes = 16) {
    const unsigned address = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(address), "l"(global), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint4 load_weight_16(const void *address) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(address));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets the total.
 * `scratch` holds 32 floats of shared memory. */
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* scratch may still be read from an earlier call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(total);
}

/* Argmax bookkeeping shared by every kernel that reduces logits to a token id: ties go to the lowest id, and a NaN
 * ranks as +inf, so a row holding a NaN or +inf reduces to one of them, whatever the order of the reduction. Such a
 * row (or one with no finite logit) allows no token: argmax_id reports it as ARGMAX_NO_TOKEN, which the host
 * refuses when it reads the ids (cuda_read_results.cu) and the embedding of a chained step turns into a NaN row
 * (embed.cu). The check costs a select per logit inside a reduction that reads every logit anyway. */
#define ARGMAX_NO_TOKEN (-1)

struct argmax_entry {
    float value;
    int32_t index;
};

/* A bit test, not v != v: it holds whatever the compiler assumes of NaN. */
__device__ __forceinline__ float argmax_key(float v) {
    return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u ? __uint_as_float(0x7f800000u) : v;
}

__device__ __forceinline__ bool argmax_better(float v, int32_t i, float best_v, int32_t best_i) {
    const float key = argmax_key(v), best_key = argmax_key(best_v);
    return key > best_key || (key == best_key && i < best_i);
}

__device__ __forceinline__ argmax_entry argmax_none(void) { return argmax_entry{-FLT_MAX, INT32_MAX}; }

__device__ __forceinline__ int32_t argmax_id(argmax_entry e) {
    return e.index != INT32_MAX && argmax_key(e.value) < __uint_as_float(0x7f800000u) ? e.index : ARGMAX_NO_TOKEN;
}

/* Every lane gets the best entry of the warp. */
__device__ __forceinline__ argmax_entry warp_argmax(argmax_entry e) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, e.value, offset);
        const int32_t i = __shfl_xor_sync(0xffffffffu, e.index, offset);
        if (argmax_better(v, i, e.value, e.index)) e = argmax_entry{v, i};
    }
    return e;
}

/* The best entry of the block (blockDim.x a multiple of 32), valid in thread 0. `scratch` holds 32
 * entries of shared memory. */
__device__ __forceinline__ argmax_entry block_argmax(argmax_entry e, argmax_entry *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    e = warp_argmax(e);
    __syncthreads(); /* scratch may still be read from an earlier call */
    if (lane == 0) scratch[warp] = e;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (argmax_better(scratch[w].value, scratch[w].index, e.value, e.index)) e = scratch[w];
    return e;
}

/* Programmatic dependent launch. A kernel launched with the PDL attribute may start while the kernel
 * before it in the stream is still running; pdl_wait() blocks until that kernel has finished and its
 * memory is visible. Every kernel of the decode step calls pdl_wait() before touching activations (and
 * may read weights before it); without the attribute both are no-ops. */
__device__ __forceinline__ void pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents(void) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* "The last block to finish combines": every thread of a block calls this once its share of the partial results
 * is stored; it returns true in the block that arrives last (the counter reaching n_blocks - 1 before its add),
 * whose threads then see every other block's stores. Thread 0's gpu-scope acq_rel atomic, after the barrier,
 * releases the whole block's stores (release is cumulative over bar.sync) and acquires the others' for its block
 * (through the second barrier): one atomic instead of a gpu-scope fence in every thread before and after it
 * (measured -1.4% per 0.6B decode step at depths 4,096 and 16,384). is_last: a __shared__ flag. */
__device__ __forceinline__ bool block_arrive_is_last(unsigned *counter, unsigned n_blocks, bool *is_last) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned before;
        asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
        *is_last = before == n_blocks - 1;
    }
    __syncthreads();
    return *is_last;
}

/* Launches kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute when use_pdl is set. */
template <typename... KernelArgs, typename... Args>
static inline cudaError_t launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                                        cudaStream_t stream, bool use_pdl, Args... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = use_pdl ? 1 : 0;
    return cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
}

/* Opts `kernel` into dynamic_bytes of dynamic shared memory where that and its static arrays together pass the 48 KB a
 * launch gets without asking (it then fails with an invalid argument). Below 32 KB of dynamic memory nothing is
 * asked: no kernel here has 16 KB of static arrays (bench/kernel-footprint.txt; gemm_rows the most, 11 KB). */
template <typename Kernel>
static inline cudaError_t allow_dynamic_smem(Kernel kernel, size_t dynamic_bytes) {
    if (dynamic_bytes <= 32 * 1024) return cudaSuccess;
    cudaFuncAttributes attributes;
    const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel);
    if (e != cudaSuccess) return e;
    if (attributes.sharedSizeBytes + dynamic_bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dynamic_bytes);
}

/* Offset (in elements) of (block, K=0 / V=1, kv_head, slot) inside one layer's cache (cuda_ops.h). */
__device__ __forceinline__ size_t kv_offset(const cuda_kv_layer &kv, int32_t block, int kind, int kv_head,
                                            int32_t slot) {
    return ((((size_t)block * 2 + (size_t)kind) * (size_t)kv.n_kv_heads + (size_t)kv_head) *
                (size_t)kv.block_size +
            (size_t)slot) *
           (size_t)kv.head_dim;
}

#endif

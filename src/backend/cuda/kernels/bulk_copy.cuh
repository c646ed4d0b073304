/* Bulk copies global -> shared memory by the copy engine (cp.async.bulk, and its tensor form through a
 * tensor map), completed on an mbarrier, and the mbarrier operations around them, for attention_decode_bulk.cu and
 * attention_prefill.cu.
 * Addresses and sizes of a bulk copy are multiples of 16 bytes. */
#ifndef KITE_BACKEND_CUDA_BULK_COPY_CUH
#define KITE_BACKEND_CUDA_BULK_COPY_CUH

#include "backend/cuda/kernels/cuda_common.cuh"

__device__ __forceinline__ uint32_t smem_address(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* An mbarrier whose phase completes after `count` arrivals (and the bytes announced by expect_tx). */
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
/* Publishes initialised mbarriers (to the copy engine and the cluster); follow with a block barrier. */
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
/* One arrival that also announces `bytes` of bulk copies to complete in this phase. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}
/* Waits until the phase with this parity (0, 1, 0, ... for phases 0, 1, 2, ...) has completed. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    asm volatile("{\n\t.reg .pred done;\n"
                 "WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra WAIT_%=;\n}" ::"r"(smem_address(bar)),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void bulk_copy_to_smem(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_address(dst)),
                 "l"(src), "r"(bytes), "r"(smem_address(bar))
                 : "memory");
}

/* The box of a 2-D tensor map at element coordinates (inner, outer) into shared memory, in the map's swizzled
 * layout. `map` is a __grid_constant__ kernel parameter (its address is a parameter-space address). */
__device__ __forceinline__ void tensor_copy_2d_to_smem(void *dst, const void *map, int inner, int outer, uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(smem_address(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer),
                 "r"(smem_address(bar))
                 : "memory");
}

#endif

/* Grid-wide stage counters for persistent kernels whose blocks are all resident (a cooperative launch):
 * every block arrives at a counter once its share of a stage is written; a block waits until the counter
 * reaches the grid size before it reads what the stage wrote (through L2: ld.global.cg, never a stale L1
 * line). Counters must be zero before the launch; the kernel resets them itself once every block is past its
 * last wait. A wait that exceeds ~10 s traps instead of hanging the device. */
#ifndef KITE_BACKEND_CUDA_GRID_BARRIER_CUH
#define KITE_BACKEND_CUDA_GRID_BARRIER_CUH

constexpr long long GRID_SPIN_LIMIT_CYCLES = 20000000000LL;

__device__ __forceinline__ unsigned load_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Every thread of the block calls this once its share of a stage is written. */
__device__ __forceinline__ void stage_arrive(unsigned *counter) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
    }
}

/* Returns when every block has arrived at `counter`. */
__device__ __forceinline__ void stage_wait(const unsigned *counter) {
    if (threadIdx.x == 0) {
        const long long start = clock64();
        while (load_acquire(counter) < gridDim.x) {
            if (clock64() - start > GRID_SPIN_LIMIT_CYCLES) __trap();
        }
        __threadfence();
    }
    __syncthreads();
}

#endif

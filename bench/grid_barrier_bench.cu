/* What one grid-wide stage boundary costs inside a persistent kernel (one 256-thread block per SM,
 * cooperative launch), to find where the persistent decode kernel's ~5 us per stage goes.
 *   kite/build/bench/grid_barrier_bench [iterations]
 * Modes (microseconds per iteration, median of 5 launches):
 *   sync       two __syncthreads (the floor of any stage)
 *   barrier    stage_arrive + stage_wait (grid_barrier.cuh, as the decode kernel uses them)
 *   red        arrive by red.release.gpu (no separate fence), wait by ld.acquire polling
 *   stage      barrier + the decode stage's input: 1024 fp32 read through L2 and reduced (RMSNorm)
 *   stage+out  stage + each warp writes its outputs (st.global.cg) before arriving */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>

#include "backend/cuda/grid_barrier.cuh"
#include "cuda_bench_check.h"

constexpr int THREADS = 256;
enum { MODE_SYNC, MODE_BARRIER, MODE_RED, MODE_STAGE, MODE_STAGE_OUT, N_MODES };
const char *MODE_NAMES[N_MODES] = {"sync", "barrier", "red", "stage", "stage+out"};

__device__ __forceinline__ void red_arrive(unsigned *counter) {
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}
__device__ __forceinline__ void red_wait(const unsigned *counter) {
    if (threadIdx.x == 0)
        while (load_acquire(counter) < gridDim.x) {
        }
    __syncthreads();
}

__global__ void __launch_bounds__(THREADS, 1) bench_kernel(int mode, int iterations, unsigned *counters, float *x, float *out) {
    __shared__ float scratch[32];
    __shared__ float4 staged[256];
    float sink = 0.0f;
    for (int i = 0; i < iterations; i++) {
        switch (mode) {
        case MODE_SYNC: __syncthreads(); __syncthreads(); break;
        case MODE_BARRIER: stage_arrive(&counters[i]); stage_wait(&counters[i]); break;
        case MODE_RED: red_arrive(&counters[i]); red_wait(&counters[i]); break;
        default: {
            if (mode == MODE_STAGE_OUT && (threadIdx.x & 31) == 0)
                __stcg(&out[(blockIdx.x * 8 + (threadIdx.x >> 5)) * 4 + (i & 3)], sink);
            stage_arrive(&counters[i]);
            stage_wait(&counters[i]);
            const float4 v = __ldcg(reinterpret_cast<const float4 *>(x) + threadIdx.x);
            staged[threadIdx.x] = v;
            float s = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = s;
            __syncthreads();
            float total = 0.0f;
            for (int w = 0; w < THREADS / 32; w++) total += scratch[w];
            sink += total * staged[(threadIdx.x + 1) % 256].x;
            __syncthreads();
        }
        }
    }
    if (sink == 12345.0f) out[0] = sink; /* keeps the stage's work alive */
}

int main(int argc, char **argv) {
    const int iterations = argc > 1 ? atoi(argv[1]) : 2000;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned *counters;
    float *x, *out;
    CHECK(cudaMalloc(&counters, (size_t)iterations * sizeof(unsigned)));
    CHECK(cudaMalloc(&x, 1024 * sizeof(float)));
    CHECK(cudaMalloc(&out, (size_t)sms * 8 * 4 * sizeof(float)));
    CHECK(cudaMemset(x, 0, 1024 * sizeof(float)));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    for (int mode = 0; mode < N_MODES; mode++) {
        float times[5];
        for (int rep = 0; rep < 6; rep++) {
            CHECK(cudaMemset(counters, 0, (size_t)iterations * sizeof(unsigned)));
            void *args[] = {&mode, (void *)&iterations, &counters, &x, &out};
            CHECK(cudaEventRecord(start));
            CHECK(cudaLaunchCooperativeKernel((void *)bench_kernel, dim3(sms), dim3(THREADS), args, 0, 0));
            CHECK(cudaEventRecord(stop));
            CHECK(cudaEventSynchronize(stop));
            float ms = 0;
            CHECK(cudaEventElapsedTime(&ms, start, stop));
            if (rep > 0) times[rep - 1] = ms; /* the first launch is a warm-up */
        }
        std::sort(times, times + 5);
        printf("%-10s %7.3f us per stage boundary (%d blocks, %d iterations)\n", MODE_NAMES[mode],
               1000.0 * times[2] / iterations, sms, iterations);
    }
    return 0;
}

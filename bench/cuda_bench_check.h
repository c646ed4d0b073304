/* The CUDA error check of the timing tools (kv_read_bench.cu, which links the CUDA runtime alone, and gemv_bench.c):
 * a failed call prints itself and ends the process. */
#ifndef KITE_BENCH_CUDA_BENCH_CHECK_H
#define KITE_BENCH_CUDA_BENCH_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                         \
    do {                                                                                                 \
        cudaError_t e_ = (x);                                                                            \
        if (e_ != cudaSuccess) {                                                                         \
            fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                             \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

#endif

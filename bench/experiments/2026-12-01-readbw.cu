// HBM read bandwidth by access pattern (session 22, s22r3; not part of kite): nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o readbw 2026-12-01-readbw.cu
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
__device__ float sink;
__device__ __forceinline__ uint4 ldnc(const uint4 *p) {
    uint4 r; asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p)); return r;
}
// N loads of 16 bytes at p + offset(0 .. N - 1), all issued before any is used, folded into one word (so that
// the compiler keeps the loads).
template <int N, typename Offset> __device__ __forceinline__ uint32_t fold_loads(const uint4 *p, Offset offset) {
    uint4 v[N];
#pragma unroll
    for (int k = 0; k < N; k++) v[k] = ldnc(p + offset(k));
    uint32_t acc = 0;
#pragma unroll
    for (int k = 0; k < N; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    return acc;
}
// grid-stride: each thread U loads of 16 B per iteration, consecutive threads consecutive 16 B
template <int U> __global__ void k_stride(const uint4 *p, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    uint32_t acc = 0;
    for (; i + (U - 1) * stride < n; i += U * stride) acc ^= fold_loads<U>(p, [&](int u) { return i + u * stride; });
    if (acc == 0x12345678) sink = acc;
}
// per-warp contiguous region: warp w reads [w*chunk, (w+1)*chunk) in 512 B pieces, U pieces in flight
template <int U> __global__ void k_warp_contig(const uint4 *p, size_t n) {
    const int lane = threadIdx.x & 31;
    const size_t warps = (size_t)gridDim.x * blockDim.x / 32, w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    const size_t chunk = n / warps, begin = w * chunk, end = begin + chunk;
    uint32_t acc = 0;
    for (size_t i = begin; i + 32 * U <= end; i += 32 * U)
        acc ^= fold_loads<U>(p, [&](int u) { return i + u * 32 + lane; });
    if (acc == 0x12345678) sink = acc;
}
// lm_head-like: rows of 2 KB (128 uint4), warp task = R rows, task stride = total warps
template <int R> __global__ void k_rows(const uint4 *p, size_t n) {
    const int lane = threadIdx.x & 31;
    const size_t warps = (size_t)gridDim.x * blockDim.x / 32, w = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    const size_t rows = n / 128;
    uint32_t acc = 0;
    for (size_t t = w; (t + 1) * R <= rows; t += warps)
        acc ^= fold_loads<4 * R>(p, [&](int k) { return (t * R + k / 4) * 128 + (k % 4) * 32 + lane; });
    if (acc == 0x12345678) sink = acc;
}
template <typename K> int run(K kernel, int grid, int block, const uint4 *p, size_t n, size_t bytes, const char *name) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) kernel<<<grid, block>>>(p, n);
    const int reps = 20;
    CK(cudaEventRecord(a));
    for (int i = 0; i < reps; i++) kernel<<<grid, block>>>(p, n);
    CK(cudaGetLastError());
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    const double tbs = bytes * (double)reps / (ms * 1e-3) / 1e12;
    printf("%-40s grid %5d x %4d: %.3f ms per pass, %.2f TB/s\n", name, grid, block, ms / reps, tbs);
    return 0;
}
int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (size_t mb : {311, 1024}) {
        size_t bytes = mb << 20, n = bytes / 16;
        uint4 *p; CK(cudaMalloc(&p, bytes)); CK(cudaMemset(p, 1, bytes));
        printf("== %zu MiB\n", mb);
        for (int bps : {4, 5, 8, 16}) {
            if (run(k_stride<4>, sms * bps, 128, p, n, bytes, "stride U4") ||
                run(k_stride<8>, sms * bps, 128, p, n, bytes, "stride U8") ||
                run(k_warp_contig<8>, sms * bps, 128, p, n, bytes, "warp contiguous U8") ||
                run(k_rows<2>, sms * bps, 128, p, n, bytes, "rows of 2 KB, R2 (lm_head-like)"))
                return 1;
        }
        CK(cudaFree(p));
    }
    CK(cudaGetLastError());
    return 0;
}

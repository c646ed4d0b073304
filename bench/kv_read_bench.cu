/* How fast the KV cache of one long sequence can be read, without the attention's arithmetic: the bound the
 * split-K decode attention (src/backend/cuda/kernels/attention_decode.cu) works against at depth 16,384.
 *   kite/build/bench/kv_read_bench [depth [splits]]
 * The cache is laid out as the engine's (blocks of 128 positions: [K | V][kv_head][slot][128 dims] bf16, 8 kv
 * heads, one region per layer, 28 layers), the sequence's blocks in order. Each mode reads every layer once per
 * pass (28 launches, as a decode step does) and reports microseconds per layer and the read rate (median of 9
 * passes after one warm-up pass):
 *   flat      each of 8 x splits blocks reads a contiguous 1/528 of the layer (4 loads of 16 bytes in flight per thread)
 *   split     the split-K kernel's grid (8 kv heads x splits, default 66; 128 threads) and per-lane loads: a warp takes 16
 *             positions at a time, 16 loads of 16 bytes per lane (K rows g, g + 8; V rows 4t .. 4t + 3)
 *   split2    split, with two tiles of 16 positions per warp in flight
 * Every loaded word is folded into one value per thread, written only if it equals an impossible value, so
 * no load can be dropped by the compiler. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "cuda_bench_check.h"

constexpr int HEAD_DIM = 128, KV_HEADS = 8, BLOCK = 128, LAYERS = 28, THREADS = 128, TILE = 16;
constexpr size_t BLOCK_ELEMENTS = (size_t)2 * KV_HEADS * BLOCK * HEAD_DIM; /* bf16 per cache block and layer */

__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

__global__ void __launch_bounds__(THREADS) flat_read(const uint4 *layer, size_t n, unsigned *sink) {
    const size_t per_block = (n + gridDim.x - 1) / gridDim.x;
    const size_t begin = blockIdx.x * per_block, end = begin + per_block < n ? begin + per_block : n;
    uint32_t acc = 0;
    for (size_t i = begin + threadIdx.x; i < end; i += 4 * THREADS) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = i + j * THREADS < end ? __ldcs(layer + i + j * THREADS) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 4; j++) acc ^= fold(v[j]);
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

__device__ __forceinline__ int tile_row_position(int r) { return 4 * ((r & 7) >> 1) + ((r >> 3) << 1) + (r & 1); }

/* The 16 loads of one tile for this lane, as the split-K kernel issues them. */
__device__ __forceinline__ void tile_loads(const __nv_bfloat16 *head_cache, int tile, int end, int lane, uint4 out[16]) {
    const int g = lane >> 2, t = lane & 3;
    const size_t v_offset = (size_t)KV_HEADS * BLOCK * HEAD_DIM;
    auto row_of = [&](int offset) -> const __nv_bfloat16 * {
        const int p = tile + offset;
        if (p >= end) return nullptr;
        return head_cache + (size_t)(p / BLOCK) * BLOCK_ELEMENTS + (size_t)(p % BLOCK) * HEAD_DIM;
    };
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const __nv_bfloat16 *row = row_of(tile_row_position(g + 8 * r));
#pragma unroll
        for (int j = 0; j < 4; j++) out[4 * r + j] = row ? __ldcs(reinterpret_cast<const uint4 *>(row) + 4 * j + t) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const __nv_bfloat16 *row = row_of(4 * t + q);
        const uint4 *v = row ? reinterpret_cast<const uint4 *>(row + v_offset) : nullptr;
        out[8 + 2 * q] = v ? __ldcs(v + g) : make_uint4(0, 0, 0, 0);
        out[9 + 2 * q] = v ? __ldcs(v + 8 + g) : make_uint4(0, 0, 0, 0);
    }
}

template <int TILES_IN_FLIGHT>
__global__ void __launch_bounds__(THREADS) split_read(const __nv_bfloat16 *layer, int ctx, int splits, unsigned *sink) {
    const int kv_head = blockIdx.x, split = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int chunk = (ctx + splits - 1) / splits, begin = split * chunk, end = min(ctx, begin + chunk);
    const __nv_bfloat16 *head_cache = layer + (size_t)kv_head * BLOCK * HEAD_DIM;
    constexpr int WARPS = THREADS / 32;
    uint32_t acc = 0;
    for (int tile = begin + warp * TILE; tile < end; tile += WARPS * TILE * TILES_IN_FLIGHT) {
        uint4 v[TILES_IN_FLIGHT][16];
#pragma unroll
        for (int k = 0; k < TILES_IN_FLIGHT; k++) tile_loads(head_cache, tile + k * WARPS * TILE, end, lane, v[k]);
#pragma unroll
        for (int k = 0; k < TILES_IN_FLIGHT; k++)
#pragma unroll
            for (int i = 0; i < 16; i++) acc ^= fold(v[k][i]);
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

int main(int argc, char **argv) {
    const int depth = argc > 1 ? atoi(argv[1]) : 16384, splits = argc > 2 ? atoi(argv[2]) : 66;
    if (depth < 1 || depth > (1 << 20) || splits < 1 || splits > 4096) {
        fprintf(stderr, "depth must be 1 .. 1048576, splits 1 .. 4096\n");
        return 2;
    }
    const int n_blocks = (depth + BLOCK - 1) / BLOCK;
    const size_t layer_elements = (size_t)n_blocks * BLOCK_ELEMENTS;
    const size_t layer_bytes = layer_elements * 2, read_bytes = (size_t)depth * KV_HEADS * HEAD_DIM * 2 * 2;
    __nv_bfloat16 *cache = nullptr;
    unsigned *sink = nullptr;
    CHECK(cudaMalloc(&cache, layer_bytes * LAYERS));
    CHECK(cudaMemset(cache, 0x3c, layer_bytes * LAYERS));
    CHECK(cudaMalloc(&sink, 4));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s: depth %d, %.1f MB of K/V per layer, %d layers, %d splits\n", prop.name, depth, read_bytes / 1e6, LAYERS, splits);
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    const char *names[3] = {"flat", "split", "split2"};
    for (int mode = 0; mode < 3; mode++) {
        std::vector<float> ms;
        for (int pass = 0; pass < 10; pass++) {
            CHECK(cudaEventRecord(start));
            for (int l = 0; l < LAYERS; l++) {
                const __nv_bfloat16 *layer = cache + (size_t)l * layer_elements;
                if (mode == 0)
                    flat_read<<<KV_HEADS * splits, THREADS>>>(reinterpret_cast<const uint4 *>(layer), layer_bytes / 16, sink);
                else if (mode == 1)
                    split_read<1><<<dim3(KV_HEADS, splits), THREADS>>>(layer, depth, splits, sink);
                else
                    split_read<2><<<dim3(KV_HEADS, splits), THREADS>>>(layer, depth, splits, sink);
            }
            CHECK(cudaGetLastError());
            CHECK(cudaEventRecord(stop));
            CHECK(cudaEventSynchronize(stop));
            float t = 0;
            CHECK(cudaEventElapsedTime(&t, start, stop));
            if (pass > 0) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double us_layer = 1e3 * ms[ms.size() / 2] / LAYERS;
        const double bytes = mode == 0 ? (double)layer_bytes : (double)read_bytes;
        printf("%-8s %8.2f us per layer  %6.2f TB/s  (passes %.3f .. %.3f ms)\n", names[mode], us_layer,
               bytes / (us_layer * 1e-6) / 1e12, ms.front(), ms.back());
    }
    CHECK(cudaFree(cache));
    CHECK(cudaFree(sink));
    return 0;
}

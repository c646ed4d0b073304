/* Batched decode products for a few rows (2 <= B <= 32 sequences, one token each): Y (B, rows) =
 * X (B, cols) . W (rows, cols)^T, every weight read once per step with 16-byte loads, on tensor cores
 * (mma.sync m16n8k16 bf16, fp32 accumulate), with the GEMV kernels' fusions: RMSNorm prologue,
 * residual add / SwiGLU / lm_head argmax epilogues.
 *
 * The weight is the A operand (16 weight rows x 16 k), the activations the B operand (16 k x 8 rows of
 * the batch), so a batch of up to 8 (16, 32) rows is one (two, four) n-tile(s). The dot product does not care in
 * which order k is summed, so k is permuted to suit the loads: for a chunk of 32 k, lane (g = lane / 4,
 * t = lane % 4) loads 8 consecutive bf16 of weight rows g and g + 8 and of activation row g at k =
 * 32 c + 8 t, 16 bytes each, and those registers are exactly the fragments of two mma (k 8t..8t+3 are
 * the first mma's k 2t, 2t+1, 2t+8, 2t+9; k 8t+4..8t+7 the second's).
 *
 * A block (8 warps) stages the whole activation matrix in shared memory as bf16 (RMS-normalised and
 * scaled by the norm weight when asked, as the GEMV does - up to 8 fp32 rows are first copied raw by cp.async,
 * RAW in the kernel; an input that is bf16 already - o_proj's and down's in the batched path, the lm_head's
 * when a fused residual-add kernel normalised it - is copied by cp.async in one round trip), then loops over
 * tiles of 16 weight rows. The 8 warps split the k range of a tile into `k_slices` and take 8 / k_slices tiles
 * at a time, so a matrix of few rows (o_proj, down: 64 tiles) still keeps 8 warps per tile streaming; partial
 * sums meet in shared memory, where the epilogue stores consecutive outputs of a batch row from consecutive
 * threads (whole sectors). Each warp double-buffers its weight chunks (groups of 4 chunks in flight), across
 * tile boundaries too, and the first group is requested before the programmatic-dependent-launch wait.
 *
 * fp8 weights (cuda_gemm_rows_fp8, W8A16 for --weights fp8): the same kernel over E4M3 codes with 128x128 float32
 * block scales, each code read once per step for all the batch rows. A chunk is 64 k: lane (g, t) loads 16 codes of
 * rows g and g + 8 at k = 64 c + 16 t (16 bytes each), converts them in registers to bf16 (cvt.rn.f16x2.e4m3x2, then
 * to bf16: exact, an E4M3 value has 4 significant bits) and feeds four mma with the activations at the same k (two
 * 16-byte shared loads; the staged rows' stride is 8 mod 64 elements there, so those loads are free of bank
 * conflicts). A 128-k block is two chunks: its products accumulate unscaled in fp32 and are multiplied by the
 * block's scales (rows g and g + 8: for SwiGLU a gate and an up row, two scales) once; the scales of a group are
 * loaded with its codes. k slices start at block boundaries. The activations are the bf16 path's (the input rounded
 * to bf16 after the norm), so the products differ from it only in the weights: code x scale exactly, where the
 * dequantizing route rounded them to bf16. */
#include "backend/cuda/kernels/cuda_common.cuh"

#include <float.h>

#include <type_traits>

namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int BLOCKS_PER_SM = 2;
constexpr int GROUP_CHUNKS = 4; /* chunks of 32 k per warp in flight (x2 double buffered) */
/* fp8: chunks of 64 k per group, one 128-k block: the same weights per group as bf16's 4 chunks in half the bytes.
 * With 4 (two blocks) the codes, the scales and a block's unscaled sums spilled (ptxas: 120 to 244 bytes at one
 * n-tile, 72 to 88 at four). */
constexpr int FP8_GROUP_CHUNKS = 2;
constexpr int MAX_ROWS = 32;
constexpr int SETTLED_PER_THREAD = 2; /* ADD_SETTLED: old outputs read before the wait, per thread */

__device__ __forceinline__ void mma_bf16_16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Shared-memory row stride of the staged activations, in bf16: a multiple of 64 elements plus 32, so
 * the 8 lanes of a 16-byte load phase (two rows, 64 bytes each) fall on distinct banks. fp8 weights: plus 8 instead,
 * since there a lane reads 32 bytes at k = 64 c + 16 t (the 8 lanes of a phase: two rows at 16 bytes apart mod 128,
 * four t 32 bytes apart). Never more than the bf16 stride, so whatever fits for bf16 fits for fp8. */
__host__ __device__ __forceinline__ int staged_stride(int cols, bool fp8) {
    return (cols + 63) / 64 * 64 + (fp8 ? 8 : 32);
}

/* Dynamic shared memory of a block staging NT n-tiles (NT x 8 rows) of `cols`: the bf16 rows, and with RAW the
 * raw fp32 rows and the norm weight after them (the layout gemm_rows_kernel reads). */
size_t staged_smem_bytes(int nt, int cols, bool raw, bool fp8) {
    const size_t rows = (size_t)nt * 8;
    return rows * (size_t)staged_stride(cols, fp8) * sizeof(bf16) +
           (raw ? (rows + 1) * (size_t)cols * sizeof(float) : 0);
}

/* A weight element: an E4M3 code, or a bf16 value. */
template <bool FP8>
using rows_weight = typename std::conditional<FP8, uint8_t, bf16>::type;

/* Two E4M3 codes (the low 16 bits) as a bf16 pair, exactly. */
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t pair) {
    const float2 f = e4m3x2_to_float2(pair);
    return pack_bf16x2(f.x, f.y);
}

/* NT: n-tiles of 8 batch rows. EPILOGUE: CUDA_GEMV_* (ADD_SETTLED runs as ADD with y_settled). X_BF16: the
 * input is bf16 (no norm); Y_BF16: the output is stored as bf16 (SWIGLU only). RAW: a fp32 input is first copied
 * as it is into shared memory by cp.async (the norm weight too, before the PDL wait) and normalised from there,
 * instead of through registers (one round trip to L2 after the wait, and registers free for the second weight
 * group); the launch picks it where the larger shared memory still lets two blocks share an SM. FP8: E4M3 weights
 * with block scales w_scale [ceil(rows / 128)][scale_ld] (the file's comment). */
template <int NT, int EPILOGUE, bool X_BF16, bool Y_BF16, bool RAW, bool FP8>
__global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
    gemm_rows_kernel(const rows_weight<FP8> *__restrict__ weight, const float *__restrict__ w_scale, int scale_ld,
                     const void *x_in, const float *__restrict__ norm_weight, float eps, void *y_out, int n_rows,
                     int rows, int cols, int k_slices, argmax_entry *partial, bool y_settled) {
    constexpr int BT = NT * 8; /* batch rows staged */
    constexpr int GC = FP8 ? FP8_GROUP_CHUNKS : GROUP_CHUNKS; /* chunks per group */
    static_assert(!(RAW && X_BF16), "RAW stages a fp32 input");
    /* 128-byte aligned for the cp.async staging (scripts/kernel_footprint.sh says why every kernel declares it so). */
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16 *xs = reinterpret_cast<bf16 *>(smem_raw);
    /* Partial sums per warp: (tile row, batch row), rows padded to BT + BT / 8 floats so that the epilogue's reads
     * (EPILOGUE_LANES consecutive tile rows of 32 / EPILOGUE_LANES batch rows per warp) fall on distinct banks. */
    __shared__ float red[WARPS][16][BT + BT / 8];
    __shared__ argmax_entry best_scratch[THREADS];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int stride = staged_stride(cols, FP8);
    /* A chunk: 32 k (bf16: 16 bytes of a row per lane quad member) or 64 k (fp8: 16 codes). */
    constexpr int CHUNK_K = FP8 ? 64 : 32, LANE_K = CHUNK_K / 4;
    const int n_chunks = (cols + CHUNK_K - 1) / CHUNK_K;
    const int n_outputs = EPILOGUE == CUDA_GEMV_SWIGLU ? rows / 2 : rows;
    const int tile_outputs = EPILOGUE == CUDA_GEMV_SWIGLU ? 8 : 16;
    const int n_tiles = (n_outputs + tile_outputs - 1) / tile_outputs;
    const int tiles_per_iter = WARPS / k_slices;
    const int slice = warp % k_slices, tile_sub = warp / k_slices;
    /* The epilogue: EPILOGUE_LANES threads per batch row, each taking every EPILOGUE_LANES-th output of the
     * iteration's span, so a warp stores whole 32-byte sectors of consecutive outputs (of 32 / EPILOGUE_LANES rows)
     * and a thread's batch row is the same throughout (the argmax keeps one running best). */
    constexpr int EPILOGUE_LANES = THREADS / BT;
    const int out_row = (int)threadIdx.x / EPILOGUE_LANES, out_lane = (int)threadIdx.x % EPILOGUE_LANES;
    /* fp8: an even number of chunks per slice, so that every slice and group starts at a 128-k block. */
    const int chunks_per_slice = FP8 ? ((n_chunks + k_slices - 1) / k_slices + 1) & ~1 : (n_chunks + k_slices - 1) / k_slices;
    const int chunk_begin = slice * chunks_per_slice;
    const int chunk_end = min(n_chunks, chunk_begin + chunks_per_slice);
    const int groups = chunk_end > chunk_begin ? (chunk_end - chunk_begin + GC - 1) / GC : 0;
    const int iter_tiles = (n_tiles + tiles_per_iter - 1) / tiles_per_iter;
    const int n_iters = (int)blockIdx.x < iter_tiles ? (iter_tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;

    /* Weight rows g and g + 8 of the warp's tile in iteration it (row 0 when past the end: read, discarded), and with
     * fp8 their rows of block scales. */
    const float *scale_lo = w_scale, *scale_hi = w_scale;
    auto tile_rows = [&](int it, const rows_weight<FP8> *&lo, const rows_weight<FP8> *&hi) {
        const int tile = ((int)blockIdx.x + it * (int)gridDim.x) * tiles_per_iter + tile_sub;
        int r_lo, r_hi;
        if (EPILOGUE == CUDA_GEMV_SWIGLU) {
            const int o = tile * 8 + g;
            r_lo = o < n_outputs ? o : 0;
            r_hi = o < n_outputs ? o + n_outputs : 0;
        } else {
            r_lo = tile * 16 + g;
            r_hi = r_lo + 8;
            r_lo = r_lo < rows ? r_lo : 0;
            r_hi = r_hi < rows ? r_hi : 0;
        }
        lo = weight + (size_t)r_lo * (size_t)cols;
        hi = weight + (size_t)r_hi * (size_t)cols;
        if (FP8) {
            scale_lo = w_scale + (size_t)(r_lo >> 7) * (size_t)scale_ld;
            scale_hi = w_scale + (size_t)(r_hi >> 7) * (size_t)scale_ld;
        }
    };
    /* A group's weights, and with fp8 its blocks' scales (rows g and g + 8 of each of the GC / 2 blocks;
     * 0 past the slice's end). */
    constexpr int GROUP_BLOCKS = FP8 ? GC / 2 : 1;
    static_assert(!FP8 || GC % 2 == 0, "fp8 groups hold whole 128-k blocks");
    auto load_group = [&](const rows_weight<FP8> *lo, const rows_weight<FP8> *hi, int group, uint4 (&wlo)[GC],
                          uint4 (&whi)[GC], float (&slo)[GROUP_BLOCKS], float (&shi)[GROUP_BLOCKS]) {
#pragma unroll
        for (int u = 0; u < GC; u++) {
            const int c = chunk_begin + group * GC + u;
            const int k = c * CHUNK_K + t * LANE_K;
            if (c < chunk_end && k < cols) {
                wlo[u] = load_weight_16(lo + k);
                whi[u] = load_weight_16(hi + k);
            } else {
                wlo[u] = whi[u] = make_uint4(0, 0, 0, 0);
            }
        }
        if constexpr (FP8) {
#pragma unroll
            for (int b = 0; b < GROUP_BLOCKS; b++) {
                const int c = chunk_begin + group * GC + 2 * b; /* the block's first chunk */
                const bool in = c < chunk_end;
                slo[b] = in ? __ldg(scale_lo + (c >> 1)) : 0.0f;
                shi[b] = in ? __ldg(scale_hi + (c >> 1)) : 0.0f;
            }
        }
    };

    /* RAW: the input rows (BT x cols fp32) and the norm weight (cols) follow the bf16 rows in shared memory. */
    float *raw_x = reinterpret_cast<float *>(smem_raw + (size_t)BT * (size_t)stride * sizeof(bf16));
    float *raw_norm = raw_x + (size_t)BT * (size_t)cols;
    if (RAW && norm_weight != nullptr) { /* the norm weight does not depend on the previous kernel */
        for (int i = threadIdx.x; i < cols / 4; i += THREADS) cp_async_16(raw_norm + 4 * i, norm_weight + 4 * i);
        cp_async_commit();
    }

    uint4 cur_lo[GC], cur_hi[GC];
    float cur_slo[GROUP_BLOCKS] = {}, cur_shi[GROUP_BLOCKS] = {};
    const rows_weight<FP8> *row_lo = weight, *row_hi = weight;
    if (n_iters > 0 && groups > 0) {
        tile_rows(0, row_lo, row_hi);
        load_group(row_lo, row_hi, 0, cur_lo, cur_hi, cur_slo, cur_shi); /* weights do not depend on the previous kernel */
    }
    /* A bf16 input is staged by cp.async (no registers), so there the second group is requested before the
     * wait too: at B = 8, o_proj and down have 2 and 3 groups per warp, whose second one otherwise left only
     * after the staging. (The normed staging holds 8 float4 per lane; qkv has one group per warp there.) One
     * n-tile only: with 2 or 4 the accumulators leave no room (ptxas: 56 / 132 bytes of spills; 12 at one). */
    uint4 next_lo[GC], next_hi[GC]; /* the group after the one being computed */
    float next_slo[GROUP_BLOCKS] = {}, next_shi[GROUP_BLOCKS] = {};
    const bool early = (X_BF16 || RAW) && NT == 1 && n_iters > 0 && groups > 1;
    if (early) load_group(row_lo, row_hi, 1, next_lo, next_hi, next_slo, next_shi);
    /* ADD_SETTLED: y was last written before the kernel launched just before this one, so the old values of
     * the first iteration's outputs (the thread's first SETTLED_PER_THREAD of the epilogue) are read now, not
     * after the products (one round trip to L2 less at the end; the rule is cuda_gemv's, cuda_ops.h). */
    const int span = tiles_per_iter * tile_outputs; /* consecutive outputs of one iteration */
    float settled[SETTLED_PER_THREAD];
#pragma unroll
    for (int i = 0; i < SETTLED_PER_THREAD; i++) {
        settled[i] = 0.0f;
        const int j = out_lane + i * EPILOGUE_LANES;
        const int out = (int)blockIdx.x * span + j;
        if (EPILOGUE == CUDA_GEMV_ADD && y_settled && n_iters > 0 && j < span && out_row < n_rows && out < n_outputs)
            settled[i] = static_cast<const float *>(y_out)[(size_t)out_row * n_outputs + out];
    }
    pdl_wait();
    pdl_launch_dependents();

    /* Stage the activations: bf16(x * rsqrt(mean(x^2) + eps) * norm_weight), zero rows past n_rows and
     * zero columns past cols. One warp per batch row. (Issuing 4 loads per thread across the block
     * instead measured slower: 1.218 vs 1.095 ms per step at B = 8, docs/cuda.md.) A bf16 input: every
     * thread's 16-byte pieces by cp.async at once. */
    if constexpr (X_BF16) {
        const bf16 *x = static_cast<const bf16 *>(x_in);
        const int pieces = stride / 8; /* per staged row; cols % 8 == 0, so a piece is wholly inside or outside */
        for (int i = threadIdx.x; i < BT * pieces; i += THREADS) {
            const int b = i / pieces, k = (i % pieces) * 8;
            bf16 *dst = xs + (size_t)b * stride + k;
            if (b < n_rows && k < cols) cp_async_16(dst, x + (size_t)b * (size_t)cols + k);
            else *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
        }
        cp_async_commit();
        cp_async_wait<0>();
    }
    if constexpr (RAW) { /* every 16-byte piece of the rows requested at once (cols % 8 == 0) */
        const float *x = static_cast<const float *>(x_in);
        const int pieces = cols / 4;
        for (int i = threadIdx.x; i < n_rows * pieces; i += THREADS) cp_async_16(raw_x + 4 * i, x + 4 * (size_t)i);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads(); /* a warp normalises rows that other threads copied */
    }
    const float *x = RAW ? raw_x : static_cast<const float *>(x_in);
    const float *norm_source = RAW ? raw_norm : norm_weight;
    for (int b = warp; b < (X_BF16 ? 0 : BT); b += WARPS) {
        bf16 *dst = xs + (size_t)b * stride;
        if (b >= n_rows) {
            for (int k = lane * 8; k < stride; k += 256) *reinterpret_cast<uint4 *>(dst + k) = make_uint4(0, 0, 0, 0);
            continue;
        }
        const float4 *src = reinterpret_cast<const float4 *>(x + (size_t)b * (size_t)cols);
        float scale = 1.0f;
        if (norm_weight != nullptr) {
            float sum_sq = 0.0f;
#pragma unroll 8
            for (int i = lane; i < cols / 4; i += 32) {
                const float4 v = src[i];
                sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            scale = rsqrtf(warp_sum(sum_sq) / (float)cols + eps);
        }
        /* 4 values per lane and step, so each load of the warp reads 512 contiguous bytes (ncu: a third of the
         * sectors were excess with 8 values per lane), 4 steps in flight. */
        const float4 *norm4 = reinterpret_cast<const float4 *>(norm_source);
#pragma unroll 4
        for (int i = lane; i < stride / 4; i += 32) {
            uint2 packed = make_uint2(0, 0);
            if (4 * i < cols) {
                float4 v = src[i];
                if (norm_weight != nullptr) {
                    const float4 g = norm4[i];
                    v = make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z, v.w * scale * g.w);
                }
                packed = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
            }
            *reinterpret_cast<uint2 *>(dst + 4 * i) = packed;
        }
    }
    __syncthreads();

    float best_value = -FLT_MAX;
    int32_t best_index = INT32_MAX;
    for (int it = 0; it < n_iters; it++) {
        float acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        for (int group = 0; group < groups; group++) {
            /* Request the next group (this tile's, or the next tile's first) before computing this one. */
            if (early && it == 0 && group == 0) {
                /* requested before the wait */
            } else if (group + 1 < groups) {
                load_group(row_lo, row_hi, group + 1, next_lo, next_hi, next_slo, next_shi);
            } else if (it + 1 < n_iters) {
                tile_rows(it + 1, row_lo, row_hi);
                load_group(row_lo, row_hi, 0, next_lo, next_hi, next_slo, next_shi);
            }
            if constexpr (FP8) {
#pragma unroll
                for (int b = 0; b < GROUP_BLOCKS; b++) {
                    float block[NT][4]; /* the block's products, unscaled */
#pragma unroll
                    for (int n = 0; n < NT; n++) block[n][0] = block[n][1] = block[n][2] = block[n][3] = 0.0f;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int u = 2 * b + h, c = chunk_begin + group * GC + u;
                        if (c >= chunk_end) continue;
                        const int k = c * CHUNK_K + t * LANE_K;
                        const uint32_t lo[4] = {cur_lo[u].x, cur_lo[u].y, cur_lo[u].z, cur_lo[u].w};
                        const uint32_t hi[4] = {cur_hi[u].x, cur_hi[u].y, cur_hi[u].z, cur_hi[u].w};
#pragma unroll
                        for (int n = 0; n < NT; n++) {
                            const bf16 *x_at = xs + (size_t)(n * 8 + g) * stride + k;
                            const uint4 xa = *reinterpret_cast<const uint4 *>(x_at);     /* k .. k + 7 */
                            const uint4 xc = *reinterpret_cast<const uint4 *>(x_at + 8); /* k + 8 .. k + 15 */
                            const uint32_t xr[8] = {xa.x, xa.y, xa.z, xa.w, xc.x, xc.y, xc.z, xc.w};
                            /* mma m: codes k + 4m .. k + 4m + 3 (word m), activations xr[2m], xr[2m + 1]. */
#pragma unroll
                            for (int m = 0; m < 4; m++)
                                mma_bf16_16816(block[n], e4m3x2_to_bf16x2(lo[m] & 0xffffu),
                                               e4m3x2_to_bf16x2(hi[m] & 0xffffu), e4m3x2_to_bf16x2(lo[m] >> 16),
                                               e4m3x2_to_bf16x2(hi[m] >> 16), xr[2 * m], xr[2 * m + 1]);
                        }
                    }
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        acc[n][0] += cur_slo[b] * block[n][0];
                        acc[n][1] += cur_slo[b] * block[n][1];
                        acc[n][2] += cur_shi[b] * block[n][2];
                        acc[n][3] += cur_shi[b] * block[n][3];
                    }
                }
            } else {
#pragma unroll
                for (int u = 0; u < GC; u++) {
                    const int c = chunk_begin + group * GC + u;
                    if (c < chunk_end) {
                        const int k = c * 32 + t * 8;
#pragma unroll
                        for (int n = 0; n < NT; n++) {
                            const uint4 xb = *reinterpret_cast<const uint4 *>(xs + (size_t)(n * 8 + g) * stride + k);
                            mma_bf16_16816(acc[n], cur_lo[u].x, cur_hi[u].x, cur_lo[u].y, cur_hi[u].y, xb.x, xb.y);
                            mma_bf16_16816(acc[n], cur_lo[u].z, cur_hi[u].z, cur_lo[u].w, cur_hi[u].w, xb.z, xb.w);
                        }
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < GC; u++) {
                cur_lo[u] = next_lo[u];
                cur_hi[u] = next_hi[u];
            }
#pragma unroll
            for (int b = 0; b < GROUP_BLOCKS; b++) {
                cur_slo[b] = next_slo[b];
                cur_shi[b] = next_shi[b];
            }
        }
        /* C fragment: (row g, batch 2t, 2t+1) and (row g + 8, same batch) of each n-tile. */
#pragma unroll
        for (int n = 0; n < NT; n++) {
            red[warp][g][n * 8 + 2 * t] = acc[n][0];
            red[warp][g][n * 8 + 2 * t + 1] = acc[n][1];
            red[warp][g + 8][n * 8 + 2 * t] = acc[n][2];
            red[warp][g + 8][n * 8 + 2 * t + 1] = acc[n][3];
        }
        __syncthreads();
        const int first_out = ((int)blockIdx.x + it * (int)gridDim.x) * span;
        for (int i = 0, j = out_lane; j < span && out_row < n_rows; i++, j += EPILOGUE_LANES) {
            const int sub = j / tile_outputs, r = j % tile_outputs, b = out_row;
            const int out = first_out + j;
            if (out >= n_outputs) break;
            float v = 0.0f, up = 0.0f;
            for (int s = 0; s < k_slices; s++) {
                v += red[sub * k_slices + s][r][b];
                if (EPILOGUE == CUDA_GEMV_SWIGLU) up += red[sub * k_slices + s][r + 8][b];
            }
            const size_t at = (size_t)b * (size_t)n_outputs + (size_t)out;
            float *dst = static_cast<float *>(y_out) + at;
            if (EPILOGUE == CUDA_GEMV_SWIGLU) {
                const float value = v / (1.0f + __expf(-v)) * up;
                if (Y_BF16) static_cast<bf16 *>(y_out)[at] = __float2bfloat16(value);
                else *dst = value;
            } else if (EPILOGUE == CUDA_GEMV_ADD) {
                if (y_settled && it == 0 && i < SETTLED_PER_THREAD) {
                    float old = settled[0]; /* selected, not indexed, so settled stays in registers */
#pragma unroll
                    for (int m = 1; m < SETTLED_PER_THREAD; m++) old = i == m ? settled[m] : old;
                    *dst = old + v;
                } else {
                    *dst += v;
                }
            } else {
                *dst = v;
                if (EPILOGUE == CUDA_GEMV_ARGMAX && argmax_better(v, out, best_value, best_index)) {
                    best_value = v;
                    best_index = out;
                }
            }
        }
        __syncthreads(); /* red is rewritten by the next iteration */
    }

    if (EPILOGUE == CUDA_GEMV_ARGMAX) {
        /* Thread t's batch row is t / EPILOGUE_LANES throughout. */
        best_scratch[threadIdx.x] = argmax_entry{best_value, best_index};
        __syncthreads();
        if ((int)threadIdx.x < BT) {
            const int first = (int)threadIdx.x * EPILOGUE_LANES;
            argmax_entry best = best_scratch[first];
            for (int i = first + 1; i < first + EPILOGUE_LANES; i++)
                if (argmax_better(best_scratch[i].value, best_scratch[i].index, best.value, best.index))
                    best = best_scratch[i];
            partial[(size_t)blockIdx.x * MAX_ROWS + threadIdx.x] = best;
        }
    }
}

/* One block per batch row reduces the per-block argmax partials to its token id. */
__global__ void argmax_rows_partials_kernel(const argmax_entry *partial, int n_partial, int32_t *out) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ argmax_entry scratch[32];
    const int row = blockIdx.x;
    argmax_entry best = argmax_none();
    for (int i = threadIdx.x; i < n_partial; i += blockDim.x) {
        const argmax_entry e = partial[(size_t)i * MAX_ROWS + row];
        if (argmax_better(e.value, e.index, best.value, best.index)) best = e;
    }
    best = block_argmax(best, scratch);
    if (threadIdx.x == 0) out[row] = argmax_id(best);
}

/* The device's limits the launches size their grids and shared memory by, queried once (0 shared memory per
 * SM: unknown, so the larger raw-staging layout is never taken; 132 SMs, the H200's, if the count is unknown). */
struct device_limits {
    int sm_count, smem_per_sm, smem_reserved_per_block;
};

device_limits query_device_limits(void) {
    device_limits l = {132, 0, 0};
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return l;
    }
    int count = 0, per_sm = 0, reserved = 0;
    const bool have_count = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess;
    const bool have_smem = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) == cudaSuccess &&
                           cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) == cudaSuccess;
    if (have_count) l.sm_count = count;
    if (have_smem) {
        l.smem_per_sm = per_sm;
        l.smem_reserved_per_block = reserved;
    }
    if (!have_count || !have_smem) (void)cudaGetLastError(); /* a failed query is not a later launch's error */
    return l;
}

const device_limits &limits(void) {
    static const device_limits l = query_device_limits();
    return l;
}

int sm_count(void) { return limits().sm_count; }

/* One product as cuda_gemm_rows (or cuda_gemm_rows_fp8) was asked for it. */
struct rows_call {
    const void *weight;     /* bf16 values, or E4M3 codes */
    const float *w_scale;   /* fp8: the block scales (row stride scale_ld); NULL for bf16 */
    int scale_ld;
    const void *x;
    const float *norm_weight;
    float eps;
    void *y;
    int n_rows, rows, cols;
    argmax_entry *partial;
    int32_t *argmax_out;
    cudaStream_t stream;
    bool pdl, y_settled;
};

/* Whether a block with `static_bytes` + `dynamic_bytes` of shared memory still fits BLOCKS_PER_SM times on an SM. */
bool fits_blocks_per_sm(size_t static_bytes, size_t dynamic_bytes) {
    const device_limits &l = limits();
    const size_t per_block = static_bytes + dynamic_bytes + (size_t)l.smem_reserved_per_block;
    return l.smem_per_sm > 0 && (size_t)BLOCKS_PER_SM * per_block <= (size_t)l.smem_per_sm;
}

/* A kernel's static shared memory; if it cannot be read, more than any SM holds (the error is cleared, so a later
 * launch check does not report it). */
size_t static_smem_of(const void *kernel) {
    cudaFuncAttributes attributes;
    if (cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess) return attributes.sharedSizeBytes;
    (void)cudaGetLastError();
    return SIZE_MAX / 4;
}

template <int NT, int EPILOGUE, bool X_BF16, bool Y_BF16, bool RAW, bool FP8>
kite_status gemm_rows_launch(const rows_call &c) {
    static_assert(!X_BF16 || EPILOGUE == CUDA_GEMV_ADD || EPILOGUE == CUDA_GEMV_ARGMAX,
                  "bf16 inputs: o_proj and down (residual add), and the lm_head after a fused norm");
    static_assert(!Y_BF16 || EPILOGUE == CUDA_GEMV_SWIGLU, "bf16 outputs: the SwiGLU product only");
    static_assert(!FP8 || EPILOGUE != CUDA_GEMV_ARGMAX, "fp8 weights: the linear layers only (the lm_head stays bf16)");
    const int n_outputs = EPILOGUE == CUDA_GEMV_SWIGLU ? c.rows / 2 : c.rows;
    const int n_tiles = KITE_CEIL_DIV(n_outputs, EPILOGUE == CUDA_GEMV_SWIGLU ? 8 : 16);
    const int resident = BLOCKS_PER_SM * sm_count();
    /* As many warps per tile as keep the grid resident: 8 for few tiles, down to 1 for the lm_head. */
    int k_slices = WARPS;
    while (k_slices > 1 && KITE_CEIL_DIV(n_tiles * k_slices, WARPS) > resident) k_slices /= 2;
    const int blocks_needed = KITE_CEIL_DIV(n_tiles * k_slices, WARPS);
    const int grid = blocks_needed < resident ? blocks_needed : resident;
    const size_t smem = staged_smem_bytes(NT, c.cols, RAW, FP8);
    auto kernel = gemm_rows_kernel<NT, EPILOGUE, X_BF16, Y_BF16, RAW, FP8>;
    CUDA_CHECK(allow_dynamic_smem(kernel, smem));
    CUDA_CHECK(launch_kernel(kernel, dim3(grid), dim3(THREADS), smem, c.stream, c.pdl,
                             static_cast<const rows_weight<FP8> *>(c.weight), c.w_scale, c.scale_ld, c.x,
                             c.norm_weight, c.eps, c.y, c.n_rows, c.rows, c.cols, k_slices, c.partial, c.y_settled));
    if (EPILOGUE == CUDA_GEMV_ARGMAX)
        CUDA_CHECK(launch_kernel(argmax_rows_partials_kernel, dim3(c.n_rows), dim3(256), 0, c.stream, c.pdl,
                                 static_cast<const argmax_entry *>(c.partial), grid, c.argmax_out));
    return KITE_OK;
}

/* A fp32 input at one n-tile is staged raw (RAW) where two blocks per SM still fit, else through registers. */
template <int NT, int EPILOGUE, bool Y_BF16, bool FP8>
kite_status gemm_rows_launch_fp32(const rows_call &c) {
    if constexpr (NT == 1) {
        static const size_t raw_static_smem = static_smem_of(
            reinterpret_cast<const void *>(gemm_rows_kernel<1, EPILOGUE, false, Y_BF16, true, FP8>));
        if (fits_blocks_per_sm(raw_static_smem, staged_smem_bytes(1, c.cols, true, FP8)))
            return gemm_rows_launch<1, EPILOGUE, false, Y_BF16, true, FP8>(c);
    }
    return gemm_rows_launch<NT, EPILOGUE, false, Y_BF16, false, FP8>(c);
}

template <int NT, bool FP8>
kite_status gemm_rows_dispatch(const rows_call &c, int epilogue, bool x_bf16, bool y_bf16) {
    switch (epilogue) {
    case CUDA_GEMV_STORE: return gemm_rows_launch_fp32<NT, CUDA_GEMV_STORE, false, FP8>(c);
    case CUDA_GEMV_ADD:
    case CUDA_GEMV_ADD_SETTLED:
        return x_bf16 ? gemm_rows_launch<NT, CUDA_GEMV_ADD, true, false, false, FP8>(c)
                      : gemm_rows_launch_fp32<NT, CUDA_GEMV_ADD, false, FP8>(c);
    case CUDA_GEMV_SWIGLU:
        return y_bf16 ? gemm_rows_launch_fp32<NT, CUDA_GEMV_SWIGLU, true, FP8>(c)
                      : gemm_rows_launch_fp32<NT, CUDA_GEMV_SWIGLU, false, FP8>(c);
    case CUDA_GEMV_ARGMAX:
        if constexpr (FP8) {
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                             "cuda_gemm_rows_fp8: the ARGMAX epilogue is the lm_head's, which stays bf16");
        } else {
            return x_bf16 ? gemm_rows_launch<NT, CUDA_GEMV_ARGMAX, true, false, false, false>(c)
                          : gemm_rows_launch_fp32<NT, CUDA_GEMV_ARGMAX, false, false>(c);
        }
    }
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemm_rows: unknown epilogue %d", epilogue);
}

/* The activations of n_rows rows (staged as 8, 16 or 32) of cols columns in shared memory, bf16. */
size_t staged_bytes(int n_rows, int cols) {
    const size_t staged_rows = n_rows <= 8 ? 8 : n_rows <= 16 ? 16 : 32;
    return staged_rows * (size_t)staged_stride(cols, false) * sizeof(bf16);
}
constexpr size_t MAX_STAGED_BYTES = 200 * 1024;

} // namespace

extern "C" size_t cuda_gemm_rows_argmax_workspace(void) {
    return (size_t)(BLOCKS_PER_SM * sm_count()) * MAX_ROWS * sizeof(argmax_entry);
}

extern "C" int cuda_gemm_rows_fits(int n_rows, int cols) {
    return n_rows > 0 && n_rows <= MAX_ROWS && cols > 0 && staged_bytes(n_rows, cols) <= MAX_STAGED_BYTES;
}

namespace {

/* The checks cuda_gemm_rows and cuda_gemm_rows_fp8 share, then the launch for 1, 2 or 4 n-tiles. */
template <bool FP8>
kite_status gemm_rows_run(const char *what, const rows_call &c, int x_bf16, int y_bf16, int epilogue, void *workspace) {
    const int col_multiple = FP8 ? 16 : 8;
    if (c.n_rows <= 0 || c.n_rows > MAX_ROWS || c.cols <= 0 || c.cols % col_multiple != 0 || c.rows <= 0 ||
        (epilogue == CUDA_GEMV_SWIGLU && c.rows % 2 != 0))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "%s: unsupported shape %d x %d x %d", what, c.n_rows, c.rows,
                         c.cols);
    const bool add = epilogue == CUDA_GEMV_ADD || epilogue == CUDA_GEMV_ADD_SETTLED;
    const bool bf16_input_ok = !x_bf16 || ((add || epilogue == CUDA_GEMV_ARGMAX) && c.norm_weight == NULL);
    if (!bf16_input_ok || (y_bf16 && epilogue != CUDA_GEMV_SWIGLU))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: bf16 input (%d) / output (%d) with epilogue %d%s", what, x_bf16,
                         y_bf16, epilogue, c.norm_weight ? " and a norm" : "");
    if (!cuda_gemm_rows_fits(c.n_rows, c.cols))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: %d columns do not fit in shared memory", what, c.cols);
    if (epilogue == CUDA_GEMV_ARGMAX && (!workspace || !c.argmax_out))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "%s: ARGMAX needs a workspace and an output", what);
    if (c.n_rows <= 8) return gemm_rows_dispatch<1, FP8>(c, epilogue, x_bf16 != 0, y_bf16 != 0);
    if (c.n_rows > 16) return gemm_rows_dispatch<4, FP8>(c, epilogue, x_bf16 != 0, y_bf16 != 0);
    return gemm_rows_dispatch<2, FP8>(c, epilogue, x_bf16 != 0, y_bf16 != 0);
}

} // namespace

extern "C" kite_status cuda_gemm_rows(const void *weight, const void *x, int x_bf16, const float *norm_weight, float eps,
                                      void *y, int y_bf16, int n_rows, int rows, int cols, int epilogue, void *workspace,
                                      int32_t *argmax_out, void *stream, int use_pdl) {
    const rows_call c = {weight, NULL, 0, x, norm_weight, eps, y, n_rows, rows, cols,
                         static_cast<argmax_entry *>(workspace), argmax_out, static_cast<cudaStream_t>(stream),
                         use_pdl != 0, epilogue == CUDA_GEMV_ADD_SETTLED};
    return gemm_rows_run<false>("cuda_gemm_rows", c, x_bf16, y_bf16, epilogue, workspace);
}

extern "C" kite_status cuda_gemm_rows_fp8(const void *weight, const float *w_scale, int scale_ld, const void *x,
                                          int x_bf16, const float *norm_weight, float eps, void *y, int y_bf16,
                                          int n_rows, int rows, int cols, int epilogue, void *stream, int use_pdl) {
    if (!weight || !w_scale || cols <= 0 || scale_ld < KITE_CEIL_DIV(cols, 128))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemm_rows_fp8: %d columns with scale rows of %d%s", cols,
                         scale_ld, w_scale ? "" : " and no scales");
    if (epilogue == CUDA_GEMV_ARGMAX)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "cuda_gemm_rows_fp8: the ARGMAX epilogue is the lm_head's, which stays bf16");
    const rows_call c = {weight, w_scale, scale_ld, x, norm_weight, eps, y, n_rows, rows, cols, NULL, NULL,
                         static_cast<cudaStream_t>(stream), use_pdl != 0, epilogue == CUDA_GEMV_ADD_SETTLED};
    return gemm_rows_run<true>("cuda_gemm_rows_fp8", c, x_bf16, y_bf16, epilogue, NULL);
}

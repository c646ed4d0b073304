/* Each logits row reduced to what the host sampler needs for top-k sampling (sampler_sample_top): the k best
 * logits (logit descending, ties by ascending id; -inf left out), the row's largest logit, how many logits
 * are finite, log(sum_i exp(logit_i - max)) and the first NaN / +inf, so that k values leave the device
 * instead of the whole row (151,936 x 4 bytes for Qwen3).
 *
 * One block per row, three passes over it (it is in L2, just written by the lm_head):
 *   1. the largest finite logit, the finite count, the first NaN / +inf;
 *   2. sum exp(logit - max) in double, and a histogram of the distance below the top, z = max - logit, in
 *      bins of 1/16 (the host sampler's top-p bins): the smallest run of top bins holding k logits gives a
 *      cut that contains the k best, because every logit above the cut beats every logit below it
 *      (z and its bin are monotone in the logit, and equal logits share a bin);
 *   3. the logits above the cut gathered in shared memory (at most CAPACITY, else the row is reported as
 *      overflowing and the host reads it whole), each ranked by counting the ones that beat it.
 * The rank decides the output slot, so the result does not depend on the order of the gathering. */
#include "backend/cuda/cuda_common.cuh"

#include <float.h>

namespace {

constexpr int THREADS = 1024;
constexpr int WARPS = THREADS / 32;
constexpr int CAPACITY = 2048;            /* candidates above the cut a block can rank */
constexpr float MAX_DISTANCE = 104.0f;    /* expf(-104) underflows: every farther logit shares the last bin */
constexpr int BINS_PER_UNIT = 16;
constexpr int N_BINS = 104 * BINS_PER_UNIT + 1;

__device__ __forceinline__ int distance_bin(float max_logit, float logit) {
    const float z = max_logit - logit;
    return z < MAX_DISTANCE ? (int)(z * (float)BINS_PER_UNIT) : N_BINS - 1;
}

__device__ __forceinline__ bool finite_logit(float v) { return v == v && v != INFINITY && v != -INFINITY; }

/* Higher logit first, then lower id: the sampler's order. */
__device__ __forceinline__ bool beats(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

template <typename T, typename Op>
__device__ T block_reduce(T v, T *scratch, Op op) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    __syncthreads(); /* scratch may still be read by a previous reduction */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[lane];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v; /* every thread holds the result */
}

__global__ void __launch_bounds__(THREADS)
    top_candidates_kernel(const float *__restrict__ logits, int vocab, int k, float *top_logits, int32_t *top_ids,
                          cuda_row_top *stats) {
    __shared__ float cand_logit[CAPACITY];
    __shared__ int32_t cand_id[CAPACITY];
    __shared__ unsigned histogram[N_BINS];
    __shared__ double scratch_d[WARPS];
    __shared__ float scratch_f[WARPS];
    __shared__ int scratch_i[WARPS];
    __shared__ int cut_bin, cut_count, n_gathered;

    const int row = blockIdx.x;
    const float *x = logits + (size_t)row * (size_t)vocab;
    cuda_row_top *out = stats + row;

    /* 1. max, finite count, first NaN / +inf. */
    float max_logit = -INFINITY;
    int n_finite = 0, bad = INT32_MAX;
    for (int i = threadIdx.x; i < vocab; i += THREADS) {
        const float v = x[i];
        if (finite_logit(v)) {
            n_finite++;
            max_logit = fmaxf(max_logit, v);
        } else if (v != -INFINITY) {
            bad = min(bad, i);
        }
    }
    max_logit = block_reduce(max_logit, scratch_f, [](float a, float b) { return fmaxf(a, b); });
    n_finite = block_reduce(n_finite, scratch_i, [](int a, int b) { return a + b; });
    bad = block_reduce(bad, scratch_i, [](int a, int b) { return min(a, b); });
    const int want = min(k, n_finite);
    if (bad != INT32_MAX || n_finite == 0) {
        if (threadIdx.x == 0) *out = cuda_row_top{max_logit, n_finite, 0, bad == INT32_MAX ? -1 : bad, 0.0};
        return;
    }

    /* 2. the normalizer and the histogram of distances below the top. */
    for (int b = threadIdx.x; b < N_BINS; b += THREADS) histogram[b] = 0u;
    __syncthreads();
    double sum = 0.0;
    for (int i = threadIdx.x; i < vocab; i += THREADS) {
        const float v = x[i];
        sum += (double)expf(v - max_logit); /* exp(-inf) = 0, as the host sampler sums it */
        if (v != -INFINITY) atomicAdd(&histogram[distance_bin(max_logit, v)], 1u);
    }
    sum = block_reduce(sum, scratch_d, [](double a, double b) { return a + b; });
    __syncthreads();
    if (threadIdx.x == 0) { /* the first bins, from the top, that hold `want` logits */
        unsigned cumulative = 0;
        int b = 0;
        for (; b < N_BINS; b++) {
            cumulative += histogram[b];
            if ((int)cumulative >= want) break;
        }
        cut_bin = b;
        cut_count = (int)cumulative;
        n_gathered = 0;
    }
    __syncthreads();
    if (cut_count > CAPACITY) {
        if (threadIdx.x == 0) *out = cuda_row_top{max_logit, n_finite, -1, -1, log(sum)};
        return;
    }

    /* 3. gather above the cut, rank by counting, write the k best in order. */
    for (int i = threadIdx.x; i < vocab; i += THREADS) {
        const float v = x[i];
        if (v != -INFINITY && distance_bin(max_logit, v) <= cut_bin) {
            const int slot = atomicAdd(&n_gathered, 1);
            cand_logit[slot] = v;
            cand_id[slot] = i;
        }
    }
    __syncthreads();
    const int n = n_gathered; /* == cut_count */
    for (int c = threadIdx.x; c < n; c += THREADS) {
        const float v = cand_logit[c];
        const int32_t id = cand_id[c];
        int rank = 0;
        for (int j = 0; j < n && rank < want; j++) rank += beats(cand_logit[j], cand_id[j], v, id) ? 1 : 0;
        if (rank < want) {
            top_logits[(size_t)row * k + rank] = v;
            top_ids[(size_t)row * k + rank] = id;
        }
    }
    if (threadIdx.x == 0) *out = cuda_row_top{max_logit, n_finite, want, -1, log(sum)};
}

} // namespace

extern "C" kite_status cuda_top_candidates(const float *logits, int n_rows, int vocab, int k, float *top_logits,
                                           int32_t *top_ids, cuda_row_top *stats, void *stream) {
    if (n_rows <= 0 || vocab <= 0 || k <= 0 || k > CUDA_TOP_MAX || !logits || !top_logits || !top_ids || !stats)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_top_candidates: rows %d vocab %d k %d (at most %d)", n_rows,
                         vocab, k, CUDA_TOP_MAX);
    top_candidates_kernel<<<n_rows, THREADS, 0, static_cast<cudaStream_t>(stream)>>>(logits, vocab, k, top_logits,
                                                                                      top_ids, stats);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

/* Each logits row reduced to what the host sampler needs for top-k sampling (sampler_sample_top): the k best
 * logits (logit descending, ties by ascending id; -inf left out), the row's largest logit, how many logits
 * are finite, log(sum_i exp(logit_i - max)) and the first NaN / +inf, so that k values leave the device
 * instead of the whole row (151,936 x 4 bytes for Qwen3).
 *
 * Two kernels, so that a row is read by many SMs at once (one block per row took ~80 us per step at any
 * batch size, the latency of one SM walking 608 KB three times):
 *   1. slices: blocks (slice, row) each copy SLICE logits into shared memory once and reduce them to the
 *      slice's max, finite count, first NaN / +inf, sum of exp(logit - slice max) and its own k best in order;
 *   2. merge: one block per row combines the slices' stats (the sums rescaled to the row's max) and picks the
 *      k best of the slices' candidates. The row's k best are among them: each is among its slice's k best.
 * Both pick their k best the same way (best_in_order): a histogram of the distance below the top, z = top -
 * logit, in bins of 1/16 (the host sampler's top-p bins) gives the smallest run of top bins holding k
 * candidates, a cut that contains the k best because every logit above it beats every logit below it (z and
 * its bin are monotone in the logit, equal logits share a bin); the candidates above the cut are gathered and
 * each ranked by counting the ones that beat it. The rank decides the output slot, so the result does not
 * depend on the order of the gathering. */
#include "backend/cuda/kernels/cuda_common.cuh"

#include <float.h>

namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int SLICE = 4096;            /* logits per slice block */
constexpr int MERGE_CAPACITY = 3072;   /* candidates the merge holds: slices x k */
constexpr int MAX_SLICES = 64;         /* a vocabulary of up to 262,144 */
constexpr float MAX_DISTANCE = 104.0f; /* expf(-104) underflows: every farther logit shares the last bin */
constexpr int BINS_PER_UNIT = 16;
constexpr int N_BINS = 104 * BINS_PER_UNIT + 1;

/* A slice's part of a row (workspace). sum: sum of exp(logit - max_logit) over the slice. */
struct slice_top {
    float max_logit;
    int32_t n_finite;
    int32_t n; /* candidates written: min(k, n_finite), 0 with a NaN / +inf */
    int32_t bad_index;
    double sum;
};

__device__ __forceinline__ int distance_bin(float top, float logit) {
    const float z = top - logit;
    return z < MAX_DISTANCE ? (int)(z * (float)BINS_PER_UNIT) : N_BINS - 1;
}

__device__ __forceinline__ bool finite_logit(float v) { return v == v && v != INFINITY && v != -INFINITY; }

/* Higher logit first, then lower id: the sampler's order. */
__device__ __forceinline__ bool beats(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

/* Every thread gets the reduction of v over the block; identity fills the lanes past the block's warps. */
template <typename T, typename Op>
__device__ T block_reduce(T v, T identity, T *scratch, Op op) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    __syncthreads(); /* scratch may still be read by a previous reduction */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < WARPS ? scratch[lane] : identity;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

/* Shared memory of best_in_order. */
struct ranking_scratch {
    unsigned histogram[N_BINS];
    int cut_bin, n_gathered;
};

/* The `want` best of n candidates (values[i], id_of(i); -inf never among them) written in order to
 * out_logits / out_ids. top: the largest candidate. gathered: room for n indices. Called by the whole block. */
template <typename IdOf>
__device__ void best_in_order(const float *values, IdOf id_of, int n, float top, int want, ranking_scratch &s,
                              int *gathered, float *out_logits, int32_t *out_ids) {
    for (int b = threadIdx.x; b < N_BINS; b += THREADS) s.histogram[b] = 0u;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += THREADS)
        if (values[i] != -INFINITY) atomicAdd(&s.histogram[distance_bin(top, values[i])], 1u);
    __syncthreads();
    if (threadIdx.x == 0) { /* the first bins, from the top, that hold `want` candidates */
        unsigned cumulative = 0;
        int b = 0;
        for (; b < N_BINS; b++) {
            cumulative += s.histogram[b];
            if ((int)cumulative >= want) break;
        }
        s.cut_bin = b;
        s.n_gathered = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += THREADS)
        if (values[i] != -INFINITY && distance_bin(top, values[i]) <= s.cut_bin) gathered[atomicAdd(&s.n_gathered, 1)] = i;
    __syncthreads();
    const int n_gathered = s.n_gathered;
    for (int c = threadIdx.x; c < n_gathered; c += THREADS) {
        const int i = gathered[c];
        const float v = values[i];
        const int32_t id = id_of(i);
        int rank = 0;
        for (int j = 0; j < n_gathered && rank < want; j++) {
            const int other = gathered[j];
            rank += beats(values[other], id_of(other), v, id) ? 1 : 0;
        }
        if (rank < want) {
            out_logits[rank] = v;
            out_ids[rank] = id;
        }
    }
}

/* grid (slices, rows): slice p of row r is logits [p * SLICE, min(vocab, (p + 1) * SLICE)). */
__global__ void __launch_bounds__(THREADS)
    slice_top_kernel(const float *__restrict__ logits, int vocab, int k, slice_top *slice_stats, float *slice_logits,
                     int32_t *slice_ids) {
    __shared__ float values[SLICE];
    __shared__ int gathered[SLICE];
    __shared__ ranking_scratch ranking;
    __shared__ float scratch_f[WARPS];
    __shared__ int scratch_i[WARPS];
    __shared__ double scratch_d[WARPS];

    const int slice = blockIdx.x, row = blockIdx.y, n_slices = gridDim.x;
    const int first = slice * SLICE, n = min(SLICE, vocab - first);
    const float *x = logits + (size_t)row * (size_t)vocab + first;
    const size_t at = (size_t)row * (size_t)n_slices + (size_t)slice;

    /* One read of the slice (every load issued at once), then max, finite count, first NaN / +inf. */
    float max_logit = -INFINITY;
    int n_finite = 0, bad = INT32_MAX;
#pragma unroll 16
    for (int i = threadIdx.x; i < n; i += THREADS) {
        const float v = x[i];
        values[i] = v;
        if (finite_logit(v)) {
            n_finite++;
            max_logit = fmaxf(max_logit, v);
        } else if (v != -INFINITY) {
            bad = min(bad, first + i);
        }
    }
    max_logit = block_reduce(max_logit, -INFINITY, scratch_f, [](float a, float b) { return fmaxf(a, b); });
    n_finite = block_reduce(n_finite, 0, scratch_i, [](int a, int b) { return a + b; });
    bad = block_reduce(bad, INT32_MAX, scratch_i, [](int a, int b) { return min(a, b); });
    if (bad != INT32_MAX || n_finite == 0) {
        if (threadIdx.x == 0) slice_stats[at] = slice_top{max_logit, n_finite, 0, bad == INT32_MAX ? -1 : bad, 0.0};
        return;
    }
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += THREADS) sum += (double)expf(values[i] - max_logit); /* exp(-inf) = 0 */
    sum = block_reduce(sum, 0.0, scratch_d, [](double a, double b) { return a + b; });
    const int want = min(k, n_finite);
    best_in_order(values, [first](int i) { return (int32_t)(first + i); }, n, max_logit, want, ranking, gathered,
                  slice_logits + at * (size_t)k, slice_ids + at * (size_t)k);
    if (threadIdx.x == 0) slice_stats[at] = slice_top{max_logit, n_finite, want, -1, sum};
}

/* One block per row: the slices' stats and candidates combined. */
__global__ void __launch_bounds__(THREADS)
    merge_top_kernel(const slice_top *__restrict__ slice_stats, const float *__restrict__ slice_logits,
                     const int32_t *__restrict__ slice_ids, int n_slices, int k, float *top_logits, int32_t *top_ids,
                     cuda_row_top *stats) {
    __shared__ float values[MERGE_CAPACITY];
    __shared__ int32_t ids[MERGE_CAPACITY];
    __shared__ int gathered[MERGE_CAPACITY];
    __shared__ ranking_scratch ranking;
    __shared__ float scratch_f[WARPS];
    __shared__ int scratch_i[WARPS];
    __shared__ double scratch_d[WARPS];
    __shared__ int offsets[MAX_SLICES + 1]; /* slice p's candidates start at offsets[p] */

    const int row = blockIdx.x;
    const slice_top *st = slice_stats + (size_t)row * (size_t)n_slices;
    cuda_row_top *out = stats + row;

    float max_logit = -INFINITY;
    int n_finite = 0, bad = INT32_MAX;
    for (int p = threadIdx.x; p < n_slices; p += THREADS) {
        max_logit = fmaxf(max_logit, st[p].max_logit);
        n_finite += st[p].n_finite;
        if (st[p].bad_index >= 0) bad = min(bad, st[p].bad_index);
    }
    max_logit = block_reduce(max_logit, -INFINITY, scratch_f, [](float a, float b) { return fmaxf(a, b); });
    n_finite = block_reduce(n_finite, 0, scratch_i, [](int a, int b) { return a + b; });
    bad = block_reduce(bad, INT32_MAX, scratch_i, [](int a, int b) { return min(a, b); });
    if (bad != INT32_MAX || n_finite == 0) {
        if (threadIdx.x == 0) *out = cuda_row_top{max_logit, n_finite, 0, bad == INT32_MAX ? -1 : bad, 0.0};
        return;
    }
    /* Each slice's sum rescaled from its max to the row's. */
    double sum = 0.0;
    for (int p = threadIdx.x; p < n_slices; p += THREADS)
        if (st[p].n_finite > 0) sum += st[p].sum * exp((double)st[p].max_logit - (double)max_logit);
    sum = block_reduce(sum, 0.0, scratch_d, [](double a, double b) { return a + b; });

    if (threadIdx.x == 0) {
        int total = 0;
        for (int p = 0; p < n_slices; p++) {
            offsets[p] = total;
            total += st[p].n;
        }
        offsets[n_slices] = total;
    }
    __syncthreads();
    const int n = offsets[n_slices]; /* <= n_slices * k <= MERGE_CAPACITY (checked at launch) */
    for (int p = 0; p < n_slices; p++) {
        const size_t from = ((size_t)row * (size_t)n_slices + (size_t)p) * (size_t)k;
        for (int i = threadIdx.x; i < offsets[p + 1] - offsets[p]; i += THREADS) {
            values[offsets[p] + i] = slice_logits[from + i];
            ids[offsets[p] + i] = slice_ids[from + i];
        }
    }
    __syncthreads();
    const int want = min(k, n_finite);
    const int32_t *candidate_ids = ids;
    best_in_order(values, [candidate_ids](int i) { return candidate_ids[i]; }, n, max_logit, want, ranking, gathered,
                  top_logits + (size_t)row * (size_t)k, top_ids + (size_t)row * (size_t)k);
    if (threadIdx.x == 0) *out = cuda_row_top{max_logit, n_finite, want, -1, log(sum)};
}

int slices_of(int vocab) { return (vocab + SLICE - 1) / SLICE; }

/* Workspace layout for n_rows rows: slice stats, then candidates' logits, then ids (k = CUDA_TOP_MAX slots). */
size_t stats_bytes(int n_rows, int vocab) {
    return (size_t)n_rows * (size_t)slices_of(vocab) * sizeof(slice_top);
}
size_t candidate_slots(int n_rows, int vocab) { return (size_t)n_rows * (size_t)slices_of(vocab) * CUDA_TOP_MAX; }

} // namespace

extern "C" size_t cuda_top_candidates_workspace(int n_rows, int vocab) {
    if (n_rows <= 0 || vocab <= 0) return 0;
    return stats_bytes(n_rows, vocab) + candidate_slots(n_rows, vocab) * (sizeof(float) + sizeof(int32_t));
}

extern "C" int cuda_top_candidates_fits(int vocab, int k) {
    return vocab > 0 && k > 0 && k <= CUDA_TOP_MAX && slices_of(vocab) <= MAX_SLICES &&
           (size_t)slices_of(vocab) * (size_t)k <= (size_t)MERGE_CAPACITY;
}

extern "C" kite_status cuda_top_candidates(const float *logits, int n_rows, int vocab, int k, float *top_logits,
                                           int32_t *top_ids, cuda_row_top *stats, void *workspace, void *stream) {
    if (n_rows <= 0 || vocab <= 0 || k <= 0 || k > CUDA_TOP_MAX || !logits || !top_logits || !top_ids || !stats ||
        !workspace)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_top_candidates: rows %d vocab %d k %d (at most %d)", n_rows,
                         vocab, k, CUDA_TOP_MAX);
    const int n_slices = slices_of(vocab);
    if (!cuda_top_candidates_fits(vocab, k))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_top_candidates: %d slices of %d candidates exceed the merge's %d "
                         "(or %d slices)", n_slices, k, MERGE_CAPACITY, MAX_SLICES);
    unsigned char *ws = static_cast<unsigned char *>(workspace);
    slice_top *slice_stats = reinterpret_cast<slice_top *>(ws);
    float *slice_logits = reinterpret_cast<float *>(ws + stats_bytes(n_rows, vocab));
    int32_t *slice_ids = reinterpret_cast<int32_t *>(slice_logits + candidate_slots(n_rows, vocab));
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    slice_top_kernel<<<dim3(n_slices, n_rows), THREADS, 0, s>>>(logits, vocab, k, slice_stats, slice_logits, slice_ids);
    CUDA_CHECK_LAUNCH();
    merge_top_kernel<<<n_rows, THREADS, 0, s>>>(slice_stats, slice_logits, slice_ids, n_slices, k, top_logits, top_ids,
                                                 stats);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

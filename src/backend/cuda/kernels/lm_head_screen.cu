/* Greedy decode's lm_head by screening: the argmax of the logits without reading every bf16 row.
 *
 * In a small model's decode step the lm_head is the largest single read (Qwen3-0.6B: 311 MB of bf16, ~73 us of a
 * 0.58 ms step at depth 256), and a greedy step needs only its argmax. Here a copy of the matrix in int8 (one scale
 * per row: half the bytes) is read first. It gives every row an approximate logit and a rigorous bound on how far
 * the exact logit can be from it. Only a row whose upper bound reaches the best lower bound can hold the argmax;
 * those few rows' exact logits are then computed from the bf16 rows with the lm_head GEMV's own arithmetic
 * (gemv.cu), so the id is the one the full product gives, ties (lowest id) and NaN / +inf (ARGMAX_NO_TOKEN) included.
 * test_lm_head_screen checks that bit for bit against cuda_gemv.
 *
 * The screen's arithmetic is integer: each block also quantizes the staged input in two int8 levels,
 * v~ = d1 * hi + d2 * lo (d1 = max|v| / 127, d2 = d1 / 254: about 15 bits), so that a row's approximate dot product
 * is two exact int32 sums of dp4a, S1 = q_i . hi and S2 = q_i . lo, and approx_i = s * scale_i * (d1 S1 + d2 S2).
 * (The float form, a conversion and an FMA per weight byte, ran at 3.4 TB/s, instruction-bound.)
 *
 * The bound. The GEMV computes logit_i = s * (w_i . v) in fp32, with v = x * g the staged input times the norm
 * weights and s the RMS scale (both staged below by the GEMV's own code, so they are the same bits). With
 * w~_i = scale_i * q_i the int8 row, e_i = |w_i - w~_i|_2 and n_i = |w_i|_2 + e_i >= |w~_i|_2:
 *   |w_i . v - w~_i . v~| <= e_i |v|_2 + n_i |v - v~|_2                     (Cauchy-Schwarz, twice),
 * a dot product of n terms summed in fp32 (the exact pass) is within gamma_n |w|_2 |v|_2 of its exact value
 * (gamma_n = n u / (1 - n u), u = 2^-24), and approx_i's few fp32 roundings (its integer sums are exact) are within
 * a few u of s n_i (|v|_2 + |v - v~|_2). So |logit_i - approx_i| <= s |v|_2 d_i + s |v - v~|_2 n_max with
 *   d_i = e_i + 2 gamma_n (|w_i|_2 + e_i) + 8 u (|w_i|_2 + e_i),   n_max = max_i n_i,
 * computed once per row in double and rounded up (screen_build_kernel), and s |v|_2 and s |v - v~|_2 once per block
 * with 1% to spare (it covers the fp32 rounding of the norms, of the bound's products and of approx +- bound). A row
 * with a non-finite weight gets d_i = inf: it is always a candidate. A step whose bound or approx_i is not finite
 * makes the row (or every row) a candidate, and the exact pass then reads those rows as the GEMV would.
 */
#include "backend/cuda/kernels/gemv_task.cuh" /* the GEMV's staging and chunk_dot: the same bits */

#include <float.h>
#include <math.h>

namespace {

constexpr int SCREEN_THREADS = 128; /* also the staging's: s must come out as the GEMV's bits (gemv.cu) */
constexpr int SCREEN_WARPS = SCREEN_THREADS / 32;
constexpr int SCREEN_BLOCKS_PER_SM = 4;
constexpr int PICK_BLOCKS_PER_SM = 2;
constexpr int SCREEN_R = 4; /* rows a warp walks together */
constexpr int SCREEN_U = 2; /* 16-byte chunks (16 int8 columns) per lane, row and step */
constexpr int PICK_GROUPS_AHEAD = 8; /* groups of 32 rows whose upper bounds a warp of the exact pass loads at once */
constexpr int PICK_CHUNKS_AHEAD = 8; /* 16-byte chunks of a candidate row per lane in flight at once */

int sm_count() {
    static int count = 0;
    if (count == 0) {
        int device = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
            count = 132;
    }
    return count;
}

int screen_grid(int rows) {
    const int tasks = KITE_CEIL_DIV(rows, SCREEN_R), blocks = KITE_CEIL_DIV(tasks, SCREEN_WARPS);
    return blocks < SCREEN_BLOCKS_PER_SM * sm_count() ? blocks : SCREEN_BLOCKS_PER_SM * sm_count();
}

int pick_grid(int rows) {
    const int groups = KITE_CEIL_DIV(rows, 32), blocks = KITE_CEIL_DIV(groups, SCREEN_WARPS);
    return blocks < PICK_BLOCKS_PER_SM * sm_count() ? blocks : PICK_BLOCKS_PER_SM * sm_count();
}

/* Where each part of the screen's one allocation lies (bytes from its start; each part 256-byte aligned). */
struct screen_layout {
    size_t q, info, upper, lower, partial, counters, total;
};

screen_layout layout_of(int rows, int cols) {
    auto up = [](size_t n) { return (n + 255) / 256 * 256; };
    screen_layout l;
    l.q = 0;
    l.info = up((size_t)rows * (size_t)cols);
    l.upper = l.info + up((size_t)rows * sizeof(float2));
    l.lower = l.upper + up((size_t)rows * sizeof(float));
    l.partial = l.lower + up((size_t)SCREEN_BLOCKS_PER_SM * sm_count() * sizeof(float));
    l.counters = l.partial + up((size_t)PICK_BLOCKS_PER_SM * sm_count() * sizeof(argmax_entry));
    l.total = l.counters + 256;
    return l;
}

/* Words at l.counters: the exact pass's arrivals, its candidates of this step so far and of the last step, and n_max
 * (a float's bits; set by the build). */
enum { COUNTER_ARRIVED = 0, COUNTER_CANDIDATES = 1, COUNTER_LAST_CANDIDATES = 2, WORD_N_MAX = 3 };

/* One warp per row: the int8 row (round to nearest of w * 127 / max|w|), its scale and its bound d (above). */
__global__ void screen_build_kernel(const bf16 *__restrict__ weight, int rows, int cols, int8_t *q, float2 *info,
                                    unsigned *n_max_bits) {
    const int lane = threadIdx.x & 31;
    const int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if (row >= rows) return;
    const bf16 *w = weight + (size_t)row * (size_t)cols;
    float peak = 0.0f;
    bool finite = true;
    for (int j = lane; j < cols; j += 32) {
        const float v = __bfloat162float(w[j]);
        finite &= isfinite(v);
        peak = fmaxf(peak, fabsf(v));
    }
    finite = __all_sync(0xffffffffu, finite);
    peak = warp_max(peak);
    const float scale = finite && peak > 0.0f ? peak / 127.0f : 0.0f;
    double err_sq = 0.0, norm_sq = 0.0;
    for (int j = lane; j < cols; j += 32) {
        const float v = __bfloat162float(w[j]);
        int level = 0;
        if (scale > 0.0f) {
            level = __float2int_rn(v / scale);
            level = level > 127 ? 127 : (level < -127 ? -127 : level);
        }
        q[(size_t)row * (size_t)cols + j] = (int8_t)level;
        const double diff = (double)v - (double)scale * (double)level;
        err_sq += diff * diff;
        norm_sq += (double)v * (double)v;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        err_sq += __shfl_xor_sync(0xffffffffu, err_sq, offset);
        norm_sq += __shfl_xor_sync(0xffffffffu, norm_sq, offset);
    }
    if (lane == 0) {
        float bound = INFINITY;
        if (finite) {
            const double u = 0x1.0p-24, n = (double)cols;
            const double gamma = n * u / (1.0 - n * u);
            const double e = sqrt(err_sq), norm = sqrt(norm_sq);
            const double d = e + 2.0 * gamma * (norm + e) + 8.0 * u * (norm + e);
            bound = __double2float_ru(d * (1.0 + 0x1.0p-20));
            /* Non-negative floats order as their bits. */
            atomicMax(n_max_bits, __float_as_uint(__double2float_ru((norm + e) * (1.0 + 0x1.0p-20))));
        }
        info[row] = make_float2(scale, bound);
    }
}

/* Phase 1: every row's upper bound approx + bound into `upper`, and each block's best lower bound approx - bound into
 * lower[blockIdx.x] (bounds: test only, else NULL: each row's (approx, bound)). A warp walks SCREEN_R rows at a time in
 * steps of SCREEN_U chunks of 16 int8 per lane, the next step's loads in flight while it multiplies (as the GEMV
 * does); the input's two int8 levels sit in shared memory chunk by chunk (16 bytes each), so a warp's reads are
 * consecutive 16-byte pieces. */
__global__ void __launch_bounds__(SCREEN_THREADS, SCREEN_BLOCKS_PER_SM)
    screen_kernel(const int8_t *__restrict__ q, const float2 *__restrict__ info, const float *x,
                  const float *__restrict__ norm_weight, float eps, int rows, int cols, const unsigned *n_max_bits,
                  float *upper, float *lower, float2 *bounds) {
    extern __shared__ __align__(128) float4 smem_vec[]; /* cols floats, the norm weights, then hi and lo (int8) */
    __shared__ float reduce_scratch[2 * SCREEN_WARPS];
    __shared__ double err_scratch[SCREEN_WARPS];
    __shared__ float warp_lower[SCREEN_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_vec = cols >> 2, n_chunks = cols >> 4;
    const int n_tasks = KITE_CEIL_DIV(rows, SCREEN_R), task_stride = gridDim.x * SCREEN_WARPS;
    float4 *smem_norm = smem_vec + n_vec;
    uint4 *hi_chunks = reinterpret_cast<uint4 *>(smem_vec + 2 * n_vec), *lo_chunks = hi_chunks + n_chunks;

    struct cursor {
        int task, first;
    };
    auto advance = [&](cursor &c) {
        c.first += 32 * SCREEN_U;
        if (c.first >= n_chunks) {
            c.first = 0;
            c.task += task_stride;
        }
    };
    /* Lane r < SCREEN_R also loads row r's (scale, bound) with the task's last step: it alone writes that row. */
    auto load_step = [&](const cursor &c, uint4 (&w)[SCREEN_R][SCREEN_U], float2 &row_info) {
#pragma unroll
        for (int r = 0; r < SCREEN_R; r++) {
            const int row = c.task * SCREEN_R + r < rows ? c.task * SCREEN_R + r : 0; /* out of range: discarded */
            const uint4 *row_ptr = reinterpret_cast<const uint4 *>(q + (size_t)row * (size_t)cols);
#pragma unroll
            for (int u = 0; u < SCREEN_U; u++) {
                const int chunk = c.first + u * 32 + lane;
                w[r][u] = chunk < n_chunks ? load_weight_16(row_ptr + chunk) : make_uint4(0, 0, 0, 0);
            }
        }
        const int own = c.task * SCREEN_R + (lane < SCREEN_R ? lane : 0);
        if (c.first + 32 * SCREEN_U >= n_chunks) row_info = info[own < rows ? own : 0];
    };
    int sum_hi[SCREEN_R], sum_lo[SCREEN_R];
#pragma unroll
    for (int r = 0; r < SCREEN_R; r++) sum_hi[r] = sum_lo[r] = 0;
    /* The step's constants: approx = scale_i * (unit_hi * S1 + unit_lo * S2), unit_hi = s * d1, unit_lo = s * d2. */
    float best_lower = -INFINITY, unit_hi = 0.0f, unit_lo = 0.0f, bound_scale = 0.0f, bound_extra = 0.0f;
    auto multiply_step = [&](const cursor &c, const uint4 (&w)[SCREEN_R][SCREEN_U], const float2 row_info) {
#pragma unroll
        for (int u = 0; u < SCREEN_U; u++) {
            const int chunk = c.first + u * 32 + lane;
            if (chunk < n_chunks) {
                const uint4 hi = hi_chunks[chunk], lo = lo_chunks[chunk];
#pragma unroll
                for (int r = 0; r < SCREEN_R; r++) {
                    sum_hi[r] = __dp4a((int)w[r][u].x, (int)hi.x, sum_hi[r]);
                    sum_hi[r] = __dp4a((int)w[r][u].y, (int)hi.y, sum_hi[r]);
                    sum_hi[r] = __dp4a((int)w[r][u].z, (int)hi.z, sum_hi[r]);
                    sum_hi[r] = __dp4a((int)w[r][u].w, (int)hi.w, sum_hi[r]);
                    sum_lo[r] = __dp4a((int)w[r][u].x, (int)lo.x, sum_lo[r]);
                    sum_lo[r] = __dp4a((int)w[r][u].y, (int)lo.y, sum_lo[r]);
                    sum_lo[r] = __dp4a((int)w[r][u].z, (int)lo.z, sum_lo[r]);
                    sum_lo[r] = __dp4a((int)w[r][u].w, (int)lo.w, sum_lo[r]);
                }
            }
        }
        if (c.first + 32 * SCREEN_U >= n_chunks) { /* the task's last step */
#pragma unroll
            for (int r = 0; r < SCREEN_R; r++) {
                const int total_hi = __reduce_add_sync(0xffffffffu, sum_hi[r]);
                const int total_lo = __reduce_add_sync(0xffffffffu, sum_lo[r]);
                const int row = c.task * SCREEN_R + r;
                if (lane == r && row < rows) {
                    const float approx = row_info.x * (unit_hi * (float)total_hi + unit_lo * (float)total_lo);
                    const float bound = bound_scale * row_info.y + bound_extra;
                    float up = approx + bound, low = approx - bound;
                    if (!(isfinite(approx) && isfinite(bound))) { /* no bound: always a candidate */
                        up = INFINITY;
                        low = -INFINITY;
                    }
                    upper[row] = up;
                    if (bounds) bounds[row] = make_float2(approx, bound);
                    best_lower = fmaxf(best_lower, low);
                }
                sum_hi[r] = sum_lo[r] = 0;
            }
        }
    };

    /* Weights do not depend on the previous kernel: the first step's before the wait, the second after it (the
     * lm_head GEMV's pattern, gemv.cu). */
    uint4 wa[SCREEN_R][SCREEN_U], wb[SCREEN_R][SCREEN_U];
    float2 ia = make_float2(0.0f, 0.0f), ib = ia;
    cursor next_load = {(int)blockIdx.x * SCREEN_WARPS + warp, 0};
    cursor next_multiply = next_load;
    if (next_load.task < n_tasks) load_step(next_load, wa, ia);
    advance(next_load);
#pragma unroll 1
    for (int i = threadIdx.x; i < n_vec; i += SCREEN_THREADS)
        cp_async_16(&smem_norm[i], &reinterpret_cast<const float4 *>(norm_weight)[i]);
    cp_async_commit();
    const float n_max = __uint_as_float(*n_max_bits);
    pdl_wait();
    pdl_launch_dependents();
    if (next_load.task < n_tasks) load_step(next_load, wb, ib);
    advance(next_load);

    /* The input, its scale s, and its two int8 levels with |v - v~|_2 (in double: only the bound uses it). */
    float v_norm_sq = 0.0f;
    const float s = stage_decode_input<SCREEN_THREADS, true>(x, norm_weight, smem_norm, eps, cols, smem_vec, reduce_scratch,
                                                             &v_norm_sq);
    float peak = 0.0f;
#pragma unroll 1
    for (int i = threadIdx.x; i < n_vec; i += SCREEN_THREADS) {
        const float4 v = smem_vec[i];
        peak = fmaxf(peak, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    peak = warp_max(peak);
    __syncthreads(); /* reduce_scratch's sums were read by every thread in stage_input */
    if (lane == 0) reduce_scratch[warp] = peak;
    __syncthreads();
    for (int w = 0; w < SCREEN_WARPS; w++) peak = fmaxf(peak, reduce_scratch[w]);
    const bool levels = isfinite(peak) && peak > 0.0f; /* else hi = lo = 0 and the bound is infinite or exact */
    const float d1 = levels ? peak / 127.0f : 0.0f, d2 = d1 / 254.0f;
    unit_hi = s * d1;
    unit_lo = s * d2;
    double err_sq = 0.0;
#pragma unroll 1
    for (int i = threadIdx.x; i < n_vec; i += SCREEN_THREADS) {
        const float4 v4 = smem_vec[i];
        const float v[4] = {v4.x, v4.y, v4.z, v4.w};
        uint32_t hi_word = 0, lo_word = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int hi = 0, lo = 0;
            if (levels) {
                hi = min(127, max(-127, __float2int_rn(v[k] / d1)));
                const double rest = (double)v[k] - (double)d1 * hi;
                lo = (int)fmin(127.0, fmax(-127.0, rint(rest / (double)d2)));
            }
            const double err = (double)v[k] - ((double)d1 * hi + (double)d2 * lo);
            err_sq += err * err;
            hi_word |= (uint32_t)(hi & 0xff) << (8 * k);
            lo_word |= (uint32_t)(lo & 0xff) << (8 * k);
        }
        /* piece i: word i % 4 of chunk i / 4 */
        reinterpret_cast<uint32_t *>(hi_chunks)[i] = hi_word;
        reinterpret_cast<uint32_t *>(lo_chunks)[i] = lo_word;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) err_sq += __shfl_xor_sync(0xffffffffu, err_sq, offset);
    if (lane == 0) err_scratch[warp] = err_sq;
    __syncthreads();
    double err_total = 0.0;
    for (int w = 0; w < SCREEN_WARPS; w++) err_total += err_scratch[w];
    bound_scale = s * sqrtf(v_norm_sq) * 1.01f;
    bound_extra = s * __double2float_ru(sqrt(err_total)) * n_max * 1.01f;
    if (!isfinite(bound_scale) || !isfinite(bound_extra)) bound_scale = INFINITY;

    while (next_multiply.task < n_tasks) {
        multiply_step(next_multiply, wa, ia);
        advance(next_multiply);
        if (next_load.task < n_tasks) load_step(next_load, wa, ia);
        advance(next_load);
        if (next_multiply.task >= n_tasks) break;
        multiply_step(next_multiply, wb, ib);
        advance(next_multiply);
        if (next_load.task < n_tasks) load_step(next_load, wb, ib);
        advance(next_load);
    }
    best_lower = warp_max(best_lower);
    if (lane == 0) warp_lower[warp] = best_lower;
    __syncthreads();
    if (threadIdx.x == 0) {
        float b = warp_lower[0];
        for (int w = 1; w < SCREEN_WARPS; w++) b = fmaxf(b, warp_lower[w]);
        lower[blockIdx.x] = b;
    }
}

/* Phase 2: the best lower bound L over phase 1's blocks; every row whose upper bound reaches L gets its exact logit,
 * computed as the lm_head GEMV computes it (gemv.cu's multiply: a lane's chunks of 8 in order lane, lane + 32, ...,
 * the same expression, warp_sum, times s). A warp reads the bounds of 32 rows per group; the block's best goes to
 * partial[], and the last block to arrive reduces them to the id. logits (tests only, else NULL): every candidate's
 * exact logit. all_rows (tests only): every row a candidate. */
__global__ void __launch_bounds__(SCREEN_THREADS)
    pick_kernel(const bf16 *__restrict__ weight, const float *x, const float *__restrict__ norm_weight, float eps,
                int rows, int cols, const float *upper, const float *lower, int n_lower, argmax_entry *partial,
                unsigned *counters, int32_t *out, float *logits, int all_rows) {
    extern __shared__ __align__(128) float4 smem_vec[]; /* cols floats, then the norm weights */
    __shared__ float reduce_scratch[2 * SCREEN_WARPS];
    __shared__ float lower_scratch[32];
    __shared__ argmax_entry best_scratch[32];
    __shared__ unsigned block_candidates;
    __shared__ bool is_last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_vec = cols >> 2, n_chunks = cols >> 3;
    float4 *smem_norm = smem_vec + n_vec;
#pragma unroll 1
    for (int i = threadIdx.x; i < n_vec; i += SCREEN_THREADS)
        cp_async_16(&smem_norm[i], &reinterpret_cast<const float4 *>(norm_weight)[i]);
    cp_async_commit();
    if (threadIdx.x == 0) block_candidates = 0;
    pdl_wait();
    pdl_launch_dependents();

    float level = -INFINITY; /* L */
    for (int i = threadIdx.x; i < n_lower; i += SCREEN_THREADS) level = fmaxf(level, lower[i]);
    level = warp_max(level);
    if (lane == 0) lower_scratch[warp] = level;
    /* v_norm_sq is not used here: it is the form measured on the H200, and without it the kernel's code changes, so
     * dropping it waits for a GPU run that measures the change (docs/cuda.md). */
    float v_norm_sq = 0.0f;
    const float s = stage_decode_input<SCREEN_THREADS, true>(x, norm_weight, smem_norm, eps, cols, smem_vec, reduce_scratch,
                                                             &v_norm_sq); /* has a barrier */
    level = lower_scratch[0];
#pragma unroll
    for (int w = 1; w < SCREEN_WARPS; w++) level = fmaxf(level, lower_scratch[w]);
    if (all_rows) level = -INFINITY;

    float best_value = -FLT_MAX;
    int32_t best_index = INT32_MAX;
    unsigned candidates = 0;
    const int n_groups = KITE_CEIL_DIV(rows, 32), group_stride = gridDim.x * SCREEN_WARPS;
    for (int first = (int)blockIdx.x * SCREEN_WARPS + warp; first < n_groups; first += PICK_GROUPS_AHEAD * group_stride) {
        float bounds[PICK_GROUPS_AHEAD];
#pragma unroll
        for (int j = 0; j < PICK_GROUPS_AHEAD; j++) {
            const int row = (first + j * group_stride) * 32 + lane;
            bounds[j] = row < rows ? upper[row] : NAN; /* compares false, even with all_rows */
        }
#pragma unroll /* bounds[] stays in registers */
        for (int j = 0; j < PICK_GROUPS_AHEAD; j++) {
            unsigned mask = __ballot_sync(0xffffffffu, bounds[j] >= level);
            while (mask) {
                const int row = (first + j * group_stride) * 32 + __ffs(mask) - 1;
                mask &= mask - 1;
                const uint4 *row_ptr = reinterpret_cast<const uint4 *>(weight + (size_t)row * (size_t)cols);
                float acc = 0.0f;
                /* PICK_CHUNKS_AHEAD chunks' loads at once (one round trip per 2,048 columns), then the multiply in the
                 * GEMV's order. */
                for (int base = lane; base < n_chunks; base += 32 * PICK_CHUNKS_AHEAD) {
                    uint4 w[PICK_CHUNKS_AHEAD];
#pragma unroll
                    for (int k = 0; k < PICK_CHUNKS_AHEAD; k++)
                        w[k] = base + 32 * k < n_chunks ? load_weight_16(row_ptr + base + 32 * k) : make_uint4(0, 0, 0, 0);
#pragma unroll
                    for (int k = 0; k < PICK_CHUNKS_AHEAD; k++) {
                        const int chunk = base + 32 * k;
                        if (chunk < n_chunks) acc += chunk_dot(w[k], smem_vec[2 * chunk], smem_vec[2 * chunk + 1]);
                    }
                }
                const float logit = warp_sum(acc) * s;
                if (lane == 0) {
                    if (logits) logits[row] = logit;
                    if (argmax_better(logit, row, best_value, best_index)) {
                        best_value = logit;
                        best_index = row;
                    }
                    candidates++;
                }
            }
        }
    }
    if (lane == 0 && candidates) atomicAdd(&block_candidates, candidates);
    argmax_entry best = block_argmax(argmax_entry{best_value, best_index}, best_scratch); /* has barriers */
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = best;
        atomicAdd(&counters[COUNTER_CANDIDATES], block_candidates);
    }
    if (!block_arrive_is_last(&counters[COUNTER_ARRIVED], gridDim.x, &is_last)) return;
    best = argmax_none();
    for (int i = threadIdx.x; i < (int)gridDim.x; i += SCREEN_THREADS)
        if (argmax_better(partial[i].value, partial[i].index, best.value, best.index)) best = partial[i];
    best = block_argmax(best, best_scratch);
    if (threadIdx.x == 0) {
        out[0] = argmax_id(best);
        counters[COUNTER_LAST_CANDIDATES] = counters[COUNTER_CANDIDATES];
        counters[COUNTER_CANDIDATES] = 0;
        counters[COUNTER_ARRIVED] = 0; /* for the next launch (graph replays) */
    }
}

} // namespace

extern "C" int cuda_lm_head_screen_fits(int rows, int cols) {
    /* Staged input and norm weights (fp32), the input's two int8 levels: 10 bytes per column of shared memory. */
    return rows > 0 && cols > 0 && cols % 16 == 0 && (size_t)cols * 10 <= 200 * 1024;
}

extern "C" size_t cuda_lm_head_screen_bytes(int rows, int cols) { return layout_of(rows, cols).total; }

extern "C" kite_status cuda_lm_head_screen_build(const void *weight, int rows, int cols, void *screen, void *stream) {
    if (!cuda_lm_head_screen_fits(rows, cols))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_lm_head_screen_build: %d x %d is not supported", rows, cols);
    const screen_layout l = layout_of(rows, cols);
    unsigned char *base = static_cast<unsigned char *>(screen);
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    CUDA_CHECK(cudaMemsetAsync(base + l.counters, 0, 256, st));
    const int warps_per_block = 8;
    screen_build_kernel<<<KITE_CEIL_DIV(rows, warps_per_block), warps_per_block * 32, 0, st>>>(
        static_cast<const bf16 *>(weight), rows, cols, reinterpret_cast<int8_t *>(base + l.q),
        reinterpret_cast<float2 *>(base + l.info), reinterpret_cast<unsigned *>(base + l.counters) + WORD_N_MAX);
    CUDA_CHECK_LAUNCH();
    return KITE_OK;
}

extern "C" kite_status cuda_lm_head_screened_argmax(const void *weight, void *screen, const float *x,
                                                    const float *norm_weight, float eps, int rows, int cols,
                                                    int32_t *out, float *logits, float *bounds, int all_rows,
                                                    void *stream, int use_pdl) {
    if (!cuda_lm_head_screen_fits(rows, cols) || !norm_weight || !out)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_lm_head_screened_argmax: %d x %d (cols %% 16, a norm and "
                         "an output needed)", rows, cols);
    const screen_layout l = layout_of(rows, cols);
    unsigned char *base = static_cast<unsigned char *>(screen); /* the copy and bounds read, the rest written */
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int grid = screen_grid(rows), pick = pick_grid(rows);
    const size_t screen_smem = (size_t)cols * 10, pick_smem = (size_t)cols * 8;
    CUDA_CHECK(allow_dynamic_smem(screen_kernel, screen_smem));
    CUDA_CHECK(allow_dynamic_smem(pick_kernel, pick_smem));
    float *upper = reinterpret_cast<float *>(base + l.upper), *lower = reinterpret_cast<float *>(base + l.lower);
    CUDA_CHECK(launch_kernel(screen_kernel, dim3(grid), dim3(SCREEN_THREADS), screen_smem, st, use_pdl != 0,
                             reinterpret_cast<const int8_t *>(base + l.q), reinterpret_cast<const float2 *>(base + l.info),
                             x, norm_weight, eps, rows, cols,
                             reinterpret_cast<const unsigned *>(base + l.counters) + WORD_N_MAX, upper, lower,
                             reinterpret_cast<float2 *>(bounds)));
    CUDA_CHECK(launch_kernel(pick_kernel, dim3(pick), dim3(SCREEN_THREADS), pick_smem, st, use_pdl != 0,
                             static_cast<const bf16 *>(weight), x, norm_weight, eps, rows, cols,
                             static_cast<const float *>(upper), static_cast<const float *>(lower), grid,
                             reinterpret_cast<argmax_entry *>(base + l.partial),
                             reinterpret_cast<unsigned *>(base + l.counters), out, logits, all_rows));
    return KITE_OK;
}

extern "C" kite_status cuda_lm_head_screen_candidates(const void *screen, int rows, int cols, unsigned *out) {
    const screen_layout l = layout_of(rows, cols);
    CUDA_CHECK(cudaMemcpy(out, static_cast<const unsigned char *>(screen) + l.counters +
                                   COUNTER_LAST_CANDIDATES * sizeof(unsigned), sizeof(unsigned), cudaMemcpyDeviceToHost));
    return KITE_OK;
}

/* Decode matrix-vector products (B = 1): every weight row read once with 16-byte loads, the input
 * vector staged in shared memory as fp32 (with an RMSNorm: times the norm weights, the RMS scale applied to the
 * dot products), fused epilogues (residual add, SwiGLU of gate/up row pairs, argmax partials for the lm_head).
 *
 * Work split: a warp owns R weight rows at a time and walks them together, U chunks of 8 bf16 per lane per
 * row and step, with the next step's R * U 16-byte loads in flight while it multiplies the current one.
 * Blocks loop over warp tasks (a grid of at most four 4-warp blocks per SM, five for the lm_head), so the prologue
 * (and its RMSNorm) is paid once per block, and under PDL each warp fetches its first two steps (the lm_head its
 * first) before the previous kernel ends.
 *
 * fp8 weights (cuda_gemv_fp8, --weights fp8): the same kernel over E4M3 codes, 16 per 16-byte load, converted by
 * the hardware two at a time (cvt.rn.f16x2.e4m3x2, exact) and multiplied by the fp32 input (W8A16: the input is never
 * quantized). A lane takes its chunks in pairs of one 128-column block (lanes 4j..4j+3 read 64 contiguous bytes of
 * block j with each load, the other 64 with the next: whole 32-byte sectors), sums the pair's 32 products unscaled
 * and multiplies that sum by the block's scale once; the scales of a step are loaded with its weights, so they are
 * in registers when the codes arrive. A step takes 8 loads per lane as 4 rows x 1 pair where a row is not a multiple
 * of 2,048 columns (1,024: every load of a step in range), else 2 rows x 2 pairs. The input sits in shared memory
 * permuted (fp8_input_slot, gemv_task.cuh) so that these lanes' reads are free of bank conflicts. */
#include "backend/cuda/kernels/gemv_task.cuh"

#include <float.h>

#include <type_traits>

namespace {

constexpr int GEMV_THREADS = 128;
constexpr int GEMV_BLOCKS_PER_SM = 4;
/* The lm_head has no neighbour kernel to leave room for (the argmax reduction after it is one block): it takes
 * every block its registers allow (measured: -0.9% per 0.6B step at depth 16,384, -1.0% per 1.7B step). */
constexpr int LM_HEAD_BLOCKS_PER_SM = 5;
constexpr int GEMV_WARPS = GEMV_THREADS / 32;

/* A weight element: an E4M3 code, or a bf16 value. */
template <bool FP8>
using gemv_weight = typename std::conditional<FP8, uint8_t, bf16>::type;

/* The chunk (16 bytes of a row) that lane `lane` loads as load u of a step starting at chunk `first`. bf16: lane + 32u
 * (a warp's load is 512 contiguous bytes). fp8: loads 2p and 2p + 1 are a pair inside one 128-column block (8 chunks):
 * block first / 8 + 8p + lane / 4, its chunks lane % 4 and lane % 4 + 4. Either way a step covers 32 U chunks. */
template <bool FP8>
__device__ __forceinline__ int gemv_chunk(int first, int u, int lane) {
    if (FP8) return first + (u >> 1) * 64 + 8 * (lane >> 2) + (lane & 3) + 4 * (u & 1);
    return first + u * 32 + lane;
}

/* One step's loads: R rows x U chunks per lane, and with fp8 the block scale of each row and pair. */
template <int R, int U, bool FP8>
struct gemv_step {
    uint4 w[R][U];
    float scale[R][FP8 ? U / 2 : 1];
};

template <int R, int U, int EPILOGUE, int MIN_BLOCKS, bool FP8>
__global__ void __launch_bounds__(GEMV_THREADS, MIN_BLOCKS)
    gemv_kernel(const gemv_weight<FP8> *__restrict__ weight, const float *x, const float *__restrict__ norm_weight, float eps,
                float *y, int rows, int cols, argmax_entry *partial, bool y_settled,
                const float *__restrict__ w_scale, int scale_ld) {
    /* The input vector (fp32, normalised in place), then with a norm its weights, filled by cp.async. It starts on
     * a 128-byte boundary whatever the static arrays below take: at byte 16 the SASS differed only in that offset,
     * yet one product alone cost the step +7 to +15% and all of them 25% (docs/cuda.md). The lm_head's vector at
     * byte 256 instead of 160: no measurable change. */
    static_assert(!FP8 || U % 2 == 0, "fp8 steps load pairs of chunks");
    extern __shared__ __align__(128) float4 smem_vec[];
    /* The warps' sums of squares (the first GEMV_WARPS entries; 32, the size every measurement ran with). */
    __shared__ float reduce_scratch[32];
    __shared__ argmax_entry warp_best[GEMV_WARPS];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* A chunk: 16 bytes of a weight row, 8 bf16 or 16 fp8 codes. */
    const int n_chunks = FP8 ? cols >> 4 : cols >> 3, n_vec = cols >> 2;
    gemv_task_rows<R, EPILOGUE> layout; /* task -> rows (gemv_task.cuh) */
    layout.init(rows);
    const int n_tasks = layout.n_tasks();
    const int task_stride = gridDim.x * GEMV_WARPS;
    float4 *smem_norm = smem_vec + n_vec;

    /* A warp walks its tasks in steps of R rows x U chunks per lane; two steps are in flight: the one
     * being multiplied and the next one (buffers a and b alternate), so a warp never waits a whole memory
     * round trip between steps. */
    struct cursor {
        int task, first;
    };
    auto advance = [&](cursor &c) {
        c.first += 32 * U;
        if (c.first >= n_chunks) {
            c.first = 0;
            c.task += task_stride;
        }
    };
    auto load_step = [&](const cursor &c, gemv_step<R, U, FP8> &step) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = layout.valid(c.task, r) ? layout.row_of(c.task, r) : 0; /* out of range: row 0, discarded */
            const uint4 *row_ptr = reinterpret_cast<const uint4 *>(weight + (size_t)row * (size_t)cols);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int chunk = gemv_chunk<FP8>(c.first, u, lane);
                step.w[r][u] = chunk < n_chunks ? load_weight_16(row_ptr + chunk) : make_uint4(0, 0, 0, 0);
            }
            if constexpr (FP8) {
                const float *scale_row = w_scale + (size_t)(row >> 7) * (size_t)scale_ld;
#pragma unroll
                for (int p = 0; p < U / 2; p++) {
                    const int chunk = gemv_chunk<FP8>(c.first, 2 * p, lane);
                    step.scale[r][p] = chunk < n_chunks ? __ldg(scale_row + (chunk >> 3)) : 0.0f;
                }
            }
        }
    };
    float acc[R];
    float norm_scale = 1.0f; /* RMSNorm's rsqrt(mean(x^2) + eps), set after staging; 1 without a norm (exact) */
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    /* ADD_SETTLED: the old y of the warp's first task, read before the wait. */
    float y_settled_rows[R];
    int settled_task = -1;
    if (EPILOGUE == CUDA_GEMV_ADD && y_settled && lane == 0) {
        settled_task = (int)blockIdx.x * GEMV_WARPS + warp;
#pragma unroll
        for (int r = 0; r < R; r++) y_settled_rows[r] = layout.valid(settled_task, r) ? y[settled_task * R + r] : 0.0f;
    }
    float best_value = -FLT_MAX;
    int32_t best_index = INT32_MAX;
    /* fp8: the 16 inputs of chunk `chunk` (from their permuted slots) into x[4]. */
    auto fp8_inputs = [&](int chunk, float4 (&x)[4]) {
        const int permute = ((chunk >> 1) & 1) | (((chunk >> 3) & 1) << 1); /* fp8_input_slot's, for q = 4 chunk + i */
#pragma unroll
        for (int i = 0; i < 4; i++) x[i] = smem_vec[4 * chunk + (i ^ permute)];
    };
    auto multiply_step = [&](const cursor &c, const gemv_step<R, U, FP8> &step) {
        if constexpr (FP8) {
#pragma unroll
            for (int p = 0; p < U / 2; p++) {
                const int chunk = gemv_chunk<FP8>(c.first, 2 * p, lane); /* its pair: chunk + 4, same block */
                if (chunk >= n_chunks) continue;
                float4 x[4];
                float block_sum[R];
                fp8_inputs(chunk, x);
#pragma unroll
                for (int r = 0; r < R; r++) block_sum[r] = chunk_dot_fp8(step.w[r][2 * p], x[0], x[1], x[2], x[3]);
                if (chunk + 4 < n_chunks) { /* not past the row's end (a partial last block) */
                    fp8_inputs(chunk + 4, x);
#pragma unroll
                    for (int r = 0; r < R; r++)
                        block_sum[r] += chunk_dot_fp8(step.w[r][2 * p + 1], x[0], x[1], x[2], x[3]);
                }
#pragma unroll
                for (int r = 0; r < R; r++) acc[r] += step.scale[r][p] * block_sum[r];
            }
        } else {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int chunk = gemv_chunk<FP8>(c.first, u, lane);
                if (chunk < n_chunks) {
                    const float4 x0 = smem_vec[2 * chunk], x1 = smem_vec[2 * chunk + 1];
#pragma unroll
                    for (int r = 0; r < R; r++) acc[r] += chunk_dot(step.w[r][u], x0, x1);
                }
            }
        }
        if (c.first + 32 * U >= n_chunks) { /* the task's last step */
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]) * norm_scale;
            if (lane == 0) {
                if (EPILOGUE == CUDA_GEMV_ADD && c.task == settled_task) { /* y read before the wait */
#pragma unroll
                    for (int r = 0; r < R; r++)
                        if (layout.valid(c.task, r)) y[c.task * R + r] = y_settled_rows[r] + acc[r];
                } else {
                    layout.store(c.task, acc, y, best_value, best_index);
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = 0.0f;
        }
    };

    /* Weights and norm weights do not depend on the previous kernel: fetch them before waiting for it. The
     * products (one or two steps per warp) request all their weights here. The lm_head (~29 steps per warp) requests
     * only its first step: its second, requested right after the wait, is in flight while the block stages its
     * input, and the smaller burst before the wait lets the down projection before it end sooner (its hand-over
     * 2.9 -> 1.7 us; -0.6 to -0.8% per 0.6B step at depth 16,384). */
    constexpr bool SECOND_STEP_AFTER_WAIT = EPILOGUE == CUDA_GEMV_ARGMAX;
    gemv_step<R, U, FP8> wa, wb;
    cursor next_load = {(int)blockIdx.x * GEMV_WARPS + warp, 0};
    cursor next_multiply = next_load;
    /* The warp's next step into a buffer (none past its last task), and the cursor on to the one after it. */
    auto load_next = [&](gemv_step<R, U, FP8> &step) {
        if (next_load.task < n_tasks) load_step(next_load, step);
        advance(next_load);
    };
    load_next(wa);
    if (!SECOND_STEP_AFTER_WAIT) load_next(wb);
    /* The norm weights by cp.async too: no registers held across the wait, and no stall on their arrival before
     * it (loaded into registers and stored here, they held the block short of its wait behind its own weight
     * steps; ncu showed gate_up's blocks, run alone, waiting at that store); the staging's wait below covers both.
     * With the staging and norm loops not unrolled no instance spills (ptxas). Together: -2.8% per 0.6B step at
     * depth 16,384, -3.6% at 256. */
    if (norm_weight != nullptr) {
#pragma unroll 1
        for (int i = threadIdx.x; i < n_vec; i += GEMV_THREADS)
            cp_async_16(&smem_norm[FP8 ? fp8_input_slot(i) : i], &reinterpret_cast<const float4 *>(norm_weight)[i]);
        cp_async_commit();
    }
    pdl_wait();
    pdl_launch_dependents();
    if (SECOND_STEP_AFTER_WAIT) load_next(wb);

    /* Stage the input vector (stage_decode_input, gemv_task.cuh). Every 16-byte piece by cp.async at once: a loop of
     * loads, unrolled by 4 by the compiler, paid a round trip per 4 pieces per thread (2 for 1,024 columns through its
     * remainder loop, 3 for 3,072 and 6,144), and with all of a small matrix's weight steps requested before the wait
     * those round trips are the critical path. The norm folded into the staging (one barrier instead of three and one
     * pass over the input fewer): -0.7 to -1.3% per 0.6B step at depths 256 and 4,096, 0.0% at 16,384, -1.1% per 1.7B
     * step. */
    norm_scale = stage_decode_input<GEMV_THREADS, false, FP8>(x, norm_weight, smem_norm, eps, cols, smem_vec, reduce_scratch);

    while (next_multiply.task < n_tasks) {
        multiply_step(next_multiply, wa);
        advance(next_multiply);
        if (next_load.task < n_tasks) {
            load_step(next_load, wa);
            advance(next_load);
        }
        if (next_multiply.task >= n_tasks) break;
        multiply_step(next_multiply, wb);
        advance(next_multiply);
        if (next_load.task < n_tasks) {
            load_step(next_load, wb);
            advance(next_load);
        }
    }

    if (EPILOGUE == CUDA_GEMV_ARGMAX) {
        if (lane == 0) warp_best[warp] = argmax_entry{best_value, best_index};
        __syncthreads();
        if (threadIdx.x == 0) {
            argmax_entry best = warp_best[0];
            for (int i = 1; i < GEMV_WARPS; i++)
                if (argmax_better(warp_best[i].value, warp_best[i].index, best.value, best.index)) best = warp_best[i];
            partial[blockIdx.x] = best;
        }
    }
}

/* One block reduces the per-block argmax partials of the lm_head GEMV to the token id. */
__global__ void argmax_partials_kernel(const argmax_entry *partial, int n_partial, int32_t *out) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ argmax_entry scratch[32];
    argmax_entry best = argmax_none();
    for (int i = threadIdx.x; i < n_partial; i += blockDim.x) {
        const argmax_entry e = partial[i];
        if (argmax_better(e.value, e.index, best.value, best.index)) best = e;
    }
    best = block_argmax(best, scratch);
    if (threadIdx.x == 0) out[0] = argmax_id(best);
}

int gemv_sm_count() {
    static int sm_count = 0;
    if (sm_count == 0) {
        int device = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
            sm_count = 132;
    }
    return sm_count;
}

/* The largest grid of a product: GEMV_BLOCKS_PER_SM blocks per SM. */
int gemv_max_grid() { return GEMV_BLOCKS_PER_SM * gemv_sm_count(); }
/* The lm_head's (ARGMAX) grid: the argmax workspace holds a partial per block. */
int gemv_argmax_max_grid() { return LM_HEAD_BLOCKS_PER_SM * gemv_sm_count(); }

int gemv_grid(int n_tasks, int max_grid) {
    const int blocks = KITE_CEIL_DIV(n_tasks, GEMV_WARPS);
    return blocks < max_grid ? blocks : max_grid;
}

/* One product as cuda_gemv was asked for it (ADD_SETTLED as ADD with y_settled). */
struct gemv_call {
    const void *weight;
    const float *w_scale; /* fp8 weights' block scales (row stride scale_ld); NULL: bf16 weights */
    int scale_ld;
    const float *x, *norm_weight;
    float eps;
    float *y;
    int rows, cols;
    argmax_entry *partial;
    int32_t *argmax_out;
    cudaStream_t stream;
    bool pdl, y_settled;
};

template <int R, int U, int EPILOGUE, int MIN_BLOCKS, bool FP8>
kite_status gemv_launch(const gemv_call &c) {
    const int outputs_per_task = EPILOGUE == CUDA_GEMV_SWIGLU ? R / 2 : R;
    const int n_outputs = EPILOGUE == CUDA_GEMV_SWIGLU ? c.rows / 2 : c.rows;
    const int grid = gemv_grid(KITE_CEIL_DIV(n_outputs, outputs_per_task),
                               EPILOGUE == CUDA_GEMV_ARGMAX ? gemv_argmax_max_grid() : gemv_max_grid());
    const size_t smem = (size_t)c.cols * sizeof(float) * (c.norm_weight != nullptr ? 2 : 1);
    auto kernel = gemv_kernel<R, U, EPILOGUE, MIN_BLOCKS, FP8>;
    CUDA_CHECK(allow_dynamic_smem(kernel, smem));
    CUDA_CHECK(launch_kernel(kernel, dim3(grid), dim3(GEMV_THREADS), smem, c.stream, c.pdl,
                             static_cast<const gemv_weight<FP8> *>(c.weight), c.x,
                             c.norm_weight, c.eps, c.y, c.rows, c.cols, c.partial, c.y_settled, c.w_scale,
                             c.scale_ld));
    if (EPILOGUE == CUDA_GEMV_ARGMAX)
        CUDA_CHECK(launch_kernel(argmax_partials_kernel, dim3(1), dim3(1024), 0, c.stream, c.pdl,
                                 static_cast<const argmax_entry *>(c.partial), grid, c.argmax_out));
    return KITE_OK;
}

/* Steps of 8 loads of 16 bytes per lane, two in flight, at most 102 registers (5 blocks of 128 threads fit an
 * SM's registers, 4 leave room for a neighbour kernel's block). Measured and dropped: steps of 4 loads with the
 * kernel held to 64 registers, so that two such kernels fit an SM at once (0.747 vs 0.686 ms per 0.6B token).
 * SwiGLU takes 4 rows (2 outputs) per task where that is one round of tasks over the grid's warps, else 2 rows
 * (a better balance across warps when tasks outnumber them). fp8: the steps the kernel's comment describes. */
template <int EPILOGUE, bool FP8>
kite_status gemv_pick(const gemv_call &c) {
    /* fp8: 4 blocks per SM (128 registers): with 5 the R = 2 and 4 instances spilled (the 16 inputs per chunk and the
     * block scales take registers the bf16 ones do not). */
    constexpr int MIN_BLOCKS = FP8 ? 4 : 5, STEP_LOADS = 8;
    static_assert(FP8 || LM_HEAD_BLOCKS_PER_SM <= MIN_BLOCKS, "the lm_head's blocks per SM must fit the registers");
    if constexpr (FP8) {
        /* A step of 2 pairs covers 2,048 columns, one of 1 pair 1,024: the widest step that divides the row, so that no
         * load of a step falls past the row's end where rows are multiples of 1,024 columns (0.6B: 1,024, 2,048, 3,072;
         * 8B: 4,096, 12,288), SwiGLU included (R = 4: two outputs per task). */
        const int n_chunks = c.cols / 16;
        return n_chunks % 128 == 0 ? gemv_launch<2, 4, EPILOGUE, MIN_BLOCKS, FP8>(c)
                                   : gemv_launch<4, 2, EPILOGUE, MIN_BLOCKS, FP8>(c);
    } else if constexpr (EPILOGUE == CUDA_GEMV_SWIGLU) {
        const bool one_round = KITE_CEIL_DIV(c.rows / 2, 2) <= gemv_max_grid() * GEMV_WARPS;
        return one_round ? gemv_launch<4, STEP_LOADS / 4, EPILOGUE, MIN_BLOCKS, FP8>(c)
                         : gemv_launch<2, STEP_LOADS / 2, EPILOGUE, MIN_BLOCKS, FP8>(c);
    } else {
        return c.cols <= 1024 ? gemv_launch<2, STEP_LOADS / 2, EPILOGUE, MIN_BLOCKS, FP8>(c)
                              : gemv_launch<1, STEP_LOADS, EPILOGUE, MIN_BLOCKS, FP8>(c);
    }
}

} // namespace

extern "C" size_t cuda_gemv_argmax_workspace(int rows) {
    (void)rows;
    return (size_t)gemv_argmax_max_grid() * sizeof(argmax_entry);
}

extern "C" kite_status cuda_gemv(const void *weight, const float *x, const float *norm_weight, float eps, float *y,
                                 int rows, int cols, int epilogue, void *workspace, int32_t *argmax_out,
                                 void *stream, int use_pdl) {
    if (cols <= 0 || cols % 8 != 0 || rows <= 0 || (epilogue == CUDA_GEMV_SWIGLU && rows % 2 != 0))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemv: unsupported shape %d x %d", rows, cols);
    if ((size_t)cols * sizeof(float) * (norm_weight != NULL ? 2 : 1) > 200 * 1024)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_gemv: %d columns do not fit in shared memory", cols);
    const gemv_call c = {weight, NULL, 0, x, norm_weight, eps, y, rows, cols,
                         static_cast<argmax_entry *>(workspace), argmax_out, static_cast<cudaStream_t>(stream),
                         use_pdl != 0, epilogue == CUDA_GEMV_ADD_SETTLED};
    switch (epilogue) {
    case CUDA_GEMV_STORE: return gemv_pick<CUDA_GEMV_STORE, false>(c);
    case CUDA_GEMV_ADD:
    case CUDA_GEMV_ADD_SETTLED: return gemv_pick<CUDA_GEMV_ADD, false>(c);
    case CUDA_GEMV_SWIGLU: return gemv_pick<CUDA_GEMV_SWIGLU, false>(c);
    case CUDA_GEMV_ARGMAX:
        if (!workspace || !argmax_out)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemv: ARGMAX needs a workspace and an output");
        return gemv_pick<CUDA_GEMV_ARGMAX, false>(c);
    }
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemv: unknown epilogue %d", epilogue);
}

extern "C" kite_status cuda_gemv_fp8(const void *weight, const float *w_scale, int scale_ld, const float *x,
                                     const float *norm_weight, float eps, float *y, int rows, int cols, int epilogue,
                                     void *stream, int use_pdl) {
    if (cols <= 0 || cols % 16 != 0 || rows <= 0 || (epilogue == CUDA_GEMV_SWIGLU && rows % 2 != 0) || !w_scale ||
        scale_ld < KITE_CEIL_DIV(cols, 128))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemv_fp8: unsupported shape %d x %d (scale rows of %d)",
                         rows, cols, scale_ld);
    if ((size_t)cols * sizeof(float) * (norm_weight != NULL ? 2 : 1) > 200 * 1024)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_gemv_fp8: %d columns do not fit in shared memory", cols);
    const gemv_call c = {weight, w_scale, scale_ld, x, norm_weight, eps, y, rows, cols, NULL, NULL,
                         static_cast<cudaStream_t>(stream), use_pdl != 0, epilogue == CUDA_GEMV_ADD_SETTLED};
    switch (epilogue) {
    case CUDA_GEMV_STORE: return gemv_pick<CUDA_GEMV_STORE, true>(c);
    case CUDA_GEMV_ADD:
    case CUDA_GEMV_ADD_SETTLED: return gemv_pick<CUDA_GEMV_ADD, true>(c);
    case CUDA_GEMV_SWIGLU: return gemv_pick<CUDA_GEMV_SWIGLU, true>(c);
    }
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                     "cuda_gemv_fp8: epilogue %d is not a linear layer's (the lm_head stays bf16)", epilogue);
}

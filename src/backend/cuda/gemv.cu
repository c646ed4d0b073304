/* Decode matrix-vector products (B = 1): every weight row read once with 16-byte loads, the input
 * vector (optionally RMS-normalised) staged in shared memory as fp32, fused epilogues (residual add,
 * SwiGLU of gate/up row pairs, argmax partials for the lm_head).
 *
 * Work split: a warp owns R weight rows at a time and walks them together, U chunks of 8 bf16 per lane
 * in flight per row, so each lane keeps R * U 16-byte loads outstanding. Blocks loop over warp tasks
 * (a grid of at most four 4-warp blocks per SM), so the prologue (and its RMSNorm) is paid once per block and
 * under PDL the whole grid is resident and can fetch its first weights before the previous kernel ends. */
#include "backend/cuda/gemv_task.cuh"

#include <float.h>

namespace {

constexpr int GEMV_THREADS = 128;
constexpr int GEMV_BLOCKS_PER_SM = 4;
constexpr int GEMV_WARPS = GEMV_THREADS / 32;

template <int R, int U, int EPILOGUE>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_kernel(const bf16 *__restrict__ weight, const float *x, const float *__restrict__ norm_weight, float eps,
                float *y, int rows, int cols, argmax_entry *partial) {
    extern __shared__ float4 smem_vec[];
    __shared__ float reduce_scratch[32];
    __shared__ argmax_entry warp_best[GEMV_WARPS];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_chunks = cols >> 3;
    gemv_task_rows<R, EPILOGUE> layout; /* task -> rows (gemv_task.cuh) */
    layout.init(rows);
    const int n_tasks = layout.n_tasks();
    const int task_stride = gridDim.x * GEMV_WARPS;

    uint4 w[R][U];
    int task = blockIdx.x * GEMV_WARPS + warp;
    const uint4 *row_ptr[R];
    auto set_rows = [&](int t) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = layout.valid(t, r) ? layout.row_of(t, r) : 0; /* out of range: read row 0, discard */
            row_ptr[r] = reinterpret_cast<const uint4 *>(weight + (size_t)row * (size_t)cols);
        }
    };
    auto load_chunks = [&](int first_chunk) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = first_chunk + u * 32 + lane;
#pragma unroll
            for (int r = 0; r < R; r++) w[r][u] = c < n_chunks ? load_weight_16(row_ptr[r] + c) : make_uint4(0, 0, 0, 0);
        }
    };

    /* Weights do not depend on the previous kernel: fetch the first chunks before waiting for it. */
    if (task < n_tasks) {
        set_rows(task);
        load_chunks(0);
    }
    pdl_wait();
    pdl_launch_dependents();

    /* Stage the input vector. */
    {
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        float scale = 1.0f;
        if (norm_weight != nullptr) {
            float sum_sq = 0.0f;
            for (int i = threadIdx.x; i < (cols >> 2); i += GEMV_THREADS) {
                const float4 v = x4[i];
                sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            sum_sq = block_sum(sum_sq, reduce_scratch);
            scale = rsqrtf(sum_sq / (float)cols + eps);
        }
        for (int i = threadIdx.x; i < (cols >> 2); i += GEMV_THREADS) {
            float4 v = x4[i];
            if (norm_weight != nullptr) {
                const float4 g = reinterpret_cast<const float4 *>(norm_weight)[i];
                v.x = v.x * scale * g.x;
                v.y = v.y * scale * g.y;
                v.z = v.z * scale * g.z;
                v.w = v.w * scale * g.w;
            }
            smem_vec[i] = v;
        }
        __syncthreads();
    }

    float best_value = -FLT_MAX;
    int32_t best_index = INT32_MAX;
    bool preloaded = true;
    for (; task < n_tasks; task += task_stride) {
        if (!preloaded) set_rows(task);
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        for (int first = 0; first < n_chunks; first += 32 * U) {
            if (!preloaded) load_chunks(first);
            preloaded = false;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = first + u * 32 + lane;
                if (c < n_chunks) {
                    const float4 x0 = smem_vec[2 * c], x1 = smem_vec[2 * c + 1];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float wf[8];
                        bf16x8_to_float(w[r][u], wf);
                        acc[r] += wf[0] * x0.x + wf[1] * x0.y + wf[2] * x0.z + wf[3] * x0.w + wf[4] * x1.x +
                                  wf[5] * x1.y + wf[6] * x1.z + wf[7] * x1.w;
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
        if (lane == 0) layout.template store<false>(task, acc, y, best_value, best_index);
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

int gemv_sm_count = 0;

int gemv_grid(int n_tasks) {
    if (gemv_sm_count == 0) {
        int device = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&gemv_sm_count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
            gemv_sm_count = 132;
    }
    const int blocks = KITE_CEIL_DIV(n_tasks, GEMV_WARPS);
    return blocks < GEMV_BLOCKS_PER_SM * gemv_sm_count ? blocks : GEMV_BLOCKS_PER_SM * gemv_sm_count;
}

template <int R, int U, int EPILOGUE>
kite_status gemv_launch(const void *weight, const float *x, const float *norm_weight, float eps, float *y, int rows,
                        int cols, void *workspace, int32_t *argmax_out, cudaStream_t stream, bool use_pdl) {
    const int outputs_per_task = EPILOGUE == CUDA_GEMV_SWIGLU ? R / 2 : R;
    const int n_outputs = EPILOGUE == CUDA_GEMV_SWIGLU ? rows / 2 : rows;
    const int grid = gemv_grid(KITE_CEIL_DIV(n_outputs, outputs_per_task));
    const size_t smem = (size_t)cols * sizeof(float);
    auto kernel = gemv_kernel<R, U, EPILOGUE>;
    if (smem > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    argmax_entry *partial = reinterpret_cast<argmax_entry *>(workspace);
    CUDA_CHECK(launch_kernel(kernel, dim3(grid), dim3(GEMV_THREADS), smem, stream, use_pdl,
                             reinterpret_cast<const bf16 *>(weight), x, norm_weight, eps, y, rows, cols, partial));
    if (EPILOGUE == CUDA_GEMV_ARGMAX)
        CUDA_CHECK(launch_kernel(argmax_partials_kernel, dim3(1), dim3(1024), 0, stream, use_pdl,
                                 static_cast<const argmax_entry *>(partial), grid, argmax_out));
    return KITE_OK;
}

} // namespace

extern "C" size_t cuda_gemv_argmax_workspace(int rows) {
    (void)rows;
    int device = 0, sm_count = 132;
    if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
    return (size_t)(GEMV_BLOCKS_PER_SM * sm_count) * sizeof(argmax_entry);
}

extern "C" kite_status cuda_gemv(const void *weight, const float *x, const float *norm_weight, float eps, float *y,
                                 int rows, int cols, int epilogue, void *workspace, int32_t *argmax_out,
                                 void *stream, int use_pdl) {
    if (cols <= 0 || cols % 8 != 0 || rows <= 0 || (epilogue == CUDA_GEMV_SWIGLU && rows % 2 != 0))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemv: unsupported shape %d x %d", rows, cols);
    if ((size_t)cols * sizeof(float) > 200 * 1024)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cuda_gemv: %d columns do not fit in shared memory", cols);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const bool pdl = use_pdl != 0;
    /* R rows per warp times U chunks per lane: about 8 loads of 16 bytes in flight per lane. */
    const bool short_rows = cols <= 1024;
    switch (epilogue) {
    case CUDA_GEMV_STORE:
        return short_rows ? gemv_launch<2, 4, CUDA_GEMV_STORE>(weight, x, norm_weight, eps, y, rows, cols, workspace, argmax_out, s, pdl)
                          : gemv_launch<1, 8, CUDA_GEMV_STORE>(weight, x, norm_weight, eps, y, rows, cols, workspace, argmax_out, s, pdl);
    case CUDA_GEMV_ADD:
        return short_rows ? gemv_launch<2, 4, CUDA_GEMV_ADD>(weight, x, norm_weight, eps, y, rows, cols, workspace, argmax_out, s, pdl)
                          : gemv_launch<1, 8, CUDA_GEMV_ADD>(weight, x, norm_weight, eps, y, rows, cols, workspace, argmax_out, s, pdl);
    case CUDA_GEMV_SWIGLU:
        /* 4 rows (2 outputs) per warp: a grid that holds every task, so all weights are requested before
         * the PDL wait. */
        return short_rows ? gemv_launch<4, 4, CUDA_GEMV_SWIGLU>(weight, x, norm_weight, eps, y, rows, cols, workspace, argmax_out, s, pdl)
                          : gemv_launch<4, 2, CUDA_GEMV_SWIGLU>(weight, x, norm_weight, eps, y, rows, cols, workspace, argmax_out, s, pdl);
    case CUDA_GEMV_ARGMAX:
        if (!workspace || !argmax_out)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemv: ARGMAX needs a workspace and an output");
        return short_rows ? gemv_launch<2, 4, CUDA_GEMV_ARGMAX>(weight, x, norm_weight, eps, y, rows, cols, workspace, argmax_out, s, pdl)
                          : gemv_launch<1, 8, CUDA_GEMV_ARGMAX>(weight, x, norm_weight, eps, y, rows, cols, workspace, argmax_out, s, pdl);
    }
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemv: unknown epilogue %d", epilogue);
}

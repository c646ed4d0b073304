/* The rows and the epilogue of one decode matrix-vector task (gemv.cu), and the input staging and chunk dot
 * product that the lm_head screen's exact pass shares with it (lm_head_screen.cu). A task is R weight rows whose
 * dot products with the input a warp reduces to acc[0..R); with the SWIGLU epilogue it is R/2 outputs, output i
 * needing rows i (gate) and i + rows/2 (up). The epilogues are the CUDA_GEMV_* values of cuda_ops.h. */
#ifndef KITE_BACKEND_CUDA_GEMV_TASK_CUH
#define KITE_BACKEND_CUDA_GEMV_TASK_CUH

#include "backend/cuda/kernels/cuda_common.cuh"

/* One 16-byte chunk of a bf16 weight row times 8 fp32 inputs, summed in the order the decode GEMV adds them (gemv.cu);
 * the lm_head screen's exact pass uses it too, because it must reproduce the GEMV's bits. */
__device__ __forceinline__ float chunk_dot(const uint4 w, const float4 x0, const float4 x1) {
    float wf[8];
    bf16x8_to_float(w, wf);
    return wf[0] * x0.x + wf[1] * x0.y + wf[2] * x0.z + wf[3] * x0.w + wf[4] * x1.x + wf[5] * x1.y + wf[6] * x1.z +
           wf[7] * x1.w;
}

/* One 16-byte chunk of an fp8 E4M3 weight row (16 codes) times 16 fp32 inputs, unscaled: the caller multiplies by
 * the block's scale (16 codes never span two 128-column blocks). */
__device__ __forceinline__ float chunk_dot_fp8(const uint4 w, const float4 x0, const float4 x1, const float4 x2,
                                               const float4 x3) {
    const float2 a = e4m3x2_to_float2(w.x & 0xffffu), b = e4m3x2_to_float2(w.x >> 16);
    const float2 c = e4m3x2_to_float2(w.y & 0xffffu), d = e4m3x2_to_float2(w.y >> 16);
    const float2 e = e4m3x2_to_float2(w.z & 0xffffu), f = e4m3x2_to_float2(w.z >> 16);
    const float2 g = e4m3x2_to_float2(w.w & 0xffffu), h = e4m3x2_to_float2(w.w >> 16);
    return a.x * x0.x + a.y * x0.y + b.x * x0.z + b.y * x0.w + c.x * x1.x + c.y * x1.y + d.x * x1.z + d.y * x1.w +
           e.x * x2.x + e.y * x2.y + f.x * x2.z + f.y * x2.w + g.x * x3.x + g.y * x3.y + h.x * x3.z + h.y * x3.w;
}

/* Where the fp8 GEMV keeps float4 q of its input in shared memory: the four float4 of a 16-column chunk c (q = 4c + i)
 * permuted among themselves by ((c >> 1) & 1) | ((c >> 3) & 1) << 1, so that the 8 lanes of a 16-byte load phase,
 * which read chunks c0 + {0, 1, 2, 3, 8, 9, 10, 11} (gemv.cu's fp8 lane layout), hit 8 distinct groups of 4 banks
 * (unpermuted, 64 bytes per chunk put chunks of one parity on the same banks: 4-way conflicts). */
__device__ __forceinline__ int fp8_input_slot(int q) { return q ^ (((q >> 3) & 1) | (((q >> 5) & 1) << 1)); }

/* The decode GEMV's staging of its input (a block of THREADS threads; every thread calls it; one barrier): x (cols
 * floats, the previous kernel's output, in L2) into smem_vec by cp.async, every 16-byte piece requested at once, so one
 * round trip to L2 whatever cols. With a norm (norm_weight not NULL; only tested for NULL here: its values are already
 * requested into smem_norm by cp.async, and the wait here covers them), RMSNorm(x) . w = rsqrt(mean(x^2) + eps) * ((x * g) . w): each thread multiplies the pieces it copied by
 * the norm weights g and sums their squares in the same pass, the warps' sums meet in reduce_scratch (THREADS / 32
 * floats; 2 * THREADS / 32 with V_NORM) across the one barrier the staging needs anyway, and the scale, returned (1
 * without a norm), multiplies the dot products at the end. V_NORM (the lm_head screen's bound; a norm then always):
 * also *v_norm_sq = sum((x * g)^2). The lm_head screen (lm_head_screen.cu) stages through this too: its logits must be the GEMV's bits.
 * FP8_SLOTS: float4 q of x (and of the norm weights, which the caller placed so) lives at fp8_input_slot(q); the sums
 * run in the same order, so the norm scale is the unpermuted staging's bit for bit. */
template <int THREADS, bool V_NORM = false, bool FP8_SLOTS = false>
__device__ __forceinline__ float stage_decode_input(const float *x, const float *norm_weight, const float4 *smem_norm, float eps,
                                                    int cols, float4 *smem_vec, float *reduce_scratch,
                                                    float *v_norm_sq = nullptr) {
    constexpr int WARPS = THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_vec = cols >> 2;
    float norm_scale = 1.0f;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
#pragma unroll 1
    for (int i = threadIdx.x; i < n_vec; i += THREADS) cp_async_16(&smem_vec[FP8_SLOTS ? fp8_input_slot(i) : i], &x4[i]);
    cp_async_commit();
    cp_async_wait<0>();
    if (V_NORM || norm_weight != nullptr) {
        float sum_sq = 0.0f, v_sq = 0.0f;
#pragma unroll 1
        for (int i = threadIdx.x; i < n_vec; i += THREADS) {
            const int slot = FP8_SLOTS ? fp8_input_slot(i) : i;
            float4 v = smem_vec[slot];
            const float4 g = smem_norm[slot];
            sum_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            v.x *= g.x;
            v.y *= g.y;
            v.z *= g.z;
            v.w *= g.w;
            smem_vec[slot] = v;
            if (V_NORM) v_sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        sum_sq = warp_sum(sum_sq);
        if (V_NORM) v_sq = warp_sum(v_sq);
        if (lane == 0) {
            reduce_scratch[warp] = sum_sq;
            if (V_NORM) reduce_scratch[WARPS + warp] = v_sq;
        }
    }
    __syncthreads();
    if (V_NORM || norm_weight != nullptr) {
        float total = 0.0f, v_total = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            total += reduce_scratch[w];
            if (V_NORM) v_total += reduce_scratch[WARPS + w];
        }
        if (V_NORM) *v_norm_sq = v_total;
        norm_scale = rsqrtf(total / (float)cols + eps);
    }
    return norm_scale;
}

template <int R, int EPILOGUE>
struct gemv_task_rows {
    static constexpr int OUTPUTS_PER_TASK = EPILOGUE == CUDA_GEMV_SWIGLU ? R / 2 : R;
    int rows, n_outputs;

    __device__ __forceinline__ void init(int rows_) {
        rows = rows_;
        n_outputs = EPILOGUE == CUDA_GEMV_SWIGLU ? rows_ / 2 : rows_;
    }
    __device__ __forceinline__ int n_tasks() const { return (n_outputs + OUTPUTS_PER_TASK - 1) / OUTPUTS_PER_TASK; }
    __device__ __forceinline__ int row_of(int task, int r) const {
        if (EPILOGUE == CUDA_GEMV_SWIGLU) return task * OUTPUTS_PER_TASK + (r >> 1) + (r & 1) * n_outputs;
        return task * R + r;
    }
    __device__ __forceinline__ bool valid(int task, int r) const {
        if (EPILOGUE == CUDA_GEMV_SWIGLU) return task * OUTPUTS_PER_TASK + (r >> 1) < n_outputs;
        return task * R + r < rows;
    }

    /* Lane 0 writes the task's outputs: STORE y[row] = acc, ADD y[row] += acc, SWIGLU y[i] = silu(gate) * up,
     * ARGMAX y[row] = acc and (best, best_index) updated. */
    __device__ __forceinline__ void store(int task, const float acc[R], float *y, float &best, int32_t &best_index) const {
        if (EPILOGUE == CUDA_GEMV_SWIGLU) {
#pragma unroll
            for (int r = 0; r < R; r += 2) {
                if (!valid(task, r)) continue;
                const float gate = acc[r], up = acc[r + 1];
                y[task * OUTPUTS_PER_TASK + (r >> 1)] = gate / (1.0f + __expf(-gate)) * up;
            }
        } else {
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (!valid(task, r)) continue;
                const int row = task * R + r;
                if (EPILOGUE == CUDA_GEMV_ADD) {
                    y[row] += acc[r];
                } else {
                    y[row] = acc[r];
                    if (EPILOGUE == CUDA_GEMV_ARGMAX && argmax_better(acc[r], row, best, best_index)) {
                        best = acc[r];
                        best_index = row;
                    }
                }
            }
        }
    }
};

#endif

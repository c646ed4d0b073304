/* The rows and the epilogue of one decode matrix-vector task, shared by gemv.cu (a kernel per product) and
 * decode_persistent.cu (stages of one kernel). A task is R weight rows whose dot products with the input a
 * warp reduces to acc[0..R); with the SWIGLU epilogue it is R/2 outputs, output i needing rows i (gate) and
 * i + rows/2 (up). The epilogues are the CUDA_GEMV_* values of cuda_ops.h. */
#ifndef KITE_BACKEND_CUDA_GEMV_TASK_CUH
#define KITE_BACKEND_CUDA_GEMV_TASK_CUH

#include "backend/cuda/cuda_common.cuh"

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
     * ARGMAX y[row] = acc and (best, best_index) updated. THROUGH_L2: y is read and written with
     * ld/st.global.cg, for a persistent kernel whose other SMs read y in the same launch. */
    template <bool THROUGH_L2>
    __device__ __forceinline__ void store(int task, const float acc[R], float *y, float &best, int32_t &best_index) const {
        auto put = [](float *p, float v) {
            if (THROUGH_L2) __stcg(p, v); else *p = v;
        };
        if (EPILOGUE == CUDA_GEMV_SWIGLU) {
#pragma unroll
            for (int r = 0; r < R; r += 2) {
                if (!valid(task, r)) continue;
                const float gate = acc[r], up = acc[r + 1];
                put(&y[task * OUTPUTS_PER_TASK + (r >> 1)], gate / (1.0f + __expf(-gate)) * up);
            }
        } else {
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (!valid(task, r)) continue;
                const int row = task * R + r;
                if (EPILOGUE == CUDA_GEMV_ADD) {
                    put(&y[row], (THROUGH_L2 ? __ldcg(&y[row]) : y[row]) + acc[r]);
                } else {
                    put(&y[row], acc[r]);
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

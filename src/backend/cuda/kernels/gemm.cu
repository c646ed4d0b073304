/* Prefill GEMMs through cuBLASLt: Y (n, m) = X (n, k) . W (m, k)^T (+ Y), bf16 operands, fp32
 * accumulation, bf16 or fp32 out (fp32 with beta = 1 is the fused residual add into the fp32 stream).
 *
 * Row-major Y (n, m) is column-major Y^T (m x n), so cuBLASLt computes Y^T = op(W) . X with W read as
 * the column-major (k x m) matrix transposed ("TN"). The heuristic's algorithm and the descriptors are
 * created once per (m, plan rows, k, out type, beta, slices) and cached (the least recently used plan makes room);
 * one 32 MiB workspace serves every call. Plan rows are n rounded up to a bucket (plan_rows): a server's steps read
 * a different number of tokens and want a different number of logits rows nearly every time, and a plan per exact
 * n queried the heuristic on most prefill steps (in kite serve at concurrency 128 the lm_head's call took 0.75 ms
 * of host time per step). The bucket's algorithm runs the real n, set on the plan's layouts before the call.
 *
 * cuda_gemm_bf16_split runs the same product as `slices` k slices in one strided-batch launch, each writing its
 * own fp32 partial: for the batched decode's small-n products this gives cuBLASLt more blocks than its own
 * choice, and the partials are summed by the kernel that adds them to the residual (rmsnorm.cu), where cuBLASLt's
 * split-K would have launched a separate reduction (docs/cuda.md). */
#include "backend/cuda/kernels/cuda_common.cuh"

#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#define CUBLAS_CHECK(stmt)                                                                               \
    do {                                                                                                 \
        cublasStatus_t cublas_check_status_ = (stmt);                                                    \
        if (cublas_check_status_ != CUBLAS_STATUS_SUCCESS)                                               \
            return kite_fail(KITE_ERROR_BACKEND, "cublasLt: %s failed at %s:%d: %s", #stmt, __FILE__,    \
                             __LINE__, cublasGetStatusName(cublas_check_status_));                       \
    } while (0)

namespace {

constexpr size_t WORKSPACE_BYTES = 32u << 20;
constexpr int CACHE_ENTRIES = 96;
/* Plan rows: n itself up to EXACT_ROWS (single-stream decode and small steps), the next power of two up to
 * POWER_ROWS (the batched decode's buckets, which are powers of two, keep their exact plans), then multiples of
 * LARGE_ROWS_STEP. */
constexpr int EXACT_ROWS = 16;
constexpr int POWER_ROWS = 256;
constexpr int LARGE_ROWS_STEP = 256;

/* The n a plan for n rows is made for. Strided-batch (sliced) plans keep their exact n: their partials' stride is
 * m x n. */
int plan_rows(int n, int slices) {
    if (slices > 1 || n <= EXACT_ROWS) return n;
    if (n <= POWER_ROWS) {
        int rows = EXACT_ROWS;
        while (rows < n) rows *= 2;
        return rows;
    }
    return (n + LARGE_ROWS_STEP - 1) / LARGE_ROWS_STEP * LARGE_ROWS_STEP;
}

struct gemm_plan {
    int m, n, k, out_f32, accumulate; /* n: the plan rows (plan_rows) */
    int layout_n;                     /* the n the layouts b and c hold now */
    unsigned long long last_use;      /* the call count when the plan last ran: the least recent makes room */
    int slices; /* > 1: k split into this many slices, one fp32 partial product each (a strided batch) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};

void plan_destroy(gemm_plan *p) {
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

} // namespace

struct cuda_gemm {
    cublasLtHandle_t handle;
    void *workspace;
    gemm_plan plans[CACHE_ENTRIES];
    int n_plans;
    unsigned long long calls;
};

namespace {

kite_status plan_create(cuda_gemm *g, gemm_plan *p, int m, int n, int k, int out_f32, int accumulate, int slices) {
    memset(p, 0, sizeof *p);
    p->m = m;
    p->n = n;
    p->layout_n = n;
    p->k = k;
    p->out_f32 = out_f32;
    p->accumulate = accumulate;
    p->slices = slices;
    const cublasOperation_t transpose = CUBLAS_OP_T, no_transpose = CUBLAS_OP_N;
    const cudaDataType_t out_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose, sizeof no_transpose));
    /* A slice is k / slices rows of the column-major (k x m) W and (k x n) X, the leading dimension still k;
     * slice s starts s * k / slices elements in and writes partial s, m * n floats apart. */
    const int k_slice = k / slices;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, (uint64_t)k_slice, (uint64_t)m, (int64_t)k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, (uint64_t)k_slice, (uint64_t)n, (int64_t)k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, out_type, (uint64_t)m, (uint64_t)n, (int64_t)m));
    if (slices > 1) {
        const int32_t count = slices;
        const int64_t ab_stride = k_slice, c_stride = (int64_t)m * n;
        for (cublasLtMatrixLayout_t layout : {p->a, p->b, p->c})
            CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(p->a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &ab_stride,
                                                      sizeof ab_stride));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(p->b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &ab_stride,
                                                      sizeof ab_stride));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(p->c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &c_stride,
                                                      sizeof c_stride));
    }

    cublasLtMatmulPreference_t preference;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const size_t workspace_bytes = WORKSPACE_BYTES;
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof workspace_bytes);
    cublasLtMatmulHeuristicResult_t result;
    int n_results = 0;
    if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatmulAlgoGetHeuristic(g->handle, p->op, p->a, p->b, p->c, p->c, preference, 1, &result,
                                                &n_results);
    cublasLtMatmulPreferenceDestroy(preference);
    CUBLAS_CHECK(status);
    if (n_results == 0)
        return kite_fail(KITE_ERROR_BACKEND, "cublasLt: no algorithm for %d x %d x %d (out %s)", m, n, k,
                         out_f32 ? "f32" : "bf16");
    p->algo = result.algo;
    return KITE_OK;
}

} // namespace

extern "C" kite_status cuda_gemm_create(cuda_gemm **out) {
    *out = NULL;
    cuda_gemm *g = static_cast<cuda_gemm *>(calloc(1, sizeof(cuda_gemm)));
    if (!g) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda_gemm_create: out of host memory");
    cublasStatus_t status = cublasLtCreate(&g->handle);
    if (status != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return kite_fail(KITE_ERROR_BACKEND, "cublasLt: cublasLtCreate failed: %s", cublasGetStatusName(status));
    }
    cudaError_t error = cudaMalloc(&g->workspace, WORKSPACE_BYTES);
    if (error != cudaSuccess) {
        cublasLtDestroy(g->handle);
        free(g);
        return kite_fail(KITE_ERROR_BACKEND, "cuda: cudaMalloc(gemm workspace) failed: %s", cudaGetErrorName(error));
    }
    *out = g;
    return KITE_OK;
}

extern "C" void cuda_gemm_destroy(cuda_gemm *g) {
    if (!g) return;
    for (int i = 0; i < g->n_plans; i++) plan_destroy(&g->plans[i]);
    cudaFree(g->workspace);
    cublasLtDestroy(g->handle);
    free(g);
}

namespace {

/* Y = X . W^T (+ Y) through the cached plan for this shape (created on first use). */
kite_status run_gemm(cuda_gemm *g, const void *x, const void *w, void *y, int out_f32, float beta, int n, int m, int k,
                     int slices, void *stream) {
    const int accumulate = beta != 0.0f;
    const int rows = plan_rows(n, slices);
    gemm_plan *plan = NULL;
    for (int i = 0; i < g->n_plans; i++) {
        gemm_plan *p = &g->plans[i];
        if (p->m == m && p->n == rows && p->k == k && p->out_f32 == out_f32 && p->accumulate == accumulate &&
            p->slices == slices) {
            plan = p;
            break;
        }
    }
    if (!plan) {
        if (g->n_plans < CACHE_ENTRIES) {
            plan = &g->plans[g->n_plans++];
        } else {
            plan = &g->plans[0];
            for (int i = 1; i < g->n_plans; i++)
                if (g->plans[i].last_use < plan->last_use) plan = &g->plans[i];
            plan_destroy(plan);
        }
        kite_status status = plan_create(g, plan, m, rows, k, out_f32, accumulate, slices);
        if (status != KITE_OK) {
            plan_destroy(plan);
            plan->m = -1; /* never matches */
            return status;
        }
    }
    plan->last_use = ++g->calls;
    if (plan->layout_n != n) {
        const uint64_t cols = (uint64_t)n;
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(plan->b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(plan->c, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
        plan->layout_n = n;
    }
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(g->handle, plan->op, &alpha, w, plan->a, x, plan->b, &beta, y, plan->c, y, plan->c,
                                &plan->algo, g->workspace, WORKSPACE_BYTES, static_cast<cudaStream_t>(stream)));
    return KITE_OK;
}

} // namespace

extern "C" kite_status cuda_gemm_bf16(cuda_gemm *g, const void *x, const void *w, void *y, int out_f32, float beta,
                                      int n, int m, int k, void *stream) {
    if (n <= 0 || m <= 0 || k <= 0) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemm_bf16: %d x %d x %d", n, m, k);
    if (beta != 0.0f && !out_f32)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemm_bf16: accumulation needs an fp32 output");
    return run_gemm(g, x, w, y, out_f32, beta, n, m, k, 1, stream);
}

extern "C" kite_status cuda_gemm_bf16_split(cuda_gemm *g, const void *x, const void *w, float *partials, int slices,
                                            int n, int m, int k, void *stream) {
    if (n <= 0 || m <= 0 || k <= 0 || slices < 2 || k % (8 * slices) != 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda_gemm_bf16_split: %d x %d x %d in %d slices", n, m, k, slices);
    return run_gemm(g, x, w, partials, 1, 0.0f, n, m, k, slices, stream);
}

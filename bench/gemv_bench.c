/* How fast one decode matrix-vector product runs on its own: the kernel the decode step launches (cuda_gemv),
 * back to back on random bf16 weights, timed by CUDA events. For the lm_head (the step's one large read) it says
 * how close the kernel comes to the HBM's rate without the step around it (docs/cuda.md).
 *   kite/build/bench/gemv_bench [rows cols epilogue]    default: 151936 1024 3 (the 0.6B lm_head, ARGMAX)
 * Prints the median of 9 timed passes of 20 launches each (after one warm-up pass), without and with PDL
 * between the launches, as microseconds per product and the weights' read rate; then a hash of y's bits and (ARGMAX)
 * the id, so that two builds of the kernel can be compared bit for bit (ADD epilogues accumulate into y launch after
 * launch: compare their hashes only between runs of the same launches). For ARGMAX with cols % 16 == 0 it then times
 * greedy decode's screened lm_head the same way (cuda_lm_head_screened_argmax: the int8 screen and the exact pass
 * over its candidates), with how many rows it read whole and whether its id is the GEMV's. */
#include "backend/cuda/kernels/cuda_ops.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cuda_bench_check.h"

enum { LAUNCHES = 20, PASSES = 9 };

/* One product as timed here: cuda_gemv, or with a screen greedy decode's screened lm_head over the same weight. */
typedef struct product {
    const void *weight;
    const float *x, *norm;
    float *y;
    int rows, cols, epilogue;
    void *workspace, *screen;
    int32_t *out;
} product;

static void launch(const product *p, cudaStream_t stream, int pdl) {
    if (p->screen)
        TRY(cuda_lm_head_screened_argmax(p->weight, p->screen, p->x, p->norm, 1e-6f, p->rows, p->cols, p->out, NULL, NULL,
                                         0, stream, pdl));
    else
        TRY(cuda_gemv(p->weight, p->x, p->norm, 1e-6f, p->y, p->rows, p->cols, p->epilogue, p->workspace, p->out, stream,
                      pdl));
}

/* Microseconds per product over PASSES passes of LAUNCHES launches (after one warm-up pass), sorted into us. */
static double time_product(const product *p, cudaStream_t stream, int pdl, double us[PASSES]) {
    cudaEvent_t begin, end;
    CHECK(cudaEventCreate(&begin));
    CHECK(cudaEventCreate(&end));
    for (int pass = -1; pass < PASSES; pass++) {
        CHECK(cudaEventRecord(begin, stream));
        for (int i = 0; i < LAUNCHES; i++) launch(p, stream, pdl);
        CHECK(cudaEventRecord(end, stream));
        CHECK(cudaEventSynchronize(end));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, begin, end));
        if (pass >= 0) us[pass] = ms * 1000.0 / LAUNCHES;
    }
    CHECK(cudaEventDestroy(begin));
    CHECK(cudaEventDestroy(end));
    return median(us, PASSES);
}

int main(int argc, char **argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 151936, cols = argc > 2 ? atoi(argv[2]) : 1024;
    const int epilogue = argc > 3 ? atoi(argv[3]) : CUDA_GEMV_ARGMAX;
    if (rows <= 0 || cols <= 0 || cols % 8 != 0 || epilogue < 0 || epilogue > 4) {
        fprintf(stderr, "usage: %s [rows cols epilogue]  (rows > 0, cols a positive multiple of 8, epilogue 0..4)\n", argv[0]);
        return 2;
    }
    const size_t n_weights = (size_t)rows * (size_t)cols;
    uint16_t *host = malloc(n_weights * sizeof(uint16_t));
    float *host_x = malloc((size_t)cols * sizeof(float));
    if (!host || !host_x) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    uint32_t state = 12345u;
    for (size_t i = 0; i < n_weights; i++) { /* uniform in [-0.5, 0.5), truncated to bf16 (its upper 16 bits) */
        state = state * 1664525u + 1013904223u;
        const float v = (float)(state >> 8) / 16777216.0f - 0.5f;
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        host[i] = (uint16_t)(bits >> 16);
    }
    for (int i = 0; i < cols; i++) host_x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    void *weight, *workspace;
    float *x, *norm, *y;
    int32_t *out;
    CHECK(cudaMalloc(&weight, n_weights * sizeof(uint16_t)));
    CHECK(cudaMalloc((void **)&x, (size_t)cols * sizeof(float)));
    CHECK(cudaMalloc((void **)&norm, (size_t)cols * sizeof(float)));
    CHECK(cudaMalloc((void **)&y, (size_t)rows * sizeof(float)));
    CHECK(cudaMalloc(&workspace, cuda_gemv_argmax_workspace(rows) + 256));
    CHECK(cudaMalloc((void **)&out, sizeof(int32_t)));
    CHECK(cudaMemcpy(weight, host, n_weights * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(x, host_x, (size_t)cols * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(norm, host_x, (size_t)cols * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(y, 0, (size_t)rows * sizeof(float)));
    free(host);
    free(host_x);
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    const int normed = epilogue == CUDA_GEMV_ARGMAX || epilogue == CUDA_GEMV_STORE || epilogue == CUDA_GEMV_SWIGLU;
    product gemv = {weight, x, normed ? norm : NULL, y, rows, cols, epilogue, workspace, NULL, out};
    for (int pdl = 0; pdl <= 1; pdl++) {
        double us[PASSES];
        const double mid = time_product(&gemv, stream, pdl, us);
        const double bytes = (double)n_weights * 2.0;
        printf("gemv %d x %d epilogue %d %s: %.2f us per product (passes %.2f .. %.2f), %.2f TB/s\n", rows, cols,
               epilogue, pdl ? "pdl   " : "no pdl", mid, us[0], us[PASSES - 1], bytes / (mid * 1e-6) / 1e12);
    }
    /* The products' bits and the argmax id, so that two builds or forms of the kernel can be compared. */
    float *result = malloc((size_t)rows * sizeof(float));
    int32_t id = -1;
    if (!result) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    CHECK(cudaMemcpy(result, y, (size_t)rows * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&id, out, sizeof id, cudaMemcpyDeviceToHost));
    uint64_t hash = 1469598103934665603ull;
    for (int i = 0; i < rows; i++) {
        uint32_t bits;
        memcpy(&bits, &result[i], sizeof bits);
        hash = (hash ^ bits) * 1099511628211ull;
    }
    printf("outputs: fnv1a %016llx%s\n", (unsigned long long)hash, epilogue == CUDA_GEMV_ARGMAX ? "" : " (no argmax)");
    if (epilogue == CUDA_GEMV_ARGMAX) printf("argmax: %d\n", id);
    free(result);
    if (epilogue == CUDA_GEMV_ARGMAX && cuda_lm_head_screen_fits(rows, cols)) {
        void *screen;
        CHECK(cudaMalloc(&screen, cuda_lm_head_screen_bytes(rows, cols)));
        TRY(cuda_lm_head_screen_build(weight, rows, cols, screen, stream));
        product screened_product = gemv;
        screened_product.screen = screen;
        for (int pdl = 0; pdl <= 1; pdl++) {
            double us[PASSES];
            const double mid = time_product(&screened_product, stream, pdl, us);
            const double bytes = (double)n_weights + (double)rows * 12.0; /* int8 rows, (scale, bound), the upper bounds */
            printf("screened argmax %d x %d %s: %.2f us per product (passes %.2f .. %.2f), %.2f TB/s over the screen\n",
                   rows, cols, pdl ? "pdl   " : "no pdl", mid, us[0], us[PASSES - 1], bytes / (mid * 1e-6) / 1e12);
        }
        unsigned candidates = 0;
        int32_t screened = -1;
        TRY(cuda_lm_head_screen_candidates(screen, rows, cols, &candidates));
        CHECK(cudaMemcpy(&screened, out, sizeof screened, cudaMemcpyDeviceToHost));
        printf("screened argmax: %d (%s the GEMV's), %u candidate rows read whole\n", screened,
               screened == id ? "equal to" : "DIFFERENT FROM", candidates);
        CHECK(cudaFree(screen));
        if (screened != id) return 1;
    }
    return 0;
}

/* How fast the fp8 (W8A16) linear products run on their own, against the bf16 ones on the same values: for each
 * linear product of a model shape (qkv with its RMSNorm, o_proj adding to the residual, gate_up with its norm and
 * SwiGLU, down adding to the residual) the decode GEMV (cuda_gemv_fp8 vs cuda_gemv) and the batched kernel at 1..32
 * rows (cuda_gemm_rows_fp8 vs cuda_gemm_rows), against the route the batched path takes past the W8A16 kernels: the
 * dequantization into bf16 (cuda_fp8_dequantize_weight) plus cuBLASLt on it (cuda_gemm_bf16, bf16 input, fp32
 * output; the sum of the two timings). Random E4M3 codes and block scales; the bf16 weights are their
 * dequantization (bf16(code x scale)).
 *   kite/build/bench/fp8_gemv_bench [0.6b|8b|all]    default: all (qwen3-0.6b-base and qwen3-8b-base shapes)
 * Every product is first checked against a host double reference on 64 sampled outputs of every batch row (the
 * weights' exact values; the batched kernels' inputs rounded to bf16 as they stage them); a failed check prints FAIL
 * and ends the run with status 1 before any timing. Then the median of 5 passes of 50 launches (programmatic
 * dependent launch between them), each launch on the next of several copies of the weights that together exceed
 * the L2 cache, so that every launch reads its weights from HBM as a decode step does: microseconds per product,
 * the weights' read rate and its fraction of the H200's 4.8 TB/s. */
#include "backend/cuda/kernels/cuda_ops.h"
#include "model/dummy.h"
#include "quant/fp8.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cuda_bench_check.h"

enum { LAUNCHES = 50, PASSES = 5, SAMPLES = 64, MAX_ROWS = 32, N_BATCHES = 6 };
/* 1 too: the batched kernel over one row is a tensor-core GEMV on a bf16-rounded input, beside cuda_gemv_fp8. */
static const int BATCHES[N_BATCHES] = {1, 2, 4, 8, 16, 32};
static const double HBM_BYTES_PER_S = 4.8e12;
/* The weight copies of one product together hold at least this many bytes (the H200's L2 holds 50 MB). */
static const double ROTATION_BYTES = 256e6;

static uint32_t rng_state = 12345u;
static uint32_t rng_next(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}
static float rng_signed(void) { return (float)rng_next() / 16777216.0f * 2.0f - 1.0f; } /* [-1, 1) */

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static void *device_copy(const void *host, size_t bytes) {
    void *p;
    CHECK(cudaMalloc(&p, bytes));
    if (host) CHECK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    else CHECK(cudaMemset(p, 0, bytes));
    return p;
}

static float bf16_round(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest even (finite inputs) */
    bits &= 0xffff0000u;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* One linear product of the shape, as the decode paths run it. */
typedef struct product_spec {
    const char *name;
    int rows, cols, epilogue;
    int normed;  /* the input RMSNorm fused (qkv, gate_up) */
    int x_bf16;  /* the batched input is bf16 (o_proj, down) */
    int y_bf16;  /* the batched output is bf16 (gate_up) */
} product_spec;

/* The matrix and its copies on the device, the inputs and the outputs. */
typedef struct product_data {
    product_spec spec;
    int scale_ld, copies;
    size_t n_weights, n_scales;
    uint8_t *codes;  /* host */
    float *scales;   /* host */
    float *x, *norm; /* host: MAX_ROWS x cols inputs, cols norm weights */
    void **d_codes, **d_w16;
    float **d_scales;
    float *d_x, *d_norm;
    void *d_x16, *d_y;
} product_data;

static void product_setup(product_data *p, const product_spec *spec) {
    memset(p, 0, sizeof *p);
    p->spec = *spec;
    const int rows = spec->rows, cols = spec->cols;
    p->scale_ld = (cols + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE;
    p->n_weights = (size_t)rows * (size_t)cols;
    p->n_scales = (size_t)((rows + FP8_BLOCK_SIZE - 1) / FP8_BLOCK_SIZE) * (size_t)p->scale_ld;
    p->codes = xmalloc(p->n_weights);
    p->scales = xmalloc(p->n_scales * sizeof(float));
    for (size_t i = 0; i < p->n_weights; i++) {
        uint8_t code = (uint8_t)rng_next();
        if ((code & 0x7f) == 0x7f) code = 0x7e; /* no NaN */
        p->codes[i] = code;
    }
    for (size_t i = 0; i < p->n_scales; i++) p->scales[i] = (0.5f + 0.5f * (rng_signed() + 1.0f)) * 1e-3f;
    p->x = xmalloc((size_t)MAX_ROWS * cols * sizeof(float));
    p->norm = xmalloc((size_t)cols * sizeof(float));
    for (size_t i = 0; i < (size_t)MAX_ROWS * cols; i++) p->x[i] = rng_signed();
    for (int i = 0; i < cols; i++) p->norm[i] = 1.0f + 0.1f * rng_signed();
    const double bytes = (double)p->n_weights * 3.0; /* a copy's codes and its bf16 dequantization */
    p->copies = (int)ceil(ROTATION_BYTES / bytes);
    if (p->copies < 2) p->copies = 2;
    p->d_codes = xmalloc((size_t)p->copies * sizeof(void *));
    p->d_w16 = xmalloc((size_t)p->copies * sizeof(void *));
    p->d_scales = xmalloc((size_t)p->copies * sizeof(float *));
    for (int i = 0; i < p->copies; i++) {
        p->d_codes[i] = device_copy(p->codes, p->n_weights);
        p->d_scales[i] = device_copy(p->scales, p->n_scales * sizeof(float));
        p->d_w16[i] = device_copy(NULL, p->n_weights * 2);
        TRY(cuda_fp8_dequantize_weight(p->d_codes[i], p->d_scales[i], p->scale_ld, rows, cols, p->d_w16[i], NULL));
    }
    uint16_t *x16 = xmalloc((size_t)MAX_ROWS * cols * sizeof(uint16_t));
    for (size_t i = 0; i < (size_t)MAX_ROWS * cols; i++) {
        const float v = bf16_round(p->x[i]);
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        x16[i] = (uint16_t)(bits >> 16);
    }
    p->d_x = device_copy(p->x, (size_t)MAX_ROWS * cols * sizeof(float));
    p->d_x16 = device_copy(x16, (size_t)MAX_ROWS * cols * sizeof(uint16_t));
    p->d_norm = device_copy(p->norm, (size_t)cols * sizeof(float));
    p->d_y = device_copy(NULL, (size_t)MAX_ROWS * rows * sizeof(float));
    free(x16);
    CHECK(cudaDeviceSynchronize());
}

static void product_free(product_data *p) {
    for (int i = 0; i < p->copies; i++) {
        CHECK(cudaFree(p->d_codes[i]));
        CHECK(cudaFree(p->d_scales[i]));
        CHECK(cudaFree(p->d_w16[i]));
    }
    CHECK(cudaFree(p->d_x));
    CHECK(cudaFree(p->d_x16));
    CHECK(cudaFree(p->d_norm));
    CHECK(cudaFree(p->d_y));
    free(p->d_codes), free(p->d_w16), free(p->d_scales);
    free(p->codes), free(p->scales), free(p->x), free(p->norm);
}

/* What is timed: the fp8 or bf16 GEMV (batch 0), the fp8 or bf16 batched kernel over `batch` rows, the bf16
 * cuBLASLt product over `batch` rows (bf16 input, fp32 output: what the dequantizing route runs on its scratch), or
 * the dequantization. */
enum kernel_kind { KERNEL_GEMV, KERNEL_ROWS, KERNEL_CUBLASLT, KERNEL_DEQUANTIZE };

static cuda_gemm *bench_gemm; /* cuBLASLt's handle and plan cache, one for the run */

static void launch(const product_data *p, int kind, int fp8, int batch, int copy, cudaStream_t stream) {
    const product_spec *s = &p->spec;
    const float *norm = s->normed ? p->d_norm : NULL;
    if (kind == KERNEL_CUBLASLT) {
        TRY(cuda_gemm_bf16(bench_gemm, p->d_x16, p->d_w16[copy], p->d_y, 1, 0.0f, batch, s->rows, s->cols, stream));
    } else if (kind == KERNEL_DEQUANTIZE) {
        TRY(cuda_fp8_dequantize_weight(p->d_codes[copy], p->d_scales[copy], p->scale_ld, s->rows, s->cols, p->d_w16[copy],
                                       stream));
    } else if (kind == KERNEL_GEMV) {
        if (fp8)
            TRY(cuda_gemv_fp8(p->d_codes[copy], p->d_scales[copy], p->scale_ld, p->d_x, norm, 1e-6f, p->d_y, s->rows,
                              s->cols, s->epilogue, stream, 1));
        else
            TRY(cuda_gemv(p->d_w16[copy], p->d_x, norm, 1e-6f, p->d_y, s->rows, s->cols, s->epilogue, NULL, NULL, stream,
                          1));
    } else {
        const void *x = s->x_bf16 ? p->d_x16 : (const void *)p->d_x;
        if (fp8)
            TRY(cuda_gemm_rows_fp8(p->d_codes[copy], p->d_scales[copy], p->scale_ld, x, s->x_bf16, norm, 1e-6f, p->d_y,
                                   s->y_bf16, batch, s->rows, s->cols, s->epilogue, stream, 1));
        else
            TRY(cuda_gemm_rows(p->d_w16[copy], x, s->x_bf16, norm, 1e-6f, p->d_y, s->y_bf16, batch, s->rows, s->cols,
                               s->epilogue, NULL, NULL, stream, 1));
    }
}

/* The host reference of output `o` of batch row b: the GEMV's input is fp32, the batched kernels' is rounded to bf16
 * after the norm (as they stage it). */
static double reference_dot(const product_data *p, int row, int b, int rounded) {
    const product_spec *s = &p->spec;
    const float *x = p->x + (size_t)b * s->cols;
    double scale = 1.0;
    if (s->normed) {
        double ss = 0.0;
        for (int c = 0; c < s->cols; c++) ss += (double)x[c] * x[c];
        scale = 1.0 / sqrt(ss / s->cols + 1e-6);
    }
    double acc = 0.0;
    for (int c = 0; c < s->cols; c++) {
        double in = x[c];
        if (rounded) in = bf16_round(s->normed ? (float)(x[c] * (float)scale * p->norm[c]) : x[c]);
        else if (s->normed) in = x[c] * (double)p->norm[c] * scale;
        const double w = (double)fp8_e4m3_to_float(p->codes[(size_t)row * s->cols + c]) *
                         (double)p->scales[(row / FP8_BLOCK_SIZE) * p->scale_ld + c / FP8_BLOCK_SIZE];
        acc += w * in;
    }
    return acc;
}

/* One fp8 launch (batch 0: the GEMV) on zeroed outputs against the reference; 1 when it agrees. */
static int product_check(const product_data *p, int batch) {
    const product_spec *s = &p->spec;
    const int n_rows = batch > 0 ? batch : 1, swiglu = s->epilogue == CUDA_GEMV_SWIGLU;
    const int outputs = swiglu ? s->rows / 2 : s->rows;
    const int y_bf16 = batch > 0 && s->y_bf16;
    CHECK(cudaMemset(p->d_y, 0, (size_t)MAX_ROWS * s->rows * sizeof(float)));
    launch(p, batch > 0 ? KERNEL_ROWS : KERNEL_GEMV, 1, batch, 0, NULL);
    CHECK(cudaDeviceSynchronize());
    const size_t n_out = (size_t)n_rows * outputs;
    float *y = xmalloc(n_out * sizeof(float));
    if (y_bf16) {
        uint16_t *bits = xmalloc(n_out * sizeof(uint16_t));
        CHECK(cudaMemcpy(bits, p->d_y, n_out * sizeof(uint16_t), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n_out; i++) {
            const uint32_t wide = (uint32_t)bits[i] << 16;
            memcpy(&y[i], &wide, sizeof wide);
        }
        free(bits);
    } else {
        CHECK(cudaMemcpy(y, p->d_y, n_out * sizeof(float), cudaMemcpyDeviceToHost));
    }
    double err = 0.0, norm = 0.0;
    const int step = outputs / SAMPLES; /* every shape here has at least 1,024 outputs */
    for (int b = 0; b < n_rows; b++)
        for (int i = 0; i < SAMPLES; i++) {
            const int o = i * step + (i * 7) % step; /* spread over the rows' 128-row blocks and 16-row tiles */
            double ref = reference_dot(p, o, b, batch > 0);
            if (swiglu) {
                const double up = reference_dot(p, o + outputs, b, batch > 0);
                ref = ref / (1.0 + exp(-ref)) * up;
            }
            const double got = y[(size_t)b * outputs + o];
            if (!isfinite(got)) err = INFINITY;
            err += (got - ref) * (got - ref);
            norm += ref * ref;
        }
    free(y);
    const double e = norm > 0.0 ? err / norm : err;
    /* fp32 accumulation (GEMV); bf16 input rounding near-ties and, for a bf16 output, its rounding (batched). */
    const double bound = batch == 0 ? 1e-9 : y_bf16 ? 2e-5 : 1e-7;
    if (!(e <= bound)) {
        printf("FAIL %s %d x %d %s at %d rows: nmse vs the double reference %.3e > %.0e\n", s->name, s->rows, s->cols,
               batch > 0 ? "gemm_rows_fp8" : "gemv_fp8", n_rows, e, bound);
        return 0;
    }
    return 1;
}

/* Microseconds per launch: the median of PASSES passes of LAUNCHES launches, each on the next weight copy. */
static double time_kernel(const product_data *p, int kind, int fp8, int batch, cudaStream_t stream) {
    cudaEvent_t begin, end;
    CHECK(cudaEventCreate(&begin));
    CHECK(cudaEventCreate(&end));
    double us[PASSES];
    int copy = 0;
    for (int pass = -1; pass < PASSES; pass++) {
        CHECK(cudaEventRecord(begin, stream));
        for (int i = 0; i < LAUNCHES; i++) {
            launch(p, kind, fp8, batch, copy, stream);
            copy = (copy + 1) % p->copies;
        }
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

/* One timing: microseconds, the weights' read rate (bytes > 0) and, against another timing (vs_us > 0), its speed-up. */
static void print_rate(const char *what, const product_data *p, int batch, double us, double bytes, const char *vs,
                       double vs_us) {
    char rows[16] = "";
    if (batch > 0) snprintf(rows, sizeof rows, " B=%d", batch);
    printf("  %-26s %-8s%-6s %8.2f us", what, p->spec.name, rows, us);
    if (bytes > 0.0) {
        const double rate = bytes / (us * 1e-6);
        printf("  %5.2f TB/s  %.2f of 4.8 TB/s", rate / 1e12, rate / HBM_BYTES_PER_S);
    }
    if (vs_us > 0.0) printf("  (%s %.2f us: x%.2f)", vs, vs_us, vs_us / us);
    printf("\n");
}

static int run_shape(const char *shape_name) {
    qwen3_config c;
    TRY(known_shape_config(shape_name, &c));
    const int hidden = c.hidden_size, inter = c.intermediate_size;
    const product_spec specs[4] = {
        {"qkv", qwen3_qkv_dim(&c), hidden, CUDA_GEMV_STORE, 1, 0, 0},
        {"o_proj", hidden, qwen3_q_dim(&c), CUDA_GEMV_ADD, 0, 1, 0},
        {"gate_up", 2 * inter, hidden, CUDA_GEMV_SWIGLU, 1, 0, 1},
        {"down", hidden, inter, CUDA_GEMV_ADD, 0, 1, 0},
    };
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    printf("%s (hidden %d, intermediate %d):\n", shape_name, hidden, inter);
    int ok = 1;
    for (int i = 0; i < 4 && ok; i++) {
        product_data p;
        product_setup(&p, &specs[i]);
        ok = product_check(&p, 0);
        for (int b = 0; b < N_BATCHES && ok; b++)
            if (cuda_gemm_rows_fits(BATCHES[b], p.spec.cols)) ok = product_check(&p, BATCHES[b]);
        if (ok) {
            const double fp8_bytes = (double)p.n_weights + (double)p.n_scales * 4.0, bf16_bytes = (double)p.n_weights * 2.0;
            printf(" %s %d x %d: checked against the double reference (gemv, and gemm_rows at each row count below)\n",
                   p.spec.name, p.spec.rows, p.spec.cols);
            const double gemv16 = time_kernel(&p, KERNEL_GEMV, 0, 0, stream);
            const double gemv8 = time_kernel(&p, KERNEL_GEMV, 1, 0, stream);
            print_rate("gemv bf16", &p, 0, gemv16, bf16_bytes, "", 0.0);
            print_rate("gemv fp8", &p, 0, gemv8, fp8_bytes, "bf16", gemv16);
            const double dq = time_kernel(&p, KERNEL_DEQUANTIZE, 1, 0, stream);
            print_rate("dequantize to bf16", &p, 0, dq, (double)p.n_weights * 3.0 + (double)p.n_scales * 4.0, "", 0.0);
            for (int b = 0; b < N_BATCHES; b++) {
                /* The dequantizing route: the dequantization, then cuBLASLt on the bf16 scratch. */
                const double lt = time_kernel(&p, KERNEL_CUBLASLT, 0, BATCHES[b], stream);
                print_rate("cublaslt bf16", &p, BATCHES[b], lt, bf16_bytes, "", 0.0);
                print_rate("fp8 dequantize + cublaslt", &p, BATCHES[b], dq + lt, 0.0, "", 0.0);
                if (!cuda_gemm_rows_fits(BATCHES[b], p.spec.cols)) {
                    printf("  %-26s %-8s B=%-3d does not fit shared memory (the batched path takes the dequantizing "
                           "route)\n", "gemm_rows", p.spec.name, BATCHES[b]);
                    continue;
                }
                const double rows16 = time_kernel(&p, KERNEL_ROWS, 0, BATCHES[b], stream);
                const double rows8 = time_kernel(&p, KERNEL_ROWS, 1, BATCHES[b], stream);
                print_rate("gemm_rows bf16", &p, BATCHES[b], rows16, bf16_bytes, "cublaslt", lt);
                print_rate("gemm_rows fp8 (W8A16)", &p, BATCHES[b], rows8, fp8_bytes, "dequantize + cublaslt", dq + lt);
                print_rate("  the same", &p, BATCHES[b], rows8, 0.0, "gemm_rows bf16", rows16);
            }
        }
        product_free(&p);
    }
    CHECK(cudaStreamDestroy(stream));
    return ok;
}

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "all";
    const int small = strcmp(which, "0.6b") == 0 || strcmp(which, "all") == 0;
    const int large = strcmp(which, "8b") == 0 || strcmp(which, "all") == 0;
    if (argc > 2 || (!small && !large)) {
        fprintf(stderr, "usage: %s [0.6b|8b|all]\n", argv[0]);
        return 2;
    }
    TRY(cuda_gemm_create(&bench_gemm));
    int ok = 1;
    if (small) ok = run_shape("qwen3-0.6b-base");
    if (ok && large) ok = run_shape("qwen3-8b-base");
    cuda_gemm_destroy(bench_gemm);
    if (!ok) return 1;
    printf("all products checked before timing\n");
    return 0;
}

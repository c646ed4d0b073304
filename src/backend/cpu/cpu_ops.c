/* float32 kernels of the CPU reference backend (see cpu_ops.h for the summation-order contract). */
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

/* Eight float lanes. GCC/Clang lower this to two SSE registers on baseline x86-64 and to one AVX register
 * in the avx2 clones; lane-wise the operations are the same IEEE multiply-then-add either way. Vectors are
 * kept to locals of always-inline functions so no vector crosses a call boundary (that ABI differs). */
typedef float v8f __attribute__((vector_size(32)));

#define CPU_LANES 8
#define CPU_ALWAYS_INLINE static inline __attribute__((always_inline))

CPU_ALWAYS_INLINE float reduce_lanes(const float *lanes) {
    return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

CPU_ALWAYS_INLINE float dot_body(const float *a, const float *b, int32_t n) {
    v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t n_vector = n - n % CPU_LANES;
    for (int32_t k = 0; k < n_vector; k += CPU_LANES) {
        v8f va, vb;
        memcpy(&va, a + k, sizeof va);
        memcpy(&vb, b + k, sizeof vb);
        acc += va * vb;
    }
    float lanes[CPU_LANES];
    memcpy(lanes, &acc, sizeof lanes);
    float sum = reduce_lanes(lanes);
    for (int32_t k = n_vector; k < n; k++) sum += a[k] * b[k];
    return sum;
}

/* Four weight rows against every token: each x element is loaded once for four rows. Each of the four
 * sums follows dot_body's order exactly. */
CPU_ALWAYS_INLINE void rows4_body(float *out, const float *x, const float *w, int32_t n_tokens, int32_t n_rows,
                                  int32_t n_cols) {
    const float *w0 = w;
    const float *w1 = w + (size_t)n_cols;
    const float *w2 = w + 2 * (size_t)n_cols;
    const float *w3 = w + 3 * (size_t)n_cols;
    int32_t n_vector = n_cols - n_cols % CPU_LANES;
    for (int32_t t = 0; t < n_tokens; t++) {
        const float *xt = x + (size_t)t * (size_t)n_cols;
        v8f acc0 = {0, 0, 0, 0, 0, 0, 0, 0};
        v8f acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int32_t k = 0; k < n_vector; k += CPU_LANES) {
            v8f vx, v0, v1, v2, v3;
            memcpy(&vx, xt + k, sizeof vx);
            memcpy(&v0, w0 + k, sizeof v0);
            memcpy(&v1, w1 + k, sizeof v1);
            memcpy(&v2, w2 + k, sizeof v2);
            memcpy(&v3, w3 + k, sizeof v3);
            acc0 += v0 * vx;
            acc1 += v1 * vx;
            acc2 += v2 * vx;
            acc3 += v3 * vx;
        }
        float lanes[4][CPU_LANES];
        memcpy(lanes[0], &acc0, sizeof lanes[0]);
        memcpy(lanes[1], &acc1, sizeof lanes[1]);
        memcpy(lanes[2], &acc2, sizeof lanes[2]);
        memcpy(lanes[3], &acc3, sizeof lanes[3]);
        float sums[4] = {reduce_lanes(lanes[0]), reduce_lanes(lanes[1]), reduce_lanes(lanes[2]),
                         reduce_lanes(lanes[3])};
        for (int32_t k = n_vector; k < n_cols; k++) {
            sums[0] += w0[k] * xt[k];
            sums[1] += w1[k] * xt[k];
            sums[2] += w2[k] * xt[k];
            sums[3] += w3[k] * xt[k];
        }
        float *ot = out + (size_t)t * (size_t)n_rows;
        ot[0] = sums[0];
        ot[1] = sums[1];
        ot[2] = sums[2];
        ot[3] = sums[3];
    }
}

/* The operand order above (w * x) and in dot_body (a * b) give the same products: IEEE multiplication is
 * commutative, so cpu_matmul's leftover rows may use dot_body with (w, x). */
static float dot_generic(const float *a, const float *b, int32_t n) { return dot_body(a, b, n); }
static void rows4_generic(float *out, const float *x, const float *w, int32_t n_tokens, int32_t n_rows,
                          int32_t n_cols) {
    rows4_body(out, x, w, n_tokens, n_rows, n_cols);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_HAVE_AVX2_CLONES 1
__attribute__((target("avx2"))) static float dot_avx2(const float *a, const float *b, int32_t n) {
    return dot_body(a, b, n);
}
__attribute__((target("avx2"))) static void rows4_avx2(float *out, const float *x, const float *w,
                                                       int32_t n_tokens, int32_t n_rows, int32_t n_cols) {
    rows4_body(out, x, w, n_tokens, n_rows, n_cols);
}
#endif

typedef float (*dot_fn)(const float *, const float *, int32_t);
typedef void (*rows4_fn)(float *, const float *, const float *, int32_t, int32_t, int32_t);

/* Set by tests to compare the two paths; read-only while a forward runs. */
static int portable_only;

void cpu_ops_force_portable(int on) { portable_only = on != 0; }

static int use_avx2(void) {
    if (portable_only) return 0;
#ifdef CPU_HAVE_AVX2_CLONES
    /* __builtin_cpu_supports initialises itself on first use; the answer never changes. */
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static dot_fn select_dot(void) {
#ifdef CPU_HAVE_AVX2_CLONES
    if (use_avx2()) return dot_avx2;
#endif
    return dot_generic;
}

static rows4_fn select_rows4(void) {
#ifdef CPU_HAVE_AVX2_CLONES
    if (use_avx2()) return rows4_avx2;
#endif
    return rows4_generic;
}

float cpu_dot(const float *a, const float *b, int32_t n) { return select_dot()(a, b, n); }

void cpu_matmul(float *out, const float *x, const float *weight, int32_t n_tokens, int32_t n_rows,
                int32_t n_cols, int n_threads) {
    dot_fn dot = select_dot();
    rows4_fn rows4 = select_rows4();
    int32_t n_row_blocks = (n_rows + 3) / 4;
    /* Small problems are not worth waking the thread team. */
    int parallel = (int64_t)n_tokens * n_rows * n_cols >= 32768;
#pragma omp parallel for schedule(static) num_threads(n_threads) if (parallel)
    for (int32_t block = 0; block < n_row_blocks; block++) {
        int32_t row = block * 4;
        const float *w = weight + (size_t)row * (size_t)n_cols;
        if (n_rows - row >= 4) {
            rows4(out + row, x, w, n_tokens, n_rows, n_cols);
        } else {
            for (int32_t r = row; r < n_rows; r++) {
                const float *wr = weight + (size_t)r * (size_t)n_cols;
                for (int32_t t = 0; t < n_tokens; t++)
                    out[(size_t)t * (size_t)n_rows + (size_t)r] = dot(wr, x + (size_t)t * (size_t)n_cols, n_cols);
            }
        }
    }
}

void cpu_rmsnorm(float *out, const float *x, const float *weight, int32_t n, float eps) {
    double sum_squares = 0.0;
    for (int32_t i = 0; i < n; i++) sum_squares += (double)x[i] * (double)x[i];
    /* transformers: variance (float32) + eps (float32), rsqrt, then (x * rsqrt) * weight. */
    float variance = (float)(sum_squares / (double)n);
    float inverse_rms = 1.0f / sqrtf(variance + eps);
    for (int32_t i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inverse_rms);
}

void cpu_rope_angles(float *cos_out, float *sin_out, int32_t position, int32_t head_dim, double theta) {
    int32_t half = head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        double inv_freq = pow(theta, -2.0 * (double)i / (double)head_dim);
        double angle = (double)position * inv_freq;
        cos_out[i] = (float)cos(angle);
        sin_out[i] = (float)sin(angle);
    }
}

void cpu_rope_apply(float *x, const float *cos_table, const float *sin_table, int32_t head_dim) {
    int32_t half = head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        float x1 = x[i];
        float x2 = x[i + half];
        /* emb = cat(freqs, freqs): both halves use angle i. */
        x[i] = x1 * cos_table[i] + (-x2) * sin_table[i];
        x[i + half] = x2 * cos_table[i] + x1 * sin_table[i];
    }
}

void cpu_swiglu(float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        float silu = g / (1.0f + expf(-g));
        gate[i] = silu * up[i];
    }
}

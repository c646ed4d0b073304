/* Helpers shared by the CUDA tests: random data, device buffers with poisoned contents and guard bytes,
 * and error measures. Plain C over the entry points of src/backend/cuda/kernels/cuda_ops.h. */
#ifndef KITE_TESTS_CUDA_TEST_UTIL_H
#define KITE_TESTS_CUDA_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/kernels/cuda_ops.h"
#include "model/qwen3.h"
#include "test_util.h"

#define GUARD_BYTES 256
#define KITE_TEST_CEIL(a, b) (((a) + (b)-1) / (b))
#define POISON 0xFF /* every byte: NaN in both bf16 and fp32 */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static inline uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static inline float rng_uniform(void) { return (float)((rng_next() >> 11) * 0x1.0p-53); }

static inline float rng_normal(void) {
    const double u1 = ((double)(rng_next() >> 11) + 1.0) * 0x1.0p-53, u2 = (double)(rng_next() >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Random bf16 values (host bits) with their exact float values. */
static inline void random_bf16(uint16_t *bits, float *values, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) {
        bits[i] = float_to_bf16(rng_normal() * scale);
        if (values) values[i] = bf16_to_float(bits[i]);
    }
}

static inline void random_f32(float *values, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) values[i] = rng_normal() * scale;
}

#define DEVICE_CHECK(expr)                                                                               \
    do {                                                                                                 \
        kite_status device_check_status_ = (expr);                                                       \
        if (device_check_status_ != KITE_OK) {                                                           \
            fprintf(stderr, "  %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, kite_last_error());           \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

/* A device buffer of `bytes` followed by GUARD_BYTES, all poisoned; optionally filled from host. */
static inline void *device_buffer(size_t bytes, const void *host) {
    void *p = NULL;
    DEVICE_CHECK(kite_cuda_malloc(&p, bytes + GUARD_BYTES));
    DEVICE_CHECK(kite_cuda_memset(p, POISON, bytes + GUARD_BYTES));
    if (host) DEVICE_CHECK(kite_cuda_copy_to_device(p, host, bytes));
    return p;
}

/* True when the guard after `bytes` is still poisoned. */
static inline int guard_intact(const void *device, size_t bytes) {
    unsigned char guard[GUARD_BYTES];
    DEVICE_CHECK(kite_cuda_copy_to_host(guard, (const unsigned char *)device + bytes, GUARD_BYTES));
    for (int i = 0; i < GUARD_BYTES; i++)
        if (guard[i] != POISON) return 0;
    return 1;
}

/* Normalised mean squared error sum((out - ref)^2) / sum(ref^2); INFINITY if out has a NaN or Inf. */
static inline double nmse(const float *out, const double *ref, size_t n) {
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) return INFINITY;
        const double d = (double)out[i] - ref[i];
        err += d * d;
        norm += ref[i] * ref[i];
    }
    return norm > 0.0 ? err / norm : err;
}

static inline void bf16_to_floats(const uint16_t *bits, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(bits[i]);
}

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static inline void require_gpu(void) {
    if (kite_cuda_device_count() <= 0) test_skip("no CUDA GPU on this machine");
}

#endif

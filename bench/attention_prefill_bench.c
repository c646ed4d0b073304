/* The prefill attention alone (cuda_attention_prefill): one sequence of L new tokens attending causally to
 * itself through the paged cache, the 0.6B shape by default (16 heads over 8 kv heads, head_dim 128).
 *   attention_prefill_bench [--heads H] [--kv-heads K] [--block-size B] [--reps N] L [L ...]
 * Blocks of a multiple of 128 positions take the wgmma kernel, others the mma.sync one. Before any number, 32
 * query rows (the last row among them) are checked against a double-precision reference; a failed check prints
 * no number and exits 1. Prints one JSON line per L: median milliseconds of N timed runs (after two warm-up
 * runs) and TFLOP/s counting 4 x head_dim x heads x L (L + 1) / 2 (QK^T and PV of the visible keys). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/kernels/cuda_ops.h"

enum { HEAD_DIM = 128, CHECK_ROWS = 32 };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rng_uniform(void) { /* [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "attention_prefill_bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}
static void check(kite_status s, const char *what) {
    if (s != KITE_OK) {
        fprintf(stderr, "attention_prefill_bench: %s: %s\n", what, kite_last_error());
        exit(1);
    }
}
static void *upload(const void *host, size_t bytes) {
    void *d = NULL;
    check(kite_cuda_malloc(&d, bytes), "cudaMalloc");
    if (host) check(kite_cuda_copy_to_device(d, host, bytes), "copy to device");
    return d;
}
static int compare_floats(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct {
    int heads, kv_heads, block_size, L;
    uint16_t *q, *cache, *out;
    int32_t *table;
} problem;

static size_t cache_index(const problem *p, int kind, int kv_head, int pos) {
    const int block = p->table[pos / p->block_size], slot = pos % p->block_size;
    return ((((size_t)block * 2 + (size_t)kind) * (size_t)p->kv_heads + (size_t)kv_head) * (size_t)p->block_size +
            (size_t)slot) *
           HEAD_DIM;
}

/* Normalised squared error of the checked rows against a double-precision softmax(QK^T / sqrt(d)) V. */
static double check_rows(const problem *p) {
    double err = 0.0, ref_norm = 0.0;
    double *w = xmalloc((size_t)p->L * sizeof(double));
    for (int i = 0; i < CHECK_ROWS; i++) {
        const int row = i == 0 ? p->L - 1 : (int)(((uint64_t)i * 2654435761u) % (uint64_t)p->L);
        for (int h = 0; h < p->heads; h++) {
            const int kvh = h / (p->heads / p->kv_heads);
            const uint16_t *qr = p->q + ((size_t)row * p->heads + h) * HEAD_DIM;
            double mx = -INFINITY, sum = 0.0;
            for (int k = 0; k <= row; k++) {
                const uint16_t *kr = p->cache + cache_index(p, 0, kvh, k);
                double s = 0.0;
                for (int d = 0; d < HEAD_DIM; d++) s += (double)from_bf16(qr[d]) * from_bf16(kr[d]);
                w[k] = s / sqrt((double)HEAD_DIM);
                if (w[k] > mx) mx = w[k];
            }
            for (int k = 0; k <= row; k++) sum += (w[k] = exp(w[k] - mx));
            for (int d = 0; d < HEAD_DIM; d++) {
                double acc = 0.0;
                for (int k = 0; k <= row; k++) acc += w[k] * from_bf16(p->cache[cache_index(p, 1, kvh, k) + d]);
                const double ref = acc / sum, got = from_bf16(p->out[((size_t)row * p->heads + h) * HEAD_DIM + d]);
                err += (got - ref) * (got - ref);
                ref_norm += ref * ref;
            }
        }
    }
    free(w);
    return err / (ref_norm > 0.0 ? ref_norm : 1.0);
}

static int run(int heads, int kv_heads, int block_size, int reps, int L) {
    problem p = {heads, kv_heads, block_size, L, NULL, NULL, NULL, NULL};
    const int n_blocks = (L + block_size - 1) / block_size;
    const size_t q_elems = (size_t)L * heads * HEAD_DIM;
    const size_t cache_elems = (size_t)n_blocks * 2 * kv_heads * block_size * HEAD_DIM;
    p.q = xmalloc(q_elems * 2);
    p.out = xmalloc(q_elems * 2);
    p.cache = xmalloc(cache_elems * 2);
    p.table = xmalloc((size_t)n_blocks * sizeof(int32_t));
    for (size_t i = 0; i < q_elems; i++) p.q[i] = to_bf16(rng_uniform());
    for (size_t i = 0; i < cache_elems; i++) p.cache[i] = to_bf16(rng_uniform());
    for (int i = 0; i < n_blocks; i++) p.table[i] = n_blocks - 1 - i; /* scattered: blocks in reverse order */

    int32_t meta[5] = {0, L, L, 0, 0}; /* token_start[2], context_len[1], block_table_start[1] */
    void *d_q = upload(p.q, q_elems * 2), *d_out = upload(NULL, q_elems * 2);
    void *d_cache = upload(p.cache, cache_elems * 2), *d_table = upload(p.table, (size_t)n_blocks * 4);
    int32_t *d_meta = upload(meta, sizeof meta);
    const cuda_kv_layer kv = {d_cache, block_size, kv_heads, HEAD_DIM, n_blocks, KITE_KV_CACHE_BF16};
    const cuda_seq_meta seqs = {d_meta, d_meta + 2, d_meta + 3, d_table, 1, L};
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);

    check(cuda_attention_prefill(d_q, d_out, kv, seqs, heads, scale, NULL), "attention");
    check(kite_cuda_copy_to_host(p.out, d_out, q_elems * 2), "copy to host");
    const double nmse = check_rows(&p);
    int status = 0;
    if (!(nmse < 1e-4)) {
        fprintf(stderr, "attention_prefill_bench: L %d: the check failed (nmse %.3g against 1e-4): no number\n", L,
                nmse);
        status = 1;
    } else {
        float *ms = xmalloc((size_t)reps * sizeof(float));
        for (int r = -2; r < reps; r++) {
            void *timer = NULL;
            check(kite_cuda_timer_start(&timer), "timer");
            check(cuda_attention_prefill(d_q, d_out, kv, seqs, heads, scale, NULL), "attention");
            float t = 0.0f;
            check(kite_cuda_timer_stop(timer, &t), "timer");
            if (r >= 0) ms[r] = t;
        }
        qsort(ms, (size_t)reps, sizeof(float), compare_floats);
        const double median = ms[reps / 2];
        const double flops = 4.0 * HEAD_DIM * heads * (double)L * (double)(L + 1) / 2.0;
        printf("{\"bench\":\"attention_prefill\",\"L\":%d,\"heads\":%d,\"kv_heads\":%d,\"block_size\":%d,"
               "\"median_ms\":%.4f,\"tflops\":%.1f,\"check_nmse\":%.3g,\"reps\":%d}\n",
               L, heads, kv_heads, block_size, median, flops / (median * 1e-3) / 1e12, nmse, reps);
        free(ms);
    }
    void *bufs[] = {d_q, d_out, d_cache, d_table, d_meta};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) check(kite_cuda_free(bufs[i]), "cudaFree");
    free(p.q);
    free(p.out);
    free(p.cache);
    free(p.table);
    return status;
}

int main(int argc, char **argv) {
    int heads = 16, kv_heads = 8, block_size = 128, reps = 10, status = 0, lengths = 0;
    for (int i = 1; i < argc; i++) {
        int *opt = !strcmp(argv[i], "--heads")        ? &heads
                   : !strcmp(argv[i], "--kv-heads")   ? &kv_heads
                   : !strcmp(argv[i], "--block-size") ? &block_size
                   : !strcmp(argv[i], "--reps")       ? &reps
                                                      : NULL;
        char *end = NULL;
        if (opt) {
            if (i + 1 >= argc) {
                fprintf(stderr, "attention_prefill_bench: %s needs a value\n", argv[i]);
                return 2;
            }
            *opt = (int)strtol(argv[++i], &end, 10);
            if (*end || *opt <= 0) {
                fprintf(stderr, "attention_prefill_bench: bad value for %s\n", argv[i - 1]);
                return 2;
            }
            continue;
        }
        const long L = strtol(argv[i], &end, 10);
        if (*end || L <= 0 || L > 1 << 20 || heads % kv_heads) {
            fprintf(stderr, "usage: attention_prefill_bench [--heads H] [--kv-heads K] [--block-size B] [--reps N] "
                            "L [L ...]\n");
            return 2;
        }
        status |= run(heads, kv_heads, block_size, reps, (int)L);
        lengths++;
    }
    if (!lengths) {
        fprintf(stderr, "usage: attention_prefill_bench [--heads H] [--kv-heads K] [--block-size B] [--reps N] L [L ...]\n");
        return 2;
    }
    return status;
}

/* float32 kernels of the CPU reference backend (see cpu_ops.h for the summation-order contract). */
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

/* The canonical order multiplies, then adds: no fused multiply-add, also in the clones whose target has FMA
 * (GCC contracts across statements unless told not to; clang within one expression). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* Eight float lanes. GCC/Clang lower this to two SSE registers on baseline x86-64 and to one AVX register
 * in the avx2 clones; lane-wise the operations are the same IEEE multiply-then-add either way. Vectors are
 * kept to locals of always-inline functions so no vector crosses a call boundary (that ABI differs). */
typedef float v8f __attribute__((vector_size(32)));

#define CPU_LANES 8
#define CPU_TILE_ROWS 4       /* weight rows of a tile */
#define CPU_TILE_TOKENS_MAX 4 /* tokens of a tile, at most */
#define CPU_TILE_PAIRS_MAX 4  /* token pairs of a 512-bit tile, at most */
/* Tokens per pass over the weights: their inputs (256 KiB at 1024 columns) stay in L2. */
#define CPU_PASS_TOKENS 64
#define CPU_ALWAYS_INLINE static inline __attribute__((always_inline))

typedef float v4f __attribute__((vector_size(16)));
typedef float v2f __attribute__((vector_size(8)));

/* Eight floats from any float address: one unaligned vector load. memcpy compiles to the same load, but under
 * AddressSanitizer GCC makes each such memcpy a call of its interceptor, which took a quarter of the sanitized
 * CPU tests' time; a plain access gets ASan's inline check instead. may_alias: the floats are read as a vector. */
typedef float v8f_unaligned __attribute__((vector_size(32), aligned(4), may_alias));
#define LOAD_V8F(p) (*(const v8f_unaligned *)(p)) /* a macro: a function returning a vector changes the ABI */

/* The lanes' fixed tree, ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), as three vector steps. */
CPU_ALWAYS_INLINE float reduce_lanes(const v8f *acc) {
    v8f lanes = *acc;
    v4f quads = __builtin_shufflevector(lanes, lanes, 0, 1, 2, 3) + __builtin_shufflevector(lanes, lanes, 4, 5, 6, 7);
    v2f pairs = __builtin_shufflevector(quads, quads, 0, 1) + __builtin_shufflevector(quads, quads, 2, 3);
    return pairs[0] + pairs[1];
}

CPU_ALWAYS_INLINE float dot_body(const float *a, const float *b, int32_t n) {
    v8f acc = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t n_vector = n - n % CPU_LANES;
    for (int32_t k = 0; k < n_vector; k += CPU_LANES) {
        acc += LOAD_V8F(a + k) * LOAD_V8F(b + k);
    }
    float sum = reduce_lanes(&acc);
    for (int32_t k = n_vector; k < n; k++) sum += a[k] * b[k];
    return sum;
}

/* A tile of the product: out[t * out_stride + r] = dot(w row r, x token t) for the 4 rows of w and the
 * n_tokens tokens of x, each of the 4 * n_tokens sums in dot_body's order exactly. Each x chunk is loaded
 * once for four rows and each weight chunk once for n_tokens tokens. Inlined with a constant n_tokens, so
 * the accumulators stay in registers. pin_weights (a constant; only where the target has 256-bit registers)
 * holds the weight chunks in registers: otherwise GCC folds each weight load into its multiply, so the AVX2
 * tile issues 10 loads per step instead of 6 and waits on the load ports. */
CPU_ALWAYS_INLINE void tile_body(float *out, const float *x, const float *w, int32_t n_tokens, int32_t out_stride,
                                 int32_t n_cols, int pin_weights) {
    v8f acc[CPU_TILE_ROWS][CPU_TILE_TOKENS_MAX];
    for (int32_t r = 0; r < CPU_TILE_ROWS; r++)
        for (int32_t t = 0; t < n_tokens; t++) acc[r][t] = (v8f){0, 0, 0, 0, 0, 0, 0, 0};
    int32_t n_vector = n_cols - n_cols % CPU_LANES;
    for (int32_t k = 0; k < n_vector; k += CPU_LANES) {
        v8f vw[CPU_TILE_ROWS];
        for (int32_t r = 0; r < CPU_TILE_ROWS; r++) {
            vw[r] = LOAD_V8F(w + (size_t)r * (size_t)n_cols + k);
            if (pin_weights) __asm__("" : "+x"(vw[r]));
        }
        for (int32_t t = 0; t < n_tokens; t++) {
            v8f vx = LOAD_V8F(x + (size_t)t * (size_t)n_cols + k);
            for (int32_t r = 0; r < CPU_TILE_ROWS; r++) acc[r][t] += vw[r] * vx;
        }
    }
    for (int32_t t = 0; t < n_tokens; t++) {
        const float *xt = x + (size_t)t * (size_t)n_cols;
        for (int32_t r = 0; r < CPU_TILE_ROWS; r++) {
            const float *wr = w + (size_t)r * (size_t)n_cols;
            float sum = reduce_lanes(&acc[r][t]);
            for (int32_t k = n_vector; k < n_cols; k++) sum += wr[k] * xt[k];
            out[(size_t)t * (size_t)out_stride + (size_t)r] = sum;
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

typedef float v16f __attribute__((vector_size(64)));
typedef float v16f_unaligned __attribute__((vector_size(64), aligned(4), may_alias));
#define LOAD_V16F(p) (*(const v16f_unaligned *)(p)) /* as LOAD_V8F */

/* tile_body for n_pairs pairs of tokens with 512-bit registers: each holds one row's eight lanes for two
 * tokens side by side, so every lane does the same multiply and add as in tile_body, twice as many per
 * instruction. The pairs' chunks come from pairs (see interleave_pairs), one load each; x serves the
 * n_cols % 8 tail. For AVX-512 clones only (inlined there with a constant n_pairs). */
#define CPU_AVX512_TARGET __attribute__((target("avx512f,avx512vl,avx512dq")))
CPU_AVX512_TARGET CPU_ALWAYS_INLINE void tile_pairs_body(float *out, const float *x, const float *pairs,
                                                         const float *w, int32_t n_pairs, int32_t out_stride,
                                                         int32_t n_cols) {
    v16f acc[CPU_TILE_ROWS][CPU_TILE_PAIRS_MAX];
    for (int32_t r = 0; r < CPU_TILE_ROWS; r++)
        for (int32_t p = 0; p < n_pairs; p++)
            acc[r][p] = (v16f){0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    int32_t n_vector = n_cols - n_cols % CPU_LANES;
    for (int32_t k = 0; k < n_vector; k += CPU_LANES) {
        v16f vw[CPU_TILE_ROWS];
        for (int32_t r = 0; r < CPU_TILE_ROWS; r++) {
            vw[r] = (v16f)_mm512_broadcast_f32x8(_mm256_loadu_ps(w + (size_t)r * (size_t)n_cols + k));
        }
        for (int32_t p = 0; p < n_pairs; p++) {
            v16f vx = LOAD_V16F(pairs + (size_t)p * 2 * (size_t)n_vector + 2 * (size_t)k);
            for (int32_t r = 0; r < CPU_TILE_ROWS; r++) acc[r][p] += vw[r] * vx;
        }
    }
    for (int32_t t = 0; t < 2 * n_pairs; t++) {
        const float *xt = x + (size_t)t * (size_t)n_cols;
        for (int32_t r = 0; r < CPU_TILE_ROWS; r++) {
            const float *wr = w + (size_t)r * (size_t)n_cols;
            v16f both = acc[r][t / 2];
            v8f lanes = t % 2 ? __builtin_shufflevector(both, both, 8, 9, 10, 11, 12, 13, 14, 15)
                              : __builtin_shufflevector(both, both, 0, 1, 2, 3, 4, 5, 6, 7);
            float sum = reduce_lanes(&lanes);
            for (int32_t k = n_vector; k < n_cols; k++) sum += wr[k] * xt[k];
            out[(size_t)t * (size_t)out_stride + (size_t)r] = sum;
        }
    }
}
#endif

/* Rows [row_begin, row_end) of the product for every token: for each 4 rows, tiles of up to tile_tokens
 * tokens (a constant per instruction set: as many accumulators as its registers hold), so the 4 rows stay
 * in L1 while the tokens pass and the weights stream from memory once, in order; then the rows left over
 * when n_rows is not a multiple of 4. The operand order (w * x) matches dot_body's (a * b) with (w, x);
 * IEEE multiplication is commutative, so the leftover rows' sums are the same either way. */
CPU_ALWAYS_INLINE void block_body(float *out, const float *x, const float *weight, int32_t n_tokens, int32_t n_rows,
                                  int32_t n_cols, int32_t row_begin, int32_t row_end, int32_t tile_tokens,
                                  int pin_weights) {
    int32_t tiled_end = row_begin + (row_end - row_begin) / CPU_TILE_ROWS * CPU_TILE_ROWS;
    for (int32_t row = row_begin; row < tiled_end; row += CPU_TILE_ROWS) {
        const float *w = weight + (size_t)row * (size_t)n_cols;
        for (int32_t t = 0; t < n_tokens; t += tile_tokens) {
            int32_t n = n_tokens - t < tile_tokens ? n_tokens - t : tile_tokens;
            const float *xt = x + (size_t)t * (size_t)n_cols;
            float *ot = out + (size_t)t * (size_t)n_rows + row;
            switch (n) {
            case 4: tile_body(ot, xt, w, 4, n_rows, n_cols, pin_weights); break;
            case 3: tile_body(ot, xt, w, 3, n_rows, n_cols, pin_weights); break;
            case 2: tile_body(ot, xt, w, 2, n_rows, n_cols, pin_weights); break;
            default: tile_body(ot, xt, w, 1, n_rows, n_cols, pin_weights); break;
            }
        }
    }
    for (int32_t row = tiled_end; row < row_end; row++)
        for (int32_t t = 0; t < n_tokens; t++)
            out[(size_t)t * (size_t)n_rows + (size_t)row] =
                dot_body(weight + (size_t)row * (size_t)n_cols, x + (size_t)t * (size_t)n_cols, n_cols);
}

static float dot_generic(const float *a, const float *b, int32_t n) { return dot_body(a, b, n); }
/* Baseline x86-64 has 16 SSE registers, two per v8f: one token per tile. */
static void block_generic(float *out, const float *x, const float *pairs, const float *weight, int32_t n_tokens,
                          int32_t n_rows, int32_t n_cols, int32_t row_begin, int32_t row_end) {
    (void)pairs;
    block_body(out, x, weight, n_tokens, n_rows, n_cols, row_begin, row_end, 1, 0);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_HAVE_X86_CLONES 1
/* AVX2: 16 registers hold the 4 x 2 accumulators, the 4 weight chunks and an x chunk. */
__attribute__((target("avx2"))) static float dot_avx2(const float *a, const float *b, int32_t n) {
    return dot_body(a, b, n);
}
__attribute__((target("avx2"))) static void block_avx2(float *out, const float *x, const float *pairs,
                                                       const float *weight, int32_t n_tokens, int32_t n_rows,
                                                       int32_t n_cols, int32_t row_begin, int32_t row_end) {
    (void)pairs;
    block_body(out, x, weight, n_tokens, n_rows, n_cols, row_begin, row_end, 2, 1);
}
/* AVX-512: tiles of 4 rows by up to 4 token pairs in 512-bit registers (16 accumulators of the 32); an odd
 * token left over takes a 256-bit tile. */
CPU_AVX512_TARGET static void block_avx512(float *out, const float *x, const float *pairs, const float *weight,
                                           int32_t n_tokens, int32_t n_rows, int32_t n_cols, int32_t row_begin,
                                           int32_t row_end) {
    int32_t n_vector = n_cols - n_cols % CPU_LANES;
    const int32_t tile_tokens = 2 * CPU_TILE_PAIRS_MAX;
    int32_t tiled_end = row_begin + (row_end - row_begin) / CPU_TILE_ROWS * CPU_TILE_ROWS;
    for (int32_t row = row_begin; row < tiled_end; row += CPU_TILE_ROWS) {
        const float *w = weight + (size_t)row * (size_t)n_cols;
        for (int32_t t = 0; t < n_tokens; t += tile_tokens) {
            int32_t n = n_tokens - t < tile_tokens ? n_tokens - t : tile_tokens;
            const float *xt = x + (size_t)t * (size_t)n_cols;
            const float *pt = pairs + (size_t)t * (size_t)n_vector; /* t is even */
            float *ot = out + (size_t)t * (size_t)n_rows + row;
            switch (n / 2) {
            case 4: tile_pairs_body(ot, xt, pt, w, 4, n_rows, n_cols); break;
            case 3: tile_pairs_body(ot, xt, pt, w, 3, n_rows, n_cols); break;
            case 2: tile_pairs_body(ot, xt, pt, w, 2, n_rows, n_cols); break;
            case 1: tile_pairs_body(ot, xt, pt, w, 1, n_rows, n_cols); break;
            default: break;
            }
            if (n % 2)
                tile_body(ot + (size_t)(n - 1) * (size_t)n_rows, xt + (size_t)(n - 1) * (size_t)n_cols, w, 1, n_rows,
                          n_cols, 1);
        }
    }
    for (int32_t row = tiled_end; row < row_end; row++)
        for (int32_t t = 0; t < n_tokens; t++)
            out[(size_t)t * (size_t)n_rows + (size_t)row] =
                dot_body(weight + (size_t)row * (size_t)n_cols, x + (size_t)t * (size_t)n_cols, n_cols);
}
#endif

typedef float (*dot_fn)(const float *, const float *, int32_t);
typedef void (*block_fn)(float *, const float *, const float *, const float *, int32_t, int32_t, int32_t, int32_t,
                         int32_t);

/* Set by tests to compare the paths; read-only while a forward runs. */
static cpu_ops_path most_path = CPU_OPS_PATH_AVX512;

void cpu_ops_limit_path(cpu_ops_path most) { most_path = most; }

/* The widest path this CPU runs and the tests allow. __builtin_cpu_supports initialises itself on first
 * use; its answers never change. */
static cpu_ops_path chosen_path(void) {
#ifdef CPU_HAVE_X86_CLONES
    if (most_path >= CPU_OPS_PATH_AVX512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return CPU_OPS_PATH_AVX512;
    if (most_path >= CPU_OPS_PATH_AVX2 && __builtin_cpu_supports("avx2")) return CPU_OPS_PATH_AVX2;
#endif
    return CPU_OPS_PATH_PORTABLE;
}

static dot_fn select_dot(void) {
#ifdef CPU_HAVE_X86_CLONES
    /* One chunk at a time: AVX-512's extra registers change nothing here. */
    if (chosen_path() >= CPU_OPS_PATH_AVX2) return dot_avx2;
#endif
    return dot_generic;
}

static block_fn select_block(void) {
#ifdef CPU_HAVE_X86_CLONES
    switch (chosen_path()) {
    case CPU_OPS_PATH_AVX512: return block_avx512;
    case CPU_OPS_PATH_AVX2: return block_avx2;
    default: break;
    }
#endif
    return block_generic;
}

float cpu_dot(const float *a, const float *b, int32_t n) { return select_dot()(a, b, n); }

/* Rows per task: enough work to amortise taking it, few enough to share a small matrix among the threads. */
#define CPU_BLOCK_ROWS 16

size_t cpu_matmul_scratch_floats(int32_t n_cols) { return (size_t)CPU_PASS_TOKENS * (size_t)n_cols; }

/* The AVX-512 tiles' input: for each pair of tokens (2p, 2p + 1) and each whole chunk c of 8 columns,
 * x[2p][8c .. 8c + 8) then x[2p + 1][8c .. 8c + 8), so that a pair's chunk is one 512-bit load.
 * n_tokens / 2 pairs (an odd last token is read from x). */
static void interleave_pairs(float *pairs, const float *x, int32_t n_tokens, int32_t n_cols) {
    int32_t n_vector = n_cols - n_cols % CPU_LANES;
    for (int32_t p = 0; p < n_tokens / 2; p++) {
        const float *first = x + (size_t)(2 * p) * (size_t)n_cols;
        const float *second = first + n_cols;
        float *dst = pairs + (size_t)p * 2 * (size_t)n_vector;
        for (int32_t k = 0; k < n_vector; k += CPU_LANES) {
            memcpy(dst + 2 * (size_t)k, first + k, CPU_LANES * sizeof(float));
            memcpy(dst + 2 * (size_t)k + CPU_LANES, second + k, CPU_LANES * sizeof(float));
        }
    }
}

void cpu_matmul_parts(const cpu_matmul_part *parts, int32_t n_parts, const float *x, int32_t n_tokens,
                      int32_t n_cols, int n_threads, float *scratch) {
    if (n_parts > CPU_MATMUL_PARTS_MAX) { /* in groups that first_block holds */
        cpu_matmul_parts(parts, CPU_MATMUL_PARTS_MAX, x, n_tokens, n_cols, n_threads, scratch);
        cpu_matmul_parts(parts + CPU_MATMUL_PARTS_MAX, n_parts - CPU_MATMUL_PARTS_MAX, x, n_tokens, n_cols,
                         n_threads, scratch);
        return;
    }
    cpu_ops_path path = chosen_path();
    block_fn block = select_block();
    /* first_block[p]: the index of part p's first block in the blocks of all the parts, in order. */
    int32_t first_block[CPU_MATMUL_PARTS_MAX + 1];
    int64_t n_rows_all = 0;
    first_block[0] = 0;
    for (int32_t p = 0; p < n_parts; p++) {
        first_block[p + 1] = first_block[p] + (parts[p].n_rows + CPU_BLOCK_ROWS - 1) / CPU_BLOCK_ROWS;
        n_rows_all += parts[p].n_rows;
    }
    int32_t n_blocks = first_block[n_parts];
    for (int32_t t = 0; t < n_tokens; t += CPU_PASS_TOKENS) {
        int32_t n = n_tokens - t < CPU_PASS_TOKENS ? n_tokens - t : CPU_PASS_TOKENS;
        const float *xt = x + (size_t)t * (size_t)n_cols;
        if (path == CPU_OPS_PATH_AVX512 && n >= 2) interleave_pairs(scratch, xt, n, n_cols);
        /* Small problems are not worth waking the thread team. Dynamic: a thread the OS delays (other
         * work on a small machine) holds up only its current block. */
        int parallel = (int64_t)n * n_rows_all * n_cols >= CPU_PARALLEL_MIN_WORK;
        /* Blocks per grab: at least 4 (64 rows a thread streams in order) and 2^16 multiply-adds, so that
         * taking work (an atomic add) stays cheap next to doing it, also for narrow matrices (a tiny
         * model's lm_head). */
        int64_t grab = ((int64_t)1 << 16) / ((int64_t)CPU_BLOCK_ROWS * n * n_cols);
        int32_t blocks_per_grab = grab < 4 ? 4 : grab > n_blocks ? n_blocks : (int32_t)grab;
#pragma omp parallel for schedule(dynamic, blocks_per_grab) num_threads(n_threads) if (parallel)
        for (int32_t b = 0; b < n_blocks; b++) {
            int32_t p = 0;
            while (b >= first_block[p + 1]) p++;
            int32_t n_rows = parts[p].n_rows;
            int32_t row = (b - first_block[p]) * CPU_BLOCK_ROWS;
            int32_t end = n_rows - row < CPU_BLOCK_ROWS ? n_rows : row + CPU_BLOCK_ROWS;
            block(parts[p].out + (size_t)t * (size_t)n_rows, xt, scratch, parts[p].weight, n, n_rows, n_cols, row,
                  end);
        }
    }
}

void cpu_matmul(float *out, const float *x, const float *weight, int32_t n_tokens, int32_t n_rows,
                int32_t n_cols, int n_threads, float *scratch) {
    cpu_matmul_part part = {.out = out, .weight = weight, .n_rows = n_rows};
    cpu_matmul_parts(&part, 1, x, n_tokens, n_cols, n_threads, scratch);
}

void cpu_rmsnorm(float *out, const float *x, const float *weight, int32_t n, float eps) {
    double sum_squares = 0.0;
    for (int32_t i = 0; i < n; i++) sum_squares += (double)x[i] * (double)x[i];
    /* transformers: variance (float32) + eps (float32), rsqrt, then (x * rsqrt) * weight. */
    float variance = (float)(sum_squares / (double)n);
    float inverse_rms = 1.0f / sqrtf(variance + eps);
    for (int32_t i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inverse_rms);
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

void cpu_swiglu(float *gate, const float *up, size_t n, int n_threads) {
    /* Elementwise, so the split between threads changes no bits; expf makes it worth one for a prompt. */
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n >= CPU_PARALLEL_MIN_WORK / 8)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        float silu = g / (1.0f + expf(-g));
        gate[i] = silu * up[i];
    }
}

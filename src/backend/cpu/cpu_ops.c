/* float32 kernels of the CPU reference backend (see cpu_ops.h for the summation-order contract). */
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <string.h>

/* The row-major products and dot products multiply, then add: no fused multiply-add, also in the clones whose
 * target has FMA (GCC contracts across statements unless told not to; clang within one expression). The packed
 * products fuse explicitly (fmaf and the FMA intrinsics, which the setting does not touch). */
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

/* The widest path this CPU runs and the tests allow. __builtin_cpu_supports initialises itself on first
 * use; its answers never change. */
static cpu_ops_path widest_path(void) {
#ifdef CPU_HAVE_X86_CLONES
    if (most_path >= CPU_OPS_PATH_AVX512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return CPU_OPS_PATH_AVX512;
    if (most_path >= CPU_OPS_PATH_AVX2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return CPU_OPS_PATH_AVX2;
#endif
    return CPU_OPS_PATH_PORTABLE;
}

/* widest_path's answer, found once: the attention asks for every cached position. -1: not yet. Atomic: the first
 * call may come from several OpenMP threads at once (each stores the same answer). */
static int cached_path = -1;

static cpu_ops_path chosen_path(void) {
    int path = __atomic_load_n(&cached_path, __ATOMIC_RELAXED);
    if (path < 0) {
        path = (int)widest_path();
        __atomic_store_n(&cached_path, path, __ATOMIC_RELAXED);
    }
    return (cpu_ops_path)path;
}

void cpu_ops_limit_path(cpu_ops_path most) {
    most_path = most;
    __atomic_store_n(&cached_path, (int)widest_path(), __ATOMIC_RELAXED);
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

/* dot_body for four rows of b at once: each row's lanes, tree and tail exactly as dot_body's, a's chunk loaded
 * once for the four. */
CPU_ALWAYS_INLINE void dot_rows_body(float *out, const float *a, const float *b, size_t b_stride, int32_t n_rows,
                                     int32_t n) {
    int32_t n_vector = n - n % CPU_LANES;
    int32_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        const float *b0 = b + (size_t)r * b_stride, *b1 = b0 + b_stride, *b2 = b1 + b_stride, *b3 = b2 + b_stride;
        v8f acc0 = {0, 0, 0, 0, 0, 0, 0, 0}, acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int32_t k = 0; k < n_vector; k += CPU_LANES) {
            v8f va = LOAD_V8F(a + k);
            acc0 += va * LOAD_V8F(b0 + k);
            acc1 += va * LOAD_V8F(b1 + k);
            acc2 += va * LOAD_V8F(b2 + k);
            acc3 += va * LOAD_V8F(b3 + k);
        }
        float sum[4] = {reduce_lanes(&acc0), reduce_lanes(&acc1), reduce_lanes(&acc2), reduce_lanes(&acc3)};
        const float *rows[4] = {b0, b1, b2, b3};
        for (int32_t i = 0; i < 4; i++) {
            for (int32_t k = n_vector; k < n; k++) sum[i] += a[k] * rows[i][k];
            out[r + i] = sum[i];
        }
    }
    for (; r < n_rows; r++) out[r] = dot_body(a, b + (size_t)r * b_stride, n);
}

static void dot_rows_generic(float *out, const float *a, const float *b, size_t b_stride, int32_t n_rows, int32_t n) {
    dot_rows_body(out, a, b, b_stride, n_rows, n);
}
#ifdef CPU_HAVE_X86_CLONES
__attribute__((target("avx2"))) static void dot_rows_avx2(float *out, const float *a, const float *b,
                                                          size_t b_stride, int32_t n_rows, int32_t n) {
    dot_rows_body(out, a, b, b_stride, n_rows, n);
}
#endif

void cpu_dot_rows(float *out, const float *a, const float *b, size_t b_stride, int32_t n_rows, int32_t n) {
#ifdef CPU_HAVE_X86_CLONES
    if (chosen_path() >= CPU_OPS_PATH_AVX2) {
        dot_rows_avx2(out, a, b, b_stride, n_rows, n);
        return;
    }
#endif
    dot_rows_generic(out, a, b, b_stride, n_rows, n);
}

/* out[i] += p * v[i]: a multiply, then an add, per element, so the lanes change no bits. */
CPU_ALWAYS_INLINE void add_scaled_body(float *out, float p, const float *v, int32_t n) {
    const v8f scale = {p, p, p, p, p, p, p, p};
    int32_t n_vector = n - n % CPU_LANES;
    for (int32_t k = 0; k < n_vector; k += CPU_LANES) {
        v8f sum = LOAD_V8F(out + k) + scale * LOAD_V8F(v + k);
        memcpy(out + k, &sum, sizeof sum);
    }
    for (int32_t k = n_vector; k < n; k++) out[k] += p * v[k];
}

static void add_scaled_generic(float *out, float p, const float *v, int32_t n) { add_scaled_body(out, p, v, n); }
#ifdef CPU_HAVE_X86_CLONES
__attribute__((target("avx2"))) static void add_scaled_avx2(float *out, float p, const float *v, int32_t n) {
    add_scaled_body(out, p, v, n);
}
#endif

void cpu_add_scaled(float *out, float p, const float *v, int32_t n) {
#ifdef CPU_HAVE_X86_CLONES
    if (chosen_path() >= CPU_OPS_PATH_AVX2) {
        add_scaled_avx2(out, p, v, n);
        return;
    }
#endif
    add_scaled_generic(out, p, v, n);
}

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

void cpu_matmul(float *out, const float *x, const float *weight, int32_t n_tokens, int32_t n_rows,
                int32_t n_cols, int n_threads, float *scratch) {
    cpu_ops_path path = chosen_path();
    block_fn block = select_block();
    int32_t n_blocks = (n_rows + CPU_BLOCK_ROWS - 1) / CPU_BLOCK_ROWS;
    for (int32_t t = 0; t < n_tokens; t += CPU_PASS_TOKENS) {
        int32_t n = n_tokens - t < CPU_PASS_TOKENS ? n_tokens - t : CPU_PASS_TOKENS;
        const float *xt = x + (size_t)t * (size_t)n_cols;
        if (path == CPU_OPS_PATH_AVX512 && n >= 2) interleave_pairs(scratch, xt, n, n_cols);
        /* Small problems are not worth waking the thread team. Dynamic: a thread the OS delays (other
         * work on a small machine) holds up only its current block. */
        int parallel = (int64_t)n * n_rows * n_cols >= CPU_PARALLEL_MIN_WORK;
        /* Blocks per grab: at least 4 (64 rows a thread streams in order) and 2^16 multiply-adds, so that
         * taking work (an atomic add) stays cheap next to doing it, also for narrow matrices (a tiny
         * model's lm_head). */
        int64_t grab = ((int64_t)1 << 16) / ((int64_t)CPU_BLOCK_ROWS * n * n_cols);
        int32_t blocks_per_grab = grab < 4 ? 4 : grab > n_blocks ? n_blocks : (int32_t)grab;
#pragma omp parallel for schedule(dynamic, blocks_per_grab) num_threads(n_threads) if (parallel)
        for (int32_t b = 0; b < n_blocks; b++) {
            int32_t row = b * CPU_BLOCK_ROWS;
            int32_t end = n_rows - row < CPU_BLOCK_ROWS ? n_rows : row + CPU_BLOCK_ROWS;
            block(out + (size_t)t * (size_t)n_rows, xt, scratch, weight, n, n_rows, n_cols, row, end);
        }
    }
}

/* ---- Products with packed weights ------------------------------------------------------------- */

/* Columns per block of a packed product: a panel's 16 KB of them stay in L1 while the pass's tokens go by,
 * and the pass's inputs for them (64 KB at 64 tokens) in L2. */
#define CPU_PANEL_BLOCK_COLS 256
/* Tokens per tile: as many accumulators as the registers hold beside the weights and the broadcast. */
#define CPU_PANEL_TOKENS_AVX2 6    /* 12 accumulators, 2 weight chunks and the broadcast: 15 of 16 registers */
#define CPU_PANEL_TOKENS_AVX512 12 /* 12 accumulators, the weights and the broadcast: 14 of 32 */
#define CPU_PANEL_TOKENS_PORTABLE 2

size_t cpu_packed_floats(int32_t n_rows, int32_t n_cols) {
    return (size_t)((n_rows + CPU_PANEL_ROWS - 1) / CPU_PANEL_ROWS) * CPU_PANEL_ROWS * (size_t)n_cols;
}

void cpu_pack_rows(float *packed, const float *weight, int32_t n_rows, int32_t n_cols) {
    int32_t n_panels = (n_rows + CPU_PANEL_ROWS - 1) / CPU_PANEL_ROWS;
#pragma omp parallel for schedule(static) if ((int64_t)n_rows * n_cols >= CPU_PARALLEL_MIN_WORK)
    for (int32_t p = 0; p < n_panels; p++) {
        float *panel = packed + (size_t)p * CPU_PANEL_ROWS * (size_t)n_cols;
        for (int32_t i = 0; i < CPU_PANEL_ROWS; i++) {
            int32_t row = p * CPU_PANEL_ROWS + i;
            if (row < n_rows) {
                const float *src = weight + (size_t)row * (size_t)n_cols;
                for (int32_t k = 0; k < n_cols; k++) panel[(size_t)k * CPU_PANEL_ROWS + (size_t)i] = src[k];
            } else {
                for (int32_t k = 0; k < n_cols; k++) panel[(size_t)k * CPU_PANEL_ROWS + (size_t)i] = 0.0f;
            }
        }
    }
}

/* The tiles of a packed product. A tile is the panel's 16 rows for n_tokens tokens over kn columns, accumulated
 * into partial[t * 16 + i] (first: from zero). Each of the 16 * n_tokens sums takes its products in column
 * order, one fused multiply-add each (fmaf's single rounding), so a tile of any size, on any path, gives every
 * output the same bits. The panel's 16 weights of a column are loaded once for all the tile's tokens; each
 * token's input is one broadcast from the tile's packed input (x[k * x_stride + t]). The vector tiles are
 * inlined with a constant n_tokens, so the accumulators stay in registers. On an x86-64 CPU without FMA (older
 * than AVX2) the portable tile's fmaf is libm's exact software form: slow, and the same bits. */
static void panel_tile_portable(float *partial, const float *panel, const float *x, int32_t x_stride, int32_t kn,
                                int first, int32_t n_tokens) {
    float acc[CPU_PANEL_TOKENS_PORTABLE][CPU_PANEL_ROWS];
    for (int32_t t = 0; t < n_tokens; t++)
        for (int32_t i = 0; i < CPU_PANEL_ROWS; i++) acc[t][i] = first ? 0.0f : partial[t * CPU_PANEL_ROWS + i];
    for (int32_t k = 0; k < kn; k++)
        for (int32_t t = 0; t < n_tokens; t++) {
            float xs = x[(size_t)k * (size_t)x_stride + (size_t)t];
            for (int32_t i = 0; i < CPU_PANEL_ROWS; i++)
                acc[t][i] = fmaf(panel[(size_t)k * CPU_PANEL_ROWS + (size_t)i], xs, acc[t][i]);
        }
    for (int32_t t = 0; t < n_tokens; t++) memcpy(partial + t * CPU_PANEL_ROWS, acc[t], sizeof acc[t]);
}

/* A pass of a packed product: one panel for n_tokens <= CPU_PASS_TOKENS tokens, into partial[t * 16 + i]:
 * blocks of columns outside, tiles of the path's width inside. x is the pass's input as pack_pass_tile lays it
 * out for that width, so a tile's input for columns [k0, ..) starts at x + t * n_cols + k0 * width. */
#define PANEL_BLOCKS_BEGIN(width)                                                                               \
    for (int32_t k0 = 0; k0 < n_cols; k0 += CPU_PANEL_BLOCK_COLS) {                                             \
        const int32_t kn = n_cols - k0 < CPU_PANEL_BLOCK_COLS ? n_cols - k0 : CPU_PANEL_BLOCK_COLS;             \
        const float *pk = panel + (size_t)k0 * CPU_PANEL_ROWS;                                                  \
        const int first = k0 == 0;                                                                              \
        for (int32_t t = 0; t < n_tokens; t += (width)) {                                                       \
            const int32_t n = n_tokens - t < (width) ? n_tokens - t : (width);                                  \
            float *pt = partial + t * CPU_PANEL_ROWS;                                                           \
            const float *xt = x + (size_t)t * (size_t)n_cols + (size_t)k0 * (size_t)(width);
#define PANEL_BLOCKS_END \
    }                    \
    }

static void panel_pass_portable(float *partial, const float *panel, const float *x, int32_t n_tokens,
                                int32_t n_cols) {
    PANEL_BLOCKS_BEGIN(CPU_PANEL_TOKENS_PORTABLE)
    panel_tile_portable(pt, pk, xt, CPU_PANEL_TOKENS_PORTABLE, kn, first, n);
    PANEL_BLOCKS_END
}

#ifdef CPU_HAVE_X86_CLONES
#define CPU_FMA_TARGET __attribute__((target("avx2,fma")))

CPU_FMA_TARGET CPU_ALWAYS_INLINE void panel_tile_avx2(float *partial, const float *panel, const float *x,
                                                      int32_t x_stride, int32_t kn, int first, int32_t n_tokens) {
    __m256 acc[CPU_PANEL_TOKENS_AVX2][2];
    for (int32_t t = 0; t < n_tokens; t++)
        for (int32_t h = 0; h < 2; h++)
            acc[t][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(partial + t * CPU_PANEL_ROWS + 8 * h);
    for (int32_t k = 0; k < kn; k++) {
        __m256 w0 = _mm256_loadu_ps(panel + (size_t)k * CPU_PANEL_ROWS);
        __m256 w1 = _mm256_loadu_ps(panel + (size_t)k * CPU_PANEL_ROWS + 8);
        for (int32_t t = 0; t < n_tokens; t++) {
            __m256 b = _mm256_broadcast_ss(x + (size_t)k * (size_t)x_stride + (size_t)t);
            acc[t][0] = _mm256_fmadd_ps(w0, b, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, b, acc[t][1]);
        }
    }
    for (int32_t t = 0; t < n_tokens; t++)
        for (int32_t h = 0; h < 2; h++) _mm256_storeu_ps(partial + t * CPU_PANEL_ROWS + 8 * h, acc[t][h]);
}

CPU_FMA_TARGET static void panel_pass_avx2(float *partial, const float *panel, const float *x, int32_t n_tokens,
                                           int32_t n_cols) {
    PANEL_BLOCKS_BEGIN(CPU_PANEL_TOKENS_AVX2)
    switch (n) {
    case 6: panel_tile_avx2(pt, pk, xt, CPU_PANEL_TOKENS_AVX2, kn, first, 6); break;
    case 5: panel_tile_avx2(pt, pk, xt, CPU_PANEL_TOKENS_AVX2, kn, first, 5); break;
    case 4: panel_tile_avx2(pt, pk, xt, CPU_PANEL_TOKENS_AVX2, kn, first, 4); break;
    case 3: panel_tile_avx2(pt, pk, xt, CPU_PANEL_TOKENS_AVX2, kn, first, 3); break;
    case 2: panel_tile_avx2(pt, pk, xt, CPU_PANEL_TOKENS_AVX2, kn, first, 2); break;
    default: panel_tile_avx2(pt, pk, xt, CPU_PANEL_TOKENS_AVX2, kn, first, 1); break;
    }
    PANEL_BLOCKS_END
}

/* panel_tile_avx2 with one 512-bit register per column: the same fused multiply-adds, lane by lane. */
CPU_AVX512_TARGET CPU_ALWAYS_INLINE void panel_tile_avx512(float *partial, const float *panel, const float *x,
                                                           int32_t x_stride, int32_t kn, int first,
                                                           int32_t n_tokens) {
    __m512 acc[CPU_PANEL_TOKENS_AVX512];
    for (int32_t t = 0; t < n_tokens; t++)
        acc[t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(partial + t * CPU_PANEL_ROWS);
    for (int32_t k = 0; k < kn; k++) {
        __m512 w = _mm512_loadu_ps(panel + (size_t)k * CPU_PANEL_ROWS);
        for (int32_t t = 0; t < n_tokens; t++)
            acc[t] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[(size_t)k * (size_t)x_stride + (size_t)t]), acc[t]);
    }
    for (int32_t t = 0; t < n_tokens; t++) _mm512_storeu_ps(partial + t * CPU_PANEL_ROWS, acc[t]);
}

CPU_AVX512_TARGET static void panel_pass_avx512(float *partial, const float *panel, const float *x,
                                                int32_t n_tokens, int32_t n_cols) {
    PANEL_BLOCKS_BEGIN(CPU_PANEL_TOKENS_AVX512)
    switch (n) {
    case 12: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 12); break;
    case 11: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 11); break;
    case 10: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 10); break;
    case 9: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 9); break;
    case 8: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 8); break;
    case 7: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 7); break;
    case 6: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 6); break;
    case 5: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 5); break;
    case 4: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 4); break;
    case 3: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 3); break;
    case 2: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 2); break;
    default: panel_tile_avx512(pt, pk, xt, CPU_PANEL_TOKENS_AVX512, kn, first, 1); break;
    }
    PANEL_BLOCKS_END
}
#endif

typedef void (*panel_pass_fn)(float *, const float *, const float *, int32_t, int32_t);

/* A path's pass and the tile width its input is packed for. */
typedef struct panel_path {
    panel_pass_fn pass;
    int32_t tile_tokens;
} panel_path;

static panel_path select_panel_path(void) {
#ifdef CPU_HAVE_X86_CLONES
    switch (chosen_path()) {
    case CPU_OPS_PATH_AVX512: return (panel_path){panel_pass_avx512, CPU_PANEL_TOKENS_AVX512};
    case CPU_OPS_PATH_AVX2: return (panel_path){panel_pass_avx2, CPU_PANEL_TOKENS_AVX2};
    default: break;
    }
#endif
    return (panel_path){panel_pass_portable, CPU_PANEL_TOKENS_PORTABLE};
}

/* Tokens of a pass rounded up to whole tiles, for the widest tile. */
#define CPU_PASS_TOKENS_PADDED \
    ((CPU_PASS_TOKENS + CPU_PANEL_TOKENS_AVX512 - 1) / CPU_PANEL_TOKENS_AVX512 * CPU_PANEL_TOKENS_AVX512)

size_t cpu_matmul_packed_scratch_floats(int32_t n_cols) { return (size_t)CPU_PASS_TOKENS_PADDED * (size_t)n_cols; }

/* Tile i of a pass's input (tokens [i * w, i * w + w) for tile width w): its columns in order, each as the w
 * tokens' values side by side (zeros past the last token), so that a tile's broadcasts read one short run of
 * memory per column instead of w rows 4 KB or more apart, which share L1 sets with the panel's lines. */
static void pack_pass_tile(float *dst, const float *x, int32_t tile, int32_t n_tokens, int32_t n_cols,
                           int32_t tile_tokens) {
    float *d = dst + (size_t)tile * (size_t)tile_tokens * (size_t)n_cols;
    const int32_t t0 = tile * tile_tokens;
    const int32_t n = n_tokens - t0 < tile_tokens ? n_tokens - t0 : tile_tokens;
    for (int32_t j = 0; j < tile_tokens; j++) {
        const float *src = x + (size_t)(t0 + j) * (size_t)n_cols;
        if (j < n)
            for (int32_t k = 0; k < n_cols; k++) d[(size_t)k * (size_t)tile_tokens + (size_t)j] = src[k];
        else
            for (int32_t k = 0; k < n_cols; k++) d[(size_t)k * (size_t)tile_tokens + (size_t)j] = 0.0f;
    }
}

void cpu_matmul_packed_parts(const cpu_matmul_part *parts, int32_t n_parts, const float *x, int32_t n_tokens,
                             int32_t n_cols, int n_threads, float *scratch) {
    if (n_parts > CPU_MATMUL_PARTS_MAX) { /* in groups that first_panel holds */
        cpu_matmul_packed_parts(parts, CPU_MATMUL_PARTS_MAX, x, n_tokens, n_cols, n_threads, scratch);
        cpu_matmul_packed_parts(parts + CPU_MATMUL_PARTS_MAX, n_parts - CPU_MATMUL_PARTS_MAX, x, n_tokens, n_cols,
                                n_threads, scratch);
        return;
    }
    const panel_path path = select_panel_path();
    /* first_panel[p]: the index of part p's first panel among the panels of all the parts, in order. */
    int32_t first_panel[CPU_MATMUL_PARTS_MAX + 1];
    int64_t n_rows_all = 0;
    first_panel[0] = 0;
    for (int32_t p = 0; p < n_parts; p++) {
        first_panel[p + 1] = first_panel[p] + (parts[p].n_rows + CPU_PANEL_ROWS - 1) / CPU_PANEL_ROWS;
        n_rows_all += parts[p].n_rows;
    }
    const int32_t n_panels = first_panel[n_parts];
    for (int32_t t = 0; t < n_tokens; t += CPU_PASS_TOKENS) {
        const int32_t n = n_tokens - t < CPU_PASS_TOKENS ? n_tokens - t : CPU_PASS_TOKENS;
        const float *xt = x + (size_t)t * (size_t)n_cols;
        const int32_t n_tiles = (n + path.tile_tokens - 1) / path.tile_tokens;
        const int parallel = (int64_t)n * n_rows_all * n_cols >= CPU_PARALLEL_MIN_WORK;
        /* Panels per grab: 2^16 multiply-adds at least, so that taking work (an atomic add) stays cheap next
         * to doing it; a thread the OS delays holds up only its current grab. */
        const int64_t grab = ((int64_t)1 << 16) / ((int64_t)CPU_PANEL_ROWS * n * n_cols);
        const int32_t panels_per_grab = grab < 1 ? 1 : grab > n_panels ? n_panels : (int32_t)grab;
#pragma omp parallel num_threads(n_threads) if (parallel)
        {
#pragma omp for schedule(static)
            for (int32_t i = 0; i < n_tiles; i++) pack_pass_tile(scratch, xt, i, n, n_cols, path.tile_tokens);
#pragma omp for schedule(dynamic, panels_per_grab)
            for (int32_t q = 0; q < n_panels; q++) {
                int32_t p = 0;
                while (q >= first_panel[p + 1]) p++;
                const int32_t n_rows = parts[p].n_rows;
                const int32_t row = (q - first_panel[p]) * CPU_PANEL_ROWS;
                const int32_t n_valid = n_rows - row < CPU_PANEL_ROWS ? n_rows - row : CPU_PANEL_ROWS;
                /* The pass's sums, in L1 (4 KB): the output rows are far apart and may share cache lines with
                 * another thread's panels, so each is written once, at the end of the pass. */
                float partial[CPU_PASS_TOKENS * CPU_PANEL_ROWS] __attribute__((aligned(64)));
                path.pass(partial, parts[p].weight + (size_t)row * (size_t)n_cols, scratch, n, n_cols);
                for (int32_t i = 0; i < n; i++)
                    memcpy(parts[p].out + (size_t)(t + i) * (size_t)n_rows + (size_t)row,
                           partial + i * CPU_PANEL_ROWS, (size_t)n_valid * sizeof(float));
            }
        }
    }
}

void cpu_matmul_packed(float *out, const float *x, const float *packed, int32_t n_tokens, int32_t n_rows,
                       int32_t n_cols, int n_threads, float *scratch) {
    cpu_matmul_part part = {.out = out, .weight = packed, .n_rows = n_rows};
    cpu_matmul_packed_parts(&part, 1, x, n_tokens, n_cols, n_threads, scratch);
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

/* e^x in eight lanes (Cephes' expf): x = n ln 2 + r with n the nearest integer to x log2(e) (found by adding and
 * subtracting 1.5 * 2^23) and ln 2 in two parts (Cody-Waite, so r keeps its low bits), e^r by a degree-7 series
 * (about 1 ulp against expf), 2^n put in the exponent bits. Plain IEEE operations in one fixed order (fp-contract is
 * off), so every instruction-set path gives the same bits. x is clamped to [-87, 88.3], where 2^n stays a normal
 * float: below, the result is e^-87 (1.6e-38) instead of a denormal; above, e^88.3 instead of up to 2.4e38 or inf.
 * Neither changes a softmax or a SiLU. */
typedef int32_t v8i __attribute__((vector_size(32)));

#define SPLAT8(v) ((v8f){v, v, v, v, v, v, v, v}) /* macros and pointers: a function taking or returning a vector
                                                  * changes the ABI */

/* *lanes = e^*lanes. */
CPU_ALWAYS_INLINE void exp_lanes(v8f *lanes) {
    v8f x = *lanes;
    const v8i low = x < SPLAT8(-87.0f), high = x > SPLAT8(88.3f); /* NaN: neither, and NaN out */
    x = (v8f)(((v8i)x & ~(low | high)) | ((v8i)SPLAT8(-87.0f) & low) | ((v8i)SPLAT8(88.3f) & high));
    const v8f round_magic = SPLAT8(12582912.0f);
    const v8f n = (x * SPLAT8(1.44269504088896341f) + round_magic) - round_magic;
    v8f r = x - n * SPLAT8(0.693359375f);
    r = r - n * SPLAT8(-2.12194440e-4f);
    v8f p = SPLAT8(1.9875691500e-4f);
    p = p * r + SPLAT8(1.3981999507e-3f);
    p = p * r + SPLAT8(8.3334519073e-3f);
    p = p * r + SPLAT8(4.1665795894e-2f);
    p = p * r + SPLAT8(1.6666665459e-1f);
    p = p * r + SPLAT8(5.0000001201e-1f);
    const v8f e_r = p * (r * r) + r + SPLAT8(1.0f);
    const v8i two_n = (__builtin_convertvector(n, v8i) + 127) << 23;
    *lanes = e_r * (v8f)two_n;
}

/* Eight lanes at a time; a tail of fewer goes through the same lanes from a padded copy, so an element's bits do not
 * depend on where it sits. */
CPU_ALWAYS_INLINE void exp_shifted_body(float *x, size_t n, float shift) {
    size_t i = 0;
    for (; i + CPU_LANES <= n; i += CPU_LANES) {
        v8f e = LOAD_V8F(x + i) - SPLAT8(shift);
        exp_lanes(&e);
        memcpy(x + i, &e, sizeof e);
    }
    if (i < n) {
        float tail[CPU_LANES] = {0};
        memcpy(tail, x + i, (n - i) * sizeof(float));
        v8f e = LOAD_V8F(tail) - SPLAT8(shift);
        exp_lanes(&e);
        memcpy(x + i, &e, (n - i) * sizeof(float));
    }
}

/* *out = silu(*gate) * *up. */
CPU_ALWAYS_INLINE void silu_times(v8f *out, const float *gate, const float *up) {
    const v8f g = LOAD_V8F(gate);
    v8f e = -g;
    exp_lanes(&e);
    *out = g / (SPLAT8(1.0f) + e) * LOAD_V8F(up);
}

CPU_ALWAYS_INLINE void swiglu_body(float *gate, const float *up, size_t n) {
    size_t i = 0;
    for (; i + CPU_LANES <= n; i += CPU_LANES) {
        v8f out;
        silu_times(&out, gate + i, up + i);
        memcpy(gate + i, &out, sizeof out);
    }
    if (i < n) {
        float g[CPU_LANES] = {0}, u[CPU_LANES] = {0};
        memcpy(g, gate + i, (n - i) * sizeof(float));
        memcpy(u, up + i, (n - i) * sizeof(float));
        v8f out;
        silu_times(&out, g, u);
        memcpy(gate + i, &out, (n - i) * sizeof(float));
    }
}

static void exp_shifted_generic(float *x, size_t n, float shift) { exp_shifted_body(x, n, shift); }
static void swiglu_generic(float *gate, const float *up, size_t n) { swiglu_body(gate, up, n); }
#ifdef CPU_HAVE_X86_CLONES
__attribute__((target("avx2"))) static void exp_shifted_avx2(float *x, size_t n, float shift) {
    exp_shifted_body(x, n, shift);
}
__attribute__((target("avx2"))) static void swiglu_avx2(float *gate, const float *up, size_t n) {
    swiglu_body(gate, up, n);
}
#endif

void cpu_exp_shifted(float *x, size_t n, float shift) {
#ifdef CPU_HAVE_X86_CLONES
    if (chosen_path() >= CPU_OPS_PATH_AVX2) {
        exp_shifted_avx2(x, n, shift);
        return;
    }
#endif
    exp_shifted_generic(x, n, shift);
}

/* A slice of swiglu per thread, each a multiple of 8 elements so the split moves no element into a padded tail:
 * the thread count changes no bits. */
void cpu_swiglu(float *gate, const float *up, size_t n, int n_threads) {
    const size_t n_chunks = (n + CPU_LANES - 1) / CPU_LANES;
    const int threads = n >= CPU_PARALLEL_MIN_WORK / 8 ? n_threads : 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int t = 0; t < threads; t++) {
        const size_t begin = n_chunks * (size_t)t / (size_t)threads * CPU_LANES;
        size_t end = n_chunks * (size_t)(t + 1) / (size_t)threads * CPU_LANES;
        if (end > n) end = n;
        if (begin >= end) continue;
#ifdef CPU_HAVE_X86_CLONES
        if (chosen_path() >= CPU_OPS_PATH_AVX2) {
            swiglu_avx2(gate + begin, up + begin, end - begin);
            continue;
        }
#endif
        swiglu_generic(gate + begin, up + begin, end - begin);
    }
}

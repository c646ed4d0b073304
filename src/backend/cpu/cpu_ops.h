/* float32 kernels of the CPU reference backend.
 *
 * Every dot product in the backend (projections, lm_head, attention scores) goes through the same
 * summation order: eight lanes, lane l accumulating the elements k with k % 8 == l, the lanes added in a
 * fixed tree, then the remaining n % 8 elements in order. The order never depends on how many tokens or
 * threads share a call, so a sequence's results are bit-identical whatever batch it rides in, however its
 * prompt is split into steps (decode, prefill, a recomputation after preemption) and whatever the thread
 * count. The AVX2 and AVX-512 paths (chosen at run time) perform the very same operations lane by lane (no
 * FMA contraction; they differ only in how many tokens share a pass over the weights), so they give the
 * same bits as the portable path.
 *
 * This order is why the products are not a BLAS's: sgemm's order depends on the shape of the call (its
 * micro-kernels split the k loop differently for different token counts), so a token's bits would change
 * with the chunking of its prompt, which tests/engine/engine_stress_test.c forbids.
 */
#ifndef KITE_BACKEND_CPU_OPS_H
#define KITE_BACKEND_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

/* Multiply-adds below which a kernel runs on the calling thread alone: waking the OpenMP team costs a few
 * microseconds, as much as this work. The thread count never changes a result's bits. */
#define CPU_PARALLEL_MIN_WORK (1 << 18)

/* The canonical dot product of a[0..n) and b[0..n). */
float cpu_dot(const float *a, const float *b, int32_t n);

/* out[t * n_rows + r] = dot(weight[r * n_cols ..], x[t * n_cols ..]) for t < n_tokens, r < n_rows.
 * weight is (n_rows, n_cols) row-major (PyTorch Linear layout); parallel over blocks of rows, each block's
 * weights read once for up to 64 tokens. scratch holds cpu_matmul_scratch_floats(n_cols) floats. */
void cpu_matmul(float *out, const float *x, const float *weight, int32_t n_tokens, int32_t n_rows,
                int32_t n_cols, int n_threads, float *scratch);

/* One matrix of a cpu_matmul_parts call: out[t * n_rows + r] = dot(weight row r, x token t). */
typedef struct cpu_matmul_part {
    float *out;
    const float *weight; /* (n_rows, n_cols) row-major */
    int32_t n_rows;
} cpu_matmul_part;

#define CPU_MATMUL_PARTS_MAX 4

/* cpu_matmul for n_parts matrices of one input (q/k/v, gate/up) in one parallel region (more than
 * CPU_MATMUL_PARTS_MAX: one region per group of that many): one fork and join instead of n_parts, and the threads share out the blocks of all the parts, so
 * none waits at the end of a small one. Every output element gets the same bits as from cpu_matmul. */
void cpu_matmul_parts(const cpu_matmul_part *parts, int32_t n_parts, const float *x, int32_t n_tokens,
                      int32_t n_cols, int n_threads, float *scratch);

/* Floats of the scratch cpu_matmul needs for n_cols columns (any number of tokens): the AVX-512 path
 * copies each pass's inputs there, pairs of tokens interleaved. */
size_t cpu_matmul_scratch_floats(int32_t n_cols);

/* out = x * rsqrt(mean(x^2) + eps) * weight over one row of n elements (out may alias x).
 * The mean is accumulated in double; the rest in float32, in transformers' order. */
void cpu_rmsnorm(float *out, const float *x, const float *weight, int32_t n, float eps);

/* Rotate-half RoPE of one head in place: x * cos + cat(-x2, x1) * sin. */
void cpu_rope_apply(float *x, const float *cos_table, const float *sin_table, int32_t head_dim);

/* The kernels' instruction-set paths, narrowest first. */
typedef enum cpu_ops_path { CPU_OPS_PATH_PORTABLE, CPU_OPS_PATH_AVX2, CPU_OPS_PATH_AVX512 } cpu_ops_path;

/* Tests only: the kernels take no path wider than `most` (default CPU_OPS_PATH_AVX512, i.e. the widest the
 * CPU has), to check that every path gives the same bits. Call it between forwards, never during one. */
void cpu_ops_limit_path(cpu_ops_path most);

/* x[i] = silu(gate[i]) * up[i], stored into gate; parallel over elements for large n. */
void cpu_swiglu(float *gate, const float *up, size_t n, int n_threads);

#endif

/* float32 kernels of the CPU reference backend.
 *
 * Two summation orders, each fixed whatever the batch, the chunking of a prompt (decode, prefill, a
 * recomputation after preemption) or the thread count, so that a sequence's results are bit-identical however
 * it is scheduled (tests/engine/engine_stress_test.c checks it):
 * - Products with packed weights (every linear layer's; cpu_matmul_packed): each output sums its products in
 *   column order, one fused multiply-add each, as the loop `s = fmaf(w[k], x[k], s)` does. The 16 rows of a
 *   panel sit in vector lanes, so no lane needs another's sum.
 * - Row-major products (the lm_head; cpu_matmul) and dot products (attention scores; cpu_dot): eight lanes, lane
 *   l accumulating the elements k with k % 8 == l, the lanes added in a fixed tree, then the remaining n % 8
 *   elements in order.
 * The portable, AVX2 (with FMA) and AVX-512 paths (chosen at run time) perform the very same operations lane by
 * lane (they differ only in how many tokens share a pass over the weights), so they give the same bits.
 *
 * These orders are why the products are not a BLAS's: sgemm's order depends on the shape of the call (its
 * micro-kernels split the k loop differently for different token counts), so a token's bits would change
 * with the chunking of its prompt.
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

/* out[r] = cpu_dot(a, b + r * b_stride, n) for r < n_rows, the same bits, four rows at a time (the attention's
 * scores over one cache block, whose positions' rows are b_stride floats apart). */
void cpu_dot_rows(float *out, const float *a, const float *b, size_t b_stride, int32_t n_rows, int32_t n);

/* out[i] += p * v[i] for i < n, a multiply then an add each (the attention's weighted sum of V). */
void cpu_add_scaled(float *out, float p, const float *v, int32_t n);

/* The lm_head's product: out[t * n_rows + r] = dot(weight[r * n_cols ..], x[t * n_cols ..]) for t < n_tokens,
 * r < n_rows. weight is (n_rows, n_cols) row-major (PyTorch Linear layout); parallel over blocks of rows, each
 * block's weights read once for up to 64 tokens. scratch holds cpu_matmul_scratch_floats(n_cols) floats. */
void cpu_matmul(float *out, const float *x, const float *weight, int32_t n_tokens, int32_t n_rows,
                int32_t n_cols, int n_threads, float *scratch);

/* One matrix of a cpu_matmul_packed_parts call: out[t * n_rows + r] = weight row r times x token t. */
typedef struct cpu_matmul_part {
    float *out;
    const float *weight; /* (n_rows, n_cols), packed (cpu_pack_rows) */
    int32_t n_rows;
} cpu_matmul_part;

#define CPU_MATMUL_PARTS_MAX 4


/* Rows per panel of a packed weight. */
#define CPU_PANEL_ROWS 16

/* Floats of an (n_rows, n_cols) weight packed for cpu_matmul_packed: whole panels, the last one padded. */
size_t cpu_packed_floats(int32_t n_rows, int32_t n_cols);

/* Packs a row-major (n_rows, n_cols) weight into panels of CPU_PANEL_ROWS rows, each stored column by column:
 * element (r, k) at (r / 16) * 16 * n_cols + k * 16 + r % 16; a last panel's missing rows are zeros.
 * packed holds cpu_packed_floats(n_rows, n_cols) floats. */
void cpu_pack_rows(float *packed, const float *weight, int32_t n_rows, int32_t n_cols);

/* out[t * n_rows + r] = the column-order sum of packed row r times x token t, for t < n_tokens, r < n_rows.
 * Parallel over panels; each panel's columns are read once for up to 64 tokens. scratch holds
 * cpu_matmul_packed_scratch_floats(n_cols) floats (the tokens' inputs, rearranged per pass). */
void cpu_matmul_packed(float *out, const float *x, const float *packed, int32_t n_tokens, int32_t n_rows,
                       int32_t n_cols, int n_threads, float *scratch);

/* cpu_matmul_packed for n_parts packed matrices of one input (q/k/v, gate/up) in one parallel region (more than
 * CPU_MATMUL_PARTS_MAX: one region per group of that many): one fork and join instead of n_parts, and the
 * threads share out the panels of all the parts, so none waits at the end of a small one. */
void cpu_matmul_packed_parts(const cpu_matmul_part *parts, int32_t n_parts, const float *x, int32_t n_tokens,
                             int32_t n_cols, int n_threads, float *scratch);

/* Floats of the scratch cpu_matmul_packed needs for n_cols columns (any number of tokens). */
size_t cpu_matmul_packed_scratch_floats(int32_t n_cols);

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

/* x[i] = e^(x[i] - shift) for i < n (the softmax's exponentials), vectorised; within about 1 ulp of expf, the same bits
 * on every path and for every n (cpu_ops.c's exp_lanes). */
void cpu_exp_shifted(float *x, size_t n, float shift);

/* x[i] = silu(gate[i]) * up[i], stored into gate, with cpu_exp_shifted's exponential; parallel over elements for large
 * n. */
void cpu_swiglu(float *gate, const float *up, size_t n, int n_threads);

#endif

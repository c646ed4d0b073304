/* The index of the CUDA backend's kernels: every operation family as plain C entry points, for the backend's
 * paths (prefill, single-stream decode, batched decode) and for the op tests in tests/cuda (which are C and
 * include no CUDA header). One file per family, each with its kernels first and then its launchers:
 *
 *   cuda_util.cu             device memory, copies and timers for the tests and the bench (kite_cuda_*)
 *   embed.cu                 token embedding                      cuda_embed
 *   rmsnorm.cu               RMSNorm, residual add + RMSNorm      cuda_rmsnorm, cuda_residual_rmsnorm
 *   swiglu.cu                SwiGLU of gate/up                    cuda_swiglu
 *   qk_norm_rope.cu          Q/K norm, RoPE, KV append (prefill)  cuda_qk_norm_rope_kv
 *   kv_fp8.cu                the fp8 KV cache: quantization, the  cuda_kv_fp8_quantize, cuda_kv_fp8_dequantize_blocks
 *                            prefill's bf16 view                  (kv_fp8.cuh: the warp's part, the cache's offsets)
 *   attention_prefill.cu     flash attention over the paged cache cuda_attention_prefill
 *   attention_decode.cu      split-K decode attention             cuda_attention_decode(_rows, _prepared)
 *   attention_decode_bulk.cu cluster decode attention, bulk-fed   cuda_attention_decode_bulk(_rows)
 *   gemv.cu                  decode matrix-vector products        cuda_gemv, cuda_gemv_fp8
 *   fp8_weights.cu           fp8 weights: quantize, dequantize    cuda_fp8_quantize_weight, ..._dequantize_weight
 *   lm_head_screen.cu        greedy lm_head through an int8 copy  cuda_lm_head_screened_argmax, ..._screen_build
 *   gemm_rows.cu             batched products up to 32 rows       cuda_gemm_rows, cuda_gemm_rows_fp8
 *   gemm.cu                  cuBLASLt products (prefill, batches) cuda_gemm_bf16(_split)
 *   argmax.cu                argmax rows, ids to the host         cuda_argmax_rows, cuda_publish_ids,
 *                                                                 cuda_publish_and_advance
 *   top_candidates.cu        top-k candidates for the sampler     cuda_top_candidates
 * and the device-side helpers they share: cuda_common.cuh (error checks, bf16, reductions, PDL, launches),
 * decode_attention.cuh and decode_cluster.cuh (the decode attentions), gemv_task.cuh (the GEMV's task and staging),
 * bulk_copy.cuh (bulk copies and mbarriers).
 *
 * Device pointers are plain pointers or void *; `stream` is a cudaStream_t passed as void * (NULL: the default
 * stream); `use_pdl` launches with programmatic dependent launch (cuda_common.cuh). Every function returns KITE_OK
 * or KITE_ERROR_BACKEND with a message naming the failing call.
 *
 * Tensors are row-major. bf16 buffers are void * (2 bytes per element).
 */
#ifndef KITE_BACKEND_CUDA_OPS_H
#define KITE_BACKEND_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kite.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device memory, for tests and the bench ---------------------------------------------------- */
int kite_cuda_device_count(void);
kite_status kite_cuda_malloc(void **pointer, size_t bytes);
kite_status kite_cuda_free(void *pointer);
kite_status kite_cuda_copy_to_device(void *dst, const void *src, size_t bytes);
kite_status kite_cuda_copy_to_host(void *dst, const void *src, size_t bytes);
kite_status kite_cuda_memset(void *dst, int value, size_t bytes);
kite_status kite_cuda_synchronize(void);
/* Elapsed milliseconds between two points on the default stream: start, then stop (stop synchronises). */
kite_status kite_cuda_timer_start(void **timer);
kite_status kite_cuda_timer_stop(void *timer, float *milliseconds);

/* ---- the KV cache of one layer -------------------------------------------------------------------
 * Blocks of block_size positions, each block holding K and V of every kv head (so prefix sharing, preemption and
 * freeing move whole blocks whatever the dtype):
 *   bf16: [K | V][kv_head][slot][head_dim] bf16; cuda_kv_block_bytes = 2 n_kv_heads block_size head_dim 2.
 *   fp8:  codes [K | V][kv_head][slot][head_dim] E4M3 (1 byte), then scales [K | V][kv_head][slot] float32
 *         (quant/fp8_kv.h: one per (token, kv head), value = code x scale); cuda_kv_block_bytes =
 *         2 n_kv_heads block_size (head_dim + 4).
 * Block b of the layer starts at base + b * cuda_kv_block_bytes(kv) bytes. */
typedef struct cuda_kv_layer {
    void *base;
    int32_t block_size;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t n_blocks; /* blocks in the layer's cache (the extent of the prefill attention's tensor map); 0: unknown */
    int32_t dtype;    /* kite_kv_cache_dtype: KITE_KV_CACHE_BF16 (0, the default of a zeroed struct) or _FP8 */
} cuda_kv_layer;

/* Bytes of one block of a layer's cache in kv's dtype (above); for the host and, in the kernels, the device. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline size_t cuda_kv_block_bytes(cuda_kv_layer kv) {
    const size_t rows = 2 * (size_t)kv.n_kv_heads * (size_t)kv.block_size;
    return kv.dtype == KITE_KV_CACHE_FP8 ? rows * ((size_t)kv.head_dim + 4) : rows * (size_t)kv.head_dim * 2;
}

/* The sequences of a step batch, on the device (see backend.h step_batch). */
typedef struct cuda_seq_meta {
    const int32_t *token_start;       /* [n_seqs + 1] */
    const int32_t *context_len;       /* [n_seqs] */
    const int32_t *block_table_start; /* [n_seqs] offset of the sequence's table in block_tables */
    const int32_t *block_tables;      /* concatenated block tables */
    int32_t n_seqs;
    int32_t max_new_tokens; /* the most new tokens of any sequence */
} cuda_seq_meta;

/* x[t, :] = float(table[id, :]) for t < n_tokens, id = ids[t], or fallback[t] where ids[t] is negative (fallback
 * may be NULL when no id is). table bf16 (vocab, hidden); x fp32. */
kite_status cuda_embed(const void *table, const int32_t *ids, const int32_t *fallback, float *x, int n_tokens,
                       int hidden, void *stream, int use_pdl);

/* out[r, :] = bf16(x[src, :] * rsqrt(mean(x[src, :]^2) + eps) * weight), src = row_index ? row_index[r] : r.
 * x fp32 (rows, dim); weight fp32 (dim); out bf16 (n_rows, dim). dim % 4 == 0. */
kite_status cuda_rmsnorm(const float *x, const float *weight, void *out, const int32_t *row_index, int n_rows,
                         int dim, float eps, void *stream);

/* x[r, :] += partials[0][r, :] + ... + partials[n_partials - 1][r, :] (each partial (n_rows, dim) fp32, in order),
 * then out[r, :] = bf16(rmsnorm(x[r, :]) * weight) as cuda_rmsnorm: the split product's reduction, the residual add
 * and the next norm in one kernel. dim % 4 == 0, 1 <= n_partials <= 16. */
kite_status cuda_residual_rmsnorm(float *x, const float *partials, int n_partials, const float *weight, void *out,
                                  int n_rows, int dim, float eps, void *stream);

/* out[t, i] = silu(gate_up[t, i]) * gate_up[t, intermediate + i]; bf16 in and out; intermediate % 8 == 0. */
kite_status cuda_swiglu(const void *gate_up, void *out, int n_tokens, int intermediate, void *stream);

/* Per token t: for each q head, q_out = rope(rmsnorm(q) * q_norm); for each kv head, the cache at slot
 * slots[t] (= block * block_size + slot) receives K = rope(rmsnorm(k) * k_norm) and V = v.
 * qkv: (n_tokens, (n_heads + 2 n_kv_heads) * head_dim), q then k then v; fp32 when io_f32 else bf16.
 * q_out: (n_tokens, n_heads, head_dim), same dtype as qkv. rope_cos / rope_sin: (positions, head_dim / 2)
 * fp32, rotate-half convention. head_dim == 128. An fp8 layer (kv.dtype) receives each K and V vector as codes and
 * a scale (quant/fp8_kv.h, of the vector rounded to bf16). */
kite_status cuda_qk_norm_rope_kv(const void *qkv, void *q_out, int io_f32, const int32_t *positions,
                                 const int32_t *slots, const float *q_norm, const float *k_norm,
                                 const float *rope_cos, const float *rope_sin, cuda_kv_layer kv, int n_tokens,
                                 int n_heads, float eps, void *stream, int use_pdl);

/* The fp8 KV cache's quantization (quant/fp8_kv.h, bit for bit): x bf16 (n_vectors, head_dim) -> codes
 * (n_vectors, head_dim) E4M3 and scales (n_vectors) float32. head_dim == 128. */
kite_status cuda_kv_fp8_quantize(const void *x, uint8_t *codes, float *scales, int n_vectors, int head_dim,
                                 void *stream);
/* The prefill attention's view of an fp8 layer (kv_fp8.cu): block table entries [first_entry, first_entry +
 * n_entries) of `tables` (blocks of the fp8 layer `kv`), each block whole, dequantized (bf16(code x scale)) into
 * block entry - first_entry of `out`, a bf16 layer of the same block_size and kv heads. head_dim == 128. */
kite_status cuda_kv_fp8_dequantize_blocks(cuda_kv_layer kv, const int32_t *tables, int first_entry, int n_entries,
                                          void *out, void *stream);

/* Causal attention of each sequence's new tokens over its whole context in the paged cache (the new
 * keys already appended). q, out: bf16 (n_tokens, n_heads, head_dim); head_dim == 128; GQA with
 * n_heads % n_kv_heads == 0. fp32 softmax; tensor cores. A bf16 cache only: the prefill path hands it an fp8
 * cache's bf16 view (cuda_kv_fp8_dequantize_blocks). */
kite_status cuda_attention_prefill(const void *q, void *out, cuda_kv_layer kv, cuda_seq_meta seqs, int n_heads,
                                   float scale, void *stream);

/* One new token of one sequence (the decode step): its query heads and new K are RMS-normalised and
 * rotated here (position context_len[0] - 1), the new K and V appended to the cache at that position
 * (block_table[position / block_size]), then it attends to all context_len[0] positions, split over
 * n_splits blocks per kv head (a fixed grid for any context length; splits of at least 32 positions)
 * and combined in the last block to finish. qkv: fp32 ((n_heads + 2 n_kv_heads) * head_dim), q then k
 * then v; out: fp32 (n_heads, head_dim). workspace: cuda_attention_decode_workspace() bytes; counters:
 * n_heads unsigned ints, zero before the first call (each call leaves them zero). The cache may be bf16 or fp8
 * (kv.dtype: the fp8 one is read as codes and scales directly, and the new K / V appended quantized). */
size_t cuda_attention_decode_workspace(int n_heads, int head_dim, int n_splits);
/* How many blocks of the split-K attention (cuda_attention_decode, cuda_attention_decode_rows) an SM holds for
 * n_heads query heads over n_kv_heads and a cache of kv_dtype (the occupancy of the kernel that runs them): size
 * n_splits so that n_kv_heads x head groups x sequences x n_splits blocks are one wave. */
kite_status cuda_attention_decode_blocks_per_sm(int n_heads, int n_kv_heads, int kv_dtype, int *blocks);
kite_status cuda_attention_decode(const float *qkv, float *out, cuda_kv_layer kv, const int32_t *block_table,
                                  const int32_t *context_len, const float *q_norm, const float *k_norm,
                                  const float *rope_cos, const float *rope_sin, float eps, int n_heads, float scale,
                                  int n_splits, void *workspace, unsigned *counters, void *stream, int use_pdl);

/* The same step with the splits of a kv head as the blocks of one thread-block cluster (8 or 16 blocks, one per
 * SM) combined through distributed shared memory instead of a global workspace, the K/V tiles fed by bulk copies
 * from a producer warp (attention_decode_bulk.cu): faster than the split-K kernel at short context, slower at long.
 * Same inputs and output as cuda_attention_decode, no workspace. cuda_attention_decode_bulk_size() gives the
 * cluster size the device can run for this shape with all clusters resident at once (16, else 8), or 0 where it
 * cannot. bf16 caches only: for an fp8 one the sizes are 0 and the launchers refuse it (KITE_ERROR_UNSUPPORTED). */
int cuda_attention_decode_bulk_size(int n_heads, cuda_kv_layer kv);
kite_status cuda_attention_decode_bulk(const float *qkv, float *out, cuda_kv_layer kv, const int32_t *block_table,
                                       const int32_t *context_len, const float *q_norm, const float *k_norm,
                                       const float *rope_cos, const float *rope_sin, float eps, int n_heads,
                                       float scale, int cluster_size, void *stream, int use_pdl);
/* Diagnostics: how many clusters of cluster_size blocks of the bulk-fed kernel (batched: its batched variant) the
 * device holds at once, and how many blocks per SM (cudaOccupancy*; 0 where the size is refused). */
void cuda_attention_decode_bulk_capacity(int n_heads, cuda_kv_layer kv, int cluster_size, int batched, int *clusters,
                                         int *blocks_per_sm);
/* The bulk-copy fed kernel for the n_seqs sequences of a batched decode step, inputs and output as
 * cuda_attention_decode_rows (below), no workspace: a cluster of cluster_size blocks (1, 2, 4, 8 or 16) per
 * (sequence, kv head, head group). cuda_attention_decode_bulk_rows_size() gives the largest size at which all
 * clusters of n_seqs sequences are resident at once (bf16 output), 0 where none is. */
int cuda_attention_decode_bulk_rows_size(int n_heads, cuda_kv_layer kv, int n_seqs);
kite_status cuda_attention_decode_bulk_rows(const float *qkv, void *out, int out_bf16, cuda_kv_layer kv,
                                            const int32_t *block_tables, const int32_t *table_start,
                                            const int32_t *context_lens, const float *q_norm, const float *k_norm,
                                            const float *rope_cos, const float *rope_sin, float eps, int n_heads,
                                            float scale, int n_seqs, int cluster_size, void *stream, int use_pdl);
/* cuda_attention_decode for B sequences of a batched decode step (n_seqs <= 256): sequence s reads QKV row s of
 * qkv (n_seqs, (n_heads + 2 n_kv_heads) * head_dim), its context length context_lens[s] and its block
 * table at block_tables + table_start[s], and writes output row s of out (n_seqs, n_heads * head_dim),
 * fp32, or bf16 when out_bf16. Grid (kv head, split, sequence x head group). workspace:
 * n_seqs * cuda_attention_decode_workspace() bytes; counters: n_seqs * n_heads, zero before the first
 * call (each call leaves them zero). */
kite_status cuda_attention_decode_rows(const float *qkv, void *out, int out_bf16, cuda_kv_layer kv,
                                       const int32_t *block_tables, const int32_t *table_start,
                                       const int32_t *context_lens, const float *q_norm, const float *k_norm,
                                       const float *rope_cos, const float *rope_sin, float eps, int n_heads,
                                       float scale, int n_seqs, int n_splits, void *workspace, unsigned *counters,
                                       void *stream, int use_pdl);

/* cuda_attention_decode_rows for the one-token sequences of a prefill-path step, whose query heads are already
 * normalised and rotated and whose new K and V are already in the cache (cuda_qk_norm_rope_kv): q bf16 (n_seqs,
 * n_heads, head_dim), row s sequence s's; out bf16 (n_seqs, n_heads * head_dim). Block tables, context lengths,
 * workspace and counters as cuda_attention_decode_rows; bf16 or fp8 caches (the fp8 one read directly). */
kite_status cuda_attention_decode_prepared(const void *q, void *out, cuda_kv_layer kv, const int32_t *block_tables,
                                           const int32_t *table_start, const int32_t *context_lens, int n_heads,
                                           float scale, int n_seqs, int n_splits, void *workspace, unsigned *counters,
                                           void *stream);

/* Decode matrix-vector products: weight bf16 (rows, cols), x fp32 (cols), 16-byte loads, each weight
 * read once. The input is x, or rmsnorm(x) * norm_weight when norm_weight is not NULL. Epilogues:
 *   STORE   y[r] = w_r . in                                   (rows outputs)
 *   ADD     y[r] += w_r . in                                  (the residual add)
 *   SWIGLU  y[i] = silu(w_i . in) * (w_{i + rows/2} . in)      (rows/2 outputs; gate rows then up rows)
 *   ARGMAX  y[r] = w_r . in, and argmax_out[0] = the lowest r of the largest y[r] (-1 if a y[r] is NaN or +inf)
 *   ADD_SETTLED  as ADD, for a y last written before the kernel launched just before this one: under PDL
 *           the old y is read before waiting on that kernel (one memory round trip less at the end).
 *           (When kernel N runs at all, kernel N - 2 is complete: N - 1 signals its dependents only after
 *           its own wait on N - 2.) cuda_gemv and cuda_gemm_rows.
 * cols % 8 == 0. ARGMAX needs cuda_gemv_argmax_workspace(rows) bytes of workspace. */
enum { CUDA_GEMV_STORE = 0, CUDA_GEMV_ADD = 1, CUDA_GEMV_SWIGLU = 2, CUDA_GEMV_ARGMAX = 3, CUDA_GEMV_ADD_SETTLED = 4 };
size_t cuda_gemv_argmax_workspace(int rows);
kite_status cuda_gemv(const void *weight, const float *x, const float *norm_weight, float eps, float *y, int rows,
                      int cols, int epilogue, void *workspace, int32_t *argmax_out, void *stream, int use_pdl);
/* cuda_gemv over fp8 E4M3 weights (rows x cols codes) with float32 block scales w_scale [ceil(rows / 128)][scale_ld]
 * (w = code x scale; quant/fp8.h), the input staying fp32 (W8A16). cols % 16 == 0; every epilogue but ARGMAX. */
kite_status cuda_gemv_fp8(const void *weight, const float *w_scale, int scale_ld, const float *x,
                          const float *norm_weight, float eps, float *y, int rows, int cols, int epilogue, void *stream,
                          int use_pdl);

/* fp8 weights (fp8_weights.cu). cuda_fp8_quantize_weight: w (rows, cols; bf16) into codes q (rows, cols) and
 * scales [ceil(rows / 128)][scale_ld] exactly as quant/fp8.h's fp8_quantize_blocks; a non-finite weight sets
 * *nonfinite (device memory) to 1 and leaves its block unwritten. cuda_fp8_dequantize_weight: out (rows, cols;
 * bf16) = code x scale rounded to nearest even; cols % 8 == 0. */
kite_status cuda_fp8_quantize_weight(const void *w, int rows, int cols, void *q, float *scale, int scale_ld,
                                     int *nonfinite, void *stream);
kite_status cuda_fp8_dequantize_weight(const void *q, const float *scale, int scale_ld, int rows, int cols, void *out,
                                       void *stream);

/* Greedy decode's lm_head by screening (lm_head_screen.cu): out[0] = the id cuda_gemv's ARGMAX gives for
 * rmsnorm(x) * norm_weight against weight (rows, cols; bf16), bit for bit, reading an int8 copy of the matrix and then
 * only the bf16 rows that can hold the argmax. No logits are written (tests only, else NULL / 0: logits, each
 * candidate row's exact logit; bounds, rows x (approx, bound) pairs, the screen's estimate and its proven distance to
 * the exact logit; all_rows, every row a candidate). The screen is one device allocation of
 * cuda_lm_head_screen_bytes, filled once by cuda_lm_head_screen_build from the weight. A norm is required;
 * cuda_lm_head_screen_fits says which shapes the kernels take (cols % 16 == 0). candidates: how many rows the last
 * screened argmax read whole (a synchronous copy; for tests and measurements). */
int cuda_lm_head_screen_fits(int rows, int cols);
size_t cuda_lm_head_screen_bytes(int rows, int cols);
kite_status cuda_lm_head_screen_build(const void *weight, int rows, int cols, void *screen, void *stream);
kite_status cuda_lm_head_screened_argmax(const void *weight, void *screen, const float *x, const float *norm_weight,
                                         float eps, int rows, int cols, int32_t *out, float *logits, float *bounds,
                                         int all_rows, void *stream, int use_pdl);
kite_status cuda_lm_head_screen_candidates(const void *screen, int rows, int cols, unsigned *candidates);

/* Batched decode products for n_rows <= 32 sequences (tensor cores, each weight read once per step):
 * y[b, r] = w_r . in_b with in_b = x[b, :] ((n_rows, cols), fp32, or bf16 when x_bf16), or
 * rmsnorm(x[b, :]) * norm_weight when norm_weight is not NULL; the input is rounded to bf16. The CUDA_GEMV_*
 * epilogues per row b: y is (n_rows, rows), or (n_rows, rows / 2) for SWIGLU, fp32, or bf16 when y_bf16;
 * ARGMAX stores the logits and argmax_out[b] (ties: the lowest id) and needs
 * cuda_gemm_rows_argmax_workspace() bytes of workspace. cols % 8 == 0. A bf16 input is for ADD or ARGMAX without a
 * norm (o_proj, down; the lm_head of rows normalised already), a bf16 output for SWIGLU. The staged input must fit in
 * shared memory: cuda_gemm_rows_fits(n_rows, cols). */
size_t cuda_gemm_rows_argmax_workspace(void);
int cuda_gemm_rows_fits(int n_rows, int cols);
kite_status cuda_gemm_rows(const void *weight, const void *x, int x_bf16, const float *norm_weight, float eps, void *y,
                           int y_bf16, int n_rows, int rows, int cols, int epilogue, void *workspace,
                           int32_t *argmax_out, void *stream, int use_pdl);
/* cuda_gemm_rows over fp8 E4M3 weights (rows x cols codes) with float32 block scales w_scale [ceil(rows / 128)][scale_ld]
 * (w = code x scale; quant/fp8.h), W8A16 for batched decode: every code read once for all n_rows rows, the products
 * as cuda_gemm_rows forms them (the input rounded to bf16 after the norm, fp32 accumulation) on the weights' exact
 * values. cols % 16 == 0; every epilogue but ARGMAX (the lm_head stays bf16). */
kite_status cuda_gemm_rows_fp8(const void *weight, const float *w_scale, int scale_ld, const void *x, int x_bf16,
                               const float *norm_weight, float eps, void *y, int y_bf16, int n_rows, int rows, int cols,
                               int epilogue, void *stream, int use_pdl);

/* What the host sampler needs of each logits row for top-k sampling (sampler_top_row, sampler.h), computed
 * on the device (top_candidates.cu): top_logits / top_ids [n_rows][k] get the k best finite logits (logit
 * descending, ties by ascending id), stats[r] the rest. n is min(k, n_finite), 0 when the row holds a NaN or
 * +inf (bad_index: the first) or no finite logit. 0 < k <= CUDA_TOP_MAX; workspace: the bytes
 * cuda_top_candidates_workspace(n_rows, vocab) gives (any k). cuda_top_candidates_fits says whether the
 * vocabulary and k are within what the merge holds (64 slices of 4,096 logits, 3,072 candidates); otherwise
 * the call is refused and the host reads rows whole. */
#define CUDA_TOP_MAX 64
typedef struct cuda_row_top {
    float max_logit;
    int32_t n_finite;
    int32_t n; /* -1: not ranked on the device (read_top's rows when cuda_top_candidates_fits is false) */
    int32_t bad_index;
    double log_sum_exp; /* log(sum_i exp(logit_i - max_logit)) */
} cuda_row_top;
size_t cuda_top_candidates_workspace(int n_rows, int vocab);
int cuda_top_candidates_fits(int vocab, int k);
kite_status cuda_top_candidates(const float *logits, int n_rows, int vocab, int k, float *top_logits, int32_t *top_ids,
                                cuda_row_top *stats, void *workspace, void *stream);

/* ids[r] = argmax_v logits[r, v] (ties: the lowest v; -1 for a row holding a NaN or +inf, or no finite logit).
 * logits fp32 (n_rows, vocab). */
kite_status cuda_argmax_rows(const float *logits, int32_t *ids, int n_rows, int vocab, void *stream);
/* ring[(*parity & 1) * n + i] = ids[i] for i < n: a step's ids into one of two slots of mapped host memory. */
kite_status cuda_publish_ids(const int32_t *ids, int n, const int32_t *parity, int32_t *ring, void *stream,
                             int use_pdl);

/* The single-stream decode step's values in device memory that move by one position per step (the block table
 * they index, table_entries long, stays as the host copied it). */
typedef struct {
    int32_t *position, *slot, *context;
    const int32_t *table;
    int32_t block_size, table_entries;
} cuda_decode_step;
/* cuda_publish_ids for one id with the step's own position as the parity, then the step moved on to the next
 * position p = position + 1: context + 1, slot = table[p / block_size] * block_size + p % block_size (left as it
 * was where that block is past table_entries: the host copies a longer table then). So the next step
 * finds on the device the values the host would copy, and the host copies only when they differ. */
kite_status cuda_publish_and_advance(const int32_t *id, cuda_decode_step step, int32_t *ring, void *stream,
                                     int use_pdl);

/* Prefill GEMM through cuBLASLt: Y (n, m) = X (n, k) . W (m, k)^T + beta * Y. X, W bf16; Y bf16 when
 * out_f32 == 0, fp32 otherwise (beta only with fp32). fp32 accumulation; the algorithm is chosen by the
 * heuristic once per shape and cached in `gemm` (cuda_gemm_create). */
typedef struct cuda_gemm cuda_gemm;
kite_status cuda_gemm_create(cuda_gemm **out);
void cuda_gemm_destroy(cuda_gemm *gemm);
kite_status cuda_gemm_bf16(cuda_gemm *gemm, const void *x, const void *w, void *y, int out_f32, float beta, int n,
                           int m, int k, void *stream);
/* The same product split along k into `slices` equal slices (k % (8 * slices) == 0), each written as an fp32
 * partial: partials[s] (n, m) = X[:, slice s] . W[:, slice s]^T. Their sum is X . W^T (cuda_residual_rmsnorm adds
 * it to the residual stream). One launch; the split gives small-n products more blocks without cuBLASLt's
 * separate reduction kernel. */
kite_status cuda_gemm_bf16_split(cuda_gemm *gemm, const void *x, const void *w, float *partials, int slices, int n,
                                 int m, int k, void *stream);

#ifdef __cplusplus
}
#endif

#endif

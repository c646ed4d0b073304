/* Extra entry points of the CUDA backend for its tests and bench (plain C): they reach the paths that the
 * defaults leave unused (no graph, no PDL, the prefill path for batches, the split-K attention at short context,
 * other batched splits) so that the tests can compare them with the default ones. */
#ifndef KITE_BACKEND_CUDA_BACKEND_INTERNAL_H
#define KITE_BACKEND_CUDA_BACKEND_INTERNAL_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Single-stream and batched decode: capture the step as a CUDA graph (use_graph) and chain its kernels with
 * programmatic dependent launch (use_pdl). Defaults: both on (KITE_CUDA_GRAPH=0 / KITE_CUDA_PDL=0 turn them off at
 * creation, src/util/options.h). Drops the captured graphs. */
kite_status cuda_backend_set_decode_options(backend *self, int use_graph, int use_pdl);
/* How many times single-stream decode has copied its step buffer to the device: every step, except steps chained
 * in place whose values the previous step's publish kernel already left there (cuda_publish_and_advance). */
unsigned long long cuda_backend_step_copies(backend *self);
/* Batched decode (2..BATCH_MAX sequences of one token each) through its graphs; off: the prefill path. On by
 * default (KITE_CUDA_BATCH=0 turns it off at creation). */
kite_status cuda_backend_set_batched_decode(backend *self, int on);
/* Single-stream decode attention: contexts up to max_context take the bulk-copy fed cluster kernel
 * (attention_decode_bulk.cu), longer ones the split-K kernel (1,024 by default); cuda_backend_attention_bulk gives
 * its cluster size, 0 where the device or shape cannot run it (then every context takes the split-K kernel). */
kite_status cuda_backend_set_bulk_max_context(backend *self, int32_t max_context);
int32_t cuda_backend_bulk_max_context(backend *self);
int cuda_backend_attention_bulk(backend *self);
/* Batched decode: buckets of up to max_rows rows take the bulk-fed cluster attention where all its clusters
 * fit at once, larger ones the split-K kernel (32 by default). Drops the captured batch graphs.
 * cuda_backend_batch_bulk_cluster gives the cluster size a step of `rows` rows uses, 0 for split-K. */
kite_status cuda_backend_set_batch_bulk_max_rows(backend *self, int32_t max_rows);
int32_t cuda_backend_batch_bulk_max_rows(backend *self);
int cuda_backend_batch_bulk_cluster(backend *self, int32_t rows);
/* With --weights fp8: batched buckets of up to max_rows rows take the W8A16 gemm_rows kernels (cuda_gemm_rows_fp8),
 * larger ones the per-layer dequantization into a bf16 scratch and cuBLASLt (32 by default; 0: always the scratch).
 * Drops the captured batch graphs. */
kite_status cuda_backend_set_batch_fp8_rows_max(backend *self, int32_t max_rows);
/* Batched decode through cuBLASLt (buckets past the gemm_rows kernels' 8 rows, up to max_rows rows): o_proj and
 * down as products split along k into `slices` partials, each added to the residual by the kernel that takes the
 * next RMSNorm; 0 or 1: cuBLASLt's own products and separate norms (default 4 slices up to 256 rows). Refused where
 * a slice is not a multiple of 8 columns of both products, or slices > 16. Drops the captured batch graphs and the
 * batch buffers. */
kite_status cuda_backend_set_batch_split(backend *self, int slices, int32_t max_rows);
/* Diagnostics for the bench: what the device holds at once of the bulk-fed cluster attention kernels, sizes 8 and
 * 16 (cudaOccupancyMaxActiveClusters and blocks per SM), written into buffer. */
const char *cuda_backend_cluster_report(backend *self, char *buffer, size_t capacity);
/* The KV cache as stored, for the tests: the bytes of one block of one layer (cuda_kv_block_bytes: bf16 rows, or fp8
 * codes then scales, kernels/cuda_ops.h), and block `block` of layer `layer` copied into out (bytes must be that
 * size). The copy waits for the backend's queued work. */
size_t cuda_backend_kv_block_bytes(backend *self);
kite_status cuda_backend_read_kv_block(backend *self, int32_t layer, int32_t block, void *out, size_t bytes);
/* Waits for all work queued by the backend (for timing). */
kite_status cuda_backend_synchronize(backend *self);

#ifdef __cplusplus
}
#endif

#endif

/* Extra entry points of the CUDA backend for its tests and bench (plain C). */
#ifndef KITE_BACKEND_CUDA_BACKEND_INTERNAL_H
#define KITE_BACKEND_CUDA_BACKEND_INTERNAL_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Single-stream decode: capture the step as a CUDA graph (use_graph) and chain its kernels with
 * programmatic dependent launch (use_pdl). Defaults: both on (env KITE_CUDA_GRAPH=0 / KITE_CUDA_PDL=0
 * turn them off at creation). Drops a captured graph. */
kite_status cuda_backend_set_decode_options(backend *self, int use_graph, int use_pdl);
/* Single-stream decode as one persistent kernel (decode_persistent.cu) instead of the graph path above,
 * where the model and device suit it. Off by default (env KITE_CUDA_PERSISTENT=1 turns it on at creation):
 * correct, but not yet faster (docs/notes-cuda.md). cuda_backend_persistent_decode says whether it is on. */
kite_status cuda_backend_set_persistent_decode(backend *self, int on);
int cuda_backend_persistent_decode(backend *self);
/* How many times single-stream decode has copied its step buffer to the device: every step, except steps chained
 * in place whose values the previous step's publish kernel already left there (cuda_publish_and_advance). */
unsigned long long cuda_backend_step_copies(backend *self);
/* Batched decode (2..BATCH_MAX sequences of one token each) through its graphs; off: the general path. On by
 * default (env KITE_CUDA_BATCH=0 turns it off at creation). */
kite_status cuda_backend_set_batched_decode(backend *self, int on);
/* Single-stream decode attention: contexts up to max_context run the cluster kernel
 * (attention_decode_cluster.cu), longer ones the split-K kernel (env KITE_CUDA_CLUSTER_MAX_CONTEXT sets it at
 * creation; 0 by default: the split-K kernel is the faster one, docs/notes-cuda.md). cuda_backend_attention_cluster
 * gives the cluster size in use, 0 where the device or shape cannot run the cluster kernel (then every context
 * takes the split-K kernel). */
kite_status cuda_backend_set_cluster_max_context(backend *self, int32_t max_context);
int32_t cuda_backend_cluster_max_context(backend *self);
int cuda_backend_attention_cluster(backend *self);
/* Contexts up to bulk_max_context take the bulk-copy fed cluster kernel (attention_decode_bulk.cu) instead
 * (env KITE_CUDA_BULK_MAX_CONTEXT at creation, 1,024 by default); cuda_backend_attention_bulk gives its cluster
 * size, 0 where the device cannot run it. */
kite_status cuda_backend_set_bulk_max_context(backend *self, int32_t max_context);
int32_t cuda_backend_bulk_max_context(backend *self);
int cuda_backend_attention_bulk(backend *self);
/* Batched decode: buckets of up to max_rows rows take the bulk-fed cluster attention where all its clusters
 * fit at once, larger ones the split-K kernel (env KITE_CUDA_BATCH_BULK_MAX_ROWS at creation). Drops the
 * captured batch graphs. cuda_backend_batch_bulk_cluster gives the cluster size a step of `rows` rows uses,
 * 0 for split-K. */
kite_status cuda_backend_set_batch_bulk_max_rows(backend *self, int32_t max_rows);
int32_t cuda_backend_batch_bulk_max_rows(backend *self);
int cuda_backend_batch_bulk_cluster(backend *self, int32_t rows);
/* Batched decode through cuBLASLt (buckets past KITE_CUDA_ROWS_MAX rows, up to max_rows rows): o_proj and down as
 * products split along k into `slices` partials, each added to the residual by the kernel that takes the next
 * RMSNorm; 0 or 1: cuBLASLt's own products and separate norms (default 4 slices up to 256 rows; env
 * KITE_CUDA_BATCH_SPLIT and KITE_CUDA_BATCH_SPLIT_MAX_ROWS at creation). Refused where a slice is not a multiple
 * of 8 columns of both products, or slices > 16. Drops the captured batch graphs and the batch buffers. */
kite_status cuda_backend_set_batch_split(backend *self, int slices, int32_t max_rows);
/* Diagnostics for the bench: what the device holds at once of each cluster attention kernel, sizes 8 and 16
 * (cudaOccupancyMaxActiveClusters and blocks per SM), written into buffer. */
const char *cuda_backend_cluster_report(backend *self, char *buffer, size_t capacity);
/* Parts of the decode graphs (single-stream, and batched up to 32 rows), for the bench's anatomy mode. */
enum {
    CUDA_DECODE_PART_EMBED = 1,
    CUDA_DECODE_PART_QKV = 2,
    CUDA_DECODE_PART_ATTENTION = 4,
    CUDA_DECODE_PART_O = 8,
    CUDA_DECODE_PART_GATE_UP = 16,
    CUDA_DECODE_PART_DOWN = 32,
    CUDA_DECODE_PART_LM_HEAD = 64,
};
/* Bench only: the graph path leaves out (skip_parts) or launches twice (twice_parts) the named parts of
 * every layer, so the time one part costs inside the graph is a difference of two runs. The tokens are
 * then meaningless; 0, 0 restores the real step. Drops a captured graph. */
kite_status cuda_backend_set_decode_anatomy(backend *self, unsigned skip_parts, unsigned twice_parts);
/* Waits for all work queued by the backend (for timing). */
kite_status cuda_backend_synchronize(backend *self);

/* The timeline diagnostic (builds with cmake -DKITE_TIMELINE=ON; elsewhere KITE_ERROR_UNSUPPORTED): from start to
 * stop, every block of the decode GEMVs and the split-K attention appends when it started, passed its PDL wait and
 * ended (global timer, ns) to a buffer of `capacity` records; stop writes them to `path` as raw records
 * (cuda_common.cuh, timeline_record) for bench/timeline_summary.py. */
kite_status cuda_timeline_start(unsigned capacity);
kite_status cuda_timeline_stop(const char *path, unsigned *n_records);

#ifdef __cplusplus
}
#endif

#endif

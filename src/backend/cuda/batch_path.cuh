/* The batched decode path's state (batch_path.cu): activations for the largest bucket seen, the step buffer, one
 * captured graph per bucket, and its tuning (the constants of cuda_backend.cu; the tests' setters change them). */
#ifndef KITE_BACKEND_CUDA_BATCH_PATH_CUH
#define KITE_BACKEND_CUDA_BATCH_PATH_CUH

#include "backend/cuda/cuda_core.cuh"

/* Graphs per bucket of rows; a step of B sequences runs in the smallest bucket >= B, the rows past B are dummies
 * (token 0, position 0, one position of context in the scratch KV block). The step buffer holds BATCH_MAX tokens,
 * BATCH_MAX context lengths, BATCH_MAX table offsets, then the block tables (entry 0: the scratch block). */
constexpr int N_BUCKETS = 8;
constexpr int32_t BUCKETS[N_BUCKETS] = {2, 4, 8, 16, 32, 64, 128, 256};
constexpr int32_t BATCH_MAX = 256;

enum { BATCH_TOKENS = 0, BATCH_CONTEXT = BATCH_MAX, BATCH_TABLE_START = 2 * BATCH_MAX, BATCH_TABLES = 3 * BATCH_MAX };

struct batch_state {
    bool enabled;     /* off (KITE_CUDA_BATCH=0): such steps take the prefill path */
    int rows_max;     /* buckets up to this many rows use the fused tensor-core kernels, larger ones cuBLASLt */
    int fp8_rows_max; /* the same with --weights fp8 (the W8A16 gemm_rows kernels) */
    int bulk_max_rows; /* buckets up to this many rows take the bulk-fed cluster attention, where it fits */
    int bulk_cluster[N_BUCKETS]; /* its cluster size per bucket (0: does not fit, split-K) */
    /* cuBLASLt buckets up to split_max_rows rows: o_proj and down as split-K partials (cuda_gemm_bf16_split) in
     * `split` slices, added to the residual by cuda_residual_rmsnorm together with the next norm (0: cuBLASLt's own
     * products and separate norms). */
    int split, split_max_rows;
    int lm_head_rows_max; /* the lm_head through gemm_rows up to this many rows (at most 32), else cuBLASLt */

    int32_t capacity; /* rows the buffers below hold */
    void *bytes;      /* one allocation for them */
    float *x, *qkv, *logits, *partials;
    bf16 *attention16, *normed, *gate_up, *act16;
    void *attention_ws, *argmax_ws;
    unsigned *counters;
    int32_t *ids;
    int32_t *step_device, *step_host;
    size_t step_ints;
    cudaEvent_t step_copied;
    cudaGraphExec_t graphs[N_BUCKETS];
    /* The step writes its bucket's ids into slot (row 0's context & 1) of this mapped host ring itself
     * (cuda_publish_ids), as the single-stream step does (B=32 +0.7% against a copy). */
    int32_t *publish_host, *publish_device; /* 2 x BATCH_MAX ints, mapped */
};

/* 2..BATCH_MAX sequences of one token each, all wanting logits: their logits rows into *kept. */
kite_status forward_batch(cuda_core *core, batch_state *bp, const step_batch *batch, step_tokens tokens,
                          kept_rows *kept);
/* Whether a split of o_proj and down into `slices` k slices fits the shapes (cuda_gemm_bf16_split). */
bool batch_split_fits(const qwen3_config *c, int slices);
/* The bulk-fed attention's cluster size for a bucket of `rows` rows, 0 for the split-K kernel. */
int batch_bulk_cluster(const batch_state *bp, int32_t rows);
kite_status batch_destroy_graphs(batch_state *bp);
/* Frees the activations (and the graphs that captured them): rows a batched step kept are gone with them. */
kite_status batch_release(const cuda_core *core, batch_state *bp);
void batch_free(batch_state *bp);

#endif

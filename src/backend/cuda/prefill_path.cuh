/* The prefill path's state (prefill_path.cu): activations and step metadata that grow to the largest step, and the
 * rows of logits it keeps. */
#ifndef KITE_BACKEND_CUDA_PREFILL_PATH_CUH
#define KITE_BACKEND_CUDA_PREFILL_PATH_CUH

#include "backend/cuda/cuda_core.cuh"

struct prefill_state {
    int32_t token_capacity;
    void *activation_bytes;
    float *x; /* (tokens, hidden) residual stream */
    bf16 *normed, *qkv, *q, *attention, *gate_up, *act;
    int32_t *meta_host, *meta_device; /* pinned / device: token ids, positions, slots, ... */
    size_t meta_capacity;             /* int32s */
    cudaEvent_t meta_copied;
    float *logits; /* (logits_rows, vocab) */
    int32_t logits_rows;
    /* With an fp8 KV cache: the prefill attention's bf16 view of the blocks it reads (prefill_path.cu), blocks of a
     * bf16 layer of the cache's block size, grown to the largest step's need (in bytes: kv_reserve may change the
     * block size). */
    bf16 *fp8_view;
    size_t fp8_view_bytes;
    /* The split-K decode attention's workspace and counters for the step's leading one-token sequences (the
     * decode rows of a mixed step), grown to the largest need; the counters stay zero between launches. */
    void *decode_ws;
    size_t decode_ws_bytes;
    unsigned *decode_counters;
    int32_t decode_counter_count;
};

/* Any step batch (prefill chunks, decode tokens of several sequences, mixed): its logits rows into *kept. */
kite_status forward_prefill(cuda_core *core, prefill_state *p, const step_batch *batch, step_tokens tokens,
                            kept_rows *kept);
void prefill_free(prefill_state *p);

#endif

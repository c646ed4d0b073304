/* The CUDA backend's general path, for any step batch (prefill chunks and decode tokens of several sequences):
 * cuBLASLt GEMMs, the tensor-core flash attention over the paged cache, an fp32 residual stream. */
#include "backend/cuda/cuda_backend_state.cuh"

#include <math.h>
#include <string.h>

kite_status forward_general(cuda_backend *b, const step_batch *batch, const int32_t *chained) {
    const qwen3_config *c = &b->config;
    const int32_t T = batch->n_tokens, S = batch->n_seqs, bs = b->kv_block_size;
    int32_t rows = 0;
    size_t table_ints = 0;
    int32_t max_new = 0;
    for (int32_t s = 0; s < S; s++) {
        rows += batch->seq_wants_logits[s] ? 1 : 0;
        table_ints += (size_t)KITE_CEIL_DIV(batch->seq_context_len[s], bs);
        const int32_t n_new = batch->seq_token_start[s + 1] - batch->seq_token_start[s];
        if (n_new > max_new) max_new = n_new;
    }
    KITE_TRY(ensure_tokens(b, T));
    if (rows > 0) KITE_TRY(ensure_logits(b, rows));
    const size_t n_ints = 3 * (size_t)T + (size_t)(S + 1) + 2 * (size_t)S + table_ints + (size_t)rows;
    KITE_TRY(ensure_meta(b, n_ints));
    CUDA_CHECK(cudaEventSynchronize(b->meta_copied)); /* the previous step's copy has left the host buffer */

    int32_t *h = b->meta_host;
    int32_t *ids = h, *positions = ids + T, *slots = positions + T, *token_start = slots + T;
    int32_t *ctx = token_start + S + 1, *table_start = ctx + S, *tables = table_start + S;
    int32_t *logit_rows = tables + table_ints;
    if (chained) /* the ids are copied on the device below */
        memset(ids, 0, (size_t)T * sizeof(int32_t));
    else
        memcpy(ids, batch->token_ids, (size_t)T * sizeof(int32_t));
    size_t table_at = 0;
    int32_t row = 0;
    for (int32_t s = 0; s < S; s++) {
        const int32_t start = batch->seq_token_start[s], n_new = batch->seq_token_start[s + 1] - start;
        const int32_t context = batch->seq_context_len[s], n_blocks = KITE_CEIL_DIV(context, bs);
        token_start[s] = start;
        ctx[s] = context;
        table_start[s] = (int32_t)table_at;
        memcpy(tables + table_at, batch->block_tables[s], (size_t)n_blocks * sizeof(int32_t));
        for (int32_t i = 0; i < n_new; i++) {
            const int32_t position = context - n_new + i;
            positions[start + i] = position;
            slots[start + i] = batch->block_tables[s][position / bs] * bs + position % bs;
        }
        table_at += (size_t)n_blocks;
        if (batch->seq_wants_logits[s]) logit_rows[row++] = start + n_new - 1;
    }
    token_start[S] = batch->seq_token_start[S];
    CUDA_CHECK(cudaMemcpyAsync(b->meta_device, h, n_ints * sizeof(int32_t), cudaMemcpyHostToDevice, b->stream));
    CUDA_CHECK(cudaEventRecord(b->meta_copied, b->stream));
    if (chained) /* one token per sequence: the previous step's argmax rows, in order */
        CUDA_CHECK(cudaMemcpyAsync(b->meta_device, chained, (size_t)T * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                   b->stream));

    int32_t *d = b->meta_device;
    const int32_t *d_ids = d, *d_positions = d + T, *d_slots = d + 2 * T, *d_token_start = d + 3 * T;
    const int32_t *d_ctx = d_token_start + S + 1, *d_table_start = d_ctx + S, *d_tables = d_table_start + S;
    const int32_t *d_logit_rows = d_tables + table_ints;
    cuda_seq_meta seqs;
    seqs.token_start = d_token_start;
    seqs.context_len = d_ctx;
    seqs.block_table_start = d_table_start;
    seqs.block_tables = d_tables;
    seqs.n_seqs = S;
    seqs.max_new_tokens = max_new;

    void *st = b->stream;
    const int hidden = c->hidden_size, inter = c->intermediate_size;
    const int qd = qwen3_q_dim(c), qkv_dim = qwen3_qkv_dim(c);
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
    KITE_TRY(cuda_embed(b->embed, d_ids, NULL, b->x, T, hidden, st, 0));
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &b->layers[l];
        const cuda_kv_layer kv = kv_layer(b, l);
        KITE_TRY(cuda_rmsnorm(b->x, L->input_norm, b->normed, NULL, T, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->normed, L->qkv, b->qkv, 0, 0.0f, T, qkv_dim, hidden, st));
        KITE_TRY(cuda_qk_norm_rope_kv(b->qkv, b->q, 0, d_positions, d_slots, L->q_norm, L->k_norm, b->rope_cos,
                                      b->rope_sin, kv, T, c->n_heads, eps, st, 0));
        KITE_TRY(cuda_attention_prefill(b->q, b->attention, kv, seqs, c->n_heads, scale, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->attention, L->o, b->x, 1, 1.0f, T, hidden, qd, st));
        KITE_TRY(cuda_rmsnorm(b->x, L->post_norm, b->normed, NULL, T, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->normed, L->gate_up, b->gate_up, 0, 0.0f, T, 2 * inter, hidden, st));
        KITE_TRY(cuda_swiglu(b->gate_up, b->act, T, inter, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->act, L->down, b->x, 1, 1.0f, T, hidden, inter, st));
    }
    if (rows > 0) {
        KITE_TRY(cuda_rmsnorm(b->x, b->final_norm, b->normed, d_logit_rows, rows, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->normed, b->lm_head, b->logits, 1, 0.0f, rows, c->vocab_size, hidden, st));
    }
    b->kept_logits = b->logits;
    b->kept_rows = rows;
    b->kept_decode = false;
    b->kept_batch = false;
    b->kept_published = NULL;
    return KITE_OK;
}

/* The CUDA backend's single-stream decode (one sequence, one token, logits wanted): GEMV kernels that read each
 * weight once, attention by the bulk-copy fed cluster kernel up to bulk_max_context (1,024), by the split-K kernel
 * beyond, lm_head + argmax on the device (for a
 * step asked for ids only, step_batch.ids_only, the lm_head screened through its int8 copy: lm_head_screen.cu),
 * captured as a CUDA graph (one per attention kernel and lm_head form) and replayed.
 * Per-step values (token, position, cache slot, context length, block table) live in device memory; the step's
 * last kernel moves them on by one position, so a step chained in place needs a copy from the host only where they
 * differ (a new cache block, a host token); kernels chain by programmatic dependent launch.
 */
#include "backend/cuda/cuda_backend_state.cuh"

#include <math.h>
#include <string.h>

namespace {

int decode_attention_kernel(const cuda_backend *b, int32_t context) {
    if (b->attention_bulk > 0 && context <= b->bulk_max_context) return DECODE_ATTENTION_BULK;
    return DECODE_ATTENTION_SPLIT;
}

/* ids_only: the lm_head screened (argmax only, no logits). */
kite_status decode_launches(cuda_backend *b, int attention, bool ids_only) {
    const qwen3_config *c = &b->config;
    void *st = b->stream;
    const int pdl = b->use_pdl ? 1 : 0;
    const int hidden = c->hidden_size, inter = c->intermediate_size;
    const int qd = qwen3_q_dim(c), qkv_dim = qwen3_qkv_dim(c);
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
    const int32_t *step = b->step_device;
    /* A negative token: the previous decode step's argmax (overlapped decode, forward_decode). */
    KITE_TRY(cuda_embed(b->embed, step + STEP_TOKEN, b->dec_token, b->dec_x, 1, hidden, st, 0));
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &b->layers[l];
        const cuda_kv_layer kv = kv_layer(b, l);
        KITE_TRY(cuda_gemv(L->qkv, b->dec_x, L->input_norm, eps, b->dec_qkv, qkv_dim, hidden, CUDA_GEMV_STORE, NULL,
                           NULL, st, pdl));
        if (attention == DECODE_ATTENTION_BULK)
            KITE_TRY(cuda_attention_decode_bulk(b->dec_qkv, b->dec_attention, kv, step + STEP_TABLE,
                                                step + STEP_CONTEXT, L->q_norm, L->k_norm, b->rope_cos, b->rope_sin,
                                                eps, c->n_heads, scale, b->attention_bulk, st, pdl));
        else
            KITE_TRY(cuda_attention_decode(b->dec_qkv, b->dec_attention, kv, step + STEP_TABLE, step + STEP_CONTEXT,
                                           L->q_norm, L->k_norm, b->rope_cos, b->rope_sin, eps, c->n_heads, scale,
                                           b->n_splits, b->dec_attention_ws, b->dec_counters, st, pdl));
        /* x was last written by the down projection three kernels back (or the embedding), and for the down
         * projection by o_proj two kernels back: ADD_SETTLED reads it before the PDL wait (measured: 0.674 vs
         * 0.684 ms per 0.6B token). */
        KITE_TRY(cuda_gemv(L->o, b->dec_attention, NULL, 0.0f, b->dec_x, hidden, qd, CUDA_GEMV_ADD_SETTLED, NULL, NULL,
                           st, pdl));
        KITE_TRY(cuda_gemv(L->gate_up, b->dec_x, L->post_norm, eps, b->dec_act, 2 * inter, hidden, CUDA_GEMV_SWIGLU,
                           NULL, NULL, st, pdl));
        KITE_TRY(cuda_gemv(L->down, b->dec_act, NULL, 0.0f, b->dec_x, hidden, inter, CUDA_GEMV_ADD_SETTLED, NULL, NULL,
                           st, pdl));
    }
    if (ids_only)
        KITE_TRY(cuda_lm_head_screened_argmax(b->lm_head, b->lm_head_screen, b->dec_x, b->final_norm, eps,
                                              c->vocab_size, hidden, b->dec_token, NULL, NULL, 0, st, pdl));
    else
        KITE_TRY(cuda_gemv(b->lm_head, b->dec_x, b->final_norm, eps, b->dec_logits, c->vocab_size, hidden,
                           CUDA_GEMV_ARGMAX, b->dec_argmax_ws, b->dec_token, st, pdl));
    int32_t *moved = b->step_device; /* `step` above is read-only; the publish kernel moves these on */
    const cuda_decode_step next = {moved + STEP_POSITION, moved + STEP_SLOT, moved + STEP_CONTEXT,
                                   moved + STEP_TABLE, b->kv_block_size, b->kv_blocks};
    KITE_TRY(cuda_publish_and_advance(b->dec_token, next, b->publish_device, st, pdl));
    return KITE_OK;
}

kite_status capture_decode_graph(cuda_backend *b, int which, bool ids_only) {
    return capture_graph(b->stream, [&] { return decode_launches(b, which, ids_only); }, &b->graph[ids_only][which],
                         "decode graph");
}

} // namespace

kite_status destroy_decode_graphs(cuda_backend *b) {
    b->step_advanced = false; /* kv_reserve replaces the step buffer after this */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N_DECODE_ATTENTION; i++) {
            if (b->graph[k][i]) CUDA_CHECK(cudaGraphExecDestroy(b->graph[k][i]));
            b->graph[k][i] = NULL;
        }
    return KITE_OK;
}

/* chained: the device id of this step's token (overlapped decode), else NULL: the batch's. */
kite_status forward_decode(cuda_backend *b, const step_batch *batch, const int32_t *chained) {
    const int32_t bs = b->kv_block_size, context = batch->seq_context_len[0];
    const int32_t position = context - 1, n_blocks = KITE_CEIL_DIV(context, bs);
    const bool ids_only = batch->ids_only && b->lm_head_screen;
    /* The graphs' embedding reads dec_token for a negative id. */
    const bool chained_in_place = chained == b->dec_token;
    /* The previous step (chained in place too) left this step's values on the device if it was at the position
     * before, and the table's entries are those copied then (step_host holds them; the DMA only reads it). */
    const size_t table_bytes = (size_t)n_blocks * sizeof(int32_t);
    const bool on_device = chained_in_place && b->step_advanced && position == b->step_next_position &&
                           n_blocks <= b->step_table_copied &&
                           memcmp(b->step_host + STEP_TABLE, batch->block_tables[0], table_bytes) == 0;
    b->step_advanced = false; /* until this step is enqueued */
    if (!on_device) {
        CUDA_CHECK(cudaEventSynchronize(b->step_copied));
        int32_t *h = b->step_host;
        h[STEP_TOKEN] = chained ? (chained_in_place ? -1 : 0) : batch->token_ids[0];
        h[STEP_POSITION] = position;
        h[STEP_SLOT] = batch->block_tables[0][position / bs] * bs + position % bs;
        h[STEP_CONTEXT] = context;
        memcpy(h + STEP_TABLE, batch->block_tables[0], table_bytes);
        CUDA_CHECK(cudaMemcpyAsync(b->step_device, h, (size_t)(STEP_TABLE + n_blocks) * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, b->stream));
        CUDA_CHECK(cudaEventRecord(b->step_copied, b->stream));
        b->step_table_copied = n_blocks;
        b->step_copies++;
    }
    if (chained && !chained_in_place)
        CUDA_CHECK(cudaMemcpyAsync(b->step_device + STEP_TOKEN, chained, sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                   b->stream));
    const int attention = decode_attention_kernel(b, context);
    if (b->use_graph) {
        if (!b->graph[ids_only][attention]) KITE_TRY(capture_decode_graph(b, attention, ids_only));
        CUDA_CHECK(cudaGraphLaunch(b->graph[ids_only][attention], b->stream));
    } else {
        KITE_TRY(decode_launches(b, attention, ids_only));
    }
    /* The graphs' and the direct launches' publish moved the buffer on. */
    b->step_advanced = chained_in_place;
    b->step_next_position = position + 1;
    b->kept_logits = ids_only ? NULL : b->dec_logits; /* read_logits and read_top refuse NULL */
    b->kept_rows = 1;
    b->kept_decode = true;
    b->kept_published = b->publish_host + (position & 1);
    b->kept_batch = false;
    return KITE_OK;
}

/* The single-stream decode path: one sequence, one token, logits wanted (greedy or sampled generation of one
 * request). Per layer 5 kernels, each weight read once, chained by programmatic dependent launch:
 *   embed; per layer: gemv qkv (input RMSNorm fused), attention (Q/K norm, RoPE and the K/V append fused: the
 *   bulk-copy fed cluster kernel up to bulk_max_context positions, 1,024, the split-K kernel beyond), gemv o_proj
 *   (residual add), gemv gate_up (RMSNorm and SwiGLU fused), gemv down (residual add); then the lm_head GEMV with
 *   the final norm and the argmax (for a step asked for ids only, step_batch.ids_only, the lm_head screened
 *   through its int8 copy: lm_head_screen.cu), and publish_and_advance (the id to mapped host memory, the step
 *   buffer on by one position).
 * With --weights fp8 the four linear products are cuda_gemv_fp8 over the E4M3 codes and block scales (W8A16: the
 * input stays fp32), with the same fusions and epilogues; the lm_head stays bf16.
 * Captured as a CUDA graph per attention kernel and lm_head form, and replayed. Bounded by HBM bandwidth: every
 * weight and the sequence's KV cache are read once per token.
 * Per-step values (token, position, cache slot, context length, block table) live in device memory; the step's
 * last kernel moves them on by one position, so a step chained in place needs a copy from the host only where they
 * differ (a new cache block, a host token).
 */
#include "backend/cuda/decode_path.cuh"
#include "backend/cuda_weight_layout.h"

#include <math.h>
#include <string.h>

namespace {

int decode_attention_kernel(const decode_state *d, int32_t context) {
    if (d->attention_bulk > 0 && context <= d->bulk_max_context) return DECODE_ATTENTION_BULK;
    return DECODE_ATTENTION_SPLIT;
}

/* One decode product of layer L: the bf16 GEMV, or with --weights fp8 the fp8 one over the codes and block scales
 * (same epilogues, so the fused QKV and gate_up products and the task split stay as they are). */
kite_status linear_gemv(const cuda_core *core, const cuda_layer *L, cuda_linear which, const float *x,
                        const float *norm_weight, float eps, float *y, int rows, int cols, int epilogue, int pdl) {
    if (core->weights != KITE_WEIGHTS_FP8)
        return cuda_gemv(cuda_linear_matrix(L, which), x, norm_weight, eps, y, rows, cols, epilogue, NULL, NULL,
                         core->stream, pdl);
    return cuda_gemv_fp8(cuda_linear_codes(L, which), cuda_linear_scales(L, which), cuda_weight_layout_scale_cols(cols),
                         x, norm_weight, eps, y, rows, cols, epilogue, core->stream, pdl);
}

/* ids_only: the lm_head screened (argmax only, no logits). */
kite_status decode_launches(const cuda_core *core, const decode_state *d, int attention, bool ids_only) {
    const qwen3_config *c = &core->config;
    void *st = core->stream;
    const int pdl = core->use_pdl ? 1 : 0;
    const int hidden = c->hidden_size, inter = c->intermediate_size;
    const int qd = qwen3_q_dim(c), qkv_dim = qwen3_qkv_dim(c);
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
    const int32_t *step = d->step_device;
    /* A negative token: the previous decode step's argmax (overlapped decode, forward_decode). */
    KITE_TRY(cuda_embed(core->embed, step + STEP_TOKEN, d->token, d->x, 1, hidden, st, 0));
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &core->layers[l];
        const cuda_kv_layer kv = kv_layer(core, l);
        KITE_TRY(linear_gemv(core, L, LINEAR_QKV, d->x, L->input_norm, eps, d->qkv, qkv_dim, hidden, CUDA_GEMV_STORE,
                             pdl));
        if (attention == DECODE_ATTENTION_BULK)
            KITE_TRY(cuda_attention_decode_bulk(d->qkv, d->attention, kv, step + STEP_TABLE, step + STEP_CONTEXT,
                                                L->q_norm, L->k_norm, core->rope_cos, core->rope_sin, eps, c->n_heads,
                                                scale, d->attention_bulk, st, pdl));
        else
            KITE_TRY(cuda_attention_decode(d->qkv, d->attention, kv, step + STEP_TABLE, step + STEP_CONTEXT,
                                           L->q_norm, L->k_norm, core->rope_cos, core->rope_sin, eps, c->n_heads,
                                           scale, d->n_splits, d->attention_ws, d->counters, st, pdl));
        /* x was last written by the down projection three kernels back (or the embedding), and for the down
         * projection by o_proj two kernels back: ADD_SETTLED reads it before the PDL wait (measured: 0.674 vs
         * 0.684 ms per 0.6B token). */
        KITE_TRY(linear_gemv(core, L, LINEAR_O, d->attention, NULL, 0.0f, d->x, hidden, qd, CUDA_GEMV_ADD_SETTLED,
                             pdl));
        KITE_TRY(linear_gemv(core, L, LINEAR_GATE_UP, d->x, L->post_norm, eps, d->act, 2 * inter, hidden,
                             CUDA_GEMV_SWIGLU, pdl));
        KITE_TRY(linear_gemv(core, L, LINEAR_DOWN, d->act, NULL, 0.0f, d->x, hidden, inter, CUDA_GEMV_ADD_SETTLED,
                             pdl));
    }
    if (ids_only)
        KITE_TRY(cuda_lm_head_screened_argmax(core->lm_head, d->lm_head_screen, d->x, core->final_norm, eps,
                                              c->vocab_size, hidden, d->token, NULL, NULL, 0, st, pdl));
    else
        KITE_TRY(cuda_gemv(core->lm_head, d->x, core->final_norm, eps, d->logits, c->vocab_size, hidden,
                           CUDA_GEMV_ARGMAX, d->argmax_ws, d->token, st, pdl));
    int32_t *moved = d->step_device; /* `step` above is read-only; the publish kernel moves these on */
    const cuda_decode_step next = {moved + STEP_POSITION, moved + STEP_SLOT, moved + STEP_CONTEXT,
                                   moved + STEP_TABLE, core->kv_block_size, core->kv_blocks};
    KITE_TRY(cuda_publish_and_advance(d->token, next, d->publish_device, st, pdl));
    return KITE_OK;
}

kite_status capture_decode_graph(const cuda_core *core, decode_state *d, int which, bool ids_only) {
    return capture_graph(core->stream, [&] { return decode_launches(core, d, which, ids_only); },
                         &d->graph[ids_only][which], "decode graph");
}

} // namespace

kite_status decode_alloc_buffers(const cuda_core *core, decode_state *d) {
    const qwen3_config *c = &core->config;
    const size_t hidden = c->hidden_size, qkv_dim = (size_t)qwen3_qkv_dim(c);
    const size_t qd = (size_t)qwen3_q_dim(c), inter = c->intermediate_size, vocab = c->vocab_size;
    const size_t sizes[9] = {hidden * 4, qkv_dim * 4, qd * 4, qd * 4, inter * 4, vocab * 4,
                             cuda_attention_decode_workspace(c->n_heads, c->head_dim, d->n_splits),
                             cuda_gemv_argmax_workspace(c->vocab_size), (size_t)c->n_heads * 4 + 64};
    const size_t total = parts_bytes(sizes, 9);
    CUDA_CHECK(cudaMalloc(&d->bytes, total));
    CUDA_CHECK(cudaMemset(d->bytes, 0, total));
    void *parts[9];
    split_parts(d->bytes, sizes, 9, parts);
    d->x = static_cast<float *>(parts[0]);
    d->qkv = static_cast<float *>(parts[1]);
    d->q = static_cast<float *>(parts[2]);
    d->attention = static_cast<float *>(parts[3]);
    d->act = static_cast<float *>(parts[4]);
    d->logits = static_cast<float *>(parts[5]);
    d->attention_ws = parts[6];
    d->argmax_ws = parts[7];
    d->counters = static_cast<unsigned *>(parts[8]);
    d->token = reinterpret_cast<int32_t *>(static_cast<unsigned char *>(parts[8]) + (size_t)c->n_heads * 4);
    return KITE_OK;
}

kite_status decode_reserve_step(decode_state *d, int32_t n_blocks) {
    const size_t step_bytes = (size_t)(STEP_TABLE + n_blocks) * sizeof(int32_t);
    return replace_device_and_pinned(&d->step_device, step_bytes, &d->step_host, step_bytes);
}

kite_status decode_destroy_graphs(decode_state *d) {
    d->step_advanced = false; /* kv_reserve replaces the step buffer after this */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N_DECODE_ATTENTION; i++) {
            if (d->graph[k][i]) CUDA_CHECK(cudaGraphExecDestroy(d->graph[k][i]));
            d->graph[k][i] = NULL;
        }
    return KITE_OK;
}

void decode_free(decode_state *d) {
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N_DECODE_ATTENTION; i++)
            if (d->graph[k][i]) cudaGraphExecDestroy(d->graph[k][i]);
    cudaFree(d->lm_head_screen);
    cudaFree(d->bytes);
    cudaFree(d->step_device);
    cudaFreeHost(d->step_host);
    if (d->step_copied) cudaEventDestroy(d->step_copied);
    cudaFreeHost(d->publish_host);
}

kite_status forward_decode(cuda_core *core, decode_state *d, const step_batch *batch, step_tokens tokens,
                           kept_rows *kept) {
    const int32_t bs = core->kv_block_size, context = batch->seq_context_len[0];
    const int32_t position = context - 1, n_blocks = KITE_CEIL_DIV(context, bs);
    const bool ids_only = batch->ids_only && d->lm_head_screen;
    /* The graphs' embedding reads d->token for a negative id. */
    const bool chained_in_place = tokens.on_device && tokens.written_by == KEPT_DECODE;
    /* The previous step (chained in place too) left this step's values on the device if it was at the position
     * before, and the table's entries are those copied then (step_host holds them; the DMA only reads it). */
    const size_t table_bytes = (size_t)n_blocks * sizeof(int32_t);
    const bool on_device = chained_in_place && d->step_advanced && position == d->step_next_position &&
                           n_blocks <= d->step_table_copied &&
                           memcmp(d->step_host + STEP_TABLE, batch->block_tables[0], table_bytes) == 0;
    d->step_advanced = false; /* until this step is enqueued */
    if (!on_device) {
        CUDA_CHECK(cudaEventSynchronize(d->step_copied));
        int32_t *h = d->step_host;
        h[STEP_TOKEN] = tokens.on_device ? (chained_in_place ? -1 : 0) : batch->token_ids[0];
        h[STEP_POSITION] = position;
        h[STEP_SLOT] = batch->block_tables[0][position / bs] * bs + position % bs;
        h[STEP_CONTEXT] = context;
        memcpy(h + STEP_TABLE, batch->block_tables[0], table_bytes);
        CUDA_CHECK(cudaMemcpyAsync(d->step_device, h, (size_t)(STEP_TABLE + n_blocks) * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, core->stream));
        CUDA_CHECK(cudaEventRecord(d->step_copied, core->stream));
        d->step_table_copied = n_blocks;
        d->step_copies++;
    }
    if (tokens.on_device && !chained_in_place)
        CUDA_CHECK(cudaMemcpyAsync(d->step_device + STEP_TOKEN, tokens.ids, sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                   core->stream));
    const int attention = decode_attention_kernel(d, context);
    if (core->use_graph) {
        if (!d->graph[ids_only][attention]) KITE_TRY(capture_decode_graph(core, d, attention, ids_only));
        CUDA_CHECK(cudaGraphLaunch(d->graph[ids_only][attention], core->stream));
    } else {
        KITE_TRY(decode_launches(core, d, attention, ids_only));
    }
    /* The graphs' and the direct launches' publish moved the buffer on. */
    d->step_advanced = chained_in_place;
    d->step_next_position = position + 1;
    /* read_logits and read_top refuse a step that kept no logits */
    *kept = kept_rows{KEPT_DECODE, 1, ids_only ? NULL : d->logits, d->token, d->publish_host + (position & 1)};
    return KITE_OK;
}

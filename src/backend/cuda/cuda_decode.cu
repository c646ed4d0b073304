/* The CUDA backend's single-stream decode (one sequence, one token, logits wanted): GEMV kernels that read each
 * weight once, attention by the bulk-copy fed cluster kernel up to bulk_max_context (1,024), by the split-K kernel
 * beyond (the cp.async cluster kernel where cluster_max_context asks for it), lm_head + argmax on the device (for a
 * step asked for ids only, step_batch.ids_only, the lm_head screened through its int8 copy: lm_head_screen.cu),
 * captured as a CUDA graph (one per attention kernel and lm_head form) and replayed.
 * Per-step values (token, position, cache slot, context length, block table) live in device memory; the step's
 * last kernel moves them on by one position, so a step chained in place needs a copy from the host only where they
 * differ (a new cache block, a host token); kernels chain by programmatic dependent launch.
 * Or the same step as one persistent kernel (decode_persistent.cu), where asked for and the shapes and device allow.
 */
#include "backend/cuda/cuda_backend_state.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace {

int decode_attention_kernel(const cuda_backend *b, int32_t context) {
    if (b->attention_bulk > 0 && context <= b->bulk_max_context) return DECODE_ATTENTION_BULK;
    if (b->attention_cluster > 0 && context <= b->cluster_max_context) return DECODE_ATTENTION_CLUSTER;
    return DECODE_ATTENTION_SPLIT;
}

/* ids_only: the lm_head screened (argmax only, no logits). */
kite_status decode_launches(cuda_backend *b, int attention, bool ids_only) {
    const qwen3_config *c = &b->config;
    void *st = b->stream;
    const int pdl = b->use_pdl ? 1 : 0;
    const int hidden = c->hidden_size, inter = c->intermediate_size;
    const int qd = c->n_heads * c->head_dim, qkv_dim = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
    const int32_t *step = b->step_device;
    /* A negative token: the previous decode step's argmax (overlapped decode, forward_decode). */
    DECODE_PART(CUDA_DECODE_PART_EMBED,
                cuda_embed(b->embed, step + STEP_TOKEN, b->dec_token, b->dec_x, 1, hidden, st, 0));
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &b->layers[l];
        const cuda_kv_layer kv = kv_layer(b, l);
        DECODE_PART(CUDA_DECODE_PART_QKV, cuda_gemv(L->qkv, b->dec_x, L->input_norm, eps, b->dec_qkv, qkv_dim, hidden,
                                                    CUDA_GEMV_STORE, NULL, NULL, st, pdl));
        if (attention == DECODE_ATTENTION_BULK)
            DECODE_PART(CUDA_DECODE_PART_ATTENTION,
                        cuda_attention_decode_bulk(b->dec_qkv, b->dec_attention, kv, step + STEP_TABLE,
                                                   step + STEP_CONTEXT, L->q_norm, L->k_norm, b->rope_cos, b->rope_sin,
                                                   eps, c->n_heads, scale, b->attention_bulk, st, pdl));
        else if (attention == DECODE_ATTENTION_CLUSTER)
            DECODE_PART(CUDA_DECODE_PART_ATTENTION,
                        cuda_attention_decode_cluster(b->dec_qkv, b->dec_attention, kv, step + STEP_TABLE,
                                                      step + STEP_CONTEXT, L->q_norm, L->k_norm, b->rope_cos,
                                                      b->rope_sin, eps, c->n_heads, scale, b->attention_cluster, st, pdl));
        else
            DECODE_PART(CUDA_DECODE_PART_ATTENTION,
                        cuda_attention_decode(b->dec_qkv, b->dec_attention, kv, step + STEP_TABLE, step + STEP_CONTEXT,
                                              L->q_norm, L->k_norm, b->rope_cos, b->rope_sin, eps, c->n_heads, scale,
                                              b->n_splits, b->dec_attention_ws, b->dec_counters, st, pdl));
        /* x was last written by the down projection three kernels back (or the embedding), and for the down
         * projection by o_proj two kernels back: ADD_SETTLED reads it before the PDL wait (measured: 0.674 vs
         * 0.684 ms per 0.6B token). The anatomy mode's doubled o_proj / down break that premise (timing only). */
        DECODE_PART(CUDA_DECODE_PART_O, cuda_gemv(L->o, b->dec_attention, NULL, 0.0f, b->dec_x, hidden, qd,
                                                  CUDA_GEMV_ADD_SETTLED, NULL, NULL, st, pdl));
        DECODE_PART(CUDA_DECODE_PART_GATE_UP, cuda_gemv(L->gate_up, b->dec_x, L->post_norm, eps, b->dec_act, 2 * inter,
                                                        hidden, CUDA_GEMV_SWIGLU, NULL, NULL, st, pdl));
        DECODE_PART(CUDA_DECODE_PART_DOWN, cuda_gemv(L->down, b->dec_act, NULL, 0.0f, b->dec_x, hidden, inter,
                                                     CUDA_GEMV_ADD_SETTLED, NULL, NULL, st, pdl));
    }
    if (ids_only)
        DECODE_PART(CUDA_DECODE_PART_LM_HEAD,
                    cuda_lm_head_screened_argmax(b->lm_head, b->lm_head_screen, b->dec_x, b->final_norm, eps,
                                                 c->vocab_size, hidden, b->dec_token, NULL, NULL, 0, st, pdl));
    else
        DECODE_PART(CUDA_DECODE_PART_LM_HEAD, cuda_gemv(b->lm_head, b->dec_x, b->final_norm, eps, b->dec_logits,
                                                        c->vocab_size, hidden, CUDA_GEMV_ARGMAX, b->dec_argmax_ws,
                                                        b->dec_token, st, pdl));
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
    const bool persistent = b->use_persistent && bs % 16 == 0; /* the kernel copies K/V in pieces of 16 slots */
    const bool ids_only = batch->ids_only && b->lm_head_screen && !persistent;
    /* The graphs' embedding reads dec_token for a negative id; the persistent kernel reads the id itself. */
    const bool chained_in_place = chained == b->dec_token && !persistent;
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
    if (persistent) {
        cuda_decode_args *a = &b->persistent;
        a->kv_cache = b->kv_cache; /* kv_reserve may have moved these */
        a->kv_block_size = bs;
        a->kv_layer_elements = b->kv_layer_elements;
        a->token = b->step_device + STEP_TOKEN;
        a->context_len = b->step_device + STEP_CONTEXT;
        a->block_table = b->step_device + STEP_TABLE;
        KITE_TRY(cuda_decode_persistent(a, b->persistent_blocks, b->stream));
    } else {
        const int attention = decode_attention_kernel(b, context);
        if (b->use_graph) {
            if (!b->graph[ids_only][attention]) KITE_TRY(capture_decode_graph(b, attention, ids_only));
            CUDA_CHECK(cudaGraphLaunch(b->graph[ids_only][attention], b->stream));
        } else {
            KITE_TRY(decode_launches(b, attention, ids_only));
        }
    }
    /* The graphs' and the direct launches' publish moved the buffer on (the persistent kernel does not). */
    b->step_advanced = chained_in_place;
    b->step_next_position = position + 1;
    b->kept_logits = ids_only ? NULL : b->dec_logits; /* read_logits and read_top refuse NULL */
    b->kept_rows = 1;
    b->kept_decode = true;
    b->kept_published = persistent ? NULL : b->publish_host + (position & 1);
    b->kept_batch = false;
    return KITE_OK;
}

/* Prepares the persistent decode kernel over the decode buffers; leaves use_persistent off (and the
 * graph path in charge) when the kernel does not suit the model or the device. */
kite_status setup_persistent_decode(cuda_backend *b) {
    const qwen3_config *c = &b->config;
    cuda_decode_args *a = &b->persistent;
    memset(a, 0, sizeof *a);
    a->n_layers = c->n_layers;
    a->hidden = c->hidden_size;
    a->intermediate = c->intermediate_size;
    a->n_heads = c->n_heads;
    a->n_kv_heads = c->n_kv_heads;
    a->head_dim = c->head_dim;
    a->vocab = c->vocab_size;
    a->eps = (float)c->rms_norm_eps;
    a->embed = b->embed;
    a->lm_head = b->lm_head;
    a->final_norm = b->final_norm;
    a->rope_cos = b->rope_cos;
    a->rope_sin = b->rope_sin;
    a->x = b->dec_x;
    a->qkv = b->dec_qkv;
    a->attention = b->dec_attention;
    a->act = b->dec_act;
    a->logits = b->dec_logits;
    a->token_out = b->dec_token;
    size_t workspace = 0;
    if (cuda_decode_persistent_plan(a, &b->persistent_blocks, &workspace) != KITE_OK) {
        b->use_persistent = false;
        return KITE_OK;
    }
    cuda_decode_layer *host = static_cast<cuda_decode_layer *>(calloc((size_t)c->n_layers, sizeof(cuda_decode_layer)));
    if (!host) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory");
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &b->layers[l];
        host[l] = cuda_decode_layer{L->qkv, L->o, L->gate_up, L->down, L->input_norm, L->post_norm, L->q_norm, L->k_norm};
    }
    const size_t layer_bytes = (size_t)c->n_layers * sizeof(cuda_decode_layer);
    cudaError_t e = cudaMalloc(&b->persistent_layers, layer_bytes);
    if (e == cudaSuccess) e = cudaMemcpy(b->persistent_layers, host, layer_bytes, cudaMemcpyHostToDevice);
    free(host);
    if (e == cudaSuccess) e = cudaMalloc(&a->workspace, workspace);
    if (e == cudaSuccess) e = cudaMemset(a->workspace, 0, workspace); /* the stage counters start at zero */
    if (e != cudaSuccess) {
        cudaFree(b->persistent_layers);
        cudaFree(a->workspace);
        b->persistent_layers = NULL;
        a->workspace = NULL;
        return kite_fail(KITE_ERROR_BACKEND, "cuda: persistent decode buffers: %s", cudaGetErrorName(e));
    }
    a->layers = b->persistent_layers;
    return KITE_OK;
}

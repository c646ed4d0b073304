/* The batched decode path: 2..BATCH_MAX sequences of one token each, all wanting logits (several requests
 * generating at once). The same step for all rows, each weight read once per step; one CUDA graph per bucket of rows
 * (2, 4, ..., 256), the rows past B being dummies that write to a scratch KV block.
 *   Up to rows_max (8) rows (fp8_rows_max, 32, with --weights fp8), 5 kernels per layer chained by programmatic dependent launch: embed; per layer:
 *   gemm_rows qkv (input RMSNorm fused), attention (Q/K norm, RoPE and the K/V append fused: the bulk-fed cluster
 *   kernel up to bulk_max_rows rows where its clusters fit, else split-K), gemm_rows o_proj (residual add),
 *   gemm_rows gate_up (RMSNorm and SwiGLU fused), gemm_rows down (residual add); the lm_head through gemm_rows with
 *   the argmax (up to lm_head_rows_max rows) or cuBLASLt and argmax_rows; publish_ids.
 *   Larger buckets: cuBLASLt products (M = rows) around the same attention and a separate SwiGLU; up to
 *   split_max_rows rows o_proj and down as k-split partials that residual_rmsnorm adds to the residual with the
 *   next norm, else each norm its own kernel.
 * With --weights fp8 the gemm_rows products are the W8A16 kernels over the codes and block scales
 * (cuda_gemm_rows_fp8: each code read once per step), up to fp8_rows_max (32) rows, with the same fusions and
 * programmatic dependent launch; beyond, each layer's four matrices are first dequantized to bf16 into one scratch
 * (layer_for_gemm) for the cuBLASLt products, with programmatic dependent launch off (a product must not read the
 * scratch early).
 * Bounded by HBM bandwidth at small B (weights read once for all rows), by the tensor cores and the attention's
 * KV reads as B grows.
 */
#include "backend/cuda/batch_path.cuh"
#include "backend/cuda_weight_layout.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

namespace {

/* The smallest bucket holding `rows` rows (rows <= BATCH_MAX). */
int bucket_index(int32_t rows) {
    int bucket = 0;
    while (bucket < N_BUCKETS - 1 && BUCKETS[bucket] < rows) bucket++;
    return bucket;
}

} // namespace

/* Whether a split of o_proj and down into `slices` k slices fits the shapes (cuda_gemm_bf16_split). */
bool batch_split_fits(const qwen3_config *c, int slices) {
    const int qd = qwen3_q_dim(c);
    return slices >= 2 && slices <= 16 && qd % (8 * slices) == 0 && c->intermediate_size % (8 * slices) == 0;
}

kite_status batch_destroy_graphs(batch_state *bp) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (bp->graphs[i]) {
            CUDA_CHECK(cudaGraphExecDestroy(bp->graphs[i]));
            bp->graphs[i] = NULL;
        }
    return KITE_OK;
}

kite_status batch_release(const cuda_core *core, batch_state *bp) {
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    KITE_TRY(batch_destroy_graphs(bp));
    if (bp->bytes) CUDA_CHECK(cudaFree(bp->bytes));
    bp->bytes = NULL;
    bp->capacity = 0;
    return KITE_OK;
}

void batch_free(batch_state *bp) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (bp->graphs[i]) cudaGraphExecDestroy(bp->graphs[i]);
    cudaFree(bp->bytes);
    cudaFree(bp->step_device);
    cudaFreeHost(bp->step_host);
    if (bp->step_copied) cudaEventDestroy(bp->step_copied);
    cudaFreeHost(bp->publish_host);
}

namespace {

/* Activations for `rows` rows (a bucket), fixed until a larger bucket comes (then graphs are recaptured). */
kite_status ensure_batch(const cuda_core *core, batch_state *bp, int32_t rows) {
    if (rows <= bp->capacity) return KITE_OK;
    const qwen3_config *c = &core->config;
    KITE_TRY(batch_release(core, bp));
    const size_t R = (size_t)rows;
    const size_t hidden = c->hidden_size, qkv_dim = (size_t)qwen3_qkv_dim(c);
    const size_t qd = (size_t)qwen3_q_dim(c), inter = c->intermediate_size, vocab = c->vocab_size;
    size_t attention_ws = 0;
    for (int i = 0; i < N_BUCKETS && BUCKETS[i] <= rows; i++) {
        const size_t ws = (size_t)BUCKETS[i] * cuda_attention_decode_workspace(c->n_heads, c->head_dim, attention_splits(core, BUCKETS[i]));
        if (ws > attention_ws) attention_ws = ws;
    }
    enum { X, QKV, LOGITS, ATT16, NORMED, GATE_UP, ACT16, ATT_WS, ARGMAX_WS, COUNTERS, IDS, PARTIALS, N_PARTS };
    size_t sizes[N_PARTS];
    sizes[X] = R * hidden * 4;
    sizes[QKV] = R * qkv_dim * 4;
    sizes[LOGITS] = R * vocab * 4;
    sizes[ATT16] = R * qd * 2;
    sizes[NORMED] = R * hidden * 2;
    sizes[GATE_UP] = R * 2 * inter * 2;
    sizes[ACT16] = R * inter * 2;
    sizes[ATT_WS] = attention_ws;
    sizes[ARGMAX_WS] = cuda_gemm_rows_argmax_workspace();
    sizes[COUNTERS] = R * (size_t)c->n_heads * sizeof(unsigned);
    sizes[IDS] = R * sizeof(int32_t);
    sizes[PARTIALS] = bp->split > 1 ? (size_t)bp->split * R * hidden * 4 : 0;
    const size_t total = parts_bytes(sizes, N_PARTS);
    CUDA_CHECK(cudaMalloc(&bp->bytes, total));
    CUDA_CHECK(cudaMemset(bp->bytes, 0, total)); /* counters start at zero; padding rows stay finite */
    void *parts[N_PARTS];
    split_parts(bp->bytes, sizes, N_PARTS, parts);
    bp->x = static_cast<float *>(parts[X]);
    bp->qkv = static_cast<float *>(parts[QKV]);
    bp->logits = static_cast<float *>(parts[LOGITS]);
    bp->attention16 = static_cast<bf16 *>(parts[ATT16]);
    bp->normed = static_cast<bf16 *>(parts[NORMED]);
    bp->gate_up = static_cast<bf16 *>(parts[GATE_UP]);
    bp->act16 = static_cast<bf16 *>(parts[ACT16]);
    bp->attention_ws = parts[ATT_WS];
    bp->argmax_ws = parts[ARGMAX_WS];
    bp->counters = static_cast<unsigned *>(parts[COUNTERS]);
    bp->ids = static_cast<int32_t *>(parts[IDS]);
    bp->partials = bp->split > 1 ? static_cast<float *>(parts[PARTIALS]) : NULL;
    bp->capacity = rows;
    return KITE_OK;
}

/* The step buffer (host pinned + device) for `table_ints` block-table entries. */
kite_status ensure_batch_step(const cuda_core *core, batch_state *bp, size_t table_ints) {
    const size_t need = (size_t)BATCH_TABLES + table_ints;
    if (need <= bp->step_ints) return KITE_OK;
    const size_t capacity = grown_capacity(bp->step_ints, (size_t)BATCH_TABLES + 4096, need);
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    KITE_TRY(batch_destroy_graphs(bp));
    bp->step_ints = 0;
    KITE_TRY(replace_device_and_pinned(&bp->step_device, capacity * sizeof(int32_t), &bp->step_host,
                                       capacity * sizeof(int32_t)));
    bp->step_ints = capacity;
    return KITE_OK;
}

} // namespace

/* The cluster size of the bulk-fed attention for a bucket of `rows` rows, 0 for the split-K kernel: buckets
 * up to batch_bulk_max_rows whose clusters (of 1 to 16 blocks per sequence and kv head) all fit at once. */
int batch_bulk_cluster(const batch_state *bp, int32_t rows) {
    return rows <= bp->bulk_max_rows ? bp->bulk_cluster[bucket_index(rows)] : 0;
}

namespace {

/* The batched attention of one layer (Q/K norm, RoPE and the K/V append fused): the bulk-fed cluster kernel
 * where batch_bulk_cluster() allows, else split-K. */
kite_status batch_attention(const cuda_core *core, const batch_state *bp, int layer, int32_t rows, void *out,
                            int out_bf16, int pdl) {
    const qwen3_config *c = &core->config;
    const cuda_layer *L = &core->layers[layer];
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
    const int32_t *step = bp->step_device;
    const int32_t *context = step + BATCH_CONTEXT, *table_start = step + BATCH_TABLE_START, *tables = step + BATCH_TABLES;
    const int cluster = batch_bulk_cluster(bp, rows);
    if (cluster > 0)
        return cuda_attention_decode_bulk_rows(bp->qkv, out, out_bf16, kv_layer(core, layer), tables, table_start,
                                               context, L->q_norm, L->k_norm, core->rope_cos, core->rope_sin, eps,
                                               c->n_heads, scale, rows, cluster, core->stream, pdl);
    return cuda_attention_decode_rows(bp->qkv, out, out_bf16, kv_layer(core, layer), tables, table_start, context,
                                      L->q_norm, L->k_norm, core->rope_cos, core->rope_sin, eps, c->n_heads, scale, rows,
                                      attention_splits(core, rows), bp->attention_ws, bp->counters, core->stream, pdl);
}

/* Whether a bucket of `rows` rows runs its products through gemm_rows (up to rows_max rows, where every
 * product's input rows fit its shared memory; e.g. a 14B model's 17,408-column down projection does not at 8
 * rows) rather than cuBLASLt. Measured slower: gemm_rows for 9-32 rows after a separate RMSNorm kernel (1.644 vs
 * 1.399 ms per step at B=32 through cuBLASLt), for single products at 32 rows (each one), and a gemm_rows that
 * stages only a k slice per block (B=32 1.655 ms). */
bool batch_gemm_rows(const cuda_core *core, const batch_state *bp, int32_t rows) {
    const qwen3_config *c = &core->config;
    const int rows_max = core->weights == KITE_WEIGHTS_FP8 ? bp->fp8_rows_max : bp->rows_max;
    return rows <= rows_max && cuda_gemm_rows_fits(rows, c->hidden_size) &&
           cuda_gemm_rows_fits(rows, qwen3_q_dim(c)) && cuda_gemm_rows_fits(rows, c->intermediate_size);
}

/* The lm_head (final norm, logits, argmax) through gemm_rows up to batch_lm_head_rows_max rows where its input
 * fits, else cuBLASLt. normed_ready: bat_normed already holds the final norm of bat_x (the split products' last
 * residual_rmsnorm), so neither path takes the norm again: gemm_rows stages bat_normed as it is (bf16). */
kite_status batch_lm_head(const cuda_core *core, const batch_state *bp, int32_t rows, int pdl, bool normed_ready) {
    const qwen3_config *c = &core->config;
    const int hidden = c->hidden_size, vocab = c->vocab_size;
    const float eps = (float)c->rms_norm_eps;
    void *st = core->stream;
    if (rows <= bp->lm_head_rows_max && cuda_gemm_rows_fits(rows, hidden)) {
        const void *input = normed_ready ? static_cast<const void *>(bp->normed) : bp->x;
        KITE_TRY(cuda_gemm_rows(core->lm_head, input, normed_ready, normed_ready ? NULL : core->final_norm, eps,
                                bp->logits, 0, rows, vocab, hidden, CUDA_GEMV_ARGMAX, bp->argmax_ws, bp->ids,
                                st, pdl));
    } else {
        if (!normed_ready) KITE_TRY(cuda_rmsnorm(bp->x, core->final_norm, bp->normed, NULL, rows, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(core->gemm, bp->normed, core->lm_head, bp->logits, 1, 0.0f, rows, vocab, hidden, st));
        KITE_TRY(cuda_argmax_rows(bp->logits, bp->ids, rows, vocab, st));
    }
    /* The ids to the host by the step itself (bat_publish_host), as the single-stream step does. */
    return cuda_publish_ids(bp->ids, rows, bp->step_device + BATCH_CONTEXT, bp->publish_device, st, pdl);
}

/* One gemm_rows product of layer L: bf16, or with --weights fp8 the W8A16 kernel over the codes and block scales
 * (same epilogues and fusions). */
kite_status batch_rows_product(const cuda_core *core, const cuda_layer *L, cuda_linear which, const void *x, int x_bf16,
                               const float *norm_weight, float eps, void *y, int y_bf16, int32_t n_rows, int rows,
                               int cols, int epilogue, int pdl) {
    void *st = core->stream;
    if (core->weights != KITE_WEIGHTS_FP8)
        return cuda_gemm_rows(cuda_linear_matrix(L, which), x, x_bf16, norm_weight, eps, y, y_bf16, n_rows, rows, cols,
                              epilogue, NULL, NULL, st, pdl);
    const uint8_t *codes = cuda_linear_codes(L, which);
    const float *scales = cuda_linear_scales(L, which);
    return cuda_gemm_rows_fp8(codes, scales, cuda_weight_layout_scale_cols(cols), x, x_bf16, norm_weight, eps, y, y_bf16,
                              n_rows, rows, cols, epilogue, st, pdl);
}

kite_status batch_launches(const cuda_core *core, const batch_state *bp, int32_t rows) {
    const qwen3_config *c = &core->config;
    void *st = core->stream;
    const int hidden = c->hidden_size, inter = c->intermediate_size;
    const int qd = qwen3_q_dim(c), qkv_dim = qwen3_qkv_dim(c);
    const float eps = (float)c->rms_norm_eps;
    const int32_t *tokens = bp->step_device + BATCH_TOKENS;
    cuda_layer scratch;
    /* A negative token: that row's argmax of the previous batched step (overlapped decode, forward_batch). */
    KITE_TRY(cuda_embed(core->embed, tokens, bp->ids, bp->x, rows, hidden, st, 0));
    if (batch_gemm_rows(core, bp, rows)) {
        /* Fused tensor-core kernels, chained by programmatic dependent launch (5 per layer, as B = 1), over the layer's
         * own weights (bf16, or fp8 codes and scales: no scratch). The attention output and the SwiGLU product are
         * kept as bf16 (o_proj and down round their input to bf16 anyway), so those two stage their input by cp.async
         * in one round trip. */
        const int pdl = core->use_pdl ? 1 : 0;
        for (int l = 0; l < c->n_layers; l++) {
            const cuda_layer *L = &core->layers[l];
            KITE_TRY(batch_rows_product(core, L, LINEAR_QKV, bp->x, 0, L->input_norm, eps, bp->qkv, 0, rows, qkv_dim,
                                        hidden, CUDA_GEMV_STORE, pdl));
            KITE_TRY(batch_attention(core, bp, l, rows, bp->attention16, 1, pdl));
            KITE_TRY(batch_rows_product(core, L, LINEAR_O, bp->attention16, 1, NULL, 0.0f, bp->x, 0, rows, hidden, qd,
                                        CUDA_GEMV_ADD_SETTLED, pdl));
            KITE_TRY(batch_rows_product(core, L, LINEAR_GATE_UP, bp->x, 0, L->post_norm, eps, bp->act16, 1, rows,
                                        2 * inter, hidden, CUDA_GEMV_SWIGLU, pdl));
            KITE_TRY(batch_rows_product(core, L, LINEAR_DOWN, bp->act16, 1, NULL, 0.0f, bp->x, 0, rows, hidden, inter,
                                        CUDA_GEMV_ADD_SETTLED, pdl));
        }
        return batch_lm_head(core, bp, rows, pdl, false);
    }
    /* With fp8 weights each layer's products below read the bf16 scratch that a dequantization just wrote: no kernel
     * here may start, and read its weights, before the kernel ahead of it has ended. */
    const int pdl = core->use_pdl && core->weights != KITE_WEIGHTS_FP8 ? 1 : 0;
    /* cuBLASLt GEMMs (M = rows), the same batched attention, SwiGLU on its own. Up to batch_split_max_rows rows
     * o_proj and down are split along k: their partials are added to the residual by the kernel that also takes
     * the next RMSNorm (of gate/up, of the next layer's qkv, of the lm_head), so only layer 0's input norm is a
     * kernel of its own and cuBLASLt launches no reduction. Otherwise o_proj and down add into the residual
     * (beta = 1) and each norm is a separate kernel. */
    const bool split = bp->split > 1 && rows <= bp->split_max_rows;
    const int S = bp->split;
    if (split) KITE_TRY(cuda_rmsnorm(bp->x, core->layers[0].input_norm, bp->normed, NULL, rows, hidden, eps, st));
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L;
        KITE_TRY(layer_for_gemm(core, l, &scratch, &L));
        const float *next_norm = l + 1 < c->n_layers ? core->layers[l + 1].input_norm : core->final_norm;
        if (!split) KITE_TRY(cuda_rmsnorm(bp->x, L->input_norm, bp->normed, NULL, rows, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(core->gemm, bp->normed, L->qkv, bp->qkv, 1, 0.0f, rows, qkv_dim, hidden, st));
        KITE_TRY(batch_attention(core, bp, l, rows, bp->attention16, 1, pdl));
        if (!split) {
            KITE_TRY(cuda_gemm_bf16(core->gemm, bp->attention16, L->o, bp->x, 1, 1.0f, rows, hidden, qd, st));
        } else {
            KITE_TRY(cuda_gemm_bf16_split(core->gemm, bp->attention16, L->o, bp->partials, S, rows, hidden, qd, st));
            KITE_TRY(cuda_residual_rmsnorm(bp->x, bp->partials, S, L->post_norm, bp->normed, rows, hidden, eps,
                                           st));
        }
        if (!split) KITE_TRY(cuda_rmsnorm(bp->x, L->post_norm, bp->normed, NULL, rows, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(core->gemm, bp->normed, L->gate_up, bp->gate_up, 0, 0.0f, rows, 2 * inter, hidden,
                                st));
        KITE_TRY(cuda_swiglu(bp->gate_up, bp->act16, rows, inter, st));
        if (!split) {
            KITE_TRY(cuda_gemm_bf16(core->gemm, bp->act16, L->down, bp->x, 1, 1.0f, rows, hidden, inter, st));
        } else {
            KITE_TRY(cuda_gemm_bf16_split(core->gemm, bp->act16, L->down, bp->partials, S, rows, hidden, inter, st));
            KITE_TRY(cuda_residual_rmsnorm(bp->x, bp->partials, S, next_norm, bp->normed, rows, hidden, eps,
                                           st));
        }
    }
    return batch_lm_head(core, bp, rows, pdl, split);
}

kite_status capture_batch_graph(const cuda_core *core, batch_state *bp, int bucket) {
    char what[32];
    snprintf(what, sizeof what, "batch graph %d", (int)BUCKETS[bucket]);
    return capture_graph(core->stream, [&] { return batch_launches(core, bp, BUCKETS[bucket]); }, &bp->graphs[bucket], what);
}

} // namespace

kite_status forward_batch(cuda_core *core, batch_state *bp, const step_batch *batch, step_tokens tokens,
                          kept_rows *kept) {
    const int32_t n = batch->n_seqs, bs = core->kv_block_size;
    const int bucket = bucket_index(n);
    const int32_t rows = BUCKETS[bucket];
    /* Tokens from this path's own previous step: the graph's embedding reads ids[s] for a negative id. */
    const bool in_place = tokens.on_device && tokens.written_by == KEPT_BATCH;
    size_t table_ints = 1; /* entry 0: the scratch block of the dummy rows */
    for (int32_t s = 0; s < n; s++) table_ints += (size_t)KITE_CEIL_DIV(batch->seq_context_len[s], bs);
    KITE_TRY(ensure_batch(core, bp, rows));
    KITE_TRY(ensure_batch_step(core, bp, table_ints));
    CUDA_CHECK(cudaEventSynchronize(bp->step_copied)); /* the previous step's copy has left the host buffer */
    int32_t *h = bp->step_host;
    int32_t *tables = h + BATCH_TABLES;
    tables[0] = core->kv_blocks; /* the scratch block past the engine's blocks (kv_reserve) */
    size_t at = 1;
    for (int32_t s = 0; s < rows; s++) {
        if (s < n) {
            const int32_t context = batch->seq_context_len[s], n_blocks = KITE_CEIL_DIV(context, bs);
            h[BATCH_TOKENS + s] = tokens.on_device ? (in_place ? -1 : 0) : batch->token_ids[s];
            h[BATCH_CONTEXT + s] = context;
            h[BATCH_TABLE_START + s] = (int32_t)at;
            memcpy(tables + at, batch->block_tables[s], (size_t)n_blocks * sizeof(int32_t));
            at += (size_t)n_blocks;
        } else {
            h[BATCH_TOKENS + s] = 0;
            h[BATCH_CONTEXT + s] = 1;
            h[BATCH_TABLE_START + s] = 0;
        }
    }
    CUDA_CHECK(cudaMemcpyAsync(bp->step_device, h, ((size_t)BATCH_TABLES + at) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, core->stream));
    CUDA_CHECK(cudaEventRecord(bp->step_copied, core->stream));
    if (tokens.on_device && !in_place)
        CUDA_CHECK(cudaMemcpyAsync(bp->step_device + BATCH_TOKENS, tokens.ids, (size_t)n * sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, core->stream));
    if (core->use_graph && bp->graphs[bucket]) {
        CUDA_CHECK(cudaGraphLaunch(bp->graphs[bucket], core->stream));
    } else {
        /* The first step of a bucket runs eagerly (modules load, cuBLASLt plans and kernel attributes are
         * set outside any capture), then the graph is captured for the steps after it. */
        KITE_TRY(batch_launches(core, bp, rows));
        if (core->use_graph) KITE_TRY(capture_batch_graph(core, bp, bucket));
    }
    *kept = kept_rows{KEPT_BATCH, n, bp->logits, bp->ids, bp->publish_host + (batch->seq_context_len[0] & 1) * rows};
    return KITE_OK;
}

/* The CUDA backend's batched decode (2..256 sequences, one token each, all wanting logits): the same step for all
 * rows at once, each weight read once per step: up to 8 rows (rows_max) the tensor-core
 * kernels of gemm_rows.cu with the GEMV's fusions (5 kernels per layer, PDL), beyond that cuBLASLt GEMMs; split-K
 * attention over every sequence's own blocks; lm_head + argmax on the device. One CUDA graph per bucket of rows
 * (2, 4, ..., 256), the rows past B being dummies that write to a scratch KV block.
 */
#include "backend/cuda/cuda_backend_state.cuh"

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

/* Splits per (sequence, kv head, head group) of the split-K attention for `rows` sequences: as many as fill the
 * device once (split_blocks_per_sm blocks per SM). The single-stream graph uses rows = 1. */
int batch_splits(const cuda_backend *b, int32_t rows) {
    const int blocks = b->split_blocks_per_sm * (b->sm_count ? b->sm_count : 132);
    const int splits = blocks / (b->config.n_kv_heads * b->head_groups * rows);
    return splits < 1 ? 1 : splits;
}

/* Whether a split of o_proj and down into `slices` k slices fits the shapes (cuda_gemm_bf16_split). */
bool batch_split_fits(const qwen3_config *c, int slices) {
    const int qd = qwen3_q_dim(c);
    return slices >= 2 && slices <= 16 && qd % (8 * slices) == 0 && c->intermediate_size % (8 * slices) == 0;
}

kite_status destroy_batch_graphs(cuda_backend *b) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (b->bat_graphs[i]) {
            CUDA_CHECK(cudaGraphExecDestroy(b->bat_graphs[i]));
            b->bat_graphs[i] = NULL;
        }
    return KITE_OK;
}

/* Frees the batch activations (and the graphs that captured them); the kept batch rows lived there too. */
kite_status release_batch(cuda_backend *b) {
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    KITE_TRY(destroy_batch_graphs(b));
    if (b->bat_bytes) CUDA_CHECK(cudaFree(b->bat_bytes));
    b->bat_bytes = NULL;
    b->bat_capacity = 0;
    if (b->kept_batch) {
        b->kept_logits = NULL;
        b->kept_rows = 0;
        b->kept_batch = false;
        b->kept_published = NULL;
    }
    return KITE_OK;
}

namespace {

/* Activations for `rows` rows (a bucket), fixed until a larger bucket comes (then graphs are recaptured). */
kite_status ensure_batch(cuda_backend *b, int32_t rows) {
    if (rows <= b->bat_capacity) return KITE_OK;
    const qwen3_config *c = &b->config;
    KITE_TRY(release_batch(b));
    const size_t R = (size_t)rows;
    const size_t hidden = c->hidden_size, qkv_dim = (size_t)qwen3_qkv_dim(c);
    const size_t qd = (size_t)qwen3_q_dim(c), inter = c->intermediate_size, vocab = c->vocab_size;
    size_t attention_ws = 0;
    for (int i = 0; i < N_BUCKETS && BUCKETS[i] <= rows; i++) {
        const size_t ws = (size_t)BUCKETS[i] * cuda_attention_decode_workspace(c->n_heads, c->head_dim, batch_splits(b, BUCKETS[i]));
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
    sizes[PARTIALS] = b->batch_split > 1 ? (size_t)b->batch_split * R * hidden * 4 : 0;
    const size_t total = parts_bytes(sizes, N_PARTS);
    CUDA_CHECK(cudaMalloc(&b->bat_bytes, total));
    CUDA_CHECK(cudaMemset(b->bat_bytes, 0, total)); /* counters start at zero; padding rows stay finite */
    void *parts[N_PARTS];
    split_parts(b->bat_bytes, sizes, N_PARTS, parts);
    b->bat_x = static_cast<float *>(parts[X]);
    b->bat_qkv = static_cast<float *>(parts[QKV]);
    b->bat_logits = static_cast<float *>(parts[LOGITS]);
    b->bat_attention16 = static_cast<bf16 *>(parts[ATT16]);
    b->bat_normed = static_cast<bf16 *>(parts[NORMED]);
    b->bat_gate_up = static_cast<bf16 *>(parts[GATE_UP]);
    b->bat_act16 = static_cast<bf16 *>(parts[ACT16]);
    b->bat_attention_ws = parts[ATT_WS];
    b->bat_argmax_ws = parts[ARGMAX_WS];
    b->bat_counters = static_cast<unsigned *>(parts[COUNTERS]);
    b->bat_ids = static_cast<int32_t *>(parts[IDS]);
    b->bat_partials = b->batch_split > 1 ? static_cast<float *>(parts[PARTIALS]) : NULL;
    b->bat_capacity = rows;
    return KITE_OK;
}

/* The step buffer (host pinned + device) for `table_ints` block-table entries. */
kite_status ensure_batch_step(cuda_backend *b, size_t table_ints) {
    const size_t need = (size_t)BATCH_TABLES + table_ints;
    if (need <= b->bat_step_ints) return KITE_OK;
    const size_t capacity = grown_capacity(b->bat_step_ints, (size_t)BATCH_TABLES + 4096, need);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    KITE_TRY(destroy_batch_graphs(b));
    b->bat_step_ints = 0;
    KITE_TRY(replace_device_and_pinned(&b->bat_step_device, capacity * sizeof(int32_t), &b->bat_step_host,
                                       capacity * sizeof(int32_t)));
    b->bat_step_ints = capacity;
    return KITE_OK;
}

} // namespace

/* The cluster size of the bulk-fed attention for a bucket of `rows` rows, 0 for the split-K kernel: buckets
 * up to batch_bulk_max_rows whose clusters (of 1 to 16 blocks per sequence and kv head) all fit at once. */
int batch_bulk_cluster(const cuda_backend *b, int32_t rows) {
    return rows <= b->batch_bulk_max_rows ? b->bat_bulk_cluster[bucket_index(rows)] : 0;
}

namespace {

/* The batched attention of one layer (Q/K norm, RoPE and the K/V append fused): the bulk-fed cluster kernel
 * where batch_bulk_cluster() allows, else split-K. */
kite_status batch_attention(cuda_backend *b, int layer, int32_t rows, void *out, int out_bf16, int pdl) {
    const qwen3_config *c = &b->config;
    const cuda_layer *L = &b->layers[layer];
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
    const int32_t *step = b->bat_step_device;
    const int32_t *context = step + BATCH_CONTEXT, *table_start = step + BATCH_TABLE_START, *tables = step + BATCH_TABLES;
    const int cluster = batch_bulk_cluster(b, rows);
    if (cluster > 0)
        return cuda_attention_decode_bulk_rows(b->bat_qkv, out, out_bf16, kv_layer(b, layer), tables, table_start,
                                               context, L->q_norm, L->k_norm, b->rope_cos, b->rope_sin, eps,
                                               c->n_heads, scale, rows, cluster, b->stream, pdl);
    return cuda_attention_decode_rows(b->bat_qkv, out, out_bf16, kv_layer(b, layer), tables, table_start, context,
                                      L->q_norm, L->k_norm, b->rope_cos, b->rope_sin, eps, c->n_heads, scale, rows,
                                      batch_splits(b, rows), b->bat_attention_ws, b->bat_counters, b->stream, pdl);
}

/* Whether a bucket of `rows` rows runs its products through gemm_rows (up to rows_max rows, where every
 * product's input rows fit its shared memory; e.g. a 14B model's 17,408-column down projection does not at 8
 * rows) rather than cuBLASLt. Measured slower: gemm_rows for 9-32 rows after a separate RMSNorm kernel (1.644 vs
 * 1.399 ms per step at B=32 through cuBLASLt), for single products at 32 rows (each one), and a gemm_rows that
 * stages only a k slice per block (B=32 1.655 ms). */
bool batch_gemm_rows(const cuda_backend *b, int32_t rows) {
    const qwen3_config *c = &b->config;
    return rows <= b->rows_max && cuda_gemm_rows_fits(rows, c->hidden_size) &&
           cuda_gemm_rows_fits(rows, qwen3_q_dim(c)) && cuda_gemm_rows_fits(rows, c->intermediate_size);
}

/* The lm_head (final norm, logits, argmax) through gemm_rows up to batch_lm_head_rows_max rows where its input
 * fits, else cuBLASLt. normed_ready: bat_normed already holds the final norm of bat_x (the split products' last
 * residual_rmsnorm), so neither path takes the norm again: gemm_rows stages bat_normed as it is (bf16). */
kite_status batch_lm_head(cuda_backend *b, int32_t rows, int pdl, bool normed_ready) {
    const qwen3_config *c = &b->config;
    const int hidden = c->hidden_size, vocab = c->vocab_size;
    const float eps = (float)c->rms_norm_eps;
    void *st = b->stream;
    if (rows <= b->batch_lm_head_rows_max && cuda_gemm_rows_fits(rows, hidden)) {
        const void *input = normed_ready ? static_cast<const void *>(b->bat_normed) : b->bat_x;
        KITE_TRY(cuda_gemm_rows(b->lm_head, input, normed_ready, normed_ready ? NULL : b->final_norm, eps,
                                b->bat_logits, 0, rows, vocab, hidden, CUDA_GEMV_ARGMAX, b->bat_argmax_ws, b->bat_ids,
                                st, pdl));
    } else {
        if (!normed_ready) KITE_TRY(cuda_rmsnorm(b->bat_x, b->final_norm, b->bat_normed, NULL, rows, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->bat_normed, b->lm_head, b->bat_logits, 1, 0.0f, rows, vocab, hidden, st));
        KITE_TRY(cuda_argmax_rows(b->bat_logits, b->bat_ids, rows, vocab, st));
    }
    /* The ids to the host by the step itself (bat_publish_host), as the single-stream step does. */
    return cuda_publish_ids(b->bat_ids, rows, b->bat_step_device + BATCH_CONTEXT, b->bat_publish_device, st, pdl);
}

kite_status batch_launches(cuda_backend *b, int32_t rows) {
    const qwen3_config *c = &b->config;
    void *st = b->stream;
    const int hidden = c->hidden_size, inter = c->intermediate_size;
    const int qd = qwen3_q_dim(c), qkv_dim = qwen3_qkv_dim(c);
    const float eps = (float)c->rms_norm_eps;
    const int32_t *tokens = b->bat_step_device + BATCH_TOKENS;
    const int pdl = b->use_pdl ? 1 : 0;
    /* A negative token: that row's argmax of the previous batched step (overlapped decode, forward_batch). */
    KITE_TRY(cuda_embed(b->embed, tokens, b->bat_ids, b->bat_x, rows, hidden, st, 0));
    if (batch_gemm_rows(b, rows)) {
        /* Fused tensor-core kernels, chained by programmatic dependent launch (5 per layer, as B = 1). The
         * attention output and the SwiGLU product are kept as bf16 (o_proj and down round their input to bf16
         * anyway), so those two stage their input by cp.async in one round trip. */
        for (int l = 0; l < c->n_layers; l++) {
            const cuda_layer *L = &b->layers[l];
            KITE_TRY(cuda_gemm_rows(L->qkv, b->bat_x, 0, L->input_norm, eps, b->bat_qkv, 0, rows, qkv_dim, hidden,
                                    CUDA_GEMV_STORE, NULL, NULL, st, pdl));
            KITE_TRY(batch_attention(b, l, rows, b->bat_attention16, 1, pdl));
            KITE_TRY(cuda_gemm_rows(L->o, b->bat_attention16, 1, NULL, 0.0f, b->bat_x, 0, rows, hidden, qd,
                                    CUDA_GEMV_ADD_SETTLED, NULL, NULL, st, pdl));
            KITE_TRY(cuda_gemm_rows(L->gate_up, b->bat_x, 0, L->post_norm, eps, b->bat_act16, 1, rows, 2 * inter,
                                    hidden, CUDA_GEMV_SWIGLU, NULL, NULL, st, pdl));
            KITE_TRY(cuda_gemm_rows(L->down, b->bat_act16, 1, NULL, 0.0f, b->bat_x, 0, rows, hidden, inter,
                                    CUDA_GEMV_ADD_SETTLED, NULL, NULL, st, pdl));
        }
        return batch_lm_head(b, rows, pdl, false);
    }
    /* cuBLASLt GEMMs (M = rows), the same batched attention, SwiGLU on its own. Up to batch_split_max_rows rows
     * o_proj and down are split along k: their partials are added to the residual by the kernel that also takes
     * the next RMSNorm (of gate/up, of the next layer's qkv, of the lm_head), so only layer 0's input norm is a
     * kernel of its own and cuBLASLt launches no reduction. Otherwise o_proj and down add into the residual
     * (beta = 1) and each norm is a separate kernel. */
    const bool split = b->batch_split > 1 && rows <= b->batch_split_max_rows;
    const int S = b->batch_split;
    if (split) KITE_TRY(cuda_rmsnorm(b->bat_x, b->layers[0].input_norm, b->bat_normed, NULL, rows, hidden, eps, st));
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &b->layers[l];
        const float *next_norm = l + 1 < c->n_layers ? b->layers[l + 1].input_norm : b->final_norm;
        if (!split) KITE_TRY(cuda_rmsnorm(b->bat_x, L->input_norm, b->bat_normed, NULL, rows, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->bat_normed, L->qkv, b->bat_qkv, 1, 0.0f, rows, qkv_dim, hidden, st));
        KITE_TRY(batch_attention(b, l, rows, b->bat_attention16, 1, pdl));
        if (!split) {
            KITE_TRY(cuda_gemm_bf16(b->gemm, b->bat_attention16, L->o, b->bat_x, 1, 1.0f, rows, hidden, qd, st));
        } else {
            KITE_TRY(cuda_gemm_bf16_split(b->gemm, b->bat_attention16, L->o, b->bat_partials, S, rows, hidden, qd, st));
            KITE_TRY(cuda_residual_rmsnorm(b->bat_x, b->bat_partials, S, L->post_norm, b->bat_normed, rows, hidden, eps,
                                           st));
        }
        if (!split) KITE_TRY(cuda_rmsnorm(b->bat_x, L->post_norm, b->bat_normed, NULL, rows, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(b->gemm, b->bat_normed, L->gate_up, b->bat_gate_up, 0, 0.0f, rows, 2 * inter, hidden,
                                st));
        KITE_TRY(cuda_swiglu(b->bat_gate_up, b->bat_act16, rows, inter, st));
        if (!split) {
            KITE_TRY(cuda_gemm_bf16(b->gemm, b->bat_act16, L->down, b->bat_x, 1, 1.0f, rows, hidden, inter, st));
        } else {
            KITE_TRY(cuda_gemm_bf16_split(b->gemm, b->bat_act16, L->down, b->bat_partials, S, rows, hidden, inter, st));
            KITE_TRY(cuda_residual_rmsnorm(b->bat_x, b->bat_partials, S, next_norm, b->bat_normed, rows, hidden, eps,
                                           st));
        }
    }
    return batch_lm_head(b, rows, pdl, split);
}

kite_status capture_batch_graph(cuda_backend *b, int bucket) {
    char what[32];
    snprintf(what, sizeof what, "batch graph %d", (int)BUCKETS[bucket]);
    return capture_graph(b->stream, [&] { return batch_launches(b, BUCKETS[bucket]); }, &b->bat_graphs[bucket], what);
}

} // namespace

kite_status forward_batch(cuda_backend *b, const step_batch *batch, const int32_t *chained) {
    const int32_t n = batch->n_seqs, bs = b->kv_block_size;
    const int bucket = bucket_index(n);
    const int32_t rows = BUCKETS[bucket];
    size_t table_ints = 1; /* entry 0: the scratch block of the dummy rows */
    for (int32_t s = 0; s < n; s++) table_ints += (size_t)KITE_CEIL_DIV(batch->seq_context_len[s], bs);
    KITE_TRY(ensure_batch(b, rows));
    KITE_TRY(ensure_batch_step(b, table_ints));
    CUDA_CHECK(cudaEventSynchronize(b->bat_step_copied)); /* the previous step's copy has left the host buffer */
    int32_t *h = b->bat_step_host;
    int32_t *tables = h + BATCH_TABLES;
    tables[0] = b->kv_blocks; /* the scratch block past the engine's blocks (kv_reserve) */
    size_t at = 1;
    for (int32_t s = 0; s < rows; s++) {
        if (s < n) {
            const int32_t context = batch->seq_context_len[s], n_blocks = KITE_CEIL_DIV(context, bs);
            /* The graph's embedding reads bat_ids[s] for a negative id (overlapped decode after a batched step). */
            h[BATCH_TOKENS + s] = chained ? (chained == b->bat_ids ? -1 : 0) : batch->token_ids[s];
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
    CUDA_CHECK(cudaMemcpyAsync(b->bat_step_device, h, ((size_t)BATCH_TABLES + at) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, b->stream));
    CUDA_CHECK(cudaEventRecord(b->bat_step_copied, b->stream));
    if (chained && chained != b->bat_ids)
        CUDA_CHECK(cudaMemcpyAsync(b->bat_step_device + BATCH_TOKENS, chained, (size_t)n * sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, b->stream));
    if (b->use_graph && b->bat_graphs[bucket]) {
        CUDA_CHECK(cudaGraphLaunch(b->bat_graphs[bucket], b->stream));
    } else {
        /* The first step of a bucket runs eagerly (modules load, cuBLASLt plans and kernel attributes are
         * set outside any capture), then the graph is captured for the steps after it. */
        KITE_TRY(batch_launches(b, rows));
        if (b->use_graph) KITE_TRY(capture_batch_graph(b, bucket));
    }
    b->kept_logits = b->bat_logits;
    b->kept_rows = n;
    b->kept_decode = false;
    b->kept_published = b->bat_publish_host + (batch->seq_context_len[0] & 1) * rows;
    b->kept_batch = true;
    return KITE_OK;
}

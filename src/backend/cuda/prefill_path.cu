/* The prefill path: any step batch - prefill chunks, the decode tokens of several sequences, mixed steps - and the
 * steps the decode paths do not take (a sequence that wants no logits, batches past BATCH_MAX or with
 * KITE_CUDA_BATCH=0). Every token of the batch goes through each layer at once, the residual stream in fp32:
 *   embed; per layer: rmsnorm, qkv GEMM (cuBLASLt), qk_norm_rope_kv (Q/K norm, RoPE, K/V appended to the paged cache),
 *   attention, o_proj GEMM into the residual, rmsnorm, gate_up GEMM, swiglu, down GEMM into the residual; then for
 *   the rows that want logits the final rmsnorm and the lm_head GEMM.
 * The attention: the step's leading one-token sequences (the decode rows of a mixed step: the engine puts
 * generating sequences first) take the split-K decode attention (cuda_attention_decode_prepared: one K/V read for
 * the query heads that share it, and an fp8 cache read directly), the others the tensor-core flash attention over
 * each sequence's blocks (attention_prefill). Measured on the H200 (0.6B, depth 256, docs/cuda.md): 128 decode rows
 * plus a 256-token chunk 3.30 ms a step against 4.91 with every row in the flash attention (fp8 KV 3.12 against 9.79).
 * With --weights fp8 each layer's four matrices are dequantized to bf16 one layer ahead, on a side stream, into the
 * other of two scratches (fp8_prefetch.cu), so the memory-bound pass runs under the previous layer's products.
 * With an fp8 KV cache qk_norm_rope_kv writes codes and scales, and the flash attention reads a bf16 view: per layer
 * the blocks of the prompt sequences' block tables (the current chunk's K/V included) are dequantized into fp8_view, laid out as a
 * bf16 layer, and the attention kernels run on it unchanged, with block table entry j of the step mapped to view
 * block j (less its group's first entry). The view is bounded: the sequences go in groups of consecutive sequences
 * whose blocks fit in max(FP8_VIEW_MIN_POSITIONS, the step's longest context) positions, one dequantization and one
 * attention launch per group (a single sequence's whole context must be in the view at once, since one attention
 * launch reads all of it).
 * Bounded by the tensor cores' rate in the GEMMs (long chunks) and by one kernel launch per operation (short ones);
 * no graph: the shapes change with every step. Its buffers grow to the largest step seen.
 */
#include "backend/cuda/prefill_path.cuh"

#include <math.h>
#include <string.h>

namespace {

/* The fp8 view's least size in positions (per layer: 8,192 x 2 x n_kv_heads x head_dim x 2 bytes, 32 MiB for the
 * 0.6B shape): steps of short sequences share one dequantization and one attention launch. */
constexpr int32_t FP8_VIEW_MIN_POSITIONS = 8192;

/* The bf16 view of `blocks` blocks of an fp8 layer. */
kite_status ensure_fp8_view(cuda_core *core, prefill_state *p, int32_t blocks) {
    const cuda_kv_layer shape = {NULL, core->kv_block_size, core->config.n_kv_heads, core->config.head_dim, 0,
                                 KITE_KV_CACHE_BF16};
    const size_t bytes = (size_t)blocks * cuda_kv_block_bytes(shape);
    if (bytes <= p->fp8_view_bytes) return KITE_OK;
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    if (p->fp8_view) CUDA_CHECK(cudaFree(p->fp8_view));
    p->fp8_view = NULL;
    p->fp8_view_bytes = 0;
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&p->fp8_view), bytes));
    p->fp8_view_bytes = bytes;
    return KITE_OK;
}

/* The split-K decode attention's workspace and counters for n_seqs sequences of n_splits splits. */
kite_status ensure_decode_rows(cuda_core *core, prefill_state *p, int32_t n_seqs, int n_splits) {
    const qwen3_config *c = &core->config;
    const size_t ws = (size_t)n_seqs * cuda_attention_decode_workspace(c->n_heads, c->head_dim, n_splits);
    const int32_t counters = n_seqs * c->n_heads;
    if (ws <= p->decode_ws_bytes && counters <= p->decode_counter_count) return KITE_OK;
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    if (ws > p->decode_ws_bytes) {
        if (p->decode_ws) CUDA_CHECK(cudaFree(p->decode_ws));
        p->decode_ws = NULL;
        p->decode_ws_bytes = 0;
        CUDA_CHECK(cudaMalloc(&p->decode_ws, ws));
        p->decode_ws_bytes = ws;
    }
    if (counters > p->decode_counter_count) {
        if (p->decode_counters) CUDA_CHECK(cudaFree(p->decode_counters));
        p->decode_counters = NULL;
        p->decode_counter_count = 0;
        CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&p->decode_counters), (size_t)counters * sizeof(unsigned)));
        CUDA_CHECK(cudaMemset(p->decode_counters, 0, (size_t)counters * sizeof(unsigned)));
        p->decode_counter_count = counters;
    }
    return KITE_OK;
}

/* Activations for n_tokens tokens. */
kite_status ensure_tokens(cuda_core *core, prefill_state *p, int32_t n_tokens) {
    if (n_tokens <= p->token_capacity) return KITE_OK;
    const qwen3_config *c = &core->config;
    int32_t capacity = p->token_capacity ? p->token_capacity : 256;
    while (capacity < n_tokens) capacity *= 2;
    const size_t T = (size_t)capacity;
    const size_t hidden = c->hidden_size, qd = (size_t)qwen3_q_dim(c);
    const size_t qkv = (size_t)qwen3_qkv_dim(c), inter = c->intermediate_size;
    const size_t sizes[7] = {T * hidden * 4, T * hidden * 2, T * qkv * 2, T * qd * 2, T * qd * 2, T * 2 * inter * 2, T * inter * 2};
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    if (p->activation_bytes) CUDA_CHECK(cudaFree(p->activation_bytes));
    p->activation_bytes = NULL;
    p->token_capacity = 0;
    CUDA_CHECK(cudaMalloc(&p->activation_bytes, parts_bytes(sizes, 7)));
    void *parts[7];
    split_parts(p->activation_bytes, sizes, 7, parts);
    p->x = static_cast<float *>(parts[0]);
    p->normed = static_cast<bf16 *>(parts[1]);
    p->qkv = static_cast<bf16 *>(parts[2]);
    p->q = static_cast<bf16 *>(parts[3]);
    p->attention = static_cast<bf16 *>(parts[4]);
    p->gate_up = static_cast<bf16 *>(parts[5]);
    p->act = static_cast<bf16 *>(parts[6]);
    p->token_capacity = capacity;
    return KITE_OK;
}

/* The step metadata (host pinned + device) for n_ints int32s. */
kite_status ensure_meta(cuda_core *core, prefill_state *p, size_t n_ints) {
    if (n_ints <= p->meta_capacity) return KITE_OK;
    const size_t capacity = grown_capacity(p->meta_capacity, (size_t)4096, n_ints);
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    p->meta_capacity = 0;
    KITE_TRY(replace_device_and_pinned(&p->meta_device, capacity * sizeof(int32_t), &p->meta_host,
                                       capacity * sizeof(int32_t)));
    p->meta_capacity = capacity;
    return KITE_OK;
}

/* Logits for `rows` rows. */
kite_status ensure_logits(cuda_core *core, prefill_state *p, int32_t rows) {
    if (rows <= p->logits_rows) return KITE_OK;
    const int32_t capacity = grown_capacity(p->logits_rows, (int32_t)8, rows);
    CUDA_CHECK(cudaStreamSynchronize(core->stream));
    if (p->logits) CUDA_CHECK(cudaFree(p->logits));
    p->logits = NULL;
    p->logits_rows = 0;
    CUDA_CHECK(cudaMalloc(&p->logits, (size_t)capacity * (size_t)core->config.vocab_size * sizeof(float)));
    p->logits_rows = capacity;
    return KITE_OK;
}

} // namespace

kite_status forward_prefill(cuda_core *core, prefill_state *p, const step_batch *batch, step_tokens tokens,
                            kept_rows *kept) {
    const qwen3_config *c = &core->config;
    const int32_t T = batch->n_tokens, S = batch->n_seqs, bs = core->kv_block_size;
    int32_t rows = 0;
    size_t table_ints = 0;
    /* The leading one-token sequences (the engine puts generating sequences first) are decode rows: they take the
     * split-K decode attention, which reads each K/V row once for the heads that share it and an fp8 cache
     * directly; the sequences from n_decode on take the prefill attention. */
    int32_t n_decode = 0;
    while (n_decode < S && batch->seq_token_start[n_decode + 1] - batch->seq_token_start[n_decode] == 1) n_decode++;
    size_t decode_entries = 0; /* block table entries of the decode rows, which come first */
    int32_t max_new = 0;       /* the most new tokens of the prompt sequences */
    for (int32_t s = 0; s < S; s++) {
        rows += batch->seq_wants_logits[s] ? 1 : 0;
        const size_t n_blocks = (size_t)KITE_CEIL_DIV(batch->seq_context_len[s], bs);
        table_ints += n_blocks;
        if (s < n_decode) decode_entries += n_blocks;
        const int32_t n_new = batch->seq_token_start[s + 1] - batch->seq_token_start[s];
        if (s >= n_decode && n_new > max_new) max_new = n_new;
    }
    KITE_TRY(ensure_tokens(core, p, T));
    if (rows > 0) KITE_TRY(ensure_logits(core, p, rows));
    const int decode_splits = n_decode > 0 ? attention_splits(core, n_decode) : 0;
    if (n_decode > 0) KITE_TRY(ensure_decode_rows(core, p, n_decode, decode_splits));
    const bool fp8_kv = core->kv_dtype == KITE_KV_CACHE_FP8;
    const bool fp8_view = fp8_kv && n_decode < S;
    /* fp8: the view's size and, after the logit rows, its block tables (entry j -> j less its group's first), for
     * the prompt sequences. */
    int32_t view_blocks = 0;
    if (fp8_view) {
        view_blocks = KITE_CEIL_DIV(FP8_VIEW_MIN_POSITIONS, bs);
        for (int32_t s = n_decode; s < S; s++) {
            const int32_t n_blocks = KITE_CEIL_DIV(batch->seq_context_len[s], bs);
            if (n_blocks > view_blocks) view_blocks = n_blocks;
        }
        KITE_TRY(ensure_fp8_view(core, p, view_blocks));
    }
    const size_t n_ints = 3 * (size_t)T + (size_t)(S + 1) + 2 * (size_t)S + table_ints + (size_t)rows +
                          (fp8_view ? table_ints : 0);
    KITE_TRY(ensure_meta(core, p, n_ints));
    CUDA_CHECK(cudaEventSynchronize(p->meta_copied)); /* the previous step's copy has left the host buffer */

    int32_t *h = p->meta_host;
    int32_t *ids = h, *positions = ids + T, *slots = positions + T, *token_start = slots + T;
    int32_t *ctx = token_start + S + 1, *table_start = ctx + S, *tables = table_start + S;
    int32_t *logit_rows = tables + table_ints;
    if (tokens.on_device) /* the ids are copied on the device below */
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
    if (fp8_view) { /* the groups as the attention loop below forms them */
        int32_t *view_tables = logit_rows + rows;
        size_t entry = decode_entries, group_first = decode_entries, group_entries = 0;
        for (int32_t s = n_decode; s < S; s++) {
            const size_t n_blocks = (size_t)KITE_CEIL_DIV(batch->seq_context_len[s], bs);
            if (group_entries > 0 && group_entries + n_blocks > (size_t)view_blocks) {
                group_first = entry;
                group_entries = 0;
            }
            for (size_t i = 0; i < n_blocks; i++, entry++) view_tables[entry] = (int32_t)(entry - group_first);
            group_entries += n_blocks;
        }
    }
    CUDA_CHECK(cudaMemcpyAsync(p->meta_device, h, n_ints * sizeof(int32_t), cudaMemcpyHostToDevice, core->stream));
    CUDA_CHECK(cudaEventRecord(p->meta_copied, core->stream));
    if (tokens.on_device) /* one token per sequence: the previous step's argmax rows, in order */
        CUDA_CHECK(cudaMemcpyAsync(p->meta_device, tokens.ids, (size_t)T * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                   core->stream));

    int32_t *d = p->meta_device;
    const int32_t *d_ids = d, *d_positions = d + T, *d_slots = d + 2 * T, *d_token_start = d + 3 * T;
    const int32_t *d_ctx = d_token_start + S + 1, *d_table_start = d_ctx + S, *d_tables = d_table_start + S;
    const int32_t *d_logit_rows = d_tables + table_ints;
    const int32_t *d_view_tables = d_logit_rows + rows;
    cuda_seq_meta prompts; /* the sequences from n_decode on */
    prompts.token_start = d_token_start + n_decode;
    prompts.context_len = d_ctx + n_decode;
    prompts.block_table_start = d_table_start + n_decode;
    prompts.block_tables = d_tables;
    prompts.n_seqs = S - n_decode;
    prompts.max_new_tokens = max_new;

    void *st = core->stream;
    const int hidden = c->hidden_size, inter = c->intermediate_size;
    const int qd = qwen3_q_dim(c), qkv_dim = qwen3_qkv_dim(c);
    const float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
    KITE_TRY(cuda_embed(core->embed, d_ids, NULL, p->x, T, hidden, st, 0));
    const bool fp8 = core->weights == KITE_WEIGHTS_FP8;
    if (fp8) KITE_TRY(fp8_prefetch_begin(core));
    cuda_layer dequantized;
    for (int l = 0; l < c->n_layers; l++) {
        const cuda_layer *L = &core->layers[l];
        if (fp8) KITE_TRY(fp8_prefetch_layer(core, l, &dequantized, &L));
        const cuda_kv_layer kv = kv_layer(core, l);
        KITE_TRY(cuda_rmsnorm(p->x, L->input_norm, p->normed, NULL, T, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(core->gemm, p->normed, L->qkv, p->qkv, 0, 0.0f, T, qkv_dim, hidden, st));
        KITE_TRY(cuda_qk_norm_rope_kv(p->qkv, p->q, 0, d_positions, d_slots, L->q_norm, L->k_norm, core->rope_cos,
                                      core->rope_sin, kv, T, c->n_heads, eps, st, 0));
        /* The decode rows: sequence s < n_decode has token s, so its query is row s of q and its output row s. */
        if (n_decode > 0)
            KITE_TRY(cuda_attention_decode_prepared(p->q, p->attention, kv, d_tables, d_table_start, d_ctx, c->n_heads,
                                                    scale, n_decode, decode_splits, p->decode_ws, p->decode_counters,
                                                    st));
        if (fp8_view) {
            /* Groups of consecutive sequences whose blocks fit in the view (the same as view_tables above). */
            const cuda_kv_layer view = {p->fp8_view, bs, c->n_kv_heads, c->head_dim, view_blocks, KITE_KV_CACHE_BF16};
            int32_t first_seq = n_decode, group_first = (int32_t)decode_entries, group_entries = 0, group_new = 0;
            int32_t entry = (int32_t)decode_entries;
            for (int32_t s = n_decode; s <= S; s++) {
                const int32_t n_blocks = s < S ? KITE_CEIL_DIV(batch->seq_context_len[s], bs) : 0;
                if (s == S || (group_entries > 0 && group_entries + n_blocks > view_blocks)) {
                    KITE_TRY(cuda_kv_fp8_dequantize_blocks(kv, d_tables, group_first, group_entries, p->fp8_view, st));
                    cuda_seq_meta group = {d_token_start + first_seq, d_ctx + first_seq, d_table_start + first_seq,
                                           d_view_tables, s - first_seq, group_new};
                    KITE_TRY(cuda_attention_prefill(p->q, p->attention, view, group, c->n_heads, scale, st));
                    first_seq = s;
                    group_first = entry;
                    group_entries = group_new = 0;
                }
                if (s == S) break;
                const int32_t n_new = batch->seq_token_start[s + 1] - batch->seq_token_start[s];
                group_entries += n_blocks;
                entry += n_blocks;
                if (n_new > group_new) group_new = n_new;
            }
        } else if (n_decode < S) {
            KITE_TRY(cuda_attention_prefill(p->q, p->attention, kv, prompts, c->n_heads, scale, st));
        }
        KITE_TRY(cuda_gemm_bf16(core->gemm, p->attention, L->o, p->x, 1, 1.0f, T, hidden, qd, st));
        KITE_TRY(cuda_rmsnorm(p->x, L->post_norm, p->normed, NULL, T, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(core->gemm, p->normed, L->gate_up, p->gate_up, 0, 0.0f, T, 2 * inter, hidden, st));
        KITE_TRY(cuda_swiglu(p->gate_up, p->act, T, inter, st));
        KITE_TRY(cuda_gemm_bf16(core->gemm, p->act, L->down, p->x, 1, 1.0f, T, hidden, inter, st));
        if (fp8) KITE_TRY(fp8_prefetch_release(core, l));
    }
    if (rows > 0) {
        KITE_TRY(cuda_rmsnorm(p->x, core->final_norm, p->normed, d_logit_rows, rows, hidden, eps, st));
        KITE_TRY(cuda_gemm_bf16(core->gemm, p->normed, core->lm_head, p->logits, 1, 0.0f, rows, c->vocab_size, hidden, st));
    }
    *kept = kept_rows{KEPT_PREFILL, rows, p->logits, NULL, NULL};
    return KITE_OK;
}

void prefill_free(prefill_state *p) {
    cudaFree(p->activation_bytes);
    cudaFreeHost(p->meta_host);
    cudaFree(p->meta_device);
    cudaFree(p->logits);
    cudaFree(p->fp8_view);
    cudaFree(p->decode_ws);
    cudaFree(p->decode_counters);
    if (p->meta_copied) cudaEventDestroy(p->meta_copied);
}

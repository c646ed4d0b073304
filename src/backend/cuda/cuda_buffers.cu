/* The CUDA backend's buffers that grow with the step: the general path's activations and metadata, and the rows of
 * logits with their argmax ids; and a layer's view of the paged KV cache. */
#include "backend/cuda/cuda_backend_state.cuh"

kite_status ensure_tokens(cuda_backend *b, int32_t n_tokens) {
    if (n_tokens <= b->token_capacity) return KITE_OK;
    const qwen3_config *c = &b->config;
    int32_t capacity = b->token_capacity ? b->token_capacity : 256;
    while (capacity < n_tokens) capacity *= 2;
    const size_t T = (size_t)capacity;
    const size_t hidden = c->hidden_size, qd = (size_t)qwen3_q_dim(c);
    const size_t qkv = (size_t)qwen3_qkv_dim(c), inter = c->intermediate_size;
    const size_t sizes[7] = {T * hidden * 4, T * hidden * 2, T * qkv * 2, T * qd * 2, T * qd * 2, T * 2 * inter * 2, T * inter * 2};
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    if (b->activation_bytes) CUDA_CHECK(cudaFree(b->activation_bytes));
    b->activation_bytes = NULL;
    b->token_capacity = 0;
    CUDA_CHECK(cudaMalloc(&b->activation_bytes, parts_bytes(sizes, 7)));
    void *parts[7];
    split_parts(b->activation_bytes, sizes, 7, parts);
    b->x = static_cast<float *>(parts[0]);
    b->normed = static_cast<bf16 *>(parts[1]);
    b->qkv = static_cast<bf16 *>(parts[2]);
    b->q = static_cast<bf16 *>(parts[3]);
    b->attention = static_cast<bf16 *>(parts[4]);
    b->gate_up = static_cast<bf16 *>(parts[5]);
    b->act = static_cast<bf16 *>(parts[6]);
    b->token_capacity = capacity;
    return KITE_OK;
}

kite_status ensure_meta(cuda_backend *b, size_t n_ints) {
    if (n_ints <= b->meta_capacity) return KITE_OK;
    const size_t capacity = grown_capacity(b->meta_capacity, (size_t)4096, n_ints);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    b->meta_capacity = 0;
    KITE_TRY(replace_device_and_pinned(&b->meta_device, capacity * sizeof(int32_t), &b->meta_host,
                                       capacity * sizeof(int32_t)));
    b->meta_capacity = capacity;
    return KITE_OK;
}

kite_status ensure_logits(cuda_backend *b, int32_t rows) {
    if (rows <= b->logits_rows) return KITE_OK;
    const int32_t capacity = grown_capacity(b->logits_rows, (int32_t)8, rows);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    if (b->logits) CUDA_CHECK(cudaFree(b->logits));
    b->logits = NULL;
    b->logits_rows = 0;
    CUDA_CHECK(cudaMalloc(&b->logits, (size_t)capacity * (size_t)b->config.vocab_size * sizeof(float)));
    KITE_TRY(replace_device_and_pinned(&b->ids_device, (size_t)capacity * sizeof(int32_t), &b->ids_host,
                                       (size_t)capacity * sizeof(int32_t)));
    b->logits_rows = capacity;
    return KITE_OK;
}

cuda_kv_layer kv_layer(cuda_backend *b, int layer) {
    cuda_kv_layer kv;
    kv.base = b->kv_cache + (size_t)layer * b->kv_layer_elements;
    kv.block_size = b->kv_block_size;
    kv.n_kv_heads = b->config.n_kv_heads;
    kv.head_dim = b->config.head_dim;
    return kv;
}

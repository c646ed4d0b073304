/* Backend helpers shared by every implementation. */
#include "backend/backend.h"


size_t kv_bytes_per_position(const qwen3_config *config, size_t element_size) {
    /* A config that cannot describe a model has no KV footprint (0 tells the caller nothing fits). */
    if (!config || config->n_layers <= 0 || config->n_kv_heads <= 0 || config->head_dim <= 0) return 0;
    return 2 * (size_t)config->n_layers * (size_t)config->n_kv_heads * (size_t)config->head_dim * element_size;
}

bool backend_offers_overlap(const backend *b) { return b->ops->argmax_begin && b->ops->argmax_end; }

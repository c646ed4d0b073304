#include "engine/kv_cache.h"

#include <stdlib.h>

#include "util/error.h"

kite_status kv_pool_init(kv_block_pool *pool, int32_t n_blocks, int32_t block_size) {
    if (n_blocks <= 0 || block_size <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kv cache: %d blocks of %d positions is not a cache",
                         n_blocks, block_size);
    pool->free_ids = malloc((size_t)n_blocks * sizeof(int32_t));
    if (!pool->free_ids) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "kv cache: out of memory for the block list");
    pool->n_blocks = n_blocks;
    pool->block_size = block_size;
    pool->n_free = n_blocks;
    /* Lowest ids on top of the stack, so a fresh engine fills memory from the start. */
    for (int32_t i = 0; i < n_blocks; i++) pool->free_ids[i] = n_blocks - 1 - i;
    return KITE_OK;
}

void kv_pool_destroy(kv_block_pool *pool) {
    free(pool->free_ids);
    pool->free_ids = NULL;
    pool->n_blocks = pool->n_free = 0;
}

bool kv_pool_take(kv_block_pool *pool, int32_t *block_id) {
    if (pool->n_free == 0) return false;
    *block_id = pool->free_ids[--pool->n_free];
    return true;
}

void kv_pool_give_back(kv_block_pool *pool, int32_t block_id) { pool->free_ids[pool->n_free++] = block_id; }

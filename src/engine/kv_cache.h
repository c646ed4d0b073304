/* The KV cache's bookkeeping: which fixed-size blocks are free. The backend stores the keys and values;
 * this pool only hands out block ids (a stack of free ids, so a freed block is reused first and the
 * free count is always exact). */
#ifndef KITE_ENGINE_KV_CACHE_H
#define KITE_ENGINE_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "kite.h"

typedef struct kv_block_pool {
    int32_t n_blocks;
    int32_t block_size; /* positions per block */
    int32_t n_free;
    int32_t *free_ids;  /* free_ids[0 .. n_free) */
} kv_block_pool;

kite_status kv_pool_init(kv_block_pool *pool, int32_t n_blocks, int32_t block_size);
void kv_pool_destroy(kv_block_pool *pool);
/* Takes one block; false when none is free. */
bool kv_pool_take(kv_block_pool *pool, int32_t *block_id);
void kv_pool_give_back(kv_block_pool *pool, int32_t block_id);
/* Blocks needed to hold n_positions. */
static inline int32_t kv_blocks_for(const kv_block_pool *pool, int64_t n_positions) {
    return (int32_t)((n_positions + pool->block_size - 1) / pool->block_size);
}

#endif

#include "engine/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/hash64.h"

/* The bucket of a block: its token ids hashed with the parent's serial as the seed. Only an index: a match
 * compares the parent serial and the tokens themselves. */
static uint64_t content_hash(uint64_t parent_serial, const int32_t *tokens, int32_t n) {
    return hash64_seeded(tokens, (size_t)n * sizeof *tokens, parent_serial);
}

static kite_status alloc_cache(kv_block_pool *pool) {
    const size_t n = (size_t)pool->n_blocks;
    if (n > SIZE_MAX / sizeof(int32_t) / (size_t)pool->block_size)
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "kv cache: %d blocks of %d token ids do not fit in memory",
                         pool->n_blocks, pool->block_size);
    size_t buckets = 1;
    while (buckets < 2 * n) buckets *= 2; /* at most half full, so a bucket's chain is short */
    pool->serial = calloc(n, sizeof *pool->serial);
    pool->parent_serial = calloc(n, sizeof *pool->parent_serial);
    pool->hash = calloc(n, sizeof *pool->hash);
    pool->tokens = malloc(n * (size_t)pool->block_size * sizeof *pool->tokens);
    pool->bucket_head = malloc(buckets * sizeof *pool->bucket_head);
    pool->bucket_next = malloc(n * sizeof *pool->bucket_next);
    pool->lru_prev = malloc(n * sizeof *pool->lru_prev);
    pool->lru_next = malloc(n * sizeof *pool->lru_next);
    if (!pool->serial || !pool->parent_serial || !pool->hash || !pool->tokens || !pool->bucket_head ||
        !pool->bucket_next || !pool->lru_prev || !pool->lru_next)
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "kv cache: out of memory for the prefix cache of %d blocks",
                         pool->n_blocks);
    for (size_t b = 0; b < buckets; b++) pool->bucket_head[b] = -1;
    pool->bucket_mask = (uint64_t)buckets - 1;
    pool->lru_head = pool->lru_tail = -1;
    pool->next_serial = 1;
    return KITE_OK;
}

/* The truly free stack of a fresh pool: lowest ids on top, so a fresh engine fills memory from the start. */
static void fill_free_stack(kv_block_pool *pool) {
    pool->n_free = pool->n_blocks;
    for (int32_t i = 0; i < pool->n_blocks; i++) pool->free_ids[i] = pool->n_blocks - 1 - i;
}

kite_status kv_pool_init(kv_block_pool *pool, int32_t n_blocks, int32_t block_size, bool caching) {
    memset(pool, 0, sizeof *pool);
    if (n_blocks <= 0 || block_size <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kv cache: %d blocks of %d positions is not a cache",
                         n_blocks, block_size);
    pool->n_blocks = n_blocks;
    pool->block_size = block_size;
    pool->free_ids = malloc((size_t)n_blocks * sizeof(int32_t));
    pool->ref_count = calloc((size_t)n_blocks, sizeof(int32_t));
    if (!pool->free_ids || !pool->ref_count) {
        kv_pool_destroy(pool);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "kv cache: out of memory for the block list");
    }
    fill_free_stack(pool);
    pool->caching = caching;
    if (caching) {
        kite_status status = alloc_cache(pool);
        if (status != KITE_OK) {
            kv_pool_destroy(pool);
            return status;
        }
    }
    return KITE_OK;
}

void kv_pool_destroy(kv_block_pool *pool) {
    free(pool->free_ids);
    free(pool->ref_count);
    free(pool->serial);
    free(pool->parent_serial);
    free(pool->hash);
    free(pool->tokens);
    free(pool->bucket_head);
    free(pool->bucket_next);
    free(pool->lru_prev);
    free(pool->lru_next);
    memset(pool, 0, sizeof *pool);
}

bool kv_pool_reset(kv_block_pool *pool) {
    if (kv_pool_available(pool) != pool->n_blocks) return false;
    fill_free_stack(pool);
    if (pool->caching) {
        for (int32_t i = 0; i < pool->n_blocks; i++) pool->serial[i] = 0;
        for (uint64_t b = 0; b <= pool->bucket_mask; b++) pool->bucket_head[b] = -1;
        pool->lru_head = pool->lru_tail = -1;
        pool->n_cached_free = 0;
    }
    return true;
}

static void lru_unlink(kv_block_pool *pool, int32_t id) {
    const int32_t prev = pool->lru_prev[id], next = pool->lru_next[id];
    if (prev >= 0) pool->lru_next[prev] = next;
    else pool->lru_head = next;
    if (next >= 0) pool->lru_prev[next] = prev;
    else pool->lru_tail = prev;
    pool->n_cached_free--;
}

static void lru_append(kv_block_pool *pool, int32_t id) {
    pool->lru_prev[id] = pool->lru_tail;
    pool->lru_next[id] = -1;
    if (pool->lru_tail >= 0) pool->lru_next[pool->lru_tail] = id;
    else pool->lru_head = id;
    pool->lru_tail = id;
    pool->n_cached_free++;
}

/* Forgets the content a cached-free block holds, so it can be reused for anything. */
static void evict(kv_block_pool *pool, int32_t id) {
    int32_t *link = &pool->bucket_head[pool->hash[id] & pool->bucket_mask];
    while (*link != id) link = &pool->bucket_next[*link];
    *link = pool->bucket_next[id];
    pool->serial[id] = 0;
    pool->evictions++;
}

bool kv_pool_take(kv_block_pool *pool, int32_t *block_id) {
    int32_t id;
    if (pool->n_free > 0) {
        id = pool->free_ids[--pool->n_free];
    } else if (pool->n_cached_free > 0) {
        id = pool->lru_head;
        lru_unlink(pool, id);
        evict(pool, id);
    } else {
        return false;
    }
    pool->ref_count[id] = 1;
    *block_id = id;
    return true;
}

void kv_pool_release(kv_block_pool *pool, int32_t block_id) {
    if (--pool->ref_count[block_id] > 0) return;
    if (pool->caching && pool->serial[block_id] != 0)
        lru_append(pool, block_id);
    else
        pool->free_ids[pool->n_free++] = block_id;
}

int32_t kv_pool_lookup(const kv_block_pool *pool, uint64_t parent_serial, const int32_t *tokens) {
    const size_t bytes = (size_t)pool->block_size * sizeof *tokens;
    const uint64_t h = content_hash(parent_serial, tokens, pool->block_size);
    for (int32_t id = pool->bucket_head[h & pool->bucket_mask]; id >= 0; id = pool->bucket_next[id])
        if (pool->hash[id] == h && pool->parent_serial[id] == parent_serial &&
            memcmp(pool->tokens + (size_t)id * (size_t)pool->block_size, tokens, bytes) == 0)
            return id;
    return -1;
}

void kv_pool_acquire(kv_block_pool *pool, int32_t block_id) {
    if (pool->ref_count[block_id]++ == 0) lru_unlink(pool, block_id);
}

uint64_t kv_pool_register(kv_block_pool *pool, int32_t block_id, uint64_t parent_serial, const int32_t *tokens) {
    const int32_t existing = kv_pool_lookup(pool, parent_serial, tokens);
    if (existing >= 0) return pool->serial[existing];
    const uint64_t h = content_hash(parent_serial, tokens, pool->block_size);
    memcpy(pool->tokens + (size_t)block_id * (size_t)pool->block_size, tokens,
           (size_t)pool->block_size * sizeof *tokens);
    pool->serial[block_id] = pool->next_serial++;
    pool->parent_serial[block_id] = parent_serial;
    pool->hash[block_id] = h;
    const uint64_t bucket = h & pool->bucket_mask;
    pool->bucket_next[block_id] = pool->bucket_head[bucket];
    pool->bucket_head[bucket] = block_id;
    return pool->serial[block_id];
}

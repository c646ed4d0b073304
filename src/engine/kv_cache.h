/* The KV cache's bookkeeping: which fixed-size blocks are free, which are shared, and which hold a cached prefix.
 * The backend stores the keys and values; this pool only hands out block ids.
 *
 * Every block has a reference count: the requests (and lent callers) whose block tables hold it. A block nobody
 * references is either truly free (a stack of ids, so a freed block is reused first) or, with prefix caching, a
 * cached-free block: it still holds the keys and values of a full block of some earlier request and can be taken
 * back by a later request with the same prefix (kv_pool_lookup, kv_pool_acquire). Cached-free blocks wait in an
 * LRU list and are evicted from its front only when a block is needed and none is truly free.
 *
 * Automatic prefix caching, as vLLM v1's: only full blocks are cached, each under its content, which is the whole
 * token prefix up to and including the block. The content is keyed exactly, not by a hash alone: a cached block
 * stores its own block_size token ids and the serial number of the cached block before it (its parent; 0 for the
 * first block of a sequence). Serial numbers are never reused, so by induction from the first block a match means
 * the same tokens at every position of the prefix; a 64-bit hash of (parent serial, tokens) only picks the bucket.
 * When a parent is evicted its children become unreachable (nothing can name their parent's serial again) and
 * leave through the LRU list like any other cached-free block.
 */
#ifndef KITE_ENGINE_KV_CACHE_H
#define KITE_ENGINE_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "kite.h"

typedef struct kv_block_pool {
    int32_t n_blocks;
    int32_t block_size; /* positions per block */
    int32_t n_free;     /* truly free blocks: free_ids[0 .. n_free) */
    int32_t *free_ids;
    int32_t *ref_count; /* per block: the block tables that hold it */

    /* Prefix caching (all NULL / 0 when it is off): */
    bool caching;
    uint64_t *serial;        /* per block: the serial of the cached content it holds; 0 = none */
    uint64_t *parent_serial; /* per block: the serial of the content before it (0 = the sequence's first block) */
    uint64_t *hash;          /* per block: hash of (parent_serial, tokens), for its bucket */
    int32_t *tokens;         /* per block: its block_size token ids (n_blocks x block_size) */
    int32_t *bucket_head;    /* per bucket: the first cached block, -1 = none */
    int32_t *bucket_next;    /* per block: the next cached block in its bucket */
    uint64_t bucket_mask;    /* buckets - 1 (a power of two) */
    int32_t *lru_prev, *lru_next; /* the cached-free blocks, least recently released first; -1 ends */
    int32_t lru_head, lru_tail;
    int32_t n_cached_free;
    uint64_t next_serial;
    int64_t evictions;
} kv_block_pool;

kite_status kv_pool_init(kv_block_pool *pool, int32_t n_blocks, int32_t block_size, bool caching);
void kv_pool_destroy(kv_block_pool *pool);

/* Blocks a request can take now: the truly free ones and the cached-free ones (which taking evicts). */
static inline int32_t kv_pool_available(const kv_block_pool *pool) { return pool->n_free + pool->n_cached_free; }

/* Takes one block with a reference count of 1: a truly free one, else the least recently released cached-free one
 * (evicting its content). False when none is available. */
bool kv_pool_take(kv_block_pool *pool, int32_t *block_id);
/* Drops one reference. At 0 the block becomes cached-free when it holds a cached content (at the LRU list's end),
 * truly free otherwise. */
void kv_pool_release(kv_block_pool *pool, int32_t block_id);

/* The cached block whose content is the block after parent_serial's with these block_size tokens; -1 when none.
 * Only with caching on. */
int32_t kv_pool_lookup(const kv_block_pool *pool, uint64_t parent_serial, const int32_t *tokens);
/* One more reference to a cached block found by kv_pool_lookup (taking it off the LRU list when it was free). */
void kv_pool_acquire(kv_block_pool *pool, int32_t block_id);
/* Records that block_id, referenced by the caller, now holds the keys and values of the full block after
 * parent_serial's with these tokens. Returns the serial of that content: block_id's new one, or, when another
 * block already holds the same content, that block's (block_id then stays uncached, and is freed as usual).
 * Only with caching on. */
uint64_t kv_pool_register(kv_block_pool *pool, int32_t block_id, uint64_t parent_serial, const int32_t *tokens);

/* Forgets every cached content and puts the blocks back in a fresh pool's order (lowest ids taken first). Only
 * when no block is referenced; false, changing nothing, otherwise. */
bool kv_pool_reset(kv_block_pool *pool);

/* Blocks needed to hold n_positions. */
static inline int32_t kv_blocks_for(const kv_block_pool *pool, int64_t n_positions) {
    return (int32_t)((n_positions + pool->block_size - 1) / pool->block_size);
}

#endif

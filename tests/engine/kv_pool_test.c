/* The KV block pool's prefix cache on its own (kv_cache.h): reference counts, exact matching of a block's whole
 * prefix (the same tokens after a different parent never match), one block per content, cached-free blocks
 * evicted least recently released first and only when no block is truly free, and every block accounted for. */
#include <stdint.h>
#include <string.h>

#include "engine/kv_cache.h"
#include "test_util.h"

#define BLOCK 4

/* Every block is referenced, truly free or cached-free, exactly once. */
static void check_accounting(const kv_block_pool *pool, int32_t referenced) {
    int32_t held = 0;
    for (int32_t i = 0; i < pool->n_blocks; i++) held += pool->ref_count[i] > 0;
    CHECK_MSG(held == referenced, "%d blocks referenced, expected %d", held, referenced);
    CHECK_MSG(held + pool->n_free + pool->n_cached_free == pool->n_blocks, "%d held + %d free + %d cached != %d", held,
              pool->n_free, pool->n_cached_free, pool->n_blocks);
    int32_t walked = 0;
    for (int32_t id = pool->lru_head; id >= 0; id = pool->lru_next[id]) {
        CHECK(pool->ref_count[id] == 0 && pool->serial[id] != 0);
        walked++;
    }
    CHECK(walked == pool->n_cached_free);
}

static void test_refcounts_and_lookup(void) {
    kv_block_pool pool;
    CHECK(kv_pool_init(&pool, 6, BLOCK, true) == KITE_OK);
    const int32_t a[BLOCK] = {1, 2, 3, 4}, b[BLOCK] = {5, 6, 7, 8};
    int32_t x = -1, y = -1;
    CHECK(kv_pool_take(&pool, &x) && kv_pool_take(&pool, &y));
    CHECK(kv_pool_lookup(&pool, 0, a) == -1);
    const uint64_t sa = kv_pool_register(&pool, x, 0, a);
    const uint64_t sb = kv_pool_register(&pool, y, sa, b);
    CHECK(sa != 0 && sb != 0 && sa != sb);
    CHECK(kv_pool_lookup(&pool, 0, a) == x);
    CHECK(kv_pool_lookup(&pool, sa, b) == y);
    /* The same tokens after another prefix are another content. */
    CHECK(kv_pool_lookup(&pool, 0, b) == -1);
    CHECK(kv_pool_lookup(&pool, sb, b) == -1);
    const int32_t a_changed[BLOCK] = {1, 2, 3, 5};
    CHECK(kv_pool_lookup(&pool, 0, a_changed) == -1);
    /* A second block computed with the same content stays uncached: the first one's serial names it. */
    int32_t z = -1;
    CHECK(kv_pool_take(&pool, &z));
    CHECK(kv_pool_register(&pool, z, 0, a) == sa && pool.serial[z] == 0);
    kv_pool_acquire(&pool, x); /* a second request shares x */
    CHECK(pool.ref_count[x] == 2);
    check_accounting(&pool, 3);
    kv_pool_release(&pool, z); /* uncached: truly free */
    CHECK(pool.n_free == 4 && pool.n_cached_free == 0);
    kv_pool_release(&pool, x);
    CHECK(pool.n_cached_free == 0 && pool.ref_count[x] == 1);
    kv_pool_release(&pool, y);
    kv_pool_release(&pool, x);
    CHECK(pool.n_cached_free == 2 && pool.n_free == 4);
    check_accounting(&pool, 0);
    /* Found again after its requests left, and taken off the LRU list while used. */
    CHECK(kv_pool_lookup(&pool, 0, a) == x);
    kv_pool_acquire(&pool, x);
    CHECK(pool.n_cached_free == 1 && pool.ref_count[x] == 1);
    check_accounting(&pool, 1);
    kv_pool_release(&pool, x);
    check_accounting(&pool, 0);
    kv_pool_destroy(&pool);
}

/* Truly free blocks go first; then the least recently released cached block is evicted, its content gone. */
static void test_lru_eviction(void) {
    kv_block_pool pool;
    CHECK(kv_pool_init(&pool, 3, BLOCK, true) == KITE_OK);
    int32_t ids[3];
    uint64_t serials[3];
    int32_t tokens[3][BLOCK];
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < BLOCK; k++) tokens[i][k] = 10 * i + k;
        CHECK(kv_pool_take(&pool, &ids[i]));
        serials[i] = kv_pool_register(&pool, ids[i], 0, tokens[i]);
    }
    int32_t none = -1;
    CHECK(!kv_pool_take(&pool, &none));
    kv_pool_release(&pool, ids[1]); /* released first: least recently used */
    kv_pool_release(&pool, ids[0]);
    kv_pool_release(&pool, ids[2]);
    CHECK(pool.n_cached_free == 3 && pool.n_free == 0);
    /* Reusing block 0 moves it to the end of the list. */
    kv_pool_acquire(&pool, ids[0]);
    kv_pool_release(&pool, ids[0]);
    int32_t got = -1;
    CHECK(kv_pool_take(&pool, &got) && got == ids[1]);
    CHECK(kv_pool_lookup(&pool, 0, tokens[1]) == -1 && pool.serial[got] == 0 && pool.evictions == 1);
    CHECK(kv_pool_take(&pool, &got) && got == ids[2]);
    CHECK(kv_pool_lookup(&pool, 0, tokens[0]) == ids[0]);
    check_accounting(&pool, 2);
    /* An evicted block's children cannot be reached: no content has its serial again. */
    const uint64_t again = kv_pool_register(&pool, got, 0, tokens[2]);
    CHECK(again != serials[2]);
    kv_pool_release(&pool, got);
    kv_pool_release(&pool, ids[1]);
    check_accounting(&pool, 0);
    kv_pool_destroy(&pool);
}

/* With caching off, a released block is always truly free. */
static void test_caching_off(void) {
    kv_block_pool pool;
    CHECK(kv_pool_init(&pool, 2, BLOCK, false) == KITE_OK);
    int32_t x = -1;
    CHECK(kv_pool_take(&pool, &x) && pool.n_free == 1);
    kv_pool_release(&pool, x);
    CHECK(pool.n_free == 2 && pool.n_cached_free == 0 && kv_pool_available(&pool) == 2);
    kv_pool_destroy(&pool);
    CHECK(kv_pool_init(&pool, 0, BLOCK, true) == KITE_ERROR_INVALID_ARGUMENT);
}

/* A reset forgets every content and hands blocks out as a fresh pool does; refused while a block is held. */
static void test_reset(void) {
    kv_block_pool pool;
    CHECK(kv_pool_init(&pool, 4, BLOCK, true) == KITE_OK);
    const int32_t a[BLOCK] = {1, 2, 3, 4};
    int32_t x = -1, y = -1;
    CHECK(kv_pool_take(&pool, &x) && kv_pool_take(&pool, &y) && x == 0 && y == 1);
    kv_pool_register(&pool, y, 0, a);
    CHECK(!kv_pool_reset(&pool));
    kv_pool_release(&pool, x);
    kv_pool_release(&pool, y);
    CHECK(pool.n_cached_free == 1 && kv_pool_reset(&pool));
    CHECK(pool.n_cached_free == 0 && pool.n_free == 4 && kv_pool_lookup(&pool, 0, a) == -1);
    for (int32_t i = 0; i < 4; i++) CHECK(kv_pool_take(&pool, &x) && x == i);
    kv_pool_destroy(&pool);
}

int main(void) {
    TEST_RUN(test_refcounts_and_lookup);
    TEST_RUN(test_lru_eviction);
    TEST_RUN(test_caching_off);
    TEST_RUN(test_reset);
    return test_finish();
}

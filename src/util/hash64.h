/* XXH64 (Yann Collet's xxHash, 64-bit variant, seed 0): a fast non-cryptographic checksum for the weight
 * cache's segments and keys, and the KV block pool's bucket index. It catches truncation, flipped bits and misplaced chunks at several GB/s on one
 * core, which a table CRC32 does not reach; it is no defence against someone who crafts a collision on
 * purpose (the cache trusts its own folder, as a build cache does). The output matches the reference
 * implementation's XXH64(data, size, 0) (tested against its published values). */
#ifndef KITE_UTIL_HASH64_H
#define KITE_UTIL_HASH64_H

#include <stddef.h>
#include <stdint.h>

uint64_t hash64(const void *data, size_t size);
/* XXH64 with a seed (the reference's XXH64(data, size, seed)): a hash keyed by a second value, such as the KV
 * block pool's parent block, without copying it next to the data. */
uint64_t hash64_seeded(const void *data, size_t size, uint64_t seed);

#endif

#include "util/hash64.h"

#include <string.h>

static const uint64_t PRIME1 = 0x9E3779B185EBCA87ULL;
static const uint64_t PRIME2 = 0xC2B2AE3D27D4EB4FULL;
static const uint64_t PRIME3 = 0x165667B19E3779F9ULL;
static const uint64_t PRIME4 = 0x85EBCA77C2B2AE63ULL;
static const uint64_t PRIME5 = 0x27D4EB2F165667C5ULL;

static inline uint64_t rotate_left(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* Little-endian loads through memcpy: the data need not be aligned, and the result does not depend on the
 * host's byte order. */
static inline uint64_t load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t load32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t round_step(uint64_t acc, uint64_t input) {
    acc += input * PRIME2;
    acc = rotate_left(acc, 31);
    return acc * PRIME1;
}

static inline uint64_t merge_round(uint64_t acc, uint64_t value) {
    acc ^= round_step(0, value);
    return acc * PRIME1 + PRIME4;
}

uint64_t hash64(const void *data, size_t size) { return hash64_seeded(data, size, 0); }

uint64_t hash64_seeded(const void *data, size_t size, uint64_t seed) {
    const unsigned char *p = data;
    const unsigned char *end = p + size;
    uint64_t h;
    if (size >= 32) {
        uint64_t v1 = seed + PRIME1 + PRIME2, v2 = seed + PRIME2, v3 = seed, v4 = seed - PRIME1;
        const unsigned char *limit = end - 32;
        do {
            v1 = round_step(v1, load64(p));
            v2 = round_step(v2, load64(p + 8));
            v3 = round_step(v3, load64(p + 16));
            v4 = round_step(v4, load64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotate_left(v1, 1) + rotate_left(v2, 7) + rotate_left(v3, 12) + rotate_left(v4, 18);
        h = merge_round(h, v1);
        h = merge_round(h, v2);
        h = merge_round(h, v3);
        h = merge_round(h, v4);
    } else {
        h = seed + PRIME5;
    }
    h += (uint64_t)size;
    while (end - p >= 8) {
        h ^= round_step(0, load64(p));
        h = rotate_left(h, 27) * PRIME1 + PRIME4;
        p += 8;
    }
    if (end - p >= 4) {
        h ^= (uint64_t)load32(p) * PRIME1;
        h = rotate_left(h, 23) * PRIME2 + PRIME3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * PRIME5;
        h = rotate_left(h, 11) * PRIME1;
        p++;
    }
    h ^= h >> 33;
    h *= PRIME2;
    h ^= h >> 29;
    h *= PRIME3;
    h ^= h >> 32;
    return h;
}

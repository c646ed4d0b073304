/* The benchmark's random token ids (prompts, contexts, the gate's inputs): splitmix64 from the bench's seed, so
 * that a row's tokens are the same on every run and every backend. */
#ifndef KITE_BENCH_BENCH_RANDOM_H
#define KITE_BENCH_BENCH_RANDOM_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t bench_next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* n ids in [0, vocab_size). */
static inline void bench_random_tokens(uint64_t *state, int32_t vocab_size, int32_t *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = (int32_t)(bench_next_random(state) % (uint64_t)vocab_size);
}

#endif

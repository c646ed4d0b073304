/* Hooks into the engine for library code that drives it more closely than kite.h allows: the benchmark
 * (src/bench/), which times its rows through kite_engine_step and checks each row first against the CPU oracle on
 * the same backend. Not part of the public API; none of them costs the step path more than a flag test.
 */
#ifndef KITE_ENGINE_ENGINE_INTERNAL_H
#define KITE_ENGINE_ENGINE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "kite.h"
#include "util/options.h"

/* Whether an engine created with these switches on backend b runs greedy decode ahead (engine.c, at the top):
 * the backend offers it and KITE_ENGINE_OVERLAP is not 0. kite_engine_create decides with this. */
bool engine_overlap_enabled(const runtime_options *options, const backend *b);

/* Bytes of one KV block of block_size positions on the model's backend: kite_engine_params.kv_cache_bytes of n
 * times this makes exactly n blocks. */
size_t engine_kv_block_bytes(const kite_model *model, int32_t block_size);

/* Lends n free blocks of the engine's pool (their ids into ids[0 .. n)) to a caller that runs the model's
 * backend itself between steps. The backend's KV cache is reserved once, by kite_engine_create, so the pool's
 * blocks are the only ones there are. Only while the engine is idle; kite_engine_submit refuses while any block
 * is lent. engine_return_blocks gives them back (the same ids, all of them). */
kite_status engine_lend_blocks(kite_engine *e, int32_t n, int32_t *ids);
void engine_return_blocks(kite_engine *e, const int32_t *ids, int32_t n);

/* The new tokens one step may schedule (the chunked-prefill budget), from max_sequences up to the engine's
 * max_step_tokens (what its buffers hold), which is also the budget at creation. The benchmark groups a row's
 * prompts per step with it. */
kite_status engine_set_step_token_budget(kite_engine *e, int32_t tokens);

/* Empties the prefix cache and restores the pool's fresh order, so that every repetition of a benchmark row runs
 * on the same KV blocks (a fresh engine's ascending ones) and never reads what an earlier repetition cached. Only
 * while the engine is idle with no block lent. */
kite_status engine_reset_kv_cache(kite_engine *e);

/* While held, no decoding request is scheduled and no step runs ahead: prompts are read and their first token
 * sampled, then those requests wait (a step with nothing else to do does nothing). The benchmark fills B contexts
 * to the same depth this way, then releases them to decode in lockstep. */
void engine_hold_decode(kite_engine *e, bool hold);

#endif

/* The benchmark's correctness gate: before a row is timed, the target backend runs the row's path (prefill of B
 * prompts, or B sequences decoding after a context) and its logits are compared with the float32 CPU backend's on
 * the same weights and the same tokens, teacher-forced; the rule and its limits are docs/BENCHMARKS.md's ("The
 * correctness gate"). The gate drives the backends' forward itself: it checks numbers, the timing goes through the
 * engine (bench.c).
 */
#ifndef KITE_BENCH_BENCH_GATE_H
#define KITE_BENCH_BENCH_GATE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "kite.h"
#include "model/qwen3.h"

#define GATE_MAX_PREFILL 1024 /* tokens of a pp row the CPU reference recomputes */
#define GATE_MAX_DEPTH 512    /* context of a tg row's check */
#define GATE_STEPS 8          /* decode steps checked teacher-forced */
#define GATE_MAX_SEQS 2       /* sequences of a row the CPU reference recomputes */
#define GATE_REL_L2 2e-2
/* A GPU path that stores activations in bf16 cannot be closer to float32 than bf16 storage itself allows:
 * the limit is the larger of GATE_REL_L2 and this factor times what the CPU oracle, rounding activations to
 * bf16 where the CUDA prefill path stores them, moves the logits on the same tokens (docs/BENCHMARKS.md). */
#define GATE_BF16_FACTOR 1.5
#define GATE_TOP 5
#define GATE_MAX_BATCH 256 /* sequences of one gated forward (kite.h's KITE_BENCH_MAX_BATCH) */

typedef struct gate_result {
    bool passed;
    double worst_rel_l2;
    double worst_bf16_budget; /* how far bf16 storage alone moved the reference's logits, at most */
    int32_t near_ties;        /* positions where the argmax differed but each is in the other's top 5 */
    char why[160];            /* why it failed */
} gate_result;

/* The two CPU references (exact float32, and rounding activations to bf16) on `weights` held as `mode` says (the
 * target's kite_load_params.weights), with KV blocks of block_size positions for what a gate recomputes, their KV
 * caches of the target's kv_cache_dtype (an fp8 cache is the CPU's exact fp8 round trip, so the gate checks the
 * target against the same arithmetic). */
typedef struct bench_gate bench_gate;

kite_status bench_gate_create(const qwen3_config *config, const qwen3_weights *weights, kite_weights mode,
                              int32_t block_size, kite_kv_cache_dtype kv_cache_dtype, bench_gate **out);
void bench_gate_free(bench_gate *gate);

/* What a gate runs on the target: sequences and positions per sequence, for its KV blocks there. */
void bench_gate_prefill_shape(int32_t n_seqs, int32_t n, int32_t *gate_seqs, int32_t *positions);
void bench_gate_decode_shape(int32_t n_seqs, int32_t depth, int32_t *gate_seqs, int32_t *positions);

/* pp gate: min(B, 2) sequences of min(n, GATE_MAX_PREFILL) random tokens prefilled in one step on the target
 * (tables: one block table per sequence, as bench_gate_prefill_shape says); the last-token logits of each are
 * compared with the CPU's. Tokens come from *rng. */
kite_status bench_gate_prefill(bench_gate *gate, backend *target, int32_t *const *tables, int32_t n_seqs, int32_t n,
                               uint64_t *rng, gate_result *out);

/* tg gate: the row's B sequences, after min(depth, GATE_MAX_DEPTH) random context tokens each, decode GATE_STEPS
 * greedy steps on the target, so the step runs the same batch-size path (and CUDA graph bucket) as the timed row.
 * The CPU reference is fed the same tokens (teacher forcing) for the first min(B, 2) sequences, and their logits
 * are compared at every step: a sequence's result does not depend on its batch neighbours, so these rows check
 * the batched kernels. Each step then runs again keeping only its ids, as greedy steps do, and every sequence's
 * id must be exactly the argmax of the logits just compared. */
kite_status bench_gate_decode(bench_gate *gate, backend *target, int32_t *const *tables, int32_t n_seqs, int32_t depth,
                              uint64_t *rng, gate_result *out);

#endif

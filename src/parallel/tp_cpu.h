/* The Qwen3 forward split over tensor-parallel ranks, on the CPU: one rank's shards, KV cache and activations.
 *
 * Each rank holds its slices of the weights (tp_plan.h), widened to float32 by the CPU backend's own code
 * (backend/cpu/cpu_widen.h), and computes with the CPU backend's kernels (cpu_ops.h) in the CPU backend's order,
 * so it is the same math as the unsplit CPU backend: only the two all-reduced sums per layer (o_proj's and
 * down_proj's partial products, added over the ranks) and the lm_head's rows are split. With one rank the
 * logits are the CPU backend's, bit for bit.
 *
 * A rank runs one sequence at a time (a prompt, then decode steps) in a contiguous cache of its own kv heads:
 * the split math is what this checks, not the engine's paging, which the split leaves alone.
 * Every call is collective over the ranks of `comm`: all of them call it, with the same tokens.
 */
#ifndef KITE_PARALLEL_TP_CPU_H
#define KITE_PARALLEL_TP_CPU_H

#include <stdint.h>

#include "kite.h"
#include "model/qwen3.h"
#include "parallel/comm.h"
#include "parallel/tp_plan.h"

typedef struct tp_cpu_rank tp_cpu_rank;

typedef struct tp_cpu_params {
    int32_t n_ranks;      /* the tensor-parallel degree */
    int32_t rank;         /* this rank, in [0, n_ranks) */
    int32_t max_context;  /* positions the sequence may reach (>= 1, at most the config's context limit) */
    int32_t n_threads;    /* OpenMP threads of this rank's kernels (>= 1); the count never changes a result */
    kite_weights weights; /* how the linear layers' weights are widened, as backend_params.weights */
} tp_cpu_params;

/* Rank params->rank's shards of `weights`, and an empty sequence. Refuses a split tp_plan_make refuses, a
 * weight of the wrong shape (the CPU backend's message naming the tensor) and an odd head_dim. */
kite_status tp_cpu_rank_create(const qwen3_config *config, const qwen3_weights *weights, const tp_cpu_params *params,
                               tp_cpu_rank **out);
void tp_cpu_rank_destroy(tp_cpu_rank *rank);

const tp_plan *tp_cpu_rank_plan(const tp_cpu_rank *rank);

/* Forgets the sequence, so the next forward starts a new one at position 0. */
void tp_cpu_rank_reset(tp_cpu_rank *rank);

/* Runs the sequence's next n_tokens tokens (positions [context, context + n_tokens)) on this rank, all-reducing
 * with the others through comm, and leaves the last token's logits of this rank's vocabulary rows in
 * tp_cpu_rank_logits. A failure here (a token outside the vocabulary, a context past max_context, the group's
 * own failure) is reported to the other ranks through comm's fail before it is returned, so they end too. */
kite_status tp_cpu_forward(tp_cpu_rank *rank, tp_comm *comm, const int32_t *tokens, int32_t n_tokens);

/* The last forward's logits for vocabulary rows tp_cpu_rank_plan(rank)->vocab (NULL before any forward). */
const float *tp_cpu_rank_logits(const tp_cpu_rank *rank);

/* The greedy token of the last forward over the whole vocabulary (collective): the distributed argmax of every
 * rank's best, ties to the lowest id as the CPU backend's argmax. A NaN or +inf anywhere, or no finite logit,
 * allows no token and is refused (KITE_ERROR_INVALID_INPUT), as the CPU backend refuses it. */
kite_status tp_cpu_argmax(tp_cpu_rank *rank, tp_comm *comm, int32_t *token);

#endif

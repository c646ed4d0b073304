/* The tensor-parallel split of a Qwen3 model: which slice of every weight rank r of N holds.
 *
 * Megatron's split, one all-reduce after each of the two row-parallel products of a layer:
 * - attention: q/k/v are column-parallel (rank r computes its own query heads and kv heads, whole heads, so
 *   the per-head q/k norms, RoPE and attention need nothing from another rank); o_proj is row-parallel (rank r
 *   multiplies its heads' columns and the partial sums are all-reduced);
 * - MLP: gate/up are column-parallel (rows of the intermediate), down is row-parallel (the same columns);
 * - lm_head: rows of the vocabulary, so no rank holds a whole logits row; a distributed argmax picks the token;
 * - embeddings and norms are replicated.
 * Heads are split evenly, and a rank's query heads use exactly its kv heads: with H / N query heads and KV / N kv
 * heads per rank, local query head h reads local kv head h / (H / KV), as global head r * H / N + h reads global
 * kv head (r * H / N + h) / (H / KV). So N must divide both head counts and the intermediate size; the
 * vocabulary need not be divisible (its rows are shared out as evenly as they go).
 */
#ifndef KITE_PARALLEL_TP_PLAN_H
#define KITE_PARALLEL_TP_PLAN_H

#include <stdint.h>

#include "kite.h"
#include "model/qwen3.h"

/* Indices [begin, begin + count) of some dimension. */
typedef struct tp_range {
    int32_t begin;
    int32_t count;
} tp_range;

/* Rank `rank`'s share of every split dimension. Rows and columns are in elements of the PyTorch layout
 * (out_features, in_features) that qwen3_weights uses. */
typedef struct tp_plan {
    int32_t n_ranks;
    int32_t rank;
    tp_range q_heads;      /* query heads */
    tp_range kv_heads;     /* key / value heads */
    tp_range q_rows;       /* q_proj rows and o_proj columns: q_heads x head_dim */
    tp_range kv_rows;      /* k_proj and v_proj rows: kv_heads x head_dim */
    tp_range intermediate; /* gate_proj and up_proj rows, down_proj columns */
    tp_range vocab;        /* lm_head rows: the logits this rank computes */
} tp_plan;

/* The split of `config` over n_ranks ranks, as rank `rank` holds it. Refuses n_ranks < 1 or rank outside
 * [0, n_ranks) (KITE_ERROR_INVALID_ARGUMENT), and an n_ranks that does not divide num_attention_heads,
 * num_key_value_heads or intermediate_size, or exceeds vocab_size (KITE_ERROR_UNSUPPORTED), the message naming
 * the config field and both values. */
kite_status tp_plan_make(const qwen3_config *config, int32_t n_ranks, int32_t rank, tp_plan *out);

/* Rank `rank`'s rows of a dimension of `size` shared among n_ranks ranks in contiguous ranges, rank order: the
 * first size % n_ranks ranks get one row more than the others. */
tp_range tp_split_uneven(int32_t size, int32_t n_ranks, int32_t rank);

#endif

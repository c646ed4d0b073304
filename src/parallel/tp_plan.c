/* The tensor-parallel split (tp_plan.h). */
#include "parallel/tp_plan.h"

#include <string.h>

#include "util/error.h"

tp_range tp_split_uneven(int32_t size, int32_t n_ranks, int32_t rank) {
    const int32_t base = size / n_ranks, extra = size % n_ranks;
    /* Ranks below `extra` hold base + 1 rows, so rank r starts after r of them or after all `extra`. */
    const int32_t begin = rank * base + (rank < extra ? rank : extra);
    return (tp_range){begin, base + (rank < extra ? 1 : 0)};
}

/* Even shares only: the caller has checked that n_ranks divides size. */
static tp_range split_even(int32_t size, int32_t n_ranks, int32_t rank) {
    const int32_t share = size / n_ranks;
    return (tp_range){rank * share, share};
}

static kite_status check_divides(int32_t value, const char *field, int32_t n_ranks) {
    if (value % n_ranks != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "tensor parallel: %s %d is not divisible by the tensor-parallel degree %d (each rank holds "
                         "an equal share)",
                         field, (int)value, (int)n_ranks);
    return KITE_OK;
}

kite_status tp_plan_make(const qwen3_config *config, int32_t n_ranks, int32_t rank, tp_plan *out) {
    if (!config || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tp_plan_make: config or out is NULL");
    memset(out, 0, sizeof *out);
    if (n_ranks < 1)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tensor parallel: the tensor-parallel degree %d is below 1",
                         (int)n_ranks);
    if (rank < 0 || rank >= n_ranks)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tensor parallel: rank %d is outside [0, %d)", (int)rank,
                         (int)n_ranks);
    if (config->n_heads <= 0 || config->n_kv_heads <= 0 || config->head_dim <= 0 || config->intermediate_size <= 0 ||
        config->vocab_size <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "tensor parallel: config has a non-positive size (num_attention_heads %d, "
                         "num_key_value_heads %d, head_dim %d, intermediate_size %d, vocab_size %d)",
                         (int)config->n_heads, (int)config->n_kv_heads, (int)config->head_dim,
                         (int)config->intermediate_size, (int)config->vocab_size);
    if ((int64_t)config->n_heads * config->head_dim > INT32_MAX)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "tensor parallel: num_attention_heads %d x head_dim %d overflows a 32-bit row count",
                         (int)config->n_heads, (int)config->head_dim);
    KITE_TRY(check_divides(config->n_heads, "num_attention_heads", n_ranks));
    KITE_TRY(check_divides(config->n_kv_heads, "num_key_value_heads", n_ranks));
    KITE_TRY(check_divides(config->intermediate_size, "intermediate_size", n_ranks));
    /* Every rank holds at least one vocabulary row, so every rank has a candidate for the argmax. */
    if (config->vocab_size < n_ranks)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "tensor parallel: vocab_size %d is below the tensor-parallel degree %d",
                         (int)config->vocab_size, (int)n_ranks);
    out->n_ranks = n_ranks;
    out->rank = rank;
    out->q_heads = split_even(config->n_heads, n_ranks, rank);
    out->kv_heads = split_even(config->n_kv_heads, n_ranks, rank);
    out->q_rows = (tp_range){out->q_heads.begin * config->head_dim, out->q_heads.count * config->head_dim};
    out->kv_rows = (tp_range){out->kv_heads.begin * config->head_dim, out->kv_heads.count * config->head_dim};
    out->intermediate = split_even(config->intermediate_size, n_ranks, rank);
    out->vocab = tp_split_uneven(config->vocab_size, n_ranks, rank);
    return KITE_OK;
}

#include "bench/bench_gate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_random.h"
#include "util/error.h"

struct bench_gate {
    const qwen3_config *config;
    backend *reference;      /* the CPU oracle */
    backend *reference_bf16; /* the same, rounding activations to bf16: the budget of bf16 storage */
    int32_t *table_storage;  /* GATE_MAX_SEQS contiguous runs of blocks_per_seq */
    int32_t *tables[GATE_MAX_SEQS];
};

/* What a forward keeps of its last new tokens: nothing (a context being filled), their logits, or only their argmax
 * ids (step_batch.ids_only: greedy decode, read by argmax). */
typedef enum { KEEP_NOTHING, KEEP_LOGITS, KEEP_IDS } forward_keeps;

/* One forward of n_seqs sequences with n_new tokens each, continuing contexts of `start` positions. */
static kite_status forward_step(backend *be, int32_t *const *tables, int32_t n_seqs, const int32_t *tokens,
                                int32_t n_new, int32_t start, forward_keeps keeps) {
    int32_t seq_start[GATE_MAX_BATCH + 1];
    int32_t context[GATE_MAX_BATCH];
    uint8_t wants[GATE_MAX_BATCH];
    if (n_seqs > GATE_MAX_BATCH)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench gate: %d sequences, at most %d", n_seqs, GATE_MAX_BATCH);
    for (int32_t s = 0; s < n_seqs; s++) {
        seq_start[s] = s * n_new;
        context[s] = start + n_new;
        wants[s] = keeps != KEEP_NOTHING;
    }
    seq_start[n_seqs] = n_seqs * n_new;
    step_batch batch = {.n_seqs = n_seqs,
                        .n_tokens = n_seqs * n_new,
                        .token_ids = tokens,
                        .seq_token_start = seq_start,
                        .seq_context_len = context,
                        .block_tables = (const int32_t *const *)tables,
                        .seq_wants_logits = wants,
                        .ids_only = keeps == KEEP_IDS};
    return be->ops->forward(be, &batch);
}

/* Fills `depth` positions of n_seqs sequences with tokens[s * depth ...], one sequence per forward in chunks. */
static kite_status fill_context(backend *be, int32_t *const *tables, int32_t n_seqs, int32_t depth,
                                const int32_t *tokens) {
    const int32_t chunk_max = 2048;
    for (int32_t s = 0; s < n_seqs; s++) {
        for (int32_t done = 0; done < depth;) {
            int32_t n = depth - done < chunk_max ? depth - done : chunk_max;
            KITE_TRY(forward_step(be, &tables[s], 1, tokens + (size_t)s * depth + done, n, done, KEEP_NOTHING));
            done += n;
        }
    }
    return KITE_OK;
}

static double relative_l2(const float *x, const float *reference, size_t n) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)reference[i];
        diff += d * d;
        norm += (double)reference[i] * (double)reference[i];
    }
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

/* The ids of the k largest values (ties: lowest id), best first. */
static void top_ids(const float *row, int32_t vocab, int32_t k, int32_t *ids) {
    for (int32_t j = 0; j < k; j++)
        ids[j] = -1;
    for (int32_t i = 0; i < vocab; i++) {
        for (int32_t j = 0; j < k; j++) {
            if (ids[j] < 0 || row[i] > row[ids[j]]) {
                memmove(ids + j + 1, ids + j, (size_t)(k - j - 1) * sizeof(int32_t));
                ids[j] = i;
                break;
            }
        }
    }
}

static bool contains(const int32_t *ids, int32_t k, int32_t id) {
    for (int32_t j = 0; j < k; j++)
        if (ids[j] == id) return true;
    return false;
}

/* Compares rows of target and reference logits: relative L2 within the limit (GATE_REL_L2, or more where
 * bf16 storage alone moves the logits more, as bf16_reference shows) and the near-tie rule of DESIGN.md. */
static void gate_compare(const float *target, const float *reference, const float *bf16_reference, int32_t rows,
                         int32_t vocab, gate_result *g) {
    for (int32_t r = 0; r < rows; r++) {
        const float *t = target + (size_t)r * vocab, *ref = reference + (size_t)r * vocab;
        double e = relative_l2(t, ref, (size_t)vocab);
        double budget = relative_l2(bf16_reference + (size_t)r * vocab, ref, (size_t)vocab);
        double limit = GATE_BF16_FACTOR * budget > GATE_REL_L2 ? GATE_BF16_FACTOR * budget : GATE_REL_L2;
        if (e > g->worst_rel_l2 || isnan(e)) g->worst_rel_l2 = isnan(e) ? INFINITY : e;
        if (budget > g->worst_bf16_budget) g->worst_bf16_budget = budget;
        int32_t top_t[GATE_TOP], top_r[GATE_TOP];
        top_ids(t, vocab, GATE_TOP, top_t);
        top_ids(ref, vocab, GATE_TOP, top_r);
        if (top_t[0] != top_r[0]) {
            if (contains(top_r, GATE_TOP, top_t[0]) && contains(top_t, GATE_TOP, top_r[0])) {
                g->near_ties++;
            } else if (g->passed) {
                g->passed = false;
                snprintf(g->why, sizeof g->why, "argmax %d vs reference %d, not a near tie", top_t[0], top_r[0]);
            }
        }
        if (!(e <= limit) && g->passed) {
            g->passed = false;
            snprintf(g->why, sizeof g->why, "logits relative L2 %.3g > limit %.3g (bf16 storage alone: %.3g)", e, limit,
                     budget);
        }
    }
}

static int32_t reference_blocks_per_seq(int32_t block_size) {
    return (GATE_MAX_PREFILL + GATE_MAX_DEPTH + GATE_STEPS + block_size) / block_size + 1;
}

kite_status bench_gate_create(const qwen3_config *config, const qwen3_weights *weights, kite_weights mode,
                              int32_t block_size, kite_kv_cache_dtype kv_cache_dtype, bench_gate **out) {
    *out = NULL;
    if (block_size <= 0) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench gate: block size %d", block_size);
    bench_gate *g = calloc(1, sizeof *g);
    if (!g) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench gate: out of memory");
    g->config = config;
    const int32_t per_seq = reference_blocks_per_seq(block_size), blocks = GATE_MAX_SEQS * per_seq;
    g->table_storage = malloc((size_t)blocks * sizeof(int32_t));
    kite_status status = g->table_storage ? KITE_OK : kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench gate: out of memory");
    for (int32_t s = 0; s < GATE_MAX_SEQS && status == KITE_OK; s++) {
        g->tables[s] = g->table_storage + (size_t)s * per_seq;
        for (int32_t i = 0; i < per_seq; i++)
            g->tables[s][i] = s * per_seq + i;
    }
    /* The references hold the target's linear weights and KV cache dtype: an fp8 target is checked against the CPU's
     * fp8 mode (weights) and its exact fp8 KV round trip. */
    backend_params exact = {.n_threads = 0, .device = 0, .weights = mode, .kv_cache_dtype = kv_cache_dtype},
                   rounded = exact;
    rounded.emulate_bf16_activations = 1;
    if (status == KITE_OK) status = cpu_backend_create(config, weights, &exact, &g->reference);
    if (status == KITE_OK) status = g->reference->ops->kv_reserve(g->reference, blocks, block_size);
    if (status == KITE_OK) status = cpu_backend_create(config, weights, &rounded, &g->reference_bf16);
    if (status == KITE_OK) status = g->reference_bf16->ops->kv_reserve(g->reference_bf16, blocks, block_size);
    if (status != KITE_OK) {
        bench_gate_free(g);
        return status;
    }
    *out = g;
    return KITE_OK;
}

void bench_gate_free(bench_gate *g) {
    if (!g) return;
    if (g->reference) g->reference->ops->destroy(g->reference);
    if (g->reference_bf16) g->reference_bf16->ops->destroy(g->reference_bf16);
    free(g->table_storage);
    free(g);
}

void bench_gate_prefill_shape(int32_t n_seqs, int32_t n, int32_t *gate_seqs, int32_t *positions) {
    *gate_seqs = n_seqs < GATE_MAX_SEQS ? n_seqs : GATE_MAX_SEQS;
    *positions = n < GATE_MAX_PREFILL ? n : GATE_MAX_PREFILL;
}

void bench_gate_decode_shape(int32_t n_seqs, int32_t depth, int32_t *gate_seqs, int32_t *positions) {
    *gate_seqs = n_seqs;
    *positions = (depth < GATE_MAX_DEPTH ? depth : GATE_MAX_DEPTH) + GATE_STEPS;
}

/* The same step on both CPU references; their logits go to exact and rounded. */
static kite_status reference_step(bench_gate *g, int32_t n_seqs, const int32_t *tokens, int32_t n_new, int32_t start,
                                  float *exact, float *rounded) {
    KITE_TRY(forward_step(g->reference, g->tables, n_seqs, tokens, n_new, start, KEEP_LOGITS));
    KITE_TRY(g->reference->ops->read_logits(g->reference, exact, n_seqs));
    KITE_TRY(forward_step(g->reference_bf16, g->tables, n_seqs, tokens, n_new, start, KEEP_LOGITS));
    return g->reference_bf16->ops->read_logits(g->reference_bf16, rounded, n_seqs);
}

kite_status bench_gate_prefill(bench_gate *g, backend *target, int32_t *const *tables, int32_t n_seqs, int32_t n,
                               uint64_t *rng, gate_result *out) {
    *out = (gate_result){.passed = true};
    int32_t seqs = 0, m = 0;
    bench_gate_prefill_shape(n_seqs, n, &seqs, &m);
    size_t vocab = (size_t)g->config->vocab_size;
    int32_t *tokens = malloc((size_t)seqs * (size_t)m * sizeof(int32_t));
    float *lt = malloc((size_t)seqs * vocab * sizeof(float)), *lr = malloc((size_t)seqs * vocab * sizeof(float));
    float *lb = malloc((size_t)seqs * vocab * sizeof(float));
    kite_status status =
        tokens && lt && lr && lb ? KITE_OK : kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench gate: out of memory");
    if (status == KITE_OK) {
        bench_random_tokens(rng, g->config->vocab_size, tokens, (size_t)seqs * (size_t)m);
        status = forward_step(target, tables, seqs, tokens, m, 0, KEEP_LOGITS);
    }
    if (status == KITE_OK) status = target->ops->read_logits(target, lt, seqs);
    if (status == KITE_OK) status = reference_step(g, seqs, tokens, m, 0, lr, lb);
    if (status == KITE_OK) gate_compare(lt, lr, lb, seqs, (int32_t)vocab, out);
    free(tokens);
    free(lt);
    free(lr);
    free(lb);
    return status;
}

kite_status bench_gate_decode(bench_gate *g, backend *target, int32_t *const *tables, int32_t n_seqs, int32_t depth,
                              uint64_t *rng, gate_result *out) {
    *out = (gate_result){.passed = true};
    if (n_seqs > GATE_MAX_BATCH)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench gate: %d sequences, at most %d", n_seqs, GATE_MAX_BATCH);
    const int32_t checked = n_seqs < GATE_MAX_SEQS ? n_seqs : GATE_MAX_SEQS;
    const int32_t d = depth < GATE_MAX_DEPTH ? depth : GATE_MAX_DEPTH;
    const int32_t vocab_size = g->config->vocab_size;
    const size_t vocab = (size_t)vocab_size;
    int32_t *context = malloc((size_t)n_seqs * (size_t)(d > 0 ? d : 1) * sizeof(int32_t));
    int32_t *tokens = malloc((size_t)n_seqs * sizeof(int32_t)), *ids = malloc((size_t)n_seqs * sizeof(int32_t));
    float *lt = malloc((size_t)n_seqs * vocab * sizeof(float)), *lr = malloc((size_t)checked * vocab * sizeof(float));
    float *lb = malloc((size_t)checked * vocab * sizeof(float));
    kite_status status = context && tokens && ids && lt && lr && lb
                             ? KITE_OK
                             : kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench gate: out of memory");
    if (status == KITE_OK && d > 0) {
        bench_random_tokens(rng, vocab_size, context, (size_t)n_seqs * (size_t)d);
        status = fill_context(target, tables, n_seqs, d, context);
        /* The first `checked` sequences' contexts are the first rows of `context`. */
        if (status == KITE_OK) status = fill_context(g->reference, g->tables, checked, d, context);
        if (status == KITE_OK) status = fill_context(g->reference_bf16, g->tables, checked, d, context);
    }
    if (status == KITE_OK) bench_random_tokens(rng, vocab_size, tokens, (size_t)n_seqs);
    for (int32_t step = 0; step < GATE_STEPS && status == KITE_OK; step++) {
        status = forward_step(target, tables, n_seqs, tokens, 1, d + step, KEEP_LOGITS);
        if (status == KITE_OK) status = target->ops->read_logits(target, lt, n_seqs);
        if (status == KITE_OK) status = reference_step(g, checked, tokens, 1, d + step, lr, lb);
        /* Greedy steps keep only their ids (KEEP_IDS; CUDA then screens the lm_head, lm_head_screen.cu): the same
         * step again that way must give exactly the argmax of the logits just compared. */
        if (status == KITE_OK) status = forward_step(target, tables, n_seqs, tokens, 1, d + step, KEEP_IDS);
        if (status == KITE_OK) status = target->ops->argmax(target, ids, n_seqs);
        if (status != KITE_OK) break;
        gate_compare(lt, lr, lb, checked, vocab_size, out);
        for (int32_t s = 0; s < n_seqs && out->passed; s++) {
            int32_t expected = 0;
            top_ids(lt + (size_t)s * vocab, vocab_size, 1, &expected);
            if (ids[s] != expected) {
                out->passed = false;
                snprintf(out->why, sizeof out->why, "sequence %d: the ids-only step chose %d, its logits' argmax is %d",
                         s, ids[s], expected);
            }
        }
        /* Continue with the target's greedy choices, as a real generation would. */
        for (int32_t s = 0; s < n_seqs; s++)
            top_ids(lt + (size_t)s * vocab, vocab_size, 1, &tokens[s]);
    }
    free(context);
    free(tokens);
    free(ids);
    free(lt);
    free(lr);
    free(lb);
    return status;
}

/* kite bench: prefill (pp N) and decode (tg N, B sequences, after a context of --depth tokens) throughput,
 * like llama-bench, each row gated by a check against the float32 CPU backend on the same weights.
 *
 * The bench drives the backend interface directly (the same forward the engine calls each step), with one
 * contiguous run of KV blocks per sequence, so what is timed is the model and its kernels: the engine's
 * own per-step work (scheduling, sampling bookkeeping) is a few microseconds on the host.
 * The method is described in docs/BENCHMARKS.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "cli_util.h"
#include "commands.h"
#include "engine/reduced_sampling.h"
#include "kite.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "util/error.h"
#include "util/options.h"
#include "util/parallel.h"

static const char bench_usage[] =
    "usage: kite bench (--model DIR | --dummy SHAPE) [options]\n"
    "  -p N,N,...        prefill rows: pp N (default 256,2048)\n"
    "  -n N,N,...        decode rows: tg N (default 128)\n"
    "  -b B,B,...        sequences per row: pp rows prefill B prompts of N tokens (at most 8192 tokens per\n"
    "                    forward), tg rows decode B sequences together (default 1)\n"
    "  --depth D,D,...   context already in the cache before the tg rows (default 256)\n"
    "  -r R              repetitions per row; the median is reported (default 5)\n"
    "  --backend auto|cpu|cuda   (default auto)   --threads N (CPU threads)\n"
    "  -o md|jsonl       output format (default md)\n"
    "  --seed S          seed of the dummy weights and the random prompts (default 0)\n"
    "  --temperature T   tg rows sample each token on the host as the engine does for T > 0 (rows reduced to\n"
    "                    their best candidates by the backend where top-k allows, else full logits rows read\n"
    "                    back; one sampler per sequence, rows in parallel); default 0: greedy on the device\n"
    "  --top-k K  --top-p P  --min-p P  --repeat-penalty R   the sampled rows' filters, as kite run's\n"
    "Every row is first checked against the CPU backend (docs/BENCHMARKS.md); a failed check prints FAILED.\n";

#define BENCH_MAX_SEQS 256 /* sequences of a batched row (-b) */
#define GATE_MAX_PREFILL 1024 /* tokens of a pp row the CPU reference recomputes */
#define GATE_MAX_DEPTH 512    /* context of a tg row's check */
#define GATE_STEPS 8          /* decode steps checked teacher-forced */
#define GATE_MAX_SEQS 2
#define GATE_REL_L2 2e-2
/* A GPU path that stores activations in bf16 cannot be closer to float32 than bf16 storage itself allows:
 * the limit is the larger of GATE_REL_L2 and this factor times what the CPU oracle, rounding activations to
 * bf16 where the CUDA prefill path stores them, moves the logits on the same tokens (docs/BENCHMARKS.md). */
#define GATE_BF16_FACTOR 1.5
#define GATE_TOP 5

typedef struct bench_context {
    kite_model *model;
    const qwen3_config *config;
    backend *target;      /* the backend being measured */
    backend *reference;   /* the CPU oracle, made on first use (NULL when the target is the CPU) */
    backend *reference_bf16; /* the same, rounding activations to bf16: the budget of bf16 storage */
    int32_t block_size;
    int32_t blocks_per_seq;
    int32_t max_seqs;
    int32_t **tables;     /* [max_seqs] contiguous block runs */
    uint64_t rng;
} bench_context;

/* Whether greedy tg rows run overlapped, as the engine would run them (KITE_ENGINE_OVERLAP). */
static bool bench_overlapped(const backend *target) {
    runtime_options options;
    return options_read(&options) == KITE_OK && options.engine_overlap && backend_offers_overlap(target);
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void random_tokens(bench_context *b, int32_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = (int32_t)(next_random(&b->rng) % (uint64_t)b->config->vocab_size);
}

/* What a forward keeps of its last new tokens: nothing (a context being filled), their logits, or only their argmax
 * ids (step_batch.ids_only: greedy decode, read by argmax). */
typedef enum { KEEP_NOTHING, KEEP_LOGITS, KEEP_IDS } forward_keeps;

/* One forward of n_seqs sequences with n_new tokens each, continuing contexts of `start` positions. tokens NULL:
 * one token each, the previous forward's argmax taken on the device (tokens_from_argmax). */
static kite_status forward_step(backend *be, int32_t **tables, int32_t n_seqs, const int32_t *tokens, int32_t n_new,
                                int32_t start, forward_keeps keeps) {
    int32_t seq_start[BENCH_MAX_SEQS + 1];
    int32_t context[BENCH_MAX_SEQS];
    uint8_t wants[BENCH_MAX_SEQS];
    if (n_seqs > BENCH_MAX_SEQS) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench: at most %d sequences", BENCH_MAX_SEQS);
    for (int32_t s = 0; s < n_seqs; s++) {
        seq_start[s] = s * n_new;
        context[s] = start + n_new;
        wants[s] = keeps != KEEP_NOTHING;
    }
    seq_start[n_seqs] = n_seqs * n_new;
    step_batch batch = {.n_seqs = n_seqs, .n_tokens = n_seqs * n_new, .token_ids = tokens,
                        .seq_token_start = seq_start, .seq_context_len = context,
                        .block_tables = (const int32_t *const *)tables, .seq_wants_logits = wants,
                        .tokens_from_argmax = tokens == NULL, .ids_only = keeps == KEEP_IDS};
    return be->ops->forward(be, &batch);
}

/* Fills `depth` positions of n_seqs sequences: with tokens[s * depth ...] when given, else random tokens. */
static kite_status fill_context(bench_context *b, backend *be, int32_t **tables, int32_t n_seqs, int32_t depth,
                                const int32_t *tokens) {
    const int32_t chunk_max = 2048;
    int32_t *chunk = malloc((size_t)chunk_max * sizeof(int32_t));
    if (!chunk) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench: out of memory");
    kite_status status = KITE_OK;
    for (int32_t s = 0; s < n_seqs && status == KITE_OK; s++) {
        for (int32_t done = 0; done < depth && status == KITE_OK;) {
            int32_t n = depth - done < chunk_max ? depth - done : chunk_max;
            if (tokens)
                memcpy(chunk, tokens + (size_t)s * depth + done, (size_t)n * sizeof(int32_t));
            else
                random_tokens(b, chunk, (size_t)n);
            status = forward_step(be, &tables[s], 1, chunk, n, done, KEEP_NOTHING);
            done += n;
        }
    }
    free(chunk);
    return status;
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
    for (int32_t j = 0; j < k; j++) ids[j] = -1;
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

typedef struct gate_result {
    bool passed;
    double worst_rel_l2;
    double worst_bf16_budget; /* how far bf16 storage alone moved the reference's logits, at most */
    int32_t near_ties; /* positions where the argmax differed but each is in the other's top 5 */
    char why[160];
} gate_result;

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
            snprintf(g->why, sizeof g->why, "logits relative L2 %.3g > limit %.3g (bf16 storage alone: %.3g)", e,
                     limit, budget);
        }
    }
}

static int32_t reference_blocks_per_seq(int32_t block_size) {
    return (GATE_MAX_PREFILL + GATE_MAX_DEPTH + GATE_STEPS + block_size) / block_size + 1;
}

static kite_status ensure_reference(bench_context *b) {
    if (b->reference) return KITE_OK;
    int32_t blocks = GATE_MAX_SEQS * reference_blocks_per_seq(b->block_size);
    backend_params exact = {.n_threads = 0, .device = 0}, rounded = exact;
    rounded.emulate_bf16_activations = 1;
    KITE_TRY(cpu_backend_create(b->config, b->model->weights, &exact, &b->reference));
    KITE_TRY(b->reference->ops->kv_reserve(b->reference, blocks, b->block_size));
    KITE_TRY(cpu_backend_create(b->config, b->model->weights, &rounded, &b->reference_bf16));
    return b->reference_bf16->ops->kv_reserve(b->reference_bf16, blocks, b->block_size);
}

/* The same step on both CPU references; their logits go to exact and rounded. */
static kite_status reference_step(bench_context *b, int32_t **tables, int32_t n_seqs, const int32_t *tokens,
                                  int32_t n_new, int32_t start, float *exact, float *rounded) {
    KITE_TRY(forward_step(b->reference, tables, n_seqs, tokens, n_new, start, KEEP_LOGITS));
    KITE_TRY(b->reference->ops->read_logits(b->reference, exact, n_seqs));
    KITE_TRY(forward_step(b->reference_bf16, tables, n_seqs, tokens, n_new, start, KEEP_LOGITS));
    return b->reference_bf16->ops->read_logits(b->reference_bf16, rounded, n_seqs);
}

/* pp gate: min(B, 2) sequences of min(n, GATE_MAX_PREFILL) random tokens prefilled in one step; the
 * last-token logits of each are compared with the CPU's. */
static kite_status gate_prefill(bench_context *b, int32_t n_seqs, int32_t n, int32_t **ref_tables, gate_result *g) {
    *g = (gate_result){.passed = true};
    if (!b->reference) {
        snprintf(g->why, sizeof g->why, "the CPU backend is the reference");
        return KITE_OK;
    }
    int32_t seqs = n_seqs < GATE_MAX_SEQS ? n_seqs : GATE_MAX_SEQS;
    int32_t m = n < GATE_MAX_PREFILL ? n : GATE_MAX_PREFILL;
    size_t vocab = (size_t)b->config->vocab_size;
    int32_t *tokens = malloc((size_t)seqs * (size_t)m * sizeof(int32_t));
    float *lt = malloc((size_t)seqs * vocab * sizeof(float)), *lr = malloc((size_t)seqs * vocab * sizeof(float));
    float *lb = malloc((size_t)seqs * vocab * sizeof(float));
    kite_status status = tokens && lt && lr && lb ? KITE_OK : kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench: out of memory");
    if (status == KITE_OK) {
        random_tokens(b, tokens, (size_t)seqs * (size_t)m);
        status = forward_step(b->target, b->tables, seqs, tokens, m, 0, KEEP_LOGITS);
    }
    if (status == KITE_OK) status = b->target->ops->read_logits(b->target, lt, seqs);
    if (status == KITE_OK) status = reference_step(b, ref_tables, seqs, tokens, m, 0, lr, lb);
    if (status == KITE_OK) gate_compare(lt, lr, lb, seqs, (int32_t)vocab, g);
    free(tokens);
    free(lt);
    free(lr);
    free(lb);
    return status;
}

/* tg gate: the row's B sequences, after min(depth, GATE_MAX_DEPTH) random context tokens each, decode
 * GATE_STEPS greedy steps on the target, so the step runs the same batch-size path (and CUDA graph bucket) as
 * the timed row. The CPU reference is fed the same tokens (teacher forcing) for the first min(B, 2)
 * sequences, and their logits are compared at every step: a sequence's result does not depend on its batch
 * neighbours, so these rows check the batched kernels. */
static kite_status gate_decode(bench_context *b, int32_t n_seqs, int32_t depth, int32_t **ref_tables, gate_result *g) {
    *g = (gate_result){.passed = true};
    if (!b->reference) {
        snprintf(g->why, sizeof g->why, "the CPU backend is the reference");
        return KITE_OK;
    }
    int32_t checked = n_seqs < GATE_MAX_SEQS ? n_seqs : GATE_MAX_SEQS;
    int32_t d = depth < GATE_MAX_DEPTH ? depth : GATE_MAX_DEPTH;
    size_t vocab = (size_t)b->config->vocab_size;
    int32_t *context = malloc((size_t)n_seqs * (size_t)(d > 0 ? d : 1) * sizeof(int32_t));
    int32_t *tokens = malloc((size_t)n_seqs * sizeof(int32_t)), *ids = malloc((size_t)n_seqs * sizeof(int32_t));
    float *lt = malloc((size_t)n_seqs * vocab * sizeof(float)), *lr = malloc((size_t)checked * vocab * sizeof(float));
    float *lb = malloc((size_t)checked * vocab * sizeof(float));
    kite_status status = context && tokens && ids && lt && lr && lb
                             ? KITE_OK
                             : kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench: out of memory");
    if (status == KITE_OK && d > 0) {
        random_tokens(b, context, (size_t)n_seqs * (size_t)d);
        status = fill_context(b, b->target, b->tables, n_seqs, d, context);
        /* The first `checked` sequences' contexts are the first rows of `context`. */
        if (status == KITE_OK) status = fill_context(b, b->reference, ref_tables, checked, d, context);
        if (status == KITE_OK) status = fill_context(b, b->reference_bf16, ref_tables, checked, d, context);
    }
    if (status == KITE_OK) random_tokens(b, tokens, (size_t)n_seqs);
    for (int32_t step = 0; step < GATE_STEPS && status == KITE_OK; step++) {
        status = forward_step(b->target, b->tables, n_seqs, tokens, 1, d + step, KEEP_LOGITS);
        if (status == KITE_OK) status = b->target->ops->read_logits(b->target, lt, n_seqs);
        if (status == KITE_OK) status = reference_step(b, ref_tables, checked, tokens, 1, d + step, lr, lb);
        /* The timed greedy steps keep only their ids (KEEP_IDS; CUDA then screens the lm_head, lm_head_screen.cu):
         * the same step again that way must give exactly the argmax of the logits just compared. */
        if (status == KITE_OK) status = forward_step(b->target, b->tables, n_seqs, tokens, 1, d + step, KEEP_IDS);
        if (status == KITE_OK) status = b->target->ops->argmax(b->target, ids, n_seqs);
        if (status != KITE_OK) break;
        gate_compare(lt, lr, lb, checked, (int32_t)vocab, g);
        for (int32_t s = 0; s < n_seqs && g->passed; s++) {
            int32_t expected = 0;
            top_ids(lt + (size_t)s * vocab, (int32_t)vocab, 1, &expected);
            if (ids[s] != expected) {
                g->passed = false;
                snprintf(g->why, sizeof g->why, "sequence %d: the ids-only step chose %d, its logits' argmax is %d", s,
                         ids[s], expected);
            }
        }
        /* Continue with the target's greedy choices, as a real generation would. */
        for (int32_t s = 0; s < n_seqs; s++) top_ids(lt + (size_t)s * vocab, (int32_t)vocab, 1, &tokens[s]);
    }
    free(context);
    free(tokens);
    free(ids);
    free(lt);
    free(lr);
    free(lb);
    return status;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct row_result {
    double median_tok_s, min_tok_s, max_tok_s;
    double median_step_ms;
} row_result;

static void summarize(double *tok_s, int reps, double tokens_per_rep, double *seconds, row_result *out) {
    qsort(tok_s, (size_t)reps, sizeof(double), compare_doubles);
    qsort(seconds, (size_t)reps, sizeof(double), compare_doubles);
    out->median_tok_s = tok_s[reps / 2];
    out->min_tok_s = tok_s[0];
    out->max_tok_s = tok_s[reps - 1];
    out->median_step_ms = seconds[reps / 2] * 1e3 / tokens_per_rep;
}

/* Prefills n tokens for each of n_seqs sequences, whole sequences grouped so that one forward holds at
 * most PREFILL_STEP_TOKENS tokens (one sequence per forward when n alone is larger), as an engine with that
 * step budget would; then waits for the last forward's argmax. */
#define PREFILL_STEP_TOKENS 8192
static kite_status prefill_sequences(bench_context *b, int32_t n_seqs, int32_t n, const int32_t *tokens, int32_t *ids) {
    int32_t per_step = PREFILL_STEP_TOKENS / n > 0 ? PREFILL_STEP_TOKENS / n : 1;
    int32_t last_group = 0;
    for (int32_t first = 0; first < n_seqs; first += per_step) {
        int32_t group = n_seqs - first < per_step ? n_seqs - first : per_step;
        KITE_TRY(forward_step(b->target, b->tables + first, group, tokens + (size_t)first * n, n, 0, KEEP_LOGITS));
        last_group = group;
    }
    return b->target->ops->argmax(b->target, ids, last_group); /* waits for the device */
}

static kite_status time_prefill(bench_context *b, int32_t n_seqs, int32_t n, int reps, row_result *out) {
    int32_t *tokens = malloc((size_t)n_seqs * (size_t)n * sizeof(int32_t));
    int32_t *ids = malloc((size_t)n_seqs * sizeof(int32_t));
    double *tok_s = calloc((size_t)reps, sizeof(double)), *secs = calloc((size_t)reps, sizeof(double));
    kite_status status = tokens && ids && tok_s && secs ? KITE_OK
                                                        : kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench: out of memory");
    for (int rep = -1; rep < reps && status == KITE_OK; rep++) { /* rep -1 warms up */
        random_tokens(b, tokens, (size_t)n_seqs * (size_t)n);
        double t0 = seconds_now();
        status = prefill_sequences(b, n_seqs, n, tokens, ids);
        double t = seconds_now() - t0;
        if (rep >= 0) {
            secs[rep] = t;
            tok_s[rep] = (double)n_seqs * n / t;
        }
    }
    if (status == KITE_OK) summarize(tok_s, reps, 1.0, secs, out);
    free(tokens);
    free(ids);
    free(tok_s);
    free(secs);
    return status;
}

/* Host sampling state of a sampled tg row: a sampler per sequence, and room for whole rows or reduced ones. */
typedef struct bench_sampling {
    sampler **samplers;
    float *logits; /* n_seqs x vocab */
    size_t vocab;
    reduced_rows reduced;
    int32_t *ids; /* the step's tokens */
} bench_sampling;

static kite_status sample_whole_row(void *context, int32_t s) {
    bench_sampling *h = context;
    return sampler_sample(h->samplers[s], h->logits + (size_t)s * h->vocab, &h->ids[s], NULL);
}

/* The next token of every sequence: the device's argmax, or (sampling) each row sampled by its own sampler on
 * the host as the engine does: from reduced rows where the backend and the parameters allow, else from the
 * full logits rows read back, rows in parallel. */
static kite_status next_tokens(bench_context *b, int32_t n_seqs, bench_sampling *h, int32_t *ids) {
    if (!h) return b->target->ops->argmax(b->target, ids, n_seqs);
    bool done = false;
    KITE_TRY(sample_reduced_rows(b->target, h->samplers, n_seqs, &h->reduced, ids, NULL, &done));
    if (done) return KITE_OK;
    KITE_TRY(b->target->ops->read_logits(b->target, h->logits, n_seqs));
    h->ids = ids;
    const kite_status status = kite_parallel_for(n_seqs, sample_whole_row, h);
    if (status != KITE_OK) kite_error_prefix("bench: sampling");
    return status;
}

/* n_steps greedy steps as the engine's overlapped decode runs them: each step after the first enqueued with its
 * tokens taken on the device from the previous step's argmax (tokens_from_argmax) before the host reads that
 * step's ids, so the host's round trip overlaps the device's work. The ids read are fed back nowhere: the
 * device already has them. */
static kite_status decode_overlapped(bench_context *b, int32_t n_steps, int32_t n_seqs, int32_t depth,
                                     const int32_t *first_tokens, int32_t *ids) {
    backend *be = b->target;
    KITE_TRY(forward_step(be, b->tables, n_seqs, first_tokens, 1, depth, KEEP_IDS));
    KITE_TRY(be->ops->argmax_begin(be, n_seqs));
    for (int32_t step = 1; step < n_steps; step++) {
        KITE_TRY(forward_step(be, b->tables, n_seqs, NULL, 1, depth + step, KEEP_IDS));
        KITE_TRY(be->ops->argmax_begin(be, n_seqs));
        KITE_TRY(be->ops->argmax_end(be, ids, n_seqs)); /* the previous step's, read while this one runs */
    }
    return be->ops->argmax_end(be, ids, n_seqs);
}

/* sampling NULL: greedy on the device; else the samplers' parameters (seeds: its seed plus the sequence index). */
static kite_status time_decode(bench_context *b, int32_t n_steps, int32_t n_seqs, int32_t depth, int reps,
                               const kite_sampling *sampling, row_result *out) {
    double *tok_s = calloc((size_t)reps, sizeof(double)), *secs = calloc((size_t)reps, sizeof(double));
    int32_t *tokens = malloc((size_t)n_seqs * sizeof(int32_t)), *ids = malloc((size_t)n_seqs * sizeof(int32_t));
    bench_sampling host = {0};
    kite_status status = tok_s && secs && tokens && ids ? KITE_OK
                                                        : kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench: out of memory");
    if (status == KITE_OK && sampling) {
        host.samplers = calloc((size_t)n_seqs, sizeof(sampler *));
        host.vocab = (size_t)b->config->vocab_size;
        host.logits = malloc((size_t)n_seqs * host.vocab * sizeof(float));
        if (!host.samplers || !host.logits) status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench: out of memory");
        if (status == KITE_OK) status = reduced_rows_alloc(&host.reduced, n_seqs);
        for (int32_t s = 0; s < n_seqs && status == KITE_OK; s++) {
            sampler_params p = sampler_params_from(sampling);
            p.seed += (uint64_t)s;
            status = sampler_create(&p, b->config->vocab_size, &host.samplers[s]);
        }
    }
    if (status == KITE_OK && depth > 0) status = fill_context(b, b->target, b->tables, n_seqs, depth, NULL);
    const bool overlapped = !sampling && bench_overlapped(b->target);
    for (int rep = -1; rep < reps && status == KITE_OK; rep++) {
        random_tokens(b, tokens, (size_t)n_seqs);
        double t0 = seconds_now();
        if (overlapped) {
            status = decode_overlapped(b, n_steps, n_seqs, depth, tokens, ids);
        } else {
            for (int32_t step = 0; step < n_steps && status == KITE_OK; step++) {
                status = forward_step(b->target, b->tables, n_seqs, tokens, 1, depth + step,
                                      sampling ? KEEP_LOGITS : KEEP_IDS);
                if (status == KITE_OK) status = next_tokens(b, n_seqs, sampling ? &host : NULL, ids);
                memcpy(tokens, ids, (size_t)n_seqs * sizeof(int32_t)); /* feed back what was chosen */
            }
        }
        double t = seconds_now() - t0;
        if (rep >= 0) {
            secs[rep] = t;
            tok_s[rep] = (double)n_seqs * n_steps / t;
        }
    }
    if (status == KITE_OK) summarize(tok_s, reps, (double)n_steps, secs, out);
    for (int32_t s = 0; host.samplers && s < n_seqs; s++) sampler_free(host.samplers[s]);
    free(host.samplers);
    free(host.logits);
    reduced_rows_free(&host.reduced);
    free(tok_s);
    free(secs);
    free(tokens);
    free(ids);
    return status;
}

/* Bytes one decode step must read from device memory: every weight matrix once (bf16) plus the KV of
 * every sequence. Used to report the fraction of the bandwidth floor. */
static double decode_step_bytes(const qwen3_config *c, int32_t n_seqs, int32_t context) {
    double hidden = c->hidden_size, q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    double per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * c->intermediate_size;
    double weights = 2.0 * (per_layer * c->n_layers + (double)c->vocab_size * hidden);
    double kv_bytes = (double)kv_bytes_per_position(c, 2) * context * n_seqs;
    return weights + kv_bytes;
}

static const double HBM_BYTES_PER_SECOND = 4.3e12; /* measured device-to-device copy rate on the H200 */

typedef struct bench_options {
    const char *model_dir, *dummy;
    int32_t *prefill, *decode, *batch, *depth;
    size_t n_prefill, n_decode, n_batch, n_depth;
    int reps;
    bool jsonl;
    uint64_t seed;
    kite_load_params load;
    kite_sampling sampling; /* tg rows sample on the host when temperature > 0; the seed is the bench's */
} bench_options;

static bool samples(const bench_options *o) { return o->sampling.temperature > 0.0f; }

static void print_row(const bench_options *o, bench_context *b, const char *test, int32_t n_seqs, int32_t depth,
                      const row_result *r, const gate_result *g, double floor_fraction) {
    const char *device = b->target->ops->device_name ? b->target->ops->device_name(b->target) : b->target->ops->name;
    const char *model = o->dummy ? o->dummy : o->model_dir;
    if (o->jsonl) {
        time_t now = time(NULL);
        char date[32];
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        printf("{\"test\":\"%s\",\"batch\":%d,\"depth\":%d,\"model\":", test, n_seqs, depth);
        json_write_string(stdout, model, strlen(model));
        printf(",\"backend\":\"%s\",\"gpu\":", b->target->ops->name);
        json_write_string(stdout, device, strlen(device));
        if (g->passed)
            printf(",\"tok_s\":%.1f,\"tok_s_min\":%.1f,\"tok_s_max\":%.1f,\"ms_per_step\":%.4f", r->median_tok_s,
                   r->min_tok_s, r->max_tok_s, r->median_step_ms);
        else
            printf(",\"tok_s\":null");
        if (floor_fraction > 0 && g->passed) printf(",\"hbm_floor_fraction\":%.3f", floor_fraction);
        const char *path = b->target->ops->decode_path ? b->target->ops->decode_path(b->target) : NULL;
        if (path && strncmp(test, "tg", 2) == 0) { /* which decode code the row timed */
            printf(",\"decode_path\":");
            json_write_string(stdout, path, strlen(path));
        }
        if (strncmp(test, "tg", 2) == 0) /* each step enqueued before the previous one's ids are read (engine.c) */
            printf(",\"overlapped\":%s", !samples(o) && bench_overlapped(b->target) ? "true" : "false");
        if (samples(o) && strncmp(test, "tg", 2) == 0)
            printf(",\"sampling\":{\"temperature\":%g,\"top_k\":%d,\"top_p\":%g,\"min_p\":%g,\"repetition_penalty\":%g}",
                   o->sampling.temperature, o->sampling.top_k, o->sampling.top_p, o->sampling.min_p,
                   o->sampling.repetition_penalty);
        printf(",\"gate\":\"%s\",\"gate_rel_l2\":%.3g,\"gate_bf16_budget\":%.3g,\"gate_near_ties\":%d,\"reps\":%d,\"commit\":\"%s\",\"date\":\"%s\"}\n",
               !b->reference ? "oracle" : g->passed ? "pass" : "FAILED", g->worst_rel_l2, g->worst_bf16_budget, g->near_ties, o->reps, KITE_GIT_COMMIT, date);
    } else if (g->passed) {
        char spread[64];
        snprintf(spread, sizeof spread, "%.0f-%.0f", r->min_tok_s, r->max_tok_s);
        char floor_text[32] = "";
        if (floor_fraction > 0) snprintf(floor_text, sizeof floor_text, "%.0f%%", floor_fraction * 100);
        char gate_text[64];
        if (b->reference)
            snprintf(gate_text, sizeof gate_text, "pass (L2 %.1e, bf16 %.1e)", g->worst_rel_l2, g->worst_bf16_budget);
        else
            snprintf(gate_text, sizeof gate_text, "oracle");
        printf("| %-8s | %3d | %6d | %12.1f | %-17s | %9.4f | %5s | %s |\n", test, n_seqs, depth, r->median_tok_s,
               spread, r->median_step_ms, floor_text, gate_text);
    } else {
        printf("| %-8s | %3d | %6d | FAILED: %s |\n", test, n_seqs, depth, g->why);
    }
    fflush(stdout);
}

static int run_bench(const bench_options *o) {
    kite_model *model = NULL;
    kite_status status = o->dummy ? kite_model_load_dummy(o->dummy, o->seed, &o->load, &model)
                                  : kite_model_load(o->model_dir, &o->load, &model);
    if (status != KITE_OK) return cli_report("load", status);
    bench_context b = {.model = model, .config = &model->config, .target = model->backend,
                       .block_size = kite_engine_params_default().kv_block_size, .rng = o->seed ^ 0x5eedull};
    /* One contiguous block run per sequence, as long as the longest row needs. */
    int32_t max_positions = 0, max_seqs = 1;
    for (size_t i = 0; i < o->n_prefill; i++) max_positions = o->prefill[i] > max_positions ? o->prefill[i] : max_positions;
    for (size_t d = 0; d < o->n_depth; d++)
        for (size_t i = 0; i < o->n_decode; i++) {
            int32_t need = o->depth[d] + o->decode[i] + 1;
            if (need < GATE_MAX_DEPTH + GATE_STEPS) need = GATE_MAX_DEPTH + GATE_STEPS;
            max_positions = need > max_positions ? need : max_positions;
        }
    for (size_t i = 0; i < o->n_batch; i++) max_seqs = o->batch[i] > max_seqs ? o->batch[i] : max_seqs;
    if (max_positions > model->config.max_position_embeddings) {
        fprintf(stderr, "kite bench: rows need %d positions, the model allows %d\n", max_positions,
                model->config.max_position_embeddings);
        kite_model_free(model);
        return 1;
    }
    b.max_seqs = max_seqs;
    b.blocks_per_seq = (max_positions + b.block_size - 1) / b.block_size;
    int32_t *storage = malloc((size_t)max_seqs * (size_t)b.blocks_per_seq * sizeof(int32_t));
    b.tables = malloc((size_t)max_seqs * sizeof(int32_t *));
    int32_t ref_per_seq = reference_blocks_per_seq(b.block_size);
    int32_t *ref_storage = malloc((size_t)GATE_MAX_SEQS * (size_t)ref_per_seq * sizeof(int32_t));
    int exit_code = 0;
    if (!storage || !b.tables || !ref_storage) {
        fprintf(stderr, "kite: out of memory\n");
        exit_code = 1;
        goto done;
    }
    for (int32_t s = 0; s < max_seqs; s++) {
        b.tables[s] = storage + (size_t)s * b.blocks_per_seq;
        for (int32_t i = 0; i < b.blocks_per_seq; i++) b.tables[s][i] = s * b.blocks_per_seq + i;
    }
    status = model->backend->ops->kv_reserve(model->backend, max_seqs * b.blocks_per_seq, b.block_size);
    if (status == KITE_OK && strcmp(model->backend->ops->name, "cpu") != 0) status = ensure_reference(&b);
    if (status != KITE_OK) {
        exit_code = cli_report("bench", status);
        goto done;
    }
    int32_t *ref_tables[GATE_MAX_SEQS];
    for (int32_t s = 0; s < GATE_MAX_SEQS; s++) {
        ref_tables[s] = ref_storage + (size_t)s * ref_per_seq;
        for (int32_t i = 0; i < ref_per_seq; i++) ref_tables[s][i] = s * ref_per_seq + i;
    }

    if (!o->jsonl) {
        const char *device = b.target->ops->device_name ? b.target->ops->device_name(b.target) : b.target->ops->name;
        printf("kite %s (%s), model %s, backend %s on %s, %d repetitions, median\n", KITE_VERSION_STRING,
               KITE_GIT_COMMIT, o->dummy ? o->dummy : o->model_dir, b.target->ops->name, device, o->reps);
        if (b.target->ops->decode_path) printf("decode: %s\n", b.target->ops->decode_path(b.target));
        if (!samples(o))
            printf("greedy tg rows: %s\n", bench_overlapped(b.target)
                                               ? "overlapped (each step enqueued before the previous step's ids are "
                                                 "read, as the engine runs them; KITE_ENGINE_OVERLAP=0: serial)"
                                               : "serial (each step waits for the previous step's ids)");
        if (samples(o))
            printf("tg rows sample on the host: temperature %g, top-k %d, top-p %g, min-p %g, repeat penalty %g "
                   "(rows reduced on the backend where top-k allows, else full logits rows read back)\n",
                   o->sampling.temperature, o->sampling.top_k, o->sampling.top_p, o->sampling.min_p,
                   o->sampling.repetition_penalty);
        printf("\n");
        printf("| test     |   B |  depth |        tok/s | min-max tok/s     |   ms/step | floor | gate |\n");
        printf("|----------|-----|--------|--------------|-------------------|-----------|-------|------|\n");
    }
    bool any_failed = false;
    for (size_t bi = 0; bi < o->n_batch && exit_code == 0; bi++) {
        for (size_t i = 0; i < o->n_prefill && exit_code == 0; i++) {
            int32_t n = o->prefill[i], seqs = o->batch[bi];
            gate_result g;
            row_result r = {0};
            status = gate_prefill(&b, seqs, n, ref_tables, &g);
            if (status == KITE_OK && g.passed) status = time_prefill(&b, seqs, n, o->reps, &r);
            if (status != KITE_OK) {
                exit_code = cli_report("bench", status);
                break;
            }
            char test[32];
            snprintf(test, sizeof test, "pp%d", n);
            print_row(o, &b, test, seqs, 0, &r, &g, 0.0);
            any_failed |= !g.passed;
        }
    }
    for (size_t d = 0; d < o->n_depth && exit_code == 0; d++) {
        for (size_t bi = 0; bi < o->n_batch && exit_code == 0; bi++) {
            for (size_t i = 0; i < o->n_decode && exit_code == 0; i++) {
                int32_t n = o->decode[i], seqs = o->batch[bi], depth = o->depth[d];
                gate_result g;
                row_result r = {0};
                status = gate_decode(&b, seqs, depth, ref_tables, &g);
                if (status == KITE_OK && g.passed)
                    status = time_decode(&b, n, seqs, depth, o->reps, samples(o) ? &o->sampling : NULL, &r);
                if (status != KITE_OK) {
                    exit_code = cli_report("bench", status);
                    break;
                }
                double floor_fraction = 0.0;
                if (g.passed && strcmp(b.target->ops->name, "cuda") == 0) {
                    double floor_s = decode_step_bytes(b.config, seqs, depth + n / 2) / HBM_BYTES_PER_SECOND;
                    floor_fraction = floor_s / (r.median_step_ms * 1e-3);
                }
                char test[32];
                snprintf(test, sizeof test, "tg%d", n);
                print_row(o, &b, test, seqs, depth, &r, &g, floor_fraction);
                any_failed |= !g.passed;
            }
        }
    }

    if (any_failed && exit_code == 0) exit_code = 1; /* every row was tried; a failed gate still fails the run */

done:
    if (b.reference) b.reference->ops->destroy(b.reference);
    if (b.reference_bf16) b.reference_bf16->ops->destroy(b.reference_bf16);
    free(storage);
    free(ref_storage);
    free(b.tables);
    kite_model_free(model);
    return exit_code;
}

int cmd_bench(int argc, char **argv) {
    bench_options o = {.reps = 5, .load = kite_load_params_default(), .sampling = kite_sampling_default()};
    cli_option_result sampling_option;
    const char *prefill = "256,2048", *decode = "128", *batch = "1", *depth = "256";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        long long iv;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(bench_usage, stdout);
            return 0;
        } else if (!cli_take_value(argc, argv, &i, &v)) {
            return 2;
        } else if (strcmp(a, "--model") == 0 || strcmp(a, "-m") == 0) {
            o.model_dir = v;
        } else if (strcmp(a, "--dummy") == 0) {
            o.dummy = v;
        } else if (strcmp(a, "-p") == 0) {
            prefill = v;
        } else if (strcmp(a, "-n") == 0) {
            decode = v;
        } else if (strcmp(a, "-b") == 0) {
            batch = v;
        } else if (strcmp(a, "--depth") == 0 || strcmp(a, "-d") == 0) {
            depth = v;
        } else if (strcmp(a, "-r") == 0) {
            if (!cli_parse_int(a, v, 1, 1000, &iv)) return 2;
            o.reps = (int)iv;
        } else if (strcmp(a, "--backend") == 0) {
            if (!cli_parse_backend(v, &o.load.backend)) return 2;
        } else if (strcmp(a, "--threads") == 0) {
            if (!cli_parse_int(a, v, 0, 4096, &iv)) return 2;
            o.load.n_threads = (int32_t)iv;
        } else if (strcmp(a, "-o") == 0) {
            if (strcmp(v, "md") != 0 && strcmp(v, "jsonl") != 0) {
                fprintf(stderr, "kite bench: -o must be md or jsonl\n");
                return 2;
            }
            o.jsonl = strcmp(v, "jsonl") == 0;
        } else if (strcmp(a, "--seed") == 0) {
            if (!cli_parse_int(a, v, 0, INT64_MAX, &iv)) return 2;
            o.seed = (uint64_t)iv;
        } else if ((sampling_option = cli_parse_sampling_option(a, v, &o.sampling)) != CLI_OPTION_OTHER) {
            if (sampling_option == CLI_OPTION_BAD) return 2;
        } else {
            fprintf(stderr, "kite bench: unknown option '%s'\n%s", a, bench_usage);
            return 2;
        }
    }
    if ((o.model_dir != NULL) == (o.dummy != NULL)) {
        fprintf(stderr, "kite bench: give exactly one of --model DIR or --dummy SHAPE\n%s", bench_usage);
        return 2;
    }
    o.sampling.seed = o.seed;
    int exit_code = 2;
    bool ok = true;
    if (strcmp(prefill, "0") != 0) ok = cli_parse_int_list("-p", prefill, 1, 1 << 20, &o.prefill, &o.n_prefill);
    if (ok && strcmp(decode, "0") != 0) ok = cli_parse_int_list("-n", decode, 1, 1 << 20, &o.decode, &o.n_decode);
    if (ok) ok = cli_parse_int_list("-b", batch, 1, BENCH_MAX_SEQS, &o.batch, &o.n_batch);
    if (ok) ok = cli_parse_int_list("--depth", depth, 0, 1 << 20, &o.depth, &o.n_depth);
    if (ok) exit_code = run_bench(&o);
    free(o.prefill);
    free(o.decode);
    free(o.batch);
    free(o.depth);
    return exit_code;
}

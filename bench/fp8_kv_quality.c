/* fp8_kv_quality: what the fp8 KV cache costs in quality against the bf16 one on the CUDA backend, over
 * teacher-forced positions at depth.
 *
 *   fp8_kv_quality SHAPE [DEPTH=16384] [POSITIONS=2048] [SEED=1]
 *
 * Builds dummy weights of a known shape (model/dummy.h) and two CUDA backends on them (bf16 weights), one with a bf16
 * KV cache and one with --kv-cache-dtype fp8 (E4M3 codes, one float32 scale per token and kv head; quant/fp8_kv.h).
 * Both take the same random token sequence: DEPTH tokens of prompt, prefilled in chunks of 4,096 (the prefill path:
 * the fp8 side attends over its bf16 view of the codes), then POSITIONS single-stream decode steps fed the next
 * tokens of the sequence (teacher-forced: the split-K decode attention reading the codes and scales directly).
 * At every decode step the two next-token distributions are compared as bench/fp8_quality.c compares fp8 weights
 * against bf16 (quality_stats.h): the logits' relative L2 distance, top-1 agreement and KL(bf16 KV || fp8 KV). The
 * last prefill chunk's logits row is reported apart (prefill_rel_l2). Prints one JSON line (issue 35's quality
 * figure; docs/BENCHMARKS.md). Needs a GPU; not a test, a study tool. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/dummy.h"
#include "quality_stats.h"
#include "util/error.h"

enum { BLOCK = 128, PREFILL_CHUNK = 4096 };

typedef struct run_state {
    backend *b;
    float *logits; /* [vocab] */
} run_state;

static kite_status run_create(const qwen3_config *c, const qwen3_weights *w, kite_kv_cache_dtype dtype,
                              int32_t positions, run_state *out) {
    backend_params params = {.device = 0, .weights = KITE_WEIGHTS_BF16, .kv_cache_dtype = dtype};
    KITE_TRY(cuda_backend_create(c, w, &params, &out->b));
    KITE_TRY(out->b->ops->kv_reserve(out->b, (positions + BLOCK - 1) / BLOCK, BLOCK));
    out->logits = malloc((size_t)c->vocab_size * sizeof(float));
    if (!out->logits) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "fp8_kv_quality: out of memory for the logits");
    return KITE_OK;
}

/* Tokens [first, first + n) of the one sequence; the logits of the last when `wants`. */
static kite_status run_step(run_state *r, const int32_t *tokens, const int32_t *table, int32_t first, int32_t n,
                            int wants) {
    int32_t starts[2] = {0, n}, context = first + n;
    uint8_t want = wants ? 1 : 0;
    const int32_t *tables[1] = {table};
    step_batch batch = {.n_seqs = 1, .n_tokens = n, .token_ids = tokens + first, .seq_token_start = starts,
                        .seq_context_len = &context, .block_tables = tables, .seq_wants_logits = &want};
    KITE_TRY(r->b->ops->forward(r->b, &batch));
    return wants ? r->b->ops->read_logits(r->b, r->logits, 1) : KITE_OK;
}

static void run_free(run_state *r) {
    if (r->b) r->b->ops->destroy(r->b);
    free(r->logits);
}

static int parse_count(const char *text, const char *name, long *out) {
    char *end = NULL;
    *out = strtol(text, &end, 10);
    if (*end || *out <= 0 || *out > 1 << 20) {
        fprintf(stderr, "fp8_kv_quality: %s '%s' must be an integer in [1, %d]\n", name, text, 1 << 20);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 5) {
        fprintf(stderr, "usage: fp8_kv_quality SHAPE [DEPTH=16384] [POSITIONS=2048] [SEED=1]\n");
        return 2;
    }
    long depth = 16384, positions = 2048;
    if (argc > 2 && !parse_count(argv[2], "DEPTH", &depth)) return 2;
    if (argc > 3 && !parse_count(argv[3], "POSITIONS", &positions)) return 2;
    char *end = NULL;
    const unsigned long long seed = argc > 4 ? strtoull(argv[4], &end, 10) : 1;
    if (argc > 4 && *end) {
        fprintf(stderr, "fp8_kv_quality: SEED '%s' is not an integer\n", argv[4]);
        return 2;
    }
    char reason[256];
    if (!cuda_backend_available(reason, sizeof reason)) {
        fprintf(stderr, "fp8_kv_quality: the CUDA backend is unavailable: %s\n", reason);
        return 1;
    }
    const int32_t total = (int32_t)(depth + positions);
    qwen3_config c;
    dummy_model *m = NULL;
    if (known_shape_config(argv[1], &c) != KITE_OK || dummy_model_create(&c, seed, &m) != KITE_OK) {
        fprintf(stderr, "fp8_kv_quality: %s\n", kite_last_error());
        return 1;
    }
    if (total > c.max_position_embeddings) {
        fprintf(stderr, "fp8_kv_quality: %d positions exceed the shape's context of %d\n", total,
                c.max_position_embeddings);
        return 2;
    }
    const int32_t vocab = c.vocab_size, blocks = (total + BLOCK - 1) / BLOCK;
    int32_t *tokens = malloc((size_t)total * sizeof(int32_t)), *table = malloc((size_t)blocks * sizeof(int32_t));
    quality_stats stats;
    if (!tokens || !table || quality_stats_init(&stats, (int32_t)positions) != 0) {
        fprintf(stderr, "fp8_kv_quality: out of memory\n");
        return 1;
    }
    uint64_t state = seed * 2654435761u + 1;
    for (int32_t i = 0; i < total; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((state >> 33) % (uint64_t)vocab);
    }
    for (int32_t i = 0; i < blocks; i++) table[i] = blocks - 1 - i; /* not in order: the tables are read */

    run_state bf16 = {0}, fp8 = {0};
    kite_status status = run_create(&c, dummy_model_weights(m), KITE_KV_CACHE_BF16, total, &bf16);
    if (status == KITE_OK) status = run_create(&c, dummy_model_weights(m), KITE_KV_CACHE_FP8, total, &fp8);
    double prefill_rel_l2 = NAN;
    for (int32_t first = 0; status == KITE_OK && first < depth; first += PREFILL_CHUNK) {
        const int32_t n = depth - first < PREFILL_CHUNK ? (int32_t)depth - first : PREFILL_CHUNK;
        const int last = first + n == depth;
        status = run_step(&bf16, tokens, table, first, n, last);
        if (status == KITE_OK) status = run_step(&fp8, tokens, table, first, n, last);
        if (status == KITE_OK && last) {
            quality_stats one;
            if (quality_stats_init(&one, 1) != 0) {
                status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "fp8_kv_quality: out of memory");
                break;
            }
            quality_stats_add(&one, bf16.logits, fp8.logits, vocab);
            prefill_rel_l2 = one.rel_l2[0];
            quality_stats_free(&one);
        }
    }
    for (int32_t i = 0; status == KITE_OK && i < positions; i++) {
        status = run_step(&bf16, tokens, table, (int32_t)depth + i, 1, 1);
        if (status == KITE_OK) status = run_step(&fp8, tokens, table, (int32_t)depth + i, 1, 1);
        if (status == KITE_OK) quality_stats_add(&stats, bf16.logits, fp8.logits, vocab);
    }
    run_free(&bf16);
    run_free(&fp8);
    if (status != KITE_OK) {
        fprintf(stderr, "fp8_kv_quality: %s\n", kite_last_error());
        return 1;
    }
    printf("{\"test\": \"fp8_kv_quality\", \"model\": \"%s\", \"depth\": %ld, \"positions\": %ld, \"seed\": %llu, "
           "\"kv_cache_dtype\": \"fp8\", \"against\": \"bf16\", \"backend\": \"cuda\", "
           "\"scheme\": \"E4M3 K/V, one float32 scale per token and kv head; bf16 weights\", "
           "\"prefill_rel_l2\": %.5f, ",
           argv[1], depth, positions, seed, prefill_rel_l2);
    quality_stats_print(&stats, stdout);
    printf("}\n");
    free(tokens);
    free(table);
    quality_stats_free(&stats);
    dummy_model_free(m);
    return 0;
}

/* fp8_quality: what fp8 weights cost in quality against bf16 weights, over teacher-forced positions.
 *
 *   fp8_quality SHAPE [POSITIONS=2048] [SEED=1]
 *
 * Builds dummy weights of a known shape (model/dummy.h), runs the same random token sequence through two float32
 * CPU backends, one on the bf16 weights and one on their fp8 quantization (--weights fp8: E4M3 per 128 x 128 block,
 * dequantized; quant/fp8_weights.h), and compares the next-token distributions at every position: the logits'
 * relative L2 distance, top-1 agreement and KL(bf16 || fp8). Prints one JSON line (the figures of issue 40's
 * quality item; docs/BENCHMARKS.md). The CPU computes in float32 on both sides, so the figures are the weights'
 * quantization alone: what the fp8 decode path (fp8 weights, float activations) gives against bf16.
 *
 * Every position's logits come out of one forward per chunk: each position is its own one-token sequence whose
 * context is the shared token sequence up to it, all sequences reading the same KV blocks. The CPU backend appends
 * every new token's K/V of a layer before any attention of that layer, and each position is written by exactly
 * one sequence, so this is the prefill of the whole sequence with logits at every row. Not a test; a study tool. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/dummy.h"
#include "quality_stats.h"
#include "util/error.h"

enum { CHUNK = 128, BLOCK = 16 };

typedef struct run_state {
    backend *b;
    float *logits; /* [CHUNK][vocab] */
} run_state;

static kite_status run_create(const qwen3_config *c, const qwen3_weights *w, kite_weights mode, int32_t positions,
                              run_state *out) {
    backend_params params = {.n_threads = 0, .weights = mode};
    KITE_TRY(cpu_backend_create(c, w, &params, &out->b));
    KITE_TRY(out->b->ops->kv_reserve(out->b, (positions + BLOCK - 1) / BLOCK, BLOCK));
    out->logits = malloc((size_t)CHUNK * (size_t)c->vocab_size * sizeof(float));
    if (!out->logits) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "fp8_quality: out of memory for the logits");
    return KITE_OK;
}

/* Positions [first, first + n) as n one-token sequences over the shared block table. */
static kite_status run_chunk(run_state *r, const int32_t *tokens, const int32_t *table, int32_t first, int32_t n) {
    int32_t starts[CHUNK + 1], context[CHUNK];
    uint8_t wants[CHUNK];
    const int32_t *tables[CHUNK];
    for (int32_t i = 0; i < n; i++) {
        starts[i] = i;
        context[i] = first + i + 1;
        wants[i] = 1;
        tables[i] = table;
    }
    starts[n] = n;
    step_batch batch = {.n_seqs = n, .n_tokens = n, .token_ids = tokens + first, .seq_token_start = starts,
                        .seq_context_len = context, .block_tables = tables, .seq_wants_logits = wants};
    KITE_TRY(r->b->ops->forward(r->b, &batch));
    return r->b->ops->read_logits(r->b, r->logits, n);
}

static void run_free(run_state *r) {
    if (r->b) r->b->ops->destroy(r->b);
    free(r->logits);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: fp8_quality SHAPE [POSITIONS=2048] [SEED=1]\n");
        return 2;
    }
    char *end = NULL;
    const long positions = argc > 2 ? strtol(argv[2], &end, 10) : 2048;
    if (argc > 2 && (*end || positions <= 0 || positions > 1 << 20)) {
        fprintf(stderr, "fp8_quality: POSITIONS '%s' must be an integer in [1, %d]\n", argv[2], 1 << 20);
        return 2;
    }
    const unsigned long long seed = argc > 3 ? strtoull(argv[3], &end, 10) : 1;
    if (argc > 3 && *end) {
        fprintf(stderr, "fp8_quality: SEED '%s' is not an integer\n", argv[3]);
        return 2;
    }
    const int32_t n = (int32_t)positions;
    qwen3_config c;
    dummy_model *m = NULL;
    if (known_shape_config(argv[1], &c) != KITE_OK || dummy_model_create(&c, seed, &m) != KITE_OK) {
        fprintf(stderr, "fp8_quality: %s\n", kite_last_error());
        return 1;
    }
    if (n > c.max_position_embeddings) {
        fprintf(stderr, "fp8_quality: %d positions exceed the shape's context of %d\n", n, c.max_position_embeddings);
        return 2;
    }
    const int32_t vocab = c.vocab_size, blocks = (n + BLOCK - 1) / BLOCK;
    int32_t *tokens = malloc((size_t)n * sizeof(int32_t)), *table = malloc((size_t)blocks * sizeof(int32_t));
    quality_stats stats;
    if (!tokens || !table || quality_stats_init(&stats, n) != 0) {
        fprintf(stderr, "fp8_quality: out of memory\n");
        return 1;
    }
    uint64_t state = seed * 2654435761u + 1;
    for (int32_t i = 0; i < n; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((state >> 33) % (uint64_t)vocab);
    }
    for (int32_t i = 0; i < blocks; i++) table[i] = i;

    run_state bf16 = {0}, fp8 = {0};
    kite_status status = run_create(&c, dummy_model_weights(m), KITE_WEIGHTS_BF16, n, &bf16);
    if (status == KITE_OK) status = run_create(&c, dummy_model_weights(m), KITE_WEIGHTS_FP8, n, &fp8);
    for (int32_t first = 0; status == KITE_OK && first < n; first += CHUNK) {
        const int32_t rows = n - first < CHUNK ? n - first : CHUNK;
        status = run_chunk(&bf16, tokens, table, first, rows);
        if (status == KITE_OK) status = run_chunk(&fp8, tokens, table, first, rows);
        for (int32_t r = 0; status == KITE_OK && r < rows; r++)
            quality_stats_add(&stats, bf16.logits + (size_t)r * vocab, fp8.logits + (size_t)r * vocab, vocab);
    }
    run_free(&bf16);
    run_free(&fp8);
    if (status != KITE_OK) {
        fprintf(stderr, "fp8_quality: %s\n", kite_last_error());
        return 1;
    }
    printf("{\"test\": \"fp8_quality\", \"model\": \"%s\", \"positions\": %d, \"seed\": %llu, \"weights\": \"fp8\", "
           "\"against\": \"bf16\", \"scheme\": \"E4M3 weights per 128x128 block, float32 activations\", ",
           argv[1], n, seed);
    quality_stats_print(&stats, stdout);
    printf("}\n");
    free(tokens);
    free(table);
    quality_stats_free(&stats);
    dummy_model_free(m);
    return 0;
}

/* precision_probe: how far bf16 activation storage alone moves a model's logits.
 *
 *   precision_probe SHAPE [TOKENS=128] [SEED=1]
 *
 * Builds dummy weights of a known shape, prefills TOKENS random tokens on the float32 CPU backend twice,
 * once as is and once rounding activations to bf16 where the CUDA prefill path stores them
 * (backend_params.emulate_bf16_activations), and prints the relative L2 error of the last-token logits and
 * whether the argmax agrees. Needs no GPU: it tells whether a GPU-vs-CPU difference of a given size is
 * explained by bf16 storage or points at something else. Not a test; a study tool. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/dummy.h"
#include "util/error.h"

static kite_status last_token_logits(const qwen3_config *c, const qwen3_weights *w, int emulate,
                                      const int32_t *tokens, int32_t n, float *logits) {
    backend_params params = {.n_threads = 0, .emulate_bf16_activations = emulate};
    backend *b = NULL;
    KITE_TRY(cpu_backend_create(c, w, &params, &b));
    const int32_t block = 16, blocks = (n + block - 1) / block;
    int32_t *table = malloc((size_t)blocks * sizeof(int32_t));
    kite_status status = table ? KITE_OK : kite_fail(KITE_ERROR_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; table && i < blocks; i++) table[i] = i;
    if (status == KITE_OK) status = b->ops->kv_reserve(b, blocks, block);
    if (status == KITE_OK) {
        int32_t starts[2] = {0, n}, context = n;
        uint8_t wants = 1;
        const int32_t *tables[1] = {table};
        step_batch batch = {.n_seqs = 1, .n_tokens = n, .token_ids = tokens, .seq_token_start = starts,
                            .seq_context_len = &context, .block_tables = tables, .seq_wants_logits = &wants};
        status = b->ops->forward(b, &batch);
    }
    if (status == KITE_OK) status = b->ops->read_logits(b, logits, 1);
    free(table);
    b->ops->destroy(b);
    return status;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: precision_probe SHAPE [TOKENS=128] [SEED=1]\n");
        return 2;
    }
    int32_t n = argc > 2 ? atoi(argv[2]) : 128;
    uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    if (n <= 0) {
        fprintf(stderr, "precision_probe: TOKENS must be positive\n");
        return 2;
    }
    qwen3_config c;
    dummy_model *m = NULL;
    if (known_shape_config(argv[1], &c) != KITE_OK || dummy_model_create(&c, seed, &m) != KITE_OK) {
        fprintf(stderr, "precision_probe: %s\n", kite_last_error());
        return 1;
    }
    int32_t *tokens = malloc((size_t)n * sizeof(int32_t));
    float *exact = malloc((size_t)c.vocab_size * sizeof(float));
    float *rounded = malloc((size_t)c.vocab_size * sizeof(float));
    if (!tokens || !exact || !rounded) return 1;
    uint64_t state = seed * 2654435761u + 1;
    for (int32_t i = 0; i < n; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((state >> 33) % (uint64_t)c.vocab_size);
    }
    if (last_token_logits(&c, dummy_model_weights(m), 0, tokens, n, exact) != KITE_OK ||
        last_token_logits(&c, dummy_model_weights(m), 1, tokens, n, rounded) != KITE_OK) {
        fprintf(stderr, "precision_probe: %s\n", kite_last_error());
        return 1;
    }
    double diff = 0, norm = 0;
    for (int32_t i = 0; i < c.vocab_size; i++) {
        diff += ((double)rounded[i] - exact[i]) * ((double)rounded[i] - exact[i]);
        norm += (double)exact[i] * exact[i];
    }
    printf("{\"test\":\"bf16_activation_emulation_vs_fp32\",\"model\":\"%s\",\"tokens\":%d,\"seed\":%llu,"
           "\"rel_l2\":%.5f,\"argmax_fp32\":%d,\"argmax_bf16\":%d}\n",
           argv[1], n, (unsigned long long)seed, sqrt(diff / norm), argmax(exact, c.vocab_size),
           argmax(rounded, c.vocab_size));
    free(tokens);
    free(exact);
    free(rounded);
    dummy_model_free(m);
    return 0;
}

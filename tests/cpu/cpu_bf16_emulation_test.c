/* backend_params.emulate_bf16_activations: off, the CPU backend is the float32 oracle (bit-identical to a
 * backend made without the field); on, it rounds activations to bf16 where the CUDA prefill path stores
 * them, which moves the logits a little (measurably, but far less than the GPU gate allows) and keeps the
 * greedy choice on the tiny checkpoint. */
#include <math.h>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "util/error.h"
#include "test_util.h"

static kite_status logits_of(const checkpoint *ck, int emulate, float *out) {
    backend_params params = {.n_threads = 2, .emulate_bf16_activations = emulate};
    backend *b = NULL;
    KITE_TRY(cpu_backend_create(checkpoint_config(ck), checkpoint_weights(ck), &params, &b));
    int32_t tokens[100], table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int i = 0; i < 100; i++) tokens[i] = (i * 7919) % 151643;
    int32_t starts[2] = {0, 100}, context = 100;
    uint8_t wants = 1;
    const int32_t *tables[1] = {table};
    step_batch batch = {.n_seqs = 1, .n_tokens = 100, .token_ids = tokens, .seq_token_start = starts,
                        .seq_context_len = &context, .block_tables = tables, .seq_wants_logits = &wants};
    kite_status s = b->ops->kv_reserve(b, 8, 16);
    if (s == KITE_OK) s = b->ops->forward(b, &batch);
    if (s == KITE_OK) s = b->ops->read_logits(b, out, 1);
    b->ops->destroy(b);
    return s;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void test_emulation_moves_logits_a_little(void) {
    checkpoint *ck = NULL;
    kite_status s = checkpoint_open(KITE_TEST_DATA_DIR "/tiny", &ck);
    CHECK_MSG(s == KITE_OK, "%s", kite_last_error());
    if (s != KITE_OK) return;
    int32_t vocab = checkpoint_config(ck)->vocab_size;
    float *exact = malloc((size_t)vocab * sizeof(float)), *exact_again = malloc((size_t)vocab * sizeof(float));
    float *rounded = malloc((size_t)vocab * sizeof(float));
    CHECK(exact && exact_again && rounded);
    if (exact && exact_again && rounded && logits_of(ck, 0, exact) == KITE_OK && logits_of(ck, 0, exact_again) == KITE_OK &&
        logits_of(ck, 1, rounded) == KITE_OK) {
        CHECK(memcmp(exact, exact_again, (size_t)vocab * sizeof(float)) == 0);
        double diff = 0, norm = 0;
        for (int32_t i = 0; i < vocab; i++) {
            diff += ((double)rounded[i] - exact[i]) * ((double)rounded[i] - exact[i]);
            norm += (double)exact[i] * exact[i];
        }
        double rel = sqrt(diff / norm);
        printf("  tiny, 100 tokens: bf16 emulation moves the logits by relative L2 %.3g\n", rel);
        CHECK_MSG(rel > 1e-5 && rel < 2e-2, "relative L2 %.3g", rel);
        CHECK(argmax(exact, vocab) == argmax(rounded, vocab));
    } else {
        CHECK_MSG(false, "%s", kite_last_error());
    }
    free(exact);
    free(exact_again);
    free(rounded);
    checkpoint_close(ck);
}

int main(void) {
    TEST_RUN(test_emulation_moves_logits_a_little);
    return test_finish();
}

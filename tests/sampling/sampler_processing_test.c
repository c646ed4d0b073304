/* Tests of the sampler's logit processing (sampler.h, step 1): logit_bias, min_tokens and the repetition, presence
 * and frequency penalties against values computed by hand, their refusals by field name, and what they do to the
 * reduced-row path and to the reported logprobs (raw, vLLM's default). */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampling/sampler.h"
#include "test_util.h"

#define VOCAB 8

static sampler *create(const sampler_params *p, int32_t vocab) {
    sampler *s = NULL;
    kite_status status = sampler_create(p, vocab, &s);
    CHECK_MSG(status == KITE_OK, "sampler_create: %s", kite_last_error());
    return s;
}

/* Every rule of step 1 at once, each value written out by hand in vLLM's order and float operations. */
static void test_processing_by_hand(void) {
    const float logits[VOCAB] = {2.0f, -1.0f, 0.5f, 3.0f, -INFINITY, 1.5f, -0.25f, 0.0f};
    const kite_logit_bias bias[3] = {{2, 1.0f}, {6, -100.0f}, {4, 50.0f}};
    const int32_t ending[1] = {7};
    sampler_params p = sampler_params_default();
    p.repetition_penalty = 1.5f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.logit_bias = bias;
    p.n_logit_bias = 3;
    p.min_tokens = 4;
    p.min_tokens_ids = ending;
    p.n_min_tokens_ids = 1;
    sampler *s = create(&p, VOCAB);
    if (!s) return;
    sampler_accept_prompt(s, 0); /* the prompt: token 0 (repetition only) */
    sampler_accept(s, 3);        /* generated: 3 twice, 6 once */
    sampler_accept(s, 3);
    sampler_accept(s, 6);
    float out[VOCAB];
    CHECK(sampler_process_logits(s, logits, out) == KITE_OK);
    const float expected[VOCAB] = {
        2.0f / 1.5f,                          /* prompt: repetition only */
        -1.0f,                                /* untouched */
        0.5f + 1.0f,                          /* bias */
        (3.0f / 1.5f - 0.25f * 2.0f) - 0.5f,  /* generated twice: repetition, frequency x2, presence */
        -INFINITY,                            /* -inf stays -inf, whatever its bias */
        1.5f,
        ((-0.25f - 100.0f) * 1.5f - 0.25f) - 0.5f, /* bias, then a negative logit multiplied, frequency, presence */
        -INFINITY,                            /* a min_tokens id before 4 tokens */
    };
    for (int i = 0; i < VOCAB; i++) CHECK_MSG(out[i] == expected[i], "token %d: %g, expected %g", i, (double)out[i],
                                              (double)expected[i]);
    /* min_tokens counts generated tokens only: the fourth one lifts the mask. */
    sampler_accept(s, 1);
    CHECK(sampler_process_logits(s, logits, out) == KITE_OK);
    CHECK(out[7] == 0.0f);
    sampler_free(s);
}

/* Presence and frequency ignore the prompt (OpenAI, vLLM); the repetition penalty does not. */
static void test_prompt_counts_for_repetition_only(void) {
    const float logits[VOCAB] = {1, 2, 3, 4, 5, 6, 7, 8};
    sampler_params p = sampler_params_default();
    p.presence_penalty = 2.0f;
    p.frequency_penalty = 2.0f;
    sampler *s = create(&p, VOCAB);
    if (!s) return;
    for (int32_t t = 0; t < VOCAB; t++) sampler_accept_prompt(s, t);
    float out[VOCAB];
    CHECK(sampler_process_logits(s, logits, out) == KITE_OK);
    CHECK(memcmp(out, logits, sizeof out) == 0);
    sampler_free(s);
    p = sampler_params_default();
    p.repetition_penalty = 2.0f;
    s = create(&p, VOCAB);
    if (!s) return;
    sampler_accept_prompt(s, 5);
    CHECK(sampler_process_logits(s, logits, out) == KITE_OK);
    CHECK(out[5] == 3.0f && out[4] == 5.0f);
    sampler_free(s);
}

/* Greedy with a min_tokens id the model would pick: another token until min_tokens, then that one. */
static void test_min_tokens_masks_the_ending_ids(void) {
    const float logits[VOCAB] = {0, 0, 0, 9, 1, 0, 0, 0};
    const int32_t ending[2] = {3, 6};
    sampler_params p = sampler_params_default();
    p.temperature = 0.0f;
    p.min_tokens = 2;
    p.min_tokens_ids = ending;
    p.n_min_tokens_ids = 2;
    sampler *s = create(&p, VOCAB);
    if (!s) return;
    CHECK(!sampler_top_suffices(s, 20)); /* the mask is not in the backend's raw candidates */
    int32_t token = -1;
    CHECK(sampler_sample(s, logits, &token, NULL) == KITE_OK && token == 4);
    sampler_accept(s, token);
    CHECK(sampler_sample(s, logits, &token, NULL) == KITE_OK && token == 4);
    sampler_accept(s, token);
    CHECK(sampler_top_suffices(s, 20)); /* reached: the reduced path serves it again */
    CHECK(sampler_sample(s, logits, &token, NULL) == KITE_OK && token == 3);
    sampler_free(s);

    /* A row whose only finite logits are masked allows no token. */
    const float only_ending[VOCAB] = {-INFINITY, -INFINITY, -INFINITY, 1, -INFINITY, -INFINITY, 2, -INFINITY};
    s = create(&p, VOCAB);
    if (!s) return;
    CHECK(sampler_sample(s, only_ending, &token, NULL) == KITE_ERROR_INVALID_INPUT);
    CHECK(strstr(kite_last_error(), "min_tokens") != NULL);
    sampler_free(s);
}

/* A bias of +100 wins under sampling too; the logprob reported is the raw one (vLLM's raw_logprobs). */
static void test_logit_bias_chooses_and_logprobs_stay_raw(void) {
    enum { vocab = 1000 };
    float *logits = malloc(vocab * sizeof *logits);
    if (!logits) return;
    for (int i = 0; i < vocab; i++) logits[i] = (float)sin(i * 0.37) * 4.0f;
    const kite_logit_bias bias[1] = {{777, 100.0f}};
    sampler_params p = sampler_params_default();
    p.temperature = 1.0f;
    p.seed = 3;
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    sampler *s = create(&p, vocab);
    if (!s) {
        free(logits);
        return;
    }
    CHECK(!sampler_top_suffices(s, 20));
    double max_logit = -INFINITY, sum = 0.0;
    for (int i = 0; i < vocab; i++) max_logit = fmax(max_logit, logits[i]);
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - max_logit);
    const double raw_logprob = (double)logits[777] - max_logit - log(sum);
    for (int d = 0; d < 50; d++) {
        int32_t token = -1;
        float logprob = 0.0f;
        CHECK(sampler_sample(s, logits, &token, &logprob) == KITE_OK);
        CHECK_MSG(token == 777, "draw %d chose %d", d, (int)token);
        CHECK_MSG(fabs((double)logprob - raw_logprob) < 1e-5, "logprob %g, raw %g", (double)logprob, raw_logprob);
        sampler_accept(s, token);
    }
    sampler_free(s);
    free(logits);
}

/* The caller's arrays are copied: sampler_create's caller may free them at once. */
static void test_parameters_are_copied(void) {
    kite_logit_bias *bias = malloc(sizeof *bias);
    int32_t *ending = malloc(sizeof *ending);
    if (!bias || !ending) return;
    *bias = (kite_logit_bias){1, 10.0f};
    *ending = 2;
    sampler_params p = sampler_params_default();
    p.temperature = 0.0f;
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    p.min_tokens = 5;
    p.min_tokens_ids = ending;
    p.n_min_tokens_ids = 1;
    sampler *s = create(&p, VOCAB);
    free(bias);
    free(ending);
    if (!s) return;
    const float logits[VOCAB] = {0, 0, 20, 0, 0, 0, 0, 0};
    int32_t token = -1;
    CHECK(sampler_sample(s, logits, &token, NULL) == KITE_OK && token == 1);
    sampler_free(s);
}

/* Every out-of-range field is refused, naming it. */
static void test_refusals_name_the_field(void) {
    kite_logit_bias many[KITE_MAX_LOGIT_BIAS + 1];
    for (int i = 0; i <= KITE_MAX_LOGIT_BIAS; i++) many[i] = (kite_logit_bias){i, 1.0f};
    const kite_logit_bias out_of_vocab[1] = {{VOCAB, 1.0f}};
    const kite_logit_bias too_large[1] = {{1, 100.5f}};
    const kite_logit_bias not_a_number[1] = {{1, NAN}};
    const kite_logit_bias twice[2] = {{1, 1.0f}, {1, 2.0f}};
    const int32_t bad_id[1] = {-1};
    struct {
        sampler_params p;
        const char *field;
    } cases[11];
    for (int i = 0; i < 11; i++) cases[i].p = sampler_params_default();
    cases[0].p.presence_penalty = 2.5f, cases[0].field = "presence_penalty";
    cases[1].p.presence_penalty = NAN, cases[1].field = "presence_penalty";
    cases[2].p.frequency_penalty = -2.01f, cases[2].field = "frequency_penalty";
    cases[3].p.frequency_penalty = INFINITY, cases[3].field = "frequency_penalty";
    cases[4].p.logit_bias = many, cases[4].p.n_logit_bias = KITE_MAX_LOGIT_BIAS + 1, cases[4].field = "logit_bias";
    cases[5].p.logit_bias = out_of_vocab, cases[5].p.n_logit_bias = 1, cases[5].field = "logit_bias[0]: token 8";
    cases[6].p.logit_bias = too_large, cases[6].p.n_logit_bias = 1, cases[6].field = "logit_bias[0]: bias";
    cases[7].p.logit_bias = not_a_number, cases[7].p.n_logit_bias = 1, cases[7].field = "logit_bias[0]: bias";
    cases[8].p.logit_bias = twice, cases[8].p.n_logit_bias = 2, cases[8].field = "logit_bias[0] and logit_bias[1]";
    cases[9].p.min_tokens = -1, cases[9].field = "min_tokens";
    cases[10].p.min_tokens = 1, cases[10].p.min_tokens_ids = bad_id, cases[10].p.n_min_tokens_ids = 1,
    cases[10].field = "min_tokens id -1";
    for (int i = 0; i < 11; i++) {
        sampler *s = NULL;
        CHECK_MSG(sampler_create(&cases[i].p, i == 4 ? KITE_MAX_LOGIT_BIAS + 1 : VOCAB, &s) ==
                      KITE_ERROR_INVALID_ARGUMENT, "case %d", i);
        CHECK(s == NULL);
        CHECK_MSG(strstr(kite_last_error(), cases[i].field) != NULL, "case %d: '%s' does not name %s", i,
                  kite_last_error(), cases[i].field);
    }
    /* The edges are allowed. */
    sampler_params edge = sampler_params_default();
    edge.presence_penalty = -2.0f;
    edge.frequency_penalty = 2.0f;
    const kite_logit_bias edges[2] = {{0, -100.0f}, {VOCAB - 1, 100.0f}};
    edge.logit_bias = edges;
    edge.n_logit_bias = 2;
    sampler *s = create(&edge, VOCAB);
    sampler_free(s);
}

/* With nothing to process, the row is the caller's and the reduced path stays open. */
static void test_unused_costs_nothing(void) {
    sampler_params p = sampler_params_default();
    p.temperature = 0.0f;
    p.presence_penalty = 1.0f; /* nothing generated yet: inert */
    sampler *s = create(&p, VOCAB);
    if (!s) return;
    CHECK(sampler_params_process_logits(&p));
    CHECK(sampler_top_suffices(s, 1));
    sampler_accept(s, 2);
    CHECK(!sampler_top_suffices(s, 1));
    sampler_free(s);
    sampler_params plain = sampler_params_default();
    CHECK(!sampler_params_process_logits(&plain));
}

int main(void) {
    TEST_RUN(test_processing_by_hand);
    TEST_RUN(test_prompt_counts_for_repetition_only);
    TEST_RUN(test_min_tokens_masks_the_ending_ids);
    TEST_RUN(test_logit_bias_chooses_and_logprobs_stay_raw);
    TEST_RUN(test_parameters_are_copied);
    TEST_RUN(test_refusals_name_the_field);
    TEST_RUN(test_unused_costs_nothing);
    return test_finish();
}

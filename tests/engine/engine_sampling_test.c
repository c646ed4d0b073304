/* The OpenAI / vLLM sampling fields through the engine with the tiny checkpoint: logit_bias, presence and
 * frequency penalties (checked step by step against the raw logprobs the engine reports), min_tokens with an eos
 * the model would pick, ignore_eos, seeds alone and batched, fresh seeds, raw logprobs under processing, and the
 * refusals by field name. Each is run single and beside other requests. On the CPU backend, and then on CUDA
 * where this build has it and a GPU is usable: there a batch of other shapes may round logits differently, so
 * the comparisons across batch compositions are left to the CPU (DESIGN.md's near-tie rule covers them). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kite.h"
#include "test_util.h"

#define MAX_TOKENS 32

typedef struct record {
    int32_t tokens[MAX_TOKENS];
    float logprob[MAX_TOKENS];
    int32_t top_ids[MAX_TOKENS][KITE_MAX_LOGPROBS];
    float top_logprobs[MAX_TOKENS][KITE_MAX_LOGPROBS];
    int32_t n_top;
    int32_t n;
    char text[256];
    size_t text_length;
    kite_finish_reason finish;
} record;

static void collect(const kite_token_event *event, void *user_data) {
    record *r = user_data;
    if (event->token >= 0 && r->n < MAX_TOKENS) {
        r->tokens[r->n] = event->token;
        r->logprob[r->n] = event->logprob;
        r->n_top = event->n_top;
        for (int32_t k = 0; k < event->n_top; k++) {
            r->top_ids[r->n][k] = event->top_ids[k];
            r->top_logprobs[r->n][k] = event->top_logprobs[k];
        }
        r->n++;
    }
    if (event->text_length > 0 && r->text_length + event->text_length < sizeof r->text) {
        memcpy(r->text + r->text_length, event->text, event->text_length);
        r->text_length += event->text_length;
    }
    if (event->finish != KITE_FINISH_NONE) r->finish = event->finish;
}

static const int32_t prompt_a[] = {9707};
static const int32_t prompt_b[] = {785, 3974, 13876, 11};
static const int32_t prompt_c[] = {40, 1079, 264};

static kite_model *model;
static bool exact_batches; /* the backend gives a row the same logits whatever else is in the batch (the CPU) */

static kite_request request_for(const int32_t *prompt, size_t n, int32_t max_tokens, record *out) {
    kite_request r = kite_request_default();
    r.prompt_ids = prompt;
    r.n_prompt_ids = n;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.on_token = collect;
    r.user_data = out;
    memset(out, 0, sizeof *out);
    return r;
}

/* Runs the requests as one batch (submitted in order) on a fresh engine. */
static void run_batch(kite_request *requests, int n) {
    kite_engine *e = NULL;
    CHECK(kite_engine_create(model, NULL, &e) == KITE_OK);
    if (!e) return;
    for (int i = 0; i < n; i++)
        CHECK_MSG(kite_engine_submit(e, &requests[i], NULL) == KITE_OK, "%s", kite_last_error());
    CHECK(kite_engine_run(e) == KITE_OK);
    kite_engine_free(e);
}

static bool same_tokens(const record *a, const record *b) {
    return a->n == b->n && memcmp(a->tokens, b->tokens, (size_t)a->n * sizeof(int32_t)) == 0;
}

static void test_logit_bias(void) {
    const kite_logit_bias bias[1] = {{1234, 100.0f}};
    record alone, biased, plain_alone, plain;
    kite_request r = request_for(prompt_a, 1, 6, &alone);
    r.logit_bias = bias;
    r.n_logit_bias = 1;
    run_batch(&r, 1);
    CHECK(alone.n == 6);
    for (int32_t i = 0; i < alone.n; i++) CHECK(alone.tokens[i] == 1234);
    kite_request p = request_for(prompt_b, 4, 6, &plain_alone);
    run_batch(&p, 1);
    kite_request both[2] = {request_for(prompt_b, 4, 6, &plain), request_for(prompt_a, 1, 6, &biased)};
    both[1].logit_bias = bias;
    both[1].n_logit_bias = 1;
    run_batch(both, 2);
    CHECK(same_tokens(&alone, &biased));
    if (exact_batches) CHECK(same_tokens(&plain_alone, &plain)); /* the neighbour's bias does not leak */
}

/* Greedy with presence and frequency penalties: each token is the argmax of the raw logprobs (which the engine
 * reports, top 20) minus the penalties of the tokens generated before it. A positive penalty only lowers
 * logits, so the winner is among the top 20 while fewer than 20 distinct tokens are penalized. */
static void test_penalties_against_raw_logprobs(void) {
    const float presence = 1.5f, frequency = 0.75f;
    record plain, penalized, beside, other;
    kite_request p = request_for(prompt_a, 1, 16, &plain);
    run_batch(&p, 1);
    kite_request r = request_for(prompt_a, 1, 16, &penalized);
    r.sampling.presence_penalty = presence;
    r.sampling.frequency_penalty = frequency;
    r.n_logprobs = KITE_MAX_LOGPROBS;
    run_batch(&r, 1);
    CHECK(penalized.n == 16 && penalized.n_top == KITE_MAX_LOGPROBS);
    CHECK(!same_tokens(&plain, &penalized)); /* the tiny model repeats itself greedily; the penalties stop it */
    for (int32_t i = 0; i < penalized.n; i++) {
        double best_score = -INFINITY, chosen_score = -INFINITY;
        for (int32_t k = 0; k < KITE_MAX_LOGPROBS; k++) {
            const int32_t id = penalized.top_ids[i][k];
            int count = 0;
            for (int32_t j = 0; j < i; j++) count += penalized.tokens[j] == id;
            const double score =
                (double)penalized.top_logprobs[i][k] - frequency * count - (count > 0 ? presence : 0.0);
            if (score > best_score) best_score = score;
            if (id == penalized.tokens[i]) {
                chosen_score = score;
                /* The logprob reported is the raw one (vLLM's raw_logprobs), not the penalized one. */
                CHECK_MSG(penalized.logprob[i] == penalized.top_logprobs[i][k], "step %d: logprob %g, raw %g", i,
                          (double)penalized.logprob[i], (double)penalized.top_logprobs[i][k]);
            }
        }
        /* Equal up to the rounding of log-softmax's shift (the engine penalizes logits, this test logprobs). */
        CHECK_MSG(chosen_score >= best_score - 1e-4, "step %d: token %d scores %g, the best %g", i,
                  penalized.tokens[i], chosen_score, best_score);
    }
    /* The same beside a plain sampled request. */
    kite_request both[2] = {request_for(prompt_c, 3, 16, &other), r};
    both[0].sampling.temperature = 0.9f;
    both[0].sampling.seed = 5;
    both[1].user_data = &beside;
    memset(&beside, 0, sizeof beside);
    run_batch(both, 2);
    CHECK(beside.n == 16);
    if (exact_batches) CHECK(same_tokens(&penalized, &beside));
}

/* An eos the model is made to pick (bias +100): min_tokens holds it off, ignore_eos lets it through. */
static void test_min_tokens_and_ignore_eos(void) {
    const kite_model_info info = kite_model_get_info(model);
    CHECK(info.n_eos_ids > 0);
    if (info.n_eos_ids <= 0) return;
    const int32_t eos = info.eos_ids[0];
    const kite_logit_bias to_eos[1] = {{eos, 100.0f}};
    record at_once, held, ignored, neighbour;

    kite_request r = request_for(prompt_a, 1, 10, &at_once);
    r.ignore_eos = false;
    r.logit_bias = to_eos;
    r.n_logit_bias = 1;
    run_batch(&r, 1);
    CHECK(at_once.n == 1 && at_once.tokens[0] == eos && at_once.finish == KITE_FINISH_STOP);

    kite_request both[2] = {request_for(prompt_b, 4, 8, &neighbour), r};
    both[1].min_tokens = 4;
    both[1].user_data = &held;
    memset(&held, 0, sizeof held);
    run_batch(both, 2);
    CHECK_MSG(held.n == 5 && held.finish == KITE_FINISH_STOP, "%d tokens, finish %d", held.n, held.finish);
    for (int32_t i = 0; i < 4 && i < held.n; i++) CHECK(held.tokens[i] != eos);
    CHECK(held.tokens[4] == eos);

    r.user_data = &ignored;
    r.ignore_eos = true;
    r.max_tokens = 6;
    memset(&ignored, 0, sizeof ignored);
    run_batch(&r, 1);
    CHECK(ignored.n == 6 && ignored.finish == KITE_FINISH_LENGTH);
    for (int32_t i = 0; i < ignored.n; i++) CHECK(ignored.tokens[i] == eos);

    /* A stop id is held off the same way, with ignore_eos or not. */
    record stopped;
    const int32_t stop_id[1] = {4321};
    const kite_logit_bias to_stop[1] = {{4321, 100.0f}};
    kite_request s = request_for(prompt_a, 1, 10, &stopped);
    s.stop_ids = stop_id;
    s.n_stop_ids = 1;
    s.logit_bias = to_stop;
    s.n_logit_bias = 1;
    s.min_tokens = 3;
    run_batch(&s, 1);
    CHECK(stopped.n == 4 && stopped.tokens[3] == 4321 && stopped.finish == KITE_FINISH_STOP);
    for (int32_t i = 0; i < 3; i++) CHECK(stopped.tokens[i] != 4321);
}

/* Stop strings are looked for from the token after min_tokens on (vLLM's detokenizer): a stop string in the first
 * min_tokens tokens' text stays in the output. Token 1234 is "Item" in the tiny checkpoint's vocabulary. */
static void test_min_tokens_and_stop_strings(void) {
    const kite_logit_bias to_item[1] = {{1234, 100.0f}};
    const char *const stop[1] = {"Item"};
    record at_once, held;
    kite_request r = request_for(prompt_a, 1, 10, &at_once);
    r.logit_bias = to_item;
    r.n_logit_bias = 1;
    r.stop_strings = stop;
    r.n_stop_strings = 1;
    run_batch(&r, 1);
    CHECK_MSG(at_once.n == 1 && at_once.text_length == 0 && at_once.finish == KITE_FINISH_STOP, "%d tokens, '%.*s'",
              at_once.n, (int)at_once.text_length, at_once.text);
    r.min_tokens = 2;
    r.user_data = &held;
    memset(&held, 0, sizeof held);
    run_batch(&r, 1);
    CHECK_MSG(held.n == 3 && held.finish == KITE_FINISH_STOP, "%d tokens, finish %d", held.n, held.finish);
    CHECK_MSG(held.text_length == 8 && memcmp(held.text, "ItemItem", 8) == 0, "'%.*s'", (int)held.text_length,
              held.text);
}

/* A seeded request gives the same tokens alone and beside others; fresh seeds differ from run to run. */
static void test_seeds(void) {
    record alone, batched, first, second, greedy;
    kite_request r = request_for(prompt_a, 1, 20, &alone);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 42;
    run_batch(&r, 1);
    CHECK(alone.n == 20);
    kite_request three[3] = {request_for(prompt_b, 4, 12, &first), request_for(prompt_c, 3, 20, &greedy), r};
    three[0].sampling.temperature = 1.0f;
    three[0].sampling.seed = 42; /* the same seed on another prompt */
    three[2].user_data = &batched;
    memset(&batched, 0, sizeof batched);
    run_batch(three, 3);
    CHECK(batched.n == 20);
    if (exact_batches) CHECK(same_tokens(&alone, &batched));
    /* The same composition twice gives the same tokens on any backend. */
    record again;
    three[2].user_data = &again;
    memset(&again, 0, sizeof again);
    run_batch(three, 3);
    CHECK(same_tokens(&batched, &again));

    kite_request fresh = request_for(prompt_a, 1, 20, &first);
    fresh.sampling.temperature = 1.0f;
    fresh.sampling.fresh_seed = true;
    run_batch(&fresh, 1);
    fresh.user_data = &second;
    memset(&second, 0, sizeof second);
    run_batch(&fresh, 1);
    CHECK(first.n == 20 && second.n == 20);
    CHECK(!same_tokens(&first, &second)); /* 20 draws at temperature 1 from a random model's wide distribution */
}

/* The top logprobs of a processed request are the raw ones: equal to a plain request's at the same context. */
static void test_top_logprobs_are_raw(void) {
    const kite_logit_bias bias[2] = {{17, 30.0f}, {9, -30.0f}};
    record plain, biased;
    kite_request p = request_for(prompt_b, 4, 1, &plain);
    p.n_logprobs = KITE_MAX_LOGPROBS;
    kite_request b = p;
    b.user_data = &biased;
    b.logit_bias = bias;
    b.n_logit_bias = 2;
    b.sampling.repetition_penalty = 1.3f;
    memset(&biased, 0, sizeof biased);
    kite_request both[2] = {p, b};
    run_batch(both, 2);
    CHECK(plain.n == 1 && biased.n == 1 && biased.tokens[0] == 17);
    /* Two rows of one batch with the same context: the same logits, on any backend. */
    CHECK(memcmp(plain.top_ids[0], biased.top_ids[0], sizeof plain.top_ids[0]) == 0);
    CHECK(memcmp(plain.top_logprobs[0], biased.top_logprobs[0], sizeof plain.top_logprobs[0]) == 0);
    double sum = 0.0; /* the top 20 of a log-softmax: probabilities that sum to at most 1 */
    for (int k = 0; k < KITE_MAX_LOGPROBS; k++) sum += exp((double)biased.top_logprobs[0][k]);
    CHECK(sum <= 1.0 + 1e-5);
}

static void expect_refused(kite_request r, const char *field) {
    kite_engine *e = NULL;
    CHECK(kite_engine_create(model, NULL, &e) == KITE_OK);
    if (!e) return;
    kite_request_id id = 0;
    CHECK_MSG(kite_engine_submit(e, &r, &id) == KITE_ERROR_INVALID_ARGUMENT, "%s accepted", field);
    CHECK_MSG(strstr(kite_last_error(), field) != NULL, "'%s' does not name %s", kite_last_error(), field);
    CHECK(kite_engine_idle(e));
    kite_engine_free(e);
}

static void test_refusals(void) {
    record unused;
    const kite_request base = request_for(prompt_a, 1, 4, &unused);
    kite_request r = base;
    r.sampling.presence_penalty = 2.5f;
    expect_refused(r, "presence_penalty");
    r = base;
    r.sampling.frequency_penalty = -3.0f;
    expect_refused(r, "frequency_penalty");
    r = base;
    r.sampling.repetition_penalty = 0.0f;
    expect_refused(r, "repetition_penalty");
    r = base;
    const kite_logit_bias outside[1] = {{151936, 1.0f}};
    r.logit_bias = outside;
    r.n_logit_bias = 1;
    expect_refused(r, "logit_bias[0]: token 151936");
    r = base;
    const kite_logit_bias too_much[1] = {{5, -101.0f}};
    r.logit_bias = too_much;
    r.n_logit_bias = 1;
    expect_refused(r, "logit_bias[0]: bias");
    r = base;
    static kite_logit_bias many[KITE_MAX_LOGIT_BIAS + 1];
    for (int i = 0; i <= KITE_MAX_LOGIT_BIAS; i++) many[i] = (kite_logit_bias){i, 1.0f};
    r.logit_bias = many;
    r.n_logit_bias = KITE_MAX_LOGIT_BIAS + 1;
    expect_refused(r, "logit_bias has 301 entries");
    r = base;
    r.min_tokens = -1;
    expect_refused(r, "min_tokens");
    r = base;
    r.min_tokens = 5; /* max_tokens is 4 */
    expect_refused(r, "min_tokens 5 is more than max_tokens 4");
    r = base;
    r.sampling.fresh_seed = true;
    r.sampling.seed = 3;
    expect_refused(r, "fresh_seed");
    r = base;
    r.n_logprobs = KITE_MAX_LOGPROBS + 1;
    expect_refused(r, "n_logprobs");
}

static void run_all(kite_backend_kind backend) {
    kite_load_params p = kite_load_params_default();
    p.backend = backend;
    p.n_threads = 2;
    model = NULL;
    kite_status s = kite_model_load(KITE_TEST_DATA_DIR "/tiny", &p, &model);
    CHECK_MSG(s == KITE_OK, "load: %s", kite_last_error());
    if (!model) return;
    exact_batches = backend == KITE_BACKEND_CPU;
    TEST_RUN(test_logit_bias);
    TEST_RUN(test_penalties_against_raw_logprobs);
    TEST_RUN(test_min_tokens_and_ignore_eos);
    TEST_RUN(test_min_tokens_and_stop_strings);
    TEST_RUN(test_seeds);
    TEST_RUN(test_top_logprobs_are_raw);
    TEST_RUN(test_refusals);
    kite_model_free(model);
    model = NULL;
}

/* CPU only: the tiny checkpoint's head_dim (32) is one the CUDA backend does not run. */
int main(void) {
    run_all(KITE_BACKEND_CPU);
    return test_finish();
}

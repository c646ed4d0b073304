/* Tests of the sampler: every rule of sampler.h checked on hand-made distributions, plus brute-force
 * references on a Qwen3-sized vocabulary. All seeds are fixed, so the statistical checks cannot flake. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampling/sampler.h"
#include "test_util.h"

#define QWEN3_VOCAB 151936

/* A tiny deterministic generator for test data, independent of the sampler's own. */
static uint64_t test_lcg_state = 12345;
static double test_random_unit(void) {
    test_lcg_state = test_lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(test_lcg_state >> 11) * 0x1.0p-53;
}

/* logits[i] = log(probabilities[i]) (0 -> -inf), so the softmax gives the probabilities back. */
static void logits_from_probabilities(const double *probabilities, int n, float *logits) {
    for (int i = 0; i < n; i++) logits[i] = probabilities[i] > 0 ? (float)log(probabilities[i]) : -INFINITY;
}

/* Draws `draws` tokens with one sampler and counts them; false when any call fails. */
static bool count_draws(const sampler_params *params, const float *logits, int n, int draws, int *counts) {
    sampler *s = NULL;
    if (sampler_create(params, n, &s) != KITE_OK) return false;
    memset(counts, 0, (size_t)n * sizeof *counts);
    bool ok = true;
    for (int d = 0; d < draws && ok; d++) {
        int32_t token = -1;
        if (sampler_sample(s, logits, &token, NULL) != KITE_OK || token < 0 || token >= n) {
            ok = false;
        } else {
            counts[token]++;
        }
    }
    sampler_free(s);
    return ok;
}

/* True when exactly the tokens flagged in `allowed` were drawn: none outside, every one inside. */
static bool support_is(const int *counts, const bool *allowed, int n) {
    bool ok = true;
    for (int i = 0; i < n; i++) {
        if (allowed[i] != (counts[i] > 0)) {
            fprintf(stderr, "    token %d: allowed %d, drawn %d times\n", i, (int)allowed[i], counts[i]);
            ok = false;
        }
    }
    return ok;
}

/* Same, with the allowed set given as a list of ids. */
static bool support_is_list(const int *counts, int n, const int *ids, int n_ids) {
    bool allowed[64] = {false};
    if (n > 64) return false;
    for (int j = 0; j < n_ids; j++) allowed[ids[j]] = true;
    return support_is(counts, allowed, n);
}

static int32_t sample_once(const sampler_params *params, const float *logits, int n) {
    sampler *s = NULL;
    if (sampler_create(params, n, &s) != KITE_OK) return -1;
    int32_t token = -1;
    if (sampler_sample(s, logits, &token, NULL) != KITE_OK) token = -1;
    sampler_free(s);
    return token;
}

/* ---- parameters -------------------------------------------------------------------------------- */

static void test_defaults_and_parameter_validation(void) {
    sampler_params d = sampler_params_default();
    CHECK(d.temperature == 1.0f && d.top_k == 0 && d.top_p == 1.0f && d.min_p == 0.0f);
    CHECK(d.repetition_penalty == 1.0f && d.seed == 0);

    sampler *s = NULL;
    CHECK(sampler_create(&d, 0, &s) == KITE_ERROR_INVALID_ARGUMENT && s == NULL);
    CHECK(sampler_create(NULL, 10, &s) == KITE_ERROR_INVALID_ARGUMENT);

    sampler_params bad[8];
    for (int i = 0; i < 8; i++) bad[i] = d;
    bad[0].temperature = -0.5f;
    bad[1].temperature = NAN;
    bad[2].top_k = -1;
    bad[3].top_p = 1.5f;
    bad[4].top_p = NAN;
    bad[5].min_p = -0.1f;
    bad[6].repetition_penalty = 0.0f;
    bad[7].repetition_penalty = INFINITY;
    for (int i = 0; i < 8; i++) {
        s = NULL;
        CHECK_MSG(sampler_create(&bad[i], 10, &s) == KITE_ERROR_INVALID_ARGUMENT, "case %d", i);
        CHECK(s == NULL);
        CHECK(strstr(kite_last_error(), "sampler") != NULL);
    }
    CHECK(sampler_create(&d, 10, &s) == KITE_OK && s != NULL);
    float logits[10] = {0};
    CHECK(sampler_sample(s, NULL, &(int32_t){0}, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(sampler_sample(s, logits, NULL, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    sampler_free(s);
    sampler_free(NULL);
}

/* ---- greedy ------------------------------------------------------------------------------------ */

static void test_greedy_is_argmax_lowest_id_on_ties(void) {
    sampler_params p = sampler_params_default();
    p.temperature = 0.0f;
    float logits[6] = {1.0f, 3.0f, -INFINITY, 3.0f, 2.9f, -5.0f};
    CHECK(sample_once(&p, logits, 6) == 1);
    float all_equal[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    CHECK(sample_once(&p, all_equal, 4) == 0);
    float last_wins[4] = {-INFINITY, -3.0f, -2.0f, -1.0f};
    CHECK(sample_once(&p, last_wins, 4) == 3);

    /* The seed and the filters play no part in greedy. */
    p.seed = 999;
    p.top_k = 1;
    p.top_p = 0.1f;
    CHECK(sample_once(&p, logits, 6) == 1);
}

/* ---- reproducibility --------------------------------------------------------------------------- */

static void test_seeded_reproducibility(void) {
    enum { vocab = 1000, steps = 2000 };
    float *logits = malloc(vocab * sizeof *logits);
    for (int i = 0; i < vocab; i++) logits[i] = (float)(test_random_unit() * 2.0);

    sampler_params p = sampler_params_default();
    p.temperature = 0.9f;
    p.seed = 42;
    sampler *a = NULL, *b = NULL, *c = NULL;
    CHECK(sampler_create(&p, vocab, &a) == KITE_OK);
    CHECK(sampler_create(&p, vocab, &b) == KITE_OK);
    p.seed = 43;
    CHECK(sampler_create(&p, vocab, &c) == KITE_OK);
    int same_ab = 0, same_ac = 0;
    for (int t = 0; t < steps; t++) {
        int32_t ta = -1, tb = -2, tc = -3;
        CHECK(sampler_sample(a, logits, &ta, NULL) == KITE_OK);
        CHECK(sampler_sample(b, logits, &tb, NULL) == KITE_OK);
        CHECK(sampler_sample(c, logits, &tc, NULL) == KITE_OK);
        same_ab += ta == tb;
        same_ac += ta == tc;
    }
    CHECK_MSG(same_ab == steps, "same seed agreed on %d of %d", same_ab, steps);
    /* Independent streams over ~1000 near-uniform tokens coincide about 0.1% of the time. */
    CHECK_MSG(same_ac < steps / 50, "different seeds agreed on %d of %d", same_ac, steps);

    /* Seed 0 is a valid seed (splitmix64 keeps xoshiro's state nonzero) and gives varied tokens. */
    p.seed = 0;
    int counts[vocab];
    CHECK(count_draws(&p, logits, vocab, 3000, counts));
    int distinct = 0;
    for (int i = 0; i < vocab; i++) distinct += counts[i] > 0;
    CHECK_MSG(distinct > 500, "seed 0 drew only %d distinct tokens", distinct);

    sampler_free(a);
    sampler_free(b);
    sampler_free(c);
    free(logits);
}

/* ---- top-k ------------------------------------------------------------------------------------- */

static void test_top_k_keeps_exactly_the_k_best(void) {
    enum { n = 10, draws = 20000 };
    float logits[n] = {0.5f, 2.0f, 1.0f, 2.0f, 0.1f, 1.5f, -INFINITY, 1.0f, 3.0f, 1.0f};
    int counts[n];
    sampler_params p = sampler_params_default();
    p.seed = 7;

    p.top_k = 1;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){8}, 1));

    p.top_k = 4;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){8, 1, 3, 5}, 4));

    /* The 5th place is a three-way tie at 1.0 (ids 2, 7, 9): the lowest id is kept. */
    p.top_k = 5;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){8, 1, 3, 5, 2}, 5));

    /* The boundary tie between ids 1 and 3 (both 2.0) at k = 2: id 1 stays. */
    p.top_k = 2;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){8, 1}, 2));

    /* k at or beyond the number of possible tokens: everything but -inf. */
    p.top_k = 9;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1, 2, 3, 4, 5, 7, 8, 9}, 9));
    p.top_k = 100;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1, 2, 3, 4, 5, 7, 8, 9}, 9));
}

/* ---- top-p ------------------------------------------------------------------------------------- */

static void test_top_p_keeps_the_smallest_prefix(void) {
    enum { n = 4, draws = 20000 };
    /* Probabilities 0.5 / 0.3 / 0.15 / 0.05, placed at shuffled ids so the order is not the id order. */
    const double probabilities[n] = {0.3, 0.05, 0.5, 0.15}; /* ranks: id 2, 0, 3, 1 */
    float logits[n];
    logits_from_probabilities(probabilities, n, logits);
    int counts[n];
    sampler_params p = sampler_params_default();
    p.seed = 11;

    struct {
        float top_p;
        int ids[4];
        int n_ids;
    } cases[] = {
        {0.0f, {2}, 1},           {0.3f, {2}, 1},           {0.5f, {2}, 1},
        {0.51f, {2, 0}, 2},       {0.8f, {2, 0}, 2},        {0.81f, {2, 0, 3}, 3},
        {0.95f, {2, 0, 3}, 3},    {0.96f, {2, 0, 3, 1}, 4}, {1.0f, {2, 0, 3, 1}, 4},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        p.top_p = cases[c].top_p;
        CHECK(count_draws(&p, logits, n, draws, counts));
        CHECK_MSG(support_is_list(counts, n, cases[c].ids, cases[c].n_ids), "top_p %g", (double)p.top_p);
    }


    /* top-p renormalizes over what top-k kept: 0.5 and 0.3 become 0.625 and 0.375. Without top-k,
     * 0.62 would need ids 2 and 0. */
    p.top_k = 2;
    p.top_p = 0.62f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){2}, 1));
    p.top_p = 0.63f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){2, 0}, 2));

    /* Temperature comes first: at 0.5 the probabilities are 0.685 / 0.247 / 0.062 / 0.007, so 0.9 is
     * reached by two tokens where at temperature 1 it takes three. */
    p.top_k = 0;
    p.top_p = 0.9f;
    p.temperature = 0.5f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){2, 0}, 2));
    p.temperature = 1.0f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){2, 0, 3}, 3));
}

/* ---- min-p ------------------------------------------------------------------------------------- */

static void test_min_p_keeps_those_above_the_ratio(void) {
    enum { n = 6, draws = 20000 };
    const double probabilities[n] = {0.4, 0.2, 0.19, 0.1, 0.06, 0.05};
    float logits[n];
    logits_from_probabilities(probabilities, n, logits);
    int counts[n];
    sampler_params p = sampler_params_default();
    p.seed = 5;

    p.min_p = 0.5f; /* >= 0.2: the boundary itself is kept */
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1}, 2));
    p.min_p = 0.25f; /* >= 0.1 */
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1, 2, 3}, 4));
    p.min_p = 0.6f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0}, 1));
    p.min_p = 0.01f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1, 2, 3, 4, 5}, 6));

    /* Temperature 2 takes square roots of the ratios (1, .71, .69, .5, .39, .35): 0.4 now keeps four. */
    p.temperature = 2.0f;
    p.min_p = 0.4f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1, 2, 3}, 4));
    p.temperature = 1.0f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1, 2}, 3));

    /* min_p 1 keeps every token tied at the top. */
    float tied[3] = {2.0f, 2.0f, 1.0f};
    p.min_p = 1.0f;
    CHECK(count_draws(&p, tied, 3, draws, counts));
    CHECK(support_is_list(counts, 3, (int[]){0, 1}, 2));

    /* With the other filters, on each code path: top-p 0.9 keeps ids 0-4, min-p 0.3 (>= 0.12) keeps
     * ids 0-2; top-p 0.55 keeps ids 0-1 and min-p cannot add any back. */
    p.min_p = 0.3f;
    p.top_p = 0.9f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1, 2}, 3));
    p.top_k = 5;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1, 2}, 3));
    p.top_k = 0;
    p.top_p = 0.55f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1}, 2));
    p.top_p = 1.0f;
    p.top_k = 2;
    p.min_p = 0.01f;
    CHECK(count_draws(&p, logits, n, draws, counts));
    CHECK(support_is_list(counts, n, (int[]){0, 1}, 2));
}

/* ---- repetition penalty ------------------------------------------------------------------------ */

static int32_t greedy_after_context(float penalty, const float *logits, int n, const int32_t *context,
                                    int n_context, float *logprob) {
    sampler_params p = sampler_params_default();
    p.temperature = 0.0f;
    p.repetition_penalty = penalty;
    sampler *s = NULL;
    if (sampler_create(&p, n, &s) != KITE_OK) return -1;
    for (int i = 0; i < n_context; i++) sampler_accept(s, context[i]);
    int32_t token = -1;
    if (sampler_sample(s, logits, &token, logprob) != KITE_OK) token = -1;
    sampler_free(s);
    return token;
}

static void test_repetition_penalty(void) {
    /* Positive logit divided: 2.0 / 2 = 1.0 falls below 1.5. */
    float positive[4] = {2.0f, 1.5f, -1.0f, -1.2f};
    CHECK(greedy_after_context(2.0f, positive, 4, NULL, 0, NULL) == 0);
    CHECK(greedy_after_context(2.0f, positive, 4, (int32_t[]){0}, 1, NULL) == 1);
    CHECK(greedy_after_context(1.0f, positive, 4, (int32_t[]){0}, 1, NULL) == 0);

    /* Negative logit multiplied: -1.0 * 2 = -2.0 falls below -1.5. Dividing it (the sign mistake)
     * would have raised it to -0.5 and kept it first. */
    float negative[3] = {-1.0f, -1.5f, -3.0f};
    CHECK(greedy_after_context(2.0f, negative, 3, (int32_t[]){0}, 1, NULL) == 1);
    /* ...and a penalized negative token never overtakes an unpenalized one: id 1 penalized stays last
     * among the first two. */
    CHECK(greedy_after_context(2.0f, negative, 3, (int32_t[]){1}, 1, NULL) == 0);

    /* A penalty below 1 encourages repetition: 1.0 / 0.5 = 2.0 beats 1.5. */
    float encourage[2] = {1.0f, 1.5f};
    CHECK(greedy_after_context(0.5f, encourage, 2, (int32_t[]){0}, 1, NULL) == 0);

    /* Once per distinct token, however often it occurred: 2.0 / 1.5 = 1.33 still beats 1.1
     * (three applications would give 0.59). */
    float once[2] = {2.0f, 1.1f};
    CHECK(greedy_after_context(1.5f, once, 2, (int32_t[]){0, 0, 0}, 3, NULL) == 0);

    /* Ids outside the vocabulary are ignored rather than written out of bounds. */
    CHECK(greedy_after_context(2.0f, positive, 4, (int32_t[]){-1, 4, 1000}, 3, NULL) == 0);

    /* A large logit divided by a penalty below 1 saturates instead of becoming +inf. */
    float huge[2] = {3.0e38f, 1.0f};
    CHECK(greedy_after_context(0.01f, huge, 2, (int32_t[]){0}, 1, NULL) == 0);

    /* The reported logprob is of the raw logits, whatever the penalty did. */
    float logprob = 0.0f;
    CHECK(greedy_after_context(2.0f, positive, 4, (int32_t[]){0}, 1, &logprob) == 1);
    double sum = 0.0;
    for (int i = 0; i < 4; i++) sum += exp((double)positive[i]);
    CHECK_MSG(fabs(logprob - (1.5 - log(sum))) < 1e-5, "logprob %g", (double)logprob);

    /* Penalties apply when sampling too: with id 0 (0.6 of the mass) penalized to -inf territory, a
     * sampler never picks it; the context is the accepted prompt and generated tokens together. */
    sampler_params p = sampler_params_default();
    p.repetition_penalty = 1000.0f;
    p.seed = 3;
    sampler *s = NULL;
    CHECK(sampler_create(&p, 3, &s) == KITE_OK);
    sampler_accept(s, 0);
    float three[3] = {30.0f, 29.0f, 29.0f};
    int drawn0 = 0;
    for (int i = 0; i < 1000; i++) {
        int32_t token = -1;
        CHECK(sampler_sample(s, three, &token, NULL) == KITE_OK);
        drawn0 += token == 0;
    }
    CHECK(drawn0 == 0);
    sampler_free(s);
}

/* ---- temperature ------------------------------------------------------------------------------- */

static void test_temperature_limits(void) {
    enum { draws = 2000 };
    float logits[3] = {1.0f, 1.1f, 0.9f};
    int counts[3];
    sampler_params p = sampler_params_default();
    p.seed = 9;
    const float tiny[] = {1e-3f, 1e-30f, 1e-45f /* a denormal: 1/T overflows float */};
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
        p.temperature = tiny[i];
        CHECK(count_draws(&p, logits, 3, draws, counts));
        CHECK_MSG(counts[1] == draws, "temperature %g: argmax drawn %d of %d", (double)tiny[i], counts[1], draws);
    }
    /* A tie at the top stays a fair coin however cold it gets. */
    float tied[3] = {1.0f, 1.0f, 0.0f};
    p.temperature = 1e-6f;
    CHECK(count_draws(&p, tied, 3, draws, counts));
    CHECK(counts[2] == 0 && counts[0] > draws / 2 - 150 && counts[1] > draws / 2 - 150);

    /* Very hot: near uniform. */
    p.temperature = 1e6f;
    CHECK(count_draws(&p, logits, 3, 30000, counts));
    for (int i = 0; i < 3; i++) CHECK_MSG(abs(counts[i] - 10000) < 500, "id %d drawn %d", i, counts[i]);
}

/* ---- frequencies ------------------------------------------------------------------------------- */

/* The distribution sampler.h promises, written the slow obvious way: double precision, full sort. */
static void reference_distribution(const sampler_params *p, const float *logits, int n, double *out) {
    int order[64];
    double weight[64];
    int m = 0;
    double max_logit = -INFINITY;
    for (int i = 0; i < n; i++)
        if (logits[i] > max_logit) max_logit = logits[i];
    for (int i = 0; i < n; i++) {
        out[i] = 0.0;
        weight[i] = exp(((double)logits[i] - max_logit) / p->temperature);
        if (logits[i] != -INFINITY) order[m++] = i;
    }
    for (int a = 1; a < m; a++) /* insertion sort: logit descending, id ascending */
        for (int b = a; b > 0 && logits[order[b]] > logits[order[b - 1]]; b--) {
            int t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
    int kept = m;
    if (p->top_k > 0 && p->top_k < kept) kept = p->top_k;
    double total = 0.0;
    for (int j = 0; j < kept; j++) total += weight[order[j]];
    if (p->top_p < 1.0f) {
        double cumulative = 0.0;
        for (int j = 0; j < kept; j++) {
            cumulative += weight[order[j]] / total;
            if (cumulative >= p->top_p) {
                kept = j + 1;
                break;
            }
        }
    }
    int after_min_p = 0;
    while (after_min_p < kept && weight[order[after_min_p]] >= p->min_p) after_min_p++;
    kept = after_min_p;
    total = 0.0;
    for (int j = 0; j < kept; j++) total += weight[order[j]];
    for (int j = 0; j < kept; j++) out[order[j]] = weight[order[j]] / total;
}

/* Pearson's chi-square of the counts against the expected probabilities; a token drawn despite
 * probability 0 makes it infinite. */
static double chi_square(const int *counts, const double *expected, int n, int draws, int *degrees) {
    double chi = 0.0;
    *degrees = -1;
    for (int i = 0; i < n; i++) {
        if (expected[i] == 0.0) {
            if (counts[i] != 0) return INFINITY;
            continue;
        }
        double e = expected[i] * draws;
        chi += (counts[i] - e) * (counts[i] - e) / e;
        (*degrees)++;
    }
    return chi;
}

/* A filter combination of the table-driven tests, and the sampler parameters it stands for. */
typedef struct filter_case {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
} filter_case;

static sampler_params filter_params(const filter_case *f, uint64_t seed) {
    sampler_params p = sampler_params_default();
    p.temperature = f->temperature;
    p.top_k = f->top_k;
    p.top_p = f->top_p;
    p.min_p = f->min_p;
    p.seed = seed;
    return p;
}

static void test_frequencies_match_softmax(void) {
    enum { n = 8, draws = 200000 };
    float logits[n] = {0.3f, -1.2f, 2.0f, 0.0f, -INFINITY, 1.1f, -0.4f, 0.7f};
    int counts[n];
    double expected[n];
    const filter_case cases[] = {
        {1.0f, 0, 1.0f, 0.0f}, {0.7f, 0, 1.0f, 0.0f}, {2.5f, 0, 1.0f, 0.0f}, {0.8f, 5, 1.0f, 0.0f},
        {0.8f, 0, 0.9f, 0.0f}, {1.0f, 0, 1.0f, 0.1f}, {1.3f, 6, 0.85f, 0.2f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sampler_params p = filter_params(&cases[c], 1000 + c);
        reference_distribution(&p, logits, n, expected);
        CHECK(count_draws(&p, logits, n, draws, counts));
        int degrees = 0;
        double chi = chi_square(counts, expected, n, draws, &degrees);
        /* 40 is far beyond the 1e-6 tail of chi-square for <= 6 degrees of freedom, yet a bias of
         * 1% of a token's probability already gives hundreds at this many draws. */
        CHECK_MSG(chi < 40.0 && degrees >= 1, "case %zu: chi-square %.2f with %d degrees of freedom", c, chi,
                  degrees);
        for (int i = 0; i < n; i++)
            CHECK_MSG((expected[i] > 0) == (counts[i] > 0), "case %zu: id %d expected %g drawn %d", c, i,
                      expected[i], counts[i]);
    }
}

/* ---- invalid logits ---------------------------------------------------------------------------- */

static void test_invalid_logits_rejected(void) {
    sampler_params p = sampler_params_default();
    sampler *s = NULL;
    CHECK(sampler_create(&p, 5, &s) == KITE_OK);
    int32_t token = -7;
    float logprob = 0.0f;
    float with_nan[5] = {0.0f, 1.0f, 2.0f, NAN, 1.0f};
    CHECK(sampler_sample(s, with_nan, &token, &logprob) == KITE_ERROR_INVALID_INPUT);
    CHECK(token == -7);
    CHECK(strstr(kite_last_error(), "NaN") != NULL && strstr(kite_last_error(), "[3]") != NULL);
    p.temperature = 0.0f; /* greedy checks too */
    sampler *g = NULL;
    CHECK(sampler_create(&p, 5, &g) == KITE_OK);
    CHECK(sampler_sample(g, with_nan, &token, NULL) == KITE_ERROR_INVALID_INPUT);

    float with_inf[5] = {0.0f, INFINITY, 2.0f, 1.0f, 1.0f};
    CHECK(sampler_sample(s, with_inf, &token, NULL) == KITE_ERROR_INVALID_INPUT);
    float all_impossible[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK(sampler_sample(s, all_impossible, &token, NULL) == KITE_ERROR_INVALID_INPUT);
    CHECK(sampler_sample(g, all_impossible, &token, NULL) == KITE_ERROR_INVALID_INPUT);
    int32_t ids[2];
    float logprobs[2];
    CHECK(sampler_top_logprobs(with_nan, 5, 2, ids, logprobs) == KITE_ERROR_INVALID_INPUT);

    /* -inf is fine and never drawn; the sampler still works after a rejected row. */
    float one_possible[5] = {-INFINITY, -INFINITY, 0.25f, -INFINITY, -INFINITY};
    for (int i = 0; i < 200; i++) {
        CHECK(sampler_sample(s, one_possible, &token, &logprob) == KITE_OK);
        CHECK(token == 2 && logprob == 0.0f);
    }
    sampler_free(s);
    sampler_free(g);
}

/* ---- top logprobs ------------------------------------------------------------------------------ */

static void test_top_logprobs(void) {
    enum { vocab = 1000, k = 25 };
    float *logits = malloc(vocab * sizeof *logits);
    /* Quantized to quarters so that many ties (and ties across the k boundary) occur. */
    for (int i = 0; i < vocab; i++) logits[i] = (float)floor(test_random_unit() * 24.0) * 0.25f;
    logits[17] = -INFINITY;
    double max_logit = -INFINITY, sum = 0.0;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > max_logit) max_logit = logits[i];
    for (int i = 0; i < vocab; i++) sum += exp(logits[i] - max_logit);
    double log_normalizer = max_logit + log(sum);

    int32_t ids[vocab];
    float logprobs[vocab];
    CHECK(sampler_top_logprobs(logits, vocab, k, ids, logprobs) == KITE_OK);
    /* The reference: walk the logit levels from the top, ids ascending within a level. */
    int expected_ids[k];
    int filled = 0;
    for (int level = 23; level >= 0 && filled < k; level--)
        for (int i = 0; i < vocab && filled < k; i++)
            if (logits[i] == level * 0.25f) expected_ids[filled++] = i;
    for (int j = 0; j < k; j++) {
        CHECK_MSG(ids[j] == expected_ids[j], "rank %d: id %d, expected %d", j, ids[j], expected_ids[j]);
        CHECK(fabs(logprobs[j] - (logits[ids[j]] - log_normalizer)) < 1e-5);
        if (j > 0) CHECK(logprobs[j] <= logprobs[j - 1]);
    }

    /* All of them: normalized, and the -inf one comes last with logprob -inf. */
    CHECK(sampler_top_logprobs(logits, vocab, vocab, ids, logprobs) == KITE_OK);
    double total = 0.0;
    for (int j = 0; j < vocab; j++) total += exp((double)logprobs[j]);
    CHECK_MSG(fabs(total - 1.0) < 1e-5, "sum of probabilities %.9f", total);
    CHECK(ids[vocab - 1] == 17 && logprobs[vocab - 1] == -INFINITY);

    /* The sampled token's logprob agrees with the table. */
    sampler_params p = sampler_params_default();
    p.temperature = 0.0f;
    sampler *s = NULL;
    CHECK(sampler_create(&p, vocab, &s) == KITE_OK);
    int32_t token = -1;
    float logprob = 0.0f;
    CHECK(sampler_sample(s, logits, &token, &logprob) == KITE_OK);
    CHECK(token == ids[0] && fabs(logprob - logprobs[0]) < 1e-6);
    sampler_free(s);

    CHECK(sampler_top_logprobs(logits, vocab, 0, NULL, NULL) == KITE_OK);
    CHECK(sampler_top_logprobs(logits, vocab, vocab + 1, ids, logprobs) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(sampler_top_logprobs(logits, vocab, -1, ids, logprobs) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(sampler_top_logprobs(logits, vocab, 3, NULL, logprobs) == KITE_ERROR_INVALID_ARGUMENT);
    free(logits);
}

/* ---- a Qwen3-sized vocabulary ------------------------------------------------------------------ */

/* 30 "head" tokens at scattered ids holding ~99.9% of the mass at temperature 1, a block of 20 equal
 * logits above the rest, and a long tail: the shape of a real next-token distribution, big enough that
 * the partial-selection and threshold paths matter. */
static float *make_large_logits(int *head_ids, int *tied_ids) {
    float *logits = malloc(QWEN3_VOCAB * sizeof *logits);
    for (int i = 0; i < QWEN3_VOCAB; i++) logits[i] = (float)(test_random_unit() * 3.0 - 2.0);
    for (int j = 0; j < 30; j++) {
        head_ids[j] = 1000 + j * 5003;
        logits[head_ids[j]] = (float)(14.0 + 2.0 * test_random_unit());
    }
    for (int j = 0; j < 20; j++) {
        tied_ids[j] = 3 + j * 7001;
        logits[tied_ids[j]] = 1.5f;
    }
    return logits;
}

/* Membership of the reference nucleus at temperature t: sorted by (logit desc, id asc) in double. */
static int compare_by_logit_then_id(const void *a, const void *b, const float *logits) {
    int x = *(const int *)a, y = *(const int *)b;
    if (logits[x] != logits[y]) return logits[x] > logits[y] ? -1 : 1;
    return x < y ? -1 : 1;
}
static const float *sort_logits;
static int compare_ids(const void *a, const void *b) { return compare_by_logit_then_id(a, b, sort_logits); }

static void test_large_vocab_top_k_and_top_p(void) {
    int head_ids[30], tied_ids[20];
    float *logits = make_large_logits(head_ids, tied_ids);
    int *counts = malloc(QWEN3_VOCAB * sizeof *counts);
    bool *allowed = calloc(QWEN3_VOCAB, sizeof *allowed);
    sampler_params p = sampler_params_default();

    /* top-k 40 = the 30 head tokens and the 10 lowest ids of the tied block (hot enough that the
     * tied ones are drawn too). */
    p.top_k = 40;
    p.temperature = 20.0f;
    p.seed = 77;
    CHECK(count_draws(&p, logits, QWEN3_VOCAB, 1000, counts));
    for (int j = 0; j < 30; j++) allowed[head_ids[j]] = true;
    for (int j = 0; j < 10; j++) allowed[tied_ids[j]] = true;
    CHECK(support_is(counts, allowed, QWEN3_VOCAB));

    /* top-p without top-k, against a full sort in double. */
    int *order = malloc(QWEN3_VOCAB * sizeof *order);
    for (int i = 0; i < QWEN3_VOCAB; i++) order[i] = i;
    sort_logits = logits;
    qsort(order, QWEN3_VOCAB, sizeof *order, compare_ids);
    const struct {
        float temperature, top_p;
        int draws;
        bool all_appear;
    } cases[] = {
        {1.0f, 0.5f, 1000, true},  /* a few head tokens */
        {1.0f, 0.999f, 300, false}, /* all head tokens and thousands of the tail */
        {4.0f, 0.9f, 40, false},    /* hot: the tail dominates, a nucleus of ~10^5 tokens */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double total = 0.0;
        for (int i = 0; i < QWEN3_VOCAB; i++) total += exp((logits[i] - logits[order[0]]) / cases[c].temperature);
        memset(allowed, 0, QWEN3_VOCAB * sizeof *allowed);
        double cumulative = 0.0;
        int nucleus = 0;
        while (nucleus < QWEN3_VOCAB && cumulative < cases[c].top_p) {
            int id = order[nucleus++];
            allowed[id] = true;
            cumulative += exp((logits[id] - logits[order[0]]) / cases[c].temperature) / total;
        }
        p.top_k = 0;
        p.temperature = cases[c].temperature;
        p.top_p = cases[c].top_p;
        p.seed = 100 + c;
        CHECK(count_draws(&p, logits, QWEN3_VOCAB, cases[c].draws, counts));
        int outside = 0, inside = 0;
        for (int i = 0; i < QWEN3_VOCAB; i++) {
            if (counts[i] > 0 && !allowed[i]) outside++;
            if (allowed[i] && counts[i] > 0) inside++;
        }
        CHECK_MSG(outside == 0, "case %zu: %d tokens outside the nucleus of %d", c, outside, nucleus);
        if (cases[c].all_appear) CHECK_MSG(inside == nucleus, "case %zu: %d of %d drawn", c, inside, nucleus);
    }
    free(order);
    free(allowed);
    free(counts);
    free(logits);
}

/* top-p over a nucleus large enough for the sampler's radix sort, its cut inside a block of ties that mixes +0
 * and -0 (equal logits: the lowest ids stay), with negative logits kept too: exactly the reference prefix of
 * (logit desc, id asc) is drawn, every token of it. */
static void test_top_p_cut_inside_ties_of_a_large_nucleus(void) {
    enum { vocab = 2048 };
    static const float levels[] = {0.5f, 0.25f, 0.0f, -0.0f, -0.25f, -30.0f, -30.0f, -30.0f};
    float *logits = malloc(vocab * sizeof *logits);
    int *order = malloc(vocab * sizeof *order), *counts = malloc(vocab * sizeof *counts);
    bool *allowed = calloc(vocab, sizeof *allowed);
    for (int i = 0; i < vocab; i++) {
        logits[i] = levels[(int)(test_random_unit() * 8) & 7];
        order[i] = i;
    }
    sort_logits = logits;
    qsort(order, vocab, sizeof *order, compare_ids);
    double total = 0.0;
    for (int i = 0; i < vocab; i++) total += exp(logits[i] - logits[order[0]]);
    /* The nucleus ends at the middle of the zero block: top_p halfway between its last token's cumulative
     * probability and the one before. */
    int first_zero = 0, n_zero = 0;
    while (logits[order[first_zero]] != 0.0f) first_zero++;
    while (first_zero + n_zero < vocab && logits[order[first_zero + n_zero]] == 0.0f) n_zero++;
    const int nucleus = first_zero + n_zero / 2;
    double cumulative = 0.0, before_last = 0.0;
    for (int k = 0; k < nucleus; k++) {
        before_last = cumulative;
        cumulative += exp(logits[order[k]] - logits[order[0]]) / total;
        allowed[order[k]] = true;
    }
    sampler_params p = sampler_params_default();
    p.temperature = 1.0f;
    p.top_p = (float)((before_last + cumulative) / 2);
    p.seed = 5;
    CHECK_MSG(nucleus > 600 && n_zero > 100, "nucleus %d, zero block %d", nucleus, n_zero);
    CHECK(count_draws(&p, logits, vocab, 30000, counts));
    CHECK(support_is(counts, allowed, vocab));
    free(allowed);
    free(counts);
    free(order);
    free(logits);
}

/* A row reduced the way a device producer reduces it: its `n` best finite logits (logit descending, id
 * ascending), the largest logit, the finite count and log(sum exp(logit - max)) in double. */
#define TOP_N 64
typedef struct top_row_buffers {
    float logits[TOP_N];
    int32_t ids[TOP_N];
} top_row_buffers;

static const float *reduce_logits;
static int compare_reduced(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    if (reduce_logits[x] != reduce_logits[y]) return reduce_logits[x] > reduce_logits[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static sampler_top_row reduce_row(const float *logits, int vocab, top_row_buffers *buffers, int *order) {
    int n_finite = 0;
    float max_logit = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (logits[i] != -INFINITY) {
            order[n_finite++] = i;
            if (logits[i] > max_logit) max_logit = logits[i];
        }
    reduce_logits = logits;
    qsort(order, (size_t)n_finite, sizeof *order, compare_reduced);
    const int n = n_finite < TOP_N ? n_finite : TOP_N;
    for (int i = 0; i < n; i++) {
        buffers->ids[i] = order[i];
        buffers->logits[i] = logits[order[i]];
    }
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - (double)max_logit);
    return (sampler_top_row){buffers->logits, buffers->ids, n, max_logit, n_finite, log(sum)};
}

/* sampler_sample_top gives sampler_sample's tokens, step after step (the generators stay in step), and its
 * logprobs, on rows with ties and -inf entries, whenever the candidates suffice; and refuses otherwise. */
static void test_sample_top_matches_full_row(void) {
    const int vocab = 3000;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    int *order = malloc((size_t)vocab * sizeof *order);
    top_row_buffers buffers;
    const filter_case cases[] = {
        {1.0f, 40, 1.0f, 0.0f}, {0.7f, 40, 0.9f, 0.0f}, {1.3f, 64, 0.95f, 0.05f}, {0.2f, 5, 1.0f, 0.0f},
        {3.0f, 1, 1.0f, 0.0f},  {1.0f, 64, 0.5f, 0.1f}, {50.0f, 20, 0.99f, 0.0f}, {0.0f, 0, 1.0f, 0.0f},
    };
    int compared = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sampler_params p = filter_params(&cases[c], 1000 + c);
        sampler *full = NULL, *top = NULL;
        CHECK(KITE_OK == sampler_create(&p, vocab, &full));
        CHECK(KITE_OK == sampler_create(&p, vocab, &top));
        CHECK(sampler_top_suffices(top, TOP_N));
        for (int step = 0; step < 25; step++) {
            /* a spread of logits, a block of exact ties near the top, some impossible tokens */
            for (int i = 0; i < vocab; i++) logits[i] = (float)(4.0 * test_random_unit() - 2.0);
            for (int i = 0; i < 30; i++) logits[100 + 37 * i] = 2.5f;
            for (int i = 0; i < 50; i++) logits[(int)(test_random_unit() * vocab)] = -INFINITY;
            const sampler_top_row row = reduce_row(logits, vocab, &buffers, order);
            int32_t t_full = -1, t_top = -2;
            float lp_full = 0.0f, lp_top = 0.0f;
            CHECK(KITE_OK == sampler_sample(full, logits, &t_full, &lp_full));
            CHECK(KITE_OK == sampler_sample_top(top, &row, &t_top, &lp_top));
            CHECK_MSG(t_full == t_top, "case %zu step %d: full row %d, candidates %d", c, step, t_full, t_top);
            CHECK_MSG(fabsf(lp_full - lp_top) <= 1e-5f, "case %zu step %d: logprob %g vs %g", c, step, lp_full, lp_top);
            compared++;
        }
        sampler_free(full);
        sampler_free(top);
    }
    CHECK(compared == 200);

    /* What the candidates cannot stand in for: sampling with top-k off or beyond them, an active penalty, a
     * row with fewer finite logits than top_k, candidates out of order. */
    sampler_params p = sampler_params_default();
    sampler *s = NULL;
    p.top_k = 0;
    CHECK(KITE_OK == sampler_create(&p, vocab, &s));
    CHECK(!sampler_top_suffices(s, TOP_N));
    sampler_free(s);
    p.top_k = TOP_N + 1;
    CHECK(KITE_OK == sampler_create(&p, vocab, &s));
    CHECK(!sampler_top_suffices(s, TOP_N));
    sampler_free(s);
    p.top_k = 10;
    p.temperature = 0.0f; /* greedy needs only the best candidate, whatever top_k says */
    CHECK(KITE_OK == sampler_create(&p, vocab, &s));
    CHECK(sampler_top_suffices(s, 1) && !sampler_top_suffices(s, 0));
    sampler_free(s);
    p.temperature = 1.0f;
    p.repetition_penalty = 1.3f;
    CHECK(KITE_OK == sampler_create(&p, vocab, &s));
    CHECK(sampler_top_suffices(s, TOP_N)); /* no context yet: the penalty changes nothing */
    sampler_accept(s, 7);
    CHECK(!sampler_top_suffices(s, TOP_N));
    for (int i = 0; i < vocab; i++) logits[i] = (float)(test_random_unit() - 0.5);
    sampler_top_row row = reduce_row(logits, vocab, &buffers, order);
    int32_t token = -1;
    CHECK(sampler_sample_top(s, &row, &token, NULL) == KITE_ERROR_UNSUPPORTED);
    sampler_free(s);
    p.repetition_penalty = 1.0f;
    CHECK(KITE_OK == sampler_create(&p, vocab, &s));
    for (int i = 0; i < vocab; i++) logits[i] = i < 8 ? (float)i : -INFINITY; /* 8 finite, top_k 10 */
    row = reduce_row(logits, vocab, &buffers, order);
    CHECK(sampler_sample_top(s, &row, &token, NULL) == KITE_ERROR_UNSUPPORTED);
    for (int i = 0; i < vocab; i++) logits[i] = (float)(test_random_unit() - 0.5);
    row = reduce_row(logits, vocab, &buffers, order);
    const float swapped = buffers.logits[3];
    buffers.logits[3] = buffers.logits[4];
    buffers.logits[4] = swapped;
    CHECK(sampler_sample_top(s, &row, &token, NULL) == KITE_ERROR_INVALID_INPUT);
    sampler_free(s);
    free(order);
    free(logits);
}

int main(void) {
    TEST_RUN(test_defaults_and_parameter_validation);
    TEST_RUN(test_greedy_is_argmax_lowest_id_on_ties);
    TEST_RUN(test_seeded_reproducibility);
    TEST_RUN(test_top_k_keeps_exactly_the_k_best);
    TEST_RUN(test_top_p_keeps_the_smallest_prefix);
    TEST_RUN(test_min_p_keeps_those_above_the_ratio);
    TEST_RUN(test_repetition_penalty);
    TEST_RUN(test_temperature_limits);
    TEST_RUN(test_frequencies_match_softmax);
    TEST_RUN(test_invalid_logits_rejected);
    TEST_RUN(test_top_logprobs);
    TEST_RUN(test_large_vocab_top_k_and_top_p);
    TEST_RUN(test_top_p_cut_inside_ties_of_a_large_nucleus);
    TEST_RUN(test_sample_top_matches_full_row);
    return test_finish();
}

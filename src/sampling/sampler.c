/* The sampler; the chain and its exact rules are documented in sampler.h. */
#include "sampling/sampler.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* One token still in the running. `weight` is exp((logit - max_logit) / temperature): the top token has
 * weight 1, so weights never overflow and a probability ratio to the top token is just a weight. */
typedef struct sampler_candidate {
    float logit; /* after processing (bias, min_tokens, penalties), before temperature */
    int32_t id;
    float weight;
} sampler_candidate;

/* Bins for top-p without top-k: z = (max_logit - logit) / temperature in steps of 1/16 up to the point
 * where expf underflows to 0 anyway, plus one bin for everything beyond. */
#define SAMPLER_MAX_SCALED_DISTANCE 104.0 /* expf(-104) is below the smallest float */
#define SAMPLER_BINS_PER_UNIT 16
#define SAMPLER_N_BINS (104 * SAMPLER_BINS_PER_UNIT + 1)

struct sampler {
    sampler_params params;
    int32_t vocab_size;
    uint64_t rng_state[4];          /* xoshiro256** */
    uint8_t *in_context;            /* [vocab_size]: 1 once the token was accepted (prompt or generated) */
    int32_t *context_ids;           /* the distinct accepted ids, so the penalty costs O(distinct), not O(V) */
    int32_t n_context_ids;
    int32_t *output_counts;         /* [vocab_size]: how often each token was generated */
    int32_t *output_ids;            /* the distinct generated ids */
    int32_t n_output_ids;
    int32_t n_generated;            /* tokens generated so far (min_tokens) */
    kite_logit_bias *logit_bias;    /* params.logit_bias, copied */
    int32_t *min_tokens_ids;        /* params.min_tokens_ids, copied */
    float *penalized;               /* [vocab_size] scratch: logits after processing */
    double bin_mass[SAMPLER_N_BINS];  /* scratch for top-p without top-k */
    sampler_candidate *candidates;  /* [vocab_size] scratch */
    sampler_candidate *sorted;      /* [vocab_size] scratch: the radix sort's other buffer */
};

/* ---- random numbers ---------------------------------------------------------------------------- */

/* splitmix64 spreads any seed (0, 1, 2, ...) over the whole state, as xoshiro's authors recommend:
 * xoshiro must not start from an all-zero state and nearby seeds must give unrelated streams. */
static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotate_left(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro256ss_next(uint64_t state[4]) {
    const uint64_t result = rotate_left(state[1] * 5, 7) * 9;
    const uint64_t t = state[1] << 17;
    state[2] ^= state[0];
    state[3] ^= state[1];
    state[1] ^= state[2];
    state[0] ^= state[3];
    state[2] ^= t;
    state[3] = rotate_left(state[3], 45);
    return result;
}

/* Uniform in [0, 1): the top 53 bits fill a double's mantissa exactly, so every value is equally likely
 * and 1.0 is never returned. */
static double sampler_uniform(sampler *s) {
    return (double)(xoshiro256ss_next(s->rng_state) >> 11) * 0x1.0p-53;
}

/* ---- ordering and partial selection ------------------------------------------------------------ */

/* The one order used everywhere: higher logit first, then lower id, so every cut is deterministic. */
static inline bool candidate_better(const sampler_candidate *a, const sampler_candidate *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int candidate_compare_descending(const void *a, const void *b) {
    const sampler_candidate *x = a;
    const sampler_candidate *y = b;
    if (candidate_better(x, y)) return -1;
    if (candidate_better(y, x)) return 1;
    return 0;
}

static void candidate_swap(sampler_candidate *a, sampler_candidate *b) {
    sampler_candidate t = *a;
    *a = *b;
    *b = t;
}

/* Below this many candidates a comparison sort is as fast as the radix sort's passes over 256 counters. */
#define RADIX_SORT_MIN 512

/* An unsigned key whose ascending order is descending logit: the float's bits made monotone (negatives
 * flipped whole, positives with the sign bit set), then inverted. -0 counts as +0, as the comparison does. */
static inline uint32_t descending_logit_key(float logit) {
    uint32_t bits;
    if (logit == 0.0f) logit = 0.0f;
    memcpy(&bits, &logit, sizeof bits);
    const uint32_t monotone = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
    return ~monotone;
}

/* candidates[0..n), in ascending id order, sorted best first (candidate_better) into candidates itself; `other`
 * is scratch of n. A stable LSD radix sort on the logit key, 8 bits a pass, so equal logits keep their ascending
 * ids: O(n) where a comparison sort of a flat distribution's whole nucleus (151,936 tokens) costs n log n
 * calls. A pass whose byte is the same in every key moves nothing and is skipped. */
static void sort_candidates_best_first(sampler_candidate *candidates, sampler_candidate *other, int32_t n) {
    if (n < RADIX_SORT_MIN) {
        qsort(candidates, (size_t)n, sizeof *candidates, candidate_compare_descending);
        return;
    }
    sampler_candidate *from = candidates, *to = other;
    for (int shift = 0; shift < 32; shift += 8) {
        int32_t count[256] = {0};
        for (int32_t i = 0; i < n; i++)
            count[(descending_logit_key(from[i].logit) >> shift) & 0xff]++;
        if (count[(descending_logit_key(from[0].logit) >> shift) & 0xff] == n) continue;
        int32_t start = 0;
        for (int b = 0; b < 256; b++) {
            const int32_t c = count[b];
            count[b] = start;
            start += c;
        }
        for (int32_t i = 0; i < n; i++)
            to[count[(descending_logit_key(from[i].logit) >> shift) & 0xff]++] = from[i];
        sampler_candidate *t = from;
        from = to;
        to = t;
    }
    if (from != candidates) memcpy(candidates, from, (size_t)n * sizeof *candidates);
}

/* A heap whose root is the *worst* of the kept, so a newcomer only has to beat the root. */
static void heap_sift_up(sampler_candidate *heap, int32_t i) {
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (!candidate_better(&heap[parent], &heap[i])) break;
        candidate_swap(&heap[parent], &heap[i]);
        i = parent;
    }
}

static void heap_sift_down(sampler_candidate *heap, int32_t size, int32_t i) {
    for (;;) {
        int32_t worst = i;
        int32_t left = 2 * i + 1;
        int32_t right = left + 1;
        if (left < size && candidate_better(&heap[worst], &heap[left])) worst = left;
        if (right < size && candidate_better(&heap[worst], &heap[right])) worst = right;
        if (worst == i) return;
        candidate_swap(&heap[i], &heap[worst]);
        i = worst;
    }
}

/* The k best of values[0..n) in `out`, sorted best first; returns how many (fewer when n is smaller or
 * skip_impossible drops -inf entries). O(n log k): ids arrive in ascending order, so a newcomer that
 * only ties the root has a higher id and loses, which is exactly "ties keep the lowest ids". */
static int32_t select_top_k(const float *values, int32_t n, int32_t k, bool skip_impossible,
                            sampler_candidate *out) {
    int32_t size = 0;
    for (int32_t i = 0; i < n; i++) {
        float v = values[i];
        if (skip_impossible && v == -INFINITY) continue;
        sampler_candidate c = {v, i, 0.0f};
        if (size < k) {
            out[size] = c;
            heap_sift_up(out, size);
            size++;
        } else if (v >= out[0].logit && candidate_better(&c, &out[0])) {
            out[0] = c;
            heap_sift_down(out, size, 0);
        }
    }
    qsort(out, (size_t)size, sizeof *out, candidate_compare_descending);
    return size;
}

/* ---- validation -------------------------------------------------------------------------------- */

/* Rejects NaN and +inf (no probability can be made of them); returns the largest logit and how many are
 * finite. Fails when none is: a row of -inf allows no token. */
static kite_status check_logits(const float *logits, int32_t n, float *max_out, int32_t *n_finite_out) {
    float max_logit = -INFINITY;
    int32_t n_finite = 0;
    for (int32_t i = 0; i < n; i++) {
        float v = logits[i];
        if (isnan(v) || v == INFINITY)
            return kite_fail(KITE_ERROR_INVALID_INPUT, "sampler: logits[%d] is %s (the weights or activations are not "
                             "finite): no token can be chosen", (int)i, isnan(v) ? "NaN" : "+inf");
        if (v != -INFINITY) {
            n_finite++;
            if (v > max_logit) max_logit = v;
        }
    }
    if (n_finite == 0) {
        return kite_fail(KITE_ERROR_INVALID_INPUT, "sampler: all %d logits are -inf: no token can be chosen",
                         (int)n);
    }
    *max_out = max_logit;
    *n_finite_out = n_finite;
    return KITE_OK;
}

/* log(sum_i exp(logits[i] - max_logit)): the normalizer of the raw log-softmax. */
static double log_sum_exp_shifted(const float *logits, int32_t n, float max_logit) {
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += (double)expf(logits[i] - max_logit);
    return log(sum);
}

/* ---- parameters and lifetime ------------------------------------------------------------------- */

sampler_params sampler_params_from(const kite_sampling *s) {
    sampler_params p = sampler_params_default();
    p.temperature = s->temperature;
    p.top_k = s->top_k;
    p.top_p = s->top_p;
    p.min_p = s->min_p;
    p.repetition_penalty = s->repetition_penalty;
    p.presence_penalty = s->presence_penalty;
    p.frequency_penalty = s->frequency_penalty;
    p.seed = s->seed;
    return p;
}

sampler_params sampler_params_default(void) {
    return (sampler_params){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.0f,
                            .presence_penalty = 0.0f, .frequency_penalty = 0.0f, .seed = 0, .logit_bias = NULL,
                            .n_logit_bias = 0, .min_tokens = 0, .min_tokens_ids = NULL, .n_min_tokens_ids = 0};
}

bool sampler_params_process_logits(const sampler_params *p) {
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
           p->n_logit_bias > 0 || (p->min_tokens > 0 && p->n_min_tokens_ids > 0);
}

static kite_status check_params(const sampler_params *p) {
    /* Written as !(in range) so that NaN fails too. */
    if (!(p->temperature >= 0.0f) || isinf(p->temperature)) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: temperature %g must be finite and >= 0",
                         (double)p->temperature);
    }
    if (p->top_k < 0) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: top_k %d must be >= 0 (0 = off)", (int)p->top_k);
    }
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f)) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: top_p %g must be in [0, 1] (1 = off)",
                         (double)p->top_p);
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: min_p %g must be in [0, 1] (0 = off)",
                         (double)p->min_p);
    }
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty)) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "sampler: repetition_penalty %g must be finite and > 0 (1 = off)",
                         (double)p->repetition_penalty);
    }
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f)) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: presence_penalty %g must be in [-2, 2] (0 = off)",
                         (double)p->presence_penalty);
    }
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f)) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: frequency_penalty %g must be in [-2, 2] (0 = off)",
                         (double)p->frequency_penalty);
    }
    return KITE_OK;
}

/* logit_bias and min_tokens against the vocabulary: every id in it, a bias in [-100, 100], each token once. */
static kite_status check_token_params(const sampler_params *p, int32_t vocab_size) {
    if (p->n_logit_bias < 0 || p->n_logit_bias > KITE_MAX_LOGIT_BIAS || (p->n_logit_bias > 0 && !p->logit_bias)) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: logit_bias has %d entries, at most %d",
                         (int)p->n_logit_bias, KITE_MAX_LOGIT_BIAS);
    }
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const kite_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= vocab_size) {
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                             "sampler: logit_bias[%d]: token %d is outside the vocabulary [0, %d)", (int)i,
                             (int)b->token, (int)vocab_size);
        }
        if (!(b->bias >= -100.0f && b->bias <= 100.0f)) {
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: logit_bias[%d]: bias %g of token %d must be in "
                             "[-100, 100]", (int)i, (double)b->bias, (int)b->token);
        }
        for (int32_t j = 0; j < i; j++) { /* at most KITE_MAX_LOGIT_BIAS^2 / 2 comparisons */
            if (p->logit_bias[j].token == b->token) {
                return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: logit_bias[%d] and logit_bias[%d] both give "
                                 "token %d", (int)j, (int)i, (int)b->token);
            }
        }
    }
    if (p->min_tokens < 0) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: min_tokens %d must be >= 0", (int)p->min_tokens);
    }
    if (p->n_min_tokens_ids < 0 || (p->n_min_tokens_ids > 0 && !p->min_tokens_ids)) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler: bad min_tokens ids (%d)", (int)p->n_min_tokens_ids);
    }
    for (int32_t i = 0; i < p->n_min_tokens_ids; i++) {
        if (p->min_tokens_ids[i] < 0 || p->min_tokens_ids[i] >= vocab_size) {
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                             "sampler: min_tokens id %d is outside the vocabulary [0, %d)", (int)p->min_tokens_ids[i],
                             (int)vocab_size);
        }
    }
    return KITE_OK;
}

kite_status sampler_create(const sampler_params *params, int32_t vocab_size, sampler **out) {
    if (!params || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler_create: NULL argument");
    *out = NULL;
    if (vocab_size <= 0) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler_create: vocab_size %d must be > 0", (int)vocab_size);
    }
    KITE_TRY(check_params(params));
    KITE_TRY(check_token_params(params, vocab_size));

    sampler *s = calloc(1, sizeof *s);
    if (!s) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "sampler_create: out of memory");
    size_t n = (size_t)vocab_size;
    s->params = *params;
    s->vocab_size = vocab_size;
    s->in_context = calloc(n, sizeof *s->in_context);
    s->context_ids = malloc(n * sizeof *s->context_ids);
    s->penalized = malloc(n * sizeof *s->penalized);
    s->candidates = malloc(n * sizeof *s->candidates);
    s->sorted = malloc(n * sizeof *s->sorted);
    bool ok = s->in_context && s->context_ids && s->penalized && s->candidates && s->sorted;
    /* The generated-token counts cost O(vocab_size) memory, so only a request with those penalties has them. */
    if (params->presence_penalty != 0.0f || params->frequency_penalty != 0.0f) {
        s->output_counts = calloc(n, sizeof *s->output_counts);
        s->output_ids = malloc(n * sizeof *s->output_ids);
        ok = ok && s->output_counts && s->output_ids;
    }
    if (params->n_logit_bias > 0) {
        s->logit_bias = malloc((size_t)params->n_logit_bias * sizeof *s->logit_bias);
        if (s->logit_bias)
            memcpy(s->logit_bias, params->logit_bias, (size_t)params->n_logit_bias * sizeof *s->logit_bias);
        ok = ok && s->logit_bias;
    }
    if (params->n_min_tokens_ids > 0) {
        s->min_tokens_ids = malloc((size_t)params->n_min_tokens_ids * sizeof *s->min_tokens_ids);
        if (s->min_tokens_ids)
            memcpy(s->min_tokens_ids, params->min_tokens_ids,
                   (size_t)params->n_min_tokens_ids * sizeof *s->min_tokens_ids);
        ok = ok && s->min_tokens_ids;
    }
    s->params.logit_bias = s->logit_bias; /* the caller's arrays need not outlive sampler_create */
    s->params.min_tokens_ids = s->min_tokens_ids;
    if (!ok) {
        sampler_free(s);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "sampler_create: out of memory for vocab_size %d",
                         (int)vocab_size);
    }
    uint64_t seed_state = params->seed;
    for (int i = 0; i < 4; i++) s->rng_state[i] = splitmix64_next(&seed_state);
    *out = s;
    return KITE_OK;
}

void sampler_free(sampler *s) {
    if (!s) return;
    free(s->in_context);
    free(s->context_ids);
    free(s->output_counts);
    free(s->output_ids);
    free(s->logit_bias);
    free(s->min_tokens_ids);
    free(s->penalized);
    free(s->candidates);
    free(s->sorted);
    free(s);
}

void sampler_accept_prompt(sampler *s, int32_t token) {
    if (!s || token < 0 || token >= s->vocab_size) return;
    if (s->in_context[token]) return;
    s->in_context[token] = 1;
    s->context_ids[s->n_context_ids++] = token;
}

void sampler_accept(sampler *s, int32_t token) {
    if (!s) return;
    if (s->n_generated < INT32_MAX) s->n_generated++;
    sampler_accept_prompt(s, token);
    if (!s->output_counts || token < 0 || token >= s->vocab_size) return;
    if (s->output_counts[token] == 0) s->output_ids[s->n_output_ids++] = token;
    if (s->output_counts[token] < INT32_MAX) s->output_counts[token]++;
}

/* ---- sampling ---------------------------------------------------------------------------------- */

/* A processed finite logit stays finite, so no bias or penalty changes which tokens are possible. */
static inline float clamp_finite(float v) {
    if (v > FLT_MAX) return FLT_MAX;
    if (v < -FLT_MAX) return -FLT_MAX;
    return v;
}

static bool repetition_active(const sampler *s) { return s->params.repetition_penalty != 1.0f && s->n_context_ids > 0; }

static bool occurrence_active(const sampler *s) {
    return (s->params.presence_penalty != 0.0f || s->params.frequency_penalty != 0.0f) && s->n_output_ids > 0;
}

static bool min_tokens_active(const sampler *s) {
    return s->n_generated < s->params.min_tokens && s->params.n_min_tokens_ids > 0;
}

/* Whether step 1 changes this step's logits. */
static bool processing_active(const sampler *s) {
    return s->params.n_logit_bias > 0 || min_tokens_active(s) || repetition_active(s) || occurrence_active(s);
}

/* Step 1 (sampler.h) on a copy of the row in s->penalized, touching only the tokens it concerns: O(bias entries +
 * min_tokens ids + distinct context tokens) after the copy. Returns the caller's row itself when nothing applies.
 * The order and the float operations are vLLM's: bias, the min_tokens mask, repetition, frequency, presence. */
static const float *process_logits(sampler *s, const float *logits) {
    if (!processing_active(s)) return logits;
    const sampler_params *p = &s->params;
    float *work = s->penalized;
    memcpy(work, logits, (size_t)s->vocab_size * sizeof *logits);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const int32_t id = p->logit_bias[i].token;
        if (work[id] != -INFINITY) work[id] = clamp_finite(work[id] + p->logit_bias[i].bias);
    }
    if (min_tokens_active(s))
        for (int32_t i = 0; i < p->n_min_tokens_ids; i++) work[p->min_tokens_ids[i]] = -INFINITY;
    if (repetition_active(s)) {
        const float penalty = p->repetition_penalty;
        for (int32_t j = 0; j < s->n_context_ids; j++) {
            const int32_t id = s->context_ids[j];
            const float v = work[id];
            if (v != -INFINITY) work[id] = clamp_finite(v > 0.0f ? v / penalty : v * penalty);
        }
    }
    if (occurrence_active(s)) {
        for (int32_t j = 0; j < s->n_output_ids; j++) {
            const int32_t id = s->output_ids[j];
            float v = work[id];
            if (v == -INFINITY) continue;
            v = v - p->frequency_penalty * (float)s->output_counts[id];
            v = v - p->presence_penalty;
            work[id] = clamp_finite(v);
        }
    }
    return work;
}

kite_status sampler_process_logits(sampler *s, const float *logits, float *processed) {
    if (!s || !logits || !processed)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler_process_logits: NULL argument");
    float max_logit = 0.0f;
    int32_t n_finite = 0;
    KITE_TRY(check_logits(logits, s->vocab_size, &max_logit, &n_finite));
    const float *work = process_logits(s, logits);
    if (work != processed) memcpy(processed, work, (size_t)s->vocab_size * sizeof *processed);
    return KITE_OK;
}

/* exp((logit - max_logit) / temperature) in [0, 1]. The division is in double because 1/temperature
 * overflows float for tiny temperatures, and 0 * inf would turn the top token into NaN. */
static inline float scaled_weight(float logit, float max_logit, double inverse_temperature) {
    double z = ((double)max_logit - (double)logit) * inverse_temperature;
    return z < SAMPLER_MAX_SCALED_DISTANCE ? expf((float)-z) : 0.0f;
}

/* The top-p bin of a scaled distance z >= 0 (monotone in z, so bins never reorder tokens). */
static inline int32_t scaled_distance_bin(double z) {
    return z < SAMPLER_MAX_SCALED_DISTANCE ? (int32_t)(z * SAMPLER_BINS_PER_UNIT) : SAMPLER_N_BINS - 1;
}

/* One draw among candidates[0..n) in proportion to their weights (the softmax over the kept). */
static int32_t draw_candidate(sampler *s, const sampler_candidate *candidates, int32_t n) {
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) total += candidates[i].weight;
    double target = sampler_uniform(s) * total;
    double cumulative = 0.0;
    int32_t last_positive = 0;
    for (int32_t i = 0; i < n; i++) {
        if (candidates[i].weight <= 0.0f) continue;
        cumulative += candidates[i].weight;
        last_positive = i;
        if (target < cumulative) return candidates[i].id;
    }
    /* Only reachable when rounding left the running sum a hair under total. */
    return candidates[last_positive].id;
}

/* Length of the smallest prefix of candidates[0..n) (sorted best first) whose weight reaches
 * top_p of `normalizer`; all n when rounding keeps the sum just short. */
static int32_t top_p_prefix(const sampler_candidate *candidates, int32_t n, double top_p, double normalizer) {
    double target = (top_p - SAMPLER_PROBABILITY_SLACK) * normalizer;
    double cumulative = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cumulative += candidates[i].weight;
        if (cumulative >= target) return i + 1;
    }
    return n;
}

/* top-p (then min-p) over the whole vocabulary without sorting all of it. Tokens are binned by their
 * scaled distance below the top, z = (max_logit - logit) / temperature, in bins of width 1/16 (weights
 * within a bin differ by < 7%); walking the bins from the top until their mass reaches top_p gives a
 * cut that provably contains the nucleus, because every token above the cut outranks every token below
 * it. Only the tokens above the cut (and above min-p, whose set is also a top prefix) are sorted: for a
 * real next-token distribution that is the nucleus plus at most one bin, not the 151,936 tokens. */
static int32_t top_p_without_top_k(sampler *s, const float *work, float max_logit, double inverse_temperature,
                                   float min_p_weight) {
    sampler_candidate *candidates = s->candidates;
    double *bin_mass = s->bin_mass;
    memset(bin_mass, 0, sizeof s->bin_mass);
    double normalizer = 0.0;
    int32_t n = 0;
    for (int32_t i = 0; i < s->vocab_size; i++) {
        if (work[i] == -INFINITY) continue;
        double z = ((double)max_logit - (double)work[i]) * inverse_temperature;
        int32_t bin = scaled_distance_bin(z);
        float w = z < SAMPLER_MAX_SCALED_DISTANCE ? expf((float)-z) : 0.0f;
        bin_mass[bin] += w;
        normalizer += w;
        candidates[n++] = (sampler_candidate){work[i], i, w};
    }
    double target = ((double)s->params.top_p - SAMPLER_PROBABILITY_SLACK) * normalizer;
    double cumulative = 0.0;
    int32_t cut_bin = SAMPLER_N_BINS - 1;
    for (int32_t b = 0; b < SAMPLER_N_BINS; b++) {
        cumulative += bin_mass[b];
        if (cumulative >= target) {
            cut_bin = b;
            break;
        }
    }
    /* Tokens whose bin is above the cut are the ones with z below the cut bin's upper edge. */
    int32_t n_kept = 0;
    for (int32_t j = 0; j < n; j++) {
        const sampler_candidate c = candidates[j];
        double z = ((double)max_logit - (double)c.logit) * inverse_temperature;
        int32_t bin = scaled_distance_bin(z);
        if (bin <= cut_bin && c.weight >= min_p_weight) candidates[n_kept++] = c;
    }
    sort_candidates_best_first(candidates, s->sorted, n_kept);
    return top_p_prefix(candidates, n_kept, s->params.top_p, normalizer);
}

/* Steps 5-6 on the k best (sorted best first): their weights, top-p normalized over the k, then min-p cutting
 * the sorted tail; returns how many are kept (at least one). */
static int32_t top_k_kept(const sampler_params *p, sampler_candidate *candidates, int32_t n, float max_logit,
                          double inverse_temperature, float min_p_weight) {
    double normalizer = 0.0;
    for (int32_t i = 0; i < n; i++) {
        candidates[i].weight = scaled_weight(candidates[i].logit, max_logit, inverse_temperature);
        normalizer += candidates[i].weight;
    }
    int32_t n_kept = p->top_p < 1.0f ? top_p_prefix(candidates, n, p->top_p, normalizer) : n;
    int32_t n_min_p = 1;
    while (n_min_p < n_kept && candidates[n_min_p].weight >= min_p_weight) n_min_p++;
    return n_min_p;
}

/* Weights are relative to the top token (weight 1), so a probability ratio is a weight. */
static float min_p_weight_of(const sampler_params *p) {
    return (float)((double)p->min_p * (1.0 - SAMPLER_PROBABILITY_SLACK));
}

kite_status sampler_sample(sampler *s, const float *logits, int32_t *token_out, float *logprob_out) {
    if (!s || !logits || !token_out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler_sample: NULL argument");
    const int32_t vocab_size = s->vocab_size;
    const sampler_params *p = &s->params;

    float raw_max = 0.0f;
    int32_t n_finite = 0;
    KITE_TRY(check_logits(logits, vocab_size, &raw_max, &n_finite));

    const float *work = process_logits(s, logits);
    float max_logit = -INFINITY;
    int32_t argmax = -1;
    const bool processed = work != logits;
    if (processed) n_finite = 0; /* min_tokens may have removed tokens: count again */
    for (int32_t i = 0; i < vocab_size; i++) {
        if (processed && work[i] != -INFINITY) n_finite++;
        if (work[i] > max_logit) { /* strict: the lowest id wins a tie */
            max_logit = work[i];
            argmax = i;
        }
    }
    if (argmax < 0)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "sampler: min_tokens masks every finite logit: no token can be "
                         "chosen");

    int32_t token = argmax;
    if (p->temperature > 0.0f) {
        const double inverse_temperature = 1.0 / (double)p->temperature;
        const float min_p_weight = min_p_weight_of(p);
        const bool top_p_on = p->top_p < 1.0f;
        sampler_candidate *candidates = s->candidates;
        int32_t n_kept = 0;

        if (p->top_k > 0 && p->top_k < n_finite) {
            /* top-k by partial selection; top-p normalizes over the k; min-p cuts the sorted tail. */
            int32_t n = select_top_k(work, vocab_size, p->top_k, true, candidates);
            n_kept = top_k_kept(p, candidates, n, max_logit, inverse_temperature, min_p_weight);
        } else if (top_p_on) {
            n_kept = top_p_without_top_k(s, work, max_logit, inverse_temperature, min_p_weight);
        } else {
            /* No ordering needed: keep what min-p allows (everything possible when it is off). Most
             * of a real vocabulary lies far below a min-p cut, so a logit comparison (with a margin,
             * the weight test below stays the rule) spares their expf. */
            double prefilter = -INFINITY;
            if (min_p_weight > 0.0f) {
                prefilter = (double)max_logit + (log((double)min_p_weight) - 1e-3) * (double)p->temperature;
            }
            for (int32_t i = 0; i < vocab_size; i++) {
                if (work[i] == -INFINITY || (double)work[i] < prefilter) continue;
                float w = scaled_weight(work[i], max_logit, inverse_temperature);
                if (w >= min_p_weight) candidates[n_kept++] = (sampler_candidate){work[i], i, w};
            }
        }
        token = draw_candidate(s, candidates, n_kept);
    }

    *token_out = token;
    if (logprob_out) {
        double log_normalizer = log_sum_exp_shifted(logits, vocab_size, raw_max);
        *logprob_out = (float)((double)logits[token] - (double)raw_max - log_normalizer);
    }
    return KITE_OK;
}

bool sampler_top_suffices(const sampler *s, int32_t n) {
    const sampler_params *p = &s->params;
    if (processing_active(s)) return false;
    if (p->temperature == 0.0f) return n >= 1; /* greedy: the best candidate */
    return p->top_k > 0 && p->top_k <= n;
}

bool sampler_top_row_usable(const sampler *s, const sampler_top_row *row) {
    const sampler_params *p = &s->params;
    if (!row || row->n_finite <= 0 || !sampler_top_suffices(s, row->n)) return false;
    return p->temperature == 0.0f || p->top_k < row->n_finite;
}

kite_status sampler_sample_top(sampler *s, const sampler_top_row *row, int32_t *token_out, float *logprob_out) {
    if (!s || !row || !token_out || (row->n > 0 && (!row->logits || !row->ids)))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler_sample_top: NULL argument");
    const sampler_params *p = &s->params;
    if (!sampler_top_suffices(s, row->n))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "sampler_sample_top: %d candidates cannot stand in for the row "
                         "(temperature %g, top_k %d, or its logits are processed: penalties, logit_bias, min_tokens)",
                         (int)row->n, (double)p->temperature, (int)p->top_k);
    if (row->n_finite <= 0)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "sampler: all %d logits are -inf: no token can be chosen",
                         (int)s->vocab_size);
    if (p->temperature > 0.0f && p->top_k >= row->n_finite) /* sampler_sample samples the whole row there */
        return kite_fail(KITE_ERROR_UNSUPPORTED, "sampler_sample_top: top_k %d is not below the row's %d finite logits",
                         (int)p->top_k, (int)row->n_finite);
    const int32_t k = p->temperature > 0.0f ? p->top_k : 1; /* greedy: only the best one matters */
    sampler_candidate *candidates = s->candidates;
    for (int32_t i = 0; i < k; i++) {
        candidates[i] = (sampler_candidate){row->logits[i], row->ids[i], 0.0f};
        const bool in_range = row->ids[i] >= 0 && row->ids[i] < s->vocab_size && isfinite(row->logits[i]);
        if (!in_range || (i > 0 && !candidate_better(&candidates[i - 1], &candidates[i])))
            return kite_fail(KITE_ERROR_INVALID_INPUT, "sampler_sample_top: candidate %d (id %d) is out of range or "
                             "out of order", (int)i, (int)row->ids[i]);
    }
    if (candidates[0].logit != row->max_logit)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "sampler_sample_top: the best candidate %g is not the row's largest "
                         "logit %g", (double)candidates[0].logit, (double)row->max_logit);
    int32_t token = candidates[0].id; /* greedy: the argmax, lowest id on ties; no random number drawn */
    if (p->temperature > 0.0f) {
        const int32_t n_kept =
            top_k_kept(p, candidates, k, row->max_logit, 1.0 / (double)p->temperature, min_p_weight_of(p));
        token = draw_candidate(s, candidates, n_kept);
    }
    *token_out = token;
    if (logprob_out) {
        float token_logit = row->max_logit;
        for (int32_t i = 0; i < k; i++)
            if (row->ids[i] == token) token_logit = row->logits[i];
        *logprob_out = (float)((double)token_logit - (double)row->max_logit - row->log_sum_exp);
    }
    return KITE_OK;
}

kite_status sampler_top_logprobs(const float *logits, int32_t vocab_size, int32_t k, int32_t *ids,
                                 float *logprobs) {
    if (!logits || vocab_size <= 0) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler_top_logprobs: no logits (vocab_size %d)",
                         (int)vocab_size);
    }
    if (k < 0 || k > vocab_size) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler_top_logprobs: k %d must be in [0, %d]", (int)k,
                         (int)vocab_size);
    }
    if (k > 0 && (!ids || !logprobs)) {
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "sampler_top_logprobs: NULL output for k %d", (int)k);
    }
    float max_logit = 0.0f;
    int32_t n_finite = 0;
    KITE_TRY(check_logits(logits, vocab_size, &max_logit, &n_finite));
    if (k == 0) return KITE_OK;

    sampler_candidate *best = malloc((size_t)k * sizeof *best);
    if (!best) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "sampler_top_logprobs: out of memory for k %d", (int)k);
    double log_normalizer = log_sum_exp_shifted(logits, vocab_size, max_logit);
    /* -inf entries stay in: with k beyond the finite ones the caller still gets k rows (logprob -inf). */
    int32_t n = select_top_k(logits, vocab_size, k, false, best);
    for (int32_t i = 0; i < n; i++) {
        ids[i] = best[i].id;
        logprobs[i] = (float)((double)best[i].logit - (double)max_logit - log_normalizer);
    }
    free(best);
    return KITE_OK;
}

/* The sampler: turns one row of float32 logits into the next token id.
 *
 * One `sampler` per request. It remembers the context (prompt and generated tokens, fed through
 * sampler_accept) for the repetition penalty, and owns the seeded random generator, so the same
 * parameters, seed, context and logits always give the same tokens.
 *
 * The chain, in order (vLLM's sampler: its logits processors, then its penalties, then temperature and the
 * filters):
 *   1. processing           (sampler_process_logits) in vLLM's order: logit_bias is added; while fewer than
 *                           min_tokens tokens were generated, the min_tokens ids (eos and stop ids) become -inf;
 *                           the repetition penalty: for every distinct token id in the context (prompt and
 *                           generated), a positive logit is divided by the penalty, a negative one multiplied
 *                           (zero stays zero); the frequency penalty times the token's count among the generated
 *                           tokens is subtracted, then the presence penalty once from every generated token (the
 *                           prompt does not count for these two, as in vLLM and OpenAI). -inf stays -inf; a finite
 *                           logit is kept finite (clamped to +-FLT_MAX), so only min_tokens removes tokens.
 *   2. greedy               when temperature == 0: the argmax of the penalized logits, lowest id on ties.
 *                           Nothing below runs and no random number is drawn.
 *   3. temperature          z_i = logit_i / temperature; probabilities below are softmax(z) over the
 *                           tokens still kept at that step.
 *   4. top-k                keep the k tokens with the highest logits; at the boundary, ties keep the
 *                           lowest ids. Off when top_k == 0 or top_k >= the number of finite logits.
 *   5. top-p (nucleus)      order the kept tokens by probability (descending, ties by ascending id) and
 *                           keep the smallest prefix whose cumulative probability is >= top_p; at least
 *                           one token is always kept. Off when top_p == 1.
 *   6. min-p                keep the tokens whose probability is >= min_p * the largest probability
 *                           (a ratio, so it does not matter that steps 4-5 renormalize). Off when 0.
 *   7. draw                 softmax over the kept tokens, one uniform draw from the sampler's generator.
 *
 * Comparisons against top_p and min_p allow a relative slack of SAMPLER_PROBABILITY_SLACK: logits are
 * float32, so a distribution written as exact decimals (0.5 / 0.3 / ...) arrives with ~1e-7 relative
 * error, and a cut placed exactly on such a boundary must not flip on rounding.
 *
 * Logits: -inf is allowed and means "never this token" (such tokens are never drawn). NaN or +inf
 * anywhere is KITE_ERROR_INVALID_INPUT, as is a row where every logit is -inf.
 *
 * Cost for a vocabulary of V: a validation pass and an argmax pass; greedy stops there. Top-k is a partial
 * selection, O(V log k), then expf over the k. Otherwise one pass of expf; top-p without top-k bins the
 * tokens by probability and sorts only the bins that reach top_p (the nucleus plus at most one bin), not
 * all V. logprob_out costs one more pass of expf over the raw logits.
 *
 * Thread safety: a sampler is used by one thread at a time; distinct samplers are independent.
 */
#ifndef KITE_SAMPLING_SAMPLER_H
#define KITE_SAMPLING_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "kite.h"

#define SAMPLER_PROBABILITY_SLACK 1e-6

typedef struct sampler_params {
    float temperature;        /* >= 0; 0 = greedy */
    int32_t top_k;            /* >= 0; 0 = off */
    float top_p;              /* in [0, 1]; 1 = off; 0 keeps only the most probable token */
    float min_p;              /* in [0, 1]; 0 = off */
    float repetition_penalty; /* > 0; 1 = off; > 1 discourages tokens already in the context */
    float presence_penalty;   /* in [-2, 2]; 0 = off; over the generated tokens */
    float frequency_penalty;  /* in [-2, 2]; 0 = off; over the generated tokens */
    uint64_t seed;            /* seeds the generator (splitmix64 -> xoshiro256**) */
    const kite_logit_bias *logit_bias; /* n_logit_bias entries (<= KITE_MAX_LOGIT_BIAS, each token once, bias in */
    int32_t n_logit_bias;              /* [-100, 100]); copied by sampler_create */
    int32_t min_tokens;                /* >= 0: generated tokens before min_tokens_ids may be chosen */
    const int32_t *min_tokens_ids;     /* the ids masked until then (eos and stop ids); copied by sampler_create */
    int32_t n_min_tokens_ids;
} sampler_params;

/* temperature 1, top_k 0, top_p 1, min_p 0, no penalty, bias or min_tokens, seed 0: plain softmax sampling. */
sampler_params sampler_params_default(void);

/* The same parameters as the public API spells them (kite_sampling, kite.h); bias and min_tokens off. */
sampler_params sampler_params_from(const kite_sampling *s);

/* Whether the parameters change logits before temperature (step 1 of the chain): a penalty, a bias or
 * min_tokens. A greedy request without any of them is read by the backend's argmax alone. */
bool sampler_params_process_logits(const sampler_params *p);

typedef struct sampler sampler;

/* Validates the parameters (KITE_ERROR_INVALID_ARGUMENT naming the field) and allocates the
 * per-request state: O(vocab_size) scratch so that sampling itself never allocates. */
kite_status sampler_create(const sampler_params *params, int32_t vocab_size, sampler **out);
void sampler_free(sampler *s);

/* Records one prompt token (for the repetition penalty); feed every prompt token before the first sample. */
void sampler_accept_prompt(sampler *s, int32_t token);

/* Records one generated token: for the repetition, presence and frequency penalties and min_tokens' count.
 * Ids outside [0, vocab_size) have no logit to penalize; they still count as generated. */
void sampler_accept(sampler *s, int32_t token);

/* Step 1 of the chain on logits[0..vocab_size) into processed[0..vocab_size), exactly as sampler_sample sees
 * them. NaN or +inf in logits is KITE_ERROR_INVALID_INPUT, as in sampler_sample. */
kite_status sampler_process_logits(sampler *s, const float *logits, float *processed);

/* Samples the next token from logits[0..vocab_size). Does not accept the token (call sampler_accept).
 * logprob_out (may be NULL) receives the log-softmax of the *unmodified* logits at the chosen token,
 * as vLLM reports raw logprobs, whatever penalty, temperature or filters chose it. */
kite_status sampler_sample(sampler *s, const float *logits, int32_t *token_out, float *logprob_out);

/* A row of logits reduced to its best candidates (by the device, so that only they leave it): the n highest
 * logits of the row in the sampler's order (logit descending, ties by ascending id; -inf entries left out),
 * the row's largest logit, how many of its logits are finite, and log(sum_i exp(logit_i - max_logit)) over
 * the whole row (for logprob_out). The producer has already rejected NaN and +inf (check_logits' rule). */
typedef struct sampler_top_row {
    const float *logits;
    const int32_t *ids;
    int32_t n;
    float max_logit;
    int32_t n_finite;
    double log_sum_exp;
} sampler_top_row;

/* Whether rows of n candidates carry everything sampler_sample would look at: no processing that changes this
 * step's logits (step 1: no bias, min_tokens reached, penalties off or with nothing to count yet), and greedy
 * (temperature 0, n >= 1) or 0 < top_k <= n. The backend reduces raw logits, so a processed row is sampled
 * whole. */
bool sampler_top_suffices(const sampler *s, int32_t n);

/* Whether sampler_sample_top will take this row (sufficient candidates, something finite, and greedy or
 * top_k below the row's finite count), so a caller can check every row of a step before drawing any. */
bool sampler_top_row_usable(const sampler *s, const sampler_top_row *row);

/* sampler_sample's token and generator step from a reduced row: the same token whenever sampler_top_suffices
 * and (greedy or top_k < row->n_finite; else KITE_ERROR_UNSUPPORTED: sample the full row), and the same
 * logprob up to the rounding of row->log_sum_exp. Candidates out of order or out of range are
 * KITE_ERROR_INVALID_INPUT. */
kite_status sampler_sample_top(sampler *s, const sampler_top_row *row, int32_t *token_out, float *logprob_out);

/* The k most probable tokens of the raw log-softmax of logits[0..vocab_size), for --logprobs K:
 * ids[0..k) and logprobs[0..k) in descending order, ties lowest id first. 0 <= k <= vocab_size. */
kite_status sampler_top_logprobs(const float *logits, int32_t vocab_size, int32_t k, int32_t *ids,
                                 float *logprobs);

#endif

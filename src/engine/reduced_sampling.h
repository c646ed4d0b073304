/* Sampling a step's rows from the backend's reduction of them (read_top: BACKEND_TOP_MAX candidates per row
 * leave the device instead of whole rows of logits), for the engine and `kite bench --temperature` alike.
 * Tokens and generator steps are sampler_sample's (sampler.h): a step is drawn this way only when every row's
 * sampler can take its reduction, otherwise not at all, and the caller samples whole rows. */
#ifndef KITE_ENGINE_REDUCED_SAMPLING_H
#define KITE_ENGINE_REDUCED_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "sampling/sampler.h"

/* Why a row of logits allows no token, for the message of the request it ends (KITE_FINISH_ERROR). */
#define ROW_ERROR_BYTES 240
typedef struct row_error {
    char message[ROW_ERROR_BYTES];
} row_error;

/* Writes the message (cut at ROW_ERROR_BYTES - 1 bytes, which is longer than any kite writes). */
void row_error_set(row_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Room for `capacity` reduced rows. */
typedef struct reduced_rows {
    float *logits;          /* capacity x BACKEND_TOP_MAX */
    int32_t *ids;           /* capacity x BACKEND_TOP_MAX */
    backend_row_top *stats; /* capacity */
    int32_t capacity;
} reduced_rows;

kite_status reduced_rows_alloc(reduced_rows *r, int32_t capacity);
void reduced_rows_free(reduced_rows *r);

/* Samples rows [0, n) of the backend's kept logits, row i with samplers[i] (token ids[i], logprobs[i] when
 * logprobs is not NULL), rows in parallel, when every sampler can take a reduced row (sampler_top_suffices)
 * and the backend reduced every row usably (read_top's n = -1, top_k not below the finite count are not): *sampled
 * true. Otherwise *sampled false and nothing is drawn. A row that allows no token (the reduction's bad_index: a NaN
 * or +inf; or no finite logit) gets ids[i] BACKEND_NO_TOKEN and its message in errors[i], and is not drawn from:
 * whole-row sampling would refuse it too. The check costs one comparison a row. n <= r->capacity. */
kite_status sample_reduced_rows(backend *b, sampler *const *samplers, int32_t n, reduced_rows *r, int32_t *ids,
                                float *logprobs, row_error *errors, bool *sampled);

#endif

#include "engine/reduced_sampling.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/error.h"
#include "util/parallel.h"

void row_error_set(row_error *e, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, args);
    va_end(args);
}

kite_status reduced_rows_alloc(reduced_rows *r, int32_t capacity) {
    r->logits = calloc((size_t)capacity * BACKEND_TOP_MAX, sizeof(float));
    r->ids = calloc((size_t)capacity * BACKEND_TOP_MAX, sizeof(int32_t));
    r->stats = calloc((size_t)capacity, sizeof *r->stats);
    r->capacity = capacity;
    if (r->logits && r->ids && r->stats) return KITE_OK;
    reduced_rows_free(r);
    return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "reduced sampling: out of memory for %d rows", (int)capacity);
}

void reduced_rows_free(reduced_rows *r) {
    free(r->logits);
    free(r->ids);
    free(r->stats);
    *r = (reduced_rows){0};
}

/* Row i as the backend reduced it. */
static sampler_top_row reduced_row(const reduced_rows *r, int32_t i) {
    const backend_row_top *st = &r->stats[i];
    return (sampler_top_row){r->logits + (size_t)i * BACKEND_TOP_MAX, r->ids + (size_t)i * BACKEND_TOP_MAX, st->n,
                             st->max_logit, st->n_finite, st->log_sum_exp};
}

typedef struct draw_context {
    sampler *const *samplers;
    const reduced_rows *rows;
    int32_t *ids;
    float *logprobs;
} draw_context;

static kite_status draw_row(void *context, int32_t i) {
    const draw_context *c = context;
    if (c->ids[i] == BACKEND_NO_TOKEN) return KITE_OK; /* a row that allows no token: its request ends */
    const sampler_top_row row = reduced_row(c->rows, i);
    return sampler_sample_top(c->samplers[i], &row, &c->ids[i], c->logprobs ? &c->logprobs[i] : NULL);
}

/* Whether the backend's reduction of a row says it allows no token: a NaN or +inf (bad_index), or no finite logit
 * in a row it ranked (n 0; n -1 is a row it did not rank). */
static bool row_allows_no_token(const backend_row_top *st) {
    return st->bad_index >= 0 || (st->n == 0 && st->n_finite == 0);
}

kite_status sample_reduced_rows(backend *b, sampler *const *samplers, int32_t n, reduced_rows *r, int32_t *ids,
                                float *logprobs, row_error *errors, bool *sampled) {
    *sampled = false;
    if (n > r->capacity)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "reduced sampling: %d rows, room for %d", (int)n, (int)r->capacity);
    if (!b->ops->read_top) return KITE_OK;
    for (int32_t i = 0; i < n; i++)
        if (!sampler_top_suffices(samplers[i], BACKEND_TOP_MAX)) return KITE_OK;
    KITE_TRY(b->ops->read_top(b, n, BACKEND_TOP_MAX, r->logits, r->ids, r->stats));
    for (int32_t i = 0; i < n; i++) { /* every healthy row usable, or none is drawn from */
        const sampler_top_row row = reduced_row(r, i);
        if (!row_allows_no_token(&r->stats[i]) && !sampler_top_row_usable(samplers[i], &row)) return KITE_OK;
    }
    for (int32_t i = 0; i < n; i++) {
        const backend_row_top *st = &r->stats[i];
        ids[i] = 0;
        if (!row_allows_no_token(st)) continue;
        ids[i] = BACKEND_NO_TOKEN;
        if (st->bad_index >= 0)
            row_error_set(&errors[i], "%s backend: logits[%d] is NaN or +inf (the weights or activations are not "
                          "finite): no token can be chosen", b->ops->name, (int)st->bad_index);
        else
            row_error_set(&errors[i], "%s backend: all %d logits are -inf: no token can be chosen", b->ops->name,
                          (int)b->config->vocab_size);
    }
    draw_context context = {samplers, r, ids, logprobs};
    KITE_TRY(kite_parallel_for(n, draw_row, &context));
    *sampled = true;
    return KITE_OK;
}

/* What a request's token callback received, for the engine tests: the tokens (with their top-5 ids when the
 * request asked for logprobs), the finish reason (and its message for KITE_FINISH_ERROR), the number of final
 * events (exactly one is right) and of events after the final one (none is right). Pass token_record_collect as the request's on_token and the
 * record as its user_data. */
#ifndef KITE_TESTS_TOKEN_RECORD_H
#define KITE_TESTS_TOKEN_RECORD_H

#include <stdint.h>
#include <stdio.h>

#include "kite.h"

#define TOKEN_RECORD_MAX 64 /* tokens kept; the tests ask for fewer */

typedef struct token_record {
    int32_t tokens[TOKEN_RECORD_MAX];
    int32_t top[TOKEN_RECORD_MAX][5];
    int32_t n;
    kite_finish_reason finish;
    char error[256]; /* the final event's error ("" when it had none) */
    int finals;
    int after_final;
} token_record;

static inline void token_record_collect(const kite_token_event *event, void *user_data) {
    token_record *r = (token_record *)user_data;
    if (r->finals > 0) r->after_final++;
    if (event->token >= 0 && r->n < TOKEN_RECORD_MAX) {
        r->tokens[r->n] = event->token;
        for (int k = 0; k < 5 && k < event->n_top; k++) r->top[r->n][k] = event->top_ids[k];
        r->n++;
    }
    if (event->finish != KITE_FINISH_NONE) {
        r->finish = event->finish;
        snprintf(r->error, sizeof r->error, "%s", event->error ? event->error : "");
        r->finals++;
    }
}

#endif

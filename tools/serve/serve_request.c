/* A serve_request's life: created by the loop thread, freed by its last holder (serve_request.h). */
#include "serve/serve_request.h"

#include <stdlib.h>
#include <time.h>

serve_request *serve_request_new(serve_endpoint endpoint) {
    serve_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->endpoint = endpoint;
    r->request = kite_request_default();
    r->n_choices = 1;
    r->lead = r;
    r->choices[0] = r;
    r->references = 1;
    r->start_seconds = serve_now_seconds();
    return r;
}

void serve_request_free(serve_request *r) {
    if (!r) return;
    free(r->prompt_ids);
    free(r->echo_text);
    free(r->logprobs);
    free(r->stream_logprobs);
    for (int i = 0; i < SERVE_MAX_STOP_STRINGS; i++) free(r->stop_storage[i]);
    kite_chat_prompt_free(&r->prompt);
    text_buffer_free(&r->text);
    text_buffer_free(&r->reasoning);
    text_buffer_free(&r->calls);
    text_buffer_free(&r->whole_text);
    text_buffer_free(&r->whole_reasoning);
    text_buffer_free(&r->whole_calls);
    free(r);
}

bool serve_request_make_choices(serve_request *lead, int n) {
    for (int i = 1; i < n; i++) {
        serve_request *c = serve_request_new(lead->endpoint);
        if (!c) {
            while (--i >= 1) serve_request_free(lead->choices[i]);
            lead->n_choices = 1;
            return false;
        }
        c->request = lead->request;
        if (!c->request.sampling.fresh_seed) c->request.sampling.seed += (uint64_t)i;
        c->choice = i;
        c->n_choices = n;
        c->lead = lead;
        c->n_prompt = lead->n_prompt;
        c->tokenizer = lead->tokenizer;
        c->chat_logprobs = lead->chat_logprobs;
        c->chat_top_logprobs = lead->chat_top_logprobs;
        c->stream = lead->stream;
        c->include_usage = lead->include_usage;
        c->start_seconds = lead->start_seconds;
        lead->choices[i] = c;
    }
    lead->n_choices = n;
    return true;
}

void serve_request_discard(serve_request *lead) {
    if (!lead) return;
    for (int i = 1; i < lead->n_choices; i++) serve_request_free(lead->choices[i]);
    serve_request_free(lead);
}

int32_t serve_request_generated(const serve_request *lead) {
    int32_t n = 0;
    for (int i = 0; i < lead->n_choices; i++) n += lead->choices[i]->n_generated;
    return n;
}

double serve_now_seconds(void) {
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC, &t) != 0) return 0; /* CLOCK_MONOTONIC exists on Linux: not reached */
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

size_t serve_request_prompt_tokens(const serve_request *lead) {
    size_t n = lead->n_prompt;
    for (int i = 0; i < lead->n_choices; i++) n += (size_t)lead->choices[i]->n_inserted;
    return n;
}

void serve_request_usage_json(text_buffer *b, const serve_request *r) {
    const int32_t generated = serve_request_generated(r->lead);
    const size_t prompt = serve_request_prompt_tokens(r->lead);
    text_buffer_printf(b, ",\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":%d,\"total_tokens\":%zu}",
                       prompt, generated, prompt + (size_t)generated);
}

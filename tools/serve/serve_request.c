/* A serve_request's life: created by the loop thread, freed by its last holder (serve_request.h). */
#include "serve/serve_request.h"

#include <stdlib.h>
#include <time.h>

serve_request *serve_request_new(serve_endpoint endpoint) {
    serve_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->endpoint = endpoint;
    r->request = kite_request_default();
    r->references = 1;
    r->start_seconds = serve_now_seconds();
    return r;
}

void serve_request_free(serve_request *r) {
    if (!r) return;
    free(r->prompt_ids);
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

double serve_now_seconds(void) {
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC, &t) != 0) return 0; /* CLOCK_MONOTONIC exists on Linux: not reached */
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void serve_request_usage_json(text_buffer *b, const serve_request *r) {
    text_buffer_printf(b, ",\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":%d,\"total_tokens\":%zu}",
                       r->n_prompt, r->n_generated, r->n_prompt + (size_t)r->n_generated);
}

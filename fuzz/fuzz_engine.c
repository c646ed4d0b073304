/* libFuzzer: the engine driven by random requests on the tiny dummy model (CPU backend, one thread). The input
 * chooses the engine's shape (sequences, step budget, a small KV cache) and each request: prompt, max_tokens,
 * greedy or sampled, its seed, stop ids, when it arrives and when (if) it is cancelled. Whatever the input: no
 * crash or leak, every request gets exactly one final event and none after it, the engine ends idle and every
 * KV block is back in the pool. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kite.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_REQUESTS 4
#define MAX_PROMPT 24
#define MAX_STEPS 48 /* the tiny model's lm_head is Qwen3's full vocabulary: a step costs milliseconds */

typedef struct input {
    const uint8_t *data;
    size_t size, at;
} input;

static unsigned next_byte(input *in) { return in->at < in->size ? in->data[in->at++] : 0; }

typedef struct seen {
    int finals, after_final, events;
} seen;

static void on_token(const kite_token_event *e, void *user_data) {
    seen *s = user_data;
    if (s->finals) s->after_final++;
    s->events++;
    if (e->finish != KITE_FINISH_NONE) s->finals++;
}

static kite_model *fuzz_model;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fuzz_model) {
        kite_load_params p = kite_load_params_default();
        p.backend = KITE_BACKEND_CPU;
        p.n_threads = 1;
        if (kite_model_load_dummy("tiny", 1, &p, &fuzz_model) != KITE_OK) {
            fprintf(stderr, "fuzz_engine: %s\n", kite_last_error());
            abort();
        }
    }
    input in = {data, size, 0};
    kite_engine_params ep = kite_engine_params_default();
    ep.max_sequences = 1 + (int32_t)(next_byte(&in) % 8);
    ep.max_step_tokens = 4 + (int32_t)(next_byte(&in) % 64);
    ep.kv_block_size = 4 << (next_byte(&in) % 3);
    ep.max_context = 64 + (int32_t)(next_byte(&in) % 64);
    ep.kv_cache_bytes = (size_t)(1 + next_byte(&in) % 32) * 2048; /* a few blocks: preemption and capacity */
    kite_engine *engine = NULL;
    if (kite_engine_create(fuzz_model, &ep, &engine) != KITE_OK) return 0;

    const int n_requests = 1 + (int)(next_byte(&in) % MAX_REQUESTS);
    kite_request requests[MAX_REQUESTS];
    int32_t prompts[MAX_REQUESTS][MAX_PROMPT];
    int32_t stop_ids[MAX_REQUESTS][2];
    int arrive[MAX_REQUESTS], cancel_at[MAX_REQUESTS];
    kite_request_id ids[MAX_REQUESTS];
    bool submitted[MAX_REQUESTS] = {false};
    seen seen_by[MAX_REQUESTS];
    memset(seen_by, 0, sizeof seen_by);
    for (int r = 0; r < n_requests; r++) {
        kite_request q = kite_request_default();
        const int32_t n_prompt = 1 + (int32_t)(next_byte(&in) % MAX_PROMPT);
        for (int32_t i = 0; i < n_prompt; i++) prompts[r][i] = (int32_t)((next_byte(&in) * 613u) % 151936u);
        q.prompt_ids = prompts[r];
        q.n_prompt_ids = (size_t)n_prompt;
        q.max_tokens = 1 + (int32_t)(next_byte(&in) % 6);
        const unsigned mode = next_byte(&in);
        if (mode & 1) {
            q.sampling.temperature = 0.25f + (float)(mode >> 1) / 32.0f;
            q.sampling.top_k = (int32_t)(next_byte(&in) % 50);
            q.sampling.top_p = 0.5f + (float)(next_byte(&in) % 51) / 100.0f;
            q.sampling.seed = next_byte(&in);
        }
        q.ignore_eos = (mode & 2) != 0;
        if (mode & 4) {
            stop_ids[r][0] = (int32_t)((next_byte(&in) * 977u) % 151936u);
            stop_ids[r][1] = 151645;
            q.stop_ids = stop_ids[r];
            q.n_stop_ids = 2;
        }
        q.n_logprobs = (mode & 8) ? (int32_t)(next_byte(&in) % 6) : 0;
        q.on_token = on_token;
        q.user_data = &seen_by[r];
        requests[r] = q;
        arrive[r] = (int)(next_byte(&in) % 6);
        cancel_at[r] = (mode & 16) ? (int)(next_byte(&in) % 12) : -1;
    }
    for (int step = 0; step < MAX_STEPS; step++) {
        for (int r = 0; r < n_requests; r++) {
            if (!submitted[r] && arrive[r] <= step) {
                submitted[r] = kite_engine_submit(engine, &requests[r], &ids[r]) == KITE_OK;
                if (!submitted[r]) arrive[r] = 1 << 30; /* refused: it never existed */
            }
            if (submitted[r] && cancel_at[r] == step) kite_engine_cancel(engine, ids[r]);
        }
        if (kite_engine_step(engine) != KITE_OK) break;
        bool all_in = true;
        for (int r = 0; r < n_requests; r++) all_in = all_in && (submitted[r] || arrive[r] == 1 << 30);
        if (all_in && kite_engine_idle(engine)) break;
    }
    const kite_status ran = kite_engine_run(engine);
    const kite_engine_stats stats = kite_engine_get_stats(engine);
    if (ran == KITE_OK) {
        for (int r = 0; r < n_requests; r++)
            if (submitted[r] && (seen_by[r].finals != 1 || seen_by[r].after_final != 0)) __builtin_trap();
        if (!kite_engine_idle(engine) || stats.kv_blocks_free != stats.kv_blocks_total) __builtin_trap();
    }
    kite_engine_free(engine);
    return 0;
}

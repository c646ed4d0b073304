/* Randomised continuous batching on the CPU backend (tiny-vocab1k: token ids only, no text): requests of random
 * lengths arrive at random steps, half of them sample with a temperature (each with its own seed), some are
 * cancelled, the KV cache is small enough to force preemption and the step budget small enough to chunk prompts.
 * Every request that runs to the end must produce exactly the tokens it produces alone; a cancelled one a prefix of
 * them; every block comes back; no event follows a final one. */
#include <stdint.h>
#include <string.h>

#include "kite.h"
#include "test_util.h"
#include "token_record.h"

#define N_REQUESTS 14
#define MAX_PROMPT 70
#define MAX_NEW 20
#define N_ROUNDS 16 /* scenarios per run, under the sanitizers too: one costs ~0.2 CPU s there */

static uint64_t rng_state = 20261129;
static uint32_t next_u32(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

typedef struct plan {
    int32_t prompt[MAX_PROMPT];
    int32_t n_prompt;
    int32_t max_new;
    int arrival_step;
    int cancel_step; /* -1: never */
    bool sampled;    /* temperature sampling with its own seed, else greedy */
    uint64_t seed;
} plan;

static kite_request make_request(const plan *p, token_record *o) {
    kite_request r = kite_request_default();
    r.prompt_ids = p->prompt;
    r.n_prompt_ids = (size_t)p->n_prompt;
    r.max_tokens = p->max_new;
    r.ignore_eos = true;
    if (p->sampled) {
        r.sampling.temperature = 0.9f;
        r.sampling.top_p = 0.95f;
        r.sampling.seed = p->seed;
        r.n_logprobs = 3;
    }
    r.on_token = token_record_collect;
    r.user_data = o;
    return r;
}

static void run_scenario(kite_model *m, int round) {
    const uint32_t vocab_size = (uint32_t)kite_model_get_info(m).vocab_size;
    plan plans[N_REQUESTS];
    for (int i = 0; i < N_REQUESTS; i++) {
        plan *p = &plans[i];
        p->n_prompt = 1 + (int32_t)(next_u32() % MAX_PROMPT);
        for (int k = 0; k < p->n_prompt; k++) p->prompt[k] = (int32_t)(next_u32() % vocab_size);
        p->max_new = 1 + (int32_t)(next_u32() % MAX_NEW);
        p->arrival_step = (int)(next_u32() % 30);
        p->cancel_step = next_u32() % 4 == 0 ? p->arrival_step + (int)(next_u32() % 10) : -1;
        p->sampled = next_u32() % 2 == 0; /* same seed alone and together: the same tokens */
        p->seed = next_u32();
    }
    /* Each request alone, in a roomy engine. */
    token_record solo[N_REQUESTS] = {0};
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    for (int i = 0; i < N_REQUESTS && e; i++) {
        kite_request r = make_request(&plans[i], &solo[i]);
        CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
        CHECK(kite_engine_run(e) == KITE_OK);
    }
    kite_engine_free(e);

    /* All together, under pressure. */
    kite_engine_params params = kite_engine_params_default();
    params.kv_block_size = 1 + (int32_t)(next_u32() % 8);
    /* 512 bytes per position on the CPU for tiny; room for about two of the longest requests. */
    params.kv_cache_bytes = (size_t)512 * (size_t)(2 * (MAX_PROMPT + MAX_NEW) + (int)(next_u32() % 100));
    params.max_step_tokens = 8 + (int32_t)(next_u32() % 57);
    params.max_sequences = 2 + (int32_t)(next_u32() % 6);
    token_record together[N_REQUESTS] = {0};
    kite_request_id ids[N_REQUESTS] = {0};
    kite_status s = kite_engine_create(m, &params, &e);
    CHECK_MSG(s == KITE_OK, "round %d: engine: %s", round, kite_last_error());
    if (s != KITE_OK) return;
    int32_t free_start = kite_engine_get_stats(e).kv_blocks_free;
    int submitted = 0;
    for (int step = 0; step < 100000; step++) {
        for (int i = 0; i < N_REQUESTS; i++) {
            if (plans[i].arrival_step == step) {
                kite_request r = make_request(&plans[i], &together[i]);
                CHECK(kite_engine_submit(e, &r, &ids[i]) == KITE_OK);
                submitted++;
            }
            if (plans[i].cancel_step == step && together[i].finals == 0) CHECK(kite_engine_cancel(e, ids[i]) == KITE_OK);
        }
        if (submitted == N_REQUESTS && kite_engine_idle(e)) break;
        s = kite_engine_step(e);
        CHECK_MSG(s == KITE_OK, "round %d step %d: %s", round, step, kite_last_error());
        if (s != KITE_OK) break;
    }
    CHECK(kite_engine_run(e) == KITE_OK);
    kite_engine_stats stats = kite_engine_get_stats(e);
    CHECK_MSG(stats.kv_blocks_free == free_start, "round %d: %d blocks free at start, %d at the end", round,
              free_start, stats.kv_blocks_free);
    for (int i = 0; i < N_REQUESTS; i++) {
        const token_record *a = &solo[i], *b = &together[i];
        CHECK_MSG(b->finals == 1 && b->after_final == 0, "round %d request %d: %d final events, %d after", round, i,
                  b->finals, b->after_final);
        if (b->finish == KITE_FINISH_CANCELLED) {
            CHECK(b->n <= a->n);
        } else {
            CHECK_MSG(b->finish == a->finish && b->n == a->n, "round %d request %d: finish %d/%d, %d/%d tokens", round,
                      i, b->finish, a->finish, b->n, a->n);
        }
        for (int k = 0; k < b->n && k < a->n; k++)
            CHECK_MSG(a->tokens[k] == b->tokens[k], "round %d request %d step %d: %d alone, %d together", round, i,
                      k, a->tokens[k], b->tokens[k]);
    }
    printf("  round %d: block size %d, %d blocks, step budget %d, %d sequences: %lld preemptions, %lld steps\n",
           round, params.kv_block_size, stats.kv_blocks_total, params.max_step_tokens, params.max_sequences,
           (long long)stats.preemptions, (long long)stats.steps);
    kite_engine_free(e);
}

static void test_random_scenarios(void) {
    kite_load_params p = kite_load_params_default();
    p.backend = KITE_BACKEND_CPU;
    p.n_threads = 2;
    kite_model *m = NULL;
    kite_status s = kite_model_load(KITE_TEST_DATA_DIR "/tiny-vocab1k", &p, &m);
    CHECK_MSG(s == KITE_OK, "load: %s", kite_last_error());
    if (s != KITE_OK) return;
    for (int round = 0; round < N_ROUNDS; round++) run_scenario(m, round);
    kite_model_free(m);
}

int main(void) {
    TEST_RUN(test_random_scenarios);
    return test_finish();
}

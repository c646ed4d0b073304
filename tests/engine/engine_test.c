/* The engine on the CPU backend with the tiny checkpoint: greedy tokens equal transformers' reference,
 * batch invariance under different arrival times, preemption under a tiny KV cache, cancel and the
 * free-block accounting; sampled requests read through reduced rows (read_top) equal whole-row sampling. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kite.h"
#include "test_util.h"
#include "token_record.h"
#include "util/json.h"

#define MAX_REQUESTS 8

typedef struct reference_prompt {
    int32_t ids[512];
    int32_t n_ids;
    int32_t greedy[64];
    int32_t n_greedy;
} reference_prompt;

static int load_reference(const char *path, reference_prompt *out, int max) {
    size_t length;
    char *text = test_read_file(path, &length);
    if (!text) return 0;
    json_document *d = json_parse(text, length, NULL);
    free(text);
    if (!d) return 0;
    const json_value *results = json_object_member(json_root(d), "results");
    int n = 0;
    for (size_t i = 0; results && i < results->length && n < max; i++) {
        const json_value *ids = json_object_member(&results->as.items[i], "prompt_ids");
        const json_value *greedy = json_object_member(&results->as.items[i], "greedy");
        reference_prompt *p = &out[n++];
        p->n_ids = p->n_greedy = 0;
        for (size_t k = 0; k < ids->length && k < 512; k++) {
            int64_t v = 0;
            json_get_int64(&ids->as.items[k], &v);
            p->ids[p->n_ids++] = (int32_t)v;
        }
        for (size_t k = 0; k < greedy->length && k < 64; k++) {
            int64_t v = 0;
            json_get_int64(&greedy->as.items[k], &v);
            p->greedy[p->n_greedy++] = (int32_t)v;
        }
    }
    json_free(d);
    return n;
}

static kite_model *load_tiny(void) {
    kite_load_params p = kite_load_params_default();
    p.backend = KITE_BACKEND_CPU;
    p.n_threads = 2;
    kite_model *m = NULL;
    kite_status s = kite_model_load(KITE_TEST_DATA_DIR "/tiny", &p, &m);
    CHECK_MSG(s == KITE_OK, "load: %s", kite_last_error());
    return m;
}

static kite_request greedy_request(const reference_prompt *p, int32_t max_tokens, token_record *c) {
    kite_request r = kite_request_default();
    r.prompt_ids = p->ids;
    r.n_prompt_ids = (size_t)p->n_ids;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.on_token = token_record_collect;
    r.user_data = c;
    return r;
}

static reference_prompt prompts[8];
static int n_prompts;

/* Alone, each prompt's greedy tokens equal transformers'. */
static void test_greedy_matches_reference(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    for (int i = 0; i < n_prompts; i++) {
        token_record c = {0};
        kite_request r = greedy_request(&prompts[i], prompts[i].n_greedy, &c);
        CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
        CHECK(kite_engine_run(e) == KITE_OK);
        CHECK(c.finish == KITE_FINISH_LENGTH);
        CHECK_MSG(c.n == prompts[i].n_greedy, "prompt %d: %d tokens", i, c.n);
        for (int k = 0; k < c.n && k < prompts[i].n_greedy; k++)
            CHECK_MSG(c.tokens[k] == prompts[i].greedy[k], "prompt %d step %d: %d vs reference %d", i, k, c.tokens[k],
                      prompts[i].greedy[k]);
    }
    kite_engine_free(e);
    kite_model_free(m);
}

/* Runs all prompts with staggered arrivals (one more joins every `stagger` steps) under the given
 * engine parameters; returns the engine's preemption count. */
static int64_t run_staggered(kite_engine_params params, int stagger, token_record *out, int32_t max_tokens,
                             int32_t *blocks_before, int32_t *blocks_after) {
    kite_model *m = load_tiny();
    if (!m) return -1;
    kite_engine *e = NULL;
    kite_status s = kite_engine_create(m, &params, &e);
    CHECK_MSG(s == KITE_OK, "engine: %s", kite_last_error());
    if (s != KITE_OK) {
        kite_model_free(m);
        return -1;
    }
    *blocks_before = kite_engine_get_stats(e).kv_blocks_free;
    int submitted = 0, step = 0;
    while (submitted < n_prompts || !kite_engine_idle(e)) {
        if (submitted < n_prompts && step % stagger == 0) {
            kite_request r = greedy_request(&prompts[submitted], max_tokens, &out[submitted]);
            CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
            submitted++;
        }
        s = kite_engine_step(e);
        CHECK_MSG(s == KITE_OK, "step: %s", kite_last_error());
        if (s != KITE_OK) break;
        step++;
    }
    CHECK(kite_engine_run(e) == KITE_OK);
    int64_t preemptions = kite_engine_get_stats(e).preemptions;
    *blocks_after = kite_engine_get_stats(e).kv_blocks_free;
    kite_engine_free(e);
    kite_model_free(m);
    return preemptions;
}

static void check_same_tokens(const token_record *a, int32_t max_tokens) {
    for (int i = 0; i < n_prompts; i++) {
        CHECK_MSG(a[i].n == max_tokens, "prompt %d: %d tokens", i, a[i].n);
        for (int k = 0; k < a[i].n && k < prompts[i].n_greedy; k++)
            CHECK_MSG(a[i].tokens[k] == prompts[i].greedy[k], "prompt %d step %d: %d vs %d", i, k, a[i].tokens[k],
                      prompts[i].greedy[k]);
        CHECK(a[i].after_final == 0);
    }
}

/* In a batch with different prompt lengths and arrival times, every request gets its solo tokens,
 * and all blocks come back. Chunked prefill (a small step budget) must not change anything. */
static void test_batch_invariance(void) {
    kite_engine_params params = kite_engine_params_default();
    params.max_step_tokens = 40; /* the 143-token prompt is read in chunks, mixed with decode */
    token_record c[MAX_REQUESTS] = {0};
    int32_t before = 0, after = 0;
    run_staggered(params, 3, c, 32, &before, &after);
    check_same_tokens(c, 32);
    CHECK_MSG(before == after, "free blocks %d before, %d after", before, after);
}

/* A KV cache too small for all requests at once forces preemption; tokens stay the same. */
static void test_preemption(void) {
    kite_engine_params params = kite_engine_params_default();
    params.kv_block_size = 4;
    /* tiny: 2 layers x 1 kv head x 32 dims x K,V x 4 bytes = 512 bytes per position on the CPU. */
    params.kv_cache_bytes = 512 * 4 * 60; /* 60 blocks = 240 positions for 5 requests needing ~330 */
    token_record c[MAX_REQUESTS] = {0};
    int32_t before = 0, after = 0;
    int64_t preemptions = run_staggered(params, 1, c, 32, &before, &after);
    CHECK_MSG(preemptions > 0, "expected preemptions, got %lld", (long long)preemptions);
    check_same_tokens(c, 32);
    CHECK_MSG(before == after, "free blocks %d before, %d after", before, after);
}

/* A prompt that leaves no room for a generated token (length + 1 past the context limit) is refused by
 * kite_engine_submit before any work, with a message naming its length, the limit and how to raise it; one of
 * exactly the limit minus one is served and gets its one token. */
static void test_prompt_past_the_context_limit(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    kite_engine_params params = kite_engine_params_default();
    params.max_context = 100;
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, &params, &e) == KITE_OK);
    CHECK(kite_engine_get_stats(e).max_context == 100);
    token_record c = {0};
    kite_request r = greedy_request(&prompts[n_prompts - 1], 8, &c); /* 143 tokens > 100 */
    kite_request_id id = -1;
    CHECK(kite_engine_submit(e, &r, &id) == KITE_ERROR_CAPACITY && id == 0);
    const char *message = kite_last_error();
    CHECK_MSG(strstr(message, "the prompt has 143 tokens but the context limit is 100") &&
                  strstr(message, "at most 99") && strstr(message, "--max-context") &&
                  strstr(message, "up to the model's 4096") && strstr(message, "--rope-scaling"),
              "%s", message);
    CHECK(kite_engine_idle(e) && c.n == 0 && c.finals == 0);
    r.n_prompt_ids = 100; /* fills the limit: no position is left for a token */
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_ERROR_CAPACITY && strstr(kite_last_error(), "has 100 tokens"));
    r.n_prompt_ids = 99; /* the limit minus one: one token, then the context is full */
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
    CHECK(kite_engine_run(e) == KITE_OK);
    CHECK_MSG(c.n == 1 && c.finish == KITE_FINISH_LENGTH && c.finals == 1, "%d tokens, finish %d", c.n, c.finish);
    kite_engine_free(e);
    /* an engine may lower the model's limit, not raise it */
    params.max_context = 4097;
    CHECK(kite_engine_create(m, &params, &e) == KITE_ERROR_INVALID_ARGUMENT && e == NULL);
    CHECK_MSG(strstr(kite_last_error(), "max_context 4097 is above the model's context limit 4096"), "%s",
              kite_last_error());
    kite_model_free(m);
}

/* kite_load_params.max_context lowers the model's context limit (the message then offers raising it back);
 * above the config's limit it is refused when the model loads. */
static void test_load_max_context(void) {
    kite_load_params p = kite_load_params_default();
    p.backend = KITE_BACKEND_CPU;
    p.n_threads = 2;
    p.max_context = 64;
    kite_model *m = NULL;
    CHECK_MSG(kite_model_load(KITE_TEST_DATA_DIR "/tiny", &p, &m) == KITE_OK, "%s", kite_last_error());
    if (!m) return;
    CHECK(kite_model_get_info(m).max_context == 64);
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    CHECK(kite_engine_get_stats(e).max_context == 64);
    token_record c = {0};
    kite_request r = greedy_request(&prompts[n_prompts - 1], 8, &c);
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_ERROR_CAPACITY);
    CHECK_MSG(strstr(kite_last_error(), "context limit is 64") && strstr(kite_last_error(), "up to the model's 4096"),
              "%s", kite_last_error());
    kite_engine_free(e);
    kite_model_free(m);
    p.max_context = 4097;
    CHECK(kite_model_load(KITE_TEST_DATA_DIR "/tiny", &p, &m) == KITE_ERROR_INVALID_ARGUMENT && m == NULL);
    CHECK_MSG(strstr(kite_last_error(), "max_context (--max-context) 4097 is above the model's context limit 4096"),
              "%s", kite_last_error());
    p.max_context = -1;
    CHECK(kite_model_load(KITE_TEST_DATA_DIR "/tiny", &p, &m) == KITE_ERROR_INVALID_ARGUMENT && m == NULL);
}

/* A KV budget larger than the memory that is to hold it (SIZE_MAX is what a negative size wraps to) is refused
 * by a comparison before the free list is built: it used to build a list of a billion ids (4 GB) first. */
static void test_kv_budget_beyond_memory(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    const size_t budgets[] = {SIZE_MAX, (size_t)1 << 50};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        kite_engine_params params = kite_engine_params_default();
        params.kv_cache_bytes = budgets[i];
        kite_engine *e = NULL;
        struct timespec start, end;
        clock_gettime(CLOCK_MONOTONIC, &start);
        kite_status s = kite_engine_create(m, &params, &e);
        clock_gettime(CLOCK_MONOTONIC, &end);
        double seconds = (double)(end.tv_sec - start.tv_sec) + (double)(end.tv_nsec - start.tv_nsec) * 1e-9;
        CHECK_MSG(s == KITE_ERROR_CAPACITY && e == NULL && strstr(kite_last_error(), "kv_cache_bytes") &&
                      strstr(kite_last_error(), "host memory"),
                  "budget %zu: status %d: %s", budgets[i], s, kite_last_error());
        CHECK_MSG(seconds < 0.5, "budget %zu took %.2f s to refuse", budgets[i], seconds);
    }
    /* The model is not left attached: a budget that fits makes an engine. */
    kite_engine_params params = kite_engine_params_default();
    params.kv_cache_bytes = (size_t)1 << 20;
    kite_engine *e = NULL;
    CHECK_MSG(kite_engine_create(m, &params, &e) == KITE_OK, "%s", kite_last_error());
    kite_engine_free(e);
    kite_model_free(m);
}

/* A request whose context outgrows the whole KV cache ends with KITE_FINISH_CAPACITY, keeping the tokens it
 * produced (which match the reference), and the engine goes on serving. */
static void test_outgrowing_the_cache(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    kite_engine_params params = kite_engine_params_default();
    params.kv_block_size = 4;
    params.kv_cache_bytes = 512 * 4 * 5; /* 5 blocks = 20 positions */
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, &params, &e) == KITE_OK);
    token_record c = {0};
    kite_request r = greedy_request(&prompts[0], 32, &c); /* 5 prompt tokens + 32 would need 37 positions */
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
    kite_status s = kite_engine_run(e);
    CHECK_MSG(s == KITE_OK, "%s", kite_last_error());
    CHECK_MSG(c.finish == KITE_FINISH_CAPACITY, "finish %d", c.finish);
    CHECK_MSG(c.n >= 15 && c.n < 32, "%d tokens", c.n);
    for (int k = 0; k < c.n; k++) CHECK(c.tokens[k] == prompts[0].greedy[k]);
    CHECK(kite_engine_get_stats(e).kv_blocks_free == 5);
    token_record d = {0};
    kite_request small = greedy_request(&prompts[1], 8, &d);
    CHECK(kite_engine_submit(e, &small, NULL) == KITE_OK);
    CHECK(kite_engine_run(e) == KITE_OK);
    CHECK(d.finish == KITE_FINISH_LENGTH && d.n == 8);
    kite_engine_free(e);
    kite_model_free(m);
}

/* A context that outgrows the whole cache while the step budget reads it back in chunks after a preemption:
 * each chunk used to preempt the request itself, forever (found by fuzz/fuzz_engine). It ends with capacity,
 * with the tokens that fit, and the engine goes on. */
static void test_outgrowing_the_cache_in_chunks(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    kite_engine_params params = kite_engine_params_default();
    params.kv_block_size = 8;
    params.kv_cache_bytes = 512 * 8; /* one block: 8 positions */
    params.max_step_tokens = 6;
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, &params, &e) == KITE_OK);
    const int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
    token_record c = {0};
    kite_request r = kite_request_default();
    r.prompt_ids = prompt;
    r.n_prompt_ids = 6;
    r.max_tokens = 5;
    r.ignore_eos = true;
    r.on_token = token_record_collect;
    r.user_data = &c;
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
    for (int step = 0; step < 200 && !kite_engine_idle(e); step++) CHECK(kite_engine_step(e) == KITE_OK);
    CHECK_MSG(kite_engine_idle(e), "still running after 200 steps");
    CHECK_MSG(c.finish == KITE_FINISH_CAPACITY && c.finals == 1 && c.n >= 2 && c.n <= 3, "finish %d after %d tokens",
              c.finish, c.n);
    CHECK(kite_engine_get_stats(e).kv_blocks_free == 1);
    kite_engine_free(e);
    kite_model_free(m);
}

/* While a long prompt is read in chunks, a request that is already generating gets a token every step. */
static void test_long_prompt_does_not_stall_decoding(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    kite_engine_params params = kite_engine_params_default();
    params.max_sequences = 4;    /* the step budget is at least max_sequences tokens */
    params.max_step_tokens = 32; /* the 143-token prompt takes 5 steps */
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, &params, &e) == KITE_OK);
    token_record a = {0}, b = {0};
    kite_request ra = greedy_request(&prompts[0], 30, &a), rb = greedy_request(&prompts[4], 4, &b);
    CHECK(kite_engine_submit(e, &ra, NULL) == KITE_OK);
    CHECK(kite_engine_step(e) == KITE_OK); /* a's prompt; a is decoding from now on */
    CHECK(kite_engine_submit(e, &rb, NULL) == KITE_OK);
    for (int step = 0; step < 6; step++) {
        int32_t before = a.n;
        CHECK(kite_engine_step(e) == KITE_OK);
        CHECK_MSG(a.n == before + 1, "step %d: the decoding request got %d tokens", step, a.n - before);
    }
    CHECK(kite_engine_run(e) == KITE_OK);
    CHECK(a.n == 30 && b.n == 4);
    for (int k = 0; k < a.n; k++) CHECK(a.tokens[k] == prompts[0].greedy[k]);
    for (int k = 0; k < b.n; k++) CHECK(b.tokens[k] == prompts[4].greedy[k]);
    /* The timings split the steps: b's chunks ran beside a's decoding rows; each prompt's last chunk made its
     * first token, every other token came from a decode row. */
    const kite_engine_timings t = kite_engine_get_timings(e);
    CHECK(t.prefill_steps + t.decode_steps == kite_engine_get_stats(e).steps);
    CHECK(t.prefill_tokens == prompts[0].n_ids + prompts[4].n_ids);
    CHECK_MSG(t.prefill_steps >= 6 && t.prefill_step_generated >= 5, "%lld steps read prompts, %lld tokens beside",
              (long long)t.prefill_steps, (long long)t.prefill_step_generated);
    CHECK(t.prefill_step_generated + t.decode_tokens + 2 == a.n + b.n);
    kite_engine_free(e);
    kite_model_free(m);
}

/* Cancel frees the request's blocks at once and reports KITE_FINISH_CANCELLED. */
static void test_cancel(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    int32_t free_start = kite_engine_get_stats(e).kv_blocks_free;
    token_record a = {0}, b = {0};
    kite_request ra = greedy_request(&prompts[0], 32, &a), rb = greedy_request(&prompts[4], 32, &b);
    kite_request_id ida = 0, idb = 0;
    CHECK(kite_engine_submit(e, &ra, &ida) == KITE_OK);
    CHECK(kite_engine_submit(e, &rb, &idb) == KITE_OK);
    for (int i = 0; i < 3; i++) CHECK(kite_engine_step(e) == KITE_OK);
    int32_t free_mid = kite_engine_get_stats(e).kv_blocks_free;
    CHECK(kite_engine_cancel(e, idb) == KITE_OK);
    CHECK(b.finish == KITE_FINISH_CANCELLED);
    CHECK(kite_engine_get_stats(e).kv_blocks_free > free_mid);
    CHECK(kite_engine_run(e) == KITE_OK);
    CHECK(a.finish == KITE_FINISH_LENGTH && a.n == 32);
    for (int k = 0; k < a.n; k++) CHECK(a.tokens[k] == prompts[0].greedy[k]);
    CHECK(kite_engine_get_stats(e).kv_blocks_free == free_start);
    CHECK(kite_engine_cancel(e, 12345) != KITE_OK);
    kite_engine_free(e);
    kite_model_free(m);
}

/* A callback that calls into its own engine (step, run, submit, cancel) is refused with a message, and the
 * request it belongs to goes on to the reference tokens: the call cannot change the step in progress. */
typedef struct reentering {
    kite_engine *engine;
    kite_request_id other;
    token_record record;
    int refused, calls;
    bool named;
} reentering;

static void reentering_collect(const kite_token_event *event, void *user_data) {
    reentering *r = (reentering *)user_data;
    token_record_collect(event, &r->record);
    kite_request again = kite_request_default();
    int32_t id = 1;
    again.prompt_ids = &id;
    again.n_prompt_ids = 1;
    kite_status statuses[4] = {kite_engine_step(r->engine), kite_engine_run(r->engine),
                               kite_engine_submit(r->engine, &again, NULL), kite_engine_cancel(r->engine, r->other)};
    for (int i = 0; i < 4; i++) {
        r->calls++;
        r->refused += statuses[i] == KITE_ERROR_INVALID_ARGUMENT;
    }
    r->named = strstr(kite_last_error(), "kite_engine_cancel: the engine is inside another call") != NULL;
}

static void test_a_callback_cannot_reenter_its_engine(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    reentering r = {.engine = e};
    token_record other = {0};
    kite_request ra = greedy_request(&prompts[0], 8, NULL), rb = greedy_request(&prompts[1], 8, &other);
    ra.on_token = reentering_collect;
    ra.user_data = &r;
    CHECK(kite_engine_submit(e, &rb, &r.other) == KITE_OK);
    CHECK(kite_engine_submit(e, &ra, NULL) == KITE_OK);
    CHECK_MSG(kite_engine_run(e) == KITE_OK, "%s", kite_last_error());
    CHECK(r.calls > 0 && r.refused == r.calls && r.named);
    CHECK(r.record.finish == KITE_FINISH_LENGTH && r.record.n == 8 && other.finish == KITE_FINISH_LENGTH);
    for (int k = 0; k < r.record.n; k++) CHECK(r.record.tokens[k] == prompts[0].greedy[k]);
    for (int k = 0; k < other.n; k++) CHECK(other.tokens[k] == prompts[1].greedy[k]);
    CHECK(kite_engine_step(NULL) == KITE_ERROR_INVALID_ARGUMENT);
    kite_engine_free(e);
    kite_model_free(m);
}

/* Tokens and logprobs a sampled request received. */
typedef struct sampled_record {
    int32_t tokens[32];
    float logprobs[32];
    int32_t n;
} sampled_record;

static void sampled_collect(const kite_token_event *event, void *user_data) {
    sampled_record *r = (sampled_record *)user_data;
    if (event->token >= 0 && r->n < 32) {
        r->tokens[r->n] = event->token;
        r->logprobs[r->n] = event->logprob;
        r->n++;
    }
}

/* Runs four prompts together with mixed sampling (top-k, top-k + top-p + min-p, greedy, and a last request
 * that is either top-k too or, with `penalty`, one whose repetition penalty needs whole rows); the engine reads
 * reduced rows (the backend's read_top) unless KITE_ENGINE_REDUCED_SAMPLING=0. */
static void run_sampled(bool reduced, bool penalty, sampled_record *out) {
    if (reduced) unsetenv("KITE_ENGINE_REDUCED_SAMPLING");
    else setenv("KITE_ENGINE_REDUCED_SAMPLING", "0", 1);
    kite_model *m = load_tiny();
    if (!m) return;
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    const kite_sampling modes[4] = {
        {0.8f, 20, 1.0f, 0.0f, 1.0f, 11, false, 0.0f, 0.0f},
        {1.2f, 40, 0.9f, 0.05f, 1.0f, 12, false, 0.0f, 0.0f},
        {0.0f, 0, 1.0f, 0.0f, 1.0f, 13, false, 0.0f, 0.0f},
        {0.7f, 5, 1.0f, 0.0f, penalty ? 1.3f : 1.0f, 14, false, 0.0f, 0.0f},
    };
    for (int i = 0; i < 4 && i < n_prompts; i++) {
        kite_request r = kite_request_default();
        r.prompt_ids = prompts[i].ids;
        r.n_prompt_ids = (size_t)prompts[i].n_ids;
        r.max_tokens = 24;
        r.ignore_eos = true;
        r.sampling = modes[i];
        r.on_token = sampled_collect;
        r.user_data = &out[i];
        CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
    }
    CHECK(kite_engine_run(e) == KITE_OK);
    kite_engine_free(e);
    kite_model_free(m);
    unsetenv("KITE_ENGINE_REDUCED_SAMPLING");
}

/* Sampling from the backend's reduced rows gives the tokens (and logprobs, to rounding) of whole rows, with
 * every request's own generator, whether the step can be reduced or (a penalty) must fall back. */
static void test_reduced_sampling_matches_full_rows(void) {
    for (int penalty = 0; penalty < 2; penalty++) {
        sampled_record full[4] = {0}, reduced[4] = {0};
        run_sampled(false, penalty, full);
        run_sampled(true, penalty, reduced);
        for (int i = 0; i < 4 && i < n_prompts; i++) {
            CHECK_MSG(full[i].n == 24 && reduced[i].n == 24, "request %d: %d / %d tokens", i, full[i].n, reduced[i].n);
            for (int k = 0; k < full[i].n && k < reduced[i].n; k++) {
                CHECK_MSG(full[i].tokens[k] == reduced[i].tokens[k], "penalty %d request %d step %d: %d vs %d", penalty,
                          i, k, full[i].tokens[k], reduced[i].tokens[k]);
                CHECK_MSG(fabsf(full[i].logprobs[k] - reduced[i].logprobs[k]) <= 1e-4f,
                          "penalty %d request %d step %d: logprob %g vs %g", penalty, i, k, full[i].logprobs[k],
                          reduced[i].logprobs[k]);
            }
        }
    }
}

/* Runs two requests together to the end on a fresh engine of m, with the overlapped decode on or off
 * (KITE_ENGINE_OVERLAP, read when the engine is created); returns the engine's stats at the end. */
static kite_engine_stats run_two(kite_model *m, bool overlap, const kite_request *ra, const kite_request *rb) {
    kite_engine_stats st = {0};
    if (!overlap) setenv("KITE_ENGINE_OVERLAP", "0", 1);
    kite_engine *e = NULL;
    kite_status s = kite_engine_create(m, NULL, &e);
    unsetenv("KITE_ENGINE_OVERLAP");
    CHECK_MSG(s == KITE_OK, "engine: %s", kite_last_error());
    if (s != KITE_OK) return st;
    CHECK(kite_engine_submit(e, ra, NULL) == KITE_OK);
    CHECK(kite_engine_submit(e, rb, NULL) == KITE_OK);
    CHECK(kite_engine_run(e) == KITE_OK);
    st = kite_engine_get_stats(e);
    kite_engine_free(e);
    return st;
}

/* Overlapped greedy decode (engine.c): with it on, steps run ahead and every token is still the reference's;
 * with KITE_ENGINE_OVERLAP=0 none does. The rest of this file runs with it on, and the runs that matter most
 * run again with it off (main). */
static void test_overlap_runs_ahead(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    for (int off = 0; off < 2; off++) {
        token_record a = {0}, b = {0};
        kite_request ra = greedy_request(&prompts[0], 24, &a), rb = greedy_request(&prompts[1], 12, &b);
        const kite_engine_stats st = run_two(m, !off, &ra, &rb);
        CHECK(a.n == 24 && b.n == 12 && a.finals == 1 && b.finals == 1 && a.after_final == 0 && b.after_final == 0);
        for (int k = 0; k < a.n; k++) CHECK(a.tokens[k] == prompts[0].greedy[k]);
        for (int k = 0; k < b.n; k++) CHECK(b.tokens[k] == prompts[1].greedy[k]);
        /* On: from the first decode step on, every step but the ones before each length limit runs ahead. */
        if (off) CHECK_MSG(st.steps_ahead == 0, "%lld steps ahead with the overlap off", (long long)st.steps_ahead);
        else CHECK_MSG(st.steps_ahead >= 18, "%lld steps ahead of %lld", (long long)st.steps_ahead, (long long)st.steps);
        CHECK(st.kv_blocks_free == st.kv_blocks_total);
    }
    kite_model_free(m);
}

/* A request that ends by a stop string while the next step already runs ahead: its tokens stop there (the
 * step in flight's token is dropped), the other request keeps the reference's tokens, every block comes back;
 * the same with the overlap off. The stop string is the text of the reference's first 10 tokens. */
static void test_stop_while_running_ahead(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    char *stop = NULL;
    size_t stop_length = 0;
    CHECK(kite_detokenize(m, prompts[2].greedy, 10, &stop, &stop_length) == KITE_OK);
    for (int off = 0; off < 2; off++) {
        token_record a = {0}, b = {0};
        kite_request ra = greedy_request(&prompts[0], 24, &a), rb = greedy_request(&prompts[2], 24, &b);
        const char *stops[1] = {stop};
        rb.stop_strings = stops;
        rb.n_stop_strings = stop && stop_length > 0 ? 1 : 0;
        const kite_engine_stats st = run_two(m, !off, &ra, &rb);
        CHECK(a.n == 24 && a.finish == KITE_FINISH_LENGTH);
        for (int k = 0; k < a.n; k++) CHECK(a.tokens[k] == prompts[0].greedy[k]);
        CHECK_MSG(b.finish == KITE_FINISH_STOP && b.n >= 1 && b.n <= 10, "off %d: finish %d after %d tokens", off,
                  b.finish, b.n);
        for (int k = 0; k < b.n; k++) CHECK(b.tokens[k] == prompts[2].greedy[k]);
        CHECK(b.finals == 1 && b.after_final == 0);
        CHECK(st.kv_blocks_free == st.kv_blocks_total);
        if (!off) CHECK(st.steps_ahead > 0);
    }
    kite_free(stop);
    kite_model_free(m);
}

/* A request's stop ids end it like eos, ignore_eos or not, at the first of them it generates (the token is
 * reported with the final event); ids outside the vocabulary, or too many, are refused. */
static void test_stop_ids(void) {
    kite_model *m = load_tiny();
    if (!m) return;
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    const reference_prompt *p = &prompts[1];
    int first = 5; /* the stop id is the reference's 6th token: the request ends at its first occurrence */
    for (int k = 0; k < first; k++)
        if (p->greedy[k] == p->greedy[first]) first = k;
    const int32_t stop_ids[2] = {p->greedy[5], 151644};
    token_record c = {0};
    kite_request r = greedy_request(p, 20, &c);
    r.stop_ids = stop_ids;
    r.n_stop_ids = 2;
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
    CHECK(kite_engine_run(e) == KITE_OK);
    CHECK_MSG(c.finish == KITE_FINISH_STOP && c.n == first + 1, "finish %d after %d tokens (expected %d)", c.finish,
              c.n, first + 1);
    for (int k = 0; k < c.n; k++) CHECK(c.tokens[k] == p->greedy[k]);
    const int32_t outside[1] = {1 << 30};
    r.stop_ids = outside;
    r.n_stop_ids = 1;
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    r.n_stop_ids = KITE_MAX_STOP_IDS + 1;
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    kite_engine_free(e);
    kite_model_free(m);
}

/* The engine tests that schedule most (staggered arrivals, preemption, cancel) with the overlap off. */
static void test_without_overlap(void) {
    setenv("KITE_ENGINE_OVERLAP", "0", 1);
    test_batch_invariance();
    test_preemption();
    test_cancel();
    unsetenv("KITE_ENGINE_OVERLAP");
}

int main(void) {
    n_prompts = load_reference(KITE_TEST_DATA_DIR "/tiny.reference.json", prompts, 8);
    if (n_prompts < 3) {
        printf("cannot read tests/data/tiny.reference.json\n");
        return 1;
    }
    TEST_RUN(test_greedy_matches_reference);
    TEST_RUN(test_batch_invariance);
    TEST_RUN(test_preemption);
    TEST_RUN(test_prompt_past_the_context_limit);
    TEST_RUN(test_load_max_context);
    TEST_RUN(test_cancel);
    TEST_RUN(test_a_callback_cannot_reenter_its_engine);
    TEST_RUN(test_outgrowing_the_cache);
    TEST_RUN(test_outgrowing_the_cache_in_chunks);
    TEST_RUN(test_long_prompt_does_not_stall_decoding);
    TEST_RUN(test_reduced_sampling_matches_full_rows);
    TEST_RUN(test_overlap_runs_ahead);
    TEST_RUN(test_stop_while_running_ahead);
    TEST_RUN(test_stop_ids);
    TEST_RUN(test_without_overlap);
    TEST_RUN(test_kv_budget_beyond_memory);
    return test_finish();
}

/* Automatic prefix caching in the engine on the CPU backend with tiny-vocab1k (token ids only): the same requests
 * give the same tokens with the cache and without it, each equal to the request run alone (a cancelled one: a
 * prefix of it), for a shared system prompt with different suffixes, identical prompts, a prompt that is an exact
 * multiple of the block size, chunked prefill, preemption under a small KV pool, cancellation mid-prefill and
 * mid-decode, and eviction under memory pressure; hits are taken (counted, and the prefill computes fewer tokens),
 * and at idle every block is back. Each scenario runs with overlapped greedy decode and without it.
 * With the argument --kv-cache-dtype fp8 (ctest prefix_cache_fp8_test) every run uses an fp8 KV cache: chunked
 * prefill, preemption and prefix sharing give exactly the tokens of each request run alone, unchunked, with the
 * same cache (the CPU's cache is float32 either way, so the pools hold the same blocks). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kite.h"
#include "test_util.h"
#include "token_record.h"

#define MAX_JOBS 8
#define MAX_PROMPT 320

/* One request of a scenario and when things happen to it, in engine steps. */
typedef struct job {
    int32_t prompt[MAX_PROMPT];
    int32_t n_prompt;
    int32_t max_tokens;
    int arrive;                /* the step before which it is submitted */
    int cancel_after_tokens;   /* > 0: cancelled once it has this many tokens */
    int cancel_after_steps;    /* > 0: cancelled this many steps after it arrived (checked: no token yet) */
    float temperature;         /* 0 = greedy; else sampled with seed 1000 + its index */
} job;

typedef struct scenario {
    job jobs[MAX_JOBS];
    int n_jobs;
    kite_engine_params params;
} scenario;

typedef struct outcome {
    token_record records[MAX_JOBS];
    kite_engine_stats stats;     /* at idle */
    kite_engine_timings timings;
    bool cancelled_in_prefill[MAX_JOBS];
} outcome;

static kite_model *model;
static uint32_t vocab_size; /* the model's */

static uint64_t rng_state;
static int32_t next_token(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((rng_state >> 33) % vocab_size);
}

/* Appends n pseudo-random tokens (or a copy of `from`) to a job's prompt. */
static void append_random(job *j, int32_t n) {
    for (int32_t i = 0; i < n && j->n_prompt < MAX_PROMPT; i++) j->prompt[j->n_prompt++] = next_token();
}
static void append_copy(job *j, const int32_t *from, int32_t n) {
    memcpy(j->prompt + j->n_prompt, from, (size_t)n * sizeof *from);
    j->n_prompt += n;
}

static kite_request make_request(const job *j, int index, token_record *record) {
    kite_request r = kite_request_default();
    r.prompt_ids = j->prompt;
    r.n_prompt_ids = (size_t)j->n_prompt;
    r.max_tokens = j->max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = j->temperature;
    r.sampling.seed = 1000 + (uint64_t)index;
    r.on_token = token_record_collect;
    r.user_data = record;
    return r;
}

/* Runs a scenario's requests, arriving and cancelled as it says, to idle. */
static bool run_scenario(const scenario *sc, bool prefix_cache, outcome *out) {
    memset(out, 0, sizeof *out);
    kite_engine_params params = sc->params;
    params.prefix_cache = prefix_cache;
    kite_engine *e = NULL;
    kite_status s = kite_engine_create(model, &params, &e);
    CHECK_MSG(s == KITE_OK, "engine: %s", kite_last_error());
    if (s != KITE_OK) return false;
    kite_request_id ids[MAX_JOBS] = {0};
    bool submitted[MAX_JOBS] = {false}, cancelled[MAX_JOBS] = {false};
    int n_submitted = 0;
    for (int step = 0; step < 5000 && (n_submitted < sc->n_jobs || !kite_engine_idle(e)); step++) {
        for (int i = 0; i < sc->n_jobs; i++) {
            const job *j = &sc->jobs[i];
            if (!submitted[i] && j->arrive <= step) {
                kite_request r = make_request(j, i, &out->records[i]);
                CHECK_MSG(kite_engine_submit(e, &r, &ids[i]) == KITE_OK, "%s", kite_last_error());
                submitted[i] = true;
                n_submitted++;
            }
            const token_record *rec = &out->records[i];
            if (submitted[i] && !cancelled[i] && rec->finals == 0 &&
                ((j->cancel_after_tokens > 0 && rec->n >= j->cancel_after_tokens) ||
                 (j->cancel_after_steps > 0 && step >= j->arrive + j->cancel_after_steps))) {
                out->cancelled_in_prefill[i] = rec->n == 0;
                CHECK(kite_engine_cancel(e, ids[i]) == KITE_OK);
                cancelled[i] = true;
            }
        }
        s = kite_engine_step(e);
        CHECK_MSG(s == KITE_OK, "step %d: %s", step, kite_last_error());
        if (s != KITE_OK) break;
    }
    CHECK(kite_engine_run(e) == KITE_OK && kite_engine_idle(e));
    out->stats = kite_engine_get_stats(e);
    out->timings = kite_engine_get_timings(e);
    kite_engine_free(e);
    /* At idle every block is back: none is referenced, and the cached ones are only the free ones that hold a
     * prefix. */
    const kite_engine_stats *st = &out->stats;
    CHECK_MSG(st->kv_blocks_free == st->kv_blocks_total, "%d of %d blocks free at idle", st->kv_blocks_free,
              st->kv_blocks_total);
    CHECK_MSG(st->kv_blocks_cached >= 0 && st->kv_blocks_cached <= st->kv_blocks_free, "%d cached of %d free",
              st->kv_blocks_cached, st->kv_blocks_free);
    CHECK(st->prefix_cache == prefix_cache);
    if (!prefix_cache)
        CHECK(st->kv_blocks_cached == 0 && st->prefix_cache_hit_tokens == 0 && st->prefix_cache_queried_tokens == 0);
    else
        CHECK_MSG(st->kv_blocks_cached > 0, "no block is cached after the run");
    CHECK(st->running == 0 && st->waiting == 0);
    return true;
}

/* Each job alone (no cache, an engine of its own), uncancelled: what every run must give. */
static void run_alone(const scenario *sc, token_record *reference) {
    for (int i = 0; i < sc->n_jobs; i++) {
        scenario solo = {.n_jobs = 1, .params = kite_engine_params_default()};
        solo.params.kv_block_size = sc->params.kv_block_size;
        solo.params.prefix_cache = false;
        solo.jobs[0] = sc->jobs[i];
        solo.jobs[0].arrive = 0;
        solo.jobs[0].cancel_after_tokens = solo.jobs[0].cancel_after_steps = 0;
        kite_engine *e = NULL;
        CHECK(kite_engine_create(model, &solo.params, &e) == KITE_OK);
        if (!e) return;
        /* the solo run samples with the job's own seed: its index in the scenario */
        kite_request r = make_request(&solo.jobs[0], i, &reference[i]);
        CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
        CHECK(kite_engine_run(e) == KITE_OK);
        kite_engine_free(e);
        CHECK_MSG(reference[i].finish == KITE_FINISH_LENGTH && reference[i].n == sc->jobs[i].max_tokens,
                  "job %d alone: %d tokens, finish %d", i, reference[i].n, reference[i].finish);
    }
}

static void check_against(const scenario *sc, const outcome *o, const token_record *reference, const char *what) {
    for (int i = 0; i < sc->n_jobs; i++) {
        const job *j = &sc->jobs[i];
        const token_record *rec = &o->records[i];
        CHECK_MSG(rec->finals == 1 && rec->after_final == 0, "%s job %d: %d final events", what, i, rec->finals);
        const bool cancelled = j->cancel_after_tokens > 0 || j->cancel_after_steps > 0;
        if (cancelled) {
            CHECK_MSG(rec->finish == KITE_FINISH_CANCELLED, "%s job %d: finish %d", what, i, rec->finish);
            if (j->cancel_after_steps > 0)
                CHECK_MSG(o->cancelled_in_prefill[i], "%s job %d: not cancelled mid-prefill", what, i);
            if (j->cancel_after_tokens > 0)
                CHECK_MSG(rec->n >= j->cancel_after_tokens && rec->n < j->max_tokens,
                          "%s job %d: cancelled after %d tokens", what, i, rec->n);
        } else {
            CHECK_MSG(rec->finish == KITE_FINISH_LENGTH && rec->n == j->max_tokens, "%s job %d: %d tokens, finish %d",
                      what, i, rec->n, rec->finish);
        }
        for (int k = 0; k < rec->n && k < reference[i].n; k++)
            CHECK_MSG(rec->tokens[k] == reference[i].tokens[k], "%s job %d token %d: %d, alone %d", what, i, k,
                      rec->tokens[k], reference[i].tokens[k]);
        CHECK(rec->n <= reference[i].n);
    }
}

/* The scenario with the cache and without it (each with overlapped decode and without), every request's tokens
 * checked; returns the cached run's outcome (overlap on) in *cached and the uncached one's in *uncached. */
static void check_scenario(const scenario *sc, outcome *cached, outcome *uncached) {
    token_record reference[MAX_JOBS];
    memset(reference, 0, sizeof reference);
    run_alone(sc, reference);
    for (int overlap = 1; overlap >= 0; overlap--) {
        if (!overlap) setenv("KITE_ENGINE_OVERLAP", "0", 1);
        outcome on, off;
        if (run_scenario(sc, true, &on)) check_against(sc, &on, reference, overlap ? "cached" : "cached, no overlap");
        if (run_scenario(sc, false, &off))
            check_against(sc, &off, reference, overlap ? "uncached" : "uncached, no overlap");
        CHECK_MSG(on.stats.prefix_cache_hit_tokens == 0 || on.timings.prefill_tokens < off.timings.prefill_tokens,
                  "with %lld hit tokens the prefill computed %lld tokens, %lld without the cache",
                  (long long)on.stats.prefix_cache_hit_tokens, (long long)on.timings.prefill_tokens,
                  (long long)off.timings.prefill_tokens);
        if (overlap) {
            *cached = on;
            *uncached = off;
        }
    }
    unsetenv("KITE_ENGINE_OVERLAP");
}

static kite_engine_params small_blocks(int32_t block_size) {
    kite_engine_params p = kite_engine_params_default();
    p.kv_block_size = block_size;
    return p;
}

/* A 45-token system prompt (5 full blocks of 8) then different user turns; the later requests arrive after the
 * first one's prompt was read, so each takes its 40 cached tokens and computes only its own. One is sampled. */
static void test_shared_system_prompt(void) {
    rng_state = 1;
    scenario sc = {.n_jobs = 4, .params = small_blocks(8)};
    job system = {0};
    append_random(&system, 45);
    const int32_t suffix[4] = {7, 12, 3, 20}, arrive[4] = {0, 2, 3, 5};
    for (int i = 0; i < sc.n_jobs; i++) {
        job *j = &sc.jobs[i];
        append_copy(j, system.prompt, 45);
        append_random(j, suffix[i]);
        j->max_tokens = 12;
        j->arrive = arrive[i];
    }
    sc.jobs[2].temperature = 0.8f;
    outcome on, off;
    check_scenario(&sc, &on, &off);
    CHECK_MSG(on.stats.prefix_cache_hit_tokens == 3 * 40, "%lld hit tokens, expected 120",
              (long long)on.stats.prefix_cache_hit_tokens);
    int64_t prompt_tokens = 0;
    for (int i = 0; i < sc.n_jobs; i++) prompt_tokens += sc.jobs[i].n_prompt;
    CHECK_MSG(on.stats.prefix_cache_queried_tokens == prompt_tokens, "%lld queried, %lld prompt tokens",
              (long long)on.stats.prefix_cache_queried_tokens, (long long)prompt_tokens);
    CHECK_MSG(off.timings.prefill_tokens - on.timings.prefill_tokens == 120, "prefill %lld tokens cached, %lld not",
              (long long)on.timings.prefill_tokens, (long long)off.timings.prefill_tokens);
}

/* The second request's prefill computes only what the cache does not hold: one request, then the same prompt
 * again once the first has finished. */
static void test_second_request_computes_less(void) {
    rng_state = 2;
    job j = {0};
    append_random(&j, 37);
    j.max_tokens = 4;
    kite_engine_params params = small_blocks(8);
    kite_engine *e = NULL;
    CHECK(kite_engine_create(model, &params, &e) == KITE_OK);
    if (!e) return;
    token_record first = {0}, second = {0};
    kite_request r = make_request(&j, 0, &first);
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK && kite_engine_run(e) == KITE_OK);
    const int64_t first_prefill = kite_engine_get_timings(e).prefill_tokens;
    CHECK(first_prefill == 37 && kite_engine_get_stats(e).prefix_cache_hit_tokens == 0);
    kite_engine_reset_timings(e);
    r = make_request(&j, 0, &second);
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK && kite_engine_run(e) == KITE_OK);
    const kite_engine_stats st = kite_engine_get_stats(e);
    const int64_t second_prefill = kite_engine_get_timings(e).prefill_tokens;
    CHECK_MSG(st.prefix_cache_hit_tokens == 32 && second_prefill == 5, "%lld hit tokens, %lld computed",
              (long long)st.prefix_cache_hit_tokens, (long long)second_prefill);
    CHECK(first.n == 4 && second.n == 4 && memcmp(first.tokens, second.tokens, sizeof first.tokens) == 0);
    kite_engine_free(e);
}

/* The same prompt four times: two arriving together (both compute it: nothing is cached yet; the second
 * block of each content stays uncached), two later ones taking its 3 full blocks before the last token. */
static void test_identical_prompts(void) {
    rng_state = 3;
    scenario sc = {.n_jobs = 4, .params = small_blocks(8)};
    job base = {0};
    append_random(&base, 30);
    const int32_t arrive[4] = {0, 0, 4, 8}, max_tokens[4] = {10, 10, 6, 14};
    for (int i = 0; i < sc.n_jobs; i++) {
        sc.jobs[i] = base;
        sc.jobs[i].arrive = arrive[i];
        sc.jobs[i].max_tokens = max_tokens[i];
    }
    outcome on, off;
    check_scenario(&sc, &on, &off);
    CHECK_MSG(on.stats.prefix_cache_hit_tokens == 2 * 24, "%lld hit tokens", (long long)on.stats.prefix_cache_hit_tokens);
}

/* A prompt of exactly 4 blocks that hits whole recomputes its last block into a block of its own (the request
 * needs logits); also with the default 128-position blocks and a 256-token prompt. */
static void test_prompt_of_whole_blocks(void) {
    const int32_t block_sizes[2] = {8, 128}, lengths[2] = {32, 256};
    for (int v = 0; v < 2; v++) {
        rng_state = 4 + (uint64_t)v;
        scenario sc = {.n_jobs = 3, .params = small_blocks(block_sizes[v])};
        append_random(&sc.jobs[0], lengths[v]);
        sc.jobs[0].max_tokens = 6;
        sc.jobs[1] = sc.jobs[0];
        sc.jobs[1].arrive = 3;
        sc.jobs[2] = sc.jobs[0];
        sc.jobs[2].arrive = 20; /* after both finished: the blocks wait cached-free */
        outcome on, off;
        check_scenario(&sc, &on, &off);
        const int64_t per_hit = lengths[v] - block_sizes[v];
        CHECK_MSG(on.stats.prefix_cache_hit_tokens == 2 * per_hit, "block %d: %lld hit tokens, expected %lld",
                  block_sizes[v], (long long)on.stats.prefix_cache_hit_tokens, (long long)(2 * per_hit));
        CHECK(off.timings.prefill_tokens - on.timings.prefill_tokens == 2 * per_hit);
    }
}

/* A step budget of 6 tokens reads every prompt in chunks; requests arrive while the shared prefix is still being
 * read, so they take only the blocks already registered. */
static void test_chunked_prefill(void) {
    rng_state = 6;
    scenario sc = {.n_jobs = 5, .params = small_blocks(4)};
    sc.params.max_sequences = 4;
    sc.params.max_step_tokens = 6;
    job system = {0};
    append_random(&system, 33);
    const int32_t suffix[5] = {5, 1, 9, 4, 13}, arrive[5] = {0, 2, 4, 7, 16};
    for (int i = 0; i < sc.n_jobs; i++) {
        append_copy(&sc.jobs[i], system.prompt, 33);
        append_random(&sc.jobs[i], suffix[i]);
        sc.jobs[i].max_tokens = 9;
        sc.jobs[i].arrive = arrive[i];
    }
    sc.jobs[3].temperature = 1.0f;
    outcome on, off;
    check_scenario(&sc, &on, &off);
    CHECK_MSG(on.stats.prefix_cache_hit_tokens > 0, "no hit");
}

/* A pool of 30 blocks of 4 for five requests of ~50 positions each: requests are preempted (releasing their
 * references) and resumed (taking cached blocks again, their generated tokens included). */
static void test_preemption(void) {
    rng_state = 7;
    scenario sc = {.n_jobs = 5, .params = small_blocks(4)};
    sc.params.kv_cache_bytes = 512 * 4 * 30; /* tiny-vocab1k: 512 bytes per position on the CPU */
    job system = {0};
    append_random(&system, 18);
    for (int i = 0; i < sc.n_jobs; i++) {
        append_copy(&sc.jobs[i], system.prompt, 18);
        append_random(&sc.jobs[i], 5 + 3 * i);
        sc.jobs[i].max_tokens = 28;
        sc.jobs[i].arrive = i;
    }
    sc.jobs[1].temperature = 0.7f;
    outcome on, off;
    check_scenario(&sc, &on, &off);
    CHECK_MSG(on.stats.preemptions > 0 && off.stats.preemptions > 0, "preemptions: %lld cached, %lld not",
              (long long)on.stats.preemptions, (long long)off.stats.preemptions);
    CHECK_MSG(on.stats.prefix_cache_hit_tokens > 0, "no hit");
}

/* A long prompt cancelled while it is read in chunks leaves the blocks it completed cached for a request with the
 * same start; a request cancelled while decoding leaves its blocks to an identical later one. */
static void test_cancellation(void) {
    rng_state = 8;
    scenario sc = {.n_jobs = 4, .params = small_blocks(8)};
    sc.params.max_sequences = 4;
    sc.params.max_step_tokens = 16;
    append_random(&sc.jobs[0], 120);
    sc.jobs[0].max_tokens = 8;
    sc.jobs[0].cancel_after_steps = 2; /* 32 of its 120 tokens read */
    append_copy(&sc.jobs[1], sc.jobs[0].prompt, 40);
    append_random(&sc.jobs[1], 6);
    sc.jobs[1].max_tokens = 8;
    sc.jobs[1].arrive = 3;
    append_random(&sc.jobs[2], 27);
    sc.jobs[2].max_tokens = 20;
    sc.jobs[2].arrive = 1;
    sc.jobs[2].cancel_after_tokens = 3;
    sc.jobs[3] = sc.jobs[2];
    sc.jobs[3].cancel_after_tokens = 0;
    sc.jobs[3].arrive = 12;
    outcome on, off;
    check_scenario(&sc, &on, &off);
    CHECK_MSG(on.stats.prefix_cache_hit_tokens >= 32 + 24, "%lld hit tokens",
              (long long)on.stats.prefix_cache_hit_tokens);
}

/* A pool of 16 blocks of 4 and requests of 7 blocks each, one after another: cached blocks are evicted (least
 * recently freed first) for new ones; a prompt repeated right away hits, and again after eviction it is computed
 * anew, with the same tokens. */
static void test_eviction(void) {
    rng_state = 9;
    scenario sc = {.n_jobs = 6, .params = small_blocks(4)};
    sc.params.kv_cache_bytes = 512 * 4 * 16;
    for (int i = 0; i < sc.n_jobs; i++) {
        append_random(&sc.jobs[i], 20);
        sc.jobs[i].max_tokens = 8;
        sc.jobs[i].arrive = 12 * i; /* one at a time */
    }
    sc.jobs[1] = sc.jobs[0];
    sc.jobs[1].arrive = 12;
    sc.jobs[5] = sc.jobs[0];
    sc.jobs[5].arrive = 60;
    outcome on, off;
    check_scenario(&sc, &on, &off);
    CHECK_MSG(on.stats.prefix_cache_evictions > 0, "no eviction");
    CHECK_MSG(on.stats.prefix_cache_hit_tokens >= 16, "%lld hit tokens", (long long)on.stats.prefix_cache_hit_tokens);
    CHECK(on.stats.preemptions == 0);
}

int main(int argc, char **argv) {
    kite_load_params p = kite_load_params_default();
    p.backend = KITE_BACKEND_CPU;
    p.n_threads = 2;
    if (argc == 3 && strcmp(argv[1], "--kv-cache-dtype") == 0 && strcmp(argv[2], "fp8") == 0) {
        p.kv_cache_dtype = KITE_KV_CACHE_FP8;
        printf("every engine runs with an fp8 KV cache\n");
    } else if (argc != 1) {
        fprintf(stderr, "usage: prefix_cache_test [--kv-cache-dtype fp8]\n");
        return 2;
    }
    kite_status s = kite_model_load(KITE_TEST_DATA_DIR "/tiny-vocab1k", &p, &model);
    CHECK_MSG(s == KITE_OK, "load: %s", kite_last_error());
    if (s != KITE_OK) return test_finish();
    vocab_size = (uint32_t)kite_model_get_info(model).vocab_size;
    CHECK(kite_engine_params_default().prefix_cache); /* on by default */
    TEST_RUN(test_second_request_computes_less);
    TEST_RUN(test_shared_system_prompt);
    TEST_RUN(test_identical_prompts);
    TEST_RUN(test_prompt_of_whole_blocks);
    TEST_RUN(test_chunked_prefill);
    TEST_RUN(test_preemption);
    TEST_RUN(test_cancellation);
    TEST_RUN(test_eviction);
    kite_model_free(model);
    return test_finish();
}

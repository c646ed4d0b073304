/* kite.h's benchmark on the CPU backend with the dummy tiny-vocab1k model (token ids only): rows come back timed
 * through the engine with the steps they claim (the overlapped greedy decode's included), bad parameters are refused
 * with a message, and the gate, run against a CPU reference (bench_run_with_reference), passes on the same weights and
 * fails on other weights or on a backend whose ids-only step picks a wrong id. Also the engine hooks the benchmark
 * stands on. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "bench/bench_internal.h"
#include "engine/engine_internal.h"
#include "kite.h"
#include "model/model.h"
#include "test_util.h"

#define MAX_ROWS 16

typedef struct collected {
    kite_bench_row rows[MAX_ROWS];
    int n;
} collected;

static void collect(const kite_bench_row *row, void *user_data) {
    collected *c = user_data;
    if (c->n < MAX_ROWS) c->rows[c->n] = *row;
    c->n++;
}

static kite_model *load_dummy(uint64_t seed) {
    kite_load_params p = kite_load_params_default();
    p.backend = KITE_BACKEND_CPU;
    p.n_threads = 2;
    kite_model *m = NULL;
    kite_status s = kite_model_load_dummy("tiny-vocab1k", seed, &p, &m);
    CHECK_MSG(s == KITE_OK, "load: %s", kite_last_error());
    return m;
}

static const int32_t prefill_16[] = {16};
static const int32_t decode_4[] = {4};
static const int32_t batch_1_2[] = {1, 2};
static const int32_t depth_0_8[] = {0, 8};

static kite_bench_params small_params(void) {
    kite_bench_params p = kite_bench_params_default();
    p.prefill = prefill_16;
    p.n_prefill = 1;
    p.decode = decode_4;
    p.n_decode = 1;
    p.batch = batch_1_2;
    p.n_batch = 2;
    p.depth = depth_0_8;
    p.n_depth = 2;
    p.repetitions = 2;
    return p;
}

/* A timed row: its numbers are consistent and the engine ran the steps it claims. */
static void check_timed(const kite_bench_row *row, int64_t steps, int64_t ahead, bool overlapped) {
    CHECK_MSG(row->gate_passed, "%s B=%d: gate failed: %s", row->test, row->batch, row->gate_why);
    CHECK_MSG(row->tok_s > 0 && row->tok_s_min <= row->tok_s && row->tok_s <= row->tok_s_max, "%s: tok/s %g (%g-%g)",
              row->test, row->tok_s, row->tok_s_min, row->tok_s_max);
    CHECK(row->ms_per_step > 0);
    CHECK(row->hbm_floor_fraction == 0); /* CUDA rows only */
    CHECK_MSG(row->engine_steps == steps && row->engine_steps_ahead == ahead,
              "%s B=%d depth %d: %lld steps (%lld ahead), expected %lld (%lld)", row->test, row->batch, row->depth,
              (long long)row->engine_steps, (long long)row->engine_steps_ahead, (long long)steps, (long long)ahead);
    CHECK(row->overlapped == overlapped);
}

static void test_greedy_rows(void) {
    kite_model *m = load_dummy(0);
    if (!m) return;
    kite_bench_params p = small_params();
    kite_bench_info info;
    CHECK_MSG(kite_bench_describe(m, &p, &info) == KITE_OK, "%s", kite_last_error());
    CHECK(strcmp(info.backend_name, "cpu") == 0 && !info.gated && !info.sampled);
    CHECK(info.commit && strcmp(info.commit, kite_build_commit()) == 0);
    collected c = {0};
    CHECK_MSG(kite_bench_run(m, &p, collect, &c) == KITE_OK, "%s", kite_last_error());
    CHECK_MSG(c.n == 6, "%d rows", c.n);
    const char *tests[] = {"pp16", "pp16", "tg4", "tg4", "tg4", "tg4"};
    const int32_t batches[] = {1, 2, 1, 2, 1, 2}, depths[] = {0, 0, 0, 0, 8, 8};
    const bool ahead = info.greedy_overlapped; /* on unless KITE_ENGINE_OVERLAP=0 */
    for (int i = 0; i < c.n && i < 6; i++) {
        const kite_bench_row *row = &c.rows[i];
        CHECK_MSG(strcmp(row->test, tests[i]) == 0 && row->batch == batches[i] && row->depth == depths[i],
                  "row %d: %s B=%d depth %d", i, row->test, row->batch, row->depth);
        if (row->is_decode)
            check_timed(row, 4, ahead ? 3 : 0, ahead);
        else
            check_timed(row, 1, 0, false);
    }
    /* The engine is freed with the run: the model takes another. */
    kite_engine *e = NULL;
    CHECK_MSG(kite_engine_create(m, NULL, &e) == KITE_OK, "%s", kite_last_error());
    kite_engine_free(e);
    kite_model_free(m);
}

static void test_sampled_rows(void) {
    kite_model *m = load_dummy(0);
    if (!m) return;
    kite_bench_params p = small_params();
    p.prefill = NULL;
    p.n_prefill = 0;
    p.sampling.temperature = 0.8f;
    p.sampling.top_k = 20;
    kite_bench_info info;
    CHECK(kite_bench_describe(m, &p, &info) == KITE_OK && info.sampled);
    collected c = {0};
    CHECK_MSG(kite_bench_run(m, &p, collect, &c) == KITE_OK, "%s", kite_last_error());
    CHECK_MSG(c.n == 4, "%d rows", c.n);
    for (int i = 0; i < c.n && i < MAX_ROWS; i++)
        check_timed(&c.rows[i], 4, 0, false); /* sampling never runs ahead */
    kite_model_free(m);
}

/* Prompts grouped whole per step, 8,192 tokens at most: 3 prompts of 3,000 take two steps (2 + 1), one of
 * 9,000 one step. */
static void test_prefill_steps(void) {
    kite_model *m = load_dummy(0);
    if (!m) return;
    static const int32_t prefill[] = {3000}, batch[] = {3}, long_prefill[] = {9000}, one[] = {1};
    kite_bench_params p = kite_bench_params_default();
    p.prefill = prefill;
    p.n_prefill = 1;
    p.batch = batch;
    p.n_batch = 1;
    p.n_decode = 0;
    p.repetitions = 1;
    collected c = {0};
    CHECK_MSG(kite_bench_run(m, &p, collect, &c) == KITE_OK, "%s", kite_last_error());
    CHECK(c.n == 1);
    if (c.n == 1) check_timed(&c.rows[0], 2, 0, false);
    kite_model_free(m);

    /* The tiny shape allows 4,096 positions: a longer prompt is refused before anything runs. */
    m = load_dummy(0);
    if (!m) return;
    p.prefill = long_prefill;
    p.batch = one;
    c.n = 0;
    CHECK(kite_bench_run(m, &p, collect, &c) == KITE_ERROR_INVALID_ARGUMENT && c.n == 0);
    CHECK_MSG(strstr(kite_last_error(), "positions") != NULL, "%s", kite_last_error());
    kite_model_free(m);
}

/* Rows whose lengths fill whole KV blocks: the engine is sized for them alone (no other row leaves room), so
 * each request's one position past its prompt must be planned for. */
static void test_rows_at_block_multiples(void) {
    kite_model *m = load_dummy(0);
    if (!m) return;
    static const int32_t prefill[] = {256}, decode[] = {63}, batch[] = {1}, depth[] = {64};
    kite_bench_params p = kite_bench_params_default();
    p.prefill = prefill;
    p.n_prefill = 1;
    p.batch = batch;
    p.n_batch = 1;
    p.n_decode = 0;
    p.repetitions = 1;
    collected c = {0};
    CHECK_MSG(kite_bench_run(m, &p, collect, &c) == KITE_OK, "pp256 alone: %s", kite_last_error());
    CHECK(c.n == 1);
    if (c.n == 1) check_timed(&c.rows[0], 1, 0, false);

    p.n_prefill = 0;
    p.decode = decode;
    p.n_decode = 1;
    p.depth = depth;
    p.n_depth = 1;
    c.n = 0;
    CHECK_MSG(kite_bench_run(m, &p, collect, &c) == KITE_OK, "tg63 at depth 64 alone: %s", kite_last_error());
    CHECK(c.n == 1);
    kite_model_free(m);
}

/* Each bad parameter is refused by describe and run alike, with a message naming it, and no row runs. */
static void expect_refused(kite_model *m, const kite_bench_params *p, const char *needle) {
    kite_bench_info info;
    kite_status s = kite_bench_describe(m, p, &info);
    CHECK_MSG(s == KITE_ERROR_INVALID_ARGUMENT && strstr(kite_last_error(), needle),
              "describe: %s, '%s' (expected '%s')", kite_status_string(s), kite_last_error(), needle);
    collected c = {0};
    s = kite_bench_run(m, p, collect, &c);
    CHECK_MSG(s == KITE_ERROR_INVALID_ARGUMENT && strstr(kite_last_error(), needle) && c.n == 0,
              "run: %s, '%s' (expected '%s'), %d rows", kite_status_string(s), kite_last_error(), needle, c.n);
}

static void test_bad_params(void) {
    kite_model *m = load_dummy(0);
    if (!m) return;
    static const int32_t zero[] = {0}, too_many[] = {KITE_BENCH_MAX_BATCH + 1}, negative[] = {-1}, deep[] = {4092};
    kite_bench_params p = small_params();
    p.batch = zero;
    p.n_batch = 1;
    expect_refused(m, &p, "batch[0]");
    p.batch = too_many;
    expect_refused(m, &p, "batch[0]");
    p = small_params();
    p.decode = zero;
    expect_refused(m, &p, "decode[0]");
    p = small_params();
    p.prefill = zero;
    expect_refused(m, &p, "prefill[0]");
    p = small_params();
    p.depth = negative;
    p.n_depth = 1;
    expect_refused(m, &p, "depth[0]");
    p = small_params();
    p.prefill = NULL;
    expect_refused(m, &p, "prefill");
    p = small_params();
    p.repetitions = 0;
    expect_refused(m, &p, "repetitions");
    p = small_params();
    p.n_batch = 0;
    expect_refused(m, &p, "batch size");
    p = small_params();
    p.n_depth = 0;
    expect_refused(m, &p, "depth");
    p = small_params();
    p.depth = deep; /* 4,092 + 4 + 1 positions > 4,096 */
    p.n_depth = 1;
    expect_refused(m, &p, "positions");
    p = small_params();
    p.sampling.temperature = 0.5f;
    p.sampling.top_p = 2.0f;
    expect_refused(m, &p, "sampling");
    /* A model that has an engine already: kite_bench_run needs its own. */
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    p = small_params();
    collected c = {0};
    CHECK(kite_bench_run(m, &p, collect, &c) == KITE_ERROR_INVALID_ARGUMENT && c.n == 0);
    CHECK_MSG(strstr(kite_last_error(), "engine") != NULL, "%s", kite_last_error());
    kite_engine_free(e);
    CHECK(kite_bench_run(NULL, &p, collect, &c) == KITE_ERROR_INVALID_ARGUMENT);
    kite_model_free(m);
}

/* The gate on a CPU target against a CPU reference of the same weights: every row passes, nothing between them
 * but what bf16 storage would add. */
static void test_gate_passes_on_the_same_weights(void) {
    kite_model *m = load_dummy(0), *reference = load_dummy(0);
    if (!m || !reference) {
        kite_model_free(m);
        kite_model_free(reference);
        return;
    }
    kite_bench_params p = small_params();
    collected c = {0};
    CHECK_MSG(bench_run_with_reference(m, reference, &p, collect, &c) == KITE_OK, "%s", kite_last_error());
    CHECK_MSG(c.n == 6, "%d rows", c.n);
    for (int i = 0; i < c.n && i < MAX_ROWS; i++) {
        const kite_bench_row *row = &c.rows[i];
        CHECK_MSG(row->gate_passed && row->gate_why[0] == '\0', "%s B=%d: %s", row->test, row->batch, row->gate_why);
        CHECK_MSG(row->gate_rel_l2 < 1e-5, "%s B=%d: relative L2 %g", row->test, row->batch, row->gate_rel_l2);
        CHECK_MSG(row->gate_bf16_budget > 0, "%s: bf16 budget %g", row->test, row->gate_bf16_budget);
        CHECK(row->gate_near_ties == 0);
        CHECK(row->tok_s > 0);
    }
    kite_model_free(reference);
    kite_model_free(m);
}

/* Against another seed's weights every row fails its gate, and no failed row is timed. */
static void test_gate_fails_on_other_weights(void) {
    kite_model *m = load_dummy(0), *reference = load_dummy(1);
    if (!m || !reference) {
        kite_model_free(m);
        kite_model_free(reference);
        return;
    }
    kite_bench_params p = small_params();
    collected c = {0};
    CHECK_MSG(bench_run_with_reference(m, reference, &p, collect, &c) == KITE_OK, "%s", kite_last_error());
    CHECK_MSG(c.n == 6, "%d rows", c.n);
    for (int i = 0; i < c.n && i < MAX_ROWS; i++) {
        const kite_bench_row *row = &c.rows[i];
        CHECK_MSG(!row->gate_passed && row->gate_why[0] != '\0', "%s B=%d passed against other weights", row->test,
                  row->batch);
        CHECK(row->tok_s == 0 && row->engine_steps == 0);
        CHECK_MSG(row->gate_rel_l2 > 0.1, "%s: relative L2 %g", row->test, row->gate_rel_l2);
    }
    kite_model_free(reference);
    kite_model_free(m);
}

/* A backend whose argmax is off by one: its logits match the reference, but the ids-only step of the tg gate
 * does not choose their argmax, so the tg rows fail (pp rows compare logits only, and pass). */
static kite_status (*real_argmax)(backend *, int32_t *, int32_t);

static kite_status wrong_argmax(backend *self, int32_t *ids, int32_t n_rows) {
    const kite_status status = real_argmax(self, ids, n_rows);
    if (status != KITE_OK) return status;
    ids[0] = (ids[0] + 1) % self->config->vocab_size;
    return KITE_OK;
}

static void test_gate_fails_on_wrong_ids(void) {
    kite_model *m = load_dummy(0), *reference = load_dummy(0);
    if (!m || !reference) {
        kite_model_free(m);
        kite_model_free(reference);
        return;
    }
    const backend_ops *ops = m->backend->ops;
    backend_ops broken = *ops;
    real_argmax = ops->argmax;
    broken.argmax = wrong_argmax;
    m->backend->ops = &broken;
    kite_bench_params p = small_params();
    collected c = {0};
    CHECK_MSG(bench_run_with_reference(m, reference, &p, collect, &c) == KITE_OK, "%s", kite_last_error());
    m->backend->ops = ops;
    CHECK_MSG(c.n == 6, "%d rows", c.n);
    for (int i = 0; i < c.n && i < MAX_ROWS; i++) {
        const kite_bench_row *row = &c.rows[i];
        if (!row->is_decode) {
            CHECK_MSG(row->gate_passed, "%s: %s", row->test, row->gate_why);
            continue;
        }
        CHECK_MSG(!row->gate_passed && strstr(row->gate_why, "ids-only") != NULL, "%s B=%d: '%s'", row->test,
                  row->batch, row->gate_why);
    }
    kite_model_free(reference);
    kite_model_free(m);
}

/* Every repetition of a tg row runs on the same KV blocks, in the same order (a fresh engine's ascending ones):
 * the engine gives a finished request's blocks back so that the next one takes them as they were. */
static kite_status (*real_forward)(backend *, const step_batch *);
static int32_t tables_seen[8][3];
static int n_tables_seen;

static kite_status recording_forward(backend *self, const step_batch *batch) {
    /* Position 256 is the first of the third block: the table then holds three. */
    if (batch->n_seqs == 1 && batch->seq_context_len[0] == 257 && n_tables_seen < 8)
        memcpy(tables_seen[n_tables_seen++], batch->block_tables[0], sizeof tables_seen[0]);
    return real_forward(self, batch);
}

static void test_repetitions_reuse_their_blocks(void) {
    kite_model *m = load_dummy(0);
    if (!m) return;
    const backend_ops *ops = m->backend->ops;
    backend_ops recording = *ops;
    real_forward = ops->forward;
    recording.forward = recording_forward;
    m->backend->ops = &recording;
    static const int32_t decode[] = {80}, batch[] = {1}, depth[] = {200};
    kite_bench_params p = kite_bench_params_default();
    p.n_prefill = 0;
    p.decode = decode;
    p.batch = batch;
    p.depth = depth;
    p.repetitions = 2;
    n_tables_seen = 0;
    collected c = {0};
    CHECK_MSG(kite_bench_run(m, &p, collect, &c) == KITE_OK, "%s", kite_last_error());
    m->backend->ops = ops;
    CHECK_MSG(n_tables_seen == 3, "%d tables seen", n_tables_seen); /* the warm-up and two repetitions */
    for (int i = 0; i < n_tables_seen; i++)
        CHECK_MSG(tables_seen[i][0] == 0 && tables_seen[i][1] == 1 && tables_seen[i][2] == 2,
                  "repetition %d: blocks %d %d %d", i, tables_seen[i][0], tables_seen[i][1], tables_seen[i][2]);
    kite_model_free(m);
}

/* ---- the engine hooks (engine_internal.h) ---- */

static void count_event(const kite_token_event *event, void *user_data) {
    if (event->token >= 0) (*(int *)user_data)++;
}

static void test_engine_hooks(void) {
    kite_model *m = load_dummy(0);
    if (!m) return;
    kite_engine_params ep = kite_engine_params_default();
    ep.max_sequences = 4;
    ep.max_step_tokens = 64;
    ep.max_context = 256;
    ep.kv_cache_bytes = 8 * engine_kv_block_bytes(m, ep.kv_block_size);
    kite_engine *e = NULL;
    CHECK_MSG(kite_engine_create(m, &ep, &e) == KITE_OK, "%s", kite_last_error());
    if (!e) {
        kite_model_free(m);
        return;
    }
    CHECK(kite_engine_get_stats(e).kv_blocks_total == 8);

    /* Lending: only what is free, submit refused while lent, every block back. */
    int32_t ids[8];
    CHECK(engine_lend_blocks(e, 9, ids) == KITE_ERROR_CAPACITY);
    CHECK(engine_lend_blocks(e, 3, ids) == KITE_OK && kite_engine_get_stats(e).kv_blocks_free == 5);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++)
        prompt[i] = i + 1;
    int tokens = 0;
    kite_request q = kite_request_default();
    q.prompt_ids = prompt;
    q.n_prompt_ids = 40;
    q.max_tokens = 3;
    q.ignore_eos = true;
    q.on_token = count_event;
    q.user_data = &tokens;
    CHECK(kite_engine_submit(e, &q, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(kite_last_error(), "lent") != NULL, "%s", kite_last_error());
    engine_return_blocks(e, ids, 3);
    CHECK(kite_engine_get_stats(e).kv_blocks_free == 8);

    /* The step budget: between max_sequences and max_step_tokens. */
    CHECK(engine_set_step_token_budget(e, 3) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(engine_set_step_token_budget(e, 65) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(engine_set_step_token_budget(e, 16) == KITE_OK);

    /* Held: two prompts of 40 are read 16 tokens a step (5 steps: the first completes in the third, which starts
     * the second), each gets its first token, then nothing runs until released; released, both decode together:
     * 2 more steps. */
    engine_hold_decode(e, true);
    CHECK(kite_engine_submit(e, &q, NULL) == KITE_OK && kite_engine_submit(e, &q, NULL) == KITE_OK);
    for (int k = 0; k < 5; k++)
        CHECK(kite_engine_step(e) == KITE_OK);
    CHECK_MSG(tokens == 2, "%d tokens after the prompts", tokens);
    const int64_t steps = kite_engine_get_stats(e).steps;
    CHECK(kite_engine_step(e) == KITE_OK && kite_engine_get_stats(e).steps == steps && tokens == 2);
    CHECK(engine_lend_blocks(e, 1, ids) == KITE_ERROR_INVALID_ARGUMENT); /* not idle */
    engine_hold_decode(e, false);
    CHECK(kite_engine_step(e) == KITE_OK && tokens == 4);
    CHECK(kite_engine_step(e) == KITE_OK && tokens == 6);
    CHECK(kite_engine_run(e) == KITE_OK && kite_engine_idle(e));
    CHECK(kite_engine_get_stats(e).steps == steps + 2 && kite_engine_get_stats(e).kv_blocks_free == 8);
    kite_engine_free(e);
    kite_model_free(m);
}

/* The dummy shape is the checkpoint tests/data/tiny-vocab1k's. */
static void test_the_shape_is_the_checkpoints(void) {
    kite_model *dummy = load_dummy(0), *loaded = NULL;
    kite_load_params p = kite_load_params_default();
    p.backend = KITE_BACKEND_CPU;
    CHECK_MSG(kite_model_load(KITE_TEST_DATA_DIR "/tiny-vocab1k", &p, &loaded) == KITE_OK, "%s", kite_last_error());
    if (dummy && loaded) {
        kite_model_info a = kite_model_get_info(dummy), b = kite_model_get_info(loaded);
        CHECK_MSG(a.vocab_size == b.vocab_size && a.n_layers == b.n_layers && a.hidden_size == b.hidden_size,
                  "dummy: vocab %d, %d layers, hidden %d; checkpoint: %d, %d, %d", a.vocab_size, a.n_layers,
                  a.hidden_size, b.vocab_size, b.n_layers, b.hidden_size);
        CHECK(a.max_context == b.max_context && a.n_parameters == b.n_parameters);
        CHECK(a.n_eos_ids == 1 && b.n_eos_ids == 1 && a.eos_ids[0] == b.eos_ids[0]);
    }
    kite_model_free(loaded);
    kite_model_free(dummy);
}

int main(void) {
    TEST_RUN(test_the_shape_is_the_checkpoints);
    TEST_RUN(test_greedy_rows);
    TEST_RUN(test_sampled_rows);
    TEST_RUN(test_prefill_steps);
    TEST_RUN(test_rows_at_block_multiples);
    TEST_RUN(test_bad_params);
    TEST_RUN(test_gate_passes_on_the_same_weights);
    TEST_RUN(test_gate_fails_on_other_weights);
    TEST_RUN(test_gate_fails_on_wrong_ids);
    TEST_RUN(test_repetitions_reuse_their_blocks);
    TEST_RUN(test_engine_hooks);
    return test_finish();
}

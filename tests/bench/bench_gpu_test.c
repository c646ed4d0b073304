/* kite.h's benchmark on the CUDA backend (a dummy Qwen3-0.6B): every row is gated against the CPU backend and
 * passes, the greedy tg rows run the engine's overlapped decode with the steps they claim, sampled rows do not
 * run ahead, and against another seed's weights the gate fails. Skips (exit 77, saying why) without a usable
 * GPU. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "bench/bench_internal.h"
#include "kite.h"
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
    printf("  %-6s B=%d depth %4d: %10.1f tok/s, %.4f ms/step, gate %s (L2 %.2g, bf16 %.2g), %lld steps (%lld ahead)\n",
           row->test, row->batch, row->depth, row->tok_s, row->ms_per_step, row->gate_passed ? "pass" : row->gate_why,
           row->gate_rel_l2, row->gate_bf16_budget, (long long)row->engine_steps, (long long)row->engine_steps_ahead);
}

static kite_model *load(uint64_t seed) {
    kite_load_params p = kite_load_params_default();
    p.backend = KITE_BACKEND_CUDA;
    kite_model *m = NULL;
    kite_status s = kite_model_load_dummy("qwen3-0.6b-base", seed, &p, &m);
    CHECK_MSG(s == KITE_OK, "load: %s", kite_last_error());
    return m;
}

static const int32_t prefill[] = {128}, decode[] = {16}, batch[] = {1, 4}, depth[] = {0, 300};

static kite_bench_params params(void) {
    kite_bench_params p = kite_bench_params_default();
    p.prefill = prefill;
    p.n_prefill = 1;
    p.decode = decode;
    p.n_decode = 1;
    p.batch = batch;
    p.n_batch = 2;
    p.depth = depth;
    p.n_depth = 2;
    p.repetitions = 2;
    return p;
}

static void test_greedy_rows(void) {
    kite_model *m = load(7);
    if (!m) return;
    kite_bench_params p = params();
    kite_bench_info info;
    CHECK_MSG(kite_bench_describe(m, &p, &info) == KITE_OK, "%s", kite_last_error());
    CHECK(strcmp(info.backend_name, "cuda") == 0 && info.gated && info.decode_path != NULL);
    collected c = {0};
    CHECK_MSG(kite_bench_run(m, &p, collect, &c) == KITE_OK, "%s", kite_last_error());
    CHECK_MSG(c.n == 6, "%d rows", c.n);
    for (int i = 0; i < c.n && i < MAX_ROWS; i++) {
        const kite_bench_row *row = &c.rows[i];
        CHECK_MSG(row->gate_passed, "%s B=%d depth %d: %s", row->test, row->batch, row->depth, row->gate_why);
        CHECK(row->tok_s > 0 && row->tok_s_min <= row->tok_s && row->tok_s <= row->tok_s_max);
        if (!row->is_decode) {
            CHECK(row->engine_steps == 1 && row->engine_steps_ahead == 0);
            continue;
        }
        CHECK(row->engine_steps == 16);
        CHECK(row->engine_steps_ahead == (info.greedy_overlapped ? 15 : 0));
        CHECK(row->overlapped == info.greedy_overlapped);
        CHECK_MSG(row->hbm_floor_fraction > 0 && row->hbm_floor_fraction < 1.5, "%s: floor fraction %g", row->test,
                  row->hbm_floor_fraction);
    }
    kite_model_free(m);
}

static void test_sampled_rows(void) {
    kite_model *m = load(7);
    if (!m) return;
    kite_bench_params p = params();
    p.n_prefill = 0;
    p.sampling.temperature = 0.8f;
    p.sampling.top_k = 20;
    collected c = {0};
    CHECK_MSG(kite_bench_run(m, &p, collect, &c) == KITE_OK, "%s", kite_last_error());
    CHECK_MSG(c.n == 4, "%d rows", c.n);
    for (int i = 0; i < c.n && i < MAX_ROWS; i++) {
        const kite_bench_row *row = &c.rows[i];
        CHECK_MSG(row->gate_passed, "%s B=%d: %s", row->test, row->batch, row->gate_why);
        CHECK(row->engine_steps == 16 && row->engine_steps_ahead == 0 && !row->overlapped);
    }
    kite_model_free(m);
}

static void test_gate_fails_on_other_weights(void) {
    kite_model *m = load(7), *other = load(8);
    if (m && other) {
        kite_bench_params p = params();
        p.n_batch = 1;
        p.n_depth = 1;
        collected c = {0};
        CHECK_MSG(bench_run_with_reference(m, other, &p, collect, &c) == KITE_OK, "%s", kite_last_error());
        CHECK_MSG(c.n == 2, "%d rows", c.n);
        for (int i = 0; i < c.n && i < MAX_ROWS; i++)
            CHECK(!c.rows[i].gate_passed && c.rows[i].tok_s == 0);
    }
    kite_model_free(other);
    kite_model_free(m);
}

int main(void) {
    kite_backend_probe_result probe = {0};
    if (kite_backend_probe(KITE_BACKEND_CUDA, 0, &probe) != KITE_OK || !probe.available) test_skip(probe.reason);
    TEST_RUN(test_greedy_rows);
    TEST_RUN(test_sampled_rows);
    TEST_RUN(test_gate_fails_on_other_weights);
    return test_finish();
}

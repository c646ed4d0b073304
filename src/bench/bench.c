/* kite.h's benchmarks: pp and tg rows timed through the engine, each row gated first (bench_gate.h).
 *
 * One engine serves every row: the backend's KV cache is reserved once, by kite_engine_create, so the engine is
 * sized for the largest row (sequences, tokens per step, context, KV blocks) and the gate borrows its blocks on
 * the target from the engine's pool while the engine is idle (engine_lend_blocks).
 *
 * - pp N (B): B requests of N random prompt tokens and max_tokens 1, submitted untimed; the timed part is the
 *   kite_engine_step calls that read them, whole prompts grouped at most 8,192 tokens per step (one prompt per
 *   step when N is larger; engine_set_step_token_budget), each step ending with the argmax of the prompts it
 *   completed. The requests end there, their one token taken.
 * - tg N (B, depth D): B requests whose prompts of D random tokens are read while decoding is held
 *   (engine_hold_decode), untimed, each prompt's first token sampled; then N kite_engine_step calls, each one
 *   decode step of all B sequences (max_tokens N + 1, eos ignored). Greedy rows are the engine's overlapped decode:
 *   the first call runs its step and enqueues the next before reading its own ids, every later call does the
 *   same for the step in flight, so N - 1 of the N steps run ahead. With D = 0 the prompt is one token, and its
 *   step is the first of the N.
 * Each repetition checks the engine's own count of what ran (kite_engine_stats: steps, steps_ahead, preemptions)
 * and the requests' tokens against what the row claims, so a row never times more or fewer steps than it says.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_gate.h"
#include "bench/bench_internal.h"
#include "bench/bench_random.h"
#include "engine/engine_internal.h"
#include "kite.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "util/error.h"
#include "util/options.h"

/* Tokens one prefill step holds at most (whole prompts; one prompt when it is longer): the budget pp rows have
 * been measured with, and the chunk in which tg rows' contexts are read. */
#define PREFILL_STEP_TOKENS 8192

static const double HBM_BYTES_PER_SECOND = 4.3e12; /* measured device-to-device copy rate on the H200 */

static const int32_t default_prefill[] = {256, 2048};
static const int32_t default_decode[] = {128};
static const int32_t default_batch[] = {1};
static const int32_t default_depth[] = {256};

kite_bench_params kite_bench_params_default(void) {
    return (kite_bench_params){.prefill = default_prefill,
                               .n_prefill = 2,
                               .decode = default_decode,
                               .n_decode = 1,
                               .batch = default_batch,
                               .n_batch = 1,
                               .depth = default_depth,
                               .n_depth = 1,
                               .repetitions = 5,
                               .seed = 0,
                               .sampling = kite_sampling_default(),
                               .prefix_cache = true};
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- what the rows need ------------------------------------------------------------------------- */

/* The engine every row fits in. */
typedef struct bench_plan {
    int32_t max_batch;   /* max_sequences */
    int32_t step_tokens; /* max_step_tokens */
    int32_t max_context; /* the longest request: prompt and generated tokens */
    int32_t positions;   /* KV positions per sequence: the engine's requests' and the gate's */
    int32_t longest_prompt;
} bench_plan;

static kite_status check_list(const char *field, const int32_t *values, size_t n, int32_t min, int32_t max) {
    if (n > 0 && !values)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench params: %s: %zu values, no array", field, n);
    for (size_t i = 0; i < n; i++)
        if (values[i] < min || values[i] > max)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench params: %s[%zu] is %d, outside %d..%d", field, i,
                             values[i], min, max);
    return KITE_OK;
}

static int32_t max_of(const int32_t *values, size_t n, int32_t floor) {
    for (size_t i = 0; i < n; i++)
        floor = values[i] > floor ? values[i] : floor;
    return floor;
}

/* Prompts of n tokens grouped whole per step: the step budget of a pp row. */
static int32_t prefill_step_budget(int32_t n) {
    const int32_t per_step = PREFILL_STEP_TOKENS / n > 0 ? PREFILL_STEP_TOKENS / n : 1;
    return per_step * n;
}

static bool sampled_rows(const kite_bench_params *p) { return p->sampling.temperature > 0.0f; }

static kite_status plan_rows(const kite_model *model, const kite_bench_params *p, bench_plan *out) {
    *out = (bench_plan){0};
    const int32_t limit = 1 << 20;
    KITE_TRY(check_list("prefill", p->prefill, p->n_prefill, 1, limit));
    KITE_TRY(check_list("decode", p->decode, p->n_decode, 1, limit));
    KITE_TRY(check_list("batch", p->batch, p->n_batch, 1, KITE_BENCH_MAX_BATCH));
    KITE_TRY(check_list("depth", p->depth, p->n_depth, 0, limit));
    if (p->repetitions < 1)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench params: repetitions is %d, at least 1", p->repetitions);
    if ((p->n_prefill > 0 || p->n_decode > 0) && p->n_batch == 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench params: rows but no batch size");
    if (p->n_decode > 0 && p->n_depth == 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench params: tg rows but no depth");
    if (sampled_rows(p)) { /* the engine's samplers would refuse the filters at the first row otherwise */
        sampler_params sp = sampler_params_from(&p->sampling);
        sampler *check = NULL;
        kite_status status = sampler_create(&sp, model->config.vocab_size, &check);
        sampler_free(check);
        if (status != KITE_OK) {
            kite_error_prefix("bench params: sampling");
            return status;
        }
    }
    out->max_batch = max_of(p->batch, p->n_batch, 1);
    out->step_tokens = PREFILL_STEP_TOKENS;
    int32_t positions = 0, context = 0;
    for (size_t i = 0; i < p->n_prefill; i++) {
        const int32_t n = p->prefill[i];
        if (prefill_step_budget(n) > out->step_tokens) out->step_tokens = prefill_step_budget(n);
        /* The engine admits a prompt with room for the position of its first token (kite_engine_submit). */
        positions = n + 1 > positions ? n + 1 : positions;
        context = n + 1 > context ? n + 1 : context; /* a prompt is shorter than the context limit */
        out->longest_prompt = n > out->longest_prompt ? n : out->longest_prompt;
    }
    for (size_t d = 0; d < p->n_depth && p->n_decode > 0; d++) {
        const int32_t depth = p->depth[d];
        const int32_t prompt = depth > 0 ? depth : 1;
        out->longest_prompt = prompt > out->longest_prompt ? prompt : out->longest_prompt;
        for (size_t i = 0; i < p->n_decode; i++) {
            /* The prompt, then the first token and N more: depth + N positions computed, one more token held. */
            const int32_t need = depth + p->decode[i] + 1;
            context = need > context ? need : context;
            const int32_t gate = GATE_MAX_DEPTH + GATE_STEPS;
            positions = need > positions ? need : positions;
            positions = gate > positions ? gate : positions;
        }
    }
    if (context > qwen3_context_limit(&model->config))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "bench params: rows need %d positions, the model's context limit is %d (--max-context and "
                         "--rope-scaling set it)",
                         context, qwen3_context_limit(&model->config));
    out->max_context = context > 1 ? context : 1;
    out->positions = positions > 1 ? positions : 1;
    return KITE_OK;
}

kite_status kite_bench_describe(const kite_model *model, const kite_bench_params *params, kite_bench_info *out) {
    if (!model || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_bench_describe: no model or no output");
    const kite_bench_params defaults = kite_bench_params_default();
    const kite_bench_params *p = params ? params : &defaults;
    bench_plan plan;
    KITE_TRY(plan_rows(model, p, &plan));
    runtime_options options;
    KITE_TRY(options_read(&options));
    backend *target = model->backend;
    *out = (kite_bench_info){
        .backend_name = target->ops->name,
        .device_name = target->ops->device_name ? target->ops->device_name(target) : target->ops->name,
        .decode_path = target->ops->decode_path ? target->ops->decode_path(target) : NULL,
        .commit = kite_build_commit(),
        .gated = strcmp(target->ops->name, "cpu") != 0,
        .greedy_overlapped = engine_overlap_enabled(&options, target),
        .sampled = sampled_rows(p),
    };
    return KITE_OK;
}

/* ---- a run ------------------------------------------------------------------------------------- */

typedef struct bench_run {
    kite_model *model;
    backend *target;
    const kite_bench_params *params;
    bench_plan plan;
    kite_engine *engine;
    bench_gate *gate; /* NULL: the target is the oracle itself */
    bool overlap;     /* the engine runs greedy decode ahead */
    int32_t block_size;
    uint64_t rng;
    int32_t *prompt;         /* plan.longest_prompt */
    int32_t *lent;           /* block ids lent to the gate */
    int32_t **tables;        /* [max_batch] into lent */
    double *seconds, *tok_s; /* [repetitions] */
    /* What the requests' callbacks saw in the current repetition: */
    int64_t tokens;
    int32_t finished;
    int32_t finished_otherwise; /* requests that ended other than by their length */
} bench_run;

static void count_token(const kite_token_event *event, void *user_data) {
    bench_run *r = user_data;
    if (event->token >= 0) r->tokens++;
    if (event->finish != KITE_FINISH_NONE) {
        r->finished++;
        if (event->finish != KITE_FINISH_LENGTH) r->finished_otherwise++;
    }
}

/* Submits n_seqs requests of `prompt_length` random tokens that each produce exactly max_tokens tokens. */
static kite_status submit_requests(bench_run *r, int32_t n_seqs, int32_t prompt_length, int32_t max_tokens,
                                   bool sampled) {
    r->tokens = 0;
    r->finished = r->finished_otherwise = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        bench_random_tokens(&r->rng, r->model->config.vocab_size, r->prompt, (size_t)prompt_length);
        kite_request q = kite_request_default();
        q.prompt_ids = r->prompt;
        q.n_prompt_ids = (size_t)prompt_length;
        q.max_tokens = max_tokens;
        q.ignore_eos = true;
        if (sampled) {
            q.sampling = r->params->sampling;
            q.sampling.seed += (uint64_t)s;
        }
        q.on_token = count_token;
        q.user_data = r;
        KITE_TRY(kite_engine_submit(r->engine, &q, NULL));
    }
    return KITE_OK;
}

/* The repetition ran exactly what the row claims: `steps` engine steps, `ahead` of them enqueued ahead, no
 * preemption, n_seqs requests ended by their length with `tokens` tokens in all, and nothing left to run. */
static kite_status check_repetition(const bench_run *r, const char *test, int32_t n_seqs,
                                    const kite_engine_stats *before, int64_t steps, int64_t ahead, int64_t tokens) {
    const kite_engine_stats after = kite_engine_get_stats(r->engine);
    const int64_t ran = after.steps - before->steps, ran_ahead = after.steps_ahead - before->steps_ahead;
    const int64_t preempted = after.preemptions - before->preemptions;
    if (ran == steps && ran_ahead == ahead && preempted == 0 && r->tokens == tokens && r->finished == n_seqs &&
        r->finished_otherwise == 0 && kite_engine_idle(r->engine))
        return KITE_OK;
    return kite_fail(KITE_ERROR_CAPACITY,
                     "bench: %s (B=%d) ran %lld engine steps (%lld ahead, %lld preemptions), %lld tokens, %d of %d "
                     "requests ended (%d not by length); the row claims %lld steps (%lld ahead), %lld tokens",
                     test, n_seqs, (long long)ran, (long long)ran_ahead, (long long)preempted, (long long)r->tokens,
                     r->finished, n_seqs, r->finished_otherwise, (long long)steps, (long long)ahead, (long long)tokens);
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median, min and max over the repetitions; ms per step from the median time over steps_per_rep. */
static void summarize(bench_run *r, double steps_per_rep, kite_bench_row *row) {
    const int reps = r->params->repetitions;
    qsort(r->tok_s, (size_t)reps, sizeof(double), compare_doubles);
    qsort(r->seconds, (size_t)reps, sizeof(double), compare_doubles);
    row->tok_s = r->tok_s[reps / 2];
    row->tok_s_min = r->tok_s[0];
    row->tok_s_max = r->tok_s[reps - 1];
    row->ms_per_step = r->seconds[reps / 2] * 1e3 / steps_per_rep;
}

static void record(bench_run *r, int rep, double seconds, double tokens) {
    if (rep < 0) return; /* the warm-up */
    r->seconds[rep] = seconds;
    r->tok_s[rep] = tokens / seconds;
}

static kite_status time_prefill(bench_run *r, kite_bench_row *row) {
    const int32_t n_seqs = row->batch, n = row->n;
    const int32_t budget = prefill_step_budget(n), per_step = budget / n;
    const int64_t steps = (n_seqs + per_step - 1) / per_step;
    KITE_TRY(engine_set_step_token_budget(r->engine, budget));
    for (int rep = -1; rep < r->params->repetitions; rep++) {
        KITE_TRY(engine_reset_kv_cache(r->engine)); /* every repetition on the same blocks */
        KITE_TRY(submit_requests(r, n_seqs, n, 1, false));
        const kite_engine_stats before = kite_engine_get_stats(r->engine);
        const double t0 = seconds_now();
        for (int64_t k = 0; k < steps; k++)
            KITE_TRY(kite_engine_step(r->engine));
        const double t = seconds_now() - t0;
        KITE_TRY(check_repetition(r, row->test, n_seqs, &before, steps, 0, n_seqs));
        KITE_TRY(kite_engine_run(r->engine)); /* drops the finished requests */
        record(r, rep, t, (double)n_seqs * n);
    }
    summarize(r, 1.0, row);
    row->engine_steps = steps;
    return KITE_OK;
}

/* Bytes one decode step must read from device memory: every weight matrix once (the layers' linear weights
 * in bf16, or with --weights fp8 one byte each, their block scales not counted; the lm_head in bf16) plus the KV
 * of every sequence. Used to report the fraction of the bandwidth floor. */
static double decode_step_bytes(const backend *b, kite_weights weights_mode, int32_t n_seqs, int32_t context) {
    const qwen3_config *c = b->config;
    double hidden = c->hidden_size, q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    double per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * c->intermediate_size;
    const double linear_bytes = weights_mode == KITE_WEIGHTS_FP8 ? 1.0 : 2.0;
    double weights = linear_bytes * per_layer * c->n_layers + 2.0 * (double)c->vocab_size * hidden;
    double kv_bytes = (double)backend_kv_bytes_per_position(b) * context * n_seqs;
    return weights + kv_bytes;
}

static kite_status time_decode(bench_run *r, kite_bench_row *row) {
    const int32_t n_seqs = row->batch, n = row->n, depth = row->depth;
    const bool sampled = sampled_rows(r->params), fill = depth > 0;
    const int32_t prompt_length = fill ? depth : 1;
    const int64_t ahead = !sampled && r->overlap ? n - 1 : 0;
    KITE_TRY(engine_set_step_token_budget(r->engine, PREFILL_STEP_TOKENS));
    for (int rep = -1; rep < r->params->repetitions; rep++) {
        KITE_TRY(engine_reset_kv_cache(r->engine)); /* every repetition on the same blocks */
        engine_hold_decode(r->engine, fill);
        kite_status status = submit_requests(r, n_seqs, prompt_length, n + (fill ? 1 : 0), sampled);
        /* Every step reads at least one prompt token, so the contexts are full within depth x B steps. */
        for (int64_t k = 0; status == KITE_OK && fill && r->tokens < n_seqs; k++) {
            status =
                k < (int64_t)depth * n_seqs
                    ? kite_engine_step(r->engine)
                    : kite_fail(KITE_ERROR_CAPACITY, "bench: %s (B=%d): the contexts were not filled in %lld steps",
                                row->test, n_seqs, (long long)k);
        }
        engine_hold_decode(r->engine, false);
        KITE_TRY(status);
        const kite_engine_stats before = kite_engine_get_stats(r->engine);
        const int64_t tokens_before = r->tokens;
        const double t0 = seconds_now();
        for (int32_t k = 0; k < n; k++)
            KITE_TRY(kite_engine_step(r->engine));
        const double t = seconds_now() - t0;
        KITE_TRY(check_repetition(r, row->test, n_seqs, &before, n, ahead, tokens_before + (int64_t)n_seqs * n));
        KITE_TRY(kite_engine_run(r->engine));
        record(r, rep, t, (double)n_seqs * n);
    }
    summarize(r, (double)n, row);
    row->engine_steps = n;
    row->engine_steps_ahead = ahead;
    row->overlapped = !sampled && r->overlap;
    if (strcmp(r->target->ops->name, "cuda") == 0) {
        const double floor_s =
            decode_step_bytes(r->model->backend, r->model->weights_mode, n_seqs, depth + n / 2) / HBM_BYTES_PER_SECOND;
        row->hbm_floor_fraction = floor_s / (row->ms_per_step * 1e-3);
    }
    return KITE_OK;
}

/* The gate of one row on KV blocks lent by the engine; they go back whatever happens. */
static kite_status gate_row(bench_run *r, const kite_bench_row *row, gate_result *g) {
    if (!r->gate) {
        *g = (gate_result){.passed = true};
        return KITE_OK;
    }
    int32_t seqs = 0, positions = 0;
    if (row->is_decode)
        bench_gate_decode_shape(row->batch, row->depth, &seqs, &positions);
    else
        bench_gate_prefill_shape(row->batch, row->n, &seqs, &positions);
    const int32_t per_seq = (positions + r->block_size - 1) / r->block_size;
    KITE_TRY(engine_lend_blocks(r->engine, seqs * per_seq, r->lent));
    for (int32_t s = 0; s < seqs; s++)
        r->tables[s] = r->lent + (size_t)s * per_seq;
    const kite_status status =
        row->is_decode ? bench_gate_decode(r->gate, r->target, r->tables, row->batch, row->depth, &r->rng, g)
                       : bench_gate_prefill(r->gate, r->target, r->tables, row->batch, row->n, &r->rng, g);
    engine_return_blocks(r->engine, r->lent, seqs * per_seq);
    return status;
}

static kite_status run_row(bench_run *r, kite_bench_row *row, kite_bench_row_callback on_row, void *user_data) {
    snprintf(row->test, sizeof row->test, "%s%d", row->is_decode ? "tg" : "pp", row->n);
    gate_result g;
    KITE_TRY(gate_row(r, row, &g));
    row->gate_passed = g.passed;
    row->gate_rel_l2 = g.worst_rel_l2;
    row->gate_bf16_budget = g.worst_bf16_budget;
    row->gate_near_ties = g.near_ties;
    snprintf(row->gate_why, sizeof row->gate_why, "%s", g.passed ? "" : g.why);
    if (g.passed) KITE_TRY(row->is_decode ? time_decode(r, row) : time_prefill(r, row));
    if (on_row) on_row(row, user_data);
    return KITE_OK;
}

static kite_status run_rows(bench_run *r, kite_bench_row_callback on_row, void *user_data) {
    const kite_bench_params *p = r->params;
    for (size_t bi = 0; bi < p->n_batch; bi++)
        for (size_t i = 0; i < p->n_prefill; i++) {
            kite_bench_row row = {.is_decode = false, .n = p->prefill[i], .batch = p->batch[bi]};
            KITE_TRY(run_row(r, &row, on_row, user_data));
        }
    for (size_t d = 0; d < p->n_depth; d++)
        for (size_t bi = 0; bi < p->n_batch; bi++)
            for (size_t i = 0; i < p->n_decode; i++) {
                kite_bench_row row = {
                    .is_decode = true, .n = p->decode[i], .batch = p->batch[bi], .depth = p->depth[d]};
                KITE_TRY(run_row(r, &row, on_row, user_data));
            }
    return KITE_OK;
}

/* The engine every row fits in: exactly the KV blocks of max_batch sequences of plan.positions. */
static kite_status create_engine(bench_run *r) {
    kite_engine_params ep = kite_engine_params_default();
    const int32_t per_seq = (r->plan.positions + ep.kv_block_size - 1) / ep.kv_block_size;
    ep.max_sequences = r->plan.max_batch;
    ep.max_step_tokens = r->plan.step_tokens;
    ep.max_context = r->plan.max_context;
    ep.prefix_cache = r->params->prefix_cache;
    ep.kv_cache_bytes = (size_t)r->plan.max_batch * (size_t)per_seq * engine_kv_block_bytes(r->model, ep.kv_block_size);
    KITE_TRY(kite_engine_create(r->model, &ep, &r->engine));
    const kite_engine_stats stats = kite_engine_get_stats(r->engine);
    if (stats.max_context < r->plan.max_context)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench params: rows need a context of %d, the engine allows %d",
                         r->plan.max_context, stats.max_context);
    r->block_size = stats.kv_block_size;
    return KITE_OK;
}

static bool same_shape(const qwen3_config *a, const qwen3_config *b) {
    return a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
           a->intermediate_size == b->intermediate_size && a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim;
}

kite_status bench_run_with_reference(kite_model *model, const kite_model *reference, const kite_bench_params *params,
                                     kite_bench_row_callback on_row, void *user_data) {
    if (!model) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_bench_run: no model");
    const kite_bench_params defaults = kite_bench_params_default();
    bench_run r = {.model = model, .target = model->backend, .params = params ? params : &defaults};
    KITE_TRY(plan_rows(model, r.params, &r.plan));
    if (reference && !same_shape(&reference->config, &model->config))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "bench: the reference model's shape is not the model's");
    runtime_options options;
    KITE_TRY(options_read(&options));
    r.overlap = engine_overlap_enabled(&options, r.target);
    r.rng = r.params->seed ^ 0x5eedull;
    kite_status status = create_engine(&r);
    if (status == KITE_OK && reference)
        status = bench_gate_create(&model->config, reference->weights, model->weights_mode, r.block_size,
                                   model->backend->kv_cache_dtype, &r.gate);
    if (status == KITE_OK) {
        const int reps = r.params->repetitions;
        const int32_t lent_max = r.plan.max_batch * ((r.plan.positions + r.block_size - 1) / r.block_size);
        r.prompt = malloc((size_t)(r.plan.longest_prompt > 0 ? r.plan.longest_prompt : 1) * sizeof(int32_t));
        r.lent = malloc((size_t)lent_max * sizeof(int32_t));
        r.tables = malloc((size_t)r.plan.max_batch * sizeof(int32_t *));
        r.seconds = malloc((size_t)reps * sizeof(double));
        r.tok_s = malloc((size_t)reps * sizeof(double));
        if (!r.prompt || !r.lent || !r.tables || !r.seconds || !r.tok_s)
            status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "bench: out of memory");
    }
    if (status == KITE_OK) status = run_rows(&r, on_row, user_data);
    kite_engine_free(r.engine);
    bench_gate_free(r.gate);
    free(r.prompt);
    free(r.lent);
    free(r.tables);
    free(r.seconds);
    free(r.tok_s);
    return status;
}

kite_status kite_bench_run(kite_model *model, const kite_bench_params *params, kite_bench_row_callback on_row,
                           void *user_data) {
    if (!model) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_bench_run: no model");
    /* The CPU backend is the oracle: its rows have nothing to be compared with. */
    const bool oracle = strcmp(model->backend->ops->name, "cpu") == 0;
    return bench_run_with_reference(model, oracle ? NULL : model, params, on_row, user_data);
}

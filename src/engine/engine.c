/* The engine: continuous batching over a paged KV cache, with automatic prefix caching.
 *
 * Prefix caching (kv_cache.h; docs/ARCHITECTURE.md): a request being admitted takes the longest chain of cached
 * full blocks that begins its tokens (take_cached_prefix) and computes only the rest; after each step the full
 * blocks it computed are registered (cache_full_blocks) for later requests. Blocks are reference counted and
 * shared read-only; a released registered block stays cached until the pool needs it.
 *
 * Each step the scheduler (schedule_step) gives every decoding request its one token first, then the next
 * chunk of prompts being read, then admits waiting requests while the token budget (the chunked-prefill
 * size), the sequence limit and the free blocks allow: a long prompt never stalls generating sequences. When the cache is full, the most recently
 * admitted running request is preempted: its blocks are freed and it goes back to the queue to be
 * recomputed later (as vLLM does), so nothing ever crashes or produces wrong tokens for lack of memory.
 * One backend forward then serves the whole step; sequences whose prompt is complete get a token sampled.
 *
 * Overlapped greedy decode: while the same greedy requests keep decoding (nothing waiting, no prompt being
 * read, no length limit at the next token, no insertion awaiting its trigger), a step enqueues the next one
 * before it reads its own ids, the next step's tokens taken on the device from this step's argmax
 * (step_batch.tokens_from_argmax). The host's
 * round trip between steps (the ids' copy, the wait, the next step's setup and launch: 20-28 us per step on
 * the H200) then overlaps the device's work. The step in flight is
 * resolved at the next kite_engine_step; a row whose request finished or was cancelled meanwhile is dropped.
 * KITE_ENGINE_OVERLAP=0 turns it off.
 *
 * An insertion (kite_request.insert_ids): the step that samples its trigger appends the ids after it
 * (request_append_token), so the request has more than one token to compute and is scheduled as a prompt being
 * read: in chunks, registered in the prefix cache, recomputed when preempted, with logits only at its end.
 *
 * Greedy steps (every row greedy, no logprobs) ask the backend for ids only (step_batch.ids_only): the rows are read by
 * argmax alone, and the CUDA backend then screens the lm_head instead of writing every logit (lm_head_screen.cu).
 *
 * A row of logits that allows no token (a NaN or +inf in it, or no finite logit: damaged weights or activations)
 * ends its own request with KITE_FINISH_ERROR and a message; the step goes on for the other rows, which are
 * computed apart from it. Whoever reads the row already looks at every logit (the argmax, the backend's top-k
 * reduction with its bad_index, the sampler's validation), so the engine's part is one comparison a row.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine_internal.h"
#include "engine/kv_cache.h"
#include "engine/reduced_sampling.h"
#include "engine/request.h"
#include "util/options.h"
#include "kite.h"
#include "model/model.h"
#include "util/error.h"
#include "util/parallel.h"

struct kite_engine {
    kite_model *model;
    kite_engine_params params;
    bool attached; /* this engine holds the model's KV cache */
    int32_t max_context;
    kv_block_pool pool;

    engine_request **requests; /* waiting and running, in arrival order (preempted ones keep their place) */
    int32_t n_requests, requests_capacity;
    kite_request_id next_id;

    /* Per-step scratch, sized for max_sequences / max_step_tokens. */
    engine_request **step_requests;
    int32_t *step_new_tokens;
    int32_t *token_ids;
    int32_t *seq_token_start;
    int32_t *seq_context_len;
    const int32_t **block_tables;
    uint8_t *wants_logits;
    /* Per row of logits (sequences that sample this step, in order): */
    engine_request **row_requests;
    int32_t *sampled;
    float *sampled_logprob;
    int32_t *top_ids;      /* rows x KITE_MAX_LOGPROBS */
    float *top_logprobs;   /* rows x KITE_MAX_LOGPROBS */
    float *logits;         /* rows x vocab, only when some row needs host sampling */
    int32_t logits_rows;   /* rows the buffer holds */
    /* Rows reduced by the backend for top-k / greedy sampling (reduced_sampling.h): */
    bool reduced_sampling; /* KITE_ENGINE_REDUCED_SAMPLING=0 turns it off (tests compare both ways) */
    reduced_rows reduced;
    sampler **row_samplers; /* row_requests' samplers */
    /* A row that allows no token (a NaN or +inf, or no finite logit) has sampled[row] BACKEND_NO_TOKEN and says
     * why here; take_tokens ends its request with KITE_FINISH_ERROR and that message. */
    row_error *row_errors;

    int64_t steps, preemptions, steps_ahead;
    int64_t prefix_queried_tokens, prefix_hit_tokens; /* kite_engine_stats.prefix_cache_* */
    kite_engine_timings timings;

    /* Hooks for the benchmark (engine_internal.h): */
    int32_t step_token_budget; /* new tokens per step, at most params.max_step_tokens (what the buffers hold) */
    int32_t lent_blocks;       /* blocks of the pool lent out by engine_lend_blocks */
    bool hold_decode;          /* engine_hold_decode */

    /* Overlapped greedy decode (see the top): */
    bool overlap;                    /* the backend offers it and KITE_ENGINE_OVERLAP is not 0 */
    int32_t ahead_rows;              /* > 0: a step is in flight, its argmax begun and not read */
    engine_request **ahead_requests; /* its rows' requests, in row order (not freed while it is in flight) */

    atomic_bool in_call; /* kite_engine_submit, _cancel, _step or _run is running (engine_enter) */
};

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* KV blocks of 128 positions: measured on the H200 (0.6B, cuda_forward_bench --block-size) against
 * 16, batched decode B=8 -6% per step (the bulk-fed attention copies one run per tile instead of two and its
 * producer walks a shorter table), single stream -2% at depth 256, nothing slower; a sequence wastes less than
 * one block. */
kite_engine_params kite_engine_params_default(void) {
    return (kite_engine_params){.max_sequences = 256, .max_step_tokens = 2048, .kv_cache_bytes = 0,
                                .kv_cache_fraction = 0.9f, .max_context = 0, .kv_block_size = 128,
                                .prefix_cache = true};
}

kite_request kite_request_default(void) {
    kite_request r;
    memset(&r, 0, sizeof r);
    r.sampling = kite_sampling_default();
    return r;
}

/* Physical memory of this host, or 0 when the system does not say. */
static size_t host_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_size <= 0) return 0;
    if ((unsigned long)pages > SIZE_MAX / (unsigned long)page_size) return SIZE_MAX;
    return (size_t)pages * (size_t)page_size;
}

/* How many KV blocks to make: an explicit byte budget, else a fraction of free device memory, else (the
 * host backend) room for four sequences of the full context, at most 4 GiB. An explicit budget is checked
 * against the memory that is to hold it before anything is sized by it, so a huge one (or a wrapped
 * negative one) is refused at the cost of a comparison, not after building a free list of a billion ids. */
static kite_status choose_kv_blocks(kite_engine *e, int32_t *n_blocks) {
    backend *b = e->model->backend;
    size_t block_bytes = engine_kv_block_bytes(e->model, e->params.kv_block_size);
    size_t budget = e->params.kv_cache_bytes;
    size_t free_bytes = 0, total_bytes = 0;
    KITE_TRY(b->ops->memory_info(b, &free_bytes, &total_bytes));
    if (budget > 0) {
        size_t room = total_bytes > 0 ? free_bytes : host_memory_bytes();
        if (room > 0 && budget > room)
            return kite_fail(KITE_ERROR_CAPACITY,
                             "engine params: kv_cache_bytes %zu is more than the %zu bytes of %s memory", budget, room,
                             total_bytes > 0 ? "free device" : "host");
    } else {
        if (total_bytes > 0) {
            budget = (size_t)((double)free_bytes * (double)e->params.kv_cache_fraction);
        } else {
            size_t blocks_per_sequence = ((size_t)e->max_context + (size_t)e->params.kv_block_size - 1) /
                                         (size_t)e->params.kv_block_size;
            size_t want = block_bytes * blocks_per_sequence * 4;
            size_t cap = (size_t)4 << 30;
            budget = want < cap ? want : cap;
        }
    }
    size_t blocks = budget / block_bytes;
    if (blocks > INT32_MAX / 2) blocks = INT32_MAX / 2;
    if (blocks < 1)
        return kite_fail(KITE_ERROR_CAPACITY, "kv cache: a budget of %zu bytes holds not even one block of %zu bytes",
                         budget, block_bytes);
    *n_blocks = (int32_t)blocks;
    return KITE_OK;
}

kite_status kite_engine_create(kite_model *model, const kite_engine_params *params, kite_engine **out) {
    *out = NULL;
    if (model->engine_attached)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "this model already has an engine; free it first");
    kite_engine_params p = params ? *params : kite_engine_params_default();
    if (p.max_sequences <= 0 || p.max_step_tokens <= 0 || p.kv_block_size <= 0 || p.kv_cache_fraction <= 0.0f ||
        p.kv_cache_fraction > 1.0f || p.max_context < 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "engine params: max_sequences, max_step_tokens and kv_block_size must be positive, "
                         "kv_cache_fraction in (0, 1], max_context >= 0");
    if (p.max_step_tokens < p.max_sequences) p.max_step_tokens = p.max_sequences; /* every sequence gets a token */
    /* The model's context limit (config.json's, YaRN's, or kite_load_params.max_context's): an engine may
     * only lower it, since the backend's RoPE table ends there. */
    const int32_t model_limit = qwen3_context_limit(&model->config);
    if (p.max_context > model_limit)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "engine params: max_context %d is above the model's context limit %d (raise that with "
                         "YaRN rope scaling: --rope-scaling / kite_load_params.rope_scaling)",
                         p.max_context, model_limit);
    runtime_options options;
    KITE_TRY(options_read(&options));
    kite_engine *e = calloc(1, sizeof *e);
    if (!e) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "out of memory");
    atomic_init(&e->in_call, false);
    e->model = model;
    e->params = p;
    e->max_context = p.max_context > 0 ? p.max_context : model_limit;
    e->next_id = 1;
    e->step_token_budget = p.max_step_tokens;

    int32_t n_blocks = 0;
    kite_status status = choose_kv_blocks(e, &n_blocks);
    if (status == KITE_OK) status = kv_pool_init(&e->pool, n_blocks, p.kv_block_size, p.prefix_cache);
    if (status == KITE_OK) status = model->backend->ops->kv_reserve(model->backend, n_blocks, p.kv_block_size);
    size_t seqs = (size_t)p.max_sequences, toks = (size_t)p.max_step_tokens;
    if (status == KITE_OK) {
        e->step_requests = calloc(seqs, sizeof *e->step_requests);
        e->step_new_tokens = calloc(seqs, sizeof(int32_t));
        e->token_ids = calloc(toks, sizeof(int32_t));
        e->seq_token_start = calloc(seqs + 1, sizeof(int32_t));
        e->seq_context_len = calloc(seqs, sizeof(int32_t));
        e->block_tables = calloc(seqs, sizeof *e->block_tables);
        e->wants_logits = calloc(seqs, 1);
        e->row_requests = calloc(seqs, sizeof *e->row_requests);
        e->sampled = calloc(seqs, sizeof(int32_t));
        e->sampled_logprob = calloc(seqs, sizeof(float));
        e->top_ids = calloc(seqs * KITE_MAX_LOGPROBS, sizeof(int32_t));
        e->top_logprobs = calloc(seqs * KITE_MAX_LOGPROBS, sizeof(float));
        e->row_samplers = calloc(seqs, sizeof *e->row_samplers);
        e->row_errors = calloc(seqs, sizeof *e->row_errors);
        e->ahead_requests = calloc(seqs, sizeof *e->ahead_requests);
        e->overlap = engine_overlap_enabled(&options, model->backend);
        e->reduced_sampling = options.engine_reduced_sampling != 0;
        if (!e->step_requests || !e->step_new_tokens || !e->token_ids || !e->seq_token_start || !e->seq_context_len ||
            !e->block_tables || !e->wants_logits || !e->row_requests || !e->sampled || !e->sampled_logprob ||
            !e->top_ids || !e->top_logprobs || !e->row_samplers || !e->row_errors || !e->ahead_requests)
            status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "engine: out of memory");
    }
    if (status == KITE_OK) status = reduced_rows_alloc(&e->reduced, (int32_t)seqs);
    if (status != KITE_OK) {
        kite_engine_free(e);
        return status;
    }
    model->engine_attached = true;
    e->attached = true;
    *out = e;
    return KITE_OK;
}

void kite_engine_free(kite_engine *e) {
    if (!e) return;
    if (e->ahead_rows > 0) { /* the step in flight: its ids are read and dropped, so the backend has none pending */
        backend *b = e->model->backend;
        kite_status ignored = b->ops->argmax_end(b, e->sampled, e->ahead_rows);
        (void)ignored;
    }
    for (int32_t i = 0; i < e->n_requests; i++) request_free(e->requests[i]);
    free(e->requests);
    kv_pool_destroy(&e->pool);
    free(e->step_requests);
    free(e->step_new_tokens);
    free(e->token_ids);
    free(e->seq_token_start);
    free(e->seq_context_len);
    free(e->block_tables);
    free(e->wants_logits);
    free(e->row_requests);
    free(e->sampled);
    free(e->sampled_logprob);
    free(e->logits);
    free(e->top_ids);
    free(e->top_logprobs);
    reduced_rows_free(&e->reduced);
    free(e->row_samplers);
    free(e->row_errors);
    free(e->ahead_requests);
    if (e->attached) e->model->engine_attached = false;
    free(e);
}

/* ---- requests ------------------------------------------------------------------------------------ */

static bool grow_block_table(engine_request *r, int32_t needed);

static void emit_event(engine_request *r, int32_t token, float logprob, int32_t n_top, const int32_t *top_ids,
                       const float *top_logprobs, const char *error) {
    const char *text;
    size_t length;
    request_take_text(r, &text, &length);
    if (r->finish != KITE_FINISH_NONE) r->finish_reported = true;
    const int32_t n_inserted = r->n_just_inserted; /* the insertion this token brought, reported once */
    r->n_just_inserted = 0;
    if (!r->on_token) return;
    kite_token_event event = {.request = r->id, .token = token, .text = text, .text_length = length,
                              .logprob = logprob, .n_top = n_top, .top_ids = top_ids,
                              .top_logprobs = top_logprobs, .finish = r->finish, .error = error,
                              .inserted_ids = n_inserted > 0 ? r->insert_ids : NULL, .n_inserted = n_inserted};
    r->on_token(&event, r->user_data);
}

/* The blocks go back last first, so that the next request to take as many gets the same table in the same order:
 * a repeated request (a benchmark's repetitions) runs on the same cache addresses every time. Cached ones join
 * the LRU list in that order too, so a sequence's later blocks are evicted before its earlier ones, which
 * more requests share (vLLM's free_blocks does the same). */
static void release_blocks(kite_engine *e, engine_request *r) {
    for (int32_t i = r->n_blocks - 1; i >= 0; i--) kv_pool_release(&e->pool, r->block_table[i]);
    r->n_blocks = 0;
    r->n_hashed_blocks = 0;
    r->prefix_serial = 0;
}

/* Registers r's full blocks whose keys and values are computed (and whose tokens are known: a step run ahead
 * computes a position before its token reaches the host) in the prefix cache, so later requests may share them. */
static void cache_full_blocks(kite_engine *e, engine_request *r) {
    if (!e->pool.caching) return;
    const size_t known = r->n_computed < r->n_tokens ? r->n_computed : r->n_tokens;
    const size_t block_size = (size_t)e->pool.block_size;
    while ((size_t)(r->n_hashed_blocks + 1) * block_size <= known) {
        const int32_t i = r->n_hashed_blocks;
        r->prefix_serial =
            kv_pool_register(&e->pool, r->block_table[i], r->prefix_serial, r->tokens + (size_t)i * block_size);
        r->n_hashed_blocks++;
    }
}

/* Takes for a request being admitted (nothing in the cache yet) the longest chain of cached blocks that begins
 * its tokens, and counts them as computed. At most (n_tokens - 1) / block_size blocks: at least one token is
 * always computed, so the request gets logits (a prompt that hits whole recomputes its last block into a block
 * of its own). release_blocks gives them back if the admission fails. */
static kite_status take_cached_prefix(kite_engine *e, engine_request *r) {
    if (!e->pool.caching) return KITE_OK;
    const size_t block_size = (size_t)e->pool.block_size;
    const int32_t most = (int32_t)((r->n_tokens - 1) / block_size);
    for (int32_t i = 0; i < most; i++) {
        const int32_t id = kv_pool_lookup(&e->pool, r->prefix_serial, r->tokens + (size_t)i * block_size);
        if (id < 0) break;
        if (!grow_block_table(r, i + 1)) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "engine: out of memory");
        kv_pool_acquire(&e->pool, id);
        r->block_table[r->n_blocks++] = id;
        r->n_hashed_blocks++;
        r->prefix_serial = e->pool.serial[id];
    }
    r->n_computed = (size_t)r->n_hashed_blocks * block_size;
    return KITE_OK;
}

/* Ends a request that produced no token this step (cancel, capacity, error: `error` is then the message) with a
 * final event. */
static void finish_without_token(kite_engine *e, engine_request *r, kite_finish_reason reason, const char *error) {
    r->finish = reason;
    r->state = REQUEST_FINISHED;
    release_blocks(e, r);
    emit_event(r, -1, 0.0f, 0, NULL, NULL, error);
}

/* One public call at a time on an engine (kite.h, Threads): a callback that calls into its own engine, or a
 * second thread, is refused here instead of changing the requests and buffers of the step in progress. The
 * flag is taken with an atomic exchange, so of two threads at most one is ever inside. */
static kite_status engine_enter(kite_engine *e, const char *function) {
    if (!e) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "%s: no engine", function);
    if (atomic_exchange_explicit(&e->in_call, true, memory_order_acquire))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "%s: the engine is inside another call (from one of its callbacks, or on another thread); "
                         "an engine takes one call at a time",
                         function);
    return KITE_OK;
}

static kite_status engine_leave(kite_engine *e, kite_status status) {
    atomic_store_explicit(&e->in_call, false, memory_order_release);
    return status;
}

static kite_status engine_submit(kite_engine *e, const kite_request *desc, kite_request_id *id) {
    if (id) *id = 0;
    if (!desc) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_engine_submit: no request");
    if (e->lent_blocks > 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_engine_submit: %d KV blocks are lent out (engine_lend_blocks)",
                         e->lent_blocks);
    const int32_t *prompt = desc->prompt_ids;
    size_t n_prompt = desc->n_prompt_ids;
    int32_t *encoded = NULL;
    if (!prompt) {
        if (!desc->prompt_text) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "request: no prompt ids and no prompt text");
        KITE_TRY(kite_tokenize(e->model, desc->prompt_text, desc->prompt_text_length, &encoded, &n_prompt));
        prompt = encoded;
    }
    /* A prompt that fills the context leaves no position for a generated token: it is refused before any work,
     * with the way to a longer context. */
    if (n_prompt >= (size_t)e->max_context) {
        free(encoded);
        const int32_t config_limit = e->model->config_context_limit;
        char raise[200] = "";
        if (e->max_context < config_limit)
            snprintf(raise, sizeof raise, "--max-context / kite_load_params.max_context up to the model's %d, or ",
                     config_limit);
        return kite_fail(KITE_ERROR_CAPACITY,
                         "request: the prompt has %zu tokens but the context limit is %d (a prompt may have at most "
                         "%d, leaving room for one generated token); raise the limit with %sYaRN rope scaling "
                         "(--rope-scaling / kite_load_params.rope_scaling)",
                         n_prompt, e->max_context, e->max_context - 1, raise);
    }
    if (e->n_requests == e->requests_capacity) {
        int32_t grown = e->requests_capacity ? e->requests_capacity * 2 : 16;
        engine_request **p = realloc(e->requests, (size_t)grown * sizeof *p);
        if (!p) {
            free(encoded);
            return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "engine: out of memory");
        }
        e->requests = p;
        e->requests_capacity = grown;
    }
    engine_request *r;
    kite_status status = request_create(desc, prompt, n_prompt, e->model->config.vocab_size, e->model->config.eos_ids,
                                        e->model->config.n_eos_ids, e->model->tokenizer, e->next_id, &r);
    free(encoded);
    if (status != KITE_OK) return status;
    e->next_id++;
    e->requests[e->n_requests++] = r;
    if (id) *id = r->id;
    /* A prompt the whole KV cache cannot hold ends at once with a clear reason instead of waiting forever. */
    if (kv_blocks_for(&e->pool, (int64_t)r->n_prompt + 1) > e->pool.n_blocks)
        finish_without_token(e, r, KITE_FINISH_CAPACITY, NULL);
    return KITE_OK;
}

kite_status kite_engine_submit(kite_engine *e, const kite_request *desc, kite_request_id *id) {
    if (id) *id = 0;
    KITE_TRY(engine_enter(e, "kite_engine_submit"));
    return engine_leave(e, engine_submit(e, desc, id));
}

static kite_status engine_cancel(kite_engine *e, kite_request_id id) {
    for (int32_t i = 0; i < e->n_requests; i++) {
        engine_request *r = e->requests[i];
        if (r->id != id) continue;
        if (r->state != REQUEST_FINISHED) finish_without_token(e, r, KITE_FINISH_CANCELLED, NULL);
        return KITE_OK;
    }
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_engine_cancel: no active request %lld", (long long)id);
}

kite_status kite_engine_cancel(kite_engine *e, kite_request_id id) {
    KITE_TRY(engine_enter(e, "kite_engine_cancel"));
    return engine_leave(e, engine_cancel(e, id));
}

/* Drops finished requests, keeping the arrival order of the rest. */
static void remove_finished(kite_engine *e) {
    int32_t kept = 0;
    for (int32_t i = 0; i < e->n_requests; i++) {
        engine_request *r = e->requests[i];
        if (r->state == REQUEST_FINISHED) {
            release_blocks(e, r);
            request_free(r);
        } else {
            e->requests[kept++] = r;
        }
    }
    e->n_requests = kept;
}

bool kite_engine_idle(const kite_engine *e) {
    if (e->ahead_rows > 0) return false; /* a step in flight is resolved by the next kite_engine_step */
    for (int32_t i = 0; i < e->n_requests; i++)
        if (e->requests[i]->state != REQUEST_FINISHED) return false;
    return true;
}

/* ---- scheduling ---------------------------------------------------------------------------------- */

static bool grow_block_table(engine_request *r, int32_t needed) {
    if (needed <= r->block_table_capacity) return true;
    int32_t grown = r->block_table_capacity ? r->block_table_capacity : 8;
    while (grown < needed) grown *= 2;
    int32_t *p = realloc(r->block_table, (size_t)grown * sizeof(int32_t));
    if (!p) return false;
    r->block_table = p;
    r->block_table_capacity = grown;
    return true;
}

/* Gives r enough blocks for n_positions; false (taking nothing) when the pool is short. */
static kite_status ensure_blocks(kite_engine *e, engine_request *r, int64_t n_positions, bool *ok) {
    int32_t needed = kv_blocks_for(&e->pool, n_positions);
    *ok = false;
    if (needed - r->n_blocks > kv_pool_available(&e->pool)) return KITE_OK;
    if (!grow_block_table(r, needed)) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "engine: out of memory");
    while (r->n_blocks < needed) kv_pool_take(&e->pool, &r->block_table[r->n_blocks++]);
    *ok = true;
    return KITE_OK;
}

/* The latest-arrived running request other than `keep`, to preempt; NULL if none. */
static engine_request *preemption_victim(kite_engine *e, const engine_request *keep) {
    for (int32_t i = e->n_requests - 1; i >= 0; i--) {
        engine_request *r = e->requests[i];
        if (r != keep && r->state == REQUEST_RUNNING) return r;
    }
    return NULL;
}

static void preempt(kite_engine *e, engine_request *r) {
    release_blocks(e, r);
    r->n_computed = 0; /* everything, generated tokens included, is recomputed on readmission */
    r->state = REQUEST_WAITING;
    e->preemptions++;
}

/* Which requests a scheduling phase looks at: decoding ones first, so that a long prompt being read in
 * chunks never stalls sequences that are already generating, then prompts being read, then new or
 * preempted requests in arrival order. */
typedef enum schedule_phase { PHASE_DECODE, PHASE_PREFILL, PHASE_ADMIT } schedule_phase;

static bool in_phase(const engine_request *r, schedule_phase phase) {
    size_t remaining = r->n_tokens - r->n_computed;
    switch (phase) {
    case PHASE_DECODE: return r->state == REQUEST_RUNNING && remaining == 1;
    case PHASE_PREFILL: return r->state == REQUEST_RUNNING && remaining > 1;
    case PHASE_ADMIT: return r->state == REQUEST_WAITING;
    }
    return false;
}

/* Fills the step arrays; returns the number of sequences scheduled. */
static kite_status schedule_step(kite_engine *e, int32_t *n_scheduled) {
    int32_t n = 0, budget = e->step_token_budget;
    for (schedule_phase phase = PHASE_DECODE; phase <= PHASE_ADMIT; phase++) {
        if (phase == PHASE_DECODE && e->hold_decode) continue;
        for (int32_t i = 0; i < e->n_requests && n < e->params.max_sequences && budget > 0; i++) {
            engine_request *r = e->requests[i];
            if (!in_phase(r, phase)) continue;
            if (phase == PHASE_ADMIT) KITE_TRY(take_cached_prefix(e, r));
            const size_t hit_tokens = r->n_computed;
            size_t remaining = r->n_tokens - r->n_computed;
            int32_t chunk = remaining < (size_t)budget ? (int32_t)remaining : budget;
            bool ok = false;
            for (;;) {
                KITE_TRY(ensure_blocks(e, r, (int64_t)r->n_computed + chunk, &ok));
                if (ok || phase == PHASE_ADMIT) break;
                /* A running request that cannot grow frees room by preempting the newest other one;
                 * if it is the only one left, it waits itself. */
                engine_request *victim = preemption_victim(e, r);
                if (!victim) break;
                bool victim_scheduled = false;
                for (int32_t k = 0; k < n; k++) victim_scheduled |= e->step_requests[k] == victim;
                if (victim_scheduled) break;
                preempt(e, victim);
            }
            if (!ok) {
                if (phase == PHASE_ADMIT) { /* keep arrival order: later requests wait behind this one */
                    release_blocks(e, r); /* the cached blocks it took, for the next try */
                    r->n_computed = 0;
                    break;
                }
                preempt(e, r);
                continue;
            }
            if (phase == PHASE_ADMIT && e->pool.caching) {
                e->prefix_queried_tokens += (int64_t)r->n_tokens;
                e->prefix_hit_tokens += (int64_t)hit_tokens;
            }
            r->state = REQUEST_RUNNING;
            e->step_requests[n] = r;
            e->step_new_tokens[n] = chunk;
            n++;
            budget -= chunk;
        }
    }
    *n_scheduled = n;
    return KITE_OK;
}

/* ---- one step ------------------------------------------------------------------------------------ */

static kite_status ensure_logits_rows(kite_engine *e, int32_t rows) {
    if (rows <= e->logits_rows) return KITE_OK;
    size_t vocab = (size_t)e->model->config.vocab_size;
    float *p = realloc(e->logits, (size_t)rows * vocab * sizeof(float));
    if (!p) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "engine: out of memory for %d rows of logits", rows);
    e->logits = p;
    e->logits_rows = rows;
    return KITE_OK;
}

/* Samples every row from the backend's reduction of it (reduced_sampling.h) when no request asks for top
 * logprobs (they need the whole row); *sampled false otherwise, nothing drawn. */
static kite_status sample_rows_reduced(kite_engine *e, int32_t rows, bool *sampled) {
    *sampled = false;
    if (!e->reduced_sampling) return KITE_OK;
    for (int32_t row = 0; row < rows; row++) {
        if (e->row_requests[row]->n_logprobs > 0) return KITE_OK;
        e->row_samplers[row] = e->row_requests[row]->sampler;
    }
    return sample_reduced_rows(e->model->backend, e->row_samplers, rows, &e->reduced, e->sampled, e->sampled_logprob,
                               e->row_errors, sampled);
}

/* One row sampled from its whole logits (and its top logprobs computed, when the request asks). */
static kite_status sample_whole_row(void *context, int32_t row) {
    kite_engine *e = context;
    const size_t vocab = (size_t)e->model->config.vocab_size;
    engine_request *r = e->row_requests[row];
    const float *logits = e->logits + (size_t)row * vocab;
    kite_status status = sampler_sample(r->sampler, logits, &e->sampled[row], &e->sampled_logprob[row]);
    if (status == KITE_OK && r->n_logprobs > 0)
        status = sampler_top_logprobs(logits, (int32_t)vocab, r->n_logprobs,
                                      e->top_ids + (size_t)row * KITE_MAX_LOGPROBS,
                                      e->top_logprobs + (size_t)row * KITE_MAX_LOGPROBS);
    if (status != KITE_ERROR_INVALID_INPUT) return status;
    /* The sampler refuses a row that allows no token (a NaN or +inf, every logit -inf, or min_tokens masking every
     * finite one): only this row's request ends. The message is this thread's, so it is taken here. */
    row_error_set(&e->row_errors[row], "%s", kite_last_error());
    e->sampled[row] = BACKEND_NO_TOKEN;
    return KITE_OK;
}

/* Samples every row of logits with its request's sampler. Rows are independent (each request owns its
 * sampler and random generator), so they run in parallel: a full-vocabulary sampling pass costs about a
 * millisecond, which a large batch would otherwise pay once per sequence on one core. */
static kite_status sample_rows(kite_engine *e, int32_t rows) { return kite_parallel_for(rows, sample_whole_row, e); }

/* The sampled tokens of one step's rows join their requests (text, stop checks) and go to the callbacks, in row
 * order. A row whose request is no longer running (cancelled, or ended by a token while this step ran ahead)
 * is dropped. Returns the rows taken. */
static kite_status take_tokens(kite_engine *e, engine_request *const *row_requests, int32_t rows,
                               bool sampled_on_host, int32_t *taken) {
    *taken = 0;
    for (int32_t row = 0; row < rows; row++) {
        engine_request *r = row_requests[row];
        if (r->state != REQUEST_RUNNING) continue;
        int32_t token = e->sampled[row];
        if (token == BACKEND_NO_TOKEN) { /* this row's logits allow no token: its request ends, the others go on */
            finish_without_token(e, r, KITE_FINISH_ERROR, e->row_errors[row].message);
            continue;
        }
        KITE_TRY(request_append_token(r, token, e->model->config.eos_ids, e->model->config.n_eos_ids,
                                      (size_t)e->max_context));
        cache_full_blocks(e, r); /* a step run ahead computed this token's position before the token came */
        if (r->finish != KITE_FINISH_NONE) {
            r->state = REQUEST_FINISHED;
            release_blocks(e, r); /* a finished request's blocks are free for the next step */
        }
        emit_event(r, token, sampled_on_host ? e->sampled_logprob[row] : NAN, sampled_on_host ? r->n_logprobs : 0,
                   e->top_ids + (size_t)row * KITE_MAX_LOGPROBS, e->top_logprobs + (size_t)row * KITE_MAX_LOGPROBS,
                   NULL);
        (*taken)++;
    }
    return KITE_OK;
}

/* Takes the status of the argmax (or argmax_end) that wrote rows [0, rows) of e->sampled. A row that allows no
 * token is BACKEND_NO_TOKEN there, the call failing with KITE_ERROR_INVALID_INPUT (backend.h): it gets its message
 * (the backend's reason, where it keeps one) and take_tokens ends only its request. Any other failure is the step's.
 * The rows are looked at only after such a failure, so a healthy step pays nothing. */
static kite_status accept_greedy_ids(kite_engine *e, kite_status status, int32_t rows) {
    if (status != KITE_ERROR_INVALID_INPUT) return status;
    backend *b = e->model->backend;
    bool any = false;
    for (int32_t row = 0; row < rows; row++) {
        if (e->sampled[row] != BACKEND_NO_TOKEN) continue;
        any = true;
        backend_no_token reason;
        if (b->explain_no_token && b->explain_no_token(b, row, &reason) == KITE_OK) {
            if (reason.bad_index >= 0)
                row_error_set(&e->row_errors[row], "%s backend: logits[%d] is %s (the weights or activations are not "
                              "finite): no token can be chosen", b->ops->name, (int)reason.bad_index,
                              reason.is_nan ? "NaN" : "+inf");
            else
                row_error_set(&e->row_errors[row], "%s backend: all %d logits are -inf: no token can be chosen",
                              b->ops->name, (int)e->model->config.vocab_size);
        } else {
            row_error_set(&e->row_errors[row], "%s backend: the row of logits holds a NaN or +inf, or no finite logit "
                          "(the weights or activations are not finite): no token can be chosen", b->ops->name);
        }
    }
    return any ? KITE_OK : status;
}

/* ---- overlapped greedy decode ------------------------------------------------------------------- */

/* Whether the step after the one whose ids are coming (rows `row_requests`, enqueued or in flight) may be
 * enqueued before those ids are read: every request still active is one of these greedy rows (nothing waiting,
 * no prompt being read), none meets a length limit at the coming token (it would end there, whatever the
 * token), and none waits for its insertion's trigger (the coming token may be it, and then the next position
 * holds the insertion, not that token's successor). Gives each row the block for its next position; false when
 * the pool is short. */
static kite_status can_run_ahead(kite_engine *e, engine_request *const *row_requests, int32_t rows, bool *ok) {
    *ok = false;
    if (!e->overlap || e->hold_decode || rows <= 0) return KITE_OK;
    int32_t active = 0;
    for (int32_t i = 0; i < e->n_requests; i++) active += e->requests[i]->state != REQUEST_FINISHED;
    if (active != rows) return KITE_OK;
    for (int32_t row = 0; row < rows; row++) {
        const engine_request *r = row_requests[row];
        if (r->state != REQUEST_RUNNING || !r->greedy || r->n_logprobs > 0) return KITE_OK;
        if (r->max_tokens > 0 && r->n_generated + 1 >= r->max_tokens) return KITE_OK;
        if (r->n_tokens + 1 >= (size_t)e->max_context) return KITE_OK;
        if (r->n_insert_ids > 0 && !r->inserted) return KITE_OK;
    }
    for (int32_t row = 0; row < rows; row++) {
        bool got = false;
        KITE_TRY(ensure_blocks(e, row_requests[row], (int64_t)row_requests[row]->n_computed + 1, &got));
        if (!got) return KITE_OK;
    }
    *ok = true;
    return KITE_OK;
}

/* Enqueues the step after the one whose rows are row_requests (each row's new token: that step's argmax, taken
 * on the device) and begins its argmax; the blocks come from can_run_ahead. */
static kite_status enqueue_ahead(kite_engine *e, engine_request *const *row_requests, int32_t rows) {
    for (int32_t s = 0; s < rows; s++) {
        engine_request *r = row_requests[s];
        e->ahead_requests[s] = r; /* row_requests may be ahead_requests itself: the same list */
        e->seq_token_start[s] = s;
        e->seq_context_len[s] = (int32_t)r->n_computed + 1;
        e->block_tables[s] = r->block_table;
        e->wants_logits[s] = 1;
    }
    e->seq_token_start[rows] = rows;
    step_batch batch = {.n_seqs = rows, .n_tokens = rows, .token_ids = NULL, .seq_token_start = e->seq_token_start,
                        .seq_context_len = e->seq_context_len, .block_tables = e->block_tables,
                        .seq_wants_logits = e->wants_logits, .tokens_from_argmax = true, .ids_only = true};
    backend *b = e->model->backend;
    KITE_TRY(b->ops->forward(b, &batch));
    KITE_TRY(b->ops->argmax_begin(b, rows));
    for (int32_t s = 0; s < rows; s++) e->ahead_requests[s]->n_computed++;
    e->ahead_rows = rows;
    e->steps_ahead++;
    return KITE_OK;
}

/* Reads the ids of the step `rows` were begun for, having enqueued the next step first where can_run_ahead
 * allows. The pending argmax is read also when enqueueing fails, so the backend holds none the engine forgot. */
static kite_status read_ids_running_ahead(kite_engine *e, engine_request *const *row_requests, int32_t rows) {
    backend *b = e->model->backend;
    bool ahead = false;
    kite_status status = can_run_ahead(e, row_requests, rows, &ahead);
    e->ahead_rows = 0;
    if (status == KITE_OK && ahead) status = enqueue_ahead(e, row_requests, rows);
    kite_status read = accept_greedy_ids(e, b->ops->argmax_end(b, e->sampled, rows), rows);
    return status != KITE_OK ? status : read;
}

/* A call that finds a step in flight: enqueues the next one if nothing changed, then takes the tokens of the
 * one in flight. */
static kite_status step_ahead(kite_engine *e) {
    double start = now_seconds();
    const int32_t rows = e->ahead_rows;
    KITE_TRY(read_ids_running_ahead(e, e->ahead_requests, rows));
    int32_t taken = 0;
    KITE_TRY(take_tokens(e, e->ahead_requests, rows, false, &taken));
    e->steps++;
    e->timings.decode_seconds += now_seconds() - start;
    e->timings.decode_tokens += taken;
    e->timings.decode_steps++;
    return KITE_OK;
}

/* A request whose context needs more blocks than the whole KV cache holds can never finish its next step:
 * scheduled in chunks, it would be preempted by its own next chunk, recomputed, and preempted again, forever.
 * It ends with KITE_FINISH_CAPACITY (keeping the tokens it produced), whatever its state. */
static void end_requests_past_the_cache(kite_engine *e) {
    for (int32_t i = 0; i < e->n_requests; i++) {
        engine_request *r = e->requests[i];
        if (r->state != REQUEST_FINISHED && kv_blocks_for(&e->pool, (int64_t)r->n_tokens) > e->pool.n_blocks)
            finish_without_token(e, r, KITE_FINISH_CAPACITY, NULL);
    }
}

static kite_status engine_step(kite_engine *e) {
    if (e->ahead_rows > 0) return step_ahead(e);
    end_requests_past_the_cache(e);
    remove_finished(e);
    int32_t n = 0;
    KITE_TRY(schedule_step(e, &n));
    if (n == 0) {
        if (kite_engine_idle(e) || e->hold_decode) return KITE_OK; /* held: the decoding requests wait */
        /* Nothing fits even in an empty cache: a request whose context has outgrown the whole KV cache ends
         * with KITE_FINISH_CAPACITY (with the tokens it already produced) instead of stalling the engine. */
        bool ended = false;
        for (int32_t i = 0; i < e->n_requests; i++) {
            engine_request *r = e->requests[i];
            if (r->state == REQUEST_WAITING && kv_blocks_for(&e->pool, (int64_t)r->n_tokens) > e->pool.n_blocks) {
                finish_without_token(e, r, KITE_FINISH_CAPACITY, NULL);
                ended = true;
            }
        }
        if (!ended) return kite_fail(KITE_ERROR_CAPACITY, "engine: requests are waiting but nothing can be scheduled");
        return KITE_OK;
    }
    double start = now_seconds();
    int32_t total = 0, rows = 0, prefill_tokens = 0, generating_rows = 0;
    bool all_greedy = true;
    for (int32_t s = 0; s < n; s++) {
        engine_request *r = e->step_requests[s];
        int32_t chunk = e->step_new_tokens[s];
        e->seq_token_start[s] = total;
        memcpy(e->token_ids + total, r->tokens + r->n_computed, (size_t)chunk * sizeof(int32_t));
        total += chunk;
        e->seq_context_len[s] = (int32_t)r->n_computed + chunk;
        e->block_tables[s] = r->block_table;
        bool completes = r->n_computed + (size_t)chunk == r->n_tokens;
        e->wants_logits[s] = completes;
        if (completes) {
            rows++;
            all_greedy &= r->greedy && r->n_logprobs == 0;
        }
        if (completes && chunk == 1 && r->n_generated > 0)
            generating_rows++;
        else
            prefill_tokens += chunk;
    }
    e->seq_token_start[n] = total;
    step_batch batch = {.n_seqs = n, .n_tokens = total, .token_ids = e->token_ids,
                        .seq_token_start = e->seq_token_start, .seq_context_len = e->seq_context_len,
                        .block_tables = e->block_tables, .seq_wants_logits = e->wants_logits,
                        .ids_only = all_greedy}; /* greedy rows are read by argmax only (below) */
    backend *b = e->model->backend;
    KITE_TRY(b->ops->forward(b, &batch));
    for (int32_t s = 0; s < n; s++) {
        e->step_requests[s]->n_computed += (size_t)e->step_new_tokens[s];
        cache_full_blocks(e, e->step_requests[s]);
    }

    rows = 0;
    for (int32_t s = 0; s < n; s++)
        if (e->wants_logits[s]) e->row_requests[rows++] = e->step_requests[s];
    if (rows > 0) {
        if (all_greedy && e->overlap) {
            KITE_TRY(b->ops->argmax_begin(b, rows));
            KITE_TRY(read_ids_running_ahead(e, e->row_requests, rows));
        } else if (all_greedy) {
            KITE_TRY(accept_greedy_ids(e, b->ops->argmax(b, e->sampled, rows), rows));
        } else {
            bool sampled = false;
            KITE_TRY(sample_rows_reduced(e, rows, &sampled));
            if (!sampled) {
                KITE_TRY(ensure_logits_rows(e, rows));
                KITE_TRY(b->ops->read_logits(b, e->logits, rows));
                KITE_TRY(sample_rows(e, rows));
            }
        }
    }
    int32_t taken = 0;
    KITE_TRY(take_tokens(e, e->row_requests, rows, !all_greedy, &taken));
    double elapsed = now_seconds() - start;
    e->steps++;
    if (prefill_tokens > 0) {
        e->timings.prefill_seconds += elapsed;
        e->timings.prefill_tokens += prefill_tokens;
        e->timings.prefill_steps++;
        e->timings.prefill_step_generated += generating_rows;
    } else {
        e->timings.decode_seconds += elapsed;
        e->timings.decode_tokens += rows;
        e->timings.decode_steps++;
    }
    return KITE_OK;
}

static kite_status engine_run(kite_engine *e) {
    while (!kite_engine_idle(e)) KITE_TRY(engine_step(e));
    remove_finished(e);
    return KITE_OK;
}

kite_status kite_engine_step(kite_engine *e) {
    KITE_TRY(engine_enter(e, "kite_engine_step"));
    return engine_leave(e, engine_step(e));
}

kite_status kite_engine_run(kite_engine *e) {
    KITE_TRY(engine_enter(e, "kite_engine_run"));
    return engine_leave(e, engine_run(e));
}

kite_engine_stats kite_engine_get_stats(const kite_engine *e) {
    kite_engine_stats s = {0};
    s.kv_block_size = e->pool.block_size;
    s.kv_blocks_total = e->pool.n_blocks;
    s.kv_blocks_free = kv_pool_available(&e->pool);
    s.kv_blocks_cached = e->pool.n_cached_free;
    s.prefix_cache = e->pool.caching;
    s.prefix_cache_queried_tokens = e->prefix_queried_tokens;
    s.prefix_cache_hit_tokens = e->prefix_hit_tokens;
    s.prefix_cache_evictions = e->pool.evictions;
    s.kv_capacity_tokens = (size_t)e->pool.n_blocks * (size_t)e->pool.block_size;
    s.max_context = e->max_context;
    s.max_concurrent_full = e->pool.n_blocks / kv_blocks_for(&e->pool, e->max_context);
    for (int32_t i = 0; i < e->n_requests; i++) {
        if (e->requests[i]->state == REQUEST_RUNNING) s.running++;
        if (e->requests[i]->state == REQUEST_WAITING) s.waiting++;
    }
    s.preemptions = e->preemptions;
    s.steps = e->steps;
    s.steps_ahead = e->steps_ahead;
    return s;
}

kite_engine_timings kite_engine_get_timings(const kite_engine *e) { return e->timings; }

void kite_engine_reset_timings(kite_engine *e) { memset(&e->timings, 0, sizeof e->timings); }

/* ---- hooks for the benchmark (engine_internal.h) -------------------------------------------------- */

bool engine_overlap_enabled(const runtime_options *options, const backend *b) {
    return options->engine_overlap && backend_offers_overlap(b);
}

size_t engine_kv_block_bytes(const kite_model *model, int32_t block_size) {
    return backend_kv_bytes_per_position(model->backend) * (size_t)block_size;
}

kite_status engine_lend_blocks(kite_engine *e, int32_t n, int32_t *ids) {
    if (!kite_engine_idle(e))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "engine_lend_blocks: the engine is not idle");
    if (n < 0 || n > kv_pool_available(&e->pool))
        return kite_fail(KITE_ERROR_CAPACITY, "engine_lend_blocks: %d KV blocks asked for, %d free", n,
                         kv_pool_available(&e->pool));
    for (int32_t i = 0; i < n; i++) kv_pool_take(&e->pool, &ids[i]);
    e->lent_blocks += n;
    return KITE_OK;
}

void engine_return_blocks(kite_engine *e, const int32_t *ids, int32_t n) {
    /* In reverse, so that the next take hands them out in the order they were lent. */
    for (int32_t i = n - 1; i >= 0; i--) kv_pool_release(&e->pool, ids[i]);
    e->lent_blocks -= n;
}

kite_status engine_set_step_token_budget(kite_engine *e, int32_t tokens) {
    if (tokens < e->params.max_sequences || tokens > e->params.max_step_tokens)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "engine_set_step_token_budget: %d tokens per step, the engine holds %d to %d", tokens,
                         e->params.max_sequences, e->params.max_step_tokens);
    e->step_token_budget = tokens;
    return KITE_OK;
}

kite_status engine_reset_kv_cache(kite_engine *e) {
    remove_finished(e);
    if (!kite_engine_idle(e) || !kv_pool_reset(&e->pool))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "engine_reset_kv_cache: the engine is not idle (%d of %d KV blocks held or lent)",
                         e->pool.n_blocks - kv_pool_available(&e->pool), e->pool.n_blocks);
    return KITE_OK;
}

void engine_hold_decode(kite_engine *e, bool hold) { e->hold_decode = hold; }

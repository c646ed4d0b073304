/* The CUDA backend end to end on the Qwen3-0.6B shape with random (dummy) weights, against the CPU
 * reference backend on the same weights:
 * - teacher-forced logits (prefill, then decode steps fed the same tokens): relative L2 <= 2e-2;
 * - greedy tokens over 256 steps under the near-tie rule (identical until the first difference; there
 *   each side's token is in the other's top-5);
 * - chunked prefill equals one-shot prefill; a mixed step (a prefill chunk and a decode token of two
 *   sequences) equals the same work done separately; the decode graph equals the prefill path; a mixed step
 *   (decode rows, a prompt chunk, a decode row after it) against the CPU (the fp8 KV cache's: cuda_kv_fp8_test);
 * - the bulk-fed cluster decode attention equals the split-K one (short and long contexts);
 * - batched decode of 3, 8, 13, 20 and 33 sequences with mixed contexts against the CPU and against B = 1
 *   (bulk-fed and split-K batched attention; B=13 runs cuBLASLt products and the gemm_rows lm_head, B=20 and 33
 *   cuBLASLt throughout; by default all three with o_proj and down split along k in 4 slices), then B=33 in 2
 *   slices and B=13 unsplit (cuda_backend_set_batch_split);
 * - overlapped decode (each step's tokens taken on the device from the previous step's argmax) equals serial
 *   decode on every path;
 * - with YaRN rope scaling (Qwen3's documented factor 4 over 32,768 positions), teacher-forced logits again. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda/kernels/cuda_ops.h"
#include "logits_compare.h"
#include "model/dummy.h"
#include "test_util.h"

#define BLOCK_SIZE 16
#define BLOCKS_PER_SEQ 64 /* 1024 positions */
#define N_SEQS 4
#define PROMPT 32
#define GREEDY_STEPS 256

static qwen3_config config;
static dummy_model *model;
static backend *cpu, *gpu;
static int32_t tables[N_SEQS][BLOCKS_PER_SEQ];
static float *logits_a, *logits_b;

#define TRY(expr)                                                                                        \
    do {                                                                                                 \
        kite_status try_status_ = (expr);                                                                \
        if (try_status_ != KITE_OK) {                                                                    \
            fprintf(stderr, "  %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, kite_last_error());           \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One sequence, n tokens continuing a context of `before` positions; logits of the last kept. */
static void run_seq(backend *b, int seq, const int32_t *tokens, int n, int before) {
    int32_t start[2] = {0, n}, ctx = before + n;
    const int32_t *table = tables[seq];
    uint8_t wants = 1;
    step_batch batch = {1, n, tokens, start, &ctx, &table, &wants, false, false};
    TRY(b->ops->forward(b, &batch));
}

static void prompt_tokens(int32_t *out, int n, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        out[i] = (int32_t)((seed >> 8) % (uint32_t)config.vocab_size);
    }
}

static void test_teacher_forced(void) {
    const int V = config.vocab_size;
    int32_t tokens[PROMPT + 16];
    prompt_tokens(tokens, PROMPT, 1);
    run_seq(cpu, 0, tokens, PROMPT, 0);
    run_seq(gpu, 0, tokens, PROMPT, 0);
    TRY(cpu->ops->read_logits(cpu, logits_a, 1));
    TRY(gpu->ops->read_logits(gpu, logits_b, 1));
    double worst = rel_l2(logits_b, logits_a, (size_t)V);
    printf("  prefill %d: logits rel L2 %.3e\n", PROMPT, worst);
    for (int step = 0; step < 16; step++) {
        tokens[PROMPT + step] = argmax_of(logits_a, V); /* both are fed the CPU's choice */
        run_seq(cpu, 0, tokens + PROMPT + step, 1, PROMPT + step);
        run_seq(gpu, 0, tokens + PROMPT + step, 1, PROMPT + step);
        TRY(cpu->ops->read_logits(cpu, logits_a, 1));
        TRY(gpu->ops->read_logits(gpu, logits_b, 1));
        const double e = rel_l2(logits_b, logits_a, (size_t)V);
        if (e > worst) worst = e;
        int32_t id = -1;
        TRY(gpu->ops->argmax(gpu, &id, 1));
        CHECK_MSG(id == argmax_of(logits_b, V), "step %d: device argmax %d, host argmax of its logits %d", step, id,
                  argmax_of(logits_b, V));
    }
    printf("  teacher-forced decode 16 steps: worst logits rel L2 %.3e\n", worst);
    CHECK_MSG(worst <= 2e-2, "logits rel L2 %.3e > 2e-2", worst);
}

static void test_greedy(void) {
    const int V = config.vocab_size;
    int32_t prompt[PROMPT];
    prompt_tokens(prompt, PROMPT, 7);
    run_seq(cpu, 1, prompt, PROMPT, 0);
    run_seq(gpu, 1, prompt, PROMPT, 0);
    int32_t next_cpu, next_gpu;
    double t_cpu = 0, t_gpu = 0;
    int diverged_at = -1;
    for (int step = 0; step < GREEDY_STEPS; step++) {
        TRY(cpu->ops->read_logits(cpu, logits_a, 1));
        TRY(cpu->ops->argmax(cpu, &next_cpu, 1));
        TRY(gpu->ops->argmax(gpu, &next_gpu, 1));
        if (next_cpu != next_gpu) {
            TRY(gpu->ops->read_logits(gpu, logits_b, 1));
            const int ok = in_top5(logits_a, V, next_gpu) && in_top5(logits_b, V, next_cpu);
            printf("  greedy: first difference at step %d (cpu %d, gpu %d): %s\n", step, next_cpu, next_gpu,
                   ok ? "a near tie (each in the other's top-5)" : "NOT a near tie");
            CHECK_MSG(ok, "greedy tokens differ at step %d beyond a near tie", step);
            diverged_at = step;
            break;
        }
        if (step + 1 == GREEDY_STEPS) break;
        double t0 = now_s();
        run_seq(cpu, 1, &next_cpu, 1, PROMPT + step);
        double t1 = now_s();
        run_seq(gpu, 1, &next_gpu, 1, PROMPT + step);
        int32_t dummy;
        TRY(gpu->ops->argmax(gpu, &dummy, 1));
        double t2 = now_s();
        t_cpu += t1 - t0;
        t_gpu += t2 - t1;
    }
    if (diverged_at < 0) printf("  greedy: %d steps identical\n", GREEDY_STEPS);
    printf("  (cpu %.1f ms/step, gpu %.3f ms/step incl. argmax read)\n", 1e3 * t_cpu / GREEDY_STEPS, 1e3 * t_gpu / GREEDY_STEPS);
}

/* GPU only: the same 300-token prompt one-shot in seq 2 and in three chunks in seq 3. */
static void test_chunked_prefill(void) {
    const int V = config.vocab_size, n = 300;
    int32_t tokens[300];
    prompt_tokens(tokens, n, 11);
    run_seq(gpu, 2, tokens, n, 0);
    TRY(gpu->ops->read_logits(gpu, logits_a, 1));
    run_seq(gpu, 3, tokens, 100, 0);
    run_seq(gpu, 3, tokens + 100, 128, 100);
    run_seq(gpu, 3, tokens + 228, 72, 228);
    TRY(gpu->ops->read_logits(gpu, logits_b, 1));
    const double e = rel_l2(logits_b, logits_a, (size_t)V);
    printf("  chunked (100+128+72) vs one-shot prefill of 300: rel L2 %.3e\n", e);
    CHECK_MSG(e < 1e-2, "chunked prefill differs: %.3e", e);

    /* Decode through the graph (seq 2) and through the prefill path (a batch with no logits for seq 3
     * first, then seq 3's token with seq 2's next token as a 2-sequence batch). */
    int32_t next = argmax_of(logits_a, V);
    run_seq(gpu, 2, &next, 1, n);
    float *graph_logits = malloc((size_t)V * 4), *mixed = malloc((size_t)V * 2 * 4);
    TRY(gpu->ops->read_logits(gpu, graph_logits, 1));
    int32_t toks[2] = {next, next}, start[3] = {0, 1, 2}, ctx[2] = {n + 1, n + 1};
    const int32_t *tb[2] = {tables[3], tables[0]};
    uint8_t wants[2] = {1, 1};
    /* seq 0 is reused here as scratch: prefill it with the same 300 tokens first */
    run_seq(gpu, 0, tokens, n, 0);
    step_batch batch = {2, 2, toks, start, ctx, tb, wants, false, false};
    TRY(gpu->ops->forward(gpu, &batch));
    TRY(gpu->ops->read_logits(gpu, mixed, 2));
    const double e1 = rel_l2(mixed, graph_logits, (size_t)V), e2 = rel_l2(mixed + V, graph_logits, (size_t)V);
    printf("  decode graph vs batched path (2-sequence batch): rel L2 %.3e, %.3e\n", e1, e2);
    CHECK_MSG(e1 < 1e-2 && e2 < 1e-2, "graph decode and prefill path differ: %.3e %.3e", e1, e2);
    int32_t ids[2];
    TRY(gpu->ops->argmax(gpu, ids, 2));
    CHECK(ids[0] == argmax_of(mixed, V) && ids[1] == argmax_of(mixed + V, V));
    free(graph_logits);
    free(mixed);
}

/* A mixed step as a server runs it, on both backends: two generating sequences first (one token each, at 301 and
 * 41 positions: the split-K decode attention, over several splits and over one), then a 64-token prompt chunk
 * continuing 100 positions and a third generating sequence after it (both the prefill attention). Every row's
 * logits against the CPU's: rel L2 <= 2e-2. */
static void test_mixed_step(void) {
    const int V = config.vocab_size;
    const int before[4] = {300, 40, 100, 20}, n_new[4] = {1, 1, 64, 1};
    int32_t prompts[4][300];
    for (int s = 0; s < 4; s++) {
        prompt_tokens(prompts[s], before[s] + n_new[s], 21 + (uint32_t)s);
        run_seq(cpu, s, prompts[s], before[s], 0);
        run_seq(gpu, s, prompts[s], before[s], 0);
    }
    int32_t toks[67], start[5] = {0}, ctx[4];
    const int32_t *tb[4];
    uint8_t wants[4] = {1, 1, 1, 1};
    for (int s = 0; s < 4; s++) {
        memcpy(toks + start[s], prompts[s] + before[s], (size_t)n_new[s] * sizeof(int32_t));
        start[s + 1] = start[s] + n_new[s];
        ctx[s] = before[s] + n_new[s];
        tb[s] = tables[s];
    }
    step_batch batch = {4, start[4], toks, start, ctx, tb, wants, false, false};
    float *ref = malloc((size_t)V * 4 * 4), *out = malloc((size_t)V * 4 * 4);
    CHECK(ref && out);
    TRY(cpu->ops->forward(cpu, &batch));
    TRY(cpu->ops->read_logits(cpu, ref, 4));
    TRY(gpu->ops->forward(gpu, &batch));
    TRY(gpu->ops->read_logits(gpu, out, 4));
    for (int s = 0; s < 4; s++) {
        const double e = rel_l2(out + (size_t)s * V, ref + (size_t)s * V, (size_t)V);
        printf("  mixed step, row %d (%d new at %d): rel L2 %.3e\n", s, n_new[s], before[s], e);
        CHECK_MSG(e <= 2e-2, "mixed step row %d: rel L2 %.3e > 2e-2", s, e);
    }
    free(ref);
    free(out);
}

/* Two single-stream decode paths on the same steps: seq 0 through path a, seq 1 through path b, switching
 * paths every step (use_path(0) / use_path(1) select them). Different summation orders only: logits within
 * rel L2 1e-3 and the same argmax unless a near tie. */
static void compare_decode_paths(const char *name_a, const char *name_b, void (*use_path)(int b_path), int prompt_len,
                                 uint32_t seed) {
    const int V = config.vocab_size, steps = 8;
    int32_t tokens[1000 + 8];
    prompt_tokens(tokens, prompt_len, seed);
    run_seq(gpu, 0, tokens, prompt_len, 0);
    run_seq(gpu, 1, tokens, prompt_len, 0);
    TRY(gpu->ops->read_logits(gpu, logits_a, 1));
    double worst = 0;
    for (int step = 0; step < steps; step++) {
        const int32_t next = argmax_of(logits_a, V);
        use_path(0);
        run_seq(gpu, 0, &next, 1, prompt_len + step);
        TRY(gpu->ops->read_logits(gpu, logits_a, 1));
        int32_t id_a = -1, id_b = -1;
        TRY(gpu->ops->argmax(gpu, &id_a, 1));
        use_path(1);
        run_seq(gpu, 1, &next, 1, prompt_len + step);
        TRY(gpu->ops->read_logits(gpu, logits_b, 1));
        TRY(gpu->ops->argmax(gpu, &id_b, 1));
        const double e = rel_l2(logits_a, logits_b, (size_t)V);
        if (e > worst) worst = e;
        CHECK_MSG(id_a == argmax_of(logits_a, V), "step %d: %s argmax %d, host argmax of its logits %d", step, name_a,
                  id_a, argmax_of(logits_a, V));
        CHECK_MSG(id_a == id_b || (in_top5(logits_a, V, id_b) && in_top5(logits_b, V, id_a)),
                  "step %d: %s %d vs %s %d beyond a near tie", step, name_a, id_a, name_b, id_b);
    }
    printf("  %s vs %s decode after %d tokens, %d steps: worst logits rel L2 %.3e\n", name_a, name_b, prompt_len,
           steps, worst);
    CHECK_MSG(worst <= 1e-3, "%s and %s decode differ: rel L2 %.3e", name_a, name_b, worst);
}

static void use_bulk_or_split(int split) { TRY(cuda_backend_set_bulk_max_context(gpu, split ? 0 : INT32_MAX)); }

/* The two single-stream decode attentions (bulk-fed cluster kernel, split-K kernel), after 1000 tokens (several
 * tiles per block) and 20 (fewer positions than blocks in a cluster). */
static void test_bulk_vs_split(void) {
    if (!cuda_backend_attention_bulk(gpu)) {
        printf("  the cluster attention does not run on this device: nothing to compare\n");
        return;
    }
    const int32_t bulk_max = cuda_backend_bulk_max_context(gpu);
    compare_decode_paths("bulk", "split-K", use_bulk_or_split, 1000, 41);
    compare_decode_paths("bulk", "split-K", use_bulk_or_split, 20, 42);
    TRY(cuda_backend_set_bulk_max_context(gpu, bulk_max));
}

/* Batched decode (B sequences, one token each, all wanting logits): the batched path's logits against
 * the CPU (teacher-forced, rel L2 <= 2e-2) and its argmax against the same sequences decoded one at a
 * time on the GPU (B = 1 graph path; near-tie rule). Contexts differ per sequence. */
#define BATCH_BLOCKS 8 /* per sequence: up to 128 positions */
#define BATCH_BASE (N_SEQS * BLOCKS_PER_SEQ)
#define BATCH_MAX_SEQS 33
#define BATCH_STEPS 3

static void test_batched_decode_n(int n) {
    const int V = config.vocab_size;
    static int32_t batch_tables[BATCH_MAX_SEQS][BATCH_BLOCKS], single_tables[BATCH_MAX_SEQS][BATCH_BLOCKS];
    const int32_t *bt[BATCH_MAX_SEQS], *st[1];
    int32_t ctx[BATCH_MAX_SEQS], tokens[BATCH_MAX_SEQS], start[BATCH_MAX_SEQS + 1], ids[BATCH_MAX_SEQS];
    uint8_t wants[BATCH_MAX_SEQS];
    float *cpu_rows = malloc((size_t)n * V * 4), *gpu_rows = malloc((size_t)n * V * 4), *one = malloc((size_t)V * 4);
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < BATCH_BLOCKS; i++) { /* scattered, reversed */
            batch_tables[s][i] = BATCH_BASE + (BATCH_BLOCKS - 1 - i) * BATCH_MAX_SEQS + s;
            single_tables[s][i] = BATCH_BASE + BATCH_BLOCKS * BATCH_MAX_SEQS + s * BATCH_BLOCKS + i;
        }
        bt[s] = batch_tables[s];
        int32_t prompt[96];
        const int len = 1 + (s * 37 + n * 11) % 84;
        prompt_tokens(prompt, len, 100 + (uint32_t)s);
        int32_t pstart[2] = {0, len}, pctx = len;
        uint8_t pw = 1;
        step_batch p = {1, len, prompt, pstart, &pctx, &bt[s], &pw, false, false};
        TRY(cpu->ops->forward(cpu, &p));
        TRY(gpu->ops->forward(gpu, &p));
        st[0] = single_tables[s];
        step_batch q = {1, len, prompt, pstart, &pctx, st, &pw, false, false};
        TRY(gpu->ops->forward(gpu, &q));
        ctx[s] = len;
        tokens[s] = (int32_t)((s * 7919 + 13) % V);
        wants[s] = 1;
        start[s] = s;
    }
    start[n] = n;
    double worst = 0;
    int near_ties = 0;
    for (int step = 0; step < BATCH_STEPS; step++) {
        for (int s = 0; s < n; s++) ctx[s]++;
        step_batch b = {n, n, tokens, start, ctx, bt, wants, false, false};
        TRY(gpu->ops->forward(gpu, &b));
        TRY(gpu->ops->read_logits(gpu, gpu_rows, n));
        TRY(gpu->ops->argmax(gpu, ids, n));
        TRY(cpu->ops->forward(cpu, &b));
        TRY(cpu->ops->read_logits(cpu, cpu_rows, n));
        for (int s = 0; s < n; s++) {
            const float *g = gpu_rows + (size_t)s * V, *c = cpu_rows + (size_t)s * V;
            const double e = rel_l2(g, c, (size_t)V);
            if (e > worst) worst = e;
            CHECK_MSG(ids[s] == argmax_of(g, V), "B=%d step %d seq %d: device argmax %d, host argmax of its logits %d", n,
                      step, s, ids[s], argmax_of(g, V));
            /* The same sequence alone (B = 1 path, its own copy of the cache). */
            int32_t one_start[2] = {0, 1}, one_ctx = ctx[s], one_id = -1;
            uint8_t w1 = 1;
            st[0] = single_tables[s];
            step_batch o = {1, 1, &tokens[s], one_start, &one_ctx, st, &w1, false, false};
            TRY(gpu->ops->forward(gpu, &o));
            TRY(gpu->ops->read_logits(gpu, one, 1));
            TRY(gpu->ops->argmax(gpu, &one_id, 1));
            if (one_id != ids[s]) {
                const int ok = in_top5(g, V, one_id) && in_top5(one, V, ids[s]);
                CHECK_MSG(ok, "B=%d step %d seq %d: batched argmax %d vs alone %d, not a near tie", n, step, s, ids[s], one_id);
                near_ties++;
            }
        }
        for (int s = 0; s < n; s++) tokens[s] = argmax_of(cpu_rows + (size_t)s * V, V); /* teacher forcing */
    }
    printf("  batched decode B=%d (contexts 2..85, %d steps): worst logits rel L2 vs cpu %.3e, %d near ties vs B=1\n", n,
           BATCH_STEPS, worst, near_ties);
    CHECK_MSG(worst <= 2e-2, "B=%d: logits rel L2 %.3e > 2e-2", n, worst);
    free(cpu_rows);
    free(gpu_rows);
    free(one);
}

static void test_batched_decode(void) {
    /* Buckets up to batch_bulk_max_rows take the bulk-fed cluster attention where it fits, larger ones (and
     * B = 8 once more, below) the split-K kernel. */
    printf("  batched attention: bulk-fed cluster size B=3 %d, B=8 %d, B=33 %d (0: split-K)\n",
           cuda_backend_batch_bulk_cluster(gpu, 3), cuda_backend_batch_bulk_cluster(gpu, 8),
           cuda_backend_batch_bulk_cluster(gpu, 33));
    test_batched_decode_n(3);
    test_batched_decode_n(8);
    test_batched_decode_n(13);
    test_batched_decode_n(20);
    test_batched_decode_n(33);
    const int32_t bulk_max_rows = cuda_backend_batch_bulk_max_rows(gpu);
    TRY(cuda_backend_set_batch_bulk_max_rows(gpu, 0));
    printf("  batched attention: split-K at every B\n");
    test_batched_decode_n(8);
    TRY(cuda_backend_set_batch_bulk_max_rows(gpu, bulk_max_rows));
    /* The cuBLASLt buckets with o_proj and down split along k (the residual add and the next norm in one kernel;
     * by default 4 slices in every bucket, so B=13, 20 and 33 above), then in 2 slices, then not split. */
    TRY(cuda_backend_set_batch_split(gpu, 2, 256));
    printf("  batched products: o_proj and down in 2 k slices at every B\n");
    test_batched_decode_n(33);
    TRY(cuda_backend_set_batch_split(gpu, 0, 0));
    printf("  batched products: cuBLASLt's own, separate norms\n");
    test_batched_decode_n(13);
    CHECK(cuda_backend_set_batch_split(gpu, 7, 256) == KITE_ERROR_INVALID_ARGUMENT); /* 2,048 / 7: no whole slices */
    TRY(cuda_backend_set_batch_split(gpu, 4, 256)); /* the default again */
}

/* Greedy ids of n sequences (prompts of 20 + 7 s tokens, read in one prefill-path step) over `steps` decode
 * steps: out[step * n + s] is what the step before `step` chose (the prompt's for step 0). Serial: each step
 * fed the ids read back. Overlapped (the engine's overlapped decode): each step enqueued with
 * tokens_from_argmax, its argmax begun, then the previous step's ids read. */
/* greedy_ids' prompt for sequence s is GREEDY_PROMPT + 7 s tokens. */
enum { GREEDY_PROMPT = 20 };

static void greedy_ids(int n, int steps, int overlapped, int32_t *out) {
    int32_t prompt[N_SEQS * 48], start[N_SEQS + 1], one_start[N_SEQS + 1], ctx[N_SEQS], last[N_SEQS];
    const int32_t *tb[N_SEQS];
    uint8_t wants[N_SEQS];
    int total = 0;
    for (int s = 0; s < n; s++) {
        const int len = GREEDY_PROMPT + 7 * s;
        start[s] = total;
        prompt_tokens(prompt + total, len, 500 + (uint32_t)s);
        total += len;
        ctx[s] = len;
        tb[s] = tables[s];
        wants[s] = 1;
    }
    start[n] = total;
    for (int s = 0; s <= n; s++) one_start[s] = s;
    step_batch p = {n, total, prompt, start, ctx, tb, wants, false, false};
    TRY(gpu->ops->forward(gpu, &p));
    if (overlapped) TRY(gpu->ops->argmax_begin(gpu, n));
    for (int step = 0; step < steps; step++) {
        for (int s = 0; s < n; s++) ctx[s]++;
        if (overlapped) {
            step_batch d = {n, n, NULL, one_start, ctx, tb, wants, true, true}; /* ids only: the screened lm_head */
            TRY(gpu->ops->forward(gpu, &d));
            TRY(gpu->ops->argmax_begin(gpu, n));
            TRY(gpu->ops->argmax_end(gpu, out + (size_t)step * n, n));
        } else {
            TRY(gpu->ops->argmax(gpu, out + (size_t)step * n, n));
            step_batch d = {n, n, out + (size_t)step * n, one_start, ctx, tb, wants, false, false};
            TRY(gpu->ops->forward(gpu, &d));
        }
    }
    if (overlapped) TRY(gpu->ops->argmax_end(gpu, last, n)); /* the last step's, not compared */
}

/* Overlapped decode (its steps kept as ids only: the screened lm_head where the path has it) equals serial decode
 * (the lm_head GEMV's logits kept), id for id, on every path a step's tokens can come from: one sequence
 * (the decode graph; its first step copies the token from the prefill's argmax, later ones read its own token in
 * place), 4 sequences (the batched graph: its own ids), both without the graphs, 4 on the prefill path; misuse is
 * refused. */
static void test_overlapped_decode(void) {
    enum { STEPS = 24 };
    int32_t serial[STEPS * N_SEQS], overlapped[STEPS * N_SEQS];
    const char *names[4] = {"graphs", "no graphs", "prefill path", NULL};
    for (int mode = 0; names[mode]; mode++) {
        if (mode == 1) TRY(cuda_backend_set_decode_options(gpu, 0, 0));
        if (mode == 2) {
            TRY(cuda_backend_set_decode_options(gpu, 1, 1));
            TRY(cuda_backend_set_batched_decode(gpu, 0));
        }
        for (int n = 1; n <= N_SEQS; n += N_SEQS - 1) {
            if (mode == 2 && n == 1) continue;
            greedy_ids(n, STEPS, 0, serial);
            const unsigned long long copies_before = cuda_backend_step_copies(gpu);
            greedy_ids(n, STEPS, 1, overlapped);
            if (n == 1 && mode <= 1) {
                /* Chained in place, a step copies its buffer only where the previous one did not leave it on the
                 * device: the first step (its token from the prefill), the second (the first chained in place)
                 * and each step that starts a new cache block. */
                unsigned long long want = 0;
                for (int step = 0; step < STEPS; step++) want += step < 2 || (GREEDY_PROMPT + step) % BLOCK_SIZE == 0;
                const unsigned long long copies = cuda_backend_step_copies(gpu) - copies_before;
                CHECK_MSG(copies == want, "%s: %llu step buffer copies over %d steps, want %llu", names[mode], copies,
                          STEPS, want);
                printf("  overlapped decode (%s): %llu step buffer copies over %d steps\n", names[mode], copies, STEPS);
            }
            if (n == 1 && mode <= 1 && strstr(gpu->ops->decode_path(gpu), "int8 screen")) {
                float row[1]; /* the last forward kept ids only: no logits to read */
                CHECK(gpu->ops->read_logits(gpu, row, 1) != KITE_OK);
            }
            int differ = 0;
            for (int i = 0; i < STEPS * n; i++) differ += serial[i] != overlapped[i];
            CHECK_MSG(differ == 0, "%s, %d sequences: %d of %d ids differ", names[mode], n, differ, STEPS * n);
            printf("  overlapped decode (%s, %d sequences, %d steps): ids equal to serial decode\n", names[mode], n,
                   STEPS);
        }
    }
    TRY(cuda_backend_set_batched_decode(gpu, 1));
    int32_t id = -1;
    CHECK(gpu->ops->argmax_end(gpu, &id, 1) != KITE_OK); /* none begun */
    int32_t one_start[3] = {0, 1, 2}, ctx[2] = {5, 5};
    const int32_t *tb[2] = {tables[0], tables[1]};
    uint8_t wants[2] = {1, 1};
    step_batch d = {2, 2, NULL, one_start, ctx, tb, wants, true, false}; /* the last forward kept 4 rows */
    CHECK(gpu->ops->forward(gpu, &d) != KITE_OK);
}

/* Both backends rebuilt with Qwen3's documented YaRN: the CPU computes its angles per token and the CUDA backend
 * uploads a table of 131,072 positions, both from model/rope.c (YaRN's frequencies, cos and sin scaled by the
 * attention factor); the teacher-forced comparison then runs again on the same weights. */
static void test_yarn_teacher_forced(void) {
    const char *yarn = "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768}";
    gpu->ops->destroy(gpu);
    cpu->ops->destroy(cpu);
    TRY(known_shape_config_overriding("qwen3-0.6b-base", yarn, &config));
    CHECK(config.rope_yarn && config.context_limit == 131072);
    backend_params params = {.n_threads = 0, .device = 0};
    TRY(cpu_backend_create(&config, dummy_model_weights(model), &params, &cpu));
    TRY(cuda_backend_create(&config, dummy_model_weights(model), &params, &gpu));
    TRY(cpu->ops->kv_reserve(cpu, BATCH_BASE + BATCH_BLOCKS * BATCH_MAX_SEQS, BLOCK_SIZE));
    TRY(gpu->ops->kv_reserve(gpu, BATCH_BASE + 2 * BATCH_BLOCKS * BATCH_MAX_SEQS, BLOCK_SIZE));
    test_teacher_forced();
}

int main(void) {
    char reason[256];
    if (!cuda_backend_available(reason, sizeof reason)) {
        char why[300];
        snprintf(why, sizeof why, "CUDA backend unavailable: %s", reason);
        test_skip(why);
    }
    TRY(known_shape_config("qwen3-0.6b-base", &config));
    TRY(dummy_model_create(&config, 1234, &model));
    const qwen3_weights *w = dummy_model_weights(model);
    backend_params params = {.n_threads = 0, .device = 0};
    double t0 = now_s();
    TRY(cpu_backend_create(&config, w, &params, &cpu));
    double t1 = now_s();
    TRY(cuda_backend_create(&config, w, &params, &gpu));
    double t2 = now_s();
    printf("  created: cpu %.2f s, cuda %.2f s\n", t1 - t0, t2 - t1);
    TRY(cpu->ops->kv_reserve(cpu, BATCH_BASE + BATCH_BLOCKS * BATCH_MAX_SEQS, BLOCK_SIZE));
    TRY(gpu->ops->kv_reserve(gpu, BATCH_BASE + 2 * BATCH_BLOCKS * BATCH_MAX_SEQS, BLOCK_SIZE));
    /* Scattered blocks: sequence s takes blocks s, s + N_SEQS, ... in reverse. */
    for (int s = 0; s < N_SEQS; s++)
        for (int i = 0; i < BLOCKS_PER_SEQ; i++) tables[s][i] = (BLOCKS_PER_SEQ - 1 - i) * N_SEQS + s;
    logits_a = malloc((size_t)config.vocab_size * 4);
    logits_b = malloc((size_t)config.vocab_size * 4);
    TEST_RUN(test_teacher_forced);
    TEST_RUN(test_greedy);
    TEST_RUN(test_chunked_prefill);
    TEST_RUN(test_mixed_step);
    TEST_RUN(test_bulk_vs_split);
    TEST_RUN(test_batched_decode);
    TEST_RUN(test_overlapped_decode);
    TEST_RUN(test_yarn_teacher_forced); /* last: it replaces both backends */
    gpu->ops->destroy(gpu);
    cpu->ops->destroy(cpu);
    dummy_model_free(model);
    free(logits_a);
    free(logits_b);
    return test_finish();
}

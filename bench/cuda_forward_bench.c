/* Timing harness for the CUDA backend (not a test): prefill of N tokens and single-stream decode
 * steps at a given depth, on dummy weights of a named shape, through the backend interface.
 * Wall clock around forward + a device synchronise (prefill) or + the 4-byte argmax read (decode),
 * one warm-up excluded, median of the repeats. Prints tok/s, ms/token and the fraction of the floor:
 * HBM bytes (weights + KV read) at 4.3 TB/s for decode, bf16 tensor FLOPs at 790 TFLOP/s for prefill.
 *
 * usage: cuda_forward_bench [--shape NAME] [-p 256,2048] [-n 128] [--depth 256,16384] [--reps 5] [--block-size 128]
 *                           [--variants]   (decode also without PDL and without the graph)
 *                           [--batch 1,8,32] (decode steps of B sequences at once, each at the depth: the
 *                                           batched path)
 *                           [--queued]     (decode also with the steps enqueued back to back, no host wait for
 *                                           each step's ids: the host round trip's cost, as a difference)
 *                           [--identity-table] (block tables in cache order, as a fresh engine allocates them,
 *                                           instead of the default reversed order)
 *                           [--mixed 256]  (after each --batch B at a depth: steps of those B decode rows plus one
 *                                           more sequence reading a P-token prompt chunk, the step a server runs
 *                                           when a request arrives while others generate: the general path)
 *                           [--mixed-vary] (the chunk of each mixed step P - (step mod 97) tokens: a new step shape
 *                                           every step, as a server's steps are)
 *                           [--kv-cache-dtype bf16|fp8] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend_internal.h"
#include "kite.h"
#include "model/dummy.h"

#include "bench_util.h"

#define HBM_BYTES_PER_S 4.3e12
#define TENSOR_FLOPS 790e12
#define MAX_LIST 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_list(const char *s, int *out) {
    int n = 0;
    while (*s && n < MAX_LIST) {
        out[n++] = atoi(s);
        const char *comma = strchr(s, ',');
        if (!comma) break;
        s = comma + 1;
    }
    return n;
}

/* Sequence s owns the block table table + s * seq_blocks (scattered blocks, disjoint between sequences). */
static int32_t *table;
static int seq_blocks;
static int block_size; /* positions per KV cache block (--block-size; default: the engine's) */
static int identity_table; /* --identity-table: logical block i is cache block i (kite bench's fresh engine) */

static void forward(backend *b, int seq, const int32_t *tokens, int n, int before, int wants) {
    int32_t start[2] = {0, n}, ctx = before + n;
    const int32_t *t = table + (size_t)seq * (size_t)seq_blocks;
    uint8_t w = (uint8_t)wants;
    step_batch batch = {1, n, tokens, start, &ctx, &t, &w, false, false};
    TRY(b->ops->forward(b, &batch));
}

/* Prefill `depth` positions of sequences 0 .. n_seqs - 1, in chunks of at most 4096 tokens. */
static void fill_context(backend *b, const int32_t *tokens, int depth, int n_seqs) {
    for (int seq = 0; seq < n_seqs; seq++)
        for (int done = 0; done < depth;) {
            const int n = depth - done < 4096 ? depth - done : 4096;
            forward(b, seq, tokens + done, n, done, 0);
            done += n;
        }
    TRY(cuda_backend_synchronize(b));
}

/* Median seconds per decode step of n_gen greedy steps of n_seqs sequences at `depth` positions each (one
 * sequence: the single-stream path, more: the batched path; the first repeat is warm-up). queued: the steps are
 * enqueued back to back with the same input tokens and no host wait for each step's ids (one wait at the end),
 * so the difference to the greedy loop is what the host's round trip between steps costs. */
static double decode_seconds(backend *b, const int32_t *tokens, int n_seqs, int depth, int n_gen, int reps,
                             double *samples, int queued) {
    int32_t *next = malloc((size_t)n_seqs * sizeof *next), *start = malloc((size_t)(n_seqs + 1) * sizeof *start);
    int32_t *ctx = malloc((size_t)n_seqs * sizeof *ctx);
    const int32_t **tables = malloc((size_t)n_seqs * sizeof *tables);
    uint8_t *wants = malloc((size_t)n_seqs);
    if (!next || !start || !ctx || !tables || !wants) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int s = 0; s < n_seqs; s++) {
        tables[s] = table + (size_t)s * (size_t)seq_blocks;
        wants[s] = 1;
        start[s] = s;
    }
    start[n_seqs] = n_seqs;
    for (int r = 0; r <= reps; r++) {
        for (int s = 0; s < n_seqs; s++) next[s] = tokens[depth + s];
        const double t0 = now_s();
        for (int g = 0; g < n_gen; g++) {
            for (int s = 0; s < n_seqs; s++) ctx[s] = depth + g + 1;
            step_batch batch = {n_seqs, n_seqs, next, start, ctx, tables, wants, false, true}; /* read by argmax only */
            TRY(b->ops->forward(b, &batch));
            if (!queued) TRY(b->ops->argmax(b, next, n_seqs));
        }
        if (queued) TRY(cuda_backend_synchronize(b));
        samples[r] = now_s() - t0;
    }
    free(next);
    free(start);
    free(ctx);
    free(tables);
    free(wants);
    return median(samples + 1, reps) / n_gen;
}

/* Median seconds per mixed step: n_seqs decode rows at `depth` + g (as decode_seconds) and sequence n_seqs reading
 * the P-token chunk tokens[0 .. P) at positions 0 .. P - 1 (the same chunk every step: its K/V rows are rewritten
 * in place), every sequence wanting logits; n_gen steps, the first repeat warm-up. */
static double mixed_seconds(backend *b, const int32_t *tokens, int n_seqs, int depth, int chunk, int vary, int n_gen,
                            int reps, double *samples) {
    const int S = n_seqs + 1, T = n_seqs + chunk;
    int32_t *ids = malloc((size_t)T * sizeof *ids), *start = malloc((size_t)(S + 1) * sizeof *start);
    int32_t *ctx = malloc((size_t)S * sizeof *ctx), *next = malloc((size_t)S * sizeof *next);
    const int32_t **tables = malloc((size_t)S * sizeof *tables);
    uint8_t *wants = malloc((size_t)S);
    if (!ids || !start || !ctx || !next || !tables || !wants) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int s = 0; s < S; s++) {
        tables[s] = table + (size_t)s * (size_t)seq_blocks;
        wants[s] = 1;
        start[s] = s;
    }
    start[S] = T;
    for (int r = 0; r <= reps; r++) {
        for (int s = 0; s < n_seqs; s++) ids[s] = tokens[depth + s];
        const double t0 = now_s();
        for (int g = 0; g < n_gen; g++) {
            /* --mixed-vary: step g reads chunk - (step index mod 97) tokens, a new step shape each time (as a
             * server's steps are), so the backend's per-shape plans miss as they do there. */
            const int step_chunk = vary ? chunk - (r * n_gen + g) % 97 : chunk;
            for (int s = 0; s < n_seqs; s++) ctx[s] = depth + g + 1;
            memcpy(ids + n_seqs, tokens, (size_t)step_chunk * sizeof *ids);
            ctx[n_seqs] = step_chunk;
            start[S] = n_seqs + step_chunk;
            step_batch batch = {S, n_seqs + step_chunk, ids, start, ctx, tables, wants, false, true};
            TRY(b->ops->forward(b, &batch));
            TRY(b->ops->argmax(b, next, S));
            memcpy(ids, next, (size_t)n_seqs * sizeof *ids);
        }
        samples[r] = now_s() - t0;
    }
    free(ids);
    free(start);
    free(ctx);
    free(next);
    free(tables);
    free(wants);
    return median(samples + 1, reps) / n_gen;
}

int main(int argc, char **argv) {
    const char *shape = "qwen3-0.6b-base";
    block_size = kite_engine_params_default().kv_block_size;
    int prompts[MAX_LIST] = {256, 2048}, n_prompts = 2;
    int depths[MAX_LIST] = {256, 16384}, n_depths = 2;
    int batches[MAX_LIST] = {1}, n_batches = 1;
    int n_gen = 128, reps = 5, variants = 0, queued = 0, mixed_chunk = 0, mixed_vary = 0;
    kite_kv_cache_dtype kv_dtype = KITE_KV_CACHE_BF16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) shape = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) n_prompts = parse_list(argv[++i], prompts);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n_gen = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc) n_depths = parse_list(argv[++i], depths);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--variants")) variants = 1;
        else if (!strcmp(argv[i], "--queued")) queued = 1;
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) n_batches = parse_list(argv[++i], batches);
        else if (!strcmp(argv[i], "--block-size") && i + 1 < argc) block_size = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--identity-table")) identity_table = 1;
        else if (!strcmp(argv[i], "--mixed") && i + 1 < argc) mixed_chunk = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mixed-vary")) mixed_vary = 1;
        else if (!strcmp(argv[i], "--kv-cache-dtype") && i + 1 < argc && (!strcmp(argv[i + 1], "bf16") || !strcmp(argv[i + 1], "fp8")))
            kv_dtype = !strcmp(argv[++i], "fp8") ? KITE_KV_CACHE_FP8 : KITE_KV_CACHE_BF16;
        else {
            fprintf(stderr, "usage: %s [--shape NAME] [-p 256,2048] [-n 128] [--depth 256,16384] [--reps 5] [--variants] [--queued] [--batch 1,8,32] [--block-size 128] [--identity-table] [--mixed P] [--mixed-vary] [--kv-cache-dtype bf16|fp8]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 64) reps = 5;
    if (mixed_chunk < 0 || mixed_chunk > 4096 || (mixed_vary && mixed_chunk <= 97)) {
        fprintf(stderr, "--mixed: %d is not in 0 .. 4096 tokens (98 .. with --mixed-vary)\n", mixed_chunk);
        return 2;
    }
    int max_batch = 1;
    for (int i = 0; i < n_batches; i++) {
        if (batches[i] < 1 || batches[i] > 256) {
            fprintf(stderr, "--batch: %d is not in 1 .. 256\n", batches[i]);
            return 2;
        }
        max_batch = batches[i] > max_batch ? batches[i] : max_batch;
    }
    char reason[256];
    if (!cuda_backend_available(reason, sizeof reason)) {
        printf("SKIPPED: %s\n", reason);
        return 77;
    }
    qwen3_config config;
    dummy_model *model = NULL;
    backend *gpu = NULL;
    TRY(known_shape_config(shape, &config));
    TRY(dummy_model_create(&config, 42, &model));
    backend_params params = {.n_threads = 0, .device = 0, .kv_cache_dtype = kv_dtype};
    TRY(cuda_backend_create(&config, dummy_model_weights(model), &params, &gpu));
    {
        char report[512];
        printf("# %s\n# %s\n", gpu->ops->decode_path(gpu), cuda_backend_cluster_report(gpu, report, sizeof report));
    }

    int max_ctx = 0;
    for (int i = 0; i < n_prompts; i++) max_ctx = prompts[i] > max_ctx ? prompts[i] : max_ctx;
    for (int i = 0; i < n_depths; i++) max_ctx = depths[i] + n_gen > max_ctx ? depths[i] + n_gen : max_ctx;
    if (mixed_chunk > max_ctx) max_ctx = mixed_chunk;
    if (block_size < 1 || block_size > 4096) {
        fprintf(stderr, "--block-size %d: expected 1 .. 4096 positions\n", block_size);
        return 2;
    }
    seq_blocks = (max_ctx + block_size - 1) / block_size + 1;
    const int n_blocks = seq_blocks * (max_batch + (mixed_chunk > 0)); /* --mixed: one sequence more */
    TRY(gpu->ops->kv_reserve(gpu, n_blocks, block_size));
    table = malloc((size_t)n_blocks * sizeof *table);
    int32_t *tokens = malloc((size_t)(max_ctx + 257) * sizeof *tokens); /* + the first token of 256 sequences */
    /* Reversed by default (scattered, not the cache's order); kite bench's fresh engine hands out ascending blocks. */
    for (int i = 0; i < n_blocks; i++) table[i] = identity_table ? i : n_blocks - 1 - i;
    uint32_t seed = 5;
    for (int i = 0; i < max_ctx + 257; i++) {
        seed = seed * 1664525u + 1013904223u;
        tokens[i] = (int32_t)((seed >> 8) % (uint32_t)config.vocab_size);
    }

    /* Floors. */
    const double hidden = config.hidden_size, inter = config.intermediate_size, hd = config.head_dim;
    const double linear = config.n_layers * (hidden * (config.n_heads + 2.0 * config.n_kv_heads) * hd +
                                             hidden * config.n_heads * hd + 3.0 * hidden * inter);
    const double lm_head = (double)config.vocab_size * hidden;
    const double weight_bytes = 2.0 * (linear + lm_head);
    const double kv_per_position = (double)kv_bytes_per_position(&config, 2);
    printf("shape %s: weights read per decode step %.3f GB, KV %.0f bytes per position\n", shape, weight_bytes / 1e9,
           kv_per_position);
    printf("%-34s %12s %12s %10s\n", "test", "tok/s", "ms/tok,step", "of floor");

    double *samples = malloc((size_t)(reps + 1) * sizeof *samples);
    for (int i = 0; i < n_prompts; i++) {
        const int n = prompts[i];
        if (n <= 0) continue;
        for (int r = 0; r <= reps; r++) {
            TRY(cuda_backend_synchronize(gpu));
            const double t0 = now_s();
            forward(gpu, 0, tokens, n, 0, 1);
            TRY(cuda_backend_synchronize(gpu));
            samples[r] = now_s() - t0;
        }
        const double t = median(samples + 1, reps);
        /* FLOPs: linear layers per token, causal attention (QK and PV), the lm_head for one token. */
        const double attn = 4.0 * config.n_layers * config.n_heads * hd * ((double)n * (n + 1) / 2.0);
        const double flops = 2.0 * linear * n + attn + 2.0 * lm_head;
        char name[64];
        snprintf(name, sizeof name, "pp%d", n);
        printf("%-34s %12.0f %12.4f %9.1f%%   (%.0f TFLOP/s)\n", name, n / t, 1e3 * t / n,
               100.0 * (flops / TENSOR_FLOPS) / t, flops / t / 1e12);
    }

    const int n_variants = variants ? 3 : 1;
    const char *variant_names[3] = {"graph+pdl", "graph", "no graph"};
    const int variant_graph[3] = {1, 1, 0}, variant_pdl[3] = {1, 0, 0};
    for (int d = 0; d < n_depths; d++) {
        const int depth = depths[d];
        fill_context(gpu, tokens, depth, max_batch);
        for (int bi = 0; bi < n_batches; bi++) {
            const int n_seqs = batches[bi];
            for (int v = 0; v < n_variants; v++) {
                TRY(cuda_backend_set_decode_options(gpu, variant_graph[v], variant_pdl[v]));
                const double t = decode_seconds(gpu, tokens, n_seqs, depth, n_gen, reps, samples, 0);
                const double avg_ctx = depth + n_gen / 2.0;
                const double floor_s = (weight_bytes + n_seqs * kv_per_position * avg_ctx) / HBM_BYTES_PER_S;
                char name[64];
                if (n_seqs == 1)
                    snprintf(name, sizeof name, "tg%d @ depth %d (%s)", n_gen, depth, variant_names[v]);
                else
                    snprintf(name, sizeof name, "tg%d x %d @ depth %d (%s)", n_gen, n_seqs, depth, variant_names[v]);
                printf("%-34s %12.1f %12.4f %9.1f%%\n", name, n_seqs / t, 1e3 * t, 100.0 * floor_s / t);
            }
            TRY(cuda_backend_set_decode_options(gpu, 1, 1));
            if (mixed_chunk > 0) {
                const double t = mixed_seconds(gpu, tokens, n_seqs, depth, mixed_chunk, mixed_vary, n_gen, reps, samples);
                char name[64];
                snprintf(name, sizeof name, "mixed %d + pp%d%s @ depth %d", n_seqs, mixed_chunk, mixed_vary ? "-" : "",
                         depth);
                printf("%-34s %12.1f %12.4f %9s\n", name, n_seqs / t, 1e3 * t, "-");
            }
            if (queued) { /* a diagnostic: the same steps without the host's wait for each step's ids */
                const double t = decode_seconds(gpu, tokens, n_seqs, depth, n_gen, reps, samples, 1);
                char name[64];
                snprintf(name, sizeof name, "tg%d x %d @ depth %d (queued)", n_gen, n_seqs, depth);
                printf("%-34s %12.1f %12.4f %9s\n", name, n_seqs / t, 1e3 * t, "-");
            }
        }
    }
    gpu->ops->destroy(gpu);
    dummy_model_free(model);
    free(samples);
    free(table);
    free(tokens);
    return 0;
}

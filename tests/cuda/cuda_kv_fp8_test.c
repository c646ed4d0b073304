/* The CUDA backend's fp8 KV cache (--kv-cache-dtype fp8) against the CPU backend's (the oracle: K/V quantized when
 * written, attention over code x scale in float32), on the Qwen3-0.6B shape with random (dummy) weights; the tiny
 * checkpoints of tests/data have head_dim 16 and 32, which the CUDA backend does not implement:
 * - the stored cache: layer 0's codes and scales, written by the prefill path (two chunks), single-stream decode and
 *   batched decode, equal quant/fp8_kv.c's quantization of the rows a bf16-KV CUDA backend stores for the same
 *   tokens, bit for bit (layer 0's K/V do not depend on the cache's dtype); the positions past the context stay
 *   zero;
 * - teacher-forced logits with 128-position blocks (the engine's default: the wgmma prefill attention over the bf16
 *   view) for a 320-token prompt prefilled in two chunks (3 blocks), then 8 single-stream decode steps, within the
 *   limit of the bf16 CUDA-vs-CPU checks (kite bench's gate, src/bench/bench_gate.h): relative L2 <= max(2e-2,
 *   1.5 x the budget), the budget being how far the CPU oracle moves when it rounds activations to bf16 where the
 *   CUDA prefill path stores them (here with the same fp8 cache). With fp8 the budget is larger than with bf16:
 *   the codes of a vector whose values moved by a bf16 rounding differ where a value crosses a rounding boundary
 *   of fp8 (on the CPU, 0.6B shape, 192 positions: ~3.2e-2 against ~6e-3 with a float32 cache);
 * - greedy tokens over 16 steps under the near-tie rule;
 * - batched decode of B = 4 sequences of 20 to 260 positions, 4 steps, teacher-forced, within the same limit;
 * - a mixed step (two decode rows first, read directly by the split-K decode attention, then a prompt chunk and a
 *   decode row, through the view), within the same limit, with 128- and 16-position blocks;
 * - with 16-position blocks (the mma prefill fallback over the view): two sequences prefilled in one step, then
 *   chunked and decoded, within the same limit;
 * - the pool's sizing: 2 x layers x kv heads x (head_dim + 4) bytes per position;
 * - first, the split-K decode attention alone (single stream and rows) over an fp8 layer against the same kernel over
 *   a bf16 layer holding the same values exactly (power-of-two scales): float32 rounding only; the bulk-fed kernels
 *   refuse fp8. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend_internal.h"
#include "cuda_test_util.h"
#include "logits_compare.h"
#include "model/dummy.h"
#include "quant/fp8.h"
#include "quant/fp8_kv.h"

#define TRY(expr) DEVICE_CHECK(expr)

#define MAX_BLOCKS 48 /* per sequence: 768 positions at 16, 6,144 at 128 */
#define N_SEQS 4

static qwen3_config config;
static dummy_model *model;
static backend *cpu, *cpu_bf16, *gpu, *gpu_bf16; /* cpu_bf16: the CPU oracle rounding activations to bf16 */
static int32_t block_size;
static int32_t tables[N_SEQS][MAX_BLOCKS];
static float *logits_ref, *logits_gpu, *logits_budget;

/* The worst of a comparison: relative L2 to the oracle, the budget of that row, and whether a row broke its limit. */
typedef struct worst_case {
    double rel_l2, budget;
    int failed;
} worst_case;

/* kite bench's gate limit (src/bench/bench_gate.h: GATE_REL_L2, GATE_BF16_FACTOR) for one row. */
static void compare_row(const float *gpu_row, const float *ref_row, const float *budget_row, worst_case *w) {
    const size_t V = (size_t)config.vocab_size;
    const double e = rel_l2(gpu_row, ref_row, V), budget = rel_l2(budget_row, ref_row, V);
    const double limit = 1.5 * budget > 2e-2 ? 1.5 * budget : 2e-2;
    if (e > w->rel_l2) w->rel_l2 = e;
    if (budget > w->budget) w->budget = budget;
    if (e > limit) w->failed = 1;
}

/* Every backend's cache of n_blocks blocks of `size` positions, sequence s's table a scrambled interleaving. */
static void reserve_all(int32_t size, int32_t blocks_per_seq) {
    block_size = size;
    const int32_t n_blocks = N_SEQS * blocks_per_seq;
    TRY(cpu->ops->kv_reserve(cpu, n_blocks, size));
    TRY(cpu_bf16->ops->kv_reserve(cpu_bf16, n_blocks, size));
    TRY(gpu->ops->kv_reserve(gpu, n_blocks, size));
    TRY(gpu_bf16->ops->kv_reserve(gpu_bf16, n_blocks, size));
    for (int s = 0; s < N_SEQS; s++)
        for (int i = 0; i < blocks_per_seq; i++) tables[s][i] = (blocks_per_seq - 1 - i) * N_SEQS + (s + i) % N_SEQS;
}

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

/* The same tokens through the CPU oracles and the fp8 CUDA backend, compared. */
static void both_seq(int seq, const int32_t *tokens, int n, int before, worst_case *worst) {
    run_seq(cpu, seq, tokens, n, before);
    run_seq(cpu_bf16, seq, tokens, n, before);
    run_seq(gpu, seq, tokens, n, before);
    TRY(cpu->ops->read_logits(cpu, logits_ref, 1));
    TRY(cpu_bf16->ops->read_logits(cpu_bf16, logits_budget, 1));
    TRY(gpu->ops->read_logits(gpu, logits_gpu, 1));
    compare_row(logits_gpu, logits_ref, logits_budget, worst);
}

/* A prompt of `prompt` tokens in chunks of first and prompt - first, then `steps` decode steps fed the CPU's argmax. */
static worst_case teacher_forced(int seq, uint32_t seed, int prompt, int first, int steps) {
    int32_t tokens[1024];
    prompt_tokens(tokens, prompt, seed);
    worst_case worst = {0, 0, 0};
    both_seq(seq, tokens, first, 0, &worst);
    both_seq(seq, tokens + first, prompt - first, first, &worst);
    for (int step = 0; step < steps; step++) {
        tokens[prompt + step] = argmax_of(logits_ref, config.vocab_size);
        both_seq(seq, tokens + prompt + step, 1, prompt + step, &worst);
    }
    return worst;
}

static void test_pool_sizing(void) {
    const size_t per_position = 2 * (size_t)config.n_layers * (size_t)config.n_kv_heads * ((size_t)config.head_dim + 4);
    CHECK_MSG(backend_kv_bytes_per_position(gpu) == per_position, "fp8 bytes per position %zu, expected %zu",
              backend_kv_bytes_per_position(gpu), per_position);
    CHECK(cuda_backend_kv_block_bytes(gpu) * (size_t)config.n_layers == per_position * (size_t)block_size);
    CHECK(cuda_backend_kv_block_bytes(gpu_bf16) == 2 * (size_t)config.n_kv_heads * (size_t)block_size *
                                                        (size_t)config.head_dim * 2);
    printf("  fp8 KV: %zu bytes per position (bf16: %zu)\n", per_position, backend_kv_bytes_per_position(gpu_bf16));
}

/* Layer 0 of sequence `seq` (ctx positions) in the fp8 cache against quant/fp8_kv.c over the bf16 cache's rows. */
static void check_stored_layer0(int seq, int ctx) {
    const int H = config.n_kv_heads, D = config.head_dim, bs = block_size;
    const size_t fp8_bytes = cuda_backend_kv_block_bytes(gpu), bf16_bytes = cuda_backend_kv_block_bytes(gpu_bf16);
    unsigned char *fp8_block = xmalloc(fp8_bytes);
    uint16_t *bf16_block = xmalloc(bf16_bytes);
    float *row = xmalloc((size_t)D * 4);
    uint8_t *codes = xmalloc((size_t)D);
    size_t code_diffs = 0, scale_diffs = 0, rows = 0, nonzero_past = 0;
    for (int b = 0; b * bs < ctx; b++) {
        TRY(cuda_backend_read_kv_block(gpu, 0, tables[seq][b], fp8_block, fp8_bytes));
        TRY(cuda_backend_read_kv_block(gpu_bf16, 0, tables[seq][b], bf16_block, bf16_bytes));
        const float *scales = (const float *)(fp8_block + (size_t)2 * H * bs * D);
        for (int kind = 0; kind < 2; kind++)
            for (int h = 0; h < H; h++)
                for (int slot = 0; slot < bs; slot++) {
                    const size_t r = ((size_t)kind * H + (size_t)h) * (size_t)bs + (size_t)slot;
                    const uint8_t *stored = fp8_block + r * (size_t)D;
                    if (b * bs + slot >= ctx) { /* never written */
                        for (int i = 0; i < D; i++) nonzero_past += stored[i] != 0;
                        nonzero_past += scales[r] != 0.0f;
                        continue;
                    }
                    bf16_to_floats(bf16_block + r * (size_t)D, row, (size_t)D);
                    const float scale = fp8_kv_quantize(row, D, codes);
                    code_diffs += (size_t)(memcmp(codes, stored, (size_t)D) != 0);
                    scale_diffs += memcmp(&scale, &scales[r], 4) != 0;
                    rows++;
                }
    }
    printf("  sequence %d, %d positions: %zu of %zu layer-0 rows differ in codes, %zu in scales; %zu bytes past the "
           "context are not zero\n",
           seq, ctx, code_diffs, rows, scale_diffs, nonzero_past);
    CHECK_MSG(rows > 0 && code_diffs == 0 && scale_diffs == 0 && nonzero_past == 0,
              "sequence %d: the stored fp8 rows differ from quant/fp8_kv.c", seq);
    free(fp8_block), free(bf16_block), free(row), free(codes);
}

/* Both CUDA backends take the same steps: prefill in two chunks, 3 single-stream decode steps, 2 batched steps. */
static void test_stored_codes(void) {
    int32_t a[200], b[40];
    prompt_tokens(a, 150, 5);
    prompt_tokens(b, 30, 6);
    for (int i = 0; i < 8; i++) a[150 + i] = 17 * i + 3; /* the decode steps' tokens */
    backend *both[2] = {gpu, gpu_bf16};
    for (int k = 0; k < 2; k++) {
        run_seq(both[k], 0, a, 100, 0);
        run_seq(both[k], 0, a + 100, 50, 100);
        run_seq(both[k], 1, b, 30, 0);
        for (int step = 0; step < 3; step++) run_seq(both[k], 0, a + 150 + step, 1, 150 + step);
    }
    for (int step = 0; step < 2; step++) {
        const int32_t tokens[2] = {a[153 + step], b[step]};
        int32_t start[3] = {0, 1, 2}, ctx[2] = {154 + step, 31 + step};
        const int32_t *bt[2] = {tables[0], tables[1]};
        uint8_t wants[2] = {1, 1};
        step_batch batch = {2, 2, tokens, start, ctx, bt, wants, false, false};
        for (int k = 0; k < 2; k++) TRY(both[k]->ops->forward(both[k], &batch));
    }
    check_stored_layer0(0, 155);
    check_stored_layer0(1, 32);
}

static void report(const char *what, worst_case w) {
    printf("  %s: worst logits rel L2 vs cpu fp8 %.3e (bf16 storage's budget at most %.3e)\n", what, w.rel_l2,
           w.budget);
    CHECK_MSG(!w.failed, "%s: a row's logits rel L2 exceeds max(2e-2, 1.5 x its budget)", what);
}

static void test_teacher_forced(void) {
    char what[128];
    snprintf(what, sizeof what, "block size %d: prompt 320 in chunks of 192 + 128, 8 decode steps", block_size);
    report(what, teacher_forced(0, 1, 320, 192, 8));
}

static void test_greedy(void) {
    const int V = config.vocab_size, prompt = 100, steps = 16;
    int32_t tokens[256];
    prompt_tokens(tokens, prompt, 7);
    run_seq(cpu, 1, tokens, prompt, 0);
    run_seq(gpu, 1, tokens, prompt, 0);
    int step = 0;
    for (; step < steps; step++) {
        int32_t next_cpu, next_gpu;
        TRY(cpu->ops->argmax(cpu, &next_cpu, 1));
        TRY(gpu->ops->argmax(gpu, &next_gpu, 1));
        if (next_cpu != next_gpu) {
            TRY(cpu->ops->read_logits(cpu, logits_ref, 1));
            TRY(gpu->ops->read_logits(gpu, logits_gpu, 1));
            const int ok = in_top5(logits_ref, V, next_gpu) && in_top5(logits_gpu, V, next_cpu);
            printf("  greedy: first difference at step %d (cpu %d, gpu %d): %s\n", step, next_cpu, next_gpu,
                   ok ? "a near tie" : "NOT a near tie");
            CHECK_MSG(ok, "greedy tokens differ at step %d beyond a near tie", step);
            break;
        }
        run_seq(cpu, 1, &next_cpu, 1, prompt + step);
        run_seq(gpu, 1, &next_gpu, 1, prompt + step);
    }
    if (step == steps) printf("  greedy: %d steps identical\n", steps);
}

/* One step batch of n rows through the fp8 CUDA backend and both CPU oracles, every row compared (compare_row);
 * the CPU oracle's rows stay in cpu_rows (n x vocab) for the caller. */
static void step_all_compared(const step_batch *b, int n, float *cpu_rows, worst_case *worst) {
    const size_t V = (size_t)config.vocab_size;
    float *gpu_rows = xmalloc((size_t)n * V * 4), *budget_rows = xmalloc((size_t)n * V * 4);
    TRY(gpu->ops->forward(gpu, b));
    TRY(gpu->ops->read_logits(gpu, gpu_rows, n));
    TRY(cpu->ops->forward(cpu, b));
    TRY(cpu->ops->read_logits(cpu, cpu_rows, n));
    TRY(cpu_bf16->ops->forward(cpu_bf16, b));
    TRY(cpu_bf16->ops->read_logits(cpu_bf16, budget_rows, n));
    for (int s = 0; s < n; s++)
        compare_row(gpu_rows + (size_t)s * V, cpu_rows + (size_t)s * V, budget_rows + (size_t)s * V, worst);
    free(gpu_rows), free(budget_rows);
}

static void test_batched(void) {
    const int V = config.vocab_size, n = N_SEQS;
    const int lengths[N_SEQS] = {20, 70, 140, 260};
    const int32_t *bt[N_SEQS];
    int32_t ctx[N_SEQS], tokens[N_SEQS], start[N_SEQS + 1];
    uint8_t wants[N_SEQS];
    float *cpu_rows = xmalloc((size_t)n * V * 4);
    for (int s = 0; s < n; s++) {
        int32_t prompt[300];
        bt[s] = tables[s];
        prompt_tokens(prompt, lengths[s], 100 + (uint32_t)s);
        run_seq(cpu, s, prompt, lengths[s], 0);
        run_seq(cpu_bf16, s, prompt, lengths[s], 0);
        run_seq(gpu, s, prompt, lengths[s], 0);
        ctx[s] = lengths[s];
        tokens[s] = (int32_t)((s * 7919 + 13) % V);
        wants[s] = 1;
        start[s] = s;
    }
    start[n] = n;
    worst_case worst = {0, 0, 0};
    for (int step = 0; step < 4; step++) {
        for (int s = 0; s < n; s++) ctx[s]++;
        step_batch b = {n, n, tokens, start, ctx, bt, wants, false, false};
        step_all_compared(&b, n, cpu_rows, &worst);
        for (int s = 0; s < n; s++) tokens[s] = argmax_of(cpu_rows + (size_t)s * V, V);
    }
    report("batched decode B=4 (contexts 20-260), 4 steps", worst);
    free(cpu_rows);
}

/* A mixed step as a server runs it: two generating sequences first (one token each, at 301 and 41 positions: the
 * split-K decode attention reading the fp8 codes directly), then a 64-token prompt chunk continuing 100 positions and
 * a third generating sequence after it (both the prefill attention over the bf16 view), within the same limit. */
static void test_mixed_step(void) {
    const int V = config.vocab_size;
    const int before[N_SEQS] = {300, 40, 100, 20}, n_new[N_SEQS] = {1, 1, 64, 1};
    int32_t toks[67], start[N_SEQS + 1] = {0}, ctx[N_SEQS];
    const int32_t *bt[N_SEQS];
    uint8_t wants[N_SEQS] = {1, 1, 1, 1};
    for (int s = 0; s < N_SEQS; s++) {
        int32_t prompt[400];
        prompt_tokens(prompt, before[s] + n_new[s], 300 + (uint32_t)s);
        run_seq(cpu, s, prompt, before[s], 0);
        run_seq(cpu_bf16, s, prompt, before[s], 0);
        run_seq(gpu, s, prompt, before[s], 0);
        memcpy(toks + start[s], prompt + before[s], (size_t)n_new[s] * sizeof(int32_t));
        start[s + 1] = start[s] + n_new[s];
        ctx[s] = before[s] + n_new[s];
        bt[s] = tables[s];
    }
    float *cpu_rows = xmalloc((size_t)N_SEQS * V * 4);
    step_batch b = {N_SEQS, start[N_SEQS], toks, start, ctx, bt, wants, false, false};
    worst_case worst = {0, 0, 0};
    step_all_compared(&b, N_SEQS, cpu_rows, &worst);
    char what[128];
    snprintf(what, sizeof what, "block size %d: mixed step (2 decode rows, a 64-token chunk, a decode row)", block_size);
    report(what, worst);
    free(cpu_rows);
}

/* 16-position blocks: two sequences prefilled in one step (one view group, two sequences), then one of them
 * continued in a chunk and decoded. */
static void test_small_blocks(void) {
    const size_t V = (size_t)config.vocab_size;
    int32_t a[160], b[100];
    prompt_tokens(a, 130, 21);
    prompt_tokens(b, 70, 22);
    int32_t tokens[200];
    memcpy(tokens, a, 90 * sizeof(int32_t));
    memcpy(tokens + 90, b, 70 * sizeof(int32_t));
    int32_t start[3] = {0, 90, 160}, ctx[2] = {90, 70};
    const int32_t *bt[2] = {tables[2], tables[3]};
    uint8_t wants[2] = {1, 1};
    step_batch batch = {2, 160, tokens, start, ctx, bt, wants, false, false};
    float *cpu_rows = xmalloc(2 * V * 4), *gpu_rows = xmalloc(2 * V * 4), *budget_rows = xmalloc(2 * V * 4);
    TRY(cpu->ops->forward(cpu, &batch));
    TRY(cpu->ops->read_logits(cpu, cpu_rows, 2));
    TRY(cpu_bf16->ops->forward(cpu_bf16, &batch));
    TRY(cpu_bf16->ops->read_logits(cpu_bf16, budget_rows, 2));
    TRY(gpu->ops->forward(gpu, &batch));
    TRY(gpu->ops->read_logits(gpu, gpu_rows, 2));
    worst_case worst = {0, 0, 0};
    for (int s = 0; s < 2; s++)
        compare_row(gpu_rows + (size_t)s * V, cpu_rows + (size_t)s * V, budget_rows + (size_t)s * V, &worst);
    both_seq(2, a + 90, 40, 90, &worst);
    for (int step = 0; step < 4; step++) {
        a[130 + step] = argmax_of(logits_ref, config.vocab_size);
        both_seq(2, a + 130 + step, 1, 130 + step, &worst);
    }
    char what[128];
    snprintf(what, sizeof what, "block size %d: two prompts in one step, a chunk of 40, 4 decode steps", block_size);
    report(what, worst);
    free(cpu_rows), free(gpu_rows), free(budget_rows);
}

/* ---- the decode attention over fp8 codes, exactly -------------------------------------------------------
 * An fp8 layer of random codes with power-of-two scales, and a bf16 layer holding code x scale (exact in bf16):
 * cuda_attention_decode(_rows) over the two must agree to float32 rounding (the kernels differ only in the order
 * of a dot product's terms). The new position's V is chosen exact in fp8 (its amax 448 x 2^k) and its K is zero
 * (k_norm 0), so both caches hold the same values after the append; the appended row is checked too. */
#define EXACT_HEADS 16
#define EXACT_KV 8
#define EXACT_BS 16

static float power_of_two_code(uint8_t code, int exponent) { return ldexpf(fp8_e4m3_to_float(code), exponent); }

static uint8_t random_code(void) {
    uint8_t code = (uint8_t)(rng_next() & 0xff);
    return (code & 0x7f) == 0x7f ? 0x7e : code; /* no NaN */
}

static void check_decode_exact(int n_seqs, const int *ctx, int n_splits) {
    const int D = 128, H = EXACT_KV, bs = EXACT_BS;
    int blocks = 0, max_ctx = 0;
    int32_t table_start[8], ctx32[8];
    for (int s = 0; s < n_seqs; s++) {
        table_start[s] = blocks;
        blocks += KITE_TEST_CEIL(ctx[s], bs);
        ctx32[s] = ctx[s];
        if (ctx[s] > max_ctx) max_ctx = ctx[s];
    }
    const int n_blocks = blocks + 1;
    const cuda_kv_layer shape8 = {NULL, bs, H, D, n_blocks, KITE_KV_CACHE_FP8};
    const cuda_kv_layer shape16 = {NULL, bs, H, D, n_blocks, KITE_KV_CACHE_BF16};
    const size_t bytes8 = (size_t)n_blocks * cuda_kv_block_bytes(shape8);
    const size_t bytes16 = (size_t)n_blocks * cuda_kv_block_bytes(shape16);
    unsigned char *fp8 = xmalloc(bytes8);
    uint16_t *bf16 = xmalloc(bytes16);
    const size_t rows_per_block = 2 * (size_t)H * bs;
    for (int b = 0; b < n_blocks; b++) {
        unsigned char *block = fp8 + (size_t)b * cuda_kv_block_bytes(shape8);
        float *scales = (float *)(block + rows_per_block * D);
        for (size_t r = 0; r < rows_per_block; r++) {
            const int exponent = -10 + (int)(rng_next() % 6);
            scales[r] = ldexpf(1.0f, exponent);
            for (int i = 0; i < D; i++) {
                const uint8_t code = random_code();
                block[r * D + i] = code;
                bf16[((size_t)b * rows_per_block + r) * D + i] = float_to_bf16(power_of_two_code(code, exponent));
            }
        }
    }
    int32_t *block_ids = xmalloc((size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) block_ids[i] = (i * 7 + 3) % n_blocks; /* 7 is prime to every n_blocks here */
    const size_t width = (size_t)(EXACT_HEADS + 2 * H) * D, qn = (size_t)EXACT_HEADS * D;
    float *qkv = xmalloc((size_t)n_seqs * width * 4);
    random_f32(qkv, (size_t)n_seqs * width, 1.0f);
    int exponents[8][EXACT_KV];
    for (int s = 0; s < n_seqs; s++)
        for (int h = 0; h < H; h++) { /* the new V: exact codes times 2^k, amax exactly 448 x 2^k */
            float *v = qkv + (size_t)s * width + (size_t)(EXACT_HEADS + H + h) * D;
            exponents[s][h] = -8 + (int)(rng_next() % 4);
            for (int i = 0; i < D; i++) v[i] = power_of_two_code(random_code() & 0x7d, exponents[s][h]);
            v[(h * 5) % D] = ldexpf(h % 2 ? -448.0f : 448.0f, exponents[s][h]);
        }
    float q_norm[128], k_norm[128];
    for (int i = 0; i < D; i++) {
        q_norm[i] = 1.0f + 0.1f * rng_normal();
        k_norm[i] = 0.0f;
    }
    const int positions = max_ctx + 1;
    float *cos_t = xmalloc((size_t)positions * 64 * 4), *sin_t = xmalloc((size_t)positions * 64 * 4);
    for (int p = 0; p < positions; p++)
        for (int i = 0; i < 64; i++) {
            const double angle = p * pow(1000000.0, -2.0 * i / D);
            cos_t[(size_t)p * 64 + i] = (float)cos(angle);
            sin_t[(size_t)p * 64 + i] = (float)sin(angle);
        }
    void *d_fp8 = device_buffer(bytes8, fp8), *d_bf16 = device_buffer(bytes16, bf16);
    float *d_qkv = device_buffer((size_t)n_seqs * width * 4, qkv);
    float *d_out8 = device_buffer((size_t)n_seqs * qn * 4, NULL), *d_out16 = device_buffer((size_t)n_seqs * qn * 4, NULL);
    int32_t *d_tables = device_buffer((size_t)n_blocks * 4, block_ids), *d_start = device_buffer((size_t)n_seqs * 4, table_start);
    int32_t *d_ctx = device_buffer((size_t)n_seqs * 4, ctx32);
    float *d_qn = device_buffer(sizeof q_norm, q_norm), *d_kn = device_buffer(sizeof k_norm, k_norm);
    float *d_cos = device_buffer((size_t)positions * 64 * 4, cos_t), *d_sin = device_buffer((size_t)positions * 64 * 4, sin_t);
    const size_t ws = (size_t)n_seqs * cuda_attention_decode_workspace(EXACT_HEADS, D, n_splits);
    void *d_ws = device_buffer(ws, NULL);
    unsigned *d_counters = device_buffer((size_t)n_seqs * EXACT_HEADS * 4, NULL);
    TRY(kite_cuda_memset(d_counters, 0, (size_t)n_seqs * EXACT_HEADS * 4));
    cuda_kv_layer kv8 = shape8, kv16 = shape16;
    kv8.base = d_fp8;
    kv16.base = d_bf16;
    const float scale = 1.0f / sqrtf((float)D);
    if (n_seqs == 1) {
        TRY(cuda_attention_decode(d_qkv, d_out8, kv8, d_tables, d_ctx, d_qn, d_kn, d_cos, d_sin, 1e-6f, EXACT_HEADS,
                                  scale, n_splits, d_ws, d_counters, NULL, 0));
        TRY(cuda_attention_decode(d_qkv, d_out16, kv16, d_tables, d_ctx, d_qn, d_kn, d_cos, d_sin, 1e-6f, EXACT_HEADS,
                                  scale, n_splits, d_ws, d_counters, NULL, 0));
    } else {
        TRY(cuda_attention_decode_rows(d_qkv, d_out8, 0, kv8, d_tables, d_start, d_ctx, d_qn, d_kn, d_cos, d_sin, 1e-6f,
                                       EXACT_HEADS, scale, n_seqs, n_splits, d_ws, d_counters, NULL, 0));
        TRY(cuda_attention_decode_rows(d_qkv, d_out16, 0, kv16, d_tables, d_start, d_ctx, d_qn, d_kn, d_cos, d_sin,
                                       1e-6f, EXACT_HEADS, scale, n_seqs, n_splits, d_ws, d_counters, NULL, 0));
    }
    TRY(kite_cuda_synchronize());
    float *out8 = xmalloc((size_t)n_seqs * qn * 4), *out16 = xmalloc((size_t)n_seqs * qn * 4);
    double *ref = xmalloc((size_t)n_seqs * qn * 8);
    TRY(kite_cuda_copy_to_host(out8, d_out8, (size_t)n_seqs * qn * 4));
    TRY(kite_cuda_copy_to_host(out16, d_out16, (size_t)n_seqs * qn * 4));
    for (size_t i = 0; i < (size_t)n_seqs * qn; i++) ref[i] = out16[i];
    const double e = nmse(out8, ref, (size_t)n_seqs * qn);
    /* The appended rows: V's codes exact with scale 2^k, K zero with scale 0. */
    unsigned char *back = xmalloc(bytes8);
    TRY(kite_cuda_copy_to_host(back, d_fp8, bytes8));
    size_t bad_rows = 0;
    for (int s = 0; s < n_seqs; s++) {
        const int position = ctx[s] - 1, b = block_ids[table_start[s] + position / bs], slot = position % bs;
        const unsigned char *block = back + (size_t)b * cuda_kv_block_bytes(shape8);
        const float *scales = (const float *)(block + rows_per_block * D);
        for (int h = 0; h < H; h++) {
            const size_t k_row = (size_t)h * bs + (size_t)slot, v_row = ((size_t)H + h) * bs + (size_t)slot;
            const float *v = qkv + (size_t)s * width + (size_t)(EXACT_HEADS + H + h) * D;
            int bad = scales[k_row] != 0.0f || scales[v_row] != ldexpf(1.0f, exponents[s][h]);
            for (int i = 0; i < D; i++) {
                bad |= (block[k_row * D + i] & 0x7f) != 0;
                bad |= power_of_two_code(block[v_row * D + i], exponents[s][h]) != v[i];
            }
            bad_rows += (size_t)bad;
        }
    }
    printf("  decode over fp8 codes, %d sequence(s) (context %d..%d), %d splits: nmse vs the bf16 layer of the same "
           "values %.2e; %zu appended rows wrong\n",
           n_seqs, ctx[0], ctx[n_seqs - 1], n_splits, e, bad_rows);
    CHECK_MSG(e <= 1e-9 && bad_rows == 0, "fp8 decode attention: nmse %.3e, %zu bad appended rows", e, bad_rows);
    CHECK(guard_intact(d_fp8, bytes8) && guard_intact(d_out8, (size_t)n_seqs * qn * 4));
    kite_cuda_free(d_fp8), kite_cuda_free(d_bf16), kite_cuda_free(d_qkv), kite_cuda_free(d_out8);
    kite_cuda_free(d_out16), kite_cuda_free(d_tables), kite_cuda_free(d_start), kite_cuda_free(d_ctx);
    kite_cuda_free(d_qn), kite_cuda_free(d_kn), kite_cuda_free(d_cos), kite_cuda_free(d_sin), kite_cuda_free(d_ws);
    kite_cuda_free(d_counters);
    free(fp8), free(bf16), free(block_ids), free(qkv), free(cos_t), free(sin_t), free(out8), free(out16), free(ref);
    free(back);
}

static void test_decode_attention_exact(void) {
    const int one_split[1] = {20}, long_ctx[1] = {1000}, rows[3] = {37, 300, 999};
    check_decode_exact(1, one_split, 8);
    check_decode_exact(1, long_ctx, 8);
    check_decode_exact(3, rows, 4);
    /* The bulk-fed kernels refuse an fp8 cache by name. */
    const cuda_kv_layer shape = {NULL, 16, EXACT_KV, 128, 0, KITE_KV_CACHE_FP8};
    CHECK(cuda_attention_decode_bulk_size(EXACT_HEADS, shape) == 0);
    CHECK(cuda_attention_decode_bulk_rows_size(EXACT_HEADS, shape, 4) == 0);
    CHECK(cuda_attention_decode_bulk(NULL, NULL, shape, NULL, NULL, NULL, NULL, NULL, NULL, 0.0f, EXACT_HEADS, 1.0f, 8,
                                     NULL, 0) == KITE_ERROR_UNSUPPORTED);
}

int main(void) {
    char reason[256];
    if (!cuda_backend_available(reason, sizeof reason)) {
        char why[300];
        snprintf(why, sizeof why, "CUDA backend unavailable: %s", reason);
        test_skip(why);
    }
    TEST_RUN(test_decode_attention_exact);

    TRY(known_shape_config("qwen3-0.6b-base", &config));
    TRY(dummy_model_create(&config, 4321, &model));
    const qwen3_weights *w = dummy_model_weights(model);
    backend_params fp8 = {.n_threads = 0, .device = 0, .weights = KITE_WEIGHTS_BF16,
                          .kv_cache_dtype = KITE_KV_CACHE_FP8};
    backend_params bf16 = fp8;
    bf16.kv_cache_dtype = KITE_KV_CACHE_BF16;
    TRY(cpu_backend_create(&config, w, &fp8, &cpu));
    backend_params fp8_rounded = fp8;
    fp8_rounded.emulate_bf16_activations = 1;
    TRY(cpu_backend_create(&config, w, &fp8_rounded, &cpu_bf16));
    TRY(cuda_backend_create(&config, w, &fp8, &gpu));
    TRY(cuda_backend_create(&config, w, &bf16, &gpu_bf16));
    /* The bf16 reference of the stored codes decodes through the split-K kernel too (single stream and batches), as
     * the fp8 backend always does, so that both compute the new K and V with the same code. */
    TRY(cuda_backend_set_bulk_max_context(gpu_bf16, 0));
    TRY(cuda_backend_set_batch_bulk_max_rows(gpu_bf16, 0));
    logits_ref = xmalloc((size_t)config.vocab_size * 4);
    logits_gpu = xmalloc((size_t)config.vocab_size * 4);
    logits_budget = xmalloc((size_t)config.vocab_size * 4);

    reserve_all(128, 4);
    TEST_RUN(test_pool_sizing);
    TEST_RUN(test_stored_codes);
    TEST_RUN(test_teacher_forced);
    TEST_RUN(test_greedy);
    TEST_RUN(test_batched);
    TEST_RUN(test_mixed_step);
    reserve_all(16, MAX_BLOCKS);
    TEST_RUN(test_stored_codes);
    TEST_RUN(test_small_blocks);
    TEST_RUN(test_mixed_step);

    gpu_bf16->ops->destroy(gpu_bf16);
    gpu->ops->destroy(gpu);
    cpu_bf16->ops->destroy(cpu_bf16);
    cpu->ops->destroy(cpu);
    dummy_model_free(model);
    free(logits_ref), free(logits_gpu), free(logits_budget);
    return test_finish();
}

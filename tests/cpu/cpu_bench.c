/* Speed of the CPU backend on a named shape with random weights (not a ctest: it takes a while).
 *
 *   cpu_bench [--shape qwen3-0.6b-base] [--layers N] [--prompt 256] [--decode 16] [--threads 0]
 *
 * --layers overrides the shape's layer count, so a quick run can time a few layers of a real shape.
 * Prints prefill and decode tokens/s, a checksum of the last logits and an FNV-1a hash of the bits of the
 * prefill's and the last decode step's logits (a fingerprint across runs: a kernel change must keep it).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "model/dummy.h"
#include "util/error.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* FNV-1a over the bytes of n floats: any changed bit changes it. */
static uint64_t hash_floats(const float *x, int32_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *bytes = (const unsigned char *)x;
    for (size_t i = 0; i < (size_t)n * sizeof *x; i++) h = (h ^ bytes[i]) * 1099511628211ull;
    return h;
}

static int fail(const char *what) {
    fprintf(stderr, "cpu_bench: %s: %s\n", what, kite_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *shape = "qwen3-0.6b-base";
    int layers = 0, prompt = 256, decode = 16, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--shape") == 0) shape = argv[i + 1];
        else if (strcmp(argv[i], "--layers") == 0) layers = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--prompt") == 0) prompt = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--decode") == 0) decode = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "cpu_bench: unknown option %s\n", argv[i]);
            return 1;
        }
    }
    if (prompt < 1 || decode < 0 || threads < 0 || layers < 0) {
        fprintf(stderr, "cpu_bench: bad numbers\n");
        return 1;
    }
    qwen3_config config;
    if (known_shape_config(shape, &config) != KITE_OK) return fail("shape");
    if (layers > 0) config.n_layers = layers;

    double t0 = now_seconds();
    dummy_model *model = NULL;
    if (dummy_model_create(&config, 1, &model) != KITE_OK) return fail("dummy model");
    double t_weights = now_seconds();
    backend_params params = {.n_threads = threads, .device = 0};
    backend *b = NULL;
    if (cpu_backend_create(&config, dummy_model_weights(model), &params, &b) != KITE_OK) return fail("create");
    const int32_t block_size = 16;
    int32_t total = prompt + decode;
    int32_t n_blocks = (total + block_size - 1) / block_size;
    if (b->ops->kv_reserve(b, n_blocks, block_size) != KITE_OK) return fail("kv_reserve");
    double t1 = now_seconds();

    int32_t *ids = malloc((size_t)total * sizeof *ids);
    int32_t *table = malloc((size_t)n_blocks * sizeof *table);
    float *logits = malloc((size_t)config.vocab_size * sizeof *logits);
    if (!ids || !table || !logits) {
        fprintf(stderr, "cpu_bench: out of memory\n");
        return 1;
    }
    for (int32_t i = 0; i < total; i++) ids[i] = (int32_t)((1000003u * (uint32_t)i + 17u) % (uint32_t)config.vocab_size);
    for (int32_t i = 0; i < n_blocks; i++) table[i] = n_blocks - 1 - i;

    int32_t starts[2] = {0, prompt};
    int32_t context = prompt;
    const int32_t *tables[1] = {table};
    uint8_t wants[1] = {1};
    step_batch batch = {.n_seqs = 1, .n_tokens = prompt, .token_ids = ids, .seq_token_start = starts,
                        .seq_context_len = &context, .block_tables = tables, .seq_wants_logits = wants};
    double t2 = now_seconds();
    if (b->ops->forward(b, &batch) != KITE_OK) return fail("prefill");
    double t3 = now_seconds();
    if (b->ops->read_logits(b, logits, 1) != KITE_OK) return fail("read_logits");
    uint64_t prefill_hash = hash_floats(logits, config.vocab_size);
    int32_t next = 0;
    for (int32_t i = 0; i < decode; i++) {
        if (b->ops->argmax(b, &next, 1) != KITE_OK) return fail("argmax");
        ids[prompt + i] = next;
        starts[1] = 1;
        context = prompt + i + 1;
        batch.n_tokens = 1;
        batch.token_ids = ids + prompt + i;
        if (b->ops->forward(b, &batch) != KITE_OK) return fail("decode");
    }
    double t4 = now_seconds();
    if (b->ops->read_logits(b, logits, 1) != KITE_OK) return fail("read_logits");
    double checksum = 0.0;
    for (int32_t i = 0; i < config.vocab_size; i++) checksum += (double)logits[i] * (double)((i % 7) + 1);

    printf("shape %s, %d layers, threads %d: random weights %.2f s, backend create %.2f s\n", shape,
           config.n_layers, threads, t_weights - t0, t1 - t_weights);
    printf("prefill %d tokens: %.3f s, %.1f tok/s\n", prompt, t3 - t2, prompt / (t3 - t2));
    if (decode > 0) printf("decode %d tokens: %.3f s, %.2f tok/s\n", decode, t4 - t3, decode / (t4 - t3));
    printf("logits checksum %.9g\n", checksum);
    printf("logits bits: prefill %016llx, last %016llx\n", (unsigned long long)prefill_hash,
           (unsigned long long)hash_floats(logits, config.vocab_size));
    free(ids);
    free(table);
    free(logits);
    b->ops->destroy(b);
    dummy_model_free(model);
    return 0;
}

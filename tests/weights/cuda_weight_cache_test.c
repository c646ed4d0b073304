/* The weight cache on the CUDA backend: a load that fills the entry and one that reads it run to the very greedy
 * tokens and log-probabilities of a load that bypasses the cache, on checkpoints written here in shapes the CUDA
 * kernels run (head_dim 128, Qwen3's vocabulary): tied, untied, an FP8 checkpoint under --weights bf16, and one of
 * more than 1 GiB (two segments). The read reports KITE_LOAD_STAGE_CACHE_READ and counts every byte once; a
 * truncated entry and one with a flipped data byte are one notice each and a rebuild with the same tokens; --weights
 * fp8 (a bf16 checkpoint quantized on the device, an FP8 one's codes kept) fills an fp8 entry whose hit runs to the
 * uncached tokens too. Skips (exit 77, saying why) where there is no usable GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache_runs.h"
#include "checkpoint_writer.h"
#include "kite.h"
#include "test_util.h"

static char *work; /* the checkpoints written for this run */

/* A shape the CUDA kernels implement (head_dim 128), small but for Qwen3's vocabulary, which the tokenizer of
 * tests/data needs. */
static checkpoint_writer_shape small_shape(bool tied) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    shape.vocab_size = 151936;
    shape.hidden_size = 256;
    shape.intermediate_size = 512;
    shape.n_layers = 2;
    shape.n_heads = 4;
    shape.n_kv_heads = 2;
    shape.head_dim = 128;
    shape.tie_word_embeddings = tied;
    shape.seed = 2026;
    return shape;
}

/* Writes checkpoint `name` of `shape` under work; returns its folder. */
static const char *write_model(const char *name, const checkpoint_writer_shape *shape) {
    static char dirs[8][1024];
    static int n_dirs;
    if (!work || n_dirs == 8) return NULL;
    char *dir = dirs[n_dirs++];
    snprintf(dir, sizeof dirs[0], "%s/%s", work, name);
    return cache_write_checkpoint(dir, shape) ? dir : NULL;
}

static run_result run_cuda(const char *dir, kite_weights weights, const char *cache) {
    return cache_run(dir, KITE_BACKEND_CUDA, weights, cache);
}

static const char *weights_name(kite_weights weights) { return weights == KITE_WEIGHTS_FP8 ? "fp8" : "bf16"; }

/* The one entry of folder cache, listed: a CUDA entry of this device's architecture. Returns its file size. */
static uint64_t check_listed_entry(const char *cache, const char *model, kite_weights weights) {
    kite_weight_cache_entry *entries = NULL;
    size_t n = 0;
    CHECK(kite_weight_cache_list(cache, &entries, &n) == KITE_OK);
    uint64_t bytes = 0;
    CHECK_MSG(n == 1, "%s: %zu entries", model, n);
    if (n == 1) {
        CHECK_MSG(entries[0].problem == NULL && strcmp(entries[0].backend, "cuda") == 0 &&
                      strncmp(entries[0].arch, "sm_", 3) == 0 && strcmp(entries[0].weights, weights_name(weights)) == 0,
                  "%s: entry %s: %s %s/%s", model, entries[0].file, entries[0].weights, entries[0].backend,
                  entries[0].arch);
        bytes = entries[0].bytes;
        printf("  %s: entry %s, %s/%s, %.1f MB\n", model, entries[0].file, entries[0].backend, entries[0].arch,
               (double)bytes / 1e6);
    }
    kite_weight_cache_list_free(entries, n);
    return bytes;
}

/* Uncached, filling and cached loads of dir give the same run; returns the entry's file size (0: none). */
static uint64_t check_cached_matches(const char *dir, kite_weights weights) {
    if (!dir) return 0;
    char *cache = cache_temp_dir();
    if (!cache) return 0;
    run_result plain = run_cuda(dir, weights, "off");
    run_result first = run_cuda(dir, weights, cache);
    run_result second = run_cuda(dir, weights, cache);
    CHECK_MSG(plain.log.from_checkpoint && !plain.log.filled, "%s: an uncached load", dir);
    CHECK_MSG(first.log.from_checkpoint && first.log.filled && !first.log.from_cache, "%s: the first load fills", dir);
    CHECK_MSG(second.log.from_cache && !second.log.from_checkpoint && !second.log.filled,
              "%s: the second load reads the entry (KITE_LOAD_STAGE_CACHE_READ)", dir);
    CHECK_MSG(first.log.notices == 0 && second.log.notices == 0, "%s: no notice expected: %s%s", dir, first.log.notice,
              second.log.notice);
    CHECK_MSG(second.log.cache_read_total > 0 && second.log.cache_read_done == second.log.cache_read_total,
              "%s: the cache read counted %llu of %llu bytes", dir, (unsigned long long)second.log.cache_read_done,
              (unsigned long long)second.log.cache_read_total);
    CHECK_MSG(cache_runs_same(&plain, &first) && cache_runs_same(&plain, &second),
              "%s: cached and uncached tokens or log-probabilities differ", dir);
    if (plain.ok && second.ok)
        printf("  %s: tokens %d %d %d ..., first log-probability %.6f, cached and uncached alike\n", dir,
               plain.tokens[0], plain.tokens[1], plain.tokens[2], (double)plain.logprobs[0]);
    const uint64_t bytes = check_listed_entry(cache, dir, weights);
    CHECK(cache_count_files(cache, ".tmp.", NULL, 0) == 0);
    cache_remove_tree(cache);
    free(cache);
    return bytes;
}

static void test_tied(void) {
    checkpoint_writer_shape shape = small_shape(true);
    check_cached_matches(write_model("tied", &shape), KITE_WEIGHTS_BF16);
}

static void test_untied(void) {
    checkpoint_writer_shape shape = small_shape(false);
    check_cached_matches(write_model("untied", &shape), KITE_WEIGHTS_BF16);
}

/* Qwen's FP8 layout, dequantized to bf16 at an uncached load: a hit skips the dequantization. */
static void test_fp8_checkpoint_as_bf16(void) {
    checkpoint_writer_shape shape = small_shape(true);
    shape.fp8_linear = true;
    check_cached_matches(write_model("fp8", &shape), KITE_WEIGHTS_BF16);
}

/* Weights past 1 GiB are two segments (weights.0 of 1 GiB, weights.1 the rest). */
static void test_two_segments(void) {
    checkpoint_writer_shape shape = small_shape(false);
    shape.hidden_size = 2048;
    shape.intermediate_size = 6144;
    shape.n_layers = 1;
    shape.n_heads = 16;
    shape.n_kv_heads = 8;
    const uint64_t bytes = check_cached_matches(write_model("two-segments", &shape), KITE_WEIGHTS_BF16);
    CHECK_MSG(bytes > ((uint64_t)1 << 30), "the entry holds %llu bytes, not past 1 GiB", (unsigned long long)bytes);
}

typedef enum damage { DAMAGE_TRUNCATE, DAMAGE_DATA_BYTE } damage;

/* Fills an entry, damages it, and checks the next load says so in one notice, rebuilds it and runs to the same
 * tokens; the load after that reads the rebuilt entry. */
static void check_damage(const char *dir, damage kind, const char *word) {
    char *cache = cache_temp_dir();
    if (!dir || !cache) return;
    run_result plain = run_cuda(dir, KITE_WEIGHTS_BF16, "off");
    run_result filled = run_cuda(dir, KITE_WEIGHTS_BF16, cache);
    CHECK(filled.log.filled);
    char entry[1024] = "";
    CHECK(cache_count_files(cache, ".kwc", entry, sizeof entry) == 1);
    if (kind == DAMAGE_TRUNCATE)
        CHECK(truncate(entry, 5000) == 0);
    else
        CHECK(cache_flip_byte(entry, 7, true));
    run_result rebuilt = run_cuda(dir, KITE_WEIGHTS_BF16, cache);
    CHECK_MSG(rebuilt.log.notices == 1 && strstr(rebuilt.log.notice, word) && strstr(rebuilt.log.notice, "rebuild"),
              "expected one notice saying '%s', got %d: %s", word, rebuilt.log.notices, rebuilt.log.notice);
    CHECK(rebuilt.log.from_checkpoint && rebuilt.log.filled && !rebuilt.log.from_cache);
    CHECK_MSG(cache_runs_same(&plain, &rebuilt), "the rebuilt run's tokens differ (%s)", word);
    run_result again = run_cuda(dir, KITE_WEIGHTS_BF16, cache);
    CHECK(again.log.from_cache && again.log.notices == 0 && cache_runs_same(&plain, &again));
    cache_remove_tree(cache);
    free(cache);
}

static const char *damage_model(void) {
    static const char *dir;
    if (!dir) {
        checkpoint_writer_shape shape = small_shape(true);
        dir = write_model("damage", &shape);
    }
    return dir;
}

static void test_damage_truncated(void) { check_damage(damage_model(), DAMAGE_TRUNCATE, "truncated"); }
static void test_damage_data_byte(void) { check_damage(damage_model(), DAMAGE_DATA_BYTE, "checksum"); }

/* --weights fp8 through the cache: a bf16 checkpoint's weights quantized on the device, an FP8 checkpoint's codes
 * kept; an entry of fp8 codes and scales, and a hit runs as the uncached load. */
static void test_fp8_mode(void) {
    checkpoint_writer_shape shape = small_shape(true);
    check_cached_matches(write_model("bf16-as-fp8", &shape), KITE_WEIGHTS_FP8);
    shape.fp8_linear = true;
    check_cached_matches(write_model("fp8-as-fp8", &shape), KITE_WEIGHTS_FP8);
}

int main(void) {
    kite_backend_probe_result probe;
    if (kite_backend_probe(KITE_BACKEND_CUDA, 0, &probe) != KITE_OK || !probe.available) test_skip(probe.reason);
    work = cache_temp_dir();
    TEST_RUN(test_tied);
    TEST_RUN(test_untied);
    TEST_RUN(test_fp8_checkpoint_as_bf16);
    TEST_RUN(test_two_segments);
    TEST_RUN(test_damage_truncated);
    TEST_RUN(test_damage_data_byte);
    TEST_RUN(test_fp8_mode);
    if (work) cache_remove_tree(work);
    free(work);
    return test_finish();
}

/* The weight cache (weights/weight_cache.h) on the CPU backend: a load from a cache entry runs to the very
 * tokens and log-probabilities of a load from the checkpoint (bf16 and fp8, tied and untied); every kind of
 * damage (truncated, a flipped data byte, a flipped header byte, a changed checkpoint = stale, another mode's
 * entry in the slot = foreign, a folder that cannot be written) is one notice and a rebuild, and the run still
 * gives the same tokens; an FP8 checkpoint's entries match too; two processes filling one entry at once both
 * succeed and leave a valid entry; the hash is XXH64. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache_runs.h"
#include "kite.h"
#include "test_util.h"
#include "util/hash64.h"

/* The CPU backend (2 threads). */
static run_result cache_run_cpu(const char *dir, kite_weights weights, const char *cache) {
    return cache_run(dir, KITE_BACKEND_CPU, weights, cache);
}

/* ---- cases ---------------------------------------------------------------------------------------------- */

static void test_hash64_is_xxh64(void) {
    /* The reference implementation's XXH64(data, size, 0). */
    CHECK(hash64("", 0) == 0xEF46DB3751D8E999ULL);
    CHECK(hash64("a", 1) == 0xD24EC4F1A98C6E5BULL);
    CHECK(hash64("abc", 3) == 0x44BC2CF5AD770999ULL);
    CHECK(hash64_seeded("abc", 3, 0) == hash64("abc", 3));
    CHECK(hash64_seeded("abc", 3, 1) != hash64("abc", 3));
    const char *long_text = "Nobody inspects the spammish repetition";
    CHECK(hash64(long_text, strlen(long_text)) == 0xFBCEA83C8A378BF1ULL);
}

static void check_cached_matches(const char *model, kite_weights weights) {
    char *cache = cache_temp_dir();
    if (!cache) return;
    run_result plain = cache_run_cpu(model, weights, "off");
    run_result first = cache_run_cpu(model, weights, cache);
    run_result second = cache_run_cpu(model, weights, cache);
    CHECK_MSG(plain.log.from_checkpoint && !plain.log.filled, "%s: an uncached load", model);
    CHECK_MSG(first.log.from_checkpoint && first.log.filled && !first.log.from_cache, "%s: the first load fills",
              model);
    CHECK_MSG(second.log.from_cache && !second.log.from_checkpoint && !second.log.filled,
              "%s: the second load reads the entry", model);
    CHECK_MSG(first.log.notices == 0 && second.log.notices == 0, "%s: no notice expected: %s", model,
              second.log.notice);
    /* Every byte of the entry is counted once. */
    CHECK_MSG(second.log.cache_read_total > 0 && second.log.cache_read_done == second.log.cache_read_total,
              "%s: the cache read counted %llu of %llu bytes", model, (unsigned long long)second.log.cache_read_done,
              (unsigned long long)second.log.cache_read_total);
    CHECK_MSG(cache_runs_same(&plain, &first) && cache_runs_same(&plain, &second), "%s (%s): cached and uncached tokens differ",
              model, weights == KITE_WEIGHTS_FP8 ? "fp8" : "bf16");
    CHECK(cache_count_files(cache, ".kwc", NULL, 0) == 1 && cache_count_files(cache, ".tmp.", NULL, 0) == 0);
    cache_remove_tree(cache);
    free(cache);
}

static void test_cached_equals_uncached(void) {
    check_cached_matches(KITE_TEST_DATA_DIR "/tiny", KITE_WEIGHTS_BF16);
    check_cached_matches(KITE_TEST_DATA_DIR "/tiny", KITE_WEIGHTS_FP8);
    check_cached_matches(KITE_TEST_DATA_DIR "/tiny-untied", KITE_WEIGHTS_BF16);
    check_cached_matches(KITE_TEST_DATA_DIR "/tiny-untied", KITE_WEIGHTS_FP8);
}

typedef enum damage { DAMAGE_TRUNCATE, DAMAGE_DATA_BYTE, DAMAGE_HEADER_BYTE, DAMAGE_STALE, DAMAGE_FOREIGN } damage;

/* Fills an entry of a copy of tiny-vocab1k, damages it, and checks the next load says so in one notice, rebuilds, and
 * runs to the same tokens; the load after that reads the rebuilt entry. */
static void check_damage(damage kind, const char *word) {
    char *work = cache_temp_dir();
    char *cache = cache_temp_dir();
    if (!work || !cache) return;
    CHECK(cache_copy_checkpoint(KITE_TEST_DATA_DIR "/tiny-vocab1k", work));
    run_result plain = cache_run_cpu(work, KITE_WEIGHTS_BF16, "off");
    run_result filled = cache_run_cpu(work, KITE_WEIGHTS_BF16, cache);
    CHECK(filled.log.filled);
    char entry[1024] = "";
    CHECK(cache_count_files(cache, ".kwc", entry, sizeof entry) == 1);
    switch (kind) {
    case DAMAGE_TRUNCATE: CHECK(truncate(entry, 5000) == 0); break;
    case DAMAGE_DATA_BYTE: CHECK(cache_flip_byte(entry, 7, true)); break;
    case DAMAGE_HEADER_BYTE: CHECK(cache_flip_byte(entry, 100, false)); break;
    case DAMAGE_STALE: {
        char path[1024];
        snprintf(path, sizeof path, "%s/model.safetensors", work);
        struct timespec times[2] = {{.tv_sec = 1000000000, .tv_nsec = 0}, {.tv_sec = 1000000000, .tv_nsec = 0}};
        CHECK(utimensat(AT_FDCWD, path, times, 0) == 0);
        break;
    }
    case DAMAGE_FOREIGN: {
        /* An fp8 entry of the same checkpoint, renamed into the bf16 entry's place. */
        char *other = cache_temp_dir();
        if (!other) break;
        run_result fp8 = cache_run_cpu(work, KITE_WEIGHTS_FP8, other);
        CHECK(fp8.log.filled);
        char fp8_entry[1024] = "";
        CHECK(cache_count_files(other, ".kwc", fp8_entry, sizeof fp8_entry) == 1);
        CHECK(rename(fp8_entry, entry) == 0);
        cache_remove_tree(other);
        free(other);
        break;
    }
    }
    run_result rebuilt = cache_run_cpu(work, KITE_WEIGHTS_BF16, cache);
    CHECK_MSG(rebuilt.log.notices == 1 && strstr(rebuilt.log.notice, word) && strstr(rebuilt.log.notice, "rebuild"),
              "expected one notice saying '%s', got %d: %s", word, rebuilt.log.notices, rebuilt.log.notice);
    CHECK(rebuilt.log.from_checkpoint && rebuilt.log.filled && !rebuilt.log.from_cache);
    CHECK_MSG(cache_runs_same(&plain, &rebuilt), "the rebuilt run's tokens differ (%s)", word);
    run_result again = cache_run_cpu(work, KITE_WEIGHTS_BF16, cache);
    CHECK(again.log.from_cache && again.log.notices == 0 && cache_runs_same(&plain, &again));
    cache_remove_tree(work);
    cache_remove_tree(cache);
    free(work);
    free(cache);
}

static void test_damage_truncated(void) { check_damage(DAMAGE_TRUNCATE, "truncated"); }
static void test_damage_data_byte(void) { check_damage(DAMAGE_DATA_BYTE, "checksum"); }
static void test_damage_header_byte(void) { check_damage(DAMAGE_HEADER_BYTE, "damaged"); }
static void test_damage_stale(void) { check_damage(DAMAGE_STALE, "stale"); }
static void test_damage_foreign(void) { check_damage(DAMAGE_FOREIGN, "foreign"); }

/* A cache folder that cannot be made (a path through a regular file) or written: one notice, an uncached run. */
static void test_unusable_folder(void) {
    char *work = cache_temp_dir();
    if (!work) return;
    run_result plain = cache_run_cpu(KITE_TEST_DATA_DIR "/tiny-vocab1k", KITE_WEIGHTS_BF16, "off");
    char file[1024], below[1100];
    snprintf(file, sizeof file, "%s/a-file", work);
    FILE *f = fopen(file, "w");
    CHECK(f && fclose(f) == 0);
    snprintf(below, sizeof below, "%s/cache", file);
    run_result r = cache_run_cpu(KITE_TEST_DATA_DIR "/tiny-vocab1k", KITE_WEIGHTS_BF16, below);
    CHECK_MSG(r.log.notices == 1 && strstr(r.log.notice, "without the weight cache"), "%d: %s", r.log.notices,
              r.log.notice);
    CHECK(r.log.from_checkpoint && !r.log.filled && cache_runs_same(&plain, &r));
    char locked[1024];
    snprintf(locked, sizeof locked, "%s/read-only", work);
    CHECK(mkdir(locked, 0500) == 0);
    if (access(locked, W_OK) == 0) {
        printf("  (running as root: a 0500 folder is writable, so only the path through a file is checked)\n");
    } else {
        run_result ro = cache_run_cpu(KITE_TEST_DATA_DIR "/tiny-vocab1k", KITE_WEIGHTS_BF16, locked);
        CHECK_MSG(ro.log.notices == 1 && strstr(ro.log.notice, "not filled"), "%d: %s", ro.log.notices, ro.log.notice);
        CHECK(ro.log.from_checkpoint && !ro.log.filled && cache_runs_same(&plain, &ro));
    }
    CHECK(chmod(locked, 0700) == 0);
    cache_remove_tree(work);
    free(work);
}

/* Runs `kite run` on tiny with cache folder `cache`, its stdout into out_path; returns the child's pid. */
static pid_t spawn_run(const char *cache, const char *out_path) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0) _exit(126);
    char *argv[] = {(char *)KITE_CLI_PATH, "run", "--model", (char *)KITE_TEST_DATA_DIR "/tiny-untied", "--backend",
                    "cpu", "--threads", "1", "--prompt", "Hello there", "--max-tokens", "8", "--weight-cache",
                    (char *)cache, NULL};
    execv(KITE_CLI_PATH, argv);
    _exit(127);
}

static bool read_text(const char *path, char *out, size_t capacity) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t n = fread(out, 1, capacity - 1, f);
    out[n] = '\0';
    return fclose(f) == 0 && n > 0;
}

static void test_two_processes_fill_one_entry(void) {
    char *work = cache_temp_dir();
    if (!work) return;
    char cache[1100], reference[1100], outputs[3][1100];
    snprintf(cache, sizeof cache, "%s/cache", work);
    snprintf(reference, sizeof reference, "%s/reference.txt", work);
    pid_t first = spawn_run("off", reference);
    int status = 0;
    CHECK(waitpid(first, &status, 0) == first && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char want[4096], got[4096];
    CHECK(read_text(reference, want, sizeof want));
    for (int round = 0; round < 2; round++) {
        pid_t pids[2];
        for (int i = 0; i < 2; i++) {
            snprintf(outputs[i], sizeof outputs[i], "%s/out%d.txt", work, i);
            pids[i] = spawn_run(cache, outputs[i]);
            CHECK(pids[i] > 0);
        }
        for (int i = 0; i < 2; i++) {
            CHECK(waitpid(pids[i], &status, 0) == pids[i]);
            CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "round %d process %d: status %d", round, i, status);
            CHECK(read_text(outputs[i], got, sizeof got) && strcmp(got, want) == 0);
        }
        CHECK(cache_count_files(cache, ".kwc", NULL, 0) == 1 && cache_count_files(cache, ".tmp.", NULL, 0) == 0);
        if (round == 0) CHECK(kite_weight_cache_clear(cache, NULL) == KITE_OK);
    }
    /* What they left is a whole entry: the next load reads it without a notice. */
    run_result plain = cache_run_cpu(KITE_TEST_DATA_DIR "/tiny-untied", KITE_WEIGHTS_BF16, "off");
    run_result cached = cache_run_cpu(KITE_TEST_DATA_DIR "/tiny-untied", KITE_WEIGHTS_BF16, cache);
    CHECK(cached.log.from_cache && cached.log.notices == 0 && cache_runs_same(&plain, &cached));
    cache_remove_tree(work);
    free(work);
}

/* An FP8 checkpoint in Qwen's layout (kite_checkpoint_writer quantizes its twin's BF16 values as kite does):
 * cached and uncached alike in both modes, and under --weights fp8 the very run of its twin quantized at load. */
static void test_fp8_checkpoint(void) {
    char *work = cache_temp_dir();
    if (!work) return;
    char bf16_dir[1100], fp8_dir[1100];
    snprintf(bf16_dir, sizeof bf16_dir, "%s/bf16", work);
    snprintf(fp8_dir, sizeof fp8_dir, "%s/fp8", work);
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    shape.vocab_size = 1024; /* tiny-vocab1k's tokenizer */
    shape.hidden_size = 160; /* two 128-column blocks, the second partial */
    shape.intermediate_size = 192;
    bool ok = cache_write_checkpoint(bf16_dir, &shape);
    shape.fp8_linear = true;
    ok = ok && cache_write_checkpoint(fp8_dir, &shape);
    if (ok) {
        check_cached_matches(fp8_dir, KITE_WEIGHTS_BF16);
        check_cached_matches(fp8_dir, KITE_WEIGHTS_FP8);
        run_result twin = cache_run_cpu(bf16_dir, KITE_WEIGHTS_FP8, "off");
        run_result stored = cache_run_cpu(fp8_dir, KITE_WEIGHTS_FP8, "off");
        CHECK_MSG(cache_runs_same(&twin, &stored), "the FP8 checkpoint's run differs from its twin's at --weights fp8");
    }
    cache_remove_tree(work);
    free(work);
}

static void test_list_and_clear(void) {
    char *cache = cache_temp_dir();
    if (!cache) return;
    cache_run_cpu(KITE_TEST_DATA_DIR "/tiny-vocab1k", KITE_WEIGHTS_BF16, cache);
    cache_run_cpu(KITE_TEST_DATA_DIR "/tiny-vocab1k", KITE_WEIGHTS_FP8, cache);
    char junk[1100];
    snprintf(junk, sizeof junk, "%s/notes.txt", cache);
    FILE *f = fopen(junk, "w");
    CHECK(f && fputs("not an entry", f) >= 0 && fclose(f) == 0);
    kite_weight_cache_entry *entries = NULL;
    size_t n = 0;
    CHECK(kite_weight_cache_list(cache, &entries, &n) == KITE_OK);
    CHECK(n == 2);
    int fp8 = 0, bf16 = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(entries[i].problem == NULL && strcmp(entries[i].backend, "cpu") == 0 && entries[i].bytes > 0 &&
              entries[i].created > 0 && strstr(entries[i].model, "tiny"));
        fp8 += strcmp(entries[i].weights, "fp8") == 0;
        bf16 += strcmp(entries[i].weights, "bf16") == 0;
    }
    CHECK(fp8 == 1 && bf16 == 1);
    /* A damaged entry is listed with its problem. */
    if (n > 0) CHECK(cache_flip_byte(entries[0].file, 40, false));
    kite_weight_cache_list_free(entries, n);
    CHECK(kite_weight_cache_list(cache, &entries, &n) == KITE_OK && n == 2 && entries[0].problem &&
          strstr(entries[0].problem, "damaged"));
    kite_weight_cache_list_free(entries, n);
    size_t removed = 0;
    CHECK(kite_weight_cache_clear(cache, &removed) == KITE_OK && removed == 2);
    CHECK(cache_count_files(cache, ".kwc", NULL, 0) == 0 && access(junk, F_OK) == 0);
    cache_remove_tree(cache);
    free(cache);
    /* A folder that does not exist has no entries. */
    CHECK(kite_weight_cache_list("/nonexistent/kite-cache", &entries, &n) == KITE_OK && n == 0);
}

int main(void) {
    TEST_RUN(test_hash64_is_xxh64);
    TEST_RUN(test_cached_equals_uncached);
    TEST_RUN(test_fp8_checkpoint);
    TEST_RUN(test_damage_truncated);
    TEST_RUN(test_damage_data_byte);
    TEST_RUN(test_damage_header_byte);
    TEST_RUN(test_damage_stale);
    TEST_RUN(test_damage_foreign);
    TEST_RUN(test_unusable_folder);
    TEST_RUN(test_two_processes_fill_one_entry);
    TEST_RUN(test_list_and_clear);
    return test_finish();
}

/* The weight cache (weights/weight_cache.h) on the CPU backend: a load from a cache entry runs to the very
 * tokens and log-probabilities of a load from the checkpoint (bf16 and fp8, tied and untied); every kind of
 * damage (truncated, a flipped data byte, a flipped header byte, a changed checkpoint = stale, another mode's
 * entry in the slot = foreign, a folder that cannot be written) is one notice and a rebuild, and the run still
 * gives the same tokens; two processes filling one entry at once both succeed and leave a valid entry; the
 * hash is XXH64. */
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

#include "kite.h"
#include "test_util.h"
#include "util/hash64.h"

#define N_TOKENS 12

typedef struct load_log {
    bool from_checkpoint, from_cache, filled;
    int notices;
    char notice[1024];
} load_log;

static void log_event(const kite_load_event *e, void *user_data) {
    load_log *log = user_data;
    if (e->kind == KITE_LOAD_EVENT_NOTICE) {
        log->notices++;
        snprintf(log->notice, sizeof log->notice, "%s", e->message);
    } else if (e->kind == KITE_LOAD_EVENT_DONE) {
        if (e->stage == KITE_LOAD_STAGE_CHECKPOINT) log->from_checkpoint = true;
        if (e->stage == KITE_LOAD_STAGE_CACHE_READ) log->from_cache = true;
        if (e->stage == KITE_LOAD_STAGE_CACHE_FILL) log->filled = true;
    }
}

typedef struct run_result {
    bool ok;
    int32_t tokens[N_TOKENS];
    float logprobs[N_TOKENS];
    int n;
    load_log log;
} run_result;

static void collect(const kite_token_event *event, void *user_data) {
    run_result *r = user_data;
    if (event->token >= 0 && r->n < N_TOKENS) {
        r->tokens[r->n] = event->token;
        r->logprobs[r->n] = event->logprob;
        r->n++;
    }
}

/* Greedy tokens of model dir loaded on the CPU in `weights` mode through weight cache `cache`. */
static run_result run_model(const char *dir, kite_weights weights, const char *cache) {
    run_result r = {0};
    kite_load_params p = kite_load_params_default();
    p.backend = KITE_BACKEND_CPU;
    p.n_threads = 2;
    p.weights = weights;
    p.weight_cache = cache;
    p.on_load_event = log_event;
    p.load_event_user_data = &r.log;
    kite_model *m = NULL;
    kite_engine *e = NULL;
    kite_status s = kite_model_load(dir, &p, &m);
    CHECK_MSG(s == KITE_OK, "load %s: %s", dir, kite_last_error());
    if (s != KITE_OK) return r;
    kite_engine_params ep = kite_engine_params_default();
    ep.kv_cache_bytes = (size_t)4 << 20;
    s = kite_engine_create(m, &ep, &e);
    CHECK_MSG(s == KITE_OK, "engine: %s", kite_last_error());
    const int32_t prompt[5] = {9707, 11, 1879, 0, 42};
    kite_request q = kite_request_default();
    q.prompt_ids = prompt;
    q.n_prompt_ids = 5;
    q.max_tokens = N_TOKENS;
    q.ignore_eos = true;
    q.on_token = collect;
    q.user_data = &r;
    kite_request_id id;
    if (s == KITE_OK) s = kite_engine_submit(e, &q, &id);
    if (s == KITE_OK) s = kite_engine_run(e);
    CHECK_MSG(s == KITE_OK, "generate: %s", kite_last_error());
    r.ok = s == KITE_OK && r.n == N_TOKENS;
    kite_engine_free(e);
    kite_model_free(m);
    return r;
}

static bool same_run(const run_result *a, const run_result *b) {
    return a->ok && b->ok && memcmp(a->tokens, b->tokens, sizeof a->tokens) == 0 &&
           memcmp(a->logprobs, b->logprobs, sizeof a->logprobs) == 0;
}

/* ---- temporary folders and files -------------------------------------------------------------------- */

static char *make_temp_dir(void) {
    const char *base = getenv("TMPDIR");
    char templ[512];
    snprintf(templ, sizeof templ, "%s/kite-weight-cache-XXXXXX", base && base[0] ? base : "/tmp");
    char *dir = mkdtemp(templ);
    CHECK_MSG(dir != NULL, "mkdtemp: %s", strerror(errno));
    return dir ? strdup(dir) : NULL;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(path);
        else if (unlink(path) != 0) fprintf(stderr, "  cannot remove %s: %s\n", path, strerror(errno));
    }
    closedir(d);
    if (rmdir(dir) != 0) fprintf(stderr, "  cannot remove %s: %s\n", dir, strerror(errno));
}

/* The entries (".kwc") and leftovers (".tmp.") of a cache folder; path of the last entry into `entry`. */
static int count_files(const char *dir, const char *needle, char *entry, size_t capacity) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *hit = strstr(e->d_name, needle);
        bool is_tmp = strstr(e->d_name, ".tmp.") != NULL;
        if (!hit || (strcmp(needle, ".kwc") == 0 && (is_tmp || hit[4] != '\0'))) continue;
        n++;
        if (entry) snprintf(entry, capacity, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    return n;
}

static bool copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    bool ok = in && out;
    char buffer[1 << 16];
    size_t n;
    while (ok && (n = fread(buffer, 1, sizeof buffer, in)) > 0) ok = fwrite(buffer, 1, n, out) == n;
    if (in && ferror(in)) ok = false;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = false;
    return ok;
}

static bool copy_checkpoint(const char *from, const char *to) {
    DIR *d = opendir(from);
    if (!d) return false;
    bool ok = true;
    struct dirent *e;
    while (ok && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        ok = copy_file(a, b);
    }
    closedir(d);
    return ok;
}

static bool flip_byte(const char *path, long offset_from_start, bool from_end) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return false;
    struct stat st;
    bool ok = fstat(fd, &st) == 0;
    off_t at = from_end ? st.st_size - 1 - offset_from_start : offset_from_start;
    unsigned char byte = 0;
    ok = ok && pread(fd, &byte, 1, at) == 1;
    byte ^= 0x10;
    ok = ok && pwrite(fd, &byte, 1, at) == 1;
    return close(fd) == 0 && ok;
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
    char *cache = make_temp_dir();
    if (!cache) return;
    run_result plain = run_model(model, weights, "off");
    run_result first = run_model(model, weights, cache);
    run_result second = run_model(model, weights, cache);
    CHECK_MSG(plain.log.from_checkpoint && !plain.log.filled, "%s: an uncached load", model);
    CHECK_MSG(first.log.from_checkpoint && first.log.filled && !first.log.from_cache, "%s: the first load fills",
              model);
    CHECK_MSG(second.log.from_cache && !second.log.from_checkpoint && !second.log.filled,
              "%s: the second load reads the entry", model);
    CHECK_MSG(first.log.notices == 0 && second.log.notices == 0, "%s: no notice expected: %s", model,
              second.log.notice);
    CHECK_MSG(same_run(&plain, &first) && same_run(&plain, &second), "%s (%s): cached and uncached tokens differ",
              model, weights == KITE_WEIGHTS_FP8 ? "fp8" : "bf16");
    CHECK(count_files(cache, ".kwc", NULL, 0) == 1 && count_files(cache, ".tmp.", NULL, 0) == 0);
    remove_tree(cache);
    free(cache);
}

static void test_cached_equals_uncached(void) {
    check_cached_matches(KITE_TEST_DATA_DIR "/tiny", KITE_WEIGHTS_BF16);
    check_cached_matches(KITE_TEST_DATA_DIR "/tiny", KITE_WEIGHTS_FP8);
    check_cached_matches(KITE_TEST_DATA_DIR "/tiny-untied", KITE_WEIGHTS_BF16);
    check_cached_matches(KITE_TEST_DATA_DIR "/tiny-untied", KITE_WEIGHTS_FP8);
}

typedef enum damage { DAMAGE_TRUNCATE, DAMAGE_DATA_BYTE, DAMAGE_HEADER_BYTE, DAMAGE_STALE, DAMAGE_FOREIGN } damage;

/* Fills an entry of a copy of tiny, damages it, and checks the next load says so in one notice, rebuilds, and
 * runs to the same tokens; the load after that reads the rebuilt entry. */
static void check_damage(damage kind, const char *word) {
    char *work = make_temp_dir();
    char *cache = make_temp_dir();
    if (!work || !cache) return;
    CHECK(copy_checkpoint(KITE_TEST_DATA_DIR "/tiny", work));
    run_result plain = run_model(work, KITE_WEIGHTS_BF16, "off");
    run_result filled = run_model(work, KITE_WEIGHTS_BF16, cache);
    CHECK(filled.log.filled);
    char entry[1024] = "";
    CHECK(count_files(cache, ".kwc", entry, sizeof entry) == 1);
    switch (kind) {
    case DAMAGE_TRUNCATE: CHECK(truncate(entry, 5000) == 0); break;
    case DAMAGE_DATA_BYTE: CHECK(flip_byte(entry, 7, true)); break;
    case DAMAGE_HEADER_BYTE: CHECK(flip_byte(entry, 100, false)); break;
    case DAMAGE_STALE: {
        char path[1024];
        snprintf(path, sizeof path, "%s/model.safetensors", work);
        struct timespec times[2] = {{.tv_sec = 1000000000, .tv_nsec = 0}, {.tv_sec = 1000000000, .tv_nsec = 0}};
        CHECK(utimensat(AT_FDCWD, path, times, 0) == 0);
        break;
    }
    case DAMAGE_FOREIGN: {
        /* An fp8 entry of the same checkpoint, renamed into the bf16 entry's place. */
        char *other = make_temp_dir();
        if (!other) break;
        run_result fp8 = run_model(work, KITE_WEIGHTS_FP8, other);
        CHECK(fp8.log.filled);
        char fp8_entry[1024] = "";
        CHECK(count_files(other, ".kwc", fp8_entry, sizeof fp8_entry) == 1);
        CHECK(rename(fp8_entry, entry) == 0);
        remove_tree(other);
        free(other);
        break;
    }
    }
    run_result rebuilt = run_model(work, KITE_WEIGHTS_BF16, cache);
    CHECK_MSG(rebuilt.log.notices == 1 && strstr(rebuilt.log.notice, word) && strstr(rebuilt.log.notice, "rebuild"),
              "expected one notice saying '%s', got %d: %s", word, rebuilt.log.notices, rebuilt.log.notice);
    CHECK(rebuilt.log.from_checkpoint && rebuilt.log.filled && !rebuilt.log.from_cache);
    CHECK_MSG(same_run(&plain, &rebuilt), "the rebuilt run's tokens differ (%s)", word);
    run_result again = run_model(work, KITE_WEIGHTS_BF16, cache);
    CHECK(again.log.from_cache && again.log.notices == 0 && same_run(&plain, &again));
    remove_tree(work);
    remove_tree(cache);
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
    char *work = make_temp_dir();
    if (!work) return;
    run_result plain = run_model(KITE_TEST_DATA_DIR "/tiny", KITE_WEIGHTS_BF16, "off");
    char file[1024], below[1100];
    snprintf(file, sizeof file, "%s/a-file", work);
    FILE *f = fopen(file, "w");
    CHECK(f && fclose(f) == 0);
    snprintf(below, sizeof below, "%s/cache", file);
    run_result r = run_model(KITE_TEST_DATA_DIR "/tiny", KITE_WEIGHTS_BF16, below);
    CHECK_MSG(r.log.notices == 1 && strstr(r.log.notice, "without the weight cache"), "%d: %s", r.log.notices,
              r.log.notice);
    CHECK(r.log.from_checkpoint && !r.log.filled && same_run(&plain, &r));
    char locked[1024];
    snprintf(locked, sizeof locked, "%s/read-only", work);
    CHECK(mkdir(locked, 0500) == 0);
    if (access(locked, W_OK) == 0) {
        printf("  (running as root: a 0500 folder is writable, so only the path through a file is checked)\n");
    } else {
        run_result ro = run_model(KITE_TEST_DATA_DIR "/tiny", KITE_WEIGHTS_BF16, locked);
        CHECK_MSG(ro.log.notices == 1 && strstr(ro.log.notice, "not filled"), "%d: %s", ro.log.notices, ro.log.notice);
        CHECK(ro.log.from_checkpoint && !ro.log.filled && same_run(&plain, &ro));
    }
    CHECK(chmod(locked, 0700) == 0);
    remove_tree(work);
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
    char *work = make_temp_dir();
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
        CHECK(count_files(cache, ".kwc", NULL, 0) == 1 && count_files(cache, ".tmp.", NULL, 0) == 0);
        if (round == 0) CHECK(kite_weight_cache_clear(cache, NULL) == KITE_OK);
    }
    /* What they left is a whole entry: the next load reads it without a notice. */
    run_result plain = run_model(KITE_TEST_DATA_DIR "/tiny-untied", KITE_WEIGHTS_BF16, "off");
    run_result cached = run_model(KITE_TEST_DATA_DIR "/tiny-untied", KITE_WEIGHTS_BF16, cache);
    CHECK(cached.log.from_cache && cached.log.notices == 0 && same_run(&plain, &cached));
    remove_tree(work);
    free(work);
}

static void test_list_and_clear(void) {
    char *cache = make_temp_dir();
    if (!cache) return;
    run_model(KITE_TEST_DATA_DIR "/tiny", KITE_WEIGHTS_BF16, cache);
    run_model(KITE_TEST_DATA_DIR "/tiny", KITE_WEIGHTS_FP8, cache);
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
    if (n > 0) CHECK(flip_byte(entries[0].file, 40, false));
    kite_weight_cache_list_free(entries, n);
    CHECK(kite_weight_cache_list(cache, &entries, &n) == KITE_OK && n == 2 && entries[0].problem &&
          strstr(entries[0].problem, "damaged"));
    kite_weight_cache_list_free(entries, n);
    size_t removed = 0;
    CHECK(kite_weight_cache_clear(cache, &removed) == KITE_OK && removed == 2);
    CHECK(count_files(cache, ".kwc", NULL, 0) == 0 && access(junk, F_OK) == 0);
    remove_tree(cache);
    free(cache);
    /* A folder that does not exist has no entries. */
    CHECK(kite_weight_cache_list("/nonexistent/kite-cache", &entries, &n) == KITE_OK && n == 0);
}

int main(void) {
    TEST_RUN(test_hash64_is_xxh64);
    TEST_RUN(test_cached_equals_uncached);
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

/* What the weight cache tests share: a greedy run of a checkpoint through a given cache folder on a given backend,
 * with what its load reported (kite_load_event: which stages ran, the notices), the checkpoints they write and the
 * files they damage. Header-only,
 * as test_util.h is, so that their CHECKs count in the test that includes them. */
#ifndef KITE_TESTS_WEIGHTS_CACHE_RUNS_H
#define KITE_TESTS_WEIGHTS_CACHE_RUNS_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_writer.h"
#include "kite.h"
#include "test_util.h"

#define CACHE_RUN_TOKENS 12

typedef struct load_log {
    bool from_checkpoint, from_cache, filled;
    uint64_t cache_read_done, cache_read_total; /* the CACHE_READ stage's count at its end */
    int notices;
    char notice[1024];
} load_log;

typedef struct run_result {
    bool ok;
    int32_t tokens[CACHE_RUN_TOKENS];
    float logprobs[CACHE_RUN_TOKENS];
    int n;
    load_log log;
} run_result;

static inline void cache_run_log_event(const kite_load_event *e, void *user_data) {
    load_log *log = user_data;
    if (e->kind == KITE_LOAD_EVENT_NOTICE) {
        log->notices++;
        snprintf(log->notice, sizeof log->notice, "%s", e->message);
    } else if (e->kind == KITE_LOAD_EVENT_DONE) {
        if (e->stage == KITE_LOAD_STAGE_CHECKPOINT) log->from_checkpoint = true;
        if (e->stage == KITE_LOAD_STAGE_CACHE_READ) {
            log->from_cache = true;
            log->cache_read_done = e->bytes_done;
            log->cache_read_total = e->bytes_total;
        }
        if (e->stage == KITE_LOAD_STAGE_CACHE_FILL) log->filled = true;
    }
}

static inline void cache_run_collect(const kite_token_event *event, void *user_data) {
    run_result *r = user_data;
    if (event->token >= 0 && r->n < CACHE_RUN_TOKENS) {
        r->tokens[r->n] = event->token;
        r->logprobs[r->n] = event->logprob;
        r->n++;
    }
}

/* Greedy tokens of model dir on backend `kind` in `weights` mode through weight cache `cache` ("off", or a folder). */
static inline run_result cache_run(const char *dir, kite_backend_kind kind, kite_weights weights,
                                   const char *cache) {
    run_result r = {0};
    kite_load_params p = kite_load_params_default();
    p.backend = kind;
    p.n_threads = 2;
    p.weights = weights;
    p.weight_cache = cache;
    p.on_load_event = cache_run_log_event;
    p.load_event_user_data = &r.log;
    kite_model *m = NULL;
    kite_engine *e = NULL;
    kite_status s = kite_model_load(dir, &p, &m);
    CHECK_MSG(s == KITE_OK, "load %s: %s", dir, kite_last_error());
    if (s != KITE_OK) return r;
    kite_engine_params ep = kite_engine_params_default();
    ep.kv_cache_bytes = kind == KITE_BACKEND_CUDA ? (size_t)64 << 20 : (size_t)4 << 20;
    s = kite_engine_create(m, &ep, &e);
    CHECK_MSG(s == KITE_OK, "engine: %s", kite_last_error());
    /* "Hello, world!K" in Qwen3's ids; the same ids modulo a smaller vocabulary (tiny-vocab1k's). */
    const int32_t vocab_size = kite_model_get_info(m).vocab_size;
    int32_t prompt[5] = {9707, 11, 1879, 0, 42};
    for (int i = 0; i < 5; i++)
        prompt[i] %= vocab_size;
    kite_request q = kite_request_default();
    q.prompt_ids = prompt;
    q.n_prompt_ids = 5;
    q.max_tokens = CACHE_RUN_TOKENS;
    q.ignore_eos = true;
    q.n_logprobs = 1; /* so that each token's log-probability is computed (greedy alone reads only the argmax) */
    q.on_token = cache_run_collect;
    q.user_data = &r;
    kite_request_id id;
    if (s == KITE_OK) s = kite_engine_submit(e, &q, &id);
    if (s == KITE_OK) s = kite_engine_run(e);
    CHECK_MSG(s == KITE_OK, "generate: %s", kite_last_error());
    r.ok = s == KITE_OK && r.n == CACHE_RUN_TOKENS;
    kite_engine_free(e);
    kite_model_free(m);
    return r;
}

/* Both runs succeeded with the same tokens and log-probabilities, bit for bit. */
static inline bool cache_runs_same(const run_result *a, const run_result *b) {
    for (int i = 0; i < CACHE_RUN_TOKENS; i++)
        if (a->logprobs[i] != a->logprobs[i]) return false; /* a NaN: nothing was compared */
    return a->ok && b->ok && memcmp(a->tokens, b->tokens, sizeof a->tokens) == 0 &&
           memcmp(a->logprobs, b->logprobs, sizeof a->logprobs) == 0;
}

/* A fresh folder under $TMPDIR (malloc'd), and its removal with everything in it. */
static inline char *cache_temp_dir(void) {
    const char *base = getenv("TMPDIR");
    char templ[512];
    snprintf(templ, sizeof templ, "%s/kite-weight-cache-XXXXXX", base && base[0] ? base : "/tmp");
    char *dir = mkdtemp(templ);
    CHECK_MSG(dir != NULL, "mkdtemp: %s", strerror(errno));
    return dir ? strdup(dir) : NULL;
}

static inline void cache_remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
        char path[1024];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, entry->d_name) >= sizeof path) {
            fprintf(stderr, "  cannot remove %s/%s: the path is too long\n", dir, entry->d_name);
            continue;
        }
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) cache_remove_tree(path);
        else if (unlink(path) != 0) fprintf(stderr, "  cannot remove %s: %s\n", path, strerror(errno));
    }
    closedir(d);
    if (rmdir(dir) != 0) fprintf(stderr, "  cannot remove %s: %s\n", dir, strerror(errno));
}

/* The entries (needle ".kwc") or leftovers (".tmp.") of a cache folder; the path of the last one into `entry`. */
static inline int cache_count_files(const char *dir, const char *needle, char *entry, size_t capacity) {
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

static inline bool cache_copy_file(const char *from, const char *to) {
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

/* The files of checkpoint folder `from` copied into `to` (links followed). */
static inline bool cache_copy_checkpoint(const char *from, const char *to) {
    DIR *d = opendir(from);
    if (!d) return false;
    bool ok = true;
    struct dirent *e;
    while (ok && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        ok = cache_copy_file(a, b);
    }
    closedir(d);
    return ok;
}

/* Flips a bit of the byte at `offset` from the start of the file, or from its last byte when from_end. */
static inline bool cache_flip_byte(const char *path, long offset, bool from_end) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return false;
    struct stat st;
    bool ok = fstat(fd, &st) == 0;
    off_t at = from_end ? st.st_size - 1 - offset : offset;
    unsigned char byte = 0;
    ok = ok && pread(fd, &byte, 1, at) == 1;
    byte ^= 0x10;
    ok = ok && pwrite(fd, &byte, 1, at) == 1;
    return close(fd) == 0 && ok;
}

/* Writes checkpoint folder dir (made here) of `shape` with a tokenizer of tests/data: Qwen3's when the shape's
 * vocabulary holds its 151,669 ids, else tiny-vocab1k's 1,024 (the vocabulary must hold those). */
static inline bool cache_write_checkpoint(const char *dir, const checkpoint_writer_shape *shape) {
    bool ok = mkdir(dir, 0700) == 0 && checkpoint_writer_write(dir, shape);
    const char *tokenizer_dir = shape->vocab_size >= 151669 ? "tokenizer" : "tiny-vocab1k";
    static const char *const tokenizer_files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2 && ok; i++) {
        char from[1024], to[1100], resolved[PATH_MAX];
        snprintf(from, sizeof from, "%s/%s/%s", KITE_TEST_DATA_DIR, tokenizer_dir, tokenizer_files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, tokenizer_files[i]);
        ok = realpath(from, resolved) != NULL && symlink(resolved, to) == 0;
    }
    CHECK_MSG(ok, "cannot write checkpoint %s: %s", dir, strerror(errno));
    return ok;
}

#endif

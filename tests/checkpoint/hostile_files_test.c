/* Files in a model directory that are not what they claim: every file kite opens (config.json, the
 * safetensors shards and their index, tokenizer.json, tokenizer_config.json, chat_template.jinja,
 * generation_config.json) replaced by a FIFO, a directory or a character device is refused quickly with
 * its path named, and files far over their size limit (or holding too many values) are refused before they
 * are read (or parsed). Each load runs under alarm(), so an open() that blocks (a FIFO without a writer)
 * fails the test instead of hanging it. */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint_writer.h"
#include "kite.h"
#include "test_util.h"

enum { ALARM_SECONDS = 30 };

typedef enum replacement { REPLACE_FIFO, REPLACE_DIRECTORY, REPLACE_CHAR_DEVICE } replacement;

static const char *const replacement_names[] = {"a FIFO", "a directory", "a character device"};

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Removes whatever is at path: a file, link, FIFO or empty directory. */
static void remove_entry(const char *path) {
    if (unlink(path) != 0) (void)rmdir(path);
}

static bool put_replacement(const char *path, replacement kind) {
    remove_entry(path);
    switch (kind) {
    case REPLACE_FIFO: return mkfifo(path, 0600) == 0;
    case REPLACE_DIRECTORY: return mkdir(path, 0700) == 0;
    case REPLACE_CHAR_DEVICE: return symlink("/dev/null", path) == 0;
    }
    return false;
}

/* Links dir/name to the test data file data_name (an absolute path, so the link works from anywhere). */
static bool link_data(const char *dir, const char *name, const char *data_name) {
    char target[PATH_MAX];
    if (!realpath(data_name, target)) return false;
    char *path = checkpoint_writer_path(dir, name);
    if (!path) return false;
    remove_entry(path);
    bool ok = symlink(target, path) == 0;
    free(path);
    return ok;
}

static kite_status load_model(const char *dir) {
    kite_load_params params = kite_load_params_default();
    params.backend = KITE_BACKEND_CPU;
    params.n_threads = 1;
    kite_model *model = NULL;
    alarm(ALARM_SECONDS);
    kite_status status = kite_model_load(dir, &params, &model);
    alarm(0);
    kite_model_free(model);
    return status;
}

static kite_status open_checkpoint(const char *dir) {
    checkpoint *c = NULL;
    alarm(ALARM_SECONDS);
    kite_status status = checkpoint_open(dir, &c);
    alarm(0);
    checkpoint_close(c);
    return status;
}

/* The load fails with KITE_ERROR_IO and a message "DIR/NAME: is not a regular file (KIND)". */
static void expect_refused(kite_status status, const char *dir, const char *name, replacement kind) {
    char wanted[PATH_MAX + 64];
    snprintf(wanted, sizeof wanted, "%s/%s: is not a regular file (%s)", dir, name, replacement_names[kind]);
    CHECK_MSG(status == KITE_ERROR_IO && strstr(kite_last_error(), wanted) != NULL,
              "%s as %s: status %d, message \"%s\", wanted \"%s\"", name, replacement_names[kind], status,
              kite_last_error(), wanted);
}

/* The tiny model's files linked into a fresh directory; every replacement of one of them is refused. */
static void test_model_directory(void) {
    char *dir = checkpoint_writer_make_temp_dir();
    CHECK(dir != NULL);
    if (!dir) return;
    static const char *const files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"};
    const size_t n_files = sizeof files / sizeof files[0];
    char data_name[PATH_MAX];
    bool linked = true;
    for (size_t i = 0; i < n_files; i++) {
        snprintf(data_name, sizeof data_name, "%s/tiny/%s", KITE_TEST_DATA_DIR, files[i]);
        linked = linked && link_data(dir, files[i], data_name);
    }
    CHECK(linked);
    CHECK_MSG(load_model(dir) == KITE_OK, "the untouched copy loads: %s", kite_last_error());

    /* chat_template.jinja is optional: present (as anything), it is read instead of tokenizer_config's. */
    static const char *const targets[] = {"config.json", "generation_config.json", "model.safetensors",
                                          "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"};
    for (size_t i = 0; linked && i < sizeof targets / sizeof targets[0]; i++) {
        char *path = checkpoint_writer_path(dir, targets[i]);
        for (int kind = REPLACE_FIFO; path && kind <= REPLACE_CHAR_DEVICE; kind++) {
            CHECK(put_replacement(path, (replacement)kind));
            double start = seconds_now();
            expect_refused(load_model(dir), dir, targets[i], (replacement)kind);
            CHECK_MSG(seconds_now() - start < 10.0, "%s as %s took %.1f s", targets[i], replacement_names[kind],
                      seconds_now() - start);
        }
        if (path) remove_entry(path);
        free(path);
        if (i < n_files) {
            snprintf(data_name, sizeof data_name, "%s/tiny/%s", KITE_TEST_DATA_DIR, targets[i]);
            CHECK(link_data(dir, targets[i], data_name));
        }
    }
    CHECK(checkpoint_writer_remove_dir(dir));
    free(dir);
}

/* A sharded checkpoint: the index and a shard replaced. */
static void test_sharded_checkpoint(void) {
    char *dir = checkpoint_writer_make_temp_dir();
    CHECK(dir != NULL);
    if (!dir) return;
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    shape.n_shards = 2;
    CHECK(checkpoint_writer_write(dir, &shape));
    CHECK_MSG(open_checkpoint(dir) == KITE_OK, "the sharded checkpoint opens: %s", kite_last_error());
    char shard[64];
    checkpoint_writer_shard_name(1, 2, shard, sizeof shard);
    const char *const targets[] = {"model.safetensors.index.json", shard};
    for (size_t i = 0; i < 2; i++) {
        char *path = checkpoint_writer_path(dir, targets[i]);
        for (int kind = REPLACE_FIFO; path && kind <= REPLACE_CHAR_DEVICE; kind++) {
            CHECK(put_replacement(path, (replacement)kind));
            expect_refused(open_checkpoint(dir), dir, targets[i], (replacement)kind);
        }
        if (path) remove_entry(path);
        free(path);
        CHECK(checkpoint_writer_write(dir, &shape)); /* puts back what was replaced */
    }
    CHECK(checkpoint_writer_remove_dir(dir));
    free(dir);
}

/* A sparse file of `size` bytes: costs no disk, and reading it would cost `size` of memory and time. */
static bool write_sparse(const char *path, off_t size) {
    remove_entry(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    bool ok = ftruncate(fd, size) == 0;
    return close(fd) == 0 && ok;
}

/* Files over their limits are refused by their size alone, before a byte is read or mapped: a 4 GiB sparse
 * tokenizer.json takes no time, where reading it through took gigabytes and seconds. */
static void test_oversized_files(void) {
    char *dir = checkpoint_writer_make_temp_dir();
    CHECK(dir != NULL);
    if (!dir) return;
    static const char *const files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"};
    char data_name[PATH_MAX];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(data_name, sizeof data_name, "%s/tiny/%s", KITE_TEST_DATA_DIR, files[i]);
        CHECK(link_data(dir, files[i], data_name));
    }
    static const struct {
        const char *name;
        off_t size;
        kite_status status;
    } cases[] = {
        {"tokenizer.json", (off_t)4 << 30, KITE_ERROR_INVALID_TOKENIZER},
        {"tokenizer_config.json", (off_t)1 << 30, KITE_ERROR_INVALID_TOKENIZER},
        {"config.json", (off_t)1 << 30, KITE_ERROR_INVALID_CHECKPOINT},
        {"generation_config.json", (off_t)1 << 30, KITE_ERROR_INVALID_CHECKPOINT},
        {"chat_template.jinja", (off_t)1 << 30, KITE_ERROR_INVALID_TEMPLATE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *path = checkpoint_writer_path(dir, cases[i].name);
        CHECK(path && write_sparse(path, cases[i].size));
        double start = seconds_now();
        kite_status status = load_model(dir);
        double seconds = seconds_now() - start;
        CHECK_MSG(status == cases[i].status && strstr(kite_last_error(), cases[i].name) &&
                      strstr(kite_last_error(), "allowed"),
                  "%s of %lld bytes: status %d: %s", cases[i].name, (long long)cases[i].size, status,
                  kite_last_error());
        CHECK_MSG(seconds < 5.0, "%s of %lld bytes took %.1f s to refuse", cases[i].name, (long long)cases[i].size,
                  seconds);
        if (path) remove_entry(path);
        free(path);
        for (size_t j = 0; j < sizeof files / sizeof files[0]; j++) {
            if (strcmp(files[j], cases[i].name) != 0) continue;
            snprintf(data_name, sizeof data_name, "%s/tiny/%s", KITE_TEST_DATA_DIR, files[j]);
            CHECK(link_data(dir, files[j], data_name));
        }
    }
    CHECK(checkpoint_writer_remove_dir(dir));
    free(dir);

    /* The index, in a sharded checkpoint. */
    dir = checkpoint_writer_make_temp_dir();
    CHECK(dir != NULL);
    if (!dir) return;
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    shape.n_shards = 2;
    CHECK(checkpoint_writer_write(dir, &shape));
    char *index = checkpoint_writer_path(dir, "model.safetensors.index.json");
    CHECK(index && write_sparse(index, (off_t)1 << 30));
    kite_status status = open_checkpoint(dir);
    CHECK_MSG(status == KITE_ERROR_INVALID_CHECKPOINT && strstr(kite_last_error(), "model.safetensors.index.json") &&
                  strstr(kite_last_error(), "allowed"),
              "index of 1 GiB: status %d: %s", status, kite_last_error());
    /* Small enough, but a million values: refused by a count before it is parsed (~32 bytes a value). */
    size_t n_values = 1000 * 1000 + 1;
    char *values = malloc(2 * n_values + 1);
    CHECK(values != NULL);
    if (index && values) {
        values[0] = '[';
        for (size_t i = 0; i < n_values; i++) {
            values[1 + 2 * i] = '0';
            values[2 + 2 * i] = i + 1 < n_values ? ',' : ']';
        }
        CHECK(checkpoint_writer_write_file(index, values, 2 * n_values + 1));
        status = open_checkpoint(dir);
        CHECK_MSG(status == KITE_ERROR_INVALID_CHECKPOINT && strstr(kite_last_error(), "model.safetensors.index.json") &&
                      strstr(kite_last_error(), "more than 1000000 commas and brackets"),
                  "index of a million values: status %d: %s", status, kite_last_error());
    }
    free(values);
    free(index);
    CHECK(checkpoint_writer_remove_dir(dir));
    free(dir);
}

int main(void) {
    TEST_RUN(test_model_directory);
    TEST_RUN(test_sharded_checkpoint);
    TEST_RUN(test_oversized_files);
    return test_finish();
}

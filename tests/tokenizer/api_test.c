/* The tokenizer through kite.h alone: kite_tokenizer_load without weights, a model's borrowed tokenizer,
 * per-token bytes, threads sharing a handle, and a missing or damaged tokenizer.json refused with a message
 * naming the file. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kite.h"
#include "test_util.h"

#define DATA_DIR KITE_TEST_DATA_DIR "/tokenizer" /* tokenizer files only: no config.json, no weights */

static const int32_t hello_ids[] = {9707, 11, 847, 5562, 374, 18838};
static const char hello[] = "Hello, my dog is cute";

static void test_encode_decode(void) {
    kite_tokenizer *t = NULL;
    CHECK_MSG(kite_tokenizer_load(DATA_DIR, &t) == KITE_OK, "%s", kite_last_error());
    if (!t) return;
    CHECK(kite_tokenizer_vocab_size(t) == 151669);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(kite_tokenizer_encode(t, hello, strlen(hello), &ids, &n) == KITE_OK);
    CHECK(n == 6 && ids && memcmp(ids, hello_ids, sizeof hello_ids) == 0);
    char *text = NULL;
    size_t length = 0;
    CHECK(kite_tokenizer_decode(t, ids, n, &text, &length) == KITE_OK);
    CHECK(text && length == strlen(hello) && strcmp(text, hello) == 0);
    kite_free(text);
    kite_free(ids);

    /* Special tokens written in the text are recognised; no special token is added. */
    CHECK(kite_tokenizer_encode(t, "<|im_start|>user", 16, &ids, &n) == KITE_OK);
    CHECK(n == 2 && ids[0] == 151644 && ids[1] == 872);
    kite_free(ids);
    CHECK(kite_tokenizer_encode(t, "", 0, &ids, &n) == KITE_OK && n == 0 && ids == NULL);

    const char *bytes = NULL;
    CHECK(kite_tokenizer_token_bytes(t, 279, &bytes, &length) == KITE_OK);
    CHECK(bytes && length == 4 && memcmp(bytes, " the", 4) == 0);
    CHECK(kite_tokenizer_token_bytes(t, 151644, &bytes, &length) == KITE_OK);
    CHECK(length == 12 && memcmp(bytes, "<|im_start|>", 12) == 0);
    CHECK(kite_tokenizer_token_bytes(t, 151669, &bytes, &length) == KITE_ERROR_INVALID_INPUT);
    CHECK(bytes == NULL && length == 0 && strstr(kite_last_error(), "151669"));
    CHECK(kite_tokenizer_token_bytes(t, -1, &bytes, &length) == KITE_ERROR_INVALID_INPUT);

    int32_t bad[] = {9707, 151669};
    CHECK(kite_tokenizer_decode(t, bad, 2, &text, &length) == KITE_ERROR_INVALID_INPUT);
    CHECK_MSG(strstr(kite_last_error(), "151669") != NULL, "%s", kite_last_error());
    CHECK(kite_tokenizer_decode(t, NULL, 3, &text, &length) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(kite_tokenizer_encode(t, NULL, 3, &ids, &n) == KITE_ERROR_INVALID_ARGUMENT);
    kite_tokenizer_free(t);
}

static void test_bad_arguments(void) {
    kite_tokenizer *t = (kite_tokenizer *)&t; /* overwritten with NULL on failure */
    CHECK(kite_tokenizer_load(NULL, &t) == KITE_ERROR_INVALID_ARGUMENT && t == NULL);
    CHECK(kite_tokenizer_load(DATA_DIR, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(kite_tokenizer_encode(NULL, "x", 1, &ids, &n) == KITE_ERROR_INVALID_ARGUMENT);
    char *text = NULL;
    size_t length = 0;
    CHECK(kite_tokenizer_decode(NULL, hello_ids, 1, &text, &length) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(kite_tokenizer_vocab_size(NULL) == 0);
    CHECK(kite_model_tokenizer(NULL) == NULL);
    kite_tokenizer_free(NULL);
}

static char temp_dir[64];

static void write_file(const char *name, const char *data, size_t length) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", temp_dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, length, f) == length);
    fclose(f);
}

static void test_missing_and_damaged(void) {
    kite_tokenizer *t = NULL;
    CHECK(kite_tokenizer_load("/nonexistent", &t) == KITE_ERROR_IO && t == NULL);
    CHECK_MSG(strstr(kite_last_error(), "/nonexistent/tokenizer.json") != NULL, "%s", kite_last_error());

    snprintf(temp_dir, sizeof temp_dir, "/tmp/kite-tokenizer-api-%d", (int)getpid());
    CHECK(mkdir(temp_dir, 0700) == 0);
    CHECK(kite_tokenizer_load(temp_dir, &t) == KITE_ERROR_IO); /* a directory without tokenizer.json */
    CHECK(strstr(kite_last_error(), "tokenizer.json") != NULL);

    write_file("tokenizer.json", "{not json", 9);
    CHECK(kite_tokenizer_load(temp_dir, &t) == KITE_ERROR_INVALID_TOKENIZER && t == NULL);
    CHECK_MSG(strstr(kite_last_error(), temp_dir) && strstr(kite_last_error(), "tokenizer.json"), "%s",
              kite_last_error());

    /* The real file cut in half. */
    size_t length = 0;
    char *whole = test_read_file(DATA_DIR "/tokenizer.json", &length);
    CHECK(whole != NULL && length > 1000);
    if (whole) write_file("tokenizer.json", whole, length / 2);
    CHECK(kite_tokenizer_load(temp_dir, &t) == KITE_ERROR_INVALID_TOKENIZER && t == NULL);
    CHECK_MSG(strstr(kite_last_error(), "tokenizer.json") != NULL, "%s", kite_last_error());

    /* Whole again, with a damaged tokenizer_config.json beside it. */
    if (whole) write_file("tokenizer.json", whole, length);
    free(whole);
    write_file("tokenizer_config.json", "[1, 2", 5);
    CHECK(kite_tokenizer_load(temp_dir, &t) != KITE_OK && t == NULL);
    CHECK_MSG(strstr(kite_last_error(), "tokenizer_config.json") != NULL, "%s", kite_last_error());
    /* A key twice: Python (transformers) would read the second eos_token; kite refuses, naming file and key. */
    const char *doubled = "{\"eos_token\": \"<|im_end|>\",\n \"eos_token\": \"<|endoftext|>\"}";
    write_file("tokenizer_config.json", doubled, strlen(doubled));
    CHECK(kite_tokenizer_load(temp_dir, &t) == KITE_ERROR_INVALID_TOKENIZER && t == NULL);
    CHECK_MSG(strstr(kite_last_error(), "tokenizer_config.json:2:2: duplicate key \"eos_token\"") != NULL, "%s",
              kite_last_error());
    write_file("tokenizer_config.json", "{}", 2);
    CHECK_MSG(kite_tokenizer_load(temp_dir, &t) == KITE_OK && t, "%s", kite_last_error());
    kite_tokenizer_free(t);

    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", temp_dir);
    remove(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", temp_dir);
    remove(path);
    rmdir(temp_dir);
}

static void test_model_tokenizer(void) {
    kite_load_params params = kite_load_params_default();
    params.backend = KITE_BACKEND_CPU;
    params.n_threads = 1;
    kite_model *model = NULL;
    CHECK_MSG(kite_model_load(KITE_TEST_DATA_DIR "/tiny", &params, &model) == KITE_OK, "%s", kite_last_error());
    if (!model) return;
    const kite_tokenizer *t = kite_model_tokenizer(model);
    CHECK(t != NULL);
    int32_t *a = NULL, *b = NULL;
    size_t n_a = 0, n_b = 0;
    CHECK(kite_tokenizer_encode(t, hello, strlen(hello), &a, &n_a) == KITE_OK);
    CHECK(kite_tokenize(model, hello, strlen(hello), &b, &n_b) == KITE_OK);
    CHECK(n_a == n_b && n_a == 6 && memcmp(a, b, n_a * sizeof *a) == 0);
    kite_free(a);
    kite_free(b);
    CHECK(kite_tokenizer_vocab_size(t) <= kite_model_get_info(model).vocab_size);
    kite_model_free(model);

    CHECK(kite_model_load_dummy("tiny", 1, &params, &model) == KITE_OK);
    CHECK(model && kite_model_tokenizer(model) == NULL);
    kite_model_free(model);
}

/* Threads share one handle: each encodes and decodes on its own and gets the same ids. */
static void *encode_many(void *argument) {
    const kite_tokenizer *t = argument;
    for (int i = 0; i < 200; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (kite_tokenizer_encode(t, hello, strlen(hello), &ids, &n) != KITE_OK || n != 6 ||
            memcmp(ids, hello_ids, sizeof hello_ids) != 0) {
            kite_free(ids);
            return (void *)1;
        }
        kite_free(ids);
    }
    return NULL;
}

static void test_threads_share_a_handle(void) {
    kite_tokenizer *t = NULL;
    CHECK(kite_tokenizer_load(DATA_DIR, &t) == KITE_OK);
    if (!t) return;
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&threads[i], NULL, encode_many, t) == 0);
    for (int i = 0; i < 4; i++) {
        void *result = (void *)1;
        CHECK(pthread_join(threads[i], &result) == 0 && result == NULL);
    }
    kite_tokenizer_free(t);
}

int main(void) {
    TEST_RUN(test_encode_decode);
    TEST_RUN(test_bad_arguments);
    TEST_RUN(test_missing_and_damaged);
    TEST_RUN(test_model_tokenizer);
    TEST_RUN(test_threads_share_a_handle);
    return test_finish();
}

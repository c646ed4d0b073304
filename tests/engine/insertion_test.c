/* A request's insertion (kite_request.insert_after / insert_ids) on the CPU backend with tiny-vocab1k: after
 * its trigger the request produces exactly the tokens of a plain request whose prompt already holds the trigger
 * and the inserted ids, whether the insertion is read in one step or in chunks, shared through the prefix cache,
 * or recomputed after a preemption, greedy or sampled; the inserted ids come in the trigger's event (ids and text),
 * max_tokens counts sampled tokens only, a stop string in the inserted text ends the request, and nothing is
 * inserted when the request ends at or before its trigger. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "kite.h"
#include "test_util.h"

#define MAX_TOKENS 96
#define MAX_TEXT 4096

typedef struct record {
    int32_t tokens[MAX_TOKENS]; /* sampled tokens */
    int32_t n;
    int32_t trigger_index;      /* index in tokens of the event that brought the insertion, -1 when none did */
    int32_t inserted[KITE_MAX_INSERT_IDS];
    int32_t n_inserted;
    int insertion_events;       /* events with n_inserted > 0 (one at most is right) */
    int insertion_logprobs;     /* of those, events whose logprob is not the trigger's own (none is right) */
    char text[MAX_TEXT];
    size_t text_length;
    kite_finish_reason finish;
    int finals;
} record;

static void collect(const kite_token_event *event, void *user_data) {
    record *r = user_data;
    if (event->n_inserted > 0) {
        r->insertion_events++;
        r->trigger_index = r->n;
        r->n_inserted = event->n_inserted;
        memcpy(r->inserted, event->inserted_ids, (size_t)event->n_inserted * sizeof(int32_t));
    }
    if (event->token >= 0 && r->n < MAX_TOKENS) r->tokens[r->n++] = event->token;
    if (r->text_length + event->text_length < MAX_TEXT) {
        memcpy(r->text + r->text_length, event->text, event->text_length);
        r->text_length += event->text_length;
    }
    if (event->finish != KITE_FINISH_NONE) {
        r->finish = event->finish;
        r->finals++;
    }
}

static kite_model *load_model(void) {
    kite_load_params p = kite_load_params_default();
    p.backend = KITE_BACKEND_CPU;
    p.n_threads = 2;
    kite_model *m = NULL;
    kite_status s = kite_model_load(KITE_TEST_DATA_DIR "/tiny-vocab1k", &p, &m);
    CHECK_MSG(s == KITE_OK, "load: %s", kite_last_error());
    return m;
}

/* tiny-vocab1k's ids (tests/data/tools/make_small_vocab.py): "Hello, world! The quick brown fox jumps over the lazy
 * dog." and "\n\n<tool_call>\n{"name": "", whose first id is "\n\n" and second <tool_call> (1012). */
static const int32_t base_prompt[] = {39, 301, 385, 11,  289, 269, 507, 0,   576, 922, 865, 293, 651, 77,  282,
                                      78, 87,  502, 372, 79,  82,  916, 279, 326, 64,  89,  88,  294, 538, 13};
#define N_BASE ((int32_t)(sizeof base_prompt / sizeof base_prompt[0]))
static const int32_t insertion[] = {271, 1012, 198, 90, 1, 606, 788, 330};
#define N_INSERTION ((int32_t)(sizeof insertion / sizeof insertion[0]))

static kite_request plain_request(const int32_t *prompt, int32_t n_prompt, int32_t max_tokens, record *out) {
    memset(out, 0, sizeof *out);
    out->trigger_index = -1;
    kite_request r = kite_request_default();
    r.prompt_ids = prompt;
    r.n_prompt_ids = (size_t)n_prompt;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.on_token = collect;
    r.user_data = out;
    return r;
}

static kite_request inserting_request(int32_t trigger, int32_t max_tokens, record *out) {
    kite_request r = plain_request(base_prompt, N_BASE, max_tokens, out);
    r.insert_after = trigger;
    r.insert_ids = insertion;
    r.n_insert_ids = N_INSERTION;
    return r;
}

static kite_status run_one(kite_engine *e, const kite_request *r) {
    kite_status s = kite_engine_submit(e, r, NULL);
    if (s == KITE_OK) s = kite_engine_run(e);
    CHECK_MSG(s == KITE_OK, "run: %s", kite_last_error());
    return s;
}

/* The greedy answer to base_prompt without an insertion, the trigger (its token at index 3) and that token's
 * first index in it. */
static int32_t plain_answer(kite_model *m, int32_t max_tokens, record *plain, int32_t *first) {
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    kite_request r = plain_request(base_prompt, N_BASE, max_tokens, plain);
    run_one(e, &r);
    kite_engine_free(e);
    CHECK(plain->n == max_tokens);
    const int32_t trigger = plain->tokens[3];
    *first = 0;
    while (plain->tokens[*first] != trigger) (*first)++;
    return trigger;
}

/* What a request with the insertion must produce after it: a plain request from base_prompt, the plain answer up
 * to its trigger, and the insertion. */
static void expected_after(kite_model *m, const record *plain, int32_t first, int32_t max_tokens, record *out) {
    int32_t prompt[N_BASE + MAX_TOKENS + N_INSERTION];
    int32_t n = 0;
    for (int32_t i = 0; i < N_BASE; i++) prompt[n++] = base_prompt[i];
    for (int32_t i = 0; i <= first; i++) prompt[n++] = plain->tokens[i];
    for (int32_t i = 0; i < N_INSERTION; i++) prompt[n++] = insertion[i];
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    kite_request r = plain_request(prompt, n, max_tokens - (first + 1), out);
    run_one(e, &r);
    kite_engine_free(e);
}

/* got: a request with the insertion; the plain answer up to the trigger, the insertion in the trigger's event,
 * then exactly `after`'s tokens; its text the detokenized sampled and inserted ids in order. */
static void check_inserted(kite_model *m, const record *got, const record *plain, int32_t first, const record *after,
                           int32_t max_tokens, const char *what) {
    CHECK_MSG(got->finals == 1 && got->finish == KITE_FINISH_LENGTH, "%s: finish %d, %d finals", what, got->finish,
              got->finals);
    CHECK_MSG(got->n == max_tokens, "%s: %d sampled tokens, max_tokens %d", what, got->n, max_tokens);
    CHECK_MSG(got->insertion_events == 1 && got->trigger_index == first, "%s: %d insertion events, at %d (trigger %d)",
              what, got->insertion_events, got->trigger_index, first);
    CHECK(got->n_inserted == N_INSERTION && memcmp(got->inserted, insertion, sizeof insertion) == 0);
    for (int32_t i = 0; i <= first && i < got->n; i++)
        CHECK_MSG(got->tokens[i] == plain->tokens[i], "%s: token %d is %d, the plain answer's %d", what, i,
                  got->tokens[i], plain->tokens[i]);
    CHECK_MSG(after->n == max_tokens - (first + 1), "%s: the plain continuation has %d tokens", what, after->n);
    for (int32_t i = 0; i < after->n && first + 1 + i < got->n; i++)
        CHECK_MSG(got->tokens[first + 1 + i] == after->tokens[i],
                  "%s: token %d after the insertion is %d, the plain request's %d", what, i, got->tokens[first + 1 + i],
                  after->tokens[i]);
    int32_t ids[MAX_TOKENS + N_INSERTION];
    int32_t n = 0;
    for (int32_t i = 0; i < got->n; i++) {
        ids[n++] = got->tokens[i];
        if (i == got->trigger_index)
            for (int32_t k = 0; k < N_INSERTION; k++) ids[n++] = insertion[k];
    }
    char *text = NULL;
    size_t length = 0;
    CHECK(kite_detokenize(m, ids, (size_t)n, &text, &length) == KITE_OK);
    CHECK_MSG(length == got->text_length && memcmp(text, got->text, length) == 0,
              "%s: the events' text (%zu bytes) is not the decoded sampled and inserted ids (%zu bytes)", what,
              got->text_length, length);
    kite_free(text);
}

static void test_insertion_equals_a_longer_prompt(void) {
    kite_model *m = load_model();
    if (!m) return;
    const int32_t max_tokens = 24;
    record plain, after, got;
    int32_t first = 0;
    const int32_t trigger = plain_answer(m, max_tokens, &plain, &first);
    expected_after(m, &plain, first, max_tokens, &after);

    /* Read in one step, prefix cache on (the default). */
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    kite_request r = inserting_request(trigger, max_tokens, &got);
    run_one(e, &r);
    check_inserted(m, &got, &plain, first, &after, max_tokens, "one step");
    CHECK(kite_engine_get_stats(e).kv_blocks_free == kite_engine_get_stats(e).kv_blocks_total);
    kite_engine_free(e);

    /* Read in chunks of 2 tokens, blocks of 4 positions registered in the prefix cache as they fill: a second
     * run of the same request then takes the blocks that hold the insertion from the cache. */
    kite_engine_params params = kite_engine_params_default();
    params.max_sequences = 2;
    params.max_step_tokens = 64;
    params.kv_block_size = 4;
    CHECK(kite_engine_create(m, &params, &e) == KITE_OK);
    CHECK(engine_set_step_token_budget(e, 2) == KITE_OK);
    r = inserting_request(trigger, max_tokens, &got);
    run_one(e, &r);
    check_inserted(m, &got, &plain, first, &after, max_tokens, "chunks of 2");
    CHECK(engine_set_step_token_budget(e, 64) == KITE_OK);
    int32_t prompt[N_BASE + MAX_TOKENS + N_INSERTION];
    int32_t n = 0;
    for (int32_t i = 0; i < N_BASE; i++) prompt[n++] = base_prompt[i];
    for (int32_t i = 0; i <= first; i++) prompt[n++] = plain.tokens[i];
    for (int32_t i = 0; i < N_INSERTION; i++) prompt[n++] = insertion[i];
    record cached;
    const int64_t hits_before = kite_engine_get_stats(e).prefix_cache_hit_tokens;
    r = plain_request(prompt, n, max_tokens - (first + 1), &cached);
    run_one(e, &r);
    const int64_t hits = kite_engine_get_stats(e).prefix_cache_hit_tokens - hits_before;
    CHECK_MSG(hits == (int64_t)((n - 1) / 4) * 4, "the longer prompt hit %lld of its %d tokens in the cache",
              (long long)hits, n);
    CHECK(cached.n == after.n && memcmp(cached.tokens, after.tokens, (size_t)after.n * sizeof(int32_t)) == 0);
    CHECK(kite_engine_get_stats(e).kv_blocks_free == kite_engine_get_stats(e).kv_blocks_total);
    kite_engine_free(e);
    kite_model_free(m);
}

/* Sampled rows take the same route: top_k 1 samples the greedy tokens through the sampler, not the argmax. */
static void test_insertion_in_a_sampled_request(void) {
    kite_model *m = load_model();
    if (!m) return;
    const int32_t max_tokens = 20;
    record plain, after, got;
    int32_t first = 0;
    const int32_t trigger = plain_answer(m, max_tokens, &plain, &first);
    expected_after(m, &plain, first, max_tokens, &after);
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    kite_request r = inserting_request(trigger, max_tokens, &got);
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 1;
    r.sampling.seed = 3;
    run_one(e, &r);
    check_inserted(m, &got, &plain, first, &after, max_tokens, "sampled");
    kite_engine_free(e);
    kite_model_free(m);
}

/* A stop string inside the inserted text ends the request there, as one in sampled text does: the text stops
 * before it, the ids up to it were inserted, and nothing is sampled after them. */
static void test_a_stop_string_in_the_insertion(void) {
    kite_model *m = load_model();
    if (!m) return;
    const int32_t max_tokens = 16;
    record plain, got;
    int32_t first = 0;
    const int32_t trigger = plain_answer(m, max_tokens, &plain, &first);
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);
    kite_request r = inserting_request(trigger, max_tokens, &got);
    const char *stop = "<tool_call>";
    r.stop_strings = &stop;
    r.n_stop_strings = 1;
    run_one(e, &r);
    CHECK_MSG(got.finish == KITE_FINISH_STOP && got.finals == 1 && got.n == first + 1, "finish %d, %d tokens",
              got.finish, got.n);
    CHECK_MSG(got.insertion_events == 1 && got.n_inserted == 2, "%d insertion events of %d ids", got.insertion_events,
              got.n_inserted); /* "\n\n" and <tool_call> */
    char *text = NULL;
    size_t length = 0;
    int32_t ids[MAX_TOKENS + 1];
    memcpy(ids, plain.tokens, (size_t)(first + 1) * sizeof(int32_t));
    ids[first + 1] = insertion[0];
    CHECK(kite_detokenize(m, ids, (size_t)first + 2, &text, &length) == KITE_OK);
    CHECK_MSG(length == got.text_length && memcmp(text, got.text, length) == 0, "the text is not cut before the stop");
    kite_free(text);
    CHECK(kite_engine_get_stats(e).kv_blocks_free == kite_engine_get_stats(e).kv_blocks_total);
    kite_engine_free(e);
    kite_model_free(m);
}

/* Two requests with the insertion in a KV cache that holds one of them: the later one is preempted and
 * recomputes its tokens, the inserted ones included, and both still produce the same tokens. */
static void test_insertion_survives_preemption(void) {
    kite_model *m = load_model();
    if (!m) return;
    const int32_t max_tokens = 40;
    record plain, after;
    int32_t first = 0;
    const int32_t trigger = plain_answer(m, max_tokens, &plain, &first);
    expected_after(m, &plain, first, max_tokens, &after);
    kite_engine_params params = kite_engine_params_default();
    params.kv_block_size = 4;
    params.prefix_cache = false;
    const int32_t blocks = (N_BASE + max_tokens + N_INSERTION + 3) / 4 + 4; /* one request, not two */
    params.kv_cache_bytes = engine_kv_block_bytes(m, 4) * (size_t)blocks;
    kite_engine *e = NULL;
    CHECK_MSG(kite_engine_create(m, &params, &e) == KITE_OK, "engine: %s", kite_last_error());
    record got[2];
    for (int i = 0; i < 2; i++) {
        kite_request r = inserting_request(trigger, max_tokens, &got[i]);
        CHECK(kite_engine_submit(e, &r, NULL) == KITE_OK);
    }
    CHECK(kite_engine_run(e) == KITE_OK);
    CHECK_MSG(kite_engine_get_stats(e).preemptions > 0, "no preemption in a cache of %d blocks", blocks);
    check_inserted(m, &got[0], &plain, first, &after, max_tokens, "first of two");
    check_inserted(m, &got[1], &plain, first, &after, max_tokens, "preempted");
    CHECK(kite_engine_get_stats(e).kv_blocks_free == kite_engine_get_stats(e).kv_blocks_total);
    kite_engine_free(e);
    kite_model_free(m);
}

/* Nothing is inserted when the trigger never comes, when the request ends with it (max_tokens, a stop id), or
 * when the insertion would leave no room in the context; a bad insertion is refused at submit. */
static void test_no_insertion(void) {
    kite_model *m = load_model();
    if (!m) return;
    const int32_t max_tokens = 16;
    record plain, got;
    int32_t first = 0;
    const int32_t trigger = plain_answer(m, max_tokens, &plain, &first);
    kite_engine *e = NULL;
    CHECK(kite_engine_create(m, NULL, &e) == KITE_OK);

    int32_t absent = 0; /* an id the plain answer does not hold */
    for (;; absent++) {
        bool found = false;
        for (int32_t i = 0; i < plain.n; i++) found |= plain.tokens[i] == absent;
        if (!found) break;
    }
    kite_request r = inserting_request(absent, max_tokens, &got);
    run_one(e, &r);
    CHECK(got.insertion_events == 0 && got.n == plain.n && memcmp(got.tokens, plain.tokens, sizeof plain.tokens) == 0);
    CHECK(got.text_length > 0);

    r = inserting_request(trigger, first + 1, &got); /* the trigger is the last token max_tokens allows */
    run_one(e, &r);
    CHECK(got.insertion_events == 0 && got.finish == KITE_FINISH_LENGTH && got.n == first + 1);

    r = inserting_request(trigger, max_tokens, &got); /* the trigger is a stop id */
    r.stop_ids = &trigger;
    r.n_stop_ids = 1;
    run_one(e, &r);
    CHECK(got.insertion_events == 0 && got.finish == KITE_FINISH_STOP && got.n == first + 1);
    kite_engine_free(e);

    kite_engine_params params = kite_engine_params_default();
    params.max_context = N_BASE + first + 1 + N_INSERTION; /* the insertion fits, one more token does not */
    CHECK(kite_engine_create(m, &params, &e) == KITE_OK);
    r = inserting_request(trigger, max_tokens, &got);
    run_one(e, &r);
    CHECK_MSG(got.insertion_events == 0 && got.finish == KITE_FINISH_LENGTH && got.n == first + 1,
              "a full context: %d insertion events, finish %d, %d tokens", got.insertion_events, got.finish, got.n);

    int32_t too_many[KITE_MAX_INSERT_IDS + 1] = {0};
    r = inserting_request(trigger, max_tokens, &got);
    r.insert_ids = too_many;
    r.n_insert_ids = KITE_MAX_INSERT_IDS + 1;
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    const int32_t outside[] = {5, kite_model_get_info(m).vocab_size};
    r.insert_ids = outside;
    r.n_insert_ids = 2;
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    CHECK(strstr(kite_last_error(), "insert_ids[1]") != NULL);
    r = inserting_request(-1, max_tokens, &got);
    CHECK(kite_engine_submit(e, &r, NULL) == KITE_ERROR_INVALID_ARGUMENT);
    kite_engine_free(e);
    kite_model_free(m);
}

/* The ids above are the texts their comment names. */
static void check_decodes_to(kite_model *m, const int32_t *ids, int32_t n, const char *expected) {
    char *text = NULL;
    size_t length = 0;
    CHECK_MSG(kite_detokenize(m, ids, (size_t)n, &text, &length) == KITE_OK, "%s", kite_last_error());
    CHECK_MSG(text && length == strlen(expected) && memcmp(text, expected, length) == 0, "'%.*s', expected '%s'",
              (int)length, text ? text : "", expected);
    kite_free(text);
}

static void test_the_ids_are_their_text(void) {
    kite_model *m = load_model();
    if (!m) return;
    check_decodes_to(m, base_prompt, N_BASE, "Hello, world! The quick brown fox jumps over the lazy dog.");
    check_decodes_to(m, insertion, N_INSERTION, "\n\n<tool_call>\n{\"name\": \"");
    check_decodes_to(m, insertion + 1, 1, "<tool_call>");
    kite_model_free(m);
}

int main(void) {
    TEST_RUN(test_the_ids_are_their_text);
    TEST_RUN(test_insertion_equals_a_longer_prompt);
    TEST_RUN(test_insertion_survives_preemption);
    TEST_RUN(test_insertion_in_a_sampled_request);
    TEST_RUN(test_a_stop_string_in_the_insertion);
    TEST_RUN(test_no_insertion);
    return test_finish();
}

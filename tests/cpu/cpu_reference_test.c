/* The CPU backend against Hugging Face transformers (float32, CPU) on real hub-layout checkpoints.
 *
 * tests/data/NAME.reference.json comes from /work/shared/device/reference.py: per prompt, its ids, the
 * argmax at every prompt position, and 32 greedy steps with the top-5 log-probabilities of each. We feed
 * the prompt, then the reference's greedy tokens one step at a time (teacher forcing), and require at
 * every step: the same argmax, and top-5 log-probabilities within 1e-4 (ids equal except where the
 * reference's own values are within 1e-5 of a neighbour: a tie the order of which is arbitrary).
 * tests/data/yarn/ holds the same for the tiny checkpoints with YaRN rope scaling (make_yarn_references.py), run
 * from their config.json and from the plain checkpoint with the scaling as an override.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/config.h"
#include "test_util.h"
#include "util/error.h"
#include "util/json.h"

#define TOP_K 5
#ifndef LOGPROB_TOLERANCE
#define LOGPROB_TOLERANCE 1e-4
#endif
#define TIE_TOLERANCE 1e-5
/* tiny-yarn's prompts: all of them, the 2,530-token one past the original 1,024 positions included, except under
 * AddressSanitizer (scripts/test.sh's second pass, which looks for memory errors on the same code): there the
 * short ones, as in the other YaRN cases, since the long prompt's logits at every position cost ~40 of the test's
 * ~57 CPU s. */
#if !defined(__has_feature)
#define __has_feature(x) 0 /* GCC says __SANITIZE_ADDRESS__ instead */
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#define TINY_YARN_MAX_PROMPT 256
#else
#define TINY_YARN_MAX_PROMPT 0
#endif
#define BLOCK_SIZE 16

/* Reads an array of integers into a new buffer; NULL (and a failed check) when it is not one. */
static int32_t *read_int_array(const json_value *array, const char *what, size_t *n) {
    *n = 0;
    if (!json_is_array(array)) {
        CHECK_MSG(0, "%s is not an array", what);
        return NULL;
    }
    int32_t *out = malloc((array->length ? array->length : 1) * sizeof *out);
    if (!out) return NULL;
    for (size_t i = 0; i < array->length; i++) {
        int64_t value;
        if (!json_get_int64(&array->as.items[i], &value) || value < INT32_MIN || value > INT32_MAX) {
            CHECK_MSG(0, "%s[%zu] is not an int32", what, i);
            free(out);
            return NULL;
        }
        out[i] = (int32_t)value;
    }
    *n = array->length;
    return out;
}

static int read_top(const json_value *ids, const json_value *logprobs, int32_t top_ids[TOP_K],
                    double top_logprobs[TOP_K]) {
    if (!json_is_array(ids) || !json_is_array(logprobs) || ids->length != TOP_K || logprobs->length != TOP_K)
        return 0;
    for (size_t k = 0; k < TOP_K; k++) {
        int64_t id;
        if (!json_get_int64(&ids->as.items[k], &id) || !json_get_double(&logprobs->as.items[k], &top_logprobs[k]))
            return 0;
        top_ids[k] = (int32_t)id;
    }
    return 1;
}

/* Log-softmax of one row of logits, in double. */
static void log_softmax(const float *logits, double *out, size_t n) {
    double max_logit = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (logits[i] > max_logit) max_logit = logits[i];
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += exp((double)logits[i] - max_logit);
    double log_sum = max_logit + log(sum);
    for (size_t i = 0; i < n; i++) out[i] = (double)logits[i] - log_sum;
}

/* The k largest values (ties: the lowest id first), by repeated selection: vocabularies are small here. */
static void top_k(const double *values, size_t n, int32_t ids[TOP_K]) {
    for (int k = 0; k < TOP_K; k++) {
        int32_t best = -1;
        for (size_t i = 0; i < n; i++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= ids[j] == (int32_t)i;
            if (taken) continue;
            if (best < 0 || values[i] > values[best]) best = (int32_t)i;
        }
        ids[k] = best;
    }
}

/* Compares our log-probabilities with one reference top-5; where names the prompt and step. */
static void compare_top(const double *ours, size_t vocab, const int32_t ref_ids[TOP_K],
                        const double ref_logprobs[TOP_K], const char *where) {
    int32_t our_ids[TOP_K];
    top_k(ours, vocab, our_ids);
    for (int k = 0; k < TOP_K; k++) {
        CHECK_MSG(ref_ids[k] >= 0 && (size_t)ref_ids[k] < vocab, "%s: reference id %d outside the vocabulary",
                  where, ref_ids[k]);
        if (ref_ids[k] < 0 || (size_t)ref_ids[k] >= vocab) return;
        double at_ref = ours[ref_ids[k]];
        CHECK_MSG(fabs(at_ref - ref_logprobs[k]) <= LOGPROB_TOLERANCE,
                  "%s: top-%d id %d: log-prob %.7f, reference %.7f", where, k, ref_ids[k], at_ref, ref_logprobs[k]);
        CHECK_MSG(fabs(ours[our_ids[k]] - ref_logprobs[k]) <= LOGPROB_TOLERANCE,
                  "%s: top-%d value %.7f, reference %.7f", where, k, ours[our_ids[k]], ref_logprobs[k]);
        int tied = (k > 0 && fabs(ref_logprobs[k] - ref_logprobs[k - 1]) <= TIE_TOLERANCE) ||
                   (k + 1 < TOP_K && fabs(ref_logprobs[k] - ref_logprobs[k + 1]) <= TIE_TOLERANCE);
        if (!tied)
            CHECK_MSG(our_ids[k] == ref_ids[k], "%s: top-%d id %d, reference %d", where, k, our_ids[k], ref_ids[k]);
    }
}

/* Runs n_new tokens of one sequence and returns the log-softmax of its last row in logprobs. */
static int run_tokens(backend *b, const int32_t *tokens, int32_t n_new, int32_t context_len, const int32_t *table,
                      float *logits, double *logprobs, size_t vocab) {
    int32_t starts[2] = {0, n_new};
    const int32_t *tables[1] = {table};
    uint8_t wants[1] = {1};
    step_batch batch = {.n_seqs = 1, .n_tokens = n_new, .token_ids = tokens, .seq_token_start = starts,
                        .seq_context_len = &context_len, .block_tables = tables, .seq_wants_logits = wants};
    kite_status status = b->ops->forward(b, &batch);
    CHECK_MSG(status == KITE_OK, "forward: %s", kite_last_error());
    if (status != KITE_OK) return 0;
    status = b->ops->read_logits(b, logits, 1);
    CHECK_MSG(status == KITE_OK, "read_logits: %s", kite_last_error());
    if (status != KITE_OK) return 0;
    log_softmax(logits, logprobs, vocab);
    return 1;
}

static void check_prompt(backend *b, const json_value *result, int32_t n_blocks, size_t vocab, int prompt_index,
                         const char *name) {
    size_t n_prompt = 0, n_prompt_argmax = 0, n_greedy = 0;
    int32_t *prompt = read_int_array(json_object_member(result, "prompt_ids"), "prompt_ids", &n_prompt);
    int32_t *prompt_argmax = read_int_array(json_object_member(result, "prompt_argmax"), "prompt_argmax", &n_prompt_argmax);
    int32_t *greedy = read_int_array(json_object_member(result, "greedy"), "greedy", &n_greedy);
    const json_value *steps = json_object_member(result, "steps");
    int32_t *table = malloc((size_t)n_blocks * sizeof *table);
    int32_t *sequence = malloc((n_prompt + n_greedy + 1) * sizeof *sequence);
    float *logits = malloc(vocab * sizeof *logits);
    double *logprobs = malloc(vocab * sizeof *logprobs);
    if (!prompt || !prompt_argmax || !greedy || !json_is_array(steps) || !table || !sequence || !logits ||
        !logprobs || n_prompt == 0 || n_prompt_argmax != n_prompt || steps->length != n_greedy ||
        (int64_t)(n_prompt + n_greedy) > (int64_t)n_blocks * BLOCK_SIZE) {
        CHECK_MSG(0, "%s prompt %d: malformed reference or out of memory", name, prompt_index);
        goto done;
    }
    /* Blocks in reverse order: the cache is used non-contiguously. */
    for (int32_t i = 0; i < n_blocks; i++) table[i] = n_blocks - 1 - i;
    memcpy(sequence, prompt, n_prompt * sizeof *sequence);

    char where[96];
    int32_t top_ids[TOP_K];
    double top_logprobs[TOP_K];
    if (!run_tokens(b, prompt, (int32_t)n_prompt, (int32_t)n_prompt, table, logits, logprobs, vocab)) goto done;
    snprintf(where, sizeof where, "%s prompt %d last position", name, prompt_index);
    if (read_top(json_object_member(result, "last_top_ids"), json_object_member(result, "last_top_logprobs"), top_ids,
                 top_logprobs))
        compare_top(logprobs, vocab, top_ids, top_logprobs, where);
    else
        CHECK_MSG(0, "%s: malformed last_top_ids / last_top_logprobs", where);

    size_t context = n_prompt;
    for (size_t s = 0; s < n_greedy; s++) {
        snprintf(where, sizeof where, "%s prompt %d step %zu", name, prompt_index, s);
        const json_value *step = &steps->as.items[s];
        if (!read_top(json_object_member(step, "top_ids"), json_object_member(step, "top_logprobs"), top_ids,
                      top_logprobs)) {
            CHECK_MSG(0, "%s: malformed step", where);
            break;
        }
        int32_t argmax = -1;
        CHECK(b->ops->argmax(b, &argmax, 1) == KITE_OK);
        CHECK_MSG(argmax == greedy[s], "%s: argmax %d, reference greedy token %d", where, argmax, greedy[s]);
        compare_top(logprobs, vocab, top_ids, top_logprobs, where);
        if (s + 1 == n_greedy) break;
        /* Teacher forcing: continue with the reference's token whatever we chose. */
        sequence[context] = greedy[s];
        context++;
        if (!run_tokens(b, &sequence[context - 1], 1, (int32_t)context, table, logits, logprobs, vocab)) break;
    }

    /* The argmax at every prompt position, feeding the prompt one token at a time (a second path through
     * the cache). A mismatch is accepted only as a near tie: both ids within tolerance in log-probability. */
    for (size_t i = 0; i < n_prompt; i++) {
        if (!run_tokens(b, &prompt[i], 1, (int32_t)i + 1, table, logits, logprobs, vocab)) break;
        int32_t argmax = -1;
        CHECK(b->ops->argmax(b, &argmax, 1) == KITE_OK);
        int32_t want = prompt_argmax[i];
        CHECK_MSG(argmax == want ||
                      (want >= 0 && (size_t)want < vocab && argmax >= 0 &&
                       fabs(logprobs[argmax] - logprobs[want]) <= LOGPROB_TOLERANCE),
                  "%s prompt %d position %zu: argmax %d, reference %d", name, prompt_index, i, argmax, want);
    }
done:
    free(prompt);
    free(prompt_argmax);
    free(greedy);
    free(table);
    free(sequence);
    free(logits);
    free(logprobs);
}

/* dir's checkpoint (its config.json's rope scaling replaced by rope_override when that is not NULL) against
 * tests/data/REFERENCE.reference.json, its prompts of at most max_prompt tokens (0: all); name labels messages. */
static void check_checkpoint_against(const char *dir, const char *rope_override, const char *reference,
                                     size_t max_prompt, const char *name) {
    char reference_path[1024];
    snprintf(reference_path, sizeof reference_path, "%s/%s.reference.json", KITE_TEST_DATA_DIR, reference);
    size_t length = 0;
    char *text = test_read_file(reference_path, &length);
    CHECK_MSG(text != NULL, "cannot read %s", reference_path);
    if (!text) return;
    json_error error;
    json_document *document = json_parse(text, length, &error);
    CHECK_MSG(document != NULL, "%s: %d:%d: %s", reference_path, error.line, error.column, error.message);
    checkpoint *ckpt = NULL;
    backend *b = NULL;
    if (!document) goto done;
    const json_value *results = json_object_member(json_root(document), "results");
    const char *dtype = json_is_string(json_object_member(json_root(document), "dtype"))
                            ? json_object_member(json_root(document), "dtype")->as.string
                            : "";
    CHECK_MSG(strcmp(dtype, "float32") == 0, "%s: dtype \"%s\", the CPU oracle compares with float32", reference_path,
              dtype);
    CHECK_MSG(json_is_array(results) && results->length > 0, "%s: no results", reference_path);
    if (!json_is_array(results)) goto done;

    kite_status status = checkpoint_open_overriding(dir, rope_override, &ckpt);
    CHECK_MSG(status == KITE_OK, "checkpoint_open(%s): %s", dir, kite_last_error());
    if (status != KITE_OK) goto done;
    const qwen3_config *config = checkpoint_config(ckpt);
    backend_params params = {.n_threads = 0, .device = 0};
    status = cpu_backend_create(config, checkpoint_weights(ckpt), &params, &b);
    CHECK_MSG(status == KITE_OK, "cpu_backend_create: %s", kite_last_error());
    if (status != KITE_OK) goto done;
    /* Enough for the longest prompt plus its greedy steps. */
    size_t longest = 0;
    for (size_t r = 0; r < results->length; r++) {
        const json_value *ids = json_object_member(&results->as.items[r], "prompt_ids");
        const json_value *greedy = json_object_member(&results->as.items[r], "greedy");
        size_t total = (json_is_array(ids) ? ids->length : 0) + (json_is_array(greedy) ? greedy->length : 0);
        if (total > longest) longest = total;
    }
    int32_t n_blocks = (int32_t)((longest + BLOCK_SIZE - 1) / BLOCK_SIZE) + 1;
    status = b->ops->kv_reserve(b, n_blocks, BLOCK_SIZE);
    CHECK_MSG(status == KITE_OK, "kv_reserve: %s", kite_last_error());
    if (status != KITE_OK) goto done;
    for (size_t r = 0; r < results->length; r++) {
        const json_value *ids = json_object_member(&results->as.items[r], "prompt_ids");
        if (max_prompt > 0 && json_is_array(ids) && ids->length > max_prompt) {
            printf("  %s: prompt %zu (%zu tokens) is past this run's %zu-token limit, not checked here\n", name, r,
                   ids->length, max_prompt);
            continue;
        }
        check_prompt(b, &results->as.items[r], n_blocks, (size_t)config->vocab_size, (int)r, name);
    }
done:
    if (b) b->ops->destroy(b);
    if (ckpt) checkpoint_close(ckpt);
    json_free(document);
    free(text);
}

static void check_checkpoint(const char *name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", KITE_TEST_DATA_DIR, name);
    check_checkpoint_against(dir, NULL, name, 0, name);
}

/* A checkpoint directory made at run time: tests/data/BASE's files, but config.json, which is
 * tests/data/yarn/NAME.config.json (transformers' references were made on exactly this). */
typedef struct yarn_checkpoint {
    char dir[64];
    char paths[8][1100];
    int n_paths;
} yarn_checkpoint;

static bool yarn_checkpoint_make(yarn_checkpoint *y, const char *base, const char *name) {
    static const char *const files[] = {"model.safetensors", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                        "tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    y->n_paths = 0;
    snprintf(y->dir, sizeof y->dir, "/tmp/kite-yarn-XXXXXX");
    if (!mkdtemp(y->dir)) return false;
    char dir[sizeof y->dir], source[1024];
    memcpy(dir, y->dir, sizeof dir);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(source, sizeof source, "%s/%s/%s", KITE_TEST_DATA_DIR, base, files[i]);
        if (access(source, F_OK) != 0) continue;
        char *real = realpath(source, NULL);
        snprintf(y->paths[y->n_paths], sizeof y->paths[0], "%s/%s", dir, files[i]);
        bool linked = real && symlink(real, y->paths[y->n_paths]) == 0;
        free(real);
        if (!linked) return false;
        y->n_paths++;
    }
    snprintf(source, sizeof source, "%s/yarn/%s.config.json", KITE_TEST_DATA_DIR, name);
    size_t length = 0;
    char *config = test_read_file(source, &length);
    if (!config) return false;
    snprintf(y->paths[y->n_paths], sizeof y->paths[0], "%s/config.json", dir);
    FILE *f = fopen(y->paths[y->n_paths], "wb");
    bool written = f && fwrite(config, 1, length, f) == length;
    if (f && fclose(f) != 0) written = false;
    free(config);
    if (f) y->n_paths++;
    return written;
}

static void yarn_checkpoint_remove(yarn_checkpoint *y) {
    for (int i = 0; i < y->n_paths; i++) CHECK_MSG(unlink(y->paths[i]) == 0, "unlink %s", y->paths[i]);
    CHECK_MSG(rmdir(y->dir) == 0, "rmdir %s", y->dir);
}

/* The tiny checkpoints with YaRN: from their config.json edited as transformers ran it, against transformers'
 * outputs; and the original checkpoint with the same rope scaling given as an override (--rope-scaling), which
 * must read as the same configuration. The ~1,700-token prompt runs where it passes
 * original_max_position_embeddings (tiny-yarn's 1,024); the others' prompts stay below 256 tokens, which keeps
 * the sanitizer pass of this test short. */
static const struct {
    const char *name, *base, *override;
    size_t max_prompt;
} yarn_cases[] = {
    {"tiny-yarn", "tiny", "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":1024}",
     TINY_YARN_MAX_PROMPT},
    {"tiny-yarn-legacy-type", "tiny", "{\"type\":\"yarn\",\"factor\":2.0,\"mscale\":0.8,\"mscale_all_dim\":1.0}", 256},
    {"tiny-untied-yarn", "tiny-untied",
     "{\"rope_type\":\"yarn\",\"factor\":2.0,\"beta_fast\":16,\"beta_slow\":2,\"truncate\":false,"
     "\"attention_factor\":1.1}",
     256},
};

static void check_yarn(size_t i) {
    char reference[128];
    snprintf(reference, sizeof reference, "yarn/%s", yarn_cases[i].name);
    yarn_checkpoint y;
    bool made = yarn_checkpoint_make(&y, yarn_cases[i].base, yarn_cases[i].name);
    CHECK_MSG(made, "cannot make the %s checkpoint in %s", yarn_cases[i].name, y.dir);
    if (made) check_checkpoint_against(y.dir, NULL, reference, yarn_cases[i].max_prompt, yarn_cases[i].name);

    qwen3_config edited, overridden;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", KITE_TEST_DATA_DIR, yarn_cases[i].base);
    CHECK_MSG(made && qwen3_config_load(y.dir, &edited) == KITE_OK, "%s: %s", yarn_cases[i].name, kite_last_error());
    CHECK_MSG(qwen3_config_load_overriding(dir, yarn_cases[i].override, &overridden) == KITE_OK, "%s override: %s",
              yarn_cases[i].name, kite_last_error());
    CHECK_MSG(edited.rope_yarn && overridden.rope_yarn && edited.rope_theta == overridden.rope_theta &&
                  edited.context_limit == overridden.context_limit &&
                  edited.yarn.factor == overridden.yarn.factor &&
                  edited.yarn.original_max_positions == overridden.yarn.original_max_positions &&
                  edited.yarn.beta_fast == overridden.yarn.beta_fast &&
                  edited.yarn.beta_slow == overridden.yarn.beta_slow && edited.yarn.truncate == overridden.yarn.truncate &&
                  edited.yarn.attention_factor == overridden.yarn.attention_factor,
              "%s: the override reads differently from the edited config.json", yarn_cases[i].name);
    yarn_checkpoint_remove(&y);
}

static void test_tiny(void) { check_checkpoint("tiny"); }
static void test_tiny_untied(void) { check_checkpoint("tiny-untied"); }
static void test_tiny_yarn(void) { check_yarn(0); }
static void test_tiny_yarn_legacy_type(void) { check_yarn(1); }
static void test_tiny_untied_yarn(void) { check_yarn(2); }

int main(void) {
    TEST_RUN(test_tiny);
    TEST_RUN(test_tiny_untied);
    TEST_RUN(test_tiny_yarn);
    TEST_RUN(test_tiny_yarn_legacy_type);
    TEST_RUN(test_tiny_untied_yarn);
    return test_finish();
}

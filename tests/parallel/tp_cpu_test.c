/* The tensor-parallel CPU forward (src/parallel/tp_cpu.h) against the unsplit CPU backend on the same weights:
 * N ranks as N threads (comm_threads.h), teacher-forced over a prompt and 32 greedy steps.
 *
 * Models: tests/data/tiny (2 query heads over 1 kv head: only N = 1 splits it, and N = 2 must be refused naming
 * num_key_value_heads), tests/data/tiny-untied (4 over 2: N = 2), and a random tied model of 8 over 4 heads with
 * a vocabulary of 1001 (N = 2 and N = 4, so the vocabulary rows are shared unevenly: 251, 250, 250, 250).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cpu/cpu_test_model.h"
#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "logits_compare.h"
#include "parallel/comm_threads.h"
#include "parallel/tp_cpu.h"
#include "test_util.h"
#include "util/error.h"

#define PROMPT_TOKENS 7
#define DECODE_STEPS 32
#define ROWS (DECODE_STEPS + 1) /* the prompt's last token, then each decode step */
#define MAX_CONTEXT (PROMPT_TOKENS + DECODE_STEPS)
#define BLOCK_SIZE 16
#define MAX_RANKS 4
#define TIMEOUT_MS 60000 /* far above a step here, even under the sanitizers; a hang ends as an error */

/* The split changes only the order of the additions in the two all-reduced sums per layer (each rank's partial
 * dot product, then the ranks' partials added) and nothing else: the same float32 weights, kernels and per-head
 * math. Such rounding differences are a few float32 ulps per sum (~1e-7 relative) and grow little over a few
 * layers: the worst row here is 5.5e-7 (each check prints its worst). 1e-5 leaves a margin of about 20 for other
 * machines' kernels and models while still catching any real mistake in the split, which moves logits by O(1). */
#define MAX_REL_L2 1e-5

static const int32_t prompt_ids[PROMPT_TOKENS] = {9707, 11, 1879, 0, 151, 785, 42};

/* The unsplit CPU backend's logits rows and greedy tokens: the oracle and the teacher-forced input. */
typedef struct reference_run {
    int32_t vocab;
    float *logits;        /* (ROWS, vocab) */
    int32_t tokens[ROWS]; /* the argmax of each row: row k's token is the input of step k + 1 */
    int32_t prompt[PROMPT_TOKENS];
} reference_run;

static int reference_forward(const qwen3_config *config, const qwen3_weights *weights, reference_run *out) {
    memset(out, 0, sizeof *out);
    out->vocab = config->vocab_size;
    for (int i = 0; i < PROMPT_TOKENS; i++)
        out->prompt[i] = prompt_ids[i] % config->vocab_size;
    out->logits = malloc((size_t)ROWS * (size_t)config->vocab_size * sizeof(float));
    backend *b = NULL;
    const backend_params params = {.n_threads = 1};
    kite_status status = out->logits ? cpu_backend_create(config, weights, &params, &b) : KITE_ERROR_OUT_OF_MEMORY;
    CHECK_MSG(status == KITE_OK, "cpu_backend_create: %s", kite_last_error());
    if (status != KITE_OK) return 0;
    int32_t table[(MAX_CONTEXT + BLOCK_SIZE - 1) / BLOCK_SIZE];
    const int32_t n_blocks = (int32_t)(sizeof table / sizeof table[0]);
    for (int32_t i = 0; i < n_blocks; i++)
        table[i] = i;
    status = b->ops->kv_reserve(b, n_blocks, BLOCK_SIZE);
    int32_t context = 0;
    for (int32_t row = 0; row < ROWS && status == KITE_OK; row++) {
        const int32_t *tokens = row == 0 ? out->prompt : &out->tokens[row - 1];
        const int32_t n_new = row == 0 ? PROMPT_TOKENS : 1;
        context += n_new;
        const seq_step step = {tokens, n_new, context, table, 1};
        status = run_step(b, &step, 1);
        if (status == KITE_OK) status = b->ops->read_logits(b, out->logits + (size_t)row * (size_t)out->vocab, 1);
        if (status == KITE_OK) status = b->ops->argmax(b, &out->tokens[row], 1);
    }
    CHECK_MSG(status == KITE_OK, "cpu backend: %s", kite_last_error());
    b->ops->destroy(b);
    return status == KITE_OK;
}

/* One rank's run: the prompt, then the reference's tokens, its logits slice copied into the gathered rows. */
typedef struct rank_job {
    tp_cpu_rank *rank;
    const reference_run *reference;
    float *gathered;           /* (ROWS, vocab), shared: each rank writes its own columns */
    int32_t argmax_ids[ROWS];  /* the distributed argmax of each row, as this rank received it */
    int32_t bad_token_at_step; /* >= 0: this rank is given an id outside the vocabulary there (the failure test) */
} rank_job;

static kite_status rank_run(tp_comm *comm, void *user) {
    rank_job *job = user;
    const reference_run *ref = job->reference;
    const tp_plan *plan = tp_cpu_rank_plan(job->rank);
    tp_cpu_rank_reset(job->rank);
    for (int32_t row = 0; row < ROWS; row++) {
        const int32_t bad = ref->vocab + 5;
        const int32_t *tokens = row == job->bad_token_at_step ? &bad : row == 0 ? ref->prompt : &ref->tokens[row - 1];
        KITE_TRY(tp_cpu_forward(job->rank, comm, tokens, row == 0 ? PROMPT_TOKENS : 1));
        memcpy(job->gathered + (size_t)row * (size_t)ref->vocab + (size_t)plan->vocab.begin,
               tp_cpu_rank_logits(job->rank), (size_t)plan->vocab.count * sizeof(float));
        KITE_TRY(tp_cpu_argmax(job->rank, comm, &job->argmax_ids[row]));
    }
    return KITE_OK;
}

typedef struct tp_setup {
    int32_t n_ranks;
    tp_cpu_rank *ranks[MAX_RANKS];
    rank_job jobs[MAX_RANKS];
    void *users[MAX_RANKS];
    comm_threads_group *group;
    float *gathered;
} tp_setup;

static void tp_setup_free(tp_setup *s) {
    for (int32_t r = 0; r < s->n_ranks; r++)
        tp_cpu_rank_destroy(s->ranks[r]);
    comm_threads_destroy(s->group);
    free(s->gathered);
}

static int tp_setup_make(tp_setup *s, const qwen3_config *config, const qwen3_weights *weights, int32_t n_ranks,
                         const reference_run *ref) {
    memset(s, 0, sizeof *s);
    s->n_ranks = n_ranks;
    s->gathered = calloc((size_t)ROWS * (size_t)config->vocab_size, sizeof(float));
    CHECK(s->gathered != NULL);
    CHECK_MSG(comm_threads_create(n_ranks, TIMEOUT_MS, &s->group) == KITE_OK, "%s", kite_last_error());
    for (int32_t r = 0; r < n_ranks; r++) {
        const tp_cpu_params params = {
            .n_ranks = n_ranks, .rank = r, .max_context = MAX_CONTEXT, .n_threads = 1, .weights = KITE_WEIGHTS_BF16};
        const kite_status status = tp_cpu_rank_create(config, weights, &params, &s->ranks[r]);
        CHECK_MSG(status == KITE_OK, "rank %d of %d: %s", (int)r, (int)n_ranks, kite_last_error());
        s->jobs[r] =
            (rank_job){.rank = s->ranks[r], .reference = ref, .gathered = s->gathered, .bad_token_at_step = -1};
        s->users[r] = &s->jobs[r];
    }
    return s->gathered && s->group && test_current_failures == 0;
}

/* N ranks against the reference: every row's relative L2, every greedy token, the distributed argmax against the
 * argmax of the gathered row. With one rank nothing is split, so the logits must be the CPU backend's bits. */
static void check_split(const char *model, const qwen3_config *config, const qwen3_weights *weights,
                        const reference_run *ref, int32_t n_ranks) {
    tp_setup s;
    if (!tp_setup_make(&s, config, weights, n_ranks, ref)) {
        tp_setup_free(&s);
        return;
    }
    const kite_status status = comm_threads_run(s.group, rank_run, s.users);
    CHECK_MSG(status == KITE_OK, "%s N=%d: %s", model, (int)n_ranks, kite_last_error());
    double worst = 0.0;
    int32_t same_tokens = 0;
    const size_t vocab = (size_t)ref->vocab;
    for (int32_t row = 0; row < ROWS && status == KITE_OK; row++) {
        const float *got = s.gathered + (size_t)row * vocab, *want = ref->logits + (size_t)row * vocab;
        const double error = rel_l2(got, want, vocab);
        if (error > worst || isnan(error)) worst = error;
        CHECK_MSG(error <= MAX_REL_L2, "%s N=%d row %d: relative L2 %.3g", model, (int)n_ranks, (int)row, error);
        if (n_ranks == 1)
            CHECK_MSG(memcmp(got, want, vocab * sizeof(float)) == 0, "%s N=1 row %d: not the CPU backend's bits", model,
                      (int)row);
        const int32_t gathered_argmax = argmax_of(got, (int)vocab);
        for (int32_t r = 0; r < n_ranks; r++)
            CHECK_MSG(s.jobs[r].argmax_ids[row] == gathered_argmax, "%s N=%d row %d rank %d: argmax %d, gathered %d",
                      model, (int)n_ranks, (int)row, (int)r, (int)s.jobs[r].argmax_ids[row], (int)gathered_argmax);
        CHECK_MSG(s.jobs[0].argmax_ids[row] == ref->tokens[row], "%s N=%d row %d: token %d, the CPU backend's %d",
                  model, (int)n_ranks, (int)row, (int)s.jobs[0].argmax_ids[row], (int)ref->tokens[row]);
        same_tokens += s.jobs[0].argmax_ids[row] == ref->tokens[row];
    }
    printf("  %s N=%d: worst relative L2 %.3g over %d rows, %d of %d greedy tokens identical\n", model, (int)n_ranks,
           worst, ROWS, (int)same_tokens, ROWS);
    tp_setup_free(&s);
}

static checkpoint *open_model(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", KITE_TEST_DATA_DIR, name);
    checkpoint *ckpt = NULL;
    CHECK_MSG(checkpoint_open(dir, &ckpt) == KITE_OK, "checkpoint_open(%s): %s", dir, kite_last_error());
    return ckpt;
}

/* The committed checkpoint `name` split over n_ranks ranks against the CPU backend on it. */
static void check_checkpoint_split(const char *name, int32_t n_ranks) {
    checkpoint *ckpt = open_model(name);
    if (!ckpt) return;
    reference_run ref;
    if (reference_forward(checkpoint_config(ckpt), checkpoint_weights(ckpt), &ref))
        check_split(name, checkpoint_config(ckpt), checkpoint_weights(ckpt), &ref, n_ranks);
    free(ref.logits);
    checkpoint_close(ckpt);
}

static void test_tiny_one_rank_is_the_cpu_backend(void) { check_checkpoint_split("tiny", 1); }

static void test_tiny_untied_two_ranks(void) { check_checkpoint_split("tiny-untied", 2); }

static void test_random_model_two_and_four_ranks(void) {
    qwen3_config config = test_config(64, 8, 4, 16, 128, 3, 1001);
    config.tie_word_embeddings = true;
    test_model m;
    CHECK(test_model_build(&m, &config, TENSOR_DTYPE_BF16, 39));
    if (test_current_failures) return;
    reference_run ref;
    if (reference_forward(&m.config, &m.weights, &ref)) {
        check_split("random 8/4 heads", &m.config, &m.weights, &ref, 2);
        check_split("random 8/4 heads", &m.config, &m.weights, &ref, 4);
    }
    free(ref.logits);
    test_model_free(&m);
}

static void test_an_indivisible_degree_is_refused(void) {
    checkpoint *ckpt = open_model("tiny");
    if (!ckpt) return;
    const tp_cpu_params params = {.n_ranks = 2, .rank = 0, .max_context = MAX_CONTEXT, .n_threads = 1};
    tp_cpu_rank *rank = NULL;
    const kite_status status = tp_cpu_rank_create(checkpoint_config(ckpt), checkpoint_weights(ckpt), &params, &rank);
    CHECK(status == KITE_ERROR_UNSUPPORTED && rank == NULL);
    CHECK_MSG(strstr(kite_last_error(), "num_key_value_heads 1 is not divisible by the tensor-parallel degree 2"), "%s",
              kite_last_error());
    checkpoint_close(ckpt);
}

/* Rank 1 is handed a token outside the vocabulary at step 3: it fails there, and rank 0, already waiting in the
 * first all-reduce of that step, ends with rank 1's message instead of waiting out the timeout. */
static void test_a_failing_rank_ends_every_rank(void) {
    checkpoint *ckpt = open_model("tiny-untied");
    if (!ckpt) return;
    reference_run ref;
    tp_setup s;
    memset(&s, 0, sizeof s);
    if (reference_forward(checkpoint_config(ckpt), checkpoint_weights(ckpt), &ref) &&
        tp_setup_make(&s, checkpoint_config(ckpt), checkpoint_weights(ckpt), 2, &ref)) {
        s.jobs[1].bad_token_at_step = 3;
        const double start = test_seconds_now();
        const kite_status status = comm_threads_run(s.group, rank_run, s.users);
        const double seconds = test_seconds_now() - start;
        CHECK(status == KITE_ERROR_INVALID_INPUT);
        CHECK_MSG(strstr(kite_last_error(), "rank 1 failed") && strstr(kite_last_error(), "outside the vocabulary"),
                  "%s", kite_last_error());
        CHECK_MSG(seconds < TIMEOUT_MS / 1000.0 / 4, "%.2f s: the failure did not wake rank 0", seconds);
        for (int32_t r = 0; r < 2; r++) {
            const char *message;
            CHECK_MSG(comm_threads_rank_status(s.group, r, &message) == KITE_ERROR_INVALID_INPUT, "rank %d", (int)r);
            CHECK_MSG(strstr(message, "outside the vocabulary") != NULL, "rank %d: %s", (int)r, message);
        }
    }
    tp_setup_free(&s);
    free(ref.logits);
    checkpoint_close(ckpt);
}

int main(void) {
    TEST_RUN(test_tiny_one_rank_is_the_cpu_backend);
    TEST_RUN(test_tiny_untied_two_ranks);
    TEST_RUN(test_random_model_two_and_four_ranks);
    TEST_RUN(test_an_indivisible_degree_is_refused);
    TEST_RUN(test_a_failing_rank_ends_every_rank);
    return test_finish();
}

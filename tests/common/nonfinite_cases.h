/* The cases of a non-finite logits row, for one backend (nonfinite_test runs them on the CPU): copies of the test
 * checkpoints made at test time (poisoned_checkpoint.h) whose weights give some requests' rows NaN or +inf while
 * others' stay finite, which is what a real checkpoint with a damaged weight does:
 * - tiny with model.norm.weight NaN: every row of every request is NaN;
 * - tiny-untied (its lm_head is not the embedding, so only the residual stream of a request that reads the token
 *   turns non-finite) with a +inf in the embedding row of a prompt token: that request's first row is non-finite;
 * - tiny-untied with a +inf in the embedding row of a token that one request generates mid-decode (found on the
 *   clean checkpoint first): its rows turn non-finite from the step that feeds that token.
 * On every path (greedy decode overlapped and not, sampling from reduced rows and from whole rows, logprobs, alone
 * and batched) the engine's run succeeds, the poisoned request ends with exactly one final event,
 * KITE_FINISH_ERROR and a message naming the NaN / inf in its logits, after the tokens it made from finite rows
 * (the clean run's); a request batched with it gets exactly the tokens it gets alone on the clean checkpoint; every
 * KV block is free afterwards. `kite run` exits 1 saying so. */
#ifndef KITE_TEST_NONFINITE_CASES_H
#define KITE_TEST_NONFINITE_CASES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "kite.h"
#include "poisoned_checkpoint.h"
#include "test_util.h"
#include "token_record.h"

#define NONFINITE_POISONED_TOKEN 9707 /* the first prompt token, whose embedding row gets the +inf */
#define NONFINITE_HIDDEN 32           /* hidden_size of tiny and tiny-untied */
#define NONFINITE_MAX_TOKENS 8

static const int32_t nonfinite_poisoned_prompt[] = {NONFINITE_POISONED_TOKEN, 11, 1879, 374};
static const int32_t nonfinite_healthy_prompt[] = {1879, 374, 264, 1273};
static const int32_t nonfinite_other_prompt[] = {785, 3974, 13876, 38835}; /* the one that turns bad mid-decode */

typedef struct nonfinite_case {
    const char *name;
    kite_sampling sampling;
    int32_t n_logprobs;
    const char *overlap;          /* KITE_ENGINE_OVERLAP */
    const char *reduced_sampling; /* KITE_ENGINE_REDUCED_SAMPLING */
    int batched;                  /* a second, healthy request in the same steps */
} nonfinite_case;

/* What one run of up to two requests gave. */
typedef struct nonfinite_run {
    token_record records[2];
    kite_status status;
    int32_t blocks_total, blocks_free; /* after the run */
} nonfinite_run;

static inline kite_sampling nonfinite_sampled(int32_t top_k) {
    kite_sampling s = kite_sampling_default();
    s.temperature = 0.8f;
    s.top_k = top_k;
    s.seed = 7;
    return s;
}

static inline int names_nonfinite(const char *message) {
    return message && (strstr(message, "NaN") || strstr(message, "inf")) && strstr(message, "logits");
}

/* Runs prompts[0 .. n) (4 tokens each) with the case's settings on the checkpoint in dir; 0 when it could not. */
static inline int nonfinite_run_requests(const char *dir, kite_backend_kind backend_kind, const nonfinite_case *c,
                                         const int32_t *const *prompts, int n, nonfinite_run *out) {
    memset(out, 0, sizeof *out);
    setenv("KITE_ENGINE_OVERLAP", c->overlap, 1);
    setenv("KITE_ENGINE_REDUCED_SAMPLING", c->reduced_sampling, 1);
    kite_load_params lp = kite_load_params_default();
    lp.backend = backend_kind;
    lp.n_threads = 2;
    lp.weight_cache = "off";
    kite_model *m = NULL;
    kite_engine *e = NULL;
    kite_status s = kite_model_load(dir, &lp, &m);
    CHECK_MSG(s == KITE_OK, "%s: load: %s", c->name, kite_last_error());
    if (s == KITE_OK) {
        kite_engine_params ep = kite_engine_params_default();
        ep.kv_cache_bytes = 8u << 20;
        s = kite_engine_create(m, &ep, &e);
        CHECK_MSG(s == KITE_OK, "%s: engine: %s", c->name, kite_last_error());
    }
    for (int i = 0; s == KITE_OK && i < n; i++) {
        kite_request r = kite_request_default();
        r.prompt_ids = prompts[i];
        r.n_prompt_ids = 4;
        r.sampling = c->sampling;
        r.n_logprobs = c->n_logprobs;
        r.max_tokens = NONFINITE_MAX_TOKENS;
        r.ignore_eos = true;
        r.on_token = token_record_collect;
        r.user_data = &out->records[i];
        s = kite_engine_submit(e, &r, NULL);
        CHECK_MSG(s == KITE_OK, "%s: submit: %s", c->name, kite_last_error());
    }
    const int submitted = s == KITE_OK;
    if (submitted) {
        out->status = kite_engine_run(e);
        CHECK_MSG(out->status == KITE_OK, "%s: the run failed (%s): a bad row must end only its request", c->name,
                  kite_last_error());
        const kite_engine_stats stats = kite_engine_get_stats(e);
        out->blocks_total = stats.kv_blocks_total;
        out->blocks_free = stats.kv_blocks_free;
        CHECK_MSG(stats.kv_blocks_free == stats.kv_blocks_total, "%s: %d of %d KV blocks free after the run", c->name,
                  stats.kv_blocks_free, stats.kv_blocks_total);
    }
    kite_engine_free(e);
    kite_model_free(m);
    unsetenv("KITE_ENGINE_OVERLAP");
    unsetenv("KITE_ENGINE_REDUCED_SAMPLING");
    return submitted && out->status == KITE_OK;
}

/* The poisoned request's record: `expected` tokens (those of `clean`, from finite rows) then one final event with
 * KITE_FINISH_ERROR and a message naming the non-finite logits. */
static inline void nonfinite_check_failed(const char *what, const token_record *got, const token_record *clean,
                                          int32_t expected) {
    CHECK_MSG(got->finish == KITE_FINISH_ERROR, "%s: finish reason %s, not error", what,
              kite_finish_reason_string(got->finish));
    CHECK_MSG(got->finals == 1 && got->after_final == 0, "%s: %d final events, %d events after", what, got->finals,
              got->after_final);
    CHECK_MSG(names_nonfinite(got->error), "%s: message \"%s\"", what, got->error);
    CHECK_MSG(got->n == expected, "%s: %d tokens, not the %d made from finite rows", what, (int)got->n, (int)expected);
    for (int32_t i = 0; clean && i < expected && i < got->n; i++)
        CHECK_MSG(got->tokens[i] == clean->tokens[i], "%s: token %d is %d, the clean run's %d", what, (int)i,
                  (int)got->tokens[i], (int)clean->tokens[i]);
}

/* A healthy request's record equals its run alone on the clean checkpoint. */
static inline void nonfinite_check_unchanged(const char *what, const token_record *got, const token_record *alone) {
    CHECK_MSG(got->finish == alone->finish && got->finals == 1 && got->after_final == 0,
              "%s: finish %s (%d final events), alone %s", what, kite_finish_reason_string(got->finish), got->finals,
              kite_finish_reason_string(alone->finish));
    CHECK_MSG(got->n == alone->n && memcmp(got->tokens, alone->tokens, (size_t)got->n * sizeof got->tokens[0]) == 0,
              "%s: %d tokens, alone %d (or other tokens)", what, (int)got->n, (int)alone->n);
}

static inline int nonfinite_contains(const int32_t *ids, int32_t n, int32_t id) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

/* model.norm.weight[0] NaN: every row NaN; each request, batched or not, ends with the error and no token. */
static inline void nonfinite_check_nan_norm_case(const char *dir, kite_backend_kind kind, const nonfinite_case *c) {
    const int32_t *prompts[2] = {nonfinite_poisoned_prompt, nonfinite_healthy_prompt};
    nonfinite_run run;
    if (!nonfinite_run_requests(dir, kind, c, prompts, 1 + c->batched, &run)) return;
    for (int i = 0; i < 1 + c->batched; i++) {
        char what[160];
        snprintf(what, sizeof what, "NaN norm, %s, request %d", c->name, i);
        nonfinite_check_failed(what, &run.records[i], NULL, 0);
    }
}

/* +inf in the embedding row of the poisoned prompt's first token (tiny-untied): that request ends at its first row;
 * a healthy request beside it makes the tokens it makes alone on the clean checkpoint. */
static inline void nonfinite_check_prompt_case(const char *poisoned, kite_backend_kind kind, const nonfinite_case *c) {
    const int32_t *prompts[2] = {nonfinite_poisoned_prompt, nonfinite_healthy_prompt};
    nonfinite_run alone, run;
    if (c->batched && !nonfinite_run_requests(KITE_TEST_DATA_DIR "/tiny-untied", kind, c, prompts + 1, 1, &alone))
        return;
    if (!nonfinite_run_requests(poisoned, kind, c, prompts, 1 + c->batched, &run)) return;
    char what[160];
    snprintf(what, sizeof what, "poisoned prompt, %s", c->name);
    nonfinite_check_failed(what, &run.records[0], NULL, 0);
    if (c->batched) {
        snprintf(what, sizeof what, "poisoned prompt, %s, the healthy request", c->name);
        nonfinite_check_unchanged(what, &run.records[1], &alone.records[0]);
    }
}

/* +inf in the embedding row of a token the other prompt generates (token `at` of its clean run, a token that
 * neither request meets before): that request makes its clean tokens up to that one, then ends; the healthy one
 * beside it is unchanged. */
static inline void nonfinite_check_mid_decode_case(kite_backend_kind kind, const nonfinite_case *c) {
    const int32_t *prompts[2] = {nonfinite_other_prompt, nonfinite_healthy_prompt};
    nonfinite_run clean[2];
    for (int i = 0; i < 2; i++)
        if (!nonfinite_run_requests(KITE_TEST_DATA_DIR "/tiny-untied", kind, c, prompts + i, 1, &clean[i])) return;
    const token_record *a = &clean[0].records[0], *b = &clean[1].records[0];
    int32_t at = -1;
    for (int32_t i = 2; i < a->n && at < 0; i++) {
        const int32_t t = a->tokens[i];
        if (!nonfinite_contains(nonfinite_other_prompt, 4, t) && !nonfinite_contains(a->tokens, i, t) &&
            !nonfinite_contains(nonfinite_healthy_prompt, 4, t) && !nonfinite_contains(b->tokens, b->n, t))
            at = i;
    }
    CHECK_MSG(at >= 0, "mid-decode, %s: no token of the clean run (%d tokens) is new to both requests", c->name,
              (int)a->n);
    if (at < 0) return;
    char *poisoned = poisoned_checkpoint_make(KITE_TEST_DATA_DIR "/tiny-untied", "model.embed_tokens.weight",
                                              (size_t)a->tokens[at] * NONFINITE_HIDDEN + 3, 1, INFINITY);
    CHECK(poisoned != NULL);
    if (!poisoned) return;
    nonfinite_run run;
    if (nonfinite_run_requests(poisoned, kind, c, prompts, 1 + c->batched, &run)) {
        char what[160];
        snprintf(what, sizeof what, "mid-decode (token %d at %d), %s", (int)a->tokens[at], (int)at, c->name);
        nonfinite_check_failed(what, &run.records[0], a, at + 1);
        if (c->batched) {
            snprintf(what, sizeof what, "mid-decode, %s, the healthy request", c->name);
            nonfinite_check_unchanged(what, &run.records[1], b);
        }
    }
    poisoned_checkpoint_remove(poisoned);
}

#define NONFINITE_N_CASES 9

/* Every path: the case list. */
static inline void nonfinite_case_list(nonfinite_case cases[NONFINITE_N_CASES]) {
    const kite_sampling greedy = kite_sampling_default();
    const nonfinite_case list[NONFINITE_N_CASES] = {
        {"greedy, overlapped", greedy, 0, "1", "1", 0},
        {"greedy, overlapped, batched", greedy, 0, "1", "1", 1},
        {"greedy, not overlapped, batched", greedy, 0, "0", "1", 1},
        {"greedy with logprobs, batched", greedy, 3, "1", "1", 1},
        {"sampled from reduced rows", nonfinite_sampled(20), 0, "1", "1", 0},
        {"sampled from reduced rows, batched", nonfinite_sampled(20), 0, "1", "1", 1},
        {"sampled from whole rows, batched", nonfinite_sampled(20), 0, "1", "0", 1},
        {"sampled without top_k, batched", nonfinite_sampled(0), 0, "1", "1", 1},
        {"sampled with logprobs, batched", nonfinite_sampled(20), 2, "1", "1", 1},
    };
    memcpy(cases, list, sizeof list);
}

/* `kite run` on the checkpoint: exit 1 and a line on stderr naming the non-finite logits. */
static inline void nonfinite_check_cli(const char *dir, const char *backend_name, const char *options) {
    char out[4200], command[16384];
    snprintf(out, sizeof out, "%s/cli-output.txt", dir);
    snprintf(command, sizeof command, "'%s' run --model '%s' --backend %s --max-tokens 4 %s >'%s' 2>&1",
             KITE_CLI_PATH, dir, backend_name, options, out);
    const int status = system(command);
    CHECK_MSG(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 1, "kite run --backend %s %s: exit status %d, not 1",
              backend_name, options, status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    size_t length = 0;
    char *text = test_read_file(out, &length);
    CHECK_MSG(text && names_nonfinite(text), "kite run %s said: %s", options, text ? text : "(nothing)");
    free(text);
    if (remove(out) != 0) fprintf(stderr, "cannot remove %s\n", out);
}

static inline void nonfinite_check_nan_final_norm(kite_backend_kind backend_kind, const char *backend_name) {
    char *dir = poisoned_checkpoint_make(KITE_TEST_DATA_DIR "/tiny", "model.norm.weight", 0, 1, NAN);
    CHECK(dir != NULL);
    if (!dir) return;
    nonfinite_case cases[NONFINITE_N_CASES];
    nonfinite_case_list(cases);
    for (size_t i = 0; i < NONFINITE_N_CASES; i++) nonfinite_check_nan_norm_case(dir, backend_kind, &cases[i]);
    nonfinite_check_cli(dir, backend_name, "--prompt-ids 9707,11,1879");
    nonfinite_check_cli(dir, backend_name, "--prompt-ids 9707,11,1879 --temperature 0.7 --seed 3");
    nonfinite_check_cli(dir, backend_name, "--prompt-ids 9707,11,1879 --logprobs 2 --json");
    poisoned_checkpoint_remove(dir);
}

static inline void nonfinite_check_inf_in_a_prompt_embedding(kite_backend_kind backend_kind, const char *backend_name) {
    char *dir = poisoned_checkpoint_make(KITE_TEST_DATA_DIR "/tiny-untied", "model.embed_tokens.weight",
                                         (size_t)NONFINITE_POISONED_TOKEN * NONFINITE_HIDDEN + 5, 1, INFINITY);
    CHECK(dir != NULL);
    if (!dir) return;
    nonfinite_case cases[NONFINITE_N_CASES];
    nonfinite_case_list(cases);
    for (size_t i = 0; i < NONFINITE_N_CASES; i++) nonfinite_check_prompt_case(dir, backend_kind, &cases[i]);
    nonfinite_check_cli(dir, backend_name, "--prompt-ids 9707,11,1879");
    nonfinite_check_cli(dir, backend_name, "--prompt-ids 9707,11,1879 --temperature 0.7 --seed 3");
    poisoned_checkpoint_remove(dir);
}

static inline void nonfinite_check_inf_in_a_generated_embedding(kite_backend_kind backend_kind) {
    nonfinite_case cases[NONFINITE_N_CASES];
    nonfinite_case_list(cases);
    for (size_t i = 0; i < NONFINITE_N_CASES; i++) nonfinite_check_mid_decode_case(backend_kind, &cases[i]);
}

#endif

/* The cases of a non-finite logits row, for one backend (nonfinite_test on the CPU; the CUDA backend does not run
 * the tiny checkpoint's head_dim, so its end-to-end case needs a head_dim-128 checkpoint):
 * copies of the tiny checkpoint made at test time (poisoned_checkpoint.h) with model.norm.weight set to NaN (every
 * logit NaN) and with a +inf in the embedding row of a prompt token (the residual stream, and so every logit, turns
 * non-finite) must give KITE_ERROR_INVALID_INPUT from the engine, with a message naming the NaN / inf and no token,
 * for greedy decode (overlapped and not), sampling (from reduced rows and from whole rows), logprobs and a batch of
 * two; the CLI must exit 1 saying so. */
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

static const int32_t nonfinite_poisoned_prompt[] = {NONFINITE_POISONED_TOKEN, 11, 1879, 374};
static const int32_t nonfinite_healthy_prompt[] = {1879, 374, 264, 1273};

typedef struct nonfinite_case {
    const char *name;
    kite_sampling sampling;
    int32_t n_logprobs;
    const char *overlap;          /* KITE_ENGINE_OVERLAP */
    const char *reduced_sampling; /* KITE_ENGINE_REDUCED_SAMPLING */
    int batched;                  /* a second, healthy prompt in the same steps */
} nonfinite_case;

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

static inline void nonfinite_check_path(const char *dir, kite_backend_kind backend_kind, const nonfinite_case *c) {
    setenv("KITE_ENGINE_OVERLAP", c->overlap, 1);
    setenv("KITE_ENGINE_REDUCED_SAMPLING", c->reduced_sampling, 1);
    kite_load_params lp = kite_load_params_default();
    lp.backend = backend_kind;
    lp.n_threads = 2;
    kite_model *m = NULL;
    kite_status s = kite_model_load(dir, &lp, &m);
    CHECK_MSG(s == KITE_OK, "%s: load: %s", c->name, kite_last_error());
    if (s != KITE_OK) return;
    kite_engine_params ep = kite_engine_params_default();
    ep.kv_cache_bytes = 8u << 20;
    kite_engine *e = NULL;
    s = kite_engine_create(m, &ep, &e);
    CHECK_MSG(s == KITE_OK, "%s: engine: %s", c->name, kite_last_error());
    token_record records[2];
    memset(records, 0, sizeof records);
    for (int i = 0; s == KITE_OK && i < 1 + c->batched; i++) {
        kite_request r = kite_request_default();
        r.prompt_ids = i == 0 ? nonfinite_poisoned_prompt : nonfinite_healthy_prompt;
        r.n_prompt_ids = 4;
        r.sampling = c->sampling;
        r.n_logprobs = c->n_logprobs;
        r.max_tokens = 6;
        r.ignore_eos = true;
        r.on_token = token_record_collect;
        r.user_data = &records[i];
        kite_request_id id = 0;
        s = kite_engine_submit(e, &r, &id);
        CHECK_MSG(s == KITE_OK, "%s: submit: %s", c->name, kite_last_error());
    }
    if (s == KITE_OK) {
        s = kite_engine_run(e);
        CHECK_MSG(s == KITE_ERROR_INVALID_INPUT, "%s: run gave status %d (%s), not KITE_ERROR_INVALID_INPUT", c->name,
                  (int)s, s == KITE_OK ? "tokens made of non-finite logits" : kite_last_error());
        if (s != KITE_OK) CHECK_MSG(names_nonfinite(kite_last_error()), "%s: message: %s", c->name, kite_last_error());
        /* The poisoned prompt's first row already allows no token: none may reach its callback. */
        CHECK_MSG(records[0].n == 0, "%s: %d tokens from non-finite logits (the first %d)", c->name, (int)records[0].n,
                  (int)records[0].tokens[0]);
        /* Running again does not make tokens out of the same rows either. */
        s = kite_engine_run(e);
        CHECK_MSG(s != KITE_OK || records[0].n == 0, "%s: a second run made %d tokens", c->name, (int)records[0].n);
        CHECK_MSG(records[0].n == 0, "%s: a second run made %d tokens", c->name, (int)records[0].n);
    }
    kite_engine_free(e);
    kite_model_free(m);
    unsetenv("KITE_ENGINE_OVERLAP");
    unsetenv("KITE_ENGINE_REDUCED_SAMPLING");
}

static inline void nonfinite_check_every_path(const char *dir, kite_backend_kind backend_kind) {
    const nonfinite_case cases[] = {
        {"greedy, overlapped", kite_sampling_default(), 0, "1", "1", 0},
        {"greedy, not overlapped", kite_sampling_default(), 0, "0", "1", 0},
        {"greedy, batched", kite_sampling_default(), 0, "1", "1", 1},
        {"greedy with logprobs", kite_sampling_default(), 3, "1", "1", 0},
        {"sampled from reduced rows", nonfinite_sampled(20), 0, "1", "1", 0},
        {"sampled from reduced rows, batched", nonfinite_sampled(20), 0, "1", "1", 1},
        {"sampled from whole rows", nonfinite_sampled(20), 0, "1", "0", 0},
        {"sampled without top_k", nonfinite_sampled(0), 0, "1", "1", 0},
        {"sampled with logprobs", nonfinite_sampled(20), 2, "1", "1", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) nonfinite_check_path(dir, backend_kind, &cases[i]);
}

/* `kite run` on the checkpoint: exit 1 and one line on stderr naming the non-finite logits. */
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

/* model.norm.weight[0] NaN: every logit is NaN. */
static inline void nonfinite_check_nan_final_norm(kite_backend_kind backend_kind, const char *backend_name) {
    char *dir = poisoned_checkpoint_make(KITE_TEST_DATA_DIR "/tiny", "model.norm.weight", 0, 1, NAN);
    CHECK(dir != NULL);
    if (!dir) return;
    nonfinite_check_every_path(dir, backend_kind);
    nonfinite_check_cli(dir, backend_name, "--prompt-ids 9707,11,1879");
    nonfinite_check_cli(dir, backend_name, "--prompt-ids 9707,11,1879 --temperature 0.7 --seed 3");
    nonfinite_check_cli(dir, backend_name, "--prompt-ids 9707,11,1879 --logprobs 2 --json");
    poisoned_checkpoint_remove(dir);
}

/* +inf in the embedding row of the prompt's first token: the residual stream turns non-finite. */
static inline void nonfinite_check_inf_in_a_prompt_embedding(kite_backend_kind backend_kind, const char *backend_name) {
    const size_t hidden = 32; /* tests/data/tiny/config.json */
    char *dir = poisoned_checkpoint_make(KITE_TEST_DATA_DIR "/tiny", "model.embed_tokens.weight",
                                         (size_t)NONFINITE_POISONED_TOKEN * hidden + 5, 1, INFINITY);
    CHECK(dir != NULL);
    if (!dir) return;
    nonfinite_check_every_path(dir, backend_kind);
    nonfinite_check_cli(dir, backend_name, "--prompt-ids 9707,11,1879");
    nonfinite_check_cli(dir, backend_name, "--prompt-ids 9707,11,1879 --temperature 0.7 --seed 3");
    poisoned_checkpoint_remove(dir);
}

#endif

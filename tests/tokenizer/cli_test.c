/* `kite tokenize` and `kite detokenize` as scripts use them: output format, exit codes, one-line errors. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#define DATA_DIR KITE_TEST_DATA_DIR "/tokenizer"

static char out_path[64], err_path[64];

/* Runs the CLI with a shell command line; returns its exit code, stdout in *out (malloc'd). */
static int run_cli(const char *args, char **out, char **err) {
    char command[4096];
    snprintf(command, sizeof command, "'%s' %s >%s 2>%s", KITE_CLI_PATH, args, out_path, err_path);
    int status = system(command);
    *out = test_read_file(out_path, NULL);
    *err = test_read_file(err_path, NULL);
    if (status == -1 || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

static void test_tokenize(void) {
    char *out, *err;
    CHECK(run_cli("tokenize --model " DATA_DIR " 'Hello, my dog is cute'", &out, &err) == 0);
    CHECK_MSG(out && strcmp(out, "9707 11 847 5562 374 18838\n") == 0, "got '%s'", out ? out : "");
    free(out);
    free(err);
    CHECK(run_cli("tokenize --model " DATA_DIR " --json '<|im_start|>user'", &out, &err) == 0);
    CHECK_MSG(out && strcmp(out, "{\"ids\":[151644,872]}\n") == 0, "got '%s'", out ? out : "");
    free(out);
    free(err);
    CHECK(run_cli("tokenize --model " DATA_DIR " ''", &out, &err) == 0);
    CHECK(out && strcmp(out, "\n") == 0);
    free(out);
    free(err);
    /* "-" reads standard input; after "--" a text may begin with '-'; options may follow the text. */
    CHECK(run_cli("tokenize --model " DATA_DIR " - </dev/null", &out, &err) == 0);
    CHECK(out && strcmp(out, "\n") == 0);
    free(out);
    free(err);
    CHECK(run_cli("tokenize 'Hello, my dog is cute' --json --model=" DATA_DIR, &out, &err) == 0);
    CHECK_MSG(out && strcmp(out, "{\"ids\":[9707,11,847,5562,374,18838]}\n") == 0, "got '%s'", out ? out : "");
    free(out);
    free(err);
    CHECK(run_cli("tokenize -m " DATA_DIR " -- '-x'", &out, &err) == 0);
    CHECK_MSG(out && strcmp(out, "6558\n") == 0, "got '%s'", out ? out : "");
    free(out);
    free(err);
}

static void test_detokenize(void) {
    char *out, *err;
    CHECK(run_cli("detokenize --model " DATA_DIR " 9707 11 847 5562 374 18838", &out, &err) == 0);
    CHECK_MSG(out && strcmp(out, "Hello, my dog is cute") == 0, "got '%s'", out ? out : "");
    free(out);
    free(err);
    CHECK(run_cli("detokenize --model " DATA_DIR " --json 151644 872 198", &out, &err) == 0);
    CHECK_MSG(out && strcmp(out, "{\"text\":\"<|im_start|>user\\n\"}\n") == 0, "got '%s'", out ? out : "");
    free(out);
    free(err);
}

static bool one_line(const char *s) { return s && s[0] && strchr(s, '\n') == s + strlen(s) - 1; }

static void test_errors(void) {
    char *out, *err;
    CHECK(run_cli("tokenize 'no model'", &out, &err) == 2);
    free(out);
    free(err);
    CHECK(run_cli("tokenize --model " DATA_DIR " --bogus x", &out, &err) == 2);
    free(out);
    free(err);
    CHECK(run_cli("tokenize --model /nonexistent x", &out, &err) == 1);
    CHECK_MSG(one_line(err) && strstr(err, "/nonexistent/tokenizer.json"), "stderr '%s'", err ? err : "");
    free(out);
    free(err);
    CHECK(run_cli("detokenize --model " DATA_DIR " 151669", &out, &err) == 1);
    CHECK_MSG(one_line(err) && strstr(err, "151669"), "stderr '%s'", err ? err : "");
    free(out);
    free(err);
    CHECK(run_cli("detokenize --model " DATA_DIR " 12x", &out, &err) == 2);
    free(out);
    free(err);
    CHECK(run_cli("tokenize --model " DATA_DIR " two texts", &out, &err) == 2);
    CHECK_MSG(one_line(err), "stderr '%s'", err ? err : "");
    free(out);
    free(err);
    CHECK(run_cli("tokenize --model", &out, &err) == 2);
    CHECK_MSG(one_line(err) && strstr(err, "--model"), "stderr '%s'", err ? err : "");
    free(out);
    free(err);
    CHECK(run_cli("detokenize --model " DATA_DIR " -5", &out, &err) == 2);
    free(out);
    free(err);
}

/* --help prints the usage made from the option table, on stdout. */
static void test_help(void) {
    char *out, *err;
    CHECK(run_cli("detokenize --help", &out, &err) == 0);
    const char *usage = "usage: kite detokenize --model DIR [--json] ID...\n";
    CHECK_MSG(out && strncmp(out, usage, strlen(usage)) == 0, "got '%s'", out ? out : "");
    CHECK(out && strstr(out, "-m, --model DIR") && strstr(out, "--json") && strstr(out, "-h, --help"));
    CHECK(err && err[0] == '\0');
    free(out);
    free(err);
}

int main(void) {
    snprintf(out_path, sizeof out_path, "/tmp/kite-tok-cli-%d.out", (int)getpid());
    snprintf(err_path, sizeof err_path, "/tmp/kite-tok-cli-%d.err", (int)getpid());
    char *out, *err;
    int code = run_cli("tokenize --help", &out, &err);
    bool dispatched = code == 0 && out && strstr(out, "kite tokenize");
    free(out);
    free(err);
    if (!dispatched) {
        remove(out_path);
        remove(err_path);
        test_skip("this kite binary does not dispatch the tokenize command yet (tools/kite.c)");
    }
    TEST_RUN(test_tokenize);
    TEST_RUN(test_detokenize);
    TEST_RUN(test_errors);
    TEST_RUN(test_help);
    remove(out_path);
    remove(err_path);
    return test_finish();
}

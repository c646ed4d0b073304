/* `kite tokenize` and `kite detokenize`: the tokenizer of a checkpoint directory, from the command line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "tokenizer/tokenizer.h"

static void tokenize_usage(FILE *out) {
    fprintf(out,
            "usage: kite tokenize --model DIR [--json] TEXT\n"
            "  Prints the token ids of TEXT (\"-\" reads standard input), space-separated, or {\"ids\":[...]}\n"
            "  with --json. No special tokens are added; special tokens written in TEXT are recognised.\n");
}

static void detokenize_usage(FILE *out) {
    fprintf(out,
            "usage: kite detokenize --model DIR [--json] ID...\n"
            "  Prints the text of the token ids exactly (no newline is added), or {\"text\":\"...\"} with --json.\n");
}

static char *read_stdin(size_t *length) {
    size_t capacity = 1 << 16, n = 0;
    char *buffer = malloc(capacity);
    if (!buffer) return NULL;
    for (;;) {
        if (n == capacity) {
            char *grown = realloc(buffer, capacity * 2);
            if (!grown) {
                free(buffer);
                return NULL;
            }
            buffer = grown;
            capacity *= 2;
        }
        size_t got = fread(buffer + n, 1, capacity - n, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        free(buffer);
        return NULL;
    }
    *length = n;
    return buffer;
}

static int report(const char *command, kite_status status) {
    fprintf(stderr, "kite %s: %s\n", command, kite_last_error()[0] ? kite_last_error() : kite_status_string(status));
    return 1;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            tokenize_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--model") == 0 || strcmp(argv[i], "-m") == 0) {
            if (++i == argc) {
                fprintf(stderr, "kite tokenize: --model needs a directory\n");
                return 2;
            }
            model = argv[i];
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--") == 0 && i + 1 < argc && !text) {
            text = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "kite tokenize: unknown option '%s'\n", argv[i]);
            tokenize_usage(stderr);
            return 2;
        } else if (!text) {
            text = argv[i];
        } else {
            fprintf(stderr, "kite tokenize: one TEXT argument expected (quote it)\n");
            return 2;
        }
    }
    if (!model || !text) {
        tokenize_usage(stderr);
        return 2;
    }
    char *input = NULL;
    size_t length;
    if (strcmp(text, "-") == 0) {
        input = read_stdin(&length);
        if (!input) {
            fprintf(stderr, "kite tokenize: cannot read standard input: %s\n", strerror(errno));
            return 1;
        }
        text = input;
    } else {
        length = strlen(text);
    }
    tokenizer *t = NULL;
    kite_status status = tokenizer_load(model, &t);
    if (status != KITE_OK) {
        free(input);
        return report("tokenize", status);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    status = tokenizer_encode(t, text, length, &ids, &n);
    free(input);
    if (status != KITE_OK) {
        tokenizer_free(t);
        return report("tokenize", status);
    }
    if (json) fputs("{\"ids\":[", stdout);
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? (json ? "," : " ") : "", ids[i]);
    fputs(json ? "]}\n" : "\n", stdout);
    free(ids);
    tokenizer_free(t);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "kite tokenize: cannot write the output: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL;
    bool json = false;
    int32_t *ids = calloc((size_t)argc + 1, sizeof *ids);
    size_t n = 0;
    if (!ids) {
        fprintf(stderr, "kite detokenize: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            detokenize_usage(stdout);
            free(ids);
            return 0;
        } else if (strcmp(argv[i], "--model") == 0 || strcmp(argv[i], "-m") == 0) {
            if (++i == argc) {
                fprintf(stderr, "kite detokenize: --model needs a directory\n");
                free(ids);
                return 2;
            }
            model = argv[i];
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else {
            char *end = NULL;
            errno = 0;
            long v = strtol(argv[i], &end, 10);
            if (errno != 0 || end == argv[i] || *end != '\0' || v < 0 || v > INT32_MAX) {
                fprintf(stderr, "kite detokenize: '%s' is not a token id\n", argv[i]);
                free(ids);
                return 2;
            }
            ids[n++] = (int32_t)v;
        }
    }
    if (!model) {
        detokenize_usage(stderr);
        free(ids);
        return 2;
    }
    tokenizer *t = NULL;
    kite_status status = tokenizer_load(model, &t);
    char *text = NULL;
    size_t length = 0;
    if (status == KITE_OK) status = tokenizer_decode(t, ids, n, &text, &length);
    free(ids);
    tokenizer_free(t);
    if (status != KITE_OK) return report("detokenize", status);
    if (json) {
        fputs("{\"text\":", stdout);
        json_write_string(stdout, text, length);
        fputs("}\n", stdout);
    } else {
        fwrite(text, 1, length, stdout);
    }
    free(text);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kite detokenize: cannot write the output: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

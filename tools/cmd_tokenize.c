/* `kite tokenize` and `kite detokenize`: the tokenizer of a checkpoint directory, from the command line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_options.h"
#include "commands.h"
#include "kite.h"
#include "text_buffer.h"

enum { TOKENIZER_MODEL = 1, TOKENIZER_JSON };

static const cli_option tokenize_options[] = {
    {TOKENIZER_MODEL, "model", 'm', "DIR", "the checkpoint directory (only its tokenizer files are read)", false},
    {TOKENIZER_JSON, "json", 0, NULL, "print {\"ids\":[...]}", false},
};

static const cli_command tokenize_command = {
    "tokenize", "--model DIR [--json] TEXT",
    "  Prints the token ids of TEXT (\"-\" reads standard input), space-separated, or {\"ids\":[...]}\n"
    "  with --json. No special tokens are added; special tokens written in TEXT are recognised.\n",
    tokenize_options, sizeof tokenize_options / sizeof tokenize_options[0]};

static const cli_option detokenize_options[] = {
    {TOKENIZER_MODEL, "model", 'm', "DIR", "the checkpoint directory (only its tokenizer files are read)", false},
    {TOKENIZER_JSON, "json", 0, NULL, "print {\"text\":\"...\"}", false},
};

static const cli_command detokenize_command = {
    "detokenize", "--model DIR [--json] ID...",
    "  Prints the text of the token ids exactly (no newline is added), or {\"text\":\"...\"} with --json.\n",
    detokenize_options, sizeof detokenize_options / sizeof detokenize_options[0]};

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

/* Parses the options of either command: -1 when the command goes on, else its exit code (0 after --help). */
static int parse_options(const cli_command *command, int argc, char **argv, const char **model, bool *json,
                         int *first_argument) {
    cli_parser parser;
    cli_parser_init(&parser, command, argc, argv);
    for (int id; (id = cli_parser_next(&parser)) != CLI_END;) {
        switch (id) {
        case CLI_HELP: return 0;
        case TOKENIZER_MODEL: *model = parser.value; break;
        case TOKENIZER_JSON: *json = true; break;
        default: return 2;
        }
    }
    *first_argument = parser.first_argument;
    return -1;
}

static int finish_output(const char *command, const text_buffer *out) {
    if (!text_buffer_write(out, stdout) || fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kite %s: cannot write the output: %s\n", command,
                out->failed ? "out of memory" : strerror(errno));
        return 1;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    bool json = false;
    int first = argc;
    int code = parse_options(&tokenize_command, argc, argv, &model, &json, &first);
    if (code >= 0) return code;
    if (argc - first > 1) {
        fprintf(stderr, "kite tokenize: one TEXT argument expected (quote it)\n");
        return 2;
    }
    if (first < argc) text = argv[first];
    if (!model || !text) {
        cli_print_usage(&tokenize_command, stderr);
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
    kite_tokenizer *t = NULL;
    kite_status status = kite_tokenizer_load(model, &t);
    if (status != KITE_OK) {
        free(input);
        return report("tokenize", status);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    status = kite_tokenizer_encode(t, text, length, &ids, &n);
    free(input);
    kite_tokenizer_free(t);
    if (status != KITE_OK) return report("tokenize", status);
    text_buffer out = {0};
    if (json) {
        text_buffer_puts(&out, "{\"ids\":");
        text_buffer_json_int_array(&out, ids, n);
        text_buffer_puts(&out, "}\n");
    } else {
        for (size_t i = 0; i < n; i++) text_buffer_printf(&out, i ? " %d" : "%d", (int)ids[i]);
        text_buffer_puts(&out, "\n");
    }
    kite_free(ids);
    code = finish_output("tokenize", &out);
    text_buffer_free(&out);
    return code;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL;
    bool json = false;
    int first = argc;
    int code = parse_options(&detokenize_command, argc, argv, &model, &json, &first);
    if (code >= 0) return code;
    if (!model) {
        cli_print_usage(&detokenize_command, stderr);
        return 2;
    }
    size_t n = (size_t)(argc - first);
    int32_t *ids = calloc(n + 1, sizeof *ids);
    if (!ids) {
        fprintf(stderr, "kite detokenize: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *arg = argv[first + (int)i];
        char *end = NULL;
        errno = 0;
        long v = strtol(arg, &end, 10);
        if (errno != 0 || end == arg || *end != '\0' || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "kite detokenize: '%s' is not a token id\n", arg);
            free(ids);
            return 2;
        }
        ids[i] = (int32_t)v;
    }
    kite_tokenizer *t = NULL;
    kite_status status = kite_tokenizer_load(model, &t);
    char *text = NULL;
    size_t length = 0;
    if (status == KITE_OK) status = kite_tokenizer_decode(t, ids, n, &text, &length);
    free(ids);
    kite_tokenizer_free(t);
    if (status != KITE_OK) return report("detokenize", status);
    text_buffer out = {0};
    if (json) {
        text_buffer_puts(&out, "{\"text\":");
        text_buffer_json_string(&out, text, length);
        text_buffer_puts(&out, "}\n");
    } else {
        text_buffer_append(&out, text, length);
    }
    kite_free(text);
    code = finish_output("detokenize", &out);
    text_buffer_free(&out);
    return code;
}

/* kite: the command-line front end. Each subcommand lives in its own tools/cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "kite.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand subcommands[] = {
    {"run", cmd_run, "generate text from a prompt (or a file of prompts, as one batch)"},
    {"bench", cmd_bench, "measure prefill and decode throughput, each row checked against the CPU"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server (/v1/completions) with continuous batching"},
    {"chat", cmd_chat, "a conversation in the terminal through the checkpoint's chat template"},
    {"template", cmd_template, "print the prompt a chat request renders to (the checkpoint's chat template)"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"cache", cmd_cache, "list or clear the weight cache (converted weights kept between loads)"},
    {"info", cmd_info, "print the build, the backends present and the GPU"},
};

static void print_usage(FILE *out) {
    fprintf(out, "usage: kite <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(out, "  %-11s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(out, "\n`kite <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        print_usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kite %s (%s)\n", kite_version(), kite_build_commit());
        return 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (strcmp(argv[1], subcommands[i].name) == 0) return subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kite: unknown command '%s'\n", argv[1]);
    print_usage(stderr);
    return 2;
}

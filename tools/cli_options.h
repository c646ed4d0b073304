/* One option table per command: it drives getopt_long and the usage text is made from it, so the two cannot
 * disagree.
 *
 *     enum { OPT_MODEL = 1, OPT_JSON };
 *     static const cli_option options[] = {
 *         {OPT_MODEL, "model", 'm', "DIR", "the checkpoint directory"},
 *         {OPT_JSON, "json", 0, NULL, "print JSON"},
 *     };
 *     static const cli_command command = {"tokenize", "--model DIR [--json] TEXT", NULL, options, 2};
 *     cli_parser p;
 *     cli_parser_init(&p, &command, argc, argv);
 *     for (int id; (id = cli_parser_next(&p)) != CLI_END;) switch (id) {
 *         case CLI_HELP: return 0;     (the usage is printed on stdout)
 *         case CLI_ERROR: return 2;    (one line on stderr said what is wrong)
 *         case OPT_MODEL: model = p.value; break;
 *         ...
 *     }
 *
 * --help / -h is added to every table. Options may come in any order, between positional arguments too
 * (GNU getopt_long: --name=value, -xVALUE and unique prefixes of long names work; "--" ends the options).
 * An option given twice is returned twice: a repeatable one (--stop) collects its values, any other keeps
 * its last value.
 */
#ifndef KITE_TOOLS_CLI_OPTIONS_H
#define KITE_TOOLS_CLI_OPTIONS_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct cli_option {
    int id;                 /* > 0, unique in its table: what cli_parser_next returns */
    const char *long_name;  /* "max-tokens" (for --max-tokens); NULL for a short-only option */
    char short_name;        /* 'n' (for -n); 0 for none */
    const char *value_name; /* "N" for an option that takes a value; NULL for a flag */
    const char *help;       /* one line for the usage text (a "\n" inside starts an indented next line) */
    bool repeatable;        /* given more than once, each value counts (the usage says so) */
} cli_option;

typedef struct cli_command {
    const char *name;        /* "run": messages begin "kite run: " */
    const char *synopsis;    /* what follows "usage: kite run " */
    const char *description; /* lines printed between the usage line and the options (may be NULL) */
    const cli_option *options;
    size_t n_options;
} cli_command;

#define CLI_MAX_OPTIONS 64

/* cli_parser_next's results besides an option's id. */
enum {
    CLI_END = 0,    /* no option left: positional arguments are at argv[first_argument..argc) */
    CLI_HELP = -1,  /* --help: the usage was printed on stdout (exit 0) */
    CLI_ERROR = -2, /* an unknown option or a missing value: said on stderr with the usage (exit 2) */
};

typedef struct cli_parser {
    const cli_command *command;
    int argc;
    char **argv;
    const cli_option *option; /* the option just returned */
    const char *value;        /* its value (NULL for a flag) */
    char name[64];            /* how messages name it: "--max-tokens", or "-p" for a short-only option */
    int first_argument;       /* after CLI_END: the index of the first positional argument */
    struct option long_options[CLI_MAX_OPTIONS + 2];
    char short_options[3 * CLI_MAX_OPTIONS + 8];
} cli_parser;

/* Prepares to parse argv[1..argc) (argv[0] is the command's name). A table too large for the parser is a
 * programming error: it is said on stderr and every cli_parser_next returns CLI_ERROR. */
void cli_parser_init(cli_parser *p, const cli_command *command, int argc, char **argv);
int cli_parser_next(cli_parser *p);

/* "usage: kite NAME SYNOPSIS", the description, then one line per option with its help. */
void cli_print_usage(const cli_command *command, FILE *out);

/* The value of the option just returned, checked: false after one line on stderr naming the option
 * ("kite: --top-p: '2' is not a number in [0, 1]"), which is a usage error (exit 2). */
bool cli_value_int(const cli_parser *p, long long min, long long max, long long *out);
bool cli_value_float(const cli_parser *p, double min, double max, double *out);
/* "a,b,c" into a malloc'd array (free() it) of values in [min, max]. */
bool cli_value_int_list(const cli_parser *p, long long min, long long max, int32_t **out, size_t *n);
/* One of the strings in `choices` (a NULL-terminated list); *out is its index. */
bool cli_value_choice(const cli_parser *p, const char *const *choices, int *out);

/* The same checks on any text, `option` naming it in the message. */
bool cli_parse_int(const char *option, const char *text, long long min, long long max, long long *out);
bool cli_parse_float(const char *option, const char *text, double min, double max, double *out);
bool cli_parse_int_list(const char *option, const char *text, long long min, long long max, int32_t **out,
                        size_t *n);

#endif

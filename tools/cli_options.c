#include "cli_options.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* getopt_long's `val` for an option: its short name when it has one (so -m and --model return the same), else
 * LONG_ONLY_BASE + its index in the table. */
#define LONG_ONLY_BASE 256
#define HELP_SHORT_NAME 'h'

static const cli_option help_option = {0, "help", HELP_SHORT_NAME, NULL, "print this help", false};

void cli_parser_init(cli_parser *p, const cli_command *command, int argc, char **argv) {
    memset(p, 0, sizeof *p);
    p->command = command;
    p->argc = argc;
    p->argv = argv;
    p->first_argument = argc;
    if (command->n_options > CLI_MAX_OPTIONS) {
        fprintf(stderr, "kite %s: %zu options, more than the parser holds (%d)\n", command->name,
                command->n_options, CLI_MAX_OPTIONS);
        p->command = NULL;
        return;
    }
    size_t n_long = 0, n_short = 0;
    p->short_options[n_short++] = ':'; /* a missing value returns ':' rather than '?' */
    p->short_options[n_short++] = HELP_SHORT_NAME;
    for (size_t i = 0; i < command->n_options; i++) {
        const cli_option *o = &command->options[i];
        int val = o->short_name ? (unsigned char)o->short_name : LONG_ONLY_BASE + (int)i;
        if (o->short_name == HELP_SHORT_NAME || o->short_name == ':' || o->id <= 0) {
            fprintf(stderr, "kite %s: option %zu of the table is not usable (id %d, -%c)\n", command->name, i,
                    o->id, o->short_name ? o->short_name : ' ');
            p->command = NULL;
            return;
        }
        if (o->short_name) {
            p->short_options[n_short++] = o->short_name;
            if (o->value_name) p->short_options[n_short++] = ':';
        }
        if (o->long_name)
            p->long_options[n_long++] =
                (struct option){o->long_name, o->value_name ? required_argument : no_argument, NULL, val};
    }
    p->long_options[n_long++] = (struct option){help_option.long_name, no_argument, NULL, HELP_SHORT_NAME};
    p->long_options[n_long] = (struct option){NULL, 0, NULL, 0};
    p->short_options[n_short] = '\0';
    /* glibc starts a new scan, permutation state included, when optind is 0. */
    optind = 0;
    opterr = 0;
}

/* The table entry getopt_long's `val` stands for; NULL for none. */
static const cli_option *option_for(const cli_parser *p, int val) {
    const cli_command *command = p->command;
    if (val >= LONG_ONLY_BASE) {
        size_t i = (size_t)(val - LONG_ONLY_BASE);
        return i < command->n_options ? &command->options[i] : NULL;
    }
    if (val == HELP_SHORT_NAME) return &help_option;
    for (size_t i = 0; i < command->n_options; i++)
        if (val > 0 && command->options[i].short_name == (char)val) return &command->options[i];
    return NULL;
}

static void option_name(const cli_option *o, char *out, size_t capacity) {
    if (o->long_name)
        snprintf(out, capacity, "--%s", o->long_name);
    else
        snprintf(out, capacity, "-%c", o->short_name);
}

int cli_parser_next(cli_parser *p) {
    if (!p->command) return CLI_ERROR;
    p->option = NULL;
    p->value = NULL;
    p->name[0] = '\0';
    int c = getopt_long(p->argc, p->argv, p->short_options, p->long_options, NULL);
    if (c == -1) {
        p->first_argument = optind;
        return CLI_END;
    }
    const char *command = p->command->name;
    if (c == ':' || c == '?') {
        const cli_option *o = option_for(p, optopt);
        char name[64] = "";
        if (o) option_name(o, name, sizeof name);
        if (c == ':' && o) {
            fprintf(stderr, "kite %s: %s needs a value\n", command, name);
        } else if (o) { /* --flag=value */
            fprintf(stderr, "kite %s: %s takes no value\n", command, name);
        } else {
            /* An unknown long option (or an ambiguous prefix) leaves optopt 0; an unknown short one names it. */
            if (optopt > 0 && optopt < LONG_ONLY_BASE)
                fprintf(stderr, "kite %s: unknown option '-%c'\n", command, optopt);
            else
                fprintf(stderr, "kite %s: unknown option '%s'\n", command, p->argv[optind - 1]);
            cli_print_usage(p->command, stderr);
        }
        return CLI_ERROR;
    }
    if (c == HELP_SHORT_NAME) {
        cli_print_usage(p->command, stdout);
        return CLI_HELP;
    }
    const cli_option *o = option_for(p, c);
    if (!o) { /* getopt_long returns only what the tables hold */
        fprintf(stderr, "kite %s: option %d is not in the table\n", command, c);
        return CLI_ERROR;
    }
    p->option = o;
    p->value = o->value_name ? optarg : NULL;
    option_name(o, p->name, sizeof p->name);
    return o->id;
}

/* ---- usage ------------------------------------------------------------------------------------------ */

#define USAGE_HELP_COLUMN 26 /* where the help text starts; a longer option puts its help on the next line */

static void print_option(const cli_option *o, FILE *out) {
    char names[96];
    if (o->short_name && o->long_name)
        snprintf(names, sizeof names, "-%c, --%s", o->short_name, o->long_name);
    else if (o->short_name)
        snprintf(names, sizeof names, "-%c", o->short_name);
    else /* the long names line up whether or not a short name comes first */
        snprintf(names, sizeof names, "    --%s", o->long_name);
    int n = fprintf(out, "  %s%s%s", names, o->value_name ? " " : "", o->value_name ? o->value_name : "");
    if (n + 2 > USAGE_HELP_COLUMN)
        fprintf(out, "\n%*s", USAGE_HELP_COLUMN, "");
    else
        fprintf(out, "%*s", USAGE_HELP_COLUMN - n, "");
    for (const char *h = o->help; *h; h++) {
        fputc(*h, out);
        if (*h == '\n') fprintf(out, "%*s", USAGE_HELP_COLUMN, "");
    }
    fputs(o->repeatable ? " (repeatable)\n" : "\n", out);
}

void cli_print_usage(const cli_command *command, FILE *out) {
    fprintf(out, "usage: kite %s %s\n", command->name, command->synopsis);
    if (command->description) {
        fputs(command->description, out);
        if (command->description[0] && command->description[strlen(command->description) - 1] != '\n')
            fputc('\n', out);
    }
    for (size_t i = 0; i < command->n_options; i++) print_option(&command->options[i], out);
    print_option(&help_option, out);
}

/* ---- values ----------------------------------------------------------------------------------------- */

bool cli_parse_int(const char *option, const char *text, long long min, long long max, long long *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "kite: %s: '%s' is not an integer in [%lld, %lld]\n", option, text, min, max);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_float(const char *option, const char *text, double min, double max, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(v >= min && v <= max)) {
        fprintf(stderr, "kite: %s: '%s' is not a number in [%g, %g]\n", option, text, min, max);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_int_list(const char *option, const char *text, long long min, long long max, int32_t **out,
                        size_t *n) {
    *out = NULL;
    *n = 0;
    size_t count = 1;
    for (const char *c = text; *c; c++) count += *c == ',';
    int32_t *values = malloc(count * sizeof(int32_t));
    char *copy = strdup(text);
    if (!values || !copy) {
        free(values);
        free(copy);
        fprintf(stderr, "kite: out of memory\n");
        return false;
    }
    size_t k = 0;
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        long long v;
        if (!cli_parse_int(option, item, min, max, &v)) {
            free(values);
            free(copy);
            return false;
        }
        values[k++] = (int32_t)v;
    }
    free(copy);
    if (k == 0) {
        fprintf(stderr, "kite: %s: empty list\n", option);
        free(values);
        return false;
    }
    *out = values;
    *n = k;
    return true;
}

bool cli_value_int(const cli_parser *p, long long min, long long max, long long *out) {
    return cli_parse_int(p->name, p->value ? p->value : "", min, max, out);
}

bool cli_value_float(const cli_parser *p, double min, double max, double *out) {
    return cli_parse_float(p->name, p->value ? p->value : "", min, max, out);
}

bool cli_value_int_list(const cli_parser *p, long long min, long long max, int32_t **out, size_t *n) {
    return cli_parse_int_list(p->name, p->value ? p->value : "", min, max, out, n);
}

bool cli_value_choice(const cli_parser *p, const char *const *choices, int *out) {
    const char *value = p->value ? p->value : "";
    for (int i = 0; choices[i]; i++) {
        if (strcmp(value, choices[i]) == 0) {
            *out = i;
            return true;
        }
    }
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; choices[i] && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", choices[i]);
    fprintf(stderr, "kite: %s: '%s' is not one of %s\n", p->name, value, list);
    return false;
}

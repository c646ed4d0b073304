/* Small helpers shared by the CLI subcommands: argument parsing with clear errors, and JSON output. */
#ifndef KITE_TOOLS_CLI_UTIL_H
#define KITE_TOOLS_CLI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kite.h"

/* Parses a whole decimal integer / float; false (after one line on stderr naming the option) otherwise. */
bool cli_parse_int(const char *option, const char *text, long long min, long long max, long long *out);
bool cli_parse_float(const char *option, const char *text, double min, double max, double *out);
/* Parses "a,b,c" into a malloc'd array of ints within [min, max]. */
bool cli_parse_int_list(const char *option, const char *text, long long min, long long max, int32_t **out, size_t *n);
/* Takes the value of option argv[*i] (advancing *i); false with a message when it is missing. */
bool cli_take_value(int argc, char **argv, int *i, const char **value);
/* Parses --backend auto|cpu|cuda. */
bool cli_parse_backend(const char *text, kite_backend_kind *out);

/* The options `kite run` and `kite serve` share (--backend, --threads/-t, --kv-cache-mb, --max-batch,
 * --max-step-tokens, --max-context). Returns CLI_OPTION_TAKEN when `option` was one of them and `value`
 * parsed, CLI_OPTION_BAD after a message when the value did not parse, CLI_OPTION_OTHER otherwise. */
typedef enum cli_option_result { CLI_OPTION_OTHER, CLI_OPTION_TAKEN, CLI_OPTION_BAD } cli_option_result;
cli_option_result cli_parse_engine_option(const char *option, const char *value, kite_load_params *load,
                                          kite_engine_params *engine);

/* The sampling options `kite run` and `kite bench` share (--temperature, --top-k, --top-p, --min-p,
 * --repeat-penalty; not --seed, which means the prompts' seed to the bench). Results as cli_parse_engine_option. */
cli_option_result cli_parse_sampling_option(const char *option, const char *value, kite_sampling *sampling);

/* Writes text as a JSON string literal (with quotes), escaping as RFC 8259 requires. */
void json_write_string(FILE *out, const char *text, size_t length);

/* Reports a failed kite call: "kite: <what>: <message>" on stderr. Returns 1 (the exit code). */
int cli_report(const char *what, kite_status status);

#endif

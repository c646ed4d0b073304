/* kite info: what this build contains and what it finds on this machine; with --options, every runtime switch
 * of the registry with its value (--markdown: the table docs/OPTIONS.md is made of). */
#include <stdio.h>
#include <string.h>

#include "cli_options.h"
#include "commands.h"
#include "kite.h"

enum { INFO_OPTIONS = 1, INFO_MARKDOWN };

static const cli_option info_options[] = {
    {INFO_OPTIONS, "options", 0, NULL, "list every runtime switch (environment variable) with its value, default and range",
     false},
    {INFO_MARKDOWN, "markdown", 0, NULL, "with --options: the list as the Markdown table of docs/OPTIONS.md", false},
};

static const cli_command info_command = {
    "info", "[--options [--markdown]]",
    "  What this build contains and what it finds on this machine (backends, the GPU).\n", info_options,
    sizeof info_options / sizeof info_options[0]};

static void print_range(const kite_option_info *o, char *out, size_t capacity) {
    if (o->is_bool) snprintf(out, capacity, "0 or 1");
    else snprintf(out, capacity, "%d to %d", (int)o->min, (int)o->max);
}

static int print_options(bool markdown) {
    const int32_t n = kite_option_count();
    int exit_code = 0;
    if (markdown) {
        printf("| switch | default | values | what it does |\n|---|---|---|---|\n");
    }
    for (int32_t i = 0; i < n; i++) {
        kite_option_info o;
        if (kite_option_get(i, &o) != KITE_OK) {
            fprintf(stderr, "kite info: %s\n", kite_last_error());
            return 1;
        }
        char range[64];
        print_range(&o, range, sizeof range);
        if (markdown) {
            printf("| `%s` | %d | %s | %s |\n", o.name, (int)o.default_value, range, o.doc);
            continue;
        }
        if (!o.valid) {
            printf("%s=%s  INVALID (%s)  default %d: %s\n", o.name, o.environment, range, (int)o.default_value, o.doc);
            exit_code = 1;
        } else {
            printf("%s=%d  (%s; default %d, %s): %s\n", o.name, (int)o.value, o.environment ? "set" : "unset",
                   (int)o.default_value, range, o.doc);
        }
    }
    return exit_code;
}

static void print_gb(const char *what, size_t bytes) { printf("%s %.1f GiB", what, (double)bytes / (1u << 30)); }

int cmd_info(int argc, char **argv) {
    bool options = false, markdown = false;
    cli_parser p;
    cli_parser_init(&p, &info_command, argc, argv);
    for (int id; (id = cli_parser_next(&p)) != CLI_END;) {
        switch (id) {
        case CLI_HELP: return 0;
        case INFO_OPTIONS: options = true; break;
        case INFO_MARKDOWN: markdown = true; break;
        default: return 2; /* CLI_ERROR: said on stderr */
        }
    }
    if (p.first_argument < argc || (markdown && !options)) {
        fprintf(stderr, "kite info: %s\n", p.first_argument < argc ? "takes no arguments" : "--markdown needs --options");
        cli_print_usage(&info_command, stderr);
        return 2;
    }
    if (options) return print_options(markdown);

    printf("kite %s\n", kite_version());
    printf("commit: %s (%s build)\n", kite_build_commit(), kite_build_type());
    printf("backends built: cpu%s\n", kite_built_with_cuda() ? ", cuda (sm_90a)" : "");
    kite_backend_probe_result probe;
    if (kite_backend_probe(KITE_BACKEND_CPU, 0, &probe) == KITE_OK) printf("cpu: available: %d threads\n", (int)probe.n_threads);
    if (kite_backend_probe(KITE_BACKEND_CUDA, 0, &probe) != KITE_OK) {
        fprintf(stderr, "kite info: %s\n", kite_last_error());
        return 1;
    }
    if (probe.available) {
        printf("cuda: available: %s, compute capability %d.%d, ", probe.device_name, (int)probe.compute_major,
               (int)probe.compute_minor);
        print_gb("memory", probe.memory_total_bytes);
        print_gb(",", probe.memory_free_bytes);
        printf(" free\n");
    } else if (probe.device_name[0]) {
        printf("cuda: not available: %s (device 0: %s, compute capability %d.%d)\n", probe.reason, probe.device_name,
               (int)probe.compute_major, (int)probe.compute_minor);
    } else {
        printf("cuda: not available: %s\n", probe.reason);
    }
    return 0;
}

/* kite info: what this build contains and what it finds on this machine; with --options, every runtime switch
 * of the registry with its value (--markdown: the table docs/OPTIONS.md is made of). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "kite.h"

static const char info_usage[] =
    "usage: kite info [--options [--markdown]]\n"
    "  --options    list every runtime switch (environment variable) with its value, default and range\n"
    "  --markdown   with --options: the list as the Markdown table of docs/OPTIONS.md\n";

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
    static const struct option long_options[] = {
        {"options", no_argument, NULL, 'o'},
        {"markdown", no_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool options = false, markdown = false;
    opterr = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", long_options, NULL)) != -1;) {
        switch (c) {
        case 'o': options = true; break;
        case 'm': markdown = true; break;
        case 'h': fputs(info_usage, stdout); return 0;
        default:
            fprintf(stderr, "kite info: unknown option '%s'\n%s", argv[optind - 1], info_usage);
            return 2;
        }
    }
    if (optind < argc || (markdown && !options)) {
        fputs(info_usage, stderr);
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

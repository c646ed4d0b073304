/* kite cache list|clear: the weight cache's entries (docs/weight-cache.md), through kite.h. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "kite.h"

enum { CACHE_DIR = 1 };

static const cli_option cache_options[] = {
    {CACHE_DIR, "weight-cache", 0, "DIR", "the cache folder (default $XDG_CACHE_HOME/kite, else ~/.cache/kite)", false},
};

static const cli_command cache_command = {
    "cache", "list|clear [--weight-cache DIR]",
    "  list: one line per entry (model, weights, backend/arch, size, created, file).\n"
    "  clear: removes every entry and unfinished fill; nothing else in the folder.\n",
    cache_options, sizeof cache_options / sizeof cache_options[0]};

static int cache_list(const char *dir) {
    kite_weight_cache_entry *entries = NULL;
    size_t n = 0;
    kite_status status = kite_weight_cache_list(dir, &entries, &n);
    if (status != KITE_OK) return cli_report("cache list", status);
    int exit_code = 0;
    for (size_t i = 0; i < n; i++) {
        const kite_weight_cache_entry *e = &entries[i];
        if (e->problem) {
            if (printf("%s: unusable (%s)\n", e->file, e->problem) < 0) exit_code = 1;
            continue;
        }
        char created[32] = "?";
        time_t t = (time_t)e->created;
        struct tm tm;
        if (gmtime_r(&t, &tm)) strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
        if (printf("%s  %s  %s/%s  %.1f MB  %s  %s\n", e->model, e->weights, e->backend, e->arch,
                   (double)e->bytes / 1e6, created, e->file) < 0)
            exit_code = 1;
    }
    kite_weight_cache_list_free(entries, n);
    if (exit_code) fprintf(stderr, "kite cache list: cannot write the output\n");
    return exit_code;
}

static int cache_clear(const char *dir) {
    size_t removed = 0;
    kite_status status = kite_weight_cache_clear(dir, &removed);
    if (status != KITE_OK) return cli_report("cache clear", status);
    printf("removed %zu file%s\n", removed, removed == 1 ? "" : "s");
    return 0;
}

int cmd_cache(int argc, char **argv) {
    const char *dir = NULL;
    cli_parser p;
    cli_parser_init(&p, &cache_command, argc, argv);
    for (int id; (id = cli_parser_next(&p)) != CLI_END;) {
        switch (id) {
        case CACHE_DIR:
            if (strcmp(p.value, "off") == 0 || !p.value[0]) {
                fprintf(stderr, "kite cache: --weight-cache needs a folder\n");
                return 2;
            }
            dir = p.value;
            break;
        case CLI_HELP: return 0;
        default: return 2; /* CLI_ERROR: said on stderr */
        }
    }
    if (p.first_argument != argc - 1) {
        fprintf(stderr, "kite cache: give list or clear\n");
        cli_print_usage(&cache_command, stderr);
        return 2;
    }
    const char *action = argv[p.first_argument];
    if (strcmp(action, "list") == 0) return cache_list(dir);
    if (strcmp(action, "clear") == 0) return cache_clear(dir);
    fprintf(stderr, "kite cache: unknown action '%s' (list or clear)\n", action);
    return 2;
}

/* kite run: generate from one prompt (streamed to stdout) or from a file of prompts (one per line, run as
 * one continuous batch). */
#include <math.h>
#include <stdio.h>
#include <sys/types.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_util.h"
#include "commands.h"
#include "kite.h"

static const char run_usage[] =
    "usage: kite run --model DIR (--prompt TEXT | --prompt-ids ID,ID,... | --prompt-file FILE) [options]\n"
    "  --max-tokens N        new tokens at most (default 256; 0 = until eos or the context limit)\n"
    "  --temperature T       0 = greedy (default 0)\n"
    "  --top-k K  --top-p P  --min-p P  --repeat-penalty R  --seed S\n"
    "  --stop STR            stop when STR appears (repeatable; STR is not printed)\n"
    "  --ignore-eos          keep generating past the end-of-text token\n"
    "  --logprobs K          report the top K log-probabilities of each token (with --json)\n"
    "  --backend auto|cpu|cuda   (default auto)    --threads N (CPU threads, 0 = all)\n"
    "  --max-context N       context limit (default: the model's, at most 65536)\n"
    "  --kv-cache-mb N       KV cache budget in MiB (default: 90% of free GPU memory; CPU: 4 full contexts)\n"
    "  --max-batch N         sequences per step at most (default 256)\n"
    "  --max-step-tokens N   tokens per step at most, the chunked-prefill budget (default 2048)\n"
    "  --dummy SHAPE         random weights of a known shape instead of --model (ids only)\n"
    "  --json                print one JSON object per prompt, last, alone on a line\n";

typedef struct generation {
    int32_t *prompt;
    size_t n_prompt;
    int32_t *tokens;
    float *logprobs;        /* per token */
    int32_t *top_ids;       /* per token x n_logprobs */
    float *top_logprobs;
    size_t n_tokens, capacity;
    char *text;
    size_t text_length, text_capacity;
    kite_finish_reason finish;
    int32_t n_logprobs;
    bool stream;            /* print text to stdout as it arrives */
    bool failed;
} generation;

static bool generation_reserve(generation *g) {
    if (g->n_tokens < g->capacity) return true;
    size_t grown = g->capacity ? g->capacity * 2 : 64;
    size_t top = (size_t)(g->n_logprobs > 0 ? g->n_logprobs : 1);
    int32_t *tokens = realloc(g->tokens, grown * sizeof(int32_t));
    if (tokens) g->tokens = tokens;
    float *logprobs = realloc(g->logprobs, grown * sizeof(float));
    if (logprobs) g->logprobs = logprobs;
    int32_t *top_ids = realloc(g->top_ids, grown * top * sizeof(int32_t));
    if (top_ids) g->top_ids = top_ids;
    float *top_logprobs = realloc(g->top_logprobs, grown * top * sizeof(float));
    if (top_logprobs) g->top_logprobs = top_logprobs;
    if (!tokens || !logprobs || !top_ids || !top_logprobs) return false;
    g->capacity = grown;
    return true;
}

static void on_token(const kite_token_event *event, void *user_data) {
    generation *g = user_data;
    if (event->token >= 0) {
        if (!generation_reserve(g)) {
            g->failed = true;
            return;
        }
        g->tokens[g->n_tokens] = event->token;
        g->logprobs[g->n_tokens] = event->logprob;
        for (int32_t k = 0; k < event->n_top && k < g->n_logprobs; k++) {
            g->top_ids[g->n_tokens * (size_t)g->n_logprobs + (size_t)k] = event->top_ids[k];
            g->top_logprobs[g->n_tokens * (size_t)g->n_logprobs + (size_t)k] = event->top_logprobs[k];
        }
        g->n_tokens++;
    }
    if (event->text_length > 0) {
        size_t needed = g->text_length + event->text_length + 1;
        if (needed > g->text_capacity) {
            size_t grown = g->text_capacity ? g->text_capacity * 2 : 256;
            while (grown < needed) grown *= 2;
            char *p = realloc(g->text, grown);
            if (!p) {
                g->failed = true;
                return;
            }
            g->text = p;
            g->text_capacity = grown;
        }
        memcpy(g->text + g->text_length, event->text, event->text_length);
        g->text_length += event->text_length;
        if (g->stream) {
            fwrite(event->text, 1, event->text_length, stdout);
            fflush(stdout);
        }
    }
    if (event->finish != KITE_FINISH_NONE) g->finish = event->finish;
}

static void print_json(const generation *g, double load_s, const kite_engine_timings *t) {
    printf("{\"prompt_tokens\":[");
    for (size_t i = 0; i < g->n_prompt; i++) printf("%s%d", i ? "," : "", g->prompt[i]);
    printf("],\"tokens\":[");
    for (size_t i = 0; i < g->n_tokens; i++) printf("%s%d", i ? "," : "", g->tokens[i]);
    printf("],\"text\":");
    json_write_string(stdout, g->text ? g->text : "", g->text_length);
    printf(",\"finish_reason\":\"%s\"", kite_finish_reason_string(g->finish));
    if (g->n_logprobs > 0) {
        printf(",\"logprobs\":[");
        for (size_t i = 0; i < g->n_tokens; i++) {
            printf("%s{\"token\":%d,\"logprob\":%.9g,\"top\":[", i ? "," : "", g->tokens[i], (double)g->logprobs[i]);
            for (int32_t k = 0; k < g->n_logprobs; k++) {
                size_t at = i * (size_t)g->n_logprobs + (size_t)k;
                printf("%s{\"id\":%d,\"logprob\":%.9g}", k ? "," : "", g->top_ids[at], (double)g->top_logprobs[at]);
            }
            printf("]}");
        }
        printf("]");
    }
    double prefill = t->prefill_seconds > 0 ? (double)t->prefill_tokens / t->prefill_seconds : 0.0;
    double decode = t->decode_seconds > 0 ? (double)t->decode_tokens / t->decode_seconds : 0.0;
    printf(",\"timings\":{\"load_s\":%.6f,\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f}}\n", load_s, prefill, decode);
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads FILE's lines (without their newline; empty lines skipped) into a malloc'd array. */
static bool read_prompt_lines(const char *path, char ***lines, size_t *n_lines) {
    *lines = NULL;
    *n_lines = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kite: --prompt-file: cannot open %s\n", path);
        return false;
    }
    char *line = NULL;
    size_t line_capacity = 0, capacity = 0;
    ssize_t got;
    bool ok = true;
    while ((got = getline(&line, &line_capacity, f)) >= 0) {
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (got == 0) continue;
        if (*n_lines == capacity) {
            capacity = capacity ? capacity * 2 : 16;
            char **grown = realloc(*lines, capacity * sizeof(char *));
            if (!grown) {
                ok = false;
                break;
            }
            *lines = grown;
        }
        (*lines)[*n_lines] = strdup(line);
        if (!(*lines)[*n_lines]) {
            ok = false;
            break;
        }
        (*n_lines)++;
    }
    if (ferror(f)) {
        fprintf(stderr, "kite: --prompt-file: error reading %s\n", path);
        ok = false;
    }
    free(line);
    fclose(f);
    if (ok && *n_lines == 0) {
        fprintf(stderr, "kite: --prompt-file: %s has no prompts\n", path);
        ok = false;
    }
    return ok;
}

int cmd_run(int argc, char **argv) {
    const char *model_dir = NULL, *dummy = NULL, *prompt_text = NULL, *prompt_ids_text = NULL, *prompt_file = NULL;
    kite_load_params load = kite_load_params_default();
    kite_engine_params engine_params = kite_engine_params_default();
    kite_request request = kite_request_default();
    request.max_tokens = 256;
    const char *stops[64];
    int32_t n_stops = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        long long iv;
        cli_option_result shared;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(run_usage, stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--ignore-eos") == 0) {
            request.ignore_eos = true;
        } else if (!cli_take_value(argc, argv, &i, &v)) {
            return 2;
        } else if (strcmp(a, "--model") == 0 || strcmp(a, "-m") == 0) {
            model_dir = v;
        } else if (strcmp(a, "--dummy") == 0) {
            dummy = v;
        } else if (strcmp(a, "--prompt") == 0 || strcmp(a, "-p") == 0) {
            prompt_text = v;
        } else if (strcmp(a, "--prompt-ids") == 0) {
            prompt_ids_text = v;
        } else if (strcmp(a, "--prompt-file") == 0) {
            prompt_file = v;
        } else if (strcmp(a, "--max-tokens") == 0 || strcmp(a, "-n") == 0) {
            if (!cli_parse_int(a, v, 0, INT32_MAX, &iv)) return 2;
            request.max_tokens = (int32_t)iv;
        } else if ((shared = cli_parse_sampling_option(a, v, &request.sampling)) != CLI_OPTION_OTHER) {
            if (shared == CLI_OPTION_BAD) return 2;
        } else if (strcmp(a, "--seed") == 0) {
            if (!cli_parse_int(a, v, 0, INT64_MAX, &iv)) return 2;
            request.sampling.seed = (uint64_t)iv;
        } else if (strcmp(a, "--stop") == 0) {
            if (n_stops == (int32_t)(sizeof stops / sizeof stops[0])) {
                fprintf(stderr, "kite: at most %zu --stop strings\n", sizeof stops / sizeof stops[0]);
                return 2;
            }
            if (!v[0]) {
                fprintf(stderr, "kite: --stop: the string is empty\n");
                return 2;
            }
            stops[n_stops++] = v;
        } else if (strcmp(a, "--logprobs") == 0) {
            if (!cli_parse_int(a, v, 0, 20, &iv)) return 2;
            request.n_logprobs = (int32_t)iv;
        } else if ((shared = cli_parse_engine_option(a, v, &load, &engine_params)) != CLI_OPTION_OTHER) {
            if (shared == CLI_OPTION_BAD) return 2;
        } else {
            fprintf(stderr, "kite run: unknown option '%s'\n%s", a, run_usage);
            return 2;
        }
    }
    if ((model_dir != NULL) == (dummy != NULL)) {
        fprintf(stderr, "kite run: give exactly one of --model DIR or --dummy SHAPE\n%s", run_usage);
        return 2;
    }
    if ((prompt_text != NULL) + (prompt_ids_text != NULL) + (prompt_file != NULL) != 1) {
        fprintf(stderr, "kite run: give exactly one of --prompt, --prompt-ids, --prompt-file\n%s", run_usage);
        return 2;
    }
    request.stop_strings = stops;
    request.n_stop_strings = n_stops;

    int32_t *prompt_ids = NULL;
    size_t n_prompt_ids = 0;
    if (prompt_ids_text && !cli_parse_int_list("--prompt-ids", prompt_ids_text, 0, INT32_MAX, &prompt_ids, &n_prompt_ids))
        return 2;
    char **prompt_lines = NULL;
    size_t n_prompts = 1;
    if (prompt_file) {
        if (!read_prompt_lines(prompt_file, &prompt_lines, &n_prompts)) {
            free(prompt_ids);
            return 1;
        }
    }

    int exit_code = 0;
    kite_model *model = NULL;
    kite_engine *engine = NULL;
    generation *gens = calloc(n_prompts, sizeof *gens);
    double load_start = seconds_now();
    kite_status status = KITE_OK;
    if (!gens) {
        fprintf(stderr, "kite: out of memory\n");
        exit_code = 1;
        goto done;
    }
    status = model_dir ? kite_model_load(model_dir, &load, &model) : kite_model_load_dummy(dummy, 0, &load, &model);
    if (status != KITE_OK) {
        exit_code = cli_report(model_dir ? model_dir : dummy, status);
        goto done;
    }
    status = kite_engine_create(model, &engine_params, &engine);
    if (status != KITE_OK) {
        exit_code = cli_report("engine", status);
        goto done;
    }
    double load_s = seconds_now() - load_start;
    {
        kite_engine_stats stats = kite_engine_get_stats(engine);
        fprintf(stderr, "kite: %s backend; KV cache %zu tokens (%d blocks of %d), %d sequences of the full %d-token context\n",
                kite_model_get_info(model).backend_name, stats.kv_capacity_tokens, stats.kv_blocks_total,
                stats.kv_block_size, stats.max_concurrent_full, stats.max_context);
    }

    for (size_t p = 0; p < n_prompts; p++) {
        generation *g = &gens[p];
        g->n_logprobs = request.n_logprobs;
        g->stream = !prompt_file;
        const char *text = prompt_file ? prompt_lines[p] : prompt_text;
        if (prompt_ids) {
            g->prompt = malloc(n_prompt_ids * sizeof(int32_t));
            if (!g->prompt) {
                fprintf(stderr, "kite: out of memory\n");
                exit_code = 1;
                goto done;
            }
            memcpy(g->prompt, prompt_ids, n_prompt_ids * sizeof(int32_t));
            g->n_prompt = n_prompt_ids;
        } else {
            status = kite_tokenize(model, text, strlen(text), &g->prompt, &g->n_prompt);
            if (status != KITE_OK) {
                exit_code = cli_report("tokenize", status);
                goto done;
            }
        }
        kite_request r = request;
        r.prompt_ids = g->prompt;
        r.n_prompt_ids = g->n_prompt;
        r.on_token = on_token;
        r.user_data = g;
        status = kite_engine_submit(engine, &r, NULL);
        if (status != KITE_OK) {
            exit_code = cli_report("request", status);
            goto done;
        }
    }
    status = kite_engine_run(engine);
    if (status != KITE_OK) {
        exit_code = cli_report("generate", status);
        goto done;
    }
    kite_engine_timings timings = kite_engine_get_timings(engine);
    for (size_t p = 0; p < n_prompts; p++) {
        generation *g = &gens[p];
        if (g->failed) {
            fprintf(stderr, "kite: out of memory while collecting the output\n");
            exit_code = 1;
            goto done;
        }
        if (g->finish == KITE_FINISH_CAPACITY) {
            fprintf(stderr, "kite: prompt %zu (%zu tokens) does not fit in the context (%d tokens) or the KV cache\n",
                    p + 1, g->n_prompt, kite_engine_get_stats(engine).max_context);
            exit_code = 1;
        }
        if (json) {
            if (g->stream && g->text_length > 0) fputc('\n', stdout);
            print_json(g, load_s, &timings);
        } else if (prompt_file) {
            printf("%s%.*s\n", p ? "\n" : "", (int)g->text_length, g->text ? g->text : "");
        } else {
            fputc('\n', stdout);
        }
    }
    if (!json) {
        double prefill = timings.prefill_seconds > 0 ? (double)timings.prefill_tokens / timings.prefill_seconds : 0.0;
        double decode = timings.decode_seconds > 0 ? (double)timings.decode_tokens / timings.decode_seconds : 0.0;
        fprintf(stderr, "kite: %s backend, load %.3f s, prefill %lld tokens at %.1f tok/s, decode %lld tokens at %.1f tok/s\n",
                kite_model_get_info(model).backend_name, load_s, (long long)timings.prefill_tokens, prefill,
                (long long)timings.decode_tokens, decode);
    }

done:
    fflush(stdout);
    if (gens) {
        for (size_t p = 0; p < n_prompts; p++) {
            free(gens[p].prompt);
            free(gens[p].tokens);
            free(gens[p].logprobs);
            free(gens[p].top_ids);
            free(gens[p].top_logprobs);
            free(gens[p].text);
        }
        free(gens);
    }
    for (size_t p = 0; prompt_lines && p < n_prompts; p++) free(prompt_lines[p]);
    free(prompt_lines);
    free(prompt_ids);
    kite_engine_free(engine);
    kite_model_free(model);
    return exit_code;
}

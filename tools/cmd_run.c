/* kite run: generate from one prompt (streamed to stdout) or from a file of prompts (one per line, run as
 * one continuous batch). */
#include <math.h>
#include <stdio.h>
#include <sys/types.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "kite.h"
#include "text_buffer.h"

enum {
    RUN_MODEL = 1,
    RUN_DUMMY,
    RUN_PROMPT,
    RUN_PROMPT_IDS,
    RUN_PROMPT_FILE,
    RUN_MAX_TOKENS,
    RUN_SEED,
    RUN_STOP,
    RUN_IGNORE_EOS,
    RUN_LOGPROBS,
    RUN_REPETITION_PENALTY,
    RUN_PRESENCE_PENALTY,
    RUN_FREQUENCY_PENALTY,
    RUN_MIN_TOKENS,
    RUN_LOGIT_BIAS,
    RUN_JSON,
};

static const cli_option run_options[] = {
    {RUN_MODEL, "model", 'm', "DIR", "the checkpoint directory (config.json, safetensors, tokenizer.json)", false},
    {RUN_DUMMY, "dummy", 0, "SHAPE", "random weights of a known shape instead of --model (ids only)", false},
    {RUN_PROMPT, "prompt", 'p', "TEXT", "the prompt, streamed back with its continuation on stdout", false},
    {RUN_PROMPT_IDS, "prompt-ids", 0, "ID,ID,...", "the prompt as token ids", false},
    {RUN_PROMPT_FILE, "prompt-file", 0, "FILE", "one prompt per line, run as one continuous batch", false},
    {RUN_MAX_TOKENS, "max-tokens", 'n', "N", "new tokens at most (default 256; 0 = until eos or the context limit)",
     false},
    CLI_SAMPLING_OPTIONS,
    {RUN_REPETITION_PENALTY, "repetition-penalty", 0, "R", "vLLM's name of --repeat-penalty", false},
    {RUN_PRESENCE_PENALTY, "presence-penalty", 0, "P",
     "subtract P from the logit of every token generated so far, in [-2, 2] (default 0 = off)", false},
    {RUN_FREQUENCY_PENALTY, "frequency-penalty", 0, "F",
     "subtract F per time a token was generated, in [-2, 2] (default 0 = off)", false},
    {RUN_LOGIT_BIAS, "logit-bias", 0, "ID=BIAS", "add BIAS in [-100, 100] to token ID's logit", true},
    {RUN_MIN_TOKENS, "min-tokens", 0, "N", "no end-of-text, stop id or stop string before N tokens (default 0)",
     false},
    {RUN_SEED, "seed", 0, "S", "the sampling seed: same seed, same tokens (default: a fresh one each run)", false},
    {RUN_STOP, "stop", 0, "STR", "stop when STR appears (STR is not printed)", true},
    {RUN_IGNORE_EOS, "ignore-eos", 0, NULL, "keep generating past the end-of-text token", false},
    {RUN_LOGPROBS, "logprobs", 0, "K", "report the top K log-probabilities of each token (with --json)", false},
    CLI_ENGINE_OPTIONS,
    {RUN_JSON, "json", 0, NULL, "print one JSON object per prompt, last, alone on a line", false},
};

static const cli_command run_command = {
    "run", "--model DIR (--prompt TEXT | --prompt-ids ID,ID,... | --prompt-file FILE) [options]", NULL, run_options,
    sizeof run_options / sizeof run_options[0]};

#define MAX_STOP_STRINGS 64

/* One --logit-bias ID=BIAS into *out; false after a message. */
static bool parse_logit_bias(const char *text, kite_logit_bias *out) {
    const char *equals = strchr(text, '=');
    char id_text[32];
    if (!equals || (size_t)(equals - text) >= sizeof id_text) {
        fprintf(stderr, "kite: --logit-bias: '%s' is not ID=BIAS\n", text);
        return false;
    }
    memcpy(id_text, text, (size_t)(equals - text));
    id_text[equals - text] = '\0';
    long long id;
    double bias;
    if (!cli_parse_int("--logit-bias", id_text, 0, INT32_MAX, &id)) return false;
    if (!cli_parse_float("--logit-bias", equals + 1, -100.0, 100.0, &bias)) return false;
    *out = (kite_logit_bias){(int32_t)id, (float)bias};
    return true;
}

typedef struct generation {
    int32_t *prompt;
    size_t n_prompt;
    int32_t *tokens;
    float *logprobs;        /* per token */
    int32_t *top_ids;       /* per token x n_logprobs */
    float *top_logprobs;
    size_t n_tokens, capacity;
    text_buffer text;
    kite_finish_reason finish;
    char error[256];        /* KITE_FINISH_ERROR's message */
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
        text_buffer_append(&g->text, event->text, event->text_length);
        if (g->text.failed) {
            g->failed = true;
            return;
        }
        if (g->stream) {
            fwrite(event->text, 1, event->text_length, stdout);
            fflush(stdout);
        }
    }
    if (event->finish != KITE_FINISH_NONE) g->finish = event->finish;
    if (event->error) snprintf(g->error, sizeof g->error, "%s", event->error);
}

/* The --json line of one prompt; false when it could not be built or written. */
static bool print_json(const generation *g, double load_s, const kite_engine_timings *t) {
    text_buffer b = {0};
    text_buffer_puts(&b, "{\"prompt_tokens\":");
    text_buffer_json_int_array(&b, g->prompt, g->n_prompt);
    text_buffer_puts(&b, ",\"tokens\":");
    text_buffer_json_int_array(&b, g->tokens, g->n_tokens);
    text_buffer_puts(&b, ",\"text\":");
    text_buffer_json_string(&b, g->text.data ? g->text.data : "", g->text.length);
    text_buffer_printf(&b, ",\"finish_reason\":\"%s\"", kite_finish_reason_string(g->finish));
    if (g->n_logprobs > 0) {
        text_buffer_puts(&b, ",\"logprobs\":[");
        for (size_t i = 0; i < g->n_tokens; i++) {
            text_buffer_printf(&b, "%s{\"token\":%d,\"logprob\":", i ? "," : "", g->tokens[i]);
            text_buffer_json_general(&b, g->logprobs[i], 9);
            text_buffer_puts(&b, ",\"top\":[");
            for (int32_t k = 0; k < g->n_logprobs; k++) {
                size_t at = i * (size_t)g->n_logprobs + (size_t)k;
                text_buffer_printf(&b, "%s{\"id\":%d,\"logprob\":", k ? "," : "", g->top_ids[at]);
                text_buffer_json_general(&b, g->top_logprobs[at], 9);
                text_buffer_puts(&b, "}");
            }
            text_buffer_puts(&b, "]}");
        }
        text_buffer_puts(&b, "]");
    }
    double prefill = t->prefill_seconds > 0 ? (double)t->prefill_tokens / t->prefill_seconds : 0.0;
    double decode = t->decode_seconds > 0 ? (double)t->decode_tokens / t->decode_seconds : 0.0;
    text_buffer_puts(&b, ",\"timings\":{\"load_s\":");
    text_buffer_json_fixed(&b, load_s, 6);
    text_buffer_puts(&b, ",\"prefill_tok_s\":");
    text_buffer_json_fixed(&b, prefill, 3);
    text_buffer_puts(&b, ",\"decode_tok_s\":");
    text_buffer_json_fixed(&b, decode, 3);
    text_buffer_puts(&b, "}}\n");
    bool ok = text_buffer_write(&b, stdout);
    text_buffer_free(&b);
    return ok;
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads FILE's lines (without their newline; empty lines skipped) into a malloc'd array. A line with a NUL
 * byte is refused: the prompts are C strings, and a NUL would silently cut the prompt short. */
static bool read_prompt_lines(const char *path, char ***lines, size_t *n_lines) {
    *lines = NULL;
    *n_lines = 0;
    FILE *f = cli_open_regular("--prompt-file", path);
    if (!f) return false;
    char *line = NULL;
    size_t line_capacity = 0, capacity = 0;
    ssize_t got;
    size_t line_number = 0;
    bool ok = true;
    while ((got = getline(&line, &line_capacity, f)) >= 0) {
        line_number++;
        const char *nul = memchr(line, '\0', (size_t)got);
        if (nul) {
            fprintf(stderr, "kite: --prompt-file: %s line %zu has a NUL byte (at byte %zu of the line)\n", path,
                    line_number, (size_t)(nul - line) + 1);
            ok = false;
            break;
        }
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (got == 0) continue;
        if (*n_lines == capacity) {
            capacity = capacity ? capacity * 2 : 16;
            char **grown = realloc(*lines, capacity * sizeof(char *));
            if (!grown) {
                fprintf(stderr, "kite: --prompt-file: out of memory reading %s\n", path);
                ok = false;
                break;
            }
            *lines = grown;
        }
        (*lines)[*n_lines] = strdup(line);
        if (!(*lines)[*n_lines]) {
            fprintf(stderr, "kite: --prompt-file: out of memory reading %s\n", path);
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
    if (!ok) {
        for (size_t i = 0; i < *n_lines; i++) free((*lines)[i]);
        free(*lines);
        *lines = NULL;
        *n_lines = 0;
    }
    return ok;
}

int cmd_run(int argc, char **argv) {
    const char *model_dir = NULL, *dummy = NULL, *prompt_text = NULL, *prompt_ids_text = NULL, *prompt_file = NULL;
    kite_load_params load = kite_load_params_default();
    kite_engine_params engine_params = kite_engine_params_default();
    kite_request request = kite_request_default();
    request.max_tokens = 256;
    request.sampling.fresh_seed = true; /* until --seed gives one */
    const char *stops[MAX_STOP_STRINGS];
    int32_t n_stops = 0;
    kite_logit_bias biases[KITE_MAX_LOGIT_BIAS];
    int32_t n_biases = 0;
    bool json = false;
    cli_parser parser;
    cli_parser_init(&parser, &run_command, argc, argv);
    for (int id; (id = cli_parser_next(&parser)) != CLI_END;) {
        long long iv;
        double fv;
        switch (id) {
        case CLI_HELP: return 0;
        case CLI_ERROR: return 2;
        case RUN_MODEL: model_dir = parser.value; break;
        case RUN_DUMMY: dummy = parser.value; break;
        case RUN_PROMPT: prompt_text = parser.value; break;
        case RUN_PROMPT_IDS: prompt_ids_text = parser.value; break;
        case RUN_PROMPT_FILE: prompt_file = parser.value; break;
        case RUN_JSON: json = true; break;
        case RUN_IGNORE_EOS: request.ignore_eos = true; break;
        case RUN_MAX_TOKENS:
            if (!cli_value_int(&parser, 0, INT32_MAX, &iv)) return 2;
            request.max_tokens = (int32_t)iv;
            break;
        case RUN_SEED:
            if (!cli_value_int(&parser, 0, INT64_MAX, &iv)) return 2;
            request.sampling.seed = (uint64_t)iv;
            request.sampling.fresh_seed = false;
            break;
        case RUN_REPETITION_PENALTY:
            if (!cli_value_float(&parser, 0.01, 100.0, &fv)) return 2; /* as --repeat-penalty */
            request.sampling.repetition_penalty = (float)fv;
            break;
        case RUN_PRESENCE_PENALTY:
            if (!cli_value_float(&parser, -2.0, 2.0, &fv)) return 2;
            request.sampling.presence_penalty = (float)fv;
            break;
        case RUN_FREQUENCY_PENALTY:
            if (!cli_value_float(&parser, -2.0, 2.0, &fv)) return 2;
            request.sampling.frequency_penalty = (float)fv;
            break;
        case RUN_MIN_TOKENS:
            if (!cli_value_int(&parser, 0, INT32_MAX, &iv)) return 2;
            request.min_tokens = (int32_t)iv;
            break;
        case RUN_LOGIT_BIAS:
            if (n_biases == KITE_MAX_LOGIT_BIAS) {
                fprintf(stderr, "kite: at most %d --logit-bias entries\n", KITE_MAX_LOGIT_BIAS);
                return 2;
            }
            if (!parse_logit_bias(parser.value, &biases[n_biases])) return 2;
            n_biases++;
            break;
        case RUN_STOP:
            if (n_stops == MAX_STOP_STRINGS) {
                fprintf(stderr, "kite: at most %d --stop strings\n", MAX_STOP_STRINGS);
                return 2;
            }
            if (!parser.value[0]) {
                fprintf(stderr, "kite: --stop: the string is empty\n");
                return 2;
            }
            stops[n_stops++] = parser.value;
            break;
        case RUN_LOGPROBS:
            if (!cli_value_int(&parser, 0, KITE_MAX_LOGPROBS, &iv)) return 2;
            request.n_logprobs = (int32_t)iv;
            break;
        default:
            if (cli_take_sampling_option(&parser, &request.sampling) == CLI_OPTION_TAKEN) break;
            if (cli_take_engine_option(&parser, &load, &engine_params) == CLI_OPTION_TAKEN) break;
            return 2; /* a shared option whose value did not parse (said on stderr) */
        }
    }
    if (parser.first_argument < argc) {
        fprintf(stderr, "kite run: unexpected argument '%s' (quote the prompt after --prompt)\n",
                argv[parser.first_argument]);
        cli_print_usage(&run_command, stderr);
        return 2;
    }
    if ((model_dir != NULL) == (dummy != NULL)) {
        fprintf(stderr, "kite run: give exactly one of --model DIR or --dummy SHAPE\n");
        cli_print_usage(&run_command, stderr);
        return 2;
    }
    if ((prompt_text != NULL) + (prompt_ids_text != NULL) + (prompt_file != NULL) != 1) {
        fprintf(stderr, "kite run: give exactly one of --prompt, --prompt-ids, --prompt-file\n");
        cli_print_usage(&run_command, stderr);
        return 2;
    }
    request.stop_strings = stops;
    request.n_stop_strings = n_stops;
    request.logit_bias = biases;
    request.n_logit_bias = n_biases;

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
    cli_load_report load_report;
    cli_load_report_attach(&load_report, &load);
    status = model_dir ? kite_model_load(model_dir, &load, &model) : kite_model_load_dummy(dummy, 0, &load, &model);
    if (status != KITE_OK) {
        exit_code = cli_report(model_dir ? model_dir : dummy, status);
        goto done;
    }
    status = kite_engine_create(model, &engine_params, &engine);
    /* After the engine too: a run refused at its start says one line, the reason. */
    if (status == KITE_OK) cli_load_report_finish(&load_report);
    if (status != KITE_OK) {
        exit_code = cli_report("engine", status);
        goto done;
    }
    double load_s = seconds_now() - load_start;
    {
        kite_engine_stats stats = kite_engine_get_stats(engine);
        fprintf(stderr,
                "kite: %s backend; %s KV cache %zu tokens (%d blocks of %d), %d sequences of the full %d-token context\n",
                kite_model_get_info(model).backend_name, load.kv_cache_dtype == KITE_KV_CACHE_FP8 ? "fp8" : "bf16",
                stats.kv_capacity_tokens, stats.kv_blocks_total, stats.kv_block_size, stats.max_concurrent_full,
                stats.max_context);
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
            /* a prompt past the context limit was refused at submit; this one outgrew the whole KV cache */
            fprintf(stderr, "kite: prompt %zu (%zu tokens) does not fit in the KV cache (%zu tokens; --kv-cache-mb)\n",
                    p + 1, g->n_prompt, kite_engine_get_stats(engine).kv_capacity_tokens);
            exit_code = 1;
        }
        if (g->finish == KITE_FINISH_ERROR) { /* the prompt's logits allowed no token; the other prompts went on */
            fprintf(stderr, "kite: prompt %zu: %s\n", p + 1, g->error);
            exit_code = 1;
        }
        if (json) {
            if (g->stream && g->text.length > 0) fputc('\n', stdout);
            if (!print_json(g, load_s, &timings)) {
                fprintf(stderr, "kite: cannot write the output\n");
                exit_code = 1;
                goto done;
            }
        } else if (prompt_file) {
            if (p) fputc('\n', stdout);
            fwrite(g->text.data ? g->text.data : "", 1, g->text.length, stdout);
            fputc('\n', stdout);
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
            text_buffer_free(&gens[p].text);
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

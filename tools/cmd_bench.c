/* kite bench: prefill (pp N) and decode (tg N, B sequences, after a context of --depth tokens) throughput,
 * like llama-bench, each row gated by a check against the float32 CPU backend on the same weights.
 *
 * A front end over kite.h's benchmark (kite_bench_run), which times the rows through the engine's own step path;
 * this file parses the options and prints the rows, as a markdown table or as JSON lines. The method is
 * described in docs/BENCHMARKS.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "kite.h"
#include "text_buffer.h"

enum { OPT_MODEL = 1, OPT_DUMMY, OPT_PREFILL, OPT_DECODE, OPT_BATCH, OPT_DEPTH, OPT_REPS, OPT_OUTPUT, OPT_SEED };

static const cli_option bench_options_table[] = {
    {OPT_MODEL, "model", 'm', "DIR", "a checkpoint directory", false},
    {OPT_DUMMY, "dummy", 0, "SHAPE", "random weights of a named shape (qwen3-0.6b-base, ...), no files", false},
    {OPT_PREFILL, NULL, 'p', "N,N,...", "prefill rows: pp N (default 256,2048; 0: none)", false},
    {OPT_DECODE, NULL, 'n', "N,N,...", "decode rows: tg N (default 128; 0: none)", false},
    {OPT_BATCH, NULL, 'b', "B,B,...",
     "sequences per row: pp rows prefill B prompts of N tokens (at most 8192 tokens per\nstep), tg rows decode "
     "B sequences together (default 1)",
     false},
    {OPT_DEPTH, "depth", 'd', "D,D,...", "context already in the cache before the tg rows (default 256)", false},
    {OPT_REPS, NULL, 'r', "R", "repetitions per row; the median is reported (default 5)", false},
    {CLI_ID_BACKEND, "backend", 0, "auto|cpu|cuda", "where the model runs (default auto)", false},
    {CLI_ID_THREADS, "threads", 0, "N", "CPU threads (default 0 = all cores)", false},
    CLI_WEIGHTS_OPTION,
    CLI_KV_CACHE_DTYPE_OPTION,
    CLI_WEIGHT_CACHE_OPTION,
    CLI_CONTEXT_OPTIONS,
    CLI_PREFIX_CACHE_OPTION,
    {OPT_OUTPUT, NULL, 'o', "md|jsonl", "output format (default md)", false},
    {OPT_SEED, "seed", 0, "S", "seed of the dummy weights and the random prompts (default 0)", false},
    CLI_SAMPLING_OPTIONS,
};

static const cli_command bench_command = {
    "bench", "(--model DIR | --dummy SHAPE) [options]",
    "Every row is first checked against the CPU backend (docs/BENCHMARKS.md); a failed check prints FAILED.\n"
    "With --temperature T > 0 the tg rows sample each token as the engine does (rows reduced to their best\n"
    "candidates by the backend where top-k allows, else full logits rows read back); default: greedy.",
    bench_options_table, sizeof bench_options_table / sizeof bench_options_table[0]};

typedef struct bench_options {
    const char *model_dir, *dummy;
    int32_t *prefill, *decode, *batch, *depth;
    size_t n_prefill, n_decode, n_batch, n_depth;
    int reps;
    bool jsonl;
    uint64_t seed;
    kite_load_params load;
    kite_engine_params engine; /* of the shared engine options, the bench takes --no-prefix-cache */
    kite_sampling sampling; /* tg rows sample on the host when temperature > 0; the seed is the bench's */
} bench_options;

/* What the row callback prints with. */
typedef struct bench_printer {
    const bench_options *options;
    kite_bench_info info;
    bool any_failed;
} bench_printer;

static void print_header(const bench_options *o, const kite_bench_info *info) {
    printf("kite %s (%s), model %s, backend %s on %s, %s weights, %s KV cache, %d repetitions, median\n",
           kite_version(), info->commit, o->dummy ? o->dummy : o->model_dir, info->backend_name, info->device_name,
           o->load.weights == KITE_WEIGHTS_FP8 ? "fp8" : "bf16",
           o->load.kv_cache_dtype == KITE_KV_CACHE_FP8 ? "fp8" : "bf16", o->reps);
    if (info->decode_path) printf("decode: %s\n", info->decode_path);
    if (!info->sampled)
        printf("greedy tg rows: %s\n", info->greedy_overlapped
                                           ? "overlapped (each step enqueued before the previous step's ids are "
                                             "read, as the engine runs them; KITE_ENGINE_OVERLAP=0: serial)"
                                           : "serial (each step waits for the previous step's ids)");
    else
        printf("tg rows sample on the host: temperature %g, top-k %d, top-p %g, min-p %g, repeat penalty %g "
               "(rows reduced on the backend where top-k allows, else full logits rows read back)\n",
               o->sampling.temperature, o->sampling.top_k, o->sampling.top_p, o->sampling.min_p,
               o->sampling.repetition_penalty);
    printf("\n");
    printf("| test     |   B |  depth |        tok/s | min-max tok/s     |   ms/step | floor | gate |\n");
    printf("|----------|-----|--------|--------------|-------------------|-----------|-------|------|\n");
}

static void print_json_row(const bench_options *o, const kite_bench_info *info, const kite_bench_row *row) {
    const char *model = o->dummy ? o->dummy : o->model_dir;
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    text_buffer b = {0};
    text_buffer_printf(&b, "{\"test\":\"%s\",\"batch\":%d,\"depth\":%d,\"model\":", row->test, row->batch, row->depth);
    text_buffer_json_string(&b, model, strlen(model));
    if (o->load.rope_scaling) { /* the rows ran with this rope scaling in place of config.json's */
        text_buffer_puts(&b, ",\"rope_scaling\":");
        text_buffer_json_string(&b, o->load.rope_scaling, strlen(o->load.rope_scaling));
    }
    text_buffer_printf(&b, ",\"backend\":\"%s\",\"weights\":\"%s\",\"kv_cache_dtype\":\"%s\",\"gpu\":",
                       info->backend_name, o->load.weights == KITE_WEIGHTS_FP8 ? "fp8" : "bf16",
                       o->load.kv_cache_dtype == KITE_KV_CACHE_FP8 ? "fp8" : "bf16");
    text_buffer_json_string(&b, info->device_name, strlen(info->device_name));
    if (row->gate_passed) {
        text_buffer_puts(&b, ",\"tok_s\":");
        text_buffer_json_fixed(&b, row->tok_s, 1);
        text_buffer_puts(&b, ",\"tok_s_min\":");
        text_buffer_json_fixed(&b, row->tok_s_min, 1);
        text_buffer_puts(&b, ",\"tok_s_max\":");
        text_buffer_json_fixed(&b, row->tok_s_max, 1);
        text_buffer_puts(&b, ",\"ms_per_step\":");
        text_buffer_json_fixed(&b, row->ms_per_step, 4);
    } else {
        text_buffer_puts(&b, ",\"tok_s\":null");
    }
    if (row->hbm_floor_fraction > 0 && row->gate_passed) {
        text_buffer_puts(&b, ",\"hbm_floor_fraction\":");
        text_buffer_json_fixed(&b, row->hbm_floor_fraction, 3);
    }
    if (info->decode_path && row->is_decode) { /* which decode code the row timed */
        text_buffer_puts(&b, ",\"decode_path\":");
        text_buffer_json_string(&b, info->decode_path, strlen(info->decode_path));
    }
    if (row->is_decode) /* each step enqueued before the previous one's ids are read (engine.c) */
        text_buffer_printf(&b, ",\"overlapped\":%s", row->overlapped ? "true" : "false");
    if (info->sampled && row->is_decode) {
        text_buffer_puts(&b, ",\"sampling\":{\"temperature\":");
        text_buffer_json_general(&b, o->sampling.temperature, 6);
        text_buffer_printf(&b, ",\"top_k\":%d,\"top_p\":", o->sampling.top_k);
        text_buffer_json_general(&b, o->sampling.top_p, 6);
        text_buffer_puts(&b, ",\"min_p\":");
        text_buffer_json_general(&b, o->sampling.min_p, 6);
        text_buffer_puts(&b, ",\"repetition_penalty\":");
        text_buffer_json_general(&b, o->sampling.repetition_penalty, 6);
        text_buffer_puts(&b, "}");
    }
    text_buffer_printf(&b, ",\"gate\":\"%s\",\"gate_rel_l2\":", !info->gated ? "oracle" : row->gate_passed ? "pass" : "FAILED");
    text_buffer_json_general(&b, row->gate_rel_l2, 3);
    text_buffer_puts(&b, ",\"gate_bf16_budget\":");
    text_buffer_json_general(&b, row->gate_bf16_budget, 3);
    text_buffer_printf(&b, ",\"gate_near_ties\":%d,\"reps\":%d,\"commit\":", row->gate_near_ties, o->reps);
    text_buffer_json_string(&b, info->commit, strlen(info->commit));
    text_buffer_printf(&b, ",\"date\":\"%s\"}\n", date);
    if (!text_buffer_write(&b, stdout)) fprintf(stderr, "kite bench: out of memory writing a row\n");
    text_buffer_free(&b);
}

static void print_md_row(const kite_bench_info *info, const kite_bench_row *row) {
    if (!row->gate_passed) {
        printf("| %-8s | %3d | %6d | FAILED: %s |\n", row->test, row->batch, row->depth, row->gate_why);
        return;
    }
    char spread[64];
    snprintf(spread, sizeof spread, "%.0f-%.0f", row->tok_s_min, row->tok_s_max);
    char floor_text[32] = "";
    if (row->hbm_floor_fraction > 0) snprintf(floor_text, sizeof floor_text, "%.0f%%", row->hbm_floor_fraction * 100);
    char gate_text[64];
    if (info->gated)
        snprintf(gate_text, sizeof gate_text, "pass (L2 %.1e, bf16 %.1e)", row->gate_rel_l2, row->gate_bf16_budget);
    else
        snprintf(gate_text, sizeof gate_text, "oracle");
    printf("| %-8s | %3d | %6d | %12.1f | %-17s | %9.4f | %5s | %s |\n", row->test, row->batch, row->depth, row->tok_s,
           spread, row->ms_per_step, floor_text, gate_text);
}

static void print_row(const kite_bench_row *row, void *user_data) {
    bench_printer *p = user_data;
    if (p->options->jsonl)
        print_json_row(p->options, &p->info, row);
    else
        print_md_row(&p->info, row);
    p->any_failed |= !row->gate_passed;
    fflush(stdout);
}

static int run_bench(const bench_options *o) {
    kite_model *model = NULL;
    cli_load_report load_report;
    kite_load_params load = o->load;
    cli_load_report_attach(&load_report, &load);
    kite_status status = o->dummy ? kite_model_load_dummy(o->dummy, o->seed, &load, &model)
                                  : kite_model_load(o->model_dir, &load, &model);
    if (status != KITE_OK) return cli_report("load", status);
    cli_load_report_finish(&load_report);
    kite_bench_params params = kite_bench_params_default();
    params.prefill = o->prefill;
    params.n_prefill = o->n_prefill;
    params.decode = o->decode;
    params.n_decode = o->n_decode;
    params.batch = o->batch;
    params.n_batch = o->n_batch;
    params.depth = o->depth;
    params.n_depth = o->n_depth;
    params.repetitions = o->reps;
    params.seed = o->seed;
    params.sampling = o->sampling;
    params.prefix_cache = o->engine.prefix_cache;
    bench_printer printer = {.options = o};
    status = kite_bench_describe(model, &params, &printer.info);
    if (status != KITE_OK) {
        kite_model_free(model);
        return cli_report("bench", status);
    }
    if (!o->jsonl) print_header(o, &printer.info);
    status = kite_bench_run(model, &params, print_row, &printer);
    kite_model_free(model);
    if (status != KITE_OK) return cli_report("bench", status);
    return printer.any_failed ? 1 : 0; /* every row was tried; a failed gate still fails the run */
}

/* A list option's value: "0" means no rows of that kind (-p 0, -n 0). */
static bool take_list(const cli_parser *p, bool zero_means_none, long long min, long long max, int32_t **out,
                      size_t *n) {
    free(*out);
    *out = NULL;
    *n = 0;
    if (zero_means_none && strcmp(p->value, "0") == 0) return true;
    return cli_value_int_list(p, min, max, out, n);
}

int cmd_bench(int argc, char **argv) {
    bench_options o = {.reps = 5, .load = kite_load_params_default(), .engine = kite_engine_params_default(),
                       .sampling = kite_sampling_default()};
    static const int32_t default_prefill[] = {256, 2048}, default_decode[] = {128}, default_batch[] = {1},
                         default_depth[] = {256};
    bool have_prefill = false, have_decode = false, have_batch = false, have_depth = false, ok = true;
    static const char *const formats[] = {"md", "jsonl", NULL};
    cli_parser p;
    cli_parser_init(&p, &bench_command, argc, argv);
    for (int id; ok && (id = cli_parser_next(&p)) != CLI_END;) {
        long long value;
        int choice;
        switch (id) {
        case CLI_HELP: return 0;
        case CLI_ERROR: ok = false; break;
        case OPT_MODEL: o.model_dir = p.value; break;
        case OPT_DUMMY: o.dummy = p.value; break;
        case OPT_PREFILL: ok = take_list(&p, true, 1, 1 << 20, &o.prefill, &o.n_prefill), have_prefill = true; break;
        case OPT_DECODE: ok = take_list(&p, true, 1, 1 << 20, &o.decode, &o.n_decode), have_decode = true; break;
        case OPT_BATCH: ok = take_list(&p, false, 1, KITE_BENCH_MAX_BATCH, &o.batch, &o.n_batch), have_batch = true; break;
        case OPT_DEPTH: ok = take_list(&p, false, 0, 1 << 20, &o.depth, &o.n_depth), have_depth = true; break;
        case OPT_REPS:
            ok = cli_value_int(&p, 1, 1000, &value);
            o.reps = (int)value;
            break;
        case OPT_OUTPUT:
            ok = cli_value_choice(&p, formats, &choice);
            o.jsonl = choice == 1;
            break;
        case OPT_SEED:
            ok = cli_value_int(&p, 0, INT64_MAX, &value);
            o.seed = (uint64_t)value;
            break;
        default:
            if (cli_take_engine_option(&p, &o.load, &o.engine) == CLI_OPTION_TAKEN) break;
            ok = cli_take_sampling_option(&p, &o.sampling) == CLI_OPTION_TAKEN;
            break;
        }
    }
    if (ok && p.first_argument < argc) {
        fprintf(stderr, "kite bench: unexpected argument '%s'\n", argv[p.first_argument]);
        ok = false;
    }
    if (ok && (o.model_dir != NULL) == (o.dummy != NULL)) {
        fprintf(stderr, "kite bench: give exactly one of --model DIR or --dummy SHAPE\n");
        cli_print_usage(&bench_command, stderr);
        ok = false;
    }
    /* The defaults are copied so that every list is the caller's to free. */
    struct {
        bool given;
        const int32_t *values;
        size_t n;
        int32_t **out;
        size_t *n_out;
    } defaults[] = {{have_prefill, default_prefill, 2, &o.prefill, &o.n_prefill},
                    {have_decode, default_decode, 1, &o.decode, &o.n_decode},
                    {have_batch, default_batch, 1, &o.batch, &o.n_batch},
                    {have_depth, default_depth, 1, &o.depth, &o.n_depth}};
    for (size_t i = 0; ok && i < sizeof defaults / sizeof defaults[0]; i++) {
        if (defaults[i].given) continue;
        *defaults[i].out = malloc(defaults[i].n * sizeof(int32_t));
        if (!*defaults[i].out) {
            fprintf(stderr, "kite bench: out of memory\n");
            ok = false;
            break;
        }
        memcpy(*defaults[i].out, defaults[i].values, defaults[i].n * sizeof(int32_t));
        *defaults[i].n_out = defaults[i].n;
    }
    o.sampling.seed = o.seed;
    const int exit_code = ok ? run_bench(&o) : 2;
    free(o.prefill);
    free(o.decode);
    free(o.batch);
    free(o.depth);
    return exit_code;
}

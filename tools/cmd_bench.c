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

#include "cli_util.h"
#include "commands.h"
#include "kite.h"

static const char bench_usage[] =
    "usage: kite bench (--model DIR | --dummy SHAPE) [options]\n"
    "  -p N,N,...        prefill rows: pp N (default 256,2048)\n"
    "  -n N,N,...        decode rows: tg N (default 128)\n"
    "  -b B,B,...        sequences per row: pp rows prefill B prompts of N tokens (at most 8192 tokens per\n"
    "                    forward), tg rows decode B sequences together (default 1)\n"
    "  --depth D,D,...   context already in the cache before the tg rows (default 256)\n"
    "  -r R              repetitions per row; the median is reported (default 5)\n"
    "  --backend auto|cpu|cuda   (default auto)   --threads N (CPU threads)\n"
    "  -o md|jsonl       output format (default md)\n"
    "  --seed S          seed of the dummy weights and the random prompts (default 0)\n"
    "  --temperature T   tg rows sample each token on the host as the engine does for T > 0 (rows reduced to\n"
    "                    their best candidates by the backend where top-k allows, else full logits rows read\n"
    "                    back; one sampler per sequence, rows in parallel); default 0: greedy on the device\n"
    "  --top-k K  --top-p P  --min-p P  --repeat-penalty R   the sampled rows' filters, as kite run's\n"
    "Every row is first checked against the CPU backend (docs/BENCHMARKS.md); a failed check prints FAILED.\n";

typedef struct bench_options {
    const char *model_dir, *dummy;
    int32_t *prefill, *decode, *batch, *depth;
    size_t n_prefill, n_decode, n_batch, n_depth;
    int reps;
    bool jsonl;
    uint64_t seed;
    kite_load_params load;
    kite_sampling sampling; /* tg rows sample on the host when temperature > 0; the seed is the bench's */
} bench_options;

/* What the row callback prints with. */
typedef struct bench_printer {
    const bench_options *options;
    kite_bench_info info;
    bool any_failed;
} bench_printer;

static void print_header(const bench_options *o, const kite_bench_info *info) {
    printf("kite %s (%s), model %s, backend %s on %s, %d repetitions, median\n", kite_version(), info->commit,
           o->dummy ? o->dummy : o->model_dir, info->backend_name, info->device_name, o->reps);
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
    printf("{\"test\":\"%s\",\"batch\":%d,\"depth\":%d,\"model\":", row->test, row->batch, row->depth);
    json_write_string(stdout, model, strlen(model));
    printf(",\"backend\":\"%s\",\"gpu\":", info->backend_name);
    json_write_string(stdout, info->device_name, strlen(info->device_name));
    if (row->gate_passed)
        printf(",\"tok_s\":%.1f,\"tok_s_min\":%.1f,\"tok_s_max\":%.1f,\"ms_per_step\":%.4f", row->tok_s, row->tok_s_min,
               row->tok_s_max, row->ms_per_step);
    else
        printf(",\"tok_s\":null");
    if (row->hbm_floor_fraction > 0 && row->gate_passed)
        printf(",\"hbm_floor_fraction\":%.3f", row->hbm_floor_fraction);
    if (info->decode_path && row->is_decode) { /* which decode code the row timed */
        printf(",\"decode_path\":");
        json_write_string(stdout, info->decode_path, strlen(info->decode_path));
    }
    if (row->is_decode) /* each step enqueued before the previous one's ids are read (engine.c) */
        printf(",\"overlapped\":%s", row->overlapped ? "true" : "false");
    if (info->sampled && row->is_decode)
        printf(",\"sampling\":{\"temperature\":%g,\"top_k\":%d,\"top_p\":%g,\"min_p\":%g,\"repetition_penalty\":%g}",
               o->sampling.temperature, o->sampling.top_k, o->sampling.top_p, o->sampling.min_p,
               o->sampling.repetition_penalty);
    printf(",\"gate\":\"%s\",\"gate_rel_l2\":%.3g,\"gate_bf16_budget\":%.3g,\"gate_near_ties\":%d,\"reps\":%d,"
           "\"commit\":\"%s\",\"date\":\"%s\"}\n",
           !info->gated       ? "oracle"
           : row->gate_passed ? "pass"
                              : "FAILED",
           row->gate_rel_l2, row->gate_bf16_budget, row->gate_near_ties, o->reps, info->commit, date);
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
    kite_status status = o->dummy ? kite_model_load_dummy(o->dummy, o->seed, &o->load, &model)
                                  : kite_model_load(o->model_dir, &o->load, &model);
    if (status != KITE_OK) return cli_report("load", status);
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

int cmd_bench(int argc, char **argv) {
    bench_options o = {.reps = 5, .load = kite_load_params_default(), .sampling = kite_sampling_default()};
    cli_option_result sampling_option;
    const char *prefill = "256,2048", *decode = "128", *batch = "1", *depth = "256";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        long long iv;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(bench_usage, stdout);
            return 0;
        } else if (!cli_take_value(argc, argv, &i, &v)) {
            return 2;
        } else if (strcmp(a, "--model") == 0 || strcmp(a, "-m") == 0) {
            o.model_dir = v;
        } else if (strcmp(a, "--dummy") == 0) {
            o.dummy = v;
        } else if (strcmp(a, "-p") == 0) {
            prefill = v;
        } else if (strcmp(a, "-n") == 0) {
            decode = v;
        } else if (strcmp(a, "-b") == 0) {
            batch = v;
        } else if (strcmp(a, "--depth") == 0 || strcmp(a, "-d") == 0) {
            depth = v;
        } else if (strcmp(a, "-r") == 0) {
            if (!cli_parse_int(a, v, 1, 1000, &iv)) return 2;
            o.reps = (int)iv;
        } else if (strcmp(a, "--backend") == 0) {
            if (!cli_parse_backend(v, &o.load.backend)) return 2;
        } else if (strcmp(a, "--threads") == 0) {
            if (!cli_parse_int(a, v, 0, 4096, &iv)) return 2;
            o.load.n_threads = (int32_t)iv;
        } else if (strcmp(a, "-o") == 0) {
            if (strcmp(v, "md") != 0 && strcmp(v, "jsonl") != 0) {
                fprintf(stderr, "kite bench: -o must be md or jsonl\n");
                return 2;
            }
            o.jsonl = strcmp(v, "jsonl") == 0;
        } else if (strcmp(a, "--seed") == 0) {
            if (!cli_parse_int(a, v, 0, INT64_MAX, &iv)) return 2;
            o.seed = (uint64_t)iv;
        } else if ((sampling_option = cli_parse_sampling_option(a, v, &o.sampling)) != CLI_OPTION_OTHER) {
            if (sampling_option == CLI_OPTION_BAD) return 2;
        } else {
            fprintf(stderr, "kite bench: unknown option '%s'\n%s", a, bench_usage);
            return 2;
        }
    }
    if ((o.model_dir != NULL) == (o.dummy != NULL)) {
        fprintf(stderr, "kite bench: give exactly one of --model DIR or --dummy SHAPE\n%s", bench_usage);
        return 2;
    }
    o.sampling.seed = o.seed;
    int exit_code = 2;
    bool ok = true;
    if (strcmp(prefill, "0") != 0) ok = cli_parse_int_list("-p", prefill, 1, 1 << 20, &o.prefill, &o.n_prefill);
    if (ok && strcmp(decode, "0") != 0) ok = cli_parse_int_list("-n", decode, 1, 1 << 20, &o.decode, &o.n_decode);
    if (ok) ok = cli_parse_int_list("-b", batch, 1, KITE_BENCH_MAX_BATCH, &o.batch, &o.n_batch);
    if (ok) ok = cli_parse_int_list("--depth", depth, 0, 1 << 20, &o.depth, &o.n_depth);
    if (ok) exit_code = run_bench(&o);
    free(o.prefill);
    free(o.decode);
    free(o.batch);
    free(o.depth);
    return exit_code;
}

/* What the CLI subcommands share beyond option parsing (cli_options.h): the engine and sampling options of
 * `kite run`, `kite serve` and `kite bench`, and reporting a failed kite call. */
#ifndef KITE_TOOLS_CLI_UTIL_H
#define KITE_TOOLS_CLI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli_options.h"
#include "kite.h"

/* Ids of the shared options; a command's own ids stay below CLI_SHARED_ID_FIRST. */
enum {
    CLI_SHARED_ID_FIRST = 1000,
    CLI_ID_BACKEND = CLI_SHARED_ID_FIRST,
    CLI_ID_THREADS,
    CLI_ID_KV_CACHE_MB,
    CLI_ID_MAX_BATCH,
    CLI_ID_MAX_STEP_TOKENS,
    CLI_ID_MAX_CONTEXT,
    CLI_ID_ROPE_SCALING,
    CLI_ID_TEMPERATURE,
    CLI_ID_TOP_K,
    CLI_ID_TOP_P,
    CLI_ID_MIN_P,
    CLI_ID_REPEAT_PENALTY,
    CLI_ID_WEIGHTS,
    CLI_ID_NO_PREFIX_CACHE,
    CLI_ID_WEIGHT_CACHE,
    CLI_ID_KV_CACHE_DTYPE,
};

/* The row of --no-prefix-cache (`kite run`, `kite chat`, `kite serve`, `kite bench`). */
#define CLI_PREFIX_CACHE_OPTION                                                                                \
    {CLI_ID_NO_PREFIX_CACHE, "no-prefix-cache", 0, NULL,                                                     \
     "turn off automatic prefix caching (default on: full KV blocks of earlier requests\nare reused by "       \
     "requests that begin with the same tokens; the tokens are the same either way)", false}

#define CLI_WEIGHTS_OPTION                                                                                     \
    {CLI_ID_WEIGHTS, "weights", 0, "bf16|fp8",                                                                 \
     "linear layers' weights: bf16 as stored (FP8 checkpoints dequantized), or fp8 with 128x128 block scales " \
     "(default bf16)",                                                                                         \
     false}
#define CLI_KV_CACHE_DTYPE_OPTION                                                                              \
    {CLI_ID_KV_CACHE_DTYPE, "kv-cache-dtype", 0, "bf16|fp8",                                                   \
     "the KV cache's keys and values: bf16 (the CPU backend: float32), or fp8 E4M3 with one\nscale per token "  \
     "and KV head (about half the bytes; default bf16)",                                                      \
     false}
#define CLI_WEIGHT_CACHE_OPTION                                                                                \
    {CLI_ID_WEIGHT_CACHE, "weight-cache", 0, "DIR|off",                                                        \
     "the cache of converted weights (default $XDG_CACHE_HOME/kite,\nelse ~/.cache/kite; off: none)", false}
/* Table rows for the context limit and RoPE scaling of a model (`kite run`, `kite chat`, `kite serve`, `kite bench`). */
#define CLI_CONTEXT_OPTIONS                                                                                    \
    {CLI_ID_MAX_CONTEXT, "max-context", 0, "N",                                                              \
     "lower the context limit (default: the model's, YaRN's factor x\noriginal_max_position_embeddings or "      \
     "max_position_embeddings)", false},                                                                     \
    {CLI_ID_ROPE_SCALING, "rope-scaling", 0, "JSON",                                                         \
     "replace config.json's rope scaling, e.g. '{\"rope_type\":\"yarn\",\"factor\":4.0,\n"                   \
     "\"original_max_position_embeddings\":32768}' (131072 positions for Qwen3)", false}

/* Table rows for the options of loading a model and creating an engine (`kite run`, `kite serve`). */
#define CLI_ENGINE_OPTIONS                                                                                     \
    {CLI_ID_BACKEND, "backend", 0, "auto|cpu|cuda", "where the model runs (default auto: CUDA when usable)", false}, \
    {CLI_ID_THREADS, "threads", 't', "N", "CPU threads (default 0 = all cores)", false},                        \
    CLI_WEIGHTS_OPTION,                                                                                        \
    CLI_WEIGHT_CACHE_OPTION,                                                                                   \
    CLI_CONTEXT_OPTIONS,                                                                                       \
    CLI_KV_CACHE_DTYPE_OPTION,                                                                                 \
    {CLI_ID_KV_CACHE_MB, "kv-cache-mb", 0, "N",                                                              \
     "KV cache budget in MiB (default: 90% of free GPU memory; CPU: 4 full contexts)", false},                \
    {CLI_ID_MAX_BATCH, "max-batch", 0, "N", "sequences per step at most (default 256)", false},                 \
    {CLI_ID_MAX_STEP_TOKENS, "max-step-tokens", 0, "N",                                                      \
     "tokens per step at most, the chunked-prefill budget (default 2048)", false},                           \
    CLI_PREFIX_CACHE_OPTION

/* Table rows for the sampling options (`kite run`, `kite bench`; not --seed, which means the prompts' seed to
 * the bench). */
#define CLI_SAMPLING_OPTIONS                                                                                   \
    {CLI_ID_TEMPERATURE, "temperature", 0, "T", "0 = greedy (default 0)", false},                             \
    {CLI_ID_TOP_K, "top-k", 0, "K", "sample from the K most likely tokens (default 0 = off)", false},           \
    {CLI_ID_TOP_P, "top-p", 0, "P", "sample from the smallest set of probability P (default 1 = off)", false}, \
    {CLI_ID_MIN_P, "min-p", 0, "P", "drop tokens below P times the best one's probability (default 0 = off)", \
     false},                                                                                                   \
    {CLI_ID_REPEAT_PENALTY, "repeat-penalty", 0, "R",                                                         \
     "discourage tokens already in the prompt or output (default 1 = off)", false}

typedef enum cli_option_result { CLI_OPTION_OTHER, CLI_OPTION_TAKEN, CLI_OPTION_BAD } cli_option_result;

/* Applies the option the parser just returned when it is one of CLI_ENGINE_OPTIONS / CLI_SAMPLING_OPTIONS:
 * CLI_OPTION_TAKEN when its value parsed, CLI_OPTION_BAD after a message when it did not (exit 2),
 * CLI_OPTION_OTHER when the option is another one. */
cli_option_result cli_take_engine_option(const cli_parser *p, kite_load_params *load, kite_engine_params *engine);
cli_option_result cli_take_sampling_option(const cli_parser *p, kite_sampling *sampling);

/* Parses --weights bf16|fp8. */
bool cli_parse_weights(const char *text, kite_weights *out);

/* Parses --backend auto|cpu|cuda. */
bool cli_parse_backend(const char *text, kite_backend_kind *out);

/* Opens PATH for reading as kite's library does: without blocking (a FIFO would wait for a writer forever),
 * then refuses anything but a regular file ("kite: WHAT: PATH is not a regular file (a FIFO)"). NULL after
 * one line on stderr. */
FILE *cli_open_regular(const char *what, const char *path);

/* Reads a whole file (PATH "-": standard input) into a malloc'd NUL-terminated buffer; false after one line on
 * stderr ("kite: WHAT: cannot open PATH: ...") when it cannot be read or is larger than max_bytes. */
bool cli_read_file(const char *what, const char *path, size_t max_bytes, char **text, size_t *length);

/* A model load's progress on stderr (kite_load_params.on_load_event): on a terminal a live line (bytes done,
 * GB/s, time left) while a stage runs; on any stderr, when the load is done, one summary line saying where the
 * weights came from (the checkpoint or the weight cache), how many bytes at what rate, and the cache fill.
 * Notices (an entry rebuilt, a folder that cannot be used) are printed as they come. The library has no stderr
 * channel of its own, so the CLI owns this printing. */
typedef struct cli_load_report {
    bool live;                   /* stderr is a terminal */
    bool line_open;              /* a live line is on screen, to be cleared before anything else */
    bool have_source, have_fill;
    kite_load_stage source_stage; /* KITE_LOAD_STAGE_CHECKPOINT or _CACHE_READ */
    uint64_t source_bytes, fill_bytes;
    double source_seconds, fill_seconds;
} cli_load_report;

/* Points load's callback at r (zeroing r). */
void cli_load_report_attach(cli_load_report *r, kite_load_params *load);
/* Prints the summary line of a finished load (nothing when no stage reported, as for a dummy model). */
void cli_load_report_finish(cli_load_report *r);

/* Reports a failed kite call: "kite: <what>: <message>" on stderr. Returns 1 (the exit code). */
int cli_report(const char *what, kite_status status);

#endif

/* The one registry of kite's runtime switches: environment variables a user may set to turn a path or a
 * feature off, for diagnosis, for an A/B or to save device memory.
 *
 * Every switch is declared once, in KITE_OPTIONS below (name, type, default, range, one line of doc). The
 * backend and the engine read them once, when they are created (options_read); a value that is not a number in
 * the switch's range is refused there with a message naming the switch and its range. `kite info --options`
 * lists every switch with its value and docs/OPTIONS.md is generated from the same table
 * (scripts/gen-options-doc.sh; tests/util/options_test.c checks the two agree).
 *
 * A switch stays only while a user has a reason to set it; a tuning constant that only a measurement needs
 * is a named constant in the code that uses it, with the reason for its value.
 */
#ifndef KITE_UTIL_OPTIONS_H
#define KITE_UTIL_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "kite.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(field, ENV_NAME, type, default, min, max, doc). type is BOOL (0 or 1) or INT. */
#define KITE_OPTIONS(X)                                                                                          \
    X(engine_overlap, "KITE_ENGINE_OVERLAP", BOOL, 1, 0, 1,                                                    \
      "greedy decode enqueues each step before the previous step's ids are read (0: every step waits)")        \
    X(engine_reduced_sampling, "KITE_ENGINE_REDUCED_SAMPLING", BOOL, 1, 0, 1,                                  \
      "sampled rows are reduced to their top-k candidates on the backend (0: whole logits rows are read back)") \
    X(cuda_graph, "KITE_CUDA_GRAPH", BOOL, 1, 0, 1,                                                            \
      "decode steps replay captured CUDA graphs (0: kernels are launched one by one, as a profiler sees them)") \
    X(cuda_pdl, "KITE_CUDA_PDL", BOOL, 1, 0, 1,                                                                \
      "decode kernels use programmatic dependent launch (0: each kernel waits for the previous one to end)")   \
    X(cuda_batch, "KITE_CUDA_BATCH", BOOL, 1, 0, 1,                                                            \
      "2-256 sequences decode through the batched path (0: through the prefill path)")                 \
    X(cuda_attention_cluster, "KITE_CUDA_ATTENTION_CLUSTER", BOOL, 1, 0, 1,                                    \
      "short contexts' decode attention runs in thread-block clusters (0: split-K attention at every depth)")  \
    X(cuda_lm_head_screen, "KITE_CUDA_LM_HEAD_SCREEN", BOOL, 1, 0, 1,                                          \
      "greedy single-stream decode screens the lm_head through an int8 copy (0: saves that copy's memory)")

typedef struct runtime_options {
#define KITE_OPTION_FIELD(field, name, type, def, lo, hi, doc) int32_t field;
    KITE_OPTIONS(KITE_OPTION_FIELD)
#undef KITE_OPTION_FIELD
} runtime_options;

/* Every switch at its default. */
runtime_options options_default(void);

/* Every switch from the environment (unset or empty: the default). KITE_ERROR_INVALID_ARGUMENT names the first
 * switch whose value is not an integer in its range. */
kite_status options_read(runtime_options *out);

#ifdef __cplusplus
}
#endif

#endif

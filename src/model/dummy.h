/* Random weights of a given shape, built in memory: `kite bench --dummy NAME` and GPU tests use them
 * instead of files. Values follow transformers' initialisation for Qwen3 (normal, std 0.02, for linear
 * and embedding weights; norm weights 1 + 0.1 N(0,1) so they are not all ones), stored as bf16.
 * The same config and seed give the same weights on every machine. */
#ifndef KITE_MODEL_DUMMY_H
#define KITE_MODEL_DUMMY_H

#include <stdint.h>

#include "kite.h"
#include "model/qwen3.h"

typedef struct dummy_model dummy_model;

kite_status dummy_model_create(const qwen3_config *config, uint64_t seed, dummy_model **out);
const qwen3_weights *dummy_model_weights(const dummy_model *model);
void dummy_model_free(dummy_model *model);

/* The config of a named shape ("qwen3-0.6b-base", ..., "tiny"), parsed from its embedded config.json. */
kite_status known_shape_config(const char *name, qwen3_config *out);
/* With rope_scaling (JSON text or NULL) replacing the shape's (qwen3_config_parse_overriding). */
kite_status known_shape_config_overriding(const char *name, const char *rope_scaling, qwen3_config *out);
/* The names known_shape_config() accepts, comma-separated, for messages. */
const char *known_shape_names(void);

#endif

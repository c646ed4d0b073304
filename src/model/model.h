/* What a kite_model handle holds: the config, the weights (mmapped checkpoint or random dummy weights),
 * the tokenizer, and the backend the weights were uploaded to. Internal to the library. */
#ifndef KITE_MODEL_MODEL_H
#define KITE_MODEL_MODEL_H

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "kite.h"
#include "model/dummy.h"
#include "model/qwen3.h"
#include "tokenizer/tokenizer.h"

struct kite_model {
    qwen3_config config;          /* config.context_limit lowered by kite_load_params.max_context */
    int32_t config_context_limit; /* the context limit before kite_load_params.max_context */
    checkpoint *checkpoint;    /* a loaded directory, or NULL */
    dummy_model *dummy;        /* random weights, or NULL */
    const qwen3_weights *weights;
    kite_weights weights_mode; /* kite_load_params.weights: how the backend holds the linear layers */
    tokenizer *tokenizer;      /* NULL for a dummy model */
    kite_chat *chat;           /* the checkpoint's chat format; NULL without a chat template */
    backend *backend;
    bool engine_attached;      /* one engine at a time owns the backend's KV cache */
};

#endif

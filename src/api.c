/* The model half of kite.h: loading a checkpoint or a dummy model onto a backend, and tokenization.
 * The engine half lives in engine/engine.c. */
#include <stdlib.h>
#include <string.h>

#include "chat/chat_public.h"
#include "kite.h"
#include "model/model.h"
#include "util/error.h"
#include "weights/cached_load.h"
#include "weights/load_progress.h"

void kite_free(void *pointer) { free(pointer); }

bool kite_built_with_cuda(void) {
#ifdef KITE_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

kite_load_params kite_load_params_default(void) {
    return (kite_load_params){
        .backend = KITE_BACKEND_AUTO, .n_threads = 0, .device = 0, .weights = KITE_WEIGHTS_BF16,
        .kv_cache_dtype = KITE_KV_CACHE_BF16, .max_context = 0,
        .rope_scaling = NULL, .weight_cache = NULL, .on_load_event = NULL, .load_event_user_data = NULL};
}

/* kite_load_params.max_context lowers the config's context limit, before the backend sizes its RoPE table. */
static kite_status apply_max_context(kite_model *m, const kite_load_params *p) {
    m->config_context_limit = qwen3_context_limit(&m->config);
    if (p->max_context < 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "load params: max_context %d is negative", p->max_context);
    if (p->max_context > m->config_context_limit)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "load params: max_context (--max-context) %d is above the model's context limit %d (%s); "
                         "YaRN rope scaling (--rope-scaling) raises it",
                         p->max_context, m->config_context_limit,
                         m->config.rope_yarn ? "YaRN's factor x original_max_position_embeddings"
                                             : "max_position_embeddings");
    m->config.context_limit = p->max_context > 0 ? p->max_context : m->config_context_limit;
    return KITE_OK;
}

/* Creates the backend of a resolved kind: from a checkpoint through the weight cache, else (a dummy model) by
 * converting the weights in memory. */
static kite_status create_backend_of(kite_model *m, const char *dir, kite_backend_kind kind, const backend_params *bp,
                                     const kite_load_params *p) {
    if (m->checkpoint) return cached_load_create(dir, m->checkpoint, &m->config, kind, bp, p, &m->backend);
    /* Random weights are made in memory, not read: there is no load to report. */
    load_progress progress = load_progress_make(NULL, NULL);
    (void)p;
    return cached_load_convert(&m->config, m->weights, 0, kind, bp, &progress, &m->backend);
}

static kite_status create_backend(kite_model *m, const char *dir, const kite_load_params *p) {
    if (p->weights != KITE_WEIGHTS_BF16 && p->weights != KITE_WEIGHTS_FP8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_load_params.weights %d is not bf16 (0) or fp8 (1)",
                         (int)p->weights);
    if (p->kv_cache_dtype != KITE_KV_CACHE_BF16 && p->kv_cache_dtype != KITE_KV_CACHE_FP8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "kite_load_params.kv_cache_dtype %d is not bf16 (0) or fp8 (1)", (int)p->kv_cache_dtype);
    backend_params bp = {.n_threads = p->n_threads, .device = p->device, .weights = p->weights,
                         .kv_cache_dtype = p->kv_cache_dtype};
    m->weights_mode = p->weights;
    kite_backend_kind kind = p->backend;
    if (kind == KITE_BACKEND_AUTO) {
        char reason[256];
        kind = cuda_backend_available(reason, sizeof reason) ? KITE_BACKEND_CUDA : KITE_BACKEND_CPU;
    }
    if (kind == KITE_BACKEND_CUDA) {
        kite_status status = create_backend_of(m, dir, KITE_BACKEND_CUDA, &bp, p);
        /* auto means "the fastest backend that runs this model": a shape the CUDA kernels do not implement
         * (such as a head_dim other than 128) runs on the CPU instead. An explicit --backend cuda fails, and so
         * does fp8 on a GPU: a silent move to the CPU would be a thousand times slower. */
        if (status != KITE_ERROR_UNSUPPORTED || p->backend != KITE_BACKEND_AUTO || p->weights == KITE_WEIGHTS_FP8 ||
            p->kv_cache_dtype == KITE_KV_CACHE_FP8)
            return status;
        kind = KITE_BACKEND_CPU;
    }
    if (kind == KITE_BACKEND_CPU) return create_backend_of(m, dir, KITE_BACKEND_CPU, &bp, p);
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "unknown backend kind %d", (int)kind);
}

kite_status kite_model_load(const char *dir, const kite_load_params *params, kite_model **out) {
    *out = NULL;
    kite_load_params defaults = kite_load_params_default();
    if (!params) params = &defaults;
    if (!dir) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "kite_model_load: no directory given");
    kite_model *m = calloc(1, sizeof *m);
    if (!m) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "out of memory");
    /* Everything that validates files comes before the backend allocates weights. */
    kite_status status = checkpoint_open_overriding(dir, params->rope_scaling, &m->checkpoint);
    if (status == KITE_OK) {
        m->config = *checkpoint_config(m->checkpoint);
        m->weights = checkpoint_weights(m->checkpoint);
        status = apply_max_context(m, params);
    }
    if (status == KITE_OK) status = tokenizer_load(dir, &m->tokenizer);
    if (status == KITE_OK && tokenizer_vocab_size(m->tokenizer) > m->config.vocab_size)
        status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                           "%s: tokenizer.json has %d ids but config.json vocab_size is %d", dir,
                           tokenizer_vocab_size(m->tokenizer), m->config.vocab_size);
    /* The chat template is parsed now, so a template kite cannot run fails the load, not a later request. */
    if (status == KITE_OK) status = chat_public_create(dir, NULL, m->tokenizer, &m->chat);
    if (status == KITE_OK) status = create_backend(m, dir, params);
    if (status != KITE_OK) {
        kite_model_free(m);
        return status;
    }
    *out = m;
    return KITE_OK;
}

kite_status kite_model_load_dummy(const char *shape, uint64_t seed, const kite_load_params *params,
                                  kite_model **out) {
    *out = NULL;
    kite_load_params defaults = kite_load_params_default();
    if (!params) params = &defaults;
    kite_model *m = calloc(1, sizeof *m);
    if (!m) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "out of memory");
    kite_status status = known_shape_config_overriding(shape, params->rope_scaling, &m->config);
    if (status == KITE_OK) status = apply_max_context(m, params);
    if (status == KITE_OK) status = dummy_model_create(&m->config, seed, &m->dummy);
    if (status == KITE_OK) {
        m->weights = dummy_model_weights(m->dummy);
        status = create_backend(m, NULL, params);
    }
    if (status != KITE_OK) {
        kite_model_free(m);
        return status;
    }
    *out = m;
    return KITE_OK;
}

void kite_model_free(kite_model *model) {
    if (!model) return;
    if (model->backend) model->backend->ops->destroy(model->backend);
    kite_chat_free(model->chat);
    tokenizer_free(model->tokenizer);
    checkpoint_close(model->checkpoint);
    dummy_model_free(model->dummy);
    free(model);
}

kite_model_info kite_model_get_info(const kite_model *m) {
    const qwen3_config *c = &m->config;
    size_t hidden = (size_t)c->hidden_size, q = (size_t)c->n_heads * c->head_dim,
           kv = (size_t)c->n_kv_heads * c->head_dim, inter = (size_t)c->intermediate_size;
    size_t per_layer = 2 * hidden + 2 * (size_t)c->head_dim + hidden * q * 2 + hidden * kv * 2 + 3 * hidden * inter;
    size_t n_parameters = (size_t)c->vocab_size * hidden * (c->tie_word_embeddings ? 1 : 2) +
                          per_layer * (size_t)c->n_layers + hidden;
    return (kite_model_info){
        .vocab_size = c->vocab_size,
        .n_layers = c->n_layers,
        .hidden_size = c->hidden_size,
        .max_context = qwen3_context_limit(c),
        .n_eos_ids = c->n_eos_ids,
        .eos_ids = c->eos_ids,
        .has_tokenizer = m->tokenizer != NULL,
        .backend_name = m->backend->ops->name,
        .n_parameters = n_parameters,
    };
}

kite_status kite_tokenize(const kite_model *m, const char *text, size_t length, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!m->tokenizer) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "this model has no tokenizer");
    return tokenizer_encode(m->tokenizer, text, length, ids, n_ids);
}

kite_status kite_detokenize(const kite_model *m, const int32_t *ids, size_t n_ids, char **text, size_t *length) {
    *text = NULL;
    *length = 0;
    if (!m->tokenizer) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "this model has no tokenizer");
    return tokenizer_decode(m->tokenizer, ids, n_ids, text, length);
}

kite_sampling kite_sampling_default(void) {
    return (kite_sampling){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                           .repetition_penalty = 1.0f, .presence_penalty = 0.0f, .frequency_penalty = 0.0f,
                           .seed = 0, .fresh_seed = false};
}

const char *kite_finish_reason_string(kite_finish_reason reason) {
    switch (reason) {
    case KITE_FINISH_NONE: return "none";
    case KITE_FINISH_LENGTH: return "length";
    case KITE_FINISH_STOP: return "stop";
    case KITE_FINISH_CANCELLED: return "cancelled";
    case KITE_FINISH_CAPACITY: return "capacity";
    case KITE_FINISH_ERROR: return "error";
    }
    return "unknown";
}

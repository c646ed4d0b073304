/* The CPU reference backend: the Qwen3 forward in float32, as transformers' modeling_qwen3 computes it.
 *
 * It is the numerical oracle every GPU path is checked against, so it favours being plainly right:
 * weights are widened to float32 once at creation, every intermediate stays float32, and each output
 * element is computed by one fixed sequence of operations (cpu_ops.h), which makes a sequence's logits
 * bit-identical whatever else shares its batch and whatever the thread count.
 *
 * KV cache layout: K and V each hold [n_layers][n_blocks][block_size][n_kv_heads * head_dim] floats. With an fp8
 * cache (backend_params.kv_cache_dtype) each (token, kv head) vector is stored as the float32 values its fp8 codes
 * and scale decode to (quant/fp8_kv.h): the same attention as codes and scales would give, without a second copy.
 */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_widen.h"
#include "model/rope.h"
#include "quant/fp8.h"
#include "quant/fp8_kv.h"
#include "util/error.h"
#include "weights/load_progress.h"

/* Per-step activations, grown to the largest step seen. */
typedef struct cpu_scratch {
    int32_t token_capacity;
    float *hidden;      /* (tokens, hidden) the residual stream */
    float *normed;      /* (tokens, hidden) */
    float *q;           /* (tokens, n_heads * head_dim) */
    float *k;           /* (tokens, kv_dim) */
    float *v;           /* (tokens, kv_dim) */
    float *attention;   /* (tokens, n_heads * head_dim) */
    float *projected;   /* (tokens, hidden) o_proj / down_proj output before the residual add */
    float *gate;        /* (tokens, intermediate) */
    float *up;          /* (tokens, intermediate) */
    float *rope_cos;    /* (tokens, head_dim / 2) */
    float *rope_sin;    /* (tokens, head_dim / 2) */
    float *matmul;       /* cpu_matmul's scratch (the lm_head's input) */
    float *packed_input; /* cpu_matmul_packed's scratch for the widest input of the layers' products */
    int32_t *token_seq; /* (tokens) the sequence of each token */
    int32_t *token_pos; /* (tokens) its position */
    size_t score_capacity;
    float *scores;      /* (threads, longest context) attention weights, one row per thread */
} cpu_scratch;

typedef struct cpu_backend {
    backend base; /* first: a cpu_backend * is a backend * */
    qwen3_config config;
    int n_threads;
    bool emulate_bf16; /* backend_params.emulate_bf16_activations */
    kite_weights weights; /* backend_params.weights: how the linear layers' weights are widened */
    char device_name[48]; /* "cpu (16 threads)" */

    float *embed_tokens; /* (vocab, hidden) */
    cpu_layer *layers;   /* n_layers */
    float *final_norm;   /* (hidden) */
    float *lm_head;      /* (vocab, hidden); the same buffer as embed_tokens when tied */
    float *rope_inv_freq;        /* (head_dim / 2) rope_inv_freq's, shared with the CUDA backend's tables */
    float rope_attention_factor; /* rope_attention_factor: YaRN's scale of cos and sin, else 1 */

    int32_t kv_n_blocks;
    int32_t kv_block_size;
    float *k_cache;
    float *v_cache;

    cpu_scratch scratch;

    int32_t logit_capacity;
    int32_t n_logit_rows;
    float *logit_inputs; /* (rows, hidden) final hidden states of the tokens that want logits */
    float *logits;       /* (rows, vocab) */

    /* Overlapped decode (argmax_begin / argmax_end): begun argmaxes in order, a ring of BACKEND_ARGMAX_PENDING;
     * the host computes each at once, so "begun" only means "not yet handed out". */
    int32_t *begun_ids[BACKEND_ARGMAX_PENDING];
    backend_no_token *begun_reasons[BACKEND_ARGMAX_PENDING]; /* set at the rows whose id is BACKEND_NO_TOKEN */
    int32_t begun_capacity[BACKEND_ARGMAX_PENDING], begun_rows[BACKEND_ARGMAX_PENDING];
    int64_t n_begun, n_ended;
    /* Why the rows of the last ids handed out (argmax, argmax_end) that are BACKEND_NO_TOKEN allow no token. */
    backend_no_token *reasons;
    int32_t reasons_capacity, reasons_rows;
    int32_t *chained_ids; /* a tokens_from_argmax forward's tokens (capacity chained_capacity) */
    int32_t chained_capacity;
} cpu_backend;

static const backend_ops cpu_backend_ops;
static const backend_segment_ops cpu_segment_ops;
static kite_status cpu_explain_no_token(backend *self, int32_t row, backend_no_token *out);

/* ---- creation ----------------------------------------------------------------------------------- */

/* a * b * c floats as bytes, or 0 when that overflows size_t. */
static size_t float_bytes(size_t a, size_t b, size_t c) {
    if (a == 0 || b == 0 || c == 0) return 0;
    if (a > SIZE_MAX / b) return 0;
    size_t ab = a * b;
    if (ab > SIZE_MAX / c) return 0;
    size_t abc = ab * c;
    if (abc > SIZE_MAX / sizeof(float)) return 0;
    return abc * sizeof(float);
}

static kite_status check_config(const qwen3_config *c) {
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 || c->n_layers <= 0 ||
        c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "cpu backend: config has a non-positive size (vocab %d, hidden %d, intermediate %d, "
                         "layers %d, heads %d, kv heads %d, head_dim %d)",
                         c->vocab_size, c->hidden_size, c->intermediate_size, c->n_layers, c->n_heads,
                         c->n_kv_heads, c->head_dim);
    if (c->n_heads % c->n_kv_heads != 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "cpu backend: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                         c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 != 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: head_dim %d is odd (RoPE needs pairs)",
                         c->head_dim);
    if (!(c->rope_theta > 0.0) || !isfinite(c->rope_theta))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: rope_theta %g is not a positive number",
                         c->rope_theta);
    if (!(c->rms_norm_eps >= 0.0) || !isfinite(c->rms_norm_eps))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: rms_norm_eps %g is not a non-negative number",
                         c->rms_norm_eps);
    if ((int64_t)c->n_heads * c->head_dim > INT32_MAX)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: n_heads * head_dim overflows");
    return KITE_OK;
}

static void scratch_free(cpu_scratch *s) {
    free(s->hidden);
    free(s->normed);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->attention);
    free(s->projected);
    free(s->gate);
    free(s->up);
    free(s->rope_cos);
    free(s->rope_sin);
    free(s->matmul);
    free(s->packed_input);
    free(s->token_seq);
    free(s->token_pos);
    free(s->scores);
    memset(s, 0, sizeof *s);
}

static void cpu_destroy(backend *self) {
    if (!self) return;
    cpu_backend *b = (cpu_backend *)self;
    free(b->rope_inv_freq);
    if (b->layers) {
        for (int32_t l = 0; l < b->config.n_layers; l++) cpu_layer_free(&b->layers[l]);
        free(b->layers);
    }
    if (b->lm_head != b->embed_tokens) free(b->lm_head);
    free(b->embed_tokens);
    free(b->final_norm);
    free(b->k_cache);
    free(b->v_cache);
    scratch_free(&b->scratch);
    free(b->logit_inputs);
    free(b->logits);
    for (int i = 0; i < BACKEND_ARGMAX_PENDING; i++) {
        free(b->begun_ids[i]);
        free(b->begun_reasons[i]);
    }
    free(b->reasons);
    free(b->chained_ids);
    free(b);
}

static kite_status widen_layer(const qwen3_config *c, const qwen3_layer_weights *w, int32_t l, kite_weights mode,
                               cpu_layer *out) {
    int64_t hidden = c->hidden_size;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim;
    int64_t kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t inter = c->intermediate_size;
    const kite_weights vector = KITE_WEIGHTS_BF16;
    KITE_TRY(cpu_widen_tensor(&w->input_norm, "input_layernorm", l, hidden, 0, vector, &out->input_norm));
    KITE_TRY(cpu_widen_linear(&w->q_proj, "self_attn.q_proj", l, q_dim, hidden, mode, &out->q_proj));
    KITE_TRY(cpu_widen_linear(&w->k_proj, "self_attn.k_proj", l, kv_dim, hidden, mode, &out->k_proj));
    KITE_TRY(cpu_widen_linear(&w->v_proj, "self_attn.v_proj", l, kv_dim, hidden, mode, &out->v_proj));
    KITE_TRY(cpu_widen_tensor(&w->q_norm, "self_attn.q_norm", l, c->head_dim, 0, vector, &out->q_norm));
    KITE_TRY(cpu_widen_tensor(&w->k_norm, "self_attn.k_norm", l, c->head_dim, 0, vector, &out->k_norm));
    KITE_TRY(cpu_widen_linear(&w->o_proj, "self_attn.o_proj", l, hidden, q_dim, mode, &out->o_proj));
    KITE_TRY(cpu_widen_tensor(&w->post_attention_norm, "post_attention_layernorm", l, hidden, 0, vector,
                          &out->post_attention_norm));
    KITE_TRY(cpu_widen_linear(&w->gate_proj, "mlp.gate_proj", l, inter, hidden, mode, &out->gate_proj));
    KITE_TRY(cpu_widen_linear(&w->up_proj, "mlp.up_proj", l, inter, hidden, mode, &out->up_proj));
    KITE_TRY(cpu_widen_linear(&w->down_proj, "mlp.down_proj", l, hidden, inter, mode, &out->down_proj));
    return KITE_OK;
}

/* The stored bytes a view covers, its fp8 scales included, as checkpoint_weight_bytes counts them. */
static uint64_t view_bytes(const tensor_view *t) {
    uint64_t n = (uint64_t)t->shape[0] * (uint64_t)(t->n_dims == 2 ? t->shape[1] : 1);
    uint64_t bytes = n * tensor_dtype_size(t->dtype);
    if (t->scale_inv && t->block_rows > 0 && t->block_cols > 0)
        bytes += (uint64_t)fp8_block_count(t->shape[0], t->block_rows) *
                 (uint64_t)fp8_block_count(t->shape[1], t->block_cols) * tensor_dtype_size(t->scale_dtype);
    return bytes;
}

static uint64_t layer_view_bytes(const qwen3_layer_weights *w) {
    return view_bytes(&w->input_norm) + view_bytes(&w->q_proj) + view_bytes(&w->k_proj) + view_bytes(&w->v_proj) +
           view_bytes(&w->q_norm) + view_bytes(&w->k_norm) + view_bytes(&w->o_proj) +
           view_bytes(&w->post_attention_norm) + view_bytes(&w->gate_proj) + view_bytes(&w->up_proj) +
           view_bytes(&w->down_proj);
}

static kite_status cpu_create_weights(cpu_backend *b, const qwen3_weights *w, load_progress *progress) {
    const qwen3_config *c = &b->config;
    if (!w->layers) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: weights have no layers");
    /* embed_tokens and lm_head stay as stored in either mode (the embedding is a lookup; the lm_head is not
     * among the layers Qwen's FP8 checkpoints quantize). */
    KITE_TRY(cpu_widen_tensor(&w->embed_tokens, "model.embed_tokens.weight", -1, c->vocab_size, c->hidden_size,
                          KITE_WEIGHTS_BF16, &b->embed_tokens));
    b->layers = calloc((size_t)c->n_layers, sizeof *b->layers);
    if (!b->layers) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate the layer table");
    load_progress_advance(progress, view_bytes(&w->embed_tokens));
    for (int32_t l = 0; l < c->n_layers; l++) {
        KITE_TRY(widen_layer(c, &w->layers[l], l, b->weights, &b->layers[l]));
        load_progress_advance(progress, layer_view_bytes(&w->layers[l]));
    }
    KITE_TRY(
        cpu_widen_tensor(&w->final_norm, "model.norm.weight", -1, c->hidden_size, 0, KITE_WEIGHTS_BF16, &b->final_norm));
    /* A tied lm_head is a view of the embedding: share the widened copy instead of making a second. */
    if (w->lm_head.data == w->embed_tokens.data && w->lm_head.dtype == w->embed_tokens.dtype &&
        w->lm_head.n_dims == 2 && w->lm_head.shape[0] == w->embed_tokens.shape[0] &&
        w->lm_head.shape[1] == w->embed_tokens.shape[1])
        b->lm_head = b->embed_tokens;
    else
        KITE_TRY(cpu_widen_tensor(&w->lm_head, "lm_head.weight", -1, c->vocab_size, c->hidden_size, KITE_WEIGHTS_BF16,
                              &b->lm_head));
    load_progress_advance(progress, view_bytes(&w->final_norm) +
                                        (b->lm_head == b->embed_tokens ? 0 : view_bytes(&w->lm_head)));
    return KITE_OK;
}

/* The backend without its weights: the config checked and copied, threads, RoPE tables. */
static kite_status cpu_backend_alloc(const qwen3_config *config, const backend_params *params, cpu_backend **out) {
    *out = NULL;
    KITE_TRY(check_config(config));
    int32_t n_threads = params ? params->n_threads : 0;
    if (n_threads < 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: n_threads %d is negative", n_threads);
    if (params && params->weights != KITE_WEIGHTS_BF16 && params->weights != KITE_WEIGHTS_FP8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: weights mode %d is not bf16 or fp8",
                         (int)params->weights);
    if (params && params->kv_cache_dtype != KITE_KV_CACHE_BF16 && params->kv_cache_dtype != KITE_KV_CACHE_FP8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: kv cache dtype %d is not bf16 or fp8",
                         (int)params->kv_cache_dtype);

    cpu_backend *b = calloc(1, sizeof *b);
    if (!b) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate the backend");
    b->config = *config;
    b->base.ops = &cpu_backend_ops;
    b->base.segments = &cpu_segment_ops;
    b->base.explain_no_token = cpu_explain_no_token;
    b->base.config = &b->config; /* our own copy: the caller's may not outlive us */
    /* 0: OpenMP's default team size (all cores, or OMP_NUM_THREADS when the user set it). */
    b->n_threads = n_threads > 0 ? n_threads : omp_get_max_threads();
    b->emulate_bf16 = params && params->emulate_bf16_activations;
    b->weights = params ? params->weights : KITE_WEIGHTS_BF16;
    b->base.kv_cache_dtype = params ? params->kv_cache_dtype : KITE_KV_CACHE_BF16;
    if (b->n_threads < 1) b->n_threads = 1;
    snprintf(b->device_name, sizeof b->device_name, "cpu (%d thread%s)", b->n_threads,
             b->n_threads == 1 ? "" : "s");

    b->rope_inv_freq = malloc((size_t)(config->head_dim / 2) * sizeof(float));
    if (!b->rope_inv_freq) {
        cpu_destroy(&b->base);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate the RoPE frequencies");
    }
    rope_inv_freq(&b->config, b->rope_inv_freq);
    b->rope_attention_factor = rope_attention_factor(&b->config);
    *out = b;
    return KITE_OK;
}

kite_status cpu_backend_create(const qwen3_config *config, const qwen3_weights *weights,
                               const backend_params *params, backend **out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu_backend_create: out is NULL");
    *out = NULL;
    if (!config || !weights)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu_backend_create: config or weights is NULL");
    cpu_backend *b;
    KITE_TRY(cpu_backend_alloc(config, params, &b));
    kite_status status = cpu_create_weights(b, weights, params ? params->progress : NULL);
    if (status != KITE_OK) {
        cpu_destroy(&b->base);
        return status;
    }
    *out = &b->base;
    return KITE_OK;
}

/* ---- weight segments (the weight cache) ------------------------------------------------------------ */

/* One float32 tensor the backend holds: its buffer and length. */
typedef struct cpu_tensor_ref {
    char name[BACKEND_SEGMENT_NAME_MAX];
    float **buffer;
    uint64_t bytes;
} cpu_tensor_ref;

#define CPU_TENSORS_PER_LAYER 11

/* Every tensor in the fixed order list_segments exports, named as the checkpoint names it; the lm_head only
 * when it is not the embedding (tie_word_embeddings). The count is 2 + 11 per layer + 1 when untied. */
static int32_t cpu_tensor_count(const qwen3_config *c) {
    return 2 + CPU_TENSORS_PER_LAYER * c->n_layers + (c->tie_word_embeddings ? 0 : 1);
}

static void cpu_tensor_table(cpu_backend *b, cpu_tensor_ref *refs) {
    const qwen3_config *c = &b->config;
    const uint64_t f = sizeof(float), hidden = (uint64_t)c->hidden_size, head_dim = (uint64_t)c->head_dim,
                   q_dim = (uint64_t)c->n_heads * head_dim, kv_dim = (uint64_t)c->n_kv_heads * head_dim,
                   inter = (uint64_t)c->intermediate_size, vocab = (uint64_t)c->vocab_size;
    int32_t n = 0;
#define CPU_TENSOR(pointer, count, ...)                                                                         \
    do {                                                                                                        \
        snprintf(refs[n].name, sizeof refs[n].name, __VA_ARGS__);                                               \
        refs[n].buffer = (pointer);                                                                             \
        refs[n].bytes = (count) * f;                                                                            \
        n++;                                                                                                    \
    } while (0)
/* A linear layer's weight, held packed (cpu_pack_rows). */
#define PACKED(rows, cols) (uint64_t) cpu_packed_floats((int32_t)(rows), (int32_t)(cols))
    CPU_TENSOR(&b->embed_tokens, vocab * hidden, "model.embed_tokens.weight");
    for (int32_t l = 0; l < c->n_layers; l++) {
        cpu_layer *layer = &b->layers[l];
        CPU_TENSOR(&layer->input_norm, hidden, "model.layers.%d.input_layernorm.weight", (int)l);
        CPU_TENSOR(&layer->q_proj, PACKED(q_dim, hidden), "model.layers.%d.self_attn.q_proj.weight", (int)l);
        CPU_TENSOR(&layer->k_proj, PACKED(kv_dim, hidden), "model.layers.%d.self_attn.k_proj.weight", (int)l);
        CPU_TENSOR(&layer->v_proj, PACKED(kv_dim, hidden), "model.layers.%d.self_attn.v_proj.weight", (int)l);
        CPU_TENSOR(&layer->q_norm, head_dim, "model.layers.%d.self_attn.q_norm.weight", (int)l);
        CPU_TENSOR(&layer->k_norm, head_dim, "model.layers.%d.self_attn.k_norm.weight", (int)l);
        CPU_TENSOR(&layer->o_proj, PACKED(hidden, q_dim), "model.layers.%d.self_attn.o_proj.weight", (int)l);
        CPU_TENSOR(&layer->post_attention_norm, hidden, "model.layers.%d.post_attention_layernorm.weight", (int)l);
        CPU_TENSOR(&layer->gate_proj, PACKED(inter, hidden), "model.layers.%d.mlp.gate_proj.weight", (int)l);
        CPU_TENSOR(&layer->up_proj, PACKED(inter, hidden), "model.layers.%d.mlp.up_proj.weight", (int)l);
        CPU_TENSOR(&layer->down_proj, PACKED(hidden, inter), "model.layers.%d.mlp.down_proj.weight", (int)l);
    }
    CPU_TENSOR(&b->final_norm, hidden, "model.norm.weight");
    if (!c->tie_word_embeddings) CPU_TENSOR(&b->lm_head, vocab * hidden, "lm_head.weight");
#undef PACKED
#undef CPU_TENSOR
}

/* The table of b's tensors (malloc'd, cpu_tensor_count entries). */
static kite_status cpu_tensor_refs(cpu_backend *b, cpu_tensor_ref **out) {
    *out = NULL;
    cpu_tensor_ref *refs = calloc((size_t)cpu_tensor_count(&b->config), sizeof *refs);
    if (!refs) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory listing the weight segments");
    cpu_tensor_table(b, refs);
    *out = refs;
    return KITE_OK;
}

static kite_status cpu_list_segments(backend *self, backend_segment *segments, int32_t capacity, int32_t *n) {
    cpu_backend *b = (cpu_backend *)self;
    /* The export must describe what forward reads: a tied model whose lm_head is not the embedding's buffer
     * (a dummy model's independent draws) has no name in this table, so it is refused, not half exported. */
    if (b->config.tie_word_embeddings != (b->lm_head == b->embed_tokens))
        return kite_fail(KITE_ERROR_UNSUPPORTED, "cpu backend: its lm_head and tie_word_embeddings disagree");
    cpu_tensor_ref *refs;
    KITE_TRY(cpu_tensor_refs(b, &refs));
    *n = cpu_tensor_count(&b->config);
    for (int32_t i = 0; i < *n && i < capacity; i++) {
        memcpy(segments[i].name, refs[i].name, sizeof segments[i].name);
        segments[i].size = refs[i].bytes;
    }
    free(refs);
    return KITE_OK;
}

static kite_status cpu_read_segment(backend *self, int32_t index, uint64_t offset, void *dst, size_t size) {
    cpu_backend *b = (cpu_backend *)self;
    if (index < 0 || index >= cpu_tensor_count(&b->config))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: segment %d does not exist", (int)index);
    cpu_tensor_ref *refs;
    KITE_TRY(cpu_tensor_refs(b, &refs));
    cpu_tensor_ref ref = refs[index];
    free(refs);
    if (offset > ref.bytes || size > ref.bytes - offset)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: segment %s: bytes [%llu, +%zu) past its %llu",
                         ref.name, (unsigned long long)offset, size, (unsigned long long)ref.bytes);
    memcpy(dst, (const unsigned char *)*ref.buffer + offset, size);
    return KITE_OK;
}

kite_status cpu_backend_create_from_segments(const qwen3_config *config, const backend_segment_source *source,
                                             const backend_params *params, backend **out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu_backend_create_from_segments: out is NULL");
    *out = NULL;
    if (!config || !source)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu_backend_create_from_segments: config or source is NULL");
    cpu_backend *b;
    KITE_TRY(cpu_backend_alloc(config, params, &b));
    kite_status status = KITE_OK;
    b->layers = calloc((size_t)config->n_layers, sizeof *b->layers);
    if (!b->layers) status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate the layer table");
    cpu_tensor_ref *refs = NULL;
    if (status == KITE_OK) status = cpu_tensor_refs(b, &refs);
    /* Every segment is found and its size checked before any buffer is allocated. */
    const int32_t n = status == KITE_OK ? cpu_tensor_count(config) : 0;
    int32_t *indices = n > 0 ? calloc((size_t)n, sizeof *indices) : NULL;
    if (status == KITE_OK && !indices)
        status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory reading the weight segments");
    if (status == KITE_OK && source->n_segments != n)
        status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "the entry holds %d segments, this model has %d",
                           (int)source->n_segments, (int)n);
    for (int32_t i = 0; status == KITE_OK && i < n; i++)
        status = backend_segment_find(source, refs[i].name, refs[i].bytes, &indices[i]);
    for (int32_t i = 0; status == KITE_OK && i < n; i++) {
        *refs[i].buffer = malloc((size_t)refs[i].bytes);
        if (!*refs[i].buffer)
            status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate %llu bytes for weight %s",
                               (unsigned long long)refs[i].bytes, refs[i].name);
        /* The source counts what it reads in the load's progress (backend_segment_source). */
        if (status == KITE_OK)
            status = source->read(source, indices[i], 0, *refs[i].buffer, (size_t)refs[i].bytes);
    }
    if (status == KITE_OK && config->tie_word_embeddings) b->lm_head = b->embed_tokens;
    free(refs);
    free(indices);
    if (status != KITE_OK) {
        cpu_destroy(&b->base);
        return status;
    }
    *out = &b->base;
    return KITE_OK;
}

/* ---- KV cache ------------------------------------------------------------------------------------ */

static kite_status cpu_kv_reserve(backend *self, int32_t n_blocks, int32_t block_size) {
    cpu_backend *b = (cpu_backend *)self;
    if (n_blocks <= 0 || block_size <= 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: kv_reserve(%d blocks, block size %d)",
                         n_blocks, block_size);
    size_t kv_dim = (size_t)b->config.n_kv_heads * (size_t)b->config.head_dim;
    size_t positions = (size_t)n_blocks * (size_t)block_size;
    size_t bytes = float_bytes((size_t)b->config.n_layers, positions, kv_dim);
    if (bytes == 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: a KV cache of %d blocks of %d positions is too large",
                         n_blocks, block_size);
    /* Reserving again replaces the cache (tests start over this way). */
    free(b->k_cache);
    free(b->v_cache);
    b->kv_n_blocks = 0;
    b->kv_block_size = 0;
    /* calloc: positions never written read as zeros, not garbage. */
    b->k_cache = calloc(1, bytes);
    b->v_cache = calloc(1, bytes);
    if (!b->k_cache || !b->v_cache) {
        free(b->k_cache);
        free(b->v_cache);
        b->k_cache = b->v_cache = NULL;
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate 2 x %zu bytes of KV cache", bytes);
    }
    b->kv_n_blocks = n_blocks;
    b->kv_block_size = block_size;
    return KITE_OK;
}

/* Offset in floats of (layer, position) of sequence seq in the K or V cache. */
static inline size_t kv_offset(const cpu_backend *b, const int32_t *block_table, int32_t layer, int32_t position) {
    size_t kv_dim = (size_t)b->config.n_kv_heads * (size_t)b->config.head_dim;
    size_t block = (size_t)block_table[position / b->kv_block_size];
    size_t slot = (size_t)(position % b->kv_block_size);
    size_t layer_positions = (size_t)b->kv_n_blocks * (size_t)b->kv_block_size;
    return ((size_t)layer * layer_positions + block * (size_t)b->kv_block_size + slot) * kv_dim;
}

/* ---- forward ------------------------------------------------------------------------------------- */

static kite_status check_batch(const cpu_backend *b, const step_batch *batch, int32_t *n_logit_rows,
                               int32_t *longest_context) {
    const qwen3_config *c = &b->config;
    if (!batch) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: forward: batch is NULL");
    if (!b->k_cache) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: forward before kv_reserve");
    if (batch->n_seqs < 0 || batch->n_tokens < 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: forward: %d sequences, %d tokens",
                         batch->n_seqs, batch->n_tokens);
    if (batch->n_seqs > 0 && ((!batch->token_ids && !batch->tokens_from_argmax) || !batch->seq_token_start ||
                              !batch->seq_context_len ||
                              !batch->block_tables || !batch->seq_wants_logits))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: forward: a batch array is NULL");
    if (batch->n_seqs == 0 && batch->n_tokens != 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: forward: %d tokens but no sequences",
                         batch->n_tokens);
    if (batch->n_seqs > 0 && batch->seq_token_start[0] != 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: forward: seq_token_start[0] is %d, not 0",
                         batch->seq_token_start[0]);
    int32_t rows = 0;
    int32_t longest = 0;
    for (int32_t s = 0; s < batch->n_seqs; s++) {
        int32_t start = batch->seq_token_start[s];
        int32_t end = batch->seq_token_start[s + 1];
        if (end <= start || end > batch->n_tokens)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                             "cpu backend: forward: sequence %d has new tokens [%d, %d) of %d (needs at least one)",
                             s, start, end, batch->n_tokens);
        int32_t n_new = end - start;
        int32_t context = batch->seq_context_len[s];
        if (context < n_new)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                             "cpu backend: forward: sequence %d has context length %d but %d new tokens", s,
                             context, n_new);
        if ((int64_t)context > (int64_t)b->kv_n_blocks * b->kv_block_size)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                             "cpu backend: forward: sequence %d has context length %d, more than the KV cache "
                             "holds (%d blocks of %d)",
                             s, context, b->kv_n_blocks, b->kv_block_size);
        const int32_t *table = batch->block_tables[s];
        if (!table)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: forward: sequence %d has no block table", s);
        int32_t n_table_blocks = (context + b->kv_block_size - 1) / b->kv_block_size;
        for (int32_t i = 0; i < n_table_blocks; i++) {
            if (table[i] < 0 || table[i] >= b->kv_n_blocks)
                return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                                 "cpu backend: forward: sequence %d block_tables[%d] = %d is outside [0, %d)", s, i,
                                 table[i], b->kv_n_blocks);
        }
        if (batch->seq_wants_logits[s]) rows++;
        if (context > longest) longest = context;
    }
    if (batch->n_seqs > 0 && batch->seq_token_start[batch->n_seqs] != batch->n_tokens)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "cpu backend: forward: seq_token_start[%d] is %d, not n_tokens %d", batch->n_seqs,
                         batch->seq_token_start[batch->n_seqs], batch->n_tokens);
    if (batch->tokens_from_argmax && (batch->n_tokens != batch->n_seqs || rows != batch->n_seqs ||
                                      b->n_logit_rows != batch->n_seqs))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "cpu backend: forward: tokens from the argmax need one token and a logits row per sequence "
                         "(%d sequences, %d tokens, %d rows) and as many kept rows (%d)",
                         batch->n_seqs, batch->n_tokens, rows, b->n_logit_rows);
    for (int32_t t = 0; t < batch->n_tokens && !batch->tokens_from_argmax; t++) {
        if (batch->token_ids[t] < 0 || batch->token_ids[t] >= c->vocab_size)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                             "cpu backend: forward: token %d has id %d, outside the vocabulary [0, %d)", t,
                             batch->token_ids[t], c->vocab_size);
    }
    *n_logit_rows = rows;
    *longest_context = longest;
    return KITE_OK;
}

/* Replaces *buffer by one of count elements of element_size bytes (contents not kept). */
static int grow(void **buffer, size_t count, size_t element_size) {
    free(*buffer);
    *buffer = NULL;
    if (count == 0) count = 1;
    if (count > SIZE_MAX / element_size) return 0;
    *buffer = malloc(count * element_size);
    return *buffer != NULL;
}

static kite_status scratch_reserve(cpu_backend *b, int32_t n_tokens, int32_t longest_context) {
    const qwen3_config *c = &b->config;
    cpu_scratch *s = &b->scratch;
    if (n_tokens > s->token_capacity) {
        size_t t = (size_t)n_tokens;
        size_t hidden = (size_t)c->hidden_size;
        size_t q_dim = (size_t)c->n_heads * (size_t)c->head_dim;
        size_t kv_dim = (size_t)c->n_kv_heads * (size_t)c->head_dim;
        size_t inter = (size_t)c->intermediate_size;
        size_t half = (size_t)c->head_dim / 2;
        size_t widest = hidden > q_dim ? hidden : q_dim; /* of the layers' products' inputs */
        if (inter > widest) widest = inter;
        s->token_capacity = 0;
        /* Sizes are products of int32 values: they fit size_t on 64-bit hosts; grow() checks the rest. */
        int ok = grow((void **)&s->hidden, t * hidden, sizeof(float)) &&
                 grow((void **)&s->normed, t * hidden, sizeof(float)) &&
                 grow((void **)&s->q, t * q_dim, sizeof(float)) && grow((void **)&s->k, t * kv_dim, sizeof(float)) &&
                 grow((void **)&s->v, t * kv_dim, sizeof(float)) &&
                 grow((void **)&s->attention, t * q_dim, sizeof(float)) &&
                 grow((void **)&s->projected, t * hidden, sizeof(float)) &&
                 grow((void **)&s->gate, t * inter, sizeof(float)) && grow((void **)&s->up, t * inter, sizeof(float)) &&
                 grow((void **)&s->rope_cos, t * half, sizeof(float)) &&
                 grow((void **)&s->rope_sin, t * half, sizeof(float)) &&
                 grow((void **)&s->token_seq, t, sizeof(int32_t)) && grow((void **)&s->token_pos, t, sizeof(int32_t)) &&
                 grow((void **)&s->matmul, cpu_matmul_scratch_floats((int32_t)hidden), sizeof(float)) &&
                 grow((void **)&s->packed_input, cpu_matmul_packed_scratch_floats((int32_t)widest), sizeof(float));
        if (!ok)
            return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate activations for %d tokens",
                             n_tokens);
        s->token_capacity = n_tokens;
    }
    size_t scores = (size_t)b->n_threads * (size_t)longest_context;
    if (scores > s->score_capacity) {
        s->score_capacity = 0;
        if (!grow((void **)&s->scores, scores, sizeof(float)))
            return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate attention scores for %d positions",
                             longest_context);
        s->score_capacity = scores;
    }
    return KITE_OK;
}

static kite_status logits_reserve(cpu_backend *b, int32_t rows) {
    if (rows <= b->logit_capacity) return KITE_OK;
    b->logit_capacity = 0;
    size_t vocab = (size_t)b->config.vocab_size;
    size_t hidden = (size_t)b->config.hidden_size;
    if (!grow((void **)&b->logit_inputs, (size_t)rows * hidden, sizeof(float)) ||
        !grow((void **)&b->logits, (size_t)rows * vocab, sizeof(float)))
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate logits for %d rows", rows);
    b->logit_capacity = rows;
    return KITE_OK;
}

/* Causal GQA attention of every new token over its sequence's cached positions (the new ones included,
 * already appended for this layer). One task per (token, head): independent of the rest of the batch. */
/* Rounds n values to bf16 and back when the backend emulates bf16 activations (see backend_params). */
static void maybe_round_bf16(const cpu_backend *b, float *x, size_t n) {
    if (!b->emulate_bf16) return;
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_float(float_to_bf16(x[i]));
}

static inline float round_bf16_if(bool emulate, float x) { return emulate ? bf16_to_float(float_to_bf16(x)) : x; }

static void attention_layer(cpu_backend *b, const step_batch *batch, int32_t layer) {
    const qwen3_config *c = &b->config;
    cpu_scratch *s = &b->scratch;
    int32_t head_dim = c->head_dim;
    int32_t group = c->n_heads / c->n_kv_heads;
    size_t q_dim = (size_t)c->n_heads * (size_t)head_dim;
    const size_t kv_dim = (size_t)c->n_kv_heads * (size_t)head_dim;
    const int32_t block_size = b->kv_block_size;
    /* transformers multiplies the float32 scores by head_dim ** -0.5 rounded to float32. */
    float scale = (float)(1.0 / sqrt((double)head_dim));
    size_t score_stride = s->score_capacity / (size_t)b->n_threads;
    int64_t n_tasks = (int64_t)batch->n_tokens * c->n_heads;
    /* Multiply-adds of the scores and the weighted sum: below ~10 microseconds of work, waking the thread
     * team costs more than it saves (tiny test models, short contexts). */
    int64_t work = 0;
    for (int32_t t = 0; t < batch->n_tokens; t++) work += 2 * ((int64_t)s->token_pos[t] + 1);
    work *= (int64_t)c->n_heads * head_dim;
#pragma omp parallel for schedule(dynamic, 1) num_threads(b->n_threads) if (n_tasks > 1 && work >= CPU_PARALLEL_MIN_WORK)
    for (int64_t task = 0; task < n_tasks; task++) {
        int32_t t = (int32_t)(task / c->n_heads);
        int32_t h = (int32_t)(task % c->n_heads);
        int32_t seq = s->token_seq[t];
        int32_t position = s->token_pos[t];
        int32_t kv_head = h / group;
        const int32_t *table = batch->block_tables[seq];
        const float *q = s->q + (size_t)t * q_dim + (size_t)h * (size_t)head_dim;
        float *scores = s->scores + (size_t)omp_get_thread_num() * score_stride;
        float *out = s->attention + (size_t)t * q_dim + (size_t)h * (size_t)head_dim;

        /* Positions go block by block: within a block a position's row follows the previous one's. */
        const size_t head_offset = (size_t)kv_head * (size_t)head_dim;
        float max_score = -INFINITY;
        for (int32_t j0 = 0; j0 <= position; j0 += block_size) {
            const float *k = b->k_cache + kv_offset(b, table, layer, j0) + head_offset;
            const int32_t end = position + 1 - j0 < block_size ? position + 1 : j0 + block_size;
            cpu_dot_rows(scores + j0, q, k, kv_dim, end - j0, head_dim);
            for (int32_t j = j0; j < end; j++) {
                scores[j] *= scale;
                if (scores[j] > max_score) max_score = scores[j];
            }
        }
        cpu_exp_shifted(scores, (size_t)position + 1, max_score);
        float sum = 0.0f;
        for (int32_t j = 0; j <= position; j++) sum += scores[j];
        for (int32_t d = 0; d < head_dim; d++) out[d] = 0.0f;
        /* Softmax normalises before the product with V, as torch does; with bf16 emulation, as flash attention
         * does it: unnormalised probabilities rounded to bf16, the float32 row sum dividing at the end. */
        for (int32_t j0 = 0; j0 <= position; j0 += block_size) {
            const float *v = b->v_cache + kv_offset(b, table, layer, j0) + head_offset;
            const int32_t end = position + 1 - j0 < block_size ? position + 1 : j0 + block_size;
            for (int32_t j = j0; j < end; j++, v += kv_dim)
                cpu_add_scaled(out, b->emulate_bf16 ? round_bf16_if(true, scores[j]) : scores[j] / sum, v, head_dim);
        }
        if (b->emulate_bf16)
            for (int32_t d = 0; d < head_dim; d++) out[d] /= sum;
    }
}

static void layer_forward(cpu_backend *b, const step_batch *batch, int32_t l) {
    const qwen3_config *c = &b->config;
    const cpu_layer *w = &b->layers[l];
    cpu_scratch *s = &b->scratch;
    int32_t n = batch->n_tokens;
    int32_t hidden = c->hidden_size;
    int32_t head_dim = c->head_dim;
    int32_t q_dim = c->n_heads * head_dim;
    int32_t kv_dim = c->n_kv_heads * head_dim;
    int32_t inter = c->intermediate_size;
    int32_t half = head_dim / 2;
    float eps = (float)c->rms_norm_eps;
    int threads = b->n_threads;

    /* Tokens are independent: a prompt's share the threads (each norm's double sum stays one serial chain). */
#pragma omp parallel for schedule(static) num_threads(threads) if ((int64_t)n * hidden >= CPU_PARALLEL_MIN_WORK / 8)
    for (int32_t t = 0; t < n; t++)
        cpu_rmsnorm(s->normed + (size_t)t * hidden, s->hidden + (size_t)t * hidden, w->input_norm, hidden, eps);
    maybe_round_bf16(b, s->normed, (size_t)n * (size_t)hidden);
    const cpu_matmul_part qkv[3] = {{s->q, w->q_proj, q_dim}, {s->k, w->k_proj, kv_dim}, {s->v, w->v_proj, kv_dim}};
    cpu_matmul_packed_parts(qkv, 3, s->normed, n, hidden, threads, s->packed_input);
    maybe_round_bf16(b, s->q, (size_t)n * (size_t)q_dim);
    maybe_round_bf16(b, s->k, (size_t)n * (size_t)kv_dim);
    maybe_round_bf16(b, s->v, (size_t)n * (size_t)kv_dim);

    /* Per-head RMSNorm, RoPE, then the append of K and V at each token's position. Tokens are independent,
     * so a prompt's share them among the threads (the norm's double sum is a serial chain per head). */
#pragma omp parallel for schedule(static) num_threads(threads) \
    if ((int64_t)n * (c->n_heads + c->n_kv_heads) * head_dim >= CPU_PARALLEL_MIN_WORK / 8)
    for (int32_t t = 0; t < n; t++) {
        const float *cos_table = s->rope_cos + (size_t)t * half;
        const float *sin_table = s->rope_sin + (size_t)t * half;
        for (int32_t h = 0; h < c->n_heads; h++) {
            float *q = s->q + (size_t)t * q_dim + (size_t)h * head_dim;
            cpu_rmsnorm(q, q, w->q_norm, head_dim, eps);
            cpu_rope_apply(q, cos_table, sin_table, head_dim);
            maybe_round_bf16(b, q, (size_t)head_dim);
        }
        for (int32_t h = 0; h < c->n_kv_heads; h++) {
            float *k = s->k + (size_t)t * kv_dim + (size_t)h * head_dim;
            cpu_rmsnorm(k, k, w->k_norm, head_dim, eps);
            cpu_rope_apply(k, cos_table, sin_table, head_dim);
            maybe_round_bf16(b, k, (size_t)head_dim);
        }
        const int32_t *table = batch->block_tables[s->token_seq[t]];
        size_t offset = kv_offset(b, table, l, s->token_pos[t]);
        float *k_slot = b->k_cache + offset, *v_slot = b->v_cache + offset;
        memcpy(k_slot, s->k + (size_t)t * kv_dim, (size_t)kv_dim * sizeof(float));
        memcpy(v_slot, s->v + (size_t)t * kv_dim, (size_t)kv_dim * sizeof(float));
        /* An fp8 cache keeps what its codes and scales decode to, so attention (which reads only the cache, the
         * current chunk's positions too) sees exactly the values a GPU's fp8 cache holds. */
        if (b->base.kv_cache_dtype == KITE_KV_CACHE_FP8)
            for (int32_t h = 0; h < c->n_kv_heads; h++) {
                fp8_kv_round_trip(k_slot + (size_t)h * head_dim, head_dim);
                fp8_kv_round_trip(v_slot + (size_t)h * head_dim, head_dim);
            }
    }

    attention_layer(b, batch, l);
    maybe_round_bf16(b, s->attention, (size_t)n * (size_t)q_dim);
    cpu_matmul_packed(s->projected, s->attention, w->o_proj, n, hidden, q_dim, threads, s->packed_input);
    size_t n_hidden = (size_t)n * (size_t)hidden;
    for (size_t i = 0; i < n_hidden; i++) s->hidden[i] += s->projected[i];

#pragma omp parallel for schedule(static) num_threads(threads) if ((int64_t)n * hidden >= CPU_PARALLEL_MIN_WORK / 8)
    for (int32_t t = 0; t < n; t++)
        cpu_rmsnorm(s->normed + (size_t)t * hidden, s->hidden + (size_t)t * hidden, w->post_attention_norm, hidden,
                    eps);
    maybe_round_bf16(b, s->normed, (size_t)n * (size_t)hidden);
    const cpu_matmul_part gate_up[2] = {{s->gate, w->gate_proj, inter}, {s->up, w->up_proj, inter}};
    cpu_matmul_packed_parts(gate_up, 2, s->normed, n, hidden, threads, s->packed_input);
    maybe_round_bf16(b, s->gate, (size_t)n * (size_t)inter);
    maybe_round_bf16(b, s->up, (size_t)n * (size_t)inter);
    cpu_swiglu(s->gate, s->up, (size_t)n * (size_t)inter, threads);
    maybe_round_bf16(b, s->gate, (size_t)n * (size_t)inter);
    cpu_matmul_packed(s->projected, s->gate, w->down_proj, n, hidden, inter, threads, s->packed_input);
    for (size_t i = 0; i < n_hidden; i++) s->hidden[i] += s->projected[i];
}

static int32_t argmax_rows(const cpu_backend *b, int32_t *out_ids, backend_no_token *reasons, int32_t n_rows);

/* A tokens_from_argmax forward's tokens: the argmax of the kept rows, taken before this forward replaces them. A
 * row that allowed no token feeds token 0: its request ends when its id is read, and nothing reads what this
 * forward computes for it. */
static kite_status chained_tokens(cpu_backend *b, int32_t n, const int32_t **ids) {
    if (n > b->chained_capacity) {
        int32_t *p = realloc(b->chained_ids, (size_t)n * sizeof *p);
        if (!p) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory");
        b->chained_ids = p;
        b->chained_capacity = n;
    }
    if (argmax_rows(b, b->chained_ids, NULL, n) >= 0)
        for (int32_t i = 0; i < n; i++)
            if (b->chained_ids[i] == BACKEND_NO_TOKEN) b->chained_ids[i] = 0;
    *ids = b->chained_ids;
    return KITE_OK;
}

static kite_status cpu_forward(backend *self, const step_batch *batch) {
    cpu_backend *b = (cpu_backend *)self;
    const qwen3_config *c = &b->config;
    int32_t rows = 0;
    int32_t longest_context = 0;
    const int32_t *token_ids = NULL;
    kite_status status = check_batch(b, batch, &rows, &longest_context);
    if (status == KITE_OK) {
        token_ids = batch->token_ids;
        if (batch->tokens_from_argmax) status = chained_tokens(b, batch->n_tokens, &token_ids);
    }
    b->n_logit_rows = 0; /* the kept rows are gone, also when this forward fails */
    if (status != KITE_OK) return status;
    if (batch->n_tokens == 0) return KITE_OK;
    KITE_TRY(scratch_reserve(b, batch->n_tokens, longest_context));
    KITE_TRY(logits_reserve(b, rows));

    cpu_scratch *s = &b->scratch;
    size_t hidden = (size_t)c->hidden_size;
    int32_t half = c->head_dim / 2;
    for (int32_t seq = 0; seq < batch->n_seqs; seq++) {
        int32_t start = batch->seq_token_start[seq];
        int32_t end = batch->seq_token_start[seq + 1];
        int32_t first_position = batch->seq_context_len[seq] - (end - start);
        for (int32_t t = start; t < end; t++) {
            s->token_seq[t] = seq;
            s->token_pos[t] = first_position + (t - start);
            rope_position_angles(b->rope_inv_freq, half, b->rope_attention_factor, s->token_pos[t],
                                 s->rope_cos + (size_t)t * half, s->rope_sin + (size_t)t * half);
        }
    }
    for (int32_t t = 0; t < batch->n_tokens; t++)
        memcpy(s->hidden + (size_t)t * hidden, b->embed_tokens + (size_t)token_ids[t] * hidden,
               hidden * sizeof(float));

    for (int32_t l = 0; l < c->n_layers; l++) layer_forward(b, batch, l);

    /* Final norm and lm_head only for the last new token of each sequence that wants logits. */
    int32_t row = 0;
    for (int32_t seq = 0; seq < batch->n_seqs; seq++) {
        if (!batch->seq_wants_logits[seq]) continue;
        int32_t last = batch->seq_token_start[seq + 1] - 1;
        cpu_rmsnorm(b->logit_inputs + (size_t)row * hidden, s->hidden + (size_t)last * hidden, b->final_norm,
                    c->hidden_size, (float)c->rms_norm_eps);
        maybe_round_bf16(b, b->logit_inputs + (size_t)row * hidden, hidden);
        row++;
    }
    if (rows > 0)
        cpu_matmul(b->logits, b->logit_inputs, b->lm_head, rows, c->vocab_size, c->hidden_size, b->n_threads,
                   s->matmul);
    b->n_logit_rows = rows;
    return KITE_OK;
}

/* ---- results ------------------------------------------------------------------------------------- */

static kite_status check_rows(const cpu_backend *b, const void *out, int32_t n_rows, const char *what) {
    if (n_rows < 0 || n_rows > b->n_logit_rows)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: %s of %d rows, but the last forward kept %d",
                         what, n_rows, b->n_logit_rows);
    if (!out && n_rows > 0) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: %s: output is NULL", what);
    return KITE_OK;
}

static kite_status cpu_read_logits(backend *self, float *out, int32_t n_rows) {
    cpu_backend *b = (cpu_backend *)self;
    KITE_TRY(check_rows(b, out, n_rows, "read_logits"));
    if (n_rows > 0) memcpy(out, b->logits, (size_t)n_rows * (size_t)b->config.vocab_size * sizeof(float));
    return KITE_OK;
}

/* Why a kept row allows no greedy token: its first NaN or +inf, or that no logit is finite. */
static backend_no_token no_token_reason(const float *logits, size_t vocab) {
    for (size_t i = 0; i < vocab; i++)
        if (isnan(logits[i]) || logits[i] == INFINITY) return (backend_no_token){(int32_t)i, isnan(logits[i])};
    return (backend_no_token){-1, false};
}

static kite_status no_token_failure(const cpu_backend *b, int32_t row, backend_no_token reason) {
    if (reason.bad_index >= 0)
        return kite_fail(KITE_ERROR_INVALID_INPUT, "cpu backend: logits row %d: logits[%d] is %s (the weights or "
                         "activations are not finite): no token can be chosen", (int)row, (int)reason.bad_index,
                         reason.is_nan ? "NaN" : "+inf");
    return kite_fail(KITE_ERROR_INVALID_INPUT, "cpu backend: logits row %d: all %d logits are -inf: no token can be "
                     "chosen", (int)row, (int)b->config.vocab_size);
}

/* The argmax of kept rows [0, n_rows): BACKEND_NO_TOKEN at a row that allows none, its reason then in reasons[row]
 * (when not NULL). Returns the first such row, -1 when there is none. */
static int32_t argmax_rows(const cpu_backend *b, int32_t *out_ids, backend_no_token *reasons, int32_t n_rows) {
    const size_t vocab = (size_t)b->config.vocab_size;
    int32_t first_bad = -1;
    for (int32_t r = 0; r < n_rows; r++) {
        const float *logits = b->logits + (size_t)r * vocab;
        size_t best = 0;
        /* Strictly greater: the lowest id wins ties. */
        for (size_t i = 1; i < vocab; i++)
            if (logits[i] > logits[best]) best = i;
        /* A NaN or +inf anywhere, or no finite logit, allows no token (the sampler refuses the same rows): the
         * request ends with an error instead of a made-up token. One more pass over a row the argmax just read
         * costs nothing beside the lm_head that wrote it. */
        bool bad = !isfinite(logits[best]);
        for (size_t i = 0; i < vocab && !bad; i++) bad = isnan(logits[i]);
        out_ids[r] = bad ? BACKEND_NO_TOKEN : (int32_t)best;
        if (!bad) continue;
        if (reasons) reasons[r] = no_token_reason(logits, vocab);
        if (first_bad < 0) first_bad = r;
    }
    return first_bad;
}

/* Room for n reasons in *reasons (capacity *capacity). */
static kite_status reserve_reasons(backend_no_token **reasons, int32_t *capacity, int32_t n) {
    if (n <= *capacity) return KITE_OK;
    backend_no_token *p = realloc(*reasons, (size_t)n * sizeof *p);
    if (!p) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory");
    *reasons = p;
    *capacity = n;
    return KITE_OK;
}

static kite_status cpu_argmax(backend *self, int32_t *out_ids, int32_t n_rows) {
    cpu_backend *b = (cpu_backend *)self;
    KITE_TRY(check_rows(b, out_ids, n_rows, "argmax"));
    KITE_TRY(reserve_reasons(&b->reasons, &b->reasons_capacity, n_rows));
    const int32_t first_bad = argmax_rows(b, out_ids, b->reasons, n_rows);
    b->reasons_rows = n_rows;
    return first_bad >= 0 ? no_token_failure(b, first_bad, b->reasons[first_bad]) : KITE_OK;
}

static kite_status cpu_argmax_begin(backend *self, int32_t n_rows) {
    cpu_backend *b = (cpu_backend *)self;
    if (b->n_begun - b->n_ended >= BACKEND_ARGMAX_PENDING)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: argmax_begin with %d begun and not ended",
                         BACKEND_ARGMAX_PENDING);
    if (n_rows < 0 || n_rows > b->n_logit_rows)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: argmax_begin of %d rows, but the last forward "
                         "kept %d", n_rows, b->n_logit_rows);
    const int slot = (int)(b->n_begun % BACKEND_ARGMAX_PENDING);
    if (n_rows > b->begun_capacity[slot]) {
        int32_t *p = realloc(b->begun_ids[slot], (size_t)n_rows * sizeof *p);
        if (p) b->begun_ids[slot] = p;
        backend_no_token *q = realloc(b->begun_reasons[slot], (size_t)n_rows * sizeof *q);
        if (q) b->begun_reasons[slot] = q;
        if (!p || !q) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory");
        b->begun_capacity[slot] = n_rows;
    }
    /* A row that allows no token is reported by argmax_end, as a device backend can only report it there. */
    (void)argmax_rows(b, b->begun_ids[slot], b->begun_reasons[slot], n_rows);
    b->begun_rows[slot] = n_rows;
    b->n_begun++;
    return KITE_OK;
}

static kite_status cpu_argmax_end(backend *self, int32_t *out_ids, int32_t n_rows) {
    cpu_backend *b = (cpu_backend *)self;
    const int slot = (int)(b->n_ended % BACKEND_ARGMAX_PENDING);
    if (b->n_ended == b->n_begun || n_rows != b->begun_rows[slot] || (!out_ids && n_rows > 0))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: argmax_end of %d rows: %s", n_rows,
                         b->n_ended == b->n_begun ? "none begun" : "not the rows begun");
    KITE_TRY(reserve_reasons(&b->reasons, &b->reasons_capacity, n_rows));
    if (n_rows > 0) memcpy(out_ids, b->begun_ids[slot], (size_t)n_rows * sizeof *out_ids);
    b->n_ended++;
    int32_t first_bad = -1;
    for (int32_t r = 0; r < n_rows; r++) {
        if (out_ids[r] != BACKEND_NO_TOKEN) continue;
        b->reasons[r] = b->begun_reasons[slot][r];
        if (first_bad < 0) first_bad = r;
    }
    b->reasons_rows = n_rows;
    return first_bad >= 0 ? no_token_failure(b, first_bad, b->reasons[first_bad]) : KITE_OK;
}

static kite_status cpu_explain_no_token(backend *self, int32_t row, backend_no_token *out) {
    const cpu_backend *b = (const cpu_backend *)self;
    if (row < 0 || row >= b->reasons_rows)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: explain_no_token of row %d, the last ids had %d",
                         (int)row, (int)b->reasons_rows);
    *out = b->reasons[row];
    return KITE_OK;
}

/* Higher logit first, then lower id. */
static bool top_beats(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

/* read_top on the host (the same reduction the CUDA backend makes on the device, so the engine's reduced
 * sampling path runs, and is tested, without a GPU): per row a validity pass, the log-sum-exp in double,
 * then the k best by insertion into a sorted list (k <= BACKEND_TOP_MAX). */
static kite_status cpu_read_top(backend *self, int32_t n_rows, int32_t k, float *top_logits, int32_t *top_ids,
                                backend_row_top *stats) {
    cpu_backend *b = (cpu_backend *)self;
    KITE_TRY(check_rows(b, stats, n_rows, "read_top"));
    if (k <= 0 || k > BACKEND_TOP_MAX || (n_rows > 0 && (!top_logits || !top_ids)))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: read_top k %d (at most %d)", (int)k, BACKEND_TOP_MAX);
    const size_t vocab = (size_t)b->config.vocab_size;
    for (int32_t r = 0; r < n_rows; r++) {
        const float *row = b->logits + (size_t)r * vocab;
        float *best = top_logits + (size_t)r * (size_t)k;
        int32_t *best_ids = top_ids + (size_t)r * (size_t)k;
        backend_row_top st = {-INFINITY, 0, 0, -1, 0.0};
        for (size_t i = 0; i < vocab; i++) {
            const float v = row[i];
            if (isnan(v) || v == INFINITY) {
                st.bad_index = (int32_t)i;
                break;
            }
            if (v != -INFINITY) {
                st.n_finite++;
                if (v > st.max_logit) st.max_logit = v;
            }
        }
        if (st.bad_index < 0 && st.n_finite > 0) {
            double sum = 0.0;
            int32_t n = 0;
            for (size_t i = 0; i < vocab; i++) {
                const float v = row[i];
                sum += (double)expf(v - st.max_logit);
                if (v == -INFINITY || (n == k && !top_beats(v, (int32_t)i, best[k - 1], best_ids[k - 1]))) continue;
                int32_t at = n < k ? n++ : k - 1; /* insert, dropping the worst when full */
                while (at > 0 && top_beats(v, (int32_t)i, best[at - 1], best_ids[at - 1])) {
                    best[at] = best[at - 1];
                    best_ids[at] = best_ids[at - 1];
                    at--;
                }
                best[at] = v;
                best_ids[at] = (int32_t)i;
            }
            st.n = n;
            st.log_sum_exp = log(sum);
        }
        stats[r] = st;
    }
    return KITE_OK;
}

static kite_status cpu_memory_info(backend *self, size_t *free_bytes, size_t *total_bytes) {
    (void)self;
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    return KITE_OK;
}

static const char *cpu_device_name(backend *self) { return ((cpu_backend *)self)->device_name; }

static const backend_ops cpu_backend_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .kv_reserve = cpu_kv_reserve,
    .forward = cpu_forward,
    .read_logits = cpu_read_logits,
    .argmax = cpu_argmax,
    .memory_info = cpu_memory_info,
    .device_name = cpu_device_name,
    .decode_path = NULL,
    .read_top = cpu_read_top,
    .argmax_begin = cpu_argmax_begin,
    .argmax_end = cpu_argmax_end,
};

static const backend_segment_ops cpu_segment_ops = {
    .list_segments = cpu_list_segments,
    .read_segment = cpu_read_segment,
};

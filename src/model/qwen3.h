/* The Qwen3 model as plain structs: its configuration and views of its weights.
 *
 * Every shape comes from config.json; nothing here is specific to one model size.
 * Weight views point into memory owned elsewhere (mmapped safetensors, or a dummy-weight buffer).
 * Linear weights use the PyTorch layout: (out_features, in_features), row-major.
 */
#ifndef KITE_MODEL_QWEN3_H
#define KITE_MODEL_QWEN3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QWEN3_MAX_EOS_IDS 16

typedef enum tensor_dtype {
    TENSOR_DTYPE_BF16,
    TENSOR_DTYPE_F16,
    TENSOR_DTYPE_F32,
    TENSOR_DTYPE_F8_E4M3, /* a quantized linear weight, always with its block scales (tensor_view.scale_inv) */
} tensor_dtype;

/* YaRN rope scaling (rope_scaling / rope_parameters with rope_type "yarn"), as transformers'
 * _compute_yarn_parameters reads it once its defaults are applied (checkpoint/config.c applies them). */
typedef struct qwen3_yarn {
    double factor;                   /* how far the context is stretched (>= 1) */
    int32_t original_max_positions;  /* original_max_position_embeddings: the pretraining context */
    double beta_fast;                /* the correction range's rotation counts (32 and 1 when absent, null or 0) */
    double beta_slow;
    bool truncate;                   /* floor / ceil the correction range's ends (true when absent) */
    double attention_factor;         /* multiplies cos and sin: given, or from mscale / mscale_all_dim / factor */
} qwen3_yarn;

typedef struct qwen3_config {
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t intermediate_size;
    int32_t n_layers;    /* num_hidden_layers */
    int32_t n_heads;     /* num_attention_heads */
    int32_t n_kv_heads;  /* num_key_value_heads; n_heads % n_kv_heads == 0 */
    int32_t head_dim;    /* given, or hidden_size / n_heads */
    int32_t max_position_embeddings;
    double rope_theta;
    bool rope_yarn;      /* YaRN scaling (yarn holds it); else the default, unscaled rotation */
    qwen3_yarn yarn;
    int32_t context_limit; /* the longest sequence: yarn factor x original_max_positions with YaRN, else
                              max_position_embeddings; kite_load_params.max_context lowers it. 0 (a config
                              built by hand) means max_position_embeddings: read it with qwen3_context_limit */
    double rms_norm_eps;
    bool tie_word_embeddings;
    int32_t bos_token_id; /* -1 when absent or null */
    int32_t n_eos_ids;
    int32_t eos_ids[QWEN3_MAX_EOS_IDS];
    tensor_dtype dtype; /* torch_dtype / dtype: what the checkpoint stores */
} qwen3_config;

static inline int32_t qwen3_context_limit(const qwen3_config *c) {
    return c->context_limit > 0 ? c->context_limit : c->max_position_embeddings;
}

/* Derived shapes, in elements. q_dim: the query heads of one token (q_proj's rows, o_proj's columns); kv_dim: its
 * K or V heads (k_proj's or v_proj's rows); qkv_dim: the fused q/k/v projection's rows; group_heads: the query
 * heads that share one kv head (GQA). */
static inline int32_t qwen3_q_dim(const qwen3_config *c) { return c->n_heads * c->head_dim; }
static inline int32_t qwen3_kv_dim(const qwen3_config *c) { return c->n_kv_heads * c->head_dim; }
static inline int32_t qwen3_qkv_dim(const qwen3_config *c) { return qwen3_q_dim(c) + 2 * qwen3_kv_dim(c); }
static inline int32_t qwen3_group_heads(const qwen3_config *c) { return c->n_heads / c->n_kv_heads; }

typedef struct tensor_view {
    tensor_dtype dtype;
    int32_t n_dims;      /* 1 or 2 */
    int64_t shape[2];    /* shape[0] rows (out features), shape[1] columns (in features) */
    const void *data;    /* row-major, shape[0] * shape[1] elements of dtype */
    /* F8_E4M3 only (NULL otherwise): w = q x scale_inv of the element's block of block_rows x block_cols;
     * scale_inv is row-major [ceil(shape[0] / block_rows)][ceil(shape[1] / block_cols)] of scale_dtype (F32
     * or BF16), aligned to its element size. quant/fp8.h specifies the arithmetic. */
    const void *scale_inv;
    tensor_dtype scale_dtype;
    int32_t block_rows;
    int32_t block_cols;
} tensor_view;

typedef struct qwen3_layer_weights {
    tensor_view input_norm;          /* (hidden)                       model.layers.N.input_layernorm.weight */
    tensor_view q_proj;              /* (n_heads * head_dim, hidden)    self_attn.q_proj.weight */
    tensor_view k_proj;              /* (n_kv_heads * head_dim, hidden) self_attn.k_proj.weight */
    tensor_view v_proj;              /* (n_kv_heads * head_dim, hidden) self_attn.v_proj.weight */
    tensor_view q_norm;              /* (head_dim)                      self_attn.q_norm.weight */
    tensor_view k_norm;              /* (head_dim)                      self_attn.k_norm.weight */
    tensor_view o_proj;              /* (hidden, n_heads * head_dim)    self_attn.o_proj.weight */
    tensor_view post_attention_norm; /* (hidden)                       post_attention_layernorm.weight */
    tensor_view gate_proj;           /* (intermediate, hidden)          mlp.gate_proj.weight */
    tensor_view up_proj;             /* (intermediate, hidden)          mlp.up_proj.weight */
    tensor_view down_proj;           /* (hidden, intermediate)          mlp.down_proj.weight */
} qwen3_layer_weights;

typedef struct qwen3_weights {
    tensor_view embed_tokens;     /* (vocab, hidden)  model.embed_tokens.weight */
    qwen3_layer_weights *layers;  /* n_layers of them */
    tensor_view final_norm;       /* (hidden)         model.norm.weight */
    tensor_view lm_head;          /* (vocab, hidden)  lm_head.weight, or embed_tokens when tied */
} qwen3_weights;

/* Bytes per element of a dtype. */
static inline size_t tensor_dtype_size(tensor_dtype dtype) {
    return dtype == TENSOR_DTYPE_F32 ? 4 : dtype == TENSOR_DTYPE_F8_E4M3 ? 1 : 2;
}

static inline size_t tensor_view_elements(const tensor_view *t) {
    return t->n_dims == 1 ? (size_t)t->shape[0] : (size_t)t->shape[0] * (size_t)t->shape[1];
}

/* Widening conversions used by loaders and the CPU backend (round-to-nearest-even where narrowing). */
static inline float bf16_to_float(uint16_t bits) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)bits << 16;
    return v.f;
}

static inline uint16_t float_to_bf16(float value) {
    union { float f; uint32_t u; } v;
    v.f = value;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* quiet NaN */
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + rounding) >> 16);
}

float f16_to_float(uint16_t bits);

/* Converts n elements of a tensor of any supported dtype to float32. F8_E4M3 gives the codes' own values,
 * without their block scales: a quantized weight is dequantized through quant/weight_convert.h. */
void tensor_to_float(tensor_dtype dtype, const void *src, float *dst, size_t n);

#ifdef __cplusplus
}
#endif

#endif

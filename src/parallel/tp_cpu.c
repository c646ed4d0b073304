/* One tensor-parallel rank of the Qwen3 forward on the CPU (tp_cpu.h).
 *
 * The layer reads as the CPU backend's layer_forward does, with local sizes: the rank's query and kv heads, its
 * intermediate rows, its vocabulary rows; each o_proj / down_proj product is this rank's partial sum over its
 * columns, all-reduced before the residual add.
 *
 * KV cache layout: K and V each hold [n_layers][max_context][local kv heads x head_dim] floats.
 */
#include "parallel/tp_cpu.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_widen.h"
#include "model/rope.h"
#include "util/error.h"

struct tp_cpu_rank {
    qwen3_config config;
    tp_plan plan;
    int n_threads;

    float *embed_tokens;  /* (vocab, hidden), replicated */
    cpu_layer *layers;    /* n_layers */
    float *final_norm;    /* (hidden) */
    float *lm_head;       /* (local vocab, hidden) */
    float *rope_inv_freq; /* (head_dim / 2) */
    float rope_attention_factor;

    int32_t max_context;
    int32_t context; /* positions of the sequence so far */
    float *k_cache;
    float *v_cache;

    /* Activations, grown to the largest step seen. */
    int32_t token_capacity;
    float *hidden;      /* (tokens, hidden) the residual stream, the same on every rank */
    float *normed;      /* (tokens, hidden) */
    float *q;           /* (tokens, local q rows) */
    float *k;           /* (tokens, local kv rows) */
    float *v;           /* (tokens, local kv rows) */
    float *attention;   /* (tokens, local q rows) */
    float *projected;   /* (tokens, hidden) a partial o_proj / down_proj product, then its all-reduced sum */
    float *gate;        /* (tokens, local intermediate) */
    float *up;          /* (tokens, local intermediate) */
    float *rope_cos;    /* (tokens, head_dim / 2) */
    float *rope_sin;    /* (tokens, head_dim / 2) */
    float *matmul;       /* cpu_matmul's scratch (the lm_head's input) */
    float *packed_input; /* cpu_matmul_packed's scratch for the widest input of the layers' products */
    float *scores;      /* (max_context) one head's attention weights */
    float *logit_input; /* (hidden) the last token's final norm */
    float *logits;      /* (local vocab) */
    bool have_logits;
};

/* ---- shards --------------------------------------------------------------------------------------- */

/* Rows [range) of a widened (rows, cols) matrix, as a new buffer. */
static kite_status take_rows(const float *full, int32_t cols, tp_range range, float **out) {
    const size_t n = (size_t)range.count * (size_t)cols;
    *out = malloc(n * sizeof(float));
    if (!*out) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tensor parallel: cannot allocate a shard of %zu floats", n);
    memcpy(*out, full + (size_t)range.begin * (size_t)cols, n * sizeof(float));
    return KITE_OK;
}

/* Columns [range) of every row of a widened (rows, cols) matrix, as a new (rows, range.count) buffer. */
static kite_status take_columns(const float *full, int32_t rows, int32_t cols, tp_range range, float **out) {
    const size_t n = (size_t)rows * (size_t)range.count;
    *out = malloc(n * sizeof(float));
    if (!*out) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tensor parallel: cannot allocate a shard of %zu floats", n);
    for (int32_t r = 0; r < rows; r++)
        memcpy(*out + (size_t)r * (size_t)range.count, full + (size_t)r * (size_t)cols + (size_t)range.begin,
               (size_t)range.count * sizeof(float));
    return KITE_OK;
}

/* Which slice of a (rows, cols) linear weight a rank keeps. */
typedef enum shard_kind { SHARD_ROWS, SHARD_COLUMNS } shard_kind;

/* The whole tensor widened by the CPU backend's code (its checks, its fp8 dequantization, whole blocks), then
 * the rank's slice kept. */
static kite_status widen_shard(const tensor_view *t, const char *name, int32_t layer, int32_t rows, int32_t cols,
                               kite_weights mode, shard_kind kind, tp_range range, float **out) {
    *out = NULL;
    float *full;
    KITE_TRY(cpu_widen_tensor(t, name, layer, rows, cols, mode, &full));
    const kite_status status =
        kind == SHARD_ROWS ? take_rows(full, cols, range, out) : take_columns(full, rows, cols, range, out);
    free(full);
    return status;
}

/* widen_shard of a linear layer's weight, then packed as the unsplit backend packs its linear layers. */
static kite_status widen_linear_shard(const tensor_view *t, const char *name, int32_t layer, int32_t rows,
                                      int32_t cols, kite_weights mode, shard_kind kind, tp_range range, float **out) {
    KITE_TRY(widen_shard(t, name, layer, rows, cols, mode, kind, range, out));
    const int32_t shard_rows = kind == SHARD_ROWS ? range.count : rows;
    const int32_t shard_cols = kind == SHARD_ROWS ? cols : range.count;
    return cpu_pack_matrix(out, shard_rows, shard_cols, name, layer);
}

static kite_status widen_layer_shards(tp_cpu_rank *r, const qwen3_layer_weights *w, int32_t l, kite_weights mode) {
    const qwen3_config *c = &r->config;
    const tp_plan *p = &r->plan;
    const int32_t hidden = c->hidden_size, q_dim = qwen3_q_dim(c), kv_dim = qwen3_kv_dim(c);
    const int32_t inter = c->intermediate_size;
    const kite_weights vector = KITE_WEIGHTS_BF16;
    cpu_layer *out = &r->layers[l];
    KITE_TRY(cpu_widen_tensor(&w->input_norm, "input_layernorm", l, hidden, 0, vector, &out->input_norm));
    KITE_TRY(widen_linear_shard(&w->q_proj, "self_attn.q_proj", l, q_dim, hidden, mode, SHARD_ROWS, p->q_rows,
                                &out->q_proj));
    KITE_TRY(widen_linear_shard(&w->k_proj, "self_attn.k_proj", l, kv_dim, hidden, mode, SHARD_ROWS, p->kv_rows,
                                &out->k_proj));
    KITE_TRY(widen_linear_shard(&w->v_proj, "self_attn.v_proj", l, kv_dim, hidden, mode, SHARD_ROWS, p->kv_rows,
                                &out->v_proj));
    KITE_TRY(cpu_widen_tensor(&w->q_norm, "self_attn.q_norm", l, c->head_dim, 0, vector, &out->q_norm));
    KITE_TRY(cpu_widen_tensor(&w->k_norm, "self_attn.k_norm", l, c->head_dim, 0, vector, &out->k_norm));
    KITE_TRY(widen_linear_shard(&w->o_proj, "self_attn.o_proj", l, hidden, q_dim, mode, SHARD_COLUMNS, p->q_rows,
                                &out->o_proj));
    KITE_TRY(cpu_widen_tensor(&w->post_attention_norm, "post_attention_layernorm", l, hidden, 0, vector,
                              &out->post_attention_norm));
    KITE_TRY(widen_linear_shard(&w->gate_proj, "mlp.gate_proj", l, inter, hidden, mode, SHARD_ROWS, p->intermediate,
                                &out->gate_proj));
    KITE_TRY(widen_linear_shard(&w->up_proj, "mlp.up_proj", l, inter, hidden, mode, SHARD_ROWS, p->intermediate,
                                &out->up_proj));
    KITE_TRY(widen_linear_shard(&w->down_proj, "mlp.down_proj", l, hidden, inter, mode, SHARD_COLUMNS, p->intermediate,
                                &out->down_proj));
    return KITE_OK;
}

static kite_status widen_shards(tp_cpu_rank *r, const qwen3_weights *w, kite_weights mode) {
    const qwen3_config *c = &r->config;
    if (!w->layers) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tensor parallel: weights have no layers");
    /* embed_tokens and lm_head stay as stored in either mode, as in the CPU backend. */
    KITE_TRY(cpu_widen_tensor(&w->embed_tokens, "model.embed_tokens.weight", -1, c->vocab_size, c->hidden_size,
                              KITE_WEIGHTS_BF16, &r->embed_tokens));
    r->layers = calloc((size_t)c->n_layers, sizeof *r->layers);
    if (!r->layers) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tensor parallel: cannot allocate the layer table");
    for (int32_t l = 0; l < c->n_layers; l++)
        KITE_TRY(widen_layer_shards(r, &w->layers[l], l, mode));
    KITE_TRY(cpu_widen_tensor(&w->final_norm, "model.norm.weight", -1, c->hidden_size, 0, KITE_WEIGHTS_BF16,
                              &r->final_norm));
    /* A tied lm_head is the embedding: its rows come from the copy already widened. */
    if (w->lm_head.data == w->embed_tokens.data && w->lm_head.dtype == w->embed_tokens.dtype &&
        w->lm_head.n_dims == 2 && w->lm_head.shape[0] == w->embed_tokens.shape[0] &&
        w->lm_head.shape[1] == w->embed_tokens.shape[1])
        return take_rows(r->embed_tokens, c->hidden_size, r->plan.vocab, &r->lm_head);
    return widen_shard(&w->lm_head, "lm_head.weight", -1, c->vocab_size, c->hidden_size, KITE_WEIGHTS_BF16, SHARD_ROWS,
                       r->plan.vocab, &r->lm_head);
}

/* ---- creation ----------------------------------------------------------------------------------- */

static void free_activations(tp_cpu_rank *r) {
    free(r->hidden);
    free(r->normed);
    free(r->q);
    free(r->k);
    free(r->v);
    free(r->attention);
    free(r->projected);
    free(r->gate);
    free(r->up);
    free(r->rope_cos);
    free(r->rope_sin);
    free(r->matmul);
    free(r->packed_input);
    r->hidden = r->normed = r->q = r->k = r->v = r->attention = r->projected = r->gate = r->up = NULL;
    r->rope_cos = r->rope_sin = r->matmul = r->packed_input = NULL;
    r->token_capacity = 0;
}

void tp_cpu_rank_destroy(tp_cpu_rank *r) {
    if (!r) return;
    if (r->layers) {
        for (int32_t l = 0; l < r->config.n_layers; l++)
            cpu_layer_free(&r->layers[l]);
        free(r->layers);
    }
    free(r->embed_tokens);
    free(r->final_norm);
    free(r->lm_head);
    free(r->rope_inv_freq);
    free(r->k_cache);
    free(r->v_cache);
    free_activations(r);
    free(r->scores);
    free(r->logit_input);
    free(r->logits);
    free(r);
}

kite_status tp_cpu_rank_create(const qwen3_config *config, const qwen3_weights *weights, const tp_cpu_params *params,
                               tp_cpu_rank **out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tp_cpu_rank_create: out is NULL");
    *out = NULL;
    if (!config || !weights || !params)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tp_cpu_rank_create: config, weights or params is NULL");
    tp_plan plan;
    KITE_TRY(tp_plan_make(config, params->n_ranks, params->rank, &plan));
    if (config->hidden_size <= 0 || config->n_layers <= 0 || config->head_dim % 2 != 0 ||
        config->n_heads % config->n_kv_heads != 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "tensor parallel: config has hidden_size %d, num_hidden_layers %d, head_dim %d (must be "
                         "even), num_attention_heads %d (a multiple of num_key_value_heads %d)",
                         (int)config->hidden_size, (int)config->n_layers, (int)config->head_dim, (int)config->n_heads,
                         (int)config->n_kv_heads);
    if (params->max_context < 1 || params->max_context > qwen3_context_limit(config) || params->n_threads < 1)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "tensor parallel: max_context %d (must be in [1, %d]), n_threads %d (must be >= 1)",
                         (int)params->max_context, (int)qwen3_context_limit(config), (int)params->n_threads);
    if (params->weights != KITE_WEIGHTS_BF16 && params->weights != KITE_WEIGHTS_FP8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tensor parallel: weights mode %d is not bf16 or fp8",
                         (int)params->weights);
    tp_cpu_rank *r = calloc(1, sizeof *r);
    if (!r) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tensor parallel: cannot allocate rank %d", (int)params->rank);
    r->config = *config;
    r->plan = plan;
    r->n_threads = params->n_threads;
    r->max_context = params->max_context;
    kite_status status = widen_shards(r, weights, params->weights);
    const size_t half = (size_t)config->head_dim / 2;
    const size_t cache_floats = (size_t)config->n_layers * (size_t)params->max_context * (size_t)plan.kv_rows.count;
    if (status == KITE_OK) {
        r->rope_inv_freq = malloc(half * sizeof(float));
        /* calloc: positions never written read as zeros, not garbage. */
        r->k_cache = calloc(cache_floats, sizeof(float));
        r->v_cache = calloc(cache_floats, sizeof(float));
        r->scores = malloc((size_t)params->max_context * sizeof(float));
        r->logit_input = malloc((size_t)config->hidden_size * sizeof(float));
        r->logits = malloc((size_t)plan.vocab.count * sizeof(float));
        if (!r->rope_inv_freq || !r->k_cache || !r->v_cache || !r->scores || !r->logit_input || !r->logits)
            status = kite_fail(KITE_ERROR_OUT_OF_MEMORY,
                               "tensor parallel: cannot allocate rank %d's cache of 2 x %zu floats and its buffers",
                               (int)params->rank, cache_floats);
    }
    if (status != KITE_OK) {
        kite_error_prefix("tensor parallel rank %d of %d", (int)params->rank, (int)params->n_ranks);
        tp_cpu_rank_destroy(r);
        return status;
    }
    rope_inv_freq(&r->config, r->rope_inv_freq);
    r->rope_attention_factor = rope_attention_factor(&r->config);
    *out = r;
    return KITE_OK;
}

const tp_plan *tp_cpu_rank_plan(const tp_cpu_rank *r) { return &r->plan; }

void tp_cpu_rank_reset(tp_cpu_rank *r) {
    r->context = 0;
    r->have_logits = false;
}

const float *tp_cpu_rank_logits(const tp_cpu_rank *r) { return r->have_logits ? r->logits : NULL; }

/* ---- forward ------------------------------------------------------------------------------------- */

static kite_status reserve_activations(tp_cpu_rank *r, int32_t n_tokens) {
    if (n_tokens <= r->token_capacity) return KITE_OK;
    free_activations(r);
    const qwen3_config *c = &r->config;
    const size_t t = (size_t)n_tokens, hidden = (size_t)c->hidden_size, q = (size_t)r->plan.q_rows.count;
    const size_t kv = (size_t)r->plan.kv_rows.count, inter = (size_t)r->plan.intermediate.count;
    const size_t half = (size_t)c->head_dim / 2, f = sizeof(float);
    size_t widest = hidden > q ? hidden : q; /* of the layers' products' inputs */
    if (inter > widest) widest = inter;
    r->hidden = malloc(t * hidden * f);
    r->normed = malloc(t * hidden * f);
    r->q = malloc(t * q * f);
    r->k = malloc(t * kv * f);
    r->v = malloc(t * kv * f);
    r->attention = malloc(t * q * f);
    r->projected = malloc(t * hidden * f);
    r->gate = malloc(t * inter * f);
    r->up = malloc(t * inter * f);
    r->rope_cos = malloc(t * half * f);
    r->rope_sin = malloc(t * half * f);
    r->matmul = malloc(cpu_matmul_scratch_floats((int32_t)hidden) * f);
    r->packed_input = malloc(cpu_matmul_packed_scratch_floats((int32_t)widest) * f);
    if (!r->hidden || !r->normed || !r->q || !r->k || !r->v || !r->attention || !r->projected || !r->gate || !r->up ||
        !r->rope_cos || !r->rope_sin || !r->matmul || !r->packed_input) {
        free_activations(r);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "tensor parallel: cannot allocate activations for %d tokens",
                         (int)n_tokens);
    }
    r->token_capacity = n_tokens;
    return KITE_OK;
}

static inline float *cache_at(const tp_cpu_rank *r, float *cache, int32_t layer, int32_t position) {
    return cache + ((size_t)layer * (size_t)r->max_context + (size_t)position) * (size_t)r->plan.kv_rows.count;
}

/* Causal attention of the rank's query heads over its kv heads, in the CPU backend's order (attention_layer):
 * scores by cpu_dot times the float32 scale, softmax normalised before the product with V. */
static void attention_heads(tp_cpu_rank *r, int32_t layer, int32_t n_tokens, int32_t first_position) {
    const qwen3_config *c = &r->config;
    const int32_t head_dim = c->head_dim, group = qwen3_group_heads(c);
    const size_t q_rows = (size_t)r->plan.q_rows.count;
    const float scale = (float)(1.0 / sqrt((double)head_dim));
    for (int32_t t = 0; t < n_tokens; t++) {
        const int32_t position = first_position + t;
        for (int32_t h = 0; h < r->plan.q_heads.count; h++) {
            /* Local query head h reads local kv head h / group (tp_plan.h says why that is the global pairing). */
            const size_t kv_offset = (size_t)(h / group) * (size_t)head_dim;
            const float *q = r->q + (size_t)t * q_rows + (size_t)h * (size_t)head_dim;
            float *out = r->attention + (size_t)t * q_rows + (size_t)h * (size_t)head_dim;
            float max_score = -INFINITY;
            for (int32_t j = 0; j <= position; j++) {
                const float score = cpu_dot(q, cache_at(r, r->k_cache, layer, j) + kv_offset, head_dim) * scale;
                r->scores[j] = score;
                if (score > max_score) max_score = score;
            }
            cpu_exp_shifted(r->scores, (size_t)position + 1, max_score);
            float sum = 0.0f;
            for (int32_t j = 0; j <= position; j++) sum += r->scores[j];
            for (int32_t d = 0; d < head_dim; d++)
                out[d] = 0.0f;
            for (int32_t j = 0; j <= position; j++) {
                const float p = r->scores[j] / sum;
                const float *v = cache_at(r, r->v_cache, layer, j) + kv_offset;
                cpu_add_scaled(out, p, v, head_dim);
            }
        }
    }
}

static kite_status layer_forward(tp_cpu_rank *r, tp_comm *comm, int32_t l, int32_t n, int32_t first_position) {
    const qwen3_config *c = &r->config;
    const cpu_layer *w = &r->layers[l];
    const int32_t hidden = c->hidden_size, head_dim = c->head_dim, half = head_dim / 2;
    const int32_t q_rows = r->plan.q_rows.count, kv_rows = r->plan.kv_rows.count;
    const int32_t inter = r->plan.intermediate.count;
    const float eps = (float)c->rms_norm_eps;
    const size_t n_hidden = (size_t)n * (size_t)hidden;

    for (int32_t t = 0; t < n; t++)
        cpu_rmsnorm(r->normed + (size_t)t * hidden, r->hidden + (size_t)t * hidden, w->input_norm, hidden, eps);
    const cpu_matmul_part qkv[3] = {{r->q, w->q_proj, q_rows}, {r->k, w->k_proj, kv_rows}, {r->v, w->v_proj, kv_rows}};
    cpu_matmul_packed_parts(qkv, 3, r->normed, n, hidden, r->n_threads, r->packed_input);
    /* Per-head RMSNorm and RoPE of whole heads, then the append of K and V at each token's position. */
    for (int32_t t = 0; t < n; t++) {
        const float *cos_table = r->rope_cos + (size_t)t * half, *sin_table = r->rope_sin + (size_t)t * half;
        for (int32_t h = 0; h < r->plan.q_heads.count; h++) {
            float *q = r->q + (size_t)t * q_rows + (size_t)h * head_dim;
            cpu_rmsnorm(q, q, w->q_norm, head_dim, eps);
            cpu_rope_apply(q, cos_table, sin_table, head_dim);
        }
        for (int32_t h = 0; h < r->plan.kv_heads.count; h++) {
            float *k = r->k + (size_t)t * kv_rows + (size_t)h * head_dim;
            cpu_rmsnorm(k, k, w->k_norm, head_dim, eps);
            cpu_rope_apply(k, cos_table, sin_table, head_dim);
        }
        memcpy(cache_at(r, r->k_cache, l, first_position + t), r->k + (size_t)t * kv_rows,
               (size_t)kv_rows * sizeof(float));
        memcpy(cache_at(r, r->v_cache, l, first_position + t), r->v + (size_t)t * kv_rows,
               (size_t)kv_rows * sizeof(float));
    }
    attention_heads(r, l, n, first_position);

    /* Row-parallel o_proj: this rank's heads' share of every output, summed over the ranks. */
    cpu_matmul_packed(r->projected, r->attention, w->o_proj, n, hidden, q_rows, r->n_threads, r->packed_input);
    KITE_TRY(comm->ops->all_reduce_sum(comm, r->projected, n_hidden));
    for (size_t i = 0; i < n_hidden; i++)
        r->hidden[i] += r->projected[i];

    for (int32_t t = 0; t < n; t++)
        cpu_rmsnorm(r->normed + (size_t)t * hidden, r->hidden + (size_t)t * hidden, w->post_attention_norm, hidden,
                    eps);
    const cpu_matmul_part gate_up[2] = {{r->gate, w->gate_proj, inter}, {r->up, w->up_proj, inter}};
    cpu_matmul_packed_parts(gate_up, 2, r->normed, n, hidden, r->n_threads, r->packed_input);
    cpu_swiglu(r->gate, r->up, (size_t)n * (size_t)inter, r->n_threads);
    /* Row-parallel down_proj over this rank's intermediate rows, summed over the ranks. */
    cpu_matmul_packed(r->projected, r->gate, w->down_proj, n, hidden, inter, r->n_threads, r->packed_input);
    KITE_TRY(comm->ops->all_reduce_sum(comm, r->projected, n_hidden));
    for (size_t i = 0; i < n_hidden; i++)
        r->hidden[i] += r->projected[i];
    return KITE_OK;
}

static kite_status forward_steps(tp_cpu_rank *r, tp_comm *comm, const int32_t *tokens, int32_t n_tokens) {
    const qwen3_config *c = &r->config;
    r->have_logits = false;
    if (!comm || comm->ops->size(comm) != r->plan.n_ranks || comm->ops->rank(comm) != r->plan.rank)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "tensor parallel: rank %d of %d is given a communicator of "
                         "rank %d of %d",
                         (int)r->plan.rank, (int)r->plan.n_ranks, comm ? (int)comm->ops->rank(comm) : -1,
                         comm ? (int)comm->ops->size(comm) : 0);
    if (n_tokens < 1 || !tokens)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tensor parallel: a forward of %d tokens", (int)n_tokens);
    if (n_tokens > r->max_context - r->context)
        return kite_fail(KITE_ERROR_CAPACITY, "tensor parallel: %d tokens after %d positions pass max_context %d",
                         (int)n_tokens, (int)r->context, (int)r->max_context);
    for (int32_t t = 0; t < n_tokens; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return kite_fail(KITE_ERROR_INVALID_INPUT,
                             "tensor parallel: token %d has id %d, outside the vocabulary "
                             "[0, %d)",
                             (int)t, (int)tokens[t], (int)c->vocab_size);
    KITE_TRY(reserve_activations(r, n_tokens));
    const size_t hidden = (size_t)c->hidden_size;
    const int32_t half = c->head_dim / 2;
    for (int32_t t = 0; t < n_tokens; t++) {
        rope_position_angles(r->rope_inv_freq, half, r->rope_attention_factor, r->context + t,
                             r->rope_cos + (size_t)t * half, r->rope_sin + (size_t)t * half);
        memcpy(r->hidden + (size_t)t * hidden, r->embed_tokens + (size_t)tokens[t] * hidden, hidden * sizeof(float));
    }
    for (int32_t l = 0; l < c->n_layers; l++)
        KITE_TRY(layer_forward(r, comm, l, n_tokens, r->context));
    /* Final norm of the last token (replicated), then this rank's vocabulary rows of the lm_head. */
    cpu_rmsnorm(r->logit_input, r->hidden + (size_t)(n_tokens - 1) * hidden, r->final_norm, c->hidden_size,
                (float)c->rms_norm_eps);
    cpu_matmul(r->logits, r->logit_input, r->lm_head, 1, r->plan.vocab.count, c->hidden_size, r->n_threads, r->matmul);
    r->context += n_tokens;
    r->have_logits = true;
    return KITE_OK;
}

kite_status tp_cpu_forward(tp_cpu_rank *r, tp_comm *comm, const int32_t *tokens, int32_t n_tokens) {
    if (!r) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tp_cpu_forward: rank is NULL");
    const kite_status status = forward_steps(r, comm, tokens, n_tokens);
    /* The others are or will be waiting in a collective this rank never reaches: tell them (a failure that came
     * from the group itself changes nothing, the first one is kept). */
    if (status != KITE_OK && comm) comm->ops->fail(comm, status, NULL);
    return status;
}

kite_status tp_cpu_argmax(tp_cpu_rank *r, tp_comm *comm, int32_t *token) {
    if (!r || !comm || !token)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tp_cpu_argmax: rank, comm or token is NULL");
    *token = -1;
    /* A rank without logits fails the group rather than leave the others waiting for it in the argmax. */
    if (!r->have_logits) {
        const kite_status status = kite_fail(KITE_ERROR_INVALID_ARGUMENT, "tensor parallel: argmax before a forward");
        comm->ops->fail(comm, status, NULL);
        return status;
    }
    /* This rank's best, strictly greater so the lowest id wins ties; a NaN stands for the whole slice. */
    int32_t best = 0, first_nan = -1;
    for (int32_t i = 0; i < r->plan.vocab.count; i++) {
        if (isnan(r->logits[i])) {
            first_nan = i;
            break;
        }
        if (r->logits[i] > r->logits[best]) best = i;
    }
    const int32_t local = first_nan >= 0 ? first_nan : best;
    const tp_argmax_candidate mine = {r->logits[local], r->plan.vocab.begin + local};
    tp_argmax_candidate winner;
    KITE_TRY(comm->ops->argmax(comm, mine, &winner));
    if (!isfinite(winner.value))
        return kite_fail(KITE_ERROR_INVALID_INPUT,
                         "tensor parallel: the logits allow no token: %s (the weights or activations are not finite)",
                         isnan(winner.value)   ? "a logit is NaN"
                         : winner.value > 0.0f ? "a logit is +inf"
                                               : "no logit is finite");
    *token = winner.index;
    return KITE_OK;
}

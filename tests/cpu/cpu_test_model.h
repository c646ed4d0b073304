/* Helpers shared by the CPU backend tests: a small random Qwen3 model built in memory, a naive float64
 * reference forward (no KV cache: the whole sequence is recomputed), and a one-call way to run a step.
 */
#ifndef KITE_TESTS_CPU_TEST_MODEL_H
#define KITE_TESTS_CPU_TEST_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/qwen3.h"

#define TEST_MODEL_MAX_LAYERS 4
#define TEST_MODEL_MAX_TENSORS (3 + 11 * TEST_MODEL_MAX_LAYERS + 1)

typedef struct test_model {
    qwen3_config config;
    qwen3_weights weights;
    qwen3_layer_weights layers[TEST_MODEL_MAX_LAYERS];
    void *buffers[TEST_MODEL_MAX_TENSORS];
    int n_buffers;
    uint64_t rng;
} test_model;

static inline uint64_t test_rng_next(uint64_t *state) {
    /* xorshift64*: deterministic, good enough for test weights. */
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [-1, 1). */
static inline double test_rng_uniform(uint64_t *state) {
    return (double)(test_rng_next(state) >> 11) * 0x1.0p-52 - 1.0;
}

static inline qwen3_config test_config(int32_t hidden, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                                       int32_t intermediate, int32_t n_layers, int32_t vocab) {
    qwen3_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = vocab;
    c.hidden_size = hidden;
    c.intermediate_size = intermediate;
    c.n_layers = n_layers;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = head_dim;
    c.max_position_embeddings = 4096;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-6;
    c.tie_word_embeddings = false;
    c.bos_token_id = -1;
    c.dtype = TENSOR_DTYPE_F32;
    return c;
}

/* Fills a view with random values: norms near 1, matrices scaled by 1/sqrt(cols) so activations stay O(1)
 * and attention is far from uniform. Returns 0 on allocation failure. */
static inline int test_model_tensor(test_model *m, tensor_view *view, tensor_dtype dtype, int64_t rows,
                                    int64_t cols, int is_norm, double scale) {
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    void *data = malloc(n * tensor_dtype_size(dtype));
    if (!data || m->n_buffers >= TEST_MODEL_MAX_TENSORS) {
        free(data);
        return 0;
    }
    m->buffers[m->n_buffers++] = data;
    double amplitude = is_norm ? 0.2 : scale / sqrt((double)(cols ? cols : 1));
    for (size_t i = 0; i < n; i++) {
        double value = (is_norm ? 1.0 : 0.0) + amplitude * test_rng_uniform(&m->rng);
        if (dtype == TENSOR_DTYPE_F32) {
            ((float *)data)[i] = (float)value;
        } else {
            ((uint16_t *)data)[i] = float_to_bf16((float)value); /* F16 is not used by these tests */
        }
    }
    view->dtype = dtype;
    view->n_dims = cols ? 2 : 1;
    view->shape[0] = rows;
    view->shape[1] = cols;
    view->data = data;
    return 1;
}

static inline void test_model_free(test_model *m) {
    for (int i = 0; i < m->n_buffers; i++) free(m->buffers[i]);
    m->n_buffers = 0;
}

/* dtype: TENSOR_DTYPE_F32 or TENSOR_DTYPE_BF16 for every tensor. Returns 0 on failure. */
static inline int test_model_build(test_model *m, const qwen3_config *config, tensor_dtype dtype, uint64_t seed) {
    memset(m, 0, sizeof *m);
    if (config->n_layers > TEST_MODEL_MAX_LAYERS) return 0;
    m->config = *config;
    m->config.dtype = dtype;
    m->rng = seed ? seed : 1;
    const qwen3_config *c = &m->config;
    int64_t hidden = c->hidden_size, q_dim = (int64_t)c->n_heads * c->head_dim;
    int64_t kv_dim = (int64_t)c->n_kv_heads * c->head_dim, inter = c->intermediate_size;
    int ok = test_model_tensor(m, &m->weights.embed_tokens, dtype, c->vocab_size, hidden, 0, 1.0);
    for (int32_t l = 0; l < c->n_layers && ok; l++) {
        qwen3_layer_weights *w = &m->layers[l];
        ok = test_model_tensor(m, &w->input_norm, dtype, hidden, 0, 1, 0) &&
             test_model_tensor(m, &w->q_proj, dtype, q_dim, hidden, 0, 2.0) &&
             test_model_tensor(m, &w->k_proj, dtype, kv_dim, hidden, 0, 2.0) &&
             test_model_tensor(m, &w->v_proj, dtype, kv_dim, hidden, 0, 1.5) &&
             test_model_tensor(m, &w->q_norm, dtype, c->head_dim, 0, 1, 0) &&
             test_model_tensor(m, &w->k_norm, dtype, c->head_dim, 0, 1, 0) &&
             test_model_tensor(m, &w->o_proj, dtype, hidden, q_dim, 0, 1.5) &&
             test_model_tensor(m, &w->post_attention_norm, dtype, hidden, 0, 1, 0) &&
             test_model_tensor(m, &w->gate_proj, dtype, inter, hidden, 0, 1.5) &&
             test_model_tensor(m, &w->up_proj, dtype, inter, hidden, 0, 1.5) &&
             test_model_tensor(m, &w->down_proj, dtype, hidden, inter, 0, 1.5);
    }
    ok = ok && test_model_tensor(m, &m->weights.final_norm, dtype, hidden, 0, 1, 0);
    if (ok && c->tie_word_embeddings)
        m->weights.lm_head = m->weights.embed_tokens;
    else if (ok)
        ok = test_model_tensor(m, &m->weights.lm_head, dtype, c->vocab_size, hidden, 0, 3.0);
    m->weights.layers = m->layers;
    if (!ok) test_model_free(m);
    return ok;
}

/* ---- the float64 reference ---------------------------------------------------------------------- */

static inline double ref_at(const tensor_view *t, size_t i) {
    switch (t->dtype) {
    case TENSOR_DTYPE_F32:
        return (double)((const float *)t->data)[i];
    case TENSOR_DTYPE_BF16:
        return (double)bf16_to_float(((const uint16_t *)t->data)[i]);
    case TENSOR_DTYPE_F16:
        return (double)f16_to_float(((const uint16_t *)t->data)[i]);
    case TENSOR_DTYPE_F8_E4M3: break; /* the test models hold no quantized weights */
    }
    return NAN;
}

/* out[t][r] = sum_k x[t][k] * W[r][k] */
static inline void ref_linear(double *out, const double *x, const tensor_view *w, size_t n_tokens) {
    size_t rows = (size_t)w->shape[0], cols = (size_t)w->shape[1];
    for (size_t t = 0; t < n_tokens; t++)
        for (size_t r = 0; r < rows; r++) {
            double sum = 0.0;
            for (size_t k = 0; k < cols; k++) sum += x[t * cols + k] * ref_at(w, r * cols + k);
            out[t * rows + r] = sum;
        }
}

static inline void ref_rmsnorm(double *out, const double *x, const tensor_view *w, size_t n, double eps) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += x[i] * x[i];
    double inverse = 1.0 / sqrt(sum / (double)n + eps);
    for (size_t i = 0; i < n; i++) out[i] = x[i] * inverse * ref_at(w, i);
}

static inline void ref_rope(double *x, size_t position, size_t head_dim, double theta) {
    size_t half = head_dim / 2;
    for (size_t i = 0; i < half; i++) {
        double angle = (double)position * pow(theta, -2.0 * (double)i / (double)head_dim);
        double x1 = x[i], x2 = x[i + half];
        x[i] = x1 * cos(angle) - x2 * sin(angle);
        x[i + half] = x2 * cos(angle) + x1 * sin(angle);
    }
}

/* Logits (n_tokens, vocab) of every position of ids[0..n_tokens), recomputed from scratch.
 * Returns NULL on allocation failure; the caller frees. */
static inline double *ref_forward(const qwen3_config *c, const qwen3_weights *w, const int32_t *ids, size_t n) {
    size_t hidden = (size_t)c->hidden_size, head_dim = (size_t)c->head_dim;
    size_t q_dim = (size_t)c->n_heads * head_dim, kv_dim = (size_t)c->n_kv_heads * head_dim;
    size_t inter = (size_t)c->intermediate_size, vocab = (size_t)c->vocab_size;
    size_t group = (size_t)(c->n_heads / c->n_kv_heads);
    double *x = calloc(n * hidden, sizeof *x), *xn = calloc(n * hidden, sizeof *xn);
    double *q = calloc(n * q_dim, sizeof *q), *k = calloc(n * kv_dim, sizeof *k), *v = calloc(n * kv_dim, sizeof *v);
    double *att = calloc(n * q_dim, sizeof *att), *proj = calloc(n * hidden, sizeof *proj);
    double *gate = calloc(n * inter, sizeof *gate), *up = calloc(n * inter, sizeof *up);
    double *scores = calloc(n, sizeof *scores), *logits = calloc(n * vocab, sizeof *logits);
    int ok = x && xn && q && k && v && att && proj && gate && up && scores && logits;
    if (ok) {
        for (size_t t = 0; t < n; t++)
            for (size_t i = 0; i < hidden; i++) x[t * hidden + i] = ref_at(&w->embed_tokens, (size_t)ids[t] * hidden + i);
        for (int32_t l = 0; l < c->n_layers; l++) {
            const qwen3_layer_weights *lw = &w->layers[l];
            for (size_t t = 0; t < n; t++) ref_rmsnorm(xn + t * hidden, x + t * hidden, &lw->input_norm, hidden, c->rms_norm_eps);
            ref_linear(q, xn, &lw->q_proj, n);
            ref_linear(k, xn, &lw->k_proj, n);
            ref_linear(v, xn, &lw->v_proj, n);
            for (size_t t = 0; t < n; t++) {
                for (size_t h = 0; h < (size_t)c->n_heads; h++) {
                    double *qh = q + t * q_dim + h * head_dim;
                    ref_rmsnorm(qh, qh, &lw->q_norm, head_dim, c->rms_norm_eps);
                    ref_rope(qh, t, head_dim, c->rope_theta);
                }
                for (size_t h = 0; h < (size_t)c->n_kv_heads; h++) {
                    double *kh = k + t * kv_dim + h * head_dim;
                    ref_rmsnorm(kh, kh, &lw->k_norm, head_dim, c->rms_norm_eps);
                    ref_rope(kh, t, head_dim, c->rope_theta);
                }
            }
            for (size_t t = 0; t < n; t++)
                for (size_t h = 0; h < (size_t)c->n_heads; h++) {
                    const double *qh = q + t * q_dim + h * head_dim;
                    size_t kvh = h / group;
                    double max_score = -INFINITY, sum = 0.0;
                    for (size_t j = 0; j <= t; j++) {
                        double s = 0.0;
                        for (size_t d = 0; d < head_dim; d++) s += qh[d] * k[j * kv_dim + kvh * head_dim + d];
                        scores[j] = s / sqrt((double)head_dim);
                        if (scores[j] > max_score) max_score = scores[j];
                    }
                    for (size_t j = 0; j <= t; j++) {
                        scores[j] = exp(scores[j] - max_score);
                        sum += scores[j];
                    }
                    double *out = att + t * q_dim + h * head_dim;
                    for (size_t d = 0; d < head_dim; d++) {
                        double acc = 0.0;
                        for (size_t j = 0; j <= t; j++) acc += scores[j] / sum * v[j * kv_dim + kvh * head_dim + d];
                        out[d] = acc;
                    }
                }
            ref_linear(proj, att, &lw->o_proj, n);
            for (size_t i = 0; i < n * hidden; i++) x[i] += proj[i];
            for (size_t t = 0; t < n; t++)
                ref_rmsnorm(xn + t * hidden, x + t * hidden, &lw->post_attention_norm, hidden, c->rms_norm_eps);
            ref_linear(gate, xn, &lw->gate_proj, n);
            ref_linear(up, xn, &lw->up_proj, n);
            for (size_t i = 0; i < n * inter; i++) gate[i] = gate[i] / (1.0 + exp(-gate[i])) * up[i];
            ref_linear(proj, gate, &lw->down_proj, n);
            for (size_t i = 0; i < n * hidden; i++) x[i] += proj[i];
        }
        for (size_t t = 0; t < n; t++) ref_rmsnorm(xn + t * hidden, x + t * hidden, &w->final_norm, hidden, c->rms_norm_eps);
        ref_linear(logits, xn, &w->lm_head, n);
    }
    free(x);
    free(xn);
    free(q);
    free(k);
    free(v);
    free(att);
    free(proj);
    free(gate);
    free(up);
    free(scores);
    if (!ok) {
        free(logits);
        return NULL;
    }
    return logits;
}

/* max |got - want| / max |want| over one row. */
static inline double relative_error(const float *got, const double *want, size_t n) {
    double max_diff = 0.0, max_want = 0.0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - want[i]);
        if (!(diff <= max_diff)) max_diff = diff; /* a NaN sticks */
        if (fabs(want[i]) > max_want) max_want = fabs(want[i]);
    }
    return max_want > 0.0 ? max_diff / max_want : max_diff;
}

/* ---- running steps ------------------------------------------------------------------------------ */

typedef struct seq_step {
    const int32_t *tokens; /* the new tokens */
    int32_t n_new;
    int32_t context_len; /* after this step */
    const int32_t *block_table;
    uint8_t wants_logits;
} seq_step;

#define TEST_MAX_SEQS 8
#define TEST_MAX_STEP_TOKENS 256

static inline kite_status run_step(backend *b, const seq_step *seqs, int32_t n_seqs) {
    int32_t tokens[TEST_MAX_STEP_TOKENS];
    int32_t starts[TEST_MAX_SEQS + 1];
    int32_t contexts[TEST_MAX_SEQS];
    const int32_t *tables[TEST_MAX_SEQS];
    uint8_t wants[TEST_MAX_SEQS];
    int32_t n_tokens = 0;
    if (n_seqs > TEST_MAX_SEQS) return KITE_ERROR_INVALID_ARGUMENT;
    for (int32_t s = 0; s < n_seqs; s++) {
        starts[s] = n_tokens;
        if (seqs[s].n_new < 0 || n_tokens + seqs[s].n_new > TEST_MAX_STEP_TOKENS) return KITE_ERROR_INVALID_ARGUMENT;
        memcpy(tokens + n_tokens, seqs[s].tokens, (size_t)seqs[s].n_new * sizeof(int32_t));
        n_tokens += seqs[s].n_new;
        contexts[s] = seqs[s].context_len;
        tables[s] = seqs[s].block_table;
        wants[s] = seqs[s].wants_logits;
    }
    starts[n_seqs] = n_tokens;
    step_batch batch = {
        .n_seqs = n_seqs,
        .n_tokens = n_tokens,
        .token_ids = tokens,
        .seq_token_start = starts,
        .seq_context_len = contexts,
        .block_tables = tables,
        .seq_wants_logits = wants,
    };
    return b->ops->forward(b, &batch);
}

#endif

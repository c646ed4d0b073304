#include "model/dummy.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

struct dummy_model {
    qwen3_weights weights;
    uint16_t *storage; /* every tensor, bf16, one allocation */
    size_t storage_elements;
};

/* splitmix64: a counter-based generator, so each tensor element's value depends only on (seed, index)
 * and the fill can run in parallel with identical results. */
static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A standard normal draw for element `index` of stream `stream` (Box-Muller on two hashed uniforms). */
static float normal_at(uint64_t stream, uint64_t index) {
    uint64_t a = splitmix64(stream ^ splitmix64(index * 2));
    uint64_t b = splitmix64(stream ^ splitmix64(index * 2 + 1));
    double u1 = ((double)(a >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
    double u2 = (double)(b >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

typedef struct tensor_plan {
    tensor_view *view;
    int64_t rows, cols; /* cols 0 for a vector */
    bool is_norm;
} tensor_plan;

static void fill_tensor(uint16_t *data, size_t n, uint64_t stream, bool is_norm) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float z = normal_at(stream, i);
        data[i] = float_to_bf16(is_norm ? 1.0f + 0.1f * z : 0.02f * z);
    }
}

kite_status dummy_model_create(const qwen3_config *c, uint64_t seed, dummy_model **out) {
    *out = NULL;
    dummy_model *m = calloc(1, sizeof *m);
    if (!m) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "dummy model: out of memory");
    m->weights.layers = calloc((size_t)c->n_layers, sizeof(qwen3_layer_weights));
    size_t n_plans = 3 + (c->tie_word_embeddings ? 0 : 1) + 11 * (size_t)c->n_layers;
    tensor_plan *plans = calloc(n_plans, sizeof *plans);
    if (!m->weights.layers || !plans) {
        free(plans);
        dummy_model_free(m);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "dummy model: out of memory");
    }
    const int64_t hidden = c->hidden_size, q_dim = (int64_t)c->n_heads * c->head_dim,
                  kv_dim = (int64_t)c->n_kv_heads * c->head_dim, inter = c->intermediate_size;
    size_t k = 0;
    qwen3_weights *w = &m->weights;
    plans[k++] = (tensor_plan){&w->embed_tokens, c->vocab_size, hidden, false};
    for (int32_t l = 0; l < c->n_layers; l++) {
        qwen3_layer_weights *L = &w->layers[l];
        plans[k++] = (tensor_plan){&L->input_norm, hidden, 0, true};
        plans[k++] = (tensor_plan){&L->q_proj, q_dim, hidden, false};
        plans[k++] = (tensor_plan){&L->k_proj, kv_dim, hidden, false};
        plans[k++] = (tensor_plan){&L->v_proj, kv_dim, hidden, false};
        plans[k++] = (tensor_plan){&L->q_norm, c->head_dim, 0, true};
        plans[k++] = (tensor_plan){&L->k_norm, c->head_dim, 0, true};
        plans[k++] = (tensor_plan){&L->o_proj, hidden, q_dim, false};
        plans[k++] = (tensor_plan){&L->post_attention_norm, hidden, 0, true};
        plans[k++] = (tensor_plan){&L->gate_proj, inter, hidden, false};
        plans[k++] = (tensor_plan){&L->up_proj, inter, hidden, false};
        plans[k++] = (tensor_plan){&L->down_proj, hidden, inter, false};
    }
    plans[k++] = (tensor_plan){&w->final_norm, hidden, 0, true};
    if (!c->tie_word_embeddings) plans[k++] = (tensor_plan){&w->lm_head, c->vocab_size, hidden, false};

    size_t total = 0;
    for (size_t i = 0; i < k; i++) total += (size_t)plans[i].rows * (size_t)(plans[i].cols ? plans[i].cols : 1);
    m->storage = malloc(total * sizeof(uint16_t));
    if (!m->storage) {
        free(plans);
        dummy_model_free(m);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "dummy model: cannot allocate %zu bytes of weights",
                         total * sizeof(uint16_t));
    }
    m->storage_elements = total;
    size_t offset = 0;
    for (size_t i = 0; i < k; i++) {
        size_t n = (size_t)plans[i].rows * (size_t)(plans[i].cols ? plans[i].cols : 1);
        uint16_t *data = m->storage + offset;
        fill_tensor(data, n, splitmix64(seed ^ splitmix64(i + 1)), plans[i].is_norm);
        *plans[i].view = (tensor_view){
            .dtype = TENSOR_DTYPE_BF16,
            .n_dims = plans[i].cols ? 2 : 1,
            .shape = {plans[i].rows, plans[i].cols},
            .data = data,
        };
        offset += n;
    }
    if (c->tie_word_embeddings) w->lm_head = w->embed_tokens;
    free(plans);
    *out = m;
    return KITE_OK;
}

const qwen3_weights *dummy_model_weights(const dummy_model *model) { return &model->weights; }

void dummy_model_free(dummy_model *model) {
    if (!model) return;
    free(model->storage);
    free(model->weights.layers);
    free(model);
}

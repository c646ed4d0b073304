#include "backend/cuda_weight_layout.h"

#include <stdio.h>
#include <string.h>

#include "util/error.h"

/* Running sums of byte counts that fail instead of wrapping: a config.json with absurd sizes is refused here,
 * not turned into a small allocation that kernels then overrun. */
typedef struct layout_sum {
    uint64_t at;
    bool overflow;
} layout_sum;

static uint64_t checked_product(layout_sum *s, uint64_t a, uint64_t b) {
    if (a != 0 && b > UINT64_MAX / a) {
        s->overflow = true;
        return 0;
    }
    return a * b;
}

/* bytes rounded up to CUDA_WEIGHT_ALIGN. */
static uint64_t aligned(layout_sum *s, uint64_t bytes) {
    if (bytes > UINT64_MAX - CUDA_WEIGHT_ALIGN) {
        s->overflow = true;
        return 0;
    }
    return (bytes + CUDA_WEIGHT_ALIGN - 1) / CUDA_WEIGHT_ALIGN * CUDA_WEIGHT_ALIGN;
}

/* The offset of a piece of `bytes` (already aligned) placed at the running end. */
static uint64_t take(layout_sum *s, uint64_t bytes) {
    const uint64_t offset = s->at;
    if (bytes > UINT64_MAX - s->at)
        s->overflow = true;
    else
        s->at += bytes;
    return offset;
}

/* The bytes of one linear piece of rows x cols: bf16, or fp8 codes (aligned) then float32 scales (aligned). */
static uint64_t linear_bytes(layout_sum *s, kite_weights weights, uint64_t rows, uint64_t cols, uint64_t *scale_at) {
    if (weights == KITE_WEIGHTS_BF16) {
        *scale_at = 0;
        return aligned(s, checked_product(s, checked_product(s, rows, cols), 2));
    }
    const uint64_t codes = aligned(s, checked_product(s, rows, cols));
    const uint64_t scales =
        aligned(s, checked_product(s, checked_product(s, (rows + 127) / 128, (cols + 127) / 128), 4));
    *scale_at = codes;
    if (codes > UINT64_MAX - scales) {
        s->overflow = true;
        return 0;
    }
    return codes + scales;
}

kite_status cuda_weight_layout_make(const qwen3_config *c, bool tied, kite_weights weights, cuda_weight_layout *out) {
    memset(out, 0, sizeof *out);
    if (weights != KITE_WEIGHTS_BF16 && weights != KITE_WEIGHTS_FP8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda weight layout: weights mode %d is not bf16 or fp8",
                         (int)weights);
    const struct {
        const char *name;
        int32_t value;
    } dims[] = {{"vocab_size", c->vocab_size},
                {"hidden_size", c->hidden_size},
                {"intermediate_size", c->intermediate_size},
                {"num_hidden_layers", c->n_layers},
                {"num_attention_heads", c->n_heads},
                {"num_key_value_heads", c->n_kv_heads},
                {"head_dim", c->head_dim}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].value <= 0)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda weight layout: %s is %d, not positive", dims[i].name,
                             (int)dims[i].value);
    const uint64_t bf16 = 2, fp32 = 4, hidden = (uint64_t)c->hidden_size, inter = (uint64_t)c->intermediate_size,
                   head_dim = (uint64_t)c->head_dim, q_dim = (uint64_t)c->n_heads * head_dim,
                   kv_dim = (uint64_t)c->n_kv_heads * head_dim, vocab = (uint64_t)c->vocab_size;
    if (weights == KITE_WEIGHTS_FP8 && (q_dim % 128 != 0 || kv_dim % 128 != 0 || inter % 128 != 0))
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "cuda weight layout: fp8 weights need q_dim (%llu), kv_dim (%llu) and intermediate_size "
                         "(%llu) to be multiples of 128, so that no 128-row scale block spans two fused matrices",
                         (unsigned long long)q_dim, (unsigned long long)kv_dim, (unsigned long long)inter);
    layout_sum s = {0};
    uint64_t qkv_scale, o_scale, gate_up_scale, down_scale;
    const uint64_t matrix_embed = aligned(&s, checked_product(&s, checked_product(&s, vocab, hidden), bf16));
    const uint64_t m_qkv = linear_bytes(&s, weights, q_dim + 2 * kv_dim, hidden, &qkv_scale);
    const uint64_t m_o = linear_bytes(&s, weights, hidden, q_dim, &o_scale);
    const uint64_t m_gate_up = linear_bytes(&s, weights, 2 * inter, hidden, &gate_up_scale);
    const uint64_t m_down = linear_bytes(&s, weights, hidden, inter, &down_scale);
    const uint64_t v_hidden = aligned(&s, hidden * fp32), v_head = aligned(&s, head_dim * fp32);

    out->weights = weights;
    out->tied = tied;
    out->embed = take(&s, matrix_embed);
    out->lm_head = tied ? out->embed : take(&s, matrix_embed);
    out->final_norm = take(&s, v_hidden);
    out->first_layer = s.at;

    layout_sum layer = {0};
    out->layer.qkv = take(&layer, m_qkv);
    out->layer.o = take(&layer, m_o);
    out->layer.gate_up = take(&layer, m_gate_up);
    out->layer.down = take(&layer, m_down);
    if (weights == KITE_WEIGHTS_FP8) {
        out->layer.qkv_scale = out->layer.qkv + qkv_scale;
        out->layer.o_scale = out->layer.o + o_scale;
        out->layer.gate_up_scale = out->layer.gate_up + gate_up_scale;
        out->layer.down_scale = out->layer.down + down_scale;
    }
    out->layer.input_norm = take(&layer, v_hidden);
    out->layer.post_norm = take(&layer, v_hidden);
    out->layer.q_norm = take(&layer, v_head);
    out->layer.k_norm = take(&layer, v_head);
    out->layer_bytes = layer.at;
    take(&s, checked_product(&s, layer.at, (uint64_t)c->n_layers));
    out->total = s.at;
    /* Segments are counted in an int32_t. */
    if (s.overflow || layer.overflow || out->total / CUDA_WEIGHT_SEGMENT_MAX_BYTES >= INT32_MAX)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "cuda weight layout: the weights of vocab %d, hidden %d, intermediate %d, %d layers do not "
                         "fit in 64-bit sizes",
                         (int)c->vocab_size, (int)c->hidden_size, (int)c->intermediate_size, (int)c->n_layers);
    return KITE_OK;
}

kite_status cuda_weight_layout_fp8_sources(const cuda_weight_layout *layout, const qwen3_config *c,
                                           cuda_fp8_source_place out[CUDA_FP8_SOURCES]) {
    if (layout->weights != KITE_WEIGHTS_FP8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cuda weight layout: fp8 sources asked of a bf16 layout");
    const int64_t hidden = c->hidden_size, inter = c->intermediate_size, q_dim = (int64_t)c->n_heads * c->head_dim,
                  kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    const cuda_layer_layout *L = &layout->layer;
    /* Each source: its name and shape, its fused piece's codes and scales, and its first row in that piece (a
     * multiple of 128: cuda_weight_layout_make refuses other shapes for fp8). */
    const struct {
        const char *name;
        int64_t rows, cols;
        uint64_t codes, scales;
        int64_t first_row;
    } sources[CUDA_FP8_SOURCES] = {
        {"q_proj", q_dim, hidden, L->qkv, L->qkv_scale, 0},
        {"k_proj", kv_dim, hidden, L->qkv, L->qkv_scale, q_dim},
        {"v_proj", kv_dim, hidden, L->qkv, L->qkv_scale, q_dim + kv_dim},
        {"o_proj", hidden, q_dim, L->o, L->o_scale, 0},
        {"gate_proj", inter, hidden, L->gate_up, L->gate_up_scale, 0},
        {"up_proj", inter, hidden, L->gate_up, L->gate_up_scale, inter},
        {"down_proj", hidden, inter, L->down, L->down_scale, 0},
    };
    for (int i = 0; i < CUDA_FP8_SOURCES; i++) {
        const int32_t scale_ld = cuda_weight_layout_scale_cols(sources[i].cols);
        out[i].name = sources[i].name;
        out[i].rows = sources[i].rows;
        out[i].cols = sources[i].cols;
        out[i].codes = sources[i].codes + (uint64_t)sources[i].first_row * (uint64_t)sources[i].cols;
        out[i].scales = sources[i].scales + (uint64_t)(sources[i].first_row / 128) * (uint64_t)scale_ld * 4u;
        out[i].scale_ld = scale_ld;
    }
    return KITE_OK;
}

int32_t cuda_weight_layout_segment_count(const cuda_weight_layout *layout) {
    return (int32_t)((layout->total + CUDA_WEIGHT_SEGMENT_MAX_BYTES - 1) / CUDA_WEIGHT_SEGMENT_MAX_BYTES);
}

void cuda_weight_layout_segment(const cuda_weight_layout *layout, int32_t index, backend_segment *out,
                                uint64_t *offset) {
    const uint64_t start = (uint64_t)index * CUDA_WEIGHT_SEGMENT_MAX_BYTES;
    const uint64_t left = layout->total - start;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "weights.%d", (int)index);
    out->size = left < CUDA_WEIGHT_SEGMENT_MAX_BYTES ? left : CUDA_WEIGHT_SEGMENT_MAX_BYTES;
    *offset = start;
}

kite_status cuda_weight_layout_check_source(const cuda_weight_layout *layout, const backend_segment_source *source) {
    const int32_t n = cuda_weight_layout_segment_count(layout);
    if (source->n_segments != n)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "the entry holds %d segments, this model's CUDA weights (%llu bytes, %s, %s) are %d",
                         (int)source->n_segments, (unsigned long long)layout->total, layout->tied ? "tied" : "untied",
                         layout->weights == KITE_WEIGHTS_FP8 ? "fp8" : "bf16", (int)n);
    if (source->chunk_bytes == 0 || source->chunk_bytes > CUDA_WEIGHT_SEGMENT_MAX_BYTES)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "the entry's chunks of %llu bytes are not 1 byte to 1 GiB",
                         (unsigned long long)source->chunk_bytes);
    for (int32_t i = 0; i < n; i++) {
        backend_segment segment;
        uint64_t offset;
        cuda_weight_layout_segment(layout, i, &segment, &offset);
        int32_t index;
        KITE_TRY(backend_segment_find(source, segment.name, segment.size, &index));
    }
    return KITE_OK;
}

#include "checkpoint/checkpoint.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/config.h"
#include "checkpoint/quantization.h"
#include "util/file.h"
#include "checkpoint/safetensors.h"
#include "quant/fp8.h"
#include "util/error.h"
#include "util/json.h"
#include "util/json_scan.h"

/* The index of an 8B model is ~30 KB (one line per tensor); this bound keeps a hostile file from costing
 * memory in proportion to its size while leaving room for checkpoints of many thousand tensors. */
#define INDEX_MAX_BYTES ((size_t)16 << 20)
/* The index has about one comma per tensor; the bound keeps its parse (~32 bytes a value) in proportion. */
#define INDEX_MAX_SEPARATORS (1000 * 1000)
#define SINGLE_FILE_NAME "model.safetensors"
#define INDEX_FILE_NAME "model.safetensors.index.json"

struct checkpoint {
    qwen3_config config;
    checkpoint_quantization quantization;
    qwen3_weights weights;
    size_t n_files;
    safetensors_file **files;
    size_t weight_bytes;
};

/* Where a tensor name lands in qwen3_weights. */
typedef enum slot_kind {
    SLOT_EMBED_TOKENS,
    SLOT_FINAL_NORM,
    SLOT_LM_HEAD,
    SLOT_LAYER,
} slot_kind;

typedef enum layer_part {
    PART_INPUT_NORM,
    PART_Q_PROJ,
    PART_K_PROJ,
    PART_V_PROJ,
    PART_Q_NORM,
    PART_K_NORM,
    PART_O_PROJ,
    PART_POST_ATTENTION_NORM,
    PART_GATE_PROJ,
    PART_UP_PROJ,
    PART_DOWN_PROJ,
    PART_COUNT,
} layer_part;

static const char *const layer_part_suffix[PART_COUNT] = {
    [PART_INPUT_NORM] = "input_layernorm.weight", [PART_Q_PROJ] = "self_attn.q_proj.weight",
    [PART_K_PROJ] = "self_attn.k_proj.weight",    [PART_V_PROJ] = "self_attn.v_proj.weight",
    [PART_Q_NORM] = "self_attn.q_norm.weight",    [PART_K_NORM] = "self_attn.k_norm.weight",
    [PART_O_PROJ] = "self_attn.o_proj.weight",    [PART_POST_ATTENTION_NORM] = "post_attention_layernorm.weight",
    [PART_GATE_PROJ] = "mlp.gate_proj.weight",    [PART_UP_PROJ] = "mlp.up_proj.weight",
    [PART_DOWN_PROJ] = "mlp.down_proj.weight",
};

typedef struct tensor_slot {
    slot_kind kind;
    int32_t layer;   /* SLOT_LAYER only */
    layer_part part; /* SLOT_LAYER only */
    bool scale_inv;  /* a linear weight's `<name>_scale_inv` (FP8 checkpoints), not the weight itself */
} tensor_slot;

#define SCALE_SUFFIX "_scale_inv"

/* The linear layers Qwen's FP8 checkpoints quantize: every projection in the layers (embed_tokens, the norms
 * and lm_head stay as they are, as transformers' and vLLM's fp8 loaders keep them). */
static bool part_is_linear(layer_part part) {
    switch (part) {
    case PART_Q_PROJ:
    case PART_K_PROJ:
    case PART_V_PROJ:
    case PART_O_PROJ:
    case PART_GATE_PROJ:
    case PART_UP_PROJ:
    case PART_DOWN_PROJ: return true;
    default: return false;
    }
}

#define LAYER_PREFIX "model.layers."

/* Maps a tensor name to its slot; false for names Qwen3 does not have (including layers >= n_layers). */
static bool slot_from_name(const char *name, const qwen3_config *config, tensor_slot *slot) {
    slot->scale_inv = false;
    if (strcmp(name, "model.embed_tokens.weight") == 0) {
        slot->kind = SLOT_EMBED_TOKENS;
        return true;
    }
    if (strcmp(name, "model.norm.weight") == 0) {
        slot->kind = SLOT_FINAL_NORM;
        return true;
    }
    if (strcmp(name, "lm_head.weight") == 0) {
        slot->kind = SLOT_LM_HEAD;
        return true;
    }
    if (strncmp(name, LAYER_PREFIX, strlen(LAYER_PREFIX)) != 0) return false;
    const char *p = name + strlen(LAYER_PREFIX);
    /* Decimal without leading zeros, as PyTorch writes module indices. */
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return false;
    int64_t layer = 0;
    while (*p >= '0' && *p <= '9') {
        layer = layer * 10 + (*p - '0');
        if (layer >= config->n_layers) return false;
        p++;
    }
    if (*p != '.') return false;
    p++;
    slot->scale_inv = false;
    for (int part = 0; part < PART_COUNT; part++) {
        size_t n = strlen(layer_part_suffix[part]);
        if (strncmp(p, layer_part_suffix[part], n) != 0) continue;
        bool scale = part_is_linear((layer_part)part) && strcmp(p + n, SCALE_SUFFIX) == 0;
        if (p[n] != '\0' && !scale) continue;
        slot->kind = SLOT_LAYER;
        slot->layer = (int32_t)layer;
        slot->part = (layer_part)part;
        slot->scale_inv = scale;
        return true;
    }
    return false;
}

/* The shape config.json implies for a slot (PyTorch Linear layout: out_features, in_features). */
static void slot_expected_shape(const tensor_slot *slot, const qwen3_config *config, int32_t *n_dims,
                                int64_t shape[2]) {
    int64_t hidden = config->hidden_size;
    int64_t q_dim = (int64_t)config->n_heads * config->head_dim;
    int64_t kv_dim = (int64_t)config->n_kv_heads * config->head_dim;
    int64_t intermediate = config->intermediate_size;
    *n_dims = 2;
    switch (slot->kind) {
    case SLOT_EMBED_TOKENS:
    case SLOT_LM_HEAD: shape[0] = config->vocab_size, shape[1] = hidden; return;
    case SLOT_FINAL_NORM: *n_dims = 1, shape[0] = hidden; return;
    case SLOT_LAYER: break;
    }
    switch (slot->part) {
    case PART_INPUT_NORM:
    case PART_POST_ATTENTION_NORM: *n_dims = 1, shape[0] = hidden; return;
    case PART_Q_NORM:
    case PART_K_NORM: *n_dims = 1, shape[0] = config->head_dim; return;
    case PART_Q_PROJ: shape[0] = q_dim, shape[1] = hidden; return;
    case PART_K_PROJ:
    case PART_V_PROJ: shape[0] = kv_dim, shape[1] = hidden; return;
    case PART_O_PROJ: shape[0] = hidden, shape[1] = q_dim; return;
    case PART_GATE_PROJ:
    case PART_UP_PROJ: shape[0] = intermediate, shape[1] = hidden; return;
    case PART_DOWN_PROJ: shape[0] = hidden, shape[1] = intermediate; return;
    case PART_COUNT: break;
    }
}

static tensor_view *slot_view(qwen3_weights *weights, const tensor_slot *slot) {
    switch (slot->kind) {
    case SLOT_EMBED_TOKENS: return &weights->embed_tokens;
    case SLOT_FINAL_NORM: return &weights->final_norm;
    case SLOT_LM_HEAD: return &weights->lm_head;
    case SLOT_LAYER: break;
    }
    qwen3_layer_weights *layer = &weights->layers[slot->layer];
    switch (slot->part) {
    case PART_INPUT_NORM: return &layer->input_norm;
    case PART_Q_PROJ: return &layer->q_proj;
    case PART_K_PROJ: return &layer->k_proj;
    case PART_V_PROJ: return &layer->v_proj;
    case PART_Q_NORM: return &layer->q_norm;
    case PART_K_NORM: return &layer->k_norm;
    case PART_O_PROJ: return &layer->o_proj;
    case PART_POST_ATTENTION_NORM: return &layer->post_attention_norm;
    case PART_GATE_PROJ: return &layer->gate_proj;
    case PART_UP_PROJ: return &layer->up_proj;
    case PART_DOWN_PROJ: return &layer->down_proj;
    case PART_COUNT: break;
    }
    return NULL;
}

/* The name of the index-th expected tensor, in the order a reader expects: embeddings, layers, norm, head. */
static void expected_name(uint64_t index, const qwen3_config *config, char *buffer, size_t capacity) {
    uint64_t layer_tensors = (uint64_t)config->n_layers * PART_COUNT;
    if (index == 0)
        snprintf(buffer, capacity, "model.embed_tokens.weight");
    else if (index <= layer_tensors)
        snprintf(buffer, capacity, LAYER_PREFIX "%" PRIu64 ".%s", (index - 1) / PART_COUNT,
                 layer_part_suffix[(index - 1) % PART_COUNT]);
    else if (index == layer_tensors + 1)
        snprintf(buffer, capacity, "model.norm.weight");
    else
        snprintf(buffer, capacity, "lm_head.weight");
}

static uint64_t expected_count(const qwen3_config *config) {
    return 2 + (uint64_t)config->n_layers * PART_COUNT + (config->tie_word_embeddings ? 0 : 1);
}

static void format_shape(int32_t n_dims, const int64_t *shape, char *buffer, size_t capacity) {
    if (n_dims == 1)
        snprintf(buffer, capacity, "[%" PRId64 "]", shape[0]);
    else if (n_dims == 2)
        snprintf(buffer, capacity, "[%" PRId64 ", %" PRId64 "]", shape[0], shape[1]);
    else if (n_dims == 0)
        snprintf(buffer, capacity, "[]");
    else
        snprintf(buffer, capacity, "[%" PRId64 ", %" PRId64 ", ...] (%d dimensions)", shape[0], shape[1], n_dims);
}

static kite_status check_tensor(const safetensors_tensor *tensor, const tensor_slot *slot, const qwen3_config *config,
                                const char *file_name) {
    int32_t n_dims;
    int64_t shape[2] = {0, 0};
    slot_expected_shape(slot, config, &n_dims, shape);
    bool same =
        tensor->n_dims == n_dims && tensor->shape[0] == shape[0] && (n_dims == 1 || tensor->shape[1] == shape[1]);
    if (!same) {
        char expected_text[64], found_text[96];
        format_shape(n_dims, shape, expected_text, sizeof expected_text);
        format_shape(tensor->n_dims, tensor->shape, found_text, sizeof found_text);
        bool transposed =
            tensor->n_dims == 2 && n_dims == 2 && tensor->shape[0] == shape[1] && tensor->shape[1] == shape[0];
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s: shape %s%s but config.json implies %s",
                         file_name, tensor->name, found_text, transposed ? " (transposed)" : "", expected_text);
    }
    size_t element_size = tensor_dtype_size(tensor->dtype);
    if ((uintptr_t)tensor->data % element_size != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: tensor %s: data at file offset %" PRIu64 " is not aligned to its %zu-byte %s elements",
                         file_name, tensor->name, tensor->data_begin, element_size,
                         safetensors_dtype_name(tensor->dtype));
    return KITE_OK;
}

static const safetensors_tensor *find_anywhere(const checkpoint *c, const char *name) {
    for (size_t i = 0; i < c->n_files; i++) {
        const safetensors_tensor *tensor = safetensors_find(c->files[i], name);
        if (tensor) return tensor;
    }
    return NULL;
}

/* The file holding a tensor found by find_anywhere, for messages. */
static const char *file_holding(const checkpoint *c, const safetensors_tensor *tensor) {
    for (size_t i = 0; i < c->n_files; i++)
        if (safetensors_find(c->files[i], tensor->name) == tensor) return safetensors_name(c->files[i]);
    return "?";
}

/* A linear weight's block scales: present, F32 or BF16, shaped for the config's block size, aligned, and
 * every value finite and not negative (a NaN, an infinity or a sign flip would silently corrupt the block). */
static kite_status check_scale(const checkpoint *c, const safetensors_tensor *weight, const char *weight_file,
                               const safetensors_tensor **out) {
    char name[160];
    snprintf(name, sizeof name, "%s" SCALE_SUFFIX, weight->name);
    const safetensors_tensor *scale = find_anywhere(c, name);
    if (!scale)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s is missing: the F8_E4M3 weight %s needs its block scales", weight_file, name,
                         weight->name);
    const char *file = file_holding(c, scale);
    if (scale->dtype != TENSOR_DTYPE_F32 && scale->dtype != TENSOR_DTYPE_BF16)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: tensor %s: dtype %s; kite reads F32 or BF16 scales", file, name,
                         safetensors_dtype_name(scale->dtype));
    const checkpoint_quantization *q = &c->quantization;
    int64_t want[2] = {fp8_block_count(weight->shape[0], q->block_rows),
                       fp8_block_count(weight->shape[1], q->block_cols)};
    if (scale->n_dims != 2 || scale->shape[0] != want[0] || scale->shape[1] != want[1]) {
        char found_text[96];
        format_shape(scale->n_dims, scale->shape, found_text, sizeof found_text);
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s: shape %s, but weight [%" PRId64 ", %" PRId64 "] in blocks of %dx%d "
                         "(quantization_config.weight_block_size) needs [%" PRId64 ", %" PRId64 "]",
                         file, name, found_text, weight->shape[0], weight->shape[1], q->block_rows, q->block_cols,
                         want[0], want[1]);
    }
    size_t element = tensor_dtype_size(scale->dtype);
    if ((uintptr_t)scale->data % element != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: tensor %s: data at file offset %" PRIu64 " is not aligned to its %zu-byte elements", file,
                         name, scale->data_begin, element);
    size_t n = (size_t)want[0] * (size_t)want[1];
    const unsigned char *bytes = scale->data;
    for (size_t i = 0; i < n; i++) {
        float value;
        tensor_to_float(scale->dtype, bytes + i * element, &value, 1);
        if (!isfinite(value) || value < 0.0f)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: tensor %s: element [%zu, %zu] is %g; a scale must be finite and not negative", file,
                             name, i / (size_t)want[1], i % (size_t)want[1], (double)value);
    }
    *out = scale;
    return KITE_OK;
}

/* Where F8_E4M3 may be and must be: with quantization_config, exactly the layers' linear weights that
 * modules_to_not_convert does not name, each with valid scales; without it, nowhere. */
static kite_status check_quantized(const checkpoint *c, const safetensors_tensor *tensor, const tensor_slot *slot,
                                   const char *file_name) {
    bool f8 = tensor->dtype == TENSOR_DTYPE_F8_E4M3;
    bool linear = slot->kind == SLOT_LAYER && part_is_linear(slot->part);
    if (!c->quantization.fp8) {
        if (f8)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: tensor %s: dtype F8_E4M3, but config.json has no quantization_config", file_name,
                             tensor->name);
        return KITE_OK;
    }
    char module[160];
    snprintf(module, sizeof module, "%s", tensor->name);
    char *suffix = strrchr(module, '.');
    if (suffix) *suffix = '\0';
    bool quantized = linear && !checkpoint_quantization_excludes(&c->quantization, module);
    if (f8 && !linear)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: tensor %s: dtype F8_E4M3; kite reads fp8 only for the layers' linear weights "
                         "(q/k/v/o/gate/up/down_proj)",
                         file_name, tensor->name);
    if (f8 && !quantized)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s: dtype F8_E4M3, but quantization_config.modules_to_not_convert keeps %s "
                         "unquantized",
                         file_name, tensor->name, module);
    if (!f8 && quantized)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s: dtype %s, but quantization_config quantizes it (F8_E4M3 with "
                         "%s" SCALE_SUFFIX " expected)",
                         file_name, tensor->name, safetensors_dtype_name(tensor->dtype), tensor->name);
    return KITE_OK;
}

/* A `<weight>_scale_inv` must belong to an F8_E4M3 weight of this checkpoint. */
static kite_status check_scale_owner(const checkpoint *c, const safetensors_tensor *scale, const char *file_name) {
    char weight_name[160];
    size_t n = strlen(scale->name) - strlen(SCALE_SUFFIX);
    snprintf(weight_name, sizeof weight_name, "%.*s", (int)n, scale->name);
    if (!c->quantization.fp8)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s: a block scale, but config.json has no quantization_config", file_name,
                         scale->name);
    const safetensors_tensor *weight = find_anywhere(c, weight_name);
    if (!weight || weight->dtype != TENSOR_DTYPE_F8_E4M3)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s: a block scale for %s, which is %s", file_name,
                         scale->name, weight_name, weight ? "not stored as F8_E4M3" : "missing");
    return KITE_OK;
}

/* Checks names and shapes, then fills the views. Nothing is allocated until the tensors present are known
 * to cover every expected one, so a config claiming billions of layers cannot trigger a huge allocation. */
static kite_status bind_weights(checkpoint *c, const char *dir) {
    const qwen3_config *config = &c->config;
    uint64_t found = 0, unexpected = 0;
    const char *first_unexpected = NULL, *first_unexpected_file = NULL;
    for (size_t f = 0; f < c->n_files; f++) {
        const safetensors_file *file = c->files[f];
        for (size_t i = 0; i < safetensors_count(file); i++) {
            const safetensors_tensor *tensor = safetensors_tensor_at(file, i);
            tensor_slot slot;
            if (!slot_from_name(tensor->name, config, &slot)) {
                if (!first_unexpected) first_unexpected = tensor->name, first_unexpected_file = safetensors_name(file);
                unexpected++;
                continue;
            }
            if (slot.scale_inv) {
                KITE_TRY(check_scale_owner(c, tensor, safetensors_name(file)));
                continue;
            }
            /* Tied: transformers points lm_head at embed_tokens and ignores a stored copy. */
            if (slot.kind == SLOT_LM_HEAD && config->tie_word_embeddings) continue;
            KITE_TRY(check_tensor(tensor, &slot, config, safetensors_name(file)));
            KITE_TRY(check_quantized(c, tensor, &slot, safetensors_name(file)));
            if (tensor->dtype == TENSOR_DTYPE_F8_E4M3) {
                const safetensors_tensor *scale;
                KITE_TRY(check_scale(c, tensor, safetensors_name(file), &scale));
            }
            found++;
        }
    }
    if (unexpected)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s: not a Qwen3 tensor for this config.json (%" PRIu64 " unexpected in all)",
                         first_unexpected_file, first_unexpected, unexpected);

    uint64_t expected = expected_count(config);
    if (found < expected) {
        /* Only `found` expected names are present, so one of the first found + 1 is missing. */
        char name[128];
        for (uint64_t index = 0; index < expected; index++) {
            expected_name(index, config, name, sizeof name);
            if (!find_anywhere(c, name)) break;
        }
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s is missing (%" PRIu64 " of %" PRIu64 " expected tensors missing)", dir, name,
                         expected - found, expected);
    }

    c->weights.layers = calloc((size_t)config->n_layers, sizeof *c->weights.layers);
    if (!c->weights.layers) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory for layer views", dir);
    for (size_t f = 0; f < c->n_files; f++) {
        const safetensors_file *file = c->files[f];
        for (size_t i = 0; i < safetensors_count(file); i++) {
            const safetensors_tensor *tensor = safetensors_tensor_at(file, i);
            tensor_slot slot;
            if (!slot_from_name(tensor->name, config, &slot)) continue;
            if (slot.scale_inv) {
                c->weight_bytes += (size_t)(tensor->data_end - tensor->data_begin);
                continue;
            }
            if (slot.kind == SLOT_LM_HEAD && config->tie_word_embeddings) continue;
            tensor_view *view = slot_view(&c->weights, &slot);
            view->dtype = tensor->dtype;
            view->n_dims = tensor->n_dims;
            view->shape[0] = tensor->shape[0];
            view->shape[1] = tensor->n_dims == 2 ? tensor->shape[1] : 0;
            view->data = tensor->data;
            if (tensor->dtype == TENSOR_DTYPE_F8_E4M3) {
                char name[160];
                snprintf(name, sizeof name, "%s" SCALE_SUFFIX, tensor->name);
                const safetensors_tensor *scale = find_anywhere(c, name); /* checked above */
                view->scale_inv = scale->data;
                view->scale_dtype = scale->dtype;
                view->block_rows = c->quantization.block_rows;
                view->block_cols = c->quantization.block_cols;
            }
            c->weight_bytes += (size_t)(tensor->data_end - tensor->data_begin);
        }
    }
    if (config->tie_word_embeddings) c->weights.lm_head = c->weights.embed_tokens;
    return KITE_OK;
}

/* ---- the shard index ------------------------------------------------------------------------------- */

typedef struct index_entry {
    const char *tensor; /* points into the index document */
    const char *shard;
    size_t file; /* position in checkpoint.files */
} index_entry;

static int compare_strings(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int compare_entries(const void *a, const void *b) {
    return strcmp(((const index_entry *)a)->tensor, ((const index_entry *)b)->tensor);
}

static const index_entry *index_find(const index_entry *entries, size_t n, const char *tensor) {
    index_entry key = {.tensor = tensor};
    return bsearch(&key, entries, n, sizeof *entries, compare_entries);
}

/* A shard must be a plain file name in the checkpoint directory: no paths, nothing hidden or odd. */
static bool shard_name_is_plain(const char *name, size_t length) {
    if (length == 0 || name[0] == '.' || strlen(name) != length) return false;
    for (size_t i = 0; i < length; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch < 0x20 || ch == 0x7f || ch == '/' || ch == '\\') return false;
    }
    return true;
}

static kite_status open_shards(checkpoint *c, const char *dir, const char *index_path, const json_value *root,
                               index_entry **entries_out, size_t *n_entries_out) {
    if (!json_is_object(root))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: top level must be a JSON object, found %s", index_path,
                         json_type_name(root->type));
    const json_value *map = json_object_member(root, "weight_map");
    if (!json_is_object(map))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field weight_map must be an object, found %s", index_path,
                         map ? json_type_name(map->type) : "nothing");
    if (map->length == 0) return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field weight_map is empty", index_path);

    size_t n = map->length;
    index_entry *entries = calloc(n, sizeof *entries);
    const char **shards = calloc(n, sizeof *shards);
    if (!entries || !shards) {
        free(entries);
        free(shards);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory reading the index", index_path);
    }
    *entries_out = entries;
    kite_status status = KITE_OK;
    for (size_t i = 0; i < n && status == KITE_OK; i++) {
        const json_member *member = &map->as.members[i];
        if (!json_is_string(&member->value))
            status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                               "%s: weight_map: tensor %.200s: shard must be a string, found %s", index_path,
                               member->key, json_type_name(member->value.type));
        else if (!shard_name_is_plain(member->value.as.string, member->value.length))
            status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                               "%s: weight_map: tensor %.200s: shard \"%.200s\" is not a plain file name", index_path,
                               member->key, member->value.as.string);
        entries[i].tensor = member->key;
        entries[i].shard = member->value.as.string;
        shards[i] = member->value.as.string;
    }
    if (status == KITE_OK) {
        qsort(entries, n, sizeof *entries, compare_entries);
        for (size_t i = 1; i < n && status == KITE_OK; i++)
            if (strcmp(entries[i - 1].tensor, entries[i].tensor) == 0)
                status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: weight_map lists tensor %.200s twice",
                                   index_path, entries[i].tensor);
    }
    size_t n_shards = 0;
    if (status == KITE_OK) {
        qsort(shards, n, sizeof *shards, compare_strings);
        for (size_t i = 0; i < n; i++)
            if (n_shards == 0 || strcmp(shards[n_shards - 1], shards[i]) != 0) shards[n_shards++] = shards[i];
        c->files = calloc(n_shards, sizeof *c->files);
        if (!c->files) status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", index_path);
    }
    for (size_t i = 0; i < n_shards && status == KITE_OK; i++) {
        char *path = path_join(dir, shards[i]);
        if (!path)
            status = KITE_ERROR_OUT_OF_MEMORY;
        else
            status = safetensors_open(path, &c->files[i]);
        free(path);
        if (status == KITE_OK) c->n_files++;
    }
    for (size_t i = 0; i < n && status == KITE_OK; i++) {
        const char **match = bsearch(&entries[i].shard, shards, n_shards, sizeof *shards, compare_strings);
        entries[i].file = (size_t)(match - shards); /* always found: shards came from these entries */
    }
    free(shards);
    *n_entries_out = n;
    return status;
}

/* Both directions: each listed tensor is in its shard, and each shard's tensor is listed for that shard. */
static kite_status check_index(const checkpoint *c, const char *index_path, const index_entry *entries, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const safetensors_file *file = c->files[entries[i].file];
        if (!safetensors_find(file, entries[i].tensor))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: tensor %.200s: the index places it in %s, which does not hold it", index_path,
                             entries[i].tensor, safetensors_name(file));
    }
    for (size_t f = 0; f < c->n_files; f++) {
        const safetensors_file *file = c->files[f];
        for (size_t i = 0; i < safetensors_count(file); i++) {
            const char *name = safetensors_tensor_at(file, i)->name;
            const index_entry *entry = index_find(entries, n, name);
            if (!entry)
                return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s: not listed in %s",
                                 safetensors_name(file), name, index_path);
            if (entry->file != f)
                return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s: the index places it in %s instead",
                                 safetensors_name(file), name, entry->shard);
        }
    }
    return KITE_OK;
}

static kite_status open_indexed(checkpoint *c, const char *dir, const char *index_path) {
    char *text = NULL;
    size_t length = 0;
    KITE_TRY(file_read_all(index_path, INDEX_MAX_BYTES, KITE_ERROR_INVALID_CHECKPOINT, &text, &length));
    size_t offset = 0;
    if (!json_scan_separators_within(text, length, INDEX_MAX_SEPARATORS, &offset)) {
        free(text);
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: byte %zu: more than %d commas and brackets (one per tensor)",
                         index_path, offset, INDEX_MAX_SEPARATORS);
    }
    json_error error;
    memset(&error, 0, sizeof error);
    json_document *document = json_parse(text, length, &error);
    free(text);
    if (!document)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: not valid JSON at line %d column %d: %s", index_path,
                         error.line, error.column, error.message);
    index_entry *entries = NULL;
    size_t n_entries = 0;
    kite_status status = open_shards(c, dir, index_path, json_root(document), &entries, &n_entries);
    if (status == KITE_OK) status = check_index(c, index_path, entries, n_entries);
    free(entries);
    json_free(document);
    return status;
}

static kite_status open_files(checkpoint *c, const char *dir) {
    char *single = path_join(dir, SINGLE_FILE_NAME);
    if (!single) return KITE_ERROR_OUT_OF_MEMORY;
    kite_status status;
    if (path_exists(single)) {
        c->files = calloc(1, sizeof *c->files);
        if (!c->files)
            status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", single);
        else
            status = safetensors_open(single, &c->files[0]);
        if (status == KITE_OK) c->n_files = 1;
        free(single);
        return status;
    }
    free(single);
    char *index_path = path_join(dir, INDEX_FILE_NAME);
    if (!index_path) return KITE_ERROR_OUT_OF_MEMORY;
    if (path_exists(index_path))
        status = open_indexed(c, dir, index_path);
    else
        status = kite_fail(KITE_ERROR_IO, "%s: no " SINGLE_FILE_NAME " or " INDEX_FILE_NAME " found", dir);
    free(index_path);
    return status;
}

kite_status checkpoint_open(const char *dir, checkpoint **out) { return checkpoint_open_overriding(dir, NULL, out); }

kite_status checkpoint_open_overriding(const char *dir, const char *rope_scaling, checkpoint **out) {
    if (!dir || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "checkpoint_open: NULL argument");
    *out = NULL;
    checkpoint *c = calloc(1, sizeof *c);
    if (!c) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", dir);
    kite_status status = qwen3_config_load_overriding(dir, rope_scaling, &c->config);
    if (status == KITE_OK) status = checkpoint_quantization_load(dir, &c->quantization);
    if (status == KITE_OK) status = open_files(c, dir);
    if (status == KITE_OK) status = bind_weights(c, dir);
    if (status != KITE_OK) {
        checkpoint_close(c);
        return status;
    }
    *out = c;
    return KITE_OK;
}

const qwen3_config *checkpoint_config(const checkpoint *c) { return &c->config; }

const qwen3_weights *checkpoint_weights(const checkpoint *c) { return &c->weights; }

size_t checkpoint_weight_bytes(const checkpoint *c) { return c->weight_bytes; }
size_t checkpoint_file_count(const checkpoint *c) { return c->n_files; }
const safetensors_file *checkpoint_file(const checkpoint *c, size_t index) {
    return index < c->n_files ? c->files[index] : NULL;
}

void checkpoint_close(checkpoint *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_files; i++) safetensors_close(c->files[i]);
    free(c->files);
    free(c->weights.layers);
    checkpoint_quantization_free(&c->quantization);
    free(c);
}

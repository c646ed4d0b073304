#include "checkpoint/config.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/file.h"
#include "util/error.h"
#include "util/json.h"

/* A real config.json is a few kilobytes; anything this large is not one (and would cost memory to parse). */
#define CONFIG_MAX_BYTES ((size_t)1 << 20)

/* transformers' Qwen3Config(head_dim=128): what a config.json without head_dim means. */
#define QWEN3_DEFAULT_HEAD_DIM 128

/* How a JSON value reads in a message: its type, or the integer itself. */
static const char *describe_type(const json_value *value) {
    if (value->type == JSON_TYPE_NUMBER && !value->is_integer) return "a non-integer number";
    return json_type_name(value->type);
}

/* Reads an int32 field. `required` fields must be present and non-null; optional ones leave *out alone
 * when absent or null and set *present accordingly. Values below `minimum` are errors. */
static kite_status read_int32(const json_value *root, const char *path, const char *key, bool required, int64_t minimum,
                              int32_t *out, bool *present) {
    const json_value *value = json_object_member(root, key);
    if (present) *present = false;
    if (!value || json_is_null(value)) {
        if (required) return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s is missing", path, key);
        return KITE_OK;
    }
    int64_t integer;
    if (!json_get_int64(value, &integer))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s must be an integer, found %s", path, key,
                         describe_type(value));
    if (integer < minimum || integer > INT32_MAX)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s is %lld, must be in [%lld, %d]", path, key,
                         (long long)integer, (long long)minimum, INT32_MAX);
    *out = (int32_t)integer;
    if (present) *present = true;
    return KITE_OK;
}

/* Reads a positive finite number field from `object`; `label` names it in messages. */
static kite_status read_positive_double(const json_value *value, const char *path, const char *label, double *out) {
    double number;
    if (!json_get_double(value, &number))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s must be a number, found %s", path, label,
                         json_type_name(value->type));
    if (!isfinite(number) || !(number > 0.0))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s is %g, must be a positive number", path, label,
                         number);
    *out = number;
    return KITE_OK;
}

/* Reads an optional boolean (absent or null -> default_value). */
static kite_status read_bool(const json_value *root, const char *path, const char *key, bool default_value, bool *out) {
    const json_value *value = json_object_member(root, key);
    *out = default_value;
    if (!value || json_is_null(value)) return KITE_OK;
    if (!json_get_bool(value, out))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s must be true or false, found %s", path, key,
                         json_type_name(value->type));
    return KITE_OK;
}

static kite_status check_architecture(const json_value *root, const char *path) {
    const json_value *model_type = json_object_member(root, "model_type");
    const json_value *architectures = json_object_member(root, "architectures");
    bool known = false;
    if (model_type && !json_is_null(model_type)) {
        if (!json_is_string(model_type))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field model_type must be a string, found %s", path,
                             json_type_name(model_type->type));
        if (strcmp(model_type->as.string, "qwen3") != 0)
            return kite_fail(KITE_ERROR_UNSUPPORTED,
                             "%s: field model_type is \"%.64s\"; kite supports only \"qwen3\" (dense Qwen3)", path,
                             model_type->as.string);
        known = true;
    }
    if (architectures && !json_is_null(architectures)) {
        if (!json_is_array(architectures))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field architectures must be an array, found %s", path,
                             json_type_name(architectures->type));
        bool found = false;
        for (size_t i = 0; i < architectures->length; i++) {
            const json_value *item = &architectures->as.items[i];
            if (!json_is_string(item))
                return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                                 "%s: field architectures[%zu] must be a string, found %s", path, i,
                                 json_type_name(item->type));
            if (strcmp(item->as.string, "Qwen3ForCausalLM") == 0) found = true;
        }
        if (!found) {
            const char *first = architectures->length > 0 ? architectures->as.items[0].as.string : "";
            return kite_fail(KITE_ERROR_UNSUPPORTED,
                             "%s: field architectures [\"%.64s\"%s] does not contain Qwen3ForCausalLM", path, first,
                             architectures->length > 1 ? ", ..." : "");
        }
        known = true;
    }
    if (!known)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: neither field model_type nor field architectures says this is a Qwen3 model", path);
    return KITE_OK;
}

/* Features Qwen3Config can express that kite does not implement. */
static kite_status check_unsupported_features(const json_value *root, const char *path, int32_t n_layers) {
    bool flag;
    KITE_TRY(read_bool(root, path, "attention_bias", false, &flag));
    if (flag)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: field attention_bias is true; kite supports only false", path);
    KITE_TRY(read_bool(root, path, "use_sliding_window", false, &flag));
    if (flag)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: field use_sliding_window is true; kite supports only full attention", path);

    const json_value *act = json_object_member(root, "hidden_act");
    if (act && !json_is_null(act)) {
        if (!json_is_string(act))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field hidden_act must be a string, found %s", path,
                             json_type_name(act->type));
        /* transformers' ACT2FN maps both "silu" and "swish" to SiLU */
        if (strcmp(act->as.string, "silu") != 0 && strcmp(act->as.string, "swish") != 0)
            return kite_fail(KITE_ERROR_UNSUPPORTED,
                             "%s: field hidden_act is \"%.64s\"; kite supports only \"silu\" (or \"swish\")", path,
                             act->as.string);
    }

    /* quantization_config is checkpoint/quantization.c's: it decides how the weights are stored. */

    /* transformers 4.54+ may list each layer's attention kind; only full attention is implemented. */
    const json_value *layer_types = json_object_member(root, "layer_types");
    if (layer_types && !json_is_null(layer_types)) {
        if (!json_is_array(layer_types))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field layer_types must be an array, found %s", path,
                             json_type_name(layer_types->type));
        if (layer_types->length != (size_t)n_layers)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: field layer_types has %zu entries but num_hidden_layers is %d", path,
                             layer_types->length, n_layers);
        for (size_t i = 0; i < layer_types->length; i++) {
            const json_value *item = &layer_types->as.items[i];
            if (!json_is_string(item))
                return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field layer_types[%zu] must be a string, found %s",
                                 path, i, json_type_name(item->type));
            if (strcmp(item->as.string, "full_attention") != 0)
                return kite_fail(KITE_ERROR_UNSUPPORTED,
                                 "%s: field layer_types[%zu] is \"%.64s\"; kite supports only \"full_attention\"", path,
                                 i, item->as.string);
        }
    }
    return KITE_OK;
}

/* partial_rotary_factor (top level, or inside the RoPE object, where transformers 5 reads it): kite rotates
 * every dimension of a head, so only 1 (or absent) is accepted. */
static kite_status check_full_rotation(const json_value *value, const char *path, const char *label) {
    if (!value || json_is_null(value)) return KITE_OK;
    double factor;
    if (!json_get_double(value, &factor))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s must be a number, found %s", path, label,
                         json_type_name(value->type));
    if (factor != 1.0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: field %s is %g; kite rotates whole heads (only 1 is supported)",
                         path, label, factor);
    return KITE_OK;
}

/* One RoPE object, `rope_scaling` (transformers 4's name, which transformers 5 still reads first) or
 * `rope_parameters` (transformers 5). Its type is `rope_type` or the legacy `type`: transformers 4 copies
 * `type` over `rope_type`, transformers 5 keeps `rope_type`, so the two must agree. kite implements only the
 * default rotation; every scaling type (linear, dynamic, yarn, longrope, llama3, ...) is refused. A
 * rope_scaling without a type is refused (transformers 4 fails on it); rope_parameters without one is
 * "default", as transformers 5 reads it. A rope_theta inside counts (transformers 5 reads it there). */
static kite_status read_rope_object(const json_value *root, const char *path, const char *field, bool type_required,
                                    bool *have_theta, double *theta) {
    *have_theta = false;
    const json_value *object = json_object_member(root, field);
    if (!object || json_is_null(object)) return KITE_OK;
    if (!json_is_object(object))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s must be an object or null, found %s", path,
                         field, json_type_name(object->type));
    static const char *const type_keys[] = {"rope_type", "type"};
    const char *type = NULL, *type_key = NULL;
    for (size_t i = 0; i < 2; i++) {
        const json_value *value = json_object_member(object, type_keys[i]);
        if (!value || json_is_null(value)) continue;
        if (!json_is_string(value))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s.%s must be a string, found %s", path, field,
                             type_keys[i], json_type_name(value->type));
        if (type && strcmp(type, value->as.string) != 0)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: field %s.rope_type is \"%.64s\" but %s.type is \"%.64s\"", path, field, type, field,
                             value->as.string);
        if (!type) {
            type = value->as.string;
            type_key = type_keys[i];
        }
    }
    if (!type && type_required)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s names no rope_type (or type)", path, field);
    if (type && strcmp(type, "default") != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: field %s.%s is \"%.64s\"; kite implements only \"default\" (unscaled) RoPE", path, field,
                         type_key, type);
    char label[64];
    snprintf(label, sizeof label, "%s.partial_rotary_factor", field);
    KITE_TRY(check_full_rotation(json_object_member(object, "partial_rotary_factor"), path, label));
    const json_value *nested = json_object_member(object, "rope_theta");
    if (nested && !json_is_null(nested)) {
        snprintf(label, sizeof label, "%s.rope_theta", field);
        KITE_TRY(read_positive_double(nested, path, label, theta));
        *have_theta = true;
    }
    return KITE_OK;
}

/* rope_theta: top level (hub), rope_parameters.rope_theta (transformers 5) or rope_scaling.rope_theta
 * (transformers 5 reads rope_scaling as rope_parameters). Any that are present must agree. */
static kite_status read_rope(const json_value *root, const char *path, double *theta) {
    KITE_TRY(check_full_rotation(json_object_member(root, "partial_rotary_factor"), path, "partial_rotary_factor"));
    static const char *const labels[] = {"rope_theta", "rope_parameters.rope_theta", "rope_scaling.rope_theta"};
    double thetas[3] = {0.0, 0.0, 0.0};
    bool have[3] = {false, false, false};
    const json_value *top = json_object_member(root, "rope_theta");
    if (top && !json_is_null(top)) {
        KITE_TRY(read_positive_double(top, path, "rope_theta", &thetas[0]));
        have[0] = true;
    }
    KITE_TRY(read_rope_object(root, path, "rope_parameters", false, &have[1], &thetas[1]));
    KITE_TRY(read_rope_object(root, path, "rope_scaling", true, &have[2], &thetas[2]));
    int first = -1;
    for (int i = 0; i < 3; i++) {
        if (!have[i]) continue;
        if (first < 0)
            first = i;
        else if (thetas[i] != thetas[first])
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s is %g but %s is %g", path, labels[first],
                             thetas[first], labels[i], thetas[i]);
    }
    if (first < 0)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: field rope_theta is missing (neither top level nor in rope_parameters)", path);
    *theta = thetas[first];
    return KITE_OK;
}

static kite_status read_token_id(const json_value *value, const char *path, const char *label, int32_t vocab_size,
                                 int32_t *out) {
    int64_t id;
    if (!json_get_int64(value, &id))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s must be an integer token id, found %s", path,
                         label, describe_type(value));
    if (id < 0 || id >= vocab_size)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s is %lld, outside the vocabulary [0, %d)", path,
                         label, (long long)id, vocab_size);
    *out = (int32_t)id;
    return KITE_OK;
}

static kite_status read_special_tokens(const json_value *root, const char *path, qwen3_config *config) {
    config->bos_token_id = -1;
    const json_value *bos = json_object_member(root, "bos_token_id");
    if (bos && !json_is_null(bos))
        KITE_TRY(read_token_id(bos, path, "bos_token_id", config->vocab_size, &config->bos_token_id));

    config->n_eos_ids = 0;
    const json_value *eos = json_object_member(root, "eos_token_id");
    if (!eos || json_is_null(eos)) return KITE_OK;
    if (json_is_array(eos)) {
        if (eos->length > QWEN3_MAX_EOS_IDS)
            return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: field eos_token_id lists %zu ids; kite supports at most %d",
                             path, eos->length, QWEN3_MAX_EOS_IDS);
        for (size_t i = 0; i < eos->length; i++) {
            char label[40];
            snprintf(label, sizeof label, "eos_token_id[%zu]", i);
            KITE_TRY(read_token_id(&eos->as.items[i], path, label, config->vocab_size, &config->eos_ids[i]));
        }
        config->n_eos_ids = (int32_t)eos->length;
        return KITE_OK;
    }
    KITE_TRY(read_token_id(eos, path, "eos_token_id", config->vocab_size, &config->eos_ids[0]));
    config->n_eos_ids = 1;
    return KITE_OK;
}

/* `dtype` (transformers 4.56+) wins over the older `torch_dtype`; absent means the hub's usual bfloat16. */
static kite_status read_dtype(const json_value *root, const char *path, tensor_dtype *out) {
    const char *key = "dtype";
    const json_value *value = json_object_member(root, key);
    if (!value || json_is_null(value)) {
        key = "torch_dtype";
        value = json_object_member(root, key);
    }
    *out = TENSOR_DTYPE_BF16;
    if (!value || json_is_null(value)) return KITE_OK;
    if (!json_is_string(value))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s must be a string, found %s", path, key,
                         json_type_name(value->type));
    const char *name = value->as.string;
    if (strcmp(name, "bfloat16") == 0)
        *out = TENSOR_DTYPE_BF16;
    else if (strcmp(name, "float16") == 0)
        *out = TENSOR_DTYPE_F16;
    else if (strcmp(name, "float32") == 0)
        *out = TENSOR_DTYPE_F32;
    else
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: field %s is \"%.64s\"; kite supports bfloat16, float16 and float32", path, key, name);
    return KITE_OK;
}

static kite_status config_from_json(const json_value *root, const char *path, qwen3_config *config) {
    if (!json_is_object(root))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: top level must be a JSON object, found %s", path,
                         json_type_name(root->type));
    KITE_TRY(check_architecture(root, path));

    KITE_TRY(read_int32(root, path, "vocab_size", true, 1, &config->vocab_size, NULL));
    KITE_TRY(read_int32(root, path, "hidden_size", true, 1, &config->hidden_size, NULL));
    KITE_TRY(read_int32(root, path, "intermediate_size", true, 1, &config->intermediate_size, NULL));
    KITE_TRY(read_int32(root, path, "num_hidden_layers", true, 1, &config->n_layers, NULL));
    KITE_TRY(read_int32(root, path, "num_attention_heads", true, 1, &config->n_heads, NULL));
    KITE_TRY(read_int32(root, path, "max_position_embeddings", true, 1, &config->max_position_embeddings, NULL));

    /* Qwen3Config: num_key_value_heads None -> num_attention_heads (plain multi-head attention). */
    bool present;
    config->n_kv_heads = config->n_heads;
    KITE_TRY(read_int32(root, path, "num_key_value_heads", false, 1, &config->n_kv_heads, &present));
    if (config->n_heads % config->n_kv_heads != 0)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: field num_attention_heads %d is not divisible by num_key_value_heads %d", path,
                         config->n_heads, config->n_kv_heads);

    /* Qwen3 gives head_dim explicitly (0.6B: 16 heads x 128 != hidden 1024), so it need not divide hidden.
     * Absent, it is Qwen3Config's default 128 (the attention reads config.head_dim, never hidden / heads);
     * null fails in transformers (4: arithmetic on None; 5: not an int), so it is refused here. */
    const json_value *head_dim = json_object_member(root, "head_dim");
    if (json_is_null(head_dim))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field head_dim is null; it must be an integer", path);
    config->head_dim = QWEN3_DEFAULT_HEAD_DIM;
    KITE_TRY(read_int32(root, path, "head_dim", false, 1, &config->head_dim, &present));
    if ((int64_t)config->n_heads * config->head_dim > INT32_MAX)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: field num_attention_heads %d x head_dim %d overflows a 32-bit size", path,
                         config->n_heads, config->head_dim);

    const json_value *eps = json_object_member(root, "rms_norm_eps");
    if (!eps || json_is_null(eps))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field rms_norm_eps is missing", path);
    KITE_TRY(read_positive_double(eps, path, "rms_norm_eps", &config->rms_norm_eps));
    KITE_TRY(read_rope(root, path, &config->rope_theta));

    /* transformers' Qwen3Config defaults tie_word_embeddings to false. */
    KITE_TRY(read_bool(root, path, "tie_word_embeddings", false, &config->tie_word_embeddings));
    KITE_TRY(read_special_tokens(root, path, config));
    KITE_TRY(read_dtype(root, path, &config->dtype));
    KITE_TRY(check_unsupported_features(root, path, config->n_layers));
    return KITE_OK;
}

kite_status qwen3_config_parse(const char *text, size_t length, const char *path, qwen3_config *out) {
    if (!text || !out || !path) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "qwen3_config_parse: NULL argument");
    json_error error;
    memset(&error, 0, sizeof error);
    json_document *document = json_parse(text, length, &error);
    if (!document)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: not valid JSON at line %d column %d: %s", path, error.line,
                         error.column, error.message);
    qwen3_config config;
    memset(&config, 0, sizeof config);
    kite_status status = config_from_json(json_root(document), path, &config);
    json_free(document);
    if (status == KITE_OK) *out = config;
    return status;
}

kite_status qwen3_config_load(const char *dir, qwen3_config *out) {
    if (!dir || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "qwen3_config_load: NULL argument");
    char *path = path_join(dir, "config.json");
    if (!path) return KITE_ERROR_OUT_OF_MEMORY;
    char *text = NULL;
    size_t length = 0;
    kite_status status = file_read_all(path, CONFIG_MAX_BYTES, KITE_ERROR_INVALID_CHECKPOINT, &text, &length);
    if (status == KITE_OK) status = qwen3_config_parse(text, length, path, out);
    free(text);
    free(path);
    return status;
}

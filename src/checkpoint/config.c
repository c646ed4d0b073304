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

/* The longest context kite addresses: positions are float32 in the RoPE angle (exact below 2^24). */
#define CONFIG_MAX_CONTEXT (1 << 24)

/* One RoPE object: `rope_scaling` (transformers 4's name, which transformers 5 still reads first),
 * `rope_parameters` (transformers 5) or a rope scaling override (kite_load_params.rope_scaling). */
typedef struct rope_object {
    const json_value *object; /* NULL when absent or null */
    const char *path;         /* the file (or the override) in messages */
    const char *field;        /* "rope_scaling", "rope_parameters" */
    const char *type;         /* rope_type or the legacy type; NULL when neither is given */
    const char *type_key;
    bool have_theta;
    double theta;
} rope_object;

/* Reads one RoPE object's type and rope_theta. Its type is `rope_type` or the legacy `type`: transformers 4
 * copies `type` over `rope_type`, transformers 5 keeps `rope_type` (standardize_rope_params), so the two must
 * agree. A rope_scaling without a type is refused (transformers 4 fails on it); rope_parameters without one is
 * "default", as transformers 5 reads it. */
static kite_status read_rope_object(const json_value *object, const char *path, const char *field, bool type_required,
                                    rope_object *out) {
    *out = (rope_object){.path = path, .field = field};
    if (!object || json_is_null(object)) return KITE_OK;
    if (!json_is_object(object))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s must be an object or null, found %s", path,
                         field, json_type_name(object->type));
    out->object = object;
    static const char *const type_keys[] = {"rope_type", "type"};
    for (size_t i = 0; i < 2; i++) {
        const json_value *value = json_object_member(object, type_keys[i]);
        if (!value || json_is_null(value)) continue;
        if (!json_is_string(value))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s.%s must be a string, found %s", path, field,
                             type_keys[i], json_type_name(value->type));
        if (out->type && strcmp(out->type, value->as.string) != 0)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: field %s.rope_type is \"%.64s\" but %s.type is \"%.64s\"", path, field, out->type,
                             field, value->as.string);
        if (!out->type) {
            out->type = value->as.string;
            out->type_key = type_keys[i];
        }
    }
    if (!out->type && type_required)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s names no rope_type (or type)", path, field);
    char label[64];
    snprintf(label, sizeof label, "%s.partial_rotary_factor", field);
    KITE_TRY(check_full_rotation(json_object_member(object, "partial_rotary_factor"), path, label));
    const json_value *nested = json_object_member(object, "rope_theta");
    if (nested && !json_is_null(nested)) {
        snprintf(label, sizeof label, "%s.rope_theta", field);
        KITE_TRY(read_positive_double(nested, path, label, &out->theta));
        out->have_theta = true;
    }
    return KITE_OK;
}

static bool rope_object_scales(const rope_object *r) { return r->type && strcmp(r->type, "default") != 0; }

/* A YaRN number: *present is false when it is absent or null. Booleans and strings are refused (Python would
 * take true as 1, and fail on a string). */
static kite_status read_yarn_number(const rope_object *r, const char *key, double *out, bool *present) {
    *present = false;
    const json_value *value = json_object_member(r->object, key);
    if (!value || json_is_null(value)) return KITE_OK;
    if (!json_get_double(value, out))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s.%s must be a finite number, found %s", r->path,
                         r->field, key, json_type_name(value->type));
    *present = true;
    return KITE_OK;
}

/* get_mscale of transformers' _compute_yarn_parameters, in Python float arithmetic. */
static double yarn_get_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

/* A YaRN object, read as transformers 5 reads it: standardize_rope_params (configuration_utils.py) fills in
 * original_max_position_embeddings, _compute_yarn_parameters (modeling_rope_utils.py) the rest. What
 * _validate_yarn_rope_parameters only warns about (an unknown key, factor < 1, beta_fast < beta_slow) and what
 * would fail in Python or compute nonsense (a negative beta, an attention factor <= 0) is refused.
 * top_original (> 0) is a top-level original_max_position_embeddings. */
static kite_status read_yarn(const rope_object *r, int32_t max_position_embeddings, int32_t top_original,
                             qwen3_yarn *out) {
    static const char *const known[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
                                        "original_max_position_embeddings", "attention_factor", "beta_fast",
                                        "beta_slow", "mscale", "mscale_all_dim", "truncate"};
    for (size_t m = 0; m < r->object->length; m++) {
        const char *key = r->object->as.members[m].key;
        bool is_known = false;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) is_known |= strcmp(key, known[k]) == 0;
        if (!is_known)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: field %s.%.64s is not a YaRN parameter (those are factor, "
                             "original_max_position_embeddings, attention_factor, beta_fast, beta_slow, mscale, "
                             "mscale_all_dim, truncate, rope_theta)",
                             r->path, r->field, key);
    }

    /* original_max_position_embeddings: standardize_rope_params gives a top-level one priority (Phi3 keeps it
     * there), else defaults it to max_position_embeddings; kite refuses the two when they differ. */
    const json_value *inner = json_object_member(r->object, "original_max_position_embeddings");
    int32_t original = top_original > 0 ? top_original : max_position_embeddings;
    if (inner) {
        int64_t integer;
        if (!json_get_int64(inner, &integer))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: field %s.original_max_position_embeddings must be an integer, found %s", r->path,
                             r->field, describe_type(inner));
        if (integer < 1 || integer > CONFIG_MAX_CONTEXT)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: field %s.original_max_position_embeddings is %lld, must be in [1, %d]", r->path,
                             r->field, (long long)integer, CONFIG_MAX_CONTEXT);
        if (top_original > 0 && integer != top_original)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: field %s.original_max_position_embeddings is %lld but the top-level "
                             "original_max_position_embeddings is %d",
                             r->path, r->field, (long long)integer, top_original);
        original = (int32_t)integer;
    }
    out->original_max_positions = original;

    /* factor: required (_check_received_keys); null means max_position_embeddings / original, as
     * _compute_yarn_parameters reads it. Below 1 it would shrink the context (the validation warns). */
    bool present;
    if (!json_object_member(r->object, "factor"))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s.factor is missing (YaRN requires it)", r->path,
                         r->field);
    KITE_TRY(read_yarn_number(r, "factor", &out->factor, &present));
    if (!present) out->factor = (double)max_position_embeddings / (double)original;
    if (!(out->factor >= 1.0))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s.factor is %g, must be at least 1", r->path,
                         r->field, out->factor);

    /* beta_fast / beta_slow: `get("beta_fast") or 32`, `get("beta_slow") or 1`: absent, null or 0 is the
     * default. A negative one is a math domain error in find_correction_dim's log. */
    KITE_TRY(read_yarn_number(r, "beta_fast", &out->beta_fast, &present));
    if (!present || out->beta_fast == 0.0) out->beta_fast = 32.0;
    KITE_TRY(read_yarn_number(r, "beta_slow", &out->beta_slow, &present));
    if (!present || out->beta_slow == 0.0) out->beta_slow = 1.0;
    if (out->beta_fast < 0.0 || out->beta_slow < 0.0)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s.%s is %g, must be positive", r->path, r->field,
                         out->beta_fast < 0.0 ? "beta_fast" : "beta_slow",
                         out->beta_fast < 0.0 ? out->beta_fast : out->beta_slow);
    if (out->beta_fast < out->beta_slow)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: field %s.beta_fast (%g) must not be below beta_slow (%g)", r->path, r->field,
                         out->beta_fast, out->beta_slow);

    /* truncate: `rope_parameters.get("truncate", True)`; an explicit null would read as false in Python, which
     * is too easy to write by accident, so only true and false are taken. */
    const json_value *truncate = json_object_member(r->object, "truncate");
    out->truncate = true;
    if (truncate && !json_get_bool(truncate, &out->truncate))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s.truncate must be true or false, found %s",
                         r->path, r->field, json_type_name(truncate->type));

    /* attention_factor: given, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both
     * are truthy, else get_mscale(factor). */
    double attention, mscale = 0.0, mscale_all_dim = 0.0;
    bool have_mscale, have_mscale_all_dim;
    KITE_TRY(read_yarn_number(r, "mscale", &mscale, &have_mscale));
    KITE_TRY(read_yarn_number(r, "mscale_all_dim", &mscale_all_dim, &have_mscale_all_dim));
    KITE_TRY(read_yarn_number(r, "attention_factor", &attention, &present));
    const char *attention_source = "attention_factor";
    if (!present) {
        if (mscale != 0.0 && mscale_all_dim != 0.0) {
            attention = yarn_get_mscale(out->factor, mscale) / yarn_get_mscale(out->factor, mscale_all_dim);
            attention_source = "attention factor from mscale / mscale_all_dim";
        } else {
            attention = yarn_get_mscale(out->factor, 1.0);
            attention_source = "attention factor from factor";
        }
    }
    if (!isfinite(attention) || !(attention > 0.0))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s: the %s is %g, must be a positive number",
                         r->path, r->field, attention_source, attention);
    out->attention_factor = attention;
    return KITE_OK;
}

/* RoPE: rope_theta from the top level (hub), rope_parameters.rope_theta (transformers 5) or
 * rope_scaling.rope_theta (transformers 5 reads rope_scaling as rope_parameters), which must agree where
 * several are present; the scaling from rope_scaling, else rope_parameters (transformers 5 takes `rope_scaling or
 * rope_parameters`), or from `override` (a JSON object, labelled
 * override_path in messages), which replaces both. kite implements the default rotation and YaRN; every other
 * type (linear, dynamic, longrope, llama3, ...) is refused by name. */
static kite_status read_rope(const json_value *root, const char *path, const json_value *override,
                             const char *override_path, qwen3_config *config) {
    KITE_TRY(check_full_rotation(json_object_member(root, "partial_rotary_factor"), path, "partial_rotary_factor"));
    rope_object objects[3];
    KITE_TRY(read_rope_object(json_object_member(root, "rope_parameters"), path, "rope_parameters", false,
                              &objects[0]));
    KITE_TRY(read_rope_object(json_object_member(root, "rope_scaling"), path, "rope_scaling", true, &objects[1]));
    KITE_TRY(read_rope_object(override, override_path, "rope_scaling", true, &objects[2]));
    if (override && !objects[2].object)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: must be a JSON object", override_path);

    bool have_theta = false;
    const char *theta_path = path, *theta_label = "rope_theta";
    char labels[3][40];
    const json_value *top = json_object_member(root, "rope_theta");
    if (top && !json_is_null(top)) {
        KITE_TRY(read_positive_double(top, path, "rope_theta", &config->rope_theta));
        have_theta = true;
    }
    for (int i = 0; i < 3; i++) {
        const rope_object *r = &objects[i];
        if (!r->have_theta) continue;
        snprintf(labels[i], sizeof labels[i], "%s.rope_theta", r->field);
        if (!have_theta) {
            config->rope_theta = r->theta;
            theta_path = r->path;
            theta_label = labels[i];
            have_theta = true;
        } else if (r->theta != config->rope_theta) {
            if (theta_path == r->path)
                return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s is %g but %s is %g", path, theta_label,
                                 config->rope_theta, labels[i], r->theta);
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field %s is %g but %s: field %s is %g", theta_path,
                             theta_label, config->rope_theta, r->path, labels[i], r->theta);
        }
    }
    if (!have_theta)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: field rope_theta is missing (neither top level nor in rope_parameters)", path);

    const rope_object *scaling = NULL;
    if (override) {
        scaling = &objects[2];
    } else {
        /* transformers (4 and 5) reads rope_scaling whenever it is there; a rope_parameters naming a scaling
         * beside it would be ignored, so that file is refused rather than read as the writer did not mean. */
        if (objects[1].object && rope_object_scales(&objects[0]))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: fields rope_scaling (\"%.64s\") and rope_parameters (\"%.64s\") are both present "
                             "and rope_parameters names a RoPE scaling; keep one",
                             path, objects[1].type, objects[0].type);
        scaling = objects[1].object ? &objects[1] : &objects[0];
    }

    /* A top-level original_max_position_embeddings counts for YaRN (standardize_rope_params). */
    int32_t top_original = 0;
    bool have_top_original;
    KITE_TRY(read_int32(root, path, "original_max_position_embeddings", false, 1, &top_original, &have_top_original));
    if (top_original > CONFIG_MAX_CONTEXT)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: field original_max_position_embeddings is %d; kite supports at "
                         "most %d", path, top_original, CONFIG_MAX_CONTEXT);

    config->rope_yarn = false;
    config->context_limit = config->max_position_embeddings;
    if (!rope_object_scales(scaling)) return KITE_OK;
    if (strcmp(scaling->type, "yarn") != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: field %s.%s is \"%.64s\"; kite implements only \"default\" (unscaled) and \"yarn\" RoPE",
                         scaling->path, scaling->field, scaling->type_key, scaling->type);
    KITE_TRY(read_yarn(scaling, config->max_position_embeddings, top_original, &config->yarn));
    /* The context YaRN reaches: factor x the pretraining context (as vLLM derives its max_model_len). */
    double limit = floor(config->yarn.factor * (double)config->yarn.original_max_positions);
    if (limit > (double)CONFIG_MAX_CONTEXT)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: field %s: factor %g x original_max_position_embeddings %d is %.0f positions; kite "
                         "supports at most %d",
                         scaling->path, scaling->field, config->yarn.factor, config->yarn.original_max_positions,
                         limit, CONFIG_MAX_CONTEXT);
    config->rope_yarn = true;
    config->context_limit = (int32_t)limit;
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

static kite_status config_from_json(const json_value *root, const char *path, const json_value *rope_override,
                                    qwen3_config *config) {
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
    if (config->max_position_embeddings > CONFIG_MAX_CONTEXT)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: field max_position_embeddings is %d; kite supports at most %d",
                         path, config->max_position_embeddings, CONFIG_MAX_CONTEXT);
    KITE_TRY(read_rope(root, path, rope_override, QWEN3_ROPE_OVERRIDE_LABEL, config));

    /* transformers' Qwen3Config defaults tie_word_embeddings to false. */
    KITE_TRY(read_bool(root, path, "tie_word_embeddings", false, &config->tie_word_embeddings));
    KITE_TRY(read_special_tokens(root, path, config));
    KITE_TRY(read_dtype(root, path, &config->dtype));
    KITE_TRY(check_unsupported_features(root, path, config->n_layers));
    return KITE_OK;
}

kite_status qwen3_config_parse_overriding(const char *text, size_t length, const char *path, const char *rope_scaling,
                                         qwen3_config *out) {
    if (!text || !out || !path)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "qwen3_config_parse: NULL argument");
    json_error error;
    memset(&error, 0, sizeof error);
    json_document *override = NULL;
    if (rope_scaling) {
        override = json_parse(rope_scaling, strlen(rope_scaling), &error);
        if (!override)
            return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "%s: not valid JSON at column %d: %s",
                             QWEN3_ROPE_OVERRIDE_LABEL, error.column, error.message);
    }
    json_document *document = json_parse(text, length, &error);
    if (!document) {
        json_free(override);
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: not valid JSON at line %d column %d: %s", path, error.line,
                         error.column, error.message);
    }
    qwen3_config config;
    memset(&config, 0, sizeof config);
    kite_status status = config_from_json(json_root(document), path, override ? json_root(override) : NULL, &config);
    json_free(document);
    json_free(override);
    if (status == KITE_OK) *out = config;
    return status;
}

kite_status qwen3_config_parse(const char *text, size_t length, const char *path, qwen3_config *out) {
    return qwen3_config_parse_overriding(text, length, path, NULL, out);
}

kite_status qwen3_config_load_overriding(const char *dir, const char *rope_scaling, qwen3_config *out) {
    if (!dir || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "qwen3_config_load: NULL argument");
    char *path = path_join(dir, "config.json");
    if (!path) return KITE_ERROR_OUT_OF_MEMORY;
    char *text = NULL;
    size_t length = 0;
    kite_status status = file_read_all(path, CONFIG_MAX_BYTES, KITE_ERROR_INVALID_CHECKPOINT, &text, &length);
    if (status == KITE_OK) status = qwen3_config_parse_overriding(text, length, path, rope_scaling, out);
    free(text);
    free(path);
    return status;
}

kite_status qwen3_config_load(const char *dir, qwen3_config *out) {
    return qwen3_config_load_overriding(dir, NULL, out);
}

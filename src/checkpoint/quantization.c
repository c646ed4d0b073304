#include "checkpoint/quantization.h"

#include <stdlib.h>
#include <string.h>

#include "quant/fp8.h"
#include "util/error.h"
#include "util/file.h"

/* As config.c's bound: a real config.json is a few kilobytes. */
#define CONFIG_MAX_BYTES ((size_t)1 << 20)
#define FIELD "quantization_config"

/* A string field with a default when absent or null; *out points into the document. */
static kite_status read_string(const json_value *object, const char *path, const char *key, const char *fallback,
                               const char **out) {
    const json_value *value = json_object_member(object, key);
    *out = fallback;
    if (!value || json_is_null(value)) return KITE_OK;
    if (!json_is_string(value))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field " FIELD ".%s must be a string, found %s", path, key,
                         json_type_name(value->type));
    *out = value->as.string;
    return KITE_OK;
}

static kite_status read_block_size(const json_value *object, const char *path, checkpoint_quantization *out) {
    const json_value *value = json_object_member(object, "weight_block_size");
    if (!value || json_is_null(value))
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: field " FIELD ".weight_block_size is missing: one scale per tensor is not supported; "
                         "kite reads [%d, %d] block scales",
                         path, FP8_BLOCK_SIZE, FP8_BLOCK_SIZE);
    int64_t size[2];
    if (!json_is_array(value) || value->length != 2 || !json_get_int64(&value->as.items[0], &size[0]) ||
        !json_get_int64(&value->as.items[1], &size[1]) || size[0] <= 0 || size[1] <= 0)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: field " FIELD ".weight_block_size must be two positive integers", path);
    if (size[0] != FP8_BLOCK_SIZE || size[1] != FP8_BLOCK_SIZE)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: field " FIELD ".weight_block_size is [%lld, %lld]; kite reads only [%d, %d]", path,
                         (long long)size[0], (long long)size[1], FP8_BLOCK_SIZE, FP8_BLOCK_SIZE);
    out->block_rows = (int32_t)size[0];
    out->block_cols = (int32_t)size[1];
    return KITE_OK;
}

static kite_status read_exclusions(const json_value *object, const char *path, const char *key,
                                   checkpoint_quantization *out) {
    const json_value *list = json_object_member(object, key);
    if (!list || json_is_null(list)) return KITE_OK;
    if (!json_is_array(list))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field " FIELD ".%s must be an array, found %s", path, key,
                         json_type_name(list->type));
    char **grown = realloc(out->excluded, (out->n_excluded + list->length + 1) * sizeof *grown);
    if (!grown) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory reading " FIELD ".%s", path, key);
    out->excluded = grown;
    for (size_t i = 0; i < list->length; i++) {
        const json_value *item = &list->as.items[i];
        if (!json_is_string(item) || item->length == 0 || strlen(item->as.string) != item->length)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field " FIELD ".%s[%zu] must be a non-empty string",
                             path, key, i);
        char *copy = malloc(item->length + 1);
        if (!copy) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory reading " FIELD ".%s", path, key);
        memcpy(copy, item->as.string, item->length + 1);
        out->excluded[out->n_excluded++] = copy;
    }
    return KITE_OK;
}

static kite_status read_object(const json_value *object, const char *path, checkpoint_quantization *out) {
    static const char *const known_keys[] = {
        "quant_method",   "fmt",       "activation_scheme", "weight_block_size", "modules_to_not_convert",
        "ignored_layers", "dequantize"};
    for (size_t i = 0; i < object->length; i++) {
        const char *key = object->as.members[i].key;
        bool known = false;
        for (size_t k = 0; k < sizeof known_keys / sizeof known_keys[0]; k++)
            if (strcmp(key, known_keys[k]) == 0) known = true;
        if (!known)
            return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: field " FIELD ".%.64s is not one kite reads", path, key);
    }
    const char *method;
    KITE_TRY(read_string(object, path, "quant_method", NULL, &method));
    if (!method) return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field " FIELD ".quant_method is missing", path);
    if (strcmp(method, "fp8") != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: field " FIELD ".quant_method is \"%.64s\"; kite reads only \"fp8\" (Qwen's FP8 "
                         "checkpoints)",
                         path, method);
    const char *format, *scheme;
    KITE_TRY(read_string(object, path, "fmt", "e4m3", &format));
    if (strcmp(format, "e4m3") != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: field " FIELD ".fmt is \"%.64s\"; kite reads only \"e4m3\"", path,
                         format);
    KITE_TRY(read_string(object, path, "activation_scheme", "dynamic", &scheme));
    if (strcmp(scheme, "dynamic") != 0)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: field " FIELD ".activation_scheme is \"%.64s\"; kite supports only \"dynamic\"", path,
                         scheme);
    const json_value *dequantize = json_object_member(object, "dequantize");
    bool flag;
    if (dequantize && !json_is_null(dequantize) && !json_get_bool(dequantize, &flag))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field " FIELD ".dequantize must be true or false", path);
    KITE_TRY(read_block_size(object, path, out));
    KITE_TRY(read_exclusions(object, path, "modules_to_not_convert", out));
    KITE_TRY(read_exclusions(object, path, "ignored_layers", out));
    out->fp8 = true;
    return KITE_OK;
}

kite_status checkpoint_quantization_read(const json_value *root, const char *path, checkpoint_quantization *out) {
    memset(out, 0, sizeof *out);
    const json_value *object = json_object_member(root, FIELD);
    if (!object || json_is_null(object)) return KITE_OK;
    if (!json_is_object(object))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: field " FIELD " must be an object, found %s", path,
                         json_type_name(object->type));
    kite_status status = read_object(object, path, out);
    if (status != KITE_OK) checkpoint_quantization_free(out);
    return status;
}

kite_status checkpoint_quantization_load(const char *dir, checkpoint_quantization *out) {
    memset(out, 0, sizeof *out);
    char *path = path_join(dir, "config.json");
    if (!path) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", dir);
    char *text = NULL;
    size_t length = 0;
    kite_status status = file_read_all(path, CONFIG_MAX_BYTES, KITE_ERROR_INVALID_CHECKPOINT, &text, &length);
    if (status == KITE_OK) {
        json_error error;
        memset(&error, 0, sizeof error);
        json_document *document = json_parse(text, length, &error);
        if (!document)
            status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: not valid JSON at line %d column %d: %s", path,
                               error.line, error.column, error.message);
        else
            status = checkpoint_quantization_read(json_root(document), path, out);
        json_free(document);
    }
    free(text);
    free(path);
    return status;
}

/* `entry` matches whole dot-separated parts of `module`. */
static bool matches_parts(const char *module, const char *entry) {
    size_t n = strlen(entry);
    for (const char *at = strstr(module, entry); at; at = strstr(at + 1, entry)) {
        bool starts = at == module || at[-1] == '.';
        bool ends = at[n] == '\0' || at[n] == '.';
        if (starts && ends) return true;
    }
    return false;
}

bool checkpoint_quantization_excludes(const checkpoint_quantization *q, const char *module) {
    for (size_t i = 0; i < q->n_excluded; i++)
        if (matches_parts(module, q->excluded[i])) return true;
    return false;
}

void checkpoint_quantization_free(checkpoint_quantization *q) {
    if (!q) return;
    for (size_t i = 0; i < q->n_excluded; i++)
        free(q->excluded[i]);
    free(q->excluded);
    memset(q, 0, sizeof *q);
}

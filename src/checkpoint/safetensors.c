#include "checkpoint/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/file.h"
#include "util/json.h"

struct safetensors_file {
    char *name; /* copy of the path or label given at open */
    file_mapping map; /* the whole file when opened from a path, else empty */
    size_t n_tensors;
    safetensors_tensor *tensors; /* sorted by name */
    size_t n_metadata;
    const char **metadata; /* key0, value0, key1, value1, ... */
    char *strings;         /* one block holding every name, key and value */
};

/* Every dtype the safetensors format defines, so a known-but-unsupported one is told apart from damage.
 * Sizes are in bits because F4 and F6 pack below a byte. */
typedef struct dtype_info {
    const char *name;
    uint32_t bits;
    bool supported;
    tensor_dtype dtype; /* meaningful only when supported */
} dtype_info;

static const dtype_info dtype_table[] = {
    {"BF16", 16, true, TENSOR_DTYPE_BF16},   {"F16", 16, true, TENSOR_DTYPE_F16},
    {"F32", 32, true, TENSOR_DTYPE_F32},     {"BOOL", 8, false, TENSOR_DTYPE_F32},
    {"U8", 8, false, TENSOR_DTYPE_F32},      {"I8", 8, false, TENSOR_DTYPE_F32},
    {"F8_E5M2", 8, false, TENSOR_DTYPE_F32}, {"F8_E4M3", 8, true, TENSOR_DTYPE_F8_E4M3},
    {"F8_E8M0", 8, false, TENSOR_DTYPE_F32}, {"I16", 16, false, TENSOR_DTYPE_F32},
    {"U16", 16, false, TENSOR_DTYPE_F32},    {"I32", 32, false, TENSOR_DTYPE_F32},
    {"U32", 32, false, TENSOR_DTYPE_F32},    {"F64", 64, false, TENSOR_DTYPE_F32},
    {"I64", 64, false, TENSOR_DTYPE_F32},    {"U64", 64, false, TENSOR_DTYPE_F32},
    {"C64", 64, false, TENSOR_DTYPE_F32},    {"F4", 4, false, TENSOR_DTYPE_F32},
    {"F6_E2M3", 6, false, TENSOR_DTYPE_F32}, {"F6_E3M2", 6, false, TENSOR_DTYPE_F32},
};

const char *safetensors_dtype_name(tensor_dtype dtype) {
    switch (dtype) {
    case TENSOR_DTYPE_BF16: return "BF16";
    case TENSOR_DTYPE_F16: return "F16";
    case TENSOR_DTYPE_F32: return "F32";
    case TENSOR_DTYPE_F8_E4M3: return "F8_E4M3";
    }
    return "?";
}

static const dtype_info *dtype_lookup(const char *name) {
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (strcmp(dtype_table[i].name, name) == 0) return &dtype_table[i];
    return NULL;
}

/* "[96, 32]" for messages; truncates quietly (the buffer fits SAFETENSORS_MAX_DIMS 20-digit dims). */
static void format_shape(const int64_t *shape, int32_t n_dims, char *buffer, size_t capacity) {
    size_t used = 0;
    int written = snprintf(buffer, capacity, "[");
    if (written < 0) return;
    used = (size_t)written;
    for (int32_t i = 0; i < n_dims && used < capacity; i++) {
        written = snprintf(buffer + used, capacity - used, "%s%" PRId64, i ? ", " : "", shape[i]);
        if (written < 0) return;
        used += (size_t)written;
    }
    if (used < capacity) snprintf(buffer + used, capacity - used, "]");
}

/* Names go into one-line messages and are looked up with strcmp: no embedded NUL or control characters. */
static bool name_is_clean(const char *name, size_t length) {
    for (size_t i = 0; i < length; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c < 0x20 || c == 0x7f) return false;
    }
    return true;
}

static uint64_t read_le64(const unsigned char *p) {
    uint64_t value = 0;
    for (int i = 7; i >= 0; i--) value = (value << 8) | p[i];
    return value;
}

static int compare_by_name(const void *a, const void *b) {
    return strcmp(((const safetensors_tensor *)a)->name, ((const safetensors_tensor *)b)->name);
}

static int compare_by_offset(const void *a, const void *b) {
    const safetensors_tensor *x = *(const safetensors_tensor *const *)a;
    const safetensors_tensor *y = *(const safetensors_tensor *const *)b;
    if (x->data_begin != y->data_begin) return x->data_begin < y->data_begin ? -1 : 1;
    if (x->data_end != y->data_end) return x->data_end < y->data_end ? -1 : 1;
    return strcmp(x->name, y->name);
}

void safetensors_close(safetensors_file *file) {
    if (!file) return;
    file_unmap(&file->map);
    free(file->tensors);
    free(file->metadata);
    free(file->strings);
    free(file->name);
    free(file);
}

/* Copies `length` bytes plus a NUL into the string block at *cursor. */
static const char *store_string(char **cursor, const char *text, size_t length) {
    char *start = *cursor;
    memcpy(start, text, length);
    start[length] = '\0';
    *cursor = start + length + 1;
    return start;
}

static kite_status parse_shape(const json_value *shape, const char *file_name, const char *tensor_name,
                               safetensors_tensor *tensor) {
    if (!json_is_array(shape))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s: field shape must be an array, found %s",
                         file_name, tensor_name, shape ? json_type_name(shape->type) : "nothing");
    if (shape->length > SAFETENSORS_MAX_DIMS)
        return kite_fail(KITE_ERROR_UNSUPPORTED,
                         "%s: tensor %s: field shape has %zu dimensions, kite supports at most %d", file_name,
                         tensor_name, shape->length, SAFETENSORS_MAX_DIMS);
    tensor->n_dims = (int32_t)shape->length;
    for (size_t i = 0; i < shape->length; i++) {
        int64_t dim;
        if (!json_get_int64(&shape->as.items[i], &dim) || dim < 0)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: tensor %s: field shape[%zu] must be a non-negative integer", file_name, tensor_name,
                             i);
        tensor->shape[i] = dim;
    }
    return KITE_OK;
}

static kite_status parse_offsets(const json_value *offsets, const char *file_name, const char *tensor_name,
                                 safetensors_tensor *tensor) {
    if (!json_is_array(offsets) || offsets->length != 2)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s: field data_offsets must be an array [begin, end]", file_name, tensor_name);
    int64_t begin, end;
    if (!json_get_int64(&offsets->as.items[0], &begin) || !json_get_int64(&offsets->as.items[1], &end) || begin < 0 ||
        end < 0)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s: field data_offsets must hold two non-negative integers", file_name,
                         tensor_name);
    if (begin > end)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s: field data_offsets [%" PRId64 ", %" PRId64 "] has begin after end", file_name,
                         tensor_name, begin, end);
    tensor->data_begin = (uint64_t)begin;
    tensor->data_end = (uint64_t)end;
    return KITE_OK;
}

/* Checks the byte span against shape x dtype, guarding every multiplication. */
static kite_status check_span(const safetensors_tensor *tensor, const dtype_info *info, const char *file_name) {
    char shape_text[256];
    uint64_t elements = 1;
    bool overflow = false;
    for (int32_t i = 0; i < tensor->n_dims; i++) {
        uint64_t dim = (uint64_t)tensor->shape[i];
        if (dim != 0 && elements > UINT64_MAX / dim)
            overflow = true;
        else
            elements *= dim;
    }
    if (!overflow && elements > UINT64_MAX / info->bits) overflow = true;
    uint64_t span = tensor->data_end - tensor->data_begin;
    if (overflow) {
        format_shape(tensor->shape, tensor->n_dims, shape_text, sizeof shape_text);
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s: shape %s x %s overflows 64 bits", file_name,
                         tensor->name, shape_text, info->name);
    }
    uint64_t bits = elements * info->bits;
    if (bits % 8 != 0) {
        format_shape(tensor->shape, tensor->n_dims, shape_text, sizeof shape_text);
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s: shape %s x %s is not a whole number of bytes",
                         file_name, tensor->name, shape_text, info->name);
    }
    if (bits / 8 != span) {
        format_shape(tensor->shape, tensor->n_dims, shape_text, sizeof shape_text);
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64
                         " bytes but shape %s x %s needs %" PRIu64,
                         file_name, tensor->name, tensor->data_begin, tensor->data_end, span, shape_text, info->name,
                         bits / 8);
    }
    return KITE_OK;
}

/* Sorted by begin, the spans must tile [0, data_size) exactly. */
static kite_status check_tiling(safetensors_file *file, uint64_t data_size) {
    if (file->n_tensors == 0) {
        if (data_size != 0)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: %" PRIu64 " trailing bytes after the header but no tensors", file->name, data_size);
        return KITE_OK;
    }
    const safetensors_tensor **order = malloc(file->n_tensors * sizeof *order);
    if (!order) return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory checking offsets", file->name);
    for (size_t i = 0; i < file->n_tensors; i++) order[i] = &file->tensors[i];
    qsort(order, file->n_tensors, sizeof *order, compare_by_offset);
    kite_status status = KITE_OK;
    uint64_t covered = 0;
    const safetensors_tensor *previous = NULL;
    for (size_t i = 0; i < file->n_tensors && status == KITE_OK; i++) {
        const safetensors_tensor *t = order[i];
        if (t->data_end > data_size)
            status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                               "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                               "] run past the end of the data area (%" PRIu64 " bytes)",
                               file->name, t->name, t->data_begin, t->data_end, data_size);
        else if (t->data_begin < covered)
            status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                               "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor %s [%" PRIu64
                               ", %" PRIu64 "]",
                               file->name, t->name, t->data_begin, t->data_end, previous->name, previous->data_begin,
                               previous->data_end);
        else if (t->data_begin > covered)
            status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                               "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] leave a hole of %" PRIu64
                               " bytes after offset %" PRIu64,
                               file->name, t->name, t->data_begin, t->data_end, t->data_begin - covered, covered);
        covered = t->data_end;
        previous = t;
    }
    if (status == KITE_OK && covered != data_size)
        status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                           "%s: %" PRIu64 " trailing bytes after the last tensor (%s ends at %" PRIu64
                           ", data area is %" PRIu64 " bytes)",
                           file->name, data_size - covered, previous->name, covered, data_size);
    free(order);
    return status;
}

/* Sizes the string block and validates __metadata__; counts tensors. */
static kite_status measure_header(const json_value *root, const char *name, size_t *n_tensors, size_t *n_metadata,
                                  size_t *string_bytes) {
    *n_tensors = 0;
    *n_metadata = 0;
    *string_bytes = 0;
    bool seen_metadata = false;
    for (size_t i = 0; i < root->length; i++) {
        const json_member *member = &root->as.members[i];
        if (strcmp(member->key, "__metadata__") == 0 && member->key_length == strlen("__metadata__")) {
            if (seen_metadata)
                return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: header has __metadata__ twice", name);
            seen_metadata = true;
            if (!json_is_object(&member->value))
                return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: __metadata__ must be an object, found %s", name,
                                 json_type_name(member->value.type));
            const json_value *metadata = &member->value;
            for (size_t j = 0; j < metadata->length; j++) {
                const json_member *entry = &metadata->as.members[j];
                if (!json_is_string(&entry->value))
                    return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                                     "%s: __metadata__ field %.200s must be a string, found %s", name, entry->key,
                                     json_type_name(entry->value.type));
                *string_bytes += entry->key_length + 1 + entry->value.length + 1;
            }
            *n_metadata = metadata->length;
            continue;
        }
        if (!name_is_clean(member->key, member->key_length))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor #%zu: name contains a NUL or control character",
                             name, i);
        *string_bytes += member->key_length + 1;
        (*n_tensors)++;
    }
    return KITE_OK;
}

static kite_status parse_header(safetensors_file *file, const json_value *root, uint64_t data_size,
                                const unsigned char *data_area) {
    if (!json_is_object(root))
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: header must be a JSON object, found %s", file->name,
                         json_type_name(root->type));
    size_t n_tensors, n_metadata, string_bytes;
    KITE_TRY(measure_header(root, file->name, &n_tensors, &n_metadata, &string_bytes));

    /* All three are bounded by the header's size, which is already checked. */
    file->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *file->tensors);
    file->metadata = calloc(n_metadata ? 2 * n_metadata : 1, sizeof *file->metadata);
    file->strings = malloc(string_bytes ? string_bytes : 1);
    if (!file->tensors || !file->metadata || !file->strings)
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory reading the header", file->name);

    char *cursor = file->strings;
    const char *unsupported_tensor = NULL, *unsupported_dtype = NULL;
    for (size_t i = 0; i < root->length; i++) {
        const json_member *member = &root->as.members[i];
        if (strcmp(member->key, "__metadata__") == 0 && member->key_length == strlen("__metadata__")) {
            for (size_t j = 0; j < member->value.length; j++) {
                const json_member *entry = &member->value.as.members[j];
                file->metadata[2 * file->n_metadata] = store_string(&cursor, entry->key, entry->key_length);
                file->metadata[2 * file->n_metadata + 1] =
                    store_string(&cursor, entry->value.as.string, entry->value.length);
                file->n_metadata++;
            }
            continue;
        }
        safetensors_tensor *tensor = &file->tensors[file->n_tensors++];
        tensor->name = store_string(&cursor, member->key, member->key_length);
        const json_value *entry = &member->value;
        if (!json_is_object(entry))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s: entry must be an object, found %s",
                             file->name, tensor->name, json_type_name(entry->type));
        const json_value *dtype = json_object_member(entry, "dtype");
        if (!json_is_string(dtype))
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s: field dtype must be a string, found %s",
                             file->name, tensor->name, dtype ? json_type_name(dtype->type) : "nothing");
        const dtype_info *info = dtype_lookup(dtype->as.string);
        if (!info)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: tensor %s: field dtype \"%.32s\" is not a safetensors dtype", file->name,
                             tensor->name, dtype->as.string);
        if (!info->supported && !unsupported_tensor) {
            unsupported_tensor = tensor->name;
            unsupported_dtype = info->name;
        }
        tensor->dtype = info->dtype;
        KITE_TRY(parse_shape(json_object_member(entry, "shape"), file->name, tensor->name, tensor));
        KITE_TRY(parse_offsets(json_object_member(entry, "data_offsets"), file->name, tensor->name, tensor));
        KITE_TRY(check_span(tensor, info, file->name));
    }

    qsort(file->tensors, file->n_tensors, sizeof *file->tensors, compare_by_name);
    for (size_t i = 1; i < file->n_tensors; i++)
        if (strcmp(file->tensors[i - 1].name, file->tensors[i].name) == 0)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: tensor %s appears twice in the header", file->name,
                             file->tensors[i].name);
    KITE_TRY(check_tiling(file, data_size));

    /* Reported last so a damaged file is called damaged, not merely unsupported. */
    if (unsupported_tensor)
        return kite_fail(KITE_ERROR_UNSUPPORTED, "%s: tensor %s: dtype %s is not supported (kite reads BF16, F16, F32, F8_E4M3)",
                         file->name, unsupported_tensor, unsupported_dtype);
    for (size_t i = 0; i < file->n_tensors; i++) file->tensors[i].data = data_area + file->tensors[i].data_begin;
    return KITE_OK;
}

/* A pass over the header's bytes, before it is parsed, that bounds what parsing costs. The JSON reader
 * spends ~32 bytes per value, so a 100 MB header of one shape of 50 million integers would cost gigabytes
 * before parse_shape() refused it; this pass refuses such a header at the cost of reading it. A safetensors
 * header nests three deep (the root, a tensor's entry, its shape or data_offsets), its arrays are shapes and
 * offsets of a few items (a shape of 9 to SCAN_MAX_ARRAY_ITEMS dims passes, for parse_shape() to name the
 * tensor it cannot read), and it has about eight separators (commas and brackets) per tensor. The pass
 * only counts; whether the JSON is valid is the parser's to say. */
static kite_status scan_header(const unsigned char *header, size_t length, const char *name) {
    enum { MAX_NESTING = 3, SCAN_MAX_ARRAY_ITEMS = 64 };
    bool is_array[MAX_NESTING + 1] = {false};
    size_t items[MAX_NESTING + 1] = {0}; /* commas seen in the open container at each depth */
    size_t depth = 0, separators = 0;
    bool in_string = false;
    for (size_t i = 0; i < length; i++) {
        unsigned char c = header[i];
        if (in_string) {
            if (c == '\\')
                i++; /* the escaped byte cannot end the string */
            else if (c == '"')
                in_string = false;
            continue;
        }
        switch (c) {
        case '"': in_string = true; continue;
        case '[':
        case '{':
            if (depth == MAX_NESTING)
                return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                                 "%s: header byte %zu: nested deeper than the %d levels of a safetensors header", name,
                                 i, MAX_NESTING);
            depth++;
            is_array[depth] = c == '[';
            items[depth] = 0;
            break;
        case ']':
        case '}':
            if (depth == 0) return KITE_OK; /* unbalanced: the parser names the byte */
            depth--;
            break;
        case ',':
            if (depth > 0 && is_array[depth] && ++items[depth] >= SCAN_MAX_ARRAY_ITEMS)
                return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                                 "%s: header byte %zu: an array of more than %d items (shapes and data_offsets "
                                 "have a few)", name, i, SCAN_MAX_ARRAY_ITEMS);
            if (depth == 1 && ++items[1] > SAFETENSORS_MAX_TENSORS)
                return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: header has more than %d tensors", name,
                                 SAFETENSORS_MAX_TENSORS);
            break;
        default: continue;
        }
        if (++separators > SAFETENSORS_MAX_HEADER_SEPARATORS)
            return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                             "%s: header byte %zu: more than %d commas and brackets (%d per tensor for %d tensors)",
                             name, i, SAFETENSORS_MAX_HEADER_SEPARATORS, SAFETENSORS_MAX_HEADER_SEPARATORS /
                             SAFETENSORS_MAX_TENSORS, SAFETENSORS_MAX_TENSORS);
    }
    return KITE_OK;
}

kite_status safetensors_parse_memory(const void *data, size_t size, const char *name, safetensors_file **out) {
    if (!out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "safetensors_parse_memory: NULL output");
    *out = NULL;
    if (!name) name = "(memory)";
    if (!data && size > 0) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "%s: NULL data", name);
    if (size < 8)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: file is %zu bytes, too short for the 8-byte header length",
                         name, size);
    const unsigned char *bytes = data;
    uint64_t header_length = read_le64(bytes);
    if (header_length < 2)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: header length %" PRIu64 " is below the minimum of 2", name,
                         header_length);
    if (header_length > SAFETENSORS_MAX_HEADER_BYTES)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: header length %" PRIu64 " exceeds the limit of %" PRIu64 " bytes", name, header_length,
                         SAFETENSORS_MAX_HEADER_BYTES);
    if (header_length > (uint64_t)size - 8)
        return kite_fail(KITE_ERROR_INVALID_CHECKPOINT,
                         "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)", name, header_length,
                         size);

    KITE_TRY(scan_header(bytes + 8, (size_t)header_length, name));

    safetensors_file *file = calloc(1, sizeof *file);
    size_t name_length = strlen(name);
    if (file) file->name = malloc(name_length + 1);
    if (!file || !file->name) {
        free(file);
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "%s: out of memory", name);
    }
    memcpy(file->name, name, name_length + 1);

    /* The JSON reader checks UTF-8 inside strings and rejects any other non-ASCII byte. */
    json_error error;
    memset(&error, 0, sizeof error);
    json_document *document = json_parse((const char *)bytes + 8, (size_t)header_length, &error);
    kite_status status;
    if (!document) {
        status = kite_fail(KITE_ERROR_INVALID_CHECKPOINT, "%s: header is not valid JSON at byte %zu: %s", name,
                           error.offset, error.message);
    } else {
        status = parse_header(file, json_root(document), (uint64_t)size - 8 - header_length, bytes + 8 + header_length);
        json_free(document);
    }
    if (status != KITE_OK) {
        safetensors_close(file);
        return status;
    }
    *out = file;
    return KITE_OK;
}

kite_status safetensors_open(const char *path, safetensors_file **out) {
    if (!path || !out) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "safetensors_open: NULL argument");
    *out = NULL;
    file_mapping mapping;
    /* Shards are as large as the weights; only their header is bounded (SAFETENSORS_MAX_HEADER_BYTES). */
    KITE_TRY(file_map(path, false, SIZE_MAX, KITE_ERROR_INVALID_CHECKPOINT, &mapping));
    if (mapping.size < 8) {
        /* Too short to hold a header (an empty file maps to nothing): the parser's size check says so. */
        static const unsigned char empty[8];
        kite_status status = safetensors_parse_memory(mapping.data ? mapping.data : empty, mapping.size, path, out);
        file_unmap(&mapping);
        return status;
    }
    safetensors_file *file = NULL;
    kite_status status = safetensors_parse_memory(mapping.data, mapping.size, path, &file);
    if (status != KITE_OK) {
        file_unmap(&mapping);
        return status;
    }
    file->map = mapping;
    *out = file;
    return KITE_OK;
}

const char *safetensors_name(const safetensors_file *file) { return file->name; }

void safetensors_header_bytes(const safetensors_file *file, const void **data, size_t *size) {
    *data = NULL;
    *size = 0;
    /* The mapping was validated at open: at least 8 bytes, and 8 + the header length within the file. */
    if (!file->map.data || file->map.size < 8) return;
    *data = file->map.data;
    *size = 8 + (size_t)read_le64(file->map.data);
}

size_t safetensors_count(const safetensors_file *file) { return file->n_tensors; }

const safetensors_tensor *safetensors_tensor_at(const safetensors_file *file, size_t index) {
    return index < file->n_tensors ? &file->tensors[index] : NULL;
}

const safetensors_tensor *safetensors_find(const safetensors_file *file, const char *name) {
    size_t low = 0, high = file->n_tensors;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        int order = strcmp(file->tensors[middle].name, name);
        if (order == 0) return &file->tensors[middle];
        if (order < 0)
            low = middle + 1;
        else
            high = middle;
    }
    return NULL;
}

const char *safetensors_metadata_get(const safetensors_file *file, const char *key) {
    for (size_t i = 0; i < file->n_metadata; i++)
        if (strcmp(file->metadata[2 * i], key) == 0) return file->metadata[2 * i + 1];
    return NULL;
}

#include "checkpoint_writer.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/fp8.h"

void checkpoint_writer_shape_tiny(checkpoint_writer_shape *shape) {
    memset(shape, 0, sizeof *shape);
    shape->vocab_size = 256;
    shape->hidden_size = 32;
    shape->intermediate_size = 96;
    shape->n_layers = 2;
    shape->n_heads = 2;
    shape->n_kv_heads = 1;
    shape->head_dim = 32;
    shape->tie_word_embeddings = true;
    shape->dtype = TENSOR_DTYPE_BF16;
    shape->n_shards = 0;
    shape->seed = 1234;
}

static const char *dtype_string(tensor_dtype dtype) {
    switch (dtype) {
    case TENSOR_DTYPE_BF16: return "BF16";
    case TENSOR_DTYPE_F16: return "F16";
    case TENSOR_DTYPE_F32: return "F32";
    case TENSOR_DTYPE_F8_E4M3: return "F8_E4M3";
    }
    return "BF16";
}

size_t checkpoint_writer_dtype_size(const char *dtype) {
    if (strcmp(dtype, "F32") == 0 || strcmp(dtype, "I32") == 0 || strcmp(dtype, "U32") == 0) return 4;
    if (strcmp(dtype, "F64") == 0 || strcmp(dtype, "I64") == 0 || strcmp(dtype, "U64") == 0) return 8;
    if (strncmp(dtype, "F8", 2) == 0 || strcmp(dtype, "U8") == 0 || strcmp(dtype, "I8") == 0 ||
        strcmp(dtype, "BOOL") == 0)
        return 1;
    return 2;
}

static void add_tensor(checkpoint_writer_tensor *out, size_t capacity, size_t *count,
                       const checkpoint_writer_shape *shape, const char *name, int32_t n_dims, int64_t rows,
                       int64_t columns) {
    size_t index = (*count)++;
    if (index >= capacity) return;
    checkpoint_writer_tensor *t = &out[index];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype_string(shape->dtype));
    t->n_dims = n_dims;
    t->shape[0] = rows;
    t->shape[1] = columns;
    t->shard = shape->n_shards > 0 ? (int)(index % (size_t)shape->n_shards) : 0;
}

/* An fp8_linear shape's linear weight: the matrix just added (out[*count - 1]) becomes F8_E4M3, followed by its
 * block scales. */
static void add_fp8_scales(checkpoint_writer_tensor *out, size_t capacity, size_t *count, const char *weight_name,
                           int64_t rows, int64_t columns) {
    if (*count <= capacity) snprintf(out[*count - 1].dtype, sizeof out[*count - 1].dtype, "F8_E4M3");
    size_t index = (*count)++;
    if (index >= capacity) return;
    checkpoint_writer_tensor *t = &out[index];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s_scale_inv", weight_name);
    snprintf(t->dtype, sizeof t->dtype, "F32");
    t->n_dims = 2;
    t->shape[0] = fp8_block_count(rows, FP8_BLOCK_SIZE);
    t->shape[1] = fp8_block_count(columns, FP8_BLOCK_SIZE);
    t->shard = out[index - 1].shard;
}

size_t checkpoint_writer_list_tensors(const checkpoint_writer_shape *shape, checkpoint_writer_tensor *out,
                                      size_t capacity) {
    size_t count = 0;
    int64_t hidden = shape->hidden_size, inter = shape->intermediate_size, head_dim = shape->head_dim;
    int64_t q_dim = (int64_t)shape->n_heads * head_dim, kv_dim = (int64_t)shape->n_kv_heads * head_dim;
    char name[96];
    add_tensor(out, capacity, &count, shape, "model.embed_tokens.weight", 2, shape->vocab_size, hidden);
    for (int32_t layer = 0; layer < shape->n_layers; layer++) {
#define LAYER_TENSOR(suffix, n_dims, rows, columns)                                                                    \
    snprintf(name, sizeof name, "model.layers.%d.%s", (int)layer, suffix);                                             \
    add_tensor(out, capacity, &count, shape, name, n_dims, rows, columns)
#define LINEAR_TENSOR(suffix, rows, columns)                                                                           \
    LAYER_TENSOR(suffix, 2, rows, columns);                                                                            \
    if (shape->fp8_linear) add_fp8_scales(out, capacity, &count, name, rows, columns)
        LAYER_TENSOR("input_layernorm.weight", 1, hidden, 0);
        LINEAR_TENSOR("self_attn.q_proj.weight", q_dim, hidden);
        LINEAR_TENSOR("self_attn.k_proj.weight", kv_dim, hidden);
        LINEAR_TENSOR("self_attn.v_proj.weight", kv_dim, hidden);
        LAYER_TENSOR("self_attn.q_norm.weight", 1, head_dim, 0);
        LAYER_TENSOR("self_attn.k_norm.weight", 1, head_dim, 0);
        LINEAR_TENSOR("self_attn.o_proj.weight", hidden, q_dim);
        LAYER_TENSOR("post_attention_layernorm.weight", 1, hidden, 0);
        LINEAR_TENSOR("mlp.gate_proj.weight", inter, hidden);
        LINEAR_TENSOR("mlp.up_proj.weight", inter, hidden);
        LINEAR_TENSOR("mlp.down_proj.weight", hidden, inter);
#undef LINEAR_TENSOR
#undef LAYER_TENSOR
    }
    add_tensor(out, capacity, &count, shape, "model.norm.weight", 1, hidden, 0);
    if (!shape->tie_word_embeddings || shape->write_lm_head_when_tied)
        add_tensor(out, capacity, &count, shape, "lm_head.weight", 2, shape->vocab_size, hidden);
    return count;
}

/* splitmix64: tiny, good enough for test weights, identical everywhere. */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint16_t float_to_f16(float value) {
    union {
        float f;
        uint32_t u;
    } v;
    v.f = value;
    uint32_t sign = (v.u >> 16) & 0x8000u;
    int32_t exponent = (int32_t)((v.u >> 23) & 0xff) - 127 + 15;
    uint32_t mantissa = v.u & 0x7fffffu;
    /* Test values are small normal numbers; flush what does not fit rather than handle every case. */
    if (exponent <= 0) return (uint16_t)sign;
    if (exponent >= 31) return (uint16_t)(sign | 0x7c00u);
    uint32_t half = sign | ((uint32_t)exponent << 10) | (mantissa >> 13);
    if ((mantissa & 0x1fffu) > 0x1000u || ((mantissa & 0x1fffu) == 0x1000u && (half & 1u))) half++;
    return (uint16_t)half;
}

void checkpoint_writer_fill(const char *name, const char *dtype, size_t n_elements, uint64_t seed, void *dst) {
    uint64_t state = seed ^ 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++) state = (state ^ (unsigned char)*p) * 0x100000001b3ull;
    size_t name_length = strlen(name);
    bool is_norm = name_length >= 11 && strcmp(name + name_length - 11, "norm.weight") == 0;
    unsigned char *bytes = dst;
    size_t element_size = checkpoint_writer_dtype_size(dtype);
    bool is_float = strcmp(dtype, "BF16") == 0 || strcmp(dtype, "F16") == 0 || strcmp(dtype, "F32") == 0;
    if (!is_float) {
        memset(dst, 0, n_elements * element_size);
        return;
    }
    for (size_t i = 0; i < n_elements; i++) {
        double unit = (double)(next_random(&state) >> 11) / 9007199254740992.0 * 2.0 - 1.0; /* [-1, 1) */
        float value = (float)(is_norm ? 1.0 + 0.1 * unit : 0.05 * unit);
        if (strcmp(dtype, "F32") == 0) {
            memcpy(bytes + 4 * i, &value, 4);
        } else {
            uint16_t bits = strcmp(dtype, "BF16") == 0 ? float_to_bf16(value) : float_to_f16(value);
            memcpy(bytes + 2 * i, &bits, 2);
        }
    }
}

/* ---- small growing string buffer for JSON text ----------------------------------------------------- */

typedef struct text_buffer {
    char *data;
    size_t length;
    size_t capacity;
    bool failed;
} text_buffer;

static void text_append(text_buffer *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_append(text_buffer *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        size_t room = b->capacity - b->length;
        va_list args;
        va_start(args, fmt);
        int written = room ? vsnprintf(b->data + b->length, room, fmt, args) : -2;
        va_end(args);
        if (written == -1) {
            b->failed = true;
            return;
        }
        if (written >= 0 && (size_t)written < room) {
            b->length += (size_t)written;
            return;
        }
        size_t capacity = b->capacity ? b->capacity * 2 : 4096;
        if (written >= 0 && capacity < b->length + (size_t)written + 1) capacity = b->length + (size_t)written + 1;
        char *grown = realloc(b->data, capacity);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown;
        b->capacity = capacity;
    }
}

/* ---- files -------------------------------------------------------------------------------------- */

char *checkpoint_writer_path(const char *dir, const char *name) {
    size_t length = strlen(dir) + 1 + strlen(name) + 1;
    char *path = malloc(length);
    if (!path) return NULL;
    snprintf(path, length, "%s/%s", dir, name);
    return path;
}

bool checkpoint_writer_write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "checkpoint_writer: cannot create %s: %s\n", path, strerror(errno));
        return false;
    }
    bool ok = size == 0 || fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0) ok = false;
    if (!ok) fprintf(stderr, "checkpoint_writer: cannot write %s\n", path);
    return ok;
}

char *checkpoint_writer_make_temp_dir(void) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char *path = checkpoint_writer_path(base, "kite-checkpoint-XXXXXX");
    if (!path) return NULL;
    if (!mkdtemp(path)) {
        fprintf(stderr, "checkpoint_writer: mkdtemp %s: %s\n", path, strerror(errno));
        free(path);
        return NULL;
    }
    return path;
}

bool checkpoint_writer_remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool ok = true;
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
        char *path = checkpoint_writer_path(dir, entry->d_name);
        if (!path || (unlink(path) != 0 && rmdir(path) != 0)) ok = false;
        free(path);
    }
    if (closedir(d) != 0) ok = false;
    if (rmdir(dir) != 0) ok = false;
    return ok;
}

/* ---- safetensors and config ------------------------------------------------------------------------ */

static uint64_t tensor_bytes(const checkpoint_writer_tensor *t) {
    uint64_t elements = 1;
    for (int32_t d = 0; d < t->n_dims; d++) elements *= (uint64_t)t->shape[d];
    return elements * checkpoint_writer_dtype_size(t->dtype);
}

/* The contents of an fp8_linear shape's tensors: a 2-D F8_E4M3 tensor holds the codes, and "<weight>_scale_inv"
 * (F32) next to such a weight its block scales, of kite's quantization (quant/fp8.h) of the BF16 values
 * checkpoint_writer_fill gives the weight's name. 0: tensor i is neither (filled as usual); -1: failure. */
static int fill_fp8(const checkpoint_writer_tensor *tensors, size_t n, size_t i, uint64_t seed, void *dst) {
    const checkpoint_writer_tensor *t = &tensors[i], *weight = NULL;
    bool want_scales = false;
    if (strcmp(t->dtype, "F8_E4M3") == 0 && t->n_dims == 2) {
        weight = t;
    } else if (strcmp(t->dtype, "F32") == 0) {
        const size_t length = strlen(t->name), suffix = strlen("_scale_inv");
        for (size_t k = 0; k < n && length > suffix && strcmp(t->name + length - suffix, "_scale_inv") == 0; k++)
            if (strlen(tensors[k].name) == length - suffix && strncmp(tensors[k].name, t->name, length - suffix) == 0 &&
                strcmp(tensors[k].dtype, "F8_E4M3") == 0 && tensors[k].n_dims == 2)
                weight = &tensors[k];
        want_scales = weight != NULL;
    }
    if (!weight) return 0;
    const int64_t rows = weight->shape[0], columns = weight->shape[1];
    const size_t count = (size_t)(rows * columns);
    const size_t n_scales = (size_t)(fp8_block_count(rows, FP8_BLOCK_SIZE) * fp8_block_count(columns, FP8_BLOCK_SIZE));
    uint16_t *bf16 = malloc(count * sizeof *bf16);
    float *values = malloc(count * sizeof *values), *scales = malloc(n_scales * sizeof *scales);
    uint8_t *codes = malloc(count);
    bool ok = bf16 && values && scales && codes;
    if (ok) {
        checkpoint_writer_fill(weight->name, "BF16", count, seed, bf16);
        for (size_t k = 0; k < count; k++) values[k] = bf16_to_float(bf16[k]);
        ok = fp8_quantize_blocks(values, rows, columns, codes, scales, weight->name) == KITE_OK;
    }
    if (ok && want_scales) memcpy(dst, scales, n_scales * sizeof *scales);
    else if (ok) memcpy(dst, codes, count);
    else fprintf(stderr, "checkpoint_writer: cannot quantize %s\n", weight->name);
    free(bf16);
    free(values);
    free(scales);
    free(codes);
    return ok ? 1 : -1;
}

bool checkpoint_writer_write_safetensors(const char *path, const checkpoint_writer_tensor *tensors, size_t n,
                                         uint64_t seed) {
    text_buffer header = {0};
    text_append(&header, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const checkpoint_writer_tensor *t = &tensors[i];
        text_append(&header, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->dtype);
        for (int32_t d = 0; d < t->n_dims; d++) text_append(&header, "%s%" PRId64, d ? "," : "", t->shape[d]);
        uint64_t bytes = tensor_bytes(t);
        text_append(&header, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset, offset + bytes);
        offset += bytes;
    }
    text_append(&header, "}");
    /* Pad with spaces to a multiple of 8 like the reference writer, so the data area stays aligned. */
    while (!header.failed && header.length % 8 != 0) text_append(&header, " ");
    if (header.failed) {
        free(header.data);
        return false;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "checkpoint_writer: cannot create %s: %s\n", path, strerror(errno));
        free(header.data);
        return false;
    }
    unsigned char length_bytes[8];
    for (int i = 0; i < 8; i++) length_bytes[i] = (unsigned char)((uint64_t)header.length >> (8 * i));
    bool ok = fwrite(length_bytes, 1, 8, f) == 8 && fwrite(header.data, 1, header.length, f) == header.length;
    for (size_t i = 0; i < n && ok; i++) {
        uint64_t bytes = tensor_bytes(&tensors[i]);
        void *data = malloc(bytes ? (size_t)bytes : 1);
        if (!data) {
            ok = false;
            break;
        }
        const int fp8 = fill_fp8(tensors, n, i, seed, data);
        if (fp8 == 0)
            checkpoint_writer_fill(tensors[i].name, tensors[i].dtype,
                                   (size_t)(bytes / checkpoint_writer_dtype_size(tensors[i].dtype)), seed, data);
        ok = fp8 >= 0 && (bytes == 0 || fwrite(data, 1, (size_t)bytes, f) == bytes);
        free(data);
    }
    if (fclose(f) != 0) ok = false;
    if (!ok) fprintf(stderr, "checkpoint_writer: cannot write %s\n", path);
    free(header.data);
    return ok;
}

void checkpoint_writer_shard_name(int k, int n, char *buffer, size_t capacity) {
    snprintf(buffer, capacity, "model-%05d-of-%05d.safetensors", k + 1, n);
}

bool checkpoint_writer_write_sharded(const char *dir, const checkpoint_writer_tensor *tensors, size_t n, int n_shards,
                                     uint64_t seed) {
    checkpoint_writer_tensor *subset = malloc((n ? n : 1) * sizeof *subset);
    if (!subset) return false;
    text_buffer index = {0};
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += tensor_bytes(&tensors[i]);
    text_append(&index, "{\n  \"metadata\": {\"total_size\": %" PRIu64 "},\n  \"weight_map\": {", total);
    bool ok = true, first = true;
    for (int k = 0; k < n_shards && ok; k++) {
        char shard[64];
        checkpoint_writer_shard_name(k, n_shards, shard, sizeof shard);
        size_t count = 0;
        for (size_t i = 0; i < n; i++) {
            if (tensors[i].shard != k) continue;
            subset[count++] = tensors[i];
            text_append(&index, "%s\n    \"%s\": \"%s\"", first ? "" : ",", tensors[i].name, shard);
            first = false;
        }
        char *path = checkpoint_writer_path(dir, shard);
        ok = path && checkpoint_writer_write_safetensors(path, subset, count, seed);
        free(path);
    }
    text_append(&index, "\n  }\n}\n");
    free(subset);
    char *index_path = checkpoint_writer_path(dir, "model.safetensors.index.json");
    ok = ok && !index.failed && index_path && checkpoint_writer_write_file(index_path, index.data, index.length);
    free(index_path);
    free(index.data);
    return ok;
}

bool checkpoint_writer_write_raw(const char *path, const char *header, size_t data_size) {
    size_t header_length = strlen(header);
    size_t size = 8 + header_length + data_size;
    unsigned char *bytes = malloc(size);
    if (!bytes) return false;
    for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)((uint64_t)header_length >> (8 * i));
    memcpy(bytes + 8, header, header_length);
    memset(bytes + 8 + header_length, 0x5a, data_size);
    bool ok = checkpoint_writer_write_file(path, bytes, size);
    free(bytes);
    return ok;
}

static const char *torch_dtype_name(tensor_dtype dtype) {
    switch (dtype) {
    case TENSOR_DTYPE_BF16: return "bfloat16";
    case TENSOR_DTYPE_F16: return "float16";
    case TENSOR_DTYPE_F32: return "float32";
    case TENSOR_DTYPE_F8_E4M3: break; /* not a torch_dtype: a checkpoint's dtype is its unquantized one */
    }
    return "bfloat16";
}

/* What Qwen's FP8 releases say in config.json (after the last field, hence the leading comma). */
#define FP8_QUANTIZATION_CONFIG                                                                                        \
    ",\n  \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", "                           \
    "\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"modules_to_not_convert\": [\"lm_head\"]}"

bool checkpoint_writer_write_config(const char *dir, const checkpoint_writer_shape *shape) {
    /* Qwen3's special ids where the vocabulary holds them, else the last ids (tiny vocabularies). */
    int32_t bos = shape->vocab_size > 151643 ? 151643 : shape->vocab_size - 1;
    int32_t eos = bos;
    text_buffer text = {0};
    text_append(&text,
                "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"attention_bias\": false,\n"
                "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n"
                "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n"
                "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
                "  \"max_position_embeddings\": 4096,\n  \"max_window_layers\": %d,\n  \"model_type\": \"qwen3\",\n"
                "  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
                "  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": null,\n  \"rope_theta\": 1000000,\n"
                "  \"sliding_window\": null,\n  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\",\n"
                "  \"transformers_version\": \"4.51.0\",\n  \"use_cache\": true,\n  \"use_sliding_window\": false,\n"
                "  \"vocab_size\": %d%s\n}\n",
                bos, eos, shape->head_dim, shape->hidden_size, shape->intermediate_size, shape->n_layers,
                shape->n_heads, shape->n_layers, shape->n_kv_heads, shape->tie_word_embeddings ? "true" : "false",
                torch_dtype_name(shape->dtype), shape->vocab_size,
                shape->fp8_linear ? FP8_QUANTIZATION_CONFIG : "");
    char *path = checkpoint_writer_path(dir, "config.json");
    bool ok = !text.failed && path && checkpoint_writer_write_file(path, text.data, text.length);
    free(path);
    free(text.data);
    return ok;
}

bool checkpoint_writer_write(const char *dir, const checkpoint_writer_shape *shape) {
    if (!checkpoint_writer_write_config(dir, shape)) return false;
    size_t n = checkpoint_writer_list_tensors(shape, NULL, 0);
    checkpoint_writer_tensor *tensors = malloc(n * sizeof *tensors);
    if (!tensors) return false;
    checkpoint_writer_list_tensors(shape, tensors, n);
    bool ok;
    if (shape->n_shards > 0) {
        ok = checkpoint_writer_write_sharded(dir, tensors, n, shape->n_shards, shape->seed);
    } else {
        char *path = checkpoint_writer_path(dir, "model.safetensors");
        ok = path && checkpoint_writer_write_safetensors(path, tensors, n, shape->seed);
        free(path);
    }
    free(tensors);
    return ok;
}

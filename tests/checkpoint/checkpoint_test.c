/* Whole checkpoint directories: valid tiny Qwen3 checkpoints (tied, untied, sharded, mixed dtypes) load
 * with the right views; damaged ones fail with the right status and a message naming the problem. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint_writer.h"
#include "test_util.h"
#include "util/error.h"

#define MAX_TENSORS 64

/* A fresh directory per case, removed at the end of the case. */
static char *case_dir;

static const char *case_begin(void) {
    case_dir = checkpoint_writer_make_temp_dir();
    CHECK(case_dir != NULL);
    return case_dir;
}

static void case_end(void) {
    if (!case_dir) return;
    CHECK(checkpoint_writer_remove_dir(case_dir));
    free(case_dir);
    case_dir = NULL;
}

static char *case_path(const char *name) { return checkpoint_writer_path(case_dir, name); }

static void expect_open_fails(const char *dir, kite_status expected, const char *substring, int line) {
    checkpoint *c = NULL;
    kite_status status = checkpoint_open(dir, &c);
    bool ok = status == expected && c == NULL && strstr(kite_last_error(), substring) != NULL;
    if (!ok)
        fprintf(stderr, "  line %d: wanted status %d with \"%s\", got %d: %s\n", line, expected, substring, status,
                kite_last_error());
    CHECK(ok);
    checkpoint_close(c);
}
#define EXPECT_OPEN_FAILS(dir, expected, substring) expect_open_fails(dir, expected, substring, __LINE__)

/* The view matches the writer's tensor: dtype, shape and the exact bytes it wrote. */
static void check_view(const tensor_view *view, const checkpoint_writer_tensor *t, uint64_t seed) {
    CHECK_MSG(view->data != NULL, "%s", t->name);
    if (!view->data) return;
    CHECK_MSG(strcmp(t->dtype, view->dtype == TENSOR_DTYPE_BF16  ? "BF16"
                               : view->dtype == TENSOR_DTYPE_F16 ? "F16"
                                                                 : "F32") == 0,
              "%s", t->name);
    CHECK_MSG(view->n_dims == t->n_dims && view->shape[0] == t->shape[0] &&
                  (t->n_dims == 1 || view->shape[1] == t->shape[1]),
              "%s", t->name);
    size_t bytes = tensor_view_elements(view) * tensor_dtype_size(view->dtype);
    void *expected = malloc(bytes);
    CHECK(expected != NULL);
    if (!expected) return;
    checkpoint_writer_fill(t->name, t->dtype, tensor_view_elements(view), seed, expected);
    CHECK_MSG(memcmp(view->data, expected, bytes) == 0, "%s contents", t->name);
    CHECK_MSG((uintptr_t)view->data % tensor_dtype_size(view->dtype) == 0, "%s alignment", t->name);
    free(expected);
}

static const tensor_view *view_for(const qwen3_weights *w, int32_t n_layers, const char *name) {
    if (strcmp(name, "model.embed_tokens.weight") == 0) return &w->embed_tokens;
    if (strcmp(name, "model.norm.weight") == 0) return &w->final_norm;
    if (strcmp(name, "lm_head.weight") == 0) return &w->lm_head;
    int layer = -1, consumed = 0;
    if (sscanf(name, "model.layers.%d.%n", &layer, &consumed) != 1 || layer < 0 || layer >= n_layers) return NULL;
    const qwen3_layer_weights *l = &w->layers[layer];
    const char *suffix = name + consumed;
    static const struct {
        const char *suffix;
        size_t offset;
    } parts[] = {
        {"input_layernorm.weight", offsetof(qwen3_layer_weights, input_norm)},
        {"self_attn.q_proj.weight", offsetof(qwen3_layer_weights, q_proj)},
        {"self_attn.k_proj.weight", offsetof(qwen3_layer_weights, k_proj)},
        {"self_attn.v_proj.weight", offsetof(qwen3_layer_weights, v_proj)},
        {"self_attn.q_norm.weight", offsetof(qwen3_layer_weights, q_norm)},
        {"self_attn.k_norm.weight", offsetof(qwen3_layer_weights, k_norm)},
        {"self_attn.o_proj.weight", offsetof(qwen3_layer_weights, o_proj)},
        {"post_attention_layernorm.weight", offsetof(qwen3_layer_weights, post_attention_norm)},
        {"mlp.gate_proj.weight", offsetof(qwen3_layer_weights, gate_proj)},
        {"mlp.up_proj.weight", offsetof(qwen3_layer_weights, up_proj)},
        {"mlp.down_proj.weight", offsetof(qwen3_layer_weights, down_proj)},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (strcmp(suffix, parts[i].suffix) == 0) return (const tensor_view *)((const char *)l + parts[i].offset);
    return NULL;
}

/* Writes the shape, opens it and checks every view against what was written. */
static void check_round_trip(const checkpoint_writer_shape *shape) {
    const char *dir = case_begin();
    if (!dir) return;
    CHECK(checkpoint_writer_write(dir, shape));
    checkpoint *c = NULL;
    kite_status status = checkpoint_open(dir, &c);
    CHECK_MSG(status == KITE_OK, "%s", kite_last_error());
    if (c) {
        const qwen3_config *config = checkpoint_config(c);
        CHECK(config->vocab_size == shape->vocab_size && config->hidden_size == shape->hidden_size);
        CHECK(config->n_layers == shape->n_layers && config->head_dim == shape->head_dim);
        CHECK(config->tie_word_embeddings == shape->tie_word_embeddings);
        const qwen3_weights *w = checkpoint_weights(c);
        checkpoint_writer_tensor tensors[MAX_TENSORS];
        size_t n = checkpoint_writer_list_tensors(shape, tensors, MAX_TENSORS);
        CHECK(n <= MAX_TENSORS);
        size_t bytes = 0;
        for (size_t i = 0; i < n && i < MAX_TENSORS; i++) {
            const tensor_view *view = view_for(w, config->n_layers, tensors[i].name);
            CHECK_MSG(view != NULL, "%s", tensors[i].name);
            if (strcmp(tensors[i].name, "lm_head.weight") == 0 && shape->tie_word_embeddings) continue;
            if (view) check_view(view, &tensors[i], shape->seed);
            if (view) bytes += tensor_view_elements(view) * tensor_dtype_size(view->dtype);
        }
        CHECK(checkpoint_weight_bytes(c) == bytes);
        if (shape->tie_word_embeddings) {
            CHECK(w->lm_head.data == w->embed_tokens.data);
            CHECK(w->lm_head.shape[0] == shape->vocab_size && w->lm_head.shape[1] == shape->hidden_size);
        } else {
            CHECK(w->lm_head.data != w->embed_tokens.data);
        }
    }
    checkpoint_close(c);
    case_end();
}

static void test_tied(void) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    check_round_trip(&shape);
}

static void test_untied(void) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    shape.tie_word_embeddings = false;
    shape.n_layers = 3;
    shape.n_heads = 4;
    shape.n_kv_heads = 2;
    shape.head_dim = 16; /* q_dim 64 != hidden 32: o_proj is (32, 64) */
    check_round_trip(&shape);
}

static void test_tied_with_stored_lm_head(void) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    shape.write_lm_head_when_tied = true;
    check_round_trip(&shape);
}

static void test_sharded(void) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    shape.tie_word_embeddings = false;
    shape.n_shards = 3;
    check_round_trip(&shape);
    shape.n_shards = 1;
    check_round_trip(&shape);
}

static void test_dtypes(void) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    shape.dtype = TENSOR_DTYPE_F32;
    check_round_trip(&shape);
    shape.dtype = TENSOR_DTYPE_F16;
    check_round_trip(&shape);

    /* Mixed: F32 norms, F16 embeddings, BF16 the rest. */
    const char *dir = case_begin();
    if (!dir) return;
    checkpoint_writer_shape_tiny(&shape);
    checkpoint_writer_tensor tensors[MAX_TENSORS];
    size_t n = checkpoint_writer_list_tensors(&shape, tensors, MAX_TENSORS);
    for (size_t i = 0; i < n; i++) {
        if (strstr(tensors[i].name, "norm")) snprintf(tensors[i].dtype, sizeof tensors[i].dtype, "F32");
        if (strstr(tensors[i].name, "embed")) snprintf(tensors[i].dtype, sizeof tensors[i].dtype, "F16");
    }
    char *path = case_path("model.safetensors");
    CHECK(checkpoint_writer_write_config(dir, &shape));
    CHECK(checkpoint_writer_write_safetensors(path, tensors, n, shape.seed));
    checkpoint *c = NULL;
    CHECK_MSG(checkpoint_open(dir, &c) == KITE_OK, "%s", kite_last_error());
    if (c) {
        const qwen3_weights *w = checkpoint_weights(c);
        CHECK(w->embed_tokens.dtype == TENSOR_DTYPE_F16 && w->lm_head.dtype == TENSOR_DTYPE_F16);
        CHECK(w->final_norm.dtype == TENSOR_DTYPE_F32 && w->layers[1].k_norm.dtype == TENSOR_DTYPE_F32);
        CHECK(w->layers[0].q_proj.dtype == TENSOR_DTYPE_BF16);
        for (size_t i = 0; i < n; i++) check_view(view_for(w, 2, tensors[i].name), &tensors[i], shape.seed);
        /* Norm weights were written near 1: widen one and look. */
        float values[32];
        tensor_to_float(w->final_norm.dtype, w->final_norm.data, values, 32);
        for (int i = 0; i < 32; i++) CHECK(values[i] > 0.89f && values[i] < 1.11f);
    }
    checkpoint_close(c);
    free(path);
    case_end();
}

/* Writes the tiny checkpoint's config and a single file from an edited tensor list. */
static void write_edited(const checkpoint_writer_shape *shape, checkpoint_writer_tensor *tensors, size_t n) {
    char *path = case_path("model.safetensors");
    CHECK(checkpoint_writer_write_config(case_dir, shape));
    CHECK(checkpoint_writer_write_safetensors(path, tensors, n, shape->seed));
    free(path);
}

static size_t find_tensor(const checkpoint_writer_tensor *tensors, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(tensors[i].name, name) == 0) return i;
    CHECK_MSG(false, "no tensor %s", name);
    return 0;
}

static void test_tensor_set_damage(void) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    checkpoint_writer_tensor tensors[MAX_TENSORS + 1];
    size_t n = checkpoint_writer_list_tensors(&shape, tensors, MAX_TENSORS);

    /* Missing: drop one tensor (and then three). */
    if (case_begin()) {
        checkpoint_writer_tensor edited[MAX_TENSORS];
        size_t m = 0, drop = find_tensor(tensors, n, "model.layers.1.mlp.up_proj.weight");
        for (size_t i = 0; i < n; i++)
            if (i != drop) edited[m++] = tensors[i];
        write_edited(&shape, edited, m);
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT,
                          "tensor model.layers.1.mlp.up_proj.weight is missing (1 of 24 expected tensors missing)");
        m = 0;
        for (size_t i = 0; i < n; i++)
            if (!strstr(tensors[i].name, "layers.1.self_attn.q") && strcmp(tensors[i].name, "model.norm.weight") != 0)
                edited[m++] = tensors[i];
        write_edited(&shape, edited, m);
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT,
                          "tensor model.layers.1.self_attn.q_proj.weight is missing (3 of 24");
        case_end();
    }
    /* Untied but no lm_head. */
    if (case_begin()) {
        checkpoint_writer_shape untied = shape;
        untied.tie_word_embeddings = false;
        write_edited(&untied, tensors, n);
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "tensor lm_head.weight is missing");
        case_end();
    }
    /* Unexpected: an extra name, and a layer beyond num_hidden_layers. */
    if (case_begin()) {
        checkpoint_writer_tensor edited[MAX_TENSORS + 1];
        memcpy(edited, tensors, n * sizeof *tensors);
        edited[n] = tensors[1];
        snprintf(edited[n].name, sizeof edited[n].name, "model.layers.0.mlp.extra_proj.weight");
        write_edited(&shape, edited, n + 1);
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT,
                          "model.safetensors: tensor model.layers.0.mlp.extra_proj.weight: not a Qwen3 tensor");
        snprintf(edited[n].name, sizeof edited[n].name, "model.layers.2.input_layernorm.weight");
        write_edited(&shape, edited, n + 1);
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "tensor model.layers.2.input_layernorm.weight");
        snprintf(edited[n].name, sizeof edited[n].name, "model.layers.01.input_layernorm.weight");
        write_edited(&shape, edited, n + 1);
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "model.layers.01.input_layernorm.weight");
        case_end();
    }
    /* Transposed and wrong shapes. */
    if (case_begin()) {
        checkpoint_writer_tensor edited[MAX_TENSORS];
        memcpy(edited, tensors, n * sizeof *tensors);
        size_t i = find_tensor(edited, n, "model.layers.0.mlp.gate_proj.weight");
        edited[i].shape[0] = 32;
        edited[i].shape[1] = 96;
        write_edited(&shape, edited, n);
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT,
                          "tensor model.layers.0.mlp.gate_proj.weight: shape [32, 96] (transposed) but config.json "
                          "implies [96, 32]");
        memcpy(edited, tensors, n * sizeof *tensors);
        i = find_tensor(edited, n, "model.layers.1.self_attn.k_norm.weight");
        edited[i].n_dims = 2;
        edited[i].shape[0] = 1;
        edited[i].shape[1] = 32;
        write_edited(&shape, edited, n);
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT,
                          "tensor model.layers.1.self_attn.k_norm.weight: shape [1, 32] but config.json implies [32]");
        /* A config saying more kv heads than the weights hold. */
        checkpoint_writer_shape wider = shape;
        wider.n_kv_heads = 2;
        write_edited(&wider, tensors, n);
        EXPECT_OPEN_FAILS(
            case_dir, KITE_ERROR_INVALID_CHECKPOINT,
            "tensor model.layers.0.self_attn.k_proj.weight: shape [32, 32] but config.json implies [64, 32]");
        case_end();
    }
    /* An fp8 tensor in a checkpoint without quantization_config, and an unknown dtype among valid tensors. */
    if (case_begin()) {
        checkpoint_writer_tensor edited[MAX_TENSORS];
        memcpy(edited, tensors, n * sizeof *tensors);
        size_t i = find_tensor(edited, n, "model.norm.weight");
        snprintf(edited[i].dtype, sizeof edited[i].dtype, "F8_E4M3");
        write_edited(&shape, edited, n);
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT,
                          "tensor model.norm.weight: dtype F8_E4M3, but config.json has no quantization_config");
        snprintf(edited[i].dtype, sizeof edited[i].dtype, "X16");
        write_edited(&shape, edited, n);
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "tensor model.norm.weight: field dtype \"X16\"");
        case_end();
    }
}

static void test_file_damage(void) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    if (!case_begin()) return;
    char *config = case_path("config.json");
    char *weights = case_path("model.safetensors");

    /* Nothing there at all, then only the config. */
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_IO, "config.json");
    CHECK(checkpoint_writer_write_config(case_dir, &shape));
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_IO, "no model.safetensors or model.safetensors.index.json");

    CHECK(checkpoint_writer_write(case_dir, &shape));
    size_t size = 0;
    char *bytes = test_read_file(weights, &size);
    CHECK(bytes != NULL);
    if (bytes) {
        /* Truncated: the last tensor runs off the end. */
        CHECK(checkpoint_writer_write_file(weights, bytes, size - 1));
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "past the end of the data area");
        CHECK(strstr(kite_last_error(), weights) != NULL);
        /* Empty. */
        CHECK(checkpoint_writer_write_file(weights, bytes, 0));
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "file is 0 bytes");
        /* Trailing garbage after the last tensor. */
        char *longer = malloc(size + 2);
        CHECK(longer != NULL);
        if (longer) {
            memcpy(longer, bytes, size);
            longer[size] = longer[size + 1] = 0;
            CHECK(checkpoint_writer_write_file(weights, longer, size + 2));
            EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "2 trailing bytes");
            free(longer);
        }
        /* Header length huge. */
        memcpy(bytes, "\xff\xff\xff\xff\xff\xff\x00\x00", 8);
        CHECK(checkpoint_writer_write_file(weights, bytes, size));
        EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "exceeds the limit");
        free(bytes);
    }
    /* Header not JSON. */
    CHECK(checkpoint_writer_write_raw(weights, "{this is not json}", 0));
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "header is not valid JSON");

    /* config.json present but not JSON, or invalid. */
    CHECK(checkpoint_writer_write(case_dir, &shape));
    CHECK(checkpoint_writer_write_file(config, "{\"vocab_size\": 256", 18));
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "config.json: not valid JSON");
    shape.n_kv_heads = 0;
    CHECK(checkpoint_writer_write_config(case_dir, &shape));
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "num_key_value_heads");
    CHECK(unlink(config) == 0);
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_IO, "config.json: cannot open");

    free(config);
    free(weights);
    case_end();
}

static void write_index(const char *text) {
    char *path = case_path("model.safetensors.index.json");
    CHECK(checkpoint_writer_write_file(path, text, strlen(text)));
    free(path);
}

static void test_shard_damage(void) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    shape.n_shards = 2;
    if (!case_begin()) return;
    CHECK(checkpoint_writer_write(case_dir, &shape));
    char shard1[64], shard2[64];
    checkpoint_writer_shard_name(0, 2, shard1, sizeof shard1);
    checkpoint_writer_shard_name(1, 2, shard2, sizeof shard2);
    char *shard2_path = case_path(shard2);
    char *index_path = case_path("model.safetensors.index.json");
    size_t index_length = 0;
    char *index = test_read_file(index_path, &index_length);
    CHECK(index != NULL);
    if (!index) {
        case_end();
        return;
    }
    checkpoint *c = NULL;
    CHECK_MSG(checkpoint_open(case_dir, &c) == KITE_OK, "%s", kite_last_error());
    checkpoint_close(c);

    /* A shard deleted. */
    size_t shard_size = 0;
    char *shard_bytes = test_read_file(shard2_path, &shard_size);
    CHECK(shard_bytes != NULL);
    CHECK(unlink(shard2_path) == 0);
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_IO, shard2);
    CHECK(strstr(kite_last_error(), "cannot open") != NULL);
    /* A shard truncated. */
    if (shard_bytes) CHECK(checkpoint_writer_write_file(shard2_path, shard_bytes, shard_size / 2));
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, shard2);
    if (shard_bytes) CHECK(checkpoint_writer_write_file(shard2_path, shard_bytes, shard_size));
    free(shard_bytes);

    /* The index names a shard that does not exist. */
    char edited[16384];
    snprintf(edited, sizeof edited, "{\"weight_map\": {\"model.norm.weight\": \"model-00003-of-00003.safetensors\"}}");
    write_index(edited);
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_IO, "model-00003-of-00003.safetensors: cannot open");

    /* The index places a tensor in the wrong shard: swap the shard of the first entry. */
    snprintf(edited, sizeof edited, "%s", index);
    char *first = strstr(edited, shard1);
    CHECK(first != NULL);
    if (first) memcpy(first, shard2, strlen(shard2));
    write_index(edited);
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "model.embed_tokens.weight");
    CHECK(strstr(kite_last_error(), "the index places it in") != NULL);

    /* The index omits a tensor a shard holds. */
    write_index("{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\"}}");
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "not listed in");

    /* Shard names that are paths, broken JSON, wrong types. */
    write_index("{\"weight_map\": {\"model.norm.weight\": \"../model-00001-of-00002.safetensors\"}}");
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "is not a plain file name");
    write_index("{\"weight_map\": {\"model.norm.weight\": \"sub/x.safetensors\"}}");
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "is not a plain file name");
    write_index("{\"weight_map\": {\"model.norm.weight\": 3}}");
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "shard must be a string");
    write_index("{\"weight_map\": []}");
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "weight_map must be an object");
    write_index("{\"weight_map\": {}}");
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "weight_map is empty");
    write_index("{\"metadata\": {}}");
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "weight_map");
    write_index("{\"weight_map\": {\"a\": \"x\", \"a\": \"x\"}}");
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT,
                      "model.safetensors.index.json: not valid JSON at line 1 column 27: duplicate key \"a\"");
    write_index("{\"metadata\": {}, \"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}, "
                "\"metadata\": {}}");
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "duplicate key \"metadata\"");
    write_index("weight_map");
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "model.safetensors.index.json: not valid JSON");

    /* Restored, it loads again. */
    write_index(index);
    CHECK_MSG(checkpoint_open(case_dir, &c) == KITE_OK, "%s", kite_last_error());
    checkpoint_close(c);
    free(index);
    free(index_path);
    free(shard2_path);
    case_end();
}

/* A config claiming vast sizes over a tiny file must fail on the shapes, without allocating for them. */
static void test_huge_config(void) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    if (!case_begin()) return;
    CHECK(checkpoint_writer_write(case_dir, &shape));
    checkpoint_writer_shape huge = shape;
    huge.n_layers = 2000000000;
    CHECK(checkpoint_writer_write_config(case_dir, &huge));
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT,
                      "tensor model.layers.2.input_layernorm.weight is missing");
    huge = shape;
    huge.vocab_size = 2000000000;
    huge.hidden_size = 2000000000;
    CHECK(checkpoint_writer_write_config(case_dir, &huge));
    EXPECT_OPEN_FAILS(case_dir, KITE_ERROR_INVALID_CHECKPOINT, "config.json implies [2000000000, 2000000000]");
    case_end();
}

/* Checkpoints written by transformers' save_pretrained (tests/data, made on the GPU machine), when present. */
static void check_data_checkpoint(const char *name, bool tied) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", KITE_TEST_DATA_DIR, name);
    char *config_path = checkpoint_writer_path(dir, "config.json");
    bool present = config_path && access(config_path, R_OK) == 0;
    free(config_path);
    if (!present) {
        printf("  (no %s: skipped)\n", dir);
        return;
    }
    checkpoint *c = NULL;
    CHECK_MSG(checkpoint_open(dir, &c) == KITE_OK, "%s", kite_last_error());
    if (!c) return;
    const qwen3_config *config = checkpoint_config(c);
    const qwen3_weights *w = checkpoint_weights(c);
    CHECK(config->tie_word_embeddings == tied);
    CHECK(w->embed_tokens.shape[0] == config->vocab_size && w->embed_tokens.shape[1] == config->hidden_size);
    CHECK((w->lm_head.data == w->embed_tokens.data) == tied);
    CHECK(w->lm_head.shape[0] == config->vocab_size && w->lm_head.shape[1] == config->hidden_size);
    for (int32_t layer = 0; layer < config->n_layers; layer++) {
        const qwen3_layer_weights *l = &w->layers[layer];
        CHECK(l->q_proj.shape[0] == (int64_t)config->n_heads * config->head_dim);
        CHECK(l->k_norm.n_dims == 1 && l->k_norm.shape[0] == config->head_dim);
        CHECK(l->down_proj.shape[0] == config->hidden_size && l->down_proj.shape[1] == config->intermediate_size);
        /* make_checkpoint.py writes norm weights as 1 + 0.1 N(0, 1). */
        float values[4];
        tensor_to_float(l->input_norm.dtype, l->input_norm.data, values, 4);
        for (int i = 0; i < 4; i++) CHECK(values[i] > 0.3f && values[i] < 1.7f);
    }
    checkpoint_close(c);
}

static void test_transformers_written(void) {
    check_data_checkpoint("tiny", true);
    check_data_checkpoint("tiny-untied", false);
}

int main(void) {
    TEST_RUN(test_tied);
    TEST_RUN(test_untied);
    TEST_RUN(test_tied_with_stored_lm_head);
    TEST_RUN(test_sharded);
    TEST_RUN(test_dtypes);
    TEST_RUN(test_tensor_set_damage);
    TEST_RUN(test_file_damage);
    TEST_RUN(test_shard_damage);
    TEST_RUN(test_huge_config);
    TEST_RUN(test_transformers_written);
    return test_finish();
}

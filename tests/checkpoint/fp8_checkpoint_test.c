/* FP8 checkpoints in Qwen's layout, on the CPU backend.
 *
 * tests/data/fp8/NAME.quantized.safetensors holds the F8_E4M3 linear weights and their scales that
 * tests/data/tools/make_fp8_checkpoint.py made from tests/data/NAME (the command is in
 * tests/data/tools/make_test_data.sh). This test checks that kite's own quantization of NAME equals them bit
 * for bit, assembles the whole FP8 checkpoint (those tensors, the other tensors of NAME unchanged, config.json
 * with quantization_config) in a temporary directory, and checks that it runs to the same tokens and
 * log-probabilities as `--weights fp8` on NAME (the same weights), reporting how it compares with bf16. Then
 * every broken variant of it is refused by name. */
#include <dirent.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "checkpoint_writer.h"
#include "kite.h"
#include "quant/fp8.h"
#include "test_util.h"
#include "util/file.h"

#define QUANTIZATION_CONFIG                                                                                            \
    "{\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": \"fp8\", "                              \
    "\"weight_block_size\": [128, 128], \"modules_to_not_convert\": [\"lm_head\"]}"
#define MAX_ENTRIES 128
#define MAX_FILES 4

/* ---- reading the committed data and the bf16 checkpoints ---------------------------------------- */

typedef struct tensor_set {
    safetensors_file *files[MAX_FILES];
    size_t n_files;
} tensor_set;

static void tensor_set_close(tensor_set *set) {
    for (size_t i = 0; i < set->n_files; i++)
        safetensors_close(set->files[i]);
    set->n_files = 0;
}

static bool ends_with(const char *text, const char *suffix) {
    size_t n = strlen(text), m = strlen(suffix);
    return n >= m && strcmp(text + n - m, suffix) == 0;
}

/* Every .safetensors file of a directory (one file or the shards). */
static bool tensor_set_open_dir(const char *dir, tensor_set *set) {
    memset(set, 0, sizeof *set);
    DIR *d = opendir(dir);
    if (!d) return false;
    bool ok = true;
    struct dirent *entry;
    while (ok && (entry = readdir(d)) != NULL) {
        if (!ends_with(entry->d_name, ".safetensors")) continue;
        char *path = checkpoint_writer_path(dir, entry->d_name);
        ok = path && set->n_files < MAX_FILES && safetensors_open(path, &set->files[set->n_files]) == KITE_OK;
        if (ok) set->n_files++;
        free(path);
    }
    closedir(d);
    if (!ok) tensor_set_close(set);
    return ok && set->n_files > 0;
}

static const safetensors_tensor *tensor_set_find(const tensor_set *set, const char *name) {
    for (size_t i = 0; i < set->n_files; i++) {
        const safetensors_tensor *t = safetensors_find(set->files[i], name);
        if (t) return t;
    }
    return NULL;
}

/* ---- writing checkpoints ------------------------------------------------------------------------ */

typedef struct entry {
    char name[128];
    char dtype[16];
    int32_t n_dims;
    int64_t shape[2];
    const void *data;
    size_t size;
} entry;

static entry entry_of(const safetensors_tensor *t) {
    entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.name, sizeof e.name, "%s", t->name);
    snprintf(e.dtype, sizeof e.dtype, "%s", safetensors_dtype_name(t->dtype));
    e.n_dims = t->n_dims;
    e.shape[0] = t->shape[0];
    e.shape[1] = t->n_dims == 2 ? t->shape[1] : 0;
    e.data = t->data;
    e.size = (size_t)(t->data_end - t->data_begin);
    return e;
}

static bool write_safetensors(const char *path, const entry *entries, size_t n) {
    static char header[1 << 16];
    size_t length = 0;
    uint64_t offset = 0;
    length += (size_t)snprintf(header + length, sizeof header - length, "{");
    for (size_t i = 0; i < n; i++) {
        const entry *e = &entries[i];
        length += (size_t)snprintf(header + length, sizeof header - length, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                   i ? "," : "", e->name, e->dtype);
        for (int32_t d = 0; d < e->n_dims; d++)
            length += (size_t)snprintf(header + length, sizeof header - length, "%s%lld", d ? "," : "",
                                       (long long)e->shape[d]);
        length += (size_t)snprintf(header + length, sizeof header - length, "],\"data_offsets\":[%llu,%llu]}",
                                   (unsigned long long)offset, (unsigned long long)(offset + e->size));
        offset += e->size;
    }
    length += (size_t)snprintf(header + length, sizeof header - length, "}");
    while (length % 8 != 0 && length + 1 < sizeof header)
        header[length++] = ' ';
    if (length + 1 >= sizeof header) return false;
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    uint64_t header_size = length;
    unsigned char size_bytes[8];
    for (int i = 0; i < 8; i++)
        size_bytes[i] = (unsigned char)(header_size >> (8 * i));
    bool ok = fwrite(size_bytes, 1, 8, f) == 8 && fwrite(header, 1, length, f) == length;
    for (size_t i = 0; i < n && ok; i++)
        ok = entries[i].size == 0 || fwrite(entries[i].data, 1, entries[i].size, f) == entries[i].size;
    if (fclose(f) != 0) ok = false;
    return ok;
}

/* config.json of `source_dir` with `quantization` (JSON text, or NULL for none) added at the end. */
static bool write_config(const char *dir, const char *source_dir, const char *quantization) {
    char *source = checkpoint_writer_path(source_dir, "config.json");
    char *text = NULL;
    size_t length = 0;
    bool ok = source && file_read_all(source, 1 << 20, KITE_ERROR_INVALID_CHECKPOINT, &text, &length) == KITE_OK;
    free(source);
    if (!ok) return false;
    char *close = strrchr(text, '}');
    ok = close != NULL;
    size_t capacity = length + (quantization ? strlen(quantization) : 0) + 64;
    char *out = malloc(capacity);
    if (ok && out) {
        *close = '\0';
        snprintf(out, capacity, "%s%s%s%s}\n", text, quantization ? ",\n  \"quantization_config\": " : "",
                 quantization ? quantization : "", quantization ? "\n" : "");
        char *path = checkpoint_writer_path(dir, "config.json");
        ok = path && checkpoint_writer_write_file(path, out, strlen(out));
        free(path);
    } else {
        ok = false;
    }
    free(out);
    free(text);
    return ok;
}

static bool link_tokenizer(const char *dir, const char *source_dir) {
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < 2; i++) {
        char *from = checkpoint_writer_path(source_dir, names[i]);
        char *resolved = from ? realpath(from, NULL) : NULL;
        char *to = checkpoint_writer_path(dir, names[i]);
        bool ok = resolved && to && symlink(resolved, to) == 0;
        free(from), free(resolved), free(to);
        if (!ok) return false;
    }
    return true;
}

/* The FP8 checkpoint's tensors: the quantized ones, then every other tensor of the bf16 checkpoint (a tied
 * lm_head.weight copy left out, as the script leaves it). */
static size_t fp8_entries(const tensor_set *bf16, const tensor_set *quantized, entry *out) {
    size_t n = 0;
    for (size_t f = 0; f < quantized->n_files; f++)
        for (size_t i = 0; i < safetensors_count(quantized->files[f]) && n < MAX_ENTRIES; i++)
            out[n++] = entry_of(safetensors_tensor_at(quantized->files[f], i));
    for (size_t f = 0; f < bf16->n_files; f++)
        for (size_t i = 0; i < safetensors_count(bf16->files[f]) && n < MAX_ENTRIES; i++) {
            const safetensors_tensor *t = safetensors_tensor_at(bf16->files[f], i);
            if (!tensor_set_find(quantized, t->name)) out[n++] = entry_of(t);
        }
    return n;
}

static bool write_checkpoint(const char *dir, const char *source_dir, const char *quantization, const entry *entries,
                             size_t n) {
    char *weights = checkpoint_writer_path(dir, "model.safetensors");
    bool ok = weights && write_config(dir, source_dir, quantization) && write_safetensors(weights, entries, n);
    free(weights);
    return ok && link_tokenizer(dir, source_dir);
}

static size_t find_entry(const entry *entries, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(entries[i].name, name) == 0) return i;
    fprintf(stderr, "fp8_checkpoint_test: the assembled checkpoint has no tensor %s\n", name);
    exit(1);
}

/* ---- kite's quantization against the script's --------------------------------------------------- */

static void check_same_quantization(const char *name, const char *quantized_path, bool bf16_scales) {
    checkpoint *c = NULL;
    safetensors_file *q = NULL;
    char dir[512];
    snprintf(dir, sizeof dir, KITE_TEST_DATA_DIR "/%s", name);
    CHECK_MSG(checkpoint_open(dir, &c) == KITE_OK, "%s", kite_last_error());
    CHECK_MSG(safetensors_open(quantized_path, &q) == KITE_OK, "%s", kite_last_error());
    if (!c || !q) {
        checkpoint_close(c);
        safetensors_close(q);
        return;
    }
    const qwen3_config *config = checkpoint_config(c);
    const qwen3_weights *w = checkpoint_weights(c);
    static const char *const parts[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    int compared = 0;
    for (int32_t l = 0; l < config->n_layers; l++) {
        const qwen3_layer_weights *lw = &w->layers[l];
        const tensor_view *views[] = {&lw->q_proj,    &lw->k_proj,  &lw->v_proj,   &lw->o_proj,
                                      &lw->gate_proj, &lw->up_proj, &lw->down_proj};
        for (int p = 0; p < 7; p++) {
            const tensor_view *v = views[p];
            int64_t rows = v->shape[0], cols = v->shape[1];
            size_t n = (size_t)(rows * cols),
                   n_scales = (size_t)(fp8_block_count(rows, 128) * fp8_block_count(cols, 128));
            float *values = malloc(n * sizeof *values), *scales = malloc(n_scales * sizeof *scales);
            uint8_t *codes = malloc(n);
            CHECK(values && scales && codes);
            char weight_name[128], scale_name[160];
            snprintf(weight_name, sizeof weight_name, "model.layers.%d.%s.weight", (int)l, parts[p]);
            snprintf(scale_name, sizeof scale_name, "%s_scale_inv", weight_name);
            const safetensors_tensor *expected_q = safetensors_find(q, weight_name);
            const safetensors_tensor *expected_s = safetensors_find(q, scale_name);
            CHECK_MSG(expected_q && expected_s, "%s: %s or its scale missing", quantized_path, weight_name);
            if (values && scales && codes && expected_q && expected_s) {
                tensor_to_float(v->dtype, v->data, values, n);
                CHECK(fp8_quantize_blocks(values, rows, cols, codes, scales, weight_name) == KITE_OK);
                CHECK(expected_q->dtype == TENSOR_DTYPE_F8_E4M3 && expected_q->data_end - expected_q->data_begin == n);
                CHECK_MSG(memcmp(codes, expected_q->data, n) == 0, "%s: fp8 bytes differ", weight_name);
                if (bf16_scales) {
                    CHECK(expected_s->dtype == TENSOR_DTYPE_BF16);
                    for (size_t i = 0; i < n_scales; i++) {
                        uint16_t bits;
                        memcpy(&bits, (const unsigned char *)expected_s->data + 2 * i, 2);
                        CHECK_MSG(bits == float_to_bf16(scales[i]), "%s[%zu]", scale_name, i);
                    }
                } else {
                    CHECK(expected_s->dtype == TENSOR_DTYPE_F32 &&
                          expected_s->data_end - expected_s->data_begin == 4 * n_scales);
                    CHECK_MSG(memcmp(scales, expected_s->data, 4 * n_scales) == 0, "%s: scales differ", scale_name);
                }
                compared++;
            }
            free(values), free(scales), free(codes);
        }
    }
    CHECK(compared == 7 * config->n_layers);
    CHECK(safetensors_count(q) == (size_t)(14 * config->n_layers)); /* nothing else in the file */
    checkpoint_close(c);
    safetensors_close(q);
}

static void test_quantization_matches_script(void) {
    check_same_quantization("tiny", KITE_TEST_DATA_DIR "/fp8/tiny.quantized.safetensors", false);
    check_same_quantization("tiny-untied", KITE_TEST_DATA_DIR "/fp8/tiny-untied.quantized.safetensors", false);
    check_same_quantization("tiny", KITE_TEST_DATA_DIR "/fp8/tiny.quantized-bf16-scales.safetensors", true);
}

/* ---- running them ------------------------------------------------------------------------------- */

#define STEPS 24

typedef struct run_record {
    int32_t tokens[STEPS];
    float logprobs[STEPS];
    int32_t n;
} run_record;

static void collect(const kite_token_event *event, void *user_data) {
    run_record *r = user_data;
    if (event->token >= 0 && r->n < STEPS) {
        r->tokens[r->n] = event->token;
        r->logprobs[r->n] = event->logprob;
        r->n++;
    }
}

static const char *const run_prompts[] = {"The capital of France is", "def fibonacci(n):", "北京是中国的首都"};
#define N_RUN_PROMPTS 3

static bool run_greedy(const char *dir, kite_weights weights, run_record out[N_RUN_PROMPTS]) {
    kite_load_params params = kite_load_params_default();
    params.backend = KITE_BACKEND_CPU;
    params.n_threads = 2;
    params.weights = weights;
    kite_model *model = NULL;
    kite_engine *engine = NULL;
    kite_status status = kite_model_load(dir, &params, &model);
    CHECK_MSG(status == KITE_OK, "%s: %s", dir, kite_last_error());
    kite_engine_params engine_params = kite_engine_params_default();
    engine_params.max_context = 256;
    if (status == KITE_OK) status = kite_engine_create(model, &engine_params, &engine);
    for (int i = 0; i < N_RUN_PROMPTS && status == KITE_OK; i++) {
        memset(&out[i], 0, sizeof out[i]);
        kite_request request = kite_request_default();
        request.prompt_text = run_prompts[i];
        request.prompt_text_length = strlen(run_prompts[i]);
        request.max_tokens = STEPS;
        request.ignore_eos = true;
        request.on_token = collect;
        request.user_data = &out[i];
        kite_request_id id;
        status = kite_engine_submit(engine, &request, &id);
        if (status == KITE_OK) status = kite_engine_run(engine);
    }
    CHECK_MSG(status == KITE_OK, "%s: %s", dir, kite_last_error());
    kite_engine_free(engine);
    kite_model_free(model);
    return status == KITE_OK;
}

static int agreeing_tokens(const run_record *a, const run_record *b) {
    int same = 0;
    for (int i = 0; i < N_RUN_PROMPTS; i++)
        for (int s = 0; s < STEPS && a[i].tokens[s] == b[i].tokens[s]; s++)
            same++;
    return same;
}

static void check_fp8_checkpoint_runs(const char *name) {
    char source[512], quantized_path[512];
    snprintf(source, sizeof source, KITE_TEST_DATA_DIR "/%s", name);
    snprintf(quantized_path, sizeof quantized_path, KITE_TEST_DATA_DIR "/fp8/%s.quantized.safetensors", name);
    tensor_set bf16, quantized = {0};
    CHECK(tensor_set_open_dir(source, &bf16));
    CHECK(safetensors_open(quantized_path, &quantized.files[0]) == KITE_OK);
    quantized.n_files = quantized.files[0] ? 1 : 0;
    char *dir = checkpoint_writer_make_temp_dir();
    static entry entries[MAX_ENTRIES];
    size_t n = fp8_entries(&bf16, &quantized, entries);
    CHECK(dir && write_checkpoint(dir, source, QUANTIZATION_CONFIG, entries, n));

    static run_record from_fp8_checkpoint[N_RUN_PROMPTS], from_fp8_bf16[N_RUN_PROMPTS],
        quantized_at_load[N_RUN_PROMPTS], original[N_RUN_PROMPTS];
    bool ok = dir && run_greedy(dir, KITE_WEIGHTS_FP8, from_fp8_checkpoint) &&
              run_greedy(dir, KITE_WEIGHTS_BF16, from_fp8_bf16) &&
              run_greedy(source, KITE_WEIGHTS_FP8, quantized_at_load) &&
              run_greedy(source, KITE_WEIGHTS_BF16, original);
    if (ok) {
        /* The same weights, so the same tokens and log-probabilities, bit for bit. */
        for (int i = 0; i < N_RUN_PROMPTS; i++) {
            CHECK(from_fp8_checkpoint[i].n == STEPS && quantized_at_load[i].n == STEPS);
            CHECK_MSG(memcmp(from_fp8_checkpoint[i].tokens, quantized_at_load[i].tokens, sizeof original[i].tokens) ==
                          0,
                      "%s prompt %d: tokens differ", name, i);
            CHECK_MSG(memcmp(from_fp8_checkpoint[i].logprobs, quantized_at_load[i].logprobs,
                             sizeof original[i].logprobs) == 0,
                      "%s prompt %d: log-probabilities differ", name, i);
        }
        printf("  %s: greedy tokens agreeing before the first difference (of %d): fp8 vs bf16 checkpoint %d, "
               "FP8 checkpoint under --weights bf16 vs fp8 %d\n",
               name, N_RUN_PROMPTS * STEPS, agreeing_tokens(from_fp8_checkpoint, original),
               agreeing_tokens(from_fp8_bf16, from_fp8_checkpoint));
    }
    tensor_set_close(&bf16);
    tensor_set_close(&quantized);
    if (dir) checkpoint_writer_remove_dir(dir);
    free(dir);
}

static void test_fp8_checkpoint_equals_fp8_at_load(void) {
    check_fp8_checkpoint_runs("tiny");
    check_fp8_checkpoint_runs("tiny-untied");
}

/* ---- refusals ----------------------------------------------------------------------------------- */

static tensor_set tiny_bf16, tiny_quantized;
static entry base_entries[MAX_ENTRIES];
static size_t n_base_entries;
static char *case_dir;

/* A fresh empty case_dir, the previous one removed. */
static void case_dir_reset(void) {
    if (case_dir) checkpoint_writer_remove_dir(case_dir);
    free(case_dir);
    case_dir = checkpoint_writer_make_temp_dir();
}

static void case_dir_remove(void) {
    if (case_dir) checkpoint_writer_remove_dir(case_dir);
    free(case_dir);
    case_dir = NULL;
}

static void expect_refused(int line, const char *quantization, const entry *entries, size_t n, kite_status expected,
                           const char *substring) {
    case_dir_reset();
    if (!case_dir || !write_checkpoint(case_dir, KITE_TEST_DATA_DIR "/tiny", quantization, entries, n)) {
        CHECK_MSG(false, "line %d: cannot write the case", line);
        return;
    }
    checkpoint *c = NULL;
    kite_status status = checkpoint_open(case_dir, &c);
    CHECK_MSG(status == expected && strstr(kite_last_error(), substring), "line %d: status %d (wanted %d): %s", line,
              status, expected, status == KITE_OK ? "(loaded)" : kite_last_error());
    checkpoint_close(c);
}

#define EXPECT_REFUSED(quantization, entries, n, status, substring)                                                    \
    expect_refused(__LINE__, quantization, entries, n, status, substring)

static void test_quantization_config_refusals(void) {
    const entry *e = base_entries;
    size_t n = n_base_entries;
    static const char *const other_methods[] = {"awq", "gptq", "bitsandbytes", "compressed-tensors", "fbgemm_fp8"};
    for (size_t i = 0; i < sizeof other_methods / sizeof other_methods[0]; i++) {
        char config[256];
        snprintf(config, sizeof config, "{\"quant_method\": \"%s\", \"weight_block_size\": [128, 128]}",
                 other_methods[i]);
        EXPECT_REFUSED(config, e, n, KITE_ERROR_UNSUPPORTED, "field quantization_config.quant_method is");
    }
    EXPECT_REFUSED("{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\", \"weight_block_size\": [128, 128]}", e, n,
                   KITE_ERROR_UNSUPPORTED, "field quantization_config.fmt is \"e5m2\"");
    EXPECT_REFUSED("{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\", \"weight_block_size\": [128, 128]}",
                   e, n, KITE_ERROR_UNSUPPORTED, "field quantization_config.activation_scheme is \"static\"");
    EXPECT_REFUSED("{\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}", e, n, KITE_ERROR_UNSUPPORTED,
                   "field quantization_config.weight_block_size is [64, 64]");
    EXPECT_REFUSED("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128, 1]}", e, n,
                   KITE_ERROR_INVALID_CHECKPOINT, "field quantization_config.weight_block_size");
    EXPECT_REFUSED("{\"quant_method\": \"fp8\"}", e, n, KITE_ERROR_UNSUPPORTED,
                   "field quantization_config.weight_block_size is missing");
    EXPECT_REFUSED("{\"weight_block_size\": [128, 128]}", e, n, KITE_ERROR_INVALID_CHECKPOINT,
                   "field quantization_config.quant_method is missing");
    EXPECT_REFUSED("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"kv_cache_scheme\": {}}", e, n,
                   KITE_ERROR_UNSUPPORTED, "field quantization_config.kv_cache_scheme is not one kite reads");
    EXPECT_REFUSED("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"modules_to_not_convert\": "
                   "\"lm_head\"}",
                   e, n, KITE_ERROR_INVALID_CHECKPOINT,
                   "field quantization_config.modules_to_not_convert must be an array");
    EXPECT_REFUSED("[1]", e, n, KITE_ERROR_INVALID_CHECKPOINT, "field quantization_config must be an object");
    case_dir_remove();
}

static void test_bad_tensors_refused(void) {
    static entry e[MAX_ENTRIES];
    size_t n = n_base_entries;
    const char *q_scale = "model.layers.0.self_attn.q_proj.weight_scale_inv";
    const char *down_scale = "model.layers.1.mlp.down_proj.weight_scale_inv";

    /* The untouched assembly loads: the refusals below come from their one change. */
    memcpy(e, base_entries, n * sizeof *e);
    checkpoint *c = NULL;
    case_dir_reset();
    CHECK(case_dir && write_checkpoint(case_dir, KITE_TEST_DATA_DIR "/tiny", QUANTIZATION_CONFIG, e, n));
    CHECK_MSG(checkpoint_open(case_dir, &c) == KITE_OK, "%s", kite_last_error());
    if (c) CHECK(checkpoint_weights(c)->layers[0].q_proj.dtype == TENSOR_DTYPE_F8_E4M3);
    checkpoint_close(c);

    /* A missing scale. */
    memcpy(e, base_entries, n * sizeof *e);
    size_t i = find_entry(e, n, down_scale);
    e[i] = e[n - 1];
    EXPECT_REFUSED(QUANTIZATION_CONFIG, e, n - 1, KITE_ERROR_INVALID_CHECKPOINT,
                   "tensor model.layers.1.mlp.down_proj.weight_scale_inv is missing");

    /* A scale of the wrong shape, and scales shaped for 64x64 blocks under a config of 128x128. */
    static float two_scales[2] = {0.01f, 0.01f};
    memcpy(e, base_entries, n * sizeof *e);
    i = find_entry(e, n, q_scale);
    e[i].shape[0] = 2, e[i].data = two_scales, e[i].size = sizeof two_scales;
    EXPECT_REFUSED(QUANTIZATION_CONFIG, e, n, KITE_ERROR_INVALID_CHECKPOINT,
                   "tensor model.layers.0.self_attn.q_proj.weight_scale_inv: shape [2, 1], but weight [64, 32] in "
                   "blocks of 128x128 (quantization_config.weight_block_size) needs [1, 1]");
    memcpy(e, base_entries, n * sizeof *e);
    i = find_entry(e, n, "model.layers.0.mlp.gate_proj.weight_scale_inv"); /* [96, 32]: 64-blocks make [2, 1] */
    e[i].shape[0] = 2, e[i].data = two_scales, e[i].size = sizeof two_scales;
    EXPECT_REFUSED(QUANTIZATION_CONFIG, e, n, KITE_ERROR_INVALID_CHECKPOINT, "needs [1, 1]");

    /* NaN, infinite and negative scales; an F16 scale. */
    static float bad_values[3];
    bad_values[0] = NAN, bad_values[1] = INFINITY, bad_values[2] = -0.01f;
    for (int k = 0; k < 3; k++) {
        memcpy(e, base_entries, n * sizeof *e);
        i = find_entry(e, n, q_scale);
        e[i].data = &bad_values[k];
        EXPECT_REFUSED(QUANTIZATION_CONFIG, e, n, KITE_ERROR_INVALID_CHECKPOINT,
                       "tensor model.layers.0.self_attn.q_proj.weight_scale_inv: element [0, 0] is");
    }
    static uint16_t f16_scale = 0x2000;
    memcpy(e, base_entries, n * sizeof *e);
    i = find_entry(e, n, q_scale);
    snprintf(e[i].dtype, sizeof e[i].dtype, "F16");
    e[i].data = &f16_scale, e[i].size = 2;
    EXPECT_REFUSED(QUANTIZATION_CONFIG, e, n, KITE_ERROR_UNSUPPORTED, "weight_scale_inv: dtype F16");

    /* A quantized weight stored in bf16 (its scale then has no F8 weight: the weight is named first). */
    const safetensors_tensor *bf16_q = tensor_set_find(&tiny_bf16, "model.layers.0.self_attn.q_proj.weight");
    memcpy(e, base_entries, n * sizeof *e);
    i = find_entry(e, n, "model.layers.0.self_attn.q_proj.weight");
    e[i] = entry_of(bf16_q);
    EXPECT_REFUSED(QUANTIZATION_CONFIG, e, n, KITE_ERROR_INVALID_CHECKPOINT,
                   "tensor model.layers.0.self_attn.q_proj.weight: dtype BF16, but quantization_config quantizes it");
    /* ... kept unquantized by modules_to_not_convert, but with a scale left over. */
    const char *keep_q = "{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"modules_to_not_convert\": "
                         "[\"model.layers.0.self_attn.q_proj\"]}";
    EXPECT_REFUSED(keep_q, e, n, KITE_ERROR_INVALID_CHECKPOINT,
                   "tensor model.layers.0.self_attn.q_proj.weight_scale_inv: a block scale for "
                   "model.layers.0.self_attn.q_proj.weight, which is not stored as F8_E4M3");
    /* ... and without the scale it loads. */
    size_t s = find_entry(e, n, q_scale);
    e[s] = e[n - 1];
    c = NULL;
    case_dir_reset();
    CHECK(case_dir && write_checkpoint(case_dir, KITE_TEST_DATA_DIR "/tiny", keep_q, e, n - 1));
    CHECK_MSG(checkpoint_open(case_dir, &c) == KITE_OK, "%s", kite_last_error());
    if (c) CHECK(checkpoint_weights(c)->layers[0].q_proj.dtype == TENSOR_DTYPE_BF16);
    checkpoint_close(c);

    /* An F8 tensor the config keeps unquantized ("q_proj" names every layer's q_proj; "proj" names none). */
    memcpy(e, base_entries, n * sizeof *e);
    EXPECT_REFUSED("{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"modules_to_not_convert\": "
                   "[\"q_proj\"]}",
                   e, n, KITE_ERROR_INVALID_CHECKPOINT,
                   "tensor model.layers.0.self_attn.q_proj.weight: dtype F8_E4M3, but "
                   "quantization_config.modules_to_not_convert keeps model.layers.0.self_attn.q_proj unquantized");
    c = NULL;
    case_dir_reset();
    CHECK(case_dir && write_checkpoint(case_dir, KITE_TEST_DATA_DIR "/tiny",
                                       "{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], "
                                       "\"modules_to_not_convert\": [\"proj\", \"mlp.gate\"]}",
                                       e, n));
    CHECK_MSG(checkpoint_open(case_dir, &c) == KITE_OK, "%s", kite_last_error());
    checkpoint_close(c);

    /* fp8 outside the linear layers: a norm. */
    static uint8_t norm_codes[32];
    memcpy(e, base_entries, n * sizeof *e);
    i = find_entry(e, n, "model.norm.weight");
    snprintf(e[i].dtype, sizeof e[i].dtype, "F8_E4M3");
    e[i].data = norm_codes, e[i].size = sizeof norm_codes;
    EXPECT_REFUSED(QUANTIZATION_CONFIG, e, n, KITE_ERROR_UNSUPPORTED,
                   "tensor model.norm.weight: dtype F8_E4M3; kite reads fp8 only for the layers' linear weights");

    /* A scale in a checkpoint without quantization_config, and F8 weights without it. */
    memcpy(e, base_entries, n * sizeof *e);
    EXPECT_REFUSED(NULL, e, n, KITE_ERROR_INVALID_CHECKPOINT, "but config.json has no quantization_config");
    case_dir_remove();
}

int main(void) {
    TEST_RUN(test_quantization_matches_script);
    TEST_RUN(test_fp8_checkpoint_equals_fp8_at_load);
    bool ready =
        tensor_set_open_dir(KITE_TEST_DATA_DIR "/tiny", &tiny_bf16) &&
        safetensors_open(KITE_TEST_DATA_DIR "/fp8/tiny.quantized.safetensors", &tiny_quantized.files[0]) == KITE_OK;
    if (ready) {
        tiny_quantized.n_files = 1;
        n_base_entries = fp8_entries(&tiny_bf16, &tiny_quantized, base_entries);
    }
    if (ready) {
        TEST_RUN(test_quantization_config_refusals);
        TEST_RUN(test_bad_tensors_refused);
    }
    tensor_set_close(&tiny_bf16);
    tensor_set_close(&tiny_quantized);
    if (!ready) {
        fprintf(stderr, "fp8_checkpoint_test: cannot read the tiny checkpoints: %s\n", kite_last_error());
        return 1;
    }
    return test_finish();
}

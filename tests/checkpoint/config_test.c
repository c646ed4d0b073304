/* config.json parsing: both published formats, derived fields, and every rejected field. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "checkpoint/config.h"
#include "checkpoint_writer.h"
#include "test_util.h"
#include "util/error.h"

/* The hub's Qwen3-0.6B-Base config.json, as published. */
static const char *const base_fields[][2] = {
    {"architectures", "[\"Qwen3ForCausalLM\"]"},
    {"attention_bias", "false"},
    {"attention_dropout", "0.0"},
    {"bos_token_id", "151643"},
    {"eos_token_id", "151643"},
    {"head_dim", "128"},
    {"hidden_act", "\"silu\""},
    {"hidden_size", "1024"},
    {"initializer_range", "0.02"},
    {"intermediate_size", "3072"},
    {"max_position_embeddings", "32768"},
    {"max_window_layers", "28"},
    {"model_type", "\"qwen3\""},
    {"num_attention_heads", "16"},
    {"num_hidden_layers", "28"},
    {"num_key_value_heads", "8"},
    {"rms_norm_eps", "1e-06"},
    {"rope_scaling", "null"},
    {"rope_theta", "1000000"},
    {"sliding_window", "null"},
    {"tie_word_embeddings", "true"},
    {"torch_dtype", "\"bfloat16\""},
    {"transformers_version", "\"4.51.0\""},
    {"use_cache", "true"},
    {"use_sliding_window", "false"},
    {"vocab_size", "151936"},
};
#define N_BASE_FIELDS (sizeof base_fields / sizeof base_fields[0])

/* Builds the base config with overrides: {key, value} replaces or adds, {key, NULL} removes. */
static void build_config(char *buffer, size_t capacity, const char *const overrides[][2], size_t n_overrides) {
    size_t used = 0;
    bool first = true;
#define APPEND(key, value)                                                                                             \
    do {                                                                                                               \
        int written = snprintf(buffer + used, capacity - used, "%s\"%s\": %s", first ? "{" : ", ", key, value);        \
        if (written > 0 && (size_t)written < capacity - used) used += (size_t)written;                                 \
        first = false;                                                                                                 \
    } while (0)
    for (size_t i = 0; i < N_BASE_FIELDS; i++) {
        const char *value = base_fields[i][1];
        bool removed = false;
        for (size_t j = 0; j < n_overrides; j++) {
            if (strcmp(overrides[j][0], base_fields[i][0]) != 0) continue;
            if (overrides[j][1])
                value = overrides[j][1];
            else
                removed = true;
        }
        if (!removed) APPEND(base_fields[i][0], value);
    }
    for (size_t j = 0; j < n_overrides; j++) {
        bool in_base = false;
        for (size_t i = 0; i < N_BASE_FIELDS; i++) in_base |= strcmp(overrides[j][0], base_fields[i][0]) == 0;
        if (!in_base && overrides[j][1]) APPEND(overrides[j][0], overrides[j][1]);
    }
#undef APPEND
    snprintf(buffer + used, capacity - used, "%s}", first ? "{" : "");
}

static kite_status parse_with(const char *const overrides[][2], size_t n_overrides, qwen3_config *config) {
    char text[4096];
    build_config(text, sizeof text, overrides, n_overrides);
    return qwen3_config_parse(text, strlen(text), "m/config.json", config);
}

#define PARSE(config, ...)                                                                                             \
    parse_with((const char *const[][2]){__VA_ARGS__},                                                                  \
               sizeof((const char *const[][2]){__VA_ARGS__}) / sizeof(const char *const[2]), config)

static void check_failure(kite_status status, kite_status expected, const char *substring, int line) {
    if (status != expected || !strstr(kite_last_error(), substring))
        fprintf(stderr, "  line %d: wanted status %d with \"%s\", got %d: %s\n", line, expected, substring, status,
                kite_last_error());
    CHECK(status == expected);
    CHECK(strstr(kite_last_error(), substring) != NULL);
    CHECK(strstr(kite_last_error(), "m/config.json") != NULL || expected == KITE_ERROR_IO);
}
#define EXPECT_FAIL(status, expected, substring) check_failure(status, expected, substring, __LINE__)

static void test_hub_format(void) {
    qwen3_config config;
    CHECK(PARSE(&config, {"unused", NULL}) == KITE_OK);
    CHECK(config.vocab_size == 151936);
    CHECK(config.hidden_size == 1024);
    CHECK(config.intermediate_size == 3072);
    CHECK(config.n_layers == 28);
    CHECK(config.n_heads == 16);
    CHECK(config.n_kv_heads == 8);
    CHECK(config.head_dim == 128); /* given; 1024 / 16 would be 64 */
    CHECK(config.max_position_embeddings == 32768);
    CHECK(config.rope_theta == 1000000.0);
    CHECK(fabs(config.rms_norm_eps - 1e-6) < 1e-18);
    CHECK(config.tie_word_embeddings);
    CHECK(config.bos_token_id == 151643);
    CHECK(config.n_eos_ids == 1 && config.eos_ids[0] == 151643);
    CHECK(config.dtype == TENSOR_DTYPE_BF16);
}

static void test_transformers5_format(void) {
    qwen3_config config;
    CHECK(PARSE(&config, {"rope_theta", NULL}, {"torch_dtype", NULL},
                {"rope_parameters", "{\"rope_theta\": 5000000.0, \"rope_type\": \"default\"}"},
                {"dtype", "\"float16\""}) == KITE_OK);
    CHECK(config.rope_theta == 5000000.0);
    CHECK(config.dtype == TENSOR_DTYPE_F16);
    /* Both spellings present and agreeing is fine; disagreeing is damage. */
    CHECK(PARSE(&config, {"rope_parameters", "{\"rope_theta\": 1000000}"}) == KITE_OK);
    EXPECT_FAIL(PARSE(&config, {"rope_parameters", "{\"rope_theta\": 10000}"}), KITE_ERROR_INVALID_CHECKPOINT,
                "rope_parameters.rope_theta");
    EXPECT_FAIL(PARSE(&config, {"rope_parameters", "{\"rope_theta\": 1000000, \"rope_type\": \"linear\"}"}),
                KITE_ERROR_UNSUPPORTED, "rope_type");
    EXPECT_FAIL(PARSE(&config, {"rope_theta", NULL}), KITE_ERROR_INVALID_CHECKPOINT, "rope_theta is missing");
    CHECK(PARSE(&config, {"dtype", "\"float32\""}, {"torch_dtype", "\"bfloat16\""}) == KITE_OK);
    CHECK(config.dtype == TENSOR_DTYPE_F32);
    EXPECT_FAIL(PARSE(&config, {"torch_dtype", "\"float64\""}), KITE_ERROR_UNSUPPORTED, "torch_dtype");
    EXPECT_FAIL(PARSE(&config, {"torch_dtype", "16"}), KITE_ERROR_INVALID_CHECKPOINT, "torch_dtype");
    CHECK(PARSE(&config, {"torch_dtype", NULL}) == KITE_OK);
    CHECK(config.dtype == TENSOR_DTYPE_BF16);
}

static void test_derived_and_defaults(void) {
    qwen3_config config;
    /* head_dim absent is Qwen3Config's default 128, not hidden_size / heads (1024 / 16 = 64); null is refused. */
    CHECK(PARSE(&config, {"head_dim", NULL}) == KITE_OK);
    CHECK(config.head_dim == 128);
    CHECK(PARSE(&config, {"head_dim", NULL}, {"hidden_size", "1000"}) == KITE_OK);
    CHECK(config.head_dim == 128);
    EXPECT_FAIL(PARSE(&config, {"head_dim", "null"}), KITE_ERROR_INVALID_CHECKPOINT, "field head_dim is null");
    /* transformers' Qwen3Config defaults: untied, kv heads = heads, no bos/eos. */
    CHECK(PARSE(&config, {"tie_word_embeddings", NULL}, {"num_key_value_heads", NULL}, {"bos_token_id", NULL},
                {"eos_token_id", NULL}) == KITE_OK);
    CHECK(!config.tie_word_embeddings);
    CHECK(config.n_kv_heads == 16);
    CHECK(config.bos_token_id == -1 && config.n_eos_ids == 0);
    CHECK(PARSE(&config, {"bos_token_id", "null"}) == KITE_OK);
    CHECK(config.bos_token_id == -1);
    /* Either identification is enough. */
    CHECK(PARSE(&config, {"model_type", NULL}) == KITE_OK);
    CHECK(PARSE(&config, {"architectures", NULL}) == KITE_OK);
    EXPECT_FAIL(PARSE(&config, {"architectures", NULL}, {"model_type", NULL}), KITE_ERROR_INVALID_CHECKPOINT,
                "model_type");
    /* Newer exporters may spell "no scaling" as rope_type default, or list full-attention layers. */
    CHECK(PARSE(&config, {"rope_scaling", "{\"rope_type\": \"default\"}"}) == KITE_OK);
    CHECK(PARSE(&config, {"num_hidden_layers", "2"}, {"layer_types", "[\"full_attention\", \"full_attention\"]"}) ==
          KITE_OK);
}

/* RoPE as transformers reads it: rope_scaling (4) or rope_parameters (5), the type as rope_type or the legacy
 * type, rope_theta at the top or inside either; whole-head RoPE, unscaled or YaRN, is implemented. */
static void test_rope_spellings(void) {
    qwen3_config config;
    static const char *const fields[] = {"rope_scaling", "rope_parameters"};
    static const char *const types[] = {"dynamic", "linear", "longrope", "llama3", "mrope", "ntk", "YaRN"};
    for (size_t f = 0; f < 2; f++) {
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            char value[128], needle[128];
            /* the legacy key: this is the YaRN config that used to run unscaled */
            snprintf(value, sizeof value, "{\"type\": \"%s\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}",
                     types[t]);
            snprintf(needle, sizeof needle, "field %s.type is \"%s\"", fields[f], types[t]);
            EXPECT_FAIL(PARSE(&config, {fields[f], value}), KITE_ERROR_UNSUPPORTED, needle);
            snprintf(value, sizeof value, "{\"rope_type\": \"%s\", \"factor\": 4.0}", types[t]);
            snprintf(needle, sizeof needle, "field %s.rope_type is \"%s\"", fields[f], types[t]);
            EXPECT_FAIL(PARSE(&config, {fields[f], value}), KITE_ERROR_UNSUPPORTED, needle);
        }
        char needle[128];
        /* YaRN in either object, under either key */
        CHECK(PARSE(&config, {fields[f], "{\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}"}) == KITE_OK);
        CHECK(config.rope_yarn && config.yarn.factor == 4.0 && config.context_limit == 131072);
        CHECK(PARSE(&config, {fields[f], "{\"rope_type\": \"yarn\", \"factor\": 2.0}"}) == KITE_OK);
        CHECK(config.rope_yarn && config.yarn.original_max_positions == 32768 && config.context_limit == 65536);
        /* both spellings: agreeing is fine, disagreeing is damage (transformers 4 and 5 would differ) */
        CHECK(PARSE(&config, {fields[f], "{\"type\": \"default\", \"rope_type\": \"default\"}"}) == KITE_OK);
        CHECK(PARSE(&config, {fields[f], "{\"type\": \"default\"}"}) == KITE_OK);
        snprintf(needle, sizeof needle, "field %s.rope_type is \"default\" but %s.type is \"yarn\"", fields[f], fields[f]);
        EXPECT_FAIL(PARSE(&config, {fields[f], "{\"rope_type\": \"default\", \"type\": \"yarn\"}"}),
                    KITE_ERROR_INVALID_CHECKPOINT, needle);
        snprintf(needle, sizeof needle, "field %s.type must be a string", fields[f]);
        EXPECT_FAIL(PARSE(&config, {fields[f], "{\"type\": 3}"}), KITE_ERROR_INVALID_CHECKPOINT, needle);
        snprintf(needle, sizeof needle, "field %s must be an object", fields[f]);
        EXPECT_FAIL(PARSE(&config, {fields[f], "\"default\""}), KITE_ERROR_INVALID_CHECKPOINT, needle);
        /* rope_theta inside either one, alone or agreeing with the top level */
        CHECK(PARSE(&config, {"rope_theta", NULL}, {fields[f], "{\"type\": \"default\", \"rope_theta\": 500000}"}) ==
              KITE_OK);
        CHECK(config.rope_theta == 500000.0);
        CHECK(PARSE(&config, {fields[f], "{\"rope_type\": \"default\", \"rope_theta\": 1000000.0}"}) == KITE_OK);
        CHECK(config.rope_theta == 1000000.0);
        snprintf(needle, sizeof needle, "field rope_theta is 1e+06 but %s.rope_theta is 10000", fields[f]);
        EXPECT_FAIL(PARSE(&config, {fields[f], "{\"rope_type\": \"default\", \"rope_theta\": 10000}"}),
                    KITE_ERROR_INVALID_CHECKPOINT, needle);
        snprintf(needle, sizeof needle, "field %s.partial_rotary_factor is 0.5", fields[f]);
        EXPECT_FAIL(PARSE(&config, {fields[f], "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}"}),
                    KITE_ERROR_UNSUPPORTED, needle);
    }
    /* transformers 5 defaults a rope_parameters without a type to "default"; transformers 4 fails on a
     * rope_scaling without one. */
    CHECK(PARSE(&config, {"rope_parameters", "{}"}) == KITE_OK);
    CHECK(PARSE(&config, {"rope_parameters", "{\"rope_theta\": 1000000}"}) == KITE_OK);
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", "{\"factor\": 4.0}"}), KITE_ERROR_INVALID_CHECKPOINT,
                "field rope_scaling names no rope_type");
    /* both objects: each is checked, so an unsupported one is refused whichever transformers would pick; one
     * scaling is read from whichever names it, two are refused */
    EXPECT_FAIL(PARSE(&config, {"rope_parameters", "{\"rope_type\": \"default\"}"},
                      {"rope_scaling", "{\"type\": \"linear\", \"factor\": 4.0}"}),
                KITE_ERROR_UNSUPPORTED, "rope_scaling.type");
    CHECK(PARSE(&config, {"rope_parameters", "{\"rope_type\": \"default\"}"},
                {"rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0}"}) == KITE_OK);
    CHECK(config.rope_yarn && config.context_limit == 131072);
    /* transformers reads rope_scaling when it is there: a scaling in rope_parameters beside it is refused */
    EXPECT_FAIL(PARSE(&config, {"rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 4.0}"},
                      {"rope_scaling", "{\"type\": \"default\"}"}),
                KITE_ERROR_INVALID_CHECKPOINT, "rope_parameters names a RoPE scaling");
    EXPECT_FAIL(PARSE(&config, {"rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 4.0}"},
                      {"rope_scaling", "{\"type\": \"yarn\", \"factor\": 2.0}"}),
                KITE_ERROR_INVALID_CHECKPOINT, "rope_parameters names a RoPE scaling");
    EXPECT_FAIL(PARSE(&config, {"rope_parameters", "{\"rope_theta\": 1000000, \"rope_type\": \"default\"}"},
                      {"rope_scaling", "{\"type\": \"default\", \"rope_theta\": 5}"}),
                KITE_ERROR_INVALID_CHECKPOINT, "rope_scaling.rope_theta is 5");
    /* partial_rotary_factor at the top level too */
    CHECK(PARSE(&config, {"partial_rotary_factor", "1.0"}) == KITE_OK);
    EXPECT_FAIL(PARSE(&config, {"partial_rotary_factor", "0.5"}), KITE_ERROR_UNSUPPORTED, "partial_rotary_factor is 0.5");
    EXPECT_FAIL(PARSE(&config, {"partial_rotary_factor", "\"half\""}), KITE_ERROR_INVALID_CHECKPOINT,
                "partial_rotary_factor must be a number");
}

#define YARN(extra) "{\"rope_type\": \"yarn\", \"factor\": 4.0" extra "}"

/* YaRN's parameters, each default and each refusal by name (transformers 5's rules, config.c says where). */
static void test_yarn_fields(void) {
    qwen3_config config;
    /* Qwen3's documented YaRN: the defaults fill in beta_fast 32, beta_slow 1, truncate, 0.1 ln(4) + 1 */
    CHECK(PARSE(&config, {"max_position_embeddings", "40960"},
                {"rope_scaling", YARN(", \"original_max_position_embeddings\": 32768")}) == KITE_OK);
    CHECK(config.rope_yarn && config.yarn.factor == 4.0 && config.yarn.original_max_positions == 32768);
    CHECK(config.yarn.beta_fast == 32.0 && config.yarn.beta_slow == 1.0 && config.yarn.truncate);
    CHECK(config.yarn.attention_factor == 0.1 * log(4.0) + 1.0);
    CHECK(config.context_limit == 131072 && config.max_position_embeddings == 40960);
    /* without scaling the limit is max_position_embeddings */
    CHECK(PARSE(&config, {"max_position_embeddings", "40960"}) == KITE_OK);
    CHECK(!config.rope_yarn && config.context_limit == 40960);
    /* original_max_position_embeddings: absent is max_position_embeddings; at the top level it counts */
    CHECK(PARSE(&config, {"rope_scaling", YARN("")}) == KITE_OK);
    CHECK(config.yarn.original_max_positions == 32768 && config.context_limit == 131072);
    CHECK(PARSE(&config, {"original_max_position_embeddings", "8192"}, {"rope_scaling", YARN("")}) == KITE_OK);
    CHECK(config.yarn.original_max_positions == 8192 && config.context_limit == 32768);
    CHECK(PARSE(&config, {"original_max_position_embeddings", "8192"},
                {"rope_scaling", YARN(", \"original_max_position_embeddings\": 8192")}) == KITE_OK);
    EXPECT_FAIL(PARSE(&config, {"original_max_position_embeddings", "8192"},
                      {"rope_scaling", YARN(", \"original_max_position_embeddings\": 4096")}),
                KITE_ERROR_INVALID_CHECKPOINT, "original_max_position_embeddings is 4096 but the top-level");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"original_max_position_embeddings\": null")}),
                KITE_ERROR_INVALID_CHECKPOINT, "rope_scaling.original_max_position_embeddings must be an integer");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"original_max_position_embeddings\": 0")}),
                KITE_ERROR_INVALID_CHECKPOINT, "rope_scaling.original_max_position_embeddings is 0");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"original_max_position_embeddings\": 4096.5")}),
                KITE_ERROR_INVALID_CHECKPOINT, "rope_scaling.original_max_position_embeddings must be an integer");
    /* factor: required; null is max_position_embeddings / original; below 1, or not a number, refused */
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", "{\"rope_type\": \"yarn\"}"}), KITE_ERROR_INVALID_CHECKPOINT,
                "rope_scaling.factor is missing");
    CHECK(PARSE(&config, {"rope_scaling",
                          "{\"rope_type\": \"yarn\", \"factor\": null, \"original_max_position_embeddings\": 8192}"}) ==
          KITE_OK);
    CHECK(config.yarn.factor == 4.0 && config.context_limit == 32768);
    CHECK(PARSE(&config, {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 1}"}) == KITE_OK);
    CHECK(config.yarn.factor == 1.0 && config.yarn.attention_factor == 1.0 && config.context_limit == 32768);
    static const char *const bad_factors[][2] = {
        {"0.5", "rope_scaling.factor is 0.5, must be at least 1"}, {"0", "rope_scaling.factor is 0"},
        {"-4", "rope_scaling.factor is -4"},  {"\"4\"", "rope_scaling.factor must be a finite number, found string"},
        {"true", "rope_scaling.factor must be a finite number"}, {"1e400", "rope_scaling.factor must be a finite"},
        {"[4]", "rope_scaling.factor must be a finite number, found array"},
    };
    for (size_t i = 0; i < sizeof bad_factors / sizeof bad_factors[0]; i++) {
        char value[128];
        snprintf(value, sizeof value, "{\"rope_type\": \"yarn\", \"factor\": %s}", bad_factors[i][0]);
        EXPECT_FAIL(PARSE(&config, {"rope_scaling", value}), KITE_ERROR_INVALID_CHECKPOINT, bad_factors[i][1]);
    }
    /* beta_fast / beta_slow: 0 and null are the defaults; negative, inverted or not a number refused */
    CHECK(PARSE(&config, {"rope_scaling", YARN(", \"beta_fast\": 0, \"beta_slow\": null")}) == KITE_OK);
    CHECK(config.yarn.beta_fast == 32.0 && config.yarn.beta_slow == 1.0);
    CHECK(PARSE(&config, {"rope_scaling", YARN(", \"beta_fast\": 16, \"beta_slow\": 2.5")}) == KITE_OK);
    CHECK(config.yarn.beta_fast == 16.0 && config.yarn.beta_slow == 2.5);
    CHECK(PARSE(&config, {"rope_scaling", YARN(", \"beta_fast\": 4, \"beta_slow\": 4")}) == KITE_OK);
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"beta_fast\": 1, \"beta_slow\": 32")}),
                KITE_ERROR_INVALID_CHECKPOINT, "beta_fast (1) must not be below beta_slow (32)");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"beta_fast\": -8")}), KITE_ERROR_INVALID_CHECKPOINT,
                "rope_scaling.beta_fast is -8, must be positive");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"beta_slow\": -1")}), KITE_ERROR_INVALID_CHECKPOINT,
                "rope_scaling.beta_slow is -1");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"beta_slow\": \"1\"")}), KITE_ERROR_INVALID_CHECKPOINT,
                "rope_scaling.beta_slow must be a finite number");
    /* truncate: true or false only */
    CHECK(PARSE(&config, {"rope_scaling", YARN(", \"truncate\": false")}) == KITE_OK);
    CHECK(!config.yarn.truncate);
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"truncate\": null")}), KITE_ERROR_INVALID_CHECKPOINT,
                "rope_scaling.truncate must be true or false, found null");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"truncate\": 1")}), KITE_ERROR_INVALID_CHECKPOINT,
                "rope_scaling.truncate must be true or false");
    /* attention_factor: given wins; else mscale / mscale_all_dim when both are non-zero; else from factor */
    CHECK(PARSE(&config, {"rope_scaling", YARN(", \"attention_factor\": 1.25, \"mscale\": 2, \"mscale_all_dim\": 1")}) ==
          KITE_OK);
    CHECK(config.yarn.attention_factor == 1.25);
    CHECK(PARSE(&config, {"rope_scaling", YARN(", \"attention_factor\": 1")}) == KITE_OK);
    CHECK(config.yarn.attention_factor == 1.0);
    CHECK(PARSE(&config, {"rope_scaling", YARN(", \"mscale\": 2, \"mscale_all_dim\": 1")}) == KITE_OK);
    CHECK(config.yarn.attention_factor == (0.1 * 2.0 * log(4.0) + 1.0) / (0.1 * 1.0 * log(4.0) + 1.0));
    CHECK(PARSE(&config, {"rope_scaling", YARN(", \"mscale\": 0.707, \"mscale_all_dim\": 0")}) == KITE_OK);
    CHECK(config.yarn.attention_factor == 0.1 * log(4.0) + 1.0);
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"attention_factor\": 0")}), KITE_ERROR_INVALID_CHECKPOINT,
                "rope_scaling: the attention_factor is 0, must be a positive number");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"attention_factor\": -1.0")}), KITE_ERROR_INVALID_CHECKPOINT,
                "the attention_factor is -1");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"attention_factor\": \"1.1\"")}),
                KITE_ERROR_INVALID_CHECKPOINT, "rope_scaling.attention_factor must be a finite number");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"mscale\": -20, \"mscale_all_dim\": 1")}),
                KITE_ERROR_INVALID_CHECKPOINT, "the attention factor from mscale / mscale_all_dim is");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"mscale_all_dim\": {}")}), KITE_ERROR_INVALID_CHECKPOINT,
                "rope_scaling.mscale_all_dim must be a finite number");
    /* an unknown key is refused (a misspelt original_max_position_embeddings would silently fall back) */
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"orginal_max_position_embeddings\": 32768")}),
                KITE_ERROR_INVALID_CHECKPOINT, "rope_scaling.orginal_max_position_embeddings is not a YaRN parameter");
    EXPECT_FAIL(PARSE(&config, {"rope_parameters", YARN(", \"low_freq_factor\": 1")}), KITE_ERROR_INVALID_CHECKPOINT,
                "rope_parameters.low_freq_factor is not a YaRN parameter");
    /* rope_theta inside, and partial rotation, as for the default type */
    CHECK(PARSE(&config, {"rope_theta", NULL}, {"rope_parameters", YARN(", \"rope_theta\": 10000.0")}) == KITE_OK);
    CHECK(config.rope_theta == 10000.0 && config.rope_yarn);
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", YARN(", \"partial_rotary_factor\": 0.5")}), KITE_ERROR_UNSUPPORTED,
                "rope_scaling.partial_rotary_factor is 0.5");
    /* a context past 2^24 positions (float32 positions stop being exact) */
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 1024.0}"}), KITE_ERROR_UNSUPPORTED,
                "factor 1024 x original_max_position_embeddings 32768 is 33554432 positions");
    EXPECT_FAIL(PARSE(&config, {"max_position_embeddings", "20000000"}), KITE_ERROR_UNSUPPORTED,
                "max_position_embeddings is 20000000");
    /* a non-integer product rounds down */
    CHECK(PARSE(&config, {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 2.5, "
                                          "\"original_max_position_embeddings\": 1001}"}) == KITE_OK);
    CHECK(config.context_limit == 2502);
}

static kite_status parse_overriding(const char *const overrides[][2], size_t n_overrides, const char *rope_scaling,
                                    qwen3_config *config) {
    char text[4096];
    build_config(text, sizeof text, overrides, n_overrides);
    return qwen3_config_parse_overriding(text, strlen(text), "m/config.json", rope_scaling, config);
}

/* A rope scaling given beside config.json (--rope-scaling) replaces the file's and is validated the same way. */
static void test_rope_override(void) {
    qwen3_config config;
    const char *const none[][2] = {{"unused", NULL}};
    const char *qwen_yarn = "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32768}";
    CHECK(parse_overriding(none, 1, qwen_yarn, &config) == KITE_OK);
    CHECK(config.rope_yarn && config.context_limit == 131072 && config.rope_theta == 1000000.0);
    /* it replaces a scaling kite refuses, in either object, and can turn one off */
    const char *const linear[][2] = {{"rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}"}};
    CHECK(parse_overriding(linear, 1, qwen_yarn, &config) == KITE_OK);
    CHECK(config.rope_yarn && config.yarn.factor == 4.0);
    const char *const yarn2[][2] = {{"rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 2.0, \"rope_theta\": 1e6}"},
                                    {"rope_theta", NULL}};
    CHECK(parse_overriding(yarn2, 2, "{\"rope_type\": \"default\"}", &config) == KITE_OK);
    CHECK(!config.rope_yarn && config.context_limit == 32768 && config.rope_theta == 1e6);
    CHECK(parse_overriding(yarn2, 2, qwen_yarn, &config) == KITE_OK);
    CHECK(config.rope_yarn && config.yarn.factor == 4.0);
    /* the legacy key works there too */
    CHECK(parse_overriding(none, 1, "{\"type\": \"yarn\", \"factor\": 2.0}", &config) == KITE_OK);
    CHECK(config.rope_yarn && config.context_limit == 65536);
    /* refusals name the override */
    static const struct {
        const char *override;
        kite_status status;
        const char *needle;
    } bad[] = {
        {"{\"rope_type\": \"yarn\", \"factor\": 0.5}", KITE_ERROR_INVALID_CHECKPOINT, "rope_scaling.factor is 0.5"},
        {"{\"rope_type\": \"llama3\", \"factor\": 8.0}", KITE_ERROR_UNSUPPORTED, "rope_scaling.rope_type is \"llama3\""},
        {"{\"factor\": 4.0}", KITE_ERROR_INVALID_CHECKPOINT, "rope_scaling names no rope_type"},
        {"{\"rope_type\": \"yarn\", \"factor\": 4.0, \"rope_theta\": 10000}", KITE_ERROR_INVALID_CHECKPOINT,
         "rope_scaling.rope_theta is 10000"},
        {"[1]", KITE_ERROR_INVALID_CHECKPOINT, "must be an object"},
        {"null", KITE_ERROR_INVALID_CHECKPOINT, "must be a JSON object"},
        {"{\"rope_type\": \"yarn\", \"factor\": 4.0", KITE_ERROR_INVALID_ARGUMENT, "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kite_status status = parse_overriding(none, 1, bad[i].override, &config);
        CHECK_MSG(status == bad[i].status && strstr(kite_last_error(), bad[i].needle) &&
                      strstr(kite_last_error(), "--rope-scaling"),
                  "%s: status %d: %s", bad[i].override, status, kite_last_error());
    }
}

static void test_eos_list(void) {
    qwen3_config config;
    CHECK(PARSE(&config, {"eos_token_id", "[151645, 151643]"}) == KITE_OK);
    CHECK(config.n_eos_ids == 2 && config.eos_ids[0] == 151645 && config.eos_ids[1] == 151643);
    CHECK(PARSE(&config, {"eos_token_id", "[]"}) == KITE_OK);
    CHECK(config.n_eos_ids == 0);
    EXPECT_FAIL(PARSE(&config, {"eos_token_id", "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]"}), KITE_ERROR_UNSUPPORTED,
                "eos_token_id");
    EXPECT_FAIL(PARSE(&config, {"eos_token_id", "[1, \"2\"]"}), KITE_ERROR_INVALID_CHECKPOINT, "eos_token_id[1]");
    EXPECT_FAIL(PARSE(&config, {"eos_token_id", "151936"}), KITE_ERROR_INVALID_CHECKPOINT, "eos_token_id");
    EXPECT_FAIL(PARSE(&config, {"eos_token_id", "-1"}), KITE_ERROR_INVALID_CHECKPOINT, "eos_token_id");
    EXPECT_FAIL(PARSE(&config, {"bos_token_id", "1.5"}), KITE_ERROR_INVALID_CHECKPOINT, "bos_token_id");
}

static void test_bad_sizes(void) {
    qwen3_config config;
    static const char *const size_fields[] = {
        "vocab_size",          "hidden_size",         "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim",          "max_position_embeddings"};
    for (size_t i = 0; i < sizeof size_fields / sizeof size_fields[0]; i++) {
        const char *field = size_fields[i];
        EXPECT_FAIL(PARSE(&config, {field, "0"}), KITE_ERROR_INVALID_CHECKPOINT, field);
        EXPECT_FAIL(PARSE(&config, {field, "-8"}), KITE_ERROR_INVALID_CHECKPOINT, field);
        EXPECT_FAIL(PARSE(&config, {field, "32.5"}), KITE_ERROR_INVALID_CHECKPOINT, field);
        EXPECT_FAIL(PARSE(&config, {field, "\"32\""}), KITE_ERROR_INVALID_CHECKPOINT, field);
        EXPECT_FAIL(PARSE(&config, {field, "4294967296"}), KITE_ERROR_INVALID_CHECKPOINT, field);
        EXPECT_FAIL(PARSE(&config, {field, "1e400"}), KITE_ERROR_INVALID_CHECKPOINT, field);
    }
    static const char *const required[] = {"vocab_size",        "hidden_size",         "intermediate_size",
                                           "num_hidden_layers", "num_attention_heads", "max_position_embeddings",
                                           "rms_norm_eps"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        EXPECT_FAIL(PARSE(&config, {required[i], NULL}), KITE_ERROR_INVALID_CHECKPOINT, required[i]);
    EXPECT_FAIL(PARSE(&config, {"num_key_value_heads", "3"}), KITE_ERROR_INVALID_CHECKPOINT, "num_key_value_heads 3");
    EXPECT_FAIL(PARSE(&config, {"rms_norm_eps", "0"}), KITE_ERROR_INVALID_CHECKPOINT, "rms_norm_eps");
    EXPECT_FAIL(PARSE(&config, {"rms_norm_eps", "-1e-6"}), KITE_ERROR_INVALID_CHECKPOINT, "rms_norm_eps");
    EXPECT_FAIL(PARSE(&config, {"rope_theta", "0"}), KITE_ERROR_INVALID_CHECKPOINT, "rope_theta");
    EXPECT_FAIL(PARSE(&config, {"rope_theta", "\"1e6\""}), KITE_ERROR_INVALID_CHECKPOINT, "rope_theta");
    EXPECT_FAIL(PARSE(&config, {"tie_word_embeddings", "1"}), KITE_ERROR_INVALID_CHECKPOINT, "tie_word_embeddings");
    EXPECT_FAIL(PARSE(&config, {"head_dim", "1073741824"}), KITE_ERROR_INVALID_CHECKPOINT, "head_dim");
    EXPECT_FAIL(PARSE(&config, {"num_hidden_layers", "2"}, {"layer_types", "[\"full_attention\"]"}),
                KITE_ERROR_INVALID_CHECKPOINT, "layer_types");
}

static void test_unsupported(void) {
    qwen3_config config;
    EXPECT_FAIL(PARSE(&config, {"attention_bias", "true"}), KITE_ERROR_UNSUPPORTED, "attention_bias");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", "{\"rope_type\": \"longrope\", \"factor\": 4.0}"}),
                KITE_ERROR_UNSUPPORTED, "rope_scaling");
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", "[]"}), KITE_ERROR_INVALID_CHECKPOINT, "rope_scaling");
    EXPECT_FAIL(PARSE(&config, {"use_sliding_window", "true"}), KITE_ERROR_UNSUPPORTED, "use_sliding_window");
    EXPECT_FAIL(PARSE(&config, {"hidden_act", "\"gelu\""}), KITE_ERROR_UNSUPPORTED, "hidden_act");
    CHECK(PARSE(&config, {"hidden_act", "\"swish\""}) == KITE_OK); /* transformers' other name for SiLU */
    EXPECT_FAIL(PARSE(&config, {"hidden_act", "\"SiLU\""}), KITE_ERROR_UNSUPPORTED, "hidden_act");
    EXPECT_FAIL(PARSE(&config, {"model_type", "\"qwen3_moe\""}), KITE_ERROR_UNSUPPORTED, "model_type");
    EXPECT_FAIL(PARSE(&config, {"architectures", "[\"LlamaForCausalLM\"]"}), KITE_ERROR_UNSUPPORTED, "architectures");
    /* quantization_config is checkpoint/quantization.c's to read and refuse (quantization_test.c). */
    CHECK(PARSE(&config, {"quantization_config", "{\"quant_method\": \"awq\"}"}) == KITE_OK);
    EXPECT_FAIL(
        PARSE(&config, {"num_hidden_layers", "2"}, {"layer_types", "[\"full_attention\", \"sliding_attention\"]"}),
        KITE_ERROR_UNSUPPORTED, "layer_types[1]");
}

static void test_not_json(void) {
    qwen3_config config;
    static const char *const texts[] = {"", "{", "not json", "[1, 2]", "{\"vocab_size\": 1,}", "null", "{} {}"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        kite_status status = qwen3_config_parse(texts[i], strlen(texts[i]), "m/config.json", &config);
        CHECK_MSG(status == KITE_ERROR_INVALID_CHECKPOINT, "text %zu", i);
        CHECK(strstr(kite_last_error(), "m/config.json") != NULL);
    }
}

/* The example: silu then gelu. Python's json (so transformers) reads gelu; kite refuses the file. */
static void test_duplicate_keys(void) {
    qwen3_config config;
    char text[4096];
    build_config(text, sizeof text, (const char *const[][2]){{"hidden_act", NULL}}, 1);
    char doubled[4200];
    snprintf(doubled, sizeof doubled, "{\"hidden_act\": \"silu\",\n\"hidden_act\": \"gelu\", %s", text + 1);
    EXPECT_FAIL(qwen3_config_parse(doubled, strlen(doubled), "m/config.json", &config), KITE_ERROR_INVALID_CHECKPOINT,
                "m/config.json: not valid JSON at line 2 column 1: duplicate key \"hidden_act\"");
    /* nested: rope_scaling's type twice */
    EXPECT_FAIL(PARSE(&config, {"rope_scaling", "{\"rope_type\": \"default\", \"rope_type\": \"yarn\"}"}),
                KITE_ERROR_INVALID_CHECKPOINT, "duplicate key \"rope_type\"");
}

static void test_load_from_directory(void) {
    char *dir = checkpoint_writer_make_temp_dir();
    CHECK(dir != NULL);
    if (!dir) return;
    qwen3_config config;
    CHECK(qwen3_config_load(dir, &config) == KITE_ERROR_IO);
    CHECK(strstr(kite_last_error(), "config.json") != NULL);

    char *path = checkpoint_writer_path(dir, "config.json");
    CHECK(checkpoint_writer_write_file(path, "{\"vocab_size\": ", 15));
    CHECK(qwen3_config_load(dir, &config) == KITE_ERROR_INVALID_CHECKPOINT);
    CHECK(strstr(kite_last_error(), path) != NULL);

    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    CHECK(checkpoint_writer_write_config(dir, &shape));
    CHECK(qwen3_config_load(dir, &config) == KITE_OK);
    CHECK(config.hidden_size == 32 && config.head_dim == 32 && config.n_kv_heads == 1);
    free(path);
    CHECK(checkpoint_writer_remove_dir(dir));
    free(dir);
}

int main(void) {
    TEST_RUN(test_hub_format);
    TEST_RUN(test_transformers5_format);
    TEST_RUN(test_derived_and_defaults);
    TEST_RUN(test_rope_spellings);
    TEST_RUN(test_yarn_fields);
    TEST_RUN(test_rope_override);
    TEST_RUN(test_eos_list);
    TEST_RUN(test_bad_sizes);
    TEST_RUN(test_unsupported);
    TEST_RUN(test_not_json);
    TEST_RUN(test_duplicate_keys);
    TEST_RUN(test_load_from_directory);
    return test_finish();
}

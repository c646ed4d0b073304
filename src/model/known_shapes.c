/* The config.json of each model shape that `kite bench --dummy NAME` can build with random weights,
 * as published on the Hugging Face hub (Qwen/Qwen3-*-Base), plus "tiny", the small test shape of
 * make_checkpoint.py, and "tiny-vocab1k", tiny with a 1,024-id vocabulary (tests/data/tiny-vocab1k's config,
 * tests/data/tools/make_small_vocab.py) for the tests that run token ids only. Kept as text so a dummy model goes
 * through the same parser and validation as a real checkpoint. */
#include <string.h>

#include "checkpoint/config.h"
#include "model/dummy.h"
#include "util/error.h"

typedef struct known_shape {
    const char *name;
    const char *config_json;
} known_shape;

static const known_shape known_shapes[] = {
    {"qwen3-0.6b-base",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024, \"initializer_range\": 0.02, \"intermediate_size\": 3072, \"max_position_embeddings\": 32768, \"max_window_layers\": 28, \"model_type\": \"qwen3\", \"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}"},
    {"qwen3-1.7b-base",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 6144, \"max_position_embeddings\": 32768, \"max_window_layers\": 28, \"model_type\": \"qwen3\", \"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}"},
    {"qwen3-4b-base",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 2560, \"initializer_range\": 0.02, \"intermediate_size\": 9728, \"max_position_embeddings\": 32768, \"max_window_layers\": 36, \"model_type\": \"qwen3\", \"num_attention_heads\": 32, \"num_hidden_layers\": 36, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}"},
    {"qwen3-8b-base",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02, \"intermediate_size\": 12288, \"max_position_embeddings\": 32768, \"max_window_layers\": 36, \"model_type\": \"qwen3\", \"num_attention_heads\": 32, \"num_hidden_layers\": 36, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}"},
    {"tiny",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"head_dim\": 32, \"hidden_act\": \"silu\", \"hidden_size\": 32, \"initializer_range\": 0.2, \"intermediate_size\": 96, \"max_position_embeddings\": 4096, \"max_window_layers\": 2, \"model_type\": \"qwen3\", \"num_attention_heads\": 2, \"num_hidden_layers\": 2, \"num_key_value_heads\": 1, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}"},
    {"tiny-vocab1k",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, \"bos_token_id\": 998, \"eos_token_id\": 998, \"head_dim\": 32, \"hidden_act\": \"silu\", \"hidden_size\": 32, \"initializer_range\": 0.2, \"intermediate_size\": 96, \"max_position_embeddings\": 4096, \"max_window_layers\": 2, \"model_type\": \"qwen3\", \"num_attention_heads\": 2, \"num_hidden_layers\": 2, \"num_key_value_heads\": 1, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 1024}"},
};

const char *known_shape_names(void) {
    return "qwen3-0.6b-base, qwen3-1.7b-base, qwen3-4b-base, qwen3-8b-base, tiny, tiny-vocab1k";
}

kite_status known_shape_config(const char *name, qwen3_config *out) {
    return known_shape_config_overriding(name, NULL, out);
}

kite_status known_shape_config_overriding(const char *name, const char *rope_scaling, qwen3_config *out) {
    for (size_t i = 0; i < sizeof known_shapes / sizeof known_shapes[0]; i++) {
        if (strcmp(known_shapes[i].name, name) != 0) continue;
        const char *text = known_shapes[i].config_json;
        return qwen3_config_parse_overriding(text, strlen(text), name, rope_scaling, out);
    }
    return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "unknown model shape '%s' (known: %s)", name, known_shape_names());
}

/* libFuzzer: config.json text. Anything accepted must satisfy the invariants the model code relies on. */
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qwen3_config config;
    if (qwen3_config_parse((const char *)data, size, "fuzz/config.json", &config) != KITE_OK) return 0;
    if (config.vocab_size <= 0 || config.hidden_size <= 0 || config.intermediate_size <= 0 || config.n_layers <= 0 ||
        config.n_heads <= 0 || config.n_kv_heads <= 0 || config.head_dim <= 0 ||
        config.n_heads % config.n_kv_heads != 0 || config.max_position_embeddings <= 0 || !(config.rms_norm_eps > 0) ||
        !(config.rope_theta > 0) || config.n_eos_ids < 0 || config.n_eos_ids > QWEN3_MAX_EOS_IDS ||
        config.bos_token_id < -1 || config.bos_token_id >= config.vocab_size)
        __builtin_trap();
    if (config.context_limit < 1 || config.context_limit > (1 << 24)) __builtin_trap();
    if (config.rope_yarn && (!(config.yarn.factor >= 1.0) || !(config.yarn.attention_factor > 0.0) ||
                             !(config.yarn.beta_slow > 0.0) || config.yarn.beta_fast < config.yarn.beta_slow ||
                             config.yarn.original_max_positions < 1))
        __builtin_trap();
    for (int32_t i = 0; i < config.n_eos_ids; i++)
        if (config.eos_ids[i] < 0 || config.eos_ids[i] >= config.vocab_size) __builtin_trap();
    return 0;
}

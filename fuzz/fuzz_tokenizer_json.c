/* libFuzzer: a tokenizer.json itself. Loading must accept or refuse with a message (never crash, leak or take
 * memory out of proportion); a tokenizer that loads must encode and decode a fixed text, every id it gives
 * inside its vocabulary. Seeded with small valid tokenizers cut from Qwen3's (fuzz/corpus/fuzz_tokenizer_json/). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tokenizer *t = NULL;
    if (tokenizer_load_json((const char *)data, size, "fuzz/tokenizer.json", &t) != KITE_OK) return 0;
    static const char text[] = "Hello, world! <|im_start|>user\n\xe4\xbd\xa0\xe5\xa5\xbd 123 \xff done";
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode(t, text, sizeof text - 1, &ids, &n) == KITE_OK) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(t)) __builtin_trap();
        char *decoded = NULL;
        size_t length = 0;
        if (tokenizer_decode(t, ids, n, &decoded, &length) == KITE_OK && !decoded) __builtin_trap();
        free(decoded);
    }
    free(ids);
    tokenizer_free(t);
    return 0;
}

/* libFuzzer: a safetensors file image. Anything accepted must be self-consistent: every tensor's bytes lie
 * inside the input (ASan checks the touches below) and lookup by name finds it. */
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    safetensors_file *file = NULL;
    if (safetensors_parse_memory(data, size, "fuzz.safetensors", &file) != KITE_OK) return 0;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < safetensors_count(file); i++) {
        const safetensors_tensor *tensor = safetensors_tensor_at(file, i);
        if (safetensors_find(file, tensor->name) != tensor) __builtin_trap();
        uint64_t span = tensor->data_end - tensor->data_begin;
        if (span > 0) {
            const uint8_t *bytes = tensor->data;
            sink ^= bytes[0];
            sink ^= bytes[span - 1];
        }
    }
    (void)sink;
    safetensors_close(file);
    return 0;
}

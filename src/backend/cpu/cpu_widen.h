/* A checkpoint tensor widened to float32, as the CPU backend holds every weight.
 *
 * The CPU backend and the tensor-parallel CPU ranks (parallel/tp_cpu.c) widen through this one function, so a
 * rank's shard holds the very floats the unsplit backend computes with.
 */
#ifndef KITE_BACKEND_CPU_CPU_WIDEN_H
#define KITE_BACKEND_CPU_CPU_WIDEN_H

#include <stdint.h>

#include "kite.h"
#include "model/qwen3.h"

/* Checks a weight view against its expected shape (cols 0: a vector) and widens it to a new float32 buffer in
 * *out (malloc'd, the caller frees). `name` is the tensor's checkpoint name without "model.layers.N." and
 * ".weight" when layer >= 0, its whole name otherwise, so a message points at it. A linear layer's weight goes
 * through fp8_weights_linear_to_float when it is stored in fp8 or the mode asks for fp8 (`mode` is only read for
 * linear weights: pass KITE_WEIGHTS_BF16 for the others). */
kite_status cpu_widen_tensor(const tensor_view *t, const char *name, int32_t layer, int64_t rows, int64_t cols,
                             kite_weights mode, float **out);

#endif

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

/* cpu_widen_tensor of a linear layer's (rows, cols) weight, then packed (cpu_pack_matrix). */
kite_status cpu_widen_linear(const tensor_view *t, const char *name, int32_t layer, int64_t rows, int64_t cols,
                             kite_weights mode, float **out);

/* Replaces a widened row-major (rows, cols) matrix by its packed form (cpu_pack_rows), which the layers'
 * products read; name and layer name the tensor in a message, as for cpu_widen_tensor. The matrix is freed either
 * way: on failure *matrix is NULL. */
kite_status cpu_pack_matrix(float **matrix, int64_t rows, int64_t cols, const char *name, int32_t layer);

/* One layer's weights widened to float32 (each malloc'd): the norms as vectors, the linear layers packed
 * (cpu_pack_rows) from the PyTorch layout (out_features, in_features). The whole layer in the CPU backend, a
 * rank's shards of it in a tensor-parallel CPU rank (parallel/tp_cpu.c). */
typedef struct cpu_layer {
    float *input_norm;          /* (hidden) */
    float *q_proj;              /* (query rows, hidden), packed */
    float *k_proj;              /* (kv rows, hidden), packed */
    float *v_proj;              /* (kv rows, hidden), packed */
    float *q_norm;              /* (head_dim) */
    float *k_norm;              /* (head_dim) */
    float *o_proj;              /* (hidden, query rows), packed */
    float *post_attention_norm; /* (hidden) */
    float *gate_proj;           /* (intermediate, hidden), packed */
    float *up_proj;             /* (intermediate, hidden), packed */
    float *down_proj;           /* (hidden, intermediate), packed */
} cpu_layer;

/* Frees a layer's buffers (any of them may be NULL) and clears the struct. */
void cpu_layer_free(cpu_layer *layer);

#endif

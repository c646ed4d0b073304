/* Widening a checkpoint tensor to float32 (cpu_widen.h). */
#include "backend/cpu/cpu_widen.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "quant/fp8_weights.h"
#include "util/error.h"

/* The tensor's checkpoint name, so a message points at it (see cpu_widen_tensor for name and layer). */
static void weight_where(char *where, size_t size, const char *name, int32_t layer) {
    if (layer >= 0)
        snprintf(where, size, "model.layers.%d.%s.weight", (int)layer, name);
    else
        snprintf(where, size, "%s", name);
}

kite_status cpu_widen_tensor(const tensor_view *t, const char *name, int32_t layer, int64_t rows, int64_t cols,
                             kite_weights mode, float **out) {
    *out = NULL;
    char where[96];
    weight_where(where, sizeof where, name, layer);
    int32_t want_dims = cols == 0 ? 1 : 2;
    if (!t->data) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: weight %s has no data", where);
    bool fp8 = t->dtype == TENSOR_DTYPE_F8_E4M3;
    if (t->dtype != TENSOR_DTYPE_BF16 && t->dtype != TENSOR_DTYPE_F16 && t->dtype != TENSOR_DTYPE_F32 && !fp8)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: weight %s has an unknown dtype %d", where,
                         (int)t->dtype);
    if (fp8 && cols == 0)
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: weight %s is a vector stored in fp8", where);
    if (t->n_dims != want_dims || t->shape[0] != rows || (want_dims == 2 && t->shape[1] != cols))
        return kite_fail(KITE_ERROR_INVALID_ARGUMENT,
                         "cpu backend: weight %s has shape [%lld, %lld] (%d dims), expected [%lld, %lld] (%d dims)",
                         where, (long long)t->shape[0], t->n_dims == 2 ? (long long)t->shape[1] : 0LL, (int)t->n_dims,
                         (long long)rows, (long long)cols, (int)want_dims);
    const size_t n_cols = want_dims == 2 ? (size_t)cols : 1;
    const size_t bytes = rows > 0 && cols >= 0 && (size_t)rows <= SIZE_MAX / sizeof(float) / n_cols
                             ? (size_t)rows * n_cols * sizeof(float)
                             : 0;
    if (bytes == 0) return kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: weight %s is too large", where);
    float *buffer = malloc(bytes);
    if (!buffer)
        return kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate %zu bytes for weight %s", bytes,
                         where);
    size_t n = bytes / sizeof(float);
    if (fp8 || mode == KITE_WEIGHTS_FP8) {
        kite_status status = fp8_weights_linear_to_float(t, mode, where, buffer);
        if (status != KITE_OK) {
            free(buffer);
            return status;
        }
        *out = buffer;
        return KITE_OK;
    }
    /* Widening is elementwise; chunks keep large embeddings from taking seconds on one core. */
    const size_t chunk = (size_t)1 << 20;
    size_t n_chunks = (n + chunk - 1) / chunk;
    const uint8_t *src = t->data;
    size_t element = tensor_dtype_size(t->dtype);
#pragma omp parallel for schedule(static) if (n_chunks > 1)
    for (size_t i = 0; i < n_chunks; i++) {
        size_t begin = i * chunk;
        size_t count = n - begin < chunk ? n - begin : chunk;
        tensor_to_float(t->dtype, src + begin * element, buffer + begin, count);
    }
    *out = buffer;
    return KITE_OK;
}

kite_status cpu_pack_matrix(float **matrix, int64_t rows, int64_t cols, const char *name, int32_t layer) {
    char where[96];
    weight_where(where, sizeof where, name, layer);
    kite_status status = KITE_OK;
    float *packed = NULL;
    if (rows <= 0 || cols <= 0 || rows > INT32_MAX || cols > INT32_MAX ||
        (size_t)((rows + CPU_PANEL_ROWS - 1) / CPU_PANEL_ROWS) > SIZE_MAX / sizeof(float) / CPU_PANEL_ROWS / (size_t)cols)
        status = kite_fail(KITE_ERROR_INVALID_ARGUMENT, "cpu backend: weight %s of [%lld, %lld] cannot be packed",
                           where, (long long)rows, (long long)cols);
    const size_t n = status == KITE_OK ? cpu_packed_floats((int32_t)rows, (int32_t)cols) : 0;
    if (status == KITE_OK && !(packed = malloc(n * sizeof(float))))
        status = kite_fail(KITE_ERROR_OUT_OF_MEMORY, "cpu backend: cannot allocate %zu bytes for weight %s",
                           n * sizeof(float), where);
    if (status == KITE_OK) cpu_pack_rows(packed, *matrix, (int32_t)rows, (int32_t)cols);
    free(*matrix);
    *matrix = packed;
    return status;
}

kite_status cpu_widen_linear(const tensor_view *t, const char *name, int32_t layer, int64_t rows, int64_t cols,
                             kite_weights mode, float **out) {
    KITE_TRY(cpu_widen_tensor(t, name, layer, rows, cols, mode, out));
    return cpu_pack_matrix(out, rows, cols, name, layer);
}

void cpu_layer_free(cpu_layer *layer) {
    free(layer->input_norm);
    free(layer->q_proj);
    free(layer->k_proj);
    free(layer->v_proj);
    free(layer->q_norm);
    free(layer->k_norm);
    free(layer->o_proj);
    free(layer->post_attention_norm);
    free(layer->gate_proj);
    free(layer->up_proj);
    free(layer->down_proj);
    memset(layer, 0, sizeof *layer);
}
